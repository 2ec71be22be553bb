//! The reference run against real Linux soft-RoCE: two QEMU TCG guests with `rdma_rxe` on one bridge run
//! rdma-core's and perftest's tools against each other (`tests/guest/reference.sh`), and every RoCEv2
//! frame that rxe put on the wire must pass this project's ICRC check (`roce::icrc::verify`), an
//! implementation no one here wrote checking ours.
//!
//! Both tests are `#[ignore]`d: they need root, Debian's packages, a kernel package download and about
//! two minutes of emulation. Run them with
//! `cargo test -p tests --test guest_reference -- --ignored --test-threads 1`.
//! `reference_run_passes_and_rxe_icrcs_verify` runs the whole harness; `rxe_capture_icrcs_verify` only
//! checks a capture already taken (`$ROCE_REF_PCAP`, else the cache's `reference-latest.pcap`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (this crate lives in `<root>/tests`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The harness's cache folder: `$ROCE_GUEST_CACHE`, else `<root>/.cache/guest` (as `tests/guest/lib.sh`).
fn cache_dir() -> PathBuf {
    std::env::var_os("ROCE_GUEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/guest"))
}

/// The frames of a classic pcap file (libpcap format, either byte order, Ethernet link type).
fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut r = roce::pcap::PcapReader::new(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{}: not a classic Ethernet pcap: {e}", path.display()));
    let mut frames = Vec::new();
    while let Some((_, frame)) = r
        .next_packet()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        frames.push(frame);
    }
    frames
}

/// The IP packet (IP header through ICRC) of a RoCEv2 frame, with whether it is IPv6; `None` for any
/// other frame. Trailing Ethernet padding is cut by the IP length.
fn roce_ip_packet(frame: &[u8]) -> Option<(&[u8], bool)> {
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let ip = frame.get(14..)?;
    let (len, proto, ihl, v6) = match ethertype {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let len = usize::from(u16::from_be_bytes(ip.get(2..4)?.try_into().ok()?));
            (len, *ip.get(9)?, ihl, false)
        }
        0x86dd => {
            let len = 40 + usize::from(u16::from_be_bytes(ip.get(4..6)?.try_into().ok()?));
            (len, *ip.get(6)?, 40, true)
        }
        _ => return None,
    };
    let dport = u16::from_be_bytes(ip.get(ihl + 2..ihl + 4)?.try_into().ok()?);
    (proto == 17 && dport == 4791).then_some((ip.get(..len)?, v6))
}

/// Checks every RoCEv2 frame of `pcap` with `roce::icrc::verify`; returns (IPv4, IPv6) counts.
fn verify_capture(pcap: &Path) -> (usize, usize) {
    let frames = read_pcap(pcap);
    let (mut v4, mut v6) = (0, 0);
    let mut bad = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        let Some((ip, is_v6)) = roce_ip_packet(frame) else {
            continue;
        };
        if is_v6 {
            v6 += 1;
        } else {
            v4 += 1;
        }
        if let Err(e) = roce::icrc::verify(ip) {
            // tshark numbers frames from 1.
            bad.push(format!("frame {}: {e}", i + 1));
        }
    }
    assert!(
        bad.is_empty(),
        "{}: {} of {} RoCEv2 frames sent by rxe fail roce::icrc::verify, first: {:?}",
        pcap.display(),
        bad.len(),
        v4 + v6,
        &bad[..bad.len().min(5)]
    );
    (v4, v6)
}

#[test]
#[ignore = "needs root, Debian packages and ~2 minutes of QEMU: run with --ignored"]
fn reference_run_passes_and_rxe_icrcs_verify() {
    let script = repo_root().join("tests/guest/reference.sh");
    let status = Command::new("bash")
        .arg(&script)
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(status.success(), "{} failed: {status}", script.display());
    let (v4, v6) = verify_capture(&cache_dir().join("reference-latest.pcap"));
    eprintln!("ICRC verified on {v4} IPv4 and {v6} IPv6 RoCEv2 frames sent by rxe");
    assert!(v4 > 0, "no IPv4 RoCEv2 frame in the capture");
    assert!(v6 > 0, "no IPv6 RoCEv2 frame in the capture");
}

#[test]
#[ignore = "needs a capture of a reference run (tests/guest/reference.sh): run with --ignored"]
fn rxe_capture_icrcs_verify() {
    let pcap = std::env::var_os("ROCE_REF_PCAP")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("reference-latest.pcap"));
    assert!(
        pcap.exists(),
        "{} missing: run `bash tests/guest/reference.sh` first (or set ROCE_REF_PCAP)",
        pcap.display()
    );
    let (v4, v6) = verify_capture(&pcap);
    eprintln!("ICRC verified on {v4} IPv4 and {v6} IPv6 RoCEv2 frames sent by rxe");
    assert!(v4 + v6 > 0, "no RoCEv2 frame in {}", pcap.display());
}
