//! The tools' out-of-band ports against strangers (issue 17): while a real `rdma-perf write-bw`
//! pair and a real `rdma-pingpong --rc -c` pair run on loopback, fuzz connections send the
//! server's TCP port random, truncated, oversized, malformed, trickled and no input at all.
//! A first wave connects (and sends) *before* the real client starts, so a stranger is always
//! the server's first connection; a second wave keeps connecting while the pair runs.
//!
//! Checks, per tool:
//! * the job completes: both processes exit 0; `rdma-pingpong -c` checked every byte of its
//!   data on both sides; `rdma-perf`'s server printed the client's result row (its report
//!   exchange) and each side's "remote address" line is the other's "local address" line (the
//!   exchange carried the right QPN, PSN, rkey and address);
//! * every first-wave connection got exactly one log line on the server's stderr,
//!   `TOOL: refused the connection from ADDRESS: REASON`, with the reason its kind implies; a
//!   second-wave connection at most one (once its client is there the server stops accepting:
//!   `rdma-perf` closes its listening socket, so later connections are refused by the kernel,
//!   and connections still queued then are never accepted, so never logged); no other line
//!   names a refusal;
//! * the server's peak resident memory (`VmHWM`, proc(5), sampled every 10 ms while it runs)
//!   stays under [`HWM_BOUND`] and its peak virtual memory (`VmPeak`) under [`PEAK_BOUND`]:
//!   nothing a stranger sends sizes anything on the server (a server that took a peer's size
//!   once locked 4 GiB).
//!
//! Loopback only (distinct 127.x.y.z device addresses per run, ports picked free); every child
//! runs under a deadline and is killed past it; every loop is bounded in count and time; no
//! assertion is about speed.
#![cfg(feature = "tools")]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");
const PINGPONG: &str = env!("CARGO_BIN_EXE_rdma-pingpong");

/// Longest any run may take here (debug builds on a loaded machine are slow); not a measure.
const DEADLINE: Duration = Duration::from_secs(120);

/// The bound on a server's peak resident memory (`VmHWM`) under fuzzing: 64 MiB. Measured
/// without strangers, the debug builds peak at about 7 MiB (`rdma-perf write-bw`, 64 KiB
/// messages) and 5 MiB (`rdma-pingpong`); the accept loop's own state is at most 64 sockets
/// and 64 x 65 bytes (hca::tools::oob::MAX_PENDING, MAX_FIRST_LEN), so 64 MiB leaves room for
/// allocator and build differences while any peer-sized allocation (perftest's `cycle_buffer`
/// reaches 2^31) would pass it.
const HWM_BOUND: u64 = 64 << 20;

/// The bound on a server's peak virtual memory (`VmPeak`): 1 GiB. Resident memory misses an
/// allocation nobody writes to (a zeroed `Vec` of a peer-announced size is mapped, not touched,
/// until data arrives); the peak of the address space does not. Measured without strangers
/// about 142 MiB (mostly glibc's per-thread malloc arenas, 64 MiB reserved each), so 1 GiB
/// leaves room for more threads' arenas while an allocation of perftest's largest
/// `cycle_buffer` (2^31 bytes) would pass it.
const PEAK_BOUND: u64 = 1 << 30;

/// xorshift64*: reproducible junk.
struct Junk(u64);

impl Junk {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| (self.next() >> 56) as u8).collect()
    }
}

/// What one fuzz connection does, and the reason its log line must give (any of them).
#[derive(Clone, Debug)]
enum Kind {
    /// Connects and sends nothing.
    Silent,
    /// Sends these bytes at once (then keeps the connection open).
    Send(Vec<u8>),
    /// Sends these bytes, then half-closes.
    SendClose(Vec<u8>),
    /// Sends these bytes one at a time, 50 ms apart, for at most 3 s.
    Trickle(Vec<u8>),
}

/// A tool under test: its binary, subcommand, first message length and a valid first message.
struct Tool {
    bin: &'static str,
    name: &'static str,
    sub: &'static [&'static str],
    args: &'static [&'static str],
    /// A well-formed first message (the server would take its sender as the client).
    valid: Vec<u8>,
}

fn perf_tool() -> Tool {
    let mut version = vec![0u8; 16];
    version[..4].copy_from_slice(b"6.06");
    Tool {
        bin: PERF,
        name: "rdma-perf",
        sub: &["write-bw"],
        args: &["-n", "500", "-s", "16384"],
        valid: version,
    }
}

