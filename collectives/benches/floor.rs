//! The kernel's floor under a RoCE all-reduce (issue 21): the bytes one ring all-reduce moves,
//! sent and received by a plain program, plus the one reduction pass the all-reduce needs, with
//! no RDMA engine, no slots, no credits and no completion queues.
//!
//! `N` ranks (threads of this process) in a ring, f32 sum of `size` bytes per rank, split into
//! `N` blocks; `N - 1` reduce-scatter steps (send a block to the next rank, receive one from the
//! previous rank and add it into the own buffer: the reduction pass) then `N - 1` all-gather steps
//! (send a block, receive one in place). That is the busbw convention of nccl-tests: each rank
//! sends and receives `2 (N - 1) / N * size` bytes.
//!
//! Two wires:
//! * `udp`: RoCE-sized datagrams (4096 bytes of payload, the RoCE path MTU the software HCA uses
//!   on `lo`, behind a 16-byte stand-in for the BTH and the ICRC), sent as UDP GSO trains
//!   (`UDP_SEGMENT`, up to 15 segments, one sendmsg(2) each) on connected sockets and received
//!   with `UDP_GRO` (a train per recv(2)), as the software HCA's link does (see
//!   `hca::link::udp`). UDP has no flow control: a rank sends at most [`WINDOW`] bytes of a
//!   step ahead of what it has received in that step, and the receive buffer (SO_RCVBUFFORCE
//!   as root) holds `N` windows, so loopback drops nothing; a lost datagram shows as a stall
//!   and an error, never a wrong figure. The payload lands in a scratch train buffer and is
//!   reduced (reduce-scatter) or copied (all-gather) out of it: the receive copy the HCA's engine
//!   makes too.
//! * `tcp`: the same steps over one TCP connection per ring edge, received straight into the
//!   buffer (all-gather) or a scratch block (reduce-scatter); what Open MPI's `btl tcp` uses.
//!
//! Every socket is nonblocking; a rank sends and receives a step's block in one poll(2) loop, so
//! no step deadlocks on full socket buffers. Each wait is bounded by [`STALL`].
//!
//! Prints `size busbw_GB/s wrong` lines (busbw from the mean time per all-reduce over `iters`
//! after `warmup`, averaged over ranks), as `compare.sh` reads them; `wrong` counts elements of
//! the last result that differ from `N (N + 1) / 2`.
//!
//! Run by hand: `cargo bench -p collectives --bench floor -- udp|tcp NRANKS MINB MAXB FACTOR
//! ITERS WARMUP` (bytes; defaults `udp 4 1024 67108864 4 20 5`).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// RoCE path MTU on `lo` (bytes of payload per datagram).
const MTU: usize = 4096;
/// Stand-in for the BTH (12 bytes) and the ICRC (4 bytes) of each datagram.
const HDR: usize = 16;
/// One datagram on the wire (UDP payload).
const SEG: usize = MTU + HDR;
/// Segments per GSO train: the most that fit a 65507-byte UDP payload.
const TRAIN_SEGS: usize = 65507 / SEG;
/// How far a rank's sends of a step may run ahead of its receives in that step (bytes).
const WINDOW: usize = 512 << 10;
/// The longest any wait goes without progress before the run fails.
const STALL: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let num = |i: usize, d: usize| -> usize {
        args.get(i).map_or(d, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("floor: argument {} ({s:?}) is not a number", i + 1);
                std::process::exit(2)
            })
        })
    };
    let wire = args.first().map_or("udp", String::as_str).to_string();
    if wire != "udp" && wire != "tcp" {
        eprintln!("floor: the first argument is udp or tcp, not {wire:?}");
        std::process::exit(2);
    }
    let n = num(1, 4);
    let (minb, maxb, factor) = (num(2, 1024), num(3, 64 << 20), num(4, 4));
    let (iters, warmup) = (num(5, 20), num(6, 5));
    if !(2..=64).contains(&n) || factor < 2 || minb < 4 * n || iters == 0 || maxb > (1 << 30) {
        eprintln!("floor: need 2 <= NRANKS <= 64, FACTOR >= 2, MINB >= 4 * NRANKS, ITERS >= 1, MAXB <= 1 GiB");
        std::process::exit(2);
    }
    match run(&wire, n, minb, maxb, factor, iters, warmup) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
        }
        Err(e) => {
            eprintln!("floor ({wire}): {e}");
            std::process::exit(1);
        }
    }
}

