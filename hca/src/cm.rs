//! The IB communication manager (CM, IBTA vol. 1 chapter 12) as a sans-I/O state machine over a
//! [`SoftHca`]'s QP1 ([`crate::engine::gsi`]).
//!
//! [`Cm`] owns no socket, thread or clock. Its inputs are the consumer's calls
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`], [`Cm::disconnect`]), the
//! MADs QP1 received ([`Cm::handle_mad`], fed from [`SoftHca::poll_mad`]) and the clock
//! ([`Cm::handle_timeout`] when [`Cm::poll_timeout`] is due); its outputs are MADs queued on QP1
//! ([`SoftHca::gsi_send`]), the QP transitions it makes on the engine, and [`CmEvent`]s
//! ([`Cm::poll_event`]), named as `rdma_cm`'s events.
//!
//! The connection state machine follows IBTA §12.9 (figure 162) and Linux `drivers/infiniband/
//! core/cm.c`, the implementation rxe peers run:
//!
//! * **Active side**: [`Cm::connect`] moves the QP to INIT and sends a REQ with an OS-random
//!   starting PSN ([`crate::verbs::random::random_psn`]) and Communication ID. The REQ is resent
//!   every [`CmConfig::response_timeout`] (its `remote_cm_response_timeout`), at most
//!   [`CmConfig::max_cm_retries`] times; an MRA extends the wait by its service timeout. Then the
//!   QP goes to ERR and [`CmEventKind::Unreachable`] is reported. A REP moves the QP INIT -> RTR
//!   (the REP's QPN, the REQ's path MTU) -> RTS and sends an RTU. A message's starting PSN is the
//!   first PSN its sender receives, as Linux `cm.c` sets the QPs: the active side receives from
//!   its REQ's and sends from the REP's, the passive side the other way round
//!   ([`CmEventKind::Established`]); a repeated REP (the RTU was lost) gets the RTU again. A REJ
//!   moves the QP to ERR ([`CmEventKind::Rejected`] with the reason and private data).
//! * **Passive side**: a REQ for a service nobody listens on is answered with REJ
//!   `InvalidServiceId`; a REQ that is not RC, names no valid path MTU, or would exceed the
//!   bounds ([`CmConfig::max_connections`], [`CmConfig::max_per_remote`]) with REJ
//!   `InvalidTransportType` / `InvalidMtu` / `NoResources`. Otherwise
//!   [`CmEventKind::ConnectRequest`] is reported once: a duplicated REQ is recognised by the
//!   sender's address and Communication ID and is never reported again (while the REP is out it
//!   gets the REP again). [`Cm::accept`] moves the QP RESET -> INIT -> RTR -> RTS (as Linux
//!   `cma_accept` and librdmacm's `rdma_accept` do, so the consumer may send at once) and sends a REP,
//!   resent on the REQ's `local_cm_response_timeout` at most the REQ's `max_cm_retries` times
//!   (the timers the peer states, IBTA §12.7.27); the passive QP takes the REQ's local ACK
//!   timeout, retry count and RNR retry count, the active QP the REP's RNR retry count
//!   (`cm_init_qp_rts_attr`), and the parameters travel to the peer's events from its view
//!   ([`ConnParam`]); an RTU completes it
//!   ([`CmEventKind::Established`]); when the retries are spent the QP goes to ERR, a REJ
//!   `Timeout` is sent and [`CmEventKind::ConnectError`] reported. [`Cm::reject`] sends REJ
//!   `ConsumerDefined` with private data.
//! * **Disconnect** (either side): [`Cm::disconnect`] moves the QP to ERR and sends a DREQ,
//!   resent like the REQ; a DREP, or the retries spent, gives [`CmEventKind::Disconnected`]. A
//!   DREQ received moves the QP to ERR, answers DREP and reports `Disconnected`; a repeated DREQ
//!   (the DREP was lost) is answered again, also for a connection already gone (Linux
//!   `cm_dreq_handler`). Both sides then spend [`CmConfig::timewait`] in timewait, which ends
//!   with [`CmEventKind::TimewaitExit`], after which the Communication ID is forgotten.
//! * A REP, RTU or DREP that matches no connection is answered with REJ `InvalidCommId` (REP)
//!   or dropped, and counted ([`CmCounters`]); malformed MADs are dropped and counted. LAP/APR
//!   are refused (counted as unsupported).
//! * **SIDR** (UD service resolution, §12.11): [`Cm::sidr_resolve`] sends a SIDR_REQ, resent like
//!   a REQ, answered by [`CmEventKind::SidrResolved`] or [`CmEventKind::Unreachable`]. A SIDR_REQ
//!   for a listened-on service is reported once ([`CmEventKind::SidrRequest`], duplicates
//!   ignored) and answered by [`Cm::sidr_answer`]; for any other service SIDR_REP `Unsupported`.
//!
//! Every table is bounded: connections by [`CmConfig::max_connections`], listeners by
//! [`MAX_LISTENERS`], events by [`MAX_EVENTS`] (older events are kept, newer ones counted as
//! lost), so a flood of REQs cannot grow memory without bound.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use roce::cm::{self, Message, MsgKind, RejReason, TransportType};
use roce::mad::{self, MAD_LEN};

use crate::engine::gsi::ReceivedMad;
use crate::engine::{Instant, SoftHca};
use crate::verbs::connect::{self, ConnectAttr};
use crate::verbs::device::PathMtu;
use crate::verbs::error::VerbsError;
use crate::verbs::gid::{Gid, GidType};
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::{QpAttr, QpAttrMask, QpState, QpType};
use crate::verbs::random::{random_psn, OsRandom, RandomSource};

/// Most listened-on service IDs.
pub const MAX_LISTENERS: usize = 256;
/// Most undelivered events; more are counted in [`CmCounters::events_lost`].
pub const MAX_EVENTS: usize = 4096;

/// The default local ACK timeout ([`CmConfig::local_ack_timeout`]: 4.096 us x 2^17, about
/// 0.54 s a try; with `retry_cnt` 7 about 4.3 s before `IBV_WC_RETRY_EXC_ERR`) that the REQ
/// states and the active side's QP uses (the passive side's takes the REQ's):
/// Linux's over RoCE, `packet_life_time + 1` (`cm_init_av_by_path` in `drivers/infiniband/core/
/// cm.c`) with `CMA_IBOE_PACKET_LIFETIME` 16 (`cma.c`). The verbs default of 14 (67 ms, 0.5 s
/// in all) made a pair of busy-polling perftest processes on a loaded 2-core machine give up
/// where rxe's would not (issue 19).
pub const ACK_TIMEOUT: u8 = 17;

/// The duration of a CM timeout code (IBTA vol. 1 §12.7.27: 4.096 µs · 2^code, code 0..=31).
pub fn timeout_of(code: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(code.min(31)))
}

/// The connection parameters a REQ or REP carries (IBTA vol. 1 §12.7, tables 106 and 109), as
/// Linux `cma.c` reports them in `struct rdma_conn_param` (`cma_set_req_event_data`,
/// `cma_set_rep_event_data`), seen from the local side: the peer's initiator depth is how many
/// RDMA READs / atomics this side must serve (`responder_resources`) and the peer's responder
/// resources how many this side may issue (`initiator_depth`), the swap Linux `cm.c`
/// (`cm_format_req_event`, `cm_format_rep_event`) makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// RDMA READs / atomics the peer may have outstanding at this side (0..=255).
    pub responder_resources: u8,
    /// RDMA READs / atomics this side may have outstanding at the peer (0..=255).
    pub initiator_depth: u8,
    /// The peer's end-to-end flow control bit.
    pub flow_control: bool,
    /// The REQ's retry count (3 bits; 0 in a REP, which has none).
    pub retry_count: u8,
    /// The RNR retry count (3 bits; 7 = retry forever, IBTA §9.7.5.2.8).
    pub rnr_retry_count: u8,
    /// Whether the peer's QP uses an SRQ.
    pub srq: bool,
    /// The peer's QPN (24 bits).
    pub qp_num: u32,
}

