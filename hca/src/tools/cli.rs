//! What the command lines of `rdma-perf` and `rdma-pingpong` share: choosing and opening the device (`--link
//! udp:ADDRESS`, on UDP port 4791, the default, `--link vfio:PCI_ADDRESS` with the `--vfio-*` options, or
//! `--link verbs:DEVICE`, an RDMA device through libibverbs), bringing QPs up the way the C tools
//! do, and C `printf` formats the tools' output needs.

use gpu_p2p::{HostMemory, Memory};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

pub use crate::open::DeviceSpec;
use crate::open::{open, LinkForms, OpenOptions};
use crate::soft::{DeviceError, Progress};
use crate::tools::oob::OobTimeouts;
use crate::verbs::connect::{self, ConnectAttr};
use crate::verbs::Verbs;
use crate::{AccessFlags, AhAttr, Gid, MemoryRegion, PathMtu, PdHandle, QpState, QpType};

/// A one-line error for the user; `main` prints it after the tool's name and exits with 1.
#[derive(Debug)]
pub struct Fail(pub String);

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

/// `Err(Fail(..))` from a format string (the tools import it as `fail!`).
#[macro_export]
macro_rules! tool_fail {
    ($($t:tt)*) => { Err($crate::tools::cli::Fail(format!($($t)*))) };
}
use crate::tool_fail as fail;

/// Who drives the device's engine (`--progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressArg {
    /// A progress thread per device.
    Thread,
    /// The tool's polling loop drives the engine (no extra thread).
    Caller,
}

impl From<ProgressArg> for Progress {
    fn from(p: ProgressArg) -> Self {
        match p {
            ProgressArg::Thread => Progress::Thread,
            ProgressArg::Caller => Progress::Caller,
        }
    }
}

/// The device of the tools, as `--link` says: the verbs of any backend through [`Verbs`]
/// (`Deref`), progress included ([`Verbs::progress`], [`Verbs::progress_while`]).
#[derive(Debug, Clone)]
pub struct Dev {
    verbs: Arc<dyn Verbs>,
}

impl std::ops::Deref for Dev {
    type Target = dyn Verbs;
    fn deref(&self) -> &(dyn Verbs + 'static) {
        &*self.verbs
    }
}

impl Dev {
    /// The device as a shared [`Verbs`] object (for a [`crate::rdma_cm::CmService`]).
    pub fn verbs(&self) -> Arc<dyn Verbs> {
        self.verbs.clone()
    }

    /// The default GID index (the tools' `-g` / `-x` when not given): the software device's
    /// one GID, a libibverbs device's first RoCEv2 GID ([`Verbs::default_gid`]).
    pub fn gid_index(&self) -> u32 {
        self.verbs.default_gid().0
    }

    /// `len` bytes for the tool's MR buffer, zero-filled: memory the device sends from without a
    /// copy where it has some ([`Verbs::alloc_memory`]: the UMEM of an AF_XDP link), else (or
    /// when that is used up) page-aligned host memory ([`HostMemory`]).
    ///
    /// # Errors
    /// The host allocation failed (mmap(2)), as text.
    pub fn alloc_memory(&self, len: usize) -> Result<Arc<dyn Memory>, String> {
        if let Some(Ok(m)) = self.verbs.alloc_memory(len) {
            return Ok(m);
        }
        HostMemory::new(len)
            .map(|m| Arc::new(m) as Arc<dyn Memory>)
            .map_err(|e| e.to_string())
    }

    /// Registers `memory` (whole) as the MR `iova ..` through [`Verbs::reg_mr`]: a software
    /// device maps it into the IOMMU on a VFIO link; a libibverbs device registers it with
    /// ibv_reg_mr_iova(3).
    ///
    /// # Errors
    /// As [`Verbs::reg_mr`].
    pub fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, DeviceError> {
        let len = memory.len();
        self.verbs.reg_mr(pd, memory, 0, len, iova, access)
    }

    /// Runs `f` (a blocking out-of-band exchange) while the device keeps making progress: a
    /// software device with caller-driven progress needs a helper thread for it; a hardware
    /// device progresses by itself.
    pub fn progress_during<R>(&self, f: impl FnOnce() -> R) -> R {
        self.verbs.progress_during(f)
    }

