//! The transport abstraction the algorithms drive: per-peer channels of slots, NCCL's
//! "Simple protocol" model, shaped like RDMA WRITE_WITH_IMM.
//!
//! # Model
//! Between an ordered pair of ranks (sender, receiver) there are `nchannels` independent
//! *channels* (one QP each on the RoCE path; one ring each in shared memory). A channel is a ring of
//! `nslots` *slots* of `slot_bytes` each, living in the **receiver's** memory (its registered
//! receive buffer). The sender's k-th message on a channel is *step* k; it goes to slot
//! `k % nslots`:
//!
//! ```text
//!   sender                                         receiver (owns the slots)
//!   wait_slot(): credit for step k?  <-- head --   release(): head = k + 1 (a credit)
//!   fill the slot (copy or reduce-copy)
//!   post(len, chunk, desc): header + payload ----> wait(): tail > k, read header + payload
//!      tail = k + 1 (the WRITE_WITH_IMM's CQE)
//! ```
//!
//! * **Notification.** A posted slot carries a 64-byte [`SlotHeader`] (payload length, the 32-bit
//!   immediate [`Imm`] = step and chunk, and the operation's [`OpDesc`]) followed by the payload.
//!   On the RoCE path header + payload go in one RDMA WRITE_WITH_IMM into the slot and the
//!   immediate arrives in the receive completion; in shared memory the sender stores them and then
//!   advances `tail`.
//! * **Credits.** The sender may run at most `nslots` steps ahead of the receiver: step k needs
//!   `head > k - nslots`. The receiver advances `head` only after it has finished reading a slot,
//!   so no write ever lands in a slot the peer still reads (NCCL's `NCCL_STEPS` slots with
//!   head/tail counters). On RoCE the credit is an RDMA WRITE of `head` into the sender's memory.
//! * **Order.** Steps on one channel are consumed strictly in order; the receiver checks the
//!   immediate's step against the step it expects (a lost, duplicated or reordered write is a
//!   protocol error, not silent corruption). The algorithms stripe consecutive messages to one
//!   peer over its channels round-robin, and check the chunk index and descriptor of each.
//! * **Bounded waits.** Every wait takes a timeout. A peer that died, closed its communicator,
//!   aborted, or made no progress within the timeout ends the wait with a [`TransportError`]
//!   naming the peer rank. Aborts travel: a rank that fails writes an abort word (its origin and
//!   reason) into every connection it has, so every rank waiting on it fails promptly too.
//!
//! # Implementations
//! * [`shm`]: processes on one host, rings in POSIX shared memory (`shm_open`, `memmap2`), or
//!   threads of one process, rings in anonymous memory ([`TransportKind::InProcess`]).
//! * [`roce`]: ranks anywhere, one RC QP per channel on the `hca` crate's software RoCE device:
//!   one RDMA WRITE_WITH_IMM per step into the peer's registered slot, credits as zero-byte
//!   SEND_WITH_IMMs, aborts as SENDs, peer death from the QP (`IBV_WC_RETRY_EXC_ERR`).

use core::fmt;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use hca::soft::DeviceError;
use hca::WcStatus;

use crate::bootstrap::BusinessCard;
use crate::datatype::{DataType, RedOp};

pub mod cuda_ipc;
pub mod kind;
pub mod roce;
// Edge: rings in POSIX shared memory that another process writes at any time.
#[allow(unsafe_code)]
pub mod shm;
// Edge: the raw OS calls (futex, pidfd, shm_open) and their test fakes.
#[allow(unsafe_code)]
pub(crate) mod sys;
pub mod wait;

pub use kind::TransportKind;
pub use wait::WaitPolicy;

