//! The collectives of a [`Communicator`] (NCCL's `ncclAllReduce` .. `ncclGather`, and a
//! barrier), each in place and out of place: check the arguments, pick the algorithm, run it.

use crate::algorithms::{chain, doubling, pairwise, ring, Io, Op};
use crate::datatype::{DataType, Element, RedOp};
use crate::error::CollError;
use crate::transport::CollKind;

use super::check::Buffers;
use super::Communicator;

impl Communicator {
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
        self.collective(
            Collective::AllReduce(op),
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::AllReduce(op),
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::Broadcast { root },
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::Broadcast { root },
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::Reduce { op, root },
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::Reduce { op, root },
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::AllGather,
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::AllGather,
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::ReduceScatter(op),
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::ReduceScatter(op),
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::AllToAll,
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(Collective::AllToAll, Buffers::InPlace(buf), count, datatype)
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
        self.collective(
            Collective::Scatter { root },
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::Scatter { root },
            Buffers::InPlace(buf),
            count,
            datatype,
        )
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
        self.collective(
            Collective::Gather { root },
            Buffers::OutOfPlace { send, recv },
            count,
            datatype,
        )
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
        self.collective(
            Collective::Gather { root },
            Buffers::InPlace(buf),
            count,
            datatype,
        )
    }

    /// Barrier: returns once every rank has entered it (dissemination, `ceil(log2 nranks)`
    /// rounds of empty messages).
    ///
    /// # Errors
    /// A peer that fails.
    pub fn barrier(&mut self) -> Result<(), CollError> {
        self.collective(Collective::Barrier, Buffers::None, 0, DataType::U8)
    }

    /// Runs collective `c` on `buffers` (`count` elements of `datatype`): checks the arguments
    /// ([`Self::begin`]), then runs the collective's algorithm. The in-place and out-of-place
    /// forms of every collective differ only in `buffers`.
    fn collective(
        &mut self,
        c: Collective,
        buffers: Buffers<'_>,
        count: usize,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let (kind, op, root) = match c {
            Collective::AllReduce(op) => (CollKind::AllReduce, Some(op), None),
            Collective::Broadcast { root } => (CollKind::Broadcast, None, Some(root)),
            Collective::Reduce { op, root } => (CollKind::Reduce, Some(op), Some(root)),
            Collective::AllGather => (CollKind::AllGather, None, None),
            Collective::ReduceScatter(op) => (CollKind::ReduceScatter, Some(op), None),
            Collective::AllToAll => (CollKind::AllToAll, None, None),
            Collective::Scatter { root } => (CollKind::Scatter, None, Some(root)),
            Collective::Gather { root } => (CollKind::Gather, None, Some(root)),
            Collective::Barrier => (CollKind::Barrier, None, None),
        };
        let (desc, mut io) = self.begin(kind, datatype, op, root, count, buffers)?;
        let doubling_max = self.doubling_max;
        // Collectives without a reduction carry `Sum`, which they never apply.
        self.run(desc, desc, datatype, op.unwrap_or(RedOp::Sum), |o| {
            let io = &mut io;
            match c {
                Collective::AllReduce(_) => all_reduce_algorithm(o, io, count, doubling_max),
                Collective::Broadcast { root } => chain::broadcast(o, io, count, root),
                Collective::Reduce { root, .. } => chain::reduce(o, io, count, root),
                Collective::AllGather => ring::all_gather(o, io, count),
                Collective::ReduceScatter(_) => ring::reduce_scatter(o, io, count),
                Collective::AllToAll => pairwise::all_to_all(o, io, count),
                Collective::Scatter { root } => pairwise::scatter(o, io, count, root),
                Collective::Gather { root } => pairwise::gather(o, io, count, root),
                Collective::Barrier => pairwise::barrier(o),
            }
        })
    }
}

/// A collective with the arguments that, besides the buffers, count and data type, its
/// algorithm takes: its reduction and its root, where it has them.
#[derive(Clone, Copy)]
enum Collective {
    AllReduce(RedOp),
    Broadcast { root: usize },
    Reduce { op: RedOp, root: usize },
    AllGather,
    ReduceScatter(RedOp),
    AllToAll,
    Scatter { root: usize },
    Gather { root: usize },
    Barrier,
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
