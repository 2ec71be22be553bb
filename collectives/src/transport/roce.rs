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
//! Each rank opens one device ([`UdpDevice`]: one UDP socket, one GID) and, per peer pair and
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
//! * **Data.** One RDMA WRITE_WITH_IMM per step writes the 64-byte [`SlotHeader`] and the
//!   payload into the receiver's slot `step % nslots`; the receive completion replaces the tail
//!   counter of shared memory. RC delivers the messages of one QP in order, so completions arrive
//!   in step order; the receiver checks the immediate's step, that the header repeats the
//!   immediate, and that the completion's byte count is the header's length plus 64.
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
//! [`SLEEP_SLICE`], checks in order: the condition, an abort message
//! from the peer, a completion error of the QP, the timeout, and the liveness of a peer process on
//! the same host (pidfd). A peer on another host that dies is found by the QP itself: WRs to it
//! are retransmitted until the retry count runs out (`IBV_WC_RETRY_EXC_ERR`), and a rank that
//! waits for data with nothing outstanding posts a zero-byte RDMA WRITE as a *probe* after
//! [`PROBE_AFTER`] without progress. `RETRY_EXC_ERR` and `RNR_RETRY_EXC_ERR` become
//! [`TransportError::PeerDied`] naming the peer; other completion errors
//! [`TransportError::QpFailed`]. A rank that fails or closes its communicator sends an abort
//! message (the 4-byte [`Abort`] word) on every QP, after everything it posted before (RC order),
//! so data sent before a close is still delivered.
//!
//! # Progress
//! The engine of the device does nothing by itself (sans-I/O); someone must receive datagrams,
//! fire timers and send. By default the rank thread does it while it waits
//! ([`Progress::Caller`]): a wait polls the CQ (each poll is a progress round: recvmmsg(2),
//! engine, sendmmsg(2)), and when it sleeps, it sleeps in poll(2) on the socket, so an arriving
//! datagram wakes the thread that needs it, with no hand-off between threads. A post sends its
//! packets at once on the posting thread. Between operations a *keepalive* thread runs rounds
//! when the rank thread has not for [`KEEPALIVE`] (ACKs the rank still owes its peers, timers),
//! so that a rank that computes for minutes between collectives neither stalls its peers nor
//! makes them exhaust their retries. `COLL_ROCE_PROGRESS=thread` gives the device its own
//! progress thread instead ([`Progress::Thread`]); waits then sleep on the CQ's condition
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
//! (who drives the device, default caller); `COLL_ROCE_STATS=1` prints the device's engine,
//! link and progress counters, and the registration cache's registrations and hits, to stderr
//! when the communicator closes.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpu_p2p::{HostMemory, HostPtr, Memory, MemoryError, MemoryKind};
use hca::ibverbs::IbvDevice;
use hca::open::DeviceSpec;
use hca::soft::{DeviceError, Progress, UdpDevice, UdpDeviceConfig};
use hca::verbs::Verbs;
use hca::{
    AccessFlags, AhAttr, CqHandle, Gid, MemoryRegion, PathMtu, PdHandle, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

use super::sys::Liveness;
use super::wait::{WaitPolicy, SLEEP_SLICE};
use super::{
    Abort, AbortReason, Imm, OpDesc, PeerConnectors, RecvChunk, RecvConnector, SendConnector,
    SetupContext, SlotHeader, Transport, TransportError, TransportKind, WaitFor,
};
use crate::codec::{Reader, Writer};

/// "COLLROC1".
const INFO_MAGIC: u64 = u64::from_le_bytes(*b"COLLROC1");
const INFO_VERSION: u32 = 1;

/// How long a wait goes without progress before it probes the peer with a zero-byte RDMA WRITE
/// (an unreachable peer then fails the probe with `IBV_WC_RETRY_EXC_ERR`).
pub const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Bytes of a channel's control block in the control region: the outgoing abort word at 0, the
/// landing buffer of incoming SENDs at 8 (8 bytes).
const CTRL_BYTES: usize = 64;
const CTRL_ABORT_OUT: usize = 0;
const CTRL_LANDING: usize = 8;
const LANDING_BYTES: u32 = 8;

/// Kinds of work request, in the top byte of the `wr_id`.
const WR_DATA: u64 = 1 << 56;
const WR_CREDIT: u64 = 2 << 56;
const WR_ABORT: u64 = 3 << 56;
const WR_PROBE: u64 = 4 << 56;
const WR_RECV: u64 = 5 << 56;
/// A data WR whose payload SGE points into user memory (`post_from`).
const WR_DATA_USER: u64 = 6 << 56;
const WR_KIND: u64 = 0xff << 56;

/// Completions taken from a CQ per poll.
const POLL_BATCH: usize = 32;

/// How long an abort waits for WRs that read user memory to complete before it cancels them by
/// moving the QP to the error state.
const QUIESCE: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Settings read from the environment (see the [module docs](self#tunables-environment)).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RoceEnv {
    /// `COLL_ROCE_LINK=verbs:DEVICE`: every rank opens that libibverbs device instead of a UDP
    /// device.
    verbs: Option<String>,
    addrs: Vec<IpAddr>,
    port: u16,
    qp_timeout: u8,
    retry_cnt: u8,
    progress: Progress,
}

fn env_error(var: &'static str, value: &str, expected: &str) -> TransportError {
    TransportError::Setup {
        peer: None,
        op: "reading the environment",
        on: format!("{var}={value}"),
        source: io::Error::new(io::ErrorKind::InvalidInput, format!("expected {expected}")),
    }
}

impl RoceEnv {
    fn from_env() -> Result<RoceEnv, TransportError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut env = RoceEnv {
            verbs: None,
            addrs: Vec::new(),
            port: 0,
            qp_timeout: 17,
            retry_cnt: 7,
            progress: Progress::Caller,
        };
        if let Some(v) = get("COLL_ROCE_ADDR") {
            for a in v.split(',') {
                let ip = a.trim().parse::<IpAddr>().map_err(|_| {
                    env_error("COLL_ROCE_ADDR", &v, "IP addresses separated by commas")
                })?;
                env.addrs.push(ip);
            }
        }
        if let Some(v) = get("COLL_ROCE_LINK").filter(|v| v.trim() != "udp") {
            match v.trim().parse::<DeviceSpec>() {
                Ok(DeviceSpec::Verbs(name)) => env.verbs = Some(name),
                Ok(DeviceSpec::Udp { ip, port }) => {
                    env.addrs = vec![ip];
                    env.port = port.unwrap_or(hca::soft::ROCEV2_PORT);
                }
                _ => {
                    return Err(env_error(
                        "COLL_ROCE_LINK",
                        &v,
                        "verbs:DEVICE, udp or udp:ADDRESS[:PORT]",
                    ))
                }
            }
        }
        if let Some(v) = get("COLL_ROCE_PORT") {
            env.port = v
                .trim()
                .parse()
                .map_err(|_| env_error("COLL_ROCE_PORT", &v, "a UDP port"))?;
        }
        if let Some(v) = get("COLL_ROCE_TIMEOUT") {
            env.qp_timeout = v
                .trim()
                .parse()
                .ok()
                .filter(|t| (1..=31).contains(t))
                .ok_or_else(|| env_error("COLL_ROCE_TIMEOUT", &v, "1 ..= 31"))?;
        }
        if let Some(v) = get("COLL_ROCE_RETRY_CNT") {
            env.retry_cnt = v
                .trim()
                .parse()
                .ok()
                .filter(|t| *t <= 7)
                .ok_or_else(|| env_error("COLL_ROCE_RETRY_CNT", &v, "0 ..= 7"))?;
        }
        if let Some(v) = get("COLL_ROCE_PROGRESS") {
            env.progress = match v.trim() {
                "thread" => Progress::Thread,
                "caller" => Progress::Caller,
                _ => return Err(env_error("COLL_ROCE_PROGRESS", &v, "thread or caller")),
            };
        }
        Ok(env)
    }
}

/// The RDMA device this transport's environment (`COLL_ROCE_LINK`, `COLL_ROCE_ADDR`) selects, as
/// a launcher can check it before it starts ranks: `Err` for a malformed variable (the error every
/// rank would fail with), `(Some(device name), _)` for a verbs device, `(None, addresses)` for the
/// UDP device (no addresses: each rank chooses its own, see the [module docs](self#addresses)).
///
/// # Errors
/// [`TransportError::Setup`] naming the variable and what it should hold.
pub(crate) fn device_from_env() -> Result<(Option<String>, Vec<IpAddr>), TransportError> {
    let env = RoceEnv::from_env()?;
    Ok((env.verbs, env.addrs))
}

/// The address rank `ctx.rank` binds its device to (see the [module docs](self#addresses)).
fn choose_address(ctx: &SetupContext<'_>, env: &RoceEnv) -> Result<IpAddr, TransportError> {
    if !env.addrs.is_empty() {
        let me = &ctx.cards[ctx.rank];
        let local_rank = ctx.cards[..ctx.rank]
            .iter()
            .filter(|c| c.host_id == me.host_id)
            .count();
        return Ok(env.addrs[local_rank % env.addrs.len()]);
    }
    match ctx.bootstrap_addr {
        Some(ip) if ip.is_loopback() => {
            let n = u32::try_from(ctx.rank + 1)
                .ok()
                .filter(|n| *n < 1 << 24)
                .ok_or_else(|| TransportError::Setup {
                    peer: None,
                    op: "choosing a loopback address",
                    on: format!("rank {}", ctx.rank),
                    source: io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "more ranks than addresses in 127.0.0.0/8",
                    ),
                })?;
            Ok(IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | n)))
        }
        Some(ip) => Ok(ip),
        None => Err(TransportError::Setup {
            peer: None,
            op: "choosing the RoCE address",
            on: format!("rank {}", ctx.rank),
            source: io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "the bootstrap connection has no local address: set COLL_ROCE_ADDR",
            ),
        }),
    }
}

