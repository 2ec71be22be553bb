//! Off-path spoofing over the real UDP link on loopback (issue 17): while device A (127.0.0.1)
//! RDMA-WRITEs rounds of data into an MR of device B (127.0.0.2), a third party that knows both
//! addresses sends 10^5 forged packets built with `roce`'s packet builder:
//! * to B, RDMA WRITE ONLY requests "from A" carrying a guessed rkey and PSN, mostly to a guessed
//!   QPN, a few to B's real QPN (an attacker who learned it);
//! * to A, "remote access error" NAKs and ACKs "from B" with random PSNs to guessed QPNs, and
//!   1000 to A's real QPN with random PSNs outside A's window (which must all be dropped as
//!   unexpected responses).
//!
//! The forger binds its socket to the address it impersonates (any 127.x address can be bound on
//! loopback), so the packets pass the source address check exactly as spoofed ones from an
//! off-path host would. Checks: no forged byte lands in B's MR (the part the transfer never writes
//! stays zero; each round's data is intact), the transfer completes every WR with the right data,
//! and every forged packet that the kernel delivered is counted by the engine as rejected. Every
//! wait is bounded.
#![cfg(all(feature = "std", target_os = "linux"))]

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use gpu_p2p::{HostMemory, Memory};
use hca::soft::{UdpDevice, UdpDeviceConfig, GID_INDEX};
use hca::verbs::connect::{self, ConnectAttr};
use hca::verbs::random::{random_psn, OsRandom, RandomSource};
use hca::{
    AccessFlags, Counters, CqHandle, DropReason, MemoryRegion, PathMtu, QpCap, QpInitAttr, QpState,
    QpType, SendFlags, SendOp, SendWr, Sge, WcStatus,
};
use roce::aeth::{AckCredit, NakCode, Syndrome};
use roce::packet::{ExtReprs, IpRepr, PacketRepr, TransportRepr};
use roce::{aeth, bth, reth, Opcode};

/// Bound on one wait for completions.
const WAIT: Duration = Duration::from_secs(20);
/// Bound on the whole test.
const DEADLINE: Duration = Duration::from_secs(240);
/// Forged packets, all kinds together.
const FORGED: usize = 100_000;
/// Of the forged WRITEs, those sent to B's real QPN (the rest go to random QPNs). Each has a
/// chance of 2^-24 to carry the PSN B expects; B then checks the (random, wrong) rkey and NAKs A
/// with a remote access error, failing the transfer: about 6e-5 per run for 1000.
const FORGED_KNOWN_QPN: usize = 1_000;
/// Of the forged ACK / NAKs, those sent to A's real QPN, each with a random PSN outside the band
/// `[start - 2^10, start + 2^22)` around A's start PSN, which holds every PSN the transfer can
/// reach within the deadline: they must be dropped as unexpected responses. (A PSN inside A's
/// window of at most 128 outstanding would be taken, with probability about 2^-17 per packet
/// if drawn from all 2^24: the arithmetic in `hca::verbs::qp`; this checks the window check.)
const FORGED_KNOWN_QPN_RESPONSES: usize = 1_000;
/// B's MR: the transfer writes the first `XFER` bytes, never the rest.
const MEM: usize = 1 << 20;
const XFER: usize = 3 << 18;
/// Bytes per legitimate WRITE.
const CHUNK: usize = 16 << 10;
/// Bytes of each forged WRITE.
const FORGED_LEN: usize = 64;
const B_IOVA: u64 = 0x7700_0000;

struct Side {
    dev: Arc<UdpDevice>,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

fn open(addr: &str) -> UdpDevice {
    let mut c = UdpDeviceConfig::new(addr.parse().unwrap());
    c.port = 0;
    UdpDevice::open(c).unwrap()
}

fn side(dev: UdpDevice, iova: u64) -> Side {
    let dev = Arc::new(dev);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let mem = Arc::new(HostMemory::new(MEM).unwrap());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = dev.reg_mr(pd, mem.clone(), iova, access).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let qpn = dev.create_qp(pd, &init).unwrap();
    Side {
        dev,
        cq,
        qpn,
        mem,
        mr,
    }
}

fn bring_up(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32) {
    let a = ConnectAttr {
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path_mtu: PathMtu::Mtu1024,
        ah_attr: ConnectAttr::av(peer.dev.gid(), GID_INDEX as u8, 64, 0),
        remote_qpn: peer.qpn,
        remote_psn: peer_psn,
        local_psn: my_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..ConnectAttr::default()
    };
    connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
        me.dev.modify_qp(me.qpn, qp, mask).map(|_| ())
    })
    .unwrap();
}

