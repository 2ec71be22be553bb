//! [`LinkSpec`]: which link a device runs on, as the tools' `--link` option names it.
//!
//! * `udp:ADDRESS`, `udp:ADDRESS:PORT`, `udp:[IPV6]:PORT`, or the address alone: the kernel UDP
//!   socket link ([`super::udp`]) bound to that local address (the device's GID) and port
//!   (default 4791, the RoCEv2 port of IBTA vol. 1 Annex A17.2.2);
//! * `vfio:PCI_ADDRESS` (`0000:00:04.0` or `00:04.0`, as `lspci -D` prints it): the userspace
//!   virtio-net driver ([`super::vfio`]) on that PCI function, which must be bound to `vfio-pci`;
//! * `verbs:DEVICE` (`rxe0`, `mlx5_0`, as ibv_devices(1) lists it): that RDMA device through
//!   rdma-core's libibverbs ([`crate::ibverbs::IbvDevice`]): a real InfiniBand / RoCE HCA or the
//!   kernel's soft-RoCE. Not a link of the software engine: the HCA is the device.
//!
//! Any other `SCHEME:` is an error that lists the schemes this build knows.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

#[cfg(all(feature = "std", target_os = "linux"))]
use super::vfio::PciAddress;

/// The RoCEv2 UDP port, 4791 (IBTA vol. 1 Annex A17.2.2).
const ROCEV2_PORT: u16 = 4791;

/// A link as `--link` names it; see the [module docs](self). Parse with [`str::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkSpec {
    /// A kernel UDP socket bound to `ip`:`port`.
    Udp {
        /// The local address: the device's GID.
        ip: IpAddr,
        /// The local UDP port (default 4791).
        port: u16,
    },
    /// A virtio-net PCI function driven through VFIO.
    #[cfg(all(feature = "std", target_os = "linux"))]
    Vfio(PciAddress),
    /// A libibverbs device, by name (ASCII letters, digits, `_`, `-`, `.`).
    Verbs(String),
}

/// Why a `--link` value does not parse. `Display` is one line naming the text and the expected
/// forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSpecError {
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
}

/// The schemes this build parses, for messages.
#[cfg(all(feature = "std", target_os = "linux"))]
const SCHEMES: &str = "udp:ADDRESS[:PORT], vfio:PCI_ADDRESS or verbs:DEVICE";
#[cfg(not(all(feature = "std", target_os = "linux")))]
const SCHEMES: &str = "udp:ADDRESS[:PORT] or verbs:DEVICE";

impl fmt::Display for LinkSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkSpecError::UnknownScheme { text, scheme } => write!(
                f,
                "bad link \"{text}\": unknown link type \"{scheme}\" (expected {SCHEMES})"
            ),
            LinkSpecError::BadUdpAddress { text } => write!(
                f,
                "bad link \"{text}\": expected udp:ADDRESS or udp:ADDRESS:PORT (e.g. \
                 udp:192.168.1.2, udp:[fe80::1]:4791)"
            ),
            LinkSpecError::BadPciAddress { text } => write!(
                f,
                "bad link \"{text}\": expected vfio:PCI_ADDRESS (DDDD:BB:DD.F or BB:DD.F in \
                 hexadecimal, e.g. vfio:0000:00:04.0)"
            ),
            LinkSpecError::BadVerbsDevice { text } => write!(
                f,
                "bad link \"{text}\": expected verbs:DEVICE, an RDMA device name as ibv_devices \
                 lists it (e.g. verbs:rxe0, verbs:mlx5_0)"
            ),
        }
    }
}

impl std::error::Error for LinkSpecError {}

impl LinkSpec {
    /// A UDP link on `ip` and the RoCEv2 port.
    pub fn udp(ip: IpAddr) -> LinkSpec {
        LinkSpec::Udp {
            ip,
            port: ROCEV2_PORT,
        }
    }

