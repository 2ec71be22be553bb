//! Receive validation and demultiplexing (`engine/recv.rs`, rxe `rxe_recv.c`): every check (UDP
//! port, length, version, opcode, destination address, QPN, QP type and state, source address,
//! P_Key, Q_Key, ICRC) drops a packet that fails it, counts it under its own reason and never
//! panics; random bytes and random metadata cannot hurt the engine. Then the dispatch of ECN marks
//! and CNPs (IBTA Annex A17.9): a CE-marked packet makes the receiver send a CNP to the sender's
//! QP, rate-limited; a received CNP is counted and handed to the rate-control hook.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use common::crafted_packets::*;
use common::uc_ud::*;
use common::work_requests::*;
use common::*;
use hca::{Datagram, DropReason, Instant, QpAttr, QpAttrMask, QpState, RateControl, WcStatus};
use proptest::prelude::*;
use roce::ipv4::Ecn;
use roce::packet::{ExtReprs, TransportRepr};
use roce::Opcode;

// ---- validation steps: each drops and counts ----

/// A valid packet from A to B (an RDMA WRITE ONLY) and the pair.
fn setup() -> (hca::fabric::Fabric, Peer, Peer, Pkt) {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 64), &b, 0));
    let pkt = transmit(&mut f, &a, t_us(0)).remove(0);
    (f, a, b, pkt)
}

#[test]
fn each_validation_step_drops_and_counts() {
    let (mut f, _a, b, pkt) = setup();
    let mut cases: Vec<(DropReason, Pkt)> = Vec::new();
    // UDP port.
    let mut p = pkt.clone();
    p.tx.dst_port = 4790;
    cases.push((DropReason::NotRoce, p));
    // Length: truncated.
    let mut p = pkt.clone();
    p.data.truncate(20);
    cases.push((DropReason::Length, p));
    // Version: TVer 1.
    let t = pkt.parsed();
    let mut p = pkt.clone();
    p.data[1] |= 1;
    cases.push((DropReason::Version, p));
    // Opcode: RD SEND ONLY (0x44) is not a RoCEv2 opcode.
    let mut p = pkt.clone();
    p.data[0] = 0x44;
    cases.push((DropReason::Opcode, p));
    // Destination address: not B's.
    let mut p = pkt.clone();
    p.tx.dst_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99));
    cases.push((DropReason::DestinationAddress, p));
    // QPN: no such QP (ICRC stays valid: the packet is rebuilt).
    let mut tr = t.transport;
    tr.bth.dest_qpn = 0x1234;
    cases.push((DropReason::Qpn, pkt.rebuilt(tr, t.payload)));
    // QP type: a UC opcode to an RC QP.
    let mut tr = t.transport;
    tr.bth.opcode = roce::Opcode::UcRdmaWriteOnly;
    cases.push((DropReason::QpType, pkt.rebuilt(tr, t.payload)));
    // Source address: not the QP's peer.
    let mut p = pkt.rebuilt(t.transport, t.payload);
    p.tx.src_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 77));
    let p = p.rebuilt(t.transport, t.payload);
    cases.push((DropReason::SourceAddress, p));
    // P_Key.
    let mut tr = t.transport;
    tr.bth.pkey = 0x8001;
    cases.push((DropReason::Pkey, pkt.rebuilt(tr, t.payload)));
    // ICRC.
    let mut p = pkt.clone();
    let last = p.data.len() - 1;
    p.data[last] ^= 0x80;
    cases.push((DropReason::Icrc, p));
    for (reason, p) in &cases {
        let before = drops(&f, &b, *reason);
        deliver(&mut f, &b, p, t_us(1));
        assert_eq!(drops(&f, &b, *reason), before + 1, "{reason}");
    }
    let c = f.node(b.node).counters();
    assert_eq!(c.total_drops(), cases.len() as u64);
    assert_eq!(c.rcvd_pkts, 0);
    assert_eq!(c.icrc_errors, 1);
    assert_eq!(b.read(0, 64), vec![0; 64], "nothing was written");
    let d = f.node_mut(b.node).poll_diag().unwrap();
    assert!(matches!(
        d.kind,
        hca::engine::DiagKind::Dropped(DropReason::NotRoce)
    ));
    // The valid packet still works.
    deliver(&mut f, &b, &pkt, t_us(2));
    assert_eq!(f.node(b.node).counters().rcvd_pkts, 1);
}

