//! A shared-nothing output-queued Ethernet switch for the in-memory fabric: every node hangs off
//! one port by a link of one line rate, so congestion, ECN marking and PFC can be studied.
//!
//! What a packet goes through (all in virtual time, deterministic under the fabric's seed):
//! 1. the sending node's NIC: eight priority queues served in strict priority, one packet at a
//!    time at the line rate, a priority stopping while a PFC pause for it holds;
//! 2. the link to the switch (`link_delay`);
//! 3. the switch's ingress: the packet's priority is its DSCP's class selector (`DSCP >> 3`,
//!    RFC 2474 §4.2.2: data with DSCP 0 is priority 0, CNPs with DSCP 48 priority 6, mlx5's
//!    `cnp_802p_prio`); with PFC on that priority (IEEE 802.1Qbb) the bytes buffered from this
//!    ingress are counted, and past `xoff` a PAUSE goes back to the NIC (quanta of 512 bit
//!    times, refreshed at half its duration while the count stays above `xon`, ended by a
//!    zero-quanta PAUSE at `xon`); what arrives beyond `xoff + headroom` is dropped and counted
//!    (`headroom_drops`, zero when the headroom covers the link's round trip);
//!    without PFC (lossy) a packet finding its egress queue above `buffer` is tail-dropped;
//! 4. ECN (RFC 3168) marking by RED on the instantaneous egress queue at enqueue, as in the DCQCN
//!    paper (Zhu et al. 2015 §3.1, figure 5): ECT packets are marked CE with probability 0 below
//!    `kmin`, `pmax * (q - kmin) / (kmax - kmin)` between, 1 above `kmax` bytes;
//! 5. the egress port: eight priority queues in strict priority at the line rate, then the
//!    link to the destination node.
//!
//! Sizes are wire bytes ([`crate::engine::dcqcn::wire_bytes`]: frame, preamble and gap), so a
//! port at line rate carries exactly `line_rate` bit/s of them. Each port keeps counters
//! ([`PortCounters`]) and a trace of its egress queue: the largest backlog in each
//! `trace_interval` ([`Switch::queue_trace`]); every (source, destination) pair its delivered
//! bytes per interval ([`Switch::flow_trace`]).

use alloc::collections::{BTreeMap, BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};
use core::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use roce::ipv4::Ecn;

use super::{NodeId, WirePacket};
use crate::engine::dcqcn::wire_bytes;
use crate::engine::Instant;

/// Priorities (IEEE 802.1p classes).
pub const PRIORITIES: usize = 8;

/// RED marking thresholds on one egress queue, bytes, and the marking probability at `kmax`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Red {
    /// Below: never marked.
    pub kmin: u64,
    /// Above: always marked.
    pub kmax: u64,
    /// The probability at `kmax` (0.0..=1.0), linear from 0 at `kmin`.
    pub pmax: f64,
}

impl Red {
    /// The DCQCN paper's setting (§5: `Kmin` = 5 KB, `Kmax` = 200 KB, `Pmax` = 1 %).
    pub const PAPER: Red = Red {
        kmin: 5_000,
        kmax: 200_000,
        pmax: 0.01,
    };

    /// The marking probability at a queue of `q` bytes.
    pub fn probability(&self, q: u64) -> f64 {
        if q <= self.kmin {
            0.0
        } else if q > self.kmax {
            1.0
        } else {
            let span = self.kmax.saturating_sub(self.kmin).max(1) as f64;
            self.pmax * (q - self.kmin) as f64 / span
        }
    }
}

/// PFC thresholds of one ingress port and priority, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pfc {
    /// Priorities PFC applies to (bit `p` for priority `p`); the others are lossy.
    pub priorities: u8,
    /// Buffered bytes from one ingress (and priority) above which a PAUSE is sent.
    pub xoff: u64,
    /// Buffered bytes at or below which a paused ingress is resumed.
    pub xon: u64,
    /// Bytes accepted beyond `xoff` (in flight when the PAUSE takes effect); beyond it, drops.
    pub headroom: u64,
    /// Pause time carried by an XOFF PAUSE frame, in quanta of 512 bit times (IEEE 802.1Qbb).
    pub quanta: u16,
}

