//! Links: what carries the software HCA's packets between its transport engine and the network.
//!
//! The transport engine (`crate::engine`) is sans-I/O: it consumes received UDP payloads with their
//! IP metadata and produces UDP payloads to send. A **link** moves those payloads:
//! * [`udp`]: a kernel UDP socket on port 4791 (RoCEv2 over the host's IP stack, interoperable
//!   with Linux rxe), with batched I/O, GSO/GRO, ECN and zero-copy gather; [`udp::UdpLink`] is
//!   that socket with the receive batches and transmit slots a device drives;
//! * [`vfio`]: a virtio-net NIC this process drives itself through VFIO (kernel bypass);
//! * [`xdp`]: an AF_XDP socket on a NIC the kernel keeps, fed by an XDP program that steers
//!   RoCEv2 to it (kernel bypass for RoCEv2 only);
//! * [`any`]: one of those, chosen at run time;
//! * [`wake`]: waking a progress thread blocked in [`udp::RoceSocket::wait`].
//!
//! [`Link`] is what the device's progress engine
//! ([`SoftDevice`](crate::soft::SoftDevice)) needs from a link, so that one engine, one
//! progress thread and one verbs API run over either. Links know nothing of devices: the
//! software device over a link is [`crate::soft`], opening one from its name [`crate::open`].
//!
//! All system calls are in one private `sys` module, the only place with `unsafe` code.

#[cfg(all(feature = "std", target_os = "linux"))]
pub mod any;
pub mod error;
pub(crate) mod sys;
pub mod udp;
#[cfg(all(feature = "std", target_os = "linux"))]
pub mod vfio;
pub mod wake;
#[cfg(all(feature = "std", target_os = "linux"))]
pub mod xdp;

use std::fmt;
use std::time::Duration;

use crate::engine::{Datagram, Instant, SoftHca};
use crate::verbs::device::Device;

#[cfg(all(feature = "std", target_os = "linux"))]
pub use any::AnyLink;
pub use error::LinkError;
pub use udp::{
    LinkCounters, LinkPoller, Offloads, Readiness, RecvBatch, RecvDatagram, RoceSocket,
    RoceSocketConfig, SendDatagram, UdpLink,
};
pub use wake::Waker;

/// What [`Link::recv`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvState {
    /// Datagrams (or frames) waiting for [`Link::deliver`].
    pub waiting: usize,
}

/// What [`Link::flush`] did.
#[derive(Debug)]
pub struct FlushReport<E> {
    /// Packets the link refused for good (dropped and counted; the transport recovers as from a
    /// loss).
    pub dropped: u64,
    /// Times the link's send buffer or ring was full (the rest waits for the next flush).
    pub blocked: u64,
    /// The last error behind a drop.
    pub error: Option<E>,
}

impl<E> Default for FlushReport<E> {
    fn default() -> Self {
        FlushReport {
            dropped: 0,
            blocked: 0,
            error: None,
        }
    }
}

