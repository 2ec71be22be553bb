//! Which devices the library lists: `ROCE_DEVICES`, or one per network interface that is up.

use std::net::IpAddr;

use hca::open::DeviceSpec;

/// The environment variable that names the devices: `NAME=SPEC` items separated by commas or
/// white space, `SPEC` as [`hca::open`] parses it (`udp:127.0.0.2`; a link-local IPv6 address
/// with or without its zone, `udp:fe80::1%eth0`, RFC 4007 section 11). Example:
/// `ROCE_DEVICES="rxe0=udp:127.0.0.1 rxe1=udp:192.168.1.5"`.
pub const ROCE_DEVICES: &str = "ROCE_DEVICES";

/// The environment variable that turns sharing off for the library's `udp:` devices: `0`
/// opens each device on a socket of its own (one process per address and port, the port in use
/// otherwise); unset or any other value shares it like rxe does, every process of the host on
/// the same address and port (`hca::link::udp::share`: SO_REUSEPORT(7) with steering by
/// destination QPN, at most 32 processes per device).
pub const SOFT_HCA_SHARE: &str = "SOFT_HCA_SHARE";

/// Whether the library opens its `udp:` devices shared ([`SOFT_HCA_SHARE`]), from the variable's
/// value (`None`: unset). Only `0` turns sharing off.
pub fn share_from(value: Option<&str>) -> bool {
    value.map(str::trim) != Some("0")
}

/// [`share_from`] of this process's environment.
pub fn share() -> bool {
    share_from(std::env::var(SOFT_HCA_SHARE).ok().as_deref())
}

/// The environment variables that set the RDMA CM's REQ / DREQ timer (`librdmacm.so.1`, one
/// `hca::rdma_cm::CmService` per device): `ROCE_CM_RESPONSE_TIMEOUT`, the response timeout code
/// (0..=31: 4.096 µs x 2^code, sent in REQs as both CM response timeouts and used to resend REQs
/// and DREQs; IBTA vol. 1 section 12.7.27), and `ROCE_CM_MAX_RETRIES` (0..=15, the REQ's Max CM
/// Retries). Unset: Linux `cma.c`'s `CMA_CM_RESPONSE_TIMEOUT` 20 (4.3 s) and
/// `CMA_MAX_CM_RETRIES` 15, so a REQ to a dead peer ends in `RDMA_CM_EVENT_UNREACHABLE` after
/// 16 x 4.3 s = 69 s, as with rxe's kernel CM, which offers no such setting; a value that does
/// not parse or is out of range is ignored with a message on stderr.
pub const ROCE_CM_RESPONSE_TIMEOUT: &str = "ROCE_CM_RESPONSE_TIMEOUT";
/// See [`ROCE_CM_RESPONSE_TIMEOUT`].
pub const ROCE_CM_MAX_RETRIES: &str = "ROCE_CM_MAX_RETRIES";

/// The CM's settings from the values of [`ROCE_CM_RESPONSE_TIMEOUT`] and [`ROCE_CM_MAX_RETRIES`]
/// (`None`: unset), over `hca::cm::CmConfig::default()`.
pub fn cm_config_from(
    response_timeout: Option<&str>,
    max_retries: Option<&str>,
) -> hca::cm::CmConfig {
    fn code(var: &str, value: Option<&str>, max: u8) -> Option<u8> {
        let v = value?.trim();
        match v.parse::<u8>() {
            Ok(c) if c <= max => Some(c),
            _ => {
                eprintln!("libibverbs (software HCA): {var}={v:?} ignored (0..={max})");
                None
            }
        }
    }
    let mut c = hca::cm::CmConfig::default();
    if let Some(t) = code(ROCE_CM_RESPONSE_TIMEOUT, response_timeout, 31) {
        c.response_timeout = t;
    }
    if let Some(r) = code(ROCE_CM_MAX_RETRIES, max_retries, 15) {
        c.max_cm_retries = r;
    }
    c
}

