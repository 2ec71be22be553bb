//! Wireshark's InfiniBand dissector (tshark), an implementation no one here wrote, reads a capture of
//! one MAD of every CM message the `roce` crate builds (REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ, SIDR_REP), each a UD SEND ONLY to QP1 (Q_Key 0x80010000, P_Key 0xFFFF) over IPv4 and
//! IPv6 as rxe sends them: every frame must dissect as an InfiniBand CM MAD with the attribute put
//! in, the REQ/REP/REJ fields must read back as written, and no frame may be marked malformed.
//!
//! tshark is installed by `tests/setup.sh`. Without tshark this test fails with a message saying so,
//! unless `ROCE_SKIP_TSHARK=1` is set.

use std::net::{Ipv4Addr, Ipv6Addr};

use roce::cm::{self, Message};
use roce::packet::{self, ExtReprs, IpRepr, PacketRepr, TransportRepr};
use roce::{bth, deth, ethernet, ipv4, ipv6, mad, Gid, Opcode};
use tests::{dissect_fields, tshark, tshark_num, write_pcap};

fn messages() -> Vec<Message> {
    let gid = |ip: Ipv4Addr| Gid::from(ip);
    let mut private_data = [0u8; cm::REQ_PRIVATE_DATA_LEN];
    private_data[0] = 0x00; // cma_hdr: version 0, IP version 4 in the next byte's high nibble
    private_data[1] = 0x40;
    let req = cm::Req {
        local_comm_id: 0x1234_5678,
        service_id: cm::service_id(cm::port_space::TCP, 18515),
        local_ca_guid: 0x0200_00ff_fe00_0001,
        local_qkey: 0,
        local_qpn: 0x11,
        responder_resources: 16,
        local_eecn: 0,
        initiator_depth: 16,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: cm::TransportType::Rc,
        end_to_end_flow_control: true,
        starting_psn: 0x00AB_CDEF,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu_code: roce::PathMtu::Mtu1024.code(),
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: cm::Path {
            local_gid: gid(Ipv4Addr::new(10, 0, 0, 1)),
            remote_gid: gid(Ipv4Addr::new(10, 0, 0, 2)),
            hop_limit: 64,
            subnet_local: true,
            local_ack_timeout: 18,
            ..cm::Path::default()
        },
        alternate_path: cm::Path::default(),
        sap_supported: false,
        private_data,
    };
    let rep = cm::Rep {
        local_comm_id: 0x9abc_def0,
        remote_comm_id: req.local_comm_id,
        local_qkey: 0,
        local_qpn: 0x22,
        local_eecn: 0,
        starting_psn: 0x0012_3456,
        responder_resources: 16,
        initiator_depth: 16,
        target_ack_delay: 15,
        failover_accepted: 1,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x0200_00ff_fe00_0002,
        private_data: [0; cm::REP_PRIVATE_DATA_LEN],
    };
    let ids = (rep.remote_comm_id, rep.local_comm_id);
    vec![
        Message::Req(req),
        Message::Mra(cm::Mra {
            local_comm_id: ids.1,
            remote_comm_id: ids.0,
            message_mraed: cm::MsgKind::Req,
            service_timeout: 21,
            private_data: [0; cm::MRA_PRIVATE_DATA_LEN],
        }),
        Message::Rep(rep),
        Message::Rtu(cm::Rtu {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            private_data: [0; cm::RTU_PRIVATE_DATA_LEN],
        }),
        Message::Rej(cm::Rej {
            local_comm_id: ids.1,
            remote_comm_id: ids.0,
            message_rejected: cm::MsgKind::Req,
            ari_len: 0,
            reason: cm::RejReason::InvalidServiceId,
            ari: [0; cm::REJ_ARI_LEN],
            private_data: [0; cm::REJ_PRIVATE_DATA_LEN],
        }),
        Message::Dreq(cm::Dreq {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn: 0x22,
            private_data: [0; cm::DREQ_PRIVATE_DATA_LEN],
        }),
        Message::Drep(cm::Drep {
            local_comm_id: ids.1,
            remote_comm_id: ids.0,
            private_data: [0; cm::DREP_PRIVATE_DATA_LEN],
        }),
        Message::SidrReq(cm::SidrReq {
            request_id: 7,
            pkey: 0xFFFF,
            service_id: cm::service_id(cm::port_space::UDP, 7174),
            private_data: [0; cm::SIDR_REQ_PRIVATE_DATA_LEN],
        }),
        Message::SidrRep(cm::SidrRep {
            request_id: 7,
            status: cm::SidrStatus::Success,
            info_len: 0,
            qpn: 0x33,
            service_id: cm::service_id(cm::port_space::UDP, 7174),
            qkey: 0x0123_4567,
            info: [0; cm::SIDR_REP_INFO_LEN],
            private_data: [0; cm::SIDR_REP_PRIVATE_DATA_LEN],
        }),
    ]
}

