//! Randomness for the numbers an off-path attacker must not guess: MR keys, QPNs, start PSNs.
//!
//! An RDMA request is authorized by numbers it carries: the destination QPN and the PSN in its
//! BTH, and for RDMA READ / WRITE / atomics the rkey in its RETH or AtomicETH. Over RoCEv2 anyone
//! who can send a UDP datagram to the device's address can send such a request, so these numbers
//! are the only defence against a forged one, and they must be drawn from a source an attacker
//! cannot predict (the arithmetic of what that buys is in [`crate::verbs::mr`] and
//! [`crate::verbs::qp`]). Counters, clocks and hashes of either are predictable; this module's
//! sources are not.
//!
//! The object model is `no_std`, so it takes its randomness from a [`RandomSource`] given to the
//! [`Context`](crate::verbs::context::Context) when it is created. With feature `std`,
//! [`OsRandom`] reads the operating system's random source (getrandom(2)), and every device
//! layer of this crate (the UDP and VFIO software devices, the test fabric) uses it.

/// A source of unpredictable bytes (a CSPRNG or the operating system's random source).
///
/// Implementations must be unpredictable to a peer: never a counter, a clock or a hash of
/// either. Tests that want reproducible numbers may inject a seeded generator.
pub trait RandomSource: Send {
    /// Fills `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8]);

    /// A uniformly random `u32`.
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_ne_bytes(b)
    }
}

impl<R: RandomSource + ?Sized> RandomSource for alloc::boxed::Box<R> {
    fn fill(&mut self, buf: &mut [u8]) {
        (**self).fill(buf);
    }
}

#[cfg(feature = "std")]
mod os;

#[cfg(feature = "std")]
pub use os::{os_fill, OsRandom};

/// A random 24-bit PSN from the operating system's random source, for a QP's first send PSN
/// (`sq_psn`; rdma-core's tools use `lrand48() & 0xffffff`). A predictable start PSN leaves only
/// the QPN and rkey between an off-path attacker and a forged request; see [`crate::verbs::qp`].
#[cfg(feature = "std")]
pub fn random_psn() -> u32 {
    OsRandom.next_u32() & crate::verbs::attr::PSN_MASK
}
