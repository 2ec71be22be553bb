//! The TCP rendezvous: a root that all-gathers byte records between ranks, and the rank side.
//!
//! Frames are `u32 length (LE) | u8 tag | payload`, at most [`MAX_FRAME`] bytes:
//!
//! | tag | direction | payload |
//! |-----|-----------|---------|
//! | 1 `HELLO` | rank -> root | magic u64, version u32, rank u32, nranks u32 |
//! | 2 `CONTRIBUTE` | rank -> root | round u32, record |
//! | 3 `ABORT` | rank -> root | message |
//! | 4 `GATHERED` | root -> rank | round u32, nranks u32, nranks records |
//! | 5 `FAILED` | root -> rank | rank at fault u32 (`u32::MAX`: none), message |
//!
//! # Trust model
//! As NCCL's and Gloo's bootstrap: **anyone who can reach the root's port and knows the
//! communicator's secret (the 64-bit magic of its [`UniqueId`]) is trusted** to be one of its
//! ranks. The secret travels in clear in the `HELLO` (no encryption, no authentication of the
//! root to the ranks): it keeps strangers, port scanners and the ranks of other jobs out, not an
//! attacker who can read the network between the ranks. A job that needs more runs its
//! rendezvous on a private network. Where the secret comes from:
//! [`UniqueId::new`] / [`UniqueId::listen`] draw it from the kernel's random source
//! (getrandom(2)); under a launcher every rank derives it from what the launcher shares with its
//! ranks ([`super::launcher`] says which launchers share something unguessable, and how to add
//! a secret of one's own, `COLL_SECRET`, where they do not).
//!
//! # The root
//! The root knows its world size from its own configuration ([`RootOptions::nranks`]; only
//! [`UniqueId::new`], NCCL's `ncclGetUniqueId`, which is not told it, takes it from the first
//! `HELLO` that carries the right secret). It serves every connection concurrently: an acceptor
//! thread takes connections and hands each to a thread of its own that reads its `HELLO`, with
//! a deadline (at most [`HELLO_TIMEOUT`]) and a bound (a `HELLO` is exactly 25 bytes; a first
//! frame of another length is refused before anything is allocated for it); at most
//! [`MAX_PENDING`] connections wait for their `HELLO` at once, and a new one beyond that closes
//! the oldest. So an idle, slow or malformed connection costs the job nothing, and a stranger
//! costs the root at most one small thread for at most [`HELLO_TIMEOUT`].
//!
//! A `HELLO` takes a rank's slot only with the right secret, this build's version, the root's
//! world size and a rank below it, and only if no `HELLO` took that slot before: a second
//! `HELLO` for a taken rank is refused and never displaces the first. Every refusal is answered
//! with `FAILED` (so that a misconfigured rank fails at once, saying why) and logged
//! ([`RootOptions::log`], stderr by default), and the job goes on waiting for the real rank. When
//! the deadline passes with ranks missing, every rank that joined gets `FAILED` naming the
//! missing ranks (and why a `HELLO` for them was refused, if one was).
//!
//! Then the root serves rounds: it reads one `CONTRIBUTE` from every rank in rank order and sends
//! every rank all the records. When every rank has closed its connection the root exits. A rank
//! that aborts, times out or closes early makes the root send `FAILED` naming it to every other
//! rank, so that all fail with the same cause instead of timing out one by one. Frames of joined
//! ranks may be up to [`MAX_FRAME`] bytes: they come from holders of the secret.

use core::fmt;
use core::str::FromStr;
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::BootstrapError;
use crate::codec::{Reader, Writer};

/// Largest frame accepted from a rank that has joined, in bytes.
pub const MAX_FRAME: usize = 16 << 20;
/// The most connections that may wait for their `HELLO` at once; a new connection beyond it
/// closes the oldest waiting one.
pub const MAX_PENDING: usize = 64;
/// The longest a connection may take to send its `HELLO` (less when the root's timeout is less).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Refusals logged one by one before the root only counts them.
const MAX_LOGGED: usize = 32;
/// The length field of a `HELLO` frame: tag + magic + version + rank + nranks.
const HELLO_LEN: usize = 1 + 8 + 4 + 4 + 4;
/// Stack of a thread that reads one `HELLO`.
const HELLO_THREAD_STACK: usize = 64 << 10;
const VERSION: u32 = 1;
const TAG_HELLO: u8 = 1;
const TAG_CONTRIBUTE: u8 = 2;
const TAG_ABORT: u8 = 3;
const TAG_GATHERED: u8 = 4;
const TAG_FAILED: u8 = 5;
const NO_RANK: u32 = u32::MAX;

