//! Receive queues: the posted receive WRs of a QP or an SRQ.
//!
//! An incoming SEND (or RDMA WRITE with immediate) consumes the oldest posted receive WR, the
//! receive WQE (work queue element), and lands in its buffers. A [`RecvQueue`] holds the WQEs in
//! posting order. Its storage grows with use up to the queue's capacity and is then reused, so
//! posting allocates nothing in steady state; the SGE lists are stored back to back, not one
//! allocation per WQE.
//!
//! The responder reads the oldest WQE with [`RecvQueue::front`] while a (possibly multi-packet)
//! message arrives and removes it with [`RecvQueue::pop`] when the message completes. When the
//! QP enters the error state the remaining WQEs complete with `IBV_WC_WR_FLUSH_ERR`
//! ([`RecvQueue::drain`]); when it is reset they are discarded without completions
//! ([`RecvQueue::clear`]; IBTA vol. 1 §10.3.1).

use alloc::collections::vec_deque;
use alloc::collections::VecDeque;

use crate::verbs::error::Cause;
use crate::verbs::wr::{validate_recv_wr, RecvWr, Sge};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RecvHeader {
    wr_id: u64,
    num_sge: u32,
    length: u64,
}

/// The posted receive WQEs of a QP or SRQ, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvQueue {
    max_wr: u32,
    max_sge: u32,
    wqes: VecDeque<RecvHeader>,
    /// The SGEs of all WQEs, back to back in WQE order.
    sges: VecDeque<Sge>,
}

/// A view of the oldest receive WQE.
#[derive(Debug, Clone)]
pub struct RecvWqe<'a> {
    /// The `wr_id` of the WR.
    pub wr_id: u64,
    /// Total buffer length in bytes.
    pub length: u64,
    sges: &'a VecDeque<Sge>,
    num_sge: usize,
}

impl<'a> RecvWqe<'a> {
    /// Number of SGEs.
    pub fn num_sge(&self) -> usize {
        self.num_sge
    }

    /// The `i`-th SGE. O(1).
    pub fn sge(&self, i: usize) -> Option<Sge> {
        (i < self.num_sge).then(|| self.sges[i])
    }

    /// The SGEs in order.
    pub fn sg_list(&self) -> vec_deque::Iter<'a, Sge> {
        self.sges.range(..self.num_sge)
    }
}

impl RecvQueue {
    /// An empty queue of `max_wr` WQEs of at most `max_sge` SGEs each.
    pub fn new(max_wr: u32, max_sge: u32) -> Self {
        RecvQueue {
            max_wr,
            max_sge,
            wqes: VecDeque::new(),
            sges: VecDeque::new(),
        }
    }

    /// Capacity in WQEs.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Most SGEs per WQE.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Posted WQEs.
    pub fn len(&self) -> usize {
        self.wqes.len()
    }

    /// Whether no WQE is posted.
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Appends a receive WR, or refuses it and changes nothing (rxe `post_one_recv` order: full
    /// queue, then SGE count, then length).
    ///
    /// # Errors
    /// [`Cause::QueueFull`] (`ENOMEM`); [`Cause::TooManySge`], [`Cause::MessageTooLong`]
    /// (`EINVAL`).
    pub fn post(&mut self, wr: &RecvWr<'_>, max_msg_sz: u64) -> Result<(), Cause> {
        if self.wqes.len() >= self.max_wr as usize {
            return Err(Cause::QueueFull {
                max_wr: self.max_wr,
            });
        }
        let length = validate_recv_wr(wr, self.max_sge, max_msg_sz)?;
        self.sges.extend(wr.sg_list.iter().copied());
        self.wqes.push_back(RecvHeader {
            wr_id: wr.wr_id,
            num_sge: wr.sg_list.len() as u32,
            length,
        });
        Ok(())
    }

    /// The oldest WQE, without removing it.
    pub fn front(&self) -> Option<RecvWqe<'_>> {
        self.wqes.front().map(|h| RecvWqe {
            wr_id: h.wr_id,
            length: h.length,
            sges: &self.sges,
            num_sge: h.num_sge as usize,
        })
    }

    /// Removes the oldest WQE and returns its `wr_id`.
    pub fn pop(&mut self) -> Option<u64> {
        let h = self.wqes.pop_front()?;
        self.sges.drain(..h.num_sge as usize);
        Some(h.wr_id)
    }

    /// Removes every WQE, yielding their `wr_id`s oldest first (to complete them with
    /// `IBV_WC_WR_FLUSH_ERR`).
    pub fn drain(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.sges.clear();
        self.wqes.drain(..).map(|h| h.wr_id)
    }

    /// Discards every WQE without completions (transition to RESET).
    pub fn clear(&mut self) {
        self.wqes.clear();
        self.sges.clear();
    }

