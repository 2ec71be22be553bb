//! Receive validation: every check drops, counts under its own reason, and never panics; random
//! bytes and random metadata cannot hurt the engine.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::*;
use hca::{Datagram, DropReason, QpState, SendOp};
use proptest::prelude::*;

/// A valid packet from A to B (an RDMA WRITE ONLY) and the pair.
fn setup() -> (hca::fabric::Fabric, Peer, Peer, Pkt) {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 64)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
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
fn unchecked_icrc_is_counted_when_the_link_cannot_see_the_ipv4_ident() {
    let (mut f, _a, b, pkt) = setup();
    f.node_mut(b.node).handle_datagram(
        t_us(1),
        &Datagram {
            src_ip: pkt.tx.src_ip,
            dst_ip: pkt.tx.dst_ip,
            src_port: pkt.tx.src_port,
            dst_port: pkt.tx.dst_port,
            ecn: pkt.tx.ecn,
            dscp: pkt.tx.dscp,
            hop_limit: pkt.tx.hop_limit,
            ip_ident: None,
            payload: &pkt.data,
        },
    );
    let c = f.node(b.node).counters();
    assert_eq!((c.icrc_unchecked, c.rcvd_pkts), (1, 1));
}

#[test]
fn a_small_transmit_buffer_loses_nothing() {
    let (mut f, a, _b) = pair(&Opts::default());
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 2000)], SendOp::Send));
    let mut small = [0u8; 100];
    assert!(f
        .node_mut(a.node)
        .poll_transmit(t_us(0), &mut small)
        .is_none());
    assert_eq!(f.node(a.node).counters().send_err, 1);
    assert_eq!(
        transmit(&mut f, &a, t_us(0)).len(),
        2,
        "both packets, later"
    );
}

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
    fn arbitrary_datagrams_never_panic(
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
