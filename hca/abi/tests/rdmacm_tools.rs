//! Debian's own, unmodified RDMA CM programs (rdma-core's `rdmacm-utils`, perftest's `-R`) over
//! the drop-in `librdmacm.so.1` and `libibverbs.so.1` (`LD_LIBRARY_PATH`): `rping` with its data
//! verified, `ucmatose` with several connections (also in port space `RDMA_PS_IB`), `udaddy` (UD
//! over SIDR), `ib_write_bw -R`,
//! `ib_send_lat -R`, a REJ for a port nobody listens on, and the library's exported symbol
//! versions against rdma-core's.
//! Server and client are separate processes, each on its own loopback address through
//! `ROCE_DEVICES`.
//!
//! The test builds both libraries first (`cargo build -p ibverbs-abi -p rdmacm-abi`, the test's
//! own profile), as `cargo test` does not build the librdmacm cdylib for this crate's tests.
//! A tool that is missing fails the test with the setup advice, unless
//! `ROCE_SKIP_DEBIAN_TOOLS=1`. Every process runs under `timeout`.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{both_libraries, text, tool};

/// One server / client pair at a time: seven pairs at once on the 2-core VM at load 12 once starved
/// an RC exchange into retry exhaustion (`ib_write_bw`: "Bad wc status 12").
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn command(devices: &str, secs: u32, tool: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    // Line-buffered, so a tool that `timeout` ends still leaves what it printed.
    c.arg(secs.to_string())
        .args(["stdbuf", "-oL", "-eL"])
        .arg(tool)
        .args(args)
        .env("LD_LIBRARY_PATH", both_libraries())
        .env("ROCE_DEVICES", devices)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Most server / client pairs [`pair`] starts for one check.
const MAX_PAIRS: u32 = 10;

/// Starts `server_args` on `a`, waits, then runs `client_args` on `b` against it; returns both
/// outputs. A client rejected with REJ reason 8 (no listener: `RDMA_CM_EVENT_REJECTED` or,
/// synchronous, `Connection refused`) is a race of the tools, not of the libraries, and the whole
/// pair starts again (at most [`MAX_PAIRS`] times, each waiting 0.5 s longer for the server):
/// * the server may not listen yet (it starts under load);
/// * perftest's `-R` connects twice: its exchange connection, then the test's own after a
///   handshake over the first, when its server listens again; a client fast enough connects
///   before that second listen and is rejected, as by Linux `cm.c` (`cm_match_req`). Debian
///   12's perftest 4.5-0.17 retries that connect with the ID and channel it just destroyed, and
///   fails; its server then waits for the test connection. Restarting only the client (what
///   this function once did) made the new client's exchange connection the old server's test
///   connection, whose QP has no receive posted: RNR NAKs until the client's retries ran out
///   ("Bad wc status 12"), 1 run in 3 at load 3-12. So a rejected client ends its pair.
fn pair(
    name: &str,
    (a, b): (&str, &str),
    server_args: &[&str],
    client_args: &[&str],
) -> Option<(Output, Output)> {
    let t = tool(name)?;
    let _serial = one_at_a_time();
    let mut last = None;
    for attempt in 1..=MAX_PAIRS {
        let server: Child = command(&format!("rxe0=udp:{a}"), 60, &t, server_args)
            .spawn()
            .expect("start server");
        std::thread::sleep(Duration::from_millis(500) * attempt);
        let client = command(&format!("rxe1=udp:{b}"), 45, &t, client_args)
            .output()
            .expect("run client");
        let out = text(&client);
        // A SIDR_REQ for a port nobody listens on is answered SIDR_REP status 1 (Unsupported),
        // which udaddy prints as UNREACHABLE with that status.
        let rejected = out.contains("RDMA_CM_EVENT_REJECTED")
            || out.contains("Connection refused")
            || out.contains("RDMA_CM_EVENT_UNREACHABLE, error: 1");
        if rejected {
            // SIGTERM to `timeout`, which passes it on to the tool (SIGKILL would leave the
            // tool running, bound to the address the next server needs).
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
        }
        let server = server.wait_with_output().expect("server exits");
        if !rejected {
            return Some((server, client));
        }
        eprintln!("{name}: pair {attempt} rejected (no listener), starting a new pair");
        last = Some((server, client));
    }
    last
}

fn assert_ok(name: &str, server: &Output, client: &Output) {
    let (s, c) = (text(server), text(client));
    assert!(
        server.status.success(),
        "{name} server failed:\n{s}\nclient:\n{c}"
    );
    assert!(
        client.status.success(),
        "{name} client failed:\n{c}\nserver:\n{s}"
    );
}

#[test]
fn rping_100_verified_pings() {
    let (a, b) = ("127.0.0.41", "127.0.0.42");
    let Some((s, c)) = pair(
        "rping",
        (a, b),
        &["-s", "-a", a, "-p", "7941", "-C", "100", "-V"],
        &["-c", "-a", a, "-p", "7941", "-C", "100", "-V", "-v"],
    ) else {
        return;
    };
    assert_ok("rping", &s, &c);
    let out = text(&c);
    let pings = out
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(pings, 100, "client:\n{out}");
    // -V: each ping's data was compared with what was sent; a mismatch prints this and fails.
    assert!(!out.contains("data mismatch"), "{out}");
    assert!(out.contains("ping data: rdma-ping-99: "), "{out}");
}

#[test]
fn ucmatose_four_connections() {
    let (a, b) = ("127.0.0.43", "127.0.0.44");
    let Some((s, c)) = pair(
        "ucmatose",
        (a, b),
        &["-b", a, "-p", "7943", "-c", "4", "-C", "10"],
        &["-s", a, "-p", "7943", "-c", "4", "-C", "10"],
    ) else {
        return;
    };
    assert_ok("ucmatose", &s, &c);
    for (side, o) in [("server", &s), ("client", &c)] {
        let out = text(o);
        assert!(out.contains("data transfers complete"), "{side}:\n{out}");
        assert!(out.contains("return status 0"), "{side}:\n{out}");
    }
}

/// `ucmatose -P ib`: two RC connections in port space `RDMA_PS_IB` (service IDs
/// `0x013F_pppp`), data both ways.
#[test]
fn ucmatose_in_the_ib_port_space() {
    let (a, b) = ("127.0.0.57", "127.0.0.58");
    let Some((s, c)) = pair(
        "ucmatose",
        (a, b),
        &["-b", a, "-p", "7957", "-P", "ib", "-c", "2", "-C", "10"],
        &["-s", a, "-p", "7957", "-P", "ib", "-c", "2", "-C", "10"],
    ) else {
        return;
    };
    assert_ok("ucmatose -P ib", &s, &c);
    for (side, o) in [("server", &s), ("client", &c)] {
        let out = text(o);
        assert!(out.contains("data transfers complete"), "{side}:\n{out}");
        assert!(out.contains("return status 0"), "{side}:\n{out}");
    }
}

/// `udaddy` (`RDMA_PS_UDP`): the client's SIDR_REQ, the server's SIDR_REP with its UD QPN and
/// Q_Key; 10 datagrams of 100 bytes each way (the client's QPN in the immediate data, the
/// server's replies through `ibv_create_ah_from_wc` from the GRH area of what it received);
/// both end with status 0 after their transfers.
#[test]
fn udaddy_ud_over_sidr() {
    let (a, b) = ("127.0.0.55", "127.0.0.56");
    let Some((s, c)) = pair(
        "udaddy",
        (a, b),
        // udaddy's port is its fixed 7174 (its -p is the port space).
        &["-b", a, "-C", "10"],
        &["-s", a, "-C", "10"],
    ) else {
        return;
    };
    assert_ok("udaddy", &s, &c);
    for (side, o) in [("server", &s), ("client", &c)] {
        let out = text(o);
        assert!(out.contains("data transfers complete"), "{side}:\n{out}");
        assert!(out.contains("return status 0"), "{side}:\n{out}");
    }
    assert!(text(&s).contains("sending replies"), "{}", text(&s));
}

/// `rdma_server` / `rdma_client` (synchronous IDs: `rdma_create_ep`, `rdma_get_request`; the
/// client's send is `IBV_SEND_INLINE` from unregistered memory) and `rdma_xserver` /
/// `rdma_xclient` (RC, a wildcard listener), each exchanging its message and ending with 0.
#[test]
fn rdma_server_and_client() {
    for (server, client, (a, b), port, sargs) in [
        (
            "rdma_server",
            "rdma_client",
            ("127.0.0.51", "127.0.0.52"),
            "7951",
            vec!["-s", "127.0.0.51"],
        ),
        (
            "rdma_xserver",
            "rdma_xclient",
            ("127.0.0.53", "127.0.0.54"),
            "7953",
            vec!["-c", "r"],
        ),
    ] {
        let (Some(st), Some(ct)) = (tool(server), tool(client)) else {
            return;
        };
        let _serial = one_at_a_time();
        let mut sargs = sargs.clone();
        sargs.extend(["-p", port]);
        let s = command(&format!("rxe0=udp:{a}"), 60, &st, &sargs)
            .spawn()
            .expect("start server");
        let mut c = None;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(500));
            let o = command(
                &format!("rxe1=udp:{b}"),
                30,
                &ct,
                &["-s", a, "-p", port, "-c", "r"][..if client == "rdma_client" { 4 } else { 6 }],
            )
            .output()
            .expect("run client");
            let retry = text(&o).contains("Connection refused");
            c = Some(o);
            if !retry {
                break;
            }
        }
        let c = c.expect("client ran");
        let s = s.wait_with_output().expect("server exits");
        assert_ok(server, &s, &c);
        assert!(
            text(&s).contains(&format!("{server}: end 0")),
            "{}",
            text(&s)
        );
        assert!(
            text(&c).contains(&format!("{client}: end 0")),
            "{}",
            text(&c)
        );
    }
}

