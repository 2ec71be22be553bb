//! The responder: executes incoming requests and owes the peer its responses (rxe `rxe_resp.c`).
//!
//! Every request, RC, UC or UD, runs through one state machine ([`RespState`], rxe `enum
//! resp_states`): rxe's checks in rxe's order, each branching on the QP type where the services
//! differ (see UC and UD below), each mapped to the IBTA error class it belongs to (IBTA vol. 1
//! §9.9.3, table 59 "Responder Error Behavior"). For RC:
//!
//! 1. **PSN** (§9.7.5.1.1): the expected PSN is executed; an earlier one is a *duplicate*
//!    (§9.7.5.1.2, below); a later one is a *sequence error* (class B): one NAK PSN sequence
//!    error per gap, then silence until the expected PSN arrives.
//! 2. **Opcode sequence** (§9.7.5.1.3): MIDDLE / LAST must continue a message of the same kind,
//!    FIRST / ONLY must not interrupt one. Class C: NAK invalid request.
//! 3. **Opcode valid** for the QP's access flags (REMOTE_WRITE / READ / ATOMIC). Class C.
//! 4. **Resources**: a READ or atomic needs `max_dest_rd_atomic` > 0 (class C); a SEND FIRST /
//!    ONLY and a WRITE with immediate need a receive WQE, else an **RNR NAK** carrying the QP's
//!    `min_rnr_timer` (class B, §9.7.5.2.8).
//! 5. **Length** (C9-92 as rxe cites it): ONLY <= PMTU, FIRST and MIDDLE == PMTU, LAST 1..=PMTU;
//!    RETH DMA length <= 2^31 (C9-94). Class C: NAK invalid request.
//! 6. **R_Key** (§10.6.3, §9.7.5.1.5): the rkey names a region of the QP's PD with the needed
//!    remote access containing the whole range; a zero-length READ or WRITE names none (C9-88).
//!    Class C: NAK remote access error. Each WRITE packet must carry exactly PMTU bytes while more
//!    than one PMTU remains, and exactly the remainder in the end (class C, invalid request).
//!    An atomic's address must be 8-byte aligned (class C, invalid request).
//! 7. **Execute**, then advance the expected PSN (an RDMA READ advances it by one PSN per
//!    response packet, §9.7.1), the MSN once per completed message (an RDMA READ on receipt,
//!    C9-148 as rxe cites it), complete the receive WQE, and acknowledge if AckReq was set.
//!
//! An RDMA READ's data is read from memory when its response packets are built, as a NIC reads
//! it by DMA while it goes on with later requests: a WRITE or atomic that follows the READ may
//! be visible in the READ's data unless the requester fenced it (IBTA vol. 1 §10.8.3.3; the
//! relaxed ordering of RDMA READ, "writes can complete faster than reads"). rxe instead stalls
//! its responder until the READ response is sent.
//!
//! A class C error sends its NAK, completes the receive WQE in progress with an error, raises
//! the affiliated async event (IBTA vol. 1 §11.6.3.1: QP_REQ_ERR for invalid requests,
//! QP_ACCESS_ERR for access violations) and moves the QP to ERR. READ responses and atomic
//! acknowledgements still owed for earlier requests go out before the NAK.
//!
//! **Duplicates** (§9.7.5.1.2): a SEND or WRITE is acknowledged again with the PSN of the last
//! ACK-able request (`ack_psn - 1`, C9-105 as rxe cites it), never with the PSN of an RDMA READ,
//! whose only acknowledgement is its response; an RDMA READ is answered again from the saved
//! responder resource (`max_dest_rd_atomic` of them), from the PSN asked for, without touching the
//! request in progress; an atomic is answered with its saved result and never executed twice.
//!
//! **ACK coalescing**: responses queue in PSN order; an ACK queued right after another ACK
//! replaces it (an ACK acknowledges everything before it), so a burst of requests handled before
//! the next `poll_transmit` costs one ACK. A plain ACK lets one request packet of its own QP go
//! first, so that the two leave together (a request/response exchange costs one send for both);
//! with [`EngineConfig::ack_delay`](super::EngineConfig::ack_delay) a lone ACK waits up to that
//! long for such a request.
//!
//! UC (§9.8.4): no ACKs; a packet out of sequence, or any error, drops the rest of its message
//! and the responder resynchronises on the next FIRST or ONLY. UD (§9.8.5): single packets;
//! the receive buffer gets the 40-byte GRH area then the payload; a message that does not fit
//! its buffer, or finds none, is dropped silently and the QP stays in RTS.
//!
//! How UC and UD go through the RC states (rxe's branches, with their differences):
//! * **CheckPsn**: UC compares the PSN but a mismatch, or a message being dropped, is no NAK:
//!   a MIDDLE / LAST drops the rest of its message, a FIRST / ONLY resynchronises on it (rxe
//!   `check_psn`, UC branch); no duplicate or sequence-error counters. UD has no PSN check.
//! * **CheckOpSeq**: UC checks the sequence as RC does, but a FIRST / ONLY interrupting a message
//!   first forgets it (class D1E); UD messages are single packets, nothing to check.
//! * **CheckResource**: UD only looks at the oldest receive WQE (taken in Execute);
//!   **CheckLength**: UD checks that the GRH area and payload fit it, no PMTU rule.
//! * **CheckRkey**: a UC WRITE checks each packet's range as it is written (Execute), not the
//!   whole RETH range on its first packet.
//! * **Execute**: UD places the GRH area and the payload.
//! * **Acknowledge**: RC only.
//! * The error states: a class C NAK or an RNR NAK on RC becomes, on UC, dropping the rest of
//!   the message ([`RespState::DropMessage`], rxe `drop_msg`; the receive WQE is kept for the
//!   next message) and, on UD, a silent drop (no WQE) or class A without a NAK (a receive WQE
//!   that cannot take the message: it fails, the QP enters ERR).

use roce::aeth::{AckCredit, NakCode, RnrTimer, Syndrome};
use roce::opcode::{Operation, Position};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{aeth, atomic_eth, bth, Opcode, Psn};

