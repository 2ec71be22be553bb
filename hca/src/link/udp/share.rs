//! Many processes, one device: every process of a host that opens a device on the same address
//! and UDP port (4791, which RoCEv2 fixes as the destination port, IBTA vol. 1 Annex A17.2.2)
//! binds its own socket with `SO_REUSEPORT`; a classic-BPF program attached to the reuseport
//! group (`SO_ATTACH_REUSEPORT_CBPF`, socket(7); unprivileged) steers each datagram to the socket
//! of the process that owns its destination QPN.
//!
//! # QPN ranges
//! The top [`SLOT_BITS`] bits of a 24-bit QPN name the process's *slot* (0 ..
//! [`MAX_SLOTS`]); the other [`RANDOM_QPN_BITS`] (19) stay random, drawn from the operating
//! system's random source as every QPN is ([`crate::verbs::random`]). QP 1 (GSI, the CM's
//! MADs) goes to slot 0: the first process that opened the device. A datagram too short to hold
//! a BTH also goes to slot 0 (its engine drops it).
//!
//! # Slots
//! A process claims the lowest free slot by binding the abstract Unix socket name
//! `soft-hca/<address>/<port>/slot<N>` (unix(7): abstract names are unique per network
//! namespace and released by the kernel when the last descriptor closes, so a process killed
//! with SIGKILL frees its slot and leaves no file behind). Claiming and binding happen while the
//! process holds the abstract name `.../join`, so processes join the reuseport group in slot
//! order.
//!
//! # The kernel's index
//! The program returns an index into the reuseport group's socket array
//! (`reuseport_select_sock` in the kernel's `net/core/sock_reuseport.c`; an index at or above the
//! group size falls back to the 4-tuple hash). A socket joins at the end of the array, so while
//! no member has left, the socket of slot `N` sits at index `N`. When a member closes,
//! `reuseport_detach_sock` moves the *last* socket into its hole: the datagrams of the last slot
//! then reach another process. Any process that receives a datagram of another slot (a *stray*)
//! forwards it, with its source address, ports, ECN, DSCP and hop limit ([`FORWARD_HEADER`]),
//! over a Unix datagram socket connected to the owner's slot name (`LinkCounters::rx_forwarded`);
//! the owner polls its slot socket (through an epoll set, `SlotClaim::wait_fd`) along with its
//! UDP socket and hands the datagram to its engine as if it had come from the wire.
//!
//! # A burst held back, never a standing queue
//! The owner's queue holds `net.unix.max_dgram_qlen` datagrams (unix(7); 10 by default, a
//! per-namespace sysctl only root changes). A send to a full queue fails with `EAGAIN`; the
//! stray, and any later one for the same owner, is then held back in order
//! (`LinkCounters::rx_strays_held`), and the connected socket joins the sender's epoll set for
//! writable, which the kernel signals once the owner has read (`unix_dgram_peer_wake_me`,
//! net/unix/af_unix.c): the sender's next round sends them. At most [`MAX_HELD_PER_OWNER`]
//! strays (what the owner reads in one round) are held per owner, and [`MAX_HELD_BYTES`] over
//! all owners: beyond that, the newest stray is dropped and counted
//! (`LinkCounters::rx_strays`), as are those whose slot nobody holds or whose owner closed; RC
//! retransmits them. The cap is what keeps a busy flow alive: the owner drains a few queues'
//! worth per scheduling round trip, so a deep backlog (it was 4 MiB, a thousand 4 KiB packets)
//! delivers each packet, retransmissions included, long after the requester's ACK timeout
//! (ibv_modify_qp(3) `timeout`: 4.096 us x 2^timeout, 67 ms at perftest's 14), and a full
//! one drops exactly the fresh retransmissions while keeping stale duplicates: the requester
//! then exhausts its retry count (`IBV_WC_RETRY_EXC_ERR`) with the responder holding all its
//! data. A short backlog keeps a burst (a GSO train, a round's batch) whole and loses, under a
//! standing overload, the tail of a go-back-N window, which RC recovers from.
//! Correctness thus never depends on the kernel's index; a moved slot costs one extra local hop
//! per datagram until the group is rebuilt (its processes reopen).
//!
//! # Who may forward, and to whom
//! The slot socket has `SO_PASSCRED`: every datagram carries its sender's credentials, checked
//! by the kernel, and one from a process of another user ID is discarded and counted
//! (`LinkCounters::rx_forward_refused`). Processes of the same user can ptrace(2) each other, so
//! they are trusted as the process itself is.
//!
//! The other way round, abstract names carry no permissions: a process of another user can bind
//! a free slot's name (it cannot join the reuseport group, whose members must share an
//! effective user ID, socket(7) `SO_REUSEPORT`) and would then receive the strays others
//! forward to that slot. So before a forwarding socket is used, the kernel is asked who made
//! the socket it is connected to (unix_diag, sock_diag(7): `UNIX_DIAG_PEER`, then
//! `UNIX_DIAG_UID` and `UNIX_DIAG_NAME`; a datagram socket has no `SO_PEERCRED`): only a socket
//! of this process's effective user ID bound to the slot's name is trusted; a stray for any
//! other is dropped and counted (`LinkCounters::rx_strays_untrusted`, also in `rx_strays`). The
//! check is made once per connection: a connected datagram socket stays tied to the socket it
//! reached, and when that owner closes, sends fail with `ECONNREFUSED` and the reconnect to the
//! slot's next holder checks again. A kernel without unix_diag (`CONFIG_UNIX_DIAG`; Debian
//! builds it as a module the kernel loads on the first request) refuses every owner: strays
//! are then dropped, so the QPs of a slot moved by an exit lose their packets, as they would
//! without forwarding.
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

