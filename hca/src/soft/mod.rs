//! A software RDMA device: the [`SoftHca`] engine, a link and a progress engine, behind a
//! thread-safe verbs API (what `ibv_open_device` gives a program over Linux's soft-RoCE driver,
//! rxe, but in user space). [`SoftDevice`] is generic over its [`Link`]: [`UdpDevice`] runs on a
//! kernel UDP socket ([`UdpLink`] over a [`RoceSocket`]), [`VfioDevice`] on a virtio-net NIC that the
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
//! The IPv4 identification is covered by the ICRC too, but a UDP socket cannot read it: IPv4
//! packets are accepted with their ICRC unchecked (counted in `icrc_unchecked`); IPv6 packets
//! (no identification) have their ICRC checked.
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
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use gpu_p2p::Memory;

use crate::engine::{Counters, EngineConfig, SoftHca};
use crate::link::udp::{self, Offloads, RoceSocket, RoceSocketConfig};
use crate::link::{Link, LinkError, UdpLink, Waker};
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PathMtu, PortAttr};
use crate::verbs::error::VerbsError;
use crate::verbs::event::AsyncEvent;
use crate::verbs::gid::{Gid, GidEntry, GidType};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType};
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::wc::{WcOpcode, WorkCompletion};
use crate::verbs::wr::{RecvWr, SendWr};

use progress::Io;

#[cfg(all(feature = "std", target_os = "linux"))]
mod vfio;
#[cfg(all(feature = "std", target_os = "linux"))]
pub use vfio::{VfioDevice, VfioDeviceConfig};

/// The RoCEv2 UDP port, 4791 (IBTA vol. 1 Annex A17.2.2): the default local and peer port.
pub const ROCEV2_PORT: u16 = udp::ROCEV2_PORT;

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
}

/// How to open a [`UdpDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpDeviceConfig {
    /// The local IP address to bind: the device's GID. Not `0.0.0.0` / `::` (the GID must be an
    /// address of this host).
    pub local: IpAddr,
    /// IPv6 scope (interface index) of a link-local `local` address, also used for link-local
    /// destinations; 0 otherwise.
    pub scope_id: u32,
    /// The UDP port to bind, default [`ROCEV2_PORT`]; 0 picks a free port (tests).
    pub port: u16,
    /// The UDP port peers are sent to unless [`UdpDevice::set_peer_port`] says otherwise, default
    /// [`ROCEV2_PORT`].
    pub peer_port: u16,
    /// Who drives the engine. Default [`Progress::Thread`].
    pub progress: Progress,
    /// The IP MTU of the path, bytes (the interface MTU): the port's active MTU is the largest
    /// RoCE path MTU that fits it as rxe computes it (1500 gives 1024). `None` (default): see
    /// [`UdpDeviceConfig::effective_link_mtu`].
    pub link_mtu: Option<u32>,
    /// Engine tunables ([`EngineConfig::udp_src_ports`] is overwritten with the link's ports).
    pub engine: EngineConfig,
    /// Datagrams per recvmmsg(2) / sendmmsg(2), 1 ..= 64. Default 64.
    pub batch: usize,
    /// Use UDP GSO (a train of up to 64 datagrams per message; see [`crate::link::udp`]).
    /// Default true.
    pub gso: bool,
    /// Also over IPv4. The kernel numbers the IPv4 identification of a train's segments 0, 1,
    /// 2, ... and the ICRC covers it, so the device recomputes the ICRC of every segment after
    /// the first for its identification ([`RoceSocket::gso_positions`]): peers that check the
    /// ICRC (rxe, RoCE NICs) accept them. Default true.
    pub gso_ipv4: bool,
    /// Ask for UDP GRO. Default true.
    pub gro: bool,
    /// `SO_RCVBUF` / `SO_SNDBUF` to ask for, bytes (capped by `net.core.rmem_max` /
    /// `wmem_max`). Default 4 MiB: a window of 128 packets of 4 KiB must fit.
    pub socket_buffer_bytes: Option<usize>,
    /// Packets the peer can buffer for this device, shared among its RC / UC QPs as the window
    /// of unacknowledged packets of each (see the [module docs](self#windows)). `None`
    /// (default): half this device's socket receive buffer as the kernel granted it, over the
    /// path MTU plus 512 bytes of per-datagram overhead (peers are assumed alike).
    pub window_budget: Option<u32>,
    /// Sockets that only send, each from its own UDP source port, for per-QP source-port
    /// entropy (ECMP): a QP's packets leave from the port its QPN (or flow label) selects, 0 ..=
    /// 64 ([`RoceSocketConfig::src_ports`]). Default [`DEFAULT_SRC_PORTS`]; 0 sends everything from
    /// the bound port. Each costs one file descriptor.
    pub src_ports: usize,
}