    /// Keeps a software device answering for `linger` after a run, as TCP's TIME-WAIT does: the
    /// ACK of the peer's last message may be lost (its send then completes only when it arrives),
    /// and only a QP that still exists can acknowledge the peer's retransmission of it (a
    /// duplicate request is ACKed again, IBTA vol. 1 §9.7.5.1). Any device's QPs answer only
    /// while they exist (a hardware HCA's too), so every device lingers; a caller-driven
    /// software device keeps its engine running meanwhile.
    pub fn linger(&self, linger: std::time::Duration) {
        self.progress_during(|| std::thread::sleep(linger));
    }
}

/// The UDP port the peers of these tools send RoCEv2 packets to: 4791 (IBTA vol. 1 Annex
/// A17.2.2). perftest's and ibv_*_pingpong's TCP exchanges carry a GID and a QPN but no UDP
/// port, so a peer cannot learn any other.
pub const ROCEV2_PORT: u16 = crate::soft::ROCEV2_PORT;

/// The `--link` forms the tools take: `udp:ADDRESS` (no port: see [`ROCEV2_PORT`]),
/// `vfio:PCI_ADDRESS`, `verbs:DEVICE`.
pub const TOOL_LINKS: LinkForms = LinkForms {
    udp_port: false,
    vfio: LinkForms::PARSED.vfio,
    verbs: true,
    xdp: LinkForms::PARSED.xdp,
};

/// Parses a `--link` / `-d` value (see [`DeviceSpec`]) for `rdma-perf` / `rdma-pingpong`.
///
/// # Errors
/// One line: the [`crate::open::DeviceSpecError`]'s message for [`TOOL_LINKS`] (it names the
/// forms the tools take, and no port); for a bare word such as `mlx5_0` (perftest's
/// `-d` habit) it suggests `--link verbs:mlx5_0`; a `udp:ADDRESS:PORT` whose port is not
/// [`ROCEV2_PORT`] is refused, since the peer would send to 4791 all the same and the run would
/// end in "transport retry counter exceeded".
pub fn parse_link(text: &str) -> Result<DeviceSpec, Fail> {
    let spec: DeviceSpec = text.parse().map_err(|e: crate::open::DeviceSpecError| {
        let device_name = !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if device_name {
            Fail(format!(
                "bad link \"{text}\": not an address, nor udp:ADDRESS, vfio:PCI_ADDRESS or \
                 verbs:DEVICE; for the RDMA device {text} give --link verbs:{text}"
            ))
        } else {
            Fail(e.message(TOOL_LINKS))
        }
    })?;
    match spec {
        DeviceSpec::Udp {
            ip,
            port: Some(port),
        } if port != ROCEV2_PORT => fail!(
            "bad link \"{text}\": port {port} cannot work: perftest and ibv_*_pingpong peers \
             always send to UDP port {ROCEV2_PORT} (their exchange carries no port); give each \
             side its own address instead, e.g. udp:{} here and udp:{} on the other side",
            example_ip(ip, 0),
            example_ip(ip, 1)
        ),
        DeviceSpec::Fabric => fail!(
            "bad link \"{text}\": the in-memory fabric has no peer outside this process; give \
             udp:ADDRESS, vfio:PCI_ADDRESS, xdp:IFNAME or verbs:DEVICE"
        ),
        DeviceSpec::Udp { ip, port: None } => Ok(DeviceSpec::udp(ip)),
        spec => Ok(spec),
    }
}

/// `ip` for `n == 0`, and for `n == 1` another loopback address (127.0.0.2 after 127.0.0.1)
/// or, for any other address, `ANOTHER_ADDRESS`: the examples of [`parse_link`]'s message.
fn example_ip(ip: IpAddr, n: u8) -> String {
    match (ip, n) {
        (ip, 0) => ip.to_string(),
        (IpAddr::V4(v4), _) if v4.is_loopback() => {
            let [a, b, c, d] = v4.octets();
            Ipv4Addr::new(a, b, c, if d == 2 { 1 } else { 2 }).to_string()
        }
        _ => "ANOTHER_ADDRESS".into(),
    }
}

/// How long a client's first connection attempt may take before [`connect_noting`] says that
/// nothing listens (and goes on trying).
const FIRST_CONNECT: Duration = Duration::from_millis(100);