pub use super::slots::{MAX_SLOTS, RANDOM_QPN_BITS, SLOT_BITS};
/// The GSI's QPN (IBTA vol. 1 section 3.9.5.1): steered to slot 0.
pub const GSI_QPN: u32 = 1;
/// Longest wait for another process's join to finish.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The slot a destination QPN belongs to (QP 1 and QP 0: slot 0).
pub fn slot_of_qpn(qpn: u32) -> usize {
    if qpn <= GSI_QPN {
        0
    } else {
        ((qpn & 0x00ff_ffff) >> RANDOM_QPN_BITS) as usize
    }
}

/// `(mask, value)`: the QPN bits a process in `slot` fixes, and their value (`qpn & mask ==
/// value`).
pub fn qpn_prefix(slot: usize) -> (u32, u32) {
    let mask = ((MAX_SLOTS as u32) - 1) << RANDOM_QPN_BITS;
    (mask, ((slot as u32) << RANDOM_QPN_BITS) & mask)
}

/// The steering program, classic BPF run by the kernel on the UDP payload of each datagram:
/// the destination QPN is BTH bytes 5..8 (IBTA vol. 1 section 9.2: opcode, flags, P_Key,
/// reserved, DestQP), so it loads the big-endian word at offset 4, keeps 24 bits and returns
/// `qpn >> RANDOM_QPN_BITS`. For QP 1 it reads the MAD after BTH and DETH (offset 20) as
/// [`super::cm_route::route_of`] does, without the service lookup: a CM reply (attribute 0x0011..=0x001A but
/// SIDR_REQ) goes to the slot in the receiver's Communication ID (data word 1; SIDR_REP: word 0,
/// the requester's Request ID), so it reaches its process even when slot 0's process has just
/// exited without forwarding it; anything else to QP 1 returns 0 (slot 0 forwards a REQ to its
/// listener). A packet too short for a load ends the program with 0 (filter.txt: an
/// out-of-bounds absolute load returns 0).
pub fn steering_program() -> [libc::sock_filter; 18] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld_w, ld_h, ld_b) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_H | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
    );
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let jgt = libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K;
    let rsh = libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K;
    let ret_a = libc::BPF_RET | libc::BPF_A;
    let cm_class = u32::from(u8::from(roce::mad::MgmtClass::CommMgmt));
    // MAD fields at UDP payload offsets: BTH 12 + DETH 8 = 20, MgmtClass at +1, AttributeID
    // at +16, the CM data at +24 (its words 0 and 1 at 44 and 48). Jump offsets count from the
    // next instruction; 17 is `ret 0`.
    [
        op(ld_w, 0, 0, 4), // 0
        op(
            libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
            0,
            0,
            0x00ff_ffff,
        ), // 1
        op(jeq, 2, 0, GSI_QPN), // 2: QP 1 -> 5
        op(rsh, 0, 0, RANDOM_QPN_BITS), // 3
        op(ret_a, 0, 0, 0), // 4
        op(ld_b, 0, 0, 21), // 5: MgmtClass
        op(jeq, 0, 10, cm_class), // 6: not CM -> 17
        op(ld_h, 0, 0, 36), // 7: AttributeID
        op(jgt, 0, 8, 0x0010), // 8: REQ or below -> 17
        op(jgt, 7, 0, 0x001A), // 9: above APR -> 17
        op(jeq, 6, 0, 0x0017), // 10: SIDR_REQ -> 17
        op(jeq, 0, 2, 0x0018), // 11: not SIDR_REP -> 14
        op(ld_w, 0, 0, 44), // 12: Request ID
        op(libc::BPF_JMP | libc::BPF_JA, 0, 0, 1), // 13: -> 15
        op(ld_w, 0, 0, 48), // 14: receiver's Comm ID
        op(rsh, 0, 0, super::cm_route::COMM_ID_RANDOM_BITS), // 15
        op(ret_a, 0, 0, 0), // 16
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0), // 17
    ]
}

/// Sets `SO_REUSEPORT` on `fd` (before bind).
pub(crate) fn set_reuseport(fd: BorrowedFd<'_>) -> io::Result<()> {
    crate::link::sys::set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
}

/// Attaches [`steering_program`] to the reuseport group of bound socket `fd`
/// (`SO_ATTACH_REUSEPORT_CBPF`, socket(7)); it replaces the group's program, which is the same
/// in every member.
pub(crate) fn attach_steering(fd: BorrowedFd<'_>) -> io::Result<()> {
    crate::link::sys::attach_reuseport_cbpf(fd, &steering_program())
}

/// Binds an abstract Unix datagram socket named `name` (unix(7)); `AddrInUse` if another
/// socket holds it.
fn bind_abstract(name: &str) -> io::Result<OwnedFd> {
    crate::link::sys::bind_abstract_unix(name.as_bytes())
}

/// The epoll(7) tag of the slot socket in [`SlotClaim::wait_fd`]; forwarding sockets are tagged
/// with their destination slot.
const SLOT_TAG: u64 = u64::MAX;

/// A process's claim on a slot of a shared address: held while this value lives (and by the
/// kernel only as long as the process does).
#[derive(Debug)]
pub struct SlotClaim {
    slot: usize,
    _name: OwnedFd,
    /// epoll(7) over the slot socket (readable) and the forwarding sockets with strays queued
    /// (writable): what a link's wait watches beside its UDP socket.
    events: OwnedFd,
}

