//! The software HCA: a sans-I/O RC / UC / UD transport engine speaking RoCEv2.
//!
//! [`SoftHca`] is what a RoCE NIC is, minus the wire: it owns a verbs [`Context`] (PDs, MRs, CQs,
//! QPs ...), the memory behind every memory region ([`gpu_p2p::Memory`]), and the transport state
//! of every QP. It owns no socket, thread or clock (the model is quinn-proto's `Connection`): a
//! *link* (a UDP socket, VFIO NIC queues, the in-memory [`crate::fabric`]) and a progress loop sit
//! outside and feed it.
//!
//! ## Inputs
//! * verbs: [`SoftHca::post_send`], [`SoftHca::post_recv`], [`SoftHca::modify_qp`], ...;
//! * [`SoftHca::handle_datagram`]: a received UDP payload (BTH .. ICRC) with its IP metadata;
//! * [`SoftHca::handle_timeout`]: the time passed the deadline [`SoftHca::poll_timeout`] gave.
//!
//! ## Outputs, and the order to poll them
//! After any input, a driver calls, in this order:
//! 1. [`SoftHca::poll_transmit`] until it returns `None`: each call builds one packet into the
//!    caller's buffer (round-robin over the QPs with work; CNPs first); a link that can gather
//!    calls [`SoftHca::poll_transmit_gather`] instead, which leaves RC payloads in MR memory and
//!    describes them ([`GatherTransmit`], zero-copy);
//! 2. [`SoftHca::poll_timeout`]: when to call [`SoftHca::handle_timeout`] next;
//! 3. [`SoftHca::poll_cq`], [`SoftHca::poll_event`], [`SoftHca::poll_cq_event`],
//!    [`SoftHca::poll_diag`] as it needs.
//!
//! Completions are pushed to CQs during inputs and transmits; a full CQ is an overrun (the CQ
//! enters its error state, `IBV_EVENT_CQ_ERR` is recorded, the affected QP goes to ERR), never a
//! silent loss.
//!
//! ## Structure
//! As rxe splits `rxe_recv.c`, `rxe_req.c`, `rxe_resp.c`, `rxe_comp.c` and `rxe_net.c`:
//! receive validation and demux (module `recv`), the requester (`requester`), the responder
//! (`responder`), the completer (`completer`), packet sealing and addressing (`net`), plus the
//! per-QP state they share (`transport`), the send queue (`send_queue`), MR memory (`memory`),
//! counters ([`Counters`]) and rate-limited diagnostics ([`DiagRecord`]).
//!
//! ## Fast path
//! One packet costs O(1) lookups (QPN and keys index tables), at most one copy of its payload
//! (MR memory to the transmit buffer, none with [`SoftHca::poll_transmit_gather`]; received
//! buffer to MR memory) and no allocation once queues have
//! grown to their bounds. Every queue is bounded: send and receive queues by their QP's
//! capabilities, responses by `max_dest_rd_atomic`, CNPs, CQ events and diagnostics by constants.

pub mod counters;
pub mod dcqcn;
pub mod diag;
pub mod gsi;
pub mod time;

mod completer;
mod memory;
mod net;
mod recv;
mod requester;
mod responder;
mod send_queue;
mod sys;
mod transport;
mod tx;

use alloc::boxed::Box;
use alloc::collections::{BinaryHeap, VecDeque};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::net::IpAddr;
use core::time::Duration;

use gpu_p2p::Memory;
use roce::ipv4::Ecn;
use roce::packet::{ExtReprs, TransportRepr};
use roce::{udp, Gid, Psn};

pub use counters::{Counters, DropReason};
pub use dcqcn::{DcqcnParams, ReactionPoint, RpStats};
pub use diag::{DiagKind, DiagRecord};
pub use net::IPV4_IDENT;
pub use time::Instant;
pub use tx::{GatherTransmit, TxSegment, MAX_TX_SEGMENTS};

use memory::{MrBacking, MrMemory};
use net::Route;
use requester::TxResult;
use send_queue::{NewWqe, UdRoute};
use transport::{Env, QpTransport};
use tx::TxOut;

use crate::verbs::ah::{AhAttr, AhHandle};
use crate::verbs::context::Context;
use crate::verbs::cq::CqHandle;
use crate::verbs::device::Device;
use crate::verbs::error::{Cause, VerbsError};
use crate::verbs::event::{AsyncEvent, AsyncEventType};
use crate::verbs::gid::{GidEntry, GidType};
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{ModifyOutcome, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType};
#[cfg(feature = "std")]
use crate::verbs::random::OsRandom;
use crate::verbs::random::RandomSource;
use crate::verbs::srq::{SrqAttr, SrqAttrMask, SrqHandle};
use crate::verbs::wc::WorkCompletion;
use crate::verbs::wr::{RecvWr, SendFlags, SendWr};

/// Most CQ notification events kept unread ([`SoftHca::poll_cq_event`]).
pub const MAX_PENDING_CQ_EVENTS: usize = 1024;

/// The largest UDP payload the engine builds: BTH (12) + the largest extended headers (28) +
/// 4096 payload bytes + ICRC (4). A transmit buffer of this size always suffices.
pub const MAX_UDP_PAYLOAD: usize = 12 + 28 + 4096 + 4;

