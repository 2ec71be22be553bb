//! Failures: every rank returns an error naming the culprit, nothing hangs, nothing panics.
//! (Bounded by the communicators' timeouts; no test measures wall-clock time.)

mod common;

use std::sync::Barrier;
use std::time::Duration;

use collectives::{
    CollError, CommConfig, Communicator, DataType, InitError, RedOp, TransportKind, UniqueId,
};

fn all_reduce(comm: &mut Communicator, count: usize, datatype: DataType) -> Result<(), CollError> {
    let send = vec![0u8; count * datatype.size()];
    let mut recv = vec![0u8; count * datatype.size()];
    comm.all_reduce(&send, &mut recv, count, datatype, RedOp::Sum)
}

#[test]
fn mismatched_count_fails_every_rank() {
    let errs = common::with_ranks(4, common::config(TransportKind::InProcess), |comm| {
        // A matching operation first: the mismatch is in the second.
        all_reduce(comm, 10, DataType::F32).unwrap();
        let count = if comm.rank() == 2 { 100 } else { 101 };
        let e = all_reduce(comm, count, DataType::F32).unwrap_err();
        // The communicator stays aborted.
        let again = all_reduce(comm, 10, DataType::F32).unwrap_err();
        assert!(matches!(again, CollError::Aborted { .. }), "{again}");
        e.to_string()
    });
    let mismatches = errs
        .iter()
        .filter(|e| e.contains("mismatched operations"))
        .count();
    assert!(mismatches >= 1, "{errs:#?}");
    for e in &errs {
        assert!(
            e.contains("count=100") || e.contains("rank 2") || e.contains("mismatched"),
            "every error leads to the mismatch: {e}"
        );
    }
    // The rank that receives from rank 2 sees both descriptors.
    assert!(
        errs[3].contains("#1 all_reduce(count=101, float, sum)")
            && errs[3].contains("#1 all_reduce(count=100, float, sum)"),
        "{}",
        errs[3]
    );
}

#[test]
fn mismatched_datatype_collective_and_empty_count_fail_every_rank() {
    // Same byte size, different type.
    let errs = common::with_ranks(3, common::config(TransportKind::InProcess), |comm| {
        let dt = if comm.rank() == 0 {
            DataType::I32
        } else {
            DataType::F32
        };
        all_reduce(comm, 50, dt).unwrap_err().to_string()
    });
    assert!(
        errs.iter()
            .any(|e| e.contains("int32") && e.contains("float")),
        "{errs:#?}"
    );

    // Different collectives.
    let errs = common::with_ranks(3, common::config(TransportKind::InProcess), |comm| {
        let mut buf = vec![0u8; 64];
        if comm.rank() == 1 {
            comm.broadcast_in_place(&mut buf, 16, DataType::F32, 0)
                .unwrap_err()
        } else {
            comm.all_reduce_in_place(&mut buf, 16, DataType::F32, RedOp::Sum)
                .unwrap_err()
        }
        .to_string()
    });
    assert!(
        errs.iter()
            .any(|e| e.contains("broadcast") && e.contains("all_reduce")),
        "{errs:#?}"
    );

    // Zero elements against some: the empty operation still carries its descriptor.
    let errs = common::with_ranks(2, common::config(TransportKind::InProcess), |comm| {
        let count = if comm.rank() == 0 { 0 } else { 7 };
        all_reduce(comm, count, DataType::U8)
            .unwrap_err()
            .to_string()
    });
    assert!(
        errs.iter()
            .all(|e| e.contains("count=0") || e.contains("rank")),
        "{errs:#?}"
    );
}

#[test]
fn a_rank_that_leaves_early_is_named_by_every_other_rank() {
    let errs = common::with_ranks(4, common::config(TransportKind::InProcess), |comm| {
        all_reduce(comm, 1000, DataType::F32).unwrap();
        if comm.rank() == 2 {
            return None; // drops its communicator: its connections close
        }
        Some(all_reduce(comm, 1000, DataType::F32).unwrap_err())
    });
    for (rank, e) in errs.iter().enumerate() {
        if let Some(e) = e {
            assert!(e.to_string().contains("rank 2"), "rank {rank}: {e}");
        }
    }
}

