//! CUDA device memory through the driver API, loaded at run time.
//!
//! Nothing CUDA is linked or needed at build time: [`Cuda::load`] opens `libcuda.so.1` (the NVIDIA
//! driver's library) with `dlopen` the first time it is called and says, with a typed
//! [`CudaError`], when it is absent ([`CudaError::DriverNotFound`]) or sees no GPU
//! ([`CudaError::NoDevice`]). Bindings: the `cudarc` crate's generated `driver::sys` (CUDA 12.2
//! headers; every call used here exists since CUDA 11.7, so any CUDA 12 driver serves). Topology
//! comes from NVML (`libnvidia-ml.so.1`, also loaded at run time) or sysfs: [`topology`].
//!
//! What is here, each with the CUDA Driver API section it follows:
//! * [`Cuda`] (6.4 Initialization): the loaded driver; device enumeration.
//! * [`CudaDevice`] (6.6 Device Management, 6.7 Primary Context Management): one GPU and its
//!   primary context, peer access (6.26), device attributes.
//! * [`CudaMemory`] (6.13 Memory Management): device memory implementing [`crate::Memory`]:
//!   `read`/`write` are synchronous `cuMemcpyDtoH`/`cuMemcpyHtoD`, the 64-bit atomics run as a
//!   one-thread kernel (`ptx/atomics.ptx`, `atom.global.cas.b64` / `atom.global.add.u64`) so they are
//!   atomic with respect to every other GPU access. Also: pointer attributes (SYNC_MEMOPS, 6.17),
//!   dma-buf export ([`CudaMemory::export_dmabuf`]) and IPC handles ([`CudaMemory::ipc_handle`],
//!   [`CudaDevice::open_ipc`]).
//! * [`PinnedHostMemory`] (`cuMemHostAlloc`): page-locked host memory the GPU's copy engines DMA
//!   from and to; the staging buffers of [`crate::staging`].
//! * [`CudaStream`] and [`CudaEvent`] (6.15, 6.16): asynchronous copies and their completion.
//!
//! Every handle type keeps an `Arc` of its [`CudaDevice`], so the primary context outlives every
//! allocation, stream, event and module made in it; each `Drop` frees what it owns.

use core::fmt;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{check_range, Memory, MemoryError, MemoryKind};

mod kernels;
// Edge: page-locked host memory from the CUDA driver.
#[allow(unsafe_code)]
mod pinned;
// Edge: FFI, the CUDA driver and NVML calls.
#[allow(unsafe_code)]
mod sys;
pub mod topology;

pub use kernels::{
    divide_kernel_name, reduce_kernel_name, ElemType, Kernels, ReduceOp, REDUCE_PTX,
};
pub use pinned::PinnedHostMemory;

/// The PTX of the 64-bit atomics kernels (`ptx/atomics.ptx`).
pub const ATOMICS_PTX: &str = include_str!("../../ptx/atomics.ptx");

