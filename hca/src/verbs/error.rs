//! Errors of the verbs object model.
//!
//! Every verb that can fail returns a [`VerbsError`]: one variant per operation (`create_qp`,
//! `modify_qp`, `post_send`, ...), naming the object it failed on (PD index, QPN, lkey, ...) and a
//! [`Cause`] that says what was wrong. [`VerbsError::errno`] gives the `errno` that libibverbs
//! (over Linux rxe) would report for the same mistake, so that a C shim or a conformance test can
//! compare like for like.
//!
//! Memory-key checks made by the transport engine on every SGE and RETH do not fail a verb; they
//! return a [`KeyError`] whose [`KeyErrorKind`] the engine maps to a work-completion status or a
//! NAK (see [`crate::verbs::mr`]).

use core::fmt;

use crate::verbs::attr::{AccessFlags, QpAttrMask, QpState, QpType, WcStatus, WrOpcode};

/// Linux `errno` values (`include/uapi/asm-generic/errno-base.h`, `errno.h`) as returned by
/// libibverbs calls.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such entry.
    pub const ENOENT: i32 = 2;
    /// Out of memory / out of resources (a queue or an object table is full).
    pub const ENOMEM: i32 = 12;
    /// Device or resource busy (the object still has users; a CQ overran).
    pub const EBUSY: i32 = 16;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
}

/// The kind of verbs object an error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Object {
    /// Protection domain.
    Pd,
    /// Memory region (named by its lkey).
    Mr,
    /// Completion queue.
    Cq,
    /// Shared receive queue.
    Srq,
    /// Address handle.
    Ah,
    /// Queue pair (named by its QPN).
    Qp,
    /// HCA port (named by its 1-based number).
    Port,
    /// GID table entry (named by its index).
    Gid,
    /// P_Key table entry (named by its index).
    Pkey,
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Object::Pd => "PD",
            Object::Mr => "MR",
            Object::Cq => "CQ",
            Object::Srq => "SRQ",
            Object::Ah => "AH",
            Object::Qp => "QP",
            Object::Port => "port",
            Object::Gid => "GID",
            Object::Pkey => "P_Key",
        })
    }
}

