//! RDMA CM over the IB CM ([`crate::cm`]): IP addressing for connections, as Linux
//! `drivers/infiniband/core/cma.c` and librdmacm give it (`rdma_resolve_addr`, `rdma_listen`,
//! `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`, and the `rdma_cm_event`s).
//!
//! * **Service IDs**: a port of port space `RDMA_PS_TCP` (0x0106) is the IB service ID
//!   `0x0000_0000_0106_pppp` ([`roce::cm::service_id`]); only RC over `RDMA_PS_TCP` is built (no
//!   UD / `RDMA_PS_UDP`, which needs SIDR).
//! * **Private data**: the REQ's private data starts with the 36-byte [`CmaHdr`] (source port,
//!   source and destination IP), so at most 56 bytes are the consumer's (`rdma_connect`'s
//!   limit); a listener bound to a specific address takes only REQs whose header names it, a
//!   wildcard listener (`0.0.0.0` / `::`) any, the specific one first (cma.c
//!   `cma_find_listener`).
//! * **Address resolution**: on RoCEv2 a GID is the IP address (IPv4-mapped for IPv4, IBTA Annex
//!   A17.4.1), so [`RdmaCm::resolve_addr`] resolves the destination to its GID and picks the local
//!   GID of the same family (a link-local one for a link-local destination, which needs a scope
//!   id, as in Linux); it reports `ADDR_RESOLVED` or `ADDR_ERROR` (-EADDRNOTAVAIL, -EINVAL).
//!   [`RdmaCm::resolve_route`] reports `ROUTE_RESOLVED` (RoCE has no SA path query).
//! * **Events**: [`RdmaCmEventType`] has `enum rdma_cm_event_type`'s values; `status` is 0, the
//!   REJ reason for `REJECTED` (as librdmacm reports it), or -ETIMEDOUT (-110) for
//!   `UNREACHABLE` and `CONNECT_ERROR`.
//!
//! Sans-I/O like [`Cm`]: the driver feeds [`RdmaCm::handle_mad`] and [`RdmaCm::handle_timeout`].
//! [`CmService`] is that driver for a real device (any software device, e.g. from
//! [`crate::open::open`]): a thread woken by QP1's MADs and the CM's timers, and an event queue
//! with a bounded [`CmService::get_event`] and a pollable [`CmService::event_fd`].

mod service;

pub use service::{CmService, ServiceCounters, ServiceError, CALLER_POLL, MAD_BATCH};

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use roce::cm::{port_space, service_id, CmaHdr};

use crate::cm::{AcceptParams, Cm, CmConfig, CmError, CmEventKind, CommId, ConnectParams};
use crate::engine::gsi::ReceivedMad;
use crate::engine::{Instant, SoftHca};
use crate::verbs::device::PathMtu;
use crate::verbs::gid::{Gid, GidType};
use crate::verbs::mr::AccessFlags;
use crate::verbs::random::{OsRandom, RandomSource};

/// Most RDMA CM IDs (listeners and connections).
pub const MAX_IDS: usize = 4096;

/// `-ETIMEDOUT`, the status of `UNREACHABLE` and `CONNECT_ERROR`.
pub const ETIMEDOUT: i32 = -110;
/// `-EADDRNOTAVAIL`: no local GID for the destination's family / scope.
pub const EADDRNOTAVAIL: i32 = -99;
/// `-EINVAL`: a link-local destination without a scope id.
pub const EINVAL: i32 = -22;

/// `enum rdma_cm_event_type` (librdmacm `rdma_cma.h`), with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RdmaCmEventType {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`.
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit = 15,
}

/// An RDMA CM ID (`struct rdma_cm_id *` of librdmacm).
pub type RdmaId = u32;

/// One event (`struct rdma_cm_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCmEvent {
    /// The ID the event is for (for `CONNECT_REQUEST`: the new connection's ID).
    pub id: RdmaId,
    /// For `CONNECT_REQUEST`: the listening ID.
    pub listen_id: Option<RdmaId>,
    /// What happened.
    pub event: RdmaCmEventType,
    /// 0, the REJ reason (`REJECTED`), or a negative errno.
    pub status: i32,
    /// The consumer's private data (after the [`CmaHdr`] in a REQ).
    pub private_data: Vec<u8>,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaCmError {
    /// No such ID, or not in a state that allows the call (e.g. connect before route resolution).
    BadState,
    /// Private data too long (56 bytes for `connect`).
    PrivateDataTooLong,
    /// Port already listened on for this address, or [`MAX_IDS`] reached.
    InUse,
    /// The IB CM refused.
    Cm(CmError),
}

