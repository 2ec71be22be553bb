//! Polling with backoff on a counter in shared memory: spin, then yield, then sleep on a futex.
//!
//! A waiter polls its counter `spin` times (with a spin-loop hint), then yields the CPU `yields`
//! times, then sleeps on the counter's futex in slices of at most [`SLEEP_SLICE`]. The writer of
//! the counter wakes it only when the waiter has announced itself, so the fast path of a post is a
//! store, a fence and one load. Between slices the waiter checks, in this order: the condition,
//! the peer's abort word, the timeout, and (every slice) whether the peer process still lives. A
//! lost wake-up therefore costs at most one slice, never a hang.
//!
//! Missed wake-up race: the waiter stores `waiting = 1`, then re-reads the counter; the writer
//! stores the counter, then reads `waiting`. Both sides put a `SeqCst` fence between their store
//! and their load, so at least one of them sees the other's store: either the writer sees
//! `waiting == 1` and wakes, or the waiter sees the new counter and does not sleep (and FUTEX_WAIT
//! itself refuses to sleep when the word no longer holds the value the waiter saw).

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::sys::{futex_wait, futex_wake, Liveness};
use super::Abort;

/// Longest single futex sleep: bounds how late a death or a missed wake-up is noticed.
pub const SLEEP_SLICE: Duration = Duration::from_millis(5);

/// How a connector waits for its peer before sleeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Polls with a spin-loop hint before yielding.
    pub spin: u32,
    /// `sched_yield`s before sleeping on the futex.
    pub yields: u32,
}

impl WaitPolicy {
    /// For ranks that each have a core: spin about ten microseconds, then sleep.
    pub const DEDICATED: WaitPolicy = WaitPolicy {
        spin: 4096,
        yields: 4,
    };
    /// For more local ranks than cores: hand the core over almost at once, since the rank that
    /// would make progress may be waiting for it.
    pub const OVERSUBSCRIBED: WaitPolicy = WaitPolicy {
        spin: 64,
        yields: 1,
    };

    /// [`Self::OVERSUBSCRIBED`] when `local_ranks` exceeds the CPUs this process may run on,
    /// else [`Self::DEDICATED`].
    pub fn for_local_ranks(local_ranks: usize) -> WaitPolicy {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if local_ranks > cpus {
            WaitPolicy::OVERSUBSCRIBED
        } else {
            WaitPolicy::DEDICATED
        }
    }
}

/// Why a wait ended without its condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// No progress within the timeout; how long was waited.
    Timeout(Duration),
    /// The peer process is gone.
    Died(u32),
    /// The peer wrote an abort word.
    Aborted(Abort),
}

/// The shared words one wait watches.
pub(crate) struct Waiter<'a> {
    /// The counter the peer advances (and the futex word).
    pub word: &'a AtomicU32,
    /// Our "I am about to sleep on `word`" flag, read by the peer after it advances `word`.
    pub waiting: &'a AtomicU32,
    /// The peer's abort word.
    pub peer_abort: &'a AtomicU32,
    /// The peer process.
    pub liveness: &'a Liveness,
    /// Spin and yield counts.
    pub policy: WaitPolicy,
}

impl Waiter<'_> {
    /// Waits until `ready` returns `Some`, at most `timeout`.
    pub(crate) fn wait<T>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut() -> Option<T>,
    ) -> Result<T, WaitEnd> {
        for _ in 0..self.policy.spin {
            if let Some(v) = ready() {
                return Ok(v);
            }
            core::hint::spin_loop();
        }
        for _ in 0..self.policy.yields {
            if let Some(v) = ready() {
                return Ok(v);
            }
            std::thread::yield_now();
        }
        let start = Instant::now();
        loop {
            let seen = self.word.load(Ordering::Acquire);
            if let Some(v) = ready() {
                return Ok(v);
            }
            // Acquire: pairs with the peer's Release store of its abort word, which it makes after
            // its last post; the re-check below then sees every post made before the abort, so
            // data that was sent before an abort or a close is still delivered.
            if let Some(abort) = Abort::from_word(self.peer_abort.load(Ordering::Acquire)) {
                return ready().ok_or(WaitEnd::Aborted(abort));
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(WaitEnd::Timeout(elapsed));
            }
            if !self.liveness.alive() {
                return ready().ok_or(WaitEnd::Died(self.liveness.pid().unwrap_or(0)));
            }
            // SeqCst store + fence: the waiter's half of the missed-wake-up handshake (module
            // docs); the peer's half is in `notify`.
            self.waiting.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.word.load(Ordering::SeqCst) == seen {
                futex_wait(self.word, seen, SLEEP_SLICE.min(timeout - elapsed));
            }
            self.waiting.store(0, Ordering::Relaxed);
        }
    }
}

/// After storing a new value into `word` (with Release), wakes the peer if it announced that it
/// sleeps on `word`: the writer's half of the missed-wake-up handshake.
#[inline]
pub(crate) fn notify(word: &AtomicU32, waiting: &AtomicU32) {
    fence(Ordering::SeqCst);
    if waiting.load(Ordering::Relaxed) != 0 {
        futex_wake(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::AbortReason;
    use std::sync::Arc;

    struct Words {
        word: AtomicU32,
        waiting: AtomicU32,
        abort: AtomicU32,
    }

    fn words() -> Arc<Words> {
        Arc::new(Words {
            word: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            abort: AtomicU32::new(0),
        })
    }

    #[test]
    fn wakes_on_notify_from_another_thread() {
        let w = words();
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.word.store(1, Ordering::Release);
            notify(&w2.word, &w2.waiting);
        });
        let live = Liveness::SameProcess;
        let waiter = Waiter {
            word: &w.word,
            waiting: &w.waiting,
            peer_abort: &w.abort,
            liveness: &live,
            policy: WaitPolicy::OVERSUBSCRIBED,
        };
        let got = waiter.wait(Duration::from_secs(10), || {
            let v = w.word.load(Ordering::Acquire);
            (v == 1).then_some(v)
        });
        assert_eq!(got, Ok(1));
        t.join().unwrap();
    }

    #[test]
    fn times_out_and_reports_aborts() {
        let w = words();
        let live = Liveness::SameProcess;
        let waiter = Waiter {
            word: &w.word,
            waiting: &w.waiting,
            peer_abort: &w.abort,
            liveness: &live,
            policy: WaitPolicy::OVERSUBSCRIBED,
        };
        let r: Result<(), _> = waiter.wait(Duration::from_millis(15), || None);
        assert!(matches!(r, Err(WaitEnd::Timeout(d)) if d >= Duration::from_millis(15)));
        let a = Abort {
            origin: 3,
            reason: AbortReason::Mismatch,
        };
        w.abort.store(a.to_word(), Ordering::Release);
        let r: Result<(), _> = waiter.wait(Duration::from_secs(10), || None);
        assert_eq!(r, Err(WaitEnd::Aborted(a)));
    }
}
