//! QP1, the GSI (`hca/src/engine/gsi.rs`), on two engines: MADs cross between the engines' QP1s as
//! UD SEND ONLY with the GSI Q_Key and P_Key, requests the GSI cannot serve are answered with the
//! IBTA status (bad version, unsupported method/attribute), forged or malformed MADs are dropped
//! and counted, and a MAD flood stays bounded without disturbing an RC QP.

mod common;

use std::time::Duration;

use common::crafted_packets::*;
use common::*;
use hca::engine::gsi::{GSI_RECV_QUEUE_LEN, GSI_SEND_QUEUE_LEN};
use hca::{DropReason, WcStatus};
use roce::cm::{self, Message};
use roce::mad::{self, Method, MgmtClass, Status, MAD_LEN};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{bth, deth, Opcode};

fn rtu_mad(tid: u64) -> [u8; MAD_LEN] {
    let mut buf = [0u8; MAD_LEN];
    Message::Rtu(cm::Rtu {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: [0x5a; cm::RTU_PRIVATE_DATA_LEN],
    })
    .emit_mad(tid, &mut buf)
    .unwrap();
    buf
}

fn mad_with(
    base_version: u8,
    class: MgmtClass,
    class_version: u8,
    method: Method,
) -> [u8; MAD_LEN] {
    let mut buf = [0u8; MAD_LEN];
    mad::Repr {
        base_version,
        mgmt_class: class,
        class_version,
        method,
        status: Status::Ok,
        class_specific: 0,
        tid: 0x0102_0304_0506_0708,
        attr_id: 0x0015,
        attr_mod: 0,
    }
    .emit(&mut mad::Packet::new_unchecked(&mut buf[..]));
    buf
}

/// A GSI packet from `from` to `to`'s QP1 with a valid ICRC and the given fields.
fn gsi_pkt(from: &Peer, to: &Peer, opcode: Opcode, pkey: u16, qkey: u32, payload: &[u8]) -> Pkt {
    let transport = TransportRepr {
        bth: bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qpn: mad::GSI_QPN,
            ack_req: false,
            psn: 0,
        },
        ext: ExtReprs {
            deth: opcode
                .ext_headers()
                .contains(roce::opcode::ExtHeaders::DETH)
                .then_some(deth::Repr {
                    qkey,
                    src_qpn: mad::GSI_QPN,
                }),
            ..ExtReprs::default()
        },
    };
    try_build(tx_between(from, to), transport, payload).expect("well-formed headers")
}

fn good(from: &Peer, to: &Peer, m: &[u8]) -> Pkt {
    gsi_pkt(
        from,
        to,
        Opcode::UdSendOnly,
        mad::DEFAULT_PKEY,
        mad::GSI_QKEY,
        m,
    )
}

#[test]
fn a_cm_mad_crosses_from_qp1_to_qp1() {
    let (mut f, a, b) = pair(&Opts::default());
    let m = rtu_mad(0x42);
    f.node_mut(a.node).gsi_send(a.ip, b.ip, 1, &m).unwrap();
    let pkts = transmit(&mut f, &a, t_us(0));
    assert_eq!(pkts.len(), 1);
    let p = pkts[0].parsed();
    assert_eq!(p.transport.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(p.transport.bth.dest_qpn, 1);
    assert_eq!(p.transport.bth.pkey, 0xFFFF);
    assert_eq!(
        p.transport.ext.deth,
        Some(deth::Repr {
            qkey: 0x8001_0000,
            src_qpn: 1
        })
    );
    assert_eq!(p.payload, &m[..]);
    deliver(&mut f, &b, &pkts[0], t_us(1));
    let got = f
        .node_mut(b.node)
        .poll_mad()
        .expect("B's QP1 queued the MAD");
    assert_eq!((got.src_ip, got.dst_ip, got.src_qpn), (a.ip, b.ip, 1));
    assert_eq!(got.mad, m);
    let (hdr, msg) = Message::parse_mad(&got.mad).unwrap();
    assert_eq!(hdr.tid, 0x42);
    assert!(matches!(msg, Message::Rtu(_)));
    assert!(f.node_mut(b.node).poll_mad().is_none());
    let c = f.node(b.node).counters();
    assert_eq!((c.gsi_rcvd, c.total_drops()), (1, 0));
    assert_eq!(f.node(a.node).counters().gsi_sent, 1);
}

#[test]
fn gsi_send_refuses_bad_lengths_and_a_full_queue() {
    let (mut f, a, b) = pair(&Opts::default());
    let h = f.node_mut(a.node);
    assert_eq!(
        h.gsi_send(a.ip, b.ip, 1, &[0u8; 255]).unwrap_err().errno(),
        hca::errno::EINVAL
    );
    assert_eq!(
        h.gsi_send(a.ip, b.ip, 1, &[0u8; 257]).unwrap_err().errno(),
        hca::errno::EINVAL
    );
    for _ in 0..GSI_SEND_QUEUE_LEN {
        h.gsi_send(a.ip, b.ip, 1, &rtu_mad(1)).unwrap();
    }
    assert_eq!(
        h.gsi_send(a.ip, b.ip, 1, &rtu_mad(1)).unwrap_err().errno(),
        hca::errno::ENOMEM
    );
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), GSI_SEND_QUEUE_LEN);
}

