//! MR memory inside the UMEM: the arena after the link's packet frames, handed out in whole
//! UMEM chunks ([`FRAME_SIZE`](super::FRAME_SIZE) bytes) as [`UmemMemory`], a
//! [`gpu_p2p::Memory`] that an MR can be registered on. A TX descriptor may point at any chunk
//! of the UMEM (Linux Documentation/networking/af_xdp.rst, aligned chunk mode: a descriptor
//! stays within one chunk), so a payload in such memory leaves without a CPU copy.
//!
//! The only other `unsafe` code of the link besides `sys`: raw reads, writes and atomics on
//! the shared mapping.

#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gpu_p2p::{check_range, HostPtr, Memory, MemoryError, MemoryKind};

use super::sys::Umem;

/// First-fit allocator of chunk runs in the arena `[first, first + count)` (chunk indexes).
#[derive(Debug)]
pub(crate) struct ChunkAllocator {
    /// Free runs (first chunk, chunks), sorted by first chunk, never adjacent.
    free: Vec<(usize, usize)>,
    chunk: usize,
}

impl ChunkAllocator {
    pub(crate) fn new(first: usize, count: usize, chunk: usize) -> ChunkAllocator {
        let free = if count > 0 {
            vec![(first, count)]
        } else {
            Vec::new()
        };
        ChunkAllocator { free, chunk }
    }

    /// Takes `chunks` contiguous chunks; the first chunk's index, or `None` when no run is long
    /// enough.
    fn take(&mut self, chunks: usize) -> Option<usize> {
        let i = self.free.iter().position(|&(_, n)| n >= chunks)?;
        let (first, n) = self.free[i];
        if n == chunks {
            self.free.remove(i);
        } else {
            self.free[i] = (first + chunks, n - chunks);
        }
        Some(first)
    }

    /// Gives back a run [`ChunkAllocator::take`] returned, merging it with its neighbours.
    fn give(&mut self, first: usize, chunks: usize) {
        let i = self.free.partition_point(|&(f, _)| f < first);
        self.free.insert(i, (first, chunks));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Free bytes in all runs.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.iter().map(|&(_, n)| n * self.chunk).sum()
    }

    /// The longest run, bytes.
    pub(crate) fn largest_bytes(&self) -> usize {
        self.free.iter().map(|&(_, n)| n).max().unwrap_or(0) * self.chunk
    }
}

/// `len` bytes of MR memory in UMEM chunks (a run of whole chunks, zero-filled when handed out),
/// given back to the arena on drop. Keeps the UMEM mapping alive, so an MR (and a TX descriptor
/// the kernel still reads) never points at unmapped memory, even after the link closed.
pub struct UmemMemory {
    umem: Arc<Umem>,
    arena: Arc<Mutex<ChunkAllocator>>,
    /// UMEM address (offset) of byte 0, a chunk boundary.
    addr: usize,
    len: usize,
    chunks: usize,
}

impl fmt::Debug for UmemMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UmemMemory")
            .field("umem_addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

impl UmemMemory {
    /// `len` bytes (rounded up to whole chunks) from `arena`, zero-filled; `None` when no run of
    /// free chunks is long enough, or `len` is 0.
    pub(crate) fn alloc(
        umem: &Arc<Umem>,
        arena: &Arc<Mutex<ChunkAllocator>>,
        len: usize,
    ) -> Option<UmemMemory> {
        if len == 0 {
            return None;
        }
        let mut a = arena.lock().unwrap_or_else(PoisonError::into_inner);
        let chunk = a.chunk;
        let chunks = len.div_ceil(chunk);
        let first = a.take(chunks)?;
        drop(a);
        let m = UmemMemory {
            umem: Arc::clone(umem),
            arena: Arc::clone(arena),
            addr: first * chunk,
            len,
            chunks,
        };
        // SAFETY: the run is inside the UMEM (the arena covers only UMEM chunks) and was free:
        // nothing else writes it (the kernel writes only frames on the fill ring, never arena
        // chunks).
        unsafe { std::ptr::write_bytes(m.ptr(0), 0, chunks * chunk) };
        Some(m)
    }

    /// The UMEM address (offset from the UMEM's start) of byte 0.
    pub fn umem_addr(&self) -> u64 {
        self.addr as u64
    }

    fn ptr(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers pass offset <= len; addr + len is inside the mapping.
        unsafe { self.umem.base().as_ptr().add(self.addr + offset) }
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64, MemoryError> {
        check_range(offset, 8, self.len)?;
        if offset % 8 != 0 {
            return Err(MemoryError::Misaligned { offset });
        }
        // SAFETY: inside the mapping (checked), 8-byte aligned (chunks are page aligned), alive
        // as long as `self`; concurrent accesses are atomics or plain copies, the DMA model of
        // `gpu_p2p::HostPtr`.
        Ok(unsafe { AtomicU64::from_ptr(self.ptr(offset).cast::<u64>()) })
    }
}

impl Drop for UmemMemory {
    fn drop(&mut self) {
        self.arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .give(self.addr / self.umem.chunk(), self.chunks);
    }
}

impl Memory for UmemMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the range is inside this memory (checked); `dst` is a Rust slice, never part
        // of the mapping (it is not handed out as a slice).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: as for read.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(offset), src.len()) };
        Ok(())
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        // SeqCst: an RDMA atomic is indivisible with respect to every other atomic on the word
        // (IBTA vol. 1 §9.4.5).
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
        Ok(self.word(offset)?.fetch_add(add, Ordering::SeqCst))
    }

    fn host_ptr(&self) -> Option<HostPtr> {
        let p = NonNull::new(self.ptr(0))?;
        // SAFETY: `len` bytes of the UMEM mapping, readable and writable, at this address for as
        // long as `self` lives (it holds the mapping).
        Some(unsafe { HostPtr::new(p) })
    }

    /// The UMEM is pinned by the kernel (XDP_UMEM_REG) while the socket lives, not after.
    fn is_locked(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_taken_first_fit_and_merged_back() {
        let mut a = ChunkAllocator::new(10, 8, 4096);
        assert_eq!(a.take(3), Some(10));
        assert_eq!(a.take(3), Some(13));
        assert_eq!(a.take(3), None);
        assert_eq!(a.free_bytes(), 2 * 4096);
        a.give(10, 3);
        assert_eq!(a.largest_bytes(), 3 * 4096);
        a.give(13, 3);
        assert_eq!(a.free, vec![(10, 8)]);
        assert_eq!(a.take(8), Some(10));
        assert_eq!(a.take(1), None);
        let mut empty = ChunkAllocator::new(0, 0, 4096);
        assert_eq!(empty.take(1), None);
    }
}
