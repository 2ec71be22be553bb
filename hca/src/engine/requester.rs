//! The requester: turns send WQEs into request packets (rxe `rxe_req.c`).
//!
//! The requester walks the send queue from [`super::transport::Requester::next`]. A WQE is
//! *started* when its first packet is built: it is assigned PSNs from the QP's send PSN, one per
//! packet (IBTA vol. 1 §9.7.1), and for an RDMA READ one per response packet it will get back
//! (the request itself carries the first). A message is cut into path-MTU packets: FIRST and
//! MIDDLE packets carry exactly one PMTU, the LAST 1..=PMTU bytes, a single-packet message is ONLY
//! (a zero-byte message is one ONLY packet and uses one PSN; §9.7.2, C9-92 is the responder's side
//! of the same rule).
//!
//! Before starting a WQE the requester checks (IBTA vol. 1 §10.8.3, §9.7.4):
//! * the QP is in RTS (in SQD it only finishes WQEs already started: the send queue drains);
//! * an RDMA READ or atomic does not exceed `max_rd_atomic` outstanding ones (the initiator
//!   depth; 0 is treated as 1, where rxe would stall the queue forever);
//! * a WQE with the FENCE flag waits until every RDMA READ and atomic before it has completed;
//! * RC: no more than [`super::EngineConfig::max_unacked_psns`] PSNs are outstanding.
//!
//! An RDMA READ longer than half that window is asked for in segments: READ requests of at most
//! half the window's packets each (`SendWqe::read_seg`, fixed when the WQE starts), aligned to
//! its first PSN, the next one once its responses fit the window with those still outstanding
//! (two segments in flight at most) and `max_rd_atomic` has room: each segment is one READ
//! request outstanding, counted until the response that ends it. A READ's responses are not
//! acknowledged, so this is what bounds them to the window the peer's receive buffer was sized
//! for (a kernel UDP socket drops what overflows it, and a lost last response is only noticed at
//! the local ACK timeout). Each segment is an ordinary READ request for part of the WQE's range,
//! as a retried READ is (IBTA vol. 1 §9.7.4.1.4: PSN, address and length move together).
//!
//! AckReq policy (RC): set on the last packet of every message (and on every READ / atomic
//! request, which are ONLY packets), on every [`super::EngineConfig::ack_req_every`]-th packet
//! of a long message (rxe `RXE_MAX_PKT_PER_ACK`), and on the packet that fills the
//! unacknowledged-PSN window, so that the responder reports progress before the requester has
//! to wait and the local ACK timeout need not fire.
//!
//! UC and UD WQEs complete as soon as their last packet is handed to the link; RC WQEs are
//! completed by the completer when acknowledged.

use roce::opcode::Position;
use roce::packet::{ExtReprs, TransportRepr};
use roce::{atomic_eth, bth, deth, ieth, immdt, reth, Opcode, Psn};

use super::counters::bump;
use super::memory::CopyError;
use super::net::{seal, write_headers, BuildError, Route};
use super::send_queue::{SendWqe, WqeState};
use super::transport::{Env, QpTransport};
use super::tx::TxOut;
use super::Transmit;
use crate::verbs::qp::{QpAttr, QpState, QpType};
use crate::verbs::wc::WcStatus;
use crate::verbs::wr::{SendFlags, SendOp, WrOpcode};

/// What one attempt to transmit produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxResult {
    /// A packet is in the buffer.
    Packet(Transmit),
    /// Nothing to send now.
    Nothing,
    /// The next packet does not fit the caller's buffer; nothing was consumed.
    BufferTooSmall,
}

/// Why a request packet could not be built.
enum RequestError {
    Build(BuildError),
    /// A local SGE failed its lkey check (IBV_WC_LOC_PROT_ERR).
    LocalProtection,
}

/// Packets a message of `length` bytes needs at path MTU `pmtu` (1 for a zero-byte message).
pub(crate) fn num_packets(length: u32, pmtu: u32) -> u32 {
    if length == 0 {
        1
    } else {
        length.div_ceil(pmtu.max(1))
    }
}

/// Response packets the READ request at PSN `psn` of READ WQE `wqe` asks for: up to the end of
/// the segment `psn` is in (see the module docs); at least 1.
pub(crate) fn read_request_packets(wqe: &SendWqe, psn: Psn) -> u32 {
    let seg = u64::from(wqe.read_seg.max(1));
    let index = u64::from(wqe.first_psn.distance(psn));
    let npkts = u64::from(wqe.first_psn.distance(wqe.last_psn)) + 1;
    let end = ((index / seg + 1) * seg).min(npkts);
    end.saturating_sub(index).max(1) as u32
}