#[test]
fn corrupted_packets_are_caught_by_the_icrc() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 64), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    for bit in [0usize, 100, 300, 8 * pkts[0].data.len() - 1] {
        let mut bad = pkts[0].clone();
        bad.data[bit / 8] ^= 1 << (bit % 8);
        deliver(&mut f, &b, &bad, t_us(1));
    }
    let c = f.node(b.node).counters();
    assert_eq!(c.total_drops(), 4, "{c:?}");
    assert!(c.icrc_errors >= 2);
    assert_eq!(c.rcvd_pkts, 0);
    assert!(transmit(&mut f, &b, t_us(1)).is_empty());
}

/// `p` as a link reports it, with IPv4 identification `ip_ident`.
fn at(p: &Pkt, ip_ident: Option<u16>) -> Datagram<'_> {
    Datagram {
        src_ip: p.tx.src_ip,
        dst_ip: p.tx.dst_ip,
        src_port: p.tx.src_port,
        dst_port: p.tx.dst_port,
        ecn: p.tx.ecn,
        dscp: p.tx.dscp,
        hop_limit: p.tx.hop_limit,
        ip_ident,
        payload: &p.data,
    }
}

/// A link that cannot see the IPv4 identification (a kernel socket: `ip_ident: None`): the
/// engine solves for the identification that makes the ICRC verify (Annex A17.3.3 covers it),
/// accepts the packet sent with any identification and drops a corrupted one; a link that
/// reports the identification gets the full 32-bit check.
#[test]
fn ipv4_icrc_is_solved_for_when_the_link_cannot_see_the_identification() {
    let (mut f, _a, b, pkt) = setup();
    let sent = pkt.resealed_for_ident(0x1234);
    assert_ne!(sent.data, pkt.data);
    // Corrupted: one payload bit (after BTH and RETH).
    let mut bad = sent.clone();
    bad.data[12 + 16 + 5] ^= 0x10;
    f.node_mut(b.node).handle_datagram(t_us(1), &at(&bad, None));
    // The identification reported wrongly by a link that claims to know it.
    f.node_mut(b.node)
        .handle_datagram(t_us(1), &at(&sent, Some(hca::engine::IPV4_IDENT)));
    let c = f.node(b.node).counters();
    assert_eq!((c.icrc_errors, c.drops(DropReason::Icrc)), (2, 2), "{c:?}");
    assert_eq!((c.icrc_ident_solved, c.rcvd_pkts), (0, 0), "{c:?}");
    assert!(
        transmit(&mut f, &b, t_us(1)).is_empty(),
        "nothing to answer"
    );
    // Identification unknown: solved, accepted, acknowledged.
    f.node_mut(b.node)
        .handle_datagram(t_us(2), &at(&sent, None));
    let c = f.node(b.node).counters();
    assert_eq!((c.icrc_ident_solved, c.rcvd_pkts), (1, 1), "{c:?}");
    assert_eq!(c.total_drops(), 2, "{c:?}");
    let acks = transmit(&mut f, &b, t_us(2));
    assert!(acks.iter().any(|p| p.aeth().is_some()), "no ACK");
}

