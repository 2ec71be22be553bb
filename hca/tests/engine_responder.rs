//! The responder (`engine/responder.rs`, rxe `rxe_resp.c`): its checks in rxe's order, each with
//! the NAK or completion status of its IBTA error class (IBTA vol. 1 §9.7.5, §9.9.3 table 59):
//! PSN sequence errors and duplicates, opcode sequence and lengths, keys, bounds and access
//! rights, responder resources; the responses it owes and their order; receive WQEs, SRQs and RNR
//! NAKs; the UC and UD responders; and when ACKs leave (coalesced, delayed). Most tests drive the
//! link by hand, or craft what a lying peer would send, and look at what the responder answers.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::crafted_packets::*;
use common::uc_ud::*;
use common::work_requests::*;
use common::*;
use gpu_p2p::Memory;
use hca::{
    AccessFlags, AsyncEventType, DropReason, QpAttr, QpAttrMask, QpState, RecvWr, SendOp, UdDest,
    WcFlags, WcOpcode, WcStatus,
};
use roce::aeth::{NakCode, Syndrome};
use roce::packet::ExtReprs;
use roce::Opcode;

// ---- PSNs: sequence errors and duplicates (IBTA vol. 1 §9.7.5.1) ----

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
fn psn_just_under_half_the_space_ahead_is_a_sequence_error_and_beyond_it_a_duplicate() {
    let (mut f, a, b) = pair(&Opts::default());
    let w = |psn: u32| {
        craft(
            &a,
            &b,
            Opcode::RcRdmaWriteOnly,
            psn & 0xff_ffff,
            reth_ext(b.addr(0), b.mr.rkey(), 8),
            &[1; 8],
        )
    };
    deliver(&mut f, &b, &w(A_PSN + (1 << 23) - 1), t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::PsnSequenceError))]
    );
    // Half the space or more ahead is behind: a duplicate, acknowledged with the last
    // ACK-able PSN (one before the first expected), nothing written.
    deliver(&mut f, &b, &w(A_PSN + (1 << 23) + 1), t_us(2));
    assert_eq!(
        answers(&mut f, &b, t_us(2)),
        [(Opcode::RcAcknowledge, A_PSN - 1, Some(ack()))]
    );
    assert_eq!(b.read(0, 8), vec![0; 8]);
    assert_eq!(state(&f, &b), QpState::Rts);
}

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
        statuses(&wcs),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(a.read(10_000, 64), vec![0xab; 64]);
}

#[test]
fn duplicate_read_flood_is_answered_at_most_once_per_resource_at_a_time() {
    let (mut f, a, b) = pair(&Opts::default());
    b.write(0, &[0x77; 4 * PMTU]);
    let r = craft(
        &a,
        &b,
        Opcode::RcRdmaReadRequest,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 4 * PMTU as u32),
        &[],
    );
    for _ in 0..10_000 {
        deliver(&mut f, &b, &r, t_us(1));
    }
    let out = transmit(&mut f, &b, t_us(1));
    assert_eq!(out.len(), 4, "one stream of 4 responses, not 10 000");
    for _ in 0..10_000 {
        deliver(&mut f, &b, &r, t_us(2));
    }
    let again = transmit(&mut f, &b, t_us(2));
    assert_eq!(again.len(), 4, "one replay");
    assert_eq!(again[3].data, out[3].data);
    assert_eq!(state(&f, &b), QpState::Rts);
}

#[test]
fn duplicate_read_outside_the_original_request_is_dropped() {
    // rxe duplicate_request: a retried READ must ask for a part of the original, with its rkey.
    let (mut f, a, b) = pair(&Opts::default());
    let r = |va: u64, rkey: u32, len: u32| {
        craft(
            &a,
            &b,
            Opcode::RcRdmaReadRequest,
            A_PSN,
            reth_ext(va, rkey, len),
            &[],
        )
    };
    deliver(
        &mut f,
        &b,
        &r(b.addr(4096), b.mr.rkey(), 2 * PMTU as u32),
        t_us(1),
    );
    assert_eq!(transmit(&mut f, &b, t_us(1)).len(), 2);
    // A write after the READ moves the expected PSN on.
    let w = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN + 2,
        reth_ext(b.addr(0), b.mr.rkey(), 8),
        &[1; 8],
    );
    deliver(&mut f, &b, &w, t_us(2));
    assert_eq!(transmit(&mut f, &b, t_us(2)).len(), 1);
    let before = drops(&f, &b, DropReason::RequestDropped);
    for bad in [
        r(b.addr(4096), b.mr.rkey(), 3 * PMTU as u32), // longer than the original
        r(b.addr(0), b.mr.rkey(), 64),                 // before the original
        r(b.addr(4096), b.mr.rkey() ^ 0x100, 64),      // another rkey
        r(u64::MAX - 8, b.mr.rkey(), 64),              // wraps
    ] {
        deliver(&mut f, &b, &bad, t_us(3));
        assert!(transmit(&mut f, &b, t_us(3)).is_empty());
    }
    assert_eq!(drops(&f, &b, DropReason::RequestDropped), before + 4);
    assert_eq!(state(&f, &b), QpState::Rts);
    // A proper retry (the second half) is answered.
    let retry = craft(
        &a,
        &b,
        Opcode::RcRdmaReadRequest,
        A_PSN + 1,
        reth_ext(b.addr(4096 + PMTU as u64), b.mr.rkey(), PMTU as u32),
        &[],
    );
    deliver(&mut f, &b, &retry, t_us(4));
    assert_eq!(
        answers(&mut f, &b, t_us(4)),
        [(Opcode::RcRdmaReadResponseOnly, A_PSN + 1, Some(ack()))]
    );
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
fn new_reads_beyond_max_dest_rd_atomic_are_dropped_and_the_response_queue_stays_bounded() {
    let o = Opts {
        max_rd_atomic: 2,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..200u32 {
        let p = craft(
            &a,
            &b,
            Opcode::RcRdmaReadRequest,
            A_PSN + i,
            reth_ext(b.addr(u64::from(i) * 64), b.mr.rkey(), 64),
            &[],
        );
        deliver(&mut f, &b, &p, t_us(1));
    }
    // Two resources: two streams; the third READ is dropped (the requester exceeded
    // max_dest_rd_atomic); the fourth is out of sequence: one NAK, then silence.
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [
            (Opcode::RcRdmaReadResponseOnly, A_PSN, Some(ack())),
            (Opcode::RcRdmaReadResponseOnly, A_PSN + 1, Some(ack())),
            (
                Opcode::RcAcknowledge,
                A_PSN + 2,
                nak(NakCode::PsnSequenceError)
            ),
        ]
    );
    assert_eq!(state(&f, &b), QpState::Rts);
    assert!(drops(&f, &b, DropReason::RequestDropped) >= 1);
}

