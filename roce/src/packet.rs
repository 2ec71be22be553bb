//! Whole RoCEv2 packets: one call builds a frame, one call parses one.
//!
//! A RoCEv2 packet (IBTA vol. 1 release 1.2.1 Annex A17.4, "RoCEv2 packet format") is
//!
//! ```text
//! | Ethernet (+802.1Q) | IPv4 or IPv6 | UDP (dport 4791) | BTH | ext. headers | payload | pad | ICRC |
//! ```
//!
//! The links that carry packets differ in how much of that they write themselves, so both directions come
//! in three depths:
//!
//! | link                         | builds with                      | parses with            |
//! |------------------------------|----------------------------------|------------------------|
//! | NIC queues (VFIO), test pcap | [`build_frame`], [`emit_headers`] | [`parse_frame`]        |
//! | raw IP                       | [`build_ip_packet`]              | [`parse_ip_packet`]    |
//! | kernel UDP socket            | [`build_udp_payload`]            | [`parse_udp_payload`]  |
//!
//! The payload is always given as a list of slices, so that a sender can gather it straight from memory
//! regions; [`emit_headers`] writes only the headers and returns the pad-and-ICRC [`Trailer`], for links
//! that send `headers, payload slices..., trailer` as one scatter/gather list with no copy at all.
//!
//! Checks on parse, in this order (a failure returns the first error found and never panics): Ethernet
//! length and EtherType; IP version, lengths and (IPv4) header checksum, no fragments; UDP length, port
//! 4791 and checksum (a zero UDP checksum means "not computed" and is accepted on IPv4 and IPv6, as Linux
//! rxe sends zero over IPv6); BTH TVer and opcode; extended header lengths; PadCnt (IBTA §9.2: the pad
//! makes the payload a multiple of 4 bytes); and the ICRC (IBTA §7.8.1, Annex A17.3.3).

use core::net::IpAddr;

use crate::ethernet::{self, EtherType};
use crate::ipv4::{self, Ecn, IpProtocol};
use crate::opcode::ExtHeaders;
use crate::{aeth, atomic_eth, bth, deth, icrc, ieth, immdt, ipv6, mtu, reth, udp};
use crate::{Error, Layer, Result};

/// Length of the largest set of extended headers any opcode carries (AtomicETH, 28 bytes).
pub const MAX_EXT_HEADERS_LEN: usize = 28;

/// Length of the longest header stack [`emit_headers`] writes: Ethernet with 802.1Q tag (18), IPv6 (40),
/// UDP (8), BTH (12) and the largest extended headers (28), in bytes.
pub const MAX_HEADERS_LEN: usize = ethernet::VLAN_HEADER_LEN
    + ipv6::HEADER_LEN
    + udp::HEADER_LEN
    + bth::HEADER_LEN
    + MAX_EXT_HEADERS_LEN;

/// The extended transport headers of one packet (IBTA vol. 1 §9.3). Exactly those that the BTH opcode
/// flags in its [`Opcode::ext_headers`] must be present; [`TransportRepr::emit`] checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtReprs {
    /// DETH: Q_Key and source QPN (UD).
    pub deth: Option<deth::Repr>,
    /// RETH: remote address, R_Key and DMA length (RDMA WRITE FIRST/ONLY, RDMA READ REQUEST).
    pub reth: Option<reth::Repr>,
    /// AtomicETH: remote address, R_Key, swap/add and compare operands (COMPARE SWAP, FETCH ADD).
    pub atomic_eth: Option<atomic_eth::request::Repr>,
    /// AETH: ACK/NAK syndrome and MSN (ACKNOWLEDGE, READ RESPONSE FIRST/LAST/ONLY, ATOMIC ACKNOWLEDGE).
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH: the original remote data (ATOMIC ACKNOWLEDGE).
    pub atomic_ack_eth: Option<atomic_eth::ack::Repr>,
    /// ImmDt: immediate data (the `*_WITH_IMMEDIATE` opcodes).
    pub immdt: Option<immdt::Repr>,
    /// IETH: the R_Key to invalidate (SEND LAST/ONLY WITH INVALIDATE).
    pub ieth: Option<ieth::Repr>,
}