use super::counters::{bump, DropReason};
use super::memory::CopyError;
use super::net::{grh_area, seal, write_headers, BuildError};
use super::recv::RxPacket;
use super::requester::{num_packets, TxResult};
use super::transport::{Env, QpTransport, Resource, ResourceKind, RespOut, WriteCursor};
use super::tx::TxOut;
use super::Transmit;
use crate::verbs::event::AsyncEventType;
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::{QpAttr, QpState, QpType};
use crate::verbs::wc::{WcOpcode, WcStatus, WorkCompletion};

/// 24-bit MSN mask.
const MSN_MASK: u32 = 0x00ff_ffff;
/// Largest RETH DMA length (C9-94 as rxe cites it).
const MAX_DMA_LEN: u32 = 1 << 31;
/// Bytes a UD receive buffer reserves for the GRH before the payload (IBTA vol. 1 §11.4.1.1).
const GRH_AREA_LEN: u64 = 40;

/// Whether `cur` may follow a message whose last packet so far was `last` (IBTA vol. 1
/// §9.7.5.1.3; rxe `check_op_seq`).
fn op_seq_ok(last: Option<Opcode>, cur: Opcode) -> bool {
    let (Some(op), Some(pos)) = (cur.operation(), cur.position()) else {
        return false;
    };
    match last.and_then(|l| l.operation()) {
        Some(in_progress) => in_progress == op && matches!(pos, Position::Middle | Position::Last),
        None => matches!(pos, Position::First | Position::Only),
    }
}

/// Whether the payload length obeys the PMTU rules for its position (C9-92 as rxe cites it).
fn length_ok(pos: Position, len: usize, pmtu: usize) -> bool {
    match pos {
        Position::Only => len <= pmtu,
        Position::First | Position::Middle => len == pmtu,
        Position::Last => (1..=pmtu).contains(&len),
    }
}

/// Whether an RDMA WRITE packet of `len` bytes fits the `resid` bytes its RETH left (rxe
/// `check_rkey`): one PMTU while more than one PMTU remains, and the message's last packet carries
/// exactly the rest. rxe checks only the first rule, so it accepts a message that ends before its
/// DMA length (a WRITE with immediate would then complete with the RETH's byte_len for bytes
/// never written); here that is class C, invalid request (RC) or a dropped message (UC).
fn write_packet_fits(resid: usize, len: usize, pmtu: usize, ends: bool) -> bool {
    if ends {
        len == resid
    } else {
        resid > pmtu && len == pmtu
    }
}

/// The states of a request in the responder (rxe `enum resp_states`), in the order a request
/// goes through them; each has one function that returns the next. RC, UC and UD requests all
/// go through them (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RespState {
    /// Expected, duplicate or out-of-sequence PSN.
    CheckPsn,
    /// The opcode continues or starts a message correctly.
    CheckOpSeq,
    /// The QP's access flags allow the operation.
    CheckOpValid,
    /// Responder resources (READ, atomic), receive WQE (SEND, WRITE with immediate).
    CheckResource,
    /// PMTU and RETH length rules.
    CheckLength,
    /// R_Key, bounds and access; WRITE packet sizes; atomic alignment.
    CheckRkey,
    /// Places a SEND / WRITE payload, invalidates an IETH rkey, advances PSN and MSN.
    Execute,
    /// Queues a new READ's response stream.
    ReadReply,
    /// Executes a new atomic and queues its ATOMIC ACKNOWLEDGE.
    AtomicReply,
    /// Completes the receive WQE.
    Complete,
    /// Queues an ACK if AckReq was set.
    Acknowledge,
    /// A request seen before.
    Duplicate,
    /// Class B: NAK PSN sequence error (once per gap).
    ErrPsnOutOfSeq,
    /// Class B: RNR NAK with the QP's `min_rnr_timer` (UC: drop the message; UD: drop).
    ErrRnr,
    /// Class A / C: NAK `code`; the receive WQE fails with `status`; the QP enters ERR raising
    /// `event` (UC: drop the message; UD: class A without the NAK).
    ErrNak {
        code: NakCode,
        status: WcStatus,
        event: AsyncEventType,
    },
    /// UC, class D1 / E: the rest of the message is dropped until the next FIRST or ONLY; the
    /// receive WQE it used is kept for the next one (rxe `drop_msg`).
    DropMessage,
    /// Finished with the packet.
    Done,
    /// Dropped without effect.
    Drop(DropReason),
}

impl RespState {
    /// Class C, invalid request: NAK invalid request, IBV_WC_REM_INV_REQ_ERR, QP_REQ_ERR.
    const fn invalid_request() -> RespState {
        RespState::ErrNak {
            code: NakCode::InvalidRequest,
            status: WcStatus::RemInvReqErr,
            event: AsyncEventType::QpReqErr,
        }
    }

    /// Class A, a receive WQE that cannot take the message (rxe ERR_MALFORMED_WQE): NAK remote
    /// operational error, IBV_WC_LOC_QP_OP_ERR, QP_FATAL.
    const fn malformed_wqe() -> RespState {
        RespState::ErrNak {
            code: NakCode::RemoteOperationalError,
            status: WcStatus::LocQpOpErr,
            event: AsyncEventType::QpFatal,
        }
    }
}

