//! RDMA CM for the drop-in `librdmacm.so.1`: rdma-core's `rdma_*` calls (`<rdma/rdma_cma.h>`,
//! librdmacm(7)) over [`hca::rdma_cm::RdmaCm`], living in this library so that the CM IDs use the
//! contexts, PDs and QPs of this `libibverbs.so.1` (one copy of the device state per process).
//!
//! `librdmacm.so` (crate `rdmacm-abi`) exports rdma-core 44's symbols (`RDMACM_1.0` ...
//! `RDMACM_1.3`), each forwarding to the function of the same name with the `softrdmacm_`
//! prefix here, exported in the private version node `IBVERBS_PRIVATE_RDMACM`.
//!
//! * **Devices**: the first call opens every device of the list (as librdmacm does) and keeps
//!   one CM per device; an ID gets its device (`id->verbs`) from `rdma_bind_addr` of a
//!   specific address or from `rdma_resolve_addr`; a wildcard listener listens on every device.
//! * **Driver**: each device's CM is a [`CmService`] (its thread woken by QP1's MADs and the CM's
//!   timers); one more thread per process sleeps in poll(2) on the services' event descriptors
//!   and moves their events to the IDs' channels (so do the calls, for the events they cause).
//! * **Event channels**: `struct rdma_event_channel`'s `fd` is an eventfd in semaphore mode
//!   (eventfd(2)): readable while events are queued, so poll(2) / epoll work on it, and a channel
//!   the program made non-blocking (`fcntl(O_NONBLOCK)`) makes `rdma_get_cm_event` fail with
//!   `EAGAIN`, as rdma-core's does.
//! * **Synchronous IDs** (`rdma_create_id` with a null channel, `rdma_create_ep`): each gets its
//!   own channel and each call waits for its event, as in rdma-core (`ucma_complete`).
//! * **QPs**: `rdma_create_qp` / `rdma_create_qp_ex` make QPs of this library and move them to
//!   INIT (RC) or RTS (UD), as rdma-core does; the IB CM moves a connection's QP to RTR / RTS
//!   itself (REP / RTU), so `rdma_connect` and `rdma_accept` report `ESTABLISHED`.
//!   **External QPs** (an ID without `id->qp`, the QPN in `rdma_conn_param.qp_num`) are the
//!   program's to move, as in librdmacm: the passive side brings its QP to RTS with
//!   `rdma_init_qp_attr` before `rdma_accept`; the active side gets
//!   `RDMA_CM_EVENT_CONNECT_RESPONSE` for the REP, brings its QP up the same way and calls
//!   `rdma_establish`, which sends the RTU (`EINVAL` on an ID with a QP).
//! * **Port spaces**: `RDMA_PS_TCP` (RC), `RDMA_PS_UDP` (UD), `RDMA_PS_IB`
//!   (RC from `rdma_create_id`, or the QP type `rdma_create_ep` is given); the service ID is
//!   `(ps << 16) | port` in every one, as in Linux `cma.c`.
//! * **UD** (`RDMA_PS_UDP`, a UD ID of `RDMA_PS_IB`): `rdma_connect` sends a SIDR_REQ, `rdma_accept` / `rdma_reject`
//!   answer it with a SIDR_REP; `ESTABLISHED` carries `param.ud` (the peer's QPN, Q_Key
//!   `RDMA_UDP_QKEY` and an `ah_attr` to it), as Linux `cma.c` and librdmacm report it; UD QPs
//!   from `rdma_create_qp` go to RTS with that Q_Key (librdmacm `ucma_init_ud_qp`).
//! * **Refused**, with rdma-core's `-1` and errno: `RDMA_PS_IPOIB` (`EOPNOTSUPP`: its Q_Key
//!   is an IPoIB broadcast group's, from the SA, which RoCE has not), an unknown port space
//!   (`EINVAL`), multicast and ECE (`EOPNOTSUPP`), `rdma_create_srq_ex`
//!   (`EOPNOTSUPP`), `rdma_init_qp_attr` for RTR / RTS of an ID without a connection in a
//!   state that has them (`EINVAL`); rsockets (`rsocket`, `rsend`, ...) fail with `ENOSYS`, except `rpoll` /
//!   `rselect` which, as every descriptor is a plain one, are poll(2) / select(2).
// The constants keep rdma_cma.h's names, as bindgen writes them.
#![allow(non_upper_case_globals)]

#[allow(
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    unsafe_op_in_unsafe_fn
)]
mod bindings;

use core::ffi::{c_char, c_int, c_void, CStr};
use core::mem::{size_of, zeroed};
use core::ptr::{self, null_mut};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use hca::ibverbs::ffi::*;
use hca::rdma_cm::{
    CmService, ConnParam, RdmaCmEvent, RdmaCmEventType, RdmaId, RDMA_MAX_RD_ATOMIC, RDMA_UDP_QKEY,
};
use hca::verbs::gid::GidType;
use hca::verbs::qp::{QpAttrMask, QpState};
use hca::verbs::Verbs;

use self::bindings::*;
use crate::ffi::{inner, lock, set_errno};

/// Longest sleep of the thread that moves events to channels: it wakes at once for an event; this
/// only bounds how long a lost wake-up could delay one.
pub const DISPATCH_POLL: Duration = Duration::from_millis(1000);

/// `RDMA_OPTION_ID_TOS` ... `RDMA_OPTION_ID_ACK_TIMEOUT` (rdma_cma.h): accepted; the software
/// HCA has one traffic class and the IB CM's own timeouts.
const OPTION_ID_KNOWN: [c_int; 4] = [0, 1, 2, 3];

/// `IBV_QPT_RC` (verbs.h).
const QPT_RC: u32 = 2;
/// `IBV_QPT_UD` (verbs.h).
const QPT_UD: u32 = 4;

/// One device: its context (opened by this library), default PD and CM.
struct Dev {
    ctx: *mut ibv_context,
    /// The PD of QPs made without one (`rdma_create_ep`, `rdma_create_qp` with a null PD),
    /// allocated on first use.
    pd: *mut ibv_pd,
    svc: Arc<CmService>,
    ips: Vec<IpAddr>,
}

