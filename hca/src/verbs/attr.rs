//! The plain attribute types of the verbs: QP types and states, the modify-QP attribute mask,
//! access rights, work-request opcodes and flags, completion opcodes, statuses and flags.
//!
//! Every other module of the object model (and its error type) names these, so they live in this
//! leaf module, which imports nothing of the crate: the values are libibverbs' (`enum ibv_qp_type`,
//! `enum ibv_qp_state`, `enum ibv_qp_attr_mask`, `enum ibv_access_flags`, `enum ibv_wr_opcode`,
//! `enum ibv_send_flags`, `enum ibv_wc_opcode`, `enum ibv_wc_status`, `enum ibv_wc_flags`;
//! rdma-core `libibverbs/verbs.h`), so that a C ABI layer translates them by value.

use bitflags::bitflags;
use core::fmt;

/// The first QPN given to a user QP (rxe `RXE_MIN_QP_INDEX`).
pub const MIN_QPN: u32 = 16;
/// The largest QPN (24 bits, the BTH DestQP field).
pub const MAX_QPN: u32 = 0x00ff_ffff;
/// Most QPs one device holds (2^20, rxe's default `max_qp`): live QPNs then fill at most 1/16 of
/// the QPN space, so a random new QPN almost always takes one draw, and a guessed QPN names a
/// live QP with probability at most 1/16 (see [`crate::verbs::qp`]).
pub const MAX_QPS: u32 = 1 << 20;
/// Mask of a 24-bit PSN (IBTA vol. 1 ch. 9, BTH).
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// Largest `timeout`, `min_rnr_timer` code (5 bits).
pub const MAX_TIMER_CODE: u8 = 31;
/// Largest `retry_cnt`, `rnr_retry` (3 bits; `rnr_retry` 7 means "retry forever").
pub const MAX_RETRY: u8 = 7;

/// Transport service of a QP (`enum ibv_qp_type`; discriminants are the ibv values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc = 2,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc = 3,
    /// Unreliable datagram (`IBV_QPT_UD`).
    Ud = 4,
}

impl QpType {
    /// All three types.
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

/// QP state (`enum ibv_qp_state`, IBTA vol. 1 §10.3.1; discriminants are the ibv values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpState {
    /// Created or reset: no WR is accepted (`IBV_QPS_RESET`).
    Reset = 0,
    /// Initialized: receive WRs may be posted, nothing is processed (`IBV_QPS_INIT`).
    Init = 1,
    /// Ready to receive: incoming packets are processed (`IBV_QPS_RTR`).
    Rtr = 2,
    /// Ready to send (`IBV_QPS_RTS`).
    Rts = 3,
    /// Send queue drain(ing/ed): new send WRs are queued but not started (`IBV_QPS_SQD`).
    Sqd = 4,
    /// Send queue error (UC/UD only): a send WR failed; receives continue (`IBV_QPS_SQE`).
    Sqe = 5,
    /// Error: every WR completes with IBV_WC_WR_FLUSH_ERR (`IBV_QPS_ERR`).
    Err = 6,
}

impl QpState {
    /// All seven states.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The state with ibv value `value`.
    pub fn from_ibv(value: u32) -> Option<QpState> {
        QpState::ALL.get(value as usize).copied()
    }

    /// Whether send WRs may be posted (RTS or later: RTS, SQD, SQE, ERR; rxe_post_send). In SQE
    /// and ERR they complete with IBV_WC_WR_FLUSH_ERR.
    pub const fn accepts_send(self) -> bool {
        matches!(
            self,
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
        )
    }

    /// Whether receive WRs may be posted (any state but RESET; IBTA C10-97.2.1, rxe_post_recv).
    pub const fn accepts_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// Path migration state (`enum ibv_mig_state`, IBTA vol. 1 ch. 17). RoCE does not migrate paths;
/// the value is stored and reported only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MigState {
    /// `IBV_MIG_MIGRATED`.
    #[default]
    Migrated = 0,
    /// `IBV_MIG_REARM`.
    Rearm = 1,
    /// `IBV_MIG_ARMED`.
    Armed = 2,
}

bitflags! {
    /// Which [`QpAttr`] fields an ibv_modify_qp(3) call sets (`enum ibv_qp_attr_mask`; the bit
    /// values are libibverbs').
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`: the new state.
        const STATE = 1 << 0;
        /// `cur_qp_state`: the state the caller assumes the QP is in.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`: the primary path address vector.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and the other alternate path fields (not supported on RoCE).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap` (no transition accepts it).
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit` (raw packet QPs only; no RC/UC/UD transition accepts it).
        const RATE_LIMIT = 1 << 25;
    }
}

bitflags! {
    /// MR and QP access rights (`enum ibv_access_flags`, ibv_reg_mr(3), IBTA vol. 1 §10.6).
    ///
    /// Local read access is always granted. Rule (ibv_reg_mr(3), kernel `ib_check_mr_access`):
    /// REMOTE_WRITE or REMOTE_ATOMIC require LOCAL_WRITE.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The HCA may write the region for local operations (receive buffers, RDMA READ
        /// destinations, atomic results).
        const LOCAL_WRITE = 1 << 0;
        /// Peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA READ from the region.
        const REMOTE_READ = 1 << 2;
        /// Peers may perform atomic operations on the region.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

impl AccessFlags {
    /// All remote access rights.
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);
}

