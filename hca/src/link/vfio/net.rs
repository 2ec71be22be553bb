//! The virtio-net device (virtio spec §5.1) over VFIO: one receive and one transmit queue,
//! driven by polling.
//!
//! Every frame on either queue is preceded by a 12-byte `virtio_net_hdr` (§5.1.6; 12 bytes with
//! VIRTIO_F_VERSION_1). No offload is negotiated, so the driver writes it as zeros on transmit
//! and ignores it on receive. Receive buffers are one descriptor each, big enough for the header
//! and the largest frame the MTU allows (no VIRTIO_NET_F_MRG_RXBUF); they are refilled in
//! batches. A transmit slot holds the header and one frame; a frame can also be sent as a chain
//! whose middle descriptors point at other mapped memory (registered memory regions), so that its
//! payload is never copied.

use core::mem::size_of;
use std::time::Duration;

use gpu_p2p::PageBacking;

use super::device::{PciAddress, VfioDevice};
use super::dma::{round_up, DmaRegion, PAGE};
use super::error::VfioError;
use super::os;
use super::pci::{self, command};
use super::virtio::{feature, Transport, MSI_NO_VECTOR, RESET_TIMEOUT};
use super::virtqueue::{Layout, QueueFaults, Segment, SplitQueue, MAX_CHAIN, MAX_QUEUE_SIZE};
use vfio_bindings::bindings::vfio::{VFIO_IRQ_INFO_EVENTFD, VFIO_PCI_MSIX_IRQ_INDEX};

/// `struct virtio_net_hdr` as VERSION_1 devices use it (§5.1.6), little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VirtioNetHdr {
    /// `VIRTIO_NET_HDR_F_*` (none used).
    pub(crate) flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*` (NONE).
    pub(crate) gso_type: u8,
    /// Length of the headers to copy for GSO.
    pub(crate) hdr_len: u16,
    /// GSO segment size.
    pub(crate) gso_size: u16,
    /// Checksum offload: where checksumming starts.
    pub(crate) csum_start: u16,
    /// Checksum offload: where the checksum goes, from `csum_start`.
    pub(crate) csum_offset: u16,
    /// Buffers used for this frame (receive; 0 on transmit).
    pub(crate) num_buffers: u16,
}

/// Bytes of the virtio-net header.
pub(crate) const NET_HDR_LEN: usize = size_of::<VirtioNetHdr>();

/// Virtqueue index of receiveq1 and transmitq1 (§5.1.2).
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;

/// Offsets in `struct virtio_net_config` (§5.1.4).
const CONFIG_MAC: usize = 0;
const CONFIG_MTU: usize = 10;

/// Ethernet header with one VLAN tag, the most a received frame may carry before its IP packet.
const MAX_L2_HEADER: usize = 18;

/// Bytes kept free before every transmitted frame's IP packet: the virtio-net header, an Ethernet
/// header, an IPv6 header and a UDP header. The engine builds the UDP payload right after them.
pub(crate) const TX_HEADROOM: usize = NET_HDR_LEN + 14 + 40 + 8;

/// Bytes at the end of every transmit slot for the trailer of a gathered frame (pad and ICRC,
/// at most 3 + 4), after [`NetConfig::tx_payload_room`].
pub(crate) const TX_TRAILER_ROOM: usize = 8;

/// Queue and buffer sizes of a [`VirtioNet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetConfig {
    /// Receive queue size wanted (a power of two; the device's maximum if smaller).
    pub(crate) rx_queue_size: u16,
    /// Transmit queue size wanted (a power of two; the device's maximum if smaller).
    pub(crate) tx_queue_size: u16,
    /// Receive buffers are given back to the device once this many are consumed.
    pub(crate) rx_refill_batch: usize,
    /// Bytes of each transmit slot after [`TX_HEADROOM`] (at least the engine's largest UDP
    /// payload).
    pub(crate) tx_payload_room: usize,
    /// Bound on the device reset.
    pub(crate) reset_timeout: Duration,
    /// Receive interrupts through MSI-X vector 0 and an eventfd ([`VirtioNet::wait_rx`]);
    /// otherwise no interrupt at all (busy-poll).
    pub(crate) interrupts: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            rx_queue_size: 256,
            tx_queue_size: 256,
            rx_refill_batch: 32,
            tx_payload_room: crate::engine::MAX_UDP_PAYLOAD,
            reset_timeout: RESET_TIMEOUT,
            interrupts: false,
        }
    }
}

