//! Completion queues.
//!
//! A completion queue (CQ, IBTA vol. 1 ch. 10-11, ibv_create_cq(3)) is where the HCA reports
//! finished work requests; the program drains it with ibv_poll_cq(3). A CQ has a fixed capacity
//! chosen at creation. If the program does not poll fast enough and the CQ is full when the HCA has
//! another completion to report, that is a **CQ overrun** (IBTA vol. 1 ch. 11): the completion is
//! not silently dropped: [`CompletionQueue::push`] fails, the CQ enters an error state in which
//! every later push fails too, and the device records an `IBV_EVENT_CQ_ERR` async event. Entries
//! already queued can still be polled.
//!
//! A program that sleeps instead of polling arms the CQ with ibv_req_notify_cq(3);
//! [`CompletionQueue::push`] then reports that a completion event is due.

use alloc::collections::VecDeque;

use crate::verbs::error::Cause;
use crate::verbs::table::Handle;
use crate::verbs::wc::WorkCompletion;

/// Handle of a [`CompletionQueue`] in a [`crate::Context`].
pub type CqHandle = Handle<CompletionQueue>;

/// The capacity rxe gives a queue asked to hold `n` entries: one slot of its ring stays empty,
/// and the ring is a power of two, so the capacity is `next_power_of_two(n + 1) - 1` (rxe
/// `rxe_queue_init`). `n` = 0 gives 0, 1 gives 1, 10 gives 15, 16 gives 31.
pub const fn rxe_queue_capacity(n: u32) -> u32 {
    match (n as u64 + 1).checked_next_power_of_two() {
        Some(slots) if slots - 1 <= u32::MAX as u64 => (slots - 1) as u32,
        _ => u32::MAX,
    }
}

/// The arming state of a CQ (ibv_req_notify_cq(3)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CqNotify {
    /// No completion event is requested.
    Disarmed,
    /// An event is due for the next completion (`solicited_only = 0`).
    NextCompletion,
    /// An event is due for the next solicited or error completion (`solicited_only = 1`).
    Solicited,
}

/// A completion queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionQueue {
    capacity: u32,
    entries: VecDeque<WorkCompletion>,
    overrun: bool,
    notify: CqNotify,
    pub(crate) users: u32,
}

impl CompletionQueue {
    /// A CQ able to hold at least `cqe` completions (its capacity is rounded up as rxe does, see
    /// [`rxe_queue_capacity`]).
    ///
    /// # Errors
    /// [`Cause::InvalidValue`] for `cqe` = 0, [`Cause::OutOfRange`] above `max_cqe` (rxe
    /// `rxe_cq_chk_attr`).
    pub fn new(cqe: u32, max_cqe: u32) -> Result<Self, Cause> {
        check_cqe(cqe, max_cqe)?;
        Ok(CompletionQueue {
            capacity: rxe_queue_capacity(cqe),
            entries: VecDeque::new(),
            overrun: false,
            notify: CqNotify::Disarmed,
            users: 0,
        })
    }

    /// How many completions the CQ holds at most (`ibv_cq.cqe`).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the CQ overran and is in the error state.
    pub fn is_overrun(&self) -> bool {
        self.overrun
    }

    /// The arming state.
    pub fn notify_state(&self) -> CqNotify {
        self.notify
    }

    /// How many QPs use this CQ.
    pub fn users(&self) -> u32 {
        self.users
    }

    /// Queues a completion. `solicited` says whether the completed receive was for a message
    /// with the solicited-event bit set (error completions count as solicited).
    ///
    /// Returns whether a completion event is due: the CQ was armed for the next completion, or for
    /// solicited ones and this one is solicited or failed. Arming is one-shot
    /// (ibv_req_notify_cq(3)).
    ///
    /// # Errors
    /// [`Cause::CqOverrun`] if the CQ is full or already overran; the CQ is then in error.
    pub fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Result<bool, Cause> {
        if self.overrun || self.entries.len() >= self.capacity as usize {
            self.overrun = true;
            return Err(Cause::CqOverrun {
                capacity: self.capacity,
            });
        }
        let failed = wc.status != crate::verbs::wc::WcStatus::Success;
        self.entries.push_back(wc);
        let fire = match self.notify {
            CqNotify::Disarmed => false,
            CqNotify::NextCompletion => true,
            CqNotify::Solicited => solicited || failed,
        };
        if fire {
            self.notify = CqNotify::Disarmed;
        }
        Ok(fire)
    }

