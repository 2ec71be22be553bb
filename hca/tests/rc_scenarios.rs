//! RC scenarios, each named after the rule it checks (IBTA vol. 1 ch. 9; rxe behaviour). The tests
//! drive the link by hand: they take packets from one engine, choose which to deliver, replay or
//! rewrite them, and look at what the other engine answers.

mod common;

use std::time::Duration;

use common::work_requests::*;
use common::*;
use hca::AsyncEventType;
use hca::{QpState, SendOp, WcOpcode, WcStatus};
use roce::aeth::{NakCode, Syndrome};
use roce::Opcode;

#[test]
fn duplicate_write_after_read_is_acked_with_the_writes_psn_not_the_reads() {
    let (mut f, a, b) = pair(&opts_with_psn(30));
    post(&mut f, &a, write(&a, 1, (0, 100), &b, 0));
    let w = transmit(&mut f, &a, t_us(0));
    assert_eq!(
        (w.len(), w[0].psn(), w[0].opcode()),
        (1, 30, Opcode::RcRdmaWriteOnly)
    );
    deliver(&mut f, &b, &w[0], t_us(1));
    let ack = transmit(&mut f, &b, t_us(1));
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].psn(), 30);
    deliver(&mut f, &a, &ack[0], t_us(2));
    post(&mut f, &a, read(&a, 2, (4096, 64), &b, 0));
    let r = transmit(&mut f, &a, t_us(2));
    assert_eq!((r[0].psn(), r[0].opcode()), (31, Opcode::RcRdmaReadRequest));
    deliver(&mut f, &b, &r[0], t_us(3));
    let resp = transmit(&mut f, &b, t_us(3));
    assert_eq!(
        (resp[0].psn(), resp[0].opcode()),
        (31, Opcode::RcRdmaReadResponseOnly)
    );
    // The WRITE at PSN 30 comes again (a retransmission or a duplicate on the wire).
    deliver(&mut f, &b, &w[0], t_us(4));
    let dup_ack = transmit(&mut f, &b, t_us(4));
    assert_eq!(dup_ack.len(), 1);
    assert_eq!(dup_ack[0].opcode(), Opcode::RcAcknowledge);
    assert_eq!(
        dup_ack[0].psn(),
        30,
        "an ACK for 31 would complete the READ without its data"
    );
    assert_eq!(f.node(b.node).counters().duplicate_request, 1);
    // Had the READ response been lost, the requester must still get the data: the ACK for 30
    // does not complete the READ, a retransmitted READ is answered again.
    deliver(&mut f, &a, &dup_ack[0], t_us(5));
    assert_eq!(poll(&mut f, &a).len(), 1, "only the WRITE completed");
    deliver(&mut f, &a, &resp[0], t_us(6));
    let wcs = poll(&mut f, &a);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
}

#[test]
fn read_replayed_during_a_multi_packet_write_does_not_reset_the_write() {
    let (mut f, a, b) = pair(&opts_with_psn(10));
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    a.write(0, &data);
    b.write(50_000, &[0xab; 64]);
    post(&mut f, &a, read(&a, 1, (10_000, 64), &b, 50_000));
    post(&mut f, &a, write(&a, 2, (0, 3000), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    let ops: Vec<_> = pkts.iter().map(|p| (p.psn(), p.opcode())).collect();
    assert_eq!(
        ops,
        [
            (10, Opcode::RcRdmaReadRequest),
            (11, Opcode::RcRdmaWriteFirst),
            (12, Opcode::RcRdmaWriteMiddle),
            (13, Opcode::RcRdmaWriteLast),
        ]
    );
    deliver(&mut f, &b, &pkts[0], t_us(1));
    deliver(&mut f, &b, &pkts[1], t_us(1));
    let first = transmit(&mut f, &b, t_us(1));
    assert_eq!(
        first.len(),
        1,
        "the READ response; WRITE FIRST asks for no ACK"
    );
    // The READ request comes again while the WRITE is half done.
    deliver(&mut f, &b, &pkts[0], t_us(2));
    deliver(&mut f, &b, &pkts[2], t_us(3));
    deliver(&mut f, &b, &pkts[3], t_us(3));
    assert_eq!(b.read(0, 3000), data, "the WRITE went on where it was");
    let out = transmit(&mut f, &b, t_us(3));
    let resp: Vec<_> = out.iter().map(|p| (p.psn(), p.opcode())).collect();
    assert_eq!(
        resp,
        [
            (10, Opcode::RcRdmaReadResponseOnly),
            (13, Opcode::RcAcknowledge)
        ],
        "the replayed READ is answered again, and the WRITE acknowledged"
    );
    assert_eq!(out[0].data, first[0].data, "the same response again");
    assert_eq!(
        out[1].aeth().unwrap().syndrome,
        Syndrome::Ack {
            credit: roce::aeth::AckCredit::INVALID
        }
    );
    assert_eq!(f.node(b.node).counters().duplicate_request, 1);
    deliver_all(&mut f, &a, &out, t_us(4));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(a.read(10_000, 64), vec![0xab; 64]);
}

#[test]
fn msn_counts_a_three_packet_write_once_then_the_send() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 2500), &b, 0));
    post_recv(&mut f, &b, 9, &[b.sge(100_000, 100)]);
    post_send(&mut f, &a, &send_wr(2, &[a.sge(0, 10)], SendOp::Send));
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts.len(), 4);
    let mut msns = Vec::new();
    for p in &pkts {
        deliver(&mut f, &b, p, t_us(1));
        for r in transmit(&mut f, &b, t_us(1)) {
            msns.push((r.psn(), r.aeth().unwrap().msn));
        }
    }
    let first = pkts[0].psn();
    assert_eq!(
        msns,
        [(first + 2, 1), (first + 3, 2)],
        "MSN 1 after the WRITE, 2 after the SEND"
    );
}