impl SlotClaim {
    /// The slot claimed.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The slot's abstract Unix socket: strays forwarded to this process arrive on it.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self._name.as_fd()
    }

    /// An epoll descriptor that polls readable when a forwarded datagram waits on [`Self::fd`]
    /// or when an owner whose queue was full has room for the strays this process holds back
    /// ([`Forwarder`]).
    pub(crate) fn wait_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// The slot socket with `SO_PASSCRED` (so that each datagram carries its sender's
    /// credentials, unix(7)) and its epoll set.
    fn new(slot: usize, name: OwnedFd) -> io::Result<SlotClaim> {
        crate::link::sys::set_int(name.as_fd(), libc::SOL_SOCKET, libc::SO_PASSCRED, 1)?;
        let events = crate::link::sys::epoll_new()?;
        crate::link::sys::epoll_ctl(
            events.as_fd(),
            libc::EPOLL_CTL_ADD,
            name.as_fd(),
            libc::EPOLLIN as u32,
            SLOT_TAG,
        )?;
        Ok(SlotClaim {
            slot,
            _name: name,
            events,
        })
    }
}

/// Bytes before the payload of a forwarded datagram: source address (16, IPv4 as IPv4-mapped
/// IPv6), destination address (16), source port (2, big-endian), ECN, DSCP, hop limit, and a
/// flag byte (1: the addresses are IPv4).
pub const FORWARD_HEADER: usize = 38;
/// Forwarded datagrams received per round.
const FORWARD_BATCH: usize = 16;
/// Bytes of one forwarded datagram's slot: a header and the largest UDP payload.
const FORWARD_SLOT: usize = FORWARD_HEADER + 65536;
/// Bytes of strays (headers included) a process holds back, over all owners, while their queues
/// are full; beyond it strays are dropped and counted (`LinkCounters::rx_strays`). 4 MiB: room
/// for [`MAX_HELD_PER_OWNER`] 4 KiB-MTU packets for each of 31 other owners, and a bound on
/// 64 KiB datagrams.
pub const MAX_HELD_BYTES: usize = 4 << 20;
/// Strays held back for one owner while its queue is full: what the owner reads in one round
/// (its `Forwarder::recv` batch). A newer stray for it is dropped (tail drop: the oldest,
/// first-needed PSNs of a go-back-N window go through) and counted (`LinkCounters::rx_strays`).
/// A longer backlog only adds delay: see the [module docs](self).
pub const MAX_HELD_PER_OWNER: usize = FORWARD_BATCH;

/// A received datagram as forwarding carries it.
#[derive(Debug, Clone, Copy)]
pub struct Forwarded<'a> {
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address.
    pub dst: std::net::IpAddr,
    /// ECN codepoint bits, DSCP, hop limit as received.
    pub ecn: u8,
    /// DSCP.
    pub dscp: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// The UDP payload.
    pub payload: &'a [u8],
}

fn ip16(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_of(b: &[u8], v4: bool) -> std::net::IpAddr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[..16]);
    let v6 = std::net::Ipv6Addr::from(o);
    match v6.to_ipv4_mapped() {
        Some(v) if v4 => std::net::IpAddr::V4(v),
        _ => std::net::IpAddr::V6(v6),
    }
}

/// Encodes the header of a forwarded datagram.
pub fn forward_header(d: &Forwarded<'_>) -> [u8; FORWARD_HEADER] {
    let mut h = [0u8; FORWARD_HEADER];
    h[..16].copy_from_slice(&ip16(d.src.ip()));
    h[16..32].copy_from_slice(&ip16(d.dst));
    h[32..34].copy_from_slice(&d.src.port().to_be_bytes());
    h[34] = d.ecn;
    h[35] = d.dscp;
    h[36] = d.hop_limit;
    h[37] = u8::from(d.src.is_ipv4());
    h
}

/// Decodes a forwarded datagram; `None` when shorter than its header.
pub fn parse_forwarded(b: &[u8]) -> Option<Forwarded<'_>> {
    let (h, payload) = (b.get(..FORWARD_HEADER)?, &b[FORWARD_HEADER..]);
    let v4 = h[37] == 1;
    let port = u16::from_be_bytes([h[32], h[33]]);
    Some(Forwarded {
        src: SocketAddr::new(ip_of(&h[..16], v4), port),
        dst: ip_of(&h[16..32], v4),
        ecn: h[34] & 3,
        dscp: h[35] & 0x3f,
        hop_limit: h[36],
        payload,
    })
}

/// What stray forwarding did since the last [`Forwarder::take_counts`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StrayCounts {
    /// Strays dropped: nobody holds their slot, its owner closed with strays held back for it,
    /// or [`MAX_HELD_PER_OWNER`] (for its owner) or [`MAX_HELD_BYTES`] were held already.
    pub dropped: u64,
    /// Strays the owner's queue accepted (at once or after being held back).
    pub forwarded: u64,
    /// Strays held back because the owner's queue was full (each is later forwarded or dropped).
    pub held: u64,
    /// Datagrams received on the slot socket from a process of another user: discarded.
    pub refused: u64,
    /// Strays not sent because the socket holding their slot's name was made by another user
    /// (or its user could not be read): also counted in `dropped`.
    pub untrusted: u64,
    /// CM MADs for QP 1 whose owner is another process of the address
    /// ([`super::cm_route`]): forwarded to it like strays (and counted there too).
    pub mads_routed: u64,
    /// Service claims of another user's processes seen (and ignored) while routing a REQ.
    pub claims_refused: u64,
    /// Calls of [`Forwarder::recv`] (reads of the slot socket).
    pub slot_reads: u64,
}