/// The library's state of one `struct rdma_cm_id`.
#[derive(Default)]
struct IdRec {
    /// The device index (`id->verbs`), once bound or resolved.
    dev: Option<usize>,
    /// The CM IDs on the devices: one, or one per device for a wildcard listener.
    rids: Vec<(usize, RdmaId)>,
    /// Made with a null channel: the calls wait for their events on `own_channel`.
    sync: bool,
    /// `rdma_bind_addr`'s address.
    bound: Option<SocketAddr>,
    /// `rdma_create_ep`'s QP attributes of a passive endpoint, for `rdma_get_request`'s ID.
    ep_qp_attr: Option<ibv_qp_init_attr>,
    /// The ID made the default CQs (`ucma_create_cqs`): destroyed with its QP.
    own_cqs: bool,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`'s value: given to the CM when the ID connects or accepts.
    ack_timeout: Option<u8>,
}

struct Global {
    devs: Vec<Dev>,
    /// `struct rdma_cm_id` address -> its state.
    ids: HashMap<usize, IdRec>,
    /// (device, CM ID) -> `struct rdma_cm_id` address.
    by_rid: HashMap<(usize, RdmaId), usize>,
    /// `struct rdma_cm_id` address -> its events handed out and acknowledged; a
    /// `CONNECT_REQUEST` counts on its listener, as in librdmacm (`ucma_complete_event` of the
    /// event's `id_priv`). [`softrdmacm_destroy_id`] waits until they match.
    acks: HashMap<usize, AckCount>,
}

// SAFETY: the raw pointers are of objects this library made and frees under this lock.
unsafe impl Send for Global {}

/// A channel: `struct rdma_event_channel` first (the pointer handed out), then its queue.
#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    q: Arc<ChannelQueue>,
}

/// A channel's descriptor and queue, shared with the threads waiting in
/// [`softrdmacm_get_cm_event`]: a thread that waits while another destroys the channel keeps
/// waiting on the descriptor it entered with (as a `read(2)` of rdma-core's `/dev/infiniband/rdma_cm`
/// descriptor blocked in the kernel does when another thread closes it), instead of reading a
/// freed channel or a descriptor number reused since.
struct ChannelQueue {
    /// eventfd(2) in semaphore mode: one count per event posted. It may count more than the
    /// queue holds (events of a destroyed ID are taken out of the queue, not out of the count:
    /// a waiter that takes such a count finds the queue empty and waits again).
    efd: OwnedFd,
    /// `EventBox` addresses, in posting order.
    queue: Mutex<VecDeque<usize>>,
}

/// Events of one ID handed out by [`softrdmacm_get_cm_event`] and acknowledged by
/// [`softrdmacm_ack_cm_event`] (librdmacm's `events_reported` / `events_completed`).
#[derive(Default, Clone, Copy)]
struct AckCount {
    reported: u64,
    completed: u64,
}

/// An event: `struct rdma_cm_event` first, then the private data it points to.
#[repr(C)]
struct EventBox {
    ev: rdma_cm_event,
    data: Vec<u8>,
}

fn global() -> &'static Mutex<Global> {
    static G: OnceLock<Mutex<Global>> = OnceLock::new();
    G.get_or_init(|| {
        let g = Mutex::new(Global {
            devs: open_devices(),
            ids: HashMap::new(),
            by_rid: HashMap::new(),
            acks: HashMap::new(),
        });
        let services: Vec<Arc<CmService>> = lock(&g).devs.iter().map(|d| d.svc.clone()).collect();
        if !services.is_empty() {
            let _ = std::thread::Builder::new()
                .name("rdmacm-events".into())
                .spawn(move || dispatch(&services));
        }
        g
    })
}

/// Opens every device of the list; those that fail to open are left out.
fn open_devices() -> Vec<Dev> {
    let mut n: c_int = 0;
    let list = crate::ffi::ibv_get_device_list(&mut n);
    let mut devs = Vec::new();
    if list.is_null() {
        return devs;
    }
    for i in 0..n.max(0) as usize {
        // SAFETY: the list has n entries.
        let ctx = unsafe { crate::ffi::ibv_open_device(*list.add(i)) };
        if ctx.is_null() {
            continue;
        }
        // SAFETY: opened just now by this library.
        let verbs = unsafe { inner(ctx) }.verbs.clone();
        let ips = local_ips(verbs.as_ref());
        // A device whose QP1 is not ours (a libibverbs device) has no CM here.
        let Ok(svc) = CmService::start(verbs, crate::config::cm_config()) else {
            continue;
        };
        devs.push(Dev {
            ctx,
            pd: null_mut(),
            svc: Arc::new(svc),
            ips,
        });
    }
    // SAFETY: from ibv_get_device_list.
    unsafe { crate::ffi::ibv_free_device_list(list) };
    devs
}

fn local_ips(v: &dyn Verbs) -> Vec<IpAddr> {
    let len = v.query_port().gid_tbl_len.min(256);
    (0..len)
        .filter_map(|i| v.query_gid(i).ok())
        .filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.is_zero())
        .map(|e| e.gid.to_ip())
        .collect()
}

/// The event thread: sleeps in poll(2) on every service's event descriptor (readable while it
/// has events) and moves the events to their channels.
fn dispatch(services: &[Arc<CmService>]) {
    loop {
        let mut fds: Vec<libc::pollfd> = services
            .iter()
            .map(|s| libc::pollfd {
                fd: s.event_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of its length.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                DISPATCH_POLL.as_millis() as c_int,
            )
        };
        let mut g = lock(global());
        for d in 0..g.devs.len() {
            deliver(&mut g, d);
        }
    }
}

fn to_sockaddr(a: SocketAddr, out: &mut sockaddr_storage) -> socklen_t {
    // SAFETY: sockaddr_storage holds either; all-zero is a valid value of each.
    unsafe {
        *out = zeroed();
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(out as *mut sockaddr_storage).cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as u16;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                size_of::<libc::sockaddr_in>() as socklen_t
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(out as *mut sockaddr_storage).cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as u16;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_scope_id = v6.scope_id();
                s.sin6_flowinfo = v6.flowinfo();
                size_of::<libc::sockaddr_in6>() as socklen_t
            }
        }
    }
}

/// The address at `sa` (AF_INET / AF_INET6), `None` for null or another family.
///
/// # Safety
/// `sa` is null or a `struct sockaddr` of its family's size.
unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
                let port = u16::from_be(s.sin6_port);
                // An IPv4-mapped address is IPv4 on RoCEv2 (IBTA Annex A17.4.1).
                Some(match ip.to_ipv4_mapped() {
                    Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                    None => SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        port,
                        s.sin6_flowinfo,
                        s.sin6_scope_id,
                    )),
                })
            }
            _ => None,
        }
    }
}

/// Writes `src` / `dst` and their GIDs into `id->route.addr`.
///
/// # Safety
/// `id` is a live ID of this library.
unsafe fn set_route(id: *mut rdma_cm_id, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
    // SAFETY: the caller's promise; the unions are plain bytes.
    unsafe {
        let a = &mut (*id).route.addr;
        let ib = a.addr.ibaddr.as_mut();
        if let Some(s) = src {
            to_sockaddr(s, &mut a.__bindgen_anon_1.src_storage);
            ib.sgid.raw = *hca::verbs::gid::Gid::from(s.ip()).as_bytes();
        }
        if let Some(d) = dst {
            to_sockaddr(d, &mut a.__bindgen_anon_2.dst_storage);
            ib.dgid.raw = *hca::verbs::gid::Gid::from(d.ip()).as_bytes();
        }
        ib.pkey = 0xffff_u16.to_be();
    }
}

/// The live channels by address ([`new_channel`] adds, [`softrdmacm_destroy_event_channel`]
/// removes): a second destroy of the same channel is recognised and ignored instead of freeing
/// (and locking) freed memory. Debian 12's perftest 4.5-0.17 does that: after a rejected
/// `rdma_connect` its retry destroys the event channel, then destroys it again on its error path
/// (and calls `rdma_resolve_addr` / `rdma_destroy_id` on the destroyed ID, which fail with
/// `EINVAL` from [`Global::ids`]); the freed channel's mutex then blocked the process until its
/// `timeout`. Lock order: [`global`], then this, then a channel's queue.
fn live_channels() -> MutexGuard<'static, HashMap<usize, Arc<ChannelQueue>>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, Arc<ChannelQueue>>>> = OnceLock::new();
    lock(LIVE.get_or_init(|| Mutex::new(HashMap::new())))
}

/// The queue of `ch` while it is a live channel of this library.
fn channel_queue(ch: *mut rdma_event_channel) -> Option<Arc<ChannelQueue>> {
    live_channels().get(&(ch as usize)).cloned()
}

fn new_channel() -> Option<*mut Channel> {
    // SAFETY: plain eventfd(2).
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return None;
    }
    // SAFETY: just made, owned here.
    let efd = unsafe { OwnedFd::from_raw_fd(fd) };
    let q = Arc::new(ChannelQueue {
        efd,
        queue: Mutex::new(VecDeque::new()),
    });
    let c = Box::into_raw(Box::new(Channel {
        ch: rdma_event_channel { fd },
        q: q.clone(),
    }));
    live_channels().insert(c as usize, q);
    Some(c)
}

/// Queues `ev` on `ch` and makes its descriptor readable once more; an event for a channel
/// that is no longer live (the program destroyed it with IDs still on it) is dropped.
fn post(ch: *mut rdma_event_channel, ev: Box<EventBox>) {
    let Some(q) = channel_queue(ch) else {
        return;
    };
    lock(&q.queue).push_back(Box::into_raw(ev) as usize);
    let one: u64 = 1;
    // SAFETY: an 8-byte write to our eventfd.
    unsafe { libc::write(q.efd.as_raw_fd(), ptr::from_ref(&one).cast(), 8) };
}

/// The ID an event counts on: its listener for `CONNECT_REQUEST`, else its own.
fn ack_key(ev: &rdma_cm_event) -> usize {
    if ev.event == rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST {
        ev.listen_id as usize
    } else {
        ev.id as usize
    }
}

fn event_type(e: RdmaCmEventType) -> rdma_cm_event_type {
    e as u32
}

/// Turns the CM events of device `d` into `struct rdma_cm_event`s on their IDs' channels.
fn deliver(g: &mut Global, d: usize) {
    while let Some(e) = g.devs[d].svc.get_event(Duration::ZERO) {
        deliver_one(g, d, e);
    }
}

fn deliver_one(g: &mut Global, d: usize, e: RdmaCmEvent) {
    let RdmaCmEvent {
        id: rid,
        listen_id,
        event,
        status,
        private_data,
        ud,
        conn,
    } = e;
    let conn_param = conn;
    let (id, listen) = match listen_id {
        Some(l) => {
            let Some(&lid) = g.by_rid.get(&(d, l)) else {
                g.devs[d].svc.destroy_id(rid);
                return;
            };
            // A new ID for the connection request, on the listener's channel.
            // It is not synchronous yet: it shares the listener's channel until
            // rdma_get_request moves it to one of its own.
            let ep_qp_attr = g.ids.get(&lid).and_then(|r| r.ep_qp_attr);
            // SAFETY: a live listener of this library (in `ids`).
            let lp = unsafe { &*(lid as *const rdma_cm_id) };
            // SAFETY: all-zero is a valid rdma_cm_id (null pointers, zero numbers).
            let mut new: Box<rdma_cm_id> = Box::new(unsafe { zeroed() });
            new.verbs = g.devs[d].ctx;
            new.pd = dev_pd(g, d).unwrap_or(null_mut());
            new.channel = lp.channel;
            new.context = lp.context;
            new.ps = lp.ps;
            new.port_num = 1;
            new.qp_type = lp.qp_type;
            let np = Box::into_raw(new);
            let (local, remote) = g.devs[d].svc.addresses(rid).unwrap_or((None, None));
            // SAFETY: just made.
            unsafe { set_route(np, local, remote) };
            g.ids.insert(
                np as usize,
                IdRec {
                    dev: Some(d),
                    rids: vec![(d, rid)],
                    ep_qp_attr,
                    ..IdRec::default()
                },
            );
            g.by_rid.insert((d, rid), np as usize);
            (np as usize, lid)
        }
        None => match g.by_rid.get(&(d, rid)) {
            Some(&id) => (id, 0),
            None => return,
        },
    };
    let idp = id as *mut rdma_cm_id;
    // SAFETY: all-zero is a valid rdma_cm_event.
    let mut ev = Box::new(EventBox {
        ev: unsafe { zeroed() },
        data: private_data,
    });
    ev.ev.id = idp;
    ev.ev.listen_id = listen as *mut rdma_cm_id;
    ev.ev.event = event_type(event);
    ev.ev.status = status;
    if let Some(ud) = ud {
        // The route's GIDs are in the ID (set_route): the AH of ESTABLISHED goes to the peer's.
        // SAFETY: a live ID of this library.
        let (sgid, dgid) = unsafe {
            let ib = (*idp).route.addr.addr.ibaddr.as_ref();
            (ib.sgid.raw, ib.dgid.raw)
        };
        let ctx = g.devs[d].ctx;
        // SAFETY: the ud member of the param union, plain data; an open context.
        unsafe {
            let p = ev.ev.param.ud.as_mut();
            p.private_data = if ev.data.is_empty() {
                ptr::null()
            } else {
                ev.data.as_ptr().cast()
            };
            p.private_data_len = ev.data.len().min(255) as u8;
            p.qp_num = ud.qp_num;
            p.qkey = ud.qkey;
            if event == RdmaCmEventType::Established {
                let a = &mut p.ah_attr;
                a.is_global = 1;
                a.port_num = 1;
                a.grh.dgid.raw = dgid;
                a.grh.sgid_index = crate::ffi::roce_v2_gid_index(ctx, &sgid).unwrap_or(0);
                a.grh.hop_limit = 64;
            }
        }
        // SAFETY: a live ID of this library.
        let ch = unsafe { (*idp).channel };
        if !ch.is_null() {
            post(ch, ev);
        }
        return;
    }
    // SAFETY: the conn member of the param union, plain data.
    unsafe {
        let conn = ev.ev.param.conn.as_mut();
        conn.private_data = if ev.data.is_empty() {
            ptr::null()
        } else {
            ev.data.as_ptr().cast()
        };
        conn.private_data_len = ev.data.len().min(255) as u8;
    }
    // cma.c fills the parameters in CONNECT_REQUEST and the active side's ESTABLISHED; the
    // other events leave them zero.
    if let Some(p) = conn_param {
        // SAFETY: as above.
        let c = unsafe { ev.ev.param.conn.as_mut() };
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.flow_control = u8::from(p.flow_control);
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.srq = u8::from(p.srq);
        c.qp_num = p.qp_num;
    }
    // SAFETY: a live ID of this library.
    let ch = unsafe { (*idp).channel };
    if !ch.is_null() {
        post(ch, ev);
    }
}

/// Runs `f` on device `d`'s CM service, then delivers the events it caused.
fn on_dev<R>(g: &mut Global, d: usize, f: impl FnOnce(&CmService) -> R) -> R {
    let svc = g.devs[d].svc.clone();
    let r = f(&svc);
    deliver(g, d);
    r
}

fn fail<T>(errno: c_int, value: T) -> T {
    set_errno(errno);
    value
}

fn rc(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e, -1),
    }
}

fn errno_of_cm(e: &hca::rdma_cm::RdmaCmError) -> c_int {
    use hca::rdma_cm::RdmaCmError as E;
    match e {
        E::BadState => libc::EINVAL,
        E::PrivateDataTooLong => libc::EINVAL,
        E::InUse => libc::EADDRINUSE,
        E::Unsupported => libc::EOPNOTSUPP,
        E::BadParam => libc::EINVAL,
        E::Cm(hca::cm::CmError::TooMany) => libc::ENOMEM,
        E::Cm(hca::cm::CmError::NoSuchAddress) => libc::EADDRNOTAVAIL,
        E::Cm(_) => libc::EINVAL,
    }
}

// ---------------------------------------------------------------------------------------------
// Event channels and events.

/// rdma_create_event_channel(3): a channel on a pollable descriptor; null with errno on failure.
#[no_mangle]
pub extern "C" fn softrdmacm_create_event_channel() -> *mut rdma_event_channel {
    let _ = global();
    match new_channel() {
        Some(c) => c.cast(),
        None => fail(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE),
            null_mut(),
        ),
    }
}
symver!(softrdmacm_create_event_channel, "IBVERBS_PRIVATE_RDMACM");

/// rdma_destroy_event_channel(3): frees the channel and its unacknowledged events. A pointer
/// that is not a live channel of this library (null, or a channel already destroyed: see
/// `live_channels`) is ignored; the call returns nothing to report it in. A thread waiting in
/// `rdma_get_cm_event` on the channel keeps waiting, as one blocked in rdma-core's `read(2)`
/// of the closed descriptor does (rping's CM thread, which the program never joins).
///
/// # Safety
/// `channel` is from [`softrdmacm_create_event_channel`], with no ID left on it.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_destroy_event_channel(channel: *mut rdma_event_channel) {
    if channel.is_null() {
        return;
    }
    // Under the global lock, as `post` is called: no event is queued on it after this.
    let g = lock(global());
    let Some(q) = live_channels().remove(&(channel as usize)) else {
        return;
    };
    drop(g);
    for e in lock(&q.queue).drain(..) {
        // SAFETY: queued by `post`, never handed out.
        drop(unsafe { Box::from_raw(e as *mut EventBox) });
    }
    // SAFETY: the caller's promise; removed from the live channels above, so this is the one
    // free of it.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
}
symver!(softrdmacm_destroy_event_channel, "IBVERBS_PRIVATE_RDMACM");

/// rdma_get_cm_event(3): the next event of `channel`, waiting for one unless the descriptor is
/// non-blocking (then `EAGAIN`); `EINVAL` for a null argument, `EBADF` for a channel that is
/// not live (destroyed), as a `read(2)` of a closed descriptor. The event counts on its ID (on
/// the listener for `CONNECT_REQUEST`) until [`softrdmacm_ack_cm_event`].
///
/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if channel.is_null() || event.is_null() {
        return fail(libc::EINVAL, -1);
    }
    let Some(q) = channel_queue(channel) else {
        return fail(libc::EBADF, -1);
    };
    loop {
        let mut v: u64 = 0;
        // SAFETY: an 8-byte read from our eventfd (semaphore mode: takes one event).
        let n = unsafe { libc::read(q.efd.as_raw_fd(), ptr::from_mut(&mut v).cast(), 8) };
        if n != 8 {
            let err = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if err == libc::EINTR {
                continue;
            }
            return fail(err, -1);
        }
        // Taken and counted under the global lock, so that `rdma_destroy_id` sees each event of
        // its ID either queued (and discards it) or counted (and waits for its ack).
        let mut g = lock(global());
        let Some(e) = lock(&q.queue).pop_front() else {
            // The count of an event discarded with its ID: wait for the next.
            continue;
        };
        // SAFETY: a queued EventBox, now the caller's; the event is its first field.
        let key = ack_key(unsafe { &(*(e as *const EventBox)).ev });
        g.acks.entry(key).or_default().reported += 1;
        drop(g);
        // SAFETY: the caller's out parameter.
        unsafe { *event = e as *mut rdma_cm_event };
        return 0;
    }
}
symver!(softrdmacm_get_cm_event, "IBVERBS_PRIVATE_RDMACM");

/// Signalled by every acknowledgement, for [`softrdmacm_destroy_id`]'s wait.
static ACKED: std::sync::Condvar = std::sync::Condvar::new();

/// rdma_ack_cm_event(3): frees the event and counts it acknowledged on its ID.
///
/// # Safety
/// `event` is from [`softrdmacm_get_cm_event`], acknowledged once.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return fail(libc::EINVAL, -1);
    }
    // SAFETY: the caller's promise.
    let b = unsafe { Box::from_raw(event.cast::<EventBox>()) };
    let key = ack_key(&b.ev);
    drop(b);
    if let Some(a) = lock(global()).acks.get_mut(&key) {
        a.completed += 1;
    }
    ACKED.notify_all();
    0
}
symver!(softrdmacm_ack_cm_event, "IBVERBS_PRIVATE_RDMACM");

/// rdma_event_str(3): the event's name (`RDMA_CM_EVENT_...`), or "UNKNOWN EVENT".
#[no_mangle]
pub extern "C" fn softrdmacm_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
symver!(softrdmacm_event_str, "IBVERBS_PRIVATE_RDMACM");

/// Waits on a synchronous ID's channel for its next event: 0 when it is `want` with status 0,
/// else -1 with errno (`ECONNREFUSED` for `REJECTED`, `ETIMEDOUT` for `UNREACHABLE`, the
/// negated status otherwise), as rdma-core's `ucma_complete`.
///
/// # Safety
/// `id` is a live synchronous ID.
unsafe fn complete(id: *mut rdma_cm_id, want: rdma_cm_event_type) -> c_int {
    let mut ev: *mut rdma_cm_event = null_mut();
    // SAFETY: a synchronous ID's own channel.
    if unsafe { softrdmacm_get_cm_event((*id).channel, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: just got it.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    // SAFETY: ours.
    unsafe { softrdmacm_ack_cm_event(ev) };
    if kind == want && status == 0 {
        return 0;
    }
    let errno = match kind {
        rdma_cm_event_type_RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
        rdma_cm_event_type_RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
        _ if status < 0 => -status,
        _ => libc::EINVAL,
    };
    fail(errno, -1)
}

fn is_sync(id: *mut rdma_cm_id) -> bool {
    lock(global())
        .ids
        .get(&(id as usize))
        .is_some_and(|r| r.sync)
}

// ---------------------------------------------------------------------------------------------
// IDs and addresses.

/// rdma_create_id(3): `RDMA_PS_TCP` and `RDMA_PS_IB` IDs for RC QPs (REQ / REP / RTU),
/// `RDMA_PS_UDP` IDs for UD QPs (SIDR), as librdmacm's `rdma_create_id` chooses the QP type;
/// `RDMA_PS_IPOIB` fails with `EOPNOTSUPP` (its Q_Key is an IPoIB broadcast group's, which RoCE
/// has not: `cma.c` `cma_set_qkey`), another port space with `EINVAL` (the kernel's
/// `ucma_get_qp_type`). A null `channel` makes a synchronous ID.
///
/// # Safety
/// `channel` is null or a live channel; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    let qp_type = if ps == rdma_port_space_RDMA_PS_UDP {
        QPT_UD
    } else {
        QPT_RC
    };
    // SAFETY: the caller's promise.
    unsafe { create_id(channel, id, context, ps, qp_type) }
}
symver!(softrdmacm_create_id, "IBVERBS_PRIVATE_RDMACM");

/// librdmacm's `rdma_create_id2`: an ID of port space `ps` for QPs of type `qp_type`
/// (`IBV_QPT_RC` or `IBV_QPT_UD`); only `RDMA_PS_IB` takes either (the kernel's
/// `ucma_get_qp_type`; `rdma_create_ep` passes the `rdma_addrinfo`'s `ai_qp_type`).
/// `EINVAL` for another port space or a QP type the port space does not take.
///
/// # Safety
/// As [`softrdmacm_create_id`].
unsafe fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: u32,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL, -1);
    }
    if ps == rdma_port_space_RDMA_PS_IPOIB {
        return fail(libc::EOPNOTSUPP, -1);
    }
    let fits = match ps {
        rdma_port_space_RDMA_PS_TCP => qp_type == QPT_RC,
        rdma_port_space_RDMA_PS_UDP => qp_type == QPT_UD,
        rdma_port_space_RDMA_PS_IB => qp_type == QPT_RC || qp_type == QPT_UD,
        _ => false,
    };
    if !fits {
        return fail(libc::EINVAL, -1);
    }
    let mut g = lock(global());
    let (channel, sync) = if channel.is_null() {
        match new_channel() {
            Some(c) => (c.cast::<rdma_event_channel>(), true),
            None => return fail(libc::EMFILE, -1),
        }
    } else {
        (channel, false)
    };
    // SAFETY: all-zero is a valid rdma_cm_id.
    let mut new: Box<rdma_cm_id> = Box::new(unsafe { zeroed() });
    new.channel = channel;
    new.context = context;
    new.ps = ps;
    new.qp_type = qp_type;
    let p = Box::into_raw(new);
    g.ids.insert(
        p as usize,
        IdRec {
            sync,
            ..IdRec::default()
        },
    );
    // SAFETY: the caller's out parameter.
    unsafe { *id = p };
    0
}

/// rdma_destroy_id(3): forgets the ID, discards its events still queued (a queued
/// `CONNECT_REQUEST` of a listener takes its new ID with it, refused), waits until every event
/// of the ID already handed out is acknowledged (librdmacm's `rdma_destroy_id` waits for
/// `events_completed` to reach the kernel's `events_reported`), then frees it (and a synchronous
/// ID's channel). A program that never acknowledges them waits [`ACK_WAIT`]; the ID is then left
/// allocated (its events still point at it) instead of freed.
///
/// # Safety
/// `id` is a live ID, its QP destroyed.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_destroy_id(id: *mut rdma_cm_id) -> c_int {
    let mut g = lock(global());
    let Some(rec) = g.ids.remove(&(id as usize)) else {
        return fail(libc::EINVAL, -1);
    };
    let mut used = Vec::new();
    for (d, rid) in rec.rids {
        g.by_rid.remove(&(d, rid));
        g.devs[d].svc.destroy_id(rid);
        used.push(g.devs[d].svc.clone());
    }
    // SAFETY: a live ID of this library.
    let channel = unsafe { (*id).channel };
    for child in discard_events(channel, id as usize) {
        if let Some(r) = g.ids.remove(&child) {
            for (d, rid) in r.rids {
                g.by_rid.remove(&(d, rid));
                g.devs[d].svc.destroy_id(rid);
            }
            // SAFETY: made by Box in deliver_one, never handed out (its event was discarded).
            drop(unsafe { Box::from_raw(child as *mut rdma_cm_id) });
        }
    }
    let deadline = std::time::Instant::now() + ACK_WAIT;
    let acked = loop {
        let a = g.acks.get(&(id as usize)).copied().unwrap_or_default();
        if a.completed >= a.reported {
            break true;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break false;
        }
        g = ACKED
            .wait_timeout(g, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    };
    g.acks.remove(&(id as usize));
    drop(g);
    for svc in used {
        linger(&svc);
    }
    if !acked {
        // Unacknowledged events point at it: leave it allocated.
        return 0;
    }
    // SAFETY: the caller's promise; made by Box in create_id or deliver_one.
    let b = unsafe { Box::from_raw(id) };
    if rec.sync {
        // SAFETY: the ID's own channel.
        unsafe { softrdmacm_destroy_event_channel(b.channel) };
    }
    0
}
symver!(softrdmacm_destroy_id, "IBVERBS_PRIVATE_RDMACM");

/// Longest wait of [`softrdmacm_destroy_id`] for the ID's events to be acknowledged (rdma-core
/// waits without bound).
pub const ACK_WAIT: Duration = Duration::from_secs(10);

/// Takes the events of ID `id` out of `channel`'s queue and frees them: its own, and the
/// `CONNECT_REQUEST`s of which it is the listener, whose new IDs are returned for the caller to
/// destroy. The descriptor keeps their counts (see [`ChannelQueue::efd`]).
fn discard_events(channel: *mut rdma_event_channel, id: usize) -> Vec<usize> {
    let Some(q) = channel_queue(channel) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    lock(&q.queue).retain(|&e| {
        // SAFETY: queued EventBoxes, owned by the queue.
        let ev = unsafe { &(*(e as *const EventBox)).ev };
        let request = ev.event == rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST
            && ev.listen_id as usize == id;
        if ev.id as usize != id && !request {
            return true;
        }
        if request {
            children.push(ev.id as usize);
        }
        // SAFETY: taken out of the queue here, never handed out.
        drop(unsafe { Box::from_raw(e as *mut EventBox) });
        false
    });
    children
}

/// Longest wait of [`softrdmacm_destroy_id`] for QP1's queued MADs to leave.
pub const LINGER: Duration = Duration::from_millis(200);

/// Waits, at most [`LINGER`], until the device's QP1 has sent what it queued (a DREP answering
/// the peer's DREQ, the DREQ of a connection destroyed while established): a program often
/// exits right after destroying its IDs, and the peer would otherwise resend its DREQ to nobody
/// for the whole retry budget (15 x 4.3 s), where rxe's kernel CM outlives the process.
fn linger(svc: &CmService) {
    let Some(gsi) = svc.device().gsi() else {
        return;
    };
    let start = std::time::Instant::now();
    loop {
        let mut pending = 0;
        gsi.with_gsi(&mut |_, h| pending = h.gsi_sends_pending());
        if pending == 0 || start.elapsed() >= LINGER {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The device holding `ip`.
fn dev_of(g: &Global, ip: IpAddr) -> Option<usize> {
    g.devs.iter().position(|d| d.ips.contains(&ip))
}

/// rdma_bind_addr(3): a specific address binds the ID to its device (`EADDRNOTAVAIL` when no
/// device has it); a wildcard one binds the port only.
///
/// # Safety
/// `id` is a live ID; `addr` a sockaddr of its family.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: the caller's promise.
    // A null address or one of another family: EINVAL, as librdmacm's rdma_bind_addr refuses
    // it (`ucma_addrlen` is 0) before the kernel would answer EAFNOSUPPORT.
    let Some(a) = (unsafe { from_sockaddr(addr) }) else {
        return fail(libc::EINVAL, -1);
    };
    let mut g = lock(global());
    let dev = if a.ip().is_unspecified() {
        None
    } else {
        match dev_of(&g, a.ip()) {
            Some(d) => Some(d),
            None => return fail(libc::EADDRNOTAVAIL, -1),
        }
    };
    let ctx = dev.map_or(null_mut(), |d| g.devs[d].ctx);
    let pd = dev.and_then(|d| dev_pd(&mut g, d)).unwrap_or(null_mut());
    let Some(rec) = g.ids.get_mut(&(id as usize)) else {
        return fail(libc::EINVAL, -1);
    };
    rec.bound = Some(a);
    rec.dev = dev;
    // SAFETY: a live ID.
    unsafe {
        (*id).verbs = ctx;
        (*id).pd = pd;
        (*id).port_num = 1;
        set_route(id, Some(a), None);
    }
    0
}
symver!(softrdmacm_bind_addr, "IBVERBS_PRIVATE_RDMACM");

/// The CM ID of `id` on device `d`, made on first use.
fn rid_on(g: &mut Global, id: usize, d: usize) -> Result<RdmaId, c_int> {
    if let Some(&(_, r)) = g
        .ids
        .get(&id)
        .and_then(|r| r.rids.iter().find(|(x, _)| *x == d))
    {
        return Ok(r);
    }
    // SAFETY: a live ID of this library.
    let (ps, ud) = unsafe {
        let p = &*(id as *const rdma_cm_id);
        (p.ps as u16, p.qp_type == QPT_UD)
    };
    let r = g.devs[d]
        .svc
        .create_id_qpt(ps, ud)
        .map_err(|e| errno_of_cm(&e))?;
    g.by_rid.insert((d, r), id);
    if let Some(rec) = g.ids.get_mut(&id) {
        rec.rids.push((d, r));
        rec.dev = Some(d);
    }
    Ok(r)
}

/// rdma_resolve_addr(3): picks the device (the bound one, the one holding `src_addr`, or the
/// first with an address of `dst_addr`'s family) and reports `ADDR_RESOLVED` or `ADDR_ERROR`.
///
/// # Safety
/// `id` is a live ID; `src_addr` null or a sockaddr; `dst_addr` a sockaddr.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's promise.
    let (src, dst) = unsafe { (from_sockaddr(src_addr), from_sockaddr(dst_addr)) };
    let Some(dst) = dst else {
        return fail(libc::EINVAL, -1);
    };
    let r = {
        let mut g = lock(global());
        resolve_addr(&mut g, id, src, dst)
    };
    if r.is_ok() && is_sync(id) {
        // SAFETY: a live synchronous ID.
        return unsafe { complete(id, rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED) };
    }
    rc(r)
}
symver!(softrdmacm_resolve_addr, "IBVERBS_PRIVATE_RDMACM");

fn resolve_addr(
    g: &mut Global,
    id: *mut rdma_cm_id,
    src: Option<SocketAddr>,
    dst: SocketAddr,
) -> Result<(), c_int> {
    let rec = g.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    let src = src
        .filter(|s| !s.ip().is_unspecified())
        .or(rec.bound.filter(|b| !b.ip().is_unspecified()));
    let d = match (rec.dev, src) {
        (Some(d), _) => d,
        (None, Some(s)) => dev_of(g, s.ip()).ok_or(libc::EADDRNOTAVAIL)?,
        (None, None) => g
            .devs
            .iter()
            .position(|d| d.ips.iter().any(|ip| ip.is_ipv4() == dst.is_ipv4()))
            .ok_or(libc::EADDRNOTAVAIL)?,
    };
    let rid = rid_on(g, id as usize, d)?;
    let ctx = g.devs[d].ctx;
    let pd = dev_pd(g, d).unwrap_or(null_mut());
    // SAFETY: a live ID.
    unsafe {
        (*id).verbs = ctx;
        (*id).pd = pd;
        (*id).port_num = 1;
    }
    // Event delivery happens after the addresses are in the ID: resolve, then fill, then deliver
    // (the event thread waits for the lock held here).
    g.devs[d]
        .svc
        .resolve_addr(rid, src.map(|s| s.ip()), dst)
        .map_err(|e| errno_of_cm(&e))?;
    let (local, remote) = g.devs[d].svc.addresses(rid).unwrap_or((None, None));
    // SAFETY: a live ID.
    unsafe { set_route(id, local, remote) };
    deliver(g, d);
    Ok(())
}

/// `CmService::connect_with` or `CmService::accept_with`.
type EstablishStep =
    fn(&CmService, RdmaId, u32, &[u8], &ConnParam) -> Result<(), hca::rdma_cm::RdmaCmError>;

/// rdma_connect(3) and rdma_accept(3): `step` (`CmService::connect` or `accept`) with the ID's QP
/// and `conn_param`'s private data; a synchronous ID then waits for `ESTABLISHED`. `EINVAL` without
/// a QP or a resolved ID.
///
/// # Safety
/// `id` is a live ID; `conn_param` null or readable.
unsafe fn establish(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
    is_connect: bool,
) -> c_int {
    // SAFETY: the caller's promise.
    let (ud, external) = unsafe {
        let ud = (*id).qp_type == QPT_UD;
        (ud, !ud && (*id).qp.is_null())
    };
    // An ID without `id->qp` connects the program's own QP (`conn_param->qp_num`), which the
    // program moves itself (librdmacm `rdma_connect` / `rdma_accept`: `ucma_modify_qp_*` do
    // nothing without `id->qp`); the active side then gets CONNECT_RESPONSE.
    let step: EstablishStep = match (is_connect, external) {
        (true, false) => CmService::connect_with,
        (true, true) => CmService::connect_external,
        (false, false) => CmService::accept_with,
        (false, true) => CmService::accept_external,
    };
    // SAFETY: the caller's promise.
    let (qpn, data) = unsafe { (qpn_of(id, conn_param), private_of(conn_param)) };
    // SAFETY: as above.
    let mut param = unsafe { conn_param_of(conn_param) };
    // librdmacm: the SRQ bit is the QP's when the ID has one (`rdma_connect` / `rdma_accept`).
    // SAFETY: a live ID; its QP is one of this library's.
    if let Some(qp) = unsafe { (*id).qp.as_ref() } {
        param.srq = !qp.srq.is_null();
    }
    // A UD rdma_connect (SIDR_REQ) names no QP (cma_resolve_ib_udp).
    // SAFETY: a live ID.
    let ud_connect = is_connect && ud;
    let Some(qpn) = qpn.or(ud_connect.then_some(0)) else {
        return fail(libc::EINVAL, -1);
    };
    let r = {
        let mut g = lock(global());
        let ack_timeout = g.ids.get(&(id as usize)).and_then(|r| r.ack_timeout);
        only_rid(&g, id).and_then(|(d, rid)| {
            on_dev(&mut g, d, |svc| {
                if let Some(t) = ack_timeout {
                    svc.set_ack_timeout(rid, t)?;
                }
                step(svc, rid, qpn, data, &param)
            })
            .map_err(|e| errno_of_cm(&e))
        })
    };
    // A UD accept (SIDR_REP) is complete when sent: no event follows on this side.
    if r.is_ok() && is_sync(id) && (is_connect || !ud) {
        let want = if is_connect && external {
            rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_RESPONSE
        } else {
            rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED
        };
        // SAFETY: a live synchronous ID.
        return unsafe { complete(id, want) };
    }
    rc(r)
}

fn only_rid(g: &Global, id: *mut rdma_cm_id) -> Result<(usize, RdmaId), c_int> {
    g.ids
        .get(&(id as usize))
        .and_then(|r| r.rids.first().copied())
        .ok_or(libc::EINVAL)
}

/// rdma_resolve_route(3): reports `ROUTE_RESOLVED` (RoCE has no SA path query).
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_resolve_route(
    id: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    let r = {
        let mut g = lock(global());
        only_rid(&g, id).and_then(|(d, rid)| {
            on_dev(&mut g, d, |svc| svc.resolve_route(rid)).map_err(|e| errno_of_cm(&e))
        })
    };
    if r.is_ok() && is_sync(id) {
        // SAFETY: a live synchronous ID.
        return unsafe { complete(id, rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_RESOLVED) };
    }
    rc(r)
}
symver!(softrdmacm_resolve_route, "IBVERBS_PRIVATE_RDMACM");

/// rdma_listen(3): listens on the bound address's port (`RDMA_PS_TCP`), on its device, or on
/// every device for a wildcard address; an unbound port gets an ephemeral one.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    let mut g = lock(global());
    let Some(rec) = g.ids.get(&(id as usize)) else {
        return fail(libc::EINVAL, -1);
    };
    let mut addr = rec
        .bound
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    if addr.port() == 0 {
        addr.set_port(
            0x8000
                | ({
                    use hca::verbs::random::RandomSource;
                    hca::verbs::random::OsRandom.next_u32()
                } as u16
                    & 0x7fff),
        );
    }
    let devs: Vec<usize> = match rec.dev {
        Some(d) => vec![d],
        None => (0..g.devs.len())
            .filter(|&d| {
                g.devs[d]
                    .ips
                    .iter()
                    .any(|ip| ip.is_ipv4() == addr.is_ipv4())
            })
            .collect(),
    };
    if devs.is_empty() {
        return fail(libc::EADDRNOTAVAIL, -1);
    }
    for d in devs {
        let r = rid_on(&mut g, id as usize, d)
            .and_then(|rid| g.devs[d].svc.listen(rid, addr).map_err(|e| errno_of_cm(&e)));
        if let Err(e) = r {
            return fail(e, -1);
        }
    }
    if let Some(rec) = g.ids.get_mut(&(id as usize)) {
        rec.bound = Some(addr);
    }
    // SAFETY: a live ID.
    unsafe { set_route(id, Some(addr), None) };
    0
}
symver!(softrdmacm_listen, "IBVERBS_PRIVATE_RDMACM");

/// The QPN a connection uses: the ID's QP, else `conn_param->qp_num`.
///
/// # Safety
/// `id` is a live ID; `param` null or readable.
unsafe fn qpn_of(id: *mut rdma_cm_id, param: *const rdma_conn_param) -> Option<u32> {
    // SAFETY: the caller's promise.
    unsafe {
        if !(*id).qp.is_null() {
            Some((*(*id).qp).qp_num)
        } else if !param.is_null() && (*param).qp_num != 0 {
            Some((*param).qp_num)
        } else {
            None
        }
    }
}

/// The CM parameters of `param` (`responder_resources`, `initiator_depth`, `retry_count`,
/// `rnr_retry_count`); a null `param` asks for the device's depths (an accept: the request's,
/// within them) and 7 retries, as librdmacm's defaults.
///
/// # Safety
/// `param` is null or readable.
unsafe fn conn_param_of(param: *const rdma_conn_param) -> ConnParam {
    // SAFETY: the caller's promise.
    match unsafe { param.as_ref() } {
        None => ConnParam {
            responder_resources: RDMA_MAX_RD_ATOMIC,
            initiator_depth: RDMA_MAX_RD_ATOMIC,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        },
        Some(p) => ConnParam {
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control != 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq != 0,
            qp_num: p.qp_num,
        },
    }
}

/// The private data of `param` (at most 255 bytes, as its `uint8_t` length allows).
///
/// # Safety
/// `param` is null or readable, its private data readable for its length.
unsafe fn private_of<'a>(param: *const rdma_conn_param) -> &'a [u8] {
    // SAFETY: the caller's promise.
    unsafe {
        if param.is_null() || (*param).private_data.is_null() {
            &[]
        } else {
            core::slice::from_raw_parts(
                (*param).private_data.cast(),
                usize::from((*param).private_data_len),
            )
        }
    }
}

/// rdma_connect(3): sends the REQ from the ID's QP (or `conn_param->qp_num`); `ESTABLISHED`
/// when the IB CM has moved the QP to RTS and sent the RTU, `REJECTED` / `UNREACHABLE`
/// otherwise. `EINVAL` without a QP or a resolved route, or over 56 bytes of private data.
///
/// # Safety
/// `id` is a live ID; `conn_param` null or readable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { establish(id, conn_param, true) }
}
symver!(softrdmacm_connect, "IBVERBS_PRIVATE_RDMACM");

/// rdma_accept(3) of a `CONNECT_REQUEST`'s ID: the QP goes to RTR and a REP is sent;
/// `ESTABLISHED` follows the RTU.
///
/// # Safety
/// `id` is a live ID; `conn_param` null or readable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { establish(id, conn_param, false) }
}
symver!(softrdmacm_accept, "IBVERBS_PRIVATE_RDMACM");

/// rdma_reject(3) with `private_data` (at most 148 bytes); the peer sees `REJECTED`, status 28.
///
/// # Safety
/// `id` is a live ID; `private_data` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    let data: &[u8] = if private_data.is_null() {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { core::slice::from_raw_parts(private_data.cast(), usize::from(len)) }
    };
    let mut g = lock(global());
    rc(only_rid(&g, id).and_then(|(d, rid)| {
        on_dev(&mut g, d, |svc| svc.reject(rid, data)).map_err(|e| errno_of_cm(&e))
    }))
}
symver!(softrdmacm_reject, "IBVERBS_PRIVATE_RDMACM");

/// rdma_disconnect(3): the QP goes to ERR and a DREQ is sent; `DISCONNECTED` follows. On an ID
/// whose connection is already going or gone (the peer's DREQ came first) it returns 0, as
/// Linux `rdma_disconnect` does when `ib_send_cm_dreq` fails; `EINVAL` on an ID never resolved
/// or connected.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_disconnect(id: *mut rdma_cm_id) -> c_int {
    let mut g = lock(global());
    rc(only_rid(&g, id).map(|(d, rid)| {
        let _ = on_dev(&mut g, d, |svc| svc.disconnect(rid));
    }))
}
symver!(softrdmacm_disconnect, "IBVERBS_PRIVATE_RDMACM");

/// rdma_establish(3): after `RDMA_CM_EVENT_CONNECT_RESPONSE` of an ID without `id->qp` (the
/// program's own QP, brought to RTS with `rdma_init_qp_attr`), sends the RTU; the passive side
/// then reports `ESTABLISHED`, this side nothing (librdmacm `rdma_establish`, Linux
/// `ib_send_cm_rtu`). `EINVAL` on an ID with a QP (the CM connected it: librdmacm refuses
/// too) or without such a response.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's promise.
    if id.is_null() || !unsafe { (*id).qp }.is_null() {
        return fail(libc::EINVAL, -1);
    }
    let mut g = lock(global());
    rc(only_rid(&g, id).and_then(|(d, rid)| {
        on_dev(&mut g, d, |svc| svc.establish(rid)).map_err(|e| errno_of_cm(&e))
    }))
}
symver!(softrdmacm_establish, "IBVERBS_PRIVATE_RDMACM");

/// rdma_notify(3): 0 (the software HCA has no communication-established event to relay).
#[no_mangle]
pub extern "C" fn softrdmacm_notify(_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    0
}
symver!(softrdmacm_notify, "IBVERBS_PRIVATE_RDMACM");

/// rdma_migrate_id(3): moves the ID, and its queued events, to `channel` (a null one makes it
/// synchronous on a channel of its own).
///
/// # Safety
/// `id` is a live ID; `channel` null or live.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    let mut g = lock(global());
    let Some(rec) = g.ids.get_mut(&(id as usize)) else {
        return fail(libc::EINVAL, -1);
    };
    let (to, sync) = if channel.is_null() {
        match new_channel() {
            Some(c) => (c.cast::<rdma_event_channel>(), true),
            None => return fail(libc::EMFILE, -1),
        }
    } else {
        (channel, false)
    };
    // SAFETY: a live ID and its live channel.
    let from = unsafe { (*id).channel };
    if !from.is_null() && from != to {
        if let Some(fq) = channel_queue(from) {
            let mut q = lock(&fq.queue);
            let mine: Vec<usize> = q
                .iter()
                .copied()
                // SAFETY: queued events are live EventBoxes.
                .filter(|&e| unsafe { (*(e as *const EventBox)).ev.id } == id)
                .collect();
            q.retain(|e| !mine.contains(e));
            drop(q);
            // The old descriptor keeps their counts (see `ChannelQueue::efd`): taking them
            // with a blocking read could wait on a count another thread already took.
            for e in mine {
                // SAFETY: the event leaves the old queue for the new.
                post(to, unsafe { Box::from_raw(e as *mut EventBox) });
            }
        }
    }
    let old_sync = rec.sync;
    rec.sync = sync;
    // SAFETY: a live ID.
    unsafe { (*id).channel = to };
    drop(g);
    if old_sync && from != to {
        // SAFETY: the ID's former own channel, now empty of its events.
        unsafe { softrdmacm_destroy_event_channel(from) };
    }
    0
}
symver!(softrdmacm_migrate_id, "IBVERBS_PRIVATE_RDMACM");

/// rdma_set_option(3): `RDMA_OPTION_ID` options (TOS, REUSEADDR, AFONLY) are accepted without
/// effect; `RDMA_OPTION_ID_ACK_TIMEOUT` (a `u8`, at most 31, else `EINVAL`) becomes the local ACK
/// timeout of the ID's QP at RTS when it connects or accepts, as Linux `cma.c`
/// `rdma_set_ack_timeout` makes it (`ibv_query_qp` then reports it); `RDMA_OPTION_IB_PATH` and
/// others fail with `ENOSYS`, as the kernel's do.
///
/// # Safety
/// `id` is a live ID; `optval` points at `optlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    if optval.is_null() {
        return fail(libc::EINVAL, -1);
    }
    if level != RDMA_OPTION_ID as c_int || !OPTION_ID_KNOWN.contains(&optname) {
        return fail(libc::ENOSYS, -1);
    }
    if optname == RDMA_OPTION_ID_ACK_TIMEOUT as c_int {
        // SAFETY: the caller's promise (optlen bytes at optval, at least one checked here).
        let t = match optlen {
            0 => return fail(libc::EINVAL, -1),
            _ => unsafe { *optval.cast::<u8>() },
        };
        if t > 31 {
            return fail(libc::EINVAL, -1);
        }
        let mut g = lock(global());
        let Some(rec) = g.ids.get_mut(&(id as usize)) else {
            return fail(libc::EINVAL, -1);
        };
        rec.ack_timeout = Some(t);
    }
    0
}
symver!(softrdmacm_set_option, "IBVERBS_PRIVATE_RDMACM");