/// Send WR opcodes (`enum ibv_wr_opcode`); the discriminants are the ibv values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm = 1,
    /// `IBV_WR_SEND`.
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm = 3,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    AtomicCmpAndSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    AtomicFetchAndAdd = 6,
    /// `IBV_WR_LOCAL_INV`.
    LocalInv = 7,
    /// `IBV_WR_BIND_MW` (memory windows are not implemented yet; no [`SendOp`](super::wr::SendOp) builds it).
    BindMw = 8,
    /// `IBV_WR_SEND_WITH_INV`.
    SendWithInv = 9,
}

impl WrOpcode {
    /// The ibv name.
    pub const fn as_str(self) -> &'static str {
        match self {
            WrOpcode::RdmaWrite => "RDMA_WRITE",
            WrOpcode::RdmaWriteWithImm => "RDMA_WRITE_WITH_IMM",
            WrOpcode::Send => "SEND",
            WrOpcode::SendWithImm => "SEND_WITH_IMM",
            WrOpcode::RdmaRead => "RDMA_READ",
            WrOpcode::AtomicCmpAndSwp => "ATOMIC_CMP_AND_SWP",
            WrOpcode::AtomicFetchAndAdd => "ATOMIC_FETCH_AND_ADD",
            WrOpcode::LocalInv => "LOCAL_INV",
            WrOpcode::BindMw => "BIND_MW",
            WrOpcode::SendWithInv => "SEND_WITH_INV",
        }
    }

    /// Whether a QP of type `qp_type` supports the opcode (IBTA vol. 1 table 38; rxe
    /// `rxe_wr_opcode_info`): RC supports all; UC supports SEND, SEND_WITH_IMM, RDMA_WRITE and
    /// RDMA_WRITE_WITH_IMM (UC has no invalidate opcodes on the wire); UD supports SEND and
    /// SEND_WITH_IMM. Memory windows (BIND_MW) are not implemented on any QP.
    pub const fn supported_on(self, qp_type: QpType) -> bool {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm => true,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => {
                matches!(qp_type, QpType::Rc | QpType::Uc)
            }
            WrOpcode::RdmaRead
            | WrOpcode::AtomicCmpAndSwp
            | WrOpcode::AtomicFetchAndAdd
            | WrOpcode::LocalInv
            | WrOpcode::SendWithInv => matches!(qp_type, QpType::Rc),
            WrOpcode::BindMw => false,
        }
    }

    /// Whether the opcode carries outgoing data and so may be INLINE (rxe `WR_INLINE_MASK`).
    pub const fn allows_inline(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        )
    }

    /// Whether the opcode is an atomic operation.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
}

impl fmt::Display for WrOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

bitflags! {
    /// Send WR flags (`enum ibv_send_flags`, ibv_post_send(3)).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait until earlier RDMA READs and atomics have completed before starting this WR
        /// (the fence indicator, IBTA vol. 1 ch. 10).
        const FENCE = 1 << 0;
        /// Produce a completion even on success (needed unless the QP has `sq_sig_all`).
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit: the receiver's CQ fires a solicited event.
        const SOLICITED = 1 << 2;
        /// Copy the data at post time: the SGEs' lkeys are not checked and the buffers may be
        /// reused at once. Total length at most `cap.max_inline_data`.
        const INLINE = 1 << 3;
    }
}

