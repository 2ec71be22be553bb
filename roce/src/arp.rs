//! ARP, the Address Resolution Protocol (RFC 826), for Ethernet and IPv4 only.
//!
//! A RoCEv2 node over IPv4 learns the MAC address of the next hop with ARP, as any IP host does: it
//! broadcasts a request "who has `target_protocol_addr`? tell `source_protocol_addr`", and the owner
//! answers with a unicast reply carrying its MAC address.
//!
//! The packet (EtherType 0x0806) for Ethernet (hardware type 1, 6-byte addresses) and IPv4 (protocol
//! type 0x0800, 4-byte addresses) is 28 bytes:
//!
//! ```text
//!  0       2       4   5   6       8              14      18             24      28
//! +-------+-------+---+---+-------+--------------+-------+--------------+-------+
//! | htype | ptype |hln|pln| oper  | sender MAC   | sender| target MAC   | target|
//! |   1   | 0800  | 6 | 4 |  1/2  |              | IPv4  |              | IPv4  |
//! +-------+-------+---+---+-------+--------------+-------+--------------+-------+
//! ```
//!
//! The view's address getters use the offsets of this Ethernet/IPv4 layout; [`Repr::parse`] rejects
//! every other combination of hardware and protocol types and lengths.

use core::net::Ipv4Addr;

use crate::error::{check_len, Error, Layer, Result};
use crate::ethernet::{Address, EtherType};
use crate::wire_field::{read_array, read_u16, write_array, write_u16};

enum_with_unknown! {
    /// ARP hardware type (IANA "Hardware Types" registry; RFC 826 `ar$hrd`).
    pub enum Hardware(u16) {
        /// Ethernet (10 Mb and up).
        Ethernet = 1,
    }
}

enum_with_unknown! {
    /// ARP operation code (RFC 826 `ar$op`; IANA "Operation Codes" registry).
    pub enum Operation(u16) {
        /// "Who has this protocol address?"
        Request = 1,
        /// "This protocol address is at this hardware address."
        Reply = 2,
    }
}

mod field {
    use core::ops::Range;

    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    // Offsets below hold for hlen = 6 and plen = 4 only.
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// Length of an ARP packet for Ethernet and IPv4, in bytes: 28, 8 fixed bytes + 2 × (6 + 4) (RFC 826).
pub const HEADER_LEN: usize = field::TPA.end;

/// A zero-copy view of an Ethernet/IPv4 ARP packet (RFC 826), 28 bytes; Ethernet padding after it is
/// allowed in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; getters may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks, with [`Packet::check_len`], that the 28 bytes fit.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Arp`).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds at least [`HEADER_LEN`] bytes (trailing Ethernet padding is
    /// allowed). It does not check the type and length fields: [`Repr::parse`] does.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Arp`).
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Arp, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Hardware type (bytes 0..2); 1 for Ethernet.
    pub fn hardware_type(&self) -> Hardware {
        Hardware::from(read_u16(self.buffer.as_ref(), field::HTYPE))
    }

    /// Protocol type (bytes 2..4), an EtherType; 0x0800 for IPv4.
    pub fn protocol_type(&self) -> EtherType {
        EtherType::from(read_u16(self.buffer.as_ref(), field::PTYPE))
    }

    /// Hardware address length in bytes (byte 4); 6 for Ethernet.
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    /// Protocol address length in bytes (byte 5); 4 for IPv4.
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    /// Operation (bytes 6..8).
    pub fn operation(&self) -> Operation {
        Operation::from(read_u16(self.buffer.as_ref(), field::OPER))
    }

    /// Sender hardware (MAC) address, bytes 8..14 (Ethernet/IPv4 layout).
    pub fn source_hardware_addr(&self) -> Address {
        Address(read_array(self.buffer.as_ref(), field::SHA))
    }

