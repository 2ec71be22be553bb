//! Congestion on the switched fabric (issue 22): N:1 incast through one switch port at 40 Gb/s
//! with the DCQCN paper's parameters (RED 5 KB / 200 KB / 1 %, `g` = 1/256, 55 us timers), PFC
//! lossless, deterministic under the seed (`hca::fabric::incast`).

use std::time::Duration;

use hca::fabric::incast::{run, Control, Outcome, Scenario};

/// The base round trip of the fabric: four link delays (data in, data out, CNP or ACK in and
/// out) plus a 4 KiB frame's serialization at each of the four hops, rounded up: 10 us.
const RTT: Duration = Duration::from_micros(10);
const LINE_RATE: u64 = 40_000_000_000;

/// Jain's index over each 1 ms window from `from_ms` to the end.
fn windows(o: &Outcome, from_ms: usize) -> Vec<f64> {
    let per_ms = (1_000_000 / o.interval.as_nanos()) as usize;
    let k = o.intervals();
    (from_ms * per_ms..k)
        .step_by(per_ms)
        .map(|i| o.jain(i..(i + per_ms).min(k)))
        .collect()
}

/// The largest egress backlog of the congested port from `from_ms` on, bytes.
fn queue_max_after(o: &Outcome, from_ms: usize) -> u64 {
    let per_ms = (1_000_000 / o.interval.as_nanos()) as usize;
    o.queue[from_ms * per_ms..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
}

fn check_dcqcn(n: usize, ms: u64, converge_ms: usize, bound: f64) -> Outcome {
    let o = run(&Scenario::incast(
        n,
        Control::DcqcnPfc,
        Duration::from_millis(ms),
    ));
    let j = windows(&o, converge_ms);
    let q = queue_max_after(&o, converge_ms);
    let kmax = hca::fabric::switch::Red::PAPER.kmax;
    let rtt_bytes = LINE_RATE / 8 * RTT.as_nanos() as u64 / 1_000_000_000;
    let k = o.intervals();
    let tot: f64 = (0..n).map(|f| o.gbps(f, converge_ms * 10..k)).sum();
    eprintln!(
        "{n}:1 dcqcn: jain per ms after {converge_ms} ms {j:.3?}; queue max {q} B (bound {}); \
         total {tot:.2} Gb/s; pauses {}, drops {}, cnps {:?}",
        kmax + rtt_bytes,
        o.pauses(),
        o.drops(),
        o.flows.iter().map(|f| f.cnps).collect::<Vec<_>>()
    );
    assert!(j.iter().all(|&x| x >= bound), "Jain below {bound}: {j:?}");
    assert_eq!(o.drops(), 0, "PFC: lossless");
    assert!(
        q <= kmax + rtt_bytes,
        "queue {q} B above Kmax + one RTT of data ({} B)",
        kmax + rtt_bytes
    );
    assert!(o.flows.iter().all(|f| f.failed == 0 && f.cnps > 0));
    o
}

#[test]
fn dcqcn_two_to_one_is_fair_and_holds_the_queue() {
    let o = check_dcqcn(2, 10, 3, 0.99);
    // Deterministic: the same scenario, the same outcome, interval by interval.
    let again = run(&o.scenario);
    assert_eq!(again, o);
}

#[test]
fn dcqcn_eight_to_one_is_fair_and_holds_the_queue() {
    check_dcqcn(8, 12, 5, 0.98);
}

#[test]
fn pfc_alone_never_drops_but_pauses_and_fills_the_buffer() {
    let o = run(&Scenario::incast(8, Control::Pfc, Duration::from_millis(3)));
    assert_eq!(o.drops(), 0);
    assert!(o.pauses() > 0);
    let k = o.intervals();
    let tot: f64 = (0..8).map(|f| o.gbps(f, k / 2..k)).sum();
    assert!(tot > 39.0, "PFC keeps the port busy: {tot} Gb/s");
    // Without rate control the congested queue stays near N x XOFF, far above Kmax.
    let q = queue_max_after(&o, 1);
    assert!(q > 1_000_000, "{q}");
}

#[test]
fn lossy_incast_drops_and_goes_back_n() {
    let o = run(&Scenario::incast(
        2,
        Control::Lossy,
        Duration::from_millis(3),
    ));
    assert!(o.drops() > 0);
    assert_eq!(o.pauses(), 0);
    assert!(o.flows.iter().map(|f| f.retries).sum::<u64>() > 0);
}
