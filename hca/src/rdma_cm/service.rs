//! [`CmService`]: the RDMA CM ([`RdmaCm`]) driven from a real device (its docs say how).

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{ConnParam, RdmaCm, RdmaCmError, RdmaCmEvent, RdmaId};
use crate::cm::{CmConfig, MAX_EVENTS};
use crate::engine::{Instant, SoftHca};
use crate::link::udp::cm_route::{comm_id_prefix, CmPresence, ServiceClaim};
use crate::link::{LinkError, Waker};
use crate::verbs::api::{DeviceError, GsiPort, Verbs};
use crate::verbs::qp::{QpAttr, QpAttrMask, QpState};

/// Most MADs one turn of the service thread hands the CM (it runs another turn at once when more
/// wait): bounds how long the engine lock is held.
pub const MAD_BATCH: usize = 64;

/// How often the service thread drives progress on a device without a progress thread
/// ([`GsiPort::caller_progress`]).
pub const CALLER_POLL: Duration = Duration::from_millis(5);

/// Shortest sleep of the service thread between turns that found no more MADs.
const MIN_SLEEP: Duration = Duration::from_micros(100);

/// Longest sleep of an idle service thread (no timer armed); a MAD, a call or the drop wakes it
/// at once, so this only bounds how long a lost wake-up could delay it.
const IDLE_SLEEP: Duration = Duration::from_secs(10);

/// Why [`CmService::start`] failed.
#[derive(Debug)]
pub enum ServiceError {
    /// The device has no QP1 of its own ([`Verbs::gsi`] is `None`: a hardware HCA or the
    /// kernel's rxe, whose CM is the kernel's), or another CM already consumes it.
    Device(DeviceError),
    /// An eventfd could not be made (out of descriptors).
    Waker(LinkError),
    /// The service thread could not be started.
    Thread(io::Error),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Device(e) => write!(f, "RDMA CM service: {e}"),
            ServiceError::Waker(e) => write!(f, "RDMA CM service: {e}"),
            ServiceError::Thread(e) => write!(f, "RDMA CM service: cannot start thread: {e}"),
        }
    }
}

impl std::error::Error for ServiceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServiceError::Device(e) => Some(e),
            ServiceError::Waker(e) => Some(e),
            ServiceError::Thread(e) => Some(e),
        }
    }
}

/// What the service thread has done (counts, for tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// Turns of the service thread (each feeds MADs and due timers to the CM).
    pub turns: u64,
    /// Times the thread went to sleep in poll(2).
    pub sleeps: u64,
    /// MADs handed to the CM.
    pub mads: u64,
    /// Turns that fired CM timers.
    pub timer_turns: u64,
    /// Events dropped because [`MAX_EVENTS`] were undelivered.
    pub events_lost: u64,
    /// Errors of the thread's eventfd (it keeps running).
    pub wait_errors: u64,
    /// Service IDs claimed on a shared device address (cumulative; see
    /// [`crate::link::udp::cm_route`]).
    pub claims: u64,
    /// Listens refused because another process of the address claims the service.
    pub claims_refused: u64,
    /// Connections that other processes' lookups left on this process's claims, closed.
    pub lookups_drained: u64,
}

struct Queue {
    events: VecDeque<RdmaCmEvent>,
}

