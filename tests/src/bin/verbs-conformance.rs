//! `verbs-conformance`: runs the verbs conformance suite (`tests::conformance`) on any device
//! the stack can open and, optionally, compares its records with a reference run.
//!
//! ```text
//! verbs-conformance --link fabric                                 # software HCAs, virtual clock
//! verbs-conformance --link udp:127.0.0.1 --link2 udp:127.0.0.2    # software HCA over UDP
//! verbs-conformance --link verbs:mlx5_0 --compare reference.txt   # your HCA against a reference
//! ip netns exec A verbs-conformance --link xdp:veth0 \
//!     --link2 udp:10.77.0.2:4791 --link2-netns B                  # AF_XDP against UDP across a veth
//! verbs-conformance --link fabric --records-out reference.txt     # write a reference
//! ```
//!
//! Exit status: 0 when every case passed its own checks and (with `--compare`) agreed with the
//! reference, apart from what `tests::conformance::KNOWN_DIFFERENCES` documents for this device
//! (printed as "known deviation" / "allowed difference" lines); 1 otherwise; 2 for a usage error
//! or a device that does not open.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tests::conformance::{self, compare, open_pair_in, read_records, run_suite, write_records};

/// `println!` that ignores a closed stdout (`| head`) instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// Runs the verbs conformance suite on a device and reports each case.
#[derive(Parser, Debug)]
#[command(name = "verbs-conformance", version)]
struct Args {
    /// The device the requester side (a) runs on: `fabric`, `udp:ADDRESS[:PORT]`, `verbs:DEVICE`,
    /// `xdp:IFNAME` (with a `udp:` --link2 on port 4791).
    #[arg(long, default_value = "fabric")]
    link: String,
    /// The device of the responder side (b); default: the same device as --link (its QPs talk to
    /// each other through it). A `udp:` one needs an address other than --link's.
    #[arg(long)]
    link2: Option<String>,
    /// Open --link2's device in this network namespace (`ip netns` name; root): its sockets
    /// and progress thread stay there while --link's stay in this process's namespace.
    #[arg(long)]
    link2_netns: Option<String>,
    /// Run only the cases whose name contains this.
    #[arg(long, default_value = "")]
    case: String,
    /// List the cases with the rule each checks, and exit.
    #[arg(long)]
    list: bool,
    /// Write the records (one line per case) to this file.
    #[arg(long)]
    records_out: Option<PathBuf>,
    /// Compare the records with a reference file written by --records-out.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Print every record, not only those of failed cases.
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cases = conformance::select(&args.case);
    if args.list {
        for c in &cases {
            out!(
                "{:<32} {}",
                c.name,
                c.rule.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
        return ExitCode::SUCCESS;
    }
    if cases.is_empty() {
        eprintln!("verbs-conformance: no case matches \"{}\"", args.case);
        return ExitCode::from(2);
    }
    let reference = match &args.compare {
        None => None,
        Some(path) => match File::open(path).and_then(|f| read_records(BufReader::new(f))) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("verbs-conformance: cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let pair = match open_pair_in(
        &args.link,
        args.link2.as_deref(),
        args.link2_netns.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => {
            // One line; a bad device name already lists the devices.
            let said_what_to_do = matches!(e, conformance::BackendError::SameAddress { .. });
            let e = e.to_string();
            if said_what_to_do || e.contains(conformance::SPEC_HELP) {
                eprintln!("verbs-conformance: {e}");
            } else {
                eprintln!(
                    "verbs-conformance: {e} (devices: {})",
                    conformance::SPEC_HELP
                );
            }
            return ExitCode::from(2);
        }
    };
    out!(
        "# verbs conformance on {} ({} cases)",
        pair.name,
        cases.len()
    );
    let records = run_suite(&pair.devices, &cases);
    let backend = pair.devices.a.name();
    let mut failed = 0;
    for r in &records {
        let unexplained = conformance::unexplained_failures(r, &backend);
        if unexplained.is_empty() {
            out!("PASS {}", r.case);
        } else {
            failed += 1;
            out!("FAIL {}", r.case);
            for f in &unexplained {
                out!("     {f}");
            }
        }
        // Failed checks a documented deviation of this device explains: shown, not counted.
        for f in &r.failures {
            if let Some(k) = conformance::known_failure(&r.case, f, &backend) {
                out!("     known deviation: {f} ({}: {})", k.field, k.reason);
            }
        }
        if args.verbose || !unexplained.is_empty() {
            for (k, v) in &r.fields {
                out!("     {k}={v}");
            }
        }
    }
    if let Some(path) = &args.records_out {
        let written = File::create(path).and_then(|f| write_records(BufWriter::new(f), &records));
        if let Err(e) = written {
            eprintln!("verbs-conformance: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let mut differences = 0;
    if let Some(reference) = reference {
        // Compare only the cases this run selected.
        let reference: Vec<_> = reference
            .into_iter()
            .filter(|r| records.iter().any(|m| m.case == r.case))
            .collect();
        for d in compare(&reference, &records, &pair.devices.a.name()) {
            differences += 1;
            out!("DIFF {d}   (reference | {})", pair.name);
        }
        for k in conformance::KNOWN_DIFFERENCES
            .iter()
            .filter(|k| pair.devices.a.name().starts_with(k.backend))
        {
            out!("# allowed difference: {} {}: {}", k.case, k.field, k.reason);
        }
    }
    out!(
        "# {} passed, {failed} failed, {differences} differences",
        records.len() - failed
    );
    if failed == 0 && differences == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
