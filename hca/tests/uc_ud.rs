//! UC and UD scenarios (IBTA vol. 1 §9.8.4, §9.8.5).

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::uc_ud::*;
use common::*;

use hca::{QpState, SendOp, UdDest, WcFlags, WcOpcode, WcStatus};
use roce::Opcode;

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