/// Engine tunables. [`EngineConfig::default`] mirrors rxe where rxe has a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// RC: most PSNs a requester has outstanding (sent, not acknowledged) before it waits
    /// (rxe `RXE_MAX_UNACKED_PSNS` = 128).
    pub max_unacked_psns: u32,
    /// RC: the requester sets AckReq at least every this many packets of a long message
    /// (rxe `RXE_MAX_PKT_PER_ACK` = 64), besides the last packet of every message.
    pub ack_req_every: u32,
    /// Shortest time between two CNPs sent for the same local QP (NICs make it configurable;
    /// default 50 us, the DCQCN paper's CNP interval).
    pub cnp_interval: Duration,
    /// Most CNPs queued for transmission; further CE marks are counted in `cnp_suppressed`.
    pub max_pending_cnps: usize,
    /// Mark data packets ECN-capable (ECT(0), RFC 3168) when the address vector's traffic class
    /// does not choose an ECN codepoint itself, so that switches can signal congestion.
    pub ecn_capable: bool,
    /// Longest time a plain ACK waits for a request packet of its QP to leave first, so that
    /// both go out together (the ACK right behind it: one UDP GSO train on a UDP link) and
    /// requests that arrive meanwhile are acknowledged by the same ACK. Zero (default): an ACK
    /// goes at the next transmit. Only an ACK that is the QP's sole pending response waits
    /// (never a NAK, and never behind READ responses); the wait is a timer
    /// ([`SoftHca::poll_timeout`]). An ACK acknowledges every earlier PSN, so delaying and
    /// coalescing them is the responder's choice (IBTA vol. 1 §9.7.5, ACK coalescing); keep it
    /// far below the peer's local ACK timeout (4.096 us x 2^timeout), as QUIC's
    /// `max_ack_delay` is kept below its PTO. A driver that wakes late for the timer delays the
    /// ACK further, so a sleeping driver should leave this zero.
    pub ack_delay: Duration,
    /// DSCP of CNPs (mlx5's `cnp_dscp` defaults to 48).
    pub cnp_dscp: u8,
    /// The UDP source ports the link can send from. Empty (default): any, and each QP's packets
    /// carry its own flow-entropy port (`roce::udp::rocev2_src_port` of the QPN, or the flow
    /// label's port when the address vector has one; IBTA vol. 1 Annex A17.2.3 lets the source
    /// port vary per flow for ECMP). A link that can only send from some ports (a UDP socket
    /// sends from its bound port; the UDP link keeps a few sockets for entropy) lists them here,
    /// and a QP uses the port its entropy value selects ([`src_port_for`]): the ICRC covers the
    /// UDP source port, so packets must be built with the port they leave from.
    pub udp_src_ports: Vec<u16>,
    /// `(mask, value)`: QPN bits fixed for every QP this engine creates (`qpn & mask == value`),
    /// the rest random; a device sharing its address with other processes selects its slot
    /// this way ([`crate::link::udp::share`]). `None` (default): all 24 bits random.
    pub qpn_prefix: Option<(u32, u32)>,
    /// DCQCN's reaction point for every QP created from now on ([`dcqcn`]; a QP's own
    /// setting: [`SoftHca::set_qp_dcqcn`]). `None` (default): CNPs are counted and handed to
    /// the [`RateControl`] hook only, and nothing is paced (the engine's behaviour before
    /// DCQCN, packet for packet).
    pub dcqcn: Option<DcqcnParams>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_unacked_psns: 128,
            ack_req_every: 64,
            cnp_interval: Duration::from_micros(50),
            max_pending_cnps: 256,
            ecn_capable: true,
            ack_delay: Duration::ZERO,
            cnp_dscp: 48,
            udp_src_ports: Vec::new(),
            qpn_prefix: None,
            dcqcn: None,
        }
    }
}

/// A received RoCEv2 datagram: the UDP payload and the IP / UDP header fields the link saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// IP source address.
    pub src_ip: IpAddr,
    /// IP destination address.
    pub dst_ip: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791 for RoCEv2; anything else is dropped).
    pub dst_port: u16,
    /// The ECN codepoint of the IP header (CE makes the engine send a CNP).
    pub ecn: Ecn,
    /// DSCP of the IP header (masked by the ICRC; reported in a UD receive's GRH).
    pub dscp: u8,
    /// IPv4 TTL / IPv6 hop limit (masked by the ICRC; reported in a UD receive's GRH).
    pub hop_limit: u8,
    /// IPv4 identification, if the link knows it (the ICRC covers it; packets from this engine
    /// carry [`IPV4_IDENT`], or 0, 1, 2, ... along a UDP GSO train, and Don't Fragment).
    /// `None` (a UDP socket cannot read it): the engine solves for the identification that makes
    /// the ICRC verify and drops the packet when there is none ([`roce::icrc::solve_ipv4_ident`],
    /// counted in `icrc_ident_solved`). Ignored for IPv6, which has no identification.
    pub ip_ident: Option<u16>,
    /// The UDP payload: BTH through ICRC.
    pub payload: &'a [u8],
}

/// One packet [`SoftHca::poll_transmit`] built: its UDP payload is the first `len` bytes of the
/// caller's buffer; the link adds UDP and IP headers with exactly these fields (the ICRC covers
/// them), IPv4 identification [`IPV4_IDENT`] and Don't Fragment set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// IP source address.
    pub src_ip: IpAddr,
    /// IP destination address.
    pub dst_ip: IpAddr,
    /// UDP source port (flow entropy, `roce::udp::rocev2_src_port`).
    pub src_port: u16,
    /// UDP destination port: always 4791.
    pub dst_port: u16,
    /// ECN codepoint to send with.
    pub ecn: Ecn,
    /// DSCP to send with.
    pub dscp: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits; ignored for IPv4).
    pub flow_label: u32,
    /// Length of the UDP payload in the buffer, bytes.
    pub len: usize,
}

impl Transmit {
    fn new(route: &Route, len: usize) -> Transmit {
        Transmit {
            src_ip: route.src_ip,
            dst_ip: route.dst_ip,
            src_port: route.src_port,
            dst_port: udp::ROCEV2_PORT,
            ecn: route.ecn,
            dscp: route.dscp,
            hop_limit: route.hop_limit,
            flow_label: route.flow_label,
            len,
        }
    }
}

/// An observer of congestion notification: told about every CNP received (IBTA Annex
/// A17.9.3), after the QP's own DCQCN reaction point ([`dcqcn`], if enabled) acted on it.
pub trait RateControl: Send {
    /// A CNP arrived at `now` for local QP `qpn`: its send rate should drop.
    fn on_cnp(&mut self, now: Instant, qpn: u32);
}

/// A CNP waiting to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingCnp {
    pub(crate) src_ip: IpAddr,
    pub(crate) dst_ip: IpAddr,
    /// The local QP whose received packet was CE-marked (for the UDP source port).
    pub(crate) src_qpn: u32,
    /// The QP to throttle.
    pub(crate) dest_qpn: u32,
    pub(crate) pkey: u16,
}

