//! An in-memory test fabric: any number of [`SoftHca`]s linked by IP address, a virtual clock,
//! and seeded, reproducible faults.
//!
//! The fabric is the link and the progress loop a real deployment would run, in simulation: it
//! polls every engine's transmit queue, carries each packet to the engine that owns its
//! destination address after a latency, and calls timeouts when the virtual clock reaches them.
//! Faults ([`Faults`]) are drawn from a seeded ChaCha8 generator, so a seed replays the same run
//! exactly: loss, duplication, reordering (extra delay), jitter, bit corruption (which the
//! receiver's ICRC check must catch) and ECN CE marking. Nothing depends on the wall clock.
//!
//! With `std`, [`device::FabricGroup`] puts a fabric behind a mutex and gives each engine a
//! [`crate::verbs::Verbs`] device ([`device::FabricDevice`]), so that programs written against
//! `dyn Verbs` run on the fabric unchanged.
//!
//! ```
//! # use hca::fabric::{Fabric, Faults};
//! # use core::time::Duration;
//! let mut fabric = Fabric::new(7, Faults::none());
//! let a = fabric.add_node(hca::fabric::soft_hca([10, 0, 0, 1].into(), 1500));
//! let b = fabric.add_node(hca::fabric::soft_hca([10, 0, 0, 2].into(), 1500));
//! // ... create QPs on `fabric.node_mut(a)` / `fabric.node_mut(b)`, post WRs, then:
//! let end = fabric.run_until(|_| true, Duration::from_millis(1));
//! assert!(end.is_ok());
//! # let _ = (a, b);
//! ```

#[cfg(feature = "std")]
pub mod device;
#[cfg(feature = "std")]
pub mod incast;
pub mod switch;

use alloc::boxed::Box;
use alloc::collections::BinaryHeap;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};
use core::net::IpAddr;
use core::time::Duration;

use rand::rngs::ChaCha8Rng;

use crate::verbs::random::RandomSource;
use rand::{RngExt, SeedableRng};
use roce::ipv4::Ecn;
use roce::Gid;

use crate::engine::{Datagram, EngineConfig, Instant, SoftHca, IPV4_IDENT, MAX_UDP_PAYLOAD};
use crate::verbs::device::Device;
use crate::verbs::gid::{GidEntry, GidType};

/// Fault probabilities (each in `0.0..=1.0`, per packet) and delays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by `reorder_delay`, so later ones overtake it.
    pub reorder: f64,
    /// Probability one random bit of the packet is flipped (the ICRC must catch it).
    pub corrupt: f64,
    /// Probability an ECN-capable packet is marked Congestion Experienced.
    pub ce_mark: f64,
    /// One-way latency of every packet.
    pub latency: Duration,
    /// Extra random delay, uniform in `0..=jitter`. Jitter keeps the order of the packets
    /// between two nodes (one path, as ECMP keeps a flow on one path); only `reorder` and
    /// `duplicate` make packets overtake each other.
    pub jitter: Duration,
    /// Extra delay of a reordered packet.
    pub reorder_delay: Duration,
}

impl Faults {
    /// A perfect link with 1 us latency.
    pub const fn none() -> Faults {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            ce_mark: 0.0,
            latency: Duration::from_micros(1),
            jitter: Duration::ZERO,
            reorder_delay: Duration::from_micros(3),
        }
    }
}

impl Default for Faults {
    fn default() -> Self {
        Faults::none()
    }
}

/// A node of the fabric (an index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(pub usize);

/// What happened to packets so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets engines transmitted.
    pub sent: u64,
    /// Packets handed to a destination engine.
    pub delivered: u64,
    /// Packets lost on purpose.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Packets delayed to be overtaken.
    pub reordered: u64,
    /// Packets with a flipped bit.
    pub corrupted: u64,
    /// Packets marked CE.
    pub ce_marked: u64,
    /// Packets to an address no node owns.
    pub unroutable: u64,
    /// Packets dropped because too many were in flight.
    pub overflow: u64,
    /// Packets a [`Tap`] dropped.
    pub tapped: u64,
}

