//! The RoCEv2 UDP socket link: carries the software HCA's packets over a kernel UDP socket.
//!
//! RoCEv2 (IBTA vol. 1 Annex A17) puts the InfiniBand transport headers (BTH and the extended
//! headers), the payload and the ICRC into the payload of a UDP datagram to port 4791. A kernel UDP
//! socket bound to a local address and that port therefore moves exactly what the transport engine
//! consumes and produces: a UDP payload plus a little IP metadata (addresses, ports, ECN, DSCP,
//! hop limit). That lets two processes, or a process and Linux's own soft-RoCE driver (rxe), talk
//! RoCEv2 with no special hardware.
//!
//! # What this socket is set up to do
//! * **One socket per device**, bound to one chosen local address (IPv4 or IPv6, never the
//!   unspecified address, since the address is the device's GID and is covered by the ICRC) and
//!   port 4791 ([`ROCEV2_PORT`]; tests use high ports). Devices on one host bind distinct
//!   addresses (127.0.0.1 and 127.0.0.2). IPv6 sockets are `IPV6_V6ONLY`.
//! * **Non-blocking**, with [`RoceSocket::wait`] (poll(2)) for a progress thread to block on when idle
//!   and a [`Waker`] to wake it.
//! * **Zero UDP checksum over IPv6 accepted** (`UDP_NO_CHECK6_RX`, udp(7)): Linux rxe sends its
//!   IPv6 packets with checksum 0 (RoCEv2 has the ICRC), which an IPv6 UDP socket otherwise drops
//!   (RFC 8200 §8.1). Sending with checksum 0 (`UDP_NO_CHECK6_TX`) is an option
//!   ([`RoceSocketConfig::zero_checksum_tx`]); it excludes GSO.
//! * **ECN and DSCP**: received ones are read from `IP_RECVTOS` / `IPV6_RECVTCLASS` control
//!   messages (ip(7), ipv6(7)), the hop limit from `IP_RECVTTL` / `IPV6_RECVHOPLIMIT`; sent ones
//!   are set per datagram with `IP_TOS` / `IPV6_TCLASS` and `IP_TTL` / `IPV6_HOPLIMIT` control
//!   messages, so DCQCN's ECT marks and CNPs can differ packet by packet.
//! * **Don't Fragment** (`IP_MTU_DISCOVER = IP_PMTUDISC_DO`, ip(7); `IPV6_MTU_DISCOVER =
//!   IPV6_PMTUDISC_DO`): RoCEv2 packets are never fragmented; a datagram above the path MTU fails
//!   with `EMSGSIZE` instead. With DF set, Linux gives every IPv4 packet of an *unconnected* socket
//!   the identification 0 (`ip_select_ident_segs`, `include/net/ip.h`: a socket without a
//!   destination and a DF packet get `iph->id = 0`), which is the value the engine assumes when
//!   it computes the ICRC (the ICRC covers the IPv4 identification). This socket is never
//!   connected. Checked on this kernel by capturing from a TUN device (see the crate's
//!   `tests/udp_link.rs`): unconnected + DF gives ident 0, connected gives a per-socket counter,
//!   no DF gives a hashed counter.
//! * **Batched I/O**: recvmmsg(2) / sendmmsg(2), up to [`RoceSocketConfig::batch`] datagrams a call.
//! * **UDP GSO** (`UDP_SEGMENT`, udp(7), Linux 4.18): several datagrams of one size (the last may
//!   be shorter) to one destination with the same ECN / DSCP / hop limit go down as one "train" in
//!   one message; the kernel (or the NIC) cuts it into datagrams. Probed at start; if a GSO send
//!   fails with `EIO` / `EINVAL` / `EOPNOTSUPP` (a device without checksum offload, a route MTU
//!   below the segment) GSO is switched off for good and the datagrams go out one by one.
//!   **IPv4 caveat:** the kernel's segmentation (`inet_gso_segment`, `net/ipv4/af_inet.c`) numbers
//!   the segments' IPv4 identification 0, 1, 2, ... from the train's first value (0): only the
//!   first carries identification 0, so a peer that checks the ICRC of the others (rxe, RoCE
//!   NICs) drops them. GSO is therefore off for IPv4 unless [`RoceSocketConfig::gso_ipv4`] says the
//!   sender accounts for that; over IPv6 (no identification) it is on by default.
//! * **UDP GRO** (`UDP_GRO`, Linux 5.0): the kernel may hand over several same-size datagrams of
//!   one flow coalesced in one buffer with a `UDP_GRO` control message giving the segment size;
//!   [`RecvBatch::iter`] splits them again. Receive buffers are then 64 KiB each.
//! * **Zero-copy gather on send**: a [`SendDatagram`] is a list of [`IoSlice`]s (header bytes,
//!   payload straight from registered memory, ICRC); the kernel gathers them, no user-space copy.
//! * **Bounded memory**: a [`RecvBatch`] is allocated once (`batch` slots of `max_payload` bytes,
//!   or of 64 KiB with GRO); sending allocates nothing per datagram (the message plans are reused
//!   and the kernel structures live on the stack of the call).
//!
//! # Fault injection
//! [`RoceSocketConfig::drop`] (the tools fill it from the environment, `ROCE_LINK_DROP_PPM`
//! datagrams per million, `ROCE_LINK_DROP_SEED`, `ROCE_LINK_DROP_DIRECTIONS`, through
//! [`crate::tools::fault`]; the link itself never reads the environment) makes the link drop a fixed share of the datagrams it receives and of those it is asked to send (or of one
//! kind only, [`DropDirections`]), chosen by a seeded generator: a lossy
//! wire for tests against a peer this project does not control (Linux rxe in a QEMU guest, where
//! the host has no netem). Dropped datagrams are counted ([`LinkCounters::rx_hook_drops`],
//! [`LinkCounters::tx_hook_drops`]); a dropped send counts as sent to the caller. GSO and GRO are
//! off while the hook is on, so that every decision is about one datagram.
//!
//! # The UDP source port
//! A UDP socket sends from its bound port. RoCEv2 lets senders vary the source port per flow so
//! that ECMP spreads QPs over paths (IBTA vol. 1 Annex A17.2.3; rxe and RoCE NICs derive it from
//! the QPN or the flow label), and the ICRC covers the UDP source port. With
//! [`RoceSocketConfig::src_ports`] = k > 0 the link opens k more sockets that only send, each bound
//! to the link's address and a port of RoCEv2's entropy range (0xC000 ..= 0xFFFF, evenly spaced;
//! when one is taken, the next free one of the range, else a free ephemeral port), and [`SendDatagram::src_port`] picks the socket a
//! datagram leaves from: the engine builds each QP's packets with one of
//! [`RoceSocket::src_ports`] ([`crate::engine::src_port_for`]). With k = 0 every datagram leaves from
//! the bound port, which the engine must then use. Datagrams keep arriving on the bound socket
//! only (peers send to port 4791); a sending socket's receive buffer is kept minimal.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roce::ipv4::Ecn;

use super::cmsg;
use crate::link::error::LinkError;
use crate::link::sys::{self, MsgPlan, RecvResult, SockAddrBuf};
use crate::link::wake::Waker;

/// The RoCEv2 UDP destination port, 4791 (IBTA vol. 1 Annex A17.2.2; IANA).
pub const ROCEV2_PORT: u16 = roce::udp::ROCEV2_PORT;

/// Default datagrams per recvmmsg(2) / sendmmsg(2) call.
pub const DEFAULT_BATCH: usize = 32;

/// Most datagrams per call ([`RoceSocketConfig::batch`] may not exceed it).
pub const MAX_BATCH: usize = sys::MAX_BATCH;

/// Default largest UDP payload received, in bytes: a 4096-byte PMTU payload plus 128 bytes for
/// BTH, extended headers, pad and ICRC (at most 12 + 28 + 3 + 4 = 47). Longer datagrams are
/// dropped and counted in [`LinkCounters::rx_truncated`].
pub const DEFAULT_MAX_PAYLOAD: usize = 4096 + 128;

/// Bytes of one receive slot when GRO is on: the largest UDP payload a coalesced buffer can
/// carry (its length must fit the 16-bit UDP length).
pub const GRO_SLOT_BYTES: usize = 65536;

