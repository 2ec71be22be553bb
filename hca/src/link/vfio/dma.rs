//! Memory the device may reach: the IOMMU container, I/O virtual addresses, and DMA regions whose
//! `Drop` unmaps them from the IOMMU before the pages are freed.
//!
//! A device behind an IOMMU sees no physical memory at all: it sees an I/O virtual address (IOVA)
//! space that the driver fills with `VFIO_IOMMU_MAP_DMA` (Type1 IOMMU: the driver chooses the
//! IOVA, the kernel pins the pages and writes the IOMMU page tables). Whatever is not mapped faults
//! in the IOMMU instead of reaching memory, and each mapping carries read / write permission, so
//! the rings a device only reads are mapped read-only.
//!
//! [`DmaRegion`] owns page-aligned host memory ([`gpu_p2p::HostMemory`]: hugepage-backed when the
//! pool has pages, `mlock`ed) and its IOMMU mappings; every access to it goes through the
//! bounds-checked methods here, the only `unsafe` of the driver outside `sys`. [`MrExtent`]
//! maps pages the driver does not own (a registered memory region's) for as long as it lives.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use gpu_p2p::{HostMemory, Memory, PageBacking};

use super::error::VfioError;
use super::os;

/// The IOMMU page size this driver maps in (4 KiB, which every Type1 IOMMU supports).
pub(crate) const PAGE: u64 = 4096;

/// Size of a huge page (2 MiB): DMA regions are rounded up to it so that they can be hugepage-backed.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// `x` rounded up to a multiple of `to` (a power of two); `None` on overflow.
pub(crate) fn round_up(x: u64, to: u64) -> Option<u64> {
    Some(x.checked_add(to - 1)? & !(to - 1))
}

/// A first-fit allocator of page-aligned IOVA ranges inside a window.
#[derive(Debug)]
pub(crate) struct IovaAllocator {
    /// Free ranges: start -> length, non-overlapping, non-adjacent (merged on free).
    free: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator handing out `[base, base + len)` (both page-aligned).
    pub(crate) fn new(base: u64, len: u64) -> IovaAllocator {
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(base, len);
        }
        IovaAllocator { free }
    }

    /// A range of `len` bytes (rounded up to pages); `None` when no free range is large enough.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = round_up(len.max(1), PAGE)?;
        let (&start, &free_len) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&start);
        if free_len > len {
            self.free.insert(start + len, free_len - len);
        }
        Some(start)
    }

    /// Returns `[iova, iova + len)` (as allocated) to the free set, merging with its neighbours.
    pub(crate) fn free(&mut self, iova: u64, len: u64) {
        let Some(len) = round_up(len.max(1), PAGE) else {
            return;
        };
        let mut start = iova;
        let mut end = iova.saturating_add(len);
        if let Some((&p, &pl)) = self.free.range(..start).next_back() {
            if p + pl == start {
                self.free.remove(&p);
                start = p;
            }
        }
        if let Some(&nl) = self.free.get(&end) {
            self.free.remove(&end);
            end += nl;
        }
        self.free.insert(start, end - start);
    }

    /// Bytes free in all.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

/// A VFIO container with a Type1 IOMMU: the I/O address space of the devices in its groups.
#[derive(Debug)]
pub(crate) struct Container {
    fd: os::Fd,
    /// The PCI address of the device this container was opened for (for error messages).
    device: String,
    iova: Mutex<IovaAllocator>,
}

impl Container {
    pub(crate) fn new(fd: os::Fd, device: String, iova_base: u64, iova_len: u64) -> Container {
        Container {
            fd,
            device,
            iova: Mutex::new(IovaAllocator::new(iova_base, iova_len)),
        }
    }

    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    fn allocator(&self) -> std::sync::MutexGuard<'_, IovaAllocator> {
        // A panic while holding this lock leaves the allocator consistent (no partial updates).
        self.iova.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of IOVA space not in use.
    pub(crate) fn iova_free_bytes(&self) -> u64 {
        self.allocator().free_bytes()
    }

    /// Maps `[vaddr, vaddr + len)` (page-aligned start) at a newly allocated IOVA.
    ///
    /// # Safety
    /// The memory must stay mapped in this process until [`Container::unmap`] of the returned
    /// range returns.
    unsafe fn map(
        &self,
        vaddr: *mut u8,
        len: u64,
        read: bool,
        write: bool,
    ) -> Result<u64, VfioError> {
        let len = round_up(len.max(1), PAGE).ok_or_else(|| self.exhausted(len))?;
        let iova = self
            .allocator()
            .alloc(len)
            .ok_or_else(|| self.exhausted(len))?;
        // SAFETY: forwarded from the caller.
        if let Err(source) = unsafe { os::dma_map(&self.fd, vaddr, iova, len, read, write) } {
            self.allocator().free(iova, len);
            return Err(VfioError::Dma {
                device: self.device.clone(),
                op: "map",
                iova,
                len,
                source,
            });
        }
        Ok(iova)
    }

