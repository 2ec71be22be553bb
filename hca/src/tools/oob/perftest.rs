//! The TCP exchange of perftest 4.5 (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`,
//! `ib_write_lat`, `ib_read_lat`, `ib_send_lat`, `ib_atomic_lat`) without RDMA-CM (`-R` / `--cm`
//! not given), the default.
//!
//! Source: linux-rdma/perftest tag `v4.5-0.17` (Debian bookworm's `perftest 4.5+0.17-1`; its
//! binaries report `Version: 6.06`), `src/perftest_communication.c` and `.h`, and the `main` of
//! each `src/*_bw.c` / `src/*_lat.c`.
//!
//! # The connection
//! The server (no host name given) listens on TCP port 18515 (`-p`), IPv4 only
//! (`ethernet_server_connect`: `AF_INET`, `AI_PASSIVE`, `SO_REUSEADDR`) and accepts one client
//! (`ethernet_client_connect`). [`PerftestListener::bind_any`] listens on IPv4 and IPv6 alike,
//! and [`PerftestListener::accept`] serves every connection until one sends a valid version
//! (the client's first message), refusing and logging the others (see the
//! [`oob`](super#who-is-the-client) module docs). Every exchange below is `ctx_xchg_data_ethernet` /
//! `ctx_hand_shake`: **the client writes its message then reads the server's; the server reads
//! then writes**, each message with one write(2) and one read(2) that must return all of it.
//!
//! # The preamble (every test, right after connecting; `main` sleeps 1 s first)
//! 1. `exchange_versions`: each side's `user_param.version`, a 16-byte `char[MAX_VERSION]`
//!    filled by `strncpy(VERSION)`: `"6.06"` and 12 NULs. `check_version_compatibility` then
//!    aborts if `atof(remote) < 5.70`.
//! 2. `check_sys_data` (remote >= 5.32): `cycle_buffer` (the page size, 4096) then
//!    `cache_line_size` (64), each a 4-byte big-endian `int` in its own exchange; both sides take
//!    the maximum.
//! 3. `check_mtu` (remote >= 5.1, not raw Ethernet): `sprintf("%d", mtu)` of the port's active
//!    MTU as `enum ibv_mtu` (1..5), sent as 2 bytes (remote >= 5.31), e.g. `"3\0"` for 1024; both
//!    use the smaller if the remote one is valid (1..=5).
//!
//! # `pingpong_dest` messages (`ethernet_write_keys` / `ethernet_read_keys`)
//! On RoCE the GID index is never -1 (`check_link` sets 0 for an Ethernet link layer), so the
//! message is `KEY_PRINT_FMT_GID`, 108 bytes with the NUL:
//! `"%04x:%04x:%06x:%06x:%08x:%016llx:"` (LID, outstanding reads, QPN, PSN, rkey, buffer address)
//! `+ 16 x "%02x:"` (the GID bytes in order) `+ "%08x:"` (SRQ number, 0 unless XRC / DC). With
//! a GID index of -1 (InfiniBand without `-x`) it is `KEY_PRINT_FMT`,
//! `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"`, 59 bytes with the NUL. Every `ctx_hand_shake` sends
//! the whole message again and the receiver overwrites what it had, so every hand-shake must
//! carry the same, current values.
//!
//! # The sequence per test (RC/UC/UD, one or more QPs, not bidirectional)
//! After the preamble ([`PerftestConn::preamble`]):
//! * [`PerftestConn::exchange_dests`] (before `ctx_connect`): `ib_write_lat`, `ib_read_lat` and
//!   `ib_atomic_lat` first do one extra hand-shake with QP 0's message; then every test does one
//!   hand-shake per QP. `ctx_check_gid_compatibility` then refuses a peer whose GID is IPv4-mapped
//!   when ours is not (and vice versa).
//! * Both sides bring their QPs to RTR / RTS (`ctx_connect`).
//! * [`PerftestConn::sync_after_connect`]: `ib_send_bw` / `ib_send_lat` do one hand-shake with QP
//!   0 then one per QP; the others one per QP then one with QP 0 ("an additional handshake is
//!   required after moving qp to RTR").
//! * The test and its end:
//!   - `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`: the client runs the test; the server waits in
//!     a hand-shake with QP 0 that the client answers when done; then
//!     [`PerftestConn::exchange_bw_report`] (the server prints the client's numbers) and
//!     [`PerftestConn::close`] on both sides.
//!   - `ib_send_bw`: both post receives, hand-shake with QP 0, run (the server receives), and with
//!     `-a` one more hand-shake after each size; then `close` on both.
//!   - `ib_send_lat`: per size a hand-shake with QP 0 (after posting receives), run; then `close`.
//!   - `ib_read_lat`, `ib_atomic_lat`: the server calls `close` at once (its hand-shake waits for
//!     the client's); the client runs, then `close`.
//!   - `ib_write_lat`: no further TCP traffic; both just exit.
//!
//! [`PerftestConn::close`] is `ctx_close_connection`: a hand-shake with QP 0, then `"done"` and its
//! NUL (5 bytes), which neither side reads, then close.
//!
//! # Bounds on what the peer sends
//! perftest sizes its buffers from the larger of both sides' `cycle_buffer` (`BUFF_SIZE`), and so
//! does `rdma-perf`: a peer's value is taken up to [`MAX_CYCLE_BUFFER`] (2 MiB, the x86-64 huge
//! page; perftest sends its page size, 4 KiB or 64 KiB), its `cache_line_size` up to
//! [`MAX_CACHE_LINE_SIZE`] (4096; perftest sends 64 or 128). A larger value is refused with
//! [`OobError::PeerValue`] before anything is allocated: a 2^31-byte `cycle_buffer` once made a
//! server lock 4 GiB (issue 17). Every other message has a fixed size and fixed-width fields (see
//! the [`oob`](super) module docs); the number of `pingpong_dest` messages is this side's number
//! of QPs, and a bandwidth report is only printed.

use std::net::SocketAddr;
use std::time::Duration;

use roce::{Gid, PathMtu};

use super::{
    connect, parse_hex, printable, stderr_logger, FirstMessage, OobError, OobListener, OobLogger,
    OobStream, OobTimeouts,
};

/// The version this side announces: perftest 4.5-0.17's `VERSION`.
pub const VERSION: &str = "6.06";

