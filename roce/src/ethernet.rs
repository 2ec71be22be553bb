//! Ethernet II frames (IEEE 802.3 clause 3.2.6, "Length/Type" used as a type) with an optional
//! IEEE 802.1Q VLAN tag.
//!
//! RoCEv2 rides on ordinary Ethernet: the frame carries IPv4 (EtherType 0x0800) or IPv6 (0x86DD), and
//! lossless RoCE fabrics usually add an 802.1Q tag whose priority code point (PCP) selects the
//! priority that Priority Flow Control (IEEE 802.1Qbb) protects.
//!
//! ```text
//!  0                   6                   12      14
//! +-------------------+-------------------+-------+----------------------------
//! | destination MAC   | source MAC        | type  | payload (46..1500+ bytes)
//! +-------------------+-------------------+-------+----------------------------
//!
//! with one 802.1Q tag (TPID 0x8100, then the 16-bit TCI = PCP:3 | DEI:1 | VID:12):
//! +-------------------+-------------------+-------+-------+-------+------------
//! | destination MAC   | source MAC        | 8100  | TCI   | type  | payload
//! +-------------------+-------------------+-------+-------+-------+------------
//!  0                   6                   12      14      16      18
//! ```
//!
//! The frame check sequence (FCS) is not part of these buffers: NICs and sockets strip it. Frames
//! shorter than the 60-byte minimum are padded by the sender; the IP layers ignore the padding because
//! they honour their own length fields.
//!
//! Only a single tag is understood. A second tag (an inner 0x8100 after the first, Q-in-Q) or an
//! 802.1ad service tag (0x88A8) is reported as the payload's EtherType ([`EtherType::Vlan`] or
//! [`EtherType::Unknown`]), which the upper layers treat as "not RoCE" ([`crate::Error::NotRoce`]).
//! Values below 0x0600 are IEEE 802.3 length fields rather than types; they also come back as
//! [`EtherType::Unknown`].

use core::fmt;

use crate::error::{check_len, Layer, Result};
use crate::wire_field::{read_array, read_u16, write_array, write_u16};

/// A 48-bit IEEE 802 MAC address (IEEE 802-2014 §8), in transmission byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Address(pub [u8; 6]);

impl Address {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Address = Address([0xff; 6]);
    /// The all-zero address, used as "unknown" (for example the target hardware address of an ARP
    /// request, RFC 826).
    pub const UNSPECIFIED: Address = Address([0; 6]);

    /// The six bytes of the address.
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// Whether this is ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the individual/group bit (the least significant bit of the first byte, IEEE 802-2014
    /// §8.2) is set. Broadcast is a multicast address.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this is an individual (unicast) address: the I/G bit is clear.
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// Whether the universal/local bit (bit 1 of the first byte) is set: a locally administered address.
    pub const fn is_local(&self) -> bool {
        self.0[0] & 0x02 != 0
    }
}

impl From<[u8; 6]> for Address {
    fn from(bytes: [u8; 6]) -> Self {
        Address(bytes)
    }
}

impl From<Address> for [u8; 6] {
    fn from(addr: Address) -> Self {
        addr.0
    }
}

impl fmt::Display for Address {
    /// Lower-case hex bytes separated by colons: `24:8a:07:a8:fa:22`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

enum_with_unknown! {
    /// The 16-bit EtherType of an Ethernet II frame (IEEE Registration Authority EtherType list).
    pub enum EtherType(u16) {
        /// IPv4 (RFC 894).
        Ipv4 = 0x0800,
        /// ARP (RFC 826).
        Arp = 0x0806,
        /// IEEE 802.1Q VLAN tag (the tag protocol identifier, TPID).
        Vlan = 0x8100,
        /// IPv6 (RFC 2464).
        Ipv6 = 0x86DD,
    }
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtherType::Ipv4 => f.write_str("IPv4"),
            EtherType::Arp => f.write_str("ARP"),
            EtherType::Vlan => f.write_str("802.1Q"),
            EtherType::Ipv6 => f.write_str("IPv6"),
            EtherType::Unknown(raw) => write!(f, "{raw:#06x}"),
        }
    }
}