/// Counters of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes of received frames (without the virtio-net header).
    pub rx_bytes: u64,
    /// Receive buffers returned with a length shorter than the header or longer than the buffer.
    pub rx_bad_len: u64,
    /// Receive buffers given back to the device.
    pub rx_refilled: u64,
    /// Frames handed to the device for transmission.
    pub tx_frames: u64,
    /// Bytes of transmitted frames.
    pub tx_bytes: u64,
    /// Frames sent as descriptor chains pointing at registered memory (no copy).
    pub tx_zero_copy: u64,
    /// Times a frame found no free transmit slot.
    pub tx_ring_full: u64,
    /// Notifications written to the device.
    pub notifies: u64,
    /// Notifications skipped because the device had set VIRTQ_USED_F_NO_NOTIFY.
    pub notifies_suppressed: u64,
    /// Used elements naming a descriptor the device did not own (both queues).
    pub device_bad_id: u64,
    /// Used indexes running ahead of what was posted (both queues).
    pub device_bad_idx: u64,
    /// Receive interrupts (MSI-X) that woke a wait.
    pub interrupts: u64,
}

/// The receive queue: ring and buffers in one DMA region.
#[derive(Debug)]
pub(crate) struct RxQueue {
    q: SplitQueue,
    mem: DmaRegion,
    notify_at: usize,
    buf_base: usize,
    buf_size: usize,
    buf_iova: u64,
    refill: Vec<u16>,
    batch: usize,
}

/// The transmit queue: ring and slots in one DMA region.
#[derive(Debug)]
pub(crate) struct TxQueue {
    q: SplitQueue,
    mem: DmaRegion,
    notify_at: usize,
    slot_base: usize,
    slot_size: usize,
    slot_iova: u64,
    free_slots: Vec<u16>,
    /// Per slot: what its posted chain points into, kept alive (and mapped) until the device
    /// returns the chain in the used ring.
    pins: Vec<SlotPins>,
    frames_posted: u64,
    bytes_posted: u64,
    zero_copy: u64,
    ring_full: u64,
}

/// What a posted gather chain points into: the engine's payload segments (each holds an `Arc` of
/// its memory) and the IOMMU extents of their pages. Preallocated per slot; cleared (not freed)
/// when the device returns the chain.
#[derive(Debug, Default)]
pub(crate) struct SlotPins {
    segments: Vec<crate::engine::TxSegment>,
    extents: Vec<std::sync::Arc<super::dma::MrExtent>>,
}

impl SlotPins {
    fn with_capacity() -> SlotPins {
        SlotPins {
            segments: Vec::with_capacity(crate::engine::MAX_TX_SEGMENTS),
            extents: Vec::with_capacity(MAX_CHAIN),
        }
    }
}

/// A piece of a frame that lies in other IOMMU-mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DmaPiece {
    /// IOVA of the first byte.
    pub(crate) iova: u64,
    /// Length in bytes.
    pub(crate) len: u32,
}

impl TxQueue {
    /// Takes back the slots of frames the device has sent.
    pub(crate) fn reclaim(&mut self) {
        while let Some(u) = self.q.pop_used(&self.mem) {
            // The device is done with the chain: its memory and mappings may go now.
            if let Some(p) = self.pins.get_mut(usize::from(u.token)) {
                p.segments.clear();
                p.extents.clear();
            }
            self.free_slots.push(u.token);
        }
    }

    /// Bytes of a slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Descriptors free (a chain of `n` pieces needs `n`).
    pub(crate) fn free_descriptors(&self) -> usize {
        self.q.free_descriptors()
    }