/// The collective (or point-to-point operation) a message belongs to.
///
/// Open enum: a value read from a peer that is none of these is kept as `Unknown(raw)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// `all_reduce`.
    AllReduce,
    /// `broadcast`.
    Broadcast,
    /// `reduce`.
    Reduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all`.
    AllToAll,
    /// `scatter`.
    Scatter,
    /// `gather`.
    Gather,
    /// `barrier`.
    Barrier,
    /// Point-to-point `send` / `recv`.
    SendRecv,
    /// A value no variant names.
    Unknown(u8),
}

impl CollKind {
    /// The wire value.
    pub const fn to_raw(self) -> u8 {
        match self {
            CollKind::AllReduce => 1,
            CollKind::Broadcast => 2,
            CollKind::Reduce => 3,
            CollKind::AllGather => 4,
            CollKind::ReduceScatter => 5,
            CollKind::AllToAll => 6,
            CollKind::Scatter => 7,
            CollKind::Gather => 8,
            CollKind::Barrier => 9,
            CollKind::SendRecv => 10,
            CollKind::Unknown(raw) => raw,
        }
    }

    /// The kind for a wire value.
    pub const fn from_raw(raw: u8) -> CollKind {
        match raw {
            1 => CollKind::AllReduce,
            2 => CollKind::Broadcast,
            3 => CollKind::Reduce,
            4 => CollKind::AllGather,
            5 => CollKind::ReduceScatter,
            6 => CollKind::AllToAll,
            7 => CollKind::Scatter,
            8 => CollKind::Gather,
            9 => CollKind::Barrier,
            10 => CollKind::SendRecv,
            raw => CollKind::Unknown(raw),
        }
    }

    /// API name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::Scatter => "scatter",
            CollKind::Gather => "gather",
            CollKind::Barrier => "barrier",
            CollKind::SendRecv => "send/recv",
            CollKind::Unknown(_) => "unknown operation",
        }
    }
}

/// What an operation is, as every message of it carries it: the receiver compares the sender's
/// descriptor with its own, so ranks that called different collectives, or the same one with a
/// different count, data type, operator or root, fail with an error instead of exchanging garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpDesc {
    /// Sequence number: the communicator's collective count (every rank calls collectives in the
    /// same order), or for point-to-point the message count of that peer pair.
    pub seq: u64,
    /// The collective.
    pub coll: CollKind,
    /// Raw `ncclDataType_t` (see [`DataType::from_raw`]).
    pub datatype: u8,
    /// Raw `ncclRedOp_t` (see [`RedOp::from_raw`]); 0 for collectives without a reduction.
    pub redop: u8,
    /// Root rank (broadcast, reduce, scatter, gather); `u32::MAX` where there is none.
    pub root: u32,
    /// Element count as the API defines it for this collective (per rank for all-gather,
    /// reduce-scatter, all-to-all, scatter, gather).
    pub count: u64,
}

impl OpDesc {
    /// `root` of a collective without one.
    pub const NO_ROOT: u32 = u32::MAX;

    /// A descriptor.
    pub fn new(
        seq: u64,
        coll: CollKind,
        datatype: DataType,
        redop: Option<RedOp>,
        root: Option<usize>,
        count: usize,
    ) -> OpDesc {
        OpDesc {
            seq,
            coll,
            datatype: datatype as u8,
            redop: redop.map_or(0, |op| op as u8),
            root: root.map_or(Self::NO_ROOT, |r| r as u32),
            count: count as u64,
        }
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {}(count={}, ",
            self.seq,
            self.coll.name(),
            self.count
        )?;
        match DataType::from_raw(self.datatype) {
            Some(d) => write!(f, "{d}")?,
            None => write!(f, "datatype {}", self.datatype)?,
        }
        if matches!(
            self.coll,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        ) {
            match RedOp::from_raw(self.redop) {
                Some(op) => write!(f, ", {op}")?,
                None => write!(f, ", redop {}", self.redop)?,
            }
        }
        if self.root != Self::NO_ROOT {
            write!(f, ", root={}", self.root)?;
        }
        f.write_str(")")
    }
}

/// The 32-bit immediate of a message, as RDMA WRITE_WITH_IMM carries it: `step << 16 | chunk`.
///
/// `step` is the channel's step number modulo 2^16 (checked by the receiving connector: in-order
/// delivery), `chunk` the algorithm's chunk index modulo 2^16 (checked by the algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Imm {
    /// Channel step, modulo 2^16.
    pub step: u16,
    /// Chunk index within the operation, modulo 2^16.
    pub chunk: u16,
}

impl Imm {
    /// The 32-bit immediate value.
    pub const fn to_raw(self) -> u32 {
        (self.step as u32) << 16 | self.chunk as u32
    }

    /// Splits a 32-bit immediate value.
    pub const fn from_raw(raw: u32) -> Imm {
        Imm {
            step: (raw >> 16) as u16,
            chunk: raw as u16,
        }
    }
}

/// The 64-byte header at the start of every slot (device-visible on the RoCE path: it is written
/// by the peer's RDMA WRITE together with the payload that follows it, on the first step of each
/// operation on a channel only; the other steps write the payload alone).
///
/// Layout (little-endian on the wire of RoCE; native in shared memory, which never leaves the
/// host): `len: u32 @0`, `imm: u32 @4`, `seq: u64 @8`, `count: u64 @16`, `root: u32 @24`,
/// `coll: u8 @28`, `datatype: u8 @29`, `redop: u8 @30`, reserved to 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    /// Payload bytes that follow the header.
    pub len: u32,
    /// The immediate.
    pub imm: Imm,
    /// The operation the payload belongs to.
    pub desc: OpDesc,
}

impl SlotHeader {
    /// Encoded size, in bytes (one cache line, so payloads stay 64-byte aligned).
    pub const LEN: usize = 64;

    /// Encodes into 64 bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_raw().to_le_bytes());
        b[8..16].copy_from_slice(&self.desc.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.desc.count.to_le_bytes());
        b[24..28].copy_from_slice(&self.desc.root.to_le_bytes());
        b[28] = self.desc.coll.to_raw();
        b[29] = self.desc.datatype;
        b[30] = self.desc.redop;
        b
    }

    /// Decodes 64 bytes; every bit pattern decodes (values are validated by their users).
    pub fn decode(b: &[u8; Self::LEN]) -> SlotHeader {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        SlotHeader {
            len: u32_at(0),
            imm: Imm::from_raw(u32_at(4)),
            desc: OpDesc {
                seq: u64_at(8),
                count: u64_at(16),
                root: u32_at(24),
                coll: CollKind::from_raw(b[28]),
                datatype: b[29],
                redop: b[30],
            },
        }
    }
}

/// Why a rank aborted its connections (travels in the abort word of every connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// It closed (dropped) its communicator: no error, but no further messages.
    Closed,
    /// Ranks called mismatched operations.
    Mismatch,
    /// A peer process died.
    PeerDied,
    /// It stalled: a wait for it timed out.
    Timeout,
    /// A peer broke the slot protocol.
    Protocol,
    /// Another error (invalid arguments, a failed kernel call) on the origin rank.
    Error,
    /// A reason code no variant names.
    Unknown(u8),
}

impl AbortReason {
    const fn to_raw(self) -> u8 {
        match self {
            AbortReason::Closed => 1,
            AbortReason::Mismatch => 2,
            AbortReason::PeerDied => 3,
            AbortReason::Timeout => 4,
            AbortReason::Protocol => 5,
            AbortReason::Error => 6,
            AbortReason::Unknown(r) => r,
        }
    }

    const fn from_raw(raw: u8) -> AbortReason {
        match raw {
            1 => AbortReason::Closed,
            2 => AbortReason::Mismatch,
            3 => AbortReason::PeerDied,
            4 => AbortReason::Timeout,
            5 => AbortReason::Protocol,
            6 => AbortReason::Error,
            r => AbortReason::Unknown(r),
        }
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::Closed => f.write_str("closed its communicator"),
            AbortReason::Mismatch => f.write_str("found mismatched operations"),
            AbortReason::PeerDied => f.write_str("died"),
            AbortReason::Timeout => f.write_str("stalled (a wait for it timed out)"),
            AbortReason::Protocol => f.write_str("broke the slot protocol"),
            AbortReason::Error => f.write_str("failed an operation"),
            AbortReason::Unknown(r) => write!(f, "aborted (reason code {r})"),
        }
    }
}

/// An abort: which rank is at the origin of the failure and why. Encoded in a 32-bit word
/// (`(origin + 1) << 8 | reason`; 0 = no abort) so that it fits one atomic store in a ring's
/// control block or one immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Abort {
    /// The rank whose failure (or whose death, for [`AbortReason::PeerDied`]) started it.
    pub origin: usize,
    /// Why.
    pub reason: AbortReason,
}

impl Abort {
    /// The 32-bit abort word.
    pub const fn to_word(self) -> u32 {
        ((self.origin as u32).wrapping_add(1) << 8) | self.reason.to_raw() as u32
    }

    /// Decodes an abort word; `None` for 0 (no abort).
    pub const fn from_word(word: u32) -> Option<Abort> {
        if word == 0 {
            return None;
        }
        Some(Abort {
            origin: ((word >> 8).wrapping_sub(1)) as usize,
            reason: AbortReason::from_raw(word as u8),
        })
    }
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} {}", self.origin, self.reason)
    }
}

/// What a connector was waiting for when a wait ended without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// A free slot (a credit) to send into.
    Credit,
    /// A posted slot to receive.
    Data,
    /// Every posted slot to be consumed (the end of an operation).
    Drain,
}

impl fmt::Display for WaitFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitFor::Credit => "a free slot (credit)",
            WaitFor::Data => "data",
            WaitFor::Drain => "the peer to consume posted slots",
        })
    }
}

/// A transport failure, naming the peer rank it concerns.
#[derive(Debug)]
pub enum TransportError {
    /// No progress from `peer` within the timeout.
    Timeout {
        /// The peer rank.
        peer: usize,
        /// The channel.
        channel: usize,
        /// What was awaited.
        waiting_for: WaitFor,
        /// How long, in milliseconds.
        after_ms: u128,
    },
    /// The peer's process is gone.
    PeerDied {
        /// The peer rank.
        peer: usize,
        /// Its process id.
        pid: u32,
    },
    /// The peer's process, on this host, exists but is stopped (SIGSTOP, a debugger) and
    /// answers nothing.
    PeerStopped {
        /// The peer rank.
        peer: usize,
        /// Its process id.
        pid: u32,
    },
    /// The peer aborted its connections (or closed its communicator) while we needed it.
    PeerAborted {
        /// The peer rank.
        peer: usize,
        /// The origin and reason it gave.
        abort: Abort,
    },
    /// The peer wrote something the slot protocol does not allow.
    Protocol {
        /// The peer rank.
        peer: usize,
        /// The channel.
        channel: usize,
        /// What was wrong.
        what: String,
    },
    /// A connector was used out of order (post without a slot, release without a chunk).
    Usage {
        /// The peer rank.
        peer: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// Setting up a connection's resources failed (`shm_open`, `ftruncate`, `mmap`, ...).
    Setup {
        /// The peer rank, when the failing step concerns one peer.
        peer: Option<usize>,
        /// The failing step.
        op: &'static str,
        /// What it acted on (a shared-memory name, ...).
        on: String,
        /// The OS error.
        source: io::Error,
    },
    /// Connection information from a peer that does not describe a usable connection.
    BadInfo {
        /// The peer rank.
        peer: usize,
        /// What was wrong.
        what: String,
    },
    /// A work request on the QP of a channel completed with an error other than the peer
    /// being unreachable (which is [`TransportError::PeerDied`]): the QP is in the error state.
    QpFailed {
        /// The peer rank.
        peer: usize,
        /// The channel.
        channel: usize,
        /// The local QPN.
        qpn: u32,
        /// What the failed WR was.
        wr: &'static str,
        /// The completion status (`IBV_WC_*`).
        status: WcStatus,
    },
    /// A verb of the RDMA device failed (`ibv_reg_mr`, `ibv_modify_qp`, `ibv_post_send`, ...).
    Verbs {
        /// The peer rank, when the verb concerns one.
        peer: Option<usize>,
        /// The verb.
        op: &'static str,
        /// The device's error (boxed: it is large, and errors travel in every `Result`).
        source: Box<DeviceError>,
    },
    /// The transport cannot connect this peer pair.
    Unavailable {
        /// The transport.
        transport: TransportKind,
        /// The peer rank.
        peer: usize,
        /// Why.
        reason: String,
    },
}

impl TransportError {
    /// The peer rank the error concerns, if it concerns one.
    pub fn peer(&self) -> Option<usize> {
        match *self {
            TransportError::Timeout { peer, .. }
            | TransportError::PeerDied { peer, .. }
            | TransportError::PeerStopped { peer, .. }
            | TransportError::PeerAborted { peer, .. }
            | TransportError::Protocol { peer, .. }
            | TransportError::Usage { peer, .. }
            | TransportError::BadInfo { peer, .. }
            | TransportError::QpFailed { peer, .. }
            | TransportError::Unavailable { peer, .. } => Some(peer),
            TransportError::Setup { peer, .. } | TransportError::Verbs { peer, .. } => peer,
        }
    }

    /// The abort this rank writes into its connections after this error (`self_rank` is the
    /// rank that saw it).
    pub fn abort_for(&self, self_rank: usize) -> Abort {
        match *self {
            TransportError::PeerAborted { abort, .. } => match abort.reason {
                // A peer that closed is the origin of our failure.
                AbortReason::Closed => Abort {
                    origin: abort.origin,
                    reason: AbortReason::Error,
                },
                _ => abort,
            },
            TransportError::PeerDied { peer, .. } => Abort {
                origin: peer,
                reason: AbortReason::PeerDied,
            },
            // The peer that made no progress is the origin.
            TransportError::Timeout { peer, .. } | TransportError::PeerStopped { peer, .. } => {
                Abort {
                    origin: peer,
                    reason: AbortReason::Timeout,
                }
            }
            TransportError::Protocol { peer, .. } => Abort {
                origin: peer,
                reason: AbortReason::Protocol,
            },
            _ => Abort {
                origin: self_rank,
                reason: AbortReason::Error,
            },
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Timeout {
                peer,
                channel,
                waiting_for,
                after_ms,
            } => write!(
                f,
                "timed out after {after_ms} ms waiting for {waiting_for} from peer rank {peer} (channel {channel})"
            ),
            TransportError::PeerDied { peer, pid } => {
                write!(f, "peer rank {peer} (pid {pid}) died")
            }
            TransportError::PeerStopped { peer, pid } => write!(
                f,
                "peer rank {peer} (pid {pid}) is stopped (SIGSTOP or a debugger) and not answering"
            ),
            TransportError::PeerAborted { peer, abort } => {
                if abort.origin == *peer {
                    write!(f, "peer rank {peer} {}", abort.reason)
                } else {
                    write!(f, "peer rank {peer} aborted: {abort}")
                }
            }
            TransportError::Protocol { peer, channel, what } => write!(
                f,
                "protocol violation from peer rank {peer} (channel {channel}): {what}"
            ),
            TransportError::Usage { peer, what } => {
                write!(f, "connector to peer rank {peer} misused: {what}")
            }
            TransportError::Setup {
                peer,
                op,
                on,
                source,
            } => match peer {
                Some(p) => write!(f, "{op} {on} for peer rank {p} failed: {source}"),
                None => write!(f, "{op} {on} failed: {source}"),
            },
            TransportError::BadInfo { peer, what } => {
                write!(f, "bad connection info from peer rank {peer}: {what}")
            }
            TransportError::QpFailed {
                peer,
                channel,
                qpn,
                wr,
                status,
            } => write!(
                f,
                "QP {qpn:#x} to peer rank {peer} (channel {channel}) failed: {wr} completed with \
                 {status} (IBV_WC status {})",
                status.ibv()
            ),
            TransportError::Verbs { peer, op, source } => match peer {
                Some(p) => write!(f, "{op} for peer rank {p} failed: {source}"),
                None => write!(f, "{op} failed: {source}"),
            },
            TransportError::Unavailable {
                transport,
                peer,
                reason,
            } => write!(
                f,
                "transport {transport} cannot connect peer rank {peer}: {reason}"
            ),
        }
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransportError::Setup { source, .. } => Some(source),
            TransportError::Verbs { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// A received, not yet released, slot.
#[derive(Debug)]
pub struct RecvChunk<'a> {
    /// The immediate (its step already checked by the connector).
    pub imm: Imm,
    /// The sender's operation descriptor (to be checked by the algorithm).
    pub desc: OpDesc,
    /// The payload, `len` bytes of the slot (at most the slot size, checked).
    pub data: &'a [u8],
}

/// The sending end of one channel to one peer.
///
/// Use: [`wait_slot`](Self::wait_slot), fill (a prefix of) the slot, [`post`](Self::post); repeat.
/// At the end of an operation, [`drain`](Self::drain).
pub trait SendConnector: Send {
    /// The peer rank.
    fn peer(&self) -> usize;

    /// Payload capacity of one slot, in bytes.
    fn slot_bytes(&self) -> usize;

    /// Waits (at most `timeout` without progress) until the next step's slot is free and
    /// returns its payload area (`slot_bytes` long) to fill. Calling it again before
    /// [`post`](Self::post) returns the same slot.
    ///
    /// # Errors
    /// [`TransportError::Timeout`], [`TransportError::PeerDied`],
    /// [`TransportError::PeerAborted`].
    fn wait_slot(&mut self, timeout: Duration) -> Result<&mut [u8], TransportError>;

    /// Posts the first `len` bytes of the slot returned by [`wait_slot`](Self::wait_slot), with
    /// the immediate's `chunk` and the descriptor; never blocks.
    ///
    /// # Errors
    /// [`TransportError::Usage`] without a slot or with `len > slot_bytes`.
    fn post(&mut self, len: usize, chunk: u16, desc: &OpDesc) -> Result<(), TransportError>;

    /// Sends `src` (at most `slot_bytes`) as the next step: waits for a slot as
    /// [`wait_slot`](Self::wait_slot) does, then posts. A transport that can read `src` where it
    /// is (RoCE: an RDMA WRITE whose payload SGE points into the registered user buffer) does so
    /// instead of copying it into the slot first; the default copies.
    ///
    /// `region` is the whole user buffer `src` lies in (a transport that registers memory
    /// registers all of it on the first send, so that the sends of every later chunk of it find
    /// the registration in its cache); a `region` that does not contain `src` is ignored. Only
    /// `src` is read.
    ///
    /// # Safety
    /// The transport may read `src` after this returns: the caller must keep its bytes alive
    /// and unwritten until a later [`drain`](Self::drain) of this connector returns `Ok`, or
    /// [`abort`](Self::abort) returns, or the connector is dropped (each of which waits for, or
    /// cancels, every read of `src`).
    ///
    /// # Errors
    /// As [`wait_slot`](Self::wait_slot) and [`post`](Self::post); [`TransportError::Usage`]
    /// while a slot from `wait_slot` is held.
    // Declares the zero-copy contract (see `# Safety`); the one unsafe method of the trait.
    #[allow(unsafe_code)]
    unsafe fn post_from(
        &mut self,
        src: &[u8],
        region: &[u8],
        chunk: u16,
        desc: &OpDesc,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let _ = region;
        let peer = self.peer();
        let slot = self.wait_slot(timeout)?;
        let Some(dst) = slot.get_mut(..src.len()) else {
            return Err(TransportError::Usage {
                peer,
                what: "post longer than a slot",
            });
        };
        dst.copy_from_slice(src);
        self.post(src.len(), chunk, desc)
    }

    /// Waits (at most `timeout` without progress) until the peer has consumed every posted
    /// step. Returns at once when nothing is outstanding.
    ///
    /// # Errors
    /// As [`wait_slot`](Self::wait_slot).
    fn drain(&mut self, timeout: Duration) -> Result<(), TransportError>;

    /// Marks the connection aborted with `abort` and wakes the peer. The first abort stays.
    /// Returns once the transport no longer reads memory given to
    /// [`post_from`](Self::post_from).
    fn abort(&mut self, abort: Abort);
}