/// Completion status (`enum ibv_wc_status`, ibv_poll_cq(3); IBTA vol. 1 ch. 11). The
/// discriminants are the ibv values, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// The WR completed successfully (`IBV_WC_SUCCESS`).
    Success = 0,
    /// Local length error: a received message was longer than the receive buffer, or a send
    /// longer than allowed (`IBV_WC_LOC_LEN_ERR`).
    LocLenErr = 1,
    /// Local QP operation error: an internal QP consistency error, e.g. a receive WQE whose
    /// buffer could not be written (`IBV_WC_LOC_QP_OP_ERR`).
    LocQpOpErr = 2,
    /// Local EE context operation error (RD only) (`IBV_WC_LOC_EEC_OP_ERR`).
    LocEecOpErr = 3,
    /// Local protection error: an SGE's lkey, PD, bounds or access check failed
    /// (`IBV_WC_LOC_PROT_ERR`).
    LocProtErr = 4,
    /// The WR was flushed because the QP entered the error state (`IBV_WC_WR_FLUSH_ERR`).
    WrFlushErr = 5,
    /// Memory window bind error (`IBV_WC_MW_BIND_ERR`).
    MwBindErr = 6,
    /// Bad response: an unexpected transport opcode in a response (`IBV_WC_BAD_RESP_ERR`).
    BadRespErr = 7,
    /// Local access error: a protection error on a local data buffer during an RDMA READ
    /// response or atomic response (`IBV_WC_LOC_ACCESS_ERR`).
    LocAccessErr = 8,
    /// Remote invalid request: the responder NAKed the request as invalid (bad opcode, length,
    /// misaligned atomic, no receive buffer large enough) (`IBV_WC_REM_INV_REQ_ERR`).
    RemInvReqErr = 9,
    /// Remote access error: the responder NAKed an rkey, bounds or access check
    /// (`IBV_WC_REM_ACCESS_ERR`).
    RemAccessErr = 10,
    /// Remote operation error: the responder could not complete the operation
    /// (`IBV_WC_REM_OP_ERR`).
    RemOpErr = 11,
    /// Transport retry counter exceeded: no ACK after `retry_cnt` retries
    /// (`IBV_WC_RETRY_EXC_ERR`).
    RetryExcErr = 12,
    /// RNR retry counter exceeded: the responder kept answering "receiver not ready"
    /// (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExcErr = 13,
    /// Local RDD violation (RD only) (`IBV_WC_LOC_RDD_VIOL_ERR`).
    LocRddViolErr = 14,
    /// Remote invalid RD request (RD only) (`IBV_WC_REM_INV_RD_REQ_ERR`).
    RemInvRdReqErr = 15,
    /// Remote aborted the operation (`IBV_WC_REM_ABORT_ERR`).
    RemAbortErr = 16,
    /// Invalid EE context number (RD only) (`IBV_WC_INV_EECN_ERR`).
    InvEecnErr = 17,
    /// Invalid EE context state (RD only) (`IBV_WC_INV_EEC_STATE_ERR`).
    InvEecStateErr = 18,
    /// Fatal error (`IBV_WC_FATAL_ERR`).
    FatalErr = 19,
    /// Response timeout (`IBV_WC_RESP_TIMEOUT_ERR`).
    RespTimeoutErr = 20,
    /// General error (`IBV_WC_GENERAL_ERR`).
    GeneralErr = 21,
    /// Tag matching error (`IBV_WC_TM_ERR`).
    TmErr = 22,
    /// Tag matching rendezvous incomplete (`IBV_WC_TM_RNDV_INCOMPLETE`).
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// Every status, in ibv order.
    pub const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// The status with ibv value `value`.
    pub fn from_ibv(value: u32) -> Option<WcStatus> {
        WcStatus::ALL.get(value as usize).copied()
    }

    /// The ibv value.
    pub const fn ibv(self) -> u32 {
        self as u32
    }

    /// The text `ibv_wc_status_str(3)` gives for this status (rdma-core `libibverbs/enum_strs.c`).
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a completed WR was (`enum ibv_wc_opcode`). The discriminants are the ibv values; receive
/// opcodes have bit 7 set (`IBV_WC_RECV`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (with or without immediate or invalidate) completed (`IBV_WC_SEND`).
    Send = 0,
    /// An RDMA WRITE (with or without immediate) completed (`IBV_WC_RDMA_WRITE`).
    RdmaWrite = 1,
    /// An RDMA READ completed (`IBV_WC_RDMA_READ`).
    RdmaRead = 2,
    /// An atomic compare-and-swap completed (`IBV_WC_COMP_SWAP`).
    CompSwap = 3,
    /// An atomic fetch-and-add completed (`IBV_WC_FETCH_ADD`).
    FetchAdd = 4,
    /// A memory window bind completed (`IBV_WC_BIND_MW`).
    BindMw = 5,
    /// A local invalidate completed (`IBV_WC_LOCAL_INV`).
    LocalInv = 6,
    /// A receive WR consumed an incoming SEND (`IBV_WC_RECV`).
    Recv = 128,
    /// A receive WR consumed an incoming RDMA WRITE with immediate
    /// (`IBV_WC_RECV_RDMA_WITH_IMM`).
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// The send-side completion opcode of a WR opcode (rxe `wr_to_wc_opcode`).
    pub const fn from_wr(opcode: WrOpcode) -> WcOpcode {
        match opcode {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
        }
    }

    /// The ibv value.
    pub const fn ibv(self) -> u32 {
        self as u32
    }

    /// The opcode with ibv value `value` (`enum ibv_wc_opcode`), if it is one of these.
    pub const fn from_ibv(value: u32) -> Option<WcOpcode> {
        Some(match value {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => return None,
        })
    }

    /// Whether this is a receive completion (`opcode & IBV_WC_RECV`).
    pub const fn is_recv(self) -> bool {
        (self as u32) & 128 != 0
    }
}

bitflags! {
    /// Completion flags (`enum ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The first 40 bytes of the receive buffer hold a GRH (UD; for RoCEv2 over IPv4, the
        /// IPv4 header at offset 20) (`IBV_WC_GRH`).
        const GRH = 1 << 0;
        /// `imm_data` is valid (`IBV_WC_WITH_IMM`).
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified (`IBV_WC_IP_CSUM_OK`).
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid (`IBV_WC_WITH_INV`).
        const WITH_INV = 1 << 3;
    }
}