impl From<CmError> for RdmaCmError {
    fn from(e: CmError) -> Self {
        match e {
            CmError::PrivateDataTooLong => RdmaCmError::PrivateDataTooLong,
            e => RdmaCmError::Cm(e),
        }
    }
}

impl core::fmt::Display for RdmaCmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RdmaCmError::BadState => f.write_str("no such RDMA CM ID in a state that allows this"),
            RdmaCmError::PrivateDataTooLong => f.write_str("private data too long"),
            RdmaCmError::InUse => f.write_str("address in use or too many IDs"),
            RdmaCmError::Cm(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RdmaCmError {}

#[derive(Debug, Clone, Default)]
struct IdState {
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    route_resolved: bool,
    listening: bool,
    comm: Option<CommId>,
}

/// The RDMA CM of one device; see the [module docs](self).
#[derive(Debug)]
pub struct RdmaCm {
    cm: Cm,
    ids: HashMap<RdmaId, IdState>,
    by_comm: HashMap<CommId, RdmaId>,
    events: VecDeque<RdmaCmEvent>,
    /// REQs dropped for a bad [`CmaHdr`] or no matching listener address.
    refused: u64,
}

/// The local RoCEv2 GIDs of port 1 of `hca`, as addresses.
fn local_ips(hca: &SoftHca) -> Vec<IpAddr> {
    let Ok(port) = hca.context().query_port(1) else {
        return Vec::new();
    };
    (0..port.gid_tbl_len.min(256))
        .filter_map(|i| hca.context().query_gid(1, i).ok())
        .filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.is_zero())
        .map(|e| e.gid.to_ip())
        .collect()
}

fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

impl RdmaCm {
    /// An RDMA CM over a new [`Cm`] with `config`.
    pub fn new(config: CmConfig) -> RdmaCm {
        RdmaCm {
            cm: Cm::new(config),
            ids: HashMap::new(),
            by_comm: HashMap::new(),
            events: VecDeque::new(),
            refused: 0,
        }
    }

    /// The IB CM underneath (counters, connection count).
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// Connection requests refused at this layer (bad addressing header, no listener for the
    /// destination address).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// `rdma_create_id` (port space `RDMA_PS_TCP`).
    ///
    /// # Errors
    /// [`RdmaCmError::InUse`] beyond [`MAX_IDS`].
    pub fn create_id(&mut self) -> Result<RdmaId, RdmaCmError> {
        if self.ids.len() >= MAX_IDS {
            return Err(RdmaCmError::InUse);
        }
        let id = (0..64)
            .map(|_| OsRandom.next_u32())
            .find(|id| *id != 0 && !self.ids.contains_key(id))
            .ok_or(RdmaCmError::InUse)?;
        self.ids.insert(id, IdState::default());
        Ok(id)
    }

    /// `rdma_destroy_id`: forgets the ID (a connection should be disconnected first; later events
    /// of its Communication ID are dropped). A listener's port stops taking REQs once no other ID
    /// listens on it (they are then rejected as for an unknown service, REJ reason 8).
    pub fn destroy_id(&mut self, id: RdmaId) {
        if let Some(s) = self.ids.remove(&id) {
            if let Some(c) = s.comm {
                self.by_comm.remove(&c);
            }
            if let Some(port) = s.local.filter(|_| s.listening).map(|l| l.port()) {
                let others = self
                    .ids
                    .values()
                    .any(|o| o.listening && o.local.is_some_and(|l| l.port() == port));
                if !others {
                    self.cm.unlisten(service_id(port_space::TCP, port));
                }
            }
        }
    }

    /// The local and remote addresses of `id` (`rdma_get_local_addr` / `rdma_get_peer_addr`):
    /// set by [`RdmaCm::resolve_addr`], [`RdmaCm::listen`], [`RdmaCm::connect`] (the source
    /// port) and for a `CONNECT_REQUEST`'s new ID from the REQ's [`CmaHdr`]; `None` for an
    /// unknown ID.
    pub fn addresses(&self, id: RdmaId) -> Option<(Option<SocketAddr>, Option<SocketAddr>)> {
        self.ids.get(&id).map(|s| (s.local, s.remote))
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<RdmaCmEvent> {
        self.events.pop_front()
    }

    /// When [`RdmaCm::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    fn push(&mut self, id: RdmaId, event: RdmaCmEventType, status: i32, private_data: Vec<u8>) {
        if self.events.len() < crate::cm::MAX_EVENTS {
            self.events.push_back(RdmaCmEvent {
                id,
                listen_id: None,
                event,
                status,
                private_data,
            });
        }
    }

