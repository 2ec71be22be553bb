//! The `COLL_ROCE_*` environment (see the [transport docs](super#tunables-environment)) and the
//! address a rank binds its device to (see [Addresses](super#addresses)).

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use hca::open::DeviceSpec;
use hca::soft::Progress;

use crate::transport::{SetupContext, TransportError};

/// Settings read from the environment (see the [module docs](super#tunables-environment)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RoceEnv {
    /// `COLL_ROCE_LINK=verbs:DEVICE`: every rank opens that libibverbs device instead of a UDP
    /// device.
    pub(super) verbs: Option<String>,
    /// `COLL_ROCE_LINK=xdp:IFNAME`: the rank opens the software HCA on an AF_XDP socket on that
    /// interface (one rank per interface: the socket takes its queue 0).
    pub(super) xdp: Option<String>,
    pub(super) addrs: Vec<IpAddr>,
    pub(super) port: u16,
    pub(super) qp_timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) progress: Progress,
    /// `COLL_ROCE_WINDOW`: the software HCA's window of unacknowledged packets per QP
    /// ([`hca::engine::EngineConfig::max_unacked_psns`]), before the device shares its budget.
    pub(super) window: Option<u32>,
    /// `COLL_ROCE_ACK_DELAY_US`: how long the software HCA's plain ACK may wait for a request
    /// of its QP (here: the credit) to ride with ([`hca::engine::EngineConfig::ack_delay`]).
    pub(super) ack_delay: Option<std::time::Duration>,
}

pub(super) fn env_error(var: &'static str, value: &str, expected: &str) -> TransportError {
    TransportError::Setup {
        peer: None,
        op: "reading the environment",
        on: format!("{var}={value}"),
        source: io::Error::new(io::ErrorKind::InvalidInput, format!("expected {expected}")),
    }
}

impl RoceEnv {
    pub(super) fn from_env() -> Result<RoceEnv, TransportError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut env = RoceEnv {
            verbs: None,
            xdp: None,
            addrs: Vec::new(),
            port: 0,
            qp_timeout: 17,
            retry_cnt: 7,
            progress: Progress::Caller,
            window: None,
            ack_delay: None,
        };
        if let Some(v) = get("COLL_ROCE_ADDR") {
            for a in v.split(',') {
                let ip = a.trim().parse::<IpAddr>().map_err(|_| {
                    env_error("COLL_ROCE_ADDR", &v, "IP addresses separated by commas")
                })?;
                env.addrs.push(ip);
            }
        }
        if let Some(v) = get("COLL_ROCE_LINK").filter(|v| v.trim() != "udp") {
            match v.trim().parse::<DeviceSpec>() {
                Ok(DeviceSpec::Verbs(name)) => env.verbs = Some(name),
                Ok(DeviceSpec::Xdp(ifname)) => env.xdp = Some(ifname),
                Ok(DeviceSpec::Udp { ip, port }) => {
                    env.addrs = vec![ip];
                    env.port = port.unwrap_or(hca::soft::ROCEV2_PORT);
                }
                _ => {
                    return Err(env_error(
                        "COLL_ROCE_LINK",
                        &v,
                        "verbs:DEVICE, xdp:IFNAME, udp or udp:ADDRESS[:PORT]",
                    ))
                }
            }
        }
        if let Some(v) = get("COLL_ROCE_PORT") {
            env.port = v
                .trim()
                .parse()
                .map_err(|_| env_error("COLL_ROCE_PORT", &v, "a UDP port"))?;
        }
        if let Some(v) = get("COLL_ROCE_TIMEOUT") {
            env.qp_timeout = v
                .trim()
                .parse()
                .ok()
                .filter(|t| (1..=31).contains(t))
                .ok_or_else(|| env_error("COLL_ROCE_TIMEOUT", &v, "1 ..= 31"))?;
        }
        if let Some(v) = get("COLL_ROCE_RETRY_CNT") {
            env.retry_cnt = v
                .trim()
                .parse()
                .ok()
                .filter(|t| *t <= 7)
                .ok_or_else(|| env_error("COLL_ROCE_RETRY_CNT", &v, "0 ..= 7"))?;
        }
        if let Some(v) = get("COLL_ROCE_WINDOW") {
            env.window = Some(
                v.trim()
                    .parse()
                    .ok()
                    .filter(|t| (1..=8192).contains(t))
                    .ok_or_else(|| env_error("COLL_ROCE_WINDOW", &v, "1 ..= 8192 packets"))?,
            );
        }
        if let Some(v) = get("COLL_ROCE_ACK_DELAY_US") {
            let us: u64 = v
                .trim()
                .parse()
                .ok()
                .filter(|t| *t <= 10_000)
                .ok_or_else(|| env_error("COLL_ROCE_ACK_DELAY_US", &v, "0 ..= 10000 us"))?;
            env.ack_delay = Some(std::time::Duration::from_micros(us));
        }
        if let Some(v) = get("COLL_ROCE_PROGRESS") {
            env.progress = match v.trim() {
                "thread" => Progress::Thread,
                "caller" => Progress::Caller,
                _ => return Err(env_error("COLL_ROCE_PROGRESS", &v, "thread or caller")),
            };
        }
        Ok(env)
    }
}

/// The RDMA device this transport's environment (`COLL_ROCE_LINK`, `COLL_ROCE_ADDR`) selects, as
/// a launcher can check it before it starts ranks: `Err` for a malformed variable (the error every
/// rank would fail with), `(Some(device name), _)` for a verbs device, `(None, addresses)` for the
/// UDP device (no addresses: each rank chooses its own, see the [module docs](super#addresses)).
///
/// # Errors
/// [`TransportError::Setup`] naming the variable and what it should hold.
#[cfg(feature = "perf")]
pub(crate) fn device_from_env() -> Result<(Option<String>, Vec<IpAddr>), TransportError> {
    let env = RoceEnv::from_env()?;
    Ok((env.verbs, env.addrs))
}

/// The address rank `ctx.rank` binds its device to (see the [module docs](super#addresses)).
pub(super) fn choose_address(
    ctx: &SetupContext<'_>,
    env: &RoceEnv,
) -> Result<IpAddr, TransportError> {
    if !env.addrs.is_empty() {
        let me = &ctx.cards[ctx.rank];
        let local_rank = ctx.cards[..ctx.rank]
            .iter()
            .filter(|c| c.host_id == me.host_id)
            .count();
        return Ok(env.addrs[local_rank % env.addrs.len()]);
    }
    match ctx.bootstrap_addr {
        Some(ip) if ip.is_loopback() => {
            let n = u32::try_from(ctx.rank + 1)
                .ok()
                .filter(|n| *n < 1 << 24)
                .ok_or_else(|| TransportError::Setup {
                    peer: None,
                    op: "choosing a loopback address",
                    on: format!("rank {}", ctx.rank),
                    source: io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "more ranks than addresses in 127.0.0.0/8",
                    ),
                })?;
            Ok(IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | n)))
        }
        Some(ip) => Ok(ip),
        None => Err(TransportError::Setup {
            peer: None,
            op: "choosing the RoCE address",
            on: format!("rank {}", ctx.rank),
            source: io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "the bootstrap connection has no local address: set COLL_ROCE_ADDR",
            ),
        }),
    }
}
