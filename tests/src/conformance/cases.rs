//! The cases. Each builds its own sides (`a`: requester, `b`: responder), checks the rule it is
//! named after and records what it saw; see the [suite docs](super).

use hca::{AccessFlags, QpState, QpType, SendFlags, SendOp, Sge, SrqAttr, SrqAttrMask, UdDest};
use hca::{AsyncEventType, WcStatus};

use super::harness::{
    digest, expect_wcs, outcome, pattern, record_wcs, Conn, Ctx, Side, SideOpts, QKEY,
};
use super::{Case, Devices, Record, QUIET, WAIT};

/// Every case, in the order a run takes them.
pub static CASES: &[Case] = &[
    Case {
        name: "rc_send_completions",
        rule:
            "IBTA vol. 1 §10.7.2 / ibv_poll_cq(3): a SEND completes at both ends with its wr_id, \
               opcode and (receiver) byte_len, in posting order; 0-byte and multi-packet messages",
        run: rc_send_completions,
    },
    Case {
        name: "rc_send_with_imm",
        rule: "IBTA vol. 1 §9.4.1.1: SEND with immediate delivers imm_data in the receive \
               completion with IBV_WC_WITH_IMM",
        run: rc_send_with_imm,
    },
    Case {
        name: "rc_unsignaled_sends",
        rule: "IBTA vol. 1 §10.8.3.1 / ibv_post_send(3): without IBV_SEND_SIGNALED (and no \
               sq_sig_all) a successful send WR completes silently",
        run: rc_unsignaled_sends,
    },
    Case {
        name: "rc_sq_sig_all",
        rule: "ibv_create_qp(3): sq_sig_all makes every send WR produce a completion",
        run: rc_sq_sig_all,
    },
    Case {
        name: "rc_rdma_write",
        rule: "IBTA vol. 1 §9.4.3: RDMA WRITE places data at the responder without consuming a \
               receive WR; a later SEND consumes the first one",
        run: rc_rdma_write,
    },
    Case {
        name: "rc_rdma_write_with_imm",
        rule: "IBTA vol. 1 §9.4.3: RDMA WRITE with immediate consumes a receive WR and completes \
               it as IBV_WC_RECV_RDMA_WITH_IMM with the written length",
        run: rc_rdma_write_with_imm,
    },
    Case {
        name: "rc_rdma_read",
        rule: "IBTA vol. 1 §9.4.4: RDMA READ returns the responder's bytes, multi-packet",
        run: rc_rdma_read,
    },
    Case {
        name: "rc_atomics",
        rule: "IBTA vol. 1 §9.4.5: CMP_AND_SWAP / FETCH_AND_ADD return the original value and \
               update the target atomically",
        run: rc_atomics,
    },
    Case {
        name: "rc_inline_send",
        rule: "ibv_post_send(3) IBV_SEND_INLINE: the data is copied at post time; a buffer \
               changed after posting does not change the message",
        run: rc_inline_send,
    },
    Case {
        name: "rc_multi_sge",
        rule: "IBTA vol. 1 §10.7.1: gather lists (SEND, WRITE) and scatter lists (receive, READ) \
               concatenate in order",
        run: rc_multi_sge,
    },
    Case {
        name: "rc_rem_access_bad_rkey",
        rule: "IBTA vol. 1 C9-88 / §10.6.3.6: an invalid rkey is a remote access error \
               (IBV_WC_REM_ACCESS_ERR); the requester's QP goes to ERR",
        run: rc_rem_access_bad_rkey,
    },
    Case {
        name: "rc_rem_access_out_of_range",
        rule: "IBTA vol. 1 C9-88: an access beyond the MR is a remote access error",
        run: rc_rem_access_out_of_range,
    },
    Case {
        name: "rc_rem_access_deregistered",
        rule: "IBTA vol. 1 §10.6.3.6: the rkey of a deregistered MR is invalid",
        run: rc_rem_access_deregistered,
    },
    Case {
        name: "rc_rem_access_no_permission",
        rule: "IBTA vol. 1 C9-88 / C10-86: an RDMA WRITE to an MR without remote write access is \
               a remote access error",
        run: rc_rem_access_no_permission,
    },
    Case {
        name: "rc_recv_too_small",
        rule: "IBTA vol. 1 §9.9.3 / §10.7.2.2: a SEND longer than the receive WR's buffers fails \
               at both ends (requester: invalid request NAK)",
        run: rc_recv_too_small,
    },
    Case {
        name: "rc_loc_prot_err",
        rule: "IBTA vol. 1 §10.8.3 / ibv_poll_cq(3): a gather SGE with an invalid lkey completes \
               with IBV_WC_LOC_PROT_ERR",
        run: rc_loc_prot_err,
    },
    Case {
        name: "rc_rnr_retry_exceeded",
        rule: "IBTA vol. 1 §9.7.5.2.8 / C9-147: with rnr_retry 0, an RNR NAK ends the WR with \
               IBV_WC_RNR_RETRY_EXC_ERR",
        run: rc_rnr_retry_exceeded,
    },
    Case {
        name: "rc_rnr_then_success",
        rule: "IBTA vol. 1 §9.7.5.2.8: after RNR NAKs the requester retries; a receive posted in \
               time gets the message",
        run: rc_rnr_then_success,
    },
    Case {
        name: "rc_retry_exceeded_dead_peer",
        rule: "IBTA vol. 1 §9.7.6.1.3 / C9-140: with no response, retry_cnt retransmissions after \
               the local ACK timeout end the WR with IBV_WC_RETRY_EXC_ERR",
        run: rc_retry_exceeded_dead_peer,
    },
    Case {
        name: "rc_flush_on_error",
        rule: "IBTA vol. 1 §10.3.1 / C10-29: a QP moved to ERR completes every outstanding WR \
               with IBV_WC_WR_FLUSH_ERR in posting order; WRs posted in ERR flush too",
        run: rc_flush_on_error,
    },
    Case {
        name: "ud_send_grh",
        rule: "IBTA vol. 1 §11.4.1.2 / Annex A17.4.5.1: a UD receive buffer starts with the \
               40-byte GRH area; for RoCEv2 over IPv4 its last 20 bytes are the IPv4 header",
        run: ud_send_grh,
    },
    Case {
        name: "ud_qkey_mismatch",
        rule: "IBTA vol. 1 C10-15 / §10.2.4: a UD datagram with the wrong Q_Key is dropped \
               silently; the sender completes successfully",
        run: ud_qkey_mismatch,
    },
    Case {
        name: "srq_shared_receives",
        rule: "IBTA vol. 1 §10.2.9: QPs on one SRQ consume its WRs in order; the completion \
               names the QP; ibv_post_recv(3) on such a QP is refused; the SRQ limit event fires",
        run: srq_shared_receives,
    },
    Case {
        name: "uc_send_and_write",
        rule: "IBTA vol. 1 §9.8: UC SEND and RDMA WRITE with immediate complete and deliver",
        run: uc_send_and_write,
    },
    Case {
        name: "post_send_refusals",
        rule: "ibv_post_send(3): a bad WR is refused with EINVAL (too many SGEs, inline too long, \
               atomic length, opcode for the QP type, QP not in RTS), a full queue with ENOMEM \
               at the first WR that does not fit (bad_wr)",
        run: post_send_refusals,
    },
    Case {
        name: "post_recv_refusals",
        rule: "ibv_post_recv(3): too many SGEs EINVAL, a full receive queue ENOMEM at bad_wr",
        run: post_recv_refusals,
    },
];