// ---- opcode sequence, lengths and the QP's access flags (class C: NAK invalid request) ----

#[test]
fn middle_or_last_without_a_first_is_nak_invalid_request() {
    for opcode in [
        Opcode::RcSendMiddle,
        Opcode::RcSendLast,
        Opcode::RcRdmaWriteMiddle,
        Opcode::RcRdmaWriteLast,
        Opcode::RcRdmaWriteLastWithImmediate,
    ] {
        let (mut f, a, b) = pair(&Opts::default());
        post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
        let mut ext = ExtReprs::default();
        if opcode == Opcode::RcRdmaWriteLastWithImmediate {
            ext.immdt = Some(roce::immdt::Repr::from_host_order(1));
        }
        let len = if opcode.position() == Some(roce::opcode::Position::Middle) {
            PMTU
        } else {
            10
        };
        let p = craft(&a, &b, opcode, A_PSN, ext, &vec![4; len]);
        deliver(&mut f, &b, &p, t_us(1));
        assert_eq!(
            answers(&mut f, &b, t_us(1)),
            [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))],
            "{opcode:?}"
        );
        assert_eq!(b.read(0, 4096), vec![0; 4096], "{opcode:?}");
    }
}

#[test]
fn send_first_interrupted_by_a_new_message_is_nak_invalid_request_and_fails_the_receive() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 8192)]);
    post_recv(&mut f, &b, 2, &[b.sge(8192, 8192)]);
    let first = craft(
        &a,
        &b,
        Opcode::RcSendFirst,
        A_PSN,
        ExtReprs::default(),
        &[1; PMTU],
    );
    let only = craft(
        &a,
        &b,
        Opcode::RcSendOnly,
        A_PSN + 1,
        ExtReprs::default(),
        &[2; 10],
    );
    deliver(&mut f, &b, &first, t_us(1));
    deliver(&mut f, &b, &only, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(
            Opcode::RcAcknowledge,
            A_PSN + 1,
            nak(NakCode::InvalidRequest)
        )]
    );
    let wcs = poll(&mut f, &b);
    let st = statuses(&wcs);
    assert_eq!(
        st,
        [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)],
        "the interrupted receive fails, the next is flushed"
    );
}

#[test]
fn write_only_whose_reth_length_exceeds_its_payload_is_nak_invalid_request() {
    // C9-92 / the module's rule "exactly the remainder in the end": an ONLY packet of one PMTU
    // cannot carry a 10 000-byte WRITE. Accepting it would report (for WRITE with immediate) a
    // byte_len of 10 000 for 1 024 bytes written.
    let (mut f, a, b) = pair(&Opts::default());
    let p = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 10_000),
        &[0x5a; PMTU],
    );
    deliver(&mut f, &b, &p, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))]
    );
    assert_eq!(state(&f, &b), QpState::Err);
    assert_eq!(b.read(0, PMTU), vec![0; PMTU], "nothing was written");
}

#[test]
fn write_last_before_the_dma_length_is_reached_is_nak_invalid_request() {
    let (mut f, a, b) = pair(&Opts::default());
    let first = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteFirst,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 3 * PMTU as u32),
        &[1; PMTU],
    );
    let last = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteLast,
        A_PSN + 1,
        ExtReprs::default(),
        &[2; PMTU],
    );
    deliver(&mut f, &b, &first, t_us(1));
    deliver(&mut f, &b, &last, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(
            Opcode::RcAcknowledge,
            A_PSN + 1,
            nak(NakCode::InvalidRequest)
        )]
    );
    assert_eq!(state(&f, &b), QpState::Err);
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
        statuses(&wcs),
        [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn write_with_immediate_shorter_than_its_reth_fails_the_receive_wqe_with_rem_inv_req_err() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 7, &[]);
    let mut ext = reth_ext(b.addr(0), b.mr.rkey(), 5000);
    ext.immdt = Some(roce::immdt::Repr::from_host_order(0x1234));
    let p = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnlyWithImmediate,
        A_PSN,
        ext,
        &[3; 100],
    );
    deliver(&mut f, &b, &p, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))]
    );
    let wcs = poll(&mut f, &b);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::RemInvReqErr));
    assert_eq!(b.read(0, 100), vec![0; 100]);
}

