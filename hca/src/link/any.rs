//! [`AnyLink`]: a link chosen at run time ([`DeviceSpec`](crate::open::DeviceSpec)), for programs such as
//! the tools whose `--link` picks the UDP socket, a VFIO NIC or an AF_XDP socket. Each method dispatches once per
//! call (a batch), by a `match`; the per-packet work inside runs in the chosen link's own
//! monomorphized code. Programs that know their link use `SoftDevice<UdpLink>` or
//! `SoftDevice<VfioLink>` directly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Datagram, Instant, SoftHca};
use crate::verbs::device::Device;

use super::udp::{LinkCounters, LinkPoller};
use super::vfio::{VfioError, VfioLink, VfioLinkCounters, VfioPoller};
use super::xdp::{XdpError, XdpLink, XdpLinkCounters, XdpPoller};
use super::{FlushReport, Link, LinkError, LinkWait, RecvState, UdpLink, Waker};

/// One of the links (see the [module docs](self)).
// One per device, inside its lock: the size of the larger variant costs nothing, a box would
// cost a pointer chase per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AnyLink {
    /// A kernel UDP socket.
    Udp(UdpLink),
    /// A virtio-net NIC driven through VFIO.
    Vfio(VfioLink),
    /// An AF_XDP socket on a kernel NIC.
    Xdp(XdpLink),
}

/// The poller of an [`AnyLink`].
#[derive(Debug)]
pub enum AnyPoller {
    /// Of a UDP socket.
    Udp(LinkPoller),
    /// Of a VFIO NIC.
    Vfio(VfioPoller),
    /// Of an AF_XDP socket.
    Xdp(XdpPoller),
}

/// The counters of an [`AnyLink`].
#[derive(Debug, Clone, Copy)]
pub enum AnyCounters {
    /// Of a UDP socket.
    Udp(LinkCounters),
    /// Of a VFIO NIC.
    Vfio(VfioLinkCounters),
    /// Of an AF_XDP socket.
    Xdp(XdpLinkCounters),
}

/// The error of an [`AnyLink`]: its UDP socket's or its VFIO NIC's. `Display` is the link's own.
#[derive(Debug)]
pub enum AnyLinkError {
    /// Of a UDP socket.
    Udp(LinkError),
    /// Of a VFIO NIC.
    Vfio(VfioError),
    /// Of an AF_XDP socket.
    Xdp(XdpError),
}

impl std::fmt::Display for AnyLinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyLinkError::Udp(e) => e.fmt(f),
            AnyLinkError::Vfio(e) => e.fmt(f),
            AnyLinkError::Xdp(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AnyLinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AnyLinkError::Udp(e) => e.source(),
            AnyLinkError::Vfio(e) => e.source(),
            AnyLinkError::Xdp(e) => e.source(),
        }
    }
}

impl From<LinkError> for AnyLinkError {
    fn from(e: LinkError) -> Self {
        AnyLinkError::Udp(e)
    }
}

impl From<XdpError> for AnyLinkError {
    fn from(e: XdpError) -> Self {
        AnyLinkError::Xdp(e)
    }
}

impl From<VfioError> for AnyLinkError {
    fn from(e: VfioError) -> Self {
        AnyLinkError::Vfio(e)
    }
}

impl LinkWait for AnyPoller {
    type Error = AnyLinkError;

    fn wait(&self, writable: bool, waker: &Waker, timeout: Duration) -> Result<(), AnyLinkError> {
        match self {
            AnyPoller::Udp(p) => LinkWait::wait(p, writable, waker, timeout).map_err(Into::into),
            AnyPoller::Vfio(p) => LinkWait::wait(p, writable, waker, timeout).map_err(Into::into),
            AnyPoller::Xdp(p) => LinkWait::wait(p, writable, waker, timeout).map_err(Into::into),
        }
    }
}

/// Converts a [`FlushReport`]'s error.
fn report<E: Into<AnyLinkError>>(r: FlushReport<E>) -> FlushReport<AnyLinkError> {
    FlushReport {
        dropped: r.dropped,
        blocked: r.blocked,
        error: r.error.map(Into::into),
    }
}

impl Link for AnyLink {
    type Error = AnyLinkError;
    type Poller = AnyPoller;
    type Counters = AnyCounters;

    fn name(&self) -> String {
        match self {
            AnyLink::Udp(l) => l.name(),
            AnyLink::Vfio(l) => Link::name(l),
            AnyLink::Xdp(l) => Link::name(l),
        }
    }

    fn local_addr(&self) -> SocketAddr {
        match self {
            AnyLink::Udp(l) => l.local_addr(),
            AnyLink::Vfio(l) => Link::local_addr(l),
            AnyLink::Xdp(l) => Link::local_addr(l),
        }
    }

    fn device(&self) -> Device {
        match self {
            AnyLink::Udp(l) => l.device(),
            AnyLink::Vfio(l) => Link::device(l),
            AnyLink::Xdp(l) => Link::device(l),
        }
    }