impl ExtReprs {
    /// The set of headers present.
    pub const fn present(&self) -> ExtHeaders {
        let mut set = ExtHeaders::empty();
        if self.deth.is_some() {
            set = set.union(ExtHeaders::DETH);
        }
        if self.reth.is_some() {
            set = set.union(ExtHeaders::RETH);
        }
        if self.atomic_eth.is_some() {
            set = set.union(ExtHeaders::ATOMIC_ETH);
        }
        if self.aeth.is_some() {
            set = set.union(ExtHeaders::AETH);
        }
        if self.atomic_ack_eth.is_some() {
            set = set.union(ExtHeaders::ATOMIC_ACK_ETH);
        }
        if self.immdt.is_some() {
            set = set.union(ExtHeaders::IMMDT);
        }
        if self.ieth.is_some() {
            set = set.union(ExtHeaders::IETH);
        }
        set
    }
}

/// The InfiniBand transport part of a packet: the BTH and its extended headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportRepr {
    /// Base Transport Header. On build, `pad_cnt` is ignored and set from the payload length.
    pub bth: bth::Repr,
    /// Extended transport headers, as the opcode requires.
    pub ext: ExtReprs,
}

impl TransportRepr {
    /// Length in bytes of the BTH plus the extended headers the opcode carries (12..=40); for an unknown
    /// opcode, the BTH alone.
    pub const fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.bth.opcode.ext_headers_len()
    }

    /// Checks that the opcode is known and that exactly its extended headers are present.
    ///
    /// # Errors
    /// [`Error::UnknownOpcode`]; [`Error::Malformed`] (layer `Bth`) when the extended headers present
    /// differ from the opcode's (IBTA vol. 1 §9.3).
    pub fn check(&self) -> Result<()> {
        let Some(info) = self.bth.opcode.info() else {
            return Err(Error::UnknownOpcode(u8::from(self.bth.opcode)));
        };
        if info.ext_headers != self.ext.present() {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                what: "extended headers present differ from those the opcode carries",
            });
        }
        Ok(())
    }

    /// Writes the BTH and the extended headers into the front of `buf`; returns the bytes written
    /// ([`TransportRepr::header_len`]).
    ///
    /// # Errors
    /// As [`TransportRepr::check`]; [`Error::BufferTooSmall`] when `buf` is shorter than the headers.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        let len = self.header_len();
        let got = buf.len();
        let Some(buf) = buf.get_mut(..len) else {
            return Err(Error::BufferTooSmall { need: len, got });
        };
        let (bth_buf, ext_buf) = buf.split_at_mut(bth::HEADER_LEN);
        self.bth.emit(&mut bth::Packet::new_unchecked(bth_buf));
        // `check` guarantees the opcode is known, so it has offsets; every header below is present
        // exactly when its offset is.
        let offsets = self
            .bth
            .opcode
            .ext_offsets()
            .ok_or(Error::UnknownOpcode(u8::from(self.bth.opcode)))?;
        let ext = &self.ext;
        if let (Some(at), Some(repr)) = (offsets.deth, ext.deth) {
            repr.emit(&mut deth::Packet::new_unchecked(&mut ext_buf[at..]));
        }
        if let (Some(at), Some(repr)) = (offsets.reth, ext.reth) {
            repr.emit(&mut reth::Packet::new_unchecked(&mut ext_buf[at..]));
        }
        if let (Some(at), Some(repr)) = (offsets.atomic_eth, ext.atomic_eth) {
            repr.emit(&mut atomic_eth::request::Packet::new_unchecked(
                &mut ext_buf[at..],
            ));
        }
        if let (Some(at), Some(repr)) = (offsets.aeth, ext.aeth) {
            repr.emit(&mut aeth::Packet::new_unchecked(&mut ext_buf[at..]));
        }
        if let (Some(at), Some(repr)) = (offsets.atomic_ack_eth, ext.atomic_ack_eth) {
            repr.emit(&mut atomic_eth::ack::Packet::new_unchecked(
                &mut ext_buf[at..],
            ));
        }
        if let (Some(at), Some(repr)) = (offsets.immdt, ext.immdt) {
            repr.emit(&mut immdt::Packet::new_unchecked(&mut ext_buf[at..]));
        }
        if let (Some(at), Some(repr)) = (offsets.ieth, ext.ieth) {
            repr.emit(&mut ieth::Packet::new_unchecked(&mut ext_buf[at..]));
        }
        Ok(len)
    }

    /// Parses the BTH and the extended headers its opcode carries from the front of `buf`; returns them
    /// and the number of header bytes read. Never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Bth` or the extended header that does not fit);
    /// [`Error::BadVersion`] when TVer != 0; [`Error::UnknownOpcode`].
    pub fn parse(buf: &[u8]) -> Result<(TransportRepr, usize)> {
        let bth_packet = bth::Packet::new_checked(buf)?;
        let bth = bth::Repr::parse(&bth_packet)?;
        let offsets = bth
            .opcode
            .ext_offsets()
            .ok_or(Error::UnknownOpcode(u8::from(bth.opcode)))?;
        let ext_buf = &buf[bth::HEADER_LEN..];
        let mut ext = ExtReprs::default();
        if let Some(at) = offsets.deth {
            let p = deth::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.deth = Some(deth::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.reth {
            let p = reth::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.reth = Some(reth::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.atomic_eth {
            let p =
                atomic_eth::request::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.atomic_eth = Some(atomic_eth::request::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.aeth {
            let p = aeth::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.aeth = Some(aeth::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.atomic_ack_eth {
            let p = atomic_eth::ack::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.atomic_ack_eth = Some(atomic_eth::ack::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.immdt {
            let p = immdt::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.immdt = Some(immdt::Repr::parse(&p)?);
        }
        if let Some(at) = offsets.ieth {
            let p = ieth::Packet::new_checked(ext_buf.get(at..).unwrap_or_default())?;
            ext.ieth = Some(ieth::Repr::parse(&p)?);
        }
        Ok((
            TransportRepr { bth, ext },
            bth::HEADER_LEN + offsets.payload,
        ))
    }
}

/// The network-layer header of a RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4 (RFC 791). On build, `protocol` and `payload_len` are set by the builder.
    Ipv4(ipv4::Repr),
    /// IPv6 (RFC 8200). On build, `next_header` and `payload_len` are set by the builder.
    Ipv6(ipv6::Repr),
}

impl IpRepr {
    /// Header length in bytes (20 or 40).
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(_) => ipv4::HEADER_LEN,
            IpRepr::Ipv6(_) => ipv6::HEADER_LEN,
        }
    }

    /// Source address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => IpAddr::V4(r.src_addr),
            IpRepr::Ipv6(r) => IpAddr::V6(r.src_addr),
        }
    }

    /// Destination address.
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => IpAddr::V4(r.dst_addr),
            IpRepr::Ipv6(r) => IpAddr::V6(r.dst_addr),
        }
    }

    /// ECN codepoint (RFC 3168); CE asks the receiver to send a CNP (IBTA Annex A17.9).
    pub const fn ecn(&self) -> Ecn {
        match self {
            IpRepr::Ipv4(r) => r.ecn,
            IpRepr::Ipv6(r) => r.ecn,
        }
    }

    /// Payload length in bytes (what follows the IP header).
    pub const fn payload_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(r) => r.payload_len,
            IpRepr::Ipv6(r) => r.payload_len,
        }
    }

    const fn ethertype(&self) -> EtherType {
        match self {
            IpRepr::Ipv4(_) => EtherType::Ipv4,
            IpRepr::Ipv6(_) => EtherType::Ipv6,
        }
    }

    /// Writes the header for a UDP payload of `udp_len` bytes into `buf` (exactly the header length).
    fn emit_udp(&self, udp_len: usize, buf: &mut [u8]) {
        match *self {
            IpRepr::Ipv4(mut r) => {
                r.protocol = IpProtocol::Udp;
                r.payload_len = udp_len;
                r.emit(&mut ipv4::Packet::new_unchecked(buf));
            }
            IpRepr::Ipv6(mut r) => {
                r.next_header = IpProtocol::Udp;
                r.payload_len = udp_len;
                r.emit(&mut ipv6::Packet::new_unchecked(buf));
            }
        }
    }

    const fn max_payload_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(_) => ipv4::MAX_PAYLOAD_LEN,
            IpRepr::Ipv6(_) => ipv6::MAX_PAYLOAD_LEN,
        }
    }

    fn udp_checksum_mode(&self, compute: bool) -> udp::ChecksumMode {
        match (compute, self) {
            (false, _) => udp::ChecksumMode::Zero,
            (true, IpRepr::Ipv4(r)) => udp::ChecksumMode::ComputeV4 {
                src_addr: r.src_addr,
                dst_addr: r.dst_addr,
            },
            (true, IpRepr::Ipv6(r)) => udp::ChecksumMode::ComputeV6 {
                src_addr: r.src_addr,
                dst_addr: r.dst_addr,
            },
        }
    }
}

