//! The send queue of a QP: posted send WQEs in order, with their transport progress.
//!
//! A send WR is copied into a [`SendWqe`] when posted (ibv_post_send(3) returns at once; the
//! caller may reuse its SGE array). The SGE lists of all WQEs are stored back to back in one ring,
//! and so are the bytes of INLINE sends, so posting allocates nothing once the rings have grown to
//! the queue's depth. The requester walks the queue to send, the completer retires it from the
//! front; a WQE leaves the queue only when it completes (successfully, with an error, or flushed).

use alloc::collections::VecDeque;

use roce::Psn;

use crate::verbs::wc::WcStatus;
use crate::verbs::wr::{SendFlags, SendOp, Sge, WrOpcode};

/// Where a UD WQE goes, resolved from its address handle when posted (the AH may be destroyed
/// while the WQE waits; rxe copies the address vector into the WQE too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdRoute {
    pub(crate) route: super::net::Route,
    pub(crate) remote_qpn: u32,
    pub(crate) qkey: u32,
}

/// The life of a send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Posted, not started: no PSNs assigned yet.
    Posted,
    /// Started: PSNs `first_psn ..= last_psn` assigned; some packets may be sent.
    InFlight,
    /// Finished with this status; completes when it reaches the front of the queue.
    Done(WcStatus),
}

/// One send WQE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    pub(crate) signaled: bool,
    /// Message length in bytes.
    pub(crate) length: u32,
    sge_start: u64,
    num_sge: u32,
    /// Absolute position of the inline bytes (`length` of them) in the inline ring.
    inline_start: Option<u64>,
    pub(crate) ud: Option<UdRoute>,
    pub(crate) state: WqeState,
    /// First PSN of the WQE (valid from InFlight on). For an RDMA READ the WQE owns one PSN per
    /// response packet (IBTA vol. 1 §9.7.1).
    pub(crate) first_psn: Psn,
    /// Last PSN of the WQE.
    pub(crate) last_psn: Psn,
    /// The next PSN the requester transmits for this WQE (`last_psn + 1` once all are sent).
    pub(crate) next_psn: Psn,
    /// RDMA READ: response packets one READ request asks for at most, fixed when the WQE starts
    /// (see [`super::requester`]); its requests end on multiples of it from `first_psn`. 0 for
    /// other WQEs.
    pub(crate) read_seg: u32,
}

impl SendWqe {
    pub(crate) fn opcode(&self) -> WrOpcode {
        self.op.opcode()
    }

    /// RDMA READ or atomic: completed by its response, counted against `max_rd_atomic`.
    pub(crate) fn is_read_or_atomic(&self) -> bool {
        matches!(
            self.opcode(),
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// Whether the WQE's data was posted INLINE (it is then in the send queue, not in its SGEs).
    pub(crate) fn is_inline(&self) -> bool {
        self.inline_start.is_some()
    }

    /// Whether every PSN of the WQE was transmitted at least once since the last retry.
    pub(crate) fn fully_sent(&self) -> bool {
        self.next_psn == self.last_psn.next()
    }

    /// RDMA READ: whether the response with PSN `psn` (one of the WQE's) ends a READ request:
    /// the WQE's last PSN, or the last of a segment ([`SendWqe::read_seg`]). Such a response is
    /// a LAST or ONLY; any other is a FIRST or MIDDLE.
    pub(crate) fn ends_read_request(&self, psn: Psn) -> bool {
        let seg = self.read_seg.max(1);
        psn == self.last_psn || (self.first_psn.distance(psn) + 1) % seg == 0
    }

    /// Whether `psn` is one of the WQE's PSNs.
    pub(crate) fn owns(&self, psn: Psn) -> bool {
        psn.in_window(self.first_psn, self.first_psn.distance(self.last_psn) + 1)
    }
}

/// What [`SendQueue::push`] needs besides the WR.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    pub(crate) signaled: bool,
    pub(crate) length: u32,
    pub(crate) ud: Option<UdRoute>,
}

/// The send queue.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    wqes: VecDeque<SendWqe>,
    sges: VecDeque<Sge>,
    /// Absolute index of `sges[0]`.
    sge_base: u64,
    inline: VecDeque<u8>,
    /// Absolute index of `inline[0]`.
    inline_base: u64,
}

impl SendQueue {
    pub(crate) fn len(&self) -> usize {
        self.wqes.len()
    }

    /// Appends a WQE with its SGEs and, for INLINE sends, its data (already gathered).
    pub(crate) fn push(&mut self, new: NewWqe, sg_list: &[Sge], inline: Option<&[u8]>) {
        let sge_start = self.sge_base + self.sges.len() as u64;
        if inline.is_none() {
            self.sges.extend(sg_list.iter().copied());
        }
        let inline_start = inline.map(|bytes| {
            let at = self.inline_base + self.inline.len() as u64;
            self.inline.extend(bytes.iter().copied());
            at
        });
        self.wqes.push_back(SendWqe {
            wr_id: new.wr_id,
            op: new.op,
            flags: new.flags,
            signaled: new.signaled,
            length: new.length,
            sge_start,
            num_sge: if inline.is_some() {
                0
            } else {
                sg_list.len() as u32
            },
            inline_start,
            ud: new.ud,
            state: WqeState::Posted,
            first_psn: Psn::ZERO,
            last_psn: Psn::ZERO,
            next_psn: Psn::ZERO,
            read_seg: 0,
        });
    }

