//! Packets crafted by hand, as a lying peer would send them: any opcode, PSN and extended headers
//! with a valid ICRC, so that the receiving engine must judge their content.

use std::net::IpAddr;

use roce::aeth::{AckCredit, NakCode, Syndrome};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{aeth, atomic_eth, bth, reth, Opcode};

use super::{transmit, Peer, Pkt};

/// The link metadata of a packet from `from` to `to`.
pub fn tx_between(from: &Peer, to: &Peer) -> hca::Transmit {
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
pub fn try_build(tx: hca::Transmit, transport: TransportRepr, payload: &[u8]) -> Option<Pkt> {
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
pub fn craft(
    from: &Peer,
    to: &Peer,
    opcode: Opcode,
    psn: u32,
    ext: ExtReprs,
    payload: &[u8],
) -> Pkt {
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

/// A RETH (RDMA WRITE / READ request).
pub fn reth_ext(va: u64, rkey: u32, dma_len: u32) -> ExtReprs {
    ExtReprs {
        reth: Some(reth::Repr {
            virtual_address: va,
            rkey,
            dma_len,
        }),
        ..ExtReprs::default()
    }
}

/// An AETH with `syndrome` and MSN 1.
pub fn aeth_ext(syndrome: Syndrome) -> ExtReprs {
    ExtReprs {
        aeth: Some(aeth::Repr { syndrome, msn: 1 }),
        ..ExtReprs::default()
    }
}

/// The syndrome of a plain ACK (no credits).
pub fn ack() -> Syndrome {
    Syndrome::Ack {
        credit: AckCredit::INVALID,
    }
}

/// An AtomicETH adding 1 (or swapping in 1 where the word is 0).
pub fn atomic_ext(va: u64, rkey: u32) -> ExtReprs {
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
pub fn answers(
    f: &mut hca::fabric::Fabric,
    p: &Peer,
    now: hca::Instant,
) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    transmit(f, p, now)
        .iter()
        .map(|k| (k.opcode(), k.psn(), k.aeth().map(|a| a.syndrome)))
        .collect()
}

/// The AETH syndrome of a NAK with `code`, as `answers` reports it.
pub fn nak(code: NakCode) -> Option<Syndrome> {
    Some(Syndrome::Nak(code))
}

/// The path MTU of `Opts::default()`, bytes.
pub const PMTU: usize = 1024;

/// The PSN B expects first from A (`Opts::default().a_psn`).
pub const A_PSN: u32 = 100;