/// What was wrong with a verbs call.
///
/// Attribute names (`attr`) are the field names of the libibverbs structures (`ibv_qp_attr`,
/// `ibv_qp_cap`, `ibv_ah_attr`, `ibv_send_wr`, ...), so that an error names the field to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// The handle, key or number names no live object (a destroyed object, a stale handle, a
    /// never-allocated QPN). `EINVAL`.
    NoSuchObject {
        /// The kind of object looked up.
        object: Object,
        /// The handle index, key or number that was looked up.
        id: u32,
    },
    /// The object is still used by others (a PD with MRs or QPs, a CQ attached to a QP, ...).
    /// `EBUSY` (ibv_dealloc_pd(3), ibv_destroy_cq(3)).
    InUse {
        /// How many objects still refer to it.
        users: u32,
    },
    /// The device limit on objects of this kind is reached (`ibv_device_attr.max_*`). `ENOMEM`.
    TooManyObjects {
        /// The kind of object.
        object: Object,
        /// The device limit.
        max: u32,
    },
    /// A value exceeds its limit (a device capability or the width of its field). `EINVAL`.
    OutOfRange {
        /// The attribute, as libibverbs names it.
        attr: &'static str,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// A value is not valid for its attribute (zero where a positive number is needed, an address
    /// range that wraps, an unset table entry). `EINVAL`.
    InvalidValue {
        /// The attribute, as libibverbs names it.
        attr: &'static str,
        /// The value given.
        value: u64,
    },
    /// An attribute that this RoCE device does not support (e.g. an alternate path: Linux bans
    /// automatic path migration on RoCE). `EINVAL`.
    UnsupportedAttribute {
        /// The attribute, as libibverbs names it.
        attr: &'static str,
    },
    /// Access flags with unknown bits, or REMOTE_WRITE / REMOTE_ATOMIC without LOCAL_WRITE
    /// (ibv_reg_mr(3); kernel `ib_check_mr_access`). `EINVAL`.
    AccessFlags {
        /// The raw flag bits given.
        flags: u32,
    },
    /// Two objects that must share a protection domain do not (an AH used on a QP of another PD).
    /// `EINVAL`.
    PdMismatch {
        /// Index of the PD the operation required.
        expected: u32,
        /// Index of the PD the object belongs to.
        found: u32,
    },
    /// ibv_modify_qp(3): no transition from `from` to `to` exists for this QP type (IBTA vol. 1
    /// §10.3.1, the kernel's `qp_state_table`). `EINVAL`.
    InvalidTransition {
        /// The QP's transport service.
        qp_type: QpType,
        /// The QP's current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// ibv_modify_qp(3): the attribute mask lacks attributes this transition requires. `EINVAL`.
    MissingAttributes {
        /// The QP's transport service.
        qp_type: QpType,
        /// The QP's current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The required attributes that were missing.
        missing: QpAttrMask,
    },
    /// ibv_modify_qp(3): the attribute mask carries attributes this transition does not accept.
    /// `EINVAL`.
    DisallowedAttributes {
        /// The QP's transport service.
        qp_type: QpType,
        /// The QP's current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes that may not be given on this transition.
        extra: QpAttrMask,
    },
    /// ibv_modify_qp(3): `cur_qp_state` (IBV_QP_CUR_STATE) is not the QP's actual state. `EINVAL`.
    CurStateMismatch {
        /// The state the caller assumed.
        given: QpState,
        /// The QP's actual state.
        actual: QpState,
    },
    /// The QP is in SQD and its send queue is still draining: only a move to ERR is allowed
    /// (rxe `rxe_qp_chk_attr`). `EINVAL`.
    SqDraining,
    /// The QP is in a state that does not accept this work request: post_send needs RTS or later
    /// (RTS, SQD, SQE, ERR), post_recv needs INIT or later (IBTA C10-97.2.1; rxe_post_send /
    /// rxe_post_recv). `EINVAL`.
    WrongState {
        /// The QP's state.
        state: QpState,
    },
    /// The work queue is full (rxe post_one_send / post_one_recv). `ENOMEM`.
    QueueFull {
        /// The queue's capacity in WRs.
        max_wr: u32,
    },
    /// More scatter/gather entries than the queue accepts (`cap.max_send_sge`, `cap.max_recv_sge`,
    /// `max_sge_rd` for RDMA READ, `max_srq_sge`). `EINVAL`.
    TooManySge {
        /// The number of SGEs given.
        num_sge: usize,
        /// The queue's limit.
        max_sge: u32,
    },
    /// An IBV_SEND_INLINE WR whose data exceeds `cap.max_inline_data`. `EINVAL`.
    InlineTooLarge {
        /// The message length in bytes.
        length: u64,
        /// The QP's inline limit in bytes.
        max_inline: u32,
    },
    /// IBV_SEND_INLINE on an opcode that carries no outgoing data (RDMA READ, atomics, LOCAL_INV).
    /// `EINVAL`.
    InlineNotSupported {
        /// The opcode.
        opcode: WrOpcode,
    },
    /// The opcode is not defined for this transport (RDMA READ or atomics on UC, anything but SEND
    /// on UD; IBTA vol. 1 table 38; rxe `rxe_wr_opcode_info`), or the device lacks atomics.
    /// `EINVAL`.
    OpcodeNotSupported {
        /// The opcode.
        opcode: WrOpcode,
        /// The QP's transport service.
        qp_type: QpType,
    },
    /// A UD QP needs a UD destination (`SendOp::UdSend`); an RC or UC QP takes none. `EINVAL`.
    UdAddressing {
        /// The QP's transport service.
        qp_type: QpType,
    },
    /// The message (the sum of the SGE lengths) exceeds the port's `max_msg_sz`. `EINVAL`.
    MessageTooLong {
        /// The message length in bytes.
        length: u64,
        /// The limit in bytes.
        max: u64,
    },
    /// An atomic WR whose local buffer is not exactly 8 bytes (rxe validate_send_wr). `EINVAL`.
    AtomicLength {
        /// The total SGE length in bytes.
        length: u64,
    },
    /// An atomic WR whose remote address is not 8-byte aligned (atomics act on aligned 64-bit
    /// words; rxe validate_send_wr). `EINVAL`.
    AtomicMisaligned {
        /// The remote virtual address.
        remote_addr: u64,
    },
    /// post_recv on a QP that takes its receive WQEs from an SRQ (rxe_post_recv). `EINVAL`.
    HasSrq,
    /// The completion queue is full: the CQE could not be queued and the CQ is now in error
    /// (CQ overrun, IBTA vol. 1 ch. 11; rxe `rxe_cq_post` returns `-EBUSY`). `EBUSY`.
    CqOverrun {
        /// The CQ's capacity in CQEs.
        capacity: u32,
    },
    /// A hardware backend (rdma-core's libibverbs, `crate::ibverbs`) refused the call with this
    /// errno: the kernel's or the provider's check, passed through unchanged. `Display` gives the
    /// errno's text (strerror(3)) with the `std` feature.
    Os {
        /// The positive errno.
        errno: i32,
    },
}

impl Cause {
    /// The errno libibverbs (over rxe) reports for this cause.
    pub fn errno(&self) -> i32 {
        match self {
            Cause::InUse { .. } | Cause::CqOverrun { .. } => errno::EBUSY,
            Cause::TooManyObjects { .. } | Cause::QueueFull { .. } => errno::ENOMEM,
            Cause::Os { errno } => *errno,
            _ => errno::EINVAL,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::NoSuchObject { object, id } => write!(f, "no such {object} ({id:#x})"),
            Cause::InUse { users } => write!(f, "still in use by {users} object(s)"),
            Cause::TooManyObjects { object, max } => {
                write!(f, "device limit of {max} {object}s reached")
            }
            Cause::OutOfRange { attr, value, max } => {
                write!(f, "{attr} = {value} exceeds the limit {max}")
            }
            Cause::InvalidValue { attr, value } => write!(f, "{attr} = {value} is not valid"),
            Cause::UnsupportedAttribute { attr } => {
                write!(f, "{attr} is not supported on this RoCE device")
            }
            Cause::AccessFlags { flags } => write!(
                f,
                "access flags {flags:#x} are invalid (unknown bits, or REMOTE_WRITE/REMOTE_ATOMIC \
                 without LOCAL_WRITE)"
            ),
            Cause::PdMismatch { expected, found } => {
                write!(f, "object belongs to PD {found}, not PD {expected}")
            }
            Cause::InvalidTransition { qp_type, from, to } => {
                write!(f, "{qp_type} QP cannot move from {from} to {to}")
            }
            Cause::MissingAttributes {
                qp_type,
                from,
                to,
                missing,
            } => write!(
                f,
                "{from}->{to} on a {qp_type} QP requires attribute(s) {}",
                MaskNames(*missing)
            ),
            Cause::DisallowedAttributes {
                qp_type,
                from,
                to,
                extra,
            } => write!(
                f,
                "{from}->{to} on a {qp_type} QP does not accept attribute(s) {}",
                MaskNames(*extra)
            ),
            Cause::CurStateMismatch { given, actual } => {
                write!(f, "cur_qp_state is {given} but the QP is in {actual}")
            }
            Cause::SqDraining => f.write_str("the send queue is still draining (SQD)"),
            Cause::WrongState { state } => {
                write!(f, "the QP is in {state}, which does not accept this WR")
            }
            Cause::QueueFull { max_wr } => write!(f, "the queue is full ({max_wr} WRs)"),
            Cause::TooManySge { num_sge, max_sge } => {
                write!(f, "{num_sge} SGEs exceed the limit of {max_sge}")
            }
            Cause::InlineTooLarge { length, max_inline } => write!(
                f,
                "{length} bytes of inline data exceed max_inline_data {max_inline}"
            ),
            Cause::InlineNotSupported { opcode } => {
                write!(f, "{opcode} carries no data and cannot be INLINE")
            }
            Cause::OpcodeNotSupported { opcode, qp_type } => {
                write!(f, "{opcode} is not supported on a {qp_type} QP")
            }
            Cause::UdAddressing { qp_type } => match qp_type {
                QpType::Ud => f.write_str("a UD QP needs a UD destination (address handle)"),
                _ => write!(f, "a {qp_type} QP takes no UD destination"),
            },
            Cause::MessageTooLong { length, max } => {
                write!(f, "message of {length} bytes exceeds max_msg_sz {max}")
            }
            Cause::AtomicLength { length } => {
                write!(f, "atomic operand buffer is {length} bytes, not 8")
            }
            Cause::AtomicMisaligned { remote_addr } => {
                write!(
                    f,
                    "atomic remote address {remote_addr:#x} is not 8-byte aligned"
                )
            }
            Cause::HasSrq => f.write_str("the QP uses an SRQ; post to the SRQ instead"),
            Cause::CqOverrun { capacity } => {
                write!(
                    f,
                    "CQ overrun: all {capacity} CQEs are unpolled; the CQ is in error"
                )
            }
            #[cfg(feature = "std")]
            Cause::Os { errno } => write!(f, "{}", std::io::Error::from_raw_os_error(*errno)),
            #[cfg(not(feature = "std"))]
            Cause::Os { errno } => write!(f, "errno {errno}"),
        }
    }
}

/// Writes the names of the bits of a [`QpAttrMask`] as `AV|PATH_MTU` (unknown bits in hex).
struct MaskNames(QpAttrMask);

impl fmt::Display for MaskNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, _) in self.0.iter_names() {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
        }
        let unknown = self.0.bits() & !QpAttrMask::all().bits();
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
            first = false;
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

