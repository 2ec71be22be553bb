//! Out-of-band (OOB) exchanges: how RDMA test tools trade connection parameters over TCP.
//!
//! Before two RDMA endpoints can talk, each must know the other's queue pair number (QPN), first
//! packet sequence number (PSN), GID (its address) and, for RDMA WRITE / READ / atomics, the remote
//! buffer's address and rkey. Real deployments use the RDMA connection manager; the classic test
//! tools instead open a plain TCP connection (default port 18515), swap these values as short text
//! messages, and use the same connection to synchronize phases of the test. To interoperate with
//! those tools byte for byte, this module mirrors their exchanges:
//! * [`pingpong`]: rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`
//!   (`libibverbs/examples/*_pingpong.c`): one `LID:QPN:PSN:GID` message each way and a `done`.
//! * [`perftest`]: perftest 4.5's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw` and the
//!   `_lat` tests (`src/perftest_communication.c`): a version / system / MTU preamble, then
//!   `pingpong_dest` messages per QP and for every synchronization point, reports and `done`.
//!
//! Both tools write each message with one write(2) and read it with one read(2) that must return
//! the whole message, strictly alternating (the client writes first). This module writes each
//! message with one call too, reads tolerantly (whatever segmentation arrives), and bounds every
//! step with a timeout ([`OobTimeouts`]): a peer that never answers gives an error, not a hang.
//!
//! # What a peer may make this side do
//! The peer is not trusted. Every message is read into a buffer of the fixed size this side
//! expects (16 bytes for perftest's version, 108 for its `pingpong_dest`, 52 for the pingpong
//! address ...), never one the peer announces, and the number of messages is this side's (one
//! per local QP). Of the values the peer sends, only perftest's `cycle_buffer` and
//! `cache_line_size` could size anything here (the buffers of `rdma-perf`); they are refused
//! above [`perftest::MAX_CYCLE_BUFFER`] and [`perftest::MAX_CACHE_LINE_SIZE`] with
//! [`OobError::PeerValue`], which names the field, the value and the bound. The other values
//! (QPNs, PSNs, rkeys, addresses, GIDs, a bandwidth report) are bounded by their field widths and
//! go into QP attributes, work requests or printed reports, not into sizes.

pub mod perftest;
pub mod pingpong;

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::link::sys;

/// The TCP port both tool families use by default (`port = 18515` in rdma-core's
/// `*_pingpong.c` `main`; `DEF_PORT` in perftest's `perftest_parameters.h`).
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// How long each step of an exchange may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OobTimeouts {
    /// How long a client keeps trying to connect: refused connections (the server is not
    /// listening yet) are retried every 100 ms until this passes. Default 10 s.
    pub connect: Duration,
    /// How long a server waits for its client to connect. Default 60 s; `Duration::MAX` waits
    /// without limit (as perftest's and the pingpong examples' servers do).
    pub accept: Duration,
    /// How long each read or write may block. Default 30 s. Perftest's end-of-test
    /// synchronization waits for the whole test: raise it with
    /// [`perftest::PerftestConn::set_io_timeout`] for long runs.
    pub io: Duration,
}

impl Default for OobTimeouts {
    fn default() -> OobTimeouts {
        OobTimeouts {
            connect: Duration::from_secs(10),
            accept: Duration::from_secs(60),
            io: Duration::from_secs(30),
        }
    }
}

