//! The inter-node transport: the slot protocol over RDMA (RoCEv2) with the `hca` crate's verbs,
//! on a software HCA over a kernel UDP socket ([`hca::soft::UdpDevice`]).
//!
//! # RDMA in one paragraph
//! An RDMA device (HCA) moves bytes between *registered* memory of two hosts without the remote
//! CPU. A program registers memory (an MR: a local key, *lkey*, for its own work requests and a
//! remote key, *rkey*, that lets a peer address it), creates a reliable-connected queue pair (RC
//! QP) per peer, tells each QP the peer's QP number (QPN), address (GID) and first packet
//! sequence number (PSN), and posts work requests (WRs): an *RDMA WRITE* copies local bytes into
//! the peer's memory at an address and rkey the peer published; *WITH_IMM* also delivers a 32-bit
//! immediate to the peer in a receive completion (CQE), consuming one of its posted receive WRs;
//! a *SEND* lands in the buffer of the peer's next receive WR. Completions are read from a
//! completion queue (CQ). RC retransmits lost packets; when the peer stops acknowledging, the WR
//! completes with `IBV_WC_RETRY_EXC_ERR` and the QP goes to the error state, which flushes every
//! other WR (`IBV_WC_WR_FLUSH_ERR`).
//!
//! # The slot protocol on verbs
//! Each rank opens one device ([`UdpDevice`](hca::soft::UdpDevice): one UDP socket, one GID) and, per peer pair and
//! channel, one RC QP with its own CQ. The QP carries both directions of the channel:
//!
//! ```text
//!   sender                                                  receiver
//!   staging slot k % nslots (local MR, lkey)               receive slot k % nslots (MR, rkey)
//!   wait_slot: credit for k and WR k - nslots done
//!   fill the staging slot (copy / reduce)
//!   post: RDMA WRITE_WITH_IMM  header + payload  ------->  slot written, then CQE
//!         imm = step << 16 | chunk                          (IBV_WC_RECV_RDMA_WITH_IMM, imm):
//!                                                           wait() returns the slot in place
//!   credit = imm  <---------------------------------------  release(): SEND_WITH_IMM, 0 bytes,
//!   (IBV_WC_RECV)                                            imm = steps consumed (head)
//!   abort word <------------------------------------------  abort(): SEND of the 4-byte word
//! ```
//!
//! * **Data.** One RDMA WRITE_WITH_IMM per step writes the payload into the receiver's slot
//!   `step % nslots`, preceded by the 64-byte [`SlotHeader`](crate::transport::SlotHeader) on the
//!   first step of each operation on the channel only (a full 128 KiB step is then 32 packets at
//!   a 4096-byte PMTU, not 33; the immediate says whether a header came: `connector`'s docs); the
//!   receive completion replaces the tail counter of shared memory. RC delivers the messages of
//!   one QP in order, so completions arrive in step order; the receiver checks the immediate's
//!   step, that a header repeats the immediate and that the completion's byte count is the
//!   header's length plus 64, or for a step without a header that it fits the slot; such a step
//!   belongs to the operation of the last header.
//! * **Credits.** The receiver returns a slot with a zero-byte SEND_WITH_IMM whose immediate is
//!   its new `head` (steps consumed, modulo 2^32). A SEND rather than an RDMA WRITE of `head`
//!   into the sender's memory: the sender then learns of credits from its CQ, so a sender out of
//!   credits can sleep on the CQ instead of spinning on a memory word.
//! * **Receive WRs.** Every incoming data write and credit consumes one receive WR. At most
//!   `nslots` data steps and `nslots` credits can be outstanding towards a rank before it polls
//!   (the credit protocol bounds both), so each QP keeps `2 * nslots + 8` receive WRs posted and
//!   reposts what each poll consumed; the QP's RNR retry count is infinite anyway.
//! * **Staging copy.** The algorithms fill a slot (a copy of user data, or a reduction of an
//!   incoming chunk with user data) and post it; the RoCE slot being filled is a local staging
//!   slot, which the HCA then writes into the peer's slot. For a reduction that is no extra copy:
//!   the reduction writes straight into registered memory. For a plain send of user data it is
//!   one copy, as in NCCL's Simple protocol over its net transport (the kernel copies into the
//!   registered FIFO, the proxy posts from it). On the receiving side there is no copy: the
//!   algorithm reads (or reduces from) the registered receive slot in place.
//!   [`SendConnector::post_from`] removes the staging copy where the source is user memory that
//!   is not written during the operation: the WRITE's payload SGE points into the user buffer,
//!   registered through the [`RegCache`] as a whole on its first send (a buffer passed again is
//!   not registered again, and every chunk of it hits the one registration). The algorithms use
//!   it for the input of an out-of-place collective and for every forwarding step (NCCL's
//!   recvCopySend of all-gather and broadcast, the last reduce-scatter step of all-reduce, a
//!   rank's own all-gather block, the broadcast root): those chunks are sent from the user's
//!   *output*, where they are final and, as the algorithms promise (`Io` in
//!   `algorithms`, asserted in debug builds), never written again within the operation. What
//!   still goes through a staging slot: the reductions (recvReduceSend writes the staging slot
//!   directly, no extra copy) and sends of an in-place operation's input, which the output may
//!   overwrite while the WRITE is in flight (the first reduce-scatter step of an in-place
//!   all-reduce sends input that the all-gather of the same round overwrites).
//! * **Staging reuse.** A staging slot is refilled for step `k` only after the WR of step
//!   `k - nslots` has completed locally (the HCA no longer reads it) *and* the receiver has
//!   released step `k - nslots` (its slot is free): both the CQE and the credit.
//!
//! # Failures
//! Every wait is bounded by the operation timeout and, between sleeps of at most
//! [`SLEEP_SLICE`](crate::transport::wait::SLEEP_SLICE), checks in order: the condition, an abort message
//! from the peer, a completion error of the QP, the timeout, and the liveness of a peer process on
//! the same host (pidfd). A peer on another host that dies is found by the QP itself: WRs to it
//! are retransmitted until the retry count runs out (`IBV_WC_RETRY_EXC_ERR`), and a rank that
//! waits for data with nothing outstanding posts a zero-byte RDMA WRITE as a *probe* after
//! [`PROBE_AFTER`] without progress. `RETRY_EXC_ERR` and `RNR_RETRY_EXC_ERR` become
//! [`TransportError::PeerDied`] naming the peer; other completion errors
//! [`TransportError::QpFailed`]. A rank that fails or closes its communicator sends an abort
//! message (the 4-byte [`Abort`](crate::transport::Abort) word) on every QP, after everything it posted before (RC order),
//! so data sent before a close is still delivered.
//!
//! # Progress
//! The engine of the device does nothing by itself (sans-I/O); someone must receive datagrams,
//! fire timers and send. By default the rank thread does it while it waits
//! ([`Progress::Caller`](hca::soft::Progress::Caller)): a wait polls the CQ (each poll is a progress round: recvmmsg(2),
//! engine, sendmmsg(2)), and when it sleeps, it sleeps in poll(2) on the socket, so an arriving
//! datagram wakes the thread that needs it, with no hand-off between threads. A post sends its
//! packets at once on the posting thread. Between operations a *keepalive* thread runs rounds
//! when the rank thread has not for [`KEEPALIVE`] (ACKs the rank still owes its peers, timers),
//! so that a rank that computes for minutes between collectives neither stalls its peers nor
//! makes them exhaust their retries. `COLL_ROCE_PROGRESS=thread` gives the device its own
//! progress thread instead ([`Progress::Thread`](hca::soft::Progress::Thread)); waits then sleep on the CQ's condition
//! variable (two thread hand-offs per message).
//!
//! # Addresses
//! The UDP device tells peers apart by IP address (its peer-port table is per address) and a
//! rank's GID is its address, so every rank needs an address of its own. In order:
//! 1. `COLL_ROCE_ADDR`: an address, or a comma-separated list of which the rank takes entry
//!    `local_rank % len` (ranks of one host: several NICs or IP aliases).
//! 2. When the rendezvous root is on a loopback address (every rank on this host, in one network
//!    namespace: the bare `coll-perf --ranks N`, tests), `127.0.0.0 + rank + 1`: all of
//!    `127.0.0.0/8` is the loopback interface on Linux.
//! 3. Otherwise the local address of the rank's connection to the rendezvous root (the address
//!    of this host on the route to the root, which the other ranks can reach).
//!
//! Each device binds an ephemeral UDP port (`COLL_ROCE_PORT` to choose one) and publishes it in
//! its connection info. Two peers of one rank with one address are refused at connect with an
//! error naming both.
//!
//! # Connection info (the bootstrap record of this transport, little-endian)
//! `magic "COLLROC1" u64, version u32, gid [16], udp port u32, active MTU code u32, nchannels
//! u32, nslots u32, slot_bytes u64, receive region iova u64, length u64, rkey u32, peer count
//! u32, then per peer: rank u32, per channel: QPN u32, PSN u32, ring iova u64` (the ring that
//! receives from that peer on that channel).
//!
//! # Tunables (environment)
//! `COLL_ROCE_LINK`: `verbs:DEVICE` opens that libibverbs device (`hca::ibverbs`: a real HCA or
//! the kernel's rxe) in every rank instead of the software HCA; ranks may then share a device
//! and an address (the HCA tells QPs apart by QPN); `udp:ADDRESS[:PORT]` is `COLL_ROCE_ADDR` +
//! `COLL_ROCE_PORT` in one; `udp` alone changes nothing.
//! `COLL_ROCE_ADDR`, `COLL_ROCE_PORT`; `COLL_ROCE_TIMEOUT` (the QP's local ACK timeout exponent:
//! 4.096 us * 2^t, default 17 = 0.54 s) and `COLL_ROCE_RETRY_CNT` (default 7): a dead peer is
//! found after about `(retry_cnt + 1) * 4.096 us * 2^t`; `COLL_ROCE_PROGRESS=caller|thread`
//! (who drives the device, default caller); `COLL_ROCE_WINDOW` (the software HCA's window of
//! unacknowledged packets per QP, `hca::engine::EngineConfig::max_unacked_psns`, 1 ..= 8192,
//! default 128, shared as the device's budget allows) and `COLL_ROCE_ACK_DELAY_US` (how long a
//! plain ACK may wait for a request of its QP, here the credit, to leave with it:
//! `EngineConfig::ack_delay`, 0 ..= 10000 us, default 0); `COLL_ROCE_STATS=1` prints the
//! device's engine, link and progress counters, the registration cache's registrations and
//! hits, and the transport's wait and pipelining counters (`stats`: waits by reason, how many
//! found their condition at once, slept, and what blocked a sender; chunks in flight per post)
//! to stderr when the communicator closes.
//!
//! # Files
//! `env` (the environment and the address), `device` (opening the device, its PD and
//! registered regions), `keepalive`, `registration` (the user-buffer cache), `layout` (ring
//! geometry), `info` (the connection info), `qp` (QP creation and bring-up), `channel` (one QP's
//! state and waits), `connector` (the send and receive ends), `stats` (the wait and pipelining
//! counters); this file: [`RoceTransport`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hca::AccessFlags;

