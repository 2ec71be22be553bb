//! Loopback tests of the RoCEv2 UDP socket link (`hca::link::udp`): batches between two devices on
//! 127.0.0.1 and 127.0.0.2 with and without GSO/GRO, ECN/DSCP/hop-limit round trips over IPv4 and
//! IPv6, zero-checksum IPv6 datagrams (crafted with a raw socket, root only), bind errors, the
//! waker, and the IPv4 identification of sent packets (read back from a TUN device in a private
//! network namespace, root only). Every wait is bounded.
#![cfg(feature = "std")]
#![allow(unsafe_code)]

#[path = "common/tun.rs"]
mod tun;

use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hca::link::udp::{RecvBatch, RoceSocket, RoceSocketConfig, SendDatagram};
use hca::link::{LinkError, Waker};
use roce::ipv4::Ecn;
use tun::in_tun_namespace;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn link(local: &str, gso: bool, gro: bool) -> RoceSocket {
    let mut c = RoceSocketConfig::new(addr(local));
    c.gso = gso;
    c.gso_ipv4 = gso;
    c.gro = gro;
    c.batch = 32;
    RoceSocket::bind(c).unwrap()
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A received datagram, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    src: SocketAddr,
    dst: SocketAddr,
    ecn: Ecn,
    dscp: u8,
    hop_limit: Option<u8>,
    payload: Vec<u8>,
}

/// Receives until `n` datagrams arrived or 3 s passed.
fn recv_n(link: &mut RoceSocket, batch: &mut RecvBatch, n: usize) -> Vec<Got> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if link.recv(batch).unwrap() == 0 {
            link.wait(false, None, Duration::from_millis(50)).unwrap();
            continue;
        }
        out.extend(batch.iter().map(|d| Got {
            src: d.src,
            dst: d.dst,
            ecn: d.ecn,
            dscp: d.dscp,
            hop_limit: d.hop_limit,
            payload: d.payload.to_vec(),
        }));
    }
    out
}