    /// Keeps `segments` and the extents in `extents` (drained) alive until the device returns
    /// the chain posted from `slot`. Call right after a successful [`TxQueue::post_chain`] and
    /// before the next publication. Does not allocate (the slot's vectors hold a whole chain).
    pub(crate) fn pin<'a>(
        &mut self,
        slot: u16,
        segments: impl Iterator<Item = &'a crate::engine::TxSegment>,
        extents: &mut Vec<std::sync::Arc<super::dma::MrExtent>>,
    ) {
        if let Some(p) = self.pins.get_mut(usize::from(slot)) {
            p.segments.extend(segments.cloned());
            p.extents.append(extents);
        } else {
            extents.clear();
        }
    }

    /// Takes a free slot (reclaiming sent ones first if none is free) and returns it with its
    /// bytes; the caller fills it and calls [`TxQueue::post`] or [`TxQueue::release`].
    pub(crate) fn take_slot(&mut self) -> Option<(u16, &mut [u8])> {
        if self.free_slots.is_empty() || self.q.free_descriptors() == 0 {
            self.reclaim();
        }
        if self.q.free_descriptors() == 0 {
            self.ring_full += 1;
            return None;
        }
        let Some(slot) = self.free_slots.pop() else {
            self.ring_full += 1;
            return None;
        };
        let at = self.slot_base + usize::from(slot) * self.slot_size;
        match self.mem.bytes_mut(at, self.slot_size) {
            Some(bytes) => Some((slot, bytes)),
            None => {
                self.free_slots.push(slot);
                None
            }
        }
    }

    /// Gives back a slot taken and not posted.
    pub(crate) fn release(&mut self, slot: u16) {
        self.free_slots.push(slot);
    }

    /// Posts the frame at bytes `[start, start + len)` of `slot` (unpublished until
    /// [`VirtioNet::flush`]). The 12 bytes before `start` become its virtio-net header.
    pub(crate) fn post(&mut self, slot: u16, start: usize, len: usize) -> bool {
        self.post_chain(slot, start, len, &[], None)
    }

    /// Posts a frame made of the bytes `[start, start + len)` of `slot`, then `pieces`, then the
    /// bytes `trailer` (a range of the same slot), as one descriptor chain.
    pub(crate) fn post_chain(
        &mut self,
        slot: u16,
        start: usize,
        len: usize,
        pieces: &[DmaPiece],
        trailer: Option<(usize, usize)>,
    ) -> bool {
        let fits = |s: usize, l: usize| s.checked_add(l).is_some_and(|e| e <= self.slot_size);
        if start < NET_HDR_LEN
            || !fits(start, len)
            || trailer.is_some_and(|(s, l)| !fits(s, l))
            || 1 + pieces.len() + usize::from(trailer.is_some()) > MAX_CHAIN
        {
            self.free_slots.push(slot);
            return false;
        }
        let base = self.slot_base + usize::from(slot) * self.slot_size;
        let hdr_at = base + start - NET_HDR_LEN;
        if self.mem.write(hdr_at, &[0u8; NET_HDR_LEN]).is_none() {
            self.free_slots.push(slot);
            return false;
        }
        let slot_iova = self.slot_iova + (usize::from(slot) * self.slot_size) as u64;
        let mut segs = [Segment {
            iova: 0,
            len: 0,
            device_writes: false,
        }; MAX_CHAIN];
        let mut n = 0;
        segs[n] = Segment {
            iova: slot_iova + (start - NET_HDR_LEN) as u64,
            len: (len + NET_HDR_LEN) as u32,
            device_writes: false,
        };
        n += 1;
        let mut total = len;
        for p in pieces {
            segs[n] = Segment {
                iova: p.iova,
                len: p.len,
                device_writes: false,
            };
            n += 1;
            total += p.len as usize;
        }
        if let Some((s, l)) = trailer {
            segs[n] = Segment {
                iova: slot_iova + s as u64,
                len: l as u32,
                device_writes: false,
            };
            n += 1;
            total += l;
        }
        if self.q.add(&mut self.mem, &segs[..n], slot).is_none() {
            self.free_slots.push(slot);
            self.ring_full += 1;
            return false;
        }
        self.frames_posted += 1;
        self.bytes_posted += total as u64;
        if !pieces.is_empty() {
            self.zero_copy += 1;
        }
        true
    }
}

impl RxQueue {
    fn buffer_segment(&self, b: u16) -> Segment {
        Segment {
            iova: self.buf_iova + (usize::from(b) * self.buf_size) as u64,
            len: self.buf_size as u32,
            device_writes: true,
        }
    }

    /// Gives the consumed buffers back to the device when a batch is full or the device runs
    /// low; returns whether the device must be notified.
    fn refill(&mut self, force: bool) -> (u64, bool) {
        let low = usize::from(self.q.outstanding()) <= self.batch;
        if self.refill.is_empty() || !(force || low || self.refill.len() >= self.batch) {
            return (0, false);
        }
        let mut n = 0;
        while let Some(b) = self.refill.pop() {
            let seg = self.buffer_segment(b);
            if self.q.add(&mut self.mem, &[seg], b).is_none() {
                self.refill.push(b);
                break;
            }
            n += 1;
        }
        let published = self.q.publish(&self.mem);
        (n, published && self.q.needs_notify(&self.mem))
    }
}

