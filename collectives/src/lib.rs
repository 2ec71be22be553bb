//! # `collectives`: NCCL's job over this project's verbs
//!
//! A training job runs one process (a *rank*) per accelerator or per CPU worker. Between steps
//! the ranks combine their gradients (*all-reduce*), share parameters (*broadcast*,
//! *all-gather*), shard state (*reduce-scatter*) or exchange tokens (*all-to-all*). This crate
//! does that for `nranks` ranks, with NCCL's algorithms, names and semantics:
//!
//! * [`Communicator`]: created from a [`UniqueId`] (NCCL's `ncclGetUniqueId` +
//!   `ncclCommInitRank`) or from a launcher's environment (torchrun, Open MPI, Slurm):
//!   [`Communicator::from_env`]. Collectives: `all_reduce`, `broadcast`, `reduce`,
//!   `all_gather`, `reduce_scatter`, `all_to_all`, `scatter`, `gather`, `barrier`, and
//!   point-to-point `send` / `recv` / `send_recv`; each also in place.
//! * [`DataType`] (`i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64`) and [`RedOp`]
//!   (`sum prod min max avg`), with the reduction kernels in [`reduce`].
//! * [`transport`]: the seam between algorithms and wires. Data moves in chunks into a ring of
//!   slots in the receiver's memory, each with a 32-bit immediate (step, chunk) and credit-based
//!   flow control: the shape of RDMA WRITE_WITH_IMM. The shared-memory transport
//!   ([`transport::shm`]) connects ranks on one host; the RoCE transport ([`transport::roce`])
//!   connects any two ranks with RC QPs on the `hca` crate's software RoCE device.
//! * [`bootstrap`] (rendezvous, launcher environments, host identity) and [`topology`] (which
//!   transport per peer pair: shared memory on one host, RoCE between hosts, either forced with
//!   `--transport`).
//! * `perf` (cargo feature `perf`, on by default): the `coll-perf` benchmark (nccl-tests'
//!   interface and output).
//!
//! ## Layers
//! ```text
//! Communicator  --  algorithms (ring, chain, pairwise)  --  SendConnector / RecvConnector
//!                                                          |- shm: slot rings in /dev/shm
//!                                                          |- roce: RDMA WRITE_WITH_IMM into the
//!                                                             peer's registered slots (hca)
//! bootstrap: launcher env -> TCP rendezvous (all-gather of business cards and connection
//!            infos) -> topology -> transport setup -> the rendezvous closes
//! ```
//!
//! ## The RoCE path
//! [`transport::roce::RoceTransport`]: each rank opens one UDP device (one GID: its address), and
//! per peer and channel one RC QP. `setup` registers the receive slot rings (an MR) and returns
//! the QPNs, GID, UDP port, PSNs, rkey and ring addresses as the connection info; `connect` moves
//! the QPs to RTR/RTS with the peer's info; a post is one RDMA WRITE_WITH_IMM of slot header and
//! payload into the peer's slot (immediate = [`transport::Imm`]), the receive completion replaces
//! the tail counter, and credits come back as zero-byte SEND_WITH_IMMs carrying the receiver's
//! `head`. A peer that dies is found by the QP (`IBV_WC_RETRY_EXC_ERR`). The algorithms do not
//! change.
//!
//! ## Example
//! ```
//! use collectives::{CommConfig, Communicator, RedOp, TransportKind, UniqueId};
//!
//! let id = UniqueId::new().unwrap();
//! let config = CommConfig { transport: TransportKind::InProcess, ..CommConfig::default() };
//! let ranks: Vec<_> = (0..2)
//!     .map(|rank| {
//!         std::thread::spawn(move || {
//!             let mut comm = Communicator::init(&id, rank, 2, config).unwrap();
//!             let mut grad = vec![rank as f32 + 1.0; 1000];
//!             comm.all_reduce_typed_in_place(&mut grad, RedOp::Sum).unwrap();
//!             grad[0]
//!         })
//!     })
//!     .collect();
//! for r in ranks {
//!     assert_eq!(r.join().unwrap(), 3.0);
//! }
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod algorithms;
pub mod bootstrap;
mod codec;
mod comm;
mod datatype;
pub mod device;
mod error;
pub mod nonblocking;
#[cfg(feature = "perf")]
pub mod perf;
pub mod reduce;
pub mod topology;
pub mod transport;

pub use bootstrap::UniqueId;
pub use codec::Truncated;
pub use comm::{AbortHandle, CommConfig, Communicator};
pub use datatype::{DataType, Element, RedOp, UnknownName};
pub use error::{CollError, InitError};
pub use nonblocking::{AsyncCommunicator, Work};
pub use transport::TransportKind;
