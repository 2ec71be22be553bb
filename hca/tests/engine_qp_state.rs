//! The QP state machine (`qp.rs`, and the transitions the engine drives itself in
//! `engine/transport.rs`; IBTA vol. 1 §10.3): which states accept work, what RESET discards, what
//! entering ERR flushes, SQD draining, CQ overruns, and destroying objects that are in use.

mod common;

use std::time::Duration;

use common::crafted_packets::*;
use common::work_requests::*;
use common::*;
use hca::verbs::connect::{self, ConnectAttr};
use hca::{
    AsyncEventType, DropReason, QpAttr, QpAttrMask, QpState, SendFlags, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use roce::Opcode;

// ---- which states accept work ----

#[test]
fn post_send_is_refused_in_reset_init_and_rtr_and_flushed_in_err() {
    let o = Opts::default();
    let mut f = hca::fabric::Fabric::new(1, o.faults);
    let a = side(&mut f, 1, A_IOVA, &o);
    let b = side(&mut f, 2, B_IOVA, &o);
    let wr = send_wr(9, &[], SendOp::Send);
    let refused = |f: &mut hca::fabric::Fabric| {
        let e = f.node_mut(a.node).post_send(a.qpn, &wr).unwrap_err();
        assert_eq!(e.errno(), hca::errno::EINVAL, "{e}");
    };
    refused(&mut f); // RESET
    connect::bring_up(
        &ConnectAttr::default(),
        QpState::Reset,
        QpState::Init,
        |qp, mask| f.node_mut(a.node).modify_qp(a.qpn, qp, mask).map(|_| ()),
    )
    .unwrap();
    refused(&mut f); // INIT
    let attr = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(a.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    bring_up_to_rtr(&mut f, &a, &b, 1);
    refused(&mut f); // RTR
    assert!(poll(&mut f, &a).is_empty(), "nothing was queued");
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(a.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    f.node_mut(a.node).post_send(a.qpn, &wr).unwrap();
    let wcs = poll(&mut f, &a);
    assert_eq!(statuses(&wcs), [(9, WcStatus::WrFlushErr)]);
}

#[test]
fn sqd_drains_then_raises_sq_drained() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, write(&a, 1, (0, 8), &b, 0));
    let first = transmit(&mut f, &a, t_us(0));
    let attr = hca::QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..hca::QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(
            a.qpn,
            &attr,
            hca::QpAttrMask::STATE | hca::QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    post(&mut f, &a, write(&a, 2, (0, 8), &b, 0));
    assert!(
        transmit(&mut f, &a, t_us(1)).is_empty(),
        "SQD starts nothing new"
    );
    assert_eq!(f.node_mut(a.node).poll_event(), None, "still draining");
    deliver(&mut f, &b, &first[0], t_us(1));
    let ack = transmit(&mut f, &b, t_us(1));
    deliver(&mut f, &a, &ack[0], t_us(2));
    assert_eq!(
        f.node_mut(a.node).poll_event().map(|e| e.event_type),
        Some(AsyncEventType::SqDrained)
    );
    let attr = hca::QpAttr {
        qp_state: QpState::Rts,
        ..hca::QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(a.qpn, &attr, hca::QpAttrMask::STATE)
        .unwrap();
    assert_eq!(transmit(&mut f, &a, t_us(3)).len(), 1, "resumed");
}

// ---- RESET, ERR and flushing ----

#[test]
fn modify_to_reset_with_work_outstanding_discards_it_and_the_qp_reconnects_cleanly() {
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    a.write(0, &[0x42; 3000]);
    for i in 0..8 {
        post(&mut f, &a, write(&a, i, (0, 3000), &b, 0));
    }
    post(&mut f, &a, read(&a, 100, (8192, 64), &b, 0));
    post_recv(&mut f, &a, 200, &[a.sge(16384, 64)]);
    let sent = transmit(&mut f, &a, t_us(0));
    assert!(!sent.is_empty());
    deliver_all(&mut f, &b, &sent, t_us(1));
    let responses = transmit(&mut f, &b, t_us(1));
    assert!(!responses.is_empty());
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    for p in [&a, &b] {
        f.node_mut(p.node)
            .modify_qp(p.qpn, &reset, QpAttrMask::STATE)
            .unwrap();
    }
    assert!(
        poll(&mut f, &a).is_empty(),
        "RESET discards WRs without completions"
    );
    assert!(transmit(&mut f, &a, t_us(2)).is_empty());
    assert_eq!(
        f.node_mut(a.node).poll_timeout(),
        None,
        "no timer survives RESET"
    );
    // Late responses to the old connection reach a QP in RESET: dropped.
    deliver_all(&mut f, &a, &responses, t_us(2));
    assert_eq!(drops(&f, &a, DropReason::QpState), responses.len() as u64);
    assert!(poll(&mut f, &a).is_empty());
    // Reconnect with fresh PSNs: old packets are stale, new traffic works.
    bring_up(&mut f, &a, &b, 7000, 9000, &o);
    bring_up(&mut f, &b, &a, 9000, 7000, &o);
    deliver_all(&mut f, &b, &sent, t_us(3));
    let stale = transmit(&mut f, &b, t_us(3));
    for p in &stale {
        // Duplicates of a PSN range B never expected in this life: at most an ACK of 6999 or a
        // sequence NAK; never a READ response.
        assert_eq!(p.opcode(), Opcode::RcAcknowledge);
    }
    deliver_all(&mut f, &a, &stale, t_us(3));
    b.write(0, &[0; 3000]);
    post(&mut f, &a, write(&a, 1, (0, 3000), &b, 0));
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), [(1, WcStatus::Success)]);
    assert_eq!(b.read(0, 3000), vec![0x42; 3000]);
}

#[test]
fn write_with_a_wrong_rkey_is_rem_access_err_and_flushes_every_later_wr() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &a, 70, &[a.sge(0, 64)]);
    post_recv(&mut f, &a, 71, &[a.sge(0, 64)]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 100)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey() ^ 0x55,
            },
        ),
    );
    post(&mut f, &a, write(&a, 2, (0, 100), &b, 0));
    post_send(&mut f, &a, &send_wr(3, &[a.sge(0, 10)], SendOp::Send));
    let wcs = run_for_completions(&mut f, &a, 5, Duration::from_millis(10));
    let got = statuses(&wcs);
    assert_eq!(
        got,
        [
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (70, WcStatus::WrFlushErr),
            (71, WcStatus::WrFlushErr),
        ]
    );
    assert!(wcs[3].opcode == WcOpcode::Recv);
    assert_eq!(
        f.node(a.node).context().qp(a.qpn).unwrap().state(),
        QpState::Err
    );
    assert_eq!(
        f.node(b.node).context().qp(b.qpn).unwrap().state(),
        QpState::Err
    );
    assert_eq!(
        f.node_mut(b.node).poll_event().map(|e| e.event_type),
        Some(AsyncEventType::QpAccessErr)
    );
    // A WR posted in ERR completes at once with a flush error.
    post_send(&mut f, &a, &send_wr(4, &[a.sge(0, 10)], SendOp::Send));
    post_recv(&mut f, &a, 72, &[a.sge(0, 64)]);
    let late = statuses(&poll(&mut f, &a));
    assert_eq!(
        late,
        [(4, WcStatus::WrFlushErr), (72, WcStatus::WrFlushErr)]
    );
}

