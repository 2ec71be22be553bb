//! What the tools (`rdma-perf`, `rdma-pingpong`) need besides verbs (feature `tools`):
//!
//! * [`oob`]: the out-of-band TCP exchanges with which RDMA test tools (rdma-core's
//!   `ibv_*_pingpong`, perftest's `ib_*_bw` / `ib_*_lat`) trade QP numbers, PSNs, GIDs and memory
//!   keys before any RDMA packet flows;
//! * [`cm`]: perftest's `-R` connection, an RC QP connected by RDMA CM that carries the tools'
//!   messages instead of TCP;
//! * [`fault`]: fault injection from the environment (seeded datagram loss on a UDP link);
//! * [`cli`]: what both tools' command lines share: choosing and opening the device, the QP
//!   bring-up the C tools do, the out-of-band connection with its notes, `printf` formats.
//!
//! The binaries themselves (`src/bin/`) hold argument parsing and output.

pub mod cli;
#[cfg(target_os = "linux")]
pub mod cm;
pub mod fault;
pub mod oob;

pub use oob::OobError;