/// Most extra sending sockets ([`RoceSocketConfig::src_ports`]).
pub const MAX_SRC_PORTS: usize = 64;

/// First port of RoCEv2's source-port entropy range (`roce::udp::rocev2_src_port`: 0xC000 ..=
/// 0xFFFF, RFC 6335's dynamic ports).
const ENTROPY_PORT_BASE: u16 = 0xC000;

/// Entropy ports a sending socket tries (from its preferred one on) before it takes any free
/// port: enough for 16 devices on one address whose preferred ports collide.
const ENTROPY_PORT_TRIES: u16 = 16;

/// Most datagrams in one GSO train (`UDP_MAX_SEGMENTS` of Linux 4.18 .. 6.x; newer kernels allow
/// more).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Largest UDP payload one IPv4 datagram (or GSO train) can carry: 65535 - 20 (IPv4) - 8 (UDP).
const MAX_UDP_PAYLOAD_V4: usize = 65535 - 20 - 8;

/// Largest UDP payload one IPv6 datagram (or GSO train) can carry: 65535 - 8 (UDP; the IPv6
/// payload length excludes the fixed header), less 40 bytes of room for extension headers.
const MAX_UDP_PAYLOAD_V6: usize = 65535 - 8 - 40;

/// Control-buffer bytes per received datagram: TOS/TCLASS, TTL/HOPLIMIT, UDP_GRO and SO_RXQ_OVFL
/// need 4 x 24 = 96 on 64-bit Linux.
const RECV_CONTROL: usize = 128;

/// Control-buffer bytes per sent message: TOS/TCLASS, TTL/HOPLIMIT (ints) and UDP_SEGMENT (u16),
/// 3 x 24 = 72 on 64-bit Linux.
const SEND_CONTROL: usize = 3 * cmsg::space(4);

/// The name of the network interface that holds the local IPv4 address `ip` (getifaddrs(3));
/// `None` when no interface holds it or the call fails. With it, `/sys/class/net/<name>/mtu`
/// gives the link MTU of a device bound to `ip`.
pub fn ipv4_interface(ip: std::net::Ipv4Addr) -> Option<String> {
    sys::ipv4_interface(ip).ok().flatten()
}

/// The index and name of the network interface that holds the local IPv6 address `ip`, from
/// `/proc/net/if_inet6` (proc(5): address in hex, interface index in hex, prefix length, scope,
/// flags, name); `None` when no interface holds it or procfs does not say. The index is the scope
/// id a link-local address needs; the name finds `/sys/class/net/<name>/mtu`.
pub fn ipv6_interface(ip: std::net::Ipv6Addr) -> Option<(u32, String)> {
    let want: String = ip.octets().iter().map(|b| format!("{b:02x}")).collect();
    let table = std::fs::read_to_string("/proc/net/if_inet6").ok()?;
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [addr, index, _, _, _, name, ..] if *addr == want => {
                Some((u32::from_str_radix(index, 16).ok()?, (*name).to_owned()))
            }
            _ => None,
        }
    })
}

/// How to open a [`RoceSocket`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceSocketConfig {
    /// Local address and port to bind: a specific IPv4 or IPv6 address (not `0.0.0.0` / `::`)
    /// and normally [`ROCEV2_PORT`]. Port 0 picks a free port (tests).
    pub local: SocketAddr,
    /// Datagrams per recvmmsg(2) / sendmmsg(2) call, 1 ..= [`MAX_BATCH`]. Default
    /// [`DEFAULT_BATCH`].
    pub batch: usize,
    /// Largest UDP payload to receive, bytes (without GRO; with GRO a slot is
    /// [`GRO_SLOT_BYTES`]). Default [`DEFAULT_MAX_PAYLOAD`].
    pub max_payload: usize,
    /// Use UDP GSO when the kernel has it. Default `true`.
    pub gso: bool,
    /// Also use GSO on an IPv4 link. Default `false`: the kernel numbers the IPv4 identification
    /// of the segments of a train 0, 1, 2, ... and the ICRC covers it (see the module docs).
    pub gso_ipv4: bool,
    /// Ask for UDP GRO when the kernel has it. Default `true`.
    pub gro: bool,
    /// IPv6 only: send with UDP checksum 0 (`UDP_NO_CHECK6_TX`), as rxe does. Turns GSO off (the
    /// kernel refuses GSO without checksums). Default `false`.
    pub zero_checksum_tx: bool,
    /// `SO_RCVBUF` to ask for, bytes (socket(7); the kernel doubles it and caps it at
    /// `net.core.rmem_max`). Default `None`: the system default.
    pub recv_buffer_bytes: Option<usize>,
    /// `SO_SNDBUF` to ask for, bytes (likewise capped at `net.core.wmem_max`). Default `None`.
    pub send_buffer_bytes: Option<usize>,
    /// Drop a fixed share of the datagrams, seeded (see [`DropHook`]); a hook of rate 0 drops
    /// nothing. Default `None`: [`RoceSocket::bind`] then takes it from the environment
    /// ([`crate::tools::fault::drop_hook_from_env`] reads one for the tools), which normally has none.
    pub drop: Option<DropHook>,
    /// Extra sockets that only send, 0 ..= [`MAX_SRC_PORTS`], each bound to `local`'s address
    /// and its own UDP source port, for per-QP source-port entropy (see the
    /// [module docs](self#the-udp-source-port)). Default 0: every datagram leaves from the bound
    /// port.
    pub src_ports: usize,
    /// Share the address and port with other processes of this host
    /// ([`super::share`]: `SO_REUSEPORT`, steering by destination QPN, a slot per process).
    /// Also keeps each GSO train to datagrams for one destination slot. Default `false`.
    pub share: bool,
}

/// A seeded loss generator on a link (see the [module docs](self#fault-injection)): each
/// datagram received or to be sent (as `directions` says) is dropped with probability `ppm` /
/// 1 000 000, decided by a splitmix64 sequence from `seed` (one draw per datagram of those
/// directions, in the order they happen), so a run with the same traffic drops the same
/// datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropHook {
    /// Datagrams dropped per million, 0 ..= 1 000 000.
    pub ppm: u32,
    /// Seed of the generator.
    pub seed: u64,
    /// Which datagrams it may drop.
    pub directions: DropDirections,
}

/// The datagrams a [`DropHook`] may drop.
///
/// Dropping only what is sent keeps a ping-pong against a peer that exits when it is done
/// (`ibv_rc_pingpong`) deterministic: a dropped receive can be that peer's last ACK, which
/// it never sends again once it has exited (its process is gone; the last requester's
/// retransmissions then exhaust `retry_cnt`), while every datagram this end sends is
/// retransmitted by this end or answered again by a peer still waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropDirections {
    /// Received and sent datagrams.
    Both,
    /// Only datagrams to be sent.
    Send,
    /// Only received datagrams.
    Receive,
}

/// The running state of a [`DropHook`].
#[derive(Debug, Clone)]
struct Dropper {
    ppm: u64,
    state: u64,
    directions: DropDirections,
}

impl Dropper {
    fn new(hook: DropHook) -> Dropper {
        Dropper {
            ppm: u64::from(hook.ppm),
            state: hook.seed,
            directions: hook.directions,
        }
    }

    /// Whether the next received datagram is dropped (a draw only if receives may be).
    fn drop_received(&mut self) -> bool {
        self.directions != DropDirections::Send && self.drop_next()
    }

    /// Whether the next datagram to send is dropped (a draw only if sends may be).
    fn drop_sent(&mut self) -> bool {
        self.directions != DropDirections::Receive && self.drop_next()
    }

    /// One draw: whether the next datagram is dropped (splitmix64, Steele, Lea and Flood 2014).
    fn drop_next(&mut self) -> bool {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        z % 1_000_000 < self.ppm
    }
}

impl RoceSocketConfig {
    /// The defaults for a link bound to `local`.
    pub fn new(local: SocketAddr) -> RoceSocketConfig {
        RoceSocketConfig {
            local,
            batch: DEFAULT_BATCH,
            max_payload: DEFAULT_MAX_PAYLOAD,
            gso: true,
            gso_ipv4: false,
            gro: true,
            zero_checksum_tx: false,
            recv_buffer_bytes: None,
            send_buffer_bytes: None,
            drop: None,
            src_ports: 0,
            share: false,
        }
    }
}