/// A software RoCEv2 HCA. See the [module docs](self).
pub struct SoftHca {
    ctx: Context,
    config: EngineConfig,
    /// Transport state, indexed by the QP's table slot ([`Context::qp_slot`]): QPNs are random,
    /// so the context's O(1) QPN -> slot map serves both tables.
    qps: Vec<Option<Box<QpTransport>>>,
    mrs: MrMemory,
    local_gids: Vec<Gid>,
    ready: VecDeque<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    cnps: VecDeque<PendingCnp>,
    /// QP1: the GSI's MAD queues (module `gsi`).
    gsi: gsi::Gsi,
    cq_events: VecDeque<CqHandle>,
    counters: Counters,
    diag: diag::DiagLog,
    rate_control: Option<Box<dyn RateControl>>,
    inline_scratch: Vec<u8>,
    /// The latest instant any input carried (verbs have no `now`; timers they arm count from it).
    last_now: Instant,
}

impl core::fmt::Debug for SoftHca {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SoftHca")
            .field("qps", &self.ctx.qp_count())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl SoftHca {
    /// A software HCA for `device` (see [`Device::soft_roce`]) with no objects, drawing MR keys
    /// and QPNs from the operating system's random source ([`OsRandom`]).
    #[cfg(feature = "std")]
    pub fn new(device: Device, config: EngineConfig) -> SoftHca {
        SoftHca::with_random(device, config, Box::new(OsRandom))
    }

    /// A software HCA for `device` with no objects, drawing MR keys and QPNs from `random` (see
    /// [`crate::verbs::random`]: it must be unpredictable to peers).
    pub fn with_random(
        device: Device,
        config: EngineConfig,
        random: Box<dyn RandomSource>,
    ) -> SoftHca {
        let mut hca = SoftHca {
            ctx: Context::new(device, random),
            config,
            qps: Vec::new(),
            mrs: MrMemory::default(),
            local_gids: Vec::new(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            cnps: VecDeque::new(),
            gsi: gsi::Gsi::default(),
            cq_events: VecDeque::new(),
            counters: Counters::default(),
            diag: diag::DiagLog::default(),
            rate_control: None,
            inline_scratch: Vec::new(),
            last_now: Instant::ZERO,
        };
        if let Some((mask, value)) = hca.config.qpn_prefix {
            hca.ctx.set_qpn_prefix(mask, value);
        }
        hca.refresh_local_gids();
        hca
    }

    /// The verbs context (read-only: changes go through the engine's verbs, which keep the
    /// transport state in step).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The engine's tunables.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Sets [`EngineConfig::max_unacked_psns`] from now on, for every QP: a link that knows how
    /// much its peer can buffer shares that among its QPs. Packets already in flight stay;
    /// requesters wait until their unacknowledged PSNs fall below the new window. At least 1.
    pub fn set_max_unacked_psns(&mut self, psns: u32) {
        self.config.max_unacked_psns = psns.max(1);
    }

    /// The device counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Installs the rate-control hook that CNPs are handed to.
    pub fn set_rate_control(&mut self, hook: Box<dyn RateControl>) {
        self.rate_control = Some(hook);
    }

    // ---- addresses ----

    fn refresh_local_gids(&mut self) {
        self.local_gids.clear();
        if let Some(port) = self.ctx.device().port(1) {
            self.local_gids.extend(
                port.gids
                    .iter()
                    .filter(|(_, e)| e.gid_type == GidType::RoceV2)
                    .map(|(_, e)| e.gid),
            );
        }
    }

    /// Adds a GID table entry (an IP address of the link; see [`Context::add_gid`]). RoCEv2
    /// entries become addresses the engine accepts packets for.
    ///
    /// # Errors
    /// As [`Context::add_gid`].
    pub fn add_gid(&mut self, port: u8, entry: GidEntry) -> Result<u32, VerbsError> {
        let r = self.ctx.add_gid(port, entry);
        self.refresh_local_gids();
        r
    }

    /// Removes a GID table entry ([`Context::remove_gid`]).
    ///
    /// # Errors
    /// As [`Context::remove_gid`].
    pub fn remove_gid(&mut self, port: u8, index: u32) -> Result<GidEntry, VerbsError> {
        let r = self.ctx.remove_gid(port, index);
        self.refresh_local_gids();
        r
    }

    // ---- PD, MR ----

    /// ibv_alloc_pd(3).
    ///
    /// # Errors
    /// As [`Context::alloc_pd`].
    pub fn alloc_pd(&mut self) -> Result<PdHandle, VerbsError> {
        self.ctx.alloc_pd()
    }

    /// ibv_dealloc_pd(3).
    ///
    /// # Errors
    /// As [`Context::dealloc_pd`].
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbsError> {
        self.ctx.dealloc_pd(pd)
    }

    /// ibv_reg_mr(3) over all of `memory`: its bytes become the MR `iova .. iova + len`.
    ///
    /// # Errors
    /// As [`SoftHca::reg_mr_range`].
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let len = memory.len();
        self.reg_mr_range(pd, memory, 0, len, iova, access)
    }

    /// ibv_reg_mr_iova(3) over `length` bytes of `memory` from byte `offset`: they become the MR
    /// `iova .. iova + length`. SGE addresses and RETH / AtomicETH addresses name bytes of the
    /// MR by iova.
    ///
    /// # Errors
    /// [`VerbsError::RegMr`] with [`Cause::OutOfRange`] if the range exceeds `memory`, and the
    /// errors of [`Context::reg_mr_iova`] (unknown PD, access flags, zero length ...).
    pub fn reg_mr_range(
        &mut self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        offset: usize,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        if gpu_p2p::check_range(offset, length, memory.len()).is_err() {
            return Err(VerbsError::RegMr {
                pd: pd.index(),
                cause: Cause::OutOfRange {
                    attr: "length",
                    value: offset as u64 + length as u64,
                    max: memory.len() as u64,
                },
            });
        }
        let mr = self
            .ctx
            .reg_mr_iova(pd, iova, length as u64, iova, access)?
            .clone();
        self.mrs.insert(mr.slot(), MrBacking { memory, offset });
        Ok(mr)
    }

    /// ibv_dereg_mr(3): both keys stop working at once; later packets naming them fail their
    /// key checks.
    ///
    /// # Errors
    /// As [`Context::dereg_mr`].
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        let slot = self.ctx.mrs().lookup_lkey(lkey).map(MemoryRegion::slot);
        self.ctx.dereg_mr(lkey)?;
        if let Some(slot) = slot {
            self.mrs.remove(slot);
        }
        Ok(())
    }

    // ---- CQ, SRQ, AH ----

    /// ibv_create_cq(3).
    ///
    /// # Errors
    /// As [`Context::create_cq`].
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle, VerbsError> {
        self.ctx.create_cq(cqe)
    }

