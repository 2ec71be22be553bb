//! Debian's unmodified RDMA CM programs over the drop-in `librdmacm.so.1` / `libibverbs.so.1`
//! where several servers, each a process of its own, share ONE device address (port 4791, the
//! library's default shared mode), and their clients share another: the MADs for QP 1 reach one
//! process of each address, which routes them to the process that claims the REQ's service or
//! whose slot the Communication ID carries (`hca::link::udp::cm_route`).
//!
//! Readiness is not guessed: a server listens once its claim, the abstract Unix name
//! `@soft-hca/ADDR:4791/svc/<service id>`, appears in `/proc/net/unix`; after the run the test
//! checks that every claim is gone (the kernel frees them with the process).
//!
//! Covered: `rping -V`, `ucmatose -c 2`, `udaddy` (UD over SIDR) and `ib_write_bw -R` servers on
//! four ports of one address, their four clients on another, all at once; a second `rping -s` on
//! a claimed port fails with `EADDRINUSE`; after its owner is killed with SIGKILL, a client of that port gets
//! `RDMA_CM_EVENT_REJECTED, error 8` from the process that still holds the address, and the
//! claim is gone. A tool that is missing fails the test with the setup advice, unless
//! `ROCE_SKIP_DEBIAN_TOOLS=1`. Every process runs under `timeout`.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{both_libraries, text, tool};

