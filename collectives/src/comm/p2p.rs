//! Point-to-point operations of a [`Communicator`] (NCCL's `ncclSend` / `ncclRecv`, and a
//! grouped send + receive).

use crate::algorithms::{pairwise, Io};
use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::transport::{CollKind, OpDesc};

use super::Communicator;

impl Communicator {
    fn p2p_desc(seq: u64, datatype: DataType, count: usize) -> OpDesc {
        OpDesc::new(seq, CollKind::SendRecv, datatype, None, None, count)
    }

    /// Sends `count` elements of `buf` to `peer` (NCCL `ncclSend`); returns once `peer` has
    /// received them all (with a matching [`Self::recv`]).
    ///
    /// # Errors
    /// A peer out of range or equal to this rank (use [`Self::send_recv`]), a short buffer,
    /// mismatched count or data type at the receiver, a failing peer.
    pub fn send(
        &mut self,
        buf: &[u8],
        count: usize,
        datatype: DataType,
        peer: usize,
    ) -> Result<(), CollError> {
        self.send_recv(buf, count, Some(peer), &mut [], 0, None, datatype)
    }

    /// Receives `count` elements from `peer` into `buf` (NCCL `ncclRecv`).
    ///
    /// # Errors
    /// As [`Self::send`].
    pub fn recv(
        &mut self,
        buf: &mut [u8],
        count: usize,
        datatype: DataType,
        peer: usize,
    ) -> Result<(), CollError> {
        self.send_recv(&[], 0, None, buf, count, Some(peer), datatype)
    }

    /// Sends `send_count` elements of `send` to `to` while receiving `recv_count` elements from
    /// `from` into `recv`, interleaved chunk by chunk (a NCCL group of `ncclSend` + `ncclRecv`),
    /// so that two ranks may exchange with each other. `to == from == rank` copies locally.
    ///
    /// # Errors
    /// As [`Self::send`].
    #[allow(clippy::too_many_arguments)]
    pub fn send_recv(
        &mut self,
        send: &[u8],
        send_count: usize,
        to: Option<usize>,
        recv: &mut [u8],
        recv_count: usize,
        from: Option<usize>,
        datatype: DataType,
    ) -> Result<(), CollError> {
        let coll = CollKind::SendRecv;
        if let Some(cause) = &self.failure {
            return Err(CollError::Aborted {
                op: coll,
                cause: cause.clone(),
            });
        }
        let (send_bytes, recv_bytes) =
            self.check_send_recv(send, send_count, to, recv, recv_count, from, datatype)?;
        let me = Some(self.rank);
        if to == me || from == me {
            recv[..recv_bytes].copy_from_slice(&send[..send_bytes]);
            return Ok(());
        }
        let send_desc = to.map_or(Self::p2p_desc(0, datatype, 0), |p| {
            Self::p2p_desc(self.p2p_sent[p], datatype, send_count)
        });
        let recv_desc = from.map_or(Self::p2p_desc(0, datatype, 0), |p| {
            Self::p2p_desc(self.p2p_received[p], datatype, recv_count)
        });
        if let Some(p) = to {
            self.p2p_sent[p] += 1;
        }
        if let Some(p) = from {
            self.p2p_received[p] += 1;
        }
        let mut io = Io::out_of_place(
            &send[..if to.is_some() { send_bytes } else { 0 }],
            &mut recv[..if from.is_some() { recv_bytes } else { 0 }],
        );
        let send_side = to.map(|p| (p, send_count));
        let recv_side = from.map(|p| (p, recv_count));
        self.run(send_desc, recv_desc, datatype, RedOp::Sum, |o| {
            pairwise::send_recv(o, &mut io, send_side, recv_side)
        })
    }
}