/// Sends all of `dgrams`, waiting for room when the socket buffer is full (bounded).
fn send_all(link: &mut RoceSocket, dgrams: &[SendDatagram<'_>]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut done = 0;
    while done < dgrams.len() {
        assert!(Instant::now() < deadline, "send stalled at {done}");
        done += link.send(&dgrams[done..]).unwrap();
        if done < dgrams.len() {
            link.wait(true, None, Duration::from_millis(50)).unwrap();
        }
    }
}

/// Payload `i` of a test stream: `len` bytes, a header of 4 bytes (the index) then a pattern.
fn payload(i: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
        .collect();
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

/// Two devices exchange 96 datagrams in three rounds of 32: trains of equal length (GSO-able),
/// a shorter tail, and three-part gather lists (header / payload / ICRC, as the engine hands
/// them). Checks contents, order and addresses.
fn exchange_batches(gso: bool, gro: bool, a_addr: &str, b_addr: &str) {
    exchange_batches_into(gso, gro, a_addr, b_addr, None);
}

/// As [`exchange_batches`], received in batches of `slots` (`None`: the configured batch).
fn exchange_batches_into(gso: bool, gro: bool, a_addr: &str, b_addr: &str, slots: Option<usize>) {
    let mut a = link(a_addr, gso, gro);
    let mut b = link(b_addr, gso, gro);
    let mut batch = match slots {
        Some(n) => b.new_recv_batch_of(n),
        None => b.new_recv_batch(),
    };
    let to = b.local_addr();
    let lens = |i: u32| if i % 32 == 31 { 300 } else { 1100 };
    let bodies: Vec<Vec<u8>> = (0..96).map(|i| payload(i, lens(i))).collect();
    // Split each body into 12 + rest - 4 + 4 bytes: BTH, payload, ICRC.
    let parts: Vec<[IoSlice<'_>; 3]> = bodies
        .iter()
        .map(|b| {
            let n = b.len();
            [
                IoSlice::new(&b[..12]),
                IoSlice::new(&b[12..n - 4]),
                IoSlice::new(&b[n - 4..]),
            ]
        })
        .collect();
    let dgrams: Vec<SendDatagram<'_>> = parts
        .iter()
        .map(|p| SendDatagram {
            ecn: Ecn::Ect0,
            dscp: 26,
            ..SendDatagram::new(to, p)
        })
        .collect();
    let mut got = Vec::new();
    for round in dgrams.chunks(32) {
        send_all(&mut a, round);
        got.extend(recv_n(&mut b, &mut batch, 32));
    }
    assert_eq!(got.len(), 96, "gso={gso} gro={gro}: {:?}", b.counters());
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.payload, bodies[i], "datagram {i} (gso={gso} gro={gro})");
        assert_eq!((g.src, g.dst), (a.local_addr(), b.local_addr()));
        assert_eq!((g.ecn, g.dscp), (Ecn::Ect0, 26));
        assert_eq!(g.hop_limit, Some(64));
    }
    let (ta, rb) = (a.counters(), b.counters());
    assert_eq!((ta.tx_datagrams, rb.rx_datagrams), (96, 96));
    let want_gso = gso && a.offloads().gso;
    assert_eq!(ta.tx_gso_trains > 0, want_gso, "{ta:?}");
    if want_gso {
        // 31 full datagrams + 1 short tail per round fit one train.
        assert_eq!(ta.tx_calls, 3, "{ta:?}");
    }
    if want_gso && b.offloads().gro {
        // Loopback hands a GSO train to a GRO socket whole.
        assert!(rb.rx_gro_buffers > 0, "{rb:?}");
    } else {
        assert_eq!(rb.rx_gro_buffers, 0, "{rb:?}");
    }
    eprintln!(
        "gso={gso} gro={gro} {a_addr}->{b_addr}: offloads {:?} / {:?}; tx {:?}; rx {:?}",
        a.offloads(),
        b.offloads(),
        ta,
        rb
    );
}

/// A one-slot batch (a caller polling an idle device) is received with recvmsg(2): the same
/// datagrams, addresses and marks, and a GRO buffer still yields all its datagrams.
#[test]
fn one_slot_batches_receive_the_same() {
    exchange_batches_into(true, true, "127.0.0.1:0", "127.0.0.2:0", Some(1));
    exchange_batches_into(false, false, "127.0.0.1:0", "127.0.0.2:0", Some(1));
    exchange_batches_into(true, true, "[::1]:0", "[::1]:0", Some(1));
}

#[test]
fn two_devices_ipv4_plain() {
    exchange_batches(false, false, "127.0.0.1:0", "127.0.0.2:0");
}

#[test]
fn two_devices_ipv4_gso_gro() {
    exchange_batches(true, true, "127.0.0.1:0", "127.0.0.2:0");
}

#[test]
fn two_devices_ipv4_gso_without_gro() {
    exchange_batches(true, false, "127.0.0.1:0", "127.0.0.2:0");
}

#[test]
fn ipv6_plain_and_gso_gro() {
    exchange_batches(false, false, "[::1]:0", "[::1]:0");
    exchange_batches(true, true, "[::1]:0", "[::1]:0");
}

#[test]
fn gso_is_off_for_ipv4_by_default() {
    let l = RoceSocket::bind(RoceSocketConfig::new(addr("127.0.0.1:0"))).unwrap();
    let o = l.offloads();
    eprintln!("probed offloads (IPv4 default config): {o:?}");
    assert!(!o.gso, "IPv4 GSO must be opt-in (identification numbering)");
    let l6 = RoceSocket::bind(RoceSocketConfig::new(addr("[::1]:0"))).unwrap();
    eprintln!("probed offloads (IPv6 default config): {:?}", l6.offloads());
    assert_eq!(l6.offloads().gso, l6.offloads().gso_supported);
}

/// ECN codepoints, DSCP and hop limit set per datagram come back as sent, over IPv4 and IPv6, in
/// one batch (so each datagram really carries its own marks), from the bound socket and from
/// sending sockets (`src_ports`, alternating).
#[test]
fn ecn_dscp_and_hop_limit_round_trip() {
    // From the bound socket, then from two sending sockets (src_ports) in turn.
    let cases = [0, 2].into_iter().flat_map(|k| {
        [("127.0.0.1:0", "127.0.0.2:0"), ("[::1]:0", "[::1]:0")].map(|(a, b)| (a, b, k))
    });
    for (a_addr, b_addr, k) in cases {
        let mut c = RoceSocketConfig::new(addr(a_addr));
        c.gso_ipv4 = true;
        c.batch = 32;
        c.src_ports = k;
        let mut a = RoceSocket::bind(c).unwrap();
        let ports = a.src_ports();
        let src = |i: usize| (k > 0).then(|| ports[i % ports.len()]);
        let mut b = link(b_addr, true, true);
        let mut batch = b.new_recv_batch();
        let marks = [
            (Ecn::NotEct, 0, None),
            (Ecn::Ect0, 26, Some(7)),
            (Ecn::Ce, 26, Some(7)),
            (Ecn::Ect1, 46, Some(255)),
            (Ecn::Ce, 63, Some(1)),
        ];
        let bodies: Vec<Vec<u8>> = (0..marks.len() as u32).map(|i| payload(i, 64)).collect();
        let parts: Vec<[IoSlice<'_>; 1]> = bodies.iter().map(|b| [IoSlice::new(b)]).collect();
        let dgrams: Vec<SendDatagram<'_>> = parts
            .iter()
            .zip(marks)
            .enumerate()
            .map(|(i, (p, (ecn, dscp, hop_limit)))| SendDatagram {
                dst: b.local_addr(),
                src_port: src(i),
                ecn,
                dscp,
                hop_limit,
                parts: p,
            })
            .collect();
        send_all(&mut a, &dgrams);
        let got = recv_n(&mut b, &mut batch, marks.len());
        assert_eq!(got.len(), marks.len());
        for (g, (i, (ecn, dscp, hop))) in got.iter().zip(marks.into_iter().enumerate()) {
            assert_eq!(g.payload, bodies[i]);
            assert_eq!(
                g.src.port(),
                src(i).unwrap_or(a.local_addr().port()),
                "{a_addr} datagram {i}"
            );
            assert_eq!((g.ecn, g.dscp), (ecn, dscp), "{a_addr} k={k} datagram {i}");
            assert_eq!(
                g.hop_limit,
                Some(hop.unwrap_or(64)),
                "{a_addr} datagram {i}"
            );
        }
    }
}

/// A std socket (another program) sending with a TOS set by setsockopt: the link reads CE.
#[test]
fn ecn_from_a_foreign_sender() {
    let mut b = link("127.0.0.2:0", false, false);
    let mut batch = b.new_recv_batch();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tos: libc::c_int = 0x03; // CE
                                 // SAFETY: setsockopt with a pointer to a live int and its size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::IPPROTO_IP,
            libc::IP_TOS,
            (&tos as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(rc, 0);
    s.send_to(b"hello", b.local_addr()).unwrap();
    let got = recv_n(&mut b, &mut batch, 1);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].ecn, &got[0].payload[..]), (Ecn::Ce, &b"hello"[..]));
}

