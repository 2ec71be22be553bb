//! Many processes, one device ([`hca::link::udp::share`]): the tools on one address and UDP port
//! 4791 at once, each process with its own slot of the QPN space, steered by the kernel.
//!
//! Every test uses its own loopback address (127.x.y.z from the test's pid), so that other
//! tests of the host holding 127.0.0.1:4791 do not interfere; every wait is bounded.
#![cfg(feature = "tools")]

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");
const PINGPONG: &str = env!("CARGO_BIN_EXE_rdma-pingpong");
const DEADLINE: Duration = Duration::from_secs(300);

/// A loopback address of this test: 127.(pid>>8).(pid).`d`.
fn address(d: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(127, (pid >> 8) as u8, pid as u8, d)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child whose stdout and stderr are collected by threads as they come.
struct Proc {
    name: String,
    child: Child,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(name: &str, bin: &str, args: &[String]) -> Proc {
        let mut child = Command::new(bin)
            .args(args)
            .env("SOFT_HCA_SHARE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for r in [stdout, stderr] {
            let out = out.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    let mut o = out.lock().unwrap();
                    o.push_str(&line);
                    o.push('\n');
                }
            }));
        }
        Proc {
            name: name.to_string(),
            child,
            out,
            readers,
        }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits (bounded by [`DEADLINE`]) until the output holds `text`.
    fn wait_for(&mut self, text: &str) {
        let start = Instant::now();
        while !self.output().contains(text) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before {text:?}:\n{}",
                    self.name,
                    self.output()
                );
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: no {text:?}:\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (bounded) for the exit; the status and the whole output.
    fn finish(mut self) -> (ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > DEADLINE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} did not finish:\n{}", self.name, self.output());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        (status, self.output())
    }

    fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// A server and a client of `bin sub` on the device `udp:addr` (both ends).
fn pair(bin: &str, sub: &[&str], addr: Ipv4Addr, args: &[&str], n: usize) -> (Proc, Proc) {
    let port = free_port().to_string();
    let link = format!("udp:{addr}");
    let mut a: Vec<String> = sub.iter().map(|s| s.to_string()).collect();
    a.extend(["--link", &link, "-p", &port, "--timeout", "60"].map(String::from));
    a.extend(args.iter().map(|s| s.to_string()));
    let server = Proc::spawn(&format!("server {n}"), bin, &a);
    a.push("127.0.0.1".into());
    let client = Proc::spawn(&format!("client {n}"), bin, &a);
    (server, client)
}

/// What of `addr` is left on the host: sockets bound to `addr:4791` (/proc/net/udp) and slot
/// names `@soft-hca/addr:4791/...` (/proc/net/unix).
fn leftovers(addr: Ipv4Addr) -> Vec<String> {
    let mut left = Vec::new();
    let hex = format!("{:08X}:12B7", u32::from_le_bytes(addr.octets()));
    let udp = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    left.extend(udp.lines().filter(|l| l.contains(&hex)).map(String::from));
    let name = format!("@soft-hca/{addr}:4791/");
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    left.extend(unix.lines().filter(|l| l.contains(&name)).map(String::from));
    left
}

/// 8 RC ping-pong pairs (16 processes) on one address and port, every byte checked (`--chk`).
#[test]
fn eight_pairs_on_one_address_with_checked_data() {
    let addr = address(1);
    let pairs: Vec<_> = (0..8)
        .map(|i| {
            pair(
                PINGPONG,
                &[],
                addr,
                &["-s", "16384", "-n", "200", "--chk"],
                i,
            )
        })
        .collect();
    for (server, client) in pairs {
        let (cs, co) = client.finish();
        let (ss, so) = server.finish();
        assert!(
            cs.success() && ss.success(),
            "client {cs}:\n{co}\nserver {ss}:\n{so}"
        );
        assert!(co.contains("200 iters"), "{co}");
    }
    assert_eq!(leftovers(addr), Vec::<String>::new());
}

/// A `write-bw` pair opens first (the lowest slots), 3 more pairs follow; the first pair is
/// killed with SIGKILL mid-transfer. The kernel then moves the last members of the reuseport
/// group into the holes, so the others' datagrams reach the wrong processes and must be
/// forwarded: the 3 pairs complete all the same, and nothing of the killed processes is left.
#[test]
fn sigkill_leaves_the_others_running_and_frees_its_slot() {
    let addr = address(2);
    let (mut vs, mut vc) = pair(PERF, &["write-bw"], addr, &["-s", "65536", "-D", "60"], 9);
    vs.wait_for("remote address");
    vc.wait_for("remote address");
    // `--stats`: on failure the output tells where packets went (strays, drops, retries).
    let args = ["-s", "65536", "-D", "4", "--stats"];
    let mut pairs: Vec<_> = (0..3)
        .map(|i| pair(PERF, &["write-bw"], addr, &args, i))
        .collect();
    for (s, c) in &mut pairs {
        s.wait_for("remote address");
        c.wait_for("remote address");
    }
    vc.sigkill();
    vs.sigkill();
    // What the kill cost the others (issue 18), from each process's `--stats`: strays after the
    // reuseport group was reordered, and RC retransmissions. All are of this user: none may be
    // refused as a stranger, in either direction.
    let names = [
        "rx_strays",
        "rx_forwarded",
        "rx_strays_held",
        "rx_strays_untrusted",
        "rx_forward_refused",
        "sent_pkts",
        "completer_retry_err",
    ];
    let counter = |out: &str, name: &str| -> u64 {
        let key = format!(" {name}: ");
        out.find(&key)
            .and_then(|at| {
                out[at + key.len()..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    let mut sums = [0u64; 7];
    for (server, client) in pairs {
        let (cs, co) = client.finish();
        let (ss, so) = server.finish();
        for out in [&co, &so] {
            let mine: Vec<String> = names
                .iter()
                .map(|n| format!("{n} {}", counter(out, n)))
                .collect();
            eprintln!("{}", mine.join(", "));
            for (sum, n) in sums.iter_mut().zip(names) {
                *sum += counter(out, n);
            }
        }
        assert!(
            cs.success() && ss.success(),
            "client {cs}:\n{co}\nserver {ss}:\n{so}"
        );
        assert!(co.contains("65536"), "{co}");
    }
    let _ = (vs.finish(), vc.finish());
    let all: Vec<String> = names
        .iter()
        .zip(sums)
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    eprintln!("the 3 pairs together: {}", all.join(", "));
    assert_eq!((sums[3], sums[4]), (0, 0), "{all:?}");
    assert_eq!(leftovers(addr), Vec::<String>::new());
}
