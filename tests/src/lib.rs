//! Cross-crate integration and conformance tests. The tests live under `tests/tests/`; this library holds
//! the verbs conformance suite ([`conformance`], run by the `verbs-conformance` binary and
//! `tests/verbs_conformance.rs`) and what the tests and the `wire-demo` binary share: sample
//! packets of every opcode, and running `tshark` over a capture to read back what an independent
//! dissector (Wireshark's InfiniBand dissector) sees.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod conformance;

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use roce::packet::{self, ExtReprs, IpRepr, PacketRepr, TransportRepr};
use roce::pcap::PcapWriter;
use roce::{aeth, atomic_eth, bth, deth, ethernet, ieth, immdt, ipv4, ipv6, reth, Opcode};

/// One sample frame: what was put in, and the bytes built from it.
#[derive(Debug, Clone)]
pub struct SampleFrame {
    /// The opcode of the packet.
    pub opcode: Opcode,
    /// Destination QPN written into the BTH (24 bits).
    pub dest_qpn: u32,
    /// PSN written into the BTH (24 bits).
    pub psn: u32,
    /// Whether the packet is carried over IPv6 (else IPv4).
    pub ipv6: bool,
    /// Payload bytes (before pad).
    pub payload: Vec<u8>,
    /// The whole Ethernet frame (no FCS).
    pub frame: Vec<u8>,
}

/// The transport headers of a packet of `opcode`, with the extended headers the opcode requires filled
/// with recognisable values (IBTA vol. 1 §9.3). `None` for an opcode this stack does not know.
pub fn sample_transport(opcode: Opcode, dest_qpn: u32, psn: u32) -> Option<TransportRepr> {
    let flags = opcode.ext_headers();
    if !opcode.is_known() {
        return None;
    }
    use roce::opcode::ExtHeaders as H;
    let ext = ExtReprs {
        deth: flags.contains(H::DETH).then_some(deth::Repr {
            qkey: 0x1111_1111,
            src_qpn: 0x0000_0011,
        }),
        reth: flags.contains(H::RETH).then_some(reth::Repr {
            virtual_address: 0x7f00_1234_5000,
            rkey: 0x0001_2a05,
            dma_len: 4096,
        }),
        atomic_eth: flags
            .contains(H::ATOMIC_ETH)
            .then_some(atomic_eth::request::Repr {
                virtual_address: 0x5555_0000_1008,
                rkey: 0x317,
                swap_add_data: 1,
                compare_data: 0,
            }),
        aeth: flags.contains(H::AETH).then_some(aeth::Repr {
            syndrome: aeth::Syndrome::Ack {
                credit: aeth::AckCredit::INVALID,
            },
            msn: 7,
        }),
        atomic_ack_eth: flags
            .contains(H::ATOMIC_ACK_ETH)
            .then_some(atomic_eth::ack::Repr {
                orig_remote_data: 41,
            }),
        immdt: flags
            .contains(H::IMMDT)
            .then_some(immdt::Repr::from_host_order(0x1234_5678)),
        ieth: flags
            .contains(H::IETH)
            .then_some(ieth::Repr { rkey: 0x4c21 }),
    };
    let mut bth = bth::Repr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: opcode.is_request(),
        psn,
    };
    if opcode == Opcode::Cnp {
        bth = roce::cnp::Repr {
            dest_qpn,
            pkey: 0xFFFF,
        }
        .bth_repr();
    }
    Some(TransportRepr { bth, ext })
}

/// Builds one frame of every opcode the stack knows (`Opcode::ALL`), over IPv4 and over IPv6, between
/// two test hosts (10.0.0.1 -> 10.0.0.2; fe80::1 -> fe80::2). Payload sizes vary (1..=61 bytes, so PadCnt
/// takes all values); the CNP carries its 16 reserved bytes.
pub fn every_opcode_frames() -> Vec<SampleFrame> {
    let eth = ethernet::Repr {
        src_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x01]),
        dst_addr: ethernet::Address([0x02, 0, 0, 0, 0, 0x02]),
        vlan: None,
        ethertype: ethernet::EtherType::Ipv4,
    };
    let mut frames = Vec::new();
    for ipv6 in [false, true] {
        for (i, opcode) in Opcode::ALL.into_iter().enumerate() {
            let i = i as u32;
            let dest_qpn = 0x100 + i;
            // Start near the 24-bit wrap so PSNs on both sides of it appear.
            let psn = (0xFF_FFF0 + i * 3) & roce::Psn::MASK;
            let Some(transport) = sample_transport(opcode, dest_qpn, psn) else {
                continue;
            };
            let payload: Vec<u8> = if opcode == Opcode::Cnp {
                vec![0; roce::cnp::PAYLOAD_LEN]
            } else if opcode.has_payload() {
                (0..(1 + (i as usize * 5) % 61)).map(|b| b as u8).collect()
            } else {
                Vec::new()
            };
            let ip = if ipv6 {
                IpRepr::Ipv6(ipv6::Repr {
                    src_addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
                    dst_addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2),
                    next_header: ipv4::IpProtocol::Udp,
                    payload_len: 0,
                    hop_limit: 64,
                    dscp: 26,
                    ecn: ipv4::Ecn::Ect0,
                    flow_label: dest_qpn,
                })
            } else {
                IpRepr::Ipv4(ipv4::Repr {
                    src_addr: Ipv4Addr::new(10, 0, 0, 1),
                    dst_addr: Ipv4Addr::new(10, 0, 0, 2),
                    protocol: ipv4::IpProtocol::Udp,
                    payload_len: 0,
                    hop_limit: 64,
                    dscp: 26,
                    ecn: ipv4::Ecn::Ect0,
                    ident: 0,
                    dont_frag: true,
                })
            };
            let repr = PacketRepr {
                ip,
                udp_src_port: roce::udp::rocev2_src_port(dest_qpn),
                udp_checksum: !ipv6,
                transport,
            };
            let mut frame = vec![0u8; 18 + repr.ip_packet_len(payload.len())];
            let len = packet::build_frame(&eth, &repr, &[&payload], &mut frame)
                .unwrap_or_else(|e| panic!("building {opcode:?}: {e}"));
            frame.truncate(len);
            frames.push(SampleFrame {
                opcode,
                dest_qpn,
                psn: repr.transport.bth.psn,
                ipv6,
                payload,
                frame,
            });
        }
    }
    frames
}