impl QpTransport {
    /// Handles a request packet (SEND, RDMA WRITE, RDMA READ request, atomic) on a QP in RTR or
    /// later, RC, UC or UD, by running it through the responder's states (rxe `rxe_responder`).
    /// Returns the reason if it was dropped.
    pub(crate) fn on_request(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
    ) -> Result<(), DropReason> {
        let Some(attr) = env.ctx.qp(self.qpn).map(|q| *q.attr()) else {
            return Err(DropReason::Qpn);
        };
        let mut state = RespState::CheckPsn;
        // Every transition moves down the list of states (an error state ends in Done or Drop),
        // so a packet takes fewer than 16 steps.
        for _ in 0..16 {
            state = match state {
                RespState::CheckPsn => self.check_psn(env, pkt),
                RespState::CheckOpSeq => self.check_op_seq(pkt),
                RespState::CheckOpValid => self.check_op_valid(pkt, &attr),
                RespState::CheckResource => self.check_resource(env, pkt, &attr),
                RespState::CheckLength => self.check_length(env, pkt),
                RespState::CheckRkey => self.check_rkey(env, pkt),
                RespState::Execute => self.execute(env, pkt),
                RespState::ReadReply => self.read_reply(pkt),
                RespState::AtomicReply => self.atomic_reply(env, pkt),
                RespState::Complete => {
                    self.complete_recv(env, pkt);
                    RespState::Acknowledge
                }
                RespState::Acknowledge => {
                    // UC and UD are unacknowledged: their AckReq bit means nothing.
                    if self.qp_type == QpType::Rc && pkt.bth.ack_req {
                        self.queue_ack(env, pkt.psn);
                    }
                    RespState::Done
                }
                RespState::Duplicate => self.duplicate(env, pkt),
                RespState::ErrPsnOutOfSeq => {
                    self.resp.sent_psn_nak = true;
                    let expected = self.resp.psn;
                    self.queue_nak(expected, Syndrome::Nak(NakCode::PsnSequenceError));
                    RespState::Done
                }
                RespState::ErrRnr => self.err_rnr(env, pkt, &attr),
                RespState::ErrNak {
                    code,
                    status,
                    event,
                } => self.err_nak(env, pkt, code, status, event),
                RespState::DropMessage => {
                    self.resp.drop_msg = true;
                    self.uc_reset_message();
                    RespState::Drop(DropReason::RequestDropped)
                }
                RespState::Done => return Ok(()),
                RespState::Drop(reason) => return Err(reason),
            };
        }
        Err(DropReason::RequestDropped)
    }

    /// Class B, no receive WQE (IBTA vol. 1 §9.7.5.2.8): RC sends an RNR NAK carrying the QP's
    /// `min_rnr_timer`; UC drops the rest of the message; UD drops the message silently (class
    /// D), the QP stays in RTS (rxe `RESPST_ERR_RNR`).
    fn err_rnr(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>, attr: &QpAttr) -> RespState {
        match self.qp_type {
            QpType::Rc => {
                bump!(env.counters.send_rnr_err);
                let timer = RnrTimer::from_code(attr.min_rnr_timer);
                self.queue_nak(pkt.psn, Syndrome::RnrNak { timer });
                RespState::Done
            }
            QpType::Uc => RespState::DropMessage,
            QpType::Ud => RespState::Drop(DropReason::RequestDropped),
        }
    }

    /// A class A or C error (rxe `do_class_ac_error`). RC: NAK `code`, the receive WQE fails
    /// with `status`, the QP enters ERR raising `event`. UC (class D1 / E): the rest of the
    /// message is dropped, the QP stays in RTS. UD: only a receive WQE that cannot take the
    /// message gets here (class A): it fails and the QP enters ERR, with no NAK on an
    /// unacknowledged service.
    fn err_nak(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
        code: NakCode,
        status: WcStatus,
        event: AsyncEventType,
    ) -> RespState {
        match self.qp_type {
            QpType::Rc => {
                // READ responses and atomic ACKs queued so far answer requests before this one
                // that were executed (an atomic changed memory): they go out before the NAK,
                // which acknowledges the rest (IBTA vol. 1 §9.7.5.2); rxe sends them as it
                // executes the requests. Plain ACKs and NAKs queued are superseded.
                let mut owed = core::mem::take(&mut self.resp.out);
                owed.retain(|o| !matches!(o, RespOut::Ack { .. }));
                self.class_c(env, pkt.psn, code, status, event);
                let nak = core::mem::replace(&mut self.resp.out, owed);
                self.resp.out.extend(nak);
            }
            QpType::Uc => return RespState::DropMessage,
            QpType::Ud => {
                self.fail_recv_cursor(env, status);
                self.enter_error(env, Some(event), status);
            }
        }
        RespState::Done
    }

    /// IBTA vol. 1 §9.7.5.1.1: the expected PSN goes on; an earlier one is a duplicate; a later
    /// one a sequence error (class B), NAKed once per gap (rxe `sent_psn_nak`). UC (§9.8.4):
    /// a packet out of sequence, or in a message being dropped, drops the rest of its message;
    /// a FIRST or ONLY starts afresh (rxe `check_psn`, UC branch). UD: no PSN check.
    fn check_psn(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        match self.qp_type {
            QpType::Rc => {}
            QpType::Uc => {
                if self.resp.drop_msg || pkt.psn != self.resp.psn {
                    if !pkt.opcode.starts_message() {
                        return RespState::DropMessage;
                    }
                    self.resp.drop_msg = false;
                    self.uc_reset_message();
                }
                return RespState::CheckOpSeq;
            }
            QpType::Ud => return RespState::CheckOpSeq,
        }
        match pkt.psn.cmp_serial(self.resp.psn) {
            core::cmp::Ordering::Greater => {
                bump!(env.counters.out_of_seq_request);
                if self.resp.sent_psn_nak {
                    RespState::Done
                } else {
                    RespState::ErrPsnOutOfSeq
                }
            }
            core::cmp::Ordering::Less => {
                bump!(env.counters.duplicate_request);
                RespState::Duplicate
            }
            core::cmp::Ordering::Equal => {
                self.resp.sent_psn_nak = false;
                RespState::CheckOpSeq
            }
        }
    }

    /// IBTA vol. 1 §9.7.5.1.3 (rxe `check_op_seq`): class C on a broken message. UC: a FIRST or
    /// ONLY while a message is in progress loses the old message (class D1E), a broken sequence
    /// drops the message. UD: single-packet messages, nothing to check.
    fn check_op_seq(&mut self, pkt: &RxPacket<'_>) -> RespState {
        match self.qp_type {
            QpType::Rc => {}
            QpType::Uc => {
                if self.resp.last_opcode.is_some() && pkt.opcode.starts_message() {
                    self.uc_reset_message();
                }
            }
            QpType::Ud => return RespState::CheckOpValid,
        }
        if op_seq_ok(self.resp.last_opcode, pkt.opcode) {
            RespState::CheckOpValid
        } else {
            RespState::invalid_request()
        }
    }