/// The receiving end of one channel from one peer.
///
/// Use: [`wait`](Self::wait), read the chunk, [`release`](Self::release) (the credit); repeat.
pub trait RecvConnector: Send {
    /// The peer rank.
    fn peer(&self) -> usize;

    /// Payload capacity of one slot, in bytes.
    fn slot_bytes(&self) -> usize;

    /// Waits (at most `timeout` without progress) for the next step and returns it. Calling it
    /// again before [`release`](Self::release) returns the same chunk.
    ///
    /// # Errors
    /// [`TransportError::Timeout`], [`TransportError::PeerDied`],
    /// [`TransportError::PeerAborted`], and [`TransportError::Protocol`] for a step out of
    /// order or a length over the slot size.
    fn wait(&mut self, timeout: Duration) -> Result<RecvChunk<'_>, TransportError>;

    /// Returns the slot of the chunk last returned by [`wait`](Self::wait) to the sender.
    ///
    /// # Errors
    /// [`TransportError::Usage`] when no chunk is held.
    fn release(&mut self) -> Result<(), TransportError>;

    /// Marks the connection aborted with `abort` and wakes the peer. The first abort stays.
    fn abort(&mut self, abort: Abort);
}

/// The connectors of one peer, one per channel in each direction.
pub struct PeerConnectors {
    /// The peer rank.
    pub peer: usize,
    /// Channels to the peer, index = channel.
    pub send: Vec<Box<dyn SendConnector>>,
    /// Channels from the peer, index = channel.
    pub recv: Vec<Box<dyn RecvConnector>>,
}

