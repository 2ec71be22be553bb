//! Wire-format throughput on one core, beside the thing it competes with.
//!
//! ICRC: `roce::icrc::compute` over an IPv4 RoCEv2 packet (IP + UDP + BTH + payload, the bytes the ICRC
//! covers) against a plain `copy_from_slice` of the same bytes, the one CPU copy the stack allows per
//! packet. Goal (issue): ICRC >= 50% of memcpy bandwidth. Both work on cache-resident buffers, so this
//! is the compute bound, not the memory bound. The `crc32 GB/s` column is `crc32fast::hash` over the same
//! bytes in one call, unmasked: the most the ICRC can get from the CRC library it is built on (the
//! ICRC adds the masking and a second `update` call, which dominate small packets).
//!
//! Run: `cargo bench -p roce --bench wire`.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Target wall time per measured row.
const TARGET: Duration = Duration::from_millis(300);

/// An IPv4 / UDP / BTH (RC SEND ONLY) packet with `payload_len` payload bytes plus pad, without the ICRC.
fn packet(payload_len: usize) -> Vec<u8> {
    let pad = roce::mtu::pad_cnt(payload_len);
    let ip_len = 20 + 8 + 12 + payload_len + usize::from(pad) + roce::icrc::ICRC_LEN;
    let ip_len16 = u16::try_from(ip_len).expect("packet fits IPv4");
    let udp_len = ip_len16 - 20;
    let mut p = Vec::with_capacity(ip_len);
    // IPv4: version 4, IHL 5, DSCP/ECN 0x02, DF, TTL 64, UDP, 10.0.0.1 -> 10.0.0.2 (checksum left 0).
    p.extend_from_slice(&[0x45, 0x02]);
    p.extend_from_slice(&ip_len16.to_be_bytes());
    p.extend_from_slice(&[
        0x00, 0x01, 0x40, 0x00, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    // UDP 49152 -> 4791, checksum 0.
    p.extend_from_slice(&49152u16.to_be_bytes());
    p.extend_from_slice(&4791u16.to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    // BTH: RC SEND ONLY (0x04), MigReq, PadCnt, P_Key 0xFFFF, DestQP 0x11, AckReq, PSN 0x123456.
    p.extend_from_slice(&[
        0x04,
        0x40 | (pad << 4),
        0xFF,
        0xFF,
        0,
        0,
        0,
        0x11,
        0x80,
        0x12,
        0x34,
        0x56,
    ]);
    p.extend((0..payload_len).map(|i| (i * 7 + 3) as u8));
    p.extend(std::iter::repeat_n(0u8, usize::from(pad)));
    p
}

/// Runs `op` for about [`TARGET`]: calibrates a batch of ~1/5 of it, runs 5 batches and returns the
/// fastest batch's nanoseconds per call (the minimum filters out preemption on a shared machine).
fn measure(mut op: impl FnMut()) -> f64 {
    // Warm up and calibrate: double the batch until one batch takes >= 10 ms.
    let mut batch: u64 = 1;
    loop {
        let start = Instant::now();
        for _ in 0..batch {
            op();
        }
        let took = start.elapsed();
        if took >= Duration::from_millis(10) {
            let per_op = took.as_secs_f64() / batch as f64;
            batch = ((TARGET.as_secs_f64() / 5.0 / per_op) as u64).max(1);
            break;
        }
        batch *= 2;
    }
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                op();
            }
            start.elapsed().as_secs_f64() * 1e9 / batch as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    println!(
        "roce wire-format throughput, one core ({} ms per cell, best of 5 batches)",
        TARGET.as_millis()
    );
    println!(
        "ICRC = roce::icrc::compute over IP+UDP+BTH+payload; crc32 = crc32fast::hash of the same bytes \
         (unmasked, one call); memcpy = copy_from_slice of the same bytes"
    );
    println!();
    println!(
        "{:>8}  {:>7}  {:>9}  {:>9}  {:>10}  {:>11}  {:>11}  {:>11}",
        "payload",
        "bytes",
        "ICRC ns",
        "ICRC GB/s",
        "crc32 GB/s",
        "memcpy ns",
        "memcpy GB/s",
        "ICRC/memcpy"
    );
    let mut worst: f64 = f64::INFINITY;
    for payload_len in [64usize, 1024, 4096] {
        let body = packet(payload_len);
        let expected = roce::icrc::compute(&body).expect("valid packet");
        let icrc_ns = measure(|| {
            let icrc = roce::icrc::compute(black_box(&body));
            debug_assert_eq!(icrc, Ok(expected));
            black_box(icrc).ok();
        });
        let crc_ns = measure(|| {
            black_box(crc32fast::hash(black_box(&body)));
        });
        let mut dst = vec![0u8; body.len()];
        let copy_ns = measure(|| {
            dst.copy_from_slice(black_box(&body));
            black_box(&mut dst);
        });
        let bytes = body.len() as f64;
        let ratio = copy_ns / icrc_ns;
        worst = worst.min(ratio);
        let label = format!("{payload_len} B");
        println!(
            "{:>8}  {:>7}  {:>9.1}  {:>9.2}  {:>10.2}  {:>11.1}  {:>11.2}  {:>10.0}%",
            label,
            body.len(),
            icrc_ns,
            bytes / icrc_ns,
            bytes / crc_ns,
            copy_ns,
            bytes / copy_ns,
            ratio * 100.0
        );
    }
    println!();
    println!(
        "goal: ICRC >= 50% of memcpy bandwidth; worst row {:.0}% -> {}",
        worst * 100.0,
        if worst >= 0.5 { "met" } else { "NOT met" }
    );
}