/// One GSI frame carrying `mad`: UD SEND ONLY to QP1 from QP1, as rxe sends MADs.
fn gsi_frame(mad: &[u8], psn: u32, ipv6: bool) -> Vec<u8> {
    let eth = ethernet::Repr {
        src_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x01]),
        dst_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x02]),
        vlan: None,
        ethertype: ethernet::EtherType::Ipv4,
    };
    let ip = if ipv6 {
        IpRepr::Ipv6(ipv6::Repr {
            src_addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
            dst_addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2),
            next_header: ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 64,
            dscp: 0,
            ecn: ipv4::Ecn::NotEct,
            flow_label: 0,
        })
    } else {
        IpRepr::Ipv4(ipv4::Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            protocol: ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 64,
            dscp: 0,
            ecn: ipv4::Ecn::NotEct,
            ident: 0,
            dont_frag: true,
        })
    };
    let transport = TransportRepr {
        bth: bth::Repr {
            opcode: Opcode::UdSendOnly,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: mad::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: mad::GSI_QPN,
            ack_req: false,
            psn,
        },
        ext: ExtReprs {
            deth: Some(deth::Repr {
                qkey: mad::GSI_QKEY,
                src_qpn: mad::GSI_QPN,
            }),
            ..ExtReprs::default()
        },
    };
    let repr = PacketRepr {
        ip,
        udp_src_port: roce::udp::rocev2_src_port(mad::GSI_QPN),
        udp_checksum: !ipv6,
        transport,
    };
    let mut frame = vec![0u8; 18 + repr.ip_packet_len(mad.len())];
    let len = packet::build_frame(&eth, &repr, &[mad], &mut frame).expect("build GSI frame");
    frame.truncate(len);
    frame
}

const FIELDS: [&str; 12] = [
    "frame.protocols",
    "_ws.malformed",
    "infiniband.bth.destqp",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.attributeid",
    "infiniband.mad.transactionid",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rej.reason",
];

#[test]
fn tshark_dissects_every_cm_message_as_infiniband_cm() {
    let Some(tshark) = tshark() else {
        if std::env::var_os("ROCE_SKIP_TSHARK").is_some() {
            eprintln!("tshark not found; skipped because ROCE_SKIP_TSHARK is set");
            return;
        }
        panic!("tshark not found: run `bash tests/setup.sh` as root (or set ROCE_SKIP_TSHARK=1)");
    };
    let mut sent = Vec::new();
    let mut frames = Vec::new();
    for ipv6 in [false, true] {
        for (i, msg) in messages().into_iter().enumerate() {
            let tid = 0x0000_0001_0000_0100 + i as u64;
            let mut buf = [0u8; mad::MAD_LEN];
            msg.emit_mad(tid, &mut buf).expect("emit MAD");
            let frame = gsi_frame(&buf, i as u32, ipv6);
            // Our own parser reads the frame back, ICRC verified, and the MAD in it.
            let parsed = roce::parse_frame(&frame).expect("parse our GSI frame");
            assert_eq!(parsed.transport.bth.dest_qpn, mad::GSI_QPN);
            assert_eq!(Message::parse_mad(parsed.payload).map(|(_, m)| m), Ok(msg));
            sent.push((msg, tid, ipv6));
            frames.push(frame);
        }
    }
    let dir = std::env::temp_dir().join(format!("roce-tshark-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("cm.pcap");
    write_pcap(&path, frames.iter().map(Vec::as_slice)).expect("write pcap");
    let seen = dissect_fields(&tshark, &path, &FIELDS).expect("run tshark");
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        seen.len(),
        sent.len(),
        "tshark read a different number of frames"
    );

    let num = |s: &str| tshark_num(s);
    for ((msg, tid, ipv6), f) in sent.iter().zip(&seen) {
        let what = format!(
            "{:?} over {}",
            msg.attr_id(),
            if *ipv6 { "IPv6" } else { "IPv4" }
        );
        assert!(
            f[1].trim().is_empty() && !f[0].contains("_ws.malformed"),
            "{what}: malformed: {f:?}"
        );
        assert!(
            f[0].contains(":infiniband"),
            "{what}: not InfiniBand: {}",
            f[0]
        );
        assert_eq!(num(&f[2]), Some(1), "{what}: DestQP");
        assert_eq!(num(&f[3]), Some(0x07), "{what}: class CM");
        assert_eq!(num(&f[4]), Some(2), "{what}: class version");
        assert_eq!(num(&f[5]), Some(0x03), "{what}: method Send");
        assert_eq!(
            num(&f[6]),
            Some(u64::from(u16::from(msg.attr_id()))),
            "{what}: attribute"
        );
        assert_eq!(num(&f[7]), Some(*tid), "{what}: TID");
        match msg {
            Message::Req(req) => {
                assert_eq!(
                    num(&f[8]),
                    Some(u64::from(req.local_qpn)),
                    "{what}: local QPN"
                );
                assert_eq!(num(&f[9]), Some(u64::from(req.starting_psn)), "{what}: PSN");
            }
            Message::Rep(rep) => {
                assert_eq!(
                    num(&f[10]),
                    Some(u64::from(rep.local_qpn)),
                    "{what}: local QPN"
                );
            }
            Message::Rej(rej) => {
                assert_eq!(
                    num(&f[11]),
                    Some(u64::from(u16::from(rej.reason))),
                    "{what}: reason"
                );
            }
            _ => {}
        }
    }
}

/// Records every packet the fabric carries (shared with the test through the mutex).
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<hca::fabric::WirePacket>>>);

