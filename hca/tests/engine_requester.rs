//! The requester (`engine/requester.rs`, rxe `rxe_req.c`) and the send queue it walks
//! (`engine/send_queue.rs`): what ibv_post_send(3) refuses, how WQEs become request packets (one
//! PSN per packet, IBTA vol. 1 §9.7.1; a zero-byte message is one packet; PSNs wrap at 2^24),
//! what holds a WQE back (fences, `max_rd_atomic`, the unacknowledged-PSN window), and the UC and
//! UD requesters (IBTA vol. 1 §9.8.4, §9.8.5).

mod common;

use std::time::Duration;

use common::uc_ud::*;
use common::work_requests::*;
use common::*;
use hca::{QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use roce::Opcode;

// ---- what ibv_post_send(3) refuses ----

#[test]
fn posting_beyond_max_send_wr_is_enomem_and_changes_nothing() {
    let o = Opts {
        depth: 4,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let wr = |i| SendWr {
        wr_id: i,
        sg_list: &[],
        op: SendOp::RdmaWrite {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        },
        send_flags: SendFlags::SIGNALED,
    };
    // rxe rounds depths up to 2^n - 1: ask the QP what it provides.
    let cap = *f.node(a.node).context().qp(a.qpn).unwrap().cap();
    let depth = u64::from(cap.max_send_wr);
    assert!(depth >= 4);
    for i in 0..depth {
        f.node_mut(a.node).post_send(a.qpn, &wr(i)).unwrap();
    }
    for i in depth..10_000 {
        let e = f.node_mut(a.node).post_send(a.qpn, &wr(i)).unwrap_err();
        assert_eq!(e.errno(), hca::errno::ENOMEM);
    }
    let wcs = run_for_completions(&mut f, &a, depth as usize, Duration::from_secs(1));
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..depth).collect::<Vec<_>>()
    );
    f.node_mut(a.node).post_send(a.qpn, &wr(depth)).unwrap();
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_secs(1));
    assert_eq!(wcs[0].wr_id, depth);
    // The receive queue too.
    for i in 0..u64::from(cap.max_recv_wr) {
        post_recv(&mut f, &b, i, &[]);
    }
    let e = f
        .node_mut(b.node)
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 9,
                sg_list: &[],
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), hca::errno::ENOMEM);
}

#[test]
fn too_many_sges_too_much_inline_and_oversized_messages_are_refused_with_einval() {
    let (mut f, a, b) = pair(&Opts::default());
    let einval = |f: &mut hca::fabric::Fabric, wr: &SendWr<'_>| {
        let e = f.node_mut(a.node).post_send(a.qpn, wr).unwrap_err();
        assert_eq!(e.errno(), hca::errno::EINVAL, "{e}");
    };
    // rxe sizes the send WQE for max(16 x max_send_sge, max_inline_data): ask what it provides.
    let cap = *f.node(a.node).context().qp(a.qpn).unwrap().cap();
    let nine: Vec<Sge> = (0..u64::from(cap.max_send_sge) + 1)
        .map(|i| a.sge(i * 8, 8))
        .collect();
    einval(&mut f, &send_wr(1, &nine, SendOp::Send)); // max_send_sge + 1
    let long = [a.sge(0, cap.max_inline_data + 1)];
    let mut inline = send_wr(2, &long, SendOp::Send);
    inline.send_flags |= SendFlags::INLINE;
    einval(&mut f, &inline);
    let huge = [
        Sge {
            addr: 0,
            length: 1 << 30,
            lkey: a.mr.lkey(),
        },
        Sge {
            addr: 0,
            length: (1 << 30) + 1,
            lkey: a.mr.lkey(),
        },
    ];
    einval(&mut f, &send_wr(3, &huge, SendOp::Send)); // 2^31 + 1 bytes
    let max: Vec<Sge> = (0..cap.max_send_sge)
        .map(|_| Sge {
            addr: 0,
            length: u32::MAX,
            lkey: a.mr.lkey(),
        })
        .collect();
    einval(
        &mut f,
        &send_wr(
            4,
            &max,
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    // An atomic with a 4-byte buffer, and a misaligned atomic.
    einval(
        &mut f,
        &send_wr(
            5,
            &[a.sge(0, 4)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
                add: 1,
            },
        ),
    );
    einval(
        &mut f,
        &send_wr(
            6,
            &[a.sge(0, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(4),
                rkey: b.mr.rkey(),
                add: 1,
            },
        ),
    );
    // Inline SGEs must lie in registered memory: u64::MAX is not.
    let top = [Sge {
        addr: u64::MAX - 3,
        length: 8,
        lkey: a.mr.lkey(),
    }];
    let mut bad_inline = send_wr(7, &top, SendOp::Send);
    bad_inline.send_flags |= SendFlags::INLINE;
    einval(&mut f, &bad_inline);
    // Receive WRs: too many SGEs, too long.
    let rcap = *f.node(b.node).context().qp(b.qpn).unwrap().cap();
    let too_many: Vec<Sge> = (0..u64::from(rcap.max_recv_sge) + 1)
        .map(|i| b.sge(i * 8, 8))
        .collect();
    let e = f
        .node_mut(b.node)
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 1,
                sg_list: &too_many,
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), hca::errno::EINVAL);
    let e = f
        .node_mut(b.node)
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 1,
                sg_list: &huge,
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), hca::errno::EINVAL);
    assert!(transmit(&mut f, &a, t_us(0)).is_empty(), "nothing queued");
    assert!(poll(&mut f, &a).is_empty());
}

