//! The rendezvous root against strangers on its port (issue 17): while a real 4-rank job
//! rendezvous (threads of this process, `Communicator::init`), other connections send random
//! bytes, truncated frames, oversized length prefixes, `HELLO`s with a wrong secret, a wrong
//! world size, a rank out of range, a duplicate of a rank that has joined, and connections that
//! never send anything. The job must complete with correct all-reduce results, and the refusals
//! must be logged, and the process's peak resident memory (`VmHWM`, proc(5)) may grow by less
//! than [`HWM_GROWTH_BOUND`] over the whole job. Loopback only; every wait is bounded by a
//! deadline, none is a threshold.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use collectives::bootstrap::rendezvous::{RootLog, RootOptions, MAX_FRAME, MAX_PENDING};
use collectives::{Communicator, RedOp, TransportKind, UniqueId};

const N: usize = 4;
/// The most any wait of this test takes before it fails (not a measure of speed).
const PATIENCE: Duration = Duration::from_secs(60);
/// How much this process's `VmHWM` may grow from before the strangers to the end of the job:
/// 64 MiB. The root reads at most a 25-byte `HELLO` from a stranger (an announced frame of
/// `MAX_FRAME`, 16 MiB, or 4 GiB is refused unread) and at most 64 wait at once on 64 KiB
/// thread stacks; a peer-sized buffer that the root filled would pass the bound. (Measured:
/// a growth of a few MiB, the ranks' own buffers and threads included.)
const HWM_GROWTH_BOUND: u64 = 64 << 20;

/// This process's `VmHWM`, bytes (proc(5)).
fn vm_hwm() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// A `HELLO` frame: length, tag 1, magic, version, rank, nranks (little-endian).
fn hello(magic: u64, version: u32, rank: u32, nranks: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&21u32.to_le_bytes());
    f.push(1);
    f.extend_from_slice(&magic.to_le_bytes());
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&nranks.to_le_bytes());
    f
}

