//! A software RDMA device: the [`SoftHca`] engine, a link and a progress engine, behind a
//! thread-safe verbs API (what `ibv_open_device` gives a program over Linux's soft-RoCE driver,
//! rxe, but in user space). [`SoftDevice`] is generic over its [`Link`]: [`UdpDevice`] runs on a
//! kernel UDP socket ([`UdpLink`](crate::link::udp::UdpLink) over a [`RoceSocket`](crate::link::udp::RoceSocket)), [`VfioDevice`] on a virtio-net NIC that the
//! process drives through VFIO ([`VfioLink`](crate::link::vfio::VfioLink)), and [`AnyDevice`] on
//! either, chosen at run time (the tools' `--link`). The progress engine below is the same for
//! all; the sections on addresses, GSO and windows describe the UDP device.
//!
//! # What it is
//! RoCEv2 (IBTA vol. 1 Annex A17) carries InfiniBand transport packets in UDP datagrams to port
//! 4791. A [`UdpDevice`] binds one UDP socket to one local IP address and that port, and runs the
//! sans-I/O transport engine ([`crate::engine`]) over it: a program creates PDs, MRs, CQs and QPs,
//! posts work requests and polls completions, and the device turns them into packets on the
//! socket and back. Two devices (two processes, or two addresses of one host such as 127.0.0.1
//! and 127.0.0.2) talk RDMA to each other, and to Linux rxe peers, with no RDMA hardware.
//!
//! # Addresses
//! The device's only GID (GID table index 0, RoCEv2) is its IP address: the IPv4-mapped GID
//! `::ffff:a.b.c.d` for an IPv4 address (IBTA Annex A17.4.1), the address itself for an IPv6 one
//! (a link-local `fe80::` address included; give its interface in
//! [`UdpDeviceConfig::scope_id`]). Address vectors name peers by GID; packets go to the peer's IP
//! address and UDP port 4791, or the port [`UdpDevice::set_peer_port`] set for that address (so
//! that tests can run two devices on one address, e.g. `::1`, with two ports).
//!
//! A UDP socket sends from its bound port, and the ICRC covers the UDP source port. For per-QP
//! source-port entropy (ECMP, IBTA vol. 1 Annex A17.2.3) the device keeps
//! [`UdpDeviceConfig::src_ports`] more sockets that only send, each bound to its own port of
//! RoCEv2's entropy range, and the engine builds each QP's packets with the port its QPN (or flow
//! label) selects among them ([`EngineConfig::udp_src_ports`], [`crate::engine::src_port_for`]);
//! all of one QP's packets leave from one port. Received datagrams are handed to the engine as addressed to port 4791 whatever port
//! the device is bound to; its peers build their ICRC that way too.
//!
//! The IPv4 identification is covered by the ICRC too, but a UDP socket cannot read it: for
//! IPv4 packets the engine solves for the identification that makes the ICRC verify
//! ([`roce::icrc::solve_ipv4_ident`], counted in `icrc_ident_solved`) and drops those for which
//! none does (`icrc_errors`); this keeps 16 of the ICRC's 32 bits of integrity. IPv6 packets (no
//! identification) have their ICRC checked in full.
//!
//! # Progress
//! The engine does nothing by itself: someone must receive datagrams, fire timers and send what
//! it builds. [`Progress::Thread`] (the default) runs a progress thread per device: it receives
//! a batch (recvmmsg(2)), hands it to the engine, fires due timers, builds a batch of packets into
//! preallocated buffers and sends them with one sendmmsg(2), then sleeps in poll(2) on the socket
//! and a waker until a datagram arrives, the engine's next timer is due, or a verb wakes it. The
//! engine lock is held only while the engine runs, never across a system call. Verbs that create
//! work ([`UdpDevice::post_send`]) build and send its packets at once on the caller's thread when
//! the progress thread sleeps (no thread hand-off on the send path of an idle device), and leave
//! them to the thread when it is busy (it sends them with the rest, in full batches).
//!
//! [`Progress::Caller`] runs no thread: [`UdpDevice::poll_cq`] (and [`UdpDevice::wait_cq`],
//! [`UdpDevice::progress`]) drive one progress round each. Timers (retransmission, RNR waits) then
//! only fire while the program polls; [`UdpDevice::progress_during`] keeps them running across a
//! blocking call. A round that received datagrams leaves building their ACKs to the caller's next
//! call, so that an ACK and the reply the program posts meanwhile leave in one sendmmsg(2).
//!
//! # Batching and offloads
//! The socket link batches system calls (recvmmsg / sendmmsg, up to 64 datagrams) and uses UDP
//! GSO (a train of equal datagrams to one peer in one message) and GRO where the kernel has
//! them. Over IPv4 the kernel numbers the identification of a train's datagrams 0, 1, 2, ..., and
//! the ICRC covers it: the device recomputes the ICRC of each datagram after the first of a
//! train for its number ([`UdpDeviceConfig::gso_ipv4`]), so peers that check it accept them.
//!
//! # Windows
//! Each RC / UC QP may have a window of unacknowledged packets in flight
//! ([`EngineConfig::max_unacked_psns`], 128), and a socket drops what does not fit the peer's
//! receive buffer: many QPs with full windows overrun it, and every loss costs a go-back-N
//! retransmission of the rest of a window. The device therefore shares a budget of packets
//! ([`UdpDeviceConfig::window_budget`]) among its QPs: each QP's window is the budget over the
//! number of QPs, at most the configured window and at least 16, recomputed as QPs come and go.
//!
//! # Shutdown
//! [`UdpDevice::close`] (and dropping the device) sends what the engine still has queued, moves
//! every QP to ERR, which completes every outstanding work request with `IBV_WC_WR_FLUSH_ERR` in
//! its CQ before `close` returns, and stops and joins the progress thread. Completions stay
//! pollable afterwards; verbs that would create work fail with [`DeviceError::Closed`].

mod progress;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use gpu_p2p::Memory;

use crate::engine::{Counters, EngineConfig, SoftHca};
use crate::link::udp::ROCEV2_PORT as UDP_ROCEV2_PORT;
use crate::link::{Link, Waker};
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::api::{GsiPort, MadHook};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PortAttr};
use crate::verbs::event::AsyncEvent;
use crate::verbs::gid::{Gid, GidEntry, GidType};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr};
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::wc::{WcOpcode, WorkCompletion};
use crate::verbs::wr::{RecvWr, SendWr};

use progress::Io;

#[cfg(target_os = "linux")]
pub mod any;
mod udp;
mod verbs;
#[cfg(target_os = "linux")]
mod vfio;
#[cfg(target_os = "linux")]
mod xdp;

