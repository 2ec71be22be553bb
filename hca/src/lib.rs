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
//! ## The objects, in the order a program meets them ([`verbs`])
//!
//! * The **device** ([`verbs::device`]): what the HCA can do (`ibv_query_device`) and the state
//!   of its port (`ibv_query_port`), with the port's **GID table** ([`verbs::gid`]): its
//!   addresses.
//! * A **protection domain** ([`verbs::pd`]): a namespace; objects may only be used with objects
//!   of the same PD.
//! * A **memory region** ([`verbs::mr`]): memory registered for the HCA, with access rights and
//!   two keys: the **lkey** for local use in scatter/gather entries, the **rkey** for peers.
//! * A **completion queue** ([`verbs::cq`]): where finished work is reported as **work
//!   completions** ([`verbs::wc`]).
//! * A **queue pair** ([`verbs::qp`]): an endpoint, RC (reliable connected), UC (unreliable
//!   connected) or UD (unreliable datagram), brought up through the states RESET, INIT, RTR, RTS
//!   by `ibv_modify_qp` (the one bring-up every caller uses: [`verbs::connect`]). Its receive
//!   queue ([`verbs::recv_queue`]) holds posted buffers; a **shared receive queue**
//!   ([`verbs::srq`]) can serve many QPs.
//! * **Work requests** ([`verbs::wr`]): what `ibv_post_send` / `ibv_post_recv` take: SEND, RDMA
//!   WRITE, RDMA READ, atomics, with their scatter/gather lists.
//! * An **address handle** ([`verbs::ah`]): where a UD datagram goes.
//! * **Asynchronous events** ([`verbs::event`]): CQ overruns, fatal QP errors, drained send
//!   queues.
//!
//! [`Context`] ([`verbs::context`]) owns all objects of one device, like `struct ibv_context`,
//! and implements the verbs with their cross-object rules. Every verb checks its arguments the
//! way libibverbs over Linux rxe does and fails with a [`VerbsError`] carrying the same errno; a
//! rejected call changes nothing.
//!
//! ## The rooms of the crate
//!
//! * [`verbs`]: the object model above (`no_std` + `alloc`), with the [`verbs::Verbs`] trait every
//!   backend implements (feature `std`) and [`verbs::api::DeviceError`], the error they return.
//! * [`engine`]: the sans-I/O RC / UC / UD transport engine, [`SoftHca`], split as Linux rxe is
//!   (receive validation, requester, responder, completer), over memory regions backed by
//!   [`gpu_p2p::Memory`]. It owns no socket, thread or clock; links feed it datagrams and time
//!   and send what it builds.
//! * [`link`] (feature `std`): what carries the engine's packets: a kernel UDP socket
//!   ([`link::udp`]) or a virtio-net NIC driven through VFIO ([`link::vfio`]). Links know
//!   nothing of devices.
//! * [`soft`] (feature `std`): the software device, the engine over any link with a progress
//!   thread (or caller-driven progress) behind a thread-safe verbs API: soft-RoCE in user space,
//!   interoperable with Linux rxe.
//! * [`fabric`] (feature `fabric`, on by default): engines linked by an in-memory fabric with a
//!   virtual clock and seeded loss, duplication, reordering, delay, corruption and ECN marks,
//!   and a software device on it.
//! * [`ibverbs`] (feature `std`): the IB verbs path, [`verbs::Verbs`] over rdma-core's
//!   libibverbs (loaded at run time) for real InfiniBand / RoCE HCAs and the kernel's rxe.
//! * [`open`]: the one way to open any of those devices from its name (`udp:`, `vfio:`,
//!   `verbs:`, `fabric`).
//! * [`tools`] (feature `tools`, on by default): what the binaries `rdma-perf` (perftest's
//!   `ib_*_bw` / `ib_*_lat`) and `rdma-pingpong` (rdma-core's `ibv_rc/uc/ud_pingpong`) share:
//!   their out-of-band exchanges, fault injection, command-line pieces.
//!
//! The object model, the engine and the fabric are `no_std` + `alloc` without the default `std`
//! feature.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(missing_docs)]
#![deny(unsafe_code)]

extern crate alloc;
#[cfg(all(test, not(feature = "std")))]
extern crate std;

#[cfg(feature = "std")]
pub mod cm;
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
pub mod rdma_cm;
#[cfg(feature = "std")]
pub mod soft;
#[cfg(feature = "tools")]
pub mod tools;
pub mod verbs;

pub use engine::{
    Counters, Datagram, DcqcnParams, DiagRecord, DropReason, EngineConfig, Instant, RateControl,
    ReactionPoint, SoftHca, Transmit,
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