/// One ring edge of one rank: the socket to the next rank and the one from the previous rank.
enum Edge {
    Udp { tx: UdpSocket, rx: UdpSocket },
    Tcp { tx: TcpStream, rx: TcpStream },
}

impl Edge {
    fn fds(&self) -> (RawFd, RawFd) {
        match self {
            Edge::Udp { tx, rx } => (tx.as_raw_fd(), rx.as_raw_fd()),
            Edge::Tcp { tx, rx } => (tx.as_raw_fd(), rx.as_raw_fd()),
        }
    }
}

fn setsockopt(fd: RawFd, level: i32, name: i32, val: i32) -> io::Result<()> {
    // SAFETY: `val` outlives the call and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&val as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The ring's edges: `edges[r]` sends to `r + 1` and receives from `r - 1`.
fn connect_ring(wire: &str, n: usize) -> io::Result<Vec<Edge>> {
    if wire == "udp" {
        let mut tx = Vec::new();
        let mut rx = Vec::new();
        let socks: Vec<(UdpSocket, UdpSocket)> = (0..n)
            .map(|_| {
                Ok((
                    UdpSocket::bind("127.0.0.1:0")?,
                    UdpSocket::bind("127.0.0.1:0")?,
                ))
            })
            .collect::<io::Result<_>>()?;
        for r in 0..n {
            let (t, _) = &socks[r];
            let (_, next_rx) = &socks[(r + 1) % n];
            t.connect(next_rx.local_addr()?)?;
            next_rx.connect(t.local_addr()?)?;
        }
        // UDP_SEGMENT / UDP_GRO (linux/udp.h): 103 / 104, SOL_UDP = IPPROTO_UDP.
        for (t, r) in socks {
            setsockopt(t.as_raw_fd(), libc::IPPROTO_UDP, 103, SEG as i32)?;
            setsockopt(r.as_raw_fd(), libc::IPPROTO_UDP, 104, 1)?;
            let want = (2 * n * WINDOW) as i32;
            if setsockopt(r.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, want).is_err() {
                setsockopt(r.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
            }
            t.set_nonblocking(true)?;
            r.set_nonblocking(true)?;
            tx.push(t);
            rx.push(r);
        }
        // Rank r's receiving socket is the one rank r - 1 sends to.
        Ok(tx
            .into_iter()
            .zip(rx)
            .map(|(tx, rx)| Edge::Udp { tx, rx })
            .collect())
    } else {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<io::Result<_>>()?;
        let mut tx = Vec::new();
        let mut accepted = Vec::new();
        for r in 0..n {
            let t = TcpStream::connect(listeners[(r + 1) % n].local_addr()?)?;
            let (a, _) = listeners[(r + 1) % n].accept()?;
            t.set_nodelay(true)?;
            a.set_nodelay(true)?;
            t.set_nonblocking(true)?;
            a.set_nonblocking(true)?;
            tx.push(t);
            accepted.push(Some(a)); // received by rank r + 1
        }
        Ok(tx
            .into_iter()
            .enumerate()
            .map(|(r, t)| Edge::Tcp {
                tx: t,
                rx: accepted[(r + n - 1) % n].take().expect("each rx once"),
            })
            .collect())
    }
}

/// Waits for the fds to become ready (poll(2)), at most [`STALL`].
fn wait(tx: Option<RawFd>, rx: Option<RawFd>) -> io::Result<()> {
    let mut fds = Vec::with_capacity(2);
    if let Some(fd) = tx {
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        });
    }
    if let Some(fd) = rx {
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the call.
    let r = unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            STALL.as_millis() as i32,
        )
    };
    match r {
        0 => Err(io::Error::new(
            ErrorKind::TimedOut,
            "no progress for 10 s (a lost datagram, or a peer gone)",
        )),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// What a step does with received bytes.
#[derive(Clone, Copy, PartialEq)]
enum Land {
    /// Add into the block (reduce-scatter).
    Reduce,
    /// Copy into the block (all-gather).
    Copy,
}

fn add_into(dst: &mut [f32], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d += f32::from_ne_bytes([s[0], s[1], s[2], s[3]]);
    }
}