/// Builds a UDP header + payload with checksum 0 and sends it from a raw IPv6 socket (which
/// does not fill in UDP checksums), as Linux rxe sends RoCEv2 over IPv6.
fn send_zero_checksum_v6(src_port: u16, dst: SocketAddr, body: &[u8]) {
    let mut pkt = Vec::new();
    pkt.extend_from_slice(&src_port.to_be_bytes());
    pkt.extend_from_slice(&dst.port().to_be_bytes());
    pkt.extend_from_slice(&((8 + body.len()) as u16).to_be_bytes());
    pkt.extend_from_slice(&[0, 0]);
    pkt.extend_from_slice(body);
    // SAFETY: socket(2) with integer arguments.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_UDP) };
    assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: an all-zero sockaddr_in6 is valid; the fields are then set.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_addr.s6_addr = std::net::Ipv6Addr::LOCALHOST.octets();
    // SAFETY: pkt and sa are live for the call with the lengths given; fd is ours and closed once.
    let rc = unsafe {
        let rc = libc::sendto(
            fd,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&sa as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        );
        libc::close(fd);
        rc
    };
    assert_eq!(
        rc as usize,
        pkt.len(),
        "{}",
        std::io::Error::last_os_error()
    );
}

/// A zero UDP checksum over IPv6 is accepted by the link (UDP_NO_CHECK6_RX), and dropped by a
/// plain socket, which shows the option is what makes the difference.
#[test]
fn ipv6_zero_checksum_is_accepted() {
    if !is_root() {
        eprintln!("skipped: crafting a zero-checksum datagram needs a raw socket (root)");
        return;
    }
    let mut b = link("[::1]:0", false, false);
    let mut batch = b.new_recv_batch();
    send_zero_checksum_v6(49152, b.local_addr(), b"rxe-style zero checksum");
    let got = recv_n(&mut b, &mut batch, 1);
    assert_eq!(got.len(), 1, "{:?}", b.counters());
    assert_eq!(got[0].payload, b"rxe-style zero checksum");
    assert_eq!(got[0].src.port(), 49152);

    let plain = UdpSocket::bind("[::1]:0").unwrap();
    plain
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    send_zero_checksum_v6(49152, plain.local_addr().unwrap(), b"dropped");
    let mut buf = [0u8; 64];
    assert!(
        plain.recv_from(&mut buf).is_err(),
        "a plain IPv6 socket drops checksum 0"
    );
}