/// A failed verb: which operation, on which object, and why.
///
/// Object ids are the handle index for PDs, CQs, SRQs and AHs, the QPN for QPs and the lkey for
/// MRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsError {
    /// ibv_query_port(3), ibv_query_gid(3), ibv_query_pkey(3) on a port or table index.
    QueryPort {
        /// The 1-based port number.
        port: u8,
        /// Why it failed.
        cause: Cause,
    },
    /// Adding or removing a GID table entry (done by the link layer, as the kernel's GID cache).
    ModifyGid {
        /// The 1-based port number.
        port: u8,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_alloc_pd(3).
    AllocPd {
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_dealloc_pd(3).
    DeallocPd {
        /// The PD index.
        pd: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_reg_mr(3) / ibv_reg_mr_iova(3).
    RegMr {
        /// The PD index.
        pd: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_dereg_mr(3).
    DeregMr {
        /// The lkey given.
        lkey: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_create_cq(3).
    CreateCq {
        /// The number of CQEs requested.
        cqe: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_resize_cq(3).
    ResizeCq {
        /// The CQ index.
        cq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_destroy_cq(3).
    DestroyCq {
        /// The CQ index.
        cq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_poll_cq(3) / ibv_req_notify_cq(3) on an unknown CQ.
    PollCq {
        /// The CQ index.
        cq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// The HCA could not queue a completion (CQ overrun). Never silent: the CQ goes to error and a
    /// `CQ_ERR` async event is recorded.
    PushCompletion {
        /// The CQ index.
        cq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_create_srq(3).
    CreateSrq {
        /// The PD index.
        pd: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_modify_srq(3) / ibv_query_srq(3).
    ModifySrq {
        /// The SRQ index.
        srq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_destroy_srq(3).
    DestroySrq {
        /// The SRQ index.
        srq: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_post_srq_recv(3).
    PostSrqRecv {
        /// The SRQ index.
        srq: u32,
        /// The `wr_id` of the rejected WR.
        wr_id: u64,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_create_ah(3).
    CreateAh {
        /// The PD index.
        pd: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_destroy_ah(3).
    DestroyAh {
        /// The AH index.
        ah: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_create_qp(3).
    CreateQp {
        /// The PD index.
        pd: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_modify_qp(3), or a state change made by the HCA itself.
    ModifyQp {
        /// The QPN.
        qpn: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_query_qp(3).
    QueryQp {
        /// The QPN.
        qpn: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_destroy_qp(3).
    DestroyQp {
        /// The QPN.
        qpn: u32,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_post_send(3): the WR was rejected before anything was queued.
    PostSend {
        /// The QPN.
        qpn: u32,
        /// The `wr_id` of the rejected WR.
        wr_id: u64,
        /// Why it failed.
        cause: Cause,
    },
    /// ibv_post_recv(3): the WR was rejected before anything was queued.
    PostRecv {
        /// The QPN.
        qpn: u32,
        /// The `wr_id` of the rejected WR.
        wr_id: u64,
        /// Why it failed.
        cause: Cause,
    },
}

impl VerbsError {
    /// What was wrong.
    pub fn cause(&self) -> Cause {
        match *self {
            VerbsError::QueryPort { cause, .. }
            | VerbsError::ModifyGid { cause, .. }
            | VerbsError::AllocPd { cause }
            | VerbsError::DeallocPd { cause, .. }
            | VerbsError::RegMr { cause, .. }
            | VerbsError::DeregMr { cause, .. }
            | VerbsError::CreateCq { cause, .. }
            | VerbsError::ResizeCq { cause, .. }
            | VerbsError::DestroyCq { cause, .. }
            | VerbsError::PollCq { cause, .. }
            | VerbsError::PushCompletion { cause, .. }
            | VerbsError::CreateSrq { cause, .. }
            | VerbsError::ModifySrq { cause, .. }
            | VerbsError::DestroySrq { cause, .. }
            | VerbsError::PostSrqRecv { cause, .. }
            | VerbsError::CreateAh { cause, .. }
            | VerbsError::DestroyAh { cause, .. }
            | VerbsError::CreateQp { cause, .. }
            | VerbsError::ModifyQp { cause, .. }
            | VerbsError::QueryQp { cause, .. }
            | VerbsError::DestroyQp { cause, .. }
            | VerbsError::PostSend { cause, .. }
            | VerbsError::PostRecv { cause, .. } => cause,
        }
    }

    /// The positive errno libibverbs would report (`errno` for calls returning a pointer, the
    /// return value for calls returning `int`).
    pub fn errno(&self) -> i32 {
        self.cause().errno()
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::QueryPort { port, cause } => write!(f, "query port {port}: {cause}"),
            VerbsError::ModifyGid { port, cause } => {
                write!(f, "GID table of port {port}: {cause}")
            }
            VerbsError::AllocPd { cause } => write!(f, "alloc_pd: {cause}"),
            VerbsError::DeallocPd { pd, cause } => write!(f, "dealloc_pd on PD {pd}: {cause}"),
            VerbsError::RegMr { pd, cause } => write!(f, "reg_mr in PD {pd}: {cause}"),
            VerbsError::DeregMr { lkey, cause } => {
                write!(f, "dereg_mr on lkey {lkey:#010x}: {cause}")
            }
            VerbsError::CreateCq { cqe, cause } => {
                write!(f, "create_cq with {cqe} CQEs: {cause}")
            }
            VerbsError::ResizeCq { cq, cause } => write!(f, "resize_cq on CQ {cq}: {cause}"),
            VerbsError::DestroyCq { cq, cause } => write!(f, "destroy_cq on CQ {cq}: {cause}"),
            VerbsError::PollCq { cq, cause } => write!(f, "poll_cq on CQ {cq}: {cause}"),
            VerbsError::PushCompletion { cq, cause } => {
                write!(f, "completion to CQ {cq}: {cause}")
            }
            VerbsError::CreateSrq { pd, cause } => write!(f, "create_srq in PD {pd}: {cause}"),
            VerbsError::ModifySrq { srq, cause } => {
                write!(f, "modify_srq on SRQ {srq}: {cause}")
            }
            VerbsError::DestroySrq { srq, cause } => {
                write!(f, "destroy_srq on SRQ {srq}: {cause}")
            }
            VerbsError::PostSrqRecv { srq, wr_id, cause } => {
                write!(f, "post_srq_recv on SRQ {srq}, wr_id {wr_id:#x}: {cause}")
            }
            VerbsError::CreateAh { pd, cause } => write!(f, "create_ah in PD {pd}: {cause}"),
            VerbsError::DestroyAh { ah, cause } => write!(f, "destroy_ah on AH {ah}: {cause}"),
            VerbsError::CreateQp { pd, cause } => write!(f, "create_qp in PD {pd}: {cause}"),
            VerbsError::ModifyQp { qpn, cause } => {
                write!(f, "modify_qp on QPN {qpn:#x}: {cause}")
            }
            VerbsError::QueryQp { qpn, cause } => write!(f, "query_qp on QPN {qpn:#x}: {cause}"),
            VerbsError::DestroyQp { qpn, cause } => {
                write!(f, "destroy_qp on QPN {qpn:#x}: {cause}")
            }
            VerbsError::PostSend { qpn, wr_id, cause } => {
                write!(f, "post_send on QPN {qpn:#x}, wr_id {wr_id:#x}: {cause}")
            }
            VerbsError::PostRecv { qpn, wr_id, cause } => {
                write!(f, "post_recv on QPN {qpn:#x}, wr_id {wr_id:#x}: {cause}")
            }
        }
    }
}

impl core::error::Error for VerbsError {}

/// Why a memory-key check failed; see [`crate::verbs::mr::MrTable::check_lkey`] and
/// [`crate::verbs::mr::MrTable::check_rkey`].
///
/// The kinds follow the order rxe checks them in (`lookup_mr`, then `mr_check_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyErrorKind {
    /// No registered MR has this key: never registered, deregistered, or an old key of a
    /// re-registered index (the low 8 bits differ).
    UnknownKey,
    /// The MR's keys were invalidated (LOCAL_INV, SEND with Invalidate; IBTA vol. 1 §10.6.5).
    Invalidated,
    /// The MR belongs to another protection domain than the QP using it.
    WrongPd {
        /// Index of the QP's PD.
        expected: u32,
        /// Index of the MR's PD.
        found: u32,
    },
    /// The MR does not grant the access the operation needs (e.g. RDMA WRITE into an MR without
    /// REMOTE_WRITE, a receive buffer without LOCAL_WRITE, any remote access through an MR that was
    /// registered without remote access and so has no rkey).
    AccessDenied {
        /// The access the operation needs.
        needed: AccessFlags,
        /// The access the MR grants.
        granted: AccessFlags,
    },
    /// `[iova, iova + length)` is not inside the MR.
    OutOfBounds {
        /// First byte accessed (I/O virtual address).
        iova: u64,
        /// Bytes accessed.
        length: u64,
    },
}

/// A failed memory-key check: the key and what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyError {
    /// The lkey or rkey that was checked.
    pub key: u32,
    /// What was wrong.
    pub kind: KeyErrorKind,
}

impl KeyError {
    /// The completion status for a failed local (lkey) check of a send-queue WR: every kind is
    /// `IBV_WC_LOC_PROT_ERR` (rxe requester `copy_data` failure; ibv_poll_cq(3) "local protection
    /// error").
    pub fn local_wc_status(&self) -> WcStatus {
        WcStatus::LocProtErr
    }

    /// The completion status the requester reports when the responder NAKs a failed rkey check:
    /// `IBV_WC_REM_ACCESS_ERR` (AETH NAK code "remote access error", IBTA vol. 1 ch. 9).
    pub fn remote_wc_status(&self) -> WcStatus {
        WcStatus::RemAccessErr
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key;
        match self.kind {
            KeyErrorKind::UnknownKey => write!(f, "key {key:#010x} names no registered MR"),
            KeyErrorKind::Invalidated => write!(f, "key {key:#010x} was invalidated"),
            KeyErrorKind::WrongPd { expected, found } => write!(
                f,
                "key {key:#010x}: MR is in PD {found}, the QP in PD {expected}"
            ),
            KeyErrorKind::AccessDenied { needed, granted } => write!(
                f,
                "key {key:#010x}: MR grants access {:#x}, the operation needs {:#x}",
                granted.bits(),
                needed.bits()
            ),
            KeyErrorKind::OutOfBounds { iova, length } => write!(
                f,
                "key {key:#010x}: {length} bytes at {iova:#x} fall outside the MR"
            ),
        }
    }
}

impl core::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn errno_follows_libibverbs() {
        assert_eq!(Cause::InUse { users: 1 }.errno(), errno::EBUSY);
        assert_eq!(Cause::QueueFull { max_wr: 1 }.errno(), errno::ENOMEM);
        assert_eq!(
            Cause::TooManyObjects {
                object: Object::Qp,
                max: 1
            }
            .errno(),
            errno::ENOMEM
        );
        assert_eq!(Cause::HasSrq.errno(), errno::EINVAL);
        assert_eq!(Cause::CqOverrun { capacity: 1 }.errno(), errno::EBUSY);
        let e = VerbsError::PostSend {
            qpn: 0x11,
            wr_id: 7,
            cause: Cause::TooManySge {
                num_sge: 33,
                max_sge: 32,
            },
        };
        assert_eq!(e.errno(), errno::EINVAL);
    }

    #[test]
    fn display_names_operation_object_and_attribute() {
        let e = VerbsError::ModifyQp {
            qpn: 0x12,
            cause: Cause::MissingAttributes {
                qp_type: QpType::Rc,
                from: QpState::Init,
                to: QpState::Rtr,
                missing: QpAttrMask::AV | QpAttrMask::PATH_MTU,
            },
        };
        let s = format!("{e}");
        assert!(s.contains("modify_qp on QPN 0x12"), "{s}");
        assert!(s.contains("INIT->RTR"), "{s}");
        assert!(s.contains("AV|PATH_MTU"), "{s}");
        let s = format!(
            "{}",
            Cause::OutOfRange {
                attr: "retry_cnt",
                value: 8,
                max: 7
            }
        );
        assert!(s.contains("retry_cnt = 8"), "{s}");
        let s = format!(
            "{}",
            Cause::DisallowedAttributes {
                qp_type: QpType::Ud,
                from: QpState::Reset,
                to: QpState::Init,
                extra: QpAttrMask::from_bits_retain(1 << 30),
            }
        );
        assert!(s.contains("0x40000000"), "{s}");
    }

    #[test]
    fn key_error_maps_to_wc_status() {
        let e = KeyError {
            key: 0x105,
            kind: KeyErrorKind::UnknownKey,
        };
        assert_eq!(e.local_wc_status(), WcStatus::LocProtErr);
        assert_eq!(e.remote_wc_status(), WcStatus::RemAccessErr);
        assert!(format!("{e}").contains("0x00000105"));
    }
}
