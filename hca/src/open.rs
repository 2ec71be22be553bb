//! Opening a device: the one way every program here (the tools' `--link`, `coll-perf --link` and
//! the collectives' `COLL_ROCE_LINK`, the conformance suite's `--link`) turns the name of a device
//! into an open [`Verbs`]: [`DeviceSpec`] parses the name, [`open`] opens it with
//! [`OpenOptions`].
//!
//! * `udp:ADDRESS`, `udp:ADDRESS:PORT`, `udp:[IPV6]:PORT`, or the address alone: the software
//!   HCA ([`crate::soft::UdpDevice`]) on a kernel UDP socket ([`crate::link::udp`]) bound to that
//!   local address (the device's GID) and port (without one,
//!   [`OpenOptions::default_udp_port`]: 4791, the RoCEv2 port of IBTA vol. 1 Annex A17.2.2). A
//!   link-local IPv6 address may carry its zone (RFC 4007 section 11), `udp:fe80::1%eth0`,
//!   `udp:[fe80::1%2]:4791`: the interface (name or index) must hold the address; without a
//!   zone the interface that holds it is found in `/proc/net/if_inet6`;
//! * `vfio:PCI_ADDRESS` (`0000:00:04.0` or `00:04.0`, as `lspci -D` prints it): the software HCA
//!   on the userspace virtio-net driver ([`crate::link::vfio`]) on that PCI function, which must
//!   be bound to `vfio-pci`;
//! * `xdp:IFNAME` (`eth0`, as `ip link` names it): the software HCA on an AF_XDP socket
//!   ([`crate::link::xdp`]) on queue 0 of that interface, with an XDP program that steers
//!   RoCEv2 to it; the interface keeps its other traffic. Needs root;
//! * `verbs:DEVICE` (`rxe0`, `mlx5_0`, as ibv_devices(1) lists it): that RDMA device through
//!   rdma-core's libibverbs ([`crate::ibverbs::IbvDevice`]): a real InfiniBand / RoCE HCA or the
//!   kernel's soft-RoCE. Not a link of the software engine: the HCA is the device;
//! * `fabric`: a software HCA on the in-memory test fabric ([`crate::fabric`], feature `fabric`),
//!   in the group and at the address [`OpenOptions::fabric`] gives.
//!
//! Any other `SCHEME:` is an error that lists the schemes this build knows.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use crate::engine::EngineConfig;
#[cfg(feature = "fabric")]
use crate::fabric::device::FabricGroup;
use crate::ibverbs::IbvDevice;
use crate::link::udp::DropHook;
#[cfg(all(feature = "std", target_os = "linux"))]
use crate::link::vfio::VfioLinkConfig;
#[cfg(all(feature = "std", target_os = "linux"))]
use crate::soft::XdpDeviceConfig;
use crate::soft::{AnyConfig, AnyDevice, Progress, UdpDeviceConfig, VfioDeviceConfig};
use crate::verbs::api::{DeviceError, Verbs};

#[cfg(all(feature = "std", target_os = "linux"))]
use crate::link::vfio::PciAddress;

/// The RoCEv2 UDP port, 4791 (IBTA vol. 1 Annex A17.2.2).
const ROCEV2_PORT: u16 = 4791;

/// A link as `--link` names it; see the [module docs](self). Parse with [`str::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceSpec {
    /// A kernel UDP socket bound to `ip`:`port`.
    Udp {
        /// The local address: the device's GID.
        ip: IpAddr,
        /// The local UDP port; `None` when the name gave none ([`OpenOptions::default_udp_port`]).
        port: Option<u16>,
    },
    /// A virtio-net PCI function driven through VFIO.
    #[cfg(all(feature = "std", target_os = "linux"))]
    Vfio(PciAddress),
    /// An AF_XDP socket on a network interface, by name.
    #[cfg(all(feature = "std", target_os = "linux"))]
    Xdp(String),
    /// A libibverbs device, by name (ASCII letters, digits, `_`, `-`, `.`).
    Verbs(String),
    /// A software HCA on the in-memory test fabric.
    Fabric,
}

