//! # `roce`: the RoCEv2 wire format
//!
//! RoCEv2 ("RDMA over Converged Ethernet, version 2", IBTA Architecture Specification Release 1.2.1,
//! Annex A17) carries InfiniBand transport packets inside UDP datagrams sent to port 4791:
//!
//! ```text
//! | Ethernet (+802.1Q) | IPv4 or IPv6 | UDP dport 4791 | BTH | ext. headers | payload | pad | ICRC |
//! ```
//!
//! * The **Base Transport Header** (BTH, IBTA vol. 1 §9.2) names the opcode, the destination queue pair
//!   (QPN), the 24-bit packet sequence number (PSN) and the partition key (P_Key).
//! * The opcode decides which **extended transport headers** follow (IBTA vol. 1 §9.3, table 38 "OpCode
//!   field"): RETH (remote address, rkey, DMA length), AETH (ACK/NAK syndrome and MSN), AtomicETH,
//!   AtomicAckETH, ImmDt (immediate data), IETH (key to invalidate) and DETH (Q_Key, source QP, for UD).
//! * The **Invariant CRC** (ICRC, §7.8.1 and Annex A17.3.3) is a CRC-32 over the packet with the fields
//!   that routers may change masked to ones.
//!
//! Every header follows one pattern, modelled on smoltcp:
//! * a zero-copy view `Packet<T: AsRef<[u8]>>` over a byte buffer, with getters for `AsRef` and setters for
//!   `AsMut`, `new_unchecked`, and `new_checked` for untrusted input;
//! * a plain `Repr` struct with `parse`, `buffer_len` and `emit`;
//! * open enums (`Unknown(raw)`) for every field whose values are named, so that no input can panic.
//!
//! Beside the RoCEv2 headers, [`arp`] and [`ndisc`] (IPv6 Neighbor Discovery) give a link that
//! writes its own Ethernet frames the means to learn its peers' MAC addresses.
//!
//! [`mad`] is the management datagram (MAD) that QP1 (the GSI) carries, and [`cm`] the
//! communication-management messages (REQ, REP, RTU, ...) inside it.
//!
//! [`packet`] builds and parses a whole frame in one call. The crate is `#![no_std]`; the `std` feature
//! (default) adds the classic pcap writer in [`pcap`].
#![no_std]
#![deny(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

#[macro_use]
mod macros;
#[cfg(test)]
#[macro_use]
mod header_tests;

mod error;
mod wire_field;

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod ipv4;
pub mod ipv6;
pub mod ndisc;
pub mod udp;

pub mod aeth;
pub mod atomic_eth;
pub mod bth;
pub mod cnp;
pub mod deth;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod reth;

pub mod gid;
pub mod icrc;
pub mod mtu;
pub mod psn;

pub mod cm;
pub mod mad;

pub mod packet;
#[cfg(feature = "std")]
pub mod pcap;

pub use error::{Error, Layer, Result};
pub use gid::Gid;
pub use mtu::PathMtu;
pub use opcode::Opcode;
pub use packet::{
    build_frame, build_ip_packet, build_udp_payload, parse_frame, parse_ip_packet,
    parse_udp_payload, ExtReprs, IpRepr, PacketRepr, ParsedPacket, TransportRepr,
};
pub use psn::Psn;
