//! [`AnyDevice`]: the software device on a link chosen at run time (the tools' `--link`):
//! [`AnyLink`] over a UDP socket or a VFIO NIC, opened from an [`AnyConfig`].

use crate::link::any::AnyLink;
use crate::link::udp::Offloads;
use crate::verbs::api::DeviceError;

use super::udp::{open_udp_link, UdpDeviceConfig};
use super::vfio::VfioDeviceConfig;
use super::xdp::XdpDeviceConfig;
use super::{lock, SoftDevice, SoftLink};

/// How to open an [`AnyDevice`]: the configuration of a UDP device or of a VFIO device.
#[derive(Debug, Clone)]
pub enum AnyConfig {
    /// A device on a kernel UDP socket ([`super::UdpDevice::open`]).
    Udp(UdpDeviceConfig),
    /// A device on a virtio-net NIC driven through VFIO ([`super::VfioDevice::open`]).
    Vfio(VfioDeviceConfig),
    /// A device on an AF_XDP socket ([`super::XdpDevice::open`]).
    Xdp(XdpDeviceConfig),
}

impl SoftLink for AnyLink {
    type DeviceConfig = AnyConfig;

    fn set_peer_port(&mut self, ip: std::net::IpAddr, port: u16) -> bool {
        match self {
            AnyLink::Udp(l) => SoftLink::set_peer_port(l, ip, port),
            AnyLink::Xdp(l) => SoftLink::set_peer_port(l, ip, port),
            AnyLink::Vfio(_) => false,
        }
    }

    fn udp_port(&self) -> Option<u16> {
        match self {
            AnyLink::Udp(l) => SoftLink::udp_port(l),
            AnyLink::Xdp(l) => SoftLink::udp_port(l),
            AnyLink::Vfio(_) => None,
        }
    }

    fn shared_slot(&self) -> Option<(std::net::SocketAddr, usize)> {
        match self {
            AnyLink::Udp(l) => SoftLink::shared_slot(l),
            _ => None,
        }
    }

    fn alloc_memory(
        &self,
        len: usize,
    ) -> Option<Result<std::sync::Arc<dyn gpu_p2p::Memory>, DeviceError>> {
        match self {
            AnyLink::Xdp(l) => SoftLink::alloc_memory(l, len),
            AnyLink::Udp(_) | AnyLink::Vfio(_) => None,
        }
    }
}

/// A software RoCEv2 device on a link chosen at run time ([`AnyLink`]: the tools' `--link`).
pub type AnyDevice = SoftDevice<crate::link::AnyLink>;

impl AnyDevice {
    /// Opens a UDP device ([`super::UdpDevice::open`]) or a VFIO device ([`super::VfioDevice::open`]).
    ///
    /// # Errors
    /// As those.
    pub fn open(config: AnyConfig) -> Result<AnyDevice, DeviceError> {
        match config {
            AnyConfig::Udp(c) => {
                let (io, engine_config, window_budget) = open_udp_link(&c)?;
                let progress = c.progress;
                SoftDevice::with_link(
                    AnyLink::Udp(io),
                    AnyConfig::Udp(c),
                    engine_config,
                    progress,
                    Some(window_budget),
                )
            }
            AnyConfig::Vfio(c) => {
                let link = crate::link::vfio::VfioLink::open(&c.link)?;
                let engine = c.engine.clone();
                let progress = c.progress;
                SoftDevice::with_link(
                    AnyLink::Vfio(link),
                    AnyConfig::Vfio(c),
                    engine,
                    progress,
                    None,
                )
            }
            AnyConfig::Xdp(c) => {
                let link = crate::link::xdp::XdpLink::open(&c.link)?;
                let engine = c.engine.clone();
                let progress = c.progress;
                SoftDevice::with_link(
                    AnyLink::Xdp(link),
                    AnyConfig::Xdp(c),
                    engine,
                    progress,
                    None,
                )
            }
        }
    }

    /// The UDP link's GSO / GRO state (`None` on a VFIO link).
    pub fn offloads(&self) -> Option<Offloads> {
        match &lock(&self.shared.io).link {
            crate::link::AnyLink::Udp(l) => Some(l.link().offloads()),
            crate::link::AnyLink::Vfio(_) | crate::link::AnyLink::Xdp(_) => None,
        }
    }
}