/// NCCL's `ncclUniqueId`: names a communicator's rendezvous root (its TCP address) and carries
/// a random 64-bit magic, the communicator's secret (see the module's trust model). Rank 0 (or
/// any one process) creates it, hands it to every rank out of band (an environment variable, a
/// file, MPI), and every rank passes it to [`crate::Communicator::init`] with its rank.
///
/// Its text form (`Display` / `FromStr`) is `ADDRESS#MAGIC`, e.g. `10.0.0.1:29500#00c0ffee00c0ffee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    addr: SocketAddr,
    magic: u64,
}

/// How long a root created by [`UniqueId::new`] waits for ranks, and for each round.
pub const DEFAULT_ROOT_TIMEOUT: Duration = Duration::from_secs(120);

/// 64 random bits from the kernel (getrandom(2)): the magic of a new id, and the first PSNs of
/// the RoCE transport's QPs.
pub(crate) use super::secret::random_u64;

/// What a line of a rendezvous root's log reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RootLog {
    /// A rank joined (not written by the default log).
    Joined,
    /// A connection or a `HELLO` was refused, or a connection dropped before its `HELLO`.
    Refused,
}

/// Where a rendezvous root writes its log lines (from its own thread).
pub type RootLogger = Arc<dyn Fn(RootLog, &str) + Send + Sync>;

/// How a rendezvous root runs.
#[derive(Clone)]
pub struct RootOptions {
    /// The world size. `None` only for [`UniqueId::new`]: the first `HELLO` with the right
    /// secret sets it.
    pub nranks: Option<usize>,
    /// How long the root waits for every rank to join, and for each round.
    pub timeout: Duration,
    /// Where log lines go; `None`: [`RootLog::Refused`] lines to stderr, one write(2) each.
    pub log: Option<RootLogger>,
}

impl RootOptions {
    /// A root for `nranks` ranks waiting at most `timeout`, logging to stderr.
    pub fn new(nranks: usize, timeout: Duration) -> RootOptions {
        RootOptions {
            nranks: Some(nranks),
            timeout,
            log: None,
        }
    }
}

impl fmt::Debug for RootOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RootOptions")
            .field("nranks", &self.nranks)
            .field("timeout", &self.timeout)
            .field("log", &self.log.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl UniqueId {
    /// Starts a rendezvous root on `127.0.0.1` (an ephemeral port) in a background thread and
    /// returns its id: for ranks on this host. The root serves one communicator and exits; its
    /// world size is that of the first `HELLO` with the right secret (use
    /// [`UniqueId::listen`] to fix it).
    ///
    /// # Errors
    /// [`BootstrapError::Bind`], [`BootstrapError::Io`] when the root's thread cannot start.
    pub fn new() -> Result<UniqueId, BootstrapError> {
        Self::listen_with(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            RootOptions {
                nranks: None,
                timeout: DEFAULT_ROOT_TIMEOUT,
                log: None,
            },
        )
    }

    /// Starts a rendezvous root for `nranks` ranks listening on `bind` (a specific address other
    /// hosts can reach, port 0 for an ephemeral one), waiting at most `timeout` for ranks and for
    /// each round.
    ///
    /// # Errors
    /// As [`UniqueId::listen_with`].
    pub fn listen(
        bind: SocketAddr,
        nranks: usize,
        timeout: Duration,
    ) -> Result<UniqueId, BootstrapError> {
        Self::listen_with(bind, RootOptions::new(nranks, timeout))
    }

    /// Starts a rendezvous root run as `options` say, listening on `bind`, with a fresh random
    /// magic.
    ///
    /// # Errors
    /// [`BootstrapError::Bind`], also for an unspecified address (`0.0.0.0`), which peers could
    /// not connect to: use [`UniqueId::from_parts`] + [`UniqueId::serve`] to listen on all
    /// interfaces and advertise one address. [`BootstrapError::Io`] when the root's thread
    /// cannot start.
    pub fn listen_with(bind: SocketAddr, options: RootOptions) -> Result<UniqueId, BootstrapError> {
        if bind.ip().is_unspecified() {
            return Err(BootstrapError::Bind {
                addr: bind.to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an unspecified address cannot be advertised to peers",
                ),
            });
        }
        let listener = bind_listener(bind)?;
        let addr = listener
            .local_addr()
            .map_err(|source| BootstrapError::Bind {
                addr: bind.to_string(),
                source,
            })?;
        let id = UniqueId {
            addr,
            magic: random_u64(),
        };
        spawn_root(listener, id.magic, options)?;
        Ok(id)
    }

    /// An id for a root at `addr` with `magic`, without starting one (every rank of an
    /// environment bootstrap derives the same id; the rank that hosts the root then calls
    /// [`UniqueId::serve`]).
    pub const fn from_parts(addr: SocketAddr, magic: u64) -> UniqueId {
        UniqueId { addr, magic }
    }

    /// Starts the root of this id for `nranks` ranks, listening on `bind` (e.g. `0.0.0.0:PORT`).
    ///
    /// # Errors
    /// As [`UniqueId::serve_with`].
    pub fn serve(
        &self,
        bind: SocketAddr,
        nranks: usize,
        timeout: Duration,
    ) -> Result<(), BootstrapError> {
        self.serve_with(bind, RootOptions::new(nranks, timeout))
    }

    /// Starts the root of this id run as `options` say, listening on `bind`.
    ///
    /// # Errors
    /// [`BootstrapError::Bind`]; [`BootstrapError::Io`] when the root's thread cannot start.
    pub fn serve_with(&self, bind: SocketAddr, options: RootOptions) -> Result<(), BootstrapError> {
        let listener = bind_listener(bind)?;
        spawn_root(listener, self.magic, options)
    }

    /// The root's address.
    pub const fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The magic: the communicator's secret. Not to be shown where others can read it (a log,
    /// a file name); [`UniqueId::public_tag`] names the communicator instead.
    pub const fn magic(&self) -> u64 {
        self.magic
    }

    /// A 64-bit name of this communicator that tells nothing of its magic (a keyed one-way
    /// hash of it): for names others can see, such as shared-memory segments.
    pub fn public_tag(&self) -> u64 {
        super::secret::public_tag(self.magic)
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{:016x}", self.addr, self.magic)
    }
}

