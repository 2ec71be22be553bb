//! The network side of a packet: addresses, the IP header fields the ICRC covers, and sealing a
//! packet (pad and ICRC) once its headers and payload are in the transmit buffer.
//!
//! The engine builds only the UDP payload of a RoCEv2 packet (BTH .. ICRC, IBTA Annex A17.4);
//! the link writes the IP and UDP headers. The ICRC covers those headers too (with the fields a
//! router may change masked, Annex A17.3.3), so both sides must agree on them: senders built by
//! this engine use IPv4 identification 0 with Don't Fragment set, or IPv6 (whose flow label the
//! ICRC masks); [`Route`] carries every field a link needs to write them as the ICRC assumed.
//! rxe's `rxe_net.c` plays this part in Linux.

use core::net::IpAddr;

use roce::ipv4::{self, Ecn, IpProtocol};
use roce::packet::{icrc_of_udp_payload, IpRepr, TransportRepr};
use roce::{icrc, ipv6, udp, Gid};

/// The IPv4 identification this engine's packets carry (the ICRC covers it, so the link must
/// send exactly this value; RoCEv2 packets are never fragmented, so it is free to choose).
pub const IPV4_IDENT: u16 = 0;

/// Where one packet goes and how the link must write its IP and UDP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) src_ip: IpAddr,
    pub(crate) dst_ip: IpAddr,
    pub(crate) src_port: u16,
    pub(crate) dscp: u8,
    pub(crate) ecn: Ecn,
    pub(crate) hop_limit: u8,
    pub(crate) flow_label: u32,
}

/// The IP addresses a packet from `sgid` to `dgid` uses on RoCEv2: IPv4 when both GIDs are
/// IPv4-mapped (Annex A17.4.1), IPv6 otherwise (an IPv4-mapped GID then stays an IPv6 address).
pub(crate) fn ips_of(sgid: &Gid, dgid: &Gid) -> (IpAddr, IpAddr) {
    match (sgid.to_ip(), dgid.to_ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
        _ => (IpAddr::V6(sgid.to_ipv6()), IpAddr::V6(dgid.to_ipv6())),
    }
}

/// The IP header as the ICRC sees it, for a packet between `src` and `dst`; `None` when the two
/// addresses are of different families (no such packet exists). The payload length is filled in
/// by the ICRC routine.
pub(crate) fn ip_repr(
    src: IpAddr,
    dst: IpAddr,
    hop_limit: u8,
    dscp: u8,
    ecn: Ecn,
    ident: u16,
) -> Option<IpRepr> {
    match (src, dst) {
        (IpAddr::V4(src_addr), IpAddr::V4(dst_addr)) => Some(IpRepr::Ipv4(ipv4::Repr {
            src_addr,
            dst_addr,
            protocol: IpProtocol::Udp,
            payload_len: 0,
            hop_limit,
            dscp,
            ecn,
            ident,
            dont_frag: true,
        })),
        (IpAddr::V6(src_addr), IpAddr::V6(dst_addr)) => Some(IpRepr::Ipv6(ipv6::Repr {
            src_addr,
            dst_addr,
            next_header: IpProtocol::Udp,
            payload_len: 0,
            hop_limit,
            dscp,
            ecn,
            flow_label: 0,
        })),
        _ => None,
    }
}

/// Why a packet could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BuildError {
    /// The transmit buffer is shorter than the packet.
    BufferTooSmall,
    /// The headers could not be emitted or the ICRC computed (inconsistent headers, mixed
    /// address families): a bug or a misconfigured address, never a peer's doing.
    Headers,
}

/// Bytes of a packet with these headers and `payload_len` payload bytes: headers, payload, pad
/// to a multiple of 4 (IBTA vol. 1 §9.2 PadCnt), ICRC.
pub(crate) fn packet_len(transport: &TransportRepr, payload_len: usize) -> usize {
    transport.header_len()
        + payload_len
        + usize::from(roce::mtu::pad_cnt(payload_len))
        + icrc::ICRC_LEN
}

/// Checks that `buf` holds the packet, less the payload bytes that will not be in it (`payload_len -
/// in_buffer`: gathered from MR memory, module `tx`), and writes the BTH (PadCnt from `payload_len`)
/// and the extended headers at its start. Returns the header length: a payload in the buffer goes
/// right after.
pub(crate) fn write_headers(
    buf: &mut [u8],
    transport: &TransportRepr,
    payload_len: usize,
    in_buffer: usize,
) -> Result<usize, BuildError> {
    if buf.len() + payload_len.saturating_sub(in_buffer) < packet_len(transport, payload_len) {
        return Err(BuildError::BufferTooSmall);
    }
    let mut t = *transport;
    t.bth.pad_cnt = roce::mtu::pad_cnt(payload_len);
    t.emit(buf).map_err(|_| BuildError::Headers)
}

/// Writes the pad bytes and the ICRC after `header_len + payload_len` bytes already in `buf`;
/// returns the length of the UDP payload. The ICRC covers the IP and UDP headers `route`
/// implies (IPv4 identification [`IPV4_IDENT`], Don't Fragment).
pub(crate) fn seal(
    buf: &mut [u8],
    header_len: usize,
    payload_len: usize,
    route: &Route,
) -> Result<usize, BuildError> {
    let pad = usize::from(roce::mtu::pad_cnt(payload_len));
    let body = header_len + payload_len + pad;
    let total = body + icrc::ICRC_LEN;
    let packet = buf.get_mut(..total).ok_or(BuildError::BufferTooSmall)?;
    packet[header_len + payload_len..body].fill(0);
    let ip = ip_repr(
        route.src_ip,
        route.dst_ip,
        route.hop_limit,
        route.dscp,
        route.ecn,
        IPV4_IDENT,
    )
    .ok_or(BuildError::Headers)?;
    let udp = udp::Repr {
        src_port: route.src_port,
        dst_port: udp::ROCEV2_PORT,
        payload_len: total,
    };
    let crc = icrc_of_udp_payload(&ip, &udp, packet).map_err(|_| BuildError::Headers)?;
    packet[body..].copy_from_slice(&icrc::to_wire(crc));
    Ok(total)
}

/// The 40-byte GRH area a UD receive buffer starts with (IBTA vol. 1 §11.4.1.1 and Annex
/// A17.4.5.1): the received packet's IPv6 header, or for IPv4 20 zero bytes then the IPv4
/// header (as rxe and the kernel's `union rdma_network_hdr` lay it out).
pub(crate) fn grh_area(ip: &IpRepr, udp_len: usize) -> [u8; 40] {
    let mut area = [0u8; 40];
    match *ip {
        IpRepr::Ipv4(mut r) => {
            r.payload_len = udp_len.min(ipv4::MAX_PAYLOAD_LEN);
            r.protocol = IpProtocol::Udp;
            r.emit(&mut ipv4::Packet::new_unchecked(&mut area[20..]));
        }
        IpRepr::Ipv6(mut r) => {
            r.payload_len = udp_len.min(ipv6::MAX_PAYLOAD_LEN);
            r.next_header = IpProtocol::Udp;
            r.emit(&mut ipv6::Packet::new_unchecked(&mut area[..]));
        }
    }
    area
}
