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
//!
//! Not checked, as Linux rxe does not check them either: the content of the pad bytes (covered by the
//! ICRC, so only the sender chooses it; the builder writes zeros), reserved bits (the IPv4 reserved
//! flag, BTH resv6/resv7, DETH's reserved byte: ignored on parse and written as zero), and IPv4 options
//! (skipped on parse, never emitted).

use core::net::IpAddr;

use crate::ethernet::{self, EtherType};
use crate::ipv4::{self, Ecn, IpProtocol};
use crate::opcode::{ExtHeaders, Opcode, OpcodeInfo};
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
    /// differ from the opcode's (IBTA vol. 1 §9.3); [`Error::Malformed`] (layer `Aeth`) when the AETH
    /// syndrome does not survive its 8-bit encoding.
    pub fn check(&self) -> Result<()> {
        self.checked_len().map(|_| ())
    }

    /// [`TransportRepr::check`], returning [`TransportRepr::header_len`] (from the one opcode-table
    /// lookup the check makes).
    fn checked_len(&self) -> Result<usize> {
        let Some(info) = self.bth.opcode.info() else {
            return Err(Error::UnknownOpcode(u8::from(self.bth.opcode)));
        };
        if info.ext_headers != self.ext.present() {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                what: "extended headers present differ from those the opcode carries",
            });
        }
        if let Some(aeth) = self.ext.aeth {
            // A syndrome that would not read back as itself (a `Reserved` byte of a defined class, a
            // NAK code or credit wider than its 5 bits) would put something on the wire other than
            // what the caller asked for.
            if aeth::Syndrome::from_byte(aeth.syndrome.to_byte()) != aeth.syndrome {
                return Err(Error::Malformed {
                    layer: Layer::Aeth,
                    what: "syndrome does not fit its 8-bit encoding (IBTA vol. 1 table 43)",
                });
            }
        }
        Ok(bth::HEADER_LEN + info.ext_headers.byte_len())
    }

    /// Writes the BTH and the extended headers into the front of `buf`; returns the bytes written
    /// ([`TransportRepr::header_len`]).
    ///
    /// # Errors
    /// As [`TransportRepr::check`]; [`Error::BufferTooSmall`] when `buf` is shorter than the headers.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.checked_len()?;
        let got = buf.len();
        let Some(buf) = buf.get_mut(..len) else {
            return Err(Error::BufferTooSmall { need: len, got });
        };
        self.emit_checked(buf);
        Ok(len)
    }

    /// Writes the headers that [`TransportRepr::checked_len`] accepted into `buf`, which holds exactly
    /// [`TransportRepr::header_len`] bytes.
    fn emit_checked(&self, buf: &mut [u8]) {
        let (bth_buf, ext_buf) = buf.split_at_mut(bth::HEADER_LEN);
        self.bth.emit(&mut bth::Packet::new_unchecked(bth_buf));
        // `check` guarantees that exactly the opcode's extended headers are present, so the present
        // ones, in wire order (the order of `ExtHeaders::offsets`), fill `ext_buf` back to back.
        let ext = &self.ext;
        let mut at = 0;
        if let Some(repr) = ext.deth {
            repr.emit(&mut deth::Packet::new_unchecked(&mut ext_buf[at..]));
            at += deth::HEADER_LEN;
        }
        if let Some(repr) = ext.reth {
            repr.emit(&mut reth::Packet::new_unchecked(&mut ext_buf[at..]));
            at += reth::HEADER_LEN;
        }
        if let Some(repr) = ext.atomic_eth {
            repr.emit(&mut atomic_eth::request::Packet::new_unchecked(
                &mut ext_buf[at..],
            ));
            at += atomic_eth::request::HEADER_LEN;
        }
        if let Some(repr) = ext.aeth {
            repr.emit(&mut aeth::Packet::new_unchecked(&mut ext_buf[at..]));
            at += aeth::HEADER_LEN;
        }
        if let Some(repr) = ext.atomic_ack_eth {
            repr.emit(&mut atomic_eth::ack::Packet::new_unchecked(
                &mut ext_buf[at..],
            ));
            at += atomic_eth::ack::HEADER_LEN;
        }
        if let Some(repr) = ext.immdt {
            repr.emit(&mut immdt::Packet::new_unchecked(&mut ext_buf[at..]));
            at += immdt::HEADER_LEN;
        }
        if let Some(repr) = ext.ieth {
            repr.emit(&mut ieth::Packet::new_unchecked(&mut ext_buf[at..]));
        }
    }

    /// Parses the BTH and the extended headers its opcode carries from the front of `buf`; returns them
    /// and the number of header bytes read. Never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Bth` or the extended header that does not fit);
    /// [`Error::BadVersion`] when TVer != 0; [`Error::UnknownOpcode`].
    pub fn parse(buf: &[u8]) -> Result<(TransportRepr, usize)> {
        TransportRepr::parse_inline(buf).map(|(transport, len, _)| (transport, len))
    }

    /// [`TransportRepr::parse`], inlined into the whole-packet parsers so that the headers are written
    /// straight into the [`ParsedPacket`] they return; also says whether the opcode carries a payload.
    #[inline(always)]
    fn parse_inline(buf: &[u8]) -> Result<(TransportRepr, usize, bool)> {
        let (bth, info) = parse_bth(buf)?;
        let (ext, at) = parse_ext(buf, info.ext_headers)?;
        Ok((TransportRepr { bth, ext }, at, info.has_payload))
    }
}

/// The BTH at the start of `buf` and its opcode's row of the table.
#[inline(always)]
fn parse_bth(buf: &[u8]) -> Result<(bth::Repr, OpcodeInfo)> {
    let bth = bth::Repr::parse(&bth::Packet::new_unchecked(buf))?;
    // `bth::Repr::parse` rejected unknown opcodes, so this is the opcode's row of the table, looked up
    // by the byte it was parsed from.
    match buf.first().and_then(|&byte| Opcode::info_of_byte(byte)) {
        Some(info) => Ok((bth, info)),
        None => Err(Error::UnknownOpcode(u8::from(bth.opcode))),
    }
}

