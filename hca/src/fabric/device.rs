//! [`FabricDevice`]: the [`Verbs`] API over the in-memory fabric, so that a program written
//! against `dyn Verbs` (the tools, the conformance suite under `tests/`) runs on simulated
//! devices with a virtual clock exactly as it runs over UDP or on a verbs HCA.
//!
//! A [`FabricGroup`] owns one [`Fabric`] behind a mutex; [`FabricGroup::add_device`] adds a
//! software HCA to it and returns its device handle. Nothing runs in the background: the fabric
//! moves (packets are carried, timers fire, the virtual clock advances) only while a caller of
//! [`Verbs::poll_cq`] or [`Verbs::wait_cq`] on any device of the group drives it, as a
//! [`crate::soft::Progress::Caller`] device moves only while its program polls.
//!
//! # Time
//! [`Verbs::wait_cq`]'s `timeout` bounds both clocks: the wait ends when the virtual clock has
//! advanced by `timeout` (so a retry timeout of the engine, in virtual time, expires in a wait as
//! it would in real time), or when `timeout` of real time has passed (a bound on the caller's
//! wait whatever the simulation does), whichever comes first; and a wait stops stepping after
//! [`MAX_STEPS_AT_INSTANT`] steps without the virtual clock moving (a livelock). When nothing
//! at all is scheduled (no packet in flight, no timer armed) the virtual clock has nothing to
//! advance to: the wait sleeps on a condition variable until another thread's verb creates work
//! or the real-time bound passes.
//!
//! Faults, taps and statistics of the shared fabric are reached with [`FabricGroup::with_fabric`].

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use gpu_p2p::Memory;
use roce::Gid;

use super::{soft_hca_with, Fabric, Faults, NodeId};
use crate::engine::{EngineConfig, Instant, SoftHca};
use crate::soft::DeviceError;
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PortAttr};
use crate::verbs::event::AsyncEvent;
use crate::verbs::gid::{GidEntry, GidType};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr};
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::wc::{WcOpcode, WorkCompletion};
use crate::verbs::wr::{RecvWr, SendWr};
use crate::verbs::Verbs;

/// Most fabric steps one [`Verbs::wait_cq`] takes at one virtual instant before it gives up (a
/// livelock guard: every step at one instant delivers a packet or fires a timer, and a healthy
/// run moves the clock long before this).
pub const MAX_STEPS_AT_INSTANT: u64 = 1_000_000;

/// Fabric steps between two looks at the real-time bound and at the CQ.
const STEPS_PER_SLICE: usize = 64;

/// Steps one [`Verbs::poll_cq`] call runs before it looks at the CQ.
const STEPS_PER_POLL: usize = 4;

struct Shared {
    fabric: Mutex<Fabric>,
    /// Signalled when a verb may have created work or a step produced completions.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.fabric.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A group of software HCAs on one in-memory [`Fabric`]; see the [module docs](self). Cloning
/// gives another handle to the same fabric.
#[derive(Clone)]
pub struct FabricGroup {
    shared: Arc<Shared>,
}

impl fmt::Debug for FabricGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricGroup")
            .field("fabric", &*self.shared.lock())
            .finish()
    }
}

impl FabricGroup {
    /// An empty group whose fabric draws its faults from `seed` ([`Fabric::new`]).
    pub fn new(seed: u64, faults: Faults) -> FabricGroup {
        FabricGroup {
            shared: Arc::new(Shared {
                fabric: Mutex::new(Fabric::new(seed, faults)),
                changed: Condvar::new(),
            }),
        }
    }

    /// Adds a software HCA with address `ip` (its RoCEv2 GID; packets to `ip` reach it), an
    /// Ethernet MTU of `eth_mtu` bytes (1500 gives an active path MTU of 1024, as rxe on
    /// Ethernet) and the default [`EngineConfig`], and returns its device.
    ///
    /// # Errors
    /// [`DeviceError::Config`] when a device of the group already has `ip`, or `ip` is
    /// unspecified.
    pub fn add_device(&self, ip: IpAddr, eth_mtu: u32) -> Result<FabricDevice, DeviceError> {
        self.add_device_with(ip, eth_mtu, EngineConfig::default())
    }

