//! The IB verbs backend: [`Verbs`] over rdma-core's libibverbs, for real InfiniBand and RoCE HCAs
//! (ConnectX, EFA, any verbs device) and the kernel's soft-RoCE (`rxe`).
//!
//! # What it is
//! On a machine with an RDMA device, the kernel's RDMA core and rdma-core's `libibverbs.so.1` (with
//! the device's *provider*, e.g. `librxe-rdmav34.so`, `libmlx5`) give a program the verbs: a device
//! from ibv_get_device_list(3), opened with ibv_open_device(3), and the calls on it. [`IbvDevice`]
//! is such an opened device behind the same [`Verbs`] trait as the software HCA, so the tools
//! (`--link verbs:DEVICE`) and the collectives run on the hardware unchanged.
//!
//! # Loading
//! libibverbs is opened at run time (dlopen(3) of `libibverbs.so.1`), never linked: the project
//! builds, tests and runs where rdma-core is absent, and only asking for a verbs device there
//! fails, with one line that says why ([`DeviceError::Backend`]: the library cannot be loaded,
//! the kernel has no RDMA devices, no device has that name, naming those there are). Needs
//! rdma-core 34 or newer (ibv_reg_dmabuf_mr, ibv_query_gid_ex).
//!
//! # Errors
//! A verb the library refuses is [`DeviceError::Verbs`] with the operation's [`VerbsError`]
//! variant (as the software engine's) and [`Cause::Os`] carrying the library's errno unchanged
//! (its text in `Display`), so [`DeviceError::errno`] compares like for like across backends.
//! Handles this device never issued are refused here first, as the software engine refuses them
//! ([`Cause::NoSuchObject`], `EINVAL`). Completions map `enum ibv_wc_status` one to one onto
//! [`WcStatus`](crate::WcStatus).
//!
//! # Memory
//! [`Verbs::reg_mr`] registers memory the CPU can address ([`gpu_p2p::Memory::host_ptr`]) with
//! ibv_reg_mr_iova2(3): the HCA reads and writes it in place (no copy anywhere on the data path),
//! and the MR keeps its `Memory` alive until deregistered. Memory without a host address (GPU
//! memory) registers through its dma-buf with [`IbvDevice::reg_dmabuf_mr`] (ibv_reg_dmabuf_mr(3)).
//!
//! # Data path
//! post_send / post_recv / poll_cq translate into `ibv_send_wr` / `ibv_recv_wr` / `ibv_sge` /
//! `ibv_wc` arrays on the stack (a list in batches of [`WR_BATCH`] WRs) and call the provider's
//! functions directly: no allocation and no copy of payload. [`Verbs::wait_cq`] sleeps on the CQ's
//! completion channel (ibv_req_notify_cq(3), ibv_get_cq_event(3)), bounded by its timeout.
//!
//! # Closing
//! [`Verbs::close`] moves every QP to ERR, which flushes its outstanding work requests with
//! `IBV_WC_WR_FLUSH_ERR` (the HCA does it), and refuses new objects and work; completions stay
//! pollable. Dropping the device destroys every object, then closes the device.

mod sys;
pub mod translate;

/// rdma-core 44's `infiniband/verbs.h` as bindgen writes it (`regenerate-bindings.sh`): the struct
/// layouts, enum values and function types of libibverbs' C ABI, for this backend and for the
/// drop-in `libibverbs.so.1` (`hca/abi`), which implements that ABI over the software HCA.
pub use sys::bindings as ffi;

use std::collections::HashMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use gpu_p2p::Memory;

use crate::soft::DeviceError;
use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{DeviceAttr, PortAttr};
use crate::verbs::error::{Cause, Object, VerbsError};
use crate::verbs::event::AsyncEvent;
use crate::verbs::gid::{Gid, GidEntry};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr, QpState};
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::table::{Handle, ObjectTable};
use crate::verbs::wc::WorkCompletion;
use crate::verbs::wr::{RecvWr, SendWr};
use crate::verbs::Verbs;

/// The library [`IbvDevice::open`] loads: `libibverbs.so.1`, the SONAME of every rdma-core
/// release, found as dlopen(3) searches.
pub const LIBIBVERBS: &str = sys::LIBIBVERBS;

/// Most SGEs one WR may carry through this backend (the stack array per WR); more is `EINVAL`
/// ([`Cause::TooManySge`]). Every HCA known has a lower `max_sge` (rxe 32, mlx5 30).
pub const MAX_SGE: usize = 32;

/// WRs per provider call when posting a list (the stack array of `ibv_send_wr` / `ibv_recv_wr`).
pub const WR_BATCH: usize = 16;

/// The GID table entries scanned for [`Verbs::default_gid`] (the first ones: the kernel fills the
/// table from index 0).
const GID_SCAN: u32 = 256;

/// The longest a [`Verbs::wait_cq`] sleeps at a time, so that a destroy waiting for the object
/// tables is not held up longer.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// The attributes `query_qp` asks for: every one below `IBV_QP_RATE_LIMIT` (bit 25), the bits
/// ibv_cmd_query_qp accepts (rdma-core libibverbs/cmd.c answers any higher bit with EOPNOTSUPP).
const QUERY_QP_MASK: QpAttrMask = QpAttrMask::from_bits_truncate(QpAttrMask::RATE_LIMIT.bits() - 1);

