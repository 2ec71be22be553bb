//! IPv6 Neighbor Discovery: Neighbor Solicitation and Advertisement (RFC 4861 §4.3, §4.4), the
//! ICMPv6 messages (RFC 4443) that map an IPv6 address to a link-layer (MAC) address.
//!
//! Before a RoCEv2 packet to an IPv6 GID can leave as an Ethernet frame, the sender needs the MAC
//! address of that GID: it sends a **Neighbor Solicitation** (NS) for the target address to the
//! target's solicited-node multicast address ([`solicited_node_addr`]), carrying its own MAC in a
//! Source Link-Layer Address option, and the owner answers with a **Neighbor Advertisement** (NA)
//! carrying its MAC in a Target Link-Layer Address option. It is IPv6's ARP ([`crate::arp`]).
//!
//! Both messages are ICMPv6 (IPv6 Next Header [`IpProtocol::Icmpv6`], 58) sent with hop limit
//! [`HOP_LIMIT`] (255), so that a receiver knows they did not cross a router (RFC 4861 §7.1). The
//! message, from the ICMPv6 header on:
//!
//! ```text
//!  0       1       2               4                               8
//! +-------+-------+---------------+-------------------------------+
//! | Type  | Code 0|   Checksum    | NS: reserved (0)              |
//! |135/136|       |               | NA: R S O, 29 reserved bits   |
//! +-------+-------+---------------+-------------------------------+
//! |                  Target Address (16 bytes)                    |
//! +---------------------------------------------------------------+
//! | options: Type (1) | Length (1, in units of 8 bytes) | data ... |
//! +---------------------------------------------------------------+
//!
//! Link-layer address option for Ethernet (RFC 4861 §4.6.1), 8 bytes:
//! +-------+-------+-----------------------------------------------+
//! | 1 / 2 |   1   |            MAC address (6 bytes)              |
//! +-------+-------+-----------------------------------------------+
//! ```
//!
//! * **Checksum** (RFC 4443 §2.3): the ones-complement checksum of an IPv6 pseudo header (source and
//!   destination addresses, the message length, Next Header 58; RFC 8200 §8.1) and the whole message.
//! * **R / S / O** ([`NeighborFlags`]): sent by a router; solicited (an answer to an NS); override an
//!   existing cache entry.
//! * **Options** ([`option`]): a receiver takes the link-layer address option that goes with the
//!   message (source for an NS, target for an NA), skips the others (RFC 4861 §4.3, §4.4), and drops a
//!   message in which any option has length 0 (§7.1.1, §7.1.2).
//!
//! [`Repr::parse`] makes the receiver's checks of RFC 4861 §7.1.1 and §7.1.2 that the message and its
//! IPv6 header can settle: hop limit 255, checksum, code 0, at least 24 bytes, target not multicast,
//! no option of length 0. Two checks that need more context are the caller's: an NS from the
//! unspecified address `::` must go to a solicited-node address and carry no source link-layer
//! option, and an NA to a multicast address must not have the Solicited flag.

use core::net::Ipv6Addr;

use bitflags::bitflags;

use crate::checksum;
use crate::error::{check_len, Error, Layer, Result};
use crate::ethernet::Address;
use crate::ipv4::IpProtocol;
use crate::ipv6;
use crate::wire_field::{read_array, read_u16, read_u32, write_array, write_u16, write_u32};

/// The IPv6 hop limit Neighbor Discovery messages are sent with and must arrive with (RFC 4861
/// §7.1.1, §7.1.2): 255, so no router forwarded them.
pub const HOP_LIMIT: u8 = 255;