/// Why a `--link` value does not parse. `Display` is one line naming the text and the expected
/// forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpecError {
    /// The scheme before the first `:` is not one this build knows.
    UnknownScheme {
        /// The text given.
        text: String,
        /// The scheme found.
        scheme: String,
    },
    /// `udp:` followed by something that is not an IP address or socket address.
    BadUdpAddress {
        /// The text given.
        text: String,
    },
    /// `vfio:` followed by something that is not a PCI address.
    BadPciAddress {
        /// The text given.
        text: String,
    },
    /// `verbs:` followed by an empty or malformed device name.
    BadVerbsDevice {
        /// The text given.
        text: String,
    },
    /// `xdp:` followed by something that is not an interface name.
    BadInterface {
        /// The text given.
        text: String,
    },
}

/// The `--link` forms a program accepts, for the messages of [`DeviceSpecError::message`]: a
/// program that takes fewer forms than [`DeviceSpec`] parses names only those in its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkForms {
    /// `udp:ADDRESS:PORT` (and `udp:[IPV6]:PORT`) besides `udp:ADDRESS`: the program binds the
    /// port given. `false` for a program whose peers always send to one port (the tools: 4791).
    pub udp_port: bool,
    /// `vfio:PCI_ADDRESS`.
    pub vfio: bool,
    /// `verbs:DEVICE`.
    pub verbs: bool,
    /// `xdp:IFNAME`.
    pub xdp: bool,
}

impl LinkForms {
    /// Every form this build parses but `fabric`: what [`DeviceSpecError`]'s
    /// `Display` names.
    pub const PARSED: LinkForms = LinkForms {
        udp_port: true,
        vfio: cfg!(all(feature = "std", target_os = "linux")),
        verbs: true,
        xdp: cfg!(all(feature = "std", target_os = "linux")),
    };

    /// The forms as a message lists them: `udp:ADDRESS[:PORT], vfio:PCI_ADDRESS or
    /// verbs:DEVICE` (`udp:ADDRESS without a port, ...` without [`LinkForms::udp_port`]).
    pub fn list(&self) -> String {
        let mut forms = vec![if self.udp_port {
            "udp:ADDRESS[:PORT]"
        } else {
            "udp:ADDRESS without a port"
        }];
        if self.vfio {
            forms.push("vfio:PCI_ADDRESS");
        }
        if self.xdp {
            forms.push("xdp:IFNAME");
        }
        if self.verbs {
            forms.push("verbs:DEVICE");
        }
        match forms.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => forms.concat(),
        }
    }
}

impl DeviceSpecError {
    /// The text that did not parse.
    pub fn text(&self) -> &str {
        match self {
            DeviceSpecError::UnknownScheme { text, .. }
            | DeviceSpecError::BadUdpAddress { text }
            | DeviceSpecError::BadPciAddress { text }
            | DeviceSpecError::BadVerbsDevice { text }
            | DeviceSpecError::BadInterface { text } => text,
        }
    }

    /// The one-line message for a program that accepts `forms`: it names those forms only (a
    /// `vfio:` or `verbs:` name is "not taken" where `forms` lacks it, and a malformed `udp:`
    /// name asks for no port where [`LinkForms::udp_port`] is off). `Display` is the message for
    /// [`LinkForms::PARSED`].
    pub fn message(&self, forms: LinkForms) -> String {
        let text = self.text();
        let not_taken = |scheme: &str| {
            format!(
                "bad link \"{text}\": no {scheme}: link here (expected {})",
                forms.list()
            )
        };
        match self {
            DeviceSpecError::UnknownScheme { scheme, .. } => format!(
                "bad link \"{text}\": unknown link type \"{scheme}\" (expected {})",
                forms.list()
            ),
            DeviceSpecError::BadUdpAddress { .. } if forms.udp_port => format!(
                "bad link \"{text}\": expected udp:ADDRESS or udp:ADDRESS:PORT (e.g. \
                 udp:192.168.1.2, udp:[fe80::1]:4791, udp:fe80::1%eth0 with the interface that \
                 holds the link-local address)"
            ),
            DeviceSpecError::BadUdpAddress { .. } => format!(
                "bad link \"{text}\": expected udp:ADDRESS, an IP address of this host without a \
                 port (e.g. udp:192.168.1.2, udp:fe80::1)"
            ),
            DeviceSpecError::BadPciAddress { .. } if !forms.vfio => not_taken("vfio"),
            DeviceSpecError::BadPciAddress { .. } => format!(
                "bad link \"{text}\": expected vfio:PCI_ADDRESS (DDDD:BB:DD.F or BB:DD.F in \
                 hexadecimal, e.g. vfio:0000:00:04.0)"
            ),
            DeviceSpecError::BadInterface { .. } if !forms.xdp => not_taken("xdp"),
            DeviceSpecError::BadInterface { .. } => format!(
                "bad link \"{text}\": expected xdp:IFNAME, a network interface name as ip link \
                 lists it (e.g. xdp:eth0)"
            ),
            DeviceSpecError::BadVerbsDevice { .. } if !forms.verbs => not_taken("verbs"),
            DeviceSpecError::BadVerbsDevice { .. } => format!(
                "bad link \"{text}\": expected verbs:DEVICE, an RDMA device name as ibv_devices \
                 lists it (e.g. verbs:rxe0, verbs:mlx5_0)"
            ),
        }
    }
}

