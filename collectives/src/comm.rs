//! The communicator: NCCL's `ncclComm`, a group of ranks connected for collectives.

use std::time::Duration;

use crate::algorithms::{chain, doubling, pairwise, ring, Io, Op, PeerRecv, PeerSend};
use crate::bootstrap::{
    host_id, hostname, BootstrapError, BusinessCard, EnvError, LaunchInfo, Rendezvous, UniqueId,
};
use crate::codec::{Reader, Writer};
use crate::datatype::{DataType, Element, RedOp};
use crate::error::{CollError, InitError};
use crate::topology::{self, Path};
use crate::transport::roce::RoceTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::{
    Abort, AbortReason, CollKind, OpDesc, SetupContext, Transport, TransportError, TransportKind,
    WaitPolicy,
};

/// How a communicator is built and how it waits. Every rank must use the same transport,
/// channel count, slot count and slot size (checked at init).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommConfig {
    /// Transport selection (`--transport`).
    pub transport: TransportKind,
    /// Channels per peer pair; consecutive chunks to one peer go round-robin over them (one QP
    /// each on RoCE). Default 1.
    pub nchannels: usize,
    /// Slots per channel: how many chunks a sender may run ahead (NCCL's `NCCL_STEPS`).
    /// Default 8.
    pub nslots: usize,
    /// Payload bytes per slot, a multiple of 64: the chunk size (NCCL's buffer size /
    /// `NCCL_STEPS`). Default 128 KiB.
    pub slot_bytes: usize,
    /// Longest wait without progress inside an operation before it fails naming the peer.
    /// Default 60 s.
    pub timeout: Duration,
    /// Deadline of each bootstrap step (connecting, each all-gather). Default 60 s.
    pub bootstrap_timeout: Duration,
    /// How connectors wait; `None`: chosen from the number of ranks on this host against its
    /// CPUs ([`WaitPolicy::for_local_ranks`]).
    pub wait: Option<WaitPolicy>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            transport: TransportKind::Auto,
            nchannels: 1,
            nslots: 8,
            slot_bytes: 128 << 10,
            timeout: Duration::from_secs(60),
            bootstrap_timeout: Duration::from_secs(60),
            wait: None,
        }
    }
}

