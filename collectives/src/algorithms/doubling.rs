//! Recursive-doubling all-reduce for small buffers: `log2(p)` exchange steps, each moving the
//! whole buffer, instead of the ring's `2 (nranks - 1)` steps of `1 / nranks` of it.
//!
//! Below a size threshold an all-reduce is bound by the latency of its steps, not by bandwidth:
//! MPICH and Open MPI switch to recursive doubling there (Thakur, Rabenseifner and Gropp,
//! "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005, §4.4), NCCL to
//! its tree and LL protocols. For 4 ranks that is 2 steps instead of 6.
//!
//! Schedule for `n` ranks, `p` the largest power of two `<= n`, `extra = n - p`:
//!
//! ```text
//! fold     rank r >= p       send its input to r - p, then wait for the result from it
//!          rank r < extra    receive from r + p and reduce: op(x[r], x[r + p])
//! double   rank r < p        for mask = 1, 2, 4, .. < p: exchange with r ^ mask and reduce
//!                            op(lower block's value, higher block's value)
//! unfold   rank r < extra    send the result to r + p
//! ```
//!
//! **Reduction order.** Every combine puts the operand of the lower-ranked block first, so the
//! result is the same balanced tree on every rank (`op(op(x0, x1), op(x2, x3))` for 4 ranks, with
//! `x[r]` already folded with `x[r + p]`), bit for bit, including `min` / `max` of signed zeros
//! and NaN payloads, where swapping operands can change the bits. It depends only on `nranks`.

use super::{Io, Op};
use crate::datatype::RedOp;
use crate::error::CollError;
use crate::reduce;

/// Largest buffer, in bytes, that [`crate::Communicator`]'s all-reduce sends by recursive
/// doubling (when it also fits one slot) when any of its ranks talk over RoCE; larger ones take
/// the ring. Measured with 4 ranks on
/// this project's 2-CPU machine (`coll-perf all-reduce -b 1K -e 128K -f 2 -n 100`, each
/// schedule forced, load 5): doubling took 235 / 572 / 1204 us at 1 / 64 / 128 KiB over RoCE
/// against the ring's 620 / 913 / 1273, and 57 / 181 / 372 us over shared memory against 168 /
/// 232 / 556. Doubling moves `log2(p)` times the buffer per rank against the ring's
/// `2 (n - 1) / n`, so its edge shrinks as ranks grow; 64 KiB keeps a margin below where it
/// was still ahead for 4 ranks.
pub const MAX_BYTES: usize = 64 << 10;

/// [`MAX_BYTES`] for a communicator whose ranks all share memory (no RoCE pair): a step costs
/// little there, so the ring's smaller traffic wins sooner. Same machine, 4 ranks, low load:
/// doubling took 61-80 us at 16 KiB against the ring's 84-97, but 39-121 against 70-103 at
/// 32 KiB and 70-151 against 65-86 at 64 KiB.
pub const MAX_BYTES_LOCAL: usize = 16 << 10;

/// Chunk ids of the three phases (a message's chunk id must be the one its receiver expects).
const FOLD: usize = 0;
const UNFOLD: usize = 1;
const FIRST_STEP: usize = 2;

/// Recursive-doubling all-reduce of `count` elements (`count * size` bytes must fit one chunk:
/// [`Op::chunk_bytes`]): output = op over all ranks' inputs, on every rank.
///
/// # Errors
/// [`CollError`] from the transport (a peer that fails or mismatches), or
/// [`CollError::Kernel`].
pub(crate) fn all_reduce(op: &mut Op<'_>, io: &mut Io<'_>, count: usize) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (datatype, redop) = (op.datatype, op.redop);
    let bytes = count * datatype.size();
    let all = 0..bytes;
    io.copy_input_to_output(all.clone(), all.clone());
    if n == 1 {
        // One rank: the reduction (and `avg`'s division by 1) is the identity.
        return Ok(());
    }
    let desc = op.send_desc;
    let kernel = move |e| CollError::Kernel {
        op: desc,
        source: e,
    };
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p;
    if r >= p {
        let partner = r - p;
        op.send_with(partner, FOLD, bytes, |slot| {
            slot.copy_from_slice(io.output(all.clone()));
            Ok(())
        })?;
        return op.recv_with(partner, UNFOLD, bytes, |result| {
            io.output(all.clone()).copy_from_slice(result);
            Ok(())
        });
    }
    // `op(mine, theirs)` when this rank's block is the lower one, else `op(theirs, mine)`.
    // Allocated on the first combine that needs it (a rank that is never the lower one of a
    // pair, such as the highest, never does).
    let mut scratch = Vec::new();
    let mut combine = |io: &mut Io<'_>, theirs: &[u8], mine_lower: bool| {
        let acc = io.output(0..bytes);
        if mine_lower {
            scratch.resize(bytes, 0);
            reduce::reduce_copy(datatype, redop, &mut scratch, acc, theirs).map_err(kernel)?;
            acc.copy_from_slice(&scratch);
            Ok(())
        } else {
            reduce::reduce_in_place(datatype, redop, acc, theirs).map_err(kernel)
        }
    };
    if r < extra {
        op.recv_with(r + p, FOLD, bytes, |theirs| combine(io, theirs, true))?;
    }
    let mut mask = 1;
    let mut step = FIRST_STEP;
    while mask < p {
        let partner = r ^ mask;
        op.send_with(partner, step, bytes, |slot| {
            slot.copy_from_slice(io.output(all.clone()));
            Ok(())
        })?;
        op.recv_with(partner, step, bytes, |theirs| {
            combine(io, theirs, r < partner)
        })?;
        mask <<= 1;
        step += 1;
    }
    if redop == RedOp::Avg {
        reduce::divide_in_place(datatype, io.output(all.clone()), n as u32).map_err(kernel)?;
    }
    if r < extra {
        op.send_with(r + p, UNFOLD, bytes, |slot| {
            slot.copy_from_slice(io.output(all.clone()));
            Ok(())
        })?;
    }
    Ok(())
}
