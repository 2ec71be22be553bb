//! Reading and writing one header field at the byte range its module's `field` table gives: big-endian
//! (network byte order) integers of 16, 24, 32 and 64 bits, and fixed-size byte arrays (MAC, IPv4 and
//! IPv6 addresses). Every header view and `Repr::emit` of the crate goes through these, so the byte
//! range in `field` is the only place an offset or a length is written down.
//!
//! 24-bit fields are InfiniBand's: the BTH DestQP and PSN (IBTA vol. 1 §9.2), the DETH SrcQP
//! (§9.3.2) and the AETH MSN (§9.3.5). They are carried in the low 24 bits of a `u32`; [`write_u24`]
//! drops the bits above them ([`U24_MASK`]).
//!
//! Each function panics if `field` is not within `data` or does not have the width the function
//! reads or writes. The ranges are the crate's constants, so the first means a buffer shorter than
//! the header (only possible through a view's `new_unchecked`; `new_checked` rules it out), and the
//! second a wrong `field` table, which the golden-byte tests of each header would catch.

use core::ops::Range;

/// The bits of a 24-bit field (QPN, PSN, MSN) in a `u32`.
pub(crate) const U24_MASK: u32 = 0x00ff_ffff;

/// The bytes of `field` as an array of `N` bytes.
#[inline]
pub(crate) fn read_array<const N: usize>(data: &[u8], field: Range<usize>) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&data[field]);
    out
}

/// Writes `value` over the bytes of `field`.
#[inline]
pub(crate) fn write_array<const N: usize>(data: &mut [u8], field: Range<usize>, value: [u8; N]) {
    data[field].copy_from_slice(&value);
}

/// The 2-byte big-endian field `field`.
#[inline]
pub(crate) fn read_u16(data: &[u8], field: Range<usize>) -> u16 {
    u16::from_be_bytes(read_array(data, field))
}

/// Writes `value` big-endian into the 2-byte field `field`.
#[inline]
pub(crate) fn write_u16(data: &mut [u8], field: Range<usize>, value: u16) {
    write_array(data, field, value.to_be_bytes());
}

/// The 3-byte big-endian field `field`, in the low 24 bits of a `u32`.
#[inline]
pub(crate) fn read_u24(data: &[u8], field: Range<usize>) -> u32 {
    let [b0, b1, b2] = read_array(data, field);
    u32::from_be_bytes([0, b0, b1, b2])
}

/// Writes the low 24 bits of `value` big-endian into the 3-byte field `field`; higher bits are
/// dropped.
#[inline]
pub(crate) fn write_u24(data: &mut [u8], field: Range<usize>, value: u32) {
    let [_, b0, b1, b2] = (value & U24_MASK).to_be_bytes();
    write_array(data, field, [b0, b1, b2]);
}

/// The 4-byte big-endian field `field`.
#[inline]
pub(crate) fn read_u32(data: &[u8], field: Range<usize>) -> u32 {
    u32::from_be_bytes(read_array(data, field))
}

/// Writes `value` big-endian into the 4-byte field `field`.
#[inline]
pub(crate) fn write_u32(data: &mut [u8], field: Range<usize>, value: u32) {
    write_array(data, field, value.to_be_bytes());
}

/// The 8-byte big-endian field `field`.
#[inline]
pub(crate) fn read_u64(data: &[u8], field: Range<usize>) -> u64 {
    u64::from_be_bytes(read_array(data, field))
}

/// Writes `value` big-endian into the 8-byte field `field`.
#[inline]
pub(crate) fn write_u64(data: &mut [u8], field: Range<usize>, value: u64) {
    write_array(data, field, value.to_be_bytes());
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn big_endian_reads_and_writes() {
        let mut buf = [0xa5u8; 16];
        write_u16(&mut buf, 0..2, 0x0102);
        write_u24(&mut buf, 2..5, 0xff03_0405);
        write_u32(&mut buf, 5..9, 0x0607_0809);
        write_u64(&mut buf, 8..16, 0x090a_0b0c_0d0e_0f10);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(read_u16(&buf, 0..2), 0x0102);
        assert_eq!(read_u24(&buf, 2..5), 0x03_0405);
        assert_eq!(read_u32(&buf, 5..9), 0x0607_0809);
        assert_eq!(read_u64(&buf, 8..16), 0x090a_0b0c_0d0e_0f10);
        assert_eq!(read_array::<3>(&buf, 13..16), [14, 15, 16]);
        write_array(&mut buf, 0..2, [0xee, 0xff]);
        assert_eq!(buf[..3], [0xee, 0xff, 3]);
    }

    #[test]
    fn u24_keeps_the_low_24_bits_and_leaves_neighbours() {
        let mut buf = [0xa5u8; 5];
        write_u24(&mut buf, 1..4, 0xffff_ffff);
        assert_eq!(buf, [0xa5, 0xff, 0xff, 0xff, 0xa5]);
        assert_eq!(read_u24(&buf, 1..4), U24_MASK);
        write_u24(&mut buf, 1..4, 0x0100_0000);
        assert_eq!(read_u24(&buf, 1..4), 0);
    }
}
