//! The progress engine of a [`UdpDevice`](super::UdpDevice): one round moves a batch of
//! datagrams from the socket into the engine, fires due timers, and moves a batch of packets
//! from the engine to the socket; the progress thread repeats rounds and sleeps in poll(2) when
//! there is nothing to do.
//!
//! # Locks
//! Two mutexes: `io` (the socket, its receive batch and the transmit buffers) and `engine` (the
//! [`SoftHca`]). A round holds `io` throughout and takes `engine` only while the engine runs
//! (never across a system call); verbs take only `engine`. The order is always `io`, then
//! `engine`. The progress thread sleeps holding neither: it polls a duplicate of the socket
//! descriptor ([`LinkPoller`](crate::link::LinkPoller)), so a verb can send on the socket while
//! the thread sleeps.
//!
//! # Waking the thread
//! A verb that created work while the thread sleeps sends it itself if `io` is free
//! (`try_lock`: no thread hand-off on the send path of an idle device); otherwise (the thread is
//! busy and will send it in full batches with the rest, or `io` is taken) it sets `pending` and
//! wakes the thread if it is `sleeping` (a Dekker pair, both `SeqCst`: either the verb sees
//! `sleeping` and wakes it, or the thread sees `pending` before it sleeps). A verb whose round
//! armed a timer earlier than the one the thread sleeps until (`sleep_until`, written by the
//! thread under the engine lock) wakes it too, so no timer fires late.

use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::engine::{Datagram, GatherTransmit, Instant, MAX_TX_SEGMENTS, MAX_UDP_PAYLOAD};
use crate::link::udp::{RecvBatch, RecvDatagram, SendDatagram, UdpLink};
use crate::link::LinkError;

use super::{lock, Shared, ROCEV2_PORT};

/// Most packets built and sent per round (one sendmmsg(2) call, or GSO trains of at most 64).
pub(crate) const MAX_TX_BATCH: usize = 64;

/// Slots of the receive batch a caller polling an idle socket uses (a full batch costs 64
/// message headers to prepare per call).
const IDLE_BATCH: usize = 4;

/// Longest sleep of an idle progress thread with no timer armed (it then re-checks `stop`; a
/// wake ends any sleep at once).
const MAX_SLEEP: Duration = Duration::from_millis(500);

/// Bytes of one transmit slot: the largest UDP payload the engine builds.
const SLOT: usize = MAX_UDP_PAYLOAD;

/// The socket side of a device: owned by whoever runs a round.
pub(crate) struct Io {
    pub(crate) link: UdpLink,
    rx: RecvBatch,
    /// A batch of [`IDLE_BATCH`] slots, cheaper to prepare, for caller rounds after an empty one.
    rx_idle: RecvBatch,
    /// The last caller round received nothing.
    idle: bool,
    /// `slots` transmit buffers of [`SLOT`] bytes, back to back.
    tx: Vec<u8>,
    slots: usize,
    /// Packets built: slot `i` of `tx` holds the head of `meta[i]`, which references its payload
    /// in MR memory (zero-copy); `meta[sent..]` are not sent yet.
    meta: Vec<GatherTransmit>,
    sent: usize,
    /// Per slot: the IPv4 identification its packet's ICRC was computed for.
    sealed: [u16; MAX_TX_BATCH],
    peer_port: u16,
    peer_ports: Vec<(IpAddr, u16)>,
    scope_id: u32,
}

impl Io {
    pub(crate) fn new(link: UdpLink, peer_port: u16, scope_id: u32) -> Io {
        let rx = link.new_recv_batch();
        let rx_idle = link.new_recv_batch_of(IDLE_BATCH);
        let slots = link.config().batch.clamp(1, MAX_TX_BATCH);
        Io {
            link,
            rx,
            rx_idle,
            idle: false,
            tx: vec![0; slots * SLOT],
            slots,
            meta: Vec::with_capacity(slots),
            sent: 0,
            sealed: [0; MAX_TX_BATCH],
            peer_port,
            peer_ports: Vec::new(),
            scope_id,
        }
    }

    pub(crate) fn set_peer_port(&mut self, ip: IpAddr, port: u16) {
        let ip = canonical(ip);
        match self.peer_ports.iter_mut().find(|(a, _)| *a == ip) {
            Some(entry) => entry.1 = port,
            None => self.peer_ports.push((ip, port)),
        }
    }