impl fmt::Debug for PeerConnectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerConnectors")
            .field("peer", &self.peer)
            .field("channels", &self.send.len())
            .finish()
    }
}

/// What every transport is told when it sets up connections.
#[derive(Debug, Clone, Copy)]
pub struct SetupContext<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Channels per peer pair.
    pub nchannels: usize,
    /// Slots per channel (NCCL's `NCCL_STEPS`).
    pub nslots: usize,
    /// Payload bytes per slot (a multiple of 64).
    pub slot_bytes: usize,
    /// The communicator's unique tag (from its unique id): names its resources.
    pub tag: u64,
    /// Every rank's business card, index = rank.
    pub cards: &'a [BusinessCard],
    /// How connectors wait.
    pub wait: WaitPolicy,
    /// This rank's address on its connection to the rendezvous root (the RoCE transport binds
    /// its device there unless told otherwise).
    pub bootstrap_addr: Option<IpAddr>,
}

/// A transport: sets up the connectors of the peers the topology assigned to it.
///
/// Setup runs in three phases around the bootstrap's all-gathers (NCCL's `setup` / `connect`):
/// 1. [`setup`](Self::setup): allocate and register this rank's receive slots for `peers` and
///    return the connection info peers need to write into them (shm: a segment name; RoCE: QPNs,
///    GID, PSNs, rkey and slot addresses). The bootstrap all-gathers every rank's info.
/// 2. [`connect`](Self::connect): given every rank's info, build the send and receive
///    connectors of each peer (shm: map the peer's segment; RoCE: move QPs to RTR/RTS).
/// 3. After a bootstrap barrier (every rank connected), [`finish`](Self::finish): drop what
///    only setup needed (shm: unlink the segment names, so nothing leaks if a process dies).
pub trait Transport {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Phase 1; returns this rank's connection info.
    ///
    /// # Errors
    /// [`TransportError::Setup`] when resources cannot be allocated.
    fn setup(&mut self, ctx: &SetupContext<'_>, peers: &[usize])
        -> Result<Vec<u8>, TransportError>;

    /// Phase 2; `infos[r]` is rank `r`'s connection info (empty for ranks that use another
    /// transport). Returns the connectors of every peer in `peers`, in that order.
    ///
    /// # Errors
    /// [`TransportError::BadInfo`], [`TransportError::Setup`].
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        peers: &[usize],
        infos: &[Vec<u8>],
    ) -> Result<Vec<PeerConnectors>, TransportError>;

