//! Invalidate Extended Transport Header (IETH, IBTA vol. 1 §9.3.8).
//!
//! SEND with Invalidate (RC opcodes SEND Last with Invalidate 0x16 and SEND Only with Invalidate 0x17)
//! carries an IETH after the BTH: the R_Key that the responder invalidates once the message has been
//! received (verbs `IBV_WR_SEND_WITH_INV`, `invalidate_rkey`; the receiver sees
//! `IBV_WC_WITH_INV` and `wc.invalidated_rkey`). 4 bytes, big-endian:
//!
//! ```text
//!  0               4
//! +---------------+
//! |  R_Key (32)   |
//! +---------------+
//! ```

use crate::error::check_len;
use crate::wire_field::{read_u32, write_u32};
use crate::{Layer, Result};

mod field {
    use core::ops::Range;
    pub const RKEY: Range<usize> = 0..4;
}

/// Length of the IETH in bytes (IBTA vol. 1 §9.3.8).
pub const HEADER_LEN: usize = field::RKEY.end;

/// A zero-copy view of an IETH (IBTA vol. 1 §9.3.8) at the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (4 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if `buffer` is shorter than 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole IETH (4 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with `layer: Ieth` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Ieth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The R_Key to invalidate (32 bits).
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::RKEY, value);
    }
}

/// A parsed IETH (IBTA vol. 1 §9.3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The R_Key the responder invalidates on receipt of the message.
    pub rkey: u32,
}

impl Repr {
    /// Parses an IETH. Every bit pattern is valid.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 4 bytes (only reachable through
    /// [`Packet::new_unchecked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            rkey: packet.rkey(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (4).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the IETH into the first 4 bytes of `packet`.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §9.3.8 (scapy's contrib/roce.py has no IETH); tshark's
    // InfiniBand dissector decodes them (after a BTH with opcode 0x17) as RKey deadbeef.
    static BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
    const REPR: Repr = Repr { rkey: 0xdead_beef };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.rkey(), 0xdead_beef);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 4];
        Packet::new_unchecked(&mut buf[..]).set_rkey(0xdead_beef);
        assert_eq!(buf, BYTES);
    }

    test_parse_and_emit!(BYTES, REPR);

    test_truncated!(Layer::Ieth, BYTES);

    proptest! {
        #[test]
        fn round_trip(rkey: u32) {
            let repr = Repr { rkey };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }

    test_arbitrary_bytes_never_panic!(0..12);
}
