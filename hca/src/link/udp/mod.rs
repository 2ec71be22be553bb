//! [`UdpLink`]: a [`RoceSocket`] with the receive batches and transmit slots that a device's progress
//! engine drives through the [`Link`] trait.
//!
//! Receive: one recvmmsg(2) fills a batch of up to 64 datagrams (a batch of one, by recvmsg(2),
//! when the caller's last round received nothing or only a lone answer: a full batch costs 64
//! message headers to prepare per call).
//! Transmit: the engine builds each packet's headers into one of up to 64 preallocated slots of
//! [`MAX_UDP_PAYLOAD`] bytes and leaves an RC payload in MR memory
//! ([`SoftHca::poll_transmit_gather`]); one sendmmsg(2) (with UDP GSO where the kernel has it)
//! sends them, each packet as an iovec list of head, payload segments and trailer (zero copy).
//! Nothing on this path allocates.
//!
//! Over IPv4 with GSO the kernel numbers the IPv4 identification of a train's segments 0, 1,
//! 2, ... and the ICRC covers it (IBTA vol. 1 Annex A17.3.3 masks only TOS, TTL and the header
//! checksum): [`Link::flush`] recomputes the ICRC of each packet that leaves as the `k`-th segment
//! of a train for identification `k`. On receive a socket does not report the identification
//! either: the engine solves for the one that makes the ICRC verify (`Datagram::ip_ident` is
//! `None`; see [`roce::icrc::solve_ipv4_ident`]).

use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use crate::engine::{Datagram, GatherTransmit, Instant, SoftHca, MAX_TX_SEGMENTS, MAX_UDP_PAYLOAD};
use crate::verbs::device::{Device, DeviceAttr, PathMtu, PortAttr};
use crate::verbs::gid::{Gid, GidEntry, GidType};

use crate::link::{FlushReport, Link, LinkError, RecvState};

pub mod cm_route;
mod cmsg;
pub mod share;
mod slots;
pub mod socket;

pub use socket::{
    ipv4_interface, ipv6_interface, DropDirections, DropHook, LinkCounters, LinkPoller, Offloads,
    Readiness, RecvBatch, RecvDatagram, RecvIter, RoceSocket, RoceSocketConfig, SendDatagram,
    DEFAULT_BATCH, DEFAULT_MAX_PAYLOAD, GRO_SLOT_BYTES, GSO_MAX_SEGMENTS, MAX_BATCH, MAX_SRC_PORTS,
    ROCEV2_PORT,
};

/// Most packets built and sent per round (one sendmmsg(2) call, or GSO trains of at most 64).
pub const MAX_TX_BATCH: usize = 64;

/// Slots of the receive batch a caller polling an idle socket uses: one, received with
/// recvmsg(2), the cheapest poll (a ping-pong's reply and ACK arrive as one GRO buffer; two
/// caller rounds in a row that receive make the next one use the whole batch,
/// `hca::soft::progress`).
const IDLE_BATCH: usize = 1;

/// Shared mode ([`share`]): a round reads its slot socket for forwarded strays when a wait
/// (the progress thread's poll(2)) saw it readable, and otherwise only every this many rounds
/// (every round while strays were received in the last [`STRAY_HOT_ROUNDS`] or are held back
/// for their owners). 16: a stray waits at most 16 rounds (tens of microseconds while a caller
/// polls) longer, and a busy poller makes one receive system call per empty round, as an
/// unshared device does, instead of two; the progress thread, one per wake-up.
const STRAY_CHECK_EVERY: u32 = 16;

/// Shared mode: the rounds after one that received a stray during which every round reads the
/// slot socket (a misrouted flow keeps its own latency).
const STRAY_HOT_ROUNDS: u32 = 1024;

/// Bytes of one transmit slot: the largest UDP payload the engine builds.
const SLOT: usize = MAX_UDP_PAYLOAD;

