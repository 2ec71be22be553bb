//! The kernel's share of `rdma-perf send-lat -s 8` on a UDP socket, with no transport engine:
//! two processes exchange, per message, the datagrams that send-lat exchanges (an 8-byte RC
//! SEND and the ACK of the peer's previous one: 24 + 20 bytes of UDP payload in one GSO train,
//! IP_TOS / IP_TTL control messages, a one-slot receive batch (recvmsg(2) with UDP_GRO,
//! IP_RECVTOS and IP_RECVTTL), as an idle device polls) through [`RoceSocket`] configured as
//! [`hca::soft::UdpDevice`] configures it, and, for comparison, one 24-byte datagram per
//! message through a plain nonblocking [`UdpSocket`] (sendto(2) / recvfrom(2), no control
//! messages: the shape of `sockperf ping-pong --nonblocked`). Both ends poll with
//! sched_yield(2) between empty polls, as rdma-perf does. Prints the half round trip of each,
//! unpinned, with both ends on one CPU and on two (`taskset`, when there are two CPUs).
//!
//! The difference between the two shapes is what the link's system calls cost beyond a plain
//! socket's before any transport code runs: the ACK datagram, the control messages and
//! sendmmsg(2) / recvmsg(2), not told apart here (`ONE=1` in the environment sends the SEND
//! alone, without the ACK, to show the ACK's share). rdma-perf's send-lat less the `link` figure
//! is what the engine and the device layer add.
//!
//! Run by hand: `cargo bench -p hca --bench udp_floor [-- ITERATIONS [ROUNDS]]` (default 50000
//! messages, 1 round). With several rounds the plain and link runs alternate and each figure is
//! the median of the rounds' means (other load on the machine moves single runs a lot).

use std::io::{BufRead, BufReader, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hca::link::udp::{RoceSocket, RoceSocketConfig, SendDatagram};
use roce::ipv4::Ecn;

/// Bytes of UDP payload of an 8-byte RC SEND ONLY: BTH 12, payload 8, ICRC 4.
const SEND_LEN: usize = 24;
/// Bytes of UDP payload of an RC ACKNOWLEDGE: BTH 12, AETH 4, ICRC 4.
const ACK_LEN: usize = 20;
/// No exchange waits longer than this for a message (the peer died).
const STALL: Duration = Duration::from_secs(10);
/// Messages exchanged before the clock starts.
const WARMUP: u64 = 1000;

/// One end of a ping-pong.
trait End {
    fn send(&mut self, to: SocketAddr);
    /// Whether a message arrived (one poll, no waiting).
    fn poll(&mut self) -> bool;
}

/// The RoCE shape through the link the device uses.
struct LinkEnd {
    link: RoceSocket,
    batch: hca::link::udp::RecvBatch,
    src_port: Option<u16>,
    bytes: [u8; SEND_LEN + ACK_LEN],
    /// Datagrams per message: 2 (SEND + ACK), or 1 with `ONE=1` (the SEND alone, to show what
    /// the ACK datagram costs). Read once here, not on the measured path.
    datagrams: usize,
}

impl LinkEnd {
    fn bind(local: SocketAddr) -> LinkEnd {
        // As UdpDevice::open sets the link up (soft::open_udp_link) by default.
        let mut c = RoceSocketConfig::new(local);
        c.gso_ipv4 = true;
        c.recv_buffer_bytes = Some(4 << 20);
        c.send_buffer_bytes = Some(4 << 20);
        c.src_ports = 4;
        let link = RoceSocket::bind(c).expect("bind the UDP link");
        // One slot, as a caller-driven device polls when idle (udp_io::IDLE_BATCH).
        let batch = link.new_recv_batch_of(1);
        let src_port = link.src_ports().first().copied();
        LinkEnd {
            link,
            batch,
            src_port,
            bytes: [0xa5; SEND_LEN + ACK_LEN],
            datagrams: if std::env::var_os("ONE").is_some() {
                1
            } else {
                2
            },
        }
    }
}

impl End for LinkEnd {
    fn send(&mut self, to: SocketAddr) {
        let send = [IoSlice::new(&self.bytes[..SEND_LEN])];
        let ack = [IoSlice::new(&self.bytes[SEND_LEN..])];
        let d = |parts| SendDatagram {
            src_port: self.src_port,
            hop_limit: Some(64),
            ecn: Ecn::NotEct,
            ..SendDatagram::new(to, parts)
        };
        let train = [d(&send[..]), d(&ack[..])];
        let k = self.datagrams;
        let sent = self.link.send(&train[..k]).expect("send");
        assert_eq!(sent, k, "the socket buffer cannot be full in a ping-pong");
    }

    fn poll(&mut self) -> bool {
        self.link.recv(&mut self.batch).expect("recv") > 0
    }
}

/// One datagram per message on a plain socket.
struct PlainEnd {
    socket: UdpSocket,
    buf: [u8; 2048],
}

impl PlainEnd {
    fn bind(local: SocketAddr) -> PlainEnd {
        let socket = UdpSocket::bind(local).expect("bind the UDP socket");
        socket.set_nonblocking(true).expect("nonblocking");
        PlainEnd {
            socket,
            buf: [0; 2048],
        }
    }
}

impl End for PlainEnd {
    fn send(&mut self, to: SocketAddr) {
        self.socket
            .send_to(&self.buf[..SEND_LEN], to)
            .expect("send_to");
    }

    fn poll(&mut self) -> bool {
        self.socket.recv_from(&mut self.buf).is_ok()
    }
}

/// Waits (polling, yielding between polls) for one message; `false` after [`STALL`].
fn wait(end: &mut dyn End) -> bool {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if end.poll() {
            return true;
        }
        polls += 1;
        if polls % 1024 == 0 && start.elapsed() > STALL {
            return false;
        }
        std::thread::yield_now();
    }
}