/// Default [`UdpDeviceConfig::src_ports`]: 4 flows. Each sending socket is a separate sendmmsg(2)
/// and its own GSO trains, so more ports cost batching when many QPs send at once: `rdma-perf
/// write-bw -s 65536 -q 64` over loopback kept 0.87-0.88 of its `-q 1` bandwidth with 4 ports
/// (0.89-0.93 with none), 0.69-0.71 with 8 and 0.59-0.70 with 16. Raise it for fabrics with wider
/// ECMP groups.
pub const DEFAULT_SRC_PORTS: usize = 4;

impl UdpDeviceConfig {
    /// The defaults for a device on `local`.
    pub fn new(local: IpAddr) -> UdpDeviceConfig {
        UdpDeviceConfig {
            local,
            scope_id: 0,
            port: ROCEV2_PORT,
            peer_port: ROCEV2_PORT,
            progress: Progress::Thread,
            link_mtu: None,
            engine: EngineConfig::default(),
            batch: progress::MAX_TX_BATCH,
            gso: true,
            gso_ipv4: true,
            gro: true,
            socket_buffer_bytes: Some(4 << 20),
            window_budget: None,
            src_ports: DEFAULT_SRC_PORTS,
        }
    }

    /// The socket address to bind.
    pub fn socket_addr(&self) -> SocketAddr {
        match self.local {
            IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, self.port, 0, self.scope_id)),
            ip => SocketAddr::new(ip, self.port),
        }
    }

    /// The IP MTU in effect: [`UdpDeviceConfig::link_mtu`], else the MTU of the interface that
    /// holds the address (an IPv4 address: its interface from getifaddrs(3); an IPv6 address:
    /// from `/proc/net/if_inet6`; then `/sys/class/net/<if>/mtu`), else 65536 for an IPv4
    /// loopback address (`lo`) and 1500 (Ethernet) for any other.
    pub fn effective_link_mtu(&self) -> u32 {
        if let Some(mtu) = self.link_mtu {
            return mtu;
        }
        if let Some(mtu) = interface_mtu(self.local) {
            return mtu;
        }
        if self.local.is_loopback() {
            65536
        } else {
            1500
        }
    }
}

/// The MTU of the interface holding address `ip` (an IPv4 address's interface from getifaddrs(3),
/// an IPv6 one's from procfs; the MTU from sysfs; `None` when they do not say).
fn interface_mtu(ip: IpAddr) -> Option<u32> {
    let name = match ip {
        IpAddr::V4(v4) => udp::ipv4_interface(v4)?,
        IpAddr::V6(v6) => {
            let want: String = v6.octets().iter().map(|b| format!("{b:02x}")).collect();
            let table = std::fs::read_to_string("/proc/net/if_inet6").ok()?;
            table.lines().find_map(|line| {
                let mut f = line.split_whitespace();
                if f.next()? != want {
                    return None;
                }
                f.nth(4).map(str::to_owned)
            })?
        }
    };
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    mtu.trim().parse().ok()
}

