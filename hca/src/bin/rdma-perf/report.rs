//! perftest's results: the bandwidth and latency statistics of `print_report_bw` /
//! `print_report_lat` (perftest 4.5 `src/perftest_parameters.c`) and their output formats.

use std::time::Instant;

/// `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// `RESULT_FMT` (MB/s, where perftest's MB is 2^20 bytes).
pub const RESULT_FMT: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

/// `RESULT_FMT_G` (`--report_gbits`: 10^9 bits per second).
pub const RESULT_FMT_G: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// `RESULT_FMT_LAT`.
pub const RESULT_FMT_LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// `RESULT_FMT_LAT_DUR` (`-D`).
pub const RESULT_FMT_LAT_DUR: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// One bandwidth result, as `struct bw_report_data` (and the TCP report) carries it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bw {
    /// Message size, bytes.
    pub size: u64,
    /// Messages counted.
    pub iters: u64,
    /// Peak bandwidth (MB/s or Gb/s); 0 when not computed.
    pub peak: f64,
    /// Average bandwidth, same unit.
    pub avg: f64,
    /// Average message rate, millions per second.
    pub msg_rate: f64,
}

/// The unit factor of `print_report_bw`: bytes per MB (2^20) or bits->Gb (125,000,000 bytes per
/// Gb/s).
pub fn format_factor(gbits: bool) -> f64 {
    if gbits {
        125_000_000.0
    } else {
        1_048_576.0
    }
}

/// `print_report_bw` over post / completion timestamps: `tposted[i]` when message `i` was
/// posted, `tcompleted[i]` when it was known complete (a completion covers `cq_mod` messages).
/// The peak is perftest's: the best average rate over any span from a post to a signaled
/// completion (`peak = false`: not computed, as `-N` / more than 20000 iterations). With very
/// many messages the spans' starts are sampled (perftest scans all; the result is the same up
/// to the sampling step).
pub fn bw_report(
    size: u64,
    tposted: &[Instant],
    tcompleted: &[Instant],
    cq_mod: usize,
    peak: bool,
    gbits: bool,
) -> Bw {
    let n = tposted.len().min(tcompleted.len());
    if n == 0 {
        return Bw {
            size,
            ..Bw::default()
        };
    }
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let total = secs(tposted[0], tcompleted[n - 1]).max(1e-9);
    let ff = format_factor(gbits);
    let avg = size as f64 * n as f64 / (total * ff);
    let msg_rate = n as f64 / total / 1e6;
    let mut best = total / n as f64;
    if peak {
        let cq_mod = cq_mod.max(1);
        let pairs = (n as f64) * (n as f64) / (2.0 * cq_mod as f64);
        let stride = ((pairs / 2e7).ceil() as usize).max(1);
        let mut i = 0;
        while i < n {
            let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            while j < n {
                let t = secs(tposted[i], tcompleted[j]) / (j - i + 1) as f64;
                if t > 0.0 && t < best {
                    best = t;
                }
                j += cq_mod;
            }
            if n % cq_mod != 0 {
                let j = n - 1;
                let t = secs(tposted[i], tcompleted[j]) / (j - i + 1) as f64;
                if t > 0.0 && t < best {
                    best = t;
                }
            }
            i += stride;
        }
    }
    Bw {
        size,
        iters: n as u64,
        peak: if peak { size as f64 / (best * ff) } else { 0.0 },
        avg,
        msg_rate,
    }
}

/// A bandwidth result over a measured window of `secs` seconds with `iters` messages (`-D`).
pub fn bw_window(size: u64, iters: u64, secs: f64, gbits: bool) -> Bw {
    let secs = secs.max(1e-9);
    Bw {
        size,
        iters,
        peak: 0.0,
        avg: size as f64 * iters as f64 / (secs * format_factor(gbits)),
        msg_rate: iters as f64 / secs / 1e6,
    }
}

/// `REPORT_FMT` + `REPORT_EXT` (`REPORT_FMT_EXT`, six decimals, for Gb/s below 0.1).
pub fn bw_line(r: &Bw, gbits: bool) -> String {
    if gbits && r.avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    }
}

/// The latency statistics of `print_report_lat`, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lat {
    /// Message size, bytes.
    pub size: u64,
    /// Iterations run.
    pub iters: u64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample kept (the two largest are dropped, `LAT_MEASURE_TAIL`).
    pub max: f64,
    /// The median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// `print_report_lat`: samples are the gaps between consecutive posts (`tposted[i + 1] -