pub use crate::verbs::api::DeviceError;
#[cfg(target_os = "linux")]
pub use any::{AnyConfig, AnyDevice};
pub use udp::{UdpDevice, UdpDeviceConfig, DEFAULT_SRC_PORTS};
#[cfg(target_os = "linux")]
pub use vfio::{VfioDevice, VfioDeviceConfig};
#[cfg(target_os = "linux")]
pub use xdp::{XdpDevice, XdpDeviceConfig};

/// What the software device needs of its [`Link`] beyond the link itself: how a device over it is
/// opened ([`SoftDevice::config`]), and that the link's errors become [`DeviceError`]s.
pub trait SoftLink: Link<Error: Into<DeviceError>> {
    /// The configuration a device over this link was opened with.
    type DeviceConfig: Clone + fmt::Debug + Send + Sync + 'static;

    /// Sends the packets for peer address `ip` to UDP port `port` (a link on a kernel socket);
    /// `false` when the link always sends to 4791 (the default).
    fn set_peer_port(&mut self, ip: IpAddr, port: u16) -> bool {
        let _ = (ip, port);
        false
    }

    /// The UDP port the link is bound to when it is a kernel socket (the default: `None`).
    fn udp_port(&self) -> Option<u16> {
        None
    }

    /// The shared address and this process's slot on it when the link is a shared kernel
    /// socket ([`crate::link::udp::share`]; the default: `None`).
    fn shared_slot(&self) -> Option<(std::net::SocketAddr, usize)> {
        None
    }

    /// Memory the link sends from without a copy ([`crate::verbs::Verbs::alloc_memory`]);
    /// `None` (the default) for a link without any.
    fn alloc_memory(&self, len: usize) -> Option<Result<Arc<dyn Memory>, DeviceError>> {
        let _ = len;
        None
    }
}

/// The RoCEv2 UDP port, 4791 (IBTA vol. 1 Annex A17.2.2): the default local and peer port.
pub const ROCEV2_PORT: u16 = UDP_ROCEV2_PORT;

/// The GID table index of the device's address (its only GID).
pub const GID_INDEX: u32 = 0;

/// Who drives the engine (see the [module docs](self#progress)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Progress {
    /// A progress thread per device (default): the program only posts and polls.
    #[default]
    Thread,
    /// No thread: [`UdpDevice::poll_cq`], [`UdpDevice::wait_cq`] and [`UdpDevice::progress`]
    /// each drive one progress round.
    Caller,
    /// A progress thread, and a [`UdpDevice::poll_cq`] that finds its CQ empty runs a round
    /// itself when no other thread is in one (`try_lock`, never waiting): a busy-polling program
    /// gets [`Progress::Caller`]'s latency path (its own thread receives and sends, no hand-off;
    /// a received message's ACK is held for the reply, bounded by [`ACK_HOLD`]), and one that
    /// never polls or waits on a completion channel still gets the thread. While a caller
    /// polled within [`CALLER_WINDOW`] the thread sleeps on its waker only, not on the socket,
    /// so that datagrams do not wake it (a context switch each); [`UdpDevice::req_notify_cq`]
    /// and [`UdpDevice::wait_cq`] end that window (the program is about to block) and give the
    /// socket back to the thread. What a caller stops driving (a timer, a full batch) waits at
    /// most [`CALLER_WINDOW`], a held ACK [`ACK_HOLD`] + [`CALLER_WINDOW`]. The drop-in libibverbs
    /// (`hca/abi`) opens its devices so.
    Hybrid,
}

/// [`Progress::Hybrid`]: how long after a caller's polling round the progress thread leaves the
/// socket to callers. 1 ms: at a few microseconds per round trip, one thread wake per hundreds
/// of iterations, and the longest a packet waits when the program stops polling without
/// [`UdpDevice::req_notify_cq`].
pub const CALLER_WINDOW: Duration = Duration::from_millis(1);

/// [`Progress::Hybrid`] and [`Progress::Caller`]: how long a caller's round may hold the ACKs
/// (and READ responses) of what it received, so that they leave in one sendmmsg(2) with the
/// reply the program posts next (IBTA vol. 1 9.7.5.1.2 lets a responder coalesce
/// acknowledgements; the requester retransmits only after its Local ACK Timeout, 4.096 us x
/// 2^`timeout`, 9.7.6.1.3: 67 ms at perftest's and ibv_rc_pingpong's `timeout` 14, 1 s at
/// librdmacm's 18). With [`Progress::Hybrid`] a caller's round whose oldest hold is this old
/// builds at once; when callers stop polling, the progress thread builds it at the end of the
/// caller window ([`CALLER_WINDOW`] after their last round), or this long after it began if it
/// was already held when the thread went to sleep. A held ACK so waits at most `ACK_HOLD`
/// while the program polls, and at most `ACK_HOLD` + `CALLER_WINDOW` (1.25 ms, plus scheduling
/// delay) when it stops polling right after the message (neither posting, nor arming a CQ, nor
/// exiting): below the Local ACK Timeout of `timeout` >= 9 (2.1 ms); a smaller `timeout` may
/// then see a spurious retransmission, answered as a duplicate (9.7.5.1.1). Destroying or
/// modifying a QP, closing the device, arming a CQ and (in the drop-in libibverbs) process exit
/// send a hold at once. The thread is not woken for a hold (that would be a context switch per
/// message of a ping-pong); while a program busy-polls it wakes about once per
/// [`CALLER_WINDOW`] (it woke every `ACK_HOLD`, 4000 times a second, before).
pub const ACK_HOLD: Duration = Duration::from_micros(250);

/// [`Progress::Hybrid`]: a thread whose poll of an empty CQ ran a round that received nothing
/// yields the CPU (sched_yield(2)) in [`SoftDevice::poll_cq`] at the first such poll of a run
/// (a run ends with a completion or a round that received), and then once per this interval
/// while the run goes on. The first yield stands for `rdma-perf`'s yield after each post: a
/// peer that shares this CPU answers at once instead of after a scheduler slice (3 ms and
/// more), and a loaded machine's two ping-pong ends settle on one CPU, handing it over with one
/// yield per message (counts of `ib_send_lat -s 8` over the drop-in library at load 20: 1.0
/// sched_yield, 1.0 recvmmsg and 1.0 sendmmsg per iteration, as `rdma-perf send-lat`);
/// sched_yield(2) returns at once when nothing else waits for the CPU. 30 us: above a loopback
/// round trip (about 10 us), so a program whose peer runs on another CPU seldom yields twice
/// per message. History: yielding at every empty poll and after each post, as `rdma-perf`
/// does, made Debian's `ib_write_bw` pairs of `hca/abi/tests/shared_perftest.rs` fail at load
/// 16-26 (the post yield 2 runs of 2, the poll yield 4 of 5, with a progress thread that woke
/// every 250 us and a stray read per round); with the thread's window-only wake and the
/// rate-limited stray read, the yield at every empty poll still hung 1 run of 8 at load 9-23
/// (not analysed), the first-poll yield passed 7 of 7 (branch `wake18`).
pub const YIELD_AFTER: Duration = Duration::from_micros(30);