/// Binds the socket of a UDP device and returns its link, the engine configuration (source port
/// set to the bound port) and the window budget; see [`UdpDevice::open`].
fn open_udp_link(config: &UdpDeviceConfig) -> Result<(UdpLink, EngineConfig, u32), DeviceError> {
    let want = config.socket_addr();
    let bad = |reason| {
        Err(DeviceError::Config {
            device: format!("udp:{want}"),
            reason,
        })
    };
    if config.local.is_unspecified() {
        return bad("the local address must be an address of this host, not 0.0.0.0 or ::");
    }
    if config.batch == 0 || config.batch > progress::MAX_TX_BATCH {
        return bad("batch must be 1 ..= 64 datagrams");
    }
    let link_mtu = config.effective_link_mtu();
    let Some(active_mtu) = PathMtu::from_link_mtu(link_mtu as usize) else {
        return bad("link MTU below the smallest RoCE path MTU (256) plus headers");
    };
    let mut link_config = RoceSocketConfig::new(want);
    link_config.batch = config.batch;
    link_config.gso = config.gso;
    link_config.gro = config.gro;
    link_config.gso_ipv4 = config.gso_ipv4;
    link_config.recv_buffer_bytes = config.socket_buffer_bytes;
    link_config.send_buffer_bytes = config.socket_buffer_bytes;
    link_config.src_ports = config.src_ports;
    let link = RoceSocket::bind(link_config)?;
    let mut engine_config = config.engine.clone();
    engine_config.udp_src_ports = link.src_ports();
    let window_budget = config.window_budget.unwrap_or_else(|| {
        let rcvbuf = link.socket_buffers().map_or(212_992, |(r, _)| r);
        (rcvbuf / 2 / (active_mtu.bytes() + 512)) as u32
    });
    let io = UdpLink::new(link, config.peer_port, config.scope_id, link_mtu);
    Ok((io, engine_config, window_budget))
}

/// A software RoCEv2 device on a link chosen at run time ([`AnyLink`](crate::link::AnyLink): the tools' `--link`).
#[cfg(all(feature = "std", target_os = "linux"))]
pub type AnyDevice = SoftDevice<crate::link::AnyLink>;

#[cfg(all(feature = "std", target_os = "linux"))]
impl AnyDevice {
    /// Opens a UDP device ([`UdpDevice::open`]) or a VFIO device ([`VfioDevice::open`]).
    ///
    /// # Errors
    /// As those.
    pub fn open(config: crate::link::any::AnyConfig) -> Result<AnyDevice, DeviceError> {
        use crate::link::any::AnyConfig;
        use crate::link::AnyLink;
        match config {
            AnyConfig::Udp(c) => {
                let (io, engine_config, window_budget) = open_udp_link(&c)?;
                let progress = c.progress;
                SoftDevice::with_link(
                    AnyLink::Udp(io),
                    AnyConfig::Udp(c),
                    engine_config,
                    progress,
                    Some(window_budget),
                )
            }
            AnyConfig::Vfio(c) => {
                let link = crate::link::vfio::VfioLink::open(&c.link)?;
                let engine = c.engine.clone();
                let progress = c.progress;
                SoftDevice::with_link(
                    AnyLink::Vfio(link),
                    AnyConfig::Vfio(c),
                    engine,
                    progress,
                    None,
                )
            }
        }
    }

    /// The UDP link's GSO / GRO state (`None` on a VFIO link).
    pub fn offloads(&self) -> Option<Offloads> {
        match &lock(&self.shared.io).link {
            crate::link::AnyLink::Udp(l) => Some(l.link().offloads()),
            crate::link::AnyLink::Vfio(_) => None,
        }
    }
}

