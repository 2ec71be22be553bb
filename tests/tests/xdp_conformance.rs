//! The verbs conformance suite across a veth pair between two network namespaces this test
//! creates and removes: side a on the AF_XDP link (`xdp:xa0`, 10.77.0.1, namespace A), side b on
//! the UDP link (`udp:10.77.0.2:4791`, namespace B, `--link2-netns`). Every case (RC, UC, UD,
//! SRQ, error paths) must pass its own checks and agree field for field with the in-memory
//! fabric's records. Root only (namespaces, XDP, AF_XDP): skipped with a message otherwise, and
//! when hca's build had no clang for the XDP program.

use std::process::{Command, Output, Stdio};

const CONFORMANCE: &str = env!("CARGO_BIN_EXE_verbs-conformance");

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            ip(&["netns", "del", ns]);
        }
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn conformance_between_the_xdp_and_udp_links_agrees_with_the_fabric() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root (network namespaces, XDP, AF_XDP)");
        return;
    }
    if !hca::link::xdp::program::program_built() {
        eprintln!("skipped: the XDP program was not built (no clang / libbpf-dev: tests/setup.sh)");
        return;
    }
    let pid = std::process::id();
    let (a, b) = (format!("cxa{pid}"), format!("cxb{pid}"));
    let mut guard = Namespaces(Vec::new());
    for ns in [&a, &b] {
        if !ip(&["netns", "add", ns]) {
            eprintln!("skipped: ip netns add failed");
            return;
        }
        guard.0.push(ns.clone());
    }
    assert!(
        ip(&[
            "link", "add", "xa0", "netns", &a, "type", "veth", "peer", "name", "xb0", "netns", &b
        ]) && ip(&["-n", &a, "addr", "add", "10.77.0.1/24", "dev", "xa0"])
            && ip(&["-n", &b, "addr", "add", "10.77.0.2/24", "dev", "xb0"])
            && ip(&["-n", &a, "link", "set", "xa0", "up"])
            && ip(&["-n", &b, "link", "set", "xb0", "up"]),
        "setting up the veth pair failed"
    );
    let dir = std::env::temp_dir().join(format!("xdp-conformance-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let reference = dir.join("fabric.txt");
    let fabric = Command::new(CONFORMANCE)
        .args(["--link", "fabric", "--records-out"])
        .arg(&reference)
        .output()
        .unwrap();
    assert!(fabric.status.success(), "fabric run: {}", text(&fabric));
    // The suite bounds every wait itself (completions, retries); the child needs no timer here.
    let run = Command::new("ip")
        .args(["netns", "exec", &a, CONFORMANCE, "--link", "xdp:xa0"])
        .args([
            "--link2",
            "udp:10.77.0.2:4791",
            "--link2-netns",
            &b,
            "--compare",
        ])
        .arg(&reference)
        .output()
        .unwrap();
    let out = text(&run);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success(), "{out}");
    assert!(
        out.contains("on xdp:xa0,udp:10.77.0.2:4791") && out.contains(" 0 failed, 0 differences"),
        "{out}"
    );
}
