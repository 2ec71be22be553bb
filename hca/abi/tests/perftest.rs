//! Debian's perftest (`ib_{send,write,read,atomic}_{bw,lat}`, unmodified) over the drop-in
//! `libibverbs.so.1`: server and client as two processes, each with its own device on its own
//! loopback address (`ROCE_DEVICES`), the out-of-band exchange on a TCP port of the server's
//! address. Every tool runs with its default post-send API and with `--use_old_post_send`; the
//! bandwidth tools also with `-q 4` and with `-a` (every size from 2 B to 8 MiB). Each run must
//! exit 0 on both sides and its result table must be sane: one row per size with the requested
//! iteration count, and for bandwidth rows a message rate whose product with the size is the
//! reported average bandwidth (within the rounding of the printed figures), for latency rows
//! `0 < t_min <= t_typical, t_avg <= t_max`.
//!
//! perftest uses the `ibv_qp_ex` API by default only on the devices it recognises (mlx5, EFA,
//! HNS, by vendor part ID) and falls back to `ibv_post_send` elsewhere, as on Linux rxe; so both
//! runs post through `ibv_post_send` here (tests/extended_verbs.rs covers the `ibv_qp_ex` API).
//! Every process runs under `timeout`; a client that starts before its server listens retries.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{lib_dir, text, tool};

/// Runs `name ARGS` as server on `a` and client on `b`; returns the client's output after
/// checking both exit codes.
fn run_pair(name: &str, a: &str, b: &str, port: u16, args: &[&str]) -> Option<String> {
    let t = tool(name)?;
    let port = port.to_string();
    let mut common = vec!["-d", "rxe0", "-x", "0", "-p", &port];
    common.extend_from_slice(args);
    let server = Command::new("timeout")
        .arg("120")
        .arg(&t)
        .args(&common)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", format!("rxe0=udp:{a}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    let mut client: Option<Output> = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let o = Command::new("timeout")
            .arg("120")
            .arg(&t)
            .args(&common)
            .arg(a)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("ROCE_DEVICES", format!("rxe0=udp:{b}"))
            .output()
            .expect("run client");
        let refused = text(&o).contains("Couldn't connect");
        client = Some(o);
        if !refused {
            break;
        }
    }
    let client = client.expect("at least one attempt");
    let server = server.wait_with_output().expect("server output");
    let (c, s) = (text(&client), text(&server));
    assert!(
        client.status.success() && server.status.success(),
        "{name} {args:?}: client {:?}, server {:?}\nclient:\n{c}\nserver:\n{s}",
        client.status,
        server.status
    );
    Some(c)
}

/// The rows of the result table (the lines after the `#bytes` header up to the closing rule),
/// as numbers.
fn rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .map(|l| {
            l.split_whitespace()
                .map(|f| f.parse::<f64>().unwrap_or(f64::NAN))
                .collect()
        })
        .collect()
}

/// Checks a bandwidth table: `sizes` rows in order, `iters` each, and
/// `BW average [MiB/s] = bytes * MsgRate [Mpps]` within the printing's rounding.
fn check_bw(out: &str, sizes: &[u64], iters: u64) {
    let rows = rows(out);
    assert_eq!(rows.len(), sizes.len(), "rows of:\n{out}");
    for (r, &size) in rows.iter().zip(sizes) {
        assert!(r.len() >= 5, "row {r:?} of:\n{out}");
        let (bytes, n, peak, avg, rate) = (r[0], r[1], r[2], r[3], r[4]);
        assert_eq!(bytes, size as f64, "{out}");
        assert_eq!(n, iters as f64, "{out}");
        assert!(
            rate > 0.0 && avg >= 0.0 && peak >= 0.0,
            "row {r:?} of:\n{out}"
        );
        // MsgRate is printed with 6 decimals, the bandwidths with 2.
        let mib = |mpps: f64| bytes * mpps * 1e6 / 1_048_576.0;
        let (lo, hi) = (mib(rate - 5e-7) - 0.01, mib(rate + 5e-7) + 0.01);
        assert!(
            (lo..=hi).contains(&avg),
            "average {avg} MiB/s is not {bytes} B x {rate} Mpps in:\n{out}"
        );
    }
}

