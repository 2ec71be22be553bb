//! Split virtqueues (virtio spec §2.7): the descriptor table, the available ring the driver
//! fills, and the used ring the device fills, in DMA memory.
//!
//! The driver hands the device a buffer by writing a chain of descriptors (address, length,
//! flags: more follow / device writes), putting the chain's head index in the next slot of the
//! available ring and then publishing the ring's new `idx`. The device returns a chain by writing
//! its head (and the bytes it wrote) into the used ring and then advancing the used `idx`. Both
//! indexes run freely and wrap at 2^16; slots are `idx % size`.
//!
//! Device and driver run concurrently on shared memory, so the order in which their stores
//! become visible matters; each fence and atomic ordering below names the race it prevents
//! (the model is rust-vmm `virtio-queue` and Linux `virtio_ring.c`). Nothing the device writes
//! is trusted: a used element naming a descriptor the device does not own, or a used index that
//! runs ahead of what was posted, is counted and skipped, never followed. The driver keeps its
//! own copy of every chain's links, so freeing a chain never reads device-writable memory; the
//! descriptor table and available ring are mapped read-only for the device.
//!
//! Notification suppression (§2.7.7, §2.7.10): the driver sets `VIRTQ_AVAIL_F_NO_INTERRUPT` when it
//! polls (it never needs an interrupt), and kicks the device only when the device has not set
//! `VIRTQ_USED_F_NO_NOTIFY` (a device that is already processing the ring needs no kick). Event
//! indexes (`VIRTIO_F_EVENT_IDX`) are not negotiated.

use core::mem::{offset_of, size_of};
use std::sync::atomic::{fence, Ordering};

use super::dma::{round_up, DmaRegion, PAGE};

/// Descriptor flag: the chain continues at `next` (§2.7.5).
pub(crate) const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer (otherwise it reads it).
pub(crate) const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Available ring flag: the driver needs no interrupt when buffers are used (§2.7.7).
pub(crate) const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag: the device needs no notification when buffers are made available (§2.7.10).
pub(crate) const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;

/// The largest queue a split virtqueue may have (§2.7: queue size up to 32768).
pub(crate) const MAX_QUEUE_SIZE: u16 = 32768;

/// The longest chain [`SplitQueue::add`] writes, in descriptors.
pub(crate) const MAX_CHAIN: usize = 16;

/// `struct virtq_desc` (§2.7.5): little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Descriptor {
    /// Guest-physical (here: I/O virtual) address of the buffer.
    pub(crate) addr: u64,
    /// Length of the buffer, bytes.
    pub(crate) len: u32,
    /// `VIRTQ_DESC_F_*`.
    pub(crate) flags: u16,
    /// The next descriptor of the chain, if `VIRTQ_DESC_F_NEXT`.
    pub(crate) next: u16,
}

impl Descriptor {
    /// The 16 bytes as the device reads them.
    fn to_le_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[offset_of!(Descriptor, addr)..][..8].copy_from_slice(&self.addr.to_le_bytes());
        b[offset_of!(Descriptor, len)..][..4].copy_from_slice(&self.len.to_le_bytes());
        b[offset_of!(Descriptor, flags)..][..2].copy_from_slice(&self.flags.to_le_bytes());
        b[offset_of!(Descriptor, next)..][..2].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// The header of `struct virtq_avail` and `struct virtq_used` (§2.7.6, §2.7.8): flags, then idx;
/// the ring follows.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingHeader {
    /// `VIRTQ_AVAIL_F_*` / `VIRTQ_USED_F_*`.
    pub(crate) flags: u16,
    /// Where the writer puts its next entry (free-running).
    pub(crate) idx: u16,
}

/// `struct virtq_used_elem` (§2.7.8).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UsedElem {
    /// Head index of the chain used (u32 for padding reasons, says the spec).
    pub(crate) id: u32,
    /// Bytes the device wrote into the chain.
    pub(crate) len: u32,
}

