//! The software device on a kernel UDP socket: [`UdpDevice`], how it is opened
//! ([`UdpDeviceConfig`]) and what it needs of its link (see the [parent module](super) for
//! addresses, GSO and windows).

use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use crate::engine::EngineConfig;
use crate::link::udp::{
    self, DropHook, Offloads, RoceSocket, RoceSocketConfig, UdpLink, MAX_TX_BATCH,
};
use crate::verbs::api::DeviceError;
use crate::verbs::device::PathMtu;

use super::{lock, Progress, SoftDevice, SoftLink, ROCEV2_PORT};

impl SoftLink for UdpLink {
    type DeviceConfig = UdpDeviceConfig;

    fn set_peer_port(&mut self, ip: IpAddr, port: u16) -> bool {
        UdpLink::set_peer_port(self, ip, port);
        true
    }

    fn udp_port(&self) -> Option<u16> {
        Some(self.link().local_addr().port())
    }

    fn shared_slot(&self) -> Option<(std::net::SocketAddr, usize)> {
        let l = self.link();
        l.share_slot().map(|slot| (l.local_addr(), slot))
    }
}

/// How to open a [`UdpDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpDeviceConfig {
    /// The local IP address to bind: the device's GID. Not `0.0.0.0` / `::` (the GID must be an
    /// address of this host).
    pub local: IpAddr,
    /// IPv6 scope (interface index) of a link-local `local` address, also used for link-local
    /// destinations; 0 otherwise.
    pub scope_id: u32,
    /// The UDP port to bind, default [`ROCEV2_PORT`]; 0 picks a free port (tests).
    pub port: u16,
    /// The UDP port peers are sent to unless [`UdpDevice::set_peer_port`] says otherwise, default
    /// [`ROCEV2_PORT`].
    pub peer_port: u16,
    /// Who drives the engine. Default [`Progress::Thread`].
    pub progress: Progress,
    /// The IP MTU of the path, bytes (the interface MTU): the port's active MTU is the largest
    /// RoCE path MTU that fits it as rxe computes it (1500 gives 1024). `None` (default): see
    /// [`UdpDeviceConfig::effective_link_mtu`].
    pub link_mtu: Option<u32>,
    /// Engine tunables ([`EngineConfig::udp_src_ports`] is overwritten with the link's ports).
    pub engine: EngineConfig,
    /// Datagrams per recvmmsg(2) / sendmmsg(2), 1 ..= 64. Default 64.
    pub batch: usize,
    /// Use UDP GSO (a train of up to 64 datagrams per message; see [`crate::link::udp`]).
    /// Default true.
    pub gso: bool,
    /// Also over IPv4. The kernel numbers the IPv4 identification of a train's segments 0, 1,
    /// 2, ... and the ICRC covers it, so the device recomputes the ICRC of every segment after
    /// the first for its identification ([`RoceSocket::gso_positions`]): peers that check the
    /// ICRC (rxe, RoCE NICs) accept them. Default true.
    pub gso_ipv4: bool,
    /// Ask for UDP GRO. Default true.
    pub gro: bool,
    /// `SO_RCVBUF` / `SO_SNDBUF` to ask for, bytes (capped by `net.core.rmem_max` /
    /// `wmem_max`). Default 4 MiB: a window of 128 packets of 4 KiB must fit.
    pub socket_buffer_bytes: Option<usize>,
    /// Packets the peer can buffer for this device, shared among its RC / UC QPs as the window
    /// of unacknowledged packets of each (see the [device docs](super#windows)). `None`
    /// (default): half this device's socket receive buffer as the kernel granted it, over the
    /// path MTU plus 512 bytes of per-datagram overhead (peers are assumed alike).
    pub window_budget: Option<u32>,
    /// Sockets that only send, each from its own UDP source port, for per-QP source-port
    /// entropy (ECMP): a QP's packets leave from the port its QPN (or flow label) selects, 0 ..=
    /// 64 ([`RoceSocketConfig::src_ports`]). Default [`DEFAULT_SRC_PORTS`]; 0 sends everything from
    /// the bound port. Each costs one file descriptor.
    pub src_ports: usize,
    /// Seeded datagram loss on the socket (fault injection, [`DropHook`]); `None`: none.
    pub drop: Option<DropHook>,
    /// Share the address and port with other processes of this host ([`udp::share`]: a slot
    /// per process, QPNs carrying the slot, steering by destination QPN). Default: `true` when
    /// the environment variable `SOFT_HCA_SHARE` is `1`, else `false`.
    pub share: bool,
}

/// The environment variable that turns [`UdpDeviceConfig::share`] on by default: `1`.
pub(crate) const SHARE_ENV: &str = "SOFT_HCA_SHARE";

/// Default [`UdpDeviceConfig::src_ports`]: 4 flows. Each sending socket is a separate sendmmsg(2)
/// and its own GSO trains, so more ports cost batching when many QPs send at once: `rdma-perf
/// write-bw -s 65536 -q 64` over loopback kept 0.87-0.88 of its `-q 1` bandwidth with 4 ports
/// (0.89-0.93 with none), 0.69-0.71 with 8 and 0.59-0.70 with 16. Raise it for fabrics with wider
/// ECMP groups.
pub const DEFAULT_SRC_PORTS: usize = 4;

