//! Wireshark's InfiniBand dissector (tshark), an implementation no one here wrote, reads a capture of
//! one packet of every RC/UC/UD opcode and the CNP, over IPv4 and IPv6, built by this project's `roce`
//! crate: every frame must dissect as InfiniBand with the opcode, DestQP and PSN that were put in, and
//! none may be marked malformed.
//!
//! tshark is installed by `tests/setup.sh` (the README's test command runs it). Without tshark this
//! test fails with a message saying so, unless `ROCE_SKIP_TSHARK=1` is set.

use tests::{dissect, every_opcode_frames, tshark, write_pcap};

#[test]
fn tshark_dissects_every_opcode_as_infiniband() {
    let Some(tshark) = tshark() else {
        if std::env::var_os("ROCE_SKIP_TSHARK").is_some() {
            eprintln!("tshark not found; skipped because ROCE_SKIP_TSHARK is set");
            return;
        }
        panic!("tshark not found: run `bash tests/setup.sh` as root (or set ROCE_SKIP_TSHARK=1)");
    };
    let frames = every_opcode_frames();
    assert_eq!(frames.len(), 2 * roce::Opcode::ALL.len());
    let dir = std::env::temp_dir().join(format!("roce-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("every-opcode.pcap");
    write_pcap(&path, frames.iter().map(|f| f.frame.as_slice())).expect("write pcap");
    let seen = dissect(&tshark, &path).expect("run tshark");
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(
        seen.len(),
        frames.len(),
        "tshark read a different number of frames"
    );
    for (f, d) in frames.iter().zip(&seen) {
        let what = format!(
            "{:?} over {}",
            f.opcode,
            if f.ipv6 { "IPv6" } else { "IPv4" }
        );
        assert!(!d.malformed, "{what}: tshark marks it malformed: {d:?}");
        assert!(
            d.protocols.ends_with(":infiniband") || d.protocols.contains(":infiniband:"),
            "{what}: not dissected as InfiniBand: {}",
            d.protocols
        );
        assert_eq!(d.opcode, Some(u8::from(f.opcode)), "{what}: opcode");
        assert_eq!(d.dest_qpn, Some(f.dest_qpn), "{what}: DestQP");
        assert_eq!(d.psn, Some(f.psn), "{what}: PSN");
    }
}

#[test]
fn every_sample_frame_parses_back() {
    // The same frames through this project's own parser (all checks, ICRC included).
    for f in every_opcode_frames() {
        let p = roce::parse_frame(&f.frame).unwrap_or_else(|e| panic!("{:?}: {e}", f.opcode));
        assert_eq!(p.transport.bth.opcode, f.opcode);
        assert_eq!(p.transport.bth.dest_qpn, f.dest_qpn);
        assert_eq!(p.transport.bth.psn, f.psn);
        assert_eq!(p.payload, f.payload.as_slice());
    }
}
