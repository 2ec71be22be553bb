//! Host memory for RDMA: page-aligned anonymous mappings, hugepage-backed where possible, locked.

use core::sync::atomic::{AtomicU64, Ordering};
use std::fmt;
use std::io;

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::{check_range, HostPtr, Memory, MemoryError, MemoryKind};

/// Size of an x86-64 / aarch64 huge page (2 MiB), the threshold above which [`HostMemory::new`] asks for
/// one.
const HUGE_PAGE: usize = 2 << 20;

/// What backs a [`HostMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageBacking {
    /// Explicit huge pages (`MAP_HUGETLB`, from the kernel's hugepage pool).
    HugeTlb,
    /// Normal pages with transparent huge pages requested (`madvise(MADV_HUGEPAGE)`).
    TransparentHuge,
    /// Normal pages (a buffer under 2 MiB, or the kernel refused THP advice).
    Normal,
}

/// Failure to create a [`HostMemory`].
#[derive(Debug)]
pub struct HostMemoryError {
    len: usize,
    source: io::Error,
}

impl fmt::Display for HostMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot map {} bytes of host memory: {}",
            self.len, self.source
        )
    }
}

impl std::error::Error for HostMemoryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Page-aligned anonymous host memory, zero-filled at creation.
///
/// Buffers of 2 MiB and more are first asked of the hugepage pool (`MAP_HUGETLB`), then of transparent
/// huge pages; smaller ones use normal pages. The pages are locked into RAM (`mlock(2)`) when the
/// process may (`RLIMIT_MEMLOCK`, or root); [`HostMemory::is_locked`] says whether that worked. The
/// mapping is unmapped when the value is dropped, so it must outlive every registration of it (the
/// `Arc` the stack keeps does that).
pub struct HostMemory {
    map: MmapRaw,
    len: usize,
    backing: PageBacking,
    locked: bool,
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("len", &self.len)
            .field("backing", &self.backing)
            .field("locked", &self.locked)
            .finish()
    }
}

impl HostMemory {
    /// Maps `len` bytes (a zero-length buffer maps one page and reports length 0).
    ///
    /// # Errors
    /// [`HostMemoryError`] when the kernel refuses the mapping (`ENOMEM`, address-space limits).
    pub fn new(len: usize) -> Result<HostMemory, HostMemoryError> {
        let map_len = len.max(1);
        let err = |source| HostMemoryError { len, source };
        let (map, backing) = if len >= HUGE_PAGE && len % HUGE_PAGE == 0 {
            match MmapOptions::new().len(map_len).huge(None).map_anon() {
                Ok(m) => (MmapRaw::from(m), PageBacking::HugeTlb),
                Err(_) => Self::normal(map_len).map_err(err)?,
            }
        } else if len >= HUGE_PAGE {
            Self::normal(map_len).map_err(err)?
        } else {
            let m = MmapOptions::new().len(map_len).map_anon().map_err(err)?;
            (MmapRaw::from(m), PageBacking::Normal)
        };
        let locked = map.lock().is_ok();
        Ok(HostMemory {
            map,
            len,
            backing,
            locked,
        })
    }

    fn normal(len: usize) -> io::Result<(MmapRaw, PageBacking)> {
        let m = MmapOptions::new().len(len).map_anon()?;
        let backing = if m.advise(Advice::HugePage).is_ok() {
            PageBacking::TransparentHuge
        } else {
            PageBacking::Normal
        };
        Ok((MmapRaw::from(m), backing))
    }

    /// What backs the pages.
    pub fn backing(&self) -> PageBacking {
        self.backing
    }

    /// Whether the pages are locked into RAM (`mlock(2)` succeeded).
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The start address, for links that hand it to a device (VFIO DMA mapping, libibverbs
    /// `ibv_reg_mr`). Dereferencing it is the caller's `unsafe` business.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Copies the whole buffer into a new `Vec` (a convenience for tests and checks).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // The range is the whole buffer, so this cannot fail.
        let _ = self.read(0, &mut v);
        v
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64, MemoryError> {
        check_range(offset, 8, self.len)?;
        if offset % 8 != 0 {
            return Err(MemoryError::Misaligned { offset });
        }
        // SAFETY: `offset..offset + 8` lies inside the mapping (checked above), the mapping starts on a
        // page boundary so `offset % 8 == 0` makes the pointer 8-byte aligned, and the mapping lives as
        // long as `self`, which bounds the returned reference. Every access to these bytes that races
        // with this one goes through an atomic or a plain copy of the same memory, the DMA model this
        // type documents.
        Ok(unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(offset).cast::<u64>()) })
    }
}

