//! The IPv4 header (RFC 791), as RoCEv2 uses it.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------+-------+-----------+---+-------------------------------+
//! |Version|  IHL  |   DSCP    |ECN|          Total Length         |
//! +-------+-------+-----------+---+-----+-------------------------+
//! |         Identification        |Flags|     Fragment Offset     |
//! +---------------+---------------+-----+-------------------------+
//! |  Time to Live |    Protocol   |         Header Checksum       |
//! +---------------+---------------+-------------------------------+
//! |                       Source Address                          |
//! +---------------------------------------------------------------+
//! |                    Destination Address                        |
//! +---------------------------------------------------------------+
//! |                    Options (IHL > 5) ...                      |
//! +---------------------------------------------------------------+
//! ```
//!
//! * IHL is the header length in 32-bit words (5..=15); Total Length counts header and payload in
//!   bytes, so Ethernet padding after the datagram is not payload.
//! * The second byte is the old Type of Service byte, now DSCP (6 bits, RFC 2474) and ECN (2 bits,
//!   RFC 3168). RoCE uses DSCP to choose the lossless traffic class and ECN for congestion control:
//!   switches mark `CE`, and the receiver answers with a CNP (DCQCN, IBTA Annex A17.9).
//! * The header checksum (RFC 791, computed as in RFC 1071) covers the header only.
//! * RoCEv2 never fragments: packets are sized to the path MTU and sent with DF set (IBTA Annex A17),
//!   so [`Repr::parse`] rejects fragments.

use core::net::Ipv4Addr;

use crate::checksum;
use crate::error::{check_len, Error, Layer, Result};
use crate::wire_field::{read_array, read_u16, write_array, write_u16};

enum_with_unknown! {
    /// The IPv4 Protocol / IPv6 Next Header field (IANA "Assigned Internet Protocol Numbers").
    pub enum IpProtocol(u8) {
        /// ICMP (RFC 792).
        Icmp = 1,
        /// TCP (RFC 9293).
        Tcp = 6,
        /// UDP (RFC 768); RoCEv2 is carried in UDP.
        Udp = 17,
        /// ICMPv6 (RFC 4443), an IPv6 Next Header value: carries Neighbor Discovery ([`crate::ndisc`]).
        Icmpv6 = 58,
    }
}

/// The 2-bit Explicit Congestion Notification codepoint (RFC 3168 §5), in the low bits of the IPv4
/// TOS byte and of the IPv6 Traffic Class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Ecn {
    /// `00`: the transport is not ECN-capable.
    #[default]
    NotEct = 0,
    /// `01`: ECN-capable transport, ECT(1).
    Ect1 = 1,
    /// `10`: ECN-capable transport, ECT(0). RoCE senders (DCQCN) mark their packets ECT(0) or ECT(1).
    Ect0 = 2,
    /// `11`: Congestion Experienced, set by a congested switch.
    Ce = 3,
}

impl Ecn {
    /// The codepoint in the low 2 bits of `bits`; higher bits are ignored.
    pub const fn from_bits(bits: u8) -> Ecn {
        match bits & 0x3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The 2-bit codepoint.
    pub const fn bits(self) -> u8 {
        self as u8
    }

    /// Whether the sender declared an ECN-capable transport (ECT(0), ECT(1) or CE).
    pub const fn is_ect(self) -> bool {
        !matches!(self, Ecn::NotEct)
    }
}

impl From<Ecn> for u8 {
    fn from(ecn: Ecn) -> u8 {
        ecn.bits()
    }
}

pub(crate) mod field {
    use core::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Length of an IPv4 header without options, in bytes: 20 (IHL = 5; RFC 791 §3.1).
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// The largest payload an IPv4 header without options can describe, in bytes (65535 − 20).
pub const MAX_PAYLOAD_LEN: usize = u16::MAX as usize - HEADER_LEN;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A zero-copy view of an IPv4 packet (RFC 791 §3.1): the header (20 to 60 bytes with options), then
/// the payload up to Total Length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; getters may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks its lengths with [`Packet::check_len`].
    ///
    /// # Errors
    /// As [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the fixed header, the options and the Total Length all fit in the buffer and agree,
    /// so that every getter and [`Packet::payload`] are safe. It does not check the version or the
    /// checksum ([`Repr::parse`] does).
    ///
    /// # Errors
    /// * [`Error::Truncated`] when the buffer is shorter than 20 bytes, than IHL × 4, or than Total Length;
    /// * [`Error::BadLength`] when IHL < 5 or Total Length < IHL × 4.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_len(Layer::Ipv4, HEADER_LEN, len)?;
        let header_len = usize::from(self.header_len());
        if header_len < HEADER_LEN {
            return Err(Error::BadLength(Layer::Ipv4));
        }
        check_len(Layer::Ipv4, header_len, len)?;
        let total_len = usize::from(self.total_len());
        if total_len < header_len {
            return Err(Error::BadLength(Layer::Ipv4));
        }
        check_len(Layer::Ipv4, total_len, len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, field: core::ops::Range<usize>) -> u16 {
        read_u16(self.buffer.as_ref(), field)
    }

