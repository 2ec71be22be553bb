//! The collective algorithms, written once against the [`crate::transport`] connectors.
//!
//! Each algorithm is a fixed schedule of messages: for every chunk, which peer it goes to, which
//! peer it comes from, and what is done between (copy, reduce-copy, or both). The schedules are
//! NCCL's:
//!
//! * [`ring`]: all-reduce as a ring reduce-scatter followed by a ring all-gather
//!   (`2 (nranks - 1)` steps per round), reduce-scatter and all-gather alone.
//! * [`doubling`]: all-reduce of small buffers (at most [`doubling::MAX_BYTES`] and one slot) by
//!   recursive doubling, `log2(nranks)` steps, as MPICH and Open MPI do below a size threshold.
//! * [`chain`]: broadcast down the ring order from the root, reduce up the ring order to the
//!   root (pipelined chains).
//! * [`pairwise`]: all-to-all by pairwise exchange, scatter and gather from and to the root,
//!   point-to-point send/recv, and the dissemination barrier.
//!
//! **Chunking and pipelining.** Data moves in chunks of at most one slot. A rank posts a chunk
//! as soon as it has it and moves on to the next; the credits (`nslots` per channel) let it run
//! up to `nslots` chunks ahead of its receiver, so successive chunks flow through successive
//! ranks at the same time.
//!
//! **Reduction order.** In the ring, segment `s` is reduced along the ring starting at rank
//! `s + 1` and ending at rank `s`: `x[s+1]`, then `f(that, x[s+2])`, ..., then `f(that, x[s])`.
//! In the chain reduce, starting at `root + 1` and ending at the root. Recursive doubling
//! reduces a balanced tree over the ranks, the same on every rank. The order depends only on
//! `(nranks, count, slot size)`, never on timing, so results are bit-reproducible (the choice
//! between ring and recursive doubling too).
//!
//! **Checks.** Every received chunk's descriptor must equal the receiver's own ([`OpDesc`]:
//! sequence number, collective, count, data type, operator, root), its chunk index the expected
//! one and its length the expected length. At the end of an operation every rank waits until its
//! receivers have consumed everything it sent (a *drain*); a rank that found a mismatch aborts
//! instead of consuming, so the mismatch reaches the senders too.

use core::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::reduce::{self, KernelError};
use crate::transport::{Abort, OpDesc, RecvChunk, RecvConnector, SendConnector, TransportError};

pub mod chain;
pub mod doubling;
pub mod pairwise;
pub mod ring;

/// The send side of one peer: its channels, used round-robin message by message.
pub(crate) struct PeerSend {
    pub peer: usize,
    pub conns: Vec<Box<dyn SendConnector>>,
    /// Messages sent to this peer (selects the channel).
    pub sent: u64,
    /// Something was posted since the last drain.
    pub dirty: bool,
}

/// The receive side of one peer.
pub(crate) struct PeerRecv {
    pub peer: usize,
    pub conns: Vec<Box<dyn RecvConnector>>,
    /// Messages received from this peer (selects the channel).
    pub received: u64,
}

/// The channel (index into the `channels` connectors to `peer`) that message number
/// `messages` goes over: round-robin over the channels.
fn channel(channels: usize, peer: usize, messages: u64) -> Result<usize, TransportError> {
    if channels == 0 {
        return Err(TransportError::Usage {
            peer,
            what: "no connection to this peer",
        });
    }
    Ok((messages % channels as u64) as usize)
}

impl PeerSend {
    fn conn(&mut self) -> Result<&mut dyn SendConnector, TransportError> {
        let c = channel(self.conns.len(), self.peer, self.sent)?;
        Ok(&mut *self.conns[c])
    }

    pub(crate) fn abort(&mut self, abort: Abort) {
        for c in &mut self.conns {
            c.abort(abort);
        }
    }
}

impl PeerRecv {
    fn conn(&mut self) -> Result<&mut dyn RecvConnector, TransportError> {
        let c = channel(self.conns.len(), self.peer, self.received)?;
        Ok(&mut *self.conns[c])
    }

    pub(crate) fn abort(&mut self, abort: Abort) {
        for c in &mut self.conns {
            c.abort(abort);
        }
    }
}

