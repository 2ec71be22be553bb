//! The RoCE transport end to end: every collective over RDMA WRITE_WITH_IMM on the software HCA
//! (ranks are threads, each with its own UDP device on 127.0.0.<rank+1>), in place and out of
//! place, on odd sizes, with one and several channels (QPs) per peer; point-to-point; and
//! failures: a rank that leaves, mismatched operations. Every wait is bounded by the
//! communicator's timeout; nothing asserts on wall-clock durations.

mod common;

use collectives::perf::Collective;
use collectives::{CollError, CommConfig, DataType, RedOp, TransportKind};

fn config() -> CommConfig {
    common::config(TransportKind::Roce)
}

/// `collective` on 2, 3 and 4 ranks over RoCE, every count in and out of place, checked on every
/// rank against the reference.
fn check(collective: Collective, config: CommConfig) {
    common::cases::check_every_count(collective, 2..=4, config, |comm, n| {
        for peer in (0..n).filter(|&p| p != comm.rank()) {
            assert_eq!(
                comm.path(peer),
                Some(collectives::topology::Path::Roce),
                "--transport roce on one host still takes RoCE"
            );
        }
    });
}

#[test]
fn all_reduce() {
    check(Collective::AllReduce, config());
}

#[test]
fn broadcast() {
    check(Collective::Broadcast, config());
}

#[test]
fn reduce() {
    check(Collective::Reduce, config());
}

#[test]
fn all_gather() {
    check(Collective::AllGather, config());
}

#[test]
fn reduce_scatter() {
    check(Collective::ReduceScatter, config());
}

#[test]
fn all_to_all() {
    check(Collective::AllToAll, config());
}

#[test]
fn scatter() {
    check(Collective::Scatter, config());
}

#[test]
fn gather() {
    check(Collective::Gather, config());
}

/// Three QPs per peer pair, chunks striped over them; slots big enough for multi-packet writes
/// (4 KiB + header: two packets at PMTU 4096) and only two of them, so credits run out often.
#[test]
fn several_channels_and_multi_packet_slots() {
    let config = CommConfig {
        nchannels: 3,
        nslots: 2,
        slot_bytes: 4096,
        ..config()
    };
    check(Collective::AllReduce, config);
    check(Collective::AllToAll, config);
}

/// Large operations: thousands of chunks through every slot many times over (step counters wrap
/// the 16-bit immediate), results bit-identical to the shared-memory path's.
#[test]
fn long_runs_wrap_the_step_counter_and_match_shared_memory() {
    let count = 70_000 * 3 + 7;
    let run = |transport| {
        common::with_ranks(3, common::config(transport), move |comm| {
            let r = comm.rank() as f32;
            let input: Vec<f32> = (0..count)
                .map(|i| ((i as f32 + 0.1) * (r + 1.3)).sin() * 1e3)
                .collect();
            let mut out = vec![0f32; count];
            comm.all_reduce_typed(&input, &mut out, RedOp::Sum).unwrap();
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        })
    };
    let roce = run(TransportKind::Roce);
    let shm = run(TransportKind::InProcess);
    assert_eq!(roce, shm);
}

#[test]
fn point_to_point_and_barrier() {
    let n = 4;
    common::with_ranks(n, config(), |comm| {
        common::ring_shift(comm);
        comm.barrier().unwrap();
    });
}

/// A rank that closes its communicator while the others still run a collective: they fail
/// naming it (its abort message travels on every QP).
#[test]
fn a_rank_that_leaves_is_named_by_the_others() {
    let errs = common::with_ranks(4, config(), |comm| {
        if comm.rank() == 2 {
            return None;
        }
        let mut buf = vec![1f32; 10_000];
        let e = comm
            .all_reduce_typed_in_place(&mut buf, RedOp::Sum)
            .unwrap_err();
        Some(e)
    });
    for (rank, e) in errs.into_iter().enumerate() {
        let Some(e) = e else { continue };
        let s = e.to_string();
        assert!(s.contains("rank 2"), "rank {rank}: {s}");
        assert!(matches!(e, CollError::Transport { .. }), "rank {rank}: {s}");
    }
}

/// Ranks that call different collectives fail with a mismatch, on every rank.
#[test]
fn mismatched_operations_fail_every_rank() {
    let errs = common::with_ranks(3, config(), |comm| {
        let mut buf = vec![0u8; 400];
        if comm.rank() == 1 {
            comm.broadcast_in_place(&mut buf, 100, DataType::F32, 0)
        } else {
            comm.all_reduce_in_place(&mut buf, 100, DataType::F32, RedOp::Sum)
        }
        .unwrap_err()
    });
    for e in &errs {
        let s = e.to_string();
        assert!(
            matches!(e, CollError::Mismatch { .. } | CollError::Transport { .. }),
            "{s}"
        );
    }
    assert!(errs.iter().any(|e| matches!(e, CollError::Mismatch { .. })));
}