use crate::codec::Writer;
use crate::transport::sys::Liveness;
use crate::transport::{
    PeerConnectors, RecvConnector, SendConnector, SetupContext, Transport, TransportError,
    TransportKind,
};

// Edges (DMA): the next four read and write registered memory that the HCA writes and reads
// by itself (slots, control words, user buffers sent in place).
#[allow(unsafe_code)]
mod channel;
#[allow(unsafe_code)]
mod connector;
#[allow(unsafe_code)]
mod device;
mod env;
mod info;
mod keepalive;
mod layout;
mod qp;
#[allow(unsafe_code)]
mod registration;
mod stats;
#[cfg(test)]
#[allow(unsafe_code)]
mod tests;

use channel::{ChanState, Channel, CTRL_BYTES};
use connector::{RoceRecv, RoceSend};
use device::{Hca, Region};
use env::RoceEnv;
use info::{PeerInfo, INFO_MAGIC, INFO_VERSION};
use layout::Layout;
use qp::PendingQp;

pub use channel::PROBE_AFTER;
#[cfg(feature = "perf")]
pub(crate) use env::device_from_env;
pub use keepalive::KEEPALIVE;
pub use registration::RegCache;

/// What `setup` made for `connect`.
struct Pending {
    peers: Vec<usize>,
    qps: Vec<Vec<PendingQp>>,
    recv: Arc<Region>,
    send: Arc<Region>,
    ctrl: Arc<Region>,
    layout: Layout,
}