/// A modern virtio-net device driven through VFIO.
#[derive(Debug)]
pub(crate) struct VirtioNet {
    // Field order is drop order: the transport resets the device (stopping its DMA) before the
    // queues unmap their memory, and the VFIO device (fds) goes last.
    transport: Transport,
    rx: RxQueue,
    tx: TxQueue,
    dev: VfioDevice,
    mac: [u8; 6],
    mtu: u16,
    features: u64,
    notifies: u64,
    notifies_suppressed: u64,
    rx_frames: u64,
    rx_bytes: u64,
    rx_bad_len: u64,
    rx_refilled: u64,
    /// The eventfd MSI-X vector 0 (the receive queue) signals, when interrupts are on.
    /// The MSI-X eventfd, shared with [`VirtioNet::irq_handle`] holders (a progress thread's
    /// poller).
    irq: Option<std::sync::Arc<os::Fd>>,
    interrupts_taken: u64,
}

impl VirtioNet {
    /// Opens the device at `addr` and brings it up (virtio spec §3.1.1): VFIO open, PCI checks,
    /// capabilities, BAR mappings, bus mastering, reset and feature negotiation, both queues in
    /// DMA memory, receive buffers posted, DRIVER_OK.
    pub(crate) fn open(addr: &PciAddress, config: &NetConfig) -> Result<VirtioNet, VfioError> {
        let dev = VfioDevice::open(addr)?;
        let name = dev.name().to_owned();
        let cfg = dev.read_config()?;
        let h = pci::header(&cfg);
        if h.vendor_id != 0x1af4 || !(h.device_id == 0x1041 || h.device_id == 0x1000) {
            return Err(VfioError::NotVirtioNet {
                device: name,
                vendor: h.vendor_id,
                device_id: h.device_id,
            });
        }
        let caps = pci::virtio_caps(&cfg).map_err(|what| VfioError::Capability {
            device: name.clone(),
            what,
        })?;
        let mut bars: Vec<Option<_>> = (0..6).map(|_| None).collect();
        let mut windows = vec![caps.common, caps.notify, caps.isr];
        windows.extend(caps.device);
        for w in windows {
            let slot = &mut bars[usize::from(w.bar)];
            if slot.is_none() {
                *slot = Some(dev.map_bar(w.bar)?);
            }
        }
        // Memory decoding for the BARs, bus mastering for DMA; INTx off: this driver polls.
        let cmd = dev.config_read16(pci::offset::COMMAND)?;
        dev.config_write16(
            pci::offset::COMMAND,
            cmd | command::MEMORY | command::BUS_MASTER | command::INTX_DISABLE,
        )?;
        let transport = Transport::new(&name, bars, caps)?;
        let features = transport.negotiate(config.reset_timeout)?;
        Self::bring_up(dev, transport, features, config)
    }

    fn bring_up(
        dev: VfioDevice,
        transport: Transport,
        features: u64,
        config: &NetConfig,
    ) -> Result<VirtioNet, VfioError> {
        let name = dev.name().to_owned();
        let fail = |e: VfioError| {
            transport.fail();
            e
        };
        if transport.num_queues().map_err(fail)? < 2 {
            return Err(fail(VfioError::Queue {
                device: name,
                queue: TX_QUEUE,
                what: "the device has fewer than 2 queues".into(),
            }));
        }
        let mut mac = [0u8; 6];
        if features & feature::NET_F_MAC != 0 {
            transport
                .device_config(CONFIG_MAC, &mut mac)
                .map_err(fail)?;
        } else {
            // No MAC from the device: a locally administered one from the PCI address.
            mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
        }
        let mtu = if features & feature::NET_F_MTU != 0 {
            transport.device_config16(CONFIG_MTU).map_err(fail)?
        } else {
            1500
        };
        if mtu < 576 {
            return Err(fail(VfioError::Capability {
                device: name,
                what: format!("the device reports an MTU of {mtu} bytes (576 at least needed)"),
            }));
        }
        let rx_buf = round_up((NET_HDR_LEN + MAX_L2_HEADER + usize::from(mtu)) as u64, 64)
            .unwrap_or(0) as usize;
        let irq = if config.interrupts {
            Some(std::sync::Arc::new(Self::enable_msix(&dev).map_err(fail)?))
        } else {
            None
        };
        let rx_vector = if irq.is_some() { 0 } else { MSI_NO_VECTOR };
        let rx = Self::rx_queue(&dev, &transport, config, rx_buf, rx_vector).map_err(fail)?;
        let tx = Self::tx_queue(&dev, &transport, config).map_err(fail)?;
        let mut nic = VirtioNet {
            transport,
            rx,
            tx,
            dev,
            mac,
            mtu,
            features,
            notifies: 0,
            notifies_suppressed: 0,
            rx_frames: 0,
            rx_bytes: 0,
            rx_bad_len: 0,
            rx_refilled: 0,
            irq,
            interrupts_taken: 0,
        };
        nic.transport.driver_ok()?;
        // The device may only be notified after DRIVER_OK (§3.1.1).
        nic.notify_rx()?;
        Ok(nic)
    }