/// xorshift64*: reproducible junk.
fn junk(seed: &mut u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *seed ^= *seed >> 12;
            *seed ^= *seed << 25;
            *seed ^= *seed >> 27;
            (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// Connects, sends `bytes` (then half-closes when `close`), and returns what the root answered
/// before it closed (bounded by a read timeout). Connection errors give an empty answer: once
/// the job has joined, the root no longer listens.
fn poke(addr: SocketAddr, bytes: &[u8], close: bool) -> Vec<u8> {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return Vec::new();
    };
    let _ = s.write_all(bytes);
    if close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
    let mut answer = Vec::new();
    let _ = s.take(4096).read_to_end(&mut answer);
    answer
}

/// The message of a `FAILED` frame (length, tag 5, rank u32, message as u32 length + bytes).
fn failed_message(answer: &[u8]) -> Option<String> {
    if answer.len() < 13 || answer[4] != 5 {
        return None;
    }
    Some(String::from_utf8_lossy(&answer[13..]).into_owned())
}

/// Every kind of stranger, one connection each, answered or dropped by the root.
fn strangers(addr: SocketAddr, magic: u64, seed: &mut u64) {
    let len = junk(seed, 1)[0] as usize * 4;
    poke(addr, &junk(seed, len), true);
    poke(addr, &junk(seed, 3), true); // not even a length
    poke(addr, &hello(magic, 1, 0, N as u32)[..10], true); // truncated HELLO
    poke(addr, &u32::MAX.to_le_bytes(), false); // oversized length prefix
    poke(addr, &((MAX_FRAME + 1) as u32).to_le_bytes(), false);
    let mut big = (MAX_FRAME as u32).to_le_bytes().to_vec(); // a legal size, but not a HELLO
    big.push(1);
    poke(addr, &big, false);
    let wrong = poke(addr, &hello(magic ^ 1, 1, 1, N as u32), false);
    assert!(
        failed_message(&wrong).is_some_and(|m| m.contains("wrong secret")),
        "wrong secret answered {wrong:?}"
    );
    poke(addr, &hello(magic, 1, 1, N as u32 + 1), false); // another world size
    poke(addr, &hello(magic, 1, N as u32 + 3, N as u32), false); // rank out of range
    poke(addr, &hello(magic, 99, 2, N as u32), false); // another version
}

#[test]
fn strangers_on_the_root_port_cost_a_real_job_nothing() {
    let log: Arc<Mutex<Vec<(RootLog, String)>>> = Arc::default();
    let sink = {
        let log = log.clone();
        Arc::new(move |kind: RootLog, line: &str| {
            log.lock().unwrap().push((kind, line.to_string()));
        })
    };
    let id = UniqueId::listen_with(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        RootOptions {
            nranks: Some(N),
            timeout: PATIENCE,
            log: Some(sink),
        },
    )
    .unwrap();
    let (addr, magic) = (id.addr(), id.magic());
    let hwm_before = vm_hwm();

    // Connections that never send, more than the root lets wait at once: the oldest are closed,
    // the rest stay open through the whole job.
    let idle: Vec<TcpStream> = (0..MAX_PENDING + 8)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok())
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    strangers(addr, magic, &mut seed);

    // Strangers keep coming while the ranks join.
    let done = Arc::new(AtomicBool::new(false));
    let noise = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seed = 0x1234_5678_9abc_def1u64;
            let mut rounds = 0;
            while !done.load(Ordering::Relaxed) && rounds < 50 {
                let len = junk(&mut seed, 1)[0] as usize;
                poke(addr, &junk(&mut seed, len), true);
                poke(addr, &hello(magic ^ 0xff, 1, 3, N as u32), false);
                rounds += 1;
            }
        })
    };

    let config = common::config(TransportKind::InProcess);
    let rank = |r: usize| {
        std::thread::spawn(move || {
            let mut comm = Communicator::init(&id, r, N, config)
                .unwrap_or_else(|e| panic!("rank {r}: init: {e}"));
            let mut v = vec![(r + 1) as f32; 1000];
            comm.all_reduce_typed_in_place(&mut v, RedOp::Sum)
                .unwrap_or_else(|e| panic!("rank {r}: all-reduce: {e}"));
            v
        })
    };
    // Rank 0 first; once the root logged it, a second HELLO for rank 0 (with the right secret)
    // must be refused and must not displace it.
    let first = rank(0);
    let deadline = Instant::now() + PATIENCE;
    while !log
        .lock()
        .unwrap()
        .iter()
        .any(|(k, l)| *k == RootLog::Joined && l.contains("rank 0 of 4 joined"))
    {
        assert!(Instant::now() < deadline, "rank 0 never joined");
        std::thread::sleep(Duration::from_millis(5));
    }
    let dup = poke(addr, &hello(magic, 1, 0, N as u32), false);
    assert!(
        failed_message(&dup).is_some_and(|m| m.contains("second HELLO for rank 0")),
        "duplicate answered {dup:?}"
    );
    let rest: Vec<_> = (1..N).map(rank).collect();
    let want = vec![(1..=N).sum::<usize>() as f32; 1000];
    for (r, h) in std::iter::once(first).chain(rest).enumerate() {
        assert_eq!(h.join().unwrap(), want, "rank {r}");
    }
    done.store(true, Ordering::Relaxed);
    noise.join().unwrap();
    drop(idle);

    let log = log.lock().unwrap();
    let refused: Vec<&str> = log
        .iter()
        .filter(|(k, _)| *k == RootLog::Refused)
        .map(|(_, l)| l.as_str())
        .collect();
    for what in [
        "wrong secret",
        "second HELLO for rank 0",
        "claims world size 5",
        "out of range",
        "version 99",
        "a first frame of",
        "the oldest of more than",
    ] {
        assert!(
            refused.iter().any(|l| l.contains(what)),
            "no log line with '{what}' in {refused:#?}"
        );
    }
    let joined = log.iter().filter(|(k, _)| *k == RootLog::Joined).count();
    assert_eq!(joined, N, "{log:#?}");
    let growth = vm_hwm().saturating_sub(hwm_before);
    eprintln!(
        "VmHWM grew by {:.1} MiB (bound {} MiB)",
        growth as f64 / f64::from(1 << 20),
        HWM_GROWTH_BOUND >> 20
    );
    assert!(
        growth < HWM_GROWTH_BOUND,
        "VmHWM grew by {growth} bytes (bound {HWM_GROWTH_BOUND})"
    );
}