/// What the kernel offered when the link was opened, and what is in use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offloads {
    /// The kernel knows `UDP_SEGMENT` (Linux >= 4.18).
    pub gso_supported: bool,
    /// GSO trains are being sent: supported, asked for, allowed for the address family and not
    /// switched off by a failed GSO send.
    pub gso: bool,
    /// Most datagrams per GSO train.
    pub gso_max_segments: usize,
    /// `UDP_GRO` is on: received buffers may hold several datagrams.
    pub gro: bool,
    /// `SO_RXQ_OVFL` is on: [`LinkCounters::rx_kernel_drops`] is meaningful.
    pub rx_drop_count: bool,
}

/// What a link has done, for diagnostics. Counts are of datagrams unless said otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Datagrams delivered by [`RoceSocket::recv`] (after splitting GRO buffers).
    pub rx_datagrams: u64,
    /// UDP payload bytes delivered.
    pub rx_bytes: u64,
    /// recvmmsg(2) calls that returned at least one message.
    pub rx_calls: u64,
    /// Received buffers that held more than one datagram (GRO).
    pub rx_gro_buffers: u64,
    /// Messages dropped because they were longer than the receive slot (`MSG_TRUNC`).
    pub rx_truncated: u64,
    /// Messages dropped because their control messages did not fit (`MSG_CTRUNC`).
    pub rx_control_truncated: u64,
    /// Messages dropped because their source address was not an IP address of the link's family.
    pub rx_bad_source: u64,
    /// Datagrams received and then dropped by the [`DropHook`].
    pub rx_hook_drops: u64,
    /// Datagrams the kernel dropped for lack of receive-buffer room since the socket was opened
    /// (`SO_RXQ_OVFL`, socket(7)); the last value reported.
    pub rx_kernel_drops: u64,
    /// Datagrams a shared socket ([`RoceSocketConfig::share`]) received for another process's
    /// slot and could not forward (nobody holds the slot, its owner closed, or
    /// [`super::share::MAX_HELD_PER_OWNER`] strays for it or [`super::share::MAX_HELD_BYTES`] in
    /// all were held back already): dropped (see [`super::share`]).
    pub rx_strays: u64,
    /// Datagrams a shared socket received for another process's slot and forwarded to it.
    pub rx_forwarded: u64,
    /// Strays held back because their owner's queue was full (`net.unix.max_dgram_qlen`), each
    /// forwarded later (in `rx_forwarded`) or dropped (in `rx_strays`).
    pub rx_strays_held: u64,
    /// Datagrams that reached this process's slot socket from a process of another user:
    /// discarded ([`super::share`]).
    pub rx_forward_refused: u64,
    /// Strays not forwarded because the socket holding their slot's abstract name was made by
    /// another user (a stranger that bound a free slot's name) or its user could not be read
    /// (unix_diag, sock_diag(7)); also in [`LinkCounters::rx_strays`] ([`super::share`]).
    pub rx_strays_untrusted: u64,
    /// Times a shared socket's round read its slot socket for forwarded strays (a system call
    /// each; a polling caller's rounds read it only every few rounds: [`super::UdpLink`]).
    pub rx_slot_reads: u64,
    /// CM MADs for QP 1 that a shared socket received and that belong to another process of
    /// the address (a REQ for a service it claims, a reply naming its Communication ID,
    /// [`super::cm_route`]): forwarded like strays (also in `rx_forwarded` / `rx_strays`).
    pub rx_mads_routed: u64,
    /// Service claims of another user's processes that routing a REQ found and ignored
    /// ([`super::cm_route::lookup_service`]).
    pub rx_claims_refused: u64,
    /// Datagrams the kernel accepted for sending.
    pub tx_datagrams: u64,
    /// UDP payload bytes accepted for sending.
    pub tx_bytes: u64,
    /// sendmmsg(2) calls that sent at least one message.
    pub tx_calls: u64,
    /// GSO trains (messages of more than one datagram) sent.
    pub tx_gso_trains: u64,
    /// Times [`RoceSocket::send`] stopped because the socket buffer was full (`EAGAIN`, `ENOBUFS`).
    pub tx_full: u64,
    /// Datagrams refused (returned as [`LinkError::Send`] or [`LinkError::InvalidDatagram`]).
    pub tx_errors: u64,
    /// Datagrams the [`DropHook`] dropped instead of sending (reported to the caller as sent).
    pub tx_hook_drops: u64,
    /// Times a failed GSO send switched GSO off.
    pub gso_fallbacks: u64,
}

/// One datagram to send: its destination and IP marks, and its UDP payload as a gather list.
#[derive(Debug, Clone, Copy)]
pub struct SendDatagram<'a> {
    /// Destination address and UDP port (normally [`ROCEV2_PORT`]); same family as the link.
    pub dst: SocketAddr,
    /// The UDP source port to send from: one of [`RoceSocket::src_ports`] (or the bound port);
    /// `None` for the bound port.
    pub src_port: Option<u16>,
    /// ECN codepoint of the IP header (RFC 3168).
    pub ecn: Ecn,
    /// DSCP of the IP header, 0 ..= 63 (RFC 2474).
    pub dscp: u8,
    /// IPv4 TTL / IPv6 hop limit, 1 ..= 255; `None` for the system default (64).
    pub hop_limit: Option<u8>,
    /// The UDP payload (BTH .. ICRC), gathered in order from these slices: e.g. header bytes,
    /// payload straight from registered memory, ICRC. At most 1024 slices (`UIO_MAXIOV`).
    pub parts: &'a [IoSlice<'a>],
}

impl<'a> SendDatagram<'a> {
    /// A datagram to `dst` with no ECN, DSCP 0 and the default hop limit.
    pub fn new(dst: SocketAddr, parts: &'a [IoSlice<'a>]) -> SendDatagram<'a> {
        SendDatagram {
            dst,
            src_port: None,
            ecn: Ecn::NotEct,
            dscp: 0,
            hop_limit: None,
            parts,
        }
    }

    /// UDP payload bytes: the sum of the parts' lengths.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(|p| p.is_empty())
    }
}

/// One received datagram, borrowed from a [`RecvBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvDatagram<'a> {
    /// Source address and UDP port.
    pub src: SocketAddr,
    /// Destination address and port: the link's local address.
    pub dst: SocketAddr,
    /// ECN codepoint of the IP header (`NotEct` if the kernel did not report one).
    pub ecn: Ecn,
    /// DSCP of the IP header (0 if not reported).
    pub dscp: u8,
    /// IPv4 TTL / IPv6 hop limit, if the kernel reported it.
    pub hop_limit: Option<u8>,
    /// The UDP payload (BTH .. ICRC for RoCEv2).
    pub payload: &'a [u8],
}

/// Per-message metadata parsed after a receive.
#[derive(Debug, Clone, Copy)]
struct MsgMeta {
    /// Index of the receive slot holding the bytes.
    slot: usize,
    src: SocketAddr,
    len: usize,
    /// Segment size: the datagrams' length in a GRO buffer, else `len`.
    segment: usize,
    ecn: Ecn,
    dscp: u8,
    hop_limit: Option<u8>,
}

/// Receive buffers for [`RoceSocket::recv`]: allocated once ([`RoceSocket::new_recv_batch`]) and
/// reused; after a receive it holds the datagrams until the next one.
#[derive(Debug)]
pub struct RecvBatch {
    payload: Vec<u8>,
    slot_len: usize,
    names: Vec<SockAddrBuf>,
    control: Vec<[u8; RECV_CONTROL]>,
    results: Vec<RecvResult>,
    meta: Vec<MsgMeta>,
    datagrams: usize,
    local: SocketAddr,
}

impl RecvBatch {
    /// Buffers for `slots` messages of `slot_len` bytes each (at most [`MAX_BATCH`] messages are
    /// used).
    fn new(slots: usize, slot_len: usize, local: SocketAddr) -> RecvBatch {
        let slots = slots.clamp(1, MAX_BATCH);
        RecvBatch {
            payload: vec![0; slots * slot_len],
            slot_len,
            names: vec![SockAddrBuf::empty(); slots],
            control: vec![[0; RECV_CONTROL]; slots],
            results: vec![RecvResult::default(); slots],
            meta: Vec::with_capacity(slots),
            datagrams: 0,
            local,
        }
    }