/// rdma_get_src_port(3): the local port, network order.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise; the union holds a sockaddr.
    unsafe { from_sockaddr(ptr::from_ref(&(*id).route.addr.__bindgen_anon_1.src_addr).cast()) }
        .map_or(0, |a| a.port().to_be())
}
symver!(softrdmacm_get_src_port, "IBVERBS_PRIVATE_RDMACM");

/// rdma_get_dst_port(3): the peer's port, network order.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise; the union holds a sockaddr.
    unsafe { from_sockaddr(ptr::from_ref(&(*id).route.addr.__bindgen_anon_2.dst_addr).cast()) }
        .map_or(0, |a| a.port().to_be())
}
symver!(softrdmacm_get_dst_port, "IBVERBS_PRIVATE_RDMACM");

// ---------------------------------------------------------------------------------------------
// Devices.

/// rdma_get_devices(3): the opened contexts, null-terminated; free with rdma_free_devices.
///
/// # Safety
/// `num_devices` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let g = lock(global());
    let mut list: Vec<*mut ibv_context> = g.devs.iter().map(|d| d.ctx).collect();
    if !num_devices.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num_devices = list.len() as c_int };
    }
    list.push(null_mut());
    Box::into_raw(list.into_boxed_slice()).cast()
}
symver!(softrdmacm_get_devices, "IBVERBS_PRIVATE_RDMACM");