/// What failed in the CUDA provider. `Display` is one line naming the call and the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// No NVIDIA driver library could be opened (none of `searched`, e.g. `libcuda.so.1`): this
    /// machine has no NVIDIA driver installed, or it is not on the loader's path.
    DriverNotFound {
        /// The library names tried, in order.
        searched: Vec<String>,
    },
    /// The driver loaded but reports no CUDA device (`cuInit` gave `CUDA_ERROR_NO_DEVICE`, or
    /// `cuDeviceGetCount` gave 0).
    NoDevice,
    /// A device ordinal at or above the number of devices.
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// A driver call failed.
    Call {
        /// The driver function (`cuMemAlloc`, ...).
        call: &'static str,
        /// Its `CUresult` value.
        code: u32,
        /// The result's name (`CUDA_ERROR_OUT_OF_MEMORY`), from `cuGetErrorName`.
        name: String,
        /// The GPU it acted on, where one was.
        device: Option<u32>,
    },
    /// The driver could not load (JIT-compile) one of the crate's PTX modules
    /// (`cuModuleLoadDataEx`, CUDA Driver API 6.11).
    ModuleLoad {
        /// The module (`ptx/reduce.ptx`, `ptx/atomics.ptx`).
        module: &'static str,
        /// The `CUresult` value.
        code: u32,
        /// Its name (`CUDA_ERROR_INVALID_PTX`, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, ...).
        name: String,
        /// The GPU.
        device: u32,
        /// The JIT compiler's error log, its lines joined with " | " (empty when it gave none).
        log: String,
    },
    /// A range that a driver call needs aligned is not (dma-buf export wants host-page alignment of
    /// address and length: CUDA Driver API 6.13, `cuMemGetHandleForAddressRange`).
    Unaligned {
        /// What was being done.
        what: &'static str,
        /// Device address, in bytes.
        address: u64,
        /// Length in bytes.
        len: usize,
        /// The alignment required, in bytes.
        align: usize,
    },
    /// The device does not support what was asked (`what`: "dma-buf export", "peer access", ...).
    Unsupported {
        /// The feature.
        what: &'static str,
        /// The GPU.
        device: u32,
    },
    /// An IPC-opened allocation is shorter than the length the peer announced (bytes).
    IpcTooShort {
        /// Bytes the opener asked for.
        wanted: usize,
        /// Bytes the driver says the allocation has.
        actual: usize,
    },
    /// Waiting for GPU work (an event) took longer than the bound given.
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long, in milliseconds.
        waited_ms: u64,
    },
    /// An access outside a buffer or a misaligned atomic.
    Memory(MemoryError),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::DriverNotFound { searched } => {
                let main = searched
                    .iter()
                    .find(|s| s.ends_with(".so.1"))
                    .or(searched.last())
                    .map_or("libcuda.so.1", String::as_str);
                write!(
                    f,
                    "no CUDA driver: cannot load {main} (nor {} other names of it); this machine has no NVIDIA GPU driver on the loader path",
                    searched.len().saturating_sub(1)
                )
            }
            CudaError::NoDevice => f.write_str("the CUDA driver loaded but reports no GPU"),
            CudaError::NoSuchDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal}: this machine has {count}")
            }
            CudaError::Call {
                call,
                code,
                name,
                device,
            } => match device {
                Some(d) => write!(f, "{call} on GPU {d} failed: {name} ({code})"),
                None => write!(f, "{call} failed: {name} ({code})"),
            },
            CudaError::ModuleLoad {
                module,
                code,
                name,
                device,
                log,
            } => {
                write!(
                    f,
                    "cuModuleLoadDataEx of {module} on GPU {device} failed: {name} ({code})"
                )?;
                if log.is_empty() {
                    Ok(())
                } else {
                    write!(f, "; JIT log: {log}")
                }
            }
            CudaError::Unaligned {
                what,
                address,
                len,
                align,
            } => write!(
                f,
                "{what}: range {address:#x}+{len} is not {align}-byte aligned in address and length"
            ),
            CudaError::Unsupported { what, device } => {
                write!(f, "GPU {device} does not support {what}")
            }
            CudaError::IpcTooShort { wanted, actual } => write!(
                f,
                "IPC-opened allocation has {actual} bytes, fewer than the {wanted} announced"
            ),
            CudaError::Timeout { what, waited_ms } => {
                write!(f, "{what} did not finish within {waited_ms} ms")
            }
            CudaError::Memory(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<MemoryError> for CudaError {
    fn from(e: MemoryError) -> Self {
        CudaError::Memory(e)
    }
}

fn call_err(device: Option<u32>) -> impl Fn(sys::CuFail) -> CudaError {
    move |e| CudaError::Call {
        call: e.call,
        code: e.code,
        name: sys::error_name(e.code),
        device,
    }
}

/// The loaded CUDA driver (`cuInit` done). Cheap to copy; all state lives in the driver.
#[derive(Debug, Clone, Copy)]
pub struct Cuda {
    _private: (),
}

static LOAD: OnceLock<Result<(), CudaError>> = OnceLock::new();

impl Cuda {
    /// Loads the driver library (once per process) and initializes it (`cuInit(0)`).
    ///
    /// # Errors
    /// [`CudaError::DriverNotFound`] when `libcuda` cannot be opened, [`CudaError::NoDevice`] when
    /// the driver sees no GPU, [`CudaError::Call`] for any other `cuInit` failure.
    pub fn load() -> Result<Cuda, CudaError> {
        LOAD.get_or_init(|| Self::load_from(&sys::driver_candidates()))
            .clone()
            .map(|()| Cuda { _private: () })
    }

    /// The loader behind [`Cuda::load`], with the library names to try given (the error path's test
    /// hook; [`Cuda::load`] passes `cudarc`'s candidate list, which ends with `libcuda.so.1`).
    ///
    /// # Errors
    /// As [`Cuda::load`].
    pub fn load_from(candidates: &[String]) -> Result<(), CudaError> {
        if !sys::driver_present(candidates) {
            return Err(CudaError::DriverNotFound {
                searched: candidates.to_vec(),
            });
        }
        sys::mark_loaded();
        match sys::init() {
            Ok(()) => {}
            Err(e) if e.code == sys::ERROR_NO_DEVICE => return Err(CudaError::NoDevice),
            Err(e) => return Err(call_err(None)(e)),
        }
        if sys::device_count().map_err(call_err(None))? == 0 {
            return Err(CudaError::NoDevice);
        }
        Ok(())
    }

    /// The driver's CUDA version, as `cuDriverGetVersion` reports it (12040 is 12.4).
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        sys::driver_version().map_err(call_err(None))
    }

    /// Number of CUDA devices.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn device_count(&self) -> Result<u32, CudaError> {
        Ok(sys::device_count().map_err(call_err(None))?.max(0) as u32)
    }

    /// The ordinal of the GPU whose memory `ptr` is (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, CUDA
    /// Driver API 6.17; works with no context current).
    ///
    /// # Errors
    /// [`CudaError::Call`]: `CUDA_ERROR_INVALID_VALUE` when `ptr` is not memory the driver
    /// knows (host memory that is not registered, a stale or made-up address).
    pub fn device_of(&self, ptr: u64) -> Result<u32, CudaError> {
        let ordinal = sys::pointer_device_ordinal(ptr).map_err(call_err(None))?;
        Ok(ordinal.max(0) as u32)
    }

    /// Opens GPU `ordinal` and retains its primary context.
    ///
    /// # Errors
    /// [`CudaError::NoSuchDevice`], [`CudaError::Call`].
    pub fn device(&self, ordinal: u32) -> Result<Arc<CudaDevice>, CudaError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let e = call_err(Some(ordinal));
        let dev = sys::device_get(ordinal as i32).map_err(&e)?;
        let ctx = sys::primary_ctx_retain(dev).map_err(&e)?;
        let device = CudaDevice {
            ordinal,
            dev,
            ctx,
            name: sys::device_name(dev).unwrap_or_default(),
            pci_bus_id: sys::device_pci_bus_id(dev).unwrap_or_default(),
            modules: OnceLock::new(),
        };
        device.bind()?;
        Ok(Arc::new(device))
    }
}

