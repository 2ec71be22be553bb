//! [`Verbs`]: one device API over every backend.
//!
//! A program (the tools, the collectives, the conformance suite) opens a device and then speaks
//! verbs to it, whatever moves the packets: the software HCA over a kernel UDP socket
//! ([`crate::soft::UdpDevice`]), the software HCA over NIC queues mapped through VFIO, or a
//! real HCA through rdma-core's libibverbs. This trait is that API: the calls of libibverbs'
//! `struct ibv_context` and its objects (ibv_alloc_pd(3), ibv_reg_mr(3), ibv_create_cq(3),
//! ibv_create_qp(3), ibv_modify_qp(3), ibv_post_send(3), ibv_poll_cq(3), ...), with the same
//! meaning, the same argument checks and the same errno values, so that a program written against
//! it runs unchanged on any backend, and a behaviour that differs between backends is a bug one of
//! them has (the conformance suite under `tests/` checks exactly that).
//!
//! Objects are named by handles ([`PdHandle`], [`CqHandle`], [`SrqHandle`], [`AhHandle`]) and QPs
//! by their QP number, as in the kernel's verbs ABI; a handle is only meaningful to the device that
//! made it. Every method is callable from any thread (`&self`); implementations serialise what
//! they must.
//!
//! Memory is registered as a [`gpu_p2p::Memory`] (host pages, hugepages, device memory): the
//! software backends read and write it through that trait; a hardware backend needs memory it can
//! pin and hand to the HCA (host memory with an address, or a dma-buf) and refuses other kinds
//! with `EINVAL`.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use std::io;
use std::time::Duration;

use gpu_p2p::Memory;

use crate::engine::{Instant, SoftHca};
use crate::link::error::LinkError;
#[cfg(target_os = "linux")]
use crate::link::{any::AnyLinkError, vfio::VfioError, xdp::XdpError};
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PortAttr};
use crate::verbs::error::VerbsError;
use crate::verbs::event::AsyncEvent;
use crate::verbs::gid::{Gid, GidEntry};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr};
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::wc::WorkCompletion;
use crate::verbs::wr::{RecvWr, SendWr};

/// The verbs of one opened device (libibverbs' `struct ibv_context` and the calls on it).
///
/// Errors: every method that can fail returns a [`DeviceError`]; a refused verb is
/// [`DeviceError::Verbs`] carrying the errno libibverbs would return for it
/// ([`DeviceError::errno`]); a call on a closed device is [`DeviceError::Closed`] (or the
/// backend's equivalent). A refused call changes nothing.
pub trait Verbs: Send + Sync + fmt::Debug {
    /// The device's name as a user would select it (`udp:127.0.0.1`, `vfio:0000:00:03.0`,
    /// `verbs:rxe0`).
    fn name(&self) -> String;

    /// ibv_query_device(3).
    fn query_device(&self) -> DeviceAttr;

    /// ibv_query_port(3) for the device's one port (port 1).
    fn query_port(&self) -> PortAttr;

    /// ibv_query_gid(3) / ibv_query_gid_ex(3) of port 1: the GID and its type (RoCE v1 / v2).
    ///
    /// # Errors
    /// `EINVAL` ([`DeviceError::Verbs`]) for an index outside the table or an empty entry.
    fn query_gid(&self, index: u32) -> Result<GidEntry, DeviceError>;

    /// The GID index a RoCEv2 program should use by default (perftest's and the pingpong
    /// examples' `-x` / `-g`), and its GID.
    fn default_gid(&self) -> (u32, Gid);

    /// Drives one progress round of a device whose program drives progress (the software HCA
    /// opened with caller-driven progress: receive, fire due timers, send) and returns the
    /// datagrams it received. Devices that progress by themselves (a hardware HCA, the software
    /// HCA with its progress thread) do nothing and return 0 (the default).
    fn progress(&self) -> usize {
        0
    }

    /// Sends at once what the device holds back to coalesce with a later packet: the ACKs (and
    /// READ responses) that a software HCA's polling rounds hold for the program's reply
    /// (`hca::soft::ACK_HOLD`; IBTA vol. 1 9.7.5.1.2). For a program about to exit without
    /// destroying its QPs (the drop-in libibverbs calls it at exit(3)). Devices that hold
    /// nothing do nothing (the default).
    fn flush_held(&self) {}