struct Inner {
    dev: Arc<dyn Verbs>,
    cm: Mutex<RdmaCm>,
    /// Wakes the service thread (the MAD hook holds a clone).
    wake: Arc<Waker>,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    /// Readable while `queue` holds an event.
    ready: Waker,
    stop: AtomicBool,
    turns: AtomicU64,
    counters: Mutex<ServiceCounters>,
    /// The shared address and this process's slot ([`GsiPort::shared_address`]).
    shared: Option<(SocketAddr, usize)>,
    /// The services this process claims on a shared address, one per service ID the IB CM
    /// listens on (locked after `cm`).
    claims: Mutex<Vec<ServiceClaim>>,
    /// This CM's notice on a shared address, so that REQs nobody claims reach a CM
    /// ([`CmPresence`]); `None` on a device of its own, or if the name was taken.
    presence: Option<CmPresence>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The RDMA CM ([`RdmaCm`]) of one software device, driven from the device by a thread of its
/// own, with an event queue that a caller can block on or poll(2).
///
/// A software device ([`crate::soft::SoftDevice`] over any link, e.g. opened by
/// [`crate::open::open`]) hands its QP1 out through [`Verbs::gsi`]. The service installs the
/// device's MAD hook ([`GsiPort::set_mad_hook`]) and runs one thread (`rdma-cm#N`) that sleeps in
/// poll(2) on an eventfd until the hook reports a MAD on QP1, a call on the service changed the
/// timers, or the CM's next timer is due ([`RdmaCm::poll_timeout`]: REQ / REP / DREQ resends,
/// timewait); it then feeds the MADs ([`RdmaCm::handle_mad`], at most [`MAD_BATCH`] per turn) and
/// the due timers ([`RdmaCm::handle_timeout`]) to the CM on the engine, and moves the CM's events
/// to the queue. An idle service does not wake up (no timer, no MAD: it sleeps until woken).
///
/// On a device whose datagrams reach the engine only when a caller drives progress
/// ([`crate::soft::Progress::Caller`]) the thread also runs a progress round each turn and wakes
/// at least every [`CALLER_POLL`] to do so.
///
/// Events ([`RdmaCmEvent`], librdmacm's `struct rdma_cm_event`) wait in a queue of at most
/// [`crate::cm::MAX_EVENTS`] (more are counted in [`ServiceCounters::events_lost`]):
/// [`CmService::get_event`] takes the oldest, waiting at most its timeout
/// (`rdma_get_cm_event(3)`), and [`CmService::event_fd`] is an eventfd(2) that is readable exactly
/// while the queue holds an event (the event channel's `fd` of librdmacm, `struct
/// rdma_event_channel`, which programs poll).
///
/// The calls (`rdma_create_id`, `rdma_resolve_addr`, ... `rdma_destroy_id`) are [`RdmaCm`]'s,
/// made on the engine under the service's lock; QPs are the caller's ([`Verbs::create_qp`]) and
/// the CM moves them INIT -> RTR -> RTS (and to ERR) as [`crate::cm::Cm`] documents. `Send +
/// Sync`: share it with an `Arc`. Dropping it stops and joins the thread and removes the hook.
pub struct CmService {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for CmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmService")
            .field("device", &self.inner.dev.name())
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn gsi(&self) -> Option<&dyn GsiPort> {
        self.dev.gsi()
    }

    /// Runs `f` on the CM and the engine (CM lock, then the engine's), then queues the CM's new
    /// events. `None` if the device no longer hands out QP1.
    fn op<R>(&self, f: impl FnOnce(&mut RdmaCm, Instant, &mut SoftHca) -> R) -> Option<R> {
        let mut cm = lock(&self.cm);
        let mut f = Some(f);
        let mut out = None;
        self.gsi()?.with_gsi(&mut |now, h| {
            if let Some(f) = f.take() {
                out = Some(f(&mut cm, now, h));
            }
        });
        self.release_claims(&cm);
        self.move_events(&mut cm);
        out
    }

    /// Claims, on a shared address, each of `service_ids` not claimed yet; on the first failure
    /// releases the ones it claimed and returns the error (`AddrInUse`: another process claims
    /// it). Nothing to do on a device of its own.
    fn claim(&self, service_ids: &[u64]) -> io::Result<()> {
        let Some((local, slot)) = self.shared else {
            return Ok(());
        };
        let mut claims = lock(&self.claims);
        let before = claims.len();
        for &sid in service_ids {
            if claims.iter().any(|c| c.service_id() == sid) {
                continue;
            }
            match ServiceClaim::claim(local, slot, sid) {
                Ok(c) => claims.push(c),
                Err(e) => {
                    claims.truncate(before);
                    drop(claims);
                    lock(&self.counters).claims_refused += 1;
                    return Err(e);
                }
            }
        }
        let added = (claims.len() - before) as u64;
        drop(claims);
        lock(&self.counters).claims += added;
        Ok(())
    }

    /// Drops the claims of services the IB CM no longer listens on (the kernel frees the
    /// names: a later REQ for them gets REJ reason 8), and claims those it listens on without a
    /// claim (a listen made by a call other than [`CmService::listen`]; a refusal is counted in
    /// [`ServiceCounters::claims_refused`], and REQs for that service keep going to whoever
    /// claims it, or to slot 0).
    fn release_claims(&self, cm: &RdmaCm) {
        if self.shared.is_none() {
            return;
        }
        let listening = cm.cm().listeners();
        let missing: Vec<u64> = {
            let mut claims = lock(&self.claims);
            claims.retain(|c| listening.contains(&c.service_id()));
            listening
                .iter()
                .filter(|s| !claims.iter().any(|c| c.service_id() == **s))
                .copied()
                .collect()
        };
        for sid in missing {
            let _ = self.claim(&[sid]);
        }
    }