/// Everything above the link layer of one RoCEv2 packet except the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr {
    /// IP header. Its length and protocol fields are filled in by the builder.
    pub ip: IpRepr,
    /// UDP source port: flow entropy for ECMP, see [`udp::rocev2_src_port`]. The destination port is
    /// always 4791.
    pub udp_src_port: u16,
    /// Whether the builder computes the UDP checksum (`false` sends zero, as Linux rxe does).
    pub udp_checksum: bool,
    /// BTH and extended headers.
    pub transport: TransportRepr,
}

impl PacketRepr {
    /// Bytes from the IP header to the end of the extended headers.
    pub const fn headers_len(&self) -> usize {
        self.ip.header_len() + udp::HEADER_LEN + self.transport.header_len()
    }

    /// Length in bytes of the IP packet that carries `payload_len` bytes of payload: headers, payload,
    /// pad to a 4-byte multiple, ICRC.
    pub const fn ip_packet_len(&self, payload_len: usize) -> usize {
        self.headers_len() + payload_len + mtu::pad_cnt(payload_len) as usize + icrc::ICRC_LEN
    }
}

/// The bytes that follow the payload on the wire: 0..=3 zero pad bytes, then the 4-byte ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    bytes: [u8; 7],
    len: u8,
}

impl Trailer {
    /// The pad and ICRC bytes, 4..=7 of them, in wire order.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The ICRC value (a CRC-32; little-endian on the wire).
    pub fn icrc(&self) -> u32 {
        let at = usize::from(self.len) - icrc::ICRC_LEN;
        icrc::from_wire([
            self.bytes[at],
            self.bytes[at + 1],
            self.bytes[at + 2],
            self.bytes[at + 3],
        ])
    }
}