/// A rank that stops calling collectives: the rank that waits for its data times out naming it;
/// ranks further away time out on the peer they wait for or hear the abort naming the stalled
/// rank first (a race between equal timeouts, so only the direct dependant is pinned).
#[test]
fn a_stalled_rank_is_named_by_the_rank_waiting_for_it() {
    let config = CommConfig {
        timeout: Duration::from_millis(300),
        ..common::config(TransportKind::InProcess)
    };
    let done = Barrier::new(4);
    let errs = common::with_ranks(4, config, |comm| {
        let r = if comm.rank() == 1 {
            None // stalls: calls nothing until the others have failed
        } else {
            Some(
                all_reduce(comm, 1000, DataType::F32)
                    .unwrap_err()
                    .to_string(),
            )
        };
        done.wait();
        r
    });
    // Rank 2 waits for data from rank 1 and only from it.
    let e = errs[2].as_deref().unwrap_or_default();
    assert!(
        e.contains("timed out") && e.contains("peer rank 1"),
        "rank 2: {e}"
    );
    for rank in [0, 3] {
        let e = errs[rank].as_deref().unwrap_or_default();
        assert!(
            e.contains("timed out") || e.contains("stalled"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn invalid_arguments_fail_this_rank_and_abort_the_others() {
    let errs = common::with_ranks(3, common::config(TransportKind::InProcess), |comm| {
        let mut buf = vec![0u8; 10];
        if comm.rank() == 0 {
            // 10 bytes cannot hold 4 floats.
            let e = comm
                .all_reduce_in_place(&mut buf, 4, DataType::F32, RedOp::Sum)
                .unwrap_err();
            assert!(matches!(e, CollError::InvalidArgument { .. }), "{e}");
            e.to_string()
        } else {
            let mut big = vec![0u8; 16];
            comm.all_reduce_in_place(&mut big, 4, DataType::F32, RedOp::Sum)
                .unwrap_err()
                .to_string()
        }
    });
    assert!(errs[0].contains("needs 16"), "{}", errs[0]);
    assert!(
        errs[1].contains("rank 0") && errs[2].contains("rank 0"),
        "{errs:#?}"
    );

    // Out-of-range root and peer.
    common::with_ranks(2, common::config(TransportKind::InProcess), |comm| {
        let mut b = [0u8; 4];
        assert!(comm.broadcast_in_place(&mut b, 1, DataType::U8, 2).is_err());
    });
    common::with_ranks(1, common::config(TransportKind::InProcess), |comm| {
        assert!(comm.send(&[1], 1, DataType::U8, 3).is_err());
    });
}

fn init_errors(n: usize, config: impl Fn(usize) -> CommConfig + Sync) -> Vec<InitError> {
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let config = &config;
                s.spawn(move || Communicator::init(&id, rank, n, config(rank)).unwrap_err())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn differently_configured_ranks_fail_at_init() {
    let errs = init_errors(3, |rank| CommConfig {
        slot_bytes: if rank == 1 { 512 } else { 256 },
        ..common::config(TransportKind::InProcess)
    });
    for e in &errs {
        let s = e.to_string();
        assert!(
            s.contains("configured differently") || s.contains("rank 1"),
            "{s}"
        );
    }
    let errs = init_errors(2, |rank| {
        common::config(if rank == 0 {
            TransportKind::Shm
        } else {
            TransportKind::Auto
        })
    });
    assert!(
        errs.iter().all(|e| e.to_string().contains("transport")),
        "{errs:#?}"
    );
    // Bad arguments never reach the network.
    let id = UniqueId::new().unwrap();
    assert!(matches!(
        Communicator::init(&id, 3, 3, common::config(TransportKind::InProcess)),
        Err(InitError::InvalidArgument(_))
    ));
    let bad = CommConfig {
        slot_bytes: 100,
        ..common::config(TransportKind::InProcess)
    };
    assert!(matches!(
        Communicator::init(&id, 0, 1, bad),
        Err(InitError::InvalidArgument(_))
    ));
}
