//! What the tools (`rdma-perf`, `rdma-pingpong`) need besides verbs (feature `tools`):
//!
//! * [`oob`]: the out-of-band TCP exchanges with which RDMA test tools (rdma-core's
//!   `ibv_*_pingpong`, perftest's `ib_*_bw` / `ib_*_lat`) trade QP numbers, PSNs, GIDs and memory
//!   keys before any RDMA packet flows;
//! * [`fault`]: fault injection from the environment (seeded datagram loss on a UDP link).
//!
//! The binaries themselves (`src/bin/`) hold argument parsing and output.

pub mod fault;
pub mod oob;

pub use oob::OobError;
