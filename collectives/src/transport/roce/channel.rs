//! One channel to one peer ([`Channel`]): an RC QP, its CQ and the rings, what its CQ has told
//! so far, and the waits, probes, aborts and cancellation that both connectors share.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hca::soft::DeviceError;
use hca::{
    CqHandle, QpAttr, QpAttrMask, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion,
};

use super::device::{lock, Hca, Region};
use super::layout::Layout;
use crate::transport::sys::Liveness;
use crate::transport::wait::{WaitPolicy, SLEEP_SLICE};
use crate::transport::{Abort, TransportError, WaitFor};

/// How long a wait goes without progress before it probes the peer with a zero-byte RDMA WRITE
/// (an unreachable peer then fails the probe with `IBV_WC_RETRY_EXC_ERR`).
pub const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Bytes of a channel's control block in the control region: the outgoing abort word at 0, the
/// landing buffer of incoming SENDs at 8 (8 bytes).
pub(super) const CTRL_BYTES: usize = 64;
pub(super) const CTRL_ABORT_OUT: usize = 0;
pub(super) const CTRL_LANDING: usize = 8;
pub(super) const LANDING_BYTES: u32 = 8;

/// Kinds of work request, in the top byte of the `wr_id`.
pub(super) const WR_DATA: u64 = 1 << 56;
pub(super) const WR_CREDIT: u64 = 2 << 56;
pub(super) const WR_ABORT: u64 = 3 << 56;
pub(super) const WR_PROBE: u64 = 4 << 56;
pub(super) const WR_RECV: u64 = 5 << 56;
/// A data WR whose payload SGE points into user memory (`post_from`).
pub(super) const WR_DATA_USER: u64 = 6 << 56;
pub(super) const WR_KIND: u64 = 0xff << 56;

/// Completions taken from a CQ per poll.
pub(super) const POLL_BATCH: usize = 32;

/// How long an abort waits for WRs that read user memory to complete before it cancels them by
/// moving the QP to the error state.
pub(super) const QUIESCE: Duration = Duration::from_millis(100);

/// How long a closing channel waits for its last WRs (a deferred credit, the abort word) to be
/// acknowledged by a live peer before the device closes.
pub(super) const SETTLE: Duration = Duration::from_millis(250);

