//! The UDP header (RFC 768) and the RoCEv2 use of it.
//!
//! ```text
//!  0      7 8     15 16    23 24    31
//! +--------+--------+--------+--------+
//! |   Source Port   | Destination Port|
//! +--------+--------+--------+--------+
//! |     Length      |    Checksum     |
//! +--------+--------+--------+--------+
//! |  payload: BTH, ext. headers, payload, pad, ICRC
//! +-----------------------------------
//! ```
//!
//! RoCEv2 (IBTA Annex A17) sends every packet to UDP destination port [`ROCEV2_PORT`] (4791). The
//! source port carries no meaning to the receiver; senders use it for flow entropy so that ECMP
//! switches spread queue pairs over paths ([`rocev2_src_port`]). Length counts the 8-byte header and
//! the payload, which ends with the 4-byte ICRC.
//!
//! ## Checksum
//! The UDP checksum (RFC 768; RFC 8200 §8.1 for IPv6) is the ones-complement of the ones-complement
//! sum of a pseudo header (addresses, protocol 17, UDP length), the UDP header and the payload
//! ([`crate::checksum`]). A computed value of 0 is sent as 0xFFFF, because 0 on the wire means "no
//! checksum".
//!
//! * Over IPv4 a zero checksum is always allowed (RFC 768).
//! * Over IPv6 RFC 8200 §8.1 requires a checksum, but RFC 6935 and RFC 6936 allow a zero checksum for
//!   UDP tunnel protocols, and RoCEv2 is one: Linux rxe (drivers/infiniband/sw/rxe/rxe_net.c,
//!   `prepare_udp_hdr`) writes 0 over IPv4 and IPv6 alike and opens its receive socket with zero
//!   checksums accepted. The ICRC protects the packet end to end either way. So a zero checksum
//!   verifies as correct on both families here.
//!
//! The UDP checksum covers the ICRC, so it must be computed after the ICRC is in place (the ICRC
//! masks the UDP checksum field, so the order never matters the other way round). When the payload is
//! gathered from several slices rather than copied next to the header, use
//! [`checksum_with_payload`].

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum::{self, Accumulator};
use crate::error::{check_len, Error, Layer, Result};
use crate::ipv4::IpProtocol;
use crate::wire_field::{read_u16, write_u16};

/// The IANA-assigned UDP destination port of RoCEv2 (IBTA Annex A17).
pub const ROCEV2_PORT: u16 = 4791;

/// The lowest source port [`rocev2_src_port`] returns (0xC000, the start of the dynamic port range,
/// RFC 6335 §6).
pub const ROCEV2_SRC_PORT_MIN: u16 = 0xC000;

/// 2^32 / φ, the Fibonacci-hashing multiplier (Knuth, TAOCP vol. 3 §6.4), in the form
/// 2^32 − 0x9E3779B9 that Linux's `hash_32` uses.
const FIBONACCI_MULTIPLIER: u32 = 0x61C8_8647;

/// The RoCEv2 UDP source port for a queue pair: 0xC000 + a 14-bit hash of the 24-bit QPN, so
/// always in 0xC000..=0xFFFF.
///
/// IBTA Annex A17 asks senders to put flow entropy in the UDP source port so that ECMP spreads QPs
/// over paths, while all packets of one QP take one path (they must stay in order). The hash is
/// Fibonacci hashing of `qpn & 0xFF_FFFF`, keeping the top 14 bits of the 32-bit product, which is the
/// value Linux rxe picks (`0xC000 + hash_32(qpn, 14)`), so captures of rxe traffic match.
/// Consecutive QPNs land far apart.
pub const fn rocev2_src_port(qpn: u32) -> u16 {
    let hash = (qpn & 0x00ff_ffff).wrapping_mul(FIBONACCI_MULTIPLIER) >> (32 - 14);
    ROCEV2_SRC_PORT_MIN | hash as u16
}

/// The RoCEv2 UDP source port derived from a 20-bit IPv6 flow label (or GRH flow label), as
/// rdma-core and Linux do (`rdma_flow_label_to_udp_sport`): the low 14 bits XOR the high 6 bits,
/// plus 0xC000. Use this when the address handle carries a flow label, so that the IPv6 flow label
/// and the UDP source port describe the same flow.
pub const fn rocev2_src_port_from_flow_label(flow_label: u32) -> u16 {
    let low = flow_label & 0x3fff;
    let high = (flow_label & 0xf_c000) >> 14;
    ROCEV2_SRC_PORT_MIN | (low ^ high) as u16
}

