//! Pinned (page-locked) host memory from `cuMemHostAlloc`: what the GPU's copy engines DMA from and
//! to without an intermediate copy, and so the staging buffers of [`crate::staging`].

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{sys, CudaDevice, CudaError};
use crate::{check_range, Memory, MemoryError, MemoryKind};

/// `len` bytes of page-locked host memory, portable to every CUDA context, zero-filled at creation.
/// Freed (`cuMemFreeHost`) on drop. Implements [`Memory`] like [`crate::HostMemory`] (copies and
/// 64-bit atomics on the CPU).
pub struct PinnedHostMemory {
    device: Arc<CudaDevice>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is plain host memory owned by this value; every access is a bounds-checked
// copy or atomic, the model the crate documents for memory a device may write at any time.
unsafe impl Send for PinnedHostMemory {}
// SAFETY: as for Send.
unsafe impl Sync for PinnedHostMemory {}

impl fmt::Debug for PinnedHostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("device", &self.device.ordinal())
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        let _ = self.device.bind();
        // A copy queued on one of the device's streams may still read or write the buffer.
        let _ = sys::ctx_synchronize();
        let _ = sys::mem_free_host(self.ptr);
    }
}

impl PinnedHostMemory {
    pub(super) fn new(device: Arc<CudaDevice>, len: usize) -> Result<Self, CudaError> {
        let ptr = sys::mem_host_alloc(len.max(1)).map_err(device.err())?;
        let mem = PinnedHostMemory { device, ptr, len };
        sys::host_zero(mem.ptr, len.max(1));
        Ok(mem)
    }

    /// The start address (page aligned), for links that hand it to a device.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(super) fn range_ptr(&self, offset: usize, len: usize) -> Result<*mut u8, CudaError> {
        check_range(offset, len, self.len)?;
        Ok(self.ptr.wrapping_add(offset))
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64, MemoryError> {
        check_range(offset, 8, self.len)?;
        if offset % 8 != 0 {
            return Err(MemoryError::Misaligned { offset });
        }
        Ok(sys::host_atomic_u64(self.ptr, offset))
    }
}

impl Memory for PinnedHostMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(offset, dst.len(), self.len)?;
        sys::host_read(self.ptr, offset, dst);
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(offset, src.len(), self.len)?;
        sys::host_write(self.ptr, offset, src);
        Ok(())
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        // SeqCst: an RDMA atomic is one indivisible step with respect to every other atomic on the
        // word (IBTA vol. 1 9.4.5), as in HostMemory.
        Ok(
            match self.word(offset)?.compare_exchange(
                compare,
                swap,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(old) | Err(old) => old,
            },
        )
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        // SeqCst for the same reason as compare_swap.
        Ok(self.word(offset)?.fetch_add(add, Ordering::SeqCst))
    }

    fn host_ptr(&self) -> Option<crate::HostPtr> {
        let ptr = core::ptr::NonNull::new(self.ptr)?;
        // SAFETY: cuMemHostAlloc gave `len.max(1)` bytes of CPU-readable and -writable page-locked
        // memory at this address, freed only by `Drop` (cuMemFreeHost), so it outlives every use
        // of the `HostPtr` that the type's contract allows.
        Some(unsafe { crate::HostPtr::new(ptr) })
    }

    /// Always: cuMemHostAlloc memory is page-locked until it is freed.
    fn is_locked(&self) -> bool {
        true
    }
}