#[test]
fn oversized_datagrams_without_an_ipv4_identification_never_panic() {
    // A link that cannot see the IPv4 identification has the ICRC solved for it; a 70 000-byte
    // UDP payload (impossible on a wire, possible through the API) must still be judged, never
    // panic.
    for qp_type in [hca::QpType::Ud, hca::QpType::Rc, hca::QpType::Uc] {
        let o = Opts {
            qp_type,
            ..Opts::default()
        };
        let (mut f, a, b) = pair(&o);
        post_recv(&mut f, &b, 1, &[b.sge(0, 1 << 20)]);
        let opcode = match qp_type {
            hca::QpType::Ud => Opcode::UdSendOnly,
            hca::QpType::Rc => Opcode::RcSendOnly,
            hca::QpType::Uc => Opcode::UcSendOnly,
        };
        let ext = ExtReprs {
            deth: (qp_type == hca::QpType::Ud).then_some(roce::deth::Repr {
                qkey: 0x1111_1111,
                src_qpn: a.qpn,
            }),
            ..ExtReprs::default()
        };
        // Built with 4 payload bytes, then grown to 70 000 (pad 0, the ICRC left stale).
        let mut p = craft(&a, &b, opcode, A_PSN, ext, &[0x11; 4]);
        let at = p.data.len() - 4;
        p.data
            .splice(at..at, std::iter::repeat_n(0x11u8, 70_000 - 4));
        f.node_mut(b.node).handle_datagram(
            t_us(1),
            &hca::Datagram {
                src_ip: p.tx.src_ip,
                dst_ip: p.tx.dst_ip,
                src_port: p.tx.src_port,
                dst_port: 4791,
                ecn: roce::ipv4::Ecn::Ce,
                dscp: 0,
                hop_limit: 64,
                ip_ident: None,
                payload: &p.data,
            },
        );
        let _ = transmit(&mut f, &b, t_us(1));
        let wcs = poll(&mut f, &b);
        assert!(
            wcs.iter()
                .all(|w| w.status != WcStatus::Success || w.byte_len <= 70_040),
            "{qp_type:?}: {wcs:?}"
        );
    }
}

#[test]
fn cnp_for_an_unknown_qp_is_dropped_and_counted() {
    let (mut f, a, b) = pair(&Opts::default());
    let mut ghost = Peer {
        node: b.node,
        ip: b.ip,
        pd: b.pd,
        cq: b.cq,
        qpn: 0x00ab_cdef,
        mem: b.mem.clone(),
        mr: b.mr.clone(),
    };
    let cnp = |to: &Peer| {
        let transport = TransportRepr {
            bth: roce::cnp::Repr {
                dest_qpn: to.qpn,
                pkey: 0xffff,
            }
            .bth_repr(),
            ext: ExtReprs::default(),
        };
        try_build(tx_between(&a, to), transport, &[0; roce::cnp::PAYLOAD_LEN]).unwrap()
    };
    deliver(&mut f, &b, &cnp(&ghost), t_us(1));
    assert_eq!(drops(&f, &b, DropReason::Qpn), 1);
    ghost.qpn = 0; // QP0 (the SMI) is not offered either
    deliver(&mut f, &b, &cnp(&ghost), t_us(1));
    assert_eq!(drops(&f, &b, DropReason::Qpn), 2);
    ghost.qpn = 1; // QP1, the GSI, takes only UD SEND ONLY (tests/engine_gsi.rs)
    deliver(&mut f, &b, &cnp(&ghost), t_us(1));
    assert_eq!(drops(&f, &b, DropReason::QpType), 1);
    assert_eq!(f.node(b.node).counters().cnp_rcvd, 0);
    deliver(&mut f, &b, &cnp(&b), t_us(1));
    assert_eq!(f.node(b.node).counters().cnp_rcvd, 1);
}

#[test]
fn packets_to_a_qp_in_reset_or_init_are_dropped() {
    let (mut f, _a, b, pkt) = setup();
    let attr = hca::QpAttr {
        qp_state: QpState::Reset,
        ..hca::QpAttr::default()
    };
    f.node_mut(b.node)
        .modify_qp(b.qpn, &attr, hca::QpAttrMask::STATE)
        .unwrap();
    deliver(&mut f, &b, &pkt, t_us(1));
    assert_eq!(drops(&f, &b, DropReason::QpState), 1);
}