/// A page-aligned host buffer registered with the device.
struct Region {
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

impl Region {
    fn new(
        hca: &Hca,
        len: usize,
        access: AccessFlags,
        what: &'static str,
    ) -> Result<Region, TransportError> {
        let mem = Arc::new(HostMemory::new(len).map_err(|e| TransportError::Setup {
            peer: None,
            op: "allocating",
            on: format!("{what} ({len} bytes)"),
            source: io::Error::other(e.to_string()),
        })?);
        // The iova is the virtual address, as ibv_reg_mr(3) uses.
        let iova = mem.as_ptr() as u64;
        let mr = hca
            .dev
            .reg_mr(hca.pd, mem.clone(), 0, len, iova, access)
            .map_err(Hca::verbs("ibv_reg_mr", None))?;
        Ok(Region { mem, mr })
    }

    fn iova(&self, offset: usize) -> u64 {
        self.mr.iova() + offset as u64
    }

    fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.mem.len());
        // SAFETY: callers pass offsets inside the buffer (checked by the layout), so the
        // result stays inside the same allocation.
        unsafe { self.mem.as_ptr().add(offset) }
    }
}

/// A rank's device and protection domain, shared by its channels; closing it (the last drop)
/// sends what is queued, flushes every WR and joins the progress thread.
struct Hca {
    dev: Arc<dyn Verbs>,
    /// The same device when it is the software HCA on UDP (caller-driven progress, peer ports,
    /// counters); `None` for a libibverbs device.
    udp: Option<Arc<UdpDevice>>,
    pd: PdHandle,
    regs: Mutex<RegCache>,
    /// WRs reading user memory, posted and not completed, on every channel of the device.
    user_wrs: AtomicUsize,
    /// Bumped by every wait of a connector (the rank thread drives the device meanwhile).
    activity: Arc<AtomicU64>,
    keepalive: Option<Keepalive>,
}

/// With caller-driven progress ([`Progress::Caller`]), the rank thread runs the device's
/// progress rounds itself while it waits (receive, timers, send: no hand-off to another thread,
/// and it sleeps in poll(2) on the socket). Between operations nobody would: ACKs owed to peers
/// would not leave and retransmission timers would not fire, so a peer could exhaust its retries
/// while this rank computes. The keepalive thread closes that gap: every [`KEEPALIVE`] it checks
/// whether the rank thread drove the device since its last look, and if not, runs rounds until
/// the socket is drained.
struct Keepalive {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the keepalive thread looks.
pub const KEEPALIVE: Duration = Duration::from_millis(2);

impl Keepalive {
    fn start(dev: Arc<UdpDevice>, activity: Arc<AtomicU64>) -> io::Result<Keepalive> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("coll-keepalive".into())
            .spawn(move || {
                let mut seen = activity.load(Ordering::Relaxed);
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(KEEPALIVE);
                    let now = activity.load(Ordering::Relaxed);
                    if now != seen {
                        seen = now;
                        continue;
                    }
                    // A round that received builds its answers in the next one.
                    for _ in 0..64 {
                        if dev.progress() == 0 {
                            break;
                        }
                    }
                    dev.progress();
                }
            })?;
        Ok(Keepalive {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        // Stop the keepalive thread before the device closes.
        self.keepalive = None;
        if let Some(udp) = self
            .udp
            .as_ref()
            .filter(|_| std::env::var("COLL_ROCE_STATS").is_ok_and(|v| v == "1"))
        {
            let regs = lock(&self.regs);
            eprintln!(
                "coll roce {}: engine {:?}\n  link {:?}\n  progress {:?}\n  user buffers: \
                 {} registrations, {} cache hits",
                udp.local_addr(),
                udp.counters(),
                udp.link_counters(),
                udp.device_counters(),
                regs.registrations,
                regs.hits
            );
        }
    }
}

impl Hca {
    fn verbs(op: &'static str, peer: Option<usize>) -> impl Fn(DeviceError) -> TransportError {
        move |source| TransportError::Verbs {
            peer,
            op,
            source: Box::new(source),
        }
    }
}

/// User memory that an RDMA WRITE reads straight from (the zero-copy path): a raw range of this
/// process's address space. Registered with local access only, so peers cannot address it.
#[derive(Debug)]
struct UserMemory {
    base: usize,
    len: usize,
}

impl Memory for UserMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        gpu_p2p::check_range(offset, dst.len(), self.len)?;
        // SAFETY: the HCA reads a registered user range only while a WR whose SGE points into
        // it is outstanding, and `post_from`'s contract keeps the range alive and unwritten
        // until `drain` has seen that WR complete (the registration is local-only: no peer can
        // make the HCA read it). The range lies inside the registered one (checked above).
        unsafe {
            core::ptr::copy_nonoverlapping(
                core::ptr::with_exposed_provenance::<u8>(self.base + offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        // Registered without LOCAL_WRITE or any remote access, so the HCA never writes it;
        // refuse anyway (user input buffers are borrowed immutably).
        Err(MemoryError::OutOfBounds {
            offset,
            len: src.len(),
            size: 0,
        })
    }

    fn compare_swap(&self, offset: usize, _: u64, _: u64) -> Result<u64, MemoryError> {
        Err(MemoryError::OutOfBounds {
            offset,
            len: 8,
            size: 0,
        })
    }

    fn fetch_add(&self, offset: usize, _: u64) -> Result<u64, MemoryError> {
        Err(MemoryError::OutOfBounds {
            offset,
            len: 8,
            size: 0,
        })
    }

    /// The range's address, so the software HCA sends it in place (zero-copy transmit: the
    /// kernel gathers it with an iovec) instead of copying it into a packet buffer, and a
    /// libibverbs device registers it by address (ibv_reg_mr(3) pins the pages; its HCA reads
    /// them by DMA, registered without LOCAL_WRITE or remote access).
    fn host_ptr(&self) -> Option<HostPtr> {
        let ptr = core::ptr::NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(self.base))?;
        // SAFETY: as for `read`: the HCA dereferences the address only while it builds and
        // sends packets of a WR posted by `post_from`, whose contract keeps the range alive and
        // unwritten until `drain` has seen that WR complete. Those WRs are RC, which complete
        // only when acknowledged, after the link has sent every packet built for them (it sends
        // what it built before it builds more), so no packet that points here outlives its WR.
        // That is narrower than `HostPtr`'s "while the `Memory` lives", which a cached
        // registration of user memory cannot promise; nothing reads the address outside a WR.
        Some(unsafe { HostPtr::new(ptr) })
    }
}

/// The registration cache: user buffers registered for zero-copy sends, by page-aligned range,
/// so that a buffer passed again (every iteration of a training loop) is not registered again
/// (NCCL's user-buffer registration cache). A lookup finds a registration that covers the range;
/// a miss registers the range rounded out to pages. At most [`RegCache::CAPACITY`]
/// registrations are kept; the least recently used one is evicted to make room, and evicted
/// registrations are deregistered once no WR that reads user memory is outstanding on the
/// device (a WR may still point at one).
///
/// A registration only names a range of addresses (the software HCA copies from the address
/// when it builds a packet; nothing is pinned), so a buffer freed and another allocated at the
/// same place reuse it correctly, and a stale one is never read: the HCA reads user memory only
/// for WRs posted by [`SendConnector::post_from`], and no peer can address it (no remote
/// access).
#[derive(Debug)]
pub struct RegCache {
    /// `(start, end, lkey, last use)`.
    entries: Vec<(usize, usize, u32, u64)>,
    /// Evicted registrations to deregister once no user-memory WR is outstanding.
    evicted: Vec<u32>,
    clock: u64,
    /// Registrations made (misses).
    pub registrations: u64,
    /// Lookups served without registering (hits).
    pub hits: u64,
}

impl RegCache {
    /// Most registrations kept.
    pub const CAPACITY: usize = 64;
    const PAGE: usize = 4096;