    /// Runs `f`, a blocking call (an out-of-band exchange, a sleep), while the device keeps
    /// making progress: a caller-driven software HCA runs a helper thread for the duration;
    /// other devices just run `f` (the default). Generic callers use
    /// `progress_during` (on `dyn Verbs`).
    fn progress_while(&self, f: &mut dyn FnMut()) {
        f()
    }

    /// The UDP port the device's RoCEv2 packets arrive at and leave from, when it is not fixed:
    /// a software HCA on a kernel socket may be bound to another port than RoCEv2's 4791 (IBTA
    /// vol. 1 Annex A17.2.2) so that several devices share one address (tests, several ranks on
    /// one host address). `None` (the default): the device uses 4791, as every RoCE HCA does.
    fn udp_port(&self) -> Option<u16> {
        None
    }

    /// `len` bytes of host memory the device sends from without a copy, for an MR: a software
    /// HCA on an AF_XDP link hands out memory inside its UMEM
    /// ([`XdpLink::alloc_mr_memory`](crate::link::xdp::XdpLink::alloc_mr_memory)). `None` (the
    /// default) when the device has no such memory (any page-aligned host memory will do);
    /// `Some(Err)` when it has but not that much left (the caller may fall back to host memory).
    fn alloc_memory(&self, len: usize) -> Option<Result<Arc<dyn Memory>, DeviceError>> {
        let _ = len;
        None
    }

    /// Sends the RoCEv2 packets for peer address `ip` to UDP port `port` instead of 4791 (the
    /// peer is a software HCA bound to that port, [`Verbs::udp_port`]).
    ///
    /// # Errors
    /// `EOPNOTSUPP` ([`DeviceError::Verbs`]) on a device that always sends to 4791 (the default:
    /// a hardware HCA, a software HCA on a VFIO NIC).
    fn set_peer_port(&self, ip: std::net::IpAddr, port: u16) -> Result<(), DeviceError> {
        let _ = (ip, port);
        Err(DeviceError::Unsupported {
            device: self.name(),
            what: "a peer UDP port other than 4791",
        })
    }

    /// The device's own counters for diagnostics (the tools' `--stats`), as `(name, value)`
    /// lines; `None` for a device that keeps its counters elsewhere (a hardware HCA: sysfs,
    /// `/sys/class/infiniband/DEVICE/ports/1/counters`), the default.
    fn stats(&self) -> Option<Vec<(&'static str, String)>> {
        None
    }

    /// The oldest unread completion event of a CQ armed with [`Verbs::req_notify_cq`] (what
    /// ibv_get_cq_event(3) returns), without blocking. `None` (the default) on a device that keeps
    /// its completion events elsewhere (libibverbs' own completion channels).
    fn poll_cq_event(&self) -> Option<CqHandle> {
        None
    }

    /// Installs `hook`, which the device calls (from its progress thread or a verb's thread, never
    /// with a lock of its own held) whenever a completion event ([`Verbs::poll_cq_event`]) or an
    /// asynchronous event ([`Verbs::poll_event`]) may have been queued, so that a caller can wake
    /// whoever sleeps on them (a completion channel's file descriptor). It may be called when
    /// nothing new is queued. Only one hook can be installed.
    ///
    /// # Errors
    /// `EOPNOTSUPP` ([`DeviceError::Unsupported`]) on a device without one (the default), or when
    /// a hook is already installed.
    fn set_event_hook(&self, hook: EventHook) -> Result<(), DeviceError> {
        let _ = hook;
        Err(DeviceError::Unsupported {
            device: self.name(),
            what: "an event hook",
        })
    }

    /// QP1 (the GSI) of a software device, for a communication manager that runs in this process
    /// ([`crate::rdma_cm::CmService`]); `None` (the default) on a device whose QP1 belongs to
    /// someone else (a hardware HCA or the kernel's rxe through libibverbs: their CM is the
    /// kernel's `ib_cm`).
    fn gsi(&self) -> Option<&dyn GsiPort> {
        None
    }

    /// ibv_alloc_pd(3).
    ///
    /// # Errors
    /// As the backend's verb; `ENOMEM` when out of PDs.
    fn alloc_pd(&self) -> Result<PdHandle, DeviceError>;