/// Bytes of the version message (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;

/// The oldest peer version perftest 4.5 accepts (`check_version_compatibility`).
pub const MIN_PEER_VERSION: f64 = 5.70;

/// Bytes of a `pingpong_dest` message without GID, NUL included (`KEY_MSG_SIZE`).
pub const KEY_MSG_SIZE: usize = 59;

/// Bytes of a `pingpong_dest` message with GID, NUL included (`KEY_MSG_SIZE_GID`).
pub const KEY_MSG_SIZE_GID: usize = 108;

/// The last message of [`PerftestConn::close`]: `"done"` and its NUL.
pub const DONE: &[u8; 5] = b"done\0";

/// perftest's default `cycle_buffer` (`sysconf(_SC_PAGESIZE)`) on common hosts, bytes.
pub const DEFAULT_CYCLE_BUFFER: i32 = 4096;

/// perftest's default `cache_line_size` (`DEF_CACHE_LINE_SIZE`), bytes.
pub const DEFAULT_CACHE_LINE_SIZE: i32 = 64;

/// The largest `cycle_buffer` taken from a peer, bytes: 2 MiB (see the
/// [module docs](self#bounds-on-what-the-peer-sends)).
pub const MAX_CYCLE_BUFFER: i32 = 2 << 20;

/// The largest `cache_line_size` taken from a peer, bytes: 4096.
pub const MAX_CACHE_LINE_SIZE: i32 = 4096;

const WHAT: &str = "perftest pingpong_dest";

/// One QP's parameters as perftest exchanges them (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerftestDest {
    /// Local identifier, 16 bits (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READ / atomic operations the QP allows (`-o`, default the device's
    /// `max_qp_rd_atom`), 16 bits in the message.
    pub out_reads: u16,
    /// Queue pair number, 24 bits.
    pub qpn: u32,
    /// Initial PSN, 24 bits (`lrand48() & 0xffffff`).
    pub psn: u32,
    /// rkey of the buffer the peer targets.
    pub rkey: u32,
    /// Address of that buffer in the peer's address space.
    pub vaddr: u64,
    /// The GID (only in the GID format).
    pub gid: Gid,
    /// SRQ number (XRC / DC; 0 otherwise).
    pub srqn: u32,
}

/// Which `pingpong_dest` format a connection uses: both sides must agree, and perftest picks it
/// from its GID index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyFormat {
    /// `KEY_PRINT_FMT_GID`, 108 bytes: RoCE, or InfiniBand with `-x`.
    WithGid,
    /// `KEY_PRINT_FMT`, 59 bytes: InfiniBand without `-x` (GID index -1).
    WithoutGid,
    /// `struct pingpong_dest` itself, [`KEY_BINARY_LEN`] bytes: what `rdma_write_keys` sends over
    /// perftest's RDMA CM connection (`-R`), see [`PerftestDest::encode`].
    Binary,
}

/// Bytes of `struct pingpong_dest` on LP64 (perftest 4.5-0.17 `perftest_resources.h`): `int
/// lid, out_reads, qpn, psn; unsigned rkey;` 4 bytes of padding, `unsigned long long vaddr;
/// union ibv_gid gid; unsigned srqn; int gid_index;`.
pub const KEY_BINARY_LEN: usize = 56;

impl KeyFormat {
    /// Bytes of a message of this format, NUL included.
    pub const fn message_len(self) -> usize {
        match self {
            KeyFormat::WithGid => KEY_MSG_SIZE_GID,
            KeyFormat::WithoutGid => KEY_MSG_SIZE,
            KeyFormat::Binary => KEY_BINARY_LEN,
        }
    }
}

fn check_range(field: &'static str, value: u64, max: u64) -> Result<(), OobError> {
    if value > max {
        Err(OobError::OutOfRange {
            what: WHAT,
            field,
            value,
            max,
        })
    } else {
        Ok(())
    }
}