std::thread_local! {
    /// When this thread's run of empty polls began or last yielded ([`YIELD_AFTER`];
    /// nanoseconds of the device clock of the CQ it polls), or [`AFTER_COMPLETION`],
    /// [`AFTER_RECEIPT`].
    static EMPTY_SINCE: std::cell::Cell<u64> = const { std::cell::Cell::new(AFTER_COMPLETION) };
}

/// [`EMPTY_SINCE`]: the thread's last poll returned completions.
const AFTER_COMPLETION: u64 = 0;
/// [`EMPTY_SINCE`]: the thread's last poll found none, but its round received datagrams.
const AFTER_RECEIPT: u64 = 1;

/// What the device's progress engine has done (the engine's and the link's own counters are
/// [`SoftDevice::counters`] and [`SoftDevice::link_counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Progress rounds run (by the thread or by callers).
    pub rounds: u64,
    /// Rounds run on a caller's thread right after a verb (the send fast path).
    pub inline_rounds: u64,
    /// Of [`DeviceCounters::rounds`], callers' rounds that received nothing while the engine
    /// had nothing to do and no verb had run since the last full round: their receive call
    /// was all they did (no engine lock, no clock read but every 8th; issue 21).
    pub quiet_rounds: u64,
    /// Times the progress thread went to sleep in poll(2).
    pub sleeps: u64,
    /// Times a verb woke the progress thread.
    pub wakes: u64,
    /// Packets the engine built that the socket refused for good (`EMSGSIZE` above the path
    /// MTU, unreachable network, address family mismatch): dropped, like a lost packet.
    pub tx_dropped: u64,
    /// Times the socket's send buffer was full (the rest was sent later).
    pub tx_blocked: u64,
    /// Socket errors while receiving (the last one is also logged by [`UdpDevice::last_error`]).
    pub rx_errors: u64,
    /// [`Progress::Hybrid`]: polls of an empty CQ that found another thread in a round (the
    /// `io` lock taken) and so received nothing themselves.
    pub caller_io_busy: u64,
    /// [`Progress::Hybrid`]: the longest run of consecutive such polls, in nanoseconds.
    pub caller_io_busy_max_ns: u64,
    /// [`Progress::Hybrid`]: the longest time between two rounds run by callers (polls of an
    /// empty CQ), in nanoseconds: how long a caller that polls left the socket unread.
    pub caller_round_gap_max_ns: u64,
    /// [`Progress::Hybrid`]: times callers' rounds paused longer than [`CALLER_WINDOW`] (the
    /// thread then takes the socket back); includes the pauses of a program's setup.
    pub caller_round_gaps: u64,
}

/// State shared by the device handle, its progress thread and callers.
pub(crate) struct Shared<L: SoftLink> {
    engine: Mutex<SoftHca>,
    /// Signalled after a round changed the engine, for [`UdpDevice::wait_cq`] (thread mode).
    cq_cv: Condvar,
    cq_waiters: AtomicUsize,
    io: Mutex<Io<L>>,
    poller: L::Poller,
    waker: Waker,
    /// The link's name, for errors.
    name: String,
    /// Idle rounds the progress thread spins before it sleeps ([`Link::spin_rounds`]).
    spin_rounds: u32,
    progress: Progress,
    origin: std::time::Instant,
    closed: AtomicBool,
    stop: AtomicBool,
    /// The thread is about to sleep / sleeping (Dekker pair with `pending`).
    sleeping: AtomicBool,
    /// A caller asked for a round it could not run itself.
    pending: AtomicBool,
    /// [`Progress::Hybrid`]: the end of the window in which callers poll (nanoseconds since
    /// `origin`; 0: none): the thread leaves the socket to them until then.
    caller_until: AtomicU64,
    /// [`Progress::Hybrid`]: when a caller's poll first found `io` taken, of the run of such
    /// polls going on (nanoseconds since `origin`; 0: none), for
    /// [`DeviceCounters::caller_io_busy_max_ns`].
    caller_busy_since: AtomicU64,
    /// [`Progress::Hybrid`]: when the last caller round ran (nanoseconds since `origin`; 0:
    /// none yet), for [`DeviceCounters::caller_round_gap_max_ns`].
    last_caller_round: AtomicU64,
    /// [`DeviceCounters::caller_round_gap_max_ns`] (kept out of the `counters` mutex: written
    /// on the polling path).
    caller_round_gap_max: AtomicU64,
    /// [`DeviceCounters::caller_round_gaps`].
    caller_round_gaps: AtomicU64,
    /// [`Progress::Hybrid`]: the thread sleeps on its waker only (not on the socket).
    blind: AtomicBool,
    /// When the oldest ACK (or READ response) a caller's round left unbuilt was received
    /// (nanoseconds since `origin`; 0: none held): [`ACK_HOLD`]. Written by the holder of `io`.
    held_since: AtomicU64,
    /// When the sleeping thread will wake by itself (nanoseconds since `origin`; `u64::MAX`:
    /// never). A caller that arms an earlier timer wakes it.
    sleep_until: AtomicU64,
    counters: Mutex<DeviceCounters>,
    /// [`DeviceCounters::rounds`] and [`DeviceCounters::inline_rounds`], bumped on every round
    /// (the fast path) without the `counters` lock: only the holder of `io` writes them.
    round_counts: progress::RoundCounts,
    last_error: Mutex<Option<String>>,
    /// Bumped after every engine operation that may have changed a CQ (Release; pollers load
    /// it with Acquire before taking the lock).
    epoch: AtomicU64,
    /// Per CQ slot: `cq index << 40 | epoch` at which a poll found that CQ empty.
    empty_hint: [AtomicU64; EMPTY_HINT_SLOTS],
    /// Called after a round or verb that may have queued a CQ or async event
    /// ([`SoftDevice::set_event_hook`]).
    event_hook: std::sync::OnceLock<crate::verbs::api::EventHook>,
    /// Called after a round that leaves received MADs in QP1's queue ([`GsiPort::set_mad_hook`]);
    /// `mad_hook_on` lets rounds skip the lock when none is installed.
    mad_hook: Mutex<Option<MadHook>>,
    mad_hook_on: AtomicBool,
    /// Packets in flight shared among the RC / UC QPs ([`UdpDeviceConfig::window_budget`]).
    window_budget: u32,
    /// The configured window of one QP ([`EngineConfig::max_unacked_psns`]).
    max_window: u32,
}

