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
        let (desc, mut io) = self.begin(
            CollKind::AllReduce,
            datatype,
            Some(op),
            None,
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::AllReduce,
            datatype,
            Some(op),
            None,
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Broadcast,
            datatype,
            None,
            Some(root),
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Broadcast,
            datatype,
            None,
            Some(root),
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Reduce,
            datatype,
            Some(op),
            Some(root),
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Reduce,
            datatype,
            Some(op),
            Some(root),
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::AllGather,
            datatype,
            None,
            None,
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::AllGather,
            datatype,
            None,
            None,
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::ReduceScatter,
            datatype,
            Some(op),
            None,
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::ReduceScatter,
            datatype,
            Some(op),
            None,
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::AllToAll,
            datatype,
            None,
            None,
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::AllToAll,
            datatype,
            None,
            None,
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Scatter,
            datatype,
            None,
            Some(root),
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Scatter,
            datatype,
            None,
            Some(root),
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Gather,
            datatype,
            None,
            Some(root),
            count,
            Buffers::OutOfPlace { send, recv },
        )?;
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
        let (desc, mut io) = self.begin(
            CollKind::Gather,
            datatype,
            None,
            Some(root),
            count,
            Buffers::InPlace(buf),
        )?;
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
        let (desc, _) = self.begin(
            CollKind::Barrier,
            DataType::U8,
            None,
            None,
            0,
            Buffers::None,
        )?;
        self.run(desc, desc, DataType::U8, RedOp::Sum, pairwise::barrier)
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