    fn new() -> RegCache {
        RegCache {
            entries: Vec::new(),
            evicted: Vec::new(),
            clock: 0,
            registrations: 0,
            hits: 0,
        }
    }

    /// The lkey of a registration covering `[addr, addr + len)`, registering it on a miss.
    /// `quiet`: no WR reading user memory is outstanding on the device.
    fn lookup(
        &mut self,
        dev: &dyn Verbs,
        pd: PdHandle,
        addr: usize,
        len: usize,
        quiet: bool,
    ) -> Result<u32, DeviceError> {
        self.clock += 1;
        if quiet {
            for lkey in self.evicted.drain(..) {
                let _ = dev.dereg_mr(lkey);
            }
        }
        let end = addr + len;
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 <= addr && end <= e.1) {
            e.3 = self.clock;
            self.hits += 1;
            return Ok(e.2);
        }
        if self.entries.len() >= Self::CAPACITY {
            if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].3) {
                let (_, _, lkey, _) = self.entries.swap_remove(i);
                self.evicted.push(lkey);
            }
        }
        let start = addr & !(Self::PAGE - 1);
        let stop = end.div_ceil(Self::PAGE) * Self::PAGE;
        let mem = Arc::new(UserMemory {
            base: start,
            len: stop - start,
        });
        let len = mem.len;
        let mr = dev.reg_mr(pd, mem, 0, len, start as u64, AccessFlags::empty())?;
        self.registrations += 1;
        self.entries.push((start, stop, mr.lkey(), self.clock));
        Ok(mr.lkey())
    }
}

/// Geometry of the rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    nchannels: usize,
    nslots: usize,
    slot_bytes: usize,
}

impl Layout {
    fn stride(&self) -> usize {
        SlotHeader::LEN + self.slot_bytes
    }
    fn ring_bytes(&self) -> usize {
        self.nslots * self.stride()
    }
    /// Offset of ring `(peer index, channel)` in a region of rings.
    fn ring_offset(&self, peer_index: usize, channel: usize) -> usize {
        (peer_index * self.nchannels + channel) * self.ring_bytes()
    }
    fn recv_wrs(&self) -> u32 {
        2 * self.nslots as u32 + 8
    }
    fn send_wrs(&self) -> u32 {
        4 * self.nslots as u32 + 16
    }
}

/// A completion error or protocol violation that ended a channel.
#[derive(Debug, Clone)]
enum Failure {
    Wc { status: WcStatus, wr: &'static str },
    Protocol(String),
}

/// What the CQ of a channel has told so far.
struct ChanState {
    /// Data steps arrived and not yet taken by the receiver: `(imm, byte_len)`, in step order.
    arrivals: std::collections::VecDeque<(u32, u32)>,
    /// The peer's `head`: steps of ours it consumed.
    credit: u32,
    /// Steps posted by the sender.
    posted: u32,
    /// Data WRs completed locally (in order: an RC send queue completes in order).
    data_done: u32,
    /// Signaled WRs posted and not yet completed (the send queue's occupancy).
    sq_outstanding: u32,
    /// Data WRs reading user memory posted and not yet completed.
    user_wrs: u32,
    recv_posted: u32,
    probe_outstanding: bool,
    peer_abort: Option<Abort>,
    failure: Option<Failure>,
    abort_sent: bool,
    last_progress: Instant,
}

/// One channel to one peer: an RC QP, its CQ, and the rings; shared by the channel's send and
/// receive connectors.
struct Channel {
    hca: Arc<Hca>,
    rank: usize,
    peer: usize,
    pid: u32,
    channel: usize,
    qpn: u32,
    cq: CqHandle,
    layout: Layout,
    /// This rank's registered receive rings (the peer writes into them).
    recv: Arc<Region>,
    recv_off: usize,
    /// This rank's staging rings (local).
    send: Arc<Region>,
    send_off: usize,
    ctrl: Arc<Region>,
    ctrl_off: usize,
    /// The peer's ring for this rank and channel, and its rkey.
    remote_ring: u64,
    rkey: u32,
    liveness: Arc<Liveness>,
    policy: WaitPolicy,
    state: Mutex<ChanState>,
}

impl Channel {
    fn state(&self) -> MutexGuard<'_, ChanState> {
        lock(&self.state)
    }

    fn landing_sge(&self) -> Sge {
        Sge {
            addr: self.ctrl.iova(self.ctrl_off + CTRL_LANDING),
            length: LANDING_BYTES,
            lkey: self.ctrl.mr.lkey(),
        }
    }

    /// Posts receive WRs until `recv_wrs` are posted.
    fn replenish(&self, st: &mut ChanState) -> Result<(), TransportError> {
        let want = self.layout.recv_wrs();
        if st.recv_posted >= want || st.failure.is_some() {
            return Ok(());
        }
        let sge = [self.landing_sge()];
        let wr = RecvWr {
            wr_id: WR_RECV,
            sg_list: &sge,
        };
        let wrs = [wr; 16];
        while st.recv_posted < want {
            let n = ((want - st.recv_posted) as usize).min(wrs.len());
            match self.hca.dev.post_recv_list(self.qpn, &wrs[..n]) {
                Ok(()) => st.recv_posted += n as u32,
                Err((i, e)) => {
                    st.recv_posted += i as u32;
                    return Err(self.verbs_err("ibv_post_recv")(e));
                }
            }
        }
        Ok(())
    }

    fn verbs_err(&self, op: &'static str) -> impl Fn(DeviceError) -> TransportError {
        Hca::verbs(op, Some(self.peer))
    }