    /// Closes the connections other processes' lookups left on this process's claims.
    fn drain_claims(&self) {
        if self.shared.is_none() {
            return;
        }
        let n = lock(&self.claims)
            .iter()
            .map(ServiceClaim::drain)
            .sum::<usize>()
            + self.presence.as_ref().map_or(0, CmPresence::drain);
        if n > 0 {
            lock(&self.counters).lookups_drained += n as u64;
        }
    }

    /// Moves the CM's events to the queue (CM lock held: events stay in order).
    fn move_events(&self, cm: &mut RdmaCm) {
        let mut q = lock(&self.queue);
        let was_empty = q.events.is_empty();
        let mut lost = 0;
        while let Some(e) = cm.poll_event() {
            if q.events.len() >= MAX_EVENTS {
                lost += 1;
                continue;
            }
            q.events.push_back(e);
        }
        if was_empty && !q.events.is_empty() {
            // A wake only fails on a closed descriptor, which `ready` never is while we live.
            let _ = self.ready.wake();
        }
        if !q.events.is_empty() {
            self.queue_cv.notify_all();
        }
        drop(q);
        if lost > 0 {
            lock(&self.counters).events_lost += lost;
        }
    }

    /// One turn of the thread: MADs, due timers, events. Returns whether more MADs wait and how
    /// long the thread may sleep.
    fn turn(&self) -> (bool, Duration) {
        self.turns.fetch_add(1, Ordering::Relaxed);
        let mut more = false;
        let mut sleep = IDLE_SLEEP;
        let mut mads = 0u64;
        let mut fired = false;
        {
            let mut cm = lock(&self.cm);
            let Some(gsi) = self.gsi() else {
                return (false, IDLE_SLEEP);
            };
            gsi.with_gsi(&mut |now, h| {
                for _ in 0..MAD_BATCH {
                    let Some(m) = h.poll_mad() else { break };
                    cm.handle_mad(now, h, &m);
                    mads += 1;
                }
                more = mads == MAD_BATCH as u64 && h.has_pending_mads();
                if cm.poll_timeout().is_some_and(|t| t <= now) {
                    cm.handle_timeout(now, h);
                    fired = true;
                }
                if let Some(t) = cm.poll_timeout() {
                    sleep = sleep.min(t - now);
                }
            });
            self.move_events(&mut cm);
        }
        self.drain_claims();
        if mads > 0 || fired {
            let mut c = lock(&self.counters);
            c.mads += mads;
            c.timer_turns += u64::from(fired);
        }
        (more, sleep)
    }

    fn run(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let caller = self.gsi().is_some_and(|g| g.caller_progress());
            if caller {
                self.dev.progress();
            }
            let (more, mut sleep) = self.turn();
            if more {
                continue;
            }
            if caller {
                sleep = sleep.min(CALLER_POLL);
            }
            // A timer still due after the turn (the CM re-armed one for now) is fired by the
            // next turn after a short sleep, never by spinning.
            sleep = sleep.max(MIN_SLEEP);
            lock(&self.counters).sleeps += 1;
            if self.wake.wait(sleep).is_err() {
                lock(&self.counters).wait_errors += 1;
                // Do not spin on a persistent error.
                std::thread::sleep(CALLER_POLL);
            }
        }
    }
}