/// A user's buffers for one operation: either a separate input and output, or one buffer for
/// both (in place). Algorithms address the input and the output in their own coordinates; in
/// place, input coordinate `i` is byte `in_base + i` of the buffer and output coordinate `o` is
/// byte `out_base + o` (e.g. an in-place all-gather's input is this rank's block of the output).
///
/// **Sealed output.** [`Op::forward_output`] sends a range of the output from where it lies
/// (zero-copy on RoCE: the transport reads it after the call returns, until the operation's
/// drain). The algorithms promise that an output range, once forwarded, is **not written again
/// within the operation**: they forward only finished output (a complete reduce-scatter
/// segment, a gathered or broadcast chunk), and every schedule here writes each output byte at
/// most once after it is finished. Debug builds check the promise: every write path of `Io`
/// ([`output`](Self::output), [`copy_input_to_output`](Self::copy_input_to_output),
/// [`reduce_to_output`](Self::reduce_to_output)) asserts that it does not touch a sealed range.
pub(crate) struct Io<'a> {
    input: Option<&'a [u8]>,
    buf: &'a mut [u8],
    in_base: usize,
    out_base: usize,
    /// Output ranges forwarded in place so far, in buffer coordinates (debug builds only).
    #[cfg(debug_assertions)]
    sealed: Vec<Range<usize>>,
}

impl<'a> Io<'a> {
    pub(crate) fn out_of_place(input: &'a [u8], output: &'a mut [u8]) -> Self {
        Io {
            input: Some(input),
            buf: output,
            in_base: 0,
            out_base: 0,
            #[cfg(debug_assertions)]
            sealed: Vec::new(),
        }
    }

    pub(crate) fn in_place(buf: &'a mut [u8], in_base: usize, out_base: usize) -> Self {
        Io {
            input: None,
            buf,
            in_base,
            out_base,
            #[cfg(debug_assertions)]
            sealed: Vec::new(),
        }
    }

    fn input(&self, r: Range<usize>) -> &[u8] {
        match self.input {
            Some(input) => &input[r],
            None => &self.buf[r.start + self.in_base..r.end + self.in_base],
        }
    }

    fn output(&mut self, r: Range<usize>) -> &mut [u8] {
        let b = r.start + self.out_base..r.end + self.out_base;
        self.check_unsealed(&b);
        &mut self.buf[b]
    }

    /// Asserts (debug builds) that buffer range `b` is not part of a forwarded output range:
    /// the promise of [`Op::forward_output`] (see [`Io`]).
    fn check_unsealed(&self, b: &Range<usize>) {
        #[cfg(debug_assertions)]
        if !b.is_empty() {
            if let Some(s) = self
                .sealed
                .iter()
                .find(|s| s.start < b.end && b.start < s.end)
            {
                panic!("bytes {b:?} written after {s:?} was forwarded from the output buffer");
            }
        }
        #[cfg(not(debug_assertions))]
        let _ = b;
    }

    /// Output range `r` for [`Op::forward_output`], with the whole buffer it lies in; from now
    /// on, no write of this operation may touch `r` (checked in debug builds).
    fn seal_output(&mut self, r: Range<usize>) -> (&[u8], &[u8]) {
        let b = r.start + self.out_base..r.end + self.out_base;
        #[cfg(debug_assertions)]
        if !b.is_empty() {
            self.sealed.push(b.clone());
        }
        (&self.buf[b], &*self.buf)
    }

    /// Input range `r` when no write of this operation can change it: the input of an
    /// out-of-place operation (a separate buffer, borrowed immutably for the whole operation).
    /// `None` in place, where the output may overwrite the input.
    fn stable_input(&self, r: Range<usize>) -> Option<&'a [u8]> {
        self.input.map(|input| &input[r])
    }

    #[cfg(test)]
    fn output_ref(&self, r: Range<usize>) -> &[u8] {
        &self.buf[r.start + self.out_base..r.end + self.out_base]
    }

    /// Whether input range `i` and output range `o` are the same bytes (in place).
    fn aliases(&self, i: &Range<usize>, o: &Range<usize>) -> bool {
        self.input.is_none() && i.start + self.in_base == o.start + self.out_base
    }

    /// Output `o` = input `i` (nothing to do where they are the same bytes).
    fn copy_input_to_output(&mut self, i: Range<usize>, o: Range<usize>) {
        if self.aliases(&i, &o) {
            return;
        }
        match self.input {
            Some(input) => self.output(o).copy_from_slice(&input[i]),
            None => {
                let src = i.start + self.in_base;
                let dst = o.start + self.out_base;
                self.check_unsealed(&(dst..dst + i.len()));
                self.buf.copy_within(src..src + i.len(), dst);
            }
        }
    }

    /// Output `o` = f(incoming, input `i`), element-wise.
    fn reduce_to_output(
        &mut self,
        o: Range<usize>,
        i: Range<usize>,
        incoming: &[u8],
        datatype: DataType,
        redop: RedOp,
    ) -> Result<(), KernelError> {
        match self.input {
            Some(input) => {
                reduce::reduce_copy(datatype, redop, self.output(o), incoming, &input[i])
            }
            None => {
                // Bring the local contribution to the output position first (a no-op for every
                // in-place schedule here, where they coincide), then reduce in place.
                self.copy_input_to_output(i, o.clone());
                reduce::reduce_in_place(datatype, redop, self.output(o), incoming)
            }
        }
    }
}

