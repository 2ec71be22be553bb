//! Verifying the ICRC of an IPv4 packet whose **identification** the receiver cannot see.
//!
//! The ICRC covers the IPv4 identification (IBTA vol. 1 Annex A17.3.3 masks only the Type of Service,
//! the TTL and the header checksum), but a kernel UDP socket reports the addresses, ports, TOS and TTL
//! of a datagram and never its identification. A receiver on such a socket knows every covered bit
//! except those 16. It can still verify the ICRC, by solving for them.
//!
//! # The method
//!
//! The CRC is linear over GF(2): for packets of one length, flipping covered bits XORs the CRC with
//! a value that depends only on which bits were flipped (the initial value and the final inversion
//! cancel out). So for the identification `id` actually sent and the one the receiver assumed, `a`:
//!
//! ```text
//! ICRC(id) XOR ICRC(a) = D(x) * x^(8k) mod P       (as CRC registers)
//! ```
//!
//! with `D(x)` the 16-bit polynomial of `id XOR a`, `P` the CRC-32 polynomial and `k` the number of
//! bytes from the end of the identification field to the end of the ICRC, i.e. the IPv4 Total Length
//! minus 6 (`x^32` of the CRC's definition plus the covered bytes after the field, so the IPv4 header
//! options, if any, change nothing). The receiver computes `ICRC(a)` as usual (one CRC pass with
//! identification `a`), XORs it with the received ICRC into the *syndrome* `s`, and multiplies:
//!
//! ```text
//! D(x) = s(x) * x^(-8k) mod P
//! ```
//!
//! `x` is invertible modulo `P` (P(0) = 1). If `D` has degree below 16, `id = a XOR D` is the one
//! identification for which the packet's ICRC verifies; otherwise none does and the packet is corrupt.
//! In matrix terms: the 32x16 matrix `M` mapping identification bits to CRC bits (the CRC of each
//! identification bit followed by `k` zero bytes) is `x^(8k)` times the matrix of `D -> D * x^32`, and
//! the solve is one multiplication by its inverse `x^(-8k)`, the shift property zlib's `crc32_combine`
//! uses, run backwards. `x^(-8k)` comes from two 256-entry tables (`k` split into bytes, built at
//! compile time), so a packet costs two multiplications modulo `P` (`carry-less` 32 x 32 bits in 4-bit
//! windows, then a 4-step table reduction): tens of nanoseconds, whatever its length, on top of the
//! CRC pass itself (`benches/wire.rs` measures it).
//!
//! # What it keeps of the ICRC's integrity
//!
//! `M` has rank 16 (`D -> D * x^(8k + 32)` is injective), so of the 2^32 possible ICRC values, 2^16
//! verify for some identification: **16 of the 32 bits of integrity remain**. A random corruption of
//! the covered bytes or of the ICRC passes with probability 2^-16 (instead of 2^-32), and is then
//! taken for a packet with another identification.
//!
//! Single-bit errors: flipping the bit sent `t` bit times after the identification's last bit (the
//! covered bytes after the field and the ICRC itself, in wire order, least significant bit of each
//! byte first) changes `s` by `x^(-t) * x^(8k)`, so it passes iff `x^(-t) mod P` has degree below 16.
//! The smallest such `t` is [`MIN_UNDETECTED_SINGLE_BIT_DISTANCE`] (214 135 bits, found by exhaustive
//! search in the tests; the next ones are 227 787, 290 143, 290 144 and 304 017, and there are no
//! others within 65 536 bytes): **every single-bit error is detected in a packet of Total Length up to
//! [`SINGLE_BIT_SAFE_TOTAL_LEN`] (26 772 bytes)**, which covers every RoCEv2 packet (a 4096-byte path
//! MTU makes packets of at most 4 164 bytes); in longer datagrams a single-bit error at one of those
//! few distances passes as another identification. Bits before the identification (version, IHL,
//! Total Length) give `x^t` with `16 <= t < 32`, degree 16 or more: always detected.
//!
//! Nothing here allocates, panics or depends on `std`.