    /// Messages one receive can take (the batch size).
    pub fn capacity(&self) -> usize {
        self.results.len()
    }

    /// Bytes of one receive slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_len
    }

    /// Datagrams held (GRO buffers counted as the datagrams they hold).
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether no datagram is held.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// The datagrams of the last receive, in arrival order, GRO buffers split into their
    /// datagrams (each `segment` bytes, the last one possibly shorter).
    pub fn iter(&self) -> RecvIter<'_> {
        RecvIter {
            batch: self,
            msg: 0,
            offset: 0,
        }
    }

    fn clear(&mut self) {
        self.meta.clear();
        self.datagrams = 0;
    }
}

impl<'a> IntoIterator for &'a RecvBatch {
    type Item = RecvDatagram<'a>;
    type IntoIter = RecvIter<'a>;

    fn into_iter(self) -> RecvIter<'a> {
        self.iter()
    }
}

/// Iterator over the datagrams of a [`RecvBatch`].
#[derive(Debug, Clone)]
pub struct RecvIter<'a> {
    batch: &'a RecvBatch,
    msg: usize,
    offset: usize,
}

impl<'a> Iterator for RecvIter<'a> {
    type Item = RecvDatagram<'a>;

    fn next(&mut self) -> Option<RecvDatagram<'a>> {
        loop {
            let m = self.batch.meta.get(self.msg)?;
            let slot = self.batch.bytes_of(m);
            if self.offset < m.len || (m.len == 0 && self.offset == 0) {
                let end = (self.offset + m.segment.max(1)).min(m.len);
                let payload = &slot[self.offset..end];
                self.offset = if m.len == 0 { 1 } else { end };
                return Some(RecvDatagram {
                    src: m.src,
                    dst: self.batch.local,
                    ecn: m.ecn,
                    dscp: m.dscp,
                    hop_limit: m.hop_limit,
                    payload,
                });
            }
            self.msg += 1;
            self.offset = 0;
        }
    }
}

impl RecvBatch {
    /// The received bytes of a message (empty if the metadata were inconsistent, which `recv`
    /// never records).
    fn bytes_of(&self, m: &MsgMeta) -> &[u8] {
        let start = m.slot * self.slot_len;
        self.payload.get(start..start + m.len).unwrap_or(&[])
    }
}

/// A RoCEv2 UDP socket: see the [module docs](self).
#[derive(Debug)]
pub struct RoceSocket {
    fd: OwnedFd,
    local: SocketAddr,
    /// The sockets that only send, one per entropy source port (empty: the bound socket sends);
    /// shared with the [`LinkPoller`]s, so that each costs one descriptor.
    senders: Arc<[Sender]>,
    /// Which socket last refused a send for a full buffer: 0 the bound one, `i + 1` sender `i`;
    /// what a writable wait watches ([`LinkPoller`] shares it).
    blocked: Arc<AtomicUsize>,
    config: RoceSocketConfig,
    offloads: Offloads,
    counters: LinkCounters,
    plans: Vec<MsgPlan<SEND_CONTROL>>,
    dropper: Option<Dropper>,
    /// The slot of a shared socket ([`RoceSocketConfig::share`]).
    claim: Option<super::share::SlotClaim>,
    /// A wait ([`RoceSocket::wait`], [`LinkPoller::wait`]) found the slot's epoll set readable
    /// (a forwarded stray, or room for strays held back) and no receive has looked since:
    /// [`RoceSocket::take_strays_ready`].
    strays_ready: Arc<AtomicBool>,
}