/// perftest's `-R` (connect with RDMA CM): the run completes and both sides report a figure.
fn perftest_rdma_cm(name: &str, (a, b): (&str, &str), port: &str, head: &str) {
    let Some((s, c)) = pair(
        name,
        (a, b),
        &["-R", "-d", "rxe0", "-n", "200", "-p", port],
        &["-R", "-d", "rxe1", "-n", "200", "-p", port, a],
    ) else {
        return;
    };
    assert_ok(name, &s, &c);
    for (side, o) in [("server", &s), ("client", &c)] {
        let out = text(o);
        assert!(out.contains(head), "{name} {side}:\n{out}");
        assert!(!out.contains("Failed"), "{name} {side}:\n{out}");
    }
}

#[test]
fn ib_write_bw_over_rdma_cm() {
    perftest_rdma_cm(
        "ib_write_bw",
        ("127.0.0.45", "127.0.0.46"),
        "7945",
        "BW average[MB/sec]",
    );
}

#[test]
fn ib_send_lat_over_rdma_cm() {
    perftest_rdma_cm(
        "ib_send_lat",
        ("127.0.0.47", "127.0.0.48"),
        "7947",
        "t_typical[usec]",
    );
}

/// A REQ for a port nobody listens on (the peer runs a CM, listening elsewhere) is answered
/// with REJ "invalid service ID" (IBTA §12.6.7.2 reason 8), which rping reports as the
/// `REJECTED` event with that status, and exits with an error well before its timeout.
#[test]
fn connect_to_a_closed_port_is_rejected() {
    let Some(t) = tool("rping") else { return };
    let _serial = one_at_a_time();
    let (a, b) = ("127.0.0.49", "127.0.0.50");
    let mut server = command(
        &format!("rxe0=udp:{a}"),
        30,
        &t,
        &["-s", "-a", a, "-p", "7949"],
    )
    .spawn()
    .expect("start server");
    std::thread::sleep(Duration::from_millis(500));
    let o = command(
        &format!("rxe1=udp:{b}"),
        20,
        &t,
        &["-c", "-a", a, "-p", "7950", "-C", "1"],
    )
    .output()
    .expect("run client");
    // SIGTERM to `timeout`, which passes it on to rping (SIGKILL would kill `timeout` only and
    // leave `rping -s` running for good, as it did before).
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    let _ = server.wait();
    let out = text(&o);
    assert_eq!(
        o.status.code().map(|c| c != 0 && c != 124),
        Some(true),
        "{out}"
    );
    assert!(out.contains("RDMA_CM_EVENT_REJECTED, error 8"), "{out}");
}