    /// ibv_dealloc_pd(3).
    ///
    /// # Errors
    /// `EBUSY` while objects still use the PD; `EINVAL` for an unknown handle.
    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), DeviceError>;

    /// ibv_reg_mr_iova(3) over `length` bytes of `memory` from byte `offset`: they become the MR
    /// `iova .. iova + length` (bytes).
    ///
    /// # Errors
    /// `EINVAL` for a range outside `memory`, bad access flags (remote write / atomic without
    /// local write, IBTA C10-86), or memory kind the backend cannot register.
    fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        offset: usize,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError>;

    /// ibv_dereg_mr(3) by the MR's lkey. A peer's later access with its rkey fails with a
    /// remote access error (IBTA 10.6.3.6: a deregistered key is invalid).
    ///
    /// # Errors
    /// `EINVAL` for an unknown lkey.
    fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError>;

    /// ibv_create_cq(3): a CQ of at least `cqe` entries.
    ///
    /// # Errors
    /// `EINVAL` for 0 or more than `max_cqe`.
    fn create_cq(&self, cqe: u32) -> Result<CqHandle, DeviceError>;

    /// ibv_destroy_cq(3).
    ///
    /// # Errors
    /// `EBUSY` while a QP or SRQ uses it.
    fn destroy_cq(&self, cq: CqHandle) -> Result<(), DeviceError>;

    /// ibv_poll_cq(3): moves up to `out.len()` completions into `out`, oldest first; returns
    /// how many. Never blocks.
    ///
    /// # Errors
    /// `EINVAL` for an unknown CQ.
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError>;

    /// Polls `cq` until `n` completions have arrived or `timeout` has passed; returns what
    /// arrived (fewer than `n` on timeout). Bounded by `timeout` whatever the peer does.
    ///
    /// # Errors
    /// As [`Verbs::poll_cq`].
    fn wait_cq(
        &self,
        cq: CqHandle,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, DeviceError>;

    /// ibv_req_notify_cq(3).
    ///
    /// # Errors
    /// `EINVAL` for an unknown CQ.
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), DeviceError>;

    /// ibv_create_srq(3).
    ///
    /// # Errors
    /// `EINVAL` for attributes beyond the device's limits.
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, DeviceError>;

    /// ibv_modify_srq(3).
    ///
    /// # Errors
    /// `EINVAL` for a bad mask or limit.
    fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), DeviceError>;

    /// ibv_destroy_srq(3).
    ///
    /// # Errors
    /// `EBUSY` while a QP uses it.
    fn destroy_srq(&self, srq: SrqHandle) -> Result<(), DeviceError>;

    /// ibv_post_srq_recv(3) of one WR.
    ///
    /// # Errors
    /// `ENOMEM` when the SRQ is full; `EINVAL` for a bad SGE.
    fn post_srq_recv(&self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), DeviceError>;

    /// ibv_create_ah(3).
    ///
    /// # Errors
    /// `EINVAL` for a GID index outside the table or a bad destination GID.
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, DeviceError>;

    /// ibv_destroy_ah(3).
    ///
    /// # Errors
    /// `EINVAL` for an unknown AH.
    fn destroy_ah(&self, ah: AhHandle) -> Result<(), DeviceError>;

    /// ibv_create_qp(3); returns the QP number.
    ///
    /// # Errors
    /// `EINVAL` for capabilities beyond the device's limits or objects of another PD.
    fn create_qp(&self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, DeviceError>;

    /// ibv_query_qp(3).
    ///
    /// # Errors
    /// `EINVAL` for an unknown QP.
    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), DeviceError>;

    /// ibv_modify_qp(3) (transitions per IBTA 10.3.1 / table 91 of the kernel's
    /// `ib_modify_qp_is_ok`).
    ///
    /// # Errors
    /// `EINVAL` for a transition or mask the state table refuses.
    fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, DeviceError>;

    /// ibv_destroy_qp(3).
    ///
    /// # Errors
    /// `EINVAL` for an unknown QP.
    fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError>;

    /// ibv_post_send(3) of one WR.
    ///
    /// # Errors
    /// `EINVAL` for a bad WR (opcode for the QP type, SGE outside an MR, wrong lkey, too many
    /// SGEs, a QP in the wrong state); `ENOMEM` when the send queue is full.
    fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError>;

    /// ibv_post_send(3) of a list: posts in order and stops at the first refused WR, returning
    /// its index (libibverbs' `bad_wr`) with the error; the WRs before it are posted.
    ///
    /// # Errors
    /// As [`Verbs::post_send`], with the index of the refused WR.
    fn post_send_list(&self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, DeviceError)>;

    /// ibv_post_send(3) of one WR whose packets may wait for the device's next progress round:
    /// on a software HCA with caller-driven progress the WR is queued on its QP and leaves with
    /// whatever the next `post_send`, `poll_cq`, `wait_cq` or `progress` call on this device
    /// sends (one sendmmsg(2) per UDP source port for both: a doorbell rung once for several
    /// WRs, as a hardware HCA's doorbell batching does). The caller must make such a call soon;
    /// a device that progresses by itself, and every other device, posts at once (the default:
    /// [`Verbs::post_send`]).
    ///
    /// # Errors
    /// As [`Verbs::post_send`].
    fn post_send_deferred(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        self.post_send(qpn, wr)
    }

    /// ibv_post_recv(3) of one WR.
    ///
    /// # Errors
    /// `EINVAL` for a bad SGE or a QP that uses an SRQ; `ENOMEM` when the receive queue is full.
    fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError>;

    /// ibv_post_recv(3) of a list, stopping at the first refused WR (its index is returned).
    ///
    /// # Errors
    /// As [`Verbs::post_recv`], with the index of the refused WR.
    fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)>;

    /// ibv_get_async_event(3) without blocking: the oldest unread asynchronous event.
    fn poll_event(&self) -> Option<AsyncEvent>;

    /// Closes the device: outstanding work completes with `IBV_WC_WR_FLUSH_ERR`, no new work is
    /// accepted, and anything the backend runs (threads, mappings) is stopped. Idempotent.
    fn close(&self);

    /// Whether [`Verbs::close`] has run.
    fn is_closed(&self) -> bool;
}