/// Checks a latency table: one row of `size` bytes, `iters` iterations, ordered times.
fn check_lat(out: &str, size: u64, iters: u64) {
    let rows = rows(out);
    assert_eq!(rows.len(), 1, "rows of:\n{out}");
    let r = &rows[0];
    assert!(r.len() >= 7, "row {r:?} of:\n{out}");
    let (bytes, n, min, max, typical, avg) = (r[0], r[1], r[2], r[3], r[4], r[5]);
    assert_eq!((bytes, n), (size as f64, iters as f64), "{out}");
    assert!(
        min > 0.0 && min <= typical && typical <= max && min <= avg && avg <= max,
        "times out of order in:\n{out}"
    );
}

/// 2, 4, ... 8 MiB: the sizes of `-a`.
fn all_sizes() -> Vec<u64> {
    (1..=23).map(|k| 1u64 << k).collect()
}

fn bw(name: &str, a: &str, b: &str, port: u16, size: u64, with_all: bool) {
    let iters = 20;
    let n = iters.to_string();
    let Some(out) = run_pair(name, a, b, port, &["-n", &n]) else {
        return;
    };
    check_bw(&out, &[size], iters);
    let out = run_pair(name, a, b, port, &["-n", &n, "--use_old_post_send"]).unwrap();
    check_bw(&out, &[size], iters);
    // `-q 4`: the iterations are per QP; the table counts them all.
    let out = run_pair(name, a, b, port, &["-n", &n, "-q", "4"]).unwrap();
    assert!(out.contains("Number of qps   : 4"), "{out}");
    check_bw(&out, &[size], 4 * iters);
    if with_all {
        let out = run_pair(name, a, b, port, &["-n", "5", "-a"]).unwrap();
        check_bw(&out, &all_sizes(), 5);
    }
}

fn lat(name: &str, a: &str, b: &str, port: u16, size: u64) {
    let iters = 20;
    let n = iters.to_string();
    let Some(out) = run_pair(name, a, b, port, &["-n", &n]) else {
        return;
    };
    check_lat(&out, size, iters);
    let out = run_pair(name, a, b, port, &["-n", &n, "--use_old_post_send"]).unwrap();
    check_lat(&out, size, iters);
}

#[test]
fn ib_send_bw() {
    bw("ib_send_bw", "127.0.0.31", "127.0.0.32", 18731, 65536, true);
}

#[test]
fn ib_write_bw() {
    bw(
        "ib_write_bw",
        "127.0.0.33",
        "127.0.0.34",
        18733,
        65536,
        true,
    );
}

#[test]
fn ib_read_bw() {
    bw("ib_read_bw", "127.0.0.35", "127.0.0.36", 18735, 65536, true);
}

/// Atomics are 8 bytes: `-a` does not apply.
#[test]
fn ib_atomic_bw() {
    bw("ib_atomic_bw", "127.0.0.37", "127.0.0.38", 18737, 8, false);
}

#[test]
fn ib_send_lat() {
    lat("ib_send_lat", "127.0.0.39", "127.0.0.40", 18739, 2);
}

#[test]
fn ib_write_lat() {
    lat("ib_write_lat", "127.0.0.41", "127.0.0.42", 18741, 2);
}

#[test]
fn ib_read_lat() {
    lat("ib_read_lat", "127.0.0.43", "127.0.0.44", 18743, 2);
}

#[test]
fn ib_atomic_lat() {
    lat("ib_atomic_lat", "127.0.0.45", "127.0.0.46", 18745, 8);
}

/// The tools exist where the test runs (tests/setup.sh installs perftest).
#[test]
fn perftest_is_installed() {
    if std::env::var("ROCE_SKIP_DEBIAN_TOOLS").is_ok_and(|v| v == "1") {
        return;
    }
    assert!(Path::new("/usr/bin/ib_write_bw").exists());
}
