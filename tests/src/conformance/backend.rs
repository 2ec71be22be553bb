//! Opening the devices a suite run uses, from `--link` specs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hca::fabric::device::FabricGroup;
use hca::fabric::Faults;
use hca::ibverbs::IbvDevice;
use hca::soft::{DeviceError, UdpDevice, UdpDeviceConfig};
use hca::verbs::Verbs;

use super::Devices;

/// Why the devices could not be opened.
#[derive(Debug)]
pub enum BackendError {
    /// The spec is not one this build understands.
    BadSpec {
        /// The spec.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// `--link` and `--link2` are UDP devices on one address: each finds its peer by address, so
    /// neither would reach the other.
    SameAddress {
        /// The address.
        ip: IpAddr,
    },
    /// The device could not be opened.
    Open {
        /// The spec.
        spec: String,
        /// The device's error.
        source: DeviceError,
    },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::BadSpec { spec, reason } => write!(f, "bad device \"{spec}\": {reason}"),
            BackendError::SameAddress { ip } => write!(
                f,
                "--link and --link2 are both on {ip}: leave --link2 out to loop back on one \
                 device, or give two addresses (e.g. udp:127.0.0.1 and udp:127.0.0.2)"
            ),
            BackendError::Open { spec, source } => write!(f, "cannot open {spec}: {source}"),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Open { source, .. } => Some(source),
            BackendError::BadSpec { .. } | BackendError::SameAddress { .. } => None,
        }
    }
}

/// The devices of a run and the name the run goes by.
#[derive(Debug)]
pub struct DevicePair {
    /// The devices.
    pub devices: Devices,
    /// `a`'s name, and `b`'s after a comma when it is another device.
    pub name: String,
}

/// What `--link` accepts (for help texts).
pub const SPEC_HELP: &str = "fabric (two software HCAs on the in-memory fabric, 10.0.0.1 and \
    10.0.0.2), udp:ADDRESS[:PORT] (the software HCA on a UDP socket; port 0 or none: a free \
    port), verbs:DEVICE (an RDMA device through libibverbs, e.g. verbs:rxe0, verbs:mlx5_0)";

enum Spec {
    Fabric,
    Udp(SocketAddr),
    Verbs(String),
}

fn parse(spec: &str) -> Result<Spec, BackendError> {
    let bad = |reason: &str| BackendError::BadSpec {
        spec: spec.to_owned(),
        reason: reason.to_owned(),
    };
    if spec == "fabric" {
        return Ok(Spec::Fabric);
    }
    if let Some(rest) = spec.strip_prefix("udp:") {
        if let Ok(ip) = rest.parse::<IpAddr>() {
            return Ok(Spec::Udp(SocketAddr::new(ip, 0)));
        }
        return rest
            .parse::<SocketAddr>()
            .map(Spec::Udp)
            .map_err(|_| bad("expected udp:ADDRESS or udp:ADDRESS:PORT ([V6]:PORT)"));
    }
    if let Some(name) = spec.strip_prefix("verbs:") {
        if name.is_empty() {
            return Err(bad("expected verbs:DEVICE"));
        }
        return Ok(Spec::Verbs(name.to_owned()));
    }
    Err(bad(&format!("expected one of: {SPEC_HELP}")))
}

fn open_udp(spec: &str, addr: SocketAddr) -> Result<Arc<UdpDevice>, BackendError> {
    let mut c = UdpDeviceConfig::new(addr.ip());
    c.port = addr.port();
    UdpDevice::open(c)
        .map(Arc::new)
        .map_err(|source| BackendError::Open {
            spec: spec.to_owned(),
            source,
        })
}