/// A packet on its way, as a [`Tap`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WirePacket {
    /// Sending node.
    pub from: NodeId,
    /// Receiving node.
    pub to: NodeId,
    /// IP source address.
    pub src_ip: IpAddr,
    /// IP destination address.
    pub dst_ip: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// DSCP.
    pub dscp: u8,
    /// TTL / hop limit.
    pub hop_limit: u8,
    /// The UDP payload (BTH .. ICRC).
    pub data: Vec<u8>,
}

/// Inspects (and may change or drop) every packet an engine transmits, before faults apply.
/// Tests use it to capture, rewrite or replay packets.
pub trait Tap: Send {
    /// Returns false to drop the packet.
    fn on_packet(&mut self, now: Instant, packet: &mut WirePacket) -> bool;
}

/// Why [`Fabric::run_until`] stopped without its predicate holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunError {
    /// The virtual time limit passed.
    Timeout {
        /// The virtual time reached.
        now: Instant,
    },
    /// Nothing is in flight and no engine has a timer: nothing will ever happen again.
    Idle {
        /// The virtual time reached.
        now: Instant,
    },
    /// The step limit was reached (a livelock at one instant).
    TooManySteps {
        /// The virtual time reached.
        now: Instant,
    },
}

struct Node {
    hca: SoftHca,
    gids: Vec<Gid>,
}

struct InFlight {
    at: Instant,
    seq: u64,
    packet: WirePacket,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Most packets in flight at once (a bound; beyond it packets are dropped and counted).
pub const MAX_IN_FLIGHT: usize = 1 << 20;
/// Most packets taken from one engine in one step.
const MAX_TX_PER_STEP: usize = 1 << 16;

/// The fabric. See the [module docs](self).
pub struct Fabric {
    nodes: Vec<Node>,
    now: Instant,
    rng: ChaCha8Rng,
    faults: Faults,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    free: Vec<Vec<u8>>,
    buf: Vec<u8>,
    stats: FabricStats,
    tap: Option<Box<dyn Tap>>,
    /// The latest in-order arrival scheduled per path: `last_arrival[from][to]`.
    last_arrival: Vec<Vec<Instant>>,
    /// The switch every packet crosses, if any ([`Fabric::set_switch`]).
    switch: Option<switch::Switch>,
    /// Packets the switch delivered in the current step (reused).
    switch_out: Vec<(Instant, WirePacket)>,
}

impl core::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Fabric")
            .field("nodes", &self.nodes.len())
            .field("now", &self.now)
            .field("in_flight", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// A software HCA for the fabric: a soft-RoCE device (MAC derived from `ip`, Ethernet MTU
/// `eth_mtu` bytes, default [`EngineConfig`]) with a RoCEv2 GID for `ip` at index 2. Its MR keys
/// and QPNs come from the operating system's random source, as on every device.
#[cfg(feature = "std")]
pub fn soft_hca(ip: IpAddr, eth_mtu: u32) -> SoftHca {
    soft_hca_with(ip, eth_mtu, EngineConfig::default())
}

/// As [`soft_hca`] with an engine configuration.
#[cfg(feature = "std")]
pub fn soft_hca_with(ip: IpAddr, eth_mtu: u32, config: EngineConfig) -> SoftHca {
    soft_hca_random(
        ip,
        eth_mtu,
        config,
        Box::new(crate::verbs::random::OsRandom),
    )
}

/// A [`RandomSource`] seeded for reproducible simulations: the MR keys and QPNs of a run repeat
/// when the run does (tests that compare two runs byte for byte need this). For the in-memory
/// fabric only: anyone who knows the seed predicts every key and QPN.
#[derive(Debug)]
pub struct SeededRandom(ChaCha8Rng);

impl SeededRandom {
    /// A generator whose output is a function of `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRandom(ChaCha8Rng::seed_from_u64(seed))
    }
}

impl RandomSource for SeededRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        rand::Rng::fill_bytes(&mut self.0, buf);
    }
}

