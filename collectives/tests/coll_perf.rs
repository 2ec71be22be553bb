//! `coll-perf` as users run it: bare with `--ranks` (it starts its own rank processes), under a
//! torchrun-style environment, with bad options, and with a rank process killed mid-run.
//!
//! Every child is waited for with a safety deadline (then killed) so that a regression fails
//! the test instead of hanging the suite; no assertion is about elapsed time.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
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
    coll_perf_env(args, &[])
}

/// Reads `stdout` of a running coll-perf up to and including its table header (the line with
/// "(elements)"), failing if it ends first; returns the lines after it.
fn past_the_header(stdout: ChildStdout) -> Lines<BufReader<ChildStdout>> {
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("(elements)") {
            return lines;
        }
    }
    panic!("no table header in: {seen}");
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

/// Runs `coll-perf` with the arguments of `command_line` (split at white space), which must
/// succeed and report no wrong element in any row, out of place or in place; returns its
/// stdout and its rows.
fn run_clean(command_line: &str) -> (String, Vec<(u64, u64, String, String)>) {
    let args: Vec<&str> = command_line.split_whitespace().collect();
    let out = coll_perf(&args);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{command_line}: stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    let rows = rows(&stdout);
    for (_, _, a, b) in &rows {
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("0", "0"),
            "{command_line}\n{stdout}"
        );
    }
    (stdout, rows)
}

#[test]
fn bare_all_reduce_on_four_ranks_matches_nccl_tests_output() {
    let (stdout, rows) = run_clean("all-reduce --ranks 4 -b 1K -e 1M -f 2");
    assert_eq!(rows.len(), 11, "1K, 2K, ..., 1M:\n{stdout}");
    for (i, (size, count, _, _)) in rows.iter().enumerate() {
        assert_eq!(*size, 1024 << i);
        assert_eq!(*count, size / 4);
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
        let (stdout, rows) = run_clean(&format!(
            "{coll} --ranks 4 -b 1K -e 1M -f 8 --transport roce"
        ));
        assert_eq!(rows.len(), 4, "1K, 8K, 64K, 512K:\n{stdout}");
        assert!(stdout.contains("via roce"), "{stdout}");
    }
}

