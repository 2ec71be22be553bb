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
//!
//! # Who is the client
//! Both tools' C servers accept one connection and take it as their client, so a stranger that
//! connects first (a port scanner, a silent or slow connection, a malformed message) would ruin
//! the run. Here a server serves every connection that arrives, concurrently, in one thread
//! (poll(2) over the listening socket and every waiting connection), until one sends a valid
//! **first message**: perftest's 16-byte version (printable text, NUL-terminated, at least
//! 5.70), or the pingpong tools' 52-byte address (`LID:QPN:PSN:GID`). That connection is the
//! client, and the exchange goes on with it alone (perftest keeps it for the whole run). The
//! bounds:
//! * each connection must send its whole first message within [`FIRST_MESSAGE_TIMEOUT`]
//!   (10 s, or the I/O timeout if less) of its accept, however it is segmented;
//! * at most the message's length plus one byte is read from it, into a fixed
//!   [`MAX_FIRST_LEN`] + 1 byte buffer: nothing the peer sends sizes anything, and a peer that
//!   sends more than the message before the reply (which neither C client does: each waits
//!   for the server's answer) is refused as oversized;
//! * at most [`MAX_PENDING`] (64) connections wait at once; a new one beyond that closes the
//!   oldest waiting one. So the state of an accept is at most 64 sockets and 64 x 65 bytes;
//! * every connection that is not the client is closed with one log line naming its address
//!   and the reason (malformed, truncated, oversized, too slow, closed, evicted, or closed
//!   because the client came first) to an [`OobLogger`] (stderr by default, prefixed with
//!   the tool's name); after [`MAX_LOGGED`] (32) such lines they are only counted, and one
//!   last line gives the count;
//! * the server gives up when no valid client came within [`OobTimeouts::accept`]
//!   ([`OobError::AcceptTimeout`], which says how many connections it refused).
//!
//! A stranger who can reach the port and speaks the protocol (a valid first message) is taken
//! as the client, as with the C tools: the port is not authenticated (see the README's trust
//! section).

