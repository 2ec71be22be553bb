//! [`VfioDevice`]: the software HCA on a virtio-net NIC that this process drives through VFIO
//! ([`crate::link::vfio`]), with the same progress engine and verbs API as the UDP device.
//!
//! The device's GID table is the link's: the IPv6 link-local GID (`fe80::` + the MAC's EUI-64)
//! at indexes 0 (RoCEv1) and 1 (RoCEv2), and the IPv4-mapped GID of
//! [`VfioLinkConfig::ipv4`] at index 2 when one is configured, as Linux rxe numbers them.
//! Every memory region registered over host memory ([`SoftDevice::reg_mr`],
//! [`SoftDevice::reg_mr_range`], also through `dyn Verbs`) has its pages mapped into the NIC's
//! IOMMU context, device-read-only and `mlock`ed, until it is deregistered; the link's transmit
//! descriptors point straight at them (see `link::vfio`). Memory without a host address is
//! registered unmapped and its payload copied.

use crate::engine::EngineConfig;
use crate::link::vfio::{VfioLink, VfioLinkConfig};

use super::{DeviceError, Progress, SoftDevice, SoftLink};

/// A software RoCEv2 device on a VFIO-driven virtio-net NIC.
pub type VfioDevice = SoftDevice<VfioLink>;

/// How to open a [`VfioDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioDeviceConfig {
    /// The NIC, its addresses, queues and interrupt mode.
    pub link: VfioLinkConfig,
    /// Who drives the engine. With [`Progress::Thread`] (default) the thread busy-polls the
    /// NIC for 200 idle rounds, then sleeps: on the receive interrupt with
    /// [`VfioLinkConfig::interrupts`], else 50 µs at a time.
    pub progress: Progress,
    /// Engine tunables.
    pub engine: EngineConfig,
}

impl VfioDeviceConfig {
    /// The defaults for `link`.
    pub fn new(link: VfioLinkConfig) -> VfioDeviceConfig {
        VfioDeviceConfig {
            link,
            progress: Progress::Thread,
            engine: EngineConfig::default(),
        }
    }
}

impl SoftLink for VfioLink {
    type DeviceConfig = VfioDeviceConfig;
}

impl VfioDevice {
    /// Opens the NIC (every step of [`VfioLink::open`]) and runs the engine over it.
    ///
    /// # Errors
    /// [`DeviceError::Vfio`] naming the PCI device and the failed step (no such device, not
    /// bound to vfio-pci, no IOMMU group, not virtio-net, feature negotiation ...);
    /// [`DeviceError::Thread`].
    pub fn open(config: VfioDeviceConfig) -> Result<VfioDevice, DeviceError> {
        let link = VfioLink::open(&config.link)?;
        let engine = config.engine.clone();
        let progress = config.progress;
        SoftDevice::with_link(link, config, engine, progress, None)
    }

    /// Asks the IOMMU how many bytes of `[iova, iova + len)` are still mapped (see
    /// [`VfioLink::iommu_probe_unmapped`]): for the range [`SoftDevice::dereg_mr_unmapped`]
    /// returned, 0 says the mapping is gone.
    ///
    /// # Errors
    /// [`DeviceError::Vfio`].
    pub fn iommu_probe_unmapped(&self, iova: u64, len: u64) -> Result<u64, DeviceError> {
        Ok(self.with_link_mut(|l| l.iommu_probe_unmapped(iova, len))?)
    }

    /// Adds a static neighbour: no ARP / Neighbor Discovery for `ip`.
    pub fn add_static_neighbour(&self, ip: std::net::IpAddr, mac: [u8; 6]) {
        self.with_link_mut(|l| l.add_static_neighbour(ip, mac));
    }
}

#[cfg(test)]
mod tests {
    //! The device over the fake kernel and hub (`link::vfio::sys_fake`): caller-driven progress
    //! (the fake's world is per thread), RC traffic between two devices with the data checked,
    //! the IOMMU mapping of registered memory, and open errors.

    use std::net::Ipv4Addr;
    use std::sync::Arc;
    use std::time::Duration;

    use gpu_p2p::{HostMemory, Memory};

    use super::*;
    use crate::link::vfio::sys_fake as fake;
    use crate::link::vfio::PciAddress;
    use crate::link::vfio::VfioError;
    use crate::link::Link;
    use crate::verbs::connect::{self, ConnectAttr};

    use crate::verbs::cq::CqHandle;
    use crate::verbs::gid::Gid;
    use crate::verbs::mr::{AccessFlags, MemoryRegion};
    use crate::verbs::qp::{QpCap, QpInitAttr, QpState, QpType};
    use crate::verbs::wc::WcStatus;
    use crate::verbs::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
    use crate::PathMtu;