/// rdma_free_devices(3).
///
/// # Safety
/// `list` is from [`softrdmacm_get_devices`].
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_free_devices(list: *mut *mut ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: null-terminated.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 pointers made above.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}
symver!(softrdmacm_free_devices, "IBVERBS_PRIVATE_RDMACM");

// ---------------------------------------------------------------------------------------------
// QPs and SRQs.

/// The ID's device's default PD, allocated on first use.
fn default_pd(id: *mut rdma_cm_id) -> Result<*mut ibv_pd, c_int> {
    let mut g = lock(global());
    let d = g
        .ids
        .get(&(id as usize))
        .and_then(|r| r.dev)
        .ok_or(libc::EINVAL)?;
    dev_pd(&mut g, d).ok_or(libc::ENOMEM)
}

/// Device `d`'s PD for IDs and QPs made without one, allocated on first use (rdma-core's
/// `ucma_get_device` gives every ID bound to a device that device's PD in `id->pd`, which
/// programs use for QPs and MRs of their own); `None` when ibv_alloc_pd fails.
fn dev_pd(g: &mut Global, d: usize) -> Option<*mut ibv_pd> {
    if g.devs[d].pd.is_null() {
        // SAFETY: an open context of this library.
        let pd = unsafe { crate::ffi::ibv_alloc_pd(g.devs[d].ctx) };
        if pd.is_null() {
            return None;
        }
        g.devs[d].pd = pd;
    }
    Some(g.devs[d].pd)
}

