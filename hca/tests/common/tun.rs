//! A TUN device in a private network namespace, for tests that read what the kernel puts on the
//! wire (root only; the tests skip otherwise). Shared by `udp_device.rs` and `udp_link.rs`.

use std::time::Duration;

/// A TUN device (root only): reads the IP packets the host routes to it.
pub struct Tun {
    fd: std::os::fd::OwnedFd,
}

impl Tun {
    /// Opens TUN device `name` (no packet-info header); `None`, having said why, when it cannot.
    pub fn open(name: &str) -> Option<Tun> {
        use std::os::fd::FromRawFd;
        // SAFETY: open(2) of a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            eprintln!("skipped: /dev/net/tun: {}", std::io::Error::last_os_error());
            return None;
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // struct ifreq: 16-byte name, then the flags (short) in the union.
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as i16;
        ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq (40 bytes) at the pointer given.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::TUNSETIFF as _,
                ifr.as_mut_ptr(),
            )
        };
        if rc < 0 {
            eprintln!("skipped: TUNSETIFF: {}", std::io::Error::last_os_error());
            return None;
        }
        Some(Tun { fd })
    }

    /// The next IPv4 UDP packet the device carries, IP header on (others skipped); `None` after
    /// `wait`.
    pub fn next_udp(&self, wait: Duration) -> Option<Vec<u8>> {
        use std::os::fd::AsRawFd;
        let deadline = std::time::Instant::now() + wait;
        let mut buf = vec![0u8; 65536];
        while std::time::Instant::now() < deadline {
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            // SAFETY: buf is a live buffer of buf.len() bytes.
            let n = unsafe { libc::read(pfd.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 28 && buf[0] >> 4 == 4 && buf[9] == 17 {
                return Some(buf[..n as usize].to_vec());
            }
        }
        None
    }
}

/// Runs `f` with a TUN device `name` holding `addr_cidr`, in a private network namespace of a
/// thread of its own (root only; otherwise, or when the namespace or the device cannot be set up,
/// prints why and skips).
pub fn in_tun_namespace(
    name: &'static str,
    addr_cidr: &'static str,
    f: impl FnOnce(Tun) + Send + 'static,
) {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
        eprintln!("skipped: needs root and /dev/net/tun");
        return;
    }
    std::thread::spawn(move || {
        // SAFETY: unshare(2) of this thread's network namespace; no pointers.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: unshare: {}", std::io::Error::last_os_error());
            return;
        }
        let Some(tun) = Tun::open(name) else {
            return;
        };
        let ok = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !(ok(&["addr", "add", addr_cidr, "dev", name]) && ok(&["link", "set", name, "up"])) {
            eprintln!("skipped: cannot configure the TUN device");
            return;
        }
        f(tun)
    })
    .join()
    .unwrap();
}
