//! rdma-core's own pyverbs test suite (Debian's `python3-pyverbs` ships it under
//! `/usr/share/doc/rdma-core/tests/`, partly gzipped) on the drop-in `libibverbs.so.1`: the test
//! files that apply to a RoCE device without vendor extensions (not the mlx5 / EFA / CUDA ones),
//! run by the suite's own `run_tests.py` with `--dev rxe0 --gid 0` on one device on a loopback
//! address (the suite runs both ends of its traffic in one process). Every test must pass or
//! skip; the skips and their reasons are listed in the README (features the software HCA lacks:
//! device memory, memory windows, XRC, ODP, raw packet QPs, parent domains, ...). Runs under
//! `timeout`; the suite is copied into a temporary directory and its `.gz` files unpacked there.
//!
//! `test_rdmacm` runs apart (`pyverbs_rdmacm_with_the_sysfs_view`), over both drop-in libraries:
//! its tests look for the device's interface under `/sys/class/infiniband/rxe0/device/net/`,
//! which only a kernel device has, so they run under `tests/sysfs-ib.sh --netns` (root: a
//! private mount and network namespace showing the kernel's view of the library's device on
//! 127.0.0.1, the address `ip addr` gives for `lo`); passive and active side are two processes
//! sharing the device's address.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{both_libraries, text};

/// The two tests run one at a time: the first call of `common::both_libraries` (`cargo build -p
/// ibverbs-abi -p rdmacm-abi`) may relink `libibverbs.so.1` (its features differ from `cargo test
/// --workspace`'s), and a Python started meanwhile finds no file there and loads rdma-core's
/// library instead (then "Failed to get devices list": no kernel device).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The suite's files that apply (the rest need mlx5, EFA or CUDA).
const FILES: &[&str] = &[
    "test_device",
    "test_pd",
    "test_mr",
    "test_cq",
    "test_cq_events",
    "test_cqex",
    "test_qp",
    "test_qpex",
    "test_atomic",
    "test_addr",
    "test_parent_domain",
    "test_fork",
    "test_relaxed_ordering",
    "test_odp",
    "test_shared_pd",
    "test_flow",
    "test_rss_traffic",
    "test_tag_matching",
];

#[test]
fn pyverbs_suite_passes_or_skips() {
    let suite = Path::new("/usr/share/doc/rdma-core/tests");
    if !suite.join("run_tests.py").exists() {
        if std::env::var("ROCE_SKIP_DEBIAN_TOOLS").is_ok_and(|v| v == "1") {
            eprintln!("python3-pyverbs is not installed; skipped because ROCE_SKIP_DEBIAN_TOOLS=1");
            return;
        }
        panic!("python3-pyverbs is not installed: run `bash tests/setup.sh` as root");
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let libs = both_libraries();
    let root = std::env::temp_dir().join(format!("abi-pyverbs-{}", std::process::id()));
    let dir = unpack(suite, &root);
    let o = Command::new("timeout")
        .arg("300")
        .arg("/usr/bin/python3")
        .arg("run_tests.py")
        .args(["--dev", "rxe0", "--gid", "0", "-v"])
        .args(FILES)
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &libs)
        .env("ROCE_DEVICES", "rxe0=udp:127.0.0.61")
        .output()
        .expect("run python3");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let passed = out
        .lines()
        .filter(|l| l.ends_with(" ok") || *l == "ok")
        .count();
    let ran: usize = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("unittest's summary");
    // Today: 160 tests, 77 passed, 83 skipped; the traffic tests (RC / UC / UD, qp_ex, cq_ex,
    // atomics, completion events) are among the passes.
    assert!(
        ran >= 150 && passed >= 70,
        "ran {ran}, passed {passed}:\n{out}"
    );
    for must_pass in [
        "test_qp_ex_rc_rdma_write ",
        "test_cq_events_rc ",
        "test_atomic_fetch_and_add ",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(must_pass) && l.ends_with("ok")),
            "{must_pass} did not pass:\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Copies the suite into `root/tests`, unpacking its `.gz` files; returns that directory.
fn unpack(suite: &Path, root: &Path) -> PathBuf {
    let dir = root.join("tests");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(suite).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".gz") {
            let o = Command::new("gzip")
                .arg("-dc")
                .arg(&p)
                .output()
                .expect("gzip");
            assert!(o.status.success(), "gzip -dc {}", p.display());
            std::fs::write(dir.join(stem), o.stdout).unwrap();
        } else if p.is_file() {
            std::fs::copy(&p, dir.join(&name)).unwrap();
        }
    }
    dir
}