/// What the progress engine of a software device needs from a link: receive a batch, hand it
/// to the engine, let the engine build a batch into the link's buffers, send it, and sleep
/// until there is more. The device calls every method with the link's lock held (one caller at a
/// time) and takes the engine lock only inside [`Link::deliver`] and [`Link::build`], never
/// across [`Link::recv`] or [`Link::flush`], which may make system calls.
///
/// The device is generic over its link (monomorphized: no dynamic dispatch per packet), and
/// implementations keep their buffers preallocated: nothing on this path allocates.
pub trait Link: Send + 'static {
    /// The link's error (its `Display` names the link and what failed).
    type Error: std::error::Error + Send + Sync + 'static;
    /// What a sleeping progress thread waits on without holding the link (see [`LinkWait`]).
    type Poller: LinkWait<Error = Self::Error> + Send + Sync + 'static;
    /// The link's own counters.
    type Counters: Copy + fmt::Debug + Send;

    /// A name for messages: `udp:ADDRESS:PORT`, `vfio:PCI_ADDRESS`.
    fn name(&self) -> String;

    /// The IP address and UDP port the link's RoCEv2 packets leave from (its GID's address).
    fn local_addr(&self) -> std::net::SocketAddr;

    /// The verbs device this link is: node GUID, port attributes with the active MTU the link's
    /// IP MTU allows, and the GID table of its addresses (IBTA vol. 1 Annex A17.4.1: one RoCEv2
    /// GID per IP address).
    fn device(&self) -> Device;

    /// The largest IP packet the link sends, bytes (the interface MTU).
    fn mtu(&self) -> u32;

    /// The link's counters.
    fn counters(&self) -> Self::Counters;

    /// Receives a batch from the network into the link's own buffers (system calls here; the
    /// engine lock is not held). `idle`: the caller's last round received nothing, so a small
    /// batch is enough.
    ///
    /// # Errors
    /// The link's receive error (the device counts it and keeps going).
    fn recv(&mut self, idle: bool) -> Result<RecvState, Self::Error>;

    /// Hands what [`Link::recv`] found to `f` (the engine's `handle_datagram`, under the engine
    /// lock) and returns how many datagrams were handed over. Packets for the link itself (ARP,
    /// Neighbor Discovery) are answered here.
    ///
    /// # Errors
    /// A device failure (the device counts it and keeps going).
    fn deliver<F: FnMut(&Datagram<'_>)>(&mut self, f: F) -> Result<usize, Self::Error>;

    /// Whether the last [`Link::deliver`] took a whole batch (more is probably waiting).
    fn rx_full(&self, delivered: usize) -> bool;

    /// Builds up to a batch of packets from `engine` (under the engine lock; `now` its clock)
    /// into the link's buffers: `SoftHca::poll_transmit_gather` where the link can send payload
    /// straight from MR memory, `SoftHca::poll_transmit` otherwise. Returns the packets built
    /// and whether every buffer was used (the engine probably has more). Built packets are sent
    /// by [`Link::flush`].
    fn build(&mut self, engine: &mut SoftHca, now: Instant) -> (usize, bool);

    /// Built packets not sent yet (waiting for room in a socket buffer or ring).
    fn unsent(&self) -> usize;

    /// Sends the built packets, as far as the link takes them.
    fn flush(&mut self) -> FlushReport<Self::Error>;

    /// A handle a progress thread sleeps on while other threads use the link.
    ///
    /// # Errors
    /// Out of descriptors.
    fn poller(&self) -> Result<Self::Poller, Self::Error>;

    /// Called with the link's lock held just before the progress thread sleeps: asks the device
    /// for a wake-up (an interrupt) and returns `false` if input is already waiting (then the
    /// thread does not sleep). Links whose poller sees input by itself (a socket) keep the
    /// default.
    fn arm_wakeup(&mut self) -> bool {
        true
    }

    /// Whether the link wants [`Link::arm_wakeup`] called (a socket does not: its poller sees
    /// input by itself, and the link's lock is then not taken before a sleep).
    const ARMS_WAKEUP: bool = false;

    /// Idle rounds a progress thread runs (yielding the CPU between them) before it sleeps: a
    /// busy-polled NIC has nothing to sleep on, a socket does.
    fn spin_rounds(&self) -> u32 {
        0
    }

    /// Whether a caller's round that received nothing may skip the engine while nothing changed
    /// since a round that left it with nothing to do (`hca::soft::progress`, issue 21): the
    /// link does nothing of its own in [`Link::build`] or on a clock. A socket qualifies; links
    /// that drive a device of their own (rings to refill or reap, neighbour resolution) keep
    /// the default, a full round per poll.
    fn quiet_rounds_ok(&self) -> bool {
        false
    }

    /// Until when the link's own timers (neighbour resolution) need a round, from now.
    fn next_timer(&self) -> Option<Duration> {
        None
    }

    /// Called after the engine registered memory region `lkey` over bytes
    /// `[offset, offset + len)` of `memory`: a link whose device reads registered memory by DMA
    /// maps the pages of those bytes into its IOMMU here (when the memory has a host address,
    /// [`gpu_p2p::Memory::host_ptr`]; other memory is sent by copy), until
    /// [`Link::unmap_memory`].
    ///
    /// # Errors
    /// The mapping failed (the device then deregisters the region).
    fn map_memory(
        &mut self,
        lkey: u32,
        memory: &std::sync::Arc<dyn gpu_p2p::Memory>,
        offset: usize,
        len: usize,
    ) -> Result<(), Self::Error> {
        let _ = (lkey, memory, offset, len);
        Ok(())
    }

    /// Called after the engine deregistered region `lkey`: waits (bounded) until the device no
    /// longer reads it and removes its mapping. Returns the device address range `(iova, len)`
    /// unmapped, `None` when nothing was mapped.
    ///
    /// # Errors
    /// The device kept reading, or the unmap failed.
    fn unmap_memory(&mut self, lkey: u32) -> Result<Option<(u64, u64)>, Self::Error> {
        let _ = lkey;
        Ok(None)
    }

    /// Whether [`Link::map_memory`] does anything (otherwise memory registration does not take
    /// the link's lock).
    const MAPS_MEMORY: bool = false;
}

/// What a progress thread sleeps on: the link's input (a socket, an interrupt eventfd) and a
/// [`Waker`].
pub trait LinkWait {
    /// The link's error.
    type Error;

    /// Sleeps until input may be waiting, `waker` was woken (it is reset), or `timeout` passed.
    /// `writable`: also wake when the link can take more output.
    ///
    /// # Errors
    /// poll(2) failed.
    fn wait(&self, writable: bool, waker: &Waker, timeout: Duration) -> Result<(), Self::Error>;
}

impl LinkWait for LinkPoller {
    type Error = LinkError;

    fn wait(&self, writable: bool, waker: &Waker, timeout: Duration) -> Result<(), LinkError> {
        LinkPoller::wait(self, writable, Some(waker), timeout).map(|_| ())
    }
}