/// Makes the CQs rdma-core makes for a QP without them (`ucma_create_cqs`): one per direction,
/// each with a completion channel, in `id->send_cq` / `id->recv_cq`.
///
/// # Safety
/// `id` is a live ID on a device.
unsafe fn create_cqs(id: *mut rdma_cm_id, send: u32, recv: u32) -> Result<(), c_int> {
    // SAFETY: the caller's promise; the verbs of this library on its context.
    unsafe {
        let ctx = (*id).verbs;
        for (is_send, n) in [(true, send), (false, recv)] {
            let ch = crate::ffi::ibv_create_comp_channel(ctx);
            if ch.is_null() {
                return Err(libc::ENOMEM);
            }
            let cq = crate::ffi::ibv_create_cq(ctx, n.max(1) as c_int, id.cast(), ch, 0);
            if cq.is_null() {
                crate::ffi::ibv_destroy_comp_channel(ch);
                return Err(libc::ENOMEM);
            }
            if is_send {
                (*id).send_cq_channel = ch;
                (*id).send_cq = cq;
            } else {
                (*id).recv_cq_channel = ch;
                (*id).recv_cq = cq;
            }
        }
    }
    if let Some(r) = lock(global()).ids.get_mut(&(id as usize)) {
        r.own_cqs = true;
    }
    Ok(())
}

/// Moves a new UD QP to RTS with Q_Key [`RDMA_UDP_QKEY`] (P_Key index 0, port 1, SQ PSN 0), as
/// rdma-core's `ucma_init_ud_qp` does with the kernel's `rdma_init_qp_attr` for a UD ID.
///
/// # Safety
/// `qp` is a live QP of this library.
unsafe fn init_ud_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut attr: ibv_qp_attr = unsafe { zeroed() };
    attr.qp_state = ibv_qp_state_IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qkey = RDMA_UDP_QKEY;
    let steps = [
        (
            ibv_qp_state_IBV_QPS_INIT,
            ibv_qp_attr_mask_IBV_QP_STATE
                | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask_IBV_QP_PORT
                | ibv_qp_attr_mask_IBV_QP_QKEY,
        ),
        (ibv_qp_state_IBV_QPS_RTR, ibv_qp_attr_mask_IBV_QP_STATE),
        (
            ibv_qp_state_IBV_QPS_RTS,
            ibv_qp_attr_mask_IBV_QP_STATE | ibv_qp_attr_mask_IBV_QP_SQ_PSN,
        ),
    ];
    for (state, mask) in steps {
        attr.qp_state = state;
        // SAFETY: the caller's QP.
        let r = unsafe { crate::ffi::ibv_modify_qp(qp, &mut attr, mask as c_int) };
        if r != 0 {
            return r;
        }
    }
    0
}