/// Slots of [`Shared::empty_hint`] (CQs share slots by index modulo this; the key names the CQ,
/// so sharing costs only a lock, never a missed completion).
const EMPTY_HINT_SLOTS: usize = 64;

/// The least window a QP gets however many share the budget.
const MIN_WINDOW: u32 = 16;

impl<L: SoftLink> Shared<L> {
    /// Shares the window budget among the RC / UC QPs now in the engine.
    fn share_window(&self, e: &mut SoftHca) {
        // O(1): the context counts its RC / UC QPs (walking them made creating n QPs O(n^2)).
        let qps = e.context().connected_qp_count().max(1);
        let window =
            (self.window_budget / qps).clamp(MIN_WINDOW.min(self.max_window), self.max_window);
        e.set_max_unacked_psns(window);
    }

    /// Runs `f` on the engine under its lock, then bumps the epoch: `f` may have changed a CQ.
    pub(crate) fn engine_op<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> R {
        let r = f(&mut lock(&self.engine));
        self.epoch.fetch_add(1, Ordering::Release);
        r
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A software RoCEv2 device: the [`SoftHca`] engine over link `L` with a progress engine,
/// behind a thread-safe verbs API; see the [module docs](self). `Send + Sync`: share it with an
/// `Arc` and call verbs from any thread. [`UdpDevice`] runs on a kernel UDP socket,
/// [`VfioDevice`] on a virtio-net NIC driven through VFIO.
pub struct SoftDevice<L: SoftLink> {
    shared: Arc<Shared<L>>,
    config: L::DeviceConfig,
    gid: Gid,
    gid_index: u32,
    local: SocketAddr,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_name: Option<String>,
}

impl<L: SoftLink> fmt::Debug for SoftDevice<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftDevice")
            .field("link", &self.shared.name)
            .field("progress", &self.shared.progress)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<L: SoftLink> SoftDevice<L> {
    /// Runs the engine over an open `link`: creates the engine on the link's device
    /// ([`Link::device`]: attributes, active MTU, GID table) with `engine_config`, shares
    /// `window_budget` packets (default: 128 per QP's window, the configured maximum) among
    /// the RC / UC QPs, and starts the progress thread ([`Progress::Thread`]). `config` is kept
    /// for [`SoftDevice::config`].
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] if the link's GID table is refused; the link's error when its
    /// poller cannot be made; [`DeviceError::Link`] when the waker cannot be;
    /// [`DeviceError::Thread`].
    pub fn with_link(
        link: L,
        config: L::DeviceConfig,
        engine_config: EngineConfig,
        progress: Progress,
        window_budget: Option<u32>,
    ) -> Result<SoftDevice<L>, DeviceError> {
        let name = link.name();
        let local = link.local_addr();
        let poller = link.poller().map_err(Into::into)?;
        let waker = Waker::new()?;
        let device = link.device();
        // The device's GID: the RoCEv2 GID of the address its packets leave from.
        let (gid_index, gid) = device
            .port
            .gids
            .iter()
            .find(|(_, e)| e.gid == Gid::from(local.ip()) && e.gid_type == GidType::RoceV2)
            .or_else(|| device.port.gids.iter().next())
            .map_or((0, Gid::from(local.ip())), |(i, e)| (i, e.gid));
        let max_window = engine_config.max_unacked_psns.max(1);
        let mut hca = SoftHca::new(device, engine_config);
        // Setting up the GID table raised IBV_EVENT_GID_CHANGE: nobody asked for it yet.
        while hca.poll_event().is_some() {}
        let spin_rounds = link.spin_rounds();
        let io = Io::new(link);
        let shared = Arc::new(Shared {
            engine: Mutex::new(hca),
            cq_cv: Condvar::new(),
            cq_waiters: AtomicUsize::new(0),
            io: Mutex::new(io),
            poller,
            waker,
            name,
            spin_rounds,
            progress,
            origin: std::time::Instant::now(),
            closed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            caller_until: AtomicU64::new(0),
            caller_busy_since: AtomicU64::new(0),
            last_caller_round: AtomicU64::new(0),
            caller_round_gap_max: AtomicU64::new(0),
            caller_round_gaps: AtomicU64::new(0),
            blind: AtomicBool::new(false),
            held_since: AtomicU64::new(0),
            sleep_until: AtomicU64::new(u64::MAX),
            counters: Mutex::new(DeviceCounters::default()),
            round_counts: progress::RoundCounts::default(),
            last_error: Mutex::new(None),
            epoch: AtomicU64::new(0),
            empty_hint: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            event_hook: std::sync::OnceLock::new(),
            mad_hook: Mutex::new(None),
            mad_hook_on: AtomicBool::new(false),
            window_budget: window_budget.unwrap_or(u32::MAX),
            max_window,
        });
        // Linux keeps 15 bytes of a thread name: a process-wide serial number tells devices apart.
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let thread_name = format!("soft-hca#{}", SERIAL.fetch_add(1, Ordering::Relaxed));
        let thread = match progress {
            Progress::Thread | Progress::Hybrid => {
                let s = shared.clone();
                let handle = std::thread::Builder::new()
                    .name(thread_name.clone())
                    .spawn(move || s.run_thread())
                    .map_err(|source| DeviceError::Thread {
                        device: shared.name.clone(),
                        source,
                    })?;
                Some(handle)
            }
            Progress::Caller => None,
        };
        Ok(SoftDevice {
            thread_name: thread.is_some().then_some(thread_name),
            shared,
            config,
            gid,
            gid_index,
            local,
            thread: Mutex::new(thread),
        })
    }

    // ---- the device ----

    /// The address the device's packets leave from ([`Link::local_addr`]): for a UDP device the
    /// bound socket address (the port the kernel picked if the config said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Sends packets for peer address `ip` to UDP port `port` instead of the configured peer
    /// port (two devices on one address, bound to two ports). Returns `false` on a link that
    /// always sends to 4791 (VFIO).
    pub fn set_peer_port(&self, ip: IpAddr, port: u16) -> bool {
        lock(&self.shared.io).link.set_peer_port(ip, port)
    }

    /// The link's name ([`Link::name`]): `udp:ADDRESS:PORT`, `vfio:PCI_ADDRESS`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The name of the progress thread (`soft-hca#N`, N counting the devices of this process;
    /// shown by `ps -L` / `top -H`), `None` with [`Progress::Caller`].
    pub fn thread_name(&self) -> Option<String> {
        self.thread_name.clone()
    }

    /// The configuration the device was opened with.
    pub fn config(&self) -> &L::DeviceConfig {
        &self.config
    }

    /// The device's GID: the GID of [`SoftDevice::local_addr`]'s address (at [`GID_INDEX`] on a
    /// UDP device).
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The GID table index of [`SoftDevice::gid`] ([`GID_INDEX`] on a UDP device, 2 on a VFIO
    /// device with an IPv4 address, 1 on one without).
    pub fn gid_index(&self) -> u32 {
        self.gid_index
    }

    /// ibv_query_device(3).
    pub fn query_device(&self) -> DeviceAttr {
        lock(&self.shared.engine).context().query_device().clone()
    }

    /// ibv_query_port(3) of port 1.
    pub fn query_port(&self) -> PortAttr {
        let e = lock(&self.shared.engine);
        e.context().device().port.attr.clone()
    }

    /// ibv_query_gid(3) on port 1.
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] for an empty or out-of-range index.
    pub fn query_gid(&self, index: u32) -> Result<GidEntry, DeviceError> {
        Ok(lock(&self.shared.engine).context().query_gid(1, index)?)
    }

    /// The engine's counters (packets, drops by reason, retries, ...).
    pub fn counters(&self) -> Counters {
        lock(&self.shared.engine).counters().clone()
    }

    /// The link's counters (a socket's datagrams, system calls, GSO/GRO and kernel drops; a
    /// NIC's frames, notifications and neighbour table).
    pub fn link_counters(&self) -> L::Counters {
        lock(&self.shared.io).link.counters()
    }

    /// The window of unacknowledged packets each RC / UC QP has now (see the
    /// [module docs](self#windows)).
    pub fn qp_window(&self) -> u32 {
        lock(&self.shared.engine).config().max_unacked_psns
    }

    /// The progress engine's counters.
    pub fn device_counters(&self) -> DeviceCounters {
        let mut c = *lock(&self.shared.counters);
        self.shared.round_counts.read_into(&mut c);
        c.caller_round_gap_max_ns = self.shared.caller_round_gap_max.load(Ordering::Relaxed);
        c.caller_round_gaps = self.shared.caller_round_gaps.load(Ordering::Relaxed);
        c
    }

    /// The last socket error the progress engine met (it keeps running), if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.last_error).clone()
    }