/// One GPU with its retained primary context.
pub struct CudaDevice {
    ordinal: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    pci_bus_id: String,
    modules: OnceLock<Result<kernels::Modules, CudaError>>,
}

// SAFETY: a CUDA context is usable from any host thread once made current there (the driver API is
// thread-safe, CUDA Programming Guide "Context"); every method binds the context before a call.
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Send for CudaDevice {}
// SAFETY: as for Send: shared use only makes driver calls, which the driver serializes as needed.
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Sync for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("pci_bus_id", &self.pci_bus_id)
            .finish()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Some(Ok(m)) = self.modules.take() {
            let _ = self.bind();
            drop(m);
        }
        let _ = sys::primary_ctx_release(self.dev);
    }
}

/// Attributes of a device, as the driver reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name ("NVIDIA H200").
    pub name: String,
    /// PCI bus id ("0000:3b:00.0").
    pub pci_bus_id: String,
    /// Compute capability (9, 0 for Hopper).
    pub compute_capability: (i32, i32),
    /// Global memory, in bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma: bool,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (what `ibv_reg_dmabuf_mr` needs).
    pub dmabuf: bool,
}

impl CudaDevice {
    /// Device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<(), CudaError> {
        sys::ctx_set_current(self.ctx).map_err(self.err())
    }

    fn err(&self) -> impl Fn(sys::CuFail) -> CudaError {
        call_err(Some(self.ordinal))
    }

    /// The device's attributes.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn info(&self) -> Result<DeviceInfo, CudaError> {
        let a = |attr| sys::device_attribute(self.dev, attr).map_err(self.err());
        Ok(DeviceInfo {
            ordinal: self.ordinal,
            name: self.name.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            compute_capability: (a(sys::Attr::CcMajor)?, a(sys::Attr::CcMinor)?),
            total_memory: sys::device_total_mem(self.dev).map_err(self.err())?,
            multiprocessors: a(sys::Attr::MultiprocessorCount)?,
            gpudirect_rdma: a(sys::Attr::GpuDirectRdma)? != 0,
            dmabuf: a(sys::Attr::DmaBuf)? != 0,
        })
    }

    /// Allocates `len` bytes of device memory (`cuMemAlloc`; 256-byte aligned), zero-filled.
    ///
    /// # Errors
    /// [`CudaError::Call`] (`CUDA_ERROR_OUT_OF_MEMORY` and others).
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<CudaMemory, CudaError> {
        self.bind()?;
        let ptr = sys::mem_alloc(len.max(1)).map_err(self.err())?;
        let mem = CudaMemory {
            device: self.clone(),
            ptr,
            len,
            origin: Origin::Allocated,
            staging: Mutex::new(()),
        };
        sys::memset_d8(ptr, 0, len.max(1)).map_err(self.err())?;
        sys::ctx_synchronize().map_err(self.err())?;
        Ok(mem)
    }

    /// Allocates `len` bytes of pinned host memory (`cuMemHostAlloc`, portable).
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn alloc_pinned(self: &Arc<Self>, len: usize) -> Result<PinnedHostMemory, CudaError> {
        self.bind()?;
        PinnedHostMemory::new(self.clone(), len)
    }

    /// Creates a non-blocking stream.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn stream(self: &Arc<Self>) -> Result<CudaStream, CudaError> {
        self.bind()?;
        let stream = sys::stream_create().map_err(self.err())?;
        Ok(CudaStream {
            device: self.clone(),
            stream,
        })
    }

    /// Creates an event; `timing` enables [`CudaEvent::elapsed_ms`].
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn event(self: &Arc<Self>, timing: bool) -> Result<CudaEvent, CudaError> {
        self.bind()?;
        let event = sys::event_create(timing).map_err(self.err())?;
        Ok(CudaEvent {
            device: self.clone(),
            event,
        })
    }

    /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`). A device and itself:
    /// true.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool, CudaError> {
        if peer.dev == self.dev {
            return Ok(true);
        }
        sys::can_access_peer(self.dev, peer.dev).map_err(self.err())
    }

    /// Lets kernels and copies in this device's context access `peer`'s memory
    /// (`cuCtxEnablePeerAccess`); already enabled counts as success, the same device is a no-op.
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] when [`CudaDevice::can_access_peer`] says no; [`CudaError::Call`].
    pub fn enable_peer_access(&self, peer: &CudaDevice) -> Result<(), CudaError> {
        if peer.dev == self.dev {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(CudaError::Unsupported {
                what: "peer access",
                device: self.ordinal,
            });
        }
        self.bind()?;
        match sys::ctx_enable_peer_access(peer.ctx) {
            Ok(()) => Ok(()),
            Err(e) if e.code == sys::ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            Err(e) => Err(self.err()(e)),
        }
    }

    /// Maps another process's allocation from its [`IpcMemHandle`] (`cuIpcOpenMemHandle`, with lazy
    /// peer access). `len` is the length the exporter announced; the mapping is checked to be at
    /// least that long. The mapping is closed when the returned memory is dropped. The handle must
    /// come from another process (CUDA does not open a process's own handles).
    ///
    /// # Errors
    /// [`CudaError::Call`] (an invalid or stale handle: `CUDA_ERROR_INVALID_VALUE`),
    /// [`CudaError::IpcTooShort`].
    pub fn open_ipc(
        self: &Arc<Self>,
        handle: &IpcMemHandle,
        len: usize,
    ) -> Result<CudaMemory, CudaError> {
        self.bind()?;
        let ptr = sys::ipc_open_mem_handle(&handle.0).map_err(self.err())?;
        let mem = CudaMemory {
            device: self.clone(),
            ptr,
            len,
            origin: Origin::IpcOpened,
            staging: Mutex::new(()),
        };
        let (_, size) = sys::mem_get_address_range(ptr).map_err(self.err())?;
        if size < len {
            return Err(CudaError::IpcTooShort {
                wanted: len,
                actual: size,
            });
        }
        Ok(mem)
    }

    /// Device memory another owner allocated (a `torch.Tensor`'s `data_ptr()`, a
    /// `__cuda_array_interface__` or DLPack `kDLCUDA` export), as [`CudaMemory`] of `len` bytes at
    /// `ptr`, for the collectives' device path. Nothing is allocated or copied, and dropping it
    /// frees nothing and waits for nothing: this crate's own copies and kernels on it are
    /// synchronous or synchronized by their callers before they return.
    ///
    /// Checked with the driver, so a bad address is an error, never a wild access: `ptr` must be
    /// device memory of this GPU (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, CUDA Driver API 6.17) and
    /// `[ptr, ptr + len)` must lie inside one allocation (`cuMemGetAddressRange`, 6.13). `len` 0
    /// is accepted without a check. The owner must keep the memory allocated while the returned
    /// value is in use; every access goes through driver calls, which fail
    /// (`CUDA_ERROR_INVALID_VALUE`) rather than fault on memory freed meanwhile.
    ///
    /// # Errors
    /// [`CudaError::Call`] (not device memory: `CUDA_ERROR_INVALID_VALUE`),
    /// [`CudaError::Unsupported`] (memory of another GPU), [`CudaError::Memory`] (the range runs
    /// past the end of its allocation).
    pub fn borrow(self: &Arc<Self>, ptr: u64, len: usize) -> Result<CudaMemory, CudaError> {
        if len > 0 {
            self.bind()?;
            let ordinal = sys::pointer_device_ordinal(ptr).map_err(self.err())?;
            if ordinal != self.ordinal as i32 {
                return Err(CudaError::Unsupported {
                    what: "borrowing memory of another GPU",
                    device: self.ordinal,
                });
            }
            let (base, size) = sys::mem_get_address_range(ptr).map_err(self.err())?;
            check_range(ptr.saturating_sub(base) as usize, len, size)?;
        }
        Ok(CudaMemory {
            device: self.clone(),
            ptr,
            len,
            origin: Origin::Borrowed,
            staging: Mutex::new(()),
        })
    }

    /// Blocks until all work in this device's context is done (`cuCtxSynchronize`).
    ///
    /// # Errors
    /// [`CudaError::Call`] (also a kernel fault reported late).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        sys::ctx_synchronize().map_err(self.err())
    }

    /// The loaded kernel modules (JIT-compiled from PTX on first use).
    fn modules(&self) -> Result<&kernels::Modules, CudaError> {
        self.modules
            .get_or_init(|| {
                self.bind()?;
                kernels::Modules::load(self.ordinal)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The kernels of this device (loaded from PTX on first use).
    ///
    /// # Errors
    /// [`CudaError::ModuleLoad`] when the PTX does not load (`CUDA_ERROR_INVALID_PTX`, ..., with
    /// the JIT log); [`CudaError::Call`].
    pub fn kernels(self: &Arc<Self>) -> Result<Kernels<'_>, CudaError> {
        Ok(Kernels::new(self, self.modules()?))
    }
}

/// An IPC handle of a device allocation: 64 opaque bytes (`CUipcMemHandle`) that another process on
/// the same host passes to [`CudaDevice::open_ipc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