    /// Changes the capacity (SRQ resize).
    ///
    /// # Errors
    /// [`Cause::OutOfRange`] if more WQEs are posted than `max_wr`.
    pub fn set_max_wr(&mut self, max_wr: u32) -> Result<(), Cause> {
        if self.wqes.len() > max_wr as usize {
            return Err(Cause::OutOfRange {
                attr: "max_wr",
                value: self.wqes.len() as u64,
                max: max_wr.into(),
            });
        }
        self.max_wr = max_wr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    fn sge(addr: u64, length: u32) -> Sge {
        Sge {
            addr,
            length,
            lkey: 0x100,
        }
    }

    #[test]
    fn post_front_pop_in_order() {
        let mut q = RecvQueue::new(3, 2);
        let a = [sge(0, 10), sge(100, 20)];
        let b = [sge(200, 5)];
        q.post(
            &RecvWr {
                wr_id: 1,
                sg_list: &a,
            },
            1 << 31,
        )
        .unwrap();
        q.post(
            &RecvWr {
                wr_id: 2,
                sg_list: &b,
            },
            1 << 31,
        )
        .unwrap();
        q.post(
            &RecvWr {
                wr_id: 3,
                sg_list: &[],
            },
            1 << 31,
        )
        .unwrap();
        assert_eq!(
            q.post(
                &RecvWr {
                    wr_id: 4,
                    sg_list: &[]
                },
                1 << 31
            ),
            Err(Cause::QueueFull { max_wr: 3 })
        );
        let f = q.front().unwrap();
        assert_eq!((f.wr_id, f.length, f.num_sge()), (1, 30, 2));
        assert_eq!(f.sg_list().copied().collect::<Vec<_>>(), a);
        assert_eq!(f.sge(1), Some(a[1]));
        assert_eq!(f.sge(2), None);
        assert_eq!(q.pop(), Some(1));
        let f = q.front().unwrap();
        assert_eq!(f.sg_list().copied().collect::<Vec<_>>(), b);
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.front().unwrap().num_sge(), 0);
        assert_eq!(q.pop(), Some(3));
        assert_eq!(q.pop(), None);
        assert!(q.front().is_none());
    }

    #[test]
    fn rejected_wr_changes_nothing() {
        let mut q = RecvQueue::new(4, 1);
        let two = [sge(0, 1), sge(1, 1)];
        let before = q.clone();
        assert!(matches!(
            q.post(
                &RecvWr {
                    wr_id: 1,
                    sg_list: &two
                },
                1 << 31
            ),
            Err(Cause::TooManySge { .. })
        ));
        assert_eq!(q, before);
        let big = [sge(0, u32::MAX)];
        assert!(matches!(
            q.post(
                &RecvWr {
                    wr_id: 1,
                    sg_list: &big
                },
                1 << 31
            ),
            Err(Cause::MessageTooLong { .. })
        ));
        assert_eq!(q, before);
    }

    #[test]
    fn drain_and_clear() {
        let mut q = RecvQueue::new(4, 1);
        for i in 0..3 {
            q.post(
                &RecvWr {
                    wr_id: i,
                    sg_list: &[sge(i, 1)],
                },
                1 << 31,
            )
            .unwrap();
        }
        assert_eq!(q.drain().collect::<Vec<_>>(), [0, 1, 2]);
        assert!(q.is_empty());
        q.post(
            &RecvWr {
                wr_id: 9,
                sg_list: &[sge(9, 1)],
            },
            1 << 31,
        )
        .unwrap();
        assert_eq!(q.front().unwrap().sge(0), Some(sge(9, 1)));
        q.clear();
        assert!(q.is_empty());
        assert!(q.set_max_wr(0).is_ok());
        q.set_max_wr(1).unwrap();
        q.post(
            &RecvWr {
                wr_id: 9,
                sg_list: &[],
            },
            1 << 31,
        )
        .unwrap();
        assert!(q.set_max_wr(0).is_err());
    }

    proptest! {
        #[test]
        fn queue_matches_model(ops in proptest::collection::vec((any::<bool>(), 0usize..4), 0..300)) {
            let mut q = RecvQueue::new(5, 3);
            let mut model: std::collections::VecDeque<(u64, Vec<Sge>)> = Default::default();
            let mut next = 0u64;
            for (post, n) in ops {
                if post {
                    let sg: Vec<Sge> = (0..n).map(|i| sge(next * 10 + i as u64, i as u32 + 1)).collect();
                    let r = q.post(&RecvWr { wr_id: next, sg_list: &sg }, 1 << 31);
                    if model.len() >= 5 {
                        prop_assert_eq!(r, Err(Cause::QueueFull { max_wr: 5 }));
                    } else if n > 3 {
                        prop_assert!(r.is_err());
                    } else {
                        prop_assert!(r.is_ok());
                        model.push_back((next, sg));
                    }
                    next += 1;
                } else {
                    prop_assert_eq!(q.pop(), model.pop_front().map(|(id, _)| id));
                }
                match (q.front(), model.front()) {
                    (Some(f), Some((id, sg))) => {
                        prop_assert_eq!(f.wr_id, *id);
                        prop_assert_eq!(f.sg_list().copied().collect::<Vec<_>>(), sg.clone());
                    }
                    (None, None) => {}
                    _ => prop_assert!(false, "front mismatch"),
                }
                prop_assert_eq!(q.len(), model.len());
            }
        }
    }
}
