//! The verbs object model: the objects of one device and the rules of the calls on them.
//!
//! This is what libibverbs' `struct ibv_context` and its objects are (IBTA vol. 1 chapters 10 and
//! 11; rdma-core `libibverbs/verbs.h` and the ibv_*(3) man pages), in Rust and without I/O:
//!
//! * [`attr`]: the plain attribute types every other module names (QP types and states, the
//!   modify-QP mask, access rights, WR and WC opcodes, WC statuses); a leaf that imports nothing
//!   of the crate.
//! * [`error`]: [`VerbsError`](error::VerbsError), a refused verb with the errno libibverbs returns for it.
//! * [`device`] and [`gid`]: what the HCA can do, its port, its GID table.
//! * [`pd`], [`mr`], [`cq`], [`wc`], [`wr`], [`srq`], [`ah`], [`event`]: the objects and what is
//!   posted to and polled from them.
//! * [`qp`] (with its receive queue, [`recv_queue`]): the queue pair and its state machine.
//! * [`table`]: handles and the tables that hold the objects; [`context`]: all objects of one
//!   device and the verbs with their cross-object rules.
//! * [`random`]: where MR keys, QPNs and start PSNs get the randomness that keeps off-path
//!   attackers from guessing them (the arithmetic is in [`mr`] and [`qp`]).
//! * [`connect`]: the one RESET -> INIT -> RTR -> RTS bring-up of RC, UC and UD QPs that every
//!   caller uses.
//! * [`api`] (feature `std`): the [`Verbs`] trait every backend implements, and [`DeviceError`](api::DeviceError).
//!
//! Everything here but [`api`] is `no_std` + `alloc`.

pub mod ah;
#[cfg(feature = "std")]
pub mod api;
pub mod attr;
pub mod connect;
pub mod context;
pub mod cq;
pub mod device;
pub mod error;
pub mod event;
pub mod gid;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod random;
pub mod recv_queue;
pub mod srq;
pub mod table;
pub mod wc;
pub mod wr;

#[cfg(feature = "std")]
pub use api::Verbs;