#[test]
fn zero_length_write_carrying_payload_is_nak_invalid_request() {
    let (mut f, a, b) = pair(&Opts::default());
    let w = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 0),
        &[1; 100],
    );
    deliver(&mut f, &b, &w, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))]
    );
    assert_eq!(b.read(0, 100), vec![0; 100]);
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

/// Runs one crafted WRITE (64 bytes at `va` with `rkey`) against a fresh B prepared by `setup`,
/// and returns B's answers.
fn one_write(
    setup: impl FnOnce(&mut hca::fabric::Fabric, &Peer) -> (u64, u32),
    opcode: Opcode,
) -> (Vec<(Opcode, u32, Option<Syndrome>)>, QpState) {
    let (mut f, a, b) = pair(&Opts::default());
    let (va, rkey) = setup(&mut f, &b);
    let (ext, payload): (ExtReprs, Vec<u8>) = match opcode {
        Opcode::RcRdmaWriteOnly => (reth_ext(va, rkey, 64), vec![7; 64]),
        Opcode::RcRdmaReadRequest => (reth_ext(va, rkey, 64), vec![]),
        _ => (atomic_ext(va, rkey), vec![]),
    };
    let p = craft(&a, &b, opcode, A_PSN, ext, &payload);
    deliver(&mut f, &b, &p, t_us(1));
    let out = answers(&mut f, &b, t_us(1));
    let st = state(&f, &b);
    (out, st)
}

#[test]
fn operation_the_qps_access_flags_do_not_allow_is_nak_invalid_request() {
    // rxe check_op_valid: RESPST_ERR_UNSUPPORTED_OPCODE, class C invalid request.
    for opcode in [
        Opcode::RcRdmaWriteOnly,
        Opcode::RcRdmaReadRequest,
        Opcode::RcFetchAdd,
    ] {
        let (out, st) = one_write(
            |f, b| {
                let attr = QpAttr {
                    qp_state: QpState::Rts,
                    qp_access_flags: AccessFlags::empty(),
                    ..QpAttr::default()
                };
                f.node_mut(b.node)
                    .modify_qp(b.qpn, &attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
                    .unwrap();
                (b.addr(0), b.mr.rkey())
            },
            opcode,
        );
        assert_eq!(
            (out, st),
            (
                vec![(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))],
                QpState::Err
            ),
            "{opcode:?}"
        );
    }
}

// ---- keys, bounds and region access (class C: NAK remote access error) ----

#[test]
fn rkey_of_a_deregistered_region_is_nak_remote_access_error_even_after_reregistration() {
    let access_error = vec![(
        Opcode::RcAcknowledge,
        A_PSN,
        nak(NakCode::RemoteAccessError),
    )];
    for opcode in [
        Opcode::RcRdmaWriteOnly,
        Opcode::RcRdmaReadRequest,
        Opcode::RcFetchAdd,
    ] {
        let (out, st) = one_write(
            |f, b| {
                let (mr, _mem) = extra_mr(f, b, 4096, 0x9000_0000, AccessFlags::all());
                f.node_mut(b.node).dereg_mr(mr.lkey()).unwrap();
                (mr.iova(), mr.rkey())
            },
            opcode,
        );
        assert_eq!(
            (out, st),
            (access_error.clone(), QpState::Err),
            "{opcode:?}"
        );
        // The region is registered again (very likely at the same table index): the old key's
        // low byte no longer matches.
        let (out, st) = one_write(
            |f, b| {
                let (mr, _mem) = extra_mr(f, b, 4096, 0x9000_0000, AccessFlags::all());
                f.node_mut(b.node).dereg_mr(mr.lkey()).unwrap();
                let (again, _mem2) = extra_mr(f, b, 4096, 0x9000_0000, AccessFlags::all());
                assert_ne!(again.rkey(), mr.rkey());
                (mr.iova(), mr.rkey())
            },
            opcode,
        );
        assert_eq!(
            (out, st),
            (access_error.clone(), QpState::Err),
            "{opcode:?}"
        );
    }
}

#[test]
fn remote_operation_on_a_region_without_that_access_is_nak_remote_access_error() {
    let access_error = vec![(
        Opcode::RcAcknowledge,
        A_PSN,
        nak(NakCode::RemoteAccessError),
    )];
    let all_but = |missing: AccessFlags| {
        let mut a = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        a.remove(missing);
        a
    };
    for (opcode, missing) in [
        (Opcode::RcRdmaWriteOnly, AccessFlags::REMOTE_WRITE),
        (Opcode::RcRdmaReadRequest, AccessFlags::REMOTE_READ),
        (Opcode::RcFetchAdd, AccessFlags::REMOTE_ATOMIC),
        (Opcode::RcCompareSwap, AccessFlags::REMOTE_ATOMIC),
    ] {
        let (out, st) = one_write(
            |f, b| {
                let (mr, mem) = extra_mr(f, b, 4096, 0x9000_0000, all_but(missing));
                drop(mem); // the engine holds its own reference
                (mr.iova(), mr.rkey())
            },
            opcode,
        );
        assert_eq!(
            (out, st),
            (access_error.clone(), QpState::Err),
            "{opcode:?}"
        );
    }
    // An lkey used as an rkey (a region without any remote access has rkey 0, so its lkey is
    // no rkey at all).
    let (out, st) = one_write(
        |f, b| {
            let (mr, mem) = extra_mr(f, b, 4096, 0x9000_0000, AccessFlags::LOCAL_WRITE);
            drop(mem); // the engine holds its own reference
            assert_eq!(mr.rkey(), 0);
            (mr.iova(), mr.lkey())
        },
        Opcode::RcRdmaWriteOnly,
    );
    assert_eq!((out, st), (access_error, QpState::Err));
}