/// B answers `request` (sent by A): the MAD header of the answer on the wire, if any. An answer
/// with base version 1 also reaches A's consumer (responses are delivered for TID matching).
fn answer_of(request: [u8; MAD_LEN]) -> Option<mad::Repr> {
    let (mut f, a, b) = pair(&Opts::default());
    deliver(&mut f, &b, &good(&a, &b, &request), t_us(0));
    assert!(
        f.node_mut(b.node).poll_mad().is_none(),
        "a request the GSI answers is not delivered"
    );
    let pkts = transmit(&mut f, &b, t_us(1));
    assert!(pkts.len() <= 1);
    let pkt = pkts.first()?;
    let p = pkt.parsed();
    assert_eq!(p.transport.bth.dest_qpn, 1);
    assert_eq!(p.transport.ext.deth.map(|d| d.qkey), Some(mad::GSI_QKEY));
    assert_eq!(
        p.payload[mad::HEADER_LEN..],
        request[mad::HEADER_LEN..],
        "data echoed"
    );
    let hdr = mad::Repr::parse_mad(p.payload).unwrap();
    deliver(&mut f, &a, pkt, t_us(2));
    let got = f.node_mut(a.node).poll_mad();
    if hdr.base_version == mad::BASE_VERSION {
        assert_eq!(
            got.map(|g| g.mad.to_vec()),
            Some(p.payload.to_vec()),
            "A receives the answer"
        );
    } else {
        assert!(got.is_none(), "a MAD of another base version is dropped");
    }
    Some(hdr)
}

#[test]
fn requests_the_gsi_cannot_serve_get_the_ibta_status() {
    let get = |class, version| mad_with(1, class, version, Method::Get);
    let r = answer_of(get(MgmtClass::PerfMgmt, 1)).unwrap();
    assert_eq!(
        (r.method, r.status),
        (Method::GetResp, Status::UnsupportedMethodAttr)
    );
    assert_eq!(
        (r.tid, r.attr_id, r.mgmt_class),
        (0x0102_0304_0506_0708, 0x15, MgmtClass::PerfMgmt)
    );
    let r = answer_of(mad_with(1, MgmtClass::Unknown(0x33), 1, Method::Set)).unwrap();
    assert_eq!(r.status, Status::UnsupportedMethodAttr);
    let r = answer_of(get(MgmtClass::CommMgmt, 2)).unwrap();
    assert_eq!(
        r.status,
        Status::UnsupportedMethodAttr,
        "the CM class serves Send only"
    );
    let r = answer_of(get(MgmtClass::CommMgmt, 1)).unwrap();
    assert_eq!(r.status, Status::BadVersion);
    let r = answer_of(mad_with(2, MgmtClass::PerfMgmt, 1, Method::Get)).unwrap();
    assert_eq!(r.status, Status::BadVersion);
    // Not Get / Set: dropped, never answered.
    assert_eq!(
        answer_of(mad_with(1, MgmtClass::PerfMgmt, 1, Method::Trap)),
        None
    );
    assert_eq!(
        answer_of(mad_with(1, MgmtClass::CommMgmt, 3, Method::Send)),
        None
    );
}