impl IpcMemHandle {
    /// Length of the handle in bytes.
    pub const LEN: usize = sys::IPC_HANDLE_LEN;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Allocated,
    IpcOpened,
    /// Memory another owner allocated (a framework's tensor), described by address and length:
    /// never freed here.
    Borrowed,
}

/// Device memory of one GPU, allocated here or mapped from another process by IPC.
///
/// Implements [`Memory`]: `read` and `write` are synchronous copies (`cuMemcpyDtoH` /
/// `cuMemcpyHtoD`), the atomics are one-thread kernels. The software HCA reaches device memory
/// through the pipelined staging path instead ([`crate::staging::Staged`]).
pub struct CudaMemory {
    device: Arc<CudaDevice>,
    ptr: sys::CUdeviceptr,
    len: usize,
    origin: Origin,
    /// Serializes the atomics' result word use (one at a time per buffer).
    staging: Mutex<()>,
}

impl fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMemory")
            .field("device", &self.device.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("origin", &self.origin)
            .finish()
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.origin == Origin::Borrowed {
            // Nothing to free; the owner's work on the memory is its own (a context synchronize
            // here would wait for every stream of the context, the owner's compute included).
            return;
        }
        let _ = self.device.bind();
        // Outstanding work on the buffer must finish before it is freed or unmapped.
        let _ = sys::ctx_synchronize();
        let _ = match self.origin {
            Origin::Allocated => sys::mem_free(self.ptr),
            Origin::IpcOpened => sys::ipc_close_mem_handle(self.ptr),
            Origin::Borrowed => Ok(()),
        };
    }
}