#[test]
fn atomic_at_the_edges_of_a_region_is_checked_for_bounds_then_alignment() {
    let (mr_len, iova) = (4096u64, 0x9000_0000u64);
    let setup = |va: u64| {
        move |f: &mut hca::fabric::Fabric, b: &Peer| {
            let (mr, mem) = extra_mr(f, b, mr_len as usize, iova, AccessFlags::all());
            drop(mem); // the engine holds its own reference
            (va, mr.rkey())
        }
    };
    // The last word: fine.
    let (out, st) = one_write(setup(iova + mr_len - 8), Opcode::RcFetchAdd);
    assert_eq!(out, [(Opcode::RcAtomicAcknowledge, A_PSN, Some(ack()))]);
    assert_eq!(st, QpState::Rts);
    // Straddling the end: out of bounds.
    let (out, _) = one_write(setup(iova + mr_len - 4), Opcode::RcFetchAdd);
    assert_eq!(
        out,
        [(
            Opcode::RcAcknowledge,
            A_PSN,
            nak(NakCode::RemoteAccessError)
        )]
    );
    // Misaligned inside: invalid request.
    let (out, _) = one_write(setup(iova + 12), Opcode::RcCompareSwap);
    assert_eq!(
        out,
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))]
    );
    // u64::MAX - 7 (aligned, far outside).
    let (out, _) = one_write(setup(u64::MAX - 7), Opcode::RcFetchAdd);
    assert_eq!(
        out,
        [(
            Opcode::RcAcknowledge,
            A_PSN,
            nak(NakCode::RemoteAccessError)
        )]
    );
}

#[test]
fn write_whose_address_plus_length_wraps_u64_is_nak_remote_access_error() {
    let (mut f, a, b) = pair(&Opts::default());
    let p = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(u64::MAX - 15, b.mr.rkey(), 64),
        &[9; 64],
    );
    deliver(&mut f, &b, &p, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(
            Opcode::RcAcknowledge,
            A_PSN,
            nak(NakCode::RemoteAccessError)
        )]
    );
    assert_eq!(state(&f, &b), QpState::Err);
}

#[test]
fn read_whose_address_plus_length_wraps_u64_is_nak_remote_access_error() {
    let (mut f, a, b) = pair(&Opts::default());
    let p = craft(
        &a,
        &b,
        Opcode::RcRdmaReadRequest,
        A_PSN,
        reth_ext(b.addr(16), b.mr.rkey(), u32::MAX),
        &[],
    );
    deliver(&mut f, &b, &p, t_us(1));
    // u32::MAX > 2^31: the length rule comes first (class C, invalid request).
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(Opcode::RcAcknowledge, A_PSN, nak(NakCode::InvalidRequest))]
    );
    let (mut f, a, b) = pair(&Opts::default());
    let p = craft(
        &a,
        &b,
        Opcode::RcRdmaReadRequest,
        A_PSN,
        reth_ext(u64::MAX - 100, b.mr.rkey(), 1 << 31),
        &[],
    );
    deliver(&mut f, &b, &p, t_us(1));
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [(
            Opcode::RcAcknowledge,
            A_PSN,
            nak(NakCode::RemoteAccessError)
        )]
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
fn zero_length_write_and_read_need_no_valid_rkey_or_address() {
    // C9-88 (as rxe cites it): a zero-length RDMA request names no memory.
    let (mut f, a, b) = pair(&Opts::default());
    let w = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(u64::MAX, 0xdead_beef, 0),
        &[],
    );
    let r = craft(
        &a,
        &b,
        Opcode::RcRdmaReadRequest,
        A_PSN + 1,
        reth_ext(u64::MAX, 0xdead_beef, 0),
        &[],
    );
    deliver(&mut f, &b, &w, t_us(1));
    deliver(&mut f, &b, &r, t_us(1));
    let out = transmit(&mut f, &b, t_us(1));
    let got: Vec<_> = out.iter().map(|p| (p.opcode(), p.psn())).collect();
    assert_eq!(
        got,
        [
            (Opcode::RcAcknowledge, A_PSN),
            (Opcode::RcRdmaReadResponseOnly, A_PSN + 1)
        ]
    );
    assert!(out[1].parsed().payload.is_empty());
    assert_eq!(state(&f, &b), QpState::Rts);
}

#[test]
fn deregistering_the_source_of_a_multi_packet_read_mid_stream_is_rem_access_err() {
    let (mut f, a, b) = pair(&Opts::default());
    let (mr2, mem2) = extra_mr(&mut f, &b, 4 * PMTU, 0x5000_0000, AccessFlags::all());
    mem2.write(0, &[0x31; 4 * PMTU]).unwrap();
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 4 * PMTU as u32)],
            SendOp::RdmaRead {
                remote_addr: mr2.iova(),
                rkey: mr2.rkey(),
            },
        ),
    );
    let req = transmit(&mut f, &a, t_us(0));
    deliver_all(&mut f, &b, &req, t_us(1));
    let mut buf = vec![0u8; hca::engine::MAX_UDP_PAYLOAD];
    let tx = f.node_mut(b.node).poll_transmit(t_us(1), &mut buf).unwrap();
    let first = Pkt {
        tx,
        data: buf[..tx.len].to_vec(),
    };
    assert_eq!(first.opcode(), Opcode::RcRdmaReadResponseFirst);
    f.node_mut(b.node).dereg_mr(mr2.lkey()).unwrap();
    let rest = transmit(&mut f, &b, t_us(1));
    assert_eq!(
        rest.iter()
            .map(|p| (p.opcode(), p.psn(), p.aeth().map(|x| x.syndrome)))
            .collect::<Vec<_>>(),
        [(
            Opcode::RcAcknowledge,
            A_PSN + 1,
            nak(NakCode::RemoteAccessError)
        )],
        "the stream stops, the requester hears why"
    );
    assert_eq!(state(&f, &b), QpState::Err);
    deliver(&mut f, &a, &first, t_us(2));
    deliver_all(&mut f, &a, &rest, t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::RemAccessErr]
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