    /// Enables MSI-X through VFIO with vector 0 signalling a new eventfd.
    fn enable_msix(dev: &VfioDevice) -> Result<os::Fd, VfioError> {
        let info = dev.irq_info(VFIO_PCI_MSIX_IRQ_INDEX)?;
        if info.count == 0 || info.flags & VFIO_IRQ_INFO_EVENTFD == 0 {
            return Err(VfioError::Capability {
                device: dev.name().to_owned(),
                what: format!(
                    "no MSI-X vector to signal an eventfd (count {}, flags {:#x})",
                    info.count, info.flags
                ),
            });
        }
        let fd = os::eventfd().map_err(|source| VfioError::Ioctl {
            device: dev.name().to_owned(),
            op: "eventfd",
            source,
        })?;
        dev.set_irq_eventfds(VFIO_PCI_MSIX_IRQ_INDEX, &[&fd])?;
        Ok(fd)
    }

    fn queue_size(
        transport: &Transport,
        name: &str,
        index: u16,
        wanted: u16,
    ) -> Result<u16, VfioError> {
        let max = transport.queue_max_size(index)?;
        if max == 0 {
            return Err(VfioError::Queue {
                device: name.to_owned(),
                queue: index,
                what: "the device does not implement it (queue_size 0)".into(),
            });
        }
        // Split queues have power-of-two sizes (§2.7); the driver may pick a smaller one.
        let want = wanted.clamp(2, MAX_QUEUE_SIZE).min(max);
        let size = 1u16 << (15 - want.leading_zeros().min(15));
        if size < 2 {
            return Err(VfioError::Queue {
                device: name.to_owned(),
                queue: index,
                what: format!("queue size {size} is too small"),
            });
        }
        Ok(size)
    }

    fn rx_queue(
        dev: &VfioDevice,
        transport: &Transport,
        config: &NetConfig,
        buf_size: usize,
        vector: u16,
    ) -> Result<RxQueue, VfioError> {
        let size = Self::queue_size(transport, dev.name(), RX_QUEUE, config.rx_queue_size)?;
        let layout = Layout::new(size, 0);
        let buf_base = layout.len();
        let total = buf_base + usize::from(size) * buf_size;
        let mut mem = DmaRegion::new(dev.container().clone(), total)?;
        let ring_ro = mem.map(0, layout.read_only_len, true, false)?;
        let ring_rw = mem.map(layout.used, layout.writable_len, true, true)?;
        let bufs_len = round_up((usize::from(size) * buf_size) as u64, PAGE).unwrap_or(0) as usize;
        let buf_iova = mem.map(buf_base, bufs_len, true, true)?;
        let mut q = SplitQueue::new(layout, &mem, true);
        let areas = (
            ring_ro,
            ring_ro + (layout.avail - layout.desc) as u64,
            ring_rw,
        );
        let notify_at = transport.setup_queue(RX_QUEUE, size, vector, areas)?;
        for b in 0..size {
            let seg = Segment {
                iova: buf_iova + (usize::from(b) * buf_size) as u64,
                len: buf_size as u32,
                device_writes: true,
            };
            q.add(&mut mem, &[seg], b);
        }
        q.publish(&mem);
        Ok(RxQueue {
            q,
            mem,
            notify_at,
            buf_base,
            buf_size,
            buf_iova,
            refill: Vec::with_capacity(usize::from(size)),
            batch: config.rx_refill_batch.clamp(1, usize::from(size)),
        })
    }