/// A [`RoceSocket`] with a device's batches; see the [module docs](self).
#[derive(Debug)]
pub struct UdpLink {
    link: RoceSocket,
    rx: RecvBatch,
    /// A batch of [`IDLE_BATCH`] slots, cheaper to prepare, for caller rounds after an empty one.
    rx_idle: RecvBatch,
    /// The last receive used `rx_idle`.
    small: bool,
    /// `slots` transmit buffers of [`SLOT`] bytes, back to back.
    tx: Vec<u8>,
    slots: usize,
    /// Packets built: slot `i` of `tx` holds the head of `meta[i]`, which references its payload
    /// in MR memory (zero-copy); the slots `order[sent..]` are not sent yet.
    meta: Vec<GatherTransmit>,
    sent: usize,
    /// Per slot: the IPv4 identification its packet's ICRC was computed for.
    sealed: [u16; MAX_TX_BATCH],
    /// The order the built packets leave in: slot indices, stably sorted by UDP source port, so
    /// that each sending socket's packets go in one sendmmsg(2) (and GSO trains) although the
    /// engine interleaves its QPs packet by packet. One QP always leaves from one port, so its
    /// packets keep their order; packets of different QPs are different flows. `sent` counts
    /// positions in this order.
    order: [u8; MAX_TX_BATCH],
    peer_port: u16,
    peer_ports: Vec<(IpAddr, u16)>,
    scope_id: u32,
    gid: Gid,
    mtu: u32,
    /// Stray forwarding of a shared socket ([`share`]).
    forward: Option<share::Forwarder>,
    /// Forwarded datagrams read by the last [`Link::recv`].
    forwarded_in: usize,
    /// Idle caller rounds left before the next read of the slot socket ([`STRAY_CHECK_EVERY`]).
    stray_skip: u32,
    /// Rounds left that read the slot socket whatever ([`STRAY_HOT_ROUNDS`]).
    stray_hot: u32,
}

impl UdpLink {
    /// Wraps `link`: packets go to UDP port `peer_port` of their destination unless
    /// [`UdpLink::set_peer_port`] says otherwise; `scope_id` is the interface of link-local
    /// destinations; `mtu` the IP MTU of the path, bytes (the port's active MTU is the largest
    /// RoCE path MTU that fits it, [`PathMtu::from_link_mtu`]).
    pub fn new(link: RoceSocket, peer_port: u16, scope_id: u32, mtu: u32) -> UdpLink {
        let rx = link.new_recv_batch();
        let rx_idle = link.new_recv_batch_of(IDLE_BATCH);
        let slots = link.config().batch.clamp(1, MAX_TX_BATCH);
        let local = link.local_addr();
        UdpLink {
            rx,
            rx_idle,
            small: false,
            tx: vec![0; slots * SLOT],
            slots,
            meta: Vec::with_capacity(slots),
            sent: 0,
            sealed: [0; MAX_TX_BATCH],
            order: [0; MAX_TX_BATCH],
            peer_port,
            peer_ports: Vec::new(),
            scope_id,
            gid: Gid::from(local.ip()),
            mtu,
            forward: link.share_slot().map(|_| share::Forwarder::new(local)),
            forwarded_in: 0,
            stray_skip: 0,
            stray_hot: 0,
            link,
        }
    }

    /// The socket link.
    pub fn link(&self) -> &RoceSocket {
        &self.link
    }

    /// Sends packets for peer address `ip` to UDP port `port`.
    pub fn set_peer_port(&mut self, ip: IpAddr, port: u16) {
        let ip = canonical(ip);
        match self.peer_ports.iter_mut().find(|(a, _)| *a == ip) {
            Some(entry) => entry.1 = port,
            None => self.peer_ports.push((ip, port)),
        }
    }
}

/// An IPv4-mapped IPv6 address as IPv4, so that both spellings find the same peer port.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Where a packet for `ip` goes: the peer port for it, the link-local scope for `fe80::/10`.
fn destination(
    peer_ports: &[(IpAddr, u16)],
    default_port: u16,
    scope: u32,
    ip: IpAddr,
) -> SocketAddr {
    let port = peer_ports
        .iter()
        .find(|(a, _)| *a == canonical(ip))
        .map_or(default_port, |&(_, p)| p);
    match ip {
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope))
        }
        _ => SocketAddr::new(ip, port),
    }
}

/// Most gather parts of one packet: headers, [`MAX_TX_SEGMENTS`] payload segments, trailer.
const PARTS_PER_PACKET: usize = MAX_TX_SEGMENTS + 2;

/// Packets up to which a send uses small gather arrays (a latency-bound exchange sends one or
/// two packets a round; preparing arrays for a full batch would cost more than the send).
const SMALL_WINDOW: usize = 4;