/// tests/c/conn_param.c, compiled against rdma-core's `<rdma/rdma_cma.h>` and linked against
/// both drop-in libraries: `rdma_conn_param` as a C program sees it (the peer's depths and
/// retry counts in `CONNECT_REQUEST` from its own view, the REP's in the active `ESTABLISHED`,
/// none in the passive one; the QPs' `max_dest_rd_atomic` / `max_rd_atomic` / `retry_cnt` /
/// `rnr_retry` / `timeout` by ibv_query_qp(3); a depth above the device's `EINVAL`;
/// `RDMA_MAX_RESP_RES` taking the request's), and a UD ID's rdma_init_qp_attr(3).
#[test]
fn conn_param_from_c() {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        panic!("<rdma/rdma_cma.h> is missing: run `bash tests/setup.sh` as root (librdmacm-dev)");
    }
    let _serial = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("rdmacm-conn-param-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/conn_param.c");
    let exe = dir.join("conn_param");
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", both_libraries().display()))
        .args(["-l:librdmacm.so.1", "-l:libibverbs.so.1"])
        .output()
        .expect("cc is installed");
    assert!(cc.status.success(), "{}", text(&cc));
    let o = Command::new("timeout")
        .args(["30"])
        .arg(&exe)
        .args(["127.0.0.61", "127.0.0.62"])
        .env("LD_LIBRARY_PATH", both_libraries())
        .env("ROCE_DEVICES", "rxe0=udp:127.0.0.61,rxe1=udp:127.0.0.62")
        .output()
        .expect("run timeout");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("all checks passed"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `(version, name)` of every function `lib` defines (`want_defined`) or imports, from
/// `objdump -T`, for versions starting with `prefix`.
fn symbols(lib: &Path, want_defined: bool, prefix: &str) -> Option<Vec<(String, String)>> {
    let o = Command::new("objdump").arg("-T").arg(lib).output().ok()?;
    let mut v: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(" DF ") && l.contains("*UND*") != want_defined)
        .filter_map(|l| {
            let mut it = l.split_whitespace().rev();
            let name = it.next()?.to_owned();
            let ver = it.next()?.trim_matches(['(', ')']).to_owned();
            ver.starts_with(prefix).then_some((ver, name))
        })
        .collect();
    v.sort();
    Some(v)
}

