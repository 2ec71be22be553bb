//! Atomic extended transport headers: AtomicETH (IBTA vol. 1 §9.3.4) and AtomicAckETH (§9.3.6).
//!
//! An RC atomic operation is one request packet and one response packet, neither with a payload:
//!
//! * the request (COMPARE SWAP 0x13 or FETCH ADD 0x14) carries an **AtomicETH** ([`request`]): the
//!   8-byte-aligned remote address, its R_Key, and the operands;
//! * the response (ATOMIC ACKNOWLEDGE 0x12) carries an AETH ([`crate::aeth`]) followed by an
//!   **AtomicAckETH** ([`ack`]): the value the remote 64-bit word held before the operation.
//!
//! ```text
//! AtomicETH, 28 bytes:
//!  0               8               12              20              28
//! +---------------+---------------+---------------+---------------+
//! | VA (64)       | R_Key (32)    | Swap/Add (64) | Compare (64)  |
//! +---------------+---------------+---------------+---------------+
//!
//! AtomicAckETH, 8 bytes:
//!  0               8
//! +---------------+
//! | OrigRemDt (64)|
//! +---------------+
//! ```
//!
//! For COMPARE SWAP the responder writes *Swap* if the word equals *Compare*; for FETCH ADD it adds
//! *Add* and the *Compare* field is unused (transmitted as sent, ignored). All fields are big-endian.

/// AtomicETH: the header of COMPARE SWAP and FETCH ADD requests (IBTA vol. 1 §9.3.4), 28 bytes.
pub mod request {
    use crate::error::check_len;
    use crate::wire_field::{read_u32, read_u64, write_u32, write_u64};
    use crate::{Layer, Result};

    mod field {
        use core::ops::Range;
        pub const VA: Range<usize> = 0..8;
        pub const RKEY: Range<usize> = 8..12;
        pub const SWAP_ADD: Range<usize> = 12..20;
        pub const COMPARE: Range<usize> = 20..28;
    }

    /// Length of the AtomicETH in bytes (IBTA vol. 1 §9.3.4).
    pub const HEADER_LEN: usize = field::COMPARE.end;

    /// A zero-copy view of an AtomicETH (IBTA vol. 1 §9.3.4) at the start of `buffer`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Packet<T: AsRef<[u8]>> {
        buffer: T,
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter
        /// than [`HEADER_LEN`] (28 bytes). Use [`Packet::new_checked`] for untrusted input.
        pub const fn new_unchecked(buffer: T) -> Packet<T> {
            Packet { buffer }
        }

        /// Wraps `buffer` after [`Packet::check_len`].
        ///
        /// # Errors
        /// [`Error::Truncated`](crate::Error::Truncated) if `buffer` is shorter than 28 bytes.
        pub fn new_checked(buffer: T) -> Result<Packet<T>> {
            let packet = Packet::new_unchecked(buffer);
            packet.check_len()?;
            Ok(packet)
        }

        /// Checks that the buffer holds a whole AtomicETH (28 bytes).
        ///
        /// # Errors
        /// [`Error::Truncated`](crate::Error::Truncated) with `layer: AtomicEth` if it does not.
        pub fn check_len(&self) -> Result<()> {
            check_len(Layer::AtomicEth, HEADER_LEN, self.buffer.as_ref().len())
        }

        /// Returns the underlying buffer.
        pub fn into_inner(self) -> T {
            self.buffer
        }

        /// Remote virtual address of the 64-bit target word. It must be 8-byte aligned (IBTA vol. 1
        /// §9.4, atomic operations); the responder checks that, not this parser.
        pub fn virtual_address(&self) -> u64 {
            read_u64(self.buffer.as_ref(), field::VA)
        }

        /// R_Key (32 bits) of the remote memory region.
        pub fn rkey(&self) -> u32 {
            read_u32(self.buffer.as_ref(), field::RKEY)
        }

        /// Swap data (COMPARE SWAP) or add data (FETCH ADD), 64 bits.
        pub fn swap_add_data(&self) -> u64 {
            read_u64(self.buffer.as_ref(), field::SWAP_ADD)
        }

        /// Compare data (COMPARE SWAP; unused by FETCH ADD), 64 bits.
        pub fn compare_data(&self) -> u64 {
            read_u64(self.buffer.as_ref(), field::COMPARE)
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the remote virtual address.
        pub fn set_virtual_address(&mut self, value: u64) {
            write_u64(self.buffer.as_mut(), field::VA, value);
        }

        /// Sets the R_Key.
        pub fn set_rkey(&mut self, value: u32) {
            write_u32(self.buffer.as_mut(), field::RKEY, value);
        }

        /// Sets the swap (COMPARE SWAP) or add (FETCH ADD) operand.
        pub fn set_swap_add_data(&mut self, value: u64) {
            write_u64(self.buffer.as_mut(), field::SWAP_ADD, value);
        }

        /// Sets the compare operand.
        pub fn set_compare_data(&mut self, value: u64) {
            write_u64(self.buffer.as_mut(), field::COMPARE, value);
        }
    }

