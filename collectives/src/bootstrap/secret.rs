//! Secrets: random values from the operating system, and the keyed hash that turns a secret a
//! launcher shares with its ranks into a rendezvous magic.
//!
//! Values that protect something (the rendezvous magic, which admits a connection to a
//! communicator; the first PSN of a QP, which keeps packets of another connection out) come from
//! the kernel's random source, getrandom(2), never from the clock or the pid, which anyone on the
//! host (and, within a few guesses, anyone who can reach it) can compute.

use std::io::{self, Read};

/// Fills `buf` from the kernel's random source: getrandom(2) (blocking only until the kernel's
/// pool is initialised at boot), or `/dev/urandom` where getrandom(2) is missing (Linux before
/// 3.17, `ENOSYS`).
///
/// # Errors
/// The OS error when neither source answers.
pub(crate) fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: getrandom(2) writes at most `rest.len()` bytes into `rest`, which we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n > 0 {
            done += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::ENOSYS) => {
                return std::fs::File::open("/dev/urandom")?.read_exact(&mut buf[done..])
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// 64 random bits from the kernel ([`fill_random`]).
///
/// # Panics
/// When the kernel has no random source at all (neither getrandom(2) nor `/dev/urandom`): no
/// value this crate could make up instead would be a secret.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Err(e) = fill_random(&mut b) {
        panic!("no random source (getrandom(2) and /dev/urandom failed: {e})");
    }
    u64::from_le_bytes(b)
}

/// SipHash-2-4 of `msg` under the 128-bit key `(k0, k1)` (Aumasson and Bernstein, "SipHash: a
/// fast short-input PRF", 2012): without the key its output cannot be predicted or inverted.
pub(crate) fn siphash24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let mut chunks = msg.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        compress(u64::from_le_bytes(w), &mut v);
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    last[7] = msg.len() as u8;
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
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
    fn random_values_differ_and_fill_everything() {
        let draws: std::collections::HashSet<u64> = (0..64).map(|_| random_u64()).collect();
        assert_eq!(draws.len(), 64, "64 draws of 64 bits do not collide");
        // A buffer longer than one getrandom(2) call may return is filled to its end.
        let mut big = vec![0u8; 1 << 20];
        fill_random(&mut big).unwrap();
        assert!(big[big.len() - 64..].iter().any(|&b| b != 0));
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