pub(crate) mod field {
    use core::ops::Range;

    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header, in bytes: 8 (RFC 768).
pub const HEADER_LEN: usize = field::CHECKSUM.end;
/// The largest payload the 16-bit Length field can describe, in bytes (65535 − 8).
pub const MAX_PAYLOAD_LEN: usize = u16::MAX as usize - HEADER_LEN;

/// The checksum as it goes on the wire, from the (not inverted) ones-complement sum of everything it
/// covers: inverted, with 0 replaced by 0xFFFF (RFC 768).
pub const fn wire_checksum(sum: u16) -> u16 {
    match !sum {
        0 => 0xffff,
        c => c,
    }
}

/// The UDP checksum to put on the wire, computed from the pseudo-header sum (`pseudo`, from
/// [`checksum::pseudo_header_v4`] / [`checksum::pseudo_header_v6`] or
/// [`ChecksumMode::pseudo_header_sum`]), the 8-byte UDP header and the payload given as a list of
/// slices in order (for example BTH and extension headers, the data of several SGEs, the pad and the
/// ICRC). The slices are summed as their concatenation: an odd-length slice in the middle of the list
/// is handled ([`Accumulator`]). Bytes 6..8 of `header` (the checksum field) are ignored, so the
/// header may already hold any checksum value. Never panics.
///
/// The result is never 0 (a computed 0 is sent as 0xFFFF, RFC 768).
pub fn checksum_with_payload(pseudo: u16, header: &[u8], payload: &[&[u8]]) -> u16 {
    let mut acc = Accumulator::new();
    acc.add_sum(pseudo);
    acc.add(header.get(..field::CHECKSUM.start).unwrap_or(header));
    if let Some(rest) = header.get(field::CHECKSUM.end..) {
        acc.add(rest);
    }
    for slice in payload {
        acc.add(slice);
    }
    wire_checksum(acc.sum())
}

/// How [`Repr::emit`] fills the checksum field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumMode {
    /// Write 0, "no checksum": allowed over IPv4 (RFC 768) and for RoCEv2 over IPv6 (RFC 6935,
    /// RFC 6936; Linux rxe sends this). Also the choice when the caller fills the checksum later with
    /// [`checksum_with_payload`] or when the NIC offloads it.
    Zero,
    /// Compute the checksum with the IPv4 pseudo header of these addresses.
    ComputeV4 {
        /// IPv4 source address.
        src_addr: Ipv4Addr,
        /// IPv4 destination address.
        dst_addr: Ipv4Addr,
    },
    /// Compute the checksum with the IPv6 pseudo header of these addresses.
    ComputeV6 {
        /// IPv6 source address.
        src_addr: Ipv6Addr,
        /// IPv6 destination address.
        dst_addr: Ipv6Addr,
    },
}

impl ChecksumMode {
    /// The pseudo-header sum for a datagram of `udp_len` bytes (header + payload), or `None` for
    /// [`ChecksumMode::Zero`]. Feed it to [`checksum_with_payload`].
    pub fn pseudo_header_sum(&self, udp_len: u16) -> Option<u16> {
        let udp = u8::from(IpProtocol::Udp);
        match *self {
            ChecksumMode::Zero => None,
            ChecksumMode::ComputeV4 { src_addr, dst_addr } => Some(checksum::pseudo_header_v4(
                src_addr,
                dst_addr,
                udp,
                u32::from(udp_len),
            )),
            ChecksumMode::ComputeV6 { src_addr, dst_addr } => Some(checksum::pseudo_header_v6(
                src_addr,
                dst_addr,
                udp,
                u32::from(udp_len),
            )),
        }
    }
}

