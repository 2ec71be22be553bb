//! Work completions: what ibv_poll_cq(3) returns.
//!
//! When the HCA finishes a work request it writes a completion queue entry (CQE) that the program
//! reads as a [`WorkCompletion`]: which WR (`wr_id`), how it ended ([`WcStatus`]), what it was
//! ([`WcOpcode`]) and, for receives, how many bytes arrived and from whom. A send WR produces a
//! completion only if it was *signaled* (IBV_SEND_SIGNALED or a QP created with `sq_sig_all`) or if
//! it failed; every receive WR produces one. After an error, the QP is in the error state and every
//! WR still queued completes with [`WcStatus::WrFlushErr`] (IBTA vol. 1 ch. 10-11, ibv_poll_cq(3)).

use bitflags::bitflags;
use core::fmt;

use crate::wr::WrOpcode;

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

/// A work completion (`struct ibv_wc`, ibv_poll_cq(3)).
///
/// For an error completion only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful
/// (ibv_poll_cq(3)). `imm_data` is `Some` exactly when `wc_flags` has WITH_IMM, and
/// `invalidated_rkey` exactly when it has WITH_INV; the constructors keep that so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed WR.
    pub wr_id: u64,
    /// How the WR ended.
    pub status: WcStatus,
    /// What the WR was.
    pub opcode: WcOpcode,
    /// Vendor error syndrome (the software HCA reports 0, or the AETH syndrome of a NAK).
    pub vendor_err: u32,
    /// Bytes transferred: for receives, the message length (plus 40 GRH bytes on UD); for RDMA
    /// READ and atomics, the bytes written locally.
    pub byte_len: u32,
    /// Immediate data, host order (`ibv_wc.imm_data` holds it big-endian).
    pub imm_data: Option<u32>,
    /// The rkey a SEND with Invalidate invalidated.
    pub invalidated_rkey: Option<u32>,
    /// The local QPN.
    pub qp_num: u32,
    /// The sender's QPN (UD receives).
    pub src_qp: u32,
    /// Completion flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI only; 0).
    pub pkey_index: u16,
    /// Source LID: 0 on RoCE.
    pub slid: u16,
    /// Service level of the received packet.
    pub sl: u8,
    /// Destination LID path bits: 0 on RoCE.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// A successful completion with no immediate, invalidate or GRH.
    pub const fn success(wr_id: u64, opcode: WcOpcode, qp_num: u32, byte_len: u32) -> Self {
        WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode,
            vendor_err: 0,
            byte_len,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    /// An error completion (`byte_len` 0).
    pub const fn error(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        let mut wc = WorkCompletion::success(wr_id, opcode, qp_num, 0);
        wc.status = status;
        wc
    }

    /// A [`WcStatus::WrFlushErr`] completion for a WR flushed from a QP in the error state.
    pub const fn flush(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion::error(wr_id, WcStatus::WrFlushErr, opcode, qp_num)
    }

    /// Sets immediate data (and WITH_IMM).
    pub const fn with_imm(mut self, imm_data: u32) -> Self {
        self.imm_data = Some(imm_data);
        self.wc_flags = self.wc_flags.union(WcFlags::WITH_IMM);
        self
    }

    /// Sets the invalidated rkey (and WITH_INV).
    pub const fn with_inv(mut self, rkey: u32) -> Self {
        self.invalidated_rkey = Some(rkey);
        self.wc_flags = self.wc_flags.union(WcFlags::WITH_INV);
        self
    }

    /// Marks a UD receive whose buffer starts with the 40-byte GRH area, from QP `src_qp`.
    pub const fn with_grh(mut self, src_qp: u32) -> Self {
        self.src_qp = src_qp;
        self.wc_flags = self.wc_flags.union(WcFlags::GRH);
        self
    }

    /// Whether `imm_data` / `invalidated_rkey` agree with `wc_flags`.
    pub fn is_consistent(&self) -> bool {
        self.imm_data.is_some() == self.wc_flags.contains(WcFlags::WITH_IMM)
            && self.invalidated_rkey.is_some() == self.wc_flags.contains(WcFlags::WITH_INV)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_follow_ibv_order() {
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(s.ibv() as usize, i);
            assert_eq!(WcStatus::from_ibv(i as u32), Some(*s));
        }
        assert_eq!(WcStatus::from_ibv(24), None);
        assert_eq!(WcStatus::RemAccessErr as u32, 10);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::GeneralErr as u32, 21);
    }

    #[test]
    fn status_strings_match_ibv_wc_status_str() {
        assert_eq!(WcStatus::Success.as_str(), "success");
        assert_eq!(WcStatus::WrFlushErr.as_str(), "Work Request Flushed Error");
        assert_eq!(
            WcStatus::RetryExcErr.as_str(),
            "transport retry counter exceeded"
        );
        assert_eq!(WcStatus::RemAbortErr.as_str(), "aborted error");
        assert_eq!(
            std::format!("{}", WcStatus::RemAccessErr),
            "remote access error"
        );
    }

    #[test]
    fn opcodes() {
        assert_eq!(WcOpcode::Recv.ibv(), 128);
        assert_eq!(WcOpcode::RecvRdmaWithImm.ibv(), 129);
        assert!(WcOpcode::Recv.is_recv());
        assert!(!WcOpcode::LocalInv.is_recv());
        assert_eq!(WcOpcode::from_wr(WrOpcode::SendWithInv), WcOpcode::Send);
        assert_eq!(
            WcOpcode::from_wr(WrOpcode::RdmaWriteWithImm),
            WcOpcode::RdmaWrite
        );
        assert_eq!(
            WcOpcode::from_wr(WrOpcode::AtomicCmpAndSwp),
            WcOpcode::CompSwap
        );
    }

    #[test]
    fn constructors_keep_flags_consistent() {
        let wc = WorkCompletion::success(1, WcOpcode::Recv, 0x11, 100)
            .with_imm(0xdead_beef)
            .with_grh(0x22);
        assert!(wc.is_consistent());
        assert_eq!(wc.wc_flags, WcFlags::WITH_IMM | WcFlags::GRH);
        assert_eq!(wc.src_qp, 0x22);
        let wc = WorkCompletion::success(1, WcOpcode::Recv, 0x11, 0).with_inv(0x105);
        assert!(wc.is_consistent());
        let f = WorkCompletion::flush(9, WcOpcode::Send, 0x11);
        assert_eq!(f.status, WcStatus::WrFlushErr);
        assert!(f.is_consistent());
        let mut bad = f;
        bad.imm_data = Some(1);
        assert!(!bad.is_consistent());
    }
}
