//! Adversarial tests: hostile packets from a peer that lies (wrong lengths, PSNs far outside the
//! window, responses to nothing, reserved codes, keys of dead regions), hostile API sequences
//! (posting in every state, RESET with work outstanding, deregistering memory under an RDMA READ,
//! overfull queues, absurd sizes and addresses), each named after the rule it checks. The engine
//! must never panic, hang, grow a queue without bound, touch memory out of bounds, or lose or
//! corrupt data silently; it answers with the NAK / work completion status IBTA and Linux rxe
//! give.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use gpu_p2p::{HostMemory, Memory};
use hca::{
    AccessFlags, DropReason, QpAttr, QpAttrMask, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus,
};
use proptest::prelude::*;
use roce::aeth::{AckCredit, NakCode, RnrTimer, Syndrome};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{aeth, atomic_eth, bth, reth, Opcode};

// ---- crafting packets ----

/// The link metadata of a packet from `from` to `to`.
fn tx_between(from: &Peer, to: &Peer) -> hca::Transmit {
    hca::Transmit {
        src_ip: from.ip,
        dst_ip: to.ip,
        src_port: 0xc000,
        dst_port: 4791,
        ecn: roce::ipv4::Ecn::NotEct,
        dscp: 0,
        hop_limit: 64,
        flow_label: 0,
        len: 0,
    }
}

/// A packet with link metadata `tx` and a valid ICRC, or `None` if these headers cannot be built
/// (a payload on an opcode that carries none).
fn try_build(tx: hca::Transmit, transport: TransportRepr, payload: &[u8]) -> Option<Pkt> {
    let ip = match (tx.src_ip, tx.dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
            src_addr: s,
            dst_addr: d,
            protocol: roce::ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: tx.hop_limit,
            dscp: tx.dscp,
            ecn: tx.ecn,
            ident: hca::engine::IPV4_IDENT,
            dont_frag: true,
        }),
        _ => return None,
    };
    let repr = roce::packet::PacketRepr {
        ip,
        udp_src_port: tx.src_port,
        udp_checksum: false,
        transport,
    };
    let mut out = vec![0u8; payload.len() + 128];
    let len = roce::packet::build_udp_payload(&repr, &[payload], &mut out).ok()?;
    out.truncate(len);
    Some(Pkt {
        tx: hca::Transmit { len, ..tx },
        data: out,
    })
}

/// A packet from `from` to `to`'s QP with a valid ICRC (the receiver must judge its content).
fn craft(from: &Peer, to: &Peer, opcode: Opcode, psn: u32, ext: ExtReprs, payload: &[u8]) -> Pkt {
    let transport = TransportRepr {
        bth: bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: to.qpn,
            ack_req: true,
            psn,
        },
        ext,
    };
    try_build(tx_between(from, to), transport, payload).expect("well-formed headers")
}

fn reth_ext(va: u64, rkey: u32, dma_len: u32) -> ExtReprs {
    ExtReprs {
        reth: Some(reth::Repr {
            virtual_address: va,
            rkey,
            dma_len,
        }),
        ..ExtReprs::default()
    }
}

fn aeth_ext(syndrome: Syndrome) -> ExtReprs {
    ExtReprs {
        aeth: Some(aeth::Repr { syndrome, msn: 1 }),
        ..ExtReprs::default()
    }
}

fn ack() -> Syndrome {
    Syndrome::Ack {
        credit: AckCredit::INVALID,
    }
}

fn atomic_ext(va: u64, rkey: u32) -> ExtReprs {
    ExtReprs {
        atomic_eth: Some(atomic_eth::request::Repr {
            virtual_address: va,
            rkey,
            swap_add_data: 1,
            compare_data: 0,
        }),
        ..ExtReprs::default()
    }
}

/// What an engine answered: (opcode, PSN, AETH syndrome) of each packet, and the packets.
fn answers(
    f: &mut hca::fabric::Fabric,
    p: &Peer,
    now: hca::Instant,
) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    transmit(f, p, now)
        .iter()
        .map(|k| (k.opcode(), k.psn(), k.aeth().map(|a| a.syndrome)))
        .collect()
}

fn state(f: &hca::fabric::Fabric, p: &Peer) -> QpState {
    f.node(p.node).context().qp(p.qpn).unwrap().state()
}