    /// ibv_destroy_cq(3).
    ///
    /// # Errors
    /// As [`Context::destroy_cq`].
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbsError> {
        self.ctx.destroy_cq(cq)
    }

    /// ibv_poll_cq(3): moves up to `out.len()` completions into `out`, oldest first; returns
    /// how many.
    ///
    /// # Errors
    /// As [`Context::poll_cq`].
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        self.ctx.poll_cq(cq, out)
    }

    /// ibv_req_notify_cq(3); the event shows up in [`SoftHca::poll_cq_event`].
    ///
    /// # Errors
    /// As [`Context::req_notify_cq`].
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError> {
        self.ctx.req_notify_cq(cq, solicited_only)
    }

    /// ibv_create_srq(3).
    ///
    /// # Errors
    /// As [`Context::create_srq`].
    pub fn create_srq(&mut self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, VerbsError> {
        self.ctx.create_srq(pd, attr)
    }

    /// ibv_modify_srq(3).
    ///
    /// # Errors
    /// As [`Context::modify_srq`].
    pub fn modify_srq(
        &mut self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        self.ctx.modify_srq(srq, attr, mask)
    }

    /// ibv_destroy_srq(3).
    ///
    /// # Errors
    /// As [`Context::destroy_srq`].
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        self.ctx.destroy_srq(srq)
    }

    /// ibv_post_srq_recv(3).
    ///
    /// # Errors
    /// As [`Context::post_srq_recv`].
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        self.ctx.post_srq_recv(srq, wr)
    }

    /// ibv_create_ah(3).
    ///
    /// # Errors
    /// As [`Context::create_ah`].
    pub fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, VerbsError> {
        self.ctx.create_ah(pd, attr)
    }

    /// ibv_destroy_ah(3). UD WRs already posted keep the address they resolved.
    ///
    /// # Errors
    /// As [`Context::destroy_ah`].
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        self.ctx.destroy_ah(ah)
    }

    // ---- QP ----

    /// ibv_create_qp(3): a QP in RESET; returns its QPN.
    ///
    /// # Errors
    /// As [`Context::create_qp`].
    pub fn create_qp(&mut self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, VerbsError> {
        let qpn = self.ctx.create_qp(pd, init)?;
        let Some(index) = self.ctx.qp_slot(qpn).map(|s| s as usize) else {
            return Ok(qpn);
        };
        if self.qps.len() <= index {
            self.qps.resize_with(index + 1, || None);
        }
        if let Some(slot) = self.qps.get_mut(index) {
            *slot = Some(Box::new(QpTransport::new(
                qpn,
                init.qp_type,
                pd,
                init.send_cq,
                init.recv_cq,
                init.srq,
            )));
        }
        let dcqcn = self.config.dcqcn;
        if let Some(t) = self.qp_transport(qpn) {
            t.rp = dcqcn.map(ReactionPoint::new);
        }
        Ok(qpn)
    }

    /// Enables (`Some`) or disables (`None`) DCQCN's reaction point on QP `qpn`, whatever
    /// [`EngineConfig::dcqcn`] chose at its creation (per-QP congestion control, as ConnectX
    /// enables it per priority and per QP). A new reaction point starts unlimited; disabling
    /// drops any rate limit at once.
    ///
    /// # Errors
    /// [`VerbsError::ModifyQp`] with [`Cause::NoSuchObject`] when `qpn` names no QP.
    pub fn set_qp_dcqcn(
        &mut self,
        qpn: u32,
        params: Option<DcqcnParams>,
    ) -> Result<(), VerbsError> {
        let now = self.now_hint();
        let Some(t) = self.qp_transport(qpn) else {
            return Err(VerbsError::ModifyQp {
                qpn,
                cause: Cause::NoSuchObject {
                    object: crate::verbs::error::Object::Qp,
                    id: qpn,
                },
            });
        };
        t.rp = params.map(ReactionPoint::new);
        self.after_qp(qpn, now);
        Ok(())
    }

    /// The DCQCN reaction point of QP `qpn` (its rates, alpha and counters), if enabled.
    #[must_use]
    pub fn qp_reaction_point(&self, qpn: u32) -> Option<&ReactionPoint> {
        self.qp_transport_ref(qpn)?.rp.as_ref()
    }

    /// ibv_query_qp(3).
    ///
    /// # Errors
    /// As [`Context::query_qp`].
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr), VerbsError> {
        self.ctx.query_qp(qpn)
    }

    /// ibv_destroy_qp(3): posted WRs vanish without completions.
    ///
    /// # Errors
    /// As [`Context::destroy_qp`].
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let index = self.ctx.qp_slot(qpn);
        self.ctx.destroy_qp(qpn)?;
        if let Some(slot) = index.and_then(|i| self.qps.get_mut(i as usize)) {
            *slot = None;
        }
        Ok(())
    }

    /// Moves every QP not yet in ERR to ERR, as [`Self::modify_qp`] does (each outstanding WR
    /// completes with `IBV_WC_WR_FLUSH_ERR`): what closing a device does to its QPs. Every state
    /// -> ERR, RESET included, is a valid transition (IBTA 10.3.1), so none is refused.
    pub fn error_all_qps(&mut self) {
        let qpns: Vec<u32> = self.ctx.qpns().collect();
        for qpn in qpns {
            let state = self.ctx.qp(qpn).map(|q| q.state());
            if matches!(state, Some(st) if st != QpState::Err) {
                let attr = QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                };
                let _ = self.modify_qp(qpn, &attr, QpAttrMask::STATE);
            }
        }
    }

    /// ibv_modify_qp(3), then the transport follows: RESET forgets everything, ERR flushes every
    /// WR with IBV_WC_WR_FLUSH_ERR, `rq_psn` / `sq_psn` set the expected and next PSNs, SQD
    /// stops starting new WRs until the send queue drains (then `IBV_EVENT_SQ_DRAINED` if asked).
    ///
    /// # Errors
    /// As [`Context::modify_qp`]; on error nothing changes.
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<ModifyOutcome, VerbsError> {
        let outcome = self.ctx.modify_qp(qpn, attr, mask)?;
        let now = self.now_hint();
        let Some(qp) = self.ctx.qp(qpn) else {
            return Ok(outcome);
        };
        let qp_attr = *qp.attr();
        let qp_type = qp.qp_type();
        let port = self.ctx.device().port(1);
        let active_mtu = port.map_or(256, |p| p.attr.active_mtu.bytes() as u32);
        let pkey = port.and_then(|p| p.pkeys.get(qp_attr.pkey_index));
        let sgid = port.and_then(|p| p.gids.get(u32::from(qp_attr.ah_attr.sgid_index)).copied());
        let ecn_capable = self.config.ecn_capable;
        let ports = self.config.udp_src_ports.clone();
        let Some((t, mut env)) = self.split(qpn, now) else {
            return Ok(outcome);
        };
        match outcome.to {
            QpState::Reset => t.reset(),
            QpState::Err if outcome.from != QpState::Err => t.flush(&mut env),
            _ => {}
        }
        if outcome.to != QpState::Reset {
            if let Some(pkey) = pkey {
                t.pkey = pkey;
            }
            t.pmtu = match qp_type {
                QpType::Ud => active_mtu,
                _ => qp_attr.path_mtu.bytes() as u32,
            };
            if mask.contains(QpAttrMask::RQ_PSN) {
                t.resp.psn = Psn::new(qp_attr.rq_psn);
                t.resp.ack_psn = t.resp.psn;
            }
            if mask.contains(QpAttrMask::SQ_PSN) {
                let psn = Psn::new(qp_attr.sq_psn);
                t.req.psn = psn;
                t.req.sent_end = psn;
                t.comp.psn = psn;
            }
            if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
                t.resp.set_resources(qp_attr.max_dest_rd_atomic);
            }
            if outcome.to == QpState::Rts && outcome.from == QpState::Rtr {
                t.comp.retry_left = qp_attr.retry_cnt;
                t.comp.rnr_left = qp_attr.rnr_retry;
            }
            if mask.contains(QpAttrMask::AV) && qp_type != QpType::Ud {
                t.route =
                    sgid.map(|s| route_for(qpn, &s.gid, &qp_attr.ah_attr, ecn_capable, &ports));
            }
        }
        self.after_qp(qpn, now);
        Ok(outcome)
    }

    // ---- posting ----

    /// ibv_post_send(3) for one WR: checks it as rxe does (state, opcode, SGE count, lengths,
    /// inline size, AH), copies it into the send queue, or changes nothing. INLINE data is
    /// copied now: its SGEs must lie in registered memory (the engine has no process memory), but
    /// their keys' PD and access rights are not checked. On a QP in SQE or ERR the WR completes at
    /// once with IBV_WC_WR_FLUSH_ERR.
    ///
    /// # Errors
    /// [`VerbsError::PostSend`]: the errors of [`Context::validate_send_wr`]; [`Cause::QueueFull`]
    /// (`ENOMEM`) when `max_send_wr` WRs are queued; [`Cause::InvalidValue`] (`sg_list`) for
    /// INLINE SGEs outside registered memory.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let info = self.ctx.validate_send_wr(qpn, wr)?;
        let err = |cause| VerbsError::PostSend {
            qpn,
            wr_id: wr.wr_id,
            cause,
        };
        let Some(qp) = self.ctx.qp(qpn) else {
            return Err(err(Cause::NoSuchObject {
                object: crate::verbs::error::Object::Qp,
                id: qpn,
            }));
        };
        let max_send_wr = qp.cap().max_send_wr;
        let own_qkey = qp.attr().qkey;
        let state = qp.state();
        let ud = match wr.op.ud_dest() {
            Some(dest) => {
                let ah = self.ctx.ah(dest.ah).ok_or(err(Cause::NoSuchObject {
                    object: crate::verbs::error::Object::Ah,
                    id: dest.ah.index(),
                }))?;
                // IBTA vol. 1 §10.2.4 (controlled Q_Key): the high bit set means "use the QP's".
                let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
                    own_qkey
                } else {
                    dest.remote_qkey
                };
                Some(UdRoute {
                    route: route_for(
                        qpn,
                        &ah.sgid().gid,
                        ah.attr(),
                        self.config.ecn_capable,
                        &self.config.udp_src_ports,
                    ),
                    remote_qpn: dest.remote_qpn,
                    qkey,
                })
            }
            None => None,
        };
        let Some(t) = self.qp_transport_ref(qpn) else {
            return Err(err(Cause::NoSuchObject {
                object: crate::verbs::error::Object::Qp,
                id: qpn,
            }));
        };
        if t.sq.len() >= max_send_wr as usize {
            return Err(err(Cause::QueueFull {
                max_wr: max_send_wr,
            }));
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE);
        if inline {
            self.gather_inline(wr).map_err(err)?;
        }
        let now = self.now_hint();
        let new = NewWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.send_flags,
            signaled: info.signaled,
            length: info.length,
            ud,
        };
        let scratch = core::mem::take(&mut self.inline_scratch);
        if let Some((t, mut env)) = self.split(qpn, now) {
            t.sq.push(new, wr.sg_list, inline.then_some(&scratch[..]));
            if matches!(state, QpState::Err | QpState::Sqe) {
                t.flush_sq(&mut env);
            }
        }
        self.inline_scratch = scratch;
        self.after_qp(qpn, now);
        Ok(())
    }

    /// ibv_post_send(3) for a list of WRs: posts them in order and stops at the first that
    /// fails, returning its index (libibverbs' `bad_wr`) with the error; the WRs before it stay
    /// posted.
    ///
    /// # Errors
    /// `(index, error)` of the first WR [`SoftHca::post_send`] refused.
    pub fn post_send_list(
        &mut self,
        qpn: u32,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, VerbsError)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_send(qpn, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// ibv_post_recv(3) for a list of WRs, as [`SoftHca::post_send_list`].
    ///
    /// # Errors
    /// `(index, error)` of the first WR [`SoftHca::post_recv`] refused.
    pub fn post_recv_list(
        &mut self,
        qpn: u32,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, VerbsError)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_recv(qpn, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Copies the data of an INLINE WR into the scratch buffer.
    fn gather_inline(&mut self, wr: &SendWr<'_>) -> Result<(), Cause> {
        self.inline_scratch.clear();
        for sge in wr.sg_list {
            let bad = Cause::InvalidValue {
                attr: "sg_list",
                value: sge.addr,
            };
            let mr = self.ctx.mrs().lookup_lkey(sge.lkey).ok_or(bad)?;
            if !mr.contains(sge.addr, u64::from(sge.length)) {
                return Err(bad);
            }
            let start = self.inline_scratch.len();
            self.inline_scratch.resize(start + sge.length as usize, 0);
            let dst = self.inline_scratch.get_mut(start..).ok_or(bad)?;
            let placed = self
                .mrs
                .gather(self.ctx.mrs(), mr.pd(), core::iter::once(*sge), 0, dst);
            if placed.is_err() {
                return Err(bad);
            }
        }
        Ok(())
    }

    /// ibv_post_recv(3) for one WR; nothing is queued on error. On a QP in ERR the WR completes
    /// at once with IBV_WC_WR_FLUSH_ERR.
    ///
    /// # Errors
    /// As [`Context::post_recv`].
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        self.ctx.post_recv(qpn, wr)?;
        if self.ctx.qp(qpn).is_some_and(|q| q.state() == QpState::Err) {
            let now = self.now_hint();
            if let Some((t, mut env)) = self.split(qpn, now) {
                t.flush_rq(&mut env);
            }
        }
        Ok(())
    }

    // ---- I/O ----

    /// A datagram arrived. Invalid packets are dropped and counted ([`Counters::drops`]), never
    /// a panic; see the `recv` module docs for the order of the checks.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &Datagram<'_>) {
        self.last_now = self.last_now.max(now);
        if let Err(rejection) = self.receive(now, datagram) {
            self.record_drop(now, rejection);
        }
    }

    /// Builds the next packet to send into `buf` (at least [`MAX_UDP_PAYLOAD`] bytes always
    /// suffice) and describes it; `None` when nothing is to be sent, or when the next packet
    /// does not fit `buf` (counted in `send_err`; nothing is lost, call again with a larger
    /// buffer). CNPs go first, then the QPs with work, round-robin, one packet each; within a
    /// QP the responder (ACKs, READ responses) and the requester alternate.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.transmit(now, &mut TxOut::new(buf, false))
    }

    /// As [`SoftHca::poll_transmit`], for a link that can send one datagram from several buffers
    /// (sendmsg(2) `iovec`s, NIC gather descriptors): a payload in CPU-addressable MR memory
    /// ([`gpu_p2p::Memory::host_ptr`]) is not copied but described as [`TxSegment`]s that keep
    /// their memory alive; the headers go into `buf`, the pad and ICRC into the returned
    /// [`GatherTransmit`]'s trailer. Other payloads (inline data, GPU memory, a packet spanning
    /// more than [`MAX_TX_SEGMENTS`] SGEs) are copied into `buf` as by `poll_transmit`, so `buf`
    /// should still hold [`MAX_UDP_PAYLOAD`] bytes; a shorter one makes such a packet wait, as
    /// there (`send_err`). The link must send the packet before the next call that could change
    /// the memory it references is made, or accept that a changed buffer gives a packet the peer
    /// drops (IBTA vol. 1 §10.7: a buffer of an outstanding WR must not change). See module `tx`.
    #[must_use]
    pub fn poll_transmit_gather(&mut self, now: Instant, buf: &mut [u8]) -> Option<GatherTransmit> {
        let mut out = TxOut::new(buf, true);
        let t = self.transmit(now, &mut out)?;
        Some(out.take(t))
    }

    fn transmit(&mut self, now: Instant, out: &mut TxOut<'_>) -> Option<Transmit> {
        self.last_now = self.last_now.max(now);
        if let Some(cnp) = self.cnps.front().copied() {
            if let Some(tx) = self.build_cnp(&cnp, out) {
                self.cnps.pop_front();
                return Some(tx);
            }
            return None;
        }
        // QP1's MADs and the QPs take turns, so neither a MAD flood nor busy QPs starve the other.
        if !self.gsi.send.is_empty() && (self.ready.is_empty() || self.gsi.turn) {
            self.gsi.turn = false;
            return self.build_gsi(out);
        }
        self.gsi.turn = true;
        for _ in 0..self.ready.len() {
            let qpn = self.ready.pop_front()?;
            let result = match self.split(qpn, now) {
                Some((t, mut env)) => {
                    t.in_ready = false;
                    // A plain ACK lets one request packet of its QP go first: the ACK then
                    // follows it in the same batch, as the shorter last datagram of a UDP GSO
                    // train (one send and one receive for both), and a request that arrives
                    // meanwhile is coalesced into it. An ACK acknowledges every PSN before its
                    // own, so a responder may coalesce them (IBTA vol. 1 §9.7.5, responder
                    // ACK generation; the module docs of `responder`), and nothing bounds an
                    // ACK's delay but the requester's local ACK timeout (ch. 9 transport timer),
                    // which one packet is far below. It yields once per ACK: requests cannot
                    // starve it.
                    // Within `EngineConfig::ack_delay` a lone plain ACK waits for one.
                    let held = t.ack_held(now);
                    let ack_yields =
                        !held && t.resp_turn && !t.ack_yielded && t.front_is_plain_ack();
                    let order: &[bool] = if held {
                        &[false]
                    } else if t.resp_turn && !ack_yields {
                        &[true, false]
                    } else {
                        &[false, true]
                    };
                    // DCQCN: a rate-limited requester waits for its pacing time; responses
                    // (ACKs, READ responses) are not held back.
                    let paced = t.rp.as_ref().is_some_and(|rp| rp.next_send(now).is_some());
                    let order: &[bool] = match (paced, held) {
                        (false, _) => order,
                        (true, true) => &[],
                        (true, false) => &[true],
                    };
                    let mut result = TxResult::Nothing;
                    for &responder in order {
                        result = if responder {
                            t.next_response(&mut env, out)
                        } else {
                            t.next_request(&mut env, out)
                        };
                        match result {
                            TxResult::Packet(_) => {
                                if responder {
                                    t.resp_turn = false;
                                    t.ack_yielded = false;
                                } else if ack_yields || held {
                                    // The ACK goes next, right behind this request.
                                    t.ack_yielded = true;
                                    t.resp_turn = true;
                                } else {
                                    t.resp_turn = true;
                                }
                                if let (false, Some(rp), TxResult::Packet(tx)) =
                                    (responder, t.rp.as_mut(), &result)
                                {
                                    rp.on_sent(now, dcqcn::wire_bytes(tx.len, tx.dst_ip.is_ipv6()));
                                }
                                break;
                            }
                            TxResult::BufferTooSmall => break,
                            TxResult::Nothing => {}
                        }
                    }
                    result
                }
                None => continue,
            };
            match result {
                TxResult::Packet(tx) => {
                    self.after_qp(qpn, now);
                    self.mark_ready(qpn);
                    return Some(tx);
                }
                TxResult::BufferTooSmall => {
                    self.mark_ready(qpn);
                    self.after_qp(qpn, now);
                    return None;
                }
                TxResult::Nothing => self.after_qp(qpn, now),
            }
        }
        if !self.gsi.send.is_empty() {
            self.gsi.turn = false;
            return self.build_gsi(out);
        }
        None
    }

    /// When [`SoftHca::handle_timeout`] should be called next (`None`: no timer armed): the
    /// earliest local ACK timeout, RNR wait, held ACK, or DCQCN timer or pacing time (a
    /// rate-limited requester's next packet) of any QP.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        // Drop entries whose QP has since registered another deadline, and move entries whose
        // QP's deadline moved later (a re-armed timer): each pass pops one entry and pushes at
        // most one later one per QP, so this ends.
        while let Some(&Reverse((at, qpn))) = self.timers.peek() {
            let Some(t) = self.qp_transport(qpn) else {
                self.timers.pop();
                continue;
            };
            if t.timer_key != Some(at) {
                self.timers.pop();
                continue;
            }
            match t.next_deadline() {
                Some(d) if d == at => return Some(at),
                Some(d) if d > at => {
                    t.timer_key = Some(d);
                    self.timers.pop();
                    self.timers.push(Reverse((d, qpn)));
                }
                // Earlier deadlines are always registered when set; none: disarmed.
                _ => {
                    t.timer_key = None;
                    self.timers.pop();
                }
            }
        }
        None
    }

    /// The latest instant any input carried ([`Instant::ZERO`] before the first): a caller
    /// holding an instant it read earlier passes `max` of the two to stay monotonic.
    #[must_use]
    pub fn latest_instant(&self) -> Instant {
        self.last_now
    }

    /// The time reached a deadline: local ACK timeouts retransmit or fail, RNR waits end, DCQCN
    /// timers raise rates and paced requesters may send again.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        // Each pass removes one heap entry: bounded by the heap.
        while let Some(&Reverse((at, qpn))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some((t, mut env)) = self.split(qpn, now) else {
                continue;
            };
            if t.timer_key != Some(at) {
                continue;
            }
            t.timer_key = None;
            if let Some(rp) = t.rp.as_mut() {
                rp.handle_timeout(now);
            }
            t.on_timer(&mut env);
            self.after_qp(qpn, now);
        }
    }

    /// Ends the wait of every held ACK ([`EngineConfig::ack_delay`]): each goes at the next
    /// [`SoftHca::poll_transmit`] instead of when its delay runs out. A driver that is about to
    /// stop (a device being closed) calls this before its last transmit, since nothing would
    /// send a held ACK afterwards and the peer's requester would retransmit until its retry
    /// count runs out (`IBV_WC_RETRY_EXC_ERR`, IBTA vol. 1 §9.7.6.1.3) for a message this side
    /// already received and completed.
    pub fn release_held_acks(&mut self) {
        let held: Vec<u32> = self
            .qps
            .iter_mut()
            .flatten()
            .filter_map(|t| t.resp.ack_due.take().map(|_| t.qpn))
            .collect();
        for qpn in held {
            self.mark_ready(qpn);
        }
    }

    /// The oldest unread async event (ibv_get_async_event(3)).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.poll_event()
    }

    /// Whether a QP on the ready list has a response queued (an ACK or NAK, a READ or atomic
    /// response): what a progress round may hold back to leave with the program's reply (IBTA
    /// vol. 1 9.7.5.1.2, coalesced acknowledgements). A round that received only responses (a
    /// requester's ACKs) has nothing to hold. O(ready QPs).
    #[must_use]
    pub fn has_queued_responses(&self) -> bool {
        self.ready.iter().any(|&qpn| {
            self.qp_transport_ref(qpn)
                .is_some_and(|t| !t.resp.out.is_empty())
        })
    }

    /// Whether a completion event ([`SoftHca::poll_cq_event`]) or an async event
    /// ([`SoftHca::poll_event`]) is queued unread.
    #[must_use]
    pub fn has_pending_events(&self) -> bool {
        !self.cq_events.is_empty() || self.ctx.has_pending_events()
    }

    /// The oldest unread completion event of an armed CQ (ibv_get_cq_event(3)).
    #[must_use]
    pub fn poll_cq_event(&mut self) -> Option<CqHandle> {
        self.cq_events.pop_front()
    }

    /// The oldest unread diagnostic record (what a driver would log; rate-limited).
    #[must_use]
    pub fn poll_diag(&mut self) -> Option<DiagRecord> {
        self.diag.pop()
    }

    // ---- internals ----

    /// The latest instant any input carried: verbs have no `now` argument, so timers they arm
    /// count from it.
    fn now_hint(&self) -> Instant {
        self.last_now
    }

    /// A QP's transport state, found through its table slot. O(1).
    fn qp_transport(&mut self, qpn: u32) -> Option<&mut QpTransport> {
        let slot = self.ctx.qp_slot(qpn)? as usize;
        self.qps
            .get_mut(slot)?
            .as_deref_mut()
            .filter(|t| t.qpn == qpn)
    }

    /// Shared form of [`Self::qp_transport`].
    fn qp_transport_ref(&self, qpn: u32) -> Option<&QpTransport> {
        let slot = self.ctx.qp_slot(qpn)? as usize;
        self.qps.get(slot)?.as_deref().filter(|t| t.qpn == qpn)
    }

    /// A QP's transport state and the rest of the engine, borrowed together.
    fn split(&mut self, qpn: u32, now: Instant) -> Option<(&mut QpTransport, Env<'_>)> {
        let slot = self.ctx.qp_slot(qpn)? as usize;
        let t = self
            .qps
            .get_mut(slot)?
            .as_deref_mut()
            .filter(|t| t.qpn == qpn)?;
        let env = Env {
            ctx: &mut self.ctx,
            mem: &self.mrs,
            counters: &mut self.counters,
            diag: &mut self.diag,
            config: &self.config,
            cq_events: &mut self.cq_events,
            now,
        };
        Some((t, env))
    }

    fn mark_ready(&mut self, qpn: u32) {
        if let Some(t) = self.qp_transport(qpn) {
            if !t.in_ready {
                t.in_ready = true;
                self.ready.push_back(qpn);
            }
        }
    }

    /// Bookkeeping after any change to a QP: in-order completions, the SQD drain, its timer and
    /// its place on the ready list.
    fn after_qp(&mut self, qpn: u32, now: Instant) {
        let Some((t, mut env)) = self.split(qpn, now) else {
            return;
        };
        let state = env.state(qpn);
        t.complete_front(&mut env);
        if t.cq_overrun {
            t.cq_overrun = false;
            if state != QpState::Err {
                // IBTA vol. 1 §11.6.3: a CQ overrun is an error of the QPs that use the CQ.
                t.enter_error(
                    &mut env,
                    Some(AsyncEventType::QpFatal),
                    crate::verbs::wc::WcStatus::WrFlushErr,
                );
            }
        }
        // IBTA vol. 1 §10.3.1: SQD is reached once no started WR is outstanding.
        if state == QpState::Sqd
            && env.ctx.qp(qpn).is_some_and(|q| q.sq_draining())
            && !t.has_in_flight()
        {
            let _ = env.ctx.qp_sq_drained(qpn);
        }
        let deadline = t.next_deadline();
        let wants_tx = t.may_transmit(now) && !t.in_ready;
        let mut push_timer = None;
        if let Some(d) = deadline {
            if t.timer_key.is_none_or(|k| d < k) {
                t.timer_key = Some(d);
                push_timer = Some(d);
            }
        }
        if wants_tx {
            t.in_ready = true;
        }
        if let Some(d) = push_timer {
            self.timers.push(Reverse((d, qpn)));
            // Stale entries (deadlines moved earlier) are normally popped in time; keep the heap
            // bounded even if a peer makes deadlines jump around.
            if self.timers.len() > 2 * self.ctx.qp_count() as usize + 64 {
                let (qps, ctx) = (&self.qps, &self.ctx);
                self.timers.retain(|Reverse((at, q))| {
                    ctx.qp_slot(*q)
                        .and_then(|i| qps.get(i as usize))
                        .and_then(|s| s.as_deref())
                        .is_some_and(|t| t.qpn == *q && t.timer_key == Some(*at))
                });
            }
        }
        if wants_tx {
            self.ready.push_back(qpn);
        }
    }

    /// Builds a CNP (IBTA Annex A17.9.3): BTH opcode 0x81 to the QP to throttle, BECN set, 16
    /// reserved zero bytes, ICRC.
    fn build_cnp(&mut self, cnp: &PendingCnp, out: &mut TxOut<'_>) -> Option<Transmit> {
        out.reset();
        let buf = &mut *out.buf;
        let transport = TransportRepr {
            bth: roce::cnp::Repr {
                dest_qpn: cnp.dest_qpn,
                pkey: cnp.pkey,
            }
            .bth_repr(),
            ext: ExtReprs::default(),
        };
        let route = Route {
            src_ip: cnp.src_ip,
            dst_ip: cnp.dst_ip,
            src_port: src_port_for(
                &self.config.udp_src_ports,
                udp::rocev2_src_port(cnp.src_qpn),
            ),
            dscp: self.config.cnp_dscp,
            ecn: Ecn::NotEct,
            hop_limit: 64,
            flow_label: 0,
        };
        let payload = roce::cnp::PAYLOAD_LEN;
        let built = net::write_headers(buf, &transport, payload, payload).and_then(|header_len| {
            if let Some(p) = buf.get_mut(header_len..header_len + payload) {
                p.fill(0);
            }
            net::seal(buf, header_len, payload, &route)
        });
        match built {
            Ok(len) => {
                out.built_in_buffer(len);
                counters::bump!(self.counters.cnp_sent);
                counters::bump!(self.counters.sent_pkts);
                Some(Transmit::new(&route, len))
            }
            Err(net::BuildError::BufferTooSmall) => {
                counters::bump!(self.counters.send_err);
                None
            }
            Err(net::BuildError::Headers) => {
                // Unsendable (mixed address families): drop it.
                counters::bump!(self.counters.send_err);
                self.cnps.pop_front();
                None
            }
        }
    }
}

