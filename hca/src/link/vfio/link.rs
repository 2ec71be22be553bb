//! [`VfioLink`]: the software HCA's engine over a virtio-net NIC that this process drives itself.
//!
//! The link owns the NIC's queues and the layer-2/3 duties a kernel would do: it answers ARP and
//! Neighbor Solicitations for its addresses, resolves its peers' MAC addresses (or takes them from
//! static entries), writes Ethernet/IP/UDP headers around the engine's RoCEv2 UDP payloads and
//! takes them off received frames. One [`VfioLink::poll`] is one round of progress: a burst of
//! received frames into the engine, due timers, and everything the engine has to send: headers
//! built straight into transmit slots in DMA memory, payloads left in registered memory and
//! reached by the chain's descriptors, handed to the device with one notification.
//!
//! Memory regions registered through [`VfioLink::reg_mr`] or a device's verbs
//! ([`crate::link::Link::map_memory`]) have their pages mapped into the device's IOMMU context,
//! device-read-only, for as long as they are registered, and unmapped on deregistration once no
//! descriptor points into them: the device can read registered memory and reach nothing else
//! besides the link's own rings and buffers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{Memory, PageBacking};
use roce::packet::TransportRepr;
use roce::{icrc, Gid};

use crate::engine::{EngineConfig, GatherTransmit, Instant, SoftHca};
use crate::verbs::device::Device;
use crate::verbs::gid::{GidEntry, GidType};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;

use super::device::PciAddress;
use super::dma::MrExtent;
use super::error::VfioError;
use super::frame::{self, LocalAddrs, Received};
use super::mr_map::MrMappings;
use super::neigh::{Action, NeighbourCounters, NeighbourState, Neighbours};
use super::net::{
    DmaPiece, NetConfig, NicCounters, TxQueue, VirtioNet, TX_HEADROOM, TX_TRAILER_ROOM,
};
use super::virtqueue::MAX_CHAIN;

/// Configuration of a [`VfioLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioLinkConfig {
    /// The NIC: a modern virtio-net PCI function bound to `vfio-pci`.
    pub device: PciAddress,
    /// The link's IPv4 address (its IPv4-mapped GID is added to the GID table). The IPv6
    /// link-local address, `fe80::` + the MAC's EUI-64, is always there (GID indexes 0 and 1).
    pub ipv4: Option<Ipv4Addr>,
    /// Neighbours whose MAC address is known in advance: no ARP / Neighbor Discovery for them.
    pub static_neighbours: Vec<(IpAddr, [u8; 6])>,
    /// Receive queue size wanted (descriptors, a power of two; capped at the device's maximum).
    pub rx_queue_size: u16,
    /// Transmit queue size wanted.
    pub tx_queue_size: u16,
    /// Receive buffers are handed back to the device in batches of this many.
    pub rx_refill_batch: usize,
    /// Most frames one [`VfioLink::poll`] takes from the receive queue.
    pub rx_burst: usize,
    /// Bound on the device reset (at open and close).
    pub reset_timeout: Duration,
    /// Take receive interrupts (MSI-X vector 0 through VFIO, signalled on an eventfd) so that
    /// [`VfioLink::wait`] can sleep; off by default: the link is busy-polled and the device
    /// never interrupts.
    pub interrupts: bool,
}

impl VfioLinkConfig {
    /// Defaults for `device`: no IPv4 address, 256-descriptor queues, refill batches of 32,
    /// bursts of 64, a 1 s reset bound.
    pub fn new(device: PciAddress) -> VfioLinkConfig {
        let net = NetConfig::default();
        VfioLinkConfig {
            device,
            ipv4: None,
            static_neighbours: Vec::new(),
            rx_queue_size: net.rx_queue_size,
            tx_queue_size: net.tx_queue_size,
            rx_refill_batch: net.rx_refill_batch,
            rx_burst: 64,
            reset_timeout: net.reset_timeout,
            interrupts: false,
        }
    }
}

/// Counters of a [`VfioLink`]: its layer-2/3 work, the NIC's and the neighbour table's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VfioLinkCounters {
    /// RoCEv2 datagrams handed to the engine.
    pub rx_roce: u64,
    /// ARP packets received.
    pub rx_arp: u64,
    /// Neighbor Solicitations and Advertisements received.
    pub rx_ndp: u64,
    /// Frames for another MAC or IP address (a hub delivers everything).
    pub rx_not_for_us: u64,
    /// Frames with malformed or truncated headers.
    pub rx_malformed: u64,
    /// Frames of protocols this link does not serve.
    pub rx_unsupported: u64,
    /// RoCEv2 packets sent.
    pub tx_roce: u64,
    /// RoCEv2 packets sent as a descriptor chain whose payload descriptors point straight into
    /// registered memory (headers and trailer in a slot): no CPU copy of the payload.
    pub tx_gathered: u64,
    /// Packets whose payload the engine left in registered memory but the link copied into a
    /// slot: memory not mapped into the IOMMU, more pieces than one chain or the free
    /// descriptors allow, or a destination MAC not resolved yet (the frame waits as bytes).
    /// Payloads the engine copied itself (UC, UD, inline, GPU memory) are counted by the
    /// engine (`Counters::tx_copied_pkts`).
    pub tx_gather_copied: u64,
    /// Engine packets dropped because the frame exceeds the link MTU.
    pub tx_oversize: u64,
    /// Engine packets dropped because their addresses cannot be sent (mixed families).
    pub tx_unroutable: u64,
    /// Frames dropped for lack of a transmit slot (ARP/NDP answers, frames released by
    /// resolution); engine packets are never dropped for that: they wait in the engine.
    pub tx_no_slot: u64,
    /// The NIC's counters.
    pub nic: NicCounters,
    /// The neighbour table's counters.
    pub neighbours: NeighbourCounters,
}

/// What one [`VfioLink::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Frames received.
    pub rx: usize,
    /// Engine packets handed to the device.
    pub tx: usize,
}

impl Progress {
    /// Whether nothing happened.
    pub fn is_idle(&self) -> bool {
        self.rx == 0 && self.tx == 0
    }
}