/// A failed out-of-band exchange: what failed, with whom, and why. `Display` gives one line.
#[derive(Debug)]
pub enum OobError {
    /// The server name did not resolve to an address.
    Resolve {
        /// `host:port` as given.
        peer: String,
        /// The resolver's error.
        source: io::Error,
    },
    /// No connection to the server within [`OobTimeouts::connect`].
    Connect {
        /// `host:port` as given.
        peer: String,
        /// How long it was tried.
        waited: Duration,
        /// The last attempt's error (`ConnectionRefused`, `TimedOut`, `NetworkUnreachable` ...).
        source: io::Error,
    },
    /// The server could not listen on its address (port in use, address not local ...).
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// accept(2) or poll(2) on the listening socket failed.
    Accept {
        /// The listening address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// No client connected within [`OobTimeouts::accept`].
    AcceptTimeout {
        /// The listening address.
        addr: SocketAddr,
        /// How long it waited.
        waited: Duration,
    },
    /// Writing a message failed.
    Write {
        /// The peer.
        peer: SocketAddr,
        /// The message (e.g. `"pingpong address"`).
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Reading a message failed.
    Read {
        /// The peer.
        peer: SocketAddr,
        /// The message expected.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The peer sent nothing (or not all of a message) within [`OobTimeouts::io`].
    Timeout {
        /// The peer.
        peer: SocketAddr,
        /// The message expected.
        what: &'static str,
        /// Bytes of it received.
        got: usize,
        /// Bytes expected.
        expected: usize,
        /// The timeout.
        after: Duration,
    },
    /// The peer closed the connection before a whole message arrived.
    Closed {
        /// The peer.
        peer: SocketAddr,
        /// The message expected.
        what: &'static str,
        /// Bytes of it received.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// A received message does not have the tool's format.
    Malformed {
        /// The peer, when the message came from a connection.
        peer: Option<SocketAddr>,
        /// The message.
        what: &'static str,
        /// What is wrong.
        reason: &'static str,
        /// The message as text (non-printable bytes escaped, up to the first NUL).
        text: String,
    },
    /// A local value does not fit the field of the message format (e.g. a QPN above 24 bits);
    /// nothing was sent.
    OutOfRange {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },
    /// The peer sent a value above the bound this side puts on it: a value that would size an
    /// allocation or a memory lock here (perftest's `cycle_buffer`, say). Nothing was allocated.
    PeerValue {
        /// The peer.
        peer: SocketAddr,
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value it sent.
        value: i64,
        /// The largest value this side takes.
        max: u64,
    },
    /// The peer's perftest version is one perftest 4.5 refuses (below 5.70,
    /// `check_version_compatibility`).
    Version {
        /// The peer.
        peer: SocketAddr,
        /// The version it sent.
        version: String,
    },
}

impl OobError {
    /// The same error, naming `peer` if it names no peer yet.
    pub(crate) fn with_peer(self, peer: SocketAddr) -> OobError {
        match self {
            OobError::Malformed {
                peer: None,
                what,
                reason,
                text,
            } => OobError::Malformed {
                peer: Some(peer),
                what,
                reason,
                text,
            },
            other => other,
        }
    }
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OobError::Resolve { peer, source } => write!(f, "cannot resolve {peer}: {source}"),
            OobError::Connect {
                peer,
                waited,
                source,
            } => write!(
                f,
                "cannot connect to {peer} (tried for {:.1} s): {source}",
                waited.as_secs_f64()
            ),
            OobError::Listen { addr, source } => {
                write!(f, "cannot listen on TCP {addr}: {source}")
            }
            OobError::Accept { addr, source } => {
                write!(f, "accepting a client on TCP {addr} failed: {source}")
            }
            OobError::AcceptTimeout { addr, waited } => write!(
                f,
                "no client connected to TCP {addr} within {:.1} s",
                waited.as_secs_f64()
            ),
            OobError::Write { peer, what, source } => {
                write!(f, "sending the {what} to {peer} failed: {source}")
            }
            OobError::Read { peer, what, source } => {
                write!(f, "reading the {what} from {peer} failed: {source}")
            }
            OobError::Timeout {
                peer,
                what,
                got,
                expected,
                after,
            } => write!(
                f,
                "{peer} did not send the {what} within {:.1} s (got {got} of {expected} bytes)",
                after.as_secs_f64()
            ),
            OobError::Closed {
                peer,
                what,
                got,
                expected,
            } => write!(
                f,
                "{peer} closed the connection before sending the {what} \
                 (got {got} of {expected} bytes)"
            ),
            OobError::Malformed {
                peer,
                what,
                reason,
                text,
            } => {
                write!(f, "malformed {what}")?;
                if let Some(p) = peer {
                    write!(f, " from {p}")?;
                }
                write!(f, ": {reason}: \"{text}\"")
            }
            OobError::OutOfRange {
                what,
                field,
                value,
                max,
            } => write!(
                f,
                "cannot send the {what}: {field} {value:#x} is above {max:#x}"
            ),
            OobError::PeerValue {
                peer,
                what,
                field,
                value,
                max,
            } => write!(
                f,
                "refusing the {what} from {peer}: {field} {value} is above the bound of {max}"
            ),
            OobError::Version { peer, version } => write!(
                f,
                "{peer} runs perftest version \"{version}\"; perftest 4.5 requires 5.70 or later"
            ),
        }
    }
}

impl std::error::Error for OobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OobError::Resolve { source, .. }
            | OobError::Connect { source, .. }
            | OobError::Listen { source, .. }
            | OobError::Accept { source, .. }
            | OobError::Write { source, .. }
            | OobError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `bytes` up to the first NUL as text, non-printable bytes escaped, at most 160 characters.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut s: String = bytes[..end].escape_ascii().to_string();
    if s.len() > 160 {
        s.truncate(157);
        s.push_str("...");
    }
    s
}

/// Connects to `host:port`, retrying refused connections every 100 ms until
/// `timeouts.connect` passes, and sets `timeouts.io` as read and write timeout and `TCP_NODELAY`.
pub(crate) fn connect(
    host: &str,
    port: u16,
    timeouts: &OobTimeouts,
) -> Result<TcpStream, OobError> {
    let peer = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| OobError::Resolve {
            peer: peer.clone(),
            source,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(OobError::Resolve {
            peer,
            source: io::Error::new(io::ErrorKind::NotFound, "no address"),
        });
    }
    let start = Instant::now();
    let deadline = start + timeouts.connect;
    loop {
        let mut last = None;
        for addr in &addrs {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = remaining.clamp(Duration::from_millis(1), Duration::from_secs(5));
            match TcpStream::connect_timeout(addr, attempt) {
                Ok(stream) => {
                    setup_stream(&stream, timeouts.io).map_err(|source| OobError::Connect {
                        peer: peer.clone(),
                        waited: start.elapsed(),
                        source,
                    })?;
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        let source = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::TimedOut));
        let retry = matches!(
            source.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        );
        if !retry || Instant::now() + Duration::from_millis(100) >= deadline {
            return Err(OobError::Connect {
                peer,
                waited: start.elapsed(),
                source,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sets the I/O timeouts and `TCP_NODELAY` of a connected stream.
fn setup_stream(stream: &TcpStream, io: Duration) -> io::Result<()> {
    let io = io.max(Duration::from_millis(1));
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(io))?;
    stream.set_write_timeout(Some(io))?;
    Ok(())
}

/// A listening TCP socket (`SO_REUSEADDR`, as both tools set) that accepts one client at a time
/// within a timeout.
#[derive(Debug)]
pub(crate) struct OobListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl OobListener {
    /// Listens on `addr` (port 0 picks a free port).
    pub(crate) fn bind(addr: SocketAddr) -> Result<OobListener, OobError> {
        // std sets SO_REUSEADDR on listening sockets on Unix, as the tools do.
        let listener =
            TcpListener::bind(addr).map_err(|source| OobError::Listen { addr, source })?;
        OobListener::from_listener(listener, addr)
    }

    /// Listens on `port` of every local address, IPv4 and IPv6 alike: one IPv6 socket on `[::]`
    /// with `IPV6_V6ONLY` off (ipv6(7): IPv4 clients then arrive as `::ffff:a.b.c.d`, which
    /// [`OobStream`] names as plain IPv4), whatever the `net.ipv6.bindv6only` sysctl says; on a
    /// host without IPv6 (socket(2) or bind(2) refuse the family or the address), on `0.0.0.0`.
    /// (perftest listens on IPv4 only; the pingpong examples on what getaddrinfo(3) lists
    /// first.)
    ///
    /// Errors: [`OobError::Listen`] with the first failure: a port in use is reported for
    /// `[::]:PORT`, whichever tool asks.
    pub(crate) fn bind_any(port: u16) -> Result<OobListener, OobError> {
        let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        match dual_stack_listener(&v6) {
            Ok(listener) => OobListener::from_listener(listener, v6),
            Err(e) if ipv6_absent(&e) => OobListener::bind((Ipv4Addr::UNSPECIFIED, port).into()),
            Err(source) => Err(OobError::Listen { addr: v6, source }),
        }
    }

    /// Takes a bound, listening socket: notes its address and makes it non-blocking.
    fn from_listener(listener: TcpListener, addr: SocketAddr) -> Result<OobListener, OobError> {
        let addr = listener
            .local_addr()
            .map_err(|source| OobError::Listen { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| OobError::Listen { addr, source })?;
        Ok(OobListener { listener, addr })
    }

    /// The address listened on.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `timeouts.accept` for a client (poll(2) on the listening socket), then
    /// accepts it and sets `timeouts.io` on the connection.
    pub(crate) fn accept(
        &self,
        timeouts: &OobTimeouts,
    ) -> Result<(TcpStream, SocketAddr), OobError> {
        let start = Instant::now();
        let addr = self.addr;
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    let setup = stream
                        .set_nonblocking(false)
                        .and_then(|()| setup_stream(&stream, timeouts.io));
                    setup.map_err(|source| OobError::Accept { addr, source })?;
                    return Ok((stream, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(source) => return Err(OobError::Accept { addr, source }),
            }
            let left = timeouts.accept.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(OobError::AcceptTimeout {
                    addr,
                    waited: start.elapsed(),
                });
            }
            sys::poll([(self.listener.as_fd(), libc::POLLIN)], left)
                .map_err(|source| OobError::Accept { addr, source })?;
        }
    }
}

/// An IPv6 TCP socket listening on `addr` with `SO_REUSEADDR` on (as std's listeners and both C
/// tools set it) and `IPV6_V6ONLY` off.
fn dual_stack_listener(addr: &SocketAddr) -> io::Result<TcpListener> {
    let fd = sys::tcp_socket(true)?;
    sys::set_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    sys::set_int(fd.as_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    sys::bind(fd.as_fd(), addr)?;
    // std's backlog (perftest's is 1; one client is served either way).
    sys::listen(fd.as_fd(), 128)?;
    Ok(TcpListener::from(fd))
}

/// Whether `e` says this host has no IPv6 (no such address family, or `::` not assignable).
fn ipv6_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EADDRNOTAVAIL)
    )
}

/// `addr`, an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, an IPv4 client of a dual-stack
/// listener) as the IPv4 address it is.
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => addr,
        },
        v4 => v4,
    }
}

/// A connected stream with its peer, reading and writing whole messages.
#[derive(Debug)]
pub(crate) struct OobStream {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) io_timeout: Duration,
}