/// tposted[i]`), divided by `rtt_factor` (2 for ping-pong tests: half a round trip; 1 for READ,
/// whose round trip is the operation); sorted, the two largest dropped; median as
/// `get_median`; percentiles at `ceil(n * 0.99)` and `ceil(n * 0.999)` of the kept ones. The
/// standard deviation is computed in floating point (perftest truncates each deviation to an
/// integer number of microseconds first).
pub fn lat_report(size: u64, tposted: &[Instant], rtt_factor: f64) -> Option<Lat> {
    if tposted.len() < 4 {
        return None;
    }
    let mut delta: Vec<f64> = tposted
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    delta.sort_by(f64::total_cmp);
    let measure = delta.len() - 2;
    let median = if (measure - 1) % 2 == 1 {
        (delta[measure / 2] + delta[measure / 2 - 1]) / 2.0
    } else {
        delta[measure / 2]
    };
    let kept = &delta[..measure];
    let avg = kept.iter().sum::<f64>() / measure as f64;
    let var = kept.iter().map(|d| (avg - d) * (avg - d)).sum::<f64>() / measure as f64;
    let i99 = ((measure as f64) * 0.99).ceil() as usize;
    let i999 = ((measure as f64) * 0.999).ceil() as usize;
    Some(Lat {
        size,
        iters: tposted.len() as u64,
        min: delta[0],
        max: delta[measure],
        typical: median,
        avg,
        stdev: var.sqrt(),
        p99: delta[i99.min(delta.len() - 1)],
        p999: delta[i999.min(delta.len() - 1)],
    })
}

/// `REPORT_FMT_LAT` + `REPORT_EXT`.
pub fn lat_line(l: &Lat) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        l.size, l.iters, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999
    )
}

/// `REPORT_FMT_LAT_DUR` + `REPORT_EXT`: mean latency (microseconds) and transactions per second
/// over a `-D` window.
pub fn lat_duration_line(size: u64, iters: u64, secs: f64, rtt_factor: f64) -> String {
    let iters_f = (iters as f64).max(1.0);
    let latency = secs * 1e6 / rtt_factor / iters_f;
    let tps = iters as f64 / secs.max(1e-9);
    format!(" {size:<7}       {iters}            {latency:<7.2}        {tps:<7.2}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ticks(gaps_us: &[u64]) -> Vec<Instant> {
        let t0 = Instant::now();
        let mut t = t0;
        let mut v = vec![t0];
        for g in gaps_us {
            t += Duration::from_micros(*g);
            v.push(t);
        }
        v
    }

    #[test]
    fn latency_statistics_follow_perftest() {
        // 11 posts -> 10 gaps of 2..=20 us (round trips), halved; the two largest are dropped.
        let gaps: Vec<u64> = (1..=10).map(|g| 2 * g).collect();
        let l = lat_report(2, &ticks(&gaps), 2.0).unwrap();
        assert_eq!(l.iters, 11);
        assert!((l.min - 1.0).abs() < 1e-6);
        // Kept: 1..=8 us; the max printed is delta[8] = 9 us (perftest prints delta[measure_cnt]).
        assert!((l.max - 9.0).abs() < 1e-6);
        // measure_cnt = 8: (8 - 1) % 2 == 1 -> mean of delta[4] and delta[3] = (5 + 4) / 2.
        assert!((l.typical - 4.5).abs() < 1e-6);
        assert!((l.avg - 4.5).abs() < 1e-6);
        assert!((l.p99 - 9.0).abs() < 1e-6, "ceil(8 * 0.99) = 8");
        let line = lat_line(&l);
        assert!(
            line.starts_with(" 2       11          1.00           9.00         4.50   "),
            "{line}"
        );
    }

    #[test]
    fn bandwidth_average_and_units() {
        let t0 = Instant::now();
        let posted = vec![t0; 4];
        let done: Vec<Instant> = (1..=4)
            .map(|k| t0 + Duration::from_millis(250 * k))
            .collect();
        // 4 x 1 MiB in 1 s = 4 MB/s (perftest's MB is 2^20 bytes), 4e-6 Mpps.
        let r = bw_report(1 << 20, &posted, &done, 1, true, false);
        assert!((r.avg - 4.0).abs() < 1e-9, "{r:?}");
        assert!((r.msg_rate - 4e-6).abs() < 1e-12);
        // Peak: best span is messages 0..=3 over 1 s (all posted at t0) = 4 MB/s too.
        assert!((r.peak - 4.0).abs() < 1e-9, "{r:?}");
        let g = bw_report(1 << 20, &posted, &done, 1, false, true);
        assert!((g.avg - 4.0 * 1_048_576.0 / 125_000_000.0).abs() < 1e-9);
        assert_eq!(g.peak, 0.0);
        assert_eq!(
            bw_line(&r, false),
            " 1048576    4                4.00               4.00   \t\t   0.000004"
        );
    }
}
