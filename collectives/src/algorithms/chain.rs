//! Pipelined chains along the ring order: broadcast flows from the root down
//! `root -> root+1 -> ... -> root-1`; reduce flows up `root+1 -> root+2 -> ... -> root`, each
//! rank adding its contribution (NCCL's ring broadcast and ring reduce). Chunks follow each other
//! down the chain, so every link is busy at once and the time approaches one buffer transfer
//! (nccl-tests' bus-bandwidth factor 1).

use super::{piece, rounds, Io, Op};
use crate::datatype::RedOp;
use crate::error::CollError;
use crate::reduce;

/// Broadcast of `count` elements from `root`'s input to every rank's output.
pub(crate) fn broadcast(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
    root: usize,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let pos = (r + n - root) % n;
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    for c in 0..rounds(count, ce) {
        let p = piece(0, count, c, ce, es);
        if pos == 0 {
            io.copy_input_to_output(p.clone(), p.clone());
            if n > 1 {
                // Final in the output (in place: the input itself), and never written again.
                op.forward_output(next, c, io, p.clone())?;
            }
        } else if pos == n - 1 {
            op.recv_to_output(prev, c, io, p)?;
        } else {
            op.recv_copy_send(prev, next, c, io, p)?;
        }
    }
    Ok(())
}

/// Reduce of `count` elements to `root`'s output (other ranks' outputs are not written).
pub(crate) fn reduce(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
    root: usize,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    // Position in the chain root+1, root+2, ..., root.
    let pos = (r + 2 * n - root - 1) % n;
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    let (datatype, redop, nranks) = (op.datatype, op.redop, n as u32);
    let desc = op.send_desc;
    let kernel = move |e| CollError::Kernel {
        op: desc,
        source: e,
    };
    if n == 1 {
        // One rank: the reduction (and `avg`'s division by 1) is the identity.
        io.copy_input_to_output(0..count * es, 0..count * es);
        return Ok(());
    }
    for c in 0..rounds(count, ce) {
        let p = piece(0, count, c, ce, es);
        if pos == 0 {
            op.send_input(next, c, io, p.clone())?;
        } else if pos == n - 1 {
            op.recv_with(prev, c, p.len(), |incoming| {
                io.reduce_to_output(p.clone(), p.clone(), incoming, datatype, redop)
                    .map_err(kernel)?;
                if redop == RedOp::Avg {
                    reduce::divide_in_place(datatype, io.output(p.clone()), nranks)
                        .map_err(kernel)?;
                }
                Ok(())
            })?;
        } else {
            let local = io.input(p.clone());
            op.recv_send_with(prev, next, c, p.len(), |incoming, slot| {
                reduce::reduce_copy(datatype, redop, slot, incoming, local).map_err(kernel)
            })?;
        }
    }
    Ok(())
}
