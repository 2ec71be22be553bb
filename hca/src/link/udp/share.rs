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
//! over its slot's abstract Unix socket to the owner's (`LinkCounters::rx_forwarded`), which
//! polls that socket along with its UDP socket and hands the datagram to its engine as if it
//! had come from the wire; a stray whose slot nobody holds, or whose owner's queue is full, is
//! dropped and counted (`LinkCounters::rx_strays`). The owner's queue holds
//! `net.unix.max_dgram_qlen` datagrams (unix(7); 10 by default), so bursts of strays lose some:
//! RC retransmits them. Correctness thus never depends on the
//! kernel's index; a moved slot costs one extra local hop per datagram until the group is
//! rebuilt (its processes reopen).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Bits of the QPN that name the owning process's slot.
pub const SLOT_BITS: u32 = 5;
/// Processes that can share one device address and port: `2^SLOT_BITS`.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// Random bits left in a QPN drawn by a shared device: `24 - SLOT_BITS`.
pub const RANDOM_QPN_BITS: u32 = 24 - SLOT_BITS;
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
/// `qpn >> RANDOM_QPN_BITS`, or 0 for QP 1. A packet shorter than 8 bytes ends the program with
/// 0 (filter.txt: an out-of-bounds absolute load returns 0).
pub fn steering_program() -> [libc::sock_filter; 6] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 4),
        op(
            libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
            0,
            0,
            0x00ff_ffff,
        ),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 2, 0, GSI_QPN),
        op(
            libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K,
            0,
            0,
            RANDOM_QPN_BITS,
        ),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
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

/// A process's claim on a slot of a shared address: held while this value lives (and by the
/// kernel only as long as the process does).
#[derive(Debug)]
pub struct SlotClaim {
    slot: usize,
    _name: OwnedFd,
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
}

/// Bytes before the payload of a forwarded datagram: source address (16, IPv4 as IPv4-mapped
/// IPv6), destination address (16), source port (2, big-endian), ECN, DSCP, hop limit, and a
/// flag byte (1: the addresses are IPv4).
pub const FORWARD_HEADER: usize = 38;
/// Forwarded datagrams received per round.
const FORWARD_BATCH: usize = 16;
/// Bytes of one forwarded datagram's slot: a header and the largest UDP payload.
const FORWARD_SLOT: usize = FORWARD_HEADER + 65536;

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

/// Stray forwarding of a shared link: strays go to their owner's slot socket, and datagrams
/// forwarded to this process are read from its own (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Forwarder {
    /// The abstract names of the slots, `soft-hca/ADDR:PORT/slotN`.
    names: Vec<Vec<u8>>,
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
            rx: Vec::new(),
            lens: [0; FORWARD_BATCH],
            count: 0,
        }
    }

    /// Sends datagram `d` to the process of `slot` over `fd` (the sender's own slot socket).
    /// `false` when it could not go (nobody holds the slot, or its queue is full): the caller
    /// counts it dropped.
    pub(crate) fn forward(&self, fd: BorrowedFd<'_>, slot: usize, d: &Forwarded<'_>) -> bool {
        let head = forward_header(d);
        let Some(name) = self.names.get(slot) else {
            return false;
        };
        crate::link::sys::send_abstract_unix(fd, name, &[&head, d.payload]).is_ok()
    }

    /// Reads up to 16 forwarded datagrams from `fd` without blocking; how many.
    pub(crate) fn recv(&mut self, fd: BorrowedFd<'_>) -> usize {
        if self.rx.is_empty() {
            self.rx = vec![0; FORWARD_BATCH * FORWARD_SLOT];
        }
        self.count = 0;
        while self.count < FORWARD_BATCH {
            let i = self.count;
            let buf = &mut self.rx[i * FORWARD_SLOT..(i + 1) * FORWARD_SLOT];
            match crate::link::sys::recv_dontwait(fd, buf) {
                Ok(n) if n <= FORWARD_SLOT => {
                    self.lens[i] = n;
                    self.count += 1;
                }
                Ok(_) => continue, // truncated: not one of ours; dropped
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
                let bound = bind(slot)?;
                return Ok((SlotClaim { slot, _name: name }, bound));
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

    /// A stray sent to a held slot arrives there; to a free slot it fails.
    #[test]
    fn strays_reach_their_owner() {
        let local: SocketAddr = format!("127.0.0.1:{}", 20000 + std::process::id() % 20000)
            .parse()
            .unwrap();
        let (a, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let (b, ()) = claim_and_bind(local, |_| Ok(())).unwrap();
        let fa = Forwarder::new(local);
        let mut fb = Forwarder::new(local);
        let d = Forwarded {
            src: "127.0.0.9:50001".parse().unwrap(),
            dst: local.ip(),
            ecn: 1,
            dscp: 0,
            hop_limit: 64,
            payload: &[7; 100],
        };
        assert!(fa.forward(a.fd(), b.slot(), &d));
        assert!(!fa.forward(a.fd(), 5, &d), "slot 5 is free");
        assert_eq!(fb.recv(b.fd()), 1);
        let got: Vec<_> = fb.received().collect();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].src, got[0].payload), (d.src, d.payload));
        assert_eq!(fb.recv(b.fd()), 0);
    }
}