/// `a` and `b` with one RC QP each, connected with `c`.
fn rc_pair(d: &Devices, oa: SideOpts, ob: SideOpts, c: Conn) -> Result<(Side, Side), String> {
    let a = Side::new(&d.a, 'a', oa)?;
    let b = Side::new(&d.b, 'b', ob)?;
    a.connect(0, &b, 0, c)?;
    b.connect(0, &a, 0, c)?;
    Ok((a, b))
}

fn rc_default(d: &Devices) -> Result<(Side, Side), String> {
    let o = SideOpts::new(QpType::Rc);
    rc_pair(d, o, o, Conn::default())
}

fn rc_send_completions(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let sizes = [0usize, 100, 3000];
    for (i, &len) in sizes.iter().enumerate() {
        a.fill(i * 4096, &pattern(i as u8, len))?;
        b.post_recv(0, 10 + i as u64, &[b.sge(i * 4096, 4096)])
            .ctx("post_recv")?;
    }
    for (i, &len) in sizes.iter().enumerate() {
        let sg: Vec<_> = (len > 0)
            .then(|| a.sge(i * 4096, len as u32))
            .into_iter()
            .collect();
        a.post_send(0, 1 + i as u64, &sg, SendOp::Send, SendFlags::SIGNALED)
            .ctx("post_send")?;
    }
    let sw = a.wait_send(3, WAIT)?;
    let rw = b.wait_recv(3, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender completions", &sw, &[(1, ok), (2, ok), (3, ok)]);
    expect_wcs(
        r,
        "receiver completions",
        &rw,
        &[(10, ok), (11, ok), (12, ok)],
    );
    let lens: Vec<u32> = rw.iter().map(|w| w.byte_len).collect();
    r.expect_eq("receive byte_len", lens, vec![0, 100, 3000]);
    for (i, &len) in sizes.iter().enumerate() {
        let got = b.read(i * 4096, len)?;
        r.set(format!("b.data{i}"), digest(&got));
        r.check(got == pattern(i as u8, len), || {
            format!("message {i} data differs")
        });
    }
    Ok(())
}

fn rc_send_with_imm(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    a.fill(0, &pattern(3, 64))?;
    b.post_recv(0, 7, &[b.sge(0, 256)]).ctx("post_recv")?;
    let op = SendOp::SendWithImm {
        imm_data: 0x1234_5678,
    };
    a.post_send(0, 1, &[a.sge(0, 64)], op, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(r, "receiver", &rw, &[(7, WcStatus::Success)]);
    r.expect_eq(
        "imm_data",
        rw.first().and_then(|w| w.imm_data),
        Some(0x1234_5678),
    );
    let got = b.read(0, 64)?;
    r.set("b.data", digest(&got));
    r.check(got == pattern(3, 64), || "data differs".into());
    Ok(())
}

fn rc_unsignaled_sends(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    for i in 0..3u64 {
        b.post_recv(0, 10 + i, &[b.sge(0, 256)]).ctx("post_recv")?;
    }
    let flags = [SendFlags::empty(), SendFlags::empty(), SendFlags::SIGNALED];
    for (i, f) in flags.iter().enumerate() {
        a.post_send(0, 1 + i as u64, &[a.sge(0, 32)], SendOp::Send, *f)
            .ctx("post_send")?;
    }
    let rw = b.wait_recv(3, WAIT)?;
    let mut sw = a.wait_send(1, WAIT)?;
    sw.extend(a.wait_send(1, QUIET)?);
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(
        r,
        "sender (only the signaled WR)",
        &sw,
        &[(3, WcStatus::Success)],
    );
    r.expect_eq("receives", rw.len(), 3);
    Ok(())
}

fn rc_sq_sig_all(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut oa = SideOpts::new(QpType::Rc);
    oa.sq_sig_all = true;
    let (a, b) = rc_pair(d, oa, SideOpts::new(QpType::Rc), Conn::default())?;
    for i in 0..2u64 {
        b.post_recv(0, 10 + i, &[b.sge(0, 256)]).ctx("post_recv")?;
        a.post_send(0, 1 + i, &[a.sge(0, 32)], SendOp::Send, SendFlags::empty())
            .ctx("post_send")?;
    }
    let sw = a.wait_send(2, WAIT)?;
    let rw = b.wait_recv(2, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender", &sw, &[(1, ok), (2, ok)]);
    Ok(())
}

fn rc_rdma_write(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let data = pattern(5, 5000);
    a.fill(0, &data)?;
    a.fill(8192, &pattern(6, 16))?;
    b.post_recv(0, 20, &[b.sge(32768, 256)]).ctx("post_recv")?;
    let op = SendOp::RdmaWrite {
        remote_addr: b.addr(8192),
        rkey: b.mr.rkey(),
    };
    a.post_send(0, 1, &[a.sge(0, 5000)], op, SendFlags::SIGNALED)
        .ctx("post_send write")?;
    a.post_send(0, 2, &[a.sge(8192, 16)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send send")?;
    let sw = a.wait_send(2, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender", &sw, &[(1, ok), (2, ok)]);
    expect_wcs(r, "receiver (the SEND only)", &rw, &[(20, ok)]);
    r.expect_eq("receive byte_len", rw.first().map(|w| w.byte_len), Some(16));
    let got = b.read(8192, 5000)?;
    r.set("b.written", digest(&got));
    r.check(got == data, || "written data differs".into());
    Ok(())
}

fn rc_rdma_write_with_imm(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let data = pattern(7, 3000);
    a.fill(0, &data)?;
    b.post_recv(0, 30, &[]).ctx("post_recv")?;
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: b.addr(4096),
        rkey: b.mr.rkey(),
        imm_data: 0xcafe_f00d,
    };
    a.post_send(0, 1, &[a.sge(0, 3000)], op, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(r, "receiver", &rw, &[(30, WcStatus::Success)]);
    r.expect_eq(
        "receive (byte_len, imm)",
        rw.first().map(|w| (w.byte_len, w.imm_data)),
        Some((3000, Some(0xcafe_f00d))),
    );
    let got = b.read(4096, 3000)?;
    r.set("b.written", digest(&got));
    r.check(got == data, || "written data differs".into());
    Ok(())
}

fn rc_rdma_read(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let data = pattern(9, 5000);
    b.fill(1000, &data)?;
    let op = SendOp::RdmaRead {
        remote_addr: b.addr(1000),
        rkey: b.mr.rkey(),
    };
    a.post_send(0, 1, &[a.sge(16384, 5000)], op, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::Success)]);
    let got = a.read(16384, 5000)?;
    r.set("a.read", digest(&got));
    r.check(got == data, || "read data differs".into());
    Ok(())
}

fn rc_atomics(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    b.fill(64, &100u64.to_ne_bytes())?;
    let target = b.addr(64);
    let rkey = b.mr.rkey();
    let ops = [
        SendOp::AtomicCmpAndSwp {
            remote_addr: target,
            rkey,
            compare: 100,
            swap: 7,
        },
        SendOp::AtomicCmpAndSwp {
            remote_addr: target,
            rkey,
            compare: 100,
            swap: 9,
        },
        SendOp::AtomicFetchAndAdd {
            remote_addr: target,
            rkey,
            add: 5,
        },
    ];
    let mut originals = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        a.post_send(
            0,
            1 + i as u64,
            &[a.sge(i * 8, 8)],
            *op,
            SendFlags::SIGNALED,
        )
        .ctx("post_send")?;
        // One at a time: each original value depends on the one before.
        let sw = a.wait_send(1, WAIT)?;
        record_wcs(r, &format!("a.send_cq{i}"), &sw, &a, &b);
        expect_wcs(
            r,
            &format!("atomic {i}"),
            &sw,
            &[(1 + i as u64, WcStatus::Success)],
        );
        let orig = u64::from_ne_bytes(a.read(i * 8, 8)?.try_into().unwrap_or_default());
        r.set(format!("orig{i}"), orig);
        originals.push(orig);
    }
    let fin = u64::from_ne_bytes(b.read(64, 8)?.try_into().unwrap_or_default());
    r.set("final", fin);
    r.expect_eq(
        "original values (CAS hit, CAS miss, FAA)",
        originals,
        vec![100, 7, 7],
    );
    r.expect_eq("final value", fin, 12);
    Ok(())
}

fn rc_inline_send(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut oa = SideOpts::new(QpType::Rc);
    oa.max_inline = 64;
    let (a, b) = rc_pair(d, oa, SideOpts::new(QpType::Rc), Conn::default())?;
    let data = pattern(11, 40);
    a.fill(0, &data)?;
    b.post_recv(0, 5, &[b.sge(0, 256)]).ctx("post_recv")?;
    let flags = SendFlags::SIGNALED | SendFlags::INLINE;
    a.post_send(0, 1, &[a.sge(0, 40)], SendOp::Send, flags)
        .ctx("post_send")?;
    // Inline data was copied by the post: the buffer is the caller's again.
    a.fill(0, &[0xee; 40])?;
    let sw = a.wait_send(1, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(r, "receiver", &rw, &[(5, WcStatus::Success)]);
    let got = b.read(0, 40)?;
    r.set("b.data", digest(&got));
    r.check(got == data, || "inline data is not what was posted".into());
    Ok(())
}

fn rc_multi_sge(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let parts = [(100usize, 10u32), (2000, 200), (5000, 1500)];
    let mut message = Vec::new();
    for (i, &(off, len)) in parts.iter().enumerate() {
        let p = pattern(20 + i as u8, len as usize);
        a.fill(off, &p)?;
        message.extend(p);
    }
    let gather: Vec<Sge> = parts.iter().map(|&(o, l)| a.sge(o, l)).collect();
    // SEND: 3 gather SGEs into 2 scatter SGEs (1000 + 1000 bytes).
    b.post_recv(0, 40, &[b.sge(10000, 1000), b.sge(20000, 1000)])
        .ctx("post_recv")?;
    a.post_send(0, 1, &gather, SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    // WRITE: the same 3 gather SGEs to one remote range.
    let op = SendOp::RdmaWrite {
        remote_addr: b.addr(30000),
        rkey: b.mr.rkey(),
    };
    a.post_send(0, 2, &gather, op, SendFlags::SIGNALED)
        .ctx("post_send write")?;
    // READ: the written range back, scattered into 2 SGEs.
    let op = SendOp::RdmaRead {
        remote_addr: b.addr(30000),
        rkey: b.mr.rkey(),
    };
    let scatter = [a.sge(40000, 710), a.sge(50000, 1000)];
    a.post_send(0, 3, &scatter, op, SendFlags::SIGNALED)
        .ctx("post_send read")?;
    let sw = a.wait_send(3, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "requester", &sw, &[(1, ok), (2, ok), (3, ok)]);
    let mut received = b.read(10000, 1000)?;
    received.extend(b.read(20000, 710)?);
    r.set("b.received", digest(&received));
    r.check(received == message, || "scattered SEND data differs".into());
    let written = b.read(30000, 1710)?;
    r.set("b.written", digest(&written));
    r.check(written == message, || "gathered WRITE data differs".into());
    let mut read = a.read(40000, 710)?;
    read.extend(a.read(50000, 1000)?);
    r.set("a.read", digest(&read));
    r.check(read == message, || "scattered READ data differs".into());
    Ok(())
}

/// Posts `op` (with an 8-byte SGE for atomics, 64 bytes otherwise) on a fresh RC pair and
/// records the requester's completion, then both QPs' states; checks the status is `want`.
fn remote_error(
    r: &mut Record,
    a: &Side,
    b: &Side,
    op: SendOp,
    len: u32,
    want: WcStatus,
) -> Result<(), String> {
    a.post_send(0, 1, &[a.sge(0, len)], op, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, a, b);
    expect_wcs(r, "requester", &sw, &[(1, want)]);
    r.set("a.qp_state", a.qp_state(0));
    r.check(a.qp_state(0) == "ERR", || "requester QP not in ERR".into());
    r.set("b.qp_state", b.qp_state(0));
    Ok(())
}

fn rc_rem_access_bad_rkey(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let op = SendOp::RdmaWrite {
        remote_addr: b.addr(0),
        rkey: b.mr.rkey() ^ 0x8000,
    };
    remote_error(r, &a, &b, op, 64, WcStatus::RemAccessErr)
}

fn rc_rem_access_out_of_range(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let op = SendOp::RdmaRead {
        remote_addr: b.addr(super::harness::MEM_LEN - 10),
        rkey: b.mr.rkey(),
    };
    remote_error(r, &a, &b, op, 64, WcStatus::RemAccessErr)
}

fn rc_rem_access_deregistered(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, mut b) = rc_default(d)?;
    let mr = b.reg(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    b.dev.dereg_mr(mr.lkey()).ctx("dereg_mr")?;
    b.extra_lkeys.retain(|&k| k != mr.lkey());
    let op = SendOp::RdmaWrite {
        remote_addr: mr.iova(),
        rkey: mr.rkey(),
    };
    remote_error(r, &a, &b, op, 64, WcStatus::RemAccessErr)
}

fn rc_rem_access_no_permission(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut ob = SideOpts::new(QpType::Rc);
    ob.mr_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let (a, b) = rc_pair(d, SideOpts::new(QpType::Rc), ob, Conn::default())?;
    let op = SendOp::RdmaWrite {
        remote_addr: b.addr(0),
        rkey: b.mr.rkey(),
    };
    remote_error(r, &a, &b, op, 64, WcStatus::RemAccessErr)
}

fn rc_recv_too_small(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    b.post_recv(0, 9, &[b.sge(0, 64)]).ctx("post_recv")?;
    a.post_send(0, 1, &[a.sge(0, 200)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::RemInvReqErr)]);
    r.check(
        rw.len() == 1 && rw[0].wr_id == 9 && rw[0].status != WcStatus::Success,
        || format!("receiver: expected wr 9 with an error status, got {rw:?}"),
    );
    r.set("a.qp_state", a.qp_state(0));
    r.set("b.qp_state", b.qp_state(0));
    Ok(())
}

fn rc_loc_prot_err(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    b.post_recv(0, 9, &[b.sge(0, 256)]).ctx("post_recv")?;
    let mut sge = a.sge(0, 64);
    sge.lkey ^= 0x8000;
    a.post_send(0, 1, &[sge], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::LocProtErr)]);
    r.set("a.qp_state", a.qp_state(0));
    let rw = b.wait_recv(1, QUIET)?;
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    r.check(rw.is_empty(), || "the receiver got a message".into());
    Ok(())
}

fn rc_rnr_retry_exceeded(d: &Devices, r: &mut Record) -> Result<(), String> {
    let o = SideOpts::new(QpType::Rc);
    let c = Conn {
        rnr_retry: 0,
        ..Conn::default()
    };
    let (a, b) = rc_pair(d, o, o, c)?;
    a.post_send(0, 1, &[a.sge(0, 64)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::RnrRetryExcErr)]);
    r.set("a.qp_state", a.qp_state(0));
    r.set("b.qp_state", b.qp_state(0));
    Ok(())
}

fn rc_rnr_then_success(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (a, b) = rc_default(d)?;
    let data = pattern(13, 100);
    a.fill(0, &data)?;
    a.post_send(0, 1, &[a.sge(0, 100)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    // No receive yet: the responder answers RNR NAK, the requester waits and retries for ever.
    let early = a.wait_send(1, QUIET)?;
    record_wcs(r, "a.send_cq.early", &early, &a, &b);
    r.check(early.is_empty(), || {
        "the send completed before a receive was posted".into()
    });
    b.post_recv(0, 2, &[b.sge(0, 256)]).ctx("post_recv")?;
    let sw = a.wait_send(1, WAIT)?;
    let rw = b.wait_recv(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::Success)]);
    expect_wcs(r, "receiver", &rw, &[(2, WcStatus::Success)]);
    let got = b.read(0, 100)?;
    r.set("b.data", digest(&got));
    r.check(got == data, || "data differs".into());
    Ok(())
}

fn rc_retry_exceeded_dead_peer(d: &Devices, r: &mut Record) -> Result<(), String> {
    let o = SideOpts::new(QpType::Rc);
    let c = Conn {
        timeout: 10,
        retry_cnt: 1,
        ..Conn::default()
    };
    let (a, mut b) = rc_pair(d, o, o, c)?;
    // The peer QP goes away: nobody answers.
    for &qpn in &b.qps {
        b.dev.destroy_qp(qpn).ctx("destroy_qp")?;
    }
    b.qps.clear();
    a.post_send(0, 1, &[a.sge(0, 64)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(1, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    expect_wcs(r, "requester", &sw, &[(1, WcStatus::RetryExcErr)]);
    r.set("a.qp_state", a.qp_state(0));
    Ok(())
}

fn rc_flush_on_error(d: &Devices, r: &mut Record) -> Result<(), String> {
    let o = SideOpts::new(QpType::Rc);
    // A long ACK timeout with a dead peer: the sends stay outstanding until the QP goes to ERR.
    let c = Conn {
        timeout: 20,
        retry_cnt: 7,
        ..Conn::default()
    };
    let (a, b) = rc_pair(d, o, o, c)?;
    for i in 0..3u64 {
        b.post_recv(0, 10 + i, &[b.sge(0, 256)]).ctx("post_recv")?;
    }
    b.set_state(0, QpState::Err)?;
    let rw = b.wait_recv(3, WAIT)?;
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let flush = WcStatus::WrFlushErr;
    expect_wcs(
        r,
        "receives flushed in order",
        &rw,
        &[(10, flush), (11, flush), (12, flush)],
    );
    // The peer is in ERR and drops everything: a's sends stay outstanding.
    for i in 0..3u64 {
        a.post_send(0, 1 + i, &[a.sge(0, 64)], SendOp::Send, SendFlags::SIGNALED)
            .ctx("post_send")?;
    }
    a.set_state(0, QpState::Err)?;
    let sw = a.wait_send(3, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    expect_wcs(
        r,
        "sends flushed in order",
        &sw,
        &[(1, flush), (2, flush), (3, flush)],
    );
    // Posting to a QP in ERR: the WR completes with a flush error at once (or is refused).
    let post = a.post_send(0, 4, &[a.sge(0, 64)], SendOp::Send, SendFlags::SIGNALED);
    r.set("a.post_send_in_err", outcome(&post));
    if post.is_ok() {
        let late = a.wait_send(1, WAIT)?;
        record_wcs(r, "a.send_cq.late", &late, &a, &b);
        expect_wcs(r, "send posted in ERR", &late, &[(4, flush)]);
    }
    let post = b.post_recv(0, 13, &[b.sge(0, 256)]);
    r.set("b.post_recv_in_err", outcome(&post));
    if post.is_ok() {
        let late = b.wait_recv(1, WAIT)?;
        record_wcs(r, "b.recv_cq.late", &late, &b, &a);
        expect_wcs(r, "receive posted in ERR", &late, &[(13, flush)]);
    }
    Ok(())
}

fn ud_pair(d: &Devices) -> Result<(Side, Side), String> {
    let o = SideOpts::new(QpType::Ud);
    let a = Side::new(&d.a, 'a', o)?;
    let b = Side::new(&d.b, 'b', o)?;
    a.ud_up(0)?;
    b.ud_up(0)?;
    Ok((a, b))
}

/// The GRH area of a UD receive as comparable text: for an IPv4 GID (IPv4-mapped, RoCEv2 over
/// IPv4) `ipv4` with the header's fields that do not depend on the addresses, and whether the
/// addresses are the two devices'; for an IPv6 GID the IPv6 header's.
fn grh_text(grh: &[u8], a: &Side, b: &Side, r: &mut Record) -> String {
    let src = a.dev.default_gid().1;
    let dst = b.dev.default_gid().1;
    let (src, dst) = (src.as_bytes(), dst.as_bytes());
    let v4_mapped = |g: &[u8]| g[..10].iter().all(|&x| x == 0) && g[10] == 0xff && g[11] == 0xff;
    if v4_mapped(src) {
        let zero = grh[..20].iter().all(|&x| x == 0);
        r.check(zero, || {
            "GRH bytes 0..20 not zero for an IPv4 packet".into()
        });
        let ip = &grh[20..40];
        let version_ihl = ip[0];
        let total_len = u16::from_be_bytes([ip[2], ip[3]]);
        let ttl = ip[8];
        let proto = ip[9];
        let mut sum: u32 = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let src_ok = ip[12..16] == src[12..16];
        let dst_ok = ip[16..20] == dst[12..16];
        r.check(version_ihl == 0x45, || {
            format!("IPv4 version/IHL {version_ihl:#x}")
        });
        r.check(proto == 17, || {
            format!("IPv4 protocol {proto}, expected UDP")
        });
        r.check(src_ok && dst_ok, || {
            "IPv4 addresses are not the devices'".into()
        });
        r.check(sum == 0xffff, || "IPv4 header checksum invalid".into());
        format!(
            "ipv4 zero20={zero} ver_ihl={version_ihl:#x} tos={:#x} total_len={total_len} ttl={ttl} \
             proto={proto} csum_ok={} src_ok={src_ok} dst_ok={dst_ok}",
            ip[1],
            sum == 0xffff
        )
    } else {
        let version = grh[0] >> 4;
        let payload_len = u16::from_be_bytes([grh[4], grh[5]]);
        let next = grh[6];
        let hop = grh[7];
        let src_ok = grh[8..24] == *src;
        let dst_ok = grh[24..40] == *dst;
        r.check(version == 6, || format!("GRH IP version {version}"));
        r.check(src_ok && dst_ok, || "GRH GIDs are not the devices'".into());
        format!(
            "ipv6 ver={version} payload_len={payload_len} next={next} hop={hop} src_ok={src_ok} \
             dst_ok={dst_ok}"
        )
    }
}

fn ud_send_grh(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (mut a, b) = ud_pair(d)?;
    let ah = a.ah_to(&b)?;
    let sizes = [100usize, 200];
    for (i, &len) in sizes.iter().enumerate() {
        a.fill(i * 4096, &pattern(30 + i as u8, len))?;
        b.post_recv(0, 10 + i as u64, &[b.sge(i * 4096, 40 + 1024)])
            .ctx("post_recv")?;
    }
    for (i, &len) in sizes.iter().enumerate() {
        let op = SendOp::UdSend {
            dest: UdDest {
                ah,
                remote_qpn: b.qps[0],
                remote_qkey: QKEY,
            },
            imm_data: (i == 1).then_some(0x0bad_cafe),
        };
        a.post_send(
            0,
            1 + i as u64,
            &[a.sge(i * 4096, len as u32)],
            op,
            SendFlags::SIGNALED,
        )
        .ctx("post_send")?;
    }
    let sw = a.wait_send(2, WAIT)?;
    let rw = b.wait_recv(2, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender", &sw, &[(1, ok), (2, ok)]);
    expect_wcs(r, "receiver", &rw, &[(10, ok), (11, ok)]);
    let lens: Vec<u32> = rw.iter().map(|w| w.byte_len).collect();
    r.expect_eq("receive byte_len (GRH + payload)", lens, vec![140, 240]);
    for (i, &len) in sizes.iter().enumerate() {
        let area = b.read(i * 4096, 40)?;
        let text = grh_text(&area, &a, &b, r);
        r.set(format!("b.grh{i}"), text);
        let got = b.read(i * 4096 + 40, len)?;
        r.set(format!("b.data{i}"), digest(&got));
        r.check(got == pattern(30 + i as u8, len), || {
            format!("datagram {i} data differs")
        });
    }
    Ok(())
}

fn ud_qkey_mismatch(d: &Devices, r: &mut Record) -> Result<(), String> {
    let (mut a, b) = ud_pair(d)?;
    let ah = a.ah_to(&b)?;
    for i in 0..2u64 {
        b.post_recv(0, 10 + i, &[b.sge(i as usize * 4096, 40 + 256)])
            .ctx("post_recv")?;
    }
    a.fill(0, &pattern(40, 64))?;
    a.fill(4096, &pattern(41, 64))?;
    for (i, qkey) in [QKEY ^ 1, QKEY].into_iter().enumerate() {
        let op = SendOp::UdSend {
            dest: UdDest {
                ah,
                remote_qpn: b.qps[0],
                remote_qkey: qkey,
            },
            imm_data: None,
        };
        a.post_send(
            0,
            1 + i as u64,
            &[a.sge(i * 4096, 64)],
            op,
            SendFlags::SIGNALED,
        )
        .ctx("post_send")?;
    }
    let sw = a.wait_send(2, WAIT)?;
    let mut rw = b.wait_recv(1, WAIT)?;
    rw.extend(b.wait_recv(1, QUIET)?);
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender", &sw, &[(1, ok), (2, ok)]);
    expect_wcs(r, "receiver (the right Q_Key only)", &rw, &[(10, ok)]);
    let got = b.read(40, 64)?;
    r.set("b.data", digest(&got));
    r.check(got == pattern(41, 64), || {
        "received data is not the second datagram's".into()
    });
    Ok(())
}

fn srq_shared_receives(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut oa = SideOpts::new(QpType::Rc);
    oa.qps = 2;
    let mut ob = oa;
    ob.srq = true;
    let a = Side::new(&d.a, 'a', oa)?;
    let b = Side::new(&d.b, 'b', ob)?;
    for i in 0..2 {
        a.connect(i, &b, i, Conn::default())?;
        b.connect(i, &a, i, Conn::default())?;
    }
    let refused = b.post_recv(0, 99, &[b.sge(0, 64)]);
    r.set("b.post_recv_on_srq_qp", outcome(&refused));
    r.check(refused.is_err(), || {
        "post_recv on a QP with an SRQ was accepted".into()
    });
    for i in 0..4u64 {
        b.post_srq_recv(20 + i, &[b.sge(i as usize * 1024, 1024)])?;
    }
    // Arm the limit at 2: the event fires when fewer than 2 WRs remain posted.
    let srq = b.srq.ok_or("no SRQ")?;
    let arm = SrqAttr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 2,
    };
    b.dev
        .modify_srq(srq, &arm, SrqAttrMask::LIMIT)
        .ctx("modify_srq")?;
    let order = [0usize, 1, 0];
    for (n, &qi) in order.iter().enumerate() {
        a.fill(n * 256, &pattern(50 + n as u8, 100))?;
        a.post_send(
            qi,
            1 + n as u64,
            &[a.sge(n * 256, 100)],
            SendOp::Send,
            SendFlags::SIGNALED,
        )
        .ctx("post_send")?;
        // One at a time, so that the order of arrival at the SRQ is the order of posting.
        let sw = a.wait_send(1, WAIT)?;
        record_wcs(r, &format!("a.send_cq{n}"), &sw, &a, &b);
    }
    let rw = b.wait_recv(3, WAIT)?;
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "SRQ WRs in order", &rw, &[(20, ok), (21, ok), (22, ok)]);
    let qps: Vec<u32> = rw.iter().map(|w| w.qp_num).collect();
    r.expect_eq("receiving QPs", qps, vec![b.qps[0], b.qps[1], b.qps[0]]);
    for n in 0..3 {
        let got = b.read(n * 1024, 100)?;
        r.set(format!("b.data{n}"), digest(&got));
        r.check(got == pattern(50 + n as u8, 100), || {
            format!("message {n} differs")
        });
    }
    let mut limit_events = 0;
    while let Some(ev) = b.dev.poll_event() {
        if ev.event_type == AsyncEventType::SrqLimitReached {
            limit_events += 1;
        }
    }
    r.set("b.srq_limit_events", limit_events);
    r.expect_eq("SRQ limit events", limit_events, 1);
    Ok(())
}

fn uc_send_and_write(d: &Devices, r: &mut Record) -> Result<(), String> {
    let o = SideOpts::new(QpType::Uc);
    let a = Side::new(&d.a, 'a', o)?;
    let b = Side::new(&d.b, 'b', o)?;
    a.connect(0, &b, 0, Conn::default())?;
    b.connect(0, &a, 0, Conn::default())?;
    let data = pattern(60, 2500);
    a.fill(0, &data)?;
    b.post_recv(0, 10, &[b.sge(0, 4096)]).ctx("post_recv")?;
    b.post_recv(0, 11, &[]).ctx("post_recv")?;
    a.post_send(0, 1, &[a.sge(0, 2500)], SendOp::Send, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: b.addr(8192),
        rkey: b.mr.rkey(),
        imm_data: 0x600d,
    };
    a.post_send(0, 2, &[a.sge(0, 2500)], op, SendFlags::SIGNALED)
        .ctx("post_send")?;
    let sw = a.wait_send(2, WAIT)?;
    let rw = b.wait_recv(2, WAIT)?;
    record_wcs(r, "a.send_cq", &sw, &a, &b);
    record_wcs(r, "b.recv_cq", &rw, &b, &a);
    let ok = WcStatus::Success;
    expect_wcs(r, "sender", &sw, &[(1, ok), (2, ok)]);
    expect_wcs(r, "receiver", &rw, &[(10, ok), (11, ok)]);
    let sent = b.read(0, 2500)?;
    let written = b.read(8192, 2500)?;
    r.set("b.sent", digest(&sent));
    r.set("b.written", digest(&written));
    r.check(sent == data && written == data, || "data differs".into());
    Ok(())
}

fn post_send_refusals(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut o = SideOpts::new(QpType::Rc);
    o.max_sge = 2;
    o.max_send_wr = 4;
    o.max_inline = 32;
    let a = Side::new(&d.a, 'a', o)?;
    let b = Side::new(&d.b, 'b', o)?;
    let sig = SendFlags::SIGNALED;
    // Not yet connected: RESET.
    let reset = a.post_send(0, 1, &[a.sge(0, 8)], SendOp::Send, sig);
    r.set("post_in_reset", outcome(&reset));
    // Long ACK timeout, dead peer below: WRs stay queued.
    let c = Conn {
        timeout: 20,
        ..Conn::default()
    };
    a.connect(0, &b, 0, c)?;
    b.connect(0, &a, 0, c)?;
    let cap = a.qp_cap(0)?;
    let too_many: Vec<Sge> = (0..=cap.max_send_sge as usize)
        .map(|i| a.sge(i * 16, 8))
        .collect();
    let res = a.post_send(0, 2, &too_many, SendOp::Send, sig);
    r.set("too_many_sge", outcome(&res));
    let res = a.post_send(
        0,
        3,
        &[a.sge(0, cap.max_inline_data + 1)],
        SendOp::Send,
        sig | SendFlags::INLINE,
    );
    r.set("inline_too_long", outcome(&res));
    let atomic = SendOp::AtomicFetchAndAdd {
        remote_addr: b.addr(0),
        rkey: b.mr.rkey(),
        add: 1,
    };
    let res = a.post_send(0, 4, &[a.sge(0, 16)], atomic, sig);
    r.set("atomic_length_16", outcome(&res));
    let res = a.post_send(
        0,
        5,
        &[a.sge(0, 8)],
        SendOp::RdmaRead {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        },
        sig | SendFlags::INLINE,
    );
    r.set("inline_read", outcome(&res));
    for (key, res) in [
        ("too_many_sge", r.get("too_many_sge")),
        ("inline_too_long", r.get("inline_too_long")),
        ("atomic_length_16", r.get("atomic_length_16")),
        ("inline_read", r.get("inline_read")),
    ]
    .map(|(k, v)| (k, v.map(str::to_owned)))
    {
        r.expect_eq(key, res.as_deref(), Some("EINVAL"));
    }
    // A full send queue: the peer is gone, nothing completes; the WR after the last that fits
    // is bad_wr. A refusal above that a backend accepted instead (its own difference, recorded
    // above) is a WR the live peer answers: wait for its completion, which frees its slot; one
    // that does not complete in time still holds it.
    let accepted = [
        "too_many_sge",
        "inline_too_long",
        "atomic_length_16",
        "inline_read",
    ]
    .iter()
    .filter(|k| r.get(k) == Some("ok"))
    .count();
    let completed = if accepted > 0 {
        a.dev.wait_cq(a.scq, accepted, WAIT).ctx("wait_cq")?.len()
    } else {
        0
    };
    let fits = (cap.max_send_wr as usize).saturating_sub(accepted.saturating_sub(completed));
    b.dev.destroy_qp(b.qps[0]).ctx("destroy_qp")?;
    let sge = [a.sge(0, 8)];
    let wrs: Vec<hca::SendWr<'_>> = (0..=cap.max_send_wr)
        .map(|i| hca::SendWr {
            wr_id: 100 + u64::from(i),
            sg_list: &sge,
            op: SendOp::Send,
            send_flags: sig,
        })
        .collect();
    let res = a.dev.post_send_list(a.qps[0], &wrs);
    let text = match &res {
        Ok(()) => "ok".to_owned(),
        Err((i, e)) => format!(
            "{} bad_wr={}",
            super::harness::errno_name(e),
            if *i == fits {
                "max_send_wr".to_owned()
            } else {
                format!(
                    "{i} (max_send_wr {}, {accepted} accepted above, {completed} completed)",
                    cap.max_send_wr
                )
            }
        ),
    };
    r.set("queue_full", &text);
    r.expect_eq("queue_full", text.as_str(), "ENOMEM bad_wr=max_send_wr");
    let mut b = b;
    b.qps.clear();
    Ok(())
}

fn post_recv_refusals(d: &Devices, r: &mut Record) -> Result<(), String> {
    let mut o = SideOpts::new(QpType::Rc);
    o.max_sge = 2;
    o.max_recv_wr = 4;
    let a = Side::new(&d.a, 'a', o)?;
    let reset = a.post_recv(0, 1, &[a.sge(0, 8)]);
    r.set("post_in_reset", outcome(&reset));
    a.set_init(0)?;
    let cap = a.qp_cap(0)?;
    let too_many: Vec<Sge> = (0..=cap.max_recv_sge as usize)
        .map(|i| a.sge(i * 16, 8))
        .collect();
    let res = a.post_recv(0, 1, &too_many);
    r.set("too_many_sge", outcome(&res));
    r.expect_eq("too_many_sge", outcome(&res).as_str(), "EINVAL");
    let sge = [a.sge(0, 8)];
    let wrs: Vec<hca::RecvWr<'_>> = (0..=cap.max_recv_wr)
        .map(|i| hca::RecvWr {
            wr_id: 10 + u64::from(i),
            sg_list: &sge,
        })
        .collect();
    let res = a.dev.post_recv_list(a.qps[0], &wrs);
    let text = match &res {
        Ok(()) => "ok".to_owned(),
        Err((i, e)) => format!(
            "{} bad_wr={}",
            super::harness::errno_name(e),
            if *i == cap.max_recv_wr as usize {
                "max_recv_wr".to_owned()
            } else {
                format!("{i} (max_recv_wr {})", cap.max_recv_wr)
            }
        ),
    };
    r.set("queue_full", &text);
    r.expect_eq("queue_full", text.as_str(), "ENOMEM bad_wr=max_recv_wr");
    Ok(())
}
