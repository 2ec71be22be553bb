//! UCX 1.13 (Debian 12's `ucx-utils`, unmodified) and Open MPI 4.1 with `--mca pml ucx` on the
//! drop-in `libibverbs.so.1` (issue 18's stretch): `ucx_info -d` lists the device with its
//! `rc_verbs` and `ud_verbs` transports, `ucx_perftest` runs over `rc_verbs` between two
//! processes on two loopback addresses, and an MPI all-reduce over 4 ranks checks its sums.
//!
//! UCX lists an IB device only when `/dev/infiniband/uverbsN` is a read-write character device
//! (`uct_ib_device_is_accessible`, `src/uct/ib/base/ib_md.c`) and reads the GID types from
//! `/sys/class/infiniband/DEV/ports/N/gid_attrs/types/M`, which only a kernel device has: every
//! UCX process runs under `tests/sysfs-ib.sh`, which shows the kernel's view of the library's
//! devices in a private mount namespace (root only; the library itself never reads it). The test
//! checks both that `ucx_info -d` finds no device without that view and that it finds it with it.
//!
//! `UCX_UD_VERBS_ETH_DGID_CHECK=n`: UCX 1.13's `ud_verbs` (the wire-up transport `rc_verbs`
//! needs) takes a UD completion's `sl` as mlx5's RoCE packet type; rxe and this library leave it
//! 0, so UCX reads an IPv4 packet's GRH area as IPv6 and drops every UD packet as addressed to
//! another GID (openucx/ucx PR 10209 fixes this for non-mlx providers after 1.13). The lanes UCX
//! picks are read from its debug log: every endpoint's data lane must be `rc_verbs/rxe0:1`.
//!
//! Skips, saying why, when `ucx_perftest` is not installed (`tests/setup.sh` installs
//! `ucx-utils`) or when not root. Every process runs under `timeout`; one UCX pair at a time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

mod common;
use common::{lib_dir, text};

/// `tests/sysfs-ib.sh` of this repository.
fn sysfs_ib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sysfs-ib.sh")
}

/// Whether the UCX checks can run here; prints why not.
fn ucx_available() -> bool {
    if !Path::new("/usr/bin/ucx_perftest").exists() {
        eprintln!(
            "ucx-utils is not installed (run `bash tests/setup.sh` as root): UCX checks skipped"
        );
        return false;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "not root: tests/sysfs-ib.sh needs a private mount namespace; UCX checks skipped"
        );
        return false;
    }
    true
}

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `timeout SECS tests/sysfs-ib.sh -- PROGRAM ARGS` on device `rxe0` at `address`, with the
/// library and UCX's transports chosen.
fn ucx_command(address: &str, secs: u32, program: &str, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string())
        .arg(sysfs_ib())
        .arg("--")
        .arg(program)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", format!("rxe0=udp:{address}"))
        .env("UCX_TLS", "rc_verbs,ud_verbs,self")
        .env("UCX_NET_DEVICES", "rxe0:1")
        .env("UCX_UD_VERBS_ETH_DGID_CHECK", "n")
        .env_remove("UCX_LOG_LEVEL");
    c
}

/// Whether a TCP socket listens on `port` (`/proc/net/tcp`, `/proc/net/tcp6`: state 0A).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// A TCP port for `ucx_perftest`'s exchange, from the process ID (several worktrees run the
/// suite on one host), and free now.
fn free_port(salt: u16) -> u16 {
    let base = 20000 + (std::process::id() % 20000) as u16;
    (0..100u16)
        .map(|i| base.wrapping_add(salt * 100 + i))
        .find(|&p| p > 1024 && !listening(p))
        .expect("a free TCP port")
}