// ---- the responses it owes, in order ----

#[test]
fn responses_owed_before_a_class_c_error_are_sent_before_its_nak() {
    // A NAK implicitly acknowledges every earlier request (IBTA vol. 1 §9.7.5.2): an atomic or
    // READ the responder executed before the failing request must be answered, not discarded
    // with the error. rxe answers READs and atomics as it executes them, so it never loses one.
    let (mut f, a, b) = pair(&Opts::default());
    post_atomic_read_then_bad_write(&mut f, &a, &b);
    let reqs = transmit(&mut f, &a, t_us(0));
    assert_eq!(reqs.len(), 3);
    // One receive batch: all three arrive before B transmits anything.
    deliver_all(&mut f, &b, &reqs, t_us(1));
    assert_eq!(
        u64::from_ne_bytes(b.read(0, 8).try_into().unwrap()),
        12,
        "executed once"
    );
    assert_eq!(
        answers(&mut f, &b, t_us(1)),
        [
            (Opcode::RcAtomicAcknowledge, A_PSN, Some(ack())),
            (Opcode::RcRdmaReadResponseOnly, A_PSN + 1, Some(ack())),
            (
                Opcode::RcAcknowledge,
                A_PSN + 2,
                nak(NakCode::RemoteAccessError)
            ),
        ]
    );
    assert_eq!(state(&f, &b), QpState::Err);
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
fn a_qp_connected_to_itself_serves_its_own_requests() {
    // Loopback (rxe supports it): one QP is requester and responder of the same connection; its
    // responder's errors must not corrupt its requester's state and vice versa.
    let o = Opts::default();
    let mut f = hca::fabric::Fabric::new(o.seed, o.faults);
    let a = side(&mut f, 1, A_IOVA, &o);
    bring_up(&mut f, &a, &a, 500, 500, &o);
    a.write(0, &[0x5e; 5000]);
    a.write(100_000, &41u64.to_ne_bytes());
    post_recv(&mut f, &a, 90, &[a.sge(200_000, 8192)]);
    post(&mut f, &a, write(&a, 1, (0, 5000), &a, 20_000));
    post(&mut f, &a, read(&a, 2, (40_000, 5000), &a, 20_000));
    post_send(
        &mut f,
        &a,
        &send_wr(
            3,
            &[a.sge(100_008, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: a.addr(100_000),
                rkey: a.mr.rkey(),
                add: 1,
            },
        ),
    );
    post_send(&mut f, &a, &send_wr(4, &[a.sge(0, 3000)], SendOp::Send));
    let wcs = run_for_completions(&mut f, &a, 5, Duration::from_secs(1));
    let mut got = statuses(&wcs);
    got.sort_unstable_by_key(|g| g.0);
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success),
            (90, WcStatus::Success)
        ]
    );
    assert_eq!(a.read(20_000, 5000), vec![0x5e; 5000]);
    assert_eq!(a.read(40_000, 5000), vec![0x5e; 5000]);
    assert_eq!(a.read(100_000, 8), 42u64.to_ne_bytes());
    assert_eq!(a.read(100_008, 8), 41u64.to_ne_bytes());
    assert_eq!(a.read(200_000, 3000), vec![0x5e; 3000]);
    // Its responder now fails (a WRITE with a bad rkey): the requester's own WR sees the NAK.
    post_send(
        &mut f,
        &a,
        &send_wr(
            5,
            &[a.sge(0, 8)],
            SendOp::RdmaWrite {
                remote_addr: a.addr(0),
                rkey: a.mr.rkey() ^ 0x100,
            },
        ),
    );
    post_send(&mut f, &a, &send_wr(6, &[a.sge(0, 8)], SendOp::Send));
    let wcs = run_for_completions(&mut f, &a, 2, Duration::from_secs(1));
    let got = statuses(&wcs);
    assert!(
        matches!(
            got[..],
            [
                (5, WcStatus::RemAccessErr | WcStatus::WrFlushErr),
                (6, WcStatus::WrFlushErr)
            ]
        ),
        "{got:?}"
    );
    assert_eq!(state(&f, &a), QpState::Err);
}

// ---- receive WQEs, SRQs and RNR NAKs ----