impl CmService {
    /// Starts the RDMA CM of `dev` with `config`: installs its MAD hook and starts the service
    /// thread.
    ///
    /// # Errors
    /// [`ServiceError::Device`] when `dev` has no QP1 of its own ([`DeviceError::Unsupported`])
    /// or another CM consumes it; [`ServiceError::Waker`]; [`ServiceError::Thread`].
    pub fn start(dev: Arc<dyn Verbs>, config: CmConfig) -> Result<CmService, ServiceError> {
        let Some(gsi) = dev.gsi() else {
            return Err(ServiceError::Device(DeviceError::Unsupported {
                device: dev.name(),
                what: "a QP1 for a userspace CM",
            }));
        };
        let wake = Arc::new(Waker::new().map_err(ServiceError::Waker)?);
        let ready = Waker::new().map_err(ServiceError::Waker)?;
        let hook_wake = wake.clone();
        gsi.set_mad_hook(Some(Arc::new(move || {
            let _ = hook_wake.wake();
        })))
        .map_err(ServiceError::Device)?;
        let shared = gsi.shared_address();
        let mut cm = RdmaCm::new(config);
        if let Some((_, slot)) = shared {
            let (mask, value) = comm_id_prefix(slot);
            cm.set_comm_id_prefix(mask, value);
        }
        let inner = Arc::new(Inner {
            dev: dev.clone(),
            cm: Mutex::new(cm),
            wake,
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
            }),
            queue_cv: Condvar::new(),
            ready,
            stop: AtomicBool::new(false),
            turns: AtomicU64::new(0),
            counters: Mutex::new(ServiceCounters::default()),
            shared,
            claims: Mutex::new(Vec::new()),
            // Best effort: without it, REQs nobody claims still reach slot 0.
            presence: shared.and_then(|(local, slot)| CmPresence::announce(local, slot).ok()),
        });
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let name = format!("rdma-cm#{}", SERIAL.fetch_add(1, Ordering::Relaxed));
        let s = inner.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || s.run())
            .map_err(|e| {
                let _ = gsi.set_mad_hook(None);
                ServiceError::Thread(e)
            })?;
        Ok(CmService {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The device the service runs on.
    pub fn device(&self) -> &Arc<dyn Verbs> {
        &self.inner.dev
    }

    /// Runs `f` on the CM and the engine, queues the new events and wakes the thread (a call may
    /// have armed a timer). [`RdmaCmError::BadState`] if the device no longer hands out QP1.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut RdmaCm, Instant, &mut SoftHca) -> Result<R, RdmaCmError>,
    ) -> Result<R, RdmaCmError> {
        let r = self.inner.op(f).unwrap_or(Err(RdmaCmError::BadState));
        let _ = self.inner.wake.wake();
        r
    }

    /// `rdma_create_id(3)` (port space `RDMA_PS_TCP`, RC).
    ///
    /// # Errors
    /// [`RdmaCmError::InUse`] beyond [`super::MAX_IDS`].
    pub fn create_id(&self) -> Result<RdmaId, RdmaCmError> {
        lock(&self.inner.cm).create_id()
    }

    /// `rdma_create_id(3)` with port space `ps` (`RDMA_PS_TCP` and `RDMA_PS_IB` for RC,
    /// `RDMA_PS_UDP` for UD over SIDR; [`roce::cm::port_space`]).
    ///
    /// # Errors
    /// As [`RdmaCm::create_id_ps`].
    pub fn create_id_ps(&self, ps: u16) -> Result<RdmaId, RdmaCmError> {
        lock(&self.inner.cm).create_id_ps(ps)
    }

    /// `rdma_create_id` with port space `ps` for a UD (`ud`) or RC QP; only `RDMA_PS_IB` lets the
    /// caller choose (`rdma_create_ep` with the `rdma_addrinfo`'s `ai_qp_type`).
    ///
    /// # Errors
    /// As [`RdmaCm::create_id_qpt`].
    pub fn create_id_qpt(&self, ps: u16, ud: bool) -> Result<RdmaId, RdmaCmError> {
        lock(&self.inner.cm).create_id_qpt(ps, ud)
    }

    /// `rdma_destroy_id(3)`: an established connection is disconnected first (DREQ, as the
    /// kernel's `cma.c` does when a connected ID is destroyed), a connection request not yet
    /// answered is rejected; events of the ID still queued stay queued.
    pub fn destroy_id(&self, id: RdmaId) {
        let _ = self.call(|cm, now, h| {
            if cm.disconnect(now, h, id).is_err() {
                let _ = cm.reject(h, id, &[]);
            }
            cm.destroy_id(id);
            Ok(())
        });
    }

    /// `rdma_resolve_addr(3)`: reports `ADDR_RESOLVED` or `ADDR_ERROR` (see
    /// [`RdmaCm::resolve_addr`]). On RoCEv2 this needs no exchange, so the event is queued before
    /// this returns.
    ///
    /// # Errors
    /// As [`RdmaCm::resolve_addr`].
    pub fn resolve_addr(
        &self,
        id: RdmaId,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> Result<(), RdmaCmError> {
        self.call(|cm, _, h| cm.resolve_addr(h, id, src, dst))
    }

    /// `rdma_resolve_route(3)`: reports `ROUTE_RESOLVED` (queued before this returns).
    ///
    /// # Errors
    /// As [`RdmaCm::resolve_route`].
    pub fn resolve_route(&self, id: RdmaId) -> Result<(), RdmaCmError> {
        self.call(|cm, _, _| cm.resolve_route(id))
    }

    /// `rdma_bind_addr(3)` + `rdma_listen(3)` on `addr` (a wildcard IP listens on every local
    /// address). On a shared device address ([`GsiPort::shared_address`]) the service IDs the
    /// listen adds are claimed for this process, so that the REQs for them reach it
    /// ([`crate::link::udp::cm_route`]); the claims end when no ID listens on them any more
    /// (destroy) or the process dies.
    ///
    /// # Errors
    /// As [`RdmaCm::listen`]; [`RdmaCmError::InUse`] (`EADDRINUSE`, as Linux's `rdma_listen`
    /// for a port in use) when another process of the shared address (or, denying it, of
    /// another user) claims the service, and then `id` does not listen.
    pub fn listen(&self, id: RdmaId, addr: SocketAddr) -> Result<(), RdmaCmError> {
        let mut cm = lock(&self.inner.cm);
        let before = cm.cm().listeners().to_vec();
        cm.listen(id, addr)?;
        let added: Vec<u64> = cm
            .cm()
            .listeners()
            .iter()
            .filter(|s| !before.contains(s))
            .copied()
            .collect();
        if let Err(e) = self.inner.claim(&added) {
            cm.cancel_listen(id, &added);
            return Err(match e.kind() {
                io::ErrorKind::AddrInUse => RdmaCmError::InUse,
                _ => RdmaCmError::Cm(crate::cm::CmError::TooMany),
            });
        }
        Ok(())
    }

    /// The service IDs this process claims on its shared device address (empty on a device of
    /// its own).
    pub fn claimed(&self) -> Vec<u64> {
        lock(&self.inner.claims)
            .iter()
            .map(ServiceClaim::service_id)
            .collect()
    }

    /// `rdma_set_option(3)` `RDMA_OPTION_ID_ACK_TIMEOUT`: see [`RdmaCm::set_ack_timeout`].
    ///
    /// # Errors
    /// As [`RdmaCm::set_ack_timeout`].
    pub fn set_ack_timeout(&self, id: RdmaId, timeout: u8) -> Result<(), RdmaCmError> {
        self.call(|cm, _, _| cm.set_ack_timeout(id, timeout))
    }

    /// `rdma_connect(3)` with the caller's RC QP `qpn` (in RESET; the CM moves it to INIT now and
    /// to RTR / RTS when the REP arrives) and at most 56 bytes of `private_data`; `ESTABLISHED`,
    /// `REJECTED` or `UNREACHABLE` follows. For a UD ID a SIDR_REQ (at most 180 bytes of
    /// `private_data`; the caller's UD QP is its own to bring up): `ESTABLISHED` with the peer's
    /// QPN and Q_Key, or `UNREACHABLE`.
    ///
    /// # Errors
    /// As [`RdmaCm::connect`].
    pub fn connect(&self, id: RdmaId, qpn: u32, private_data: &[u8]) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.connect(now, h, id, qpn, private_data))
    }

    /// [`CmService::connect`] with `rdma_conn_param`'s depths and retry counts
    /// ([`RdmaCm::connect_with`]).
    ///
    /// # Errors
    /// As [`RdmaCm::connect_with`].
    pub fn connect_with(
        &self,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.connect_with(now, h, id, qpn, private_data, param))
    }

    /// `rdma_accept(3)` of a `CONNECT_REQUEST`'s ID with the caller's RC QP `qpn` (in RESET; the
    /// CM moves it to RTR now and to RTS when the RTU arrives: `ESTABLISHED`) and at most 196
    /// bytes of REP `private_data`; of a UD ID, a SIDR_REP naming UD QP `qpn` (at most 136 bytes).
    ///
    /// # Errors
    /// As [`RdmaCm::accept`].
    pub fn accept(&self, id: RdmaId, qpn: u32, private_data: &[u8]) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.accept(now, h, id, qpn, private_data))
    }

    /// [`CmService::accept`] with `rdma_conn_param`'s depths and RNR retry count
    /// ([`RdmaCm::accept_with`]).
    ///
    /// # Errors
    /// As [`RdmaCm::accept_with`].
    pub fn accept_with(
        &self,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.accept_with(now, h, id, qpn, private_data, param))
    }

    /// `rdma_connect(3)` on an ID without `id->qp`: QP `qpn` is the caller's to move
    /// ([`RdmaCm::connect_external`]); `CONNECT_RESPONSE` follows the REP, then the caller's
    /// [`CmService::establish`].
    ///
    /// # Errors
    /// As [`RdmaCm::connect_external`].
    pub fn connect_external(
        &self,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.connect_external(now, h, id, qpn, private_data, param))
    }

    /// `rdma_accept(3)` on an ID without `id->qp`: QP `qpn` is already in RTS by the caller
    /// ([`RdmaCm::accept_external`]).
    ///
    /// # Errors
    /// As [`RdmaCm::accept_external`].
    pub fn accept_external(
        &self,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.accept_external(now, h, id, qpn, private_data, param))
    }

    /// `rdma_establish(3)`: the RTU after `CONNECT_RESPONSE` ([`RdmaCm::establish`]).
    ///
    /// # Errors
    /// As [`RdmaCm::establish`].
    pub fn establish(&self, id: RdmaId) -> Result<(), RdmaCmError> {
        self.call(|cm, _, h| cm.establish(h, id))
    }

    /// `rdma_init_qp_attr(3)` for RTR or RTS of an RC connection ([`RdmaCm::init_qp_attr`]).
    ///
    /// # Errors
    /// As [`RdmaCm::init_qp_attr`].
    pub fn init_qp_attr(
        &self,
        id: RdmaId,
        to: QpState,
    ) -> Result<(QpAttr, QpAttrMask), RdmaCmError> {
        self.call(|cm, _, h| cm.init_qp_attr(h, id, to))
    }

    /// `rdma_reject(3)` of a `CONNECT_REQUEST`'s ID with at most 148 bytes of `private_data`
    /// (the peer sees `REJECTED`, status 28).
    ///
    /// # Errors
    /// As [`RdmaCm::reject`].
    pub fn reject(&self, id: RdmaId, private_data: &[u8]) -> Result<(), RdmaCmError> {
        self.call(|cm, _, h| cm.reject(h, id, private_data))
    }

    /// `rdma_disconnect(3)`: the QP goes to ERR, a DREQ is sent; `DISCONNECTED` and then
    /// `TIMEWAIT_EXIT` follow on both sides.
    ///
    /// # Errors
    /// As [`RdmaCm::disconnect`].
    pub fn disconnect(&self, id: RdmaId) -> Result<(), RdmaCmError> {
        self.call(|cm, now, h| cm.disconnect(now, h, id))
    }

    /// The local and remote addresses of `id` ([`RdmaCm::addresses`]).
    pub fn addresses(&self, id: RdmaId) -> Option<(Option<SocketAddr>, Option<SocketAddr>)> {
        lock(&self.inner.cm).addresses(id)
    }

    /// Runs `f` on the CM (its counters, [`RdmaCm::refused`], the IB CM underneath).
    pub fn with_cm<R>(&self, f: impl FnOnce(&RdmaCm) -> R) -> R {
        f(&lock(&self.inner.cm))
    }

    /// The oldest queued event (`rdma_get_cm_event(3)`), waiting at most `timeout` for one
    /// (`Duration::ZERO`: do not wait); `None` when none came.
    pub fn get_event(&self, timeout: Duration) -> Option<RdmaCmEvent> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut q = lock(&self.inner.queue);
        loop {
            if let Some(e) = q.events.pop_front() {
                if q.events.is_empty() {
                    // Not readable any more; a read error leaves it readable, never silent.
                    let _ = self.inner.ready.take();
                }
                return Some(e);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                None => IDLE_SLEEP,
            };
            if left.is_zero() {
                return None;
            }
            q = self
                .inner
                .queue_cv
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// An eventfd(2) that is readable exactly while an event is queued (poll(2) it for `POLLIN`,
    /// then call [`CmService::get_event`]); never read it directly.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.inner.ready.as_fd()
    }

    /// What the service thread has done.
    pub fn counters(&self) -> ServiceCounters {
        let mut c = *lock(&self.inner.counters);
        c.turns = self.inner.turns.load(Ordering::Relaxed);
        c
    }
}

impl AsFd for CmService {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.event_fd()
    }
}

impl Drop for CmService {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = self.inner.wake.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        if let Some(g) = self.inner.gsi() {
            let _ = g.set_mad_hook(None);
        }
    }
}
