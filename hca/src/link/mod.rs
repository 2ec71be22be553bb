//! Links: what carries the software HCA's packets between its transport engine and the network.
//!
//! The transport engine (`crate::engine`) is sans-I/O: it consumes received UDP payloads with their
//! IP metadata and produces UDP payloads to send. A **link** moves those payloads:
//! * [`udp`]: a kernel UDP socket on port 4791 (RoCEv2 over the host's IP stack, interoperable
//!   with Linux rxe), with batched I/O, GSO/GRO, ECN and zero-copy gather;
//! * [`oob`]: not a packet link but the out-of-band TCP exchanges with which RDMA test tools
//!   (rdma-core's `ibv_*_pingpong`, perftest's `ib_*_bw` / `ib_*_lat`) trade QP numbers, PSNs,
//!   GIDs and memory keys before any RDMA packet flows;
//! * [`wake`]: waking a progress thread blocked in [`udp::UdpLink::wait`].
//!
//! All system calls are in one private `sys` module, the only place with `unsafe` code.

mod cmsg;
pub mod error;
pub mod oob;
mod sys;
pub mod udp;
#[cfg(all(feature = "std", target_os = "linux"))]
pub mod vfio;
pub mod wake;

pub use error::LinkError;
pub use oob::OobError;
pub use udp::{
    LinkCounters, LinkPoller, Offloads, Readiness, RecvBatch, RecvDatagram, SendDatagram, UdpLink,
    UdpLinkConfig,
};
pub use wake::Waker;