/// One check at a time (each runs several processes on the 2-CPU VM).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `tool args` on device `rxeN=udp:ADDR` (port 4791, shared), under `timeout secs` unless
/// `secs` is 0 (then the tool itself is the child, so that SIGKILL reaches it).
fn command(device: &str, secs: u32, tool: &Path, args: &[&str]) -> Command {
    let mut c = if secs == 0 {
        let mut c = Command::new(tool);
        c.args(args);
        c
    } else {
        let mut c = Command::new("timeout");
        c.arg(secs.to_string())
            .args(["stdbuf", "-oL", "-eL"])
            .arg(tool)
            .args(args);
        c
    };
    c.env("LD_LIBRARY_PATH", both_libraries())
        .env("ROCE_DEVICES", device)
        .env_remove("SOFT_HCA_SHARE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The RDMA_PS_TCP and RDMA_PS_UDP ports with a claim on `addr`:4791 (`/proc/net/unix`, abstract
/// names `@soft-hca/ADDR:4791/svc/<16 hex digits>`; the service ID's low 16 bits are the port).
fn claims(addr: &str) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let prefix = format!("@soft-hca/{addr}:4791/svc/");
    let mut ports: Vec<u16> = table
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|p| p.strip_prefix(&prefix))
        .filter(|rest| !rest.contains('/'))
        .filter_map(|hex| u64::from_str_radix(hex, 16).ok())
        .filter(|sid| matches!(sid >> 16, 0x0106 | 0x0111))
        .map(|sid| sid as u16)
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// Waits (at most 30 s, polling every 100 ms) until `addr` has claims on all of `ports`.
fn wait_claims(addr: &str, ports: &[u16]) -> bool {
    for _ in 0..300 {
        let have = claims(addr);
        if ports.iter().all(|p| have.contains(p)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

struct Pair {
    name: &'static str,
    port: u16,
    server: Vec<String>,
    client: Vec<String>,
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs the servers of `pairs` (each a process on `rxe0=udp:a`), waits for their claims, then
/// all their clients at once (each a process on `rxe1=udp:b`); returns (server, client) outputs.
fn run_at_once(pairs: &[Pair], (a, b): (&str, &str)) -> Vec<(Output, Output)> {
    let servers: Vec<Child> = pairs
        .iter()
        .map(|p| {
            command(
                &format!("rxe0=udp:{a}"),
                60,
                &tool(p.name).unwrap(),
                &strs(&p.server),
            )
            .spawn()
            .expect("start server")
        })
        .collect();
    let ports: Vec<u16> = pairs.iter().map(|p| p.port).collect();
    let listening = wait_claims(a, &ports);
    let clients: Vec<Child> = pairs
        .iter()
        .map(|p| {
            command(
                &format!("rxe1=udp:{b}"),
                45,
                &tool(p.name).unwrap(),
                &strs(&p.client),
            )
            .spawn()
            .expect("start client")
        })
        .collect();
    let clients: Vec<Output> = clients
        .into_iter()
        .map(|c| c.wait_with_output().expect("client exits"))
        .collect();
    let out: Vec<(Output, Output)> = servers
        .into_iter()
        .zip(clients)
        .map(|(s, c)| {
            if !c.status.success() {
                // SAFETY: kill(2) on our own child (`timeout`, which passes SIGTERM on).
                unsafe { libc::kill(s.id() as libc::pid_t, libc::SIGTERM) };
            }
            (s.wait_with_output().expect("server exits"), c)
        })
        .collect();
    assert!(listening, "claims on {a}: {:?}, want {ports:?}", claims(a));
    out
}

#[test]
fn four_servers_on_one_shared_address_serve_four_clients_of_another_at_once() {
    if ["rping", "ucmatose", "ib_write_bw", "udaddy"]
        .iter()
        .any(|t| tool(t).is_none())
    {
        return;
    }
    let _serial = one_at_a_time();
    let (a, b) = ("127.0.0.63", "127.0.0.64");
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let pairs = [
        Pair {
            name: "rping",
            port: 7963,
            server: v(&["-s", "-a", a, "-p", "7963", "-C", "50", "-V"]),
            client: v(&["-c", "-a", a, "-p", "7963", "-C", "50", "-V", "-v"]),
        },
        Pair {
            name: "ucmatose",
            port: 7964,
            server: v(&["-b", a, "-p", "7964", "-c", "2", "-C", "10"]),
            client: v(&["-s", a, "-p", "7964", "-c", "2", "-C", "10"]),
        },
        // UD over SIDR (RDMA_PS_UDP); udaddy's port is its fixed 7174 (its -p is the port space).
        Pair {
            name: "udaddy",
            port: 7174,
            server: v(&["-b", a, "-C", "10"]),
            client: v(&["-s", a, "-C", "10"]),
        },
        Pair {
            name: "ib_write_bw",
            port: 7965,
            server: v(&["-R", "-d", "rxe0", "-n", "200", "-p", "7965"]),
            client: v(&["-R", "-d", "rxe1", "-n", "200", "-p", "7965", a]),
        },
    ];
    // perftest's -R connects twice and its client can reach the server before the second
    // listen (REJ reason 8, a race of the tool that `rdmacm_tools.rs` documents): only such a
    // pair runs again, alone, at most 5 times.
    let mut results = run_at_once(&pairs, (a, b));
    for (k, p) in pairs.iter().enumerate() {
        for _ in 0..5 {
            let c = text(&results[k].1);
            if !(c.contains("RDMA_CM_EVENT_REJECTED") && p.name == "ib_write_bw") {
                break;
            }
            eprintln!("{}: rejected before the second listen, again", p.name);
            let again = Pair {
                name: p.name,
                port: p.port,
                server: p.server.clone(),
                client: p.client.clone(),
            };
            results[k] = run_at_once(&[again], (a, b)).remove(0);
        }
    }
    for (p, (s, c)) in pairs.iter().zip(&results) {
        let (st, ct) = (text(s), text(c));
        assert!(
            s.status.success(),
            "{} server failed:\n{st}\nclient:\n{ct}",
            p.name
        );
        assert!(
            c.status.success(),
            "{} client failed:\n{ct}\nserver:\n{st}",
            p.name
        );
    }
    let rping = text(&results[0].1);
    let pings = rping
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(pings, 50, "{rping}");
    assert!(!rping.contains("data mismatch"), "{rping}");
    for o in [&results[1].0, &results[1].1] {
        assert!(text(o).contains("data transfers complete"), "{}", text(o));
    }
    for o in [&results[2].0, &results[2].1] {
        assert!(text(o).contains("data transfers complete"), "{}", text(o));
        assert!(text(o).contains("return status 0"), "{}", text(o));
    }
    for o in [&results[3].0, &results[3].1] {
        assert!(text(o).contains("BW average[MB/sec]"), "{}", text(o));
    }
    assert_eq!(claims(a), Vec::<u16>::new(), "claims left behind");
}

#[test]
fn a_claimed_port_is_in_use_and_a_killed_owner_leaves_rej_8() {
    let Some(t) = tool("rping") else { return };
    let _serial = one_at_a_time();
    let (a, b) = ("127.0.0.65", "127.0.0.66");
    // Slot 0 of the address: a server on another port (its CM answers REQs nobody claims).
    let keeper = command(
        &format!("rxe0=udp:{a}"),
        60,
        &t,
        &["-s", "-a", a, "-p", "7967"],
    )
    .spawn()
    .expect("start keeper");
    assert!(wait_claims(a, &[7967]), "{:?}", claims(a));
    // The owner of port 7966, the tool itself as our child (SIGKILL reaches it).
    let mut owner = command(
        &format!("rxe0=udp:{a}"),
        0,
        &t,
        &["-s", "-a", a, "-p", "7966"],
    )
    .spawn()
    .expect("start owner");
    assert!(wait_claims(a, &[7966, 7967]), "{:?}", claims(a));
    // A second server on the claimed port: rdma_listen fails with EADDRINUSE.
    let dup = command(
        &format!("rxe0=udp:{a}"),
        20,
        &t,
        &["-s", "-a", a, "-p", "7966"],
    )
    .output()
    .expect("run second server");
    let d = text(&dup);
    assert!(!dup.status.success(), "{d}");
    assert!(d.contains("Address already in use"), "{d}");

    owner.kill().expect("SIGKILL");
    owner.wait().expect("reap");
    for _ in 0..100 {
        if !claims(a).contains(&7966) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        claims(a),
        vec![7967],
        "the kernel freed the dead owner's claim"
    );
    let o = command(
        &format!("rxe1=udp:{b}"),
        20,
        &t,
        &["-c", "-a", a, "-p", "7966", "-C", "1"],
    )
    .output()
    .expect("run client");
    // SAFETY: kill(2) on our own child (`timeout`, which passes SIGTERM on to rping).
    unsafe { libc::kill(keeper.id() as libc::pid_t, libc::SIGTERM) };
    let _ = keeper.wait_with_output();
    let out = text(&o);
    assert!(out.contains("RDMA_CM_EVENT_REJECTED, error 8"), "{out}");
    assert_eq!(claims(a), Vec::<u16>::new(), "claims left behind");
}