#[test]
fn requests_to_a_qp_in_err_and_responses_to_a_qp_in_rtr_are_dropped() {
    let (mut f, a, b) = pair(&Opts::default());
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    f.node_mut(b.node)
        .modify_qp(b.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    let w = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 8),
        &[1; 8],
    );
    deliver(&mut f, &b, &w, t_us(1));
    assert_eq!(drops(&f, &b, DropReason::QpState), 1);
    assert!(transmit(&mut f, &b, t_us(1)).is_empty());
    assert_eq!(b.read(0, 8), vec![0; 8]);
    // A third QP on A's node, left in RTR: a response to it is dropped.
    let c = {
        let h = f.node_mut(a.node);
        let qpn = h
            .create_qp(
                a.pd,
                &hca::QpInitAttr {
                    qp_type: hca::QpType::Rc,
                    send_cq: a.cq,
                    recv_cq: a.cq,
                    srq: None,
                    cap: hca::QpCap {
                        max_send_wr: 4,
                        max_recv_wr: 4,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .unwrap();
        Peer {
            node: a.node,
            ip: a.ip,
            pd: a.pd,
            cq: a.cq,
            qpn,
            mem: a.mem.clone(),
            mr: a.mr.clone(),
        }
    };
    bring_up_to_rtr(&mut f, &c, &b, 5);
    let resp = craft(&b, &c, Opcode::RcAcknowledge, 5, aeth_ext(ack()), &[]);
    let before = drops(&f, &c, DropReason::QpState);
    deliver(&mut f, &c, &resp, t_us(2));
    assert_eq!(drops(&f, &c, DropReason::QpState), before + 1);
}

#[test]
fn ud_wrong_qkey_is_dropped_and_controlled_qkey_uses_the_qps_own() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 8)], ud_send(ah, &b, 0x2222)),
    );
    let wrong = transmit(&mut f, &a, t_us(0));
    assert_eq!(wrong[0].parsed().transport.ext.deth.unwrap().qkey, 0x2222);
    deliver(&mut f, &b, &wrong[0], t_us(1));
    assert!(poll(&mut f, &b).is_empty());
    assert_eq!(f.node(b.node).counters().drops(hca::DropReason::Qkey), 1);
    assert_eq!(
        f.node(b.node)
            .context()
            .query_port(1)
            .unwrap()
            .qkey_viol_cntr,
        1
    );
    // High bit set: "use my QP's Q_Key" (IBTA vol. 1 §10.2.4), 0x1111_1111 on both sides.
    post_send(
        &mut f,
        &a,
        &send_wr(2, &[a.sge(0, 8)], ud_send(ah, &b, 0x8000_0000)),
    );
    let right = transmit(&mut f, &a, t_us(2));
    assert_eq!(
        right[0].parsed().transport.ext.deth.unwrap().qkey,
        0x1111_1111
    );
    deliver(&mut f, &b, &right[0], t_us(3));
    assert_eq!(poll(&mut f, &b).len(), 1);
}

// ---- random datagrams ----