/// A zero-copy view of a UDP datagram (RFC 768): the 8-byte header, then the payload up to Length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; getters may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks it with [`Packet::check_len`].
    ///
    /// # Errors
    /// As [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the 8-byte header fits and that the Length field is at least 8 and fits in the
    /// buffer, so that every getter and [`Packet::payload`] are safe. Bytes in the buffer after Length
    /// are not part of the datagram.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Udp`) when the buffer is shorter than 8 bytes or than Length;
    /// [`Error::BadLength`] when Length < 8.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        check_len(Layer::Udp, HEADER_LEN, len)?;
        let udp_len = usize::from(self.len());
        if udp_len < HEADER_LEN {
            return Err(Error::BadLength(Layer::Udp));
        }
        check_len(Layer::Udp, udp_len, len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port (bytes 0..2).
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    /// Destination port (bytes 2..4); [`ROCEV2_PORT`] for RoCEv2.
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// Length: header plus payload, in bytes (bytes 4..6).
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// Whether the payload is empty (Length is 8 or less).
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// The checksum field (bytes 6..8); 0 means "not computed".
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The payload: bytes 8..Length. Needs a checked view.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// The ones-complement sum over the pseudo header and the Length bytes of the datagram, or `None`
    /// when Length is not within the buffer.
    fn sum_with(&self, pseudo: u16) -> Option<u16> {
        let datagram = self.buffer.as_ref().get(..usize::from(self.len()))?;
        Some(checksum::combine(&[pseudo, checksum::data(datagram)]))
    }

    /// Whether the checksum verifies over IPv4: true when the field is 0 ("not computed", RFC 768) or
    /// when pseudo header, header and payload sum to 0xFFFF. False when Length exceeds the buffer.
    pub fn verify_checksum_v4(&self, src_addr: Ipv4Addr, dst_addr: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let pseudo = checksum::pseudo_header_v4(
            src_addr,
            dst_addr,
            IpProtocol::Udp.into(),
            self.len().into(),
        );
        self.sum_with(pseudo) == Some(0xffff)
    }

    /// Whether the checksum verifies over IPv6: true when the field is 0 (accepted for RoCEv2 as a
    /// UDP tunnel, RFC 6935 / RFC 6936; Linux rxe sends 0; see the module docs) or when pseudo header
    /// (RFC 8200 §8.1), header and payload sum to 0xFFFF. False when Length exceeds the buffer.
    pub fn verify_checksum_v6(&self, src_addr: Ipv6Addr, dst_addr: Ipv6Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let pseudo = checksum::pseudo_header_v6(
            src_addr,
            dst_addr,
            IpProtocol::Udp.into(),
            self.len().into(),
        );
        self.sum_with(pseudo) == Some(0xffff)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT, port);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, port: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT, port);
    }

    /// Sets Length (header plus payload, in bytes).
    pub fn set_len(&mut self, len: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, checksum: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, checksum);
    }

    fn fill_checksum_with(&mut self, pseudo: u16) {
        self.set_checksum(0);
        let datagram = &self.buffer.as_ref()[..usize::from(self.len())];
        let sum = checksum::combine(&[pseudo, checksum::data(datagram)]);
        self.set_checksum(wire_checksum(sum));
    }

    /// Computes the checksum over the IPv4 pseudo header and the Length bytes of the datagram (the
    /// payload must be in place) and stores it; 0 is stored as 0xFFFF.
    ///
    /// # Panics
    /// If the buffer is shorter than Length.
    pub fn fill_checksum_v4(&mut self, src_addr: Ipv4Addr, dst_addr: Ipv4Addr) {
        let pseudo = checksum::pseudo_header_v4(
            src_addr,
            dst_addr,
            IpProtocol::Udp.into(),
            self.len().into(),
        );
        self.fill_checksum_with(pseudo);
    }

    /// Computes the checksum over the IPv6 pseudo header and the Length bytes of the datagram (the
    /// payload must be in place) and stores it; 0 is stored as 0xFFFF.
    ///
    /// # Panics
    /// If the buffer is shorter than Length.
    pub fn fill_checksum_v6(&mut self, src_addr: Ipv6Addr, dst_addr: Ipv6Addr) {
        let pseudo = checksum::pseudo_header_v6(
            src_addr,
            dst_addr,
            IpProtocol::Udp.into(),
            self.len().into(),
        );
        self.fill_checksum_with(pseudo);
    }

    /// The payload (bytes 8..Length), mutable. Needs a checked view.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// A parsed UDP header (RFC 768).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source port (flow entropy for RoCEv2, [`rocev2_src_port`]).
    pub src_port: u16,
    /// Destination port ([`ROCEV2_PORT`] for RoCEv2).
    pub dst_port: u16,
    /// Payload length in bytes (Length − 8).
    pub payload_len: usize,
}