/// The position of packet `index` of `count`.
pub(crate) fn position(index: u32, count: u32) -> Position {
    if count <= 1 {
        Position::Only
    } else if index == 0 {
        Position::First
    } else if index + 1 >= count {
        Position::Last
    } else {
        Position::Middle
    }
}

/// The opcode of a request packet (IBTA vol. 1 §9.2 table 38).
fn request_opcode(qp_type: QpType, op: WrOpcode, pos: Position) -> Opcode {
    use Position::*;
    use WrOpcode as W;
    let end = matches!(pos, Last | Only);
    match (qp_type, op) {
        (QpType::Ud, W::SendWithImm) => Opcode::UdSendOnlyWithImmediate,
        (QpType::Ud, _) => Opcode::UdSendOnly,
        (_, W::RdmaRead) => Opcode::RcRdmaReadRequest,
        (_, W::AtomicCmpAndSwp) => Opcode::RcCompareSwap,
        (_, W::AtomicFetchAndAdd) => Opcode::RcFetchAdd,
        (t, W::Send | W::SendWithImm | W::SendWithInv | W::LocalInv | W::BindMw) => {
            let rc = t == QpType::Rc;
            match (pos, op) {
                (First, _) => pick(rc, Opcode::RcSendFirst, Opcode::UcSendFirst),
                (Middle, _) => pick(rc, Opcode::RcSendMiddle, Opcode::UcSendMiddle),
                (Last, W::SendWithImm) => pick(
                    rc,
                    Opcode::RcSendLastWithImmediate,
                    Opcode::UcSendLastWithImmediate,
                ),
                (Last, W::SendWithInv) => Opcode::RcSendLastWithInvalidate,
                (Last, _) => pick(rc, Opcode::RcSendLast, Opcode::UcSendLast),
                (Only, W::SendWithImm) => pick(
                    rc,
                    Opcode::RcSendOnlyWithImmediate,
                    Opcode::UcSendOnlyWithImmediate,
                ),
                (Only, W::SendWithInv) => Opcode::RcSendOnlyWithInvalidate,
                (Only, _) => pick(rc, Opcode::RcSendOnly, Opcode::UcSendOnly),
            }
        }
        (t, W::RdmaWrite | W::RdmaWriteWithImm) => {
            let rc = t == QpType::Rc;
            let imm = op == W::RdmaWriteWithImm && end;
            match pos {
                First => pick(rc, Opcode::RcRdmaWriteFirst, Opcode::UcRdmaWriteFirst),
                Middle => pick(rc, Opcode::RcRdmaWriteMiddle, Opcode::UcRdmaWriteMiddle),
                Last if imm => pick(
                    rc,
                    Opcode::RcRdmaWriteLastWithImmediate,
                    Opcode::UcRdmaWriteLastWithImmediate,
                ),
                Last => pick(rc, Opcode::RcRdmaWriteLast, Opcode::UcRdmaWriteLast),
                Only if imm => pick(
                    rc,
                    Opcode::RcRdmaWriteOnlyWithImmediate,
                    Opcode::UcRdmaWriteOnlyWithImmediate,
                ),
                Only => pick(rc, Opcode::RcRdmaWriteOnly, Opcode::UcRdmaWriteOnly),
            }
        }
    }
}

const fn pick(rc: bool, a: Opcode, b: Opcode) -> Opcode {
    if rc {
        a
    } else {
        b
    }
}

