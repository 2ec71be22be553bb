//! The communicator: NCCL's `ncclComm`, a group of ranks connected for collectives.
//!
//! * this file: the [`Communicator`], its setup (rendezvous, topology, transport setup and
//!   connect), its accessors, and how one operation runs and aborts;
//! * `args`: the argument checks of every operation, one table of rules;
//! * [`config`]: [`CommConfig`] and its environment overrides;
//! * `collective`: the collectives (`all_reduce` .. `barrier`), each in place and out of place;
//! * `p2p`: point-to-point `send` / `recv` / `send_recv`.

use crate::algorithms::{doubling, Op, PeerRecv, PeerSend};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::store::StoreRendezvous;
use crate::bootstrap::{
    host_id, hostname, BootstrapError, BusinessCard, Exchange, LaunchInfo, Rendezvous, Store,
    UniqueId,
};
use crate::codec::{Reader, Writer};
use crate::datatype::{DataType, RedOp};
use crate::error::{CollError, InitError};
use crate::topology::{self, Path};
use crate::transport::roce::RoceTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::{
    Abort, AbortReason, OpDesc, SetupContext, Transport, TransportError, TransportKind, WaitPolicy,
};

pub(crate) mod args;
mod check;
mod collective;
mod config;
mod p2p;
mod split;

pub use config::CommConfig;

/// Ends the operations of one [`Communicator`] from any thread (NCCL's `ncclCommAbort`, called
/// from a watchdog): the operation in progress gives up within
/// [`WAIT_SLICE`](crate::algorithms::WAIT_SLICE) of a wait with [`CollError::Cancelled`], the
/// communicator is aborted (its peers are told and fail too), and later operations return
/// [`CollError::Aborted`]. Cheap to clone; `Send + Sync`.
#[derive(Debug, Clone)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Requests the abort; returns at once.
    pub fn abort(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`abort`](Self::abort) was called.
    pub fn is_aborted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A communicator: `nranks` ranks connected for collectives and point-to-point operations
/// (NCCL's `ncclComm_t`).
///
/// Every operation blocks until this rank's part is done and everything it sent has been
/// consumed by its receivers. Buffers are bytes in native order: `count` elements of the given
/// [`DataType`], at any alignment; a buffer may be longer than needed (only the first `count`
/// elements are used). Operations named `*_in_place` use one buffer for input and output with
/// NCCL's in-place layouts.
///
/// After any error the communicator is *aborted*: every peer is told, so that they fail
/// promptly too, and later operations return [`CollError::Aborted`]. Dropping it closes its
/// connections; a peer still waiting on it gets an error naming this rank.
pub struct Communicator {
    rank: usize,
    nranks: usize,
    config: CommConfig,
    cards: Vec<BusinessCard>,
    paths: Vec<Path>,
    /// Largest all-reduce (bytes) that runs by recursive doubling: [`doubling::MAX_BYTES`] when
    /// any pair of ranks talks over RoCE, [`doubling::MAX_BYTES_LOCAL`] when all share memory;
    /// the same on every rank (it follows from the cards every rank holds).
    doubling_max: usize,
    sends: Vec<PeerSend>,
    recvs: Vec<PeerRecv>,
    /// Collectives called so far (every rank calls the same sequence).
    seq: u64,
    /// Point-to-point messages sent to / received from each peer.
    p2p_sent: Vec<u64>,
    p2p_received: Vec<u64>,
    /// The first error, once aborted.
    failure: Option<String>,
    /// Set by an [`AbortHandle`].
    cancel: Arc<AtomicBool>,

    /// The GPU peer-to-peer path (IPC-mapped peer buffers), set up by the first device collective.
    pub(crate) gpu: Option<Box<crate::transport::cuda_ipc::GpuPeerPath>>,
    /// Which path the device all-reduces took.
    pub(crate) device_stats: crate::device::stats::DevicePathStats,
}

impl core::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("paths", &self.paths)
            .field("failure", &self.failure)
            .finish()
    }
}

fn transport_for(path: Path) -> Option<Box<dyn Transport>> {
    match path {
        Path::Shm => Some(Box::new(ShmTransport::new())),
        Path::InProcess => Some(Box::new(ShmTransport::in_process())),
        Path::Roce => Some(Box::new(RoceTransport::new())),
        Path::SelfRank => None,
    }
}

