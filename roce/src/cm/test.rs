//! Tests of the CM message layouts against IBTA vol. 1 tables 106-120 (as Linux
//! `include/rdma/ibta_vol1_c12.h` spells them): golden offsets written by hand, the number of
//! reserved bits of each message, truncation, and round trips of arbitrary bytes.

use super::*;
use proptest::prelude::*;

const ALL_ATTRS: [AttrId; 9] = [
    AttrId::Req,
    AttrId::Mra,
    AttrId::Rej,
    AttrId::Rep,
    AttrId::Rtu,
    AttrId::Dreq,
    AttrId::Drep,
    AttrId::SidrReq,
    AttrId::SidrRep,
];

fn gid(last: u8) -> Gid {
    let mut b = [0u8; 16];
    b[10] = 0xff;
    b[11] = 0xff;
    b[12] = 192;
    b[13] = 168;
    b[14] = 1;
    b[15] = last;
    Gid::from_bytes(b)
}

fn sample_req() -> Req {
    let mut private_data = [0u8; REQ_PRIVATE_DATA_LEN];
    for (i, b) in private_data.iter_mut().enumerate() {
        *b = i as u8;
    }
    Req {
        local_comm_id: 0x1122_3344,
        service_id: service_id(port_space::TCP, 19049),
        local_ca_guid: 0x0200_00ff_fe00_0001,
        local_qkey: 0,
        local_qpn: 0x00_0011,
        responder_resources: 16,
        local_eecn: 0,
        initiator_depth: 15,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: TransportType::Rc,
        end_to_end_flow_control: true,
        starting_psn: 0xAB_CDEF,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu_code: PathMtu::Mtu1024.code(),
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: Path {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid(1),
            remote_gid: gid(2),
            flow_label: 0xF_FFFF,
            packet_rate: 0x3F,
            traffic_class: 0x68,
            hop_limit: 64,
            sl: 0xF,
            subnet_local: true,
            local_ack_timeout: 18,
        },
        alternate_path: Path::default(),
        sap_supported: false,
        private_data,
    }
}

#[test]
fn req_fields_sit_at_the_table_106_offsets() {
    let req = sample_req();
    let mut d = [0xa5u8; DATA_LEN];
    req.emit(&mut d).unwrap();
    assert_eq!(d[0..4], [0x11, 0x22, 0x33, 0x44]);
    assert_eq!(d[4..8], [0; 4], "reserved");
    assert_eq!(d[8..16], [0, 0, 0, 0, 0x01, 0x06, 0x4A, 0x69], "service ID");
    assert_eq!(d[16..24], [0x02, 0, 0, 0xff, 0xfe, 0, 0, 0x01]);
    assert_eq!(d[32..36], [0, 0, 0x11, 16], "QPN, responder resources");
    assert_eq!(d[39], 15, "initiator depth");
    // Byte 43: remote CM response timeout (5 bits) 20 = 10100, transport RC 00, EEFC 1.
    assert_eq!(d[43], 0b1010_0001);
    assert_eq!(d[44..47], [0xAB, 0xCD, 0xEF], "starting PSN");
    // Byte 47: local CM response timeout 10100, retry count 111.
    assert_eq!(d[47], 0b1010_0111);
    assert_eq!(d[48..50], [0xFF, 0xFF], "P_Key");
    // Byte 50: MTU 3 (1024) = 0011, RDC 0, RNR retry 111. Byte 51: max CM retries 1111, SRQ 0.
    assert_eq!(d[50], 0b0011_0111);
    assert_eq!(d[51], 0b1111_0000);
    assert_eq!(d[52..56], [0xFF; 4], "LIDs");
    assert_eq!(d[56..72], *gid(1).as_bytes());
    assert_eq!(d[72..88], *gid(2).as_bytes());
    // Flow label 20 bits, 6 reserved bits, packet rate 6 bits.
    assert_eq!(d[88..92], [0xFF, 0xFF, 0xF0, 0x3F]);
    assert_eq!(d[92..94], [0x68, 64]);
    assert_eq!(d[94], 0b1111_1000, "SL, subnet local");
    assert_eq!(d[95], 18 << 3, "local ACK timeout");
    assert_eq!(d[96..140], [0; 44], "no alternate path");
    assert_eq!(d[140..232], req.private_data);
    assert_eq!(Req::parse(&d), Ok(req));
    assert_eq!(req.path_mtu(), Some(PathMtu::Mtu1024));
    assert_eq!(
        Req {
            path_mtu_code: 9,
            ..req
        }
        .path_mtu(),
        None
    );
}