/// Moves a new QP to INIT for a connection (the CM takes it on), as rdma-core's
/// `ucma_init_conn_qp`; a UD QP to RTS ([`init_ud_qp`]).
///
/// # Safety
/// `qp` is a live QP of this library.
unsafe fn init_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the caller's QP.
    if unsafe { (*qp).qp_type } == QPT_UD {
        // SAFETY: as above.
        return unsafe { init_ud_qp(qp) };
    }
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut attr: ibv_qp_attr = unsafe { zeroed() };
    attr.qp_state = ibv_qp_state_IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = 1;
    attr.qp_access_flags = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags_IBV_ACCESS_REMOTE_READ
        | ibv_access_flags_IBV_ACCESS_REMOTE_WRITE
        | ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC;
    let mask = ibv_qp_attr_mask_IBV_QP_STATE
        | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
        | ibv_qp_attr_mask_IBV_QP_PORT
        | ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS;
    // SAFETY: the caller's QP.
    unsafe { crate::ffi::ibv_modify_qp(qp, &mut attr, mask as c_int) }
}

/// rdma_create_qp(3): an RC QP of this library on the ID's device, in INIT (a UD QP of a
/// `RDMA_PS_UDP` ID: in RTS, Q_Key `RDMA_UDP_QKEY`); a QP type other than the ID's fails with
/// `EOPNOTSUPP`; a null `pd` takes the device's default PD, null CQs get CQs of their own
/// (`id->send_cq` / `id->recv_cq`).
///
/// # Safety
/// `id` is a live ID with a device; `pd` null or of its context; `qp_init_attr` readable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if qp_init_attr.is_null() {
        return fail(libc::EINVAL, -1);
    }
    // SAFETY: the caller's promise.
    let mut attr = unsafe { *qp_init_attr };
    // SAFETY: as above, and for the ID.
    rc(unsafe { create_qp(id, pd, &mut attr) }.map(|_| {
        // SAFETY: the caller's attr, written back as rdma-core does (the CQs it made).
        unsafe { *qp_init_attr = attr };
    }))
}
symver!(softrdmacm_create_qp, "IBVERBS_PRIVATE_RDMACM");

/// # Safety
/// As [`softrdmacm_create_qp`].
unsafe fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
) -> Result<(), c_int> {
    // SAFETY: the caller's promise.
    if unsafe { (*id).verbs }.is_null() {
        return Err(libc::EINVAL);
    }
    // rdma_create_ep's callers may leave the type zero: the ID's (RC for RDMA_PS_TCP, UD for
    // RDMA_PS_UDP).
    // SAFETY: a live ID.
    let id_type = unsafe { (*id).qp_type };
    if attr.qp_type == 0 {
        attr.qp_type = id_type;
    }
    if attr.qp_type != id_type {
        return Err(libc::EOPNOTSUPP);
    }
    let pd = if pd.is_null() { default_pd(id)? } else { pd };
    // SAFETY: a live ID.
    unsafe {
        if attr.send_cq.is_null() || attr.recv_cq.is_null() {
            if (*id).send_cq.is_null() {
                create_cqs(id, attr.cap.max_send_wr, attr.cap.max_recv_wr)?;
            }
            if attr.send_cq.is_null() {
                attr.send_cq = (*id).send_cq;
            }
            if attr.recv_cq.is_null() {
                attr.recv_cq = (*id).recv_cq;
            }
        }
        if attr.srq.is_null() {
            attr.srq = (*id).srq;
        }
        let qp = crate::ffi::ibv_create_qp(pd, attr);
        if qp.is_null() {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        if init_qp(qp) != 0 {
            crate::ffi::ibv_destroy_qp(qp);
            return Err(libc::EINVAL);
        }
        (*id).qp = qp;
        (*id).pd = pd;
    }
    Ok(())
}

/// rdma_create_qp_ex(3): as [`softrdmacm_create_qp`] through the context's `create_qp_ex`
/// (`send_ops_flags` and the other extended attributes as ibv_create_qp_ex(3) takes them).
///
/// # Safety
/// `id` is a live ID with a device; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe {
        if attr.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL, -1);
        }
        if (*attr).qp_type != (*id).qp_type {
            return fail(libc::EOPNOTSUPP, -1);
        }
        if (*attr).comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD == 0
            || (*attr).pd.is_null()
        {
            match default_pd(id) {
                Ok(pd) => (*attr).pd = pd,
                Err(e) => return fail(e, -1),
            }
            (*attr).comp_mask |= ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD;
        }
        if (*attr).send_cq.is_null() || (*attr).recv_cq.is_null() {
            if (*id).send_cq.is_null() {
                if let Err(e) = create_cqs(id, (*attr).cap.max_send_wr, (*attr).cap.max_recv_wr) {
                    return fail(e, -1);
                }
            }
            if (*attr).send_cq.is_null() {
                (*attr).send_cq = (*id).send_cq;
            }
            if (*attr).recv_cq.is_null() {
                (*attr).recv_cq = (*id).recv_cq;
            }
        }
        let qp = crate::ffi::extended::vctx_create_qp_ex((*id).verbs, attr);
        if qp.is_null() {
            return -1;
        }
        if init_qp(qp) != 0 {
            crate::ffi::ibv_destroy_qp(qp);
            return fail(libc::EINVAL, -1);
        }
        (*id).qp = qp;
        (*id).pd = (*attr).pd;
    }
    0
}
symver!(softrdmacm_create_qp_ex, "IBVERBS_PRIVATE_RDMACM");

/// rdma_destroy_qp(3): destroys the ID's QP (and the CQs rdma_create_qp made for it).
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: the caller's promise; objects of this library.
    unsafe {
        if !(*id).qp.is_null() {
            crate::ffi::ibv_destroy_qp((*id).qp);
            (*id).qp = null_mut();
        }
        let own = lock(global())
            .ids
            .get_mut(&(id as usize))
            .map(|r| core::mem::take(&mut r.own_cqs))
            .unwrap_or(false);
        if own {
            for (cq, ch) in [
                (&mut (*id).send_cq, &mut (*id).send_cq_channel),
                (&mut (*id).recv_cq, &mut (*id).recv_cq_channel),
            ] {
                if !cq.is_null() {
                    crate::ffi::ibv_destroy_cq(*cq);
                    *cq = null_mut();
                }
                if !ch.is_null() {
                    crate::ffi::ibv_destroy_comp_channel(*ch);
                    *ch = null_mut();
                }
            }
        }
    }
}
symver!(softrdmacm_destroy_qp, "IBVERBS_PRIVATE_RDMACM");

/// rdma_init_qp_attr(3): for INIT, the attributes rdma_create_qp uses (port 1, P_Key index 0,
/// remote read / write / atomic access); for RTR / RTS, the IB CM's attributes of the ID's
/// connection (`hca::cm::Cm::init_qp_attr`, as Linux `ib_cm_init_qp_attr`: the peer's QPN and
/// address, path MTU, PSNs, depths, timers; the passive side from `CONNECT_REQUEST` on, the
/// active side from `CONNECT_RESPONSE` / `ESTABLISHED` on), with `RDMA_OPTION_ID_ACK_TIMEOUT`
/// if set; `EINVAL` for another state or an ID without such a connection. For a UD ID
/// (`RDMA_PS_UDP`): INIT with P_Key index 0, port 1 and Q_Key `RDMA_UDP_QKEY`, RTR with the
/// state alone, RTS with SQ PSN 0 (the steps of librdmacm's `ucma_init_ud_qp`).
///
/// # Safety
/// `id` is a live ID; `qp_attr` and `qp_attr_mask` writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    if qp_attr.is_null() || qp_attr_mask.is_null() {
        return fail(libc::EINVAL, -1);
    }
    // SAFETY: the caller's promise.
    unsafe {
        let want = (*qp_attr).qp_state;
        if (*id).qp_type == QPT_UD {
            // cma.c cma_ib_init_qp_attr for UD: P_Key index, port and the ID's Q_Key; librdmacm
            // then moves the QP to RTR with the state alone and to RTS with SQ PSN 0.
            *qp_attr = zeroed();
            (*qp_attr).qp_state = want;
            let mask = match want {
                ibv_qp_state_IBV_QPS_INIT => {
                    (*qp_attr).port_num = 1;
                    (*qp_attr).qkey = RDMA_UDP_QKEY;
                    ibv_qp_attr_mask_IBV_QP_STATE
                        | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
                        | ibv_qp_attr_mask_IBV_QP_PORT
                        | ibv_qp_attr_mask_IBV_QP_QKEY
                }
                ibv_qp_state_IBV_QPS_RTR => ibv_qp_attr_mask_IBV_QP_STATE,
                ibv_qp_state_IBV_QPS_RTS => {
                    ibv_qp_attr_mask_IBV_QP_STATE | ibv_qp_attr_mask_IBV_QP_SQ_PSN
                }
                _ => return fail(libc::EINVAL, -1),
            };
            *qp_attr_mask = mask as c_int;
            return 0;
        }
        if want == ibv_qp_state_IBV_QPS_INIT {
            *qp_attr = zeroed();
            (*qp_attr).qp_state = want;
            (*qp_attr).port_num = 1;
            (*qp_attr).qp_access_flags = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
                | ibv_access_flags_IBV_ACCESS_REMOTE_READ
                | ibv_access_flags_IBV_ACCESS_REMOTE_WRITE
                | ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC;
            *qp_attr_mask = (ibv_qp_attr_mask_IBV_QP_STATE
                | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask_IBV_QP_PORT
                | ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS) as c_int;
            return 0;
        }
        let to = match want {
            ibv_qp_state_IBV_QPS_RTR => QpState::Rtr,
            ibv_qp_state_IBV_QPS_RTS => QpState::Rts,
            _ => return fail(libc::EINVAL, -1),
        };
        let r = {
            let g = lock(global());
            let ack_timeout = g.ids.get(&(id as usize)).and_then(|r| r.ack_timeout);
            only_rid(&g, id).and_then(|(d, rid)| {
                g.devs[d]
                    .svc
                    .init_qp_attr(rid, to)
                    .map(|(a, m)| (a, m, ack_timeout))
                    .map_err(|e| errno_of_cm(&e))
            })
        };
        let (mut attr, mask, ack_timeout) = match r {
            Ok(v) => v,
            Err(e) => return fail(e, -1),
        };
        // RDMA_OPTION_ID_ACK_TIMEOUT (Linux rdma_init_qp_attr: `id_priv->timeout` when set).
        if let Some(t) = ack_timeout.filter(|_| mask.contains(QpAttrMask::TIMEOUT)) {
            attr.timeout = t;
        }
        *qp_attr = hca::ibverbs::translate::qp_attr(&attr);
        *qp_attr_mask = mask.bits() as c_int;
    }
    0
}
symver!(softrdmacm_init_qp_attr, "IBVERBS_PRIVATE_RDMACM");

/// rdma_create_srq(3): an SRQ on the ID's device (its default PD for a null `pd`), in
/// `id->srq`, used by the ID's QP.
///
/// # Safety
/// `id` is a live ID with a device; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe {
        if attr.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let pd = if pd.is_null() {
            match default_pd(id) {
                Ok(p) => p,
                Err(e) => return fail(e, -1),
            }
        } else {
            pd
        };
        let srq = crate::ffi::ibv_create_srq(pd, attr);
        if srq.is_null() {
            return -1;
        }
        (*id).srq = srq;
        (*id).pd = pd;
    }
    0
}
symver!(softrdmacm_create_srq, "IBVERBS_PRIVATE_RDMACM");