/// The ACK timeout of a connection's QP from the peer's CA ACK delay and the path's packet
/// life time (Linux `cm.c` `cm_ack_timeout`: packet life time + 1, raised by one when the ACK
/// delay is about as large, or the ACK delay + 1 when that is larger; at most 31).
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let plt = i32::from(packet_life_time);
    let delay = i32::from(ca_ack_delay);
    let mut t = plt + 1;
    if t >= delay {
        t += i32::from(delay >= t - 1);
    } else {
        t = delay + i32::from(t >= delay - 1);
    }
    t.min(31) as u8
}

/// The local ACK timeout of the passive side's QP from a REQ's primary local ACK timeout (Linux
/// `cm.c`: `cm_format_paths_from_req` takes the packet life time as that timeout less one,
/// `cm_init_av_by_path` adds one back: so the REQ's value, at least 1).
pub fn passive_ack_timeout(req_local_ack_timeout: u8) -> u8 {
    req_local_ack_timeout.clamp(1, 31)
}

/// CM tunables; `Default` gives Linux `cma.c`'s values (`CMA_CM_RESPONSE_TIMEOUT` 20,
/// `CMA_MAX_CM_RETRIES` 15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// This CM's response timeout code (5 bits; 4.096 µs · 2^code), sent in REQs as both
    /// response timeouts and used to resend REQs and DREQs.
    pub response_timeout: u8,
    /// How often a REQ or DREQ is resent before giving up (4 bits), sent in REQs.
    pub max_cm_retries: u8,
    /// Most connections (in any state, timewait included).
    pub max_connections: usize,
    /// Most connections with one remote address.
    pub max_per_remote: usize,
    /// How long a closed connection's Communication ID stays in timewait.
    pub timewait: Duration,
    /// The local ACK timeout code (5 bits) this CM's REQs state in their primary path and its
    /// active side's QPs use ([`ACK_TIMEOUT`] by default; the passive side takes the REQ's).
    pub local_ack_timeout: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 20,
            max_cm_retries: 15,
            max_connections: 1024,
            max_per_remote: 64,
            timewait: timeout_of(20),
            local_ack_timeout: ACK_TIMEOUT,
        }
    }
}

/// Counters of what the CM dropped or refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs that did not parse as CM messages.
    pub malformed: u64,
    /// Messages that match no connection or arrive in a state that takes none.
    pub unmatched: u64,
    /// Duplicated REQs (recognised, never reported twice).
    pub duplicate_req: u64,
    /// REPs resent by the peer while a [`CmEventKind::ConnectResponse`] waits for
    /// [`Cm::establish`] (recognised, never reported twice).
    pub duplicate_rep: u64,
    /// Messages resent after a timeout.
    pub retransmits: u64,
    /// REQs refused because a bound was reached.
    pub refused_resources: u64,
    /// LAP, APR and other unsupported messages.
    pub unsupported: u64,
    /// MADs QP1 could not queue (its send queue was full); timers resend what matters.
    pub send_failed: u64,
    /// Events dropped because [`MAX_EVENTS`] were undelivered.
    pub events_lost: u64,
}

/// A connection's handle: the local Communication ID (random, never 0).
pub type CommId = u32;

/// What happened (the `rdma_cm` event names, `enum rdma_cm_event_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a REQ for a listened-on service; answer with
    /// [`Cm::accept`] or [`Cm::reject`].
    ConnectRequest {
        /// The service ID asked for.
        service_id: u64,
        /// The requester's address.
        remote_ip: IpAddr,
        /// The local address the REQ came to.
        local_ip: IpAddr,
        /// The requester's QPN.
        remote_qpn: u32,
        /// The REQ's private data (92 bytes).
        private_data: Vec<u8>,
        /// The REQ's connection parameters, from this side's view.
        param: ConnParam,
        /// The REQ's path MTU.
        path_mtu: PathMtu,
    },
    /// `RDMA_CM_EVENT_ESTABLISHED`: the QP is in RTS.
    Established {
        /// The REP's (active side) or RTU's (passive side) private data.
        private_data: Vec<u8>,
        /// Active side: the REP's connection parameters, from this side's view; passive side
        /// (RTU): `None` (`cma.c` reports none).
        param: Option<ConnParam>,
    },
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the REP of a connection whose QP the consumer moves
    /// itself ([`ConnectParams::external_qp`]): the QP is untouched; the consumer brings it to
    /// RTS with [`Cm::init_qp_attr`] and calls [`Cm::establish`] to send the RTU (Linux `cma.c`
    /// `cma_ib_handler` for an ID without a QP, librdmacm `rdma_establish`).
    ConnectResponse {
        /// The REP's private data.
        private_data: Vec<u8>,
        /// The REP's connection parameters, from this side's view.
        param: ConnParam,
    },
    /// `RDMA_CM_EVENT_REJECTED`: the peer sent a REJ; the QP is in ERR.
    Rejected {
        /// The REJ's reason.
        reason: RejReason,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_UNREACHABLE`: the REQ's retries are spent; the QP is in ERR.
    Unreachable,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the REP's retries are spent; the QP is in ERR.
    ConnectError,
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is closed; the QP is in ERR.
    Disconnected,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the Communication ID is forgotten.
    TimewaitExit,
    /// A SIDR_REQ for a listened-on service (UD service resolution, IBTA §12.11): answer with
    /// [`Cm::sidr_answer`]; the event's `id` names the request.
    SidrRequest {
        /// The service ID asked for.
        service_id: u64,
        /// The requester's address.
        remote_ip: IpAddr,
        /// The local address the request came to.
        local_ip: IpAddr,
        /// The SIDR_REQ's private data (216 bytes).
        private_data: Vec<u8>,
    },
    /// The answer to [`Cm::sidr_resolve`] (`RDMA_CM_EVENT_ESTABLISHED` of a UD ID when `status`
    /// is `Success`, else `UNREACHABLE` in librdmacm).
    SidrResolved {
        /// The SIDR_REP's status.
        status: cm::SidrStatus,
        /// The serving UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data (136 bytes).
        private_data: Vec<u8>,
    },
}

/// One event of connection `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// The connection.
    pub id: CommId,
    /// What happened.
    pub kind: CmEventKind,
}

/// Why a consumer call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmError {
    /// No such connection, or not in a state that allows the call.
    BadState,
    /// Private data longer than the message carries (92 bytes REQ, 196 REP, 148 REJ).
    PrivateDataTooLong,
    /// The local address is not one of the device's RoCEv2 GIDs.
    NoSuchAddress,
    /// A bound was reached (connections, listeners).
    TooMany,
    /// A QP transition or QP1 send failed.
    Verbs(VerbsError),
}

