//! User memory that an HCA reads straight from (a zero-copy send): a raw range of this process's
//! address space, named by address, that the program owns and the [`UserMemory`] value does not.
//!
//! A collective's input buffer is a Rust slice the caller lends for one operation. To send it
//! without a staging copy, the sender registers the range (an MR with local access only, so no
//! peer can address it) and points the WR's scatter/gather entry into it. The registration is
//! cached across operations (a training loop passes the same buffer every step), so it outlives
//! any one borrow: it names addresses, not an allocation, and the HCA may read through it only
//! while a WR that points into it is outstanding. That promise is the caller's, made once in the
//! `unsafe` constructor.

use core::ptr::NonNull;

use crate::{check_range, HostPtr, Memory, MemoryError, MemoryKind};

/// A read-only range `[base, base + len)` of this process's memory, by address. Reads copy from
/// the address; writes and atomics are refused (the HCA registers it without LOCAL_WRITE or any
/// remote access, so it never writes it).
///
/// A collective's input buffer is a Rust slice the caller lends for one operation. To send it
/// without a staging copy, the sender registers the range (an MR with local access only, so no
/// peer can address it) and points the WR's scatter/gather entry into it. The registration is
/// cached across operations, so it outlives any one borrow: it names addresses, not an
/// allocation, and the HCA may read through it only while a WR that points into it is
/// outstanding ([`UserMemory::new`]'s contract).
#[derive(Debug)]
pub struct UserMemory {
    base: usize,
    len: usize,
}

impl UserMemory {
    /// Names `len` bytes at address `base`.
    ///
    /// # Safety
    /// Every [`Memory::read`] of the value, and every use of the address that
    /// [`Memory::host_ptr`] returns, must happen while the bytes read are allocated, readable
    /// memory of this process that nothing writes meanwhile, and whose provenance was exposed
    /// (`expose_provenance`) by the owner: the value turns the address back into a pointer with
    /// that provenance. An HCA keeps this when it reads the range only for a WR whose owner keeps
    /// the buffer alive and unwritten until the WR has completed (the collectives' `post_from`
    /// contract). That is narrower than [`HostPtr`]'s "while the `Memory` lives", which a cached
    /// registration of user memory cannot promise: nothing may read the address outside such a
    /// WR.
    pub unsafe fn new(base: usize, len: usize) -> UserMemory {
        UserMemory { base, len }
    }
}

impl Memory for UserMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the constructor's contract: the HCA reads a registered user range only while a
        // WR whose SGE points into it is outstanding, and the owner keeps the range alive and
        // unwritten until that WR completes (the registration is local-only: no peer can make
        // the HCA read it). The range lies inside the registered one (checked above).
        unsafe {
            core::ptr::copy_nonoverlapping(
                core::ptr::with_exposed_provenance::<u8>(self.base + offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        // Registered without LOCAL_WRITE or any remote access, so the HCA never writes it;
        // refuse anyway (user input buffers are borrowed immutably).
        Err(MemoryError::OutOfBounds {
            offset,
            len: src.len(),
            size: 0,
        })
    }

    fn compare_swap(&self, offset: usize, _: u64, _: u64) -> Result<u64, MemoryError> {
        Err(MemoryError::OutOfBounds {
            offset,
            len: 8,
            size: 0,
        })
    }

    fn fetch_add(&self, offset: usize, _: u64) -> Result<u64, MemoryError> {
        Err(MemoryError::OutOfBounds {
            offset,
            len: 8,
            size: 0,
        })
    }

    /// The range's address, so the software HCA sends it in place (zero-copy transmit: the
    /// kernel gathers it with an iovec) instead of copying it into a packet buffer, and a
    /// libibverbs device registers it by address (ibv_reg_mr(3) pins the pages; its HCA reads
    /// them by DMA, registered without LOCAL_WRITE or remote access).
    fn host_ptr(&self) -> Option<HostPtr> {
        let ptr = NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(self.base))?;
        // SAFETY: as for `read`: the HCA dereferences the address only while it builds and
        // sends packets of a WR whose owner keeps the range alive and unwritten until the WR
        // completes (the constructor's contract). Those WRs are RC, which complete only when
        // acknowledged, after the link has sent every packet built for them (it sends what it
        // built before it builds more), so no packet that points here outlives its WR. That is
        // narrower than `HostPtr`'s "while the `Memory` lives", which a cached registration of
        // user memory cannot promise; nothing reads the address outside a WR.
        Some(unsafe { HostPtr::new(ptr) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_range_and_refuses_writes() {
        let buf = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let base = buf.as_ptr().expose_provenance();
        // SAFETY: `buf` lives, unwritten, until the end of the test, and its provenance is
        // exposed above.
        let m = unsafe { UserMemory::new(base + 2, 4) };
        let mut out = [0u8; 3];
        m.read(1, &mut out).unwrap();
        assert_eq!(out, [4, 5, 6]);
        assert!(m.read(2, &mut out).is_err());
        assert!(m.write(0, &[0]).is_err());
        assert!(m.compare_swap(0, 0, 0).is_err());
        assert!(m.fetch_add(0, 0).is_err());
        assert_eq!(m.kind(), MemoryKind::Host);
        assert_eq!(
            m.host_ptr().map(|p| p.as_ptr().as_ptr() as usize),
            Some(base + 2)
        );
    }
}