#[test]
fn ud_destination_qpn_over_24_bits_is_refused() {
    let o = Opts {
        qp_type: hca::QpType::Ud,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let ah = f
        .node_mut(a.node)
        .create_ah(
            a.pd,
            &hca::AhAttr {
                dgid: hca::Gid::from(b.ip),
                sgid_index: 2,
                hop_limit: 64,
                port_num: 1,
                ..hca::AhAttr::default()
            },
        )
        .unwrap();
    let sg = [a.sge(0, 8)];
    let wr = send_wr(
        1,
        &sg,
        SendOp::UdSend {
            dest: hca::UdDest {
                ah,
                remote_qpn: 1 << 24,
                remote_qkey: 0x1111_1111,
            },
            imm_data: None,
        },
    );
    let e = f.node_mut(a.node).post_send(a.qpn, &wr).unwrap_err();
    assert_eq!(e.errno(), hca::errno::EINVAL);
}

#[test]
fn sges_and_remote_addresses_near_u64_max_fail_with_loc_prot_err_and_rem_access_err() {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[Sge {
                addr: u64::MAX - 3,
                length: 8,
                lkey: a.mr.lkey(),
            }],
            SendOp::Send,
        ),
    );
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_millis(10));
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    drop((f, a, b));
    let (mut f, a, b2) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 64)],
            SendOp::RdmaWrite {
                remote_addr: u64::MAX - 3,
                rkey: b2.mr.rkey(),
            },
        ),
    );
    post(&mut f, &a, read(&a, 2, (0, 64), &b2, 0));
    let wcs = run_for_completions(&mut f, &a, 2, Duration::from_millis(100));
    assert_eq!(
        statuses(&wcs),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let (mut f, a, b) = pair(&Opts::default());
    a.write(0, b"inline!!");
    let (id, sg, op) = write(&a, 1, (0, 8), &b, 0);
    let mut wr = send_wr(id, &sg, op);
    wr.send_flags |= hca::SendFlags::INLINE;
    post_send(&mut f, &a, &wr);
    a.write(0, b"changed!");
    run_for_completions(&mut f, &a, 1, Duration::from_millis(5));
    assert_eq!(b.read(0, 8), b"inline!!");
}