    const A: &str = "0000:00:04.0";
    const B: &str = "0000:00:05.0";
    const MAC_A: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x0a];
    const MAC_B: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x0b];
    const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
    const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
    const LEN: usize = 1 << 16;
    const WAIT: Duration = Duration::from_secs(5);

    fn config(addr: &str, ip: Ipv4Addr) -> VfioDeviceConfig {
        let mut link = VfioLinkConfig::new(PciAddress::parse(addr).unwrap());
        link.ipv4 = Some(ip);
        link.reset_timeout = Duration::from_millis(50);
        let mut c = VfioDeviceConfig::new(link);
        c.progress = Progress::Caller;
        c
    }

    struct Side {
        dev: VfioDevice,
        cq: CqHandle,
        qpn: u32,
        mem: Arc<HostMemory>,
        mr: MemoryRegion,
    }

    fn side(addr: &str, ip: Ipv4Addr) -> Side {
        let dev = VfioDevice::open(config(addr, ip)).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mem = Arc::new(HostMemory::new(LEN).unwrap());
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = dev.reg_mr(pd, mem.clone(), 0x10_0000, access).unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        };
        let qpn = dev.create_qp(pd, &init).unwrap();
        Side {
            dev,
            cq,
            qpn,
            mem,
            mr,
        }
    }

    fn connect(s: &Side, peer_qpn: u32, peer: Ipv4Addr) {
        let a = ConnectAttr {
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            path_mtu: PathMtu::Mtu1024,
            remote_qpn: peer_qpn,
            remote_psn: 7,
            local_psn: 7,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
            // GID index 2: the IPv4 GID after the two link-local ones.
            ah_attr: ConnectAttr::av(Gid::from(peer), 2, 64, 0),
            // 4.096 us * 2^18, about 1 s: the fake NIC loses nothing, so no retransmission is
            // needed, and a loaded machine that stalls this thread must not start one (a retry's
            // duplicate responses are dropped and counted, which the tests check is zero).
            timeout: 18,
            retry_cnt: 3,
            rnr_retry: 3,
            max_rd_atomic: 4,
            ..ConnectAttr::default()
        };
        connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
            s.dev.modify_qp(s.qpn, qp, mask).map(|_| ())
        })
        .unwrap();
    }

    fn pair() -> (Side, Side) {
        fake::reset();
        fake::add_virtio_net(A, 7, MAC_A);
        fake::add_virtio_net(B, 8, MAC_B);
        fake::with(|w| w.hub = true);
        let a = side(A, IP_A);
        let b = side(B, IP_B);
        connect(&a, b.qpn, IP_B);
        connect(&b, a.qpn, IP_A);
        (a, b)
    }

    /// Drives both devices (caller progress) until `on` has one completion.
    fn one_completion(on: &Side, other: &Side) -> crate::verbs::wc::WorkCompletion {
        let mut wc = [crate::verbs::wc::WorkCompletion::success(
            0,
            crate::verbs::wc::WcOpcode::Send,
            0,
            0,
        )];
        let start = std::time::Instant::now();
        while start.elapsed() < WAIT {
            other.dev.progress();
            if on.dev.poll_cq(on.cq, &mut wc).unwrap() == 1 {
                return wc[0];
            }
        }
        panic!("no completion within {WAIT:?}");
    }

    fn post(s: &Side, wr_id: u64, offset: u64, len: u32, op: SendOp) {
        let sge = [Sge {
            addr: s.mr.iova() + offset,
            length: len,
            lkey: s.mr.lkey(),
        }];
        let wr = SendWr {
            wr_id,
            sg_list: &sge,
            op,
            send_flags: SendFlags::SIGNALED,
        };
        s.dev.post_send(s.qpn, &wr).unwrap();
    }

    #[test]
    fn the_device_api_runs_rc_send_write_read_over_the_vfio_link() {
        let (a, b) = pair();
        assert_eq!(a.dev.name(), "vfio:0000:00:04.0");
        assert_eq!(a.dev.gid(), Gid::from(IP_A));
        assert_eq!(a.dev.query_gid(2).unwrap().gid, Gid::from(IP_A));
        assert_eq!(
            a.dev.query_gid(1).unwrap().gid,
            Gid::link_local_from_mac(MAC_A)
        );
        // The link's MTU (1500) gives the port an active MTU of 1024, as rxe computes it.
        assert_eq!(a.dev.query_port().active_mtu, PathMtu::Mtu1024);

        // SEND 3000 bytes (three packets) into a posted receive.
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
        a.mem.write(0, &data).unwrap();
        let sge = [Sge {
            addr: b.mr.iova(),
            length: 4096,
            lkey: b.mr.lkey(),
        }];
        b.dev
            .post_recv(
                b.qpn,
                &RecvWr {
                    wr_id: 1,
                    sg_list: &sge,
                },
            )
            .unwrap();
        post(&a, 2, 0, 3000, SendOp::Send);
        let wc = one_completion(&a, &b);
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        let wc = one_completion(&b, &a);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (1, WcStatus::Success, 3000)
        );
        let mut got = vec![0; 3000];
        b.mem.read(0, &mut got).unwrap();
        assert_eq!(got, data);

        // WRITE 8 KiB into B at offset 16 KiB, READ it back into A at offset 32 KiB.
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 1) as u8).collect();
        a.mem.write(4096, &data).unwrap();
        let remote = b.mr.iova() + 16384;
        let rkey = b.mr.rkey();
        post(
            &a,
            3,
            4096,
            8192,
            SendOp::RdmaWrite {
                remote_addr: remote,
                rkey,
            },
        );
        let wc = one_completion(&a, &b);
        assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
        let mut got = vec![0; 8192];
        b.mem.read(16384, &mut got).unwrap();
        assert_eq!(got, data);
        post(
            &a,
            4,
            32768,
            8192,
            SendOp::RdmaRead {
                remote_addr: remote,
                rkey,
            },
        );
        let wc = one_completion(&a, &b);
        assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
        a.mem.read(32768, &mut got).unwrap();
        assert_eq!(got, data);
        let c = a.dev.link_counters();
        assert!(c.tx_roce > 0 && c.rx_roce > 0, "{c:?}");
        fake::with(|w| assert_eq!(w.iommu_faults, 0));
    }

    #[test]
    fn registered_memory_is_mapped_until_deregistered_then_writes_are_naked() {
        let (a, b) = pair();
        let lkey = b.mr.lkey();
        let before = b.dev.with_link_mut(|l| l.mr_dma_range(lkey)).unwrap();
        assert_eq!(before.1, LEN as u64);
        let (iova, len) = b.dev.dereg_mr_unmapped(lkey).unwrap().unwrap();
        assert_eq!((iova, len), before);
        assert_eq!(b.dev.iommu_probe_unmapped(iova, len).unwrap(), 0);
        a.mem.write(0, &[0x5a; 512]).unwrap();
        post(
            &a,
            9,
            0,
            512,
            SendOp::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
            },
        );
        let wc = one_completion(&a, &b);
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemAccessErr));
        let mut got = vec![0; 512];
        b.mem.read(0, &mut got).unwrap();
        assert_eq!(got, vec![0; 512], "the deregistered memory is untouched");
        // A second deregistration is refused by the engine; nothing is unmapped.
        assert!(b.dev.dereg_mr_unmapped(lkey).is_err());
    }

    #[test]
    fn every_registration_through_dyn_verbs_is_mapped_and_unmapped() {
        use crate::verbs::Verbs;
        let (a, _b) = pair();
        let verbs: &dyn Verbs = &a.dev;
        let pd = verbs.alloc_pd().unwrap();
        let mem: Arc<dyn Memory> = Arc::new(HostMemory::new(4 * 4096).unwrap());
        let va = mem.host_ptr().unwrap().as_ptr().as_ptr() as usize;
        // Bytes 5000 .. 9000: pages 1 and 2.
        let mr = verbs
            .reg_mr(
                pd,
                mem.clone(),
                5000,
                4000,
                0x40_0000,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap();
        let range = a.dev.with_link_mut(|l| l.mr_dma_range(mr.lkey())).unwrap();
        assert_eq!(range.1, 2 * 4096);
        assert_eq!(fake::mapped_bytes(0, va, 4 * 4096), (2 * 4096, 0));
        assert_eq!(fake::mapped_bytes(0, va + 4096, 2 * 4096).0, 2 * 4096);
        verbs.dereg_mr(mr.lkey()).unwrap();
        assert_eq!(fake::mapped_bytes(0, va, 4 * 4096), (0, 0));
        assert_eq!(a.dev.iommu_probe_unmapped(range.0, range.1).unwrap(), 0);
    }

    #[test]
    fn open_errors_name_the_device() {
        fake::reset();
        let e = VfioDevice::open(config(A, IP_A)).unwrap_err();
        assert!(
            matches!(e, DeviceError::Vfio(VfioError::NoSuchDevice { .. })),
            "{e}"
        );
        assert!(e.to_string().contains(A), "{e}");
        fake::add_virtio_net(A, 7, MAC_A);
        fake::with(|w| w.pci.get_mut(A).unwrap().driver = Some("virtio-pci".into()));
        let e = VfioDevice::open(config(A, IP_A)).unwrap_err();
        assert!(
            matches!(e, DeviceError::Vfio(VfioError::NotBoundToVfio { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("not vfio-pci"), "{e}");
    }

    #[test]
    fn closing_flushes_and_refuses_new_work() {
        let (a, _b) = pair();
        let sge = [Sge {
            addr: a.mr.iova(),
            length: 64,
            lkey: a.mr.lkey(),
        }];
        a.dev
            .post_recv(
                a.qpn,
                &RecvWr {
                    wr_id: 5,
                    sg_list: &sge,
                },
            )
            .unwrap();
        a.dev.close();
        let wcs = a.dev.wait_cq(a.cq, 1, Duration::from_millis(100)).unwrap();
        assert_eq!(wcs.len(), 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::WrFlushErr));
        assert!(matches!(
            a.dev.alloc_pd(),
            Err(DeviceError::Closed { device }) if device == "vfio:0000:00:04.0"
        ));
        let _ = a.dev.with_link_mut(|l| Link::mtu(l));
    }
}