impl UdpDeviceConfig {
    /// The defaults for a device on `local`.
    pub fn new(local: IpAddr) -> UdpDeviceConfig {
        UdpDeviceConfig {
            local,
            scope_id: 0,
            port: ROCEV2_PORT,
            peer_port: ROCEV2_PORT,
            progress: Progress::Thread,
            link_mtu: None,
            engine: EngineConfig::default(),
            batch: MAX_TX_BATCH,
            gso: true,
            gso_ipv4: true,
            gro: true,
            socket_buffer_bytes: Some(4 << 20),
            window_budget: None,
            src_ports: DEFAULT_SRC_PORTS,
            drop: None,
            share: std::env::var(SHARE_ENV).is_ok_and(|v| v == "1"),
        }
    }

    /// The socket address to bind.
    pub fn socket_addr(&self) -> SocketAddr {
        match self.local {
            IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, self.port, 0, self.scope_id)),
            ip => SocketAddr::new(ip, self.port),
        }
    }

    /// The IP MTU in effect: [`UdpDeviceConfig::link_mtu`], else the MTU of the interface that
    /// holds the address (an IPv4 address: its interface from getifaddrs(3); an IPv6 address:
    /// from `/proc/net/if_inet6`; then `/sys/class/net/<if>/mtu`), else 65536 for an IPv4
    /// loopback address (`lo`) and 1500 (Ethernet) for any other.
    pub fn effective_link_mtu(&self) -> u32 {
        if let Some(mtu) = self.link_mtu {
            return mtu;
        }
        if let Some(mtu) = interface_mtu(self.local) {
            return mtu;
        }
        if self.local.is_loopback() {
            65536
        } else {
            1500
        }
    }
}

/// The MTU of the interface holding address `ip` (an IPv4 address's interface from getifaddrs(3),
/// an IPv6 one's from procfs; the MTU from sysfs; `None` when they do not say).
fn interface_mtu(ip: IpAddr) -> Option<u32> {
    let name = match ip {
        IpAddr::V4(v4) => udp::ipv4_interface(v4)?,
        IpAddr::V6(v6) => udp::ipv6_interface(v6)?.1,
    };
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    mtu.trim().parse().ok()
}

/// Binds the socket of a UDP device and returns its link, the engine configuration (source port
/// set to the bound port) and the window budget; see [`UdpDevice::open`].
pub(super) fn open_udp_link(
    config: &UdpDeviceConfig,
) -> Result<(UdpLink, EngineConfig, u32), DeviceError> {
    let want = config.socket_addr();
    let bad = |reason| {
        Err(DeviceError::Config {
            device: format!("udp:{want}"),
            reason,
        })
    };
    if config.local.is_unspecified() {
        return bad("the local address must be an address of this host, not 0.0.0.0 or ::");
    }
    if config.batch == 0 || config.batch > MAX_TX_BATCH {
        return bad("batch must be 1 ..= 64 datagrams");
    }
    let link_mtu = config.effective_link_mtu();
    let Some(active_mtu) = PathMtu::from_link_mtu(link_mtu as usize) else {
        return bad("link MTU below the smallest RoCE path MTU (256) plus headers");
    };
    let mut link_config = RoceSocketConfig::new(want);
    link_config.batch = config.batch;
    link_config.gso = config.gso;
    link_config.gro = config.gro;
    link_config.gso_ipv4 = config.gso_ipv4;
    link_config.recv_buffer_bytes = config.socket_buffer_bytes;
    link_config.send_buffer_bytes = config.socket_buffer_bytes;
    link_config.src_ports = config.src_ports;
    link_config.drop = config.drop;
    link_config.share = config.share;
    let link = RoceSocket::bind(link_config)?;
    let mut engine_config = config.engine.clone();
    engine_config.udp_src_ports = link.src_ports();
    if let Some(slot) = link.share_slot() {
        engine_config.qpn_prefix = Some(udp::share::qpn_prefix(slot));
    }
    let window_budget = config.window_budget.unwrap_or_else(|| {
        let rcvbuf = link.socket_buffers().map_or(212_992, |(r, _)| r);
        (rcvbuf / 2 / (active_mtu.bytes() + 512)) as u32
    });
    let io = UdpLink::new(link, config.peer_port, config.scope_id, link_mtu);
    Ok((io, engine_config, window_budget))
}

/// A software RoCEv2 device on a kernel UDP socket (see the [device docs](super)).
pub type UdpDevice = SoftDevice<UdpLink>;

impl UdpDevice {
    /// Opens a device: binds the socket (`config.local`, `config.port`), creates the engine with
    /// the address's GID at index [`GID_INDEX`](super::GID_INDEX) and the port MTU from
    /// [`UdpDeviceConfig::effective_link_mtu`], and starts the progress thread
    /// ([`Progress::Thread`]).
    ///
    /// # Errors
    /// [`DeviceError::Config`] (unspecified address, batch outside 1 ..= 64, link MTU too small
    /// for the smallest RoCE MTU); [`DeviceError::Link`] from binding (`AddrInUse`,
    /// `AddrNotAvailable`: the address is not on this host); [`DeviceError::Thread`].
    pub fn open(config: UdpDeviceConfig) -> Result<UdpDevice, DeviceError> {
        let (io, engine_config, window_budget) = open_udp_link(&config)?;
        let progress = config.progress;
        SoftDevice::with_link(io, config, engine_config, progress, Some(window_budget))
    }

    /// The GSO / GRO state of the socket.
    pub fn offloads(&self) -> Offloads {
        lock(&self.shared.io).link.link().offloads()
    }

    /// The UDP source ports the device sends from ([`UdpDeviceConfig::src_ports`]; the bound
    /// port alone when that is 0): a QP's packets leave from
    /// [`src_port_for`](crate::engine::src_port_for)`(ports, rocev2_src_port(qpn))`, or of its
    /// flow label's port when its address vector has one.
    pub fn src_ports(&self) -> Vec<u16> {
        lock(&self.shared.io).link.link().src_ports()
    }
}
