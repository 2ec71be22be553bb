//! `coll-perf` under Open MPI's real `mpirun`, as the README says users may run it: 4 ranks on this
//! host (`--oversubscribe`: the CI machine has 2 CPUs), once over shared memory and once over RoCE
//! (each rank's software HCA on its own 127.0.0.x), data checked (`-c 1`). The ranks learn their
//! rank, size and local rank from `OMPI_COMM_WORLD_*` and rendezvous on 127.0.0.1 at a port derived
//! from the job id (`collectives::bootstrap::launcher`).
//!
//! `mpirun` comes from Debian's `openmpi-bin`, which `tests/setup.sh` installs (the README's test
//! command runs it). Without it this test fails with that advice, unless `COLL_SKIP_MPIRUN=1`.
#![cfg(feature = "perf")]

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_coll-perf");

/// Runs 4 ranks of `coll-perf all-reduce` under `mpirun` with `--transport transport`; returns
/// rank 0's stdout (the table) after checking the exit status.
fn mpirun(transport: &str) -> Option<String> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        if std::env::var("COLL_SKIP_MPIRUN").is_ok_and(|v| v == "1") {
            eprintln!("mpirun not found; skipped because COLL_SKIP_MPIRUN=1");
            return None;
        }
        panic!("mpirun not found: run `bash tests/setup.sh` as root (or set COLL_SKIP_MPIRUN=1)");
    }
    let out = Command::new("timeout")
        .args([
            "--kill-after=10",
            "300",
            "mpirun",
            "--oversubscribe",
            "-np",
            "4",
        ])
        // Open MPI refuses to start as root without both (CI runs as root).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            EXE,
            "all-reduce",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "4",
            "-c",
            "1",
        ])
        .args(["-n", "5", "-w", "1", "--transport", transport])
        .output()
        .expect("run mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpirun ... coll-perf --transport {transport} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    Some(stdout)
}

/// Checks the table: every rank took `transport` to some peer, 4 sizes, no wrong element.
fn check(stdout: &str, transport: &str) {
    assert!(stdout.contains("nRanks 4"), "{stdout}");
    for rank in 1..4 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("#  Rank  {rank} ")))
            .unwrap_or_else(|| panic!("no line for rank {rank}: {stdout}"));
        assert!(line.ends_with(&format!("via {transport}")), "{line}");
    }
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, ["1024", "4096", "16384", "65536"], "{stdout}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!((r[8], r[12]), ("0", "0"), "wrong elements: {r:?}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

/// One test, the two transports in turn: two `mpirun` jobs at once could pick the same rendezvous
/// port (each derives it from its job id).
#[test]
fn four_ranks_under_mpirun_over_shared_memory_then_roce() {
    for transport in ["shm", "roce"] {
        if let Some(stdout) = mpirun(transport) {
            check(&stdout, transport);
        }
    }
}