    /// Takes what the CQ holds into the state; reposts the receive WRs it consumed.
    fn poll(&self, st: &mut ChanState) -> Result<(), TransportError> {
        let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); POLL_BATCH];
        loop {
            let n = self
                .hca
                .dev
                .poll_cq(self.cq, &mut wcs)
                .map_err(self.verbs_err("ibv_poll_cq"))?;
            for wc in &wcs[..n] {
                self.complete(st, wc);
            }
            if n < wcs.len() {
                break;
            }
        }
        if st.recv_posted < self.layout.recv_wrs() - 4 {
            self.replenish(st)?;
        }
        Ok(())
    }

    fn fail(st: &mut ChanState, f: Failure) {
        if st.failure.is_none() {
            st.failure = Some(f);
        }
    }

    /// Applies one completion.
    fn complete(&self, st: &mut ChanState, wc: &WorkCompletion) {
        let kind = wc.wr_id & WR_KIND;
        if kind == WR_RECV {
            st.recv_posted = st.recv_posted.saturating_sub(1);
        } else {
            st.sq_outstanding = st.sq_outstanding.saturating_sub(1);
        }
        if kind == WR_DATA_USER {
            // Completed or flushed: either way the HCA no longer reads its memory.
            st.user_wrs = st.user_wrs.saturating_sub(1);
            self.hca.user_wrs.fetch_sub(1, Ordering::AcqRel);
        }
        if wc.status != WcStatus::Success {
            let wr = match kind {
                WR_DATA | WR_DATA_USER => "RDMA WRITE_WITH_IMM of a slot",
                WR_CREDIT => "SEND_WITH_IMM of a credit",
                WR_ABORT => "SEND of an abort",
                WR_PROBE => "RDMA WRITE probe",
                _ => "receive WR",
            };
            Self::fail(
                st,
                Failure::Wc {
                    status: wc.status,
                    wr,
                },
            );
            return;
        }
        st.last_progress = Instant::now();
        match kind {
            WR_DATA | WR_DATA_USER => st.data_done = st.data_done.wrapping_add(1),
            WR_PROBE => st.probe_outstanding = false,
            WR_CREDIT | WR_ABORT => {}
            _ => match (wc.opcode, wc.imm_data) {
                (WcOpcode::RecvRdmaWithImm, Some(imm)) => {
                    if st.arrivals.len() >= self.layout.nslots {
                        Self::fail(
                            st,
                            Failure::Protocol(format!(
                                "a write arrived with {} slots already full (credits overrun)",
                                st.arrivals.len()
                            )),
                        );
                    } else {
                        st.arrivals.push_back((imm, wc.byte_len));
                    }
                }
                (WcOpcode::Recv, Some(head)) => {
                    // A credit: the peer consumed `head` steps; it cannot exceed what we posted
                    // nor go back.
                    let ahead = st.posted.wrapping_sub(head);
                    let gained = head.wrapping_sub(st.credit);
                    if ahead > self.layout.nslots as u32 || gained > self.layout.nslots as u32 {
                        Self::fail(
                            st,
                            Failure::Protocol(format!(
                                "credit for step {head} after {} posted and {} credited",
                                st.posted, st.credit
                            )),
                        );
                    } else {
                        st.credit = head;
                    }
                }
                (WcOpcode::Recv, None) if wc.byte_len == 4 => {
                    let mut w = [0u8; 4];
                    // SAFETY: the landing buffer is 8 bytes inside the control region; the HCA
                    // wrote the SEND before this completion, which we read after taking the
                    // engine lock (poll_cq) that its write was made under.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            self.ctrl.ptr(self.ctrl_off + CTRL_LANDING),
                            w.as_mut_ptr(),
                            4,
                        )
                    };
                    match Abort::from_word(u32::from_le_bytes(w)) {
                        Some(a) => {
                            st.peer_abort.get_or_insert(a);
                        }
                        None => Self::fail(st, Failure::Protocol("an empty abort word".into())),
                    }
                }
                (op, imm) => Self::fail(
                    st,
                    Failure::Protocol(format!(
                        "unexpected receive completion {op:?} of {} bytes, immediate {imm:?}",
                        wc.byte_len
                    )),
                ),
            },
        }
    }

    /// The error a failed channel reports, if it failed.
    fn failed(&self, st: &ChanState) -> Option<TransportError> {
        if let Some(abort) = st.peer_abort {
            return Some(TransportError::PeerAborted {
                peer: self.peer,
                abort,
            });
        }
        match st.failure.as_ref()? {
            Failure::Wc {
                status: WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr,
                ..
            } => Some(TransportError::PeerDied {
                peer: self.peer,
                pid: self.pid,
            }),
            Failure::Wc { status, wr } => Some(TransportError::QpFailed {
                peer: self.peer,
                channel: self.channel,
                qpn: self.qpn,
                wr,
                status: *status,
            }),
            Failure::Protocol(what) => Some(TransportError::Protocol {
                peer: self.peer,
                channel: self.channel,
                what: what.clone(),
            }),
        }
    }

    /// Waits until `ready` gives a value: polls the CQ, spins and yields as the policy says, then
    /// sleeps on the CQ in slices, checking the peer between them (see the module docs).
    fn wait<T>(
        &self,
        timeout: Duration,
        waiting_for: WaitFor,
        mut ready: impl FnMut(&mut ChanState) -> Option<T>,
    ) -> Result<T, TransportError> {
        let mut check = |st: &mut ChanState| -> Result<Option<T>, TransportError> {
            self.poll(st)?;
            if let Some(v) = ready(st) {
                return Ok(Some(v));
            }
            match self.failed(st) {
                Some(e) => Err(e),
                None => Ok(None),
            }
        };
        self.hca.activity.fetch_add(1, Ordering::Relaxed);
        // With caller-driven progress every poll is a progress round (a recvmmsg(2)): spin
        // fewer times than on a memory word.
        let spin = match self.hca.udp.as_ref().map(|u| u.config().progress) {
            Some(Progress::Caller) => self.policy.spin / 64,
            _ => self.policy.spin,
        };
        for i in 0..spin + self.policy.yields {
            if let Some(v) = check(&mut self.state())? {
                return Ok(v);
            }
            if i < spin {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let start = Instant::now();
        loop {
            self.hca.activity.fetch_add(1, Ordering::Relaxed);
            if let Some(v) = check(&mut self.state())? {
                return Ok(v);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(TransportError::Timeout {
                    peer: self.peer,
                    channel: self.channel,
                    waiting_for,
                    after_ms: elapsed.as_millis(),
                });
            }
            if !self.liveness.alive() {
                // Whatever it completed before dying still counts.
                if let Some(v) = check(&mut self.state())? {
                    return Ok(v);
                }
                return Err(TransportError::PeerDied {
                    peer: self.peer,
                    pid: self.pid,
                });
            }
            self.maybe_probe()?;
            let wcs = self
                .hca
                .dev
                .wait_cq(self.cq, 1, SLEEP_SLICE.min(timeout - elapsed))
                .map_err(self.verbs_err("ibv_poll_cq"))?;
            let mut st = self.state();
            for wc in &wcs {
                self.complete(&mut st, wc);
            }
        }
    }

    /// Posts a zero-byte RDMA WRITE when nothing was heard for [`PROBE_AFTER`] and no WR is
    /// outstanding that would find a dead peer by itself.
    fn maybe_probe(&self) -> Result<(), TransportError> {
        let mut st = self.state();
        // Outstanding WRs find a dead peer by themselves (and may fill the send queue).
        if st.probe_outstanding
            || st.failure.is_some()
            || st.sq_outstanding > 0
            || st.last_progress.elapsed() < PROBE_AFTER
        {
            return Ok(());
        }
        st.last_progress = Instant::now();
        st.probe_outstanding = true;
        self.post_send(
            &mut st,
            WR_PROBE,
            &[],
            SendOp::RdmaWrite {
                remote_addr: self.remote_ring,
                rkey: self.rkey,
            },
        )
    }

    /// Posts one signaled WR and counts it.
    fn post_send(
        &self,
        st: &mut ChanState,
        wr_id: u64,
        sg_list: &[Sge],
        op: SendOp,
    ) -> Result<(), TransportError> {
        let wr = SendWr {
            wr_id,
            sg_list,
            op,
            send_flags: SendFlags::SIGNALED,
        };
        match self.hca.dev.post_send(self.qpn, &wr) {
            Ok(()) => {
                st.sq_outstanding += 1;
                Ok(())
            }
            // A QP in the error state refuses new WRs: report why it failed.
            Err(e) => Err(self
                .failed(st)
                .unwrap_or_else(|| self.verbs_err("ibv_post_send")(e))),
        }
    }

    /// Waits (bounded) until the send queue has room for one more WR.
    fn wait_sq(&self, timeout: Duration, waiting_for: WaitFor) -> Result<(), TransportError> {
        let depth = self.layout.send_wrs();
        self.wait(timeout, waiting_for, |st| {
            (st.sq_outstanding < depth).then_some(())
        })
    }

    /// Sends the abort word once per channel (either connector may ask first).
    fn send_abort(&self, abort: Abort) {
        let mut st = self.state();
        if st.abort_sent {
            return;
        }
        st.abort_sent = true;
        if st.failure.is_some() || st.sq_outstanding >= self.layout.send_wrs() {
            // The QP is in error, or its send queue is full of WRs the peer does not answer:
            // the peer finds out from its own QP or its timeout.
            return;
        }
        let w = abort.to_word().to_le_bytes();
        // SAFETY: the outgoing abort word is 4 bytes inside this channel's control block; the HCA
        // reads it only for the SEND posted below, and it is written once (`abort_sent`).
        unsafe {
            core::ptr::copy_nonoverlapping(
                w.as_ptr(),
                self.ctrl.ptr(self.ctrl_off + CTRL_ABORT_OUT),
                4,
            )
        };
        let sge = [Sge {
            addr: self.ctrl.iova(self.ctrl_off + CTRL_ABORT_OUT),
            length: 4,
            lkey: self.ctrl.mr.lkey(),
        }];
        // Best effort: a failure to post means the QP already failed.
        let _ = self.post_send(&mut st, WR_ABORT, &sge, SendOp::Send);
    }

    /// Returns once no WR of this channel reads user memory: waits up to [`QUIESCE`] for them
    /// to complete, then cancels them by moving the QP to the error state (which flushes every
    /// WR: the HCA drops them and reads nothing more). The contract of `post_from` on abort.
    fn quiesce(&self) {
        let deadline = Instant::now() + QUIESCE;
        loop {
            let mut st = self.state();
            let _ = self.poll(&mut st);
            if st.user_wrs == 0 {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            drop(st);
            if let Ok(wcs) = self
                .hca
                .dev
                .wait_cq(self.cq, 1, SLEEP_SLICE.min(deadline - now))
            {
                let mut st = self.state();
                for wc in &wcs {
                    self.complete(&mut st, wc);
                }
            }
        }
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        // Fails only on a closed device, whose close already flushed every QP.
        let _ = self.hca.dev.modify_qp(self.qpn, &attr, QpAttrMask::STATE);
        let mut st = self.state();
        let _ = self.poll(&mut st);
        Self::fail(
            &mut st,
            Failure::Wc {
                status: WcStatus::WrFlushErr,
                wr: "RDMA WRITE_WITH_IMM of a slot (cancelled by an abort)",
            },
        );
    }
}

/// Sending end of one channel.
struct RoceSend {
    ch: Arc<Channel>,
    /// Next step to post.
    step: u32,
    slot_held: bool,
}

impl RoceSend {
    fn slot_offset(&self, step: u32) -> usize {
        self.ch.send_off + (step as usize % self.ch.layout.nslots) * self.ch.layout.stride()
    }

    fn remote_slot(&self, step: u32) -> u64 {
        self.ch.remote_ring
            + ((step as usize % self.ch.layout.nslots) * self.ch.layout.stride()) as u64
    }

    fn check_post(&self, len: usize) -> Result<(), TransportError> {
        if len > self.ch.layout.slot_bytes {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post longer than a slot",
            });
        }
        Ok(())
    }

    /// Waits for the next step's slot: a credit from the peer, the staging slot's previous WR
    /// complete, and room in the send queue.
    fn wait_free(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let (step, nslots, depth) = (
            self.step,
            self.ch.layout.nslots as u32,
            self.ch.layout.send_wrs(),
        );
        self.ch.wait(timeout, WaitFor::Credit, |st| {
            (step.wrapping_sub(st.credit) < nslots
                && step.wrapping_sub(st.data_done) < nslots
                && st.sq_outstanding < depth)
                .then_some(())
        })
    }

    /// Posts step `self.step` as one WRITE_WITH_IMM of the header (and payload) at `header_sge`
    /// followed by `payload`.
    fn post_write(
        &mut self,
        len: usize,
        chunk: u16,
        desc: &OpDesc,
        payload: Option<Sge>,
    ) -> Result<(), TransportError> {
        let imm = Imm {
            step: self.step as u16,
            chunk,
        };
        let header = SlotHeader {
            len: len as u32,
            imm,
            desc: *desc,
        };
        let off = self.slot_offset(self.step);
        let b = header.encode();
        // SAFETY: the staging slot of `step` is ours (its previous WR completed: `wait_free`);
        // the header is 64 bytes at its start, inside the send region.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.ch.send.ptr(off), b.len()) };
        let staged = if payload.is_some() { 0 } else { len };
        let mut sges = [
            Sge {
                addr: self.ch.send.iova(off),
                length: (SlotHeader::LEN + staged) as u32,
                lkey: self.ch.send.mr.lkey(),
            },
            payload.unwrap_or(Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }),
        ];
        let nsge = if payload.is_some() { 2 } else { 1 };
        if let Some(p) = payload {
            sges[1] = p;
        }
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: self.remote_slot(self.step),
            rkey: self.ch.rkey,
            imm_data: imm.to_raw(),
        };
        let kind = if payload.is_some() {
            WR_DATA_USER
        } else {
            WR_DATA
        };
        let mut st = self.ch.state();
        self.ch
            .post_send(&mut st, kind | u64::from(self.step), &sges[..nsge], op)?;
        if payload.is_some() {
            st.user_wrs += 1;
            self.ch.hca.user_wrs.fetch_add(1, Ordering::AcqRel);
        }
        self.step = self.step.wrapping_add(1);
        st.posted = self.step;
        self.slot_held = false;
        Ok(())
    }
}