/// Where the parts of one queue lie in its DMA region (byte offsets), with the alignment the spec
/// asks (§2.7: descriptors 16, available ring 2, used ring 4) and page boundaries between what the
/// device only reads (descriptors, available ring) and what it writes (used ring), so that each
/// part is mapped with its own IOMMU permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Queue size (a power of two).
    pub(crate) size: u16,
    /// Descriptor table: `16 * size` bytes.
    pub(crate) desc: usize,
    /// Available ring: `6 + 2 * size` bytes (flags, idx, ring, used_event).
    pub(crate) avail: usize,
    /// Used ring: `6 + 8 * size` bytes (flags, idx, ring, avail_event), page-aligned.
    pub(crate) used: usize,
    /// Bytes of the device-read-only part (descriptors and available ring), page-rounded.
    pub(crate) read_only_len: usize,
    /// Bytes of the device-writable part (used ring), page-rounded.
    pub(crate) writable_len: usize,
}

impl Layout {
    /// The layout of a queue of `size` descriptors starting at page-aligned offset `base`.
    pub(crate) fn new(size: u16, base: usize) -> Layout {
        let n = usize::from(size);
        let desc = base;
        let avail = desc + size_of::<Descriptor>() * n;
        let avail_len = size_of::<RingHeader>() + 2 * n + 2;
        let page = PAGE as usize;
        let read_only_len = round_up((avail + avail_len - base) as u64, PAGE).unwrap_or(0) as usize;
        let used = base + read_only_len;
        let used_len = size_of::<RingHeader>() + size_of::<UsedElem>() * n + 2;
        let writable_len = round_up(used_len as u64, PAGE).unwrap_or(0) as usize;
        debug_assert_eq!(used % page, 0);
        Layout {
            size,
            desc,
            avail,
            used,
            read_only_len,
            writable_len,
        }
    }

    /// Bytes from `base` to the end of the used ring.
    pub(crate) fn len(&self) -> usize {
        self.read_only_len + self.writable_len
    }

    fn avail_ring(&self, slot: u16) -> usize {
        self.avail + size_of::<RingHeader>() + 2 * usize::from(slot)
    }

    fn used_elem(&self, slot: u16) -> usize {
        self.used + size_of::<RingHeader>() + size_of::<UsedElem>() * usize::from(slot)
    }
}

/// One segment of a chain: an I/O virtual address range, read or written by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// IOVA of the first byte.
    pub(crate) iova: u64,
    /// Length in bytes.
    pub(crate) len: u32,
    /// The device writes it (a receive buffer); otherwise it reads it.
    pub(crate) device_writes: bool,
}

/// A chain the device returned: the token it was posted with and the bytes the device wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Used {
    /// The caller's token (a buffer or slot number).
    pub(crate) token: u16,
    /// Bytes written by the device (receive: header plus frame), as the device claims.
    pub(crate) len: u32,
}

/// What the used ring contained that a correct device never writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueFaults {
    /// Used elements whose id is not a chain the device owned.
    pub(crate) bad_id: u64,
    /// Times the used index claimed more completions than chains were outstanding.
    pub(crate) bad_idx: u64,
}

/// The driver's side of one split virtqueue.
#[derive(Debug)]
pub(crate) struct SplitQueue {
    layout: Layout,
    /// Free descriptor indexes (a stack).
    free: Vec<u16>,
    /// For each descriptor that heads an outstanding chain: how many descriptors it has (0: none).
    chain_len: Vec<u16>,
    /// The driver's copy of each descriptor's `next` link.
    next: Vec<u16>,
    /// For each head: the caller's token.
    token: Vec<u16>,
    /// Chains posted and not yet returned.
    outstanding: u16,
    /// The driver's available index (free-running), possibly ahead of the published one.
    avail_idx: u16,
    /// The available index last published to the device.
    published_idx: u16,
    /// The next used index to read (free-running).
    last_used: u16,
    faults: QueueFaults,
}

impl SplitQueue {
    /// A queue with `layout`, all descriptors free. Writes the ring headers: available flags
    /// `NO_INTERRUPT` when `no_interrupt`, both indexes 0.
    pub(crate) fn new(layout: Layout, mem: &DmaRegion, no_interrupt: bool) -> SplitQueue {
        let n = layout.size;
        let q = SplitQueue {
            layout,
            free: (0..n).rev().collect(),
            chain_len: vec![0; usize::from(n)],
            next: vec![0; usize::from(n)],
            token: vec![0; usize::from(n)],
            outstanding: 0,
            avail_idx: 0,
            published_idx: 0,
            last_used: 0,
            faults: QueueFaults::default(),
        };
        let flags = if no_interrupt {
            VIRTQ_AVAIL_F_NO_INTERRUPT
        } else {
            0
        };
        // Before the queue is enabled the device reads nothing: plain ordering suffices.
        let _ = mem.store_u16(layout.avail, flags, Ordering::Relaxed);
        let _ = mem.store_u16(layout.avail + 2, 0, Ordering::Relaxed);
        let _ = mem.store_u16(layout.used, 0, Ordering::Relaxed);
        let _ = mem.store_u16(layout.used + 2, 0, Ordering::Relaxed);
        q
    }

