//! The `rdma-perf` and `rdma-pingpong` tools: command-line parsing, output formats, error exits
//! (bad flags, a device address not on this host, a peer that is not there, a malformed
//! exchange, ports in use) and end-to-end runs of every test, server and client on loopback
//! (distinct 127.x.y.z addresses per test, so tests run in parallel), data validated where the
//! tool validates (`rdma-pingpong -c`). Every child process runs under a deadline and is killed
//! past it.
#![cfg(feature = "tools")]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");
const PINGPONG: &str = env!("CARGO_BIN_EXE_rdma-pingpong");

/// Longest any tool run may take here (debug builds on a loaded machine are slow).
const DEADLINE: Duration = Duration::from_secs(120);

/// A pair of loopback addresses no other test (in this process or a concurrent run) uses.
fn addresses() -> (String, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let (b, c) = ((pid >> 8) as u8, pid as u8);
    let d = (2 * n + 1) as u8;
    (format!("127.{b}.{c}.{d}"), format!("127.{b}.{c}.{}", d + 1))
}

/// A TCP port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(bin: &str, args: &[&str]) -> Child {
    Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` up to `DEADLINE` (killing it past that) and collects its output.
fn finish(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish within {DEADLINE:?}\nstdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run(bin: &str, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = finish(spawn(bin, args), &format!("{bin} {args:?}"));
    (out, start.elapsed())
}

/// `rdma-perf write-bw --link LINK -p PORT --timeout 1 [SERVER]`: a server (no `server`) or a
/// client that gives up after one second without its peer.
fn write_bw_for_1s(link: &str, port: &str, server: Option<&str>) -> (Output, Duration) {
    let mut args = vec!["write-bw", "--link", link, "-p", port, "--timeout", "1"];
    args.extend(server);
    run(PERF, &args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs a server and a client of `bin` with `args` (plus their device and TCP port options);
/// both must succeed. Returns (server stdout, client stdout).
fn pair(bin: &str, sub: &[&str], args: &[&str]) -> (String, String) {
    let (a, b) = addresses();
    let port = free_port().to_string();
    let link_a = format!("udp:{a}");
    let link_b = format!("udp:{b}");
    let mut sargs: Vec<&str> = sub.to_vec();
    sargs.extend_from_slice(&["--link", &link_a, "-p", &port, "--timeout", "20"]);
    sargs.extend_from_slice(args);
    let server = spawn(bin, &sargs);
    let mut cargs: Vec<&str> = sub.to_vec();
    cargs.extend_from_slice(&["--link", &link_b, "-p", &port, "--timeout", "20"]);
    cargs.extend_from_slice(args);
    cargs.push("127.0.0.1");
    // The client retries its connection until the server listens.
    let client = spawn(bin, &cargs);
    let c = finish(client, "client");
    let s = finish(server, "server");
    let (so, co) = (text(&s.stdout), text(&c.stdout));
    assert!(
        s.status.success() && c.status.success(),
        "server {:?}:\n{so}\n{}\nclient {:?}:\n{co}\n{}",
        s.status,
        text(&s.stderr),
        c.status,
        text(&c.stderr)
    );
    (so, co)
}

/// The numeric columns of the result rows of a perftest-style output: the lines after the
/// column header up to the next dashed line.
fn result_rows(out: &str, header_start: &str) -> Vec<Vec<f64>> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in out.lines() {
        if line.starts_with(header_start) {
            inside = true;
            continue;
        }
        if inside {
            if line.starts_with("---") {
                break;
            }
            let cols: Vec<f64> = line
                .split_whitespace()
                .map(|c| {
                    c.parse::<f64>()
                        .unwrap_or_else(|_| panic!("bad number {c:?} in {line:?}"))
                })
                .collect();
            rows.push(cols);
        }
    }
    rows
}

const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

fn check_bw(out: &str, size: f64, iters: f64, who: &str) {
    assert!(
        out.contains(BW_HEADER),
        "{who}: no bandwidth header:\n{out}"
    );
    assert!(out.contains(" Link type       : Ethernet"), "{out}");
    assert!(
        out.contains(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:"),
        "{out}"
    );
    let rows = result_rows(out, " #bytes     #iterations");
    assert_eq!(rows.len(), 1, "{who}: {out}");
    let r = &rows[0];
    assert_eq!(r.len(), 5, "{who}: {out}");
    assert_eq!((r[0], r[1]), (size, iters), "{who}: {out}");
    assert!(
        r[3] > 0.0 && r[4] > 0.0,
        "{who}: average and rate are positive: {out}"
    );
}

fn check_lat(out: &str, size: f64, iters: f64) {
    assert!(out.contains(LAT_HEADER), "no latency header:\n{out}");
    let rows = result_rows(out, " #bytes #iterations");
    assert_eq!(rows.len(), 1, "{out}");
    let r = &rows[0];
    assert_eq!(r.len(), 9, "{out}");
    assert_eq!((r[0], r[1]), (size, iters), "{out}");
    // t_min <= t_typical <= t_max, t_min <= t_avg, percentiles ordered.
    assert!(r[2] > 0.0 && r[2] <= r[4] && r[4] <= r[3], "{out}");
    assert!(r[2] <= r[5] && r[7] <= r[8], "{out}");
}

// ---- command line ----

#[test]
fn help_lists_the_perftest_subcommands_and_flags() {
    let (out, _) = run(PERF, &["--help"]);
    assert!(out.status.success());
    let t = text(&out.stdout);
    for sub in [
        "write-bw",
        "read-bw",
        "send-bw",
        "atomic-bw",
        "write-lat",
        "read-lat",
        "send-lat",
    ] {
        assert!(t.contains(sub), "{t}");
    }
    let (out, _) = run(PERF, &["write-bw", "--help"]);
    let t = text(&out.stdout);
    for flag in [
        "--size",
        "--iters",
        "--all",
        "--qp",
        "--mtu",
        "--port",
        "--duration",
        "--report_gbits",
        "--gid-index",
        "--ib-dev",
        "--link",
    ] {
        assert!(t.contains(flag), "{flag}: {t}");
    }
    let (out, _) = run(PINGPONG, &["--help"]);
    let t = text(&out.stdout);
    for flag in [
        "--rc",
        "--uc",
        "--ud",
        "--gid-idx",
        "--iters",
        "--size",
        "--port",
        "--mtu",
        "--chk",
    ] {
        assert!(t.contains(flag), "{flag}: {t}");
    }
}

/// `-h` and `--help` print a help screen on stdout and exit 0, for every command.
#[test]
fn h_and_help_print_help_on_stdout() {
    for (bin, sub, usage) in [
        (PERF, &[][..], "Usage: rdma-perf <COMMAND>"),
        (
            PERF,
            &["send-lat"][..],
            "Usage: rdma-perf send-lat [OPTIONS] [SERVER]",
        ),
        (PINGPONG, &[][..], "Usage: rdma-pingpong [OPTIONS] [SERVER]"),
    ] {
        for flag in ["-h", "--help"] {
            let args = [sub, &[flag]].concat();
            let (out, _) = run(bin, &args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
            assert!(err.is_empty(), "{args:?}: {err}");
            assert!(text(&out.stdout).contains(usage), "{args:?}");
        }
    }
}

#[test]
fn bad_flags_exit_non_zero_with_one_clear_line() {
    // clap's usage errors exit with 2.
    let (out, _) = run(PERF, &["write-bw", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--no-such-flag"));
    let (out, _) = run(PERF, &["no-such-test"]);
    assert_eq!(out.status.code(), Some(2));
    let (out, _) = run(PINGPONG, &["--rc", "--ud"]);
    assert_eq!(out.status.code(), Some(2));
    let (out, _) = run(PINGPONG, &["--vfio-neigh", "10.0.0.1=52:54"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("expected IP=MAC"));
    // Values checked like perftest's parser: exit 1, one line naming the problem.
    for (bin, args, needle) in [
        (PERF, &["write-bw", "-q", "0"][..], "QPs"),
        (PERF, &["write-bw", "-m", "1000"][..], "MTU"),
        (PERF, &["write-bw", "-n", "2"][..], "Iteration"),
        (PERF, &["read-bw", "-c", "UC"][..], "RC"),
        (PERF, &["write-bw", "-c", "UD"][..], "UD"),
        (PERF, &["write-lat", "-q", "2"][..], "one QP"),
        (PERF, &["write-bw", "--link", "udp:rxe0"][..], "bad link"),
        (PINGPONG, &["-m", "1000"][..], "MTU"),
        (PINGPONG, &["--link", "nonsense"][..], "bad link"),
        (
            PINGPONG,
            &["--link", "vfio:00:99.0"][..],
            "vfio:PCI_ADDRESS",
        ),
        (
            PINGPONG,
            &["--link", "ibverbs:mlx5_0"][..],
            "unknown link type",
        ),
        (
            PERF,
            &["write-bw", "--link", "foo:1"][..],
            "unknown link type",
        ),
        (PERF, &["write-bw", "--link", "verbs:"][..], "verbs:DEVICE"),
        // perftest's `-d mlx5_0`: the message names the --link form of it.
        (
            PERF,
            &["write-bw", "-d", "mlx5_0"][..],
            "--link verbs:mlx5_0",
        ),
        (PINGPONG, &["-d", "rxe0"][..], "--link verbs:rxe0"),
        // A verbs device this host does not have (or no libibverbs, or no RDMA in the kernel):
        // one line naming it.
        (
            PINGPONG,
            &["--link", "verbs:no-such-dev9"][..],
            "device verbs:no-such-dev9: ",
        ),
    ] {
        let (out, took) = run(bin, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(took < DEADLINE);
    }
}

// ---- error exits ----

#[test]
fn unknown_device_address_is_a_clear_error() {
    let port = free_port().to_string();
    // 192.0.2.1 (TEST-NET-1) is not an address of this host.
    let (out, _) = run(
        PINGPONG,
        &[
            "--link",
            "udp:192.0.2.1",
            "-p",
            &port,
            "--timeout",
            "2",
            "127.0.0.1",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot open device udp:192.0.2.1"), "{err}");
    // rdma-perf opens its device after connecting: a listening (fake) server lets it get there.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let (out, _) = run(
        PERF,
        &[
            "write-bw",
            "--link",
            "udp:192.0.2.1",
            "-p",
            &port,
            "--timeout",
            "2",
            "127.0.0.1",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot open device udp:192.0.2.1"), "{err}");
}

/// `--link vfio:` names the PCI device and what is wrong with it, with no guest or IOMMU needed:
/// an address no device has, and (where this host has PCI devices) one bound to another driver.
#[test]
fn vfio_link_errors_name_the_pci_device() {
    let port = free_port().to_string();
    let args = ["--link", "vfio:0000:ff:1f.7", "-p", &port, "--timeout", "2"];
    let (out, took) = run(PINGPONG, &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot open device vfio:0000:ff:1f.7")
            && err.contains("PCI device 0000:ff:1f.7: not found"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(took < DEADLINE);
    // rdma-perf opens its device after connecting: a listening (fake) server lets it get there.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let perf_port = l.local_addr().unwrap().port().to_string();
    let perf_args = [
        "write-bw",
        "--link",
        "vfio:ff:1f.7",
        "-p",
        &perf_port,
        "--timeout",
        "2",
    ];
    let (out, _) = run(PERF, &[&perf_args[..], &["127.0.0.1"]].concat());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("PCI device 0000:ff:1f.7: not found"), "{err}");

    // A device of this host bound to another driver (or none), if it has one.
    let bound_elsewhere = std::fs::read_dir("/sys/bus/pci/devices")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            let driver = std::fs::read_link(e.path().join("driver")).ok();
            driver.is_none_or(|d| !d.ends_with("vfio-pci"))
        });
    let Some(dev) = bound_elsewhere else {
        eprintln!("no PCI device on this host: the not-bound case is covered by the unit tests");
        return;
    };
    let name = dev.file_name().to_string_lossy().into_owned();
    let link = format!("vfio:{name}");
    let (out, _) = run(PINGPONG, &["--link", &link, "-p", &port, "--timeout", "2"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("PCI device {name} is bound to")) && err.contains("not vfio-pci"),
        "{err}"
    );
}

#[test]
fn peer_not_there_fails_within_the_timeout() {
    let (a, b) = addresses();
    let port = free_port().to_string();
    let link = format!("udp:{a}");
    for (bin, sub) in [(PINGPONG, &[][..]), (PERF, &["send-lat"][..])] {
        let mut args = sub.to_vec();
        args.extend_from_slice(&["--link", &link, "-p", &port, "--timeout", "1", "127.0.0.1"]);
        let (out, took) = run(bin, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("127.0.0.1") && err.contains(&port), "{err}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
    // A server nobody connects to gives up too.
    let link = format!("udp:{b}");
    let (out, _) = write_bw_for_1s(&link, &port, None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no client"), "{err}");
}

#[test]
fn malformed_exchange_is_a_clear_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut msg = [0u8; 52];
        let _ = s.read_exact(&mut msg);
        let mut junk = [b'z'; 52];
        junk[51] = 0;
        let _ = s.write_all(&junk);
        std::thread::sleep(Duration::from_millis(500));
    });
    let (a, _) = addresses();
    let link = format!("udp:{a}");
    let (out, _) = run(
        PINGPONG,
        &["--link", &link, "-p", &port, "--timeout", "5", "127.0.0.1"],
    );
    fake.join().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("pingpong address"), "{err}");
}

#[test]
fn ports_in_use_are_clear_errors() {
    // The TCP port.
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let (a, b) = addresses();
    let link = format!("udp:{a}");
    let (out, _) = run(PINGPONG, &["--link", &link, "-p", &port, "--timeout", "1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("Couldn't listen to port {port}")),
        "{err}"
    );
    // The UDP port (4791 on the device's address).
    let udp = std::net::UdpSocket::bind(format!("{b}:4791")).unwrap();
    let link = format!("udp:{b}");
    let port = free_port().to_string();
    let (out, _) = run(PINGPONG, &["--link", &link, "-p", &port, "--timeout", "1"]);
    drop(udp);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot open device") && err.contains("4791"),
        "{err}"
    );
}

// ---- end to end ----

#[test]
fn pingpong_rc_uc_ud_with_data_check() {
    for t in ["--rc", "--uc", "--ud"] {
        let size = if t == "--ud" { "1024" } else { "10000" };
        let (s, c) = pair(PINGPONG, &[t], &["-n", "200", "-s", size, "-c"]);
        for out in [&s, &c] {
            let lines: Vec<&str> = out.lines().collect();
            assert!(
                lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"),
                "{out}"
            );
            assert!(lines[0].contains(", GID ::ffff:127."), "{out}");
            assert!(
                lines[1].starts_with("  remote address: LID 0x0000, QPN 0x"),
                "{out}"
            );
            let bytes: u64 = size.parse::<u64>().unwrap() * 200 * 2;
            assert!(
                lines[2].starts_with(&format!("{bytes} bytes in "))
                    && lines[2].ends_with(" Mbit/sec"),
                "{out}"
            );
            assert!(
                lines[3].starts_with("200 iters in ") && lines[3].ends_with(" usec/iter"),
                "{out}"
            );
            assert!(!out.contains("invalid data"), "{out}");
        }
        // Each side printed the other's QPN and PSN.
        let field = |out: &str, line: usize| {
            out.lines()
                .nth(line)
                .unwrap()
                .split("QPN")
                .nth(1)
                .unwrap()
                .to_string()
        };
        assert_eq!(field(&s, 0), field(&c, 1));
        assert_eq!(field(&c, 0), field(&s, 1));
    }
}

/// `rdma-pingpong -R`: the RC QPs connected by RDMA CM (REQ / REP / RTU on QP1) instead of the
/// TCP exchange, 200 checked exchanges of 10000 bytes, each side printing the other's QPN and
/// PSN as the QPs got them from the CM; `-R` with `--ud` is refused.
#[test]
fn pingpong_rdma_cm_rc_with_data_check() {
    // As `pair`, but the client names the server's device address (its CM's).
    let (a, b) = addresses();
    let port = free_port().to_string();
    let (link_a, link_b) = (format!("udp:{a}"), format!("udp:{b}"));
    let args = [
        "-R",
        "-p",
        &port,
        "--timeout",
        "20",
        "-n",
        "200",
        "-s",
        "10000",
        "-c",
    ];
    let mut sargs = vec!["--link", &link_a];
    sargs.extend_from_slice(&args);
    let server = spawn(PINGPONG, &sargs);
    let mut cargs = vec!["--link", &link_b];
    cargs.extend_from_slice(&args);
    cargs.push(&a);
    let client = spawn(PINGPONG, &cargs);
    let cl = finish(client, "client");
    let sv = finish(server, "server");
    let (s, c) = (text(&sv.stdout), text(&cl.stdout));
    assert!(
        sv.status.success() && cl.status.success(),
        "server:\n{s}\n{}\nclient:\n{c}\n{}",
        text(&sv.stderr),
        text(&cl.stderr)
    );
    for out in [&s, &c] {
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"),
            "{out}"
        );
        assert!(
            lines[1].starts_with("  remote address: LID 0x0000, QPN 0x")
                && lines[1].contains(", GID ::ffff:127."),
            "{out}"
        );
        assert!(lines[2].starts_with("4000000 bytes in "), "{out}");
        assert!(lines[3].starts_with("200 iters in "), "{out}");
        assert!(!out.contains("invalid data"), "{out}");
    }
    let field = |out: &str, line: usize| {
        let l = out.lines().nth(line).unwrap();
        l[l.find("QPN").unwrap()..l.find(", GID").unwrap()].to_string()
    };
    // The client's QPN / send PSN are the server's remote QPN / receive PSN, and back.
    assert_eq!(field(&s, 0), field(&c, 1));
    assert_eq!(field(&c, 0), field(&s, 1));
    let o = Command::new(PINGPONG)
        .args(["-R", "--ud", "--link", "udp:127.0.0.1", "--timeout", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("-R connects RC QPs only"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn pingpong_with_a_progress_thread() {
    let (_, c) = pair(
        PINGPONG,
        &["--rc"],
        &["-n", "100", "-s", "64", "--progress", "thread"],
    );
    assert!(c.contains("100 iters in"), "{c}");
}

#[test]
fn perf_write_read_atomic_bw() {
    for (test, size) in [
        ("write-bw", 4096.0),
        ("read-bw", 4096.0),
        ("atomic-bw", 8.0),
    ] {
        let (s, c) = pair(PERF, &[test], &["-n", "200", "-s", "4096"]);
        check_bw(&c, size, 200.0, "client");
        // The server prints the client's numbers (received over TCP) after waiting.
        check_bw(&s, size, 200.0, "server");
        assert!(s.contains("* Waiting for client to connect... *"), "{s}");
        let title = match test {
            "write-bw" => "RDMA_Write BW Test",
            "read-bw" => "RDMA_Read BW Test",
            _ => "Atomic FETCH_AND_ADD BW Test",
        };
        assert!(c.contains(title), "{c}");
        if test == "read-bw" {
            assert!(c.contains(" Outstand reads  : "), "{c}");
            assert!(c.contains(" OUT 0x"), "{c}");
        }
        if test == "write-bw" {
            assert!(c.contains(" RKey 0x") && c.contains(" VAddr 0x"), "{c}");
        }
    }
}

#[test]
fn perf_send_bw_multi_qp_and_gbits() {
    let (s, c) = pair(
        PERF,
        &["send-bw"],
        &["-n", "100", "-s", "8192", "-q", "4", "--report_gbits"],
    );
    for out in [&s, &c] {
        assert!(out.contains("BW average[Gb/sec]"), "{out}");
        assert!(out.contains(" Number of qps   : 4"), "{out}");
        assert_eq!(out.matches(" local address: ").count(), 4, "{out}");
        assert_eq!(out.matches(" remote address: ").count(), 4, "{out}");
    }
    let rows = result_rows(&c, " #bytes     #iterations");
    assert_eq!(
        rows[0][..2],
        [8192.0, 400.0],
        "iterations count every QP: {c}"
    );
    let rows = result_rows(&s, " #bytes     #iterations");
    assert_eq!(rows[0][..2], [8192.0, 400.0], "{s}");
}

#[test]
fn perf_all_sizes() {
    let (_, c) = pair(PERF, &["write-bw"], &["-a", "-n", "5"]);
    let rows = result_rows(&c, " #bytes     #iterations");
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    let want: Vec<f64> = (1..24).map(|i| f64::from(1u32 << i)).collect();
    assert_eq!(sizes, want, "{c}");
    let (s, c) = pair(PERF, &["send-bw"], &["-a", "-n", "5", "-q", "1"]);
    assert_eq!(result_rows(&c, " #bytes     #iterations").len(), 23, "{c}");
    assert_eq!(result_rows(&s, " #bytes     #iterations").len(), 23, "{s}");
}

#[test]
fn perf_latency_tests() {
    for test in ["write-lat", "send-lat"] {
        let (s, c) = pair(PERF, &[test], &["-n", "200", "-s", "64"]);
        check_lat(&c, 64.0, 200.0);
        check_lat(&s, 64.0, 200.0);
    }
    let (s, c) = pair(PERF, &["read-lat"], &["-n", "200", "-s", "4096"]);
    check_lat(&c, 4096.0, 200.0);
    assert!(
        !s.contains(LAT_HEADER),
        "the read-lat server prints no results: {s}"
    );
    // Latency with a progress thread, and a large (multi-packet, non-inline) message.
    let (_, c) = pair(
        PERF,
        &["send-lat"],
        &["-n", "100", "-s", "20000", "--progress", "thread"],
    );
    check_lat(&c, 20000.0, 100.0);
}

#[test]
fn perf_duration_mode() {
    let (_, c) = pair(PERF, &["write-bw"], &["-D", "1", "-s", "4096"]);
    let rows = result_rows(&c, " #bytes     #iterations");
    assert_eq!(rows.len(), 1, "{c}");
    assert!(rows[0][1] > 0.0, "{c}");
    let (_, c) = pair(PERF, &["send-lat"], &["-D", "1"]);
    assert!(
        c.contains(" #bytes        #iterations       t_avg[usec]    tps average"),
        "{c}"
    );
}

#[test]
fn wrong_gid_index_and_unreachable_server() {
    let (a, _) = addresses();
    let link = format!("udp:{a}");
    let port = free_port().to_string();
    // The device has one GID, at index 0.
    let (out, _) = run(
        PINGPONG,
        &[
            "--link",
            &link,
            "-g",
            "3",
            "-p",
            &port,
            "--timeout",
            "1",
            "127.0.0.1",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no GID at index 3"), "{err}");
    // A server given --link checks -x before it waits for a client (as perftest does): with
    // no client ever coming, it fails naming the index (a server that waited first would end
    // at its timeout with "Unable to init the socket connection" instead).
    let (out, _) = run(
        PERF,
        &[
            "write-bw",
            "--link",
            &link,
            "-x",
            "5",
            "-p",
            &port,
            "--timeout",
            "60",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no GID at index 5"), "{err}");
    // 192.0.2.1 (TEST-NET-1) answers no TCP connection: refused, unreachable or silent, the
    // client gives up within its timeout and names the server.
    let (out, took) = write_bw_for_1s(&link, &port, Some("192.0.2.1"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("192.0.2.1"), "{err}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// Numbers past what the tools can use are refused at once, in one line naming the option, and
/// never panic: a `--timeout` or `-D` that overflows a deadline (it used to panic with "overflow
/// when adding duration to instant"), an `-r` whose CQ size wraps around `u32` (it used to ask
/// for a 0-entry CQ), an `-s` above the port's max message size (it used to allocate and fill
/// 4 GiB first, then say only "Couldn't post receive (0)").
#[test]
fn out_of_range_numbers_are_clear_errors() {
    let port = free_port().to_string();
    let huge = "18446744073709551615";
    for (bin, args) in [
        (PINGPONG, &["--timeout", huge][..]),
        (PINGPONG, &["--timeout", "0"][..]),
        (PERF, &["write-bw", "--timeout", huge][..]),
        (PERF, &["send-lat", "-D", huge][..]),
    ] {
        let args = [args, &["-p", &port, "127.0.0.1"]].concat();
        let (out, _) = run(bin, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("from 1 to 86400"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (a, _) = addresses();
    let link = format!("udp:{a}");
    for (args, needle) in [
        (
            &["-r", "4294967295"][..],
            "rx-depth 4294967295 above the device's maximum",
        ),
        (&["-s", "4294967295"][..], "max message size (2147483648)"),
    ] {
        let args = [
            args,
            &["--link", &link, "-p", &port, "--timeout", "2", "127.0.0.1"],
        ]
        .concat();
        let (out, _) = run(PINGPONG, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

/// Short runs end with success on both sides: the client exits on its last receive, and its
/// device's close sends the ACK of it that ACK coalescing held (before, the server failed with
/// "transport retry counter exceeded" in about every second run of `-n 10`).
#[test]
fn short_pingpong_runs_succeed_on_both_sides() {
    for _ in 0..4 {
        pair(PINGPONG, &[], &["-n", "5"]);
    }
}

/// A UDP port other than 4791 is refused at once, in one line that says why and what to do: the
/// peer of the perftest / pingpong exchange always sends to 4791 (the exchange carries no UDP
/// port), so such a run used to end in "transport retry counter exceeded" after its timeout.
#[test]
fn udp_ports_other_than_4791_are_refused() {
    let (a, _) = addresses();
    let port = free_port().to_string();
    let odd = format!("udp:{a}:5000");
    for (bin, sub, flag) in [
        (PINGPONG, &[][..], "--link"),
        (PINGPONG, &[][..], "-d"),
        (PERF, &["write-bw"][..], "--link"),
        (PERF, &["send-lat"][..], "-d"),
    ] {
        for server in [&[][..], &["127.0.0.1"][..]] {
            let args = [sub, &[flag, &odd, "-p", &port, "--timeout", "5"], server].concat();
            let (out, _) = run(bin, &args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("port 5000 cannot work")
                    && err.contains("always send to UDP port 4791")
                    && err.contains(&format!("udp:{a} here")),
                "{args:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(text(&out.stdout).is_empty(), "{args:?}");
        }
    }
    // 4791 spelt out is the default port, accepted.
    let explicit = |ip: &str| format!("udp:{ip}:4791");
    let (c, d) = addresses();
    let (link_c, link_d) = (explicit(&c), explicit(&d));
    let server = spawn(
        PINGPONG,
        &["--link", &link_c, "-p", &port, "-n", "5", "--timeout", "20"],
    );
    let client = spawn(
        PINGPONG,
        &[
            "--link",
            &link_d,
            "-p",
            &port,
            "-n",
            "5",
            "--timeout",
            "20",
            "127.0.0.1",
        ],
    );
    let (c, s) = (finish(client, "client"), finish(server, "server"));
    assert!(
        c.status.success() && s.status.success(),
        "client: {}\nserver: {}",
        text(&c.stderr),
        text(&s.stderr)
    );
}

/// A server whose TCP port is taken fails with the error alone: it listens before it prints
/// "Waiting for client to connect...".
#[test]
fn server_on_a_busy_port_prints_no_banner() {
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let (a, _) = addresses();
    let link = format!("udp:{a}");
    let (out, _) = write_bw_for_1s(&link, &port, None);
    let (so, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Address already in use"), "{err}");
    assert!(!so.contains("Waiting for client"), "{so}");
    drop(l);
}

/// A client started before its server says once, on stderr, that nothing listens yet and that it
/// keeps trying; it then connects once the server is up, and the run succeeds.
#[test]
fn client_before_server_says_so_and_connects() {
    use std::io::BufRead;
    for (bin, sub) in [(PINGPONG, &[][..]), (PERF, &["send-lat"][..])] {
        let (a, b) = addresses();
        let port = free_port().to_string();
        let (link_a, link_b) = (format!("udp:{a}"), format!("udp:{b}"));
        let cargs = [
            sub,
            &["--link", &link_b, "-p", &port, "-n", "5", "--timeout", "30"],
            &["127.0.0.1"],
        ]
        .concat();
        let mut client = spawn(bin, &cargs);
        // The notice comes before any other line (or EOF, if the client ends first).
        let mut stderr = std::io::BufReader::new(client.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        assert!(
            first.contains(&format!(
                "nothing listens on 127.0.0.1:{port} yet; retrying for up to 30 s"
            )),
            "{bin}: {first:?}"
        );
        let sargs = [
            sub,
            &["--link", &link_a, "-p", &port, "-n", "5", "--timeout", "30"],
        ]
        .concat();
        let server = spawn(bin, &sargs);
        let reader = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            rest
        });
        let (c, s) = (finish(client, "client"), finish(server, "server"));
        let rest = reader.join().unwrap();
        assert!(
            c.status.success() && s.status.success(),
            "{bin}: client {:?}: {rest}\nserver {:?}: {}",
            c.status,
            s.status,
            text(&s.stderr)
        );
        // Said once.
        assert!(!rest.contains("nothing listens"), "{rest}");
    }
    // A client that never finds its server says so once, then fails naming it.
    let (a, _) = addresses();
    let link = format!("udp:{a}");
    let port = free_port().to_string();
    let (out, _) = write_bw_for_1s(&link, &port, Some("127.0.0.1"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains("nothing listens on 127.0.0.1:"), "{err}");
    assert!(
        lines[1].contains("Unable to init the socket connection"),
        "{err}"
    );
}

/// A `--link` of a kind the tools do not take names the forms they do take, and no UDP port
/// (they refuse any port but 4791), in one line.
#[test]
fn bad_link_names_the_forms_the_tools_take() {
    let forms =
        "(expected udp:ADDRESS without a port, vfio:PCI_ADDRESS, xdp:IFNAME or verbs:DEVICE)";
    for (bin, sub) in [(PERF, &["write-bw"][..]), (PINGPONG, &[][..])] {
        for flag in ["--link", "-d"] {
            let args = [sub, &[flag, "tcp:127.0.0.1"]].concat();
            let (out, _) = run(bin, &args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("unknown link type \"tcp\"") && err.contains(forms),
                "{args:?}: {err}"
            );
            assert!(!err.contains("PORT"), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            let args = [sub, &[flag, "udp:no-address"]].concat();
            let (out, _) = run(bin, &args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("expected udp:ADDRESS") && !err.contains("PORT"),
                "{args:?}: {err}"
            );
        }
    }
}

/// Whether this host has IPv6 (`::1`).
fn has_ipv6() -> bool {
    std::net::UdpSocket::bind("[::1]:0").is_ok()
}

/// Both tools' servers listen on IPv4 and IPv6 alike (`[::]` with `IPV6_V6ONLY` off): a client
/// reaches each over 127.0.0.1 and over ::1 (where this host has IPv6). The client here sends a
/// first message the server refuses in a log line naming the client's address (proof that it
/// was accepted); the server then goes on waiting for a valid client until `--timeout`.
#[test]
fn servers_take_clients_over_ipv4_and_ipv6() {
    use std::net::{SocketAddr, TcpStream};
    let mut hosts = vec!["127.0.0.1"];
    if has_ipv6() {
        hosts.push("::1");
    } else {
        eprintln!("no IPv6 on this host: IPv4 clients only");
    }
    let mut version = [0u8; 16];
    version[..4].copy_from_slice(b"1.00");
    let mut junk = [b'z'; 52];
    junk[51] = 0;
    for host in hosts {
        for (bin, sub, msg, needle) in [
            (
                PERF,
                &["write-bw"][..],
                &version[..],
                "perftest version \"1.00\" is below 5.70",
            ),
            (PINGPONG, &[][..], &junk[..], "malformed pingpong address: "),
        ] {
            let (a, _) = addresses();
            let port = free_port();
            let (link, port_text) = (format!("udp:{a}"), port.to_string());
            let args = [sub, &["--link", &link, "-p", &port_text, "--timeout", "3"]].concat();
            let mut server = spawn(bin, &args);
            // Connect while the server starts; bounded: it gives up after --timeout.
            let addr = SocketAddr::new(host.parse().unwrap(), port);
            let start = Instant::now();
            let stream = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(s) => break Some(s),
                    Err(_)
                        if server.try_wait().unwrap().is_none() && start.elapsed() < DEADLINE =>
                    {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(_) => break None,
                }
            };
            let Some(mut stream) = stream else {
                let out = finish(server, "server");
                panic!(
                    "{bin} {args:?}: no connection over {host}: {}",
                    text(&out.stderr)
                );
            };
            stream.write_all(msg).unwrap();
            let out = finish(server, "server");
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{bin} over {host}: {err}");
            let me = stream.local_addr().unwrap().to_string();
            let name = bin.rsplit('/').next().unwrap();
            let refused = format!("{name}: refused the connection from {me}: ");
            assert!(
                err.lines()
                    .any(|l| l.starts_with(&refused) && l.contains(needle)),
                "{bin} over {host} (from {me}): {err}"
            );
            assert!(
                err.contains("(refused 1 connection, as logged above)"),
                "{err}"
            );
        }
    }
}

/// Both tools' servers on a taken TCP port fail with the same line (after the tool's name).
#[test]
fn servers_on_a_taken_port_say_the_same() {
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let mut lines = Vec::new();
    for (bin, sub, name) in [
        (PERF, &["write-bw"][..], "rdma-perf: "),
        (PINGPONG, &[][..], "rdma-pingpong: "),
    ] {
        let (a, _) = addresses();
        let link = format!("udp:{a}");
        let args = [sub, &["--link", &link, "-p", &port, "--timeout", "1"]].concat();
        let (out, _) = run(bin, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        let line = err
            .trim_end()
            .strip_prefix(name)
            .unwrap_or_else(|| panic!("{err}"));
        lines.push(line.to_owned());
    }
    assert_eq!(lines[0], lines[1]);
    let any = if has_ipv6() { "[::]" } else { "0.0.0.0" };
    assert!(
        lines[0].starts_with(&format!(
            "Couldn't listen to port {port}: cannot listen on TCP {any}:{port}: "
        )) && lines[0].contains("Address already in use"),
        "{}",
        lines[0]
    );
    drop(l);
}

/// `rdma-perf`'s server waits for its client without limit, as perftest's does, unless
/// `--timeout` is given (its help says so); with `--timeout 1` it gives up, saying so in one
/// line. (The unlimited wait itself is checked where the option is resolved, in the binary's
/// unit tests: a test cannot wait for "never".)
#[test]
fn perf_server_waits_for_a_client_as_long_as_timeout_says() {
    let (out, _) = run(PERF, &["write-bw", "--help"]);
    let help = text(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("A server waits for its client without limit")
            && help.contains("unless --timeout is given"),
        "{help}"
    );
    let (a, _) = addresses();
    let port = free_port().to_string();
    let (out, _) = write_bw_for_1s(&format!("udp:{a}"), &port, None);
    let (so, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(so.contains("Waiting for client to connect..."), "{so}");
    let any = if has_ipv6() { "[::]" } else { "0.0.0.0" };
    let want = format!(
        "rdma-perf: Unable to init the socket connection: no client connected to TCP \
         {any}:{port} within "
    );
    assert!(err.starts_with(&want) && err.ends_with(" s\n"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// Issue 17: a client's perftest preamble with a huge `cycle_buffer` (the larger of both sides'
/// sizes `rdma-perf`'s buffers: 2^31 - 1 once made a server lock 4 GiB) is refused before
/// anything is allocated, in one line naming the field, the value and the bound; so is a huge
/// `cache_line_size`. The server ends at once (bounded by the test's deadline, and by its own
/// `--timeout` were it to wait).
#[test]
fn perf_server_refuses_a_forged_preamble() {
    use std::net::TcpStream;
    for (cycle, line, needle) in [
        (
            i32::MAX,
            64,
            "cycle_buffer 2147483647 is above the bound of 2097152",
        ),
        (
            4096,
            i32::MAX,
            "cache_line_size 2147483647 is above the bound of 4096",
        ),
    ] {
        let (a, _) = addresses();
        let port = free_port();
        let (link, port_text) = (format!("udp:{a}"), port.to_string());
        let args = [
            "write-bw",
            "--link",
            &link,
            "-p",
            &port_text,
            "--timeout",
            "10",
        ];
        let mut server = spawn(PERF, &args);
        let start = Instant::now();
        let mut s = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(
                        server.try_wait().unwrap().is_none() && start.elapsed() < DEADLINE,
                        "no server: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        // The preamble in perftest's order, each message answered before the next.
        let mut version = [0u8; 16];
        version[..4].copy_from_slice(b"6.06");
        let mut answer = [0u8; 16];
        for msg in [
            &version[..],
            &cycle.to_be_bytes(),
            &line.to_be_bytes(),
            b"5\0",
        ] {
            if s.write_all(msg).is_err() || s.read_exact(&mut answer[..msg.len()]).is_err() {
                break;
            }
        }
        let out = finish(server, "server");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("refusing the perftest ")
                && err.contains(needle)
                && !err.contains("allocate"),
            "{err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

// ---- perftest's -R (RDMA CM instead of TCP) ----

/// A server and a client of `rdma-perf SUB -R` on two loopback addresses, the client given the
/// server's device address; both must succeed. Returns (server stdout, client stdout).
fn pair_rdma_cm(sub: &str, args: &[&str]) -> (String, String) {
    let (a, b) = addresses();
    let port = free_port().to_string();
    let (link_a, link_b) = (format!("udp:{a}"), format!("udp:{b}"));
    let common = ["-R", "-p", &port, "--timeout", "20"];
    let mut sargs = vec![sub, "--link", &link_a];
    sargs.extend_from_slice(&common);
    sargs.extend_from_slice(args);
    let server = spawn(PERF, &sargs);
    let mut cargs = vec![sub, "--link", &link_b];
    cargs.extend_from_slice(&common);
    cargs.extend_from_slice(args);
    cargs.push(&a);
    // Until the server listens its CM rejects the client, which retries.
    let client = spawn(PERF, &cargs);
    let c = finish(client, "client");
    let s = finish(server, "server");
    let (so, co) = (text(&s.stdout), text(&c.stdout));
    assert!(
        s.status.success() && c.status.success(),
        "server {:?}:\n{so}\n{}\nclient {:?}:\n{co}\n{}",
        s.status,
        text(&s.stderr),
        c.status,
        text(&c.stderr)
    );
    (so, co)
}

#[test]
fn perf_rdma_cm_write_and_read_bw() {
    // WRITE: the server prints the client's numbers, which came over the RDMA CM connection.
    let (s, c) = pair_rdma_cm("write-bw", &["-n", "200", "-s", "4096"]);
    check_bw(&c, 4096.0, 200.0, "client");
    check_bw(&s, 4096.0, 200.0, "server");
    for out in [&s, &c] {
        assert!(out.contains(" rdma_cm QPs\t : ON"), "{out}");
        assert!(out.contains(" Data ex. method : rdma_cm"), "{out}");
    }
    assert!(
        s.contains(" Waiting for client rdma_cm QP to connect"),
        "{s}"
    );
    // READ on two QPs connected by RDMA CM: each READ needs the rkey and address the binary
    // pingpong_dest carried, and completes only if they are right.
    // (perftest reports the iterations of all QPs: 2 x 100.)
    let (s, c) = pair_rdma_cm("read-bw", &["-n", "100", "-s", "4096", "-q", "2"]);
    check_bw(&c, 4096.0, 200.0, "client");
    check_bw(&s, 4096.0, 200.0, "server");
}

#[test]
fn perf_rdma_cm_client_without_server_fails_within_the_timeout() {
    let (a, b) = addresses();
    let port = free_port().to_string();
    let link = format!("udp:{b}");
    let (out, _) = run(
        PERF,
        &[
            "write-bw",
            "-R",
            "--link",
            &link,
            "-p",
            &port,
            "--timeout",
            "1",
            &a,
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("rdma_client"), "{err}");
}

#[test]
fn perf_rdma_cm_refuses_uc_and_a_missing_link() {
    let (out, _) = run(
        PERF,
        &["write-bw", "-R", "-c", "UC", "--link", "udp:127.0.0.1"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("UC is not supported"),
        "{}",
        text(&out.stderr)
    );
    let (out, _) = run(PERF, &["write-bw", "-R", "127.0.0.1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--link"),
        "{}",
        text(&out.stderr)
    );
}