impl PerftestDest {
    /// The message in `format`: text and NUL, [`KeyFormat::message_len`] bytes.
    ///
    /// Errors: [`OobError::OutOfRange`] for a QPN or PSN above 24 bits (the C format would print
    /// more digits than the fixed-size message holds).
    /// [`KeyFormat::Binary`] is the struct with every integer big-endian (`rdma_write_keys` with
    /// `HAVE_ENDIAN`: `htobe32` / `htobe64`), the GID bytes in order, the padding zero and
    /// `gid_index` 0.
    pub fn encode(&self, format: KeyFormat) -> Result<Vec<u8>, OobError> {
        check_range("QPN", u64::from(self.qpn), 0xff_ffff)?;
        check_range("PSN", u64::from(self.psn), 0xff_ffff)?;
        if format == KeyFormat::Binary {
            let mut m = vec![0u8; KEY_BINARY_LEN];
            m[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
            m[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
            m[8..12].copy_from_slice(&self.qpn.to_be_bytes());
            m[12..16].copy_from_slice(&self.psn.to_be_bytes());
            m[16..20].copy_from_slice(&self.rkey.to_be_bytes());
            m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
            m[32..48].copy_from_slice(self.gid.as_bytes());
            m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
            return Ok(m);
        }
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        match format {
            KeyFormat::WithGid => {
                for b in self.gid.as_bytes() {
                    text.push_str(&format!("{b:02x}:"));
                }
                text.push_str(&format!("{:08x}:", self.srqn));
            }
            KeyFormat::WithoutGid | KeyFormat::Binary => {
                text.push_str(&format!("{:08x}", self.srqn))
            }
        }
        let mut msg = text.into_bytes();
        msg.push(0);
        debug_assert_eq!(msg.len(), format.message_len());
        Ok(msg)
    }

    /// Parses a message of `format` (the text up to the first NUL): the fields as hex numbers of
    /// at most their printed width, `:`-separated, the GID format ending in `:`. For the GID
    /// format the GID is 16 fields of 1-2 hex digits (what `ethernet_read_keys`' `strtol` reads);
    /// the no-GID format leaves `gid` zero.
    ///
    /// Errors: [`OobError::Malformed`] (without a peer) naming the bad field.
    /// [`KeyFormat::Binary`]: [`KEY_BINARY_LEN`] bytes as [`PerftestDest::encode`] writes them;
    /// LID and outstanding reads above 16 bits, QPN and PSN above 24 bits are refused.
    pub fn decode(msg: &[u8], format: KeyFormat) -> Result<PerftestDest, OobError> {
        let bad = |reason| OobError::Malformed {
            peer: None,
            what: WHAT,
            reason,
            text: printable(msg),
        };
        if format == KeyFormat::Binary {
            if msg.len() != KEY_BINARY_LEN {
                return Err(bad("not 56 bytes"));
            }
            let be32 =
                |at: usize| u32::from_be_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
            let (lid, out_reads) = (be32(0), be32(4));
            let (qpn, psn) = (be32(8), be32(12));
            if lid > 0xffff || out_reads > 0xffff {
                return Err(bad("LID or outstanding reads above 16 bits"));
            }
            if qpn > 0xff_ffff || psn > 0xff_ffff {
                return Err(bad("QPN or PSN above 24 bits"));
            }
            let mut vaddr = [0u8; 8];
            vaddr.copy_from_slice(&msg[24..32]);
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&msg[32..48]);
            return Ok(PerftestDest {
                lid: lid as u16,
                out_reads: out_reads as u16,
                qpn,
                psn,
                rkey: be32(16),
                vaddr: u64::from_be_bytes(vaddr),
                gid: Gid::from_bytes(gid),
                srqn: be32(48),
            });
        }
        let end = msg
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("no terminating NUL"))?;
        let mut fields = msg[..end].split(|&b| b == b':');
        let mut field = |digits, reason| {
            fields
                .next()
                .and_then(|f| parse_hex(f, digits))
                .ok_or_else(|| bad(reason))
        };
        let lid = field(4, "LID is not 1-4 hex digits")? as u16;
        let out_reads = field(4, "outstanding reads is not 1-4 hex digits")? as u16;
        let qpn = field(6, "QPN is not 1-6 hex digits")? as u32;
        let psn = field(6, "PSN is not 1-6 hex digits")? as u32;
        let rkey = field(8, "rkey is not 1-8 hex digits")? as u32;
        let vaddr = field(16, "address is not 1-16 hex digits")?;
        let mut gid = [0u8; 16];
        if format == KeyFormat::WithGid {
            for b in gid.iter_mut() {
                *b = field(2, "GID byte is not 1-2 hex digits")? as u8;
            }
        }
        let srqn = field(8, "SRQ number is not 1-8 hex digits")? as u32;
        let rest: Vec<&[u8]> = fields.collect();
        let trailer_ok = match format {
            KeyFormat::WithGid => rest == [&b""[..]],
            KeyFormat::WithoutGid | KeyFormat::Binary => rest.is_empty(),
        };
        if !trailer_ok {
            return Err(bad("wrong number of fields"));
        }
        Ok(PerftestDest {
            lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            gid: Gid::from_bytes(gid),
            srqn,
        })
    }
}

/// The numbers a bandwidth test reports, as `xchg_bw_reports` exchanges them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size, bytes (`unsigned long`, 8 bytes big-endian on LP64).
    pub size: u64,
    /// Iterations (`uint64_t` big-endian for peers >= 5.33).
    pub iters: u64,
    /// Peak bandwidth (the unit of `--report_gbits`: MB/s or Gb/s), as a big-endian IEEE double.
    pub bw_peak: f64,
    /// Average bandwidth, same unit.
    pub bw_avg: f64,
    /// Average message rate, Mpps.
    pub msg_rate_avg: f64,
    /// Per-port (`--report-per-port`) average bandwidth of port 1.
    pub bw_avg_p1: f64,
    /// Per-port message rate of port 1.
    pub msg_rate_avg_p1: f64,
    /// Per-port average bandwidth of port 2.
    pub bw_avg_p2: f64,
    /// Per-port message rate of port 2.
    pub msg_rate_avg_p2: f64,
}

/// Which side of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Connected to a server (perftest given a host name); writes first in every exchange.
    Client,
    /// Accepted a client; reads first in every exchange.
    Server,
}

