//! Per-QP transport state, shared by the requester, the responder and the completer, and the
//! transitions the engine drives itself: completing WQEs in order, the error state, flushing.
//!
//! Like rxe (`struct rxe_qp`: `req`, `resp`, `comp`), each QP carries three state machines:
//! * the **requester** ([`Requester`], `requester.rs`) turns send WQEs into request packets;
//! * the **completer** ([`Completer`], `completer.rs`) matches ACKs, NAKs and responses against
//!   the send queue, retires WQEs, and retransmits (go-back-N) on timeouts and NAKs;
//! * the **responder** ([`Responder`], `responder.rs`) executes incoming requests and queues the
//!   ACKs, NAKs, RDMA READ responses and atomic ACKs it owes the peer.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use roce::aeth::Syndrome;
use roce::{Opcode, Psn};

use super::counters::{bump, Counters};
use super::diag::{DiagKind, DiagLog, DiagRecord};
use super::memory::MrMemory;
use super::net::Route;
use super::send_queue::{SendQueue, WqeState};
use super::time::Instant;
use super::EngineConfig;
use crate::verbs::context::Context;
use crate::verbs::cq::CqHandle;
use crate::verbs::event::{AsyncEventType, EventElement};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{QpState, QpType};
use crate::verbs::srq::SrqHandle;
use crate::verbs::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::verbs::wr::Sge;

/// Everything a state machine may touch besides its own QP.
pub(crate) struct Env<'a> {
    pub(crate) ctx: &'a mut Context,
    pub(crate) mem: &'a MrMemory,
    pub(crate) counters: &'a mut Counters,
    pub(crate) diag: &'a mut DiagLog,
    pub(crate) config: &'a EngineConfig,
    pub(crate) cq_events: &'a mut VecDeque<CqHandle>,
    pub(crate) now: Instant,
}

impl Env<'_> {
    /// The QP's current state in the object model (RESET if it vanished).
    pub(crate) fn state(&self, qpn: u32) -> QpState {
        self.ctx.qp(qpn).map_or(QpState::Reset, |q| q.state())
    }

    /// Queues a completion. Returns false if the CQ overran (the CQ is then in error, an
    /// `IBV_EVENT_CQ_ERR` is recorded, and the completion is counted in `cq_overrun_lost`).
    pub(crate) fn push_wc(&mut self, cq: CqHandle, wc: WorkCompletion, solicited: bool) -> bool {
        match self.ctx.push_completion(cq, wc, solicited) {
            Ok(fire) => {
                if fire && self.cq_events.len() < super::MAX_PENDING_CQ_EVENTS {
                    self.cq_events.push_back(cq);
                }
                true
            }
            Err(_) => {
                bump!(self.counters.cq_overrun_lost);
                false
            }
        }
    }
}

/// A receive WQE being filled by an incoming message (copied out of the RQ or SRQ when the
/// message's first packet arrived, as rxe copies SRQ WQEs; the SGE vector is reused).
#[derive(Debug, Default)]
pub(crate) struct RecvCursor {
    pub(crate) active: bool,
    pub(crate) wr_id: u64,
    pub(crate) sges: Vec<Sge>,
    /// Buffer length, bytes.
    pub(crate) length: u64,
    /// Bytes placed so far.
    pub(crate) offset: u64,
}

/// The RDMA WRITE in progress at the responder (from the RETH of its FIRST or ONLY packet).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WriteCursor {
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    /// Bytes still expected.
    pub(crate) resid: u32,
    /// The RETH DMA length (the byte_len of a WRITE with immediate).
    pub(crate) length: u32,
}

/// What a saved responder resource remembers (IBTA vol. 1 §9.7.5.1.3: a responder keeps
/// `max_dest_rd_atomic` of them to answer duplicate RDMA READ and atomic requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    /// An RDMA READ: the original request.
    Read { va: u64, length: u32, rkey: u32 },
    /// An atomic: the value it returned (duplicates get it again, never re-execute).
    Atomic { orig: u64 },
}