impl Communicator {
    /// Creates rank `rank` of a communicator of `nranks` ranks that rendezvous at `id`
    /// (NCCL's `ncclCommInitRank`). Every rank calls it with the same `id`, `nranks` and
    /// configuration; it returns when every rank is connected.
    ///
    /// # Errors
    /// [`InitError`]: bad arguments, the rendezvous failing (naming the rank at fault), ranks
    /// configured differently, a peer the requested transport cannot reach, transport setup.
    pub fn init(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: CommConfig,
    ) -> Result<Communicator, InitError> {
        config.validate()?;
        if nranks == 0 || rank >= nranks {
            return Err(InitError::InvalidArgument(format!(
                "rank {rank} of {nranks} ranks"
            )));
        }
        let mut rv = Rendezvous::connect(id, rank, nranks, config.bootstrap_timeout)?;
        Self::init_over(&mut rv, id.magic(), rank, nranks, config)
    }

    /// Creates rank `rank` of a communicator of `nranks` ranks that rendezvous through the
    /// key-value `store` (PyTorch's way: a backend gets the process group's `Store`), without a
    /// port of this crate; see [`crate::bootstrap::store`]. `local_ip` is the address other
    /// ranks reach this one at, used by the RoCE transport (`None`: `COLL_ROCE_ADDR` must be
    /// set when RoCE is used). Every rank creates its communicators on one store in the same
    /// order.
    ///
    /// # Errors
    /// As [`Self::init`]; [`BootstrapError::Store`] for the store's own failures.
    pub fn from_store(
        store: Arc<dyn Store>,
        rank: usize,
        nranks: usize,
        config: CommConfig,
        local_ip: Option<IpAddr>,
    ) -> Result<Communicator, InitError> {
        config.validate()?;
        if nranks == 0 || rank >= nranks {
            return Err(InitError::InvalidArgument(format!(
                "rank {rank} of {nranks} ranks"
            )));
        }
        let (mut rv, tag) =
            StoreRendezvous::join(store, rank, nranks, config.bootstrap_timeout, local_ip)?;
        Self::init_over(&mut rv, tag, rank, nranks, config)
    }

    /// Sets up over `rv`; on failure tells the other ranks why, unless they told us.
    pub(crate) fn init_over(
        rv: &mut dyn Exchange,
        tag: u64,
        rank: usize,
        nranks: usize,
        config: CommConfig,
    ) -> Result<Communicator, InitError> {
        match Self::setup(rv, tag, rank, nranks, config) {
            Ok(comm) => Ok(comm),
            Err(e) => {
                if !matches!(e, InitError::Bootstrap(BootstrapError::RankFailed { .. })) {
                    rv.abort(&format!("rank {rank}: {e}"));
                }
                Err(e)
            }
        }
    }

    /// Creates this process's rank from the launcher environment (torchrun, Open MPI, Slurm;
    /// see [`crate::bootstrap::launcher`]). The rank that hosts the rendezvous root starts it.
    ///
    /// # Errors
    /// [`InitError::Env`] for a missing or malformed environment; others as [`Self::init`].
    pub fn from_env(config: CommConfig) -> Result<Communicator, InitError> {
        let info = LaunchInfo::from_env()?;
        Self::from_launch(&info, config)
    }

    /// Creates the rank described by `info` (see [`Self::from_env`]).
    ///
    /// # Errors
    /// As [`Self::from_env`].
    pub fn from_launch(info: &LaunchInfo, config: CommConfig) -> Result<Communicator, InitError> {
        let (id, bind) = info.unique_id()?;
        if let Some(bind) = bind {
            id.serve(bind, info.nranks, config.bootstrap_timeout)?;
        }
        Self::init(&id, info.rank, info.nranks, config)
    }

