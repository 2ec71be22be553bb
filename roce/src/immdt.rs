//! Immediate Data extended transport header (ImmDt, IBTA vol. 1 §9.3.7).
//!
//! SEND and RDMA WRITE "with Immediate" opcodes (SEND Last/Only with Immediate, RDMA WRITE
//! Last/Only with Immediate, UD SEND Only with Immediate) carry 4 bytes of opaque immediate data that the
//! responder hands to the receiving application in its completion (verbs `IBV_WC_WITH_IMM`,
//! `wc.imm_data`). 4 bytes:
//!
//! ```text
//!  0               4
//! +---------------+
//! | ImmDt (32)    |
//! +---------------+
//! ```
//!
//! # Byte order
//! In libibverbs, `ibv_send_wr.imm_data` and `ibv_wc.imm_data` are `__be32`: the application stores the
//! value already in network byte order (`htonl(x)`), the HCA copies those 4 bytes to the wire, and the
//! receiver gets the same 4 bytes back (`ntohl(wc.imm_data)` gives `x`). This module does the same:
//! [`Repr::imm_data`] and [`Packet::imm_data`] are a `u32` **in network byte order**, whose in-memory
//! bytes (`to_ne_bytes()`) are exactly the wire bytes, so a verbs `imm_data` is carried unchanged with no
//! byte swap anywhere (as in Linux rxe, `immdt_imm()`). Use [`Repr::from_host_order`] /
//! [`Repr::to_host_order`] (or [`Packet::imm_data_host_order`]) for the numeric value `x`.

use crate::error::check_len;
use crate::wire_field::{read_array, write_array};
use crate::{Layer, Result};

mod field {
    use core::ops::Range;
    pub const IMM: Range<usize> = 0..4;
}

/// Length of the ImmDt header in bytes (IBTA vol. 1 §9.3.7).
pub const HEADER_LEN: usize = field::IMM.end;

/// A zero-copy view of an ImmDt header (IBTA vol. 1 §9.3.7) at the start of `buffer`.
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

    /// Checks that the buffer holds a whole ImmDt (4 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with `layer: ImmDt` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::ImmDt, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The immediate data as a `u32` in network byte order (verbs `__be32`): its in-memory bytes are
    /// the 4 wire bytes. See the module docs.
    pub fn imm_data(&self) -> u32 {
        u32::from_ne_bytes(read_array(self.buffer.as_ref(), field::IMM))
    }

    /// The immediate data as a host-order number: the 4 wire bytes read big-endian
    /// (`ntohl(imm_data)`).
    pub fn imm_data_host_order(&self) -> u32 {
        u32::from_be(self.imm_data())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate data from a `u32` in network byte order (verbs `__be32`): its in-memory bytes
    /// are written unchanged.
    pub fn set_imm_data(&mut self, value: u32) {
        write_array(self.buffer.as_mut(), field::IMM, value.to_ne_bytes());
    }
}

/// A parsed ImmDt header (IBTA vol. 1 §9.3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Immediate data in network byte order, exactly as verbs' `__be32 imm_data`: `imm_data.to_ne_bytes()`
    /// are the wire bytes.
    pub imm_data: u32,
}

impl Repr {
    /// The Repr for a host-order number `value` (what an application passes through `htonl`).
    pub const fn from_host_order(value: u32) -> Repr {
        Repr {
            imm_data: value.to_be(),
        }
    }

    /// The immediate data as a host-order number (`ntohl(imm_data)`).
    pub const fn to_host_order(&self) -> u32 {
        u32::from_be(self.imm_data)
    }

    /// Parses an ImmDt header. Every bit pattern is valid.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 4 bytes (only reachable through
    /// [`Packet::new_unchecked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            imm_data: packet.imm_data(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (4).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the ImmDt header into the first 4 bytes of `packet`.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_imm_data(self.imm_data);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §9.3.7 (scapy's contrib/roce.py has no ImmDt): the application
    // posted imm_data = htonl(0x12345678); tshark shows "Immediate Data: 12345678".
    static BYTES: [u8; 4] = [0x12, 0x34, 0x56, 0x78];
    const REPR: Repr = Repr {
        imm_data: 0x1234_5678u32.to_be(),
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.imm_data(), 0x1234_5678u32.to_be());
        assert_eq!(p.imm_data().to_ne_bytes(), BYTES);
        assert_eq!(p.imm_data_host_order(), 0x1234_5678);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 4];
        Packet::new_unchecked(&mut buf[..]).set_imm_data(0x1234_5678u32.to_be());
        assert_eq!(buf, BYTES);
    }

    test_parse_and_emit!(BYTES, REPR);

    #[test]
    fn host_order() {
        let repr = Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr, REPR);
        assert_eq!(repr.to_host_order(), 0x1234_5678);
        assert_eq!(Repr::from_host_order(0x1234_5678), REPR);
    }

    test_truncated!(Layer::ImmDt, BYTES);

    proptest! {
        #[test]
        fn round_trip(imm_data: u32) {
            let repr = Repr { imm_data };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(buf, imm_data.to_ne_bytes());
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
            prop_assert_eq!(Repr::from_host_order(repr.to_host_order()), repr);
        }
    }

    test_arbitrary_bytes_never_panic!(0..12);
}