/// Runs `exchange`, a client's out-of-band connection (and exchange) that retries refused
/// connections until its `timeouts.connect`, so that a client may be started before its server.
/// Unlike perftest and ibv_*_pingpong, which fail at the first refusal, it keeps trying: when the
/// first attempt is refused, it prints one line to stderr ("nothing listens on HOST:PORT yet;
/// retrying for up to N s") and tries again for the rest of `timeouts.connect`.
///
/// # Errors
/// `exchange`'s; an [`OobError::Connect`](crate::tools::OobError::Connect) counts the time of both
/// tries.
pub fn connect_noting<T>(
    tool: &str,
    host: &str,
    port: u16,
    timeouts: &OobTimeouts,
    exchange: impl Fn(&OobTimeouts) -> Result<T, crate::tools::OobError>,
) -> Result<T, crate::tools::OobError> {
    use crate::tools::OobError;
    use std::io::ErrorKind;
    let start = std::time::Instant::now();
    if timeouts.connect <= FIRST_CONNECT {
        return exchange(timeouts);
    }
    let first = OobTimeouts {
        connect: FIRST_CONNECT,
        ..*timeouts
    };
    match exchange(&first) {
        Err(OobError::Connect { source, .. })
            if matches!(
                source.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock
            ) =>
        {
            let left = timeouts.connect.saturating_sub(start.elapsed());
            if source.kind() == ErrorKind::ConnectionRefused {
                let peer = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                eprintln!(
                    "{tool}: nothing listens on {peer} yet; retrying for up to {} s",
                    timeouts.connect.as_secs()
                );
            }
            let rest = OobTimeouts {
                connect: left.max(Duration::from_millis(1)),
                ..*timeouts
            };
            exchange(&rest).map_err(|e| match e {
                OobError::Connect { peer, source, .. } => OobError::Connect {
                    peer,
                    waited: start.elapsed(),
                    source,
                },
                e => e,
            })
        }
        r => r,
    }
}

/// The line of a server that cannot listen on its TCP port (`-p`), the same for both tools:
/// `Couldn't listen to port PORT: cannot listen on TCP [::]:PORT: ...` (the OS error).
pub fn listen_failed(port: u16, e: &crate::tools::OobError) -> Fail {
    Fail(format!("Couldn't listen to port {port}: {e}"))
}

/// The options of a `--link vfio:` device.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct VfioArgs {
    /// VFIO link: the NIC's IPv4 address (its GID at index 2; the IPv6 link-local GID is at 0
    /// and 1).
    #[arg(long = "vfio-ip", value_name = "IPV4")]
    pub ip: Option<Ipv4Addr>,
    /// VFIO link: a static neighbour (no ARP / Neighbor Discovery for IP); repeatable.
    #[arg(long = "vfio-neigh", value_name = "IP=MAC", value_parser = parse_neighbour)]
    pub neigh: Vec<(IpAddr, [u8; 6])>,
    /// VFIO link: sleep on the NIC's MSI-X receive interrupt when idle instead of busy-polling.
    #[arg(long = "vfio-interrupts")]
    pub interrupts: bool,
}

/// Parses `IP=MAC` (`198.18.0.1=52:54:00:12:34:56`).
pub fn parse_neighbour(text: &str) -> Result<(IpAddr, [u8; 6]), String> {
    let bad =
        || format!("bad neighbour \"{text}\": expected IP=MAC (e.g. 10.0.0.1=52:54:00:12:34:56)");
    let (ip, mac) = text.split_once('=').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|h| {
            if h.len() == 2 {
                u8::from_str_radix(h, 16).ok()
            } else {
                None
            }
        })
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let mac: [u8; 6] = bytes.try_into().map_err(|_| bad())?;
    Ok((ip, mac))
}

