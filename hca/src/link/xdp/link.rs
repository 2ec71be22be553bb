//! [`XdpLink`]: the AF_XDP socket, its rings and the XDP program, as a [`Link`].

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpu_p2p::Memory;

use roce::Gid;

use crate::engine::{Datagram, Instant, SoftHca};
use crate::link::vfio::frame::{self, Ignored, LocalAddrs, Received};
use crate::link::{FlushReport, Link, LinkWait, RecvState, Waker};
use crate::verbs::device::Device;
use crate::verbs::gid::{GidEntry, GidType};

use super::neigh::KernelNeighbours;
use super::program::{self, AttachMode, Attached};
use super::sys::{self, BindMode, Xsk};
use super::umem::{ChunkAllocator, UmemMemory};

/// Bytes of one UMEM frame (one packet), the page size (af_xdp.rst: aligned chunk mode).
pub const FRAME_SIZE: usize = 4096;
/// Frames in the UMEM (16 MiB).
pub const FRAMES: usize = 4096;
/// Entries of each of the four rings (a power of two).
pub const RING_SIZE: u32 = 2048;
/// Frames given to the fill ring for receiving; the other `FRAMES - RX_FRAMES` are for sending.
pub const RX_FRAMES: usize = RING_SIZE as usize;
/// Where in a transmit frame the engine writes the UDP payload: room for the largest headers
/// (Ethernet 14 + IPv6 40 + UDP 8 = 62 bytes) in front of it.
pub const PAYLOAD_AT: usize = 64;
/// Bytes of one transmit slot: two UMEM chunks, so that a packet of a 4096-byte path MTU (more
/// than one chunk holds) is built contiguously and leaves as two descriptors (`XDP_USE_SG`).
pub const TX_SLOT: usize = 2 * FRAME_SIZE;
/// Where in a transmit slot the pad and ICRC of a packet sent from MR memory go (its last
/// descriptor): the slot's last 8 bytes, after any headers.
pub const TRAILER_AT: usize = TX_SLOT - 8;
/// Default bytes of the MR arena after the packet frames ([`XdpLinkConfig::mr_arena`]).
pub const DEFAULT_MR_ARENA: usize = 32 << 20;
/// Descriptors one transmitted packet may take: headers, payload pieces (one per UMEM chunk
/// they touch) and trailer; fewer than the kernel's limit (`MAX_SKB_FRAGS` + 1 in copy mode).
const MAX_PACKET_DESCS: usize = 12;
/// Most sendto(2) wake-ups of the TX ring per flush (each takes up to 32 descriptors in copy
/// mode: 64 x 32 covers a full ring).
const MAX_KICKS: usize = 64;
/// Frames built or delivered per call.
const BATCH: usize = 64;
/// The largest IP packet a frame holds: IPv6 and UDP headers (48 bytes) in front of the
/// payload at [`PAYLOAD_AT`], up to the frame's end.
const MAX_IP_MTU: u32 = (FRAME_SIZE - PAYLOAD_AT + 48) as u32;
/// As [`MAX_IP_MTU`] for a multi-buffer socket: up to the transmit slot's trailer, which a
/// received chain's reassembly buffer ([`MAX_RX_FRAME`]) also holds.
const MAX_IP_MTU_SG: u32 = (TRAILER_AT - PAYLOAD_AT + 48) as u32;
/// Longest received frame (Ethernet header on) reassembled from a chain of descriptors.
const MAX_RX_FRAME: usize = TX_SLOT;
/// Idle rounds the progress thread spins with [`XdpLinkConfig::busy_poll`].
const BUSY_SPIN_ROUNDS: u32 = 200;

/// How to open an [`XdpLink`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct XdpLinkConfig {
    /// The network interface (`ip link` name).
    pub ifname: String,
    /// Its receive queue the socket binds to and the XDP program redirects from. Default 0
    /// (RoCEv2 must be steered there, e.g. by `ethtool -N`, on a multi-queue NIC).
    pub queue: u32,
    /// Try the driver's native XDP first (else generic mode only). Default `true`.
    pub native: bool,
    /// Ask for zero-copy mode first. Default `true`.
    pub zero_copy: bool,
    /// Busy polling: `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL` 20 µs, and a progress thread that
    /// spins before it sleeps. Pays where a core can be spent for latency. Default `false`.
    pub busy_poll: bool,
    /// Bytes of UMEM after the packet frames for MR memory ([`XdpLink::alloc_mr_memory`]),
    /// rounded up to whole frames; 0 for none. Pinned by the kernel with the rest of the UMEM
    /// while the socket lives. Default [`DEFAULT_MR_ARENA`].
    pub mr_arena: usize,
}

