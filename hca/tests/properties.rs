//! Property tests: random RC operation sequences (SEND, SEND with immediate, RDMA WRITE, WRITE
//! with immediate, RDMA READ, fetch-and-add, compare-and-swap; 0 bytes .. 1 MiB, 1..4 SGEs)
//! between two QPs under random fault schedules deliver exactly what a lossless run delivers and
//! what the sequential model says, complete in order, never panic, and execute each atomic
//! exactly once (the model's fetch-and-add sums and compare-and-swap outcomes would differ
//! otherwise).

mod common;

use std::time::Duration;

use common::workload::{check, generate, run};
use common::*;
use hca::fabric::Faults;
use hca::PathMtu;
use proptest::prelude::*;

fn arb_faults() -> impl Strategy<Value = Faults> {
    (
        0.0..0.12f64,
        0.0..0.03f64,
        0.0..0.08f64,
        0.0..0.005f64,
        0.0..0.2f64,
        0u64..3_000,
    )
        .prop_map(
            |(loss, duplicate, reorder, corrupt, ce_mark, jitter)| Faults {
                loss,
                duplicate,
                reorder,
                corrupt,
                ce_mark,
                jitter: Duration::from_nanos(jitter),
                ..Faults::none()
            },
        )
}

/// The cases are drawn from a fixed seed, so that the suite is reproducible: under 12% loss an
/// RC QP may legitimately exhaust `retry_cnt` (eight rounds in a row without progress, about
/// 0.2^8 per stall), which a random seed would turn into a rare flake. Set `HCA_PROPTEST_SEED`
/// (and `PROPTEST_CASES`) to explore other cases.
fn config() -> ProptestConfig {
    let seed = std::env::var("HCA_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0003);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_operations_under_random_faults_match_a_lossless_run_and_the_model(
        seed in any::<u64>(),
        count in 1usize..40,
        faults in arb_faults(),
        pmtu in prop_oneof![
            Just(PathMtu::Mtu256),
            Just(PathMtu::Mtu1024),
            Just(PathMtu::Mtu2048),
            Just(PathMtu::Mtu4096)
        ],
        max_rd_atomic in 1u8..8,
        a_psn in prop_oneof![Just(0xff_ff00u32), 0u32..0x100_0000],
        window in prop_oneof![Just(4u32), Just(32), Just(128)],
        ack_req_every in prop_oneof![Just(1u32), Just(16), Just(64)],
        ack_delay_us in prop_oneof![Just(0u64), Just(20)],
    ) {
        // Messages up to 1 MiB; 64 KiB at PMTU 256 keeps the packet count of a case bounded.
        let max_len = if pmtu == PathMtu::Mtu256 { 64 << 10 } else { 1 << 20 };
        let ops = generate(seed, count, max_len);
        let base = Opts {
            seed,
            pmtu,
            max_rd_atomic,
            a_psn,
            config: hca::EngineConfig {
                max_unacked_psns: window,
                ack_req_every,
                ack_delay: Duration::from_micros(ack_delay_us),
                ..hca::EngineConfig::default()
            },
            ..Opts::default()
        };
        let lossless = run(&ops, &base, Duration::from_secs(60));
        check(&ops, seed, &lossless);
        let faulty = run(&ops, &Opts { faults, ..base }, Duration::from_secs(600));
        check(&ops, seed, &faulty);
        prop_assert_eq!(&faulty.a_wcs, &lossless.a_wcs);
        prop_assert_eq!(&faulty.b_wcs, &lossless.b_wcs);
        prop_assert!(faulty.a_mem == lossless.a_mem);
        prop_assert!(faulty.b_mem == lossless.b_mem);
    }
}
