//! Which pages of registered memory the device can reach, and at which I/O virtual addresses.
//!
//! Every memory region registered over a VFIO link whose memory the CPU can address
//! ([`Memory::host_ptr`]) has its pages mapped into the IOMMU, so that a transmit descriptor can
//! point straight at its payload. Regions may share pages (two small regions in one page, the
//! same buffer registered twice): a page is mapped once, in one [`MrExtent`], and the extent is
//! counted once per registration that uses it; it is unmapped when the last such registration is
//! deregistered *and* no descriptor the device still holds points into it (transmit slots hold an
//! `Arc` of every extent their chain uses, see `net::TxQueue`). Extents are never split (a Type1
//! v2 IOMMU cannot unmap part of a mapping), so a registration over pages partly mapped already
//! maps only its gaps, and its bytes may lie in several extents whose IOVAs are not contiguous:
//! [`MrMappings::translate`] cuts a byte range into one DMA piece per extent.
//!
//! Memory without a host address (GPU device memory) is registered without a mapping; the engine
//! copies its payload into transmit slots.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpu_p2p::Memory;

use super::dma::{round_up, Container, MrExtent, PAGE};
use super::error::VfioError;
use super::net::DmaPiece;

/// One registration's view of its mapping.
#[derive(Debug)]
struct Registration {
    /// The memory the region was registered over.
    memory: Arc<dyn Memory>,
    /// Host address of the memory's first byte.
    base: usize,
    /// The region's first byte, as an offset in the memory.
    offset: usize,
    /// The region's length, bytes.
    len: usize,
    /// Keys (host address) of the extents it holds, in address order.
    extents: Vec<usize>,
}

/// An extent and the registrations that hold it.
#[derive(Debug)]
struct Held {
    extent: Arc<MrExtent>,
    registrations: u32,
}

/// The IOMMU mappings of the registered memory of one link. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct MrMappings {
    /// Extents by host address of their first byte; never overlapping.
    extents: BTreeMap<usize, Held>,
    /// Registrations by lkey.
    regs: HashMap<u32, Registration>,
    /// Extents no registration holds any more whose pages the device may still read (a
    /// descriptor points into them): unmapped as soon as it does not.
    retired: Vec<Arc<MrExtent>>,
}

impl MrMappings {
    /// Maps the pages of bytes `[offset, offset + len)` of `memory` (the region `lkey`) that are
    /// not mapped yet, and counts the region as a user of every extent its pages are in. Returns
    /// `false` when `memory` has no host address (nothing is mapped).
    ///
    /// # Errors
    /// [`VfioError::Config`] for a known `lkey` or a range outside `memory`; the errors of
    /// [`MrExtent::new`]. Nothing stays mapped or counted then.
    pub(crate) fn map(
        &mut self,
        container: &Arc<Container>,
        lkey: u32,
        memory: &Arc<dyn Memory>,
        offset: usize,
        len: usize,
    ) -> Result<bool, VfioError> {
        if self.regs.contains_key(&lkey) {
            return Err(VfioError::Config {
                what: format!("memory region {lkey:#x} is mapped already"),
            });
        }
        if gpu_p2p::check_range(offset, len, memory.len()).is_err() {
            return Err(VfioError::Config {
                what: format!(
                    "{len} bytes at offset {offset} lie outside memory of {} bytes",
                    memory.len()
                ),
            });
        }
        let Some(base) = memory.host_ptr() else {
            return Ok(false);
        };
        let base = base.as_ptr().as_ptr() as usize;
        let va = base + offset;
        let page = PAGE as usize;
        let start = va & !(page - 1);
        let end = round_up((va + len) as u64, PAGE).unwrap_or(u64::MAX) as usize;
        let mut keys = Vec::new();
        let mut created: Vec<(usize, MrExtent)> = Vec::new();
        let mut cur = start;
        while cur < end {
            if let Some((&k, h)) = self.extents.range(..=cur).next_back() {
                let e = k + h.extent.len() as usize;
                if e > cur {
                    keys.push(k);
                    cur = e;
                    continue;
                }
            }
            let gap_end = self
                .extents
                .range(cur..)
                .next()
                .map_or(end, |(&k, _)| k)
                .min(end);
            // On an error, `created` drops here: what this call mapped is unmapped again.
            let extent = MrExtent::new(
                container.clone(),
                memory.clone(),
                cur,
                (gap_end - cur) as u64,
            )?;
            keys.push(cur);
            created.push((cur, extent));
            cur = gap_end;
        }
        for (k, extent) in created {
            self.extents.insert(
                k,
                Held {
                    extent: Arc::new(extent),
                    registrations: 0,
                },
            );
        }
        for k in &keys {
            if let Some(h) = self.extents.get_mut(k) {
                h.registrations += 1;
            }
        }
        self.regs.insert(
            lkey,
            Registration {
                memory: memory.clone(),
                base,
                offset,
                len,
                extents: keys,
            },
        );
        Ok(true)
    }

    /// Whether region `lkey` is mapped.
    pub(crate) fn contains(&self, lkey: u32) -> bool {
        self.regs.contains_key(&lkey)
    }

