//! The Internet checksum (RFC 1071) used by the IPv4 header, by UDP and by ICMPv6 (RFC 4443 §2.3,
//! [`crate::ndisc`]).
//!
//! The checksum is the 16-bit ones-complement of the ones-complement sum of the data taken as
//! big-endian 16-bit words (an odd trailing byte is padded on the right with a zero byte). This module
//! works with the *sum* (not yet inverted), because sums of separate pieces combine by ones-complement
//! addition ([`combine`]), and only the final value is inverted:
//!
//! ```text
//! checksum = !combine(&[pseudo_header_v4(src, dst, 17, udp_len), data(udp_header_and_payload)])
//! ```
//!
//! A receiver verifies by summing everything, the checksum field included: the result is `0xffff`
//! when the data is intact (RFC 1071 §1 step 3).
//!
//! UDP (RFC 768; RFC 8200 §8.1 for IPv6) also covers a *pseudo header* built from the IP addresses,
//! the protocol number and the UDP length; [`pseudo_header_v4`] and [`pseudo_header_v6`] return its sum.
//!
//! When data is gathered from several slices (a header plus scattered payload), use [`Accumulator`]:
//! it keeps track of the byte position so that a slice of odd length in the middle of the list is
//! summed as part of the concatenation, as RFC 1071 requires.

use core::net::{Ipv4Addr, Ipv6Addr};

/// Folds a 64-bit end-around-carry sum to 16 bits (RFC 1071 §4.1 "fold 32-bit sum to 16 bits").
/// The fold keeps the value modulo 0xffff, which is what ones-complement addition preserves.
const fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Adds `value` to `sum` in 64-bit ones-complement arithmetic (the carry out wraps around).
const fn add_carry(sum: u64, value: u64) -> u64 {
    let (s, carry) = sum.overflowing_add(value);
    s + carry as u64
}

/// Bytes summed per block by [`sum_le`]: its two 64-bit accumulators take one 32-bit half of every
/// 8-byte word each, and 2^20 bytes are 2^17 words, far below the 2^32 additions that could overflow.
const SUM_BLOCK: usize = 1 << 20;

/// The sum of `bytes` read as **little-endian** 32-bit words (an incomplete last word zero-padded on
/// the right), in a 64-bit accumulator whose end-around carry has been folded in. Congruent modulo
/// 0xffff to the ones-complement sum of the little-endian 16-bit words, since 2^16 = 1 (mod 0xffff).
///
/// Little-endian words need no byte swap on little-endian hosts, and plain 64-bit additions of
/// zero-extended 32-bit halves carry no dependency through a carry flag, so the loop vectorizes. The
/// ones-complement sum is byte-order independent (RFC 1071 §2 (B)): [`data`] swaps the folded result
/// once to get the sum of the big-endian words the RFC defines.
#[inline]
fn sum_le(bytes: &[u8]) -> u64 {
    if bytes.len() < SHORT_SUM {
        return sum_le_short(bytes);
    }
    let mut total = 0u64;
    for block in bytes.chunks(SUM_BLOCK) {
        let (mut lo, mut hi) = (0u64, 0u64);
        let mut words = block.chunks_exact(8);
        for word in &mut words {
            let w = u64::from_le_bytes([
                word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
            ]);
            lo += w & 0xffff_ffff;
            hi += w >> 32;
        }
        let last = last_word(words.remainder());
        lo += last & 0xffff_ffff;
        hi += last >> 32;
        total = add_carry(add_carry(total, lo), hi);
    }
    total
}

/// Below this many bytes [`sum_le`] adds 64-bit words with end-around carry, one after the other:
/// fewer instructions than setting up and reducing the vector loop (a header, a 64-byte payload).
const SHORT_SUM: usize = 128;

/// [`sum_le`] for inputs shorter than [`SHORT_SUM`]: 64-bit little-endian words added with end-around
/// carry (also congruent modulo 0xffff to the 16-bit sum, 2^16 being 1).
#[inline]
fn sum_le_short(bytes: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let w = u64::from_le_bytes([
            word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
        ]);
        sum = add_carry(sum, w);
    }
    add_carry(sum, last_word(words.remainder()))
}

/// The at most 7 bytes that remain after the whole 8-byte words, as the low bytes of one more
/// little-endian word, zero-padded. Every 16-bit word keeps its position modulo 2 bytes, so the sum
/// is unchanged. Built from loads of 4, 2 and 1 bytes rather than a copy into a buffer (a call to
/// memcpy for a few bytes).
#[inline(always)]
fn last_word(mut rest: &[u8]) -> u64 {
    let mut last = 0u64;
    let mut shift = 0;
    if let Some((w, r)) = rest.split_first_chunk::<4>() {
        last = u64::from(u32::from_le_bytes(*w));
        shift = 32;
        rest = r;
    }
    if let Some((w, r)) = rest.split_first_chunk::<2>() {
        last |= u64::from(u16::from_le_bytes(*w)) << shift;
        shift += 16;
        rest = r;
    }
    if let Some(&b) = rest.first() {
        last |= u64::from(b) << shift;
    }
    last
}