/// The forwarding channel to one owner slot.
#[derive(Debug, Default)]
struct Peer {
    /// A Unix datagram socket connected to the owner's slot name.
    fd: Option<OwnedFd>,
    /// Strays (header and payload) waiting for room in the owner's queue, oldest first.
    held: std::collections::VecDeque<Vec<u8>>,
    /// `fd` is in the epoll set, for writable.
    watched: bool,
}

/// Stray forwarding of a shared link: strays go to their owner's slot socket, and datagrams
/// forwarded to this process are read from its own (see the [module docs](self)).
///
/// Nothing is lost for a full queue: each owner is reached through a Unix datagram socket
/// connected to its slot name, so a full queue (`net.unix.max_dgram_qlen`, which only root can
/// raise) refuses a send with `EAGAIN` and later polls that socket writable (the kernel's
/// `unix_dgram_peer_wake_me`, net/unix/af_unix.c). The refused stray and those after it for the
/// same owner are held back, in order, up to [`MAX_HELD_BYTES`], and that socket joins the
/// claim's epoll set ([`SlotClaim::wait_fd`]) so the link's wait wakes when the owner has
/// drained; [`Forwarder::recv`] sends them first.
///
/// Only the same user may inject: the slot socket has `SO_PASSCRED`, and a datagram whose
/// `SCM_CREDENTIALS` user ID is not this process's effective user ID is discarded and counted
/// ([`StrayCounts::refused`]). Processes of the same user can already ptrace(2) each other.
#[derive(Debug)]
pub(crate) struct Forwarder {
    /// The abstract names of the slots, `soft-hca/ADDR:PORT/slotN`.
    names: Vec<Vec<u8>>,
    /// The shared address and port (for [`super::cm_route::lookup_service`]).
    local: SocketAddr,
    peers: Vec<Peer>,
    held_bytes: usize,
    uid: u32,
    counts: StrayCounts,
    rx: Vec<u8>,
    lens: [usize; FORWARD_BATCH],
    count: usize,
}

impl Forwarder {
    pub(crate) fn new(local: SocketAddr) -> Forwarder {
        Forwarder {
            names: (0..MAX_SLOTS)
                .map(|s| format!("soft-hca/{local}/slot{s}").into_bytes())
                .collect(),
            local,
            peers: (0..MAX_SLOTS).map(|_| Peer::default()).collect(),
            held_bytes: 0,
            uid: crate::link::sys::effective_uid(),
            counts: StrayCounts::default(),
            rx: Vec::new(),
            lens: [0; FORWARD_BATCH],
            count: 0,
        }
    }

    /// The slot a datagram for QP 1 (UDP payload `payload`) belongs to, for a process in
    /// `own` slot ([`super::cm_route`]): a REQ or SIDR_REQ's service claimer (or, when nobody
    /// claims it, the lowest slot that runs a CM, to answer it), the slot in the Communication ID
    /// that names our side, or slot 0 (which holds QP 1) for anything else. `None` when a claim exists whose owner cannot be verified
    /// now (its listener's backlog is full): the caller drops and counts the MAD.
    pub(crate) fn gsi_owner(&mut self, own: usize, payload: &[u8]) -> Option<usize> {
        use super::cm_route::{
            lookup_cm, lookup_service, route_of, slot_of_comm_id, Lookup, MadRoute,
        };
        let owner = match route_of(payload) {
            MadRoute::Receiver => 0,
            MadRoute::CommId(id) => slot_of_comm_id(id),
            MadRoute::Service(sid) => {
                let (found, strangers) = lookup_service(self.local, sid, self.uid);
                self.counts.claims_refused += strangers;
                match found {
                    Lookup::Owner(slot) => slot,
                    Lookup::Busy => return None,
                    // The lowest slot that runs a CM answers: REJ reason 8.
                    Lookup::Unclaimed => {
                        let (cm, strangers) = lookup_cm(self.local, self.uid);
                        self.counts.claims_refused += strangers;
                        match cm {
                            Lookup::Owner(slot) => slot,
                            _ => 0,
                        }
                    }
                }
            }
        };
        if owner != own {
            self.counts.mads_routed += 1;
        }
        Some(owner)
    }

    /// The counts since the last call, reset.
    pub(crate) fn take_counts(&mut self) -> StrayCounts {
        std::mem::take(&mut self.counts)
    }

    /// Whether strays are held back for their owners (sent by the next [`Forwarder::recv`]).
    pub(crate) fn holds_any(&self) -> bool {
        self.held_bytes > 0
    }

