//! The XDP program of the link (`hca/xdp/roce_redirect.bpf.c`, built by `hca/build.rs`): loaded
//! with the `aya` crate, attached to the interface through a BPF link (`BPF_LINK_CREATE`, since
//! Linux 5.9), native (driver) mode first and generic (skb) mode when the driver refuses, and the
//! link's AF_XDP socket put in its `ROCE_XSKS` map at the bound queue's index.
//!
//! The attachment is a file descriptor of this process: dropping the `Attached` value (the link
//! closes) detaches the program, and so does the kernel when the process exits for any reason,
//! SIGKILL included, since the BPF link is not pinned. Needs `CAP_NET_ADMIN` and `CAP_BPF` (or
//! `CAP_SYS_ADMIN`), i.e. root, as the AF_XDP socket does (`CAP_NET_RAW`).

use std::os::fd::{AsRawFd, BorrowedFd};

use aya::maps::XskMap;
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;

/// The object file `hca/build.rs` compiled (empty when it had no clang).
static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce_redirect.bpf.o"));

/// The program's name (its function) and the map's, in the object.
const PROGRAM: &str = "roce_redirect";
const MAP: &str = "ROCE_XSKS";

/// How the program was attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`).
    Native,
    /// On the generic skb path (`XDP_FLAGS_SKB_MODE`).
    Generic,
}

/// The program attached to an interface; detached on drop.
pub(crate) struct Attached {
    // Dropping the Ebpf drops the program and its BPF link, which detaches it.
    _ebpf: Ebpf,
    pub(crate) mode: AttachMode,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Whether the build compiled the program (`hca/build.rs` found clang and libbpf-dev).
pub fn program_built() -> bool {
    !OBJECT.is_empty()
}

/// Loads the program, attaches it to interface `ifindex` (`native`: try driver mode first),
/// and maps queue `queue` to the socket `xsk`. The error is a sentence naming the step.
pub(crate) fn attach(
    ifindex: u32,
    queue: u32,
    xsk: BorrowedFd<'_>,
    native: bool,
) -> Result<Attached, String> {
    if !program_built() {
        return Err(
            "the XDP program was not built (hca/build.rs found no clang and libbpf-dev; \
                    tests/setup.sh installs them)"
                .to_string(),
        );
    }
    let mut ebpf = Ebpf::load(OBJECT).map_err(|e| format!("loading the XDP object: {e}"))?;
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| format!("no program {PROGRAM} in the XDP object"))?
        .try_into()
        .map_err(|e| format!("{PROGRAM} is not an XDP program: {e}"))?;
    prog.load()
        .map_err(|e| format!("loading {PROGRAM} into the kernel (needs CAP_BPF): {e}"))?;
    let mut mode = AttachMode::Generic;
    if native && prog.attach_to_if_index(ifindex, XdpFlags::DRV_MODE).is_ok() {
        mode = AttachMode::Native;
    }
    if mode == AttachMode::Generic {
        prog.attach_to_if_index(ifindex, XdpFlags::SKB_MODE)
            .map_err(|e| format!("attaching {PROGRAM} (native and generic mode): {e}"))?;
    }
    let mut map: XskMap<_> = ebpf
        .map_mut(MAP)
        .ok_or_else(|| format!("no map {MAP} in the XDP object"))?
        .try_into()
        .map_err(|e| format!("{MAP} is not an XSKMAP: {e}"))?;
    map.set(queue, xsk.as_raw_fd(), 0)
        .map_err(|e| format!("putting the socket in {MAP}[{queue}]: {e}"))?;
    Ok(Attached { _ebpf: ebpf, mode })
}
