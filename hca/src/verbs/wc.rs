//! Work completions: what ibv_poll_cq(3) returns.
//!
//! When the HCA finishes a work request it writes a completion queue entry (CQE) that the program
//! reads as a [`WorkCompletion`]: which WR (`wr_id`), how it ended ([`WcStatus`]), what it was
//! ([`WcOpcode`]) and, for receives, how many bytes arrived and from whom. A send WR produces a
//! completion only if it was *signaled* (IBV_SEND_SIGNALED or a QP created with `sq_sig_all`) or if
//! it failed; every receive WR produces one. After an error, the QP is in the error state and every
//! WR still queued completes with [`WcStatus::WrFlushErr`] (IBTA vol. 1 ch. 10-11, ibv_poll_cq(3)).

pub use super::attr::{WcFlags, WcOpcode, WcStatus};

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
    use crate::verbs::attr::WrOpcode;

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
