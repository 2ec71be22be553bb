//! Datagram Extended Transport Header (DETH, IBTA vol. 1 §9.3.2).
//!
//! Every Unreliable Datagram (UD) packet carries a DETH right after the BTH. A UD QP has no connection,
//! so the DETH says who sent the packet and proves the sender may talk to the destination QP:
//!
//! ```text
//!  0               4       5               8
//! +---------------+-------+---------------+
//! |  Q_Key (32)   | resv8 | SrcQP (24)    |
//! +---------------+-------+---------------+
//! ```
//!
//! * **Q_Key**: must match the destination QP's Q_Key (IBTA §10.2.4; keys with bit 31 set are
//!   "controlled" Q_Keys that only privileged consumers may send);
//! * **reserved**: 8 bits, transmitted as 0, ignored on receive;
//! * **SrcQP**: the sending QP number (24 bits), reported to the receiver as `wc.src_qp`.

use crate::error::check_len;
use crate::wire_field::{read_u24, read_u32, write_u24, write_u32};
use crate::{Layer, Result};

mod field {
    use core::ops::Range;
    pub const QKEY: Range<usize> = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Range<usize> = 5..8;
}

/// Length of the DETH in bytes (IBTA vol. 1 §9.3.2).
pub const HEADER_LEN: usize = field::SRC_QP.end;

/// A zero-copy view of a DETH (IBTA vol. 1 §9.3.2) at the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (8 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if `buffer` is shorter than 8 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole DETH (8 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with `layer: Deth` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Deth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Q_Key (32 bits).
    pub fn qkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The reserved byte (byte 4); transmitted as 0, ignored on receive.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// Source QP number (24 bits, in the low bits of the `u32`).
    pub fn src_qpn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Sets the reserved byte (senders write 0).
    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESERVED] = value;
    }

    /// Sets the source QP number; bits above the low 24 are dropped.
    pub fn set_src_qpn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::SRC_QP, value);
    }
}

/// A parsed DETH (IBTA vol. 1 §9.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key the destination QP checks.
    pub qkey: u32,
    /// Source QP number (24 bits; emit masks higher bits away).
    pub src_qpn: u32,
}

impl Repr {
    /// Parses a DETH; the reserved byte is ignored, as IBTA §9.3.2 requires of receivers.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 8 bytes (only reachable through
    /// [`Packet::new_unchecked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            qkey: packet.qkey(),
            src_qpn: packet.src_qpn(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the DETH into the first 8 bytes of `packet`: the reserved byte as 0, the source QPN
    /// masked to 24 bits.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (8 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_reserved(0);
        packet.set_src_qpn(self.src_qpn);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §9.3.2 (scapy's contrib/roce.py has no DETH):
    // Q_Key 0x80010000 (a controlled key), source QP 0x000011. tshark's InfiniBand dissector decodes
    // them (after a BTH with opcode 0x65) to the same values.
    static BYTES: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11];
    const REPR: Repr = Repr {
        qkey: 0x8001_0000,
        src_qpn: 0x11,
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.qkey(), 0x8001_0000);
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.src_qpn(), 0x11);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 8];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_qkey(0x8001_0000);
        p.set_reserved(0);
        p.set_src_qpn(0x11);
        assert_eq!(buf, BYTES);
    }

    test_parse_and_emit!(BYTES, REPR);

    #[test]
    fn reserved_ignored_and_qpn_masked() {
        let mut bytes = BYTES;
        bytes[4] = 0xff;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(REPR)
        );
        let mut buf = [0xa5u8; 8];
        Repr {
            src_qpn: 0xff00_0011,
            ..REPR
        }
        .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    test_truncated!(Layer::Deth, BYTES);

    proptest! {
        #[test]
        fn round_trip(qkey: u32, src_qpn in 0u32..=crate::wire_field::U24_MASK) {
            let repr = Repr { qkey, src_qpn };
            let mut buf = [0xa5u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(buf[4], 0);
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }

    test_arbitrary_bytes_never_panic!(0..20);
}