    /// Removes and yields up to `max` completions, oldest first (ibv_poll_cq(3) with
    /// `num_entries = max`).
    pub fn poll(&mut self, max: usize) -> impl Iterator<Item = WorkCompletion> + '_ {
        let n = max.min(self.entries.len());
        self.entries.drain(..n)
    }

    /// Moves up to `out.len()` completions into `out`, oldest first, and returns how many
    /// (ibv_poll_cq(3)).
    pub fn poll_into(&mut self, out: &mut [WorkCompletion]) -> usize {
        // Drain exactly as many as fit: a drain iterator dropped early would discard the rest.
        let max = out.len();
        let mut n = 0;
        for (slot, wc) in out.iter_mut().zip(self.poll(max)) {
            *slot = wc;
            n += 1;
        }
        n
    }

    /// Arms the CQ: the next completion (or, with `solicited_only`, the next solicited or error
    /// completion) makes [`Self::push`] report that an event is due (ibv_req_notify_cq(3)).
    pub fn req_notify(&mut self, solicited_only: bool) {
        self.notify = if solicited_only {
            CqNotify::Solicited
        } else {
            CqNotify::NextCompletion
        };
    }

    /// Changes the capacity (ibv_resize_cq(3)); queued completions are kept.
    ///
    /// # Errors
    /// As [`Self::new`], and [`Cause::OutOfRange`] if fewer than the queued completions would fit
    /// (rxe `rxe_cq_chk_attr`).
    pub fn resize(&mut self, cqe: u32, max_cqe: u32) -> Result<(), Cause> {
        check_cqe(cqe, max_cqe)?;
        let capacity = rxe_queue_capacity(cqe);
        if (capacity as usize) < self.entries.len() {
            return Err(Cause::OutOfRange {
                attr: "cqe",
                value: self.entries.len() as u64,
                max: capacity.into(),
            });
        }
        self.capacity = capacity;
        Ok(())
    }
}