/// The UDP source port of a flow whose entropy port (`roce::udp::rocev2_src_port`, 0xC000 ..=
/// 0xFFFF) is `entropy`, on a link that can send from `ports` ([`EngineConfig::udp_src_ports`]):
/// `entropy` itself when `ports` is empty, else `ports[(entropy & 0x3FFF) % ports.len()]`, so
/// that QPs spread over the link's ports as their entropy values do and one QP always uses one
/// port (its packets stay one flow, in order on an ECMP path).
pub fn src_port_for(ports: &[u16], entropy: u16) -> u16 {
    if ports.is_empty() {
        entropy
    } else {
        ports[usize::from(entropy & 0x3FFF) % ports.len()]
    }
}

/// The route of packets from QP `qpn` through address vector `av` with source GID `sgid`
/// (rxe `rxe_init_av` / `rxe_prepare`): IPs from the GIDs, UDP source port from the flow label
/// if set (`rocev2_src_port_from_flow_label`) else from the QPN, mapped onto the ports the link
/// can send from (`ports`, [`EngineConfig::udp_src_ports`], by [`src_port_for`]); DSCP and ECN
/// from the traffic class.
fn route_for(qpn: u32, sgid: &Gid, av: &AhAttr, ecn_capable: bool, ports: &[u16]) -> Route {
    let (src_ip, dst_ip) = net::ips_of(sgid, &av.dgid);
    let entropy = if av.flow_label != 0 {
        udp::rocev2_src_port_from_flow_label(av.flow_label)
    } else {
        udp::rocev2_src_port(qpn)
    };
    let src_port = src_port_for(ports, entropy);
    let tc_ecn = Ecn::from_bits(av.traffic_class);
    let ecn = if tc_ecn == Ecn::NotEct && ecn_capable {
        Ecn::Ect0
    } else {
        tc_ecn
    };
    Route {
        src_ip,
        dst_ip,
        src_port,
        dscp: av.traffic_class >> 2,
        ecn,
        hop_limit: av.hop_limit,
        flow_label: av.flow_label,
    }
}