/// Opens the devices of a run: `a` from `link`, `b` from `link2` or, without it, the same
/// device as `a` (its QPs talk to each other through it). `fabric` always gives two devices of
/// one fabric (`link2` must be absent or `fabric`).
///
/// # Errors
/// [`BackendError`] for a spec this build does not know or a device that does not open.
pub fn open_pair(link: &str, link2: Option<&str>) -> Result<DevicePair, BackendError> {
    let a_spec = parse(link)?;
    let b_spec = link2.map(parse).transpose()?;
    match (a_spec, b_spec) {
        (Spec::Fabric, None | Some(Spec::Fabric)) => {
            let group = FabricGroup::new(0x5eed, Faults::none());
            let open = |ip: Ipv4Addr| {
                group
                    .add_device(IpAddr::V4(ip), 1500)
                    .map_err(|source| BackendError::Open {
                        spec: link.to_owned(),
                        source,
                    })
            };
            let a: Arc<dyn Verbs> = Arc::new(open(Ipv4Addr::new(10, 0, 0, 1))?);
            let b: Arc<dyn Verbs> = Arc::new(open(Ipv4Addr::new(10, 0, 0, 2))?);
            Ok(pair(a, Some(b)))
        }
        (Spec::Udp(aa), b) => {
            // Each device finds its peer by IP address (`set_peer_port` below): two devices on
            // one address would send each other's packets to one of them.
            if let Some(Spec::Udp(ba)) = &b {
                if ba.ip() == aa.ip() {
                    return Err(BackendError::SameAddress { ip: aa.ip() });
                }
            }
            let a = open_udp(link, aa)?;
            let b = match b {
                None => None,
                Some(Spec::Udp(ba)) => Some(open_udp(link2.unwrap_or_default(), ba)?),
                Some(_) => {
                    return Err(BackendError::BadSpec {
                        spec: link2.unwrap_or_default().to_owned(),
                        reason: "a udp: device pairs with another udp: device".into(),
                    })
                }
            };
            // Devices on ephemeral ports: tell each where the other (and itself) listens.
            let mut all = vec![a.clone()];
            all.extend(b.clone());
            for d in &all {
                for peer in &all {
                    d.set_peer_port(peer.local_addr().ip(), peer.local_addr().port());
                }
            }
            Ok(pair(a, b.map(|b| b as Arc<dyn Verbs>)))
        }
        (Spec::Verbs(name), b) => {
            let open = |spec: &str, name: &str| {
                IbvDevice::open(name)
                    .map(|d| Arc::new(d) as Arc<dyn Verbs>)
                    .map_err(|source| BackendError::Open {
                        spec: spec.to_owned(),
                        source,
                    })
            };
            let a = open(link, &name)?;
            let b = match b {
                None => None,
                Some(Spec::Verbs(bname)) => Some(open(link2.unwrap_or_default(), &bname)?),
                Some(_) => {
                    return Err(BackendError::BadSpec {
                        spec: link2.unwrap_or_default().to_owned(),
                        reason: "a verbs: device pairs with another verbs: device".into(),
                    })
                }
            };
            Ok(pair(a, b))
        }
        (Spec::Fabric, Some(_)) => Err(BackendError::BadSpec {
            spec: link2.unwrap_or_default().to_owned(),
            reason: "fabric gives both devices; give no --link2".into(),
        }),
    }
}

fn pair(a: Arc<dyn Verbs>, b: Option<Arc<dyn Verbs>>) -> DevicePair {
    let name = match &b {
        Some(b) => format!("{},{}", a.name(), b.name()),
        None => a.name(),
    };
    let b = b.unwrap_or_else(|| a.clone());
    DevicePair {
        devices: Devices { a, b },
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two UDP devices on one address are refused up front: each finds its peer by address, so
    /// the run would end in 15 failed cases (RetryExcErr, then WrFlushErr) after about 40 s.
    #[test]
    fn two_udp_devices_on_one_address_are_refused() {
        for (a, b) in [
            ("udp:127.0.0.1", "udp:127.0.0.1"),
            ("udp:127.0.0.1:0", "udp:127.0.0.1:0"),
            ("udp:[::1]:0", "udp:::1"),
        ] {
            let e = open_pair(a, Some(b)).unwrap_err();
            assert!(
                matches!(e, BackendError::SameAddress { .. }),
                "{a} {b}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("--link and --link2 are both on")
                    && text.contains("leave --link2 out"),
                "{text}"
            );
            assert_eq!(text.lines().count(), 1, "{text}");
        }
        // Two addresses, or one device alone, still open.
        let pair = open_pair("udp:127.0.0.1:0", Some("udp:127.0.0.2:0")).unwrap();
        assert!(pair.name.contains(','), "{}", pair.name);
        open_pair("udp:127.0.0.1:0", None).unwrap();
    }
}