#[test]
fn other_collectives_types_and_ops_check_clean() {
    for command_line in [
        "all-gather --ranks 3 -b 1K -e 64K -f 4 -d half",
        "reduce-scatter --ranks 3 -b 1000 -e 1000 -o avg -d int32",
        "broadcast --ranks 2 -b 4K -e 4K -r 1 -d bfloat16",
        "reduce --ranks 3 -b 4K -e 4K -r 2 -o prod -d double",
        "all-to-all --ranks 4 -b 8K -e 8K -d uint8",
        "scatter --ranks 3 -b 3K -e 3K -r 1",
        "gather --ranks 3 -b 3K -e 3K -r 2 -o min -n 2",
    ] {
        let (stdout, rows) = run_clean(command_line);
        assert!(!rows.is_empty(), "{command_line}\n{stdout}");
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

    // Ranks that would share one RoCE address: refused by the launcher before it starts them.
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
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("127.0.0.9") && err.contains("COLL_ROCE_ADDR"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

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
    let lines = past_the_header(children[0].stdout.take().unwrap());
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
    // Beyond any address space: refused up front, before any rank starts, in one line (the
    // memory check; see also tests/coll_perf_memory.rs).
    for (coll, size) in [
        ("all-reduce", "15000000000G"),
        ("all-gather", "15000000000G"),
    ] {
        let out = coll_perf(&[coll, "--ranks", "2", "-b", size, "-e", size]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{coll} {size}: {err}");
        assert!(err.contains("host memory"), "{coll} {size}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{coll} {size}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{coll} {size}: {err}");
    }
}

/// `coll-perf` with the environment of a bare run plus `env`, waited for with [`wait_bounded`].
fn coll_perf_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let child = Command::new(EXE)
        .args(args)
        .envs(env.iter().copied())
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

/// What would make every local rank fail alike is said once, by the launcher, before it starts
/// any rank: one line and no "rank N exited" lines (the ranks printed one line each, spliced
/// into each other, and then the launcher one line per rank). Sizes of 2^64 bytes or more are
/// "too large" (they printed as 18446744073709551615).
#[test]
fn launcher_says_once_what_every_rank_would_fail_on() {
    // (arguments, environment, exit code, what the line names)
    type Refusal<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a [&'a str]);
    let base = ["-n", "1", "-T", "20"];
    let cases: [Refusal; 8] = [
        (
            &["broadcast", "--ranks", "4", "-r", "7"],
            &[],
            2,
            &["-r/--root 7", "--ranks 4"],
        ),
        (
            &["all-reduce", "--ranks", "3", "--link", "udp:127.0.0.1"],
            &[],
            2,
            &[
                "--link udp:127.0.0.1",
                "each rank needs its own",
                "COLL_ROCE_ADDR",
            ],
        ),
        (
            &[
                "all-reduce",
                "--ranks",
                "2",
                "--link",
                "udp:127.0.0.1:28519",
            ],
            &[],
            2,
            &["--link udp:127.0.0.1:28519", "each rank needs its own"],
        ),
        (
            &["all-reduce", "--ranks", "3", "--transport", "roce"],
            &[("COLL_ROCE_ADDR", "127.0.0.91,127.0.0.92,127.0.0.91")],
            2,
            &["2 distinct addresses for 3 local ranks"],
        ),
        (
            &["all-reduce", "--ranks", "2", "--transport", "roce"],
            &[("COLL_ROCE_ADDR", "junk")],
            2,
            &["COLL_ROCE_ADDR=junk", "IP addresses separated by commas"],
        ),
        (
            // TEST-NET-1 (RFC 5737): no host has it.
            &["all-reduce", "--ranks", "1", "--link", "udp:192.0.2.1"],
            &[],
            1,
            &["192.0.2.1", "not usable on this host"],
        ),
        (
            &["all-reduce", "--ranks", "2", "--link", "verbs:no_such_dev0"],
            &[],
            1,
            &["no_such_dev0"],
        ),
        (
            &["all-reduce", "-b", "99999999999G"],
            &[],
            2,
            &["too large"],
        ),
    ];
    for (args, env, code, needles) in cases {
        let args = [args, &base[..]].concat();
        let out = coll_perf_env(&args, env);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?} {env:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?} {env:?}: no '{n}' in: {err}");
        }
        // clap adds a blank line and "For more information, try '--help'." to its errors.
        let said = err
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
            .count();
        assert_eq!(said, 1, "{args:?} {env:?}: one line: {err}");
        assert!(!err.contains("18446744073709551615 >"), "{err}");
        assert!(out.stdout.is_empty(), "{args:?}: no rank ran");
    }
}

/// The header's `transport:` is the transport in use: `roce` when `--link` selected it (it said
/// `auto`), `auto (shm)` when auto chose shared memory between the ranks of this host.
#[test]
fn header_names_the_transport_in_use() {
    for (extra, want) in [
        (&["--link", "udp"][..], "transport: roce\n"),
        (&["--transport", "roce"][..], "transport: roce\n"),
        (&[][..], "transport: auto (shm)\n"),
    ] {
        let args = [
            &[
                "all-reduce",
                "--ranks",
                "2",
                "-b",
                "1K",
                "-e",
                "1K",
                "-n",
                "1",
                "-T",
                "30",
            ][..],
            extra,
        ]
        .concat();
        let out = coll_perf(&args);
        let (stdout, err) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(stdout.contains(want), "{args:?}: no '{want}' in:\n{stdout}");
    }
}

/// The processes whose parent is `pid` (from /proc/PID/stat: the field after the state).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if stat_of(p).is_some_and(|(_, ppid)| ppid == pid) {
            out.push(p);
        }
    }
    out
}

/// (state, parent pid) of `pid`, `None` once it is gone.
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` has ended (gone, or a zombie nobody has reaped yet).
fn ended(pid: u32) -> bool {
    stat_of(pid).is_none_or(|(state, _)| matches!(state, 'Z' | 'X'))
}

/// The launcher killed alone (SIGKILL, which it cannot catch, and SIGTERM; SIGINT takes the same
/// default action as SIGTERM) takes its ranks with it: before PR_SET_PDEATHSIG they were
/// re-parented and kept running their 10^8 iterations. Ranks still alive after the safety
/// deadline are killed here so that a failure leaves nothing behind.
#[test]
fn ranks_die_with_the_launcher() {
    for signal in ["KILL", "TERM"] {
        let mut launcher = Command::new(EXE)
            .args([
                "all-reduce",
                "--ranks",
                "3",
                "-b",
                "1K",
                "-e",
                "1K",
                "-n",
                "100000000",
                "-w",
                "0",
                "-c",
                "0",
                "-T",
                "30",
            ])
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .env_remove("COLL_COMM_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Rank 0 prints the table header once every rank has joined.
        let lines = past_the_header(launcher.stdout.take().unwrap());
        let drain = std::thread::spawn(move || for _ in lines {});
        let ranks = children_of(launcher.id());
        assert_eq!(ranks.len(), 3, "the launcher's children: {ranks:?}");

        if signal == "KILL" {
            launcher.kill().unwrap();
        } else {
            let st = Command::new("kill")
                .args(["-TERM", &launcher.id().to_string()])
                .status()
                .unwrap();
            assert!(st.success());
        }
        launcher.wait().unwrap();

        let deadline = Instant::now() + Duration::from_secs(60);
        while !ranks.iter().all(|&p| ended(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let alive: Vec<u32> = ranks.iter().copied().filter(|&p| !ended(p)).collect();
        for p in &alive {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
        }
        assert!(
            alive.is_empty(),
            "SIG{signal} to the launcher left ranks {alive:?} running"
        );
        drain.join().unwrap();
    }
}