impl QpTransport {
    /// Builds the next request packet into `buf`, if the send queue has one ready.
    pub(crate) fn next_request(&mut self, env: &mut Env<'_>, out: &mut TxOut<'_>) -> TxResult {
        let Some(qp) = env.ctx.qp(self.qpn) else {
            return TxResult::Nothing;
        };
        let state = qp.state();
        let attr = *qp.attr();
        if !matches!(state, QpState::Rts | QpState::Sqd) || self.comp.rnr_until.is_some() {
            return TxResult::Nothing;
        }
        let max_rd_atomic = u32::from(attr.max_rd_atomic.max(1));
        let window = env.config.max_unacked_psns.max(1);
        // Each pass either returns or moves `next` forward by one WQE: bounded by the queue.
        for _ in 0..=self.sq.len() {
            let i = self.req.next;
            let Some(wqe) = self.sq.get(i).copied() else {
                return TxResult::Nothing;
            };
            match wqe.state {
                WqeState::Done(_) => {
                    self.req.next += 1;
                    continue;
                }
                WqeState::Posted => {
                    if state == QpState::Sqd {
                        return TxResult::Nothing;
                    }
                    // IBTA vol. 1 §10.8.3.3 (fence): wait for earlier READs and atomics.
                    if wqe.flags.contains(SendFlags::FENCE) && self.req.rd_atomic > 0 {
                        return TxResult::Nothing;
                    }
                    if wqe.is_read_or_atomic() && self.req.rd_atomic >= max_rd_atomic {
                        return TxResult::Nothing;
                    }
                    if let SendOp::LocalInv { invalidate_rkey } = wqe.op {
                        if !self.local_invalidate(env, i, invalidate_rkey) {
                            return TxResult::Nothing;
                        }
                        continue;
                    }
                    if self.qp_type == QpType::Ud && wqe.length > self.pmtu {
                        // A UD message is one packet: larger than the PMTU it cannot be sent
                        // (rxe: IB_WC_LOC_LEN_ERR).
                        self.send_failed(env, i, WcStatus::LocLenErr);
                        return TxResult::Nothing;
                    }
                    if self.qp_type == QpType::Rc && self.comp.psn.distance(self.req.psn) >= window
                    {
                        return TxResult::Nothing;
                    }
                    let npkts = match wqe.opcode() {
                        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 1,
                        _ if self.qp_type == QpType::Ud => 1,
                        _ => num_packets(wqe.length, self.pmtu),
                    };
                    let first = self.req.psn;
                    if let Some(w) = self.sq.get_mut(i) {
                        w.first_psn = first;
                        w.last_psn = first.wrapping_add(npkts - 1);
                        w.next_psn = first;
                        w.state = WqeState::InFlight;
                        if wqe.opcode() == WrOpcode::RdmaRead {
                            w.read_seg = (window / 2).max(1);
                        }
                    }
                    self.req.psn = first.wrapping_add(npkts);
                    if wqe.is_read_or_atomic() {
                        self.req.rd_atomic += 1;
                    }
                }
                WqeState::InFlight => {}
            }
            let Some(wqe) = self.sq.get(i).copied() else {
                return TxResult::Nothing;
            };
            if wqe.fully_sent() {
                self.req.next += 1;
                continue;
            }
            let psn = wqe.next_psn;
            let fresh = !psn.is_before(self.req.sent_end);
            if self.qp_type == QpType::Rc && fresh && self.comp.psn.distance(psn) >= window {
                return TxResult::Nothing;
            }
            // The next segment of a READ: when its responses fit the window with those still
            // outstanding, and the initiator depth has room for one more READ request.
            let continues_read =
                wqe.opcode() == WrOpcode::RdmaRead && fresh && psn != wqe.first_psn;
            let outstanding = self.comp.psn.distance(psn);
            // (With nothing outstanding it always goes: the window may have shrunk below the
            // segment since the WQE started.)
            if continues_read
                && ((outstanding > 0 && outstanding + read_request_packets(&wqe, psn) > window)
                    || self.req.rd_atomic >= max_rd_atomic)
            {
                return TxResult::Nothing;
            }
            return match self.build_request(env, &attr, &wqe, psn, out) {
                Ok((tx, advance_to)) => {
                    if continues_read {
                        // One more READ request outstanding; the completer counts it off at the
                        // response that ends it.
                        self.req.rd_atomic += 1;
                    }
                    if let Some(w) = self.sq.get_mut(i) {
                        w.next_psn = advance_to;
                    }
                    if self.req.sent_end.is_before(advance_to) {
                        self.req.sent_end = advance_to;
                    }
                    bump!(env.counters.sent_pkts);
                    match self.qp_type {
                        QpType::Rc => {
                            if self.comp.retrans_at.is_none() {
                                if let Some(ns) = attr.local_ack_timeout_ns() {
                                    self.comp.retrans_at = Some(env.now.saturating_add_nanos(ns));
                                }
                            }
                        }
                        QpType::Uc | QpType::Ud => {
                            if advance_to == wqe.last_psn.next() {
                                if let Some(w) = self.sq.get_mut(i) {
                                    w.state = WqeState::Done(WcStatus::Success);
                                }
                                self.req.next += 1;
                            }
                        }
                    }
                    TxResult::Packet(tx)
                }
                Err(RequestError::Build(BuildError::BufferTooSmall)) => {
                    bump!(env.counters.send_err);
                    TxResult::BufferTooSmall
                }
                Err(RequestError::Build(BuildError::Headers)) => {
                    bump!(env.counters.send_err);
                    self.send_failed(env, i, WcStatus::LocQpOpErr);
                    TxResult::Nothing
                }
                Err(RequestError::LocalProtection) => {
                    bump!(env.counters.send_err);
                    self.send_failed(env, i, WcStatus::LocProtErr);
                    TxResult::Nothing
                }
            };
        }
        TxResult::Nothing
    }

