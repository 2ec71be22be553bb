//! The GPU kernels: PTX text kept in `gpu-p2p/ptx/`, JIT-compiled by the driver with
//! `cuModuleLoadData` (CUDA Driver API 6.11) the first time a device needs them. No CUDA compiler is
//! involved at build time.

use core::fmt;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use super::{call_err, sys, CudaDevice, CudaError, CudaMemory, CudaStream, ATOMICS_PTX};
use crate::check_range;

/// The PTX of the reduction kernels (`ptx/reduce.ptx`, written by `ptx/gen_reduce.py`): for every
/// [`ElemType`] and [`ReduceOp`], `reduce_<op>_<type>(dst, x, y, n)` computes
/// `dst[i] = op(x[i], y[i])`, and `div_<type>(buf, n, nranks)` the `avg` post-division.
pub const REDUCE_PTX: &str = include_str!("../../ptx/reduce.ptx");

/// Element types of the reduction kernels (the collectives' data types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// `int8`.
    I8,
    /// `uint8`.
    U8,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
    /// `uint64`.
    U64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

impl ElemType {
    /// Every type, in the order of the PTX file.
    pub const ALL: [ElemType; 10] = [
        ElemType::I8,
        ElemType::U8,
        ElemType::I32,
        ElemType::U32,
        ElemType::I64,
        ElemType::U64,
        ElemType::F32,
        ElemType::F64,
        ElemType::F16,
        ElemType::Bf16,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            ElemType::I8 | ElemType::U8 => 1,
            ElemType::F16 | ElemType::Bf16 => 2,
            ElemType::I32 | ElemType::U32 | ElemType::F32 => 4,
            ElemType::I64 | ElemType::U64 | ElemType::F64 => 8,
        }
    }

    /// The suffix of the kernel names (`i8`, ..., `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::I8 => "i8",
            ElemType::U8 => "u8",
            ElemType::I32 => "i32",
            ElemType::U32 => "u32",
            ElemType::I64 => "i64",
            ElemType::U64 => "u64",
            ElemType::F16 => "f16",
            ElemType::Bf16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
        }
    }
}

/// Operators of the reduction kernels (`avg` is `Sum` followed by [`Kernels::divide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Wrapping sum for integers.
    Sum,
    /// Wrapping product for integers.
    Prod,
    /// Minimum (floats: the non-NaN operand).
    Min,
    /// Maximum (floats: the non-NaN operand).
    Max,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

    /// The infix of the kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of the reduction kernel for `op` on `ty` in [`REDUCE_PTX`].
pub fn reduce_kernel_name(op: ReduceOp, ty: ElemType) -> String {
    format!("reduce_{}_{}", op.name(), ty.name())
}

/// Name of the `avg` division kernel for `ty` in [`REDUCE_PTX`].
pub fn divide_kernel_name(ty: ElemType) -> String {
    format!("div_{}", ty.name())
}

/// Threads per block of the reduction launches.
const BLOCK: u32 = 256;
/// Upper bound on blocks per launch (the kernels loop over the rest).
const MAX_GRID: u64 = 4096;

/// The device address of `count` elements of `ty` at byte `offset` of `mem`, checked before a launch:
/// in range, and naturally aligned (PTX `ld`/`st` of an element must be aligned to its size, PTX ISA
/// 5.4.4 "Alignment"; a fault would end the context, not just the call).
fn operand(
    mem: &CudaMemory,
    offset: usize,
    count: usize,
    ty: ElemType,
) -> Result<u64, crate::MemoryError> {
    operand_addr(mem.ptr, mem.len, offset, count, ty)
}

