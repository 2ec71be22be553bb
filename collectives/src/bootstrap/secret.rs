//! Secrets: random values from the operating system, and the keyed hash that turns a secret a
//! launcher shares with its ranks into a rendezvous magic.
//!
//! Values that protect something (the rendezvous magic, which admits a connection to a
//! communicator; the first PSN of a QP, which keeps packets of another connection out) come from
//! the kernel's random source, getrandom(2), never from the clock or the pid, which anyone on the
//! host (and, within a few guesses, anyone who can reach it) can compute.

use core::hash::Hasher;

use siphasher::sip::SipHasher24;

/// 64 random bits from the operating system's random source
/// ([`hca::verbs::random::os_fill`]: getrandom(2), or `/dev/urandom` where it is missing).
///
/// # Panics
/// When the kernel has no random source at all (neither getrandom(2) nor `/dev/urandom`): no
/// value this crate could make up instead would be a secret.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    hca::verbs::random::os_fill(&mut b);
    u64::from_le_bytes(b)
}

/// SipHash-2-4 of `msg` under the 128-bit key `(k0, k1)` (Aumasson and Bernstein, "SipHash: a
/// fast short-input PRF", 2012; the `siphasher` crate): without the key its output cannot be
/// predicted or inverted.
pub(crate) fn siphash24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(k0, k1);
    h.write(msg);
    h.finish()
}

/// Length-prefixed concatenation, so that `("ab", "c")` and `("a", "bc")` differ.
fn framed(parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Vec::new();
    for p in parts {
        m.extend_from_slice(&(p.len() as u64).to_le_bytes());
        m.extend_from_slice(p);
    }
    m
}

/// A 64-bit value keyed by `secret` (bytes of any length; the entropy that makes the result
/// unguessable is the secret's) over the public `context`: SipHash-2-4 under a 128-bit key drawn
/// from the secret by SipHash-2-4 under two fixed keys. Equal inputs give equal values on every
/// host (no per-process randomness), which is what lets every rank derive the same magic.
pub(crate) fn keyed_hash(secret: &[u8], context: &[&[u8]]) -> u64 {
    let s = framed(&[b"coll-secret-key", secret]);
    let k0 = siphash24(0x636f_6c6c_2d6b_3030, 0x7365_6372_6574_2d30, &s);
    let k1 = siphash24(0x636f_6c6c_2d6b_3131, 0x7365_6372_6574_2d31, &s);
    siphash24(k0, k1, &framed(context))
}

/// A name of a communicator whose magic is `magic` that tells nothing of the magic.
pub(crate) fn public_tag(magic: u64) -> u64 {
    keyed_hash(&magic.to_le_bytes(), &[b"coll-public-tag"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_values_differ() {
        let draws: std::collections::HashSet<u64> = (0..64).map(|_| random_u64()).collect();
        assert_eq!(draws.len(), 64, "64 draws of 64 bits do not collide");
    }

    /// The reference vectors of the SipHash paper (key 00 01 .. 0f, messages 00 01 .. of
    /// lengths 0, 7, 8 and 15).
    #[test]
    fn siphash24_matches_the_reference_vectors() {
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0..64).collect();
        assert_eq!(siphash24(k0, k1, &msg[..0]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(k0, k1, &msg[..7]), 0xab02_00f5_8b01_d137);
        assert_eq!(siphash24(k0, k1, &msg[..8]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash24(k0, k1, &msg[..15]), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn keyed_hash_depends_on_the_secret_and_the_context() {
        let a = keyed_hash(b"secret-a", &[b"h", b"1"]);
        assert_eq!(a, keyed_hash(b"secret-a", &[b"h", b"1"]));
        assert_ne!(a, keyed_hash(b"secret-b", &[b"h", b"1"]));
        assert_ne!(a, keyed_hash(b"secret-a", &[b"h1", b""]));
        assert_ne!(public_tag(1), public_tag(2));
        assert_ne!(public_tag(1), 1);
    }
}
