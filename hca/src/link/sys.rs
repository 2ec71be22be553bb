//! The raw libc calls of the links: every `unsafe` block of [`crate::link`] lives here.
//!
//! Each function wraps one system call behind a safe signature: the arguments are Rust slices and
//! values, the `msghdr` / `iovec` / `sockaddr` structures the kernel reads are built on the stack
//! inside the call from those borrows, and errors come back as [`io::Error`] (errno kept). Nothing
//! here decides policy (which options, what to do on an error); `udp.rs`, `oob` and `wake.rs` do.
//!
//! Sources: socket(2), setsockopt(2) / getsockopt(2), bind(2), listen(2), getsockname(2),
//! recvmmsg(2), sendmmsg(2), poll(2), eventfd(2), read(2), write(2), getrandom(2), getifaddrs(3);
//! the option semantics in udp(7), ip(7) and ipv6(7).
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Most messages one [`recv_batch`] or [`send_batch`] call hands the kernel (the `vlen` of
/// recvmmsg(2) / sendmmsg(2), which the kernel caps at `UIO_MAXIOV` = 1024).
pub(crate) const MAX_BATCH: usize = 256;

/// Most `iovec`s one [`send_batch`] call passes in all its messages together (`UIO_MAXIOV`, the
/// kernel's limit per message, `include/uapi/linux/uio.h`).
pub(crate) const MAX_IOV: usize = 1024;

/// `SO_RXQ_OVFL` (socket(7)): ask for a control message carrying the socket's count of datagrams
/// dropped for lack of receive-buffer room. The `libc` crate does not export it for glibc targets;
/// the value is the uapi one (`include/uapi/asm-generic/socket.h`: 40, also on alpha and mips;
/// sparc and parisc number it differently and go without).
pub(crate) const SO_RXQ_OVFL: Option<libc::c_int> =
    if cfg!(any(target_arch = "sparc", target_arch = "sparc64")) {
        None
    } else {
        Some(40)
    };

/// Bytes of a socket address buffer: a `struct sockaddr_in6` (28), which also holds a
/// `struct sockaddr_in` (16).
const SOCKADDR_LEN: usize = mem::size_of::<libc::sockaddr_in6>();

/// A socket address in its kernel layout (`struct sockaddr_in` or `struct sockaddr_in6`, ip(7),
/// ipv6(7)), kept as bytes so that safe code can build and read it.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(4))]
pub(crate) struct SockAddrBuf {
    bytes: [u8; SOCKADDR_LEN],
    /// Bytes of `bytes` in use (the `socklen_t`).
    len: u32,
}

impl SockAddrBuf {
    /// An empty buffer for the kernel to fill (length = the whole buffer).
    pub(crate) const fn empty() -> SockAddrBuf {
        SockAddrBuf {
            bytes: [0; SOCKADDR_LEN],
            len: SOCKADDR_LEN as u32,
        }
    }

    /// The kernel layout of `addr`: family (native order), port and address (network order),
    /// IPv6 flow information and scope id.
    pub(crate) fn new(addr: &SocketAddr) -> SockAddrBuf {
        let mut buf = SockAddrBuf::empty();
        match addr {
            SocketAddr::V4(a) => {
                buf.bytes[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                buf.bytes[2..4].copy_from_slice(&a.port().to_be_bytes());
                buf.bytes[4..8].copy_from_slice(&a.ip().octets());
                buf.len = mem::size_of::<libc::sockaddr_in>() as u32;
            }
            SocketAddr::V6(a) => {
                buf.bytes[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                buf.bytes[2..4].copy_from_slice(&a.port().to_be_bytes());
                buf.bytes[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                buf.bytes[8..24].copy_from_slice(&a.ip().octets());
                buf.bytes[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
                buf.len = SOCKADDR_LEN as u32;
            }
        }
        buf
    }

    /// The address the kernel wrote, or `None` for a family other than `AF_INET` / `AF_INET6` or a
    /// length too short for it.
    pub(crate) fn socket_addr(&self) -> Option<SocketAddr> {
        let b = &self.bytes;
        let family = u16::from_ne_bytes([b[0], b[1]]);
        let port = u16::from_be_bytes([b[2], b[3]]);
        let len = self.len as usize;
        if family == libc::AF_INET as u16 && len >= mem::size_of::<libc::sockaddr_in>() {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        } else if family == libc::AF_INET6 as u16 && len >= SOCKADDR_LEN {
            let flowinfo = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flowinfo,
                scope,
            )))
        } else {
            None
        }
    }
}

/// The last OS error (errno) as an [`io::Error`].
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// A non-blocking, close-on-exec UDP socket of the family of `ipv6` (socket(2) with
/// `SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC`).
pub(crate) fn udp_socket(ipv6: bool) -> io::Result<OwnedFd> {
    let domain = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) takes only integers and returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just returned by socket(2), is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A blocking, close-on-exec TCP socket of the family of `ipv6` (socket(2) with
/// `SOCK_STREAM | SOCK_CLOEXEC`), not yet bound.
#[cfg_attr(not(feature = "tools"), allow(dead_code))] // used by the tools only
pub(crate) fn tcp_socket(ipv6: bool) -> io::Result<OwnedFd> {
    let domain = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) takes only integers and returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_TCP,
        )
    };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just returned by socket(2), is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// listen(2) with a queue of `backlog` connections.
#[cfg_attr(not(feature = "tools"), allow(dead_code))] // used by the tools only
pub(crate) fn listen(fd: BorrowedFd<'_>, backlog: libc::c_int) -> io::Result<()> {
    // SAFETY: listen(2) takes only integers.
    let rc = unsafe { libc::listen(fd.as_raw_fd(), backlog) };
    if rc < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// setsockopt(2) of an `int` option.
pub(crate) fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value points at a live `c_int` whose size is passed as the length; the
    // kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// getsockopt(2) of an `int` option.
pub(crate) fn get_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len point at live locals; len says how many bytes value holds.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        Err(last_error())
    } else {
        Ok(value)
    }
}