/// The CRC-32 polynomial (IEEE 802.3, `0x04C11DB7`), bit-reflected, as the CRC register holds it:
/// bit 31 is the coefficient of `x^0`, bit 0 that of `x^31`.
const POLY: u32 = 0xEDB8_8320;

/// The polynomial `1` (`x^0`) in the reflected representation.
const ONE: u32 = 1 << 31;

/// Bits of integrity the ICRC keeps when the identification is solved for (32 minus the rank of the
/// identification's 32x16 matrix, 16): a random corruption passes with probability 2^-16.
pub const INTEGRITY_BITS: u32 = 16;

/// The smallest distance `t`, in bits, from the last bit of the identification field to a later bit
/// (wire order, least significant bit of each byte first) whose flip is indistinguishable from a
/// change of identification: `x^(-t) mod P` has degree below 16. See the module docs.
pub const MIN_UNDETECTED_SINGLE_BIT_DISTANCE: usize = 214_135;

/// The largest IPv4 Total Length, in bytes, at which every single-bit error of the covered bytes or
/// the ICRC is still detected when the identification is solved for: the ICRC's last bit lies
/// `8 * (total_len - 6)` bits after the identification's last bit.
pub const SINGLE_BIT_SAFE_TOTAL_LEN: usize = (MIN_UNDETECTED_SINGLE_BIT_DISTANCE - 1) / 8 + 6;

/// `b * x mod P` (reflected): one zero bit through the CRC register.
const fn mul_x(b: u32) -> u32 {
    if b & 1 != 0 {
        (b >> 1) ^ POLY
    } else {
        b >> 1
    }
}

/// `c * x^(-1) mod P` (reflected), the inverse of [`mul_x`]: `mul_x` reduced by `P` exactly when it
/// set bit 31 (`POLY` has it, `b >> 1` never does).
const fn div_x(c: u32) -> u32 {
    if c & ONE != 0 {
        ((c ^ POLY) << 1) | 1
    } else {
        c << 1
    }
}

/// `a * b mod P`, bit by bit (zlib's `multmodp`): for the compile-time tables and as the tests'
/// reference for [`mul`].
const fn mul_slow(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut m = ONE;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        b = mul_x(b);
        m >>= 1;
    }
    p
}

/// The reflected CRC-32 byte table: `TABLE[n]` is `n * x^32 mod P` for the byte `n` in the CRC
/// register's low 8 bits, so `(r >> 8) ^ TABLE[r & 0xFF]` is `r * x^8 mod P`.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut i = 0;
        while i < 8 {
            c = mul_x(c);
            i += 1;
        }
        t[n] = c;
        n += 1;
    }
    t
};

/// `a * b mod P` (reflected): a carry-less 32 x 32-bit product in 4-bit windows of `a` (a 16-entry
/// table of `b`'s multiples), then the 32 bits above `x^31` reduced in four byte steps of [`TABLE`].
///
/// The integer carry-less product of two reflected 32-bit values holds the coefficient of `x^i` at
/// bit `62 - i`; shifted left once, the high 32 bits are the reflected `x^0 .. x^31` part and the low
/// 32 bits the reflected `x^32 .. x^63` part, i.e. a register to be multiplied by `x^32`.
#[inline]
fn mul(a: u32, b: u32) -> u32 {
    let b = u64::from(b);
    let mut multiples = [0u64; 16];
    let mut j = 1;
    while j < 16 {
        multiples[j] = if j & 1 == 0 {
            multiples[j / 2] << 1
        } else {
            multiples[j - 1] ^ b
        };
        j += 1;
    }
    let mut p = 0u64;
    let mut i = 0;
    while i < 8 {
        p ^= multiples[((a >> (4 * i)) & 0xF) as usize] << (4 * i);
        i += 1;
    }
    let p = p << 1;
    let mut high = p as u32;
    let mut step = 0;
    while step < 4 {
        high = (high >> 8) ^ TABLE[(high & 0xFF) as usize];
        step += 1;
    }
    ((p >> 32) as u32) ^ high
}

