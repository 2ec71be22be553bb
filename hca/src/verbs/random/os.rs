//! The operating system's random source: getrandom(2), falling back to `/dev/urandom`.
#![allow(unsafe_code)]

use super::RandomSource;

/// The operating system's random source (getrandom(2) with no flags: blocks only until the
/// kernel's pool is first initialized, early at boot). A unit value: every call asks the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        os_fill(buf);
    }
}

/// Fills `buf` from getrandom(2), retrying on `EINTR` and short reads; where the system call is
/// missing (`ENOSYS`, kernels before 3.17) reads `/dev/urandom`.
///
/// # Panics
/// If the operating system offers no random source at all: keys and QPNs must never fall back to
/// something predictable.
pub fn os_fill(buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the whole call;
        // getrandom(2) writes at most that many bytes into it and returns how many it wrote.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n > 0 {
            done += n as usize;
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => {
                use std::io::Read;
                let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(rest));
                if let Err(e) = read {
                    panic!("no operating-system random source (getrandom(2), /dev/urandom): {e}");
                }
                return;
            }
        }
    }
}