    /// The local IP address of a UDP link.
    pub fn udp_ip(&self) -> Option<IpAddr> {
        match self {
            LinkSpec::Udp { ip, .. } => Some(*ip),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

fn parse_udp(text: &str, rest: &str) -> Result<LinkSpec, LinkSpecError> {
    if let Ok(ip) = rest.parse::<IpAddr>() {
        return Ok(LinkSpec::udp(ip));
    }
    if let Ok(sa) = rest.parse::<SocketAddr>() {
        return Ok(LinkSpec::Udp {
            ip: sa.ip(),
            port: sa.port(),
        });
    }
    Err(LinkSpecError::BadUdpAddress {
        text: text.to_owned(),
    })
}

impl FromStr for LinkSpec {
    type Err = LinkSpecError;

    /// Parses `udp:...`, `vfio:...`, `verbs:...` or a bare (socket) address; see the [module docs](self).
    ///
    /// # Errors
    /// [`LinkSpecError`].
    fn from_str(text: &str) -> Result<LinkSpec, LinkSpecError> {
        // A bare address (`10.0.0.1`, `::1`, `[::1]:4791`) is a UDP link: tell it apart from a
        // scheme before looking for one (IPv6 addresses contain colons).
        if text.parse::<IpAddr>().is_ok() || text.parse::<SocketAddr>().is_ok() {
            return parse_udp(text, text);
        }
        let (scheme, rest) = text.split_once(':').unwrap_or((text, ""));
        match scheme {
            "udp" => parse_udp(text, rest),
            #[cfg(all(feature = "std", target_os = "linux"))]
            "vfio" => PciAddress::parse(rest).map(LinkSpec::Vfio).map_err(|_| {
                LinkSpecError::BadPciAddress {
                    text: text.to_owned(),
                }
            }),
            "verbs" => {
                let ok = !rest.is_empty()
                    && rest
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if ok {
                    Ok(LinkSpec::Verbs(rest.to_owned()))
                } else {
                    Err(LinkSpecError::BadVerbsDevice {
                        text: text.to_owned(),
                    })
                }
            }
            _ => Err(LinkSpecError::UnknownScheme {
                text: text.to_owned(),
                scheme: scheme.to_owned(),
            }),
        }
    }
}

impl fmt::Display for LinkSpec {
    /// `udp:ADDRESS` (the port only when it is not 4791), `vfio:PCI_ADDRESS`, `verbs:DEVICE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkSpec::Udp { ip, port } if *port == ROCEV2_PORT => write!(f, "udp:{ip}"),
            LinkSpec::Udp { ip, port } => write!(f, "udp:{}", SocketAddr::new(*ip, *port)),
            #[cfg(all(feature = "std", target_os = "linux"))]
            LinkSpec::Vfio(pci) => write!(f, "vfio:{pci}"),
            LinkSpec::Verbs(name) => write!(f, "verbs:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_forms() {
        let s: LinkSpec = "udp:127.0.0.2".parse().unwrap();
        assert_eq!(s, LinkSpec::udp("127.0.0.2".parse().unwrap()));
        let s: LinkSpec = "udp:[::1]:5000".parse().unwrap();
        assert_eq!(
            s,
            LinkSpec::Udp {
                ip: "::1".parse().unwrap(),
                port: 5000
            }
        );
        assert_eq!("::1".parse::<LinkSpec>().unwrap().to_string(), "udp:::1");
        assert_eq!(
            "10.0.0.1:99".parse::<LinkSpec>().unwrap().to_string(),
            "udp:10.0.0.1:99"
        );
        assert_eq!(
            "udp:rxe0".parse::<LinkSpec>(),
            Err(LinkSpecError::BadUdpAddress {
                text: "udp:rxe0".into()
            })
        );
    }

    #[test]
    fn vfio_forms() {
        let s: LinkSpec = "vfio:0000:00:04.0".parse().unwrap();
        assert_eq!(s.to_string(), "vfio:0000:00:04.0");
        assert_eq!(
            "vfio:00:05.1".parse::<LinkSpec>().unwrap().to_string(),
            "vfio:0000:00:05.1"
        );
        assert_eq!(s.udp_ip(), None);
        for bad in ["vfio:", "vfio:00:20.0", "vfio:0000:00:04", "vfio:xyz"] {
            let e = bad.parse::<LinkSpec>().unwrap_err();
            assert!(matches!(e, LinkSpecError::BadPciAddress { .. }), "{bad}");
            assert!(e.to_string().contains("vfio:PCI_ADDRESS"), "{e}");
        }
    }

    #[test]
    fn verbs_forms() {
        let s: LinkSpec = "verbs:rxe0".parse().unwrap();
        assert_eq!(s, LinkSpec::Verbs("rxe0".into()));
        assert_eq!(s.to_string(), "verbs:rxe0");
        assert_eq!(s.udp_ip(), None);
        assert_eq!(
            "verbs:mlx5_0".parse::<LinkSpec>().unwrap(),
            LinkSpec::Verbs("mlx5_0".into())
        );
        for bad in ["verbs:", "verbs:rx e0", "verbs:a/b"] {
            let e = bad.parse::<LinkSpec>().unwrap_err();
            assert!(matches!(e, LinkSpecError::BadVerbsDevice { .. }), "{bad}");
            assert!(e.to_string().contains("verbs:DEVICE"), "{e}");
        }
    }

    #[test]
    fn unknown_scheme_is_named() {
        let e = "tcp:1.2.3.4".parse::<LinkSpec>().unwrap_err();
        assert_eq!(
            e,
            LinkSpecError::UnknownScheme {
                text: "tcp:1.2.3.4".into(),
                scheme: "tcp".into()
            }
        );
        let text = e.to_string();
        assert!(text.contains("unknown link type \"tcp\""), "{text}");
        assert!(text.contains("udp:ADDRESS"), "{text}");
        assert!(text.contains("verbs:DEVICE"), "{text}");
        assert!("rxe0".parse::<LinkSpec>().is_err());
        assert!("".parse::<LinkSpec>().is_err());
    }
}