/// The RDMA device names the kernel offers (ibv_get_device_list(3)), e.g. `["rxe0", "mlx5_0"]`.
///
/// # Errors
/// [`DeviceError::Backend`] when libibverbs.so.1 cannot be loaded or the list cannot be read
/// (`ENOSYS`: the kernel has no RDMA support).
pub fn device_names() -> Result<Vec<String>, DeviceError> {
    let backend = |reason: String| DeviceError::Backend {
        device: "verbs".into(),
        reason,
    };
    let lib = sys::Lib::open(LIBIBVERBS).map_err(|e| backend(format!("cannot load {e}")))?;
    lib.device_names().map_err(|errno| {
        backend(format!(
            "cannot list RDMA devices: {}",
            std::io::Error::from_raw_os_error(errno)
        ))
    })
}

struct PdEntry {
    raw: sys::RawPd,
}

struct MrEntry {
    raw: sys::RawMr,
    pd: PdHandle,
}

struct CqEntry {
    raw: sys::RawCq,
    channel: sys::RawChannel,
}

struct SrqEntry {
    raw: sys::RawSrq,
    pd: PdHandle,
}

struct AhEntry {
    raw: sys::RawAh,
    pd: PdHandle,
}

struct QpEntry {
    raw: sys::RawQp,
    pd: PdHandle,
    init: QpInitAttr,
}

/// Every object of the device, by handle (PD, CQ, SRQ, AH), lkey (MR) or QPN (QP).
struct Objects {
    pds: ObjectTable<PdEntry>,
    cqs: ObjectTable<CqEntry>,
    srqs: ObjectTable<SrqEntry>,
    ahs: ObjectTable<AhEntry>,
    mrs: HashMap<u32, MrEntry>,
    qps: HashMap<u32, QpEntry>,
}

/// Re-types a handle of a backend table as the verbs handle of the same object.
fn cast<T, U>(h: Handle<T>) -> Handle<U> {
    Handle::from_raw(h.index(), h.generation())
}

impl Objects {
    fn pd(&self, pd: PdHandle) -> Option<&PdEntry> {
        self.pds.get(cast(pd))
    }
    fn cq(&self, cq: CqHandle) -> Option<&CqEntry> {
        self.cqs.get(cast(cq))
    }
    fn srq(&self, srq: SrqHandle) -> Option<&SrqEntry> {
        self.srqs.get(cast(srq))
    }
    fn ah(&self, ah: AhHandle) -> Option<&AhEntry> {
        self.ahs.get(cast(ah))
    }
    /// How many objects use `pd`.
    fn pd_users(&self, pd: PdHandle) -> usize {
        self.mrs.values().filter(|m| m.pd == pd).count()
            + self.qps.values().filter(|q| q.pd == pd).count()
            + self.srqs.iter().filter(|(_, s)| s.pd == pd).count()
            + self.ahs.iter().filter(|(_, a)| a.pd == pd).count()
    }
    /// How many QPs use `cq`.
    fn cq_users(&self, cq: CqHandle) -> usize {
        self.qps
            .values()
            .filter(|q| q.init.send_cq == cq || q.init.recv_cq == cq)
            .count()
    }
}

/// A device opened through libibverbs (`verbs:NAME`). See the [module docs](self).
pub struct IbvDevice {
    /// `verbs:NAME`.
    name: String,
    /// Destroyed objects before the context: `Drop` empties it first.
    objects: RwLock<Objects>,
    ctx: sys::Context,
    attr: DeviceAttr,
    port: PortAttr,
    default_gid: (u32, Gid),
    closed: AtomicBool,
}