/// [`operand`] on a raw base address and length (bytes), the part that needs no GPU.
fn operand_addr(
    base: u64,
    len: usize,
    offset: usize,
    count: usize,
    ty: ElemType,
) -> Result<u64, crate::MemoryError> {
    let bytes = count
        .checked_mul(ty.size())
        .ok_or(crate::MemoryError::OutOfBounds {
            offset,
            len: usize::MAX,
            size: len,
        })?;
    check_range(offset, bytes, len)?;
    let addr = base + offset as u64;
    if addr % ty.size() as u64 != 0 {
        return Err(crate::MemoryError::Misaligned { offset });
    }
    Ok(addr)
}

/// The JIT log on one line (its lines joined with " | "), for an error's `Display`.
fn one_line(log: &str) -> String {
    log.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

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
    fn load(ptx: &str, name: &'static str, ordinal: u32) -> Result<Module, CudaError> {
        // PTX text with an interior NUL cannot come from the files in ptx/ (a unit test checks).
        let text = CString::new(ptx).map_err(|_| CudaError::Call {
            call: "cuModuleLoadData (PTX contains NUL)",
            code: 0,
            name: "invalid PTX text".into(),
            device: Some(ordinal),
        })?;
        match sys::module_load_ptx(&text) {
            Ok(raw) => Ok(Module { raw }),
            Err(sys::JitFail { fail, log }) => Err(CudaError::ModuleLoad {
                module: name,
                code: fail.code,
                name: sys::error_name(fail.code),
                device: ordinal,
                log: one_line(&log),
            }),
        }
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
    _reduce: Module,
    atomic_cas: sys::CUfunction,
    atomic_add: sys::CUfunction,
    reduce: HashMap<(ReduceOp, ElemType), sys::CUfunction>,
    divide: HashMap<ElemType, sys::CUfunction>,
}

impl Modules {
    /// Loads the modules into the current context (the caller bound the device's context).
    pub(super) fn load(ordinal: u32) -> Result<Modules, CudaError> {
        let atomics = Module::load(ATOMICS_PTX, "ptx/atomics.ptx", ordinal)?;
        let reduce_module = Module::load(REDUCE_PTX, "ptx/reduce.ptx", ordinal)?;
        let mut reduce = HashMap::new();
        let mut divide = HashMap::new();
        for ty in ElemType::ALL {
            for op in ReduceOp::ALL {
                let f = reduce_module.function(&reduce_kernel_name(op, ty), ordinal)?;
                reduce.insert((op, ty), f);
            }
            divide.insert(
                ty,
                reduce_module.function(&divide_kernel_name(ty), ordinal)?,
            );
        }
        Ok(Modules {
            atomic_cas: atomics.function("atomic_cas_u64", ordinal)?,
            atomic_add: atomics.function("atomic_add_u64", ordinal)?,
            _atomics: atomics,
            _reduce: reduce_module,
            reduce,
            divide,
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

    fn grid(count: usize) -> u32 {
        (count as u64).div_ceil(u64::from(BLOCK)).clamp(1, MAX_GRID) as u32
    }

    /// Queues `dst[i] = op(x[i], y[i])` for `count` elements of `ty` on `stream`; each operand is a
    /// buffer and a byte offset. `dst` may be `x` or `y` at the same offset (in place). `x` and `y`
    /// may be IPC-opened peer buffers on this GPU.
    ///
    /// # Errors
    /// [`CudaError::Memory`] when a range is outside its buffer or an operand's address is not a
    /// multiple of the element size ([`crate::MemoryError::Misaligned`]: a misaligned global access
    /// would be `CUDA_ERROR_MISALIGNED_ADDRESS`, which is sticky and ends the process's context);
    /// [`CudaError::Call`].
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        stream: &CudaStream,
        op: ReduceOp,
        ty: ElemType,
        dst: (&CudaMemory, usize),
        x: (&CudaMemory, usize),
        y: (&CudaMemory, usize),
        count: usize,
    ) -> Result<(), CudaError> {
        let d = operand(dst.0, dst.1, count, ty)?;
        let a = operand(x.0, x.1, count, ty)?;
        let b = operand(y.0, y.1, count, ty)?;
        if count == 0 {
            return Ok(());
        }
        let f = self.modules.reduce[&(op, ty)];
        self.launch(
            f,
            Self::grid(count),
            BLOCK,
            Some(stream),
            &[d, a, b, count as u64],
        )
    }

    /// Queues `buf[i] /= nranks` for `count` elements of `ty` at byte `offset` (the `avg`
    /// post-division; integers truncate toward zero).
    ///
    /// # Errors
    /// [`CudaError::Memory`] (out of range or misaligned, as [`Kernels::reduce`]);
    /// [`CudaError::Call`].
    pub fn divide(
        &self,
        stream: &CudaStream,
        ty: ElemType,
        buf: (&CudaMemory, usize),
        count: usize,
        nranks: u32,
    ) -> Result<(), CudaError> {
        let p = operand(buf.0, buf.1, count, ty)?;
        if count == 0 || nranks <= 1 {
            return Ok(());
        }
        let f = self.modules.divide[&ty];
        self.launch(
            f,
            Self::grid(count),
            BLOCK,
            Some(stream),
            &[p, count as u64, u64::from(nranks)],
        )
    }

    /// `out = atomicAdd(word, add)` on the default stream (addresses checked by the caller).
    pub(super) fn atomic_add(&self, word: u64, add: u64, out: u64) -> Result<(), CudaError> {
        self.launch(self.modules.atomic_add, 1, 1, None, &[word, add, out])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryError;

    #[test]
    fn operands_are_checked_for_range_and_alignment_before_a_launch() {
        let base = 0x7f00_0000_0000u64; // cuMemAlloc: 256-byte aligned
        assert_eq!(
            operand_addr(base, 64, 8, 14, ElemType::F32),
            Ok(base + 8),
            "8 + 14 * 4 = 64 bytes fits exactly"
        );
        assert_eq!(
            operand_addr(base, 64, 8, 15, ElemType::F32),
            Err(MemoryError::OutOfBounds {
                offset: 8,
                len: 60,
                size: 64
            })
        );
        assert_eq!(
            operand_addr(base, 64, 2, 1, ElemType::F32),
            Err(MemoryError::Misaligned { offset: 2 })
        );
        assert_eq!(operand_addr(base, 64, 2, 1, ElemType::Bf16), Ok(base + 2));
        assert_eq!(
            operand_addr(base, 64, 1, 1, ElemType::F16),
            Err(MemoryError::Misaligned { offset: 1 })
        );
        assert_eq!(
            operand_addr(base, 64, 12, 1, ElemType::U64),
            Err(MemoryError::Misaligned { offset: 12 })
        );
        assert_eq!(operand_addr(base, 64, 3, 1, ElemType::I8), Ok(base + 3));
        assert!(matches!(
            operand_addr(base, 64, 0, usize::MAX, ElemType::F64),
            Err(MemoryError::OutOfBounds { .. })
        ));
        // An empty operand at the end is in range (nothing is launched for count 0).
        assert_eq!(operand_addr(base, 64, 64, 0, ElemType::F32), Ok(base + 64));
    }

    #[test]
    fn a_jit_log_prints_on_one_line() {
        let log = "ptxas application ptx input, line 9; error   : Unknown symbol 'x'\n\nptxas fatal   : Ptx assembly aborted due to errors\n";
        let e = CudaError::ModuleLoad {
            module: "ptx/reduce.ptx",
            code: 218,
            name: "CUDA_ERROR_INVALID_PTX".into(),
            device: 0,
            log: one_line(log),
        };
        assert_eq!(
            e.to_string(),
            "cuModuleLoadDataEx of ptx/reduce.ptx on GPU 0 failed: CUDA_ERROR_INVALID_PTX (218); JIT log: ptxas application ptx input, line 9; error   : Unknown symbol 'x' | ptxas fatal   : Ptx assembly aborted due to errors"
        );
    }
}