fn check_cqe(cqe: u32, max_cqe: u32) -> Result<(), Cause> {
    if cqe == 0 {
        return Err(Cause::InvalidValue {
            attr: "cqe",
            value: 0,
        });
    }
    if cqe > max_cqe {
        return Err(Cause::OutOfRange {
            attr: "cqe",
            value: cqe.into(),
            max: max_cqe.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::wc::{WcOpcode, WcStatus};
    use proptest::prelude::*;
    use std::vec::Vec;

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion::success(id, WcOpcode::Send, 0x11, 0)
    }

    #[test]
    fn capacity_rounds_as_rxe() {
        assert_eq!(rxe_queue_capacity(0), 0);
        assert_eq!(rxe_queue_capacity(1), 1);
        assert_eq!(rxe_queue_capacity(2), 3);
        assert_eq!(rxe_queue_capacity(10), 15);
        assert_eq!(rxe_queue_capacity(16), 31);
        assert_eq!(rxe_queue_capacity(32767), 32767);
        assert_eq!(rxe_queue_capacity(u32::MAX), u32::MAX);
        assert_eq!(CompletionQueue::new(10, 32767).unwrap().capacity(), 15);
    }

    #[test]
    fn cqe_limits() {
        assert!(matches!(
            CompletionQueue::new(0, 100),
            Err(Cause::InvalidValue { attr: "cqe", .. })
        ));
        assert!(matches!(
            CompletionQueue::new(101, 100),
            Err(Cause::OutOfRange { attr: "cqe", .. })
        ));
    }

    #[test]
    fn overrun_is_reported_and_sticky() {
        let mut cq = CompletionQueue::new(1, 100).unwrap();
        assert_eq!(cq.push(wc(1), false), Ok(false));
        assert_eq!(cq.push(wc(2), false), Err(Cause::CqOverrun { capacity: 1 }));
        assert!(cq.is_overrun());
        let polled: Vec<_> = cq.poll(8).collect();
        assert_eq!(polled, [wc(1)], "queued entries survive the overrun");
        assert!(cq.push(wc(3), false).is_err(), "the CQ stays in error");
    }

    #[test]
    fn poll_in_order_and_bounded() {
        let mut cq = CompletionQueue::new(8, 100).unwrap();
        for i in 0..5 {
            cq.push(wc(i), false).unwrap();
        }
        let first: Vec<u64> = cq.poll(2).map(|w| w.wr_id).collect();
        assert_eq!(first, [0, 1]);
        let mut out = [wc(99); 8];
        assert_eq!(cq.poll_into(&mut out), 3);
        assert_eq!(
            out[..3].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(cq.poll_into(&mut out), 0);
        for i in 0..5 {
            cq.push(wc(i), false).unwrap();
        }
        let mut two = [wc(99); 2];
        assert_eq!(cq.poll_into(&mut two), 2);
        assert_eq!(cq.len(), 3, "completions that did not fit stay queued");
    }

    #[test]
    fn notification_is_one_shot() {
        let mut cq = CompletionQueue::new(8, 100).unwrap();
        assert_eq!(cq.push(wc(0), true), Ok(false), "not armed");
        cq.req_notify(false);
        assert_eq!(cq.push(wc(1), false), Ok(true));
        assert_eq!(cq.push(wc(2), false), Ok(false), "disarmed after firing");
        cq.req_notify(true);
        assert_eq!(cq.push(wc(3), false), Ok(false), "not solicited");
        let err = WorkCompletion::error(4, WcStatus::RemAccessErr, WcOpcode::Send, 0x11);
        assert_eq!(cq.push(err, false), Ok(true), "errors count as solicited");
        cq.req_notify(true);
        assert_eq!(cq.push(wc(5), true), Ok(true));
        assert_eq!(cq.notify_state(), CqNotify::Disarmed);
    }

    #[test]
    fn resize_keeps_entries() {
        let mut cq = CompletionQueue::new(8, 100).unwrap();
        for i in 0..5 {
            cq.push(wc(i), false).unwrap();
        }
        assert!(matches!(cq.resize(3, 100), Err(Cause::OutOfRange { .. })));
        cq.resize(6, 100).unwrap();
        assert_eq!(cq.capacity(), 7);
        assert!(cq.resize(101, 100).is_err());
        assert_eq!(cq.len(), 5);
    }

    proptest! {
        #[test]
        fn cq_never_loses_silently(ops in proptest::collection::vec(0usize..4, 0..200), cqe in 1u32..20) {
            let mut cq = CompletionQueue::new(cqe, 100).unwrap();
            let cap = cq.capacity() as usize;
            let mut model = std::collections::VecDeque::new();
            let mut overrun = false;
            let mut next = 0u64;
            for n in ops {
                if n == 0 {
                    let got: Vec<_> = cq.poll(3).map(|w| w.wr_id).collect();
                    let want: Vec<_> = (0..3.min(model.len())).map(|_| model.pop_front().unwrap()).collect();
                    prop_assert_eq!(got, want);
                } else {
                    let r = cq.push(wc(next), false);
                    if overrun || model.len() >= cap {
                        prop_assert!(r.is_err());
                        overrun = true;
                    } else {
                        prop_assert!(r.is_ok());
                        model.push_back(next);
                    }
                    next += 1;
                }
                prop_assert_eq!(cq.len(), model.len());
                prop_assert_eq!(cq.is_overrun(), overrun);
            }
        }
    }
}