/// rdma_create_srq_ex(3): `EOPNOTSUPP` (XRC and the extended SRQ attributes are not built).
#[no_mangle]
pub extern "C" fn softrdmacm_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP, -1)
}
symver!(softrdmacm_create_srq_ex, "IBVERBS_PRIVATE_RDMACM");

/// rdma_destroy_srq(3).
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_destroy_srq(id: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    unsafe {
        if !(*id).srq.is_null() {
            crate::ffi::ibv_destroy_srq((*id).srq);
            (*id).srq = null_mut();
        }
    }
}
symver!(softrdmacm_destroy_srq, "IBVERBS_PRIVATE_RDMACM");

// ---------------------------------------------------------------------------------------------
// Endpoints (rdma_create_ep, rdma_get_request) and address information.

/// A `struct rdma_addrinfo` with the addresses it points to.
#[repr(C)]
struct AddrInfoBox {
    ai: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

/// rdma_getaddrinfo(3): resolves `node` / `service` with getaddrinfo(3) (numeric or by name)
/// into one `struct rdma_addrinfo`: the source address for `RAI_PASSIVE`, else the
/// destination; RC over `RDMA_PS_TCP`, or UD over `RDMA_PS_UDP` when the hints ask for either,
/// or `RDMA_PS_IB` with the hinted QP type (RC or UD; RC when none) (hints asking for another QP
/// type or port space, or a pair the CM cannot connect, fail with `EOPNOTSUPP`). Errors are getaddrinfo's return values, as rdma-core's.
///
/// # Safety
/// `node` / `service` null or C strings; `hints` null or readable; `res` writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return fail(libc::EINVAL, -1);
    }
    // SAFETY: the caller's promise.
    let (flags, family, qp_type, ps) = unsafe {
        if hints.is_null() {
            (0, 0, 0, 0)
        } else {
            (
                (*hints).ai_flags,
                (*hints).ai_family,
                (*hints).ai_qp_type,
                (*hints).ai_port_space,
            )
        }
    };
    // The QP type and port space: a hint's, or the one the other hint implies (RC with
    // RDMA_PS_TCP, UD with RDMA_PS_UDP; rdma-core's ucma_convert_to_rai from SOCK_STREAM /
    // SOCK_DGRAM and IPPROTO_TCP / IPPROTO_UDP); a pair the CM cannot connect is refused.
    let (rc, udq) = (QPT_RC as c_int, QPT_UD as c_int);
    let (want_type, want_ps) = match (qp_type, ps as rdma_port_space) {
        (0, 0) => (rc, rdma_port_space_RDMA_PS_TCP),
        (0, rdma_port_space_RDMA_PS_UDP) => (udq, ps as u32),
        (0, p) => (rc, p),
        (t, 0) if t == udq => (udq, rdma_port_space_RDMA_PS_UDP),
        (t, 0) => (t, rdma_port_space_RDMA_PS_TCP),
        (t, p) => (t, p),
    };
    let fits = match want_ps {
        rdma_port_space_RDMA_PS_TCP => want_type == rc,
        rdma_port_space_RDMA_PS_UDP => want_type == udq,
        rdma_port_space_RDMA_PS_IB => want_type == rc || want_type == udq,
        _ => false,
    };
    if !fits {
        return fail(libc::EOPNOTSUPP, -1);
    }
    let want_ps = want_ps as c_int;
    let passive = flags & RAI_PASSIVE as c_int != 0;
    // SAFETY: all-zero is a valid addrinfo.
    let mut h: libc::addrinfo = unsafe { zeroed() };
    h.ai_family = family;
    h.ai_socktype = libc::SOCK_STREAM;
    h.ai_flags = if passive { libc::AI_PASSIVE } else { 0 }
        | if flags & RAI_NUMERICHOST as c_int != 0 {
            libc::AI_NUMERICHOST
        } else {
            0
        };
    let mut list: *mut libc::addrinfo = null_mut();
    // SAFETY: the caller's strings; libc fills `list`.
    let r = unsafe { libc::getaddrinfo(node, service, &h, &mut list) };
    if r != 0 {
        return r;
    }
    // SAFETY: getaddrinfo succeeded: at least one entry.
    let addr = unsafe { from_sockaddr((*list).ai_addr) };
    // SAFETY: from getaddrinfo.
    unsafe { libc::freeaddrinfo(list) };
    let Some(addr) = addr else {
        return libc::EAI_FAMILY;
    };
    // SAFETY: all-zero is valid for each field.
    let mut b: Box<AddrInfoBox> = Box::new(unsafe { zeroed() });
    b.ai.ai_flags = flags;
    b.ai.ai_family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    b.ai.ai_qp_type = want_type;
    b.ai.ai_port_space = want_ps;
    if passive {
        b.ai.ai_src_len = to_sockaddr(addr, &mut b.src);
        b.ai.ai_src_addr = ptr::from_mut(&mut b.src).cast();
    } else {
        b.ai.ai_dst_len = to_sockaddr(addr, &mut b.dst);
        b.ai.ai_dst_addr = ptr::from_mut(&mut b.dst).cast();
    }
    // SAFETY: the caller's out parameter.
    unsafe { *res = Box::into_raw(b).cast() };
    0
}
symver!(softrdmacm_getaddrinfo, "IBVERBS_PRIVATE_RDMACM");

/// rdma_freeaddrinfo(3).
///
/// # Safety
/// `res` is from [`softrdmacm_getaddrinfo`].
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: made by softrdmacm_getaddrinfo.
        let b = unsafe { Box::from_raw(p.cast::<AddrInfoBox>()) };
        p = b.ai.ai_next;
    }
}
symver!(softrdmacm_freeaddrinfo, "IBVERBS_PRIVATE_RDMACM");

/// rdma_create_ep(3): a synchronous ID for `res`: bound (passive; the QP attributes are kept for
/// rdma_get_request) or resolved to the destination with a QP made now (active).
///
/// # Safety
/// `id` writable; `res` from rdma_getaddrinfo; `pd` null or a PD; `qp_init_attr` null or readable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL, -1);
    }
    let mut new: *mut rdma_cm_id = null_mut();
    // SAFETY: the caller's promise.
    unsafe {
        let ps = match (*res).ai_port_space as rdma_port_space {
            0 => rdma_port_space_RDMA_PS_TCP,
            p => p,
        };
        let qp_type = match (*res).ai_qp_type as u32 {
            0 if ps == rdma_port_space_RDMA_PS_UDP => QPT_UD,
            0 => QPT_RC,
            t => t,
        };
        if create_id(null_mut(), &mut new, null_mut(), ps, qp_type) != 0 {
            return -1;
        }
        let r = if (*res).ai_flags & RAI_PASSIVE as c_int != 0 {
            let r = softrdmacm_bind_addr(new, (*res).ai_src_addr.cast());
            if r == 0 && !qp_init_attr.is_null() {
                if let Some(rec) = lock(global()).ids.get_mut(&(new as usize)) {
                    rec.ep_qp_attr = Some(*qp_init_attr);
                }
            }
            r
        } else {
            let mut r = softrdmacm_resolve_addr(
                new,
                (*res).ai_src_addr.cast(),
                (*res).ai_dst_addr.cast(),
                2000,
            );
            if r == 0 {
                r = softrdmacm_resolve_route(new, 2000);
            }
            if r == 0 && !qp_init_attr.is_null() {
                r = softrdmacm_create_qp(new, pd, qp_init_attr);
            }
            r
        };
        if r != 0 {
            let e = *libc::__errno_location();
            softrdmacm_destroy_ep(new);
            return fail(e, -1);
        }
        *id = new;
    }
    0
}
symver!(softrdmacm_create_ep, "IBVERBS_PRIVATE_RDMACM");

/// rdma_destroy_ep(3): destroys the ID's QP, SRQ and ID.
///
/// # Safety
/// `id` is a live ID.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    unsafe {
        softrdmacm_destroy_qp(id);
        softrdmacm_destroy_srq(id);
        softrdmacm_destroy_id(id);
    }
}
symver!(softrdmacm_destroy_ep, "IBVERBS_PRIVATE_RDMACM");

/// rdma_get_request(3): waits for a connection request on a synchronous listener and returns its
/// ID, synchronous, with a QP made from the listener's rdma_create_ep attributes.
///
/// # Safety
/// `listen` is a live listening ID; `id` writable.
#[no_mangle]
pub unsafe extern "C" fn softrdmacm_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    if id.is_null() || !is_sync(listen) {
        return fail(libc::EINVAL, -1);
    }
    loop {
        let mut ev: *mut rdma_cm_event = null_mut();
        // SAFETY: the listener's own channel.
        if unsafe { softrdmacm_get_cm_event((*listen).channel, &mut ev) } != 0 {
            return -1;
        }
        // SAFETY: just got it.
        let (kind, new) = unsafe { ((*ev).event, (*ev).id) };
        // SAFETY: ours.
        unsafe { softrdmacm_ack_cm_event(ev) };
        if kind != rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST {
            continue;
        }
        // The new ID gets its own channel (it is synchronous, as its listener).
        // SAFETY: a live ID just reported.
        if unsafe { softrdmacm_migrate_id(new, null_mut()) } != 0 {
            return -1;
        }
        let attr = lock(global())
            .ids
            .get(&(new as usize))
            .and_then(|r| r.ep_qp_attr);
        if let Some(mut a) = attr {
            // SAFETY: the new ID and its listener's PD.
            let r = unsafe { softrdmacm_create_qp(new, (*listen).pd, &mut a) };
            if r != 0 {
                // SAFETY: refuse and forget the request.
                unsafe {
                    softrdmacm_reject(new, ptr::null(), 0);
                    softrdmacm_destroy_id(new);
                }
                return -1;
            }
        }
        // SAFETY: the caller's out parameter.
        unsafe { *id = new };
        return 0;
    }
}
symver!(softrdmacm_get_request, "IBVERBS_PRIVATE_RDMACM");

#[cfg(test)]
mod tests {
    use super::*;
    use core::ptr::null;

    /// A channel destroyed twice (Debian 12's perftest 4.5-0.17 after a rejected connect): the
    /// second destroy is recognised and ignored, not a free of freed memory.
    #[test]
    fn a_channel_destroyed_twice_is_freed_once() {
        let c = new_channel()
            .expect("eventfd(2)")
            .cast::<rdma_event_channel>();
        assert!(live_channels().contains_key(&(c as usize)));
        // SAFETY: a live channel with no ID.
        unsafe { softrdmacm_destroy_event_channel(c) };
        assert!(!live_channels().contains_key(&(c as usize)));
        // SAFETY: the call's point: neither is a live channel, so neither is touched.
        unsafe {
            softrdmacm_destroy_event_channel(c);
            softrdmacm_destroy_event_channel(null_mut());
        }
        assert!(!live_channels().contains_key(&(c as usize)));
    }

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// A new ID on `ch` (no device needed: an ID gets one when bound or resolved).
    fn test_id(ch: *mut rdma_event_channel) -> *mut rdma_cm_id {
        let mut id = null_mut();
        // SAFETY: a live channel, a writable out parameter.
        let r =
            unsafe { softrdmacm_create_id(ch, &mut id, null_mut(), rdma_port_space_RDMA_PS_TCP) };
        assert_eq!(r, 0, "rdma_create_id: errno {}", errno());
        id
    }

    /// Queues an event of type `kind` for `id` (and `listen`) on `ch`, as the dispatcher does.
    fn queue_event(
        ch: *mut rdma_event_channel,
        id: *mut rdma_cm_id,
        listen: *mut rdma_cm_id,
        kind: rdma_cm_event_type,
    ) {
        // SAFETY: all-zero is a valid rdma_cm_event.
        let mut ev = Box::new(EventBox {
            ev: unsafe { zeroed() },
            data: Vec::new(),
        });
        ev.ev.id = id;
        ev.ev.listen_id = listen;
        ev.ev.event = kind;
        post(ch, ev);
    }

    fn set_nonblocking(ch: *mut rdma_event_channel) {
        // SAFETY: fcntl(2) on the live channel's descriptor.
        unsafe {
            let fd = (*ch).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
        }
    }