    /// Queue size.
    pub(crate) fn size(&self) -> u16 {
        self.layout.size
    }

    /// Descriptors free.
    pub(crate) fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Chains posted and not yet returned.
    pub(crate) fn outstanding(&self) -> u16 {
        self.outstanding
    }

    /// Device faults seen so far.
    pub(crate) fn faults(&self) -> QueueFaults {
        self.faults
    }

    /// Writes a chain of `segments` and puts its head in the available ring, unpublished (see
    /// [`SplitQueue::publish`]). `None` when fewer descriptors are free than segments given, or
    /// when no segment or more than [`MAX_CHAIN`] are given.
    pub(crate) fn add(
        &mut self,
        mem: &mut DmaRegion,
        segments: &[Segment],
        token: u16,
    ) -> Option<u16> {
        let n = segments.len();
        if n == 0 || n > MAX_CHAIN || n > self.free.len() {
            return None;
        }
        let mut ids = [0u16; MAX_CHAIN];
        for slot in &mut ids[..n] {
            *slot = self.free.pop()?;
        }
        let ids_ref = &ids[..n];
        for (i, (seg, &id)) in segments.iter().zip(ids_ref).enumerate() {
            let next = ids_ref.get(i + 1).copied();
            let mut flags = 0;
            if seg.device_writes {
                flags |= VIRTQ_DESC_F_WRITE;
            }
            if next.is_some() {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            let d = Descriptor {
                addr: seg.iova,
                len: seg.len,
                flags,
                next: next.unwrap_or(0),
            };
            let at = self.layout.desc + size_of::<Descriptor>() * usize::from(id);
            // The descriptor is free, so the device does not read it until it is published.
            mem.write(at, &d.to_le_bytes())?;
            self.next[usize::from(id)] = next.unwrap_or(0);
        }
        let head = ids_ref[0];
        self.chain_len[usize::from(head)] = n as u16;
        self.token[usize::from(head)] = token;
        let slot = self.avail_idx % self.layout.size;
        mem.write(self.layout.avail_ring(slot), &head.to_le_bytes())?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.outstanding += 1;
        Some(head)
    }

    /// Chains added and not yet published.
    pub(crate) fn unpublished(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.published_idx)
    }

    /// Publishes every chain added since the last call by storing the new available index.
    /// Returns whether anything was published.
    pub(crate) fn publish(&mut self, mem: &DmaRegion) -> bool {
        if self.avail_idx == self.published_idx {
            return false;
        }
        // Release: the descriptors and available-ring entries written by `add` must be visible
        // to the device before the index that tells it they exist; otherwise the device could see
        // the new idx and read a stale ring slot or descriptor (§2.7.13.3, Linux virtio_wmb).
        let _ = mem.store_u16(self.layout.avail + 2, self.avail_idx, Ordering::Release);
        self.published_idx = self.avail_idx;
        true
    }

    /// Whether the device wants a notification now (its used flags lack `NO_NOTIFY`). Call after
    /// [`SplitQueue::publish`].
    pub(crate) fn needs_notify(&self, mem: &DmaRegion) -> bool {
        // SeqCst fence: orders the available-index store before the load of the used flags
        // (store -> load, which Release/Acquire do not order). Without it the load could be
        // answered before our index is visible: the device, finding no work, clears NO_NOTIFY and
        // sleeps, while we still see the old NO_NOTIFY and skip the kick; the buffers would then
        // sit unprocessed (§2.7.13.4: "the driver MUST perform a suitable memory barrier before
        // reading flags").
        fence(Ordering::SeqCst);
        let flags = mem
            .load_u16(self.layout.used, Ordering::Relaxed)
            .unwrap_or(0);
        flags & VIRTQ_USED_F_NO_NOTIFY == 0
    }