/// A completion error or protocol violation that ended a channel.
#[derive(Debug, Clone)]
pub(super) enum Failure {
    Wc { status: WcStatus, wr: &'static str },
    Protocol(String),
}

/// What the CQ of a channel has told so far.
pub(super) struct ChanState {
    /// Data steps arrived and not yet taken by the receiver: `(imm, byte_len)`, in step order.
    pub(super) arrivals: std::collections::VecDeque<(u32, u32)>,
    /// The peer's `head`: steps of ours it consumed.
    pub(super) credit: u32,
    /// Steps posted by the sender.
    pub(super) posted: u32,
    /// Data WRs completed locally (in order: an RC send queue completes in order).
    pub(super) data_done: u32,
    /// Signaled WRs posted and not yet completed (the send queue's occupancy).
    pub(super) sq_outstanding: u32,
    /// Data WRs reading user memory posted and not yet completed.
    pub(super) user_wrs: u32,
    pub(super) recv_posted: u32,
    pub(super) probe_outstanding: bool,
    pub(super) peer_abort: Option<Abort>,
    pub(super) failure: Option<Failure>,
    pub(super) abort_sent: bool,
    pub(super) last_progress: Instant,
}

/// One channel to one peer: an RC QP, its CQ, and the rings; shared by the channel's send and
/// receive connectors.
pub(super) struct Channel {
    pub(super) hca: Arc<Hca>,
    pub(super) rank: usize,
    pub(super) peer: usize,
    pub(super) pid: u32,
    pub(super) channel: usize,
    pub(super) qpn: u32,
    pub(super) cq: CqHandle,
    pub(super) layout: Layout,
    /// This rank's registered receive rings (the peer writes into them).
    pub(super) recv: Arc<Region>,
    pub(super) recv_off: usize,
    /// This rank's staging rings (local).
    pub(super) send: Arc<Region>,
    pub(super) send_off: usize,
    pub(super) ctrl: Arc<Region>,
    pub(super) ctrl_off: usize,
    /// The peer's ring for this rank and channel, and its rkey.
    pub(super) remote_ring: u64,
    pub(super) rkey: u32,
    pub(super) liveness: Arc<Liveness>,
    pub(super) policy: WaitPolicy,
    pub(super) state: Mutex<ChanState>,
}

impl Drop for Channel {
    /// The last connector of the channel is gone: its last WRs leave and are acknowledged
    /// before the device closes (see [`Channel::settle`]).
    fn drop(&mut self) {
        self.settle();
    }
}

impl Channel {
    /// Waits, at most [`SETTLE`], until every WR of the channel has completed: drives the
    /// device (each poll a progress round with caller-driven progress) so that what is queued
    /// leaves, and an RC send completes when the peer acknowledged it. A rank that returns from
    /// its last operation may still hold a deferred credit for the slot it consumed last (it
    /// rides with the next post or poll, and there is none): sent only by the device's close,
    /// after the program began to exit, it raced the peer, whose final drain waits for it and
    /// saw the rank die first ("peer rank N died" at the end of a coll-perf run under load).
    /// Ends early on a failed channel or a peer process found dead.
    fn settle(&self) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let mut st = self.state();
            if self.poll(&mut st).is_err() || st.sq_outstanding == 0 || st.failure.is_some() {
                return;
            }
            drop(st);
            let now = Instant::now();
            if now >= deadline || !self.liveness.alive() {
                return;
            }
            // A failed wait leaves the next poll to find the reason.
            let _ = self.sleep_on_cq(SLEEP_SLICE.min(deadline - now));
        }
    }

    /// Sleeps at most `slice` on the channel's CQ (`Verbs::wait_cq`) and applies the
    /// completions it returns.
    fn sleep_on_cq(&self, slice: Duration) -> Result<(), DeviceError> {
        let wcs = self.hca.dev.wait_cq(self.cq, 1, slice)?;
        let mut st = self.state();
        for wc in &wcs {
            self.complete(&mut st, wc);
        }
        Ok(())
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ChanState> {
        lock(&self.state)
    }

    pub(super) fn landing_sge(&self) -> Sge {
        Sge {
            addr: self.ctrl.iova(self.ctrl_off + CTRL_LANDING),
            length: LANDING_BYTES,
            lkey: self.ctrl.mr.lkey(),
        }
    }

    /// Posts receive WRs until `recv_wrs` are posted.
    pub(super) fn replenish(&self, st: &mut ChanState) -> Result<(), TransportError> {
        let want = self.layout.recv_wrs();
        if st.recv_posted >= want || st.failure.is_some() {
            return Ok(());
        }
        let sge = [self.landing_sge()];
        let wr = RecvWr {
            wr_id: WR_RECV,
            sg_list: &sge,
        };
        let wrs = [wr; 16];
        while st.recv_posted < want {
            let n = ((want - st.recv_posted) as usize).min(wrs.len());
            match self.hca.dev.post_recv_list(self.qpn, &wrs[..n]) {
                Ok(()) => st.recv_posted += n as u32,
                Err((i, e)) => {
                    st.recv_posted += i as u32;
                    return Err(self.verbs_err("ibv_post_recv")(e));
                }
            }
        }
        Ok(())
    }

    pub(super) fn verbs_err(&self, op: &'static str) -> impl Fn(DeviceError) -> TransportError {
        Hca::verbs(op, Some(self.peer))
    }

    /// Takes what the CQ holds into the state; reposts the receive WRs it consumed.
    pub(super) fn poll(&self, st: &mut ChanState) -> Result<(), TransportError> {
        let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); POLL_BATCH];
        loop {
            let n = self
                .hca
                .dev
                .poll_cq(self.cq, &mut wcs)
                .map_err(self.verbs_err("ibv_poll_cq"))?;
            for wc in &wcs[..n] {
                self.complete(st, wc);
            }
            if n < wcs.len() {
                break;
            }
        }
        if st.recv_posted < self.layout.recv_wrs() - 4 {
            self.replenish(st)?;
        }
        Ok(())
    }

    pub(super) fn fail(st: &mut ChanState, f: Failure) {
        if st.failure.is_none() {
            st.failure = Some(f);
        }
    }

    /// Applies one completion.
    pub(super) fn complete(&self, st: &mut ChanState, wc: &WorkCompletion) {
        let kind = wc.wr_id & WR_KIND;
        if kind == WR_RECV {
            st.recv_posted = st.recv_posted.saturating_sub(1);
        } else {
            st.sq_outstanding = st.sq_outstanding.saturating_sub(1);
        }
        if kind == WR_DATA_USER {
            // Completed or flushed: either way the HCA no longer reads its memory.
            st.user_wrs = st.user_wrs.saturating_sub(1);
            self.hca.user_wrs.fetch_sub(1, Ordering::AcqRel);
        }
        if wc.status != WcStatus::Success {
            let wr = match kind {
                WR_DATA | WR_DATA_USER => "RDMA WRITE_WITH_IMM of a slot",
                WR_CREDIT => "SEND_WITH_IMM of a credit",
                WR_ABORT => "SEND of an abort",
                WR_PROBE => "RDMA WRITE probe",
                _ => "receive WR",
            };
            Self::fail(
                st,
                Failure::Wc {
                    status: wc.status,
                    wr,
                },
            );
            return;
        }
        st.last_progress = Instant::now();
        match kind {
            WR_DATA | WR_DATA_USER => st.data_done = st.data_done.wrapping_add(1),
            WR_PROBE => st.probe_outstanding = false,
            WR_CREDIT | WR_ABORT => {}
            _ => match (wc.opcode, wc.imm_data) {
                (WcOpcode::RecvRdmaWithImm, Some(imm)) => {
                    if st.arrivals.len() >= self.layout.nslots {
                        Self::fail(
                            st,
                            Failure::Protocol(format!(
                                "a write arrived with {} slots already full (credits overrun)",
                                st.arrivals.len()
                            )),
                        );
                    } else {
                        st.arrivals.push_back((imm, wc.byte_len));
                    }
                }
                (WcOpcode::Recv, Some(head)) => {
                    // A credit: the peer consumed `head` steps; it cannot exceed what we posted
                    // nor go back.
                    let ahead = st.posted.wrapping_sub(head);
                    let gained = head.wrapping_sub(st.credit);
                    if ahead > self.layout.nslots as u32 || gained > self.layout.nslots as u32 {
                        Self::fail(
                            st,
                            Failure::Protocol(format!(
                                "credit for step {head} after {} posted and {} credited",
                                st.posted, st.credit
                            )),
                        );
                    } else {
                        st.credit = head;
                    }
                }
                (WcOpcode::Recv, None) if wc.byte_len == 4 => {
                    let mut w = [0u8; 4];
                    // SAFETY: the landing buffer is 8 bytes inside the control region; the HCA
                    // wrote the SEND before this completion, which we read after taking the
                    // engine lock (poll_cq) that its write was made under.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            self.ctrl.ptr(self.ctrl_off + CTRL_LANDING),
                            w.as_mut_ptr(),
                            4,
                        )
                    };
                    match Abort::from_word(u32::from_le_bytes(w)) {
                        Some(a) => {
                            st.peer_abort.get_or_insert(a);
                        }
                        None => Self::fail(st, Failure::Protocol("an empty abort word".into())),
                    }
                }
                (op, imm) => Self::fail(
                    st,
                    Failure::Protocol(format!(
                        "unexpected receive completion {op:?} of {} bytes, immediate {imm:?}",
                        wc.byte_len
                    )),
                ),
            },
        }
    }

    /// The error for a peer whose QP stopped answering (its retries ran out): a peer process on
    /// this host that is stopped, not dead, says so; any other is reported as died (a peer on
    /// another host that stops answering cannot be told from a dead one).
    fn unreachable_peer(&self) -> TransportError {
        if self.liveness.alive() && self.liveness.stopped() {
            TransportError::PeerStopped {
                peer: self.peer,
                pid: self.pid,
            }
        } else {
            TransportError::PeerDied {
                peer: self.peer,
                pid: self.pid,
            }
        }
    }

    /// The error a failed channel reports, if it failed.
    pub(super) fn failed(&self, st: &ChanState) -> Option<TransportError> {
        if let Some(abort) = st.peer_abort {
            return Some(TransportError::PeerAborted {
                peer: self.peer,
                abort,
            });
        }
        match st.failure.as_ref()? {
            Failure::Wc {
                status: WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr,
                ..
            } => Some(self.unreachable_peer()),
            Failure::Wc { status, wr } => Some(TransportError::QpFailed {
                peer: self.peer,
                channel: self.channel,
                qpn: self.qpn,
                wr,
                status: *status,
            }),
            Failure::Protocol(what) => Some(TransportError::Protocol {
                peer: self.peer,
                channel: self.channel,
                what: what.clone(),
            }),
        }
    }

    /// Waits until `ready` gives a value: polls the CQ, spins and yields as the policy says, then
    /// sleeps on the CQ in slices, checking the peer between them (see the module docs).
    pub(super) fn wait<T>(
        &self,
        timeout: Duration,
        waiting_for: WaitFor,
        mut ready: impl FnMut(&mut ChanState) -> Option<T>,
    ) -> Result<T, TransportError> {
        let mut check = |st: &mut ChanState| -> Result<Option<T>, TransportError> {
            self.poll(st)?;
            if let Some(v) = ready(st) {
                return Ok(Some(v));
            }
            match self.failed(st) {
                Some(e) => Err(e),
                None => Ok(None),
            }
        };
        self.hca.activity.fetch_add(1, Ordering::Relaxed);
        let counts = self.hca.stats.counts(waiting_for);
        counts.waits.fetch_add(1, Ordering::Relaxed);
        // With caller-driven progress every poll is a progress round (a recvmmsg(2)): spin
        // fewer times than on a memory word.
        let spin = if self.hca.caller_driven {
            self.policy.spin / 64
        } else {
            self.policy.spin
        };
        for i in 0..spin + self.policy.yields {
            if let Some(v) = check(&mut self.state())? {
                if i == 0 {
                    counts.at_once.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(v);
            }
            counts.vain_polls.fetch_add(1, Ordering::Relaxed);
            if i < spin {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let start = Instant::now();
        let mut slept = false;
        loop {
            self.hca.activity.fetch_add(1, Ordering::Relaxed);
            if let Some(v) = check(&mut self.state())? {
                if !slept && spin + self.policy.yields == 0 {
                    counts.at_once.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(v);
            }
            counts.vain_polls.fetch_add(1, Ordering::Relaxed);
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(TransportError::Timeout {
                    peer: self.peer,
                    channel: self.channel,
                    waiting_for,
                    after_ms: elapsed.as_millis(),
                });
            }
            if !self.liveness.alive() {
                // Whatever it completed before dying still counts.
                if let Some(v) = check(&mut self.state())? {
                    return Ok(v);
                }
                return Err(TransportError::PeerDied {
                    peer: self.peer,
                    pid: self.pid,
                });
            }
            self.maybe_probe()?;
            if !slept {
                slept = true;
                counts.slept.fetch_add(1, Ordering::Relaxed);
            }
            counts.sleeps.fetch_add(1, Ordering::Relaxed);
            self.sleep_on_cq(SLEEP_SLICE.min(timeout - elapsed))
                .map_err(self.verbs_err("ibv_poll_cq"))?;
        }
    }

    /// Posts a zero-byte RDMA WRITE when nothing was heard for [`PROBE_AFTER`] and no WR is
    /// outstanding that would find a dead peer by itself.
    pub(super) fn maybe_probe(&self) -> Result<(), TransportError> {
        let mut st = self.state();
        // Outstanding WRs find a dead peer by themselves (and may fill the send queue).
        if st.probe_outstanding
            || st.failure.is_some()
            || st.sq_outstanding > 0
            || st.last_progress.elapsed() < PROBE_AFTER
        {
            return Ok(());
        }
        st.last_progress = Instant::now();
        st.probe_outstanding = true;
        self.post_send(
            &mut st,
            WR_PROBE,
            &[],
            SendOp::RdmaWrite {
                remote_addr: self.remote_ring,
                rkey: self.rkey,
            },
        )
    }

    /// Posts one signaled WR and counts it.
    pub(super) fn post_send(
        &self,
        st: &mut ChanState,
        wr_id: u64,
        sg_list: &[Sge],
        op: SendOp,
    ) -> Result<(), TransportError> {
        self.post_send_as(st, wr_id, sg_list, op, false)
    }

    /// [`Channel::post_send`]; `deferred`: the packets may wait for the device's next progress
    /// round ([`Verbs::post_send_deferred`](hca::verbs::Verbs::post_send_deferred)), which
    /// the rank's next post or wait runs (or, between operations, the keepalive thread).
    pub(super) fn post_send_as(
        &self,
        st: &mut ChanState,
        wr_id: u64,
        sg_list: &[Sge],
        op: SendOp,
        deferred: bool,
    ) -> Result<(), TransportError> {
        let wr = SendWr {
            wr_id,
            sg_list,
            op,
            send_flags: SendFlags::SIGNALED,
        };
        let posted = if deferred {
            self.hca.dev.post_send_deferred(self.qpn, &wr)
        } else {
            self.hca.dev.post_send(self.qpn, &wr)
        };
        match posted {
            Ok(()) => {
                st.sq_outstanding += 1;
                Ok(())
            }
            // A QP in the error state refuses new WRs: report why it failed.
            Err(e) => Err(self
                .failed(st)
                .unwrap_or_else(|| self.verbs_err("ibv_post_send")(e))),
        }
    }

    /// Waits (bounded) until the send queue has room for one more WR.
    pub(super) fn wait_sq(
        &self,
        timeout: Duration,
        waiting_for: WaitFor,
    ) -> Result<(), TransportError> {
        let depth = self.layout.send_wrs();
        self.wait(timeout, waiting_for, |st| {
            (st.sq_outstanding < depth).then_some(())
        })
    }

    /// Sends the abort word once per channel (either connector may ask first).
    pub(super) fn send_abort(&self, abort: Abort) {
        let mut st = self.state();
        if st.abort_sent {
            return;
        }
        st.abort_sent = true;
        if st.failure.is_some() || st.sq_outstanding >= self.layout.send_wrs() {
            // The QP is in error, or its send queue is full of WRs the peer does not answer:
            // the peer finds out from its own QP or its timeout.
            return;
        }
        let w = abort.to_word().to_le_bytes();
        // SAFETY: the outgoing abort word is 4 bytes inside this channel's control block; the HCA
        // reads it only for the SEND posted below, and it is written once (`abort_sent`).
        unsafe {
            core::ptr::copy_nonoverlapping(
                w.as_ptr(),
                self.ctrl.ptr(self.ctrl_off + CTRL_ABORT_OUT),
                4,
            )
        };
        let sge = [Sge {
            addr: self.ctrl.iova(self.ctrl_off + CTRL_ABORT_OUT),
            length: 4,
            lkey: self.ctrl.mr.lkey(),
        }];
        // Best effort: a failure to post means the QP already failed.
        let _ = self.post_send(&mut st, WR_ABORT, &sge, SendOp::Send);
    }

    /// Returns once no WR of this channel reads user memory: waits up to [`QUIESCE`] for them
    /// to complete, then cancels them by moving the QP to the error state (which flushes every
    /// WR: the HCA drops them and reads nothing more). The contract of `post_from` on abort.
    pub(super) fn quiesce(&self) {
        let deadline = Instant::now() + QUIESCE;
        loop {
            let mut st = self.state();
            let _ = self.poll(&mut st);
            if st.user_wrs == 0 {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            drop(st);
            // A failed wait leaves the next poll to find the reason.
            let _ = self.sleep_on_cq(SLEEP_SLICE.min(deadline - now));
        }
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        // Fails only on a closed device, whose close already flushed every QP.
        let _ = self.hca.dev.modify_qp(self.qpn, &attr, QpAttrMask::STATE);
        let mut st = self.state();
        let _ = self.poll(&mut st);
        Self::fail(
            &mut st,
            Failure::Wc {
                status: WcStatus::WrFlushErr,
                wr: "RDMA WRITE_WITH_IMM of a slot (cancelled by an abort)",
            },
        );
    }
}