/// The RoCE transport ([`TransportKind::Roce`]); see the [module docs](self).
pub struct RoceTransport {
    env: Option<RoceEnv>,
    hca: Option<Arc<Hca>>,
    pending: Option<Pending>,
    /// The channels made by `connect` (diagnostics and tests; the connectors own them).
    channels: Vec<std::sync::Weak<Channel>>,
}

impl Default for RoceTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl RoceTransport {
    /// A transport that opens its device in [`Transport::setup`] (reading the `COLL_ROCE_*`
    /// environment then).
    pub fn new() -> Self {
        RoceTransport {
            env: None,
            hca: None,
            pending: None,
            channels: Vec::new(),
        }
    }

    /// The bound address of this rank's device, once set up.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        let hca = self.hca.as_ref()?;
        let port = hca.dev.udp_port()?;
        Some(std::net::SocketAddr::new(
            hca.dev.default_gid().1.to_ip(),
            port,
        ))
    }

    fn open(&mut self, ctx: &SetupContext<'_>) -> Result<Arc<Hca>, TransportError> {
        let env = match &self.env {
            Some(e) => e.clone(),
            None => RoceEnv::from_env()?,
        };
        let hca = Hca::open(ctx, &env)?;
        self.env = Some(env);
        self.hca = Some(hca.clone());
        Ok(hca)
    }
}

