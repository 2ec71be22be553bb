//! # `gpu-p2p`: memory for RDMA
//!
//! Every buffer the stack moves data in or out of, a memory region of the software HCA, a collective's
//! send and receive buffers, a GPU tensor, is reached through the [`Memory`] trait of this crate. An
//! HCA, real or software, reads and writes registered memory *while the program runs*: a peer's RDMA
//! WRITE lands whenever the wire delivers it. So memory here is accessed only by copies and 64-bit
//! atomics, never through long-lived Rust references, the same model rust-vmm's `vm-memory` uses for
//! guest memory that a device may change at any time.
//!
//! Providers:
//! * [`HostMemory`] (feature `std`): page-aligned anonymous memory, hugepage-backed when the system has
//!   them (MAP_HUGETLB, else transparent huge pages via `madvise`), locked (`mlock`) so it cannot be
//!   paged out while an HCA may use it.
//! * [`CudaMemory`] (feature `cuda`, on by default): CUDA device memory through the driver API,
//!   which is loaded at run time (`libcuda.so.1`): nothing CUDA is needed to build, test or run the
//!   stack, and asking for a GPU where there is none is a typed error ([`CudaError::DriverNotFound`],
//!   [`CudaError::NoDevice`]). Also pinned host memory, streams and events, IPC handles, dma-buf
//!   export, peer access, a topology report and the GPU kernels (PTX): module [`cuda`].
//! * [`staging::Staged`]: device memory behind a pipelined staging path (below).
//! * [`UserMemory`]: a range of the program's own memory by address, which an HCA reads straight
//!   from for a zero-copy send (the collectives' user-buffer registrations).
//!
//! ## How each backend reaches GPU memory, and why
//! * **Verbs backend** (libibverbs on a real RDMA NIC; another part of the `hca` crate): device memory
//!   registers with `ibv_reg_dmabuf_mr(3)` on the file descriptor from
//!   [`CudaMemory::export_dmabuf`] (`cuMemGetHandleForAddressRange`), after
//!   [`CudaMemory::set_sync_memops`]. The NIC then DMAs straight to and from GPU memory over PCIe
//!   (GPUDirect RDMA): no CPU copy at all. This needs a NIC and a kernel that support dma-buf
//!   (Linux 5.12+, the open GPU kernel module); [`cuda::DeviceInfo::dmabuf`] says whether the GPU
//!   side does.
//! * **Software engine** (the `hca` crate's `SoftHca` over UDP) **and the VFIO link**: the engine
//!   itself builds and parses every packet with the CPU, and the VFIO virtio-net queues DMA only
//!   from IOMMU-mapped host pages, so the payload must pass through host memory the CPU can read.
//!   Device memory is registered wrapped in [`staging::Staged`]: the GPU's copy engine moves the
//!   payload between device memory and pinned staging slots (`cuMemcpyDtoHAsync` /
//!   `cuMemcpyHtoDAsync`, double-buffered, an event per slot), and the engine copies between the
//!   slot and the packet: one staging copy, no more, overlapped with the next chunk's DMA.
//! * **Intra-node collectives** (the `collectives` crate): ranks of one host with CUDA buffers map
//!   each other's device buffers with CUDA IPC and reduce with device-to-device copies and GPU
//!   kernels, without the network.
//!
//! The core trait is `no_std`; the providers need `std`.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(missing_docs)]
#![deny(unsafe_code)]

use core::fmt;
use core::ptr::NonNull;

#[cfg(feature = "std")]
// Edge: anonymous mappings that an HCA reads and writes at any time.
#[allow(unsafe_code)]
mod host;
#[cfg(feature = "std")]
pub use host::{HostMemory, HostMemoryError, PageBacking};

#[cfg(feature = "std")]
pub mod staging;

// Edge: a raw range of the program's memory, by address.
#[allow(unsafe_code)]
mod user;
pub use user::UserMemory;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::{Cuda, CudaDevice, CudaError, CudaMemory, IpcMemHandle, PinnedHostMemory};

/// Where the bytes of a [`Memory`] live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory.
    Host,
    /// CUDA device memory of the GPU with this device ordinal.
    CudaDevice(u32),
}

