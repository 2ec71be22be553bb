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

#[test]
fn rc_write_read_and_atomics() {
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
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(100_000, 10_000)],
            SendOp::RdmaRead {
                remote_addr: b.addr(50_000),
                rkey: b.mr.rkey(),
            },
        ),
    );
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