/// Writes `frames` to a classic pcap file at `path` (Ethernet link type), 1 ms apart.
///
/// # Errors
/// Any I/O error creating or writing the file.
pub fn write_pcap<'a>(path: &Path, frames: impl IntoIterator<Item = &'a [u8]>) -> io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut writer = PcapWriter::new(io::BufWriter::new(file))?;
    for (i, frame) in frames.into_iter().enumerate() {
        writer.write_packet(Duration::from_millis(i as u64), frame)?;
    }
    writer.flush()?;
    Ok(())
}

/// What tshark dissected in one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dissection {
    /// BTH opcode tshark read.
    pub opcode: Option<u8>,
    /// BTH DestQP tshark read.
    pub dest_qpn: Option<u32>,
    /// BTH PSN tshark read.
    pub psn: Option<u32>,
    /// The protocol stack tshark saw (`frame.protocols`, e.g. `eth:ethertype:ip:udp:infiniband`).
    pub protocols: String,
    /// Whether tshark marked the frame malformed.
    pub malformed: bool,
}

/// The tshark binary to use: `$TSHARK`, else `tshark` on `PATH`; `None` when neither runs.
pub fn tshark() -> Option<String> {
    let bin = std::env::var("TSHARK").unwrap_or_else(|_| "tshark".to_string());
    Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| bin)
}

fn parse_num(field: &str) -> Option<u32> {
    let field = field.trim();
    if let Some(hex) = field.strip_prefix("0x") {
        u32::from_str_radix(hex, 16).ok()
    } else {
        field.parse().ok()
    }
}

/// Runs tshark over the pcap at `path` and returns one [`Dissection`] per frame, in order.
///
/// # Errors
/// When tshark cannot be started or exits with an error (its stderr is in the message).
pub fn dissect(tshark: &str, path: &Path) -> io::Result<Vec<Dissection>> {
    let out = Command::new(tshark)
        // The payload is opaque test data; keep the RPC-over-RDMA heuristic from reading it as RPC.
        .args(["-n", "--disable-protocol", "rpcordma", "-r"])
        .arg(path)
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"])
        .args(["-e", "infiniband.bth.opcode"])
        .args(["-e", "infiniband.bth.destqp"])
        .args(["-e", "infiniband.bth.psn"])
        .args(["-e", "frame.protocols"])
        .args(["-e", "_ws.malformed"])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tshark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let get = |i: usize| f.get(i).copied().unwrap_or("");
            Dissection {
                opcode: parse_num(get(0)).and_then(|v| u8::try_from(v).ok()),
                dest_qpn: parse_num(get(1)),
                psn: parse_num(get(2)),
                protocols: get(3).to_string(),
                malformed: !get(4).trim().is_empty() || get(3).contains("_ws.malformed"),
            }
        })
        .collect())
}

/// Runs tshark over the pcap at `path` and returns, per frame, the values of `fields` (tshark `-e`
/// names, first occurrence of each, as text; empty when absent), in order.
///
/// # Errors
/// When tshark cannot be started or exits with an error (its stderr is in the message).
pub fn dissect_fields(tshark: &str, path: &Path, fields: &[&str]) -> io::Result<Vec<Vec<String>>> {
    let mut cmd = Command::new(tshark);
    cmd.args(["-n", "--disable-protocol", "rpcordma", "-r"])
        .arg(path)
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tshark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let mut v: Vec<String> = line.split('|').map(str::to_string).collect();
            v.resize(fields.len(), String::new());
            v
        })
        .collect())
}

/// Parses a number as tshark prints it: decimal, or hexadecimal with a `0x` prefix.
pub fn tshark_num(field: &str) -> Option<u64> {
    let field = field.trim();
    match field.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => field.parse().ok(),
    }
}