/// One operation in flight: its descriptor and the connectors it drives.
pub(crate) struct Op<'c> {
    pub rank: usize,
    pub nranks: usize,
    /// The descriptor this rank's messages carry.
    pub send_desc: OpDesc,
    /// The descriptor incoming messages must carry.
    pub recv_desc: OpDesc,
    pub datatype: DataType,
    pub redop: RedOp,
    pub timeout: Duration,
    /// Set by [`crate::AbortHandle::abort`]: every wait of the operation gives up within
    /// [`WAIT_SLICE`] of it.
    pub cancel: &'c AtomicBool,
    /// Payload bytes per chunk: the slot size rounded down to whole elements.
    pub chunk_bytes: usize,
    pub sends: &'c mut [PeerSend],
    pub recvs: &'c mut [PeerRecv],
}

/// The longest a connector wait runs before the operation looks at its cancel flag again: the
/// bound on how long [`crate::AbortHandle::abort`] takes to end a waiting operation.
pub const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Runs `attempt(slice)` (one connector wait of at most `slice`) again while it times out, until
/// `timeout` has passed without progress or `cancel` is set; the wait is cut into slices of at
/// most [`WAIT_SLICE`] so that a cancel is seen within one slice. A timeout returned reports the
/// whole time waited.
pub(crate) fn patiently<T>(
    timeout: Duration,
    cancel: &AtomicBool,
    mut attempt: impl FnMut(Duration) -> Result<T, TransportError>,
) -> Result<T, TransportError> {
    let start = Instant::now();
    loop {
        let slice = timeout.saturating_sub(start.elapsed()).min(WAIT_SLICE);
        match attempt(slice) {
            Err(TransportError::Timeout {
                peer,
                channel,
                waiting_for,
                ..
            }) => {
                let waited = start.elapsed();
                if cancel.load(Ordering::Acquire) || waited >= timeout {
                    return Err(TransportError::Timeout {
                        peer,
                        channel,
                        waiting_for,
                        after_ms: waited.as_millis(),
                    });
                }
            }
            r => return r,
        }
    }
}

