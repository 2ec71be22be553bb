//! The GPU kernels: PTX text kept in `gpu-p2p/ptx/`, JIT-compiled by the driver with
//! `cuModuleLoadData` (CUDA Driver API 6.11) the first time a device needs them. No CUDA compiler is
//! involved at build time.

use std::ffi::CString;
use std::sync::Arc;

use super::{call_err, sys, CudaDevice, CudaError, CudaStream, ATOMICS_PTX};

/// A loaded module, unloaded on drop.
pub(super) struct Module {
    raw: sys::CUmodule,
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = sys::module_unload(self.raw);
    }
}

impl Module {
    fn load(ptx: &str, ordinal: u32) -> Result<Module, CudaError> {
        // PTX text with an interior NUL cannot come from the files in ptx/ (a unit test checks).
        let text = CString::new(ptx).map_err(|_| CudaError::Call {
            call: "cuModuleLoadData (PTX contains NUL)",
            code: 0,
            name: "invalid PTX text".into(),
            device: Some(ordinal),
        })?;
        Ok(Module {
            raw: sys::module_load_ptx(&text).map_err(call_err(Some(ordinal)))?,
        })
    }

    fn function(&self, name: &str, ordinal: u32) -> Result<sys::CUfunction, CudaError> {
        let n = CString::new(name).map_err(|_| CudaError::Call {
            call: "cuModuleGetFunction (name contains NUL)",
            code: 0,
            name: name.to_string(),
            device: Some(ordinal),
        })?;
        sys::module_get_function(self.raw, &n).map_err(call_err(Some(ordinal)))
    }
}

/// Every module of one device, with its functions looked up once.
pub(super) struct Modules {
    _atomics: Module,
    atomic_cas: sys::CUfunction,
    atomic_add: sys::CUfunction,
}

impl Modules {
    /// Loads the modules into the current context (the caller bound the device's context).
    pub(super) fn load(ordinal: u32) -> Result<Modules, CudaError> {
        let atomics = Module::load(ATOMICS_PTX, ordinal)?;
        Ok(Modules {
            atomic_cas: atomics.function("atomic_cas_u64", ordinal)?,
            atomic_add: atomics.function("atomic_add_u64", ordinal)?,
            _atomics: atomics,
        })
    }
}

/// The kernels of one device, ready to launch.
pub struct Kernels<'a> {
    device: &'a Arc<CudaDevice>,
    modules: &'a Modules,
}

impl<'a> Kernels<'a> {
    pub(super) fn new(device: &'a Arc<CudaDevice>, modules: &'a Modules) -> Self {
        Kernels { device, modules }
    }

    fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        stream: Option<&CudaStream>,
        args: &[u64],
    ) -> Result<(), CudaError> {
        self.device.bind()?;
        let s = stream.map_or(core::ptr::null_mut(), CudaStream::raw);
        sys::launch_u64(f, grid, block, s, args).map_err(self.device.err())
    }

    /// `out = atomicCAS(word, compare, swap)` on the default stream (addresses checked by the caller).
    pub(super) fn atomic_cas(
        &self,
        word: u64,
        compare: u64,
        swap: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        self.launch(
            self.modules.atomic_cas,
            1,
            1,
            None,
            &[word, compare, swap, out],
        )
    }

    /// `out = atomicAdd(word, add)` on the default stream (addresses checked by the caller).
    pub(super) fn atomic_add(&self, word: u64, add: u64, out: u64) -> Result<(), CudaError> {
        self.launch(self.modules.atomic_add, 1, 1, None, &[word, add, out])
    }
}