/// An IEEE 802.1Q tag control information (TCI) field (IEEE 802.1Q-2018 §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point, 3 bits (0..=7): the traffic class, which Priority Flow Control
    /// (IEEE 802.1Qbb) pauses per priority. Higher bits are ignored on emit.
    pub pcp: u8,
    /// Drop eligible indicator, 1 bit.
    pub dei: bool,
    /// VLAN identifier, 12 bits (0..=4095; 0 means "priority tag only", 4095 is reserved).
    /// Higher bits are ignored on emit.
    pub vid: u16,
}

impl VlanTag {
    /// Splits a 16-bit TCI (PCP:3 | DEI:1 | VID:12, most significant first).
    pub const fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    /// The 16-bit TCI; `pcp` and `vid` are masked to 3 and 12 bits.
    pub const fn tci(&self) -> u16 {
        ((self.pcp as u16 & 0x7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0fff)
    }
}

mod field {
    use core::ops::Range;

    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// The TCI of an 802.1Q tag; the tag's TPID sits in `ETHERTYPE`.
    pub const VLAN_TCI: Range<usize> = 14..16;
    /// The EtherType of the payload of a tagged frame.
    pub const VLAN_ETHERTYPE: Range<usize> = 16..18;
}

/// Length of an untagged Ethernet II header, in bytes: 14, two 6-byte addresses and the 2-byte
/// EtherType (IEEE 802.3 clause 3.2).
pub const HEADER_LEN: usize = field::ETHERTYPE.end;
/// Length of one IEEE 802.1Q tag (2-byte TPID and 2-byte TCI), in bytes: 4 (IEEE 802.1Q-2018 §9.3).
pub const VLAN_TAG_LEN: usize = field::VLAN_ETHERTYPE.end - HEADER_LEN;
/// Length of an Ethernet II header with one 802.1Q tag, in bytes: 18.
pub const VLAN_HEADER_LEN: usize = field::VLAN_ETHERTYPE.end;

/// A zero-copy view of an Ethernet II frame (IEEE 802.3 clause 3.2.6; without FCS), optionally with one
/// 802.1Q tag (IEEE 802.1Q-2018 §9.3): a 14- or 18-byte header, then the payload to the end of the
/// buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length; getters may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer and checks, with [`Frame::check_len`], that the header (with its tag, if the
    /// EtherType says 0x8100) fits.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) (layer `Ethernet` or `Vlan`).
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that the buffer holds the 14-byte header and, when the EtherType is 0x8100, the 4-byte
    /// tag too. After this every getter is safe.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with layer `Ethernet` (under 14 bytes) or `Vlan` (tagged, under 18 bytes).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_len(Layer::Ethernet, HEADER_LEN, len)?;
        if self.ethertype() == EtherType::Vlan {
            check_len(Layer::Vlan, VLAN_HEADER_LEN, len)?;
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The destination MAC address (bytes 0..6).
    pub fn dst_addr(&self) -> Address {
        Address(read_array(self.buffer.as_ref(), field::DESTINATION))
    }

    /// The source MAC address (bytes 6..12).
    pub fn src_addr(&self) -> Address {
        Address(read_array(self.buffer.as_ref(), field::SOURCE))
    }

    /// The EtherType field at bytes 12..14: the payload's type for an untagged frame, or
    /// [`EtherType::Vlan`] (the TPID) for a tagged one. See [`Frame::payload_ethertype`].
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(read_u16(self.buffer.as_ref(), field::ETHERTYPE))
    }

    /// Whether the frame carries an 802.1Q tag (EtherType field 0x8100).
    pub fn has_vlan_tag(&self) -> bool {
        self.ethertype() == EtherType::Vlan
    }

    /// The 802.1Q tag, if the frame has one.
    pub fn vlan_tag(&self) -> Option<VlanTag> {
        if !self.has_vlan_tag() {
            return None;
        }
        Some(VlanTag::from_tci(read_u16(
            self.buffer.as_ref(),
            field::VLAN_TCI,
        )))
    }

    /// The EtherType of the payload: bytes 16..18 of a tagged frame, bytes 12..14 otherwise. A second
    /// tag is not looked through: it comes back as [`EtherType::Vlan`].
    pub fn payload_ethertype(&self) -> EtherType {
        EtherType::from(read_u16(
            self.buffer.as_ref(),
            self.payload_ethertype_field(),
        ))
    }

    /// Where the payload's EtherType is: [`field::VLAN_ETHERTYPE`] in a tagged frame,
    /// [`field::ETHERTYPE`] otherwise.
    fn payload_ethertype_field(&self) -> core::ops::Range<usize> {
        if self.has_vlan_tag() {
            field::VLAN_ETHERTYPE
        } else {
            field::ETHERTYPE
        }
    }