#[test]
fn rep_rej_dreq_sidr_fields_sit_at_their_table_offsets() {
    let rep = Rep {
        local_comm_id: 1,
        remote_comm_id: 2,
        local_qkey: 3,
        local_qpn: 0x12_3456,
        local_eecn: 0,
        starting_psn: 0x65_4321,
        responder_resources: 4,
        initiator_depth: 5,
        target_ack_delay: 0x1F,
        failover_accepted: 1,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 0x0102_0304_0506_0708,
        private_data: [0x5a; REP_PRIVATE_DATA_LEN],
    };
    let mut d = [0xa5u8; DATA_LEN];
    rep.emit(&mut d).unwrap();
    assert_eq!(d[12..16], [0x12, 0x34, 0x56, 0]);
    assert_eq!(d[20..24], [0x65, 0x43, 0x21, 0]);
    assert_eq!(d[24..28], [4, 5, 0b1111_1011, 0b1111_0000]);
    assert_eq!(d[28..36], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(Rep::parse(&d), Ok(rep));

    let mut ari = [0u8; REJ_ARI_LEN];
    ari[0] = 9;
    let rej = Rej {
        local_comm_id: 7,
        remote_comm_id: 8,
        message_rejected: MsgKind::Req,
        ari_len: 1,
        reason: RejReason::InvalidServiceId,
        ari,
        private_data: [0; REJ_PRIVATE_DATA_LEN],
    };
    rej.emit(&mut d).unwrap();
    assert_eq!(d[8..13], [0, 1 << 1, 0, 8, 9]);
    assert_eq!(Rej::parse(&d).unwrap().ari(), &[9]);

    let dreq = Dreq {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 0xAB_CDEF,
        private_data: [0; DREQ_PRIVATE_DATA_LEN],
    };
    dreq.emit(&mut d).unwrap();
    assert_eq!(d[8..12], [0xAB, 0xCD, 0xEF, 0]);

    let sidr = SidrRep {
        request_id: 0x0A0B_0C0D,
        status: SidrStatus::Success,
        info_len: 0,
        qpn: 0x00_0123,
        service_id: service_id(port_space::UDP, 7174),
        qkey: 0x0123_4567,
        info: [0; SIDR_REP_INFO_LEN],
        private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
    };
    sidr.emit(&mut d).unwrap();
    assert_eq!(d[4..12], [0, 0, 0, 0, 0, 0x01, 0x23, 0]);
    assert_eq!(
        d[12..24],
        [0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06, 0x01, 0x23, 0x45, 0x67]
    );
}

#[test]
fn reserved_bits_per_message_match_the_tables() {
    // All-ones class data through parse and emit: exactly the reserved bits come back as zeros.
    // Counted from IBTA tables 106-120: REQ 2x32 reserved + primary path 6+3+3 + alternate 6+3+2;
    // MRA 6+3; REJ 6 + 1 (plus the 6 zero bits of the Rejected Info Length 72 = 0b1001000 set
    // below); REP bytes 15, 19, 23 and 4 bits of 27; DREQ byte 11; SIDR_REQ bytes 6-7; SIDR_REP
    // bytes 6-7 and 11 (plus the 6 zero bits of the info length 72).
    let expected = [
        (AttrId::Req, 87),
        (AttrId::Mra, 9),
        (AttrId::Rej, 7 + 5),
        (AttrId::Rep, 28),
        (AttrId::Rtu, 0),
        (AttrId::Dreq, 8),
        (AttrId::Drep, 0),
        (AttrId::SidrReq, 16),
        (AttrId::SidrRep, 24 + 6),
    ];
    for (attr, zeros) in expected {
        let mut d = [0xffu8; DATA_LEN];
        if attr == AttrId::Rej {
            d[9] = (72 << 1) | 1;
        }
        if attr == AttrId::SidrRep {
            d[5] = 72;
        }
        let m = Message::parse(attr, &d).unwrap();
        let mut out = [0xa5u8; DATA_LEN];
        m.emit(&mut out).unwrap();
        let got: u32 = out.iter().map(|b| b.count_zeros()).sum();
        assert_eq!(got, zeros, "{attr:?}");
    }
}

#[test]
fn truncated_and_short_buffers_are_refused() {
    let d = [0u8; DATA_LEN];
    for attr in ALL_ATTRS {
        let m = Message::parse(attr, &d).unwrap();
        assert_eq!(m.attr_id(), attr);
        for len in [0, 1, 8, DATA_LEN - 1] {
            assert_eq!(
                Message::parse(attr, &d[..len]),
                Err(Error::Truncated {
                    layer: Layer::Cm,
                    need: DATA_LEN,
                    got: len
                }),
                "{attr:?}"
            );
            let mut out = [0u8; DATA_LEN];
            assert_eq!(
                m.emit(&mut out[..len]),
                Err(Error::BufferTooSmall {
                    need: DATA_LEN,
                    got: len
                })
            );
        }
        let mut mad = [0u8; mad::MAD_LEN];
        assert!(m.emit_mad(1, &mut mad[..mad::MAD_LEN - 1]).is_err());
    }
}

#[test]
fn length_fields_above_72_are_malformed() {
    let mut d = [0u8; DATA_LEN];
    d[9] = 73 << 1;
    assert!(matches!(
        Message::parse(AttrId::Rej, &d),
        Err(Error::Malformed {
            layer: Layer::Cm,
            ..
        })
    ));
    let mut d = [0u8; DATA_LEN];
    d[5] = 73;
    assert!(matches!(
        Message::parse(AttrId::SidrRep, &d),
        Err(Error::Malformed {
            layer: Layer::Cm,
            ..
        })
    ));
    let Message::Rej(rej) = Message::parse(AttrId::Rej, &[0; DATA_LEN]).unwrap() else {
        unreachable!()
    };
    let mut out = [0u8; DATA_LEN];
    assert!(Rej { ari_len: 73, ..rej }.emit(&mut out).is_err());
}

#[test]
fn lap_apr_and_foreign_attributes_are_refused() {
    let d = [0u8; DATA_LEN];
    for attr in [
        AttrId::Lap,
        AttrId::Apr,
        AttrId::ClassPortInfo,
        AttrId::Unknown(0x42),
    ] {
        assert!(
            matches!(Message::parse(attr, &d), Err(Error::Malformed { .. })),
            "{attr:?}"
        );
    }
}

#[test]
fn whole_mad_round_trip_and_header_checks() {
    let msg = Message::Req(sample_req());
    let mut mad = [0u8; mad::MAD_LEN];
    assert_eq!(
        msg.emit_mad(0x0000_0001_0000_0042, &mut mad),
        Ok(mad::MAD_LEN)
    );
    assert_eq!(mad[..4], [1, 0x07, 2, 0x03]);
    assert_eq!(mad[16..18], [0x00, 0x10]);
    let (hdr, back) = Message::parse_mad(&mad).unwrap();
    assert_eq!(hdr.tid, 0x0000_0001_0000_0042);
    assert_eq!(back, msg);

    let mut bad = mad;
    bad[0] = 2;
    assert_eq!(
        Message::parse_mad(&bad),
        Err(Error::BadVersion {
            layer: Layer::Mad,
            version: 2
        })
    );
    let mut bad = mad;
    bad[2] = 1;
    assert_eq!(
        Message::parse_mad(&bad),
        Err(Error::BadVersion {
            layer: Layer::Mad,
            version: 1
        })
    );
    let mut bad = mad;
    bad[1] = 0x04;
    assert!(matches!(
        Message::parse_mad(&bad),
        Err(Error::Malformed { .. })
    ));
    let mut bad = mad;
    bad[3] = 0x01;
    assert!(matches!(
        Message::parse_mad(&bad),
        Err(Error::Malformed { .. })
    ));
    assert!(matches!(
        Message::parse_mad(&mad[..200]),
        Err(Error::Truncated {
            layer: Layer::Mad,
            ..
        })
    ));
}

#[test]
fn service_ids_are_rdma_cm_s() {
    // Linux cma.c: (ps << 16) + port; RDMA_PS_TCP 0x0106, RDMA_PS_UDP 0x0111, RDMA_PS_IB 0x013F.
    assert_eq!(service_id(port_space::TCP, 18515), 0x0000_0000_0106_4853);
    assert_eq!(service_id(port_space::UDP, 7174), 0x0000_0000_0111_1C06);
    assert_eq!(service_id(port_space::IB, 1), 0x0000_0000_013F_0001);
}

proptest! {
    #[test]
    fn arbitrary_class_data_parses_emits_and_parses_again(
        attr in proptest::sample::select(ALL_ATTRS.to_vec()),
        data in proptest::collection::vec(any::<u8>(), DATA_LEN..=DATA_LEN),
    ) {
        if let Ok(m) = Message::parse(attr, &data) {
            let mut out = [0u8; DATA_LEN];
            m.emit(&mut out).unwrap();
            prop_assert_eq!(Message::parse(attr, &out), Ok(m));
            // Every byte that is not reserved comes back: the emitted data differs from the
            // input only where the input had bits the tables reserve.
            for (o, i) in out.iter().zip(&data) {
                prop_assert_eq!(o & !i, 0);
            }
        }
    }

    #[test]
    fn arbitrary_mads_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Message::parse_mad(&data);
        if data.len() >= mad::MAD_LEN {
            let mut mad = [0u8; mad::MAD_LEN];
            mad.copy_from_slice(&data[..mad::MAD_LEN]);
            mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
            let _ = Message::parse_mad(&mad);
        }
    }
}