impl Op<'_> {
    /// Elements per chunk.
    pub(crate) fn chunk_elems(&self) -> usize {
        (self.chunk_bytes / self.datatype.size()).max(1)
    }

    /// Sends chunk `chunk` of `len` bytes to `peer`, filled by `fill` (given exactly `len`
    /// bytes of the slot).
    pub(crate) fn send_with(
        &mut self,
        peer: usize,
        chunk: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let (desc, timeout, cancel) = (self.send_desc, self.timeout, self.cancel);
        let te = move |source| CollError::Transport { op: desc, source };
        let side = &mut self.sends[peer];
        let conn = side.conn().map_err(te)?;
        fill(slot_of_len(conn, peer, len, timeout, cancel).map_err(te)?)?;
        conn.post(len, chunk as u16, &desc).map_err(te)?;
        side.sent += 1;
        side.dirty = true;
        Ok(())
    }

    /// Sends input range `r` of `io` to `peer` as chunk `chunk`: without a staging copy where
    /// the transport can read the user buffer in place and the range cannot change during the
    /// operation (out of place, see [`Io::stable_input`]), else copied into the slot.
    // The zero-copy send contract (`SendConnector::post_from`) is kept here, by `Io`'s sealing.
    #[allow(unsafe_code)]
    pub(crate) fn send_input(
        &mut self,
        peer: usize,
        chunk: usize,
        io: &Io<'_>,
        r: Range<usize>,
    ) -> Result<(), CollError> {
        let Some(src) = io.stable_input(r.clone()) else {
            return self.send_with(peer, chunk, r.len(), |slot| {
                slot.copy_from_slice(io.input(r));
                Ok(())
            });
        };
        let region = io.input.unwrap_or(src);
        // SAFETY: `src` is the input of an out-of-place operation: the communicator method that
        // runs this operation borrows it immutably until it returns, and it returns only after
        // `Op::drain` (which drains every connector) succeeded or, on an error, after
        // `Communicator::abort` aborted every connector; either waits for or cancels every read
        // of `src` (the contract of `post_from`).
        unsafe { self.post_in_place(peer, chunk, src, region) }
    }

    /// Sends output range `r` of `io`, which must be finished (see [`Io`]: it is sealed, and
    /// nothing of this operation writes it again), to `peer` as chunk `chunk`, from where it
    /// lies: without a staging copy where the transport can read the user buffer in place
    /// (RoCE), else copied into the slot (shared memory). NCCL's `copySend` / the send half of
    /// `recvCopySend`, with the output as the source.
    // The zero-copy send contract (`SendConnector::post_from`) is kept here, by `Io`'s sealing.
    #[allow(unsafe_code)]
    pub(crate) fn forward_output(
        &mut self,
        peer: usize,
        chunk: usize,
        io: &mut Io<'_>,
        r: Range<usize>,
    ) -> Result<(), CollError> {
        let (src, region) = io.seal_output(r);
        // SAFETY: `src` lies in the operation's output, which the communicator method that runs
        // this operation borrows mutably until it returns, and it returns only after
        // `Op::drain` (which drains every connector) succeeded or, on an error or a panic, after
        // every connector was aborted; either waits for or cancels every read of `src`. Until
        // then nothing writes `src`: `Io` hands out no write to a sealed range (the invariant
        // documented at `Io`, asserted in debug builds), and the caller's buffer is borrowed.
        unsafe { self.post_in_place(peer, chunk, src, region) }
    }

    /// Sends `src` (inside `region`, the buffer it belongs to) to `peer` as chunk `chunk` from
    /// where it lies ([`SendConnector::post_from`](crate::transport::SendConnector::post_from)), and
    /// counts the send.
    ///
    /// # Safety
    /// As `post_from`: `src` stays alive and unwritten until this operation's connectors are
    /// drained or aborted.
    // The zero-copy send contract (`SendConnector::post_from`) is kept here, by `Io`'s sealing.
    #[allow(unsafe_code)]
    unsafe fn post_in_place(
        &mut self,
        peer: usize,
        chunk: usize,
        src: &[u8],
        region: &[u8],
    ) -> Result<(), CollError> {
        let (desc, timeout, cancel) = (self.send_desc, self.timeout, self.cancel);
        let te = move |source| CollError::Transport { op: desc, source };
        let side = &mut self.sends[peer];
        let conn = side.conn().map_err(te)?;
        // SAFETY: this function's own contract, passed on.
        patiently(timeout, cancel, |slice| unsafe {
            conn.post_from(src, region, chunk as u16, &desc, slice)
        })
        .map_err(te)?;
        side.sent += 1;
        side.dirty = true;
        Ok(())
    }

    /// Receives chunk `chunk` of `len` bytes from `peer`, checks it, hands it to `consume`,
    /// and returns the slot.
    pub(crate) fn recv_with(
        &mut self,
        peer: usize,
        chunk: usize,
        len: usize,
        consume: impl FnOnce(&[u8]) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let (rank, desc, timeout, cancel) = (self.rank, self.recv_desc, self.timeout, self.cancel);
        let te = move |source| CollError::Transport { op: desc, source };
        let side = &mut self.recvs[peer];
        let conn = side.conn().map_err(te)?;
        let c = wait_chunk(conn, rank, peer, &desc, chunk, len, timeout, cancel)?;
        consume(c.data)?;
        conn.release().map_err(te)?;
        side.received += 1;
        Ok(())
    }

    /// Receives chunk `chunk` from `peer` into output range `r` of `io` (NCCL's `recv`; the
    /// chunk must be `r.len()` bytes).
    pub(crate) fn recv_to_output(
        &mut self,
        peer: usize,
        chunk: usize,
        io: &mut Io<'_>,
        r: Range<usize>,
    ) -> Result<(), CollError> {
        self.recv_with(peer, chunk, r.len(), |incoming| {
            io.output(r).copy_from_slice(incoming);
            Ok(())
        })
    }

    /// NCCL's `recvCopySend`: receives chunk `chunk` (output range `r` of `io`) from `prev`
    /// into the output, returns the slot, and sends the chunk on to `next` from the output (no
    /// staging copy on RoCE; see [`Op::forward_output`]). Output range `r` is written once, here,
    /// and never again in the operation.
    pub(crate) fn recv_copy_send(
        &mut self,
        prev: usize,
        next: usize,
        chunk: usize,
        io: &mut Io<'_>,
        r: Range<usize>,
    ) -> Result<(), CollError> {
        self.recv_to_output(prev, chunk, io, r.clone())?;
        self.forward_output(next, chunk, io, r)
    }

    /// Receives chunk `chunk` (`len` bytes) from `from` and sends chunk `chunk` (`len` bytes)
    /// to `to`, with `f(incoming, outgoing slot)` between: NCCL's `recvReduceSend` and
    /// `recvCopySend`.
    pub(crate) fn recv_send_with(
        &mut self,
        from: usize,
        to: usize,
        chunk: usize,
        len: usize,
        f: impl FnOnce(&[u8], &mut [u8]) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let (rank, desc, timeout, cancel) = (self.rank, self.recv_desc, self.timeout, self.cancel);
        let send_desc = self.send_desc;
        let te = move |source| CollError::Transport { op: desc, source };
        let rside = &mut self.recvs[from];
        let sside = &mut self.sends[to];
        let rconn = rside.conn().map_err(te)?;
        let c = wait_chunk(rconn, rank, from, &desc, chunk, len, timeout, cancel)?;
        let sconn = sside.conn().map_err(te)?;
        f(
            c.data,
            slot_of_len(sconn, to, len, timeout, cancel).map_err(te)?,
        )?;
        // The slot is consumed (f is done): return it first, so that a transport that defers
        // the credit (RoCE) sends it with the post, in one round.
        rconn.release().map_err(te)?;
        sconn.post(len, chunk as u16, &send_desc).map_err(te)?;
        sside.sent += 1;
        sside.dirty = true;
        rside.received += 1;
        Ok(())
    }

    /// Waits until every peer has consumed everything this operation sent to it.
    pub(crate) fn drain(&mut self) -> Result<(), CollError> {
        let (desc, timeout, cancel) = (self.send_desc, self.timeout, self.cancel);
        for side in self.sends.iter_mut().filter(|s| s.dirty) {
            for conn in &mut side.conns {
                patiently(timeout, cancel, |slice| conn.drain(slice)).map_err(|e| {
                    CollError::Transport {
                        op: desc,
                        source: e,
                    }
                })?;
            }
            side.dirty = false;
        }
        Ok(())
    }
}