/// How the switch handles a full queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SwitchMode {
    /// PFC on the priorities of [`Pfc::priorities`]: never drops there (unless the headroom
    /// is too small, counted).
    Lossless(Pfc),
    /// No PFC: a packet that finds its egress queue above this many bytes is dropped.
    Lossy {
        /// Most bytes one egress queue (port and priority) holds.
        buffer: u64,
    },
}

/// The switch's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwitchConfig {
    /// The rate of every link, NIC and port, bit/s.
    pub line_rate: u64,
    /// Propagation delay of every link (each direction).
    pub link_delay: Duration,
    /// Lossless (PFC) or lossy.
    pub mode: SwitchMode,
    /// ECN marking; `None`: never marks.
    pub red: Option<Red>,
    /// Interval of the queue and flow traces; zero: no traces.
    pub trace_interval: Duration,
}

impl SwitchConfig {
    /// The DCQCN paper's setting (§5): 40 Gb/s links, RED with the paper's thresholds
    /// ([`Red::PAPER`]); 1 us of propagation per link; lossless: PFC on priority 0 with `xoff`
    /// 300 KB per ingress ([`Pfc::for_link`]), lossy: 300 KB per egress queue; traces every
    /// 100 us. The buffer sizes are this model's choice, not the paper's (its switch shares
    /// 12 MB with dynamic thresholds).
    pub fn paper(lossless: bool) -> SwitchConfig {
        let line_rate = 40_000_000_000;
        let link_delay = Duration::from_micros(1);
        SwitchConfig {
            line_rate,
            link_delay,
            mode: if lossless {
                SwitchMode::Lossless(Pfc::for_link(line_rate, link_delay, 300_000))
            } else {
                SwitchMode::Lossy { buffer: 300_000 }
            },
            red: Some(Red::PAPER),
            trace_interval: Duration::from_micros(100),
        }
    }
}

impl Pfc {
    /// PFC on priority 0 (RoCE data) with `xoff` bytes: `xon` two MTUs below it, and the
    /// headroom of IEEE 802.1Qbb Annex N: what the link carries in the time a PAUSE takes to
    /// act (two propagation delays, a PAUSE frame and a largest frame at each end) plus a
    /// largest frame; quanta 0xFFFF.
    pub fn for_link(line_rate: u64, link_delay: Duration, xoff: u64) -> Pfc {
        let mtu_frame = 9216u64;
        let prop_bytes = (link_delay.as_nanos() as u64).saturating_mul(line_rate) / 8_000_000_000;
        Pfc {
            priorities: 1,
            xoff,
            xon: xoff.saturating_sub(2 * mtu_frame),
            headroom: 2 * prop_bytes + 3 * mtu_frame + 2 * 84,
            quanta: 0xFFFF,
        }
    }
}

/// Counters of one switch port (and of the NIC of the node on it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Packets the egress sent toward the node.
    pub tx_pkts: u64,
    /// Wire bytes the egress sent.
    pub tx_bytes: u64,
    /// Packets received from the node.
    pub rx_pkts: u64,
    /// Packets this egress queue marked CE.
    pub ecn_marked: u64,
    /// Packets dropped at this egress queue (lossy, queue full).
    pub drops: u64,
    /// Packets from this ingress dropped beyond `xoff + headroom` (lossless).
    pub headroom_drops: u64,
    /// XOFF PAUSE frames sent to the node (refreshes included).
    pub pause_sent: u64,
    /// Zero-quanta (XON) PAUSE frames sent to the node.
    pub resume_sent: u64,
    /// Time the node's NIC was paused with packets waiting, ns.
    pub paused_ns: u64,
    /// Largest egress backlog seen, wire bytes.
    pub max_queue: u64,
}

#[derive(Debug)]
struct Queued {
    packet: WirePacket,
    bytes: u64,
    ingress: usize,
    prio: usize,
}

