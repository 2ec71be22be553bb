//! The argument checks of every operation, in one place.
//!
//! Each collective's rule is one row of [`rule`]: how many blocks of `count` elements its input
//! (`send`) and output (`recv`) hold (one, or one per rank), whether a buffer is used on the root
//! only (other ranks may pass an empty one), and, in place, where this rank's input and output lie
//! in the one buffer (which holds the larger of the two). [`Communicator::begin`] applies a row:
//! every collective calls it once, and [`Communicator::check_send_recv`] does the same for
//! point-to-point. The device forms (`*_mem`) size their staging copies from the same rows.
//!
//! The checks run in this order, and the first that fails aborts the communicator with a
//! [`CollError::InvalidArgument`]: the root is below `nranks`; `count` elements per block times the
//! blocks of the larger buffer do not overflow; the input buffer is long enough; the output buffer
//! is long enough.

use crate::algorithms::Io;
use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::transport::{CollKind, OpDesc};

use super::Communicator;

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
enum At {
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
    send_on_root_only: bool,
    /// The output is written on the root only (reduce, gather).
    recv_on_root_only: bool,
    /// In place: where this rank's input lies.
    input_at: At,
    /// In place: where this rank's output lies.
    output_at: At,
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

/// The buffers a collective was called with.
pub(super) enum Buffers<'a> {
    /// Separate input and output.
    OutOfPlace {
        /// The input.
        send: &'a [u8],
        /// The output.
        recv: &'a mut [u8],
    },
    /// One buffer for both, in NCCL's in-place layout.
    InPlace(&'a mut [u8]),
    /// None (barrier).
    None,
}

impl Communicator {
    /// Fails (and aborts) the operation with an argument error.
    pub(crate) fn invalid(&mut self, op: CollKind, what: String) -> CollError {
        let e = CollError::InvalidArgument { op, what };
        if self.failure.is_none() {
            self.abort(&e);
        }
        e
    }

    /// The byte size of `count * blocks` elements of `datatype`, checked for overflow.
    pub(crate) fn bytes(
        &mut self,
        coll: CollKind,
        count: usize,
        blocks: usize,
        datatype: DataType,
    ) -> Result<usize, CollError> {
        match count
            .checked_mul(blocks)
            .and_then(|n| n.checked_mul(datatype.size()))
        {
            Some(bytes) => Ok(bytes),
            None => Err(self.invalid(
                coll,
                format!("{count} x {blocks} {datatype} elements overflow"),
            )),
        }
    }

    /// Checks that the `what` buffer (`send`, `recv`, or empty for an in-place one) holds `need`
    /// bytes.
    pub(crate) fn need(
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

    /// Starts collective `coll`: takes a sequence number for its descriptor, checks the arguments
    /// against [`rule`]`(coll)` and returns the descriptor and the buffers cut to size (a buffer
    /// the rule uses on the root only is empty elsewhere).
    pub(super) fn begin<'a>(
        &mut self,
        coll: CollKind,
        datatype: DataType,
        redop: Option<RedOp>,
        root: Option<usize>,
        count: usize,
        buffers: Buffers<'a>,
    ) -> Result<(OpDesc, Io<'a>), CollError> {
        let rule = rule(coll);
        let desc = OpDesc::new(self.seq, coll, datatype, redop, root, count);
        self.seq += 1;
        if let Some(root) = root.filter(|&r| r >= self.nranks) {
            return Err(self.invalid(
                coll,
                format!("root {root} is not below nranks {}", self.nranks),
            ));
        }
        let blocks = rule.in_place().of(self.nranks);
        let total = self.bytes(coll, count, blocks, datatype)?;
        let block = total / blocks;
        let size = |b: Blocks| match b {
            Blocks::One => block,
            Blocks::PerRank => total,
        };
        let on_root = root == Some(self.rank);
        let io = match buffers {
            Buffers::OutOfPlace { send, recv } => {
                let send: &[u8] = if rule.send_on_root_only && !on_root {
                    &[]
                } else {
                    let bytes = size(rule.send);
                    self.need(coll, "send", send.len(), bytes)?;
                    &send[..bytes]
                };
                let recv: &mut [u8] = if rule.recv_on_root_only && !on_root {
                    &mut []
                } else {
                    let bytes = size(rule.recv);
                    self.need(coll, "recv", recv.len(), bytes)?;
                    &mut recv[..bytes]
                };
                Io::out_of_place(send, recv)
            }
            Buffers::InPlace(buf) => {
                self.need(coll, "", buf.len(), total)?;
                let at = |a: At| match a {
                    At::Start => 0,
                    At::OwnBlock => self.rank * block,
                };
                Io::in_place(&mut buf[..total], at(rule.input_at), at(rule.output_at))
            }
            Buffers::None => Io::out_of_place(&[], &mut []),
        };
        Ok((desc, io))
    }

    /// Checks the arguments of a point-to-point operation (see [`Communicator::send_recv`]):
    /// the byte sizes of both sides, peers below `nranks`, buffers long enough for the sides in
    /// use, and a send to or receive from this rank itself only as both, with equal counts.
    /// Returns `(send bytes, recv bytes)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_send_recv(
        &mut self,
        send: &[u8],
        send_count: usize,
        to: Option<usize>,
        recv: &[u8],
        recv_count: usize,
        from: Option<usize>,
        datatype: DataType,
    ) -> Result<(usize, usize), CollError> {
        let coll = CollKind::SendRecv;
        let es = datatype.size();
        let bytes = |c: usize| c.checked_mul(es);
        let (Some(send_bytes), Some(recv_bytes)) = (bytes(send_count), bytes(recv_count)) else {
            return Err(self.invalid(coll, "element count overflows".into()));
        };
        for &peer in to.iter().chain(from.iter()) {
            if peer >= self.nranks {
                return Err(self.invalid(
                    coll,
                    format!("peer {peer} is not below nranks {}", self.nranks),
                ));
            }
        }
        if to.is_some() {
            self.need(coll, "send", send.len(), send_bytes)?;
        }
        if from.is_some() {
            self.need(coll, "recv", recv.len(), recv_bytes)?;
        }
        let me = Some(self.rank);
        if (to == me || from == me) && (to != from || send_count != recv_count) {
            return Err(self.invalid(
                coll,
                "a send to or receive from this rank itself needs both, with equal counts".into(),
            ));
        }
        Ok((send_bytes, recv_bytes))
    }
}