/// bind(2) to `addr`.
pub(crate) fn bind(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    let buf = SockAddrBuf::new(addr);
    // SAFETY: buf holds a sockaddr_in / sockaddr_in6 of `buf.len` bytes, alive for the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            buf.bytes.as_ptr().cast(),
            buf.len as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// getsockname(2): the address the socket is bound to.
pub(crate) fn local_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    let mut buf = SockAddrBuf::empty();
    let mut len = SOCKADDR_LEN as libc::socklen_t;
    // SAFETY: buf.bytes has room for `len` bytes; the kernel writes at most that and updates len.
    let rc = unsafe { libc::getsockname(fd.as_raw_fd(), buf.bytes.as_mut_ptr().cast(), &mut len) };
    if rc < 0 {
        return Err(last_error());
    }
    buf.len = len;
    buf.socket_addr()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket address"))
}

/// What the kernel reported for one received message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecvResult {
    /// Bytes of payload received (`msg_len`; with `MSG_TRUNC`, the datagram's full length).
    pub(crate) len: usize,
    /// `msg_flags` (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub(crate) flags: libc::c_int,
    /// Bytes of control messages written (`msg_controllen`).
    pub(crate) control_len: usize,
}

/// recvmmsg(2) (recvmsg(2) for one slot) without blocking: receives up to `results.len()`
/// datagrams (at most [`MAX_BATCH`]), datagram `i` into `payload[i * slot_len ..][.. slot_len]`, its source address
/// into `names[i]` and its control messages into `control[i]`. Returns how many arrived; `Ok(0)`
/// when none was waiting (`EAGAIN`).
pub(crate) fn recv_batch<const C: usize>(
    fd: BorrowedFd<'_>,
    payload: &mut [u8],
    slot_len: usize,
    names: &mut [SockAddrBuf],
    control: &mut [[u8; C]],
    results: &mut [RecvResult],
) -> io::Result<usize> {
    let n = results
        .len()
        .min(names.len())
        .min(control.len())
        .min(MAX_BATCH)
        .min(payload.len().checked_div(slot_len).unwrap_or(0));
    if n == 0 {
        return Ok(0);
    }
    let mut iov: [MaybeUninit<libc::iovec>; MAX_BATCH] =
        [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] =
        [const { MaybeUninit::uninit() }; MAX_BATCH];
    let base = payload.as_mut_ptr();
    for i in 0..n {
        let iov_i = iov[i].write(libc::iovec {
            // i * slot_len + slot_len <= payload.len(), checked above through n.
            iov_base: base.wrapping_add(i * slot_len).cast(),
            iov_len: slot_len,
        });
        names[i] = SockAddrBuf::empty();
        // SAFETY: an all-zero mmsghdr is a valid value (null pointers, zero lengths).
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = names[i].bytes.as_mut_ptr().cast();
        h.msg_hdr.msg_namelen = SOCKADDR_LEN as libc::socklen_t;
        h.msg_hdr.msg_iov = iov_i;
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = control[i].as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = C as _;
        hdrs[i].write(h);
    }
    let rc = loop {
        let rc = if n == 1 {
            // One slot: recvmsg(2), which costs less than recvmmsg(2) for one message (a
            // caller polling an idle socket makes this call most).
            // SAFETY: hdrs[0] is initialized (n == 1) and its msg_hdr points at a live name
            // buffer of SOCKADDR_LEN bytes, one iovec over `payload`'s first slot_len bytes and
            // a live control buffer of C bytes, borrowed mutably for this call; the kernel writes
            // only within those lengths and updates the lengths and flags in msg_hdr.
            let (h, got) = unsafe {
                let h = hdrs[0].assume_init_mut();
                let got = libc::recvmsg(fd.as_raw_fd(), &mut h.msg_hdr, libc::MSG_DONTWAIT);
                (h, got)
            };
            if got >= 0 {
                h.msg_len = got as libc::c_uint;
                1
            } else {
                got as libc::c_int
            }
        } else {
            // SAFETY: the first n entries of hdrs are initialized; each points at a live name
            // buffer of SOCKADDR_LEN bytes, one iovec covering a disjoint slot_len-byte slot of
            // `payload`, and a live control buffer of C bytes, all borrowed mutably for this
            // call. The kernel writes only within those lengths. A null timeout with
            // MSG_DONTWAIT never blocks.
            unsafe {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    hdrs.as_mut_ptr().cast(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        if rc < 0 {
            let err = last_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        }
        break rc as usize;
    };
    #[allow(clippy::unnecessary_cast)] // msg_controllen is a socklen_t on musl
    for i in 0..rc.min(n) {
        // SAFETY: entry i < n was initialized above; the kernel only updated its fields.
        let h = unsafe { hdrs[i].assume_init_ref() };
        names[i].len = h.msg_hdr.msg_namelen;
        results[i] = RecvResult {
            len: h.msg_len as usize,
            flags: h.msg_hdr.msg_flags,
            control_len: (h.msg_hdr.msg_controllen as usize).min(C),
        };
    }
    Ok(rc.min(n))
}

/// One message of a [`send_batch`]: the datagrams `first .. first + count` of the batch, their
/// parts gathered in order into one UDP payload (one datagram, or a GSO train when the control
/// messages carry `UDP_SEGMENT`), sent to `name` with `control[..control_len]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MsgPlan<const C: usize> {
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) name: SockAddrBuf,
    pub(crate) control: [u8; C],
    pub(crate) control_len: usize,
}

/// sendmmsg(2) without blocking: sends the messages of `plans` (at most [`MAX_BATCH`], and at
/// most [`MAX_IOV`] parts in all; the rest are not tried), message `m` gathering the parts
/// `parts(d)` of datagrams `d` in `plans[m].first ..`. Returns how many messages the kernel took;
/// `Ok(0)` when the socket buffer is full (`EAGAIN`, `ENOBUFS`). An error means the first message
/// failed.
pub(crate) fn send_batch<'a, const C: usize>(
    fd: BorrowedFd<'_>,
    plans: &[MsgPlan<C>],
    parts: impl Fn(usize) -> &'a [IoSlice<'a>],
) -> io::Result<usize> {
    let mut iov: [MaybeUninit<libc::iovec>; MAX_IOV] = [const { MaybeUninit::uninit() }; MAX_IOV];
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] =
        [const { MaybeUninit::uninit() }; MAX_BATCH];
    // Ranges of `iov` per message, filled first: `iov` must not move once pointers are taken.
    // Uninitialized, as `iov` and `hdrs`: zeroing 256 entries (4 KiB) cost more than a whole
    // one-datagram send's preparation (a memset per sendmmsg(2), issue 21).
    let mut ranges: [MaybeUninit<(usize, usize)>; MAX_BATCH] =
        [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut used = 0usize;
    let mut n = 0usize;
    'plans: for plan in plans.iter().take(MAX_BATCH) {
        let start = used;
        for d in plan.first..plan.first + plan.count {
            for part in parts(d) {
                if used == MAX_IOV {
                    break 'plans;
                }
                iov[used].write(libc::iovec {
                    iov_base: part.as_ptr() as *mut libc::c_void,
                    iov_len: part.len(),
                });
                used += 1;
            }
        }
        ranges[n].write((start, used - start));
        n += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    let iov_base = iov.as_mut_ptr();
    for (i, plan) in plans.iter().take(n).enumerate() {
        // SAFETY: an all-zero mmsghdr is a valid value (null pointers, zero lengths).
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        // SAFETY: entries 0 .. n of `ranges` were written in the loop above (i < n).
        let (first, len) = unsafe { ranges[i].assume_init() };
        h.msg_hdr.msg_name = plan.name.bytes.as_ptr() as *mut libc::c_void;
        h.msg_hdr.msg_namelen = plan.name.len as libc::socklen_t;
        h.msg_hdr.msg_iov = iov_base.wrapping_add(first).cast();
        h.msg_hdr.msg_iovlen = len as _;
        if plan.control_len > 0 {
            h.msg_hdr.msg_control = plan.control.as_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = plan.control_len.min(C) as _;
        }
        hdrs[i].write(h);
    }
    loop {
        // SAFETY: the first n headers are initialized; each names a live SockAddrBuf and control
        // buffer inside `plans` (borrowed for the call) and a range of initialized iovecs of
        // `iov` (a local that does not move during the call), each of which points at a part
        // slice borrowed for 'a, which outlives the call. The kernel only reads those buffers and
        // writes msg_len.
        let rc = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr().cast(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            let err = last_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if err.kind() == io::ErrorKind::WouldBlock || err.raw_os_error() == Some(libc::ENOBUFS)
            {
                return Ok(0);
            }
            return Err(err);
        }
        return Ok(rc as usize);
    }
}

