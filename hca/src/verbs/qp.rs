//! Queue pairs: types, states, attributes and the modify-QP state machine.
//!
//! A queue pair (QP, IBTA vol. 1 ch. 10, ibv_create_qp(3)) is one endpoint of communication: a
//! send queue of WRs to execute and a receive queue of buffers for incoming messages (or an SRQ).
//! Its transport service ([`QpType`]) is one of:
//! * **RC**, reliable connected: one peer QP, every packet acknowledged and retried, RDMA READ and
//!   atomics;
//! * **UC**, unreliable connected: one peer QP, no ACKs, a lost packet loses its message; SEND and
//!   RDMA WRITE only;
//! * **UD**, unreliable datagram: any peer per WR (an address handle), single-packet SENDs.
//!
//! A QP is created in RESET and brought up by ibv_modify_qp(3) through INIT (port, P_Key, access
//! rights), RTR "ready to receive" (peer address, path MTU, peer QPN, expected PSN) and RTS "ready
//! to send" (send PSN, timeouts, retry counts). SQD drains the send queue, SQE (UC/UD) is entered
//! by the HCA after a send error, ERR flushes every WR with an error completion. Each transition
//! accepts a fixed set of attributes (IBTA vol. 1 ch. 11 Modify QP, the kernel's `qp_state_table`
//! in `drivers/infiniband/core/verbs.c`, which rxe applies via `ib_modify_qp_is_ok`): some are
//! required, some optional, the rest refused. [`Qp::modify`] checks the transition, the mask and
//! every value first and changes the QP only if all are valid, so a failed modify leaves it exactly
//! as it was.
//!
//! PSNs (packet sequence numbers) are 24-bit; QPNs are 24-bit, at least [`MIN_QPN`] (QPN 0 and 1
//! are the special SMI/GSI QPs, and rxe reserves everything below 16).
//!
//! ## QPNs and PSNs are secrets
//!
//! A peer names the QP a packet is for by the QPN in its BTH, and a RoCEv2 packet can come from
//! anyone who can reach the device's UDP port. The context therefore draws each QPN at random
//! (from its [`RandomSource`](crate::verbs::random::RandomSource): the operating system's in
//! every device of this crate), uniformly among the 2^24 - 16 values from 16 up that name no live
//! QP, and finds the QP by a hash map in O(1) (module [`table`](crate::verbs::table)). At most
//! [`MAX_QPS`] (2^20) QPs live at once, so a guessed QPN names one of `n` live QPs with
//! probability `n / (2^24 - 16)`, at most 1/16. Applications draw start PSNs at random too
//! (`rdma-perf` and `rdma-pingpong` through [`crate::verbs::random::random_psn`], as rdma-core's
//! tools do with `lrand48()`).
//!
//! **Forged requests.** An RC responder (IBTA vol. 1 §9.7.5.1.1) acts on a request only at its
//! expected PSN: 1 PSN of 2^24. The 2^23 PSNs before it are duplicates: a duplicate SEND or WRITE
//! is only acknowledged again, a duplicate READ is served only inside a READ the peer really sent
//! (same rkey, a sub-range), and every response goes to the connected peer's address, never to
//! the forger. The 2^23 - 1 PSNs after it are out of sequence: dropped, with one PSN sequence
//! error NAK per gap to the peer (its requester resends; nothing is lost). At the expected PSN
//! a forged SEND is delivered and a forged request that breaks a rule (an rkey that names no
//! region, a broken opcode sequence) is NAKed and moves the QP to ERR: QPN and PSN alone,
//! `2^48 / n` packets on average for `n` RC QPs, at least 2^40 only for `n <= 2^8`. A forged RC
//! WRITE, READ or atomic must also carry a live rkey (32 random bits): `2^80 / (n * m)` for `m`
//! regions with the access, at least 2^41 at the device's limits. A UC responder starts a new
//! message on any FIRST or ONLY whatever its PSN (§9.8.4, rxe `check_psn`), so for UC only the
//! QPN (SEND: `2^24 / n`) and the rkey (WRITE: `2^56 / (n * m)`) stand. The table of every
//! class, where each falls below 2^40 and what would close it: [`crate::verbs::mr`].
//!
//! **Forged responses.** An RC requester (§9.7.5.2, the completer) accepts an ACK, NAK or READ
//! response only for a PSN it sent and has not had acknowledged: `w` PSNs (at most the engine's
//! `max_unacked_psns`, 128 by default; `w + 1` for a PSN sequence error NAK), and drops every
//! other as `drop_unexpected_response`. A forged "remote access error" NAK, which fails the WQE
//! and moves the QP to ERR, or a forged ACK, which completes WQEs early, thus needs the
//! requester's QPN and a PSN in its window: probability `(w + 1) / 2^48` per QP, summed over the
//! busy RC QPs: 2^48 / 129, about 2^41 packets, for one QP with a full window of 128, but
//! 2^40 / 1.008 for two and 2^34 for a thousand QPs with windows of 16. (With sequential QPNs the
//! QPN was known and `2^24 / 129`, about 130 000 random-PSN NAKs, killed a transfer on average.)
//!
//! **A shared device** ([`crate::link::udp::share`]: many processes on one address and port)
//! fixes the top 5 QPN bits to the process's slot, which is guessable (slot 0 is the first
//! process). 19 random bits remain, and at most 2^19 / 16 = 32 768 QPs live per process
//! ([`crate::verbs::context::Context::set_qpn_prefix`]). Every figure above that has a `2^24` for
//! the QPN has `2^19` instead for a target process: a guessed QPN names one of its `n` QPs with
//! probability `n / 2^19`; forged RC requests at the expected PSN take `2^43 / n` packets (2^35
//! for `n = 2^8`); a forged ACK or NAK, `2^43 / 129`, about 2^36, for one QP with a full window;
//! UC SEND, `2^19 / n`. The rkey's 32 bits are unchanged. Sharing thus costs 5 bits of the
//! off-path margin; a device that needs all of it opens its own address.

use crate::verbs::ah::AhAttr;
use crate::verbs::cq::{rxe_queue_capacity, CqHandle};
use crate::verbs::device::{AtomicCap, Device, DeviceAttr, PathMtu};
use crate::verbs::error::{Cause, Object};
use crate::verbs::mr::AccessFlags;
use crate::verbs::pd::PdHandle;
use crate::verbs::recv_queue::RecvQueue;
use crate::verbs::srq::SrqHandle;
use crate::verbs::wr::{validate_send_wr, RecvWr, SendLimits, SendWr, SendWrInfo};

pub use super::attr::{
    MigState, QpAttrMask, QpState, QpType, MAX_QPN, MAX_QPS, MAX_RETRY, MAX_TIMER_CODE, MIN_QPN,
    PSN_MASK,
};

