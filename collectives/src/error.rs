//! The errors of communicator creation and of collective operations.

use core::fmt;

use crate::bootstrap::{BootstrapError, EnvError};
use crate::reduce::KernelError;
use crate::topology::TopologyError;
use crate::transport::{Abort, AbortReason, CollKind, OpDesc, TransportError};

/// Creating a communicator failed.
#[derive(Debug)]
pub enum InitError {
    /// Bad arguments to `init` (rank out of range, zero slots, ...).
    InvalidArgument(String),
    /// The launcher environment is incomplete or malformed.
    Env(EnvError),
    /// The rendezvous failed.
    Bootstrap(BootstrapError),
    /// A rank was configured differently (transport request, channels, slots, slot size).
    ConfigMismatch {
        /// The peer rank.
        peer: usize,
        /// What differs.
        what: String,
    },
    /// The requested transport cannot reach a peer.
    Topology(TopologyError),
    /// Setting up a transport connection failed.
    Transport(TransportError),
    /// An operation over the parent communicator failed (a split's exchange).
    Collective(CollError),
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::InvalidArgument(what) => write!(f, "invalid communicator argument: {what}"),
            InitError::Env(e) => write!(f, "launcher environment: {e}"),
            InitError::Bootstrap(e) => write!(f, "bootstrap: {e}"),
            InitError::ConfigMismatch { peer, what } => {
                write!(f, "peer rank {peer} is configured differently: {what}")
            }
            InitError::Topology(e) => write!(f, "topology: {e}"),
            InitError::Transport(e) => write!(f, "transport setup: {e}"),
            InitError::Collective(e) => write!(f, "exchange over the parent communicator: {e}"),
        }
    }
}

impl std::error::Error for InitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InitError::Env(e) => Some(e),
            InitError::Bootstrap(e) => Some(e),
            InitError::Topology(e) => Some(e),
            InitError::Transport(e) => Some(e),
            InitError::Collective(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BootstrapError> for InitError {
    fn from(e: BootstrapError) -> Self {
        InitError::Bootstrap(e)
    }
}

impl From<EnvError> for InitError {
    fn from(e: EnvError) -> Self {
        InitError::Env(e)
    }
}

impl From<TransportError> for InitError {
    fn from(e: TransportError) -> Self {
        InitError::Transport(e)
    }
}

/// A collective or point-to-point operation failed. After any error the communicator is
/// aborted: its peers are told (so they fail promptly too) and later calls return
/// [`CollError::Aborted`].
#[derive(Debug)]
pub enum CollError {
    /// Arguments that cannot describe the operation (buffer shorter than `count` elements, root
    /// or peer out of range, element count overflowing `usize`).
    InvalidArgument {
        /// The operation.
        op: CollKind,
        /// What is wrong.
        what: String,
    },
    /// A peer called a different operation (or the same one with a different count, data type,
    /// operator or root).
    Mismatch {
        /// This rank.
        rank: usize,
        /// This rank's operation.
        mine: OpDesc,
        /// The peer rank.
        peer: usize,
        /// The peer's operation.
        theirs: OpDesc,
    },
    /// A peer sent a message its own descriptor does not explain (wrong chunk index or length).
    Protocol {
        /// The operation.
        op: OpDesc,
        /// The peer rank.
        peer: usize,
        /// What was wrong.
        what: String,
    },
    /// The transport failed (a peer died, aborted, or timed out).
    Transport {
        /// The operation.
        op: OpDesc,
        /// The failure, naming the peer.
        source: TransportError,
    },
    /// A reduction kernel refused its operands (an internal inconsistency).
    Kernel {
        /// The operation.
        op: OpDesc,
        /// The kernel's error.
        source: KernelError,
    },
    /// A device buffer or the GPU peer-to-peer path failed (a CUDA call, an IPC mapping, a
    /// staged copy); `what` names the call and the GPU.
    Device {
        /// The operation.
        op: CollKind,
        /// This rank.
        rank: usize,
        /// What failed.
        what: String,
    },
    /// The operation was ended on this rank by [`crate::AbortHandle::abort`] (from any
    /// thread) while it waited; the communicator is aborted and its peers are told.
    Cancelled {
        /// The operation.
        op: CollKind,
        /// This rank.
        rank: usize,
    },
    /// The communicator failed earlier and was aborted.
    Aborted {
        /// The operation refused.
        op: CollKind,
        /// The first error.
        cause: String,
    },
}

impl CollError {
    /// The abort word this rank sends its peers after this error.
    pub(crate) fn abort_for(&self, rank: usize) -> Abort {
        match self {
            CollError::Transport { source, .. } => source.abort_for(rank),
            CollError::Mismatch { .. } => Abort {
                origin: rank,
                reason: AbortReason::Mismatch,
            },
            CollError::Protocol { peer, .. } => Abort {
                origin: *peer,
                reason: AbortReason::Protocol,
            },
            _ => Abort {
                origin: rank,
                reason: AbortReason::Error,
            },
        }
    }

    /// The peer rank the error names, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            CollError::Mismatch { peer, .. } | CollError::Protocol { peer, .. } => Some(*peer),
            CollError::Transport { source, .. } => source.peer(),
            _ => None,
        }
    }
}

impl fmt::Display for CollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollError::InvalidArgument { op, what } => write!(f, "{}: {what}", op.name()),
            CollError::Mismatch {
                rank,
                mine,
                peer,
                theirs,
            } => write!(
                f,
                "mismatched operations: rank {rank} called {mine} but peer rank {peer} called {theirs}"
            ),
            CollError::Protocol { op, peer, what } => {
                write!(f, "{op}: protocol violation from peer rank {peer}: {what}")
            }
            CollError::Transport { op, source } => write!(f, "{op} failed: {source}"),
            CollError::Kernel { op, source } => write!(f, "{op}: reduction failed: {source}"),
            CollError::Device { op, rank, what } => {
                write!(f, "{} on rank {rank}: device failure: {what}", op.name())
            }
            CollError::Cancelled { op, rank } => write!(
                f,
                "{} on rank {rank} ended by abort() while it was in progress",
                op.name()
            ),
            CollError::Aborted { op, cause } => write!(
                f,
                "{} refused: the communicator was aborted by an earlier error: {cause}",
                op.name()
            ),
        }
    }
}

impl std::error::Error for CollError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CollError::Transport { source, .. } => Some(source),
            CollError::Kernel { source, .. } => Some(source),
            _ => None,
        }
    }
}