#[test]
fn cma_hdr_layout_round_trip_and_errors() {
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let h = CmaHdr {
        src_port: 0x1234,
        src_addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        dst_addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    };
    let mut b = [0xa5u8; CmaHdr::LEN];
    h.emit(&mut b).unwrap();
    // cma.c: version 0, IP version in the high nibble, IPv4 in the last 4 of 16 bytes.
    assert_eq!(b[..4], [0, 0x40, 0x12, 0x34]);
    assert_eq!(b[4..20], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
    assert_eq!(b[32..36], [10, 0, 0, 2]);
    assert_eq!(CmaHdr::parse(&b), Ok(h));
    let h6 = CmaHdr {
        src_port: 1,
        src_addr: IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        dst_addr: IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2)),
    };
    h6.emit(&mut b).unwrap();
    assert_eq!(b[1], 0x60);
    assert_eq!(CmaHdr::parse(&b), Ok(h6));
    assert!(matches!(
        CmaHdr::parse(&b[..35]),
        Err(Error::Truncated { .. })
    ));
    let mut bad = b;
    bad[0] = 1;
    assert!(matches!(CmaHdr::parse(&bad), Err(Error::BadVersion { .. })));
    let mut bad = b;
    bad[1] = 0x50;
    assert!(matches!(CmaHdr::parse(&bad), Err(Error::Malformed { .. })));
    let mixed = CmaHdr {
        dst_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        ..h6
    };
    assert!(mixed.emit(&mut b).is_err());
    assert!(h.emit(&mut b[..35]).is_err());
    assert_eq!(CmaHdr::REQ_USER_DATA_LEN, 56);
}