/// The source address the kernel's route to `host:port` uses (a UDP `connect`, which sends
/// nothing): the natural device address of a client given no `--link`.
pub fn route_source(host: &str, port: u16) -> Result<IpAddr, Fail> {
    let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return fail!("cannot resolve {host}: {e}"),
    };
    let mut last = None;
    for a in addrs {
        let any: SocketAddr = if a.is_ipv6() {
            "[::]:0".parse().map_err(|_| Fail("address".into()))?
        } else {
            "0.0.0.0:0".parse().map_err(|_| Fail("address".into()))?
        };
        let r = UdpSocket::bind(any)
            .and_then(|s| s.connect(a).map(|_| s))
            .and_then(|s| s.local_addr());
        match r {
            Ok(local) => return Ok(local.ip()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => fail!("no route to {host}: {e}"),
        None => fail!("cannot resolve {host}: no address"),
    }
}

/// [`crate::engine::EngineConfig::ack_delay`] of a caller-driven UDP device: the tools poll their
/// CQ in a loop (each poll runs a progress round), so an ACK held this long for the reply the
/// program is about to post leaves with it, and goes alone from the poll loop otherwise. Far
/// below any local ACK timeout the tools set (perftest's default 14: 67 ms).
const CALLER_ACK_DELAY: std::time::Duration = std::time::Duration::from_micros(20);

/// Opens the device on `spec` through [`crate::open::open`] (`vfio` gives the options of a VFIO
/// link; other links ignore them; `progress` and `window_budget` apply to the software device
/// only).
pub fn open_device(
    spec: DeviceSpec,
    progress: Progress,
    window_budget: Option<u32>,
    vfio: &VfioArgs,
) -> Result<Dev, Fail> {
    open_device_dcqcn(spec, progress, window_budget, vfio, None)
}

/// [`open_device`] with DCQCN's reaction point on every QP of a software device
/// ([`crate::engine::EngineConfig::dcqcn`]; `None`: off, the engine's default). `rdma-perf
/// --dcqcn MBPS` passes [`crate::engine::DcqcnParams::paper_scaled`] at that line rate with
/// `pace_at_max_rate`. A libibverbs device ignores it (its NIC has its own congestion control).
pub fn open_device_dcqcn(
    spec: DeviceSpec,
    progress: Progress,
    window_budget: Option<u32>,
    vfio: &VfioArgs,
    dcqcn: Option<crate::engine::DcqcnParams>,
) -> Result<Dev, Fail> {
    let drop = crate::tools::fault::drop_hook_from_env()
        .map_err(|reason| Fail(format!("cannot open device {spec}: {reason}")))?;
    let mut options = OpenOptions {
        progress,
        window_budget,
        drop,
        vfio_ipv4: vfio.ip,
        vfio_neighbours: vfio.neigh.clone(),
        vfio_interrupts: vfio.interrupts,
        ..OpenOptions::default()
    };
    options.engine.dcqcn = dcqcn;
    if progress == Progress::Caller && matches!(spec, DeviceSpec::Udp { .. }) {
        options.engine.ack_delay = CALLER_ACK_DELAY;
    }
    let verbs = open(&spec, &options).map_err(|e| match spec {
        // IbvDevice's errors name the device already (`device verbs:rxe0: ...`).
        DeviceSpec::Verbs(_) => Fail(format!("cannot open {e}")),
        _ => Fail(format!("cannot open device {spec}: {e}")),
    })?;
    Ok(Dev { verbs })
}

/// `--stats`: the software device's counters, to stderr (a hardware device keeps its own in
/// sysfs: `/sys/class/infiniband/DEVICE/ports/1/counters` and `hw_counters`).
pub fn print_stats(dev: &Dev) {
    match dev.stats() {
        Some(lines) => {
            for (name, value) in lines {
                eprintln!("{name}: {value}");
            }
        }
        None => eprintln!(
            "{}: no software counters (see /sys/class/infiniband/<device>/ports/1/counters)",
            dev.name()
        ),
    }
}

/// Checks a GID index option against the device's table (a software device has its GIDs at
/// 0 ..= 2 on a VFIO link, one at 0 on UDP; a libibverbs device its port's table).
pub fn check_gid_index(dev: &Dev, index: i64) -> Result<Gid, Fail> {
    match u32::try_from(index).ok().map(|i| dev.query_gid(i)) {
        Some(Ok(e)) => Ok(e.gid),
        _ => {
            let (i, gid) = dev.default_gid();
            fail!(
                "no GID at index {index} of {} (its GID {gid} is at index {i})",
                dev.name()
            )
        }
    }
}

/// The largest `--timeout` (and `rdma-perf -D`) the tools take, seconds: one day. Deadlines are
/// `now + timeout`, and `std::time::Instant` cannot hold one that far off for every value a
/// `u64` can say.
pub const MAX_SECS: u64 = 86_400;

/// Parses a number of seconds from 1 to [`MAX_SECS`] (`--timeout`, `-D`).
pub fn parse_secs(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(s) if (1..=MAX_SECS).contains(&s) => Ok(s),
        _ => Err(format!(
            "\"{text}\" is not a number of seconds from 1 to {MAX_SECS}"
        )),
    }
}

/// The out-of-band timeouts for `--timeout SECS`: connect, accept and each message.
pub fn oob_timeouts(secs: u64) -> OobTimeouts {
    let t = Duration::from_secs(secs.max(1));
    OobTimeouts {
        connect: t,
        accept: t,
        io: t,
    }
}

