//! The transport engine's own cost per message, with no I/O: two software HCAs on the
//! in-memory fabric play `ib_send_lat`'s exchange (an 8-byte inline RC SEND each way, sends
//! unsignaled but every 100th, as perftest's `cq_mod`), packets handed from one engine to the
//! other by hand. Prints nanoseconds per half round trip: what the engine adds to a message's
//! latency on any link (requester, responder, completer, ICRC both ways, CQE).
//!
//! Run by hand: `cargo bench -p hca --bench engine_pingpong [-- ITERATIONS]`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use hca::{SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

fn main() {
    let iters: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    let o = Opts {
        depth: 512,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let mut buf = vec![0u8; hca::engine::MAX_UDP_PAYLOAD];
    let mut pkts: Vec<Pkt> = Vec::new();
    let mut wcs = [WorkCompletion::success(0, hca::WcOpcode::Send, 0, 0); 4];
    for p in [&a, &b] {
        for _ in 0..o.depth {
            post_recv(&mut f, p, 1, &[p.sge(4096, 8)]);
        }
    }
    let t0 = Instant::now();
    let now = hca::Instant::from_micros(1);
    let mut received = 0u64;
    for i in 0..2 * iters {
        let (me, peer) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let sg = [me.sge(0, 8)];
        let mut flags = SendFlags::INLINE;
        if i % 200 < 2 {
            flags |= SendFlags::SIGNALED;
        }
        f.node_mut(me.node)
            .post_send(
                me.qpn,
                &SendWr {
                    wr_id: i,
                    sg_list: &sg,
                    op: SendOp::Send,
                    send_flags: flags,
                },
            )
            .unwrap();
        pkts.clear();
        while let Some(tx) = f.node_mut(me.node).poll_transmit(now, &mut buf) {
            pkts.push(Pkt {
                tx,
                data: buf[..tx.len].to_vec(),
            });
        }
        deliver_all(&mut f, peer, &pkts, now);
        loop {
            let n = f.node_mut(peer.node).poll_cq(peer.cq, &mut wcs).unwrap();
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success);
                if wc.opcode == hca::WcOpcode::Recv {
                    received += 1;
                    post_recv(&mut f, peer, 1, &[peer.sge(4096, 8)]);
                }
            }
            if n < wcs.len() {
                break;
            }
        }
    }
    let el = t0.elapsed();
    assert_eq!(received, 2 * iters, "every SEND received");
    println!(
        "engine ping-pong (8-byte inline RC SEND each way, two engines, no I/O): {} messages, {:.0} ns of engine per half round trip",
        2 * iters,
        el.as_nanos() as f64 / (2 * iters) as f64
    );
}
