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
}