#[test]
fn multi_packet_send_is_scattered_over_the_receive_sges_with_its_length_and_immediate() {
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    let data = pattern(5000, 7);
    a.write(0, &data);
    post_recv(&mut f, &b, 77, &[b.sge(100, 3000), b.sge(20_000, 3000)]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 5000)],
            SendOp::SendWithImm {
                imm_data: 0xdead_beef,
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(10));
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wa[0].opcode, WcOpcode::Send);
    let wb = run_for_completions(&mut f, &b, 1, Duration::from_millis(10));
    assert_eq!(wb[0].status, WcStatus::Success, "{wb:?}");
    assert_eq!(wb[0].wr_id, 77);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(wb[0].imm_data, Some(0xdead_beef));
    assert!(wb[0].wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = b.read(100, 3000);
    got.extend(b.read(20_000, 2000));
    assert_eq!(got, data);
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
fn sends_to_a_qp_on_an_srq_consume_the_srqs_receive_wqes_in_order() {
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

#[test]
fn srq_exhaustion_is_rnr_nakked_and_recovers_when_refilled() {
    let o = Opts::default();
    let mut f = hca::fabric::Fabric::new(o.seed, o.faults);
    let a = side(&mut f, 1, A_IOVA, &o);
    let mut b = side(&mut f, 2, B_IOVA, &o);
    let h = f.node_mut(b.node);
    let srq = h
        .create_srq(
            b.pd,
            &hca::SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    h.destroy_qp(b.qpn).unwrap();
    b.qpn = h
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
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    bring_up(&mut f, &a, &b, o.a_psn, o.b_psn, &o);
    bring_up(&mut f, &b, &a, o.b_psn, o.a_psn, &o);
    let srq_recv = |f: &mut hca::fabric::Fabric, i: u64| {
        f.node_mut(b.node)
            .post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: i,
                    sg_list: &[b.sge(i * 256, 256)],
                },
            )
            .unwrap();
    };
    srq_recv(&mut f, 0);
    srq_recv(&mut f, 1);
    for i in 0..5u8 {
        a.write(usize::from(i) * 16, &[i + 1; 16]);
        post_send(
            &mut f,
            &a,
            &send_wr(u64::from(i), &[a.sge(u64::from(i) * 16, 16)], SendOp::Send),
        );
    }
    let _ = f.run_until(|_| false, Duration::from_millis(5));
    assert!(f.node(b.node).counters().send_rnr_err > 0);
    assert_eq!(poll(&mut f, &a).len(), 2, "two SENDs found a WQE");
    for i in 2..5 {
        srq_recv(&mut f, i);
    }
    let wcs = run_for_completions(&mut f, &a, 3, Duration::from_secs(1));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let recvs = poll(&mut f, &b);
    assert_eq!(recvs.len(), 5);
    for i in 0..5u8 {
        assert_eq!(b.read(usize::from(i) * 256, 16), vec![i + 1; 16]);
    }
}

// ---- UC and UD responders (IBTA vol. 1 §9.8.4, §9.8.5) ----

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

/// A link that cannot see the IPv4 identification (a kernel socket): the engine solves for it
/// from the ICRC, and the UD receive's GRH area holds the IPv4 header as sent, identification
/// included (as rxe copies it).
#[test]
fn ud_receive_grh_holds_the_solved_ipv4_identification() {
    let (mut f, a, b) = pair(&ud(false));
    let ah = ah_to(&mut f, &a, &b);
    post_recv(&mut f, &b, 9, &[b.sge(0, 100)]);
    post_send(
        &mut f,
        &a,
        &send_wr(1, &[a.sge(0, 16)], ud_send(ah, &b, 0x1111_1111)),
    );
    let pkt = transmit(&mut f, &a, t_us(0))
        .remove(0)
        .resealed_for_ident(0x4242);
    f.node_mut(b.node).handle_datagram(
        t_us(1),
        &hca::Datagram {
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
    let wb = poll(&mut f, &b);
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(f.node(b.node).counters().icrc_ident_solved, 1);
    let grh = b.read(0, 40);
    let ip = roce::ipv4::Packet::new_unchecked(&grh[20..]);
    assert!(ip.verify_checksum());
    assert_eq!(ip.ident(), 0x4242);
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
fn ud_send_with_immediate_completes_with_the_immediate_and_the_grh_and_with_imm_flags() {
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

// ---- when ACKs leave ----
//
// ACKs leave together with the requests of their QP: a plain ACK lets one request packet go
// first, and with `EngineConfig::ack_delay` a lone ACK waits a bounded time for one, so a
// request/response exchange costs one send for both (IBTA vol. 1 §9.7.5: an ACK acknowledges
// every earlier PSN, so responders may coalesce and delay them).

fn shape(pkts: &[Pkt]) -> Vec<Opcode> {
    pkts.iter().map(Pkt::opcode).collect()
}

fn opts_with_ack_delay(delay_us: u64) -> Opts {
    let mut o = Opts::default();
    o.config.ack_delay = Duration::from_micros(delay_us);
    o
}

/// A sends one SEND to B; B has received it by `t_us(2)`.
fn one_send(f: &mut hca::fabric::Fabric, a: &Peer, b: &Peer) {
    post_recv(f, b, 7, &[b.sge(0, 64)]);
    post_recv(f, a, 7, &[a.sge(0, 64)]);
    post_send(f, a, &send_wr(1, &[a.sge(0, 8)], SendOp::Send));
    let req = transmit(f, a, t_us(1));
    assert_eq!(shape(&req), [Opcode::RcSendOnly]);
    deliver_all(f, b, &req, t_us(2));
    assert_eq!(poll(f, b).len(), 1);
}

#[test]
fn a_plain_ack_lets_one_request_packet_go_first() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(0));
    // B's requester went last, so its responder has the next turn: the ACK still lets the
    // reply go first.
    post_recv(&mut f, &a, 9, &[a.sge(1024, 64)]);
    post_send(&mut f, &b, &send_wr(9, &[b.sge(0, 8)], SendOp::Send));
    let first = transmit(&mut f, &b, t_us(0));
    assert_eq!(shape(&first), [Opcode::RcSendOnly]);
    one_send(&mut f, &a, &b);
    post_send(&mut f, &b, &send_wr(2, &[b.sge(0, 8)], SendOp::Send));
    let out = transmit(&mut f, &b, t_us(3));
    assert_eq!(shape(&out), [Opcode::RcSendOnly, Opcode::RcAcknowledge]);
    deliver_all(&mut f, &a, &first, t_us(4));
    deliver_all(&mut f, &a, &out, t_us(4));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.len(),
        3,
        "A's SEND acknowledged, B's two received: {wcs:?}"
    );
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    // Only one packet goes before the ACK: with more requests queued it alternates again.
    let out = transmit(&mut f, &a, t_us(5));
    assert_eq!(shape(&out), [Opcode::RcAcknowledge]);
}

#[test]
fn without_a_delay_a_lone_ack_goes_at_once() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(0));
    one_send(&mut f, &a, &b);
    assert_eq!(
        shape(&transmit(&mut f, &b, t_us(3))),
        [Opcode::RcAcknowledge]
    );
}