/// As [`soft_hca_with`], drawing MR keys and QPNs from `random` (e.g. a [`SeededRandom`]).
pub fn soft_hca_random(
    ip: IpAddr,
    eth_mtu: u32,
    config: EngineConfig,
    random: Box<dyn RandomSource>,
) -> SoftHca {
    let tail = Gid::from(ip).as_bytes()[12..16].to_vec();
    let mac = [2, 0, tail[0], tail[1], tail[2], tail[3]];
    let mut hca = SoftHca::with_random(Device::soft_roce(mac, eth_mtu), config, random);
    // A fresh GID table has room and the GID of an IP address is never zero.
    let _ = hca.add_gid(
        1,
        GidEntry {
            gid: Gid::from(ip),
            gid_type: GidType::RoceV2,
        },
    );
    hca
}

impl Fabric {
    /// An empty fabric whose faults are drawn from `seed`.
    pub fn new(seed: u64, faults: Faults) -> Fabric {
        Fabric {
            nodes: Vec::new(),
            now: Instant::ZERO,
            rng: ChaCha8Rng::seed_from_u64(seed),
            faults,
            queue: BinaryHeap::new(),
            seq: 0,
            free: Vec::new(),
            buf: vec![0; MAX_UDP_PAYLOAD],
            stats: FabricStats::default(),
            tap: None,
            last_arrival: Vec::new(),
            switch: None,
            switch_out: Vec::new(),
        }
    }

    /// Adds an engine; packets to any of its RoCEv2 GIDs (as configured now) reach it.
    pub fn add_node(&mut self, hca: SoftHca) -> NodeId {
        let gids = hca
            .context()
            .device()
            .port(1)
            .map(|p| {
                p.gids
                    .iter()
                    .filter(|(_, e)| e.gid_type == GidType::RoceV2)
                    .map(|(_, e)| e.gid)
                    .collect()
            })
            .unwrap_or_default();
        self.nodes.push(Node { hca, gids });
        NodeId(self.nodes.len() - 1)
    }

    /// The engine of a node.
    ///
    /// # Panics
    /// If `id` is not a node of this fabric (a test bug).
    pub fn node(&self, id: NodeId) -> &SoftHca {
        &self.nodes[id.0].hca
    }