    /// Length of the header including the tag, in bytes: 14, or 18 with an 802.1Q tag. Also the offset
    /// of the payload in the buffer.
    pub fn header_len(&self) -> usize {
        if self.has_vlan_tag() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// The byte offset of the payload (after the optional tag): same as [`Frame::header_len`].
    pub fn payload_offset(&self) -> usize {
        self.header_len()
    }

    /// The payload after the header and optional tag, up to the end of the buffer (including any
    /// padding to the 60-byte minimum frame; upper layers honour their own length fields).
    pub fn payload(&self) -> &[u8] {
        let at = self.payload_offset();
        &self.buffer.as_ref()[at..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC address (bytes 0..6).
    pub fn set_dst_addr(&mut self, addr: Address) {
        write_array(self.buffer.as_mut(), field::DESTINATION, addr.0);
    }

    /// Sets the source MAC address (bytes 6..12).
    pub fn set_src_addr(&mut self, addr: Address) {
        write_array(self.buffer.as_mut(), field::SOURCE, addr.0);
    }

    /// Sets the EtherType field at bytes 12..14 (the TPID position in a tagged frame).
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        write_u16(self.buffer.as_mut(), field::ETHERTYPE, ethertype.into());
    }

    /// Writes an 802.1Q tag: TPID 0x8100 at bytes 12..14 and the TCI at bytes 14..16. Write the
    /// payload's EtherType afterwards with [`Frame::set_payload_ethertype`].
    pub fn set_vlan_tag(&mut self, tag: VlanTag) {
        self.set_ethertype(EtherType::Vlan);
        write_u16(self.buffer.as_mut(), field::VLAN_TCI, tag.tci());
    }

    /// Sets the payload's EtherType: at bytes 16..18 when the EtherType field already says 0x8100
    /// (call [`Frame::set_vlan_tag`] first), at bytes 12..14 otherwise.
    pub fn set_payload_ethertype(&mut self, ethertype: EtherType) {
        let field = self.payload_ethertype_field();
        write_u16(self.buffer.as_mut(), field, ethertype.into());
    }

    /// The payload after the header and optional tag, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.payload_offset();
        &mut self.buffer.as_mut()[at..]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Frame<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The parsed Ethernet II header (IEEE 802.3 clause 3.2.6), with its optional 802.1Q tag (IEEE
/// 802.1Q-2018 §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source MAC address.
    pub src_addr: Address,
    /// Destination MAC address.
    pub dst_addr: Address,
    /// The single 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// The payload's EtherType (after the tag when there is one). [`EtherType::Vlan`] here means a
    /// second, unsupported tag follows.
    pub ethertype: EtherType,
}

impl Repr {
    /// Parses the header of a frame. Any ethertype is accepted, so this only fails on a short buffer;
    /// it never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) as [`Frame::check_len`].
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<Repr> {
        frame.check_len()?;
        let d = frame.buffer.as_ref();
        // Read from a fixed array (no per-field bounds checks), the EtherType field decoded once.
        let Some(h) = d.first_chunk::<VLAN_HEADER_LEN>() else {
            return Self::parse_short(frame);
        };
        let ethertype = EtherType::from(read_u16(h, field::ETHERTYPE));
        let (vlan, ethertype) = if ethertype == EtherType::Vlan {
            let tci = read_u16(h, field::VLAN_TCI);
            let inner = EtherType::from(read_u16(h, field::VLAN_ETHERTYPE));
            (Some(VlanTag::from_tci(tci)), inner)
        } else {
            (None, ethertype)
        };
        Ok(Repr {
            src_addr: Address(read_array(h, field::SOURCE)),
            dst_addr: Address(read_array(h, field::DESTINATION)),
            vlan,
            ethertype,
        })
    }

    /// [`Repr::parse`] through the [`Frame`] getters, for a frame of fewer than 18 bytes (a header with
    /// nothing after it), where the fixed-size reads above do not apply.
    fn parse_short<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<Repr> {
        frame.check_len()?;
        Ok(Repr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            vlan: frame.vlan_tag(),
            ethertype: frame.payload_ethertype(),
        })
    }

    /// Length of the header this emits, in bytes: 14, or 18 with a tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header (and tag) into the first [`Repr::buffer_len`] bytes of the frame; the
    /// payload bytes are left alone.
    ///
    /// An untagged `Repr` whose `ethertype` is [`EtherType::Vlan`] writes a frame that reads back as
    /// tagged (the bytes after the header become the tag); do not build one.
    ///
    /// # Panics
    /// If the buffer is shorter than [`Repr::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        match self.vlan {
            Some(tag) => {
                frame.set_vlan_tag(tag);
                write_u16(
                    frame.buffer.as_mut(),
                    field::VLAN_ETHERTYPE,
                    self.ethertype.into(),
                );
            }
            None => frame.set_ethertype(self.ethertype),
        }
    }
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    /// The head of the scapy RoCEv2 vector (see udp.rs): Ether(dst=src=24:8a:07:a8:fa:22) / IP ...
    static UNTAGGED: [u8; 16] = [
        0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x08, 0x00, 0x45,
        0x01,
    ];