    fn tx_queue(
        dev: &VfioDevice,
        transport: &Transport,
        config: &NetConfig,
    ) -> Result<TxQueue, VfioError> {
        let size = Self::queue_size(transport, dev.name(), TX_QUEUE, config.tx_queue_size)?;
        let layout = Layout::new(size, 0);
        let slot_base = layout.len();
        let slot_size = round_up(
            (TX_HEADROOM + config.tx_payload_room + TX_TRAILER_ROOM) as u64,
            64,
        )
        .unwrap_or(0) as usize;
        let total = slot_base + usize::from(size) * slot_size;
        let mut mem = DmaRegion::new(dev.container().clone(), total)?;
        let ring_ro = mem.map(0, layout.read_only_len, true, false)?;
        let ring_rw = mem.map(layout.used, layout.writable_len, true, true)?;
        let slots_len =
            round_up((usize::from(size) * slot_size) as u64, PAGE).unwrap_or(0) as usize;
        // The device only reads transmit slots.
        let slot_iova = mem.map(slot_base, slots_len, true, false)?;
        let q = SplitQueue::new(layout, &mem, true);
        let areas = (
            ring_ro,
            ring_ro + (layout.avail - layout.desc) as u64,
            ring_rw,
        );
        // Transmit completions are reclaimed when slots are needed: no interrupt.
        let notify_at = transport.setup_queue(TX_QUEUE, size, MSI_NO_VECTOR, areas)?;
        Ok(TxQueue {
            q,
            mem,
            notify_at,
            slot_base,
            slot_size,
            slot_iova,
            free_slots: (0..size).rev().collect(),
            pins: (0..size).map(|_| SlotPins::with_capacity()).collect(),
            frames_posted: 0,
            bytes_posted: 0,
            zero_copy: 0,
            ring_full: 0,
        })
    }

    /// The device's PCI address.
    pub(crate) fn name(&self) -> &str {
        self.dev.name()
    }

    /// The device's IOMMU group.
    pub(crate) fn iommu_group(&self) -> u32 {
        self.dev.group()
    }

    /// The MAC address (from the device configuration when VIRTIO_NET_F_MAC was negotiated).
    pub(crate) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The link MTU in bytes (from the device when VIRTIO_NET_F_MTU was negotiated, else 1500).
    pub(crate) fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The negotiated feature bits.
    pub(crate) fn features(&self) -> u64 {
        self.features
    }

    /// Queue sizes (receive, transmit).
    pub(crate) fn queue_sizes(&self) -> (u16, u16) {
        (self.rx.q.size(), self.tx.q.size())
    }

    /// What backs the DMA memory of the receive and transmit queues.
    pub(crate) fn backing(&self) -> (PageBacking, PageBacking, bool) {
        (
            self.rx.mem.backing(),
            self.tx.mem.backing(),
            self.rx.mem.is_locked() && self.tx.mem.is_locked(),
        )
    }

    /// The container (for mapping registered memory).
    pub(crate) fn container(&self) -> &std::sync::Arc<super::dma::Container> {
        self.dev.container()
    }

    /// The transmit queue.
    pub(crate) fn tx(&mut self) -> &mut TxQueue {
        &mut self.tx
    }

    /// The counters.
    pub(crate) fn counters(&self) -> NicCounters {
        let f: QueueFaults = self.rx.q.faults();
        let g: QueueFaults = self.tx.q.faults();
        NicCounters {
            rx_frames: self.rx_frames,
            rx_bytes: self.rx_bytes,
            rx_bad_len: self.rx_bad_len,
            rx_refilled: self.rx_refilled,
            tx_frames: self.tx.frames_posted,
            tx_bytes: self.tx.bytes_posted,
            tx_zero_copy: self.tx.zero_copy,
            tx_ring_full: self.tx.ring_full,
            notifies: self.notifies,
            notifies_suppressed: self.notifies_suppressed,
            device_bad_id: f.bad_id + g.bad_id,
            device_bad_idx: f.bad_idx + g.bad_idx,
            interrupts: self.interrupts_taken,
        }
    }

    fn notify_rx(&mut self) -> Result<(), VfioError> {
        if self.rx.q.needs_notify(&self.rx.mem) {
            self.notifies += 1;
            self.transport.notify(self.rx.notify_at, RX_QUEUE)
        } else {
            self.notifies_suppressed += 1;
            Ok(())
        }
    }