    /// rping's ending: its CM thread takes DISCONNECTED, wakes the main thread (sem_post) and
    /// only then acknowledges the event; the main thread destroys the ID and the channel. As in
    /// librdmacm, rdma_destroy_id returns only after the acknowledgement, so the CM thread is
    /// back in rdma_get_cm_event (blocked, as on rdma-core) before the channel goes. Before,
    /// the destroy did not wait, and a CM thread slower than the main thread read the destroyed
    /// channel (`rdma_get_cm_event: Bad file descriptor`, rping's exit status 255).
    #[test]
    fn rdma_destroy_id_waits_for_the_ack_of_an_event_handed_out() {
        let ch = new_channel()
            .expect("eventfd(2)")
            .cast::<rdma_event_channel>();
        let id = test_id(ch);
        queue_event(
            ch,
            id,
            null_mut(),
            rdma_cm_event_type_RDMA_CM_EVENT_DISCONNECTED,
        );
        let mut ev = null_mut();
        // SAFETY: a live channel with one event.
        assert_eq!(unsafe { softrdmacm_get_cm_event(ch, &mut ev) }, 0);
        let acked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, evp) = (acked.clone(), ev as usize);
        let acker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            // SAFETY: the event handed out above, acknowledged once, here.
            unsafe { softrdmacm_ack_cm_event(evp as *mut rdma_cm_event) };
        });
        // SAFETY: a live ID without a QP.
        assert_eq!(unsafe { softrdmacm_destroy_id(id) }, 0);
        assert!(
            acked.load(std::sync::atomic::Ordering::SeqCst),
            "rdma_destroy_id returned before the event of its ID was acknowledged"
        );
        acker.join().expect("acker");
        // SAFETY: a live channel, its ID destroyed.
        unsafe { softrdmacm_destroy_event_channel(ch) };
    }

    /// Events still queued for a destroyed ID are discarded (the kernel's `ucma_destroy_id`
    /// removes them), a queued CONNECT_REQUEST of a destroyed listener with its new ID; the
    /// other IDs' events stay, and the counts the discarded ones leave in the descriptor make
    /// no event appear: a non-blocking channel then answers EAGAIN.
    #[test]
    fn rdma_destroy_id_discards_its_queued_events() {
        let ch = new_channel()
            .expect("eventfd(2)")
            .cast::<rdma_event_channel>();
        let (listener, child, other) = (test_id(ch), test_id(ch), test_id(ch));
        queue_event(
            ch,
            listener,
            null_mut(),
            rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED,
        );
        queue_event(
            ch,
            other,
            null_mut(),
            rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED,
        );
        queue_event(
            ch,
            child,
            listener,
            rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST,
        );
        // SAFETY: a live ID without a QP, none of its events handed out.
        assert_eq!(unsafe { softrdmacm_destroy_id(listener) }, 0);
        // The request's new ID went with it.
        // SAFETY: the call's point: no longer an ID of this library, refused before any use.
        assert_eq!(unsafe { softrdmacm_destroy_id(child) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        set_nonblocking(ch);
        let mut ev = null_mut();
        // SAFETY: a live channel.
        assert_eq!(unsafe { softrdmacm_get_cm_event(ch, &mut ev) }, 0);
        // SAFETY: just handed out.
        let (got_id, kind) = unsafe { ((*ev).id, (*ev).event) };
        assert_eq!(got_id, other);
        assert_eq!(kind, rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED);
        // SAFETY: handed out above.
        assert_eq!(unsafe { softrdmacm_ack_cm_event(ev) }, 0);
        // SAFETY: a live channel, now without events.
        assert_eq!(unsafe { softrdmacm_get_cm_event(ch, &mut ev) }, -1);
        assert_eq!(errno(), libc::EAGAIN);
        // SAFETY: a live ID, its one event acknowledged; then the channel, without IDs.
        unsafe {
            assert_eq!(softrdmacm_destroy_id(other), 0);
            softrdmacm_destroy_event_channel(ch);
        }
    }

    /// rdma_get_cm_event on a destroyed channel is EBADF (a read of a closed descriptor), not a
    /// read of freed memory.
    #[test]
    fn rdma_get_cm_event_on_a_destroyed_channel_is_ebadf() {
        let ch = new_channel()
            .expect("eventfd(2)")
            .cast::<rdma_event_channel>();
        // SAFETY: a live channel without IDs.
        unsafe { softrdmacm_destroy_event_channel(ch) };
        let mut ev = null_mut();
        // SAFETY: the call's point: the pointer is not dereferenced once found not live.
        assert_eq!(unsafe { softrdmacm_get_cm_event(ch, &mut ev) }, -1);
        assert_eq!(errno(), libc::EBADF);
    }

    /// rdma_getaddrinfo with hints the CM cannot connect (UC, an unknown port space, IPoIB's, a
    /// UD type over RDMA_PS_TCP, an RC type over RDMA_PS_UDP) fails with EOPNOTSUPP and leaves
    /// no result; no node and no service, or no result pointer, is EINVAL; a numeric-host flag
    /// with a name is getaddrinfo's own error; a plain request still resolves.
    #[test]
    fn getaddrinfo_refuses_odd_hints() {
        let node = c"127.0.0.1";
        let service = c"7471";
        for (qp_type, ps) in [
            (3, 0),
            (0, 0x0107),
            (0, rdma_port_space_RDMA_PS_IPOIB),
            (QPT_UD as c_int, rdma_port_space_RDMA_PS_TCP),
            (QPT_RC as c_int, rdma_port_space_RDMA_PS_UDP),
            (3, rdma_port_space_RDMA_PS_IB),
            (-1, rdma_port_space_RDMA_PS_IB),
        ] {
            // SAFETY: all-zero is a valid addrinfo.
            let mut hints: rdma_addrinfo = unsafe { zeroed() };
            hints.ai_qp_type = qp_type;
            hints.ai_port_space = ps as c_int;
            let mut res: *mut rdma_addrinfo = null_mut();
            // SAFETY: C strings, readable hints, writable result.
            let r = unsafe {
                softrdmacm_getaddrinfo(node.as_ptr(), service.as_ptr(), &hints, &mut res)
            };
            assert_eq!(
                (r, errno()),
                (-1, libc::EOPNOTSUPP),
                "qp_type {qp_type} ps {ps:#x}"
            );
            assert!(res.is_null());
        }
        let mut res: *mut rdma_addrinfo = null_mut();
        // SAFETY: null strings and hints are allowed; `res` writable.
        let r = unsafe { softrdmacm_getaddrinfo(null(), null(), null(), &mut res) };
        assert_eq!((r, errno()), (-1, libc::EINVAL));
        // SAFETY: a null result pointer is the point.
        let r =
            unsafe { softrdmacm_getaddrinfo(node.as_ptr(), service.as_ptr(), null(), null_mut()) };
        assert_eq!((r, errno()), (-1, libc::EINVAL));
        // SAFETY: all-zero is a valid addrinfo.
        let mut hints: rdma_addrinfo = unsafe { zeroed() };
        hints.ai_flags = RAI_NUMERICHOST as c_int;
        // SAFETY: as above.
        let r = unsafe {
            softrdmacm_getaddrinfo(c"not a number".as_ptr(), service.as_ptr(), &hints, &mut res)
        };
        assert_eq!(r, libc::EAI_NONAME);
        assert!(res.is_null());
        // SAFETY: as above.
        let r =
            unsafe { softrdmacm_getaddrinfo(node.as_ptr(), service.as_ptr(), null(), &mut res) };
        assert_eq!(r, 0);
        // SAFETY: a result of softrdmacm_getaddrinfo.
        unsafe {
            assert_eq!((*res).ai_qp_type, QPT_RC as c_int);
            assert_eq!((*res).ai_port_space, rdma_port_space_RDMA_PS_TCP as c_int);
            softrdmacm_freeaddrinfo(res);
        }
    }

    /// rdma_create_ep with an rdma_addrinfo the CM cannot serve (made by hand, not by
    /// rdma_getaddrinfo): UC, an unknown port space or a mismatched pair is EINVAL, IPoIB's port
    /// space EOPNOTSUPP (as rdma_create_id); a passive one without a source address, or with one
    /// of another family, is EINVAL as librdmacm's rdma_bind_addr (was EAFNOSUPPORT). No ID is
    /// returned.
    #[test]
    fn create_ep_refuses_odd_addrinfo() {
        // SAFETY: all-zero is valid for both.
        let mut unix: libc::sockaddr_storage = unsafe { zeroed() };
        unix.ss_family = libc::AF_UNIX as libc::sa_family_t;
        let cases: [(c_int, u32, c_int, bool, c_int); 6] = [
            (3, rdma_port_space_RDMA_PS_TCP, 0, false, libc::EINVAL),
            (0, 0x0107, 0, false, libc::EINVAL),
            (0, rdma_port_space_RDMA_PS_IPOIB, 0, false, libc::EOPNOTSUPP),
            (
                QPT_RC as c_int,
                rdma_port_space_RDMA_PS_UDP,
                0,
                false,
                libc::EINVAL,
            ),
            (0, 0, RAI_PASSIVE as c_int, false, libc::EINVAL),
            (0, 0, RAI_PASSIVE as c_int, true, libc::EINVAL),
        ];
        for (qp_type, ps, flags, with_unix_src, want) in cases {
            // SAFETY: all-zero is a valid addrinfo.
            let mut res: rdma_addrinfo = unsafe { zeroed() };
            res.ai_qp_type = qp_type;
            res.ai_port_space = ps as c_int;
            res.ai_flags = flags;
            if with_unix_src {
                res.ai_src_addr = ptr::from_mut(&mut unix).cast();
                res.ai_src_len = size_of::<libc::sockaddr_storage>() as _;
            }
            let mut id: *mut rdma_cm_id = null_mut();
            // SAFETY: readable addrinfo, writable ID pointer; no PD, no QP attributes.
            let r = unsafe { softrdmacm_create_ep(&mut id, &mut res, null_mut(), null_mut()) };
            assert_eq!(
                (r, errno()),
                (-1, want),
                "qp_type {qp_type} ps {ps:#x} flags {flags} unix {with_unix_src}"
            );
            assert!(id.is_null());
        }
    }

    /// rdma_init_qp_attr with a null attribute or mask pointer, or a state other than INIT /
    /// RTR / RTS, is EINVAL; so is an ID this library did not make. Nothing is dereferenced
    /// past the check.
    #[test]
    fn init_qp_attr_refuses_bogus_arguments() {
        // SAFETY: all-zero is a valid rdma_cm_id and ibv_qp_attr (an ID not in the table).
        let mut id: rdma_cm_id = unsafe { zeroed() };
        id.qp_type = QPT_RC;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        let mut mask: c_int = 0;
        // SAFETY: the null pointers are the point; nothing else is touched.
        unsafe {
            assert_eq!(softrdmacm_init_qp_attr(&mut id, null_mut(), &mut mask), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(softrdmacm_init_qp_attr(&mut id, &mut attr, null_mut()), -1);
            assert_eq!(errno(), libc::EINVAL);
        }
        for (qp_type, state) in [
            (QPT_RC, ibv_qp_state_IBV_QPS_SQD),
            (QPT_RC, 99),
            (QPT_UD, ibv_qp_state_IBV_QPS_ERR),
            (QPT_UD, 99),
            (QPT_RC, ibv_qp_state_IBV_QPS_RTR),
            (QPT_RC, ibv_qp_state_IBV_QPS_RTS),
        ] {
            id.qp_type = qp_type;
            attr.qp_state = state;
            // SAFETY: readable ID, writable attr and mask.
            let r = unsafe { softrdmacm_init_qp_attr(&mut id, &mut attr, &mut mask) };
            assert_eq!(
                (r, errno()),
                (-1, libc::EINVAL),
                "type {qp_type} state {state}"
            );
        }
    }
}
