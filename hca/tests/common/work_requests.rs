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

/// Two requests B executes and answers, then one it refuses: with B's word at 0 holding 7 and its
/// bytes 64..128 holding 0x3c, A posts a FETCH_AND_ADD of 5 on that word (`wr_id` 1, into A's
/// 0..8), a 64-byte READ of B's 64.. (`wr_id` 2, into A's 64..) and a 64-byte WRITE from A's 128..
/// to B's 0 under a wrong rkey (`wr_id` 3: a remote access error).
pub fn post_atomic_read_then_bad_write(f: &mut hca::fabric::Fabric, a: &Peer, b: &Peer) {
    b.write(0, &7u64.to_ne_bytes());
    b.write(64, &[0x3c; 64]);
    let add = SendOp::AtomicFetchAndAdd {
        remote_addr: b.addr(0),
        rkey: b.mr.rkey(),
        add: 5,
    };
    post(f, a, (1, vec![a.sge(0, 8)], add));
    post(f, a, read(a, 2, (64, 64), b, 64));
    let bad_rkey = SendOp::RdmaWrite {
        remote_addr: b.addr(0),
        rkey: b.mr.rkey() ^ 0x100,
    };
    post(f, a, (3, vec![a.sge(128, 64)], bad_rkey));
}
