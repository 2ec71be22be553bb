//! RDMA CM over the IB CM ([`crate::cm`]): IP addressing for connections, as Linux
//! `drivers/infiniband/core/cma.c` and librdmacm give it (`rdma_resolve_addr`, `rdma_listen`,
//! `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`, and the `rdma_cm_event`s).
//!
//! * **Service IDs**: a port of port space `RDMA_PS_TCP` (0x0106) is the IB service ID
//!   `0x0000_0000_0106_pppp` ([`roce::cm::service_id`]), of `RDMA_PS_UDP` (0x0111)
//!   `0x0000_0000_0111_pppp`, of `RDMA_PS_IB` (0x013F) `0x0000_0000_013F_pppp`. TCP IDs connect
//!   RC QPs with REQ / REP / RTU, UDP IDs resolve UD QPs with SIDR, and an IB ID does either, after the QP type
//!   it was made for (Linux `ucma_get_qp_type`: RC for `rdma_create_id`, the `rdma_addrinfo`'s
//!   `ai_qp_type` for `rdma_create_ep`; [`RdmaCm::create_id_qpt`]). A listener takes only
//!   requests of its port space and QP type: REQs for an RC ID, SIDR_REQs for a UD one (`cma.c`
//!   `cma_check_req_qp_type`); others are refused as for an unknown service. `RDMA_PS_IPOIB` is
//!   not taken: its UD Q_Key is the IPoIB broadcast group's, from an SA MCMemberRecord (`cma.c`
//!   `cma_set_qkey`), and RoCE has neither.
//! * **UD** (`RDMA_PS_UDP`, [`RdmaCm::create_id_ps`]): as Linux `cma.c` (`cma_resolve_ib_udp`,
//!   `cma_sidr_rep_handler`), [`RdmaCm::connect`] sends a SIDR_REQ (IBTA §12.11) whose private
//!   data starts with the [`CmaHdr`] (180 bytes left for the consumer); the listener sees
//!   `CONNECT_REQUEST` with [`UdParam`] (QPN and Q_Key 0), [`RdmaCm::accept`] answers a SIDR_REP
//!   with the serving QPN and Q_Key [`RDMA_UDP_QKEY`], [`RdmaCm::reject`] a SIDR_REP with status
//!   `Reject` (2). The active side sees `ESTABLISHED` with the peer's QPN and Q_Key, or
//!   `UNREACHABLE` with the SIDR_REP's status, or -ETIMEDOUT when the SIDR_REQ's retries are
//!   spent; a Q_Key other than [`RDMA_UDP_QKEY`] is `ADDR_ERROR` -EINVAL (`cma_set_qkey`).
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

use roce::cm::{port_space, service_id, CmaHdr, SidrStatus};

pub use crate::cm::ConnParam;

use crate::cm::{AcceptParams, Cm, CmConfig, CmError, CmEventKind, CommId, ConnectParams};
use crate::engine::gsi::ReceivedMad;
use crate::engine::{Instant, SoftHca};
use crate::verbs::gid::{Gid, GidType};
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::{QpAttr, QpAttrMask, QpState};
use crate::verbs::random::{OsRandom, RandomSource};

/// Most RDMA CM IDs (listeners and connections).
pub const MAX_IDS: usize = 4096;

/// `-ETIMEDOUT`, the status of `UNREACHABLE` and `CONNECT_ERROR`.
pub const ETIMEDOUT: i32 = -110;
/// `-EADDRNOTAVAIL`: no local GID for the destination's family / scope.
pub const EADDRNOTAVAIL: i32 = -99;
/// `-EINVAL`: a link-local destination without a scope id; a SIDR_REP with a foreign Q_Key.
pub const EINVAL: i32 = -22;

/// The Q_Key of `RDMA_PS_UDP` IDs (Linux `include/rdma/rdma_cm.h` `RDMA_UDP_QKEY`): the UD QP
/// of either side uses it, and the SIDR_REP of an accept carries it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (librdmacm `rdma_cma.h`): as many RDMA READs /
/// atomics as the device allows (for an accept: at most what the request asked).
pub const RDMA_MAX_RD_ATOMIC: u8 = 0xFF;