impl SendConnector for RoceSend {
    fn peer(&self) -> usize {
        self.ch.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ch.layout.slot_bytes
    }

    fn wait_slot(&mut self, timeout: Duration) -> Result<&mut [u8], TransportError> {
        if !self.slot_held {
            self.wait_free(timeout)?;
            self.slot_held = true;
        }
        let off = self.slot_offset(self.step) + SlotHeader::LEN;
        // SAFETY: the staging slot of `step` is ours: the HCA finished the WR that last read it
        // (`data_done`) and posts nothing from it until our `post`. It lies inside the send
        // region, and the slice borrows `self` mutably, so it ends before `post`.
        Ok(unsafe {
            core::slice::from_raw_parts_mut(self.ch.send.ptr(off), self.ch.layout.slot_bytes)
        })
    }

    fn post(&mut self, len: usize, chunk: u16, desc: &OpDesc) -> Result<(), TransportError> {
        if !self.slot_held {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post without a slot from wait_slot",
            });
        }
        self.check_post(len)?;
        self.post_write(len, chunk, desc, None)
    }

    unsafe fn post_from(
        &mut self,
        src: &[u8],
        region: &[u8],
        chunk: u16,
        desc: &OpDesc,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.check_post(src.len())?;
        if self.slot_held {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post_from while a slot from wait_slot is held",
            });
        }
        self.wait_free(timeout)?;
        self.slot_held = true;
        let payload = if src.is_empty() {
            None
        } else {
            let quiet = self.ch.hca.user_wrs.load(Ordering::Acquire) == 0;
            // Register the whole buffer `src` lies in (one registration serves every chunk of
            // it); the SGE below still covers `src` only.
            let (s, r) = (src.as_ptr_range(), region.as_ptr_range());
            let reg = if r.start <= s.start && s.end <= r.end {
                region
            } else {
                src
            };
            let lkey = lock(&self.ch.hca.regs)
                .lookup(
                    &*self.ch.hca.dev,
                    self.ch.hca.pd,
                    // The HCA addresses user memory by address, as a NIC would by DMA address;
                    // `UserMemory` turns it back into a pointer with this provenance.
                    reg.as_ptr().expose_provenance(),
                    reg.len(),
                    quiet,
                )
                .map_err(self.ch.verbs_err("ibv_reg_mr"))?;
            // The SGE's address carries `src`'s provenance too (`UserMemory` reads through it).
            let _ = src.as_ptr().expose_provenance();
            Some(Sge {
                addr: src.as_ptr() as u64,
                length: src.len() as u32,
                lkey,
            })
        };
        self.post_write(src.len(), chunk, desc, payload)
    }

    fn drain(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let step = self.step;
        self.ch.wait(timeout, WaitFor::Drain, |st| {
            (st.credit == step && st.data_done == step).then_some(())
        })
    }

    fn abort(&mut self, abort: Abort) {
        self.ch.send_abort(abort);
        self.ch.quiesce();
    }
}

impl Drop for RoceSend {
    fn drop(&mut self) {
        self.ch.send_abort(Abort {
            origin: self.ch.rank,
            reason: AbortReason::Closed,
        });
        self.ch.quiesce();
    }
}

/// Receiving end of one channel.
struct RoceRecv {
    ch: Arc<Channel>,
    /// Next step to receive.
    step: u32,
    held: Option<SlotHeader>,
    /// The timeout of the last wait, for the send-queue wait of a credit.
    timeout: Duration,
}

impl RoceRecv {
    fn slot_offset(&self) -> usize {
        self.ch.recv_off + (self.step as usize % self.ch.layout.nslots) * self.ch.layout.stride()
    }

    fn protocol(&self, what: String) -> TransportError {
        TransportError::Protocol {
            peer: self.ch.peer,
            channel: self.ch.channel,
            what,
        }
    }
}

impl RecvConnector for RoceRecv {
    fn peer(&self) -> usize {
        self.ch.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ch.layout.slot_bytes
    }

    fn wait(&mut self, timeout: Duration) -> Result<RecvChunk<'_>, TransportError> {
        self.timeout = timeout;
        let header = match self.held {
            Some(h) => h,
            None => {
                let (raw, byte_len) = self
                    .ch
                    .wait(timeout, WaitFor::Data, |st| st.arrivals.pop_front())?;
                let imm = Imm::from_raw(raw);
                if imm.step != self.step as u16 {
                    return Err(self.protocol(format!(
                        "immediate carries step {} where step {} was expected",
                        imm.step, self.step as u16
                    )));
                }
                let mut b = [0u8; SlotHeader::LEN];
                // SAFETY: the slot lies inside the receive region; its write completed before the
                // CQE we polled (under the engine lock its write was made under), and the
                // credit protocol keeps the peer from writing it again before our release. A
                // peer that breaks the protocol can only change byte values, valid for `u8`.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        self.ch.recv.ptr(self.slot_offset()),
                        b.as_mut_ptr(),
                        b.len(),
                    )
                };
                let h = SlotHeader::decode(&b);
                if h.imm != imm {
                    return Err(self.protocol(format!(
                        "slot header says {:?}, the immediate {imm:?}",
                        h.imm
                    )));
                }
                if h.len as usize > self.ch.layout.slot_bytes
                    || byte_len as usize != SlotHeader::LEN + h.len as usize
                {
                    return Err(self.protocol(format!(
                        "write of {byte_len} bytes with a header of {} payload bytes in a slot \
                         of {}",
                        h.len, self.ch.layout.slot_bytes
                    )));
                }
                self.held = Some(h);
                h
            }
        };
        let off = self.slot_offset() + SlotHeader::LEN;
        // SAFETY: as for the header above; `len <= slot_bytes` was checked, and the slice borrows
        // `self`, so it ends before `release` hands the slot back.
        let data =
            unsafe { core::slice::from_raw_parts(self.ch.recv.ptr(off), header.len as usize) };
        Ok(RecvChunk {
            imm: header.imm,
            desc: header.desc,
            data,
        })
    }

    fn release(&mut self) -> Result<(), TransportError> {
        if self.held.take().is_none() {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "release without a chunk from wait",
            });
        }
        self.step = self.step.wrapping_add(1);
        self.ch.wait_sq(self.timeout, WaitFor::Credit)?;
        let mut st = self.ch.state();
        self.ch.post_send(
            &mut st,
            WR_CREDIT,
            &[],
            SendOp::SendWithImm {
                imm_data: self.step,
            },
        )
    }

    fn abort(&mut self, abort: Abort) {
        self.ch.send_abort(abort);
    }
}

