//! Work requests as tuples (`wr_id`, SGEs, operation) and posting them.

use hca::SendOp;

use super::{post_send, send_wr, Peer};

/// An RDMA WRITE of `local.1` bytes from `local.0` of `p` to `remote_off` of `remote`.
pub fn write(
    p: &Peer,
    wr_id: u64,
    local: (u64, u32),
    remote: &Peer,
    remote_off: u64,
) -> (u64, Vec<hca::Sge>, SendOp) {
    (
        wr_id,
        vec![p.sge(local.0, local.1)],
        SendOp::RdmaWrite {
            remote_addr: remote.addr(remote_off),
            rkey: remote.mr.rkey(),
        },
    )
}

/// The READ twin of [`write`]: `local.1` bytes from `remote_off` of `remote` into `local.0`.
pub fn read(
    p: &Peer,
    wr_id: u64,
    local: (u64, u32),
    remote: &Peer,
    remote_off: u64,
) -> (u64, Vec<hca::Sge>, SendOp) {
    (
        wr_id,
        vec![p.sge(local.0, local.1)],
        SendOp::RdmaRead {
            remote_addr: remote.addr(remote_off),
            rkey: remote.mr.rkey(),
        },
    )
}

/// Posts a signaled WR given as a tuple.
pub fn post(f: &mut hca::fabric::Fabric, p: &Peer, (wr_id, sg, op): (u64, Vec<hca::Sge>, SendOp)) {
    post_send(f, p, &send_wr(wr_id, &sg, op));
}