    fn unsent(&self) -> usize {
        self.meta.len() - self.sent
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

/// What one round did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RoundOutcome {
    /// Datagrams received and handed to the engine.
    pub(crate) received: usize,
    /// Packets built.
    pub(crate) built: usize,
    /// Every transmit slot was used: the engine probably has more.
    pub(crate) tx_full: bool,
    /// The receive batch was full: more datagrams are probably waiting.
    pub(crate) rx_full: bool,
    /// Built packets are waiting for room in the socket buffer.
    pub(crate) blocked: bool,
    /// Datagrams arrived and building what they call for (ACKs, READ responses) was left to
    /// the next round, so that it can go out together with what the caller posts in reply.
    pub(crate) deferred: bool,
    /// The engine's next timer.
    pub(crate) next_timer: Option<Instant>,
}

impl RoundOutcome {
    /// Whether another round should follow at once.
    pub(crate) fn busy(&self) -> bool {
        !self.blocked && (self.tx_full || self.rx_full || self.deferred)
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

/// Calls `f` with the datagrams of `meta` (at most `N`; `P` = `N` x [`PARTS_PER_PACKET`]), whose
/// heads are in `tx`'s slots in the same order: for each packet its head, its payload segments in
/// MR memory (zero-copy; the [`GatherTransmit`] keeps that memory alive) and its trailer (pad,
/// ICRC), addressed as `addr` says. The gather arrays live on the stack for the call.
fn with_datagrams<const N: usize, const P: usize, R>(
    tx: &[u8],
    meta: &[GatherTransmit],
    addr: &Addressing<'_>,
    f: impl FnOnce(&[SendDatagram<'_>]) -> R,
) -> R {
    debug_assert_eq!(P, N * PARTS_PER_PACKET);
    let count = meta.len().min(N);
    let mut parts = [IoSlice::new(&[]); P];
    let mut counts = [0usize; N];
    for (i, t) in meta.iter().enumerate().take(count) {
        let start = i * SLOT;
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
    for (i, g) in meta.iter().enumerate().take(count) {
        let t = &g.transmit;
        let start = i * PARTS_PER_PACKET;
        dgrams[i] = SendDatagram {
            dst: destination(addr.peer_ports, addr.peer_port, addr.scope, t.dst_ip),
            ecn: t.ecn,
            dscp: t.dscp,
            hop_limit: Some(t.hop_limit.max(1)),
            parts: &parts[start..start + counts[i]],
        };
    }
    f(&dgrams[..count])
}

/// [`with_datagrams`] with arrays sized for `meta`: small ones for a few packets.
fn with_datagrams_sized<R>(
    tx: &[u8],
    meta: &[GatherTransmit],
    addr: &Addressing<'_>,
    f: impl FnOnce(&[SendDatagram<'_>]) -> R,
) -> R {
    if meta.len() <= SMALL_WINDOW {
        with_datagrams::<SMALL_WINDOW, { SMALL_WINDOW * PARTS_PER_PACKET }, R>(tx, meta, addr, f)
    } else {
        with_datagrams::<MAX_TX_BATCH, { MAX_TX_BATCH * PARTS_PER_PACKET }, R>(tx, meta, addr, f)
    }
}

fn datagram<'a>(d: &RecvDatagram<'a>, ipv6: bool) -> Datagram<'a> {
    Datagram {
        src_ip: d.src.ip(),
        dst_ip: d.dst.ip(),
        src_port: d.src.port(),
        // Whatever port the device is bound to, its peers addressed RoCEv2's port in the ICRC.
        dst_port: ROCEV2_PORT,
        ecn: d.ecn,
        dscp: d.dscp,
        hop_limit: d.hop_limit.unwrap_or(64),
        // A socket cannot see the IPv4 identification (the ICRC is then not checked); IPv6 has
        // none, so its ICRC is checked.
        ip_ident: if ipv6 { Some(0) } else { None },
        payload: d.payload,
    }
}

impl Shared {
    /// The engine's clock: nanoseconds since the device was opened.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    pub(crate) fn notify_cq_waiters(&self) {
        if self.cq_waiters.load(Ordering::SeqCst) > 0 {
            self.cq_cv.notify_all();
        }
    }

    fn record_error(&self, e: &LinkError) {
        *lock(&self.last_error) = Some(e.to_string());
    }

    /// One round on the calling thread: receive (if `rx`), timers, transmit. `thread`: the
    /// progress thread runs it and publishes its next wake-up time.
    pub(crate) fn round(&self, io: &mut Io, rx: bool) -> RoundOutcome {
        self.round_as(io, rx, false, false)
    }

    /// As [`Shared::round`]; `thread`: the progress thread runs it (it publishes its next
    /// wake-up); `defer`: when datagrams arrive, build nothing this round (a caller polling in a
    /// loop runs the next one at once, or posts its reply first: ACK and reply then leave in one
    /// sendmmsg(2)).
    fn round_as(&self, io: &mut Io, rx: bool, thread: bool, defer: bool) -> RoundOutcome {
        lock(&self.counters).rounds += 1;
        let mut out = RoundOutcome::default();
        if io.unsent() > 0 {
            self.flush(io);
            out.blocked = io.unsent() > 0;
        }
        // A caller spinning on an idle socket polls with the small batch; the thread (woken by
        // data) and a caller that just got some use the full one.
        let small = rx && defer && io.idle;
        if rx {
            let (link, batch) = if small {
                (&mut io.link, &mut io.rx_idle)
            } else {
                (&mut io.link, &mut io.rx)
            };
            match link.recv(batch) {
                Ok(n) => {
                    out.received = n;
                    out.rx_full = n >= batch.capacity();
                }
                Err(e) => {
                    lock(&self.counters).rx_errors += 1;
                    self.record_error(&e);
                }
            }
            if defer {
                io.idle = out.received == 0;
            }
        }
        let mut fired = false;
        {
            let mut e = lock(&self.engine);
            let now = self.now();
            if out.received > 0 {
                let batch = if small { &io.rx_idle } else { &io.rx };
                for d in batch.iter() {
                    e.handle_datagram(now, &datagram(&d, self.ipv6));
                }
            }
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
                fired = true;
            }
            out.deferred = defer && out.received > 0;
            if !out.blocked && !out.deferred {
                io.meta.clear();
                io.sent = 0;
                for slot in io.tx.chunks_exact_mut(SLOT) {
                    match e.poll_transmit_gather(now, slot) {
                        Some(t) => io.meta.push(t),
                        None => break,
                    }
                }
                out.built = io.meta.len();
                io.sealed[..out.built].fill(crate::engine::IPV4_IDENT);
                out.tx_full = out.built == io.slots;
            }
            out.next_timer = e.poll_timeout();
            if thread {
                let until = out.next_timer.map_or(u64::MAX, Instant::as_nanos);
                self.sleep_until.store(until, Ordering::SeqCst);
            }
        }
        if out.received > 0 || out.built > 0 || fired {
            self.epoch.fetch_add(1, Ordering::Release);
            self.notify_cq_waiters();
        }
        if out.built > 0 {
            self.flush(io);
            out.blocked = io.unsent() > 0;
        }
        out
    }

    /// Sends the built packets not sent yet, as far as the socket buffer takes them. Packets the
    /// socket refuses for good are dropped and counted (the transport recovers as from a loss).
    /// Over IPv4 with UDP GSO, the packets that will leave as the `k`-th segment of a train get
    /// their ICRC recomputed for IPv4 identification `k` first
    /// ([`GatherTransmit::reseal_ipv4`]).
    fn flush(&self, io: &mut Io) {
        let n = io.meta.len();
        while io.sent < n {
            let Io {
                link,
                tx,
                meta,
                sent,
                sealed,
                peer_port,
                peer_ports,
                scope_id,
                ..
            } = &mut *io;
            let gso_v4 = link.local_addr().is_ipv4() && link.offloads().gso;
            let addr = Addressing {
                peer_ports,
                peer_port: *peer_port,
                scope: *scope_id,
            };
            let first = *sent;
            if gso_v4 {
                let mut positions = [0u16; MAX_TX_BATCH];
                with_datagrams_sized(&tx[first * SLOT..], &meta[first..n], &addr, |d| {
                    link.gso_positions(d, &mut positions[first..n])
                });
                for j in first..n {
                    if positions[j] != sealed[j] {
                        // The kernel numbers a GSO train's segments' IPv4 identification 0, 1,
                        // 2, ... and the ICRC covers it (IBTA vol. 1 Annex A17.3.3 masks only
                        // TOS, TTL and the header checksum).
                        meta[j].reseal_ipv4(&mut tx[j * SLOT..(j + 1) * SLOT], positions[j]);
                        sealed[j] = positions[j];
                    }
                }
            }
            let result = with_datagrams_sized(&tx[first * SLOT..], &meta[first..n], &addr, |d| {
                link.send(d)
            });
            match result {
                Ok(k) => {
                    *sent += k;
                    if *sent < n {
                        lock(&self.counters).tx_blocked += 1;
                        break;
                    }
                }
                Err(e) => {
                    let index = match &e {
                        LinkError::Send { index, .. }
                        | LinkError::InvalidDatagram { index, .. } => *index,
                        _ => n - *sent - 1,
                    };
                    self.record_error(&e);
                    lock(&self.counters).tx_dropped += 1;
                    *sent = (*sent + index + 1).min(n);
                }
            }
        }
    }

    /// A round on a caller's thread (caller-driven progress, or an explicit `progress()`).
    pub(crate) fn caller_round(&self) -> RoundOutcome {
        let caller = self.progress == super::Progress::Caller;
        let outcome = {
            let mut io = lock(&self.io);
            // Deferring builds to the caller's next round only makes sense if there is one.
            self.round_as(&mut io, true, false, caller)
        };
        if !caller {
            self.after_foreign_round(&outcome);
        }
        outcome
    }

    /// After a round the progress thread did not run: make it run one if work is left or a
    /// timer now expires before the thread wakes by itself.
    fn after_foreign_round(&self, outcome: &RoundOutcome) {
        let earlier_timer = outcome
            .next_timer
            .is_some_and(|t| t.as_nanos() < self.sleep_until.load(Ordering::SeqCst));
        if outcome.tx_full || outcome.rx_full || outcome.blocked || earlier_timer {
            self.request_round();
        }
    }

    /// After a verb created work: send it now if the socket is free, and make sure the progress
    /// thread (if any) runs a round if more is left or a timer moved earlier.
    pub(crate) fn kick(&self) {
        if self.progress == super::Progress::Thread && !self.sleeping.load(Ordering::SeqCst) {
            // The thread is busy: it builds the new work with everything else in its next
            // round, in full batches (sending here would split them into small ones).
            self.request_round();
            return;
        }
        let outcome = match self.io.try_lock() {
            Ok(mut io) => {
                lock(&self.counters).inline_rounds += 1;
                self.round(&mut io, false)
            }
            Err(_) => {
                self.request_round();
                return;
            }
        };
        if self.progress == super::Progress::Caller {
            return;
        }
        self.after_foreign_round(&outcome);
    }

    /// Makes the progress thread run a round soon.
    fn request_round(&self) {
        if self.progress == super::Progress::Caller {
            return;
        }
        self.pending.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            lock(&self.counters).wakes += 1;
            let _ = self.waker.wake();
        }
    }

    /// The progress thread: rounds until `stop`, sleeping in poll(2) when idle.
    pub(crate) fn run_thread(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let outcome = {
                let mut io = lock(&self.io);
                self.round_as(&mut io, true, true, false)
            };
            if outcome.busy() {
                continue;
            }
            self.sleeping.store(true, Ordering::SeqCst);
            if self.pending.swap(false, Ordering::SeqCst) || self.stop.load(Ordering::SeqCst) {
                self.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let until = self.sleep_until.load(Ordering::SeqCst);
            let now = self.now().as_nanos();
            let timeout = if until == u64::MAX {
                MAX_SLEEP
            } else {
                Duration::from_nanos(until.saturating_sub(now)).min(MAX_SLEEP)
            };
            if !timeout.is_zero() {
                lock(&self.counters).sleeps += 1;
                if let Err(e) = self
                    .poller
                    .wait(outcome.blocked, Some(&self.waker), timeout)
                {
                    self.record_error(&e);
                    // Do not spin on a persistent poll error.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.sleeping.store(false, Ordering::SeqCst);
            // A wake consumed by `wait` may have been for `pending`: the next round covers it.
            self.pending.store(false, Ordering::SeqCst);
        }
    }
}