fn pingpong_tool() -> Tool {
    let mut addr = b"0000:000011:3c2d1e:00000000000000000000ffff7f000001".to_vec();
    addr.push(0);
    Tool {
        bin: PINGPONG,
        name: "rdma-pingpong",
        sub: &["--rc"],
        args: &["-n", "200", "-s", "8192", "-c"],
        valid: addr,
    }
}

/// The first wave: one connection of each kind, with the reasons its log line may give. The
/// silent and trickling ones are still waiting when the client comes (or past their deadline
/// under heavy load), the others are judged as soon as their bytes are in.
fn first_wave(tool: &Tool, junk: &mut Junk) -> Vec<(Kind, &'static [&'static str])> {
    let len = tool.valid.len();
    let mut truncated = tool.valid.clone();
    truncated.truncate(len / 2);
    let mut oversized = tool.valid.clone();
    oversized.extend_from_slice(&junk.bytes(64 << 10));
    // Well-formed up to one byte (a version that is not printable text; a GID digit that is
    // not hex), sent slowly.
    let mut malformed_tail = tool.valid.clone();
    if tool.bin == PERF {
        malformed_tail[2] = 1;
    } else {
        malformed_tail[len - 2] = b'!';
    }
    let mut wrong = tool.valid.clone();
    if tool.bin == PERF {
        wrong[..4].copy_from_slice(b"5.00"); // perftest refuses below 5.70
    } else {
        wrong[5] = b'x'; // a QPN that is not hex
    }
    let waiting: &[&str] = &["closed: the client from", "sent "];
    vec![
        (Kind::Silent, waiting),
        (Kind::Send(junk.bytes(len)), &["malformed", "below 5.70"]),
        (Kind::SendClose(truncated), &["closed after "]),
        (Kind::Send(oversized), &["sent more than the "]),
        (Kind::Send(junk.bytes(3 * len)), &["sent more than the "]),
        (Kind::SendClose(Vec::new()), &["closed after 0 of the "]),
        (Kind::Send(wrong), &["malformed", "below 5.70"]),
        (
            Kind::Trickle(malformed_tail),
            &["malformed", "closed: the client from", "sent "],
        ),
        (Kind::Trickle(tool.valid[..len - 1].to_vec()), waiting),
    ]
}

/// Opens a fuzz connection and plays `kind` on it in a thread of its own; the connection stays
/// open until `stop` (at most [`DEADLINE`]). Returns the connection's address, or `None` if it
/// could not connect.
fn fuzz(
    port: u16,
    kind: Kind,
    stop: &Arc<AtomicBool>,
) -> Option<(SocketAddr, std::thread::JoinHandle<()>)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    let me = s.local_addr().ok()?;
    let stop = stop.clone();
    // The bytes of a Send are in before this returns, so that the order of arrival is known.
    if let Kind::Send(b) | Kind::SendClose(b) = &kind {
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        // A 64 KiB blob may not fit the socket buffers before the server closes: errors are
        // expected.
        let first = b.len().min(4096);
        let _ = s.write_all(&b[..first]);
        if first < b.len() {
            let rest = b[first..].to_vec();
            let mut w = s.try_clone().ok()?;
            std::thread::spawn(move || {
                let _ = w.write_all(&rest);
            });
        }
        if matches!(kind, Kind::SendClose(_)) {
            let _ = s.shutdown(Shutdown::Write);
        }
    }
    let h = std::thread::spawn(move || {
        let start = Instant::now();
        if let Kind::Trickle(b) = &kind {
            for &byte in b {
                if stop.load(Ordering::Relaxed) || start.elapsed() > Duration::from_secs(3) {
                    break;
                }
                if s.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Hold the connection until the run ends (or the server closes it).
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let mut sink = [0u8; 256];
        while !stop.load(Ordering::Relaxed) && start.elapsed() < DEADLINE {
            match s.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    });
    Some((me, h))
}

/// A pair of loopback addresses no other run uses.
fn addresses(n: u8) -> (String, String) {
    let pid = std::process::id();
    let (b, c) = ((pid >> 8) as u8, pid as u8);
    (
        format!("127.{b}.{c}.{}", 2 * n + 101),
        format!("127.{b}.{c}.{}", 2 * n + 102),
    )
}

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

/// `VmHWM` (peak resident) and `VmPeak` (peak virtual) of a live process, bytes (proc(5));
/// `None` once it has exited.
fn vm_peaks(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib << 10)
    };
    Some((field("VmHWM:")?, field("VmPeak:")?))
}

