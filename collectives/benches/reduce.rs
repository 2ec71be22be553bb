//! Reduction kernel throughput beside `memcpy`, the thing a reduction can at best match: a
//! two-source reduce-copy reads two buffers and writes one, so at memory speed it moves 1.5x the
//! bytes of a copy of the same destination size.
//!
//! `cargo bench -p collectives --bench reduce` prints, per data type and buffer size, GB/s of
//! destination bytes for `reduce_copy(sum)`, `reduce_in_place(sum)` and `copy_from_slice`, and
//! the ratio reduce_copy / memcpy. Buffers sit at odd offsets (alignment-agnostic kernels).

use std::hint::black_box;
use std::time::{Duration, Instant};

use collectives::reduce::{reduce_copy, reduce_in_place};
use collectives::{DataType, RedOp};

/// Runs `f` until at least 200 ms have passed; returns seconds per call.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut iters = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let e = t.elapsed();
        if e >= Duration::from_millis(200) {
            return e.as_secs_f64() / iters as f64;
        }
        iters *= 2;
    }
}

fn main() {
    println!(
        "{:>9} {:>10} {:>14} {:>14} {:>12} {:>8}",
        "type", "bytes", "reduce_copy", "in_place", "memcpy", "ratio"
    );
    for datatype in [
        DataType::F32,
        DataType::F64,
        DataType::I32,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
    ] {
        for bytes in [32usize << 10, 1 << 20, 16 << 20] {
            let x = vec![1u8; bytes + 3];
            let y = vec![2u8; bytes + 1];
            let mut d = vec![0u8; bytes + 5];
            let rc = time(|| {
                reduce_copy(
                    datatype,
                    RedOp::Sum,
                    black_box(&mut d[5..]),
                    black_box(&x[3..]),
                    black_box(&y[1..]),
                )
                .unwrap();
            });
            let ip = time(|| {
                reduce_in_place(
                    datatype,
                    RedOp::Sum,
                    black_box(&mut d[5..]),
                    black_box(&x[3..]),
                )
                .unwrap();
            });
            let mc = time(|| {
                black_box(&mut d[5..]).copy_from_slice(black_box(&x[3..]));
            });
            let gbs = |s: f64| bytes as f64 / s / 1e9;
            println!(
                "{:>9} {:>10} {:>9.2} GB/s {:>9.2} GB/s {:>7.2} GB/s {:>7.2}x",
                datatype.name(),
                bytes,
                gbs(rc),
                gbs(ip),
                gbs(mc),
                mc / rc
            );
        }
    }
}