fn drops(f: &hca::fabric::Fabric, p: &Peer, r: DropReason) -> u64 {
    f.node(p.node).counters().drops(r)
}

fn nak(code: NakCode) -> Option<Syndrome> {
    Some(Syndrome::Nak(code))
}

/// Registers `len` more bytes on `p`'s node with `access`; returns the region and its memory.
fn extra_mr(
    f: &mut hca::fabric::Fabric,
    p: &Peer,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> (hca::MemoryRegion, Arc<HostMemory>) {
    let mem = Arc::new(HostMemory::new(len).unwrap());
    let mr = f
        .node_mut(p.node)
        .reg_mr(p.pd, mem.clone(), iova, access)
        .unwrap();
    (mr, mem)
}

fn read_mem(mem: &HostMemory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mem.read(off, &mut v).unwrap();
    v
}

const PMTU: usize = 1024;
/// The PSN B expects first from A (`Opts::default().a_psn`).
const A_PSN: u32 = 100;

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

#[test]
fn requests_to_a_qp_in_err_and_responses_to_a_qp_in_rtr_are_dropped() {
    let (mut f, a, b) = pair(&Opts::default());
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    f.node_mut(b.node)
        .modify_qp(b.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    let w = craft(
        &a,
        &b,
        Opcode::RcRdmaWriteOnly,
        A_PSN,
        reth_ext(b.addr(0), b.mr.rkey(), 8),
        &[1; 8],
    );
    deliver(&mut f, &b, &w, t_us(1));
    assert_eq!(drops(&f, &b, DropReason::QpState), 1);
    assert!(transmit(&mut f, &b, t_us(1)).is_empty());
    assert_eq!(b.read(0, 8), vec![0; 8]);
    // A third QP on A's node, left in RTR: a response to it is dropped.
    let c = {
        let h = f.node_mut(a.node);
        let qpn = h
            .create_qp(
                a.pd,
                &hca::QpInitAttr {
                    qp_type: hca::QpType::Rc,
                    send_cq: a.cq,
                    recv_cq: a.cq,
                    srq: None,
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
        Peer {
            node: a.node,
            ip: a.ip,
            pd: a.pd,
            cq: a.cq,
            qpn,
            mem: a.mem.clone(),
            mr: a.mr.clone(),
        }
    };
    bring_up_to_rtr(&mut f, &c, &b, 5);
    let resp = craft(&b, &c, Opcode::RcAcknowledge, 5, aeth_ext(ack()), &[]);
    let before = drops(&f, &c, DropReason::QpState);
    deliver(&mut f, &c, &resp, t_us(2));
    assert_eq!(drops(&f, &c, DropReason::QpState), before + 1);
}

/// Brings `me` to RTR only, connected to `peer`.
fn bring_up_to_rtr(f: &mut hca::fabric::Fabric, me: &Peer, peer: &Peer, peer_psn: u32) {
    let h = f.node_mut(me.node);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    h.modify_qp(
        me.qpn,
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = hca::PathMtu::Mtu1024;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr = hca::AhAttr {
        dgid: hca::Gid::from(peer.ip),
        sgid_index: 2,
        hop_limit: 64,
        port_num: 1,
        ..hca::AhAttr::default()
    };
    h.modify_qp(
        me.qpn,
        &a,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
}

#[test]
fn cnp_for_an_unknown_qp_is_dropped_and_counted() {
    let (mut f, a, b) = pair(&Opts::default());
    let mut ghost = Peer {
        node: b.node,
        ip: b.ip,
        pd: b.pd,
        cq: b.cq,
        qpn: 0x00ab_cdef,
        mem: b.mem.clone(),
        mr: b.mr.clone(),
    };
    let cnp = |to: &Peer| {
        let transport = TransportRepr {
            bth: roce::cnp::Repr {
                dest_qpn: to.qpn,
                pkey: 0xffff,
            }
            .bth_repr(),
            ext: ExtReprs::default(),
        };
        try_build(tx_between(&a, to), transport, &[0; roce::cnp::PAYLOAD_LEN]).unwrap()
    };
    deliver(&mut f, &b, &cnp(&ghost), t_us(1));
    assert_eq!(drops(&f, &b, DropReason::Qpn), 1);
    ghost.qpn = 1; // QP1 is not offered either
    deliver(&mut f, &b, &cnp(&ghost), t_us(1));
    assert_eq!(drops(&f, &b, DropReason::Qpn), 2);
    assert_eq!(f.node(b.node).counters().cnp_rcvd, 0);
    deliver(&mut f, &b, &cnp(&b), t_us(1));
    assert_eq!(f.node(b.node).counters().cnp_rcvd, 1);
}

// ---- hostile responses into the completer ----

/// A posts one 64-byte RDMA WRITE (PSN `A_PSN`) and transmits it; B never sees it.
fn a_with_one_write() -> (hca::fabric::Fabric, Peer, Peer) {
    let (mut f, a, b) = pair(&Opts::default());
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 64)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    (f, a, b)
}

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

/// A posts a READ of `len` bytes into byte 4096 of its region and transmits the request.
fn a_with_one_read(len: u32, pmtu: hca::PathMtu) -> (hca::fabric::Fabric, Peer, Peer) {
    let (mut f, a, b) = pair(&Opts {
        pmtu,
        ..Opts::default()
    });
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(4096, len)],
            SendOp::RdmaRead {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    (f, a, b)
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

// ---- hostile API sequences ----

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
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    f.node_mut(a.node)
        .modify_qp(
            a.qpn,
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
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
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(9, WcStatus::WrFlushErr)]
    );
}

#[test]
fn modify_to_reset_with_work_outstanding_discards_it_and_the_qp_reconnects_cleanly() {
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    a.write(0, &[0x42; 3000]);
    for i in 0..8 {
        post_send(
            &mut f,
            &a,
            &send_wr(
                i,
                &[a.sge(0, 3000)],
                SendOp::RdmaWrite {
                    remote_addr: b.addr(0),
                    rkey: b.mr.rkey(),
                },
            ),
        );
    }
    post_send(
        &mut f,
        &a,
        &send_wr(
            100,
            &[a.sge(8192, 64)],
            SendOp::RdmaRead {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
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
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 3000)],
            SendOp::RdmaWrite {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_secs(1));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
    assert_eq!(b.read(0, 3000), vec![0x42; 3000]);
}

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
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(0, 64)],
            SendOp::RdmaRead {
                remote_addr: b2.addr(0),
                rkey: b2.mr.rkey(),
            },
        ),
    );
    let wcs = run_for_completions(&mut f, &a, 2, Duration::from_millis(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
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
            dest: hca::wr::UdDest {
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
        post_send(
            &mut f,
            &a,
            &send_wr(
                i,
                &[a.sge(i * 2048, 2048)],
                SendOp::RdmaRead {
                    remote_addr: b.addr(i * 2048),
                    rkey: b.mr.rkey(),
                },
            ),
        );
    }
    let wcs = run_for_completions(&mut f, &a, 32, Duration::from_secs(10));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(a.read(0, data.len()), data);
}

// ---- random hostile packets ----

const OPCODES: &[Opcode] = &[
    Opcode::RcSendFirst,
    Opcode::RcSendMiddle,
    Opcode::RcSendLast,
    Opcode::RcSendLastWithImmediate,
    Opcode::RcSendOnly,
    Opcode::RcSendOnlyWithImmediate,
    Opcode::RcRdmaWriteFirst,
    Opcode::RcRdmaWriteMiddle,
    Opcode::RcRdmaWriteLast,
    Opcode::RcRdmaWriteLastWithImmediate,
    Opcode::RcRdmaWriteOnly,
    Opcode::RcRdmaWriteOnlyWithImmediate,
    Opcode::RcRdmaReadRequest,
    Opcode::RcRdmaReadResponseFirst,
    Opcode::RcRdmaReadResponseMiddle,
    Opcode::RcRdmaReadResponseLast,
    Opcode::RcRdmaReadResponseOnly,
    Opcode::RcAcknowledge,
    Opcode::RcAtomicAcknowledge,
    Opcode::RcCompareSwap,
    Opcode::RcFetchAdd,
    Opcode::RcSendLastWithInvalidate,
    Opcode::RcSendOnlyWithInvalidate,
    Opcode::UcSendOnly,
    Opcode::UcRdmaWriteOnly,
    Opcode::UdSendOnly,
    Opcode::Cnp,
];

/// The opcodes thrown at UC and UD QPs (and a few of the other transports').
const UC_UD_OPCODES: &[Opcode] = &[
    Opcode::UcSendFirst,
    Opcode::UcSendMiddle,
    Opcode::UcSendLast,
    Opcode::UcSendLastWithImmediate,
    Opcode::UcSendOnly,
    Opcode::UcSendOnlyWithImmediate,
    Opcode::UcRdmaWriteFirst,
    Opcode::UcRdmaWriteMiddle,
    Opcode::UcRdmaWriteLast,
    Opcode::UcRdmaWriteLastWithImmediate,
    Opcode::UcRdmaWriteOnly,
    Opcode::UcRdmaWriteOnlyWithImmediate,
    Opcode::UdSendOnly,
    Opcode::UdSendOnlyWithImmediate,
    Opcode::UdSendOnly,
    Opcode::UdSendOnlyWithImmediate,
    Opcode::RcSendOnly,
    Opcode::RcAcknowledge,
    Opcode::RcRdmaReadRequest,
    Opcode::Cnp,
];

/// One hostile packet: an opcode, a PSN offset from the expected one, header field values from
/// a small set of nasty ones, a payload length.
#[derive(Debug, Clone)]
struct Hostile {
    opcode: usize,
    psn_delta: u32,
    to_requester: bool,
    va: u64,
    rkey_kind: u8,
    dma_len: u32,
    syndrome: u8,
    payload: usize,
    unchecked_icrc_flip: Option<(usize, u8)>,
}

fn arb_hostile() -> impl Strategy<Value = Hostile> {
    (
        0..OPCODES.len(),
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(0xff_ffff),
            Just(1 << 23),
            Just((1 << 23) - 1),
            0u32..8,
            any::<u32>()
        ],
        any::<bool>(),
        prop_oneof![
            Just(0u64),
            Just(B_IOVA),
            Just(B_IOVA + 8),
            Just(B_IOVA + (1 << 20) - 8),
            Just(A_IOVA),
            Just(u64::MAX),
            Just(u64::MAX - 7),
            any::<u64>()
        ],
        0u8..4,
        prop_oneof![
            Just(0u32),
            Just(8),
            Just(PMTU as u32),
            Just(PMTU as u32 + 1),
            Just(1 << 20),
            Just(1 << 31),
            Just((1 << 31) + 1),
            Just(u32::MAX),
            any::<u32>()
        ],
        any::<u8>(),
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(8),
            Just(PMTU - 1),
            Just(PMTU),
            Just(PMTU + 1),
            Just(4096),
            0usize..2048
        ],
        proptest::option::weighted(0.1, (0usize..64, 1u8..=255)),
    )
        .prop_map(
            |(opcode, psn_delta, to_requester, va, rkey_kind, dma_len, syndrome, payload, flip)| {
                Hostile {
                    opcode,
                    psn_delta,
                    to_requester,
                    va,
                    rkey_kind,
                    dma_len,
                    syndrome,
                    payload,
                    unchecked_icrc_flip: flip,
                }
            },
        )
}

/// Builds the packet `h` describes (or `None` if the headers cannot be built: an opcode whose
/// payload rule the builder enforces).
fn build_hostile(
    h: &Hostile,
    qp_type: hca::QpType,
    a: &Peer,
    b: &Peer,
    rkeys: [u32; 4],
) -> Option<Pkt> {
    let opcode = match qp_type {
        hca::QpType::Rc => OPCODES[h.opcode % OPCODES.len()],
        _ => UC_UD_OPCODES[h.opcode % UC_UD_OPCODES.len()],
    };
    let (from, to) = if h.to_requester { (b, a) } else { (a, b) };
    let rkey = rkeys[usize::from(h.rkey_kind)];
    let info = opcode.info()?;
    let has = info.ext_headers;
    use roce::opcode::ExtHeaders as E;
    let mut ext = ExtReprs::default();
    if has.contains(E::RETH) {
        ext.reth = Some(reth::Repr {
            virtual_address: h.va,
            rkey,
            dma_len: h.dma_len,
        });
    }
    if has.contains(E::AETH) {
        ext.aeth = Some(aeth::Repr {
            syndrome: Syndrome::from_byte(h.syndrome),
            msn: h.dma_len & 0xff_ffff,
        });
    }
    if has.contains(E::ATOMIC_ETH) {
        ext.atomic_eth = Some(atomic_eth::request::Repr {
            virtual_address: h.va,
            rkey,
            swap_add_data: 1,
            compare_data: h.va,
        });
    }
    if has.contains(E::ATOMIC_ACK_ETH) {
        ext.atomic_ack_eth = Some(atomic_eth::ack::Repr {
            orig_remote_data: h.va,
        });
    }
    if has.contains(E::IMMDT) {
        ext.immdt = Some(roce::immdt::Repr {
            imm_data: h.dma_len,
        });
    }
    if has.contains(E::IETH) {
        ext.ieth = Some(roce::ieth::Repr { rkey });
    }
    if has.contains(E::DETH) {
        ext.deth = Some(roce::deth::Repr {
            qkey: if h.syndrome & 4 == 0 {
                0x1111_1111
            } else {
                0x2222_2222
            },
            src_qpn: h.dma_len,
        });
    }
    let payload = if info.has_payload {
        vec![0xa5; h.payload]
    } else {
        vec![]
    };
    let psn = A_PSN.wrapping_add(h.psn_delta) & 0xff_ffff;
    let transport = TransportRepr {
        bth: bth::Repr {
            opcode,
            solicited: h.syndrome & 1 != 0,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: to.qpn,
            ack_req: h.syndrome & 2 != 0,
            psn,
        },
        ext,
    };
    try_build(tx_between(from, to), transport, &payload)
}

fn hostile_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let seed = std::env::var("HCA_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xadc0_0001);
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(hostile_config())]

    /// Sequences of hostile packets (every opcode, nasty PSNs, addresses, keys, lengths,
    /// syndromes, payload sizes; some with a flipped byte and an unchecked ICRC) interleaved
    /// with legitimate traffic: never a panic, every queue stays bounded, memory outside the
    /// registered regions is never touched, and the engines stay usable or fail cleanly.
    #[test]
    fn hostile_packet_sequences_never_panic_and_keep_every_queue_bounded(
        packets in proptest::collection::vec(arb_hostile(), 1..60),
        legit_every in 1usize..8,
        qp_type in prop_oneof![
            3 => Just(hca::QpType::Rc),
            1 => Just(hca::QpType::Uc),
            1 => Just(hca::QpType::Ud),
        ],
    ) {
        let o = Opts { mem_len: 1 << 20, qp_type, ..Opts::default() };
        let (mut f, a, b) = pair(&o);
        let (other, _mem) = extra_mr(&mut f, &b, 4096, 0x3000_0000, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        let rkeys = [b.mr.rkey(), other.rkey(), 0xdead_beef, b.mr.lkey() ^ 1];
        for i in 0..8 {
            post_recv(&mut f, &b, i, &[b.sge(i * 4096, 4096)]);
        }
        let mut now = 1u64;
        for (i, h) in packets.iter().enumerate() {
            let Some(mut pkt) = build_hostile(h, qp_type, &a, &b, rkeys) else { continue };
            let to = if h.to_requester { &a } else { &b };
            let ident = match h.unchecked_icrc_flip {
                Some((at, x)) => {
                    let n = pkt.data.len();
                    pkt.data[at % n] ^= x;
                    None
                }
                None => Some(hca::engine::IPV4_IDENT),
            };
            f.node_mut(to.node).handle_datagram(
                t_us(now),
                &hca::Datagram {
                    src_ip: pkt.tx.src_ip,
                    dst_ip: pkt.tx.dst_ip,
                    src_port: pkt.tx.src_port,
                    dst_port: pkt.tx.dst_port,
                    ecn: pkt.tx.ecn,
                    dscp: 0,
                    hop_limit: 64,
                    ip_ident: ident,
                    payload: &pkt.data,
                },
            );
            if i % legit_every == 0 && qp_type != hca::QpType::Ud {
                let _ = f.node_mut(a.node).post_send(
                    a.qpn,
                    &send_wr(
                        i as u64,
                        &[a.sge(0, 100)],
                        SendOp::RdmaWrite { remote_addr: b.addr(8192), rkey: b.mr.rkey() },
                    ),
                );
            }
            // Every queue an engine keeps is bounded: a burst of transmits ends. The most a
            // responder can owe is one READ stream of the whole 1 MiB region (1 024 packets) per
            // responder resource (8), plus ACKs.
            for p in [&a, &b] {
                let out = transmit(&mut f, p, t_us(now));
                prop_assert!(out.len() <= 8 * 1024 + 64, "{} packets at once", out.len());
            }
            let _ = poll(&mut f, &a);
            let _ = poll(&mut f, &b);
            now += 1;
        }
        // Let the engines settle: timers are bounded and the fabric goes idle or times out.
        let _ = f.run_until(|_| false, Duration::from_millis(500));
        for p in [&a, &b] {
            let h = f.node_mut(p.node);
            let _ = h.poll_timeout();
            while h.poll_diag().is_some() {}
            while h.poll_event().is_some() {}
        }
        // A's memory is only ever read (the WRITEs' source), and READ responses to READs it
        // never posted must not land in it (unless a hostile WRITE to A was legitimate: a UC
        // WRITE FIRST / ONLY at any PSN, or an RC one at A's expected PSN, with a key that
        // happens to be A's).
        let writes_to_a = packets.iter().any(|h| {
            h.to_requester
                && (qp_type == hca::QpType::Uc
                    || h.psn_delta == 0xff_fff0u32.wrapping_sub(A_PSN))
        });
        prop_assert!(writes_to_a || a.read(0, 1 << 20).iter().all(|&x| x == 0));
    }
}

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
fn requester_completes_what_was_answered_before_a_nak_and_fails_the_nakked_wr() {
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
    deliver_all(&mut f, &b, &reqs, t_us(1));
    let resp = transmit(&mut f, &b, t_us(1));
    deliver_all(&mut f, &a, &resp, t_us(2));
    let wcs = poll(&mut f, &a);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(u64::from_ne_bytes(a.read(0, 8).try_into().unwrap()), 7);
    assert_eq!(a.read(64, 64), vec![0x3c; 64]);
}

#[test]
fn oversized_datagrams_with_an_unchecked_icrc_never_panic() {
    // A link that cannot see the IPv4 identification skips the ICRC; a 70 000-byte UDP payload
    // (impossible on a wire, possible through the API) must still be judged, never panic.
    for qp_type in [hca::QpType::Ud, hca::QpType::Rc, hca::QpType::Uc] {
        let o = Opts {
            qp_type,
            ..Opts::default()
        };
        let (mut f, a, b) = pair(&o);
        post_recv(&mut f, &b, 1, &[b.sge(0, 1 << 20)]);
        let opcode = match qp_type {
            hca::QpType::Ud => Opcode::UdSendOnly,
            hca::QpType::Rc => Opcode::RcSendOnly,
            hca::QpType::Uc => Opcode::UcSendOnly,
        };
        let ext = ExtReprs {
            deth: (qp_type == hca::QpType::Ud).then_some(roce::deth::Repr {
                qkey: 0x1111_1111,
                src_qpn: a.qpn,
            }),
            ..ExtReprs::default()
        };
        // Built with 4 payload bytes, then grown to 70 000 (pad 0, the ICRC left stale).
        let mut p = craft(&a, &b, opcode, A_PSN, ext, &[0x11; 4]);
        let at = p.data.len() - 4;
        p.data
            .splice(at..at, std::iter::repeat_n(0x11u8, 70_000 - 4));
        f.node_mut(b.node).handle_datagram(
            t_us(1),
            &hca::Datagram {
                src_ip: p.tx.src_ip,
                dst_ip: p.tx.dst_ip,
                src_port: p.tx.src_port,
                dst_port: 4791,
                ecn: roce::ipv4::Ecn::Ce,
                dscp: 0,
                hop_limit: 64,
                ip_ident: None,
                payload: &p.data,
            },
        );
        let _ = transmit(&mut f, &b, t_us(1));
        let wcs = poll(&mut f, &b);
        assert!(
            wcs.iter()
                .all(|w| w.status != WcStatus::Success || w.byte_len <= 70_040),
            "{qp_type:?}: {wcs:?}"
        );
    }
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