    /// Unmaps `[iova, iova + len)` and frees the IOVA range. The range is freed for reuse only when
    /// the kernel confirms the unmap (a failed unmap leaves it reserved: it may still be mapped).
    fn unmap(&self, iova: u64, len: u64) -> Result<(), VfioError> {
        let len = round_up(len.max(1), PAGE).unwrap_or(len);
        match os::dma_unmap(&self.fd, iova, len) {
            Ok(_) => {
                self.allocator().free(iova, len);
                Ok(())
            }
            Err(source) => Err(VfioError::Dma {
                device: self.device.clone(),
                op: "unmap",
                iova,
                len,
                source,
            }),
        }
    }

    /// Asks the IOMMU whether anything is mapped in `[iova, iova + len)`, by unmapping the range
    /// and reading how many bytes the kernel removed (`VFIO_IOMMU_UNMAP_DMA` reports it). Returns 0
    /// when nothing was mapped. Destructive: use it only on ranges that should be unmapped already
    /// (after an [`MrExtent`] or [`DmaRegion`] dropped), never on live ones.
    pub(crate) fn probe_unmapped(&self, iova: u64, len: u64) -> Result<u64, VfioError> {
        os::dma_unmap(&self.fd, iova, round_up(len.max(1), PAGE).unwrap_or(len)).map_err(|source| {
            VfioError::Dma {
                device: self.device.clone(),
                op: "unmap",
                iova,
                len,
                source,
            }
        })
    }

    /// Takes every free IOVA range out of the allocator except `keep` bytes (tests of
    /// exhaustion).
    #[cfg(test)]
    pub(crate) fn reserve_all_but(&self, keep: u64) {
        let mut a = self.allocator();
        let first = a.free.iter().next().map(|(&s, &l)| (s, l));
        a.free.clear();
        if let Some((s, l)) = first {
            if l >= keep && keep > 0 {
                a.free.insert(s, keep);
            }
        }
    }

    fn exhausted(&self, len: u64) -> VfioError {
        VfioError::IovaExhausted {
            device: self.device.clone(),
            len,
        }
    }
}

/// One IOMMU mapping of part of a [`DmaRegion`].
#[derive(Debug, Clone, Copy)]
struct Mapping {
    iova: u64,
    len: usize,
}

/// Host memory the device reaches through the IOMMU, owned by the driver (rings, packet buffers).
///
/// Dropping it first removes every IOMMU mapping (so a late DMA faults in the IOMMU instead of
/// landing in freed memory), then frees the pages. The device must be stopped (reset) first; the
/// driver's `Drop` does that.
#[derive(Debug)]
pub(crate) struct DmaRegion {
    mem: HostMemory,
    len: usize,
    container: Arc<Container>,
    maps: Vec<Mapping>,
}

impl DmaRegion {
    /// Allocates at least `len` bytes (rounded up to 2 MiB, so that the pages can be huge), zeroed.
    pub(crate) fn new(container: Arc<Container>, len: usize) -> Result<DmaRegion, VfioError> {
        let size = round_up(len.max(1) as u64, HUGE_PAGE as u64).unwrap_or(len as u64) as usize;
        let mem = HostMemory::new(size).map_err(|source| VfioError::DmaAlloc {
            device: container.device().to_owned(),
            len: size,
            source,
        })?;
        Ok(DmaRegion {
            mem,
            len: size,
            container,
            maps: Vec::new(),
        })
    }

    /// What backs the pages (huge pages or not).
    pub(crate) fn backing(&self) -> PageBacking {
        self.mem.backing()
    }

    /// Whether the pages are locked into RAM.
    pub(crate) fn is_locked(&self) -> bool {
        self.mem.is_locked()
    }

    /// Maps bytes `[offset, offset + len)` (page-aligned offset) into the IOMMU, readable and/or
    /// writable by the device; returns their IOVA.
    pub(crate) fn map(
        &mut self,
        offset: usize,
        len: usize,
        read: bool,
        write: bool,
    ) -> Result<u64, VfioError> {
        let end = offset.checked_add(len);
        if offset as u64 % PAGE != 0 || end.is_none_or(|e| e > self.len) {
            return Err(VfioError::Config {
                what: format!(
                    "DMA mapping of {len} bytes at offset {offset} of a {}-byte region",
                    self.len
                ),
            });
        }
        // SAFETY: the range lies inside `self.mem` (checked above), which lives until `Drop`
        // unmaps every mapping of this region before the memory is freed.
        let iova = unsafe {
            self.container
                .map(self.mem.as_ptr().add(offset), len as u64, read, write)
        }?;
        self.maps.push(Mapping { iova, len });
        Ok(iova)
    }