/// QP capabilities (`struct ibv_qp_cap`): queue depths in WRs, SGEs per WR, inline bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Send queue depth, WRs.
    pub max_send_wr: u32,
    /// Receive queue depth, WRs (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR (0 with an SRQ).
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl QpCap {
    /// Checks requested capabilities against the device (rxe `rxe_qp_chk_cap`); the receive side
    /// is not checked when the QP uses an SRQ.
    ///
    /// # Errors
    /// [`Cause::OutOfRange`] naming the first field over its limit.
    pub fn check(&self, has_srq: bool, device: &DeviceAttr) -> Result<(), Cause> {
        let over = |attr, value: u32, max: u32| {
            if value > max {
                Err(Cause::OutOfRange {
                    attr,
                    value: value.into(),
                    max: max.into(),
                })
            } else {
                Ok(())
            }
        };
        over("cap.max_send_wr", self.max_send_wr, device.max_qp_wr)?;
        over("cap.max_send_sge", self.max_send_sge, device.max_sge)?;
        if !has_srq {
            over("cap.max_recv_wr", self.max_recv_wr, device.max_qp_wr)?;
            over("cap.max_recv_sge", self.max_recv_sge, device.max_sge)?;
        }
        over(
            "cap.max_inline_data",
            self.max_inline_data,
            device.max_inline_data,
        )
    }

    /// The capabilities actually provided for a checked request, as rxe computes them
    /// (`rxe_qp_init_req`, `rxe_queue_init`): queue depths rounded up to a power of two minus one;
    /// a send WQE holds `max(16 x max_send_sge, max_inline_data)` bytes, so both limits grow to
    /// fill it; no receive queue with an SRQ.
    pub fn provided(&self, has_srq: bool, device: &DeviceAttr) -> QpCap {
        let wqe = (self.max_send_sge.saturating_mul(16)).max(self.max_inline_data);
        QpCap {
            max_send_wr: rxe_queue_capacity(self.max_send_wr),
            max_send_sge: (wqe / 16).min(device.max_sge),
            max_inline_data: wqe.min(device.max_inline_data),
            max_recv_wr: if has_srq {
                0
            } else {
                rxe_queue_capacity(self.max_recv_wr)
            },
            max_recv_sge: if has_srq { 0 } else { self.max_recv_sge },
        }
    }
}

/// What ibv_create_qp(3) takes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Transport service.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: CqHandle,
    /// CQ for receive completions.
    pub recv_cq: CqHandle,
    /// SRQ to take receive WQEs from, if any.
    pub srq: Option<SrqHandle>,
    /// Requested capabilities.
    pub cap: QpCap,
    /// Whether every send WR completes, signaled or not.
    pub sq_sig_all: bool,
}

/// QP attributes (`struct ibv_qp_attr`, the fields RoCE uses). ibv_modify_qp(3) reads the fields
/// named by the mask; ibv_query_qp(3) fills them all. Timer and retry fields use the IBTA
/// encodings: `timeout` 4.096 us x 2^timeout (0 = infinite), `min_rnr_timer` the AETH RNR NAK timer
/// code, `retry_cnt` / `rnr_retry` counts (rnr_retry 7 = infinite).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to.
    pub qp_state: QpState,
    /// The state the caller assumes the QP is in (checked if CUR_STATE is set).
    pub cur_qp_state: QpState,
    /// Path MTU (RC/UC).
    pub path_mtu: PathMtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Q_Key (UD): received datagrams must carry it; sends with a controlled Q_Key use it.
    pub qkey: u32,
    /// The PSN the responder expects first (24 bits).
    pub rq_psn: u32,
    /// The PSN of the first packet the requester sends (24 bits).
    pub sq_psn: u32,
    /// The peer QPN (RC/UC, 24 bits).
    pub dest_qp_num: u32,
    /// Remote access this QP allows to incoming requests (REMOTE_WRITE / READ / ATOMIC).
    pub qp_access_flags: AccessFlags,
    /// Capabilities (reported by query; no transition accepts them).
    pub cap: QpCap,
    /// Primary path address vector (RC/UC).
    pub ah_attr: AhAttr,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Whether reaching SQD raises IBV_EVENT_SQ_DRAINED.
    pub en_sqd_async_notify: bool,
    /// Reported by query: the QP is in SQD and still draining.
    pub sq_draining: bool,
    /// Outstanding RDMA READ / atomic requests this QP may issue (initiator depth).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ / atomic requests this QP accepts (responder resources).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code the responder sends (AETH RNR timer encoding, 0..=31).
    pub min_rnr_timer: u8,
    /// Port number (1-based).
    pub port_num: u8,
    /// Local ACK timeout exponent (0..=31).
    pub timeout: u8,
    /// Transport retries before IBV_WC_RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before IBV_WC_RNR_RETRY_EXC_ERR (0..=7, 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    /// The attributes of a fresh QP in RESET (path MTU 256, as rxe starts).
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: PathMtu::Mtu256,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

impl QpAttr {
    /// The local ACK timeout in nanoseconds, 4096 ns x 2^timeout (IBTA vol. 1 ch. 9 transport
    /// timer); `None` for 0, which means "wait forever".
    pub const fn local_ack_timeout_ns(&self) -> Option<u64> {
        if self.timeout == 0 {
            None
        } else {
            Some(4096u64 << (self.timeout & 31))
        }
    }
}

/// The RNR NAK timer in nanoseconds for a 5-bit timer code (the encoding of the AETH
/// RNR NAK Timer field, IBTA vol. 1 ch. 9); codes above 31 give `None`.
pub const fn rnr_timer_ns(code: u8) -> Option<u64> {
    // In units of 10 ns (the table's finest step is 0.01 ms = 1000 units).
    const TEN_NS: [u64; 32] = [
        65_536_000, 1_000, 2_000, 3_000, 4_000, 6_000, 8_000, 12_000, 16_000, 24_000, 32_000,
        48_000, 64_000, 96_000, 128_000, 192_000, 256_000, 384_000, 512_000, 768_000, 1_024_000,
        1_536_000, 2_048_000, 3_072_000, 4_096_000, 6_144_000, 8_192_000, 12_288_000, 16_384_000,
        24_576_000, 32_768_000, 49_152_000,
    ];
    if code as usize >= TEN_NS.len() {
        None
    } else {
        Some(TEN_NS[code as usize] * 10)
    }
}

/// The attributes a transition requires and accepts for one QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes that must be in the mask (besides STATE).
    pub required: QpAttrMask,
    /// Attributes that may be in the mask.
    pub optional: QpAttrMask,
}

