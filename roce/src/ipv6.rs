//! The IPv6 fixed header (RFC 8200 §3), as RoCEv2 uses it.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------+-----------+---+---------------------------------------+
//! |Version|   DSCP    |ECN|              Flow Label               |
//! +-------+-----------+---+-----------+---------------+-----------+
//! |         Payload Length            |  Next Header  | Hop Limit |
//! +-----------------------------------+---------------+-----------+
//! |                  Source Address (16 bytes)                    |
//! +---------------------------------------------------------------+
//! |               Destination Address (16 bytes)                  |
//! +---------------------------------------------------------------+
//! ```
//!
//! * The 8-bit Traffic Class is DSCP (6 bits, RFC 2474) and ECN (2 bits, RFC 3168), as in IPv4.
//! * Payload Length counts the bytes after this 40-byte header; Ethernet padding beyond it is not
//!   payload.
//! * In RoCEv2 the IPv6 header plays the role of the InfiniBand GRH: the source and destination
//!   addresses are the GIDs, and the flow label may carry flow entropy (IBTA Annex A17).
//!
//! Extension headers are not parsed: RoCEv2 places the UDP header directly after the fixed header
//! (IBTA Annex A17), so a packet whose Next Header is anything but UDP (an extension header
//! included) is reported with its Next Header value and the upper layer returns
//! [`crate::Error::NotRoce`]. Jumbograms (Payload Length 0 with a Hop-by-Hop Jumbo option, RFC 2675)
//! are likewise not RoCE.

use core::net::Ipv6Addr;

use crate::error::{check_len, Error, Layer, Result};
pub use crate::ipv4::{Ecn, IpProtocol};
use crate::wire_field::{read_array, read_u16, read_u32, write_array, write_u16, write_u32};

pub(crate) mod field {
    use core::ops::Range;

    /// Version (4 bits), Traffic Class (8 bits), Flow Label (20 bits).
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// Length of the IPv6 fixed header, in bytes: 40 (RFC 8200 §3).
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// The largest payload the 16-bit Payload Length can describe, in bytes.
pub const MAX_PAYLOAD_LEN: usize = u16::MAX as usize;
/// Mask of the 20-bit flow label.
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// A zero-copy view of an IPv6 packet (RFC 8200 §3): the 40-byte fixed header, then Payload Length
/// bytes of payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; getters may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks its length with [`Packet::check_len`].
    ///
    /// # Errors
    /// As [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the 40-byte header and the Payload Length bytes after it fit in the buffer, so that
    /// every getter and [`Packet::payload`] are safe. It does not check the version.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Ipv6`) when the buffer is shorter than 40 bytes or than
    /// 40 + Payload Length.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_len(Layer::Ipv6, HEADER_LEN, len)?;
        check_len(
            Layer::Ipv6,
            HEADER_LEN + usize::from(self.payload_len()),
            len,
        )
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn first_word(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VER_TC_FLOW)
    }

    /// The version field (high 4 bits of byte 0); 6 for IPv6.
    pub fn version(&self) -> u8 {
        (self.first_word() >> 28) as u8
    }

    /// The 8-bit Traffic Class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.first_word() >> 20) as u8
    }

    /// DSCP, the high 6 bits of the Traffic Class (RFC 2474).
    pub fn dscp(&self) -> u8 {
        self.traffic_class() >> 2
    }

    /// ECN codepoint, the low 2 bits of the Traffic Class (RFC 3168).
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.traffic_class())
    }

    /// The 20-bit flow label (RFC 6437).
    pub fn flow_label(&self) -> u32 {
        self.first_word() & FLOW_LABEL_MASK
    }

    /// Payload Length: bytes after the 40-byte header (bytes 4..6).
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// Next Header (byte 6): the protocol of the payload, UDP for RoCEv2.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::NXT_HDR])
    }

    /// Hop Limit (byte 7).
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address (bytes 8..24): the source GID in RoCEv2.
    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), field::SRC_ADDR))
    }

    /// Destination address (bytes 24..40): the destination GID in RoCEv2.
    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), field::DST_ADDR))
    }

    /// The payload: the Payload Length bytes after the header (padding after them excluded). Needs a
    /// checked view.
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_first_word(&mut self, mask: u32, value: u32) {
        let word = (self.first_word() & !mask) | (value & mask);
        write_u32(self.buffer.as_mut(), field::VER_TC_FLOW, word);
    }

    /// Sets the version (4 bits).
    pub fn set_version(&mut self, version: u8) {
        self.set_first_word(0xf000_0000, u32::from(version) << 28);
    }

    /// Sets the whole Traffic Class byte.
    pub fn set_traffic_class(&mut self, tc: u8) {
        self.set_first_word(0x0ff0_0000, u32::from(tc) << 20);
    }

    /// Sets the DSCP (6 bits; higher bits are ignored).
    pub fn set_dscp(&mut self, dscp: u8) {
        self.set_first_word(0x0fc0_0000, u32::from(dscp) << 22);
    }

    /// Sets the ECN codepoint.
    pub fn set_ecn(&mut self, ecn: Ecn) {
        self.set_first_word(0x0030_0000, u32::from(ecn.bits()) << 20);
    }

    /// Sets the flow label (20 bits; higher bits are ignored).
    pub fn set_flow_label(&mut self, label: u32) {
        self.set_first_word(FLOW_LABEL_MASK, label);
    }

    /// Sets the Payload Length, in bytes.
    pub fn set_payload_len(&mut self, len: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the Next Header.
    pub fn set_next_header(&mut self, next_header: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = next_header.into();
    }

    /// Sets the Hop Limit.
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = hop_limit;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv6Addr) {
        write_array(self.buffer.as_mut(), field::SRC_ADDR, addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) {
        write_array(self.buffer.as_mut(), field::DST_ADDR, addr.octets());
    }

    /// The payload (Payload Length bytes after the header), mutable. Needs a checked view.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// A parsed IPv6 fixed header (RFC 8200 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source address (source GID).
    pub src_addr: Ipv6Addr,
    /// Destination address (destination GID).
    pub dst_addr: Ipv6Addr,
    /// Next Header (UDP for RoCEv2; an extension header shows up here as an unknown protocol).
    pub next_header: IpProtocol,
    /// Payload Length in bytes.
    pub payload_len: usize,
    /// Hop Limit.
    pub hop_limit: u8,
    /// DSCP, the high 6 bits of the Traffic Class; higher bits are ignored on emit.
    pub dscp: u8,
    /// ECN, the low 2 bits of the Traffic Class.
    pub ecn: Ecn,
    /// Flow label, 20 bits; higher bits are ignored on emit.
    pub flow_label: u32,
}