fn payload_len_of(payload: &[&[u8]]) -> usize {
    payload.iter().map(|s| s.len()).sum()
}

/// Writes the headers of a packet into `out`: the Ethernet header when `ethernet` is given (its
/// EtherType is set from the IP version), IP, UDP, BTH (with PadCnt from the payload length) and the
/// extended headers. Computes the ICRC over headers, `payload` and pad, and the UDP checksum when asked,
/// so that `out[..written]`, the payload slices and the returned [`Trailer`] are the whole packet.
/// Returns the header bytes written and the trailer. The payload is read, never copied.
///
/// # Errors
/// As [`TransportRepr::check`]; [`Error::Malformed`] (layer `Payload`) for a payload on an opcode that
/// carries none; [`Error::BadLength`] (layer `Ipv4`/`Ipv6`) when the packet exceeds the IP length field;
/// [`Error::BufferTooSmall`] when `out` is shorter than the headers.
pub fn emit_headers(
    ethernet: Option<&ethernet::Repr>,
    packet: &PacketRepr,
    payload: &[&[u8]],
    out: &mut [u8],
) -> Result<(usize, Trailer)> {
    packet.transport.check()?;
    let payload_len = payload_len_of(payload);
    if payload_len != 0 && !packet.transport.bth.opcode.has_payload() {
        return Err(Error::Malformed {
            layer: Layer::Payload,
            what: "payload given for an opcode that carries none",
        });
    }
    let pad = mtu::pad_cnt(payload_len);
    let eth_len = ethernet.map_or(0, |e| e.buffer_len());
    let ip_len = packet.ip.header_len();
    let transport_len = packet.transport.header_len();
    let udp_len = udp::HEADER_LEN + transport_len + payload_len + usize::from(pad) + icrc::ICRC_LEN;
    if udp_len > packet.ip.max_payload_len() {
        let layer = match packet.ip {
            IpRepr::Ipv4(_) => Layer::Ipv4,
            IpRepr::Ipv6(_) => Layer::Ipv6,
        };
        return Err(Error::BadLength(layer));
    }
    let need = eth_len + ip_len + udp::HEADER_LEN + transport_len;
    let got = out.len();
    let Some(out) = out.get_mut(..need) else {
        return Err(Error::BufferTooSmall { need, got });
    };

    let (eth_buf, rest) = out.split_at_mut(eth_len);
    if let Some(eth) = ethernet {
        let mut eth = *eth;
        eth.ethertype = packet.ip.ethertype();
        eth.emit(&mut ethernet::Frame::new_unchecked(eth_buf));
    }
    let (ip_buf, rest) = rest.split_at_mut(ip_len);
    packet.ip.emit_udp(udp_len, ip_buf);
    let (udp_buf, transport_buf) = rest.split_at_mut(udp::HEADER_LEN);
    let mut transport = packet.transport;
    transport.bth.pad_cnt = pad;
    transport.emit(transport_buf)?;
    let udp_repr = udp::Repr {
        src_port: packet.udp_src_port,
        dst_port: udp::ROCEV2_PORT,
        payload_len: udp_len - udp::HEADER_LEN,
    };
    // The checksum is filled in below, once the ICRC it covers is known.
    udp_repr.emit(
        &mut udp::Packet::new_unchecked(&mut *udp_buf),
        udp::ChecksumMode::Zero,
    );

    let mut trailer = Trailer {
        bytes: [0; 7],
        len: pad + icrc::ICRC_LEN as u8,
    };
    let pad_bytes = [0u8; 3];
    let pad_slice = &pad_bytes[..usize::from(pad)];
    let icrc = {
        // ICRC input: IP header .. extended headers, payload, pad (Annex A17.3.3).
        let mut hasher = icrc::Hasher::new(ip_buf, udp_buf, transport_buf)?;
        for slice in payload {
            hasher.update(slice);
        }
        hasher.update(pad_slice);
        hasher.finalize()
    };
    trailer.bytes[usize::from(pad)..usize::from(trailer.len)].copy_from_slice(&icrc::to_wire(icrc));

    if let Some(pseudo) = packet
        .ip
        .udp_checksum_mode(packet.udp_checksum)
        .pseudo_header_sum(udp_len as u16)
    {
        let mut acc = crate::checksum::Accumulator::new();
        acc.add_sum(pseudo);
        acc.add(&udp_buf[..6]);
        acc.add(transport_buf);
        for slice in payload {
            acc.add(slice);
        }
        acc.add(trailer.as_bytes());
        let checksum = udp::wire_checksum(acc.sum());
        udp::Packet::new_unchecked(&mut *udp_buf).set_checksum(checksum);
    }
    Ok((need, trailer))
}