impl fmt::Display for DeviceSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message(LinkForms::PARSED))
    }
}

impl std::error::Error for DeviceSpecError {}

impl DeviceSpec {
    /// A UDP device on `ip` and the RoCEv2 port.
    pub fn udp(ip: IpAddr) -> DeviceSpec {
        DeviceSpec::Udp {
            ip,
            port: Some(ROCEV2_PORT),
        }
    }

    /// The local IP address of a UDP link.
    pub fn udp_ip(&self) -> Option<IpAddr> {
        match self {
            DeviceSpec::Udp { ip, .. } => Some(*ip),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// `ADDR%SCOPE` or `[ADDR%SCOPE]:PORT` (RFC 4007 section 11, as getaddrinfo(3) takes it): an IPv6
/// link-local address with its zone, an interface name (`br0`) or index (`3`). The zone must name
/// the interface that holds the address (`/proc/net/if_inet6`), on which the device is then opened
/// (its scope id is looked up again at [`open`]); `None` if `rest` has no `%`.
fn parse_udp_scoped(rest: &str) -> Option<Result<DeviceSpec, ()>> {
    if !rest.contains('%') {
        return None;
    }
    let (inner, port) = match rest.strip_prefix('[') {
        Some(r) => {
            let (inner, after) = r.split_once(']')?;
            let port = after.strip_prefix(':').map(str::parse::<u16>);
            match port {
                Some(Ok(p)) => (inner, Some(p)),
                _ => return Some(Err(())),
            }
        }
        None => (rest, None),
    };
    let (addr, zone) = inner.split_once('%')?;
    let Ok(ip) = addr.parse::<std::net::Ipv6Addr>() else {
        return Some(Err(()));
    };
    if ip.segments()[0] & 0xffc0 != 0xfe80 || zone.is_empty() {
        return Some(Err(()));
    }
    let held = crate::link::udp::ipv6_interface(ip)
        .is_some_and(|(index, name)| name == zone || zone.parse::<u32>() == Ok(index));
    Some(if held {
        Ok(DeviceSpec::Udp {
            ip: IpAddr::V6(ip),
            port,
        })
    } else {
        Err(())
    })
}

fn parse_udp(text: &str, rest: &str) -> Result<DeviceSpec, DeviceSpecError> {
    if let Some(r) = parse_udp_scoped(rest) {
        return r.map_err(|()| DeviceSpecError::BadUdpAddress {
            text: text.to_owned(),
        });
    }
    if let Ok(ip) = rest.parse::<IpAddr>() {
        return Ok(DeviceSpec::Udp { ip, port: None });
    }
    if let Ok(sa) = rest.parse::<SocketAddr>() {
        return Ok(DeviceSpec::Udp {
            ip: sa.ip(),
            port: Some(sa.port()),
        });
    }
    Err(DeviceSpecError::BadUdpAddress {
        text: text.to_owned(),
    })
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    /// Parses `udp:...`, `vfio:...`, `verbs:...`, `fabric` or a bare (socket) address; see the
    /// [module docs](self).
    ///
    /// # Errors
    /// [`DeviceSpecError`].
    fn from_str(text: &str) -> Result<DeviceSpec, DeviceSpecError> {
        // A bare address (`10.0.0.1`, `::1`, `[::1]:4791`) is a UDP link: tell it apart from a
        // scheme before looking for one (IPv6 addresses contain colons).
        if text.parse::<IpAddr>().is_ok() || text.parse::<SocketAddr>().is_ok() {
            return parse_udp(text, text);
        }
        if text == "fabric" {
            return Ok(DeviceSpec::Fabric);
        }
        let (scheme, rest) = text.split_once(':').unwrap_or((text, ""));
        match scheme {
            "udp" => parse_udp(text, rest),
            #[cfg(all(feature = "std", target_os = "linux"))]
            "vfio" => PciAddress::parse(rest).map(DeviceSpec::Vfio).map_err(|_| {
                DeviceSpecError::BadPciAddress {
                    text: text.to_owned(),
                }
            }),
            #[cfg(all(feature = "std", target_os = "linux"))]
            "xdp" => {
                // IFNAMSIZ is 16 with the NUL (netdevice(7)); no '/' (a sysfs path), no space.
                let ok = !rest.is_empty()
                    && rest.len() < 16
                    && rest
                        .chars()
                        .all(|c| c.is_ascii_graphic() && !matches!(c, '/' | ':'));
                if ok {
                    Ok(DeviceSpec::Xdp(rest.to_owned()))
                } else {
                    Err(DeviceSpecError::BadInterface {
                        text: text.to_owned(),
                    })
                }
            }
            "verbs" => {
                let ok = !rest.is_empty()
                    && rest
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if ok {
                    Ok(DeviceSpec::Verbs(rest.to_owned()))
                } else {
                    Err(DeviceSpecError::BadVerbsDevice {
                        text: text.to_owned(),
                    })
                }
            }
            _ => Err(DeviceSpecError::UnknownScheme {
                text: text.to_owned(),
                scheme: scheme.to_owned(),
            }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    /// `udp:ADDRESS` (the port only when it is given and not 4791), `vfio:PCI_ADDRESS`,
    /// `verbs:DEVICE`, `fabric`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Udp {
                ip,
                port: None | Some(ROCEV2_PORT),
            } => write!(f, "udp:{ip}"),
            DeviceSpec::Udp {
                ip,
                port: Some(port),
            } => write!(f, "udp:{}", SocketAddr::new(*ip, *port)),
            DeviceSpec::Fabric => f.write_str("fabric"),
            #[cfg(all(feature = "std", target_os = "linux"))]
            DeviceSpec::Vfio(pci) => write!(f, "vfio:{pci}"),
            #[cfg(all(feature = "std", target_os = "linux"))]
            DeviceSpec::Xdp(ifname) => write!(f, "xdp:{ifname}"),
            DeviceSpec::Verbs(name) => write!(f, "verbs:{name}"),
        }
    }
}

/// How [`open`] opens a device beyond its name. `Default`: a `udp:` name without a port binds
/// 4791, a progress thread, the engine's defaults, no fabric.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The UDP port a `udp:` name without one binds: 4791 (the RoCEv2 port) by default; 0 picks
    /// a free port (tests that run devices side by side).
    pub default_udp_port: u16,
    /// Who drives a software HCA's engine (ignored by a libibverbs device).
    pub progress: Progress,
    /// The transport engine's configuration of a software HCA.
    pub engine: EngineConfig,
    /// A software HCA's shared window budget, packets ([`UdpDeviceConfig::window_budget`];
    /// `None`: from the socket's receive buffer).
    pub window_budget: Option<u32>,
    /// `udp:`: seeded datagram loss on the socket (fault injection; the tools take it from the
    /// environment, [`crate::tools::fault`]).
    pub drop: Option<DropHook>,
    /// `udp:`: share the address and port with other processes of this host
    /// ([`UdpDeviceConfig::share`], [`crate::link::udp::share`]); `None` (default): that field's
    /// default (the `SOFT_HCA_SHARE` environment variable).
    pub udp_share: Option<bool>,
    /// `vfio:`: the NIC's IPv4 address (its GID at index 2).
    pub vfio_ipv4: Option<Ipv4Addr>,
    /// `vfio:`: static neighbours (no ARP / Neighbor Discovery for their addresses).
    pub vfio_neighbours: Vec<(IpAddr, [u8; 6])>,
    /// `vfio:`: sleep on the NIC's MSI-X receive interrupt when idle instead of busy-polling.
    pub vfio_interrupts: bool,
    /// `fabric`: the fabric to join and the device's address on it.
    #[cfg(feature = "fabric")]
    pub fabric: Option<(FabricGroup, IpAddr)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            default_udp_port: ROCEV2_PORT,
            progress: Progress::Thread,
            engine: EngineConfig::default(),
            window_budget: None,
            drop: None,
            udp_share: None,
            vfio_ipv4: None,
            vfio_neighbours: Vec::new(),
            vfio_interrupts: false,
            #[cfg(feature = "fabric")]
            fabric: None,
        }
    }
}

