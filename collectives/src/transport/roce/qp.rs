//! The QPs of the transport: creating one per peer and channel, and the one QP bring-up
//! (RESET -> INIT -> RTR -> RTS) with the peer's connection info.

use hca::{
    AccessFlags, AhAttr, CqHandle, Gid, PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState,
    QpType,
};

use super::device::Hca;
use super::env::RoceEnv;
use super::info::RemoteQp;
use super::layout::Layout;
use crate::transport::TransportError;

/// A QP made in `setup`, waiting for the peer's info.
pub(super) struct PendingQp {
    pub(super) qpn: u32,
    pub(super) cq: CqHandle,
    pub(super) psn: u32,
}

/// A random 24-bit PSN (IBTA vol. 1 §9.7.1: PSNs are 24 bits; a random start keeps a stale
/// packet of an earlier connection from matching).
fn random_psn(salt: u64) -> u32 {
    (crate::bootstrap::rendezvous::random_u64() ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) as u32
        & 0x00ff_ffff
}

/// Creates the RC QP of one channel to `peer`, with its own CQ (send and receive), sized
/// for the layout's WRs, and draws its first PSN.
pub(super) fn create(hca: &Hca, layout: &Layout, peer: usize) -> Result<PendingQp, TransportError> {
    let verbs = Hca::verbs("creating a QP", Some(peer));
    let cq = hca
        .dev
        .create_cq(layout.send_wrs() + layout.recv_wrs())
        .map_err(&verbs)?;
    let qpn = hca
        .dev
        .create_qp(
            hca.pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: layout.send_wrs(),
                    max_recv_wr: layout.recv_wrs(),
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(&verbs)?;
    let psn = random_psn(u64::from(qpn));
    Ok(PendingQp { qpn, cq, psn })
}

/// Moves `qp` through INIT, RTR and RTS, connected to `remote` at `gid`.
pub(super) fn up(
    hca: &Hca,
    env: &RoceEnv,
    qp: &PendingQp,
    peer: usize,
    gid: Gid,
    remote: &RemoteQp,
    mtu: PathMtu,
) -> Result<(), TransportError> {
    let verbs = Hca::verbs("ibv_modify_qp", Some(peer));
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    hca.dev
        .modify_qp(
            qp.qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .map_err(&verbs)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr = AhAttr {
        dgid: gid,
        sgid_index: hca.dev.default_gid().0 as u8,
        hop_limit: 64,
        port_num: 1,
        ..AhAttr::default()
    };
    hca.dev
        .modify_qp(
            qp.qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .map_err(&verbs)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = qp.psn;
    a.timeout = env.qp_timeout;
    a.retry_cnt = env.retry_cnt;
    // Infinite: a receiver that has not reposted yet is slow, not dead.
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    hca.dev
        .modify_qp(
            qp.qpn,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .map_err(&verbs)?;
    Ok(())
}
