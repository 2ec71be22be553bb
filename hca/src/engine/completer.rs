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
use super::send_queue::{SendWqe, WqeState};
use super::transport::{Env, QpTransport};
use crate::verbs::wc::WcStatus;
use crate::verbs::wr::WrOpcode;

/// What retiring acknowledged WQEs found.
enum Retire {
    /// Done; `true` if PSNs were newly acknowledged.
    Progress(bool),
    /// An RDMA READ or atomic was covered by a plain acknowledgement: its response is lost.
    /// `true` if WQEs before it were retired (progress).
    ImplicitNak(bool),
}

/// What a response says, as [`CompState::CheckAck`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckKind {
    /// ACK: every PSN up to and including the packet's is acknowledged.
    Ack,
    /// RNR NAK with the responder's RNR timer (IBTA vol. 1 table 45), in nanoseconds.
    RnrNak { wait_ns: u64 },
    /// NAK PSN sequence error: the packet's PSN is the one the responder expects.
    SeqNak,
    /// Any other NAK, as the WC status the failed WQE completes with.
    Nak(WcStatus),
    /// RDMA READ response or ATOMIC ACKNOWLEDGE: data for the READ / atomic owning the PSN.
    Data,
}

/// The states of a response in the completer (rxe `enum comp_state`), in the order a response
/// goes through them; each has one function that returns the next.
///
/// rxe walks the send queue one WQE per pass (GET_WQE, CHECK_PSN, CHECK_ACK, WRITE_SEND,
/// COMP_ACK / COMP_WQE, back to GET_WQE); here [`CompState::CompAck`] retires every WQE a
/// cumulative acknowledgement covers in one pass, and [`CompState::GetWqe`] onwards handles the
/// one WQE a READ response or ATOMIC ACKNOWLEDGE is for. The local ACK timeout and the end of an
/// RNR wait are timers ([`QpTransport::on_timer`]), not packets, and do not enter this machine.
#[derive(Debug, Clone, Copy)]
enum CompState {
    /// The PSN is one sent and not yet acknowledged (rxe COMPST_CHECK_PSN).
    CheckPsn,
    /// What the response says: ACK, RNR NAK, NAK, or data (rxe COMPST_CHECK_ACK).
    CheckAck,
    /// Retire the WQEs the response acknowledges, explicitly or implicitly (rxe COMPST_COMP_ACK).
    CompAck(AckKind),
    /// The front WQE is the in-flight READ / atomic the response answers (rxe COMPST_GET_WQE).
    GetWqe,
    /// Place an RDMA READ response's payload (rxe COMPST_READ).
    Read(SendWqe),
    /// Place an ATOMIC ACKNOWLEDGE's original value (rxe COMPST_ATOMIC).
    Atomic(SendWqe),
    /// The front WQE got its whole response: complete it (rxe COMPST_COMP_WQE).
    CompWqe,
    /// Advance the oldest unacknowledged PSN past the response; reload the retry counters and
    /// restart the ACK timer (rxe COMPST_UPDATE_COMP).
    UpdateComp,
    /// Go-back-N from `from`, counted against `retry_cnt` unless `progress` (rxe
    /// COMPST_ERROR_RETRY).
    ErrorRetry { from: Psn, progress: bool },
    /// Wait the RNR NAK's timer, then go back to its PSN (rxe COMPST_RNR_RETRY).
    RnrRetry { wait_ns: u64 },
    /// The WQE owning the PSN (else the oldest in flight) fails with `status`; the QP enters ERR
    /// (rxe COMPST_ERROR; the retry states fail the oldest WQE themselves when their counter
    /// runs out).
    Error(WcStatus),
    /// Finished with the packet (rxe COMPST_DONE).
    Done,
    /// The packet is dropped and counted under the reason: without effect, or after the retry a
    /// response for a later request started.
    Drop(DropReason),
}

impl QpTransport {
    /// PSNs sent and not yet acknowledged.
    fn outstanding(&self) -> u32 {
        self.comp.psn.distance(self.req.sent_end)
    }