fn arb_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        Just(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
        Just(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
        any::<[u8; 4]>().prop_map(|b| IpAddr::V4(b.into())),
        any::<[u8; 16]>().prop_map(|b| IpAddr::V6(b.into())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes and metadata, or a valid packet with a few bytes changed, never panic
    /// the engine and leave it working.
    #[test]
    fn arbitrary_datagrams_never_panic_and_leave_the_connection_working(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        src in arb_ip(),
        dst in arb_ip(),
        mutate_valid in any::<bool>(),
        ident in proptest::option::of(any::<u16>()),
        ecn in 0u8..4,
    ) {
        let (mut f, a, b, pkt) = setup();
        let mut payload = if mutate_valid { pkt.data.clone() } else { bytes };
        for (at, x) in flips {
            if !payload.is_empty() {
                let i = at % payload.len();
                payload[i] ^= x;
            }
        }
        for to in [&a, &b] {
            f.node_mut(to.node).handle_datagram(t_us(1), &Datagram {
                src_ip: src,
                dst_ip: dst,
                src_port: 0xc000,
                dst_port: 4791,
                ecn: roce::ipv4::Ecn::from_bits(ecn),
                dscp: 0,
                hop_limit: 64,
                ip_ident: ident,
                payload: &payload,
            });
            let _ = transmit(&mut f, to, t_us(2));
            let _ = poll(&mut f, to);
        }
        // The connection still works.
        deliver(&mut f, &b, &pkt, t_us(3));
        let _ = transmit(&mut f, &b, t_us(3));
    }
}

// ---- ECN marks and CNPs (IBTA Annex A17.9) ----

struct Recorder(Arc<Mutex<Vec<(Instant, u32)>>>);

impl RateControl for Recorder {
    fn on_cnp(&mut self, now: Instant, qpn: u32) {
        self.0.lock().unwrap().push((now, qpn));
    }
}

#[test]
fn data_packets_are_ecn_capable_and_ce_marks_are_answered_with_a_rate_limited_cnp() {
    let (mut f, a, b) = pair(&Opts::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    f.node_mut(a.node)
        .set_rate_control(Box::new(Recorder(seen.clone())));
    for i in 0..3 {
        let (id, sg, op) = write(&a, i, (0, 8), &b, 0);
        post_send(&mut f, &a, &send_wr(id, &sg, op));
    }
    let mut pkts = transmit(&mut f, &a, t_us(0));
    assert!(
        pkts.iter().all(|p| p.tx.ecn == Ecn::Ect0),
        "ECT(0) by default"
    );
    for p in &mut pkts {
        p.tx.ecn = Ecn::Ce;
    }
    deliver_all(&mut f, &b, &pkts, t_us(10));
    let out = transmit(&mut f, &b, t_us(10));
    let cnps: Vec<_> = out.iter().filter(|p| p.opcode() == Opcode::Cnp).collect();
    assert_eq!(cnps.len(), 1, "one CNP per 50 us per QP");
    let bth = cnps[0].parsed().transport.bth;
    assert_eq!(bth.dest_qpn, a.qpn, "addressed to the sender's QP");
    assert!(bth.becn);
    assert_eq!(cnps[0].tx.ecn, Ecn::NotEct);
    assert_eq!(cnps[0].tx.dscp, 48);
    let c = f.node(b.node).counters();
    assert_eq!((c.cnp_sent, c.cnp_suppressed), (1, 2));
    // After the interval, the next CE mark gets a CNP again.
    let (id, sg, op) = write(&a, 9, (0, 8), &b, 0);
    post_send(&mut f, &a, &send_wr(id, &sg, op));
    let mut late = transmit(&mut f, &a, t_us(100));
    late[0].tx.ecn = Ecn::Ce;
    deliver(&mut f, &b, &late[0], t_us(100));
    let out2 = transmit(&mut f, &b, t_us(100));
    assert_eq!(out2.iter().filter(|p| p.opcode() == Opcode::Cnp).count(), 1);
    // The sender counts the CNPs and tells its rate control.
    for p in out.iter().chain(&out2) {
        deliver(&mut f, &a, p, t_us(120));
    }
    assert_eq!(f.node(a.node).counters().cnp_rcvd, 2);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.as_slice(), &[(t_us(120), a.qpn), (t_us(120), a.qpn)]);
    assert_eq!(f.node(a.node).counters().total_drops(), 0);
}

#[test]
fn ce_marks_under_a_fabric_produce_cnps_and_traffic_completes() {
    let o = Opts {
        faults: hca::fabric::Faults {
            ce_mark: 0.5,
            ..hca::fabric::Faults::none()
        },
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..50 {
        let (id, sg, op) = write(&a, i, (0, 8), &b, 0);
        post_send(&mut f, &a, &send_wr(id, &sg, op));
    }
    let wcs = run_for_completions(&mut f, &a, 50, std::time::Duration::from_millis(10));
    assert!(wcs.iter().all(|w| w.status == hca::WcStatus::Success));
    assert!(f.stats().ce_marked > 0);
    assert!(f.node(b.node).counters().cnp_sent > 0);
    assert_eq!(
        f.node(a.node).counters().cnp_rcvd,
        f.node(b.node).counters().cnp_sent
    );
}