/// ppoll(2) on `fds` (fd, events) for at most `timeout` (nanosecond resolution, plus the kernel's
/// timer slack; capped at `i32::MAX` seconds); returns the `revents` of each in order. `EINTR`
/// returns all-zero revents.
pub(crate) fn poll<const N: usize>(
    fds: [(BorrowedFd<'_>, libc::c_short); N],
    timeout: Duration,
) -> io::Result<[libc::c_short; N]> {
    let mut pfds = fds.map(|(fd, events)| libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    });
    poll_slice(&mut pfds, timeout)?;
    Ok(pfds.map(|p| p.revents))
}

/// ppoll(2) on a caller-built `pollfd` array of any length (each entry's `fd` a descriptor the
/// caller keeps open for the call); the kernel fills each `revents`. Timeout as [`poll`];
/// `EINTR` leaves every `revents` zero.
pub(crate) fn poll_slice(pfds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    for p in pfds.iter_mut() {
        p.revents = 0;
    }
    // ppoll(2) takes the timeout in nanoseconds (poll(2) would round a 20 us timer up to 1 ms);
    // the kernel still adds the thread's timer slack (prctl(2) PR_SET_TIMERSLACK, 50 us by
    // default).
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: pfds is a live, exclusively borrowed slice of pfds.len() pollfd entries; the
    // kernel writes only their revents. `ts` is a valid timespec read by the kernel; a null
    // signal mask leaves the mask alone, as poll(2) does.
    let rc = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let err = last_error();
        if err.kind() == io::ErrorKind::Interrupted {
            for p in pfds.iter_mut() {
                p.revents = 0;
            }
            return Ok(());
        }
        return Err(err);
    }
    Ok(())
}

/// eventfd(2) with count 0, non-blocking and close-on-exec.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) takes only integers and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` was just returned by eventfd(2), is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `value` to an eventfd counter (write(2) of 8 bytes). A full counter (`EAGAIN`) is
/// success: the reader is woken anyway.
pub(crate) fn eventfd_add(fd: BorrowedFd<'_>, value: u64) -> io::Result<()> {
    let bytes = value.to_ne_bytes();
    loop {
        // SAFETY: bytes is a live 8-byte buffer; write(2) only reads it.
        let rc = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        if rc < 0 {
            let err = last_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(()),
                _ => return Err(err),
            }
        }
        return Ok(());
    }
}