impl XdpLinkConfig {
    /// The defaults for interface `ifname`.
    pub fn new(ifname: &str) -> XdpLinkConfig {
        XdpLinkConfig {
            ifname: ifname.to_owned(),
            queue: 0,
            native: true,
            zero_copy: true,
            busy_poll: false,
            mr_arena: DEFAULT_MR_ARENA,
        }
    }
}

/// What went wrong with an [`XdpLink`]. `Display` names the interface and the step.
#[derive(Debug)]
pub enum XdpError {
    /// No interface of that name (if_nametoindex(3)).
    NoSuchInterface {
        /// The name given.
        ifname: String,
    },
    /// The interface's MAC, MTU or addresses could not be read (sysfs, getifaddrs(3)), or it
    /// has no usable address.
    Interface {
        /// The interface.
        ifname: String,
        /// What is missing.
        what: String,
    },
    /// A step of setting up or running the AF_XDP socket failed.
    Socket {
        /// The interface.
        ifname: String,
        /// The step (socket option, mmap, bind, sendto ...).
        op: &'static str,
        /// The OS error (`EPERM` without `CAP_NET_RAW`, `EBUSY` for a queue with a socket).
        source: io::Error,
    },
    /// Loading or attaching the XDP program failed.
    Program {
        /// The interface.
        ifname: String,
        /// What failed.
        reason: String,
    },
    /// A frame could not be built (addresses of mixed families, payload past the frame).
    Frame {
        /// The interface.
        ifname: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// [`XdpLink::alloc_mr_memory`]: no run of free UMEM chunks that long in the MR arena
    /// ([`XdpLinkConfig::mr_arena`]), or a length of 0.
    UmemFull {
        /// The interface.
        ifname: String,
        /// Bytes asked for.
        len: usize,
        /// The longest free run, bytes.
        largest_free: usize,
    },
}

impl fmt::Display for XdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdpError::NoSuchInterface { ifname } => write!(f, "xdp:{ifname}: no such interface"),
            XdpError::Interface { ifname, what } => write!(f, "xdp:{ifname}: {what}"),
            XdpError::Socket { ifname, op, source } => {
                write!(f, "xdp:{ifname}: AF_XDP {op}: {source}")
            }
            XdpError::Program { ifname, reason } => write!(f, "xdp:{ifname}: {reason}"),
            XdpError::Frame { ifname, reason } => write!(f, "xdp:{ifname}: {reason}"),
            XdpError::UmemFull {
                ifname,
                len,
                largest_free,
            } => write!(
                f,
                "xdp:{ifname}: no {len} bytes of MR memory in the UMEM (longest free run \
                 {largest_free} bytes)"
            ),
        }
    }
}

