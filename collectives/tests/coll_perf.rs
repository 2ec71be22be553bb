//! `coll-perf` as users run it: bare with `--ranks` (it starts its own rank processes), under a
//! torchrun-style environment, with bad options, and with a rank process killed mid-run.
//!
//! Every child is waited for with a safety deadline (then killed) so that a regression fails
//! the test instead of hanging the suite; no assertion is about elapsed time.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use collectives::UniqueId;

const EXE: &str = env!("CARGO_BIN_EXE_coll-perf");
const SAFETY: Duration = Duration::from_secs(240);

/// Waits for `child` at most `SAFETY`, killing it after that.
fn wait_bounded(mut child: Child) -> Output {
    let deadline = Instant::now() + SAFETY;
    loop {
        if child.try_wait().expect("try_wait").is_some() || Instant::now() >= deadline {
            let _ = child.kill();
            return child.wait_with_output().expect("wait_with_output");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn coll_perf(args: &[&str]) -> Output {
    let child = Command::new(EXE)
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("COLL_COMM_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn coll-perf");
    wait_bounded(child)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The data rows of a table: (size, count, #wrong out-of-place, #wrong in-place).
fn rows(stdout: &str) -> Vec<(u64, u64, String, String)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "row has 13 columns: {l}");
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[8].to_string(),
                f[12].to_string(),
            )
        })
        .collect()
}

#[test]
fn bare_all_reduce_on_four_ranks_matches_nccl_tests_output() {
    let out = coll_perf(&[
        "all-reduce",
        "--ranks",
        "4",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "2",
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 11, "1K, 2K, ..., 1M:\n{stdout}");
    for (i, (size, count, wrong_oop, wrong_ip)) in rows.iter().enumerate() {
        assert_eq!(*size, 1024 << i);
        assert_eq!(*count, size / 4);
        assert_eq!(
            (wrong_oop.as_str(), wrong_ip.as_str()),
            ("0", "0"),
            "{stdout}"
        );
    }
    for needle in [
        "# Collective test starting: coll-perf all-reduce",
        "#  Rank  3 Pid",
        "out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
        "float     sum      -1",
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : ",
    ] {
        assert!(stdout.contains(needle), "missing '{needle}':\n{stdout}");
    }
}

/// The main job over RoCE: `--transport roce` forces RDMA between the four local rank processes
/// (each binds its own UDP device on 127.0.0.<rank+1>).
#[test]
fn bare_run_over_roce_on_four_ranks() {
    for coll in ["all-reduce", "all-gather", "broadcast", "all-to-all"] {
        let out = coll_perf(&[
            coll,
            "--ranks",
            "4",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "8",
            "--transport",
            "roce",
        ]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{coll}: stdout:\n{stdout}\nstderr:\n{}",
            text(&out.stderr)
        );
        let rows = rows(&stdout);
        assert_eq!(rows.len(), 4, "1K, 8K, 64K, 512K:\n{stdout}");
        for (_, _, a, b) in rows {
            assert_eq!((a.as_str(), b.as_str()), ("0", "0"), "{coll}\n{stdout}");
        }
        assert!(stdout.contains("via roce"), "{stdout}");
    }
}

#[test]
fn other_collectives_types_and_ops_check_clean() {
    for args in [
        &[
            "all-gather",
            "--ranks",
            "3",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "4",
            "-d",
            "half",
        ][..],
        &[
            "reduce-scatter",
            "--ranks",
            "3",
            "-b",
            "1000",
            "-e",
            "1000",
            "-o",
            "avg",
            "-d",
            "int32",
        ],
        &[
            "broadcast",
            "--ranks",
            "2",
            "-b",
            "4K",
            "-e",
            "4K",
            "-r",
            "1",
            "-d",
            "bfloat16",
        ],
        &[
            "reduce", "--ranks", "3", "-b", "4K", "-e", "4K", "-r", "2", "-o", "prod", "-d",
            "double",
        ],
        &[
            "all-to-all",
            "--ranks",
            "4",
            "-b",
            "8K",
            "-e",
            "8K",
            "-d",
            "uint8",
        ],
        &["scatter", "--ranks", "3", "-b", "3K", "-e", "3K", "-r", "1"],
        &[
            "gather", "--ranks", "3", "-b", "3K", "-e", "3K", "-r", "2", "-o", "min", "-n", "2",
        ],
    ] {
        let out = coll_perf(args);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}\n{stdout}\n{}",
            text(&out.stderr)
        );
        let rows = rows(&stdout);
        assert!(!rows.is_empty(), "{args:?}\n{stdout}");
        for (_, _, a, b) in rows {
            assert_eq!((a.as_str(), b.as_str()), ("0", "0"), "{args:?}\n{stdout}");
        }
    }
}