    /// `rdma_resolve_addr`: resolves `dst` to its GID and picks the local address (`src`, which
    /// must be a RoCEv2 GID of the device, or the first local GID of `dst`'s family; link-local
    /// for a link-local `dst`, which must carry a scope id). Reports `ADDR_RESOLVED`, or
    /// `ADDR_ERROR` with -EADDRNOTAVAIL / -EINVAL.
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for an unknown ID.
    pub fn resolve_addr(
        &mut self,
        hca: &SoftHca,
        id: RdmaId,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> Result<(), RdmaCmError> {
        if !self.ids.contains_key(&id) {
            return Err(RdmaCmError::BadState);
        }
        let dst_ip = match dst.ip() {
            // An IPv4-mapped IPv6 destination is IPv4 on RoCEv2 (Annex A17.4.1).
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let scoped = match dst {
            SocketAddr::V6(v6) => v6.scope_id() != 0,
            SocketAddr::V4(_) => false,
        };
        if is_link_local(dst_ip) && !scoped {
            self.push(id, RdmaCmEventType::AddrError, EINVAL, Vec::new());
            return Ok(());
        }
        let locals = local_ips(hca);
        let local = match src {
            Some(s) => locals.iter().copied().find(|&l| l == s),
            None => locals.iter().copied().find(|&l| {
                l.is_ipv4() == dst_ip.is_ipv4() && is_link_local(l) == is_link_local(dst_ip)
            }),
        };
        let Some(local) = local.filter(|l| l.is_ipv4() == dst_ip.is_ipv4()) else {
            self.push(id, RdmaCmEventType::AddrError, EADDRNOTAVAIL, Vec::new());
            return Ok(());
        };
        if let Some(s) = self.ids.get_mut(&id) {
            let port = s.local.map_or(0, |l| l.port());
            s.local = Some(SocketAddr::new(local, port));
            s.remote = Some(SocketAddr::new(dst_ip, dst.port()));
        }
        self.push(id, RdmaCmEventType::AddrResolved, 0, Vec::new());
        Ok(())
    }

    /// The GID `rdma_resolve_addr` resolved the destination of `id` to.
    pub fn remote_gid(&self, id: RdmaId) -> Option<Gid> {
        self.ids.get(&id)?.remote.map(|r| Gid::from(r.ip()))
    }

    /// `rdma_resolve_route`: on RoCE the path is the resolved addresses; reports
    /// `ROUTE_RESOLVED`.
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] unless the address is resolved.
    pub fn resolve_route(&mut self, id: RdmaId) -> Result<(), RdmaCmError> {
        let s = self
            .ids
            .get_mut(&id)
            .filter(|s| s.remote.is_some())
            .ok_or(RdmaCmError::BadState)?;
        s.route_resolved = true;
        self.push(id, RdmaCmEventType::RouteResolved, 0, Vec::new());
        Ok(())
    }

    /// `rdma_bind_addr` + `rdma_listen`: takes REQs for `addr`'s port (`RDMA_PS_TCP`), from any
    /// local address when `addr`'s IP is unspecified (wildcard).
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for an unknown ID; [`RdmaCmError::InUse`] when another ID listens
    /// on the same address and port; [`RdmaCmError::Cm`] beyond the listener bound.
    pub fn listen(&mut self, id: RdmaId, addr: SocketAddr) -> Result<(), RdmaCmError> {
        if !self.ids.contains_key(&id) {
            return Err(RdmaCmError::BadState);
        }
        let taken = self
            .ids
            .values()
            .any(|s| s.listening && s.local == Some(addr));
        if taken {
            return Err(RdmaCmError::InUse);
        }
        self.cm.listen(service_id(port_space::TCP, addr.port()))?;
        if let Some(s) = self.ids.get_mut(&id) {
            s.local = Some(addr);
            s.listening = true;
        }
        Ok(())
    }

    /// `rdma_connect`: sends a REQ with the [`CmaHdr`] and `private_data` (at most 56 bytes) from
    /// RC QP `qpn`.
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] unless the route is resolved; [`RdmaCmError::PrivateDataTooLong`];
    /// the IB CM's refusals.
    pub fn connect(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        if private_data.len() > CmaHdr::REQ_USER_DATA_LEN {
            return Err(RdmaCmError::PrivateDataTooLong);
        }
        let s = self
            .ids
            .get(&id)
            .filter(|s| s.route_resolved && s.comm.is_none())
            .cloned()
            .ok_or(RdmaCmError::BadState)?;
        let (Some(local), Some(remote)) = (s.local, s.remote) else {
            return Err(RdmaCmError::BadState);
        };
        // An unbound ID gets an ephemeral source port, as the kernel's cma_alloc_any_port.
        let src_port = match local.port() {
            0 => 0x8000 | (OsRandom.next_u32() as u16 & 0x7fff),
            p => p,
        };
        let mut data = [0u8; roce::cm::REQ_PRIVATE_DATA_LEN];
        CmaHdr {
            src_port,
            src_addr: local.ip(),
            dst_addr: remote.ip(),
        }
        .emit(&mut data)
        .map_err(|_| RdmaCmError::BadState)?;
        data[CmaHdr::LEN..CmaHdr::LEN + private_data.len()].copy_from_slice(private_data);
        let params = ConnectParams {
            qpn,
            local_ip: local.ip(),
            remote_ip: remote.ip(),
            service_id: service_id(port_space::TCP, remote.port()),
            path_mtu: PathMtu::Mtu1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            rd_atomic: 4,
            private_data: &data,
        };
        let comm = self.cm.connect(now, hca, &params)?;
        if let Some(st) = self.ids.get_mut(&id) {
            st.comm = Some(comm);
            st.local = Some(SocketAddr::new(local.ip(), src_port));
        }
        self.by_comm.insert(comm, id);
        self.drain(hca);
        Ok(())
    }