fn pattern(round: u32) -> Vec<u8> {
    (0..XFER)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(round) as u8 | 1)
        .collect()
}

/// Packets the engine turned away: drops by any reason, plus requests to a live QP refused for
/// their PSN (duplicates are only re-acknowledged, later PSNs NAKed once per gap; rxe counts
/// them as `duplicate_request` / `out_of_seq_request`, not as drops).
fn rejected(c: &Counters) -> u64 {
    c.total_drops() + c.duplicate_request + c.out_of_seq_request
}

fn drops_by_reason(before: &Counters, after: &Counters) -> String {
    DropReason::ALL
        .iter()
        .filter_map(|r| {
            let d = after.drops(*r) - before.drops(*r);
            (d > 0).then(|| format!("{r}={d}"))
        })
        .chain([
            format!(
                "duplicate_request={}",
                after.duplicate_request - before.duplicate_request
            ),
            format!(
                "out_of_seq_request={}",
                after.out_of_seq_request - before.out_of_seq_request
            ),
        ])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One forged RoCEv2 UDP payload (BTH .. ICRC), with the ICRC over the addresses and UDP source
/// port it will really carry (the receiver must judge it on its content, not its checksum).
fn forge(
    from: SocketAddr,
    to: SocketAddr,
    bth: bth::Repr,
    ext: ExtReprs,
    payload: &[u8],
) -> Vec<u8> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.ip(), to.ip()) else {
        unreachable!("IPv4 loopback")
    };
    let repr = PacketRepr {
        ip: IpRepr::Ipv4(roce::ipv4::Repr {
            src_addr: src,
            dst_addr: dst,
            protocol: roce::ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 64,
            dscp: 0,
            ecn: roce::ipv4::Ecn::NotEct,
            ident: hca::engine::IPV4_IDENT,
            dont_frag: true,
        }),
        udp_src_port: from.port(),
        udp_checksum: false,
        transport: TransportRepr { bth, ext },
    };
    let mut out = vec![0u8; payload.len() + 128];
    let len = roce::packet::build_udp_payload(&repr, &[payload], &mut out).unwrap();
    out.truncate(len);
    out
}

fn bth_to(opcode: Opcode, dest_qpn: u32, psn: u32) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: true,
        psn,
    }
}

/// What the forger sent: WRITEs to B, responses to A.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    writes: u64,
    responses: u64,
}

/// Sends `FORGED` packets: half WRITEs into B (impersonating A), half ACK / NAKs into A
/// (impersonating B), interleaved, paced a little so that the receivers' sockets mostly keep up.
fn forger(a: SocketAddr, b: SocketAddr, qpns: (u32, u32), b_iova: u64, a_psn: u32) -> Sent {
    let (a_qpn, b_qpn) = qpns;
    // A random PSN outside the band around A's start PSN (see FORGED_KNOWN_QPN_RESPONSES).
    let outside = |start: u32| loop {
        let p = random_psn();
        let d = p.wrapping_sub(start) & 0x00ff_ffff;
        if (1 << 22..(1 << 24) - (1 << 10)).contains(&d) {
            return p;
        }
    };
    // A guessed QPN is another one than the live QP's (a hit has probability 2^-24 per packet;
    // excluding it keeps the test's accounting exact, with no effect on what is tested).
    let guess = |r: &mut OsRandom, live: u32| loop {
        let q = r.next_u32() & 0x00ff_ffff;
        if q != live {
            return q;
        }
    };
    let as_a = UdpSocket::bind((a.ip(), 0)).unwrap();
    let as_b = UdpSocket::bind((b.ip(), 0)).unwrap();
    let (from_a, from_b) = (as_a.local_addr().unwrap(), as_b.local_addr().unwrap());
    let mut r = OsRandom;
    let junk = [0xa5u8; FORGED_LEN];
    let mut sent = Sent::default();
    for i in 0..FORGED {
        if i % 2 == 0 {
            let qpn = if (i / 2) < FORGED_KNOWN_QPN {
                b_qpn
            } else {
                guess(&mut r, b_qpn)
            };
            let offset = u64::from(r.next_u32()) % (MEM - FORGED_LEN) as u64;
            let ext = ExtReprs {
                reth: Some(reth::Repr {
                    virtual_address: b_iova + offset,
                    rkey: r.next_u32(),
                    dma_len: FORGED_LEN as u32,
                }),
                ..ExtReprs::default()
            };
            let bth = bth_to(Opcode::RcRdmaWriteOnly, qpn, random_psn());
            let p = forge(from_a, b, bth, ext, &junk);
            if as_a.send_to(&p, b).is_ok() {
                sent.writes += 1;
            }
        } else {
            let syndrome = if i % 4 == 1 {
                Syndrome::Nak(NakCode::RemoteAccessError)
            } else {
                Syndrome::Ack {
                    credit: AckCredit::INVALID,
                }
            };
            let ext = ExtReprs {
                aeth: Some(aeth::Repr {
                    syndrome,
                    msn: r.next_u32() & 0x00ff_ffff,
                }),
                ..ExtReprs::default()
            };
            let bth = if (i / 2) < FORGED_KNOWN_QPN_RESPONSES {
                bth_to(Opcode::RcAcknowledge, a_qpn, outside(a_psn))
            } else {
                bth_to(Opcode::RcAcknowledge, guess(&mut r, a_qpn), random_psn())
            };
            let p = forge(from_b, a, bth, ext, &[]);
            if as_b.send_to(&p, a).is_ok() {
                sent.responses += 1;
            }
        }
        if i % 256 == 255 {
            thread::sleep(Duration::from_micros(500));
        }
    }
    sent
}