    /// The pointer to `len` bytes at `offset`, aligned to `align`, if they lie inside.
    fn at(&self, offset: usize, len: usize, align: usize) -> Option<*mut u8> {
        if offset.checked_add(len)? > self.len || offset % align != 0 {
            return None;
        }
        // `offset + len <= self.len`: in bounds. The region starts on a page boundary.
        Some(self.mem.as_ptr().wrapping_add(offset))
    }

    /// Atomically loads the 16-bit little-endian word at `offset` (a ring index or flags the
    /// device writes). `None` when out of bounds or misaligned.
    pub(crate) fn load_u16(&self, offset: usize, order: Ordering) -> Option<u16> {
        let p = self.at(offset, 2, 2)?;
        // SAFETY: `p` is in bounds and 2-aligned (checked by `at`), inside memory that lives as
        // long as `self`. The device accesses the same word concurrently, which is why this is an
        // atomic access and not a plain read.
        let word = unsafe { AtomicU16::from_ptr(p.cast::<u16>()) };
        Some(u16::from_le(word.load(order)))
    }

    /// Atomically stores the 16-bit little-endian word at `offset`.
    pub(crate) fn store_u16(&self, offset: usize, value: u16, order: Ordering) -> Option<()> {
        let p = self.at(offset, 2, 2)?;
        // SAFETY: as in `load_u16`.
        let word = unsafe { AtomicU16::from_ptr(p.cast::<u16>()) };
        word.store(value.to_le(), order);
        Some(())
    }

    /// Copies `src` into the region at `offset`. For memory the device does not own at the time
    /// (descriptors not yet published, buffers not yet posted); publication orders it.
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Option<()> {
        let p = self.at(offset, src.len(), 1)?;
        // SAFETY: the destination is in bounds (checked by `at`) and cannot overlap `src`: no
        // slice of the region is borrowed while `&mut self` is held.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        Some(())
    }

    /// Copies bytes at `offset` into `dst`.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Option<()> {
        let p = self.at(offset, dst.len(), 1)?;
        // SAFETY: the source is in bounds (checked by `at`); `dst` is a Rust slice outside the
        // region's memory or a distinct `&mut` borrow, so they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        Some(())
    }

    /// The bytes at `[offset, offset + len)` as a slice.
    ///
    /// Only for bytes the device has handed back (a receive buffer returned in the used ring and
    /// not yet posted again): the device holds no descriptor naming them, so a device that obeys
    /// the virtio protocol cannot write them while the slice lives. The used ring is validated
    /// (the id must be a buffer the device owned) before this is called.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let p = self.at(offset, len, 1)?;
        // SAFETY: in bounds (checked by `at`) and alive as long as `&self`; not written by the CPU
        // while the shared borrow lives (writes need `&mut self`), and not by the device under the
        // protocol rule above.
        Some(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// The bytes at `[offset, offset + len)` as a mutable slice: a transmit buffer the device does
    /// not own (its descriptor is free), for the CPU to fill before posting it.
    pub(crate) fn bytes_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let p = self.at(offset, len, 1)?;
        // SAFETY: in bounds (checked by `at`); `&mut self` makes this the only borrow of the
        // region, and the device holds no descriptor naming these bytes (the caller's rule).
        Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        for m in self.maps.drain(..) {
            // A failed unmap leaves the IOVA range reserved; the pages stay pinned by the kernel
            // until the container closes, so the device still cannot reach freed memory.
            let _ = self.container.unmap(m.iova, m.len as u64);
        }
        // `self.mem` is freed after this (field drop), once no mapping points at it.
    }
}

/// Pages of memory the driver does not own (a registered memory region's), mapped into the IOMMU
/// for the device to read for as long as this value lives, so that transmit descriptors can point
/// straight at them. One `VFIO_IOMMU_MAP_DMA` each (Type1 v2 cannot unmap part of a mapping).
///
/// Holds an `Arc` of the memory, so the pages cannot be freed while mapped, and locks them in RAM
/// (mlock(2)) unless the memory's provider already does ([`Memory::is_locked`]); `Drop` unmaps,
/// then unlocks what it locked. The mapping is read-only for the device: it only ever reads
/// registered memory (transmit); received payload reaches a region by a CPU copy in the engine,
/// after the engine checked the key (IBTA C9-88 ...), so a device cannot write a region at all.
#[derive(Debug)]
pub(crate) struct MrExtent {
    memory: Arc<dyn Memory>,
    /// Host address of the first byte (page-aligned).
    va: usize,
    iova: u64,
    /// Bytes (a multiple of the page size); 0 once unmapped.
    len: u64,
    /// This extent locked the pages (and unlocks them when it goes).
    locked: bool,
    container: Arc<Container>,
}