    fn comm_of(&self, id: RdmaId) -> Result<CommId, RdmaCmError> {
        self.ids
            .get(&id)
            .and_then(|s| s.comm)
            .ok_or(RdmaCmError::BadState)
    }

    /// `rdma_accept` of a `CONNECT_REQUEST`'s ID with RC QP `qpn` and REP `private_data` (at
    /// most 196 bytes).
    ///
    /// # Errors
    /// As [`Cm::accept`].
    pub fn accept(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        let comm = self.comm_of(id)?;
        let p = AcceptParams {
            qpn,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            rd_atomic: 4,
            private_data,
        };
        let r = self.cm.accept(now, hca, comm, &p);
        self.drain(hca);
        Ok(r?)
    }

    /// `rdma_reject` of a `CONNECT_REQUEST`'s ID with `private_data` (at most 148 bytes); the
    /// peer sees `REJECTED` with status 28 (consumer reject).
    ///
    /// # Errors
    /// As [`Cm::reject`].
    pub fn reject(
        &mut self,
        hca: &mut SoftHca,
        id: RdmaId,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        let comm = self.comm_of(id)?;
        self.cm.reject(hca, comm, private_data)?;
        self.by_comm.remove(&comm);
        if let Some(s) = self.ids.get_mut(&id) {
            s.comm = None;
        }
        Ok(())
    }

    /// `rdma_disconnect`, from either side.
    ///
    /// # Errors
    /// As [`Cm::disconnect`].
    pub fn disconnect(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
    ) -> Result<(), RdmaCmError> {
        let comm = self.comm_of(id)?;
        let r = self.cm.disconnect(now, hca, comm);
        self.drain(hca);
        Ok(r?)
    }

    /// A MAD from QP1 ([`SoftHca::poll_mad`]).
    pub fn handle_mad(&mut self, now: Instant, hca: &mut SoftHca, m: &ReceivedMad) {
        self.cm.handle_mad(now, hca, m);
        self.drain(hca);
    }