impl Transport for RoceTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Roce
    }

    fn setup(
        &mut self,
        ctx: &SetupContext<'_>,
        peers: &[usize],
    ) -> Result<Vec<u8>, TransportError> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let hca = self.open(ctx)?;
        let layout = Layout {
            nchannels: ctx.nchannels,
            nslots: ctx.nslots,
            slot_bytes: ctx.slot_bytes,
        };
        let rings = peers.len() * ctx.nchannels;
        let bytes = rings * layout.ring_bytes();
        let recv = Arc::new(Region::new(
            &hca,
            bytes,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            "receive slots",
        )?);
        let send = Arc::new(Region::new(
            &hca,
            bytes,
            AccessFlags::empty(),
            "staging slots",
        )?);
        let ctrl = Arc::new(Region::new(
            &hca,
            rings * CTRL_BYTES,
            AccessFlags::LOCAL_WRITE,
            "control blocks",
        )?);
        let port = hca.dev.query_port();
        let (_, gid) = hca.dev.default_gid();
        let mut w = Writer::default();
        w.u64(INFO_MAGIC)
            .u32(INFO_VERSION)
            .bytes(gid.as_bytes())
            .u32(u32::from(hca.dev.udp_port().unwrap_or(0)))
            .u32(u32::from(port.active_mtu.code()))
            .u32(ctx.nchannels as u32)
            .u32(ctx.nslots as u32)
            .u64(ctx.slot_bytes as u64)
            .u64(recv.iova(0))
            .u64(bytes as u64)
            .u32(recv.mr.rkey())
            .u32(peers.len() as u32);
        let mut qps = Vec::with_capacity(peers.len());
        for (i, &peer) in peers.iter().enumerate() {
            w.u32(peer as u32);
            let mut chans = Vec::with_capacity(ctx.nchannels);
            for c in 0..ctx.nchannels {
                let qp = qp::create(&hca, &layout, peer)?;
                w.u32(qp.qpn)
                    .u32(qp.psn)
                    .u64(recv.iova(layout.ring_offset(i, c)));
                chans.push(qp);
            }
            qps.push(chans);
        }
        self.pending = Some(Pending {
            peers: peers.to_vec(),
            qps,
            recv,
            send,
            ctrl,
            layout,
        });
        Ok(w.buf)
    }

    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        peers: &[usize],
        infos: &[Vec<u8>],
    ) -> Result<Vec<PeerConnectors>, TransportError> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let (Some(hca), Some(pending), Some(env)) =
            (self.hca.clone(), self.pending.take(), self.env.clone())
        else {
            return Err(TransportError::BadInfo {
                peer: peers[0],
                what: "connect before setup".into(),
            });
        };
        if pending.peers != peers {
            return Err(TransportError::BadInfo {
                peer: peers[0],
                what: "connect for other peers than setup".into(),
            });
        }
        let layout = pending.layout;
        let my_mtu = hca.dev.query_port().active_mtu;
        let my_ip = hca.dev.default_gid().1.to_ip();
        let mut by_ip: HashMap<IpAddr, usize> = HashMap::new();
        let mut out = Vec::with_capacity(peers.len());
        for (i, &peer) in peers.iter().enumerate() {
            let bad = |what: String| TransportError::BadInfo { peer, what };
            let info =
                PeerInfo::parse(infos.get(peer).map(Vec::as_slice).unwrap_or(&[])).map_err(bad)?;
            if info.layout != layout {
                return Err(bad(format!(
                    "geometry {:?} there, {layout:?} here",
                    info.layout
                )));
            }
            let Some((_, theirs)) = info.peers.iter().find(|(r, _)| *r == ctx.rank) else {
                return Err(bad(format!("no QPs for rank {}", ctx.rank)));
            };
            if theirs.len() != layout.nchannels {
                return Err(bad(format!("{} channels for this rank", theirs.len())));
            }
            let ip = info.gid.to_ip();
            // A libibverbs device tells QPs apart by QPN whatever their address: ranks may
            // share one (and one HCA).
            if ip == my_ip && hca.software {
                return Err(TransportError::Unavailable {
                    transport: TransportKind::Roce,
                    peer,
                    reason: format!(
                        "it uses this rank's own address {ip}: every rank needs its own \
                         (set COLL_ROCE_ADDR per rank, see collectives::transport::roce)"
                    ),
                });
            }
            if let Some(other) = by_ip.insert(ip, peer).filter(|_| hca.software) {
                return Err(TransportError::Unavailable {
                    transport: TransportKind::Roce,
                    peer,
                    reason: format!(
                        "it shares address {ip} with peer rank {other}: the UDP device tells \
                         peers apart by address, so every rank needs its own (set \
                         COLL_ROCE_ADDR per rank, or rendezvous on 127.0.0.1 when every rank \
                         runs on this host)"
                    ),
                });
            }
            if hca.software {
                hca.dev
                    .set_peer_port(ip, info.port)
                    .map_err(Hca::verbs("setting the peer's UDP port", Some(peer)))?;
            }
            let mtu = if info.mtu.bytes() < my_mtu.bytes() {
                info.mtu
            } else {
                my_mtu
            };
            let same_host = ctx.cards.get(peer).map(|c| c.host_id)
                == ctx.cards.get(ctx.rank).map(|c| c.host_id);
            let pid = ctx.cards.get(peer).map_or(0, |c| c.pid);
            // A peer on this host is watched through its pid, if that pid is a live process here
            // (the peer just sent its info, so a pid that is not is in another pid namespace).
            let liveness = Arc::new(match same_host.then(|| Liveness::watch(pid)) {
                Some(l) if l.alive() => l,
                _ => Liveness::Unwatched,
            });
            let mut send: Vec<Box<dyn SendConnector>> = Vec::with_capacity(layout.nchannels);
            let mut recv: Vec<Box<dyn RecvConnector>> = Vec::with_capacity(layout.nchannels);
            for (c, qp) in pending.qps[i].iter().enumerate() {
                let remote = theirs[c];
                let ring = remote.ring;
                let (base, len) = info.region;
                let ring_end = ring.checked_add(layout.ring_bytes() as u64);
                if ring < base || ring_end.is_none_or(|e| e > base.saturating_add(len)) {
                    return Err(bad(format!(
                        "ring at {ring:#x} outside its receive region {base:#x}+{len}"
                    )));
                }
                qp::up(&hca, &env, qp, peer, info.gid, &remote, mtu)?;
                let ch = Arc::new(Channel {
                    hca: hca.clone(),
                    rank: ctx.rank,
                    peer,
                    pid,
                    channel: c,
                    qpn: qp.qpn,
                    cq: qp.cq,
                    layout,
                    recv: pending.recv.clone(),
                    recv_off: layout.ring_offset(i, c),
                    send: pending.send.clone(),
                    send_off: layout.ring_offset(i, c),
                    ctrl: pending.ctrl.clone(),
                    ctrl_off: (i * layout.nchannels + c) * CTRL_BYTES,
                    remote_ring: ring,
                    rkey: info.rkey,
                    liveness: liveness.clone(),
                    policy: ctx.wait,
                    state: Mutex::new(ChanState {
                        arrivals: std::collections::VecDeque::with_capacity(layout.nslots),
                        credit: 0,
                        posted: 0,
                        data_done: 0,
                        sq_outstanding: 0,
                        user_wrs: 0,
                        recv_posted: 0,
                        probe_outstanding: false,
                        peer_abort: None,
                        failure: None,
                        abort_sent: false,
                        last_progress: Instant::now(),
                    }),
                });
                ch.replenish(&mut ch.state())?;
                self.channels.push(Arc::downgrade(&ch));
                send.push(Box::new(RoceSend {
                    ch: ch.clone(),
                    step: 0,
                    slot_held: false,
                    last_desc: None,
                }));
                recv.push(Box::new(RoceRecv {
                    ch,
                    step: 0,
                    held: None,
                    last_desc: None,
                    timeout: Duration::from_secs(60),
                }));
            }
            out.push(PeerConnectors { peer, send, recv });
        }
        Ok(out)
    }

    fn finish(&mut self) -> Result<(), TransportError> {
        // The channels hold the device and the regions; nothing here outlives setup.
        self.pending = None;
        Ok(())
    }
}