#[test]
fn a_held_ack_waits_for_the_reply_and_leaves_with_it() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    one_send(&mut f, &a, &b);
    assert!(transmit(&mut f, &b, t_us(3)).is_empty(), "held");
    assert_eq!(f.node_mut(b.node).poll_timeout(), Some(t_us(22)));
    post_send(&mut f, &b, &send_wr(2, &[b.sge(0, 8)], SendOp::Send));
    let out = transmit(&mut f, &b, t_us(5));
    assert_eq!(shape(&out), [Opcode::RcSendOnly, Opcode::RcAcknowledge]);
    // Nothing is left for the deadline.
    f.node_mut(b.node).handle_timeout(t_us(22));
    assert!(transmit(&mut f, &b, t_us(22)).is_empty());
}

#[test]
fn a_held_ack_goes_alone_at_its_deadline() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    one_send(&mut f, &a, &b);
    assert!(
        transmit(&mut f, &b, t_us(21)).is_empty(),
        "held until 22 us"
    );
    let due = f.node_mut(b.node).poll_timeout().unwrap();
    assert_eq!(due, t_us(22));
    f.node_mut(b.node).handle_timeout(due);
    let out = transmit(&mut f, &b, due);
    assert_eq!(shape(&out), [Opcode::RcAcknowledge]);
    deliver_all(&mut f, &a, &out, t_us(23));
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
}

#[test]
fn releasing_held_acks_sends_them_at_the_next_transmit() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    one_send(&mut f, &a, &b);
    assert!(transmit(&mut f, &b, t_us(3)).is_empty(), "held");
    // A driver about to stop lets it go before its deadline (22 us).
    f.node_mut(b.node).release_held_acks();
    let out = transmit(&mut f, &b, t_us(4));
    assert_eq!(shape(&out), [Opcode::RcAcknowledge]);
    deliver_all(&mut f, &a, &out, t_us(5));
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
    // Nothing else was waiting.
    f.node_mut(b.node).release_held_acks();
    assert!(transmit(&mut f, &b, t_us(6)).is_empty());
}

#[test]
fn requests_arriving_meanwhile_share_the_held_ack() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    for i in 0..3 {
        post_recv(&mut f, &b, i, &[b.sge(0, 64)]);
    }
    let sge = [a.sge(0, 8)];
    for i in 0..3 {
        post_send(&mut f, &a, &send_wr(i, &sge, SendOp::Send));
    }
    let req = transmit(&mut f, &a, t_us(1));
    assert_eq!(req.len(), 3);
    for (i, p) in req.iter().enumerate() {
        deliver(&mut f, &b, p, t_us(2 + i as u64));
        assert!(transmit(&mut f, &b, t_us(2 + i as u64)).is_empty());
    }
    let due = f.node_mut(b.node).poll_timeout().unwrap();
    assert_eq!(due, t_us(22), "the first ACK's deadline holds");
    f.node_mut(b.node).handle_timeout(due);
    let out = transmit(&mut f, &b, due);
    assert_eq!(shape(&out), [Opcode::RcAcknowledge]);
    assert_eq!(out[0].psn(), req[2].psn(), "one ACK for all three");
    assert_eq!(f.node_mut(b.node).counters().ack_deferred, 2);
    deliver_all(&mut f, &a, &out, t_us(23));
    assert_eq!(poll(&mut f, &a).len(), 3);
}

#[test]
fn a_held_ack_never_holds_back_read_responses() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    one_send(&mut f, &a, &b);
    b.write(4096, &[7; 100]);
    post(&mut f, &a, read(&a, 2, (4096, 100), &b, 4096));
    let req = transmit(&mut f, &a, t_us(3));
    deliver_all(&mut f, &b, &req, t_us(4));
    let out = transmit(&mut f, &b, t_us(4));
    assert_eq!(
        shape(&out),
        [Opcode::RcAcknowledge, Opcode::RcRdmaReadResponseOnly],
        "in PSN order, at once"
    );
    deliver_all(&mut f, &a, &out, t_us(5));
    assert_eq!(poll(&mut f, &a).len(), 2);
    assert_eq!(a.read(4096, 100), vec![7; 100]);
}

