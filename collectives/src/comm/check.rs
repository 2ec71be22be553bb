//! How [`Communicator`] applies the argument rules of [`super::args`]: [`Communicator::begin`]
//! for the collectives, [`Communicator::check_send_recv`] for point-to-point.

use crate::algorithms::Io;
use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::transport::{CollKind, OpDesc};

use super::args::{rule, At, Blocks};
use super::Communicator;

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