/// Samples the `VmHWM` and `VmPeak` of process `pid` every 10 ms in a thread of its own until
/// the process has exited (its status no longer has the lines) or [`DEADLINE`] passes; the
/// thread returns the largest samples (the last: neither ever decreases).
fn sample_peaks(pid: u32) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let (mut hwm, mut peak) = (0, 0);
        while let Some((h, p)) = vm_peaks(pid) {
            (hwm, peak) = (hwm.max(h), peak.max(p));
            if start.elapsed() > DEADLINE {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        (hwm, peak)
    })
}

/// Waits for `child` up to [`DEADLINE`] (killing it past that) and collects its output; the
/// pipes are drained by threads meanwhile, so that a chatty child cannot block.
fn finish(mut child: Child, what: &str) -> Output {
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let st = child.wait().unwrap();
            let err = String::from_utf8_lossy(&err_t.join().unwrap()).into_owned();
            panic!("{what} did not finish within {DEADLINE:?} ({st:?}); stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits (bounded) until something listens on `port` of 127.0.0.1, probing with a connection
/// that sends nothing (it is itself a silent stranger, and is returned to be judged as one).
fn wait_listening(port: u16, server: &mut Child) -> TcpStream {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            return s;
        }
        assert!(
            server.try_wait().unwrap().is_none() && start.elapsed() < DEADLINE,
            "the server never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One fuzzed run of `tool`; returns (server stdout, client stdout, server VmHWM).
fn fuzzed_run(tool: &Tool, n: u8, seed: u64) -> (String, String, u64) {
    let (a, b) = addresses(n);
    let port = free_port();
    let port_s = port.to_string();
    let (link_a, link_b) = (format!("udp:{a}"), format!("udp:{b}"));
    let common = |link: &str| -> Vec<String> {
        let mut v: Vec<String> = tool.sub.iter().map(|s| s.to_string()).collect();
        v.extend(["--link", link, "-p", &port_s, "--timeout", "30"].map(String::from));
        v.extend(tool.args.iter().map(|s| s.to_string()));
        v
    };
    let sargs = common(&link_a);
    let mut server = spawn(
        tool.bin,
        &sargs.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let sampler = sample_peaks(server.id());
    let probe = wait_listening(port, &mut server);
    let probe_addr = probe.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut junk = Junk(seed);

    // The first wave, before the client exists.
    let mut expected: HashMap<SocketAddr, &'static [&'static str]> = HashMap::new();
    expected.insert(probe_addr, &["closed: the client from", "sent "]);
    let mut threads = Vec::new();
    for (kind, reasons) in first_wave(tool, &mut junk) {
        let (me, h) = fuzz(port, kind.clone(), &stop)
            .unwrap_or_else(|| panic!("{}: fuzz connection {kind:?} failed", tool.name));
        expected.insert(me, reasons);
        threads.push(h);
    }

    // The real client, while a second wave keeps coming (at most 8 connections, 10 ms apart).
    let mut cargs = common(&link_b);
    cargs.push("127.0.0.1".into());
    let client = spawn(
        tool.bin,
        &cargs.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let second = {
        let stop = stop.clone();
        let valid_len = tool.valid.len();
        std::thread::spawn(move || {
            let mut junk = Junk(seed ^ 0x5eed);
            let mut addrs = Vec::new();
            let mut hs = Vec::new();
            for i in 0..8 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let kind = match i % 4 {
                    0 => Kind::Send(junk.bytes(valid_len)),
                    1 => Kind::SendClose({
                        let l = (junk.next() % 200) as usize;
                        junk.bytes(l)
                    }),
                    2 => Kind::Silent,
                    _ => Kind::Trickle(junk.bytes(valid_len)),
                };
                if let Some((me, h)) = fuzz(port, kind, &stop) {
                    addrs.push(me);
                    hs.push(h);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (addrs, hs)
        })
    };
    let c = finish(client, "client");
    let s = finish(server, "server");
    let (hwm, peak) = sampler.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    drop(probe);
    let (second_addrs, second_threads) = second.join().unwrap();
    for h in threads.into_iter().chain(second_threads) {
        h.join().unwrap();
    }
    let (so, se, co, ce) = (
        text(&s.stdout),
        text(&s.stderr),
        text(&c.stdout),
        text(&c.stderr),
    );
    assert!(
        s.status.success() && c.status.success(),
        "{}: server {:?}:\n{so}\n{se}\nclient {:?}:\n{co}\n{ce}",
        tool.name,
        s.status,
        c.status
    );

    // One line per first-wave connection, with a reason its kind allows; at most one per
    // second-wave connection; no other refusal line.
    let prefix = format!("{}: refused the connection from ", tool.name);
    let mut lines_for: HashMap<SocketAddr, Vec<&str>> = HashMap::new();
    for line in se.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let (who, why) = rest.split_once(": ").unwrap_or_else(|| panic!("{line}"));
        let who: SocketAddr = who.parse().unwrap_or_else(|_| panic!("{line}"));
        lines_for.entry(who).or_default().push(why);
    }
    for (who, reasons) in &expected {
        let got = lines_for.get(who).cloned().unwrap_or_default();
        assert_eq!(got.len(), 1, "{}: {who}: {got:?}\n{se}", tool.name);
        assert!(
            reasons.iter().any(|r| got[0].contains(r)),
            "{}: {who}: \"{}\", wanted one of {reasons:?}\n{se}",
            tool.name,
            got[0]
        );
    }
    for who in &second_addrs {
        let got = lines_for.get(who).map_or(0, Vec::len);
        assert!(got <= 1, "{}: {who}: {got} lines\n{se}", tool.name);
    }
    for who in lines_for.keys() {
        assert!(
            expected.contains_key(who) || second_addrs.contains(who),
            "{}: a refusal names {who}, which is no fuzz connection\n{se}",
            tool.name
        );
    }
    assert!(
        hwm > 0 && hwm < HWM_BOUND,
        "{}: server VmHWM {hwm} bytes (bound {HWM_BOUND})",
        tool.name
    );
    assert!(
        peak > 0 && peak < PEAK_BOUND,
        "{}: server VmPeak {peak} bytes (bound {PEAK_BOUND})",
        tool.name
    );
    eprintln!(
        "{}: {} first-wave and {} second-wave fuzz connections, {} refusal lines, server VmHWM \
         {:.1} MiB, VmPeak {:.1} MiB",
        tool.name,
        expected.len(),
        second_addrs.len(),
        lines_for.values().map(Vec::len).sum::<usize>(),
        hwm as f64 / f64::from(1 << 20),
        peak as f64 / f64::from(1 << 20)
    );
    (so, co, hwm)
}

/// The `local address` / `remote address` lines of a perftest-style output.
fn addresses_printed(out: &str) -> (String, String) {
    let find = |tag: &str| {
        out.lines()
            .find_map(|l| l.trim_start().strip_prefix(tag).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {tag} line:\n{out}"))
    };
    (find("local address:"), find("remote address:"))
}

#[test]
fn perf_pair_completes_under_fuzz() {
    let (so, co, _) = fuzzed_run(&perf_tool(), 0, 0x0123_4567_89ab_cdef);
    // The exchange carried the right values both ways.
    let (s_local, s_remote) = addresses_printed(&so);
    let (c_local, c_remote) = addresses_printed(&co);
    assert_eq!(s_remote, c_local, "server:\n{so}\nclient:\n{co}");
    assert_eq!(c_remote, s_local, "server:\n{so}\nclient:\n{co}");
    // The server printed the client's report (the report exchange at the end of the run).
    let row = |out: &str| {
        out.lines()
            .skip_while(|l| !l.contains("#bytes"))
            .nth(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no result row:\n{out}"))
    };
    assert_eq!(row(&so), row(&co));
    assert!(row(&co).starts_with("16384 500 "), "{co}");
}

#[test]
fn pingpong_pair_completes_under_fuzz() {
    let (so, co, _) = fuzzed_run(&pingpong_tool(), 1, 0xfeed_f00d_dead_beef);
    // -c checked every byte on both sides (a failed check exits 1, caught above); both ran
    // every iteration.
    for out in [&so, &co] {
        assert!(out.lines().any(|l| l.starts_with("200 iters in ")), "{out}");
    }
}
