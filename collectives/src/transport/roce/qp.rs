//! The QPs of the transport: creating one per peer and channel, and the one QP bring-up
//! (RESET -> INIT -> RTR -> RTS) with the peer's connection info.

use hca::verbs::connect::{self, ConnectAttr};
use hca::{AccessFlags, CqHandle, Gid, PathMtu, QpCap, QpInitAttr, QpState, QpType};

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
fn random_psn() -> u32 {
    hca::verbs::random::random_psn()
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
    let psn = random_psn();
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
    let a = ConnectAttr {
        access: AccessFlags::REMOTE_WRITE,
        path_mtu: mtu,
        ah_attr: ConnectAttr::av(gid, hca.dev.default_gid().0 as u8, 64, 0),
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        local_psn: qp.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        timeout: env.qp_timeout,
        retry_cnt: env.retry_cnt,
        // Infinite: a receiver that has not reposted yet is slow, not dead.
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..ConnectAttr::default()
    };
    connect::bring_up(&a, QpState::Reset, QpState::Rts, |attr, mask| {
        hca.dev.modify_qp(qp.qpn, attr, mask).map(|_| ())
    })
    .map_err(|e| Hca::verbs("ibv_modify_qp", Some(peer))(e.source))
}