/// Where packets go: the peer ports by IP, the default peer port and the IPv6 link-local scope.
struct Addressing<'a> {
    peer_ports: &'a [(IpAddr, u16)],
    peer_port: u16,
    scope: u32,
}

/// Calls `f` with the datagrams of the packets in slots `order` (at most `N`; `P` = `N` x
/// [`PARTS_PER_PACKET`]): packet `order[k]` is `meta[order[k]]` with its head in `tx`'s slot
/// `order[k]`, and becomes datagram `k`: its head, its payload segments in MR memory (zero-copy;
/// the [`GatherTransmit`] keeps that memory alive) and its trailer (pad, ICRC), addressed as
/// `addr` says. The gather arrays live on the stack for the call.
fn with_datagrams<const N: usize, const P: usize, R>(
    tx: &[u8],
    meta: &[GatherTransmit],
    order: &[u8],
    addr: &Addressing<'_>,
    f: impl FnOnce(&[SendDatagram<'_>]) -> R,
) -> R {
    debug_assert_eq!(P, N * PARTS_PER_PACKET);
    let count = order.len().min(N);
    let mut parts = [IoSlice::new(&[]); P];
    let mut counts = [0usize; N];
    for (i, &slot) in order.iter().enumerate().take(count) {
        let Some(t) = meta.get(usize::from(slot)) else {
            break;
        };
        let start = usize::from(slot) * SLOT;
        let Some(mine) = parts.get_mut(i * PARTS_PER_PACKET..(i + 1) * PARTS_PER_PACKET) else {
            break;
        };
        let mut n = 0;
        mine[n] = IoSlice::new(tx.get(start..start + t.head_len().min(SLOT)).unwrap_or(&[]));
        n += 1;
        for seg in t.segments().take(MAX_TX_SEGMENTS) {
            mine[n] = IoSlice::new(seg.bytes());
            n += 1;
        }
        if !t.trailer().is_empty() {
            mine[n] = IoSlice::new(t.trailer());
            n += 1;
        }
        counts[i] = n;
    }
    let unset = SocketAddr::new(IpAddr::from([0u8; 4]), 0);
    let mut dgrams = [SendDatagram::new(unset, &[]); N];
    for (i, &slot) in order.iter().enumerate().take(count) {
        let Some(g) = meta.get(usize::from(slot)) else {
            break;
        };
        let t = &g.transmit;
        let start = i * PARTS_PER_PACKET;
        dgrams[i] = SendDatagram {
            dst: destination(addr.peer_ports, addr.peer_port, addr.scope, t.dst_ip),
            src_port: Some(t.src_port),
            ecn: t.ecn,
            dscp: t.dscp,
            hop_limit: Some(t.hop_limit.max(1)),
            parts: &parts[start..start + counts[i]],
        };
    }
    f(&dgrams[..count])
}

/// [`with_datagrams`] with arrays sized for `order`: small ones for a few packets.
fn with_datagrams_sized<R>(
    tx: &[u8],
    meta: &[GatherTransmit],
    order: &[u8],
    addr: &Addressing<'_>,
    f: impl FnOnce(&[SendDatagram<'_>]) -> R,
) -> R {
    if order.len() <= SMALL_WINDOW {
        with_datagrams::<SMALL_WINDOW, { SMALL_WINDOW * PARTS_PER_PACKET }, R>(
            tx, meta, order, addr, f,
        )
    } else {
        with_datagrams::<MAX_TX_BATCH, { MAX_TX_BATCH * PARTS_PER_PACKET }, R>(
            tx, meta, order, addr, f,
        )
    }
}

fn datagram<'a>(d: &RecvDatagram<'a>) -> Datagram<'a> {
    Datagram {
        src_ip: d.src.ip(),
        dst_ip: d.dst.ip(),
        src_port: d.src.port(),
        // Whatever port the device is bound to, its peers addressed RoCEv2's port in the ICRC.
        dst_port: ROCEV2_PORT,
        ecn: d.ecn,
        dscp: d.dscp,
        hop_limit: d.hop_limit.unwrap_or(64),
        // A socket cannot see the IPv4 identification: the engine solves for the one that
        // makes the ICRC verify. IPv6 has none.
        ip_ident: None,
        payload: d.payload,
    }
}

impl Link for UdpLink {
    type Error = LinkError;
    type Poller = LinkPoller;
    type Counters = LinkCounters;

    fn name(&self) -> String {
        format!("udp:{}", self.link.local_addr())
    }

    fn local_addr(&self) -> SocketAddr {
        self.link.local_addr()
    }

    /// A node GUID from the address (EUI-64 of MAC `02:00` + the address's last 4 bytes), the
    /// port's active MTU from [`Link::mtu`], and the address's RoCEv2 GID at index 0.
    fn device(&self) -> Device {
        let tail = self.gid.as_bytes();
        let mac = [2, 0, tail[12], tail[13], tail[14], tail[15]];
        let guid = u64::from_be_bytes(crate::verbs::gid::eui64_from_mac(mac));
        let attr = DeviceAttr {
            node_guid: guid,
            sys_image_guid: guid,
            ..DeviceAttr::default()
        };
        let port = PortAttr {
            active_mtu: PathMtu::from_link_mtu(self.mtu as usize).unwrap_or(PathMtu::Mtu256),
            ..PortAttr::default()
        };
        let mut dev = Device::new(attr, port);
        // A fresh table has room; the GID of a bound (specified) address is never zero.
        let _ = dev.port.gids.add(GidEntry {
            gid: self.gid,
            gid_type: GidType::RoceV2,
        });
        dev
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn counters(&self) -> LinkCounters {
        *self.link.counters()
    }

    fn recv(&mut self, idle: bool) -> Result<RecvState, LinkError> {
        self.small = idle;
        let batch = if idle {
            &mut self.rx_idle
        } else {
            &mut self.rx
        };
        let mut waiting = self.link.recv(batch)?;
        self.forwarded_in = 0;
        if let (Some(fwd), Some(claim)) = (self.forward.as_mut(), self.link.claim()) {
            // The slot socket is read when a wait saw it readable (the progress thread's
            // poll(2)), and otherwise only every STRAY_CHECK_EVERY rounds (one system call
            // instead of two per empty poll), unless strays came lately or are held back for
            // their owners (`Forwarder::recv` sends those).
            let check = self.link.take_strays_ready()
                || self.stray_hot > 0
                || self.stray_skip == 0
                || fwd.holds_any();
            if check {
                self.stray_skip = STRAY_CHECK_EVERY - 1;
                self.forwarded_in = fwd.recv(claim);
                waiting += self.forwarded_in;
                if self.forwarded_in > 0 {
                    self.stray_hot = STRAY_HOT_ROUNDS;
                } else {
                    self.stray_hot = self.stray_hot.saturating_sub(1);
                }
            } else {
                self.stray_skip -= 1;
            }
        }
        Ok(RecvState { waiting })
    }

    fn deliver<F: FnMut(&Datagram<'_>)>(&mut self, mut f: F) -> Result<usize, LinkError> {
        let batch = if self.small { &self.rx_idle } else { &self.rx };
        let claim = self.link.claim();
        let mut n = 0;
        let mut unforwarded = 0;
        for d in batch.iter() {
            n += 1;
            if let (Some(claim), Some(q)) = (claim, d.payload.get(5..8)) {
                let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
                // QP 1 belongs to slot 0, but its CM MADs are routed by their contents
                // (`cm_route`).
                let owner = match self.forward.as_mut() {
                    Some(fwd) if qpn == share::GSI_QPN => fwd.gsi_owner(claim.slot(), d.payload),
                    _ => Some(share::slot_of_qpn(qpn)),
                };
                let Some(owner) = owner else {
                    unforwarded += 1;
                    continue;
                };
                if owner != claim.slot() {
                    let stray = share::Forwarded {
                        src: d.src,
                        dst: d.dst.ip(),
                        ecn: d.ecn.bits(),
                        dscp: d.dscp,
                        hop_limit: d.hop_limit.unwrap_or(64),
                        payload: d.payload,
                    };
                    match self.forward.as_mut() {
                        Some(fwd) => fwd.forward(claim, owner, &stray),
                        None => unforwarded += 1,
                    }
                    continue;
                }
            }
            f(&datagram(&d));
        }
        if let (Some(fwd), true) = (&self.forward, self.forwarded_in > 0) {
            for d in fwd.received() {
                n += 1;
                f(&Datagram {
                    src_ip: d.src.ip(),
                    dst_ip: d.dst,
                    src_port: d.src.port(),
                    dst_port: ROCEV2_PORT,
                    ecn: roce::ipv4::Ecn::from_bits(d.ecn),
                    dscp: d.dscp,
                    hop_limit: d.hop_limit,
                    ip_ident: None,
                    payload: d.payload,
                });
            }
        }
        if let Some(fwd) = self.forward.as_mut() {
            let mut counts = fwd.take_counts();
            counts.dropped += unforwarded;
            self.link.count_strays(&counts);
        }
        Ok(n)
    }

    fn rx_full(&self, delivered: usize) -> bool {
        let batch = if self.small { &self.rx_idle } else { &self.rx };
        delivered >= batch.capacity()
    }

    /// Zero copy: [`SoftHca::poll_transmit_gather`] leaves RC payloads in MR memory.
    fn build(&mut self, engine: &mut SoftHca, now: Instant) -> (usize, bool) {
        self.meta.clear();
        self.sent = 0;
        for slot in self.tx.chunks_exact_mut(SLOT) {
            match engine.poll_transmit_gather(now, slot) {
                Some(t) => self.meta.push(t),
                None => break,
            }
        }
        let built = self.meta.len();
        self.sealed[..built].fill(crate::engine::IPV4_IDENT);
        let order = &mut self.order[..built];
        for (k, o) in order.iter_mut().enumerate() {
            *o = k as u8;
        }
        let meta = &self.meta;
        // Stable: a QP's packets (one port) keep their order.
        order.sort_by_key(|&i| meta[usize::from(i)].transmit.src_port);
        (built, built == self.slots)
    }

    fn unsent(&self) -> usize {
        self.meta.len() - self.sent
    }

    /// Sends the built packets not sent yet, as far as the socket buffer takes them. Packets the
    /// socket refuses for good are dropped and counted. Over IPv4 with UDP GSO, the packets that
    /// will leave as the `k`-th segment of a train get their ICRC recomputed for IPv4
    /// identification `k` first (see the [module docs](self)).
    fn flush(&mut self) -> FlushReport<LinkError> {
        let mut report = FlushReport::default();
        let n = self.meta.len();
        while self.sent < n {
            let UdpLink {
                link,
                tx,
                meta,
                sent,
                sealed,
                order,
                peer_port,
                peer_ports,
                scope_id,
                ..
            } = self;
            let gso_v4 = link.local_addr().is_ipv4() && link.offloads().gso;
            let addr = Addressing {
                peer_ports,
                peer_port: *peer_port,
                scope: *scope_id,
            };
            let first = *sent;
            let pending = &order[first..n];
            if gso_v4 {
                let mut positions = [0u16; MAX_TX_BATCH];
                with_datagrams_sized(tx, meta, pending, &addr, |d| {
                    link.gso_positions(d, &mut positions[..pending.len()])
                });
                for (&slot, &position) in pending.iter().zip(&positions) {
                    let j = usize::from(slot);
                    if position != sealed[j] {
                        // The kernel numbers a GSO train's segments' IPv4 identification 0, 1,
                        // 2, ... and the ICRC covers it (IBTA vol. 1 Annex A17.3.3 masks only
                        // TOS, TTL and the header checksum).
                        meta[j].reseal_ipv4(&mut tx[j * SLOT..(j + 1) * SLOT], position);
                        sealed[j] = position;
                    }
                }
            }
            let result = with_datagrams_sized(tx, meta, pending, &addr, |d| link.send(d));
            match result {
                Ok(k) => {
                    *sent += k;
                    if *sent < n {
                        report.blocked += 1;
                        break;
                    }
                }
                Err(e) => {
                    let index = match &e {
                        LinkError::Send { index, .. }
                        | LinkError::InvalidDatagram { index, .. } => *index,
                        _ => n - *sent - 1,
                    };
                    report.dropped += 1;
                    report.error = Some(e);
                    *sent = (*sent + index + 1).min(n);
                }
            }
        }
        report
    }

    fn poller(&self) -> Result<LinkPoller, LinkError> {
        self.link.poller()
    }

    /// A socket has no work of its own: its strays (shared mode) are read in [`Link::recv`].
    fn quiet_rounds_ok(&self) -> bool {
        true
    }
}