/// A random 24-bit start PSN, as the C tools pick one (`lrand48() & 0xffffff`), drawn from the
/// OS random source ([`crate::verbs::random::random_psn`]): never a clock, a counter or a hash of
/// them: a start PSN that a third party can guess lets it inject packets that the responder
/// accepts (IBTA vol. 1 §9.7.1; the arithmetic is in [`crate::verbs::qp`]).
pub fn random_psn() -> u32 {
    crate::verbs::random::random_psn()
}

/// A GID as `inet_ntop(AF_INET6)` prints it.
pub fn gid_text(gid: &Gid) -> String {
    Ipv6Addr::from(*gid.as_bytes()).to_string()
}

/// C's `%#0Nx`: zero-padded to `width` characters including a `0x` prefix, which C omits for
/// zero.
pub fn c_alt_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{:0width$}", 0)
    } else {
        let digits = format!("{value:x}");
        format!(
            "0x{}{digits}",
            "0".repeat(width.saturating_sub(2 + digits.len()))
        )
    }
}

/// The path MTU of `bytes` (256, 512, 1024, 2048 or 4096), as the tools' `-m` takes it.
pub fn mtu_of_bytes(bytes: u32) -> Option<PathMtu> {
    PathMtu::ALL.into_iter().find(|m| m.bytes() as u32 == bytes)
}

/// How to connect a QP (the attributes of the tools' `connect` functions).
#[derive(Debug, Clone, Copy)]
pub struct ConnectAttrs {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Path MTU (RC/UC).
    pub mtu: PathMtu,
    /// This QP's first PSN.
    pub my_psn: u32,
    /// Responder resources (RC).
    pub max_dest_rd_atomic: u8,
    /// Initiator depth (RC).
    pub max_rd_atomic: u8,
    /// RNR NAK timer code (RC).
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent (RC).
    pub timeout: u8,
    /// Transport retries (RC).
    pub retry_cnt: u8,
    /// RNR retries (RC; 7 = forever).
    pub rnr_retry: u8,
    /// IP hop limit.
    pub hop_limit: u8,
    /// The local GID index (the tools' `-g` / `-x`).
    pub sgid_index: u8,
    /// IP traffic class.
    pub traffic_class: u8,
}

/// The peer of a QP.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    /// Its QPN.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// Its GID.
    pub gid: Gid,
}

/// RESET -> INIT with the tool's access flags (and Q_Key for UD), through the one bring-up
/// ([`crate::verbs::connect`]).
pub fn qp_to_init(
    dev: &Dev,
    qpn: u32,
    qp_type: QpType,
    access: AccessFlags,
    qkey: u32,
) -> Result<(), Fail> {
    let attr = ConnectAttr {
        qp_type,
        access,
        qkey,
        ..ConnectAttr::default()
    };
    modify_through(dev, qpn, &attr, QpState::Reset, QpState::Init)
}

/// The address vector to `gid` from the device's GID at `sgid_index`.
pub fn av_to(gid: Gid, sgid_index: u8, hop_limit: u8, traffic_class: u8) -> AhAttr {
    ConnectAttr::av(gid, sgid_index, hop_limit, traffic_class)
}

/// INIT -> RTR -> RTS as `pp_connect_ctx` / perftest's `ctx_connect` do, through the one
/// bring-up ([`crate::verbs::connect`]).
pub fn qp_to_rts(dev: &Dev, qpn: u32, a: &ConnectAttrs, remote: &Remote) -> Result<(), Fail> {
    let attr = ConnectAttr {
        qp_type: a.qp_type,
        path_mtu: a.mtu,
        ah_attr: av_to(remote.gid, a.sgid_index, a.hop_limit, a.traffic_class),
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        local_psn: a.my_psn,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        ..ConnectAttr::default()
    };
    modify_through(dev, qpn, &attr, QpState::Init, QpState::Rts)
}