fn copy_out(
    headers_len: usize,
    trailer: &Trailer,
    payload: &[&[u8]],
    out: &mut [u8],
) -> Result<usize> {
    let total = headers_len + payload_len_of(payload) + trailer.as_bytes().len();
    let got = out.len();
    let Some(out) = out.get_mut(..total) else {
        return Err(Error::BufferTooSmall { need: total, got });
    };
    let mut at = headers_len;
    for slice in payload {
        out[at..at + slice.len()].copy_from_slice(slice);
        at += slice.len();
    }
    out[at..].copy_from_slice(trailer.as_bytes());
    Ok(total)
}

/// Builds a whole Ethernet frame (without FCS) into `out` and returns its length in bytes: Ethernet,
/// IP, UDP, BTH, extended headers, the payload gathered from `payload`, pad and ICRC.
///
/// # Errors
/// As [`emit_headers`]; [`Error::BufferTooSmall`] when `out` cannot hold the frame.
pub fn build_frame(
    ethernet: &ethernet::Repr,
    packet: &PacketRepr,
    payload: &[&[u8]],
    out: &mut [u8],
) -> Result<usize> {
    let (len, trailer) = emit_headers(Some(ethernet), packet, payload, out)?;
    copy_out(len, &trailer, payload, out)
}

/// Builds an IP packet (IP header through ICRC) into `out` and returns its length in bytes.
///
/// # Errors
/// As [`build_frame`].
pub fn build_ip_packet(packet: &PacketRepr, payload: &[&[u8]], out: &mut [u8]) -> Result<usize> {
    let (len, trailer) = emit_headers(None, packet, payload, out)?;
    copy_out(len, &trailer, payload, out)
}