    /// As [`FabricGroup::add_device`] with an engine configuration.
    ///
    /// # Errors
    /// As [`FabricGroup::add_device`].
    pub fn add_device_with(
        &self,
        ip: IpAddr,
        eth_mtu: u32,
        config: EngineConfig,
    ) -> Result<FabricDevice, DeviceError> {
        let local = SocketAddr::new(ip, crate::soft::ROCEV2_PORT);
        if ip.is_unspecified() {
            return Err(DeviceError::Config {
                device: format!("fabric:{local}"),
                reason: "a fabric device needs a specific address, not 0.0.0.0 or ::",
            });
        }
        let gid = Gid::from(ip);
        let mut fabric = self.shared.lock();
        if fabric.route(ip).is_some() {
            return Err(DeviceError::Config {
                device: format!("fabric:{local}"),
                reason: "another device of the fabric has this address",
            });
        }
        let mut hca = soft_hca_with(ip, eth_mtu, config);
        // Setting up the GID table raised IBV_EVENT_GID_CHANGE: nobody asked for it yet.
        while hca.poll_event().is_some() {}
        let gid_index = hca
            .context()
            .device()
            .port
            .gids
            .find(&GidEntry {
                gid,
                gid_type: GidType::RoceV2,
            })
            .unwrap_or(0);
        let node = fabric.add_node(hca);
        Ok(FabricDevice {
            shared: self.shared.clone(),
            node,
            ip,
            gid,
            gid_index,
            closed: AtomicBool::new(false),
        })
    }

    /// Runs `f` on the fabric under its lock: set faults or a tap, read statistics or the
    /// virtual clock, reach an engine ([`Fabric::node_mut`]) for diagnostics.
    pub fn with_fabric<R>(&self, f: impl FnOnce(&mut Fabric) -> R) -> R {
        let r = f(&mut self.shared.lock());
        self.shared.changed.notify_all();
        r
    }
}

/// One software HCA of a [`FabricGroup`], driven through [`Verbs`]. Its GID table holds the
/// RoCE v1 and v2 GIDs of its MAC-derived link-local address (indices 0, 1) and the RoCEv2 GID
/// of its address ([`Verbs::default_gid`]).
pub struct FabricDevice {
    shared: Arc<Shared>,
    node: NodeId,
    ip: IpAddr,
    gid: Gid,
    gid_index: u32,
    closed: AtomicBool,
}

impl fmt::Debug for FabricDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricDevice")
            .field("ip", &self.ip)
            .field("node", &self.node)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl FabricDevice {
    /// The device's node in the fabric.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    fn check_open(&self) -> Result<(), DeviceError> {
        if self.closed.load(Ordering::Acquire) {
            Err(DeviceError::Closed {
                device: format!(
                    "fabric:{}",
                    SocketAddr::new(self.ip, crate::soft::ROCEV2_PORT)
                ),
            })
        } else {
            Ok(())
        }
    }

    /// Runs `f` on this device's engine under the fabric lock, with the engine's clock brought
    /// up to the fabric's (verbs have no `now`; timers they arm count from it).
    fn engine<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> R {
        let mut fabric = self.shared.lock();
        let now = fabric.now();
        let hca = fabric.node_mut(self.node);
        hca.handle_timeout(now);
        f(hca)
    }

    /// As [`FabricDevice::engine`], then wakes waiters: the verb may have created work.
    fn engine_kick<R>(&self, f: impl FnOnce(&mut SoftHca) -> R) -> R {
        let r = self.engine(f);
        self.shared.changed.notify_all();
        r
    }

    fn poll_locked(
        &self,
        fabric: &mut Fabric,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, DeviceError> {
        Ok(fabric.node_mut(self.node).poll_cq(cq, out)?)
    }
}