/// Ours exports exactly rdma-core 44's functions at their versions, carries its SONAME and
/// needs libibverbs.so.1, whose private node defines every function it forwards to; and every
/// librdmacm function the Debian tools import is there at the version they ask for.
#[test]
fn exports_match_rdma_core_librdmacm() {
    let ours = both_libraries().join("librdmacm.so.1");
    let Some(exported) = symbols(&ours, true, "RDMACM") else {
        eprintln!("objdump (binutils) is not installed: skipped");
        return;
    };
    assert!(exported.contains(&("RDMACM_1.0".into(), "rdma_create_id".into())));
    assert!(exported.contains(&("RDMACM_1.2".into(), "rdma_establish".into())));
    let real = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    if let Some(theirs) = real
        .exists()
        .then(|| symbols(real, true, "RDMACM"))
        .flatten()
    {
        assert_eq!(exported, theirs, "ours vs rdma-core's librdmacm.so.1");
    }
    let d = Command::new("readelf")
        .arg("-d")
        .arg(&ours)
        .output()
        .expect("readelf");
    let d = String::from_utf8_lossy(&d.stdout);
    assert!(d.contains("Library soname: [librdmacm.so.1]"), "{d}");
    assert!(d.contains("Shared library: [libibverbs.so.1]"), "{d}");
    let forwarded = symbols(&ours, false, "IBVERBS_PRIVATE_RDMACM").unwrap();
    let provided = symbols(
        &both_libraries().join("libibverbs.so.1"),
        true,
        "IBVERBS_PRIVATE_RDMACM",
    )
    .unwrap();
    assert!(!forwarded.is_empty());
    assert_eq!(
        forwarded, provided,
        "what librdmacm imports vs what libibverbs defines"
    );
    for exe in [
        "rping",
        "ucmatose",
        "udaddy",
        "rdma_server",
        "rdma_client",
        "ib_write_bw",
        "ib_send_lat",
    ] {
        let Some(p) = tool(exe) else { continue };
        for (v, n) in symbols(&p, false, "RDMACM").unwrap() {
            assert!(
                exported.contains(&(v.clone(), n.clone())),
                "{exe} imports {n}@{v}"
            );
        }
    }
}
