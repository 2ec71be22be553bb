//! [`Verbs`] for the software device over any link: each verb is the device's own method.

use alloc::sync::Arc;
use alloc::vec::Vec;
use std::time::Duration;

use gpu_p2p::Memory;

use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::api::{DeviceError, Verbs};
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

use super::{SoftDevice, SoftLink};

impl<L: SoftLink> Verbs for SoftDevice<L> {
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
    fn post_send_deferred(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        SoftDevice::post_send_deferred(self, qpn, wr)
    }
    fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        SoftDevice::post_recv(self, qpn, wr)
    }
    fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)> {
        SoftDevice::post_recv_list(self, qpn, wrs)
    }
    fn poll_cq_event(&self) -> Option<CqHandle> {
        SoftDevice::poll_cq_event(self)
    }
    fn set_event_hook(&self, hook: crate::verbs::api::EventHook) -> Result<(), DeviceError> {
        SoftDevice::set_event_hook(self, hook)
    }
    fn poll_event(&self) -> Option<AsyncEvent> {
        SoftDevice::poll_event(self)
    }
    fn progress(&self) -> usize {
        SoftDevice::progress(self)
    }
    fn flush_held(&self) {
        self.shared.flush_held();
    }
    fn progress_while(&self, f: &mut dyn FnMut()) {
        SoftDevice::progress_during(self, f)
    }
    fn udp_port(&self) -> Option<u16> {
        super::lock(&self.shared.io).link.udp_port()
    }
    fn set_peer_port(&self, ip: std::net::IpAddr, port: u16) -> Result<(), DeviceError> {
        if SoftDevice::<L>::set_peer_port(self, ip, port) {
            Ok(())
        } else {
            Err(DeviceError::Unsupported {
                device: self.name().to_owned(),
                what: "a peer UDP port other than 4791",
            })
        }
    }
    fn alloc_memory(&self, len: usize) -> Option<Result<Arc<dyn Memory>, DeviceError>> {
        super::lock(&self.shared.io).link.alloc_memory(len)
    }
    fn stats(&self) -> Option<Vec<(&'static str, String)>> {
        Some(vec![
            ("engine", format!("{:?}", self.counters())),
            ("link", format!("{:?}", self.link_counters())),
            ("progress", format!("{:?}", self.device_counters())),
        ])
    }
    fn gsi(&self) -> Option<&dyn crate::verbs::api::GsiPort> {
        Some(self)
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
    use crate::verbs::api::Verbs;
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