/// The extended headers `present` that follow the BTH at the start of `buf`, and the length in bytes
/// of BTH and extended headers.
#[inline(always)]
fn parse_ext(buf: &[u8], present: ExtHeaders) -> Result<(ExtReprs, usize)> {
    // In wire order (the order of `ExtHeaders::offsets`), each right after the one before; `at`
    // counts bytes from the start of the BTH.
    let mut ext = ExtReprs::default();
    let mut at = bth::HEADER_LEN;
    if present.is_empty() {
        return Ok((ext, at));
    }
    if present.contains(ExtHeaders::DETH) {
        let p = deth::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.deth = Some(deth::Repr::parse(&p)?);
        at += deth::HEADER_LEN;
    }
    if present.contains(ExtHeaders::RETH) {
        let p = reth::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.reth = Some(reth::Repr::parse(&p)?);
        at += reth::HEADER_LEN;
    }
    if present.contains(ExtHeaders::ATOMIC_ETH) {
        let p = atomic_eth::request::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.atomic_eth = Some(atomic_eth::request::Repr::parse(&p)?);
        at += atomic_eth::request::HEADER_LEN;
    }
    if present.contains(ExtHeaders::AETH) {
        let p = aeth::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.aeth = Some(aeth::Repr::parse(&p)?);
        at += aeth::HEADER_LEN;
    }
    if present.contains(ExtHeaders::ATOMIC_ACK_ETH) {
        let p = atomic_eth::ack::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.atomic_ack_eth = Some(atomic_eth::ack::Repr::parse(&p)?);
        at += atomic_eth::ack::HEADER_LEN;
    }
    if present.contains(ExtHeaders::IMMDT) {
        let p = immdt::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.immdt = Some(immdt::Repr::parse(&p)?);
        at += immdt::HEADER_LEN;
    }
    if present.contains(ExtHeaders::IETH) {
        let p = ieth::Packet::new_checked(buf.get(at..).unwrap_or_default())?;
        ext.ieth = Some(ieth::Repr::parse(&p)?);
        at += ieth::HEADER_LEN;
    }
    Ok((ext, at))
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

    const fn is_ipv4(&self) -> bool {
        matches!(self, IpRepr::Ipv4(_))
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

/// What [`check_build`] found out about a packet to build: lengths in bytes.
#[derive(Clone, Copy)]
struct BuildLens {
    /// PadCnt: pad bytes after the payload.
    pad: u8,
    /// The UDP length field: UDP header through ICRC.
    udp_len: usize,
    /// BTH and extended headers.
    transport_len: usize,
}

/// The checks every builder makes before writing anything: opcode and extended headers, payload only
/// where the opcode carries one, and the IP length limit.
fn check_build(packet: &PacketRepr, payload: &[&[u8]]) -> Result<BuildLens> {
    let transport_len = packet.transport.checked_len()?;
    let payload_len = payload_len_of(payload);
    if payload_len != 0 && !packet.transport.bth.opcode.has_payload() {
        return Err(Error::Malformed {
            layer: Layer::Payload,
            what: "payload given for an opcode that carries none",
        });
    }
    let pad = mtu::pad_cnt(payload_len);
    let udp_len = udp::HEADER_LEN + transport_len + payload_len + usize::from(pad) + icrc::ICRC_LEN;
    if udp_len > packet.ip.max_payload_len() {
        let layer = match packet.ip {
            IpRepr::Ipv4(_) => Layer::Ipv4,
            IpRepr::Ipv6(_) => Layer::Ipv6,
        };
        return Err(Error::BadLength(layer));
    }
    Ok(BuildLens {
        pad,
        udp_len,
        transport_len,
    })
}

/// Writes the headers of a packet into `out`: the Ethernet header when `ethernet` is given (its
/// EtherType is set from the IP version), IP, UDP, BTH (with PadCnt from the payload length) and the
/// extended headers. Computes the ICRC over headers, `payload` and pad, and the UDP checksum when asked,
/// so that `out[..written]`, the payload slices and the returned [`Trailer`] are the whole packet.
/// Returns the header bytes written and the trailer. The payload is read, never copied. (The ICRC is
/// computed over the headers in `out` with the fields it masks set to ones for the time of the
/// computation; they hold their values again when this returns.)
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
    let lens = check_build(packet, payload)?;
    let BuildLens { pad, udp_len, .. } = lens;
    let eth_len = ethernet.map_or(0, |e| e.buffer_len());
    let ip_len = packet.ip.header_len();
    let need = write_headers(ethernet, packet, lens, out)?;
    let out = out.get_mut(..need).unwrap_or_default();

    let mut trailer = Trailer {
        bytes: [0; 7],
        len: pad + icrc::ICRC_LEN as u8,
    };
    let pad_bytes = [0u8; 3];
    let pad_slice = pad_bytes.get(..usize::from(pad)).unwrap_or_default();
    let headers = out.get_mut(eth_len..).unwrap_or_default();
    let icrc = icrc::compute_in_place(headers, packet.ip.is_ipv4(), payload, pad_slice);
    trailer.bytes[usize::from(pad)..usize::from(trailer.len)].copy_from_slice(&icrc::to_wire(icrc));

    if let Some(pseudo) = packet
        .ip
        .udp_checksum_mode(packet.udp_checksum)
        .pseudo_header_sum(udp_len as u16)
    {
        let (udp_buf, transport_buf) = out
            .get_mut(eth_len + ip_len..)
            .unwrap_or_default()
            .split_at_mut(udp::HEADER_LEN);
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

/// Writes the Ethernet header (when given), the IP header, the UDP header with a zero checksum and the
/// transport headers of a packet that passed [`check_build`] (`lens`) into the front of `out`. Returns
/// the bytes written.
///
/// # Errors
/// [`Error::BufferTooSmall`] when `out` is shorter than the headers.
fn write_headers(
    ethernet: Option<&ethernet::Repr>,
    packet: &PacketRepr,
    lens: BuildLens,
    out: &mut [u8],
) -> Result<usize> {
    let BuildLens {
        pad,
        udp_len,
        transport_len,
    } = lens;
    let eth_len = ethernet.map_or(0, |e| e.buffer_len());
    let ip_len = packet.ip.header_len();
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
    transport.emit_checked(transport_buf);
    // The checksum is filled in once the ICRC it covers is known.
    udp::Repr {
        src_port: packet.udp_src_port,
        dst_port: udp::ROCEV2_PORT,
        payload_len: udp_len - udp::HEADER_LEN,
    }
    .emit(
        &mut udp::Packet::new_unchecked(udp_buf),
        udp::ChecksumMode::Zero,
    );
    Ok(need)
}

/// Builds a whole packet into `out` (a frame when `ethernet` is given, else an IP packet) and returns
/// its length in bytes: headers, payload copied from the slices, pad, ICRC, then the UDP checksum over
/// the finished datagram, each in one pass over the contiguous bytes.
fn build_contiguous(
    ethernet: Option<&ethernet::Repr>,
    packet: &PacketRepr,
    payload: &[&[u8]],
    out: &mut [u8],
) -> Result<usize> {
    let lens = check_build(packet, payload)?;
    let udp_len = lens.udp_len;
    let eth_len = ethernet.map_or(0, |e| e.buffer_len());
    let ip_len = packet.ip.header_len();
    let total = eth_len + ip_len + udp_len;
    let got = out.len();
    let Some(out) = out.get_mut(..total) else {
        return Err(Error::BufferTooSmall { need: total, got });
    };
    let mut at = write_headers(ethernet, packet, lens, out)?;
    for slice in payload {
        if let Some(dst) = out.get_mut(at..at + slice.len()) {
            dst.copy_from_slice(slice);
        }
        at += slice.len();
    }
    let (covered, icrc_buf) = out.split_at_mut(total - icrc::ICRC_LEN);
    // Pad bytes are zero (IBTA §9.2 leaves their value to the sender; rxe writes zeros). At most 3:
    // a loop, not a call to memset (usually for none at all).
    for byte in covered.get_mut(at..).unwrap_or_default() {
        *byte = 0;
    }
    let ip = covered.get_mut(eth_len..).unwrap_or_default();
    let icrc = icrc::compute_in_place(ip, packet.ip.is_ipv4(), &[], &[]);
    icrc_buf.copy_from_slice(&icrc::to_wire(icrc));

    if let Some(pseudo) = packet
        .ip
        .udp_checksum_mode(packet.udp_checksum)
        .pseudo_header_sum(udp_len as u16)
    {
        // The datagram is contiguous and its checksum field zero: one pass over it.
        let datagram = out.get_mut(eth_len + ip_len..).unwrap_or_default();
        let sum = crate::checksum::combine(&[pseudo, crate::checksum::data(datagram)]);
        udp::Packet::new_unchecked(datagram).set_checksum(udp::wire_checksum(sum));
    }
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
    build_contiguous(Some(ethernet), packet, payload, out)
}

/// Builds an IP packet (IP header through ICRC) into `out` and returns its length in bytes.
///
/// # Errors
/// As [`build_frame`].
pub fn build_ip_packet(packet: &PacketRepr, payload: &[&[u8]], out: &mut [u8]) -> Result<usize> {
    build_contiguous(None, packet, payload, out)
}

/// Copies the payload slices and the trailer after the first `headers_len` bytes of `out`; returns the
/// bytes of `out` now filled.
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
    parse_transport(bytes)
}

/// [`parse_udp_payload`], inlined into the whole-packet parsers.
#[inline(always)]
fn parse_transport(bytes: &[u8]) -> Result<ParsedTransport<'_>> {
    let (transport, header_len, has_payload) = TransportRepr::parse_inline(bytes)?;
    let (payload, icrc) = split_payload(bytes, header_len, transport.bth.pad_cnt, has_payload)?;
    Ok(ParsedTransport {
        transport,
        payload,
        icrc,
    })
}

/// The payload (without pad) and the carried ICRC of a UDP payload `bytes` whose BTH and extended
/// headers take `header_len` bytes, after the length and PadCnt checks of [`parse_udp_payload`].
#[inline(always)]
fn split_payload(
    bytes: &[u8],
    header_len: usize,
    pad_cnt: u8,
    has_payload: bool,
) -> Result<(&[u8], u32)> {
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
    if usize::from(pad_cnt) > padded.len() || padded.len() % 4 != 0 {
        return Err(Error::BadPad {
            pad_cnt,
            padded_len: padded.len(),
        });
    }
    if !padded.is_empty() && !has_payload {
        return Err(Error::Malformed {
            layer: Layer::Payload,
            what: "payload on an opcode that carries none",
        });
    }
    let payload = &padded[..padded.len() - usize::from(pad_cnt)];
    let icrc = icrc::from_wire([icrc_bytes[0], icrc_bytes[1], icrc_bytes[2], icrc_bytes[3]]);
    Ok((payload, icrc))
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
    // The IP and UDP headers as they were on the wire (up to the masked fields), followed by the
    // first bytes of the UDP payload, in one stack buffer: the ICRC then runs over it and the rest of
    // the payload as over any gathered packet (see `icrc::compute_gather`).
    let mut head = [0u8; 64];
    let ip_len = ip.header_len();
    let (ip_buf, rest) = head.split_at_mut(ip_len);
    ip.emit_udp(udp_len, ip_buf);
    let (udp_buf, after_udp) = rest.split_at_mut(udp::HEADER_LEN);
    udp::Repr {
        src_port: udp.src_port,
        dst_port: udp.dst_port,
        payload_len: udp_payload.len(),
    }
    .emit(
        &mut udp::Packet::new_unchecked(udp_buf),
        udp::ChecksumMode::Zero,
    );
    let body = &udp_payload[..udp_payload.len() - icrc::ICRC_LEN];
    // The head ends after the BTH when the rest is a whole number of 16-byte blocks (payload and pad
    // usually are; a 4 KiB payload then runs on the CRC's widest stride), otherwise after 48 (IPv4)
    // or 64 (IPv6) bytes, a whole number of blocks itself: one partial block in all, not two.
    let after_bth = body.len() - bth::HEADER_LEN;
    let prefix = if ip.is_ipv4() { 48 } else { 64 };
    let take = if after_bth % 16 == 0 {
        bth::HEADER_LEN
    } else {
        (prefix - ip_len - udp::HEADER_LEN).min(body.len())
    };
    let (start, later) = body.split_at(take);
    after_udp[..take].copy_from_slice(start);
    icrc::compute_gather(&head[..ip_len + udp::HEADER_LEN + take], &[later])
}

/// Computes the ICRC of a UDP payload that is sent from several buffers (zero-copy transmit: the
/// transport headers in one buffer, the payload straight from the memory regions it is sent from):
/// the wire carries `headers` (BTH and extended headers), then each slice of `rest` in order (payload
/// and pad bytes, IBTA §9.2 PadCnt), then the ICRC. `udp.payload_len` is the length of the whole UDP
/// payload, ICRC included. The result equals [`icrc_of_udp_payload`] over the concatenation.
///
/// # Errors
/// [`Error::Truncated`] (layer BTH) when `headers` is shorter than the BTH; [`Error::BadLength`]
/// (layer UDP) when `headers` is longer than 28 bytes after the BTH (the largest extended headers),
/// when `udp.payload_len` differs from the bytes given plus the ICRC, or when it exceeds the IP
/// length field.
pub fn icrc_of_udp_payload_gather(
    ip: &IpRepr,
    udp: &udp::Repr,
    headers: &[u8],
    rest: &[&[u8]],
) -> Result<u32> {
    /// BTH (12) + the largest extended headers (28, RETH + ImmDt or AtomicETH).
    const MAX_TRANSPORT_HEADERS: usize = bth::HEADER_LEN + 28;
    if headers.len() < bth::HEADER_LEN {
        return Err(Error::Truncated {
            layer: Layer::Bth,
            need: bth::HEADER_LEN,
            got: headers.len(),
        });
    }
    if headers.len() > MAX_TRANSPORT_HEADERS {
        return Err(Error::BadLength(Layer::Udp));
    }
    let given = rest
        .iter()
        .try_fold(headers.len() + icrc::ICRC_LEN, |n, s| {
            n.checked_add(s.len())
        });
    if given != Some(udp.payload_len) {
        return Err(Error::BadLength(Layer::Udp));
    }
    let udp_len = udp::HEADER_LEN + udp.payload_len;
    if udp_len > ip.max_payload_len() {
        return Err(Error::BadLength(Layer::Udp));
    }
    // IP (at most 40) + UDP (8) + transport headers (at most 40) in one stack buffer.
    let mut head = [0u8; 40 + udp::HEADER_LEN + MAX_TRANSPORT_HEADERS];
    let ip_len = ip.header_len();
    let (ip_buf, after_ip) = head.split_at_mut(ip_len);
    ip.emit_udp(udp_len, ip_buf);
    let (udp_buf, after_udp) = after_ip.split_at_mut(udp::HEADER_LEN);
    udp::Repr {
        src_port: udp.src_port,
        dst_port: udp.dst_port,
        payload_len: udp.payload_len,
    }
    .emit(
        &mut udp::Packet::new_unchecked(udp_buf),
        udp::ChecksumMode::Zero,
    );
    after_udp[..headers.len()].copy_from_slice(headers);
    icrc::compute_gather(&head[..ip_len + udp::HEADER_LEN + headers.len()], rest)
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
    parse_ip(bytes, None)
}

/// [`parse_ip_packet`], with the Ethernet header already parsed (`None` for a bare IP packet). Inlined
/// into both callers so that the [`ParsedPacket`] is built once, in the caller's return slot.
#[inline(always)]
fn parse_ip(bytes: &[u8], ethernet: Option<ethernet::Repr>) -> Result<ParsedPacket<'_>> {
    let version = bytes.first().map_or(0, |b| b >> 4);
    // `ihl` is the IPv4 header length with options (`Some`), `None` for IPv6: the ICRC's view of the
    // IP header.
    let (ip, ihl) = match version {
        4 => {
            let p = ipv4::Packet::new_unchecked(bytes);
            let repr = ipv4::Repr::parse(&p)?;
            (IpRepr::Ipv4(repr), Some(usize::from(p.header_len())))
        }
        6 => {
            let p = ipv6::Packet::new_unchecked(bytes);
            (IpRepr::Ipv6(ipv6::Repr::parse(&p)?), None)
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
    let ip_header_len = ihl.unwrap_or(ipv6::HEADER_LEN);
    // The IP `Repr::parse` checked that header and payload lie within `bytes`.
    let ip_packet = bytes
        .get(..ip_header_len + ip.payload_len())
        .unwrap_or_default();
    let udp_bytes = ip_packet.get(ip_header_len..).unwrap_or_default();
    let udp_packet = udp::Packet::new_unchecked(udp_bytes);
    let udp = udp::Repr::parse(&udp_packet)?;
    if udp.dst_port != udp::ROCEV2_PORT {
        return Err(Error::NotRoce);
    }
    if udp_bytes.len() != udp::HEADER_LEN + udp.payload_len {
        return Err(Error::BadLength(Layer::Udp));
    }
    let checksum_ok = match ip {
        IpRepr::Ipv4(r) => udp_packet.verify_checksum_v4(r.src_addr, r.dst_addr),
        IpRepr::Ipv6(r) => udp_packet.verify_checksum_v6(r.src_addr, r.dst_addr),
    };
    if !checksum_ok {
        return Err(Error::BadChecksum(Layer::Udp));
    }
    let udp_payload = udp_bytes.get(udp::HEADER_LEN..).unwrap_or_default();
    let (bth, info) = parse_bth(udp_payload)?;
    let headers = Headers {
        ethernet,
        ip,
        udp,
        ihl,
    };
    // Two copies of the rest: with no extended headers (most packets) the parsed packet's
    // `ExtReprs` is a constant, not seven optional headers carried through every branch.
    if info.ext_headers.is_empty() {
        let transport = TransportRepr {
            bth,
            ext: ExtReprs::default(),
        };
        finish_parse(
            headers,
            ip_packet,
            udp_payload,
            transport,
            bth::HEADER_LEN,
            info,
        )
    } else {
        let (ext, header_len) = parse_ext(udp_payload, info.ext_headers)?;
        let transport = TransportRepr { bth, ext };
        finish_parse(headers, ip_packet, udp_payload, transport, header_len, info)
    }
}

/// The headers [`parse_ip`] has parsed before the transport headers.
#[derive(Clone, Copy)]
struct Headers {
    ethernet: Option<ethernet::Repr>,
    ip: IpRepr,
    udp: udp::Repr,
    /// IPv4 header length with options (`Some`), `None` for IPv6.
    ihl: Option<usize>,
}

/// The end of [`parse_ip`]: PadCnt and payload checks, the ICRC, and the parsed packet.
#[inline(always)]
fn finish_parse<'a>(
    headers: Headers,
    ip_packet: &'a [u8],
    udp_payload: &'a [u8],
    transport: TransportRepr,
    header_len: usize,
    info: OpcodeInfo,
) -> Result<ParsedPacket<'a>> {
    let (payload, icrc) = split_payload(
        udp_payload,
        header_len,
        transport.bth.pad_cnt,
        info.has_payload,
    )?;
    // Every header the ICRC masks has been validated above: compute it from the known layout
    // instead of parsing the headers again (what `icrc::verify` would do).
    let body = ip_packet
        .get(..ip_packet.len() - icrc::ICRC_LEN)
        .unwrap_or_default();
    let computed = icrc::compute_validated(body, headers.ihl);
    if computed != icrc {
        return Err(Error::BadIcrc {
            computed,
            received: icrc,
        });
    }
    Ok(ParsedPacket {
        ethernet: headers.ethernet,
        ip: headers.ip,
        udp: headers.udp,
        transport,
        payload,
        icrc,
    })
}

