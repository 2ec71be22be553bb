//! A fake of `sys` for unit tests: the same functions, answered by an in-process "kernel" with
//! sysfs entries, VFIO containers and groups, a Type1 IOMMU that checks every device access, and
//! emulated modern virtio-net devices (QEMU's register layout: BAR4 with common configuration at
//! 0, ISR at 0x1000, device configuration at 0x2000, notifications at 0x3000 with multiplier 4).
//!
//! The device model processes a queue when it is notified: transmitted frames go to the world's
//! `wire` (and, when `hub` is set, into the other devices' receive queues); frames injected or
//! forwarded wait in a device's `inbox` until it has receive buffers. Each device reads and writes
//! memory only through its container's IOMMU mappings, with their permissions; an access outside
//! them is counted in `iommu_faults` and puts the device into DEVICE_NEEDS_RESET, as QEMU's
//! `virtio_error` does. Faults to inject are in [`DeviceFaults`].
//!
//! The world is thread-local: every test (one thread each) builds its own.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::io;

use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_iommu_type1_info, vfio_irq_info, vfio_region_info,
    VFIO_TYPE1v2_IOMMU, VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET,
    VFIO_GROUP_FLAGS_CONTAINER_SET, VFIO_GROUP_FLAGS_VIABLE, VFIO_IOMMU_INFO_PGSIZES,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
    VFIO_TYPE1_IOMMU,
};

/// Region file offsets, as vfio-pci lays them out (`index << 40`).
const REGION_SHIFT: u32 = 40;
const BAR4: u32 = 4;
const CONFIG_REGION: u32 = 7;
const BAR4_LEN: usize = 0x4000;
const NOTIFY_BASE: usize = 0x3000;
const NOTIFY_MULT: usize = 4;
const QUEUE_MAX: u16 = 256;

/// Faults a fake device can be told to show.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeviceFaults {
    /// device_status never reads back 0 after a reset.
    pub(crate) reset_hangs: bool,
    /// FEATURES_OK is never accepted.
    pub(crate) refuse_features_ok: bool,
    /// Transmit notifications are ignored (the ring fills up).
    pub(crate) stall_tx: bool,
    /// The next used element written carries an id the driver never posted.
    pub(crate) bad_used_id: bool,
    /// The device keeps VIRTQ_USED_F_NO_NOTIFY set on both queues (it "polls" them itself: the
    /// fake then processes the transmit queue at every MMIO access).
    pub(crate) no_notify: bool,
}