/// The Ethernet MTU of a device [`open`] puts on the in-memory fabric, bytes.
#[cfg(feature = "fabric")]
pub const FABRIC_ETH_MTU: u32 = 1500;

/// Opens the device `spec` names with `options`: a software HCA on a UDP socket, on a VFIO NIC or
/// on the in-memory fabric, or a libibverbs device. Every program here opens its devices through
/// this function.
///
/// # Errors
/// As [`UdpDevice::open`](crate::soft::UdpDevice::open), [`VfioDevice::open`](crate::soft::VfioDevice::open),
/// [`IbvDevice::open`] and [`FabricGroup::add_device_with`]; [`DeviceError::Config`] for
/// `fabric` without [`OpenOptions::fabric`] or in a build without the `fabric` feature.
pub fn open(spec: &DeviceSpec, options: &OpenOptions) -> Result<Arc<dyn Verbs>, DeviceError> {
    match spec {
        DeviceSpec::Verbs(name) => Ok(Arc::new(IbvDevice::open(name)?)),
        DeviceSpec::Fabric => open_fabric(options),
        _ => Ok(open_soft(spec, options)?),
    }
}

#[cfg(feature = "fabric")]
fn open_fabric(options: &OpenOptions) -> Result<Arc<dyn Verbs>, DeviceError> {
    match &options.fabric {
        Some((group, ip)) => Ok(Arc::new(group.add_device_with(
            *ip,
            FABRIC_ETH_MTU,
            options.engine.clone(),
        )?)),
        None => Err(DeviceError::Config {
            device: "fabric".into(),
            reason: "no fabric to join (OpenOptions::fabric)",
        }),
    }
}

