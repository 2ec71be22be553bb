//! Receive validation: every check drops, counts under its own reason, and never panics; random
//! bytes and random metadata cannot hurt the engine.

mod common;

use common::*;
use hca::SendOp;

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