impl Repr {
    /// Parses the header; never panics. The checksum is **not** verified here, because that needs the
    /// IP addresses: call [`Packet::verify_checksum_v4`] or [`Packet::verify_checksum_v6`] first.
    ///
    /// # Errors
    /// As [`Packet::check_len`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: usize::from(packet.len()) - HEADER_LEN,
        })
    }

    /// Length of the header this emits, in bytes (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header: ports, Length = 8 + `payload_len`, and the checksum chosen by `checksum`.
    ///
    /// With [`ChecksumMode::Zero`] only the 8 header bytes are touched, so the payload need not be
    /// there yet; fill the checksum later with [`checksum_with_payload`] + [`Packet::set_checksum`]
    /// if wanted. With `ComputeV4` / `ComputeV6` the payload (ICRC included) must already be in the
    /// buffer after the header.
    ///
    /// # Panics
    /// If `payload_len` exceeds [`MAX_PAYLOAD_LEN`], if the buffer is shorter than 8 bytes, or, when
    /// computing the checksum, shorter than 8 + `payload_len`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        checksum: ChecksumMode,
    ) {
        assert!(
            self.payload_len <= MAX_PAYLOAD_LEN,
            "UDP payload of {} bytes exceeds the 16-bit Length",
            self.payload_len
        );
        // One 8-byte store (the checksum zero for now): no per-field bounds checks.
        let mut h = [0u8; HEADER_LEN];
        write_u16(&mut h, field::SRC_PORT, self.src_port);
        write_u16(&mut h, field::DST_PORT, self.dst_port);
        write_u16(
            &mut h,
            field::LENGTH,
            (HEADER_LEN + self.payload_len) as u16,
        );
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&h);
        match checksum {
            ChecksumMode::Zero => {}
            ChecksumMode::ComputeV4 { src_addr, dst_addr } => {
                packet.fill_checksum_v4(src_addr, dst_addr)
            }
            ChecksumMode::ComputeV6 { src_addr, dst_addr } => {
                packet.fill_checksum_v6(src_addr, dst_addr)
            }
        }
    }
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use crate::ethernet;
    use crate::ipv4::{self, Ecn};
    use crate::ipv6;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The scapy RoCEv2 vector (scapy 2.5, contrib/roce.py):
    ///
    /// ```text
    /// Ether(dst='24:8a:07:a8:fa:22', src='24:8a:07:a8:fa:22') /
    /// IP(tos=1, id=1144, flags='DF', ttl=64, src='192.168.0.7', dst='192.168.0.7') /
    /// UDP(sport=49152, dport=4791) /
    /// BTH(opcode=0x24, migreq=1, padcount=2, pkey=0xffff, dqpn=211, psn=13571856) /
    /// Raw(bytes.fromhex('4630818be28935d90e9a95505401be885e500000'))
    /// ```
    ///
    /// Opcode 0x24 is UC SEND_ONLY. IPv4 total length 64, checksum 0xb4d5; UDP length 44, checksum
    /// 0xaca2; ICRC 0x78f353f3 in the last four bytes.
    static ROCE_V4: [u8; 78] = [
        0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x08,
        0x00, // Ethernet
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00,
        0x07, 0xc0, 0xa8, 0x00, 0x07, // IPv4
        0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, // UDP
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, // BTH
        0x46, 0x30, 0x81, 0x8b, 0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50, 0x54, 0x01, 0xbe,
        0x88, 0x5e, 0x50, 0x00, 0x00, // payload
        0x78, 0xf3, 0x53, 0xf3, // ICRC
    ];

    /// The UDP payload of the vectors below: the BTH, payload and ICRC of [`ROCE_V4`].
    fn roce_payload() -> &'static [u8] {
        &ROCE_V4[42..]
    }

    /// scapy: Ether(dst='02:00:00:00:00:02', src='02:00:00:00:00:01') / IPv6(src='fd00::1',
    /// dst='fd00::2', tc=0x62, fl=0x12345, hlim=64) / UDP(sport=0xc123, dport=4791, chksum=0) /
    /// Raw(<the 36 bytes of roce_payload()>); 98 bytes. With the checksum left to scapy it is 0x32da
    /// (bytes 60..62).
    static ROCE_V6_ZERO: [u8; 62] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x86,
        0xdd, // Ethernet
        0x66, 0x21, 0x23, 0x45, 0x00, 0x2c, 0x11, 0x40, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // IPv6
        0xc1, 0x23, 0x12, 0xb7, 0x00, 0x2c, 0x00, 0x00, // UDP
    ];
    const V6_CHECKSUM: u16 = 0x32da;

    /// scapy: Ether(dst='02:00:00:00:00:02', src='02:00:00:00:00:01') / Dot1Q(prio=3, id=1, vlan=100) /
    /// IP(src='10.0.0.1', dst='10.0.0.2', tos=0x6a, id=7, ttl=64, flags='DF') /
    /// UDP(sport=0xc000, dport=4791) / Raw(<roce_payload()>): IPv4 checksum 0x263a, UDP 0x19ff.
    static ROCE_VLAN: [u8; 46] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x81, 0x00, 0x70,
        0x64, 0x08, 0x00, // Ethernet + 802.1Q
        0x45, 0x6a, 0x00, 0x40, 0x00, 0x07, 0x40, 0x00, 0x40, 0x11, 0x26, 0x3a, 0x0a, 0x00, 0x00,
        0x01, 0x0a, 0x00, 0x00, 0x02, // IPv4
        0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0x19, 0xff, // UDP
    ];

    /// scapy: IP(src='10.0.0.1', dst='10.0.0.2', tos=0x0a, id=0x1234, flags=0, ttl=17) /
    /// UDP(sport=1234, dport=4791) / Raw(b'abcdefg'): odd payload, UDP checksum 0x4317.
    static ODD_UDP: [u8; 15] = [
        0x04, 0xd2, 0x12, 0xb7, 0x00, 0x0f, 0x43, 0x17, b'a', b'b', b'c', b'd', b'e', b'f', b'g',
    ];

    const HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 7);
    const IP4_1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const IP4_2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const IP6_1: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
    const IP6_2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

    fn v6_frame(checksum: u16) -> [u8; 98] {
        let mut frame = [0u8; 98];
        frame[..62].copy_from_slice(&ROCE_V6_ZERO);
        frame[60..62].copy_from_slice(&checksum.to_be_bytes());
        frame[62..].copy_from_slice(roce_payload());
        frame
    }

    fn vlan_frame() -> [u8; 82] {
        let mut frame = [0u8; 82];
        frame[..46].copy_from_slice(&ROCE_VLAN);
        frame[46..].copy_from_slice(roce_payload());
        frame
    }

    #[test]
    fn deconstruct() {
        let udp = Packet::new_checked(&ROCE_V4[34..]).unwrap();
        assert_eq!(udp.src_port(), 49152);
        assert_eq!(udp.dst_port(), ROCEV2_PORT);
        assert_eq!(udp.len(), 44);
        assert!(!udp.is_empty());
        assert_eq!(udp.checksum(), 0xaca2);
        assert_eq!(udp.payload(), roce_payload());
        assert_eq!(udp.payload().len(), 36);
        assert_eq!(
            &udp.payload()[..12],
            &[0x24, 0x60, 0xff, 0xff, 0, 0, 0, 0xd3, 0, 0xcf, 0x17, 0x10]
        );
        assert_eq!(&udp.payload()[32..], &[0x78, 0xf3, 0x53, 0xf3]);
        assert!(udp.verify_checksum_v4(HOST, HOST));
        assert!(!udp.verify_checksum_v4(HOST, IP4_1));
    }

    #[test]
    fn construct() {
        let mut bytes = [0xa5u8; 44];
        bytes[8..].copy_from_slice(roce_payload());
        let mut udp = Packet::new_unchecked(&mut bytes[..]);
        udp.set_src_port(49152);
        udp.set_dst_port(ROCEV2_PORT);
        udp.set_len(44);
        udp.fill_checksum_v4(HOST, HOST);
        assert_eq!(bytes, ROCE_V4[34..]);
    }

    #[test]
    fn parse_and_emit() {
        let repr = Repr {
            src_port: 49152,
            dst_port: ROCEV2_PORT,
            payload_len: 36,
        };
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ROCE_V4[34..])),
            Ok(repr)
        );
        assert_eq!(repr.buffer_len(), 8);

        // Zero: only the header is written.
        let mut bytes = [0xa5u8; 44];
        repr.emit(
            &mut Packet::new_unchecked(&mut bytes[..]),
            ChecksumMode::Zero,
        );
        assert_eq!(bytes[..8], [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0x00, 0x00]);
        assert_eq!(bytes[8..], [0xa5; 36]);

        // Computed over the payload already in place.
        bytes[8..].copy_from_slice(roce_payload());
        let mode = ChecksumMode::ComputeV4 {
            src_addr: HOST,
            dst_addr: HOST,
        };
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]), mode);
        assert_eq!(bytes, ROCE_V4[34..]);
    }

    #[test]
    fn whole_ipv4_frame_layer_by_layer() {
        // Parse.
        let frame = ethernet::Frame::new_checked(&ROCE_V4[..]).unwrap();
        let eth = ethernet::Repr::parse(&frame).unwrap();
        assert_eq!(eth.ethertype, ethernet::EtherType::Ipv4);
        assert_eq!(eth.vlan, None);
        let ip_packet = ipv4::Packet::new_checked(frame.payload()).unwrap();
        let ip = ipv4::Repr::parse(&ip_packet).unwrap();
        assert_eq!(ip.protocol, IpProtocol::Udp);
        assert_eq!(ip.payload_len, 44);
        let udp_packet = Packet::new_checked(ip_packet.payload()).unwrap();
        assert!(udp_packet.verify_checksum_v4(ip.src_addr, ip.dst_addr));
        let udp = Repr::parse(&udp_packet).unwrap();
        assert_eq!(udp.dst_port, ROCEV2_PORT);

        // Emit into a 0xa5 buffer, header first, payload, then the checksums.
        let mut out = [0xa5u8; 78];
        eth.emit(&mut ethernet::Frame::new_unchecked(&mut out[..]));
        let (_, rest) = out.split_at_mut(eth.buffer_len());
        ip.emit(&mut ipv4::Packet::new_unchecked(&mut rest[..]));
        let (_, rest) = rest.split_at_mut(ip.buffer_len());
        rest[8..].copy_from_slice(roce_payload());
        let mode = ChecksumMode::ComputeV4 {
            src_addr: ip.src_addr,
            dst_addr: ip.dst_addr,
        };
        udp.emit(&mut Packet::new_unchecked(&mut rest[..]), mode);
        assert_eq!(out, ROCE_V4);
    }

    #[test]
    fn gathered_payload_checksum() {
        let udp = Packet::new_unchecked(&ROCE_V4[34..]);
        let mode = ChecksumMode::ComputeV4 {
            src_addr: HOST,
            dst_addr: HOST,
        };
        let pseudo = mode.pseudo_header_sum(44).unwrap();
        let header = &ROCE_V4[34..42];
        let p = roce_payload();
        // Odd-length slices in the middle: 12 (BTH) | 7 | 13 | 4 (ICRC), and 1 | 34 | 1.
        assert_eq!(
            checksum_with_payload(
                pseudo,
                header,
                &[&p[..12], &p[12..19], &p[19..32], &p[32..]]
            ),
            0xaca2
        );
        assert_eq!(
            checksum_with_payload(pseudo, header, &[&p[..1], &[], &p[1..35], &p[35..]]),
            0xaca2
        );
        assert_eq!(checksum_with_payload(pseudo, header, &[p]), udp.checksum());
        // The checksum field in `header` is ignored.
        let mut zeroed = [0u8; 8];
        zeroed.copy_from_slice(header);
        zeroed[6] = 0;
        zeroed[7] = 0;
        assert_eq!(checksum_with_payload(pseudo, &zeroed, &[p]), 0xaca2);
        assert_eq!(ChecksumMode::Zero.pseudo_header_sum(44), None);

        // scapy's odd payload.
        let odd = ChecksumMode::ComputeV4 {
            src_addr: IP4_1,
            dst_addr: IP4_2,
        };
        let pseudo = odd.pseudo_header_sum(15).unwrap();
        assert_eq!(
            checksum_with_payload(pseudo, &ODD_UDP[..8], &[b"abc", b"d", b"efg"]),
            0x4317
        );
        assert!(Packet::new_checked(&ODD_UDP[..])
            .unwrap()
            .verify_checksum_v4(IP4_1, IP4_2));
        let mut bytes = ODD_UDP;
        Repr {
            src_port: 1234,
            dst_port: ROCEV2_PORT,
            payload_len: 7,
        }
        .emit(&mut Packet::new_unchecked(&mut bytes[..]), odd);
        assert_eq!(bytes, ODD_UDP);
    }

    #[test]
    fn ipv6_zero_and_computed() {
        for checksum in [0, V6_CHECKSUM] {
            let bytes = v6_frame(checksum);
            let frame = ethernet::Frame::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                ethernet::Repr::parse(&frame).unwrap().ethertype,
                ethernet::EtherType::Ipv6
            );
            let ip_packet = ipv6::Packet::new_checked(frame.payload()).unwrap();
            let ip = ipv6::Repr::parse(&ip_packet).unwrap();
            assert_eq!(ip.next_header, IpProtocol::Udp);
            assert_eq!((ip.dscp, ip.ecn, ip.flow_label), (0x18, Ecn::Ect0, 0x12345));
            let udp_packet = Packet::new_checked(ip_packet.payload()).unwrap();
            assert_eq!(udp_packet.checksum(), checksum);
            assert!(udp_packet.verify_checksum_v6(IP6_1, IP6_2));
            assert_eq!(udp_packet.payload(), roce_payload());
            let udp = Repr::parse(&udp_packet).unwrap();
            assert_eq!(udp.src_port, 0xc123);

            // Emit the UDP datagram both ways.
            let mode = if checksum == 0 {
                ChecksumMode::Zero
            } else {
                ChecksumMode::ComputeV6 {
                    src_addr: IP6_1,
                    dst_addr: IP6_2,
                }
            };
            let mut out = [0xa5u8; 44];
            out[8..].copy_from_slice(roce_payload());
            udp.emit(&mut Packet::new_unchecked(&mut out[..]), mode);
            assert_eq!(out, bytes[54..]);
        }
        // A wrong non-zero checksum fails; so do the wrong addresses.
        let bytes = v6_frame(V6_CHECKSUM ^ 0x0100);
        assert!(!Packet::new_unchecked(&bytes[54..]).verify_checksum_v6(IP6_1, IP6_2));
        let bytes = v6_frame(V6_CHECKSUM);
        assert!(!Packet::new_unchecked(&bytes[54..]).verify_checksum_v6(IP6_2, IP6_2));
        let pseudo = checksum::pseudo_header_v6(IP6_1, IP6_2, 17, 44);
        assert_eq!(
            checksum_with_payload(pseudo, &bytes[54..62], &[roce_payload()]),
            V6_CHECKSUM
        );
    }

    #[test]
    fn vlan_frame_layer_by_layer() {
        let bytes = vlan_frame();
        let frame = ethernet::Frame::new_checked(&bytes[..]).unwrap();
        let eth = ethernet::Repr::parse(&frame).unwrap();
        assert_eq!(
            eth.vlan,
            Some(ethernet::VlanTag {
                pcp: 3,
                dei: true,
                vid: 100
            })
        );
        assert_eq!(eth.buffer_len(), 18);
        let ip_packet = ipv4::Packet::new_checked(frame.payload()).unwrap();
        let ip = ipv4::Repr::parse(&ip_packet).unwrap();
        assert_eq!((ip.dscp, ip.ecn), (26, Ecn::Ect0));
        let udp_packet = Packet::new_checked(ip_packet.payload()).unwrap();
        assert_eq!(udp_packet.checksum(), 0x19ff);
        assert!(udp_packet.verify_checksum_v4(IP4_1, IP4_2));

        let mut out = [0xa5u8; 82];
        eth.emit(&mut ethernet::Frame::new_unchecked(&mut out[..]));
        ip.emit(&mut ipv4::Packet::new_unchecked(&mut out[18..]));
        out[46..].copy_from_slice(roce_payload());
        Repr::parse(&udp_packet).unwrap().emit(
            &mut Packet::new_unchecked(&mut out[38..]),
            ChecksumMode::ComputeV4 {
                src_addr: ip.src_addr,
                dst_addr: ip.dst_addr,
            },
        );
        assert_eq!(out, bytes);
    }

    #[test]
    fn computed_zero_goes_out_as_ffff() {
        // Find a source port that makes the sum of everything else 0xffff, so the computed checksum
        // is 0 and must be sent as 0xffff.
        let header_sum = |sport: u16| {
            let mut b = [0u8; 8];
            b[..2].copy_from_slice(&sport.to_be_bytes());
            b[2..4].copy_from_slice(&ROCEV2_PORT.to_be_bytes());
            b[4..6].copy_from_slice(&8u16.to_be_bytes());
            (
                b,
                checksum::combine(&[
                    checksum::pseudo_header_v4(IP4_1, IP4_2, 17, 8),
                    checksum::data(&b),
                ]),
            )
        };
        let sport = (0..=u16::MAX).find(|&p| header_sum(p).1 == 0xffff).unwrap();
        let (mut b, _) = header_sum(sport);
        let mode = ChecksumMode::ComputeV4 {
            src_addr: IP4_1,
            dst_addr: IP4_2,
        };
        Repr {
            src_port: sport,
            dst_port: ROCEV2_PORT,
            payload_len: 0,
        }
        .emit(&mut Packet::new_unchecked(&mut b[..]), mode);
        let p = Packet::new_unchecked(&b[..]);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum_v4(IP4_1, IP4_2));
        assert!(p.is_empty());
        assert_eq!(
            checksum_with_payload(mode.pseudo_header_sum(8).unwrap(), &b, &[]),
            0xffff
        );
    }

    #[test]
    fn errors() {
        let udp = &ROCE_V4[34..];
        let parse = |b: &[u8]| Repr::parse(&Packet::new_unchecked(b));
        assert_eq!(
            parse(&udp[..7]),
            Err(Error::Truncated {
                layer: Layer::Udp,
                need: 8,
                got: 7
            })
        );
        assert_eq!(
            parse(&udp[..43]),
            Err(Error::Truncated {
                layer: Layer::Udp,
                need: 44,
                got: 43
            })
        );
        let mut b = [0u8; 44];
        b.copy_from_slice(udp);
        b[5] = 7;
        assert_eq!(parse(&b), Err(Error::BadLength(Layer::Udp)));
        // Length shorter than the buffer: the rest is not payload.
        b[5] = 20;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload(), &udp[8..20]);
        assert_eq!(parse(&b).map(|r| r.payload_len), Ok(12));
        // Verification never panics on an unchecked view whose Length exceeds the buffer.
        assert!(!Packet::new_unchecked(&udp[..40]).verify_checksum_v4(HOST, HOST));
    }

    #[test]
    fn src_port_from_qpn() {
        // Stable: the same value every time, and the value Linux rxe picks (hash_32(qpn, 14)).
        assert_eq!(rocev2_src_port(211), rocev2_src_port(211));
        assert_eq!(rocev2_src_port(0), 0xc000);
        assert_eq!(rocev2_src_port(1), 0xc000 | (0x61c8_8647u32 >> 18) as u16);
        // Only the 24-bit QPN counts.
        assert_eq!(rocev2_src_port(0x0100_0011), rocev2_src_port(0x11));
        // Spread: consecutive QPNs go to (nearly) all different ports.
        let ports: BTreeSet<u16> = (0x100..0x100 + 1024).map(rocev2_src_port).collect();
        assert!(ports.len() >= 1000, "only {} distinct ports", ports.len());
        let ports: BTreeSet<u16> = (0..16).map(rocev2_src_port).collect();
        assert_eq!(ports.len(), 16);
    }

    #[test]
    fn src_port_from_flow_label() {
        assert_eq!(rocev2_src_port_from_flow_label(0), 0xc000);
        assert_eq!(
            rocev2_src_port_from_flow_label(0x12345),
            0xc000 | (0x2345 ^ 0x4)
        );
        assert_eq!(
            rocev2_src_port_from_flow_label(0xfffff),
            0xc000 | (0x3fff ^ 0x3f)
        );
    }

    proptest! {
        #[test]
        fn src_port_in_range(qpn in any::<u32>(), fl in any::<u32>()) {
            prop_assert!(rocev2_src_port(qpn) >= ROCEV2_SRC_PORT_MIN);
            prop_assert!(rocev2_src_port_from_flow_label(fl) >= ROCEV2_SRC_PORT_MIN);
        }

        #[test]
        fn repr_round_trip(
            src_port in any::<u16>(),
            dst_port in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            src in any::<u32>(),
            dst in any::<u32>(),
            v6 in any::<bool>(),
        ) {
            let repr = Repr { src_port, dst_port, payload_len: payload.len() };
            let (s4, d4) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let (s6, d6) = (s4.to_ipv6_mapped(), d4.to_ipv6_mapped());
            let mode = if v6 {
                ChecksumMode::ComputeV6 { src_addr: s6, dst_addr: d6 }
            } else {
                ChecksumMode::ComputeV4 { src_addr: s4, dst_addr: d4 }
            };
            let mut bytes = [0xa5u8; 208];
            let end = 8 + payload.len();
            bytes[8..end].copy_from_slice(&payload);
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..end]), mode);
            let p = Packet::new_checked(&bytes[..end]).unwrap();
            prop_assert_eq!(Repr::parse(&p), Ok(repr));
            prop_assert_ne!(p.checksum(), 0);
            if v6 {
                prop_assert!(p.verify_checksum_v6(s6, d6));
            } else {
                prop_assert!(p.verify_checksum_v4(s4, d4));
            }
            // The gathered checksum over arbitrary cut points agrees.
            let pseudo = mode.pseudo_header_sum(end as u16).unwrap();
            let cut = payload.len() / 3;
            let cut2 = cut + payload.len() / 2;
            prop_assert_eq!(
                checksum_with_payload(pseudo, &bytes[..8], &[&payload[..cut], &payload[cut..cut2], &payload[cut2..]]),
                p.checksum()
            );
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..80),
            src in any::<u32>(),
        ) {
            let a = Ipv4Addr::from(src);
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = p.payload();
                let _ = Repr::parse(&p);
            }
            let p = Packet::new_unchecked(&bytes[..]);
            let _ = Repr::parse(&p);
            if bytes.len() >= HEADER_LEN {
                let _ = p.verify_checksum_v4(a, a);
                let _ = p.verify_checksum_v6(a.to_ipv6_mapped(), a.to_ipv6_mapped());
            }
            let _ = checksum_with_payload(0, &bytes, &[&bytes, &bytes]);
        }
    }
}