struct Rank {
    edge: Edge,
    /// Send train (GSO) or receive scratch.
    train: Vec<u8>,
    scratch: Vec<u8>,
}

impl Rank {
    /// Sends `out` to the next rank while receiving `inn.len()` floats' bytes from the previous
    /// rank, landing them per `land`.
    fn step(&mut self, out: &[u8], inn: &mut [f32], land: Land) -> io::Result<()> {
        let want = inn.len() * 4;
        let (mut sent, mut got, mut pend) = (0usize, 0usize, 0usize);
        let udp = matches!(self.edge, Edge::Udp { .. });
        let (txfd, rxfd) = self.edge.fds();
        while sent < out.len() || got < want {
            let mut moved = false;
            let may_send = sent < out.len() && (!udp || sent < got + WINDOW);
            if may_send {
                match &mut self.edge {
                    Edge::Udp { tx, .. } => {
                        // One GSO train: TRAIN_SEGS segments of header + MTU payload.
                        let mut len = 0;
                        let mut p = sent;
                        while len + HDR < TRAIN_SEGS * SEG && p < out.len() {
                            let take = MTU.min(out.len() - p);
                            self.train[len..len + HDR].fill(0);
                            self.train[len + HDR..len + HDR + take]
                                .copy_from_slice(&out[p..p + take]);
                            len += HDR + take;
                            p += take;
                            if take < MTU {
                                break;
                            }
                        }
                        match tx.send(&self.train[..len]) {
                            Ok(_) => {
                                sent = p;
                                moved = true;
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Edge::Tcp { tx, .. } => match tx.write(&out[sent..]) {
                        Ok(k) => {
                            sent += k;
                            moved = true;
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    },
                }
            }
            if got < want {
                match &mut self.edge {
                    Edge::Udp { rx, .. } => match rx.recv(&mut self.scratch) {
                        Ok(k) => {
                            moved = true;
                            // Segments of SEG bytes, the last of a train possibly shorter.
                            for seg in self.scratch[..k].chunks(SEG) {
                                let pay = &seg[HDR.min(seg.len())..];
                                let take = pay.len().min(want - got);
                                let at = got / 4;
                                let dst = &mut inn[at..at + take / 4];
                                match land {
                                    Land::Reduce => add_into(dst, &pay[..take]),
                                    Land::Copy => {
                                        bytemuck::cast_slice_mut::<f32, u8>(dst)
                                            .copy_from_slice(&pay[..take]);
                                    }
                                }
                                got += take;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    },
                    Edge::Tcp { rx, .. } => {
                        // Reduce: whole floats from the scratch, a partial one kept at its front.
                        let r = match land {
                            Land::Copy => {
                                rx.read(&mut bytemuck::cast_slice_mut::<f32, u8>(inn)[got..])
                            }
                            Land::Reduce => {
                                let room = (want - got).min(self.scratch.len()) - pend;
                                rx.read(&mut self.scratch[pend..pend + room])
                            }
                        };
                        match r {
                            Ok(0) => {
                                return Err(io::Error::new(ErrorKind::UnexpectedEof, "peer closed"))
                            }
                            Ok(k) => {
                                moved = true;
                                if land == Land::Reduce {
                                    let have = pend + k;
                                    let whole = have - have % 4;
                                    let at = got / 4;
                                    add_into(&mut inn[at..at + whole / 4], &self.scratch[..whole]);
                                    self.scratch.copy_within(whole..have, 0);
                                    pend = have - whole;
                                    got += whole;
                                } else {
                                    got += k;
                                }
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            if !moved {
                let send_blocked = sent < out.len() && (!udp || sent < got + WINDOW);
                wait(send_blocked.then_some(txfd), (got < want).then_some(rxfd))?;
            }
        }
        Ok(())
    }

    /// One ring all-reduce of `buf` in place (f32 sum) among `n` ranks; this is rank `r`.
    fn all_reduce(&mut self, buf: &mut [f32], r: usize, n: usize) -> io::Result<()> {
        let count = buf.len();
        let block = |b: usize| (b * count / n)..((b + 1) * count / n);
        let mut out = Vec::new();
        for s in 0..n - 1 {
            let send_b = (r + n - s) % n;
            let recv_b = (r + n - s - 1) % n;
            out.clear();
            out.extend_from_slice(bytemuck::cast_slice::<f32, u8>(&buf[block(send_b)]));
            self.step(&out, &mut buf[block(recv_b)], Land::Reduce)?;
        }
        for s in 0..n - 1 {
            let send_b = (r + 1 + n - s) % n;
            let recv_b = (r + n - s) % n;
            out.clear();
            out.extend_from_slice(bytemuck::cast_slice::<f32, u8>(&buf[block(send_b)]));
            self.step(&out, &mut buf[block(recv_b)], Land::Copy)?;
        }
        Ok(())
    }
}

fn run(
    wire: &str,
    n: usize,
    minb: usize,
    maxb: usize,
    factor: usize,
    iters: usize,
    warmup: usize,
) -> io::Result<Vec<String>> {
    let udp_wire = wire == "udp";
    let edges = connect_ring(wire, n)?;
    let barrier = Arc::new(Barrier::new(n));
    let mut threads = Vec::new();
    for (r, edge) in edges.into_iter().enumerate() {
        let barrier = barrier.clone();
        threads.push(std::thread::spawn(move || {
            // A failed rank ends the run: its peers would wait for it at the barrier.
            rank_main(edge, r, n, (minb, maxb, factor, iters, warmup), &barrier).unwrap_or_else(
                |e| {
                    eprintln!(
                        "floor ({}): rank {r}: {e}",
                        if udp_wire { "udp" } else { "tcp" }
                    );
                    std::process::exit(1)
                },
            )
        }));
    }
    let mut per_rank = Vec::new();
    for t in threads {
        per_rank.push(
            t.join()
                .map_err(|_| io::Error::other("a rank thread panicked"))?,
        );
    }
    let mut lines = Vec::new();
    for i in 0..per_rank[0].len() {
        let size = per_rank[0][i].0;
        let t = per_rank.iter().map(|p| p[i].1).sum::<f64>() / n as f64;
        let wrong: usize = per_rank.iter().map(|p| p[i].2).sum();
        let busbw = size as f64 / t / 1e9 * 2.0 * (n - 1) as f64 / n as f64;
        lines.push(format!("{size} {busbw:.5} {wrong}"));
    }
    Ok(lines)
}

type Sizes = (usize, usize, usize, usize, usize);

fn rank_main(
    edge: Edge,
    r: usize,
    n: usize,
    (minb, maxb, factor, iters, warmup): Sizes,
    barrier: &Barrier,
) -> io::Result<Vec<(usize, f64, usize)>> {
    let mut rank = Rank {
        edge,
        train: vec![0; TRAIN_SEGS * SEG],
        scratch: vec![0; 1 << 16],
    };
    let mut res = Vec::new();
    let mut size = minb;
    while size <= maxb {
        let count = size / 4;
        let input = vec![(r + 1) as f32; count];
        let mut buf = input.clone();
        for _ in 0..warmup {
            buf.copy_from_slice(&input);
            rank.all_reduce(&mut buf, r, n)?;
        }
        barrier.wait();
        let t0 = Instant::now();
        for _ in 0..iters {
            buf.copy_from_slice(&input);
            rank.all_reduce(&mut buf, r, n)?;
        }
        let t = t0.elapsed().as_secs_f64() / iters as f64;
        let expect = (n * (n + 1) / 2) as f32;
        let wrong = buf.iter().filter(|&&v| v != expect).count();
        res.push((size, t, wrong));
        barrier.wait();
        size *= factor;
    }
    Ok(res)
}