    /// The QP's access flags allow the operation (rxe `check_op_valid`); class C otherwise.
    fn check_op_valid(&mut self, pkt: &RxPacket<'_>, attr: &QpAttr) -> RespState {
        // A UD SEND carries its sender's QPN in a DETH (IBTA vol. 1 §9.8.5).
        if self.qp_type == QpType::Ud && pkt.ext.deth.is_none() {
            return RespState::Drop(DropReason::Length);
        }
        let needed = match pkt.info.operation {
            Operation::RdmaWrite => AccessFlags::REMOTE_WRITE,
            Operation::RdmaReadRequest => AccessFlags::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => AccessFlags::REMOTE_ATOMIC,
            Operation::Send => AccessFlags::empty(),
            _ => return RespState::Drop(DropReason::UnexpectedResponse),
        };
        if attr.qp_access_flags.contains(needed) {
            RespState::CheckResource
        } else {
            RespState::invalid_request()
        }
    }

    /// A READ or atomic needs responder resources; a SEND FIRST / ONLY or a WRITE with immediate
    /// a receive WQE (rxe `check_resource`). UD: the oldest receive WQE is only looked at here
    /// (its length is checked next) and taken in Execute.
    fn check_resource(
        &mut self,
        env: &mut Env<'_>,
        pkt: &RxPacket<'_>,
        attr: &QpAttr,
    ) -> RespState {
        if self.qp_type == QpType::Ud {
            return if self.peek_recv_len(env).is_some() {
                RespState::CheckLength
            } else {
                RespState::ErrRnr
            };
        }
        let op = pkt.info.operation;
        if matches!(
            op,
            Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
        ) {
            if attr.max_dest_rd_atomic == 0 {
                return RespState::invalid_request();
            }
            let slot_busy = self
                .resp
                .resources
                .get(self.resp.res_head)
                .is_none_or(|r| r.pending);
            if slot_busy || self.resp.out.len() >= self.resp.out_capacity() {
                // The requester exceeded max_dest_rd_atomic, or responses are not being polled:
                // drop without effect; the requester retries.
                return RespState::Drop(DropReason::RequestDropped);
            }
            return RespState::CheckLength;
        }
        let needs_wqe = (op == Operation::Send && pkt.opcode.starts_message())
            || (op == Operation::RdmaWrite && pkt.ext.immdt.is_some());
        if needs_wqe && !self.resp.recv.active && !self.acquire_recv(env) {
            return RespState::ErrRnr;
        }
        RespState::CheckLength
    }

    /// C9-92 (as rxe cites it): ONLY <= PMTU, FIRST / MIDDLE == PMTU, LAST 1..=PMTU; C9-94: RETH
    /// DMA length <= 2^31. Class C. UD (§9.8.5): the oldest receive WQE must hold the 40-byte GRH
    /// area and the payload, else the message is dropped silently (class D), the WQE kept.
    fn check_length(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        if self.qp_type == QpType::Ud {
            let needed = GRH_AREA_LEN + pkt.payload.len() as u64;
            return match self.peek_recv_len(env) {
                Some(len) if len >= needed => RespState::CheckRkey,
                _ => RespState::Drop(DropReason::RequestDropped),
            };
        }
        let payload_ok = !pkt.info.has_payload
            || length_ok(pkt.info.position, pkt.payload.len(), self.pmtu as usize);
        if !payload_ok || pkt.ext.reth.is_some_and(|r| r.dma_len > MAX_DMA_LEN) {
            return RespState::invalid_request();
        }
        RespState::CheckRkey
    }

    /// The R_Key names a region of the QP's PD granting the access over the whole range
    /// (§10.6.3; a zero-length READ or WRITE names none, C9-88); each WRITE packet carries PMTU
    /// bytes while more remain and exactly the rest at the end; atomics are 8-byte aligned
    /// (§9.4.5). Class C (rxe `check_rkey`).
    fn check_rkey(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        let access_error = RespState::ErrNak {
            code: NakCode::RemoteAccessError,
            status: WcStatus::RemAccessErr,
            event: AsyncEventType::QpAccessErr,
        };
        let (mrs, pd) = (env.ctx.mrs(), self.pd);
        // Whether the R_Key refuses `access` to `len` bytes at `va` (none checked for none).
        let denied = |rkey: u32, va: u64, len: u64, access: AccessFlags| {
            len > 0 && mrs.check_rkey(pd, rkey, va, len, access).is_err()
        };
        match pkt.info.operation {
            Operation::RdmaWrite => {
                if pkt.opcode.starts_message() {
                    let Some(reth) = pkt.ext.reth else {
                        return match self.qp_type {
                            QpType::Uc => RespState::DropMessage,
                            _ => RespState::Drop(DropReason::Length),
                        };
                    };
                    self.resp.write = WriteCursor {
                        va: reth.virtual_address,
                        rkey: reth.rkey,
                        resid: reth.dma_len,
                        length: reth.dma_len,
                    };
                    // RC checks the whole range on the first packet; UC checks each packet's
                    // range as it writes it (Execute), so the packets before a bad one land.
                    if self.qp_type == QpType::Rc
                        && denied(
                            reth.rkey,
                            reth.virtual_address,
                            u64::from(reth.dma_len),
                            AccessFlags::REMOTE_WRITE,
                        )
                    {
                        return access_error;
                    }
                }
                let (resid, len, pmtu) = (
                    self.resp.write.resid as usize,
                    pkt.payload.len(),
                    self.pmtu as usize,
                );
                let ends = matches!(pkt.info.position, Position::Last | Position::Only);
                if !write_packet_fits(resid, len, pmtu, ends) {
                    return RespState::invalid_request();
                }
            }
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.ext.reth else {
                    return RespState::Drop(DropReason::Length);
                };
                if denied(
                    reth.rkey,
                    reth.virtual_address,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_READ,
                ) {
                    return access_error;
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let Some(a) = pkt.ext.atomic_eth else {
                    return RespState::Drop(DropReason::Length);
                };
                if denied(a.rkey, a.virtual_address, 8, AccessFlags::REMOTE_ATOMIC) {
                    return access_error;
                }
                // rxe ERR_MISALIGNED_ATOMIC: class C, invalid request.
                if a.virtual_address & 7 != 0 {
                    return RespState::invalid_request();
                }
            }
            _ => {}
        }
        RespState::Execute
    }