    /// Mutable form of [`Fabric::node`].
    ///
    /// # Panics
    /// If `id` is not a node of this fabric.
    pub fn node_mut(&mut self, id: NodeId) -> &mut SoftHca {
        &mut self.nodes[id.0].hca
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Fault statistics.
    pub fn stats(&self) -> FabricStats {
        self.stats
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Changes the faults from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// Installs (or removes) the packet tap.
    pub fn set_tap(&mut self, tap: Option<Box<dyn Tap>>) {
        self.tap = tap;
    }

    /// Puts every node behind one switch ([`switch`]: line-rate NICs and ports, ECN marking, PFC
    /// or tail drop), or removes it (`None`; packets in it are lost). With a switch, packets
    /// take its path and timing instead of [`Faults`]: the faults no longer apply. RED's draws
    /// come from the fabric's seed.
    pub fn set_switch(&mut self, config: Option<switch::SwitchConfig>) {
        self.switch = config.map(|c| switch::Switch::new(c, self.rng.random::<u64>()));
    }

    /// The switch, if any: its counters and traces.
    pub fn switch(&self) -> Option<&switch::Switch> {
        self.switch.as_ref()
    }

    /// Injects a packet as if `packet.from` had sent it now (after the tap, before faults).
    pub fn inject(&mut self, packet: WirePacket) {
        self.send(packet);
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    pub(crate) fn route(&self, ip: IpAddr) -> Option<NodeId> {
        let gid = Gid::from(ip);
        self.nodes
            .iter()
            .position(|n| n.gids.contains(&gid))
            .map(NodeId)
    }

    fn delay(&mut self) -> Duration {
        let jitter = self.faults.jitter.as_nanos() as u64;
        let extra = if jitter > 0 {
            self.rng.random_range(0..=jitter)
        } else {
            0
        };
        self.faults.latency + Duration::from_nanos(extra)
    }

    /// Applies the faults to a packet and schedules its delivery.
    fn send(&mut self, mut packet: WirePacket) {
        self.stats.sent += 1;
        if let Some(sw) = self.switch.as_mut() {
            sw.from_host(self.now, packet);
            return;
        }
        if self.chance(self.faults.loss) {
            self.stats.lost += 1;
            self.recycle(packet.data);
            return;
        }
        if self.chance(self.faults.corrupt) && !packet.data.is_empty() {
            let bit = self.rng.random_range(0..packet.data.len() * 8);
            if let Some(b) = packet.data.get_mut(bit / 8) {
                *b ^= 1 << (bit % 8);
            }
            self.stats.corrupted += 1;
        }
        if packet.ecn.is_ect() && packet.ecn != Ecn::Ce && self.chance(self.faults.ce_mark) {
            packet.ecn = Ecn::Ce;
            self.stats.ce_marked += 1;
        }
        let delay = self.delay();
        if self.chance(self.faults.duplicate) {
            let mut copy = self.free.pop().unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(&packet.data);
            let dup = WirePacket {
                data: copy,
                ..packet.clone_meta()
            };
            let extra = self.delay();
            self.schedule(dup, self.now + delay + extra);
            self.stats.duplicated += 1;
        }
        if self.chance(self.faults.reorder) {
            self.stats.reordered += 1;
            self.schedule(packet, self.now + delay + self.faults.reorder_delay);
            return;
        }
        // In order on the path: never before the previous in-order packet between the same
        // two nodes.
        let (from, to) = (packet.from.0, packet.to.0);
        if self.last_arrival.len() <= from {
            self.last_arrival.resize_with(from + 1, Vec::new);
        }
        let mut at = self.now + delay;
        if let Some(row) = self.last_arrival.get_mut(from) {
            if row.len() <= to {
                row.resize(to + 1, Instant::ZERO);
            }
            if let Some(last) = row.get_mut(to) {
                at = at.max(*last);
                *last = at;
            }
        }
        self.schedule(packet, at);
    }

    fn schedule(&mut self, packet: WirePacket, at: Instant) {
        if self.queue.len() >= MAX_IN_FLIGHT {
            self.stats.overflow += 1;
            self.recycle(packet.data);
            return;
        }
        self.seq += 1;
        self.queue.push(Reverse(InFlight {
            at,
            seq: self.seq,
            packet,
        }));
    }

    fn recycle(&mut self, data: Vec<u8>) {
        if self.free.len() < 4096 {
            self.free.push(data);
        }
    }

    /// One round: every engine transmits what it has, packets due are delivered, timeouts due
    /// fire; if none of that happened the clock jumps to the next event. Returns false when there
    /// is no next event at all.
    pub fn step(&mut self) -> bool {
        self.step_to(Instant::MAX)
    }

    /// [`Fabric::step`], but the clock never jumps past `limit`.
    pub(crate) fn step_to(&mut self, limit: Instant) -> bool {
        let mut progress = false;
        for i in 0..self.nodes.len() {
            for _ in 0..MAX_TX_PER_STEP {
                if self.switch.as_ref().is_some_and(|s| !s.nic_ready(i)) {
                    break;
                }
                let Some(node) = self.nodes.get_mut(i) else {
                    break;
                };
                let Some(tx) = node.hca.poll_transmit(self.now, &mut self.buf) else {
                    break;
                };
                progress = true;
                let Some(to) = self.route(tx.dst_ip) else {
                    self.stats.unroutable += 1;
                    continue;
                };
                let mut data = self.free.pop().unwrap_or_default();
                data.clear();
                data.extend_from_slice(&self.buf[..tx.len]);
                let mut packet = WirePacket {
                    from: NodeId(i),
                    to,
                    src_ip: tx.src_ip,
                    dst_ip: tx.dst_ip,
                    src_port: tx.src_port,
                    ecn: tx.ecn,
                    dscp: tx.dscp,
                    hop_limit: tx.hop_limit,
                    data,
                };
                if let Some(tap) = self.tap.as_mut() {
                    if !tap.on_packet(self.now, &mut packet) {
                        self.stats.tapped += 1;
                        self.recycle(packet.data);
                        continue;
                    }
                }
                self.send(packet);
            }
        }
        if let Some(sw) = self.switch.as_mut() {
            let out = &mut self.switch_out;
            if sw.advance(self.now, |at, p| out.push((at, p))) {
                progress = true;
            }
            let mut out = core::mem::take(&mut self.switch_out);
            for (at, p) in out.drain(..) {
                self.schedule(p, at);
            }
            self.switch_out = out;
        }
        while self.queue.peek().is_some_and(|Reverse(p)| p.at <= self.now) {
            let Some(Reverse(p)) = self.queue.pop() else {
                break;
            };
            let now = self.now;
            if let Some(node) = self.nodes.get_mut(p.packet.to.0) {
                node.hca.handle_datagram(
                    now,
                    &Datagram {
                        src_ip: p.packet.src_ip,
                        dst_ip: p.packet.dst_ip,
                        src_port: p.packet.src_port,
                        dst_port: roce::udp::ROCEV2_PORT,
                        ecn: p.packet.ecn,
                        dscp: p.packet.dscp,
                        hop_limit: p.packet.hop_limit,
                        ip_ident: Some(IPV4_IDENT),
                        payload: &p.packet.data,
                    },
                );
                self.stats.delivered += 1;
            }
            self.recycle(p.packet.data);
            progress = true;
        }
        let now = self.now;
        for node in &mut self.nodes {
            if node.hca.poll_timeout().is_some_and(|t| t <= now) {
                node.hca.handle_timeout(now);
                progress = true;
            }
        }
        if progress {
            return true;
        }
        match self.next_event() {
            Some(t) => {
                self.now = self.now.max(t.min(limit));
                true
            }
            None => false,
        }
    }

    /// The earliest future event: a delivery or an engine timeout.
    fn next_event(&mut self) -> Option<Instant> {
        let arrival = self.queue.peek().map(|Reverse(p)| p.at);
        let arrival = match (arrival, self.switch.as_ref().and_then(|s| s.next_event())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.hca.poll_timeout())
            .min();
        match (arrival, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs until `done(self)` holds, checked before every step. Stops with an error when the
    /// virtual clock passes `now + max` (a timeout), when nothing can happen any more (idle), or
    /// after an absurd number of steps at one instant.
    ///
    /// # Errors
    /// [`RunError`].
    pub fn run_until<F: FnMut(&mut Fabric) -> bool>(
        &mut self,
        mut done: F,
        max: Duration,
    ) -> Result<Instant, RunError> {
        let deadline = self.now + max;
        let mut steps_at_instant = 0u64;
        let mut last = self.now;
        loop {
            if done(self) {
                return Ok(self.now);
            }
            if self.now > deadline {
                return Err(RunError::Timeout { now: self.now });
            }
            if !self.step_to(deadline.saturating_add_nanos(1)) {
                // The last step may have completed work without sending anything.
                if done(self) {
                    return Ok(self.now);
                }
                return Err(RunError::Idle { now: self.now });
            }
            if self.now == last {
                steps_at_instant += 1;
                if steps_at_instant > 10_000_000 {
                    return Err(RunError::TooManySteps { now: self.now });
                }
            } else {
                last = self.now;
                steps_at_instant = 0;
            }
        }
    }

    /// Runs until the virtual clock advanced by `d` (or nothing can happen any more).
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        // Each step delivers, times out or advances the clock (at most to `end`); the step
        // count at one instant is bounded by the engines' finite work.
        while self.now < end {
            if !self.step_to(end) {
                self.now = end;
                break;
            }
        }
    }
}

impl WirePacket {
    fn clone_meta(&self) -> WirePacket {
        WirePacket {
            from: self.from,
            to: self.to,
            src_ip: self.src_ip,
            dst_ip: self.dst_ip,
            src_port: self.src_port,
            ecn: self.ecn,
            dscp: self.dscp,
            hop_limit: self.hop_limit,
            data: Vec::new(),
        }
    }
}