    /// Receives up to `max` frames, calling `f(frame, tx)` for each (the frame without its
    /// virtio-net header; `tx` to answer at once, published by the next [`VirtioNet::flush`]).
    /// Then gives consumed buffers back to the device in a batch. Returns the frames received.
    pub(crate) fn receive<F>(&mut self, max: usize, mut f: F) -> Result<usize, VfioError>
    where
        F: FnMut(&[u8], &mut TxQueue),
    {
        let mut n = 0;
        while n < max {
            let Some(used) = self.rx.q.pop_used(&self.rx.mem) else {
                break;
            };
            let b = used.token;
            let len = used.len as usize;
            if len < NET_HDR_LEN || len > self.rx.buf_size {
                self.rx_bad_len += 1;
                self.rx.refill.push(b);
                continue;
            }
            let at = self.rx.buf_base + usize::from(b) * self.rx.buf_size;
            if let Some(frame) = self.rx.mem.bytes(at + NET_HDR_LEN, len - NET_HDR_LEN) {
                self.rx_frames += 1;
                self.rx_bytes += frame.len() as u64;
                f(frame, &mut self.tx);
            }
            self.rx.refill.push(b);
            n += 1;
        }
        let (refilled, notify) = self.rx.refill(false);
        self.rx_refilled += refilled;
        if notify {
            self.notifies += 1;
            self.transport.notify(self.rx.notify_at, RX_QUEUE)?;
        } else if refilled > 0 {
            self.notifies_suppressed += 1;
        }
        Ok(n)
    }

    /// Publishes the frames posted on the transmit queue and notifies the device if it wants.
    pub(crate) fn flush(&mut self) -> Result<(), VfioError> {
        if self.tx.q.publish(&self.tx.mem) {
            if self.tx.q.needs_notify(&self.tx.mem) {
                self.notifies += 1;
                self.transport.notify(self.tx.notify_at, TX_QUEUE)?;
            } else {
                self.notifies_suppressed += 1;
            }
        }
        Ok(())
    }

    /// Whether receive interrupts are on.
    pub(crate) fn interrupts(&self) -> bool {
        self.irq.is_some()
    }

    /// The interrupt eventfd, for a thread that sleeps on it without holding the NIC.
    pub(crate) fn irq_handle(&self) -> Option<std::sync::Arc<os::Fd>> {
        self.irq.clone()
    }

    /// Whether the receive queue has a frame for [`VirtioNet::receive`].
    pub(crate) fn rx_pending(&self) -> bool {
        self.rx.q.has_used(&self.rx.mem)
    }

    /// Asks the device for a receive interrupt before a sleep on [`VirtioNet::irq_handle`]
    /// (clears VIRTQ_AVAIL_F_NO_INTERRUPT) and returns `false` when a frame is already there
    /// (then do not sleep). Without interrupts this only checks.
    pub(crate) fn arm_rx_interrupt(&mut self) -> bool {
        if self.irq.is_none() {
            return !self.rx_pending();
        }
        self.rx.q.set_no_interrupt(&self.rx.mem, false);
        // SeqCst fence: orders the flag store before the used-index load (as in `wait_rx`): else
        // the device could add a frame after our load and read the old flag (lost wake-up).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        !self.rx_pending()
    }

    /// Stops receive interrupts again after a sleep (the queue is polled while busy).
    pub(crate) fn disarm_rx_interrupt(&mut self) {
        if self.irq.is_some() {
            self.rx.q.set_no_interrupt(&self.rx.mem, true);
        }
    }