impl dyn Verbs + '_ {
    /// [`Verbs::progress_while`] for a call that returns a value: runs `f` while the device keeps
    /// making progress and returns what `f` returned.
    pub fn progress_during<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut f = Some(f);
        let mut out = None;
        self.progress_while(&mut || {
            if let Some(f) = f.take() {
                out = Some(f());
            }
        });
        match out {
            Some(r) => r,
            // A backend that did not run `f` broke the contract: run it here.
            None => (f.take().expect("f runs exactly once"))(),
        }
    }
}

/// What [`Verbs::set_event_hook`] installs.
pub type EventHook = Box<dyn Fn() + Send + Sync>;

/// What [`GsiPort::set_mad_hook`] installs.
pub type MadHook = Arc<dyn Fn() + Send + Sync>;

/// The device side of a communication manager: QP1's received MADs (IBTA vol. 1 §13.5,
/// [`crate::engine::gsi`]) and the engine it drives connections on, reached through
/// [`Verbs::gsi`]. A device has one QP1, so one CM consumes it at a time.
pub trait GsiPort: Send + Sync {
    /// Runs `f` on the engine under its lock, with the device clock's current instant (never
    /// earlier than what the engine has seen), then sends what `f` queued (MADs on QP1, QP
    /// transitions' flushes) as a verb does. Keep `f` short: the progress engine waits meanwhile.
    fn with_gsi(&self, f: &mut dyn FnMut(Instant, &mut SoftHca));

    /// Installs `hook`, or removes the installed one with `None`. The device calls it (from its
    /// progress thread or a verb's thread, with none of its locks held) after a progress round
    /// that leaves received MADs in QP1's queue ([`SoftHca::has_pending_mads`]); it may be called
    /// again before they are taken. Installing a hook when one is installed is refused: QP1's
    /// MADs have one consumer.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] (`"a second MAD consumer on QP1"`) when a hook is already
    /// installed.
    fn set_mad_hook(&self, hook: Option<MadHook>) -> Result<(), DeviceError>;

    /// Whether received datagrams reach the engine only when a caller drives progress
    /// ([`crate::soft::Progress::Caller`]): a CM must then run progress rounds itself
    /// ([`Verbs::progress`]) to receive MADs.
    fn caller_progress(&self) -> bool;

    /// The shared address and port (UDP 4791 shared by several processes,
    /// [`crate::link::udp::share`]) and this process's slot on it, or `None` (the default) when
    /// the device is not shared: a CM then claims the services it listens on and puts the slot
    /// in its Communication IDs ([`crate::link::udp::cm_route`]).
    fn shared_address(&self) -> Option<(std::net::SocketAddr, usize)> {
        None
    }
}