/// Runs [`connect::bring_up`] on `dev`'s QP `qpn`; a refusal is the C tools' line
/// (`Failed to modify QP to RTR: ...`).
fn modify_through(
    dev: &Dev,
    qpn: u32,
    attr: &ConnectAttr,
    from: QpState,
    to: QpState,
) -> Result<(), Fail> {
    connect::bring_up(attr, from, to, |qp, mask| {
        dev.modify_qp(qpn, qp, mask).map(|_| ())
    })
    .map_err(|e| Fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_alternate_hex_like_printf() {
        // printf("%#04x", 0) == "0000", ("%#06x", 0x11) == "0x0011".
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0x6e8d2a, 6), "0x6e8d2a");
        assert_eq!(c_alt_hex(0x1234567, 6), "0x1234567");
        assert_eq!(c_alt_hex(0x7f12_3456_7000, 16), "0x007f1234567000");
    }

    #[test]
    fn link_specs() {
        assert_eq!(
            parse_link("udp:127.0.0.2").unwrap(),
            DeviceSpec::udp("127.0.0.2".parse().unwrap())
        );
        assert_eq!(parse_link("::1").unwrap().to_string(), "udp:::1");
        assert_eq!(
            parse_link("vfio:00:04.0").unwrap().to_string(),
            "vfio:0000:00:04.0"
        );
        let e = parse_link("udp:rxe0").unwrap_err();
        assert!(e.0.contains("bad link \"udp:rxe0\""), "{e}");
        let e = parse_link("rdma:mlx5_0").unwrap_err();
        assert!(e.0.contains("unknown link type \"rdma\""), "{e}");
        // The forms the tools take, with no port (they refuse any but 4791).
        let e = parse_link("tcp:127.0.0.1").unwrap_err();
        let forms = if cfg!(target_os = "linux") {
            "udp:ADDRESS without a port, vfio:PCI_ADDRESS, xdp:IFNAME or verbs:DEVICE"
        } else {
            "udp:ADDRESS without a port or verbs:DEVICE"
        };
        assert_eq!(
            e.0,
            format!("bad link \"tcp:127.0.0.1\": unknown link type \"tcp\" (expected {forms})")
        );
        let e = parse_link("udp:rxe0").unwrap_err();
        assert!(!e.0.contains("PORT"), "{e}");
    }

    #[test]
    fn tool_links() {
        // The RoCEv2 port, implied or spelt out, is the only UDP port.
        for ok in [
            "udp:127.0.0.2",
            "udp:127.0.0.2:4791",
            "127.0.0.2:4791",
            "udp:[::1]:4791",
        ] {
            let s = parse_link(ok).unwrap();
            assert!(
                matches!(
                    s,
                    DeviceSpec::Udp {
                        port: Some(4791),
                        ..
                    }
                ),
                "{ok}"
            );
        }
        let e = parse_link("udp:127.0.0.1:5000").unwrap_err();
        assert!(e.0.contains("port 5000 cannot work"), "{e}");
        assert!(
            e.0.contains("udp:127.0.0.1 here and udp:127.0.0.2 on"),
            "{e}"
        );
        let e = parse_link("udp:[::1]:0").unwrap_err();
        assert!(
            e.0.contains("udp:::1 here and udp:ANOTHER_ADDRESS on"),
            "{e}"
        );
        // perftest's `-d mlx5_0`.
        let e = parse_link("mlx5_0").unwrap_err();
        assert!(e.0.ends_with("give --link verbs:mlx5_0"), "{e}");
        assert!(!parse_link("mlx5/0").unwrap_err().0.contains("verbs:mlx5"));
        assert_eq!(
            parse_link("verbs:mlx5_0").unwrap(),
            DeviceSpec::Verbs("mlx5_0".into())
        );
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_secs("1"), Ok(1));
        assert_eq!(parse_secs("86400"), Ok(MAX_SECS));
        for bad in ["0", "86401", "18446744073709551615", "-1", "1.5", ""] {
            assert!(
                parse_secs(bad).unwrap_err().contains("from 1 to 86400"),
                "{bad}"
            );
        }
    }

    #[test]
    fn neighbours() {
        let (ip, mac) = parse_neighbour("198.18.0.1=52:54:00:12:34:56").unwrap();
        assert_eq!(ip.to_string(), "198.18.0.1");
        assert_eq!(mac, [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert!(parse_neighbour("fe80::1=52:54:00:12:34:56").is_ok());
        for bad in [
            "198.18.0.1",
            "x=52:54:00:12:34:56",
            "10.0.0.1=52:54:00",
            "10.0.0.1=5:54:00:12:34:56",
        ] {
            assert!(
                parse_neighbour(bad).unwrap_err().contains("IP=MAC"),
                "{bad}"
            );
        }
    }

    #[test]
    fn psn_is_24_bits_of_os_random_bytes() {
        // Every bit of the PSN takes both values over 1000 draws (a bit stuck at one value
        // by chance: probability 24 x 2^-999).
        let (mut ones, mut zeros) = (0u32, 0u32);
        for _ in 0..1000 {
            let psn = random_psn();
            assert!(psn <= 0xff_ffff);
            ones |= psn;
            zeros |= !psn & 0xff_ffff;
        }
        assert_eq!((ones, zeros), (0xff_ffff, 0xff_ffff));
    }
}