/// The modify-QP rule for `qp_type` from `from` to `to`, or `None` if the transition does not exist
/// (IBTA vol. 1 §10.3.1 and ch. 11 Modify QP; the kernel's `qp_state_table`, which rxe enforces).
/// Without STATE in the mask the "transition" is to the current state.
///
/// As in Linux: any state may go to RESET or ERR except RESET -> ERR; RESET -> RESET, INIT -> INIT,
/// RTS -> RTS and SQD -> SQD exist (to change attributes), RTR -> RTR does not; nothing moves to
/// SQE by modify (the HCA enters it on a UC/UD send error); RC never is in SQE, so SQE -> RTS is
/// refused for RC.
pub fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    use QpAttrMask as M;
    use QpState::*;
    use QpType::*;
    let rule =
        |required: QpAttrMask, optional: QpAttrMask| Some(TransitionRule { required, optional });
    let none = M::empty();
    let ud_qkey_cur = M::CUR_STATE | M::QKEY;
    match (from, to) {
        (_, Reset) => rule(none, none),
        (Reset, Init) => match qp_type {
            Ud => rule(M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Rc | Uc => rule(M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Reset, _) => None,
        (_, Err) => rule(none, none),
        (Init, Init) => match qp_type {
            Ud => rule(none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Rc | Uc => rule(none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => {
            let uc = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            let opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
            match qp_type {
                Ud => rule(none, M::PKEY_INDEX | M::QKEY),
                Uc => rule(uc, opt),
                Rc => rule(uc | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER, opt),
            }
        }
        (Rtr, Rts) => {
            let uc_opt = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
            match qp_type {
                Ud => rule(M::SQ_PSN, ud_qkey_cur),
                Uc => rule(M::SQ_PSN, uc_opt),
                Rc => rule(
                    M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                    uc_opt | M::MIN_RNR_TIMER,
                ),
            }
        }
        (Rts, Rts) | (Sqd, Rts) => {
            let uc_opt = M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE;
            match qp_type {
                Ud => rule(none, ud_qkey_cur),
                Uc => rule(none, uc_opt),
                Rc => rule(none, uc_opt | M::MIN_RNR_TIMER),
            }
        }
        (Rts, Sqd) => rule(none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Ud => rule(none, M::PKEY_INDEX | M::QKEY),
            Uc => rule(
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => rule(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        (Sqe, Rts) => match qp_type {
            Ud => rule(none, ud_qkey_cur),
            Uc => rule(none, M::CUR_STATE | M::ACCESS_FLAGS),
            Rc => None,
        },
        _ => None,
    }
}

/// What a successful modify did, for the engine to act on (flush on ERR, reset its state on
/// RESET, start draining on SQD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyOutcome {
    /// The state before.
    pub from: QpState,
    /// The state after.
    pub to: QpState,
}

/// A queue pair: its identity, its objects, its attributes and state, and its receive queue.
///
/// The send queue (WQEs with their transport state) belongs to the transport engine, which
/// validates each WR with [`Qp::validate_send_wr`] before queueing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qp {
    qpn: u32,
    qp_type: QpType,
    pd: PdHandle,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    srq: Option<SrqHandle>,
    sq_sig_all: bool,
    cap: QpCap,
    attr: QpAttr,
    sq_draining: bool,
    rq: Option<RecvQueue>,
}

impl Qp {
    /// A QP in RESET with number `qpn` in `pd` (ibv_create_qp(3); rxe `rxe_qp_chk_init`,
    /// `rxe_qp_from_init`). The provided capabilities are [`QpCap::provided`].
    ///
    /// # Errors
    /// [`Cause::OutOfRange`] for a capability over the device limit or a QPN over 24 bits.
    pub fn new(qpn: u32, pd: PdHandle, init: &QpInitAttr, device: &Device) -> Result<Self, Cause> {
        if qpn > MAX_QPN {
            return Err(Cause::OutOfRange {
                attr: "qp_num",
                value: qpn.into(),
                max: MAX_QPN.into(),
            });
        }
        let has_srq = init.srq.is_some();
        init.cap.check(has_srq, &device.attr)?;
        let cap = init.cap.provided(has_srq, &device.attr);
        Ok(Qp {
            qpn,
            qp_type: init.qp_type,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            sq_sig_all: init.sq_sig_all,
            cap,
            attr: QpAttr::default(),
            sq_draining: false,
            rq: (!has_srq).then(|| RecvQueue::new(cap.max_recv_wr, cap.max_recv_sge)),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    /// The protection domain.
    pub fn pd(&self) -> PdHandle {
        self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> CqHandle {
        self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> CqHandle {
        self.recv_cq
    }

    /// The SRQ, if receive WQEs come from one.
    pub fn srq(&self) -> Option<SrqHandle> {
        self.srq
    }

    /// Whether every send WR completes.
    pub fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    /// The capabilities provided.
    pub fn cap(&self) -> &QpCap {
        &self.cap
    }

    /// The current attributes (`cap` and `sq_draining` are filled in by [`Self::query`]).
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    /// Whether the QP is in SQD and still draining its send queue.
    pub fn sq_draining(&self) -> bool {
        self.sq_draining
    }

    /// The receive queue (`None` with an SRQ).
    pub fn rq(&self) -> Option<&RecvQueue> {
        self.rq.as_ref()
    }

    /// Mutable form of [`Self::rq`].
    pub fn rq_mut(&mut self) -> Option<&mut RecvQueue> {
        self.rq.as_mut()
    }

    /// All attributes, as ibv_query_qp(3) reports them.
    pub fn query(&self) -> QpAttr {
        QpAttr {
            cur_qp_state: self.attr.qp_state,
            cap: self.cap,
            sq_draining: self.sq_draining,
            ..self.attr
        }
    }

    /// The creation attributes, as ibv_query_qp(3) reports them (capabilities as provided).
    pub fn init_attr(&self) -> QpInitAttr {
        QpInitAttr {
            qp_type: self.qp_type,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            sq_sig_all: self.sq_sig_all,
        }
    }

    /// Checks a modify without applying it: the transition and mask against
    /// [`transition_rule`], `cur_qp_state`, the SQD drain rule, then every value named by the
    /// mask. Returns the current and the target state.
    ///
    /// # Errors
    /// [`Cause::CurStateMismatch`], [`Cause::InvalidTransition`], [`Cause::MissingAttributes`],
    /// [`Cause::DisallowedAttributes`], [`Cause::SqDraining`], then per attribute:
    /// [`Cause::OutOfRange`] (PSNs over 24 bits, `dest_qp_num` over 24 bits, `timeout` /
    /// `min_rnr_timer` over 31, `retry_cnt` / `rnr_retry` over 7, `max_rd_atomic` over
    /// `max_qp_init_rd_atom`, `max_dest_rd_atomic` over `max_qp_rd_atom`, `path_mtu` over the
    /// port's `max_mtu`, `pkey_index` past the table), [`Cause::InvalidValue`] (unused P_Key
    /// entry), [`Cause::NoSuchObject`] (port), [`Cause::AccessFlags`], the address vector's
    /// errors ([`AhAttr::check`]), [`Cause::UnsupportedAttribute`] (alternate path). All `EINVAL`.
    pub fn check_modify(
        &self,
        attr: &QpAttr,
        mask: QpAttrMask,
        device: &Device,
    ) -> Result<(QpState, QpState), Cause> {
        let actual = self.attr.qp_state;
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != actual {
            return Err(Cause::CurStateMismatch {
                given: attr.cur_qp_state,
                actual,
            });
        }
        let from = actual;
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        let qp_type = self.qp_type;
        let rule = transition_rule(qp_type, from, to).ok_or(Cause::InvalidTransition {
            qp_type,
            from,
            to,
        })?;
        let missing = rule.required.difference(mask);
        if !missing.is_empty() {
            return Err(Cause::MissingAttributes {
                qp_type,
                from,
                to,
                missing,
            });
        }
        let allowed = rule.required | rule.optional | QpAttrMask::STATE;
        let extra = QpAttrMask::from_bits_retain(mask.bits() & !allowed.bits());
        if !extra.is_empty() {
            return Err(Cause::DisallowedAttributes {
                qp_type,
                from,
                to,
                extra,
            });
        }
        if from == QpState::Sqd && self.sq_draining && to != QpState::Err {
            return Err(Cause::SqDraining);
        }
        self.check_values(attr, mask, device)?;
        Ok((from, to))
    }

    fn check_values(&self, attr: &QpAttr, mask: QpAttrMask, device: &Device) -> Result<(), Cause> {
        use QpAttrMask as M;
        let range = |attr: &'static str, value: u64, max: u64| {
            if value > max {
                Err(Cause::OutOfRange { attr, value, max })
            } else {
                Ok(())
            }
        };
        let port_num = if mask.contains(M::PORT) {
            attr.port_num
        } else {
            self.attr.port_num
        };
        if mask.contains(M::ACCESS_FLAGS) {
            let flags = attr.qp_access_flags;
            let unknown = flags.bits() & !AccessFlags::all().bits() != 0;
            let no_atomics = flags.contains(AccessFlags::REMOTE_ATOMIC)
                && device.attr.atomic_cap == AtomicCap::None;
            if unknown || no_atomics {
                return Err(Cause::AccessFlags {
                    flags: flags.bits(),
                });
            }
        }
        if mask.contains(M::PORT) {
            device.check_port(attr.port_num)?;
        }
        if mask.contains(M::PKEY_INDEX) {
            let port = device.check_port(port_num)?;
            let len = port.pkeys.len();
            range(
                "pkey_index",
                attr.pkey_index.into(),
                u64::from(len.saturating_sub(1)),
            )?;
            if len == 0 || port.pkeys.get(attr.pkey_index).is_none() {
                return Err(Cause::InvalidValue {
                    attr: "pkey_index",
                    value: attr.pkey_index.into(),
                });
            }
        }
        if mask.contains(M::AV) {
            attr.ah_attr.check(device)?;
        }
        if mask.contains(M::PATH_MTU) {
            let port = device.check_port(port_num)?;
            range(
                "path_mtu",
                attr.path_mtu.bytes() as u64,
                port.attr.max_mtu.bytes() as u64,
            )?;
        }
        if mask.contains(M::TIMEOUT) {
            range("timeout", attr.timeout.into(), MAX_TIMER_CODE.into())?;
        }
        if mask.contains(M::RETRY_CNT) {
            range("retry_cnt", attr.retry_cnt.into(), MAX_RETRY.into())?;
        }
        if mask.contains(M::RNR_RETRY) {
            range("rnr_retry", attr.rnr_retry.into(), MAX_RETRY.into())?;
        }
        if mask.contains(M::RQ_PSN) {
            range("rq_psn", attr.rq_psn.into(), PSN_MASK.into())?;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            range(
                "max_rd_atomic",
                attr.max_rd_atomic.into(),
                device.attr.max_qp_init_rd_atom.into(),
            )?;
        }
        if mask.contains(M::ALT_PATH) {
            // Linux refuses alternate paths on RoCE ports (`_ib_modify_qp`).
            return Err(Cause::UnsupportedAttribute {
                attr: "alt_ah_attr",
            });
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            range(
                "min_rnr_timer",
                attr.min_rnr_timer.into(),
                MAX_TIMER_CODE.into(),
            )?;
        }
        if mask.contains(M::SQ_PSN) {
            range("sq_psn", attr.sq_psn.into(), PSN_MASK.into())?;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            range(
                "max_dest_rd_atomic",
                attr.max_dest_rd_atomic.into(),
                device.attr.max_qp_rd_atom.into(),
            )?;
        }
        if mask.contains(M::DEST_QPN) {
            range("dest_qp_num", attr.dest_qp_num.into(), MAX_QPN.into())?;
        }
        Ok(())
    }

    /// ibv_modify_qp(3): checks everything ([`Self::check_modify`]), then applies the attributes
    /// named by `mask` and the state change. On error nothing changes.
    ///
    /// Entering RESET discards posted receive WRs without completions and returns every
    /// attribute to its default; entering SQD starts draining (see [`Self::finish_sq_drain`]);
    /// entering ERR leaves flushing to the engine (it completes every WR with
    /// IBV_WC_WR_FLUSH_ERR).
    ///
    /// # Errors
    /// As [`Self::check_modify`].
    pub fn modify(
        &mut self,
        attr: &QpAttr,
        mask: QpAttrMask,
        device: &Device,
    ) -> Result<ModifyOutcome, Cause> {
        use QpAttrMask as M;
        let (from, to) = self.check_modify(attr, mask, device)?;
        let a = &mut self.attr;
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(M::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::PATH_MIG_STATE) {
            a.path_mig_state = attr.path_mig_state;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        match to {
            QpState::Reset => {
                self.attr = QpAttr::default();
                self.sq_draining = false;
                if let Some(rq) = &mut self.rq {
                    rq.clear();
                }
            }
            QpState::Sqd if from != QpState::Sqd => self.sq_draining = true,
            QpState::Err => self.sq_draining = false,
            _ => {}
        }
        self.attr.qp_state = to;
        self.attr.cur_qp_state = to;
        Ok(ModifyOutcome { from, to })
    }

    /// The HCA moves the QP to ERR (a fatal completion error, a CQ overrun). Returns the
    /// previous state. The engine then flushes every WR.
    pub fn enter_error(&mut self) -> QpState {
        let from = self.attr.qp_state;
        self.attr.qp_state = QpState::Err;
        self.attr.cur_qp_state = QpState::Err;
        self.sq_draining = false;
        from
    }

    /// The HCA moves a UC or UD QP from RTS or SQD to SQE after a send WR failed (IBTA §10.3.1
    /// "Send Queue Error"); receives go on. An RC QP goes to ERR instead.
    ///
    /// # Errors
    /// [`Cause::InvalidTransition`] for an RC QP or from any other state.
    pub fn enter_sq_error(&mut self) -> Result<(), Cause> {
        let from = self.attr.qp_state;
        if self.qp_type == QpType::Rc || !matches!(from, QpState::Rts | QpState::Sqd) {
            return Err(Cause::InvalidTransition {
                qp_type: self.qp_type,
                from,
                to: QpState::Sqe,
            });
        }
        self.attr.qp_state = QpState::Sqe;
        self.attr.cur_qp_state = QpState::Sqe;
        self.sq_draining = false;
        Ok(())
    }

    /// The engine reports that an SQD QP's send queue has drained. Returns whether
    /// IBV_EVENT_SQ_DRAINED is due (the QP was draining and `en_sqd_async_notify` is set).
    pub fn finish_sq_drain(&mut self) -> bool {
        let was = self.sq_draining && self.attr.qp_state == QpState::Sqd;
        self.sq_draining = false;
        was && self.attr.en_sqd_async_notify
    }

    /// The limits send WRs of this QP are checked against.
    pub fn send_limits(&self, device: &Device) -> SendLimits {
        SendLimits {
            qp_type: self.qp_type,
            max_send_sge: self.cap.max_send_sge,
            max_inline_data: self.cap.max_inline_data,
            max_sge_rd: device.attr.max_sge_rd,
            max_msg_sz: device.port.attr.max_msg_sz,
            atomic_cap: device.attr.atomic_cap,
        }
    }

    /// Checks a send WR before the engine queues it (rxe_post_send, validate_send_wr): the QP
    /// must be in RTS or later, then [`validate_send_wr`]. `signaled` includes `sq_sig_all`.
    ///
    /// # Errors
    /// [`Cause::WrongState`], and the errors of [`validate_send_wr`].
    pub fn validate_send_wr(&self, wr: &SendWr<'_>, device: &Device) -> Result<SendWrInfo, Cause> {
        let state = self.attr.qp_state;
        if !state.accepts_send() {
            return Err(Cause::WrongState { state });
        }
        let mut info = validate_send_wr(wr, &self.send_limits(device))?;
        info.signaled |= self.sq_sig_all;
        Ok(info)
    }

    /// ibv_post_recv(3) on this QP: checks the state and queues the WR, or changes nothing.
    ///
    /// # Errors
    /// [`Cause::WrongState`] in RESET, [`Cause::HasSrq`] for a QP using an SRQ, then the errors of
    /// [`RecvQueue::post`].
    pub fn post_recv(&mut self, wr: &RecvWr<'_>, device: &Device) -> Result<(), Cause> {
        let state = self.attr.qp_state;
        if !state.accepts_recv() {
            return Err(Cause::WrongState { state });
        }
        let rq = self.rq.as_mut().ok_or(Cause::HasSrq)?;
        rq.post(wr, device.port.attr.max_msg_sz)
    }
}

/// A QPN that names no QP.
pub(crate) fn no_such_qp(qpn: u32) -> Cause {
    Cause::NoSuchObject {
        object: Object::Qp,
        id: qpn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::gid::Gid;
    use crate::verbs::table::Handle;
    use crate::verbs::wr::{SendFlags, SendOp, Sge, UdDest};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;
    use QpAttrMask as M;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    const ERR: QpState = QpState::Err;

    const PD: PdHandle = Handle::from_raw(1, 0);
    const CQ: CqHandle = Handle::from_raw(1, 0);

    fn device() -> Device {
        Device::soft_roce([2, 0, 0, 0, 0, 1], 1500)
    }

    fn init(qp_type: QpType) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            send_cq: CQ,
            recv_cq: CQ,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        }
    }

    fn full_attr(to: QpState, cur: QpState) -> QpAttr {
        QpAttr {
            qp_state: to,
            cur_qp_state: cur,
            path_mtu: PathMtu::Mtu1024,
            path_mig_state: MigState::Armed,
            qkey: 0x1111_1111,
            rq_psn: 0x00ab_cdef,
            sq_psn: 0x0012_3456,
            dest_qp_num: 0x11,
            qp_access_flags: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            cap: QpCap::default(),
            ah_attr: AhAttr {
                dgid: Gid::link_local_from_mac([2, 0, 0, 0, 0, 2]),
                sgid_index: 1,
                ..AhAttr::default()
            },
            pkey_index: 0,
            en_sqd_async_notify: true,
            sq_draining: false,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }

    /// The oracle: the kernel's qp_state_table for RC/UC/UD, transcribed independently as rows
    /// of (from, to, [RC, UC, UD] as Option<(required, optional)>).
    type Entry = Option<(QpAttrMask, QpAttrMask)>;
    fn oracle(qp_type: QpType, from: QpState, to: QpState) -> Entry {
        let e = M::empty();
        let all3 = |r: Entry| [r, r, r];
        let rows: Vec<(QpState, QpState, [Entry; 3])> = vec![
            (Reset, Reset, all3(Some((e, e)))),
            (
                Reset,
                Init,
                [
                    Some((M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, e)),
                    Some((M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, e)),
                    Some((M::PKEY_INDEX | M::PORT | M::QKEY, e)),
                ],
            ),
            (Init, Reset, all3(Some((e, e)))),
            (Init, ERR, all3(Some((e, e)))),
            (
                Init,
                Init,
                [
                    Some((e, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)),
                    Some((e, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)),
                    Some((e, M::PKEY_INDEX | M::PORT | M::QKEY)),
                ],
            ),
            (
                Init,
                Rtr,
                [
                    Some((
                        M::AV
                            | M::PATH_MTU
                            | M::DEST_QPN
                            | M::RQ_PSN
                            | M::MAX_DEST_RD_ATOMIC
                            | M::MIN_RNR_TIMER,
                        M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                    )),
                    Some((
                        M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                        M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                    )),
                    Some((e, M::PKEY_INDEX | M::QKEY)),
                ],
            ),
            (Rtr, Reset, all3(Some((e, e)))),
            (Rtr, ERR, all3(Some((e, e)))),
            (
                Rtr,
                Rts,
                [
                    Some((
                        M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                        M::CUR_STATE
                            | M::ALT_PATH
                            | M::ACCESS_FLAGS
                            | M::MIN_RNR_TIMER
                            | M::PATH_MIG_STATE,
                    )),
                    Some((
                        M::SQ_PSN,
                        M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
                    )),
                    Some((M::SQ_PSN, M::CUR_STATE | M::QKEY)),
                ],
            ),
            (Rts, Reset, all3(Some((e, e)))),
            (Rts, ERR, all3(Some((e, e)))),
            (
                Rts,
                Rts,
                [
                    Some((
                        e,
                        M::CUR_STATE
                            | M::ACCESS_FLAGS
                            | M::ALT_PATH
                            | M::PATH_MIG_STATE
                            | M::MIN_RNR_TIMER,
                    )),
                    Some((
                        e,
                        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
                    )),
                    Some((e, M::CUR_STATE | M::QKEY)),
                ],
            ),
            (Rts, Sqd, all3(Some((e, M::EN_SQD_ASYNC_NOTIFY)))),
            (Sqd, Reset, all3(Some((e, e)))),
            (Sqd, ERR, all3(Some((e, e)))),
            (
                Sqd,
                Rts,
                [
                    Some((
                        e,
                        M::CUR_STATE
                            | M::ALT_PATH
                            | M::ACCESS_FLAGS
                            | M::MIN_RNR_TIMER
                            | M::PATH_MIG_STATE,
                    )),
                    Some((
                        e,
                        M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
                    )),
                    Some((e, M::CUR_STATE | M::QKEY)),
                ],
            ),
            (
                Sqd,
                Sqd,
                [
                    Some((
                        e,
                        M::PORT
                            | M::AV
                            | M::TIMEOUT
                            | M::RETRY_CNT
                            | M::RNR_RETRY
                            | M::MAX_QP_RD_ATOMIC
                            | M::MAX_DEST_RD_ATOMIC
                            | M::ALT_PATH
                            | M::ACCESS_FLAGS
                            | M::PKEY_INDEX
                            | M::MIN_RNR_TIMER
                            | M::PATH_MIG_STATE,
                    )),
                    Some((
                        e,
                        M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
                    )),
                    Some((e, M::PKEY_INDEX | M::QKEY)),
                ],
            ),
            (Sqe, Reset, all3(Some((e, e)))),
            (Sqe, ERR, all3(Some((e, e)))),
            (
                Sqe,
                Rts,
                [
                    None,
                    Some((e, M::CUR_STATE | M::ACCESS_FLAGS)),
                    Some((e, M::CUR_STATE | M::QKEY)),
                ],
            ),
            (ERR, Reset, all3(Some((e, e)))),
            (ERR, ERR, all3(Some((e, e)))),
        ];
        let col = match qp_type {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
        };
        rows.iter()
            .find(|(f, t, _)| *f == from && *t == to)
            .and_then(|(_, _, r)| r[col])
    }

    fn modify_required(qp: &mut Qp, to: QpState, d: &Device) {
        let (req, _) = oracle(qp.qp_type(), qp.state(), to).unwrap();
        qp.modify(&full_attr(to, qp.state()), req | M::STATE, d)
            .unwrap_or_else(|e| panic!("{} -> {to}: {e}", qp.state()));
    }

    /// A QP of `qp_type` in `state`, with its send queue drained if in SQD. `None` for RC in SQE.
    fn qp_in(qp_type: QpType, state: QpState, d: &Device) -> Option<Qp> {
        let mut qp = Qp::new(0x20, PD, &init(qp_type), d).unwrap();
        let path: &[QpState] = match state {
            Reset => &[],
            Init => &[Init],
            Rtr => &[Init, Rtr],
            Rts | Sqe => &[Init, Rtr, Rts],
            Sqd => &[Init, Rtr, Rts, Sqd],
            ERR => &[Init, ERR],
        };
        for &s in path {
            modify_required(&mut qp, s, d);
        }
        if state == Sqe {
            qp.enter_sq_error().ok()?;
        }
        if state == Sqd {
            qp.finish_sq_drain();
        }
        assert_eq!(qp.state(), state);
        Some(qp)
    }

    /// Calls `f(type, from, to, required, optional, qp)` for every transition the kernel table
    /// allows, with `qp` a QP of that type in `from` (none for RC in SQE).
    fn for_each_allowed_transition(
        d: &Device,
        mut f: impl FnMut(QpType, QpState, QpState, QpAttrMask, QpAttrMask, Qp),
    ) {
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    if let (Some((req, opt)), Some(qp)) = (oracle(t, from, to), qp_in(t, from, d)) {
                        f(t, from, to, req, opt, qp);
                    }
                }
            }
        }
    }

    #[test]
    fn implementation_matches_the_kernel_table() {
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let got = transition_rule(t, from, to).map(|r| (r.required, r.optional));
                    assert_eq!(got, oracle(t, from, to), "{t} {from}->{to}");
                }
            }
        }
    }

    #[test]
    fn every_transition_with_exactly_the_required_attributes() {
        let d = device();
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let Some(mut qp) = qp_in(t, from, &d) else {
                        assert_eq!((t, from), (QpType::Rc, Sqe));
                        continue;
                    };
                    let before = qp.clone();
                    let rule = oracle(t, from, to);
                    let req = rule.map_or(M::empty(), |(r, _)| r);
                    let r = qp.modify(&full_attr(to, from), req | M::STATE, &d);
                    match rule {
                        Some(_) => {
                            assert_eq!(r, Ok(ModifyOutcome { from, to }), "{t} {from}->{to}");
                            assert_eq!(qp.state(), to);
                        }
                        None => {
                            assert_eq!(
                                r,
                                Err(Cause::InvalidTransition {
                                    qp_type: t,
                                    from,
                                    to
                                }),
                                "{t} {from}->{to}"
                            );
                            assert_eq!(qp, before, "a failed modify changes nothing");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_missing_required_attribute_is_named() {
        let d = device();
        for_each_allowed_transition(&d, |t, from, to, req, _, qp| {
            for (_, bit) in req.iter_names() {
                let mut q = qp.clone();
                let r = q.modify(&full_attr(to, from), (req - bit) | M::STATE, &d);
                assert_eq!(
                    r,
                    Err(Cause::MissingAttributes {
                        qp_type: t,
                        from,
                        to,
                        missing: bit
                    })
                );
                assert_eq!(q, qp);
            }
        });
    }

    #[test]
    fn every_disallowed_attribute_is_refused() {
        let d = device();
        for_each_allowed_transition(&d, |t, from, to, req, opt, qp| {
            let mut bits: Vec<QpAttrMask> = QpAttrMask::all().iter().collect();
            bits.push(QpAttrMask::from_bits_retain(1 << 30));
            for bit in bits {
                if (req | opt | M::STATE).contains(bit) {
                    continue;
                }
                let mut q = qp.clone();
                let r = q.modify(&full_attr(to, from), req | bit | M::STATE, &d);
                assert_eq!(
                    r,
                    Err(Cause::DisallowedAttributes {
                        qp_type: t,
                        from,
                        to,
                        extra: bit
                    }),
                    "{t} {from}->{to} {bit:?}"
                );
                assert_eq!(q, qp);
            }
        });
    }

    #[test]
    fn every_optional_attribute_is_accepted_and_applied() {
        let d = device();
        for_each_allowed_transition(&d, |t, from, to, req, opt, qp| {
            let attr = full_attr(to, from);
            let mut q = qp.clone();
            let mask = req | (opt - M::ALT_PATH) | M::STATE;
            q.modify(&attr, mask, &d)
                .unwrap_or_else(|e| panic!("{t} {from}->{to}: {e}"));
            if to != Reset {
                let got = q.query();
                if mask.contains(M::QKEY) {
                    assert_eq!(got.qkey, attr.qkey);
                }
                if mask.contains(M::SQ_PSN) {
                    assert_eq!(got.sq_psn, attr.sq_psn);
                }
                if mask.contains(M::AV) {
                    assert_eq!(got.ah_attr, attr.ah_attr);
                }
                if mask.contains(M::PATH_MIG_STATE) {
                    assert_eq!(got.path_mig_state, attr.path_mig_state);
                }
            }
            if opt.contains(M::ALT_PATH) {
                let mut q = qp.clone();
                assert_eq!(
                    q.modify(&attr, req | M::ALT_PATH | M::STATE, &d),
                    Err(Cause::UnsupportedAttribute {
                        attr: "alt_ah_attr"
                    })
                );
                assert_eq!(q, qp);
            }
        });
    }

    #[test]
    fn man_page_examples() {
        let d = device();
        // RESET->INIT for RC needs PKEY_INDEX, PORT, ACCESS_FLAGS (ibv_modify_qp(3)).
        let mut qp = Qp::new(0x20, PD, &init(QpType::Rc), &d).unwrap();
        let a = full_attr(Init, Reset);
        assert!(matches!(
            qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT, &d),
            Err(Cause::MissingAttributes { missing, .. }) if missing == M::ACCESS_FLAGS
        ));
        // A UD QP needs QKEY instead and refuses ACCESS_FLAGS.
        let mut ud = Qp::new(0x21, PD, &init(QpType::Ud), &d).unwrap();
        assert!(matches!(
            ud.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, &d),
            Err(Cause::MissingAttributes { missing, .. }) if missing == M::QKEY
        ));
        assert!(ud
            .modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY, &d)
            .is_ok());
        // RESET->ERR does not exist in Linux's table.
        assert!(matches!(
            qp.modify(&full_attr(ERR, Reset), M::STATE, &d),
            Err(Cause::InvalidTransition { .. })
        ));
        // Without STATE the transition is to the current state: INIT->INIT changes attributes.
        modify_required(&mut qp, Init, &d);
        let mut b = full_attr(Init, Init);
        b.qp_access_flags = AccessFlags::REMOTE_READ;
        assert_eq!(
            qp.modify(&b, M::ACCESS_FLAGS, &d),
            Ok(ModifyOutcome {
                from: Init,
                to: Init
            })
        );
        assert_eq!(qp.attr().qp_access_flags, AccessFlags::REMOTE_READ);
        // RTR->RTR does not exist.
        modify_required(&mut qp, Rtr, &d);
        assert!(matches!(
            qp.modify(&b, M::empty(), &d),
            Err(Cause::InvalidTransition { .. })
        ));
    }

    fn value_case(
        t: QpType,
        from: QpState,
        to: QpState,
        bit: QpAttrMask,
        f: impl Fn(&mut QpAttr),
        d: &Device,
    ) -> Result<ModifyOutcome, Cause> {
        let mut qp = qp_in(t, from, d).unwrap();
        let before = qp.clone();
        let (req, _) = oracle(t, from, to).unwrap();
        let mut a = full_attr(to, from);
        f(&mut a);
        let r = qp.modify(&a, req | bit | M::STATE, d);
        if r.is_err() {
            assert_eq!(qp, before, "a failed modify changes nothing");
        }
        r
    }

    fn out_of_range(r: Result<ModifyOutcome, Cause>, name: &str) {
        match r {
            Err(Cause::OutOfRange { attr, .. }) => assert_eq!(attr, name),
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn value_ranges() {
        let d = device();
        let rc = QpType::Rc;
        let e = M::empty();
        // 24-bit PSNs.
        out_of_range(
            value_case(rc, Init, Rtr, e, |a| a.rq_psn = 1 << 24, &d),
            "rq_psn",
        );
        assert!(value_case(rc, Init, Rtr, e, |a| a.rq_psn = PSN_MASK, &d).is_ok());
        out_of_range(
            value_case(rc, Rtr, Rts, e, |a| a.sq_psn = 1 << 24, &d),
            "sq_psn",
        );
        assert!(value_case(rc, Rtr, Rts, e, |a| a.sq_psn = PSN_MASK, &d).is_ok());
        out_of_range(
            value_case(QpType::Ud, Rtr, Rts, e, |a| a.sq_psn = u32::MAX, &d),
            "sq_psn",
        );
        // Timers and retry counts.
        out_of_range(
            value_case(rc, Rtr, Rts, e, |a| a.timeout = 32, &d),
            "timeout",
        );
        assert!(value_case(rc, Rtr, Rts, e, |a| a.timeout = 31, &d).is_ok());
        out_of_range(
            value_case(rc, Rtr, Rts, e, |a| a.retry_cnt = 8, &d),
            "retry_cnt",
        );
        out_of_range(
            value_case(rc, Rtr, Rts, e, |a| a.rnr_retry = 8, &d),
            "rnr_retry",
        );
        out_of_range(
            value_case(rc, Init, Rtr, e, |a| a.min_rnr_timer = 32, &d),
            "min_rnr_timer",
        );
        assert!(value_case(rc, Init, Rtr, e, |a| a.min_rnr_timer = 31, &d).is_ok());
        // Read/atomic depths against the device.
        out_of_range(
            value_case(rc, Rtr, Rts, e, |a| a.max_rd_atomic = 129, &d),
            "max_rd_atomic",
        );
        assert!(value_case(rc, Rtr, Rts, e, |a| a.max_rd_atomic = 128, &d).is_ok());
        out_of_range(
            value_case(rc, Init, Rtr, e, |a| a.max_dest_rd_atomic = 129, &d),
            "max_dest_rd_atomic",
        );
        // QPN.
        out_of_range(
            value_case(QpType::Uc, Init, Rtr, e, |a| a.dest_qp_num = 1 << 24, &d),
            "dest_qp_num",
        );
        // Path MTU against the port's max_mtu.
        let mut small = device();
        small.port.attr.max_mtu = PathMtu::Mtu1024;
        out_of_range(
            value_case(rc, Init, Rtr, e, |a| a.path_mtu = PathMtu::Mtu2048, &small),
            "path_mtu",
        );
        assert!(value_case(rc, Init, Rtr, e, |a| a.path_mtu = PathMtu::Mtu1024, &small).is_ok());
        // Port, P_Key index.
        assert!(matches!(
            value_case(rc, Reset, Init, e, |a| a.port_num = 2, &d),
            Err(Cause::NoSuchObject {
                object: Object::Port,
                id: 2
            })
        ));
        out_of_range(
            value_case(rc, Reset, Init, e, |a| a.pkey_index = 64, &d),
            "pkey_index",
        );
        assert!(matches!(
            value_case(rc, Reset, Init, e, |a| a.pkey_index = 1, &d),
            Err(Cause::InvalidValue {
                attr: "pkey_index",
                ..
            })
        ));
        // Access flags.
        assert!(matches!(
            value_case(
                rc,
                Reset,
                Init,
                e,
                |a| a.qp_access_flags = AccessFlags::from_bits_retain(1 << 9),
                &d
            ),
            Err(Cause::AccessFlags { .. })
        ));
        let mut no_atomics = device();
        no_atomics.attr.atomic_cap = AtomicCap::None;
        assert!(matches!(
            value_case(rc, Reset, Init, e, |_| {}, &no_atomics),
            Err(Cause::AccessFlags { .. })
        ));
        // The address vector.
        assert!(matches!(
            value_case(rc, Init, Rtr, e, |a| a.ah_attr.sgid_index = 9, &d),
            Err(Cause::NoSuchObject {
                object: Object::Gid,
                ..
            })
        ));
        out_of_range(
            value_case(rc, Init, Rtr, e, |a| a.ah_attr.flow_label = 1 << 20, &d),
            "ah_attr.grh.flow_label",
        );
        // SQD->SQD with PORT (RC only) validates the port too.
        assert!(matches!(
            value_case(rc, Sqd, Sqd, M::PORT, |a| a.port_num = 0, &d),
            Err(Cause::NoSuchObject { .. })
        ));
    }

    #[test]
    fn cur_state_is_checked() {
        let d = device();
        let mut qp = qp_in(QpType::Rc, Rtr, &d).unwrap();
        let before = qp.clone();
        let (req, _) = oracle(QpType::Rc, Rtr, Rts).unwrap();
        let r = qp.modify(&full_attr(Rts, Init), req | M::STATE | M::CUR_STATE, &d);
        assert_eq!(
            r,
            Err(Cause::CurStateMismatch {
                given: Init,
                actual: Rtr
            })
        );
        assert_eq!(qp, before);
        assert!(qp
            .modify(&full_attr(Rts, Rtr), req | M::STATE | M::CUR_STATE, &d)
            .is_ok());
        // CUR_STATE is not accepted from INIT even when it matches (Linux: only from RTR, RTS,
        // SQD, SQE).
        let mut qp = qp_in(QpType::Rc, Init, &d).unwrap();
        assert!(matches!(
            qp.modify(&full_attr(Init, Init), M::CUR_STATE, &d),
            Err(Cause::DisallowedAttributes { .. })
        ));
    }

    #[test]
    fn sqd_draining_allows_only_err() {
        let d = device();
        for t in QpType::ALL {
            let mut qp = qp_in(t, Rts, &d).unwrap();
            let mut a = full_attr(Sqd, Rts);
            a.en_sqd_async_notify = true;
            qp.modify(&a, M::STATE | M::EN_SQD_ASYNC_NOTIFY, &d)
                .unwrap();
            assert!(qp.sq_draining());
            assert!(qp.query().sq_draining);
            for to in [Rts, Sqd, Reset] {
                assert_eq!(
                    qp.clone().modify(&full_attr(to, Sqd), M::STATE, &d),
                    Err(Cause::SqDraining)
                );
            }
            let mut errd = qp.clone();
            assert!(errd.modify(&full_attr(ERR, Sqd), M::STATE, &d).is_ok());
            assert!(qp.finish_sq_drain(), "SQ_DRAINED event due");
            assert!(!qp.finish_sq_drain(), "only once");
            assert!(qp.modify(&full_attr(Rts, Sqd), M::STATE, &d).is_ok());
        }
    }

    #[test]
    fn hca_driven_states() {
        let d = device();
        let mut rc = qp_in(QpType::Rc, Rts, &d).unwrap();
        assert!(rc.enter_sq_error().is_err(), "RC never enters SQE");
        assert_eq!(rc.enter_error(), Rts);
        assert_eq!(rc.state(), ERR);
        for t in [QpType::Uc, QpType::Ud] {
            let mut qp = qp_in(t, Rtr, &d).unwrap();
            assert!(qp.enter_sq_error().is_err(), "only from RTS or SQD");
            modify_required(&mut qp, Rts, &d);
            qp.enter_sq_error().unwrap();
            assert_eq!(qp.state(), Sqe);
            // SQE -> RTS recovers.
            assert!(qp.modify(&full_attr(Rts, Sqe), M::STATE, &d).is_ok());
        }
    }

    #[test]
    fn reset_clears_attributes_and_receive_queue() {
        let d = device();
        let mut qp = qp_in(QpType::Rc, Rts, &d).unwrap();
        qp.post_recv(
            &RecvWr {
                wr_id: 1,
                sg_list: &[],
            },
            &d,
        )
        .unwrap();
        qp.modify(&full_attr(Reset, Rts), M::STATE, &d).unwrap();
        assert_eq!(qp.rq().unwrap().len(), 0);
        let q = qp.query();
        assert_eq!(q.sq_psn, 0);
        assert_eq!(q.dest_qp_num, 0);
        assert_eq!(q.qp_state, Reset);
        assert_eq!(q.cap, *qp.cap(), "capabilities survive a reset");
    }

    #[test]
    fn capabilities_checked_and_provided_as_rxe() {
        let d = device();
        let mut i = init(QpType::Rc);
        let r = Qp::new(0x20, PD, &i, &d).unwrap();
        assert_eq!(
            *r.cap(),
            QpCap {
                max_send_wr: 31,
                max_recv_wr: 31,
                max_send_sge: 4,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            "64 inline bytes make room for 4 SGEs; depths round to 2^n - 1"
        );
        i.cap.max_send_sge = 33;
        assert!(matches!(
            Qp::new(0x20, PD, &i, &d),
            Err(Cause::OutOfRange {
                attr: "cap.max_send_sge",
                ..
            })
        ));
        i.cap.max_send_sge = 1;
        i.cap.max_inline_data = 513;
        assert!(matches!(
            Qp::new(0x20, PD, &i, &d),
            Err(Cause::OutOfRange {
                attr: "cap.max_inline_data",
                ..
            })
        ));
        i.cap.max_inline_data = 0;
        i.cap.max_recv_wr = d.attr.max_qp_wr + 1;
        assert!(matches!(
            Qp::new(0x20, PD, &i, &d),
            Err(Cause::OutOfRange {
                attr: "cap.max_recv_wr",
                ..
            })
        ));
        i.srq = Some(Handle::from_raw(1, 0));
        let q = Qp::new(0x20, PD, &i, &d).unwrap();
        assert_eq!((q.cap().max_recv_wr, q.cap().max_recv_sge), (0, 0));
        assert!(q.rq().is_none());
        assert_eq!(q.cap().max_inline_data, 16, "one SGE's worth");
        assert!(Qp::new(1 << 24, PD, &init(QpType::Rc), &d).is_err());
    }

    fn sge() -> Sge {
        Sge {
            addr: 0,
            length: 8,
            lkey: 0x100,
        }
    }

    #[test]
    fn post_needs_the_right_state() {
        let d = device();
        let sg = [sge()];
        for t in QpType::ALL {
            let op = if t == QpType::Ud {
                SendOp::UdSend {
                    dest: UdDest {
                        ah: Handle::from_raw(1, 0),
                        remote_qpn: 0x11,
                        remote_qkey: 1,
                    },
                    imm_data: None,
                }
            } else {
                SendOp::Send
            };
            let wr = SendWr {
                wr_id: 5,
                sg_list: &sg,
                op,
                send_flags: SendFlags::empty(),
            };
            for s in QpState::ALL {
                let Some(mut qp) = qp_in(t, s, &d) else {
                    continue;
                };
                let send = qp.validate_send_wr(&wr, &d);
                assert_eq!(send.is_ok(), matches!(s, Rts | Sqd | Sqe | ERR), "{t} {s}");
                if let Err(e) = send {
                    assert_eq!(e, Cause::WrongState { state: s });
                }
                let recv = qp.post_recv(
                    &RecvWr {
                        wr_id: 6,
                        sg_list: &sg,
                    },
                    &d,
                );
                assert_eq!(recv.is_ok(), s != Reset, "{t} {s}");
            }
        }
        let mut i = init(QpType::Rc);
        i.srq = Some(Handle::from_raw(1, 0));
        i.sq_sig_all = true;
        let mut qp = Qp::new(0x20, PD, &i, &d).unwrap();
        modify_required(&mut qp, Init, &d);
        assert_eq!(
            qp.post_recv(
                &RecvWr {
                    wr_id: 1,
                    sg_list: &[]
                },
                &d
            ),
            Err(Cause::HasSrq)
        );
        modify_required(&mut qp, Rtr, &d);
        modify_required(&mut qp, Rts, &d);
        let wr = SendWr {
            wr_id: 5,
            sg_list: &sg,
            op: SendOp::Send,
            send_flags: SendFlags::empty(),
        };
        assert!(qp.validate_send_wr(&wr, &d).unwrap().signaled, "sq_sig_all");
    }

    #[test]
    fn timers() {
        let mut a = QpAttr::default();
        assert_eq!(a.local_ack_timeout_ns(), None);
        a.timeout = 14;
        assert_eq!(a.local_ack_timeout_ns(), Some(4096 << 14));
        assert_eq!(rnr_timer_ns(0), Some(655_360_000));
        assert_eq!(rnr_timer_ns(1), Some(10_000));
        assert_eq!(rnr_timer_ns(12), Some(640_000));
        assert_eq!(rnr_timer_ns(31), Some(491_520_000));
        assert_eq!(rnr_timer_ns(32), None);
    }

    #[test]
    fn state_values_are_ibv() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(QpState::from_ibv(i as u32), Some(*s));
        }
        assert_eq!(QpState::from_ibv(7), None);
        assert_eq!(QpType::Rc as u32, 2);
        assert_eq!(QpType::Ud as u32, 4);
        assert_eq!(M::DEST_QPN.bits(), 1 << 20);
        assert_eq!(M::MAX_DEST_RD_ATOMIC.bits(), 1 << 17);
    }

    fn arb_state() -> impl Strategy<Value = QpState> {
        (0u32..7).prop_map(|v| QpState::from_ibv(v).unwrap())
    }

    proptest! {
        /// Random modify sequences: a failed modify changes nothing; a successful one lands in
        /// the target state with every masked attribute applied.
        #[test]
        fn random_modify_sequences(
            t in 0usize..3,
            steps in proptest::collection::vec(
                (arb_state(), any::<u32>(), 0u8..40, any::<u32>(), any::<bool>()), 1..40),
        ) {
            let d = device();
            let t = QpType::ALL[t];
            let mut qp = Qp::new(0x20, PD, &init(t), &d).unwrap();
            for (to, mask_bits, small, psn, with_state) in steps {
                let mut mask = QpAttrMask::from_bits_truncate(mask_bits) - M::CAP - M::RATE_LIMIT;
                if with_state { mask |= M::STATE; }
                let mut a = full_attr(to, qp.state());
                a.timeout = small;
                a.retry_cnt = small % 9;
                a.rnr_retry = small % 10;
                a.min_rnr_timer = small;
                a.sq_psn = psn >> 7;
                a.rq_psn = psn >> 7;
                let before = qp.clone();
                match qp.modify(&a, mask, &d) {
                    Ok(out) => {
                        prop_assert_eq!(out.from, before.state());
                        prop_assert_eq!(qp.state(), out.to);
                        if mask.contains(M::STATE) { prop_assert_eq!(out.to, to); }
                        if out.to != Reset {
                            let q = qp.query();
                            if mask.contains(M::SQ_PSN) { prop_assert_eq!(q.sq_psn, a.sq_psn); }
                            if mask.contains(M::TIMEOUT) { prop_assert_eq!(q.timeout, a.timeout); }
                            prop_assert!(q.sq_psn <= PSN_MASK && q.rq_psn <= PSN_MASK);
                            prop_assert!(q.timeout <= 31 && q.retry_cnt <= 7 && q.rnr_retry <= 7);
                        }
                        if out.to == Sqd { qp.finish_sq_drain(); }
                    }
                    Err(_) => prop_assert_eq!(&qp, &before),
                }
            }
        }
    }
}