impl CudaMemory {
    /// The device this memory lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The device address (a `CUdeviceptr`; unified virtual addressing makes it unique in the
    /// process).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    fn range(&self, offset: usize, len: usize) -> Result<u64, CudaError> {
        check_range(offset, len, self.len)?;
        Ok(self.ptr + offset as u64)
    }

    /// Sets `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` on the allocation, as a range registered for RDMA
    /// needs (CUDA "GPUDirect RDMA" guide, 3.5: synchronous memory operations on it complete before
    /// an RDMA that follows them). Reads it back to confirm.
    ///
    /// # Errors
    /// [`CudaError::Call`], [`CudaError::Unsupported`] if the attribute did not take.
    pub fn set_sync_memops(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        sys::pointer_set_sync_memops(self.ptr).map_err(self.device.err())?;
        if sys::pointer_sync_memops(self.ptr).map_err(self.device.err())? {
            Ok(())
        } else {
            Err(CudaError::Unsupported {
                what: "CU_POINTER_ATTRIBUTE_SYNC_MEMOPS",
                device: self.device.ordinal,
            })
        }
    }

    /// The device ordinal the driver reports for this pointer (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn pointer_device_ordinal(&self) -> Result<u32, CudaError> {
        self.device.bind()?;
        Ok(sys::pointer_device_ordinal(self.ptr).map_err(self.device.err())? as u32)
    }

    /// Exports `[offset, offset + len)` as a dma-buf file descriptor
    /// (`cuMemGetHandleForAddressRange`, CUDA 11.7+; Linux kernel 5.12+ with the open GPU kernel
    /// module), for `ibv_reg_dmabuf_mr(3)`. Address and length must be host-page aligned.
    ///
    /// # Errors
    /// [`CudaError::Memory`] (out of bounds), [`CudaError::Unaligned`], [`CudaError::Unsupported`]
    /// when the device lacks `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, [`CudaError::Call`].
    pub fn export_dmabuf(&self, offset: usize, len: usize) -> Result<OwnedFd, CudaError> {
        let addr = self.range(offset, len)?;
        let page = sys::page_size();
        if addr % page as u64 != 0 || len % page != 0 || len == 0 {
            return Err(CudaError::Unaligned {
                what: "dma-buf export",
                address: addr,
                len,
                align: page,
            });
        }
        self.device.bind()?;
        if sys::device_attribute(self.device.dev, sys::Attr::DmaBuf).map_err(self.device.err())?
            == 0
        {
            return Err(CudaError::Unsupported {
                what: "dma-buf export",
                device: self.device.ordinal,
            });
        }
        sys::dmabuf_fd(addr, len).map_err(self.device.err())
    }

    /// The IPC handle of this allocation (`cuIpcGetMemHandle`), for another process to map with
    /// [`CudaDevice::open_ipc`].
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] for memory that was itself IPC-opened; [`CudaError::Call`].
    pub fn ipc_handle(&self) -> Result<IpcMemHandle, CudaError> {
        if self.origin != Origin::Allocated {
            return Err(CudaError::Unsupported {
                what: "IPC export of memory not allocated here (IPC-opened or borrowed)",
                device: self.device.ordinal,
            });
        }
        self.device.bind()?;
        sys::ipc_get_mem_handle(self.ptr)
            .map(IpcMemHandle)
            .map_err(self.device.err())
    }

    /// Fills `[offset, offset + len)` with `value` and waits.
    ///
    /// # Errors
    /// [`CudaError::Memory`], [`CudaError::Call`].
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), CudaError> {
        let addr = self.range(offset, len)?;
        self.device.bind()?;
        sys::memset_d8(addr, value, len).map_err(self.device.err())?;
        sys::ctx_synchronize().map_err(self.device.err())
    }

    /// Synchronous copy from host bytes (`cuMemcpyHtoD`); the bytes are in device memory when it
    /// returns.
    ///
    /// `cuMemcpyHtoD` from pageable memory returns once the source has been copied to the driver's
    /// staging buffer, "but the DMA to final destination may not have completed" (CUDA Driver API,
    /// "API synchronization behavior"), and it is ordered after the legacy default stream only. A
    /// kernel or copy queued next on one of our non-blocking streams (the GPU peer-to-peer
    /// all-reduce, [`crate::staging::Staged`]) could read the old bytes, so the context is
    /// synchronized after the copy.
    ///
    /// # Errors
    /// [`CudaError::Memory`], [`CudaError::Call`].
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<(), CudaError> {
        let addr = self.range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        sys::memcpy_htod(addr, src).map_err(self.device.err())?;
        sys::ctx_synchronize().map_err(self.device.err())
    }

    /// Synchronous copy into host bytes (`cuMemcpyDtoH`).
    ///
    /// # Errors
    /// [`CudaError::Memory`], [`CudaError::Call`].
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), CudaError> {
        let addr = self.range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        // A kernel or async copy still writing the range must finish first: cuMemcpyDtoH is ordered
        // after the legacy default stream only, not after our non-blocking streams.
        sys::ctx_synchronize().map_err(self.device.err())?;
        sys::memcpy_dtoh(dst, addr).map_err(self.device.err())
    }

    fn atomic(
        &self,
        offset: usize,
        f: impl FnOnce(&Kernels<'_>, u64, u64) -> Result<(), CudaError>,
    ) -> Result<u64, CudaError> {
        let addr = self.range(offset, 8)?;
        if offset % 8 != 0 {
            return Err(MemoryError::Misaligned { offset }.into());
        }
        let _one_at_a_time = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let out = self.device.alloc(8)?;
        let kernels = self.device.kernels()?;
        f(&kernels, addr, out.ptr)?;
        self.device.synchronize()?;
        let mut word = [0u8; 8];
        out.copy_to_host(0, &mut word)?;
        Ok(u64::from_ne_bytes(word))
    }

    /// [`Memory::compare_swap`] with the CUDA error kept.
    ///
    /// # Errors
    /// [`CudaError::Memory`], [`CudaError::Call`].
    pub fn try_compare_swap(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, CudaError> {
        self.atomic(offset, |k, word, out| {
            k.atomic_cas(word, compare, swap, out)
        })
    }

    /// [`Memory::fetch_add`] with the CUDA error kept.
    ///
    /// # Errors
    /// [`CudaError::Memory`], [`CudaError::Call`].
    pub fn try_fetch_add(&self, offset: usize, add: u64) -> Result<u64, CudaError> {
        self.atomic(offset, |k, word, out| k.atomic_add(word, add, out))
    }
}

/// Maps a CUDA failure inside a [`Memory`] method, which can only return [`MemoryError`]: range
/// errors keep their value; a driver failure becomes [`MemoryError::Device`] after being logged.
fn to_memory_error(e: CudaError) -> MemoryError {
    match e {
        CudaError::Memory(m) => m,
        other => {
            eprintln!("gpu-p2p: {other}");
            MemoryError::Device
        }
    }
}

impl Memory for CudaMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::CudaDevice(self.device.ordinal)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.copy_to_host(offset, dst).map_err(to_memory_error)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.copy_from_host(offset, src).map_err(to_memory_error)
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.try_compare_swap(offset, compare, swap)
            .map_err(to_memory_error)
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.try_fetch_add(offset, add).map_err(to_memory_error)
    }
}