/// A failed device operation. `Display` gives one line naming the device (its bound address).
#[derive(Debug)]
pub enum DeviceError {
    /// The socket could not be opened, bound or used (address in use, address not on this host,
    /// a socket error while receiving).
    Link(LinkError),
    /// A verb was refused (bad argument, wrong state ...): the engine's error, with its errno.
    Verbs(VerbsError),
    /// The VFIO link failed: the NIC could not be opened (not bound to vfio-pci, no IOMMU
    /// group, not a virtio-net function, ...) or driven.
    #[cfg(target_os = "linux")]
    Vfio(VfioError),
    /// The AF_XDP link failed: no such interface, the socket or the XDP program could not be
    /// set up (privileges, a queue or interface already taken), or a ring operation failed.
    #[cfg(target_os = "linux")]
    Xdp(XdpError),
    /// The device does not do what was asked (`EOPNOTSUPP`).
    Unsupported {
        /// The device ([`Verbs::name`]).
        device: String,
        /// What it does not do.
        what: &'static str,
    },
    /// The device was closed: no new work is accepted.
    Closed {
        /// The device's link ([`Verbs::name`]).
        device: String,
    },
    /// The configuration is unusable (nothing was opened).
    Config {
        /// The link asked for.
        device: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The progress thread could not be started.
    Thread {
        /// The device's link.
        device: String,
        /// The OS error.
        source: io::Error,
    },
    /// A backend-level failure of a device other than the UDP one: libibverbs.so.1 cannot be
    /// loaded, no device has the name asked for, the device could not be opened, the device
    /// is closed ([`crate::ibverbs`]).
    Backend {
        /// The device as the user named it (`verbs:rxe0`).
        device: String,
        /// What failed, with the OS's or the loader's text.
        reason: String,
    },
}

impl DeviceError {
    /// The errno a libibverbs call would have returned for a refused verb, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            DeviceError::Verbs(e) => Some(e.errno()),
            DeviceError::Unsupported { .. } => Some(crate::verbs::error::errno::EOPNOTSUPP),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Link(e) => write!(f, "UDP device: {e}"),
            DeviceError::Verbs(e) => write!(f, "{e}"),
            #[cfg(target_os = "linux")]
            DeviceError::Vfio(e) => write!(f, "VFIO device: {e}"),
            #[cfg(target_os = "linux")]
            DeviceError::Xdp(e) => write!(f, "AF_XDP device: {e}"),
            DeviceError::Closed { device } => write!(f, "device {device}: device is closed"),
            DeviceError::Unsupported { device, what } => {
                write!(f, "device {device}: {what} is not supported")
            }
            DeviceError::Config { device, reason } => {
                write!(f, "device {device}: bad configuration: {reason}")
            }
            DeviceError::Thread { device, source } => {
                write!(f, "device {device}: cannot start progress thread: {source}")
            }
            DeviceError::Backend { device, reason } => write!(f, "device {device}: {reason}"),
        }
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DeviceError::Link(e) => Some(e),
            DeviceError::Verbs(e) => Some(e),
            #[cfg(target_os = "linux")]
            DeviceError::Vfio(e) => Some(e),
            #[cfg(target_os = "linux")]
            DeviceError::Xdp(e) => Some(e),
            DeviceError::Thread { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<VerbsError> for DeviceError {
    fn from(e: VerbsError) -> Self {
        DeviceError::Verbs(e)
    }
}

impl From<LinkError> for DeviceError {
    fn from(e: LinkError) -> Self {
        DeviceError::Link(e)
    }
}

#[cfg(target_os = "linux")]
impl From<VfioError> for DeviceError {
    fn from(e: VfioError) -> Self {
        DeviceError::Vfio(e)
    }
}

#[cfg(target_os = "linux")]
impl From<XdpError> for DeviceError {
    fn from(e: XdpError) -> Self {
        DeviceError::Xdp(e)
    }
}

#[cfg(target_os = "linux")]
impl From<AnyLinkError> for DeviceError {
    fn from(e: AnyLinkError) -> Self {
        match e {
            AnyLinkError::Udp(e) => DeviceError::Link(e),
            AnyLinkError::Vfio(e) => DeviceError::Vfio(e),
            AnyLinkError::Xdp(e) => DeviceError::Xdp(e),
        }
    }
}
