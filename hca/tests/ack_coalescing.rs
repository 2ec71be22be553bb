//! ACKs leave together with the requests of their QP: a plain ACK lets one request packet go
//! first, and with `EngineConfig::ack_delay` a lone ACK waits a bounded time for one, so a
//! request/response exchange costs one send for both (IBTA vol. 1 §9.7.5: an ACK acknowledges
//! every earlier PSN, so responders may coalesce and delay them).

mod common;

use std::time::Duration;

use common::*;
use hca::{SendOp, WcStatus};
use roce::Opcode;

fn shape(pkts: &[Pkt]) -> Vec<Opcode> {
    pkts.iter().map(Pkt::opcode).collect()
}

fn opts(delay_us: u64) -> Opts {
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
fn the_ack_rides_right_behind_the_reply() {
    let (mut f, a, b) = pair(&opts(0));
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
    let (mut f, a, b) = pair(&opts(0));
    one_send(&mut f, &a, &b);
    assert_eq!(
        shape(&transmit(&mut f, &b, t_us(3))),
        [Opcode::RcAcknowledge]
    );
}

#[test]
fn a_held_ack_waits_for_the_reply_and_leaves_with_it() {
    let (mut f, a, b) = pair(&opts(20));
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
    let (mut f, a, b) = pair(&opts(20));
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
    let (mut f, a, b) = pair(&opts(20));
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
    let (mut f, a, b) = pair(&opts(20));
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
    let (mut f, a, b) = pair(&opts(20));
    one_send(&mut f, &a, &b);
    b.write(4096, &[7; 100]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(4096, 100)],
            SendOp::RdmaRead {
                remote_addr: b.addr(4096),
                rkey: b.mr.rkey(),
            },
        ),
    );
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
fn ping_pong_through_the_fabric_with_a_delay() {
    let (mut f, a, b) = pair(&opts(20));
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
