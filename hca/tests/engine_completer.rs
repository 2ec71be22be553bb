//! The completer (`engine/completer.rs`, rxe `rxe_comp.c`): how a requester's ACKs, NAKs, RNR NAKs,
//! READ responses and atomic acknowledgements retire its send WQEs (IBTA vol. 1 §9.7.5.2, §9.9),
//! with which work completion status; what it drops (responses to nothing, reserved syndromes);
//! and retransmission: the local ACK timeout, `retry_cnt`, `rnr_retry`, lost READ responses.

mod common;

use std::time::Duration;

use common::crafted_packets::*;
use common::work_requests::*;
use common::*;
use gpu_p2p::{HostMemory, Memory};
use hca::{AccessFlags, DropReason, QpState, SendOp, Sge, WcOpcode, WcStatus};
use roce::aeth::{NakCode, RnrTimer, Syndrome};
use roce::packet::ExtReprs;
use roce::{aeth, atomic_eth, Opcode};

// ---- completions in order, with their status ----

#[test]
fn write_read_and_atomics_complete_in_order_with_their_opcodes_and_results() {
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    let data = pattern(10_000, 3);
    a.write(0, &data);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 4000), a.sge(4000, 6000)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(50_000),
                rkey: b.mr.rkey(),
            },
        ),
    );
    post(&mut f, &a, read(&a, 2, (100_000, 10_000), &b, 50_000));
    b.write(8 * 1000, &41u64.to_ne_bytes());
    post_send(
        &mut f,
        &a,
        &send_wr(
            3,
            &[a.sge(200_000, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(8 * 1000),
                rkey: b.mr.rkey(),
                add: 1,
            },
        ),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(
            4,
            &[a.sge(200_008, 8)],
            SendOp::AtomicCmpAndSwp {
                remote_addr: b.addr(8 * 1000),
                rkey: b.mr.rkey(),
                compare: 42,
                swap: 1000,
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 4, Duration::from_millis(10));
    let ids: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        ids,
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead),
            (3, WcStatus::Success, WcOpcode::FetchAdd),
            (4, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    assert_eq!(b.read(50_000, 10_000), data);
    assert_eq!(a.read(100_000, 10_000), data);
    assert_eq!(a.read(200_000, 8), 41u64.to_ne_bytes());
    assert_eq!(a.read(200_008, 8), 42u64.to_ne_bytes());
    assert_eq!(b.read(8000, 8), 1000u64.to_ne_bytes());
    let c = f.node(a.node).counters();
    assert_eq!(c.total_drops(), 0, "{c:?}");
}

#[test]
fn requester_completes_what_was_answered_before_a_nak_and_fails_the_nakked_wr() {
    let (mut f, a, b) = pair(&Opts::default());
    post_atomic_read_then_bad_write(&mut f, &a, &b);
    let reqs = transmit(&mut f, &a, t_us(0));
    deliver_all(&mut f, &b, &reqs, t_us(1));
    let resp = transmit(&mut f, &b, t_us(1));
    deliver_all(&mut f, &a, &resp, t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        statuses(&wcs),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(u64::from_ne_bytes(a.read(0, 8).try_into().unwrap()), 7);
    assert_eq!(a.read(64, 64), vec![0x3c; 64]);
}

fn read_mem(mem: &HostMemory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mem.read(off, &mut v).unwrap();
    v
}

#[test]
fn deregistering_the_local_buffer_of_an_in_flight_read_fails_it_with_loc_prot_err() {
    let (mut f, a, b) = pair(&Opts::default());
    b.write(0, &[0x99; 256]);
    let (mr2, mem2) = extra_mr(&mut f, &a, 4096, 0x5000_0000, AccessFlags::LOCAL_WRITE);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[Sge {
                addr: mr2.iova(),
                length: 256,
                lkey: mr2.lkey(),
            }],
            SendOp::RdmaRead {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    let req = transmit(&mut f, &a, t_us(0));
    deliver_all(&mut f, &b, &req, t_us(1));
    let resp = transmit(&mut f, &b, t_us(1));
    f.node_mut(a.node).dereg_mr(mr2.lkey()).unwrap();
    deliver_all(&mut f, &a, &resp, t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::LocProtErr]
    );
    assert_eq!(state(&f, &a), QpState::Err);
    assert_eq!(read_mem(&mem2, 0, 256), vec![0; 256], "nothing written");
}

// ---- responses to nothing, malformed responses, odd syndromes ----

#[test]
fn read_response_with_no_read_outstanding_is_dropped() {
    let (mut f, a, b) = pair(&Opts::default());
    for opcode in [
        Opcode::RcRdmaReadResponseOnly,
        Opcode::RcRdmaReadResponseFirst,
        Opcode::RcRdmaReadResponseLast,
    ] {
        let p = craft(&b, &a, opcode, A_PSN, aeth_ext(ack()), &[0xee; PMTU]);
        deliver(&mut f, &a, &p, t_us(1));
    }
    let p = craft(
        &b,
        &a,
        Opcode::RcRdmaReadResponseMiddle,
        A_PSN,
        ExtReprs::default(),
        &[0xee; PMTU],
    );
    deliver(&mut f, &a, &p, t_us(1));
    assert_eq!(drops(&f, &a, DropReason::UnexpectedResponse), 4);
    assert!(poll(&mut f, &a).is_empty());
    assert_eq!(state(&f, &a), QpState::Rts);
    assert!(
        a.read(0, 1 << 20).iter().all(|&x| x == 0),
        "nothing written"
    );
}

#[test]
fn ack_nak_and_rnr_nak_for_psns_never_sent_are_dropped() {
    let (mut f, a, b) = a_with_one_write();
    let mut bad = Vec::new();
    for psn in [
        A_PSN + 1,
        A_PSN + 1000,
        A_PSN - 1,
        A_PSN.wrapping_sub(1 << 22) & 0xff_ffff,
    ] {
        bad.push(craft(
            &b,
            &a,
            Opcode::RcAcknowledge,
            psn,
            aeth_ext(ack()),
            &[],
        ));
        bad.push(craft(
            &b,
            &a,
            Opcode::RcAcknowledge,
            psn,
            aeth_ext(Syndrome::Nak(NakCode::RemoteAccessError)),
            &[],
        ));
        bad.push(craft(
            &b,
            &a,
            Opcode::RcAcknowledge,
            psn,
            aeth_ext(Syndrome::RnrNak {
                timer: RnrTimer::from_code(1),
            }),
            &[],
        ));
        bad.push(craft(
            &b,
            &a,
            Opcode::RcAtomicAcknowledge,
            psn,
            ExtReprs {
                aeth: Some(aeth::Repr {
                    syndrome: ack(),
                    msn: 0,
                }),
                atomic_ack_eth: Some(atomic_eth::ack::Repr {
                    orig_remote_data: 5,
                }),
                ..ExtReprs::default()
            },
            &[],
        ));
    }
    // A sequence NAK may name one past the last PSN sent, not more.
    bad.push(craft(
        &b,
        &a,
        Opcode::RcAcknowledge,
        A_PSN + 2,
        aeth_ext(Syndrome::Nak(NakCode::PsnSequenceError)),
        &[],
    ));
    deliver_all(&mut f, &a, &bad, t_us(1));
    assert_eq!(
        drops(&f, &a, DropReason::UnexpectedResponse),
        bad.len() as u64
    );
    assert!(poll(&mut f, &a).is_empty());
    assert_eq!(state(&f, &a), QpState::Rts);
    // The real ACK still completes the WRITE.
    let good = craft(&b, &a, Opcode::RcAcknowledge, A_PSN, aeth_ext(ack()), &[]);
    deliver(&mut f, &a, &good, t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    // Its duplicate completes nothing more.
    deliver(&mut f, &a, &good, t_us(3));
    assert!(poll(&mut f, &a).is_empty());
}

#[test]
fn nak_with_a_reserved_or_rd_code_fails_the_wr_and_the_qp() {
    // rxe check_ack completes the WQE in error for any NAK code it does not know (it uses
    // IBV_WC_REM_OP_ERR; this engine reports IBV_WC_BAD_RESP_ERR: the responder spoke nonsense).
    for code in 4u8..32 {
        let (mut f, a, b) = a_with_one_write();
        let p = craft(
            &b,
            &a,
            Opcode::RcAcknowledge,
            A_PSN,
            aeth_ext(Syndrome::Nak(NakCode::from(code))),
            &[],
        );
        deliver(&mut f, &a, &p, t_us(1));
        let wcs = poll(&mut f, &a);
        assert_eq!(wcs.len(), 1, "code {code}");
        assert!(
            matches!(wcs[0].status, WcStatus::BadRespErr | WcStatus::RemOpErr),
            "code {code}: {:?}",
            wcs[0].status
        );
        assert_eq!(state(&f, &a), QpState::Err);
    }
}

#[test]
fn reserved_aeth_syndrome_is_dropped() {
    let (mut f, a, b) = a_with_one_write();
    for byte in [0x40u8, 0x5f, 0x80, 0xff] {
        let p = craft(
            &b,
            &a,
            Opcode::RcAcknowledge,
            A_PSN,
            aeth_ext(Syndrome::from_byte(byte)),
            &[],
        );
        deliver(&mut f, &a, &p, t_us(1));
    }
    assert_eq!(drops(&f, &a, DropReason::UnexpectedResponse), 4);
    assert!(poll(&mut f, &a).is_empty());
    assert_eq!(state(&f, &a), QpState::Rts);
}

#[test]
fn atomic_acknowledge_or_read_response_for_a_write_is_bad_resp_err() {
    // rxe check_ack: a READ response or ATOMIC ACKNOWLEDGE for a WQE of another kind is an error
    // (IB_WC_FATAL_ERR there; ibverbs' IBV_WC_BAD_RESP_ERR is "an unexpected transport layer
    // opcode").
    for opcode in [Opcode::RcAtomicAcknowledge, Opcode::RcRdmaReadResponseOnly] {
        let (mut f, a, b) = a_with_one_write();
        let mut ext = aeth_ext(ack());
        let mut payload = vec![];
        if opcode == Opcode::RcAtomicAcknowledge {
            ext.atomic_ack_eth = Some(atomic_eth::ack::Repr {
                orig_remote_data: 0x1111,
            });
        } else {
            payload = vec![0xcc; 64];
        }
        let p = craft(&b, &a, opcode, A_PSN, ext, &payload);
        deliver(&mut f, &a, &p, t_us(1));
        let wcs = poll(&mut f, &a);
        assert_eq!(
            wcs.iter().map(|w| w.status).collect::<Vec<_>>(),
            [WcStatus::BadRespErr],
            "{opcode:?}"
        );
        assert_eq!(state(&f, &a), QpState::Err);
        assert_eq!(
            a.read(0, 64),
            vec![0; 64],
            "the WRITE's source is untouched"
        );
    }
}

#[test]
fn atomic_acknowledge_with_a_nak_syndrome_is_dropped() {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(64, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
                add: 1,
            },
        ),
    );
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    let p = craft(
        &b,
        &a,
        Opcode::RcAtomicAcknowledge,
        A_PSN,
        ExtReprs {
            aeth: Some(aeth::Repr {
                syndrome: Syndrome::Nak(NakCode::InvalidRequest),
                msn: 0,
            }),
            atomic_ack_eth: Some(atomic_eth::ack::Repr {
                orig_remote_data: 0xdead,
            }),
            ..ExtReprs::default()
        },
        &[],
    );
    deliver(&mut f, &a, &p, t_us(1));
    assert_eq!(drops(&f, &a, DropReason::UnexpectedResponse), 1);
    assert!(poll(&mut f, &a).is_empty());
    assert_eq!(a.read(64, 8), vec![0; 8]);
}

#[test]
fn read_response_of_the_wrong_length_or_position_is_bad_resp_err_and_writes_nothing() {
    let cases: Vec<(u32, Opcode, usize)> = vec![
        (100, Opcode::RcRdmaReadResponseOnly, 200), // longer than asked
        (100, Opcode::RcRdmaReadResponseOnly, 50),  // shorter
        (100, Opcode::RcRdmaReadResponseFirst, PMTU), // FIRST of a one-packet READ
        (100, Opcode::RcRdmaReadResponseMiddle, PMTU),
        (2 * PMTU as u32, Opcode::RcRdmaReadResponseOnly, PMTU), // ONLY of a two-packet READ
        (2 * PMTU as u32, Opcode::RcRdmaReadResponseFirst, 100), // FIRST shorter than the PMTU
    ];
    for (len, opcode, payload) in cases {
        let (mut f, a, b) = a_with_one_read(len, hca::PathMtu::Mtu1024);
        let ext = if opcode == Opcode::RcRdmaReadResponseMiddle {
            ExtReprs::default()
        } else {
            aeth_ext(ack())
        };
        let p = craft(&b, &a, opcode, A_PSN, ext, &vec![0xab; payload]);
        deliver(&mut f, &a, &p, t_us(1));
        let wcs = poll(&mut f, &a);
        assert_eq!(
            wcs.iter().map(|w| w.status).collect::<Vec<_>>(),
            [WcStatus::BadRespErr],
            "{len} {opcode:?} {payload}"
        );
        assert!(
            a.read(0, 1 << 20).iter().all(|&x| x == 0),
            "{len} {opcode:?} {payload}: nothing written"
        );
    }
}

#[test]
fn read_response_past_the_last_psn_of_the_read_is_dropped() {
    let (mut f, a, b) = a_with_one_read(100, hca::PathMtu::Mtu1024);
    let p = craft(
        &b,
        &a,
        Opcode::RcRdmaReadResponseOnly,
        A_PSN + 1,
        aeth_ext(ack()),
        &[0xab; 100],
    );
    deliver(&mut f, &a, &p, t_us(1));
    assert_eq!(drops(&f, &a, DropReason::UnexpectedResponse), 1);
    assert!(poll(&mut f, &a).is_empty());
    assert!(a.read(0, 1 << 20).iter().all(|&x| x == 0));
}

// ---- RNR NAKs: the RNR timer and rnr_retry ----

#[test]
fn send_without_a_receive_wqe_is_rnr_nakked_and_retried_after_the_rnr_timer() {
    // min_rnr_timer 14 = 1.28 ms (IBTA table 45).
    let o = Opts {
        min_rnr_timer: 14,
        rnr_retry: 7,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 8)], SendOp::Send));
    let s = transmit(&mut f, &a, t_us(0));
    deliver(&mut f, &b, &s[0], t_us(1));
    let nak = transmit(&mut f, &b, t_us(1));
    assert_eq!(nak[0].psn(), s[0].psn());
    let syn = nak[0].aeth().unwrap().syndrome;
    assert_eq!(
        syn,
        Syndrome::RnrNak {
            timer: roce::aeth::RnrTimer::from_code(14)
        }
    );
    assert_eq!(f.node(b.node).counters().send_rnr_err, 1);
    deliver(&mut f, &a, &nak[0], t_us(2));
    assert_eq!(f.node(a.node).counters().rcvd_rnr_err, 1);
    assert!(transmit(&mut f, &a, t_us(2)).is_empty(), "paused");
    let wake = f.node_mut(a.node).poll_timeout().unwrap();
    assert_eq!(wake, t_us(2 + 1280), "the NAK's RNR timer, 1.28 ms");
    f.node_mut(a.node).handle_timeout(t_us(1000));
    assert!(
        transmit(&mut f, &a, t_us(1000)).is_empty(),
        "not before the timer"
    );
    f.node_mut(a.node).handle_timeout(wake);
    let again = transmit(&mut f, &a, wake);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].psn(), s[0].psn());
    post_recv(&mut f, &b, 5, &[b.sge(0, 64)]);
    deliver(&mut f, &b, &again[0], wake);
    let ack = transmit(&mut f, &b, wake);
    assert!(ack[0].aeth().unwrap().syndrome.is_ack());
    deliver(&mut f, &a, &ack[0], wake);
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
}