    /// Executes a new SEND or WRITE packet, or hands a READ / atomic to its reply state
    /// (rxe `execute`). UD: takes the receive WQE and places the GRH area and the payload.
    fn execute(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        if self.qp_type == QpType::Ud {
            return self.execute_ud(env, pkt);
        }
        let op = pkt.info.operation;
        let len = pkt.payload.len();
        match op {
            Operation::RdmaReadRequest => return RespState::ReadReply,
            Operation::CompareSwap | Operation::FetchAdd => return RespState::AtomicReply,
            Operation::Send => {
                let recv = &mut self.resp.recv;
                match env.mem.scatter(
                    env.ctx.mrs(),
                    self.pd,
                    recv.sges.iter().copied(),
                    recv.offset,
                    pkt.payload,
                ) {
                    Ok(()) => recv.offset += len as u64,
                    // Longer than the receive buffer: the requester sees an invalid request,
                    // the receive WQE a local length error (IBTA vol. 1 §9.9.3).
                    Err(CopyError::Overflow) => {
                        return RespState::ErrNak {
                            code: NakCode::InvalidRequest,
                            status: WcStatus::LocLenErr,
                            event: AsyncEventType::QpReqErr,
                        }
                    }
                    // A receive SGE failed its lkey check: class A (rxe ERR_MALFORMED_WQE).
                    Err(CopyError::Key(_)) => return RespState::malformed_wqe(),
                }
            }
            Operation::RdmaWrite => {
                let w = self.resp.write;
                if len > 0 {
                    // rxe rechecks the rkey for every packet: the region may have gone since
                    // the FIRST packet.
                    let written = env
                        .mem
                        .remote(
                            env.ctx.mrs(),
                            self.pd,
                            w.rkey,
                            w.va,
                            len,
                            AccessFlags::REMOTE_WRITE,
                        )
                        .ok()
                        .is_some_and(|(mem, at)| mem.write(at, pkt.payload).is_ok());
                    if !written {
                        return RespState::ErrNak {
                            code: NakCode::RemoteAccessError,
                            status: WcStatus::RemAccessErr,
                            event: AsyncEventType::QpAccessErr,
                        };
                    }
                }
                self.resp.write.va = w.va.wrapping_add(len as u64);
                self.resp.write.resid = w.resid.saturating_sub(len as u32);
            }
            _ => return RespState::Drop(DropReason::UnexpectedResponse),
        }
        if let Some(ieth) = pkt.ext.ieth {
            // SEND with Invalidate (IBTA vol. 1 §9.4.1.1): the rkey must name a region of this
            // QP's PD; otherwise the request is invalid.
            if env.ctx.invalidate_mr_key(self.pd, ieth.rkey).is_err() {
                return RespState::invalid_request();
            }
        }
        let end = matches!(pkt.info.position, Position::Last | Position::Only);
        if end {
            self.resp.msn = (self.resp.msn + 1) & MSN_MASK;
        }
        self.resp.psn = pkt.psn.next();
        self.resp.ack_psn = self.resp.psn;
        self.resp.last_opcode = if end { None } else { Some(pkt.opcode) };
        if end && self.resp.recv.active && (op == Operation::Send || pkt.ext.immdt.is_some()) {
            RespState::Complete
        } else {
            RespState::Acknowledge
        }
    }

    /// Execute for UD (IBTA vol. 1 §9.8.5): the receive buffer gets the 40-byte GRH area, then
    /// the payload. A WQE whose SGEs cannot take them is class A (rxe ERR_MALFORMED_WQE).
    fn execute_ud(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        if !self.acquire_recv(env) {
            return RespState::Drop(DropReason::RequestDropped);
        }
        let grh = grh_area(&pkt.ip, pkt.udp_len);
        let recv = &self.resp.recv;
        let placed = env
            .mem
            .scatter(env.ctx.mrs(), self.pd, recv.sges.iter().copied(), 0, &grh)
            .and_then(|()| {
                env.mem.scatter(
                    env.ctx.mrs(),
                    self.pd,
                    recv.sges.iter().copied(),
                    GRH_AREA_LEN,
                    pkt.payload,
                )
            });
        if placed.is_err() {
            return RespState::malformed_wqe();
        }
        self.resp.recv.offset = GRH_AREA_LEN + pkt.payload.len() as u64;
        RespState::Complete
    }

    /// A new RDMA READ: save it as a responder resource, advance the expected PSN by one per
    /// response packet (§9.7.1) and the MSN (C9-148 as rxe cites it), queue the response
    /// stream.
    fn read_reply(&mut self, pkt: &RxPacket<'_>) -> RespState {
        let Some(reth) = pkt.ext.reth else {
            return RespState::Drop(DropReason::Length);
        };
        let psn = pkt.psn;
        let npkts = num_packets(reth.dma_len, self.pmtu);
        self.resp.msn = (self.resp.msn + 1) & MSN_MASK;
        let msn = self.resp.msn;
        let slot = self.take_resource(Resource {
            kind: ResourceKind::Read {
                va: reth.virtual_address,
                length: reth.dma_len,
                rkey: reth.rkey,
            },
            first_psn: psn,
            last_psn: psn.wrapping_add(npkts - 1),
            msn,
            valid: true,
            pending: true,
        });
        self.resp.psn = psn.wrapping_add(npkts);
        self.resp.last_opcode = None;
        self.resp.out.push_back(RespOut::Read {
            slot,
            first: psn,
            psn,
            va: reth.virtual_address,
            resid: reth.dma_len,
            rkey: reth.rkey,
            msn,
        });
        RespState::Done
    }