    /// Strays held back now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.peers.iter().map(|p| p.held.len()).sum()
    }

    /// Sends datagram `d` to the process of `slot`; `claim` is this process's slot. Held back
    /// while the owner's queue is full (and behind strays already held for it); dropped and
    /// counted when nobody holds the slot, or [`MAX_HELD_PER_OWNER`] are held for it, or
    /// [`MAX_HELD_BYTES`] in all.
    pub(crate) fn forward(&mut self, claim: &SlotClaim, slot: usize, d: &Forwarded<'_>) {
        let head = forward_header(d);
        if slot >= MAX_SLOTS || slot == claim.slot() {
            self.counts.dropped += 1;
            return;
        }
        if !self.peers[slot].held.is_empty() {
            self.hold(claim, slot, &[&head, d.payload]);
            return;
        }
        // A connected socket whose owner closed fails with ECONNREFUSED: reconnect once, in case
        // a new process holds the slot.
        for _ in 0..2 {
            let Some(fd) = self.connected(slot) else {
                self.counts.dropped += 1;
                return;
            };
            match crate::link::sys::send_parts(fd, &[&head, d.payload]) {
                Ok(()) => {
                    self.counts.forwarded += 1;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.hold(claim, slot, &[&head, d.payload]);
                    return;
                }
                Err(_) => self.peers[slot].fd = None,
            }
        }
        self.counts.dropped += 1;
    }

    /// The socket connected to `slot`'s owner, connecting it first; `None` if nobody holds it
    /// or its holder is not trusted ([`owned_by`]: counted in [`StrayCounts::untrusted`]).
    fn connected(&mut self, slot: usize) -> Option<BorrowedFd<'_>> {
        let peer = &mut self.peers[slot];
        if peer.fd.is_none() {
            let fd = crate::link::sys::connect_abstract_unix(&self.names[slot]).ok()?;
            if !owned_by(fd.as_fd(), self.uid, &self.names[slot]) {
                self.counts.untrusted += 1;
                return None;
            }
            peer.fd = Some(fd);
            peer.watched = false;
        }
        peer.fd.as_ref().map(|f| f.as_fd())
    }

    /// Holds a stray for `slot` back (in order) and watches its socket for room; drops it (the
    /// newest) when [`MAX_HELD_PER_OWNER`] or [`MAX_HELD_BYTES`] are held.
    fn hold(&mut self, claim: &SlotClaim, slot: usize, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.held_bytes + len > MAX_HELD_BYTES
            || self.peers[slot].held.len() >= MAX_HELD_PER_OWNER
        {
            self.counts.dropped += 1;
            return;
        }
        let peer = &mut self.peers[slot];
        let Some(fd) = peer.fd.as_ref() else {
            self.counts.dropped += 1;
            return;
        };
        if !peer.watched {
            let added = crate::link::sys::epoll_ctl(
                claim.wait_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_fd(),
                libc::EPOLLOUT as u32,
                slot as u64,
            );
            if added.is_err() {
                // Without a wake-up the stray could wait forever: drop it, RC retransmits.
                self.counts.dropped += 1;
                return;
            }
            peer.watched = true;
        }
        peer.held.push_back(parts.concat());
        self.held_bytes += len;
        self.counts.held += 1;
    }

    /// Sends the strays held back, in order, as far as their owners' queues take them; drops
    /// those of owners that closed.
    fn send_held(&mut self, claim: &SlotClaim) {
        for slot in 0..MAX_SLOTS {
            let peer = &mut self.peers[slot];
            if peer.held.is_empty() {
                continue;
            }
            let Some(fd) = peer.fd.as_ref() else {
                continue;
            };
            let mut gone = false;
            while let Some(front) = peer.held.front() {
                match crate::link::sys::send_parts(fd.as_fd(), &[front]) {
                    Ok(()) => {
                        self.held_bytes -= front.len();
                        peer.held.pop_front();
                        self.counts.forwarded += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        gone = true;
                        break;
                    }
                }
            }
            if gone {
                let bytes: usize = peer.held.iter().map(Vec::len).sum();
                self.held_bytes -= bytes;
                self.counts.dropped += peer.held.len() as u64;
                peer.held.clear();
                // Closing the socket also removes it from the epoll set (epoll(7)).
                peer.fd = None;
                peer.watched = false;
            } else if peer.held.is_empty() && peer.watched {
                let _ = crate::link::sys::epoll_ctl(
                    claim.wait_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd.as_fd(),
                    0,
                    0,
                );
                peer.watched = false;
            }
        }
    }

    /// Sends the strays held back that now fit, then reads up to 16 forwarded datagrams from
    /// `claim`'s slot socket without blocking (discarding those of other users); how many.
    pub(crate) fn recv(&mut self, claim: &SlotClaim) -> usize {
        if self.held_bytes > 0 {
            self.send_held(claim);
        }
        self.counts.slot_reads += 1;
        if self.rx.is_empty() {
            self.rx = vec![0; FORWARD_BATCH * FORWARD_SLOT];
        }
        self.count = 0;
        // Each attempt consumes a datagram or ends the loop; the bound keeps a flood of
        // refused datagrams from holding the round.
        for _ in 0..2 * FORWARD_BATCH {
            if self.count == FORWARD_BATCH {
                break;
            }
            let i = self.count;
            let buf = &mut self.rx[i * FORWARD_SLOT..(i + 1) * FORWARD_SLOT];
            match crate::link::sys::recv_with_uid(claim.fd(), buf) {
                Ok((n, Some(uid))) if n <= FORWARD_SLOT && uid == self.uid => {
                    self.lens[i] = n;
                    self.count += 1;
                }
                Ok((n, _)) if n > FORWARD_SLOT => continue, // truncated: not one of ours
                Ok(_) => self.counts.refused += 1,
                Err(_) => break,
            }
        }
        self.count
    }

    /// The datagrams the last [`Forwarder::recv`] read.
    pub(crate) fn received(&self) -> impl Iterator<Item = Forwarded<'_>> {
        (0..self.count).filter_map(move |i| {
            parse_forwarded(&self.rx[i * FORWARD_SLOT..i * FORWARD_SLOT + self.lens[i]])
        })
    }
}