#[test]
fn local_invalidate_invalidates_the_key_locally() {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[],
            SendOp::LocalInv {
                invalidate_rkey: a.mr.lkey(),
            },
        ),
    );
    post(&mut f, &a, write(&a, 2, (0, 8), &b, 0));
    let wcs = run_for_completions(&mut f, &a, 2, Duration::from_millis(5));
    assert_eq!(
        (wcs[0].opcode, wcs[0].status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    assert_eq!(
        wcs[1].status,
        WcStatus::LocProtErr,
        "the lkey is dead for the WRITE's SGE"
    );
}

// ---- PSNs: one per packet ----

#[test]
fn zero_byte_write_uses_exactly_one_psn() {
    let (mut f, a, b) = pair(&opts_with_psn(500));
    post(&mut f, &a, write(&a, 1, (0, 0), &b, 0));
    post(&mut f, &a, write(&a, 2, (0, 1), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts.len(), 2);
    assert_eq!(
        (pkts[0].psn(), pkts[0].opcode()),
        (500, Opcode::RcRdmaWriteOnly)
    );
    let p = pkts[0].parsed();
    assert_eq!(p.payload.len(), 0);
    assert_eq!(p.transport.ext.reth.unwrap().dma_len, 0);
    assert_eq!(pkts[1].psn(), 501);
    deliver_all(&mut f, &b, &pkts, t_us(1));
    let acks = transmit(&mut f, &b, t_us(1));
    assert_eq!(acks.len(), 1, "coalesced");
    assert_eq!(acks[0].psn(), 501);
    assert_eq!(f.node(b.node).counters().ack_deferred, 1);
    deliver(&mut f, &a, &acks[0], t_us(2));
    assert_eq!(poll(&mut f, &a).len(), 2);
}

#[test]
fn zero_byte_send_and_read_use_one_psn_each() {
    let (mut f, a, b) = pair(&opts_with_psn(7));
    post_recv(&mut f, &b, 1, &[b.sge(0, 16)]);
    post_send(&mut f, &a, &send_wr(1, &[], SendOp::Send));
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[],
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
        ),
    );
    post(&mut f, &a, write(&a, 3, (0, 4), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    let ops: Vec<_> = pkts.iter().map(|p| (p.psn(), p.opcode())).collect();
    assert_eq!(
        ops,
        [
            (7, Opcode::RcSendOnly),
            (8, Opcode::RcRdmaReadRequest),
            (9, Opcode::RcRdmaWriteOnly)
        ]
    );
    deliver_all(&mut f, &b, &pkts, t_us(1));
    let out = transmit(&mut f, &b, t_us(1));
    deliver_all(&mut f, &a, &out, t_us(2));
    let wcs = poll(&mut f, &a);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let rw = poll(&mut f, &b);
    assert_eq!((rw[0].byte_len, rw[0].status), (0, WcStatus::Success));
}

#[test]
fn request_psns_wrap_at_2_24() {
    let (mut f, a, b) = pair(&opts_with_psn(0xff_fffe));
    post(&mut f, &a, write(&a, 1, (0, 4000), &b, 0));
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(
        pkts.iter().map(Pkt::psn).collect::<Vec<_>>(),
        [0xff_fffe, 0xff_ffff, 0, 1]
    );
    deliver_all(&mut f, &b, &pkts, t_us(1));
    let ack = transmit(&mut f, &b, t_us(1));
    assert_eq!(ack[0].psn(), 1);
    deliver(&mut f, &a, &ack[0], t_us(2));
    assert_eq!(poll(&mut f, &a)[0].status, WcStatus::Success);
}

// ---- what holds a WQE back: fences, max_rd_atomic, the PSN window ----

#[test]
fn a_fenced_wr_waits_for_earlier_reads() {
    let (mut f, a, b) = pair(&Opts::default());
    post(&mut f, &a, read(&a, 1, (0, 8), &b, 0));
    let (id, sg, op) = write(&a, 2, (0, 8), &b, 0);
    let mut wr = send_wr(id, &sg, op);
    wr.send_flags |= hca::SendFlags::FENCE;
    post_send(&mut f, &a, &wr);
    let first = transmit(&mut f, &a, t_us(0));
    assert_eq!(first.len(), 1, "the fenced WRITE waits");
    deliver(&mut f, &b, &first[0], t_us(1));
    let resp = transmit(&mut f, &b, t_us(1));
    deliver(&mut f, &a, &resp[0], t_us(2));
    let next = transmit(&mut f, &a, t_us(2));
    assert_eq!(next[0].opcode(), Opcode::RcRdmaWriteOnly);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let o = Opts {
        max_rd_atomic: 2,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..4 {
        post(&mut f, &a, read(&a, i, (i * 8, 8), &b, 0));
    }
    let first = transmit(&mut f, &a, t_us(0));
    assert_eq!(first.len(), 2);
    deliver(&mut f, &b, &first[0], t_us(1));
    let r = transmit(&mut f, &b, t_us(1));
    deliver(&mut f, &a, &r[0], t_us(2));
    assert_eq!(
        transmit(&mut f, &a, t_us(2)).len(),
        1,
        "one completed, one more may go"
    );
}

/// A READ's responses are not acknowledged, so a requester bounds them itself: a READ longer
/// than half the unacknowledged-PSN window goes out as READ requests of half the window each
/// (aligned to its first PSN), the next when its responses fit the window with those still
/// outstanding and `max_rd_atomic` has room (IBTA vol. 1 §9.7.4.1.4: a READ request for part of
/// a READ's range, as a retried one is). The data and the single completion are the same.
#[test]
fn a_read_longer_than_half_the_window_is_requested_in_segments_two_at_a_time() {
    let mut o = opts_with_psn(0xff_fffa); // the segments cross the PSN wrap
    o.config.max_unacked_psns = 16;
    let (mut f, a, b) = pair(&o);
    const PMTU: u64 = 1024;
    let len = 37 * PMTU as u32 + 100; // 38 packets: segments of 8, 8, 8, 8, 6
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 7) as u8).collect();
    b.write(8192, &data);
    post(&mut f, &a, read(&a, 5, (65536, len), &b, 8192));
    let mut requests = Vec::new();
    let mut now = 0;
    loop {
        now += 1;
        let reqs = transmit(&mut f, &a, t_us(now));
        if reqs.is_empty() {
            break;
        }
        assert!(
            reqs.len() <= 2,
            "at most two segments outstanding: {}",
            reqs.len()
        );
        for r in &reqs {
            assert_eq!(r.opcode(), Opcode::RcRdmaReadRequest);
            let reth = r.parsed().transport.ext.reth.unwrap();
            requests.push((r.psn(), reth.virtual_address - b.addr(8192), reth.dma_len));
            deliver(&mut f, &b, r, t_us(now));
        }
        now += 1;
        let resps = transmit(&mut f, &b, t_us(now));
        deliver_all(&mut f, &a, &resps, t_us(now));
        assert!(requests.len() <= 5, "{requests:?}");
    }
    let psn = |k: u32| (0xff_fffa + 8 * k) & 0xff_ffff;
    let k8 = |k: u64| 8 * k * PMTU;
    assert_eq!(
        requests,
        [
            (psn(0), 0, 8 * 1024),
            (psn(1), k8(1), 8 * 1024),
            (psn(2), k8(2), 8 * 1024),
            (psn(3), k8(3), 8 * 1024),
            (psn(4), k8(4), 5 * 1024 + 100),
        ]
    );
    let wcs = poll(&mut f, &a);
    assert_eq!(statuses(&wcs), [(5, WcStatus::Success)]);
    assert_eq!(a.read(65536, len as usize), data);
}

/// With `max_rd_atomic` 1 the segments of a READ go one at a time: each is one READ request
/// outstanding, and the initiator depth (ibv_modify_qp(3) `max_rd_atomic`) bounds outstanding
/// READ requests, not WRs.
#[test]
fn read_segments_respect_max_rd_atomic() {
    let mut o = opts_with_psn(100);
    o.config.max_unacked_psns = 16;
    o.max_rd_atomic = 1;
    let (mut f, a, b) = pair(&o);
    let len = 24 * 1024;
    post(&mut f, &a, read(&a, 1, (0, len), &b, 0));
    let mut seen = Vec::new();
    for now in 1..20 {
        let reqs = transmit(&mut f, &a, t_us(2 * now));
        if reqs.is_empty() {
            break;
        }
        assert_eq!(reqs.len(), 1, "one READ request outstanding at a time");
        seen.push(reqs[0].psn());
        deliver(&mut f, &b, &reqs[0], t_us(2 * now));
        let resps = transmit(&mut f, &b, t_us(2 * now + 1));
        deliver_all(&mut f, &a, &resps, t_us(2 * now + 1));
    }
    assert_eq!(seen, [100, 108, 116]);
    assert_eq!(poll(&mut f, &a).len(), 1);
}

// ---- UC and UD requesters (IBTA vol. 1 §9.8.4, §9.8.5) ----

#[test]
fn uc_send_and_write_complete_when_sent_without_acks() {
    let (mut f, a, b) = pair(&uc());
    a.write(0, &[7; 3000]);
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 3000)], SendOp::Send));
    post(&mut f, &a, write(&a, 2, (0, 100), &b, 10_000));
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
        statuses(&wa),
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
