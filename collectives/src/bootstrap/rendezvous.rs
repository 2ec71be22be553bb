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
//! The root accepts connections until every rank has said hello (a connection with the wrong
//! magic is a stray and is dropped), then serves rounds: it reads one `CONTRIBUTE` from every rank
//! in rank order and sends every rank all the records. When every rank has closed its connection
//! the root exits. A rank that aborts, times out, closes early, or disagrees on the world size
//! makes the root send `FAILED` naming it to every other rank, so that all fail with the same
//! cause instead of timing out one by one.

use core::fmt;
use core::str::FromStr;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::BootstrapError;
use crate::codec::{Reader, Writer};

/// Largest frame accepted, in bytes.
pub const MAX_FRAME: usize = 16 << 20;
const VERSION: u32 = 1;
const TAG_HELLO: u8 = 1;
const TAG_CONTRIBUTE: u8 = 2;
const TAG_ABORT: u8 = 3;
const TAG_GATHERED: u8 = 4;
const TAG_FAILED: u8 = 5;
const NO_RANK: u32 = u32::MAX;

/// NCCL's `ncclUniqueId`: names a communicator's rendezvous root (its TCP address) and carries
/// a random 64-bit magic that tells its connections from strays. Rank 0 (or any one process)
/// creates it, hands it to every rank out of band (an environment variable, a file, MPI), and
/// every rank passes it to [`crate::Communicator::init`] with its rank.
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

impl UniqueId {
    /// Starts a rendezvous root on `127.0.0.1` (an ephemeral port) in a background thread and
    /// returns its id: for ranks on this host. The root serves one communicator and exits.
    ///
    /// # Errors
    /// [`BootstrapError::Bind`].
    pub fn new() -> Result<UniqueId, BootstrapError> {
        Self::listen(SocketAddr::from(([127, 0, 0, 1], 0)), DEFAULT_ROOT_TIMEOUT)
    }

    /// Starts a rendezvous root listening on `bind` (a specific address other hosts can reach,
    /// port 0 for an ephemeral one), waiting at most `timeout` for ranks and for each round.
    ///
    /// # Errors
    /// [`BootstrapError::Bind`], also for an unspecified address (`0.0.0.0`), which peers could
    /// not connect to: use [`UniqueId::from_parts`] + [`UniqueId::serve`] to listen on all
    /// interfaces and advertise one address.
    pub fn listen(bind: SocketAddr, timeout: Duration) -> Result<UniqueId, BootstrapError> {
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
        spawn_root(listener, id.magic, timeout)?;
        Ok(id)
    }

    /// An id for a root at `addr` with `magic`, without starting one (every rank of an
    /// environment bootstrap derives the same id; the rank that hosts the root then calls
    /// [`UniqueId::serve`]).
    pub const fn from_parts(addr: SocketAddr, magic: u64) -> UniqueId {
        UniqueId { addr, magic }
    }

    /// Starts the root of this id, listening on `bind` (e.g. `0.0.0.0:PORT`).
    ///
    /// # Errors
    /// [`BootstrapError::Bind`].
    pub fn serve(&self, bind: SocketAddr, timeout: Duration) -> Result<(), BootstrapError> {
        let listener = bind_listener(bind)?;
        spawn_root(listener, self.magic, timeout)
    }

