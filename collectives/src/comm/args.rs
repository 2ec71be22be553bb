//! The argument checks of every operation, in one place.
//!
//! Each collective's rule is one row of [`rule`]: how many blocks of `count` elements its input
//! (`send`) and output (`recv`) hold (one, or one per rank), whether a buffer is used on the root
//! only (other ranks may pass an empty one), and, in place, where this rank's input and output lie
//! in the one buffer (which holds the larger of the two). `Communicator::begin` applies a row:
//! every collective calls it once, and `Communicator::check_send_recv` does the same for
//! point-to-point. The device forms (`*_mem`) size their staging copies from the same rows.
//!
//! The checks run in this order, and the first that fails aborts the communicator with a
//! [`CollError::InvalidArgument`]: the root is below `nranks`; `count` elements per block times the
//! blocks of the larger buffer do not overflow; the input buffer is long enough; the output buffer
//! is long enough.

use crate::transport::CollKind;

/// How many blocks of `count` elements a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocks {
    /// One block: `count` elements.
    One,
    /// One block per rank: `nranks * count` elements.
    PerRank,
}

impl Blocks {
    /// The number of blocks among `nranks` ranks.
    pub(crate) fn of(self, nranks: usize) -> usize {
        match self {
            Blocks::One => 1,
            Blocks::PerRank => nranks,
        }
    }
}

/// Where, in an in-place operation's buffer, this rank's input or output lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    /// At the start of the buffer.
    Start,
    /// At block `rank` (NCCL's `sendbuff == recvbuff + rank * count` and the reverse).
    OwnBlock,
}

/// One collective's argument rule (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Blocks of the input.
    pub(crate) send: Blocks,
    /// Blocks of the output.
    pub(crate) recv: Blocks,
    /// The input is read on the root only (broadcast, scatter).
    pub(crate) send_on_root_only: bool,
    /// The output is written on the root only (reduce, gather).
    pub(crate) recv_on_root_only: bool,
    /// In place: where this rank's input lies.
    pub(crate) input_at: At,
    /// In place: where this rank's output lies.
    pub(crate) output_at: At,
}

impl Rule {
    /// Blocks of the in-place buffer: the larger of input and output.
    pub(crate) fn in_place(&self) -> Blocks {
        if self.send == Blocks::PerRank || self.recv == Blocks::PerRank {
            Blocks::PerRank
        } else {
            Blocks::One
        }
    }
}

/// The argument rule of `coll`: the one table of buffer sizes, root rules and in-place layouts.
pub(crate) const fn rule(coll: CollKind) -> Rule {
    use At::{OwnBlock, Start};
    use Blocks::{One, PerRank};
    let (send, recv, send_on_root_only, recv_on_root_only, input_at, output_at) = match coll {
        CollKind::AllReduce => (One, One, false, false, Start, Start),
        CollKind::Broadcast => (One, One, true, false, Start, Start),
        CollKind::Reduce => (One, One, false, true, Start, Start),
        CollKind::AllGather => (One, PerRank, false, false, OwnBlock, Start),
        CollKind::ReduceScatter => (PerRank, One, false, false, Start, OwnBlock),
        CollKind::AllToAll => (PerRank, PerRank, false, false, Start, Start),
        CollKind::Scatter => (PerRank, One, true, false, Start, OwnBlock),
        CollKind::Gather => (One, PerRank, false, true, OwnBlock, Start),
        // No buffers (barrier), or sized per side (point-to-point: `check_send_recv`).
        CollKind::Barrier | CollKind::SendRecv | CollKind::Unknown(_) => {
            (One, One, false, false, Start, Start)
        }
    };
    Rule {
        send,
        recv,
        send_on_root_only,
        recv_on_root_only,
        input_at,
        output_at,
    }
}
