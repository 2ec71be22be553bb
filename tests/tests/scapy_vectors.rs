//! RoCEv2 frames built by scapy (an independent implementation; `tests/scapy/gen_vectors.py`, output
//! committed as `tests/data/rocev2_vectors.json`) against this project's `roce` crate:
//! every frame parses to the fields scapy was given, and the builder, fed those fields, produces the
//! same bytes (IP and UDP checksums and ICRC included).

use roce::packet::{self, ExtReprs, PacketRepr, TransportRepr};
use roce::{aeth, atomic_eth, bth, deth, ieth, immdt, opcode::Opcode, reth};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Vector {
    name: String,
    opcode: u8,
    ip_version: u8,
    ip_ident: u16,
    tos: u8,
    udp_src_port: u16,
    udp_checksum: u16,
    ip_checksum: u16,
    solicited: u8,
    mig_req: u8,
    pad_cnt: u8,
    pkey: u16,
    dest_qpn: u32,
    ack_req: u8,
    psn: u32,
    #[serde(default)]
    becn: u8,
    ext: Ext,
    payload: String,
    icrc_wire: String,
    frame: String,
}

#[derive(Debug, Deserialize)]
struct Ext {
    reth: Option<RethV>,
    aeth: Option<AethV>,
    atomic_eth: Option<AtomicEthV>,
    atomic_ack_eth: Option<AtomicAckV>,
    immdt: Option<ImmV>,
    ieth: Option<IethV>,
    deth: Option<DethV>,
}

#[derive(Debug, Deserialize)]
struct RethV {
    va: u64,
    rkey: u32,
    dma_len: u32,
}
#[derive(Debug, Deserialize)]
struct AethV {
    syndrome: u8,
    msn: u32,
}
#[derive(Debug, Deserialize)]
struct AtomicEthV {
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
}
#[derive(Debug, Deserialize)]
struct AtomicAckV {
    orig: u64,
}
#[derive(Debug, Deserialize)]
struct ImmV {
    imm: u32,
}
#[derive(Debug, Deserialize)]
struct IethV {
    rkey: u32,
}
#[derive(Debug, Deserialize)]
struct DethV {
    qkey: u32,
    src_qp: u32,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn vectors() -> Vec<Vector> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/rocev2_vectors.json");
    let text = std::fs::read_to_string(path).expect("read the scapy vectors");
    let v: Vec<Vector> = serde_json::from_str(&text).expect("parse the scapy vectors");
    assert!(
        v.len() > 70,
        "expected the full vector set, found {}",
        v.len()
    );
    v
}

/// The transport headers the vector's generator was given (from the JSON, not from the frame).
fn transport_of(v: &Vector) -> TransportRepr {
    let e = &v.ext;
    TransportRepr {
        bth: bth::Repr {
            opcode: Opcode::from(v.opcode),
            solicited: v.solicited != 0,
            mig_req: v.mig_req != 0,
            pad_cnt: v.pad_cnt,
            pkey: v.pkey,
            fecn: false,
            becn: v.becn != 0,
            dest_qpn: v.dest_qpn,
            ack_req: v.ack_req != 0,
            psn: v.psn,
        },
        ext: ExtReprs {
            reth: e.reth.as_ref().map(|r| reth::Repr {
                virtual_address: r.va,
                rkey: r.rkey,
                dma_len: r.dma_len,
            }),
            aeth: e.aeth.as_ref().map(|a| aeth::Repr {
                syndrome: aeth::Syndrome::from_byte(a.syndrome),
                msn: a.msn,
            }),
            atomic_eth: e.atomic_eth.as_ref().map(|a| atomic_eth::request::Repr {
                virtual_address: a.va,
                rkey: a.rkey,
                swap_add_data: a.swap_add,
                compare_data: a.compare,
            }),
            atomic_ack_eth: e.atomic_ack_eth.as_ref().map(|a| atomic_eth::ack::Repr {
                orig_remote_data: a.orig,
            }),
            immdt: e.immdt.as_ref().map(|i| immdt::Repr {
                imm_data: immdt::Repr::from_host_order(i.imm).imm_data,
            }),
            ieth: e.ieth.as_ref().map(|i| ieth::Repr { rkey: i.rkey }),
            deth: e.deth.as_ref().map(|d| deth::Repr {
                qkey: d.qkey,
                src_qpn: d.src_qp,
            }),
        },
    }
}

#[test]
fn scapy_reference_vector_checksums_and_icrc() {
    // The acceptance vector of the issue: scapy's own RoCE test.
    let v = vectors()
        .into_iter()
        .find(|v| v.name == "scapy_uc_send_only_reference")
        .expect("reference vector present");
    assert_eq!(v.ip_checksum, 0xB4D5);
    assert_eq!(v.udp_checksum, 0xACA2);
    // scapy shows the ICRC field as 0x78F353F3: the wire bytes read big-endian.
    assert_eq!(hex(&v.icrc_wire), [0x78, 0xF3, 0x53, 0xF3]);
    let frame = hex(&v.frame);
    let p = packet::parse_frame(&frame).expect("reference frame parses and verifies");
    assert_eq!(u32::from_be_bytes([0x78, 0xF3, 0x53, 0xF3]), 0x78F3_53F3);
    assert_eq!(roce::icrc::to_wire(p.icrc), [0x78, 0xF3, 0x53, 0xF3]);
    assert_eq!(p.transport.bth.opcode, Opcode::UcSendOnly);
    assert_eq!(p.transport.bth.dest_qpn, 211);
    assert_eq!(p.transport.bth.psn, 13_571_856);
    assert_eq!(p.transport.bth.pad_cnt, 2);
    assert_eq!(p.payload.len(), 18);
}

