//! Adversarial tests: hostile packets from a peer that lies (wrong lengths, PSNs far outside the
//! window, responses to nothing, reserved codes, keys of dead regions), hostile API sequences
//! (posting in every state, RESET with work outstanding, deregistering memory under an RDMA READ,
//! overfull queues, absurd sizes and addresses), each named after the rule it checks. The engine
//! must never panic, hang, grow a queue without bound, touch memory out of bounds, or lose or
//! corrupt data silently; it answers with the NAK / work completion status IBTA and Linux rxe
//! give.

mod common;

use std::time::Duration;

use common::crafted_packets::*;
use common::*;
use gpu_p2p::Memory;
use hca::{AccessFlags, DropReason, QpAttr, QpAttrMask, QpState, RecvWr, SendOp, WcStatus};
use roce::aeth::{NakCode, Syndrome};
use roce::packet::ExtReprs;
use roce::Opcode;

// ---- crafting packets ----

// ---- hostile requests into the responder ----

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
    let st: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)],
        "the interrupted receive fails, the next is flushed"
    );
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

// ---- hostile responses into the completer ----

// ---- hostile API sequences ----

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

// ---- random hostile packets ----

#[test]
fn responses_owed_before_a_class_c_error_are_sent_before_its_nak() {
    // A NAK implicitly acknowledges every earlier request (IBTA vol. 1 §9.7.5.2): an atomic or
    // READ the responder executed before the failing request must be answered, not discarded
    // with the error. rxe answers READs and atomics as it executes them, so it never loses one.
    let (mut f, a, b) = pair(&Opts::default());
    b.write(0, &7u64.to_ne_bytes());
    b.write(64, &[0x3c; 64]);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
                add: 5,
            },
        ),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(64, 64)],
            SendOp::RdmaRead {
                remote_addr: b.addr(64),
                rkey: b.mr.rkey(),
            },
        ),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(
            3,
            &[a.sge(128, 64)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey() ^ 0x100,
            },
        ),
    );
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
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 5000)],
            SendOp::RdmaWrite {
                remote_addr: a.addr(20_000),
                rkey: a.mr.rkey(),
            },
        ),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(40_000, 5000)],
            SendOp::RdmaRead {
                remote_addr: a.addr(20_000),
                rkey: a.mr.rkey(),
            },
        ),
    );
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
    let mut got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
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
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
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
