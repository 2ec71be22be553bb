//! Opening the devices a suite run uses, from `--link` specs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use hca::fabric::device::FabricGroup;
use hca::fabric::Faults;
use hca::open::{open, DeviceSpec, DeviceSpecError, OpenOptions};
use hca::soft::DeviceError;
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
    /// `--link2-netns`: the namespace could not be entered.
    Netns {
        /// The namespace.
        name: String,
        /// The OS error.
        source: std::io::Error,
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
            BackendError::Netns { name, source } => {
                write!(f, "cannot enter network namespace {name}: {source}")
            }
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Open { source, .. } => Some(source),
            BackendError::Netns { source, .. } => Some(source),
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
    port), verbs:DEVICE (an RDMA device through libibverbs, e.g. verbs:rxe0, verbs:mlx5_0), \
    xdp:IFNAME (the software HCA on an AF_XDP socket; --link only, with a udp:ADDRESS:4791 \
    --link2 across the interface, usually in another namespace: --link2-netns)";

fn parse(spec: &str) -> Result<DeviceSpec, BackendError> {
    let bad = |reason: &str| BackendError::BadSpec {
        spec: spec.to_owned(),
        reason: reason.to_owned(),
    };
    match spec.parse::<DeviceSpec>() {
        Ok(
            s @ (DeviceSpec::Fabric
            | DeviceSpec::Udp { .. }
            | DeviceSpec::Verbs(_)
            | DeviceSpec::Xdp(_)),
        ) => Ok(s),
        Err(DeviceSpecError::BadUdpAddress { .. }) => {
            Err(bad("expected udp:ADDRESS or udp:ADDRESS:PORT ([V6]:PORT)"))
        }
        Err(DeviceSpecError::BadVerbsDevice { .. }) => Err(bad("expected verbs:DEVICE")),
        _ => Err(bad(&format!("expected one of: {SPEC_HELP}"))),
    }
}

/// Devices of a run: a `udp:` name without a port binds a free one (the suite's devices run
/// beside others on the same addresses).
fn options() -> OpenOptions {
    OpenOptions {
        default_udp_port: 0,
        ..OpenOptions::default()
    }
}

fn open_udp(text: &str, spec: &DeviceSpec) -> Result<Arc<dyn Verbs>, BackendError> {
    open(spec, &options()).map_err(|source| BackendError::Open {
        spec: text.to_owned(),
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
    open_pair_in(link, link2, None)
}

/// [`open_pair`], with `b` opened in network namespace `link2_netns` when given
/// ([`hca::link::xdp::with_netns`]): the pair `xdp:IFNAME` and `udp:ADDRESS:4791` across a
/// veth pair between two namespaces (the AF_XDP link sends to port 4791 only, so the UDP
/// device binds it).
///
/// # Errors
/// As [`open_pair`]; [`BackendError::Netns`].
pub fn open_pair_in(
    link: &str,
    link2: Option<&str>,
    link2_netns: Option<&str>,
) -> Result<DevicePair, BackendError> {
    let a_spec = parse(link)?;
    let b_spec = link2.map(parse).transpose()?;
    if let Some(ns) = link2_netns {
        let (Some(b_text), Some(b_spec)) = (link2, &b_spec) else {
            return Err(BackendError::BadSpec {
                spec: ns.to_owned(),
                reason: "--link2-netns needs --link2".into(),
            });
        };
        let a = open_udp(link, &a_spec)?;
        let b =
            hca::link::xdp::with_netns(ns, || open_udp(b_text, b_spec)).map_err(|source| {
                BackendError::Netns {
                    name: ns.to_owned(),
                    source,
                }
            })??;
        return Ok(pair(a, Some(b)));
    }
    match (a_spec, b_spec) {
        (DeviceSpec::Fabric, None | Some(DeviceSpec::Fabric)) => {
            let group = FabricGroup::new(0x5eed, Faults::none());
            let open = |ip: Ipv4Addr| {
                let options = OpenOptions {
                    fabric: Some((group.clone(), IpAddr::V4(ip))),
                    ..options()
                };
                open(&DeviceSpec::Fabric, &options).map_err(|source| BackendError::Open {
                    spec: link.to_owned(),
                    source,
                })
            };
            let a = open(Ipv4Addr::new(10, 0, 0, 1))?;
            let b = open(Ipv4Addr::new(10, 0, 0, 2))?;
            Ok(pair(a, Some(b)))
        }
        (a_spec @ DeviceSpec::Udp { ip: a_ip, .. }, b) => {
            // Each device finds its peer by IP address (`set_peer_port` below): two devices on
            // one address would send each other's packets to one of them.
            if let Some(DeviceSpec::Udp { ip: b_ip, .. }) = &b {
                if *b_ip == a_ip {
                    return Err(BackendError::SameAddress { ip: a_ip });
                }
            }
            let a = open_udp(link, &a_spec)?;
            let b = match b {
                None => None,
                Some(b_spec @ DeviceSpec::Udp { .. }) => {
                    Some(open_udp(link2.unwrap_or_default(), &b_spec)?)
                }
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
                    let (ip, port) = (
                        peer.default_gid().1.to_ip(),
                        peer.udp_port().unwrap_or(4791),
                    );
                    d.set_peer_port(ip, port)
                        .map_err(|source| BackendError::Open {
                            spec: d.name(),
                            source,
                        })?;
                }
            }
            Ok(pair(a, b))
        }
        (a_spec @ DeviceSpec::Xdp(_), Some(b_spec @ DeviceSpec::Udp { .. })) => {
            let a = open_udp(link, &a_spec)?;
            let b = open_udp(link2.unwrap_or_default(), &b_spec)?;
            Ok(pair(a, Some(b)))
        }
        (a_spec @ DeviceSpec::Verbs(_), b) => {
            let open = |text: &str, spec: &DeviceSpec| {
                open(spec, &options()).map_err(|source| BackendError::Open {
                    spec: text.to_owned(),
                    source,
                })
            };
            let a = open(link, &a_spec)?;
            let b = match b {
                None => None,
                Some(b_spec @ DeviceSpec::Verbs(_)) => {
                    Some(open(link2.unwrap_or_default(), &b_spec)?)
                }
                Some(_) => {
                    return Err(BackendError::BadSpec {
                        spec: link2.unwrap_or_default().to_owned(),
                        reason: "a verbs: device pairs with another verbs: device".into(),
                    })
                }
            };
            Ok(pair(a, b))
        }
        (DeviceSpec::Fabric, Some(_)) => Err(BackendError::BadSpec {
            spec: link2.unwrap_or_default().to_owned(),
            reason: "fabric gives both devices; give no --link2".into(),
        }),
        _ => Err(BackendError::BadSpec {
            spec: link.to_owned(),
            reason: format!("expected one of: {SPEC_HELP}"),
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
