//! The progress engine of a [`SoftDevice`](super::SoftDevice), the same over every
//! [`Link`]: one round moves a batch of datagrams from the link into the engine, fires due
//! timers, and moves a batch of packets from the engine to the link; the progress thread repeats
//! rounds and sleeps (in poll(2) on the link's poller) when there is nothing to do.
//!
//! # Locks
//! Two mutexes: `io` (the link, with its receive batch and transmit buffers) and `engine` (the
//! [`SoftHca`]). A round holds `io` throughout and takes `engine` only while the engine runs
//! (never across a system call); verbs take only `engine`. The order is always `io`, then
//! `engine`. The progress thread sleeps holding neither: it waits on the link's poller
//! ([`Link::poller`]: a duplicate of the socket descriptor, an interrupt eventfd), so a verb
//! can send on the link while the thread sleeps. A link that must ask its device for a wake-up
//! ([`Link::arm_wakeup`]) is armed under `io` just before the sleep.
//!
//! # Waking the thread
//! A verb that created work while the thread sleeps sends it itself if `io` is free
//! (`try_lock`: no thread hand-off on the send path of an idle device); otherwise (the thread is
//! busy and will send it in full batches with the rest, or `io` is taken) it sets `pending` and
//! wakes the thread if it is `sleeping` (a Dekker pair, both `SeqCst`: either the verb sees
//! `sleeping` and wakes it, or the thread sees `pending` before it sleeps). A verb whose round
//! armed a timer earlier than the one the thread sleeps until (`sleep_until`, written by the
//! thread under the engine lock) wakes it too, so no timer fires late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::Instant;
use crate::link::LinkWait;

use super::{lock, Shared, SoftLink};

/// Longest sleep of an idle progress thread with no timer armed (it then re-checks `stop`; a
/// wake ends any sleep at once).
const MAX_SLEEP: Duration = Duration::from_millis(500);

/// What one round did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RoundOutcome {
    /// Datagrams received and handed to the engine.
    pub(crate) received: usize,
    /// Packets built.
    pub(crate) built: usize,
    /// Every transmit slot was used: the engine probably has more.
    pub(crate) tx_full: bool,
    /// The receive batch was full: more datagrams are probably waiting.
    pub(crate) rx_full: bool,
    /// Built packets are waiting for room in the socket buffer.
    pub(crate) blocked: bool,
    /// Datagrams arrived and building what they call for (ACKs, READ responses) was left to
    /// the next round, so that it can go out together with what the caller posts in reply.
    pub(crate) deferred: bool,
    /// The engine's next timer.
    pub(crate) next_timer: Option<Instant>,
    /// A quiet round ([`Quiet`]): nothing changed, so the CQs are as the caller found them.
    pub(crate) quiet: bool,
}

impl RoundOutcome {
    /// Whether another round should follow at once.
    pub(crate) fn busy(&self) -> bool {
        !self.blocked && (self.tx_full || self.rx_full || self.deferred)
    }
}

/// The per-round counters of [`super::DeviceCounters`], kept out of the `counters` mutex: a
/// round bumps them on every call, and only the holder of the `io` lock does, so a plain load
/// and store (no read-modify-write) suffice; readers see a value at most one round old.
#[derive(Debug, Default)]
pub(crate) struct RoundCounts {
    rounds: AtomicU64,
    inline_rounds: AtomicU64,
    quiet_rounds: AtomicU64,
}

impl RoundCounts {
    /// Bumps `c`; the caller holds the `io` lock (the only writer).
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Copies the counts into `out`.
    pub(crate) fn read_into(&self, out: &mut super::DeviceCounters) {
        out.rounds = self.rounds.load(Ordering::Relaxed);
        out.inline_rounds = self.inline_rounds.load(Ordering::Relaxed);
        out.quiet_rounds = self.quiet_rounds.load(Ordering::Relaxed);
    }
}

/// Caller rounds in a row that must receive datagrams before the next one polls with the full
/// batch: a ping-pong's answer arrives alone (one GRO buffer), and the round after it found the
/// socket empty, so a full batch there cost a recvmmsg(2) of [`crate::link::udp::MAX_BATCH`]
/// prepared headers per message for nothing (issue 21: one receive call per message, as a
/// plain socket makes); a stream of messages fills the batch from its third round on.
const DATA_ROUNDS_FOR_FULL_BATCH: u8 = 2;

