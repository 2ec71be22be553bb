//! [`XdpDevice`]: the software HCA on an AF_XDP socket ([`crate::link::xdp`]), with the same
//! progress engine and verbs API as the UDP device.
//!
//! The device's GID table is the link's: the IPv6 link-local GID (`fe80::` + the MAC's EUI-64)
//! at indexes 0 (RoCEv1) and 1 (RoCEv2), and the IPv4-mapped GID of the interface's IPv4
//! address at index 2 when it has one, as Linux rxe numbers them.

use std::sync::Arc;

use gpu_p2p::Memory;

use crate::engine::EngineConfig;
use crate::link::xdp::{XdpLink, XdpLinkConfig};

use super::{DeviceError, Progress, SoftDevice, SoftLink};

/// A software RoCEv2 device on an AF_XDP socket.
pub type XdpDevice = SoftDevice<XdpLink>;

/// How to open an [`XdpDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpDeviceConfig {
    /// The interface, queue and modes.
    pub link: XdpLinkConfig,
    /// Who drives the engine. With [`Progress::Thread`] (default) the thread sleeps in poll(2)
    /// on the socket when idle (and spins first with [`XdpLinkConfig::busy_poll`]).
    pub progress: Progress,
    /// Engine tunables.
    pub engine: EngineConfig,
}

impl XdpDeviceConfig {
    /// The defaults for `link`.
    pub fn new(link: XdpLinkConfig) -> XdpDeviceConfig {
        XdpDeviceConfig {
            link,
            progress: Progress::Thread,
            engine: EngineConfig::default(),
        }
    }
}

impl SoftLink for XdpLink {
    type DeviceConfig = XdpDeviceConfig;

    /// The link sends to the RoCEv2 port only: `true` for 4791, `false` for any other.
    fn set_peer_port(&mut self, _ip: std::net::IpAddr, port: u16) -> bool {
        port == super::ROCEV2_PORT
    }

    /// The port the XDP program steers to the link: 4791.
    fn udp_port(&self) -> Option<u16> {
        Some(super::ROCEV2_PORT)
    }

    /// MR memory in the UMEM ([`XdpLink::alloc_mr_memory`]).
    fn alloc_memory(&self, len: usize) -> Option<Result<Arc<dyn Memory>, DeviceError>> {
        Some(self.alloc_mr_memory(len).map_err(DeviceError::from))
    }
}

impl XdpDevice {
    /// Opens the link ([`XdpLink::open`]) and runs the engine over it.
    ///
    /// # Errors
    /// [`DeviceError::Xdp`] naming the interface and the failed step; [`DeviceError::Thread`].
    pub fn open(config: XdpDeviceConfig) -> Result<XdpDevice, DeviceError> {
        let link = XdpLink::open(&config.link)?;
        let engine = config.engine.clone();
        let progress = config.progress;
        SoftDevice::with_link(link, config, engine, progress, None)
    }

    /// `len` bytes of MR memory inside the link's UMEM, which RC requests and RDMA READ
    /// responses leave from without a CPU copy ([`XdpLink::alloc_mr_memory`]).
    ///
    /// # Errors
    /// [`DeviceError::Xdp`] ([`crate::link::xdp::XdpError::UmemFull`]) when the MR arena has no
    /// free run that long, or `len` is 0.
    pub fn alloc_mr_memory(&self, len: usize) -> Result<Arc<dyn Memory>, DeviceError> {
        self.with_link_mut(|l| l.alloc_mr_memory(len))
            .map_err(DeviceError::from)
    }
}
