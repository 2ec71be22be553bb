//! The one QP bring-up: RESET -> INIT -> RTR -> RTS for RC, UC and UD QPs.
//!
//! A QP is connected by three ibv_modify_qp(3) calls, each with the attributes its transition
//! requires (IBTA vol. 1 §11.2.5.2 / ch. 10.3, the kernel's `qp_state_table`; see
//! [`transition_rule`](super::qp::transition_rule)), as rdma-core's `ibv_rc_pingpong`
//! (`pp_connect_ctx`) and perftest (`ctx_modify_qp_to_init`, `ctx_connect`) make them:
//!
//! | step | RC | UC | UD |
//! |---|---|---|---|
//! | RESET -> INIT | P_Key index, port, access flags | P_Key index, port, access flags | P_Key index, port, Q_Key |
//! | INIT -> RTR | address vector, path MTU, remote QPN, receive PSN, responder resources, min RNR timer | address vector, path MTU, remote QPN, receive PSN | (state only) |
//! | RTR -> RTS | send PSN, local ACK timeout, retry count, RNR retry, initiator depth | send PSN | send PSN |
//!
//! [`ConnectAttr`] holds every value a bring-up needs; [`step`] gives the attributes and mask of
//! one transition; [`bring_up`] runs the transitions from one state to another through any
//! backend's `modify_qp`. Every caller in this project (tools, collectives, conformance suite,
//! examples, tests) brings its QPs up through these functions, so the masks are written only here.

use core::fmt;

use super::ah::AhAttr;
use super::attr::{AccessFlags, QpAttrMask, QpState, QpType};
use super::device::PathMtu;
use super::gid::Gid;
use super::qp::QpAttr;

/// Everything a QP needs to go from RESET to RTS (the fields one QP type does not use are
/// ignored for it; `Default`: RC, port 1, P_Key index 0, no access, PSNs 0, path MTU 1024,
/// perftest's timers and retry counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectAttr {
    /// The QP's transport service.
    pub qp_type: QpType,
    /// The HCA port, 1-based (`port_num`).
    pub port_num: u8,
    /// The P_Key table index (`pkey_index`).
    pub pkey_index: u16,
    /// RC / UC: the remote access the QP grants (`qp_access_flags`).
    pub access: AccessFlags,
    /// UD: the QP's Q_Key (`qkey`).
    pub qkey: u32,
    /// RC / UC: the path MTU (`path_mtu`).
    pub path_mtu: PathMtu,
    /// RC / UC: the peer's address vector (`ah_attr`).
    pub ah_attr: AhAttr,
    /// RC / UC: the peer QP's number (`dest_qp_num`, 24 bits).
    pub remote_qpn: u32,
    /// RC / UC: the first PSN the peer sends, expected by this QP (`rq_psn`, 24 bits).
    pub remote_psn: u32,
    /// The first PSN this QP sends (`sq_psn`, 24 bits). The default is 0; real connections draw
    /// it at random ([`crate::verbs::random::random_psn`] under `std`), since the PSN window is
    /// part of what an off-path attacker must guess (see [`crate::verbs::qp`]).
    pub local_psn: u32,
    /// RC: RDMA READs / atomics the peer may have outstanding at this QP (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// RC: the RNR NAK timer code this QP asks peers to wait (`min_rnr_timer`, 0 ..= 31).
    pub min_rnr_timer: u8,
    /// RC: the local ACK timeout code (`timeout`: 4.096 us * 2^timeout; 0 = infinite).
    pub timeout: u8,
    /// RC: retransmissions after a timeout (`retry_cnt`, 0 ..= 7).
    pub retry_cnt: u8,
    /// RC: retries after an RNR NAK (`rnr_retry`, 0 ..= 7; 7 = forever).
    pub rnr_retry: u8,
    /// RC: RDMA READs / atomics this QP may have outstanding (`max_rd_atomic`).
    pub max_rd_atomic: u8,
}

