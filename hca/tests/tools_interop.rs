//! What the conformance matrix against Linux rxe (`tests/guest/matrix.sh`) found missing in the tools,
//! checked here without a guest: a device on an IPv6 link-local address (`--link udp:fe80::...`)
//! needs the scope of the interface that holds it (bind(2) of a link-local address without one
//! fails with EINVAL), and the tools now take it from the address. Root only: the run happens in a
//! network namespace of its own with a bridge holding two link-local addresses (no DAD), and the
//! tools' TCP exchange goes over that namespace's loopback.
#![cfg(feature = "tools")]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PINGPONG: &str = env!("CARGO_BIN_EXE_rdma-pingpong");
const DEADLINE: Duration = Duration::from_secs(120);

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn spawn_in(ns: &str, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, PINGPONG])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn pingpong_between_ipv6_link_local_devices() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root (a network namespace)");
        return;
    }
    let ns = format!("hca-ll-{}", std::process::id());
    if !ip(&["netns", "add", &ns]) {
        eprintln!("skipped: ip netns add failed");
        return;
    }
    let ok = ip(&["-n", &ns, "link", "set", "lo", "up"])
        && ip(&["-n", &ns, "link", "add", "b0", "type", "bridge"])
        && ip(&["-n", &ns, "link", "set", "b0", "mtu", "4200", "up"])
        && ip(&["-n", &ns, "addr", "add", "fe80::a/64", "dev", "b0", "nodad"])
        && ip(&["-n", &ns, "addr", "add", "fe80::b/64", "dev", "b0", "nodad"]);
    let outs = ok.then(|| {
        let common = ["-s", "8192", "-m", "4096", "-n", "20", "-c", "-p", "18933"];
        let server = spawn_in(
            &ns,
            &[&["--link", "udp:fe80::a", "--timeout", "60"][..], &common].concat(),
        );
        let client = spawn_in(
            &ns,
            &[
                &["--link", "udp:fe80::b", "--timeout", "60"][..],
                &common,
                &["127.0.0.1"],
            ]
            .concat(),
        );
        (finish(server), finish(client))
    });
    ip(&["netns", "del", &ns]);
    assert!(ok, "could not set up the namespace {ns}");
    let (server, client) = outs.unwrap();
    for (who, o) in [("server", &server), ("client", &client)] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{who} failed: {}\n{out}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("20 iters in"), "{who}: {out}");
        assert!(
            out.contains("GID fe80::"),
            "{who} shows its link-local GID: {out}"
        );
    }
}