impl std::error::Error for XdpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            XdpError::Socket { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The link's counters: frames and bytes each way, frames dropped per reason, wake-up system
/// calls, and the kernel's counters of the socket (`XDP_STATISTICS`, read when asked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpLinkCounters {
    /// Frames taken from the RX ring (a packet in a chain of descriptors counts once).
    pub rx_frames: u64,
    /// RoCEv2 datagrams handed to the engine.
    pub rx_roce: u64,
    /// Bytes of the received frames (Ethernet header on, no FCS).
    pub rx_bytes: u64,
    /// Received frames for another MAC or IP address.
    pub rx_drop_not_for_us: u64,
    /// RoCEv2 payloads handed to the engine by reference to their UMEM frame; the engine copies
    /// each into the receive buffer or MR (the one unavoidable receive copy: the frame is where
    /// the driver put it, not the MR).
    pub rx_copied: u64,
    /// Received frames with malformed or truncated headers (bad IPv4 checksum, UDP length...),
    /// and chains of descriptors longer than the link reassembles.
    pub rx_drop_malformed: u64,
    /// Received frames of a protocol the link does not serve (VLAN, other port, ARP).
    pub rx_drop_unsupported: u64,
    /// RX descriptors outside the UMEM (a kernel bug if ever non-zero).
    pub rx_drop_bad_desc: u64,
    /// Frames put on the TX ring.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Packets whose payload the engine left in MR memory inside the UMEM and that left as TX
    /// descriptors pointing at it: no CPU copy (a zero-copy driver DMAs it; in copy mode the
    /// kernel copies each descriptor into its socket buffer, as it does every frame).
    pub tx_zero_copy: u64,
    /// Packets whose payload the engine left in MR memory outside the UMEM (or, on a socket
    /// without `XDP_USE_SG`, anywhere) and that the link copied into the frame: one copy.
    /// Payloads the engine copied itself (inline, UC / UD, GPU memory) are the engine's
    /// `tx_copied_pkts`.
    pub tx_copied: u64,
    /// Packets the engine built that were dropped: no neighbour entry for the destination.
    pub tx_drop_no_neighbour: u64,
    /// Packets the engine built that were dropped: headers could not be written.
    pub tx_drop_frame: u64,
    /// Times no free frame or TX slot was left (the rest waited).
    pub tx_blocked: u64,
    /// sendto(2) wake-ups of the TX ring.
    pub tx_kicks: u64,
    /// recvfrom(2) wake-ups of the fill ring.
    pub rx_kicks: u64,
    /// Neighbour resolutions that asked the kernel.
    pub neighbour_probes: u64,
    /// Kernel: frames dropped for lack of room (`rx_dropped`).
    pub kernel_rx_dropped: u64,
    /// Kernel: frames dropped because the RX ring was full (`rx_ring_full`).
    pub kernel_rx_ring_full: u64,
    /// Kernel: times the fill ring was empty (`rx_fill_ring_empty_descs`).
    pub kernel_fill_ring_empty: u64,
    /// Kernel: invalid TX descriptors (`tx_invalid_descs`).
    pub kernel_tx_invalid: u64,
}

/// A kernel-bypass link on an AF_XDP socket; see the [module docs](super).
pub struct XdpLink {
    // Detach the program before the socket closes (fields drop in order).
    program: Attached,
    xsk: Xsk,
    config: XdpLinkConfig,
    ifindex: u32,
    me: LocalAddrs,
    mtu: u32,
    /// Free transmit frames (UMEM addresses).
    tx_free: Vec<u64>,
    /// Built descriptors not on the TX ring yet: (UMEM address, length, packet continues).
    tx_built: Vec<(u64, u32, bool)>,
    /// A received packet in several descriptors, reassembled (`XDP_PKT_CONTD` chains).
    rx_chain: Vec<u8>,
    /// The chain being received is dropped (too long): its remaining pieces are skipped.
    rx_chain_bad: bool,
    /// A chain is being received (its last descriptor not seen yet).
    rx_in_chain: bool,
    /// Free chunks of the MR arena.
    arena: Arc<Mutex<ChunkAllocator>>,
    /// Received frames to give back to the fill ring.
    recycle: Vec<u64>,
    neigh: KernelNeighbours,
    counters: XdpLinkCounters,
    epoch: std::time::Instant,
}

impl fmt::Debug for XdpLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdpLink")
            .field("ifname", &self.config.ifname)
            .field("queue", &self.config.queue)
            .field("program", &self.program)
            .field("mode", &self.xsk.mode())
            .finish_non_exhaustive()
    }
}

fn sysfs(ifname: &str, file: &str) -> Result<String, XdpError> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{file}"))
        .map(|s| s.trim().to_owned())
        .map_err(|e| XdpError::Interface {
            ifname: ifname.to_owned(),
            what: format!("reading /sys/class/net/{ifname}/{file}: {e}"),
        })
}