impl MrExtent {
    /// Maps the pages `[va, va + len)` (page-aligned) of `memory` at a newly allocated IOVA,
    /// device-read-only, and locks them unless `memory` is locked already.
    ///
    /// # Errors
    /// [`VfioError::Config`] when the pages are not `memory`'s (or it has no host address);
    /// [`VfioError::IovaExhausted`]; [`VfioError::Dma`]; [`VfioError::Pin`] when mlock(2) fails
    /// (nothing stays mapped).
    pub(crate) fn new(
        container: Arc<Container>,
        memory: Arc<dyn Memory>,
        va: usize,
        len: u64,
    ) -> Result<MrExtent, VfioError> {
        let base = memory.host_ptr().map(|p| p.as_ptr().as_ptr() as usize);
        let first = base.map(|b| b & !(PAGE as usize - 1));
        let last = base
            .and_then(|b| b.checked_add(memory.len()))
            .and_then(|e| round_up(e as u64, PAGE));
        let inside = match (first, last) {
            (Some(f), Some(l)) => va >= f && (va as u64).checked_add(len).is_some_and(|e| e <= l),
            _ => false,
        };
        if !inside || va as u64 % PAGE != 0 || len % PAGE != 0 || len == 0 {
            return Err(VfioError::Config {
                what: format!(
                    "IOMMU mapping of {len} bytes at {va:#x}: not whole pages of the memory region"
                ),
            });
        }
        // SAFETY: the pages lie within the pages of `memory`'s bytes (checked above: a memory's
        // host address range stays mapped in this process while the memory lives, and every
        // byte of a page holding one of its bytes is then mapped too), which the `Arc` held here
        // keeps alive until `Drop` unmaps them.
        let iova = unsafe { container.map(va as *mut u8, len, true, false) }?;
        let locked = !memory.is_locked();
        if locked {
            if let Err(source) = os::mlock(va, len as usize) {
                let _ = container.unmap(iova, len);
                return Err(VfioError::Pin {
                    device: container.device().to_owned(),
                    len,
                    source,
                });
            }
        }
        Ok(MrExtent {
            memory,
            va,
            iova,
            len,
            locked,
            container,
        })
    }

    /// Host address of the first byte (page-aligned).
    pub(crate) fn va(&self) -> usize {
        self.va
    }

    /// The IOVA of the first byte.
    pub(crate) fn iova(&self) -> u64 {
        self.iova
    }

    /// Bytes mapped (whole pages).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Unmaps now, reporting a failure (`Drop` cannot). Returns the range unmapped.
    pub(crate) fn unmap(mut self) -> Result<(u64, u64), VfioError> {
        let (iova, len) = (self.iova, self.len);
        let r = self.release();
        r.map(|()| (iova, len))
    }

    fn release(&mut self) -> Result<(), VfioError> {
        if self.len == 0 {
            return Ok(());
        }
        let len = std::mem::take(&mut self.len);
        let r = self.container.unmap(self.iova, len);
        if self.locked {
            // Only after the unmap: the device may not reach unlocked pages. A failed unlock
            // leaves the pages locked until the memory is freed (munmap unlocks).
            let _ = os::munlock(self.va, len as usize);
        }
        let _ = &self.memory;
        r
    }
}

impl Drop for MrExtent {
    fn drop(&mut self) {
        // A failed unmap leaves the IOVA range reserved; the kernel keeps the pages pinned until
        // the container closes, so the device still cannot reach freed memory.
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_first_fit_and_merge() {
        let mut a = IovaAllocator::new(0x1000_0000, 16 * PAGE);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(PAGE + 1).unwrap();
        let z = a.alloc(PAGE).unwrap();
        assert_eq!(x, 0x1000_0000);
        assert_eq!(y, x + PAGE);
        assert_eq!(z, y + 2 * PAGE);
        assert_eq!(a.free_bytes(), 12 * PAGE);
        a.free(y, PAGE + 1);
        // the hole of two pages is reused first
        assert_eq!(a.alloc(2 * PAGE), Some(y));
        a.free(x, 1);
        a.free(y, 2 * PAGE);
        a.free(z, PAGE);
        assert_eq!(a.free_bytes(), 16 * PAGE);
        assert_eq!(a.free.len(), 1, "neighbours merge back into one range");
        assert_eq!(a.alloc(17 * PAGE), None);
        assert_eq!(a.alloc(16 * PAGE), Some(0x1000_0000));
    }

    #[test]
    fn round_up_is_overflow_safe() {
        assert_eq!(round_up(1, PAGE), Some(PAGE));
        assert_eq!(round_up(PAGE, PAGE), Some(PAGE));
        assert_eq!(round_up(u64::MAX, PAGE), None);
    }
}
