//! The wire-format demo (the README's main job until `coll-perf` lands): builds one RoCEv2 packet of
//! every RC/UC/UD opcode and the CNP, over IPv4 and IPv6, parses each back with every check (ICRC
//! included), writes them to a pcap, and, when tshark is installed, shows what Wireshark's dissector
//! reads in each.
//!
//! Usage: `cargo run --release -p tests --bin wire-demo [-- OUTPUT.pcap]` (default
//! `target/roce-demo.pcap`); `--help` / `-h` print the help.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tests::{dissect, every_opcode_frames, tshark, write_pcap};

/// RoCEv2 packets of every RC/UC/UD opcode and the CNP, built, parsed back and written to a pcap.
///
/// Builds one packet of each over IPv4 and IPv6, parses each back with every check (ICRC
/// included), writes them to OUTPUT.pcap and, when tshark is installed, shows what Wireshark's
/// dissector reads in each. Exit status 0 when every frame passed every check, 1 otherwise, 2
/// for a usage error.
#[derive(Parser, Debug)]
#[command(name = "wire-demo", version)]
struct Args {
    /// The pcap file to write (a name that starts with `-` goes after `--`).
    #[arg(value_name = "OUTPUT.pcap", default_value = "target/roce-demo.pcap")]
    output: PathBuf,
}

fn main() -> ExitCode {
    let path = Args::parse().output;
    let frames = every_opcode_frames();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("wire-demo: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = write_pcap(&path, frames.iter().map(|f| f.frame.as_slice())) {
        eprintln!("wire-demo: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    let seen = match tshark() {
        Some(bin) => match dissect(&bin, &path) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("wire-demo: {e}");
                None
            }
        },
        None => None,
    };

    println!(
        "{:<4} {:<34} {:<5} {:>5} {:>8} {:>8} {:>6}  {:<10} tshark",
        "#", "opcode", "ip", "bytes", "DestQP", "PSN", "paylen", "ICRC"
    );
    let mut failures = 0;
    for (i, f) in frames.iter().enumerate() {
        let (icrc, ours_ok) = match roce::parse_frame(&f.frame) {
            Ok(p) => (
                format!("{:#010x}", p.icrc),
                p.transport.bth.opcode == f.opcode && p.payload == f.payload.as_slice(),
            ),
            Err(e) => (format!("{e}"), false),
        };
        let theirs = match seen.as_ref().and_then(|s| s.get(i)) {
            Some(d) if d.malformed => "MALFORMED".to_string(),
            Some(d) if d.opcode == Some(u8::from(f.opcode)) && d.psn == Some(f.psn) => {
                "ok".to_string()
            }
            Some(d) => format!("differs: {d:?}"),
            None => "(tshark not run)".to_string(),
        };
        if !ours_ok || theirs.starts_with("MALFORMED") || theirs.starts_with("differs") {
            failures += 1;
        }
        println!(
            "{:<4} {:<34} {:<5} {:>5} {:>#8x} {:>8} {:>6}  {:<10} {}",
            i + 1,
            format!("{:?} ({:#04x})", f.opcode, u8::from(f.opcode)),
            if f.ipv6 { "IPv6" } else { "IPv4" },
            f.frame.len(),
            f.dest_qpn,
            f.psn,
            f.payload.len(),
            icrc,
            theirs
        );
    }
    println!();
    println!(
        "{} frames written to {}; {} failed a check",
        frames.len(),
        path.display(),
        failures
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