/// The perftest programs, for the test-specific parts of the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PerftestTest {
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_send_bw`.
    SendBw,
    /// `ib_atomic_bw`.
    AtomicBw,
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_read_lat`.
    ReadLat,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_atomic_lat`.
    AtomicLat,
}

impl PerftestTest {
    /// Whether `main` does one hand-shake with QP 0 before the per-QP ones (`ib_write_lat`,
    /// `ib_read_lat`, `ib_atomic_lat`).
    pub const fn extra_first_hand_shake(self) -> bool {
        matches!(
            self,
            PerftestTest::WriteLat | PerftestTest::ReadLat | PerftestTest::AtomicLat
        )
    }

    /// Whether the hand-shake with QP 0 after `ctx_connect` comes before the per-QP ones
    /// (`ib_send_bw`, `ib_send_lat`) rather than after them.
    pub const fn sync_before_per_qp(self) -> bool {
        matches!(self, PerftestTest::SendBw | PerftestTest::SendLat)
    }
}

/// What the preamble settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preamble {
    /// The peer's version string.
    pub remote_version: String,
    /// The larger of both `cycle_buffer`s, bytes.
    pub cycle_buffer: i32,
    /// The larger of both `cache_line_size`s, bytes.
    pub cache_line_size: i32,
    /// The MTU both use: the smaller of both if the peer's is valid, else ours.
    pub mtu: PathMtu,
}

/// A listening perftest server.
pub struct PerftestListener {
    listener: OobListener,
    timeouts: OobTimeouts,
    log: OobLogger,
}

impl std::fmt::Debug for PerftestListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerftestListener")
            .field("listener", &self.listener)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// The check of a client's first message, its version (see the [module docs](self)):
/// printable text up to a NUL within the 16 bytes, and at least [`MIN_PEER_VERSION`] as C's
/// `atof` reads it (perftest 4.5's own rule). `Ok(text)`, or `Err(reason)` for the log.
fn check_version(msg: &[u8]) -> Result<String, String> {
    let text = printable(msg);
    let Some(end) = msg.iter().position(|&b| b == 0) else {
        return Err(format!(
            "malformed perftest version: no NUL in its {VERSION_LEN} bytes: \"{text}\""
        ));
    };
    if end == 0 || !msg[..end].iter().all(|b| (0x20..0x7f).contains(b)) {
        return Err(format!(
            "malformed perftest version: not printable text: \"{text}\""
        ));
    }
    if c_atof(msg) < MIN_PEER_VERSION {
        return Err(format!(
            "perftest version \"{text}\" is below {MIN_PEER_VERSION:.2} (or not a number)"
        ));
    }
    Ok(text)
}

impl PerftestListener {
    /// Listens on `addr` (perftest: `0.0.0.0:18515`; port 0 picks one).
    ///
    /// Errors: [`OobError::Listen`].
    pub fn bind(addr: SocketAddr, timeouts: OobTimeouts) -> Result<PerftestListener, OobError> {
        let listener = OobListener::bind(addr)?;
        let log = stderr_logger(format!("perftest server {}", listener.local_addr()));
        Ok(PerftestListener {
            listener,
            timeouts,
            log,
        })
    }

    /// Listens on `port` of every local address, IPv4 and IPv6 alike: `[::]` with
    /// `IPV6_V6ONLY` off, or `0.0.0.0` on a host without IPv6 (port 0 picks one).
    ///
    /// Errors: [`OobError::Listen`], for `[::]:PORT` when the port is in use.
    pub fn bind_any(port: u16, timeouts: OobTimeouts) -> Result<PerftestListener, OobError> {
        let listener = OobListener::bind_any(port)?;
        let log = stderr_logger(format!("perftest server {}", listener.local_addr()));
        Ok(PerftestListener {
            listener,
            timeouts,
            log,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Where refused connections are logged (default: stderr, each line prefixed with
    /// `perftest server ADDRESS: `).
    pub fn set_log(&mut self, log: OobLogger) {
        self.log = log;
    }

    /// Waits up to `timeouts.accept` for a client: serves every connection concurrently until
    /// one sends a valid version message, perftest's first message (printable, NUL-terminated,
    /// at least [`MIN_PEER_VERSION`]), and returns that connection, its version read (the
    /// server's [`PerftestConn::exchange_versions`] then only answers). Every other connection
    /// is closed with one log line naming its address and the reason; the rules and bounds are
    /// in the [`oob`](super#who-is-the-client) module docs.
    ///
    /// Errors: [`OobError::AcceptTimeout`] (no valid client in time), [`OobError::Accept`].
    pub fn accept(&self, format: KeyFormat) -> Result<PerftestConn, OobError> {
        let first = FirstMessage {
            what: "perftest version",
            len: VERSION_LEN,
            check: &check_version,
        };
        let a = self
            .listener
            .accept_client(&self.timeouts, &first, &self.log)?;
        Ok(PerftestConn {
            stream: Transport::Tcp(OobStream::new(a.stream, self.timeouts.io)?),
            role: Role::Server,
            format,
            peer_version: Some(a.value),
        })
    }
}

/// A connection that carries perftest's messages other than over TCP: perftest's `-R`
/// connection, an RC QP connected by RDMA CM on which each message is one SEND into the one
/// receive the peer keeps posted (`rdma_write_data` / `rdma_read_data`,
/// [`crate::tools::cm::CmChannel`]).
pub trait MessageChannel: std::fmt::Debug + Send {
    /// Sends `msg` as one message.
    ///
    /// Errors: [`OobError::Write`], [`OobError::Timeout`].
    fn send(&mut self, what: &'static str, msg: &[u8]) -> Result<(), OobError>;
    /// Receives one message of exactly `buf.len()` bytes into `buf`.
    ///
    /// Errors: [`OobError::Read`], [`OobError::Timeout`], [`OobError::Closed`].
    fn recv(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), OobError>;
    /// The peer's address.
    fn peer(&self) -> SocketAddr;
    /// This side's address.
    fn local_addr(&self) -> Option<SocketAddr>;
    /// Changes how long each later [`MessageChannel::recv`] / [`MessageChannel::send`] waits.
    fn set_io_timeout(&mut self, io: Duration);
}

#[derive(Debug)]
enum Transport {
    Tcp(OobStream),
    Channel(Box<dyn MessageChannel>),
}

impl Transport {
    fn write_msg(&mut self, what: &'static str, msg: &[u8]) -> Result<(), OobError> {
        match self {
            Transport::Tcp(s) => s.write_msg(what, msg),
            Transport::Channel(c) => c.send(what, msg),
        }
    }

    fn read_msg(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), OobError> {
        match self {
            Transport::Tcp(s) => s.read_msg(what, buf),
            Transport::Channel(c) => c.recv(what, buf),
        }
    }
}

/// One perftest connection (TCP, or perftest's `-R` RDMA CM connection through a
/// [`MessageChannel`]), client or server; see the [module docs](self) for the order of calls.
#[derive(Debug)]
pub struct PerftestConn {
    stream: Transport,
    role: Role,
    format: KeyFormat,
    /// A server's client version, read (and checked) by [`PerftestListener::accept`] and not
    /// yet answered.
    peer_version: Option<String>,
}

impl PerftestConn {
    /// Connects to a perftest server at `host:port` (retrying until `timeouts.connect`).
    ///
    /// Errors: [`OobError::Resolve`], [`OobError::Connect`].
    pub fn connect(
        host: &str,
        port: u16,
        format: KeyFormat,
        timeouts: &OobTimeouts,
    ) -> Result<PerftestConn, OobError> {
        let stream = connect(host, port, timeouts)?;
        Ok(PerftestConn {
            stream: Transport::Tcp(OobStream::new(stream, timeouts.io)?),
            role: Role::Client,
            format,
            peer_version: None,
        })
    }

    /// A connection over `channel` (perftest's `-R`: messages are SENDs on an RC QP connected by
    /// RDMA CM, and `pingpong_dest` travels as [`KeyFormat::Binary`]); `role` says who writes
    /// first in each exchange.
    pub fn over_channel(channel: Box<dyn MessageChannel>, role: Role) -> PerftestConn {
        PerftestConn {
            stream: Transport::Channel(channel),
            role,
            format: KeyFormat::Binary,
            peer_version: None,
        }
    }

    /// Client or server.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The peer's TCP address.
    pub fn peer(&self) -> SocketAddr {
        match &self.stream {
            Transport::Tcp(s) => s.peer,
            Transport::Channel(c) => c.peer(),
        }
    }

    /// This side's address of the TCP connection (the source address the route to the peer
    /// uses, or the address the client reached): a tool without a configured device address
    /// uses it as its GID.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.stream {
            Transport::Tcp(s) => s.stream.local_addr().ok(),
            Transport::Channel(c) => c.local_addr(),
        }
    }

    /// Changes the timeout of each later read and write (e.g. to the test's duration plus a
    /// margin before the end-of-test hand-shake).
    ///
    /// Errors: [`OobError::Write`] if the socket refuses the option.
    pub fn set_io_timeout(&mut self, io: Duration) -> Result<(), OobError> {
        match &mut self.stream {
            Transport::Tcp(s) => s.set_io_timeout(io),
            Transport::Channel(c) => {
                c.set_io_timeout(io);
                Ok(())
            }
        }
    }

    /// One `ctx_xchg_data_ethernet`: the client writes `mine` then reads `theirs`, the server
    /// reads then writes.
    ///
    /// Errors: [`OobError::Write`], [`OobError::Read`], [`OobError::Timeout`],
    /// [`OobError::Closed`].
    pub fn exchange_raw(
        &mut self,
        what: &'static str,
        mine: &[u8],
        theirs: &mut [u8],
    ) -> Result<(), OobError> {
        match self.role {
            Role::Client => {
                self.stream.write_msg(what, mine)?;
                self.stream.read_msg(what, theirs)
            }
            Role::Server => {
                self.stream.read_msg(what, theirs)?;
                self.stream.write_msg(what, mine)
            }
        }
    }

    /// `exchange_versions` + `check_version_compatibility`: sends `local` (at most 15 bytes, NUL
    /// padded to 16; normally [`VERSION`]) and returns the peer's. On a server the client's
    /// version was read and checked by [`PerftestListener::accept`] (it is the client's first
    /// message): this only sends `local`.
    ///
    /// Errors: those of [`exchange_raw`](Self::exchange_raw); [`OobError::Version`] when the
    /// peer's version is below [`MIN_PEER_VERSION`] (perftest 4.5 itself aborts then);
    /// [`OobError::OutOfRange`] for a `local` of more than 15 bytes.
    pub fn exchange_versions(&mut self, local: &str) -> Result<String, OobError> {
        if local.len() >= VERSION_LEN {
            return Err(OobError::OutOfRange {
                what: "perftest version",
                field: "length",
                value: local.len() as u64,
                max: (VERSION_LEN - 1) as u64,
            });
        }
        let mut mine = [0u8; VERSION_LEN];
        mine[..local.len()].copy_from_slice(local.as_bytes());
        // A server's accept read the client's version (its first message) already.
        if let Some(version) = self.peer_version.take() {
            self.stream.write_msg("perftest version", &mine)?;
            return Ok(version);
        }
        let mut theirs = [0u8; VERSION_LEN];
        self.exchange_raw("perftest version", &mine, &mut theirs)?;
        let version = printable(&theirs);
        if c_atof(&theirs) < MIN_PEER_VERSION {
            return Err(OobError::Version {
                peer: self.peer(),
                version,
            });
        }
        Ok(version)
    }

    /// `check_sys_data`: exchanges `cycle_buffer` then `cache_line_size` (4-byte big-endian
    /// `int`s, two exchanges) and returns the larger of each pair.
    ///
    /// Errors: those of [`exchange_raw`](Self::exchange_raw); [`OobError::PeerValue`] for a
    /// peer's `cycle_buffer` above [`MAX_CYCLE_BUFFER`] or `cache_line_size` above
    /// [`MAX_CACHE_LINE_SIZE`] (checked as each arrives).
    pub fn exchange_sys_data(
        &mut self,
        cycle_buffer: i32,
        cache_line_size: i32,
    ) -> Result<(i32, i32), OobError> {
        let cycle = self.exchange_bounded_int(
            "perftest cycle_buffer",
            "cycle_buffer",
            cycle_buffer,
            MAX_CYCLE_BUFFER,
        )?;
        let line = self.exchange_bounded_int(
            "perftest cache_line_size",
            "cache_line_size",
            cache_line_size,
            MAX_CACHE_LINE_SIZE,
        )?;
        Ok((cycle.max(cycle_buffer), line.max(cache_line_size)))
    }

    /// Exchanges one 4-byte big-endian `int` and returns the peer's, refused above `max`.
    fn exchange_bounded_int(
        &mut self,
        what: &'static str,
        field: &'static str,
        mine: i32,
        max: i32,
    ) -> Result<i32, OobError> {
        let mut theirs = [0u8; 4];
        self.exchange_raw(what, &mine.to_be_bytes(), &mut theirs)?;
        let value = i32::from_be_bytes(theirs);
        if value > max {
            return Err(OobError::PeerValue {
                peer: self.peer(),
                what,
                field,
                value: i64::from(value),
                max: max as u64,
            });
        }
        Ok(value)
    }

    /// `check_mtu`: exchanges the MTU code as decimal text and NUL (2 bytes) and returns the
    /// MTU to use: the peer's if it is valid and smaller than `local`, else `local`.
    ///
    /// Errors: those of [`exchange_raw`](Self::exchange_raw).
    pub fn exchange_mtu(&mut self, local: PathMtu) -> Result<PathMtu, OobError> {
        let mine = [b'0' + local.code(), 0];
        let mut theirs = [0u8; 2];
        self.exchange_raw("perftest MTU", &mine, &mut theirs)?;
        // strtol(rem, NULL, 10) on the 2 bytes: a leading decimal digit, else 0 (invalid).
        let remote = if theirs[0].is_ascii_digit() {
            theirs[0] - b'0'
        } else {
            0
        };
        Ok(PathMtu::ALL
            .into_iter()
            .find(|m| m.code() == remote && *m < local)
            .unwrap_or(local))
    }

    /// The whole preamble: [`exchange_versions`](Self::exchange_versions) with [`VERSION`],
    /// [`exchange_sys_data`](Self::exchange_sys_data), [`exchange_mtu`](Self::exchange_mtu).
    ///
    /// Errors: those of the three.
    pub fn preamble(
        &mut self,
        cycle_buffer: i32,
        cache_line_size: i32,
        mtu: PathMtu,
    ) -> Result<Preamble, OobError> {
        let remote_version = self.exchange_versions(VERSION)?;
        let (cycle_buffer, cache_line_size) =
            self.exchange_sys_data(cycle_buffer, cache_line_size)?;
        let mtu = self.exchange_mtu(mtu)?;
        Ok(Preamble {
            remote_version,
            cycle_buffer,
            cache_line_size,
            mtu,
        })
    }

    /// `ctx_hand_shake`: sends `local` and returns the peer's message.
    ///
    /// Errors: [`OobError::OutOfRange`] (bad `local`; nothing sent), those of
    /// [`exchange_raw`](Self::exchange_raw), [`OobError::Malformed`].
    pub fn hand_shake(&mut self, local: &PerftestDest) -> Result<PerftestDest, OobError> {
        let mine = local.encode(self.format)?;
        let mut theirs = vec![0u8; self.format.message_len()];
        self.exchange_raw(WHAT, &mine, &mut theirs)?;
        PerftestDest::decode(&theirs, self.format).map_err(|e| e.with_peer(self.peer()))
    }

    /// The hand-shakes before `ctx_connect` (see the [module docs](self)): returns the peer's
    /// message for each QP of `local` (which must hold one per QP, the peer having as many).
    ///
    /// Errors: those of [`hand_shake`](Self::hand_shake); [`OobError::OutOfRange`] for an empty
    /// `local`.
    pub fn exchange_dests(
        &mut self,
        test: PerftestTest,
        local: &[PerftestDest],
    ) -> Result<Vec<PerftestDest>, OobError> {
        let first = non_empty(local)?;
        if test.extra_first_hand_shake() {
            self.hand_shake(first)?;
        }
        local.iter().map(|d| self.hand_shake(d)).collect()
    }

    /// The hand-shakes after `ctx_connect`, up to the start of the test (see the
    /// [module docs](self)); returns the peer's messages again (they should not have changed).
    ///
    /// Errors: as [`exchange_dests`](Self::exchange_dests).
    pub fn sync_after_connect(
        &mut self,
        test: PerftestTest,
        local: &[PerftestDest],
    ) -> Result<Vec<PerftestDest>, OobError> {
        let first = non_empty(local)?;
        if test.sync_before_per_qp() {
            self.hand_shake(first)?;
        }
        let mut remote = local
            .iter()
            .map(|d| self.hand_shake(d))
            .collect::<Result<Vec<_>, _>>()?;
        if !test.sync_before_per_qp() {
            remote[0] = self.hand_shake(first)?;
        }
        Ok(remote)
    }

    /// `xchg_bw_reports` with a peer >= 5.33: size, iterations, peak and average bandwidth and
    /// message rate (and the four per-port values if `per_port`), each field its own exchange of
    /// 8 big-endian bytes. Returns the peer's report.
    ///
    /// Errors: those of [`exchange_raw`](Self::exchange_raw).
    pub fn exchange_bw_report(
        &mut self,
        mine: &BwReport,
        per_port: bool,
    ) -> Result<BwReport, OobError> {
        let mut theirs = BwReport::default();
        let mut x = |what, v: [u8; 8]| -> Result<[u8; 8], OobError> {
            let mut buf = [0u8; 8];
            self.exchange_raw(what, &v, &mut buf)?;
            Ok(buf)
        };
        theirs.size = u64::from_be_bytes(x("bw report size", mine.size.to_be_bytes())?);
        theirs.iters = u64::from_be_bytes(x("bw report iterations", mine.iters.to_be_bytes())?);
        let f = |v: f64| v.to_bits().to_be_bytes();
        let g = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        theirs.bw_peak = g(x("bw report peak", f(mine.bw_peak))?);
        theirs.bw_avg = g(x("bw report average", f(mine.bw_avg))?);
        theirs.msg_rate_avg = g(x("bw report message rate", f(mine.msg_rate_avg))?);
        if per_port {
            theirs.bw_avg_p1 = g(x("bw report port 1", f(mine.bw_avg_p1))?);
            theirs.msg_rate_avg_p1 = g(x("bw report port 1 rate", f(mine.msg_rate_avg_p1))?);
            theirs.bw_avg_p2 = g(x("bw report port 2", f(mine.bw_avg_p2))?);
            theirs.msg_rate_avg_p2 = g(x("bw report port 2 rate", f(mine.msg_rate_avg_p2))?);
        }
        Ok(theirs)
    }

    /// `ctx_close_connection`: a hand-shake with `local` (QP 0's message), then [`DONE`], then
    /// closes (after reading, for at most 500 ms, the peer's own `done`).
    ///
    /// Errors: those of [`hand_shake`](Self::hand_shake), [`OobError::Write`].
    /// Over a [`MessageChannel`] (`-R`) only the hand-shake (perftest writes `"done"` only on
    /// its TCP socket).
    pub fn close(mut self, local: &PerftestDest) -> Result<(), OobError> {
        self.hand_shake(local)?;
        if let Transport::Tcp(mut s) = self.stream {
            s.write_msg("done message", DONE)?;
            s.finish(Duration::from_millis(500));
        }
        Ok(())
    }
}

fn non_empty(local: &[PerftestDest]) -> Result<&PerftestDest, OobError> {
    local.first().ok_or(OobError::OutOfRange {
        what: WHAT,
        field: "number of QPs",
        value: 0,
        max: 0,
    })
}

/// C `atof` of a NUL-terminated buffer, as far as version strings need: optional blanks, sign,
/// digits, a point and digits; 0.0 when there are no digits.
fn c_atof(buf: &[u8]) -> f64 {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let s = &buf[..end];
    let s = &s[s.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
    let mut n = 0;
    if matches!(s.first(), Some(b'+' | b'-')) {
        n += 1;
    }
    let int_digits = s[n..].iter().take_while(|b| b.is_ascii_digit()).count();
    n += int_digits;
    let mut frac_digits = 0;
    if s.get(n) == Some(&b'.') {
        frac_digits = s[n + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        if int_digits + frac_digits > 0 {
            n += 1 + frac_digits;
        }
    }
    if int_digits + frac_digits == 0 {
        return 0.0;
    }
    std::str::from_utf8(&s[..n])
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Printed by gcc with `KEY_PRINT_FMT_GID` / `KEY_PRINT_FMT` (x86-64).
    const GOLDEN_GID: &[u8] = b"0000:0010:000011:abcdef:00001234:00007f0000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01:00000000:\0";
    const GOLDEN_NO_GID: &[u8] = b"001f:0010:000011:abcdef:00001234:00007f0000001000:00000042\0";

    fn dest() -> PerftestDest {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&Ipv4Addr::LOCALHOST.octets());
        PerftestDest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_0000_1000,
            gid: Gid::from_bytes(g),
            srqn: 0,
        }
    }

    #[test]
    fn binary_dest_is_the_big_endian_struct() {
        let d = dest();
        let m = d.encode(KeyFormat::Binary).unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(&[
            0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x11, 0, 0xab, 0xcd, 0xef,
        ]);
        want.extend_from_slice(&[0, 0, 0x12, 0x34, 0, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, 0x7f, 0, 0, 0, 0x10, 0]);
        want.extend_from_slice(d.gid.as_bytes());
        want.extend_from_slice(&[0; 8]);
        assert_eq!(m, want);
        assert_eq!(PerftestDest::decode(&m, KeyFormat::Binary).unwrap(), d);
        // Wrong length, or a QPN above 24 bits, is refused.
        assert!(PerftestDest::decode(&m[..55], KeyFormat::Binary).is_err());
        let mut bad = m.clone();
        bad[8] = 1;
        assert!(PerftestDest::decode(&bad, KeyFormat::Binary).is_err());
    }

    #[test]
    fn golden_messages() {
        assert_eq!(GOLDEN_GID.len(), KEY_MSG_SIZE_GID);
        assert_eq!(GOLDEN_NO_GID.len(), KEY_MSG_SIZE);
        let d = dest();
        assert_eq!(d.encode(KeyFormat::WithGid).unwrap(), GOLDEN_GID);
        assert_eq!(
            PerftestDest::decode(GOLDEN_GID, KeyFormat::WithGid).unwrap(),
            d
        );
        let d2 = PerftestDest {
            lid: 0x1f,
            srqn: 0x42,
            gid: Gid::from_bytes([0; 16]),
            ..d
        };
        assert_eq!(d2.encode(KeyFormat::WithoutGid).unwrap(), GOLDEN_NO_GID);
        assert_eq!(
            PerftestDest::decode(GOLDEN_NO_GID, KeyFormat::WithoutGid).unwrap(),
            d2
        );
        // Largest values keep the fixed length.
        let max = PerftestDest {
            lid: u16::MAX,
            out_reads: u16::MAX,
            qpn: 0xff_ffff,
            psn: 0xff_ffff,
            rkey: u32::MAX,
            vaddr: u64::MAX,
            gid: Gid::from_bytes([0xff; 16]),
            srqn: u32::MAX,
        };
        for f in [KeyFormat::WithGid, KeyFormat::WithoutGid] {
            let m = max.encode(f).unwrap();
            assert_eq!(m.len(), f.message_len());
            let back = PerftestDest::decode(&m, f).unwrap();
            assert_eq!(back.qpn, max.qpn);
        }
    }

    #[test]
    fn decode_rejects_malformed() {
        let cases: [(&[u8], KeyFormat, &str); 6] = [
            (&GOLDEN_GID[..107], KeyFormat::WithGid, "NUL"),
            (GOLDEN_NO_GID, KeyFormat::WithGid, "GID byte"),
            (GOLDEN_GID, KeyFormat::WithoutGid, "number of fields"),
            (
                b"0000:0010:1000011:abcdef:00001234:00007f0000001000:00000042\0",
                KeyFormat::WithoutGid,
                "QPN",
            ),
            (
                b"0000:0010:000011:abcdef:00001234:00007f0000001000:00000042:\0",
                KeyFormat::WithoutGid,
                "number of fields",
            ),
            (b"\0", KeyFormat::WithGid, "LID"),
        ];
        for (msg, f, want) in cases {
            let e = PerftestDest::decode(msg, f).unwrap_err();
            assert!(e.to_string().contains(want), "{e} (wanted {want})");
        }
        let e = PerftestDest {
            psn: 0x100_0000,
            ..dest()
        }
        .encode(KeyFormat::WithGid)
        .unwrap_err();
        assert!(matches!(e, OobError::OutOfRange { field: "PSN", .. }));
    }

    #[test]
    fn atof_like_c() {
        assert_eq!(c_atof(b"6.06\0\0\0"), 6.06);
        assert_eq!(c_atof(b"5.70"), 5.70);
        assert_eq!(c_atof(b" 5.7x"), 5.7);
        assert_eq!(c_atof(b"\0"), 0.0);
        assert_eq!(c_atof(b"abc"), 0.0);
        assert_eq!(c_atof(b"."), 0.0);
        assert_eq!(c_atof(b"7"), 7.0);
        assert!(c_atof(b"5.69") < MIN_PEER_VERSION);
    }

    /// A client and a server through the whole `ib_write_bw` sequence over loopback, byte counts
    /// checked by the fixed-size reads on both sides.
    #[test]
    fn loopback_write_bw_sequence() {
        let t = OobTimeouts {
            connect: Duration::from_secs(5),
            accept: Duration::from_secs(5),
            io: Duration::from_secs(5),
        };
        let l = PerftestListener::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
        let port = l.local_addr().port();
        let server_dests = [
            PerftestDest {
                qpn: 0x21,
                ..dest()
            },
            PerftestDest {
                qpn: 0x22,
                ..dest()
            },
        ];
        let client_dests = [
            PerftestDest {
                qpn: 0x31,
                psn: 1,
                ..dest()
            },
            PerftestDest {
                qpn: 0x32,
                psn: 2,
                ..dest()
            },
        ];
        let sd = server_dests;
        let server = std::thread::spawn(move || -> Result<_, OobError> {
            let mut c = l.accept(KeyFormat::WithGid)?;
            assert_eq!(c.role(), Role::Server);
            let p = c.preamble(4096, 128, PathMtu::Mtu4096)?;
            let r1 = c.exchange_dests(PerftestTest::WriteBw, &sd)?;
            let r2 = c.sync_after_connect(PerftestTest::WriteBw, &sd)?;
            c.hand_shake(&sd[0])?; // waits for the client's end of test
            let rep = c.exchange_bw_report(&BwReport::default(), false)?;
            c.close(&sd[0])?;
            Ok((p, r1, r2, rep))
        });
        let mut c = PerftestConn::connect("127.0.0.1", port, KeyFormat::WithGid, &t).unwrap();
        let p = c.preamble(8192, 64, PathMtu::Mtu1024).unwrap();
        assert_eq!(
            p,
            Preamble {
                remote_version: VERSION.to_string(),
                cycle_buffer: 8192,
                cache_line_size: 128,
                mtu: PathMtu::Mtu1024,
            }
        );
        assert_eq!(
            c.exchange_dests(PerftestTest::WriteBw, &client_dests)
                .unwrap(),
            server_dests
        );
        assert_eq!(
            c.sync_after_connect(PerftestTest::WriteBw, &client_dests)
                .unwrap(),
            server_dests
        );
        c.hand_shake(&client_dests[0]).unwrap();
        let mine = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 11.25,
            bw_avg: 10.5,
            msg_rate_avg: 0.02,
            ..BwReport::default()
        };
        c.exchange_bw_report(&mine, false).unwrap();
        c.close(&client_dests[0]).unwrap();
        let (sp, r1, r2, rep) = server.join().unwrap().unwrap();
        assert_eq!(sp.mtu, PathMtu::Mtu1024);
        assert_eq!((sp.cycle_buffer, sp.cache_line_size), (8192, 128));
        assert_eq!(r1, client_dests);
        assert_eq!(r2, client_dests);
        assert_eq!(rep, mine);
    }

    /// A peer's `cycle_buffer` or `cache_line_size` above its bound is refused, naming the
    /// field, the value and the bound; the largest allowed values pass.
    #[test]
    fn peer_sys_data_above_the_bounds_is_refused() {
        use std::io::{Read, Write};
        let t = OobTimeouts {
            accept: Duration::from_secs(10),
            io: Duration::from_secs(10),
            ..OobTimeouts::default()
        };
        let cases = [
            (
                i32::MAX,
                64,
                Some(("cycle_buffer", i64::from(i32::MAX), 2 << 20)),
            ),
            (4096, 1 << 20, Some(("cache_line_size", 1 << 20, 4096))),
            (MAX_CYCLE_BUFFER, MAX_CACHE_LINE_SIZE, None),
            (-1, -1, None),
        ];
        for (cycle, line, refused) in cases {
            let l = PerftestListener::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
            let port = l.local_addr().port();
            let client = std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                // The first message, which makes this connection the client.
                let mut version = [0u8; VERSION_LEN];
                version[..4].copy_from_slice(VERSION.as_bytes());
                s.write_all(&version).unwrap();
                let mut buf = [0u8; 16];
                s.read_exact(&mut buf).unwrap();
                for msg in [&cycle.to_be_bytes(), &line.to_be_bytes()] {
                    // The server answers each, up to the one it refuses.
                    if s.write_all(msg).is_err() || s.read_exact(&mut buf[..4]).is_err() {
                        break;
                    }
                }
            });
            let mut c = l.accept(KeyFormat::WithGid).unwrap();
            assert_eq!(c.exchange_versions(VERSION).unwrap(), VERSION);
            let r = c.exchange_sys_data(DEFAULT_CYCLE_BUFFER, DEFAULT_CACHE_LINE_SIZE);
            drop(c);
            client.join().unwrap();
            match refused {
                Some((field, value, max)) => {
                    let e = r.unwrap_err();
                    assert!(
                        matches!(e, OobError::PeerValue { field: f, value: v, max: m, .. }
                            if f == field && v == value && m == max),
                        "{e:?}"
                    );
                    let text = e.to_string();
                    assert!(
                        text.contains(&format!("{field} {value} is above the bound of {max}")),
                        "{text}"
                    );
                }
                None => assert_eq!(
                    r.unwrap(),
                    (
                        cycle.max(DEFAULT_CYCLE_BUFFER),
                        line.max(DEFAULT_CACHE_LINE_SIZE)
                    )
                ),
            }
        }
    }

    /// The server's check of a client's version: perftest's `atof` rule, printable text, a NUL.
    #[test]
    fn first_message_check() {
        let v = |t: &[u8]| {
            let mut m = [0u8; VERSION_LEN];
            m[..t.len()].copy_from_slice(t);
            check_version(&m)
        };
        assert_eq!(v(b"6.06").unwrap(), "6.06");
        assert_eq!(v(b"5.70").unwrap(), "5.70");
        assert_eq!(v(b"  7.1-rc2").unwrap(), "  7.1-rc2");
        for (t, why) in [
            (&b"5.69"[..], "below 5.70"),
            (b"", "not printable"),
            (b"six", "below 5.70"),
            (b"6.06\n", "not printable"),
            (b"\x806.06", "not printable"),
            (b"0123456789abcdef", "no NUL"),
        ] {
            let e = if t.len() == VERSION_LEN {
                check_version(t).unwrap_err()
            } else {
                v(t).unwrap_err()
            };
            assert!(e.contains(why), "{t:?}: {e} (wanted {why})");
        }
    }

    #[test]
    fn old_peer_version_is_refused() {
        let t = OobTimeouts {
            io: Duration::from_secs(5),
            ..OobTimeouts::default()
        };
        let l = PerftestListener::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
        let port = l.local_addr().port();
        let server = std::thread::spawn(move || {
            let mut c = l.accept(KeyFormat::WithGid).unwrap();
            c.exchange_versions("5.60")
        });
        let mut c = PerftestConn::connect("127.0.0.1", port, KeyFormat::WithGid, &t).unwrap();
        let e = c.exchange_versions(VERSION).unwrap_err();
        assert!(e.to_string().contains("\"5.60\""), "{e}");
        // The server saw 6.06 and accepted it.
        assert_eq!(server.join().unwrap().unwrap(), "6.06");
    }

    #[test]
    fn silent_peer_times_out() {
        let t = OobTimeouts {
            io: Duration::from_millis(200),
            ..OobTimeouts::default()
        };
        let l = PerftestListener::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
        let port = l.local_addr().port();
        let server = std::thread::spawn(move || {
            let c = l.accept(KeyFormat::WithGid).unwrap();
            std::thread::sleep(Duration::from_millis(600));
            drop(c);
        });
        let mut c = PerftestConn::connect("127.0.0.1", port, KeyFormat::WithGid, &t).unwrap();
        let start = std::time::Instant::now();
        let e = c.exchange_versions(VERSION).unwrap_err();
        assert!(
            matches!(
                e,
                OobError::Timeout {
                    got: 0,
                    expected: 16,
                    ..
                }
            ),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(2));
        server.join().unwrap();
    }
}