#[cfg(not(feature = "fabric"))]
fn open_fabric(_: &OpenOptions) -> Result<Arc<dyn Verbs>, DeviceError> {
    Err(DeviceError::Config {
        device: "fabric".into(),
        reason: "this build has no in-memory fabric (feature `fabric`)",
    })
}

/// [`open`] for a software HCA (`udp:` or `vfio:`); [`DeviceError::Config`] for a `verbs:` or
/// `fabric` name.
fn open_soft(spec: &DeviceSpec, options: &OpenOptions) -> Result<Arc<AnyDevice>, DeviceError> {
    let config = match spec {
        DeviceSpec::Udp { ip, port } => {
            let mut c = UdpDeviceConfig::new(*ip);
            c.port = port.unwrap_or(options.default_udp_port);
            c.scope_id = link_local_scope(*ip);
            c.progress = options.progress;
            c.engine = options.engine.clone();
            c.window_budget = options.window_budget;
            c.drop = options.drop;
            if let Some(share) = options.udp_share {
                c.share = share;
            }
            AnyConfig::Udp(c)
        }
        #[cfg(all(feature = "std", target_os = "linux"))]
        DeviceSpec::Vfio(pci) => {
            let mut link = VfioLinkConfig::new(*pci);
            link.ipv4 = options.vfio_ipv4;
            link.static_neighbours = options.vfio_neighbours.clone();
            link.interrupts = options.vfio_interrupts;
            let mut c = VfioDeviceConfig::new(link);
            c.engine = options.engine.clone();
            c.progress = options.progress;
            AnyConfig::Vfio(c)
        }
        #[cfg(all(feature = "std", target_os = "linux"))]
        DeviceSpec::Xdp(ifname) => {
            let mut c = XdpDeviceConfig::new(crate::link::xdp::XdpLinkConfig::new(ifname));
            c.engine = options.engine.clone();
            c.progress = options.progress;
            AnyConfig::Xdp(c)
        }
        DeviceSpec::Verbs(_) | DeviceSpec::Fabric => {
            return Err(DeviceError::Config {
                device: spec.to_string(),
                reason: "not a software HCA on a UDP socket or a VFIO NIC",
            })
        }
    };
    Ok(Arc::new(AnyDevice::open(config)?))
}