    /// Forgets region `lkey` and returns the extents no other registration holds (`None` for an
    /// unknown lkey). The caller unmaps them once the device no longer reads them
    /// ([`MrMappings::retire`] for those it cannot wait for).
    pub(crate) fn unmap(&mut self, lkey: u32) -> Option<Vec<Arc<MrExtent>>> {
        let reg = self.regs.remove(&lkey)?;
        let mut released = Vec::new();
        for k in reg.extents {
            let Some(h) = self.extents.get_mut(&k) else {
                continue;
            };
            h.registrations -= 1;
            if h.registrations == 0 {
                if let Some(h) = self.extents.remove(&k) {
                    released.push(h.extent);
                }
            }
        }
        Some(released)
    }

    /// Keeps `extent` mapped until the device returns the descriptors that point into it.
    pub(crate) fn retire(&mut self, extent: Arc<MrExtent>) {
        self.retired.push(extent);
    }

    /// Unmaps retired extents that no descriptor points into any more. Returns how many are left.
    pub(crate) fn sweep(&mut self) -> usize {
        // An extent whose only reference is ours is unmapped by its `Drop`.
        self.retired.retain(|e| Arc::strong_count(e) > 1);
        self.retired.len()
    }

    /// The IOVA span `(iova, len)` of region `lkey`'s pages: from the lowest to the end of the
    /// highest extent it uses (one extent, the usual case, is exactly its pages).
    pub(crate) fn dma_range(&self, lkey: u32) -> Option<(u64, u64)> {
        let reg = self.regs.get(&lkey)?;
        let mut lo = u64::MAX;
        let mut hi = 0u64;
        for k in &reg.extents {
            let e = &self.extents.get(k)?.extent;
            lo = lo.min(e.iova());
            hi = hi.max(e.iova() + e.len());
        }
        (lo < hi).then(|| (lo, hi - lo))
    }

    /// Whether any mapping (held or retired) overlaps IOVAs `[iova, iova + len)`.
    pub(crate) fn overlaps(&self, iova: u64, len: u64) -> bool {
        let end = iova.saturating_add(len);
        self.extents
            .values()
            .map(|h| &h.extent)
            .chain(&self.retired)
            .any(|e| iova < e.iova() + e.len() && e.iova() < end)
    }

    /// The memory of region `lkey` and the host address of its byte `offset` (an offset in
    /// the memory) when `len` bytes from there lie in the region.
    pub(crate) fn region_bytes(
        &self,
        lkey: u32,
        offset: usize,
        len: usize,
    ) -> Option<(&Arc<dyn Memory>, usize)> {
        let reg = self.regs.get(&lkey)?;
        let end = offset.checked_add(len)?;
        (offset >= reg.offset && end <= reg.offset + reg.len)
            .then_some((&reg.memory, reg.base + offset))
    }

