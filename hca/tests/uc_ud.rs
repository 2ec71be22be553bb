//! UC and UD scenarios (IBTA vol. 1 §9.8.4, §9.8.5).

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use hca::ah::AhAttr;
use hca::{Gid, QpState, QpType, SendOp, UdDest, WcFlags, WcOpcode, WcStatus};
use roce::Opcode;

fn uc() -> Opts {
    Opts {
        qp_type: QpType::Uc,
        ..Opts::default()
    }
}

fn ud(ipv6: bool) -> Opts {
    Opts {
        qp_type: QpType::Ud,
        ipv6,
        ..Opts::default()
    }
}

#[test]
fn uc_send_and_write_complete_when_sent_without_acks() {
    let (mut f, a, b) = pair(&uc());
    a.write(0, &[7; 3000]);
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 3000)], SendOp::Send));
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(0, 100)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(10_000),
                rkey: b.mr.rkey(),
            },
        ),
    );
    let pkts = transmit(&mut f, &a, t_us(0));
    let ops: Vec<_> = pkts.iter().map(Pkt::opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::UcSendFirst,
            Opcode::UcSendMiddle,
            Opcode::UcSendLast,
            Opcode::UcRdmaWriteOnly
        ]
    );
    assert!(pkts.iter().all(|p| !p.parsed().transport.bth.ack_req));
    let wa = poll(&mut f, &a);
    assert_eq!(wa.len(), 2, "UC WRs complete once sent");
    deliver_all(&mut f, &b, &pkts, t_us(1));
    assert!(transmit(&mut f, &b, t_us(1)).is_empty(), "no ACKs on UC");
    let wb = poll(&mut f, &b);
    assert_eq!((wb[0].byte_len, wb[0].status), (3000, WcStatus::Success));
    assert_eq!(b.read(0, 3000), vec![7; 3000]);
    assert_eq!(b.read(10_000, 100), vec![7; 100]);
}

#[test]
fn uc_lost_packet_drops_the_rest_of_that_message_only() {
    let (mut f, a, b) = pair(&uc());
    a.write(0, &[1; 3000]);
    a.write(5000, &[2; 3000]);
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 3000)], SendOp::Send));
    post_send(&mut f, &a, &send_wr(2, &[a.sge(5000, 3000)], SendOp::Send));
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts.len(), 6);
    // The MIDDLE of the first message is lost.
    for (i, p) in pkts.iter().enumerate() {
        if i != 1 {
            deliver(&mut f, &b, p, t_us(1));
        }
    }
    let wb = poll(&mut f, &b);
    assert_eq!(wb.len(), 1, "only the second message arrived: {wb:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].byte_len),
        (1, 3000),
        "into the same receive WQE"
    );
    assert_eq!(b.read(0, 3000), vec![2; 3000]);
    assert_eq!(
        f.node(b.node)
            .counters()
            .drops(hca::DropReason::RequestDropped),
        1,
        "the LAST of the broken message"
    );
}

/// A UD address handle on `from` for `to`.
fn ah_to(f: &mut hca::fabric::Fabric, from: &Peer, to: &Peer) -> hca::AhHandle {
    f.node_mut(from.node)
        .create_ah(
            from.pd,
            &AhAttr {
                dgid: Gid::from(to.ip),
                sgid_index: 2,
                hop_limit: 17,
                traffic_class: 0x20,
                ..AhAttr::default()
            },
        )
        .unwrap()
}

fn ud_send(ah: hca::AhHandle, to: &Peer, qkey: u32) -> SendOp {
    SendOp::UdSend {
        dest: UdDest {
            ah,
            remote_qpn: to.qpn,
            remote_qkey: qkey,
        },
        imm_data: None,
    }
}

fn ud_receive_grh_layout(ipv6: bool) {
    let (mut f, a, b) = pair(&ud(ipv6));
    let ah = ah_to(&mut f, &a, &b);
    a.write(0, b"datagram payload");
    post_recv(&mut f, &b, 9, &[b.sge(0, 30), b.sge(1000, 100)]);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 16)], ud_send(ah, &b, 0x1111_1111)),
    );
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts[0].opcode(), Opcode::UdSendOnly);
    deliver(&mut f, &b, &pkts[0], t_us(1));
    let wb = poll(&mut f, &b);
    assert_eq!(wb.len(), 1);
    let wc = wb[0];
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
    assert_eq!(wc.byte_len, 40 + 16);
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(wc.src_qp, a.qpn);
    let mut buf = b.read(0, 30);
    buf.extend(b.read(1000, 100));
    let (grh, payload) = buf.split_at(40);
    assert_eq!(&payload[..16], b"datagram payload");
    match (a.ip, b.ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            assert_eq!(&grh[..20], &[0; 20], "IPv4: the first 20 bytes are zero");
            let ip = roce::ipv4::Packet::new_unchecked(&grh[20..]);
            assert!(ip.verify_checksum());
            assert_eq!(ip.version(), 4);
            assert_eq!(ip.src_addr(), src);
            assert_eq!(ip.dst_addr(), dst);
            assert_eq!(ip.protocol(), roce::ipv4::IpProtocol::Udp);
            assert_eq!(ip.hop_limit(), 17);
            assert_eq!(ip.dscp(), 0x20 >> 2);
            assert_eq!(usize::from(ip.total_len()), 20 + 8 + pkts[0].data.len());
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let ip = roce::ipv6::Packet::new_unchecked(grh);
            assert_eq!(ip.version(), 6);
            assert_eq!(ip.src_addr(), src);
            assert_eq!(ip.dst_addr(), dst);
            assert_eq!(ip.hop_limit(), 17);
            assert_eq!(usize::from(ip.payload_len()), 8 + pkts[0].data.len());
        }
        _ => unreachable!(),
    }
}