/// One responder resource.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resource {
    pub(crate) kind: ResourceKind,
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    pub(crate) msn: u32,
    /// The slot holds a resource (empty slots match no PSN).
    pub(crate) valid: bool,
    /// A response stream for it is queued (the slot must not be recycled yet).
    pub(crate) pending: bool,
}

/// A response the responder owes, in PSN order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RespOut {
    /// ACKNOWLEDGE: an ACK, RNR NAK or NAK (AETH syndrome) for `psn`.
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// RDMA READ response packets from `psn` on; `first` is where this stream (original or
    /// replay) started, which decides FIRST/MIDDLE/LAST/ONLY.
    Read {
        slot: usize,
        first: Psn,
        psn: Psn,
        va: u64,
        resid: u32,
        rkey: u32,
        msn: u32,
    },
    /// ATOMIC ACKNOWLEDGE with the original value of the atomic saved in resource `slot`.
    Atomic {
        slot: usize,
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// Requester state (rxe `qp->req`).
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// The next PSN to assign to a WQE.
    pub(crate) psn: Psn,
    /// One past the highest PSN transmitted so far.
    pub(crate) sent_end: Psn,
    /// Index in the send queue of the WQE being transmitted (or the next to start).
    pub(crate) next: usize,
    /// Packets sent without AckReq since the last one that had it.
    pub(crate) noack_pkts: u32,
    /// Started RDMA READ / atomic WQEs not yet completed (bounded by `max_rd_atomic`).
    pub(crate) rd_atomic: u32,
}

/// Completer state (rxe `qp->comp`).
#[derive(Debug, Default)]
pub(crate) struct Completer {
    /// The oldest PSN not yet acknowledged.
    pub(crate) psn: Psn,
    /// Transport retries left before RETRY_EXC_ERR (reloaded from `retry_cnt` on progress).
    pub(crate) retry_left: u8,
    /// RNR retries left before RNR_RETRY_EXC_ERR (`rnr_retry` 7 = never runs out).
    pub(crate) rnr_left: u8,
    /// Local ACK timeout deadline, while requests are outstanding.
    pub(crate) retrans_at: Option<Instant>,
    /// End of the RNR wait; the requester sends nothing before it.
    pub(crate) rnr_until: Option<Instant>,
    /// Where to resume after the RNR wait.
    pub(crate) rnr_psn: Psn,
    /// The PSN the retry under way started from (cleared by progress).
    pub(crate) retried_from: Option<Psn>,
}

/// Responder state (rxe `qp->resp`).
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// The PSN expected next.
    pub(crate) psn: Psn,
    /// One past the PSN of the last SEND / WRITE / atomic executed: a duplicate SEND or WRITE is
    /// acknowledged with `ack_psn - 1`, never with the PSN of an RDMA READ (whose response is
    /// its acknowledgement and may be lost).
    pub(crate) ack_psn: Psn,
    /// Message sequence number, 24 bits.
    pub(crate) msn: u32,
    /// Opcode of the last packet of the message in progress; `None` between messages.
    pub(crate) last_opcode: Option<Opcode>,
    /// A PSN sequence error NAK was sent for the current gap (one per gap, rxe `sent_psn_nak`).
    pub(crate) sent_psn_nak: bool,
    /// UC: the current message is being dropped until the next FIRST / ONLY.
    pub(crate) drop_msg: bool,
    pub(crate) recv: RecvCursor,
    pub(crate) write: WriteCursor,
    pub(crate) resources: Vec<Resource>,
    /// The slot the next new READ / atomic takes (oldest first).
    pub(crate) res_head: usize,
    pub(crate) out: VecDeque<RespOut>,
    /// When the plain ACK at the front of `out` must go even if no request packet of the QP
    /// left first ([`super::EngineConfig::ack_delay`]); `None` without a delay.
    pub(crate) ack_due: Option<Instant>,
}

impl Responder {
    /// Most queued responses: every responder resource's stream, an ACK between each two, and a
    /// few more (NAKs).
    pub(crate) fn out_capacity(&self) -> usize {
        2 * self.resources.len() + 8
    }