    /// The IB CM's timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, hca: &mut SoftHca) {
        self.cm.handle_timeout(now, hca);
        self.drain(hca);
    }

    /// The listener for a REQ to `dst` (port and address): a specific address first, then a
    /// wildcard. Addresses compare by IP and port only: the `cma_hdr` carries no IPv6 scope id
    /// or flow label, while a listener on a link-local address is bound with its scope
    /// (`rping -s -a fe80::1%eth0`); the REQ came in on this device, so on that link (as Linux
    /// `cma.c` `cma_match_net_dev` matches the receiving device, not a scope).
    fn listener_for(&self, dst: SocketAddr) -> Option<RdmaId> {
        let listening = || self.ids.iter().filter(|(_, s)| s.listening);
        listening()
            .find(|(_, s)| {
                s.local
                    .is_some_and(|l| l.ip() == dst.ip() && l.port() == dst.port())
            })
            .or_else(|| {
                listening().find(|(_, s)| {
                    s.local.is_some_and(|l| {
                        l.port() == dst.port()
                            && l.ip().is_unspecified()
                            && l.is_ipv4() == dst.is_ipv4()
                    })
                })
            })
            .map(|(&id, _)| id)
    }

    /// Translates the IB CM's events into RDMA CM events.
    fn drain(&mut self, hca: &mut SoftHca) {
        while let Some(e) = self.cm.poll_event() {
            match e.kind {
                CmEventKind::ConnectRequest {
                    service_id: sid,
                    private_data,
                    ..
                } => {
                    let hdr = CmaHdr::parse(&private_data).ok();
                    let listener = hdr.and_then(|h| {
                        self.listener_for(SocketAddr::new(h.dst_addr, (sid & 0xffff) as u16))
                    });
                    let new_id = (self.ids.len() < MAX_IDS)
                        .then(|| {
                            (0..64)
                                .map(|_| OsRandom.next_u32())
                                .find(|id| *id != 0 && !self.ids.contains_key(id))
                        })
                        .flatten();
                    let (Some(h), Some(listen_id), Some(new_id)) = (hdr, listener, new_id) else {
                        self.refused += 1;
                        let _ = self.cm.reject(hca, e.id, &[]);
                        continue;
                    };
                    self.ids.insert(
                        new_id,
                        IdState {
                            local: Some(SocketAddr::new(h.dst_addr, (sid & 0xffff) as u16)),
                            remote: Some(SocketAddr::new(h.src_addr, h.src_port)),
                            route_resolved: true,
                            listening: false,
                            comm: Some(e.id),
                        },
                    );
                    self.by_comm.insert(e.id, new_id);
                    if self.events.len() < crate::cm::MAX_EVENTS {
                        self.events.push_back(RdmaCmEvent {
                            id: new_id,
                            listen_id: Some(listen_id),
                            event: RdmaCmEventType::ConnectRequest,
                            status: 0,
                            private_data: private_data[CmaHdr::LEN..].to_vec(),
                        });
                    }
                }
                // UD (RDMA_PS_UDP, SIDR) is not offered at this layer: refuse, do not leave it
                // pending.
                CmEventKind::SidrRequest { .. } => {
                    self.refused += 1;
                    let _ = self.cm.sidr_answer(hca, e.id, None, &[]);
                }
                CmEventKind::SidrResolved { .. } => {}
                kind => {
                    let Some(&id) = self.by_comm.get(&e.id) else {
                        continue;
                    };
                    let (event, status, data) = match kind {
                        CmEventKind::Established { private_data } => {
                            (RdmaCmEventType::Established, 0, private_data)
                        }
                        CmEventKind::Rejected {
                            reason,
                            private_data,
                        } => (
                            RdmaCmEventType::Rejected,
                            i32::from(u16::from(reason)),
                            private_data,
                        ),
                        CmEventKind::Unreachable => {
                            (RdmaCmEventType::Unreachable, ETIMEDOUT, Vec::new())
                        }
                        CmEventKind::ConnectError => {
                            (RdmaCmEventType::ConnectError, ETIMEDOUT, Vec::new())
                        }
                        CmEventKind::Disconnected => (RdmaCmEventType::Disconnected, 0, Vec::new()),
                        CmEventKind::TimewaitExit => (RdmaCmEventType::TimewaitExit, 0, Vec::new()),
                        CmEventKind::ConnectRequest { .. }
                        | CmEventKind::SidrRequest { .. }
                        | CmEventKind::SidrResolved { .. } => continue,
                    };
                    if matches!(
                        event,
                        RdmaCmEventType::Rejected
                            | RdmaCmEventType::Unreachable
                            | RdmaCmEventType::ConnectError
                            | RdmaCmEventType::TimewaitExit
                    ) {
                        // The IB CM forgot the Communication ID.
                        self.by_comm.remove(&e.id);
                        if let Some(s) = self.ids.get_mut(&id) {
                            s.comm = None;
                        }
                    }
                    self.push(id, event, status, data);
                }
            }
        }
    }
}