/// Parses and verifies an Ethernet frame (without FCS) carrying a RoCEv2 packet. Never panics.
///
/// # Errors
/// [`Error::Truncated`] (layer `Ethernet`); [`Error::NotRoce`] when the EtherType is neither IPv4 nor
/// IPv6; then as [`parse_ip_packet`].
pub fn parse_frame(frame: &[u8]) -> Result<ParsedPacket<'_>> {
    let ethernet = ethernet::Repr::parse(&ethernet::Frame::new_unchecked(frame))?;
    let expected_version = match ethernet.ethertype {
        EtherType::Ipv4 => 4,
        EtherType::Ipv6 => 6,
        _ => return Err(Error::NotRoce),
    };
    let ip_bytes = frame.get(ethernet.buffer_len()..).unwrap_or_default();
    let (layer, min_len) = if expected_version == 4 {
        (Layer::Ipv4, ipv4::HEADER_LEN)
    } else {
        (Layer::Ipv6, ipv6::HEADER_LEN)
    };
    let Some(&first) = ip_bytes.first() else {
        return Err(Error::Truncated {
            layer,
            need: min_len,
            got: 0,
        });
    };
    let version = first >> 4;
    if version != expected_version {
        return Err(Error::BadVersion { layer, version });
    }
    parse_ip(ip_bytes, Some(ethernet))
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

#[cfg(test)]
mod test {
    //! Property tests and error-path tests of the whole-packet builder and parser.
    //!
    //! * Random valid packets (every opcode with the extended headers it requires, IPv4/IPv6, optional
    //!   802.1Q tag, payload 0..=4096 bytes gathered from 1..=5 slices, UDP checksum on/off) round-trip
    //!   through all three depths (frame, IP packet, UDP payload), and the three builders and
    //!   [`emit_headers`] agree byte for byte.
    //! * Arbitrary bytes and mutated valid frames (1-4 bytes changed, truncated, extended; optionally with
    //!   the checksums and ICRC repaired so the mutation reaches the checks behind them) never panic any
    //!   parser, and a mutated frame that still parses parses to exactly its bytes: rebuilt from what was
    //!   parsed, it gives back the mutated frame with only the fields the builder normalises (reserved
    //!   bits, pad bytes, IPv4 options, Ethernet padding) normalised.
    //! * One test per parse error path and per build error, with the exact error.
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use core::net::{Ipv4Addr, Ipv6Addr};

    use proptest::collection::vec as prop_vec;
    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;
    use crate::aeth::Syndrome;
    use crate::ethernet::{Address, VlanTag};
    use crate::opcode::Opcode;

    // ---------------------------------------------------------------------------------------------
    // Fixtures.