impl FromStr for UniqueId {
    type Err = BootstrapError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |what| BootstrapError::BadUniqueId {
            given: s.to_string(),
            what,
        };
        let (addr, magic) = s
            .rsplit_once('#')
            .ok_or_else(|| bad("expected ADDRESS#MAGIC"))?;
        let addr = addr
            .parse::<SocketAddr>()
            .map_err(|_| bad("address is not IP:PORT"))?;
        let magic = u64::from_str_radix(magic, 16).map_err(|_| bad("magic is not hex"))?;
        Ok(UniqueId { addr, magic })
    }
}

fn bind_listener(bind: SocketAddr) -> Result<TcpListener, BootstrapError> {
    TcpListener::bind(bind).map_err(|source| BootstrapError::Bind {
        addr: bind.to_string(),
        source,
    })
}

fn spawn_root(
    listener: TcpListener,
    magic: u64,
    options: RootOptions,
) -> Result<(), BootstrapError> {
    let io_err = |during, source| BootstrapError::Io { during, source };
    // The acceptor polls, so that it can stop when every rank has joined.
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("making the rendezvous socket non-blocking", e))?;
    std::thread::Builder::new()
        .name("coll-rendezvous".into())
        .spawn(move || Root::serve(listener, magic, options))
        .map(|_| ())
        .map_err(|e| io_err("starting the rendezvous root thread", e))
}

/// The root's state.
struct Root {
    conns: Vec<Option<TcpStream>>,
    timeout: Duration,
    log: RootLogger,
    /// Refusals and drops so far; those of connections without the secret; how many of these
    /// were not logged one by one.
    refused: usize,
    strangers: usize,
    unlogged: usize,
}

/// What one rank did in a round.
enum Turn {
    Record(Vec<u8>),
    Closed,
    Failed(String),
}

/// A `HELLO` with the right secret, read by a connection's thread.
struct Hello {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    version: u32,
    rank: u32,
    nranks: u32,
}

/// What a connection's thread tells the root.
enum Event {
    Hello(Hello),
    /// A connection that did not bring a valid `HELLO` with the right secret.
    Dropped {
        peer: Option<SocketAddr>,
        why: String,
    },
}

/// Connections waiting for their `HELLO`: (id, a handle to shut each down).
type Pending = Arc<Mutex<VecDeque<(u64, TcpStream)>>>;

fn default_log(addr: Option<SocketAddr>) -> RootLogger {
    let at = addr.map_or(String::new(), |a| format!(" {a}"));
    Arc::new(move |kind, line| {
        if kind == RootLog::Refused {
            // One write(2), so that lines of several processes sharing stderr do not splice.
            let line = format!("coll: rendezvous root{at}: {line}\n");
            let _ = io::stderr().lock().write_all(line.as_bytes());
        }
    })
}