#[test]
fn rnr_retry_7_never_gives_up() {
    let o = Opts {
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 8)], SendOp::Send));
    // 50 ms of RNR NAKs every ~10 us: thousands of retries, never an error.
    f.run_for(Duration::from_millis(50));
    assert!(poll(&mut f, &a).is_empty());
    let rnr = f.node(a.node).counters().rcvd_rnr_err;
    assert!(rnr > 1000, "{rnr}");
    post_recv(&mut f, &b, 5, &[b.sge(0, 64)]);
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_millis(10));
    assert_eq!(wcs[0].status, WcStatus::Success);
}

/// Issue 19's "RNR retry 7 client still got status 12 after RNR NAKs": several SENDs in flight,
/// an RNR timer (code 18: 3.84 ms) longer than the local ACK timeout (code 8: 1 ms) and
/// `retry_cnt` 1: the RNR NAKs and the sequence NAKs for the SENDs behind the NAKed one must not
/// count as transport retries (IBTA vol. 1 §9.7.5.2.8), nor may the ACK timer run during an
/// RNR wait; 300 ms later the receives come and every SEND completes.
#[test]
fn rnr_naks_of_pipelined_sends_do_not_spend_retry_cnt() {
    let o = Opts {
        min_rnr_timer: 18,
        rnr_retry: 7,
        retry_cnt: 1,
        timeout: 8,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..4 {
        post_send(&mut f, &a, &send_wr(i, &[a.sge(0, 8)], SendOp::Send));
    }
    f.run_for(Duration::from_millis(300));
    assert!(poll(&mut f, &a).is_empty(), "no completion, no error");
    let c = f.node(a.node).counters();
    assert!(c.rcvd_rnr_err > 50, "{}", c.rcvd_rnr_err);
    assert_eq!(c.retry_exceeded_err, 0);
    for i in 0..4 {
        post_recv(&mut f, &b, 10 + i, &[b.sge(64 * i, 64)]);
    }
    let wcs = run_for_completions(&mut f, &a, 4, Duration::from_millis(50));
    assert_eq!(
        statuses(&wcs),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

#[test]
fn finite_rnr_retry_ends_in_rnr_retry_exc_err() {
    let o = Opts {
        min_rnr_timer: 1,
        rnr_retry: 2,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 8)], SendOp::Send));
    post_send(&mut f, &a, &send_wr(2, &[a.sge(0, 8)], SendOp::Send));
    let wcs = run_for_completions(&mut f, &a, 2, Duration::from_millis(50));
    assert_eq!(
        statuses(&wcs),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = f.node(a.node).counters();
    assert_eq!(c.rcvd_rnr_err, 3, "the first try and 2 retries");
    assert_eq!(c.retry_rnr_exceeded_err, 1);
    assert_eq!(f.node(b.node).counters().send_rnr_err, 3);
    assert_eq!(
        f.node(a.node).context().qp(a.qpn).unwrap().state(),
        QpState::Err
    );
}

// ---- retransmission: the local ACK timeout, retry_cnt, lost responses ----

#[test]
fn lost_packets_are_retransmitted_after_the_local_ack_timeout() {
    // timeout 10: 4.096 us * 2^10 = 4.194 ms.
    let o = Opts {
        timeout: 10,
        retry_cnt: 3,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post(&mut f, &a, write(&a, 1, (0, 8), &b, 0));
    let first = transmit(&mut f, &a, t_us(0));
    assert_eq!(first.len(), 1);
    let deadline = f.node_mut(a.node).poll_timeout().unwrap();
    assert_eq!(deadline.as_nanos(), 4096 << 10);
    f.node_mut(a.node).handle_timeout(deadline);
    let resent = transmit(&mut f, &a, deadline);
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].data, first[0].data, "the same packet again");
    assert_eq!(f.node(a.node).counters().completer_retry_err, 1);
    deliver(&mut f, &b, &resent[0], deadline);
    let ack = transmit(&mut f, &b, deadline);
    deliver(&mut f, &a, &ack[0], deadline);
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
    assert_eq!(
        f.node_mut(a.node).poll_timeout(),
        None,
        "nothing outstanding, no timer"
    );
}