impl From<VerbsError> for CmError {
    fn from(e: VerbsError) -> Self {
        CmError::Verbs(e)
    }
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::BadState => f.write_str("no such connection in a state that allows this"),
            CmError::PrivateDataTooLong => f.write_str("private data too long for the message"),
            CmError::NoSuchAddress => f.write_str("address is not a RoCEv2 GID of the device"),
            CmError::TooMany => f.write_str("connection or listener bound reached"),
            CmError::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CmError {}

/// What [`Cm::connect`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams<'a> {
    /// The local RC QP (RESET or INIT).
    pub qpn: u32,
    /// The local address (a RoCEv2 GID of the device).
    pub local_ip: IpAddr,
    /// The peer's address.
    pub remote_ip: IpAddr,
    /// The service to connect to.
    pub service_id: u64,
    /// Path MTU to propose.
    pub path_mtu: PathMtu,
    /// Remote access the QP grants.
    pub access: AccessFlags,
    /// RDMA READs / atomics the peer may have outstanding here (REQ responder resources; the
    /// QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs / atomics this QP may have outstanding (REQ initiator depth; the QP's
    /// `max_rd_atomic`, at most the REP's responder resources).
    pub initiator_depth: u8,
    /// The QP's `retry_cnt` (3 bits), sent in the REQ for the peer's QP.
    pub retry_count: u8,
    /// The RNR retry count the REQ asks of the peer's QP (3 bits; 7 = forever).
    pub rnr_retry_count: u8,
    /// The REQ's end-to-end flow control bit (`rdma_conn_param.flow_control`).
    pub flow_control: bool,
    /// The REQ's SRQ bit: the local QP uses an SRQ.
    pub srq: bool,
    /// REQ private data (at most 92 bytes).
    pub private_data: &'a [u8],
    /// The consumer moves the QP itself (librdmacm's external QP: `rdma_connect` on an ID
    /// without `id->qp`, the QPN from `rdma_conn_param.qp_num`): the CM never modifies it, the
    /// REP is reported as [`CmEventKind::ConnectResponse`] and the RTU waits for
    /// [`Cm::establish`].
    pub external_qp: bool,
}

/// What [`Cm::accept`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams<'a> {
    /// The local RC QP (RESET), to connect to the requester's.
    pub qpn: u32,
    /// Remote access the QP grants.
    pub access: AccessFlags,
    /// RDMA READs / atomics the requester may have outstanding here (REP responder
    /// resources; the QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs / atomics this QP may have outstanding (REP initiator depth; the QP's
    /// `max_rd_atomic`, at most the REQ's responder resources).
    pub initiator_depth: u8,
    /// The RNR retry count the REP asks of the requester's QP (3 bits; 7 = forever).
    pub rnr_retry_count: u8,
    /// The REP's end-to-end flow control bit.
    pub flow_control: bool,
    /// The REP's SRQ bit: the local QP uses an SRQ.
    pub srq: bool,
    /// REP private data (at most 196 bytes).
    pub private_data: &'a [u8],
    /// The consumer moves the QP itself (`rdma_accept` on an ID without `id->qp`): it brought
    /// the QP to RTS with [`Cm::init_qp_attr`] before accepting, and the CM never modifies it.
    pub external_qp: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP / REJ / MRA.
    ReqSent,
    /// Passive: REQ reported, waiting for the consumer.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active, external QP: REP received and reported, waiting for [`Cm::establish`].
    RepRcvd,
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    TimeWait,
}

#[derive(Debug, Clone)]
struct Conn {
    state: State,
    local_ip: IpAddr,
    remote_ip: IpAddr,
    remote_id: u32,
    qpn: u32,
    remote_qpn: u32,
    local_psn: u32,
    remote_psn: u32,
    path_mtu: PathMtu,
    access: AccessFlags,
    /// The QP's `max_dest_rd_atomic` / `max_rd_atomic`.
    responder_resources: u8,
    initiator_depth: u8,
    /// Active: what the REQ offered / asked; passive: the REQ's values (as Linux `cm.c` keeps
    /// them for `cm_init_qp_rts_attr`).
    retry_count: u8,
    rnr_retry_count: u8,
    /// Passive: the REQ's responder resources (bounds this side's initiator depth).
    peer_responder_resources: u8,
    /// The QP's local ACK timeout code.
    ack_timeout: u8,
    /// The consumer's ACK timeout for the QP at RTS, over what the CM computes
    /// ([`Cm::set_ack_timeout`]).
    ack_timeout_set: Option<u8>,
    /// The message resent on timeout, and its TID.
    last: Option<(Message, u64)>,
    /// Resend timeout and retries left for `last`.
    resend_after: Duration,
    retries_left: u8,
    deadline: Option<Instant>,
    /// Passive: the REQ's timers for the REP.
    peer_timeout: Duration,
    peer_retries: u8,
    /// Kept for the ConnectRequest answer (REJ needs the requester's IDs).
    tid: u64,
    /// The consumer moves the QP ([`ConnectParams::external_qp`]): the CM never modifies it.
    external_qp: bool,
}

/// An outstanding SIDR_REQ of ours.
#[derive(Debug, Clone)]
struct SidrOut {
    local_ip: IpAddr,
    remote_ip: IpAddr,
    msg: Message,
    tid: u64,
    retries_left: u8,
    deadline: Instant,
}

/// A SIDR_REQ reported to the consumer, waiting for [`Cm::sidr_answer`].
#[derive(Debug, Clone)]
struct SidrIn {
    local_ip: IpAddr,
    remote_ip: IpAddr,
    request_id: u32,
    service_id: u64,
    tid: u64,
}

/// The communication manager of one device; see the [module docs](self).
#[derive(Debug)]
pub struct Cm {
    sidr_out: HashMap<u32, SidrOut>,
    sidr_in: HashMap<u32, SidrIn>,
    config: CmConfig,
    conns: HashMap<CommId, Conn>,
    /// (remote address, remote Communication ID) -> local ID: duplicate REQ detection.
    by_remote: HashMap<(IpAddr, u32), CommId>,
    listeners: Vec<u64>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
    next_tid: u64,
    /// `(mask, value)` every Communication ID and SIDR Request ID this CM chooses satisfies
    /// ([`Cm::set_comm_id_prefix`]).
    comm_id_prefix: (u32, u32),
}

fn padded<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateDataTooLong);
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

/// The index of `ip`'s RoCEv2 GID on port 1 of `hca`.
fn sgid_index(hca: &SoftHca, ip: IpAddr) -> Option<u8> {
    let gid = Gid::from(ip);
    let len = hca.context().query_port(1).ok()?.gid_tbl_len.min(256);
    (0..len).find_map(|i| {
        let e = hca.context().query_gid(1, i).ok()?;
        (e.gid == gid && e.gid_type == GidType::RoceV2)
            .then(|| u8::try_from(i).ok())
            .flatten()
    })
}

fn to_err(hca: &mut SoftHca, qpn: u32) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    // A QP already destroyed or in RESET needs nothing: ignore the error.
    let _ = hca.modify_qp(qpn, &attr, QpAttrMask::STATE);
}

/// Moves connection `c`'s QP to ERR, unless the consumer moves it ([`Conn::external_qp`]: as
/// Linux `cma_modify_qp_err` does nothing for an ID without a QP).
fn qp_err(hca: &mut SoftHca, c: &Conn) {
    if !c.external_qp {
        to_err(hca, c.qpn);
    }
}

/// The attributes connection `c`'s QP takes at INIT / RTR / RTS (Linux `cm.c`
/// `cm_init_qp_init_attr` / `cm_init_qp_rtr_attr` / `cm_init_qp_rts_attr`): the peer's QPN and
/// address, the path MTU, `rq_psn` the starting PSN this side sent (the peer's first send) and
/// `sq_psn` the one it received, the depths, the ACK timeout (the consumer's, else the CM's),
/// retry and RNR retry counts. `None` when the local address is no longer a GID of the device.
fn qp_attr_of(hca: &SoftHca, c: &Conn) -> Option<ConnectAttr> {
    let sgid = sgid_index(hca, c.local_ip)?;
    Some(ConnectAttr {
        qp_type: QpType::Rc,
        access: c.access,
        path_mtu: c.path_mtu,
        ah_attr: ConnectAttr::av(Gid::from(c.remote_ip), sgid, 64, 0),
        remote_qpn: c.remote_qpn,
        // A message's Starting PSN is the first PSN its sender receives (Linux cm.c: the active
        // side's rq_psn is its REQ's, its sq_psn the REP's; the passive side the other way).
        remote_psn: c.local_psn,
        local_psn: c.remote_psn,
        max_dest_rd_atomic: c.responder_resources,
        max_rd_atomic: c.initiator_depth,
        timeout: c.ack_timeout_set.unwrap_or(c.ack_timeout),
        retry_cnt: c.retry_count,
        rnr_retry: c.rnr_retry_count,
        ..ConnectAttr::default()
    })
}