/// A quiet caller round ([`Quiet`]) reads the clock for due timers only once per this many
/// quiet rounds: a timer fires at most this many empty polls late (each at least one receive
/// system call: microseconds, against timers of at least tens of microseconds, IBTA vol. 1
/// 9.7.6.1.3 and table 45), and the other polls make no clock_gettime(2) call.
const QUIET_ROUNDS_PER_CLOCK: u8 = 8;

/// What the last full round left, when it left the engine with nothing to do: no datagram
/// received, no packet built or unsent, no timer fired, nothing held ([`super::ACK_HOLD`]), no
/// event for the hooks. While no verb has run on the engine since (the device's `epoch` is
/// still `epoch`: every engine operation bumps it) and the socket stays empty, a caller's round
/// has nothing to give the engine and nothing to take from it until `next_timer`: it makes its
/// receive call and returns, without the engine lock, the clock read (but every
/// [`QUIET_ROUNDS_PER_CLOCK`]-th round) or the timer and transmit queue scans (issue 21: an
/// empty poll of a busy-polling caller cost about 1 200 instructions, a plain socket's about a
/// tenth of that).
#[derive(Debug, Clone, Copy)]
struct Quiet {
    /// The device's `epoch` read before the full round took the engine lock.
    epoch: u64,
    /// The engine's next timer as that round left it.
    next_timer: Option<Instant>,
    /// Quiet rounds left before the next clock read.
    clock_in: u8,
}

/// The link side of a device: owned by whoever runs a round.
pub(crate) struct Io<L> {
    pub(crate) link: L,
    /// Caller rounds in a row that received datagrams (saturating at
    /// [`DATA_ROUNDS_FOR_FULL_BATCH`]); 0 after one that received nothing.
    data_rounds: u8,
    /// The last full round left the engine quiet ([`Quiet`]).
    quiet: Option<Quiet>,
}

impl<L: SoftLink> Io<L> {
    pub(crate) fn new(link: L) -> Io<L> {
        Io {
            link,
            data_rounds: DATA_ROUNDS_FOR_FULL_BATCH,
            quiet: None,
        }
    }
}

