//! Wait and pipelining counters of one rank's RoCE transport (issue 21), printed with the
//! device's counters when `COLL_ROCE_STATS=1`: how often a connector waited and why, how often
//! the wait found its condition at once, how many waits ran out of polls and slept (and how
//! many sleeps that took), and how many chunks were in flight per QP when a chunk was posted.
//! Counts, not times: they mean the same on a loaded machine.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::transport::WaitFor;

/// What kept a sender from posting its next step when its wait did not succeed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blocked {
    /// No credit: the receiver still holds `nslots` steps (the slot window).
    Credit,
    /// The staging slot's WR of `nslots` steps ago is not acknowledged yet (the HCA's window:
    /// the receiver's device has not run a round that acknowledged it).
    Ack,
    /// The send queue is full.
    Sq,
}

/// Per wait reason ([`WaitFor`]).
#[derive(Default)]
pub(super) struct WaitCounts {
    /// Waits.
    pub(super) waits: AtomicU64,
    /// Waits whose first check found the condition (no second poll).
    pub(super) at_once: AtomicU64,
    /// Polls (progress rounds with caller-driven progress) that found nothing.
    pub(super) vain_polls: AtomicU64,
    /// Waits that ran out of spins and yields and slept.
    pub(super) slept: AtomicU64,
    /// Sleeps (`wait_cq` calls: poll(2) on the socket, or the CQ's condition variable).
    pub(super) sleeps: AtomicU64,
}

/// The counters of one rank's transport (shared by its channels).
#[derive(Default)]
pub(super) struct Stats {
    pub(super) credit: WaitCounts,
    pub(super) data: WaitCounts,
    pub(super) drain: WaitCounts,
    /// Sender waits that did not succeed at once, by what blocked at the first check.
    pub(super) blocked_credit: AtomicU64,
    pub(super) blocked_ack: AtomicU64,
    pub(super) blocked_sq: AtomicU64,
    /// Data WRs posted.
    pub(super) posts: AtomicU64,
    /// Sum and maximum over posts of the steps posted and not yet credited by the receiver
    /// (counting the one just posted): the chunks in flight or held on the QP.
    pub(super) inflight_sum: AtomicU64,
    pub(super) inflight_max: AtomicU64,
    /// Sum and maximum over posts of the data WRs posted and not yet completed (acknowledged).
    pub(super) unacked_sum: AtomicU64,
    pub(super) unacked_max: AtomicU64,
}

impl Stats {
    pub(super) fn counts(&self, w: WaitFor) -> &WaitCounts {
        match w {
            WaitFor::Credit => &self.credit,
            WaitFor::Data => &self.data,
            WaitFor::Drain => &self.drain,
        }
    }

    pub(super) fn blocked(&self, b: Blocked) {
        let c = match b {
            Blocked::Credit => &self.blocked_credit,
            Blocked::Ack => &self.blocked_ack,
            Blocked::Sq => &self.blocked_sq,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a post with `inflight` steps uncredited and `unacked` WRs uncompleted.
    pub(super) fn post(&self, inflight: u32, unacked: u32) {
        self.posts.fetch_add(1, Ordering::Relaxed);
        self.inflight_sum
            .fetch_add(u64::from(inflight), Ordering::Relaxed);
        self.inflight_max
            .fetch_max(u64::from(inflight), Ordering::Relaxed);
        self.unacked_sum
            .fetch_add(u64::from(unacked), Ordering::Relaxed);
        self.unacked_max
            .fetch_max(u64::from(unacked), Ordering::Relaxed);
    }
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl fmt::Display for WaitCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "waits: {}, at_once: {}, vain_polls: {}, slept: {}, sleeps: {}",
            get(&self.waits),
            get(&self.at_once),
            get(&self.vain_polls),
            get(&self.slept),
            get(&self.sleeps)
        )
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let posts = get(&self.posts).max(1) as f64;
        write!(
            f,
            "waits for data {{ {} }}\n  waits for a slot {{ {}, blocked_credit: {}, \
             blocked_ack: {}, blocked_sq: {} }}\n  waits for drain {{ {} }}\n  \
             posts {{ posts: {}, inflight_avg: {:.2}, inflight_max: {}, unacked_avg: {:.2}, \
             unacked_max: {} }}",
            self.data,
            self.credit,
            get(&self.blocked_credit),
            get(&self.blocked_ack),
            get(&self.blocked_sq),
            self.drain,
            get(&self.posts),
            get(&self.inflight_sum) as f64 / posts,
            get(&self.inflight_max),
            get(&self.unacked_sum) as f64 / posts,
            get(&self.unacked_max),
        )
    }
}