/// One emulated virtio-net device.
#[derive(Debug)]
pub(crate) struct FakeNet {
    /// PCI configuration space.
    pub(crate) config: [u8; 256],
    /// Feature bits offered.
    pub(crate) features: u64,
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: u16,
    pub(crate) faults: DeviceFaults,
    /// Frames waiting for receive buffers.
    pub(crate) inbox: VecDeque<Vec<u8>>,
    /// Frames delivered into receive buffers.
    pub(crate) delivered: u64,
    /// Notifications received per queue.
    pub(crate) notifications: [u64; 2],
    /// MSI-X vectors enabled through VFIO: vector -> eventfd.
    msix: Vec<u32>,
    /// Interrupts signalled.
    pub(crate) interrupts: u64,
    status: u8,
    dfselect: u32,
    drfselect: u32,
    pub(crate) driver_features: u64,
    queue_select: u16,
    queues: [FakeQueue; 2],
    /// The group the device is in (to find its container's IOMMU).
    group: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct FakeQueue {
    size: u16,
    enable: u16,
    msix: u16,
    desc: u64,
    driver: u64,
    device: u64,
    last_avail: u16,
    used_idx: u16,
}

#[derive(Debug, Clone, Copy)]
struct IommuMap {
    vaddr: usize,
    size: u64,
    read: bool,
    write: bool,
}

/// A PCI function in the fake sysfs.
#[derive(Debug, Clone)]
pub(crate) struct PciFn {
    pub(crate) driver: Option<String>,
    pub(crate) group: Option<u32>,
    /// Index in `World::devices`.
    pub(crate) device: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FdKind {
    Container,
    Group(u32),
    Device(usize),
    EventFd,
}

#[derive(Debug, Default)]
pub(crate) struct Group {
    pub(crate) viable: bool,
    container: Option<u32>,
}

/// The fake kernel.
#[derive(Debug)]
pub(crate) struct World {
    /// `/dev/vfio/vfio` exists.
    pub(crate) vfio_loaded: bool,
    /// Type1 IOMMU offered.
    pub(crate) type1: bool,
    pub(crate) pci: BTreeMap<String, PciFn>,
    pub(crate) groups: BTreeMap<u32, Group>,
    pub(crate) devices: Vec<FakeNet>,
    /// Frames transmitted: (device index, frame without the virtio-net header).
    pub(crate) wire: Vec<(usize, Vec<u8>)>,
    /// The descriptor chain of each frame in `wire`, as the device read it: (device index,
    /// (IOVA, length) per descriptor).
    pub(crate) tx_chains: Vec<(usize, Vec<(u64, u32)>)>,
    /// Forward transmitted frames to every other device.
    pub(crate) hub: bool,
    /// Device accesses outside the IOMMU mappings (or against their permission).
    pub(crate) iommu_faults: u64,
    /// Mappings still present when their container was closed.
    pub(crate) leaked_mappings: usize,
    fds: BTreeMap<u32, FdKind>,
    next_fd: u32,
    iommu: BTreeMap<u32, BTreeMap<u64, IommuMap>>,
    /// Containers with their IOMMU type set.
    iommu_set: BTreeMap<u32, u32>,
    /// Eventfd counters.
    eventfds: BTreeMap<u32, u64>,
    /// Pages locked with `mlock`: page address -> times locked without an unlock (the real
    /// kernel does not count; the fake does, so that tests see unbalanced calls).
    pub(crate) locked_pages: BTreeMap<usize, u32>,
}

impl Default for World {
    fn default() -> World {
        World {
            vfio_loaded: true,
            type1: true,
            pci: BTreeMap::new(),
            groups: BTreeMap::new(),
            devices: Vec::new(),
            wire: Vec::new(),
            tx_chains: Vec::new(),
            hub: false,
            iommu_faults: 0,
            leaked_mappings: 0,
            fds: BTreeMap::new(),
            next_fd: 3,
            iommu: BTreeMap::new(),
            iommu_set: BTreeMap::new(),
            eventfds: BTreeMap::new(),
            locked_pages: BTreeMap::new(),
        }
    }
}

thread_local! {
    static WORLD: RefCell<World> = RefCell::new(World::default());
}

/// Runs `f` on this thread's world.
pub(crate) fn with<R>(f: impl FnOnce(&mut World) -> R) -> R {
    WORLD.with(|w| f(&mut w.borrow_mut()))
}

/// Replaces this thread's world with an empty one.
pub(crate) fn reset() {
    with(|w| *w = World::default());
}

/// Adds a viable, vfio-pci-bound virtio-net device at `addr` in its own group `group`; returns
/// its index.
pub(crate) fn add_virtio_net(addr: &str, group: u32, mac: [u8; 6]) -> usize {
    with(|w| {
        let index = w.devices.len();
        w.devices.push(FakeNet::new(mac, group));
        w.pci.insert(
            addr.to_owned(),
            PciFn {
                driver: Some("vfio-pci".into()),
                group: Some(group),
                device: index,
            },
        );
        w.groups.insert(
            group,
            Group {
                viable: true,
                container: None,
            },
        );
        index
    })
}

/// Queues `frame` for device `dev`'s receive queue (delivered at once if it has buffers).
pub(crate) fn inject(dev: usize, frame: Vec<u8>) {
    with(|w| {
        w.devices[dev].inbox.push_back(frame);
        w.deliver(dev);
    });
}

/// A fake open file.
#[derive(Debug)]
pub(crate) struct Fd {
    id: u32,
}

impl Drop for Fd {
    fn drop(&mut self) {
        // try_with: the world may be gone at thread exit.
        let _ = WORLD.try_with(|w| {
            let mut w = w.borrow_mut();
            match w.fds.remove(&self.id) {
                Some(FdKind::Group(g)) => {
                    if let Some(gr) = w.groups.get_mut(&g) {
                        gr.container = None;
                    }
                }
                Some(FdKind::Container) => {
                    let left = w.iommu.remove(&self.id).map_or(0, |m| m.len());
                    w.leaked_mappings += left;
                }
                Some(FdKind::EventFd) => {
                    w.eventfds.remove(&self.id);
                }
                _ => {}
            }
        });
    }
}

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl World {
    fn open(&mut self, kind: FdKind) -> Fd {
        let id = self.next_fd;
        self.next_fd += 1;
        self.fds.insert(id, kind);
        Fd { id }
    }

    fn kind(&self, fd: &Fd) -> io::Result<FdKind> {
        self.fds
            .get(&fd.id)
            .copied()
            .ok_or_else(|| err(libc::EBADF))
    }

    fn device_of(&self, fd: &Fd) -> io::Result<usize> {
        match self.kind(fd)? {
            FdKind::Device(d) => Ok(d),
            _ => Err(err(libc::ENOTTY)),
        }
    }

    /// The container of device `dev`'s group.
    fn container_of(&self, dev: usize) -> Option<u32> {
        self.groups.get(&self.devices[dev].group)?.container
    }

    /// The host pointer for a device access of `len` bytes at `iova`, if one mapping of the
    /// device's container covers it with the permission needed.
    fn translate(&mut self, dev: usize, iova: u64, len: usize, write: bool) -> Option<*mut u8> {
        let c = self.container_of(dev)?;
        let maps = self.iommu.get(&c)?;
        let found = maps.range(..=iova).next_back().and_then(|(&start, m)| {
            let end = iova.checked_add(len as u64)?;
            (end <= start + m.size && (if write { m.write } else { m.read }))
                .then(|| (m.vaddr + (iova - start) as usize) as *mut u8)
        });
        if found.is_none() {
            self.iommu_faults += 1;
            self.devices[dev].status |= 0x40; // DEVICE_NEEDS_RESET
        }
        found
    }

    fn dma_read(&mut self, dev: usize, iova: u64, buf: &mut [u8]) -> bool {
        match self.translate(dev, iova, buf.len(), false) {
            Some(p) => {
                // SAFETY: `p` lies inside a live IOMMU mapping of host memory (the driver keeps
                // mapped memory alive until it unmaps it), for `buf.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
                true
            }
            None => false,
        }
    }

    fn dma_write(&mut self, dev: usize, iova: u64, buf: &[u8]) -> bool {
        match self.translate(dev, iova, buf.len(), true) {
            Some(p) => {
                // SAFETY: as in `dma_read`, with write permission checked.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
                true
            }
            None => false,
        }
    }

    fn read16(&mut self, dev: usize, iova: u64) -> Option<u16> {
        let mut b = [0u8; 2];
        self.dma_read(dev, iova, &mut b)
            .then(|| u16::from_le_bytes(b))
    }

    fn write16(&mut self, dev: usize, iova: u64, v: u16) -> bool {
        self.dma_write(dev, iova, &v.to_le_bytes())
    }

    fn running(&self, dev: usize, q: usize) -> bool {
        let d = &self.devices[dev];
        d.status & 4 != 0 && d.status & 0x40 == 0 && d.queues[q].enable == 1
    }

    /// Reads the chain at `head` of queue `q`: (iova, len, device-writes) per descriptor.
    fn chain(&mut self, dev: usize, q: usize, head: u16) -> Option<Vec<(u64, u32, bool)>> {
        let fq = self.devices[dev].queues[q];
        let mut out = Vec::new();
        let mut id = head;
        loop {
            if id >= fq.size || out.len() > usize::from(fq.size) {
                self.devices[dev].status |= 0x40;
                return None;
            }
            let mut d = [0u8; 16];
            if !self.dma_read(dev, fq.desc + 16 * u64::from(id), &mut d) {
                return None;
            }
            let addr = u64::from_le_bytes(d[0..8].try_into().ok()?);
            let len = u32::from_le_bytes(d[8..12].try_into().ok()?);
            let flags = u16::from_le_bytes([d[12], d[13]]);
            let next = u16::from_le_bytes([d[14], d[15]]);
            out.push((addr, len, flags & 2 != 0));
            if flags & 1 == 0 {
                return Some(out);
            }
            id = next;
        }
    }

    /// Pops the next available head of queue `q`, if any.
    fn next_avail(&mut self, dev: usize, q: usize) -> Option<u16> {
        let fq = self.devices[dev].queues[q];
        let avail_idx = self.read16(dev, fq.driver + 2)?;
        if avail_idx == fq.last_avail {
            return None;
        }
        let slot = u64::from(fq.last_avail % fq.size);
        let head = self.read16(dev, fq.driver + 4 + 2 * slot)?;
        self.devices[dev].queues[q].last_avail = fq.last_avail.wrapping_add(1);
        Some(head)
    }

    fn push_used(&mut self, dev: usize, q: usize, mut id: u32, len: u32) {
        if std::mem::take(&mut self.devices[dev].faults.bad_used_id) {
            id = 999;
        }
        let fq = self.devices[dev].queues[q];
        let slot = u64::from(fq.used_idx % fq.size);
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&id.to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        if self.dma_write(dev, fq.device + 4 + 8 * slot, &elem) {
            let idx = fq.used_idx.wrapping_add(1);
            self.devices[dev].queues[q].used_idx = idx;
            self.write16(dev, fq.device + 2, idx);
            self.interrupt(dev, q);
        }
    }

    /// Signals queue `q`'s MSI-X vector unless the driver suppressed interrupts (§2.7.7).
    fn interrupt(&mut self, dev: usize, q: usize) {
        let fq = self.devices[dev].queues[q];
        let Some(&efd) = self.devices[dev].msix.get(usize::from(fq.msix)) else {
            return;
        };
        let no_interrupt = self.read16(dev, fq.driver).unwrap_or(1) & 1 != 0;
        if !no_interrupt {
            *self.eventfds.entry(efd).or_default() += 1;
            self.devices[dev].interrupts += 1;
        }
    }

    fn update_used_flags(&mut self, dev: usize) {
        let flags = u16::from(self.devices[dev].faults.no_notify);
        for q in 0..2 {
            if self.running(dev, q) {
                let used = self.devices[dev].queues[q].device;
                self.write16(dev, used, flags);
            }
        }
    }

    /// Sends everything on device `dev`'s transmit queue.
    fn transmit(&mut self, dev: usize) {
        if !self.running(dev, 1) || self.devices[dev].faults.stall_tx {
            return;
        }
        while let Some(head) = self.next_avail(dev, 1) {
            let Some(chain) = self.chain(dev, 1, head) else {
                return;
            };
            let mut bytes = Vec::new();
            let descriptors: Vec<(u64, u32)> = chain.iter().map(|&(a, l, _)| (a, l)).collect();
            for (iova, len, writes) in chain {
                if writes {
                    self.devices[dev].status |= 0x40;
                    return;
                }
                let mut b = vec![0u8; len as usize];
                if !self.dma_read(dev, iova, &mut b) {
                    return;
                }
                bytes.extend_from_slice(&b);
            }
            self.push_used(dev, 1, u32::from(head), 0);
            if bytes.len() < 12 {
                continue;
            }
            let frame = bytes.split_off(12);
            self.wire.push((dev, frame.clone()));
            self.tx_chains.push((dev, descriptors));
            if self.hub {
                for other in 0..self.devices.len() {
                    if other != dev {
                        self.devices[other].inbox.push_back(frame.clone());
                        self.deliver(other);
                    }
                }
            }
        }
    }

    /// Moves frames from device `dev`'s inbox into its receive buffers.
    fn deliver(&mut self, dev: usize) {
        while self.running(dev, 0) && !self.devices[dev].inbox.is_empty() {
            let Some(head) = self.next_avail(dev, 0) else {
                return;
            };
            let Some(frame) = self.devices[dev].inbox.pop_front() else {
                return;
            };
            let Some(chain) = self.chain(dev, 0, head) else {
                return;
            };
            let mut hdr = [0u8; 12];
            hdr[10] = 1; // num_buffers
            let mut data = hdr.to_vec();
            data.extend_from_slice(&frame);
            let (iova, len, writes) = chain[0];
            if !writes || (len as usize) < data.len() {
                // QEMU: "virtio-net receive buffer too small": the frame is dropped.
                self.devices[dev].status |= 0x40;
                return;
            }
            if !self.dma_write(dev, iova, &data) {
                return;
            }
            self.push_used(dev, 0, u32::from(head), data.len() as u32);
            self.devices[dev].delivered += 1;
        }
    }

    fn reset_device(&mut self, dev: usize) {
        let d = &mut self.devices[dev];
        d.status = 0;
        d.driver_features = 0;
        d.queue_select = 0;
        d.queues = [FakeQueue {
            size: QUEUE_MAX,
            msix: 0xffff,
            ..FakeQueue::default()
        }; 2];
    }

    fn mmio_read(&mut self, dev: usize, off: usize, width: usize) -> u32 {
        if self.devices[dev].faults.no_notify {
            self.transmit(dev);
        }
        let d = &self.devices[dev];
        let q = d.queues.get(usize::from(d.queue_select)).copied();
        let v: u32 = match off {
            0x00 => d.dfselect,
            0x04 => match d.dfselect {
                0 => d.features as u32,
                1 => (d.features >> 32) as u32,
                _ => 0,
            },
            0x08 => d.drfselect,
            0x0c => match d.drfselect {
                0 => d.driver_features as u32,
                1 => (d.driver_features >> 32) as u32,
                _ => 0,
            },
            0x12 => 2,
            0x14 => {
                if d.faults.reset_hangs && d.status == 0 {
                    0x01
                } else {
                    u32::from(d.status)
                }
            }
            0x15 => 0,
            0x16 => u32::from(d.queue_select),
            0x18 => q.map_or(0, |q| u32::from(q.size)),
            0x1a => q.map_or(0, |q| u32::from(q.msix)),
            0x1c => q.map_or(0, |q| u32::from(q.enable)),
            0x1e => u32::from(d.queue_select),
            0x20 => q.map_or(0, |q| q.desc as u32),
            0x24 => q.map_or(0, |q| (q.desc >> 32) as u32),
            0x28 => q.map_or(0, |q| q.driver as u32),
            0x2c => q.map_or(0, |q| (q.driver >> 32) as u32),
            0x30 => q.map_or(0, |q| q.device as u32),
            0x34 => q.map_or(0, |q| (q.device >> 32) as u32),
            0x1000 => 0,
            0x2000..=0x2005 => u32::from(d.mac[off - 0x2000]),
            0x2006 => 1, // VIRTIO_NET_S_LINK_UP
            0x2008 => 1,
            0x200a => u32::from(d.mtu),
            _ => 0,
        };
        match width {
            1 => v & 0xff,
            2 => v & 0xffff,
            _ => v,
        }
    }

    fn mmio_write(&mut self, dev: usize, off: usize, v: u32) {
        let sel = usize::from(self.devices[dev].queue_select);
        let set_lo = |x: &mut u64, v: u32| *x = (*x & !0xffff_ffff) | u64::from(v);
        let set_hi = |x: &mut u64, v: u32| *x = (*x & 0xffff_ffff) | u64::from(v) << 32;
        match off {
            0x00 => self.devices[dev].dfselect = v,
            0x08 => self.devices[dev].drfselect = v,
            0x0c => {
                let d = &mut self.devices[dev];
                match d.drfselect {
                    0 => set_lo(&mut d.driver_features, v),
                    1 => set_hi(&mut d.driver_features, v),
                    _ => {}
                }
            }
            0x14 => {
                let v = v as u8;
                if v == 0 {
                    self.reset_device(dev);
                    return;
                }
                let d = &mut self.devices[dev];
                let mut new = v;
                if v & 8 != 0 && d.status & 8 == 0 {
                    let ok = !d.faults.refuse_features_ok
                        && d.driver_features & !d.features == 0
                        && d.driver_features & (1 << 32) != 0;
                    if !ok {
                        new &= !8;
                    }
                }
                d.status = new;
                if new & 4 != 0 {
                    self.update_used_flags(dev);
                    self.deliver(dev);
                }
            }
            0x16 => self.devices[dev].queue_select = v as u16,
            _ if sel >= 2 => {}
            0x18 => {
                let size = v as u16;
                if size.is_power_of_two() && size <= QUEUE_MAX {
                    self.devices[dev].queues[sel].size = size;
                }
            }
            0x1a => self.devices[dev].queues[sel].msix = v as u16,
            0x1c => self.devices[dev].queues[sel].enable = v as u16,
            0x20 => set_lo(&mut self.devices[dev].queues[sel].desc, v),
            0x24 => set_hi(&mut self.devices[dev].queues[sel].desc, v),
            0x28 => set_lo(&mut self.devices[dev].queues[sel].driver, v),
            0x2c => set_hi(&mut self.devices[dev].queues[sel].driver, v),
            0x30 => set_lo(&mut self.devices[dev].queues[sel].device, v),
            0x34 => set_hi(&mut self.devices[dev].queues[sel].device, v),
            o if o == NOTIFY_BASE || o == NOTIFY_BASE + NOTIFY_MULT => {
                let q = (o - NOTIFY_BASE) / NOTIFY_MULT;
                if v as usize == q {
                    self.devices[dev].notifications[q] += 1;
                    if q == 1 {
                        self.transmit(dev);
                    } else {
                        self.deliver(dev);
                    }
                }
            }
            _ => {}
        }
    }
}

impl FakeNet {
    fn new(mac: [u8; 6], group: u32) -> FakeNet {
        let mut n = FakeNet {
            config: crate::link::vfio::pci::tests::qemu_like_config(),
            features: (1 << 32) | (1 << 33) | (1 << 5) | (1 << 3) | (1 << 16) | (1 << 0),
            mac,
            mtu: 1500,
            faults: DeviceFaults::default(),
            inbox: VecDeque::new(),
            delivered: 0,
            notifications: [0; 2],
            msix: Vec::new(),
            interrupts: 0,
            status: 0,
            dfselect: 0,
            drfselect: 0,
            driver_features: 0,
            queue_select: 0,
            queues: [FakeQueue::default(); 2],
            group,
        };
        n.queues = [FakeQueue {
            size: QUEUE_MAX,
            msix: 0xffff,
            ..FakeQueue::default()
        }; 2];
        n
    }