impl XdpLink {
    /// Opens the link: the interface's MAC, MTU and IPv4 address, the AF_XDP socket bound to
    /// [`XdpLinkConfig::queue`], its fill ring stocked, and the XDP program attached.
    ///
    /// # Errors
    /// [`XdpError::NoSuchInterface`]; [`XdpError::Interface`] (no MAC, an interface name with
    /// `/`); [`XdpError::Socket`] naming the failed step (`EPERM` without root, `EBUSY` when
    /// the queue already has a socket); [`XdpError::Program`] (not built, not loadable, not
    /// attachable: e.g. another XDP program is attached).
    pub fn open(config: &XdpLinkConfig) -> Result<XdpLink, XdpError> {
        let ifname = config.ifname.clone();
        if ifname.is_empty() || ifname.len() > 15 || ifname.contains(['/', '\0']) {
            return Err(XdpError::Interface {
                ifname,
                what: "not an interface name (1 to 15 bytes, no '/')".into(),
            });
        }
        let ifindex = sys::if_index(&ifname).ok_or_else(|| XdpError::NoSuchInterface {
            ifname: ifname.clone(),
        })?;
        let mac_text = sysfs(&ifname, "address")?;
        let mac = parse_mac(&mac_text).ok_or_else(|| XdpError::Interface {
            ifname: ifname.clone(),
            what: format!("no Ethernet MAC address ({mac_text:?})"),
        })?;
        let if_mtu: u32 = sysfs(&ifname, "mtu")?
            .parse()
            .map_err(|_| XdpError::Interface {
                ifname: ifname.clone(),
                what: "unreadable MTU".into(),
            })?;
        let ipv4 = sys::ipv4_addresses(&ifname)
            .map_err(|e| XdpError::Interface {
                ifname: ifname.clone(),
                what: format!("getifaddrs: {e}"),
            })?
            .first()
            .copied();
        let me = LocalAddrs {
            mac,
            ipv4,
            ipv6_ll: Gid::link_local_from_mac(mac).to_ipv6(),
        };
        let sock_err = |op: &'static str, source: io::Error| XdpError::Socket {
            ifname: ifname.clone(),
            op,
            source,
        };
        let arena_frames = config.mr_arena.div_ceil(FRAME_SIZE);
        let mut xsk = Xsk::open(
            ifindex,
            config.queue,
            FRAMES + arena_frames,
            FRAME_SIZE,
            RING_SIZE,
            config.zero_copy,
        )
        .map_err(|(op, e)| sock_err(op, e))?;
        if config.busy_poll {
            xsk.busy_poll(20, BATCH as u32)
                .map_err(|e| sock_err("SO_PREFER_BUSY_POLL / SO_BUSY_POLL", e))?;
        }
        let rx: Vec<u64> = (0..RX_FRAMES).map(|i| (i * FRAME_SIZE) as u64).collect();
        if xsk.fill_free() < RX_FRAMES as u32 {
            return Err(sock_err(
                "fill ring",
                io::Error::other("fill ring too small"),
            ));
        }
        xsk.fill(rx.into_iter());
        let tx_free = (RX_FRAMES * FRAME_SIZE..FRAMES * FRAME_SIZE)
            .step_by(TX_SLOT)
            .map(|a| a as u64)
            .collect();
        let max_mtu = if xsk.multi_buffer() {
            MAX_IP_MTU_SG
        } else {
            MAX_IP_MTU
        };
        let program = program::attach(ifindex, config.queue, xsk.as_fd(), config.native).map_err(
            |reason| XdpError::Program {
                ifname: ifname.clone(),
                reason,
            },
        )?;
        Ok(XdpLink {
            program,
            xsk,
            config: config.clone(),
            ifindex,
            me,
            mtu: if_mtu.min(max_mtu),
            tx_free,
            tx_built: Vec::with_capacity(FRAMES),
            rx_chain: Vec::with_capacity(MAX_RX_FRAME),
            rx_chain_bad: false,
            rx_in_chain: false,
            arena: Arc::new(Mutex::new(ChunkAllocator::new(
                FRAMES,
                arena_frames,
                FRAME_SIZE,
            ))),
            recycle: Vec::with_capacity(BATCH),
            neigh: KernelNeighbours::new(&ifname, ifindex),
            counters: XdpLinkCounters::default(),
            epoch: std::time::Instant::now(),
        })
    }

    /// `len` bytes of zero-filled MR memory inside the UMEM (whole frames from the MR arena,
    /// [`XdpLinkConfig::mr_arena`]), for an MR whose RC requests and RDMA READ responses then
    /// leave without a CPU copy: each packet is a chain of TX descriptors (`XDP_USE_SG`,
    /// `XDP_PKT_CONTD`): its headers in a packet frame, the payload where it lies in the MR, and
    /// the pad and ICRC ([`XdpLinkCounters::tx_zero_copy`]). Received payloads are copied into
    /// it by the engine as into any memory ([`XdpLinkCounters::rx_copied`]). The memory goes
    /// back to the arena when its last reference is dropped; it stays valid after the link
    /// closes.
    ///
    /// # Errors
    /// [`XdpError::UmemFull`] when no free run is that long, or `len` is 0.
    pub fn alloc_mr_memory(&self, len: usize) -> Result<Arc<dyn Memory>, XdpError> {
        UmemMemory::alloc(self.xsk.umem(), &self.arena, len)
            .map(|m| Arc::new(m) as Arc<dyn Memory>)
            .ok_or_else(|| XdpError::UmemFull {
                ifname: self.config.ifname.clone(),
                len,
                largest_free: self
                    .arena
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .largest_bytes(),
            })
    }

    /// Free bytes of the MR arena.
    pub fn mr_arena_free(&self) -> usize {
        self.arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free_bytes()
    }

    /// Whether the socket takes packets in several descriptors (`XDP_USE_SG`): needed for
    /// zero-copy transmit from MR memory.
    pub fn multi_buffer(&self) -> bool {
        self.xsk.multi_buffer()
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.config.ifname
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// How the XDP program is attached.
    pub fn attach_mode(&self) -> AttachMode {
        self.program.mode
    }

    /// Whether the socket runs zero-copy (`XDP_ZEROCOPY`) rather than copy mode.
    pub fn zero_copy(&self) -> bool {
        self.xsk.mode() == BindMode::ZeroCopy
    }

    /// The interface's IPv4 address, if it has one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.me.ipv4
    }

    /// The link's clock: the time since it opened.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Takes the slots the kernel finished sending back into the free list. Every descriptor
    /// completes: a slot's first (offset below [`PAYLOAD_AT`]) returns the slot; its others
    /// (the second chunk of a long packet, the trailer at [`TRAILER_AT`]) and payload
    /// descriptors in the MR arena return nothing (the MR owns those chunks).
    fn reclaim(&mut self) {
        let n = self.xsk.comp_available();
        let frames_end = (FRAMES * FRAME_SIZE) as u64;
        let slot = TX_SLOT as u64;
        for i in 0..n {
            let addr = self.xsk.comp_peek(i);
            if addr < frames_end && addr % slot < PAYLOAD_AT as u64 {
                self.tx_free.push(addr - addr % slot);
            }
        }
        if n > 0 {
            self.xsk.comp_release(n);
        }
    }

    fn ifname_err(&self, op: &'static str, source: io::Error) -> XdpError {
        XdpError::Socket {
            ifname: self.config.ifname.clone(),
            op,
            source,
        }
    }
}

