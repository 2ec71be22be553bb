//! The device context: every verbs object of one software HCA and the rules that tie them.
//!
//! [`Context`] plays the part of `struct ibv_context` (ibv_open_device(3)): it owns the device and
//! port attributes and the tables of PDs, MRs, CQs, SRQs, AHs and QPs, and it implements the verbs
//! that create, modify and destroy them. It enforces the cross-object rules: objects are created
//! in an existing PD, a QP's CQs and SRQ must exist, a PD / CQ / SRQ in use cannot be destroyed
//! (`EBUSY`), an AH used on a UD QP must share its PD. It also records asynchronous events.
//!
//! The transport engine (requester, responder, completer) owns the send queues and the packet
//! state; it builds on the context: [`Context::validate_send_wr`] before queueing a WR,
//! [`Context::mrs`] for lkey / rkey checks, [`Context::push_completion`] for CQEs,
//! [`Context::qp_mut`] and [`Context::consume_srq_wqe`] for receive WQEs,
//! [`Context::qp_set_error`] and [`Context::qp_sq_drained`] for HCA-driven state changes.

use alloc::collections::VecDeque;

use crate::verbs::ah::{AddressHandle, AhAttr, AhHandle};
use crate::verbs::cq::{CompletionQueue, CqHandle};
use crate::verbs::device::{Device, DeviceAttr, PortAttr, PortState};
use crate::verbs::error::{Cause, KeyError, Object, VerbsError};
use crate::verbs::event::{AsyncEvent, AsyncEventType, EventElement};
use crate::verbs::gid::GidEntry;
use crate::verbs::mr::{AccessFlags, MemoryRegion, MrTable};
use crate::verbs::pd::{Pd, PdHandle};
use crate::verbs::qp::{
    no_such_qp, ModifyOutcome, Qp, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, MAX_QPN,
    MAX_QPS, MIN_QPN,
};
use crate::verbs::random::RandomSource;
use crate::verbs::srq::{Srq, SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::table::{KeyedTable, ObjectTable};
use crate::verbs::wc::WorkCompletion;
use crate::verbs::wr::{RecvWr, SendWr, SendWrInfo};

/// Most async events kept unread; older events are dropped beyond it and counted
/// ([`Context::events_lost`]).
pub const MAX_PENDING_EVENTS: usize = 4096;

fn no_such(object: Object, id: u32) -> Cause {
    Cause::NoSuchObject { object, id }
}

/// A software HCA's verbs context.
pub struct Context {
    device: Device,
    pds: ObjectTable<Pd>,
    mrs: MrTable,
    cqs: ObjectTable<CompletionQueue>,
    srqs: ObjectTable<Srq>,
    ahs: ObjectTable<AddressHandle>,
    qps: KeyedTable<Qp>,
    /// Live RC and UC QPs (the ones that share a device's window budget).
    connected_qps: u32,
    events: VecDeque<AsyncEvent>,
    events_lost: u64,
    random: alloc::boxed::Box<dyn RandomSource>,
}

impl Context {
    /// Fixes the QPN bits of `mask` to `value` for QPs created from now on (the rest stay random);
    /// with bits fixed, at most 1/16 of the remaining QPN space is live at once
    /// (`ibv_create_qp` then fails as when the table is full). See
    /// [`crate::link::udp::share`] for the shared-device use.
    pub fn set_qpn_prefix(&mut self, mask: u32, value: u32) {
        self.qps.set_fixed(mask, value);
    }

    /// A context for `device`, with no objects, drawing MR keys and QPNs from `random` (the
    /// operating system's random source, [`OsRandom`](crate::verbs::random::OsRandom), in every
    /// device of this crate; see [`crate::verbs::random`]). PD, CQ, SRQ and AH indices start at 1;
    /// QPNs are random in [`MIN_QPN`] ..= [`MAX_QPN`], MR keys random nonzero 32-bit values.
    pub fn new(device: Device, random: alloc::boxed::Box<dyn RandomSource>) -> Self {
        let a = &device.attr;
        Context {
            pds: ObjectTable::new(1, a.max_pd),
            mrs: MrTable::new(a.max_mr, a.max_mr_size),
            cqs: ObjectTable::new(1, a.max_cq),
            srqs: ObjectTable::new(1, a.max_srq),
            ahs: ObjectTable::new(1, a.max_ah),
            qps: KeyedTable::new(a.max_qp.min(MAX_QPS), MIN_QPN, MAX_QPN),
            connected_qps: 0,
            events: VecDeque::new(),
            events_lost: 0,
            random,
            device,
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// ibv_query_device(3).
    pub fn query_device(&self) -> &DeviceAttr {
        &self.device.attr
    }

    /// ibv_query_port(3).
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`] with [`Cause::NoSuchObject`] for a bad port number.
    pub fn query_port(&self, port: u8) -> Result<&PortAttr, VerbsError> {
        self.device
            .check_port(port)
            .map(|p| &p.attr)
            .map_err(|cause| VerbsError::QueryPort { port, cause })
    }

    /// ibv_query_gid(3) / ibv_query_gid_ex(3): the GID table entry at `index`.
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`]: bad port, or no entry at `index`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, VerbsError> {
        let p = self
            .device
            .check_port(port)
            .map_err(|cause| VerbsError::QueryPort { port, cause })?;
        p.gids.get(index).copied().ok_or(VerbsError::QueryPort {
            port,
            cause: no_such(Object::Gid, index),
        })
    }

    /// ibv_query_pkey(3): the P_Key at `index`.
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`]: bad port, or no P_Key at `index`.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16, VerbsError> {
        let p = self
            .device
            .check_port(port)
            .map_err(|cause| VerbsError::QueryPort { port, cause })?;
        p.pkeys.get(index).ok_or(VerbsError::QueryPort {
            port,
            cause: no_such(Object::Pkey, index.into()),
        })
    }

    /// Adds a GID table entry (the link layer does this as addresses appear) and records
    /// `IBV_EVENT_GID_CHANGE`. Returns the entry's index.
    ///
    /// # Errors
    /// [`VerbsError::ModifyGid`]: bad port, zero GID, full table.
    pub fn add_gid(&mut self, port: u8, entry: GidEntry) -> Result<u32, VerbsError> {
        let err = |cause| VerbsError::ModifyGid { port, cause };
        let p = self
            .device
            .port_mut(port)
            .ok_or(err(no_such(Object::Port, port.into())))?;
        let had = p.gids.find(&entry);
        let index = p.gids.add(entry).map_err(err)?;
        if had.is_none() {
            self.record_event(AsyncEventType::GidChange, EventElement::Port(port));
        }
        Ok(index)
    }

    /// Removes a GID table entry and records `IBV_EVENT_GID_CHANGE`. Existing AHs keep the
    /// source GID they resolved at creation; new ones cannot use the index.
    ///
    /// # Errors
    /// [`VerbsError::ModifyGid`]: bad port, empty entry.
    pub fn remove_gid(&mut self, port: u8, index: u32) -> Result<GidEntry, VerbsError> {
        let err = |cause| VerbsError::ModifyGid { port, cause };
        let p = self
            .device
            .port_mut(port)
            .ok_or(err(no_such(Object::Port, port.into())))?;
        let entry = p.gids.remove(index).map_err(err)?;
        self.record_event(AsyncEventType::GidChange, EventElement::Port(port));
        Ok(entry)
    }

    /// Sets a port's logical state (the link layer reports link up / down) and records
    /// `IBV_EVENT_PORT_ACTIVE` on becoming active or `IBV_EVENT_PORT_ERR` on leaving it.
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`] for a bad port number.
    pub fn set_port_state(&mut self, port: u8, state: PortState) -> Result<(), VerbsError> {
        let p = self.device.port_mut(port).ok_or(VerbsError::QueryPort {
            port,
            cause: no_such(Object::Port, port.into()),
        })?;
        let was_active = p.attr.state == PortState::Active;
        p.attr.state = state;
        let active = state == PortState::Active;
        if active && !was_active {
            self.record_event(AsyncEventType::PortActive, EventElement::Port(port));
        } else if was_active && !active {
            self.record_event(AsyncEventType::PortErr, EventElement::Port(port));
        }
        Ok(())
    }

    // ---- protection domains ----

    /// ibv_alloc_pd(3).
    ///
    /// # Errors
    /// [`VerbsError::AllocPd`] with [`Cause::TooManyObjects`] beyond `max_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdHandle, VerbsError> {
        self.pds
            .insert(Pd::default())
            .map_err(|_| VerbsError::AllocPd {
                cause: self.pds.too_many(Object::Pd),
            })
    }

    /// ibv_dealloc_pd(3).
    ///
    /// # Errors
    /// [`VerbsError::DeallocPd`]: [`Cause::NoSuchObject`]; [`Cause::InUse`] (`EBUSY`) while MRs,
    /// QPs, SRQs or AHs belong to it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbsError> {
        let err = |cause| VerbsError::DeallocPd {
            pd: pd.index(),
            cause,
        };
        let users = self.pds.get(pd).map_or(0, |p| p.users as usize);
        self.pds.take_unused(pd, Object::Pd, users).map_err(err)?;
        Ok(())
    }

    /// The PD a handle names.
    pub fn pd(&self, pd: PdHandle) -> Option<&Pd> {
        self.pds.get(pd)
    }

    fn pd_ref(&mut self, pd: PdHandle, delta: i32) {
        if let Some(p) = self.pds.get_mut(pd) {
            p.users = p.users.saturating_add_signed(delta);
        }
    }

    // ---- memory regions ----

    /// ibv_reg_mr(3): registers `length` bytes at `addr` (I/O virtual address = `addr`).
    ///
    /// # Errors
    /// [`VerbsError::RegMr`]: unknown PD, and the errors of [`MrTable::register`].
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<&MemoryRegion, VerbsError> {
        self.reg_mr_iova(pd, addr, length, addr, access)
    }

    /// ibv_reg_mr_iova(3): registers `length` bytes at `addr`, addressed as `iova`.
    ///
    /// # Errors
    /// [`VerbsError::RegMr`]: unknown PD, and the errors of [`MrTable::register`].
    pub fn reg_mr_iova(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        iova: u64,
        access: AccessFlags,
    ) -> Result<&MemoryRegion, VerbsError> {
        let err = |cause| VerbsError::RegMr {
            pd: pd.index(),
            cause,
        };
        if self.pds.get(pd).is_none() {
            return Err(err(no_such(Object::Pd, pd.index())));
        }
        let lkey = self
            .mrs
            .register(pd, addr, length, iova, access, &mut *self.random)
            .map_err(err)?
            .lkey();
        self.pd_ref(pd, 1);
        Ok(self.mrs.lookup_lkey(lkey).expect("just registered"))
    }

    /// ibv_dereg_mr(3): both keys stop working at once.
    ///
    /// # Errors
    /// [`VerbsError::DeregMr`] with [`Cause::NoSuchObject`] for an unknown lkey.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        let mr = self
            .mrs
            .deregister(lkey)
            .map_err(|cause| VerbsError::DeregMr { lkey, cause })?;
        self.pd_ref(mr.pd(), -1);
        Ok(())
    }

    /// The MR table, for the engine's O(1) lkey / rkey checks.
    pub fn mrs(&self) -> &MrTable {
        &self.mrs
    }

    /// The HCA invalidates a key on behalf of a QP of `pd`: a LOCAL_INV WR or a received SEND
    /// with Invalidate (IBTA vol. 1 §10.6.5). See [`MrTable::invalidate`].
    ///
    /// # Errors
    /// As [`MrTable::invalidate`].
    pub fn invalidate_mr_key(&mut self, pd: PdHandle, key: u32) -> Result<(), KeyError> {
        self.mrs.invalidate(pd, key)
    }

    /// The HCA counts a received packet dropped for a bad Q_Key (`qkey`) or P_Key in the port's
    /// `qkey_viol_cntr` / `bad_pkey_cntr` (ibv_query_port(3); IBTA vol. 1 §14.2.5.6), saturating.
    pub fn count_port_violation(&mut self, qkey: bool) {
        let attr = &mut self.device.port.attr;
        let counter = if qkey {
            &mut attr.qkey_viol_cntr
        } else {
            &mut attr.bad_pkey_cntr
        };
        *counter = counter.saturating_add(1);
    }

    // ---- completion queues ----

    /// ibv_create_cq(3): a CQ of at least `cqe` entries.
    ///
    /// # Errors
    /// [`VerbsError::CreateCq`]: the errors of [`CompletionQueue::new`], [`Cause::TooManyObjects`].
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle, VerbsError> {
        let err = |cause| VerbsError::CreateCq { cqe, cause };
        let cq = CompletionQueue::new(cqe, self.device.attr.max_cqe).map_err(err)?;
        self.cqs
            .insert(cq)
            .map_err(|_| err(self.cqs.too_many(Object::Cq)))
    }

    /// ibv_resize_cq(3). Returns the new capacity.
    ///
    /// # Errors
    /// [`VerbsError::ResizeCq`]: unknown CQ, the errors of [`CompletionQueue::resize`].
    pub fn resize_cq(&mut self, cq: CqHandle, cqe: u32) -> Result<u32, VerbsError> {
        let max_cqe = self.device.attr.max_cqe;
        let err = |cause| VerbsError::ResizeCq {
            cq: cq.index(),
            cause,
        };
        let c = self
            .cqs
            .get_mut(cq)
            .ok_or(err(no_such(Object::Cq, cq.index())))?;
        c.resize(cqe, max_cqe).map_err(err)?;
        Ok(c.capacity())
    }

    /// ibv_destroy_cq(3).
    ///
    /// # Errors
    /// [`VerbsError::DestroyCq`]: unknown CQ; [`Cause::InUse`] (`EBUSY`) while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbsError> {
        let err = |cause| VerbsError::DestroyCq {
            cq: cq.index(),
            cause,
        };
        let users = self.cqs.get(cq).map_or(0, |c| c.users as usize);
        self.cqs.take_unused(cq, Object::Cq, users).map_err(err)?;
        Ok(())
    }

    /// The CQ a handle names.
    pub fn cq(&self, cq: CqHandle) -> Option<&CompletionQueue> {
        self.cqs.get(cq)
    }

    /// Mutable form of [`Self::cq`].
    pub fn cq_mut(&mut self, cq: CqHandle) -> Option<&mut CompletionQueue> {
        self.cqs.get_mut(cq)
    }

    /// ibv_poll_cq(3): moves up to `out.len()` completions into `out`; returns how many.
    ///
    /// # Errors
    /// [`VerbsError::PollCq`] for an unknown CQ.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        let c = self.cqs.get_mut(cq).ok_or(VerbsError::PollCq {
            cq: cq.index(),
            cause: no_such(Object::Cq, cq.index()),
        })?;
        Ok(c.poll_into(out))
    }

    /// ibv_req_notify_cq(3).
    ///
    /// # Errors
    /// [`VerbsError::PollCq`] for an unknown CQ.
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError> {
        let c = self.cqs.get_mut(cq).ok_or(VerbsError::PollCq {
            cq: cq.index(),
            cause: no_such(Object::Cq, cq.index()),
        })?;
        c.req_notify(solicited_only);
        Ok(())
    }

    /// The HCA queues a completion. Returns whether a completion event is due (the CQ was
    /// armed). On overrun the CQ enters its error state and, the first time, `IBV_EVENT_CQ_ERR`
    /// is recorded; the caller then moves the affected QP to ERR.
    ///
    /// # Errors
    /// [`VerbsError::PushCompletion`]: unknown CQ, or [`Cause::CqOverrun`].
    pub fn push_completion(
        &mut self,
        cq: CqHandle,
        wc: WorkCompletion,
        solicited: bool,
    ) -> Result<bool, VerbsError> {
        let err = |cause| VerbsError::PushCompletion {
            cq: cq.index(),
            cause,
        };
        let c = self
            .cqs
            .get_mut(cq)
            .ok_or(err(no_such(Object::Cq, cq.index())))?;
        let was_overrun = c.is_overrun();
        match c.push(wc, solicited) {
            Ok(fire) => Ok(fire),
            Err(cause) => {
                if !was_overrun {
                    self.record_event(AsyncEventType::CqErr, EventElement::Cq(cq));
                }
                Err(err(cause))
            }
        }
    }

    // ---- shared receive queues ----

    /// ibv_create_srq(3).
    ///
    /// # Errors
    /// [`VerbsError::CreateSrq`]: unknown PD, the errors of [`Srq::new`],
    /// [`Cause::TooManyObjects`].
    pub fn create_srq(&mut self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, VerbsError> {
        let err = |cause| VerbsError::CreateSrq {
            pd: pd.index(),
            cause,
        };
        if self.pds.get(pd).is_none() {
            return Err(err(no_such(Object::Pd, pd.index())));
        }
        let srq = Srq::new(pd, attr, &self.device.attr).map_err(err)?;
        let h = self
            .srqs
            .insert(srq)
            .map_err(|_| err(self.srqs.too_many(Object::Srq)))?;
        self.pd_ref(pd, 1);
        Ok(h)
    }

    /// ibv_modify_srq(3).
    ///
    /// # Errors
    /// [`VerbsError::ModifySrq`]: unknown SRQ, the errors of [`Srq::modify`].
    pub fn modify_srq(
        &mut self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        let err = |cause| VerbsError::ModifySrq {
            srq: srq.index(),
            cause,
        };
        let s = self
            .srqs
            .get_mut(srq)
            .ok_or(err(no_such(Object::Srq, srq.index())))?;
        s.modify(attr, mask, &self.device.attr).map_err(err)
    }

    /// ibv_query_srq(3).
    ///
    /// # Errors
    /// [`VerbsError::ModifySrq`] for an unknown SRQ.
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr, VerbsError> {
        self.srqs
            .get(srq)
            .map(Srq::query)
            .ok_or(VerbsError::ModifySrq {
                srq: srq.index(),
                cause: no_such(Object::Srq, srq.index()),
            })
    }

    /// ibv_destroy_srq(3).
    ///
    /// # Errors
    /// [`VerbsError::DestroySrq`]: unknown SRQ; [`Cause::InUse`] (`EBUSY`) while a QP uses it.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        let err = |cause| VerbsError::DestroySrq {
            srq: srq.index(),
            cause,
        };
        let users = self.srqs.get(srq).map_or(0, |s| s.users as usize);
        let s = self
            .srqs
            .take_unused(srq, Object::Srq, users)
            .map_err(err)?;
        self.pd_ref(s.pd(), -1);
        Ok(())
    }

    /// ibv_post_srq_recv(3) for one WR; nothing is queued on error.
    ///
    /// # Errors
    /// [`VerbsError::PostSrqRecv`]: unknown SRQ, the errors of [`Srq::post_recv`].
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        let max_msg_sz = self.device.port.attr.max_msg_sz;
        let err = |cause| VerbsError::PostSrqRecv {
            srq: srq.index(),
            wr_id: wr.wr_id,
            cause,
        };
        let s = self
            .srqs
            .get_mut(srq)
            .ok_or(err(no_such(Object::Srq, srq.index())))?;
        s.post_recv(wr, max_msg_sz).map_err(err)
    }

    /// The SRQ a handle names.
    pub fn srq(&self, srq: SrqHandle) -> Option<&Srq> {
        self.srqs.get(srq)
    }

    /// Mutable form of [`Self::srq`].
    pub fn srq_mut(&mut self, srq: SrqHandle) -> Option<&mut Srq> {
        self.srqs.get_mut(srq)
    }

    /// The responder takes the oldest WQE of an SRQ (after reading it with [`Srq::front`]).
    /// Records `IBV_EVENT_SRQ_LIMIT_REACHED` when this drops the SRQ below its armed limit.
    /// Returns the WQE's `wr_id`, `None` if the SRQ is empty or unknown.
    pub fn consume_srq_wqe(&mut self, srq: SrqHandle) -> Option<u64> {
        let pop = self.srqs.get_mut(srq)?.pop()?;
        if pop.limit_reached {
            self.record_event(AsyncEventType::SrqLimitReached, EventElement::Srq(srq));
        }
        Some(pop.wr_id)
    }

    // ---- address handles ----

    /// ibv_create_ah(3).
    ///
    /// # Errors
    /// [`VerbsError::CreateAh`]: unknown PD, the errors of [`AhAttr::check`],
    /// [`Cause::TooManyObjects`].
    pub fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, VerbsError> {
        let err = |cause| VerbsError::CreateAh {
            pd: pd.index(),
            cause,
        };
        if self.pds.get(pd).is_none() {
            return Err(err(no_such(Object::Pd, pd.index())));
        }
        let ah = AddressHandle::new(pd, *attr, &self.device).map_err(err)?;
        let h = self
            .ahs
            .insert(ah)
            .map_err(|_| err(self.ahs.too_many(Object::Ah)))?;
        self.pd_ref(pd, 1);
        Ok(h)
    }

    /// ibv_destroy_ah(3).
    ///
    /// # Errors
    /// [`VerbsError::DestroyAh`] for an unknown AH.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        let a = self.ahs.remove(ah).ok_or(VerbsError::DestroyAh {
            ah: ah.index(),
            cause: no_such(Object::Ah, ah.index()),
        })?;
        self.pd_ref(a.pd(), -1);
        Ok(())
    }

    /// The AH a handle names.
    pub fn ah(&self, ah: AhHandle) -> Option<&AddressHandle> {
        self.ahs.get(ah)
    }

    // ---- queue pairs ----

    /// ibv_create_qp(3): a QP in RESET. Returns its QPN.
    ///
    /// # Errors
    /// [`VerbsError::CreateQp`]: unknown PD, CQ or SRQ; the errors of [`Qp::new`];
    /// [`Cause::TooManyObjects`] beyond `max_qp`.
    pub fn create_qp(&mut self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, VerbsError> {
        let err = |cause| VerbsError::CreateQp {
            pd: pd.index(),
            cause,
        };
        if self.pds.get(pd).is_none() {
            return Err(err(no_such(Object::Pd, pd.index())));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if self.cqs.get(cq).is_none() {
                return Err(err(no_such(Object::Cq, cq.index())));
            }
        }
        if let Some(srq) = init.srq {
            if self.srqs.get(srq).is_none() {
                return Err(err(no_such(Object::Srq, srq.index())));
            }
        }
        let too_many = Cause::TooManyObjects {
            object: Object::Qp,
            max: self.qps.max(),
        };
        let device = &self.device;
        let (qpn, _) = self
            .qps
            .insert(&mut *self.random, |qpn, _| Qp::new(qpn, pd, init, device))
            .map_err(err)?
            .ok_or(err(too_many))?;
        if init.qp_type != QpType::Ud {
            self.connected_qps += 1;
        }
        self.pd_ref(pd, 1);
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.cqs.get_mut(cq) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq.and_then(|srq| self.srqs.get_mut(srq)) {
            s.users += 1;
        }
        Ok(qpn)
    }

    /// ibv_modify_qp(3); on error the QP is unchanged.
    ///
    /// # Errors
    /// [`VerbsError::ModifyQp`]: unknown QPN, the errors of [`Qp::modify`].
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, VerbsError> {
        let err = |cause| VerbsError::ModifyQp { qpn, cause };
        let qp = self.qps.get_mut(qpn).ok_or(err(no_such_qp(qpn)))?;
        qp.modify(attr, mask, &self.device).map_err(err)
    }

    /// ibv_query_qp(3): all attributes and the creation attributes.
    ///
    /// # Errors
    /// [`VerbsError::QueryQp`] for an unknown QPN.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), VerbsError> {
        self.qp(qpn)
            .map(|qp| (qp.query(), qp.init_attr()))
            .ok_or(VerbsError::QueryQp {
                qpn,
                cause: no_such_qp(qpn),
            })
    }

    /// ibv_destroy_qp(3). Posted WRs are discarded without completions.
    ///
    /// # Errors
    /// [`VerbsError::DestroyQp`] for an unknown QPN.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let not_found = VerbsError::DestroyQp {
            qpn,
            cause: no_such_qp(qpn),
        };
        let qp = self.qps.remove(qpn).ok_or(not_found)?;
        if qp.qp_type() != QpType::Ud {
            self.connected_qps -= 1;
        }
        self.pd_ref(qp.pd(), -1);
        for cq in [qp.send_cq(), qp.recv_cq()] {
            if let Some(c) = self.cqs.get_mut(cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq().and_then(|srq| self.srqs.get_mut(srq)) {
            s.users = s.users.saturating_sub(1);
        }
        Ok(())
    }

    /// The QP numbered `qpn`. O(1).
    pub fn qp(&self, qpn: u32) -> Option<&Qp> {
        self.qps.get(qpn)
    }

    /// Mutable form of [`Self::qp`].
    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.qps.get_mut(qpn)
    }

    /// The table slot of the QP numbered `qpn`: a small integer, unique among live QPs and
    /// reused after the QP is destroyed, by which the engine indexes its own per-QP state. O(1).
    pub fn qp_slot(&self, qpn: u32) -> Option<u32> {
        self.qps.slot(qpn)
    }

    /// The QPNs of all QPs, in slot order (not numeric order: QPNs are random).
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.qps.iter().map(|(qpn, _)| qpn)
    }

    /// Live QPs. O(1).
    pub fn qp_count(&self) -> u32 {
        self.qps.len()
    }

    /// Live RC and UC QPs. O(1).
    pub fn connected_qp_count(&self) -> u32 {
        self.connected_qps
    }

    /// Checks one send WR of ibv_post_send(3) before the engine queues it: the QP's state and
    /// [`Qp::validate_send_wr`], and for UD that the address handle exists and shares the QP's PD.
    /// Nothing is queued here; a full send queue (`ENOMEM`) is the engine's check.
    ///
    /// # Errors
    /// [`VerbsError::PostSend`]: unknown QPN or AH, [`Cause::PdMismatch`], and the errors of
    /// [`Qp::validate_send_wr`].
    pub fn validate_send_wr(&self, qpn: u32, wr: &SendWr<'_>) -> Result<SendWrInfo, VerbsError> {
        let err = |cause| VerbsError::PostSend {
            qpn,
            wr_id: wr.wr_id,
            cause,
        };
        let qp = self.qp(qpn).ok_or(err(no_such_qp(qpn)))?;
        let info = qp.validate_send_wr(wr, &self.device).map_err(err)?;
        if let Some(dest) = wr.op.ud_dest() {
            let ah = self
                .ahs
                .get(dest.ah)
                .ok_or(err(no_such(Object::Ah, dest.ah.index())))?;
            if ah.pd() != qp.pd() {
                return Err(err(Cause::PdMismatch {
                    expected: qp.pd().index(),
                    found: ah.pd().index(),
                }));
            }
        }
        Ok(info)
    }

    /// ibv_post_recv(3) for one WR; nothing is queued on error.
    ///
    /// # Errors
    /// [`VerbsError::PostRecv`]: unknown QPN, the errors of [`Qp::post_recv`].
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        let err = |cause| VerbsError::PostRecv {
            qpn,
            wr_id: wr.wr_id,
            cause,
        };
        let qp = self.qps.get_mut(qpn).ok_or(err(no_such_qp(qpn)))?;
        qp.post_recv(wr, &self.device).map_err(err)
    }

    /// The HCA moves a QP to ERR and, if given, records an affiliated async event
    /// (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`). Returns the previous state.
    ///
    /// # Errors
    /// [`VerbsError::ModifyQp`] for an unknown QPN.
    pub fn qp_set_error(
        &mut self,
        qpn: u32,
        event: Option<AsyncEventType>,
    ) -> Result<QpState, VerbsError> {
        let qp = self.qp_mut(qpn).ok_or(VerbsError::ModifyQp {
            qpn,
            cause: no_such_qp(qpn),
        })?;
        let from = qp.enter_error();
        if let Some(event_type) = event {
            self.record_event(event_type, EventElement::Qp(qpn));
        }
        Ok(from)
    }

    /// The engine reports an SQD QP's send queue drained; records `IBV_EVENT_SQ_DRAINED` if the QP
    /// asked for it (`en_sqd_async_notify`).
    ///
    /// # Errors
    /// [`VerbsError::ModifyQp`] for an unknown QPN.
    pub fn qp_sq_drained(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let qp = self.qp_mut(qpn).ok_or(VerbsError::ModifyQp {
            qpn,
            cause: no_such_qp(qpn),
        })?;
        if qp.finish_sq_drain() {
            self.record_event(AsyncEventType::SqDrained, EventElement::Qp(qpn));
        }
        Ok(())
    }

    /// Whether an async event is queued unread ([`Context::poll_event`]).
    pub fn has_pending_events(&self) -> bool {
        !self.events.is_empty()
    }

    // ---- async events ----

    /// Records an async event. Beyond [`MAX_PENDING_EVENTS`] unread events the oldest is dropped
    /// and counted in [`Self::events_lost`].
    pub fn record_event(&mut self, event_type: AsyncEventType, element: EventElement) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            self.events.pop_front();
            self.events_lost += 1;
        }
        self.events.push_back(AsyncEvent {
            event_type,
            element,
        });
    }

    /// The oldest unread async event (ibv_get_async_event(3)).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// How many async events were dropped because too many were unread.
    pub fn events_lost(&self) -> u64 {
        self.events_lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::connect::{self, ConnectAttr};
    use crate::verbs::error::errno;
    use crate::verbs::gid::{Gid, GidType};
    use crate::verbs::qp::{QpCap, QpType};
    use crate::verbs::random::OsRandom;
    use crate::verbs::wc::WcOpcode;
    use crate::verbs::wr::{SendFlags, SendOp, Sge, UdDest};

    fn ctx() -> Context {
        Context::new(
            Device::soft_roce([2, 0, 0, 0, 0, 1], 1500),
            std::boxed::Box::new(OsRandom),
        )
    }

    fn qp_init(cq: CqHandle, qp_type: QpType) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        }
    }

    #[test]
    fn queries() {
        let c = ctx();
        assert_eq!(c.query_device().max_sge, 32);
        assert_eq!(c.query_port(1).unwrap().lid, 0);
        assert_eq!(c.query_port(2).unwrap_err().errno(), errno::EINVAL);
        assert_eq!(c.query_gid(1, 1).unwrap().gid_type, GidType::RoceV2);
        assert!(c.query_gid(1, 5).is_err());
        assert_eq!(c.query_pkey(1, 0), Ok(0xffff));
        assert!(c.query_pkey(1, 1).is_err());
    }

    #[test]
    fn gid_and_port_events() {
        let mut c = ctx();
        let e = GidEntry {
            gid: Gid::from(core::net::Ipv4Addr::new(10, 0, 0, 1)),
            gid_type: GidType::RoceV2,
        };
        assert_eq!(c.add_gid(1, e), Ok(2));
        assert_eq!(c.add_gid(1, e), Ok(2));
        assert_eq!(
            c.poll_event().map(|e| e.event_type),
            Some(AsyncEventType::GidChange)
        );
        assert_eq!(c.poll_event(), None, "re-adding is no change");
        assert_eq!(c.remove_gid(1, 2), Ok(e));
        assert!(c.poll_event().is_some());
        assert!(c.add_gid(3, e).is_err());
        c.set_port_state(1, PortState::Down).unwrap();
        c.set_port_state(1, PortState::Active).unwrap();
        let types: std::vec::Vec<_> = core::iter::from_fn(|| c.poll_event())
            .map(|e| e.event_type)
            .collect();
        assert_eq!(types, [AsyncEventType::PortErr, AsyncEventType::PortActive]);
    }

    #[test]
    fn pd_in_use_is_busy() {
        let mut c = ctx();
        let pd = c.alloc_pd().unwrap();
        let lkey = c
            .reg_mr(pd, 0x1000, 64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .lkey();
        let cq = c.create_cq(4).unwrap();
        let qpn = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        assert_eq!(c.pd(pd).unwrap().users(), 2);
        let e = c.dealloc_pd(pd).unwrap_err();
        assert_eq!(
            e,
            VerbsError::DeallocPd {
                pd: pd.index(),
                cause: Cause::InUse { users: 2 }
            }
        );
        assert_eq!(e.errno(), errno::EBUSY);
        assert_eq!(c.destroy_cq(cq).unwrap_err().errno(), errno::EBUSY);
        c.destroy_qp(qpn).unwrap();
        c.destroy_cq(cq).unwrap();
        c.dereg_mr(lkey).unwrap();
        assert_eq!(c.dereg_mr(lkey).unwrap_err().errno(), errno::EINVAL);
        c.dealloc_pd(pd).unwrap();
        assert!(c.dealloc_pd(pd).is_err(), "stale handle");
        assert!(c.reg_mr(pd, 0, 1, AccessFlags::empty()).is_err());
    }

    #[test]
    fn qp_creation_checks_objects_and_numbers_from_16() {
        let mut c = ctx();
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(4).unwrap();
        let qpn = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        assert!((MIN_QPN..=MAX_QPN).contains(&qpn), "QPN {qpn:#x}");
        assert_eq!(c.qp(qpn).unwrap().qpn(), qpn);
        let ud = c.create_qp(pd, &qp_init(cq, QpType::Ud)).unwrap();
        assert!(
            (MIN_QPN..=MAX_QPN).contains(&ud) && ud != qpn,
            "QPN {ud:#x}"
        );
        assert_eq!(c.qp(ud).unwrap().qpn(), ud);
        let stale = CqHandle::from_raw(cq.index(), cq.generation() + 1);
        assert!(matches!(
            c.create_qp(pd, &qp_init(stale, QpType::Rc)),
            Err(VerbsError::CreateQp {
                cause: Cause::NoSuchObject {
                    object: Object::Cq,
                    ..
                },
                ..
            })
        ));
        let mut i = qp_init(cq, QpType::Rc);
        i.srq = Some(SrqHandle::from_raw(7, 0));
        assert!(c.create_qp(pd, &i).is_err());
        i.srq = None;
        i.cap.max_send_sge = 99;
        assert!(c.create_qp(pd, &i).is_err());
        assert_eq!(c.qpns().count(), 2, "failed creates leave nothing behind");
        assert_eq!(c.cq(cq).unwrap().users(), 4);
        let (attr, init) = c.query_qp(qpn).unwrap();
        assert_eq!(attr.qp_state, QpState::Reset);
        assert_eq!(init.qp_type, QpType::Rc);
        assert!(c.query_qp(999).is_err());
        assert!(c.modify_qp(999, &attr, QpAttrMask::empty()).is_err());
        assert!(c.destroy_qp(999).is_err());
    }

    #[test]
    fn qp_limit() {
        let attr = DeviceAttr {
            max_qp: 2,
            ..DeviceAttr::default()
        };
        let mut c = Context::new(
            Device::new(attr, PortAttr::default()),
            std::boxed::Box::new(OsRandom),
        );
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(4).unwrap();
        c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        let q2 = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        let e = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap_err();
        assert_eq!(e.errno(), errno::ENOMEM);
        c.destroy_qp(q2).unwrap();
        let q3 = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        assert_eq!(
            c.qp(q3).map(Qp::qpn),
            Some(q3),
            "the freed place is used again"
        );
    }

    #[test]
    fn cq_overrun_records_one_event() {
        let mut c = ctx();
        let cq = c.create_cq(1).unwrap();
        let wc = WorkCompletion::success(1, WcOpcode::Send, 16, 0);
        assert_eq!(c.push_completion(cq, wc, false), Ok(false));
        let e = c.push_completion(cq, wc, false).unwrap_err();
        assert_eq!(e.errno(), errno::EBUSY);
        assert!(c.push_completion(cq, wc, false).is_err());
        assert_eq!(
            c.poll_event(),
            Some(AsyncEvent {
                event_type: AsyncEventType::CqErr,
                element: EventElement::Cq(cq)
            })
        );
        assert_eq!(c.poll_event(), None);
        let mut out = [wc; 4];
        assert_eq!(c.poll_cq(cq, &mut out), Ok(1));
        c.req_notify_cq(cq, false).unwrap();
        assert_eq!(c.resize_cq(cq, 10), Ok(15));
    }

    #[test]
    fn srq_flow_and_limit_event() {
        let mut c = ctx();
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(4).unwrap();
        let srq = c
            .create_srq(
                pd,
                &SrqAttr {
                    max_wr: 4,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )
            .unwrap();
        let mut i = qp_init(cq, QpType::Rc);
        i.srq = Some(srq);
        let qpn = c.create_qp(pd, &i).unwrap();
        assert_eq!(c.destroy_srq(srq).unwrap_err().errno(), errno::EBUSY);
        let sg = [Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        }];
        for id in 0..3 {
            c.post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: id,
                    sg_list: &sg,
                },
            )
            .unwrap();
        }
        c.modify_srq(
            srq,
            &SrqAttr {
                srq_limit: 2,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
        assert_eq!(c.srq(srq).unwrap().front().unwrap().wr_id, 0);
        assert_eq!(c.consume_srq_wqe(srq), Some(0));
        assert_eq!(c.poll_event(), None);
        assert_eq!(c.consume_srq_wqe(srq), Some(1));
        assert_eq!(
            c.poll_event().map(|e| e.event_type),
            Some(AsyncEventType::SrqLimitReached)
        );
        assert_eq!(c.query_srq(srq).unwrap().srq_limit, 0);
        assert!(matches!(
            c.post_recv(
                qpn,
                &RecvWr {
                    wr_id: 9,
                    sg_list: &[]
                }
            ),
            Err(VerbsError::PostRecv {
                cause: Cause::WrongState { .. },
                ..
            })
        ));
        c.destroy_qp(qpn).unwrap();
        c.destroy_srq(srq).unwrap();
        assert!(c.query_srq(srq).is_err());
    }

    #[test]
    fn ud_send_needs_an_ah_of_the_same_pd() {
        let mut c = ctx();
        let pd = c.alloc_pd().unwrap();
        let pd2 = c.alloc_pd().unwrap();
        let cq = c.create_cq(4).unwrap();
        let qpn = c.create_qp(pd, &qp_init(cq, QpType::Ud)).unwrap();
        let a = ConnectAttr {
            qp_type: QpType::Ud,
            qkey: 0x11,
            ..ConnectAttr::default()
        };
        connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
            c.modify_qp(qpn, qp, mask).map(|_| ())
        })
        .unwrap();
        let ah_attr = AhAttr {
            dgid: Gid::link_local_from_mac([2, 0, 0, 0, 0, 2]),
            sgid_index: 1,
            ..AhAttr::default()
        };
        let ah = c.create_ah(pd, &ah_attr).unwrap();
        let ah2 = c.create_ah(pd2, &ah_attr).unwrap();
        assert!(c
            .create_ah(
                pd,
                &AhAttr {
                    sgid_index: 9,
                    ..ah_attr
                }
            )
            .is_err());
        let wr = |ah| SendWr {
            wr_id: 1,
            sg_list: &[],
            op: SendOp::UdSend {
                dest: UdDest {
                    ah,
                    remote_qpn: 0x11,
                    remote_qkey: 0x11,
                },
                imm_data: None,
            },
            send_flags: SendFlags::SIGNALED,
        };
        assert!(c.validate_send_wr(qpn, &wr(ah)).is_ok());
        assert!(matches!(
            c.validate_send_wr(qpn, &wr(ah2)),
            Err(VerbsError::PostSend {
                cause: Cause::PdMismatch { .. },
                ..
            })
        ));
        c.destroy_ah(ah).unwrap();
        assert!(matches!(
            c.validate_send_wr(qpn, &wr(ah)),
            Err(VerbsError::PostSend {
                cause: Cause::NoSuchObject {
                    object: Object::Ah,
                    ..
                },
                ..
            })
        ));
        assert!(c.destroy_ah(ah).is_err());
        assert!(c.validate_send_wr(999, &wr(ah2)).is_err());
    }

    #[test]
    fn hca_driven_qp_events() {
        let mut c = ctx();
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(4).unwrap();
        let qpn = c.create_qp(pd, &qp_init(cq, QpType::Rc)).unwrap();
        assert_eq!(
            c.qp_set_error(qpn, Some(AsyncEventType::QpFatal)),
            Ok(QpState::Reset)
        );
        assert_eq!(
            c.poll_event(),
            Some(AsyncEvent {
                event_type: AsyncEventType::QpFatal,
                element: EventElement::Qp(qpn)
            })
        );
        assert!(c.qp_sq_drained(qpn).is_ok());
        assert_eq!(c.poll_event(), None, "not draining: no event");
        assert!(c.qp_set_error(999, None).is_err());
    }

    #[test]
    fn event_queue_is_bounded_and_counts_losses() {
        let mut c = ctx();
        for _ in 0..MAX_PENDING_EVENTS + 3 {
            c.record_event(AsyncEventType::DeviceFatal, EventElement::Device);
        }
        assert_eq!(c.events_lost(), 3);
        assert_eq!(
            core::iter::from_fn(|| c.poll_event()).count(),
            MAX_PENDING_EVENTS
        );
    }
}
