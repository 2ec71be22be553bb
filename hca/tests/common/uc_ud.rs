//! UC and UD connections: their options, and UD address handles and destinations.

use hca::{AhAttr, Gid, QpType, SendOp, UdDest};

use super::{Opts, Peer};

/// Default options for a UC connection.
pub fn uc() -> Opts {
    Opts {
        qp_type: QpType::Uc,
        ..Opts::default()
    }
}

/// Default options for UD QPs (IPv6 addresses with `ipv6`).
pub fn ud(ipv6: bool) -> Opts {
    Opts {
        qp_type: QpType::Ud,
        ipv6,
        ..Opts::default()
    }
}

/// A UD address handle on `from` for `to`.
pub fn ah_to(f: &mut hca::fabric::Fabric, from: &Peer, to: &Peer) -> hca::AhHandle {
    f.node_mut(from.node)
        .create_ah(
            from.pd,
            &AhAttr {
                dgid: Gid::from(to.ip),
                sgid_index: 2,
                hop_limit: 17,
                traffic_class: 0x20,
                ..AhAttr::default()
            },
        )
        .unwrap()
}

/// A UD SEND to `to`'s QP with `qkey`, through `ah`.
pub fn ud_send(ah: hca::AhHandle, to: &Peer, qkey: u32) -> SendOp {
    SendOp::UdSend {
        dest: UdDest {
            ah,
            remote_qpn: to.qpn,
            remote_qkey: qkey,
        },
        imm_data: None,
    }
}