impl Default for ConnectAttr {
    fn default() -> Self {
        ConnectAttr {
            qp_type: QpType::Rc,
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
            qkey: 0,
            path_mtu: PathMtu::Mtu1024,
            ah_attr: AhAttr::default(),
            remote_qpn: 0,
            remote_psn: 0,
            local_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

impl ConnectAttr {
    /// The address vector to `dgid` from the device's GID `sgid_index` on port 1.
    pub fn av(dgid: Gid, sgid_index: u8, hop_limit: u8, traffic_class: u8) -> AhAttr {
        AhAttr {
            dgid,
            sgid_index,
            hop_limit,
            traffic_class,
            port_num: 1,
            ..AhAttr::default()
        }
    }
}

/// The attributes and mask of the transition into `to` (INIT, RTR or RTS) for `attr`'s QP type
/// (see the [module docs](self)); `None` for any other state.
pub fn step(attr: &ConnectAttr, to: QpState) -> Option<(QpAttr, QpAttrMask)> {
    let ud = attr.qp_type == QpType::Ud;
    let rc = attr.qp_type == QpType::Rc;
    match to {
        QpState::Init => {
            let qp = QpAttr {
                qp_state: QpState::Init,
                pkey_index: attr.pkey_index,
                port_num: attr.port_num,
                qp_access_flags: attr.access,
                qkey: attr.qkey,
                ..QpAttr::default()
            };
            let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
            mask |= if ud {
                QpAttrMask::QKEY
            } else {
                QpAttrMask::ACCESS_FLAGS
            };
            Some((qp, mask))
        }
        QpState::Rtr => {
            if ud {
                let qp = QpAttr {
                    qp_state: QpState::Rtr,
                    ..QpAttr::default()
                };
                return Some((qp, QpAttrMask::STATE));
            }
            let qp = QpAttr {
                qp_state: QpState::Rtr,
                path_mtu: attr.path_mtu,
                dest_qp_num: attr.remote_qpn,
                rq_psn: attr.remote_psn,
                max_dest_rd_atomic: attr.max_dest_rd_atomic,
                min_rnr_timer: attr.min_rnr_timer,
                ah_attr: attr.ah_attr,
                ..QpAttr::default()
            };
            let mut mask = QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN;
            if rc {
                mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
            }
            Some((qp, mask))
        }
        QpState::Rts => {
            let qp = QpAttr {
                qp_state: QpState::Rts,
                sq_psn: attr.local_psn,
                timeout: attr.timeout,
                retry_cnt: attr.retry_cnt,
                rnr_retry: attr.rnr_retry,
                max_rd_atomic: attr.max_rd_atomic,
                ..QpAttr::default()
            };
            let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
            if rc {
                mask |= QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC;
            }
            Some((qp, mask))
        }
        _ => None,
    }
}

/// A transition of [`bring_up`] that the backend refused: the state it was moving to and the
/// backend's error. `Display`: `Failed to modify QP to RTR: <error>` (the C tools' wording).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError<E> {
    /// The state the refused transition was moving to.
    pub to: QpState,
    /// The backend's error.
    pub source: E,
}

impl<E: fmt::Display> fmt::Display for ConnectError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Failed to modify QP to {}: {}", self.to, self.source)
    }
}

#[cfg(feature = "std")]
impl<E: std::error::Error + 'static> std::error::Error for ConnectError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Moves a QP from state `from` to state `to` (RESET, INIT, RTR, RTS, in that order) by calling
/// `modify` (the backend's ibv_modify_qp(3) for this QP) with each transition's attributes and
/// mask ([`step`]). Does nothing when `to` is not after `from`.
///
/// # Errors
/// The first refused transition, as [`ConnectError`]; the QP stays in the state before it.
pub fn bring_up<E>(
    attr: &ConnectAttr,
    from: QpState,
    to: QpState,
    mut modify: impl FnMut(&QpAttr, QpAttrMask) -> Result<(), E>,
) -> Result<(), ConnectError<E>> {
    const ORDER: [QpState; 4] = [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts];
    let (Some(start), Some(end)) = (
        ORDER.iter().position(|s| *s == from),
        ORDER.iter().position(|s| *s == to),
    ) else {
        return Ok(());
    };
    for &state in ORDER.iter().take(end + 1).skip(start + 1) {
        if let Some((qp, mask)) = step(attr, state) {
            modify(&qp, mask).map_err(|source| ConnectError { to: state, source })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::qp::{transition_rule, TransitionRule};

    fn rule(t: QpType, from: QpState, to: QpState) -> TransitionRule {
        transition_rule(t, from, to).expect("a transition of the bring-up")
    }

    /// Every step's mask holds what the transition requires and nothing it refuses, for every
    /// QP type (IBTA vol. 1 §11.2.5.2, the kernel's `qp_state_table`).
    #[test]
    fn each_step_is_a_valid_transition() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let a = ConnectAttr {
                qp_type: t,
                ..ConnectAttr::default()
            };
            let mut from = QpState::Reset;
            for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
                let (qp, mask) = step(&a, to).unwrap();
                assert_eq!(qp.qp_state, to);
                let r = rule(t, from, to);
                let attrs = mask - QpAttrMask::STATE;
                assert!(
                    attrs.contains(r.required),
                    "{t} {from}->{to}: {mask:?} lacks required"
                );
                assert!(
                    (r.required | r.optional).contains(attrs),
                    "{t} {from}->{to}: {mask:?} has attributes the transition refuses"
                );
                from = to;
            }
        }
        assert!(step(&ConnectAttr::default(), QpState::Err).is_none());
    }

    /// `bring_up` runs exactly the transitions between its two states, in order, and stops at
    /// the first refusal naming it.
    #[test]
    fn bring_up_runs_the_steps_between_and_stops_at_a_refusal() {
        let a = ConnectAttr::default();
        let mut seen = alloc::vec::Vec::new();
        bring_up::<()>(&a, QpState::Init, QpState::Rts, |qp, _| {
            seen.push(qp.qp_state);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [QpState::Rtr, QpState::Rts]);
        let e = bring_up(&a, QpState::Reset, QpState::Rts, |qp, _| {
            if qp.qp_state == QpState::Rtr {
                Err("EINVAL")
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.to, QpState::Rtr);
        assert_eq!(
            alloc::format!("{e}"),
            alloc::format!("Failed to modify QP to {}: EINVAL", QpState::Rtr)
        );
        let mut calls = 0;
        bring_up::<()>(&a, QpState::Rts, QpState::Init, |_, _| {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 0);
    }
}