/// Appends the descriptors of `len` bytes at UMEM address `at`, one per chunk they touch (aligned
/// mode: a descriptor stays within its chunk), to `descs[*n..]`; `false` when more than `max`
/// would be needed in all.
fn chunk_descs(
    mut at: u64,
    len: usize,
    descs: &mut [(u64, u32)],
    n: &mut usize,
    max: usize,
) -> bool {
    let mut left = len as u64;
    while left > 0 {
        let take = left.min(FRAME_SIZE as u64 - at % FRAME_SIZE as u64);
        if *n >= max.min(descs.len()) {
            return false;
        }
        descs[*n] = (at, take as u32);
        *n += 1;
        at += take;
        left -= take;
    }
    true
}

/// Queues `len` contiguous bytes at UMEM address `at` as one descriptor per chunk they touch,
/// all but the last marked as continued, the last as `more`.
fn push_chunks(built: &mut Vec<(u64, u32, bool)>, mut at: u64, len: usize, more: bool) {
    let mut left = len as u64;
    while left > 0 {
        let take = left.min(FRAME_SIZE as u64 - at % FRAME_SIZE as u64);
        left -= take;
        built.push((at, take as u32, more || left > 0));
        at += take;
    }
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    (parts.next().is_none() && mac != [0; 6]).then_some(mac)
}