    /// Sender protocol (IPv4) address, bytes 14..18 (Ethernet/IPv4 layout).
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_array::<4>(self.buffer.as_ref(), field::SPA))
    }

    /// Target hardware (MAC) address, bytes 18..24 (Ethernet/IPv4 layout); zero in a request.
    pub fn target_hardware_addr(&self) -> Address {
        Address(read_array(self.buffer.as_ref(), field::THA))
    }

    /// Target protocol (IPv4) address, bytes 24..28 (Ethernet/IPv4 layout).
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_array::<4>(self.buffer.as_ref(), field::TPA))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the hardware type (bytes 0..2).
    pub fn set_hardware_type(&mut self, value: Hardware) {
        write_u16(self.buffer.as_mut(), field::HTYPE, value.into());
    }

    /// Sets the protocol type (bytes 2..4).
    pub fn set_protocol_type(&mut self, value: EtherType) {
        write_u16(self.buffer.as_mut(), field::PTYPE, value.into());
    }

    /// Sets the hardware address length, in bytes (byte 4).
    pub fn set_hardware_len(&mut self, value: u8) {
        self.buffer.as_mut()[field::HLEN] = value;
    }

    /// Sets the protocol address length, in bytes (byte 5).
    pub fn set_protocol_len(&mut self, value: u8) {
        self.buffer.as_mut()[field::PLEN] = value;
    }

    /// Sets the operation (bytes 6..8).
    pub fn set_operation(&mut self, value: Operation) {
        write_u16(self.buffer.as_mut(), field::OPER, value.into());
    }

    /// Sets the sender MAC address (bytes 8..14).
    pub fn set_source_hardware_addr(&mut self, addr: Address) {
        write_array(self.buffer.as_mut(), field::SHA, addr.0);
    }

    /// Sets the sender IPv4 address (bytes 14..18).
    pub fn set_source_protocol_addr(&mut self, addr: Ipv4Addr) {
        write_array(self.buffer.as_mut(), field::SPA, addr.octets());
    }

    /// Sets the target MAC address (bytes 18..24).
    pub fn set_target_hardware_addr(&mut self, addr: Address) {
        write_array(self.buffer.as_mut(), field::THA, addr.0);
    }

    /// Sets the target IPv4 address (bytes 24..28).
    pub fn set_target_protocol_addr(&mut self, addr: Ipv4Addr) {
        write_array(self.buffer.as_mut(), field::TPA, addr.octets());
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// A parsed ARP packet (RFC 826). Only Ethernet/IPv4 is supported (the shape leaves room for others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// ARP for IPv4 over Ethernet (RFC 826).
    EthernetIpv4 {
        /// Request, reply, or an operation this crate does not name (carried unchanged).
        operation: Operation,
        /// The sender's MAC address.
        source_hardware_addr: Address,
        /// The sender's IPv4 address.
        source_protocol_addr: Ipv4Addr,
        /// The target's MAC address ([`Address::UNSPECIFIED`] in a request).
        target_hardware_addr: Address,
        /// The IPv4 address being resolved (request) or the requester's (reply).
        target_protocol_addr: Ipv4Addr,
    },
}