/// Builds the UDP payload of a packet (BTH through ICRC) into `out`, for links where the kernel writes
/// the IP and UDP headers, and returns its length in bytes. The ICRC covers the IP and UDP headers, so
/// `packet.ip` and `packet.udp_src_port` must be what the kernel will put on the wire (the masked
/// fields, TOS/traffic class, TTL/hop limit, flow label and checksums, do not matter).
///
/// # Errors
/// As [`build_frame`].
pub fn build_udp_payload(packet: &PacketRepr, payload: &[&[u8]], out: &mut [u8]) -> Result<usize> {
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let (len, trailer) = emit_headers(None, packet, payload, &mut headers)?;
    let skip = packet.ip.header_len() + udp::HEADER_LEN;
    let transport_len = len - skip;
    let got = out.len();
    let total = transport_len + payload_len_of(payload) + trailer.as_bytes().len();
    let Some(dst) = out.get_mut(..transport_len) else {
        return Err(Error::BufferTooSmall { need: total, got });
    };
    dst.copy_from_slice(&headers[skip..len]);
    copy_out(transport_len, &trailer, payload, out)
}

/// A parsed RoCEv2 packet, borrowing its payload from the received buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// Ethernet header, when parsed from a frame.
    pub ethernet: Option<ethernet::Repr>,
    /// IP header (carries the ECN codepoint).
    pub ip: IpRepr,
    /// UDP header.
    pub udp: udp::Repr,
    /// BTH and extended headers.
    pub transport: TransportRepr,
    /// The payload without pad bytes (empty for opcodes that carry none).
    pub payload: &'a [u8],
    /// The ICRC carried by the packet (verified).
    pub icrc: u32,
}

/// The transport part of a packet parsed from a UDP payload, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedTransport<'a> {
    /// BTH and extended headers.
    pub transport: TransportRepr,
    /// The payload without pad bytes.
    pub payload: &'a [u8],
    /// The ICRC carried by the packet (NOT verified by [`parse_udp_payload`]).
    pub icrc: u32,
}

/// Parses a UDP payload (BTH through ICRC) into headers, payload and the carried ICRC. Checks lengths,
/// TVer, opcode and PadCnt; does not verify the ICRC, which covers IP and UDP headers that this function
/// does not see (see [`icrc_of_udp_payload`]). Never panics.
///
/// # Errors
/// [`Error::Truncated`], [`Error::BadVersion`], [`Error::UnknownOpcode`]; [`Error::BadPad`] when PadCnt
/// exceeds the payload or leaves it not a multiple of 4 bytes (IBTA §9.2); [`Error::Malformed`]
/// (layer `Payload`) for payload bytes on an opcode that carries none.
pub fn parse_udp_payload(bytes: &[u8]) -> Result<ParsedTransport<'_>> {
    let (transport, header_len) = TransportRepr::parse(bytes)?;
    let need = header_len + icrc::ICRC_LEN;
    if bytes.len() < need {
        return Err(Error::Truncated {
            layer: Layer::Icrc,
            need,
            got: bytes.len(),
        });
    }
    let (body, icrc_bytes) = bytes.split_at(bytes.len() - icrc::ICRC_LEN);
    let padded = &body[header_len..];
    let pad_cnt = transport.bth.pad_cnt;
    if usize::from(pad_cnt) > padded.len() || padded.len() % 4 != 0 {
        return Err(Error::BadPad {
            pad_cnt,
            padded_len: padded.len(),
        });
    }
    if !padded.is_empty() && !transport.bth.opcode.has_payload() {
        return Err(Error::Malformed {
            layer: Layer::Payload,
            what: "payload on an opcode that carries none",
        });
    }
    let payload = &padded[..padded.len() - usize::from(pad_cnt)];
    let icrc = icrc::from_wire([icrc_bytes[0], icrc_bytes[1], icrc_bytes[2], icrc_bytes[3]]);
    Ok(ParsedTransport {
        transport,
        payload,
        icrc,
    })
}