/// The interface index (IPv6 scope) of the interface that holds the link-local address `ip`
/// (`fe80::/10`), from `/proc/net/if_inet6`; 0 for any other address or when none holds it. A
/// socket cannot bind a link-local address, nor reach a link-local peer, without it.
pub fn link_local_scope(ip: IpAddr) -> u32 {
    let IpAddr::V6(v6) = ip else {
        return 0;
    };
    if v6.segments()[0] & 0xffc0 != 0xfe80 {
        return 0;
    }
    crate::link::udp::ipv6_interface(v6).map_or(0, |(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_forms() {
        let s: DeviceSpec = "udp:127.0.0.2".parse().unwrap();
        assert_eq!(
            s,
            DeviceSpec::Udp {
                ip: "127.0.0.2".parse().unwrap(),
                port: None
            }
        );
        assert_eq!(s.to_string(), "udp:127.0.0.2");
        let s: DeviceSpec = "udp:[::1]:5000".parse().unwrap();
        assert_eq!(
            s,
            DeviceSpec::Udp {
                ip: "::1".parse().unwrap(),
                port: Some(5000)
            }
        );
        assert_eq!("::1".parse::<DeviceSpec>().unwrap().to_string(), "udp:::1");
        assert_eq!(
            "10.0.0.1:99".parse::<DeviceSpec>().unwrap().to_string(),
            "udp:10.0.0.1:99"
        );
        assert_eq!(
            "udp:rxe0".parse::<DeviceSpec>(),
            Err(DeviceSpecError::BadUdpAddress {
                text: "udp:rxe0".into()
            })
        );
    }

    #[test]
    fn vfio_forms() {
        let s: DeviceSpec = "vfio:0000:00:04.0".parse().unwrap();
        assert_eq!(s.to_string(), "vfio:0000:00:04.0");
        assert_eq!(
            "vfio:00:05.1".parse::<DeviceSpec>().unwrap().to_string(),
            "vfio:0000:00:05.1"
        );
        assert_eq!(s.udp_ip(), None);
        for bad in ["vfio:", "vfio:00:20.0", "vfio:0000:00:04", "vfio:xyz"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(e, DeviceSpecError::BadPciAddress { .. }), "{bad}");
            assert!(e.to_string().contains("vfio:PCI_ADDRESS"), "{e}");
        }
    }

    #[test]
    fn verbs_forms() {
        let s: DeviceSpec = "verbs:rxe0".parse().unwrap();
        assert_eq!(s, DeviceSpec::Verbs("rxe0".into()));
        assert_eq!(s.to_string(), "verbs:rxe0");
        assert_eq!(s.udp_ip(), None);
        assert_eq!(
            "verbs:mlx5_0".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Verbs("mlx5_0".into())
        );
        for bad in ["verbs:", "verbs:rx e0", "verbs:a/b"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(e, DeviceSpecError::BadVerbsDevice { .. }), "{bad}");
            assert!(e.to_string().contains("verbs:DEVICE"), "{e}");
        }
    }

    #[test]
    fn xdp_forms() {
        let s: DeviceSpec = "xdp:veth0".parse().unwrap();
        assert_eq!(s, DeviceSpec::Xdp("veth0".into()));
        assert_eq!(s.to_string(), "xdp:veth0");
        assert_eq!(s.udp_ip(), None);
        for bad in ["xdp:", "xdp:a/b", "xdp:a b", "xdp:sixteen_chars_xx"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(e, DeviceSpecError::BadInterface { .. }), "{bad}");
            assert!(e.to_string().contains("xdp:IFNAME"), "{e}");
        }
    }

    #[test]
    fn unknown_scheme_is_named() {
        let e = "tcp:1.2.3.4".parse::<DeviceSpec>().unwrap_err();
        assert_eq!(
            e,
            DeviceSpecError::UnknownScheme {
                text: "tcp:1.2.3.4".into(),
                scheme: "tcp".into()
            }
        );
        let text = e.to_string();
        assert!(text.contains("unknown link type \"tcp\""), "{text}");
        assert!(text.contains("udp:ADDRESS"), "{text}");
        assert!(text.contains("verbs:DEVICE"), "{text}");
        assert!("rxe0".parse::<DeviceSpec>().is_err());
        assert!("".parse::<DeviceSpec>().is_err());
    }

    /// `Display` names every parsed form (what coll-perf and the conformance suite print);
    /// `message` names the forms its caller takes.
    #[test]
    fn messages_name_the_forms_a_caller_takes() {
        let linux = cfg!(all(feature = "std", target_os = "linux"));
        let e = "tcp:1.2.3.4".parse::<DeviceSpec>().unwrap_err();
        let all = if linux {
            "udp:ADDRESS[:PORT], vfio:PCI_ADDRESS, xdp:IFNAME or verbs:DEVICE"
        } else {
            "udp:ADDRESS[:PORT] or verbs:DEVICE"
        };
        assert_eq!(
            e.to_string(),
            format!("bad link \"tcp:1.2.3.4\": unknown link type \"tcp\" (expected {all})")
        );
        let tool = LinkForms {
            udp_port: false,
            ..LinkForms::PARSED
        };
        let m = e.message(tool);
        assert!(m.contains("(expected udp:ADDRESS without a port"), "{m}");
        assert!(!m.contains("PORT]"), "{m}");
        let e = "udp:rxe0".parse::<DeviceSpec>().unwrap_err();
        assert!(e.to_string().contains("udp:ADDRESS:PORT"), "{e}");
        let m = e.message(tool);
        assert!(m.contains("without a port") && !m.contains("PORT"), "{m}");
        let udp_only = LinkForms {
            udp_port: false,
            vfio: false,
            verbs: false,
            xdp: false,
        };
        assert_eq!(udp_only.list(), "udp:ADDRESS without a port");
        let e = "verbs:".parse::<DeviceSpec>().unwrap_err();
        assert_eq!(
            e.message(udp_only),
            "bad link \"verbs:\": no verbs: link here (expected udp:ADDRESS without a port)"
        );
        assert_eq!(e.text(), "verbs:");
    }

    #[test]
    fn link_local_addresses_with_a_zone() {
        // Not link-local, no address, an empty zone, a bad or missing port: refused.
        for bad in [
            "udp:::1%lo",
            "udp:fe80::zz%lo",
            "udp:fe80::1%",
            "udp:[fe80::1%lo]:x",
            "udp:[fe80::1%lo]",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        // A link-local address of this host (if it has one), with its interface's name or index
        // as the zone; another zone is refused.
        let table = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        for line in table.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[0].starts_with("fe80") {
                continue;
            }
            let bytes: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&f[0][2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let ip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap());
            let index = u32::from_str_radix(f[1], 16).unwrap();
            let want = DeviceSpec::Udp {
                ip: IpAddr::V6(ip),
                port: None,
            };
            assert_eq!(format!("udp:{ip}%{}", f[5]).parse::<DeviceSpec>(), Ok(want));
            assert_eq!(
                format!("udp:[{ip}%{index}]:5000").parse::<DeviceSpec>(),
                Ok(DeviceSpec::Udp {
                    ip: IpAddr::V6(ip),
                    port: Some(5000)
                })
            );
            assert!(format!("udp:{ip}%{}", index + 1000)
                .parse::<DeviceSpec>()
                .is_err());
            return;
        }
    }

    #[test]
    fn link_local_scope_is_the_interface_index() {
        // Not link-local: no scope.
        assert_eq!(link_local_scope("::1".parse().unwrap()), 0);
        assert_eq!(link_local_scope("10.0.0.1".parse().unwrap()), 0);
        // A link-local address of this host (if it has one) is on the interface listed with it.
        let table = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        for line in table.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[0].starts_with("fe80") {
                continue;
            }
            let bytes: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&f[0][2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let ip = IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap());
            assert_eq!(link_local_scope(ip), u32::from_str_radix(f[1], 16).unwrap());
        }
        // One that no interface holds.
        assert_eq!(link_local_scope("fe80::dead:beef:1".parse().unwrap()), 0);
    }
}