/// The ones-complement sum (RFC 1071) of `bytes` as big-endian 16-bit words, folded to 16 bits and
/// **not** inverted. An odd final byte is padded with a zero byte on the right.
///
/// The sum of an empty slice is 0. Any length is accepted; the loop adds 4 bytes at a time and
/// vectorizes.
#[inline]
pub fn data(bytes: &[u8]) -> u16 {
    // The folded sum of the little-endian words, byte-swapped, is the sum of the big-endian words: a
    // swap multiplies by 2^8 modulo 0xffff, and so does reading every word the other way round. A
    // non-zero sum folds to 1..=0xffff on either side, so the two agree exactly, not just modulo 0xffff.
    fold(sum_le(bytes)).swap_bytes()
}

/// Combines partial ones-complement sums (each as returned by [`data`] or the pseudo-header
/// functions) into one, by ones-complement addition (RFC 1071 §2 (A), associativity). Not inverted.
pub fn combine(checksums: &[u16]) -> u16 {
    let mut sum = 0u64;
    for &c in checksums {
        sum += u64::from(c);
    }
    fold(sum)
}

/// The ones-complement sum of the IPv4 pseudo header that UDP and TCP checksums cover (RFC 768):
/// source address (4 bytes), destination address (4 bytes), a zero byte, `protocol` (17 for UDP)
/// and `length` (the UDP length field: header plus payload, in bytes). Not inverted.
///
/// `length` is a `u32` so that the same call shape serves IPv6; over IPv4 it fits in 16 bits.
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u32) -> u16 {
    let mut sum = u64::from(u32::from(src));
    sum += u64::from(u32::from(dst));
    sum += u64::from(protocol);
    sum += u64::from(length);
    fold(sum)
}

/// The ones-complement sum of the IPv6 pseudo header that UDP and ICMPv6 checksums cover (RFC 8200
/// §8.1, RFC 4443 §2.3): source address (16 bytes), destination address (16 bytes), the upper-layer
/// packet length as a 32-bit value (the UDP length or the ICMPv6 message length, in bytes), three
/// zero bytes and the `next_header` value (17 for UDP, 58 for ICMPv6). Not inverted.
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, length: u32) -> u16 {
    let mut sum = u64::from(data(&src.octets()));
    sum += u64::from(data(&dst.octets()));
    sum += u64::from(length);
    sum += u64::from(next_header);
    fold(sum)
}

/// A running ones-complement sum over data that arrives in pieces (header, then scattered payload
/// slices), equal to [`data`] over the concatenation of every piece added.
///
/// A piece that starts at an odd byte offset of the concatenation has its bytes in swapped word
/// positions; by the byte-order independence of the ones-complement sum (RFC 1071 §2 (B)) its sum is
/// the byte swap of its sum taken as if aligned, which is what [`Accumulator::add`] does.
///
/// ```
/// use roce::checksum::{data, Accumulator};
/// let mut acc = Accumulator::new();
/// acc.add(b"abc");
/// acc.add(b"defg");
/// assert_eq!(acc.sum(), data(b"abcdefg"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accumulator {
    /// Folded sum so far, in the word alignment of the concatenation.
    sum: u16,
    /// Whether the number of bytes added so far is odd.
    odd: bool,
}

impl Accumulator {
    /// An empty sum (0, at an even offset).
    pub const fn new() -> Self {
        Accumulator { sum: 0, odd: false }
    }

    /// Adds `bytes`, which follow the bytes added before them.
    pub fn add(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut part = data(bytes);
        if self.odd {
            part = part.swap_bytes();
        }
        self.sum = combine(&[self.sum, part]);
        self.odd ^= bytes.len() % 2 == 1;
    }

    /// Adds an already computed sum of a piece of *even* length that is not part of the byte stream's
    /// alignment (a pseudo-header sum, for example).
    pub fn add_sum(&mut self, sum: u16) {
        self.sum = combine(&[self.sum, sum]);
    }