/// The link-scope all-nodes multicast address ff02::1 (RFC 4291 §2.7.1), where an NA answering a
/// solicitation from the unspecified address goes (RFC 4861 §7.2.4).
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The solicited-node multicast address of `addr` (RFC 4291 §2.7.1), where a Neighbor Solicitation
/// for `addr` is sent: ff02::1:ff00:0 with the low 24 bits of `addr`.
pub const fn solicited_node_addr(addr: &Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet multicast address of the IPv6 multicast address `addr` (RFC 2464 §7): 33:33
/// followed by the low 32 bits of `addr`.
pub const fn multicast_mac(addr: &Ipv6Addr) -> Address {
    let o = addr.octets();
    Address([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

enum_with_unknown! {
    /// The ICMPv6 Type of a Neighbor Discovery message (RFC 4861 §4; IANA "ICMPv6 Parameters").
    pub enum Message(u8) {
        /// Router Solicitation (RFC 4861 §4.1).
        RouterSolicit = 133,
        /// Router Advertisement (RFC 4861 §4.2).
        RouterAdvert = 134,
        /// Neighbor Solicitation (RFC 4861 §4.3).
        NeighborSolicit = 135,
        /// Neighbor Advertisement (RFC 4861 §4.4).
        NeighborAdvert = 136,
        /// Redirect (RFC 4861 §4.5).
        Redirect = 137,
    }
}

bitflags! {
    /// The flags of a Neighbor Advertisement (RFC 4861 §4.4): the high 3 bits of byte 4. The other 29
    /// bits of bytes 4..8 are reserved (sent as 0, ignored on receipt).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct NeighborFlags: u8 {
        /// R: the sender is a router.
        const ROUTER = 0x80;
        /// S: sent in answer to a Neighbor Solicitation.
        const SOLICITED = 0x40;
        /// O: the advertisement overrides an existing cache entry.
        const OVERRIDE = 0x20;
    }
}

mod field {
    use core::ops::Range;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    /// NS: reserved. NA: flags (the high 3 bits of the first byte) and reserved.
    pub const FLAGS: Range<usize> = 4..8;
    pub const TARGET: Range<usize> = 8..24;
}

/// Length in bytes of an NS or NA without options: ICMPv6 header (4), flags / reserved (4), target
/// address (16). Shorter messages are dropped (RFC 4861 §7.1.1, §7.1.2).
pub const HEADER_LEN: usize = field::TARGET.end;

/// Shift of the NA flags byte within the 32-bit flags / reserved word.
const FLAGS_SHIFT: u32 = 24;

/// The ICMPv6 checksum (RFC 4443 §2.3) of `message` between `src_addr` and `dst_addr`: the
/// ones-complement sum over the IPv6 pseudo header and the message, not yet inverted. A message
/// whose checksum field is right sums to 0xffff.
fn sum(src_addr: &Ipv6Addr, dst_addr: &Ipv6Addr, message: &[u8]) -> u16 {
    // An ND message is far below 4 GiB; a longer slice saturates and fails to verify.
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let pseudo = checksum::pseudo_header_v6(*src_addr, *dst_addr, IpProtocol::Icmpv6.to_raw(), len);
    checksum::combine(&[pseudo, checksum::data(message)])
}

/// A zero-copy view of a Neighbor Solicitation or Advertisement: the ICMPv6 message (the IPv6
/// payload), options included, and nothing after it (the buffer's length is the message's, which the
/// checksum covers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (24 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buffer` is shorter than 24 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the 24 bytes before the options, so that every getter is safe. The
    /// options are checked as [`Packet::options`] walks them.
    ///
    /// # Errors
    /// [`Error::Truncated`] with `layer: Ndisc` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Ndisc, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// ICMPv6 Type (byte 0): 135 for an NS, 136 for an NA.
    pub fn msg_type(&self) -> Message {
        Message::from(self.buffer.as_ref()[field::TYPE])
    }

    /// ICMPv6 Code (byte 1); 0 in Neighbor Discovery.
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// The checksum field (bytes 2..4).
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The NA flags (high 3 bits of byte 4); reserved bits are dropped. Meaningless in an NS, whose
    /// bytes 4..8 are all reserved.
    pub fn neighbor_flags(&self) -> NeighborFlags {
        let word = read_u32(self.buffer.as_ref(), field::FLAGS);
        NeighborFlags::from_bits_truncate((word >> FLAGS_SHIFT) as u8)
    }

    /// Bytes 4..8 as a big-endian word with the NA flags masked out: the reserved bits (0 from a
    /// conforming sender, ignored on receipt).
    pub fn reserved(&self) -> u32 {
        let flags = u32::from(NeighborFlags::all().bits()) << FLAGS_SHIFT;
        read_u32(self.buffer.as_ref(), field::FLAGS) & !flags
    }

    /// The target address (bytes 8..24): the address being resolved (NS) or advertised (NA).
    pub fn target_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), field::TARGET))
    }

    /// The option bytes after the target address (possibly empty).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The options one by one, each checked with [`option::Packet::new_checked`]; the walk ends after
    /// the first that fails.
    pub fn iter_options(&self) -> Options<'_> {
        Options {
            rest: self.options(),
        }
    }

    /// Whether the checksum verifies for a message from `src_addr` to `dst_addr` (RFC 4443 §2.3): the
    /// pseudo header and the whole buffer sum to 0xffff.
    pub fn verify_checksum(&self, src_addr: &Ipv6Addr, dst_addr: &Ipv6Addr) -> bool {
        sum(src_addr, dst_addr, self.buffer.as_ref()) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the ICMPv6 Type.
    pub fn set_msg_type(&mut self, value: Message) {
        self.buffer.as_mut()[field::TYPE] = value.into();
    }

    /// Sets the ICMPv6 Code.
    pub fn set_msg_code(&mut self, value: u8) {
        self.buffer.as_mut()[field::CODE] = value;
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    /// Writes bytes 4..8: the NA flags in the high bits of byte 4, every reserved bit 0 (an NS passes
    /// [`NeighborFlags::empty`]).
    pub fn set_neighbor_flags(&mut self, value: NeighborFlags) {
        let word = u32::from(value.bits()) << FLAGS_SHIFT;
        write_u32(self.buffer.as_mut(), field::FLAGS, word);
    }

    /// Sets the target address.
    pub fn set_target_addr(&mut self, value: &Ipv6Addr) {
        write_array(self.buffer.as_mut(), field::TARGET, value.octets());
    }

    /// The option bytes after the target address, writable.
    pub fn options_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Computes the checksum of the whole buffer for a message from `src_addr` to `dst_addr` (RFC 4443
    /// §2.3) and stores it; call it after every other field and option is written.
    pub fn fill_checksum(&mut self, src_addr: &Ipv6Addr, dst_addr: &Ipv6Addr) {
        self.set_checksum(0);
        let value = !sum(src_addr, dst_addr, self.buffer.as_ref());
        self.set_checksum(value);
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The options of a Neighbor Discovery message, from [`Packet::iter_options`]: each a checked
/// [`option::Packet`] over exactly its bytes, or the error that ends the walk.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<option::Packet<&'a [u8]>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match option::Packet::new_checked(self.rest) {
            Ok(opt) => {
                let (this, rest) = self.rest.split_at(opt.len());
                self.rest = rest;
                Some(Ok(option::Packet::new_unchecked(this)))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// A parsed Neighbor Solicitation or Advertisement (RFC 4861 §4.3, §4.4). Options other than the
/// message's link-layer address option are not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Repr {
    /// Neighbor Solicitation (ICMPv6 type 135): "what is the link-layer address of `target_addr`?"
    NeighborSolicit {
        /// The address being resolved.
        target_addr: Ipv6Addr,
        /// The sender's MAC (the first Source Link-Layer Address option), if it sent one.
        source_ll_addr: Option<Address>,
    },
    /// Neighbor Advertisement (ICMPv6 type 136): "`target_addr` is at `target_ll_addr`".
    NeighborAdvert {
        /// Router, Solicited and Override.
        flags: NeighborFlags,
        /// The address advertised.
        target_addr: Ipv6Addr,
        /// Its MAC (the first Target Link-Layer Address option), if the message carries one;
        /// otherwise the receiver may take the Ethernet source.
        target_ll_addr: Option<Address>,
    },
}

impl Repr {
    /// Parses an NS or NA that arrived in the IPv6 header `ip` (whose addresses the checksum covers and
    /// whose hop limit must be [`HOP_LIMIT`]); never panics. Checks, in order: the length, the type, the
    /// hop limit, the code, the checksum, the target, the options.
    ///
    /// # Errors
    /// * [`Error::Truncated`] (layer `Ndisc`) under 24 bytes, or when an option's length runs past
    ///   the message;
    /// * [`Error::Malformed`] (layer `Ndisc`) when the type is neither NS nor NA, the hop limit is
    ///   not 255, the code not 0, the target a multicast address, or an option has length 0
    ///   (RFC 4861 §7.1.1, §7.1.2);
    /// * [`Error::BadChecksum`]`(Ndisc)` when the checksum does not verify (RFC 4443 §2.3).
    pub fn parse<T: AsRef<[u8]>>(ip: &ipv6::Repr, packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let malformed = |what| {
            Err(Error::Malformed {
                layer: Layer::Ndisc,
                what,
            })
        };
        let msg_type = packet.msg_type();
        if !matches!(msg_type, Message::NeighborSolicit | Message::NeighborAdvert) {
            return malformed("not a Neighbor Solicitation or Advertisement");
        }
        if ip.hop_limit != HOP_LIMIT {
            return malformed("hop limit is not 255 (the message crossed a router)");
        }
        if packet.msg_code() != 0 {
            return malformed("ICMPv6 code is not 0");
        }
        if !packet.verify_checksum(&ip.src_addr, &ip.dst_addr) {
            return Err(Error::BadChecksum(Layer::Ndisc));
        }
        let target_addr = packet.target_addr();
        if target_addr.is_multicast() {
            return malformed("target address is multicast");
        }
        let want = if msg_type == Message::NeighborSolicit {
            option::OptionType::SourceLinkLayerAddr
        } else {
            option::OptionType::TargetLinkLayerAddr
        };
        let mut ll_addr = None;
        for opt in packet.iter_options() {
            let opt = opt?;
            if ll_addr.is_none() && opt.option_type() == want {
                ll_addr = Some(opt.link_layer_addr());
            }
        }
        Ok(if msg_type == Message::NeighborSolicit {
            Repr::NeighborSolicit {
                target_addr,
                source_ll_addr: ll_addr,
            }
        } else {
            Repr::NeighborAdvert {
                flags: packet.neighbor_flags(),
                target_addr,
                target_ll_addr: ll_addr,
            }
        })
    }

    /// Length in bytes of the message this emits: 24, plus 8 with a link-layer address option.
    pub const fn buffer_len(&self) -> usize {
        let ll_addr = match self {
            Repr::NeighborSolicit { source_ll_addr, .. } => source_ll_addr.is_some(),
            Repr::NeighborAdvert { target_ll_addr, .. } => target_ll_addr.is_some(),
        };
        if ll_addr {
            HEADER_LEN + option::LINK_LAYER_ADDR_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the message into the first [`Repr::buffer_len`] bytes of `packet`, with code 0, the
    /// reserved bits 0, and the checksum for a message from `src_addr` to `dst_addr` (the IPv6
    /// header's, sent with hop limit [`HOP_LIMIT`]). Bytes after [`Repr::buffer_len`] are not
    /// touched.
    ///
    /// # Panics
    /// If the buffer is shorter than [`Repr::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        src_addr: &Ipv6Addr,
        dst_addr: &Ipv6Addr,
        packet: &mut Packet<T>,
    ) {
        let len = self.buffer_len();
        let mut message = Packet::new_unchecked(&mut packet.buffer.as_mut()[..len]);
        let (msg_type, flags, target_addr, ll_option) = match *self {
            Repr::NeighborSolicit {
                target_addr,
                source_ll_addr,
            } => (
                Message::NeighborSolicit,
                NeighborFlags::empty(),
                target_addr,
                source_ll_addr.map(option::Repr::SourceLinkLayerAddr),
            ),
            Repr::NeighborAdvert {
                flags,
                target_addr,
                target_ll_addr,
            } => (
                Message::NeighborAdvert,
                flags,
                target_addr,
                target_ll_addr.map(option::Repr::TargetLinkLayerAddr),
            ),
        };
        message.set_msg_type(msg_type);
        message.set_msg_code(0);
        message.set_neighbor_flags(flags);
        message.set_target_addr(&target_addr);
        if let Some(opt) = ll_option {
            opt.emit(&mut option::Packet::new_unchecked(message.options_mut()));
        }
        message.fill_checksum(src_addr, dst_addr);
    }
}

/// Neighbor Discovery options (RFC 4861 §4.6): type, length in units of 8 bytes, data. Only the
/// link-layer address options (§4.6.1) are decoded.
pub mod option {
    use crate::error::{check_len, Error, Layer, Result};
    use crate::ethernet::Address;
    use crate::wire_field::{read_array, write_array};

    mod field {
        use core::ops::Range;

        pub const TYPE: usize = 0;
        /// In units of 8 bytes, type and length bytes included; 0 is invalid.
        pub const LENGTH: usize = 1;
        /// The link-layer address of an Ethernet link-layer address option.
        pub const LL_ADDR: Range<usize> = 2..8;
    }

    /// Bytes of the type and length fields every option starts with.
    pub const HEADER_LEN: usize = field::LENGTH + 1;

    /// The unit of the Length field, in bytes (RFC 4861 §4.6).
    pub const LENGTH_UNIT: usize = 8;

    /// Length in bytes of a link-layer address option for Ethernet (RFC 4861 §4.6.1, RFC 2464 §6):
    /// type, length 1, the 6-byte MAC.
    pub const LINK_LAYER_ADDR_LEN: usize = field::LL_ADDR.end;

    enum_with_unknown! {
        /// The type of a Neighbor Discovery option (RFC 4861 §4.6; IANA "IPv6 Neighbor Discovery
        /// Option Formats").
        pub enum OptionType(u8) {
            /// Source Link-Layer Address (§4.6.1): the sender's MAC, in an NS (and RS, RA).
            SourceLinkLayerAddr = 1,
            /// Target Link-Layer Address (§4.6.1): the target's MAC, in an NA (and Redirect).
            TargetLinkLayerAddr = 2,
            /// Prefix Information (§4.6.2), in a Router Advertisement.
            PrefixInformation = 3,
            /// Redirected Header (§4.6.3), in a Redirect.
            RedirectedHeader = 4,
            /// MTU (§4.6.4), in a Router Advertisement.
            Mtu = 5,
        }
    }

    /// A zero-copy view of one option at the start of `buffer` (the buffer may run on past it).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Packet<T: AsRef<[u8]>> {
        buffer: T,
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Wraps `buffer` without checking it; getters panic if it is shorter than the option. Use
        /// [`Packet::new_checked`] for untrusted input.
        pub const fn new_unchecked(buffer: T) -> Packet<T> {
            Packet { buffer }
        }

        /// Wraps `buffer` after [`Packet::check_len`].
        ///
        /// # Errors
        /// As [`Packet::check_len`].
        pub fn new_checked(buffer: T) -> Result<Packet<T>> {
            let packet = Packet::new_unchecked(buffer);
            packet.check_len()?;
            Ok(packet)
        }

        /// Checks that the type and length bytes are there, that the length is not 0, and that the
        /// option's [`Packet::len`] bytes fit in the buffer, so that every getter is safe.
        ///
        /// # Errors
        /// * [`Error::Truncated`] (layer `Ndisc`) when the buffer is shorter than 2 bytes or than the
        ///   option;
        /// * [`Error::Malformed`] (layer `Ndisc`) when the length field is 0 (RFC 4861 §4.6: "nodes
        ///   MUST silently discard an ND packet that contains an option with length zero").
        pub fn check_len(&self) -> Result<()> {
            let got = self.buffer.as_ref().len();
            check_len(Layer::Ndisc, HEADER_LEN, got)?;
            if self.length() == 0 {
                return Err(Error::Malformed {
                    layer: Layer::Ndisc,
                    what: "option length is 0",
                });
            }
            check_len(Layer::Ndisc, self.len(), got)
        }

        /// Returns the underlying buffer.
        pub fn into_inner(self) -> T {
            self.buffer
        }

        /// The option type (byte 0).
        pub fn option_type(&self) -> OptionType {
            OptionType::from(self.buffer.as_ref()[field::TYPE])
        }

        /// The Length field (byte 1), in units of 8 bytes.
        pub fn length(&self) -> u8 {
            self.buffer.as_ref()[field::LENGTH]
        }

        /// Length of the whole option in bytes: [`Packet::length`] × 8.
        #[allow(clippy::len_without_is_empty)] // A valid option is never empty.
        pub fn len(&self) -> usize {
            usize::from(self.length()) * LENGTH_UNIT
        }

        /// The bytes after the type and length fields, up to the end of the option.
        pub fn data(&self) -> &[u8] {
            &self.buffer.as_ref()[HEADER_LEN..self.len()]
        }

        /// The MAC address of a link-layer address option (bytes 2..8). Needs a checked view.
        pub fn link_layer_addr(&self) -> Address {
            Address(read_array(self.buffer.as_ref(), field::LL_ADDR))
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the option type.
        pub fn set_option_type(&mut self, value: OptionType) {
            self.buffer.as_mut()[field::TYPE] = value.into();
        }

        /// Sets the Length field, in units of 8 bytes.
        pub fn set_length(&mut self, value: u8) {
            self.buffer.as_mut()[field::LENGTH] = value;
        }

        /// Sets the MAC address of a link-layer address option (bytes 2..8).
        pub fn set_link_layer_addr(&mut self, value: Address) {
            write_array(self.buffer.as_mut(), field::LL_ADDR, value.0);
        }
    }

    /// A parsed option.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Repr {
        /// Source Link-Layer Address (RFC 4861 §4.6.1).
        SourceLinkLayerAddr(Address),
        /// Target Link-Layer Address (RFC 4861 §4.6.1).
        TargetLinkLayerAddr(Address),
        /// Any other option: its type and Length field (units of 8 bytes); the data is not kept and
        /// emitted as zeros.
        Other {
            /// The option type.
            option_type: OptionType,
            /// The Length field, in units of 8 bytes (1 or more).
            length: u8,
        },
    }

    impl Repr {
        /// Parses an option; never panics. A link-layer address option longer than 8 bytes gives the
        /// MAC in its first 6 data bytes.
        ///
        /// # Errors
        /// As [`Packet::check_len`].
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
            packet.check_len()?;
            Ok(match packet.option_type() {
                OptionType::SourceLinkLayerAddr => {
                    Repr::SourceLinkLayerAddr(packet.link_layer_addr())
                }
                OptionType::TargetLinkLayerAddr => {
                    Repr::TargetLinkLayerAddr(packet.link_layer_addr())
                }
                option_type => Repr::Other {
                    option_type,
                    length: packet.length(),
                },
            })
        }

        /// Length in bytes of the option this emits: 8 for a link-layer address, Length × 8 otherwise.
        pub const fn buffer_len(&self) -> usize {
            match self {
                Repr::SourceLinkLayerAddr(_) | Repr::TargetLinkLayerAddr(_) => LINK_LAYER_ADDR_LEN,
                Repr::Other { length, .. } => *length as usize * LENGTH_UNIT,
            }
        }

        /// Writes the option into the first [`Repr::buffer_len`] bytes of `packet`.
        ///
        /// # Panics
        /// If the buffer is shorter than [`Repr::buffer_len`].
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            let (option_type, addr) = match *self {
                Repr::SourceLinkLayerAddr(addr) => (OptionType::SourceLinkLayerAddr, addr),
                Repr::TargetLinkLayerAddr(addr) => (OptionType::TargetLinkLayerAddr, addr),
                Repr::Other {
                    option_type,
                    length,
                } => {
                    packet.buffer.as_mut()[HEADER_LEN..self.buffer_len()].fill(0);
                    packet.set_option_type(option_type);
                    packet.set_length(length);
                    return;
                }
            };
            packet.set_option_type(option_type);
            packet.set_length((LINK_LAYER_ADDR_LEN / LENGTH_UNIT) as u8);
            packet.set_link_layer_addr(addr);
        }
    }
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    const MAC_A: Address = Address([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    const MAC_B: Address = Address([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    /// fe80:: + EUI-64 of MAC_A and MAC_B.
    const ADDR_A: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0x00ff, 0xfe12, 0x3456);
    const ADDR_B: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0x00ff, 0xfeab, 0xcdef);
    const SNM_B: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xffab, 0xcdef);

    // A asks for B's MAC: NS from ADDR_A to ff02::1:ffab:cdef, target ADDR_B, SLLA MAC_A. Checksum
    // computed independently (Python, RFC 4443 §2.3 pseudo header); the same bytes as the VFIO link
    // sent before this module existed.
    static NS_BYTES: [u8; 32] = [
        0x87, 0x00, 0x85, 0x9a, 0x00, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x50, 0x54, 0x00, 0xff, 0xfe, 0xab, 0xcd, 0xef, 0x01, 0x01, 0x52, 0x54, 0x00, 0x12,
        0x34, 0x56,
    ];
    const NS_REPR: Repr = Repr::NeighborSolicit {
        target_addr: ADDR_B,
        source_ll_addr: Some(MAC_A),
    };

    // B answers: NA from ADDR_B to ADDR_A, Solicited | Override, target ADDR_B, TLLA MAC_B.
    static NA_BYTES: [u8; 32] = [
        0x88, 0x00, 0x39, 0x97, 0x60, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x50, 0x54, 0x00, 0xff, 0xfe, 0xab, 0xcd, 0xef, 0x02, 0x01, 0x52, 0x54, 0x00, 0xab,
        0xcd, 0xef,
    ];
    const NA_REPR: Repr = Repr::NeighborAdvert {
        flags: NeighborFlags::SOLICITED.union(NeighborFlags::OVERRIDE),
        target_addr: ADDR_B,
        target_ll_addr: Some(MAC_B),
    };

    fn ip(src_addr: Ipv6Addr, dst_addr: Ipv6Addr, payload_len: usize) -> ipv6::Repr {
        ipv6::Repr {
            src_addr,
            dst_addr,
            next_header: IpProtocol::Icmpv6,
            payload_len,
            hop_limit: HOP_LIMIT,
            dscp: 0,
            ecn: crate::ipv4::Ecn::NotEct,
            flow_label: 0,
        }
    }

    fn ns_ip() -> ipv6::Repr {
        ip(ADDR_A, SNM_B, NS_BYTES.len())
    }

    fn na_ip() -> ipv6::Repr {
        ip(ADDR_B, ADDR_A, NA_BYTES.len())
    }

    #[test]
    fn addresses() {
        assert_eq!(solicited_node_addr(&ADDR_B), SNM_B);
        assert_eq!(
            multicast_mac(&SNM_B),
            Address([0x33, 0x33, 0xff, 0xab, 0xcd, 0xef])
        );
        assert_eq!(ALL_NODES, "ff02::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(IpProtocol::from(58), IpProtocol::Icmpv6);
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&NS_BYTES[..]).unwrap();
        assert_eq!(p.msg_type(), Message::NeighborSolicit);
        assert_eq!(p.msg_code(), 0);
        assert_eq!(p.checksum(), 0x859a);
        assert_eq!(p.neighbor_flags(), NeighborFlags::empty());
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.target_addr(), ADDR_B);
        assert!(p.verify_checksum(&ADDR_A, &SNM_B));
        assert!(!p.verify_checksum(&ADDR_A, &ADDR_B));
        let opts: Vec<_> = p.iter_options().collect();
        assert_eq!(opts.len(), 1);
        let opt = opts[0].as_ref().unwrap();
        assert_eq!(opt.option_type(), option::OptionType::SourceLinkLayerAddr);
        assert_eq!(opt.length(), 1);
        assert_eq!(opt.len(), 8);
        assert_eq!(opt.data(), &NS_BYTES[26..]);
        assert_eq!(opt.link_layer_addr(), MAC_A);

        let p = Packet::new_checked(&NA_BYTES[..]).unwrap();
        assert_eq!(p.msg_type(), Message::NeighborAdvert);
        assert_eq!(
            p.neighbor_flags(),
            NeighborFlags::SOLICITED | NeighborFlags::OVERRIDE
        );
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.target_addr(), ADDR_B);
        assert_eq!(p.options(), &NA_BYTES[24..]);
        assert!(p.verify_checksum(&ADDR_B, &ADDR_A));
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 32];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_msg_type(Message::NeighborAdvert);
        p.set_msg_code(0);
        p.set_neighbor_flags(NeighborFlags::SOLICITED | NeighborFlags::OVERRIDE);
        p.set_target_addr(&ADDR_B);
        let mut opt = option::Packet::new_unchecked(p.options_mut());
        opt.set_option_type(option::OptionType::TargetLinkLayerAddr);
        opt.set_length(1);
        opt.set_link_layer_addr(MAC_B);
        p.fill_checksum(&ADDR_B, &ADDR_A);
        assert_eq!(buf, NA_BYTES);
    }

    #[test]
    fn parse_and_emit() {
        for (bytes, repr, ip) in [(&NS_BYTES, NS_REPR, ns_ip()), (&NA_BYTES, NA_REPR, na_ip())] {
            let p = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(Repr::parse(&ip, &p), Ok(repr));
            assert_eq!(repr.buffer_len(), 32);
            let mut buf = [0xa5u8; 34];
            repr.emit(
                &ip.src_addr,
                &ip.dst_addr,
                &mut Packet::new_unchecked(&mut buf[..]),
            );
            assert_eq!(&buf[..32], &bytes[..]);
            assert_eq!(buf[32..], [0xa5, 0xa5], "emit must not touch what follows");
        }
    }

    #[test]
    fn without_link_layer_option() {
        let repr = Repr::NeighborAdvert {
            flags: NeighborFlags::OVERRIDE,
            target_addr: ADDR_B,
            target_ll_addr: None,
        };
        assert_eq!(repr.buffer_len(), HEADER_LEN);
        let mut buf = [0xa5u8; HEADER_LEN];
        repr.emit(
            &ADDR_B,
            &ALL_NODES,
            &mut Packet::new_unchecked(&mut buf[..]),
        );
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.iter_options().count(), 0);
        assert_eq!(
            Repr::parse(&ip(ADDR_B, ALL_NODES, HEADER_LEN), &p),
            Ok(repr)
        );
    }

    #[test]
    fn other_options_are_skipped_and_the_first_link_layer_option_wins() {
        // NS with an MTU option (8 bytes), the SLLA, then a second SLLA: the first SLLA is taken.
        let mut buf = [0u8; HEADER_LEN + 24];
        buf[..HEADER_LEN].copy_from_slice(&NS_BYTES[..HEADER_LEN]);
        let mtu = option::Repr::Other {
            option_type: option::OptionType::Mtu,
            length: 1,
        };
        mtu.emit(&mut option::Packet::new_unchecked(&mut buf[24..]));
        option::Repr::SourceLinkLayerAddr(MAC_A)
            .emit(&mut option::Packet::new_unchecked(&mut buf[32..]));
        option::Repr::SourceLinkLayerAddr(MAC_B)
            .emit(&mut option::Packet::new_unchecked(&mut buf[40..]));
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.fill_checksum(&ADDR_A, &SNM_B);
        let p = Packet::new_checked(&buf[..]).unwrap();
        let parsed: Vec<_> = p
            .iter_options()
            .map(|o| option::Repr::parse(&o.unwrap()).unwrap())
            .collect();
        assert_eq!(
            parsed,
            [
                mtu,
                option::Repr::SourceLinkLayerAddr(MAC_A),
                option::Repr::SourceLinkLayerAddr(MAC_B)
            ]
        );
        assert_eq!(Repr::parse(&ip(ADDR_A, SNM_B, buf.len()), &p), Ok(NS_REPR));
    }

    #[test]
    fn truncated_is_refused() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                Packet::new_checked(&NS_BYTES[..len]),
                Err(Error::Truncated {
                    layer: Layer::Ndisc,
                    need: HEADER_LEN,
                    got: len
                })
            );
            let p = Packet::new_unchecked(&NS_BYTES[..len]);
            assert!(Repr::parse(&ns_ip(), &p).is_err());
        }
        // Cut inside the option: its length (8) runs past the message. Checksum fixed so that only
        // the option is wrong.
        for len in HEADER_LEN + 1..NS_BYTES.len() {
            let mut bytes = NS_BYTES[..len].to_vec();
            Packet::new_unchecked(&mut bytes[..]).fill_checksum(&ADDR_A, &SNM_B);
            let p = Packet::new_checked(&bytes[..]).unwrap();
            let need = if len == HEADER_LEN + 1 { 2 } else { 8 };
            assert_eq!(
                Repr::parse(&ip(ADDR_A, SNM_B, len), &p),
                Err(Error::Truncated {
                    layer: Layer::Ndisc,
                    need,
                    got: len - HEADER_LEN
                })
            );
        }
    }

    #[test]
    fn malformed_is_refused() {
        let malformed = |r: Result<Repr>| matches!(r, Err(Error::Malformed { .. }));
        let parse = |bytes: &[u8], ip: &ipv6::Repr| {
            let mut bytes = bytes.to_vec();
            Packet::new_unchecked(&mut bytes[..]).fill_checksum(&ip.src_addr, &ip.dst_addr);
            Repr::parse(ip, &Packet::new_checked(&bytes[..]).unwrap())
        };
        // Not NS / NA (an echo request, a router advertisement).
        for ty in [128u8, 134] {
            let mut b = NS_BYTES;
            b[0] = ty;
            assert!(malformed(parse(&b, &ns_ip())));
        }
        // Hop limit below 255: forwarded by a router.
        let mut routed = ns_ip();
        routed.hop_limit = 254;
        assert!(malformed(Repr::parse(
            &routed,
            &Packet::new_checked(&NS_BYTES[..]).unwrap()
        )));
        // Code not 0.
        let mut b = NS_BYTES;
        b[1] = 1;
        assert!(malformed(parse(&b, &ns_ip())));
        // Multicast target.
        let mut b = NS_BYTES;
        b[8..24].copy_from_slice(&SNM_B.octets());
        assert!(malformed(parse(&b, &ns_ip())));
        // An option of length 0, after the link-layer option too.
        let mut b = [0u8; 40];
        b[..32].copy_from_slice(&NS_BYTES);
        b[32] = 5;
        assert!(malformed(parse(&b, &ip(ADDR_A, SNM_B, 40))));
        let mut b = NS_BYTES;
        b[25] = 0;
        assert!(malformed(parse(&b, &ns_ip())));
        // A corrupted byte, or the wrong addresses: the checksum does not verify.
        let mut b = NS_BYTES;
        b[31] ^= 1;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&ns_ip(), &p),
            Err(Error::BadChecksum(Layer::Ndisc))
        );
        let p = Packet::new_checked(&NS_BYTES[..]).unwrap();
        assert_eq!(
            Repr::parse(&na_ip(), &p),
            Err(Error::BadChecksum(Layer::Ndisc))
        );
    }

    #[test]
    fn reserved_bits_ignored_on_receipt() {
        let mut b = NA_BYTES;
        b[4] |= 0x1f;
        b[7] = 0xff;
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.fill_checksum(&ADDR_B, &ADDR_A);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.reserved(), 0x1f00_00ff);
        assert_eq!(Repr::parse(&na_ip(), &p), Ok(NA_REPR));
    }

    proptest! {
        #[test]
        fn round_trip(
            solicit: bool,
            flags in 0u8..8,
            target: [u8; 16],
            mac: Option<[u8; 6]>,
            src: [u8; 16],
            dst: [u8; 16],
        ) {
            let target_addr = Ipv6Addr::from(target);
            prop_assume!(!target_addr.is_multicast());
            let ll = mac.map(Address);
            let repr = if solicit {
                Repr::NeighborSolicit { target_addr, source_ll_addr: ll }
            } else {
                Repr::NeighborAdvert {
                    flags: NeighborFlags::from_bits_truncate(flags << 5),
                    target_addr,
                    target_ll_addr: ll,
                }
            };
            let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
            let mut buf = std::vec![0xa5u8; repr.buffer_len()];
            repr.emit(&src, &dst, &mut Packet::new_unchecked(&mut buf[..]));
            let p = Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Repr::parse(&ip(src, dst, buf.len()), &p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let ip = ns_ip();
            let p = Packet::new_unchecked(&data[..]);
            let _ = Repr::parse(&ip, &p);
            if let Ok(p) = Packet::new_checked(&data[..]) {
                for opt in p.iter_options().flatten() {
                    let _ = option::Repr::parse(&opt);
                    let _ = opt.data();
                }
                let _ = (p.msg_type(), p.neighbor_flags(), p.reserved(), p.target_addr());
            }
            let _ = option::Repr::parse(&option::Packet::new_unchecked(&data[..]));
        }
    }
}
