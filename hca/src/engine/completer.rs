//! The completer: acknowledgements, responses and retransmission (rxe `rxe_comp.c`).
//!
//! An RC requester learns what the responder did from response packets (IBTA vol. 1 §9.7.5.2,
//! §9.9):
//! * an **ACK** with PSN `p` acknowledges every request up to and including `p` (ACKs are
//!   cumulative and may be coalesced); the completer retires SEND and RDMA WRITE WQEs covered;
//! * an **RDMA READ response** or **ATOMIC ACKNOWLEDGE** completes its READ / atomic WQE and,
//!   because responses are returned in order, implicitly acknowledges every earlier request;
//! * an ACK covering a READ or atomic whose response has not arrived means that response was lost
//!   (an *implicit NAK*): the completer retransmits from it;
//! * a **NAK PSN sequence error** names the PSN the responder expects: go-back-N from there;
//! * an **RNR NAK**: the responder had no receive WQE; wait the NAK's RNR timer (table 45), then
//!   go back to that PSN; `rnr_retry` such waits are allowed in a row (7 = no limit);
//! * any other **NAK** (invalid request, remote access error, remote operational error) fails the
//!   WQE with IBV_WC_REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR and the QP enters ERR;
//! * the **local ACK timeout** (4.096 us x 2^timeout, 0 = infinite) fires when requests stay
//!   unacknowledged: go-back-N from the oldest unacknowledged PSN; `retry_cnt` such retries are
//!   allowed in a row before IBV_WC_RETRY_EXC_ERR.
//!
//! Retry counters count retries without progress: any PSN newly acknowledged reloads them (rxe
//! reloads on ACKs; here a sequence NAK that acknowledges earlier PSNs counts as progress too).
//! A failed WQE completes with its status and every later one with IBV_WC_WR_FLUSH_ERR.

use roce::aeth::{NakCode, Syndrome};
use roce::opcode::{Operation, Position};
use roce::Psn;

use super::counters::{bump, DropReason};
use super::recv::RxPacket;
use super::send_queue::WqeState;
use super::transport::{Env, QpTransport};
use crate::verbs::wc::WcStatus;

/// What retiring acknowledged WQEs found.
enum Retire {
    /// Done; `true` if PSNs were newly acknowledged.
    Progress(bool),
    /// An RDMA READ or atomic was covered by a plain acknowledgement: its response is lost.
    /// `true` if WQEs before it were retired (progress).
    ImplicitNak(bool),
}

impl QpTransport {
    /// PSNs sent and not yet acknowledged.
    fn outstanding(&self) -> u32 {
        self.comp.psn.distance(self.req.sent_end)
    }