impl Drop for RoceRecv {
    fn drop(&mut self) {
        self.ch.send_abort(Abort {
            origin: self.ch.rank,
            reason: AbortReason::Closed,
        });
    }
}

/// A QP made in `setup`, waiting for the peer's info.
struct PendingQp {
    qpn: u32,
    cq: CqHandle,
    psn: u32,
}

/// What `setup` made for `connect`.
struct Pending {
    peers: Vec<usize>,
    qps: Vec<Vec<PendingQp>>,
    recv: Arc<Region>,
    send: Arc<Region>,
    ctrl: Arc<Region>,
    layout: Layout,
}

/// A peer's connection info, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerInfo {
    gid: Gid,
    port: u16,
    mtu: PathMtu,
    layout: Layout,
    region: (u64, u64),
    rkey: u32,
    /// Per peer of theirs: rank, and per channel its QP.
    peers: Vec<(usize, Vec<RemoteQp>)>,
}

/// A peer's QP of one channel, as its connection info describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RemoteQp {
    qpn: u32,
    /// Its first send PSN (our receive PSN).
    psn: u32,
    /// The ring it receives this rank's writes in (iova).
    ring: u64,
}

impl PeerInfo {
    fn parse(info: &[u8]) -> Result<PeerInfo, String> {
        let mut r = Reader::new(info);
        let e = |t: crate::codec::Truncated| t.to_string();
        if r.u64("magic").map_err(e)? != INFO_MAGIC {
            return Err("not RoCE connection info (bad magic)".into());
        }
        let version = r.u32("version").map_err(e)?;
        if version != INFO_VERSION {
            return Err(format!(
                "RoCE connection info version {version}, this build speaks {INFO_VERSION}"
            ));
        }
        let g = r.bytes("gid").map_err(e)?;
        let gid = Gid::from_bytes(
            g.try_into()
                .map_err(|_| format!("a GID of {} bytes", g.len()))?,
        );
        let port = u16::try_from(r.u32("udp port").map_err(e)?)
            .map_err(|_| "UDP port out of range".to_string())?;
        let code = r.u32("mtu").map_err(e)?;
        let mtu = [
            PathMtu::Mtu256,
            PathMtu::Mtu512,
            PathMtu::Mtu1024,
            PathMtu::Mtu2048,
            PathMtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| u32::from(m.code()) == code)
        .ok_or_else(|| format!("unknown MTU code {code}"))?;
        let layout = Layout {
            nchannels: r.u32("nchannels").map_err(e)? as usize,
            nslots: r.u32("nslots").map_err(e)? as usize,
            slot_bytes: r.u64("slot_bytes").map_err(e)? as usize,
        };
        let region = (
            r.u64("region iova").map_err(e)?,
            r.u64("region length").map_err(e)?,
        );
        let rkey = r.u32("rkey").map_err(e)?;
        let npeers = r.u32("peer count").map_err(e)? as usize;
        if npeers > info.len() {
            return Err(format!("{npeers} peers in {} bytes", info.len()));
        }
        let mut peers = Vec::with_capacity(npeers);
        for _ in 0..npeers {
            let rank = r.u32("peer rank").map_err(e)? as usize;
            let mut chans = Vec::new();
            for _ in 0..layout.nchannels.min(64) {
                chans.push(RemoteQp {
                    qpn: r.u32("qpn").map_err(e)?,
                    psn: r.u32("psn").map_err(e)?,
                    ring: r.u64("ring iova").map_err(e)?,
                });
            }
            peers.push((rank, chans));
        }
        Ok(PeerInfo {
            gid,
            port,
            mtu,
            layout,
            region,
            rkey,
            peers,
        })
    }
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
        self.hca
            .as_ref()
            .and_then(|h| h.udp.as_ref())
            .map(|u| u.local_addr())
    }

    fn open(&mut self, ctx: &SetupContext<'_>) -> Result<Arc<Hca>, TransportError> {
        let env = match &self.env {
            Some(e) => e.clone(),
            None => RoceEnv::from_env()?,
        };
        let (dev, udp): (Arc<dyn Verbs>, _) = match &env.verbs {
            Some(name) => {
                let dev =
                    IbvDevice::open(name).map_err(Hca::verbs("opening the verbs device", None))?;
                (Arc::new(dev), None)
            }
            None => {
                let ip = choose_address(ctx, &env)?;
                let mut config = UdpDeviceConfig::new(ip);
                config.port = env.port;
                config.progress = env.progress;
                let dev = Arc::new(
                    UdpDevice::open(config).map_err(Hca::verbs("opening the UDP device", None))?,
                );
                (dev.clone(), Some(dev))
            }
        };
        let pd = dev.alloc_pd().map_err(Hca::verbs("ibv_alloc_pd", None))?;
        let config_progress = env.progress;
        self.env = Some(env);
        let activity = Arc::new(AtomicU64::new(0));
        let keepalive = match (config_progress, &udp) {
            (Progress::Caller, Some(udp)) => Some(
                Keepalive::start(udp.clone(), activity.clone()).map_err(|source| {
                    TransportError::Setup {
                        peer: None,
                        op: "starting the keepalive thread",
                        on: udp.local_addr().to_string(),
                        source,
                    }
                })?,
            ),
            _ => None,
        };
        let hca = Arc::new(Hca {
            dev,
            udp,
            pd,
            regs: Mutex::new(RegCache::new()),
            user_wrs: AtomicUsize::new(0),
            activity,
            keepalive,
        });
        self.hca = Some(hca.clone());
        Ok(hca)
    }

    /// Moves `qp` through INIT, RTR and RTS, connected to `remote` at `gid`.
    fn qp_up(
        hca: &Hca,
        env: &RoceEnv,
        qp: &PendingQp,
        peer: usize,
        gid: Gid,
        remote: &RemoteQp,
        mtu: PathMtu,
    ) -> Result<(), TransportError> {
        let verbs = Hca::verbs("ibv_modify_qp", Some(peer));
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        hca.dev
            .modify_qp(
                qp.qpn,
                &a,
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS,
            )
            .map_err(&verbs)?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        a.ah_attr = AhAttr {
            dgid: gid,
            sgid_index: hca.dev.default_gid().0 as u8,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        };
        hca.dev
            .modify_qp(
                qp.qpn,
                &a,
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER,
            )
            .map_err(&verbs)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = qp.psn;
        a.timeout = env.qp_timeout;
        a.retry_cnt = env.retry_cnt;
        // Infinite: a receiver that has not reposted yet is slow, not dead.
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        hca.dev
            .modify_qp(
                qp.qpn,
                &a,
                QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            )
            .map_err(&verbs)?;
        Ok(())
    }
}