#[test]
fn bad_options_and_unusable_transports_fail_clearly() {
    let out = coll_perf(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage"), "{}", text(&out.stderr));

    let out = coll_perf(&["all-reduce", "-b", "2M", "-e", "1M"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("minbytes"),
        "{}",
        text(&out.stderr)
    );

    // Ranks that would share one RoCE address: refused at init, naming the other rank.
    let child = Command::new(EXE)
        .args([
            "all-reduce",
            "--ranks",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "--transport",
            "roce",
        ])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("COLL_COMM_ID")
        .env("COLL_ROCE_ADDR", "127.0.0.9")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("127.0.0.9") && err.contains("COLL_ROCE_ADDR"),
        "{err}"
    );

    let out = coll_perf(&[
        "all-reduce",
        "-c",
        "0",
        "--ranks",
        "1",
        "-b",
        "1K",
        "-e",
        "1K",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("N/A"), "-c 0 reports no check");
}

/// Under a launcher's environment each process is one rank; rank 0 hosts the rendezvous at
/// MASTER_ADDR:MASTER_PORT.
#[test]
fn torchrun_environment_runs_one_rank_per_process() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            Command::new(EXE)
                .args(["broadcast", "-b", "64K", "-e", "64K", "-n", "3", "-T", "30"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("COLL_COMM_ID")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children.into_iter().map(wait_bounded).collect();
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank}: {}", text(&o.stderr));
    }
    let rows = rows(&text(&outs[0].stdout));
    assert_eq!(rows.len(), 1);
    assert!(text(&outs[1].stdout).is_empty(), "only rank 0 prints");
}

/// A rank process killed with SIGKILL (no destructor runs): the others notice through its
/// pidfd, fail naming it, and exit.
#[test]
fn a_killed_rank_is_named_by_the_others() {
    killed_rank_is_named(&[]);
}

/// The same over RoCE with every rank claiming its own host (`COLL_HOSTID`), so that no rank
/// watches another's process: the survivors find the dead rank through their QPs (WRITEs and
/// probes to it end with `IBV_WC_RETRY_EXC_ERR`; a 16 ms ACK timeout keeps that quick).
#[test]
fn a_killed_rank_on_another_host_is_found_by_the_qps() {
    killed_rank_is_named(&[("COLL_TRANSPORT", "roce"), ("COLL_ROCE_TIMEOUT", "12")]);
}

fn killed_rank_is_named(env: &[(&str, &str)]) {
    let id = UniqueId::new().unwrap();
    let mut children: Vec<Child> = (0..3)
        .map(|rank| {
            let mut cmd = Command::new(EXE);
            cmd.envs(env.iter().copied());
            if !env.is_empty() {
                cmd.env("COLL_HOSTID", format!("host{rank}"));
            }
            cmd.args([
                "all-reduce",
                "-b",
                "256K",
                "-e",
                "256K",
                "-n",
                "100000000",
                "-w",
                "0",
                "-c",
                "0",
                "-T",
                "30",
            ])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "3")
            .env("COLL_COMM_ID", id.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    // Rank 0 prints the table header just before the timed loop starts.
    let stdout = children[0].stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("(elements)") {
            break;
        }
    }
    assert!(seen.contains("(elements)"), "{seen}");
    std::thread::sleep(Duration::from_millis(200));
    children[1].kill().unwrap();
    children[1].wait().unwrap();
    // Keep draining rank 0's stdout so it never blocks on a full pipe.
    let drain = std::thread::spawn(move || for _ in lines {});
    for rank in [0, 2] {
        let child = children.remove(if rank == 0 { 0 } else { 1 });
        let out = wait_bounded(child);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "rank {rank} must fail: {err}");
        assert!(
            err.contains("rank 1"),
            "rank {rank} names the killed rank: {err}"
        );
    }
    drain.join().unwrap();
}

/// Without a CUDA driver (this machine, CI) `--device cuda` fails at once with one clear line and a
/// non-zero exit, before starting any rank; with one it must run and check clean.
#[test]
fn device_cuda_without_a_gpu_is_one_clear_line() {
    let out = coll_perf(&[
        "all-reduce",
        "-b",
        "1K",
        "-e",
        "1K",
        "--ranks",
        "2",
        "--device",
        "cuda",
    ]);
    let err = text(&out.stderr);
    let driver = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/libcuda.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if driver {
        assert!(out.status.success(), "{err}");
        assert!(text(&out.stdout).contains("Out of bounds values : 0 OK"));
        return;
    }
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("coll-perf: --device cuda: no CUDA driver"),
        "{err}"
    );
    assert!(err.contains("libcuda.so.1"), "{err}");
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn device_option_is_parsed_and_checked() {
    let out = coll_perf(&["all-reduce", "--device", "tpu"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("tpu"));
}

/// Numbers past what a host can do are refused in one line per process, never with a panic, an
/// allocator abort or a run that cannot end: `-T` that overflows a deadline (it panicked in the
/// rendezvous thread), `--ranks` beyond the local spawner's bound (100000 processes were being
/// started), `-w` of 2^64 - 1 (a warm-up that never ends), and sizes larger than memory or the
/// address space (an allocator abort with a backtrace, or "capacity overflow").
#[test]
fn out_of_range_numbers_fail_clearly() {
    for (args, needle) in [
        (
            &["-T", "18446744073709551615"][..],
            "-T/--timeout must be from 1 to 86400",
        ),
        (&["--ranks", "100000"][..], "at most 256 rank processes"),
        (&["-w", "18446744073709551615"][..], "at most 100000000"),
    ] {
        let args = [&["all-reduce", "-b", "1K", "-e", "1K"][..], args].concat();
        let out = coll_perf(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    // Beyond any address space, so that no overcommit setting lets the allocation through.
    for (coll, size) in [
        ("all-reduce", "99999999999G"),
        ("all-gather", "99999999999G"),
    ] {
        let out = coll_perf(&[coll, "--ranks", "2", "-b", size, "-e", size]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{coll} {size}: {err}");
        assert!(
            err.contains("cannot allocate a host buffer of"),
            "{coll} {size}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{coll} {size}: {err}"
        );
        // Each rank names the failure in one line; the spawner adds one line per rank.
        assert!(err.trim_end().lines().count() <= 4, "{coll} {size}: {err}");
    }
}