    /// Executes a LOCAL_INV WQE (IBTA vol. 1 §10.6.5): no packet, the key is invalidated at once.
    /// Returns false if it failed (the QP then left RTS).
    fn local_invalidate(&mut self, env: &mut Env<'_>, i: usize, key: u32) -> bool {
        match env.ctx.invalidate_mr_key(self.pd, key) {
            Ok(()) => {
                if let Some(w) = self.sq.get_mut(i) {
                    w.state = WqeState::Done(WcStatus::Success);
                }
                self.req.next += 1;
                true
            }
            Err(_) => {
                // rxe completes a failed local invalidate with IB_WC_LOC_QP_OP_ERR.
                self.send_failed(env, i, WcStatus::LocQpOpErr);
                false
            }
        }
    }

    /// Builds the packet of `wqe` with PSN `psn` into `buf`. Returns the transmit description and
    /// the WQE's next PSN after it.
    fn build_request(
        &mut self,
        env: &mut Env<'_>,
        attr: &QpAttr,
        wqe: &SendWqe,
        psn: Psn,
        out: &mut TxOut<'_>,
    ) -> Result<(Transmit, Psn), RequestError> {
        let pmtu = u64::from(self.pmtu.max(1));
        let npkts = wqe.first_psn.distance(wqe.last_psn) + 1;
        let index = wqe.first_psn.distance(psn);
        let op = wqe.opcode();
        let (route, dest_qpn): (Route, u32) = match (self.qp_type, wqe.ud) {
            (QpType::Ud, Some(ud)) => (ud.route, ud.remote_qpn),
            (QpType::Ud, None) => return Err(RequestError::Build(BuildError::Headers)),
            _ => (
                self.route.ok_or(RequestError::Build(BuildError::Headers))?,
                attr.dest_qp_num,
            ),
        };
        let pos = match op {
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                Position::Only
            }
            _ => position(index, npkts),
        };
        let end = matches!(pos, Position::Last | Position::Only);
        let offset = u64::from(index) * pmtu;
        let length = u64::from(wqe.length);
        let mut ext = ExtReprs::default();
        let mut payload_len = 0usize;
        let mut advance_to = psn.next();
        match wqe.op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::UdSend { .. } => {
                payload_len = length.saturating_sub(offset).min(pmtu) as usize;
                if end {
                    if let Some(imm) = wqe.op.imm_data() {
                        ext.immdt = Some(immdt::Repr::from_host_order(imm));
                    }
                    if let SendOp::SendWithInv { invalidate_rkey } = wqe.op {
                        ext.ieth = Some(ieth::Repr {
                            rkey: invalidate_rkey,
                        });
                    }
                }
                if let Some(ud) = wqe.ud {
                    ext.deth = Some(deth::Repr {
                        qkey: ud.qkey,
                        src_qpn: self.qpn,
                    });
                }
            }
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => {
                payload_len = length.saturating_sub(offset).min(pmtu) as usize;
                if matches!(pos, Position::First | Position::Only) {
                    ext.reth = Some(reth::Repr {
                        virtual_address: remote_addr,
                        rkey,
                        dma_len: wqe.length,
                    });
                }
                if end {
                    if let Some(imm) = wqe.op.imm_data() {
                        ext.immdt = Some(immdt::Repr::from_host_order(imm));
                    }
                }
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                // A retried READ asks only for the responses not yet received (IBTA vol. 1
                // §9.7.4.1.4): PSN, address and length move together. Either asks up to the end
                // of the segment `psn` is in (see the module docs).
                let take = read_request_packets(wqe, psn);
                ext.reth = Some(reth::Repr {
                    virtual_address: remote_addr.wrapping_add(offset),
                    rkey,
                    dma_len: length.saturating_sub(offset).min(u64::from(take) * pmtu) as u32,
                });
                advance_to = psn.wrapping_add(take);
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(atomic_eth::request::Repr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add_data: swap,
                    compare_data: compare,
                });
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(atomic_eth::request::Repr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add_data: add,
                    compare_data: 0,
                });
            }
            SendOp::LocalInv { .. } => return Err(RequestError::Build(BuildError::Headers)),
        }
        // The packet that fills the unacknowledged-PSN window asks for an ACK too, or the
        // window would only reopen at the local ACK timeout.
        let fills_window = self.comp.psn.distance(psn.next()) >= env.config.max_unacked_psns.max(1);
        let ack_req = if self.qp_type != QpType::Rc {
            false
        } else if end || fills_window {
            self.req.noack_pkts = 0;
            true
        } else {
            self.req.noack_pkts += 1;
            if self.req.noack_pkts >= env.config.ack_req_every.max(1) {
                self.req.noack_pkts = 0;
                true
            } else {
                false
            }
        };
        let solicited = end
            && wqe.flags.contains(SendFlags::SOLICITED)
            && matches!(
                op,
                WrOpcode::Send
                    | WrOpcode::SendWithImm
                    | WrOpcode::SendWithInv
                    | WrOpcode::RdmaWriteWithImm
            );
        let transport = TransportRepr {
            bth: bth::Repr {
                opcode: request_opcode(self.qp_type, op, pos),
                solicited,
                mig_req: false,
                pad_cnt: 0,
                pkey: self.pkey,
                fecn: false,
                becn: false,
                dest_qpn,
                ack_req,
                psn: psn.value(),
            },
            ext,
        };
        let key_error = |e| match e {
            CopyError::Key(_) | CopyError::Overflow => RequestError::LocalProtection,
        };
        out.reset();
        // Zero-copy when the link gathers and the payload is in CPU-addressable MR memory. Only
        // RC: its WQEs complete when acknowledged, so after the link has sent the bytes; UC and
        // UD WQEs complete when their last packet is handed to the link, and the program may then
        // reuse the buffer (IBTA vol. 1 §10.8.5) before the link reads it, so they are copied.
        // Inline data lives in the send queue and is always copied.
        let gathered = out.gather
            && self.qp_type == QpType::Rc
            && payload_len > 0
            && !wqe.is_inline()
            && env
                .mem
                .segments(
                    env.ctx.mrs(),
                    self.pd,
                    self.sq.sges(wqe),
                    offset,
                    payload_len,
                    out,
                )
                .map_err(key_error)?;
        let in_buffer = if gathered { 0 } else { payload_len };
        let header_len = write_headers(out.buf, &transport, payload_len, in_buffer)
            .map_err(RequestError::Build)?;
        let len = if gathered {
            bump!(env.counters.tx_gathered_pkts);
            out.seal_gathered(header_len, payload_len, &route)
                .map_err(RequestError::Build)?
        } else {
            if payload_len > 0 {
                let dst = out
                    .buf
                    .get_mut(header_len..header_len + payload_len)
                    .ok_or(RequestError::Build(BuildError::BufferTooSmall))?;
                if !self.sq.copy_inline(wqe, offset as u32, dst) {
                    bump!(env.counters.tx_copied_pkts);
                    env.mem
                        .gather(env.ctx.mrs(), self.pd, self.sq.sges(wqe), offset, dst)
                        .map_err(key_error)?;
                }
            }
            let len =
                seal(out.buf, header_len, payload_len, &route).map_err(RequestError::Build)?;
            out.built_in_buffer(len);
            len
        };
        Ok((Transmit::new(&route, len), advance_to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segmentation_positions() {
        assert_eq!(num_packets(0, 1024), 1);
        assert_eq!(num_packets(1024, 1024), 1);
        assert_eq!(num_packets(1025, 1024), 2);
        assert_eq!(position(0, 1), Position::Only);
        assert_eq!(position(0, 3), Position::First);
        assert_eq!(position(1, 3), Position::Middle);
        assert_eq!(position(2, 3), Position::Last);
    }

    #[test]
    fn opcodes_follow_table_38() {
        use Position::*;
        let t = |q, op, p| request_opcode(q, op, p);
        assert_eq!(t(QpType::Rc, WrOpcode::Send, Only), Opcode::RcSendOnly);
        assert_eq!(
            t(QpType::Rc, WrOpcode::SendWithInv, Last),
            Opcode::RcSendLastWithInvalidate
        );
        assert_eq!(
            t(QpType::Uc, WrOpcode::SendWithImm, Only),
            Opcode::UcSendOnlyWithImmediate
        );
        assert_eq!(
            t(QpType::Rc, WrOpcode::RdmaWriteWithImm, First),
            Opcode::RcRdmaWriteFirst
        );
        assert_eq!(
            t(QpType::Uc, WrOpcode::RdmaWriteWithImm, Last),
            Opcode::UcRdmaWriteLastWithImmediate
        );
        assert_eq!(
            t(QpType::Rc, WrOpcode::RdmaRead, Only),
            Opcode::RcRdmaReadRequest
        );
        assert_eq!(
            t(QpType::Ud, WrOpcode::SendWithImm, Only),
            Opcode::UdSendOnlyWithImmediate
        );
    }
}