impl Root {
    fn serve(listener: TcpListener, magic: u64, options: RootOptions) {
        let log = options
            .log
            .clone()
            .unwrap_or_else(|| default_log(listener.local_addr().ok()));
        let mut root = Root {
            conns: Vec::new(),
            timeout: options.timeout,
            log,
            refused: 0,
            strangers: 0,
            unlogged: 0,
        };
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let hello_timeout = options.timeout.min(HELLO_TIMEOUT);
        let acceptor = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("coll-rdv-accept".into())
                .spawn(move || accept_loop(&listener, magic, hello_timeout, &tx, &stop))
        };
        let joined = match acceptor {
            Ok(_) => root.join(&rx, options.nranks),
            Err(e) => Err((
                None,
                format!("rendezvous root cannot start its acceptor: {e}"),
            )),
        };
        // The acceptor sees this within one poll and closes the listening socket.
        stop.store(true, Ordering::Relaxed);
        if root.unlogged > 0 {
            (root.log)(
                RootLog::Refused,
                &format!(
                    "{} connections refused in all ({} not logged one by one)",
                    root.refused, root.unlogged
                ),
            );
        }
        if let Err((rank, message)) = joined {
            return root.fail(rank, &message);
        }
        drop(rx);
        let timeout = root.timeout;
        for round in 0u32.. {
            let deadline = Instant::now() + timeout;
            let turns: Vec<Turn> = (0..root.conns.len())
                .map(|r| root.turn(r, round, deadline))
                .collect();
            if turns.iter().all(|t| matches!(t, Turn::Closed)) {
                return;
            }
            let fault = turns.iter().enumerate().find_map(|(r, t)| match t {
                Turn::Record(_) => None,
                Turn::Closed => Some((r, format!("rank {r} left the rendezvous early"))),
                Turn::Failed(m) => Some((r, m.clone())),
            });
            if let Some((rank, message)) = fault {
                return root.fail(Some(rank), &message);
            }
            let mut w = Writer::default();
            w.u32(round).u32(turns.len() as u32);
            for t in &turns {
                if let Turn::Record(rec) = t {
                    w.bytes(rec);
                }
            }
            for conn in root.conns.iter_mut().flatten() {
                let _ = write_frame(conn, TAG_GATHERED, &w.buf, timeout);
            }
        }
    }

    /// Logs a refusal. Those of connections without the secret (strangers: as many as anyone
    /// cares to make) are logged one by one for the first [`MAX_LOGGED`], then only counted;
    /// those of `HELLO`s with the right secret (a misconfigured or duplicate rank) always.
    fn refuse_log(&mut self, line: &str, had_secret: bool) {
        self.refused += 1;
        if had_secret {
            return (self.log)(RootLog::Refused, line);
        }
        self.strangers += 1;
        if self.strangers <= MAX_LOGGED {
            (self.log)(RootLog::Refused, line);
            if self.strangers == MAX_LOGGED {
                (self.log)(
                    RootLog::Refused,
                    "further connections without the secret are counted, not logged one by one",
                );
            }
        } else {
            self.unlogged += 1;
        }
    }

    /// Takes `HELLO`s until every rank has joined (the world size: `nranks`, or that of the
    /// first `HELLO`). `Err((rank at fault, message))` at the deadline.
    fn join(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        mut nranks: Option<usize>,
    ) -> Result<(), (Option<usize>, String)> {
        let deadline = Instant::now() + self.timeout;
        if let Some(n) = nranks {
            self.conns.resize_with(n, || None);
        }
        // Why the last refused HELLO with the right secret for a rank was refused, for the
        // message when that rank is missing at the deadline.
        let mut refused_for: BTreeMap<usize, String> = BTreeMap::new();
        loop {
            if nranks.is_some() && self.conns.iter().all(Option::is_some) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.missing(&refused_for));
            }
            let hello = match rx.recv_timeout(left) {
                Ok(Event::Hello(h)) => h,
                Ok(Event::Dropped { peer, why }) => {
                    self.refuse_log(&format!("{}: {why}", peer_name(peer)), false);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err((None, "the rendezvous root stopped accepting".into()))
                }
            };
            let (rank, theirs) = (hello.rank as usize, hello.nranks as usize);
            let expected = nranks.unwrap_or(theirs);
            let refusal = if hello.version != VERSION {
                Some(format!(
                    "rank {rank} speaks rendezvous version {}, the root {VERSION}",
                    hello.version
                ))
            } else if theirs != expected {
                Some(format!(
                    "a HELLO for rank {rank} claims world size {theirs}, the root's is {expected}"
                ))
            } else if rank >= expected {
                Some(format!(
                    "a HELLO for rank {rank} is out of range for {expected} ranks"
                ))
            } else if self.conns.get(rank).is_some_and(Option::is_some) {
                Some(format!(
                    "a second HELLO for rank {rank}, which has joined already (the first stays)"
                ))
            } else {
                None
            };
            let mut stream = hello.stream;
            match refusal {
                None => {
                    if nranks.is_none() {
                        nranks = Some(theirs);
                        self.conns.resize_with(theirs, || None);
                    }
                    (self.log)(
                        RootLog::Joined,
                        &format!(
                            "rank {rank} of {expected} joined ({})",
                            peer_name(hello.peer)
                        ),
                    );
                    self.conns[rank] = Some(stream);
                }
                Some(why) => {
                    // Tell it why (it holds the secret: a misconfigured rank fails at once,
                    // saying so), without letting a peer that does not read stall the root.
                    let _ = stream.set_nonblocking(true);
                    let _ = write_frame_now(
                        &mut stream,
                        TAG_FAILED,
                        &failed_payload(Some(rank), &format!("refused: {why}")),
                    );
                    self.refuse_log(&format!("{}: refused: {why}", peer_name(hello.peer)), true);
                    if rank < expected {
                        refused_for.insert(rank, why);
                    }
                }
            }
        }
    }

    /// The verdict at the deadline: which ranks are missing, and why a HELLO for them was
    /// refused if one was.
    fn missing(&self, refused_for: &BTreeMap<usize, String>) -> (Option<usize>, String) {
        let missing: Vec<usize> = (0..self.conns.len())
            .filter(|&r| self.conns[r].is_none())
            .collect();
        let ms = self.timeout.as_millis();
        if self.conns.is_empty() || missing.len() == self.conns.len() {
            return (None, format!("no rank joined within {ms} ms"));
        }
        let list: Vec<String> = missing.iter().map(usize::to_string).collect();
        let reasons: Vec<&str> = missing
            .iter()
            .filter_map(|r| refused_for.get(r).map(String::as_str))
            .collect();
        let mut message = format!("rank(s) {} did not join within {ms} ms", list.join(", "));
        if !reasons.is_empty() {
            message.push_str(&format!(" ({})", reasons.join("; ")));
        }
        (missing.first().copied(), message)
    }

    fn turn(&mut self, rank: usize, round: u32, deadline: Instant) -> Turn {
        let Some(conn) = self.conns[rank].as_mut() else {
            return Turn::Closed;
        };
        match read_frame(conn, deadline) {
            Ok((TAG_CONTRIBUTE, body)) => {
                let mut r = Reader::new(&body);
                match (r.u32("round"), r.bytes("record")) {
                    (Ok(their), Ok(rec)) if their == round => Turn::Record(rec.to_vec()),
                    (Ok(their), Ok(_)) => Turn::Failed(format!(
                        "rank {rank} is at rendezvous round {their}, the others at {round}"
                    )),
                    _ => Turn::Failed(format!("rank {rank} sent a malformed record")),
                }
            }
            Ok((TAG_ABORT, body)) => {
                let message = Reader::new(&body)
                    .str("message")
                    .unwrap_or_else(|_| "aborted".into());
                Turn::Failed(message)
            }
            Ok((tag, _)) => Turn::Failed(format!("rank {rank} sent unexpected frame tag {tag}")),
            Err(FrameError::Closed) => {
                self.conns[rank] = None;
                Turn::Closed
            }
            Err(FrameError::Timeout) => Turn::Failed(format!(
                "rank {rank} sent nothing for {} ms (round {round})",
                self.timeout.as_millis()
            )),
            Err(FrameError::Malformed(m)) => {
                Turn::Failed(format!("rank {rank} sent a bad frame: {m}"))
            }
            Err(FrameError::Io(e)) => {
                Turn::Failed(format!("connection to rank {rank} failed: {e}"))
            }
        }
    }

    fn fail(&mut self, rank: Option<usize>, message: &str) {
        let payload = failed_payload(rank, message);
        for conn in self.conns.iter_mut().flatten() {
            let _ = write_frame(
                conn,
                TAG_FAILED,
                &payload,
                self.timeout.min(Duration::from_secs(5)),
            );
        }
    }
}

