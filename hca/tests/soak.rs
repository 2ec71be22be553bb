//! Soak: 10^5 RC operations through a fabric with 10% loss, 5% reordering, 1% duplication and
//! 0.1% bit corruption, checked byte for byte against the sequential model.

mod common;

use std::time::Duration;

use common::workload::{check, generate, generate_sized, run};
use common::*;
use hca::fabric::Faults;

fn faults() -> Faults {
    Faults {
        loss: 0.10,
        duplicate: 0.01,
        reorder: 0.05,
        corrupt: 0.001,
        ..Faults::none()
    }
}

#[test]
fn small_lossless_workload_matches_the_model() {
    let ops = generate(11, 300, 64 << 10);
    let o = Opts::default();
    let out = run(&ops, &o, Duration::from_secs(10));
    check(&ops, o.seed, &out);
    assert_eq!(
        out.a_counters.total_drops() + out.b_counters.total_drops(),
        0
    );
}

/// 10^5 messages (SEND, WRITE, READ, atomics; mostly up to 256 bytes, some up to 4 KiB) under
/// the fault mix. Zero wrong bytes, every WR completes successfully and in order.
#[test]
fn soak_100k_messages_under_loss_reordering_duplication_and_corruption() {
    let n = 100_000;
    let ops = generate_sized(99, n, 4096, 256);
    let o = Opts {
        faults: faults(),
        seed: 5,
        ..Opts::default()
    };
    let started = std::time::Instant::now();
    let out = run(&ops, &o, Duration::from_secs(3600));
    check(&ops, o.seed, &out);
    let s = out.fabric;
    eprintln!(
        "soak: {n} messages in {:?} (virtual {:?}); fabric {s:?}; A {:?}; B {:?}",
        started.elapsed(),
        out.virtual_time,
        out.a_counters,
        out.b_counters
    );
    assert!(s.lost > 0 && s.reordered > 0 && s.duplicated > 0 && s.corrupted > 0);
    let icrc = out.a_counters.icrc_errors + out.b_counters.icrc_errors;
    let drops = out.a_counters.total_drops() + out.b_counters.total_drops();
    assert!(icrc > 0, "corruption is caught by the ICRC");
    assert!(drops >= icrc);
    assert!(out.b_counters.duplicate_request > 0 && out.a_counters.completer_retry_err > 0);
}
