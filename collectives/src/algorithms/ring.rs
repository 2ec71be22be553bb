//! Ring algorithms: all-reduce (reduce-scatter + all-gather), reduce-scatter, all-gather.
//!
//! Ranks form the ring `0 -> 1 -> ... -> nranks-1 -> 0`; each rank receives only from `prev`
//! and sends only to `next`. The data is cut into `nranks` segments; each round moves one chunk of
//! every segment. For rank `r`, at step `t` of a round (NCCL `runRing`):
//!
//! ```text
//! reduce-scatter  t = 0            send          segment r-1 (its own input)
//!                 t = 1..n-2       recvReduceSend segment r-1-t
//!                 t = n-1          recvReduceCopy(Send) segment r: now complete
//! all-gather      t = 1..n-2       recvCopySend  segment r-t
//!                 t = n-1          recv          segment r+1
//! ```
//!
//! Every byte crosses `n - 1` links in each phase: the `2 (n - 1) / n` factor of nccl-tests'
//! all-reduce bus bandwidth.
//!
//! Every chunk a rank sends on after it is final in its output (the last reduce-scatter step,
//! and every all-gather step, including a rank's own block in all-gather) is sent from the
//! output itself (`Op::forward_output`): the output range is finished, and no later step of
//! the operation writes it (each output byte is written once per operation; the reduce-scatter
//! of round `k + 1` and the all-gather of round `k` touch other pieces).

use super::{piece, rounds, Io, Op};
use crate::datatype::RedOp;
use crate::error::CollError;
use crate::reduce;

/// Element range `(start, len)` of segment `s` when `count` elements are cut into `n`
/// segments as evenly as possible (the first `count % n` get one more).
fn segment(count: usize, n: usize, s: usize) -> (usize, usize) {
    let (base, rem) = (count / n, count % n);
    (s * base + s.min(rem), base + usize::from(s < rem))
}

/// The reduce-scatter phase for one round `k`: leaves the complete segment `r` in the output
/// (divided for `avg`) and, when `forward` is set, sends it on to `next` (all-reduce).
///
/// `seg(s)` gives segment `s` in input element coordinates; `out(s)` maps a byte range of
/// segment `s` in input coordinates to output coordinates.
fn reduce_scatter_round(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    k: usize,
    seg: &dyn Fn(usize) -> (usize, usize),
    out: &dyn Fn(core::ops::Range<usize>) -> core::ops::Range<usize>,
    forward: bool,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    let (datatype, redop) = (op.datatype, op.redop);
    let part = |s: usize| {
        let (start, len) = seg(s);
        piece(start, len, k, ce, es)
    };
    let id = |s: usize| k * n + s;

    let s = (r + n - 1) % n;
    let p = part(s);
    op.send_input(next, id(s), io, p.clone())?;
    for t in 1..n - 1 {
        let s = (r + 2 * n - 1 - t) % n;
        let p = part(s);
        let local = io.input(p.clone());
        let desc = op.send_desc;
        let kernel = move |e| CollError::Kernel {
            op: desc,
            source: e,
        };
        op.recv_send_with(prev, next, id(s), p.len(), |incoming, slot| {
            reduce::reduce_copy(datatype, redop, slot, incoming, local).map_err(kernel)
        })?;
    }
    let p = part(r);
    let o = out(p.clone());
    let nranks = n as u32;
    let desc = op.send_desc;
    let kernel = move |e| CollError::Kernel {
        op: desc,
        source: e,
    };
    let finish = |io: &mut Io<'_>, incoming: &[u8]| -> Result<(), CollError> {
        io.reduce_to_output(o.clone(), p.clone(), incoming, datatype, redop)
            .map_err(kernel)?;
        if redop == RedOp::Avg {
            reduce::divide_in_place(datatype, io.output(o.clone()), nranks).map_err(kernel)?;
        }
        Ok(())
    };
    op.recv_with(prev, id(r), p.len(), |incoming| finish(io, incoming))?;
    if forward {
        // The segment is complete: sent on from the output, which nothing writes again.
        op.forward_output(next, id(r), io, o)?;
    }
    Ok(())
}

/// Ring all-reduce of `count` elements: output = op over all ranks' inputs, on every rank.
pub(crate) fn all_reduce(op: &mut Op<'_>, io: &mut Io<'_>, count: usize) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let es = op.datatype.size();
    if n == 1 {
        io.copy_input_to_output(0..count * es, 0..count * es);
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let ce = op.chunk_elems();
    let seg = |s: usize| segment(count, n, s);
    let max_seg = seg(0).1;
    for k in 0..rounds(max_seg, ce) {
        reduce_scatter_round(op, io, k, &seg, &|b| b, true)?;
        let part = |s: usize| {
            let (start, len) = seg(s);
            piece(start, len, k, ce, es)
        };
        let id = |s: usize| k * n + s;
        for t in 1..n - 1 {
            let s = (r + n - t) % n;
            op.recv_copy_send(prev, next, id(s), io, part(s))?;
        }
        let s = (r + 1) % n;
        op.recv_to_output(prev, id(s), io, part(s))?;
    }
    Ok(())
}

/// Ring reduce-scatter: the input holds `nranks` blocks of `count` elements; the output (of
/// `count` elements) gets block `rank` reduced over all ranks.
pub(crate) fn reduce_scatter(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let es = op.datatype.size();
    let block = count * es;
    if n == 1 {
        // One rank: the reduction (and `avg`'s division by 1) is the identity.
        io.copy_input_to_output(0..block, 0..block);
        return Ok(());
    }
    let ce = op.chunk_elems();
    let seg = |s: usize| (s * count, count);
    let base = r * block;
    for k in 0..rounds(count, ce) {
        reduce_scatter_round(op, io, k, &seg, &|b| b.start - base..b.end - base, false)?;
    }
    Ok(())
}

/// Ring all-gather: every rank's input of `count` elements lands in block `rank` of every
/// rank's output.
pub(crate) fn all_gather(op: &mut Op<'_>, io: &mut Io<'_>, count: usize) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let es = op.datatype.size();
    let block = count * es;
    io.copy_input_to_output(0..block, r * block..(r + 1) * block);
    if n == 1 {
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let ce = op.chunk_elems();
    for k in 0..rounds(count, ce) {
        let part = |s: usize| piece(s * count, count, k, ce, es);
        let id = |s: usize| k * n + s;
        // This rank's block of the output is final (copied above, or the input itself in
        // place): sent from there, without a staging copy even in place.
        op.forward_output(next, id(r), io, part(r))?;
        for t in 1..n - 1 {
            let s = (r + n - t) % n;
            op.recv_copy_send(prev, next, id(s), io, part(s))?;
        }
        let s = (r + 1) % n;
        op.recv_to_output(prev, id(s), io, part(s))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::segment;

    #[test]
    fn segments_tile_any_count() {
        for count in [0usize, 1, 2, 7, 8, 9, 100] {
            for n in 1..=8 {
                let mut next = 0;
                for s in 0..n {
                    let (start, len) = segment(count, n, s);
                    assert_eq!(start, next);
                    next = start + len;
                }
                assert_eq!(next, count);
            }
        }
    }
}
