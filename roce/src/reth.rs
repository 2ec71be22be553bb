//! RDMA Extended Transport Header (RETH, IBTA vol. 1 §9.3.3).
//!
//! The RETH tells the responder where an RDMA operation lands in its memory. It follows the BTH on
//! RDMA WRITE First, RDMA WRITE Only (with or without immediate) and RDMA READ Request, for RC and UC
//! (see [`crate::opcode`]). 16 bytes, all big-endian:
//!
//! ```text
//!  0               4               8               12              16
//! +-------------------------------+---------------+---------------+
//! |   virtual address (64 bits)   |  R_Key (32)   | DMA length(32)|
//! +-------------------------------+---------------+---------------+
//! ```
//!
//! * **virtual address**: the first byte of the remote buffer, in the address space of the memory
//!   region the R_Key names;
//! * **R_Key**: the remote key of that memory region (verbs `rkey`);
//! * **DMA length**: the length in bytes of the whole message (WRITE) or of the data to read (READ),
//!   not of this packet's payload; 0 to 2^31 bytes.

use crate::error::check_len;
use crate::wire_field::{read_u32, read_u64, write_u32, write_u64};
use crate::{Layer, Result};

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
}

/// Length of the RETH in bytes (IBTA vol. 1 §9.3.3).
pub const HEADER_LEN: usize = field::DMA_LEN.end;

/// A zero-copy view of a RETH (IBTA vol. 1 §9.3.3) at the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (16 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if `buffer` is shorter than 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole RETH (16 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with `layer: Reth` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Reth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Remote virtual address (64 bits): first byte the operation reads or writes.
    pub fn virtual_address(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::VA)
    }

    /// R_Key (32 bits) of the remote memory region.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }

    /// DMA length in bytes (32 bits): length of the whole RDMA message, not of this packet.
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DMA_LEN)
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

    /// Sets the DMA length in bytes.
    pub fn set_dma_len(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::DMA_LEN, value);
    }
}

/// A parsed RETH (IBTA vol. 1 §9.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address of the first byte.
    pub virtual_address: u64,
    /// R_Key of the remote memory region.
    pub rkey: u32,
    /// Length in bytes of the whole RDMA WRITE message or of the data an RDMA READ asks for.
    pub dma_len: u32,
}

impl Repr {
    /// Parses a RETH. Every bit pattern is valid.
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 16 bytes (only reachable through
    /// [`Packet::new_unchecked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (16).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the RETH into the first 16 bytes of `packet`.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (16 bytes); callers size it with
    /// [`Repr::buffer_len`] or wrap it with [`Packet::new_checked`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §9.3.3 (scapy's contrib/roce.py has no RETH):
    // VA 0x0000_7f12_3456_7000, R_Key 0x0000_1234, DMA length 4096. tshark's InfiniBand dissector
    // decodes these bytes (after a BTH with opcode 0x0B) to the same values.
    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x10,
        0x00,
    ];
    const REPR: Repr = Repr {
        virtual_address: 0x0000_7f12_3456_7000,
        rkey: 0x1234,
        dma_len: 4096,
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.virtual_address(), 0x0000_7f12_3456_7000);
        assert_eq!(p.rkey(), 0x1234);
        assert_eq!(p.dma_len(), 4096);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 16];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_virtual_address(0x0000_7f12_3456_7000);
        p.set_rkey(0x1234);
        p.set_dma_len(4096);
        assert_eq!(buf, BYTES);
    }

    test_parse_and_emit!(BYTES, REPR);

    test_truncated!(Layer::Reth, BYTES);

    proptest! {
        #[test]
        fn round_trip(virtual_address: u64, rkey: u32, dma_len: u32) {
            let repr = Repr { virtual_address, rkey, dma_len };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }

    test_arbitrary_bytes_never_panic!(0..40);
}