/// `x^(8n) mod P` (`forward`) or `x^(-8n) mod P` for `n < 256`: one byte's shift, n times.
const fn byte_powers(forward: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut v = ONE;
    let mut n = 0;
    while n < 256 {
        t[n] = v;
        let mut i = 0;
        while i < 8 {
            v = if forward { mul_x(v) } else { div_x(v) };
            i += 1;
        }
        n += 1;
    }
    t
}

/// `x^(±8 * 256 * n) mod P` for `n < 256`, from the byte table `low` of the same direction.
const fn block_powers(low: &[u32; 256], forward: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    // x^(±8 * 255) * x^(±8) = x^(±2048)
    let mut step = low[255];
    let mut i = 0;
    while i < 8 {
        step = if forward { mul_x(step) } else { div_x(step) };
        i += 1;
    }
    let mut v = ONE;
    let mut n = 0;
    while n < 256 {
        t[n] = v;
        v = mul_slow(v, step);
        n += 1;
    }
    t
}

/// `INV_LOW[n] = x^(-8n) mod P` for `n < 256`.
const INV_LOW: [u32; 256] = byte_powers(false);
/// `INV_HIGH[n] = x^(-8 * 256 * n) mod P` for `n < 256`.
const INV_HIGH: [u32; 256] = block_powers(&INV_LOW, false);
/// `FWD_LOW[n] = x^(8n) mod P` for `n < 256`.
const FWD_LOW: [u32; 256] = byte_powers(true);
/// `FWD_HIGH[n] = x^(8 * 256 * n) mod P` for `n < 256`.
const FWD_HIGH: [u32; 256] = block_powers(&FWD_LOW, true);

/// `x^(±8k) mod P` for `k < 65 536` bytes, from a direction's two tables.
#[inline]
fn power(low: &[u32; 256], high: &[u32; 256], k: u16) -> u32 {
    let [h, l] = k.to_be_bytes();
    let low = low[usize::from(l)];
    if h == 0 {
        low
    } else {
        mul(low, high[usize::from(h)])
    }
}

/// `x^(-8k) mod P` for `k < 65 536` bytes.
#[inline]
fn inverse_shift(k: u16) -> u32 {
    power(&INV_LOW, &INV_HIGH, k)
}

/// `x^(8k) mod P` for `k < 65 536` bytes.
#[inline]
fn shift(k: u16) -> u32 {
    power(&FWD_LOW, &FWD_HIGH, k)
}

/// The ICRC of an IPv4 packet after its identification changed from `from` to `to`, everything
/// else equal, without a pass over the packet: the sender's side of [`solve_ipv4_ident`] (same
/// method, the other way: `ICRC(to) = ICRC(from) XOR (from XOR to)(x) * x^(8k) mod P`, `k` the
/// bytes from the end of the identification field through the ICRC). A link whose kernel numbers
/// the segments of a UDP GSO train 0, 1, 2, ... reseals each later segment's ICRC so (IBTA vol. 1
/// Annex A17.3.3: the ICRC covers the identification).
///
/// * `ip_total_len`: the IPv4 Total Length of the packet, bytes (header with options, UDP header,
///   BTH through ICRC);
/// * `icrc`: the ICRC field value (as [`super::compute`] returns it) for identification `from`.
///
/// Returns the ICRC field value for identification `to`; `None` when `ip_total_len` is below 24
/// or above 65 535 (no IPv4 packet with an ICRC). Two multiplications modulo the CRC polynomial;
/// never panics, never allocates.
#[inline]
pub fn reseal_ipv4_ident(ip_total_len: usize, from: u16, to: u16, icrc: u32) -> Option<u32> {
    if !(24..=0xFFFF).contains(&ip_total_len) {
        return None;
    }
    let delta = from ^ to;
    if delta == 0 {
        return Some(icrc);
    }
    // As in `solve_ipv4_ident`: the identification's wire bytes are reflected bits 16 .. 31.
    let [first, second] = delta.to_be_bytes();
    let d = u32::from_le_bytes([0, 0, first, second]);
    let k = (ip_total_len - 6) as u16;
    let syndrome = mul(d, shift(k));
    Some(icrc ^ syndrome.swap_bytes())
}