    /// The device clock: the [`crate::engine::Instant`] the engine's timers count in (for a
    /// sans-I/O consumer of the engine such as [`crate::cm::Cm`], driven through
    /// [`SoftDevice::with_engine`]).
    pub fn now(&self) -> crate::engine::Instant {
        self.shared.now()
    }

    /// Runs `f` on the engine under its lock (diagnostics, verbs not wrapped here). Keep it
    /// short: the progress thread waits meanwhile.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> R {
        let r = self.shared.engine_op(f);
        self.kick();
        r
    }

    /// The hook of [`GsiPort::set_mad_hook`], if one is installed.
    fn mad_hook(&self) -> Option<MadHook> {
        lock(&self.shared.mad_hook).clone()
    }

    fn check_open(&self) -> Result<(), DeviceError> {
        if self.shared.closed.load(Ordering::Acquire) {
            Err(DeviceError::Closed {
                device: self.shared.name.clone(),
            })
        } else {
            Ok(())
        }
    }

    /// Runs `f` on the engine after bringing its clock up to date (verbs have no `now`; timers
    /// they arm count from the engine's latest instant); returns `f`'s result and that instant.
    fn engine_now<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> (R, crate::engine::Instant) {
        self.shared.engine_op(|e| {
            let now = self.shared.now();
            e.handle_timeout(now);
            (f(e), now)
        })
    }

    /// After a verb that may have created work: send it now on this thread if the socket is
    /// free, else have the progress thread do it.
    fn kick(&self) {
        self.shared.kick(None);
    }

    // ---- PD, MR ----

    /// ibv_alloc_pd(3).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::alloc_pd`].
    pub fn alloc_pd(&self) -> Result<PdHandle, DeviceError> {
        self.check_open()?;
        Ok(self.shared.engine_op(|e| e.alloc_pd())?)
    }

    /// ibv_dealloc_pd(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::dealloc_pd`].
    pub fn dealloc_pd(&self, pd: PdHandle) -> Result<(), DeviceError> {
        // Held ACKs of the PD's QPs leave first ([`ACK_HOLD`]).
        self.shared.flush_held();
        Ok(self.shared.engine_op(|e| e.dealloc_pd(pd))?)
    }

    /// ibv_reg_mr(3) over all of `memory`: its bytes become the MR `iova .. iova + len`. On a
    /// link whose device reads registered memory by DMA (VFIO), the pages are mapped into the
    /// device's IOMMU ([`Link::map_memory`]) until [`SoftDevice::dereg_mr`], so that packets
    /// leave straight from them; memory without a host address ([`Memory::host_ptr`]: GPU
    /// device memory) is registered without a mapping, and its payload is copied.
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::reg_mr`]; the link's error
    /// when the mapping fails (the region is then deregistered again).
    pub fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError> {
        let len = memory.len();
        self.reg_mr_range(pd, memory, 0, len, iova, access)
    }

    /// ibv_reg_mr_iova(3) over `length` bytes of `memory` from byte `offset`; mapped as by
    /// [`SoftDevice::reg_mr`] (the pages of those bytes only).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::reg_mr_range`]; the link's
    /// error when the mapping fails (the region is then deregistered again).
    pub fn reg_mr_range(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        offset: usize,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError> {
        self.check_open()?;
        let mr = self
            .shared
            .engine_op(|e| e.reg_mr_range(pd, memory.clone(), offset, length, iova, access))?;
        if L::MAPS_MEMORY {
            let mapped = lock(&self.shared.io)
                .link
                .map_memory(mr.lkey(), &memory, offset, length);
            if let Err(e) = mapped {
                let _ = self.shared.engine_op(|e| e.dereg_mr(mr.lkey()));
                return Err(e.into());
            }
        }
        Ok(mr)
    }

    /// ibv_dereg_mr(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::dereg_mr`]; the link's error when unmapping fails
    /// (as [`SoftDevice::dereg_mr_unmapped`]).
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError> {
        self.dereg_mr_unmapped(lkey).map(|_| ())
    }

    /// ibv_dereg_mr(3), returning the device address range `(iova, len)` the link unmapped from
    /// its IOMMU ([`Link::unmap_memory`]; `None` when nothing was mapped). The engine forgets the
    /// keys first (a remote access NAKs from then on), then the link waits (bounded) until its
    /// device no longer reads the memory and unmaps it.
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::dereg_mr`] (nothing is unmapped); the link's error.
    pub fn dereg_mr_unmapped(&self, lkey: u32) -> Result<Option<(u64, u64)>, DeviceError> {
        self.shared.engine_op(|e| e.dereg_mr(lkey))?;
        if !L::MAPS_MEMORY {
            return Ok(None);
        }
        lock(&self.shared.io)
            .link
            .unmap_memory(lkey)
            .map_err(Into::into)
    }

    /// Runs `f` on the link under its lock (the progress engine waits meanwhile): link-specific
    /// diagnostics, such as asking the IOMMU what is left mapped.
    pub fn with_link_mut<R>(&self, f: impl FnOnce(&mut L) -> R) -> R {
        f(&mut lock(&self.shared.io).link)
    }

    // ---- CQ ----

    /// ibv_create_cq(3): a CQ of at least `cqe` entries.
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::create_cq`].
    pub fn create_cq(&self, cqe: u32) -> Result<CqHandle, DeviceError> {
        self.check_open()?;
        Ok(self.shared.engine_op(|e| e.create_cq(cqe))?)
    }

    /// ibv_destroy_cq(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::destroy_cq`].
    pub fn destroy_cq(&self, cq: CqHandle) -> Result<(), DeviceError> {
        Ok(self.shared.engine_op(|e| e.destroy_cq(cq))?)
    }

    /// ibv_poll_cq(3): moves up to `out.len()` completions into `out`, oldest first; returns how
    /// many. With [`Progress::Caller`] it runs one progress round (receive, timers, send) when
    /// the CQ has no completion ready (completions already there are returned at once: a
    /// request/response loop then answers without an extra system call). With
    /// [`Progress::Thread`] it only takes the engine lock for the copy. With
    /// [`Progress::Hybrid`] an empty CQ runs a round if no other thread is in one, and the first
    /// poll of a run that finds it empty and receives nothing yields the CPU (sched_yield(2)),
    /// and then one every [`YIELD_AFTER`], as `rdma-perf`'s polling loop yields after each post:
    /// with busy-polling programs (perftest) on both ends of a link and fewer CPUs than
    /// runnable threads, a poller would otherwise keep the CPU its peer waits for until the
    /// scheduler's slice ends, milliseconds per round trip.
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::poll_cq`].
    pub fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        let s = &self.shared;
        match s.progress {
            Progress::Caller => {
                let ready = self.poll_ready(cq, out)?;
                if ready > 0 {
                    return Ok(ready);
                }
                if s.caller_round().quiet {
                    // Nothing changed since the poll above.
                    return Ok(0);
                }
            }
            Progress::Hybrid => {
                let ready = self.poll_ready(cq, out)?;
                if ready > 0 {
                    EMPTY_SINCE.with(|c| c.set(AFTER_COMPLETION));
                    return Ok(ready);
                }
                let state = EMPTY_SINCE.with(std::cell::Cell::get);
                if state == AFTER_COMPLETION {
                    // The first empty poll since a completion: the program has most likely
                    // posted its next request or reply meanwhile. A peer that shares this CPU
                    // answers it now, before this round, which then receives the answer (one
                    // receive system call per message of a ping-pong, as `rdma-perf` makes
                    // with its yield after each post).
                    std::thread::yield_now();
                }
                let Some(round) = s.hybrid_round() else {
                    // Another thread is in a round (the progress thread sending a window's
                    // batches, which a post asked for, or another poller): it does what this
                    // poll would. Spinning on the lock would take a CPU from it and from the
                    // peer (a bandwidth test's client and its progress thread and the server's
                    // thread on two CPUs): yield at each such poll, as `rdma-perf` does at
                    // each empty poll when its thread drives the device.
                    std::thread::yield_now();
                    return Ok(0);
                };
                let n = self.poll_ready(cq, out)?;
                // A round that received datagrams (more may wait: strays to forward in shared
                // mode, a burst of ACKs) is followed by another at once, not by a yield: a
                // socket read less often overflows.
                let idle = round.received == 0;
                // Still empty and nothing arrived: at the first such poll of a run (unless it
                // yielded before its round, above) and then every YIELD_AFTER, hand the CPU to
                // whoever waits for it (sched_yield(2) returns at once when nobody does). What
                // this poller waits for is another thread's work: the peer process's, when both
                // busy-poll on one CPU (it would otherwise wait a whole scheduler slice,
                // milliseconds, for its turn: one round trip per slice), or the thread holding
                // `io`.
                let now = s.now().as_nanos().max(AFTER_RECEIPT + 1);
                EMPTY_SINCE.with(|c| {
                    if n > 0 {
                        c.set(AFTER_COMPLETION);
                    } else if !idle {
                        c.set(AFTER_RECEIPT);
                    } else if state <= AFTER_RECEIPT {
                        c.set(now);
                        if state == AFTER_RECEIPT {
                            std::thread::yield_now();
                        }
                    } else if now - state >= YIELD_AFTER.as_nanos() as u64 {
                        c.set(now);
                        std::thread::yield_now();
                    }
                });
                return Ok(n);
            }
            Progress::Thread => {}
        }
        self.poll_ready(cq, out)
    }

    /// The completions `cq` holds now, without a progress round.
    fn poll_ready(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        let s = &self.shared;
        // Spinning pollers find an empty CQ without taking the engine lock (which the progress
        // thread needs): the CQ was empty at this epoch and nothing changed since.
        let epoch = s.epoch.load(Ordering::Acquire);
        let hint = &s.empty_hint[cq.index() as usize % EMPTY_HINT_SLOTS];
        let key = (u64::from(cq.index()) << 40) | (epoch & ((1 << 40) - 1));
        if hint.load(Ordering::Relaxed) == key {
            return Ok(0);
        }
        let n = lock(&s.engine).poll_cq(cq, out)?;
        if n == 0 && !out.is_empty() {
            hint.store(key, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Waits until `n` completions have been polled from `cq` or `timeout` passed, and returns
    /// those polled (fewer than `n` only if the time ran out). The thread sleeps meanwhile: on a
    /// condition variable the progress thread signals ([`Progress::Thread`]), or in poll(2) on
    /// the socket between progress rounds it runs itself ([`Progress::Caller`]).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::poll_cq`] (a destroyed CQ).
    pub fn wait_cq(
        &self,
        cq: CqHandle,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, DeviceError> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n.min(4096));
        let mut buf = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 32];
        let s = &self.shared;
        match s.progress {
            Progress::Thread | Progress::Hybrid => {
                // The caller blocks: the thread takes the socket back (Hybrid).
                s.end_caller_window();
                let mut e = lock(&s.engine);
                loop {
                    let want = (n - out.len()).min(buf.len());
                    let got = e.poll_cq(cq, &mut buf[..want])?;
                    out.extend_from_slice(&buf[..got]);
                    if out.len() >= n {
                        return Ok(out);
                    }
                    if got > 0 {
                        continue;
                    }
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Ok(out);
                    }
                    s.cq_waiters.fetch_add(1, Ordering::SeqCst);
                    let (guard, _) = s
                        .cq_cv
                        .wait_timeout(e, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner);
                    s.cq_waiters.fetch_sub(1, Ordering::SeqCst);
                    e = guard;
                }
            }
            Progress::Caller => loop {
                let outcome = s.caller_round();
                let next_timer = {
                    let mut e = lock(&s.engine);
                    loop {
                        let want = (n - out.len()).min(buf.len());
                        let got = e.poll_cq(cq, &mut buf[..want])?;
                        out.extend_from_slice(&buf[..got]);
                        if got < want || out.len() >= n {
                            break;
                        }
                    }
                    e.poll_timeout()
                };
                if out.len() >= n {
                    return Ok(out);
                }
                let now = std::time::Instant::now();
                if now >= deadline {
                    return Ok(out);
                }
                if outcome.busy() {
                    continue;
                }
                let mut sleep = deadline - now;
                if let Some(t) = next_timer {
                    let until = Duration::from_nanos(t.as_nanos());
                    sleep = sleep.min(until.saturating_sub(s.origin.elapsed()));
                }
                // A socket error here is reported by the next round.
                let _ = crate::link::LinkWait::wait(&s.poller, outcome.blocked, &s.waker, sleep);
            },
        }
    }

    /// Runs one progress round on this thread now (receive a batch, fire due timers, send a
    /// batch) and returns how many datagrams it received. Needed only with
    /// [`Progress::Caller`] when the program does not poll a CQ; harmless with a thread.
    pub fn progress(&self) -> usize {
        self.shared.caller_round().received
    }

    /// Runs `f`, a blocking call such as an out-of-band TCP exchange, while the engine keeps
    /// running: with [`Progress::Caller`] a helper thread drives progress rounds (sleeping in
    /// poll(2) between them) until `f` returns, so that the peer's packets are acknowledged and
    /// timers fire meanwhile; with a progress thread `f` just runs.
    pub fn progress_during<R>(&self, f: impl FnOnce() -> R) -> R {
        let s = &self.shared;
        if s.progress != Progress::Caller || self.is_closed() {
            return f();
        }
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let outcome = s.caller_round();
                    if outcome.busy() {
                        continue;
                    }
                    let mut sleep = Duration::from_millis(5);
                    if let Some(t) = outcome.next_timer {
                        let until = Duration::from_nanos(t.as_nanos());
                        sleep = sleep.min(until.saturating_sub(s.origin.elapsed()));
                    }
                    // A socket error here is reported by the next round.
                    let _ =
                        crate::link::LinkWait::wait(&s.poller, outcome.blocked, &s.waker, sleep);
                }
            });
            let r = f();
            done.store(true, Ordering::Release);
            let _ = s.waker.wake();
            r
        })
    }

    /// ibv_req_notify_cq(3); the event shows up in [`UdpDevice::poll_cq_event`].
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::req_notify_cq`].
    pub fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), DeviceError> {
        // A program arms a CQ before it blocks on the completion channel: the progress thread
        // takes the socket back ([`Progress::Hybrid`]).
        self.shared.end_caller_window();
        Ok(self
            .shared
            .engine_op(|e| e.req_notify_cq(cq, solicited_only))?)
    }

    /// Installs the hook called whenever a CQ event or an async event may have been queued
    /// ([`Verbs::set_event_hook`](crate::verbs::Verbs::set_event_hook)).
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] when a hook is already installed.
    pub fn set_event_hook(&self, hook: crate::verbs::api::EventHook) -> Result<(), DeviceError> {
        self.shared
            .event_hook
            .set(hook)
            .map_err(|_| DeviceError::Unsupported {
                device: self.shared.name.clone(),
                what: "a second event hook",
            })
    }

    /// The oldest unread completion event of an armed CQ (ibv_get_cq_event(3)).
    pub fn poll_cq_event(&self) -> Option<CqHandle> {
        lock(&self.shared.engine).poll_cq_event()
    }

    /// The oldest unread async event (ibv_get_async_event(3)).
    pub fn poll_event(&self) -> Option<AsyncEvent> {
        lock(&self.shared.engine).poll_event()
    }

    // ---- SRQ, AH ----

    /// ibv_create_srq(3).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::create_srq`].
    pub fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, DeviceError> {
        self.check_open()?;
        Ok(self.shared.engine_op(|e| e.create_srq(pd, attr))?)
    }

    /// ibv_modify_srq(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::modify_srq`].
    pub fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), DeviceError> {
        Ok(self.shared.engine_op(|e| e.modify_srq(srq, attr, mask))?)
    }

    /// ibv_destroy_srq(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::destroy_srq`].
    pub fn destroy_srq(&self, srq: SrqHandle) -> Result<(), DeviceError> {
        Ok(self.shared.engine_op(|e| e.destroy_srq(srq))?)
    }

    /// ibv_post_srq_recv(3).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::post_srq_recv`].
    pub fn post_srq_recv(&self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        self.shared.engine_op(|e| e.post_srq_recv(srq, wr))?;
        self.kick();
        Ok(())
    }

    /// ibv_create_ah(3): an address handle for UD sends (`attr.sgid_index` [`GID_INDEX`]).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::create_ah`].
    pub fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, DeviceError> {
        self.check_open()?;
        Ok(self.shared.engine_op(|e| e.create_ah(pd, attr))?)
    }

    /// ibv_destroy_ah(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::destroy_ah`].
    pub fn destroy_ah(&self, ah: AhHandle) -> Result<(), DeviceError> {
        Ok(self.shared.engine_op(|e| e.destroy_ah(ah))?)
    }

    // ---- QP ----

    /// ibv_create_qp(3): a QP in RESET; returns its QPN.
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::create_qp`].
    pub fn create_qp(&self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, DeviceError> {
        self.check_open()?;
        let s = &self.shared;
        Ok(s.engine_op(|e| {
            let r = e.create_qp(pd, init);
            s.share_window(e);
            r
        })?)
    }

    /// ibv_query_qp(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::query_qp`].
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), DeviceError> {
        Ok(lock(&self.shared.engine).query_qp(qpn)?)
    }

    /// ibv_modify_qp(3) (see [`SoftHca::modify_qp`]). The address vector names the peer by GID
    /// with `sgid_index` [`GID_INDEX`].
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::modify_qp`].
    pub fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, DeviceError> {
        self.check_open()?;
        // A held ACK ([`ACK_HOLD`]) leaves before the QP changes state (ERR and RESET would
        // drop it, and the peer would retransmit until IBV_WC_RETRY_EXC_ERR).
        self.shared.flush_held();
        let (outcome, now) = self.engine_now(|e| e.modify_qp(qpn, attr, mask));
        let outcome = outcome?;
        self.shared.notify_cq_waiters();
        self.shared.call_event_hook();
        self.shared.kick(Some(now));
        Ok(outcome)
    }

    /// ibv_destroy_qp(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::destroy_qp`].
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        let s = &self.shared;
        // A held ACK ([`ACK_HOLD`]) leaves before its QP goes: a program may destroy its QP
        // right after its last completion.
        s.flush_held();
        Ok(s.engine_op(|e| {
            let r = e.destroy_qp(qpn);
            s.share_window(e);
            r
        })?)
    }

    // ---- posting ----

    /// ibv_post_send(3) for one WR (see [`SoftHca::post_send`]); its packets leave at once on
    /// this thread when the socket is free.
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::post_send`].
    pub fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        let (r, now) = self.engine_now(|e| e.post_send(qpn, wr));
        r?;
        // The clock read for the verb serves the round that sends its packets too.
        self.shared.kick(Some(now));
        Ok(())
    }

    /// [`SoftDevice::post_send`] without the round that sends the WR's packets, with
    /// [`Progress::Caller`]: they leave with the next round a verb or a poll runs on this device
    /// (see [`Verbs::post_send_deferred`](crate::verbs::Verbs::post_send_deferred)). With
    /// [`Progress::Thread`] the same as `post_send`.
    ///
    /// # Errors
    /// As [`SoftDevice::post_send`].
    pub fn post_send_deferred(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        if self.shared.progress != Progress::Caller {
            return self.post_send(qpn, wr);
        }
        self.check_open()?;
        let (r, _) = self.engine_now(|e| e.post_send(qpn, wr));
        Ok(r?)
    }

    /// ibv_post_send(3) for a list of WRs: posts them in order, stops at the first refused and
    /// returns its index with the error (the ones before it stay posted), then sends.
    ///
    /// # Errors
    /// `(index, error)` of the first refused WR.
    pub fn post_send_list(&self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, DeviceError)> {
        self.check_open().map_err(|e| (0, e))?;
        let (r, now) = self.engine_now(|e| e.post_send_list(qpn, wrs));
        self.shared.kick(Some(now));
        r.map_err(|(i, e)| (i, DeviceError::Verbs(e)))
    }

    /// ibv_post_recv(3) for one WR (see [`SoftHca::post_recv`]).
    ///
    /// # Errors
    /// [`DeviceError::Closed`]; [`DeviceError::Verbs`] as [`SoftHca::post_recv`].
    pub fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        self.shared.engine_op(|e| e.post_recv(qpn, wr))?;
        Ok(())
    }

    /// ibv_post_recv(3) for a list of WRs, as [`UdpDevice::post_send_list`].
    ///
    /// # Errors
    /// `(index, error)` of the first refused WR.
    pub fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)> {
        self.check_open().map_err(|e| (0, e))?;
        self.shared
            .engine_op(|e| e.post_recv_list(qpn, wrs))
            .map_err(|(i, e)| (i, DeviceError::Verbs(e)))
    }

    // ---- shutdown ----

    /// Whether [`UdpDevice::close`] ran.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Closes the device: sends what the engine has queued (held ACKs too), moves every QP to ERR (every
    /// outstanding WR completes with `IBV_WC_WR_FLUSH_ERR` in its CQ before this returns), stops
    /// new work ([`DeviceError::Closed`]) and joins the progress thread. Completions and events
    /// stay pollable. Calling it again does nothing.
    pub fn close(&self) {
        let mut thread = lock(&self.thread);
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let s = &self.shared;
        // Last words: ACKs and responses the engine has already built or queued, held ACKs
        // included (nothing would send them later, and the peer would retransmit the messages
        // they acknowledge until RETRY_EXC_ERR).
        lock(&s.engine).release_held_acks();
        {
            let mut io = lock(&s.io);
            s.round(&mut io, false, None);
        }
        {
            let mut e = lock(&s.engine);
            let now = s.now();
            e.handle_timeout(now);
            e.error_all_qps();
        }
        s.epoch.fetch_add(1, Ordering::Release);
        s.notify_cq_waiters();
        s.call_event_hook();
        s.stop.store(true, Ordering::SeqCst);
        let _ = s.waker.wake();
        if let Some(handle) = thread.take() {
            let _ = handle.join();
        }
    }
}

impl<L: SoftLink> Drop for SoftDevice<L> {
    /// As [`SoftDevice::close`].
    fn drop(&mut self) {
        self.close();
    }
}

impl<L: SoftLink> GsiPort for SoftDevice<L> {
    fn with_gsi(&self, f: &mut dyn FnMut(crate::engine::Instant, &mut SoftHca)) {
        self.shared.engine_op(|e| {
            let now = self.shared.now().max(e.latest_instant());
            f(now, e);
        });
        self.kick();
    }

    fn set_mad_hook(&self, hook: Option<MadHook>) -> Result<(), DeviceError> {
        let on = hook.is_some();
        {
            let mut slot = lock(&self.shared.mad_hook);
            if on && slot.is_some() {
                return Err(DeviceError::Unsupported {
                    device: self.shared.name.clone(),
                    what: "a second MAD consumer on QP1",
                });
            }
            *slot = hook;
        }
        self.shared.mad_hook_on.store(on, Ordering::SeqCst);
        // MADs that arrived before the hook was installed: tell the new consumer at once.
        if on && self.shared.engine_op(|e| e.has_pending_mads()) {
            if let Some(h) = self.mad_hook() {
                h();
            }
        }
        Ok(())
    }

    fn caller_progress(&self) -> bool {
        self.shared.progress == Progress::Caller
    }

    fn shared_address(&self) -> Option<(std::net::SocketAddr, usize)> {
        lock(&self.shared.io).link.shared_slot()
    }
}