    /// Device status as the device holds it.
    pub(crate) fn status(&self) -> u8 {
        self.status
    }
}

// ---------------------------------------------------------------- the `sys` signatures

pub(crate) fn pci_device_exists(addr: &str) -> bool {
    with(|w| w.pci.contains_key(addr))
}

pub(crate) fn pci_driver(addr: &str) -> io::Result<Option<String>> {
    with(|w| Ok(w.pci.get(addr).and_then(|p| p.driver.clone())))
}

pub(crate) fn pci_iommu_group(addr: &str) -> io::Result<Option<u32>> {
    with(|w| Ok(w.pci.get(addr).and_then(|p| p.group)))
}

pub(crate) fn open_container() -> io::Result<Fd> {
    with(|w| {
        if !w.vfio_loaded {
            return Err(err(libc::ENOENT));
        }
        Ok(w.open(FdKind::Container))
    })
}

pub(crate) fn open_group(group: u32) -> io::Result<Fd> {
    with(|w| {
        if !w.groups.contains_key(&group) {
            return Err(err(libc::ENOENT));
        }
        Ok(w.open(FdKind::Group(group)))
    })
}

pub(crate) fn get_api_version(container: &Fd) -> io::Result<i32> {
    with(|w| match w.kind(container)? {
        FdKind::Container => Ok(0),
        _ => Err(err(libc::ENOTTY)),
    })
}

pub(crate) fn check_extension(container: &Fd, ext: u32) -> io::Result<bool> {
    with(|w| {
        w.kind(container)?;
        Ok(w.type1 && (ext == VFIO_TYPE1_IOMMU || ext == VFIO_TYPE1v2_IOMMU))
    })
}

pub(crate) fn set_iommu(container: &Fd, iommu_type: u32) -> io::Result<()> {
    with(|w| {
        w.kind(container)?;
        let has_group = w.groups.values().any(|g| g.container == Some(container.id));
        if !has_group || !w.type1 {
            return Err(err(libc::EINVAL));
        }
        w.iommu_set.insert(container.id, iommu_type);
        w.iommu.entry(container.id).or_default();
        Ok(())
    })
}

pub(crate) fn iommu_get_info(container: &Fd) -> io::Result<vfio_iommu_type1_info> {
    with(|w| {
        w.kind(container)?;
        Ok(vfio_iommu_type1_info {
            argsz: 16,
            flags: VFIO_IOMMU_INFO_PGSIZES,
            iova_pgsizes: 0x4000_0000 | 0x20_0000 | 0x1000,
        })
    })
}

pub(crate) fn group_get_status(group: &Fd) -> io::Result<vfio_group_status> {
    with(|w| {
        let FdKind::Group(g) = w.kind(group)? else {
            return Err(err(libc::ENOTTY));
        };
        let gr = &w.groups[&g];
        let mut flags = 0;
        if gr.viable {
            flags |= VFIO_GROUP_FLAGS_VIABLE;
        }
        if gr.container.is_some() {
            flags |= VFIO_GROUP_FLAGS_CONTAINER_SET;
        }
        Ok(vfio_group_status { argsz: 8, flags })
    })
}

pub(crate) fn group_set_container(group: &Fd, container: &Fd) -> io::Result<()> {
    with(|w| {
        let FdKind::Group(g) = w.kind(group)? else {
            return Err(err(libc::ENOTTY));
        };
        if w.kind(container)? != FdKind::Container {
            return Err(err(libc::EBADF));
        }
        let gr = w.groups.get_mut(&g).ok_or_else(|| err(libc::ENODEV))?;
        if !gr.viable {
            return Err(err(libc::EPERM));
        }
        gr.container = Some(container.id);
        Ok(())
    })
}

pub(crate) fn group_get_device_fd(group: &Fd, name: &str) -> io::Result<Fd> {
    with(|w| {
        let FdKind::Group(g) = w.kind(group)? else {
            return Err(err(libc::ENOTTY));
        };
        let c = w.groups[&g].container.ok_or_else(|| err(libc::EINVAL))?;
        if !w.iommu_set.contains_key(&c) {
            return Err(err(libc::EINVAL));
        }
        let p = w.pci.get(name).ok_or_else(|| err(libc::ENODEV))?;
        if p.group != Some(g) {
            return Err(err(libc::ENODEV));
        }
        let dev = p.device;
        Ok(w.open(FdKind::Device(dev)))
    })
}

pub(crate) fn device_get_info(device: &Fd) -> io::Result<vfio_device_info> {
    with(|w| {
        w.device_of(device)?;
        Ok(vfio_device_info {
            argsz: 24,
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: 9,
            num_irqs: 5,
        })
    })
}

pub(crate) fn device_get_region_info(device: &Fd, index: u32) -> io::Result<vfio_region_info> {
    with(|w| {
        w.device_of(device)?;
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        let (size, flags) = match index {
            BAR4 => (BAR4_LEN as u64, rw | VFIO_REGION_INFO_FLAG_MMAP),
            1 => (0x1000, rw),
            CONFIG_REGION => (256, rw),
            0..=8 => (0, 0),
            _ => return Err(err(libc::EINVAL)),
        };
        Ok(vfio_region_info {
            argsz: 32,
            flags,
            index,
            cap_offset: 0,
            size,
            offset: u64::from(index) << REGION_SHIFT,
        })
    })
}

pub(crate) fn device_get_irq_info(device: &Fd, index: u32) -> io::Result<vfio_irq_info> {
    with(|w| {
        w.device_of(device)?;
        Ok(vfio_irq_info {
            argsz: 16,
            flags: 1, // VFIO_IRQ_INFO_EVENTFD
            index,
            count: if index == 2 { 3 } else { 1 },
        })
    })
}

pub(crate) fn device_set_irq_eventfds(device: &Fd, index: u32, fds: &[&Fd]) -> io::Result<()> {
    with(|w| {
        let d = w.device_of(device)?;
        if index != 2 || fds.len() > 3 {
            return Err(err(libc::EINVAL));
        }
        for fd in fds {
            if w.kind(fd)? != FdKind::EventFd {
                return Err(err(libc::EINVAL));
            }
        }
        w.devices[d].msix = fds.iter().map(|f| f.id).collect();
        Ok(())
    })
}

pub(crate) fn eventfd() -> io::Result<Fd> {
    with(|w| {
        let fd = w.open(FdKind::EventFd);
        w.eventfds.insert(fd.id, 0);
        Ok(fd)
    })
}

/// Single-threaded: reports a pending signal at once, and otherwise waits out (up to 1 ms of)
/// the timeout, since nothing can signal meanwhile.
pub(crate) fn eventfd_wait(fd: &Fd, timeout: std::time::Duration) -> io::Result<bool> {
    let signalled =
        with(|w| w.eventfds.get_mut(&fd.id).map(std::mem::take)).ok_or_else(|| err(libc::EBADF))?;
    if signalled == 0 {
        std::thread::sleep(timeout.min(std::time::Duration::from_millis(1)));
    }
    Ok(signalled > 0)
}

/// As [`eventfd_wait`]; `other` (a real waker eventfd) is not polled: single-threaded, nothing
/// can wake it meanwhile except the caller itself, which the sleep of at most 1 ms bounds.
pub(crate) fn eventfd_wait_or(
    fd: &Fd,
    _other: std::os::fd::BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> io::Result<bool> {
    eventfd_wait(fd, timeout)
}

pub(crate) fn region_read(device: &Fd, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    with(|w| {
        let d = w.device_of(device)?;
        let base = u64::from(CONFIG_REGION) << REGION_SHIFT;
        let at = offset.checked_sub(base).ok_or_else(|| err(libc::EINVAL))? as usize;
        let src = w.devices[d]
            .config
            .get(at..at + buf.len())
            .ok_or_else(|| err(libc::EINVAL))?;
        buf.copy_from_slice(src);
        Ok(())
    })
}

pub(crate) fn region_write(device: &Fd, offset: u64, buf: &[u8]) -> io::Result<()> {
    with(|w| {
        let d = w.device_of(device)?;
        let base = u64::from(CONFIG_REGION) << REGION_SHIFT;
        let at = offset.checked_sub(base).ok_or_else(|| err(libc::EINVAL))? as usize;
        let dst = w.devices[d]
            .config
            .get_mut(at..at + buf.len())
            .ok_or_else(|| err(libc::EINVAL))?;
        dst.copy_from_slice(buf);
        Ok(())
    })
}

pub(crate) fn map_region(device: &Fd, offset: u64, len: usize) -> io::Result<Mmio> {
    with(|w| {
        let d = w.device_of(device)?;
        if offset != u64::from(BAR4) << REGION_SHIFT || len > BAR4_LEN {
            return Err(err(libc::EINVAL));
        }
        Ok(Mmio { dev: d, len })
    })
}

/// # Safety
/// As `sys::dma_map`: the memory must stay alive until unmapped (the fake device reads and
/// writes it through the mapping).
pub(crate) unsafe fn dma_map(
    container: &Fd,
    vaddr: *mut u8,
    iova: u64,
    size: u64,
    read: bool,
    write: bool,
) -> io::Result<()> {
    with(|w| {
        if !w.iommu_set.contains_key(&container.id) {
            return Err(err(libc::EINVAL));
        }
        if !read && !write || size == 0 || iova % 4096 != 0 || size % 4096 != 0 {
            return Err(err(libc::EINVAL));
        }
        let maps = w.iommu.entry(container.id).or_default();
        let overlaps = maps
            .range(..iova + size)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > iova);
        if overlaps {
            return Err(err(libc::EEXIST));
        }
        maps.insert(
            iova,
            IommuMap {
                vaddr: vaddr as usize,
                size,
                read,
                write,
            },
        );
        Ok(())
    })
}

pub(crate) fn dma_unmap(container: &Fd, iova: u64, size: u64) -> io::Result<u64> {
    with(|w| {
        if !w.iommu_set.contains_key(&container.id) {
            return Err(err(libc::EINVAL));
        }
        let maps = w.iommu.entry(container.id).or_default();
        let inside: Vec<u64> = maps
            .range(iova..iova.saturating_add(size))
            .filter(|(&s, m)| s + m.size <= iova + size)
            .map(|(&s, _)| s)
            .collect();
        let mut total = 0;
        for s in inside {
            total += maps.remove(&s).map_or(0, |m| m.size);
        }
        Ok(total)
    })
}

/// Records the lock of every page of `[addr, addr + len)` (page-aligned).
pub(crate) fn mlock(addr: usize, len: usize) -> io::Result<()> {
    if addr % 4096 != 0 || len % 4096 != 0 {
        return Err(err(libc::EINVAL));
    }
    with(|w| {
        for page in (addr..addr + len).step_by(4096) {
            *w.locked_pages.entry(page).or_default() += 1;
        }
        Ok(())
    })
}

/// Removes the lock of every page of `[addr, addr + len)`.
pub(crate) fn munlock(addr: usize, len: usize) -> io::Result<()> {
    with(|w| {
        for page in (addr..addr + len).step_by(4096) {
            if let Some(n) = w.locked_pages.get_mut(&page) {
                *n -= 1;
                if *n == 0 {
                    w.locked_pages.remove(&page);
                }
            }
        }
        Ok(())
    })
}

/// Bytes of `[addr, addr + len)` the fake's IOMMU maps for device `dev`, and whether each
/// mapped byte is device-writable (`(mapped, writable)`).
pub(crate) fn mapped_bytes(dev: usize, addr: usize, len: usize) -> (usize, usize) {
    with(|w| {
        let Some(c) = w.container_of(dev) else {
            return (0, 0);
        };
        let (mut mapped, mut writable) = (0, 0);
        for m in w.iommu.get(&c).into_iter().flat_map(|m| m.values()) {
            let s = m.vaddr.max(addr);
            let e = (m.vaddr + m.size as usize).min(addr + len);
            if s < e {
                mapped += e - s;
                if m.write {
                    writable += e - s;
                }
            }
        }
        (mapped, writable)
    })
}

/// A fake BAR mapping: accesses go to the device model.
#[derive(Debug)]
pub(crate) struct Mmio {
    dev: usize,
    len: usize,
}

impl Mmio {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, offset: usize, size: usize) -> Option<()> {
        (offset.checked_add(size)? <= self.len && offset % size == 0).then_some(())
    }

    pub(crate) fn read8(&self, offset: usize) -> Option<u8> {
        self.check(offset, 1)?;
        Some(with(|w| w.mmio_read(self.dev, offset, 1)) as u8)
    }
    pub(crate) fn read16(&self, offset: usize) -> Option<u16> {
        self.check(offset, 2)?;
        Some(with(|w| w.mmio_read(self.dev, offset, 2)) as u16)
    }
    pub(crate) fn read32(&self, offset: usize) -> Option<u32> {
        self.check(offset, 4)?;
        Some(with(|w| w.mmio_read(self.dev, offset, 4)))
    }
    pub(crate) fn write8(&self, offset: usize, value: u8) -> Option<()> {
        self.check(offset, 1)?;
        with(|w| w.mmio_write(self.dev, offset, u32::from(value)));
        Some(())
    }
    pub(crate) fn write16(&self, offset: usize, value: u16) -> Option<()> {
        self.check(offset, 2)?;
        with(|w| w.mmio_write(self.dev, offset, u32::from(value)));
        Some(())
    }
    pub(crate) fn write32(&self, offset: usize, value: u32) -> Option<()> {
        self.check(offset, 4)?;
        with(|w| w.mmio_write(self.dev, offset, value));
        Some(())
    }
}