impl CommConfig {
    /// This configuration with the environment's overrides applied: `COLL_TRANSPORT`
    /// (`auto|shm|roce|inproc`), `COLL_NCHANNELS`, `COLL_NSLOTS`, `COLL_SLOT_BYTES`,
    /// `COLL_TIMEOUT_MS`, `COLL_BOOTSTRAP_TIMEOUT_MS`, and the wait policy's `COLL_SPIN` and
    /// `COLL_YIELDS` (as NCCL reads `NCCL_*`).
    ///
    /// # Errors
    /// [`EnvError::Invalid`] for a value that does not parse.
    pub fn with_env_overrides(mut self) -> Result<Self, EnvError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let num = |var: &'static str, v: String| {
            v.trim().parse::<u64>().map_err(|_| EnvError::Invalid {
                var,
                value: v,
                expected: "a non-negative integer",
            })
        };
        if let Some(v) = get("COLL_TRANSPORT") {
            self.transport = v.parse().map_err(|_| EnvError::Invalid {
                var: "COLL_TRANSPORT",
                value: v,
                expected: "auto, shm, roce or inproc",
            })?;
        }
        if let Some(v) = get("COLL_NCHANNELS") {
            self.nchannels = num("COLL_NCHANNELS", v)? as usize;
        }
        if let Some(v) = get("COLL_NSLOTS") {
            self.nslots = num("COLL_NSLOTS", v)? as usize;
        }
        if let Some(v) = get("COLL_SLOT_BYTES") {
            self.slot_bytes = num("COLL_SLOT_BYTES", v)? as usize;
        }
        if let Some(v) = get("COLL_TIMEOUT_MS") {
            self.timeout = Duration::from_millis(num("COLL_TIMEOUT_MS", v)?);
        }
        if let Some(v) = get("COLL_SPIN") {
            let base = self.wait.unwrap_or(WaitPolicy::DEDICATED);
            self.wait = Some(WaitPolicy {
                spin: num("COLL_SPIN", v)? as u32,
                ..base
            });
        }
        if let Some(v) = get("COLL_YIELDS") {
            let base = self.wait.unwrap_or(WaitPolicy::DEDICATED);
            self.wait = Some(WaitPolicy {
                yields: num("COLL_YIELDS", v)? as u32,
                ..base
            });
        }
        if let Some(v) = get("COLL_BOOTSTRAP_TIMEOUT_MS") {
            self.bootstrap_timeout = Duration::from_millis(num("COLL_BOOTSTRAP_TIMEOUT_MS", v)?);
        }
        Ok(self)
    }

    fn validate(&self) -> Result<(), InitError> {
        let bad = |what: String| Err(InitError::InvalidArgument(what));
        if self.nchannels == 0 || self.nchannels > 64 {
            return bad(format!("nchannels {} (1..=64)", self.nchannels));
        }
        if self.nslots == 0 || self.nslots > 1024 {
            return bad(format!("nslots {} (1..=1024)", self.nslots));
        }
        if self.slot_bytes < 64 || self.slot_bytes % 64 != 0 || self.slot_bytes > 1 << 30 {
            return bad(format!(
                "slot_bytes {} (a multiple of 64, 64 B ..= 1 GiB)",
                self.slot_bytes
            ));
        }
        Ok(())
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
    /// The GPU peer-to-peer path (IPC-mapped peer buffers), set up by the first device collective.
    pub(crate) gpu: Option<Box<crate::transport::cuda_ipc::GpuPeerPath>>,
    /// Which path the device all-reduces took.
    pub(crate) device_stats: crate::device::DevicePathStats,
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
        match Self::setup(&mut rv, id, rank, nranks, config) {
            Ok(comm) => Ok(comm),
            Err(e) => {
                // Tell the others why, unless they told us.
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
            id.serve(bind, config.bootstrap_timeout)?;
        }
        Self::init(&id, info.rank, info.nranks, config)
    }

    fn setup(
        rv: &mut Rendezvous,
        id: &UniqueId,
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
            tag: id.magic(),
            cards: &cards,
            wait: config
                .wait
                .unwrap_or_else(|| WaitPolicy::for_local_ranks(local_ranks)),
            bootstrap_addr: rv.local_addr().map(|a| a.ip()),
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
        let mut op = Op {
            rank: self.rank,
            nranks: self.nranks,
            send_desc,
            recv_desc,
            datatype,
            redop,
            timeout: self.config.timeout,
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
        if let Err(e) = &r {
            self.abort(e);
        }
        r
    }

    /// Fails (and aborts) the operation with an argument error.
    pub(crate) fn invalid(&mut self, op: CollKind, what: String) -> CollError {
        let e = CollError::InvalidArgument { op, what };
        if self.failure.is_none() {
            self.abort(&e);
        }
        e
    }

    /// Starts collective `coll`: its descriptor (taking a sequence number) and the byte size of
    /// `count * blocks` elements, checked for overflow.
    fn begin(
        &mut self,
        coll: CollKind,
        datatype: DataType,
        redop: Option<RedOp>,
        root: Option<usize>,
        count: usize,
        blocks: usize,
    ) -> Result<(OpDesc, usize), CollError> {
        let desc = OpDesc::new(self.seq, coll, datatype, redop, root, count);
        self.seq += 1;
        if let Some(root) = root.filter(|&r| r >= self.nranks) {
            return Err(self.invalid(
                coll,
                format!("root {root} is not below nranks {}", self.nranks),
            ));
        }
        match count
            .checked_mul(blocks)
            .and_then(|n| n.checked_mul(datatype.size()))
        {
            Some(bytes) => Ok((desc, bytes)),
            None => Err(self.invalid(
                coll,
                format!("{count} x {blocks} {datatype} elements overflow"),
            )),
        }
    }

    fn need(
        &mut self,
        coll: CollKind,
        what: &str,
        have: usize,
        need: usize,
    ) -> Result<(), CollError> {
        if have < need {
            return Err(self.invalid(
                coll,
                format!("{what} buffer has {have} bytes, the operation needs {need}"),
            ));
        }
        Ok(())
    }

    /// All-reduce (NCCL `ncclAllReduce`): `recv[i] = op(send[i] of every rank)` for
    /// `i < count`, on every rank. Recursive doubling up to
    /// [`doubling::MAX_BYTES`](crate::algorithms::doubling::MAX_BYTES) (when any ranks talk over
    /// RoCE; [`doubling::MAX_BYTES_LOCAL`](crate::algorithms::doubling::MAX_BYTES_LOCAL) when all
    /// share memory) and one slot, else the ring; see [`crate::algorithms`].
    ///
    /// # Errors
    /// [`CollError`]: short buffers, mismatched operations across ranks, a peer that fails.
    pub fn all_reduce(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllReduce;
        let (desc, bytes) = self.begin(coll, datatype, Some(op), None, count, 1)?;
        self.need(coll, "send", send.len(), bytes)?;
        self.need(coll, "recv", recv.len(), bytes)?;
        let mut io = Io::out_of_place(&send[..bytes], &mut recv[..bytes]);
        let max = self.doubling_max;
        self.run(desc, desc, datatype, op, |o| {
            all_reduce_algorithm(o, &mut io, count, max)
        })
    }

    /// In-place all-reduce: `buf` is both input and output.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_reduce_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllReduce;
        let (desc, bytes) = self.begin(coll, datatype, Some(op), None, count, 1)?;
        self.need(coll, "", buf.len(), bytes)?;
        let mut io = Io::in_place(&mut buf[..bytes], 0, 0);
        let max = self.doubling_max;
        self.run(desc, desc, datatype, op, |o| {
            all_reduce_algorithm(o, &mut io, count, max)
        })
    }

    /// Typed all-reduce: `count = send.len()`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_reduce_typed<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
    ) -> Result<(), CollError> {
        self.all_reduce(
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
            send.len(),
            T::DATATYPE,
            op,
        )
    }

    /// Typed in-place all-reduce.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_reduce_typed_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: RedOp,
    ) -> Result<(), CollError> {
        let count = buf.len();
        self.all_reduce_in_place(bytemuck::cast_slice_mut(buf), count, T::DATATYPE, op)
    }

    /// Broadcast (NCCL `ncclBroadcast`): `count` elements of the root's `send` to every rank's
    /// `recv` (the root's included). `send` is read on the root only (may be empty elsewhere).
    /// Pipelined chain down the ring from the root.
    ///
    /// # Errors
    /// As [`Self::all_reduce`]; also a root out of range.
    pub fn broadcast(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Broadcast;
        let (desc, bytes) = self.begin(coll, datatype, None, Some(root), count, 1)?;
        let send = if self.rank == root {
            self.need(coll, "send", send.len(), bytes)?;
            &send[..bytes]
        } else {
            &[]
        };
        self.need(coll, "recv", recv.len(), bytes)?;
        let mut io = Io::out_of_place(send, &mut recv[..bytes]);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            chain::broadcast(o, &mut io, count, root)
        })
    }

    /// In-place broadcast: the root's `buf` to every rank's `buf`.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn broadcast_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Broadcast;
        let (desc, bytes) = self.begin(coll, datatype, None, Some(root), count, 1)?;
        self.need(coll, "", buf.len(), bytes)?;
        let mut io = Io::in_place(&mut buf[..bytes], 0, 0);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            chain::broadcast(o, &mut io, count, root)
        })
    }

    /// Reduce (NCCL `ncclReduce`): the root's `recv[i] = op(send[i] of every rank)`. `recv` is
    /// written on the root only (may be empty elsewhere). Pipelined chain up the ring to the root.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn reduce(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Reduce;
        let (desc, bytes) = self.begin(coll, datatype, Some(op), Some(root), count, 1)?;
        self.need(coll, "send", send.len(), bytes)?;
        let recv: &mut [u8] = if self.rank == root {
            self.need(coll, "recv", recv.len(), bytes)?;
            &mut recv[..bytes]
        } else {
            &mut []
        };
        let mut io = Io::out_of_place(&send[..bytes], recv);
        self.run(desc, desc, datatype, op, |o| {
            chain::reduce(o, &mut io, count, root)
        })
    }

    /// In-place reduce: the root's `buf` becomes the reduction; other ranks' `buf` is only read.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn reduce_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Reduce;
        let (desc, bytes) = self.begin(coll, datatype, Some(op), Some(root), count, 1)?;
        self.need(coll, "", buf.len(), bytes)?;
        let mut io = Io::in_place(&mut buf[..bytes], 0, 0);
        self.run(desc, desc, datatype, op, |o| {
            chain::reduce(o, &mut io, count, root)
        })
    }

    /// All-gather (NCCL `ncclAllGather`): every rank's `send` (`count` elements) lands in block
    /// `rank` of every rank's `recv` (`nranks * count` elements). Ring algorithm.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_gather(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllGather;
        let (desc, total) = self.begin(coll, datatype, None, None, count, self.nranks)?;
        let bytes = total / self.nranks;
        self.need(coll, "send", send.len(), bytes)?;
        self.need(coll, "recv", recv.len(), total)?;
        let mut io = Io::out_of_place(&send[..bytes], &mut recv[..total]);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            ring::all_gather(o, &mut io, count)
        })
    }

    /// In-place all-gather: this rank's input is block `rank` of `buf` (`nranks * count`
    /// elements), NCCL's `sendbuff == recvbuff + rank * count`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_gather_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllGather;
        let (desc, total) = self.begin(coll, datatype, None, None, count, self.nranks)?;
        self.need(coll, "", buf.len(), total)?;
        let block = total / self.nranks;
        let mut io = Io::in_place(&mut buf[..total], self.rank * block, 0);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            ring::all_gather(o, &mut io, count)
        })
    }

    /// Reduce-scatter (NCCL `ncclReduceScatter`): `send` holds `nranks` blocks of `count`
    /// elements; `recv` (`count` elements) gets block `rank` reduced over all ranks. Ring.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let coll = CollKind::ReduceScatter;
        let (desc, total) = self.begin(coll, datatype, Some(op), None, count, self.nranks)?;
        let bytes = total / self.nranks;
        self.need(coll, "send", send.len(), total)?;
        self.need(coll, "recv", recv.len(), bytes)?;
        let mut io = Io::out_of_place(&send[..total], &mut recv[..bytes]);
        self.run(desc, desc, datatype, op, |o| {
            ring::reduce_scatter(o, &mut io, count)
        })
    }

    /// In-place reduce-scatter: the result is block `rank` of `buf`, NCCL's
    /// `recvbuff == sendbuff + rank * count`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn reduce_scatter_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let coll = CollKind::ReduceScatter;
        let (desc, total) = self.begin(coll, datatype, Some(op), None, count, self.nranks)?;
        self.need(coll, "", buf.len(), total)?;
        let block = total / self.nranks;
        let mut io = Io::in_place(&mut buf[..total], 0, self.rank * block);
        self.run(desc, desc, datatype, op, |o| {
            ring::reduce_scatter(o, &mut io, count)
        })
    }

    /// All-to-all: block `j` (`count` elements) of every rank's `send` goes to block `rank` of
    /// rank `j`'s `recv`; both hold `nranks * count` elements. Pairwise exchange.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_to_all(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllToAll;
        let (desc, total) = self.begin(coll, datatype, None, None, count, self.nranks)?;
        self.need(coll, "send", send.len(), total)?;
        self.need(coll, "recv", recv.len(), total)?;
        let mut io = Io::out_of_place(&send[..total], &mut recv[..total]);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::all_to_all(o, &mut io, count)
        })
    }

    /// In-place all-to-all.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_to_all_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::AllToAll;
        let (desc, total) = self.begin(coll, datatype, None, None, count, self.nranks)?;
        self.need(coll, "", buf.len(), total)?;
        let mut io = Io::in_place(&mut buf[..total], 0, 0);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::all_to_all(o, &mut io, count)
        })
    }

    /// Scatter: block `j` (`count` elements) of the root's `send` (`nranks * count` elements,
    /// read on the root only) goes to rank `j`'s `recv`.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Scatter;
        let (desc, total) = self.begin(coll, datatype, None, Some(root), count, self.nranks)?;
        let bytes = total / self.nranks;
        let send = if self.rank == root {
            self.need(coll, "send", send.len(), total)?;
            &send[..total]
        } else {
            &[]
        };
        self.need(coll, "recv", recv.len(), bytes)?;
        let mut io = Io::out_of_place(send, &mut recv[..bytes]);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::scatter(o, &mut io, count, root)
        })
    }

    /// In-place scatter: every rank passes a buffer of `nranks * count` elements; rank `j`'s
    /// result is its block `j` (NCCL-tests' `recvbuff = sendbuff + rank * count`).
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn scatter_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Scatter;
        let (desc, total) = self.begin(coll, datatype, None, Some(root), count, self.nranks)?;
        self.need(coll, "", buf.len(), total)?;
        let block = total / self.nranks;
        let mut io = Io::in_place(&mut buf[..total], 0, self.rank * block);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::scatter(o, &mut io, count, root)
        })
    }

    /// Gather: every rank's `send` (`count` elements) goes to block `rank` of the root's `recv`
    /// (`nranks * count` elements, written on the root only).
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn gather(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Gather;
        let (desc, total) = self.begin(coll, datatype, None, Some(root), count, self.nranks)?;
        let bytes = total / self.nranks;
        self.need(coll, "send", send.len(), bytes)?;
        let recv: &mut [u8] = if self.rank == root {
            self.need(coll, "recv", recv.len(), total)?;
            &mut recv[..total]
        } else {
            &mut []
        };
        let mut io = Io::out_of_place(&send[..bytes], recv);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::gather(o, &mut io, count, root)
        })
    }

    /// In-place gather: every rank's input is block `rank` of its `buf` (`nranks * count`
    /// elements); the root's `buf` receives every block.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn gather_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        root: usize,
    ) -> Result<(), CollError> {
        let coll = CollKind::Gather;
        let (desc, total) = self.begin(coll, datatype, None, Some(root), count, self.nranks)?;
        self.need(coll, "", buf.len(), total)?;
        let block = total / self.nranks;
        let mut io = Io::in_place(&mut buf[..total], self.rank * block, 0);
        self.run(desc, desc, datatype, RedOp::Sum, |o| {
            pairwise::gather(o, &mut io, count, root)
        })
    }

    /// Barrier: returns once every rank has entered it (dissemination, `ceil(log2 nranks)`
    /// rounds of empty messages).
    ///
    /// # Errors
    /// A peer that fails.
    pub fn barrier(&mut self) -> Result<(), CollError> {
        let (desc, _) = self.begin(CollKind::Barrier, DataType::U8, None, None, 0, 1)?;
        self.run(desc, desc, DataType::U8, RedOp::Sum, pairwise::barrier)
    }

    fn p2p_desc(seq: u64, datatype: DataType, count: usize) -> OpDesc {
        OpDesc::new(seq, CollKind::SendRecv, datatype, None, None, count)
    }

    fn check_peer(&mut self, peer: usize) -> Result<(), CollError> {
        if peer >= self.nranks {
            return Err(self.invalid(
                CollKind::SendRecv,
                format!("peer {peer} is not below nranks {}", self.nranks),
            ));
        }
        Ok(())
    }

    /// Sends `count` elements of `buf` to `peer` (NCCL `ncclSend`); returns once `peer` has
    /// received them all (with a matching [`Self::recv`]).
    ///
    /// # Errors
    /// A peer out of range or equal to this rank (use [`Self::send_recv`]), a short buffer,
    /// mismatched count or data type at the receiver, a failing peer.
    pub fn send(
        &mut self,
        buf: &[u8],
        count: usize,
        datatype: DataType,
        peer: usize,
    ) -> Result<(), CollError> {
        self.send_recv(buf, count, Some(peer), &mut [], 0, None, datatype)
    }

    /// Receives `count` elements from `peer` into `buf` (NCCL `ncclRecv`).
    ///
    /// # Errors
    /// As [`Self::send`].
    pub fn recv(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        peer: usize,
    ) -> Result<(), CollError> {
        self.send_recv(&[], 0, None, buf, count, Some(peer), datatype)
    }

    /// Sends `send_count` elements of `send` to `to` while receiving `recv_count` elements from
    /// `from` into `recv`, interleaved chunk by chunk (a NCCL group of `ncclSend` + `ncclRecv`),
    /// so that two ranks may exchange with each other. `to == from == rank` copies locally.
    ///
    /// # Errors
    /// As [`Self::send`].
    #[allow(clippy::too_many_arguments)]
    pub fn send_recv(
        &mut self,
        send: &[u8],
        send_count: usize,
        to: Option<usize>,
        recv: &mut [u8],
        recv_count: usize,
        from: Option<usize>,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::SendRecv;
        if let Some(cause) = &self.failure {
            return Err(CollError::Aborted {
                op: coll,
                cause: cause.clone(),
            });
        }
        let es = datatype.size();
        let bytes = |c: usize| c.checked_mul(es);
        let (Some(send_bytes), Some(recv_bytes)) = (bytes(send_count), bytes(recv_count)) else {
            return Err(self.invalid(coll, "element count overflows".into()));
        };
        for p in to.iter().chain(from.iter()) {
            self.check_peer(*p)?;
        }
        if to.is_some() {
            self.need(coll, "send", send.len(), send_bytes)?;
        }
        if from.is_some() {
            self.need(coll, "recv", recv.len(), recv_bytes)?;
        }
        let me = Some(self.rank);
        if to == me || from == me {
            if to != from || send_count != recv_count {
                return Err(self.invalid(
                    coll,
                    "a send to or receive from this rank itself needs both, with equal counts"
                        .into(),
                ));
            }
            recv[..recv_bytes].copy_from_slice(&send[..send_bytes]);
            return Ok(());
        }
        let send_desc = to.map_or(Self::p2p_desc(0, datatype, 0), |p| {
            Self::p2p_desc(self.p2p_sent[p], datatype, send_count)
        });
        let recv_desc = from.map_or(Self::p2p_desc(0, datatype, 0), |p| {
            Self::p2p_desc(self.p2p_received[p], datatype, recv_count)
        });
        if let Some(p) = to {
            self.p2p_sent[p] += 1;
        }
        if let Some(p) = from {
            self.p2p_received[p] += 1;
        }
        let mut io = Io::out_of_place(
            &send[..if to.is_some() { send_bytes } else { 0 }],
            &mut recv[..if from.is_some() { recv_bytes } else { 0 }],
        );
        let send_side = to.map(|p| (p, send_count));
        let recv_side = from.map(|p| (p, recv_count));
        self.run(send_desc, recv_desc, datatype, RedOp::Sum, |o| {
            pairwise::send_recv(o, &mut io, send_side, recv_side)
        })
    }
}

/// All-reduce by recursive doubling when the buffer is small (at most `doubling_max` bytes and
/// one chunk), else by the ring: latency-bound sizes take `log2(n)` steps, larger ones the
/// ring's bandwidth-optimal schedule. The choice depends only on the size, the slot size and
/// `doubling_max`, which every rank shares, so all ranks run the same schedule.
fn all_reduce_algorithm(
    o: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
    doubling_max: usize,
) -> Result<(), CollError> {
    let bytes = count * o.datatype.size();
    if o.nranks > 1 && bytes <= doubling_max && bytes <= o.chunk_bytes {
        doubling::all_reduce(o, io, count)
    } else {
        ring::all_reduce(o, io, count)
    }
}