/// Bytes of a memory region registered through the link: the payload source of a zero-copy
/// [`VfioLink::send_gather`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrSlice {
    /// The region's lkey.
    pub lkey: u32,
    /// Byte offset in the memory the region was registered over.
    pub offset: usize,
    /// Length in bytes.
    pub len: u32,
}

/// How long [`VfioLink::dereg_mr`] waits for the device to finish reading a region that
/// zero-copy frames point into.
const DEREG_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`VfioLink::run_until`] does while nothing happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Busy-poll: lowest latency, one core at 100 %.
    Spin,
    /// Busy-poll, yielding the CPU between idle rounds (for a core shared with the peer).
    Yield,
    /// After this many idle rounds in a row, sleep this long between rounds.
    Sleep {
        /// Idle rounds before sleeping.
        after: u32,
        /// Sleep per idle round.
        sleep: Duration,
    },
    /// After this many idle rounds in a row, sleep in [`VfioLink::wait`] until a frame arrives
    /// (an MSI-X interrupt) or a timer is due; needs [`VfioLinkConfig::interrupts`].
    Interrupt {
        /// Idle rounds before sleeping.
        after: u32,
    },
}

/// How often [`VfioLink::run_until`] reads the device status to catch a device that stopped.
const STATUS_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The software HCA's link over a virtio-net NIC driven through VFIO. See the module docs.
#[derive(Debug)]
pub struct VfioLink {
    // Registered memory is unmapped before the NIC (and its container) goes; extents that
    // transmit slots still hold go with the NIC's queues, after the device reset.
    mrs: MrMappings,
    /// Extents a chain being built points into (moved into the slot when posted).
    pin_scratch: Vec<Arc<MrExtent>>,
    nic: VirtioNet,
    me: LocalAddrs,
    neigh: Neighbours,
    origin: std::time::Instant,
    counters: VfioLinkCounters,
    rx_burst: usize,
    /// Receive interrupts were asked for before a sleep ([`crate::link::Link::arm_wakeup`]).
    armed: bool,
    /// Interrupts that woke a progress thread's [`VfioPoller`].
    poller_interrupts: Arc<std::sync::atomic::AtomicU64>,
}

impl VfioLink {
    /// Opens the NIC and brings it up (see the `vfio` module docs for every step).
    ///
    /// # Errors
    /// Every [`VfioError`] of opening and initialising the device.
    pub fn open(config: &VfioLinkConfig) -> Result<VfioLink, VfioError> {
        if config.rx_burst == 0 {
            return Err(VfioError::Config {
                what: "rx_burst must be at least 1".into(),
            });
        }
        let net = NetConfig {
            rx_queue_size: config.rx_queue_size,
            tx_queue_size: config.tx_queue_size,
            rx_refill_batch: config.rx_refill_batch,
            reset_timeout: config.reset_timeout,
            interrupts: config.interrupts,
            ..NetConfig::default()
        };
        let nic = VirtioNet::open(&config.device, &net)?;
        let mac = nic.mac();
        let me = LocalAddrs {
            mac,
            ipv4: config.ipv4,
            ipv6_ll: Gid::link_local_from_mac(mac).to_ipv6(),
        };
        let mut neigh = Neighbours::default();
        for &(ip, mac) in &config.static_neighbours {
            neigh.add_static(ip, mac);
        }
        Ok(VfioLink {
            mrs: MrMappings::default(),
            pin_scratch: Vec::with_capacity(MAX_CHAIN),
            nic,
            me,
            neigh,
            origin: std::time::Instant::now(),
            counters: VfioLinkCounters::default(),
            rx_burst: config.rx_burst,
            armed: false,
            poller_interrupts: Arc::default(),
        })
    }

    /// The NIC's PCI address.
    pub fn name(&self) -> &str {
        self.nic.name()
    }

    /// The NIC's IOMMU group.
    pub fn iommu_group(&self) -> u32 {
        self.nic.iommu_group()
    }