#[test]
fn forged_writes_naks_and_acks_never_land_and_are_all_counted() {
    let start = Instant::now();
    let (da, db) = (open("127.0.0.1"), open("127.0.0.2"));
    da.set_peer_port(db.local_addr().ip(), db.local_addr().port());
    db.set_peer_port(da.local_addr().ip(), da.local_addr().port());
    let a = side(da, 0x10_0000);
    let b = side(db, B_IOVA);
    let (pa, pb) = (random_psn(), random_psn());
    bring_up(&a, &b, pa, pb);
    bring_up(&b, &a, pb, pa);

    let (a_addr, b_addr) = (a.dev.local_addr(), b.dev.local_addr());
    let (ca0, cb0) = (a.dev.counters(), b.dev.counters());
    let (la0, lb0) = (a.dev.link_counters(), b.dev.link_counters());

    let done = Arc::new(AtomicBool::new(false));
    let forging = {
        let (done, qpns, b_iova) = (done.clone(), (a.qpn, b.qpn), b.mr.iova());
        thread::spawn(move || {
            let sent = forger(a_addr, b_addr, qpns, b_iova, pa);
            done.store(true, Ordering::Release);
            sent
        })
    };

    // Rounds of RDMA WRITEs A -> B until the forger is done (and at least two), each round a new
    // pattern over the first XFER bytes, checked at B once A has every completion.
    let mut round = 0u32;
    let mut wrs = 0u64;
    while round < 2 || !done.load(Ordering::Acquire) {
        assert!(start.elapsed() < DEADLINE, "transfer ran past {DEADLINE:?}");
        round += 1;
        let data = pattern(round);
        a.mem.write(0, &data).unwrap();
        let chunks = XFER / CHUNK;
        for c in 0..chunks {
            let sge = Sge {
                addr: a.mr.iova() + (c * CHUNK) as u64,
                length: CHUNK as u32,
                lkey: a.mr.lkey(),
            };
            a.dev
                .post_send(
                    a.qpn,
                    &SendWr {
                        wr_id: u64::from(round) << 32 | c as u64,
                        sg_list: &[sge],
                        op: SendOp::RdmaWrite {
                            remote_addr: b.mr.iova() + (c * CHUNK) as u64,
                            rkey: b.mr.rkey(),
                        },
                        send_flags: SendFlags::SIGNALED,
                    },
                )
                .unwrap();
        }
        let wcs = a.dev.wait_cq(a.cq, chunks, WAIT).unwrap();
        assert_eq!(wcs.len(), chunks, "round {round}: {wcs:?}");
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "round {round}: {wcs:?}"
        );
        wrs += chunks as u64;
        let mut got = vec![0u8; XFER];
        b.mem.read(0, &mut got).unwrap();
        assert!(got == data, "round {round}: B's data differs from A's");
    }
    let sent = forging.join().unwrap();
    let forged = sent.writes + sent.responses;

    // Let the last forged datagrams drain: both engines' received counts stop moving.
    let mut last = (0, 0);
    let settle = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(100));
        let now = (
            a.dev.link_counters().rx_datagrams,
            b.dev.link_counters().rx_datagrams,
        );
        if now == last || settle.elapsed() > WAIT {
            break;
        }
        last = now;
    }

    let mut tail = vec![0u8; MEM - XFER];
    b.mem.read(XFER, &mut tail).unwrap();
    assert!(
        tail.iter().all(|&x| x == 0),
        "a forged WRITE landed in B's MR at offset {}",
        XFER + tail.iter().position(|&x| x != 0).unwrap()
    );
    let mut got = vec![0u8; XFER];
    b.mem.read(0, &mut got).unwrap();
    assert!(got == pattern(round), "B's data after the attack");

    let (ca1, cb1) = (a.dev.counters(), b.dev.counters());
    let (la1, lb1) = (a.dev.link_counters(), b.dev.link_counters());
    let kernel_a = la1.rx_kernel_drops - la0.rx_kernel_drops;
    let kernel_b = lb1.rx_kernel_drops - lb0.rx_kernel_drops;
    let rej_a = rejected(&ca1) - rejected(&ca0);
    let rej_b = rejected(&cb1) - rejected(&cb0);
    println!(
        "{round} rounds, {wrs} WRITEs of {CHUNK} B in {:.1} s; forged: {} WRITEs to B ({} to its \
         QPN), {} ACK/NAKs to A ({} to its QPN)",
        start.elapsed().as_secs_f64(),
        sent.writes,
        FORGED_KNOWN_QPN.min(sent.writes as usize),
        sent.responses,
        FORGED_KNOWN_QPN_RESPONSES.min(sent.responses as usize),
    );
    println!(
        "B: rejected {rej_b} (forged {}, kernel drops {kernel_b}; {}), datagrams {}",
        sent.writes,
        drops_by_reason(&cb0, &cb1),
        lb1.rx_datagrams - lb0.rx_datagrams
    );
    println!(
        "A: rejected {rej_a} (forged {}, kernel drops {kernel_a}; {}), datagrams {}",
        sent.responses,
        drops_by_reason(&ca0, &ca1),
        la1.rx_datagrams - la0.rx_datagrams
    );
    assert_eq!(forged, FORGED as u64, "every forged datagram was sent");
    // Each forged datagram the kernel delivered is counted at its device; the legitimate
    // traffic can only add to the counts (a forged out-of-sequence WRITE makes B NAK, A resend,
    // B count the resent packets as duplicates), and the kernel's receive-buffer drops (SO_RXQ_OVFL,
    // legitimate or forged datagrams alike) are what did not arrive.
    assert!(
        rej_b + kernel_b >= sent.writes,
        "B rejected {rej_b} of {} forged WRITEs ({kernel_b} dropped by the kernel)",
        sent.writes
    );
    assert!(
        rej_a + kernel_a >= sent.responses,
        "A rejected {rej_a} of {} forged responses ({kernel_a} dropped by the kernel)",
        sent.responses
    );
    // Forged packets to guessed QPNs are all dropped as naming no QP.
    let random_qpn_writes = sent.writes.saturating_sub(FORGED_KNOWN_QPN as u64);
    assert!(
        cb1.drops(DropReason::Qpn) - cb0.drops(DropReason::Qpn) + kernel_b >= random_qpn_writes,
        "B: drop_qpn"
    );
    let random_qpn_responses = sent
        .responses
        .saturating_sub(FORGED_KNOWN_QPN_RESPONSES as u64);
    assert!(
        ca1.drops(DropReason::Qpn) - ca0.drops(DropReason::Qpn) + kernel_a >= random_qpn_responses,
        "A: drop_qpn"
    );
    // Those to A's QPN, outside its window, are all dropped as unexpected responses.
    let known = sent.responses.min(FORGED_KNOWN_QPN_RESPONSES as u64);
    assert!(
        ca1.drops(DropReason::UnexpectedResponse) - ca0.drops(DropReason::UnexpectedResponse)
            + kernel_a
            >= known,
        "A: drop_unexpected_response below the {known} forged responses to its QPN"
    );
}