#[derive(Debug, Default)]
struct Port {
    // The node's NIC.
    nic: [VecDeque<Queued>; PRIORITIES],
    nic_busy: bool,
    nic_paused_until: [Instant; PRIORITIES],
    nic_blocked_since: Option<Instant>,
    // The switch's egress toward the node.
    egress: [VecDeque<Queued>; PRIORITIES],
    egress_bytes: [u64; PRIORITIES],
    egress_busy: bool,
    // The switch's ingress from the node.
    ingress_bytes: [u64; PRIORITIES],
    xoff_sent: [bool; PRIORITIES],
    /// Bumped at each XOFF: a refresh of an earlier XOFF episode is stale.
    xoff_gen: [u64; PRIORITIES],
    counters: PortCounters,
    trace: Vec<(u64, u64)>,
}

impl Port {
    fn backlog(&self) -> u64 {
        self.egress_bytes.iter().sum()
    }
}

#[derive(Debug)]
enum Event {
    /// The NIC of a node finished a packet: it is on the link.
    NicDone(usize, Queued),
    /// A packet reached the switch.
    Arrive(Queued),
    /// An egress port finished a packet.
    EgressDone(usize, Queued),
    /// A PAUSE frame reached node `.0` for priority `.1` with `.2` quanta.
    Pause(usize, usize, u16),
    /// Node `.0`'s pause on priority `.1` may have expired: try its NIC.
    NicKick(usize),
    /// Refresh the XOFF to node `.0` on priority `.1` of episode `.2` if still congested.
    Refresh(usize, usize, u64),
}

struct Timed {
    at: Instant,
    seq: u64,
    event: Event,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The switch. See the [module docs](self).
pub struct Switch {
    config: SwitchConfig,
    ports: Vec<Port>,
    events: BinaryHeap<Reverse<Timed>>,
    seq: u64,
    rng: ChaCha8Rng,
    flows: BTreeMap<(usize, usize, u64), u64>,
}

impl core::fmt::Debug for Switch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Switch")
            .field("config", &self.config)
            .field("ports", &self.ports.len())
            .finish_non_exhaustive()
    }
}

impl Switch {
    /// A switch with no ports yet (one is added per node as packets name it), RED draws from
    /// `seed`.
    pub fn new(config: SwitchConfig, seed: u64) -> Switch {
        Switch {
            config,
            ports: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5717_c400),
            flows: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchConfig {
        &self.config
    }

    /// The counters of the port of `node` (zero for a node that never sent or received).
    pub fn port_counters(&self, node: NodeId) -> PortCounters {
        self.ports
            .get(node.0)
            .map(|p| p.counters)
            .unwrap_or_default()
    }

    /// The egress queue trace of `node`'s port: (interval index, largest backlog in wire bytes
    /// during it), for the intervals in which the queue changed.
    pub fn queue_trace(&self, node: NodeId) -> &[(u64, u64)] {
        self.ports.get(node.0).map_or(&[], |p| p.trace.as_slice())
    }

    /// Wire bytes delivered from `from` to `to` per trace interval: (interval index, bytes),
    /// the intervals with traffic only.
    pub fn flow_trace(&self, from: NodeId, to: NodeId) -> Vec<(u64, u64)> {
        self.flows
            .range((from.0, to.0, 0)..=(from.0, to.0, u64::MAX))
            .map(|(&(_, _, i), &b)| (i, b))
            .collect()
    }

    /// Wire bytes waiting in the switch and the NICs.
    pub fn buffered(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| p.backlog() + p.nic.iter().flatten().map(|q| q.bytes).sum::<u64>())
            .sum()
    }

    /// Whether node `node`'s NIC can take a packet now: nothing waits in it besides the one on
    /// the wire. The fabric polls an engine's transmit only then, as a NIC fetches the next
    /// WQE's packet when it can send it: packets wait in the send queues (where DCQCN paces
    /// them), not in a queue of built frames, and a PFC pause holds the engine back.
    pub fn nic_ready(&self, node: usize) -> bool {
        self.ports
            .get(node)
            .is_none_or(|p| p.nic.iter().all(VecDeque::is_empty))
    }