#[test]
fn ud_receive_grh_layout_ipv4_header_at_offset_20() {
    ud_receive_grh_layout(false);
}

#[test]
fn ud_receive_grh_layout_ipv6_header_at_offset_0() {
    ud_receive_grh_layout(true);
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

#[test]
fn ud_message_larger_than_the_receive_buffer_is_dropped_silently_and_the_qp_stays_in_rts() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    post_recv(&mut f, &b, 1, &[b.sge(0, 40 + 99)]);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 100)], ud_send(ah, &b, 0x1111_1111)),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(2, &[a.sge(0, 99)], ud_send(ah, &b, 0x1111_1111)),
    );
    let pkts = transmit(&mut f, &a, t_us(0));
    deliver_all(&mut f, &b, &pkts, t_us(1));
    let wb = poll(&mut f, &b);
    assert_eq!(
        wb.len(),
        1,
        "the 100-byte datagram found the buffer too small"
    );
    assert_eq!(
        (wb[0].wr_id, wb[0].byte_len),
        (1, 139),
        "the WQE took the next one"
    );
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Rts
    );
}

#[test]
fn ud_datagram_without_a_receive_wqe_is_dropped() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 10)], ud_send(ah, &b, 0x1111_1111)),
    );
    let pkts = transmit(&mut f, &a, t_us(0));
    deliver(&mut f, &b, &pkts[0], t_us(1));
    assert!(transmit(&mut f, &b, t_us(1)).is_empty(), "no RNR NAK on UD");
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Rts
    );
}

#[test]
fn ud_send_larger_than_the_pmtu_completes_with_loc_len_err() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    // The port's MTU is 4096 (Ethernet MTU 9000).
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 4097)], ud_send(ah, &b, 0x1111_1111)),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(2, &[a.sge(0, 8)], ud_send(ah, &b, 0x1111_1111)),
    );
    assert!(transmit(&mut f, &a, t_us(0)).is_empty());
    let wa = poll(&mut f, &a);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        f.node(a.node).context().qp(a.qpn).unwrap().state(),
        QpState::Sqe
    );
    // SQE -> RTS recovers (IBTA vol. 1 §10.3.1).
    let attr = hca::QpAttr {
        qp_state: QpState::Rts,
        ..hca::QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(a.qpn, &attr, hca::QpAttrMask::STATE)
        .unwrap();
    post_recv(&mut f, &b, 5, &[b.sge(0, 100)]);
    post_send(
        &mut f,
        &a,
        &send_wr(3, &[a.sge(0, 8)], ud_send(ah, &b, 0x1111_1111)),
    );
    let wb = run_for_completions(&mut f, &b, 1, Duration::from_millis(1));
    assert_eq!(wb[0].status, WcStatus::Success);
}

#[test]
fn ud_send_with_immediate() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    post_recv(&mut f, &b, 1, &[b.sge(0, 100)]);
    let op = SendOp::UdSend {
        dest: UdDest {
            ah,
            remote_qpn: b.qpn,
            remote_qkey: 0x1111_1111,
        },
        imm_data: Some(77),
    };
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 8)], op));
    let wb = run_for_completions(&mut f, &b, 1, Duration::from_millis(1));
    assert_eq!(wb[0].imm_data, Some(77));
    assert!(wb[0].wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
}

#[test]
fn ud_receive_wqe_whose_sge_fails_its_lkey_check_is_loc_qp_op_err_and_the_qp_enters_err() {
    // rxe ERR_MALFORMED_WQE (class A): the receive WQE completes in error and the QP enters ERR;
    // UD acknowledges nothing, so no NAK goes out.
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    let bad = hca::Sge {
        lkey: b.mr.lkey() ^ 1,
        ..b.sge(0, 4096)
    };
    post_recv(&mut f, &b, 1, &[bad]);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 10)], ud_send(ah, &b, 0x1111_1111)),
    );
    let pkts = transmit(&mut f, &a, t_us(0));
    deliver(&mut f, &b, &pkts[0], t_us(1));
    assert!(transmit(&mut f, &b, t_us(1)).is_empty(), "no NAK on UD");
    let wb = poll(&mut f, &b);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocQpOpErr)]
    );
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Err
    );
    assert!(b.read(0, 4096).iter().all(|&x| x == 0));
}