impl<L: SoftLink> Shared<L> {
    /// The engine's clock: nanoseconds since the device was opened.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    pub(crate) fn notify_cq_waiters(&self) {
        if self.cq_waiters.load(Ordering::SeqCst) > 0 {
            self.cq_cv.notify_all();
        }
    }

    /// Calls the event hook, if one is installed ([`super::SoftDevice::set_event_hook`]).
    pub(crate) fn call_event_hook(&self) {
        if let Some(hook) = self.event_hook.get() {
            hook();
        }
    }

    /// Calls the MAD hook, if one is installed ([`crate::verbs::api::GsiPort::set_mad_hook`]).
    fn call_mad_hook(&self) {
        let hook = lock(&self.mad_hook).clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    fn record_error(&self, e: &dyn std::fmt::Display) {
        *lock(&self.last_error) = Some(e.to_string());
    }

    /// One round on the calling thread: receive (if `rx`), timers, transmit; `now`: the
    /// engine's clock if the caller just read it (else the round reads it).
    pub(crate) fn round(&self, io: &mut Io<L>, rx: bool, now: Option<Instant>) -> RoundOutcome {
        self.round_as(io, rx, false, false, now)
    }

    /// As [`Shared::round`]; `thread`: the progress thread runs it (it publishes its next
    /// wake-up); `defer`: when datagrams arrive, build nothing this round (a caller polling in a
    /// loop runs the next one at once, or posts its reply first: ACK and reply then leave in one
    /// batch).
    fn round_as(
        &self,
        io: &mut Io<L>,
        rx: bool,
        thread: bool,
        defer: bool,
        now: Option<Instant>,
    ) -> RoundOutcome {
        RoundCounts::bump(&self.round_counts.rounds);
        let mut out = RoundOutcome::default();
        if io.link.unsent() > 0 {
            self.flush(io);
            out.blocked = io.link.unsent() > 0;
        }
        // A caller spinning on an idle link, or that just received a lone answer, polls with a
        // small batch; the thread (woken by data) and a caller receiving a stream use the full
        // one (DATA_ROUNDS_FOR_FULL_BATCH).
        let small = rx && defer && io.data_rounds < DATA_ROUNDS_FOR_FULL_BATCH;
        let mut waiting = false;
        // Read before the receive: a verb that runs on the engine after this bumps the epoch
        // after it, so a quiet round below never misses its work.
        let epoch = self.epoch.load(Ordering::Acquire);
        if rx {
            match io.link.recv(small) {
                Ok(r) => waiting = r.waiting > 0,
                Err(e) => {
                    lock(&self.counters).rx_errors += 1;
                    self.record_error(&e);
                }
            }
        }
        if rx
            && defer
            && !waiting
            && !out.blocked
            && io.link.unsent() == 0
            && io.link.quiet_rounds_ok()
        {
            if let Some(q) = self.quiet_round(io, epoch) {
                RoundCounts::bump(&self.round_counts.quiet_rounds);
                io.data_rounds = 0;
                out.next_timer = q;
                out.quiet = true;
                return out;
            }
        } else {
            io.quiet = None;
        }
        let mut fired = false;
        let events;
        let mads;
        {
            let mut e = lock(&self.engine);
            // A clock read before the engine lock may be older than what another thread's round
            // handed the engine meanwhile: never go back (timers would count from the past).
            let now = now.map_or_else(|| self.now(), |n| n.max(e.latest_instant()));
            if waiting {
                match io.link.deliver(|d| e.handle_datagram(now, d)) {
                    Ok(n) => out.received = n,
                    Err(err) => {
                        lock(&self.counters).rx_errors += 1;
                        self.record_error(&err);
                    }
                }
                out.rx_full = io.link.rx_full(out.received);
            }
            if rx && defer {
                io.data_rounds = if out.received == 0 {
                    0
                } else {
                    (io.data_rounds + 1).min(DATA_ROUNDS_FOR_FULL_BATCH)
                };
            }
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
                fired = true;
            }
            // Hold only what answers a request (ACKs, READ responses); a round that received
            // a requester's ACKs builds the requests they unblocked at once.
            out.deferred = defer && out.received > 0 && e.has_queued_responses();
            if !out.blocked && !out.deferred {
                let (built, full) = io.link.build(&mut e, now);
                out.built = built;
                out.tx_full = full;
            }
            // Only the holder of `io` writes `held_since` (plain store; SeqCst for the Dekker
            // pair with the thread's `sleeping` in `hybrid_round`).
            if out.deferred {
                if self.held_since.load(Ordering::Relaxed) == 0 {
                    self.held_since
                        .store(now.as_nanos().max(1), Ordering::SeqCst);
                }
            } else if !out.blocked && self.held_since.load(Ordering::Relaxed) != 0 {
                // A SeqCst store is a locked exchange on x86: skipped when nothing is held (a
                // busy poller's empty rounds).
                self.held_since.store(0, Ordering::SeqCst);
            }
            out.next_timer = e.poll_timeout();
            events = self.event_hook.get().is_some() && e.has_pending_events();
            mads = self.mad_hook_on.load(Ordering::Relaxed) && e.has_pending_mads();
            if thread {
                let until = out.next_timer.map_or(u64::MAX, Instant::as_nanos);
                self.sleep_until.store(until, Ordering::SeqCst);
            }
        }
        // The epoch a quiet state is valid for: this round's own bump included when no verb
        // bumped it since the read above (a round that built its packets and sent them all
        // leaves the engine as quiet as one that found nothing to do).
        let mut quiet_epoch = Some(epoch);
        if out.received > 0 || out.built > 0 || fired {
            let prev = self.epoch.fetch_add(1, Ordering::Release);
            quiet_epoch = (prev == epoch).then(|| prev.wrapping_add(1));
            self.notify_cq_waiters();
        }
        io.quiet = quiet_epoch
            .filter(|_| {
                !events
                    && !mads
                    && !out.blocked
                    && !out.deferred
                    && !out.tx_full
                    && !out.rx_full
                    && self.held_since.load(Ordering::Relaxed) == 0
            })
            .map(|epoch| Quiet {
                epoch,
                next_timer: out.next_timer,
                clock_in: QUIET_ROUNDS_PER_CLOCK,
            });
        if events {
            self.call_event_hook();
        }
        if mads {
            self.call_mad_hook();
        }
        // Links may have frames of their own to send too (ARP, Neighbor Discovery).
        if out.built > 0 || io.link.unsent() > 0 {
            self.flush(io);
            out.blocked = io.link.unsent() > 0;
        }
        out
    }

    /// A caller's round that received nothing, on an engine the last full round left quiet
    /// ([`Quiet`]): `Some(next timer)` when nothing changed since (`epoch`, read before the
    /// receive, is the quiet round's) and no timer is due by the clock (read every
    /// [`QUIET_ROUNDS_PER_CLOCK`]-th call): the round is over. `None`: run the full round.
    fn quiet_round(&self, io: &mut Io<L>, epoch: u64) -> Option<Option<Instant>> {
        let q = io.quiet.as_mut()?;
        if q.epoch != epoch {
            io.quiet = None;
            return None;
        }
        if let Some(t) = q.next_timer {
            q.clock_in = q.clock_in.saturating_sub(1);
            if q.clock_in == 0 {
                if self.now() >= t {
                    io.quiet = None;
                    return None;
                }
                q.clock_in = QUIET_ROUNDS_PER_CLOCK;
            }
        }
        Some(q.next_timer)
    }

    /// Sends the built packets not sent yet, as far as the link takes them; counts what the link
    /// refused for good (dropped: the transport recovers as from a loss) and blocked sends.
    fn flush(&self, io: &mut Io<L>) {
        let report = io.link.flush();
        if report.dropped > 0 || report.blocked > 0 {
            let mut c = lock(&self.counters);
            c.tx_dropped += report.dropped;
            c.tx_blocked += report.blocked;
        }
        if let Some(e) = report.error {
            self.record_error(&e);
        }
    }

    /// A round on a caller's thread (caller-driven progress, or an explicit `progress()`).
    pub(crate) fn caller_round(&self) -> RoundOutcome {
        let caller = self.progress == super::Progress::Caller;
        let outcome = {
            let mut io = lock(&self.io);
            // Deferring builds to the caller's next round only makes sense if there is one.
            self.round_as(&mut io, true, false, caller, None)
        };
        if !caller {
            self.after_foreign_round(&outcome);
        }
        outcome
    }

    /// After a round the progress thread did not run: make it run one if work is left or a
    /// timer now expires before the thread wakes by itself.
    fn after_foreign_round(&self, outcome: &RoundOutcome) {
        // Progress::Hybrid: while a caller polls it fires timers itself and its next poll's
        // round goes on with a full batch (a bandwidth test's window: the thread would
        // contend for the locks and the CPUs with the poller, and the peer's thread needs a
        // CPU too), and the thread wakes by the end of the caller window anyway; a wake per
        // post would cost a context switch. Only a socket that refused a send needs the
        // thread's wait for room.
        let polling = self.callers_poll();
        let earlier_timer = !polling
            && outcome
                .next_timer
                .is_some_and(|t| t.as_nanos() < self.sleep_until.load(Ordering::SeqCst));
        let more = !polling && (outcome.tx_full || outcome.rx_full);
        if more || outcome.blocked || earlier_timer {
            self.request_round();
        }
    }

    /// After a verb created work: send it now if the socket is free, and make sure the progress
    /// thread (if any) runs a round if more is left or a timer moved earlier. `now`: the clock
    /// the verb read, if it did.
    pub(crate) fn kick(&self, now: Option<Instant>) {
        let thread_rounds = match self.progress {
            super::Progress::Thread => true,
            // While a caller polls, the thread leaves rounds to callers.
            super::Progress::Hybrid => !self.callers_poll(),
            super::Progress::Caller => false,
        };
        if thread_rounds && !self.sleeping.load(Ordering::SeqCst) {
            // The thread is busy: it builds the new work with everything else in its next
            // round, in full batches (sending here would split them into small ones).
            self.request_round();
            return;
        }
        let outcome = match self.io.try_lock() {
            Ok(mut io) => {
                RoundCounts::bump(&self.round_counts.inline_rounds);
                self.round(&mut io, false, now)
            }
            Err(_) => {
                self.request_round();
                return;
            }
        };
        if self.progress == super::Progress::Caller {
            return;
        }
        self.after_foreign_round(&outcome);
    }

    /// [`super::Progress::Hybrid`]: a round on the thread of a caller that found its CQ empty,
    /// if no other thread is in one (`try_lock`: a busy poller never waits for the progress
    /// thread). Opens (extends) the caller window, during which the thread stays off the
    /// socket. What the round did (`None`: another thread was in one).
    pub(crate) fn hybrid_round(&self) -> Option<RoundOutcome> {
        let Ok(mut io) = self.io.try_lock() else {
            let since = self.caller_busy_since.load(Ordering::Relaxed);
            if since == 0 {
                self.caller_busy_since
                    .store(self.now().as_nanos().max(1), Ordering::Relaxed);
            }
            lock(&self.counters).caller_io_busy += 1;
            return None;
        };
        let now = self.now();
        let last = self
            .last_caller_round
            .swap(now.as_nanos(), Ordering::Relaxed);
        if last != 0 {
            let gap = now.as_nanos().saturating_sub(last);
            if gap > super::CALLER_WINDOW.as_nanos() as u64 {
                self.caller_round_gaps.fetch_add(1, Ordering::Relaxed);
            }
            if gap > self.caller_round_gap_max.load(Ordering::Relaxed) {
                self.caller_round_gap_max.store(gap, Ordering::Relaxed);
            }
        }
        let since = self.caller_busy_since.swap(0, Ordering::Relaxed);
        if since != 0 {
            let mut c = lock(&self.counters);
            c.caller_io_busy_max_ns = c
                .caller_io_busy_max_ns
                .max(now.as_nanos().saturating_sub(since));
        }
        let until = now.as_nanos() + super::CALLER_WINDOW.as_nanos() as u64;
        self.caller_until.store(until, Ordering::SeqCst);
        // As Progress::Caller: the ACKs (and READ responses) of what this round receives are
        // built by the caller's next round, so that they leave in one sendmmsg(2) with the
        // reply it posts meanwhile (IBTA vol. 1 9.7.5.1.2: a responder may coalesce
        // acknowledgements). The hold is bounded: a round whose oldest hold is ACK_HOLD old
        // builds at once, the progress thread builds it when callers stop polling
        // (`run_thread`), and destroy_qp / modify_qp / close / req_notify_cq send it first.
        let held = self.held_since.load(Ordering::Relaxed);
        let defer = held == 0 || now.as_nanos() < held + super::ACK_HOLD.as_nanos() as u64;
        let outcome = self.round_as(&mut io, true, false, defer, Some(now));
        drop(io);
        // A thread asleep on the socket (it slept before callers polled) may sleep up to
        // MAX_SLEEP: wake it once so that it watches the hold (Dekker pair: `held_since`
        // here, `caller_until` in `run_thread` after it sets `sleeping`).
        if outcome.deferred
            && self.sleeping.load(Ordering::SeqCst)
            && !self.blind.load(Ordering::SeqCst)
        {
            lock(&self.counters).wakes += 1;
            let _ = self.waker.wake();
        }
        // The caller drives timers and full batches with its next poll while it
        // polls; the thread picks up at the end of the window what it leaves (waking it for
        // each full one-datagram idle batch would cost a switch per packet). Only a socket that
        // refused a send needs the thread's wait for writable.
        if outcome.blocked {
            self.request_round();
        }
        Some(outcome)
    }

    /// [`super::Progress::Hybrid`]: closes the caller window and wakes the thread if it sleeps
    /// off the socket, so that it sleeps on the socket again (the caller is about to block).
    pub(crate) fn end_caller_window(&self) {
        if self.progress != super::Progress::Hybrid {
            return;
        }
        self.caller_until.store(0, Ordering::SeqCst);
        self.flush_held();
        if self.blind.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Builds and sends what callers' rounds held ([`super::ACK_HOLD`]: the ACKs and READ
    /// responses of messages received in a round that built nothing), if anything is held; a
    /// round on this thread (waits for `io`). Called before a QP is destroyed or modified,
    /// before the device closes, when a program is about to block, and by the drop-in
    /// libibverbs at process exit (through [`super::SoftDevice::progress`]): a program may
    /// exit right after its last completion, and the peer would retransmit what the held ACK
    /// acknowledges until `IBV_WC_RETRY_EXC_ERR`.
    pub(crate) fn flush_held(&self) {
        if self.held_since.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut io = lock(&self.io);
        self.round(&mut io, false, None);
    }

    /// [`super::Progress::Hybrid`]: a callers' hold is at least [`super::ACK_HOLD`] old.
    fn hold_overdue(&self, now: u64) -> bool {
        let held = self.held_since.load(Ordering::SeqCst);
        held != 0 && now >= held + super::ACK_HOLD.as_nanos() as u64
    }

    /// [`super::Progress::Hybrid`] and a caller polled within [`super::CALLER_WINDOW`].
    fn callers_poll(&self) -> bool {
        self.progress == super::Progress::Hybrid
            && self.now().as_nanos() < self.caller_until.load(Ordering::SeqCst)
    }

    /// The progress thread's sleep while callers poll ([`Shared::callers_poll`]): on the waker
    /// only, until the caller window ends, [`Shared::end_caller_window`] or a request.
    fn blind_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        self.blind.store(true, Ordering::SeqCst);
        // Dekker pairs: `pending` with `sleeping` (request_round), `caller_until` with `blind`
        // (end_caller_window).
        let until = self.caller_until.load(Ordering::SeqCst);
        let now = self.now().as_nanos();
        // Wake when the caller window ends (callers stopped polling: the socket is the
        // thread's again), or, if a callers' round holds an ACK now, when that hold becomes
        // due ([`super::ACK_HOLD`]). A hold that starts during the sleep wakes nobody (it
        // would cost a context switch per message of a ping-pong): while callers poll their
        // own round builds it once due, and when they stop the window ends at most
        // CALLER_WINDOW after their last round. So while a program busy-polls the thread wakes
        // about once per CALLER_WINDOW, and a held ACK waits at most ACK_HOLD (callers poll)
        // or ACK_HOLD + CALLER_WINDOW (they stopped right after holding it).
        let held = self.held_since.load(Ordering::SeqCst);
        let until = if held == 0 {
            until
        } else {
            until.min(held + super::ACK_HOLD.as_nanos() as u64)
        };
        if !self.pending.load(Ordering::SeqCst) && now < until {
            let timeout = Duration::from_nanos(until - now).min(MAX_SLEEP);
            lock(&self.counters).sleeps += 1;
            if let Ok([r]) = crate::link::sys::poll(
                [(std::os::fd::AsFd::as_fd(&self.waker), libc::POLLIN)],
                timeout,
            ) {
                if r & libc::POLLIN != 0 {
                    let _ = self.waker.take();
                }
            }
        }
        self.blind.store(false, Ordering::SeqCst);
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Makes the progress thread run a round soon.
    fn request_round(&self) {
        if self.progress == super::Progress::Caller {
            return;
        }
        self.pending.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            lock(&self.counters).wakes += 1;
            let _ = self.waker.wake();
        }
    }

    /// The progress thread: rounds until `stop`, sleeping in poll(2) when idle.
    pub(crate) fn run_thread(&self) {
        let mut idle_rounds = 0u32;
        while !self.stop.load(Ordering::SeqCst) {
            if self.callers_poll()
                && !self.pending.load(Ordering::SeqCst)
                && !self.hold_overdue(self.now().as_nanos())
            {
                // Progress::Hybrid: a caller polls and drives the engine (receive, timers,
                // send); no round here (it would contend for `io`), and a sleep on the waker
                // only (datagrams would each wake the thread) until the caller window ends or a
                // caller asks for a round.
                self.blind_sleep();
                continue;
            }
            let outcome = {
                let mut io = lock(&self.io);
                self.round_as(&mut io, true, true, false, None)
            };
            if outcome.busy() {
                idle_rounds = 0;
                continue;
            }
            if outcome.received > 0 || outcome.built > 0 {
                idle_rounds = 0;
            }
            // A busy-polled link has nothing to sleep on: spin (yielding) a while first.
            if idle_rounds < self.spin_rounds {
                idle_rounds += 1;
                std::thread::yield_now();
                continue;
            }
            self.sleeping.store(true, Ordering::SeqCst);
            // Hybrid: callers began to poll (and may hold ACKs) since the round: watch them
            // from the blind sleep instead of the socket (Dekker pair with `hybrid_round`);
            // unless the socket refused a send: then wait for room (an overdue hold would
            // otherwise make the thread spin on the full socket).
            if self.pending.swap(false, Ordering::SeqCst)
                || self.stop.load(Ordering::SeqCst)
                || (self.callers_poll() && !outcome.blocked)
            {
                self.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let mut link_timer = None;
            if L::ARMS_WAKEUP {
                let mut io = lock(&self.io);
                if !io.link.arm_wakeup() {
                    // Input arrived meanwhile: another round instead of a sleep.
                    drop(io);
                    self.sleeping.store(false, Ordering::SeqCst);
                    continue;
                }
                link_timer = io.link.next_timer();
            }
            let until = self.sleep_until.load(Ordering::SeqCst);
            let now = self.now().as_nanos();
            let mut timeout = if until == u64::MAX {
                MAX_SLEEP
            } else {
                Duration::from_nanos(until.saturating_sub(now)).min(MAX_SLEEP)
            };
            if let Some(t) = link_timer {
                timeout = timeout.min(t);
            }
            if !timeout.is_zero() {
                lock(&self.counters).sleeps += 1;
                if let Err(e) = self.poller.wait(outcome.blocked, &self.waker, timeout) {
                    self.record_error(&e);
                    // Do not spin on a persistent poll error.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.sleeping.store(false, Ordering::SeqCst);
            // A wake consumed by `wait` may have been for `pending`: the next round covers it.
            self.pending.store(false, Ordering::SeqCst);
        }
    }
}