/// Waits (at most `timeout`) for a free slot of `conn`, the channel to `peer`, and returns its
/// first `len` bytes; a `len` larger than the slot is a usage error.
fn slot_of_len<'c>(
    conn: &'c mut dyn SendConnector,
    peer: usize,
    len: usize,
    timeout: Duration,
    cancel: &AtomicBool,
) -> Result<&'c mut [u8], TransportError> {
    // The slot stays the same until it is posted: wait for it in slices, then take it.
    patiently(timeout, cancel, |slice| conn.wait_slot(slice).map(|_| ()))?;
    let slot = conn.wait_slot(timeout)?;
    if len > slot.len() {
        return Err(TransportError::Usage {
            peer,
            what: "chunk larger than a slot",
        });
    }
    Ok(&mut slot[..len])
}

/// Waits (at most `timeout`) for the next chunk on `conn`, the channel from `peer`, and checks
/// it against this rank's operation `mine`: the sender's descriptor must be the same (else
/// [`CollError::Mismatch`]), and the chunk number `chunk` with `len` bytes (else
/// [`CollError::Protocol`]).
#[allow(clippy::too_many_arguments)]
fn wait_chunk<'c>(
    conn: &'c mut dyn RecvConnector,
    rank: usize,
    peer: usize,
    mine: &OpDesc,
    chunk: usize,
    len: usize,
    timeout: Duration,
    cancel: &AtomicBool,
) -> Result<RecvChunk<'c>, CollError> {
    // The chunk stays the same until it is released: wait for it in slices, then take it.
    patiently(timeout, cancel, |slice| conn.wait(slice).map(|_| ()))
        .map_err(|source| CollError::Transport { op: *mine, source })?;
    let c = conn
        .wait(timeout)
        .map_err(|source| CollError::Transport { op: *mine, source })?;
    if c.desc != *mine {
        return Err(CollError::Mismatch {
            rank,
            mine: *mine,
            peer,
            theirs: c.desc,
        });
    }
    let got_chunk = c.imm.chunk;
    if got_chunk != chunk as u16 {
        return Err(CollError::Protocol {
            op: *mine,
            peer,
            what: format!(
                "chunk {got_chunk} arrived where chunk {} was expected",
                chunk as u16
            ),
        });
    }
    let got_len = c.data.len();
    if got_len != len {
        return Err(CollError::Protocol {
            op: *mine,
            peer,
            what: format!("chunk {got_chunk} has {got_len} bytes, {len} expected"),
        });
    }
    Ok(c)
}

