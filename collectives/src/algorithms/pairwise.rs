//! Direct exchanges: all-to-all, scatter, gather, point-to-point send/recv, and the barrier.
//!
//! * **All-to-all** by pairwise exchange: at step `s` (`0..nranks`) rank `r` trades blocks with
//!   `(s - r) mod nranks`, a pairing that is symmetric (the partner's partner is `r`), so both
//!   sides of a pair run the same step. A chunk is copied out to the peer before the chunk that
//!   replaces it is received, which makes the exchange correct in place.
//! * **Scatter / gather**: the root sends to (receives from) every peer, interleaving peers chunk
//!   by chunk so that all of them progress.
//! * **Send / recv**: chunks to or from one peer; `send_recv` interleaves a send and a receive
//!   so that two ranks exchanging with each other never wait on each other's credits.
//! * **Barrier**: dissemination (Hensgen, Finkel, Manber 1988): `ceil(log2 nranks)` rounds, in
//!   round `k` send an empty message to `r + 2^k` and receive one from `r - 2^k`.

use super::{piece, rounds, Io, Op};
use crate::error::CollError;

/// All-to-all: block `j` (of `count` elements) of every rank's input goes to block `rank` of
/// rank `j`'s output.
pub(crate) fn all_to_all(op: &mut Op<'_>, io: &mut Io<'_>, count: usize) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    for s in 0..n {
        let partner = (s + n - r) % n;
        let block = partner * count;
        if partner == r {
            let b = block * es..(block + count) * es;
            io.copy_input_to_output(b.clone(), b);
            continue;
        }
        for c in 0..rounds(count, ce) {
            let p = piece(block, count, c, ce, es);
            op.send_input(partner, c, io, p.clone())?;
            op.recv_to_output(partner, c, io, p)?;
        }
    }
    Ok(())
}

/// Scatter: block `j` (of `count` elements) of the root's input goes to rank `j`'s output.
pub(crate) fn scatter(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
    root: usize,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    if r == root {
        let own = root * count * es..(root + 1) * count * es;
        io.copy_input_to_output(own, 0..count * es);
        for c in 0..rounds(count, ce) {
            for j in 1..n {
                let peer = (root + j) % n;
                let p = piece(peer * count, count, c, ce, es);
                op.send_input(peer, c, io, p.clone())?;
            }
        }
    } else {
        for c in 0..rounds(count, ce) {
            let p = piece(0, count, c, ce, es);
            op.recv_to_output(root, c, io, p)?;
        }
    }
    Ok(())
}

/// Gather: every rank's input (of `count` elements) goes to block `rank` of the root's output.
pub(crate) fn gather(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    count: usize,
    root: usize,
) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    if r == root {
        io.copy_input_to_output(0..count * es, root * count * es..(root + 1) * count * es);
        for c in 0..rounds(count, ce) {
            for j in 1..n {
                let peer = (root + j) % n;
                let p = piece(peer * count, count, c, ce, es);
                op.recv_to_output(peer, c, io, p)?;
            }
        }
    } else {
        for c in 0..rounds(count, ce) {
            let p = piece(0, count, c, ce, es);
            op.send_input(root, c, io, p.clone())?;
        }
    }
    Ok(())
}

/// Point-to-point: sends `send` (`send_count` elements) to `to` and receives `recv_count`
/// elements from `from` into the output, chunk by chunk interleaved. Either side may be absent.
pub(crate) fn send_recv(
    op: &mut Op<'_>,
    io: &mut Io<'_>,
    send: Option<(usize, usize)>,
    recv: Option<(usize, usize)>,
) -> Result<(), CollError> {
    let (ce, es) = (op.chunk_elems(), op.datatype.size());
    let send_rounds = send.map_or(0, |(_, count)| rounds(count, ce));
    let recv_rounds = recv.map_or(0, |(_, count)| rounds(count, ce));
    for c in 0..send_rounds.max(recv_rounds) {
        if let Some((to, count)) = send.filter(|_| c < send_rounds) {
            let p = piece(0, count, c, ce, es);
            op.send_input(to, c, io, p.clone())?;
        }
        if let Some((from, count)) = recv.filter(|_| c < recv_rounds) {
            let p = piece(0, count, c, ce, es);
            op.recv_to_output(from, c, io, p)?;
        }
    }
    Ok(())
}

/// Dissemination barrier.
pub(crate) fn barrier(op: &mut Op<'_>) -> Result<(), CollError> {
    let (n, r) = (op.nranks, op.rank);
    let mut distance = 1;
    let mut round = 0;
    while distance < n {
        op.send_with((r + distance) % n, round, 0, |_| Ok(()))?;
        op.recv_with((r + n - distance) % n, round, 0, |_| Ok(()))?;
        distance *= 2;
        round += 1;
    }
    Ok(())
}