/// Reads and resets an eventfd counter (read(2) of 8 bytes); `Ok(0)` when it was already zero.
pub(crate) fn eventfd_take(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    loop {
        // SAFETY: bytes is a live 8-byte buffer the kernel writes at most 8 bytes into.
        let rc = unsafe { libc::read(fd.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len()) };
        if rc < 0 {
            let err = last_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        }
        return Ok(u64::from_ne_bytes(bytes));
    }
}

/// getifaddrs(3): the name of the interface that holds the IPv4 address `ip` (`None` when none
/// does).
pub(crate) fn ipv4_interface(ip: Ipv4Addr) -> io::Result<Option<String>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a live out-pointer; on success the list it receives is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } < 0 {
        return Err(last_error());
    }
    let want = u32::from(ip).to_be();
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs(3) returned, not freed until below.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-null ifa_addr points at a socket address that starts with its family.
        let family = (!ifa.ifa_addr.is_null()).then(|| unsafe { (*ifa.ifa_addr).sa_family });
        if family == Some(libc::AF_INET as libc::sa_family_t) && !ifa.ifa_name.is_null() {
            // SAFETY: an AF_INET address of getifaddrs(3) is a whole `struct sockaddr_in`.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            if sin.sin_addr.s_addr == want {
                // SAFETY: ifa_name is a NUL-terminated string that lives as long as the list; it
                // is copied out before the list is freed.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                found = Some(name.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs(3), is freed once, and nothing borrowed from it is left.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// setsockopt(2) `SO_ATTACH_REUSEPORT_CBPF` (socket(7)): attaches the classic-BPF `program` to
/// the reuseport group of `fd`; the kernel copies it.
pub(crate) fn attach_reuseport_cbpf(
    fd: BorrowedFd<'_>,
    program: &[libc::sock_filter],
) -> io::Result<()> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        // The kernel only reads the program.
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, alive for the call; the kernel reads `len` entries.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `name` as an abstract Unix socket address (unix(7): a leading NUL byte, then `name`) and its
/// length; `InvalidInput` when `name` is longer than 107 bytes.
fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { mem::zeroed() };
    if name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

/// A fresh non-blocking, close-on-exec Unix socket of `kind` (`SOCK_DGRAM`, `SOCK_STREAM`).
fn unix_socket(kind: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A non-blocking Unix socket of `kind` on which `op` (bind(2) or connect(2)) took the
/// abstract name `name`; `op`'s error.
fn abstract_unix(
    name: &[u8],
    kind: libc::c_int,
    op: unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int,
) -> io::Result<OwnedFd> {
    let (addr, len) = abstract_addr(name)?;
    let fd = unix_socket(kind)?;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    let rc = unsafe {
        op(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(fd)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A non-blocking `SOCK_DGRAM` Unix socket bound to the abstract name `name` (unix(7): a leading NUL byte,
/// then `name`; released by the kernel when the socket closes). `AddrInUse` when another socket
/// holds it; `InvalidInput` when `name` is longer than 107 bytes.
pub(crate) fn bind_abstract_unix(name: &[u8]) -> io::Result<OwnedFd> {
    abstract_unix(name, libc::SOCK_DGRAM, libc::bind)
}

/// A non-blocking `SOCK_DGRAM` Unix socket connected to the abstract name `name` (connect(2),
/// unix(7)): `ConnectionRefused` when nobody holds the name. While the receiver's queue is full
/// (`net.unix.max_dgram_qlen`) sends fail with `WouldBlock` and poll(2) / epoll(7) report the
/// socket writable again once it has room (the kernel's `unix_dgram_peer_wake_me`).
pub(crate) fn connect_abstract_unix(name: &[u8]) -> io::Result<OwnedFd> {
    abstract_unix(name, libc::SOCK_DGRAM, libc::connect)
}

/// A non-blocking `SOCK_STREAM` Unix socket bound to the abstract name `name` and listening
/// with `backlog` (listen(2), unix(7)): the kernel records the caller's credentials, which a
/// process that connects reads with [`peer_uid`]. `AddrInUse` when another socket holds it.
pub(crate) fn listen_abstract_unix(name: &[u8], backlog: libc::c_int) -> io::Result<OwnedFd> {
    let fd = abstract_unix(name, libc::SOCK_STREAM, libc::bind)?;
    listen(std::os::fd::AsFd::as_fd(&fd), backlog)?;
    Ok(fd)
}

/// A non-blocking `SOCK_STREAM` Unix socket connected to the listener holding the abstract name
/// `name`: `ConnectionRefused` when nobody holds it, `WouldBlock` when its backlog is full
/// (unix(7), connect(2)).
pub(crate) fn connect_abstract_stream(name: &[u8]) -> io::Result<OwnedFd> {
    abstract_unix(name, libc::SOCK_STREAM, libc::connect)
}

/// The user ID of the process that made the listener a connected Unix stream socket `fd` reached
/// (`SO_PEERCRED`, unix(7): the credentials in effect at its listen(2), supplied by the kernel).
pub(crate) fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// `SOCK_DIAG_BY_FAMILY` (include/uapi/linux/sock_diag.h): the netlink message type of a
/// sock_diag request.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `unix_diag_req.udiag_show` bits and `UNIX_DIAG_*` attribute types
/// (include/uapi/linux/unix_diag.h).
const UDIAG_SHOW_NAME: u32 = 0x01;
const UDIAG_SHOW_PEER: u32 = 0x04;
const UDIAG_SHOW_UID: u32 = 0x40;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_UID: u16 = 7;

/// What the kernel's unix_diag (sock_diag(7)) reports of one Unix socket.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct UnixDiag {
    /// The inode of the socket it is connected to (`UNIX_DIAG_PEER`).
    pub peer: Option<u32>,
    /// The user ID that created it (`UNIX_DIAG_UID`: the socket's `sk_uid`, the creator's
    /// filesystem user ID at socket(2)).
    pub uid: Option<u32>,
    /// The address it is bound to (`UNIX_DIAG_NAME`: `sun_path` bytes, a leading NUL for an
    /// abstract name).
    pub name: Option<Vec<u8>>,
}

/// Asks the kernel (a `NETLINK_SOCK_DIAG` request for `AF_UNIX`, sock_diag(7)) about the Unix
/// socket of inode `ino`: `show` is a set of `UDIAG_SHOW_*` bits. Errors: the netlink errno
/// (`NotFound` when no socket has that inode, e.g. it has closed), `InvalidData` for a reply
/// that does not parse. Never blocks: the kernel queues the answer during sendto(2).
fn unix_diag(ino: u32, show: u32) -> io::Result<UnixDiag> {
    let nl = diag_socket()?;
    // struct nlmsghdr (16 bytes) + struct unix_diag_req (24 bytes), native endian.
    let mut req = [0u8; 40];
    req[0..4].copy_from_slice(&40u32.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence number
    req[16] = libc::AF_UNIX as u8; // sdiag_family; sdiag_protocol 0, pad 0
    req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes()); // udiag_states: all
    req[24..28].copy_from_slice(&ino.to_ne_bytes());
    req[28..32].copy_from_slice(&show.to_ne_bytes());
    req[32..40].copy_from_slice(&[0xff; 8]); // udiag_cookie: INET_DIAG_NOCOOKIE
                                             // SAFETY: `req` is live for the call; the kernel only reads it.
    let rc = unsafe { libc::send(nl.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // u32 words: aligned for the headers read below.
    let mut buf = [0u32; 1024];
    // SAFETY: `buf` is writable for its size in bytes.
    let n = unsafe {
        libc::recv(
            nl.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            mem::size_of_val(&buf),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: u32 words viewed as the bytes they are; `n` <= their size.
    let b: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n as usize) };
    parse_unix_diag(b)
}

/// A `NETLINK_SOCK_DIAG` socket connected to the kernel (port ID 0). Connected, it takes
/// messages from the kernel only: netlink(7) lets any process send unicast to any port ID
/// without privilege, and the kernel refuses another sender's message to a connected socket
/// (`ECONNREFUSED`, net/netlink/af_netlink.c `netlink_getsockbyportid`), so no stranger can
/// slip a forged unix_diag reply (another UID, another name) ahead of the kernel's.
fn diag_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let nl = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_nl is plain data; all zeroes is valid (pid 0: the kernel).
    let mut kernel: libc::sockaddr_nl = unsafe { mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `kernel` is live for the call; the kernel only reads it.
    let rc = unsafe {
        libc::connect(
            nl.as_raw_fd(),
            (&kernel as *const libc::sockaddr_nl).cast(),
            mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(nl)
}

/// Parses the first netlink message of a unix_diag reply (`NLMSG_ERROR` becomes its errno).
fn parse_unix_diag(b: &[u8]) -> io::Result<UnixDiag> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed unix_diag reply");
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let len = word(b, 0).ok_or_else(bad)? as usize;
    let msg = b.get(16..len).ok_or_else(bad)?;
    let kind = u16::from_ne_bytes([b[4], b[5]]);
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = word(msg, 0).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(
            errno.checked_neg().ok_or_else(bad)?,
        ));
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(bad());
    }
    // struct unix_diag_msg (16 bytes), then rtattrs aligned to 4.
    let mut at = 16;
    let mut out = UnixDiag::default();
    while at + 4 <= msg.len() {
        let alen = u16::from_ne_bytes([msg[at], msg[at + 1]]) as usize;
        let atype = u16::from_ne_bytes([msg[at + 2], msg[at + 3]]) & 0x3fff;
        if alen < 4 {
            return Err(bad());
        }
        let data = msg.get(at + 4..at + alen).ok_or_else(bad)?;
        match atype {
            UNIX_DIAG_PEER => out.peer = word(data, 0),
            UNIX_DIAG_UID => out.uid = word(data, 0),
            UNIX_DIAG_NAME => out.name = Some(data.to_vec()),
            _ => {}
        }
        at += (alen + 3) & !3;
    }
    Ok(out)
}

/// The user ID that created the Unix socket that connected socket `fd` sends to, and the name
/// it is bound to (a leading NUL for an abstract name): two unix_diag requests (sock_diag(7),
/// `UDIAG_SHOW_PEER` on `fd`'s inode from fstat(2), then `UDIAG_SHOW_UID` | `UDIAG_SHOW_NAME`
/// on the peer's). A datagram socket's `SO_PEERCRED` is empty (the kernel sets it for stream
/// and seqpacket connections only), hence the diag. Errors: `NotConnected` when `fd` has no
/// peer, the diag errors of [`unix_diag`] (`NotFound`: the peer has closed).
pub(crate) fn unix_peer_owner(fd: BorrowedFd<'_>) -> io::Result<(u32, Vec<u8>)> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { mem::zeroed() };
    // SAFETY: `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let peer = unix_diag(st.st_ino as u32, UDIAG_SHOW_PEER)?
        .peer
        .filter(|&p| p != 0)
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
    let d = unix_diag(peer, UDIAG_SHOW_UID | UDIAG_SHOW_NAME)?;
    let no = |what| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unix_diag gave no {what}"),
        )
    };
    Ok((
        d.uid.ok_or_else(|| no("UID"))?,
        d.name.ok_or_else(|| no("name"))?,
    ))
}

/// Accepts (accept4(2), non-blocking) and closes at most `max` pending connections of listener
/// `fd`; how many.
pub(crate) fn accept_and_close(fd: BorrowedFd<'_>, max: usize) -> usize {
    let mut n = 0;
    while n < max {
        // SAFETY: accept4 with null address pointers.
        let raw = unsafe {
            libc::accept4(
                fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if raw < 0 {
            break;
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns; dropping closes it.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        n += 1;
    }
    n
}

/// sendmsg(2) of one datagram made of `parts` (at most 4) on the connected Unix datagram socket
/// `fd`, without blocking: `WouldBlock` when the receiver's queue is full, `ConnectionRefused`
/// when the receiver has closed.
pub(crate) fn send_parts(fd: BorrowedFd<'_>, parts: &[&[u8]]) -> io::Result<()> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 4];
    if parts.len() > iov.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many parts",
        ));
    }
    for (v, p) in iov.iter_mut().zip(parts) {
        v.iov_base = p.as_ptr().cast_mut().cast();
        v.iov_len = p.len();
    }
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = parts.len() as _;
    // SAFETY: `iov` points at live borrowed bytes; the kernel only reads them.
    let rc = unsafe {
        libc::sendmsg(
            fd.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// recvmsg(2) of one datagram into `buf` without blocking, on a Unix socket with `SO_PASSCRED`
/// set (unix(7)): its length (`MSG_TRUNC`: the full length, which may exceed `buf`) and the
/// sender's user ID from the kernel's `SCM_CREDENTIALS` message (`None` if none came), or
/// `WouldBlock` when none waits.
pub(crate) fn recv_with_uid(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Option<u32>)> {
    // u64 words: aligned for cmsghdr; room for one ucred message.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, live and writable.
    let rc = unsafe {
        libc::recvmsg(
            fd.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut uid = None;
    // SAFETY: the CMSG_* walk stays within `control`, as the kernel filled it in `msg`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(mem::size_of::<libc::ucred>() as u32) as usize
            {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>());
                uid = Some(cred.uid);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((rc as usize, uid))
}

/// The calling process's effective user ID (geteuid(2); it cannot fail).
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A close-on-exec epoll instance (epoll_create1(2)).
pub(crate) fn epoll_new() -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1(2).
    let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// epoll_ctl(2): `op` (`EPOLL_CTL_ADD` / `MOD` / `DEL`) `fd` in `epoll` for `events`
/// (level-triggered), tagged `data`.
pub(crate) fn epoll_ctl(
    epoll: BorrowedFd<'_>,
    op: libc::c_int,
    fd: BorrowedFd<'_>,
    events: u32,
    data: u64,
) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: `ev` is a valid epoll_event, alive for the call.
    let rc = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Test helper: a child process (fork(2)) takes user ID `uid` (setuid(2), needs root) and
/// sends `datagram` to the abstract Unix name `name`; whether it succeeded.
#[cfg(test)]
pub(crate) fn send_as_user(uid: u32, name: &[u8], datagram: &[u8]) -> bool {
    // SAFETY: the child only makes system calls (setuid, socket, connect, sendmsg) on memory
    // prepared before fork(2), then _exit(2)s; the parent reaps it.
    unsafe {
        let child = libc::fork();
        if child < 0 {
            return false;
        }
        if child == 0 {
            let ok = libc::setuid(uid) == 0
                && connect_abstract_unix(name)
                    .and_then(|fd| send_parts(std::os::fd::AsFd::as_fd(&fd), &[datagram]))
                    .is_ok();
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        libc::waitpid(child, &mut status, 0) == child
            && libc::WIFEXITED(status)
            && libc::WEXITSTATUS(status) == 0
    }
}

/// Test helper: a child process (fork(2)) that took user ID `uid` (setuid(2), needs root) and
/// holds the abstract Unix names `names` (`true`: a listening stream socket, `false`: a bound
/// datagram socket) until the returned value is dropped (SIGKILL, then reaped); `None` if the
/// child could not take them.
#[cfg(test)]
pub(crate) fn hold_as_user(uid: u32, names: &[(String, bool)]) -> Option<HeldByUser> {
    let names: Vec<(Vec<u8>, bool)> = names
        .iter()
        .map(|(n, s)| (n.as_bytes().to_vec(), *s))
        .collect();
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: `pipe` has room for two descriptors. The child only makes system calls (setuid,
    // socket, bind, listen, write, pause) on memory prepared before fork(2), then waits to be
    // killed; the parent reaps it.
    unsafe {
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return None;
        }
        let child = libc::fork();
        if child < 0 {
            return None;
        }
        if child == 0 {
            let mut ok = libc::setuid(uid) == 0;
            let mut held = Vec::new();
            for (n, stream) in &names {
                let r = if *stream {
                    listen_abstract_unix(n, 8)
                } else {
                    bind_abstract_unix(n)
                };
                match r {
                    Ok(fd) => held.push(fd),
                    Err(_) => ok = false,
                }
            }
            let b = [u8::from(ok)];
            libc::write(pipe[1], b.as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
        libc::close(pipe[1]);
        let mut b = [0u8; 1];
        let n = libc::read(pipe[0], b.as_mut_ptr().cast(), 1);
        libc::close(pipe[0]);
        let held = HeldByUser { child };
        (n == 1 && b[0] == 1).then_some(held)
    }
}

/// Test helper: a child process (fork(2)) that took user ID `uid` (setuid(2), needs root) and
/// bound a Unix datagram socket to the abstract name `name`, as a stranger would bind a free
/// slot's name; [`Stranger::received`] tells how many datagrams reached it. `None` if the child
/// could not take the name.
#[cfg(test)]
pub(crate) fn bind_as_user(uid: u32, name: &[u8]) -> Option<Stranger> {
    let name = name.to_vec();
    let (mut up, mut down) = ([0 as libc::c_int; 2], [0 as libc::c_int; 2]);
    // SAFETY: the arrays have room for two descriptors each. The child only makes system calls
    // (setuid, socket, bind, read, recv, write) on memory prepared before fork(2), then
    // _exit(2)s; the parent reaps it (or kills it on drop).
    unsafe {
        if libc::pipe2(up.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return None;
        }
        if libc::pipe2(down.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            libc::close(up[0]);
            libc::close(up[1]);
            return None;
        }
        let child = libc::fork();
        if child < 0 {
            return None;
        }
        if child == 0 {
            let fd = if libc::setuid(uid) == 0 {
                bind_abstract_unix(&name).ok()
            } else {
                None
            };
            let ok = [u8::from(fd.is_some())];
            libc::write(up[1], ok.as_ptr().cast(), 1);
            // Wait for the parent's word (or its end), then count what arrived.
            let mut b = [0u8; 1];
            libc::read(down[0], b.as_mut_ptr().cast(), 1);
            let mut count = 0u32;
            if let Some(fd) = &fd {
                let mut buf = [0u8; 256];
                while count < 1_000_000
                    && libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    ) >= 0
                {
                    count += 1;
                }
            }
            let c = count.to_ne_bytes();
            libc::write(up[1], c.as_ptr().cast(), 4);
            libc::_exit(0);
        }
        libc::close(up[1]);
        libc::close(down[0]);
        let stranger = Stranger {
            child,
            up: OwnedFd::from_raw_fd(up[0]),
            down: Some(OwnedFd::from_raw_fd(down[1])),
        };
        let mut b = [0u8; 1];
        let ready = stranger.read_within(&mut b) && b[0] == 1;
        ready.then_some(stranger)
    }
}

/// The child of [`bind_as_user`]: killed and reaped on drop.
#[cfg(test)]
pub(crate) struct Stranger {
    child: libc::pid_t,
    up: OwnedFd,
    down: Option<OwnedFd>,
}

#[cfg(test)]
impl Stranger {
    /// Fills `buf` from the child's pipe within 10 s; whether it did.
    fn read_within(&self, buf: &mut [u8]) -> bool {
        let mut got = 0;
        for _ in 0..buf.len() {
            let Ok([r]) = poll(
                [(std::os::fd::AsFd::as_fd(&self.up), libc::POLLIN)],
                Duration::from_secs(10),
            ) else {
                return false;
            };
            if r & (libc::POLLIN | libc::POLLHUP) == 0 {
                return false;
            }
            // SAFETY: `buf[got..]` is writable.
            let n = unsafe {
                libc::read(
                    self.up.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    buf.len() - got,
                )
            };
            if n <= 0 {
                return false;
            }
            got += n as usize;
            if got == buf.len() {
                return true;
            }
        }
        false
    }

    /// Ends the child: how many datagrams its socket had received (`None` if it did not say).
    pub(crate) fn received(mut self) -> Option<u32> {
        // A word, not EOF: a concurrent test's fork(2) may hold a copy of the pipe's end.
        if let Some(down) = self.down.take() {
            // SAFETY: one byte from a live buffer.
            unsafe { libc::write(down.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
        let mut b = [0u8; 4];
        self.read_within(&mut b).then(|| u32::from_ne_bytes(b))
    }
}

#[cfg(test)]
impl Drop for Stranger {
    fn drop(&mut self) {
        // SAFETY: our own child; waitpid reaps it.
        unsafe {
            libc::kill(self.child, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.child, &mut status, 0);
        }
    }
}

/// The child of [`hold_as_user`]: killed and reaped on drop.
#[cfg(test)]
pub(crate) struct HeldByUser {
    child: libc::pid_t,
}

#[cfg(test)]
impl Drop for HeldByUser {
    fn drop(&mut self) {
        // SAFETY: our own child; waitpid reaps it.
        unsafe {
            libc::kill(self.child, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.child, &mut status, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unix_diag reply parses into its attributes; an error reply becomes its errno; short,
    /// overlong or malformed replies are `InvalidData`, never a panic.
    #[test]
    fn unix_diag_replies_parse_or_fail_cleanly() {
        let header = |len: u32, kind: u16| {
            let mut h = Vec::new();
            h.extend_from_slice(&len.to_ne_bytes());
            h.extend_from_slice(&kind.to_ne_bytes());
            h.extend_from_slice(&[0; 10]);
            h
        };
        let attr = |kind: u16, data: &[u8]| {
            let mut a = Vec::new();
            a.extend_from_slice(&(4 + data.len() as u16).to_ne_bytes());
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(data);
            a.resize((a.len() + 3) & !3, 0);
            a
        };
        let mut body = vec![0u8; 16]; // unix_diag_msg
        body.extend(attr(UNIX_DIAG_UID, &1000u32.to_ne_bytes()));
        body.extend(attr(UNIX_DIAG_NAME, b"\0soft-hca/x"));
        body.extend(attr(UNIX_DIAG_PEER, &77u32.to_ne_bytes()));
        let mut reply = header(16 + body.len() as u32, SOCK_DIAG_BY_FAMILY);
        reply.extend_from_slice(&body);
        let d = parse_unix_diag(&reply).unwrap();
        assert_eq!(
            (d.uid, d.peer, d.name.as_deref()),
            (Some(1000), Some(77), Some(&b"\0soft-hca/x"[..]))
        );
        let mut err = header(20, libc::NLMSG_ERROR as u16);
        err.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(
            parse_unix_diag(&err).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let invalid =
            |b: &[u8]| parse_unix_diag(b).unwrap_err().kind() == io::ErrorKind::InvalidData;
        assert!(invalid(&[]));
        assert!(invalid(&reply[..10]));
        assert!(invalid(&header(8, SOCK_DIAG_BY_FAMILY)));
        assert!(
            invalid(&reply[..reply.len() - 4]),
            "length beyond the bytes"
        );
        let mut bad_attr = header(16 + 16 + 4, SOCK_DIAG_BY_FAMILY);
        bad_attr.extend_from_slice(&[0; 16]);
        bad_attr.extend_from_slice(&[2, 0, 7, 0]); // an attribute of length 2
        assert!(invalid(&bad_attr));
        let mut long_attr = header(16 + 16 + 4, SOCK_DIAG_BY_FAMILY);
        long_attr.extend_from_slice(&[0; 16]);
        long_attr.extend_from_slice(&[200, 0, 7, 0]); // longer than the message
        assert!(invalid(&long_attr));
        assert!(invalid(&header(16, 99)), "another message type");
    }

    /// The diag socket is connected to the kernel: a message another socket sends to its port
    /// ID (as any process may, netlink(7)) is refused, so it cannot pose as the kernel's reply;
    /// the kernel's own replies still arrive.
    #[test]
    fn diag_socket_takes_the_kernel_only() {
        let nl = diag_socket().unwrap();
        // SAFETY: sockaddr_nl is plain data; getsockname fills it.
        let mut me: libc::sockaddr_nl = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: `me` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockname(
                nl.as_raw_fd(),
                (&mut me as *mut libc::sockaddr_nl).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert_ne!(me.nl_pid, 0, "connect(2) binds a port ID");
        // SAFETY: plain socket(2).
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor.
        let stranger = unsafe { OwnedFd::from_raw_fd(raw) };
        // A forged reply: an NLMSG_ERROR header claiming errno 0.
        let mut forged = [0u8; 20];
        forged[0..4].copy_from_slice(&20u32.to_ne_bytes());
        forged[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        // SAFETY: `forged` and `me` are live for the call.
        let rc = unsafe {
            libc::sendto(
                stranger.as_raw_fd(),
                forged.as_ptr().cast(),
                forged.len(),
                0,
                (&me as *const libc::sockaddr_nl).cast(),
                mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, -1, "a stranger's message reached the diag socket");
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ECONNREFUSED)
        );
        // The kernel still answers: our own listener's inode.
        let name = format!("soft-hca-test/diag-kernel-only-{}", std::process::id());
        let l = listen_abstract_unix(name.as_bytes(), 1).unwrap();
        // SAFETY: stat is plain data; fstat fills it.
        let mut st: libc::stat = unsafe { mem::zeroed() };
        // SAFETY: `st` is writable.
        assert_eq!(unsafe { libc::fstat(l.as_raw_fd(), &mut st) }, 0);
        let d = unix_diag(st.st_ino as u32, UDIAG_SHOW_UID | UDIAG_SHOW_NAME).unwrap();
        // SAFETY: getuid cannot fail.
        assert_eq!(d.uid, Some(unsafe { libc::getuid() }));
        let mut want = vec![0u8];
        want.extend_from_slice(name.as_bytes());
        assert_eq!(d.name, Some(want));
    }

    #[test]
    fn sockaddr_round_trips() {
        for addr in [
            "127.0.0.2:4791".parse::<SocketAddr>().unwrap(),
            "[fe80::1%3]:4791".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 65535, 0x12345, 0)),
        ] {
            assert_eq!(SockAddrBuf::new(&addr).socket_addr(), Some(addr));
        }
        // A family the link does not speak, or a short length, reads as None.
        let mut unix = SockAddrBuf::empty();
        unix.bytes[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(unix.socket_addr(), None);
        let mut short = SockAddrBuf::new(&"[::1]:1".parse().unwrap());
        short.len = 16;
        assert_eq!(short.socket_addr(), None);
    }

    #[test]
    fn sockaddr_layout_matches_libc() {
        // The byte offsets used above are those of the C structures.
        assert_eq!(mem::size_of::<libc::sockaddr_in>(), 16);
        assert_eq!(mem::size_of::<libc::sockaddr_in6>(), 28);
        assert_eq!(mem::offset_of!(libc::sockaddr_in, sin_port), 2);
        assert_eq!(mem::offset_of!(libc::sockaddr_in, sin_addr), 4);
        assert_eq!(mem::offset_of!(libc::sockaddr_in6, sin6_port), 2);
        assert_eq!(mem::offset_of!(libc::sockaddr_in6, sin6_flowinfo), 4);
        assert_eq!(mem::offset_of!(libc::sockaddr_in6, sin6_addr), 8);
        assert_eq!(mem::offset_of!(libc::sockaddr_in6, sin6_scope_id), 24);
    }

    #[test]
    fn eventfd_counts_and_resets() {
        let fd = eventfd().unwrap();
        assert_eq!(eventfd_take(fd.as_fd()).unwrap(), 0);
        eventfd_add(fd.as_fd(), 1).unwrap();
        eventfd_add(fd.as_fd(), 2).unwrap();
        assert_eq!(eventfd_take(fd.as_fd()).unwrap(), 3);
        assert_eq!(eventfd_take(fd.as_fd()).unwrap(), 0);
    }

    use std::os::fd::AsFd;
}