    fn setup(
        rv: &mut dyn Exchange,
        tag: u64,
        rank: usize,
        nranks: usize,
        config: CommConfig,
    ) -> Result<Communicator, InitError> {
        let card = BusinessCard {
            rank,
            host_id: host_id(),
            hostname: hostname(),
            pid: std::process::id(),
            transport: config.transport,
            nchannels: config.nchannels,
            nslots: config.nslots,
            slot_bytes: config.slot_bytes,
        };
        let cards = rv
            .all_gather(&card.encode())?
            .iter()
            .enumerate()
            .map(|(r, rec)| BusinessCard::decode(r, rec))
            .collect::<Result<Vec<_>, _>>()?;
        for c in &cards {
            let differs = |what: &str, mine: String, theirs: String| {
                Err(InitError::ConfigMismatch {
                    peer: c.rank,
                    what: format!("{what} {theirs} there, {mine} here"),
                })
            };
            if c.transport != card.transport {
                return differs(
                    "transport",
                    card.transport.to_string(),
                    c.transport.to_string(),
                );
            }
            if (c.nchannels, c.nslots, c.slot_bytes)
                != (card.nchannels, card.nslots, card.slot_bytes)
            {
                return differs(
                    "channels/slots/slot bytes",
                    format!("{}/{}/{}", card.nchannels, card.nslots, card.slot_bytes),
                    format!("{}/{}/{}", c.nchannels, c.nslots, c.slot_bytes),
                );
            }
        }
        let paths = topology::plan(rank, &cards, config.transport).map_err(InitError::Topology)?;
        let local_ranks = cards.iter().filter(|c| c.host_id == card.host_id).count();
        let ctx = SetupContext {
            rank,
            nranks,
            nchannels: config.nchannels,
            nslots: config.nslots,
            slot_bytes: config.slot_bytes,
            tag,
            cards: &cards,
            wait: config
                .wait
                .unwrap_or_else(|| WaitPolicy::for_local_ranks(local_ranks)),
            bootstrap_addr: rv.local_ip(),
        };

        // Phase 1: every transport in use allocates its receive side and describes it.
        let mut transports: Vec<(Box<dyn Transport>, Vec<usize>)> = Vec::new();
        for path in [Path::Shm, Path::InProcess, Path::Roce] {
            let peers: Vec<usize> = (0..nranks).filter(|&p| paths[p] == path).collect();
            if let (false, Some(t)) = (peers.is_empty(), transport_for(path)) {
                transports.push((t, peers));
            }
        }
        let mut w = Writer::default();
        w.u32(transports.len() as u32);
        for (t, peers) in &mut transports {
            let info = t.setup(&ctx, peers)?;
            w.u8(t.kind().to_raw()).bytes(&info);
        }
        // Phase 2: exchange the infos, connect.
        let records = rv.all_gather(&w.buf)?;
        let mut infos_by_kind: Vec<(u8, Vec<Vec<u8>>)> = Vec::new();
        for (r, rec) in records.iter().enumerate() {
            let bad =
                |what: String| InitError::Bootstrap(BootstrapError::BadRecord { rank: r, what });
            let mut rd = Reader::new(rec);
            let n = rd.u32("transport count").map_err(|e| bad(e.to_string()))?;
            for _ in 0..n {
                let kind = rd.u8("transport").map_err(|e| bad(e.to_string()))?;
                let info = rd.bytes("info").map_err(|e| bad(e.to_string()))?;
                let slot = match infos_by_kind.iter().position(|(k, _)| *k == kind) {
                    Some(i) => i,
                    None => {
                        infos_by_kind.push((kind, vec![Vec::new(); nranks]));
                        infos_by_kind.len() - 1
                    }
                };
                infos_by_kind[slot].1[r] = info.to_vec();
            }
        }
        let mut sends: Vec<PeerSend> = (0..nranks)
            .map(|peer| PeerSend {
                peer,
                conns: Vec::new(),
                sent: 0,
                dirty: false,
            })
            .collect();
        let mut recvs: Vec<PeerRecv> = (0..nranks)
            .map(|peer| PeerRecv {
                peer,
                conns: Vec::new(),
                received: 0,
            })
            .collect();
        let empty = vec![Vec::new(); nranks];
        for (t, peers) in &mut transports {
            let kind = t.kind().to_raw();
            let infos = infos_by_kind
                .iter()
                .find(|(k, _)| *k == kind)
                .map_or(&empty, |(_, v)| v);
            for pc in t.connect(&ctx, peers, infos)? {
                if pc.send.len() != config.nchannels || pc.recv.len() != config.nchannels {
                    return Err(InitError::Transport(TransportError::BadInfo {
                        peer: pc.peer,
                        what: "transport returned a wrong number of channels".into(),
                    }));
                }
                sends[pc.peer].conns = pc.send;
                recvs[pc.peer].conns = pc.recv;
            }
        }
        // Phase 3: once every rank is connected, drop setup-only resources and the rendezvous.
        rv.barrier()?;
        for (t, _) in &mut transports {
            t.finish()?;
        }
        let hosts = cards
            .iter()
            .map(|c| c.host_id)
            .collect::<std::collections::HashSet<_>>();
        let roce_anywhere = nranks > 1
            && match config.transport {
                TransportKind::Roce => true,
                TransportKind::Auto => hosts.len() > 1,
                TransportKind::Shm | TransportKind::InProcess => false,
            };
        let doubling_max = if roce_anywhere {
            doubling::MAX_BYTES
        } else {
            doubling::MAX_BYTES_LOCAL
        };
        Ok(Communicator {
            rank,
            nranks,
            config,
            cards,
            paths,
            doubling_max,
            sends,
            recvs,
            seq: 0,
            p2p_sent: vec![0; nranks],
            p2p_received: vec![0; nranks],
            failure: None,
            cancel: Arc::new(AtomicBool::new(false)),
            gpu: None,
            device_stats: Default::default(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// This rank's index among the ranks of its host, and how many ranks its host has.
    pub fn local_rank(&self) -> (usize, usize) {
        let me = self.cards[self.rank].host_id;
        let local: Vec<usize> = (0..self.nranks)
            .filter(|&r| self.cards[r].host_id == me)
            .collect();
        (
            local.iter().position(|&r| r == self.rank).unwrap_or(0),
            local.len(),
        )
    }

    /// The host name of `rank`, as its business card gave it.
    pub fn hostname(&self, rank: usize) -> Option<&str> {
        self.cards.get(rank).map(|c| c.hostname.as_str())
    }

    /// The process id of `rank`.
    pub fn pid(&self, rank: usize) -> Option<u32> {
        self.cards.get(rank).map(|c| c.pid)
    }

    /// How this rank reaches `peer`.
    pub fn path(&self, peer: usize) -> Option<Path> {
        self.paths.get(peer).copied()
    }

    /// The configuration.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// The first error, once the communicator is aborted (NCCL's `ncclCommGetAsyncError`).
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// A handle that ends this communicator's operations from any thread (see
    /// [`AbortHandle`]).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.cancel.clone())
    }

    /// Sets the per-operation timeout: how long any wait of an operation may go without
    /// progress from a peer before the operation fails with a timeout naming that peer
    /// (the [`CommConfig::timeout`] it started with, until changed).
    ///
    /// # Errors
    /// [`InitError::InvalidArgument`] for a zero timeout.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), InitError> {
        if timeout.is_zero() {
            return Err(InitError::InvalidArgument(
                "a zero operation timeout".into(),
            ));
        }
        self.config.timeout = timeout;
        Ok(())
    }

    /// After [`AbortHandle::abort`]: aborts the connectors now (telling the peers) instead of at
    /// the next operation. Does nothing otherwise.
    pub(crate) fn abort_if_requested(&mut self) {
        if self.cancel.load(Ordering::Acquire) && self.failure.is_none() {
            self.abort(&CollError::Cancelled {
                op: crate::transport::CollKind::Barrier,
                rank: self.rank,
            });
        }
    }

    pub(crate) fn abort(&mut self, e: &CollError) {
        let abort = e.abort_for(self.rank);
        for s in &mut self.sends {
            s.abort(abort);
        }
        for r in &mut self.recvs {
            r.abort(abort);
        }
        if self.failure.is_none() {
            self.failure = Some(e.to_string());
        }
    }

    /// Runs one operation: refuses it if aborted, runs `f`, drains, aborts on error.
    fn run(
        &mut self,
        send_desc: OpDesc,
        recv_desc: OpDesc,
        datatype: DataType,
        redop: RedOp,
        f: impl FnOnce(&mut Op<'_>) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        if let Some(cause) = &self.failure {
            return Err(CollError::Aborted {
                op: send_desc.coll,
                cause: cause.clone(),
            });
        }
        if self.cancel.load(Ordering::Acquire) {
            let e = CollError::Cancelled {
                op: send_desc.coll,
                rank: self.rank,
            };
            self.abort(&e);
            return Err(e);
        }
        let cancel = self.cancel.clone();
        let mut op = Op {
            rank: self.rank,
            nranks: self.nranks,
            send_desc,
            recv_desc,
            datatype,
            redop,
            timeout: self.config.timeout,
            cancel: &cancel,
            chunk_bytes: self.config.slot_bytes - self.config.slot_bytes % datatype.size(),
            sends: &mut self.sends,
            recvs: &mut self.recvs,
        };
        // A panic inside an operation (a bug) must not leave a transport reading the caller's
        // buffers after they are gone (zero-copy sends, `SendConnector::post_from`): abort every
        // connector, which waits for or cancels those reads, before the unwind continues.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f(&mut op).and_then(|()| op.drain())
        }));
        let r = match r {
            Ok(r) => r,
            Err(panic) => {
                let abort = Abort {
                    origin: self.rank,
                    reason: AbortReason::Error,
                };
                for s in &mut self.sends {
                    s.abort(abort);
                }
                for r in &mut self.recvs {
                    r.abort(abort);
                }
                self.failure
                    .get_or_insert_with(|| "an operation panicked".to_string());
                std::panic::resume_unwind(panic)
            }
        };
        let r = match r {
            Err(_) if cancel.load(Ordering::Acquire) => Err(CollError::Cancelled {
                op: send_desc.coll,
                rank: self.rank,
            }),
            r => r,
        };
        if let Err(e) = &r {
            self.abort(e);
        }
        r
    }
}
