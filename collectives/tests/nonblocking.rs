//! Issue 20's Rust API: non-blocking operations completed in issue order, abort from another
//! thread, the per-operation timeout, bootstrap through a key-value store, and split.
//! Ranks are threads; every wait is bounded by a communicator timeout (no wall-clock checks).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use collectives::bootstrap::{MemStore, Store};
use collectives::{
    AsyncCommunicator, CollError, CommConfig, Communicator, DataType, RedOp, TransportKind,
};

/// `n` ranks (threads) bootstrapped through one in-memory store, each running `f`.
fn with_store_ranks<T: Send>(
    n: usize,
    config: CommConfig,
    f: impl Fn(Communicator) -> T + Sync,
) -> Vec<T> {
    with_store_ranks_and(n, config, (), |c, ()| f(c))
}

/// As [`with_store_ranks`], with `shared` (e.g. a barrier between the rank threads) passed on.
fn with_store_ranks_and<T: Send, S: Sync>(
    n: usize,
    config: CommConfig,
    shared: S,
    f: impl Fn(Communicator, &S) -> T + Sync,
) -> Vec<T> {
    let shared = &shared;
    let store = MemStore::new();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (f, store) = (&f, store.clone() as Arc<dyn Store>);
                s.spawn(move || {
                    let ip = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
                    let comm = Communicator::from_store(store, rank, n, config, ip)
                        .unwrap_or_else(|e| panic!("rank {rank}: from_store: {e}"));
                    f(comm, shared)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn store_bootstrap_in_process_and_roce() {
    for transport in [TransportKind::InProcess, TransportKind::Roce] {
        let out = with_store_ranks(3, common::config(transport), |mut comm| {
            let r = comm.rank() as f32;
            let mut v = vec![r + 1.0; 300];
            comm.all_reduce_typed_in_place(&mut v, RedOp::Sum).unwrap();
            v
        });
        for v in out {
            assert!(v.iter().all(|&x| x == 6.0), "{transport}: {:?}", &v[..4]);
        }
    }
}

#[test]
fn many_operations_in_flight_complete_in_issue_order() {
    let out = with_store_ranks(4, common::config(TransportKind::InProcess), |comm| {
        let r = comm.rank();
        let a = AsyncCommunicator::new(comm).unwrap();
        // Ten all-reduces of different sizes, a broadcast and an all-gather, all issued before
        // any is waited for.
        let works: Vec<_> = (0..10)
            .map(|k| {
                let v = f32s(&vec![(r * 10 + k) as f32; 100 + 37 * k]);
                a.all_reduce(v, 100 + 37 * k, DataType::F32, RedOp::Sum, None)
            })
            .collect();
        let b = a.broadcast(f32s(&[r as f32; 70]), 70, DataType::F32, 2, None);
        let g = a.all_gather(
            f32s(&[r as f32; 5]),
            vec![0u8; 4 * 5 * 4],
            5,
            DataType::F32,
            None,
        );
        let (_, gathered) = g.wait().unwrap();
        // The all-gather was issued last: everything before it is done.
        assert!(b.test());
        let sums: Vec<Vec<f32>> = works
            .into_iter()
            .map(|w| floats(&w.wait().unwrap()))
            .collect();
        (sums, floats(&b.wait().unwrap()), floats(&gathered))
    });
    for (sums, bcast, gathered) in out {
        for (k, s) in sums.iter().enumerate() {
            // sum over r of (10 r + k) = 60 + 4 k
            assert_eq!(s.len(), 100 + 37 * k);
            assert!(
                s.iter().all(|&x| x == (60 + 4 * k) as f32),
                "op {k}: {:?}",
                &s[..2]
            );
        }
        assert!(bcast.iter().all(|&x| x == 2.0));
        let want: Vec<f32> = (0..4).flat_map(|r| [r as f32; 5]).collect();
        assert_eq!(gathered, want);
    }
}

#[test]
fn blocking_calls_run_inline_when_nothing_is_pending_and_queue_otherwise() {
    let out = with_store_ranks(3, common::config(TransportKind::InProcess), |comm| {
        let r = comm.rank();
        let a = AsyncCommunicator::new(comm).unwrap();
        let inline = |k: usize| {
            let mut v = f32s(&[(r + k) as f32; 50]);
            a.run_or_submit(
                collectives::transport::CollKind::AllReduce,
                None,
                move |c| {
                    c.all_reduce_in_place(&mut v, 50, DataType::F32, RedOp::Sum)
                        .map(|()| v)
                },
            )
        };
        // Nothing pending: each runs on this thread and its handle has ended on return.
        let first = inline(0);
        let ended_at_once = first.test();
        let after_first = a.inline_ops();
        // An operation queued and not yet waited for: the next blocking call goes behind it, on
        // the progress thread (issue order), unless the queue has drained in between; either way
        // both end with the right sums.
        let queued = a.all_reduce(f32s(&[r as f32; 20]), 20, DataType::F32, RedOp::Sum, None);
        let second = inline(1);
        let q = floats(&queued.wait().unwrap());
        let s = floats(&second.wait().unwrap());
        (
            ended_at_once,
            after_first,
            floats(&first.wait().unwrap()),
            q,
            s,
            a.inline_ops(),
        )
    });
    for (ended_at_once, after_first, first, q, s, total) in out {
        assert!(ended_at_once);
        assert_eq!(after_first, 1);
        assert!(first.iter().all(|&x| x == 3.0), "{first:?}");
        assert!(q.iter().all(|&x| x == 3.0), "{q:?}");
        assert!(s.iter().all(|&x| x == 6.0), "{s:?}");
        assert!((1..=2).contains(&total), "{total}");
    }
}

#[test]
fn abort_from_another_thread_ends_a_stuck_operation_and_the_queue() {
    // Rank 1 never joins rank 0's all-reduce; the operation timeout (60 s) would end it, but
    // abort() from a watchdog thread does first: the error says Cancelled, not a timeout.
    let mut config = common::config(TransportKind::InProcess);
    config.timeout = Duration::from_secs(60);
    let done = std::sync::Barrier::new(2);
    let out = with_store_ranks_and(2, config, done, |comm, done| {
        let rank = comm.rank();
        let a = AsyncCommunicator::new(comm).unwrap();
        if rank == 0 {
            let w1 = a.all_reduce(vec![0u8; 64], 16, DataType::F32, RedOp::Sum, None);
            let w2 = a.all_reduce(vec![0u8; 64], 16, DataType::F32, RedOp::Sum, None);
            assert!(!w1.wait_timeout(Duration::from_millis(50)));
            let h = a.abort_handle();
            std::thread::spawn(move || h.abort()).join().unwrap();
            a.abort();
            let e1 = w1.wait().unwrap_err();
            let e2 = w2.wait().unwrap_err();
            let e3 = a.barrier(None).wait().unwrap_err();
            done.wait();
            vec![e1.to_string(), e2.to_string(), e3.to_string()]
        } else {
            // Idle until rank 0 has aborted: then its next operation fails naming rank 0.
            done.wait();
            let e = a.barrier(Some(Duration::from_secs(60))).wait().unwrap_err();
            vec![e.to_string()]
        }
    });
    assert!(out[0][0].contains("ended by abort()"), "{:?}", out[0]);
    assert!(out[0][1].contains("refused"), "{:?}", out[0]);
    assert!(out[0][2].contains("refused"), "{:?}", out[0]);
    assert!(out[1][0].contains("rank 0"), "{:?}", out[1]);
}

#[test]
fn per_operation_timeout_names_the_silent_peer() {
    let done = std::sync::Barrier::new(2);
    let out = with_store_ranks_and(
        2,
        common::config(TransportKind::InProcess),
        done,
        |comm, done| {
            let rank = comm.rank();
            let a = AsyncCommunicator::new(comm).unwrap();
            if rank == 0 {
                let e = a
                    .all_reduce(
                        vec![0u8; 64],
                        16,
                        DataType::F32,
                        RedOp::Sum,
                        Some(Duration::from_millis(200)),
                    )
                    .wait()
                    .unwrap_err();
                let timed_out = matches!(
                    &e,
                    CollError::Transport { source, .. }
                        if matches!(source, collectives::transport::TransportError::Timeout { peer: 1, .. })
                );
                done.wait();
                (timed_out, e.to_string())
            } else {
                // Silent until rank 0 timed out; then rank 0's abort reaches this rank.
                done.wait();
                let e = a.barrier(None).wait().unwrap_err();
                (true, e.to_string())
            }
        },
    );
    assert!(out[0].0, "{}", out[0].1);
    assert!(out[1].1.contains("rank 0"), "{}", out[1].1);
}

#[test]
fn split_into_even_and_odd_groups() {
    let out = common::with_ranks(4, common::config(TransportKind::InProcess), |comm| {
        let r = comm.rank();
        // Rank 3 joins no group; 0 and 2 form one (ordered by key: 2 first), 1 alone.
        let color = match r {
            3 => None,
            _ => Some((r % 2) as u32),
        };
        let key = if r == 2 { 0 } else { 10 };
        let sub = comm
            .split(color, key, common::config(TransportKind::InProcess))
            .unwrap();
        let sub_info = sub.map(|mut s| {
            let mut v = vec![r as f32; 10];
            s.all_reduce_typed_in_place(&mut v, RedOp::Sum).unwrap();
            (s.rank(), s.nranks(), v[0])
        });
        // The parent still works.
        let mut v = vec![1.0f32; 3];
        comm.all_reduce_typed_in_place(&mut v, RedOp::Sum).unwrap();
        (sub_info, v[0])
    });
    assert_eq!(out[0], (Some((1, 2, 2.0)), 4.0));
    assert_eq!(out[1], (Some((0, 1, 1.0)), 4.0));
    assert_eq!(out[2], (Some((0, 2, 2.0)), 4.0));
    assert_eq!(out[3], (None, 4.0));
}