/// An access outside a [`Memory`], or a misaligned atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryError {
    /// `offset + len` exceeds the memory's length (both in bytes).
    OutOfBounds {
        /// First byte asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// Length of the memory, in bytes.
        size: usize,
    },
    /// A 64-bit atomic at an offset that is not a multiple of 8 (IBTA vol. 1 §9.4.5: atomic operations
    /// act on naturally aligned 64-bit words; the responder NAKs a misaligned one).
    Misaligned {
        /// The offset asked for.
        offset: usize,
    },
    /// The device that holds the memory failed the access (a CUDA copy or kernel returned an
    /// error; the provider logs the driver's error, which names the call and the GPU).
    Device,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryError::OutOfBounds { offset, len, size } => write!(
                f,
                "access of {len} bytes at offset {offset} is outside memory of {size} bytes"
            ),
            MemoryError::Misaligned { offset } => {
                write!(f, "64-bit atomic at offset {offset} is not 8-byte aligned")
            }
            MemoryError::Device => f.write_str("the device holding the memory failed the access"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for MemoryError {}

/// Checks that `[offset, offset + len)` lies within `size` bytes, without overflow.
///
/// # Errors
/// [`MemoryError::OutOfBounds`].
pub fn check_range(offset: usize, len: usize, size: usize) -> Result<(), MemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(MemoryError::OutOfBounds { offset, len, size }),
    }
}

/// The CPU address of a [`Memory`]'s first byte, as [`Memory::host_ptr`] reports it.
///
/// Only an `unsafe` constructor makes one: whoever builds it promises what a link needs to hand the
/// bytes to the kernel (an `iovec` for sendmsg(2)) or to read them in place (the ICRC):
/// * the pointer addresses `len()` bytes of the [`Memory`] that returned it, readable and writable
///   by the CPU, for as long as that `Memory` value lives (registered memory never moves);
/// * the bytes may change at any time (the program writes its buffers, a peer's RDMA WRITE lands):
///   a reader gets whatever values are there, as a DMA engine does, and must not hold a Rust
///   reference across other code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPtr(NonNull<u8>);

impl HostPtr {
    /// Wraps the address of a memory's first byte.
    ///
    /// # Safety
    /// `ptr` must satisfy the contract in the [type docs](HostPtr) for the `Memory` that returns it
    /// from [`Memory::host_ptr`].
    #[allow(unsafe_code)] // the raw-address contract every provider signs
    pub unsafe fn new(ptr: NonNull<u8>) -> HostPtr {
        HostPtr(ptr)
    }

    /// The address of byte 0.
    pub fn as_ptr(self) -> NonNull<u8> {
        self.0
    }
}

// SAFETY: a `HostPtr` is an address, not an owner: it carries no access by itself, and the memory
// it names is `Send + Sync` (every `Memory` is). Dereferencing it needs `unsafe` code that keeps the
// contract above.
#[allow(unsafe_code)]
unsafe impl Send for HostPtr {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for HostPtr {}

/// A fixed-size, byte-addressed buffer that an HCA may read and write at any time.
///
/// Offsets and lengths are in bytes from the start of the buffer. Implementations must keep the bytes
/// at a fixed place for the buffer's whole life (registered memory does not move), must be safe to call
/// from several threads at once (a progress thread and the application), and must never access outside
/// `[0, len())`: every method checks its range first.
pub trait Memory: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> usize;

    /// Whether the memory is zero bytes long.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    fn kind(&self) -> MemoryKind;

    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    ///
    /// # Errors
    /// [`MemoryError::OutOfBounds`]; nothing is copied then.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError>;

    /// Copies `src` into the memory starting at `offset`.
    ///
    /// # Errors
    /// [`MemoryError::OutOfBounds`]; nothing is written then.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError>;

    /// Atomic 64-bit compare-and-swap at `offset` (IBTA vol. 1 §9.4.5 CmpSwap): if the word equals
    /// `compare` it becomes `swap`. Returns the original value. The word is in host byte order, as
    /// verbs atomics are.
    ///
    /// # Errors
    /// [`MemoryError::OutOfBounds`], [`MemoryError::Misaligned`].
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError>;

    /// Atomic 64-bit fetch-and-add at `offset` (IBTA vol. 1 §9.4.5 FetchAdd), wrapping. Returns the
    /// original value.
    ///
    /// # Errors
    /// [`MemoryError::OutOfBounds`], [`MemoryError::Misaligned`].
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError>;

    /// The CPU address of byte 0 when the CPU can reach the bytes directly (host memory), so
    /// that a link can send them in place: a gather list (`iovec`, sendmsg(2)) pointing into the
    /// memory instead of a copy. `None` (the default) for memory only reachable through
    /// [`Memory::read`] / [`Memory::write`] (GPU device memory); links then copy.
    ///
    /// See [`HostPtr`] for what the address promises; it is valid only while `self` lives, so a
    /// user keeps the memory (its `Arc`) alive for as long as it uses the address.
    fn host_ptr(&self) -> Option<HostPtr> {
        None
    }

    /// Whether the provider itself keeps the bytes locked in RAM for the memory's whole life
    /// (`mlock(2)`, or CUDA's page-locked `cuMemHostAlloc` memory), so that a link that maps
    /// them for DMA need not lock them again, and must not unlock them when it unmaps
    /// (`munlock(2)` does not count). `false` (the default) when nothing is promised.
    fn is_locked(&self) -> bool {
        false
    }
}