/// What a progress thread sleeps on: the AF_XDP socket (readable when the RX ring has frames).
#[derive(Debug)]
pub struct XdpPoller {
    fd: OwnedFd,
    ifname: String,
}

impl LinkWait for XdpPoller {
    type Error = XdpError;

    fn wait(&self, writable: bool, waker: &Waker, timeout: Duration) -> Result<(), XdpError> {
        let err = |op, source| XdpError::Socket {
            ifname: self.ifname.clone(),
            op,
            source,
        };
        sys::wait(self.fd.as_fd(), writable, waker.as_fd(), timeout).map_err(|e| err("poll", e))?;
        waker
            .take()
            .map(|_| ())
            .map_err(|e| err("waker", io::Error::other(e.to_string())))
    }
}

impl Link for XdpLink {
    type Error = XdpError;
    type Poller = XdpPoller;
    type Counters = XdpLinkCounters;

    fn name(&self) -> String {
        format!("xdp:{}", self.config.ifname)
    }

    /// The IPv4 address if the interface has one, else the IPv6 link-local one; UDP port 4791.
    fn local_addr(&self) -> SocketAddr {
        let ip = self.me.ipv4.map_or(IpAddr::V6(self.me.ipv6_ll), IpAddr::V4);
        SocketAddr::new(ip, roce::udp::ROCEV2_PORT)
    }

    /// rxe's attributes for the MAC and MTU ([`Device::soft_roce`]: link-local GID at indexes 0
    /// and 1) and the IPv4-mapped GID of the interface's IPv4 address (RoCEv2, index 2).
    fn device(&self) -> Device {
        let mut dev = Device::soft_roce(self.me.mac, self.mtu);
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
        self.mtu
    }

    fn counters(&self) -> XdpLinkCounters {
        let mut c = self.counters;
        c.neighbour_probes = self.neigh.probes;
        if let Ok(k) = self.xsk.stats() {
            c.kernel_rx_dropped = k.rx_dropped;
            c.kernel_rx_ring_full = k.rx_ring_full;
            c.kernel_fill_ring_empty = k.rx_fill_ring_empty_descs;
            c.kernel_tx_invalid = k.tx_invalid_descs;
        }
        c
    }

    /// Reclaims sent frames, wakes the fill ring when the kernel asks, and counts the RX ring.
    fn recv(&mut self, _idle: bool) -> Result<RecvState, XdpError> {
        self.reclaim();
        if self.xsk.fill_needs_wakeup() {
            self.counters.rx_kicks += 1;
            self.xsk
                .kick_rx()
                .map_err(|e| self.ifname_err("recvfrom (fill ring wake-up)", e))?;
        }
        Ok(RecvState {
            waiting: self.xsk.rx_available() as usize,
        })
    }