/// A CUDA stream (non-blocking) for asynchronous copies and kernels.
///
/// The copy methods queue work and return; [`CudaStream::synchronize`] or a [`CudaEvent`] says
/// when it is done. Buffers cannot be freed under a queued copy: dropping a [`CudaMemory`] or a
/// [`PinnedHostMemory`] first synchronizes its device's context (`cuCtxSynchronize`), which waits
/// for every stream of that device.
pub struct CudaStream {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
}

// SAFETY: a stream handle may be used from any thread with its context current (the driver API is
// thread-safe, CUDA Programming Guide "Streams").
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Send for CudaStream {}
// SAFETY: as for Send.
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Sync for CudaStream {}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStream")
            .field("device", &self.device.ordinal)
            .finish()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let _ = self.device.bind();
        let _ = sys::stream_synchronize(self.stream);
        let _ = sys::stream_destroy(self.stream);
    }
}

impl CudaStream {
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.stream
    }

    /// The device of the stream.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Queues a copy of `len` bytes from `src` at `src_offset` into pinned `dst` at `dst_offset`.
    ///
    /// # Errors
    /// [`CudaError::Memory`] (either range), [`CudaError::Call`].
    pub fn copy_to_pinned(
        &self,
        dst: &PinnedHostMemory,
        dst_offset: usize,
        src: &CudaMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let s = src.range(src_offset, len)?;
        let d = dst.range_ptr(dst_offset, len)?;
        self.device.bind()?;
        sys::memcpy_dtoh_async(d, s, len, self.stream).map_err(self.device.err())?;
        Ok(())
    }

    /// Queues a copy of `len` bytes from pinned `src` at `src_offset` into `dst` at `dst_offset`.
    ///
    /// # Errors
    /// [`CudaError::Memory`] (either range), [`CudaError::Call`].
    pub fn copy_from_pinned(
        &self,
        dst: &CudaMemory,
        dst_offset: usize,
        src: &PinnedHostMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let d = dst.range(dst_offset, len)?;
        let s = src.range_ptr(src_offset, len)?;
        self.device.bind()?;
        sys::memcpy_htod_async(d, s, len, self.stream).map_err(self.device.err())?;
        Ok(())
    }

    /// Queues a device-to-device copy (also between a local buffer and an IPC-opened peer buffer on
    /// the same or a peer-accessible GPU).
    ///
    /// # Errors
    /// [`CudaError::Memory`] (either range), [`CudaError::Call`].
    pub fn copy_device(
        &self,
        dst: &CudaMemory,
        dst_offset: usize,
        src: &CudaMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let d = dst.range(dst_offset, len)?;
        let s = src.range(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        sys::memcpy_dtod_async(d, s, len, self.stream).map_err(self.device.err())?;
        Ok(())
    }

    /// Blocks until everything queued has finished.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        sys::stream_synchronize(self.stream).map_err(self.device.err())
    }
}