pub mod perftest;
pub mod pingpong;

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
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
    /// No client connected within [`OobTimeouts::accept`] (or none whose first message was
    /// valid: each refused connection was logged).
    AcceptTimeout {
        /// The listening address.
        addr: SocketAddr,
        /// How long it waited.
        waited: Duration,
        /// Connections refused meanwhile (malformed, incomplete or late first message).
        refused: usize,
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
            OobError::AcceptTimeout {
                addr,
                waited,
                refused,
            } => {
                write!(
                    f,
                    "no client connected to TCP {addr} within {:.1} s",
                    waited.as_secs_f64()
                )?;
                if *refused > 0 {
                    let s = if *refused == 1 { "" } else { "s" };
                    write!(f, " (refused {refused} connection{s}, as logged above)")?;
                }
                Ok(())
            }
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

/// A listening TCP socket (`SO_REUSEADDR`, as both tools set) that serves connections
/// concurrently until one proves to be the client ([`OobListener::accept_client`]).
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

    /// Serves every connection that arrives, concurrently, until one sends a valid first
    /// message, and returns that one: the client. See the
    /// [module docs](self#who-is-the-client) for the rules (deadline, bounds, log lines).
    ///
    /// `first` says how long the client's first message is and how to check it. The returned
    /// stream is blocking, with `timeouts.io` as read and write timeout and `TCP_NODELAY`.
    ///
    /// Errors: [`OobError::AcceptTimeout`] when no valid client came within
    /// `timeouts.accept`; [`OobError::Accept`] when accept(2) or poll(2) fail otherwise than
    /// for one connection.
    pub(crate) fn accept_client<T>(
        &self,
        timeouts: &OobTimeouts,
        first: &FirstMessage<'_, T>,
        log: &OobLogger,
    ) -> Result<Accepted<T>, OobError> {
        assert!(
            first.len <= MAX_FIRST_LEN,
            "first message above MAX_FIRST_LEN"
        );
        let start = Instant::now();
        let addr = self.addr;
        // Duration::MAX (no limit) does not fit an Instant.
        let give_up = start.checked_add(timeouts.accept);
        let first_timeout = timeouts
            .io
            .min(FIRST_MESSAGE_TIMEOUT)
            .max(Duration::from_millis(1));
        let mut refusals = Refusals::new(log);
        let mut pending: VecDeque<Candidate> = VecDeque::new();
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(MAX_PENDING + 1);
        loop {
            // New connections: each waits for its first message with a deadline of its own.
            loop {
                match self.listener.accept() {
                    Ok((stream, peer)) => {
                        let peer = canonical(peer);
                        if let Err(e) = stream.set_nonblocking(true) {
                            refusals.refuse(peer, &format!("dropped: {e}"));
                            continue;
                        }
                        if pending.len() >= MAX_PENDING {
                            if let Some(old) = pending.pop_front() {
                                refusals.refuse(
                                    old.peer,
                                    &format!(
                                        "closed: the oldest of more than {MAX_PENDING} \
                                         connections waiting for their {}",
                                        first.what
                                    ),
                                );
                            }
                        }
                        pending.push_back(Candidate {
                            stream,
                            peer,
                            buf: [0; MAX_FIRST_LEN + 1],
                            got: 0,
                            deadline: Instant::now() + first_timeout,
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                    // Out of descriptors: the connection stays queued; close the oldest
                    // waiting one to make room, or look again shortly.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        match pending.pop_front() {
                            Some(old) => refusals.refuse(
                                old.peer,
                                "closed: out of file descriptors for newer connections",
                            ),
                            None => std::thread::sleep(Duration::from_millis(10)),
                        }
                        break;
                    }
                    Err(source) => return Err(OobError::Accept { addr, source }),
                }
            }
            // Whatever the waiting connections sent: complete, refused or still short.
            let mut i = 0;
            while i < pending.len() {
                match pending[i].step(first) {
                    Step::Waiting => i += 1,
                    Step::Refused(why) => {
                        if let Some(c) = pending.remove(i) {
                            refusals.refuse(c.peer, &why);
                        }
                    }
                    Step::Client(value) => {
                        let Some(c) = pending.remove(i) else {
                            continue;
                        };
                        for other in pending.drain(..) {
                            refusals.refuse(
                                other.peer,
                                &format!(
                                    "closed: the client from {} was taken before this \
                                     connection's {} was complete",
                                    c.peer, first.what
                                ),
                            );
                        }
                        let setup = c
                            .stream
                            .set_nonblocking(false)
                            .and_then(|()| setup_stream(&c.stream, timeouts.io));
                        if let Err(e) = setup {
                            refusals.refuse(c.peer, &format!("dropped: {e}"));
                            continue;
                        }
                        refusals.summary();
                        return Ok(Accepted {
                            stream: c.stream,
                            value,
                        });
                    }
                }
            }
            // Deadlines: each connection's, then the server's.
            let now = Instant::now();
            let mut i = 0;
            while i < pending.len() {
                if pending[i].deadline <= now {
                    if let Some(c) = pending.remove(i) {
                        refusals.refuse(
                            c.peer,
                            &format!(
                                "sent {} of the {} bytes of its {} within {:.1} s",
                                c.got.min(first.len),
                                first.len,
                                first.what,
                                first_timeout.as_secs_f64()
                            ),
                        );
                    }
                } else {
                    i += 1;
                }
            }
            let mut wait = Duration::from_secs(3600);
            if let Some(end) = give_up {
                wait = end.saturating_duration_since(now);
                if wait.is_zero() {
                    for c in pending.drain(..) {
                        refusals.refuse(
                            c.peer,
                            &format!("closed: the server gave up waiting for its {}", first.what),
                        );
                    }
                    refusals.summary();
                    return Err(OobError::AcceptTimeout {
                        addr,
                        waited: start.elapsed(),
                        refused: refusals.total,
                    });
                }
            }
            if let Some(earliest) = pending.iter().map(|c| c.deadline).min() {
                wait = wait.min(earliest.saturating_duration_since(now));
            }
            pfds.clear();
            pfds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            pfds.extend(pending.iter().map(|c| libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            sys::poll_slice(&mut pfds, wait).map_err(|source| OobError::Accept { addr, source })?;
        }
    }
}

/// The most connections a tool's server reads a first message from at once; a new connection
/// beyond that closes the oldest waiting one (see the [module docs](self#who-is-the-client)).
pub const MAX_PENDING: usize = 64;

/// The longest a new connection may take, from its accept, to send its whole first message
/// (less when [`OobTimeouts::io`] is less).
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Refused connections a server logs one line each for; it counts those beyond (and says how
/// many in one last line).
pub const MAX_LOGGED: usize = 32;

/// The longest first message a server reads: perftest's version is 16 bytes, pingpong's
/// address 52.
pub const MAX_FIRST_LEN: usize = 64;

/// Where a tool's server writes its log lines (a refused connection, the count of those not
/// logged one by one): one call per line, without the newline.
pub type OobLogger = Arc<dyn Fn(&str) + Send + Sync>;

/// The default [`OobLogger`]: each line to stderr as `PREFIX: LINE`, in one write(2), so that
/// lines of processes sharing stderr do not splice.
pub fn stderr_logger(prefix: impl Into<String>) -> OobLogger {
    let prefix = prefix.into();
    Arc::new(move |line: &str| {
        let line = format!("{prefix}: {line}\n");
        let _ = io::stderr().lock().write_all(line.as_bytes());
    })
}

/// The first message a server expects from its client: its name (for log lines), its length
/// (at most [`MAX_FIRST_LEN`]) and the check that decides whether the connection is the client
/// (`Err(reason)` refuses it).
pub(crate) struct FirstMessage<'a, T> {
    pub(crate) what: &'static str,
    pub(crate) len: usize,
    pub(crate) check: &'a dyn Fn(&[u8]) -> Result<T, String>,
}

/// The client [`OobListener::accept_client`] took: its stream (blocking, I/O timeouts set) and
/// what the check of its first message returned.
#[derive(Debug)]
pub(crate) struct Accepted<T> {
    pub(crate) stream: TcpStream,
    pub(crate) value: T,
}

/// A connection waiting for its first message (non-blocking).
struct Candidate {
    stream: TcpStream,
    peer: SocketAddr,
    /// One byte more than the longest message: a peer that sends more than the message
    /// before the reply is not a client.
    buf: [u8; MAX_FIRST_LEN + 1],
    got: usize,
    deadline: Instant,
}

enum Step<T> {
    Waiting,
    Refused(String),
    Client(T),
}

impl Candidate {
    /// Reads what has arrived (at most `first.len + 1` bytes in all) and judges it once the
    /// whole message is there.
    fn step<T>(&mut self, first: &FirstMessage<'_, T>) -> Step<T> {
        let len = first.len;
        loop {
            if self.got > len {
                return Step::Refused(format!(
                    "sent more than the {len}-byte {} before the server's reply",
                    first.what
                ));
            }
            match self.stream.read(&mut self.buf[self.got..=len]) {
                Ok(0) => {
                    return Step::Refused(format!(
                        "closed after {} of the {len} bytes of its {}",
                        self.got, first.what
                    ))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Step::Refused(format!("dropped: {e}")),
            }
        }
        if self.got < len {
            return Step::Waiting;
        }
        match (first.check)(&self.buf[..len]) {
            Ok(v) => Step::Client(v),
            Err(why) => Step::Refused(why),
        }
    }
}

/// The refusal log of one accept: one line each for the first [`MAX_LOGGED`], then a count.
struct Refusals<'a> {
    log: &'a OobLogger,
    total: usize,
}

impl<'a> Refusals<'a> {
    fn new(log: &'a OobLogger) -> Refusals<'a> {
        Refusals { log, total: 0 }
    }

    fn refuse(&mut self, peer: SocketAddr, why: &str) {
        self.total += 1;
        if self.total <= MAX_LOGGED {
            (self.log)(&format!("refused the connection from {peer}: {why}"));
            if self.total == MAX_LOGGED {
                (self.log)("further refused connections are counted, not logged one by one");
            }
        }
    }

    /// The last line, when some refusals were not logged one by one.
    fn summary(&self) {
        if self.total > MAX_LOGGED {
            (self.log)(&format!(
                "{} connections refused in all ({} not logged one by one)",
                self.total,
                self.total - MAX_LOGGED
            ));
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
    use std::sync::Mutex;

    /// The check of the tests' 2-byte first message.
    fn hi(m: &[u8]) -> Result<(), String> {
        if m == b"hi" {
            Ok(())
        } else {
            Err(format!("not a greeting: \"{}\"", printable(m)))
        }
    }

    /// A logger that drops its lines.
    fn quiet() -> OobLogger {
        Arc::new(|_: &str| {})
    }

    /// A logger that keeps its lines.
    fn keeping() -> (OobLogger, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let log: OobLogger = Arc::new(move |line: &str| l.lock().unwrap().push(line.to_owned()));
        (log, lines)
    }

    /// Strangers that connect before the client (silent, trickling, malformed, truncated,
    /// oversized) cost it nothing: the client, which connects last, is taken while they still
    /// wait; each stranger gets one log line naming its address and why it was refused.
    #[test]
    fn strangers_before_the_client_are_refused_and_logged() {
        let l = OobListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = l.local_addr().port();
        let t = OobTimeouts {
            accept: Duration::from_secs(20),
            io: Duration::from_secs(20),
            ..OobTimeouts::default()
        };
        let (log, lines) = keeping();
        let first = FirstMessage {
            what: "greeting",
            len: 2,
            check: &hi,
        };
        let strangers = std::thread::spawn(move || {
            let dial = || TcpStream::connect(("127.0.0.1", port)).unwrap();
            let silent = dial();
            let mut malformed = dial();
            malformed.write_all(b"yo").unwrap();
            let mut oversized = dial();
            oversized.write_all(b"hi there").unwrap();
            let mut truncated = dial();
            truncated.write_all(b"h").unwrap();
            truncated.shutdown(Shutdown::Write).unwrap();
            let mut trickle = dial();
            trickle.write_all(b"h").unwrap();
            // The client: after every stranger, while the silent and trickling ones still wait.
            std::thread::sleep(Duration::from_millis(100));
            let mut client = dial();
            client.write_all(b"hi").unwrap();
            let names = [&silent, &malformed, &oversized, &truncated, &trickle]
                .map(|s| s.local_addr().unwrap());
            let mut reply = [0u8; 2];
            client.read_exact(&mut reply).unwrap();
            (names, reply, client.local_addr().unwrap())
        });
        let a = l.accept_client(&t, &first, &log).unwrap();
        let mut s = a.stream;
        s.write_all(b"ok").unwrap();
        let (names, reply, client) = strangers.join().unwrap();
        assert_eq!(&reply, b"ok");
        assert_eq!(canonical(s.peer_addr().unwrap()), client);
        let lines = lines.lock().unwrap().clone();
        assert_eq!(lines.len(), names.len(), "{lines:#?}");
        for (name, why) in names.iter().zip([
            "closed: the client from",
            "not a greeting: \"yo\"",
            "sent more than the 2-byte greeting",
            "closed after 1 of the 2 bytes",
            "closed: the client from",
        ]) {
            let line = lines
                .iter()
                .find(|l| l.contains(&format!("connection from {name}:")))
                .unwrap_or_else(|| panic!("no line for {name}: {lines:#?}"));
            assert!(line.contains(why), "{line} (wanted {why})");
        }
    }

    /// A connection that sends nothing within its deadline is refused and logged, and the
    /// server goes on to take a client that comes after it; past MAX_PENDING waiting
    /// connections the oldest is closed; past MAX_LOGGED lines refusals are only counted.
    #[test]
    fn slow_first_connection_times_out_and_pending_ones_are_bounded() {
        let l = OobListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = l.local_addr().port();
        let t = OobTimeouts {
            accept: Duration::from_secs(30),
            io: Duration::from_millis(300),
            ..OobTimeouts::default()
        };
        let (log, lines) = keeping();
        let first = FirstMessage {
            what: "greeting",
            len: 2,
            check: &hi,
        };
        let dialer = std::thread::spawn(move || {
            let dial = || TcpStream::connect(("127.0.0.1", port)).unwrap();
            // MAX_PENDING + 2 silent connections: the first two are evicted, the others time out.
            let silent: Vec<TcpStream> = (0..MAX_PENDING + 2).map(|_| dial()).collect();
            // Once the server has closed every one of them (each read sees EOF; bounded by a
            // read timeout far past their 300 ms deadline), the client.
            for mut s in &silent {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut b = [0u8; 1];
                match s.read(&mut b) {
                    Ok(0) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                    other => panic!("a silent connection was not closed: {other:?}"),
                }
            }
            let mut client = dial();
            client.write_all(b"hi").unwrap();
            let mut reply = [0u8; 2];
            client.read_exact(&mut reply).unwrap();
            drop(silent);
            reply
        });
        let a = l.accept_client(&t, &first, &log).unwrap();
        let mut s = a.stream;
        s.write_all(b"ok").unwrap();
        assert_eq!(&dialer.join().unwrap(), b"ok");
        let lines = lines.lock().unwrap().clone();
        // MAX_LOGGED lines, the "counted" notice, the summary.
        assert_eq!(lines.len(), MAX_LOGGED + 2, "{lines:#?}");
        let evicted = lines
            .iter()
            .filter(|l| l.contains("the oldest of more than 64"))
            .count();
        assert_eq!(evicted, 2, "{lines:#?}");
        assert!(lines
            .iter()
            .any(|l| l.contains("sent 0 of the 2 bytes of its greeting within 0.3 s")));
        assert_eq!(
            lines.last().unwrap(),
            &format!(
                "{} connections refused in all ({} not logged one by one)",
                MAX_PENDING + 2,
                MAX_PENDING + 2 - MAX_LOGGED
            )
        );
    }

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
        let first = FirstMessage {
            what: "greeting",
            len: 2,
            check: &hi,
        };
        for host in hosts {
            let mut c = connect(host, port, &t).unwrap();
            c.write_all(b"hi").unwrap();
            let a = l.accept_client(&t, &first, &quiet()).unwrap();
            let s = OobStream::new(a.stream, t.io).unwrap();
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
        let first = FirstMessage {
            what: "greeting",
            len: 2,
            check: &hi,
        };
        let e = l.accept_client(&t, &first, &quiet()).unwrap_err();
        assert!(
            matches!(e, OobError::AcceptTimeout { refused: 0, .. }),
            "{e}"
        );
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