    /// The version field (high 4 bits of byte 0); 4 for IPv4.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// The header length in bytes: IHL (low 4 bits of byte 0, in 32-bit words) × 4, so 0..=60.
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// Differentiated Services Code Point, 6 bits (RFC 2474): the high bits of byte 1.
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// ECN codepoint, the low 2 bits of byte 1 (RFC 3168).
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.buffer.as_ref()[field::DSCP_ECN])
    }

    /// Total Length: header plus payload, in bytes (bytes 2..4).
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification (bytes 4..6).
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// The 3 flag bits (high bits of bytes 6..8): bit 2 reserved, bit 1 DF, bit 0 MF.
    pub fn flags(&self) -> u8 {
        (self.u16_at(field::FLG_OFF) >> 13) as u8
    }

    /// The Don't Fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// The More Fragments flag.
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// The fragment offset in **bytes** (the 13-bit field counts 8-byte units; this is field × 8).
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & FRAG_OFFSET_MASK) << 3
    }

    /// Time to Live (byte 8), the IPv4 hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload (byte 9).
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// The header checksum field (bytes 10..12).
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address (bytes 12..16).
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_array::<4>(self.buffer.as_ref(), field::SRC_ADDR))
    }

    /// Destination address (bytes 16..20).
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_array::<4>(self.buffer.as_ref(), field::DST_ADDR))
    }

    /// Whether the header checksum verifies: the ones-complement sum of the `header_len` header bytes,
    /// checksum included, is 0xffff (RFC 791, RFC 1071). Needs a checked view.
    pub fn verify_checksum(&self) -> bool {
        let header_len = usize::from(self.header_len());
        match self.buffer.as_ref().get(..header_len) {
            Some(header) => checksum::data(header) == 0xffff,
            None => false,
        }
    }

    /// The options bytes (between byte 20 and the end of the header); empty when IHL = 5.
    pub fn options(&self) -> &[u8] {
        let header_len = usize::from(self.header_len());
        &self.buffer.as_ref()[HEADER_LEN..header_len]
    }

    /// The payload: from the end of the header (options skipped) to Total Length, so padding that
    /// follows the datagram in the frame is excluded. Needs a checked view.
    pub fn payload(&self) -> &[u8] {
        let start = usize::from(self.header_len());
        let end = usize::from(self.total_len());
        &self.buffer.as_ref()[start..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_u16_at(&mut self, field: core::ops::Range<usize>, value: u16) {
        write_u16(self.buffer.as_mut(), field, value);
    }

    /// Sets the version (high 4 bits of byte 0).
    pub fn set_version(&mut self, version: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0x0f) | (version << 4);
    }

    /// Sets the header length, in bytes (written as IHL = `len` / 4; use a multiple of 4 in 20..=60).
    pub fn set_header_len(&mut self, len: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0xf0) | ((len / 4) & 0x0f);
    }

    /// Sets the DSCP (6 bits; higher bits are ignored).
    pub fn set_dscp(&mut self, dscp: u8) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & 0x03) | (dscp << 2);
    }

    /// Sets the ECN codepoint.
    pub fn set_ecn(&mut self, ecn: Ecn) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & 0xfc) | ecn.bits();
    }

    /// Sets the Total Length, in bytes.
    pub fn set_total_len(&mut self, len: u16) {
        self.set_u16_at(field::LENGTH, len);
    }

    /// Sets the Identification.
    pub fn set_ident(&mut self, ident: u16) {
        self.set_u16_at(field::IDENT, ident);
    }

    /// Clears the three flags and the fragment offset.
    pub fn clear_flags(&mut self) {
        self.set_u16_at(field::FLG_OFF, 0);
    }

    /// Sets or clears Don't Fragment.
    pub fn set_dont_frag(&mut self, value: bool) {
        let raw = self.u16_at(field::FLG_OFF);
        let raw = if value { raw | FLAG_DF } else { raw & !FLAG_DF };
        self.set_u16_at(field::FLG_OFF, raw);
    }

    /// Sets or clears More Fragments.
    pub fn set_more_frags(&mut self, value: bool) {
        let raw = self.u16_at(field::FLG_OFF);
        let raw = if value { raw | FLAG_MF } else { raw & !FLAG_MF };
        self.set_u16_at(field::FLG_OFF, raw);
    }

    /// Sets the fragment offset, in **bytes** (stored ÷ 8; use a multiple of 8).
    pub fn set_frag_offset(&mut self, offset: u16) {
        let raw = self.u16_at(field::FLG_OFF);
        let raw = (raw & !FRAG_OFFSET_MASK) | ((offset >> 3) & FRAG_OFFSET_MASK);
        self.set_u16_at(field::FLG_OFF, raw);
    }

    /// Sets the Time to Live.
    pub fn set_hop_limit(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the Protocol.
    pub fn set_protocol(&mut self, protocol: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol.into();
    }

    /// Sets the header checksum field.
    pub fn set_checksum(&mut self, checksum: u16) {
        self.set_u16_at(field::CHECKSUM, checksum);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        write_array(self.buffer.as_mut(), field::SRC_ADDR, addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        write_array(self.buffer.as_mut(), field::DST_ADDR, addr.octets());
    }

    /// Computes the header checksum over `header_len` bytes (options included) and stores it. Call it
    /// after every other header field is written.
    ///
    /// # Panics
    /// If the buffer is shorter than the header length.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let header_len = usize::from(self.header_len());
        let sum = checksum::data(&self.buffer.as_ref()[..header_len]);
        self.set_checksum(!sum);
    }

    /// The payload (header end to Total Length), mutable. Needs a checked view.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = usize::from(self.header_len());
        let end = usize::from(self.total_len());
        &mut self.buffer.as_mut()[start..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// A parsed IPv4 header (RFC 791 §3.1), as far as RoCEv2 needs it. Options are skipped on parse and
/// not emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol of the payload (UDP for RoCEv2).
    pub protocol: IpProtocol,
    /// Payload length in bytes: Total Length minus the header (with options) length.
    pub payload_len: usize,
    /// Time to Live.
    pub hop_limit: u8,
    /// DSCP, 6 bits (RFC 2474); higher bits are ignored on emit.
    pub dscp: u8,
    /// ECN codepoint (RFC 3168).
    pub ecn: Ecn,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment; RoCEv2 senders set it.
    pub dont_frag: bool,
}

impl Repr {
    /// Parses and validates an IPv4 header; never panics.
    ///
    /// Checks, in order: 20 bytes present, version 4, the lengths ([`Packet::check_len`]), the header
    /// checksum, and that the packet is not a fragment.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::BadLength`] as [`Packet::check_len`];
    /// [`Error::BadVersion`] when the version is not 4; [`Error::BadChecksum`] (layer `Ipv4`) when the
    /// header checksum does not verify; [`Error::Malformed`] for a fragment (MF set or offset != 0),
    /// since RoCEv2 is never fragmented.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        let buf = packet.buffer.as_ref();
        // Every field is read from this fixed 20-byte array: no per-field bounds checks.
        let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
            return Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: HEADER_LEN,
                got: buf.len(),
            });
        };
        let version = h[field::VER_IHL] >> 4;
        if version != 4 {
            return Err(Error::BadVersion {
                layer: Layer::Ipv4,
                version,
            });
        }
        packet.check_len()?;
        let header_len = usize::from(h[field::VER_IHL] & 0x0f) * 4;
        let checksum_ok = if header_len == HEADER_LEN {
            checksum::data(h) == 0xffff
        } else {
            packet.verify_checksum()
        };
        if !checksum_ok {
            return Err(Error::BadChecksum(Layer::Ipv4));
        }
        let flg_off = read_u16(h, field::FLG_OFF);
        if flg_off & (FLAG_MF | FRAG_OFFSET_MASK) != 0 {
            return Err(Error::Malformed {
                layer: Layer::Ipv4,
                what: "fragment (RoCEv2 is never fragmented)",
            });
        }
        let total_len = read_u16(h, field::LENGTH);
        let addr = |field| Ipv4Addr::from(read_array::<4>(h, field));
        Ok(Repr {
            src_addr: addr(field::SRC_ADDR),
            dst_addr: addr(field::DST_ADDR),
            protocol: IpProtocol::from(h[field::PROTOCOL]),
            // `check_len` guarantees Total Length >= the header length.
            payload_len: usize::from(total_len).saturating_sub(header_len),
            hop_limit: h[field::TTL],
            dscp: h[field::DSCP_ECN] >> 2,
            ecn: Ecn::from_bits(h[field::DSCP_ECN]),
            ident: read_u16(h, field::IDENT),
            dont_frag: flg_off & FLAG_DF != 0,
        })
    }

    /// Length of the header this emits, in bytes (20: no options).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header (IHL 5, no options, MF clear, offset 0) with its checksum into the
    /// first 20 bytes; the payload is not touched.
    ///
    /// # Panics
    /// If the buffer is shorter than 20 bytes, or `payload_len` exceeds [`MAX_PAYLOAD_LEN`] (65515).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        assert!(
            self.payload_len <= MAX_PAYLOAD_LEN,
            "IPv4 payload of {} bytes exceeds the 65535-byte Total Length",
            self.payload_len
        );
        // The header is assembled in a fixed array (no per-field bounds checks, a constant-length
        // checksum) and stored with one copy, whose 16-byte piece the ICRC pass of the packet builder
        // then loads back whole.
        let mut h = [0u8; HEADER_LEN];
        h[field::VER_IHL] = 0x40 | (HEADER_LEN / 4) as u8;
        h[field::DSCP_ECN] = (self.dscp << 2) | self.ecn.bits();
        write_u16(
            &mut h,
            field::LENGTH,
            (HEADER_LEN + self.payload_len) as u16,
        );
        write_u16(&mut h, field::IDENT, self.ident);
        let flags = if self.dont_frag { FLAG_DF } else { 0 };
        write_u16(&mut h, field::FLG_OFF, flags);
        h[field::TTL] = self.hop_limit;
        h[field::PROTOCOL] = self.protocol.into();
        write_array(&mut h, field::SRC_ADDR, self.src_addr.octets());
        write_array(&mut h, field::DST_ADDR, self.dst_addr.octets());
        let sum = checksum::data(&h);
        write_u16(&mut h, field::CHECKSUM, !sum);
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&h);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// The IPv4 packet inside the scapy RoCEv2 vector (see udp.rs for the whole frame):
    /// IP(tos=1, id=1144, flags='DF', ttl=64, src=dst='192.168.0.7') / UDP(49152 -> 4791) / BTH / ...
    /// followed here by two bytes of frame padding that are not part of the datagram.
    static ROCE: [u8; 66] = [
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00,
        0x07, 0xc0, 0xa8, 0x00, 0x07, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, 0x24, 0x60,
        0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, 0x46, 0x30, 0x81, 0x8b, 0xe2,
        0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50, 0x54, 0x01, 0xbe, 0x88, 0x5e, 0x50, 0x00, 0x00,
        0x78, 0xf3, 0x53, 0xf3, 0x00, 0x00,
    ];

    /// scapy: IP(src='10.0.0.1', dst='10.0.0.2', ttl=5, id=99, options=[IPOption_RR(routers=['1.2.3.4'])])
    /// / UDP(sport=1, dport=2) / Raw(b'xyz'): IHL 7, checksum 0x8e56.
    static WITH_OPTIONS: [u8; 39] = [
        0x47, 0x00, 0x00, 0x27, 0x00, 0x63, 0x00, 0x00, 0x05, 0x11, 0x8e, 0x56, 0x0a, 0x00, 0x00,
        0x01, 0x0a, 0x00, 0x00, 0x02, 0x07, 0x07, 0x04, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x01,
        0x00, 0x02, 0x00, 0x0b, 0xf9, 0x58, 0x78, 0x79, 0x7a,
    ];

    const HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 7);

    fn roce_repr() -> Repr {
        Repr {
            src_addr: HOST,
            dst_addr: HOST,
            protocol: IpProtocol::Udp,
            payload_len: 44,
            hop_limit: 64,
            dscp: 0,
            ecn: Ecn::Ect1,
            ident: 1144,
            dont_frag: true,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&ROCE[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp(), 0);
        assert_eq!(p.ecn(), Ecn::Ect1);
        assert_eq!(p.total_len(), 64);
        assert_eq!(p.ident(), 1144);
        assert_eq!(p.flags(), 0b010);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.frag_offset(), 0);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.protocol(), IpProtocol::Udp);
        assert_eq!(p.checksum(), 0xb4d5);
        assert_eq!(p.src_addr(), HOST);
        assert_eq!(p.dst_addr(), HOST);
        assert!(p.verify_checksum());
        assert!(p.options().is_empty());
        assert_eq!(p.payload(), &ROCE[20..64]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xa5u8; 66];
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_version(4);
        p.set_header_len(20);
        p.set_dscp(0);
        p.set_ecn(Ecn::Ect1);
        p.set_total_len(64);
        p.set_ident(1144);
        p.clear_flags();
        p.set_dont_frag(true);
        p.set_hop_limit(64);
        p.set_protocol(IpProtocol::Udp);
        p.set_src_addr(HOST);
        p.set_dst_addr(HOST);
        p.fill_checksum();
        p.payload_mut().copy_from_slice(&ROCE[20..64]);
        assert_eq!(bytes[..64], ROCE[..64]);
        assert_eq!(bytes[64..], [0xa5, 0xa5]);
    }

    #[test]
    fn parse_and_emit() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ROCE[..])),
            Ok(roce_repr())
        );
        let mut bytes = [0xa5u8; 64];
        let repr = roce_repr();
        assert_eq!(repr.buffer_len(), 20);
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..20], ROCE[..20]);
        assert_eq!(bytes[20..], [0xa5; 44]);
    }

    #[test]
    fn options_are_skipped() {
        let p = Packet::new_checked(&WITH_OPTIONS[..]).unwrap();
        assert_eq!(p.header_len(), 28);
        assert_eq!(p.options(), &WITH_OPTIONS[20..28]);
        assert_eq!(p.payload(), &WITH_OPTIONS[28..]);
        let repr = Repr::parse(&p).unwrap();
        assert_eq!(repr.payload_len, 11);
        assert_eq!(repr.hop_limit, 5);
        assert_eq!(repr.ident, 99);
        assert!(!repr.dont_frag);
        // Recomputing the checksum over the options gives scapy's value.
        let mut bytes = WITH_OPTIONS;
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_checksum(0);
        p.fill_checksum();
        assert_eq!(p.checksum(), 0x8e56);
    }

    #[test]
    fn scapy_odd_payload_checksum() {
        // scapy: IP(src='10.0.0.1', dst='10.0.0.2', tos=0x0a, id=0x1234, flags=0, ttl=17) / UDP / 'abcdefg'.
        let header = [
            0x45, 0x0a, 0x00, 0x23, 0x12, 0x34, 0x00, 0x00, 0x11, 0x11, 0x83, 0x8a, 0x0a, 0x00,
            0x00, 0x01, 0x0a, 0x00, 0x00, 0x02,
        ];
        let repr = Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            protocol: IpProtocol::Udp,
            payload_len: 15,
            hop_limit: 17,
            dscp: 2,
            ecn: Ecn::Ect0,
            ident: 0x1234,
            dont_frag: false,
        };
        let mut bytes = [0xa5u8; 20];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, header);
    }

    #[test]
    fn errors() {
        let parse = |b: &[u8]| Repr::parse(&Packet::new_unchecked(b));
        assert_eq!(
            parse(&ROCE[..19]),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: 20,
                got: 19
            })
        );
        assert_eq!(
            parse(&ROCE[..63]),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: 64,
                got: 63
            })
        );
        assert_eq!(
            parse(&WITH_OPTIONS[..24]),
            Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: 28,
                got: 24
            })
        );

        let mut b = ROCE;
        b[0] = 0x65;
        assert_eq!(
            parse(&b),
            Err(Error::BadVersion {
                layer: Layer::Ipv4,
                version: 6
            })
        );

        let mut b = ROCE;
        b[0] = 0x44;
        assert_eq!(parse(&b), Err(Error::BadLength(Layer::Ipv4)));

        let mut b = ROCE;
        b[3] = 19; // Total Length below the header length.
        assert_eq!(parse(&b), Err(Error::BadLength(Layer::Ipv4)));

        let mut b = ROCE;
        b[11] ^= 1;
        assert_eq!(parse(&b), Err(Error::BadChecksum(Layer::Ipv4)));

        for (more, offset) in [(true, 0), (false, 8), (true, 1480)] {
            let mut b = ROCE;
            let mut p = Packet::new_unchecked(&mut b[..]);
            p.set_more_frags(more);
            p.set_frag_offset(offset);
            p.fill_checksum();
            assert_eq!(p.more_frags(), more);
            assert_eq!(p.frag_offset(), offset);
            assert_eq!(
                parse(&b),
                Err(Error::Malformed {
                    layer: Layer::Ipv4,
                    what: "fragment (RoCEv2 is never fragmented)"
                })
            );
        }
    }

    #[test]
    fn ecn_bits() {
        for bits in 0..4u8 {
            assert_eq!(Ecn::from_bits(bits).bits(), bits);
            assert_eq!(u8::from(Ecn::from_bits(bits | 0xfc)), bits);
        }
        assert!(Ecn::Ce.is_ect());
        assert!(!Ecn::NotEct.is_ect());
        assert_eq!(u8::from(IpProtocol::Udp), 17);
        assert_eq!(IpProtocol::from(132), IpProtocol::Unknown(132));
    }

    fn arb_repr() -> impl Strategy<Value = Repr> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            0usize..=MAX_PAYLOAD_LEN,
            any::<u8>(),
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
        )
            .prop_map(|(src, dst, proto, len, ttl, dscp, ecn, ident, df)| Repr {
                src_addr: Ipv4Addr::from(src),
                dst_addr: Ipv4Addr::from(dst),
                protocol: IpProtocol::from(proto),
                payload_len: len,
                hop_limit: ttl,
                dscp,
                ecn: Ecn::from_bits(ecn),
                ident,
                dont_frag: df,
            })
    }

    proptest! {
        #[test]
        fn repr_round_trip(repr in arb_repr()) {
            // Only the header is written; the view needs Total Length bytes to be valid.
            let mut bytes = [0xa5u8; 65535];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            let p = Packet::new_checked(&bytes[..HEADER_LEN + repr.payload_len]).unwrap();
            prop_assert!(p.verify_checksum());
            prop_assert_eq!(Repr::parse(&p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = p.payload();
                let _ = p.options();
                let _ = p.verify_checksum();
                let _ = Repr::parse(&p);
            }
            let _ = Repr::parse(&Packet::new_unchecked(&bytes[..]));
        }

        #[test]
        fn valid_headers_with_random_fields_never_panic(
            head in any::<[u8; 20]>(),
            extra in 0usize..60,
        ) {
            // Start from random header bytes but force version 4 so that the length checks run.
            let mut bytes = [0u8; 80];
            bytes[..20].copy_from_slice(&head);
            bytes[0] = 0x40 | (bytes[0] & 0x0f);
            let _ = Repr::parse(&Packet::new_unchecked(&bytes[..20 + extra]));
        }
    }
}