    /// Sets or clears `VIRTQ_AVAIL_F_NO_INTERRUPT` (a hint to the device).
    pub(crate) fn set_no_interrupt(&self, mem: &DmaRegion, no_interrupt: bool) {
        let flags = if no_interrupt {
            VIRTQ_AVAIL_F_NO_INTERRUPT
        } else {
            0
        };
        // Relaxed: a hint; a stale value only costs one interrupt more or less. A driver that
        // sleeps after clearing it re-checks the used ring after a SeqCst fence.
        let _ = mem.store_u16(self.layout.avail, flags, Ordering::Relaxed);
    }

    /// Whether the used ring has entries not yet taken.
    pub(crate) fn has_used(&self, mem: &DmaRegion) -> bool {
        mem.load_u16(self.layout.used + 2, Ordering::Relaxed)
            .is_some_and(|i| i != self.last_used)
    }

    /// Takes the next chain the device returned, if any; its descriptors become free. Used
    /// elements a correct device cannot write are counted in [`QueueFaults`] and skipped.
    pub(crate) fn pop_used(&mut self, mem: &DmaRegion) -> Option<Used> {
        loop {
            // Acquire: the device writes the used element and the buffer contents before it
            // advances used.idx (§2.7.8); this load must happen before our reads of them, or we
            // could read an element or frame bytes the device has not written yet.
            let used_idx = mem.load_u16(self.layout.used + 2, Ordering::Acquire)?;
            if used_idx == self.last_used {
                return None;
            }
            if used_idx.wrapping_sub(self.last_used) > self.outstanding {
                // The device claims more completions than chains it holds: it is broken. Do not
                // walk its ring; report nothing until the index makes sense again.
                self.faults.bad_idx += 1;
                return None;
            }
            let slot = self.last_used % self.layout.size;
            let mut elem = [0u8; 8];
            mem.read(self.layout.used_elem(slot), &mut elem)?;
            self.last_used = self.last_used.wrapping_add(1);
            let id = u32::from_le_bytes([elem[0], elem[1], elem[2], elem[3]]);
            let len = u32::from_le_bytes([elem[4], elem[5], elem[6], elem[7]]);
            let owned = usize::try_from(id)
                .ok()
                .and_then(|i| self.chain_len.get(i))
                .is_some_and(|&n| n > 0);
            if !owned {
                self.faults.bad_id += 1;
                continue;
            }
            let head = id as u16;
            self.free_chain(head);
            return Some(Used {
                token: self.token[usize::from(head)],
                len,
            });
        }
    }

    fn free_chain(&mut self, head: u16) {
        let n = std::mem::take(&mut self.chain_len[usize::from(head)]);
        let mut id = head;
        for i in 0..n {
            self.free.push(id);
            if i + 1 < n {
                id = self.next[usize::from(id)];
            }
        }
        self.outstanding -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_visible_layouts_match_the_spec() {
        assert_eq!(size_of::<Descriptor>(), 16);
        assert_eq!(offset_of!(Descriptor, addr), 0);
        assert_eq!(offset_of!(Descriptor, len), 8);
        assert_eq!(offset_of!(Descriptor, flags), 12);
        assert_eq!(offset_of!(Descriptor, next), 14);
        assert_eq!(size_of::<RingHeader>(), 4);
        assert_eq!(offset_of!(RingHeader, idx), 2);
        assert_eq!(size_of::<UsedElem>(), 8);
        assert_eq!(offset_of!(UsedElem, len), 4);
        let d = Descriptor {
            addr: 0x0102_0304_0506_0708,
            len: 0x0a0b_0c0d,
            flags: 3,
            next: 0x1234,
        };
        assert_eq!(
            d.to_le_bytes(),
            [8, 7, 6, 5, 4, 3, 2, 1, 0x0d, 0x0c, 0x0b, 0x0a, 3, 0, 0x34, 0x12]
        );
    }

    #[test]
    fn layout_aligns_and_separates_parts() {
        let l = Layout::new(256, 0);
        assert_eq!(l.desc, 0);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.read_only_len, 8192); // 4096 + 518 rounded up
        assert_eq!(l.used, 8192);
        assert_eq!(l.writable_len, 4096); // 2054 rounded up
        assert_eq!(l.len(), 12288);
        let l = Layout::new(8, 0x20_0000);
        assert_eq!(l.avail, 0x20_0000 + 128);
        assert_eq!(l.used % 4096, 0);
        assert_eq!(l.avail_ring(3), l.avail + 4 + 6);
        assert_eq!(l.used_elem(3), l.used + 4 + 24);
    }
}