    /// Cuts the host bytes `[va, va + len)` into DMA pieces, one per extent they lie in (pieces
    /// that are contiguous in IOVA as well are merged), appended to `out` from index `*n`;
    /// `pin(extent)` is called for each extent used. Returns `None` (and `*n` is then
    /// meaningless) when a byte is not mapped or `out` runs out.
    pub(crate) fn translate(
        &self,
        va: usize,
        len: usize,
        out: &mut [DmaPiece],
        n: &mut usize,
        mut pin: impl FnMut(&Arc<MrExtent>),
    ) -> Option<()> {
        let end = va.checked_add(len)?;
        let mut cur = va;
        while cur < end {
            let (_, h) = self.extents.range(..=cur).next_back()?;
            let e = &h.extent;
            let e_end = e.va() + e.len() as usize;
            if e_end <= cur {
                return None;
            }
            let take = e_end.min(end) - cur;
            let iova = e.iova() + (cur - e.va()) as u64;
            let merged = n
                .checked_sub(1)
                .and_then(|i| out.get_mut(i))
                .filter(|p| p.iova + u64::from(p.len) == iova)
                .and_then(|p| {
                    let l = u64::from(p.len) + take as u64;
                    p.len = u32::try_from(l).ok()?;
                    Some(())
                });
            if merged.is_none() {
                *out.get_mut(*n)? = DmaPiece {
                    iova,
                    len: u32::try_from(take).ok()?,
                };
                *n += 1;
            }
            pin(e);
            cur += take;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::vfio::sys_fake as fake;
    use crate::link::vfio::PciAddress;
    use gpu_p2p::HostMemory;

    fn container() -> (Arc<Container>, super::super::device::VfioDevice) {
        fake::reset();
        fake::add_virtio_net("0000:00:04.0", 3, [2, 0, 0, 0, 0, 1]);
        let dev =
            super::super::device::VfioDevice::open(&PciAddress::parse("0000:00:04.0").unwrap())
                .unwrap();
        (dev.container().clone(), dev)
    }

    #[test]
    fn shared_pages_are_mapped_once_and_unmapped_with_the_last_user() {
        let (c, _dev) = container();
        let mem: Arc<dyn Memory> = Arc::new(HostMemory::new(4 * 4096).unwrap());
        let free0 = c.iova_free_bytes();
        let mut m = MrMappings::default();
        // Two regions in the first page, one over pages 0..3, one over page 3.
        assert!(m.map(&c, 1, &mem, 0, 100).unwrap());
        assert!(m.map(&c, 2, &mem, 200, 100).unwrap());
        assert_eq!(free0 - c.iova_free_bytes(), 4096, "one page, mapped once");
        assert!(m.map(&c, 3, &mem, 10, 3 * 4096 - 10).unwrap());
        assert_eq!(
            free0 - c.iova_free_bytes(),
            3 * 4096,
            "only the gap is mapped"
        );
        assert!(m.map(&c, 4, &mem, 3 * 4096, 4096).unwrap());
        // Bytes over three extents: pieces merge where the IOVAs are contiguous.
        let mut out = [DmaPiece { iova: 0, len: 0 }; 4];
        let mut n = 0;
        let mut pins = 0;
        let va = mem.host_ptr().unwrap().as_ptr().as_ptr() as usize;
        m.translate(va + 4000, 4 * 4096 - 4000, &mut out, &mut n, |_| pins += 1)
            .unwrap();
        assert_eq!(pins, 3);
        let total: u32 = out[..n].iter().map(|p| p.len).sum();
        assert_eq!(total as usize, 4 * 4096 - 4000);
        assert!(n <= 3);
        // Too few pieces: refused.
        let mut n1 = 0;
        if n > 1 {
            assert!(m
                .translate(va, 4 * 4096, &mut out[..1], &mut n1, |_| {})
                .is_none());
        }
        // Deregistering region 1 unmaps nothing (2 and 3 still use page 0).
        assert!(m.unmap(1).unwrap().is_empty());
        assert!(m.unmap(2).unwrap().is_empty());
        let released = m.unmap(3).unwrap();
        assert_eq!(released.len(), 2, "page 0 and pages 1..3");
        drop(released);
        assert_eq!(free0 - c.iova_free_bytes(), 4096);
        assert!(m.translate(va, 10, &mut out, &mut n1, |_| {}).is_none());
        drop(m.unmap(4));
        assert_eq!(c.iova_free_bytes(), free0);
        assert!(m.unmap(4).is_none());
    }

    #[test]
    fn unlocked_memory_is_locked_while_mapped_and_a_failed_map_leaves_nothing() {
        #[derive(Debug)]
        struct Plain(HostMemory);
        impl Memory for Plain {
            fn len(&self) -> usize {
                self.0.len()
            }
            fn kind(&self) -> gpu_p2p::MemoryKind {
                gpu_p2p::MemoryKind::Host
            }
            fn read(&self, o: usize, d: &mut [u8]) -> Result<(), gpu_p2p::MemoryError> {
                self.0.read(o, d)
            }
            fn write(&self, o: usize, s: &[u8]) -> Result<(), gpu_p2p::MemoryError> {
                self.0.write(o, s)
            }
            fn compare_swap(&self, o: usize, c: u64, s: u64) -> Result<u64, gpu_p2p::MemoryError> {
                self.0.compare_swap(o, c, s)
            }
            fn fetch_add(&self, o: usize, a: u64) -> Result<u64, gpu_p2p::MemoryError> {
                self.0.fetch_add(o, a)
            }
            fn host_ptr(&self) -> Option<gpu_p2p::HostPtr> {
                self.0.host_ptr()
            }
        }
        let (c, _dev) = container();
        let plain: Arc<dyn Memory> = Arc::new(Plain(HostMemory::new(2 * 4096).unwrap()));
        let mut m = MrMappings::default();
        m.map(&c, 7, &plain, 0, 2 * 4096).unwrap();
        assert_eq!(fake::with(|w| w.locked_pages.len()), 2);
        drop(m.unmap(7));
        assert_eq!(fake::with(|w| w.locked_pages.len()), 0, "unlocked at unmap");
        // HostMemory locks itself: the link neither locks nor unlocks it.
        let host: Arc<dyn Memory> = Arc::new(HostMemory::new(4096).unwrap());
        if host.is_locked() {
            m.map(&c, 8, &host, 0, 4096).unwrap();
            assert_eq!(fake::with(|w| w.locked_pages.len()), 0);
            drop(m.unmap(8));
        }
        // Out of IOVA space on the second gap: the first gap's mapping is undone.
        let free0 = c.iova_free_bytes();
        let big: Arc<dyn Memory> = Arc::new(Plain(HostMemory::new(3 * 4096).unwrap()));
        m.map(&c, 9, &big, 4096, 10).unwrap();
        c.reserve_all_but(4096);
        let e = m.map(&c, 10, &big, 0, 3 * 4096).unwrap_err();
        assert!(matches!(e, VfioError::IovaExhausted { .. }), "{e}");
        assert!(!m.contains(10));
        assert_eq!(
            fake::with(|w| w.locked_pages.len()),
            1,
            "region 9's page only"
        );
        let _ = free0;
    }
}
