//! 24-bit packet sequence numbers (PSNs).
//!
//! Every request and response packet of a reliable (RC) or unreliable (UC) connection carries a **PSN** in
//! the low 24 bits of BTH bytes 8-11 (IBTA vol. 1 §9.2, §9.7.1). The requester numbers its packets
//! consecutively from the initial PSN chosen at connection setup; the responder expects them in that
//! order, acknowledges by PSN and detects duplicates (already seen) and gaps (sequence errors) by
//! comparing PSNs. PSNs wrap from 0xFF_FFFF to 0, so "before" and "after" are defined modulo 2^24 with
//! serial-number arithmetic (as for TCP sequence numbers, RFC 1982): PSN `a` is *before* `b` when going
//! backwards from `b` to `a` is the shorter way round, i.e. when `(a - b) mod 2^24 >= 2^23`
//! (the transport never has 2^23 or more PSNs outstanding, so this is never ambiguous; Linux rxe's
//! `psn_compare` computes the sign of `(a - b) << 8` as an `s32`, which is the same rule).
//!
//! [`Psn`] deliberately does not implement `PartialOrd`/`Ord`: plain integer order is wrong across the
//! wrap. Use [`Psn::cmp_serial`], [`Psn::is_before`], [`Psn::is_after`] and [`Psn::in_window`].

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number (IBTA vol. 1 §9.7.1). The value is always `<= Psn::MASK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN bits: PSNs are 24 bits wide (IBTA vol. 1 §9.2, BTH PSN field).
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half the PSN space, 2^23: the largest serial distance that still orders two PSNs
    /// (IBTA vol. 1 §9.7.1).
    pub const HALF: u32 = 1 << 23;
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);

    /// A PSN from a 32-bit value; the bits above the low 24 are dropped (as the BTH field does).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The PSN as a number in `0..=0xFF_FFFF`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` packets later, modulo 2^24.
    #[inline]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// The PSN `n` packets earlier, modulo 2^24.
    #[inline]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN (`self + 1` modulo 2^24; 0xFF_FFFF is followed by 0).
    #[inline]
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }

    /// Forward distance in packets from `self` to `other`: `(other - self) mod 2^24`, in `0..2^24`.
    /// `a.wrapping_add(a.distance(b)) == b` for all `a`, `b`.
    ///
    /// Example: `Psn::new(0xFF_FFFF).distance(Psn::new(1)) == 2`.
    #[inline]
    pub const fn distance(self, other: Psn) -> u32 {
        other.0.wrapping_sub(self.0) & Self::MASK
    }

    /// Serial order of two PSNs (IBTA vol. 1 §9.7.1, rxe `psn_compare`): `Less` if `self` is before
    /// `other`, i.e. `(self - other) mod 2^24 >= 2^23`; `Equal` if they are the same PSN; `Greater`
    /// otherwise.
    ///
    /// Two PSNs exactly 2^23 apart are each "before" the other (as in rxe); the relation is only a
    /// meaningful order for PSNs less than 2^23 apart, which the transport guarantees.
    #[inline]
    pub const fn cmp_serial(self, other: Psn) -> Ordering {
        let diff = self.0.wrapping_sub(other.0) & Self::MASK;
        if diff == 0 {
            Ordering::Equal
        } else if diff >= Self::HALF {
            Ordering::Less
        } else {
            Ordering::Greater
        }
    }

    /// `true` if `self` comes before `other` in serial order (see [`Psn::cmp_serial`]).
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        matches!(self.cmp_serial(other), Ordering::Less)
    }

    /// `true` if `self` comes after `other` in serial order (see [`Psn::cmp_serial`]).
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        matches!(self.cmp_serial(other), Ordering::Greater)
    }

    /// `true` if `self` is one of the `len` PSNs `start, start + 1, ..., start + len - 1` (modulo 2^24).
    /// `len == 0` is an empty window; `len >= 2^24` contains every PSN.
    #[inline]
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        start.distance(self) < len
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Display for Psn {
    /// The PSN in decimal, as Wireshark and rdma-core's tools print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn basics() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(0xFF_FFFF).next(), Psn::ZERO);
        assert_eq!(Psn::ZERO.wrapping_sub(1), Psn::new(0xFF_FFFF));
        assert_eq!(Psn::new(0xFF_FFFE).wrapping_add(5), Psn::new(3));
        assert_eq!(Psn::new(0xFF_FFFF).distance(Psn::new(1)), 2);
        assert_eq!(Psn::new(1).distance(Psn::new(0xFF_FFFF)), 0xFF_FFFE);
        assert_eq!(u32::from(Psn::new(7)), 7);
        assert_eq!(std::format!("{}", Psn::new(13_571_856)), "13571856");
    }

    #[test]
    fn serial_order_across_the_wrap() {
        let last = Psn::new(0xFF_FFFF);
        assert!(last.is_before(Psn::ZERO));
        assert!(Psn::ZERO.is_after(last));
        assert_eq!(Psn::new(5).cmp_serial(Psn::new(5)), Ordering::Equal);
        assert!(Psn::new(1).is_before(Psn::new(2)));
        // Exactly half-way: each is before the other (rxe psn_compare behaves the same).
        let a = Psn::ZERO;
        let b = Psn::new(Psn::HALF);
        assert!(a.is_before(b) && b.is_before(a));
        // Just under half-way: a proper order.
        let c = Psn::new(Psn::HALF - 1);
        assert!(a.is_before(c) && c.is_after(a));
    }

    #[test]
    fn windows() {
        let start = Psn::new(0xFF_FFFE);
        assert!(start.in_window(start, 1));
        assert!(!start.in_window(start, 0));
        assert!(Psn::new(1).in_window(start, 4));
        assert!(!Psn::new(2).in_window(start, 4));
        assert!(!Psn::new(0xFF_FFFD).in_window(start, 4));
        assert!(Psn::new(0xFF_FFFD).in_window(start, 1 << 24));
    }

    /// rxe's `psn_compare`: the sign of `(a - b) << 8` as a 32-bit signed integer.
    fn rxe_psn_compare(a: u32, b: u32) -> i32 {
        (a.wrapping_sub(b) << 8) as i32
    }

    proptest! {
        #[test]
        fn add_sub_round_trip(a in any::<u32>(), n in any::<u32>()) {
            let p = Psn::new(a);
            prop_assert_eq!(p.wrapping_add(n).wrapping_sub(n), p);
            prop_assert!(p.wrapping_add(n).value() <= Psn::MASK);
            prop_assert_eq!(p.wrapping_add(n), Psn::new(a.wrapping_add(n)));
        }

        #[test]
        fn distance_is_the_forward_step(a in any::<u32>(), b in any::<u32>()) {
            let (a, b) = (Psn::new(a), Psn::new(b));
            let d = a.distance(b);
            prop_assert!(d <= Psn::MASK);
            prop_assert_eq!(a.wrapping_add(d), b);
            prop_assert_eq!((d + b.distance(a)) & Psn::MASK, 0);
        }

        #[test]
        fn cmp_serial_matches_rxe(a in any::<u32>(), b in any::<u32>()) {
            let (pa, pb) = (Psn::new(a), Psn::new(b));
            prop_assert_eq!(pa.cmp_serial(pb), rxe_psn_compare(a, b).cmp(&0));
        }

        #[test]
        fn successors_are_after(a in any::<u32>(), n in 1u32..Psn::HALF) {
            let p = Psn::new(a);
            let q = p.wrapping_add(n);
            prop_assert!(q.is_after(p));
            prop_assert!(p.is_before(q));
            prop_assert_eq!(q.cmp_serial(p), p.cmp_serial(q).reverse());
            prop_assert!(q.in_window(p, n + 1));
            prop_assert!(!q.in_window(p, n));
        }
    }
}