impl OobStream {
    /// Wraps a connected stream whose timeouts are set to `io_timeout`.
    pub(crate) fn new(stream: TcpStream, io_timeout: Duration) -> Result<OobStream, OobError> {
        let peer = stream
            .peer_addr()
            .map(canonical)
            .map_err(|source| OobError::Read {
                peer: SocketAddr::from(([0, 0, 0, 0], 0)),
                what: "peer address",
                source,
            })?;
        Ok(OobStream {
            stream,
            peer,
            io_timeout,
        })
    }

    /// Changes the read and write timeout.
    pub(crate) fn set_io_timeout(&mut self, io: Duration) -> Result<(), OobError> {
        setup_stream(&self.stream, io).map_err(|source| OobError::Write {
            peer: self.peer,
            what: "socket timeout",
            source,
        })?;
        self.io_timeout = io.max(Duration::from_millis(1));
        Ok(())
    }

    /// Writes `msg` whole (one write(2) in the normal case, as the C tools expect).
    pub(crate) fn write_msg(&mut self, what: &'static str, msg: &[u8]) -> Result<(), OobError> {
        let peer = self.peer;
        self.stream.write_all(msg).map_err(|source| {
            if matches!(
                source.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                OobError::Timeout {
                    peer,
                    what,
                    got: 0,
                    expected: msg.len(),
                    after: self.io_timeout,
                }
            } else {
                OobError::Write { peer, what, source }
            }
        })
    }