#[test]
fn retry_cnt_exhausted_ends_in_retry_exc_err() {
    let o = Opts {
        timeout: 1,
        retry_cnt: 2,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post(&mut f, &a, write(&a, 1, (0, 8), &b, 0));
    post(&mut f, &a, write(&a, 2, (0, 8), &b, 0));
    let mut sends = 0;
    let mut now = t_us(0);
    for _ in 0..10 {
        sends += transmit(&mut f, &a, now).len();
        match f.node_mut(a.node).poll_timeout() {
            Some(t) => {
                now = t;
                f.node_mut(a.node).handle_timeout(now);
            }
            None => break,
        }
    }
    assert_eq!(sends, 6, "first try and 2 retries of both WRITEs");
    let wcs = poll(&mut f, &a);
    assert_eq!(
        statuses(&wcs),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(f.node(a.node).counters().retry_exceeded_err, 1);
}

#[test]
fn timeout_zero_waits_forever() {
    let o = Opts {
        timeout: 0,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    post(&mut f, &a, write(&a, 1, (0, 8), &b, 0));
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    assert_eq!(f.node_mut(a.node).poll_timeout(), None);
}

#[test]
fn lost_read_response_is_recovered_by_retrying_the_read_from_the_missing_psn() {
    let (mut f, a, b) = pair(&opts_with_psn(0xff_fffe));
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    b.write(0, &data);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 2000), a.sge(10_000, 3000)],
            SendOp::RdmaRead {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    let req = transmit(&mut f, &a, t_us(0));
    deliver(&mut f, &b, &req[0], t_us(1));
    let resp = transmit(&mut f, &b, t_us(1));
    assert_eq!(resp.len(), 5);
    assert_eq!(
        resp.iter().map(Pkt::psn).collect::<Vec<_>>(),
        [0xff_fffe, 0xff_ffff, 0, 1, 2]
    );
    // Responses 0 and 1 after the PSN wrap are lost.
    deliver_all(&mut f, &a, &resp[..2], t_us(2));
    deliver(&mut f, &a, &resp[4], t_us(2));
    let deadline = f.node_mut(a.node).poll_timeout().unwrap();
    f.node_mut(a.node).handle_timeout(deadline);
    let retry = transmit(&mut f, &a, deadline);
    let p = retry[0].parsed();
    assert_eq!(p.transport.bth.psn, 0);
    let reth = p.transport.ext.reth.unwrap();
    assert_eq!(
        (reth.virtual_address, reth.dma_len),
        (b.addr(2048), 5000 - 2048)
    );
    deliver(&mut f, &b, &retry[0], deadline);
    let replay = transmit(&mut f, &b, deadline);
    let ops: Vec<_> = replay.iter().map(|p| (p.psn(), p.opcode())).collect();
    assert_eq!(
        ops,
        [
            (0, Opcode::RcRdmaReadResponseFirst),
            (1, Opcode::RcRdmaReadResponseMiddle),
            (2, Opcode::RcRdmaReadResponseLast)
        ]
    );
    deliver_all(&mut f, &a, &replay, deadline);
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
    let mut got = a.read(0, 2000);
    got.extend(a.read(10_000, 3000));
    assert_eq!(got, data);
}

#[test]
fn requester_max_rd_atomic_above_the_responders_max_dest_rd_atomic_still_completes() {
    // A misconfigured pair (initiator depth 8, responder resources 1): the responder drops the
    // READs it has no resource for, the requester retries them; every READ completes, with the
    // right data.
    let o = Opts::default();
    let mut f = hca::fabric::Fabric::new(o.seed, o.faults);
    let a = side(&mut f, 1, A_IOVA, &o);
    let b = side(&mut f, 2, B_IOVA, &o);
    let one = Opts {
        max_rd_atomic: 1,
        ..o.clone()
    };
    bring_up(&mut f, &a, &b, o.a_psn, o.b_psn, &o);
    bring_up(&mut f, &b, &a, o.b_psn, o.a_psn, &one);
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    b.write(0, &data);
    for i in 0..32u64 {
        post(&mut f, &a, read(&a, i, (i * 2048, 2048), &b, i * 2048));
    }
    let wcs = run_for_completions(&mut f, &a, 32, Duration::from_secs(10));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(a.read(0, data.len()), data);
}
