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
use std::time::Duration;

use gpu_p2p::Memory;

use crate::link::Link;
use crate::soft::{DeviceError, SoftDevice};
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PortAttr};
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

impl<L: Link> Verbs for SoftDevice<L> {
    fn name(&self) -> String {
        SoftDevice::name(self).to_owned()
    }
    fn query_device(&self) -> DeviceAttr {
        SoftDevice::query_device(self)
    }
    fn query_port(&self) -> PortAttr {
        SoftDevice::query_port(self)
    }
    fn query_gid(&self, index: u32) -> Result<GidEntry, DeviceError> {
        SoftDevice::query_gid(self, index)
    }
    fn default_gid(&self) -> (u32, Gid) {
        (self.gid_index(), self.gid())
    }
    fn alloc_pd(&self) -> Result<PdHandle, DeviceError> {
        SoftDevice::alloc_pd(self)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), DeviceError> {
        SoftDevice::dealloc_pd(self, pd)
    }
    fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        offset: usize,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError> {
        SoftDevice::reg_mr_range(self, pd, memory, offset, length, iova, access)
    }
    fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError> {
        SoftDevice::dereg_mr(self, lkey)
    }
    fn create_cq(&self, cqe: u32) -> Result<CqHandle, DeviceError> {
        SoftDevice::create_cq(self, cqe)
    }
    fn destroy_cq(&self, cq: CqHandle) -> Result<(), DeviceError> {
        SoftDevice::destroy_cq(self, cq)
    }
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        SoftDevice::poll_cq(self, cq, out)
    }
    fn wait_cq(
        &self,
        cq: CqHandle,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, DeviceError> {
        SoftDevice::wait_cq(self, cq, n, timeout)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), DeviceError> {
        SoftDevice::req_notify_cq(self, cq, solicited_only)
    }
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, DeviceError> {
        SoftDevice::create_srq(self, pd, attr)
    }
    fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), DeviceError> {
        SoftDevice::modify_srq(self, srq, attr, mask)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> Result<(), DeviceError> {
        SoftDevice::destroy_srq(self, srq)
    }
    fn post_srq_recv(&self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        SoftDevice::post_srq_recv(self, srq, wr)
    }
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, DeviceError> {
        SoftDevice::create_ah(self, pd, attr)
    }
    fn destroy_ah(&self, ah: AhHandle) -> Result<(), DeviceError> {
        SoftDevice::destroy_ah(self, ah)
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, DeviceError> {
        SoftDevice::create_qp(self, pd, init)
    }
    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), DeviceError> {
        SoftDevice::query_qp(self, qpn)
    }
    fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, DeviceError> {
        SoftDevice::modify_qp(self, qpn, attr, mask)
    }
    fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        SoftDevice::destroy_qp(self, qpn)
    }
    fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        SoftDevice::post_send(self, qpn, wr)
    }
    fn post_send_list(&self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, DeviceError)> {
        SoftDevice::post_send_list(self, qpn, wrs)
    }
    fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        SoftDevice::post_recv(self, qpn, wr)
    }
    fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)> {
        SoftDevice::post_recv_list(self, qpn, wrs)
    }
    fn poll_event(&self) -> Option<AsyncEvent> {
        SoftDevice::poll_event(self)
    }
    fn close(&self) {
        SoftDevice::close(self)
    }
    fn is_closed(&self) -> bool {
        SoftDevice::is_closed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::{UdpDevice, UdpDeviceConfig};
    use crate::verbs::qp::QpType;
    use core::net::{IpAddr, Ipv4Addr};

    /// The trait is object safe and a `dyn Verbs` drives a real device: a refused verb keeps its
    /// errno through the trait.
    #[test]
    fn udp_device_through_dyn_verbs() {
        let mut config = UdpDeviceConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
        config.port = 0;
        let dev: Arc<dyn Verbs> = Arc::new(UdpDevice::open(config).expect("open loopback device"));
        assert!(dev.name().starts_with("udp:127.0.0.1"));
        let (index, gid) = dev.default_gid();
        assert_eq!(dev.query_gid(index).expect("default GID").gid, gid);
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(16).expect("cq");
        assert_eq!(dev.create_cq(0).unwrap_err().errno(), Some(libc::EINVAL));
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: crate::verbs::qp::QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qpn = dev.create_qp(pd, &init).expect("qp");
        assert_eq!(dev.dealloc_pd(pd).unwrap_err().errno(), Some(libc::EBUSY));
        dev.destroy_qp(qpn).expect("destroy qp");
        dev.destroy_cq(cq).expect("destroy cq");
        dev.dealloc_pd(pd).expect("dealloc pd");
        dev.close();
        assert!(dev.is_closed());
        assert!(dev.alloc_pd().is_err());
    }
}