/// [`cm_config_from`] of this process's environment.
pub fn cm_config() -> hca::cm::CmConfig {
    cm_config_from(
        std::env::var(ROCE_CM_RESPONSE_TIMEOUT).ok().as_deref(),
        std::env::var(ROCE_CM_MAX_RETRIES).ok().as_deref(),
    )
}

/// The environment variable that chooses who drives the library's software HCAs
/// (`hca::soft::Progress`): `hybrid` (the default: a progress thread, and an `ibv_poll_cq` that
/// finds its CQ empty runs a round on the caller's thread, holding a received message's ACK for
/// the reply at most `hca::soft::ACK_HOLD` while it polls, `ACK_HOLD` + `CALLER_WINDOW` when it
/// stops), `thread` (the thread alone: every
/// datagram wakes it; a received message's ACK leaves at once in a sendmmsg(2) of its own) or
/// `caller` (no thread, as `rdma-perf`'s latency tests: nothing moves unless the program calls
/// `ibv_poll_cq`, so only for programs that busy-poll until they close their device; a passive
/// RDMA WRITE target or a program blocked in `ibv_get_cq_event` stalls).
pub const SOFT_HCA_PROGRESS: &str = "SOFT_HCA_PROGRESS";

/// [`SOFT_HCA_PROGRESS`] from the variable's value (`None`: unset): `caller`, `hybrid` or
/// `thread` (case-insensitive, blanks trimmed); unset, empty or anything else is `hybrid`, with
/// a message on stderr for anything else (a library cannot refuse to open over a typo).
pub fn progress_from(value: Option<&str>) -> hca::soft::Progress {
    use hca::soft::Progress;
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "hybrid") => Progress::Hybrid,
        Some("thread") => Progress::Thread,
        Some("caller") => Progress::Caller,
        Some(other) => {
            eprintln!(
                "libibverbs (software HCA): {SOFT_HCA_PROGRESS}={other:?} is not caller, hybrid \
                 or thread: using hybrid"
            );
            Progress::Hybrid
        }
    }
}

/// [`progress_from`] of this process's environment.
pub fn progress() -> hca::soft::Progress {
    progress_from(std::env::var(SOFT_HCA_PROGRESS).ok().as_deref())
}

/// The environment variable that makes the library print the device's counters (engine:
/// rxe's `hw_counters` names, retransmissions, drops by reason; link; progress) on stderr when
/// the process's last context on it closes (`ibv_close_device`): set to any value. For
/// diagnosing losses and retransmission stalls of unmodified programs.
pub const SOFT_HCA_STATS: &str = "SOFT_HCA_STATS";

/// Prints `verbs`' counters ([`hca::verbs::Verbs::stats`]) on stderr, one `name: value` line
/// each, prefixed with the device's name and the process id.
pub fn dump_stats(verbs: &dyn hca::verbs::Verbs) {
    let Some(lines) = verbs.stats() else {
        return;
    };
    let (name, pid) = (verbs.name(), std::process::id());
    for (what, value) in lines {
        eprintln!("libibverbs (software HCA) stats pid {pid} {name} {what}: {value}");
    }
}

/// One device the library lists: its name (`ibv_get_device_name`) and what it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The name (at most 63 bytes).
    pub name: String,
    /// The software HCA it opens.
    pub spec: DeviceSpec,
}

/// Parses a `ROCE_DEVICES` value. Items that do not parse are skipped with a message on stderr
/// (a library cannot fail `ibv_get_device_list` for a typo in one item).
pub fn parse(value: &str) -> Vec<DeviceConfig> {
    let mut out = Vec::new();
    for item in value
        .split([',', ' ', '\t', '\n'])
        .filter(|s| !s.is_empty())
    {
        let Some((name, spec)) = item.split_once('=') else {
            eprintln!(
                "libibverbs (software HCA): {ROCE_DEVICES}: \"{item}\" is not NAME=udp:ADDRESS"
            );
            continue;
        };
        match spec.parse::<DeviceSpec>() {
            Ok(spec) if !name.is_empty() && name.len() < 64 => out.push(DeviceConfig {
                name: name.to_owned(),
                spec,
            }),
            Ok(_) => eprintln!("libibverbs (software HCA): {ROCE_DEVICES}: bad name \"{name}\""),
            Err(e) => eprintln!("libibverbs (software HCA): {ROCE_DEVICES}: {e}"),
        }
    }
    out
}