    /// Handles a response packet (ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ response) on an RC
    /// QP in RTS or SQD. Returns the reason if it was dropped.
    pub(crate) fn on_response(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
    ) -> Result<(), DropReason> {
        let psn = pkt.psn;
        let outstanding = self.outstanding();
        match pkt.info.operation {
            Operation::Acknowledge => {
                let aeth = pkt.ext.aeth.ok_or(DropReason::Length)?;
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        if !psn.in_window(self.comp.psn, outstanding) {
                            return Err(DropReason::UnexpectedResponse);
                        }
                        self.retire_or_retry(env, psn);
                    }
                    Syndrome::RnrNak { timer } => {
                        if !psn.in_window(self.comp.psn, outstanding) {
                            return Err(DropReason::UnexpectedResponse);
                        }
                        bump!(env.counters.rcvd_rnr_err);
                        if !self.retire_or_retry(env, psn.wrapping_sub(1)) {
                            return Ok(());
                        }
                        self.on_rnr_nak(env, psn, u64::from(timer.to_micros()) * 1_000);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        // The NAK names the PSN the responder expects; it may be one past the
                        // last sent (a reordered duplicate made the responder NAK).
                        if !psn.in_window(self.comp.psn, outstanding + 1) {
                            return Err(DropReason::UnexpectedResponse);
                        }
                        bump!(env.counters.rcvd_seq_err);
                        let progress = match self.retire(env, psn.wrapping_sub(1), None) {
                            Retire::Progress(p) => p,
                            Retire::ImplicitNak(p) => {
                                self.retry_counted(env, self.comp.psn, p);
                                return Ok(());
                            }
                        };
                        if psn != self.req.sent_end {
                            self.retry_counted(env, psn, progress);
                        }
                    }
                    Syndrome::Nak(code) => {
                        if !psn.in_window(self.comp.psn, outstanding) {
                            return Err(DropReason::UnexpectedResponse);
                        }
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            // RD-only or reserved codes: the responder spoke nonsense.
                            _ => WcStatus::BadRespErr,
                        };
                        let _ = self.retire(env, psn.wrapping_sub(1), None);
                        self.fail_psn(env, psn, status);
                    }
                    Syndrome::Reserved(_) => return Err(DropReason::UnexpectedResponse),
                }
                Ok(())
            }
            Operation::RdmaReadResponse | Operation::AtomicAcknowledge => {
                if !psn.in_window(self.comp.psn, outstanding) {
                    return Err(DropReason::UnexpectedResponse);
                }
                if let Some(aeth) = pkt.ext.aeth {
                    if !aeth.syndrome.is_ack() {
                        return Err(DropReason::UnexpectedResponse);
                    }
                }
                // Responses come in PSN order: one for `psn` acknowledges everything before it.
                match self.retire(env, psn.wrapping_sub(1), Some(psn)) {
                    Retire::Progress(_) => {}
                    Retire::ImplicitNak(p) => {
                        self.retry_counted(env, self.comp.psn, p);
                        return Err(DropReason::UnexpectedResponse);
                    }
                }
                if psn != self.comp.psn {
                    // A gap (an earlier response was lost): the local ACK timeout will resend
                    // from `comp.psn`, as rxe does.
                    return Err(DropReason::UnexpectedResponse);
                }
                let Some(front) = self.sq.front().copied() else {
                    return Err(DropReason::UnexpectedResponse);
                };
                if front.state != WqeState::InFlight || !front.owns(psn) {
                    return Err(DropReason::UnexpectedResponse);
                }
                if pkt.info.operation == Operation::AtomicAcknowledge {
                    self.atomic_response(env, pkt, &front)
                } else {
                    self.read_response(env, pkt, &front)
                }
            }
            _ => Err(DropReason::UnexpectedResponse),
        }
    }

    /// An ACK-type acknowledgement of `upto`: retires what it covers, or retransmits if it
    /// reveals a lost READ / atomic response. Returns false if the latter happened.
    fn retire_or_retry(&mut self, env: &mut Env<'_>, upto: Psn) -> bool {
        match self.retire(env, upto, None) {
            Retire::Progress(_) => true,
            Retire::ImplicitNak(progress) => {
                self.retry_counted(env, self.comp.psn, progress);
                false
            }
        }
    }

    /// Retires the WQEs fully acknowledged by PSN `upto` (inclusive), stopping at the WQE that
    /// owns `responding` (the READ or atomic a response is for).
    fn retire(&mut self, env: &mut Env<'_>, upto: Psn, responding: Option<Psn>) -> Retire {
        if upto.is_before(self.comp.psn) {
            return Retire::Progress(false);
        }
        let mut progress = false;
        // Each pass retires one WQE or stops: bounded by the queue.
        for _ in 0..=self.sq.len() {
            let Some(front) = self.sq.front().copied() else {
                break;
            };
            match front.state {
                WqeState::Done(_) => {
                    self.complete_front(env);
                    continue;
                }
                WqeState::Posted => break,
                WqeState::InFlight => {}
            }
            if front.first_psn.is_after(upto) || responding.is_some_and(|p| front.owns(p)) {
                break;
            }
            if front.is_read_or_atomic() {
                if progress {
                    self.on_progress(env);
                }
                return Retire::ImplicitNak(progress);
            }
            if !front.last_psn.is_after(upto) {
                self.comp.psn = front.last_psn.next();
                if let Some(w) = self.sq.get_mut(0) {
                    w.state = WqeState::Done(WcStatus::Success);
                }
                self.complete_front(env);
                progress = true;
            } else {
                if self.comp.psn.is_before(upto.next()) {
                    self.comp.psn = upto.next();
                    progress = true;
                }
                break;
            }
        }
        if progress {
            self.on_progress(env);
        }
        Retire::Progress(progress)
    }

    /// Newly acknowledged PSNs: reload the retry counters and restart the ACK timer.
    fn on_progress(&mut self, env: &mut Env<'_>) {
        self.comp.retried_from = None;
        if let Some(qp) = env.ctx.qp(self.qpn) {
            let attr = qp.attr();
            self.comp.retry_left = attr.retry_cnt;
            self.comp.rnr_left = attr.rnr_retry;
            self.comp.retrans_at = if self.outstanding() > 0 {
                attr.local_ack_timeout_ns()
                    .map(|ns| env.now.saturating_add_nanos(ns))
            } else {
                None
            };
        }
    }

    /// The RDMA READ response packet `pkt` for the READ at the front of the send queue.
    fn read_response(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
        front: &super::send_queue::SendWqe,
    ) -> Result<(), DropReason> {
        if !front.is_read_or_atomic() || front.opcode() != crate::verbs::wr::WrOpcode::RdmaRead {
            self.fail_front(env, WcStatus::BadRespErr);
            return Ok(());
        }
        let psn = pkt.psn;
        let pmtu = u64::from(self.pmtu.max(1));
        let index = front.first_psn.distance(psn);
        let offset = u64::from(index) * pmtu;
        let expected = u64::from(front.length).saturating_sub(offset).min(pmtu);
        let last = psn == front.last_psn;
        // IBTA vol. 1 §9.7.5.2.7: FIRST / MIDDLE carry one PMTU, LAST / ONLY end a READ request:
        // the WQE's, or one of its segments (module `requester`). A retried READ restarts the
        // response at FIRST or ONLY, so those may appear mid-way.
        let position_ok = match pkt.info.position {
            Position::Last | Position::Only => front.ends_read_request(psn),
            Position::First | Position::Middle => !front.ends_read_request(psn),
        };
        if pkt.payload.len() as u64 != expected || !position_ok {
            self.fail_front(env, WcStatus::BadRespErr);
            return Ok(());
        }
        if !pkt.payload.is_empty() {
            let sges = self.sq.sges(front);
            if env
                .mem
                .scatter(env.ctx.mrs(), self.pd, sges, offset, pkt.payload)
                .is_err()
            {
                // rxe: a READ response that cannot be placed is IBV_WC_LOC_PROT_ERR.
                self.fail_front(env, WcStatus::LocProtErr);
                return Ok(());
            }
        }
        self.comp.psn = psn.next();
        if last {
            self.finish_front(env);
        } else if front.ends_read_request(psn) {
            // A segment of the READ is in (module `requester`): its request is no longer
            // outstanding.
            self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
        }
        self.on_progress(env);
        Ok(())
    }

    /// The ATOMIC ACKNOWLEDGE `pkt` for the atomic at the front of the send queue: the original
    /// remote value lands in the 8-byte local buffer, in host byte order (as verbs return it).
    fn atomic_response(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
        front: &super::send_queue::SendWqe,
    ) -> Result<(), DropReason> {
        let is_atomic = matches!(
            front.opcode(),
            crate::verbs::wr::WrOpcode::AtomicCmpAndSwp
                | crate::verbs::wr::WrOpcode::AtomicFetchAndAdd
        );
        let Some(ack) = pkt.ext.atomic_ack_eth.filter(|_| is_atomic) else {
            self.fail_front(env, WcStatus::BadRespErr);
            return Ok(());
        };
        let bytes = ack.orig_remote_data.to_ne_bytes();
        let sges = self.sq.sges(front);
        if env
            .mem
            .scatter(env.ctx.mrs(), self.pd, sges, 0, &bytes)
            .is_err()
        {
            self.fail_front(env, WcStatus::LocProtErr);
            return Ok(());
        }
        self.comp.psn = pkt.psn.next();
        self.finish_front(env);
        self.on_progress(env);
        Ok(())
    }

    /// The front WQE (a READ or atomic) got its whole response.
    fn finish_front(&mut self, env: &mut Env<'_>) {
        if let Some(w) = self.sq.get_mut(0) {
            w.state = WqeState::Done(WcStatus::Success);
        }
        self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
        self.complete_front(env);
    }

    /// Fails the oldest outstanding WQE with `status`; the QP enters ERR.
    fn fail_front(&mut self, env: &mut Env<'_>, status: WcStatus) {
        let index = (0..self.sq.len())
            .find(|&i| {
                self.sq
                    .get(i)
                    .is_some_and(|w| w.state == WqeState::InFlight)
            })
            .unwrap_or(0);
        self.send_failed(env, index, status);
    }

    /// Fails the WQE that owns `psn` (else the oldest outstanding one) with `status`.
    fn fail_psn(&mut self, env: &mut Env<'_>, psn: Psn, status: WcStatus) {
        match (0..self.sq.len()).find(|&i| {
            self.sq
                .get(i)
                .is_some_and(|w| w.state == WqeState::InFlight && w.owns(psn))
        }) {
            Some(i) => self.send_failed(env, i, status),
            None => self.fail_front(env, status),
        }
    }

    /// An RNR NAK for `psn`: wait `wait_ns` (the NAK's timer, IBTA vol. 1 table 45), then go
    /// back to `psn`.
    fn on_rnr_nak(&mut self, env: &mut Env<'_>, psn: Psn, wait_ns: u64) {
        let Some(rnr_retry) = env.ctx.qp(self.qpn).map(|q| q.attr().rnr_retry) else {
            return;
        };
        if self.comp.rnr_until.is_some() && self.comp.rnr_psn == psn {
            // A duplicate of the RNR NAK this wait is for.
            return;
        }
        // IBTA vol. 1 §9.7.5.2.8: rnr_retry 7 means retry forever.
        if rnr_retry != crate::verbs::qp::MAX_RETRY {
            if self.comp.rnr_left == 0 {
                bump!(env.counters.retry_rnr_exceeded_err);
                self.fail_front(env, WcStatus::RnrRetryExcErr);
                return;
            }
            self.comp.rnr_left -= 1;
        }
        self.comp.rnr_until = Some(env.now.saturating_add_nanos(wait_ns));
        self.comp.rnr_psn = psn;
        self.comp.retrans_at = None;
    }

    /// A retransmission that consumes a transport retry unless `progress` was just made. A
    /// response that asks again for the retry already under way from the same PSN (responses to
    /// requests sent before the retry keep arriving) is ignored: only the local ACK timeout
    /// repeats a retry without progress (rxe likewise starts one retry at a time).
    fn retry_counted(&mut self, env: &mut Env<'_>, from: Psn, progress: bool) {
        // During an RNR wait the requester resends from the NAKed PSN when the wait ends; NAKs
        // for packets sent before the wait change nothing.
        if self.comp.rnr_until.is_some() {
            return;
        }
        if !progress && self.comp.retried_from == Some(from) {
            return;
        }
        self.retry_now(env, from, progress);
    }

    fn retry_now(&mut self, env: &mut Env<'_>, from: Psn, progress: bool) {
        if !progress {
            if self.comp.retry_left == 0 {
                bump!(env.counters.retry_exceeded_err);
                self.fail_front(env, WcStatus::RetryExcErr);
                return;
            }
            self.comp.retry_left -= 1;
        }
        self.retry(env, from);
    }

    /// Go-back-N: the requester resends from PSN `from` (and every WQE after it).
    pub(crate) fn retry(&mut self, env: &mut Env<'_>, from: Psn) {
        bump!(env.counters.completer_retry_err);
        let mut found: Option<usize> = None;
        for i in 0..self.sq.len() {
            let Some(w) = self.sq.get_mut(i) else {
                break;
            };
            if w.state != WqeState::InFlight {
                continue;
            }
            if found.is_none() && w.owns(from) {
                w.next_psn = from;
                found = Some(i);
            } else if found.is_some() || w.first_psn.is_after(from) {
                w.next_psn = w.first_psn;
                found.get_or_insert(i);
            }
        }
        if let Some(i) = found {
            self.req.next = self.req.next.min(i);
        }
        self.req.noack_pkts = 0;
        self.comp.retrans_at = None;
        self.comp.retried_from = Some(from);
    }

    /// Timers: the local ACK timeout and the end of an RNR wait.
    pub(crate) fn on_timer(&mut self, env: &mut Env<'_>) {
        let now = env.now;
        // A held ACK's wait is over: it goes at the next transmit (`EngineConfig::ack_delay`).
        if self.resp.ack_due.is_some_and(|t| t <= now) {
            self.resp.ack_due = None;
        }
        if self.comp.rnr_until.is_some_and(|t| t <= now) {
            self.comp.rnr_until = None;
            let psn = self.comp.rnr_psn;
            self.retry(env, psn);
        }
        if self.comp.retrans_at.is_some_and(|t| t <= now) {
            self.comp.retrans_at = None;
            if self.outstanding() > 0 && self.has_in_flight() {
                self.retry_now(env, self.comp.psn, false);
            }
        }
    }
}