#[test]
fn ucx_info_lists_the_device_only_with_the_sysfs_view() {
    if !ucx_available() {
        return;
    }
    let _serial = one_at_a_time();
    // Without the view: UCX finds no /dev/infiniband/uverbs0 and lists no IB memory domain.
    let bare = Command::new("timeout")
        .args(["60", "ucx_info", "-d"])
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", "rxe0=udp:127.0.18.1")
        .output()
        .expect("run ucx_info");
    let bare_out = text(&bare);
    assert!(bare.status.success(), "{bare_out}");
    assert!(
        !bare_out.contains("Memory domain: rxe0"),
        "rxe0 listed without /dev/infiniband (unexpected):\n{bare_out}"
    );
    let o = ucx_command("127.0.18.1", 60, "ucx_info", &["-d"])
        .output()
        .expect("run ucx_info");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let domain = out
        .split("# Memory domain: ")
        .find(|s| s.starts_with("rxe0\n"))
        .unwrap_or_else(|| panic!("no memory domain rxe0:\n{out}"));
    for want in [
        "Component: ib",
        "Transport: rc_verbs",
        "Transport: ud_verbs",
        "Device: rxe0:1",
        "atomic_fadd: 64 bit",
        "atomic_cswap: 64 bit",
    ] {
        assert!(domain.contains(want), "no `{want}` for rxe0:\n{domain}");
    }
}