/// A random 24-bit PSN (IBTA vol. 1 §9.7.1: PSNs are 24 bits; a random start keeps a stale
/// packet of an earlier connection from matching, and an off-path attacker from guessing the
/// window) from the operating system's random source (`hca::verbs::random`).
fn random_psn() -> u32 {
    hca::verbs::random::random_psn()
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
            .u32(u32::from(
                hca.udp.as_ref().map_or(0, |u| u.local_addr().port()),
            ))
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
                let verbs = Hca::verbs("creating a QP", Some(peer));
                let cq = hca
                    .dev
                    .create_cq(layout.send_wrs() + layout.recv_wrs())
                    .map_err(&verbs)?;
                let qpn = hca
                    .dev
                    .create_qp(
                        hca.pd,
                        &QpInitAttr {
                            qp_type: QpType::Rc,
                            send_cq: cq,
                            recv_cq: cq,
                            srq: None,
                            cap: QpCap {
                                max_send_wr: layout.send_wrs(),
                                max_recv_wr: layout.recv_wrs(),
                                max_send_sge: 2,
                                max_recv_sge: 1,
                                max_inline_data: 0,
                            },
                            sq_sig_all: false,
                        },
                    )
                    .map_err(&verbs)?;
                let psn = random_psn();
                w.u32(qpn).u32(psn).u64(recv.iova(layout.ring_offset(i, c)));
                chans.push(PendingQp { qpn, cq, psn });
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
            if ip == my_ip && hca.udp.is_some() {
                return Err(TransportError::Unavailable {
                    transport: TransportKind::Roce,
                    peer,
                    reason: format!(
                        "it uses this rank's own address {ip}: every rank needs its own \
                         (set COLL_ROCE_ADDR per rank, see collectives::transport::roce)"
                    ),
                });
            }
            if let Some(other) = by_ip.insert(ip, peer).filter(|_| hca.udp.is_some()) {
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
            if let Some(udp) = &hca.udp {
                udp.set_peer_port(ip, info.port);
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
                Self::qp_up(&hca, &env, qp, peer, info.gid, &remote, mtu)?;
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
                }));
                recv.push(Box::new(RoceRecv {
                    ch,
                    step: 0,
                    held: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::BusinessCard;
    use crate::transport::CollKind;
    use crate::DataType;

    fn cards(n: usize) -> Vec<BusinessCard> {
        (0..n)
            .map(|rank| BusinessCard::local(rank, TransportKind::Roce))
            .collect()
    }

    fn ctx<'a>(rank: usize, cards: &'a [BusinessCard], nslots: usize) -> SetupContext<'a> {
        SetupContext {
            rank,
            nranks: cards.len(),
            nchannels: 1,
            nslots,
            slot_bytes: 64,
            tag: 0x5eed,
            cards,
            wait: WaitPolicy::OVERSUBSCRIBED,
            bootstrap_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        }
    }

    fn env(qp_timeout: u8, retry_cnt: u8) -> RoceEnv {
        RoceEnv {
            verbs: None,
            addrs: Vec::new(),
            port: 0,
            qp_timeout,
            retry_cnt,
            progress: Progress::Caller,
        }
    }

    struct Side {
        t: RoceTransport,
        c: PeerConnectors,
    }

    impl Side {
        fn ch(&self) -> Arc<Channel> {
            self.t.channels[0].upgrade().expect("channel alive")
        }
    }

    /// Ranks 0 and 1 of a two-rank communicator in this thread, connected over RoCE with
    /// `nslots` slots of 64 bytes (one channel). Every run gets its own device ports; the
    /// addresses are 127.0.0.1 and 127.0.0.2 (shared with concurrent tests, told apart by port).
    fn pair(nslots: usize, e: RoceEnv) -> (Side, Side) {
        let cards = cards(2);
        let mut t0 = RoceTransport::new();
        let mut t1 = RoceTransport::new();
        t0.env = Some(e.clone());
        t1.env = Some(e);
        let infos = vec![
            t0.setup(&ctx(0, &cards, nslots), &[1]).unwrap(),
            t1.setup(&ctx(1, &cards, nslots), &[0]).unwrap(),
        ];
        let c0 = t0
            .connect(&ctx(0, &cards, nslots), &[1], &infos)
            .unwrap()
            .pop()
            .unwrap();
        let c1 = t1
            .connect(&ctx(1, &cards, nslots), &[0], &infos)
            .unwrap()
            .pop()
            .unwrap();
        t0.finish().unwrap();
        t1.finish().unwrap();
        (Side { t: t0, c: c0 }, Side { t: t1, c: c1 })
    }

    fn desc() -> OpDesc {
        OpDesc::new(0, CollKind::Broadcast, DataType::U8, None, Some(0), 5)
    }

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn connection_info_round_trips_and_garbage_is_refused() {
        let (a, _b) = pair(2, env(14, 7));
        let cards = cards(2);
        // What rank 0 published, as rank 1 parsed it in `connect`.
        let mut t = RoceTransport::new();
        t.env = Some(env(14, 7));
        let info = t.setup(&ctx(0, &cards, 4), &[1]).unwrap();
        let p = PeerInfo::parse(&info).unwrap();
        assert_eq!(p.gid.to_ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(p.port, t.local_addr().unwrap().port());
        assert_eq!(p.mtu, PathMtu::Mtu4096, "loopback: PMTU 4096");
        assert_eq!(
            p.layout,
            Layout {
                nchannels: 1,
                nslots: 4,
                slot_bytes: 64
            }
        );
        assert_eq!(p.peers.len(), 1);
        assert_eq!(p.peers[0].0, 1);
        assert_eq!(
            p.peers[0].1[0].ring, p.region.0,
            "the only ring starts the region"
        );
        for cut in 0..info.len() {
            assert!(PeerInfo::parse(&info[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = info.clone();
        bad[0] ^= 1;
        assert!(PeerInfo::parse(&bad).unwrap_err().contains("magic"));
        drop(a);
    }

    #[test]
    fn addresses_follow_the_environment_then_the_bootstrap_route() {
        let cards = cards(3);
        let mut c = ctx(2, &cards, 2);
        assert_eq!(
            choose_address(&c, &env(14, 7)).unwrap(),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
            "loopback rendezvous: 127.0.0.<rank + 1>"
        );
        c.bootstrap_addr = Some("10.1.2.3".parse().unwrap());
        assert_eq!(
            choose_address(&c, &env(14, 7)).unwrap(),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
        let mut e = env(14, 7);
        e.addrs = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        // Rank 2 is the third rank of this host: entry 2 % 2.
        assert_eq!(
            choose_address(&c, &e).unwrap(),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        c.bootstrap_addr = None;
        assert!(choose_address(&c, &env(14, 7)).is_err());
    }

    #[test]
    fn credits_bound_the_sender_and_data_flows_in_order() {
        credits_bound_the_sender(env(14, 7));
    }

    #[test]
    fn credits_bound_the_sender_with_a_progress_thread() {
        credits_bound_the_sender(RoceEnv {
            progress: Progress::Thread,
            ..env(14, 7)
        });
    }

    fn credits_bound_the_sender(e: RoceEnv) {
        let (mut a, mut b) = pair(2, e);
        let t = Duration::from_millis(50);
        for k in 0..2u8 {
            let slot = a.c.send[0].wait_slot(t).unwrap();
            slot[..3].copy_from_slice(&[k, k, k]);
            a.c.send[0].post(3, k as u16, &desc()).unwrap();
        }
        // Two slots, two posts, no release: the third step has no credit.
        let e = a.c.send[0].wait_slot(t).unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::Timeout {
                    peer: 1,
                    waiting_for: WaitFor::Credit,
                    ..
                }
            ),
            "{e}"
        );
        for k in 0..2u8 {
            let c = b.c.recv[0].wait(T).unwrap();
            assert_eq!(c.data, &[k, k, k]);
            assert_eq!(
                c.imm,
                Imm {
                    step: k as u16,
                    chunk: k as u16
                }
            );
            assert_eq!(c.desc, desc());
            b.c.recv[0].release().unwrap();
        }
        assert!(b.c.recv[0].release().is_err(), "nothing held");
        a.c.send[0].drain(T).unwrap();
        // Closing the receiver ends the sender's wait with an error naming it.
        drop(b);
        let e = a.c.send[0].drain(T);
        assert!(e.is_ok(), "nothing outstanding: {e:?}");
        for k in 2..4 {
            a.c.send[0].wait_slot(T).unwrap();
            a.c.send[0].post(0, k, &desc()).unwrap();
        }
        let e = a.c.send[0].wait_slot(T).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerAborted { peer: 1, abort } if abort.reason == AbortReason::Closed),
            "{e}"
        );
    }

    #[test]
    fn data_posted_before_close_is_still_delivered() {
        let (mut a, mut b) = pair(2, env(14, 7));
        a.c.send[0].wait_slot(T).unwrap()[0] = 42;
        a.c.send[0].post(1, 0, &desc()).unwrap();
        drop(a);
        assert_eq!(b.c.recv[0].wait(T).unwrap().data, &[42]);
        b.c.recv[0].release().unwrap();
        let e = b.c.recv[0].wait(T).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerAborted { peer: 0, abort } if abort.origin == 0),
            "{e}"
        );
    }

    /// With caller-driven progress a rank that does not call into the transport still
    /// acknowledges (the keepalive thread runs its device): its peer, with an ACK timeout of
    /// 34 ms and two retries, would otherwise fail with `RETRY_EXC_ERR` after about 100 ms.
    #[test]
    fn an_idle_rank_still_acknowledges() {
        let (mut a, mut b) = pair(2, env(13, 2));
        for k in 0..3u16 {
            // `b` sends, `a` returns the credit (a SEND that `b` must acknowledge) and `b` sees
            // it: its last round received the credit and owes the ACK.
            b.c.send[0].wait_slot(T).unwrap()[0] = k as u8;
            b.c.send[0].post(1, k, &desc()).unwrap();
            assert_eq!(a.c.recv[0].wait(T).unwrap().data, &[k as u8]);
            a.c.recv[0].release().unwrap();
            b.c.send[0].drain(T).unwrap();
            // `b` leaves the transport alone for a while: only its keepalive thread runs, and
            // `a` keeps polling its CQ meanwhile.
            let until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < until {
                let e = a.c.send[0].drain(Duration::from_millis(1));
                assert!(e.is_ok(), "round {k}: {e:?}");
            }
        }
    }

    /// 70 000 steps through eight slots: the 16-bit step of the immediate wraps, credits keep
    /// coming, every payload arrives in order.
    #[test]
    fn the_step_counter_wraps_the_immediate() {
        let (mut a, mut b) = pair(8, env(14, 7));
        const N: u32 = 70_000;
        let sender = std::thread::spawn(move || {
            for k in 0..N {
                let slot = a.c.send[0].wait_slot(T).unwrap();
                slot[..4].copy_from_slice(&k.to_le_bytes());
                a.c.send[0].post(4, k as u16, &desc()).unwrap();
            }
            a.c.send[0].drain(T).unwrap();
            a
        });
        for k in 0..N {
            let c = b.c.recv[0].wait(T).unwrap();
            assert_eq!(c.data, &k.to_le_bytes());
            assert_eq!(c.imm.step, k as u16);
            b.c.recv[0].release().unwrap();
        }
        let a = sender.join().unwrap();
        let ch = a.ch();
        let st = ch.state();
        assert_eq!((st.credit, st.data_done, st.posted), (N, N, N));
    }

    /// Posts a WRITE_WITH_IMM into the peer's slot of `step` as a hostile peer would.
    fn forge(ch: &Channel, step: u32, imm: u32, header: &SlotHeader, len: u32) {
        let off = ch.send_off;
        let b = header.encode();
        // SAFETY: staging slot 0 of a channel this test does not otherwise use for sending.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), ch.send.ptr(off), b.len()) };
        let sge = [Sge {
            addr: ch.send.iova(off),
            length: len,
            lkey: ch.send.mr.lkey(),
        }];
        let stride = ch.layout.stride() as u64;
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: ch.remote_ring + (step as u64 % ch.layout.nslots as u64) * stride,
            rkey: ch.rkey,
            imm_data: imm,
        };
        ch.post_send(&mut ch.state(), WR_DATA, &sge, op).unwrap();
    }

    #[test]
    fn forged_writes_and_credits_are_protocol_errors() {
        let header = |step: u16, len: u32| SlotHeader {
            len,
            imm: Imm { step, chunk: 0 },
            desc: desc(),
        };
        let cases: [(u32, SlotHeader, u32, &str); 4] = [
            // Step 5 where step 0 is expected.
            (Imm { step: 5, chunk: 0 }.to_raw(), header(5, 0), 64, "step"),
            // The header disagrees with the immediate.
            (
                Imm { step: 0, chunk: 0 }.to_raw(),
                SlotHeader {
                    imm: Imm { step: 0, chunk: 9 },
                    ..header(0, 0)
                },
                64,
                "immediate",
            ),
            // A payload length beyond the slot.
            (
                Imm { step: 0, chunk: 0 }.to_raw(),
                header(0, 65),
                64,
                "slot",
            ),
            // A byte count that is not header + payload.
            (
                Imm { step: 0, chunk: 0 }.to_raw(),
                header(0, 10),
                64,
                "bytes",
            ),
        ];
        for (imm, h, len, what) in cases {
            let (a, mut b) = pair(2, env(14, 7));
            forge(&a.ch(), 0, imm, &h, len);
            let e = b.c.recv[0].wait(T).unwrap_err();
            assert!(
                matches!(e, TransportError::Protocol { peer: 0, .. }),
                "{what}: {e}"
            );
        }
        // A credit for a step never posted.
        let (mut a, b) = pair(2, env(14, 7));
        let bch = b.ch();
        bch.post_send(
            &mut bch.state(),
            WR_CREDIT,
            &[],
            SendOp::SendWithImm { imm_data: 7 },
        )
        .unwrap();
        let e = a.c.send[0].drain(T).and_then(|()| {
            a.c.send[0].wait_slot(T)?;
            a.c.send[0].post(0, 0, &desc())?;
            a.c.send[0].drain(T)
        });
        assert!(
            matches!(e, Err(TransportError::Protocol { peer: 1, .. })),
            "{e:?}"
        );
    }

    #[test]
    fn misuse_is_refused() {
        let (mut a, _b) = pair(2, env(14, 7));
        assert!(matches!(
            a.c.send[0].post(0, 0, &desc()),
            Err(TransportError::Usage { .. })
        ));
        a.c.send[0].wait_slot(T).unwrap();
        assert!(matches!(
            a.c.send[0].post(65, 0, &desc()),
            Err(TransportError::Usage { .. })
        ));
        // SAFETY: refused before anything reads `src`.
        let e = unsafe { a.c.send[0].post_from(&[0; 8], &[], 0, &desc(), T) };
        assert!(matches!(e, Err(TransportError::Usage { .. })), "{e:?}");
    }

    /// Zero-copy sends: the payload goes from the user buffer (registered once, as a whole:
    /// the later sends from other pages of the same buffer hit the registration cache) into the
    /// peer's slot; a region that does not contain the source registers the source alone.
    #[test]
    fn post_from_reads_user_memory_and_registers_it_once() {
        let (mut a, mut b) = pair(2, env(14, 7));
        let mut buf = vec![0u8; 4 * RegCache::PAGE];
        let off = buf.as_ptr().align_offset(RegCache::PAGE);
        // Three pages; the sources below lie in different pages of it.
        let user = &mut buf[off..off + 3 * RegCache::PAGE];
        for (i, b) in user.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let user = &*user;
        for k in 0..3u16 {
            let at = k as usize * (RegCache::PAGE + 50);
            let src = &user[at..at + 64];
            // SAFETY: `user` outlives the drain below and is not written.
            unsafe { a.c.send[0].post_from(src, user, k, &desc(), T) }.unwrap();
            let c = b.c.recv[0].wait(T).unwrap();
            assert_eq!(c.data, src);
            assert_eq!(c.imm.chunk, k);
            b.c.recv[0].release().unwrap();
        }
        a.c.send[0].drain(T).unwrap();
        {
            let hca = a.t.hca.as_ref().unwrap();
            let regs = lock(&hca.regs);
            assert_eq!((regs.registrations, regs.hits), (1, 2));
            assert_eq!(hca.user_wrs.load(Ordering::Acquire), 0);
        }
        // A region that does not hold the source: the source's page is registered, not the
        // region (which would not cover the SGE).
        let other = vec![7u8; 64];
        let src = &user[..64];
        // SAFETY: as above.
        unsafe { a.c.send[0].post_from(src, &other, 3, &desc(), T) }.unwrap();
        let c = b.c.recv[0].wait(T).unwrap();
        assert_eq!(c.data, src);
        b.c.recv[0].release().unwrap();
        a.c.send[0].drain(T).unwrap();
        let hca = a.t.hca.as_ref().unwrap();
        let regs = lock(&hca.regs);
        assert_eq!(
            (regs.registrations, regs.hits),
            (1, 3),
            "inside the first registration"
        );
    }

    /// A peer whose device is gone (no abort message, no process to watch: it shares ours) is
    /// found by the QP: a data WRITE to it, and a probe from a rank waiting for it, end with
    /// `IBV_WC_RETRY_EXC_ERR`, reported as the peer's death.
    #[test]
    fn a_dead_peer_is_found_by_the_qp() {
        // 4.096 us * 2^10 = 4 ms ACK timeout, one retry.
        let (mut a, b) = pair(2, env(10, 1));
        b.ch().hca.dev.close();
        let e = a.c.recv[0].wait(T).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerDied { peer: 1, .. }),
            "a probe finds it: {e}"
        );
        let (mut a, b) = pair(2, env(10, 1));
        b.ch().hca.dev.close();
        a.c.send[0].wait_slot(T).unwrap();
        a.c.send[0].post(0, 0, &desc()).unwrap();
        let e = a.c.send[0].drain(T).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerDied { peer: 1, .. }),
            "the write finds it: {e}"
        );
        assert!(e.to_string().contains("peer rank 1"), "{e}");
        drop(b);
    }
}