/// Computes the ICRC of a UDP payload received on a kernel socket, from the IP and UDP header fields
/// the socket reports (addresses, ports; `ip`'s IPv4 identification and flags must be those on the
/// wire, since the ICRC covers them). `udp_payload` is the whole datagram payload, ICRC included.
///
/// # Errors
/// [`Error::Truncated`] when `udp_payload` is shorter than BTH plus ICRC; [`Error::BadLength`] when it
/// exceeds the IP length field.
pub fn icrc_of_udp_payload(ip: &IpRepr, udp: &udp::Repr, udp_payload: &[u8]) -> Result<u32> {
    let need = bth::HEADER_LEN + icrc::ICRC_LEN;
    if udp_payload.len() < need {
        return Err(Error::Truncated {
            layer: Layer::Bth,
            need,
            got: udp_payload.len(),
        });
    }
    let udp_len = udp::HEADER_LEN + udp_payload.len();
    if udp_len > ip.max_payload_len() {
        return Err(Error::BadLength(Layer::Udp));
    }
    let mut headers = [0u8; ipv6::HEADER_LEN + udp::HEADER_LEN];
    let ip_len = ip.header_len();
    let (ip_buf, rest) = headers.split_at_mut(ip_len);
    ip.emit_udp(udp_len, ip_buf);
    let udp_buf = &mut rest[..udp::HEADER_LEN];
    udp::Repr {
        src_port: udp.src_port,
        dst_port: udp.dst_port,
        payload_len: udp_payload.len(),
    }
    .emit(
        &mut udp::Packet::new_unchecked(&mut *udp_buf),
        udp::ChecksumMode::Zero,
    );
    let body = &udp_payload[..udp_payload.len() - icrc::ICRC_LEN];
    let (bth_buf, after) = body.split_at(bth::HEADER_LEN);
    let mut hasher = icrc::Hasher::new(ip_buf, udp_buf, bth_buf)?;
    hasher.update(after);
    Ok(hasher.finalize())
}

/// Parses and verifies an IP packet (IPv4 or IPv6 header through ICRC; bytes after the IP length, such
/// as Ethernet padding, are ignored). Never panics.
///
/// # Errors
/// [`Error::BadVersion`] (layer `Ipv4`) when the first nibble is neither 4 nor 6; the IPv4/IPv6 errors
/// of their `Repr::parse`; [`Error::NotRoce`] when the packet is not UDP to port 4791;
/// [`Error::Truncated`]/[`Error::BadLength`] (layer `Udp`); [`Error::BadChecksum`] (layer `Udp`) for a
/// non-zero UDP checksum that does not verify; the errors of [`parse_udp_payload`]; [`Error::BadIcrc`].
pub fn parse_ip_packet(bytes: &[u8]) -> Result<ParsedPacket<'_>> {
    let version = bytes.first().map_or(0, |b| b >> 4);
    let (ip, ip_header_len) = match version {
        4 => {
            let p = ipv4::Packet::new_checked(bytes)?;
            let repr = ipv4::Repr::parse(&p)?;
            (IpRepr::Ipv4(repr), usize::from(p.header_len()))
        }
        6 => {
            let p = ipv6::Packet::new_checked(bytes)?;
            (IpRepr::Ipv6(ipv6::Repr::parse(&p)?), ipv6::HEADER_LEN)
        }
        _ if bytes.is_empty() => {
            return Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: ipv4::HEADER_LEN,
                got: 0,
            })
        }
        _ => {
            return Err(Error::BadVersion {
                layer: Layer::Ipv4,
                version,
            })
        }
    };
    let protocol = match ip {
        IpRepr::Ipv4(r) => r.protocol,
        IpRepr::Ipv6(r) => r.next_header,
    };
    if protocol != IpProtocol::Udp {
        return Err(Error::NotRoce);
    }
    let ip_packet = &bytes[..ip_header_len + ip.payload_len()];
    let udp_bytes = &ip_packet[ip_header_len..];
    let udp_packet = udp::Packet::new_checked(udp_bytes)?;
    let udp = udp::Repr::parse(&udp_packet)?;
    if udp.dst_port != udp::ROCEV2_PORT {
        return Err(Error::NotRoce);
    }
    if udp_bytes.len() != usize::from(udp_packet.len()) {
        return Err(Error::BadLength(Layer::Udp));
    }
    let checksum_ok = match ip {
        IpRepr::Ipv4(r) => udp_packet.verify_checksum_v4(r.src_addr, r.dst_addr),
        IpRepr::Ipv6(r) => udp_packet.verify_checksum_v6(r.src_addr, r.dst_addr),
    };
    if !checksum_ok {
        return Err(Error::BadChecksum(Layer::Udp));
    }
    let parsed = parse_udp_payload(&udp_bytes[udp::HEADER_LEN..])?;
    icrc::verify(ip_packet)?;
    Ok(ParsedPacket {
        ethernet: None,
        ip,
        udp,
        transport: parsed.transport,
        payload: parsed.payload,
        icrc: parsed.icrc,
    })
}

