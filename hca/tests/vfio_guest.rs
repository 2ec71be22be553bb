//! The VFIO driver on a real (emulated) device: runs `tests/guest/vfio.sh`, which boots a QEMU TCG
//! guest (q35, intel-iommu) whose NICs share a hub: two driven by this project's driver through
//! vfio-pci, one by the kernel with Linux soft-RoCE (rxe0). Cells: `rdma-pingpong --rc --link
//! vfio:` against `ibv_rc_pingpong` in both roles (data checked; once with MSI-X and a progress
//! thread) and `rdma-perf write-bw / read-bw / send-bw --link vfio:` against `ib_write_bw /
//! ib_read_bw / ib_send_bw` in both roles (the tools over `SoftDevice<VfioLink>`); `ibv_rc_pingpong`
//! against `vfio_pingpong` in both roles (IPv4 and link-local IPv6 GIDs, MTU 1024 and 4096, data checked;
//! once with MSI-X interrupts), RDMA WRITE and READ between two instances with the data checked, a WRITE
//! to a deregistered region NAKed with its IOMMU mapping gone, the refusal of a NIC not bound to
//! vfio-pci, no IOMMU fault, and tshark over a capture of the hub. About two minutes.
//!
//! Ignored by default: it needs root, qemu-system-x86 and the guest harness's cache
//! (`tests/guest/setup.sh` installs and builds what is missing).
//!
//! ```sh
//! cargo test -p hca --test vfio_guest -- --ignored --nocapture
//! ```

use std::process::{Command, Stdio};

#[test]
#[ignore = "boots a QEMU guest: root, qemu-system-x86_64, about two minutes"]
fn vfio_driver_against_linux_rxe_in_a_qemu_guest() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/guest/vfio.sh");
    // The script bounds every step; this bounds the whole run once more.
    let out = Command::new("timeout")
        .args(["--kill-after=10", "1800", "bash", script])
        // Progress (each row as it finishes) goes to stderr, shown at once; the table to stdout.
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/guest/vfio.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/guest/vfio.sh failed ({}): see the table above",
        out.status
    );
    assert!(stdout.contains("vfio: all"), "no summary line");
}