impl Repr {
    /// Parses an ARP packet; never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] under 28 bytes; [`Error::Malformed`] when the hardware type is not
    /// Ethernet (1), the protocol type not IPv4 (0x0800), or the address lengths not 6 and 4.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let malformed = |what| {
            Err(Error::Malformed {
                layer: Layer::Arp,
                what,
            })
        };
        if packet.hardware_type() != Hardware::Ethernet {
            return malformed("hardware type is not Ethernet (1)");
        }
        if packet.protocol_type() != EtherType::Ipv4 {
            return malformed("protocol type is not IPv4 (0x0800)");
        }
        if packet.hardware_len() != 6 {
            return malformed("hardware address length is not 6");
        }
        if packet.protocol_len() != 4 {
            return malformed("protocol address length is not 4");
        }
        Ok(Repr::EthernetIpv4 {
            operation: packet.operation(),
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// Length of the packet this emits, in bytes (28).
    pub const fn buffer_len(&self) -> usize {
        match self {
            Repr::EthernetIpv4 { .. } => HEADER_LEN,
        }
    }

    /// Writes the packet into the first [`Repr::buffer_len`] bytes.
    ///
    /// # Panics
    /// If the buffer is shorter than [`Repr::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        match *self {
            Repr::EthernetIpv4 {
                operation,
                source_hardware_addr,
                source_protocol_addr,
                target_hardware_addr,
                target_protocol_addr,
            } => {
                packet.set_hardware_type(Hardware::Ethernet);
                packet.set_protocol_type(EtherType::Ipv4);
                packet.set_hardware_len(6);
                packet.set_protocol_len(4);
                packet.set_operation(operation);
                packet.set_source_hardware_addr(source_hardware_addr);
                packet.set_source_protocol_addr(source_protocol_addr);
                packet.set_target_hardware_addr(target_hardware_addr);
                packet.set_target_protocol_addr(target_protocol_addr);
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// scapy: ARP(op=1, hwsrc='02:00:00:00:00:01', psrc='10.0.0.1', hwdst='00:00:00:00:00:00',
    /// pdst='10.0.0.2') (after the 14-byte Ethernet header of the generated frame).
    static REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x0a,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02,
    ];

    /// scapy: ARP(op=2, hwsrc='02:00:00:00:00:02', psrc='10.0.0.2', hwdst='02:00:00:00:00:01',
    /// pdst='10.0.0.1').
    static REPLY: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x0a,
        0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x01,
    ];

    const MAC_1: Address = Address([0x02, 0, 0, 0, 0, 0x01]);
    const MAC_2: Address = Address([0x02, 0, 0, 0, 0, 0x02]);
    const IP_1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const IP_2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn request() -> Repr {
        Repr::EthernetIpv4 {
            operation: Operation::Request,
            source_hardware_addr: MAC_1,
            source_protocol_addr: IP_1,
            target_hardware_addr: Address::UNSPECIFIED,
            target_protocol_addr: IP_2,
        }
    }

    fn reply() -> Repr {
        Repr::EthernetIpv4 {
            operation: Operation::Reply,
            source_hardware_addr: MAC_2,
            source_protocol_addr: IP_2,
            target_hardware_addr: MAC_1,
            target_protocol_addr: IP_1,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(p.hardware_type(), Hardware::Ethernet);
        assert_eq!(p.protocol_type(), EtherType::Ipv4);
        assert_eq!(p.hardware_len(), 6);
        assert_eq!(p.protocol_len(), 4);
        assert_eq!(p.operation(), Operation::Request);
        assert_eq!(p.source_hardware_addr(), MAC_1);
        assert_eq!(p.source_protocol_addr(), IP_1);
        assert_eq!(p.target_hardware_addr(), Address::UNSPECIFIED);
        assert_eq!(p.target_protocol_addr(), IP_2);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xa5u8; 28];
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_hardware_type(Hardware::Ethernet);
        p.set_protocol_type(EtherType::Ipv4);
        p.set_hardware_len(6);
        p.set_protocol_len(4);
        p.set_operation(Operation::Reply);
        p.set_source_hardware_addr(MAC_2);
        p.set_source_protocol_addr(IP_2);
        p.set_target_hardware_addr(MAC_1);
        p.set_target_protocol_addr(IP_1);
        assert_eq!(bytes, REPLY);
    }

    #[test]
    fn parse_and_emit() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&REQUEST[..])),
            Ok(request())
        );
        assert_eq!(Repr::parse(&Packet::new_unchecked(&REPLY[..])), Ok(reply()));
        for (repr, golden) in [(request(), REQUEST), (reply(), REPLY)] {
            let mut bytes = [0xa5u8; 28];
            assert_eq!(repr.buffer_len(), 28);
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(bytes, golden);
        }
        // Trailing Ethernet padding is ignored.
        let mut padded = [0u8; 46];
        padded[..28].copy_from_slice(&REQUEST);
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&padded[..])),
            Ok(request())
        );
    }

    #[test]
    fn rejects_other_types() {
        for (at, value, what) in [
            (1, 6u8, "hardware type is not Ethernet (1)"),
            (2, 0x86, "protocol type is not IPv4 (0x0800)"),
            (4, 8, "hardware address length is not 6"),
            (5, 16, "protocol address length is not 4"),
        ] {
            let mut bytes = REQUEST;
            bytes[at] = value;
            assert_eq!(
                Repr::parse(&Packet::new_unchecked(&bytes[..])),
                Err(Error::Malformed {
                    layer: Layer::Arp,
                    what
                })
            );
        }
        let mut bytes = REQUEST;
        bytes[7] = 9; // InARP reply (RFC 2390): kept as an unknown operation.
        let Ok(Repr::EthernetIpv4 { operation, .. }) =
            Repr::parse(&Packet::new_unchecked(&bytes[..]))
        else {
            panic!("operation 9 must parse");
        };
        assert_eq!(operation, Operation::Unknown(9));
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&REQUEST[..27]),
            Err(Error::Truncated {
                layer: Layer::Arp,
                need: 28,
                got: 27
            })
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&REQUEST[..3])),
            Err(Error::Truncated {
                layer: Layer::Arp,
                need: 28,
                got: 3
            })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trip(
            op in any::<u16>(),
            sha in any::<[u8; 6]>(),
            spa in any::<u32>(),
            tha in any::<[u8; 6]>(),
            tpa in any::<u32>(),
        ) {
            let repr = Repr::EthernetIpv4 {
                operation: Operation::from(op),
                source_hardware_addr: Address(sha),
                source_protocol_addr: Ipv4Addr::from(spa),
                target_hardware_addr: Address(tha),
                target_protocol_addr: Ipv4Addr::from(tpa),
            };
            let mut bytes = [0xa5u8; 28];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = Repr::parse(&p);
            }
            let _ = Repr::parse(&Packet::new_unchecked(&bytes[..]));
        }
    }
}
