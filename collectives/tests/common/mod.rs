//! Helpers shared by the integration tests: ranks as threads of the test process.

#![allow(dead_code)]

#[cfg(feature = "perf")]
pub mod cases;

use std::time::Duration;

use collectives::transport::WaitPolicy;
use collectives::{CommConfig, Communicator, DataType, TransportKind, UniqueId};

/// Small slots (256 B = 64 floats) so that every test moves many chunks per operation, few
/// slots so that credits run out, short timeouts so that a bug fails instead of hanging.
pub fn config(transport: TransportKind) -> CommConfig {
    CommConfig {
        transport,
        nchannels: 1,
        nslots: 4,
        slot_bytes: 256,
        timeout: Duration::from_secs(30),
        bootstrap_timeout: Duration::from_secs(30),
        wait: Some(WaitPolicy::OVERSUBSCRIBED),
    }
}

/// Runs `f` on `n` ranks (threads), each with its own communicator; returns their results in
/// rank order.
pub fn with_ranks<T: Send>(
    n: usize,
    config: CommConfig,
    f: impl Fn(&mut Communicator) -> T + Sync,
) -> Vec<T> {
    let id = UniqueId::new().expect("rendezvous root");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let f = &f;
                s.spawn(move || {
                    let mut comm = Communicator::init(&id, rank, n, config)
                        .unwrap_or_else(|e| panic!("rank {rank}: init: {e}"));
                    f(&mut comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// A ring shift in both directions at once (this rank sends 1000 bytes, `(i * 7 + rank) as u8`,
/// to the next rank while it receives the previous rank's): needs the interleaved `send_recv`.
/// Asserts the bytes received and returns the bytes sent.
pub fn ring_shift(comm: &mut Communicator) -> Vec<u8> {
    let (r, n) = (comm.rank(), comm.nranks());
    let send: Vec<u8> = (0..1000).map(|i| (i * 7 + r) as u8).collect();
    let mut recv = vec![0u8; 1000];
    comm.send_recv(
        &send,
        1000,
        Some((r + 1) % n),
        &mut recv,
        1000,
        Some((r + n - 1) % n),
        DataType::U8,
    )
    .unwrap();
    let from = (r + n - 1) % n;
    assert!(recv
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (i * 7 + from) as u8));
    send
}