#[test]
fn forged_and_malformed_mads_are_dropped_and_counted() {
    let (mut f, a, b) = pair(&Opts::default());
    let m = rtu_mad(9);
    let cases = [
        (
            gsi_pkt(&a, &b, Opcode::UdSendOnly, 0xFFFF, 0x1111_1111, &m),
            Some(DropReason::Qkey),
        ),
        (
            gsi_pkt(&a, &b, Opcode::UdSendOnly, 0x8001, mad::GSI_QKEY, &m),
            Some(DropReason::Pkey),
        ),
        (
            gsi_pkt(&a, &b, Opcode::RcSendOnly, 0xFFFF, 0, &m),
            Some(DropReason::QpType),
        ),
        (good(&a, &b, &m[..200]), None),
        (good(&a, &b, &[m.as_slice(), &[0; 4]].concat()), None),
    ];
    let mut bad_mads = 0;
    for (i, (pkt, reason)) in cases.iter().enumerate() {
        let before = f.node(b.node).counters().clone();
        deliver(&mut f, &b, pkt, t_us(i as u64));
        let after = f.node(b.node).counters().clone();
        match reason {
            Some(r) => assert_eq!(after.drops(*r), before.drops(*r) + 1, "case {i}"),
            None => {
                bad_mads += 1;
                assert_eq!(after.gsi_bad_mad, bad_mads, "case {i}");
            }
        }
        assert!(
            f.node_mut(b.node).poll_mad().is_none(),
            "case {i} delivered"
        );
    }
    // A corrupted ICRC.
    let mut pkt = good(&a, &b, &m);
    let n = pkt.data.len();
    pkt.data[n - 1] ^= 1;
    deliver(&mut f, &b, &pkt, t_us(10));
    assert_eq!(drops(&f, &b, DropReason::Icrc), 1);
    assert!(f.node_mut(b.node).poll_mad().is_none());
    assert!(
        transmit(&mut f, &b, t_us(11)).is_empty(),
        "nothing answers a dropped MAD"
    );
}

#[test]
fn a_mad_flood_is_bounded_and_leaves_rc_traffic_alone() {
    let (mut f, a, b) = pair(&Opts::default());
    let flood = 1000;
    for i in 0..flood {
        deliver(&mut f, &b, &good(&a, &b, &rtu_mad(i)), t_us(0));
        deliver(
            &mut f,
            &b,
            &good(&a, &b, &mad_with(1, MgmtClass::PerfMgmt, 1, Method::Get)),
            t_us(0),
        );
    }
    let c = f.node(b.node).counters().clone();
    assert_eq!(c.gsi_rcvd, GSI_RECV_QUEUE_LEN as u64);
    assert_eq!(c.gsi_answered, GSI_SEND_QUEUE_LEN as u64);
    assert_eq!(
        c.gsi_queue_full,
        2 * flood - (GSI_RECV_QUEUE_LEN + GSI_SEND_QUEUE_LEN) as u64
    );
    // The RC QP still works, while B's QP1 drains its answers beside it.
    common::work_requests::post(
        &mut f,
        &a,
        common::work_requests::write(&a, 7, (0, 4096), &b, 0),
    );
    let wcs = run_for_completions(&mut f, &a, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), vec![(7, WcStatus::Success)]);
    let mut delivered = 0;
    while f.node_mut(b.node).poll_mad().is_some() {
        delivered += 1;
        assert!(delivered <= GSI_RECV_QUEUE_LEN);
    }
    assert_eq!(delivered, GSI_RECV_QUEUE_LEN);
    assert_eq!(
        f.node(b.node).counters().gsi_sent,
        GSI_SEND_QUEUE_LEN as u64
    );
}