    /// Phase 3.
    ///
    /// # Errors
    /// [`TransportError::Setup`].
    fn finish(&mut self) -> Result<(), TransportError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_header_round_trips_and_has_fixed_offsets() {
        let h = SlotHeader {
            len: 0x1122_3344,
            imm: Imm {
                step: 0xabcd,
                chunk: 0x0102,
            },
            desc: OpDesc::new(
                7,
                CollKind::Reduce,
                DataType::Bf16,
                Some(RedOp::Max),
                Some(3),
                1 << 40,
            ),
        };
        let b = h.encode();
        assert_eq!(SlotHeader::decode(&b), h);
        assert_eq!(&b[0..4], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&b[4..8], &0xabcd_0102u32.to_le_bytes());
        assert_eq!(b[28], 3);
        assert_eq!(b[29], DataType::Bf16 as u8);
        assert_eq!(b[30], RedOp::Max as u8);
        assert!(b[31..].iter().all(|&x| x == 0));
        // Any 64 bytes decode, unknown kinds stay visible.
        let junk = SlotHeader::decode(&[0xff; 64]);
        assert_eq!(junk.desc.coll, CollKind::Unknown(0xff));
    }

    #[test]
    fn abort_word_round_trips() {
        for origin in [0usize, 1, 7, 1000] {
            let a = Abort {
                origin,
                reason: AbortReason::PeerDied,
            };
            assert_eq!(Abort::from_word(a.to_word()), Some(a));
        }
        assert_eq!(Abort::from_word(0), None);
        assert_eq!(
            Imm::from_raw(Imm { step: 3, chunk: 9 }.to_raw()),
            Imm { step: 3, chunk: 9 }
        );
    }

    #[test]
    fn desc_display_names_everything() {
        let d = OpDesc::new(
            2,
            CollKind::AllReduce,
            DataType::F32,
            Some(RedOp::Sum),
            None,
            1000,
        );
        assert_eq!(d.to_string(), "#2 all_reduce(count=1000, float, sum)");
        let d = OpDesc::new(5, CollKind::Broadcast, DataType::U8, None, Some(2), 3);
        assert_eq!(d.to_string(), "#5 broadcast(count=3, uint8, root=2)");
    }
}