#[test]
fn write_middle_shorter_than_the_pmtu_is_nakked_as_an_invalid_request() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 3000), &b, 0));
    post(&mut f, &a, write(&a, 2, (0, 10), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts[1].opcode(), Opcode::RcRdmaWriteMiddle);
    let p = pkts[1].parsed();
    let short = pkts[1].rebuilt(p.transport, &p.payload[..1000]);
    deliver(&mut f, &b, &pkts[0], t_us(1));
    deliver(&mut f, &b, &short, t_us(1));
    let nak = transmit(&mut f, &b, t_us(1));
    assert_eq!(nak.len(), 1);
    assert_eq!(nak[0].psn(), pkts[1].psn());
    assert_eq!(
        nak[0].aeth().unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Err
    );
    let ev = f.node_mut(b.node).poll_event().unwrap();
    assert_eq!(ev.event_type, AsyncEventType::QpReqErr);
    deliver(&mut f, &a, &nak[0], t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn out_of_sequence_requests_get_one_psn_sequence_nak_per_gap() {
    let (mut f, a, b) = pair(&opts_with_psn(40));
    for i in 0..5 {
        post(&mut f, &a, write(&a, i, (0, 8), &b, 0));
    }
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts.len(), 5);
    // PSN 40 arrives, 41 is lost, 42..44 arrive.
    deliver(&mut f, &b, &pkts[0], t_us(1));
    for p in &pkts[2..] {
        deliver(&mut f, &b, p, t_us(1));
    }
    let out = transmit(&mut f, &b, t_us(1));
    let seen: Vec<_> = out
        .iter()
        .map(|p| (p.psn(), p.aeth().unwrap().syndrome))
        .collect();
    assert_eq!(
        seen,
        [
            (
                40,
                Syndrome::Ack {
                    credit: roce::aeth::AckCredit::INVALID
                }
            ),
            (41, Syndrome::Nak(NakCode::PsnSequenceError))
        ]
    );
    assert_eq!(f.node(b.node).counters().out_of_seq_request, 3);
    // Go-back-N: the requester resends from 41.
    deliver_all(&mut f, &a, &out, t_us(2));
    assert_eq!(f.node(a.node).counters().rcvd_seq_err, 1);
    let resent = transmit(&mut f, &a, t_us(2));
    assert_eq!(
        resent.iter().map(Pkt::psn).collect::<Vec<_>>(),
        [41, 42, 43, 44]
    );
    deliver_all(&mut f, &b, &resent, t_us(3));
    let ack = transmit(&mut f, &b, t_us(3));
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].psn(), 44);
    deliver(&mut f, &a, &ack[0], t_us(4));
    assert_eq!(poll(&mut f, &a).len(), 5);
}

#[test]
fn duplicate_atomic_is_answered_from_the_saved_result_not_executed_again() {
    let (mut f, a, b) = pair(&Opts::default());
    b.write(64, &5u64.to_ne_bytes());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(64),
                rkey: b.mr.rkey(),
                add: 10,
            },
        ),
    );
    let req = transmit(&mut f, &a, t_us(0));
    deliver(&mut f, &b, &req[0], t_us(1));
    let first = transmit(&mut f, &b, t_us(1));
    deliver(&mut f, &b, &req[0], t_us(2));
    deliver(&mut f, &b, &req[0], t_us(2));
    let again = transmit(&mut f, &b, t_us(2));
    assert_eq!(again.len(), 1, "one replay queued for both duplicates");
    assert_eq!(b.read(64, 8), 15u64.to_ne_bytes(), "executed exactly once");
    for r in [&first[0], &again[0]] {
        assert_eq!(r.opcode(), Opcode::RcAtomicAcknowledge);
        assert_eq!(
            r.parsed()
                .transport
                .ext
                .atomic_ack_eth
                .unwrap()
                .orig_remote_data,
            5
        );
    }
    deliver(&mut f, &a, &again[0], t_us(3));
    deliver(&mut f, &a, &first[0], t_us(3));
    let wcs = poll(&mut f, &a);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(a.read(0, 8), 5u64.to_ne_bytes());
}