/// A failed device operation. `Display` gives one line naming the device (its bound address).
#[derive(Debug)]
pub enum DeviceError {
    /// The socket could not be opened, bound or used (address in use, address not on this host,
    /// a socket error while receiving).
    Link(LinkError),
    /// A verb was refused (bad argument, wrong state ...): the engine's error, with its errno.
    Verbs(VerbsError),
    /// The VFIO link failed: the NIC could not be opened (not bound to vfio-pci, no IOMMU
    /// group, not a virtio-net function, ...) or driven.
    #[cfg(all(feature = "std", target_os = "linux"))]
    Vfio(crate::link::vfio::VfioError),
    /// The device was closed: no new work is accepted.
    Closed {
        /// The device's link ([`SoftDevice::name`]).
        device: String,
    },
    /// The configuration is unusable (nothing was opened).
    Config {
        /// The link asked for.
        device: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The progress thread could not be started.
    Thread {
        /// The device's link.
        device: String,
        /// The OS error.
        source: io::Error,
    },
    /// A backend-level failure of a device other than the UDP one: libibverbs.so.1 cannot be
    /// loaded, no device has the name asked for, the device could not be opened, the device
    /// is closed ([`crate::ibverbs`]).
    Backend {
        /// The device as the user named it (`verbs:rxe0`).
        device: String,
        /// What failed, with the OS's or the loader's text.
        reason: String,
    },
}

impl DeviceError {
    /// The errno a libibverbs call would have returned for a refused verb, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            DeviceError::Verbs(e) => Some(e.errno()),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Link(e) => write!(f, "UDP device: {e}"),
            DeviceError::Verbs(e) => write!(f, "{e}"),
            #[cfg(all(feature = "std", target_os = "linux"))]
            DeviceError::Vfio(e) => write!(f, "VFIO device: {e}"),
            DeviceError::Closed { device } => write!(f, "device {device}: device is closed"),
            DeviceError::Config { device, reason } => {
                write!(f, "device {device}: bad configuration: {reason}")
            }
            DeviceError::Thread { device, source } => {
                write!(f, "device {device}: cannot start progress thread: {source}")
            }
            DeviceError::Backend { device, reason } => write!(f, "device {device}: {reason}"),
        }
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DeviceError::Link(e) => Some(e),
            DeviceError::Verbs(e) => Some(e),
            #[cfg(all(feature = "std", target_os = "linux"))]
            DeviceError::Vfio(e) => Some(e),
            DeviceError::Thread { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<VerbsError> for DeviceError {
    fn from(e: VerbsError) -> Self {
        DeviceError::Verbs(e)
    }
}

impl From<LinkError> for DeviceError {
    fn from(e: LinkError) -> Self {
        DeviceError::Link(e)
    }
}

/// What the device's progress engine has done (the engine's and the link's own counters are
/// [`SoftDevice::counters`] and [`SoftDevice::link_counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Progress rounds run (by the thread or by callers).
    pub rounds: u64,
    /// Rounds run on a caller's thread right after a verb (the send fast path).
    pub inline_rounds: u64,
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
}

/// State shared by the device handle, its progress thread and callers.
pub(crate) struct Shared<L: Link> {
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

impl<L: Link> Shared<L> {
    /// Shares the window budget among the RC / UC QPs now in the engine.
    fn share_window(&self, e: &mut SoftHca) {
        let ctx = e.context();
        let qps = ctx
            .qpns()
            .filter(|&q| ctx.qp(q).is_some_and(|qp| qp.qp_type() != QpType::Ud))
            .count()
            .max(1) as u32;
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
pub struct SoftDevice<L: Link> {
    shared: Arc<Shared<L>>,
    config: L::DeviceConfig,
    gid: Gid,
    gid_index: u32,
    local: SocketAddr,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_name: Option<String>,
}

/// A software RoCEv2 device on a kernel UDP socket (see the [module docs](self)).
pub type UdpDevice = SoftDevice<UdpLink>;

impl<L: Link> fmt::Debug for SoftDevice<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftDevice")
            .field("link", &self.shared.name)
            .field("progress", &self.shared.progress)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl UdpDevice {
    /// Opens a device: binds the socket (`config.local`, `config.port`), creates the engine with
    /// the address's GID at index [`GID_INDEX`] and the port MTU from
    /// [`UdpDeviceConfig::effective_link_mtu`], and starts the progress thread
    /// ([`Progress::Thread`]).
    ///
    /// # Errors
    /// [`DeviceError::Config`] (unspecified address, batch outside 1 ..= 64, link MTU too small
    /// for the smallest RoCE MTU); [`DeviceError::Link`] from binding (`AddrInUse`,
    /// `AddrNotAvailable`: the address is not on this host); [`DeviceError::Thread`].
    pub fn open(config: UdpDeviceConfig) -> Result<UdpDevice, DeviceError> {
        let (io, engine_config, window_budget) = open_udp_link(&config)?;
        let progress = config.progress;
        SoftDevice::with_link(io, config, engine_config, progress, Some(window_budget))
    }

    /// Sends packets for peer address `ip` to UDP port `port` instead of
    /// [`UdpDeviceConfig::peer_port`] (two devices on one address, bound to two ports).
    pub fn set_peer_port(&self, ip: IpAddr, port: u16) {
        lock(&self.shared.io).link.set_peer_port(ip, port);
    }

    /// The GSO / GRO state of the socket.
    pub fn offloads(&self) -> Offloads {
        lock(&self.shared.io).link.link().offloads()
    }

    /// The UDP source ports the device sends from ([`UdpDeviceConfig::src_ports`]; the bound
    /// port alone when that is 0): a QP's packets leave from
    /// [`src_port_for`](crate::engine::src_port_for)`(ports, rocev2_src_port(qpn))`, or of its
    /// flow label's port when its address vector has one.
    pub fn src_ports(&self) -> Vec<u16> {
        lock(&self.shared.io).link.link().src_ports()
    }
}

impl<L: Link> SoftDevice<L> {
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
            sleep_until: AtomicU64::new(u64::MAX),
            counters: Mutex::new(DeviceCounters::default()),
            round_counts: progress::RoundCounts::default(),
            last_error: Mutex::new(None),
            epoch: AtomicU64::new(0),
            empty_hint: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            window_budget: window_budget.unwrap_or(u32::MAX),
            max_window,
        });
        // Linux keeps 15 bytes of a thread name: a process-wide serial number tells devices apart.
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let thread_name = format!("soft-hca#{}", SERIAL.fetch_add(1, Ordering::Relaxed));
        let thread = match progress {
            Progress::Thread => {
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
        c
    }

    /// The last socket error the progress engine met (it keeps running), if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.last_error).clone()
    }