    /// Hands up to a batch of received RoCEv2 frames to `f` straight from the UMEM, counts the
    /// others per reason, and gives every frame back to the fill ring.
    fn deliver<F: FnMut(&Datagram<'_>)>(&mut self, mut f: F) -> Result<usize, XdpError> {
        let n = self.xsk.rx_available().min(BATCH as u32);
        let mut delivered = 0;
        for i in 0..n {
            let (addr, len, more) = self.xsk.rx_peek(i);
            self.recycle.push(addr - addr % FRAME_SIZE as u64);
            self.counters.rx_bytes += u64::from(len);
            let Some(piece) = self.xsk.frame(addr, len as usize) else {
                self.counters.rx_drop_bad_desc += 1;
                self.rx_chain_bad |= self.rx_in_chain || more;
                self.rx_in_chain = more;
                if !more {
                    self.rx_chain.clear();
                    self.rx_chain_bad = false;
                }
                continue;
            };
            // A packet in several descriptors (longer than a frame: a multi-buffer socket) is
            // copied together (the one extra copy of such packets), up to MAX_RX_FRAME bytes.
            let chained = self.rx_in_chain || more;
            if chained {
                if self.rx_chain.len() + piece.len() > MAX_RX_FRAME {
                    self.rx_chain_bad = true;
                } else if !self.rx_chain_bad {
                    self.rx_chain.extend_from_slice(piece);
                }
                self.rx_in_chain = more;
                if more {
                    continue;
                }
            }
            self.counters.rx_frames += 1;
            if chained && std::mem::take(&mut self.rx_chain_bad) {
                self.rx_chain.clear();
                self.counters.rx_drop_malformed += 1;
                continue;
            }
            let bytes = if chained { &self.rx_chain[..] } else { piece };
            let kind = frame::classify(bytes, &self.me);
            match kind {
                Received::Roce(d) => {
                    self.counters.rx_roce += 1;
                    self.counters.rx_copied += 1;
                    delivered += 1;
                    f(&d);
                }
                Received::Ignored(Ignored::NotForUs) => self.counters.rx_drop_not_for_us += 1,
                Received::Ignored(Ignored::Malformed) => self.counters.rx_drop_malformed += 1,
                _ => self.counters.rx_drop_unsupported += 1,
            }
            if chained {
                self.rx_chain.clear();
            }
        }
        if n > 0 {
            self.xsk.rx_release(n);
            // Every recycled frame came off the fill ring, which has room for all RX frames.
            let room = self.xsk.fill_free() as usize;
            let give = self.recycle.len().min(room);
            self.xsk.fill(self.recycle.drain(..give));
            self.recycle.clear();
        }
        Ok(delivered)
    }

    fn rx_full(&self, delivered: usize) -> bool {
        delivered >= BATCH
    }

    /// Builds up to a batch of packets ([`SoftHca::poll_transmit_gather`]) in free transmit
    /// slots ([`TX_SLOT`]): the UDP payload's head at [`PAYLOAD_AT`] with the headers written in
    /// front of it; a payload the engine left in MR memory inside the UMEM as further
    /// descriptors pointing at it, then the pad and ICRC at [`TRAILER_AT`]
    /// ([`XdpLinkCounters::tx_zero_copy`]); one in other memory copied after the head
    /// ([`XdpLinkCounters::tx_copied`]). A packet longer than one chunk leaves as one descriptor
    /// per chunk it touches (aligned mode: a descriptor stays within its chunk).
    fn build(&mut self, engine: &mut SoftHca, now: Instant) -> (usize, bool) {
        self.reclaim();
        let sg = self.xsk.multi_buffer();
        // Without XDP_USE_SG a packet must fit the slot's first chunk.
        let room = if sg { TRAILER_AT } else { FRAME_SIZE };
        let mut built = 0;
        while built < BATCH {
            let Some(&addr) = self.tx_free.last() else {
                self.counters.tx_blocked += 1;
                return (built, true);
            };
            let Some(buf) = self.xsk.region_mut(addr, room) else {
                // Not reachable: free slots are UMEM chunks.
                self.tx_free.pop();
                continue;
            };
            let Some(g) = engine.poll_transmit_gather(now, &mut buf[PAYLOAD_AT..]) else {
                break;
            };
            built += 1;
            let tx = g.transmit;
            let src = match tx.dst_ip {
                IpAddr::V4(_) => self.me.ipv4.map(IpAddr::V4),
                IpAddr::V6(_) => Some(tx.src_ip),
            };
            let Some(dst_mac) = self.neigh.lookup(tx.dst_ip, src) else {
                self.counters.tx_drop_no_neighbour += 1;
                continue;
            };
            // The payload's descriptors after the head, when it is in the UMEM.
            let mut descs = [(0u64, 0u32); MAX_PACKET_DESCS];
            let mut n_descs = 0;
            let gathered = g.segment_count() > 0;
            let head_end = PAYLOAD_AT + g.head_len();
            let in_place = gathered
                && sg
                && head_end <= TRAILER_AT
                && g.segments().all(|seg| {
                    let Some(base) = seg.memory().host_ptr() else {
                        return false;
                    };
                    let ptr = base.as_ptr().as_ptr().wrapping_add(seg.offset());
                    let Some(at) = self.xsk.umem().addr_of(ptr, seg.len()) else {
                        return false;
                    };
                    chunk_descs(
                        at,
                        seg.len(),
                        &mut descs,
                        &mut n_descs,
                        MAX_PACKET_DESCS - 3,
                    )
                });
            let Some(buf) = self.xsk.region_mut(addr, TX_SLOT.min(room + 8)) else {
                continue;
            };
            if gathered && !in_place {
                // One copy: segments and trailer after the head, the packet then contiguous.
                if PAYLOAD_AT + tx.len > room {
                    self.counters.tx_drop_frame += 1;
                    continue;
                }
                let mut at = head_end;
                for seg in g.segments() {
                    let bytes = seg.bytes();
                    buf[at..at + bytes.len()].copy_from_slice(bytes);
                    at += bytes.len();
                }
                let trailer = g.trailer();
                buf[at..at + trailer.len()].copy_from_slice(trailer);
                self.counters.tx_copied += 1;
            }
            let Some(start) = frame::write_roce_headers(buf, PAYLOAD_AT, &tx, self.me.mac, dst_mac)
            else {
                self.counters.tx_drop_frame += 1;
                continue;
            };
            self.tx_free.pop();
            let first = addr + start as u64;
            if in_place {
                let trailer = g.trailer();
                buf[TRAILER_AT..TRAILER_AT + trailer.len()].copy_from_slice(trailer);
                push_chunks(&mut self.tx_built, first, head_end - start, true);
                for &(a, l) in &descs[..n_descs] {
                    self.tx_built.push((a, l, true));
                }
                self.tx_built
                    .push((addr + TRAILER_AT as u64, trailer.len() as u32, false));
                self.counters.tx_zero_copy += 1;
            } else {
                push_chunks(
                    &mut self.tx_built,
                    first,
                    PAYLOAD_AT + tx.len - start,
                    false,
                );
            }
        }
        (built, built == BATCH)
    }