impl fmt::Debug for IbvDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbvDevice")
            .field("name", &self.name)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The verbs port: this backend drives port 1 (the [`Verbs`] trait's one port).
const PORT: u8 = 1;

fn os(errno: i32) -> Cause {
    Cause::Os { errno }
}

fn no_such(object: Object, id: u32) -> Cause {
    Cause::NoSuchObject { object, id }
}

impl IbvDevice {
    /// Opens the RDMA device `device` (a name ibv_devices(1) lists: `rxe0`, `mlx5_0`) through
    /// `libibverbs.so.1`.
    ///
    /// # Errors
    /// [`DeviceError::Backend`], one line naming the device: libibverbs.so.1 cannot be loaded
    /// (rdma-core absent), the device list cannot be read (no RDMA support in the kernel), no
    /// device has this name (the names there are follow), ibv_open_device(3) or the queries of
    /// the device, its port 1 or its GID table failed (with the errno's text).
    pub fn open(device: &str) -> Result<IbvDevice, DeviceError> {
        IbvDevice::open_with_library(LIBIBVERBS, device)
    }

    /// [`IbvDevice::open`] with libibverbs loaded from `library` (a path, or a file name that
    /// dlopen(3) searches for), e.g. a build of rdma-core outside the system's library path.
    ///
    /// # Errors
    /// As [`IbvDevice::open`].
    pub fn open_with_library(library: &str, device: &str) -> Result<IbvDevice, DeviceError> {
        let name = format!("verbs:{device}");
        let fail = |reason: String| DeviceError::Backend {
            device: name.clone(),
            reason,
        };
        let errno_text = |e: i32| std::io::Error::from_raw_os_error(e).to_string();
        let lib = sys::Lib::open(library).map_err(|e| fail(format!("cannot load {e}")))?;
        let ctx = match sys::Context::open(lib, device) {
            Ok(Ok(ctx)) => ctx,
            Ok(Err(others)) if others.is_empty() => {
                return Err(fail(
                    "no RDMA device found (ibv_get_device_list is empty)".into(),
                ))
            }
            Ok(Err(others)) => {
                return Err(fail(format!(
                    "no RDMA device of that name (devices: {})",
                    others.join(", ")
                )))
            }
            Err(("ibv_get_device_list", libc::ENOSYS)) => {
                return Err(fail(format!(
                    "cannot list RDMA devices: {} (the kernel has no RDMA support)",
                    errno_text(libc::ENOSYS)
                )))
            }
            Err((call, e)) => return Err(fail(format!("{call}: {}", errno_text(e)))),
        };
        let attr = ctx
            .query_device()
            .map_err(|e| fail(format!("ibv_query_device: {}", errno_text(e))))?;
        let port = ctx
            .query_port(PORT)
            .map_err(|e| fail(format!("ibv_query_port {PORT}: {}", errno_text(e))))?;
        let attr = translate::device_attr(&attr);
        let port = translate::port_attr(&port);
        let scan = port.gid_tbl_len.min(GID_SCAN);
        let gids: Vec<(u32, GidEntry)> = (0..scan)
            .filter_map(|i| {
                ctx.query_gid_ex(PORT, i)
                    .ok()
                    .and_then(|e| translate::gid_entry(&e))
                    .map(|e| (i, e))
            })
            .collect();
        let Some(default_gid) = translate::pick_default_gid(&gids) else {
            return Err(fail(format!(
                "port {PORT} has no GID (is its network interface up with an address?)"
            )));
        };
        let max = |m: u32| m.max(1);
        Ok(IbvDevice {
            name,
            objects: RwLock::new(Objects {
                pds: ObjectTable::new(1, max(attr.max_pd)),
                cqs: ObjectTable::new(1, max(attr.max_cq)),
                srqs: ObjectTable::new(1, max(attr.max_srq)),
                ahs: ObjectTable::new(1, max(attr.max_ah)),
                mrs: HashMap::new(),
                qps: HashMap::new(),
            }),
            ctx,
            attr,
            port,
            default_gid,
            closed: AtomicBool::new(false),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Objects> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects> {
        self.objects.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_open(&self) -> Result<(), DeviceError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DeviceError::Backend {
                device: self.name.clone(),
                reason: "device is closed".into(),
            });
        }
        Ok(())
    }

    /// Registers `length` bytes at byte `offset` of the dma-buf `fd` (exported by a GPU driver,
    /// e.g. CUDA's `cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`) as
    /// the MR `iova .. iova + length` (ibv_reg_dmabuf_mr(3)): the HCA reads and writes the GPU's
    /// memory directly (GPUDirect RDMA). The kernel holds its own reference to the dma-buf; `fd`
    /// may be closed afterwards. The MR's `addr` is reported as 0 (no CPU address).
    ///
    /// # Errors
    /// [`VerbsError::RegMr`]: `EINVAL` for an unknown PD or bad access flags; the library's
    /// errno (`EOPNOTSUPP` where the HCA or the kernel cannot use dma-bufs).
    pub fn reg_dmabuf_mr(
        &self,
        pd: PdHandle,
        fd: BorrowedFd<'_>,
        offset: u64,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError> {
        self.check_open()?;
        let err = |cause| VerbsError::RegMr {
            pd: pd.index(),
            cause,
        };
        access.check_mr().map_err(err)?;
        let mut objects = self.write();
        let raw_pd = &objects
            .pd(pd)
            .ok_or(err(no_such(Object::Pd, pd.index())))?
            .raw;
        let raw = self
            .ctx
            .reg_dmabuf_mr(raw_pd, offset, length, iova, fd, access.bits())
            .map_err(|e| err(os(e)))?;
        let mr = MemoryRegion::from_hca(pd, 0, iova, length as u64, access, raw.keys());
        objects.mrs.insert(mr.lkey(), MrEntry { raw, pd });
        Ok(mr)
    }

    /// Posts up to [`WR_BATCH`] send WRs as one chain; returns how many were posted, or the
    /// index (within `wrs`) and error of the refused one.
    fn post_send_batch(
        &self,
        objects: &Objects,
        qp: &QpEntry,
        qpn: u32,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, DeviceError)> {
        let mut sges = [[sys::ibv_sge::default(); MAX_SGE]; WR_BATCH];
        let mut raw = [sys::ibv_send_wr::default(); WR_BATCH];
        let n = wrs.len().min(WR_BATCH);
        for (i, wr) in wrs[..n].iter().enumerate() {
            let ah = match wr.op.ud_dest() {
                Some(dest) => match objects.ah(dest.ah) {
                    Some(a) => Some(&a.raw),
                    None => {
                        let cause = no_such(Object::Ah, dest.ah.index());
                        return Err((i, post_send_err(qpn, wr.wr_id, cause)));
                    }
                },
                None => None,
            };
            translate::send_wr(wr, &mut sges[i], ah, &mut raw[i])
                .map_err(|cause| (i, post_send_err(qpn, wr.wr_id, cause)))?;
        }
        link_chain(&mut raw[..n], |w, next| w.next = next);
        self.ctx
            .post_send(&qp.raw, &mut raw[0])
            .map_err(|(i, e)| (i, post_send_err(qpn, wrs[i.min(n - 1)].wr_id, os(e))))
    }

    /// As [`IbvDevice::post_send_batch`] for receive WRs, to a QP or an SRQ.
    fn post_recv_batch(
        &self,
        target: RecvTarget<'_>,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, DeviceError)> {
        let mut sges = [[sys::ibv_sge::default(); MAX_SGE]; WR_BATCH];
        let mut raw = [sys::ibv_recv_wr::default(); WR_BATCH];
        let n = wrs.len().min(WR_BATCH);
        for (i, wr) in wrs[..n].iter().enumerate() {
            translate::recv_wr(wr, &mut sges[i], &mut raw[i])
                .map_err(|cause| (i, target.err(wr.wr_id, cause)))?;
        }
        link_chain(&mut raw[..n], |w, next| w.next = next);
        let posted = match target {
            RecvTarget::Qp(qp, _) => self.ctx.post_recv(qp, &mut raw[0]),
            RecvTarget::Srq(srq, _) => self.ctx.post_srq_recv(srq, &mut raw[0]),
        };
        posted.map_err(|(i, e)| (i, target.err(wrs[i.min(n - 1)].wr_id, os(e))))
    }

    /// Destroys every object (QPs, AHs, SRQs, CQs with their channels, MRs, PDs, in that order).
    /// An object the library refuses to destroy is leaked (with an MR's memory kept alive).
    fn destroy_all(&self) {
        let mut o = self.write();
        for (_, qp) in o.qps.drain() {
            let _ = self.ctx.destroy_qp(qp.raw).map_err(|(raw, _)| leak(raw));
        }
        let handles: Vec<_> = o.ahs.iter().map(|(h, _)| h).collect();
        for h in handles {
            if let Some(ah) = o.ahs.remove(h) {
                let _ = self.ctx.destroy_ah(ah.raw).map_err(|(raw, _)| leak(raw));
            }
        }
        let handles: Vec<_> = o.srqs.iter().map(|(h, _)| h).collect();
        for h in handles {
            if let Some(srq) = o.srqs.remove(h) {
                let _ = self.ctx.destroy_srq(srq.raw).map_err(|(raw, _)| leak(raw));
            }
        }
        let handles: Vec<_> = o.cqs.iter().map(|(h, _)| h).collect();
        for h in handles {
            if let Some(cq) = o.cqs.remove(h) {
                match self.ctx.destroy_cq(cq.raw) {
                    Ok(()) => {
                        let _ = self
                            .ctx
                            .destroy_comp_channel(cq.channel)
                            .map_err(|(raw, _)| leak(raw));
                    }
                    Err((raw, _)) => {
                        leak(raw);
                        leak(cq.channel);
                    }
                }
            }
        }
        for (_, mr) in o.mrs.drain() {
            let _ = self.ctx.dereg_mr(mr.raw).map_err(|(raw, _)| leak(raw));
        }
        let handles: Vec<_> = o.pds.iter().map(|(h, _)| h).collect();
        for h in handles {
            if let Some(pd) = o.pds.remove(h) {
                let _ = self.ctx.dealloc_pd(pd.raw).map_err(|(raw, _)| leak(raw));
            }
        }
    }
}

/// Forgets an object the library would not destroy (its memory, if an MR, stays alive).
fn leak<T>(object: T) {
    let _ = ManuallyDrop::new(object);
}

/// Links `wrs` in order through their `next` pointers (the last one's stays null).
fn link_chain<T>(wrs: &mut [T], set_next: impl Fn(&mut T, *mut T)) {
    for i in 1..wrs.len() {
        let next: *mut T = &mut wrs[i];
        set_next(&mut wrs[i - 1], next);
    }
}

fn post_send_err(qpn: u32, wr_id: u64, cause: Cause) -> DeviceError {
    DeviceError::Verbs(VerbsError::PostSend { qpn, wr_id, cause })
}

/// Where receive WRs go.
#[derive(Clone, Copy)]
enum RecvTarget<'a> {
    Qp(&'a sys::RawQp, u32),
    Srq(&'a sys::RawSrq, u32),
}

impl RecvTarget<'_> {
    fn err(&self, wr_id: u64, cause: Cause) -> DeviceError {
        DeviceError::Verbs(match *self {
            RecvTarget::Qp(_, qpn) => VerbsError::PostRecv { qpn, wr_id, cause },
            RecvTarget::Srq(_, srq) => VerbsError::PostSrqRecv { srq, wr_id, cause },
        })
    }
}

impl Drop for IbvDevice {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
        self.destroy_all();
    }
}

impl Verbs for IbvDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn query_device(&self) -> DeviceAttr {
        self.attr.clone()
    }

    fn query_port(&self) -> PortAttr {
        match self.ctx.query_port(PORT) {
            Ok(p) => translate::port_attr(&p),
            Err(_) => self.port.clone(),
        }
    }

    fn query_gid(&self, index: u32) -> Result<GidEntry, DeviceError> {
        let err = |cause| DeviceError::Verbs(VerbsError::QueryPort { port: PORT, cause });
        let empty = || {
            err(Cause::InvalidValue {
                attr: "gid_index",
                value: index.into(),
            })
        };
        match self.ctx.query_gid_ex(PORT, index) {
            Ok(e) => translate::gid_entry(&e).ok_or_else(empty),
            // An empty entry: ENODATA from the kernel; EINVAL as the trait (and rxe's
            // ibv_query_gid) gives it.
            Err(libc::ENODATA) => Err(empty()),
            Err(e) => Err(err(os(e))),
        }
    }

    fn default_gid(&self) -> (u32, Gid) {
        self.default_gid
    }

    fn alloc_pd(&self) -> Result<PdHandle, DeviceError> {
        self.check_open()?;
        let raw = self
            .ctx
            .alloc_pd()
            .map_err(|e| VerbsError::AllocPd { cause: os(e) })?;
        let mut o = self.write();
        match o.pds.insert(PdEntry { raw }) {
            Ok(h) => Ok(cast(h)),
            Err(entry) => {
                let _ = self.ctx.dealloc_pd(entry.raw).map_err(|(raw, _)| leak(raw));
                Err(VerbsError::AllocPd {
                    cause: o.pds.too_many(Object::Pd),
                }
                .into())
            }
        }
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DeallocPd {
            pd: pd.index(),
            cause,
        };
        let mut o = self.write();
        let users = o.pd_users(pd);
        let entry = o
            .pds
            .take_unused(cast(pd), Object::Pd, users)
            .map_err(err)?;
        match self.ctx.dealloc_pd(entry.raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                // Still allocated: keep it under a fresh handle is not possible (the handle
                // is the caller's), so put it back under the same slot is not offered by the
                // table either; the PD is leaked and the errno reported.
                leak(raw);
                Err(err(os(e)).into())
            }
        }
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
        let err = |cause| VerbsError::RegMr {
            pd: pd.index(),
            cause,
        };
        access.check_mr().map_err(err)?;
        if gpu_p2p::check_range(offset, length, memory.len()).is_err() {
            return Err(err(Cause::OutOfRange {
                attr: "length",
                value: offset as u64 + length as u64,
                max: memory.len() as u64,
            })
            .into());
        }
        let mut o = self.write();
        let raw_pd = &o.pd(pd).ok_or(err(no_such(Object::Pd, pd.index())))?.raw;
        let (raw, addr) = self
            .ctx
            .reg_mr(raw_pd, memory, offset, length, iova, access.bits())
            .map_err(|e| err(e.map_or(Cause::UnsupportedAttribute {
                attr: "memory without a host address (register its dma-buf: IbvDevice::reg_dmabuf_mr)",
            }, os)))?;
        let mr = MemoryRegion::from_hca(pd, addr, iova, length as u64, access, raw.keys());
        o.mrs.insert(mr.lkey(), MrEntry { raw, pd });
        Ok(mr)
    }

    fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DeregMr { lkey, cause };
        let mut o = self.write();
        let entry = o.mrs.remove(&lkey).ok_or(err(no_such(Object::Mr, lkey)))?;
        match self.ctx.dereg_mr(entry.raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                o.mrs.insert(lkey, MrEntry { raw, pd: entry.pd });
                Err(err(os(e)).into())
            }
        }
    }

    fn create_cq(&self, cqe: u32) -> Result<CqHandle, DeviceError> {
        self.check_open()?;
        let err = |cause| VerbsError::CreateCq { cqe, cause };
        if cqe == 0 || cqe > self.attr.max_cqe {
            return Err(err(Cause::OutOfRange {
                attr: "cqe",
                value: cqe.into(),
                max: self.attr.max_cqe.into(),
            })
            .into());
        }
        let channel = self.ctx.create_comp_channel().map_err(|e| err(os(e)))?;
        let raw = match self.ctx.create_cq(cqe, &channel) {
            Ok(raw) => raw,
            Err(e) => {
                let _ = self
                    .ctx
                    .destroy_comp_channel(channel)
                    .map_err(|(raw, _)| leak(raw));
                return Err(err(os(e)).into());
            }
        };
        let mut o = self.write();
        match o.cqs.insert(CqEntry { raw, channel }) {
            Ok(h) => Ok(cast(h)),
            Err(entry) => {
                if self.ctx.destroy_cq(entry.raw).is_ok() {
                    let _ = self.ctx.destroy_comp_channel(entry.channel);
                }
                Err(err(o.cqs.too_many(Object::Cq)).into())
            }
        }
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DestroyCq {
            cq: cq.index(),
            cause,
        };
        let mut o = self.write();
        let users = o.cq_users(cq);
        let entry = o
            .cqs
            .take_unused(cast(cq), Object::Cq, users)
            .map_err(err)?;
        match self.ctx.destroy_cq(entry.raw) {
            Ok(()) => {
                let _ = self
                    .ctx
                    .destroy_comp_channel(entry.channel)
                    .map_err(|(raw, _)| leak(raw));
                Ok(())
            }
            Err((raw, e)) => {
                leak(raw);
                leak(entry.channel);
                Err(err(os(e)).into())
            }
        }
    }

    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize, DeviceError> {
        let o = self.read();
        let entry = o.cq(cq).ok_or(VerbsError::PollCq {
            cq: cq.index(),
            cause: no_such(Object::Cq, cq.index()),
        })?;
        let mut raw = [sys::ibv_wc::default(); 16];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(raw.len());
            let n = self
                .ctx
                .poll_cq(&entry.raw, &mut raw[..want])
                .map_err(|e| VerbsError::PollCq {
                    cq: cq.index(),
                    cause: os(e),
                })?;
            for (slot, wc) in out[done..].iter_mut().zip(&raw[..n]) {
                *slot = translate::work_completion(wc);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn wait_cq(
        &self,
        cq: CqHandle,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, DeviceError> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::with_capacity(n.min(4096));
        let mut buf = [WorkCompletion::success(0, crate::verbs::wc::WcOpcode::Send, 0, 0); 16];
        let mut drain = |got: &mut Vec<WorkCompletion>| -> Result<(), DeviceError> {
            while got.len() < n {
                let want = (n - got.len()).min(buf.len());
                let k = self.poll_cq(cq, &mut buf[..want])?;
                got.extend_from_slice(&buf[..k]);
                if k < want {
                    break;
                }
            }
            Ok(())
        };
        loop {
            drain(&mut got)?;
            if got.len() >= n {
                return Ok(got);
            }
            let o = self.read();
            let entry = o.cq(cq).ok_or(VerbsError::PollCq {
                cq: cq.index(),
                cause: no_such(Object::Cq, cq.index()),
            })?;
            // Arm, then poll once more: a completion that arrived before the arming raises no
            // event (ibv_req_notify_cq(3)).
            self.ctx
                .req_notify_cq(&entry.raw, false)
                .map_err(|e| VerbsError::PollCq {
                    cq: cq.index(),
                    cause: os(e),
                })?;
            drop(o);
            drain(&mut got)?;
            let now = Instant::now();
            if got.len() >= n || now >= deadline {
                return Ok(got);
            }
            let o = self.read();
            let entry = o.cq(cq).ok_or(VerbsError::PollCq {
                cq: cq.index(),
                cause: no_such(Object::Cq, cq.index()),
            })?;
            self.ctx
                .wait_cq_event(&entry.channel, (deadline - now).min(WAIT_SLICE))
                .map_err(|e| VerbsError::PollCq {
                    cq: cq.index(),
                    cause: os(e),
                })?;
        }
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::PollCq {
            cq: cq.index(),
            cause,
        };
        let o = self.read();
        let entry = o.cq(cq).ok_or(err(no_such(Object::Cq, cq.index())))?;
        self.ctx
            .req_notify_cq(&entry.raw, solicited_only)
            .map_err(|e| err(os(e)).into())
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, DeviceError> {
        self.check_open()?;
        let err = |cause| VerbsError::CreateSrq {
            pd: pd.index(),
            cause,
        };
        let mut o = self.write();
        let raw_pd = &o.pd(pd).ok_or(err(no_such(Object::Pd, pd.index())))?.raw;
        let mut init = sys::ibv_srq_init_attr {
            attr: translate::srq_attr(attr),
            ..Default::default()
        };
        let raw = self
            .ctx
            .create_srq(raw_pd, &mut init)
            .map_err(|e| err(os(e)))?;
        match o.srqs.insert(SrqEntry { raw, pd }) {
            Ok(h) => Ok(cast(h)),
            Err(entry) => {
                let _ = self
                    .ctx
                    .destroy_srq(entry.raw)
                    .map_err(|(raw, _)| leak(raw));
                Err(err(o.srqs.too_many(Object::Srq)).into())
            }
        }
    }

    fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::ModifySrq {
            srq: srq.index(),
            cause,
        };
        let o = self.read();
        let entry = o.srq(srq).ok_or(err(no_such(Object::Srq, srq.index())))?;
        let mut raw = translate::srq_attr(attr);
        self.ctx
            .modify_srq(&entry.raw, &mut raw, mask.bits())
            .map_err(|e| err(os(e)).into())
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DestroySrq {
            srq: srq.index(),
            cause,
        };
        let mut o = self.write();
        let users = o.qps.values().filter(|q| q.init.srq == Some(srq)).count();
        let entry = o
            .srqs
            .take_unused(cast(srq), Object::Srq, users)
            .map_err(err)?;
        self.ctx.destroy_srq(entry.raw).map_err(|(raw, e)| {
            leak(raw);
            err(os(e)).into()
        })
    }

    fn post_srq_recv(&self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        let o = self.read();
        let entry = o.srq(srq).ok_or(VerbsError::PostSrqRecv {
            srq: srq.index(),
            wr_id: wr.wr_id,
            cause: no_such(Object::Srq, srq.index()),
        })?;
        self.post_recv_batch(
            RecvTarget::Srq(&entry.raw, srq.index()),
            core::slice::from_ref(wr),
        )
        .map_err(|(_, e)| e)
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, DeviceError> {
        self.check_open()?;
        let err = |cause| VerbsError::CreateAh {
            pd: pd.index(),
            cause,
        };
        let mut o = self.write();
        let raw_pd = &o.pd(pd).ok_or(err(no_such(Object::Pd, pd.index())))?.raw;
        let mut raw_attr = translate::ah_attr(attr);
        let raw = self
            .ctx
            .create_ah(raw_pd, &mut raw_attr)
            .map_err(|e| err(os(e)))?;
        match o.ahs.insert(AhEntry { raw, pd }) {
            Ok(h) => Ok(cast(h)),
            Err(entry) => {
                let _ = self.ctx.destroy_ah(entry.raw).map_err(|(raw, _)| leak(raw));
                Err(err(o.ahs.too_many(Object::Ah)).into())
            }
        }
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DestroyAh {
            ah: ah.index(),
            cause,
        };
        let mut o = self.write();
        let entry = o
            .ahs
            .remove(cast(ah))
            .ok_or(err(no_such(Object::Ah, ah.index())))?;
        self.ctx.destroy_ah(entry.raw).map_err(|(raw, e)| {
            leak(raw);
            err(os(e)).into()
        })
    }

    fn create_qp(&self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, DeviceError> {
        self.check_open()?;
        let err = |cause| VerbsError::CreateQp {
            pd: pd.index(),
            cause,
        };
        let mut o = self.write();
        let raw_pd = &o.pd(pd).ok_or(err(no_such(Object::Pd, pd.index())))?.raw;
        let send_cq = &o
            .cq(init.send_cq)
            .ok_or(err(no_such(Object::Cq, init.send_cq.index())))?
            .raw;
        let recv_cq = &o
            .cq(init.recv_cq)
            .ok_or(err(no_such(Object::Cq, init.recv_cq.index())))?
            .raw;
        let srq = match init.srq {
            Some(s) => Some(&o.srq(s).ok_or(err(no_such(Object::Srq, s.index())))?.raw),
            None => None,
        };
        let mut raw_init = translate::qp_init_attr(init);
        sys::Context::qp_init_attr(&mut raw_init, send_cq, recv_cq, srq);
        let raw = self
            .ctx
            .create_qp(raw_pd, &mut raw_init)
            .map_err(|e| err(os(e)))?;
        let qpn = raw.qp_num();
        let mut init = *init;
        init.cap = translate::qp_cap_from(&raw_init.cap);
        o.qps.insert(qpn, QpEntry { raw, pd, init });
        Ok(qpn)
    }

    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), DeviceError> {
        let err = |cause| VerbsError::QueryQp { qpn, cause };
        let o = self.read();
        let entry = o.qps.get(&qpn).ok_or(err(no_such(Object::Qp, qpn)))?;
        // Every attribute but the rate limit: libibverbs' ibv_cmd_query_qp refuses any mask bit
        // at or above IBV_QP_RATE_LIMIT with EOPNOTSUPP (rdma-core libibverbs/cmd.c), and the
        // rate limit is not a queryable attribute (ibv_query_qp(3) lists none).
        let (attr, raw_init) = self
            .ctx
            .query_qp(&entry.raw, QUERY_QP_MASK.bits())
            .map_err(|e| err(os(e)))?;
        let mut init = entry.init;
        init.cap = translate::qp_cap_from(&raw_init.cap);
        init.sq_sig_all = raw_init.sq_sig_all != 0;
        Ok((translate::qp_attr_from(&attr), init))
    }

    fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, DeviceError> {
        let err = |cause| VerbsError::ModifyQp { qpn, cause };
        let o = self.read();
        let entry = o.qps.get(&qpn).ok_or(err(no_such(Object::Qp, qpn)))?;
        let (before, _) = self
            .ctx
            .query_qp(&entry.raw, QpAttrMask::STATE.bits())
            .map_err(|e| err(os(e)))?;
        let from = QpState::from_ibv(before.qp_state).unwrap_or(QpState::Err);
        let mut raw = translate::qp_attr(attr);
        self.ctx
            .modify_qp(&entry.raw, &mut raw, mask.bits())
            .map_err(|e| err(os(e)))?;
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        Ok(ModifyOutcome { from, to })
    }

    fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        let err = |cause| VerbsError::DestroyQp { qpn, cause };
        let mut o = self.write();
        let entry = o.qps.remove(&qpn).ok_or(err(no_such(Object::Qp, qpn)))?;
        match self.ctx.destroy_qp(entry.raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                o.qps.insert(
                    qpn,
                    QpEntry {
                        raw,
                        pd: entry.pd,
                        init: entry.init,
                    },
                );
                Err(err(os(e)).into())
            }
        }
    }

    fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<(), DeviceError> {
        self.post_send_list(qpn, core::slice::from_ref(wr))
            .map_err(|(_, e)| e)
    }

    fn post_send_list(&self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, DeviceError)> {
        let o = self.read();
        let Some(qp) = o.qps.get(&qpn) else {
            let wr_id = wrs.first().map_or(0, |w| w.wr_id);
            return Err((0, post_send_err(qpn, wr_id, no_such(Object::Qp, qpn))));
        };
        for (k, chunk) in wrs.chunks(WR_BATCH).enumerate() {
            self.post_send_batch(&o, qp, qpn, chunk)
                .map_err(|(i, e)| (k * WR_BATCH + i, e))?;
        }
        Ok(())
    }

    fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), DeviceError> {
        self.post_recv_list(qpn, core::slice::from_ref(wr))
            .map_err(|(_, e)| e)
    }

    fn post_recv_list(&self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, DeviceError)> {
        let o = self.read();
        let Some(qp) = o.qps.get(&qpn) else {
            let wr_id = wrs.first().map_or(0, |w| w.wr_id);
            let cause = no_such(Object::Qp, qpn);
            return Err((0, VerbsError::PostRecv { qpn, wr_id, cause }.into()));
        };
        for (k, chunk) in wrs.chunks(WR_BATCH).enumerate() {
            self.post_recv_batch(RecvTarget::Qp(&qp.raw, qpn), chunk)
                .map_err(|(i, e)| (k * WR_BATCH + i, e))?;
        }
        Ok(())
    }

    fn poll_event(&self) -> Option<AsyncEvent> {
        let o = self.read();
        loop {
            let raw = self.ctx.poll_async_event()?;
            let cq_of = |addr: usize| {
                o.cqs
                    .iter()
                    .find(|(_, c)| c.raw.addr() == addr)
                    .map(|(h, _)| cast(h))
            };
            let srq_of = |addr: usize| {
                o.srqs
                    .iter()
                    .find(|(_, s)| s.raw.addr() == addr)
                    .map(|(h, _)| cast(h))
            };
            if let Some(e) = translate::async_event(&raw, cq_of, srq_of) {
                return Some(e);
            }
        }
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let o = self.read();
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        for qp in o.qps.values() {
            let mut raw = translate::qp_attr(&err);
            // A QP the HCA already moved to ERR, or one in RESET (which has nothing to
            // flush), may refuse; nothing is left to do for it either way.
            let _ = self
                .ctx
                .modify_qp(&qp.raw, &mut raw, QpAttrMask::STATE.bits());
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library that cannot be loaded is one clear line naming the device and the loader's
    /// reason.
    #[test]
    fn missing_library_is_a_clear_error() {
        let e = IbvDevice::open_with_library("libibverbs-absent-for-this-test.so.1", "rxe0")
            .expect_err("no such library");
        let text = e.to_string();
        assert!(matches!(e, DeviceError::Backend { .. }), "{e:?}");
        assert!(text.starts_with("device verbs:rxe0: cannot load"), "{text}");
        assert!(
            text.contains("libibverbs-absent-for-this-test.so.1"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }

    /// Asking for a device that does not exist fails cleanly whatever this machine has: no
    /// libibverbs (cannot load), no RDMA in the kernel (cannot list / none found), or devices
    /// that have other names (listed).
    #[test]
    fn missing_device_is_a_clear_error() {
        let e = IbvDevice::open("no-such-device9").expect_err("no such device");
        let text = e.to_string();
        assert!(matches!(e, DeviceError::Backend { .. }), "{e:?}");
        assert!(text.starts_with("device verbs:no-such-device9: "), "{text}");
        let known = [
            "cannot load",
            "cannot list RDMA devices",
            "no RDMA device found",
            "no RDMA device of that name",
            "ibv_get_device_list",
        ];
        assert!(known.iter().any(|k| text.contains(k)), "{text}");
        assert!(!text.contains('\n'), "{text}");
        // The enumeration agrees: whatever it lists, that name is not among them.
        if let Ok(names) = device_names() {
            assert!(!names.iter().any(|n| n == "no-such-device9"));
        }
    }

    /// query_qp asks for every queryable attribute and no bit libibverbs refuses
    /// (ibv_cmd_query_qp: EOPNOTSUPP for IBV_QP_RATE_LIMIT = 1 << 25 and above).
    #[test]
    fn query_qp_mask_stays_below_rate_limit() {
        assert!(QUERY_QP_MASK.bits() < 1 << 25);
        assert!(!QUERY_QP_MASK.contains(QpAttrMask::RATE_LIMIT));
        for m in [
            QpAttrMask::STATE,
            QpAttrMask::ACCESS_FLAGS,
            QpAttrMask::AV,
            QpAttrMask::ALT_PATH,
            QpAttrMask::DEST_QPN,
            QpAttrMask::MAX_DEST_RD_ATOMIC,
        ] {
            assert!(QUERY_QP_MASK.contains(m), "{m:?}");
        }
    }

    /// A library errno passes through the verbs error unchanged, with its text.
    #[test]
    fn os_errno_passes_through() {
        let e = DeviceError::from(VerbsError::CreateQp {
            pd: 1,
            cause: os(libc::EOPNOTSUPP),
        });
        assert_eq!(e.errno(), Some(libc::EOPNOTSUPP));
        let text = e.to_string();
        assert!(text.starts_with("create_qp in PD 1: "), "{text}");
        assert!(text.contains("not supported"), "{text}");
    }

    /// Chains link each WR to the next and end with a null pointer.
    #[test]
    fn chains_link_in_order() {
        let mut wrs = [sys::ibv_recv_wr::default(); 3];
        link_chain(&mut wrs, |w, n| w.next = n);
        let second: *mut sys::ibv_recv_wr = &mut wrs[1];
        let third: *mut sys::ibv_recv_wr = &mut wrs[2];
        assert_eq!(wrs[0].next, second);
        assert_eq!(wrs[1].next, third);
        assert!(wrs[2].next.is_null());
    }

    /// Handles of one table re-typed keep index and generation.
    #[test]
    fn handle_cast_keeps_identity() {
        let h: Handle<PdEntry> = Handle::from_raw(7, 0x1234);
        let p: PdHandle = cast(h);
        assert_eq!((p.index(), p.generation()), (7, 0x1234));
    }
}