    /// The root's address.
    pub const fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The magic.
    pub const fn magic(&self) -> u64 {
        self.magic
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

fn spawn_root(listener: TcpListener, magic: u64, timeout: Duration) -> Result<(), BootstrapError> {
    std::thread::Builder::new()
        .name("coll-rendezvous".into())
        .spawn(move || Root::serve(listener, magic, timeout))
        .map(|_| ())
        .map_err(|source| BootstrapError::Io {
            during: "starting the rendezvous root thread",
            source,
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

/// The root's state.
struct Root {
    conns: Vec<Option<TcpStream>>,
    timeout: Duration,
}

/// What one rank did in a round.
enum Turn {
    Record(Vec<u8>),
    Closed,
    Failed(String),
}

impl Root {
    fn serve(listener: TcpListener, magic: u64, timeout: Duration) {
        let mut root = Root {
            conns: Vec::new(),
            timeout,
        };
        match root.accept_all(&listener, magic) {
            Ok(()) => {}
            Err((rank, message)) => return root.fail(rank, &message),
        }
        drop(listener);
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

    /// Accepts until every rank said hello. `Err((rank at fault, message))`.
    fn accept_all(
        &mut self,
        listener: &TcpListener,
        magic: u64,
    ) -> Result<(), (Option<usize>, String)> {
        let deadline = Instant::now() + self.timeout;
        let joined = |conns: &Vec<Option<TcpStream>>| conns.iter().filter(|c| c.is_some()).count();
        if listener.set_nonblocking(true).is_err() {
            return Err((None, "rendezvous root cannot poll its socket".into()));
        }
        while self.conns.is_empty() || joined(&self.conns) < self.conns.len() {
            if Instant::now() >= deadline {
                let missing: Vec<String> = self
                    .conns
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                let first = self.conns.iter().position(Option::is_none);
                return Err((
                    first,
                    if missing.is_empty() {
                        format!("no rank joined within {} ms", self.timeout.as_millis())
                    } else {
                        format!(
                            "rank(s) {} did not join within {} ms",
                            missing.join(", "),
                            self.timeout.as_millis()
                        )
                    },
                ));
            }
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(_) => continue,
            };
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let hello_deadline = Instant::now() + self.timeout.min(Duration::from_secs(10));
            let Ok((TAG_HELLO, body)) = read_frame(&mut stream, hello_deadline) else {
                continue; // a stray or a broken connection: not one of ours
            };
            let mut r = Reader::new(&body);
            let (Ok(their_magic), Ok(version), Ok(rank), Ok(nranks)) = (
                r.u64("magic"),
                r.u32("version"),
                r.u32("rank"),
                r.u32("nranks"),
            ) else {
                continue;
            };
            if their_magic != magic {
                continue;
            }
            let (rank, nranks) = (rank as usize, nranks as usize);
            let fault = if version != VERSION {
                Some(format!(
                    "rank {rank} speaks rendezvous version {version}, the root {VERSION}"
                ))
            } else if nranks == 0 || rank >= nranks {
                Some(format!("rank {rank} is out of range for {nranks} ranks"))
            } else if !self.conns.is_empty() && nranks != self.conns.len() {
                Some(format!(
                    "rank {rank} was started with {nranks} ranks, others with {}",
                    self.conns.len()
                ))
            } else if self.conns.get(rank).is_some_and(Option::is_some) {
                Some(format!("rank {rank} joined twice"))
            } else {
                None
            };
            if let Some(message) = fault {
                let _ = write_frame(
                    &mut stream,
                    TAG_FAILED,
                    &failed_payload(Some(rank), &message),
                    self.timeout,
                );
                return Err((Some(rank), message));
            }
            if self.conns.is_empty() {
                self.conns.resize_with(nranks, || None);
            }
            self.conns[rank] = Some(stream);
        }
        Ok(())
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

fn failed_payload(rank: Option<usize>, message: &str) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(rank.map_or(NO_RANK, |r| r as u32)).str(message);
    w.buf
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
        write_frame(&mut self.stream, TAG_CONTRIBUTE, &w.buf, self.timeout).map_err(|source| {
            BootstrapError::Io {
                during: "contributing a record",
                source,
            }
        })?;
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
            Ok((TAG_FAILED, body)) => {
                let mut r = Reader::new(&body);
                let rank = r.u32("rank").unwrap_or(NO_RANK);
                let message = r.str("message").unwrap_or_default();
                Err(BootstrapError::RankFailed {
                    rank: (rank != NO_RANK).then_some(rank as usize),
                    message,
                })
            }
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

    #[test]
    fn world_size_disagreement_fails_everyone() {
        let id = UniqueId::listen(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            Duration::from_secs(2),
        )
        .unwrap();
        let a = std::thread::spawn(move || {
            let mut rv = Rendezvous::connect(&id, 0, 2, Duration::from_secs(2)).unwrap();
            rv.all_gather(b"x").unwrap_err()
        });
        std::thread::sleep(Duration::from_millis(50));
        let mut rv = Rendezvous::connect(&id, 1, 3, Duration::from_secs(2)).unwrap();
        let e = rv.all_gather(b"x").unwrap_err();
        assert!(e.to_string().contains("3 ranks"), "{e}");
        let e = a.join().unwrap();
        assert!(e.to_string().contains("rank 1"), "{e}");
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
        assert!(UniqueId::listen("0.0.0.0:0".parse().unwrap(), Duration::from_secs(1)).is_err());
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