impl hca::fabric::Tap for Recorder {
    fn on_packet(&mut self, _now: hca::Instant, packet: &mut hca::fabric::WirePacket) -> bool {
        let copy = hca::fabric::WirePacket {
            data: packet.data.clone(),
            ..*packet
        };
        self.0.lock().unwrap().push(copy);
        true
    }
}

/// The frame a wire packet of the fabric is on an Ethernet link: the engine's UDP payload under
/// the IP and UDP headers it was sent with (IPv4 identification `IPV4_IDENT`, DF), the ICRC
/// recomputed by `roce` and required to equal the one the engine wrote.
fn frame_of(p: &hca::fabric::WirePacket) -> Vec<u8> {
    let parsed = roce::packet::parse_udp_payload(&p.data).expect("engine packet parses");
    let ip = match (p.src_ip, p.dst_ip) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => IpRepr::Ipv4(ipv4::Repr {
            src_addr: s,
            dst_addr: d,
            protocol: ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: p.hop_limit,
            dscp: p.dscp,
            ecn: p.ecn,
            ident: hca::engine::IPV4_IDENT,
            dont_frag: true,
        }),
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => IpRepr::Ipv6(ipv6::Repr {
            src_addr: s,
            dst_addr: d,
            next_header: ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: p.hop_limit,
            dscp: p.dscp,
            ecn: p.ecn,
            flow_label: 0,
        }),
        _ => panic!("mixed address families"),
    };
    let eth = ethernet::Repr {
        src_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x01]),
        dst_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x02]),
        vlan: None,
        ethertype: ethernet::EtherType::Ipv4,
    };
    let repr = PacketRepr {
        ip,
        udp_src_port: p.src_port,
        udp_checksum: false,
        transport: parsed.transport,
    };
    let mut frame = vec![0u8; 18 + repr.ip_packet_len(parsed.payload.len())];
    let len = packet::build_frame(&eth, &repr, &[parsed.payload], &mut frame).expect("frame");
    frame.truncate(len);
    let rebuilt = roce::parse_frame(&frame).expect("rebuilt frame parses, ICRC verified");
    assert_eq!(
        rebuilt.icrc, parsed.icrc,
        "roce computes the ICRC the engine wrote"
    );
    frame
}