#[test]
fn misaligned_atomic_is_nakked_as_an_invalid_request() {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 8)],
            SendOp::AtomicCmpAndSwp {
                remote_addr: b.addr(64),
                rkey: b.mr.rkey(),
                compare: 0,
                swap: 1,
            },
        ),
    );
    let req = transmit(&mut f, &a, t_us(0));
    let p = req[0].parsed();
    let mut t = p.transport;
    let mut eth = t.ext.atomic_eth.unwrap();
    eth.virtual_address += 4;
    t.ext.atomic_eth = Some(eth);
    deliver(&mut f, &b, &req[0].rebuilt(t, &[]), t_us(1));
    let nak = transmit(&mut f, &b, t_us(1));
    assert_eq!(
        nak[0].aeth().unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    deliver(&mut f, &a, &nak[0], t_us(2));
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn reth_dma_length_over_2_31_is_nakked_as_an_invalid_request() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 16), &b, 0));
    let req = transmit(&mut f, &a, t_us(0));
    let p = req[0].parsed();
    let mut t = p.transport;
    let mut reth = t.ext.reth.unwrap();
    reth.dma_len = (1 << 31) + 1;
    t.ext.reth = Some(reth);
    deliver(&mut f, &b, &req[0].rebuilt(t, p.payload), t_us(1));
    let nak = transmit(&mut f, &b, t_us(1));
    assert_eq!(
        nak[0].aeth().unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
}

#[test]
fn read_outside_the_region_is_rem_access_err() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, read(&a, 1, (0, 64), &b, b.mr.length() - 32));
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_millis(5));
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
}

#[test]
fn write_with_immediate_consumes_a_receive_wqe_with_the_write_length() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 33, &[]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 2000)],
            SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
                imm_data: 0x0102_0304,
            },
        ),
    );
    let wcs = run_for_completions(&mut f, &b, 1, Duration::from_millis(5));
    assert_eq!(wcs[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].byte_len, wcs[0].imm_data),
        (33, 2000, Some(0x0102_0304))
    );
}

#[test]
fn send_with_invalidate_invalidates_the_rkey_at_the_responder() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 64)]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 16)],
            SendOp::SendWithInv {
                invalidate_rkey: b.mr.rkey(),
            },
        ),
    );
    let wcs = run_for_completions(&mut f, &b, 1, Duration::from_millis(5));
    assert_eq!(wcs[0].invalidated_rkey, Some(b.mr.rkey()));
    assert!(wcs[0].wc_flags.contains(hca::WcFlags::WITH_INV));
    assert!(f
        .node(b.node)
        .context()
        .mrs()
        .lookup_rkey(b.mr.rkey())
        .unwrap()
        .is_invalidated());
    // The key no longer works for the peer.
    post(&mut f, &a, write(&a, 2, (0, 8), &b, 0));
    let wa = run_for_completions(&mut f, &a, 2, Duration::from_millis(5));
    assert_eq!(wa[1].status, WcStatus::RemAccessErr);
}

#[test]
fn send_longer_than_the_receive_buffer_is_an_invalid_request_and_a_local_length_error() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 100)]);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 101)], SendOp::Send));
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(5));
    assert_eq!(wa[0].status, WcStatus::RemInvReqErr);
    let wb = poll(&mut f, &b);
    assert_eq!((wb[0].wr_id, wb[0].status), (1, WcStatus::LocLenErr));
}

#[test]
fn srq_feeds_receives() {
    let o = Opts::default();
    let mut f = hca::fabric::Fabric::new(1, o.faults);
    let a = side(&mut f, 1, A_IOVA, &o);
    let b = side(&mut f, 2, B_IOVA, &o);
    // Replace B's QP by one on an SRQ.
    let h = f.node_mut(b.node);
    let srq = h
        .create_srq(
            b.pd,
            &hca::SrqAttr {
                max_wr: 16,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let qpn = h
        .create_qp(
            b.pd,
            &hca::QpInitAttr {
                qp_type: hca::QpType::Rc,
                send_cq: b.cq,
                recv_cq: b.cq,
                srq: Some(srq),
                cap: hca::QpCap {
                    max_send_wr: 8,
                    max_recv_wr: 0,
                    max_send_sge: 1,
                    max_recv_sge: 0,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    let b = Peer { qpn, ..b };
    bring_up(&mut f, &a, &b, 1, 2, &o);
    bring_up(&mut f, &b, &a, 2, 1, &o);
    for i in 0..3 {
        f.node_mut(b.node)
            .post_srq_recv(
                srq,
                &hca::RecvWr {
                    wr_id: 100 + i,
                    sg_list: &[b.sge(i * 4096, 4096)],
                },
            )
            .unwrap();
    }
    a.write(0, b"hello srq");
    for i in 0..3 {
        post_send(&mut f, &a, &send_wr(i, &[a.sge(0, 9)], SendOp::Send));
    }
    let wcs = run_for_completions(&mut f, &b, 3, Duration::from_millis(5));
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [100, 101, 102]
    );
    assert_eq!(b.read(8192, 9), b"hello srq");
}