    fn unsent(&self) -> usize {
        self.tx_built.len()
    }

    /// Puts the built frames on the TX ring (as many as it has room for) and wakes the kernel
    /// when it asks.
    fn flush(&mut self) -> FlushReport<XdpError> {
        let mut report = FlushReport::default();
        self.reclaim();
        if self.tx_built.is_empty() {
            return report;
        }
        let room = self.xsk.tx_free() as usize;
        // Whole packets only: up to the last descriptor that ends a packet within the room.
        let n = self.tx_built[..room.min(self.tx_built.len())]
            .iter()
            .rposition(|&(_, _, more)| !more)
            .map_or(0, |i| i + 1);
        for &(addr, len, more) in &self.tx_built[..n] {
            self.xsk.tx_push(addr, len, more);
            if !more {
                self.counters.tx_frames += 1;
            }
            self.counters.tx_bytes += u64::from(len);
        }
        self.tx_built.drain(..n);
        self.xsk.tx_publish();
        if !self.tx_built.is_empty() {
            report.blocked += 1;
            self.counters.tx_blocked += 1;
        }
        // In copy mode one sendto(2) takes at most the kernel's TX batch (32 descriptors,
        // `TX_BATCH_SIZE` of net/xdp/xsk.c, then EAGAIN): a packet sent from MR memory takes
        // three or more, so the ring is kicked until it is empty, a bounded number of times,
        // lest descriptors wait there for the next flush (a retransmission timeout later).
        for _ in 0..MAX_KICKS {
            if !self.xsk.tx_needs_wakeup() || self.xsk.tx_pending() == 0 {
                break;
            }
            self.counters.tx_kicks += 1;
            match self.xsk.kick_tx() {
                Ok(_) => {}
                Err(e) => {
                    report.error = Some(self.ifname_err("sendto (TX wake-up)", e));
                    break;
                }
            }
        }
        report
    }

    fn poller(&self) -> Result<XdpPoller, XdpError> {
        let fd = self
            .xsk
            .dup()
            .map_err(|e| self.ifname_err("dup of the socket", e))?;
        Ok(XdpPoller {
            fd,
            ifname: self.config.ifname.clone(),
        })
    }

    fn spin_rounds(&self) -> u32 {
        if self.config.busy_poll {
            BUSY_SPIN_ROUNDS
        } else {
            0
        }
    }
}