    /// A parsed AtomicETH (IBTA vol. 1 §9.3.4).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Repr {
        /// Remote virtual address of the 64-bit target word.
        pub virtual_address: u64,
        /// R_Key of the remote memory region.
        pub rkey: u32,
        /// Swap operand (COMPARE SWAP) or add operand (FETCH ADD).
        pub swap_add_data: u64,
        /// Compare operand (COMPARE SWAP); FETCH ADD senders usually write 0.
        pub compare_data: u64,
    }

    impl Repr {
        /// Parses an AtomicETH. Every bit pattern is valid (alignment is the responder's check).
        ///
        /// # Errors
        /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 28 bytes (only reachable through
        /// [`Packet::new_unchecked`]).
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
            packet.check_len()?;
            Ok(Repr {
                virtual_address: packet.virtual_address(),
                rkey: packet.rkey(),
                swap_add_data: packet.swap_add_data(),
                compare_data: packet.compare_data(),
            })
        }

        /// Length of the emitted header in bytes: always [`HEADER_LEN`] (28).
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the AtomicETH into the first 28 bytes of `packet`.
        ///
        /// # Panics
        /// If the buffer is shorter than [`HEADER_LEN`] (28 bytes).
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            packet.set_virtual_address(self.virtual_address);
            packet.set_rkey(self.rkey);
            packet.set_swap_add_data(self.swap_add_data);
            packet.set_compare_data(self.compare_data);
        }
    }
}

/// AtomicAckETH: the header of ATOMIC ACKNOWLEDGE responses, after the AETH (IBTA vol. 1 §9.3.6),
/// 8 bytes.
pub mod ack {
    use crate::error::check_len;
    use crate::wire_field::{read_u64, write_u64};
    use crate::{Layer, Result};

    mod field {
        use core::ops::Range;
        pub const ORIG: Range<usize> = 0..8;
    }

    /// Length of the AtomicAckETH in bytes (IBTA vol. 1 §9.3.6).
    pub const HEADER_LEN: usize = field::ORIG.end;

    /// A zero-copy view of an AtomicAckETH (IBTA vol. 1 §9.3.6) at the start of `buffer`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Packet<T: AsRef<[u8]>> {
        buffer: T,
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Wraps `buffer` without checking its length; the getter and setter panic if it is shorter
        /// than [`HEADER_LEN`] (8 bytes). Use [`Packet::new_checked`] for untrusted input.
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

        /// Checks that the buffer holds a whole AtomicAckETH (8 bytes).
        ///
        /// # Errors
        /// [`Error::Truncated`](crate::Error::Truncated) with `layer: AtomicAckEth` if it does not.
        pub fn check_len(&self) -> Result<()> {
            check_len(Layer::AtomicAckEth, HEADER_LEN, self.buffer.as_ref().len())
        }

        /// Returns the underlying buffer.
        pub fn into_inner(self) -> T {
            self.buffer
        }

        /// The original remote data: the 64-bit word's value before the atomic operation.
        pub fn orig_remote_data(&self) -> u64 {
            read_u64(self.buffer.as_ref(), field::ORIG)
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the original remote data.
        pub fn set_orig_remote_data(&mut self, value: u64) {
            write_u64(self.buffer.as_mut(), field::ORIG, value);
        }
    }

    /// A parsed AtomicAckETH (IBTA vol. 1 §9.3.6).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Repr {
        /// Value of the remote 64-bit word before the operation (returned to the requester's local
        /// buffer).
        pub orig_remote_data: u64,
    }

    impl Repr {
        /// Parses an AtomicAckETH. Every bit pattern is valid.
        ///
        /// # Errors
        /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 8 bytes (only reachable through
        /// [`Packet::new_unchecked`]).
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
            packet.check_len()?;
            Ok(Repr {
                orig_remote_data: packet.orig_remote_data(),
            })
        }

        /// Length of the emitted header in bytes: always [`HEADER_LEN`] (8).
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the AtomicAckETH into the first 8 bytes of `packet`.
        ///
        /// # Panics
        /// If the buffer is shorter than [`HEADER_LEN`] (8 bytes).
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            packet.set_orig_remote_data(self.orig_remote_data);
        }
    }
}