/// Byte range of element range `[start, start + len)` clipped to round `k` of chunks of
/// `chunk` elements: `[start + k*chunk, start + min((k+1)*chunk, len))`, possibly empty.
pub(crate) fn piece(
    start: usize,
    len: usize,
    k: usize,
    chunk: usize,
    esize: usize,
) -> Range<usize> {
    let lo = (k * chunk).min(len);
    let hi = ((k + 1) * chunk).min(len);
    (start + lo) * esize..(start + hi) * esize
}

/// Number of chunk rounds for `len` elements (at least one, so that every operation, even of
/// zero elements, exchanges its descriptor).
pub(crate) fn rounds(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_tile_the_range() {
        let (start, len, chunk) = (5, 23, 7);
        let mut next = start * 4;
        for k in 0..rounds(len, chunk) {
            let p = piece(start, len, k, chunk, 4);
            assert_eq!(p.start, next);
            next = p.end;
        }
        assert_eq!(next, (start + len) * 4);
        assert_eq!(rounds(0, 7), 1);
        assert_eq!(piece(0, 0, 0, 7, 4), 0..0);
        assert_eq!(piece(3, 2, 1, 7, 1), 5..5, "past the end: empty");
    }

    /// The promise of `Op::forward_output` (see `Io`): a forwarded output range is not written
    /// again. Writes beside it pass; every write path that touches it is caught (debug builds,
    /// where every collective test of this crate runs with the check on).
    #[test]
    #[cfg(debug_assertions)]
    fn a_write_to_a_forwarded_output_range_is_caught() {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let input = [1u8; 16];
        let mut out = [0u8; 16];
        let mut io = Io::out_of_place(&input, &mut out);
        let (src, region) = io.seal_output(4..8);
        assert_eq!((src.len(), region.len()), (4, 16));
        io.output(0..4).fill(9);
        io.output(8..16).fill(9);
        io.copy_input_to_output(0..4, 12..16);
        let caught = |f: &mut dyn FnMut(&mut Io<'_>)| {
            let mut out = [0u8; 16];
            let mut io = Io::out_of_place(&input, &mut out);
            io.seal_output(4..8);
            catch_unwind(AssertUnwindSafe(|| f(&mut io))).is_err()
        };
        assert!(caught(&mut |io| io.output(7..9).fill(1)));
        assert!(caught(&mut |io| io.copy_input_to_output(0..4, 2..6)));
        assert!(caught(&mut |io| {
            let _ = io.reduce_to_output(4..8, 0..4, &[1; 4], DataType::U8, RedOp::Sum);
        }));
        // In place, output coordinates are offset: sealing output 0..4 of a buffer whose output
        // starts at byte 8 protects bytes 8..12, which the input (at 0) copied over would hit.
        let mut buf = [0u8; 16];
        let mut io = Io::in_place(&mut buf, 0, 8);
        io.seal_output(0..4);
        io.copy_input_to_output(4..8, 4..8);
        assert!(catch_unwind(AssertUnwindSafe(|| io.copy_input_to_output(0..4, 0..4))).is_err());
    }

    #[test]
    fn in_place_io_addresses() {
        let mut buf: Vec<u8> = (0..12).collect();
        let mut io = Io::in_place(&mut buf, 4, 0);
        assert_eq!(io.input(0..4), &[4, 5, 6, 7]);
        assert!(io.aliases(&(0..4), &(4..8)));
        io.copy_input_to_output(0..2, 0..2);
        assert_eq!(io.output_ref(0..4), &[4, 5, 2, 3]);
        let mut out = [0u8; 4];
        let input = [1u8, 2, 3, 4];
        let mut io = Io::out_of_place(&input, &mut out);
        io.reduce_to_output(0..4, 0..4, &[10, 20, 30, 40], DataType::U8, RedOp::Sum)
            .unwrap();
        assert_eq!(out, [11, 22, 33, 44]);
    }
}