fn peer_name(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "a connection".into(), |a| format!("connection from {a}"))
}

/// Accepts connections until `stop`, each read by a thread of its own ([`read_hello`]); at most
/// [`MAX_PENDING`] wait for their `HELLO` at once (a new one closes the oldest).
fn accept_loop(
    listener: &TcpListener,
    magic: u64,
    hello_timeout: Duration,
    tx: &mpsc::Sender<Event>,
    stop: &AtomicBool,
) {
    let pending: Pending = Arc::default();
    let mut next_id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (stream, peer) = match listener.accept() {
            Ok(c) => c,
            // Nothing to accept, or out of descriptors (EMFILE): look again shortly.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        {
            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() >= MAX_PENDING {
                if let Some((_, oldest)) = p.pop_front() {
                    // Its thread's read fails at once and it reports the drop.
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            p.push_back((id, handle));
        }
        let (tx_t, pending_t) = (tx.clone(), pending.clone());
        let spawned = std::thread::Builder::new()
            .name("coll-rdv-hello".into())
            .stack_size(HELLO_THREAD_STACK)
            .spawn(move || {
                let read = read_hello(stream, magic, Instant::now() + hello_timeout);
                // Gone from the queue unless this thread removes it: the acceptor closed it.
                let evicted = {
                    let mut p = pending_t.lock().unwrap_or_else(|e| e.into_inner());
                    let queued = p.iter().any(|(i, _)| *i == id);
                    p.retain(|(i, _)| *i != id);
                    !queued
                };
                let event = match read {
                    _ if evicted => Event::Dropped {
                        peer: Some(peer),
                        why: format!(
                            "closed by the root: the oldest of more than {MAX_PENDING} \
                             connections waiting for their HELLO"
                        ),
                    },
                    Ok(h) => Event::Hello(h),
                    Err(why) => Event::Dropped {
                        peer: Some(peer),
                        why,
                    },
                };
                let _ = tx_t.send(event);
            });
        if spawned.is_err() {
            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = p.iter().position(|(i, _)| *i == id) {
                if let Some((_, s)) = p.remove(i) {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
            let _ = tx.send(Event::Dropped {
                peer: Some(peer),
                why: "dropped: no thread to read its HELLO".into(),
            });
        }
    }
}

/// Reads the first frame of a new connection, which must be a `HELLO` with `magic`, before
/// `deadline`. Reads 4 + 21 bytes at most: a first frame of another length is refused unread.
/// `Err(why)` for the log.
fn read_hello(mut stream: TcpStream, magic: u64, deadline: Instant) -> Result<Hello, String> {
    let peer = stream.peer_addr().ok();
    stream
        .set_nonblocking(false)
        .map_err(|e| format!("dropped: {e}"))?;
    let _ = stream.set_nodelay(true);
    let waited = |e: FrameError| match e {
        FrameError::Closed => "closed without a HELLO".to_string(),
        FrameError::Timeout => "sent no complete HELLO in time".to_string(),
        FrameError::Malformed(m) => format!("malformed: {m}"),
        FrameError::Io(e) => format!("dropped before its HELLO: {e}"),
    };
    let mut len = [0u8; 4];
    read_exact_by(&mut stream, &mut len, deadline).map_err(waited)?;
    let len = u32::from_le_bytes(len) as usize;
    if len != HELLO_LEN {
        return Err(format!(
            "refused: a first frame of {len} bytes (a HELLO has {HELLO_LEN})"
        ));
    }
    let mut body = [0u8; HELLO_LEN];
    read_exact_by(&mut stream, &mut body, deadline).map_err(|e| match e {
        FrameError::Closed => "closed in the middle of its HELLO".to_string(),
        e => waited(e),
    })?;
    if body[0] != TAG_HELLO {
        return Err(format!(
            "refused: a first frame with tag {}, not HELLO",
            body[0]
        ));
    }
    // Fixed layout (the length was checked): tag, magic u64, version, rank, nranks u32, LE.
    let u32_at = |o: usize| u32::from_le_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
    let their_magic = u64::from(u32_at(1)) | u64::from(u32_at(5)) << 32;
    let (version, rank, nranks) = (u32_at(9), u32_at(13), u32_at(17));
    if their_magic != magic {
        // Tell a misconfigured rank why it is dropped; a stranger learns only that its guess
        // was wrong.
        let _ = stream.set_nonblocking(true);
        let _ = write_frame_now(
            &mut stream,
            TAG_FAILED,
            &failed_payload(
                None,
                "refused by the rendezvous root: wrong secret (the magic of the unique id)",
            ),
        );
        return Err(format!(
            "refused: a HELLO for rank {rank} with a wrong secret"
        ));
    }
    Ok(Hello {
        stream,
        peer,
        version,
        rank,
        nranks,
    })
}

/// Why a frame could not be read.
#[derive(Debug)]
enum FrameError {
    /// The peer closed the connection before a frame started.
    Closed,
    /// The deadline passed.
    Timeout,
    /// Over [`MAX_FRAME`] or empty.
    Malformed(String),
    Io(io::Error),
}

fn write_frame(
    stream: &mut TcpStream,
    tag: u8,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    stream.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    write_frame_now(stream, tag, payload)
}

/// Writes a frame with the stream's current blocking mode and timeout (on a non-blocking
/// stream: what fits in the socket's buffer now, best effort).
fn write_frame_now(stream: &mut TcpStream, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
    buf.push(tag);
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(FrameError::Timeout);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(FrameError::Io)?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(if done == 0 {
                    FrameError::Closed
                } else {
                    FrameError::Io(io::ErrorKind::UnexpectedEof.into())
                })
            }
            Ok(n) => done += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(FrameError::Timeout)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

fn read_frame(stream: &mut TcpStream, deadline: Instant) -> Result<(u8, Vec<u8>), FrameError> {
    let mut len = [0u8; 4];
    read_exact_by(stream, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(FrameError::Malformed(format!("frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    read_exact_by(stream, &mut body, deadline).map_err(|e| match e {
        FrameError::Closed => FrameError::Io(io::ErrorKind::UnexpectedEof.into()),
        e => e,
    })?;
    let tag = body.remove(0);
    Ok((tag, body))
}

fn failed_payload(rank: Option<usize>, message: &str) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(rank.map_or(NO_RANK, |r| r as u32)).str(message);
    w.buf
}

/// The error a `FAILED` frame's payload tells.
fn failed_error(body: &[u8]) -> BootstrapError {
    let mut r = Reader::new(body);
    let rank = r.u32("rank").unwrap_or(NO_RANK);
    let message = r.str("message").unwrap_or_default();
    BootstrapError::RankFailed {
        rank: (rank != NO_RANK).then_some(rank as usize),
        message,
    }
}

/// A rank's connection to the rendezvous root.
#[derive(Debug)]
pub struct Rendezvous {
    stream: TcpStream,
    rank: usize,
    nranks: usize,
    round: u32,
    timeout: Duration,
}

impl Rendezvous {
    /// Connects to the root of `id` as `rank` of `nranks`, retrying with backoff (10 ms doubling
    /// to 500 ms) until `timeout`: the root may not be listening yet.
    ///
    /// # Errors
    /// [`BootstrapError::Connect`] after the deadline, [`BootstrapError::Io`].
    pub fn connect(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        timeout: Duration,
    ) -> Result<Rendezvous, BootstrapError> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(10);
        let mut attempts = 0;
        let mut stream = loop {
            attempts += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(
                &id.addr,
                left.clamp(Duration::from_millis(1), Duration::from_secs(2)),
            ) {
                Ok(s) => break s,
                Err(source) => {
                    if Instant::now() + backoff >= deadline {
                        return Err(BootstrapError::Connect {
                            addr: id.addr.to_string(),
                            attempts,
                            source,
                        });
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let mut w = Writer::default();
        w.u64(id.magic)
            .u32(VERSION)
            .u32(rank as u32)
            .u32(nranks as u32);
        write_frame(&mut stream, TAG_HELLO, &w.buf, timeout).map_err(|source| {
            BootstrapError::Io {
                during: "hello",
                source,
            }
        })?;
        Ok(Rendezvous {
            stream,
            rank,
            nranks,
            round: 0,
            timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The local address of the connection to the root: the address of this host on the route
    /// to the root, which other ranks can usually reach too (NCCL picks its bootstrap interface
    /// the same way). `None` if the socket cannot tell.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stream.local_addr().ok()
    }

    /// Contributes `record` and returns every rank's record, index = rank.
    ///
    /// # Errors
    /// [`BootstrapError::RankFailed`] when the root reports a failed rank (or itself goes away),
    /// [`BootstrapError::Timeout`], [`BootstrapError::BadRecord`], [`BootstrapError::Io`].
    pub fn all_gather(&mut self, record: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let round = self.round;
        let mut w = Writer::default();
        w.u32(round).bytes(record);
        if let Err(source) = write_frame(&mut self.stream, TAG_CONTRIBUTE, &w.buf, self.timeout) {
            // The root may have refused this rank and closed: its FAILED says why.
            if let Ok((TAG_FAILED, body)) =
                read_frame(&mut self.stream, Instant::now() + Duration::from_secs(1))
            {
                return Err(failed_error(&body));
            }
            return Err(BootstrapError::Io {
                during: "contributing a record",
                source,
            });
        }
        // The root's own deadline per round is `timeout`; wait a little longer, so that when a
        // rank stalls every rank hears the root's verdict naming it rather than its own timeout.
        let wait = self.timeout + self.timeout / 2 + Duration::from_secs(1);
        let bad = |what: String| BootstrapError::BadRecord {
            rank: usize::MAX,
            what,
        };
        match read_frame(&mut self.stream, Instant::now() + wait) {
            Ok((TAG_GATHERED, body)) => {
                let mut r = Reader::new(&body);
                let their_round = r.u32("round").map_err(|e| bad(e.to_string()))?;
                let n = r.u32("nranks").map_err(|e| bad(e.to_string()))? as usize;
                if their_round != round || n != self.nranks {
                    return Err(bad(format!(
                        "round {their_round} with {n} records, expected round {round} with {}",
                        self.nranks
                    )));
                }
                let records = (0..n)
                    .map(|_| r.bytes("record").map(<[u8]>::to_vec))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(e.to_string()))?;
                self.round += 1;
                Ok(records)
            }
            Ok((TAG_FAILED, body)) => Err(failed_error(&body)),
            Ok((tag, _)) => Err(bad(format!("unexpected frame tag {tag}"))),
            Err(FrameError::Timeout) => Err(BootstrapError::Timeout {
                waiting_for: format!("the all-gather of round {round}"),
                after_ms: wait.as_millis(),
            }),
            Err(FrameError::Closed) => Err(BootstrapError::RankFailed {
                rank: None,
                message:
                    "the rendezvous root closed the connection (has the process hosting it exited?)"
                        .into(),
            }),
            Err(FrameError::Malformed(m)) => Err(bad(m)),
            Err(FrameError::Io(source)) => Err(BootstrapError::Io {
                during: "waiting for an all-gather",
                source,
            }),
        }
    }

    /// Waits until every rank has reached the same round.
    ///
    /// # Errors
    /// As [`Rendezvous::all_gather`].
    pub fn barrier(&mut self) -> Result<(), BootstrapError> {
        self.all_gather(&[]).map(|_| ())
    }

    /// Tells the root that this rank fails with `message`; the root relays it to every rank.
    /// Best effort: errors are ignored (the connection may already be gone).
    pub fn abort(&mut self, message: &str) {
        let mut w = Writer::default();
        w.str(message);
        let _ = write_frame(&mut self.stream, TAG_ABORT, &w.buf, Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks<T: Send + 'static>(
        id: UniqueId,
        n: usize,
        f: impl Fn(usize, Rendezvous) -> T + Send + Sync + Copy + 'static,
    ) -> Vec<T> {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let rv = Rendezvous::connect(&id, r, n, Duration::from_secs(10)).unwrap();
                    f(r, rv)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_gather_rounds_and_barrier() {
        let id = UniqueId::new().unwrap();
        let out = ranks(id, 4, |r, mut rv| {
            let a = rv.all_gather(&[r as u8; 3]).unwrap();
            rv.barrier().unwrap();
            let b = rv.all_gather(format!("rank{r}").as_bytes()).unwrap();
            (a, b)
        });
        for (a, b) in out {
            assert_eq!(a, (0..4u8).map(|r| vec![r; 3]).collect::<Vec<_>>());
            assert_eq!(b[3], b"rank3");
        }
    }

    #[test]
    fn an_aborting_rank_is_named_to_every_rank() {
        let id = UniqueId::new().unwrap();
        let out = ranks(id, 3, |r, mut rv| {
            rv.all_gather(b"card").unwrap();
            if r == 1 {
                rv.abort("shm_open failed");
                return None;
            }
            Some(rv.all_gather(b"info").unwrap_err())
        });
        for e in out.into_iter().flatten() {
            assert!(
                matches!(&e, BootstrapError::RankFailed { rank: Some(1), message } if message.contains("shm_open")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_missing_rank_times_out_named() {
        let id = UniqueId::listen(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            3,
            Duration::from_millis(300),
        )
        .unwrap();
        // Ranks 0 and 2 of 3 join; rank 1 never does.
        let hs: Vec<_> = [0usize, 2]
            .into_iter()
            .map(|r| {
                std::thread::spawn(move || {
                    let mut rv =
                        Rendezvous::connect(&id, r, 3, Duration::from_millis(300)).unwrap();
                    rv.all_gather(b"x").unwrap_err()
                })
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap();
            assert!(e.to_string().contains("rank(s) 1 did not join"), "{e}");
        }
    }

    /// A rank started with another world size is refused at once, saying so; the rank that
    /// waits for it hears, at the deadline, that it did not join and why.
    #[test]
    fn world_size_disagreement_is_refused_and_named() {
        let id = UniqueId::listen(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            2,
            Duration::from_secs(2),
        )
        .unwrap();
        let a = std::thread::spawn(move || {
            let mut rv = Rendezvous::connect(&id, 0, 2, Duration::from_secs(2)).unwrap();
            rv.all_gather(b"x").unwrap_err()
        });
        let mut rv = Rendezvous::connect(&id, 1, 3, Duration::from_secs(2)).unwrap();
        let e = rv.all_gather(b"x").unwrap_err();
        assert!(e.to_string().contains("world size 3"), "{e}");
        let e = a.join().unwrap();
        assert!(
            e.to_string().contains("rank(s) 1 did not join")
                && e.to_string().contains("world size 3"),
            "{e}"
        );
    }

    #[test]
    fn unique_id_text_form() {
        let id = UniqueId::from_parts("10.1.2.3:29500".parse().unwrap(), 0xc0ffee);
        let s = id.to_string();
        assert_eq!(s, "10.1.2.3:29500#0000000000c0ffee");
        assert_eq!(s.parse::<UniqueId>().unwrap(), id);
        assert!("nohash".parse::<UniqueId>().is_err());
        assert!("1.2.3.4#12".parse::<UniqueId>().is_err());
        assert!("[::1]:5#zz".parse::<UniqueId>().is_err());
        assert!(UniqueId::listen("0.0.0.0:0".parse().unwrap(), 1, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn connect_gives_up_after_the_deadline() {
        // A port nothing listens on (bound and dropped).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let id = UniqueId::from_parts(port, 1);
        let t = Instant::now();
        let e = Rendezvous::connect(&id, 0, 1, Duration::from_millis(200)).unwrap_err();
        assert!(
            matches!(e, BootstrapError::Connect { attempts, .. } if attempts >= 2),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
