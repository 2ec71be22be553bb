//! The scapy frames of `tests/data/rocev2_vectors.json` (every opcode over IPv4 and IPv6, built by an
//! independent implementation; they also seed the `parse_frame` fuzz corpus, see
//! `roce/fuzz/seed_corpus.sh`), used as the starting points of exhaustive small mutations:
//!
//! * each frame parses, and what it parses to rebuilds into the very same bytes;
//! * every single-bit change, every truncation and a few extensions of each frame go through every
//!   parser and the fuzz oracle ([`roce::packet::fuzz_entry`]) without a panic;
//! * a single-bit change either fails to parse or changes exactly the one field that holds the bit,
//!   and only where no check covers that bit (Ethernet addresses, UDP checksum to "none", IPv6 traffic
//!   class, flow label and hop limit, BTH FECN/BECN/reserved bits when the UDP checksum is zero).

use roce::ethernet;
use roce::packet::{self, PacketRepr, ParsedPacket};
use roce::{icrc, udp, IpRepr};

/// Every `"frame": "<hex>"` value of the vectors file, with its `"name"`.
fn scapy_frames() -> Vec<(String, Vec<u8>)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/rocev2_vectors.json"
    );
    let text = std::fs::read_to_string(path).expect("tests/data/rocev2_vectors.json");
    let mut frames = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let line = line.trim().trim_end_matches(',');
        if let Some(value) = line.strip_prefix("\"name\": ") {
            name = value.trim_matches('"').to_string();
        }
        if let Some(value) = line.strip_prefix("\"frame\": ") {
            let hex = value.trim_matches('"');
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            frames.push((name.clone(), bytes));
        }
    }
    assert!(frames.len() >= 77, "found {} frames", frames.len());
    frames
}

fn feed_all(data: &[u8]) {
    packet::fuzz_entry(data);
    let _ = packet::parse_frame(data);
    let _ = packet::parse_ip_packet(data);
    let _ = packet::parse_udp_payload(data);
}

/// Offset of the UDP checksum of a parsed frame without IPv4 options.
fn udp_checksum_at(p: &ParsedPacket<'_>) -> usize {
    p.ethernet.map_or(0, |e| e.buffer_len()) + p.ip.header_len() + 6
}

/// Builds the frame that `p` describes, with the UDP checksum computed when `udp_checksum`.
fn rebuild(p: &ParsedPacket<'_>, udp_checksum: bool) -> Vec<u8> {
    let packet = PacketRepr {
        ip: p.ip,
        udp_src_port: p.udp.src_port,
        udp_checksum,
        transport: p.transport,
    };
    let mut out = vec![0u8; 9216];
    let len = packet::build_frame(&p.ethernet.unwrap(), &packet, &[p.payload], &mut out)
        .expect("a parsed packet rebuilds");
    out.truncate(len);
    out
}

#[test]
fn scapy_frames_rebuild_byte_for_byte() {
    for (name, frame) in scapy_frames() {
        let p = packet::parse_frame(&frame).unwrap_or_else(|e| panic!("{name}: {e}"));
        let at = udp_checksum_at(&p);
        let udp_checksum = frame[at..at + 2] != [0, 0];
        assert_eq!(rebuild(&p, udp_checksum), frame, "{name}");
        packet::fuzz_entry(&frame);
    }
}

#[test]
fn scapy_frames_truncated_and_extended() {
    for (name, frame) in scapy_frames() {
        let whole = packet::parse_frame(&frame).unwrap();
        for len in 0..frame.len() {
            feed_all(&frame[..len]);
            assert!(
                packet::parse_frame(&frame[..len]).is_err(),
                "{name} cut to {len} bytes parses"
            );
        }
        // Ethernet padding is ignored; anything else appended is too (the IP length rules).
        for extra in [1usize, 3, 4, 60] {
            let mut longer = frame.clone();
            longer.extend(std::iter::repeat_n(0xa5, extra));
            feed_all(&longer);
            assert_eq!(packet::parse_frame(&longer), Ok(whole), "{name} + {extra}");
        }
    }
}

#[test]
fn scapy_frames_every_bit_flipped() {
    let (mut flips, mut parsed) = (0usize, 0usize);
    for (name, frame) in scapy_frames() {
        let whole = packet::parse_frame(&frame).unwrap();
        let eth_len = whole.ethernet.unwrap().buffer_len();
        let ip_len = whole.ip.header_len();
        let udp_checksum = udp_checksum_at(&whole);
        let bth = eth_len + ip_len + udp::HEADER_LEN;
        let v6 = matches!(whole.ip, IpRepr::Ipv6(_));
        let udp_checksum_zero = frame[udp_checksum..udp_checksum + 2] == [0, 0];
        for at in 0..frame.len() {
            for bit in 0..8 {
                let mut m = frame.clone();
                m[at] ^= 1 << bit;
                feed_all(&m);
                flips += 1;
                let Ok(p) = packet::parse_frame(&m) else {
                    continue;
                };
                parsed += 1;
                // Where a flipped bit may go unnoticed, and what must then differ.
                let ethernet_bit = at < eth_len && at != 12 && at != 13;
                let udp_checksum_bit = (udp_checksum..udp_checksum + 2).contains(&at);
                // Traffic class, flow label, hop limit: in neither the ICRC nor the UDP
                // pseudo-header.
                let masked_ipv6_bit = v6
                    && (at == eth_len && bit < 4
                        || (eth_len + 1..eth_len + 4).contains(&at)
                        || at == eth_len + 7);
                let bth_ecn_bit = at == bth + 4 && udp_checksum_zero;
                assert!(
                    ethernet_bit || udp_checksum_bit || masked_ipv6_bit || bth_ecn_bit,
                    "{name}: bit {bit} of byte {at} flipped and the frame still parses: {p:?}"
                );
                assert_eq!(p.payload, whole.payload, "{name} byte {at}");
                if udp_checksum_bit {
                    // Only "checksum present" -> "none" can pass.
                    assert_eq!(m[udp_checksum..udp_checksum + 2], [0, 0]);
                    assert_eq!(p, whole);
                    continue;
                }
                // The rebuilt frame is the mutated frame, bit for bit (reserved BTH bits aside).
                let mut rebuilt = rebuild(&p, !udp_checksum_zero);
                if bth_ecn_bit {
                    rebuilt[bth + 4] |= m[bth + 4] & 0x3f;
                }
                assert_eq!(rebuilt, m, "{name}: bit {bit} of byte {at}");
                assert_eq!(
                    p.icrc,
                    icrc::from_wire(m[m.len() - 4..].try_into().unwrap())
                );
            }
        }
    }
    // Ethernet addresses (96 bits a frame) and more do parse; most flips do not.
    assert!(
        parsed > 96 * 77 && parsed < flips / 4,
        "{parsed} of {flips}"
    );
}

#[test]
fn ethernet_header_changes_parse_to_the_new_header() {
    let (_, frame) = scapy_frames().swap_remove(0);
    let mut m = frame.clone();
    m[..12].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    let p = packet::parse_frame(&m).unwrap();
    let e = p.ethernet.unwrap();
    assert_eq!(e.dst_addr, ethernet::Address([1, 2, 3, 4, 5, 6]));
    assert_eq!(e.src_addr, ethernet::Address([7, 8, 9, 10, 11, 12]));
    assert_eq!(e.vlan, None);
}