    const V4_SRC: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 7);
    const V4_DST: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 8);
    const V6_SRC: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const V6_DST: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);

    fn ipv4_repr() -> IpRepr {
        IpRepr::Ipv4(ipv4::Repr {
            src_addr: V4_SRC,
            dst_addr: V4_DST,
            protocol: IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 64,
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 0x1234,
            dont_frag: true,
        })
    }

    fn ipv6_repr() -> IpRepr {
        IpRepr::Ipv6(ipv6::Repr {
            src_addr: V6_SRC,
            dst_addr: V6_DST,
            next_header: IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 255,
            dscp: 26,
            ecn: Ecn::Ect1,
            flow_label: 0x1_2345,
        })
    }

    fn ethernet_repr(vlan: Option<VlanTag>) -> ethernet::Repr {
        ethernet::Repr {
            src_addr: Address([0x02, 0x00, 0x00, 0x00, 0x00, 0x01]),
            dst_addr: Address([0x02, 0x00, 0x00, 0x00, 0x00, 0x02]),
            vlan,
            ethertype: EtherType::Ipv4,
        }
    }

    /// Fixed values for every extended header `op` carries.
    fn ext_for(op: Opcode) -> ExtReprs {
        let want = op.ext_headers();
        ExtReprs {
            deth: want.contains(ExtHeaders::DETH).then_some(deth::Repr {
                qkey: 0x1111_1111,
                src_qpn: 0x00ab_cdef,
            }),
            reth: want.contains(ExtHeaders::RETH).then_some(reth::Repr {
                virtual_address: 0x7f00_1234_5000,
                rkey: 0x1234_abcd,
                dma_len: 13,
            }),
            atomic_eth: want.contains(ExtHeaders::ATOMIC_ETH).then_some(
                atomic_eth::request::Repr {
                    virtual_address: 0x7f00_0000_1000,
                    rkey: 0x0bad_cafe,
                    swap_add_data: 0x0102_0304_0506_0708,
                    compare_data: 0x1112_1314_1516_1718,
                },
            ),
            aeth: want.contains(ExtHeaders::AETH).then_some(aeth::Repr {
                syndrome: Syndrome::from_byte(0x1f),
                msn: 0x0001_0203,
            }),
            atomic_ack_eth: want.contains(ExtHeaders::ATOMIC_ACK_ETH).then_some(
                atomic_eth::ack::Repr {
                    orig_remote_data: 0xdead_beef_0000_0001,
                },
            ),
            immdt: want.contains(ExtHeaders::IMMDT).then_some(immdt::Repr {
                imm_data: 0x0a0b_0c0d,
            }),
            ieth: want
                .contains(ExtHeaders::IETH)
                .then_some(ieth::Repr { rkey: 0x5555_aaaa }),
        }
    }

    fn packet_repr(op: Opcode, ip: IpRepr, udp_checksum: bool) -> PacketRepr {
        PacketRepr {
            ip,
            udp_src_port: 0xc123,
            udp_checksum,
            transport: TransportRepr {
                bth: bth::Repr {
                    opcode: op,
                    solicited: false,
                    mig_req: true,
                    pad_cnt: 0,
                    pkey: 0xffff,
                    fecn: false,
                    becn: false,
                    dest_qpn: 0x11,
                    ack_req: true,
                    psn: 0x00ff_fffe,
                },
                ext: ext_for(op),
            },
        }
    }

    fn build(eth: &ethernet::Repr, packet: &PacketRepr, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; ethernet::VLAN_HEADER_LEN + ipv6::HEADER_LEN + 70_000];
        let len = build_frame(eth, packet, &[payload], &mut out).expect("valid packet builds");
        out.truncate(len);
        out
    }

    /// An untagged IPv4 frame of `op` (with its extended headers) carrying `payload`.
    fn frame_v4(op: Opcode, payload: &[u8], udp_checksum: bool) -> Vec<u8> {
        build(
            &ethernet_repr(None),
            &packet_repr(op, ipv4_repr(), udp_checksum),
            payload,
        )
    }

    /// An untagged IPv6 frame of `op` carrying `payload`.
    fn frame_v6(op: Opcode, payload: &[u8], udp_checksum: bool) -> Vec<u8> {
        build(
            &ethernet_repr(None),
            &packet_repr(op, ipv6_repr(), udp_checksum),
            payload,
        )
    }

    fn be16(bytes: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
    }

    /// Offset of the IP header in an Ethernet frame, read from the raw bytes.
    fn ip_offset(frame: &[u8]) -> usize {
        if be16(frame, 12) == Some(0x8100) {
            ethernet::VLAN_HEADER_LEN
        } else {
            ethernet::HEADER_LEN
        }
    }

    /// Recomputes, from the raw bytes and as far as the length fields allow, the IPv4 header checksum,
    /// the ICRC and (when not zero) the UDP checksum of an Ethernet frame carrying IPv4 or IPv6; never
    /// panics. A test edits a frame, then calls this so that only the edit is wrong.
    fn fix_checksums(frame: &mut [u8]) {
        let ip_start = ip_offset(frame);
        let Some(ip) = frame.get_mut(ip_start..) else {
            return;
        };
        let (ip_header_len, total) = match ip.first().map(|b| b >> 4) {
            Some(4) => {
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                if ihl < ipv4::HEADER_LEN || ip.len() < ihl {
                    return;
                }
                ipv4::Packet::new_unchecked(&mut *ip).fill_checksum();
                (ihl, usize::from(be16(ip, 2).unwrap_or(0)))
            }
            Some(6) if ip.len() >= ipv6::HEADER_LEN => (
                ipv6::HEADER_LEN,
                ipv6::HEADER_LEN + usize::from(be16(ip, 4).unwrap_or(0)),
            ),
            _ => return,
        };
        if total < ip_header_len || total > ip.len() {
            return;
        }
        let mode = if ip_header_len == ipv6::HEADER_LEN {
            let view = ipv6::Packet::new_unchecked(&ip[..]);
            udp::ChecksumMode::ComputeV6 {
                src_addr: view.src_addr(),
                dst_addr: view.dst_addr(),
            }
        } else {
            let view = ipv4::Packet::new_unchecked(&ip[..]);
            udp::ChecksumMode::ComputeV4 {
                src_addr: view.src_addr(),
                dst_addr: view.dst_addr(),
            }
        };
        let packet = &mut ip[..total];
        let _ = icrc::write(packet);
        let datagram = &mut packet[ip_header_len..];
        let (Some(len), Some(checksum)) = (be16(datagram, 4), be16(datagram, 6)) else {
            return;
        };
        let len = usize::from(len);
        if checksum == 0 || len < udp::HEADER_LEN || len > datagram.len() {
            return;
        }
        let mut udp_packet = udp::Packet::new_unchecked(&mut datagram[..len]);
        match mode {
            udp::ChecksumMode::ComputeV4 { src_addr, dst_addr } => {
                udp_packet.fill_checksum_v4(src_addr, dst_addr)
            }
            udp::ChecksumMode::ComputeV6 { src_addr, dst_addr } => {
                udp_packet.fill_checksum_v6(src_addr, dst_addr)
            }
            udp::ChecksumMode::Zero => {}
        }
    }

    /// `frame` with its UDP payload (BTH onwards, ICRC slot included) replaced by `udp_payload`; IP
    /// and UDP lengths set to match, checksums and ICRC recomputed.
    fn with_udp_payload(frame: &[u8], udp_payload: &[u8]) -> Vec<u8> {
        let ip_start = ip_offset(frame);
        let v4 = frame[ip_start] >> 4 == 4;
        let ip_len = if v4 {
            ipv4::HEADER_LEN
        } else {
            ipv6::HEADER_LEN
        };
        let udp_start = ip_start + ip_len;
        let mut out = frame[..udp_start + udp::HEADER_LEN].to_vec();
        out.extend_from_slice(udp_payload);
        let udp_len = (udp::HEADER_LEN + udp_payload.len()) as u16;
        out[udp_start + 4..udp_start + 6].copy_from_slice(&udp_len.to_be_bytes());
        if v4 {
            let total = (ip_len as u16 + udp_len).to_be_bytes();
            out[ip_start + 2..ip_start + 4].copy_from_slice(&total);
        } else {
            out[ip_start + 4..ip_start + 6].copy_from_slice(&udp_len.to_be_bytes());
        }
        fix_checksums(&mut out);
        out
    }

    /// Feeds `data` to every parser and to [`fuzz_entry`]; none may panic.
    fn feed_all(data: &[u8]) {
        fuzz_entry(data);
        let _ = parse_frame(data);
        let _ = parse_ip_packet(data);
        let _ = parse_udp_payload(data);
        let _ = TransportRepr::parse(data);
        let udp_repr = udp::Repr {
            src_port: 0xc000,
            dst_port: udp::ROCEV2_PORT,
            payload_len: data.len(),
        };
        let _ = icrc_of_udp_payload(&ipv4_repr(), &udp_repr, data);
        let _ = icrc_of_udp_payload(&ipv6_repr(), &udp_repr, data);
    }

    // ---------------------------------------------------------------------------------------------
    // Strategies.

    fn arb_ecn() -> impl Strategy<Value = Ecn> {
        (0u8..4).prop_map(Ecn::from_bits)
    }

    /// A valid IP header; the fields the builder sets (protocol, payload length) hold junk.
    fn arb_ip() -> impl Strategy<Value = IpRepr> {
        let v4 = (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            0u8..64,
            arb_ecn(),
            any::<u16>(),
            any::<bool>(),
            (any::<u8>(), 0usize..100_000),
        )
            .prop_map(
                |(src, dst, hop_limit, dscp, ecn, ident, dont_frag, (protocol, payload_len))| {
                    IpRepr::Ipv4(ipv4::Repr {
                        src_addr: Ipv4Addr::from(src),
                        dst_addr: Ipv4Addr::from(dst),
                        protocol: IpProtocol::from(protocol),
                        payload_len,
                        hop_limit,
                        dscp,
                        ecn,
                        ident,
                        dont_frag,
                    })
                },
            );
        let v6 = (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            0u8..64,
            arb_ecn(),
            0u32..(1 << 20),
            (any::<u8>(), 0usize..100_000),
        )
            .prop_map(
                |(src, dst, hop_limit, dscp, ecn, flow_label, (next_header, payload_len))| {
                    IpRepr::Ipv6(ipv6::Repr {
                        src_addr: Ipv6Addr::from(src),
                        dst_addr: Ipv6Addr::from(dst),
                        next_header: IpProtocol::from(next_header),
                        payload_len,
                        hop_limit,
                        dscp,
                        ecn,
                        flow_label,
                    })
                },
            );
        prop_oneof![v4, v6]
    }

    /// An Ethernet header, with or without an 802.1Q tag; the EtherType (set by the builder) is junk.
    fn arb_ethernet() -> impl Strategy<Value = ethernet::Repr> {
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
            any::<u16>(),
        )
            .prop_map(|(src, dst, vlan, ethertype)| ethernet::Repr {
                src_addr: Address(src),
                dst_addr: Address(dst),
                vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                ethertype: EtherType::from(ethertype),
            })
    }

    /// Random values for exactly the extended headers in `want`.
    fn arb_ext(want: ExtHeaders) -> impl Strategy<Value = ExtReprs> {
        (
            (any::<u32>(), 0u32..(1 << 24)),
            (any::<u64>(), any::<u32>(), any::<u32>()),
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
            (any::<u8>(), 0u32..(1 << 24)),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(move |(d, r, a, ack, orig, imm, inv)| ExtReprs {
                deth: want.contains(ExtHeaders::DETH).then_some(deth::Repr {
                    qkey: d.0,
                    src_qpn: d.1,
                }),
                reth: want.contains(ExtHeaders::RETH).then_some(reth::Repr {
                    virtual_address: r.0,
                    rkey: r.1,
                    dma_len: r.2,
                }),
                atomic_eth: want.contains(ExtHeaders::ATOMIC_ETH).then_some(
                    atomic_eth::request::Repr {
                        virtual_address: a.0,
                        rkey: a.1,
                        swap_add_data: a.2,
                        compare_data: a.3,
                    },
                ),
                aeth: want.contains(ExtHeaders::AETH).then_some(aeth::Repr {
                    syndrome: Syndrome::from_byte(ack.0),
                    msn: ack.1,
                }),
                atomic_ack_eth: want.contains(ExtHeaders::ATOMIC_ACK_ETH).then_some(
                    atomic_eth::ack::Repr {
                        orig_remote_data: orig,
                    },
                ),
                immdt: want
                    .contains(ExtHeaders::IMMDT)
                    .then_some(immdt::Repr { imm_data: imm }),
                ieth: want
                    .contains(ExtHeaders::IETH)
                    .then_some(ieth::Repr { rkey: inv }),
            })
    }

    /// Any known opcode with random BTH fields (PadCnt junk: the builder sets it) and its extended
    /// headers.
    fn arb_transport() -> impl Strategy<Value = TransportRepr> {
        proptest::sample::select(Opcode::ALL.to_vec()).prop_flat_map(|opcode| {
            (
                (any::<bool>(), any::<bool>(), 0u8..4, any::<u16>()),
                (any::<bool>(), any::<bool>(), 0u32..(1 << 24)),
                (any::<bool>(), 0u32..(1 << 24)),
                arb_ext(opcode.ext_headers()),
            )
                .prop_map(
                    move |(
                        (solicited, mig_req, pad_cnt, pkey),
                        (fecn, becn, dest_qpn),
                        (ack_req, psn),
                        ext,
                    )| TransportRepr {
                        bth: bth::Repr {
                            opcode,
                            solicited,
                            mig_req,
                            pad_cnt,
                            pkey,
                            fecn,
                            becn,
                            dest_qpn,
                            ack_req,
                            psn,
                        },
                        ext,
                    },
                )
        })
    }

    /// A valid packet to build: headers, payload (empty for opcodes without one) and up to 4 cut
    /// points that split the payload into 1..=5 slices.
    #[derive(Debug, Clone)]
    struct Case {
        ethernet: ethernet::Repr,
        packet: PacketRepr,
        payload: Vec<u8>,
        cuts: Vec<usize>,
    }

    impl Case {
        fn slices(&self) -> Vec<&[u8]> {
            let mut slices = Vec::new();
            let mut at = 0;
            for &cut in &self.cuts {
                slices.push(&self.payload[at..cut]);
                at = cut;
            }
            slices.push(&self.payload[at..]);
            slices
        }

        /// The pad the IBTA requires (§9.2), computed here independently of [`mtu::pad_cnt`].
        fn pad(&self) -> usize {
            (4 - self.payload.len() % 4) % 4
        }

        fn udp_payload_len(&self) -> usize {
            self.packet.transport.header_len() + self.payload.len() + self.pad() + icrc::ICRC_LEN
        }

        fn expected_ethernet(&self) -> ethernet::Repr {
            let mut e = self.ethernet;
            e.ethertype = match self.packet.ip {
                IpRepr::Ipv4(_) => EtherType::Ipv4,
                IpRepr::Ipv6(_) => EtherType::Ipv6,
            };
            e
        }

        fn expected_ip(&self) -> IpRepr {
            let udp_len = udp::HEADER_LEN + self.udp_payload_len();
            match self.packet.ip {
                IpRepr::Ipv4(mut r) => {
                    r.protocol = IpProtocol::Udp;
                    r.payload_len = udp_len;
                    IpRepr::Ipv4(r)
                }
                IpRepr::Ipv6(mut r) => {
                    r.next_header = IpProtocol::Udp;
                    r.payload_len = udp_len;
                    IpRepr::Ipv6(r)
                }
            }
        }

        fn expected_udp(&self) -> udp::Repr {
            udp::Repr {
                src_port: self.packet.udp_src_port,
                dst_port: udp::ROCEV2_PORT,
                payload_len: self.udp_payload_len(),
            }
        }

        fn expected_transport(&self) -> TransportRepr {
            let mut t = self.packet.transport;
            t.bth.pad_cnt = self.pad() as u8;
            t
        }
    }

    fn arb_case() -> impl Strategy<Value = Case> {
        (
            arb_ethernet(),
            arb_ip(),
            any::<u16>(),
            any::<bool>(),
            arb_transport(),
        )
            .prop_flat_map(|(ethernet, ip, udp_src_port, udp_checksum, transport)| {
                let packet = PacketRepr {
                    ip,
                    udp_src_port,
                    udp_checksum,
                    transport,
                };
                let max = if transport.bth.opcode.has_payload() {
                    4096
                } else {
                    0
                };
                (
                    prop_vec(any::<u8>(), 0..=max),
                    prop_vec(any::<Index>(), 0..=4),
                )
                    .prop_map(move |(payload, cuts)| {
                        let mut cuts: Vec<usize> =
                            cuts.iter().map(|i| i.index(payload.len() + 1)).collect();
                        cuts.sort_unstable();
                        Case {
                            ethernet,
                            packet,
                            payload,
                            cuts,
                        }
                    })
            })
    }

    /// A change to a valid frame.
    #[derive(Debug, Clone)]
    enum Mutation {
        /// XOR 1..=4 bytes (at random positions) with non-zero values.
        Flip(Vec<(Index, u8)>),
        /// Cut the frame short.
        Truncate(Index),
        /// Append bytes (Ethernet padding, or junk).
        Extend(Vec<u8>),
    }

    impl Mutation {
        fn apply(&self, frame: &[u8]) -> Vec<u8> {
            let mut out = frame.to_vec();
            match self {
                Mutation::Flip(flips) => {
                    for (at, xor) in flips {
                        let at = at.index(out.len());
                        out[at] ^= xor;
                    }
                }
                Mutation::Truncate(at) => out.truncate(at.index(out.len())),
                Mutation::Extend(bytes) => out.extend_from_slice(bytes),
            }
            out
        }
    }

    fn arb_mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            3 => prop_vec((any::<Index>(), 1u8..=255), 1..=4).prop_map(Mutation::Flip),
            1 => any::<Index>().prop_map(Mutation::Truncate),
            1 => prop_vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        ]
    }

    // ---------------------------------------------------------------------------------------------
    // (a) Random valid packets round-trip.

    /// Checks that `case` builds and parses back at all three depths, and that every builder and
    /// [`emit_headers`] write the same bytes.
    fn check_round_trip(case: &Case) -> core::result::Result<(), TestCaseError> {
        let slices = case.slices();
        prop_assert_eq!(slices.len(), case.cuts.len() + 1);
        let eth_len = case.ethernet.buffer_len();
        let ip_len = case.packet.ip.header_len();
        let ip_packet_len = case.packet.ip_packet_len(case.payload.len());
        let frame_len = eth_len + ip_packet_len;
        prop_assert_eq!(
            ip_packet_len,
            ip_len + udp::HEADER_LEN + case.udp_payload_len()
        );

        // build_frame: exact length, bytes past it untouched.
        let mut out = vec![0xa5u8; frame_len + 64];
        let len = build_frame(&case.ethernet, &case.packet, &slices, &mut out)
            .map_err(|e| TestCaseError::fail(std::format!("build_frame: {e}")))?;
        prop_assert_eq!(len, frame_len);
        prop_assert!(out[len..].iter().all(|&b| b == 0xa5));
        let frame = &out[..len];

        // parse_frame: every header as built, the payload, the pad and the ICRC.
        let p = parse_frame(frame)
            .map_err(|e| TestCaseError::fail(std::format!("parse_frame: {e}")))?;
        prop_assert_eq!(p.ethernet, Some(case.expected_ethernet()));
        prop_assert_eq!(p.ip, case.expected_ip());
        prop_assert_eq!(p.udp, case.expected_udp());
        prop_assert_eq!(p.transport, case.expected_transport());
        prop_assert_eq!(p.payload, &case.payload[..]);
        let payload_end = len - icrc::ICRC_LEN - case.pad();
        prop_assert!(frame[payload_end..len - icrc::ICRC_LEN]
            .iter()
            .all(|&b| b == 0));
        let wire_icrc = icrc::from_wire(frame[len - 4..].try_into().unwrap());
        prop_assert_eq!(p.icrc, wire_icrc);
        prop_assert_eq!(Ok(p.icrc), icrc::compute(&frame[eth_len..len - 4]));
        let udp_checksum = be16(frame, eth_len + ip_len + 6).unwrap();
        prop_assert_eq!(udp_checksum != 0, case.packet.udp_checksum);

        // emit_headers + payload slices + trailer is the same frame, with or without Ethernet.
        let mut headers = [0u8; MAX_HEADERS_LEN];
        let (n, trailer) = emit_headers(Some(&case.ethernet), &case.packet, &slices, &mut headers)
            .map_err(|e| TestCaseError::fail(std::format!("emit_headers: {e}")))?;
        let mut gathered = headers[..n].to_vec();
        for s in &slices {
            gathered.extend_from_slice(s);
        }
        gathered.extend_from_slice(trailer.as_bytes());
        prop_assert_eq!(&gathered[..], frame);
        prop_assert_eq!(trailer.icrc(), p.icrc);
        prop_assert_eq!(trailer.as_bytes().len(), case.pad() + icrc::ICRC_LEN);
        let (n_ip, trailer_ip) = emit_headers(None, &case.packet, &slices, &mut headers).unwrap();
        prop_assert_eq!(n_ip, n - eth_len);
        prop_assert_eq!(&headers[..n_ip], &frame[eth_len..n]);
        prop_assert_eq!(trailer_ip, trailer);

        // IP packet depth.
        let mut ip_out = vec![0xa5u8; ip_packet_len + 8];
        let ip_n = build_ip_packet(&case.packet, &slices, &mut ip_out).unwrap();
        prop_assert_eq!(&ip_out[..ip_n], &frame[eth_len..]);
        prop_assert!(ip_out[ip_n..].iter().all(|&b| b == 0xa5));
        let pi = parse_ip_packet(&ip_out[..ip_n]).unwrap();
        prop_assert_eq!(
            pi,
            ParsedPacket {
                ethernet: None,
                ..p
            }
        );

        // UDP payload depth: the kernel-socket path, with the ICRC computed from the socket's view.
        let udp_start = eth_len + ip_len + udp::HEADER_LEN;
        let mut udp_out = vec![0xa5u8; case.udp_payload_len() + 8];
        let udp_n = build_udp_payload(&case.packet, &slices, &mut udp_out).unwrap();
        prop_assert_eq!(&udp_out[..udp_n], &frame[udp_start..]);
        prop_assert!(udp_out[udp_n..].iter().all(|&b| b == 0xa5));
        let udp_payload = &udp_out[..udp_n];
        let pt = parse_udp_payload(udp_payload).unwrap();
        prop_assert_eq!(pt.transport, p.transport);
        prop_assert_eq!(pt.payload, p.payload);
        prop_assert_eq!(pt.icrc, p.icrc);
        prop_assert_eq!(icrc_of_udp_payload(&p.ip, &p.udp, udp_payload), Ok(p.icrc));
        // The zero-copy transmit view: headers, the payload in two pieces, the pad, apart.
        let hl = p.transport.header_len();
        let body = &udp_payload[..udp_n - icrc::ICRC_LEN];
        let (headers, after) = body.split_at(hl);
        let (pl, pad) = after.split_at(p.payload.len());
        let (a, b) = pl.split_at(pl.len() / 3);
        prop_assert_eq!(
            icrc_of_udp_payload_gather(&p.ip, &p.udp, headers, &[a, b, pad]),
            Ok(p.icrc)
        );
        prop_assert_eq!(
            icrc_of_udp_payload_gather(&p.ip, &p.udp, headers, &[a, pad]).is_err(),
            !b.is_empty()
        );
        // The builder's input repr (junk protocol and length) and changed masked fields (TTL, DSCP,
        // ECN, flow label) give the same ICRC.
        let mut socket_ip = case.packet.ip;
        match &mut socket_ip {
            IpRepr::Ipv4(r) => {
                r.hop_limit = r.hop_limit.wrapping_add(1);
                r.dscp ^= 0x3f;
                r.ecn = Ecn::Ce;
            }
            IpRepr::Ipv6(r) => {
                r.hop_limit = r.hop_limit.wrapping_add(1);
                r.dscp ^= 0x3f;
                r.ecn = Ecn::Ce;
                r.flow_label ^= 0xf_ffff;
            }
        }
        prop_assert_eq!(
            icrc_of_udp_payload(&socket_ip, &p.udp, udp_payload),
            Ok(p.icrc)
        );

        // The fuzz oracle agrees.
        fuzz_entry(frame);
        Ok(())
    }

    proptest! {
        #[test]
        fn random_packets_round_trip(case in arb_case()) {
            check_round_trip(&case)?;
        }

        /// The same, with the payload gathered from many empty and one-byte slices.
        #[test]
        fn round_trip_with_tiny_slices(
            case in arb_case(),
            split in prop_vec(0usize..3, 0..64),
        ) {
            let mut case = case;
            let mut at = 0;
            case.cuts.clear();
            for step in split {
                at = (at + step).min(case.payload.len());
                case.cuts.push(at);
            }
            check_round_trip(&case)?;
        }
    }

    // ---------------------------------------------------------------------------------------------
    // (b) Arbitrary and near-valid input: no panic, no silent misparse.

    /// What the builder makes of the packet that `bytes` (which parsed as `p`) hold: the same bytes
    /// with what the parser ignores cleared (IPv4 reserved flag, BTH resv6/resv7, DETH reserved byte,
    /// pad bytes), IPv4 options and Ethernet padding dropped, and checksums and ICRC recomputed.
    /// Computed from the raw bytes, not from `p`.
    fn normalised(bytes: &[u8], p: &ParsedPacket<'_>) -> Vec<u8> {
        let ip_start = ip_offset(bytes);
        let ip = &bytes[ip_start..];
        let mut out = bytes[..ip_start].to_vec();
        let ip_header_len = match ip[0] >> 4 {
            4 => {
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let total = usize::from(be16(ip, 2).unwrap());
                out.extend_from_slice(&ip[..ipv4::HEADER_LEN]);
                out.extend_from_slice(&ip[ihl..total]);
                out[ip_start] = 0x45;
                let new_total = (total - (ihl - ipv4::HEADER_LEN)) as u16;
                out[ip_start + 2..ip_start + 4].copy_from_slice(&new_total.to_be_bytes());
                out[ip_start + 6] &= 0x7f;
                ipv4::HEADER_LEN
            }
            _ => {
                let total = ipv6::HEADER_LEN + usize::from(be16(ip, 4).unwrap());
                out.extend_from_slice(&ip[..total]);
                ipv6::HEADER_LEN
            }
        };
        let bth_at = ip_start + ip_header_len + udp::HEADER_LEN;
        out[bth_at + 4] &= 0xc0;
        out[bth_at + 8] &= 0x80;
        if let Some(at) = p.transport.bth.opcode.ext_offsets().and_then(|o| o.deth) {
            out[bth_at + bth::HEADER_LEN + at + 4] = 0;
        }
        // Pad bytes: covered by the ICRC but not checked (neither does rxe); the builder writes 0.
        let pad_end = out.len() - icrc::ICRC_LEN;
        let pad_cnt = usize::from(out[bth_at + 1] >> 4 & 3);
        out[pad_end - pad_cnt..pad_end].fill(0);
        fix_checksums(&mut out);
        out
    }

    /// Checks that `bytes`, which parsed as `p`, is exactly what `p` rebuilds into (up to the
    /// normalisation of [`normalised`]).
    fn check_no_misparse(
        bytes: &[u8],
        p: &ParsedPacket<'_>,
    ) -> core::result::Result<(), TestCaseError> {
        let ethernet = p.ethernet.expect("parse_frame sets the Ethernet header");
        let udp_checksum_at = ip_offset(bytes)
            + match p.ip {
                IpRepr::Ipv4(_) => usize::from(bytes[ip_offset(bytes)] & 0x0f) * 4,
                IpRepr::Ipv6(_) => ipv6::HEADER_LEN,
            }
            + 6;
        let packet = PacketRepr {
            ip: p.ip,
            udp_src_port: p.udp.src_port,
            udp_checksum: be16(bytes, udp_checksum_at) != Some(0),
            transport: p.transport,
        };
        let mut out = vec![0u8; bytes.len() + 64];
        let len = build_frame(&ethernet, &packet, &[p.payload], &mut out)
            .map_err(|e| TestCaseError::fail(std::format!("rebuild: {e}")))?;
        let want = normalised(bytes, p);
        prop_assert_eq!(&out[..len], &want[..], "parsed {:?} from {:02x?}", p, bytes);
        Ok(())
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in prop_vec(any::<u8>(), 0..256)) {
            feed_all(&data);
        }

        /// Random bytes behind a plausible Ethernet + IPv4/IPv6 + UDP prefix, with the checksums and
        /// ICRC repaired, so they reach the transport checks.
        #[test]
        fn random_transport_never_panics(
            v6 in any::<bool>(),
            udp_payload in prop_vec(any::<u8>(), 0..128),
        ) {
            let base = if v6 {
                frame_v6(Opcode::RcSendOnly, &[], true)
            } else {
                frame_v4(Opcode::RcSendOnly, &[], false)
            };
            let frame = with_udp_payload(&base, &udp_payload);
            feed_all(&frame);
            if let Ok(p) = parse_frame(&frame) {
                check_no_misparse(&frame, &p)?;
            }
        }

        /// Valid frames, mutated: no parser panics; whatever still parses is exactly what its bytes
        /// say. With `repair`, the checksums and ICRC are recomputed after the mutation so that it
        /// reaches the checks behind them.
        #[test]
        fn mutated_frames_parse_exactly_or_fail(
            case in arb_case(),
            mutation in arb_mutation(),
            repair in any::<bool>(),
        ) {
            let mut out = vec![0u8; 9216];
            let len = build_frame(&case.ethernet, &case.packet, &case.slices(), &mut out).unwrap();
            let mut frame = mutation.apply(&out[..len]);
            if repair {
                fix_checksums(&mut frame);
            }
            feed_all(&frame);
            if let Ok(p) = parse_frame(&frame) {
                check_no_misparse(&frame, &p)?;
            }
        }
    }

    /// A frame of every opcode (IPv4 with, IPv6 without UDP checksum): each parses and is exactly what
    /// it rebuilds into, and every byte of it changed (three ways, with and without the checksums
    /// repaired afterwards) either fails to parse or parses exactly. `roce/tests/scapy_frames_mutated.rs`
    /// does the same from the scapy frames.
    #[test]
    fn every_byte_of_every_opcode_mutated() {
        for op in Opcode::ALL {
            let payload: &[u8] = if op.has_payload() {
                b"hello, rdma!!"
            } else {
                b""
            };
            for frame in [frame_v4(op, payload, true), frame_v6(op, payload, false)] {
                let p = parse_frame(&frame).unwrap();
                check_no_misparse(&frame, &p).unwrap();
                for at in 0..frame.len() {
                    for xor in [0x01u8, 0x80, 0xff] {
                        let mut m = frame.clone();
                        m[at] ^= xor;
                        for repair in [false, true] {
                            if repair {
                                fix_checksums(&mut m);
                            }
                            feed_all(&m);
                            if let Ok(p) = parse_frame(&m) {
                                check_no_misparse(&m, &p).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------------
    // (c) Every error path of the parser, with the exact error.

    const PAYLOAD_13: &[u8] = b"hello, rdma!!";

    /// Offset of the BTH in a frame without IPv4 options.
    fn bth_at(frame: &[u8]) -> usize {
        let ip_start = ip_offset(frame);
        let ip_len = if frame[ip_start] >> 4 == 4 {
            usize::from(frame[ip_start] & 0x0f) * 4
        } else {
            ipv6::HEADER_LEN
        };
        ip_start + ip_len + udp::HEADER_LEN
    }

    /// The UDP payload (BTH .. ICRC) of a frame without IPv4 options or Ethernet padding.
    fn udp_payload_of(frame: &[u8]) -> Vec<u8> {
        frame[bth_at(frame)..].to_vec()
    }

    fn set_be16(frame: &mut [u8], at: usize, value: u16) {
        frame[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }

    #[test]
    fn valid_frames_parse() {
        for op in Opcode::ALL {
            let payload: &[u8] = if op.has_payload() { PAYLOAD_13 } else { b"" };
            for frame in [frame_v4(op, payload, true), frame_v6(op, payload, false)] {
                let p = parse_frame(&frame).unwrap();
                assert_eq!(p.transport.bth.opcode, op);
                assert_eq!(p.transport.ext, ext_for(op));
                assert_eq!(p.payload, payload);
            }
        }
    }

    #[test]
    fn ethertype_not_ip_is_not_roce() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        for ethertype in [0x0806u16, 0x88b5, 0x88a8, 0x0000, 0x05dc, 0xffff] {
            let mut f = frame.clone();
            set_be16(&mut f, 12, ethertype);
            assert_eq!(parse_frame(&f), Err(Error::NotRoce), "{ethertype:#06x}");
        }
        // Q-in-Q: a second 802.1Q tag after the first.
        let vlan = ethernet_repr(Some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 100,
        }));
        let mut f = build(
            &vlan,
            &packet_repr(Opcode::RcSendOnly, ipv4_repr(), true),
            PAYLOAD_13,
        );
        set_be16(&mut f, 16, 0x8100);
        assert_eq!(parse_frame(&f), Err(Error::NotRoce));
    }

    #[test]
    fn short_ethernet_is_truncated() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        for len in 0..ethernet::HEADER_LEN {
            assert_eq!(
                parse_frame(&frame[..len]),
                Err(Error::Truncated {
                    layer: Layer::Ethernet,
                    need: 14,
                    got: len
                })
            );
        }
        let mut tagged = frame.clone();
        set_be16(&mut tagged, 12, 0x8100);
        for len in ethernet::HEADER_LEN..ethernet::VLAN_HEADER_LEN {
            assert_eq!(
                parse_frame(&tagged[..len]),
                Err(Error::Truncated {
                    layer: Layer::Vlan,
                    need: 18,
                    got: len
                })
            );
        }
        // An Ethernet header and nothing after it.
        assert_eq!(
            parse_frame(&frame[..ethernet::HEADER_LEN]),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: ipv4::HEADER_LEN,
                got: 0
            })
        );
    }

    #[test]
    fn ip_version_must_match_ethertype() {
        let v4 = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        let mut f = v4.clone();
        set_be16(&mut f, 12, 0x86dd);
        assert_eq!(
            parse_frame(&f),
            Err(Error::BadVersion {
                layer: Layer::Ipv6,
                version: 4
            })
        );
        let v6 = frame_v6(Opcode::RcSendOnly, PAYLOAD_13, true);
        let mut f = v6.clone();
        set_be16(&mut f, 12, 0x0800);
        assert_eq!(
            parse_frame(&f),
            Err(Error::BadVersion {
                layer: Layer::Ipv4,
                version: 6
            })
        );
        // parse_ip_packet on its own: empty input and versions other than 4 and 6.
        assert_eq!(
            parse_ip_packet(&[]),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: 20,
                got: 0
            })
        );
        for version in [0u8, 1, 5, 7, 15] {
            let mut ip = v4[14..].to_vec();
            ip[0] = (version << 4) | 5;
            assert_eq!(
                parse_ip_packet(&ip),
                Err(Error::BadVersion {
                    layer: Layer::Ipv4,
                    version
                })
            );
        }
    }

    #[test]
    fn udp_port_other_than_4791_is_not_roce() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true),
            frame_v6(Opcode::RcSendOnly, PAYLOAD_13, false),
        ] {
            let dport_at = bth_at(&frame) - udp::HEADER_LEN + 2;
            for port in [4790u16, 4792, 0, 0xffff, 0xb712] {
                let mut f = frame.clone();
                set_be16(&mut f, dport_at, port);
                fix_checksums(&mut f);
                assert_eq!(parse_frame(&f), Err(Error::NotRoce), "port {port}");
            }
        }
    }

    #[test]
    fn ip_protocol_other_than_udp_is_not_roce() {
        let mut f = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        f[14 + 9] = 6;
        fix_checksums(&mut f);
        assert_eq!(parse_frame(&f), Err(Error::NotRoce));
        // IPv6: an extension header (hop-by-hop, 0) in front of UDP.
        let mut f = frame_v6(Opcode::RcSendOnly, PAYLOAD_13, false);
        f[14 + 6] = 0;
        assert_eq!(parse_frame(&f), Err(Error::NotRoce));
    }

    #[test]
    fn bad_ipv4_header_checksum() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        for at in [14 + 10, 14 + 11, 14 + 4, 14 + 12] {
            let mut f = frame.clone();
            f[at] ^= 0x01;
            assert_eq!(
                parse_frame(&f),
                Err(Error::BadChecksum(Layer::Ipv4)),
                "byte {at}"
            );
        }
    }

    #[test]
    fn bad_udp_checksum() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true),
            frame_v6(Opcode::RcSendOnly, PAYLOAD_13, true),
        ] {
            let checksum_at = bth_at(&frame) - 2;
            let mut f = frame.clone();
            f[checksum_at] ^= 0x10;
            assert_eq!(parse_frame(&f), Err(Error::BadChecksum(Layer::Udp)));
            // A payload byte changed: the UDP checksum is checked before the ICRC.
            let mut f = frame.clone();
            let last_payload = f.len() - icrc::ICRC_LEN - 4;
            f[last_payload] ^= 0x01;
            assert_eq!(parse_frame(&f), Err(Error::BadChecksum(Layer::Udp)));
            // Zero means "not computed" on IPv4 and IPv6 alike (rxe sends zero over IPv6).
            let mut f = frame.clone();
            set_be16(&mut f, checksum_at, 0);
            assert!(parse_frame(&f).is_ok());
        }
    }

    #[test]
    fn bth_tver_must_be_zero() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true),
            frame_v6(Opcode::RcSendOnly, PAYLOAD_13, false),
        ] {
            for version in 1u8..16 {
                let mut f = frame.clone();
                let at = bth_at(&f) + 1;
                f[at] = (f[at] & 0xf0) | version;
                fix_checksums(&mut f);
                assert_eq!(
                    parse_frame(&f),
                    Err(Error::BadVersion {
                        layer: Layer::Bth,
                        version
                    })
                );
            }
        }
    }

    #[test]
    fn unknown_opcodes_are_rejected() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        let mut unknown = 0;
        for byte in 0..=255u8 {
            if Opcode::ALL.contains(&Opcode::from(byte)) {
                continue;
            }
            unknown += 1;
            let mut f = frame.clone();
            let at = bth_at(&f);
            f[at] = byte;
            fix_checksums(&mut f);
            assert_eq!(parse_frame(&f), Err(Error::UnknownOpcode(byte)));
            assert_eq!(
                parse_udp_payload(&f[at..]).map(|_| ()),
                Err(Error::UnknownOpcode(byte))
            );
        }
        assert_eq!(unknown, 256 - Opcode::ALL.len());
    }

    /// The error for a UDP payload whose extended headers (of `op`) are cut to `kept` bytes, followed by
    /// the 4-byte ICRC: the first header that does not fit in `kept + 4` bytes, else the ICRC.
    fn expected_ext_truncation(op: Opcode, kept: usize) -> Error {
        let offsets = op.ext_offsets().unwrap();
        let available = kept + icrc::ICRC_LEN;
        let headers = [
            (offsets.deth, deth::HEADER_LEN, Layer::Deth),
            (offsets.reth, reth::HEADER_LEN, Layer::Reth),
            (
                offsets.atomic_eth,
                atomic_eth::request::HEADER_LEN,
                Layer::AtomicEth,
            ),
            (offsets.aeth, aeth::HEADER_LEN, Layer::Aeth),
            (
                offsets.atomic_ack_eth,
                atomic_eth::ack::HEADER_LEN,
                Layer::AtomicAckEth,
            ),
            (offsets.immdt, immdt::HEADER_LEN, Layer::ImmDt),
            (offsets.ieth, ieth::HEADER_LEN, Layer::Ieth),
        ];
        for (at, len, layer) in headers {
            if let Some(at) = at {
                if at + len > available {
                    return Error::Truncated {
                        layer,
                        need: len,
                        got: available.saturating_sub(at),
                    };
                }
            }
        }
        Error::Truncated {
            layer: Layer::Icrc,
            need: bth::HEADER_LEN + offsets.payload + icrc::ICRC_LEN,
            got: bth::HEADER_LEN + available,
        }
    }

    #[test]
    fn truncated_extended_headers() {
        // Spot checks of the rule `expected_ext_truncation` encodes.
        assert_eq!(
            expected_ext_truncation(Opcode::RcRdmaWriteOnly, 0),
            Error::Truncated {
                layer: Layer::Reth,
                need: 16,
                got: 4
            }
        );
        assert_eq!(
            expected_ext_truncation(Opcode::RcAtomicAcknowledge, 4),
            Error::Truncated {
                layer: Layer::AtomicAckEth,
                need: 8,
                got: 4
            }
        );
        assert_eq!(
            expected_ext_truncation(Opcode::UdSendOnlyWithImmediate, 8),
            Error::Truncated {
                layer: Layer::Icrc,
                need: 28,
                got: 24
            }
        );
        let mut checked = 0;
        for op in Opcode::ALL {
            let ext_len = op.ext_headers_len();
            for frame in [frame_v4(op, b"", true), frame_v6(op, b"", false)] {
                let full = udp_payload_of(&frame);
                for kept in 0..ext_len {
                    let mut cut = full[..bth::HEADER_LEN + kept].to_vec();
                    cut.extend_from_slice(&[0x5a; icrc::ICRC_LEN]);
                    let f = with_udp_payload(&frame, &cut);
                    let want = expected_ext_truncation(op, kept);
                    assert_eq!(parse_frame(&f), Err(want), "{op:?} kept {kept}");
                    assert_eq!(parse_udp_payload(&cut).map(|_| ()), Err(want));
                    checked += 1;
                }
            }
        }
        assert!(checked > 100);
    }

    #[test]
    fn udp_payload_shorter_than_bth_and_icrc() {
        let frame = frame_v4(Opcode::RcSendOnly, b"", true);
        let full = udp_payload_of(&frame);
        for len in 0..bth::HEADER_LEN {
            assert_eq!(
                parse_frame(&with_udp_payload(&frame, &full[..len])),
                Err(Error::Truncated {
                    layer: Layer::Bth,
                    need: 12,
                    got: len
                })
            );
        }
        for len in bth::HEADER_LEN..bth::HEADER_LEN + icrc::ICRC_LEN {
            assert_eq!(
                parse_frame(&with_udp_payload(&frame, &full[..len])),
                Err(Error::Truncated {
                    layer: Layer::Icrc,
                    need: 16,
                    got: len
                })
            );
        }
    }

    #[test]
    fn pad_count_larger_than_payload() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, b"", true),
            frame_v6(Opcode::UcRdmaWriteMiddle, b"", true),
        ] {
            for pad_cnt in 1u8..4 {
                let mut f = frame.clone();
                let at = bth_at(&f) + 1;
                f[at] |= pad_cnt << 4;
                fix_checksums(&mut f);
                assert_eq!(
                    parse_frame(&f),
                    Err(Error::BadPad {
                        pad_cnt,
                        padded_len: 0
                    })
                );
            }
        }
        // Every PadCnt is fine on a 4-byte padded payload: it says 4 - PadCnt bytes are payload.
        let frame = frame_v4(Opcode::RcSendOnly, b"abcd", true);
        for pad_cnt in 0u8..4 {
            let mut f = frame.clone();
            let at = bth_at(&f) + 1;
            f[at] = (f[at] & 0xcf) | pad_cnt << 4;
            fix_checksums(&mut f);
            let p = parse_frame(&f).unwrap();
            assert_eq!(p.payload, &b"abcd"[..4 - usize::from(pad_cnt)]);
            assert_eq!(p.transport.bth.pad_cnt, pad_cnt);
        }
    }

    #[test]
    fn payload_not_a_multiple_of_four() {
        let frame = frame_v4(Opcode::RcSendOnly, b"12345678", true);
        let full = udp_payload_of(&frame);
        let (headers, rest) = full.split_at(bth::HEADER_LEN);
        let icrc_slot = &rest[rest.len() - icrc::ICRC_LEN..];
        for padded_len in [1usize, 2, 3, 5, 6, 7, 9, 4095] {
            let mut udp_payload = headers.to_vec();
            udp_payload.extend(core::iter::repeat_n(0x11, padded_len));
            udp_payload.extend_from_slice(icrc_slot);
            let f = with_udp_payload(&frame, &udp_payload);
            assert_eq!(
                parse_frame(&f),
                Err(Error::BadPad {
                    pad_cnt: 0,
                    padded_len
                })
            );
        }
    }

    #[test]
    fn payload_on_an_opcode_without_one() {
        let mut checked = 0;
        for op in Opcode::ALL.into_iter().filter(|op| !op.has_payload()) {
            for frame in [frame_v4(op, b"", true), frame_v6(op, b"", false)] {
                let full = udp_payload_of(&frame);
                let (body, icrc_slot) = full.split_at(full.len() - icrc::ICRC_LEN);
                for extra in [4usize, 8, 256] {
                    let mut udp_payload = body.to_vec();
                    udp_payload.extend(core::iter::repeat_n(0x22, extra));
                    udp_payload.extend_from_slice(icrc_slot);
                    let f = with_udp_payload(&frame, &udp_payload);
                    assert!(
                        matches!(
                            parse_frame(&f),
                            Err(Error::Malformed {
                                layer: Layer::Payload,
                                ..
                            })
                        ),
                        "{op:?} + {extra}: {:?}",
                        parse_frame(&f)
                    );
                    checked += 1;
                }
            }
        }
        // ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ request, COMPARE SWAP, FETCH ADD.
        assert_eq!(checked, 5 * 2 * 3);
    }

    #[test]
    fn bad_icrc() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, PAYLOAD_13, false),
            frame_v6(Opcode::UdSendOnly, PAYLOAD_13, false),
        ] {
            let good = parse_frame(&frame).unwrap().icrc;
            let len = frame.len();
            // The carried ICRC changed.
            let mut f = frame.clone();
            f[len - 1] ^= 0x01;
            assert_eq!(
                parse_frame(&f),
                Err(Error::BadIcrc {
                    computed: good,
                    received: good ^ 0x01
                })
            );
            // A covered byte changed (payload, BTH PSN, pad): the computed ICRC differs.
            for at in [len - 6, bth_at(&frame) + 11, len - 5] {
                let mut f = frame.clone();
                f[at] ^= 0x40;
                match parse_frame(&f) {
                    Err(Error::BadIcrc { computed, received }) => {
                        assert_eq!(received, good);
                        assert_ne!(computed, good);
                        let ip_start = ip_offset(&f);
                        assert_eq!(icrc::compute(&f[ip_start..len - 4]), Ok(computed));
                    }
                    other => panic!("byte {at}: {other:?}"),
                }
            }
        }
    }

    /// The fields the ICRC masks (a router may change them) parse to their new values; a covered
    /// field changed with only the IPv4 header checksum repaired is a bad ICRC.
    #[test]
    fn icrc_masks_exactly_the_variant_fields() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, false);
        let bth = bth_at(&frame);
        let mut f = frame.clone();
        f[14 + 1] = (40 << 2) | 3; // DSCP 40, ECN CE
        f[14 + 8] = 1; // TTL
        f[bth + 4] = 0xc0; // FECN, BECN
        fix_checksums(&mut f);
        let p = parse_frame(&f).unwrap();
        let IpRepr::Ipv4(ip) = p.ip else {
            panic!("IPv4")
        };
        assert_eq!((ip.dscp, ip.ecn, ip.hop_limit), (40, Ecn::Ce, 1));
        assert!(p.transport.bth.fecn && p.transport.bth.becn);
        assert_eq!(p.icrc, parse_frame(&frame).unwrap().icrc);

        let frame = frame_v6(Opcode::RcSendOnly, PAYLOAD_13, false);
        let mut f = frame.clone();
        f[14] = 0x6f; // traffic class high nibble
        f[15] = 0xff; // traffic class low nibble, flow label
        f[14 + 7] = 3; // hop limit
        let p = parse_frame(&f).unwrap();
        let IpRepr::Ipv6(ip) = p.ip else {
            panic!("IPv6")
        };
        assert_eq!((ip.dscp, ip.ecn, ip.hop_limit), (0x3f, Ecn::Ce, 3));
        assert_eq!(ip.flow_label & 0xf_0000, 0xf_0000);

        // IPv4 identification: covered.
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, false);
        let mut f = frame.clone();
        f[14 + 5] ^= 1;
        ipv4::Packet::new_unchecked(&mut f[14..]).fill_checksum();
        assert!(matches!(parse_frame(&f), Err(Error::BadIcrc { .. })));
    }

    #[test]
    fn ipv4_total_length_longer_than_buffer() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        let total = be16(&frame, 16).unwrap();
        for more in [1u16, 4, 1000] {
            let mut f = frame.clone();
            set_be16(&mut f, 16, total + more);
            fix_checksums(&mut f);
            assert_eq!(
                parse_frame(&f),
                Err(Error::Truncated {
                    layer: Layer::Ipv4,
                    need: usize::from(total + more),
                    got: usize::from(total)
                })
            );
        }
        // Longer, and the bytes are there: the UDP length no longer matches.
        let mut f = frame.clone();
        f.extend_from_slice(&[0; 4]);
        set_be16(&mut f, 16, total + 4);
        fix_checksums(&mut f);
        assert_eq!(parse_frame(&f), Err(Error::BadLength(Layer::Udp)));
        // The whole frame cut short.
        for cut in [1usize, 4, 20] {
            assert_eq!(
                parse_frame(&frame[..frame.len() - cut]),
                Err(Error::Truncated {
                    layer: Layer::Ipv4,
                    need: usize::from(total),
                    got: usize::from(total) - cut
                })
            );
        }
    }

    #[test]
    fn ipv4_total_length_shorter_than_buffer() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        let total = be16(&frame, 16).unwrap();
        let udp_len = usize::from(total) - 20;
        // Shorter than the UDP datagram.
        for less in [1u16, 4, 12] {
            let mut f = frame.clone();
            set_be16(&mut f, 16, total - less);
            fix_checksums(&mut f);
            assert_eq!(
                parse_frame(&f),
                Err(Error::Truncated {
                    layer: Layer::Udp,
                    need: udp_len,
                    got: udp_len - usize::from(less)
                })
            );
        }
        // Shorter than the IPv4 header, or IHL below 5.
        for bad in [0u16, 19] {
            let mut f = frame.clone();
            set_be16(&mut f, 16, bad);
            fix_checksums(&mut f);
            assert_eq!(parse_frame(&f), Err(Error::BadLength(Layer::Ipv4)));
        }
        let mut f = frame.clone();
        f[14] = 0x44;
        fix_checksums(&mut f);
        assert_eq!(parse_frame(&f), Err(Error::BadLength(Layer::Ipv4)));
        // Ethernet padding after the datagram is not part of it.
        let mut padded = frame.clone();
        padded.extend_from_slice(&[0xee; 17]);
        assert_eq!(parse_frame(&padded), parse_frame(&frame));
        assert!(parse_frame(&frame).is_ok());
    }

    #[test]
    fn ipv6_payload_length_mismatch() {
        let frame = frame_v6(Opcode::RcSendOnly, PAYLOAD_13, true);
        let len = be16(&frame, 18).unwrap();
        let mut f = frame.clone();
        set_be16(&mut f, 18, len + 1);
        assert_eq!(
            parse_frame(&f),
            Err(Error::Truncated {
                layer: Layer::Ipv6,
                need: 40 + usize::from(len) + 1,
                got: 40 + usize::from(len)
            })
        );
        let mut f = frame.clone();
        set_be16(&mut f, 18, len - 4);
        assert_eq!(
            parse_frame(&f),
            Err(Error::Truncated {
                layer: Layer::Udp,
                need: usize::from(len),
                got: usize::from(len) - 4
            })
        );
        let mut padded = frame.clone();
        padded.extend_from_slice(&[0xee; 9]);
        assert_eq!(parse_frame(&padded), parse_frame(&frame));
    }

    #[test]
    fn udp_length_mismatch() {
        for frame in [
            frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true),
            frame_v6(Opcode::RcSendOnly, PAYLOAD_13, true),
        ] {
            let len_at = bth_at(&frame) - 4;
            let udp_len = be16(&frame, len_at).unwrap();
            for bad in [0u16, 7] {
                let mut f = frame.clone();
                set_be16(&mut f, len_at, bad);
                fix_checksums(&mut f);
                assert_eq!(parse_frame(&f), Err(Error::BadLength(Layer::Udp)));
            }
            for less in [1u16, 4, udp_len - 8] {
                let mut f = frame.clone();
                set_be16(&mut f, len_at, udp_len - less);
                fix_checksums(&mut f);
                assert_eq!(parse_frame(&f), Err(Error::BadLength(Layer::Udp)));
            }
            for more in [1u16, 4, 100] {
                let mut f = frame.clone();
                set_be16(&mut f, len_at, udp_len + more);
                assert_eq!(
                    parse_frame(&f),
                    Err(Error::Truncated {
                        layer: Layer::Udp,
                        need: usize::from(udp_len + more),
                        got: usize::from(udp_len)
                    })
                );
            }
        }
    }

    #[test]
    fn ipv4_fragments_are_malformed() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        for flags_offset in [0x2000u16, 0x0001, 0x6000, 0x1fff] {
            let mut f = frame.clone();
            set_be16(&mut f, 14 + 6, flags_offset);
            fix_checksums(&mut f);
            assert!(
                matches!(
                    parse_frame(&f),
                    Err(Error::Malformed {
                        layer: Layer::Ipv4,
                        ..
                    })
                ),
                "{flags_offset:#06x}"
            );
        }
    }

    /// IPv4 options are accepted and covered by the ICRC unmasked (scapy does the same).
    #[test]
    fn ipv4_options_parse() {
        let frame = frame_v4(Opcode::RcSendOnly, PAYLOAD_13, true);
        let mut f = frame[..14 + 20].to_vec();
        f.extend_from_slice(&[0x94, 0x04, 0x00, 0x00]); // Router Alert
        f.extend_from_slice(&frame[14 + 20..]);
        f[14] = 0x46;
        let total = be16(&f, 16).unwrap() + 4;
        set_be16(&mut f, 16, total);
        fix_checksums(&mut f);
        let with_options = parse_frame(&f).unwrap();
        let plain = parse_frame(&frame).unwrap();
        assert_eq!(with_options.transport, plain.transport);
        assert_eq!(with_options.payload, plain.payload);
        assert_eq!(with_options.udp, plain.udp);
        assert_ne!(with_options.icrc, plain.icrc);
        // The options are covered.
        let mut g = f.clone();
        g[14 + 22] ^= 1;
        ipv4::Packet::new_unchecked(&mut g[14..]).fill_checksum();
        assert!(matches!(parse_frame(&g), Err(Error::BadIcrc { .. })));
    }

    #[test]
    fn vlan_tagged_frame_keeps_pcp() {
        for pcp in 0u8..8 {
            let tag = VlanTag {
                pcp,
                dei: pcp % 2 == 1,
                vid: 0x0a0 + u16::from(pcp),
            };
            for ip in [ipv4_repr(), ipv6_repr()] {
                let f = build(
                    &ethernet_repr(Some(tag)),
                    &packet_repr(Opcode::RcSendOnly, ip, true),
                    PAYLOAD_13,
                );
                assert_eq!(be16(&f, 12), Some(0x8100));
                assert_eq!(be16(&f, 14), Some(tag.tci()));
                let p = parse_frame(&f).unwrap();
                let e = p.ethernet.unwrap();
                assert_eq!(e.vlan, Some(tag));
                assert_eq!(e.vlan.unwrap().pcp, pcp);
                assert_eq!(p.payload, PAYLOAD_13);
                assert_eq!(
                    p.ip.header_len() + ethernet::VLAN_HEADER_LEN + p.ip.payload_len(),
                    f.len()
                );
            }
        }
    }

    #[test]
    fn icrc_of_udp_payload_gather_errors() {
        let udp_repr = |n| udp::Repr {
            src_port: 1,
            dst_port: udp::ROCEV2_PORT,
            payload_len: n,
        };
        let ip = ipv4_repr();
        assert!(matches!(
            icrc_of_udp_payload_gather(&ip, &udp_repr(15), &[0; 11], &[]),
            Err(Error::Truncated { .. })
        ));
        assert_eq!(
            icrc_of_udp_payload_gather(&ip, &udp_repr(16 + 29), &[0; 41], &[]),
            Err(Error::BadLength(Layer::Udp))
        );
        assert_eq!(
            icrc_of_udp_payload_gather(&ip, &udp_repr(20), &[0; 12], &[&[0; 3]]),
            Err(Error::BadLength(Layer::Udp))
        );
        let big = vec![0u8; 70_000];
        assert_eq!(
            icrc_of_udp_payload_gather(&ip, &udp_repr(16 + 70_000), &[0; 12], &[&big]),
            Err(Error::BadLength(Layer::Udp))
        );
        assert!(icrc_of_udp_payload_gather(&ip, &udp_repr(20), &[0; 12], &[&[0; 4]]).is_ok());
    }

    #[test]
    fn icrc_of_udp_payload_errors() {
        let udp_repr = udp::Repr {
            src_port: 0xc000,
            dst_port: udp::ROCEV2_PORT,
            payload_len: 0,
        };
        for len in 0..bth::HEADER_LEN + icrc::ICRC_LEN {
            assert_eq!(
                icrc_of_udp_payload(&ipv4_repr(), &udp_repr, &vec![0; len]),
                Err(Error::Truncated {
                    layer: Layer::Bth,
                    need: 16,
                    got: len
                })
            );
        }
        let big = vec![0u8; 65_536];
        let v4_max = ipv4::MAX_PAYLOAD_LEN - udp::HEADER_LEN;
        assert!(icrc_of_udp_payload(&ipv4_repr(), &udp_repr, &big[..v4_max]).is_ok());
        assert_eq!(
            icrc_of_udp_payload(&ipv4_repr(), &udp_repr, &big[..v4_max + 1]),
            Err(Error::BadLength(Layer::Udp))
        );
        let v6_max = ipv6::MAX_PAYLOAD_LEN - udp::HEADER_LEN;
        assert!(icrc_of_udp_payload(&ipv6_repr(), &udp_repr, &big[..v6_max]).is_ok());
        assert_eq!(
            icrc_of_udp_payload(&ipv6_repr(), &udp_repr, &big[..v6_max + 1]),
            Err(Error::BadLength(Layer::Udp))
        );
    }

    // ---------------------------------------------------------------------------------------------
    // (c) Build errors.

    #[test]
    fn buffer_too_small_at_every_length() {
        let tag = VlanTag {
            pcp: 5,
            dei: false,
            vid: 7,
        };
        for op in Opcode::ALL {
            let payload: &[u8] = if op.has_payload() { PAYLOAD_13 } else { b"" };
            let cut = payload.len().min(3);
            let slices: [&[u8]; 3] = [&payload[..cut], &payload[cut..cut], &payload[cut..]];
            for ip in [ipv4_repr(), ipv6_repr()] {
                let packet = packet_repr(op, ip, true);
                for vlan in [None, Some(tag)] {
                    let eth = ethernet_repr(vlan);
                    let frame = build(&eth, &packet, payload);
                    let eth_len = eth.buffer_len();
                    let udp_start = eth_len + ip.header_len() + udp::HEADER_LEN;
                    let mut out = vec![0u8; frame.len()];
                    for len in 0..frame.len() {
                        match build_frame(&eth, &packet, &slices, &mut out[..len]) {
                            Err(Error::BufferTooSmall { need, got }) => {
                                assert_eq!(got, len);
                                assert!(need > len && need <= frame.len(), "{need} {len}");
                            }
                            other => panic!("{op:?} len {len}: {other:?}"),
                        }
                    }
                    assert_eq!(
                        build_frame(&eth, &packet, &slices, &mut out),
                        Ok(frame.len())
                    );
                    assert_eq!(out, frame);
                    let ip_len = frame.len() - eth_len;
                    for len in 0..ip_len {
                        assert!(matches!(
                            build_ip_packet(&packet, &slices, &mut out[..len]),
                            Err(Error::BufferTooSmall { need, got }) if got == len && need > len
                        ));
                    }
                    let udp_len = frame.len() - udp_start;
                    for len in 0..udp_len {
                        assert_eq!(
                            build_udp_payload(&packet, &slices, &mut out[..len]),
                            Err(Error::BufferTooSmall {
                                need: udp_len,
                                got: len
                            })
                        );
                    }
                    for len in 0..udp_start {
                        assert_eq!(
                            emit_headers(Some(&eth), &packet, &slices, &mut out[..len]),
                            Err(Error::BufferTooSmall {
                                need: udp_start + bth::HEADER_LEN + op.ext_headers_len(),
                                got: len
                            })
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ext_headers_must_match_the_opcode() {
        let eth = ethernet_repr(None);
        let mut out = vec![0u8; 1024];
        let all = ExtHeaders::all();
        let mut checked = 0;
        for op in Opcode::ALL {
            let payload: &[u8] = if op.has_payload() { PAYLOAD_13 } else { b"" };
            let want = op.ext_headers();
            let full = {
                // Every header present; then each one toggled relative to what the opcode carries.
                let mut p = packet_repr(Opcode::RcCompareSwap, ipv4_repr(), true);
                p.transport.ext = ExtReprs {
                    deth: ext_for(Opcode::UdSendOnly).deth,
                    reth: ext_for(Opcode::RcRdmaWriteOnly).reth,
                    atomic_eth: ext_for(Opcode::RcCompareSwap).atomic_eth,
                    aeth: ext_for(Opcode::RcAcknowledge).aeth,
                    atomic_ack_eth: ext_for(Opcode::RcAtomicAcknowledge).atomic_ack_eth,
                    immdt: ext_for(Opcode::RcSendOnlyWithImmediate).immdt,
                    ieth: ext_for(Opcode::RcSendOnlyWithInvalidate).ieth,
                };
                p.transport.ext
            };
            for flag in all.iter() {
                let mut packet = packet_repr(op, ipv4_repr(), true);
                let ext = &mut packet.transport.ext;
                let toggle = !want.contains(flag);
                match flag {
                    ExtHeaders::DETH => ext.deth = full.deth.filter(|_| toggle),
                    ExtHeaders::RETH => ext.reth = full.reth.filter(|_| toggle),
                    ExtHeaders::ATOMIC_ETH => ext.atomic_eth = full.atomic_eth.filter(|_| toggle),
                    ExtHeaders::AETH => ext.aeth = full.aeth.filter(|_| toggle),
                    ExtHeaders::ATOMIC_ACK_ETH => {
                        ext.atomic_ack_eth = full.atomic_ack_eth.filter(|_| toggle)
                    }
                    ExtHeaders::IMMDT => ext.immdt = full.immdt.filter(|_| toggle),
                    ExtHeaders::IETH => ext.ieth = full.ieth.filter(|_| toggle),
                    _ => unreachable!(),
                }
                assert_eq!(
                    packet.transport.ext.present(),
                    want.symmetric_difference(flag)
                );
                let is_bth_malformed = |r: Result<usize>| {
                    matches!(
                        r,
                        Err(Error::Malformed {
                            layer: Layer::Bth,
                            ..
                        })
                    )
                };
                assert!(is_bth_malformed(packet.transport.check().map(|()| 0)));
                assert!(is_bth_malformed(packet.transport.emit(&mut out)));
                assert!(is_bth_malformed(build_frame(
                    &eth,
                    &packet,
                    &[payload],
                    &mut out
                )));
                assert!(is_bth_malformed(build_ip_packet(
                    &packet,
                    &[payload],
                    &mut out
                )));
                assert!(is_bth_malformed(build_udp_payload(
                    &packet,
                    &[payload],
                    &mut out
                )));
                assert!(is_bth_malformed(
                    emit_headers(Some(&eth), &packet, &[payload], &mut out).map(|(n, _)| n)
                ));
                checked += 1;
            }
        }
        assert_eq!(checked, Opcode::ALL.len() * 7);
    }

    #[test]
    fn payload_for_an_opcode_without_one() {
        let eth = ethernet_repr(None);
        let mut out = vec![0u8; 1024];
        for op in Opcode::ALL.into_iter().filter(|op| !op.has_payload()) {
            let packet = packet_repr(op, ipv6_repr(), true);
            let is_payload_malformed = |r: Result<usize>| {
                matches!(
                    r,
                    Err(Error::Malformed {
                        layer: Layer::Payload,
                        ..
                    })
                )
            };
            let cases: [&[&[u8]]; 3] = [&[b"x"], &[b"", b"abcd"], &[b"", b"", b"\0"]];
            for payload in cases {
                assert!(is_payload_malformed(build_frame(
                    &eth, &packet, payload, &mut out
                )));
                assert!(is_payload_malformed(build_ip_packet(
                    &packet, payload, &mut out
                )));
                assert!(is_payload_malformed(build_udp_payload(
                    &packet, payload, &mut out
                )));
                assert!(is_payload_malformed(
                    emit_headers(None, &packet, payload, &mut out).map(|(n, _)| n)
                ));
            }
            // Empty slices are no payload.
            assert!(build_frame(&eth, &packet, &[b"", b""], &mut out).is_ok());
            assert!(build_frame(&eth, &packet, &[], &mut out).is_ok());
        }
    }

    #[test]
    fn unknown_opcode_does_not_build() {
        let eth = ethernet_repr(None);
        let mut out = vec![0u8; 1024];
        // Unknown bytes, and a known byte wrapped as Unknown by hand.
        for raw in [0x18u8, 0x1f, 0x55, 0xc0, 0xff, 0x04] {
            let mut packet = packet_repr(Opcode::RcSendOnly, ipv4_repr(), true);
            packet.transport.bth.opcode = Opcode::Unknown(raw);
            assert_eq!(
                build_frame(&eth, &packet, &[b"abc"], &mut out),
                Err(Error::UnknownOpcode(raw))
            );
            assert_eq!(packet.transport.check(), Err(Error::UnknownOpcode(raw)));
        }
    }

    #[test]
    fn oversize_packet_is_bad_length() {
        let eth = ethernet_repr(None);
        let big = vec![0x5au8; 70_000];
        let mut out = vec![0u8; 70_000 + 200];
        // IPv4: 20 + UDP 8 + BTH 12 + payload + pad + ICRC 4 <= 65535.
        // IPv6: UDP 8 + BTH 12 + payload + pad + ICRC 4 <= 65535 (the IPv6 Payload Length).
        for (ip, max_payload, layer) in [
            (ipv4_repr(), 65_535 - 20 - 8 - 12 - 4, Layer::Ipv4),
            (ipv6_repr(), 65_535 - 8 - 12 - 4, Layer::Ipv6),
        ] {
            let packet = packet_repr(Opcode::RcSendOnly, ip, true);
            // The largest payload that fits, with its pad.
            let fits = max_payload - max_payload % 4;
            let len = build_frame(&eth, &packet, &[&big[..fits]], &mut out).unwrap();
            let p = parse_frame(&out[..len]).unwrap();
            assert_eq!(p.payload.len(), fits);
            assert_eq!(
                p.ip.header_len() + p.ip.payload_len(),
                65_535 - (max_payload % 4) + {
                    match layer {
                        Layer::Ipv4 => 0,
                        _ => ipv6::HEADER_LEN,
                    }
                }
            );
            for too_big in [fits + 1, fits + 4, 65_536, 70_000] {
                for slices in [&[&big[..too_big]][..], &[&big[..1], &big[1..too_big]]] {
                    assert_eq!(
                        build_frame(&eth, &packet, slices, &mut out),
                        Err(Error::BadLength(layer)),
                        "{too_big}"
                    );
                    assert_eq!(
                        build_udp_payload(&packet, slices, &mut out),
                        Err(Error::BadLength(layer))
                    );
                }
            }
        }
    }

    #[test]
    fn max_header_lengths_cover_every_opcode() {
        let longest = Opcode::ALL
            .iter()
            .map(|op| op.ext_headers_len())
            .max()
            .unwrap();
        assert_eq!(longest, MAX_EXT_HEADERS_LEN);
        assert_eq!(MAX_HEADERS_LEN, 18 + 40 + 8 + 12 + 28);
        for op in Opcode::ALL {
            let t = packet_repr(op, ipv4_repr(), false).transport;
            assert_eq!(t.header_len(), bth::HEADER_LEN + op.ext_headers_len());
            assert!(t.header_len() <= bth::HEADER_LEN + MAX_EXT_HEADERS_LEN);
        }
    }

    /// An IPv6 EtherType with nothing after the Ethernet header is truncated (the error names the
    /// layer `parse_ip_packet` guesses for empty input).
    #[test]
    fn ethernet_header_alone_is_truncated() {
        let frame = frame_v6(Opcode::RcSendOnly, PAYLOAD_13, false);
        assert!(matches!(
            parse_frame(&frame[..ethernet::HEADER_LEN]),
            Err(Error::Truncated { got: 0, .. })
        ));
        for len in ethernet::HEADER_LEN + 1..ethernet::HEADER_LEN + ipv6::HEADER_LEN {
            assert_eq!(
                parse_frame(&frame[..len]),
                Err(Error::Truncated {
                    layer: Layer::Ipv6,
                    need: 40,
                    got: len - ethernet::HEADER_LEN
                })
            );
        }
    }

    /// `BufferTooSmall::need` from `build_frame` and `build_ip_packet`: with room for the headers it
    /// is the whole packet; below that it is currently the header length only (see the report on
    /// this module's tests), so a caller must not size its buffer from a single error.
    #[test]
    fn buffer_too_small_reports_a_need_above_the_buffer() {
        let eth = ethernet_repr(None);
        let packet = packet_repr(Opcode::RcSendOnly, ipv4_repr(), true);
        let frame = build(&eth, &packet, PAYLOAD_13);
        let headers = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;
        let mut out = vec![0u8; frame.len()];
        assert_eq!(
            build_frame(&eth, &packet, &[PAYLOAD_13], &mut out[..headers]),
            Err(Error::BufferTooSmall {
                need: frame.len(),
                got: headers
            })
        );
        // The need is the whole frame at any size, and nothing is written before the check.
        let mut short = vec![0xa5u8; headers - 1];
        assert_eq!(
            build_frame(&eth, &packet, &[PAYLOAD_13], &mut short),
            Err(Error::BufferTooSmall {
                need: frame.len(),
                got: headers - 1
            })
        );
        assert!(short.iter().all(|&b| b == 0xa5), "a failed build wrote");
        let ip_len = frame.len() - ethernet::HEADER_LEN;
        assert_eq!(
            build_ip_packet(&packet, &[PAYLOAD_13], &mut short[..0]),
            Err(Error::BufferTooSmall {
                need: ip_len,
                got: 0
            })
        );
    }

    #[test]
    fn empty_ip_layer_is_truncated_at_the_ethertypes_layer() {
        let mut frame = [0u8; 14];
        frame[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(
            parse_frame(&frame),
            Err(Error::Truncated {
                layer: Layer::Ipv6,
                need: ipv6::HEADER_LEN,
                got: 0
            })
        );
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(
            parse_frame(&frame),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: ipv4::HEADER_LEN,
                got: 0
            })
        );
    }

    proptest! {
        /// Field values outside their wire width (DSCP > 63, flow label > 20 bits, PSN/QPN/MSN > 24
        /// bits, PCP > 7, VID > 12 bits, PadCnt junk, any AETH syndrome, NAK codes > 31) never make
        /// the builder panic or emit a frame that does not parse: each field is masked to its width,
        /// as the Repr docs say, and the frame parses to the masked values.
        #[test]
        fn out_of_range_fields_are_masked(
            case in arb_case(),
            dscp in any::<u8>(),
            flow_label in any::<u32>(),
            (psn, dest_qpn, pad_cnt) in (any::<u32>(), any::<u32>(), any::<u8>()),
            (pcp, vid) in (any::<u8>(), any::<u16>()),
            (syndrome_byte, nak_code, reserved, msn, src_qpn) in
                (any::<u8>(), any::<u8>(), any::<bool>(), any::<u32>(), any::<u32>()),
        ) {
            let mut case = case;
            let mut want = case.clone();
            match (&mut case.packet.ip, &mut want.packet.ip) {
                (IpRepr::Ipv4(r), IpRepr::Ipv4(w)) => {
                    r.dscp = dscp;
                    w.dscp = dscp & 0x3f;
                }
                (IpRepr::Ipv6(r), IpRepr::Ipv6(w)) => {
                    r.dscp = dscp;
                    w.dscp = dscp & 0x3f;
                    r.flow_label = flow_label;
                    w.flow_label = flow_label & 0xf_ffff;
                }
                _ => unreachable!(),
            }
            if let (Some(r), Some(w)) = (&mut case.ethernet.vlan, &mut want.ethernet.vlan) {
                r.pcp = pcp;
                w.pcp = pcp & 7;
                r.vid = vid;
                w.vid = vid & 0xfff;
            }
            let (bth, want_bth) = (&mut case.packet.transport.bth, &mut want.packet.transport.bth);
            bth.psn = psn;
            want_bth.psn = psn & 0xff_ffff;
            bth.dest_qpn = dest_qpn;
            want_bth.dest_qpn = dest_qpn & 0xff_ffff;
            bth.pad_cnt = pad_cnt;
            let ext = &mut case.packet.transport.ext;
            let want_ext = &mut want.packet.transport.ext;
            if let (Some(r), Some(w)) = (&mut ext.deth, &mut want_ext.deth) {
                r.src_qpn = src_qpn;
                w.src_qpn = src_qpn & 0xff_ffff;
            }
            if let (Some(r), Some(w)) = (&mut ext.aeth, &mut want_ext.aeth) {
                r.msn = msn;
                w.msn = msn & 0xff_ffff;
                // A syndrome the parser could produce, or a NAK with any code: one that fits its
                // 8-bit encoding builds and parses back as itself; one that does not (a NAK code
                // wider than 5 bits) is refused before anything is written.
                r.syndrome = if reserved {
                    Syndrome::from_byte(syndrome_byte)
                } else {
                    Syndrome::Nak(aeth::NakCode::from(nak_code))
                };
                w.syndrome = r.syndrome;
            }
            let fits = ext
                .aeth
                .is_none_or(|a| Syndrome::from_byte(a.syndrome.to_byte()) == a.syndrome);
            let mut out = vec![0u8; 9216];
            if !fits {
                let got = build_frame(&case.ethernet, &case.packet, &case.slices(), &mut out);
                prop_assert!(
                    matches!(got, Err(Error::Malformed { layer: Layer::Aeth, .. })),
                    "{:?}",
                    got
                );
                return Ok(());
            }
            let len = build_frame(&case.ethernet, &case.packet, &case.slices(), &mut out)
                .map_err(|e| TestCaseError::fail(std::format!("build_frame: {e}")))?;
            let p = parse_frame(&out[..len])
                .map_err(|e| TestCaseError::fail(std::format!("parse_frame: {e}")))?;
            prop_assert_eq!(p.ethernet, Some(want.expected_ethernet()));
            prop_assert_eq!(p.ip, want.expected_ip());
            prop_assert_eq!(p.transport, want.expected_transport());
            prop_assert_eq!(p.payload, &want.payload[..]);
        }
    }
}