#[test]
fn bind_errors_name_the_address() {
    let a = link("127.0.0.2:0", false, false);
    let e = RoceSocket::bind(RoceSocketConfig::new(a.local_addr())).unwrap_err();
    assert!(matches!(&e, LinkError::Bind { .. }), "{e}");
    assert_eq!(e.io_error().unwrap().kind(), std::io::ErrorKind::AddrInUse);
    assert!(e.to_string().contains(&a.local_addr().to_string()), "{e}");
    // 192.0.2.1 (TEST-NET-1, RFC 5737) is on no interface of a test machine.
    let e = RoceSocket::bind(RoceSocketConfig::new(addr("192.0.2.1:4791"))).unwrap_err();
    assert_eq!(
        e.io_error().unwrap().kind(),
        std::io::ErrorKind::AddrNotAvailable,
        "{e}"
    );
    assert!(e.to_string().contains("192.0.2.1:4791"), "{e}");
    eprintln!("{e}");
}

/// A link with sending sockets for source-port entropy sends each datagram from the port it
/// names (receivers see it as the source), GSO trains and sendmmsg(2) calls split where the port
/// changes, the ports are distinct and (unless taken) in RoCEv2's entropy range, and a port the
/// link does not own is refused with the datagram's index.
#[test]
fn datagrams_leave_from_the_source_port_they_name() {
    for (a_addr, b_addr) in [("127.0.0.1:0", "127.0.0.2:0"), ("[::1]:0", "[::1]:0")] {
        let mut c = RoceSocketConfig::new(addr(a_addr));
        c.gso_ipv4 = true;
        c.src_ports = 4;
        let mut a = RoceSocket::bind(c).unwrap();
        let mut b = link(b_addr, true, true);
        let ports = a.src_ports();
        assert_eq!(ports.len(), 4);
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{ports:?}");
        assert!(!ports.contains(&a.local_addr().port()), "{ports:?}");
        eprintln!("{a_addr}: source ports {ports:?}");
        // 40 datagrams, runs of 1..=5 per port (trains of equal sizes within a run), then the
        // bound port.
        let bodies: Vec<Vec<u8>> = (0..40).map(|i| payload(i, 900)).collect();
        let parts: Vec<[IoSlice<'_>; 1]> = bodies.iter().map(|x| [IoSlice::new(x)]).collect();
        let src = |i: usize| match i {
            36.. => None,
            _ => Some(ports[(i / (1 + i % 5)) % 4]),
        };
        let dgrams: Vec<SendDatagram<'_>> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| SendDatagram {
                src_port: src(i),
                ..SendDatagram::new(b.local_addr(), p)
            })
            .collect();
        send_all(&mut a, &dgrams);
        let mut batch = b.new_recv_batch();
        let got = recv_n(&mut b, &mut batch, dgrams.len());
        assert_eq!(got.len(), dgrams.len());
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.payload, bodies[i], "datagram {i} in order");
            let want = src(i).unwrap_or(a.local_addr().port());
            assert_eq!(g.src.port(), want, "{a_addr} datagram {i}");
            assert_eq!(g.src.ip(), a.local_addr().ip());
        }
        let body = [0u8; 16];
        let p = [IoSlice::new(&body)];
        let ok = SendDatagram::new(b.local_addr(), &p);
        let foreign = SendDatagram {
            src_port: Some(1),
            ..ok
        };
        match a.send(&[ok, foreign]) {
            Err(LinkError::InvalidDatagram {
                index: 1, reason, ..
            }) => {
                assert!(reason.contains("source port"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    let mut c = RoceSocketConfig::new(addr("127.0.0.1:0"));
    c.src_ports = 65;
    assert!(RoceSocket::bind(c).is_err(), "65 sending sockets");
}

/// A port of the entropy range that another socket holds is replaced by the next free one of
/// the range: a second link on the same address keeps RoCEv2 source ports (0xC000 ..= 0xFFFF),
/// each within a few ports of its preferred one, and none is shared.
#[test]
fn a_taken_entropy_port_is_replaced_within_the_range() {
    let open = || {
        let mut c = RoceSocketConfig::new(addr("127.0.0.3:0"));
        c.src_ports = 2;
        RoceSocket::bind(c).unwrap()
    };
    let first = open();
    let second = open();
    let third = open();
    let ports: Vec<Vec<u16>> = [&first, &second, &third]
        .iter()
        .map(|l| l.src_ports())
        .collect();
    let mut all: Vec<u16> = ports.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 6, "{ports:?}: a port shared");
    for (i, preferred) in [0xC000u16, 0xE000].into_iter().enumerate() {
        for link in &ports {
            let p = link[i];
            assert!(
                (preferred..preferred + 16).contains(&p),
                "{ports:?}: socket {i} left the range near {preferred:#x}"
            );
        }
    }
}

#[test]
fn bad_datagrams_are_refused_with_their_index() {
    let mut a = link("127.0.0.1:0", false, false);
    let b = link("127.0.0.2:0", false, false);
    let body = [0u8; 16];
    let p = [IoSlice::new(&body)];
    let ok = SendDatagram::new(b.local_addr(), &p);
    let v6 = SendDatagram::new(addr("[::1]:4791"), &p);
    let e = a.send(&[ok, ok, v6, ok]).unwrap_err();
    match e {
        LinkError::InvalidDatagram { index, .. } => assert_eq!(index, 2),
        other => panic!("{other}"),
    }
    assert_eq!(a.counters().tx_datagrams, 2);
    let dscp = SendDatagram { dscp: 64, ..ok };
    assert!(matches!(
        a.send(&[dscp]),
        Err(LinkError::InvalidDatagram { index: 0, .. })
    ));
    let big = vec![0u8; 70000];
    let pb = [IoSlice::new(&big)];
    let e = a
        .send(&[SendDatagram::new(b.local_addr(), &pb)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("longer than the largest UDP payload"),
        "{e}"
    );
}

#[test]
fn wait_times_out_wakes_and_sees_data() {
    let a = link("127.0.0.1:0", false, false);
    let waker = Arc::new(Waker::new().unwrap());
    let start = Instant::now();
    let r = a
        .wait(false, Some(&waker), Duration::from_millis(100))
        .unwrap();
    assert!(!r.readable && !r.woken);
    assert!(start.elapsed() >= Duration::from_millis(90));
    assert!(start.elapsed() < Duration::from_secs(2));

    let w = waker.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        w.wake().unwrap();
    });
    let start = Instant::now();
    let r = a.wait(false, Some(&waker), Duration::from_secs(5)).unwrap();
    assert!(r.woken, "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    t.join().unwrap();
    // The wake was consumed.
    let r = a
        .wait(true, Some(&waker), Duration::from_millis(10))
        .unwrap();
    assert!(!r.woken && r.writable, "{r:?}");

    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"x", a.local_addr())
        .unwrap();
    let r = a.wait(false, None, Duration::from_secs(2)).unwrap();
    assert!(r.readable, "{r:?}");
}

#[test]
fn oversized_datagrams_are_dropped_and_counted() {
    let mut c = RoceSocketConfig::new(addr("127.0.0.2:0"));
    c.gro = false;
    c.max_payload = 256;
    let mut b = RoceSocket::bind(c).unwrap();
    let mut batch = b.new_recv_batch();
    assert_eq!(batch.slot_bytes(), 256);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(&[1u8; 257], b.local_addr()).unwrap();
    s.send_to(&[2u8; 256], b.local_addr()).unwrap();
    let got = recv_n(&mut b, &mut batch, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, vec![2u8; 256]);
    assert_eq!(b.counters().rx_truncated, 1);
}

/// The IPv4 identification Linux gives the link's packets, read back from a TUN device in a
/// private network namespace: 0 for every single datagram (unconnected socket + Don't Fragment,
/// `ip_select_ident_segs`), and 0, 1, 2 for a GSO train (`inet_gso_segment`), which is why GSO
/// is opt-in on IPv4.
#[test]
fn ipv4_identification_on_the_wire() {
    // Everything runs in one thread that moves into a new network namespace (per-thread for
    // CLONE_NEWNET), so the host's network is untouched.
    in_tun_namespace("rocetun0", "10.77.0.1/24", |tun| {
        let mut c = RoceSocketConfig::new(addr("10.77.0.1:4791"));
        c.gso_ipv4 = true;
        let mut l = RoceSocket::bind(c).unwrap();
        let dst = addr("10.77.0.2:4791");
        let body = [0x5au8; 100];
        let p = [IoSlice::new(&body)];
        let d = SendDatagram::new(dst, &p);
        // Three single datagrams (one call each), then one GSO train of three.
        for _ in 0..3 {
            assert_eq!(l.send(&[d]).unwrap(), 1);
        }
        assert_eq!(l.send(&[d, d, d]).unwrap(), 3);
        // The (identification, DF) of each IPv4 UDP packet.
        let ids: Vec<(u16, bool)> = (0..6)
            .filter_map(|_| tun.next_udp(Duration::from_secs(2)))
            .map(|p| (u16::from_be_bytes([p[4], p[5]]), p[6] & 0x40 != 0))
            .collect();
        eprintln!(
            "IPv4 (ident, DF) on the wire: {ids:?}; offloads {:?}",
            l.offloads()
        );
        assert_eq!(ids.len(), 6);
        assert_eq!(
            &ids[..3],
            &[(0, true); 3],
            "single datagrams carry ident 0 and DF"
        );
        if l.counters().tx_gso_trains == 1 {
            assert_eq!(
                &ids[3..],
                &[(0, true), (1, true), (2, true)],
                "GSO numbers segments"
            );
        }
    });
}

/// A GSO send the kernel refuses (here: IPv6 without UDP checksums, which GSO cannot do, forced
/// behind the link's back) switches GSO off and the datagrams still go out, one by one.
#[test]
fn failed_gso_falls_back_to_single_datagrams() {
    use std::os::fd::{AsFd, AsRawFd};
    let mut a = link("[::1]:0", true, false);
    let mut b = link("[::1]:0", false, false);
    let mut batch = b.new_recv_batch();
    if !a.offloads().gso {
        eprintln!("skipped: no GSO on this kernel");
        return;
    }
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live int and its size, on the link's open socket.
    let rc = unsafe {
        libc::setsockopt(
            a.as_fd().as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_TX,
            (&one as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(rc, 0);
    let bodies: Vec<Vec<u8>> = (0..8).map(|i| payload(i, 500)).collect();
    let parts: Vec<[IoSlice<'_>; 1]> = bodies.iter().map(|b| [IoSlice::new(b)]).collect();
    let dgrams: Vec<SendDatagram<'_>> = parts
        .iter()
        .map(|p| SendDatagram::new(b.local_addr(), p))
        .collect();
    send_all(&mut a, &dgrams);
    let c = *a.counters();
    assert_eq!(
        (c.gso_fallbacks, c.tx_gso_trains, c.tx_datagrams),
        (1, 0, 8),
        "{c:?}"
    );
    assert!(!a.offloads().gso);
    let got = recv_n(&mut b, &mut batch, 8);
    let payloads: Vec<Vec<u8>> = got.into_iter().map(|g| g.payload).collect();
    assert_eq!(payloads, bodies);
}

/// Runs `f` in a thread of its own in a new network namespace whose loopback is up and holds
/// back what it sends behind a token bucket of 8 bit/s (tc-tbf(8), after a 4 KiB burst): sent
/// datagrams stay queued, charged to their socket's send buffer, until `release` (below) lifts
/// the rate. Root only; `None` (skipped, said why) where namespaces or tc are unavailable.
fn in_throttled_namespace<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return None;
    }
    std::thread::spawn(move || {
        // SAFETY: unshare(2) of the calling thread's network namespace; no pointers.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "skipped: unshare(CLONE_NEWNET): {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
        if !(run(&["ip", "link", "set", "lo", "up"])
            && run(&[
                "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "8bit", "burst", "4096",
                "limit", "50000000",
            ]))
        {
            eprintln!("skipped: could not set up lo with ip(8) / tc(8)");
            return None;
        }
        Some(f())
    })
    .join()
    .unwrap()
}

/// Lets the namespace's loopback (of [`in_throttled_namespace`]) send at 10 Gbit/s: what its
/// queue holds goes out, nothing is dropped. The queue runs again on its next packet (the
/// bucket's timer still waits for the old rate), so one datagram to itself from a socket on
/// `ip` kicks it.
fn release(ip: std::net::IpAddr) {
    assert!(run(&[
        "tc", "qdisc", "change", "dev", "lo", "root", "tbf", "rate", "10gbit", "burst", "1mb",
        "limit", "50000000",
    ]));
    let kick = UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap();
    kick.send_to(b"kick", kick.local_addr().unwrap()).unwrap();
}

fn run(args: &[&str]) -> bool {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// One sending socket whose buffer is full holds back its own port only: the link reports it
/// not writable although its other sockets are (a progress thread waiting for room would
/// otherwise wake at once, again and again), another port still sends, and once the queue
/// drains the waiter wakes and every datagram arrives, in order per port, none lost.
#[test]
fn a_full_sending_socket_holds_back_its_port_only() {
    for (a_addr, b_addr) in [("127.0.0.1:0", "127.0.0.2:0"), ("[::1]:0", "[::1]:0")] {
        in_throttled_namespace(move || {
            let mut c = RoceSocketConfig::new(addr(a_addr));
            c.gso = false;
            c.src_ports = 2;
            // The kernel doubles it: room for a few datagrams of 1000 bytes.
            c.send_buffer_bytes = Some(4096);
            let mut a = RoceSocket::bind(c).unwrap();
            let mut c = RoceSocketConfig::new(addr(b_addr));
            c.recv_buffer_bytes = Some(4 << 20);
            c.gro = false;
            let mut b = RoceSocket::bind(c).unwrap();
            let ports = a.src_ports();
            let bodies: Vec<Vec<u8>> = (0..400).map(|i| payload(i, 1000)).collect();
            let parts: Vec<[IoSlice<'_>; 1]> = bodies.iter().map(|x| [IoSlice::new(x)]).collect();
            // Even datagrams from the first port, odd ones from the second.
            let dgram = |i: usize| SendDatagram {
                src_port: Some(ports[i % 2]),
                ..SendDatagram::new(b.local_addr(), &parts[i])
            };
            // Fill the first port's socket (the bucket's burst lets a few out first).
            let mut next = 0;
            while next < bodies.len() && a.send(&[dgram(next)]).unwrap() == 1 {
                next += 2;
            }
            assert!(next < bodies.len(), "{a_addr}: the socket never filled");
            assert!(a.counters().tx_full >= 1);
            let r = a.wait(true, None, Duration::ZERO).unwrap();
            assert!(
                !r.writable,
                "{a_addr}: a full socket is not writable: {r:?}"
            );
            // The second port still sends.
            assert_eq!(a.send(&[dgram(1)]).unwrap(), 1, "{a_addr}: second port");
            let r = a
                .poller()
                .unwrap()
                .wait(true, None, Duration::ZERO)
                .unwrap();
            assert!(
                !r.writable,
                "{a_addr}: the poller watches the full socket: {r:?}"
            );
            release(a.local_addr().ip());
            let deadline = Instant::now() + Duration::from_secs(20);
            while !a
                .wait(true, None, Duration::from_millis(100))
                .unwrap()
                .writable
            {
                assert!(Instant::now() < deadline, "{a_addr}: never writable again");
            }
            // The rest of the first port's datagrams, then the second's.
            let rest: Vec<SendDatagram<'_>> = (next..bodies.len())
                .step_by(2)
                .chain((3..bodies.len()).step_by(2))
                .map(dgram)
                .collect();
            send_all(&mut a, &rest);
            let mut batch = b.new_recv_batch();
            let got = recv_n(&mut b, &mut batch, bodies.len());
            assert_eq!(got.len(), bodies.len(), "{a_addr}: datagrams lost");
            for (k, port) in ports.iter().enumerate() {
                let from: Vec<&Vec<u8>> = got
                    .iter()
                    .filter(|g| g.src.port() == *port)
                    .map(|g| &g.payload)
                    .collect();
                let want: Vec<&Vec<u8>> = bodies.iter().skip(k).step_by(2).collect();
                assert!(
                    from == want,
                    "{a_addr}: port {port} out of order or incomplete"
                );
            }
        });
    }
}