    /// Resets the resources to `n` empty slots (at least 1).
    pub(crate) fn set_resources(&mut self, n: u8) {
        self.resources.clear();
        self.resources.resize(
            usize::from(n.max(1)),
            Resource {
                kind: ResourceKind::Atomic { orig: 0 },
                first_psn: Psn::ZERO,
                last_psn: Psn::ZERO,
                msn: 0,
                valid: false,
                pending: false,
            },
        );
        self.res_head = 0;
        self.out
            .retain(|o| !matches!(o, RespOut::Read { .. } | RespOut::Atomic { .. }));
    }
}

/// The transport state of one QP.
#[derive(Debug)]
pub(crate) struct QpTransport {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdHandle,
    pub(crate) send_cq: CqHandle,
    pub(crate) recv_cq: CqHandle,
    pub(crate) srq: Option<SrqHandle>,
    pub(crate) sq: SendQueue,
    pub(crate) req: Requester,
    pub(crate) comp: Completer,
    pub(crate) resp: Responder,
    /// Path MTU in bytes (RC/UC: the QP's; UD: the port's active MTU).
    pub(crate) pmtu: u32,
    /// The P_Key the QP sends and accepts.
    pub(crate) pkey: u16,
    /// Where RC/UC packets go (from the address vector given at RTR).
    pub(crate) route: Option<Route>,
    /// Queued on the engine's ready list.
    pub(crate) in_ready: bool,
    /// The deadline this QP has registered in the engine's timer heap.
    pub(crate) timer_key: Option<Instant>,
    /// Whose turn it is to transmit: responder (true) or requester.
    pub(crate) resp_turn: bool,
    /// A plain ACK at the front of the responses already let one request packet go first
    /// (see `SoftHca::transmit`); it goes next.
    pub(crate) ack_yielded: bool,
    /// `IBV_EVENT_COMM_EST` was raised (first packet received in RTR).
    pub(crate) comm_est: bool,
    /// When the last CNP for this QP was queued.
    pub(crate) last_cnp: Option<Instant>,
    /// A completion of this QP found its CQ overrun; the engine moves the QP to ERR.
    pub(crate) cq_overrun: bool,
    /// DCQCN's reaction point: paces the requester after CNPs (`None`: congestion control off).
    pub(crate) rp: Option<super::dcqcn::ReactionPoint>,
}

impl QpTransport {
    pub(crate) fn new(
        qpn: u32,
        qp_type: QpType,
        pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        srq: Option<SrqHandle>,
    ) -> Self {
        let mut resp = Responder::default();
        resp.set_resources(1);
        QpTransport {
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            srq,
            sq: SendQueue::default(),
            req: Requester::default(),
            comp: Completer::default(),
            resp,
            pmtu: 256,
            pkey: crate::verbs::device::DEFAULT_PKEY,
            route: None,
            in_ready: false,
            timer_key: None,
            resp_turn: false,
            ack_yielded: false,
            comm_est: false,
            last_cnp: None,
            cq_overrun: false,
            rp: None,
        }
    }

    /// Forgets all transport state: RESET (IBTA vol. 1 §10.3.1: WRs are discarded without
    /// completions).
    pub(crate) fn reset(&mut self) {
        self.sq.clear();
        self.req = Requester::default();
        self.comp = Completer::default();
        let mut resp = Responder::default();
        resp.recv.sges = core::mem::take(&mut self.resp.recv.sges);
        resp.recv.sges.clear();
        self.resp = resp;
        self.resp.set_resources(1);
        self.route = None;
        self.comm_est = false;
        self.last_cnp = None;
        if let Some(rp) = self.rp.as_mut() {
            *rp = super::dcqcn::ReactionPoint::new(*rp.params());
        }
    }