    /// scapy: Ether(dst='02:00:00:00:00:02', src='02:00:00:00:00:01') / Dot1Q(prio=3, id=1, vlan=100)
    /// / IP(...), first 20 bytes.
    static TAGGED: [u8; 20] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x81, 0x00, 0x70,
        0x64, 0x08, 0x00, 0x45, 0x6a,
    ];

    const MAC_A: Address = Address([0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22]);
    const MAC_1: Address = Address([0x02, 0, 0, 0, 0, 0x01]);
    const MAC_2: Address = Address([0x02, 0, 0, 0, 0, 0x02]);
    const TAG: VlanTag = VlanTag {
        pcp: 3,
        dei: true,
        vid: 100,
    };

    #[test]
    fn address() {
        assert!(Address::BROADCAST.is_broadcast());
        assert!(Address::BROADCAST.is_multicast());
        assert!(!Address::BROADCAST.is_unicast());
        assert!(MAC_A.is_unicast());
        assert!(!MAC_A.is_local());
        assert!(MAC_1.is_local());
        assert!(Address([0x01, 0x00, 0x5e, 0, 0, 1]).is_multicast());
        assert_eq!(std::format!("{MAC_A}"), "24:8a:07:a8:fa:22");
        assert_eq!(<[u8; 6]>::from(MAC_A), MAC_A.0);
        assert_eq!(std::format!("{}", EtherType::Unknown(0x88a8)), "0x88a8");
    }

    #[test]
    fn vlan_tci() {
        assert_eq!(TAG.tci(), 0x7064);
        assert_eq!(VlanTag::from_tci(0x7064), TAG);
        let wide = VlanTag {
            pcp: 0xff,
            dei: false,
            vid: 0xffff,
        };
        assert_eq!(wide.tci(), 0xefff);
    }

    #[test]
    fn deconstruct_untagged() {
        let frame = Frame::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(frame.dst_addr(), MAC_A);
        assert_eq!(frame.src_addr(), MAC_A);
        assert_eq!(frame.ethertype(), EtherType::Ipv4);
        assert_eq!(frame.payload_ethertype(), EtherType::Ipv4);
        assert_eq!(frame.vlan_tag(), None);
        assert_eq!(frame.header_len(), 14);
        assert_eq!(frame.payload(), &[0x45, 0x01]);
    }

    #[test]
    fn deconstruct_tagged() {
        let frame = Frame::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(frame.dst_addr(), MAC_2);
        assert_eq!(frame.src_addr(), MAC_1);
        assert_eq!(frame.ethertype(), EtherType::Vlan);
        assert_eq!(frame.vlan_tag(), Some(TAG));
        assert_eq!(frame.payload_ethertype(), EtherType::Ipv4);
        assert_eq!(frame.payload_offset(), 18);
        assert_eq!(frame.payload(), &[0x45, 0x6a]);
    }

    #[test]
    fn construct_tagged() {
        let mut bytes = [0xa5u8; 20];
        let mut frame = Frame::new_unchecked(&mut bytes[..]);
        frame.set_dst_addr(MAC_2);
        frame.set_src_addr(MAC_1);
        frame.set_vlan_tag(TAG);
        frame.set_payload_ethertype(EtherType::Ipv4);
        frame.payload_mut().copy_from_slice(&[0x45, 0x6a]);
        assert_eq!(bytes, TAGGED);
    }

    #[test]
    fn construct_untagged() {
        let mut bytes = [0xa5u8; 16];
        let mut frame = Frame::new_unchecked(&mut bytes[..]);
        frame.set_dst_addr(MAC_A);
        frame.set_src_addr(MAC_A);
        frame.set_payload_ethertype(EtherType::Ipv4);
        // 0xa5a5 is not 0x8100, so this went to bytes 12..14.
        frame.payload_mut().copy_from_slice(&[0x45, 0x01]);
        assert_eq!(bytes, UNTAGGED);
    }

    #[test]
    fn parse_and_emit() {
        let tagged = Repr {
            src_addr: MAC_1,
            dst_addr: MAC_2,
            vlan: Some(TAG),
            ethertype: EtherType::Ipv4,
        };
        assert_eq!(Repr::parse(&Frame::new_unchecked(&TAGGED[..])), Ok(tagged));
        assert_eq!(tagged.buffer_len(), 18);
        let mut bytes = [0xa5u8; 20];
        tagged.emit(&mut Frame::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..18], TAGGED[..18]);
        assert_eq!(bytes[18..], [0xa5, 0xa5]);

        let untagged = Repr {
            src_addr: MAC_A,
            dst_addr: MAC_A,
            vlan: None,
            ethertype: EtherType::Ipv4,
        };
        assert_eq!(
            Repr::parse(&Frame::new_unchecked(&UNTAGGED[..])),
            Ok(untagged)
        );
        assert_eq!(untagged.buffer_len(), 14);
        let mut bytes = [0xa5u8; 16];
        untagged.emit(&mut Frame::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..14], UNTAGGED[..14]);

        // Emitting never writes past buffer_len, whatever the EtherType.
        let odd = Repr {
            ethertype: EtherType::Vlan,
            ..untagged
        };
        let mut bytes = [0xa5u8; 14];
        odd.emit(&mut Frame::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[12..], [0x81, 0x00]);
    }

    #[test]
    fn double_tag_is_reported_as_vlan_ethertype() {
        let mut bytes = TAGGED;
        bytes[16] = 0x81;
        bytes[17] = 0x00;
        let repr = Repr::parse(&Frame::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(repr.vlan, Some(TAG));
        assert_eq!(repr.ethertype, EtherType::Vlan);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Frame::new_checked(&UNTAGGED[..13]),
            Err(Error::Truncated {
                layer: Layer::Ethernet,
                need: 14,
                got: 13
            })
        );
        assert!(Frame::new_checked(&UNTAGGED[..14]).is_ok());
        assert_eq!(
            Frame::new_checked(&TAGGED[..17]),
            Err(Error::Truncated {
                layer: Layer::Vlan,
                need: 18,
                got: 17
            })
        );
        assert_eq!(
            Repr::parse(&Frame::new_unchecked(&TAGGED[..15])),
            Err(Error::Truncated {
                layer: Layer::Vlan,
                need: 18,
                got: 15
            })
        );
        assert!(Frame::new_checked(&TAGGED[..18])
            .unwrap()
            .payload()
            .is_empty());
    }

    fn arb_address() -> impl Strategy<Value = Address> {
        any::<[u8; 6]>().prop_map(Address)
    }

    fn arb_repr() -> impl Strategy<Value = Repr> {
        (
            arb_address(),
            arb_address(),
            proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
            any::<u16>(),
        )
            .prop_filter_map("untagged 0x8100 is a tag", |(src, dst, tag, ty)| {
                if tag.is_none() && ty == 0x8100 {
                    return None;
                }
                Some(Repr {
                    src_addr: src,
                    dst_addr: dst,
                    vlan: tag.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                    ethertype: EtherType::from(ty),
                })
            })
    }

    proptest! {
        #[test]
        fn repr_round_trip(repr in arb_repr()) {
            let mut bytes = [0xa5u8; 64];
            repr.emit(&mut Frame::new_unchecked(&mut bytes[..]));
            let frame = Frame::new_checked(&bytes[..repr.buffer_len()]).unwrap();
            prop_assert_eq!(frame.header_len(), repr.buffer_len());
            prop_assert_eq!(Repr::parse(&frame), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(frame) = Frame::new_checked(&bytes[..]) {
                let _ = frame.payload();
                let _ = frame.payload_ethertype();
                let _ = Repr::parse(&frame);
            }
            let _ = Repr::parse(&Frame::new_unchecked(&bytes[..]));
        }
    }
}
