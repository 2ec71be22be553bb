//! No `/dev/shm/coll-*` segment outlives a `coll-perf` run (issue 17): each rank unlinks its own
//! once every peer has mapped it, on failure, and the spawner removes what killed ranks left.

use std::process::Command;

/// The pids of the `Rank N Pid P` lines of coll-perf's header.
fn rank_pids(stdout: &str) -> Vec<u32> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#") && w.next() == Some("Rank")).then_some(())?;
            w.next()?; // "N"
            (w.next() == Some("Pid")).then_some(())?;
            w.next()?.parse().ok()
        })
        .collect()
}

#[test]
fn a_shared_memory_run_leaves_no_segment() {
    let out = Command::new(env!("CARGO_BIN_EXE_coll-perf"))
        .args(["all-reduce", "--ranks", "3", "-b", "4K", "-e", "4K"])
        .args(["-n", "2", "--transport", "shm", "-T", "30"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("COLL_COMM_ID")
        .output()
        .expect("coll-perf runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pids = rank_pids(&stdout);
    assert_eq!(pids.len(), 3, "{stdout}");
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("coll-") && pids.iter().any(|p| n.ends_with(&format!("-{p}"))))
        .collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
}