    /// Sleeps until the receive queue has a frame or `timeout` passes (returns whether a frame
    /// is there). With interrupts off this only checks. The device is asked for an interrupt only
    /// for this wait (VIRTQ_AVAIL_F_NO_INTERRUPT is cleared, then set again), so a busy link
    /// takes none.
    pub(crate) fn wait_rx(&mut self, timeout: Duration) -> Result<bool, VfioError> {
        let Some(irq) = &self.irq else {
            return Ok(self.rx.q.has_used(&self.rx.mem));
        };
        self.rx.q.set_no_interrupt(&self.rx.mem, false);
        // SeqCst fence: orders the flag store before the used-index load. Otherwise the load
        // could be answered first: we see no frame, the device then adds one but reads the old
        // NO_INTERRUPT and sends no interrupt, and we sleep with a frame waiting (lost wake-up).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let r = if self.rx.q.has_used(&self.rx.mem) {
            Ok(true)
        } else {
            match os::eventfd_wait(irq, timeout) {
                Ok(signalled) => {
                    if signalled {
                        self.interrupts_taken += 1;
                    }
                    Ok(self.rx.q.has_used(&self.rx.mem))
                }
                Err(source) => Err(VfioError::Ioctl {
                    device: self.name().to_owned(),
                    op: "poll of the interrupt eventfd",
                    source,
                }),
            }
        };
        self.rx.q.set_no_interrupt(&self.rx.mem, true);
        r
    }

    /// Frames posted for transmission and not yet published to the device.
    pub(crate) fn tx_unpublished(&self) -> u16 {
        self.tx.q.unpublished()
    }

    /// Frames posted for transmission that the device has not returned yet.
    pub(crate) fn tx_outstanding(&self) -> u16 {
        self.tx.q.outstanding()
    }

    /// Checks that the device is still working: DEVICE_NEEDS_RESET or FAILED set, or DRIVER_OK
    /// cleared, is an error (an MMIO read: call it when idle, not per frame).
    pub(crate) fn check_status(&self) -> Result<(), VfioError> {
        use super::virtio::status;
        let s = self.transport.status()?;
        if s & (status::DEVICE_NEEDS_RESET | status::FAILED) != 0 || s & status::DRIVER_OK == 0 {
            return Err(VfioError::DeviceNeedsReset {
                device: self.name().to_owned(),
                status: s,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn interrupts_are_asked_for_only_while_waiting() {
        use crate::link::vfio::sys_fake as fake;
        fake::reset();
        let dev = fake::add_virtio_net("0000:00:04.0", 3, [2, 0, 0, 0, 0, 1]);
        let addr = PciAddress::parse("0000:00:04.0").unwrap();
        let config = NetConfig {
            interrupts: true,
            ..NetConfig::default()
        };
        let mut nic = VirtioNet::open(&addr, &config).unwrap();
        assert!(nic.interrupts());
        // Busy (NO_INTERRUPT set): a frame raises no interrupt.
        fake::inject(dev, vec![0u8; 64]);
        assert_eq!(fake::with(|w| w.devices[dev].interrupts), 0);
        // A wait with a frame already there returns at once, without sleeping.
        assert!(nic.wait_rx(Duration::from_secs(10)).unwrap());
        assert_eq!(nic.receive(8, |_, _| {}).unwrap(), 1);
        // An empty queue: the wait times out (bounded), and NO_INTERRUPT is set again after it.
        let t = std::time::Instant::now();
        assert!(!nic.wait_rx(Duration::from_millis(5)).unwrap());
        assert!(t.elapsed() < Duration::from_secs(2));
        fake::inject(dev, vec![0u8; 64]);
        assert_eq!(fake::with(|w| w.devices[dev].interrupts), 0);
        // While interrupts are wanted, a frame signals the eventfd.
        nic.rx.q.set_no_interrupt(&nic.rx.mem, false);
        fake::inject(dev, vec![0u8; 64]);
        assert_eq!(fake::with(|w| w.devices[dev].interrupts), 1);
        assert!(nic.wait_rx(Duration::from_secs(10)).unwrap());
        assert_eq!(
            nic.counters().interrupts,
            0,
            "found by the re-check, not the eventfd"
        );
    }

    #[test]
    fn without_interrupts_no_vector_is_assigned() {
        use crate::link::vfio::sys_fake as fake;
        fake::reset();
        let dev = fake::add_virtio_net("0000:00:04.0", 3, [2, 0, 0, 0, 0, 1]);
        let addr = PciAddress::parse("0000:00:04.0").unwrap();
        let mut nic = VirtioNet::open(&addr, &NetConfig::default()).unwrap();
        nic.rx.q.set_no_interrupt(&nic.rx.mem, false);
        fake::inject(dev, vec![0u8; 64]);
        assert_eq!(fake::with(|w| w.devices[dev].interrupts), 0);
        assert!(nic.wait_rx(Duration::ZERO).unwrap());
    }

    #[test]
    fn net_hdr_is_twelve_bytes() {
        assert_eq!(NET_HDR_LEN, 12);
        assert_eq!(offset_of!(VirtioNetHdr, hdr_len), 2);
        assert_eq!(offset_of!(VirtioNetHdr, gso_size), 4);
        assert_eq!(offset_of!(VirtioNetHdr, csum_start), 6);
        assert_eq!(offset_of!(VirtioNetHdr, csum_offset), 8);
        assert_eq!(offset_of!(VirtioNetHdr, num_buffers), 10);
        assert_eq!(TX_HEADROOM, 74);
    }
}