    /// The ones-complement sum of everything added, folded to 16 bits and not inverted.
    pub const fn sum(&self) -> u16 {
        self.sum
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    /// Reference: the RFC 1071 §4.1 loop, one 16-bit word at a time.
    fn reference(bytes: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        let mut i = 0;
        while i + 1 < bytes.len() {
            sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
            i += 2;
        }
        if i < bytes.len() {
            sum += u32::from(bytes[i]) << 8;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(data(&bytes), 0xddf2);
        assert_eq!(reference(&bytes), 0xddf2);
    }

    #[test]
    fn long_inputs_match_reference() {
        // Across the short/vector switch and the 1 MiB blocks of the accumulators, odd lengths
        // included.
        extern crate std;
        let bytes: std::vec::Vec<u8> = (0..(5usize << 19) + 3)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // `reference` with a 64-bit accumulator (its 32-bit one overflows past 64 KiB).
        let reference_long = |bytes: &[u8]| {
            let mut sum: u64 = 0;
            for pair in bytes.chunks(2) {
                sum += u64::from(u16::from_be_bytes([
                    pair[0],
                    pair.get(1).copied().unwrap_or(0),
                ]));
            }
            fold(sum)
        };
        for len in [
            127,
            128,
            129,
            4096,
            4099,
            SUM_BLOCK - 1,
            SUM_BLOCK + 1,
            bytes.len(),
        ] {
            assert_eq!(
                data(&bytes[..len]),
                reference_long(&bytes[..len]),
                "length {len}"
            );
        }
        let ones = std::vec![0xffu8; SUM_BLOCK * 2 + 6];
        assert_eq!(data(&ones), 0xffff);
    }

    #[test]
    fn empty_and_odd() {
        assert_eq!(data(&[]), 0);
        assert_eq!(data(&[0xab]), 0xab00);
        assert_eq!(data(&[0x12, 0x34, 0x56]), 0x6834);
        assert_eq!(data(&[0xff, 0xff]), 0xffff);
    }

    #[test]
    fn ipv4_header_golden() {
        // IPv4 header of the scapy RoCEv2 vector (see udp.rs): checksum field b4d5 included, the sum
        // of the whole header is ffff; with the field zeroed, the checksum is b4d5.
        let mut header = [
            0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8,
            0x00, 0x07, 0xc0, 0xa8, 0x00, 0x07,
        ];
        assert_eq!(data(&header), 0xffff);
        header[10] = 0;
        header[11] = 0;
        assert_eq!(!data(&header), 0xb4d5);
    }

    #[test]
    fn pseudo_header_v4_matches_bytes() {
        let src = Ipv4Addr::new(192, 168, 0, 7);
        let dst = Ipv4Addr::new(10, 1, 2, 3);
        let bytes = [192, 168, 0, 7, 10, 1, 2, 3, 0, 17, 0, 44];
        assert_eq!(pseudo_header_v4(src, dst, 17, 44), data(&bytes));
    }

    #[test]
    fn pseudo_header_v6_matches_bytes() {
        let src = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xffff, 1);
        let dst = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1234, 0x5678, 0x9abc, 0xdef0);
        let mut bytes = [0u8; 40];
        bytes[..16].copy_from_slice(&src.octets());
        bytes[16..32].copy_from_slice(&dst.octets());
        bytes[32..36].copy_from_slice(&70_000u32.to_be_bytes());
        bytes[39] = 17;
        assert_eq!(pseudo_header_v6(src, dst, 17, 70_000), data(&bytes));
    }

    #[test]
    fn combine_wraps() {
        assert_eq!(combine(&[]), 0);
        assert_eq!(combine(&[0xffff, 0x0001]), 0x0001);
        assert_eq!(combine(&[0x8000, 0x8000]), 0x0001);
        assert_eq!(combine(&[0xffff; 100]), 0xffff);
    }

    #[test]
    fn accumulator_odd_pieces() {
        let whole = b"The quick brown fox jumps over the lazy dog";
        let mut acc = Accumulator::new();
        acc.add(&whole[..1]);
        acc.add(&whole[1..4]);
        acc.add(&[]);
        acc.add(&whole[4..9]);
        acc.add(&whole[9..]);
        assert_eq!(acc.sum(), data(whole));
    }

    proptest! {
        #[test]
        fn data_matches_reference(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(data(&bytes), reference(&bytes));
        }

        #[test]
        fn accumulator_matches_concatenation(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..6),
        ) {
            let mut cuts: [usize; 6] = {
                let mut c = [bytes.len(); 6];
                for (dst, src) in c.iter_mut().zip(&cuts) {
                    *dst = (*src).min(bytes.len());
                }
                c
            };
            cuts.sort_unstable();
            let mut acc = Accumulator::new();
            let mut start = 0;
            for &cut in &cuts {
                acc.add(&bytes[start..cut]);
                start = cut;
            }
            acc.add(&bytes[start..]);
            prop_assert_eq!(acc.sum(), reference(&bytes));
        }

        #[test]
        fn combine_is_sum_of_concatenation(
            a in proptest::collection::vec(any::<u8>(), 0..64),
            b in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            // Only even-length first parts keep word alignment.
            let a = &a[..a.len() & !1];
            let mut both = [0u8; 128];
            both[..a.len()].copy_from_slice(a);
            both[a.len()..a.len() + b.len()].copy_from_slice(&b);
            prop_assert_eq!(combine(&[data(a), data(&b)]), data(&both[..a.len() + b.len()]));
        }
    }
}