#[test]
fn delayed_acks_cause_no_retransmission_in_a_ping_pong() {
    let (mut f, a, b) = pair(&opts_with_ack_delay(20));
    for i in 0..50u64 {
        post_recv(&mut f, &b, i, &[b.sge(0, 64)]);
        post_recv(&mut f, &a, i, &[a.sge(0, 64)]);
        post_send(&mut f, &a, &send_wr(i, &[a.sge(0, 8)], SendOp::Send));
        run_for_completions(&mut f, &b, 1, Duration::from_millis(10));
        post_send(&mut f, &b, &send_wr(i, &[b.sge(0, 8)], SendOp::Send));
        // A: its SEND's completion and B's SEND received.
        let wcs = run_for_completions(&mut f, &a, 2, Duration::from_millis(10));
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        run_for_completions(&mut f, &b, 1, Duration::from_millis(10));
    }
    assert_eq!(f.node_mut(a.node).counters().completer_retry_err, 0);
    assert_eq!(f.node_mut(b.node).counters().completer_retry_err, 0);
}

// ---- UC through the responder's states ----

fn uc() -> Opts {
    Opts {
        qp_type: hca::QpType::Uc,
        ..Opts::default()
    }
}

#[test]
fn uc_errors_drop_the_rest_of_the_message_silently_and_the_qp_stays_in_rts() {
    // IBTA vol. 1 §9.8.4 (rxe `drop_msg`): where RC would NAK, UC drops the rest of the message
    // and resynchronises on the next FIRST or ONLY; nothing is ever acknowledged, even with
    // AckReq set (every crafted packet has it), and PSNs are not duplicates or sequence errors.
    let (mut f, a, b) = pair(&uc());
    let dropped = |f: &hca::fabric::Fabric| drops(f, &b, DropReason::RequestDropped);
    let none = ExtReprs::default;
    post_recv(&mut f, &b, 1, &[b.sge(0, 64)]);
    // Longer than the receive buffer: dropped, the receive WQE kept for the next message.
    let p = craft(&a, &b, Opcode::UcSendOnly, A_PSN, none(), &[1; 100]);
    deliver(&mut f, &b, &p, t_us(1));
    assert_eq!(dropped(&f), 1);
    assert!(poll(&mut f, &b).is_empty());
    let p = craft(&a, &b, Opcode::UcSendOnly, A_PSN, none(), &[2; 10]);
    deliver(&mut f, &b, &p, t_us(2));
    let wb = poll(&mut f, &b);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [(1, WcStatus::Success, 10)]
    );
    // The dropped message had filled the buffer before it overflowed.
    assert_eq!(b.read(0, 64), [vec![2; 10], vec![1; 54]].concat());
    // No receive WQE: dropped, no RNR NAK.
    let p = craft(&a, &b, Opcode::UcSendOnly, A_PSN + 1, none(), &[3; 10]);
    deliver(&mut f, &b, &p, t_us(3));
    assert_eq!(dropped(&f), 2);
    // A WRITE whose RETH range runs past the region: UC checks each packet as it writes it, so
    // the FIRST lands and the MIDDLE outside the region drops the rest of the message.
    let end = 1usize << 20;
    let va = b.addr((end - PMTU) as u64);
    let rkey = b.mr.rkey();
    let write = [
        craft(
            &a,
            &b,
            Opcode::UcRdmaWriteFirst,
            A_PSN + 1,
            reth_ext(va, rkey, 3 * PMTU as u32),
            &[4; PMTU],
        ),
        craft(
            &a,
            &b,
            Opcode::UcRdmaWriteMiddle,
            A_PSN + 2,
            none(),
            &[5; PMTU],
        ),
        craft(
            &a,
            &b,
            Opcode::UcRdmaWriteLast,
            A_PSN + 3,
            none(),
            &[6; PMTU],
        ),
    ];
    deliver_all(&mut f, &b, &write, t_us(4));
    assert_eq!(b.read(end - PMTU, PMTU), vec![4; PMTU]);
    assert_eq!(dropped(&f), 4);
    // The next ONLY, at any PSN, starts afresh.
    let ext = reth_ext(b.addr(4096), rkey, 16);
    let p = craft(&a, &b, Opcode::UcRdmaWriteOnly, A_PSN + 9, ext, &[7; 16]);
    deliver(&mut f, &b, &p, t_us(5));
    assert_eq!(b.read(4096, 16), vec![7; 16]);
    // A WRITE the QP's access flags do not allow: dropped, memory untouched.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: AccessFlags::empty(),
        ..QpAttr::default()
    };
    f.node_mut(b.node)
        .modify_qp(b.qpn, &attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    let ext = reth_ext(b.addr(8192), rkey, 16);
    let p = craft(&a, &b, Opcode::UcRdmaWriteOnly, A_PSN + 10, ext, &[8; 16]);
    deliver(&mut f, &b, &p, t_us(6));
    assert_eq!(dropped(&f), 5);
    assert_eq!(b.read(8192, 16), vec![0; 16]);
    // Nothing answered any of it.
    assert!(transmit(&mut f, &b, t_us(7)).is_empty());
    assert!(poll(&mut f, &b).is_empty());
    let c = f.node(b.node).counters();
    assert_eq!(
        (c.duplicate_request, c.out_of_seq_request, c.send_rnr_err),
        (0, 0, 0)
    );
    assert_eq!(state(&f, &b), QpState::Rts);
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
    assert_eq!(statuses(&wb), [(1, WcStatus::LocQpOpErr)]);
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Err
    );
    assert!(b.read(0, 4096).iter().all(|&x| x == 0));
}