    fn mtu(&self) -> u32 {
        match self {
            AnyLink::Udp(l) => l.mtu(),
            AnyLink::Vfio(l) => Link::mtu(l),
            AnyLink::Xdp(l) => Link::mtu(l),
        }
    }

    fn counters(&self) -> AnyCounters {
        match self {
            AnyLink::Udp(l) => AnyCounters::Udp(l.counters()),
            AnyLink::Vfio(l) => AnyCounters::Vfio(Link::counters(l)),
            AnyLink::Xdp(l) => AnyCounters::Xdp(Link::counters(l)),
        }
    }

    fn recv(&mut self, idle: bool) -> Result<RecvState, AnyLinkError> {
        match self {
            AnyLink::Udp(l) => l.recv(idle).map_err(Into::into),
            AnyLink::Vfio(l) => l.recv(idle).map_err(Into::into),
            AnyLink::Xdp(l) => l.recv(idle).map_err(Into::into),
        }
    }

    fn deliver<F: FnMut(&Datagram<'_>)>(&mut self, f: F) -> Result<usize, AnyLinkError> {
        match self {
            AnyLink::Udp(l) => l.deliver(f).map_err(Into::into),
            AnyLink::Vfio(l) => l.deliver(f).map_err(Into::into),
            AnyLink::Xdp(l) => l.deliver(f).map_err(Into::into),
        }
    }

    fn rx_full(&self, delivered: usize) -> bool {
        match self {
            AnyLink::Udp(l) => l.rx_full(delivered),
            AnyLink::Vfio(l) => l.rx_full(delivered),
            AnyLink::Xdp(l) => l.rx_full(delivered),
        }
    }

    fn build(&mut self, engine: &mut SoftHca, now: Instant) -> (usize, bool) {
        match self {
            AnyLink::Udp(l) => l.build(engine, now),
            AnyLink::Vfio(l) => l.build(engine, now),
            AnyLink::Xdp(l) => l.build(engine, now),
        }
    }

    fn unsent(&self) -> usize {
        match self {
            AnyLink::Udp(l) => l.unsent(),
            AnyLink::Vfio(l) => l.unsent(),
            AnyLink::Xdp(l) => l.unsent(),
        }
    }

    fn flush(&mut self) -> FlushReport<AnyLinkError> {
        match self {
            AnyLink::Udp(l) => report(l.flush()),
            AnyLink::Vfio(l) => report(Link::flush(l)),
            AnyLink::Xdp(l) => report(Link::flush(l)),
        }
    }

    fn poller(&self) -> Result<AnyPoller, AnyLinkError> {
        match self {
            AnyLink::Udp(l) => l.poller().map(AnyPoller::Udp).map_err(Into::into),
            AnyLink::Vfio(l) => l.poller().map(AnyPoller::Vfio).map_err(Into::into),
            AnyLink::Xdp(l) => l.poller().map(AnyPoller::Xdp).map_err(Into::into),
        }
    }

    const ARMS_WAKEUP: bool = true;

    fn arm_wakeup(&mut self) -> bool {
        match self {
            AnyLink::Udp(l) => l.arm_wakeup(),
            AnyLink::Vfio(l) => l.arm_wakeup(),
            AnyLink::Xdp(l) => l.arm_wakeup(),
        }
    }

    fn spin_rounds(&self) -> u32 {
        match self {
            AnyLink::Udp(l) => l.spin_rounds(),
            AnyLink::Vfio(l) => l.spin_rounds(),
            AnyLink::Xdp(l) => l.spin_rounds(),
        }
    }

    fn quiet_rounds_ok(&self) -> bool {
        match self {
            AnyLink::Udp(l) => l.quiet_rounds_ok(),
            AnyLink::Vfio(l) => l.quiet_rounds_ok(),
            AnyLink::Xdp(l) => l.quiet_rounds_ok(),
        }
    }

    fn next_timer(&self) -> Option<Duration> {
        match self {
            AnyLink::Udp(l) => l.next_timer(),
            AnyLink::Vfio(l) => l.next_timer(),
            AnyLink::Xdp(l) => l.next_timer(),
        }
    }

    const MAPS_MEMORY: bool = true;

    fn map_memory(
        &mut self,
        lkey: u32,
        memory: &Arc<dyn gpu_p2p::Memory>,
        offset: usize,
        len: usize,
    ) -> Result<(), AnyLinkError> {
        match self {
            AnyLink::Udp(l) => l.map_memory(lkey, memory, offset, len).map_err(Into::into),
            AnyLink::Vfio(l) => l.map_memory(lkey, memory, offset, len).map_err(Into::into),
            AnyLink::Xdp(l) => l.map_memory(lkey, memory, offset, len).map_err(Into::into),
        }
    }

    fn unmap_memory(&mut self, lkey: u32) -> Result<Option<(u64, u64)>, AnyLinkError> {
        match self {
            AnyLink::Udp(l) => l.unmap_memory(lkey).map_err(Into::into),
            AnyLink::Vfio(l) => l.unmap_memory(lkey).map_err(Into::into),
            AnyLink::Xdp(l) => l.unmap_memory(lkey).map_err(Into::into),
        }
    }
}