    /// A new atomic: executed exactly once (IBTA vol. 1 §9.4.5), its result saved as a
    /// responder resource for duplicates, its ATOMIC ACKNOWLEDGE queued.
    fn atomic_reply(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        let Some(a) = pkt.ext.atomic_eth else {
            return RespState::Drop(DropReason::Length);
        };
        let result = env
            .mem
            .remote(
                env.ctx.mrs(),
                self.pd,
                a.rkey,
                a.virtual_address,
                8,
                AccessFlags::REMOTE_ATOMIC,
            )
            .ok()
            .map(|(mem, at)| {
                if pkt.info.operation == Operation::CompareSwap {
                    mem.compare_swap(at, a.compare_data, a.swap_add_data)
                } else {
                    mem.fetch_add(at, a.swap_add_data)
                }
            });
        // A word the memory cannot operate on atomically (misaligned in the backing memory).
        let Some(Ok(orig)) = result else {
            return RespState::invalid_request();
        };
        let psn = pkt.psn;
        self.resp.msn = (self.resp.msn + 1) & MSN_MASK;
        let msn = self.resp.msn;
        let slot = self.take_resource(Resource {
            kind: ResourceKind::Atomic { orig },
            first_psn: psn,
            last_psn: psn,
            msn,
            valid: true,
            pending: true,
        });
        self.resp.psn = psn.next();
        self.resp.ack_psn = self.resp.psn;
        self.resp.last_opcode = None;
        self.resp.out.push_back(RespOut::Atomic {
            slot,
            psn,
            orig,
            msn,
        });
        RespState::Done
    }

    /// Stores a new responder resource in the oldest slot (the caller checked it is not pending).
    fn take_resource(&mut self, resource: Resource) -> usize {
        let n = self.resp.resources.len().max(1);
        let slot = self.resp.res_head % n;
        if let Some(r) = self.resp.resources.get_mut(slot) {
            *r = resource;
        }
        self.resp.res_head = (slot + 1) % n;
        slot
    }