/// A child process: `serve SHAPE ADDR` echoes until a stall; `ping SHAPE ADDR PEER N` prints
/// the half round trip in microseconds.
fn child(args: &[String]) {
    let addr: SocketAddr = args[2].parse().expect("address");
    let mut end: Box<dyn End> = match args[1].as_str() {
        "link" => Box::new(LinkEnd::bind(addr)),
        _ => Box::new(PlainEnd::bind(addr)),
    };
    if args[0] == "serve" {
        let peer: SocketAddr = args[3].parse().expect("peer");
        println!("ready");
        while wait(end.as_mut()) {
            end.send(peer);
        }
        return;
    }
    let peer: SocketAddr = args[3].parse().expect("peer");
    let n: u64 = args[4].parse().expect("iterations");
    let mut start = Instant::now();
    for i in 0..WARMUP + n {
        if i == WARMUP {
            start = Instant::now();
        }
        end.send(peer);
        if !wait(end.as_mut()) {
            eprintln!("udp_floor: no answer from {peer} for {} s", STALL.as_secs());
            std::process::exit(1);
        }
    }
    println!(
        "{:.2}",
        start.elapsed().as_secs_f64() * 1e6 / n as f64 / 2.0
    );
}

/// Runs one pair (server pinned to `cpus.0`, client to `cpus.1` when given) and returns the
/// half round trip in microseconds.
fn pair(shape: &str, n: u64, port: u16, cpus: Option<(u32, u32)>) -> Option<f64> {
    let exe = std::env::current_exe().expect("own path");
    let srv = format!("127.0.0.1:{port}");
    let cli = format!("127.0.0.2:{port}");
    let cmd = |cpu: Option<u32>| match cpu {
        Some(c) => {
            let mut k = Command::new("taskset");
            k.arg("-c").arg(c.to_string()).arg(&exe);
            k
        }
        None => Command::new(&exe),
    };
    let mut server = cmd(cpus.map(|c| c.0))
        .args(["--floor-child", "serve", shape, &srv, &cli])
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut ready = String::new();
    BufReader::new(server.stdout.take()?)
        .read_line(&mut ready)
        .ok()?;
    let out = cmd(cpus.map(|c| c.1))
        .args(["--floor-child", "ping", shape, &cli, &srv, &n.to_string()])
        .output()
        .ok()?;
    // The server ends after its stall bound; no need to wait for it.
    let _ = server.kill();
    let _ = server.wait();
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--floor-child") {
        child(&args[i + 1..]);
        return;
    }
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let n = numbers.first().copied().unwrap_or(50_000);
    let rounds = numbers.get(1).copied().unwrap_or(1).max(1);
    let two_cpus = std::thread::available_parallelism().is_ok_and(|c| c.get() >= 2)
        && Command::new("taskset").arg("-V").output().is_ok();
    let mut placements = vec![("unpinned", None)];
    if two_cpus {
        placements.push(("both ends on CPU 0", Some((0, 0))));
        placements.push(("ends on CPUs 0 and 1", Some((0, 1))));
    }
    let mut port = 47000 + (std::process::id() % 1000) as u16 * 2;
    let one = std::env::var_os("ONE").is_some();
    let link_shape = if one {
        "send-lat's SEND alone (ONE=1, no ACK) through RoceSocket"
    } else {
        "send-lat's datagrams (SEND + ACK train) through RoceSocket"
    };
    let each = if rounds > 1 {
        format!("median of {rounds} runs, each the mean of {n} messages")
    } else {
        format!("mean of {n} messages")
    };
    println!("half round trip, us ({each}; polling with sched_yield between polls)");
    for (name, cpus) in placements {
        let mut plain = Vec::new();
        let mut link = Vec::new();
        for _ in 0..rounds {
            port += 2;
            plain.extend(pair("plain", n, port, cpus));
            port += 2;
            link.extend(pair("link", n, port, cpus));
        }
        match (median(&mut plain), median(&mut link)) {
            (Some(p), Some(l)) if plain.len() as u64 == rounds && link.len() as u64 == rounds => {
                println!(
                    "{name:>22}: plain 24-byte datagram {p:6.2}   {link_shape} {l:6.2}   link/plain {:.2}",
                    l / p
                )
            }
            _ => println!(
                "{name:>22}: a run failed ({} of {rounds} plain, {} of {rounds} link runs gave a figure)",
                plain.len(),
                link.len()
            ),
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    match v.len() {
        0 => None,
        l if l % 2 == 1 => Some(v[m]),
        _ => Some((v[m - 1] + v[m]) / 2.0),
    }
}