impl Repr {
    /// Parses an IPv6 fixed header; never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Ipv6`) when the header or the declared payload does not fit;
    /// [`Error::BadVersion`] when the version is not 6.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        check_len(Layer::Ipv6, HEADER_LEN, packet.buffer.as_ref().len())?;
        if packet.version() != 6 {
            return Err(Error::BadVersion {
                layer: Layer::Ipv6,
                version: packet.version(),
            });
        }
        packet.check_len()?;
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            dscp: packet.dscp(),
            ecn: packet.ecn(),
            flow_label: packet.flow_label(),
        })
    }

    /// Length of the header this emits, in bytes (40).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte fixed header; the payload is not touched.
    ///
    /// # Panics
    /// If the buffer is shorter than 40 bytes, or `payload_len` exceeds [`MAX_PAYLOAD_LEN`] (65535).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        assert!(
            self.payload_len <= MAX_PAYLOAD_LEN,
            "IPv6 payload of {} bytes exceeds the 16-bit Payload Length",
            self.payload_len
        );
        packet.set_version(6);
        packet.set_dscp(self.dscp);
        packet.set_ecn(self.ecn);
        packet.set_flow_label(self.flow_label);
        packet.set_payload_len(self.payload_len as u16);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// scapy: IPv6(src='fd00::1', dst='fd00::2', tc=0x62, fl=0x12345, hlim=64) / UDP(sport=0xc123,
    /// dport=4791, chksum=0) / BTH ... (see udp.rs for the whole frame); the IPv6 header and the first
    /// four payload bytes.
    static HEADER: [u8; 44] = [
        0x66, 0x21, 0x23, 0x45, 0x00, 0x2c, 0x11, 0x40, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xc1, 0x23, 0x12, 0xb7,
    ];

    const SRC: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
    const DST: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

    fn repr() -> Repr {
        Repr {
            src_addr: SRC,
            dst_addr: DST,
            next_header: IpProtocol::Udp,
            payload_len: 44,
            hop_limit: 64,
            dscp: 0x18,
            ecn: Ecn::Ect0,
            flow_label: 0x12345,
        }
    }

    /// The header followed by a 44-byte payload of 0x5a and two bytes of frame padding.
    fn packet_bytes() -> [u8; 86] {
        let mut b = [0x5au8; 86];
        b[..40].copy_from_slice(&HEADER[..40]);
        b[84] = 0;
        b[85] = 0;
        b
    }

    #[test]
    fn deconstruct() {
        let bytes = packet_bytes();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0x62);
        assert_eq!(p.dscp(), 0x18);
        assert_eq!(p.ecn(), Ecn::Ect0);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.payload_len(), 44);
        assert_eq!(p.next_header(), IpProtocol::Udp);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr(), SRC);
        assert_eq!(p.dst_addr(), DST);
        assert_eq!(p.payload(), &[0x5a; 44]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xa5u8; 44];
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_version(6);
        p.set_traffic_class(0);
        p.set_dscp(0x18);
        p.set_ecn(Ecn::Ect0);
        p.set_flow_label(0x12345);
        p.set_payload_len(44);
        p.set_next_header(IpProtocol::Udp);
        p.set_hop_limit(64);
        p.set_src_addr(SRC);
        p.set_dst_addr(DST);
        assert_eq!(bytes[..40], HEADER[..40]);
        assert_eq!(bytes[40..], [0xa5; 4]);

        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_traffic_class(0x62);
        assert_eq!(p.dscp(), 0x18);
        assert_eq!(p.ecn(), Ecn::Ect0);
        assert_eq!(p.flow_label(), 0x12345);
    }

    #[test]
    fn parse_and_emit() {
        let bytes = packet_bytes();
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bytes[..])), Ok(repr()));
        let mut out = [0xa5u8; 44];
        assert_eq!(repr().buffer_len(), 40);
        repr().emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out[..40], HEADER[..40]);
        assert_eq!(out[40..], [0xa5; 4]);
    }

    #[test]
    fn errors() {
        let bytes = packet_bytes();
        let parse = |b: &[u8]| Repr::parse(&Packet::new_unchecked(b));
        assert_eq!(
            parse(&bytes[..39]),
            Err(Error::Truncated {
                layer: Layer::Ipv6,
                need: 40,
                got: 39
            })
        );
        assert_eq!(
            parse(&bytes[..83]),
            Err(Error::Truncated {
                layer: Layer::Ipv6,
                need: 84,
                got: 83
            })
        );
        assert!(parse(&bytes[..84]).is_ok());
        let mut b = bytes;
        b[0] = 0x45;
        assert_eq!(
            parse(&b),
            Err(Error::BadVersion {
                layer: Layer::Ipv6,
                version: 4
            })
        );
        // A Hop-by-Hop extension header is reported as an unknown Next Header, not parsed.
        let mut b = bytes;
        b[6] = 0;
        assert_eq!(parse(&b).map(|r| r.next_header), Ok(IpProtocol::Unknown(0)));
    }

    fn arb_repr() -> impl Strategy<Value = Repr> {
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            0usize..=2000,
            any::<u8>(),
            0u8..64,
            0u8..4,
            0u32..=FLOW_LABEL_MASK,
        )
            .prop_map(|(src, dst, nh, len, hl, dscp, ecn, fl)| Repr {
                src_addr: Ipv6Addr::from(src),
                dst_addr: Ipv6Addr::from(dst),
                next_header: IpProtocol::from(nh),
                payload_len: len,
                hop_limit: hl,
                dscp,
                ecn: Ecn::from_bits(ecn),
                flow_label: fl,
            })
    }

    proptest! {
        #[test]
        fn repr_round_trip(repr in arb_repr()) {
            let mut bytes = [0xa5u8; 2040];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            let p = Packet::new_checked(&bytes[..HEADER_LEN + repr.payload_len]).unwrap();
            prop_assert_eq!(Repr::parse(&p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = p.payload();
                let _ = Repr::parse(&p);
            }
            let _ = Repr::parse(&Packet::new_unchecked(&bytes[..]));
        }
    }
}