    fn port(&mut self, i: usize) -> &mut Port {
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, Port::default);
        }
        &mut self.ports[i]
    }

    fn schedule(&mut self, at: Instant, event: Event) {
        self.seq += 1;
        self.events.push(Reverse(Timed {
            at,
            seq: self.seq,
            event,
        }));
    }

    fn ser(&self, bytes: u64) -> Duration {
        let r = u128::from(self.config.line_rate.max(1));
        let ns = (u128::from(bytes) * 8 * 1_000_000_000).div_ceil(r);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    fn bucket(&self, at: Instant) -> Option<u64> {
        let i = self.config.trace_interval.as_nanos() as u64;
        (i > 0).then(|| at.as_nanos() / i)
    }

    /// A node handed its NIC a packet at `now`.
    pub fn from_host(&mut self, now: Instant, packet: WirePacket) {
        let bytes = wire_bytes(packet.data.len(), packet.dst_ip.is_ipv6());
        let prio = usize::from(packet.dscp >> 3) % PRIORITIES;
        let ingress = packet.from.0;
        self.port(packet.to.0);
        let port = self.port(ingress);
        port.nic[prio].push_back(Queued {
            packet,
            bytes,
            ingress,
            prio,
        });
        self.kick_nic(now, ingress);
    }

    /// Starts the next packet of node `n`'s NIC if it is idle.
    fn kick_nic(&mut self, now: Instant, n: usize) {
        let Some(port) = self.ports.get_mut(n) else {
            return;
        };
        if port.nic_busy {
            return;
        }
        let mut blocked = false;
        let mut pick = None;
        for p in (0..PRIORITIES).rev() {
            if port.nic[p].is_empty() {
                continue;
            }
            if port.nic_paused_until[p] > now {
                blocked = true;
                continue;
            }
            pick = Some(p);
            break;
        }
        match (pick, blocked) {
            (None, true) => {
                port.nic_blocked_since.get_or_insert(now);
            }
            _ => {
                if let Some(since) = port.nic_blocked_since.take() {
                    port.counters.paused_ns += (now - since).as_nanos() as u64;
                }
            }
        }
        let Some(p) = pick else {
            return;
        };
        let Some(q) = port.nic[p].pop_front() else {
            return;
        };
        port.nic_busy = true;
        port.counters.rx_pkts += 1;
        let done = now + self.ser(q.bytes);
        self.schedule(done, Event::NicDone(n, q));
    }

    fn kick_egress(&mut self, now: Instant, n: usize) {
        let Some(port) = self.ports.get_mut(n) else {
            return;
        };
        if port.egress_busy {
            return;
        }
        let Some(p) = (0..PRIORITIES).rev().find(|&p| !port.egress[p].is_empty()) else {
            return;
        };
        let Some(q) = port.egress[p].pop_front() else {
            return;
        };
        port.egress_busy = true;
        let done = now + self.ser(q.bytes);
        self.schedule(done, Event::EgressDone(n, q));
    }

    fn note_queue(&mut self, now: Instant, n: usize) {
        let bucket = self.bucket(now);
        let port = &mut self.ports[n];
        let q = port.backlog();
        port.counters.max_queue = port.counters.max_queue.max(q);
        if let Some(b) = bucket {
            match port.trace.last_mut() {
                Some((i, m)) if *i == b => *m = (*m).max(q),
                _ => port.trace.push((b, q)),
            }
        }
    }

    fn send_pause(&mut self, now: Instant, n: usize, prio: usize, quanta: u16) {
        // A PAUSE frame is a minimum frame (64 bytes + preamble and gap) on the link back.
        let at = now + self.ser(84) + self.config.link_delay;
        self.schedule(at, Event::Pause(n, prio, quanta));
        if quanta > 0 {
            self.ports[n].counters.pause_sent += 1;
            let refresh = self.ser(u64::from(quanta) * 512 / 8) / 2;
            let generation = self.ports[n].xoff_gen[prio];
            self.schedule(now + refresh, Event::Refresh(n, prio, generation));
        } else {
            self.ports[n].counters.resume_sent += 1;
        }
    }

    fn arrive(&mut self, now: Instant, mut q: Queued) {
        let out = q.packet.to.0;
        let (ing, prio) = (q.ingress, q.prio);
        let pfc = match self.config.mode {
            SwitchMode::Lossless(pfc) if pfc.priorities & (1 << prio) != 0 => Some(pfc),
            _ => None,
        };
        self.port(out);
        if let Some(pfc) = pfc {
            if self.ports[ing].ingress_bytes[prio] + q.bytes > pfc.xoff + pfc.headroom {
                self.ports[ing].counters.headroom_drops += 1;
                return;
            }
        } else if let SwitchMode::Lossy { buffer } = self.config.mode {
            if self.ports[out].egress_bytes[prio] + q.bytes > buffer {
                self.ports[out].counters.drops += 1;
                return;
            }
        }
        if let Some(red) = self.config.red {
            let p = red.probability(self.ports[out].egress_bytes[prio]);
            let ect = q.packet.ecn.is_ect() && q.packet.ecn != Ecn::Ce;
            if ect && p > 0.0 && (p >= 1.0 || self.rng.random::<f64>() < p) {
                q.packet.ecn = Ecn::Ce;
                self.ports[out].counters.ecn_marked += 1;
            }
        }
        self.ports[ing].ingress_bytes[prio] += q.bytes;
        if let Some(pfc) = pfc {
            let port = &mut self.ports[ing];
            if port.ingress_bytes[prio] > pfc.xoff && !port.xoff_sent[prio] {
                port.xoff_sent[prio] = true;
                port.xoff_gen[prio] += 1;
                self.send_pause(now, ing, prio, pfc.quanta);
            }
        }
        let port = &mut self.ports[out];
        port.egress_bytes[prio] += q.bytes;
        port.egress[prio].push_back(q);
        self.note_queue(now, out);
        self.kick_egress(now, out);
    }

    fn egress_done(&mut self, now: Instant, n: usize, q: Queued) -> (Instant, WirePacket) {
        let (ing, prio) = (q.ingress, q.prio);
        let bucket = self.bucket(now);
        {
            let port = &mut self.ports[n];
            port.egress_busy = false;
            port.egress_bytes[prio] -= q.bytes;
            port.counters.tx_pkts += 1;
            port.counters.tx_bytes += q.bytes;
        }
        if let Some(b) = bucket {
            *self.flows.entry((ing, n, b)).or_insert(0) += q.bytes;
        }
        self.note_queue(now, n);
        let ingress = &mut self.ports[ing];
        ingress.ingress_bytes[prio] -= q.bytes;
        if let SwitchMode::Lossless(pfc) = self.config.mode {
            if ingress.xoff_sent[prio] && ingress.ingress_bytes[prio] <= pfc.xon {
                ingress.xoff_sent[prio] = false;
                self.send_pause(now, ing, prio, 0);
            }
        }
        self.kick_egress(now, n);
        (now + self.config.link_delay, q.packet)
    }

    /// The earliest pending event.
    pub fn next_event(&self) -> Option<Instant> {
        self.events.peek().map(|Reverse(t)| t.at)
    }

    /// Runs every event due at or before `now`; packets leaving the switch are handed to
    /// `deliver` with the instant they reach their node. Returns whether anything happened.
    pub fn advance(&mut self, now: Instant, mut deliver: impl FnMut(Instant, WirePacket)) -> bool {
        let mut any = false;
        while self.events.peek().is_some_and(|Reverse(t)| t.at <= now) {
            let Some(Reverse(Timed { at, event, .. })) = self.events.pop() else {
                break;
            };
            any = true;
            match event {
                Event::NicDone(n, q) => {
                    self.ports[n].nic_busy = false;
                    self.schedule(at + self.config.link_delay, Event::Arrive(q));
                    self.kick_nic(at, n);
                }
                Event::Arrive(q) => self.arrive(at, q),
                Event::EgressDone(n, q) => {
                    let (t, p) = self.egress_done(at, n, q);
                    deliver(t, p);
                }
                Event::Pause(n, prio, quanta) => {
                    let until = at + self.ser(u64::from(quanta) * 512 / 8);
                    self.ports[n].nic_paused_until[prio] = until;
                    if quanta > 0 {
                        self.schedule(until, Event::NicKick(n));
                    }
                    self.kick_nic(at, n);
                }
                Event::NicKick(n) => self.kick_nic(at, n),
                Event::Refresh(n, prio, generation) => {
                    let port = &self.ports[n];
                    if port.xoff_sent[prio] && port.xoff_gen[prio] == generation {
                        if let SwitchMode::Lossless(pfc) = self.config.mode {
                            self.send_pause(at, n, prio, pfc.quanta);
                        }
                    }
                }
            }
        }
        any
    }
}