/// Parses and verifies an Ethernet frame (without FCS) carrying a RoCEv2 packet. Never panics.
///
/// # Errors
/// [`Error::Truncated`] (layer `Ethernet`); [`Error::NotRoce`] when the EtherType is neither IPv4 nor
/// IPv6; then as [`parse_ip_packet`].
pub fn parse_frame(frame: &[u8]) -> Result<ParsedPacket<'_>> {
    let eth_frame = ethernet::Frame::new_checked(frame)?;
    let ethernet = ethernet::Repr::parse(&eth_frame)?;
    let expected_version = match ethernet.ethertype {
        EtherType::Ipv4 => 4,
        EtherType::Ipv6 => 6,
        _ => return Err(Error::NotRoce),
    };
    let ip_bytes = &frame[ethernet.buffer_len()..];
    let version = ip_bytes.first().map_or(0, |b| b >> 4);
    if !ip_bytes.is_empty() && version != expected_version {
        let layer = if expected_version == 4 {
            Layer::Ipv4
        } else {
            Layer::Ipv6
        };
        return Err(Error::BadVersion { layer, version });
    }
    let mut parsed = parse_ip_packet(ip_bytes)?;
    parsed.ethernet = Some(ethernet);
    Ok(parsed)
}

/// The fuzzing and property-test entry point: feeds `data` to every parser as a frame, an IP packet
/// and a UDP payload; whatever parses must rebuild into bytes that parse back to the same headers and
/// payload. Panics (deliberately, to report a bug to the fuzzer) only when that round trip fails.
#[doc(hidden)]
pub fn fuzz_entry(data: &[u8]) {
    let mut out = [0u8; 9216];
    if let Ok(p) = parse_frame(data) {
        let (ethernet, packet) = rebuild_reprs(&p);
        if let Ok(len) = build_frame(&ethernet, &packet, &[p.payload], &mut out) {
            let again = parse_frame(&out[..len]);
            assert_eq!(again.map(strip_icrc), Ok(strip_icrc(p)));
        }
    }
    if let Ok(p) = parse_ip_packet(data) {
        let (_, packet) = rebuild_reprs(&p);
        if let Ok(len) = build_ip_packet(&packet, &[p.payload], &mut out) {
            let again = parse_ip_packet(&out[..len]);
            assert_eq!(again.map(strip_icrc), Ok(strip_icrc(p)));
        }
    }
    if let Ok(t) = parse_udp_payload(data) {
        let _ = t.transport.check();
    }
}

/// The reprs that rebuild a parsed packet (the UDP checksum is recomputed when it was non-zero).
fn rebuild_reprs(p: &ParsedPacket<'_>) -> (ethernet::Repr, PacketRepr) {
    let ethernet = p.ethernet.unwrap_or(ethernet::Repr {
        src_addr: ethernet::Address([2, 0, 0, 0, 0, 1]),
        dst_addr: ethernet::Address([2, 0, 0, 0, 0, 2]),
        vlan: None,
        ethertype: EtherType::Ipv4,
    });
    let packet = PacketRepr {
        ip: p.ip,
        udp_src_port: p.udp.src_port,
        udp_checksum: true,
        transport: p.transport,
    };
    (ethernet, packet)
}

/// A parsed packet with the fields a rebuild may legitimately change (ICRC over zeroed reserved bits,
/// IP payload length after dropped IPv4 options or Ethernet padding) set to zero.
fn strip_icrc(mut p: ParsedPacket<'_>) -> ParsedPacket<'_> {
    p.icrc = 0;
    match &mut p.ip {
        IpRepr::Ipv4(r) => r.payload_len = 0,
        IpRepr::Ipv6(r) => r.payload_len = 0,
    }
    p
}