    /// The NIC's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.me.mac
    }

    /// The link MTU (bytes of IP packet).
    pub fn mtu(&self) -> u16 {
        self.nic.mtu()
    }

    /// The virtio feature bits negotiated.
    pub fn features(&self) -> u64 {
        self.nic.features()
    }

    /// Receive and transmit queue sizes.
    pub fn queue_sizes(&self) -> (u16, u16) {
        self.nic.queue_sizes()
    }

    /// What backs the queues' DMA memory (receive, transmit) and whether it is locked.
    pub fn dma_backing(&self) -> (PageBacking, PageBacking, bool) {
        self.nic.backing()
    }

    /// The IPv4 address.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.me.ipv4
    }

    /// The IPv6 link-local address.
    pub fn ipv6_link_local(&self) -> Ipv6Addr {
        self.me.ipv6_ll
    }

    /// The engine's clock: time since the link was opened.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    /// The verbs device this link is: rxe's attributes for the MAC and MTU (see
    /// [`Device::soft_roce`]: link-local GID at indexes 0 and 1).
    pub fn device(&self) -> Device {
        Device::soft_roce(self.me.mac, u32::from(self.nic.mtu()))
    }

    /// A software HCA for this link: [`VfioLink::device`] plus the IPv4-mapped GID of the IPv4
    /// address (RoCEv2, index 2) when one is configured.
    pub fn new_soft_hca(&self, config: EngineConfig) -> SoftHca {
        let mut hca = SoftHca::new(self.device(), config);
        if let Some(v4) = self.me.ipv4 {
            // A fresh GID table has room, and an IPv4-mapped GID is never zero.
            let _ = hca.add_gid(
                1,
                GidEntry {
                    gid: Gid::from(v4),
                    gid_type: GidType::RoceV2,
                },
            );
        }
        hca
    }

    /// Adds a static neighbour entry (replacing a learned one).
    pub fn add_static_neighbour(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.neigh.add_static(ip, mac);
    }

    /// The resolved neighbours.
    pub fn neighbours(&self) -> Vec<(IpAddr, [u8; 6], NeighbourState)> {
        self.neigh.entries()
    }

    /// The counters.
    pub fn counters(&self) -> VfioLinkCounters {
        let mut nic = self.nic.counters();
        nic.interrupts += self
            .poller_interrupts
            .load(std::sync::atomic::Ordering::Relaxed);
        VfioLinkCounters {
            nic,
            neighbours: self.neigh.counters,
            ..self.counters
        }
    }

    // ---------------------------------------------------------------- memory registration

    /// ibv_reg_mr(3) over all of `memory` through this link: registers it with the engine as
    /// `iova .. iova + len` and maps its pages into the NIC's IOMMU context (device-read-only:
    /// transmit descriptors point at them; the kernel pins the pages and they are `mlock`ed),
    /// as [`crate::link::Link::map_memory`] does for a device's registrations. Memory without a
    /// host address is registered without a mapping (its payload is copied into transmit
    /// slots). The mapping lasts until [`VfioLink::dereg_mr`] (or the link is dropped).
    ///
    /// # Errors
    /// [`VfioError::Verbs`] when the engine refuses (nothing is mapped); the mapping's errors
    /// ([`VfioError::Dma`], [`VfioError::IovaExhausted`], [`VfioError::Pin`]): the region is then
    /// deregistered again.
    pub fn reg_mr(
        &mut self,
        hca: &mut SoftHca,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VfioError> {
        let len = memory.len();
        let mr = hca
            .reg_mr(pd, memory.clone(), iova, access)
            .map_err(|source| VfioError::Verbs {
                device: self.name().to_owned(),
                source,
            })?;
        if let Err(e) = self.map_region(mr.lkey(), &memory, 0, len) {
            let _ = hca.dereg_mr(mr.lkey());
            return Err(e);
        }
        Ok(mr)
    }

    /// ibv_dereg_mr(3): deregisters the region from the engine (its keys stop working at once:
    /// a remote access NAKs) and then removes the IOMMU mappings of its pages that no other
    /// registration uses, once the device has returned every descriptor pointing into them
    /// (waiting at most 1 s). Returns the device address range `(iova, len)` unmapped (`None`
    /// when nothing was: no host address, or pages shared with another registration), for
    /// checks such as [`VfioLink::iommu_probe_unmapped`].
    ///
    /// # Errors
    /// [`VfioError::UnknownMr`] when the engine does not know the lkey and nothing is mapped
    /// for it; [`VfioError::Verbs`] when the engine refuses otherwise (nothing is unmapped);
    /// [`VfioError::RegionBusy`] when the device kept reading (the region is deregistered and
    /// its mapping goes as soon as the device returns the descriptors); [`VfioError::Dma`] when
    /// the unmap fails.
    pub fn dereg_mr(
        &mut self,
        hca: &mut SoftHca,
        lkey: u32,
    ) -> Result<Option<(u64, u64)>, VfioError> {
        if let Err(source) = hca.dereg_mr(lkey) {
            return Err(if self.mrs.contains(lkey) {
                VfioError::Verbs {
                    device: self.name().to_owned(),
                    source,
                }
            } else {
                VfioError::UnknownMr {
                    device: self.name().to_owned(),
                    lkey,
                }
            });
        }
        self.unmap_region(lkey)
    }

    /// Maps the pages of bytes `[offset, offset + len)` of `memory` (region `lkey`).
    fn map_region(
        &mut self,
        lkey: u32,
        memory: &Arc<dyn Memory>,
        offset: usize,
        len: usize,
    ) -> Result<(), VfioError> {
        let container = self.nic.container().clone();
        self.mrs.map(&container, lkey, memory, offset, len)?;
        Ok(())
    }

    /// Forgets region `lkey`'s mapping and unmaps the extents no other registration holds once
    /// the device returned every chain pointing into them (bounded wait).
    fn unmap_region(&mut self, lkey: u32) -> Result<Option<(u64, u64)>, VfioError> {
        let Some(released) = self.mrs.unmap(lkey) else {
            return Ok(None);
        };
        if released.is_empty() {
            return Ok(None);
        }
        // Descriptors pointing into these pages must be returned first: the device would read
        // unmapped memory (an IOMMU fault) otherwise. Each posted chain holds an `Arc` of the
        // extents it uses, so an extent only we hold is one no descriptor points into.
        let start = std::time::Instant::now();
        loop {
            self.nic.tx().reclaim();
            if released.iter().all(|e| Arc::strong_count(e) == 1) {
                break;
            }
            let flushed = self.nic.flush();
            if flushed.is_err() || start.elapsed() >= DEREG_DRAIN_TIMEOUT {
                for e in released {
                    self.mrs.retire(e);
                }
                flushed?;
                return Err(VfioError::RegionBusy {
                    device: self.name().to_owned(),
                    lkey,
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let mut failed = None;
        for e in released {
            match Arc::try_unwrap(e) {
                Ok(extent) => match extent.unmap() {
                    Ok((iova, len)) => {
                        lo = lo.min(iova);
                        hi = hi.max(iova + len);
                    }
                    Err(err) => failed = Some(err),
                },
                Err(still_used) => self.mrs.retire(still_used),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((lo < hi).then(|| (lo, hi - lo))),
        }
    }

    /// The device address (IOVA) of the first byte of the memory behind registered region `lkey`,
    /// and its length: where descriptors point to reach it.
    /// With pages shared between registrations the range spans every extent the region uses.
    pub fn mr_dma_range(&self, lkey: u32) -> Option<(u64, u64)> {
        self.mrs.dma_range(lkey)
    }

    /// Asks the IOMMU (kernel) how many bytes of `[iova, iova + len)` are mapped, by unmapping the
    /// range: 0 means nothing was. Only for a range this link no longer uses (the one
    /// [`VfioLink::dereg_mr`] returned): a live mapping would be removed.
    ///
    /// # Errors
    /// [`VfioError::Dma`].
    pub fn iommu_probe_unmapped(&self, iova: u64, len: u64) -> Result<u64, VfioError> {
        if self.mrs.overlaps(iova, len) {
            return Err(VfioError::Config {
                what: format!("{len} bytes at iova {iova:#x} overlap a registered region"),
            });
        }
        self.nic.container().probe_unmapped(iova, len)
    }

    /// Bytes of this link's IOVA window not mapped.
    pub fn iova_free_bytes(&self) -> u64 {
        self.nic.container().iova_free_bytes()
    }

    // ---------------------------------------------------------------- progress

    /// One round of progress: up to `rx_burst` received frames (RoCEv2 to the engine, ARP and
    /// Neighbor Discovery answered), due engine and neighbour timers, then every packet the
    /// engine has to send (while transmit slots last), published with one notification.
    ///
    /// # Errors
    /// A failed MMIO notification ([`VfioError::Mmio`]): the device is unusable.
    pub fn poll(&mut self, hca: &mut SoftHca) -> Result<Progress, VfioError> {
        let now = self.now();
        let rx = self.receive(|d| hca.handle_datagram(now, d))?;
        if hca.poll_timeout().is_some_and(|t| t <= now) {
            hca.handle_timeout(now);
        }
        self.neighbour_timers(now);
        let tx = self.transmit(hca, now);
        self.nic.flush()?;
        Ok(Progress { rx, tx })
    }

    /// Runs [`VfioLink::poll`] until `done(hca)` returns true (checked after every round) or
    /// `timeout` passes; returns whether `done` was reached. Reads the device status every
    /// 100 ms so that a device that stopped is an error, not a hang.
    ///
    /// # Errors
    /// As [`VfioLink::poll`]; [`VfioError::DeviceNeedsReset`].
    pub fn run_until<F>(
        &mut self,
        hca: &mut SoftHca,
        timeout: Duration,
        idle: IdlePolicy,
        mut done: F,
    ) -> Result<bool, VfioError>
    where
        F: FnMut(&mut SoftHca) -> bool,
    {
        let start = std::time::Instant::now();
        let mut last_check = start;
        let mut idle_rounds = 0u32;
        loop {
            let p = self.poll(hca)?;
            if done(hca) {
                return Ok(true);
            }
            let now = std::time::Instant::now();
            if now.duration_since(start) >= timeout {
                return Ok(false);
            }
            if now.duration_since(last_check) >= STATUS_CHECK_INTERVAL {
                self.nic.check_status()?;
                last_check = now;
            }
            if p.is_idle() {
                idle_rounds = idle_rounds.saturating_add(1);
                match idle {
                    IdlePolicy::Spin => std::hint::spin_loop(),
                    IdlePolicy::Yield => std::thread::yield_now(),
                    IdlePolicy::Sleep { after, sleep } => {
                        if idle_rounds > after {
                            std::thread::sleep(sleep);
                        }
                    }
                    IdlePolicy::Interrupt { after } => {
                        if idle_rounds > after {
                            let left = timeout.saturating_sub(now.duration_since(start));
                            self.wait(hca, left.min(STATUS_CHECK_INTERVAL))?;
                        }
                    }
                }
            } else {
                idle_rounds = 0;
            }
        }
    }

    /// Sleeps until a frame arrives (a receive interrupt), the engine's or the neighbour table's
    /// next timer is due, or `max` passes; returns whether a frame is waiting. Transmit work is
    /// not waited for (the engine only makes some on an input or a timer). Without
    /// [`VfioLinkConfig::interrupts`] this sleeps until the timer or `max` (no frame can wake
    /// it), so poll instead.
    ///
    /// # Errors
    /// A failed poll(2) of the interrupt eventfd.
    pub fn wait(&mut self, hca: &mut SoftHca, max: Duration) -> Result<bool, VfioError> {
        let now = self.now();
        let next = [hca.poll_timeout(), self.neigh.next_timer()]
            .into_iter()
            .flatten()
            .min();
        let until_timer = next.map_or(max, |t| t.saturating_duration_since(now));
        let timeout = max.min(until_timer);
        if self.nic.interrupts() {
            self.nic.wait_rx(timeout)
        } else {
            if self.nic.wait_rx(Duration::ZERO)? {
                return Ok(true);
            }
            std::thread::sleep(timeout);
            self.nic.wait_rx(Duration::ZERO)
        }
    }

    /// Receives up to `rx_burst` frames: RoCEv2 datagrams go to `f`, ARP and Neighbor Discovery
    /// are handled here (answers are queued for the next flush). Returns the frames received.
    ///
    /// # Errors
    /// A failed MMIO notification.
    pub fn receive<F>(&mut self, mut f: F) -> Result<usize, VfioError>
    where
        F: FnMut(&crate::engine::Datagram<'_>),
    {
        let me = self.me;
        let VfioLink {
            nic,
            neigh,
            counters,
            rx_burst,
            ..
        } = self;
        nic.receive(*rx_burst, |frame, tx| {
            match frame::classify(frame, &me) {
                Received::Roce(d) => {
                    counters.rx_roce += 1;
                    f(&d);
                }
                Received::Arp {
                    request,
                    sender_mac,
                    sender_ip,
                    target_ip,
                } => {
                    counters.rx_arp += 1;
                    let for_me = Some(target_ip) == me.ipv4;
                    let sender = IpAddr::V4(sender_ip);
                    // RFC 826: update an existing entry from any packet; add one only from a
                    // packet addressed to this host.
                    if for_me || neigh.knows(&sender) {
                        let waiting = neigh.learn(sender, sender_mac);
                        send_waiting(tx, counters, waiting, sender_mac);
                    }
                    if request && for_me {
                        if let Some(my_ip) = me.ipv4 {
                            let sent = send_control(tx, |b| {
                                frame::write_arp(b, &me, my_ip, sender_ip, Some(sender_mac))
                            });
                            count_control(counters, neigh, sent, true);
                        }
                    }
                }
                Received::NeighborSolicit {
                    src_ip,
                    src_mac,
                    sender_ll,
                    target,
                } => {
                    counters.rx_ndp += 1;
                    let reply_mac = sender_ll.unwrap_or(src_mac);
                    if let (Some(ll), false) = (sender_ll, src_ip.is_unspecified()) {
                        let waiting = neigh.learn(IpAddr::V6(src_ip), ll);
                        send_waiting(tx, counters, waiting, ll);
                    }
                    let sent = send_control(tx, |b| {
                        frame::write_neighbor_advert(b, &me, &src_ip, reply_mac, &target)
                    });
                    count_control(counters, neigh, sent, true);
                }
                Received::NeighborAdvert { target, mac } => {
                    counters.rx_ndp += 1;
                    let waiting = neigh.learn(IpAddr::V6(target), mac);
                    send_waiting(tx, counters, waiting, mac);
                }
                Received::Ignored(why) => match why {
                    frame::Ignored::NotForUs => counters.rx_not_for_us += 1,
                    frame::Ignored::Malformed => counters.rx_malformed += 1,
                    frame::Ignored::Unsupported => counters.rx_unsupported += 1,
                },
            }
        })
    }

    fn neighbour_timers(&mut self, now: Instant) {
        if self.neigh.next_timer().is_none_or(|t| t > now) {
            return;
        }
        for ip in self.neigh.on_timer(now) {
            self.probe(ip);
        }
    }

    /// Sends an ARP request or Neighbor Solicitation for `ip`.
    fn probe(&mut self, ip: IpAddr) {
        let me = self.me;
        let sent = match ip {
            IpAddr::V4(v4) => match me.ipv4 {
                Some(my_ip) => {
                    send_control(self.nic.tx(), |b| frame::write_arp(b, &me, my_ip, v4, None))
                }
                None => false,
            },
            IpAddr::V6(v6) => send_control(self.nic.tx(), |b| {
                frame::write_neighbor_solicit(b, &me, &v6)
            }),
        };
        if !sent {
            self.counters.tx_no_slot += 1;
        }
    }

    /// Moves the engine's packets into transmit slots until the engine or the slots run out.
    /// Returns the packets posted.
    fn transmit(&mut self, hca: &mut SoftHca, now: Instant) -> usize {
        self.transmit_gather(now, |buf| hca.poll_transmit_gather(now, buf))
            .0
    }

    /// Moves packets that `build` makes (`SoftHca::poll_transmit_gather` into the buffer given)
    /// into transmit slots until `build` returns `None` or the slots or descriptors run out
    /// (back-pressure: the engine keeps what it has not built). Returns the packets posted and
    /// whether the ring ran out.
    ///
    /// A packet whose payload the engine left in registered memory goes out as one descriptor
    /// chain: [virtio-net header + Ethernet/IP/UDP + transport headers in the slot] -> one
    /// descriptor per IOMMU extent of each payload segment (the IOVAs [`VfioLink::reg_mr`] /
    /// [`crate::link::Link::map_memory`] mapped) -> [pad + ICRC at the end of the slot]. The
    /// slot keeps the segments (their memory) and the extents (their mappings) until the device
    /// returns the chain in the used ring. Indirect descriptors (VIRTIO_F_INDIRECT_DESC) are not
    /// negotiated: a chain longer than 16 descriptors, or than the free descriptors allow, is
    /// sent as a copy instead (counted in [`VfioLinkCounters::tx_gather_copied`]), as is a
    /// payload in memory not mapped, or one whose destination MAC is not known yet.
    fn transmit_gather<F>(&mut self, now: Instant, mut build: F) -> (usize, bool)
    where
        F: FnMut(&mut [u8]) -> Option<GatherTransmit>,
    {
        let mut posted = 0;
        let mut full = false;
        let max_ip = usize::from(self.nic.mtu());
        let src_mac = self.me.mac;
        // Slots of sent frames come back first (one load of the used index when there are none),
        // and with them the mappings of deregistered regions they kept.
        self.nic.tx().reclaim();
        self.mrs.sweep();
        loop {
            let VfioLink {
                nic,
                mrs,
                neigh,
                counters,
                pin_scratch,
                ..
            } = self;
            let tx = nic.tx();
            let free_desc = tx.free_descriptors();
            let slot_size = tx.slot_size();
            let trailer_at = slot_size - TX_TRAILER_ROOM;
            let Some((slot, buf)) = tx.take_slot() else {
                full = true;
                break;
            };
            let Some(payload) = buf.get_mut(TX_HEADROOM..trailer_at) else {
                tx.release(slot);
                break;
            };
            let Some(g) = build(payload) else {
                tx.release(slot);
                break;
            };
            let t = g.transmit;
            let ip_len = frame::roce_headers_len(&t.dst_ip) - 14 + t.len;
            if ip_len > max_ip {
                counters.tx_oversize += 1;
                tx.release(slot);
                continue;
            }
            let dst_mac = neigh.lookup(&t.dst_ip);
            let head_end = TX_HEADROOM + g.head_len();
            let mut pieces = [DmaPiece { iova: 0, len: 0 }; MAX_CHAIN];
            let mut n = 0;
            let gathered = g.segment_count() > 0 && dst_mac.is_some() && {
                // Header and trailer descriptors besides the payload's.
                let limit = (MAX_CHAIN.min(free_desc)).saturating_sub(2);
                let ok = g.segments().all(|seg| {
                    let Some(base) = seg.memory().host_ptr() else {
                        return false;
                    };
                    let va = base.as_ptr().as_ptr() as usize + seg.offset();
                    mrs.translate(va, seg.len(), &mut pieces[..limit], &mut n, |e| {
                        pin_scratch.push(e.clone())
                    })
                    .is_some()
                });
                if !ok {
                    pin_scratch.clear();
                }
                ok
            };
            if g.segment_count() > 0 && !gathered {
                // Linearize: the payload and trailer after the headers, as a copied packet.
                let copied = (|| {
                    let mut at = head_end;
                    for seg in g.segments() {
                        buf.get_mut(at..at + seg.len())?
                            .copy_from_slice(seg.bytes());
                        at += seg.len();
                    }
                    buf.get_mut(at..at + g.trailer().len())?
                        .copy_from_slice(g.trailer());
                    (at + g.trailer().len() == TX_HEADROOM + t.len).then_some(())
                })();
                if copied.is_none() {
                    counters.tx_oversize += 1;
                    tx.release(slot);
                    continue;
                }
                counters.tx_gather_copied += 1;
            }
            let Some(start) =
                frame::write_roce_headers(buf, TX_HEADROOM, &t, src_mac, dst_mac.unwrap_or([0; 6]))
            else {
                counters.tx_unroutable += 1;
                pin_scratch.clear();
                tx.release(slot);
                continue;
            };
            if gathered {
                let trailer = g.trailer();
                let Some(dst) = buf.get_mut(trailer_at..trailer_at + trailer.len()) else {
                    pin_scratch.clear();
                    tx.release(slot);
                    continue;
                };
                dst.copy_from_slice(trailer);
                let tl = trailer.len();
                if tx.post_chain(
                    slot,
                    start,
                    head_end - start,
                    &pieces[..n],
                    Some((trailer_at, tl)),
                ) {
                    tx.pin(slot, g.segments(), pin_scratch);
                    posted += 1;
                    counters.tx_roce += 1;
                    counters.tx_gathered += 1;
                } else {
                    pin_scratch.clear();
                    counters.tx_no_slot += 1;
                }
                continue;
            }
            let end = TX_HEADROOM + t.len;
            if dst_mac.is_some() {
                if tx.post(slot, start, end - start) {
                    posted += 1;
                    counters.tx_roce += 1;
                } else {
                    counters.tx_no_slot += 1;
                }
                continue;
            }
            let action = neigh.queue(t.dst_ip, &buf[start..end], now);
            tx.release(slot);
            if let Action::Probe(ip) = action {
                self.probe(ip);
            }
        }
        (posted, full)
    }

    /// Sends one RoCEv2 datagram outside the engine: `payload` is a whole UDP payload (BTH ..
    /// ICRC) with the header fields `tx` gives (`tx.len` is ignored), copied into a transmit
    /// slot. Published by the next [`VfioLink::flush`] or [`VfioLink::poll`].
    ///
    /// # Errors
    /// [`VfioError::TxRingFull`], [`VfioError::FrameTooLong`], [`VfioError::Config`] for mixed
    /// address families. An unresolved neighbour queues the frame (sent once resolved).
    pub fn send(&mut self, tx: &crate::engine::Transmit, payload: &[u8]) -> Result<(), VfioError> {
        let now = self.now();
        let t = crate::engine::Transmit {
            len: payload.len(),
            ..*tx
        };
        let name = self.name().to_owned();
        let max_ip = usize::from(self.nic.mtu());
        let ip_len = frame::roce_headers_len(&t.dst_ip) - 14 + t.len;
        let (queue_size, slot_room) = (self.nic.queue_sizes().1, {
            let q = self.nic.tx();
            q.slot_size() - TX_HEADROOM
        });
        if ip_len > max_ip || t.len > slot_room {
            return Err(VfioError::FrameTooLong {
                device: name,
                len: ip_len + 14,
                max: (max_ip + 14).min(slot_room + 14),
            });
        }
        let src_mac = self.me.mac;
        let dst_mac = self.neigh.lookup(&t.dst_ip);
        let q = self.nic.tx();
        let Some((slot, buf)) = q.take_slot() else {
            return Err(VfioError::TxRingFull {
                device: name,
                queue_size,
            });
        };
        buf[TX_HEADROOM..TX_HEADROOM + t.len].copy_from_slice(payload);
        let Some(start) =
            frame::write_roce_headers(buf, TX_HEADROOM, &t, src_mac, dst_mac.unwrap_or([0; 6]))
        else {
            q.release(slot);
            return Err(VfioError::Config {
                what: format!("cannot send from {} to {}", t.src_ip, t.dst_ip),
            });
        };
        let end = TX_HEADROOM + t.len;
        if dst_mac.is_some() {
            if q.post(slot, start, end - start) {
                self.counters.tx_roce += 1;
                return Ok(());
            }
            return Err(VfioError::TxRingFull {
                device: name,
                queue_size,
            });
        }
        let action = self.neigh.queue(t.dst_ip, &buf[start..end], now);
        q.release(slot);
        if let Action::Probe(ip) = action {
            self.probe(ip);
        }
        Ok(())
    }

    /// Sends one RoCEv2 packet without copying its payload: the headers (Ethernet, IP and UDP from
    /// `route`, BTH and extended headers from `transport`, PadCnt set here) go into a transmit
    /// slot, the payload descriptors point straight at `payload` in registered memory (mapped in
    /// the IOMMU by [`VfioLink::reg_mr`]), and the pad and ICRC follow in the slot. The CPU reads
    /// the payload once, for the ICRC, and copies none of it. `route.len` is ignored. Published by
    /// the next [`VfioLink::flush`] or [`VfioLink::poll`]; [`VfioLink::dereg_mr`] waits until the
    /// device has sent it.
    ///
    /// # Errors
    /// [`VfioError::UnknownMr`] for a slice not registered through this link;
    /// [`VfioError::Config`] for a slice outside its region, more than 14 slices, headers that do
    /// not build or mixed address families; [`VfioError::FrameTooLong`];
    /// [`VfioError::Unresolved`] when the destination's MAC is not known (a request goes out);
    /// [`VfioError::TxRingFull`].
    pub fn send_gather(
        &mut self,
        route: &crate::engine::Transmit,
        transport: &TransportRepr,
        payload: &[MrSlice],
    ) -> Result<(), VfioError> {
        let name = self.name().to_owned();
        let config = |what: String| VfioError::Config { what };
        if payload.len() > MAX_CHAIN - 2 {
            return Err(config(format!(
                "{} payload slices; at most {} fit one descriptor chain",
                payload.len(),
                MAX_CHAIN - 2
            )));
        }
        let mut pieces = [DmaPiece { iova: 0, len: 0 }; MAX_CHAIN];
        let mut n = 0;
        let mut total = 0usize;
        for s in payload {
            let Some((_, va)) = self.mrs.region_bytes(s.lkey, s.offset, s.len as usize) else {
                if !self.mrs.contains(s.lkey) {
                    return Err(VfioError::UnknownMr {
                        device: name.clone(),
                        lkey: s.lkey,
                    });
                }
                return Err(config(format!(
                    "{} bytes at offset {} lie outside region {:#x}",
                    s.len, s.offset, s.lkey
                )));
            };
            let pin_scratch = &mut self.pin_scratch;
            let limit = MAX_CHAIN - 2;
            if self
                .mrs
                .translate(va, s.len as usize, &mut pieces[..limit], &mut n, |e| {
                    pin_scratch.push(e.clone())
                })
                .is_none()
            {
                self.pin_scratch.clear();
                return Err(config(format!(
                    "the payload's pages need more than {limit} descriptors"
                )));
            }
            total += s.len as usize;
        }
        let pieces = &pieces[..n];
        let r = self.post_gather(route, transport, payload, pieces, total);
        // The extents go into the slot when posted; on an error nothing may keep them.
        self.pin_scratch.clear();
        r
    }

    /// The rest of [`VfioLink::send_gather`], once the payload's pieces are known.
    fn post_gather(
        &mut self,
        route: &crate::engine::Transmit,
        transport: &TransportRepr,
        payload: &[MrSlice],
        pieces: &[DmaPiece],
        total: usize,
    ) -> Result<(), VfioError> {
        let name = self.name().to_owned();
        let config = |what: String| VfioError::Config { what };
        let pad = usize::from(roce::mtu::pad_cnt(total));
        let mut t = *transport;
        t.bth.pad_cnt = pad as u8;
        let hdr_len = t.header_len();
        let tx = crate::engine::Transmit {
            len: hdr_len + total + pad + icrc::ICRC_LEN,
            ..*route
        };
        let headers = frame::roce_headers_len(&tx.dst_ip);
        let max_ip = usize::from(self.nic.mtu());
        if headers - 14 + tx.len > max_ip {
            return Err(VfioError::FrameTooLong {
                device: name,
                len: headers + tx.len,
                max: max_ip + 14,
            });
        }
        let Some(dst_mac) = self.neigh.lookup(&tx.dst_ip) else {
            if let Action::Probe(ip) = self.neigh.queue(tx.dst_ip, &[], self.now()) {
                self.probe(ip);
            }
            return Err(VfioError::Unresolved {
                device: name,
                ip: tx.dst_ip,
            });
        };
        let src_mac = self.me.mac;
        let queue_size = self.nic.queue_sizes().1;
        let VfioLink {
            nic,
            mrs,
            pin_scratch,
            counters,
            ..
        } = self;
        let q = nic.tx();
        let slot_size = q.slot_size();
        let Some((slot, buf)) = q.take_slot() else {
            return Err(VfioError::TxRingFull {
                device: name,
                queue_size,
            });
        };
        let built = (|| {
            let hdr_end = TX_HEADROOM + hdr_len;
            t.emit(buf.get_mut(TX_HEADROOM..hdr_end)?).ok()?;
            let start = frame::write_roce_headers(buf, TX_HEADROOM, &tx, src_mac, dst_mac)?;
            let ip_at = start + 14;
            let udp_at = TX_HEADROOM - 8;
            let mut h = icrc::Hasher::new(
                buf.get(ip_at..udp_at)?,
                buf.get(udp_at..TX_HEADROOM)?,
                buf.get(TX_HEADROOM..hdr_end)?,
            )
            .ok()?;
            // The ICRC covers the payload: read it (in cache-sized pieces), never copy it out.
            let mut chunk = [0u8; 2048];
            for s in payload {
                let mem = mrs.region_bytes(s.lkey, s.offset, s.len as usize)?.0;
                let mut done = 0usize;
                while done < s.len as usize {
                    let n = (s.len as usize - done).min(chunk.len());
                    mem.read(s.offset + done, &mut chunk[..n]).ok()?;
                    h.update(&chunk[..n]);
                    done += n;
                }
            }
            let zeros = [0u8; 3];
            h.update(&zeros[..pad]);
            let trailer_at = slot_size - TX_TRAILER_ROOM;
            let trailer = buf.get_mut(trailer_at..trailer_at + pad + icrc::ICRC_LEN)?;
            trailer[..pad].fill(0);
            trailer[pad..].copy_from_slice(&icrc::to_wire(h.finalize()));
            Some((start, hdr_end - start, trailer_at))
        })();
        let Some((start, len, trailer_at)) = built else {
            q.release(slot);
            return Err(config(format!(
                "cannot build the headers of a packet from {} to {}",
                tx.src_ip, tx.dst_ip
            )));
        };
        if !q.post_chain(
            slot,
            start,
            len,
            pieces,
            Some((trailer_at, pad + icrc::ICRC_LEN)),
        ) {
            return Err(VfioError::TxRingFull {
                device: name,
                queue_size,
            });
        }
        q.pin(slot, std::iter::empty(), pin_scratch);
        counters.tx_roce += 1;
        counters.tx_gathered += 1;
        Ok(())
    }

    /// Publishes posted frames to the device (one notification, if the device wants one).
    ///
    /// # Errors
    /// A failed MMIO notification.
    pub fn flush(&mut self) -> Result<(), VfioError> {
        self.nic.flush()
    }

    /// Frames handed to the device and not yet sent.
    pub fn tx_outstanding(&self) -> u16 {
        self.nic.tx_outstanding()
    }

    /// Checks the device status (an MMIO read).
    ///
    /// # Errors
    /// [`VfioError::DeviceNeedsReset`] when the device stopped.
    pub fn check_status(&self) -> Result<(), VfioError> {
        self.nic.check_status()
    }
}

/// Copies a control frame (ARP, NDP) built by `build` into a slot and posts it.
fn send_control<F>(tx: &mut TxQueue, build: F) -> bool
where
    F: FnOnce(&mut [u8]) -> Option<usize>,
{
    let Some((slot, buf)) = tx.take_slot() else {
        return false;
    };
    let start = TX_HEADROOM;
    let Some(len) = buf.get_mut(start..).and_then(build) else {
        tx.release(slot);
        return false;
    };
    tx.post(slot, start, len)
}

fn count_control(counters: &mut VfioLinkCounters, neigh: &mut Neighbours, sent: bool, reply: bool) {
    if !sent {
        counters.tx_no_slot += 1;
    } else if reply {
        neigh.counters.replies_sent += 1;
    }
}

/// Sends frames that waited for `mac` (their destination MAC filled in now).
fn send_waiting(
    tx: &mut TxQueue,
    counters: &mut VfioLinkCounters,
    waiting: Vec<Vec<u8>>,
    mac: [u8; 6],
) {
    for mut f in waiting {
        if f.len() >= 6 {
            f[..6].copy_from_slice(&mac);
        }
        let sent = send_control(tx, |b| {
            let dst = b.get_mut(..f.len())?;
            dst.copy_from_slice(&f);
            Some(f.len())
        });
        if sent {
            counters.tx_roce += 1;
        } else {
            counters.tx_no_slot += 1;
        }
    }
}

/// Idle rounds a progress thread spins on a VFIO link before it sleeps.
const SPIN_ROUNDS: u32 = 200;

/// Longest sleep of a progress thread on a busy-polled VFIO link (nothing can wake it but a
/// verb): the receive latency an idle device adds.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// What a progress thread sleeps on over a [`VfioLink`]: the NIC's MSI-X eventfd (with
/// [`VfioLinkConfig::interrupts`]) and the device's waker; without interrupts a short sleep
/// (50 µs), the link being busy-polled.
#[derive(Debug)]
pub struct VfioPoller {
    irq: Option<Arc<super::os::Fd>>,
    device: String,
    interrupts: Arc<std::sync::atomic::AtomicU64>,
}

impl crate::link::LinkWait for VfioPoller {
    type Error = VfioError;

    fn wait(
        &self,
        _writable: bool,
        waker: &crate::link::Waker,
        timeout: Duration,
    ) -> Result<(), VfioError> {
        use std::os::fd::AsFd;
        let woken_err = |e: crate::link::LinkError| VfioError::Config {
            what: format!("{}: waker: {e}", self.device),
        };
        match &self.irq {
            Some(irq) => {
                let signalled =
                    super::os::eventfd_wait_or(irq, waker.as_fd(), timeout).map_err(|source| {
                        VfioError::Ioctl {
                            device: self.device.clone(),
                            op: "poll of the interrupt eventfd",
                            source,
                        }
                    })?;
                if signalled {
                    // A statistic only: no ordering with other memory.
                    self.interrupts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            None => std::thread::sleep(timeout.min(POLL_SLEEP)),
        }
        waker.take().map(|_| ()).map_err(woken_err)
    }
}

impl crate::link::Link for VfioLink {
    type Error = VfioError;
    type Poller = VfioPoller;
    type Counters = VfioLinkCounters;

    fn name(&self) -> String {
        format!("vfio:{}", self.nic.name())
    }

    /// The IPv4 address if one is configured, else the IPv6 link-local one; UDP port 4791.
    fn local_addr(&self) -> std::net::SocketAddr {
        let ip = self.me.ipv4.map_or(IpAddr::V6(self.me.ipv6_ll), IpAddr::V4);
        std::net::SocketAddr::new(ip, roce::udp::ROCEV2_PORT)
    }

    /// [`VfioLink::device`] with the IPv4-mapped GID of the IPv4 address (RoCEv2, index 2)
    /// when one is configured.
    fn device(&self) -> Device {
        let mut dev = VfioLink::device(self);
        if let Some(v4) = self.me.ipv4 {
            // A fresh table has room, and an IPv4-mapped GID is never zero.
            let _ = dev.port.gids.add(GidEntry {
                gid: Gid::from(v4),
                gid_type: GidType::RoceV2,
            });
        }
        dev
    }

    fn mtu(&self) -> u32 {
        u32::from(self.nic.mtu())
    }

    fn counters(&self) -> VfioLinkCounters {
        VfioLink::counters(self)
    }

    /// Stops interrupts asked for before a sleep, runs due neighbour timers (their ARP / NDP
    /// requests are published at once), and says whether the receive queue has frames.
    fn recv(&mut self, _idle: bool) -> Result<crate::link::RecvState, VfioError> {
        if std::mem::take(&mut self.armed) {
            self.nic.disarm_rx_interrupt();
        }
        let now = self.now();
        if self.neigh.next_timer().is_some_and(|t| t <= now) {
            self.neighbour_timers(now);
            self.nic.flush()?;
        }
        Ok(crate::link::RecvState {
            waiting: usize::from(self.nic.rx_pending()),
        })
    }

    /// Receives up to `rx_burst` frames straight from their DMA buffers (RoCEv2 to `f`, ARP
    /// and Neighbor Discovery answered) and publishes the answers.
    fn deliver<F: FnMut(&crate::engine::Datagram<'_>)>(
        &mut self,
        f: F,
    ) -> Result<usize, VfioError> {
        let n = self.receive(f)?;
        self.nic.flush()?;
        Ok(n)
    }

    fn rx_full(&self, delivered: usize) -> bool {
        delivered >= self.rx_burst
    }

    /// The engine builds each packet's headers into a transmit slot in DMA memory
    /// ([`SoftHca::poll_transmit_gather`]); a payload in registered memory is not copied: the
    /// chain's payload descriptors point at its IOVAs (see `VfioLink::transmit_gather`).
    fn build(&mut self, engine: &mut SoftHca, now: Instant) -> (usize, bool) {
        let link_now = self.now();
        self.transmit_gather(link_now, |buf| engine.poll_transmit_gather(now, buf))
    }

    /// Frames posted to the transmit ring and not yet published ([`crate::link::Link::flush`] publishes
    /// them all).
    fn unsent(&self) -> usize {
        usize::from(self.nic.tx_unpublished())
    }

    /// Publishes the posted frames with at most one notification (an MMIO write).
    fn flush(&mut self) -> crate::link::FlushReport<VfioError> {
        crate::link::FlushReport {
            error: self.nic.flush().err(),
            ..crate::link::FlushReport::default()
        }
    }

    fn poller(&self) -> Result<VfioPoller, VfioError> {
        Ok(VfioPoller {
            irq: self.nic.irq_handle(),
            device: self.nic.name().to_owned(),
            interrupts: self.poller_interrupts.clone(),
        })
    }

    const ARMS_WAKEUP: bool = true;

    fn arm_wakeup(&mut self) -> bool {
        self.armed = self.nic.interrupts();
        self.nic.arm_rx_interrupt()
    }

    fn spin_rounds(&self) -> u32 {
        SPIN_ROUNDS
    }

    fn next_timer(&self) -> Option<Duration> {
        let now = self.now();
        self.neigh
            .next_timer()
            .map(|t| t.saturating_duration_since(now))
    }

    const MAPS_MEMORY: bool = true;

    /// Maps the pages of the region's bytes into the IOMMU, device-read-only, `mlock`ed unless
    /// the memory is locked already; pages shared with other registrations are mapped once and
    /// counted (module `mr_map`). Memory without a host address is not mapped.
    fn map_memory(
        &mut self,
        lkey: u32,
        memory: &Arc<dyn Memory>,
        offset: usize,
        len: usize,
    ) -> Result<(), VfioError> {
        self.map_region(lkey, memory, offset, len)
    }

    fn unmap_memory(&mut self, lkey: u32) -> Result<Option<(u64, u64)>, VfioError> {
        self.unmap_region(lkey)
    }
}
