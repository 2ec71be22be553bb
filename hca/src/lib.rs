//! # `hca`: the verbs API and the software HCA
//!
//! RDMA ("remote direct memory access") lets a program read and write another machine's memory,
//! and send it messages, without either kernel copying the data: the network adapter, the **HCA**
//! (host channel adapter), moves the bytes between registered memory and the wire itself. The
//! programming interface is **verbs**, defined abstractly by the InfiniBand Architecture
//! Specification (IBTA vol. 1, chapters 10 and 11) and concretely by rdma-core's libibverbs
//! (`ibv_*`). This crate offers the verbs object model in Rust and a software HCA, [`SoftHca`],
//! that speaks RoCEv2 (RDMA over UDP/IP, crate `roce`) through it.
//!
//! ## The objects, in the order a program meets them
//!
//! * The **device** ([`device`]): what the HCA can do (`ibv_query_device`) and the state of its
//!   port (`ibv_query_port`), with the port's **GID table** ([`gid`]): its addresses.
//! * A **protection domain** ([`pd`]): a namespace; objects may only be used with objects of the
//!   same PD.
//! * A **memory region** ([`mr`]): memory registered for the HCA, with access rights and two
//!   keys: the **lkey** for local use in scatter/gather entries, the **rkey** for peers.
//! * A **completion queue** ([`cq`]): where finished work is reported as **work completions**
//!   ([`wc`]).
//! * A **queue pair** ([`qp`]): an endpoint, RC (reliable connected), UC (unreliable connected)
//!   or UD (unreliable datagram), brought up through the states RESET, INIT, RTR, RTS by
//!   `ibv_modify_qp`. Its receive queue ([`recv_queue`]) holds posted buffers; a **shared receive
//!   queue** ([`srq`]) can serve many QPs.
//! * **Work requests** ([`wr`]): what `ibv_post_send` / `ibv_post_recv` take: SEND, RDMA WRITE,
//!   RDMA READ, atomics, with their scatter/gather lists.
//! * An **address handle** ([`ah`]): where a UD datagram goes.
//! * **Asynchronous events** ([`event`]): CQ overruns, fatal QP errors, drained send queues.
//!
//! [`Context`] ([`context`]) owns all objects of one device, like `struct ibv_context`, and
//! implements the verbs with their cross-object rules. Every verb checks its arguments the way
//! libibverbs over Linux rxe does and fails with a [`VerbsError`] carrying the same errno; a
//! rejected call changes nothing.
//!
//! ## What is here and what is not
//!
//! * The object model: objects, attributes, the QP state machine, key checks, validation of work
//!   requests, queues of receive WQEs and completions.
//! * The transport engine ([`engine`], [`SoftHca`]): a sans-I/O RC / UC / UD engine in the shape
//!   of Linux rxe (receive validation, requester, responder, completer), over memory regions
//!   backed by [`gpu_p2p::Memory`]. It owns no socket, thread or clock; links feed it datagrams
//!   and time and send what it builds.
//! * The in-memory test fabric ([`fabric`], feature `fabric`, on by default): engines linked by a
//!   virtual clock with seeded loss, duplication, reordering, delay, corruption and ECN marks.
//! * Links ([`link`], feature `std`): the kernel UDP socket and the tools' out-of-band exchanges.
//! * The UDP device ([`soft`], feature `std`): the engine on a UDP socket with a progress
//!   thread behind a thread-safe verbs API: soft-RoCE in user space, interoperable with Linux rxe.
//!   The binaries `rdma-perf` (perftest's `ib_*_bw` / `ib_*_lat`) and `rdma-pingpong` (rdma-core's
//!   `ibv_rc/uc/ud_pingpong`) run on it (feature `tools`, on by default).
//!
//! * [`verbs::Verbs`] (feature `std`): the one device API every backend implements, so programs
//!   and the conformance suite run unchanged on any of them: [`soft::UdpDevice`], and
//!   [`fabric::device::FabricDevice`] (software HCAs on the in-memory fabric, virtual clock).
//! * [`ibverbs`] (feature `std`): the IB verbs path, [`verbs::Verbs`] over rdma-core's libibverbs
//!   (loaded at run time) for real InfiniBand / RoCE HCAs and the kernel's rxe.
//!
//! The object model, the engine and the fabric are `no_std` + `alloc` without the default `std`
//! feature.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(missing_docs)]
#![deny(unsafe_code)]

extern crate alloc;
#[cfg(all(test, not(feature = "std")))]
extern crate std;

pub mod engine;
#[cfg(feature = "fabric")]
pub mod fabric;
#[cfg(feature = "std")]
pub mod ibverbs;
#[cfg(feature = "std")]
pub mod link;
#[cfg(all(feature = "std", target_os = "linux"))]
pub mod open;
#[cfg(feature = "std")]
pub mod soft;
#[cfg(feature = "tools")]
pub mod tools;
pub mod verbs;

pub use engine::{
    Counters, Datagram, DiagRecord, DropReason, EngineConfig, Instant, RateControl, SoftHca,
    Transmit,
};
pub use verbs::ah::{AddressHandle, AhAttr, AhHandle};
pub use verbs::context::Context;
pub use verbs::cq::{CompletionQueue, CqHandle};
pub use verbs::device::{AtomicCap, Device, DeviceAttr, PathMtu, PortAttr, PortState};
pub use verbs::error::{errno, Cause, KeyError, KeyErrorKind, VerbsError};
pub use verbs::event::{AsyncEvent, AsyncEventType, EventElement};
pub use verbs::gid::{Gid, GidEntry, GidTable, GidType};
pub use verbs::mr::{AccessFlags, MemoryRegion, MrTable};
pub use verbs::pd::{Pd, PdHandle};
pub use verbs::qp::{ModifyOutcome, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType};
pub use verbs::recv_queue::{RecvQueue, RecvWqe};
pub use verbs::srq::{Srq, SrqAttr, SrqAttrMask, SrqHandle};
pub use verbs::table::Handle;
pub use verbs::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use verbs::wr::{RecvWr, SendFlags, SendOp, SendWr, SendWrInfo, Sge, UdDest, WrOpcode};
