//! Rate-limited diagnostics: what the engine would log, as records the caller polls.
//!
//! A sans-I/O engine has no logger to call. It keeps what a driver would print (a dropped
//! packet and why, a QP that entered the error state) as [`DiagRecord`]s in a bounded queue the
//! caller drains with [`crate::engine::SoftHca::poll_diag`] and forwards to its own logger. Each
//! kind of record is rate-limited (a burst per interval of the caller's clock), so a peer that
//! floods bad packets costs a counter increment, not a log line each; counters
//! ([`crate::engine::Counters`]) always count everything.

use alloc::collections::VecDeque;

use super::counters::DropReason;
use super::time::Instant;
use crate::verbs::wc::WcStatus;

/// Most records kept unread; older ones are dropped (and counted) beyond it.
pub const MAX_PENDING_DIAGS: usize = 256;
/// Records of one kind allowed per [`DIAG_INTERVAL_NS`].
pub const DIAG_BURST: u32 = 8;
/// The rate-limit interval, nanoseconds of the caller's clock (1 s).
pub const DIAG_INTERVAL_NS: u64 = 1_000_000_000;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagKind {
    /// A received packet was dropped.
    Dropped(DropReason),
    /// A QP entered the error state; the WR that failed completed with this status.
    QpError(WcStatus),
    /// A UC or UD QP entered the send queue error state (SQE) after a send WR failed.
    SqError(WcStatus),
}

impl DiagKind {
    fn slot(self) -> usize {
        match self {
            DiagKind::Dropped(r) => r as usize,
            DiagKind::QpError(_) => DropReason::ALL.len(),
            DiagKind::SqError(_) => DropReason::ALL.len() + 1,
        }
    }
}

/// One diagnostic record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagRecord {
    /// When (the caller's clock).
    pub time: Instant,
    /// What.
    pub kind: DiagKind,
    /// The QP concerned, if known.
    pub qpn: Option<u32>,
    /// The PSN concerned, if any.
    pub psn: Option<u32>,
    /// A fixed explanation (which check failed).
    pub detail: &'static str,
}

const SLOTS: usize = DropReason::ALL.len() + 2;

/// The bounded, rate-limited record queue.
#[derive(Debug, Default)]
pub(crate) struct DiagLog {
    records: VecDeque<DiagRecord>,
    window_start: [u64; SLOTS],
    in_window: [u32; SLOTS],
    /// Records not kept: over the rate limit or the queue bound.
    pub(crate) suppressed: u64,
}

impl DiagLog {
    pub(crate) fn record(&mut self, record: DiagRecord) {
        let slot = record.kind.slot();
        let now = record.time.as_nanos();
        let (Some(start), Some(count)) = (
            self.window_start.get_mut(slot),
            self.in_window.get_mut(slot),
        ) else {
            return;
        };
        if now.saturating_sub(*start) >= DIAG_INTERVAL_NS || now < *start {
            *start = now;
            *count = 0;
        }
        if *count >= DIAG_BURST {
            self.suppressed = self.suppressed.wrapping_add(1);
            return;
        }
        *count += 1;
        if self.records.len() >= MAX_PENDING_DIAGS {
            self.records.pop_front();
            self.suppressed = self.suppressed.wrapping_add(1);
        }
        self.records.push_back(record);
    }

    pub(crate) fn pop(&mut self) -> Option<DiagRecord> {
        self.records.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64) -> DiagRecord {
        DiagRecord {
            time: Instant::from_nanos(t),
            kind: DiagKind::Dropped(DropReason::Icrc),
            qpn: None,
            psn: None,
            detail: "test",
        }
    }

    #[test]
    fn bursts_are_limited_per_interval() {
        let mut log = DiagLog::default();
        for i in 0..100 {
            log.record(rec(i));
        }
        assert_eq!(log.records.len(), DIAG_BURST as usize);
        assert_eq!(log.suppressed, 100 - u64::from(DIAG_BURST));
        log.record(rec(DIAG_INTERVAL_NS + 5));
        assert_eq!(log.records.len(), DIAG_BURST as usize + 1);
        assert!(log.pop().is_some());
    }
}