#[test]
fn every_scapy_frame_parses_to_its_fields() {
    for v in vectors() {
        let frame = hex(&v.frame);
        let p = packet::parse_frame(&frame).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let want = transport_of(&v);
        assert_eq!(p.transport, want, "{}: transport headers", v.name);
        assert_eq!(p.payload, hex(&v.payload).as_slice(), "{}: payload", v.name);
        assert_eq!(
            roce::icrc::to_wire(p.icrc).as_slice(),
            hex(&v.icrc_wire).as_slice(),
            "{}: ICRC",
            v.name
        );
        assert_eq!(p.udp.src_port, v.udp_src_port, "{}", v.name);
        assert_eq!(p.udp.dst_port, 4791, "{}", v.name);
        match p.ip {
            packet::IpRepr::Ipv4(r) => {
                assert_eq!(v.ip_version, 4, "{}", v.name);
                assert_eq!(r.ident, v.ip_ident, "{}", v.name);
                assert_eq!((r.dscp << 2) | r.ecn.bits(), v.tos, "{}", v.name);
            }
            packet::IpRepr::Ipv6(r) => {
                assert_eq!(v.ip_version, 6, "{}", v.name);
                assert_eq!((r.dscp << 2) | r.ecn.bits(), v.tos, "{}", v.name);
            }
        }
    }
}

#[test]
fn builder_reproduces_every_scapy_frame_byte_for_byte() {
    for v in vectors() {
        let frame = hex(&v.frame);
        // Outer layers (MACs, addresses, TOS, TTL, ident, flow label) from the parsed frame; the
        // transport headers and payload from the generator's inputs.
        let parsed = packet::parse_frame(&frame).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let repr = PacketRepr {
            ip: parsed.ip,
            udp_src_port: v.udp_src_port,
            udp_checksum: v.udp_checksum != 0,
            transport: transport_of(&v),
        };
        let payload = hex(&v.payload);
        // Split the payload into uneven SGE-like pieces: the gather path must give the same bytes.
        let cut1 = payload.len() / 3;
        let cut2 = payload.len() - payload.len() / 5;
        let pieces = [&payload[..cut1], &payload[cut1..cut2], &payload[cut2..]];
        let mut out = vec![0xa5u8; 2048];
        let eth = parsed.ethernet.expect("frame has an Ethernet header");
        let len = packet::build_frame(&eth, &repr, &pieces, &mut out)
            .unwrap_or_else(|e| panic!("{}: build: {e}", v.name));
        assert_eq!(
            hex_of(&out[..len]),
            v.frame,
            "{}: built frame differs",
            v.name
        );

        let mut udp_payload = vec![0u8; 2048];
        let n = packet::build_udp_payload(&repr, &pieces, &mut udp_payload)
            .unwrap_or_else(|e| panic!("{}: build_udp_payload: {e}", v.name));
        let ip_start = eth.buffer_len();
        let udp_start = ip_start + repr.ip.header_len() + 8;
        assert_eq!(
            &udp_payload[..n],
            &frame[udp_start..],
            "{}: UDP payload",
            v.name
        );
    }
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn any_flipped_bit_after_the_udp_header_is_caught() {
    // A corrupted BTH, extended header, payload, pad or ICRC byte must never parse as valid: the ICRC
    // (and the UDP checksum where one is sent) covers all of them. The FECN/BECN/reserved byte of the
    // BTH is masked out of the ICRC by design (Annex A17.3.3), so it is caught only by a UDP checksum.
    for v in vectors() {
        let frame = hex(&v.frame);
        let ip_start = if frame[12] == 0x81 { 18 } else { 14 };
        let ip_len = if v.ip_version == 4 { 20 } else { 40 };
        let bth_start = ip_start + ip_len + 8;
        for at in bth_start..frame.len() {
            if at == bth_start + 4 && v.udp_checksum == 0 {
                continue;
            }
            for bit in [0x01u8, 0x80] {
                let mut bad = frame.clone();
                bad[at] ^= bit;
                assert!(
                    packet::parse_frame(&bad).is_err(),
                    "{}: flipping bit {bit:#04x} of byte {at} went unnoticed",
                    v.name
                );
            }
        }
    }
}

#[test]
fn masked_fields_do_not_change_the_icrc() {
    // TTL / hop limit and ECN change in flight (routers, ECN marking); the ICRC must not see them.
    for v in vectors() {
        let frame = hex(&v.frame);
        let mut parsed = packet::parse_frame(&frame).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        match &mut parsed.ip {
            packet::IpRepr::Ipv4(r) => {
                r.hop_limit = 3;
                r.ecn = roce::ipv4::Ecn::Ce;
            }
            packet::IpRepr::Ipv6(r) => {
                r.hop_limit = 3;
                r.ecn = roce::ipv4::Ecn::Ce;
                r.flow_label = 0xABCDE;
            }
        }
        let repr = PacketRepr {
            ip: parsed.ip,
            udp_src_port: v.udp_src_port,
            udp_checksum: v.udp_checksum != 0,
            transport: transport_of(&v),
        };
        let payload = hex(&v.payload);
        let mut out = vec![0u8; 2048];
        let eth = parsed.ethernet.expect("ethernet");
        let len = packet::build_frame(&eth, &repr, &[&payload], &mut out).expect("build");
        let re = packet::parse_frame(&out[..len]).expect("re-parse");
        assert_eq!(
            re.icrc, parsed.icrc,
            "{}: ICRC changed with masked fields",
            v.name
        );
        assert_eq!(re.ip.ecn(), roce::ipv4::Ecn::Ce);
    }
}