    /// Handles a response packet (ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ response) on an RC
    /// QP in RTS or SQD by running it through the completer's states (rxe `rxe_completer`).
    /// Returns the reason if it was dropped.
    pub(crate) fn on_response(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
    ) -> Result<(), DropReason> {
        let mut state = CompState::CheckPsn;
        // Every transition moves down the list of states (the retry and error states end in
        // Done), so a packet takes fewer than 16 steps.
        for _ in 0..16 {
            state = match state {
                CompState::CheckPsn => self.comp_check_psn(pkt),
                CompState::CheckAck => self.comp_check_ack(env, pkt),
                CompState::CompAck(kind) => self.comp_ack(env, pkt, kind),
                CompState::GetWqe => self.comp_get_wqe(pkt),
                CompState::Read(wqe) => self.comp_read(env, pkt, &wqe),
                CompState::Atomic(wqe) => self.comp_atomic(env, pkt, &wqe),
                CompState::CompWqe => {
                    self.finish_front(env);
                    CompState::UpdateComp
                }
                CompState::UpdateComp => {
                    self.comp.psn = pkt.psn.next();
                    self.on_progress(env);
                    CompState::Done
                }
                CompState::ErrorRetry { from, progress } => {
                    self.retry_counted(env, from, progress);
                    if pkt.info.operation == Operation::Acknowledge {
                        CompState::Done
                    } else {
                        // A response for a later request: the retry asks for the lost one
                        // again, and this one is not used.
                        CompState::Drop(DropReason::UnexpectedResponse)
                    }
                }
                CompState::RnrRetry { wait_ns } => {
                    self.on_rnr_nak(env, pkt.psn, wait_ns);
                    CompState::Done
                }
                CompState::Error(status) => {
                    self.fail_psn(env, pkt.psn, status);
                    CompState::Done
                }
                CompState::Done => return Ok(()),
                CompState::Drop(reason) => return Err(reason),
            };
        }
        Err(DropReason::UnexpectedResponse)
    }

    /// IBTA vol. 1 §9.7.5.2 (rxe `check_psn`): a response names a PSN sent and not yet
    /// acknowledged; a NAK PSN sequence error may name one past the last sent (a reordered
    /// duplicate made the responder NAK). Anything else (a stale duplicate, a response to nothing)
    /// is dropped without effect.
    fn comp_check_psn(&self, pkt: &RxPacket<'_>) -> CompState {
        let outstanding = self.outstanding();
        let window = match pkt.info.operation {
            Operation::Acknowledge => match pkt.ext.aeth {
                None => return CompState::Drop(DropReason::Length),
                Some(aeth) if aeth.syndrome == Syndrome::Nak(NakCode::PsnSequenceError) => {
                    outstanding + 1
                }
                Some(_) => outstanding,
            },
            Operation::RdmaReadResponse | Operation::AtomicAcknowledge => outstanding,
            _ => return CompState::Drop(DropReason::UnexpectedResponse),
        };
        if pkt.psn.in_window(self.comp.psn, window) {
            CompState::CheckAck
        } else {
            CompState::Drop(DropReason::UnexpectedResponse)
        }
    }