    /// Runs `f` on the engine under its lock (diagnostics, verbs not wrapped here). Keep it
    /// short: the progress thread waits meanwhile.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> R {
        let r = self.shared.engine_op(f);
        self.kick();
        r
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
    /// [`Progress::Thread`] it only takes the engine lock for the copy.
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::poll_cq`].
    pub fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        let s = &self.shared;
        if s.progress == Progress::Caller {
            let ready = self.poll_ready(cq, out)?;
            if ready > 0 {
                return Ok(ready);
            }
            s.caller_round();
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
            Progress::Thread => {
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
        Ok(self
            .shared
            .engine_op(|e| e.req_notify_cq(cq, solicited_only))?)
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
        let (outcome, now) = self.engine_now(|e| e.modify_qp(qpn, attr, mask));
        let outcome = outcome?;
        self.shared.notify_cq_waiters();
        self.shared.kick(Some(now));
        Ok(outcome)
    }

    /// ibv_destroy_qp(3).
    ///
    /// # Errors
    /// [`DeviceError::Verbs`] as [`SoftHca::destroy_qp`].
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        let s = &self.shared;
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
            let qpns: Vec<u32> = e.context().qpns().collect();
            for qpn in qpns {
                let state = e.context().qp(qpn).map(|q| q.state());
                if matches!(state, Some(st) if st != QpState::Err) {
                    let attr = QpAttr {
                        qp_state: QpState::Err,
                        ..QpAttr::default()
                    };
                    // RESET -> ERR and every other state -> ERR are valid transitions.
                    let _ = e.modify_qp(qpn, &attr, QpAttrMask::STATE);
                }
            }
        }
        s.epoch.fetch_add(1, Ordering::Release);
        s.notify_cq_waiters();
        s.stop.store(true, Ordering::SeqCst);
        let _ = s.waker.wake();
        if let Some(handle) = thread.take() {
            let _ = handle.join();
        }
    }
}

impl<L: Link> Drop for SoftDevice<L> {
    /// As [`SoftDevice::close`].
    fn drop(&mut self) {
        self.close();
    }
}
