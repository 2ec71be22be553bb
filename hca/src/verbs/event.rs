//! Asynchronous events: what ibv_get_async_event(3) returns.
//!
//! Some things happen outside any work request: a CQ overruns, a QP hits a fatal error, an SQD
//! QP finishes draining, an SRQ drops below its limit, a port goes down, the GID table changes.
//! The HCA records each as an [`AsyncEvent`] naming the affected element; the program reads them
//! in order (IBTA vol. 1 ch. 11, ibv_get_async_event(3)).

use core::fmt;

use crate::verbs::cq::CqHandle;
use crate::verbs::srq::SrqHandle;

/// Async event types (`enum ibv_event_type`; discriminants are the ibv values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AsyncEventType {
    /// CQ overrun (`IBV_EVENT_CQ_ERR`).
    CqErr = 0,
    /// Local work queue catastrophic error (`IBV_EVENT_QP_FATAL`).
    QpFatal = 1,
    /// Invalid request local work queue error (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr = 2,
    /// Local access violation work queue error (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr = 3,
    /// Communication established: first packet received in RTR (`IBV_EVENT_COMM_EST`).
    CommEst = 4,
    /// Send queue drained in SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained = 5,
    /// Path migrated (`IBV_EVENT_PATH_MIG`).
    PathMig = 6,
    /// Path migration request error (`IBV_EVENT_PATH_MIG_ERR`).
    PathMigErr = 7,
    /// Local catastrophic error (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal = 8,
    /// Port active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive = 9,
    /// Port error (`IBV_EVENT_PORT_ERR`).
    PortErr = 10,
    /// LID change (`IBV_EVENT_LID_CHANGE`).
    LidChange = 11,
    /// P_Key change (`IBV_EVENT_PKEY_CHANGE`).
    PkeyChange = 12,
    /// SM change (`IBV_EVENT_SM_CHANGE`).
    SmChange = 13,
    /// SRQ catastrophic error (`IBV_EVENT_SRQ_ERR`).
    SrqErr = 14,
    /// SRQ limit reached (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached = 15,
    /// Last WQE reached on a QP with an SRQ (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached = 16,
    /// Client reregistration (`IBV_EVENT_CLIENT_REREGISTER`).
    ClientReregister = 17,
    /// GID table change (`IBV_EVENT_GID_CHANGE`).
    GidChange = 18,
    /// WQ fatal (`IBV_EVENT_WQ_FATAL`).
    WqFatal = 19,
}

impl AsyncEventType {
    /// Every type, in ibv order.
    pub const ALL: [AsyncEventType; 20] = [
        AsyncEventType::CqErr,
        AsyncEventType::QpFatal,
        AsyncEventType::QpReqErr,
        AsyncEventType::QpAccessErr,
        AsyncEventType::CommEst,
        AsyncEventType::SqDrained,
        AsyncEventType::PathMig,
        AsyncEventType::PathMigErr,
        AsyncEventType::DeviceFatal,
        AsyncEventType::PortActive,
        AsyncEventType::PortErr,
        AsyncEventType::LidChange,
        AsyncEventType::PkeyChange,
        AsyncEventType::SmChange,
        AsyncEventType::SrqErr,
        AsyncEventType::SrqLimitReached,
        AsyncEventType::QpLastWqeReached,
        AsyncEventType::ClientReregister,
        AsyncEventType::GidChange,
        AsyncEventType::WqFatal,
    ];

    /// The type with ibv value `value` (`enum ibv_event_type`), if it is one.
    pub fn from_ibv(value: u32) -> Option<AsyncEventType> {
        AsyncEventType::ALL.get(value as usize).copied()
    }

    /// The text `ibv_event_type_str(3)` gives (rdma-core `libibverbs/enum_strs.c`).
    pub const fn as_str(self) -> &'static str {
        match self {
            AsyncEventType::CqErr => "CQ error",
            AsyncEventType::QpFatal => "local work queue catastrophic error",
            AsyncEventType::QpReqErr => "invalid request local work queue error",
            AsyncEventType::QpAccessErr => "local access violation work queue error",
            AsyncEventType::CommEst => "communication established",
            AsyncEventType::SqDrained => "send queue drained",
            AsyncEventType::PathMig => "path migrated",
            AsyncEventType::PathMigErr => "path migration request error",
            AsyncEventType::DeviceFatal => "local catastrophic error",
            AsyncEventType::PortActive => "port active",
            AsyncEventType::PortErr => "port error",
            AsyncEventType::LidChange => "LID change",
            AsyncEventType::PkeyChange => "P_Key change",
            AsyncEventType::SmChange => "SM change",
            AsyncEventType::SrqErr => "SRQ catastrophic error",
            AsyncEventType::SrqLimitReached => "SRQ limit reached",
            AsyncEventType::QpLastWqeReached => "last WQE reached",
            AsyncEventType::ClientReregister => "client reregistration",
            AsyncEventType::GidChange => "GID table change",
            AsyncEventType::WqFatal => "WQ fatal",
        }
    }
}

impl fmt::Display for AsyncEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The element an async event is about (`ibv_async_event.element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A CQ.
    Cq(CqHandle),
    /// A QP, by QPN.
    Qp(u32),
    /// An SRQ.
    Srq(SrqHandle),
    /// A port, by number.
    Port(u8),
    /// The device.
    Device,
}

/// An asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: AsyncEventType,
    /// To what.
    pub element: EventElement,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.element {
            EventElement::Cq(cq) => write!(f, "{} on CQ {}", self.event_type, cq.index()),
            EventElement::Qp(qpn) => write!(f, "{} on QPN {qpn:#x}", self.event_type),
            EventElement::Srq(srq) => write!(f, "{} on SRQ {}", self.event_type, srq.index()),
            EventElement::Port(p) => write!(f, "{} on port {p}", self.event_type),
            EventElement::Device => write!(f, "{} on the device", self.event_type),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::table::Handle;

    #[test]
    fn values_and_strings() {
        assert_eq!(AsyncEventType::CqErr as u32, 0);
        assert_eq!(AsyncEventType::SrqLimitReached as u32, 15);
        assert_eq!(AsyncEventType::WqFatal as u32, 19);
        assert_eq!(AsyncEventType::SqDrained.as_str(), "send queue drained");
        let e = AsyncEvent {
            event_type: AsyncEventType::CqErr,
            element: EventElement::Cq(Handle::from_raw(3, 0)),
        };
        assert_eq!(std::format!("{e}"), "CQ error on CQ 3");
    }
}