/// The devices without configuration: one per interface that is up, `rxe_IFNAME`, on its first
/// IPv4 address (else its first IPv6 one). `interfaces` lists `(name, address)` in the order
/// getifaddrs(3) gives them, only interfaces that are up.
pub fn from_interfaces(interfaces: &[(String, IpAddr)]) -> Vec<DeviceConfig> {
    let mut names: Vec<&str> = Vec::new();
    for (n, _) in interfaces {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    names
        .into_iter()
        .filter_map(|n| {
            let addrs = interfaces.iter().filter(|(m, _)| m == n).map(|(_, a)| *a);
            let ip = addrs
                .clone()
                .find(IpAddr::is_ipv4)
                .or_else(|| addrs.clone().next())?;
            let name = format!("rxe_{n}");
            (name.len() < 64).then(|| DeviceConfig {
                name,
                spec: DeviceSpec::udp(ip),
            })
        })
        .collect()
}

/// The devices this process lists: [`ROCE_DEVICES`] when set, else [`from_interfaces`].
pub fn device_specs(interfaces: impl FnOnce() -> Vec<(String, IpAddr)>) -> Vec<DeviceConfig> {
    match std::env::var(ROCE_DEVICES) {
        Ok(v) => parse(&v),
        Err(_) => from_interfaces(&interfaces()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_unless_turned_off() {
        assert!(share_from(None));
        assert!(share_from(Some("1")));
        assert!(share_from(Some("")));
        assert!(!share_from(Some("0")));
        assert!(!share_from(Some(" 0\n")));
    }

    #[test]
    fn cm_timer_from_the_environment() {
        let d = hca::cm::CmConfig::default();
        assert_eq!(cm_config_from(None, None), d);
        let c = cm_config_from(Some("16"), Some(" 2\n"));
        assert_eq!((c.response_timeout, c.max_cm_retries), (16, 2));
        // Out of range or not a number: the default stays.
        let c = cm_config_from(Some("32"), Some("16"));
        assert_eq!(
            (c.response_timeout, c.max_cm_retries),
            (d.response_timeout, d.max_cm_retries)
        );
        let c = cm_config_from(Some("x"), Some("-1"));
        assert_eq!(
            (c.response_timeout, c.max_cm_retries),
            (d.response_timeout, d.max_cm_retries)
        );
    }

    #[test]
    fn progress_from_the_environment_value() {
        use hca::soft::Progress;
        assert_eq!(progress_from(None), Progress::Hybrid);
        assert_eq!(progress_from(Some("")), Progress::Hybrid);
        assert_eq!(progress_from(Some(" Caller ")), Progress::Caller);
        assert_eq!(progress_from(Some("thread")), Progress::Thread);
        assert_eq!(progress_from(Some("hybrid")), Progress::Hybrid);
        assert_eq!(progress_from(Some("fast")), Progress::Hybrid);
    }

    #[test]
    fn parses_names_and_addresses() {
        let d = parse("rxe0=udp:127.0.0.2, rxe1=udp:[::1]:4791 bad");
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].name, "rxe0");
        assert_eq!(d[0].spec.udp_ip(), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(d[1].spec.udp_ip(), Some("::1".parse().unwrap()));
    }

    #[test]
    fn one_device_per_interface_preferring_ipv4() {
        let ifs = vec![
            ("lo".to_owned(), "::1".parse().unwrap()),
            ("lo".to_owned(), "127.0.0.1".parse().unwrap()),
            ("eth0".to_owned(), "fe80::1".parse().unwrap()),
        ];
        let d = from_interfaces(&ifs);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].name, "rxe_lo");
        assert_eq!(d[0].spec.udp_ip(), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(d[1].name, "rxe_eth0");
    }
}
