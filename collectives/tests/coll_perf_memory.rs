//! `coll-perf` refuses, up front and in one line, sizes whose buffers for all local ranks exceed
//! the memory this host has available (issue 17: the OOM killer used to take ranks mid-run).

use std::process::Command;

/// A size no host has memory for: 2^50 bytes (1 PiB) per buffer.
const HUGE: &str = "1048576G";

fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_coll-perf"))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID")
        .output()
        .expect("coll-perf runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "no rank started: {:?}", out.stdout);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    lines[0].to_string()
}

#[test]
fn an_oversized_size_is_refused_before_any_rank_starts() {
    let line = refused(&["all-reduce", "-b", HUGE, "-e", HUGE, "--ranks", "2"]);
    assert!(
        line.contains("host memory") && line.contains("2 local rank") && line.contains("available"),
        "{line}"
    );
}

#[test]
fn under_a_launcher_each_rank_refuses_and_local_rank_0_says_it() {
    let run = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_coll-perf"))
            .args(["all-gather", "-b", HUGE, "-e", HUGE])
            .env("RANK", rank)
            .env("LOCAL_RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("LOCAL_WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "1") // never reached: refused before the rendezvous
            .output()
            .expect("coll-perf runs")
    };
    let r0 = run("0");
    let r1 = run("1");
    assert_eq!((r0.status.code(), r1.status.code()), (Some(2), Some(2)));
    let s0 = String::from_utf8_lossy(&r0.stderr);
    assert_eq!(s0.lines().count(), 1, "{s0}");
    assert!(s0.contains("host memory"), "{s0}");
    assert!(
        r1.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&r1.stderr)
    );
}