impl Cm {
    /// A CM with no connections or listeners.
    pub fn new(config: CmConfig) -> Cm {
        Cm {
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            config,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: Vec::new(),
            comm_id_prefix: (0, 0),
            events: VecDeque::new(),
            counters: CmCounters::default(),
            next_tid: u64::from(OsRandom.next_u32()) << 32,
        }
    }

    /// The counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// How many connections exist (any state, timewait included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`Cm::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.deadline);
        conns
            .chain(self.sidr_out.values().map(|s| s.deadline))
            .min()
    }

    /// Asks `remote_ip` which UD QP serves `service_id` (SIDR_REQ, IBTA §12.11.1), with
    /// `private_data` (at most 216 bytes); resent like a REQ. The answer is a
    /// [`CmEventKind::SidrResolved`] event, or [`CmEventKind::Unreachable`] when the retries are
    /// spent; the event's `id` is the returned request ID.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`]; [`CmError::TooMany`] beyond
    /// [`CmConfig::max_connections`] outstanding requests.
    pub fn sidr_resolve(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        local_ip: IpAddr,
        remote_ip: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<u32, CmError> {
        let private_data = padded::<{ cm::SIDR_REQ_PRIVATE_DATA_LEN }>(private_data)?;
        if self.sidr_out.len() >= self.config.max_connections {
            return Err(CmError::TooMany);
        }
        let id = (0..64)
            .map(|_| self.random_id())
            // Distinct from the Communication IDs too: both name events (`Unreachable`).
            .find(|id| *id != 0 && !self.sidr_out.contains_key(id) && !self.conns.contains_key(id))
            .ok_or(CmError::TooMany)?;
        let msg = Message::SidrReq(cm::SidrReq {
            request_id: id,
            pkey: mad::DEFAULT_PKEY,
            service_id,
            private_data,
        });
        let tid = self.tid();
        self.send(hca, local_ip, remote_ip, &msg, tid);
        self.sidr_out.insert(
            id,
            SidrOut {
                local_ip,
                remote_ip,
                msg,
                tid,
                retries_left: self.config.max_cm_retries,
                deadline: now + timeout_of(self.config.response_timeout),
            },
        );
        Ok(id)
    }

    /// Answers a [`CmEventKind::SidrRequest`] with a SIDR_REP: `Some((qpn, qkey))` gives status
    /// `Success` with the serving UD QP, `None` status `Reject`; `private_data` at most 136 bytes.
    ///
    /// # Errors
    /// [`CmError::BadState`] for an unknown request; [`CmError::PrivateDataTooLong`].
    pub fn sidr_answer(
        &mut self,
        hca: &mut SoftHca,
        id: u32,
        qp: Option<(u32, u32)>,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = padded::<{ cm::SIDR_REP_PRIVATE_DATA_LEN }>(private_data)?;
        let r = self.sidr_in.remove(&id).ok_or(CmError::BadState)?;
        let (status, (qpn, qkey)) = match qp {
            Some(q) => (cm::SidrStatus::Success, q),
            None => (cm::SidrStatus::Reject, (0, 0)),
        };
        let rep = Message::SidrRep(cm::SidrRep {
            request_id: r.request_id,
            status,
            info_len: 0,
            qpn,
            service_id: r.service_id,
            qkey,
            info: [0; cm::SIDR_REP_INFO_LEN],
            private_data,
        });
        self.send(hca, r.local_ip, r.remote_ip, &rep, r.tid);
        Ok(())
    }

    /// Forgets a [`CmEventKind::SidrRequest`] without answering it (its sender's retries end in
    /// `Unreachable`); nothing for an unknown `id`.
    pub fn sidr_forget(&mut self, id: u32) {
        self.sidr_in.remove(&id);
    }

    /// Accepts REQs for `service_id` (e.g. [`roce::cm::service_id`] of a port space and port).
    ///
    /// # Errors
    /// [`CmError::TooMany`] beyond [`MAX_LISTENERS`].
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.contains(&service_id) {
            if self.listeners.len() >= MAX_LISTENERS {
                return Err(CmError::TooMany);
            }
            self.listeners.push(service_id);
        }
        Ok(())
    }

    /// The service IDs this CM accepts REQs and SIDR_REQs for ([`Cm::listen`]).
    pub fn listeners(&self) -> &[u64] {
        &self.listeners
    }

    /// Fixes the bits `mask` of every Communication ID and SIDR Request ID chosen from now on to
    /// `value` (IBTA vol. 1 §12.6.2: the sender chooses its ID freely); the other bits stay
    /// OS-random. A CM on a shared device address puts its process's slot there, so that the
    /// peer's replies, which name these IDs, reach this process
    /// ([`crate::link::udp::cm_route`]).
    pub fn set_comm_id_prefix(&mut self, mask: u32, value: u32) {
        self.comm_id_prefix = (mask, value & mask);
    }

    /// An OS-random 32-bit ID with the [`Cm::set_comm_id_prefix`] bits fixed (0 is possible:
    /// callers skip it).
    fn random_id(&self) -> u32 {
        let (mask, value) = self.comm_id_prefix;
        (OsRandom.next_u32() & !mask) | value
    }

    /// Sets the local ACK timeout (`ibv_qp_attr.timeout`, 4.096 us x 2^`timeout`, 5 bits) the
    /// CM gives connection `id`'s QP when it moves it to RTS, over the one it computes: what
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)` asks (Linux `cma.c` `rdma_set_ack_timeout`,
    /// applied in `cma_modify_qp_rts`). Call it after [`Cm::connect`] (before the REP) or before
    /// [`Cm::accept`].
    ///
    /// # Errors
    /// [`CmError::BadState`] for an unknown connection or a `timeout` over 31.
    pub fn set_ack_timeout(&mut self, id: CommId, timeout: u8) -> Result<(), CmError> {
        match self.conns.get_mut(&id) {
            Some(c) if timeout <= 31 => {
                c.ack_timeout_set = Some(timeout);
                Ok(())
            }
            _ => Err(CmError::BadState),
        }
    }

    /// Stops accepting REQs for `service_id`.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.retain(|&s| s != service_id);
    }

    fn event(&mut self, id: CommId, kind: CmEventKind) {
        if self.events.len() >= MAX_EVENTS {
            self.counters.events_lost += 1;
            return;
        }
        self.events.push_back(CmEvent { id, kind });
    }

    /// A fresh random Communication ID; `None` only if 64 draws all hit taken IDs (a broken
    /// random source: at most `max_connections` of 2^32 are taken).
    fn new_id(&self) -> Option<CommId> {
        (0..64)
            .map(|_| self.random_id())
            .find(|id| *id != 0 && !self.conns.contains_key(id) && !self.sidr_out.contains_key(id))
    }

    fn tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }

    fn send(&mut self, hca: &mut SoftHca, local: IpAddr, remote: IpAddr, msg: &Message, tid: u64) {
        let mut buf = [0u8; MAD_LEN];
        if msg.emit_mad(tid, &mut buf).is_err()
            || hca.gsi_send(local, remote, mad::GSI_QPN, &buf).is_err()
        {
            self.counters.send_failed += 1;
        }
    }

    fn remote_count(&self, ip: IpAddr) -> usize {
        self.conns.values().filter(|c| c.remote_ip == ip).count()
    }

    /// Starts a connection (`rdma_connect`): the QP goes to INIT and a REQ is sent.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] (over 92 bytes), [`CmError::NoSuchAddress`],
    /// [`CmError::TooMany`], [`CmError::Verbs`] when the QP cannot move to INIT.
    pub fn connect(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        p: &ConnectParams<'_>,
    ) -> Result<CommId, CmError> {
        let private_data = padded::<{ cm::REQ_PRIVATE_DATA_LEN }>(p.private_data)?;
        sgid_index(hca, p.local_ip).ok_or(CmError::NoSuchAddress)?;
        if self.conns.len() >= self.config.max_connections
            || self.remote_count(p.remote_ip) >= self.config.max_per_remote
        {
            return Err(CmError::TooMany);
        }
        let state = if p.external_qp {
            None
        } else {
            Some(hca.query_qp(p.qpn)?.0.qp_state)
        };
        if state == Some(QpState::Reset) {
            let attr = ConnectAttr {
                access: p.access,
                ..ConnectAttr::default()
            };
            if let Some((a, m)) = connect::step(&attr, QpState::Init) {
                hca.modify_qp(p.qpn, &a, m)?;
            }
        }
        let id = self.new_id().ok_or(CmError::TooMany)?;
        let local_psn = random_psn();
        let c = self.config.clone();
        let req = cm::Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.response_timeout,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: p.flow_control,
            starting_psn: local_psn,
            local_cm_response_timeout: c.response_timeout,
            retry_count: p.retry_count.min(7),
            pkey: mad::DEFAULT_PKEY,
            path_mtu_code: p.path_mtu.code(),
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: c.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: cm::Path {
                local_gid: Gid::from(p.local_ip),
                remote_gid: Gid::from(p.remote_ip),
                hop_limit: 64,
                subnet_local: true,
                local_ack_timeout: c.local_ack_timeout.min(31),
                ..cm::Path::default()
            },
            alternate_path: cm::Path::default(),
            sap_supported: false,
            private_data,
        };
        let tid = self.tid();
        let msg = Message::Req(req);
        self.send(hca, p.local_ip, p.remote_ip, &msg, tid);
        let resend_after = timeout_of(c.response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                local_ip: p.local_ip,
                remote_ip: p.remote_ip,
                remote_id: 0,
                qpn: p.qpn,
                remote_qpn: 0,
                local_psn,
                remote_psn: 0,
                path_mtu: p.path_mtu,
                access: p.access,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                retry_count: p.retry_count.min(7),
                rnr_retry_count: 7,
                peer_responder_resources: 0,
                ack_timeout: c.local_ack_timeout.min(31),
                ack_timeout_set: None,
                last: Some((msg, tid)),
                resend_after,
                retries_left: c.max_cm_retries,
                deadline: Some(now + resend_after),
                peer_timeout: resend_after,
                peer_retries: c.max_cm_retries,
                tid,
                external_qp: p.external_qp,
            },
        );
        Ok(id)
    }

    /// Accepts a reported [`CmEventKind::ConnectRequest`] (`rdma_accept`): the QP goes
    /// RESET -> INIT -> RTR -> RTS and a REP is sent (an [`AcceptParams::external_qp`] is left
    /// as the consumer brought it up with [`Cm::init_qp_attr`]).
    ///
    /// # Errors
    /// [`CmError::BadState`] if `id` is not a connection request waiting for an answer;
    /// [`CmError::PrivateDataTooLong`] (over 196 bytes); [`CmError::Verbs`] when a QP transition
    /// fails (the connection is then rejected with `NoQp`).
    pub fn accept(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: CommId,
        p: &AcceptParams<'_>,
    ) -> Result<(), CmError> {
        let private_data = padded::<{ cm::REP_PRIVATE_DATA_LEN }>(p.private_data)?;
        let Some(c) = self
            .conns
            .get(&id)
            .filter(|c| c.state == State::ReqRcvd)
            .cloned()
        else {
            return Err(CmError::BadState);
        };
        sgid_index(hca, c.local_ip).ok_or(CmError::NoSuchAddress)?;
        let initiator_depth = p.initiator_depth.min(c.peer_responder_resources);
        let c = Conn {
            qpn: p.qpn,
            access: p.access,
            responder_resources: p.responder_resources,
            initiator_depth,
            external_qp: p.external_qp,
            ..c
        };
        // The REP's Starting PSN was drawn with the REQ (`c.local_psn`); the QP takes the REQ's
        // timers and retry counts (Linux cm.c cm_init_qp_rts_attr).
        let attr = qp_attr_of(hca, &c).ok_or(CmError::NoSuchAddress)?;
        let local_psn = c.local_psn;
        let mut result = Ok(());
        // RTS before the REP, as Linux `cma_accept` and librdmacm's `rdma_accept` do: the passive
        // side may post sends as soon as accept returns (the RTU only confirms). An external QP
        // was brought to RTS by the consumer.
        let steps: &[QpState] = if p.external_qp {
            &[]
        } else {
            &[QpState::Init, QpState::Rtr, QpState::Rts]
        };
        for &to in steps {
            if let Some((a, m)) = connect::step(&attr, to) {
                if let Err(e) = hca.modify_qp(p.qpn, &a, m) {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = result {
            to_err(hca, p.qpn);
            self.reject_with(hca, id, RejReason::NoQp, &[]);
            return Err(CmError::Verbs(e));
        }
        let rep = cm::Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: local_psn,
            responder_resources: p.responder_resources,
            initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 1,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: 0,
            private_data,
        };
        let msg = Message::Rep(rep);
        self.send(hca, c.local_ip, c.remote_ip, &msg, c.tid);
        if let Some(conn) = self.conns.get_mut(&id) {
            *conn = c.clone();
            conn.state = State::RepSent;
            conn.last = Some((msg, c.tid));
            conn.resend_after = c.peer_timeout;
            conn.retries_left = c.peer_retries;
            conn.deadline = Some(now + c.peer_timeout);
        }
        Ok(())
    }

    /// Rejects a reported [`CmEventKind::ConnectRequest`] (`rdma_reject`) with REJ
    /// `ConsumerDefined` and `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// [`CmError::BadState`] if `id` is not a connection request waiting for an answer;
    /// [`CmError::PrivateDataTooLong`].
    pub fn reject(
        &mut self,
        hca: &mut SoftHca,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        padded::<{ cm::REJ_PRIVATE_DATA_LEN }>(private_data)?;
        if !self
            .conns
            .get(&id)
            .is_some_and(|c| c.state == State::ReqRcvd)
        {
            return Err(CmError::BadState);
        }
        self.reject_with(hca, id, RejReason::ConsumerDefined, private_data);
        Ok(())
    }

    /// Sends a REJ of the REQ of passive connection `id` and forgets it.
    fn reject_with(&mut self, hca: &mut SoftHca, id: CommId, reason: RejReason, data: &[u8]) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.by_remote.remove(&(c.remote_ip, c.remote_id));
        let rej = rej_of(id, c.remote_id, reason, data);
        self.send(hca, c.local_ip, c.remote_ip, &rej, c.tid);
    }

    /// Closes an established connection (`rdma_disconnect`): the QP goes to ERR and a DREQ is
    /// sent.
    ///
    /// # Errors
    /// [`CmError::BadState`] if `id` is not established.
    pub fn disconnect(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        id: CommId,
    ) -> Result<(), CmError> {
        let Some(c) = self
            .conns
            .get(&id)
            .filter(|c| c.state == State::Established)
            .cloned()
        else {
            return Err(CmError::BadState);
        };
        qp_err(hca, &c);
        let tid = self.tid();
        let msg = Message::Dreq(cm::Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data: [0; cm::DREQ_PRIVATE_DATA_LEN],
        });
        self.send(hca, c.local_ip, c.remote_ip, &msg, tid);
        let resend_after = timeout_of(self.config.response_timeout);
        let retries = self.config.max_cm_retries;
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::DreqSent;
            conn.last = Some((msg, tid));
            conn.resend_after = resend_after;
            conn.retries_left = retries;
            conn.deadline = Some(now + resend_after);
        }
        Ok(())
    }

    /// Sends the RTU of an active connection whose REP was reported as
    /// [`CmEventKind::ConnectResponse`] (`rdma_establish`; Linux `ib_send_cm_rtu`), once the
    /// consumer has brought its QP to RTS with [`Cm::init_qp_attr`]. No event follows on this
    /// side; the peer reports `ESTABLISHED` on the RTU.
    ///
    /// # Errors
    /// [`CmError::BadState`] if `id` is not such a connection.
    pub fn establish(&mut self, hca: &mut SoftHca, id: CommId) -> Result<(), CmError> {
        let Some(c) = self
            .conns
            .get_mut(&id)
            .filter(|c| c.state == State::RepRcvd)
        else {
            return Err(CmError::BadState);
        };
        c.state = State::Established;
        let c = c.clone();
        let rtu = Message::Rtu(cm::Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: [0; cm::RTU_PRIVATE_DATA_LEN],
        });
        self.send(hca, c.local_ip, c.remote_ip, &rtu, c.tid);
        Ok(())
    }

    /// The attributes and mask of the transition of connection `id`'s QP into `to` (RTR or RTS;
    /// IBTA vol. 1 §12.9.7, Linux `ib_cm_init_qp_attr` as `rdma_init_qp_attr` reports it): RTR
    /// with the address vector to the peer, the path MTU, the peer's QPN, `rq_psn` (the
    /// Starting PSN this side sends in its REQ or REP) and the responder resources; RTS with
    /// `sq_psn` (the peer's Starting PSN), the ACK timeout, retry and RNR retry counts and the
    /// initiator depth. The passive side may ask as soon as the REQ is reported (before
    /// [`Cm::accept`]), the active side once the REP has come.
    ///
    /// # Errors
    /// [`CmError::BadState`] for another state, an unknown connection, or one whose REP has not
    /// come yet; [`CmError::NoSuchAddress`] if the local address is no longer the device's.
    pub fn init_qp_attr(
        &self,
        hca: &SoftHca,
        id: CommId,
        to: QpState,
    ) -> Result<(QpAttr, QpAttrMask), CmError> {
        let c = self
            .conns
            .get(&id)
            .filter(|c| {
                matches!(
                    c.state,
                    State::ReqRcvd | State::RepSent | State::RepRcvd | State::Established
                )
            })
            .ok_or(CmError::BadState)?;
        if !matches!(to, QpState::Rtr | QpState::Rts) {
            return Err(CmError::BadState);
        }
        let attr = qp_attr_of(hca, c).ok_or(CmError::NoSuchAddress)?;
        connect::step(&attr, to).ok_or(CmError::BadState)
    }

    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        let tw = self.config.timewait;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.last = None;
            c.deadline = Some(now + tw);
        }
    }

    /// Fires the timers due at `now`: resends, gives up (Unreachable / ConnectError /
    /// Disconnected), ends timewait.
    pub fn handle_timeout(&mut self, now: Instant, hca: &mut SoftHca) {
        let due_sidr: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in due_sidr {
            let Some(s) = self.sidr_out.get(&id).cloned() else {
                continue;
            };
            if s.retries_left == 0 {
                self.sidr_out.remove(&id);
                self.event(id, CmEventKind::Unreachable);
                continue;
            }
            self.counters.retransmits += 1;
            self.send(hca, s.local_ip, s.remote_ip, &s.msg, s.tid);
            let wait = timeout_of(self.config.response_timeout);
            if let Some(o) = self.sidr_out.get_mut(&id) {
                o.retries_left -= 1;
                o.deadline = now + wait;
            }
        }
        let due: Vec<CommId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get(&id).cloned() else {
                continue;
            };
            if c.state == State::TimeWait {
                self.forget(id);
                self.event(id, CmEventKind::TimewaitExit);
                continue;
            }
            if c.retries_left > 0 {
                if let Some((msg, tid)) = c.last {
                    self.counters.retransmits += 1;
                    self.send(hca, c.local_ip, c.remote_ip, &msg, tid);
                }
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.retries_left -= 1;
                    conn.deadline = Some(now + c.resend_after);
                }
                continue;
            }
            match c.state {
                State::ReqSent => {
                    qp_err(hca, &c);
                    self.forget(id);
                    self.event(id, CmEventKind::Unreachable);
                }
                State::RepSent => {
                    qp_err(hca, &c);
                    let rej = rej_of(id, c.remote_id, RejReason::Timeout, &[]);
                    self.send(hca, c.local_ip, c.remote_ip, &rej, c.tid);
                    self.forget(id);
                    self.event(id, CmEventKind::ConnectError);
                }
                State::DreqSent => {
                    self.enter_timewait(now, id);
                    self.event(id, CmEventKind::Disconnected);
                }
                _ => {
                    if let Some(conn) = self.conns.get_mut(&id) {
                        conn.deadline = None;
                    }
                }
            }
        }
    }

    fn forget(&mut self, id: CommId) {
        if let Some(c) = self.conns.remove(&id) {
            if self.by_remote.get(&(c.remote_ip, c.remote_id)) == Some(&id) {
                self.by_remote.remove(&(c.remote_ip, c.remote_id));
            }
        }
    }

    /// A MAD QP1 delivered ([`SoftHca::poll_mad`]). Anything but a CM message is ignored (other
    /// classes' responses belong to other consumers); bad CM messages are counted.
    pub fn handle_mad(&mut self, now: Instant, hca: &mut SoftHca, m: &ReceivedMad) {
        let Ok(header) = mad::Repr::parse_mad(&m.mad) else {
            self.counters.malformed += 1;
            return;
        };
        if header.mgmt_class != mad::MgmtClass::CommMgmt {
            return;
        }
        let msg = match Message::parse_mad(&m.mad) {
            Ok((_, msg)) => msg,
            Err(_) => {
                let attr = cm::AttrId::from(header.attr_id);
                if matches!(attr, cm::AttrId::Lap | cm::AttrId::Apr) {
                    self.counters.unsupported += 1;
                } else {
                    self.counters.malformed += 1;
                }
                return;
            }
        };
        let tid = header.tid;
        match msg {
            Message::Req(req) => self.on_req(hca, m, tid, &req),
            Message::Rep(rep) => self.on_rep(hca, m, tid, &rep),
            Message::Rtu(rtu) => self.on_rtu(hca, m, &rtu),
            Message::Rej(rej) => self.on_rej(hca, m, &rej),
            Message::Mra(mra) => self.on_mra(now, m, &mra),
            Message::Dreq(dreq) => self.on_dreq(now, hca, m, tid, &dreq),
            Message::Drep(drep) => self.on_drep(now, m, &drep),
            Message::SidrReq(sidr) => self.on_sidr_req(hca, m, tid, &sidr),
            Message::SidrRep(rep) => self.on_sidr_rep(m, &rep),
        }
    }

    fn on_sidr_req(&mut self, hca: &mut SoftHca, m: &ReceivedMad, tid: u64, req: &cm::SidrReq) {
        let duplicate = self
            .sidr_in
            .values()
            .any(|r| r.remote_ip == m.src_ip && r.request_id == req.request_id);
        if duplicate {
            self.counters.duplicate_req += 1;
            return;
        }
        let status = if !self.listeners.contains(&req.service_id) {
            Some(cm::SidrStatus::Unsupported)
        } else if self.sidr_in.len() >= self.config.max_connections {
            self.counters.refused_resources += 1;
            Some(cm::SidrStatus::NoQp)
        } else {
            None
        };
        let id = (0..64)
            .map(|_| OsRandom.next_u32())
            .find(|id| *id != 0 && !self.sidr_in.contains_key(id));
        let (None, Some(id)) = (status, id) else {
            let rep = Message::SidrRep(cm::SidrRep {
                request_id: req.request_id,
                status: status.unwrap_or(cm::SidrStatus::NoQp),
                info_len: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                info: [0; cm::SIDR_REP_INFO_LEN],
                private_data: [0; cm::SIDR_REP_PRIVATE_DATA_LEN],
            });
            self.send(hca, m.dst_ip, m.src_ip, &rep, tid);
            return;
        };
        self.sidr_in.insert(
            id,
            SidrIn {
                local_ip: m.dst_ip,
                remote_ip: m.src_ip,
                request_id: req.request_id,
                service_id: req.service_id,
                tid,
            },
        );
        self.event(
            id,
            CmEventKind::SidrRequest {
                service_id: req.service_id,
                remote_ip: m.src_ip,
                local_ip: m.dst_ip,
                private_data: req.private_data.to_vec(),
            },
        );
    }

    fn on_sidr_rep(&mut self, m: &ReceivedMad, rep: &cm::SidrRep) {
        let known = self
            .sidr_out
            .get(&rep.request_id)
            .is_some_and(|s| s.remote_ip == m.src_ip);
        if !known {
            self.counters.unmatched += 1;
            return;
        }
        self.sidr_out.remove(&rep.request_id);
        self.event(
            rep.request_id,
            CmEventKind::SidrResolved {
                status: rep.status,
                qpn: rep.qpn,
                qkey: rep.qkey,
                private_data: rep.private_data.to_vec(),
            },
        );
    }

    /// The connection `id` names, if it belongs to the MAD's sender.
    fn conn_of(&self, id: u32, m: &ReceivedMad) -> Option<Conn> {
        self.conns
            .get(&id)
            .filter(|c| c.remote_ip == m.src_ip)
            .cloned()
    }

    fn on_req(&mut self, hca: &mut SoftHca, m: &ReceivedMad, tid: u64, req: &cm::Req) {
        if let Some(&id) = self.by_remote.get(&(m.src_ip, req.local_comm_id)) {
            self.counters.duplicate_req += 1;
            if let Some(c) = self.conns.get(&id).cloned() {
                if let (State::RepSent, Some((msg, tid))) = (c.state, c.last) {
                    self.send(hca, c.local_ip, c.remote_ip, &msg, tid);
                }
            }
            return;
        }
        let refuse = |reason| rej_of(0, req.local_comm_id, reason, &[]);
        let reason = if !self.listeners.contains(&req.service_id) {
            Some(RejReason::InvalidServiceId)
        } else if req.transport_type != TransportType::Rc {
            Some(RejReason::InvalidTransportType)
        } else if req.path_mtu().is_none() {
            Some(RejReason::InvalidMtu)
        } else if self.conns.len() >= self.config.max_connections
            || self.remote_count(m.src_ip) >= self.config.max_per_remote
        {
            self.counters.refused_resources += 1;
            Some(RejReason::NoResources)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.send(hca, m.dst_ip, m.src_ip, &refuse(reason), tid);
            return;
        }
        let Some(id) = self.new_id() else {
            self.counters.refused_resources += 1;
            self.send(
                hca,
                m.dst_ip,
                m.src_ip,
                &refuse(RejReason::NoResources),
                tid,
            );
            return;
        };
        let peer_timeout = timeout_of(req.local_cm_response_timeout);
        // The REQ's path MTU, at most the port's (a QP's path MTU cannot exceed it).
        let port_mtu = hca
            .context()
            .query_port(1)
            .map_or(PathMtu::Mtu1024, |p| p.active_mtu);
        let mtu = req.path_mtu().unwrap_or(PathMtu::Mtu1024).min(port_mtu);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                local_ip: m.dst_ip,
                remote_ip: m.src_ip,
                remote_id: req.local_comm_id,
                qpn: 0,
                remote_qpn: req.local_qpn,
                // The REP's Starting PSN, drawn now: a consumer that moves its QP itself asks
                // for the RTR attributes (rq_psn) before it accepts.
                local_psn: random_psn(),
                remote_psn: req.starting_psn,
                path_mtu: mtu,
                access: AccessFlags::empty(),
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                peer_responder_resources: req.responder_resources,
                ack_timeout: passive_ack_timeout(req.primary_path.local_ack_timeout),
                ack_timeout_set: None,
                last: None,
                resend_after: peer_timeout,
                retries_left: 0,
                deadline: None,
                peer_timeout,
                peer_retries: req.max_cm_retries,
                tid,
                external_qp: false,
            },
        );
        self.by_remote.insert((m.src_ip, req.local_comm_id), id);
        self.event(
            id,
            CmEventKind::ConnectRequest {
                service_id: req.service_id,
                remote_ip: m.src_ip,
                local_ip: m.dst_ip,
                remote_qpn: req.local_qpn,
                private_data: req.private_data.to_vec(),
                param: ConnParam {
                    responder_resources: req.initiator_depth,
                    initiator_depth: req.responder_resources,
                    flow_control: req.end_to_end_flow_control,
                    retry_count: req.retry_count,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: req.srq,
                    qp_num: req.local_qpn,
                },
                path_mtu: mtu,
            },
        );
    }

    fn on_rep(&mut self, hca: &mut SoftHca, m: &ReceivedMad, tid: u64, rep: &cm::Rep) {
        let Some(c) = self.conn_of(rep.remote_comm_id, m) else {
            // A REP for a REQ never sent (Linux cm_rep_handler: REJ InvalidCommId).
            self.counters.unmatched += 1;
            let rej = rej_of(0, rep.local_comm_id, RejReason::InvalidCommId, &[]);
            let rej = match rej {
                Message::Rej(r) => Message::Rej(cm::Rej {
                    message_rejected: MsgKind::Rep,
                    ..r
                }),
                other => other,
            };
            self.send(hca, m.dst_ip, m.src_ip, &rej, tid);
            return;
        };
        let id = rep.remote_comm_id;
        let rtu = Message::Rtu(cm::Rtu {
            local_comm_id: id,
            remote_comm_id: rep.local_comm_id,
            private_data: [0; cm::RTU_PRIVATE_DATA_LEN],
        });
        match c.state {
            State::ReqSent => {}
            State::Established if c.remote_id == rep.local_comm_id => {
                // The RTU was lost: the passive side resent its REP.
                self.send(hca, c.local_ip, c.remote_ip, &rtu, tid);
                return;
            }
            State::RepRcvd if c.remote_id == rep.local_comm_id => {
                // A resent REP while the consumer brings its QP up: reported once already.
                self.counters.duplicate_rep += 1;
                return;
            }
            _ => {
                self.counters.unmatched += 1;
                return;
            }
        }
        if sgid_index(hca, c.local_ip).is_none() {
            self.counters.unmatched += 1;
            return;
        }
        // The REP's side of the connection (Linux cm.c cm_rep_handler): its QPN and Starting PSN
        // (this QP's sq_psn), the initiator depth within its responder resources, its RNR retry
        // count, and the path's ACK timeout with the peer's ACK delay.
        let c = Conn {
            remote_id: rep.local_comm_id,
            remote_qpn: rep.local_qpn,
            remote_psn: rep.starting_psn,
            initiator_depth: c.initiator_depth.min(rep.responder_resources),
            rnr_retry_count: rep.rnr_retry_count,
            ack_timeout: cm_ack_timeout(rep.target_ack_delay, c.ack_timeout.saturating_sub(1)),
            last: None,
            deadline: None,
            tid,
            ..c
        };
        let param = ConnParam {
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            flow_control: rep.end_to_end_flow_control,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            qp_num: rep.local_qpn,
        };
        if c.external_qp {
            // Linux cma_ib_handler: an ID without a QP gets CONNECT_RESPONSE; the RTU waits for
            // the consumer's rdma_establish.
            self.by_remote.insert((c.remote_ip, rep.local_comm_id), id);
            self.conns.insert(
                id,
                Conn {
                    state: State::RepRcvd,
                    ..c
                },
            );
            self.event(
                id,
                CmEventKind::ConnectResponse {
                    private_data: rep.private_data.to_vec(),
                    param,
                },
            );
            return;
        }
        let ok = qp_attr_of(hca, &c).is_some_and(|attr| {
            [QpState::Rtr, QpState::Rts].into_iter().all(|to| {
                connect::step(&attr, to)
                    .is_none_or(|(a, mask)| hca.modify_qp(c.qpn, &a, mask).is_ok())
            })
        });
        if !ok {
            to_err(hca, c.qpn);
            let rej = rej_of(id, rep.local_comm_id, RejReason::NoQp, &[]);
            self.send(hca, c.local_ip, c.remote_ip, &rej, tid);
            self.forget(id);
            self.event(id, CmEventKind::ConnectError);
            return;
        }
        self.send(hca, c.local_ip, c.remote_ip, &rtu, tid);
        self.by_remote.insert((c.remote_ip, rep.local_comm_id), id);
        self.conns.insert(
            id,
            Conn {
                state: State::Established,
                ..c
            },
        );
        self.event(
            id,
            CmEventKind::Established {
                private_data: rep.private_data.to_vec(),
                param: Some(param),
            },
        );
    }

    fn on_rtu(&mut self, hca: &mut SoftHca, m: &ReceivedMad, rtu: &cm::Rtu) {
        let id = rtu.remote_comm_id;
        let Some(c) = self
            .conn_of(id, m)
            .filter(|c| c.state == State::RepSent && c.remote_id == rtu.local_comm_id)
        else {
            self.counters.unmatched += 1;
            return;
        };
        let attr = ConnectAttr {
            qp_type: QpType::Rc,
            // Send from the REQ's Starting PSN (Linux cm.c `cm_req_handler`: sq_psn = REQ's).
            local_psn: c.remote_psn,
            max_rd_atomic: c.initiator_depth,
            timeout: c.ack_timeout_set.unwrap_or(c.ack_timeout),
            retry_cnt: c.retry_count,
            rnr_retry: c.rnr_retry_count,
            ..ConnectAttr::default()
        };
        // Accept moved it to RTS already; a QP the consumer left in RTR is moved now (never an
        // external QP: the consumer's).
        let in_rtr = !c.external_qp
            && hca
                .query_qp(c.qpn)
                .is_ok_and(|(a, _)| a.qp_state == QpState::Rtr);
        if let Some((a, mask)) = connect::step(&attr, QpState::Rts).filter(|_| in_rtr) {
            if hca.modify_qp(c.qpn, &a, mask).is_err() {
                qp_err(hca, &c);
                self.forget(id);
                self.event(id, CmEventKind::ConnectError);
                return;
            }
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::Established;
            conn.last = None;
            conn.deadline = None;
        }
        self.event(
            id,
            CmEventKind::Established {
                private_data: rtu.private_data.to_vec(),
                param: None,
            },
        );
    }

    fn on_rej(&mut self, hca: &mut SoftHca, m: &ReceivedMad, rej: &cm::Rej) {
        let id = rej.remote_comm_id;
        let Some(c) = self
            .conn_of(id, m)
            .filter(|c| matches!(c.state, State::ReqSent | State::RepSent | State::RepRcvd))
        else {
            self.counters.unmatched += 1;
            return;
        };
        qp_err(hca, &c);
        self.forget(id);
        self.event(
            id,
            CmEventKind::Rejected {
                reason: rej.reason,
                private_data: rej.private_data.to_vec(),
            },
        );
    }

    fn on_mra(&mut self, now: Instant, m: &ReceivedMad, mra: &cm::Mra) {
        let Some(c) = self.conns.get_mut(&mra.remote_comm_id).filter(|c| {
            c.remote_ip == m.src_ip
                && matches!(
                    (c.state, mra.message_mraed),
                    (State::ReqSent, MsgKind::Req) | (State::RepSent, MsgKind::Rep)
                )
        }) else {
            self.counters.unmatched += 1;
            return;
        };
        // The peer needs up to its service timeout more (IBTA §12.6.6); one more wait per MRA.
        c.deadline = Some(now + c.resend_after + timeout_of(mra.service_timeout));
    }

    fn on_dreq(
        &mut self,
        now: Instant,
        hca: &mut SoftHca,
        m: &ReceivedMad,
        tid: u64,
        dreq: &cm::Dreq,
    ) {
        let id = dreq.remote_comm_id;
        let drep = Message::Drep(cm::Drep {
            local_comm_id: id,
            remote_comm_id: dreq.local_comm_id,
            private_data: [0; cm::DREP_PRIVATE_DATA_LEN],
        });
        let c = self
            .conn_of(id, m)
            .filter(|c| c.remote_id == dreq.local_comm_id);
        match c.map(|c| (c.state, c)) {
            Some((State::Established | State::DreqSent, c)) => {
                qp_err(hca, &c);
                self.send(hca, c.local_ip, c.remote_ip, &drep, tid);
                self.enter_timewait(now, id);
                self.event(id, CmEventKind::Disconnected);
            }
            Some((State::RepSent, c)) => {
                // The RTU was lost and the peer already closes: established, then closed.
                qp_err(hca, &c);
                self.send(hca, c.local_ip, c.remote_ip, &drep, tid);
                self.enter_timewait(now, id);
                self.event(id, CmEventKind::Disconnected);
            }
            _ => {
                // Timewait (our DREP was lost) or already forgotten: answer again.
                self.counters.unmatched += 1;
                self.send(hca, m.dst_ip, m.src_ip, &drep, tid);
            }
        }
    }

    fn on_drep(&mut self, now: Instant, m: &ReceivedMad, drep: &cm::Drep) {
        let id = drep.remote_comm_id;
        if !self
            .conn_of(id, m)
            .is_some_and(|c| c.state == State::DreqSent && c.remote_id == drep.local_comm_id)
        {
            self.counters.unmatched += 1;
            return;
        }
        self.enter_timewait(now, id);
        self.event(id, CmEventKind::Disconnected);
    }
}

fn rej_of(local: u32, remote: u32, reason: RejReason, data: &[u8]) -> Message {
    let mut private_data = [0u8; cm::REJ_PRIVATE_DATA_LEN];
    let n = data.len().min(private_data.len());
    private_data[..n].copy_from_slice(&data[..n]);
    Message::Rej(cm::Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: MsgKind::Req,
        ari_len: 0,
        reason,
        ari: [0; cm::REJ_ARI_LEN],
        private_data,
    })
}