impl Memory for HostMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the source range lies inside the live mapping (checked above) and cannot overlap
        // `dst`, a Rust slice that the mapping does not hand out.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: the destination range lies inside the live mapping (checked above); `src` is a Rust
        // slice, which cannot alias the mapping since the mapping is never exposed as a slice.
        unsafe {
            core::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                src.len(),
            );
        }
        Ok(())
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        let word = self.word(offset)?;
        // SeqCst: an RDMA atomic is a single indivisible step with respect to every other atomic on
        // the same word, from any QP or the local CPU (IBTA vol. 1 §9.4.5, ATOMIC_HCA semantics).
        Ok(
            match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(old) | Err(old) => old,
            },
        )
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        // SeqCst for the same reason as compare_swap.
        Ok(self.word(offset)?.fetch_add(add, Ordering::SeqCst))
    }

    fn host_ptr(&self) -> Option<HostPtr> {
        let ptr = core::ptr::NonNull::new(self.map.as_mut_ptr())?;
        // SAFETY: the mapping is `len` (at least one page) bytes of readable and writable anonymous
        // memory that stays at this address until `self` is dropped (`MmapRaw` unmaps on drop only).
        Some(unsafe { HostPtr::new(ptr) })
    }

    fn is_locked(&self) -> bool {
        self.locked
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_filled_and_page_aligned() {
        let m = HostMemory::new(10_000).expect("map");
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        assert!(m.to_vec().iter().all(|&b| b == 0));
    }

    #[test]
    fn host_ptr_is_the_mapping() {
        let m = HostMemory::new(8192).expect("map");
        let p = m.host_ptr().expect("host memory is CPU-addressable");
        assert_eq!(p.as_ptr().as_ptr(), m.as_ptr());
        m.write(100, b"abc").unwrap();
        let mut back = [0u8; 3];
        m.read(100, &mut back).unwrap();
        assert_eq!(&back, b"abc");
    }

    #[test]
    fn zero_length_is_empty_and_rejects_access() {
        let m = HostMemory::new(0).expect("map");
        assert!(m.is_empty());
        assert_eq!(m.read(0, &mut []), Ok(()));
        assert_eq!(
            m.write(0, &[1]),
            Err(MemoryError::OutOfBounds {
                offset: 0,
                len: 1,
                size: 0
            })
        );
    }

    #[test]
    fn out_of_bounds_and_overflow_are_errors_and_change_nothing() {
        let m = HostMemory::new(64).expect("map");
        assert!(m.write(60, &[1; 5]).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        let mut buf = [0u8; 2];
        assert!(m.read(usize::MAX - 1, &mut buf).is_err());
        assert!(m.to_vec().iter().all(|&b| b == 0));
    }

    #[test]
    fn atomics_follow_ibta_semantics() {
        let m = HostMemory::new(64).expect("map");
        m.write(8, &5u64.to_ne_bytes()).expect("write");
        assert_eq!(
            m.compare_swap(8, 4, 9),
            Ok(5),
            "no swap when compare differs"
        );
        assert_eq!(m.compare_swap(8, 5, 9), Ok(5));
        assert_eq!(m.fetch_add(8, u64::MAX), Ok(9), "fetch-add wraps");
        let mut w = [0u8; 8];
        m.read(8, &mut w).expect("read");
        assert_eq!(u64::from_ne_bytes(w), 8);
        assert_eq!(
            m.fetch_add(12, 1),
            Err(MemoryError::Misaligned { offset: 12 })
        );
        assert!(matches!(
            m.compare_swap(64, 0, 0),
            Err(MemoryError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn large_buffers_get_huge_pages_or_fall_back() {
        let m = HostMemory::new(4 << 20).expect("map");
        assert_ne!(m.backing(), PageBacking::Normal);
        m.write((4 << 20) - 1, &[7]).expect("last byte");
    }

    #[test]
    fn concurrent_fetch_add_is_exact() {
        let m = std::sync::Arc::new(HostMemory::new(8).expect("map"));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        m.fetch_add(0, 1).expect("add");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
        assert_eq!(m.fetch_add(0, 0), Ok(40_000));
    }

    proptest! {
        #[test]
        fn write_then_read_round_trips(len in 1usize..5000, offset in 0usize..6000, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let m = HostMemory::new(len).expect("map");
            let w = m.write(offset, &data);
            prop_assert_eq!(w.is_ok(), offset + data.len() <= len);
            if w.is_ok() {
                let mut back = vec![0u8; data.len()];
                m.read(offset, &mut back).expect("read");
                prop_assert_eq!(back, data);
            }
        }
    }
}