/// The parameters [`RdmaCm::connect`] and [`RdmaCm::accept`] use: 4 RDMA READs / atomics each
/// way, retry and RNR retry counts 7.
pub const DEFAULT_CONN_PARAM: ConnParam = ConnParam {
    responder_resources: 4,
    initiator_depth: 4,
    flow_control: false,
    retry_count: 7,
    rnr_retry_count: 7,
    srq: false,
    qp_num: 0,
};

/// Consumer private data of a SIDR_REQ: 216 bytes less the [`CmaHdr`] (Linux
/// `rdma_connect`'s limit for UD).
pub const SIDR_REQ_USER_DATA_LEN: usize = roce::cm::SIDR_REQ_PRIVATE_DATA_LEN - CmaHdr::LEN;

/// The UD fields of `struct rdma_ud_param` (librdmacm `rdma_cma.h`) besides the private data:
/// for `ESTABLISHED` of a UD ID the peer's serving QPN and Q_Key (its address handle is the
/// route to [`RdmaCm::remote_gid`]); for a UD `CONNECT_REQUEST` both 0, as `cma.c` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdParam {
    /// The peer's UD QPN (24 bits).
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

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
    /// The consumer's private data (after the [`CmaHdr`] in a REQ or SIDR_REQ).
    pub private_data: Vec<u8>,
    /// For events of a UD ID (`RDMA_PS_UDP`): `struct rdma_ud_param`'s QPN and Q_Key.
    pub ud: Option<UdParam>,
    /// `struct rdma_conn_param` as `cma.c` fills it: the REQ's (`CONNECT_REQUEST`) or the
    /// REP's (the active side's `ESTABLISHED`) parameters from this side's view; `None` for the
    /// other events (all zero in librdmacm's struct).
    pub conn: Option<ConnParam>,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaCmError {
    /// No such ID, or not in a state that allows the call (e.g. connect before route resolution).
    BadState,
    /// Private data too long (56 bytes for `connect`, 180 for a UD `connect`).
    PrivateDataTooLong,
    /// A port space other than `RDMA_PS_TCP` / `RDMA_PS_UDP`.
    Unsupported,
    /// Responder resources or initiator depth above the device's limit (librdmacm
    /// `ucma_valid_param`: `EINVAL`).
    BadParam,
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
            RdmaCmError::Unsupported => f.write_str("port space not supported"),
            RdmaCmError::BadParam => f.write_str("RDMA READ / atomic depth above the device's"),
            RdmaCmError::InUse => f.write_str("address in use or too many IDs"),
            RdmaCmError::Cm(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RdmaCmError {}

#[derive(Debug, Clone)]
struct IdState {
    /// `RDMA_PS_TCP`, `RDMA_PS_UDP` or `RDMA_PS_IB` ([`roce::cm::port_space`]).
    ps: u16,
    /// The ID's QP type is UD (SIDR), not RC (REQ / REP / RTU).
    ud: bool,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    route_resolved: bool,
    listening: bool,
    comm: Option<CommId>,
    /// UD: the outstanding SIDR_REQ of ours (active) or the reported one (passive).
    sidr: Option<u32>,
    /// Passive: the REQ's parameters (an accept's [`RDMA_MAX_RD_ATOMIC`] takes them).
    req_param: Option<ConnParam>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`, if set ([`RdmaCm::set_ack_timeout`]).
    ack_timeout: Option<u8>,
}

impl IdState {
    fn new(ps: u16, ud: bool) -> IdState {
        IdState {
            ps,
            ud,
            local: None,
            remote: None,
            route_resolved: false,
            listening: false,
            comm: None,
            sidr: None,
            req_param: None,
            ack_timeout: None,
        }
    }

    fn is_ud(&self) -> bool {
        self.ud
    }
}

/// The RDMA CM of one device; see the [module docs](self).
#[derive(Debug)]
pub struct RdmaCm {
    cm: Cm,
    ids: HashMap<RdmaId, IdState>,
    by_comm: HashMap<CommId, RdmaId>,
    /// Our outstanding SIDR_REQs (the IB CM's request IDs) and the IDs that sent them.
    by_sidr_out: HashMap<u32, RdmaId>,
    /// SIDR_REQs reported as `CONNECT_REQUEST`, waiting for accept / reject.
    by_sidr_in: HashMap<u32, RdmaId>,
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
            by_sidr_out: HashMap::new(),
            by_sidr_in: HashMap::new(),
            events: VecDeque::new(),
            refused: 0,
        }
    }

    /// The IB CM underneath (counters, connection count).
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// [`Cm::set_comm_id_prefix`] of the IB CM underneath (a shared device address: the
    /// process's slot in every Communication ID).
    pub fn set_comm_id_prefix(&mut self, mask: u32, value: u32) {
        self.cm.set_comm_id_prefix(mask, value);
    }

    /// Undoes a [`RdmaCm::listen`] of `id` that the caller could not complete (a service it
    /// added could not be claimed on a shared device): `id` stops listening, its address is
    /// forgotten, and the IB CM stops accepting `added`, the service IDs that listen added to
    /// [`Cm::listeners`].
    pub fn cancel_listen(&mut self, id: RdmaId, added: &[u64]) {
        if let Some(s) = self.ids.get_mut(&id).filter(|s| s.listening) {
            s.listening = false;
            s.local = None;
        }
        for &sid in added {
            self.cm.unlisten(sid);
        }
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
        self.create_id_ps(port_space::TCP)
    }

    /// `rdma_create_id` with port space `ps`, and the QP type librdmacm's `rdma_create_id` gives
    /// it: [`port_space::TCP`] and [`port_space::IB`] RC (REQ / REP / RTU), [`port_space::UDP`]
    /// UD (SIDR; see the [module docs](self)).
    ///
    /// # Errors
    /// [`RdmaCmError::InUse`] beyond [`MAX_IDS`]; [`RdmaCmError::Unsupported`] for another port
    /// space ([`port_space::IPOIB`] included: see the [module docs](self)).
    pub fn create_id_ps(&mut self, ps: u16) -> Result<RdmaId, RdmaCmError> {
        self.create_id_qpt(ps, ps == port_space::UDP)
    }

    /// `rdma_create_id` with port space `ps` for a QP of type UD (`ud`) or RC (`rdma_create_ep`
    /// passes the `rdma_addrinfo`'s `ai_qp_type`). Only [`port_space::IB`] lets the caller
    /// choose: TCP is RC, UDP is UD (Linux `ucma.c` `ucma_get_qp_type`).
    ///
    /// # Errors
    /// [`RdmaCmError::InUse`] beyond [`MAX_IDS`]; [`RdmaCmError::Unsupported`] for another port
    /// space; [`RdmaCmError::BadParam`] for a QP type the port space does not take.
    pub fn create_id_qpt(&mut self, ps: u16, ud: bool) -> Result<RdmaId, RdmaCmError> {
        let fixed = match ps {
            port_space::TCP => Some(false),
            port_space::UDP => Some(true),
            port_space::IB => None,
            _ => return Err(RdmaCmError::Unsupported),
        };
        if fixed.is_some_and(|f| f != ud) {
            return Err(RdmaCmError::BadParam);
        }
        let id = self.fresh_id().ok_or(RdmaCmError::InUse)?;
        self.ids.insert(id, IdState::new(ps, ud));
        Ok(id)
    }

    /// A new ID: nonzero, unused, from the OS random source (at most 64 draws); `None` once
    /// [`MAX_IDS`] are held or no draw was free.
    fn fresh_id(&self) -> Option<RdmaId> {
        if self.ids.len() >= MAX_IDS {
            return None;
        }
        (0..64)
            .map(|_| OsRandom.next_u32())
            .find(|id| *id != 0 && !self.ids.contains_key(id))
    }

    /// The port space of `id` ([`roce::cm::port_space`]); `None` for an unknown ID.
    pub fn port_space(&self, id: RdmaId) -> Option<u16> {
        self.ids.get(&id).map(|s| s.ps)
    }

    /// `rdma_destroy_id`: forgets the ID (a connection should be disconnected first; later events
    /// of its Communication ID are dropped). A listener's port stops taking REQs once no other ID
    /// listens on it (they are then rejected as for an unknown service, REJ reason 8).
    pub fn destroy_id(&mut self, id: RdmaId) {
        if let Some(s) = self.ids.remove(&id) {
            if let Some(c) = s.comm {
                self.by_comm.remove(&c);
            }
            if let Some(r) = s.sidr {
                self.by_sidr_out.remove(&r);
                // An unanswered SIDR_REQ is forgotten (its sender's retries end in UNREACHABLE);
                // CmService::destroy_id rejects it first, as cm.c's cm_destroy_id does.
                if self.by_sidr_in.remove(&r).is_some() {
                    self.cm.sidr_forget(r);
                }
            }
            if let Some(port) = s.local.filter(|_| s.listening).map(|l| l.port()) {
                let others = self.ids.values().any(|o| {
                    o.listening && o.ps == s.ps && o.local.is_some_and(|l| l.port() == port)
                });
                if !others {
                    self.cm.unlisten(service_id(s.ps, port));
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
        self.push_ud(id, event, status, private_data, None);
    }

    fn push_ud(
        &mut self,
        id: RdmaId,
        event: RdmaCmEventType,
        status: i32,
        private_data: Vec<u8>,
        ud: Option<UdParam>,
    ) {
        self.push_full(id, event, status, private_data, ud, None);
    }

    fn push_full(
        &mut self,
        id: RdmaId,
        event: RdmaCmEventType,
        status: i32,
        private_data: Vec<u8>,
        ud: Option<UdParam>,
        conn: Option<ConnParam>,
    ) {
        if self.events.len() < crate::cm::MAX_EVENTS {
            self.events.push_back(RdmaCmEvent {
                id,
                listen_id: None,
                event,
                status,
                private_data,
                ud,
                conn,
            });
        }
    }

    /// A SIDR_REQ for a listened-on UD service (`RDMA_PS_UDP`, or a UD ID of `RDMA_PS_IB`): a new UD ID and `CONNECT_REQUEST`
    /// (`cma_ib_req_handler` with `IB_CM_SIDR_REQ_RECEIVED`), or a SIDR_REP `Reject` when the
    /// [`CmaHdr`] is bad or names no listened-on address.
    fn on_sidr_request(&mut self, hca: &mut SoftHca, r: u32, sid: u64, private_data: &[u8]) {
        let port = (sid & 0xffff) as u16;
        let hdr = CmaHdr::parse(private_data).ok();
        let ps = u16::try_from(sid >> 16).ok();
        let listener = hdr
            .zip(ps)
            .and_then(|(h, ps)| self.listener_for(ps, true, SocketAddr::new(h.dst_addr, port)));
        let new_id = self.fresh_id();
        let (Some(h), Some(listen_id), Some(new_id)) = (hdr, listener, new_id) else {
            self.refused += 1;
            let _ = self.cm.sidr_answer(hca, r, None, &[]);
            return;
        };
        self.ids.insert(
            new_id,
            IdState {
                local: Some(SocketAddr::new(h.dst_addr, port)),
                remote: Some(SocketAddr::new(h.src_addr, h.src_port)),
                route_resolved: true,
                sidr: Some(r),
                ..IdState::new(self.ids[&listen_id].ps, true)
            },
        );
        self.by_sidr_in.insert(r, new_id);
        if self.events.len() < crate::cm::MAX_EVENTS {
            self.events.push_back(RdmaCmEvent {
                id: new_id,
                listen_id: Some(listen_id),
                event: RdmaCmEventType::ConnectRequest,
                status: 0,
                private_data: private_data[CmaHdr::LEN..].to_vec(),
                ud: Some(UdParam::default()),
                conn: None,
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

    /// `rdma_bind_addr` + `rdma_listen`: takes REQs (SIDR_REQs for a UD ID) for `addr`'s port in
    /// the ID's port space, from any local address when `addr`'s IP is unspecified (wildcard).
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for an unknown ID; [`RdmaCmError::InUse`] when another ID listens
    /// on the same address and port; [`RdmaCmError::Cm`] beyond the listener bound.
    pub fn listen(&mut self, id: RdmaId, addr: SocketAddr) -> Result<(), RdmaCmError> {
        if !self.ids.contains_key(&id) {
            return Err(RdmaCmError::BadState);
        }
        let ps = self.ids[&id].ps;
        let taken = self
            .ids
            .values()
            .any(|s| s.listening && s.ps == ps && s.local == Some(addr));
        if taken {
            return Err(RdmaCmError::InUse);
        }
        self.cm.listen(service_id(ps, addr.port()))?;
        if let Some(s) = self.ids.get_mut(&id) {
            s.local = Some(addr);
            s.listening = true;
        }
        Ok(())
    }

    /// `rdma_connect`: sends a REQ with the [`CmaHdr`] and `private_data` (at most 56 bytes) from
    /// RC QP `qpn`; for a UD ID a SIDR_REQ with the [`CmaHdr`] and `private_data` (at most
    /// [`SIDR_REQ_USER_DATA_LEN`] = 180 bytes; `qpn` is not sent, as in `cma_resolve_ib_udp`).
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
        self.connect_with(now, hca, id, qpn, private_data, &DEFAULT_CONN_PARAM)
    }

    /// [`RdmaCm::connect`] with `rdma_conn_param`'s `responder_resources` and `initiator_depth`
    /// (each at most the device's `max_qp_rd_atom` / `max_qp_init_rd_atom`, or
    /// [`RDMA_MAX_RD_ATOMIC`] for that limit), `retry_count` and `rnr_retry_count` (at most 7)
    /// in the REQ and on the QP, `flow_control` and `srq` in the REQ (Linux `cma_connect_ib`);
    /// the path MTU is the port's active MTU (as `cma.c` derives it from the netdev MTU on RoCE).
    /// `qp_num` is ignored (`qpn` is the QP).
    ///
    /// # Errors
    /// As [`RdmaCm::connect`]; [`RdmaCmError::BadParam`] above the device's limits.
    pub fn connect_with(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.connect_qp(now, hca, id, qpn, private_data, param, false)
    }

    /// [`RdmaCm::connect_with`] for a QP the consumer moves itself (librdmacm's external QP:
    /// `rdma_connect` on an ID without `id->qp`, the QPN from `rdma_conn_param.qp_num`): the CM
    /// never modifies QP `qpn`; the REP is reported as [`RdmaCmEventType::ConnectResponse`]
    /// with the REP's parameters, the consumer brings the QP to RTS with
    /// [`RdmaCm::init_qp_attr`] and sends the RTU with [`RdmaCm::establish`] (Linux `cma.c`
    /// `cma_ib_handler`, librdmacm `rdma_establish`).
    ///
    /// # Errors
    /// As [`RdmaCm::connect_with`].
    pub fn connect_external(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.connect_qp(now, hca, id, qpn, private_data, param, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn connect_qp(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
        external_qp: bool,
    ) -> Result<(), RdmaCmError> {
        let (responder_resources, initiator_depth) = rd_atomic_limits(hca, param, None)?;
        let s = self
            .ids
            .get(&id)
            .filter(|s| s.route_resolved && s.comm.is_none() && s.sidr.is_none())
            .cloned()
            .ok_or(RdmaCmError::BadState)?;
        let max = if s.is_ud() {
            SIDR_REQ_USER_DATA_LEN
        } else {
            CmaHdr::REQ_USER_DATA_LEN
        };
        if private_data.len() > max {
            return Err(RdmaCmError::PrivateDataTooLong);
        }
        let (Some(local), Some(remote)) = (s.local, s.remote) else {
            return Err(RdmaCmError::BadState);
        };
        // An unbound ID gets an ephemeral source port, as the kernel's cma_alloc_any_port.
        let src_port = match local.port() {
            0 => 0x8000 | (OsRandom.next_u32() as u16 & 0x7fff),
            p => p,
        };
        let mut data = [0u8; roce::cm::SIDR_REQ_PRIVATE_DATA_LEN];
        CmaHdr {
            src_port,
            src_addr: local.ip(),
            dst_addr: remote.ip(),
        }
        .emit(&mut data)
        .map_err(|_| RdmaCmError::BadState)?;
        data[CmaHdr::LEN..CmaHdr::LEN + private_data.len()].copy_from_slice(private_data);
        if s.is_ud() {
            let sid = service_id(s.ps, remote.port());
            let r = self
                .cm
                .sidr_resolve(now, hca, local.ip(), remote.ip(), sid, &data)?;
            if let Some(st) = self.ids.get_mut(&id) {
                st.sidr = Some(r);
                st.local = Some(SocketAddr::new(local.ip(), src_port));
            }
            self.by_sidr_out.insert(r, id);
            self.drain(hca);
            return Ok(());
        }
        let data = &data[..roce::cm::REQ_PRIVATE_DATA_LEN];
        let params = ConnectParams {
            qpn,
            local_ip: local.ip(),
            remote_ip: remote.ip(),
            service_id: service_id(s.ps, remote.port()),
            path_mtu: hca
                .context()
                .query_port(1)
                .map_err(|e| RdmaCmError::Cm(CmError::Verbs(e)))?
                .active_mtu,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            responder_resources,
            initiator_depth,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            flow_control: param.flow_control,
            srq: param.srq,
            private_data: data,
            external_qp,
        };
        let comm = self.cm.connect(now, hca, &params)?;
        if let Some(t) = s.ack_timeout {
            self.cm.set_ack_timeout(comm, t)?;
        }
        if let Some(st) = self.ids.get_mut(&id) {
            st.comm = Some(comm);
            st.local = Some(SocketAddr::new(local.ip(), src_port));
        }
        self.by_comm.insert(comm, id);
        self.drain(hca);
        Ok(())
    }

    /// The reported, unanswered SIDR_REQ of a UD `CONNECT_REQUEST`'s ID.
    fn sidr_in_of(&self, id: RdmaId) -> Option<u32> {
        self.ids
            .get(&id)
            .filter(|s| s.is_ud())
            .and_then(|s| s.sidr)
            .filter(|r| self.by_sidr_in.contains_key(r))
    }

    fn forget_sidr_in(&mut self, id: RdmaId, r: u32) {
        self.by_sidr_in.remove(&r);
        if let Some(s) = self.ids.get_mut(&id) {
            s.sidr = None;
        }
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK timeout
    /// (`ibv_qp_attr.timeout`, 4.096 us x 2^`timeout`) the CM gives `id`'s QP at RTS when it
    /// connects or accepts, over the one it computes (Linux `cma.c` `rdma_set_ack_timeout`;
    /// rdma_set_option(3)).
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for an unknown ID or a `timeout` over 31.
    pub fn set_ack_timeout(&mut self, id: RdmaId, timeout: u8) -> Result<(), RdmaCmError> {
        match self.ids.get_mut(&id) {
            Some(s) if timeout <= 31 => {
                s.ack_timeout = Some(timeout);
                Ok(())
            }
            _ => Err(RdmaCmError::BadState),
        }
    }

    fn comm_of(&self, id: RdmaId) -> Result<CommId, RdmaCmError> {
        self.ids
            .get(&id)
            .and_then(|s| s.comm)
            .ok_or(RdmaCmError::BadState)
    }

    /// `rdma_accept` of a `CONNECT_REQUEST`'s ID with RC QP `qpn` and REP `private_data` (at
    /// most 196 bytes); for a UD ID, answers the SIDR_REQ with UD QP `qpn`, Q_Key
    /// [`RDMA_UDP_QKEY`] and at most 136 bytes of SIDR_REP `private_data` (`cma_send_sidr_rep`
    /// with `IB_SIDR_SUCCESS`; no event follows on this side).
    ///
    /// # Errors
    /// As [`Cm::accept`] / [`Cm::sidr_answer`].
    pub fn accept(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        self.accept_with(now, hca, id, qpn, private_data, &DEFAULT_CONN_PARAM)
    }

    /// [`RdmaCm::accept`] with `rdma_conn_param`'s `responder_resources` and `initiator_depth`
    /// in the REP and on the QP (each at most the device's limit; [`RDMA_MAX_RD_ATOMIC`] takes
    /// the request's value within that limit, as librdmacm's `rdma_accept`; the QP's initiator
    /// depth is also at most the REQ's responder resources), `rnr_retry_count`, `flow_control`
    /// and `srq` in the REP.
    /// The QP's ACK timeout, retry and RNR retry counts are the REQ's (Linux `cm.c`
    /// `cm_req_handler`, `cm_init_qp_rts_attr`). For a UD ID the parameters are not used.
    ///
    /// # Errors
    /// As [`RdmaCm::accept`]; [`RdmaCmError::BadParam`] above the device's limits.
    pub fn accept_with(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.accept_qp(now, hca, id, qpn, private_data, param, false)
    }

    /// [`RdmaCm::accept_with`] for a QP the consumer moves itself (librdmacm's `rdma_accept` on
    /// an ID without `id->qp`): the consumer has brought QP `qpn` to RTS with
    /// [`RdmaCm::init_qp_attr`]; the CM sends the REP and never modifies the QP.
    ///
    /// # Errors
    /// As [`RdmaCm::accept_with`].
    pub fn accept_external(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
    ) -> Result<(), RdmaCmError> {
        self.accept_qp(now, hca, id, qpn, private_data, param, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn accept_qp(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: RdmaId,
        qpn: u32,
        private_data: &[u8],
        param: &ConnParam,
        external_qp: bool,
    ) -> Result<(), RdmaCmError> {
        if let Some(r) = self.sidr_in_of(id) {
            self.cm
                .sidr_answer(hca, r, Some((qpn, RDMA_UDP_QKEY)), private_data)?;
            self.forget_sidr_in(id, r);
            return Ok(());
        }
        let comm = self.comm_of(id)?;
        if let Some(t) = self.ids.get(&id).and_then(|s| s.ack_timeout) {
            self.cm.set_ack_timeout(comm, t)?;
        }
        let asked = self.ids.get(&id).and_then(|s| s.req_param);
        let (responder_resources, initiator_depth) = rd_atomic_limits(hca, param, asked)?;
        let p = AcceptParams {
            qpn,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            responder_resources,
            initiator_depth,
            rnr_retry_count: param.rnr_retry_count.min(7),
            flow_control: param.flow_control,
            srq: param.srq,
            private_data,
            external_qp,
        };
        let r = self.cm.accept(now, hca, comm, &p);
        self.drain(hca);
        Ok(r?)
    }

    /// `rdma_reject` of a `CONNECT_REQUEST`'s ID with `private_data` (at most 148 bytes); the
    /// peer sees `REJECTED` with status 28 (consumer reject). For a UD ID a SIDR_REP with status
    /// `Reject` and at most 136 bytes (the peer sees `UNREACHABLE` with status 2, as
    /// `cma_sidr_rep_handler` reports it).
    ///
    /// # Errors
    /// As [`Cm::reject`] / [`Cm::sidr_answer`].
    pub fn reject(
        &mut self,
        hca: &mut SoftHca,
        id: RdmaId,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        if let Some(r) = self.sidr_in_of(id) {
            self.cm.sidr_answer(hca, r, None, private_data)?;
            self.forget_sidr_in(id, r);
            return Ok(());
        }
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

    /// `rdma_establish`: the RTU of a connection whose REP was reported as
    /// [`RdmaCmEventType::ConnectResponse`] ([`RdmaCm::connect_external`]); no event follows on
    /// this side.
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for an ID without such a connection.
    pub fn establish(&mut self, hca: &mut SoftHca, id: RdmaId) -> Result<(), RdmaCmError> {
        let comm = self.comm_of(id)?;
        Ok(self.cm.establish(hca, comm)?)
    }

    /// `rdma_init_qp_attr` for RTR or RTS of an RC ID's connection ([`Cm::init_qp_attr`]): the
    /// passive side from its `CONNECT_REQUEST` on, the active side once the REP has come; the
    /// ACK timeout of [`RdmaCm::set_ack_timeout`] if set.
    ///
    /// # Errors
    /// [`RdmaCmError::BadState`] for another state or an ID without a connection.
    pub fn init_qp_attr(
        &self,
        hca: &SoftHca,
        id: RdmaId,
        to: QpState,
    ) -> Result<(QpAttr, QpAttrMask), RdmaCmError> {
        let comm = self.comm_of(id)?;
        let (mut attr, mask) = self.cm.init_qp_attr(hca, comm, to)?;
        if let Some(t) = self.ids.get(&id).and_then(|s| s.ack_timeout) {
            if mask.contains(QpAttrMask::TIMEOUT) {
                attr.timeout = t;
            }
        }
        Ok((attr, mask))
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
    /// wildcard, of port space `ps` and QP type `ud` (a REQ finds only RC listeners, a SIDR_REQ
    /// only UD ones: `cma.c` `cma_check_req_qp_type`). Addresses compare by IP and port only: the `cma_hdr`
    /// carries no IPv6 scope id or flow label, while a listener on a link-local address is bound
    /// with its scope (`rping -s -a fe80::1%eth0`); the REQ came in on this device, so on that
    /// link (as Linux `cma.c` `cma_match_net_dev` matches the receiving device, not a scope).
    fn listener_for(&self, ps: u16, ud: bool, dst: SocketAddr) -> Option<RdmaId> {
        let listening = || {
            self.ids
                .iter()
                .filter(move |(_, s)| s.listening && s.ps == ps && s.ud == ud)
        };
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
                    param,
                    ..
                } => {
                    let hdr = CmaHdr::parse(&private_data).ok();
                    let ps = u16::try_from(sid >> 16).ok();
                    let listener = hdr.zip(ps).and_then(|(h, ps)| {
                        self.listener_for(
                            ps,
                            false,
                            SocketAddr::new(h.dst_addr, (sid & 0xffff) as u16),
                        )
                    });
                    let new_id = self.fresh_id();
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
                            comm: Some(e.id),
                            req_param: Some(param),
                            ..IdState::new(self.ids[&listen_id].ps, false)
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
                            ud: None,
                            conn: Some(param),
                        });
                    }
                }
                CmEventKind::SidrRequest {
                    service_id: sid,
                    private_data,
                    ..
                } => self.on_sidr_request(hca, e.id, sid, &private_data),
                CmEventKind::SidrResolved {
                    status,
                    qpn,
                    qkey,
                    private_data,
                } => {
                    let Some(id) = self.by_sidr_out.remove(&e.id) else {
                        continue;
                    };
                    if let Some(s) = self.ids.get_mut(&id) {
                        s.sidr = None;
                    }
                    // cma_sidr_rep_handler: a status other than Success is UNREACHABLE with
                    // that status; a Q_Key other than the ID's is ADDR_ERROR -EINVAL
                    // (cma_set_qkey).
                    let (event, status, ud) = if status != SidrStatus::Success {
                        (
                            RdmaCmEventType::Unreachable,
                            i32::from(u8::from(status)),
                            None,
                        )
                    } else if qkey != RDMA_UDP_QKEY {
                        (RdmaCmEventType::AddrError, EINVAL, None)
                    } else {
                        let ud = UdParam {
                            qp_num: qpn & 0x00ff_ffff,
                            qkey,
                        };
                        (RdmaCmEventType::Established, 0, Some(ud))
                    };
                    self.push_ud(id, event, status, private_data, ud);
                }
                CmEventKind::Unreachable if self.by_sidr_out.contains_key(&e.id) => {
                    let Some(id) = self.by_sidr_out.remove(&e.id) else {
                        continue;
                    };
                    if let Some(s) = self.ids.get_mut(&id) {
                        s.sidr = None;
                    }
                    self.push_ud(
                        id,
                        RdmaCmEventType::Unreachable,
                        ETIMEDOUT,
                        Vec::new(),
                        None,
                    );
                }
                kind => {
                    let Some(&id) = self.by_comm.get(&e.id) else {
                        continue;
                    };
                    let mut conn = None;
                    let (event, status, data) = match kind {
                        CmEventKind::Established {
                            private_data,
                            param,
                        } => {
                            conn = param;
                            (RdmaCmEventType::Established, 0, private_data)
                        }
                        CmEventKind::ConnectResponse {
                            private_data,
                            param,
                        } => {
                            conn = Some(param);
                            (RdmaCmEventType::ConnectResponse, 0, private_data)
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
                    self.push_full(id, event, status, data, None, conn);
                }
            }
        }
    }
}

/// `(responder_resources, initiator_depth)` of `param` within the device's `max_qp_rd_atom` /
/// `max_qp_init_rd_atom`: [`RDMA_MAX_RD_ATOMIC`] is the limit, or `asked` (a request's
/// parameters, for an accept) within it (librdmacm `rdma_connect` / `rdma_accept`).
fn rd_atomic_limits(
    hca: &SoftHca,
    param: &ConnParam,
    asked: Option<ConnParam>,
) -> Result<(u8, u8), RdmaCmError> {
    let d = hca.context().query_device();
    let max_resp = d.max_qp_rd_atom.min(254) as u8;
    let max_init = d.max_qp_init_rd_atom.min(254) as u8;
    let pick = |v: u8, max: u8, asked: Option<u8>| match v {
        RDMA_MAX_RD_ATOMIC => Ok(asked.map_or(max, |a| a.min(max))),
        v if v <= max => Ok(v),
        _ => Err(RdmaCmError::BadParam),
    };
    Ok((
        pick(
            param.responder_resources,
            max_resp,
            asked.map(|a| a.responder_resources),
        )?,
        pick(
            param.initiator_depth,
            max_init,
            asked.map(|a| a.initiator_depth),
        )?,
    ))
}