/// The RC and UD (`RDMA_PS_UDP`, SIDR) tests of `test_rdmacm` that must pass (all 7 of them; the
/// file's other tests are the 3 multicast ones, skipped: "Multicast is not supported on this
/// device"). `async_traffic_external_qp` brings its own QP up with `rdma_init_qp_attr` (passive
/// side before `rdma_accept`, active side after `RDMA_CM_EVENT_CONNECT_RESPONSE`) and calls
/// `rdma_establish`.
const RDMACM_MUST_PASS: &[&str] = &[
    "test_rdmacm_sync_traffic",
    "test_rdmacm_async_traffic",
    "test_rdmacm_async_traffic_external_qp",
    "test_rdmacm_async_reject_traffic",
    "test_rdmacm_async_read",
    "test_rdmacm_async_write",
    "test_rdmacm_async_udp_traffic",
];

#[test]
fn pyverbs_rdmacm_with_the_sysfs_view() {
    let suite = Path::new("/usr/share/doc/rdma-core/tests");
    if !suite.join("run_tests.py").exists() {
        eprintln!("python3-pyverbs is not installed (run `bash tests/setup.sh` as root): skipped");
        return;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "not root: tests/sysfs-ib.sh needs private mount and network namespaces; skipped"
        );
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let libs = both_libraries();
    let root = std::env::temp_dir().join(format!("abi-pyverbs-cm-{}", std::process::id()));
    let dir = unpack(suite, &root);
    let o = Command::new("timeout")
        .arg("300")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sysfs-ib.sh"))
        .args(["--netns", "--", "/usr/bin/python3", "run_tests.py"])
        .args(["--dev", "rxe0", "--gid", "0", "-v", "test_rdmacm"])
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &libs)
        .env("ROCE_DEVICES", "rxe0=udp:127.0.0.1")
        .output()
        .expect("run python3");
    let out = text(&o);
    // unittest's verbose lines: "test_x (tests.test_rdmacm.CMTestCase.test_x) ... ok" (an
    // error's line may carry the processes' messages before "ERROR").
    let result = |name: &str| -> Option<&str> {
        let start = out.find(&format!("{name} (tests."))?;
        let rest = &out[start..];
        ["ok\n", "skipped", "ERROR\n", "FAIL\n"]
            .into_iter()
            .filter_map(|r| rest.find(r).map(|at| (at, r)))
            .min()
            .map(|(_, r)| r.trim_end())
    };
    for name in RDMACM_MUST_PASS {
        assert_eq!(result(name), Some("ok"), "{name}:\n{out}");
    }
    for name in [
        "test_rdmacm_async_multicast_traffic",
        "test_rdmacm_async_ex_multicast_traffic",
        "test_rdmacm_async_ex_leave_multicast_traffic",
    ] {
        assert_eq!(result(name), Some("skipped"), "{name}:\n{out}");
    }
    let ran: usize = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("unittest's summary:\n{out}"));
    assert_eq!(ran, RDMACM_MUST_PASS.len() + 3, "{out}");
    // unittest's summary: 7 passed, 3 skipped, nothing failed.
    assert!(out.contains("OK (skipped=3)"), "{out}");
    let _ = std::fs::remove_dir_all(&root);
}