/// Whether the socket that connected Unix datagram socket `fd` reached was made by user `uid`
/// and is bound to the abstract name `name` (`UNIX_DIAG_UID` / `UNIX_DIAG_NAME`,
/// [`crate::link::sys::unix_peer_owner`]). Abstract names carry no permissions (unix(7)): a
/// process of any user can bind a free slot's name, and only the socket's creator tells a
/// sharer from a stranger. The check holds for as long as `fd` stays connected: a datagram
/// socket stays tied to the socket it connected to, so when that one closes sends fail with
/// `ECONNREFUSED` and the next connect checks again. A failed diag is a refusal.
fn owned_by(fd: BorrowedFd<'_>, uid: u32, name: &[u8]) -> bool {
    match crate::link::sys::unix_peer_owner(fd) {
        Ok((owner, bound)) => owner == uid && bound.first() == Some(&0) && bound[1..] == *name,
        Err(_) => false,
    }
}

/// Claims the lowest free slot of `local` and, while holding the join lock, runs `bind` (which
/// binds the reuseport socket), so that sockets join the group in slot order.
///
/// Errors: `AddrInUse` ("all slots taken") when [`MAX_SLOTS`] processes share `local`;
/// `TimedOut` when another process held the join lock for [`JOIN_TIMEOUT`]; `bind`'s error.
pub(crate) fn claim_and_bind<T>(
    local: SocketAddr,
    bind: impl FnOnce(usize) -> io::Result<T>,
) -> io::Result<(SlotClaim, T)> {
    let base = format!("soft-hca/{local}");
    let started = Instant::now();
    let _join = loop {
        match bind_abstract(&format!("{base}/join")) {
            Ok(fd) => break fd,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && started.elapsed() < JOIN_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("another process held {base}/join for 5 s"),
                ))
            }
            Err(e) => return Err(e),
        }
    };
    for slot in 0..MAX_SLOTS {
        match bind_abstract(&format!("{base}/slot{slot}")) {
            Ok(name) => {
                let claim = SlotClaim::new(slot, name)?;
                let bound = bind(slot)?;
                return Ok((claim, bound));
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("all {MAX_SLOTS} slots of {local} are taken"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn prefix_and_slot_agree() {
        for slot in 0..MAX_SLOTS {
            let (mask, value) = qpn_prefix(slot);
            assert_eq!(mask.count_ones(), SLOT_BITS);
            for low in [0x10u32, 0x1234, (1 << RANDOM_QPN_BITS) - 1] {
                let qpn = value | (low & !mask);
                assert_eq!(slot_of_qpn(qpn), slot, "{qpn:#x}");
            }
        }
        assert_eq!(slot_of_qpn(GSI_QPN), 0);
        assert_eq!(slot_of_qpn(0), 0);
    }

    /// A reuseport group of `n` sockets on 127.0.0.1 (a free port) with the program attached.
    fn group(n: usize) -> Option<Vec<UdpSocket>> {
        let mut socks = Vec::new();
        let mut addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for _ in 0..n {
            let fd = crate::link::sys::udp_socket(false).ok()?;
            set_reuseport(fd.as_fd()).unwrap();
            crate::link::sys::bind(fd.as_fd(), &addr).ok()?;
            addr = crate::link::sys::local_addr(fd.as_fd()).unwrap();
            attach_steering(fd.as_fd()).expect("SO_ATTACH_REUSEPORT_CBPF");
            let s = UdpSocket::from(fd);
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            socks.push(s);
        }
        Some(socks)
    }

    fn bth(qpn: u32) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[0] = 0x0a; // RC RDMA WRITE Only
        p[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
        p[4..8].copy_from_slice(&(qpn & 0x00ff_ffff).to_be_bytes());
        p[4] = 0xa5; // reserved byte: must not matter
        p
    }

    /// The kernel runs the program on crafted BTHs: each lands on the socket of its slot.
    #[test]
    fn kernel_steers_by_destination_qpn() {
        let n = 4;
        let Some(socks) = group(n) else {
            eprintln!("skip: no loopback UDP");
            return;
        };
        let to = socks[0].local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut cases = Vec::new();
        for slot in 0..n {
            let (_, value) = qpn_prefix(slot);
            cases.push((value | 0x12345, slot));
            cases.push((value | 0x10, slot));
        }
        cases.push((GSI_QPN, 0));
        for (i, (qpn, slot)) in cases.iter().enumerate() {
            let mut p = bth(*qpn).to_vec();
            p.push(i as u8);
            tx.send_to(&p, to).unwrap();
            let mut buf = [0u8; 64];
            let len = socks[*slot]
                .recv(&mut buf)
                .expect("datagram on its slot's socket");
            assert_eq!(&buf[..len], &p[..], "QPN {qpn:#x}");
        }
        // MADs to QP 1: a CM reply to the slot in the receiver's Communication ID, a SIDR_REP
        // to the one in its Request ID, a REQ and another class to slot 0.
        let mad = |class: u8, attr: u16, w0: u32, w1: u32| {
            let mut m = [0u8; roce::mad::MAD_LEN];
            m[..4].copy_from_slice(&[1, class, 2, 3]);
            m[16..18].copy_from_slice(&attr.to_be_bytes());
            m[24..28].copy_from_slice(&w0.to_be_bytes());
            m[28..32].copy_from_slice(&w1.to_be_bytes());
            let mut p = vec![0u8; 20];
            p.extend_from_slice(&m);
            p.extend_from_slice(&[0; 4]);
            p[..12].copy_from_slice(&bth(GSI_QPN));
            p
        };
        let with_slot = |low: u32, slot: usize| {
            let (mask, value) = super::super::cm_route::comm_id_prefix(slot);
            (low & !mask) | value
        };
        let mut mads = Vec::new();
        for slot in 0..n {
            for attr in [0x0011u16, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016] {
                mads.push((mad(7, attr, 0x55, with_slot(0x1234, slot)), slot));
            }
            mads.push((mad(7, 0x0018, with_slot(7, slot), 0), slot));
        }
        mads.push((mad(7, 0x0010, with_slot(1, 3), with_slot(1, 3)), 0));
        mads.push((mad(7, 0x0017, with_slot(1, 3), with_slot(1, 3)), 0));
        mads.push((mad(4, 0x0013, 0, with_slot(1, 3)), 0));
        for (i, (p, slot)) in mads.iter_mut().enumerate() {
            p.push(i as u8);
            tx.send_to(p, to).unwrap();
            let mut buf = [0u8; 512];
            let len = socks[*slot]
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("MAD {i} to slot {slot}: {e}"));
            assert_eq!(&buf[..len], &p[..], "MAD {i}");
        }
        // Nothing strayed onto another socket.
        for s in &socks {
            s.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            assert!(s.recv(&mut buf).is_err());
        }
    }

    /// Slots are exclusive while held and free once dropped.
    #[test]
    fn slots_are_claimed_in_order_and_released() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let local = SocketAddr::new(local.ip(), 40000 + (std::process::id() % 20000) as u16);
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        assert_eq!((a.slot(), b.slot()), (0, 1));
        drop(a);
        let (c, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        assert_eq!(c.slot(), 0);
    }
}

#[cfg(test)]
mod forward_tests {
    use super::*;

    #[test]
    fn forwarded_header_round_trips() {
        for (src, dst) in [
            ("10.1.2.3:49152", "10.1.2.4"),
            ("[fe80::1]:50000", "fe80::2"),
        ] {
            let d = Forwarded {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                ecn: 2,
                dscp: 26,
                hop_limit: 63,
                payload: b"BTH...",
            };
            let mut b = forward_header(&d).to_vec();
            b.extend_from_slice(d.payload);
            let e = parse_forwarded(&b).unwrap();
            assert_eq!(
                (e.src, e.dst, e.ecn, e.dscp, e.hop_limit),
                (d.src, d.dst, 2, 26, 63)
            );
            assert_eq!(e.payload, d.payload);
        }
        assert!(parse_forwarded(&[0; FORWARD_HEADER - 1]).is_none());
    }

    fn stray(payload: &[u8]) -> Forwarded<'_> {
        Forwarded {
            src: "127.0.0.9:50001".parse().unwrap(),
            dst: "127.0.0.1".parse().unwrap(),
            ecn: 1,
            dscp: 0,
            hop_limit: 64,
            payload,
        }
    }

    /// A shared address of its own per test and process (abstract names are per namespace).
    fn local(test: u16) -> SocketAddr {
        let port = 20000 + (std::process::id() % 5000) as u16 * 8 + test;
        SocketAddr::new("127.0.0.1".parse().unwrap(), port)
    }

    /// Whether `fd` polls readable within 5 s.
    fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
        let [r] = crate::link::sys::poll([(fd, libc::POLLIN)], timeout).unwrap();
        r & libc::POLLIN != 0
    }

    /// A stray sent to a held slot arrives there; to a free slot it is dropped.
    #[test]
    fn strays_reach_their_owner() {
        let local = local(0);
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let mut fa = Forwarder::new(local);
        let mut fb = Forwarder::new(local);
        let d = stray(&[7; 100]);
        fa.forward(&a, b.slot(), &d);
        fa.forward(&a, 5, &d); // slot 5 is free
        let c = fa.take_counts();
        assert_eq!((c.forwarded, c.dropped, c.held), (1, 1, 0), "{c:?}");
        assert!(readable(b.wait_fd(), Duration::from_secs(5)));
        assert_eq!(fb.recv(&b), 1);
        let got: Vec<_> = fb.received().collect();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].src, got[0].payload), (d.src, d.payload));
        assert_eq!(fb.recv(&b), 0);
        // Two reads of the slot socket, nothing else counted.
        assert_eq!(
            fb.take_counts(),
            StrayCounts {
                slot_reads: 2,
                ..StrayCounts::default()
            }
        );
    }

    /// More strays than the owner's queue holds (`net.unix.max_dgram_qlen`): the next
    /// [`MAX_HELD_PER_OWNER`] are held back, the newer ones dropped and counted (no standing
    /// backlog); the sender's wait descriptor polls readable once the owner has read, and the
    /// first ones (queued and held) all arrive, in order.
    #[test]
    fn a_full_queue_holds_a_burst_back_and_drops_the_newest() {
        let qlen: usize = std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(10);
        let n = (qlen + 40).min(2000);
        let local = local(1);
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let mut fa = Forwarder::new(local);
        let mut fb = Forwarder::new(local);
        for i in 0..n as u32 {
            fa.forward(&a, b.slot(), &stray(&i.to_be_bytes()));
        }
        let c = fa.take_counts();
        assert_eq!(
            c.held, MAX_HELD_PER_OWNER as u64,
            "the queue of {qlen} was full: {c:?}"
        );
        assert_eq!(c.forwarded + c.held + c.dropped, n as u64, "{c:?}");
        assert!(c.dropped > 0, "{n} strays exceed queue and backlog: {c:?}");
        assert_eq!(fa.held() as u64, c.held);
        // Tail drop: the first `kept` strays go through, the newest are dropped.
        let kept = (c.forwarded + c.held) as usize;
        // Nothing to read and no room yet: a's wait descriptor is quiet.
        assert!(!readable(a.wait_fd(), Duration::ZERO));
        let mut got = Vec::new();
        let mut forwarded = c.forwarded;
        for _ in 0..4 * n {
            if got.len() == kept {
                break;
            }
            let k = fb.recv(&b);
            got.extend(
                fb.received()
                    .map(|d| u32::from_be_bytes(d.payload.try_into().unwrap())),
            );
            if k > 0 && fa.held() > 0 {
                assert!(
                    readable(a.wait_fd(), Duration::from_secs(5)),
                    "the owner read: a polls readable"
                );
            }
            assert_eq!(fa.recv(&a), 0, "nothing was forwarded to a");
            let c = fa.take_counts();
            assert_eq!(c.dropped, 0, "{c:?}");
            forwarded += c.forwarded;
        }
        assert_eq!(got, (0..kept as u32).collect::<Vec<_>>());
        assert_eq!((forwarded, fa.held()), (kept as u64, 0));
        assert_eq!(fb.recv(&b), 0, "the dropped strays never arrive");
        assert!(!readable(a.wait_fd(), Duration::ZERO), "no longer watched");
    }

    /// A datagram from another user reaches the slot socket but is discarded and counted; one
    /// of the same user is taken. Needs root (to send as another user): skips otherwise.
    #[test]
    fn other_users_cannot_inject() {
        if crate::link::sys::effective_uid() != 0 {
            eprintln!("skip: sending as another user needs root");
            return;
        }
        let local = local(2);
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let mut fb = Forwarder::new(local);
        let name = format!("soft-hca/{local}/slot{}", b.slot()).into_bytes();
        let mut datagram = forward_header(&stray(b"x")).to_vec();
        datagram.push(b'x');
        assert!(
            crate::link::sys::send_as_user(65534, &name, &datagram),
            "a child sent as uid 65534"
        );
        let own = crate::link::sys::connect_abstract_unix(&name).unwrap();
        crate::link::sys::send_parts(own.as_fd(), &[&datagram]).unwrap();
        assert_eq!(fb.recv(&b), 1, "only the same user's datagram");
        assert_eq!(fb.take_counts().refused, 1);
    }

    /// A process of another user binds a free slot's name (abstract names carry no
    /// permissions): strays for that slot are not sent to it but dropped and counted as
    /// untrusted, while the sharers still forward to each other, the next claim skips the
    /// stranger's slot, and a sharer that takes the slot after the stranger has gone gets its
    /// strays (the refusal is not remembered). Needs root (to run as another user): skips
    /// otherwise.
    #[test]
    fn a_stranger_on_a_free_slot_receives_no_strays() {
        if crate::link::sys::effective_uid() != 0 {
            eprintln!("skip: running a stranger as another user needs root");
            return;
        }
        let local = local(3);
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let name = format!("soft-hca/{local}/slot2").into_bytes();
        let stranger =
            crate::link::sys::bind_as_user(65534, &name).expect("uid 65534 binds slot 2");
        let mut fa = Forwarder::new(local);
        let mut fb = Forwarder::new(local);
        let d = stray(&[9; 64]);
        for _ in 0..5 {
            fa.forward(&a, 2, &d);
        }
        fa.forward(&a, b.slot(), &d);
        let c = fa.take_counts();
        assert_eq!((c.untrusted, c.dropped, c.forwarded), (5, 5, 1), "{c:?}");
        assert!(readable(b.wait_fd(), Duration::from_secs(5)));
        assert_eq!(fb.recv(&b), 1, "the sharer still gets its stray");
        // The next sharer skips the stranger's slot and gets strays too.
        let (c3, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        assert_eq!(c3.slot(), 3);
        let mut f3 = Forwarder::new(local);
        fb.forward(&b, 3, &d);
        assert_eq!(fb.take_counts().forwarded, 1);
        assert!(readable(c3.wait_fd(), Duration::from_secs(5)));
        assert_eq!(f3.recv(&c3), 1);
        // The stranger is reachable (a direct send arrives), yet got nothing forwarded.
        let direct = crate::link::sys::connect_abstract_unix(&name).unwrap();
        crate::link::sys::send_parts(direct.as_fd(), &[b"direct"]).unwrap();
        assert_eq!(stranger.received(), Some(1), "only the direct datagram");
        // Once the stranger is gone, a sharer takes slot 2 and its strays go through.
        let (c2, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        assert_eq!(c2.slot(), 2);
        let mut f2 = Forwarder::new(local);
        fa.forward(&a, 2, &d);
        let c = fa.take_counts();
        assert_eq!((c.untrusted, c.forwarded), (0, 1), "{c:?}");
        assert!(readable(c2.wait_fd(), Duration::from_secs(5)));
        assert_eq!(f2.recv(&c2), 1);
    }

    /// The diag names the owner of a connected slot socket: this user and the slot's name.
    #[test]
    fn the_owner_of_a_slot_is_read_from_the_kernel() {
        let local = local(4);
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let name = format!("soft-hca/{local}/slot{}", a.slot()).into_bytes();
        let fd = crate::link::sys::connect_abstract_unix(&name).unwrap();
        let (uid, bound) = crate::link::sys::unix_peer_owner(fd.as_fd()).unwrap();
        assert_eq!(uid, crate::link::sys::effective_uid());
        assert_eq!((bound[0], &bound[1..]), (0, &name[..]));
        let uid = crate::link::sys::effective_uid();
        assert!(owned_by(fd.as_fd(), uid, &name));
        assert!(!owned_by(fd.as_fd(), uid.wrapping_add(1), &name));
        assert!(!owned_by(fd.as_fd(), uid, b"soft-hca/other"));
        drop(a);
        assert!(
            !owned_by(fd.as_fd(), uid, &name),
            "a closed owner is no owner"
        );
    }
}
