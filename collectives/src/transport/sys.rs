//! The raw OS calls of the shared-memory transport, all in one place: futex wait/wake on words
//! of a shared mapping, POSIX shared-memory objects, and process liveness (pidfd).
//!
//! Every function here is a thin, safe wrapper: pointers it passes to the kernel come from
//! references that outlive the call.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout` (FUTEX_WAIT, shared: the word may be in a
/// mapping shared with other processes, so no FUTEX_PRIVATE_FLAG). Returns on wake, timeout,
/// signal, or at once when the word already differs; the caller re-checks its condition.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte aligned atomic for the duration of the call; `ts` is a
    // valid timespec on our stack. FUTEX_WAIT only reads the word. Errors (EAGAIN when the value
    // changed, ETIMEDOUT, EINTR) all mean "re-check", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            core::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread sleeping in [`futex_wait`] on `word` (FUTEX_WAKE, shared).
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned atomic; FUTEX_WAKE does not access memory through the
    // pointer beyond using its address as the key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            core::ptr::null::<libc::timespec>(),
            core::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn shm_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

/// `shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)`: a new POSIX shared-memory object.
pub(crate) fn shm_create(name: &str) -> io::Result<File> {
    let c = shm_name(name)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let fd = unsafe {
        libc::shm_open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600 as libc::mode_t,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `shm_open(name, O_RDWR, 0)`: an existing POSIX shared-memory object.
pub(crate) fn shm_open_existing(name: &str) -> io::Result<File> {
    let c = shm_name(name)?;
    // SAFETY: as in `shm_create`.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as in `shm_create`.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `shm_unlink(name)`.
pub(crate) fn shm_unlink(name: &str) -> io::Result<()> {
    let c = shm_name(name)?;
    // SAFETY: as in `shm_create`.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's id.
pub(crate) fn getpid() -> u32 {
    std::process::id()
}

/// How the liveness of a peer process is watched.
#[derive(Debug)]
pub(crate) enum Liveness {
    /// The peer is a thread of this process: it cannot die without us.
    SameProcess,
    /// A pidfd (Linux 5.3+): becomes readable when the process exits; immune to pid reuse.
    Pidfd { fd: OwnedFd, pid: u32 },
    /// Fallback where pidfd_open is unavailable: `kill(pid, 0)`.
    Pid { pid: u32 },
    /// Not watched: the peer runs on another host, or in another pid namespace (its pid means
    /// nothing here). Its death shows otherwise (the RoCE QP's retries).
    Unwatched,
}

impl Liveness {
    /// Starts watching `pid`.
    pub(crate) fn watch(pid: u32) -> Liveness {
        if pid == getpid() {
            return Liveness::SameProcess;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            Liveness::Pidfd { fd, pid }
        } else {
            Liveness::Pid { pid }
        }
    }

    /// The watched pid, if it is another process.
    pub(crate) fn pid(&self) -> Option<u32> {
        match *self {
            Liveness::SameProcess | Liveness::Unwatched => None,
            Liveness::Pidfd { pid, .. } | Liveness::Pid { pid } => Some(pid),
        }
    }

    /// Whether the process exists but is stopped (SIGSTOP, SIGTSTP, a debugger: state `T` or `t`
    /// in /proc/PID/stat, proc(5)): alive, but it answers nothing until continued.
    pub(crate) fn stopped(&self) -> bool {
        self.pid()
            .and_then(crate::bootstrap::host::process_state)
            .is_some_and(|s| matches!(s, 'T' | 't'))
    }

    /// Whether the process still runs.
    pub(crate) fn alive(&self) -> bool {
        match self {
            Liveness::SameProcess | Liveness::Unwatched => true,
            Liveness::Pidfd { fd, .. } => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd on our stack, zero timeout.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                !(n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0)
            }
            Liveness::Pid { pid } => {
                // SAFETY: signal 0 only checks for existence and permission.
                let r = unsafe { libc::kill(*pid as libc::pid_t, 0) };
                r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    /// A stopped process is alive but stopped; continued, it is no longer stopped; killed and
    /// reaped, it is gone (the RoCE transport reports the first as stopped, not as died).
    #[test]
    fn a_stopped_process_is_alive_and_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let l = Liveness::watch(pid);
        let signal = |sig: &str| {
            let ok = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .expect("run kill")
                .success();
            assert!(ok, "kill {sig} {pid}");
        };
        assert!(l.alive() && !l.stopped());
        signal("-STOP");
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while !l.stopped() {
            assert!(Instant::now() < deadline, "never seen stopped");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(l.alive());
        signal("-CONT");
        while l.stopped() {
            assert!(Instant::now() < deadline, "never seen continued");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        assert!(!l.alive() && !l.stopped());
    }

    #[test]
    fn futex_wait_returns_on_mismatch_and_times_out() {
        let w = AtomicU32::new(5);
        let t = Instant::now();
        futex_wait(&w, 4, Duration::from_secs(5));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "value differs: no sleep"
        );
        futex_wait(&w, 5, Duration::from_millis(1));
        w.store(6, Ordering::Relaxed);
        futex_wake(&w);
    }

    #[test]
    fn shm_create_open_unlink() {
        let name = format!("/coll-test-sys-{}", getpid());
        let f = shm_create(&name).unwrap();
        f.set_len(4096).unwrap();
        assert_eq!(
            shm_create(&name).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let g = shm_open_existing(&name).unwrap();
        assert_eq!(g.metadata().unwrap().len(), 4096);
        shm_unlink(&name).unwrap();
        assert!(shm_open_existing(&name).is_err());
    }

    #[test]
    fn liveness_of_self_and_of_an_exited_child() {
        assert!(Liveness::watch(getpid()).alive());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let l = Liveness::watch(child.id());
        child.wait().unwrap();
        assert!(!l.alive(), "reaped child is gone");
    }
}