impl Verbs for FabricDevice {
    fn name(&self) -> String {
        format!("fabric:{}", self.ip)
    }
    fn query_device(&self) -> DeviceAttr {
        self.engine(|e| e.context().query_device().clone())
    }
    fn query_port(&self) -> PortAttr {
        self.engine(|e| e.context().device().port.attr.clone())
    }
    fn query_gid(&self, index: u32) -> Result<GidEntry, DeviceError> {
        Ok(self.engine(|e| e.context().query_gid(1, index))?)
    }
    fn default_gid(&self) -> (u32, Gid) {
        (self.gid_index, self.gid)
    }
    fn alloc_pd(&self) -> Result<PdHandle, DeviceError> {
        self.check_open()?;
        Ok(self.engine(|e| e.alloc_pd())?)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.dealloc_pd(pd))?)
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
        self.check_open()?;
        Ok(self.engine(|e| e.reg_mr_range(pd, memory, offset, length, iova, access))?)
    }
    fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.dereg_mr(lkey))?)
    }
    fn create_cq(&self, cqe: u32) -> Result<CqHandle, DeviceError> {
        self.check_open()?;
        Ok(self.engine(|e| e.create_cq(cqe))?)
    }
    fn destroy_cq(&self, cq: CqHandle) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.destroy_cq(cq))?)
    }

    /// Runs a few fabric steps (the virtual clock may jump to the next event), then polls.
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        let mut fabric = self.shared.lock();
        for _ in 0..STEPS_PER_POLL {
            if !fabric.step() {
                break;
            }
        }
        let n = self.poll_locked(&mut fabric, cq, out)?;
        drop(fabric);
        self.shared.changed.notify_all();
        Ok(n)
    }

    /// Drives the fabric until `n` completions arrived, the virtual clock advanced by `timeout`,
    /// or `timeout` of real time passed (see the [module docs](self#time)).
    fn wait_cq(
        &self,
        cq: CqHandle,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, DeviceError> {
        let real_deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n.min(4096));
        let mut buf = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 32];
        let mut fabric = self.shared.lock();
        let virtual_deadline = fabric.now() + timeout;
        let mut last: Instant = fabric.now();
        let mut steps_at_instant = 0u64;
        let mut idle = false;
        loop {
            loop {
                let want = (n - out.len()).min(buf.len());
                let got = self.poll_locked(&mut fabric, cq, &mut buf[..want])?;
                out.extend_from_slice(buf.get(..got).unwrap_or(&[]));
                if got < want || out.len() >= n {
                    break;
                }
            }
            if out.len() >= n || fabric.now() > virtual_deadline {
                break;
            }
            let now_real = std::time::Instant::now();
            if now_real >= real_deadline {
                break;
            }
            if idle {
                // Nothing scheduled (and the CQ was polled after the last step): only another
                // thread's verb can create work.
                let (guard, _) = self
                    .shared
                    .changed
                    .wait_timeout(fabric, real_deadline - now_real)
                    .unwrap_or_else(PoisonError::into_inner);
                fabric = guard;
                idle = false;
                continue;
            }
            for _ in 0..STEPS_PER_SLICE {
                if !fabric.step_to(virtual_deadline.saturating_add_nanos(1)) {
                    idle = true;
                    break;
                }
                if fabric.now() == last {
                    steps_at_instant += 1;
                } else {
                    last = fabric.now();
                    steps_at_instant = 0;
                }
                if fabric.now() > virtual_deadline {
                    break;
                }
            }
            if steps_at_instant > MAX_STEPS_AT_INSTANT {
                break;
            }
        }
        drop(fabric);
        self.shared.changed.notify_all();
        Ok(out)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.req_notify_cq(cq, solicited_only))?)
    }
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, DeviceError> {
        self.check_open()?;
        Ok(self.engine(|e| e.create_srq(pd, attr))?)
    }
    fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.modify_srq(srq, attr, mask))?)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.destroy_srq(srq))?)
    }
    fn post_srq_recv(&self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        Ok(self.engine_kick(|e| e.post_srq_recv(srq, wr))?)
    }
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, DeviceError> {
        self.check_open()?;
        Ok(self.engine(|e| e.create_ah(pd, attr))?)
    }
    fn destroy_ah(&self, ah: AhHandle) -> Result<(), DeviceError> {
        Ok(self.engine(|e| e.destroy_ah(ah))?)
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, DeviceError> {
        self.check_open()?;
        Ok(self.engine(|e| e.create_qp(pd, init))?)
    }
    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), DeviceError> {
        Ok(self.engine(|e| e.query_qp(qpn))?)
    }
    fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, DeviceError> {
        self.check_open()?;
        Ok(self.engine_kick(|e| e.modify_qp(qpn, attr, mask))?)
    }
    fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        Ok(self.engine_kick(|e| e.destroy_qp(qpn))?)
    }
    fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        Ok(self.engine_kick(|e| e.post_send(qpn, wr))?)
    }
    fn post_send_list(&self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, DeviceError)> {
        self.check_open().map_err(|e| (0, e))?;
        self.engine_kick(|e| e.post_send_list(qpn, wrs))
            .map_err(|(i, e)| (i, DeviceError::Verbs(e)))
    }
    fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        self.check_open()?;
        Ok(self.engine_kick(|e| e.post_recv(qpn, wr))?)
    }
    fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)> {
        self.check_open().map_err(|e| (0, e))?;
        self.engine_kick(|e| e.post_recv_list(qpn, wrs))
            .map_err(|(i, e)| (i, DeviceError::Verbs(e)))
    }
    fn poll_event(&self) -> Option<AsyncEvent> {
        self.engine(|e| e.poll_event())
    }

    /// Moves every QP of the device to ERR (outstanding WRs complete with
    /// `IBV_WC_WR_FLUSH_ERR`) and refuses new work; packets still addressed to the device reach
    /// its engine, whose QPs in ERR drop them (a dead peer).
    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.engine_kick(|e| {
            e.error_all_qps();
        });
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Drop for FabricDevice {
    /// As [`Verbs::close`].
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::connect::{self, ConnectAttr};
    use crate::verbs::qp::{QpCap, QpState, QpType};
    use crate::verbs::wc::WcStatus;
    use crate::verbs::wr::{SendFlags, SendOp, Sge};
    use core::net::Ipv4Addr;
    use gpu_p2p::HostMemory;

    const WAIT: Duration = Duration::from_secs(20);

    struct End {
        dev: Arc<dyn Verbs>,
        cq: CqHandle,
        qpn: u32,
        mem: Arc<HostMemory>,
        mr: MemoryRegion,
    }

    fn end(dev: Arc<dyn Verbs>) -> End {
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(64).expect("cq");
        let mem = Arc::new(HostMemory::new(4096).expect("memory"));
        let mr = dev
            .reg_mr(pd, mem.clone(), 0, 4096, 0x1000, AccessFlags::LOCAL_WRITE)
            .expect("mr");
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qpn = dev.create_qp(pd, &init).expect("qp");
        End {
            dev,
            cq,
            qpn,
            mem,
            mr,
        }
    }

    fn connect(me: &End, peer: &End, retry_cnt: u8) {
        let d = &me.dev;
        let (sgid_index, _) = d.default_gid();
        let a = ConnectAttr {
            path_mtu: crate::verbs::device::PathMtu::Mtu1024,
            ah_attr: ConnectAttr::av(peer.dev.default_gid().1, sgid_index as u8, 64, 0),
            remote_qpn: peer.qpn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            timeout: 10,
            retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..ConnectAttr::default()
        };
        connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
            d.modify_qp(me.qpn, qp, mask).map(|_| ())
        })
        .expect("bring-up");
    }

    fn pair(retry_cnt: u8) -> (FabricGroup, End, End) {
        let group = FabricGroup::new(1, Faults::none());
        let a = group
            .add_device(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1500)
            .expect("device a");
        let b = group
            .add_device(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 1500)
            .expect("device b");
        let (a, b) = (end(Arc::new(a)), end(Arc::new(b)));
        connect(&a, &b, retry_cnt);
        connect(&b, &a, retry_cnt);
        (group, a, b)
    }

    fn send(from: &End, wr_id: u64, len: u32) {
        let sge = [Sge {
            addr: from.mr.iova(),
            length: len,
            lkey: from.mr.lkey(),
        }];
        let wr = SendWr {
            wr_id,
            sg_list: &sge,
            op: SendOp::Send,
            send_flags: SendFlags::SIGNALED,
        };
        from.dev.post_send(from.qpn, &wr).expect("post_send");
    }

    fn recv(to: &End, wr_id: u64) {
        let sge = [Sge {
            addr: to.mr.iova(),
            length: 4096,
            lkey: to.mr.lkey(),
        }];
        to.dev
            .post_recv(
                to.qpn,
                &RecvWr {
                    wr_id,
                    sg_list: &sge,
                },
            )
            .expect("post_recv");
    }

    /// A SEND between two fabric devices through `dyn Verbs` delivers its bytes; the fabric
    /// moves only while a wait drives it.
    #[test]
    fn send_through_dyn_verbs() {
        let (_group, a, b) = pair(7);
        assert!(a.dev.name().starts_with("fabric:10.0.0.1"));
        a.mem.write(0, b"over the fabric").expect("write");
        recv(&b, 7);
        send(&a, 9, 15);
        let got = a.dev.wait_cq(a.cq, 1, WAIT).expect("wait a");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::Success));
        let got = b.dev.wait_cq(b.cq, 1, WAIT).expect("wait b");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].wr_id, got[0].byte_len), (7, 15));
        let mut data = [0u8; 15];
        b.mem.read(0, &mut data).expect("read");
        assert_eq!(&data, b"over the fabric");
    }

    /// With the peer's QP gone the sender exhausts retry_cnt in virtual time, whatever the real
    /// timeout: IBV_WC_RETRY_EXC_ERR.
    #[test]
    fn dead_peer_retry_exceeded_in_virtual_time() {
        let (_group, a, b) = pair(1);
        b.dev.destroy_qp(b.qpn).expect("destroy peer QP");
        send(&a, 1, 8);
        let got = a.dev.wait_cq(a.cq, 1, WAIT).expect("wait");
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].status, WcStatus::RetryExcErr);
    }

    /// A wait on an idle fabric sleeps until another thread's verb creates work.
    #[test]
    fn idle_wait_wakes_on_another_threads_post() {
        let (_group, a, b) = pair(7);
        recv(&b, 3);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| b.dev.wait_cq(b.cq, 1, WAIT));
            // The waiter may or may not be asleep yet: either way it must see the completion.
            send(&a, 4, 1);
            let got = waiter.join().expect("waiter").expect("wait");
            assert_eq!(got.len(), 1);
            assert_eq!((got[0].wr_id, got[0].status), (3, WcStatus::Success));
        });
        // Nothing more will come: the wait returns what there is when its bounds pass.
        let none = b
            .dev
            .wait_cq(b.cq, 1, Duration::from_millis(5))
            .expect("wait");
        assert!(none.is_empty());
    }

    /// Two devices cannot share an address; close flushes outstanding receives and refuses work.
    #[test]
    fn duplicate_address_and_close() {
        let (group, a, b) = pair(7);
        let dup = group.add_device(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1500);
        assert!(matches!(dup, Err(DeviceError::Config { .. })));
        recv(&b, 11);
        b.dev.close();
        assert!(b.dev.is_closed());
        let got = b.dev.wait_cq(b.cq, 1, WAIT).expect("wait");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].wr_id, got[0].status), (11, WcStatus::WrFlushErr));
        assert!(matches!(b.dev.alloc_pd(), Err(DeviceError::Closed { .. })));
        let _ = a;
    }
}