/// The IPv4 identification for which a received ICRC verifies, given the ICRC computed for an
/// assumed identification (IBTA vol. 1 Annex A17.3.3; see the [module docs](self) for the method).
///
/// * `ip_total_len`: the IPv4 Total Length of the packet, bytes (header with options, UDP header,
///   BTH through ICRC);
/// * `assumed_ident`: the identification `computed` was computed with;
/// * `computed`: the ICRC field value (as [`super::compute`] returns it) of the packet as received
///   but with identification `assumed_ident`;
/// * `received`: the ICRC field value the packet carries ([`super::from_wire`] of its last 4 bytes).
///
/// Returns `Some(ident)`, the one identification for which the ICRC verifies (`assumed_ident` when
/// `computed == received`), or `None` when no identification makes it verify: the packet is
/// corrupt (or `ip_total_len` is below 24 or above 65 535, no IPv4 packet with an ICRC). Only 16 of
/// the ICRC's 32 bits check the packet then ([`INTEGRITY_BITS`]). Two multiplications modulo the
/// CRC polynomial; never panics, never allocates.
#[inline]
pub fn solve_ipv4_ident(
    ip_total_len: usize,
    assumed_ident: u16,
    computed: u32,
    received: u32,
) -> Option<u16> {
    // The field values are the CRC registers byte-swapped (see the parent module's "Byte order").
    let syndrome = (computed ^ received).swap_bytes();
    if syndrome == 0 {
        return Some(assumed_ident);
    }
    // Bytes from the end of the identification (IP offset 6) through the ICRC.
    let k = ip_total_len.checked_sub(6)?;
    if ip_total_len < 24 {
        return None;
    }
    let k = u16::try_from(k).ok().filter(|_| ip_total_len <= 0xFFFF)?;
    let d = mul(syndrome, inverse_shift(k));
    // Degree below 16: only the reflected coefficients of x^0 .. x^15 (bits 31 .. 16) may be set.
    if d & 0xFFFF != 0 {
        return None;
    }
    // The identification's first byte on the wire (its high byte, big-endian) holds x^15 .. x^8
    // from its least significant bit up: reflected bits 16 .. 23; the second byte bits 24 .. 31.
    let [_, _, first, second] = d.to_le_bytes();
    Some(assumed_ident ^ u16::from_be_bytes([first, second]))
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use crate::icrc::{compute, from_wire, to_wire, ICRC_LEN};
    use std::vec::Vec;

    /// A small deterministic generator (xorshift64*), so that failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn fill(&mut self, b: &mut [u8]) {
            for x in b {
                *x = self.next() as u8;
            }
        }
    }

    /// A random IPv4 RoCEv2 packet (IP header through ICRC, the ICRC computed for `ident`) with a
    /// `payload_len`-byte payload after the BTH; `ihl` 5 or more.
    fn packet(rng: &mut Rng, ihl: usize, payload_len: usize, ident: u16) -> Vec<u8> {
        let ip_len = ihl * 4;
        let total = ip_len + 8 + 12 + payload_len + ICRC_LEN;
        let mut p = std::vec![0u8; total];
        rng.fill(&mut p);
        p[0] = 0x40 | ihl as u8;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&ident.to_be_bytes());
        p[9] = 17;
        let udp_len = (total - ip_len) as u16;
        p[ip_len + 2..ip_len + 4].copy_from_slice(&4791u16.to_be_bytes());
        p[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        let icrc = compute(&p[..total - ICRC_LEN]).unwrap();
        p[total - ICRC_LEN..].copy_from_slice(&to_wire(icrc));
        p
    }

    /// What a receiver that assumed identification `assume` solves for `p`.
    fn solve(p: &[u8], assume: u16) -> Option<u16> {
        let mut copy = p.to_vec();
        copy[4..6].copy_from_slice(&assume.to_be_bytes());
        let n = copy.len();
        // A flip that breaks the headers (version, IHL, protocol) fails before any solving.
        let computed = compute(&copy[..n - ICRC_LEN]).ok()?;
        let received = from_wire(copy[n - ICRC_LEN..].try_into().unwrap());
        solve_ipv4_ident(n, assume, computed, received)
    }

    /// Bits of IPv4 header byte `i` that the ICRC does not cover: TOS, TTL, header checksum
    /// (Annex A17.3.3), and the UDP checksum and BTH byte 4 (at `ip_len + 6`, `+ 7` and `+ 12`).
    fn masked(i: usize, ip_len: usize) -> bool {
        matches!(i, 1 | 8 | 10 | 11) || i == ip_len + 6 || i == ip_len + 7 || i == ip_len + 12
    }

    #[test]
    fn inverse_of_x_and_tables() {
        assert_eq!(div_x(mul_x(0x1234_5678)), 0x1234_5678);
        assert_eq!(mul_x(div_x(ONE)), ONE);
        for (n, &inv) in INV_LOW.iter().enumerate() {
            let mut v = inv;
            for _ in 0..8 * n {
                v = mul_x(v);
            }
            assert_eq!(v, ONE, "INV_LOW[{n}]");
        }
        // x^(8 * 256 * n) * INV_HIGH[n] = 1, with x^(8 * 256) from repeated squaring of x^8.
        let mut x2048 = ONE;
        for _ in 0..2048 {
            x2048 = mul_x(x2048);
        }
        let mut forward = ONE;
        for (n, &inv) in INV_HIGH.iter().enumerate() {
            assert_eq!(mul_slow(forward, inv), ONE, "INV_HIGH[{n}]");
            forward = mul_slow(forward, x2048);
        }
        // The table is the standard CRC-32 table (zlib's first entries).
        assert_eq!(&TABLE[..4], &[0, 0x7707_3096, 0xEE0E_612C, 0x9909_51BA]);
    }

    #[test]
    fn fast_multiplication_matches_the_bitwise_one() {
        let mut rng = Rng(1);
        for _ in 0..100_000 {
            let (a, b) = (rng.next() as u32, (rng.next() >> 32) as u32);
            assert_eq!(mul(a, b), mul_slow(a, b), "{a:#x} * {b:#x}");
        }
        for a in [0, ONE, 1, u32::MAX, POLY] {
            for b in [0, ONE, 1, u32::MAX, POLY] {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a:#x} * {b:#x}");
            }
        }
        for k in [0u16, 1, 255, 256, 257, 4163, 0xFFFF] {
            let mut v = inverse_shift(k);
            for _ in 0..8 * usize::from(k) {
                v = mul_x(v);
            }
            assert_eq!(v, ONE, "x^-8k, k = {k}");
        }
    }

    #[test]
    fn forward_tables_shift_by_whole_bytes() {
        for (n, &fwd) in FWD_LOW.iter().enumerate() {
            assert_eq!(mul(fwd, INV_LOW[n]), ONE, "FWD_LOW[{n}]");
        }
        for (n, &fwd) in FWD_HIGH.iter().enumerate() {
            assert_eq!(mul(fwd, INV_HIGH[n]), ONE, "FWD_HIGH[{n}]");
        }
        for k in [0u16, 1, 255, 256, 257, 4163, 0xFFFF] {
            assert_eq!(mul(shift(k), inverse_shift(k)), ONE, "x^8k, k = {k}");
        }
    }

    #[test]
    fn a_resealed_icrc_equals_the_recomputed_one() {
        let mut rng = Rng(5);
        for round in 0..400 {
            let ihl = if round % 8 == 0 { 5 + rng.below(11) } else { 5 };
            let payload_len = match round % 4 {
                0 => rng.below(300),
                1 => rng.below(5000),
                2 => 4096,
                _ => rng.below(9000),
            };
            let from = rng.next() as u16;
            let p = packet(&mut rng, ihl, payload_len, from);
            let n = p.len();
            let icrc = from_wire(p[n - ICRC_LEN..].try_into().unwrap());
            for to in [from, !from, 0, 1, rng.next() as u16] {
                let mut q = p.clone();
                q[4..6].copy_from_slice(&to.to_be_bytes());
                let recomputed = compute(&q[..n - ICRC_LEN]).unwrap();
                let resealed = reseal_ipv4_ident(n, from, to, icrc);
                assert_eq!(resealed, Some(recomputed), "round {round} {from} -> {to}");
                // And a receiver that assumes `from` solves it back to `to`.
                q[n - ICRC_LEN..].copy_from_slice(&to_wire(recomputed));
                assert_eq!(solve(&q, from), Some(to));
            }
        }
        // The largest IPv4 packet; lengths no IPv4 packet with an ICRC has.
        let p = packet(&mut rng, 5, 0xFFFF - 20 - 8 - 12 - 4, 7);
        let icrc = from_wire(p[p.len() - ICRC_LEN..].try_into().unwrap());
        let mut q = p.clone();
        q[4..6].copy_from_slice(&9u16.to_be_bytes());
        let want = compute(&q[..q.len() - ICRC_LEN]).unwrap();
        assert_eq!(reseal_ipv4_ident(p.len(), 7, 9, icrc), Some(want));
        assert_eq!(reseal_ipv4_ident(23, 0, 1, 0), None);
        assert_eq!(reseal_ipv4_ident(0x1_0000, 0, 1, 0), None);
    }

    #[test]
    fn every_identification_is_recovered() {
        let mut rng = Rng(2);
        let p = packet(&mut rng, 5, 64, 0);
        let n = p.len();
        for id in 0..=u16::MAX {
            let mut q = p.clone();
            q[4..6].copy_from_slice(&id.to_be_bytes());
            let icrc = compute(&q[..n - ICRC_LEN]).unwrap();
            q[n - ICRC_LEN..].copy_from_slice(&to_wire(icrc));
            assert_eq!(solve(&q, 0), Some(id), "id {id}");
        }
    }

    #[test]
    fn random_packets_and_identifications_are_recovered() {
        let mut rng = Rng(3);
        for round in 0..400 {
            let ihl = if round % 8 == 0 { 5 + rng.below(11) } else { 5 };
            // Payloads from none to past the 8-bit boundary of k and to a 9000-byte jumbo frame.
            let payload_len = match round % 4 {
                0 => rng.below(300),
                1 => rng.below(5000),
                2 => 4096,
                _ => rng.below(9000),
            };
            let id = rng.next() as u16;
            let p = packet(&mut rng, ihl, payload_len, id);
            for assume in [0, id, !id, rng.next() as u16] {
                assert_eq!(solve(&p, assume), Some(id), "round {round} assume {assume}");
            }
        }
        // The largest IPv4 packet.
        let p = packet(&mut rng, 5, 0xFFFF - 20 - 8 - 12 - 4, 0xBEEF);
        assert_eq!(solve(&p, 0), Some(0xBEEF));
    }

    #[test]
    fn every_single_bit_flip_fails_in_packets_up_to_the_safe_length() {
        let mut rng = Rng(4);
        for (round, payload_len) in [0, 1, 7, 64, 300, 1024].into_iter().enumerate() {
            let ihl = if round == 3 { 6 } else { 5 };
            let ip_len = ihl * 4;
            let id = rng.next() as u16;
            let p = packet(&mut rng, ihl, payload_len, id);
            assert!(p.len() <= SINGLE_BIT_SAFE_TOTAL_LEN);
            for i in (0..p.len()).filter(|i| !(4..6).contains(i)) {
                for bit in 0..8 {
                    let mut q = p.clone();
                    q[i] ^= 1 << bit;
                    let expect = masked(i, ip_len).then_some(id);
                    assert_eq!(solve(&q, 0), expect, "len {} byte {i} bit {bit}", p.len());
                }
            }
        }
    }

    /// Degree of `x^(-t) mod P` below 16: a flip `t` bits after the identification's last bit looks
    /// like an identification change.
    fn low_degree_distances(up_to: usize) -> Vec<usize> {
        let mut v = ONE;
        let mut hits = Vec::new();
        for t in 1..=up_to {
            v = div_x(v);
            if v & 0xFFFF == 0 {
                hits.push(t);
            }
        }
        hits
    }

    #[test]
    fn undetectable_single_bit_distances_exhaustively() {
        // Every distance within the largest IPv4 packet.
        let hits = low_degree_distances(8 * 0x1_0000);
        assert_eq!(hits, [214_135, 227_787, 290_143, 290_144, 304_017]);
        assert_eq!(hits[0], MIN_UNDETECTED_SINGLE_BIT_DISTANCE);
        assert_eq!(SINGLE_BIT_SAFE_TOTAL_LEN, 26_772);
        // Bits before the identification, up to the pseudo-LRH: x^t, t in 16..112, never below 16.
        let mut v = ONE;
        for t in 0..112 {
            if t >= 16 {
                assert_ne!(v & 0xFFFF, 0, "x^{t}");
            }
            v = mul_x(v);
        }
    }

    #[test]
    fn single_bit_flips_beyond_the_safe_length_pass_exactly_where_predicted() {
        let mut rng = Rng(5);
        let total = 40_000;
        let id = 0x1234;
        let p = packet(&mut rng, 5, total - 20 - 8 - 12 - 4, id);
        let hits = low_degree_distances(8 * (total - 6));
        assert_eq!(hits.len(), 5);
        // Bit t after the identification's last bit: byte 6 + (t - 1) / 8, bit (t - 1) % 8.
        let mut positions: Vec<usize> = hits.clone();
        positions.extend(hits.iter().flat_map(|&t| [t - 1, t + 1]));
        positions.extend((0..50).map(|_| 1 + rng.below(8 * (total - 6))));
        positions.push(8 * (total - 6)); // the ICRC's last bit
        for t in positions {
            let (byte, bit) = (6 + (t - 1) / 8, (t - 1) % 8);
            if masked(byte, 20) {
                continue;
            }
            let mut q = p.clone();
            q[byte] ^= 1 << bit;
            let got = solve(&q, 0);
            if hits.contains(&t) {
                // x^(-t) = D(x), degree < 16: taken for the identification id XOR D.
                let mut d = ONE;
                for _ in 0..t {
                    d = div_x(d);
                }
                let [_, _, first, second] = d.to_le_bytes();
                let other = id ^ u16::from_be_bytes([first, second]);
                assert_ne!(other, id);
                assert_eq!(got, Some(other), "t {t}");
            } else {
                assert_eq!(got, None, "t {t}");
            }
        }
    }

    #[test]
    fn out_of_range_lengths() {
        assert_eq!(solve_ipv4_ident(0, 7, 1, 2), None);
        assert_eq!(solve_ipv4_ident(23, 7, 1, 2), None);
        assert_eq!(solve_ipv4_ident(0x1_0000, 7, 1, 2), None);
        assert_eq!(solve_ipv4_ident(usize::MAX, 7, 1, 2), None);
        // A matching ICRC needs no length.
        assert_eq!(solve_ipv4_ident(0, 7, 5, 5), Some(7));
    }
}