    /// Reads exactly `buf.len()` bytes, however they are segmented.
    pub(crate) fn read_msg(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), OobError> {
        let peer = self.peer;
        let expected = buf.len();
        let mut got = 0;
        while got < expected {
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(OobError::Closed {
                        peer,
                        what,
                        got,
                        expected,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(OobError::Timeout {
                        peer,
                        what,
                        got,
                        expected,
                        after: self.io_timeout,
                    })
                }
                Err(source) => return Err(OobError::Read { peer, what, source }),
            }
        }
        Ok(())
    }

    /// Ends the connection politely: no more writes, then reads (and discards) what the peer
    /// still sends, for at most `linger`, so that closing does not reset the connection while
    /// the peer's last message is in flight. Errors are ignored: the exchange is complete.
    pub(crate) fn finish(self, linger: Duration) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let _ = self
            .stream
            .set_read_timeout(Some(linger.max(Duration::from_millis(1))));
        let mut sink = [0u8; 64];
        let mut stream = &self.stream;
        let start = Instant::now();
        while start.elapsed() < linger {
            match stream.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

/// Parses `text` as a hexadecimal number of at most `max_digits` digits (upper or lower case).
pub(crate) fn parse_hex(text: &[u8], max_digits: usize) -> Option<u64> {
    if text.is_empty() || text.len() > max_digits {
        return None;
    }
    let mut v: u64 = 0;
    for &c in text {
        let d = (c as char).to_digit(16)?;
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_and_stops_at_nul() {
        assert_eq!(printable(b"ab\x01c\0zz"), "ab\\x01c");
        assert_eq!(printable(&[b'x'; 300]).len(), 160);
    }

    #[test]
    fn parse_hex_is_strict() {
        assert_eq!(parse_hex(b"00ff", 4), Some(255));
        assert_eq!(parse_hex(b"ABCDEF", 6), Some(0xabcdef));
        assert_eq!(parse_hex(b"", 4), None);
        assert_eq!(parse_hex(b"12345", 4), None);
        assert_eq!(parse_hex(b"12g4", 4), None);
        assert_eq!(parse_hex(b"ffffffffffffffff", 16), Some(u64::MAX));
    }

    /// One listener takes clients over IPv4 and IPv6 (where this host has IPv6), and names an
    /// IPv4 client by its IPv4 address.
    #[test]
    fn bind_any_takes_both_ip_versions() {
        let l = OobListener::bind_any(0).unwrap();
        let port = l.local_addr().port();
        let t = OobTimeouts {
            accept: Duration::from_secs(10),
            ..OobTimeouts::default()
        };
        let ipv6 = std::net::UdpSocket::bind("[::1]:0").is_ok();
        assert_eq!(l.local_addr().is_ipv6(), ipv6, "{}", l.local_addr());
        let mut hosts = vec!["127.0.0.1"];
        if ipv6 {
            hosts.push("::1");
        } else {
            eprintln!("no IPv6 on this host: IPv4 only");
        }
        for host in hosts {
            let c = connect(host, port, &t).unwrap();
            let (s, _) = l.accept(&t).unwrap();
            let s = OobStream::new(s, t.io).unwrap();
            assert_eq!(s.peer, canonical(c.local_addr().unwrap()), "{host}");
            assert_eq!(s.peer.ip().to_string(), host);
        }
        // A port in use is reported for [::] (0.0.0.0 without IPv6).
        let e = OobListener::bind_any(port).unwrap_err();
        assert!(matches!(e, OobError::Listen { .. }), "{e}");
        let want = if ipv6 { "[::]" } else { "0.0.0.0" };
        assert!(
            e.to_string()
                .starts_with(&format!("cannot listen on TCP {want}:{port}: ")),
            "{e}"
        );
    }

    #[test]
    fn accept_times_out_and_connect_gives_up() {
        let l = OobListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let t = OobTimeouts {
            accept: Duration::from_millis(50),
            ..OobTimeouts::default()
        };
        let start = Instant::now();
        let e = l.accept(&t).unwrap_err();
        assert!(matches!(e, OobError::AcceptTimeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        // Nothing listens on the port once the listener is gone: refused until the deadline.
        let port = l.local_addr().port();
        drop(l);
        let t = OobTimeouts {
            connect: Duration::from_millis(300),
            ..OobTimeouts::default()
        };
        let start = Instant::now();
        let e = connect("127.0.0.1", port, &t).unwrap_err();
        assert!(matches!(e, OobError::Connect { .. }), "{e}");
        assert!(
            e.to_string().starts_with("cannot connect to 127.0.0.1:"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(3));
    }
}