/// One `ucx_perftest` server and client, on 127.0.18.11 and .12; returns the client's output
/// after checking both exits, the final row's iteration count and the `rc_verbs` lanes.
fn perftest(salt: u16, test: &str, size: &str, iters: u32) -> String {
    let _serial = one_at_a_time();
    let port = free_port(salt);
    let port_s = port.to_string();
    // The server's output goes to a file: its debug log would fill a pipe nobody reads yet.
    let log_path = std::env::temp_dir().join(format!("abi-ucx-{}-{salt}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("server log");
    let mut server: Child = ucx_command("127.0.18.11", 120, "ucx_perftest", &["-p", &port_s])
        .env("UCX_LOG_LEVEL", "debug")
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .expect("start ucx_perftest server");
    // Wait (bounded: 600 x 50 ms) until the server listens.
    let mut up = false;
    for _ in 0..600 {
        if listening(port) {
            up = true;
            break;
        }
        if server.try_wait().expect("server state").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !up {
        let _ = server.kill();
        let _ = server.wait();
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!("ucx_perftest server never listened on {port}:\n{log}");
    }
    let n = iters.to_string();
    let client = ucx_command(
        "127.0.18.12",
        120,
        "ucx_perftest",
        &["127.0.0.1", "-p", &port_s, "-t", test, "-s", size, "-n", &n],
    )
    .env("UCX_LOG_LEVEL", "debug")
    .output()
    .expect("run ucx_perftest client");
    let server = server.wait().expect("server exits");
    let (cout, sout) = (
        text(&client),
        std::fs::read_to_string(&log_path).unwrap_or_default(),
    );
    let _ = std::fs::remove_file(&log_path);
    let summary = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("UCX  DEBUG") && !l.contains("UCX  TRACE"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        client.status.success() && server.success(),
        "{test}: client {:?}, server {:?}\nclient:\n{}\nserver:\n{}",
        client.status,
        server,
        summary(&cout),
        summary(&sout)
    );
    let last = cout
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("{test}: no Final row:\n{}", summary(&cout)));
    assert_eq!(
        last.split_whitespace().nth(1),
        Some(n.as_str()),
        "{test}: iterations in {last}"
    );
    for (side, out) in [("client", &cout), ("server", &sout)] {
        let lanes = data_lanes(out);
        assert!(
            !lanes.is_empty() && lanes.iter().all(|l| l.contains("rc_verbs/rxe0:1")),
            "{test} {side}: lanes not all rc_verbs/rxe0:1: {lanes:#?}"
        );
    }
    summary(&cout)
}

/// The lanes of UCX's endpoints to other processes, from its debug log (`wireup.c`: "ep 0x..:
/// lane[0]:  1:rc_verbs/rxe0:1.0 md[1] -> ..."); an endpoint to the process itself uses `self`.
fn data_lanes(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(": lane[") && !l.contains(":self/"))
        .collect()
}

#[test]
fn ucx_perftest_over_rc_verbs() {
    if !ucx_available() {
        return;
    }
    // Tag matching (eager then rendezvous sizes), active messages, RDMA put and get, latency.
    for (salt, test, size, iters) in [
        (1, "tag_bw", "4096", 500),
        (2, "tag_bw", "1048576", 50),
        (3, "ucp_am_bw", "65536", 200),
        (4, "ucp_put_bw", "65536", 200),
        (5, "ucp_get", "65536", 200),
        (6, "tag_lat", "8", 300),
    ] {
        let out = perftest(salt, test, size, iters);
        eprintln!("{test} -s {size} -n {iters}:\n{out}");
    }
}

#[test]
fn open_mpi_pml_ucx_allreduce() {
    if !ucx_available() {
        return;
    }
    let (Some(mpicc), true) = (
        ["/usr/bin/mpicc"]
            .into_iter()
            .find(|p| Path::new(p).exists()),
        Path::new("/usr/bin/mpirun").exists(),
    ) else {
        eprintln!("mpicc / mpirun not installed (libopenmpi-dev, openmpi-bin): skipped");
        return;
    };
    let _serial = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("abi-ucx-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("allreduce.c");
    std::fs::write(&src, ALLREDUCE_C).unwrap();
    let exe = dir.join("allreduce");
    let cc = Command::new(mpicc)
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(cc.status.success(), "mpicc: {}", text(&cc));
    // Each rank its own device address (127.0.18.21 + rank) and its own sysfs view.
    let rank = dir.join("rank.sh");
    std::fs::write(
        &rank,
        format!(
            "#!/bin/bash\nexport ROCE_DEVICES=rxe0=udp:127.0.18.$((21 + OMPI_COMM_WORLD_RANK))\n\
             exec {} -- \"$@\"\n",
            sysfs_ib().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rank, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = Command::new("timeout")
        .args([
            "180",
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "4",
        ])
        .args(["--mca", "pml", "ucx", "--mca", "btl", "self"])
        .args([
            "-x",
            "LD_LIBRARY_PATH",
            "-x",
            "UCX_TLS",
            "-x",
            "UCX_NET_DEVICES",
        ])
        .args(["-x", "UCX_UD_VERBS_ETH_DGID_CHECK", "-x", "UCX_LOG_LEVEL"])
        .args(["-x", "UCX_LOG_FILE"])
        .arg(&rank)
        .arg(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("UCX_TLS", "rc_verbs,ud_verbs,self")
        .env("UCX_NET_DEVICES", "rxe0:1")
        .env("UCX_UD_VERBS_ETH_DGID_CHECK", "n")
        .env("UCX_LOG_LEVEL", "debug")
        // UCX's log to a file per process (%p: its pid), not to the stdout that mpirun merges:
        // there the ranks' result lines were cut into log lines now and then.
        .env("UCX_LOG_FILE", dir.join("ucx.%p.log"))
        .output()
        .expect("run mpirun");
    let summary = text(&o);
    let log: String = std::fs::read_dir(&dir)
        .expect("read the test directory")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("ucx."))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    assert!(o.status.success(), "mpirun: {:?}\n{summary}", o.status);
    for r in 0..4 {
        let want = format!("rank {r} of 4: allreduce of 262144 doubles, 0 wrong");
        assert!(summary.contains(&want), "no `{want}`:\n{summary}");
    }
    // Every rank connected to the 3 others over rc_verbs (a lane line per endpoint and lane).
    let lanes = data_lanes(&log);
    assert!(
        lanes.len() >= 12 && lanes.iter().all(|l| l.contains("rc_verbs/rxe0:1")),
        "lanes: {lanes:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 2 MiB all-reduce (UCX's rendezvous protocol) whose every sum is checked.
const ALLREDUCE_C: &str = r#"#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int n = 1 << 18;
    double *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
    for (int i = 0; i < n; i++) in[i] = rank * 1000.0 + i % 977;
    MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    long bad = 0;
    for (int i = 0; i < n; i++) {
        double want = 1000.0 * size * (size - 1) / 2 + (double)size * (i % 977);
        if (out[i] != want) bad++;
    }
    printf("rank %d of %d: allreduce of %d doubles, %ld wrong\n", rank, size, n, bad);
    MPI_Finalize();
    return bad != 0;
}
"#;
