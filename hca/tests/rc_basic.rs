//! RC end to end through the fabric: SEND, RDMA WRITE, RDMA READ, atomics.

mod common;

use std::time::Duration;

use common::*;
use hca::{SendOp, WcFlags, WcOpcode, WcStatus};

#[test]
fn rc_send_multi_packet_lands_in_the_receive_buffer() {
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
