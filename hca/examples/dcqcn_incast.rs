//! The DCQCN experiments on the in-memory switched fabric (issue 22): N:1 incast for PFC only,
//! lossy (go-back-N) and DCQCN + PFC, and the victim flow. Prints tables; with `--csv DIR`
//! writes per-interval series (`incast-N-CONTROL.csv`: time, each flow's Gb/s, queue bytes).
//!
//! `cargo run --release -p hca --example dcqcn_incast -- [--ms 20] [--senders 2,8,16]
//! [--victim] [--csv DIR]`

use std::io::Write;
use std::time::Duration;

use hca::fabric::incast::{run, Control, Outcome, Scenario};

fn main() {
    let mut ms = 20u64;
    let mut senders = vec![2usize, 8, 16];
    let mut csv: Option<std::path::PathBuf> = None;
    let mut victim = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ms" => ms = args.next().and_then(|v| v.parse().ok()).expect("--ms N"),
            "--senders" => {
                senders = args
                    .next()
                    .expect("--senders LIST")
                    .split(',')
                    .map(|v| v.parse().expect("a number"))
                    .collect()
            }
            "--csv" => csv = args.next().map(Into::into),
            "--victim" => victim = true,
            _ => {
                eprintln!("usage: dcqcn_incast [--ms N] [--senders 2,8,16] [--victim] [--csv DIR]");
                std::process::exit(2);
            }
        }
    }
    let duration = Duration::from_millis(ms);
    println!(
        "{:>3} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>8} {:>6} {:>8}",
        "N",
        "control",
        "tot Gb/s",
        "min Gb/s",
        "max Gb/s",
        "Jain",
        "q avg KB",
        "q max KB",
        "pauses",
        "drops",
        "retries",
        "failed",
        if victim { "victim" } else { "ecn" }
    );
    for &n in &senders {
        for control in [Control::Pfc, Control::Lossy, Control::DcqcnPfc] {
            let mut s = Scenario::incast(n, control, duration);
            s.victim = victim;
            let o = run(&s);
            report(&o, victim);
            if let Some(dir) = &csv {
                write_csv(&o, dir).expect("writing the CSV");
            }
        }
    }
}

fn report(o: &Outcome, victim: bool) {
    let s = &o.scenario;
    let k = o.intervals();
    // The second half: after convergence.
    let range = k / 2..k;
    let rates: Vec<f64> = (0..s.senders).map(|f| o.gbps(f, range.clone())).collect();
    let tot: f64 = rates.iter().sum();
    let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = rates.iter().cloned().fold(0.0, f64::max);
    let q = &o.queue[range.clone()];
    let qavg = q.iter().sum::<u64>() as f64 / q.len().max(1) as f64 / 1000.0;
    let qmax = o.queue.iter().max().copied().unwrap_or(0) as f64 / 1000.0;
    let retries: u64 = o.flows.iter().map(|f| f.retries).sum();
    let last = if victim {
        format!("{:.2}", o.gbps(s.senders, range.clone()))
    } else {
        format!("{}", o.receiver_port.ecn_marked)
    };
    println!(
        "{:>3} {:>10} {:>8.2} {:>8.2} {:>8.2} {:>8.3} {:>9.1} {:>9.1} {:>7} {:>7} {:>8} {:>6} {:>8}",
        s.senders,
        s.control.name(),
        tot,
        min,
        max,
        o.jain(range),
        qavg,
        qmax,
        o.pauses(),
        o.drops(),
        retries,
        o.flows.iter().map(|f| f.failed).sum::<u64>(),
        last
    );
}

fn write_csv(o: &Outcome, dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let s = &o.scenario;
    let name = format!(
        "{}-{}-{}.csv",
        if s.victim { "victim" } else { "incast" },
        s.senders,
        s.control.name().replace('+', "_")
    );
    let mut f = std::fs::File::create(dir.join(name))?;
    let mut head = String::from("time_us");
    for i in 0..o.flows.len() {
        head.push_str(&format!(",flow{i}_gbps"));
    }
    head.push_str(",queue_bytes");
    writeln!(f, "{head}")?;
    let us = o.interval.as_micros() as u64;
    for i in 0..o.intervals() {
        let mut line = format!("{}", i as u64 * us);
        for fl in 0..o.flows.len() {
            line.push_str(&format!(",{:.3}", o.gbps(fl, i..i + 1)));
        }
        line.push_str(&format!(",{}", o.queue[i]));
        writeln!(f, "{line}")?;
    }
    Ok(())
}