#[test]
fn tshark_dissects_a_cm_exchange_between_two_engines() {
    use hca::cm::{AcceptParams, Cm, CmConfig, CmEventKind, ConnectParams};
    use hca::{AccessFlags, QpCap, QpInitAttr, QpType};

    let Some(tshark) = tshark() else {
        if std::env::var_os("ROCE_SKIP_TSHARK").is_some() {
            eprintln!("tshark not found; skipped because ROCE_SKIP_TSHARK is set");
            return;
        }
        panic!("tshark not found: run `bash tests/setup.sh` as root (or set ROCE_SKIP_TSHARK=1)");
    };
    let mut f = hca::fabric::Fabric::new(1, hca::fabric::Faults::default());
    let ips: [std::net::IpAddr; 2] = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
    let mut nodes = Vec::new();
    for ip in ips {
        let mut h = hca::fabric::soft_hca(ip, 9000);
        let pd = h.alloc_pd().unwrap();
        let cq = h.create_cq(16).unwrap();
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        };
        let qpn = h.create_qp(pd, &init).unwrap();
        nodes.push((f.add_node(h), qpn));
    }
    let wire = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    f.set_tap(Some(Box::new(Recorder(wire.clone()))));
    let config = CmConfig {
        response_timeout: 14,
        timewait: std::time::Duration::from_millis(10),
        ..CmConfig::default()
    };
    let mut cms = [Cm::new(config.clone()), Cm::new(config)];
    let sid = cm::service_id(cm::port_space::TCP, 18515);
    cms[1].listen(sid).unwrap();
    let access = AccessFlags::REMOTE_WRITE;
    let now = f.now();
    let a_id = cms[0]
        .connect(
            now,
            f.node_mut(nodes[0].0),
            &ConnectParams {
                qpn: nodes[0].1,
                local_ip: ips[0],
                remote_ip: ips[1],
                service_id: sid,
                path_mtu: roce::PathMtu::Mtu1024,
                access,
                responder_resources: 1,
                initiator_depth: 1,
                retry_count: 7,
                rnr_retry_count: 7,
                flow_control: false,
                srq: false,
                private_data: b"captured",
                external_qp: false,
            },
        )
        .unwrap();
    let mut events: Vec<(usize, CmEventKind)> = Vec::new();
    let mut disconnected = false;
    for _ in 0..2000 {
        let now = f.now();
        for (i, cm) in cms.iter_mut().enumerate() {
            let node = nodes[i].0;
            while let Some(m) = f.node_mut(node).poll_mad() {
                cm.handle_mad(now, f.node_mut(node), &m);
            }
            if cm.poll_timeout().is_some_and(|t| t <= now) {
                cm.handle_timeout(now, f.node_mut(node));
            }
            while let Some(e) = cm.poll_event() {
                if matches!(e.kind, CmEventKind::ConnectRequest { .. }) {
                    let p = AcceptParams {
                        qpn: nodes[1].1,
                        access,
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        flow_control: false,
                        srq: false,
                        private_data: b"ok",
                        external_qp: false,
                    };
                    cm.accept(now, f.node_mut(node), e.id, &p).unwrap();
                }
                events.push((i, e.kind));
            }
        }
        let established = events
            .iter()
            .filter(|(_, k)| matches!(k, CmEventKind::Established { .. }))
            .count();
        if established == 2 && !disconnected {
            cms[0]
                .disconnect(now, f.node_mut(nodes[0].0), a_id)
                .unwrap();
            disconnected = true;
        }
        if events
            .iter()
            .filter(|(_, k)| *k == CmEventKind::TimewaitExit)
            .count()
            == 2
        {
            break;
        }
        f.run_for(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        events
            .iter()
            .filter(|(_, k)| *k == CmEventKind::TimewaitExit)
            .count(),
        2,
        "{events:?}"
    );
    let frames: Vec<Vec<u8>> = wire.lock().unwrap().iter().map(frame_of).collect();
    let attrs: Vec<u16> = frames
        .iter()
        .map(|fr| {
            let p = roce::parse_frame(fr).unwrap();
            mad::Repr::parse_mad(p.payload).unwrap().attr_id
        })
        .collect();
    // REQ, REP, RTU, DREQ, DREP in this order, nothing else.
    assert_eq!(attrs, vec![0x10, 0x13, 0x14, 0x15, 0x16]);

    let dir = std::env::temp_dir().join(format!("roce-tshark-cm-x-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("cm-exchange.pcap");
    write_pcap(&path, frames.iter().map(Vec::as_slice)).expect("write pcap");
    let seen = dissect_fields(&tshark, &path, &FIELDS).expect("run tshark");
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(seen.len(), 5);
    for (f, attr) in seen.iter().zip(&attrs) {
        assert!(
            f[1].trim().is_empty() && !f[0].contains("_ws.malformed"),
            "malformed: {f:?}"
        );
        assert_eq!(tshark_num(&f[3]), Some(0x07), "class CM: {f:?}");
        assert_eq!(
            tshark_num(&f[6]),
            Some(u64::from(*attr)),
            "attribute: {f:?}"
        );
    }
    assert_eq!(
        tshark_num(&seen[0][8]),
        Some(u64::from(nodes[0].1)),
        "REQ local QPN"
    );
    assert_eq!(
        tshark_num(&seen[1][10]),
        Some(u64::from(nodes[1].1)),
        "REP local QPN"
    );
}