impl RoceSocket {
    /// Opens and binds the socket, sets its options and probes GSO and GRO.
    ///
    /// Errors: [`LinkError::Config`] for an unspecified address, a batch of 0 or above
    /// [`MAX_BATCH`], or a `max_payload` of 0 or above 65535; [`LinkError::Socket`];
    /// [`LinkError::SetOption`] naming a required option the kernel refused (GSO, GRO and
    /// `SO_RXQ_OVFL` are optional and only probed); [`LinkError::Bind`] (address in use, address
    /// not available on this host, ...).
    pub fn bind(config: RoceSocketConfig) -> Result<RoceSocket, LinkError> {
        let local = config.local;
        let bad = |reason| Err(LinkError::Config { local, reason });
        if config.drop.is_some_and(|d| d.ppm > 1_000_000) {
            return bad("drop rate above 1000000 per million");
        }
        // One drop decision per datagram: no GSO trains, no GRO buffers.
        let hooked = config.drop.is_some_and(|d| d.ppm > 0);
        if local.ip().is_unspecified() {
            return bad("the local address must be the device's own address, not 0.0.0.0 or ::");
        }
        if config.batch == 0 || config.batch > MAX_BATCH {
            return bad("batch must be 1 ..= 256 datagrams");
        }
        if config.max_payload == 0 || config.max_payload > 65535 {
            return bad("max_payload must be 1 ..= 65535 bytes");
        }
        if config.src_ports > MAX_SRC_PORTS {
            return bad("src_ports must be 0 ..= 64 sockets");
        }
        if config.zero_checksum_tx && local.is_ipv4() {
            return bad(
                "zero_checksum_tx applies to IPv6 only (IPv4 UDP checksums are optional anyway)",
            );
        }
        let ipv6 = local.is_ipv6();
        let fd = send_socket(&config, local)?;
        let set = |level, name, value, option: &'static str| {
            sys::set_int(fd.as_fd(), level, name, value).map_err(|source| LinkError::SetOption {
                local,
                option,
                source,
            })
        };
        if ipv6 {
            set(
                libc::IPPROTO_IPV6,
                libc::IPV6_RECVTCLASS,
                1,
                "IPV6_RECVTCLASS",
            )?;
            set(
                libc::IPPROTO_IPV6,
                libc::IPV6_RECVHOPLIMIT,
                1,
                "IPV6_RECVHOPLIMIT",
            )?;
            set(libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX")?;
        } else {
            set(libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS")?;
            set(libc::IPPROTO_IP, libc::IP_RECVTTL, 1, "IP_RECVTTL")?;
        }
        if let Some(bytes) = config.recv_buffer_bytes {
            let v = bytes.min(i32::MAX as usize) as i32;
            set(libc::SOL_SOCKET, libc::SO_RCVBUF, v, "SO_RCVBUF")?;
        }
        let rx_drop_count = sys::SO_RXQ_OVFL
            .is_some_and(|opt| sys::set_int(fd.as_fd(), libc::SOL_SOCKET, opt, 1).is_ok());
        // GSO probe: a default segment size of 0 ("no GSO unless a control message asks") is
        // accepted by every kernel that knows the option (udp(7) UDP_SEGMENT).
        let gso_supported = sys::set_int(fd.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
        let gro = config.gro
            && !hooked
            && sys::set_int(fd.as_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        let claim = if config.share {
            let (claim, ()) = super::share::claim_and_bind(local, |_| {
                super::share::set_reuseport(fd.as_fd())?;
                sys::bind(fd.as_fd(), &local)?;
                super::share::attach_steering(fd.as_fd())
            })
            .map_err(|source| LinkError::Bind { local, source })?;
            Some(claim)
        } else {
            sys::bind(fd.as_fd(), &local).map_err(|source| LinkError::Bind { local, source })?;
            None
        };
        let bound = sys::local_addr(fd.as_fd()).map_err(|source| LinkError::SetOption {
            local,
            option: "getsockname",
            source,
        })?;
        let gso = gso_supported
            && config.gso
            && !hooked
            && !config.zero_checksum_tx
            && (ipv6 || config.gso_ipv4);
        let senders = (0..config.src_ports)
            .map(|i| {
                // Evenly spaced over the entropy range, so that k sockets cover it as the QPs'
                // entropy values do.
                let preferred = ENTROPY_PORT_BASE + (i * 0x4000 / config.src_ports) as u16;
                Sender::open(&config, bound, preferred)
            })
            .collect::<Result<Arc<[Sender]>, _>>()?;
        Ok(RoceSocket {
            fd,
            local: bound,
            senders,
            blocked: Arc::new(AtomicUsize::new(0)),
            offloads: Offloads {
                gso_supported,
                gso,
                gso_max_segments: GSO_MAX_SEGMENTS,
                gro,
                rx_drop_count,
            },
            plans: Vec::with_capacity(config.batch),
            dropper: config.drop.filter(|d| d.ppm > 0).map(Dropper::new),
            claim,
            strays_ready: Arc::new(AtomicBool::new(true)),
            config,
            counters: LinkCounters::default(),
        })
    }

    /// Adds what stray forwarding did to [`LinkCounters::rx_strays`],
    /// [`LinkCounters::rx_forwarded`], [`LinkCounters::rx_strays_held`] and
    /// [`LinkCounters::rx_forward_refused`] (and the CM routing's [`LinkCounters::rx_mads_routed`],
    /// [`LinkCounters::rx_claims_refused`]).
    pub(crate) fn count_strays(&mut self, c: &super::share::StrayCounts) {
        self.counters.rx_strays += c.dropped;
        self.counters.rx_forwarded += c.forwarded;
        self.counters.rx_strays_held += c.held;
        self.counters.rx_forward_refused += c.refused;
        self.counters.rx_strays_untrusted += c.untrusted;
        self.counters.rx_slot_reads += c.slot_reads;
        self.counters.rx_mads_routed += c.mads_routed;
        self.counters.rx_claims_refused += c.claims_refused;
    }

    /// The slot claim of a shared socket.
    pub(crate) fn claim(&self) -> Option<&super::share::SlotClaim> {
        self.claim.as_ref()
    }

    /// Whether a wait on this socket (or its [`LinkPoller`]) saw the slot's epoll set readable
    /// since the last call: a shared link's receive then reads its slot socket at once.
    pub(crate) fn take_strays_ready(&self) -> bool {
        self.strays_ready.swap(false, Ordering::Relaxed)
    }

    /// The slot of a shared socket ([`RoceSocketConfig::share`], [`super::share`]); `None` when
    /// the socket is not shared.
    pub fn share_slot(&self) -> Option<usize> {
        self.claim.as_ref().map(|c| c.slot())
    }

    /// The bound local address and port (the port the kernel picked if the config said 0). Every
    /// datagram sent leaves from it.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The UDP source ports datagrams can leave from ([`SendDatagram::src_port`]): those of the
    /// sending sockets ([`RoceSocketConfig::src_ports`]), or the bound port alone when there are
    /// none. The engine's [`EngineConfig::udp_src_ports`](crate::engine::EngineConfig).
    pub fn src_ports(&self) -> Vec<u16> {
        if self.senders.is_empty() {
            vec![self.local.port()]
        } else {
            self.senders.iter().map(|s| s.port).collect()
        }
    }

    /// The socket datagrams from `src_port` leave through: 0 the bound one, `i + 1` sender `i`.
    fn socket_of(&self, src_port: Option<u16>) -> Option<usize> {
        match src_port {
            None => Some(0),
            Some(p) if p == self.local.port() => Some(0),
            Some(p) => self.senders.iter().position(|s| s.port == p).map(|i| i + 1),
        }
    }

    fn fd_of(&self, socket: usize) -> BorrowedFd<'_> {
        socket_fd(&self.fd, &self.senders, socket)
    }

    /// The configuration the link was opened with.
    pub fn config(&self) -> &RoceSocketConfig {
        &self.config
    }

    /// The GSO / GRO state.
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// The counters so far.
    pub fn counters(&self) -> &LinkCounters {
        &self.counters
    }

    /// The kernel's receive and send buffer sizes, bytes (`SO_RCVBUF`, `SO_SNDBUF` read back:
    /// twice what was asked for, capped by `net.core.rmem_max` / `wmem_max`, socket(7)).
    ///
    /// Errors: [`LinkError::SetOption`] naming the option if getsockopt(2) fails.
    pub fn socket_buffers(&self) -> Result<(usize, usize), LinkError> {
        let get = |name, option| {
            sys::get_int(self.fd.as_fd(), libc::SOL_SOCKET, name)
                .map(|v| v.max(0) as usize)
                .map_err(|source| LinkError::SetOption {
                    local: self.local,
                    option,
                    source,
                })
        };
        Ok((
            get(libc::SO_RCVBUF, "SO_RCVBUF")?,
            get(libc::SO_SNDBUF, "SO_SNDBUF")?,
        ))
    }

    /// Receive buffers sized for this link: [`RoceSocketConfig::batch`] slots of
    /// [`RoceSocketConfig::max_payload`] bytes, or of [`GRO_SLOT_BYTES`] when GRO is on (with GRO
    /// a smaller slot would truncate coalesced buffers, losing their datagrams).
    pub fn new_recv_batch(&self) -> RecvBatch {
        let slot = if self.offloads.gro {
            GRO_SLOT_BYTES
        } else {
            self.config.max_payload
        };
        RecvBatch::new(self.config.batch, slot, self.local)
    }

    /// As [`RoceSocket::new_recv_batch`] with `slots` slots (1 ..= [`MAX_BATCH`]): a small batch
    /// costs less to prepare, for a caller that polls an idle socket in a loop.
    pub fn new_recv_batch_of(&self, slots: usize) -> RecvBatch {
        let slot = if self.offloads.gro {
            GRO_SLOT_BYTES
        } else {
            self.config.max_payload
        };
        RecvBatch::new(slots.clamp(1, MAX_BATCH), slot, self.local)
    }

    /// Receives what is waiting, without blocking: one recvmmsg(2) call (recvmsg(2) for a
    /// one-slot batch) of up to `batch.capacity()` messages. Returns the number of datagrams
    /// now in `batch` (GRO buffers split); 0 when nothing was waiting. The previous contents of `batch` are discarded.
    /// Messages longer than a slot, with truncated control data or from a non-IP source are
    /// dropped and counted.
    ///
    /// Errors: [`LinkError::Recv`] for a socket error (`EAGAIN` and `EINTR` are not errors).
    pub fn recv(&mut self, batch: &mut RecvBatch) -> Result<usize, LinkError> {
        batch.clear();
        batch.local = self.local;
        let RecvBatch {
            payload,
            slot_len,
            names,
            control,
            results,
            ..
        } = batch;
        let n = sys::recv_batch(self.fd.as_fd(), payload, *slot_len, names, control, results)
            .map_err(|source| LinkError::Recv {
                local: self.local,
                source,
            })?;
        if n == 0 {
            return Ok(0);
        }
        self.counters.rx_calls += 1;
        for i in 0..n {
            let r = batch.results[i];
            if r.flags & libc::MSG_TRUNC != 0 || r.len > batch.slot_len {
                self.counters.rx_truncated += 1;
                continue;
            }
            if r.flags & libc::MSG_CTRUNC != 0 {
                self.counters.rx_control_truncated += 1;
                continue;
            }
            let Some(src) = batch.names[i]
                .socket_addr()
                .filter(|s| s.is_ipv6() == self.local.is_ipv6())
            else {
                self.counters.rx_bad_source += 1;
                continue;
            };
            let c = parse_control(&batch.control[i][..r.control_len]);
            if let Some(drops) = c.drops {
                self.counters.rx_kernel_drops = u64::from(drops);
            }
            if self.dropper.as_mut().is_some_and(Dropper::drop_received) {
                self.counters.rx_hook_drops += 1;
                continue;
            }
            let segment = match c.gro_segment {
                Some(s) if s > 0 && s < r.len => s,
                _ => r.len,
            };
            let count = if r.len == 0 {
                1
            } else {
                r.len.div_ceil(segment)
            };
            if count > 1 {
                self.counters.rx_gro_buffers += 1;
            }
            batch.datagrams += count;
            self.counters.rx_datagrams += count as u64;
            self.counters.rx_bytes += r.len as u64;
            batch.meta.push(MsgMeta {
                slot: i,
                src,
                len: r.len,
                segment,
                ecn: Ecn::from_bits(c.tos),
                dscp: c.tos >> 2,
                hop_limit: c.hop_limit,
            });
        }
        Ok(batch.datagrams)
    }

    /// Sends `dgrams` in order, without blocking, in sendmmsg(2) calls of up to
    /// [`RoceSocketConfig::batch`] messages, grouping runs of datagrams into GSO trains where
    /// [`Offloads::gso`] allows (same destination, ECN, DSCP and hop limit, equal lengths but a
    /// shorter last one). Returns how many datagrams (from the front) the kernel accepted: fewer
    /// than `dgrams.len()` when the socket buffer filled up (wait for
    /// [`Readiness::writable`] and send the rest).
    ///
    /// Errors (the datagrams before `index` were sent, datagram `index` was not and should be
    /// dropped, the rest were not tried): [`LinkError::InvalidDatagram`] for a datagram of the
    /// wrong address family, port 0, DSCP above 63, hop limit 0, more than 1024 parts or a payload
    /// above the largest UDP payload; [`LinkError::Send`] for a datagram the kernel refused
    /// (`EMSGSIZE` above the path MTU, `ENETUNREACH`, ...).
    ///
    /// With a [`DropHook`], the datagrams it drops count as sent (they are in the returned count)
    /// but never reach the socket.
    pub fn send(&mut self, dgrams: &[SendDatagram<'_>]) -> Result<usize, LinkError> {
        let mut done = 0;
        // GSO is skipped for one round after a train failed with a per-datagram error, so that
        // the error is reported on the datagram it belongs to.
        let mut gso_this_round = true;
        // The drop hook's next victim: datagrams before it go to the socket.
        let mut drop_at = self.next_tx_drop(0, dgrams.len());
        while done < dgrams.len() {
            if done == drop_at {
                self.counters.tx_hook_drops += 1;
                done += 1;
                drop_at = self.next_tx_drop(done, dgrams.len());
                continue;
            }
            if let Err(reason) = self.check(&dgrams[done]) {
                self.counters.tx_errors += 1;
                return Err(LinkError::InvalidDatagram {
                    local: self.local,
                    dst: dgrams[done].dst,
                    index: done,
                    reason,
                });
            }
            // `check` passed: the source port is one of the link's.
            let socket = self.socket_of(dgrams[done].src_port).unwrap_or(0);
            self.plan(&dgrams[..drop_at], done, gso_this_round);
            gso_this_round = true;
            let result = sys::send_batch(self.fd_of(socket), &self.plans, |d| dgrams[d].parts);
            let sent_msgs = match result {
                Ok(k) => k,
                Err(source) => {
                    let first = self.plans[0];
                    if first.count > 1 {
                        let code = source.raw_os_error();
                        if matches!(code, Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP)) {
                            // The device or route cannot do GSO: off for good.
                            self.offloads.gso = false;
                            self.counters.gso_fallbacks += 1;
                        } else {
                            gso_this_round = false;
                        }
                        continue;
                    }
                    self.counters.tx_errors += 1;
                    return Err(LinkError::Send {
                        local: self.local,
                        dst: dgrams[done].dst,
                        index: done,
                        source,
                    });
                }
            };
            if sent_msgs == 0 {
                self.counters.tx_full += 1;
                self.blocked.store(socket, Ordering::Relaxed);
                break;
            }
            self.counters.tx_calls += 1;
            for plan in &self.plans[..sent_msgs.min(self.plans.len())] {
                if plan.count > 1 {
                    self.counters.tx_gso_trains += 1;
                }
                for d in &dgrams[plan.first..plan.first + plan.count] {
                    self.counters.tx_bytes += d.len() as u64;
                }
                self.counters.tx_datagrams += plan.count as u64;
                done = plan.first + plan.count;
            }
        }
        Ok(done)
    }

    /// The first index in `from .. len` that the drop hook drops (one draw per datagram up to
    /// it), or `len` when none is (or there is no hook).
    fn next_tx_drop(&mut self, from: usize, len: usize) -> usize {
        match self.dropper.as_mut() {
            None => len,
            Some(d) => (from..len).find(|_| d.drop_sent()).unwrap_or(len),
        }
    }

    /// Checks one datagram before it is planned.
    fn check(&self, d: &SendDatagram<'_>) -> Result<(), &'static str> {
        if d.dst.is_ipv6() != self.local.is_ipv6() {
            return Err("destination address family differs from the link's");
        }
        if d.dst.port() == 0 {
            return Err("destination port 0");
        }
        if d.dscp > 63 {
            return Err("DSCP above 63");
        }
        if d.hop_limit == Some(0) {
            return Err("hop limit 0");
        }
        if d.parts.len() > sys::MAX_IOV {
            return Err("more than 1024 parts");
        }
        if self.socket_of(d.src_port).is_none() {
            return Err("source port is not one this link sends from");
        }
        if d.len() > self.max_udp_payload() {
            return Err("payload longer than the largest UDP payload");
        }
        Ok(())
    }

    fn max_udp_payload(&self) -> usize {
        if self.local.is_ipv6() {
            MAX_UDP_PAYLOAD_V6
        } else {
            MAX_UDP_PAYLOAD_V4
        }
    }

    /// How many datagrams from `dgrams[i]` on go in one message, given `iov` parts already in
    /// this call (updated): 1, or a GSO train when `gso` (same destination, ECN, DSCP and hop
    /// limit, equal lengths but a shorter last one, at most `gso_max_segments`, within the
    /// largest UDP payload). `None` when `dgrams[i]` cannot start a message in this call (it
    /// fails [`check`](Self::check), or its parts would exceed `MAX_IOV`).
    fn train(
        &self,
        dgrams: &[SendDatagram<'_>],
        i: usize,
        iov: &mut usize,
        gso: bool,
    ) -> Option<usize> {
        let first = &dgrams[i];
        if self.check(first).is_err() || *iov + first.parts.len() > sys::MAX_IOV {
            return None;
        }
        let seg = first.len();
        let mut count = 1;
        let mut total = seg;
        *iov += first.parts.len();
        if gso && seg > 0 {
            while i + count < dgrams.len() && count < self.offloads.gso_max_segments {
                let d = &dgrams[i + count];
                let len = d.len();
                if d.dst != first.dst
                    || d.src_port != first.src_port
                    || d.ecn != first.ecn
                    || d.dscp != first.dscp
                    || d.hop_limit != first.hop_limit
                    || len == 0
                    || len > seg
                    || total + len > self.max_udp_payload()
                    || *iov + d.parts.len() > sys::MAX_IOV
                    || (self.config.share && dst_slot(d) != dst_slot(first))
                    || self.check(d).is_err()
                {
                    break;
                }
                count += 1;
                total += len;
                *iov += d.parts.len();
                if len < seg {
                    break;
                }
            }
        }
        Some(count)
    }

    /// Where each datagram of `dgrams` will sit in its GSO train when [`RoceSocket::send`] sends
    /// them: `positions[i]` is 0 for a datagram that starts a message (alone or a train's first
    /// segment), 1, 2, ... for the following segments. `positions` must be as long as `dgrams`.
    ///
    /// The kernel numbers the IPv4 identification of a train's segments from the first one's,
    /// which is 0 for this unconnected socket with Don't Fragment set (see the
    /// [module docs](self)): segment `k` leaves with identification `k`. A sender whose
    /// checksum covers the identification (RoCEv2's ICRC) computes it for these values. The
    /// positions hold as long as the sends go as planned: a send that fails on a train makes the
    /// link resend its datagrams one by one (identification 0 each), and a later call that starts
    /// with the rest of an accepted batch starts on a message boundary, as planned.
    pub fn gso_positions(&self, dgrams: &[SendDatagram<'_>], positions: &mut [u16]) {
        let n = dgrams.len().min(positions.len());
        let mut i = 0;
        while i < n {
            let mut msgs = 0;
            let mut iov = 0;
            let round_start = i;
            // As `plan`: a call sends from one socket.
            while i < n
                && msgs < self.config.batch
                && dgrams[i].src_port == dgrams[round_start].src_port
            {
                match self.train(&dgrams[..n], i, &mut iov, self.offloads.gso) {
                    Some(count) => {
                        for (k, p) in positions[i..i + count].iter_mut().enumerate() {
                            *p = k as u16;
                        }
                        i += count;
                        msgs += 1;
                    }
                    None if i == round_start => {
                        // A datagram `send` refuses: reported, then skipped.
                        positions[i] = 0;
                        i += 1;
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    /// Fills `self.plans` with the messages for `dgrams[start..]`: up to `batch` messages and
    /// `MAX_IOV` parts from one source port (one socket), stopping before a datagram that fails
    /// [`check`](Self::check) (the next round reports it).
    fn plan(&mut self, dgrams: &[SendDatagram<'_>], start: usize, gso_allowed: bool) {
        self.plans.clear();
        let gso = gso_allowed && self.offloads.gso;
        let mut i = start;
        let mut iov = 0;
        while i < dgrams.len()
            && self.plans.len() < self.config.batch
            && dgrams[i].src_port == dgrams[start].src_port
        {
            let Some(count) = self.train(dgrams, i, &mut iov, gso) else {
                break;
            };
            let first = &dgrams[i];
            let seg = first.len();
            let mut control = [0u8; SEND_CONTROL];
            let mut w = cmsg::Writer::new(&mut control);
            let tos = i32::from(first.dscp << 2 | first.ecn.bits());
            let ok = if self.local.is_ipv6() {
                w.push_int(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos)
                    && first.hop_limit.is_none_or(|h| {
                        w.push_int(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, i32::from(h))
                    })
            } else {
                w.push_int(libc::IPPROTO_IP, libc::IP_TOS, tos)
                    && first
                        .hop_limit
                        .is_none_or(|h| w.push_int(libc::IPPROTO_IP, libc::IP_TTL, i32::from(h)))
            };
            let ok = ok && (count == 1 || w.push_u16(libc::SOL_UDP, libc::UDP_SEGMENT, seg as u16));
            debug_assert!(ok, "SEND_CONTROL holds three int-sized messages");
            let control_len = w.len();
            self.plans.push(MsgPlan {
                first: i,
                count,
                name: SockAddrBuf::new(&first.dst),
                control,
                control_len,
            });
            i += count;
        }
    }

    /// Blocks until the socket is readable (or writable, if `writable` is asked for), `waker` is
    /// woken, or `timeout` passes (nanosecond resolution plus the kernel's timer slack):
    /// ppoll(2) on the socket and the waker's eventfd. A woken waker is reset. A signal ends
    /// the wait early with nothing ready.
    ///
    /// Errors: [`LinkError::Poll`]; [`LinkError::Waker`] if resetting the waker fails.
    pub fn wait(
        &self,
        writable: bool,
        waker: Option<&Waker>,
        timeout: Duration,
    ) -> Result<Readiness, LinkError> {
        let out = self.fd_of(self.blocked.load(Ordering::Relaxed));
        let extra = self.claim.as_ref().map(|c| c.wait_fd());
        wait_on(
            self.fd.as_fd(),
            out,
            extra.map(|x| (x, &*self.strays_ready)),
            self.local,
            writable,
            waker,
            timeout,
        )
    }

    /// A second handle on this link's socket that can only wait for it
    /// ([`LinkPoller::wait`]): a progress thread sleeps on it while other threads keep using the
    /// link (`send` and `recv` need `&mut RoceSocket`, which a sleeping thread would otherwise
    /// hold). It duplicates the bound socket's descriptor (dup(2) with close-on-exec) and shares
    /// the sending sockets ([`RoceSocketConfig::src_ports`]) without duplicating them: the sockets
    /// stay open until both are dropped, and a poller costs one descriptor however many sending
    /// sockets the link has.
    ///
    /// Errors: [`LinkError::Socket`] when the process is out of descriptors.
    pub fn poller(&self) -> Result<LinkPoller, LinkError> {
        let fd = self.fd.try_clone().map_err(|source| LinkError::Socket {
            local: self.local,
            source,
        })?;
        let extra = match &self.claim {
            Some(c) => {
                Some(
                    c.wait_fd()
                        .try_clone_to_owned()
                        .map_err(|source| LinkError::Socket {
                            local: self.local,
                            source,
                        })?,
                )
            }
            None => None,
        };
        Ok(LinkPoller {
            fd,
            extra: extra.map(|x| (x, Arc::clone(&self.strays_ready))),
            senders: Arc::clone(&self.senders),
            blocked: Arc::clone(&self.blocked),
            local: self.local,
        })
    }
}

/// poll(2) on a link's socket (`fd`: readable), the socket that last refused a send (`out`:
/// writable, if asked for), if given a shared link's epoll set (`extra`: readable, which sets
/// its flag) and a waker's eventfd; see [`RoceSocket::wait`].
#[allow(clippy::too_many_arguments)]
fn wait_on(
    fd: BorrowedFd<'_>,
    out: BorrowedFd<'_>,
    extra: Option<(BorrowedFd<'_>, &AtomicBool)>,
    local: SocketAddr,
    writable: bool,
    waker: Option<&Waker>,
    timeout: Duration,
) -> Result<Readiness, LinkError> {
    let out_events = if writable { libc::POLLOUT } else { 0 };
    let map = |source| LinkError::Poll { local, source };
    // A shared link's epoll set (its slot socket with forwarded strays, and the forwarding
    // sockets of owners that had no room) is read along with the UDP socket; without
    // one, or without a waker, the socket's own entry stands in with no events.
    let (x, x_events) = extra.map_or((fd, 0), |(x, _)| (x, libc::POLLIN));
    let (k, k_events) = waker.map_or((fd, 0), |w| (w.as_fd(), libc::POLLIN));
    let [s, o, w, e] = sys::poll(
        [
            (fd, libc::POLLIN),
            (out, out_events),
            (k, k_events),
            (x, x_events),
        ],
        timeout,
    )
    .map_err(map)?;
    if let Some((_, ready)) = extra {
        if e & libc::POLLIN != 0 {
            ready.store(true, Ordering::Relaxed);
        }
    }
    let (sock, sent) = (s | (e & libc::POLLIN), o);
    let wake = if waker.is_some() { w } else { 0 };
    let woken = match waker {
        Some(w) if wake & libc::POLLIN != 0 => w.take()?,
        _ => false,
    };
    let failed = |revents: libc::c_short| revents & (libc::POLLERR | libc::POLLNVAL) != 0;
    Ok(Readiness {
        readable: sock & libc::POLLIN != 0,
        writable: sent & libc::POLLOUT != 0,
        woken,
        error: failed(sock) || (writable && failed(sent)),
    })
}

/// Socket number `socket` of a link: 0 the bound one (`bound`), `i + 1` sending socket `i`.
fn socket_fd<'a>(bound: &'a OwnedFd, senders: &'a [Sender], socket: usize) -> BorrowedFd<'a> {
    match socket.checked_sub(1).and_then(|i| senders.get(i)) {
        Some(s) => s.fd.as_fd(),
        None => bound.as_fd(),
    }
}

/// A socket of a [`RoceSocket`] that only sends, bound to the link's address and one entropy
/// source port ([`RoceSocketConfig::src_ports`]).
#[derive(Debug)]
struct Sender {
    fd: OwnedFd,
    port: u16,
}

/// A non-blocking UDP socket of `local`'s family with the options every socket of a link sends
/// with: `IPV6_V6ONLY`; Don't Fragment (`IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER` =
/// `PMTUDISC_DO`, which also gives every IPv4 packet identification 0: see the module docs);
/// `UDP_NO_CHECK6_TX` when [`RoceSocketConfig::zero_checksum_tx`]; `SO_SNDBUF` when
/// [`RoceSocketConfig::send_buffer_bytes`] asks. Not bound yet.
fn send_socket(config: &RoceSocketConfig, local: SocketAddr) -> Result<OwnedFd, LinkError> {
    let fd =
        sys::udp_socket(local.is_ipv6()).map_err(|source| LinkError::Socket { local, source })?;
    let set = |level, name, value, option: &'static str| {
        sys::set_int(fd.as_fd(), level, name, value).map_err(|source| LinkError::SetOption {
            local,
            option,
            source,
        })
    };
    if local.is_ipv6() {
        set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")?;
        set(
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
            "IPV6_MTU_DISCOVER",
        )?;
        if config.zero_checksum_tx {
            set(libc::SOL_UDP, libc::UDP_NO_CHECK6_TX, 1, "UDP_NO_CHECK6_TX")?;
        }
    } else {
        set(
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IP_MTU_DISCOVER",
        )?;
    }
    if let Some(bytes) = config.send_buffer_bytes {
        let v = bytes.min(i32::MAX as usize) as i32;
        set(libc::SOL_SOCKET, libc::SO_SNDBUF, v, "SO_SNDBUF")?;
    }
    Ok(fd)
}

impl Sender {
    /// Opens a sending socket with the bound socket's send-side options, bound to `bound`'s
    /// address and port `preferred`, else the first free one of the [`ENTROPY_PORT_TRIES`]
    /// entropy ports after it, else a free ephemeral port.
    fn open(
        config: &RoceSocketConfig,
        bound: SocketAddr,
        preferred: u16,
    ) -> Result<Sender, LinkError> {
        let local = bound;
        let fd = send_socket(config, local)?;
        // Nothing is sent to these ports; keep what strays there small (the kernel's minimum).
        sys::set_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 1).map_err(|source| {
            LinkError::SetOption {
                local,
                option: "SO_RCVBUF",
                source,
            }
        })?;
        // The preferred port, else the next ones of the entropy range (a second device on the
        // same address holds the first choices), else any free port.
        let mut want = local;
        let bound = (0..ENTROPY_PORT_TRIES).any(|k| {
            want.set_port(ENTROPY_PORT_BASE | (preferred.wrapping_add(k) & 0x3FFF));
            sys::bind(fd.as_fd(), &want).is_ok()
        });
        if !bound {
            want.set_port(0);
            sys::bind(fd.as_fd(), &want).map_err(|source| LinkError::Bind {
                local: want,
                source,
            })?;
        }
        let port = sys::local_addr(fd.as_fd())
            .map_err(|source| LinkError::SetOption {
                local,
                option: "getsockname",
                source,
            })?
            .port();
        Ok(Sender { fd, port })
    }
}

/// The destination slot ([`super::share::slot_of_qpn`]) of a datagram whose first part starts
/// with its BTH; slot 0 when it is too short.
fn dst_slot(d: &SendDatagram<'_>) -> usize {
    match d.parts.first().and_then(|p| p.get(5..8)) {
        Some(q) => super::share::slot_of_qpn(u32::from_be_bytes([0, q[0], q[1], q[2]])),
        None => 0,
    }
}

/// A duplicate of a [`RoceSocket`]'s socket descriptor that can only wait for it: see
/// [`RoceSocket::poller`].
#[derive(Debug)]
pub struct LinkPoller {
    fd: OwnedFd,
    /// A duplicate of a shared link's epoll descriptor over its slot socket and forwarding
    /// sockets ([`super::share::SlotClaim::wait_fd`]), and the link's flag that a wait saw it
    /// readable ([`RoceSocket::take_strays_ready`]).
    extra: Option<(OwnedFd, Arc<AtomicBool>)>,
    senders: Arc<[Sender]>,
    blocked: Arc<AtomicUsize>,
    local: SocketAddr,
}

impl LinkPoller {
    /// As [`RoceSocket::wait`], without borrowing the link.
    ///
    /// Errors: [`LinkError::Poll`]; [`LinkError::Waker`] if resetting the waker fails.
    pub fn wait(
        &self,
        writable: bool,
        waker: Option<&Waker>,
        timeout: Duration,
    ) -> Result<Readiness, LinkError> {
        let out = socket_fd(
            &self.fd,
            &self.senders,
            self.blocked.load(Ordering::Relaxed),
        );
        let extra = self.extra.as_ref().map(|(x, ready)| (x.as_fd(), &**ready));
        wait_on(
            self.fd.as_fd(),
            out,
            extra,
            self.local,
            writable,
            waker,
            timeout,
        )
    }
}

impl AsFd for RoceSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What [`RoceSocket::wait`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Datagrams are waiting: call [`RoceSocket::recv`].
    pub readable: bool,
    /// The socket buffer has room (only reported if asked for).
    pub writable: bool,
    /// The waker was woken (and has been reset).
    pub woken: bool,
    /// poll(2) reported `POLLERR` / `POLLNVAL` on the socket.
    pub error: bool,
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RecvControl {
    /// IPv4 TOS / IPv6 Traffic Class byte (DSCP << 2 | ECN).
    tos: u8,
    hop_limit: Option<u8>,
    gro_segment: Option<usize>,
    drops: Option<u32>,
}

/// Parses the control messages of a received datagram (ip(7) `IP_TOS`, `IP_TTL`; ipv6(7)
/// `IPV6_TCLASS`, `IPV6_HOPLIMIT`; udp(7) `UDP_GRO`; socket(7) `SO_RXQ_OVFL`). Unknown or
/// malformed messages are ignored.
fn parse_control(buf: &[u8]) -> RecvControl {
    let mut c = RecvControl::default();
    for m in cmsg::Iter::new(buf) {
        match (m.level, m.ty) {
            (libc::IPPROTO_IP, libc::IP_TOS) => c.tos = m.byte_or_int().unwrap_or(0),
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => c.tos = m.byte_or_int().unwrap_or(0),
            (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                c.hop_limit = m.int().and_then(|v| u8::try_from(v).ok())
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                c.gro_segment = m.int().and_then(|v| usize::try_from(v).ok())
            }
            (libc::SOL_SOCKET, ty) if Some(ty) == sys::SO_RXQ_OVFL => {
                c.drops = m.int().map(|v| v as u32)
            }
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_control_reads_marks_gro_and_drops() {
        let mut buf = [0u8; RECV_CONTROL];
        let mut w = cmsg::Writer::new(&mut buf);
        assert!(w.push(libc::IPPROTO_IP, libc::IP_TOS, &[0xb9])); // DSCP 46 (EF), ECT(1)
        assert!(w.push_int(libc::IPPROTO_IP, libc::IP_TTL, 63));
        assert!(w.push_int(libc::SOL_UDP, libc::UDP_GRO, 1100));
        assert!(w.push_int(libc::SOL_SOCKET, sys::SO_RXQ_OVFL.unwrap(), 7));
        let n = w.len();
        let c = parse_control(&buf[..n]);
        assert_eq!(
            c,
            RecvControl {
                tos: 0xb9,
                hop_limit: Some(63),
                gro_segment: Some(1100),
                drops: Some(7)
            }
        );
        assert_eq!(Ecn::from_bits(c.tos), Ecn::Ect1);
        assert_eq!(c.tos >> 2, 46);
    }

    #[test]
    fn parse_control_ipv6_and_garbage() {
        let mut buf = [0u8; RECV_CONTROL];
        let mut w = cmsg::Writer::new(&mut buf);
        assert!(w.push_int(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, 0x03));
        assert!(w.push_int(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, 255));
        assert!(w.push_int(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT + 100, 1)); // unknown
        let n = w.len();
        let c = parse_control(&buf[..n]);
        assert_eq!((Ecn::from_bits(c.tos), c.hop_limit), (Ecn::Ce, Some(255)));
        // A negative hop limit or GRO size is ignored rather than wrapped.
        let mut buf = [0u8; 64];
        let mut w = cmsg::Writer::new(&mut buf);
        assert!(w.push_int(libc::IPPROTO_IP, libc::IP_TTL, -1));
        assert!(w.push_int(libc::SOL_UDP, libc::UDP_GRO, -5));
        let n = w.len();
        assert_eq!(parse_control(&buf[..n]), RecvControl::default());
    }

    #[test]
    fn config_is_checked_before_any_syscall() {
        let mut c = RoceSocketConfig::new("0.0.0.0:4791".parse().unwrap());
        assert!(matches!(
            RoceSocket::bind(c.clone()),
            Err(LinkError::Config { .. })
        ));
        c.local = "127.0.0.1:0".parse().unwrap();
        c.batch = 0;
        assert!(matches!(
            RoceSocket::bind(c.clone()),
            Err(LinkError::Config { .. })
        ));
        c.batch = MAX_BATCH + 1;
        assert!(matches!(
            RoceSocket::bind(c.clone()),
            Err(LinkError::Config { .. })
        ));
        c.batch = 4;
        c.max_payload = 70000;
        assert!(matches!(
            RoceSocket::bind(c.clone()),
            Err(LinkError::Config { .. })
        ));
        c.max_payload = 100;
        c.zero_checksum_tx = true;
        let e = RoceSocket::bind(c).unwrap_err();
        assert!(e.to_string().contains("IPv6 only"), "{e}");
    }
}