    /// The earliest deadline of the QP's timers.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let timers = match (self.comp.retrans_at, self.comp.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ack = self.resp.ack_due.filter(|_| !self.resp.out.is_empty());
        let mut next = match (timers, ack) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(rp) = self.rp.as_ref() {
            // DCQCN: the alpha and rate-increase timers, and the pacing time of a requester
            // with work.
            let pace = rp
                .pacing_deadline()
                .filter(|_| self.req.next < self.sq.len());
            for d in [rp.poll_timeout(), pace].into_iter().flatten() {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        next
    }

    /// Whether the QP may have something to transmit at `now` (checked precisely when polled).
    pub(crate) fn may_transmit(&self, now: Instant) -> bool {
        (!self.resp.out.is_empty() && !self.ack_held(now))
            || (self.req.next < self.sq.len()
                && self.comp.rnr_until.is_none()
                && self
                    .rp
                    .as_ref()
                    .is_none_or(|rp| rp.next_send(now).is_none()))
    }

    /// Whether the only queued response is a plain ACK that may still wait at `now` for a
    /// request packet of this QP to go first ([`super::EngineConfig::ack_delay`]).
    pub(crate) fn ack_held(&self, now: Instant) -> bool {
        !self.ack_yielded
            && self.resp.out.len() == 1
            && self.resp.ack_due.is_some_and(|due| now < due)
            && self.front_is_plain_ack()
    }

    /// Whether a request WQE is on the wire (started and not completed).
    pub(crate) fn has_in_flight(&self) -> bool {
        (0..self.sq.len()).any(|i| {
            self.sq
                .get(i)
                .is_some_and(|w| w.state == WqeState::InFlight)
        })
    }

    /// Completes the WQEs at the front of the send queue that are done, in order (IBTA vol. 1
    /// §10.8: send completions are returned in posting order). Successful unsignaled WQEs leave
    /// no completion. Returns false (and notes it in `cq_overrun`) if the CQ overran.
    pub(crate) fn complete_front(&mut self, env: &mut Env<'_>) -> bool {
        let mut ok = true;
        while let Some(front) = self.sq.front() {
            let WqeState::Done(status) = front.state else {
                break;
            };
            let Some(wqe) = self.sq.pop_front() else {
                break;
            };
            self.req.next = self.req.next.saturating_sub(1);
            let opcode = WcOpcode::from_wr(wqe.opcode());
            if status == WcStatus::Success {
                bump!(env.counters.rdma_sends);
                if wqe.signaled {
                    let byte_len = match wqe.opcode() {
                        crate::verbs::wr::WrOpcode::AtomicCmpAndSwp
                        | crate::verbs::wr::WrOpcode::AtomicFetchAndAdd => 8,
                        crate::verbs::wr::WrOpcode::LocalInv => 0,
                        _ => wqe.length,
                    };
                    let wc = WorkCompletion::success(wqe.wr_id, opcode, self.qpn, byte_len);
                    ok &= env.push_wc(self.send_cq, wc, false);
                }
            } else {
                let wc = WorkCompletion::error(wqe.wr_id, status, opcode, self.qpn);
                ok &= env.push_wc(self.send_cq, wc, true);
            }
        }
        if !ok {
            self.cq_overrun = true;
        }
        ok
    }

    /// Completes the receive WQE being filled, if any, with `status` (an error or flush).
    pub(crate) fn fail_recv_cursor(&mut self, env: &mut Env<'_>, status: WcStatus) {
        if self.resp.recv.active {
            self.resp.recv.active = false;
            let wc = WorkCompletion::error(self.resp.recv.wr_id, status, WcOpcode::Recv, self.qpn);
            env.push_wc(self.recv_cq, wc, true);
        }
    }

    /// Moves the QP to ERR because of an error the HCA found (IBTA vol. 1 §10.3.1, §10.8.3):
    /// records `event` if given, completes the send queue (WQEs already done keep their status,
    /// every other one completes with WR_FLUSH_ERR), flushes the receive queue (not an SRQ),
    /// and drops all transport state. Responses still queued are dropped; a caller that owes the
    /// peer a NAK queues it afterwards.
    pub(crate) fn enter_error(
        &mut self,
        env: &mut Env<'_>,
        event: Option<AsyncEventType>,
        status: WcStatus,
    ) {
        if env.state(self.qpn) != QpState::Err {
            let _ = env.ctx.qp_set_error(self.qpn, event);
            if self.srq.is_some() {
                env.ctx
                    .record_event(AsyncEventType::QpLastWqeReached, EventElement::Qp(self.qpn));
            }
            env.diag.record(DiagRecord {
                time: env.now,
                kind: DiagKind::QpError(status),
                qpn: Some(self.qpn),
                psn: None,
                detail: "QP moved to the error state",
            });
        }
        self.flush(env);
    }

    /// Completes everything queued on a QP in ERR: send WQEs (WR_FLUSH_ERR unless already done)
    /// and receive WQEs (WR_FLUSH_ERR).
    pub(crate) fn flush(&mut self, env: &mut Env<'_>) {
        for wqe in self.sq.iter_mut() {
            if !matches!(wqe.state, WqeState::Done(_)) {
                wqe.state = WqeState::Done(WcStatus::WrFlushErr);
            }
        }
        self.complete_front(env);
        self.req.next = 0;
        self.req.rd_atomic = 0;
        self.req.noack_pkts = 0;
        self.comp.retrans_at = None;
        self.comp.rnr_until = None;
        self.fail_recv_cursor(env, WcStatus::WrFlushErr);
        self.resp.out.clear();
        self.resp.last_opcode = None;
        let n = self.resp.resources.len() as u8;
        self.resp.set_resources(n);
        self.flush_rq(env);
    }

    /// Completes every WQE of the QP's own receive queue with WR_FLUSH_ERR.
    pub(crate) fn flush_rq(&mut self, env: &mut Env<'_>) {
        if self.srq.is_some() {
            return;
        }
        // Bounded by the queue depth: each iteration removes one WQE.
        while let Some(wr_id) = env
            .ctx
            .qp_mut(self.qpn)
            .and_then(|q| q.rq_mut())
            .and_then(|rq| rq.pop())
        {
            let wc = WorkCompletion::flush(wr_id, WcOpcode::Recv, self.qpn);
            env.push_wc(self.recv_cq, wc, true);
        }
    }

    /// A UC or UD send WQE failed: the QP enters SQE (IBTA vol. 1 §10.3.1 "Send Queue Error"),
    /// the failed WQE completes with its status and the rest of the send queue with
    /// WR_FLUSH_ERR; receives go on.
    pub(crate) fn enter_sq_error(&mut self, env: &mut Env<'_>, status: WcStatus) {
        let _ = env.ctx.qp_mut(self.qpn).map(|q| q.enter_sq_error());
        env.diag.record(DiagRecord {
            time: env.now,
            kind: DiagKind::SqError(status),
            qpn: Some(self.qpn),
            psn: None,
            detail: "QP moved to the send queue error state",
        });
        self.flush_sq(env);
    }

    /// Completes every send WQE (done ones with their status, the rest WR_FLUSH_ERR).
    pub(crate) fn flush_sq(&mut self, env: &mut Env<'_>) {
        for wqe in self.sq.iter_mut() {
            if !matches!(wqe.state, WqeState::Done(_)) {
                wqe.state = WqeState::Done(WcStatus::WrFlushErr);
            }
        }
        self.complete_front(env);
        self.req.next = 0;
        self.req.rd_atomic = 0;
        self.comp.retrans_at = None;
        self.comp.rnr_until = None;
    }

    /// A WQE failed: RC QPs go to ERR, UC and UD QPs to SQE.
    pub(crate) fn send_failed(&mut self, env: &mut Env<'_>, index: usize, status: WcStatus) {
        if let Some(w) = self.sq.get_mut(index) {
            if w.state == WqeState::InFlight && w.is_read_or_atomic() {
                self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
            }
            w.state = WqeState::Done(status);
        }
        match self.qp_type {
            // The error is reported by the WQE's completion; requester errors raise no async
            // event (IBTA vol. 1 §11.6.2; rxe neither).
            QpType::Rc => self.enter_error(env, None, status),
            QpType::Uc | QpType::Ud => self.enter_sq_error(env, status),
        }
    }
}