/// A CUDA event: a marker in a stream whose completion can be polled.
pub struct CudaEvent {
    device: Arc<CudaDevice>,
    event: sys::CUevent,
}

// SAFETY: as for CudaStream.
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Send for CudaEvent {}
// SAFETY: as for CudaStream.
#[allow(unsafe_code)] // a raw CUDA driver handle (FFI)
unsafe impl Sync for CudaEvent {}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEvent")
            .field("device", &self.device.ordinal)
            .finish()
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let _ = self.device.bind();
        let _ = sys::event_destroy(self.event);
    }
}

impl CudaEvent {
    /// Records the event at the current end of `stream`.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn record(&self, stream: &CudaStream) -> Result<(), CudaError> {
        self.device.bind()?;
        sys::event_record(self.event, stream.stream).map_err(self.device.err())
    }

    /// Records the event at the current end of a stream this crate did not create, given as its
    /// raw `CUstream` value (`torch.cuda.current_stream().cuda_stream`, the `stream` of a
    /// `__cuda_array_interface__` v3 export; 0 the NULL stream, 1 `CU_STREAM_LEGACY`, 2
    /// `CU_STREAM_PER_THREAD`). Waiting for the event then orders host work after everything
    /// that stream had queued, as `torch.cuda.Event.record(stream)` does.
    ///
    /// # Safety
    /// `stream` must be 0, 1, 2, or a live stream of this event's device context: the driver
    /// dereferences the handle.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    #[allow(unsafe_code)] // the raw-handle contract, forwarded to the caller
    pub unsafe fn record_on_raw_stream(&self, stream: usize) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: forwarded: the caller vouches for `stream`.
        unsafe { sys::event_record_foreign(self.event, stream) }.map_err(self.device.err())
    }

    /// Whether the work before the last record has finished.
    ///
    /// # Errors
    /// [`CudaError::Call`] (also a fault of that work).
    pub fn is_done(&self) -> Result<bool, CudaError> {
        self.device.bind()?;
        sys::event_query(self.event).map_err(self.device.err())
    }

    /// Waits until [`CudaEvent::is_done`], polling (spinning briefly, then yielding), at most
    /// `timeout`.
    ///
    /// # Errors
    /// [`CudaError::Timeout`], [`CudaError::Call`].
    pub fn wait(&self, timeout: Duration) -> Result<(), CudaError> {
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.is_done()? {
            if start.elapsed() > timeout {
                return Err(CudaError::Timeout {
                    what: "CUDA event",
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Milliseconds between `start` and this event, both recorded with timing enabled and done.
    ///
    /// # Errors
    /// [`CudaError::Call`].
    pub fn elapsed_ms(&self, start: &CudaEvent) -> Result<f32, CudaError> {
        self.device.bind()?;
        sys::event_elapsed_ms(start.event, self.event).map_err(self.device.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_driver_is_a_typed_error_naming_what_was_tried() {
        let names = vec!["libcuda-does-not-exist.so.1".to_string()];
        let e = Cuda::load_from(&names).unwrap_err();
        assert_eq!(
            e,
            CudaError::DriverNotFound {
                searched: names.clone()
            }
        );
        let line = e.to_string();
        assert!(line.contains("libcuda-does-not-exist.so.1"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn load_on_this_machine_matches_whether_libcuda_exists() {
        let present = sys::driver_present(&sys::driver_candidates());
        match Cuda::load() {
            Err(CudaError::DriverNotFound { searched }) => {
                assert!(!present);
                assert!(searched.iter().any(|s| s == "libcuda.so.1"), "{searched:?}");
            }
            Ok(cuda) => {
                assert!(present);
                assert!(cuda.device_count().unwrap() > 0);
            }
            Err(e) => assert!(present, "driver absent but got {e}"),
        }
    }

    #[test]
    fn errors_display_on_one_line() {
        let errs = [
            CudaError::NoDevice,
            CudaError::NoSuchDevice {
                ordinal: 3,
                count: 1,
            },
            CudaError::Call {
                call: "cuMemAlloc",
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                device: Some(0),
            },
            CudaError::Unaligned {
                what: "dma-buf export",
                address: 0x1001,
                len: 5,
                align: 4096,
            },
            CudaError::Timeout {
                what: "CUDA event",
                waited_ms: 5,
            },
        ];
        for e in errs {
            let s = e.to_string();
            assert!(!s.is_empty() && !s.contains('\n'), "{s}");
        }
        assert_eq!(
            CudaError::Call {
                call: "cuMemAlloc",
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                device: Some(0)
            }
            .to_string(),
            "cuMemAlloc on GPU 0 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
        );
    }
}
