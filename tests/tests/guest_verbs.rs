//! The IB verbs backend on a real device: runs `tests/guest/verbs.sh`, which boots a QEMU TCG guest
//! with Linux soft-RoCE (rxe0) and drives it through `hca::ibverbs` (`--link verbs:rxe0`): the verbs
//! conformance suite on rxe0 compared with the software engine's records (`--link fabric`, written on
//! the host), `coll-perf all-reduce` with 2 and 4 ranks (data checked), and `rdma-perf write-bw /
//! read-bw / send-bw` and `rdma-pingpong --rc` against this project's software HCA on the host
//! (`--link udp:`), the guest's side as client and as server. About three minutes.
//!
//! Ignored by default: it needs root, qemu-system-x86 and the guest harness's cache
//! (`tests/guest/setup.sh` installs and builds what is missing).
//!
//! ```sh
//! cargo test -p tests --test guest_verbs -- --ignored --nocapture
//! ```

use std::process::{Command, Stdio};

#[test]
#[ignore = "boots a QEMU guest: root, qemu-system-x86_64, about three minutes"]
fn ibverbs_backend_on_rxe_in_a_qemu_guest() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/guest/verbs.sh");
    // The script bounds every step; this bounds the whole run once more.
    let out = Command::new("timeout")
        .args(["--kill-after=10", "2400", "bash", script])
        // Progress (each row as it finishes) goes to stderr, shown at once; the table to stdout.
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/guest/verbs.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/guest/verbs.sh failed ({}): see the table above",
        out.status
    );
    assert!(stdout.contains("verbs: all"), "no summary line");
}