    /// A duplicate request (PSN before the expected one), IBTA vol. 1 §9.7.5.1.2.
    fn duplicate(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> RespState {
        match self.duplicate_inner(env, pkt) {
            Ok(()) => RespState::Done,
            Err(reason) => RespState::Drop(reason),
        }
    }

    fn duplicate_inner(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) -> Result<(), DropReason> {
        let psn = pkt.psn;
        match pkt.info.operation {
            Operation::Send | Operation::RdmaWrite => {
                // C9-105 (as rxe cites it): acknowledge again, with the last ACK-able PSN.
                let ack = self.resp.ack_psn.wrapping_sub(1);
                self.queue_ack(env, ack);
                Ok(())
            }
            Operation::RdmaReadRequest => {
                let reth = pkt.ext.reth.ok_or(DropReason::Length)?;
                let found = self.resp.resources.iter().enumerate().find(|(_, r)| {
                    r.valid
                        && matches!(r.kind, ResourceKind::Read { .. })
                        && psn.in_window(r.first_psn, r.first_psn.distance(r.last_psn) + 1)
                });
                let Some((slot, res)) = found.map(|(i, r)| (i, *r)) else {
                    // Class D: no resource for it (too old), drop.
                    return Err(DropReason::RequestDropped);
                };
                let ResourceKind::Read { va, length, rkey } = res.kind else {
                    return Err(DropReason::RequestDropped);
                };
                // The retried READ must ask for a part of the original (rxe `duplicate_request`:
                // same rkey, a sub-range), and no more response packets than the PSNs left.
                let end = va.checked_add(u64::from(length));
                let asked_end = reth.virtual_address.checked_add(u64::from(reth.dma_len));
                let psns_left = u64::from(psn.distance(res.last_psn)) + 1;
                if reth.rkey != rkey
                    || reth.virtual_address < va
                    || asked_end.is_none()
                    || asked_end > end
                    || u64::from(num_packets(reth.dma_len, self.pmtu)) > psns_left
                {
                    return Err(DropReason::RequestDropped);
                }
                let replay = RespOut::Read {
                    slot,
                    first: psn,
                    psn,
                    va: reth.virtual_address,
                    resid: reth.dma_len,
                    rkey,
                    msn: res.msn,
                };
                for o in self.resp.out.iter_mut() {
                    if let RespOut::Read {
                        slot: s,
                        psn: queued,
                        ..
                    } = *o
                    {
                        if s == slot {
                            // Still being sent: restart it from `psn` if that is earlier.
                            if psn.is_before(queued) {
                                *o = replay;
                            }
                            return Ok(());
                        }
                    }
                }
                if self.resp.out.len() >= self.resp.out_capacity() {
                    return Err(DropReason::RequestDropped);
                }
                if let Some(r) = self.resp.resources.get_mut(slot) {
                    r.pending = true;
                }
                self.resp.out.push_back(replay);
                Ok(())
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let found = self.resp.resources.iter().enumerate().find(|(_, r)| {
                    r.valid && matches!(r.kind, ResourceKind::Atomic { .. }) && r.first_psn == psn
                });
                let Some((slot, res)) = found.map(|(i, r)| (i, *r)) else {
                    return Err(DropReason::RequestDropped);
                };
                let ResourceKind::Atomic { orig } = res.kind else {
                    return Err(DropReason::RequestDropped);
                };
                if self
                    .resp
                    .out
                    .iter()
                    .any(|o| matches!(o, RespOut::Atomic { slot: s, .. } if *s == slot))
                {
                    return Ok(());
                }
                if self.resp.out.len() >= self.resp.out_capacity() {
                    return Err(DropReason::RequestDropped);
                }
                if let Some(r) = self.resp.resources.get_mut(slot) {
                    r.pending = true;
                }
                self.resp.out.push_back(RespOut::Atomic {
                    slot,
                    psn,
                    orig,
                    msn: res.msn,
                });
                Ok(())
            }
            _ => Err(DropReason::UnexpectedResponse),
        }
    }

    /// Whether the next response is a plain ACK (no NAK, no data).
    pub(crate) fn front_is_plain_ack(&self) -> bool {
        matches!(
            self.resp.out.front(),
            Some(RespOut::Ack {
                syndrome: Syndrome::Ack { .. },
                ..
            })
        )
    }

    /// Queues an ACK for `psn`, merging it into an ACK queued last (coalescing).
    fn queue_ack(&mut self, env: &mut Env<'_>, psn: Psn) {
        let msn = self.resp.msn;
        if let Some(RespOut::Ack {
            psn: queued,
            syndrome: Syndrome::Ack { .. },
            msn: queued_msn,
        }) = self.resp.out.back_mut()
        {
            if psn.is_after(*queued) {
                *queued = psn;
            }
            *queued_msn = msn;
            bump!(env.counters.ack_deferred);
            return;
        }
        if self.resp.out.len() < self.resp.out_capacity() {
            // A lone ACK may wait for a request to ride behind (`EngineConfig::ack_delay`).
            self.resp.ack_due =
                (self.resp.out.is_empty() && !env.config.ack_delay.is_zero()).then(|| {
                    env.now
                        .saturating_add_nanos(env.config.ack_delay.as_nanos() as u64)
                });
            self.resp.out.push_back(RespOut::Ack {
                psn,
                syndrome: Syndrome::Ack {
                    credit: AckCredit::INVALID,
                },
                msn,
            });
        }
    }

    /// Queues a NAK or RNR NAK (never merged). Dropped if the queue is full: the requester's
    /// timeout covers a lost NAK.
    fn queue_nak(&mut self, psn: Psn, syndrome: Syndrome) {
        if self.resp.out.len() < self.resp.out_capacity() {
            self.resp.out.push_back(RespOut::Ack {
                psn,
                syndrome,
                msn: self.resp.msn,
            });
        }
    }

    /// A class A or C error on the request with PSN `psn` (rxe `do_class_ac_error`): the
    /// receive WQE in progress completes with `status`, the QP enters ERR raising `event`, and a
    /// NAK `code` is queued, the one packet a QP in ERR still sends.
    fn class_c(
        &mut self,
        env: &mut Env<'_>,
        psn: Psn,
        code: NakCode,
        status: WcStatus,
        event: AsyncEventType,
    ) {
        self.fail_recv_cursor(env, status);
        self.enter_error(env, Some(event), status);
        self.resp.out.push_back(RespOut::Ack {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.resp.msn,
        });
    }

    /// Takes the oldest receive WQE (own RQ or SRQ) into the receive cursor. False if none.
    fn acquire_recv(&mut self, env: &mut Env<'_>) -> bool {
        let cursor = &mut self.resp.recv;
        cursor.sges.clear();
        if let Some(srq) = self.srq {
            let Some(wqe) = env.ctx.srq(srq).and_then(|s| s.front()) else {
                return false;
            };
            cursor.wr_id = wqe.wr_id;
            cursor.length = wqe.length;
            cursor.sges.extend(wqe.sg_list().copied());
            let _ = env.ctx.consume_srq_wqe(srq);
        } else {
            let Some(wqe) = env
                .ctx
                .qp(self.qpn)
                .and_then(|q| q.rq())
                .and_then(|rq| rq.front())
            else {
                return false;
            };
            cursor.wr_id = wqe.wr_id;
            cursor.length = wqe.length;
            cursor.sges.extend(wqe.sg_list().copied());
            let _ = env
                .ctx
                .qp_mut(self.qpn)
                .and_then(|q| q.rq_mut())
                .and_then(|rq| rq.pop());
        }
        cursor.offset = 0;
        cursor.active = true;
        true
    }

    /// The length of the oldest receive WQE, without taking it.
    fn peek_recv_len(&self, env: &Env<'_>) -> Option<u64> {
        match self.srq {
            Some(srq) => env.ctx.srq(srq).and_then(|s| s.front()).map(|w| w.length),
            None => env
                .ctx
                .qp(self.qpn)
                .and_then(|q| q.rq())
                .and_then(|rq| rq.front())
                .map(|w| w.length),
        }
    }

    /// Completes the receive WQE that took the message `pkt` ends.
    fn complete_recv(&mut self, env: &mut Env<'_>, pkt: &RxPacket<'_>) {
        let recv = &mut self.resp.recv;
        recv.active = false;
        let write_imm = pkt.info.operation == Operation::RdmaWrite;
        let (opcode, byte_len) = if write_imm {
            (WcOpcode::RecvRdmaWithImm, self.resp.write.length)
        } else {
            (WcOpcode::Recv, recv.offset.min(u64::from(u32::MAX)) as u32)
        };
        let mut wc = WorkCompletion::success(recv.wr_id, opcode, self.qpn, byte_len);
        if let Some(imm) = pkt.ext.immdt {
            wc = wc.with_imm(imm.to_host_order());
        }
        if let Some(ieth) = pkt.ext.ieth {
            wc = wc.with_inv(ieth.rkey);
        }
        if let Some(deth) = pkt.ext.deth {
            wc = wc.with_grh(deth.src_qpn);
        }
        bump!(env.counters.rdma_recvs);
        if !env.push_wc(self.recv_cq, wc, pkt.bth.solicited) {
            self.cq_overrun = true;
        }
    }

    /// UC: forget the message in progress; the receive WQE it used is kept for the next one
    /// (rxe class D1: "reset the recv wr to its original state").
    fn uc_reset_message(&mut self) {
        self.resp.recv.offset = 0;
        self.resp.last_opcode = None;
    }

    /// Builds the next queued response (ACK, NAK, READ response, atomic ACK) into `buf`.
    pub(crate) fn next_response(&mut self, env: &mut Env<'_>, out: &mut TxOut<'_>) -> TxResult {
        let state = env.state(self.qpn);
        if state == QpState::Reset || state == QpState::Init {
            self.resp.out.clear();
            return TxResult::Nothing;
        }
        let Some(route) = self.route else {
            self.resp.out.clear();
            return TxResult::Nothing;
        };
        let dest_qpn = env.ctx.qp(self.qpn).map_or(0, |q| q.attr().dest_qp_num);
        // At most two passes: a READ response that fails its rkey recheck is replaced by a NAK.
        for _ in 0..2 {
            let Some(front) = self.resp.out.front().copied() else {
                return TxResult::Nothing;
            };
            let mut ext = ExtReprs::default();
            let (opcode, psn, payload_len) = match front {
                RespOut::Ack { psn, syndrome, msn } => {
                    ext.aeth = Some(aeth::Repr { syndrome, msn });
                    (Opcode::RcAcknowledge, psn, 0)
                }
                RespOut::Atomic { psn, orig, msn, .. } => {
                    ext.aeth = Some(aeth::Repr {
                        syndrome: Syndrome::Ack {
                            credit: AckCredit::INVALID,
                        },
                        msn,
                    });
                    ext.atomic_ack_eth = Some(atomic_eth::ack::Repr {
                        orig_remote_data: orig,
                    });
                    (Opcode::RcAtomicAcknowledge, psn, 0)
                }
                RespOut::Read {
                    first,
                    psn,
                    resid,
                    msn,
                    ..
                } => {
                    let payload = resid.min(self.pmtu);
                    let more = resid > payload;
                    let opcode = match (psn == first, more) {
                        (true, false) => Opcode::RcRdmaReadResponseOnly,
                        (true, true) => Opcode::RcRdmaReadResponseFirst,
                        (false, true) => Opcode::RcRdmaReadResponseMiddle,
                        (false, false) => Opcode::RcRdmaReadResponseLast,
                    };
                    if opcode != Opcode::RcRdmaReadResponseMiddle {
                        ext.aeth = Some(aeth::Repr {
                            syndrome: Syndrome::Ack {
                                credit: AckCredit::INVALID,
                            },
                            msn,
                        });
                    }
                    (opcode, psn, payload as usize)
                }
            };
            let transport = TransportRepr {
                bth: bth::Repr {
                    opcode,
                    solicited: false,
                    mig_req: false,
                    pad_cnt: 0,
                    pkey: self.pkey,
                    fecn: false,
                    becn: false,
                    dest_qpn,
                    ack_req: false,
                    psn: psn.value(),
                },
                ext,
            };
            out.reset();
            // A READ response's payload: gathered in place when the link can and the memory is
            // CPU-addressable, else copied below. rxe rechecks the rkey for every response
            // packet: the region may have been deregistered or invalidated since the request was
            // accepted.
            let mut source = None;
            if let RespOut::Read { va, rkey, .. } = front {
                if payload_len > 0 {
                    match env.mem.remote(
                        env.ctx.mrs(),
                        self.pd,
                        rkey,
                        va,
                        payload_len,
                        AccessFlags::REMOTE_READ,
                    ) {
                        Ok((mem, at)) => source = Some((mem, at)),
                        Err(_) => {
                            self.resp.out.pop_front();
                            self.class_c(
                                env,
                                psn,
                                NakCode::RemoteAccessError,
                                WcStatus::WrFlushErr,
                                AsyncEventType::QpAccessErr,
                            );
                            continue;
                        }
                    }
                }
            }
            let gathered = out.gather
                && source.is_some_and(|(mem, at)| out.push_segment(mem, at, payload_len));
            let in_buffer = if gathered { 0 } else { payload_len };
            let header_len = match write_headers(out.buf, &transport, payload_len, in_buffer) {
                Ok(n) => n,
                Err(BuildError::BufferTooSmall) => {
                    bump!(env.counters.send_err);
                    return TxResult::BufferTooSmall;
                }
                Err(BuildError::Headers) => {
                    bump!(env.counters.send_err);
                    self.resp.out.pop_front();
                    return TxResult::Nothing;
                }
            };
            let sealed = if gathered {
                bump!(env.counters.tx_gathered_pkts);
                out.seal_gathered(header_len, payload_len, &route)
            } else {
                if let Some((mem, at)) = source {
                    bump!(env.counters.tx_copied_pkts);
                    let read = out
                        .buf
                        .get_mut(header_len..header_len + payload_len)
                        .is_some_and(|dst| mem.read(at, dst).is_ok());
                    if !read {
                        self.resp.out.pop_front();
                        self.class_c(
                            env,
                            psn,
                            NakCode::RemoteAccessError,
                            WcStatus::WrFlushErr,
                            AsyncEventType::QpAccessErr,
                        );
                        continue;
                    }
                }
                let sealed = seal(out.buf, header_len, payload_len, &route);
                if let Ok(len) = sealed {
                    out.built_in_buffer(len);
                }
                sealed
            };
            let len = match sealed {
                Ok(len) => len,
                Err(_) => {
                    bump!(env.counters.send_err);
                    return TxResult::BufferTooSmall;
                }
            };
            self.advance_response(payload_len);
            bump!(env.counters.sent_pkts);
            return TxResult::Packet(Transmit::new(&route, len));
        }
        TxResult::Nothing
    }

    /// The front response's packet was sent: move its stream on or drop it.
    fn advance_response(&mut self, payload_len: usize) {
        let done_slot = match self.resp.out.front_mut() {
            Some(RespOut::Read {
                slot,
                psn,
                va,
                resid,
                ..
            }) => {
                *psn = psn.next();
                *va = va.wrapping_add(payload_len as u64);
                *resid -= payload_len as u32;
                if *resid > 0 {
                    return;
                }
                Some(*slot)
            }
            Some(RespOut::Atomic { slot, .. }) => Some(*slot),
            Some(RespOut::Ack { .. }) => {
                self.resp.ack_due = None;
                None
            }
            _ => None,
        };
        self.resp.out.pop_front();
        if let Some(r) = done_slot.and_then(|s| self.resp.resources.get_mut(s)) {
            r.pending = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_sequences() {
        use Opcode::*;
        assert!(op_seq_ok(None, RcSendFirst));
        assert!(op_seq_ok(None, RcRdmaWriteOnly));
        assert!(!op_seq_ok(None, RcSendMiddle));
        assert!(!op_seq_ok(None, RcRdmaWriteLast));
        assert!(op_seq_ok(Some(RcSendFirst), RcSendLastWithInvalidate));
        assert!(!op_seq_ok(Some(RcSendFirst), RcRdmaWriteMiddle));
        assert!(!op_seq_ok(Some(RcRdmaWriteMiddle), RcSendOnly));
        assert!(op_seq_ok(
            Some(RcRdmaWriteMiddle),
            RcRdmaWriteLastWithImmediate
        ));
    }

    #[test]
    fn pmtu_length_rules() {
        assert!(length_ok(Position::Only, 0, 1024));
        assert!(length_ok(Position::Only, 1024, 1024));
        assert!(!length_ok(Position::Only, 1025, 1024));
        assert!(!length_ok(Position::Middle, 1000, 1024));
        assert!(length_ok(Position::First, 1024, 1024));
        assert!(!length_ok(Position::Last, 0, 1024));
        assert!(length_ok(Position::Last, 1, 1024));
    }
}