    pub(crate) fn get(&self, i: usize) -> Option<&SendWqe> {
        self.wqes.get(i)
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut SendWqe> {
        self.wqes.get_mut(i)
    }

    pub(crate) fn front(&self) -> Option<&SendWqe> {
        self.wqes.front()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut SendWqe> + '_ {
        self.wqes.iter_mut()
    }

    /// Removes the front WQE and its SGEs and inline bytes.
    pub(crate) fn pop_front(&mut self) -> Option<SendWqe> {
        let wqe = self.wqes.pop_front()?;
        // WQEs are removed in posting order, so the front WQE's SGEs and inline bytes are at the
        // front of their rings: advance the bases past them.
        let next_sge = self
            .wqes
            .front()
            .map_or(self.sge_base + self.sges.len() as u64, |w| w.sge_start);
        let drop_sges = (next_sge - self.sge_base) as usize;
        self.sges.drain(..drop_sges.min(self.sges.len()));
        self.sge_base = next_sge;
        if let Some(start) = wqe.inline_start {
            let end = start + u64::from(wqe.length);
            let drop = (end - self.inline_base) as usize;
            self.inline.drain(..drop.min(self.inline.len()));
            self.inline_base = end;
        }
        Some(wqe)
    }

    /// The SGEs of a WQE of this queue (empty for INLINE WQEs).
    pub(crate) fn sges(&self, wqe: &SendWqe) -> impl Iterator<Item = Sge> + '_ {
        let start = wqe.sge_start.saturating_sub(self.sge_base) as usize;
        self.sges
            .range(start.min(self.sges.len())..)
            .take(wqe.num_sge as usize)
            .copied()
    }

    /// The inline bytes `[offset, offset + dst.len())` of an INLINE WQE, copied into `dst`.
    /// Returns false if the WQE is not INLINE (its data is in its SGEs).
    pub(crate) fn copy_inline(&self, wqe: &SendWqe, offset: u32, dst: &mut [u8]) -> bool {
        let Some(start) = wqe.inline_start else {
            return false;
        };
        let at = (start.saturating_sub(self.inline_base) + u64::from(offset)) as usize;
        for (d, s) in dst
            .iter_mut()
            .zip(self.inline.range(at.min(self.inline.len())..))
        {
            *d = *s;
        }
        true
    }

    /// Discards everything (RESET).
    pub(crate) fn clear(&mut self) {
        self.sge_base += self.sges.len() as u64;
        self.inline_base += self.inline.len() as u64;
        self.wqes.clear();
        self.sges.clear();
        self.inline.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(wr_id: u64, length: u32) -> NewWqe {
        NewWqe {
            wr_id,
            op: SendOp::Send,
            flags: SendFlags::empty(),
            signaled: true,
            length,
            ud: None,
        }
    }

    fn sge(addr: u64, length: u32) -> Sge {
        Sge {
            addr,
            length,
            lkey: 0x100,
        }
    }

    #[test]
    fn sges_and_inline_bytes_follow_their_wqes() {
        let mut q = SendQueue::default();
        q.push(new(1, 30), &[sge(0, 10), sge(100, 20)], None);
        q.push(new(2, 3), &[sge(7, 3)], Some(&[1, 2, 3]));
        q.push(new(3, 5), &[sge(200, 5)], None);
        let w = *q.get(0).unwrap();
        assert_eq!(
            q.sges(&w).collect::<std::vec::Vec<_>>(),
            [sge(0, 10), sge(100, 20)]
        );
        let w2 = *q.get(1).unwrap();
        assert_eq!(q.sges(&w2).count(), 0, "inline WQEs keep no SGEs");
        let mut b = [0u8; 2];
        assert!(q.copy_inline(&w2, 1, &mut b));
        assert_eq!(b, [2, 3]);
        assert_eq!(q.pop_front().unwrap().wr_id, 1);
        assert_eq!(q.pop_front().unwrap().wr_id, 2);
        let w3 = *q.front().unwrap();
        assert_eq!(q.sges(&w3).collect::<std::vec::Vec<_>>(), [sge(200, 5)]);
        assert!(!q.copy_inline(&w3, 0, &mut b));
        q.push(new(4, 2), &[], Some(&[9, 8]));
        q.clear();
        assert_eq!(q.len(), 0);
        q.push(new(5, 2), &[], Some(&[7, 6]));
        let w5 = *q.front().unwrap();
        assert!(q.copy_inline(&w5, 0, &mut b));
        assert_eq!(b, [7, 6]);
    }
}