#[test]
fn cq_overrun_moves_the_qp_to_err_and_raises_cq_err() {
    let o = Opts {
        cq_depth: 1,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..3 {
        post(&mut f, &a, write(&a, i, (0, 8), &b, 0));
    }
    let _ = f.run_until(|_| false, Duration::from_millis(1));
    let events: Vec<_> = std::iter::from_fn(|| f.node_mut(a.node).poll_event())
        .map(|e| e.event_type)
        .collect();
    assert!(events.contains(&AsyncEventType::CqErr), "{events:?}");
    assert!(events.contains(&AsyncEventType::QpFatal), "{events:?}");
    assert_eq!(
        f.node(a.node).context().qp(a.qpn).unwrap().state(),
        QpState::Err
    );
    assert!(f.node(a.node).counters().cq_overrun_lost > 0);
    assert_eq!(poll(&mut f, &a).len(), 1, "the CQ kept what it held");
}

#[test]
fn receive_cq_overrun_moves_the_qp_to_err_and_reports_it() {
    let o = Opts {
        cq_depth: 2,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..6 {
        post_recv(&mut f, &b, i, &[b.sge(i * 256, 256)]);
    }
    for i in 0..6 {
        post_send(
            &mut f,
            &a,
            &SendWr {
                wr_id: i,
                sg_list: &[a.sge(0, 16)],
                op: SendOp::Send,
                send_flags: SendFlags::empty(),
            },
        );
    }
    let _ = f.run_until(|_| false, Duration::from_millis(200));
    let h = f.node_mut(b.node);
    assert!(h.context().cq(b.cq).unwrap().is_overrun());
    let mut saw_cq_err = false;
    while let Some(e) = h.poll_event() {
        saw_cq_err |= e.event_type == hca::AsyncEventType::CqErr;
    }
    assert!(saw_cq_err);
    assert_eq!(state(&f, &b), QpState::Err);
    // A's sends fail or flush: none is reported as delivered unless B delivered it.
    let wcs = poll(&mut f, &a);
    assert!(wcs.iter().all(|w| w.status != WcStatus::Success), "{wcs:?}");
}

// ---- destroying objects ----

#[test]
fn destroying_objects_in_use_is_refused_and_a_destroyed_qps_packets_are_dropped() {
    let (mut f, a, b) = a_with_one_write();
    let h = f.node_mut(a.node);
    assert_eq!(h.destroy_cq(a.cq).unwrap_err().errno(), hca::errno::EBUSY);
    assert_eq!(h.dealloc_pd(a.pd).unwrap_err().errno(), hca::errno::EBUSY);
    let srq = h
        .create_srq(
            a.pd,
            &hca::SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let qpn = h
        .create_qp(
            a.pd,
            &hca::QpInitAttr {
                qp_type: hca::QpType::Rc,
                send_cq: a.cq,
                recv_cq: a.cq,
                srq: Some(srq),
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
    assert_eq!(h.destroy_srq(srq).unwrap_err().errno(), hca::errno::EBUSY);
    h.destroy_qp(qpn).unwrap();
    h.destroy_srq(srq).unwrap();
    // Destroy A's QP with its WRITE outstanding: no completion, no timer fires into nothing.
    h.destroy_qp(a.qpn).unwrap();
    assert!(poll(&mut f, &a).is_empty());
    let ack = craft(&b, &a, Opcode::RcAcknowledge, A_PSN, aeth_ext(ack()), &[]);
    deliver(&mut f, &a, &ack, t_us(1));
    assert_eq!(drops(&f, &a, DropReason::Qpn), 1);
    f.node_mut(a.node).handle_timeout(t_us(1_000_000));
    assert!(transmit(&mut f, &a, t_us(1_000_000)).is_empty());
    assert_eq!(f.node_mut(a.node).poll_timeout(), None);
    // Now the CQ and PD can go (after the MR).
    let h = f.node_mut(a.node);
    h.destroy_cq(a.cq).unwrap();
    h.dereg_mr(a.mr.lkey()).unwrap();
    h.dealloc_pd(a.pd).unwrap();
}
