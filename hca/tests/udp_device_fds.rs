//! File descriptors of UDP devices (`hca::soft`): what a device costs
//! ([`UdpDeviceConfig::src_ports`] documents one descriptor per sending socket) and what
//! happens when the process runs out of them (`RLIMIT_NOFILE`, setrlimit(2)): a typed error
//! naming the cause, never a panic, and nothing left open or running after a failed open.
//!
//! Its own test binary: both tests count the process's descriptors (/proc/self/fd) and progress
//! threads (/proc/self/task), and one lowers the process-wide descriptor limit, so they take
//! turns on one lock and share the process with no other test.
#![cfg(all(feature = "std", target_os = "linux"))]
#![allow(unsafe_code)] // getrlimit(2), setrlimit(2), fcntl(2)

use std::net::IpAddr;
use std::sync::Mutex;

use hca::soft::{DeviceError, Progress, UdpDevice, UdpDeviceConfig};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The descriptor limit under which exactly `room` more descriptors can be opened: the limit
/// bounds descriptor numbers, and a new descriptor takes the lowest free number (open(2)), so
/// it counts the free numbers below it (fcntl(2) `F_GETFD` tells which are open without
/// opening one).
fn limit_for(room: u64) -> u64 {
    let mut free = 0;
    let mut n = 0;
    loop {
        // SAFETY: F_GETFD only reads the flags of descriptor `n`, or fails with EBADF.
        let open = unsafe { libc::fcntl(n as libc::c_int, libc::F_GETFD) } != -1;
        if !open {
            if free == room {
                return n;
            }
            free += 1;
        }
        n += 1;
    }
}

/// Progress threads of devices (named `soft-hca#N`) running in the process; other threads
/// (the test harness's) come and go.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("soft-hca"))
        .count()
}

fn config(addr: &str, src_ports: usize, progress: Progress) -> UdpDeviceConfig {
    let mut c = UdpDeviceConfig::new(addr.parse::<IpAddr>().unwrap());
    c.port = 0;
    c.src_ports = src_ports;
    c.progress = progress;
    c
}

/// Descriptors a device of `src_ports` sending sockets holds while open.
fn cost(addr: &str, src_ports: usize, progress: Progress) -> usize {
    let before = fds();
    let dev = UdpDevice::open(config(addr, src_ports, progress)).unwrap();
    assert_eq!(dev.src_ports().len(), src_ports.max(1));
    let open = fds() - before;
    drop(dev);
    assert_eq!(fds(), before, "a closed device left descriptors open");
    open
}

#[test]
fn each_source_port_costs_one_descriptor() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for addr in ["127.0.0.1", "::1"] {
        for progress in [Progress::Thread, Progress::Caller] {
            let base = cost(addr, 0, progress);
            for k in [1, 16, 64] {
                assert_eq!(
                    cost(addr, k, progress) - base,
                    k,
                    "{addr} {progress:?}: {k} sending sockets"
                );
            }
        }
    }
}

/// `RLIMIT_NOFILE` restored on drop, also when an assertion fails.
struct Limit(libc::rlimit);

impl Limit {
    fn get() -> Limit {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) writes one rlimit at a live pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        Limit(r)
    }

    fn set_soft(&self, cur: u64) {
        let r = libc::rlimit {
            rlim_cur: cur.min(self.0.rlim_max),
            rlim_max: self.0.rlim_max,
        };
        // SAFETY: setrlimit(2) reads one rlimit at a live pointer.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    }
}

impl Drop for Limit {
    fn drop(&mut self) {
        // SAFETY: as in set_soft.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

/// With room for 0, 1, 2, ... more descriptors, opening a device (16 sending sockets, a
/// progress thread) fails at each step of the open in turn, then succeeds: every failure is
/// `EMFILE` in a one-line typed error, and leaves no descriptor open and no thread running.
#[test]
fn running_out_of_descriptors_fails_cleanly_at_every_step() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for addr in ["127.0.0.1", "::1"] {
        let need = cost(addr, 16, Progress::Thread);
        let limit = Limit::get();
        // Rooms that failed, in order.
        let mut failed = Vec::new();
        let mut opened = 0u64;
        for room in 0..=need as u64 + 2 {
            let (fds0, threads0) = (fds(), threads());
            limit.set_soft(limit_for(room));
            let result = UdpDevice::open(config(addr, 16, Progress::Thread));
            limit.set_soft(u64::MAX);
            match result {
                Ok(dev) => {
                    opened += 1;
                    drop(dev);
                }
                Err(e) => {
                    failed.push(room);
                    let text = e.to_string();
                    assert!(
                        matches!(e, DeviceError::Link(_)),
                        "{addr}, room {room}: {e:?}"
                    );
                    assert!(text.contains("os error 24"), "{addr}, room {room}: {text}");
                    assert!(!text.contains('\n'), "{text}");
                }
            }
            assert_eq!(fds(), fds0, "{addr}, room {room}: descriptors left open");
            // The progress thread of a dropped device is joined before drop returns. A joined
            // thread's /proc/self/task entry can outlive the join by a moment (the kernel wakes
            // the joiner at the thread's exit_mm, before it releases the task), so the count is
            // read again, a bounded number of times, until it is back.
            let mut left = threads();
            for _ in 0..2000 {
                if left <= threads0 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                left = threads();
            }
            assert_eq!(left, threads0, "{addr}, room {room}: threads left running");
        }
        // Every room short of what the open needs fails (at each step: bound socket, each
        // sending socket, the poller's duplicate, the waker), then every one succeeds.
        let first_ok = failed.len() as u64;
        assert_eq!(failed, (0..first_ok).collect::<Vec<_>>(), "{addr}");
        assert!(first_ok == need as u64, "{addr}: {failed:?}, {need} held");
        assert_eq!(opened, need as u64 + 3 - first_ok, "{addr}");
    }
}