#[cfg(test)]
mod test {
    use super::{ack, request};
    use crate::{Error, Layer};
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §9.3.4 (scapy's contrib/roce.py has no AtomicETH):
    // VA 0x0000_5555_0000_1000, R_Key 0x0102_0304, swap 0x1111_2222_3333_4444,
    // compare 0x5555_6666_7777_8888. tshark's InfiniBand dissector decodes these bytes (after a BTH
    // with opcode 0x13) to the same values, and ACK_BYTES (after BTH 0x12 and an AETH) likewise.
    static REQ_BYTES: [u8; 28] = [
        0x00, 0x00, 0x55, 0x55, 0x00, 0x00, 0x10, 0x00, // VA
        0x01, 0x02, 0x03, 0x04, // R_Key
        0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, // swap/add
        0x55, 0x55, 0x66, 0x66, 0x77, 0x77, 0x88, 0x88, // compare
    ];
    const REQ_REPR: request::Repr = request::Repr {
        virtual_address: 0x0000_5555_0000_1000,
        rkey: 0x0102_0304,
        swap_add_data: 0x1111_2222_3333_4444,
        compare_data: 0x5555_6666_7777_8888,
    };

    // Written by hand from IBTA vol. 1 §9.3.6 (scapy has no AtomicAckETH).
    static ACK_BYTES: [u8; 8] = [0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10];
    const ACK_REPR: ack::Repr = ack::Repr {
        orig_remote_data: 0xfedc_ba98_7654_3210,
    };

    #[test]
    fn request_deconstruct() {
        let p = request::Packet::new_checked(&REQ_BYTES[..]).unwrap();
        assert_eq!(p.virtual_address(), 0x0000_5555_0000_1000);
        assert_eq!(p.rkey(), 0x0102_0304);
        assert_eq!(p.swap_add_data(), 0x1111_2222_3333_4444);
        assert_eq!(p.compare_data(), 0x5555_6666_7777_8888);
    }

    #[test]
    fn request_construct() {
        let mut buf = [0xa5u8; 28];
        let mut p = request::Packet::new_unchecked(&mut buf[..]);
        p.set_virtual_address(0x0000_5555_0000_1000);
        p.set_rkey(0x0102_0304);
        p.set_swap_add_data(0x1111_2222_3333_4444);
        p.set_compare_data(0x5555_6666_7777_8888);
        assert_eq!(buf, REQ_BYTES);
    }

    #[test]
    fn request_parse_and_emit() {
        let p = request::Packet::new_checked(&REQ_BYTES[..]).unwrap();
        assert_eq!(request::Repr::parse(&p), Ok(REQ_REPR));
        let mut buf = [0xa5u8; 28];
        REQ_REPR.emit(&mut request::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, REQ_BYTES);
        assert_eq!(REQ_REPR.buffer_len(), 28);
    }

    #[test]
    fn ack_deconstruct_construct_parse_emit() {
        let p = ack::Packet::new_checked(&ACK_BYTES[..]).unwrap();
        assert_eq!(p.orig_remote_data(), 0xfedc_ba98_7654_3210);
        assert_eq!(ack::Repr::parse(&p), Ok(ACK_REPR));

        let mut buf = [0xa5u8; 8];
        ack::Packet::new_unchecked(&mut buf[..]).set_orig_remote_data(0xfedc_ba98_7654_3210);
        assert_eq!(buf, ACK_BYTES);

        let mut buf = [0xa5u8; 8];
        ACK_REPR.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ACK_BYTES);
        assert_eq!(ACK_REPR.buffer_len(), 8);
    }

    #[test]
    fn truncated() {
        for len in 0..request::HEADER_LEN {
            assert_eq!(
                request::Packet::new_checked(&REQ_BYTES[..len]),
                Err(Error::Truncated {
                    layer: Layer::AtomicEth,
                    need: 28,
                    got: len
                })
            );
            assert!(
                request::Repr::parse(&request::Packet::new_unchecked(&REQ_BYTES[..len])).is_err()
            );
        }
        for len in 0..ack::HEADER_LEN {
            assert_eq!(
                ack::Packet::new_checked(&ACK_BYTES[..len]),
                Err(Error::Truncated {
                    layer: Layer::AtomicAckEth,
                    need: 8,
                    got: len
                })
            );
            assert!(ack::Repr::parse(&ack::Packet::new_unchecked(&ACK_BYTES[..len])).is_err());
        }
    }

    proptest! {
        #[test]
        fn request_round_trip(virtual_address: u64, rkey: u32, swap_add_data: u64, compare_data: u64) {
            let repr = request::Repr { virtual_address, rkey, swap_add_data, compare_data };
            let mut buf = [0u8; request::HEADER_LEN];
            repr.emit(&mut request::Packet::new_unchecked(&mut buf[..]));
            let p = request::Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(request::Repr::parse(&p), Ok(repr));
        }

        #[test]
        fn ack_round_trip(orig_remote_data: u64) {
            let repr = ack::Repr { orig_remote_data };
            let mut buf = [0u8; ack::HEADER_LEN];
            repr.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
            let p = ack::Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(ack::Repr::parse(&p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = request::Packet::new_checked(&data[..]) {
                let _ = request::Repr::parse(&p);
            }
            if let Ok(p) = ack::Packet::new_checked(&data[..]) {
                let _ = ack::Repr::parse(&p);
            }
        }
    }
}