    /// What the response says (rxe `check_ack`), from the AETH syndrome (IBTA vol. 1 §9.3.5
    /// tables 42-43, §9.7.5.2): an ACK; an RNR NAK (§9.7.5.2.8); a NAK PSN sequence error; a NAK
    /// invalid request, remote access error or remote operational error (IBV_WC_REM_INV_REQ_ERR,
    /// REM_ACCESS_ERR, REM_OP_ERR; RD-only or reserved NAK codes are IBV_WC_BAD_RESP_ERR); a
    /// reserved syndrome is dropped. A READ response or ATOMIC ACKNOWLEDGE carrying an AETH must
    /// carry an ACK.
    fn comp_check_ack(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> CompState {
        let syndrome = pkt.ext.aeth.map(|a| a.syndrome);
        let kind = match pkt.info.operation {
            Operation::Acknowledge => match syndrome {
                Some(Syndrome::Ack { .. }) => AckKind::Ack,
                Some(Syndrome::RnrNak { timer }) => {
                    bump!(env.counters.rcvd_rnr_err);
                    AckKind::RnrNak {
                        wait_ns: u64::from(timer.to_micros()) * 1_000,
                    }
                }
                Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                    bump!(env.counters.rcvd_seq_err);
                    AckKind::SeqNak
                }
                Some(Syndrome::Nak(code)) => AckKind::Nak(match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    // RD-only or reserved codes: the responder spoke nonsense.
                    _ => WcStatus::BadRespErr,
                }),
                Some(Syndrome::Reserved(_)) => {
                    return CompState::Drop(DropReason::UnexpectedResponse)
                }
                None => return CompState::Drop(DropReason::Length),
            },
            _ => {
                if syndrome.is_some_and(|s| !s.is_ack()) {
                    return CompState::Drop(DropReason::UnexpectedResponse);
                }
                AckKind::Data
            }
        };
        CompState::CompAck(kind)
    }

    /// Retires the WQEs the response acknowledges (rxe `complete_ack` / `do_complete`; IBTA vol.
    /// 1 §9.7.5.2: ACKs are cumulative, and a response for PSN `p` implicitly acknowledges every
    /// request before `p` because responses come in order). An acknowledgement covering a READ or
    /// atomic whose response has not arrived is an implicit NAK (rxe `check_psn` returning
    /// COMPST_ERROR_RETRY): retransmit from it. A NAK other than a sequence error fails its WQE
    /// whatever the earlier ones found.
    fn comp_ack(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>, kind: AckKind) -> CompState {
        let psn = pkt.psn;
        let (upto, responding) = match kind {
            AckKind::Ack => (psn, None),
            AckKind::Data => (psn.wrapping_sub(1), Some(psn)),
            _ => (psn.wrapping_sub(1), None),
        };
        match (self.retire(env, upto, responding), kind) {
            // The NAK fails its WQE whatever came before it.
            (_, AckKind::Nak(status)) => CompState::Error(status),
            (Retire::ImplicitNak(progress), _) => CompState::ErrorRetry {
                from: self.comp.psn,
                progress,
            },
            (Retire::Progress(_), AckKind::Ack) => CompState::Done,
            (Retire::Progress(_), AckKind::RnrNak { wait_ns }) => CompState::RnrRetry { wait_ns },
            // Go-back-N from the PSN the responder expects, unless that is where the requester
            // already is (everything before it is acknowledged now).
            (Retire::Progress(progress), AckKind::SeqNak) => {
                if psn == self.req.sent_end {
                    CompState::Done
                } else {
                    CompState::ErrorRetry {
                        from: psn,
                        progress,
                    }
                }
            }
            (Retire::Progress(_), AckKind::Data) => CompState::GetWqe,
        }
    }

    /// The response is for the oldest unacknowledged PSN and the front WQE, in flight, owns it
    /// (rxe `get_wqe` / `check_psn`). A gap (an earlier response was lost) is dropped: the local
    /// ACK timeout resends from `comp.psn`, as rxe does.
    fn comp_get_wqe(&self, pkt: &RxPacket<'_>) -> CompState {
        let psn = pkt.psn;
        if psn != self.comp.psn {
            return CompState::Drop(DropReason::UnexpectedResponse);
        }
        let Some(front) = self.sq.front().copied() else {
            return CompState::Drop(DropReason::UnexpectedResponse);
        };
        if front.state != WqeState::InFlight || !front.owns(psn) {
            return CompState::Drop(DropReason::UnexpectedResponse);
        }
        if pkt.info.operation == Operation::AtomicAcknowledge {
            CompState::Atomic(front)
        } else {
            CompState::Read(front)
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

    /// Places an RDMA READ response packet for the READ at the front of the send queue (rxe
    /// `check_ack` / `do_read`): a response for another kind of WQE, of the wrong length or
    /// position, is IBV_WC_BAD_RESP_ERR; one that cannot be placed IBV_WC_LOC_PROT_ERR.
    fn comp_read(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>, front: &SendWqe) -> CompState {
        if !front.is_read_or_atomic() || front.opcode() != WrOpcode::RdmaRead {
            return CompState::Error(WcStatus::BadRespErr);
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
            return CompState::Error(WcStatus::BadRespErr);
        }
        if !pkt.payload.is_empty() {
            let sges = self.sq.sges(front);
            if env
                .mem
                .scatter(env.ctx.mrs(), self.pd, sges, offset, pkt.payload)
                .is_err()
            {
                // rxe: a READ response that cannot be placed is IBV_WC_LOC_PROT_ERR.
                return CompState::Error(WcStatus::LocProtErr);
            }
        }
        if last {
            CompState::CompWqe
        } else {
            if front.ends_read_request(psn) {
                // A segment of the READ is in (module `requester`): its request is no longer
                // outstanding.
                self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
            }
            CompState::UpdateComp
        }
    }

    /// Places an ATOMIC ACKNOWLEDGE for the atomic at the front of the send queue (rxe
    /// `check_ack` / `do_atomic`): the original remote value lands in the 8-byte local buffer, in
    /// host byte order (as verbs return it). An ATOMIC ACKNOWLEDGE for another kind of WQE is
    /// IBV_WC_BAD_RESP_ERR; one that cannot be placed IBV_WC_LOC_PROT_ERR.
    fn comp_atomic(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>, front: &SendWqe) -> CompState {
        let is_atomic = matches!(
            front.opcode(),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        );
        let Some(ack) = pkt.ext.atomic_ack_eth.filter(|_| is_atomic) else {
            return CompState::Error(WcStatus::BadRespErr);
        };
        let bytes = ack.orig_remote_data.to_ne_bytes();
        let sges = self.sq.sges(front);
        if env
            .mem
            .scatter(env.ctx.mrs(), self.pd, sges, 0, &bytes)
            .is_err()
        {
            return CompState::Error(WcStatus::LocProtErr);
        }
        CompState::CompWqe
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
