//! `rdma-perf`: perftest's bandwidth and latency tests (`ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat`, `ib_send_lat`) over the software
//! HCA on a UDP socket.
//!
//! `rdma-perf write-bw [OPTIONS] [SERVER]` is `ib_write_bw [OPTIONS] [SERVER]`: same main options
//! and meaning, server mode when no server is given, the same output (header block, addresses,
//! result columns), and perftest 4.5's out-of-band TCP exchange in its order
//! ([`hca::tools::oob::perftest`]), so that either side can be a real perftest over Linux
//! soft-RoCE. Differences, all because the device is a UDP socket:
//! * `-d` / `--link udp:ADDRESS` names the device by its IP address (its GID, at index 0;
//!   `-x` may only be 0). Without it a client uses the source address of the TCP connection to
//!   the server, and a server the address the client connected to.
//! * `--progress thread|caller`: who drives the device. Bandwidth tests default to a progress
//!   thread, latency tests to the polling loop itself (one thread, as perftest's busy polling);
//!   sides that only wait (the server of write/read/atomic tests) always use a thread.
//! * Every wait is bounded by `--timeout` (default 30 s; the server's wait for the end of the
//!   client's test by ten times that plus `-D`): a silent peer is an error, not a hang. The one
//!   exception is perftest's own: a server waits for its client without limit, unless
//!   `--timeout` is given.
//! * A client whose server does not listen yet keeps trying until `--timeout` (the C tools fail
//!   at once), and says so once on stderr ("nothing listens on HOST:PORT yet").
//! * The server takes IPv4 and IPv6 clients alike (`[::]` with `IPV6_V6ONLY` off; perftest
//!   listens on IPv4 only).
//! * Transports RC and UC (`-c`); perftest's UD, XRC, DC, events, multicast and the like are
//!   not offered. Peak bandwidth over more than 20000 messages is not computed (perftest's own
//!   rule), and over many messages its spans are sampled.
//! * All QPs share one source and one target buffer region (perftest gives each QP its own): the
//!   CPU copies the data here, and per-QP regions would make `-q 64` measure cache misses.

use hca::tool_fail as fail;
use hca::tools::cli as common;
mod report;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpu_p2p::Memory;
use hca::soft::Progress;
use hca::tools::oob::perftest::{
    BwReport, KeyFormat, PerftestConn, PerftestDest, PerftestListener, PerftestTest,
    DEFAULT_CACHE_LINE_SIZE, DEFAULT_CYCLE_BUFFER,
};
use hca::{
    AccessFlags, CqHandle, MemoryRegion, PathMtu, PdHandle, QpCap, QpInitAttr, QpType, RecvWr,
    SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use common::{DeviceSpec, Fail, ProgressArg};
use report::{Bw, RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT, RESULT_FMT_LAT_DUR, RESULT_LINE};

/// perftest's `MAX_SIZE`: the largest message of `-a`, 8 MiB.
const MAX_SIZE: u64 = 8 << 20;
/// `MSG_SIZE_CQ_MOD_LIMIT`: above it CQ moderation is off unless `-Q` asks for it.
const CQ_MOD_LIMIT: u64 = 8192;
/// Where the MR starts in the I/O virtual address space (an address like perftest's buffers).
const IOVA: u64 = 0x7f3a_0000_0000;
/// Messages above which perftest computes no peak (`iters > 20000`).
const NO_PEAK_ITERS: u64 = 20_000;
/// `--timeout` when not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Parser, Debug)]
#[command(
    name = "rdma-perf",
    version,
    about = "perftest's RDMA bandwidth and latency tests over the software RoCE HCA"
)]
struct Cli {
    #[command(subcommand)]
    test: TestCmd,
}

#[derive(Subcommand, Debug)]
enum TestCmd {
    /// RDMA WRITE bandwidth (ib_write_bw).
    WriteBw(Args),
    /// RDMA READ bandwidth (ib_read_bw).
    ReadBw(Args),
    /// SEND bandwidth (ib_send_bw).
    SendBw(Args),
    /// Atomic (fetch-and-add or compare-and-swap) rate (ib_atomic_bw).
    AtomicBw(Args),
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    WriteLat(Args),
    /// RDMA READ latency (ib_read_lat).
    ReadLat(Args),
    /// SEND ping-pong latency (ib_send_lat).
    SendLat(Args),
}

#[derive(clap::Args, Debug, Clone)]
struct Args {
    /// The server to connect to; none: be the server and wait for a client.
    server: Option<String>,
    /// Size of message to exchange, bytes (default 65536 for bandwidth, 2 for latency tests).
    #[arg(short = 's', long)]
    size: Option<u64>,
    /// Number of exchanges (default 5000 for write-bw, else 1000).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run sizes from 2 till 2^23.
    #[arg(short = 'a', long)]
    all: bool,
    /// Num of QPs running in the process.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// MTU size: 256 - 4096 (default: the port's active MTU).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// Listen on / connect to TCP port PORT.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Run the test for SECS seconds (1 to 86400).
    #[arg(short = 'D', long = "duration", value_name = "SECS", value_parser = common::parse_secs)]
    duration: Option<u64>,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// GID index of the device (a UDP device has one GID, at 0; a VFIO device its IPv6
    /// link-local GID at 0 and 1 and its IPv4 one at 2; a verbs device its port's table). Default: the
    /// device's GID (on a verbs device its first IPv4-mapped RoCEv2 GID).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<i64>,
    /// The device: `udp:ADDRESS`, `vfio:PCI_ADDRESS`, `xdp:IFNAME` or `verbs:DEVICE` (same as --link; an RDMA
    /// device such as mlx5_0 is `verbs:mlx5_0`).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
    /// The device: `udp:ADDRESS`, the local address of a UDP socket on port 4791 (the default,
    /// from the out-of-band connection; no other port: the peer always sends to 4791, so two tools on one
    /// host need two addresses, e.g. udp:127.0.0.1 and udp:127.0.0.2); `vfio:PCI_ADDRESS`, a virtio-net NIC bound to
    /// vfio-pci that this process drives (see the --vfio-* options); `xdp:IFNAME`, an AF_XDP
    /// socket on that interface with an XDP program steering RoCEv2 to it (root); or `verbs:DEVICE`, an RDMA
    /// device as ibv_devices lists it (`rxe0`, `mlx5_0`) through rdma-core's libibverbs.
    #[arg(
        long,
        value_name = "udp:ADDRESS|vfio:PCI_ADDRESS|xdp:IFNAME|verbs:DEVICE"
    )]
    link: Option<String>,
    #[command(flatten)]
    vfio: common::VfioArgs,
    /// Connection type: RC or UC.
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    connection: String,
    /// Size of the send queue (default 128 for bandwidth, 1 for latency tests).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Receive queue depth of SEND tests.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: u32,
    /// Generate a completion every N work requests (default 100; 1 above 8 KiB messages).
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// Number of outstanding READ / atomic requests (default the device's maximum).
    #[arg(short = 'o', long = "outs")]
    outs: Option<u16>,
    /// Atomic type: FETCH_AND_ADD (default) or CMP_AND_SWAP.
    #[arg(short = 'A', long = "atomic_type")]
    atomic_type: Option<String>,
    /// Max size of message to be sent inline.
    #[arg(short = 'I', long = "inline_size")]
    inline_size: Option<u32>,
    /// QP timeout (local ACK timeout) as perftest's `-u`: 4.096 us x 2^timeout, 0 ..= 31
    /// (0: infinite, IBTA vol. 1 §9.7.6.1.3); retried 7 times before RETRY_EXC_ERR.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// Who drives the device (default: thread for bandwidth, caller for latency tests).
    #[arg(long, value_enum)]
    progress: Option<ProgressArg>,
    /// Longest wait for the peer, seconds (1 to 86400; default 30): connecting, each TCP
    /// message, each completion. A server waits for its client without limit, as perftest's
    /// does, unless --timeout is given: then it gives up after SECS.
    #[arg(long, value_name = "SECS", value_parser = common::parse_secs)]
    timeout: Option<u64>,
    /// Print the device's engine, link and progress counters to stderr at the end, also when the
    /// test fails (a completion error, a peer gone): they tell where packets went.
    #[arg(long)]
    stats: bool,
    /// Connect with RDMA CM as perftest's -R / --rdma_cm: the messages travel on an RC QP
    /// connected by RDMA CM to SERVER's address and port -p (no TCP), and the test's QPs are
    /// connected by RDMA CM too (RC only; needs --link).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Packets in flight the device allows across its QPs (each QP's window is this over the
    /// number of QPs, 16 ..= 128; default: from the socket receive buffer).
    #[arg(long = "window-budget", value_name = "PACKETS")]
    window_budget: Option<u32>,
    /// DCQCN (Zhu et al., SIGCOMM 2015) on every QP of a software device: the reaction point
    /// with the paper's parameters scaled in proportion to the line rate (rates, timers:
    /// `hca::engine::DcqcnParams::paper_scaled`), for a line rate of MBPS
    /// Mb/s (1 to 400000), at which the QPs are also paced before the first CNP (a UDP link
    /// has no line rate of its own), with a burst allowance of 2 ms at the line rate (at least
    /// 4 KiB). Off by default: CNPs are counted and ignored.
    #[arg(long, value_name = "MBPS", value_parser = clap::value_parser!(u64).range(1..=400_000))]
    dcqcn: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bw,
    Lat,
}

/// Everything the test needs, resolved as perftest's parser does.
#[derive(Debug, Clone)]
struct Params {
    test: PerftestTest,
    verb: Verb,
    kind: Kind,
    server: Option<String>,
    size: u64,
    iters: u64,
    all: bool,
    qps: u32,
    mtu: Option<PathMtu>,
    port: u16,
    duration: Option<u64>,
    gbits: bool,
    /// `-x`; `None`: the device's GID.
    gid_index: Option<i64>,
    link: Option<DeviceSpec>,
    vfio: common::VfioArgs,
    qp_type: QpType,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
    outs: Option<u16>,
    fetch_add: bool,
    inline_size: u32,
    qp_timeout: u8,
    progress: Progress,
    /// `--timeout`, or [`DEFAULT_TIMEOUT`].
    timeout: Duration,
    /// How long a server waits for its client: `--timeout` when given, else without limit.
    accept: Option<Duration>,
    stats: bool,
    window_budget: Option<u32>,
    /// `--dcqcn`: the line rate, bit/s.
    dcqcn: Option<u64>,
    /// `-R`: RDMA CM instead of TCP.
    rdma_cm: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = resolve(&cli.test).and_then(|p| run(&p));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn resolve(cmd: &TestCmd) -> Result<Params, Fail> {
    let (test, verb, kind, a) = match cmd {
        TestCmd::WriteBw(a) => (PerftestTest::WriteBw, Verb::Write, Kind::Bw, a),
        TestCmd::ReadBw(a) => (PerftestTest::ReadBw, Verb::Read, Kind::Bw, a),
        TestCmd::SendBw(a) => (PerftestTest::SendBw, Verb::Send, Kind::Bw, a),
        TestCmd::AtomicBw(a) => (PerftestTest::AtomicBw, Verb::Atomic, Kind::Bw, a),
        TestCmd::WriteLat(a) => (PerftestTest::WriteLat, Verb::Write, Kind::Lat, a),
        TestCmd::ReadLat(a) => (PerftestTest::ReadLat, Verb::Read, Kind::Lat, a),
        TestCmd::SendLat(a) => (PerftestTest::SendLat, Verb::Send, Kind::Lat, a),
    };
    let qp_type = match a.connection.to_ascii_uppercase().as_str() {
        "RC" => QpType::Rc,
        "UC" => QpType::Uc,
        other => return fail!("connection type {other} is not supported (RC or UC)"),
    };
    if qp_type == QpType::Uc && matches!(verb, Verb::Read | Verb::Atomic) {
        return fail!("RDMA READ and atomics need RC (-c RC)");
    }
    let mut size = a.size.unwrap_or(match kind {
        Kind::Bw => 65536,
        Kind::Lat => 2,
    });
    if verb == Verb::Atomic {
        if a.all {
            return fail!("-a is not available for atomics (their size is 8 bytes)");
        }
        size = 8;
    }
    if size == 0 || size > MAX_SIZE {
        return fail!("Size must be between 1 and {MAX_SIZE}");
    }
    let iters = a.iters.unwrap_or(if test == PerftestTest::WriteBw {
        5000
    } else {
        1000
    });
    if !(5..=100_000_000).contains(&iters) {
        return fail!("Iteration num should be between 5 and 100000000");
    }
    if a.qps == 0 || a.qps > 16384 {
        return fail!("Num of QPs should be between 1 and 16384");
    }
    if kind == Kind::Lat && a.qps != 1 {
        return fail!("latency tests run on one QP (-q 1)");
    }
    if a.all && a.duration.is_some() {
        return fail!("-a and -D cannot be combined");
    }
    if a.duration == Some(0) {
        return fail!("Duration must be at least 1 second");
    }
    let mtu = match a.mtu {
        None => None,
        Some(m) => match common::mtu_of_bytes(m) {
            Some(m) => Some(m),
            None => return fail!("Invalid MTU {m}: must be 256, 512, 1024, 2048 or 4096"),
        },
    };
    let link = match (&a.link, &a.ib_dev) {
        (Some(l), _) | (None, Some(l)) => Some(common::parse_link(l)?),
        (None, None) => None,
    };
    let tx_depth = a.tx_depth.unwrap_or(match kind {
        Kind::Bw => 128,
        Kind::Lat => 1,
    });
    if !(1..=15000).contains(&tx_depth) {
        return fail!("TX depth should be between 1 and 15000");
    }
    if !(1..=16384).contains(&a.rx_depth) {
        return fail!("RX depth should be between 1 and 16384");
    }
    let cq_mod_asked = a.cq_mod.is_some();
    let mut cq_mod = a.cq_mod.unwrap_or(100);
    if !(1..=1024).contains(&cq_mod) {
        return fail!("CQ moderation should be between 1 and 1024");
    }
    if size > CQ_MOD_LIMIT && !a.all && !cq_mod_asked {
        cq_mod = 1;
    }
    cq_mod = cq_mod.min(tx_depth);
    let fetch_add = match a.atomic_type.as_deref() {
        None | Some("FETCH_AND_ADD") => true,
        Some("CMP_AND_SWAP") => false,
        Some(other) => return fail!("bad atomic type {other}: FETCH_AND_ADD or CMP_AND_SWAP"),
    };
    let inline_size = match verb {
        Verb::Read | Verb::Atomic => 0,
        _ => a.inline_size.unwrap_or(match (kind, verb) {
            (Kind::Lat, Verb::Write) => 220,
            (Kind::Lat, _) => 236,
            _ => 0,
        }),
    };
    if inline_size > 512 {
        return fail!("inline size {inline_size} above the device's maximum (512)");
    }
    if a.rdma_cm && qp_type != QpType::Rc {
        return fail!("UC is not supported in librdmacm (-R takes RC only)");
    }
    if a.rdma_cm && a.link.is_none() && a.ib_dev.is_none() {
        return fail!("-R needs the device: give --link udp:ADDRESS");
    }
    let server_waits = a.server.is_none()
        && matches!(
            test,
            PerftestTest::WriteBw
                | PerftestTest::ReadBw
                | PerftestTest::AtomicBw
                | PerftestTest::ReadLat
        );
    let progress = match (server_waits, a.progress, kind) {
        (true, _, _) => Progress::Thread,
        (false, Some(p), _) => p.into(),
        // The CM service would otherwise poll the device every few milliseconds.
        (false, None, _) if a.rdma_cm => Progress::Thread,
        (false, None, Kind::Bw) => Progress::Thread,
        (false, None, Kind::Lat) => Progress::Caller,
    };
    Ok(Params {
        test,
        verb,
        kind,
        server: a.server.clone(),
        size,
        iters,
        all: a.all,
        qps: a.qps,
        mtu,
        port: a.port,
        duration: a.duration,
        gbits: a.report_gbits,
        gid_index: a.gid_index,
        link,
        vfio: a.vfio.clone(),
        qp_type,
        tx_depth,
        rx_depth: a.rx_depth + a.rx_depth % 2,
        cq_mod,
        outs: a.outs,
        fetch_add,
        inline_size,
        qp_timeout: a.qp_timeout,
        progress,
        timeout: a.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        accept: a.timeout.map(Duration::from_secs),
        stats: a.stats,
        window_budget: a.window_budget,
        dcqcn: a.dcqcn.map(|m| m * 1_000_000),
        rdma_cm: a.rdma_cm,
    })
}

/// One side's verbs objects.
struct Res {
    dev: common::Dev,
    /// Kept for the objects' lifetime (perftest frees them in `destroy_ctx`).
    _pd: PdHandle,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    qpns: Vec<u32>,
    mem: Arc<dyn Memory>,
    mr: MemoryRegion,
    /// Bytes of one buffer region (`BUFF_SIZE(size, cycle_buffer)`): every QP sends from region
    /// 0 and is written / read / sent to in region 1. (perftest gives each QP its own pair; with
    /// no hardware doing the copies here, one pair keeps the memory footprint, and the cache
    /// misses of the copies, independent of the number of QPs.)
    region: u64,
    out_reads: u16,
    /// The local GID index.
    gid_index: i64,
}

impl Res {
    /// Where QP `qp` sends from (RDMA READ: reads into).
    fn local(&self, _qp: usize) -> u64 {
        self.mr.iova()
    }

    /// Where the peer's QP `qp` writes, reads and sends to.
    fn target(&self, _qp: usize) -> u64 {
        self.mr.iova() + self.region
    }

    /// [`Res::target`] as a byte offset in the buffer.
    fn target_offset(&self, _qp: usize) -> usize {
        self.region as usize
    }
}

/// Opens the device of `spec` and checks `-x` and `-m` against it.
fn open_checked(
    p: &Params,
    spec: &DeviceSpec,
) -> Result<(common::Dev, i64, hca::Gid, PathMtu), Fail> {
    // Paced at the line rate from the start, with a burst allowance of 2 ms at the line rate
    // (at least 4 KiB): the progress thread's poll(2) wakes it with a resolution of 1 ms.
    let dcqcn = p.dcqcn.map(|line| hca::engine::DcqcnParams {
        pace_at_max_rate: true,
        pace_burst: (line / 8 / 500).max(4096),
        ..hca::engine::DcqcnParams::paper_scaled(line)
    });
    let dev = common::open_device_dcqcn(spec.clone(), p.progress, p.window_budget, &p.vfio, dcqcn)?;
    let gid_index = p.gid_index.unwrap_or(i64::from(dev.gid_index()));
    let gid = common::check_gid_index(&dev, gid_index)?;
    let port_mtu = dev.query_port().active_mtu;
    let local_mtu = p.mtu.unwrap_or(port_mtu);
    if local_mtu > port_mtu {
        return fail!(
            "MTU {} is above the port's active MTU {} (the link MTU of {})",
            local_mtu.bytes(),
            port_mtu.bytes(),
            dev.name()
        );
    }
    Ok((dev, gid_index, gid, local_mtu))
}

/// The out-of-band timeouts of a run: `--timeout` (default 30 s) for connecting and each
/// message; a server's wait for its client as [`Params::accept`] says (`Duration::MAX`, no
/// limit, without `--timeout`).
fn oob_timeouts(p: &Params) -> hca::tools::oob::OobTimeouts {
    hca::tools::oob::OobTimeouts {
        accept: p.accept.unwrap_or(Duration::MAX),
        ..common::oob_timeouts(p.timeout.as_secs())
    }
}

fn run(p: &Params) -> Result<(), Fail> {
    if p.rdma_cm {
        return run_rdma_cm(p);
    }
    let t = oob_timeouts(p);
    // With --link the device is known before any peer: open it and check -x / -m first, as
    // perftest does, so that a bad flag fails at once instead of after a peer connects.
    let early = match &p.link {
        Some(spec) => Some(open_checked(p, spec)?),
        None => None,
    };
    let (mut conn, local_ip) = match &p.server {
        Some(host) => {
            let conn = common::connect_noting(env!("CARGO_BIN_NAME"), host, p.port, &t, |t| {
                PerftestConn::connect(host, p.port, KeyFormat::WithGid, t)
            })
            .map_err(|e| Fail(format!("Unable to init the socket connection: {e}")))?;
            let ip = conn.local_addr().map(|a| a.ip());
            (conn, ip)
        }
        None => {
            // Listen first: a port in use is an error without a banner promising a wait.
            // IPv4 and IPv6 clients alike (perftest: IPv4 only).
            let mut listener = PerftestListener::bind_any(p.port, t)
                .map_err(|e| common::listen_failed(p.port, &e))?;
            // Connections refused before the client (one line each), under the tool's name.
            listener.set_log(hca::tools::oob::stderr_logger(env!("CARGO_BIN_NAME")));
            println!();
            println!("************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            let conn = listener
                .accept(KeyFormat::WithGid)
                .map_err(|e| Fail(format!("Unable to init the socket connection: {e}")))?;
            let ip = conn.local_addr().map(|a| a.ip());
            (conn, ip)
        }
    };
    let spec = match (p.link.clone(), local_ip) {
        (Some(s), _) => s,
        (None, Some(ip)) => DeviceSpec::udp(match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        }),
        (None, None) => return fail!("cannot tell which local address to use: give --link"),
    };
    let (dev, gid_index, gid, local_mtu) = match early {
        Some(opened) => opened,
        None => open_checked(p, &spec)?,
    };
    let pre = conn
        .preamble(DEFAULT_CYCLE_BUFFER, DEFAULT_CACHE_LINE_SIZE, local_mtu)
        .map_err(|e| {
            Fail(format!(
                "Failed to exchange data between server and clients: {e}"
            ))
        })?;
    let mut res = setup(p, dev, pre.cycle_buffer.max(1) as u64)?;
    res.gid_index = gid_index;
    let my: Vec<PerftestDest> = res
        .qpns
        .iter()
        .enumerate()
        .map(|(i, &qpn)| {
            Ok(PerftestDest {
                lid: 0,
                out_reads: res.out_reads,
                qpn,
                psn: common::random_psn(),
                rkey: res.mr.rkey(),
                vaddr: res.target(i),
                gid,
                srqn: 0,
            })
        })
        .collect::<Result<_, Fail>>()?;
    print_test_info(p, &spec, pre.mtu, &res);
    let oob = |e: hca::tools::OobError| {
        Fail(format!(
            "Failed to exchange data between server and clients: {e}"
        ))
    };
    // Progress meanwhile: the peer may resolve our address (ARP / Neighbor Discovery, answered
    // by a VFIO link's own progress) while it connects.
    let rem = res
        .dev
        .progress_during(|| conn.exchange_dests(p.test, &my))
        .map_err(oob)?;
    if rem[0].gid.is_ipv4_mapped() != my[0].gid.is_ipv4_mapped() {
        return fail!(
            "Found Incompatibility issue with GID types: local {} remote {} (use the same IP \
             version on both sides)",
            common::gid_text(&my[0].gid),
            common::gid_text(&rem[0].gid)
        );
    }
    for (i, (&qpn, r)) in res.qpns.iter().zip(&rem).enumerate() {
        connect_qp(p, &res, qpn, &my[i], r, pre.mtu)?;
    }
    let rem = res
        .dev
        .progress_during(|| conn.sync_after_connect(p.test, &my))
        .map_err(oob)?;
    for d in &my {
        print_dest(p, "local", d);
    }
    for d in &rem {
        print_dest(p, "remote", d);
    }
    let ran = match p.kind {
        Kind::Bw => run_bw(p, &res, conn, &my, &rem),
        Kind::Lat => run_lat(p, &res, conn, &my, &rem),
    };
    // The counters also on failure: they tell a lost packet's fate (drops, strays, retries).
    if p.stats {
        common::print_stats(&res.dev);
    }
    ran?;
    res.dev.close();
    Ok(())
}

/// `run` with `-R` (perftest's `use_rdma_cm` + `work_rdma_cm`, perftest 4.5-0.17 `write_bw.c`
/// and `perftest_communication.c`): the messages travel on an RC QP connected by RDMA CM
/// ([`hca::tools::cm::CmChannel`]), in the order of the TCP exchange; between the preamble and
/// the first `pingpong_dest` hand-shake `create_rdma_cm_connection` connects the test's QPs by
/// RDMA CM, with a hand-shake of zeroed messages before and after; the QPs are not connected by
/// hand (`ctx_connect`), and at the end both sides disconnect them
/// (`rdma_cm_disconnect_nodes`, `destroy_ctx`).
fn run_rdma_cm(p: &Params) -> Result<(), Fail> {
    use hca::rdma_cm::CmService;
    use hca::tools::cm::{self as tcm, CmChannel};
    use hca::tools::oob::perftest::Role;
    let spec = p
        .link
        .clone()
        .ok_or_else(|| Fail("-R needs --link".into()))?;
    let (dev, gid_index, gid, local_mtu) = open_checked(p, &spec)?;
    let cm = Arc::new(
        CmService::start(dev.verbs(), hca::cm::CmConfig::default())
            .map_err(|e| Fail(format!("Unable to start RDMA CM: {e}")))?,
    );
    let local_ip = gid.to_ip();
    let peer = match &p.server {
        Some(host) => Some(resolve_server(host, p.port, local_ip)?),
        None => None,
    };
    let accept = p.accept.unwrap_or(Duration::MAX);
    let listen_addr = std::net::SocketAddr::new(local_ip, p.port);
    let channel = match peer {
        Some(dst) => {
            // Until the server listens its CM rejects the REQ: retry until --timeout.
            let start = Instant::now();
            loop {
                match CmChannel::connect(dev.verbs(), cm.clone(), dst, p.timeout) {
                    Ok(c) => break c,
                    Err(e) if start.elapsed() < p.timeout && e.contains("Rejected") => {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => return fail!("Unable to perform rdma_client function: {e}"),
                }
            }
        }
        None => {
            println!();
            println!("************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            CmChannel::accept(dev.verbs(), cm.clone(), listen_addr, accept, p.timeout)
                .map_err(|e| Fail(format!("Unable to perform rdma_server function: {e}")))?
        }
    };
    let role = if peer.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let mut conn = PerftestConn::over_channel(Box::new(channel), role);
    let oob = |e: hca::tools::OobError| {
        Fail(format!(
            "Failed to exchange data between server and clients: {e}"
        ))
    };
    let pre = conn
        .preamble(DEFAULT_CYCLE_BUFFER, DEFAULT_CACHE_LINE_SIZE, local_mtu)
        .map_err(oob)?;
    let mut res = setup(p, dev, pre.cycle_buffer.max(1) as u64)?;
    res.gid_index = gid_index;
    // create_rdma_cm_connection: a hand-shake of the (still zeroed) messages, the CM
    // connections, another hand-shake.
    let zero = PerftestDest {
        lid: 0,
        out_reads: 0,
        qpn: 0,
        psn: 0,
        rkey: 0,
        vaddr: 0,
        gid: hca::Gid::from_bytes([0; 16]),
        srqn: 0,
    };
    // The server listens for the test's QPs before this hand-shake: the client connects as soon
    // as it has the server's message, and perftest 4.5's client does not survive the REJ of a
    // REQ that comes before the listener (it retries with the IDs it destroyed). perftest's own
    // server listens only after the hand-shake; a client of ours retries a REJ.
    let listener = match peer {
        Some(_) => None,
        None => Some(
            tcm::listen_qps(&cm, listen_addr)
                .map_err(|e| Fail(format!("Failed to create RDMA CM connection: {e}")))?,
        ),
    };
    if let Err(e) = conn.hand_shake(&zero) {
        if let Some(l) = listener {
            cm.destroy_id(l);
        }
        return Err(oob(e));
    }
    let ids = match (listener, peer) {
        (Some(l), _) => tcm::accept_qps_on(&cm, l, &res.qpns, p.timeout, p.timeout),
        (None, Some(dst)) => tcm::connect_qps(&*res.dev, &cm, dst, &res.qpns, p.timeout),
        (None, None) => Err("a server without a listener".to_string()),
    }
    .map_err(|e| Fail(format!("Failed to create RDMA CM connection: {e}")))?;
    conn.hand_shake(&zero).map_err(oob)?;
    let my: Vec<PerftestDest> = res
        .qpns
        .iter()
        .enumerate()
        .map(|(i, &qpn)| PerftestDest {
            lid: 0,
            out_reads: res.out_reads,
            qpn,
            psn: common::random_psn(),
            rkey: res.mr.rkey(),
            vaddr: res.target(i),
            gid,
            srqn: 0,
        })
        .collect();
    print_test_info(p, &spec, pre.mtu, &res);
    let _ = conn.exchange_dests(p.test, &my).map_err(oob)?;
    let rem = conn.sync_after_connect(p.test, &my).map_err(oob)?;
    for d in &my {
        print_dest(p, "local", d);
    }
    for d in &rem {
        print_dest(p, "remote", d);
    }
    match p.kind {
        Kind::Bw => run_bw(p, &res, conn, &my, &rem)?,
        Kind::Lat => run_lat(p, &res, conn, &my, &rem)?,
    }
    // The client disconnects (rdma_cm_disconnect_nodes), the server destroys its connected IDs
    // (destroy_ctx: the kernel's CM sends a DREQ for each): here both send DREQs and wait for
    // DISCONNECTED, which the peer's DREQ or DREP brings, so that neither exits with the
    // other's DREQ unanswered.
    tcm::disconnect_qps(&cm, &ids, p.timeout)
        .map_err(|e| Fail(format!("Failed to disconnect RDMA CM connection: {e}")))?;
    if p.stats {
        common::print_stats(&res.dev);
    }
    drop(cm);
    res.dev.close();
    Ok(())
}

/// The server's address for `-R`: `host` (an address, or a name resolved to one of the family
/// of `local`) and `port`.
fn resolve_server(host: &str, port: u16, local: IpAddr) -> Result<std::net::SocketAddr, Fail> {
    use std::net::ToSocketAddrs;
    let addrs = (host, port).to_socket_addrs().map_err(|e| {
        Fail(format!(
            "Problem in resolving basic address and port: {host}: {e}"
        ))
    })?;
    let unmapped = |a: std::net::SocketAddr| match a.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(a, |v4| std::net::SocketAddr::new(IpAddr::V4(v4), a.port())),
        _ => a,
    };
    addrs
        .map(unmapped)
        .find(|a| a.is_ipv4() == local.is_ipv4())
        .ok_or_else(|| {
            Fail(format!(
                "{host} has no address of the family of the device's {local}"
            ))
        })
}

/// `ctx_init`: the buffer (two regions shared by all QPs), PD, MR, CQs and QPs in INIT.
fn setup(p: &Params, dev: common::Dev, cycle_buffer: u64) -> Result<Res, Fail> {
    let biggest = if p.all { MAX_SIZE } else { p.size };
    let region = biggest.max(cycle_buffer).next_multiple_of(64);
    let q = p.qps as usize;
    let len = (2 * region) as usize;
    // In the UMEM on an AF_XDP link: RC payloads then leave without a copy.
    let mem = dev
        .alloc_memory(len)
        .map_err(|e| Fail(format!("Couldn't allocate the buffer: {e}")))?;
    let pd = dev.alloc_pd()?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = dev
        .reg_mr(pd, mem.clone(), IOVA, access)
        .map_err(|e| Fail(format!("Couldn't allocate MR: {e}")))?;
    let max_cqe = dev.query_device().max_cqe;
    let send_depth = p.tx_depth.clamp(128, 4096);
    let send_cq = dev
        .create_cq((send_depth * p.qps).min(max_cqe))
        .map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
    let rx_per_qp = if p.verb == Verb::Send {
        p.rx_depth.min((max_cqe / p.qps).max(1))
    } else {
        1
    };
    let recv_cq = dev
        .create_cq((rx_per_qp * p.qps).min(max_cqe))
        .map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
    let out_reads = {
        let max = dev.query_device().max_qp_rd_atom.min(255) as u16;
        match p.verb {
            Verb::Read | Verb::Atomic => p.outs.map_or(max, |o| o.clamp(1, max)),
            _ => 1,
        }
    };
    let mut qpns = Vec::with_capacity(q);
    for _ in 0..q {
        let qpn = dev
            .create_qp(
                pd,
                &QpInitAttr {
                    qp_type: p.qp_type,
                    send_cq,
                    recv_cq,
                    srq: None,
                    cap: QpCap {
                        // Unsignaled WRs hold their slot until acknowledged: room beyond tx depth.
                        max_send_wr: send_depth,
                        max_recv_wr: rx_per_qp,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: p.inline_size,
                    },
                    sq_sig_all: false,
                },
            )
            .map_err(|e| Fail(format!("Couldn't create QP: {e}")))?;
        let qp_access = match p.qp_type {
            QpType::Uc => AccessFlags::REMOTE_WRITE,
            _ => AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        };
        common::qp_to_init(&dev, qpn, p.qp_type, qp_access, 0)?;
        qpns.push(qpn);
    }
    Ok(Res {
        dev,
        _pd: pd,
        send_cq,
        recv_cq,
        qpns,
        mem,
        mr,
        region,
        out_reads,
        gid_index: 0,
    })
}

/// `ctx_connect`: RTR (path MTU, responder resources = our outstanding reads, min RNR timer
/// 12, hop limit 255) and RTS (timeout `-u`, default 14, retry 7, RNR retry 7, initiator depth = the peer's
/// outstanding reads).
fn connect_qp(
    p: &Params,
    res: &Res,
    qpn: u32,
    my: &PerftestDest,
    rem: &PerftestDest,
    mtu: PathMtu,
) -> Result<(), Fail> {
    let a = common::ConnectAttrs {
        qp_type: p.qp_type,
        mtu,
        my_psn: my.psn,
        max_dest_rd_atomic: my.out_reads.min(255) as u8,
        max_rd_atomic: rem.out_reads.clamp(1, 255) as u8,
        min_rnr_timer: 12,
        timeout: p.qp_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        hop_limit: 0xff,
        sgid_index: res.gid_index as u8,
        traffic_class: 0,
    };
    let r = common::Remote {
        qpn: rem.qpn,
        psn: rem.psn,
        gid: rem.gid,
    };
    common::qp_to_rts(&res.dev, qpn, &a, &r)
        .map_err(|e| Fail(format!("Unable to Connect the HCA's through the link: {e}")))
}

fn verb_name(v: Verb) -> &'static str {
    match v {
        Verb::Send => "Send",
        Verb::Write => "RDMA_Write",
        Verb::Read => "RDMA_Read",
        Verb::Atomic => "Atomic",
    }
}

/// `ctx_print_test_info`.
fn print_test_info(p: &Params, spec: &DeviceSpec, mtu: PathMtu, res: &Res) {
    let out_reads = res.out_reads;
    let is_client = p.server.is_some();
    println!("{RESULT_LINE}");
    let mut title = format!("                    {} ", verb_name(p.verb));
    if p.verb == Verb::Atomic {
        title.push_str(if p.fetch_add {
            "FETCH_AND_ADD "
        } else {
            "CMP_AND_SWAP "
        });
    }
    title.push_str(match p.kind {
        Kind::Bw => "BW ",
        Kind::Lat => "Latency ",
    });
    title.push_str("Test");
    println!("{title}");
    println!(" Dual-port       : OFF\t\tDevice         : {spec}");
    println!(" Number of qps   : {}\t\tTransport type : IB", p.qps);
    let conn = if p.qp_type == QpType::Uc { "UC" } else { "RC" };
    println!(" Connection type : {conn}\t\tUsing SRQ      : OFF");
    println!(" PCIe relax order: Unsupported");
    println!(" ibv_wr* API     : OFF");
    if is_client {
        println!(" TX depth        : {}", p.tx_depth);
    }
    if p.verb == Verb::Send && !is_client {
        println!(" RX depth        : {}", p.rx_depth);
    }
    if p.kind == Kind::Bw {
        println!(" CQ Moderation   : {}", p.cq_mod);
    }
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {}", res.gid_index);
    if matches!(p.verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {out_reads}");
    } else {
        println!(" Max inline data : {}[B]", p.inline_size);
    }
    // perftest prints the -R server's last two lines after the connections are made.
    if p.rdma_cm {
        println!(" rdma_cm QPs\t : ON");
        print!(" Data ex. method : rdma_cm");
        if p.server.is_none() {
            println!();
            println!("{RESULT_LINE}");
            println!(" Waiting for client rdma_cm QP to connect");
            print!(" Please run the same command with the IB/RoCE interface IP");
        }
        println!();
    } else {
        println!(" rdma_cm QPs\t : OFF");
        println!(" Data ex. method : Ethernet");
    }
    println!("{RESULT_LINE}");
}

/// `ctx_print_pingpong_data`.
fn print_dest(p: &Params, side: &str, d: &PerftestDest) {
    let mut line = format!(
        " {side} address: LID {} QPN {} PSN {}",
        common::c_alt_hex(u64::from(d.lid), 4),
        common::c_alt_hex(u64::from(d.qpn), 6),
        common::c_alt_hex(u64::from(d.psn), 6)
    );
    if p.verb == Verb::Read {
        line.push_str(&format!(
            " OUT {}",
            common::c_alt_hex(u64::from(d.out_reads), 4)
        ));
    }
    if matches!(p.verb, Verb::Read | Verb::Write) {
        line.push_str(&format!(
            " RKey {} VAddr {}",
            common::c_alt_hex(u64::from(d.rkey), 8),
            common::c_alt_hex(d.vaddr, 16)
        ));
    }
    println!("{line}");
    let g: Vec<String> = d.gid.as_bytes().iter().map(|b| format!("{b:02}")).collect();
    println!(" GID: {}", g.join(":"));
}

fn print_results_header(p: &Params) {
    println!("{RESULT_LINE}");
    match p.kind {
        Kind::Bw => println!("{}", if p.gbits { RESULT_FMT_G } else { RESULT_FMT }),
        Kind::Lat if p.duration.is_some() => println!("{RESULT_FMT_LAT_DUR}"),
        Kind::Lat => println!("{RESULT_FMT_LAT}"),
    }
}

fn sizes(p: &Params) -> Vec<u64> {
    if p.all {
        (1..24).map(|i| 1u64 << i).collect()
    } else {
        vec![p.size]
    }
}

/// The wait for the end of the peer's test: ten times `--timeout` plus `-D`.
fn long_wait(p: &Params) -> Duration {
    p.timeout * 10 + Duration::from_secs(p.duration.unwrap_or(0))
}

fn oob_err(e: hca::tools::OobError) -> Fail {
    Fail(format!(
        "Failed to exchange data between server and clients: {e}"
    ))
}

// ---- bandwidth ----

fn run_bw(
    p: &Params,
    res: &Res,
    mut conn: PerftestConn,
    my: &[PerftestDest],
    rem: &[PerftestDest],
) -> Result<(), Fail> {
    let is_client = p.server.is_some();
    print_results_header(p);
    if p.verb == Verb::Send {
        // ib_send_bw: receives posted, a hand-shake, the run; with -a one more hand-shake
        // after each size; both sides print their own results.
        for size in sizes(p) {
            if !is_client {
                post_recvs(p, res, size, p.rx_depth.min(p.iters as u32) as u64)?;
            }
            conn.set_io_timeout(long_wait(p)).map_err(oob_err)?;
            during(res, || conn.hand_shake(&my[0]))?;
            let r = if is_client {
                bw_client(p, res, rem, size)?
            } else {
                bw_server_send(p, res, size)?
            };
            println!("{}", report::bw_line(&r, p.gbits));
            if p.all {
                during(res, || conn.hand_shake(&my[0]))?;
            }
        }
        println!("{RESULT_LINE}");
        conn.set_io_timeout(p.timeout).map_err(oob_err)?;
        return close(res, conn, &my[0]);
    }
    if !is_client {
        // The server only serves: it waits for the client's end-of-test hand-shake, prints the
        // client's numbers and closes.
        conn.set_io_timeout(long_wait(p)).map_err(oob_err)?;
        during(res, || conn.hand_shake(&my[0]))?;
        conn.set_io_timeout(p.timeout).map_err(oob_err)?;
        let theirs = during(res, || conn.exchange_bw_report(&BwReport::default(), false))?;
        let r = Bw {
            size: theirs.size,
            iters: theirs.iters,
            peak: theirs.bw_peak,
            avg: theirs.bw_avg,
            msg_rate: theirs.msg_rate_avg,
        };
        println!("{}", report::bw_line(&r, p.gbits));
        close(res, conn, &my[0])?;
        println!("{RESULT_LINE}");
        return Ok(());
    }
    let mut last = Bw::default();
    for size in sizes(p) {
        last = bw_client(p, res, rem, size)?;
        println!("{}", report::bw_line(&last, p.gbits));
    }
    println!("{RESULT_LINE}");
    during(res, || conn.hand_shake(&my[0]))?;
    let mine = BwReport {
        size: last.size,
        iters: last.iters,
        bw_peak: last.peak,
        bw_avg: last.avg,
        msg_rate_avg: last.msg_rate,
        ..BwReport::default()
    };
    during(res, || conn.exchange_bw_report(&mine, false))?;
    close(res, conn, &my[0])
}

/// `ctx_close_connection`, the engine running meanwhile.
fn close(res: &Res, conn: PerftestConn, my: &PerftestDest) -> Result<(), Fail> {
    res.dev.progress_during(|| conn.close(my)).map_err(|e| {
        Fail(format!(
            "Failed to close connection between server and client: {e}"
        ))
    })
}

/// An out-of-band exchange during which the engine keeps running (caller-driven progress has
/// no thread of its own: the peer's retransmissions must still be acknowledged).
fn during<R>(res: &Res, f: impl FnOnce() -> Result<R, hca::tools::OobError>) -> Result<R, Fail> {
    res.dev.progress_during(f).map_err(oob_err)
}

fn post_recvs(p: &Params, res: &Res, size: u64, per_qp: u64) -> Result<(), Fail> {
    for (i, &qpn) in res.qpns.iter().enumerate() {
        let sge = [Sge {
            addr: res.target(i),
            length: size as u32,
            lkey: res.mr.lkey(),
        }];
        for _ in 0..per_qp {
            res.dev
                .post_recv(
                    qpn,
                    &RecvWr {
                        wr_id: i as u64,
                        sg_list: &sge,
                    },
                )
                .map_err(|e| Fail(format!("Couldn't post recv Qp={i}: {e}")))?;
        }
    }
    let _ = p;
    Ok(())
}

/// The work request of QP `qp` for this test.
fn bw_op(p: &Params, rem: &PerftestDest) -> SendOp {
    match p.verb {
        Verb::Write => SendOp::RdmaWrite {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        },
        Verb::Read => SendOp::RdmaRead {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        },
        Verb::Send => SendOp::Send,
        Verb::Atomic if p.fetch_add => SendOp::AtomicFetchAndAdd {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
            add: 1,
        },
        Verb::Atomic => SendOp::AtomicCmpAndSwp {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
            compare: 0,
            swap: 0,
        },
    }
}

/// Polls `cq` into `wcs`: busy for [`SPIN`] after the last completion, then sleeping until the
/// next; fails after `--timeout` without any completion. While busy it yields the CPU
/// (sched_yield(2)) after each post and at each empty poll when another thread may need this
/// CPU for the completion to come ([`Poller::yield_each`], [`Poller::contended`]), else only
/// once per [`YIELD_EVERY`] of waiting.
struct Poller {
    /// When an empty poll first read the clock after the last completion (`None`: none has
    /// yet): the start of the idle time that [`SPIN`] and `--timeout` bound.
    idle_since: Option<Instant>,
    /// Empty polls since the last completion.
    empty: u32,
    /// Spun for [`SPIN`] in vain: empty polls sleep until a completion.
    sleeping: bool,
    /// A WR was just posted ([`Poller::posted`]): yield before the next poll.
    posted: bool,
    /// Always yield after each post and at each empty poll: the device has a progress thread,
    /// which needs a CPU to produce the completion. With caller-driven progress (the latency
    /// tests' default) the yields cost a system call each, two or more per round trip, for
    /// nothing while the peer answers from another CPU; they are made only while
    /// [`Poller::contended`]. (The process's CPU affinity says nothing about where the peer
    /// runs: a latency test pinned to CPU 1 against a peer on CPU 0 is the usual set-up.)
    yield_each: bool,
    /// A wait for a completion (from a post to the next completion, or a run of empty polls)
    /// took [`YIELD_EVERY`] or more: the peer is slow to get a CPU (a loaded machine, or both
    /// ends on one CPU), so yield as with [`Poller::yield_each`] (a spinning poller
    /// would keep the CPU the peer waits for until its slice ends). Cleared after
    /// [`QUICK_TO_SPIN`] yields in a row that returned within [`YIELD_QUICK`]: nothing else
    /// wanted this CPU (waits say nothing here: yields that run the peer make them short).
    contended: bool,
    /// Quick yields in a row while [`Poller::contended`].
    quick: u32,
    /// When the last WR was posted ([`Poller::posted`]) while spinning, until the next
    /// completion.
    posted_at: Option<Instant>,
    /// Neither of the above: the idle time at which the next yield is due (a poller waiting
    /// this long lets the scheduler run a peer stuck behind it, once per [`YIELD_EVERY`]).
    next_yield: Duration,
}

/// How long a poller spins on an empty CQ before it sleeps until a completion.
const SPIN: Duration = Duration::from_micros(50);
/// A poller without [`Poller::yield_each`] yields once per this much idle time: above a
/// loopback round trip (about 4-10 us), so a peer on another CPU answers first; the same as
/// the device's `hca::soft::YIELD_AFTER`.
const YIELD_EVERY: Duration = hca::soft::YIELD_AFTER;
/// A sched_yield(2) that returns within this ran no other task (one that switches to another
/// task and back costs two context switches, several microseconds on this VM; a yield with
/// nothing to run is a plain system call, well under one).
const YIELD_QUICK: Duration = Duration::from_micros(2);
/// Quick yields in a row after which a [`Poller::contended`] poller spins again.
const QUICK_TO_SPIN: u32 = 16;
/// Longest single sleep of a poller (it then checks its timeout).
const BLOCK: Duration = Duration::from_millis(10);
/// How long write-lat spins on its target byte before it checks only every millisecond (far
/// above any round trip it measures).
const NAP_AFTER: Duration = Duration::from_secs(1);
/// Empty spinning polls between two reads of the clock: a read costs about a tenth of an
/// empty poll, and [`SPIN`] and `--timeout` need no better than a few microseconds.
const POLLS_PER_CLOCK: u32 = 8;

impl Poller {
    fn new(p: &Params) -> Poller {
        Poller {
            idle_since: None,
            empty: 0,
            sleeping: false,
            posted: false,
            yield_each: p.progress != Progress::Caller,
            contended: false,
            quick: 0,
            posted_at: None,
            next_yield: YIELD_EVERY,
        }
    }

    /// The caller just posted a WR whose completion needs the peer: with
    /// [`Poller::yield_each`] or [`Poller::contended`] the next poll yields the CPU first. An answer cannot be back
    /// before a sched_yield(2) returns (about 0.5 us here), and when the peer shares this CPU
    /// it runs now instead of after one more empty poll.
    fn posted(&mut self) {
        self.posted = self.yields();
        self.posted_at = (!self.yields()).then(Instant::now);
    }

    /// A wait for a completion while spinning took `waited`.
    fn waited(&mut self, waited: Duration) {
        self.contended = waited >= YIELD_EVERY;
    }

    /// Whether to yield after each post and at each empty poll now.
    fn yields(&self) -> bool {
        self.yield_each || self.contended
    }

    /// sched_yield(2); while [`Poller::contended`], timed (two vDSO clock reads) to learn
    /// whether the contention is over.
    fn yield_cpu(&mut self) {
        if !self.contended {
            std::thread::yield_now();
            return;
        }
        let t = Instant::now();
        std::thread::yield_now();
        self.yielded(t.elapsed());
    }

    /// A yield while [`Poller::contended`] took `took`.
    fn yielded(&mut self, took: Duration) {
        if took < YIELD_QUICK {
            self.quick += 1;
            if self.quick >= QUICK_TO_SPIN {
                self.contended = false;
                self.quick = 0;
            }
        } else {
            self.quick = 0;
        }
    }

    fn poll(
        &mut self,
        p: &Params,
        res: &Res,
        cq: CqHandle,
        wcs: &mut [WorkCompletion],
        what: &str,
    ) -> Result<usize, Fail> {
        if std::mem::take(&mut self.posted) {
            self.yield_cpu();
        }
        let mut n = res.dev.poll_cq(cq, wcs)?;
        if n == 0 && self.sleeping && !wcs.is_empty() {
            // Polled in vain for a while: sleep until a completion comes (the kernel wakes a
            // sleeper at once, while a spinner waits for its turn on a busy CPU).
            if let Some(wc) = res.dev.wait_cq(cq, 1, BLOCK)?.first() {
                wcs[0] = *wc;
                n = 1;
            }
        }
        if n > 0 {
            if let Some(t) = self.posted_at.take() {
                self.waited(t.elapsed());
            } else if self.empty > 0 && !self.yields() {
                // A wait ended (a completion found at once says nothing about the peer). Fewer
                // than POLLS_PER_CLOCK empty polls never read the clock: a short wait.
                self.waited(self.idle_since.map_or(Duration::ZERO, |t| t.elapsed()));
            }
            self.idle_since = None;
            self.empty = 0;
            self.sleeping = false;
            self.next_yield = YIELD_EVERY;
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    return fail!(
                        "Completion with error at {what}: Failed status {} ({}): wr_id {:#x}",
                        wc.status,
                        wc.status as u32,
                        wc.wr_id
                    );
                }
            }
            return Ok(n);
        }
        self.empty += 1;
        if self.sleeping || self.empty % POLLS_PER_CLOCK == 0 {
            let now = Instant::now();
            let idle = now.duration_since(*self.idle_since.get_or_insert(now));
            if idle > p.timeout {
                return fail!(
                    "no completion for {} s at {what}: is the peer still running?",
                    p.timeout.as_secs()
                );
            }
            self.sleeping = idle > SPIN && !wcs.is_empty();
            if !self.yields() && !self.sleeping && idle >= self.next_yield {
                self.next_yield = idle + YIELD_EVERY;
                self.yield_cpu();
            }
        }
        if self.yields() && !self.sleeping {
            // Busy polling, but let other threads run (the progress thread, or the peer when
            // it shares the CPU): sched_yield(2) returns at once when nothing else waits.
            self.yield_cpu();
        }
        Ok(0)
    }
}

/// `run_iter_bw`: keeps `tx_depth` WRs outstanding per QP, a completion every `cq_mod`;
/// `iters` per QP (or `-D` seconds, measured between a quarter and three quarters of the run,
/// perftest's default margins).
fn bw_client(p: &Params, res: &Res, rem: &[PerftestDest], size: u64) -> Result<Bw, Fail> {
    let q = res.qpns.len();
    let duration = p.duration.map(Duration::from_secs);
    let iters = if duration.is_some() {
        u64::MAX
    } else {
        p.iters
    };
    let total = (p.iters * q as u64) as usize;
    let timed = duration.is_none();
    let mut tposted = Vec::with_capacity(if timed { total } else { 0 });
    let mut tcompleted = Vec::with_capacity(if timed { total } else { 0 });
    let mut posted = vec![0u64; q];
    let mut completed = vec![0u64; q];
    // With -D the WRs after the last signaled one never report: the run ends at that one.
    let mut last_signaled = vec![0u64; q];
    let cq_mod = u64::from(p.cq_mod).max(1);
    let length = if p.verb == Verb::Atomic {
        8
    } else {
        size as u32
    };
    let ops: Vec<SendOp> = rem.iter().map(|r| bw_op(p, r)).collect();
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 64];
    let mut poller = Poller::new(p);
    let start = Instant::now();
    let (margin, end) = match duration {
        Some(d) => (d / 4, d),
        None => (Duration::ZERO, Duration::MAX),
    };
    let mut window: Option<(Instant, u64)> = None;
    let mut window_end: Option<(Instant, u64)> = None;
    let mut done_total = 0u64;
    let mut stop_posting = false;
    let mut batch: Vec<SendWr<'_>> = Vec::with_capacity(p.tx_depth as usize);
    let sges: Vec<[Sge; 1]> = (0..q)
        .map(|i| {
            [Sge {
                addr: res.local(i),
                length,
                lkey: res.mr.lkey(),
            }]
        })
        .collect();
    loop {
        if let Some(d) = duration {
            let el = start.elapsed();
            if window.is_none() && el >= margin {
                window = Some((Instant::now(), done_total));
            }
            if window_end.is_none() && el >= d - margin {
                window_end = Some((Instant::now(), done_total));
            }
            if el >= end {
                stop_posting = true;
            }
        }
        for i in 0..q {
            if stop_posting {
                break;
            }
            batch.clear();
            while posted[i] < iters && posted[i] - completed[i] < u64::from(p.tx_depth) {
                let k = posted[i];
                let signaled = (k + 1) % cq_mod == 0 || k + 1 == iters;
                batch.push(SendWr {
                    wr_id: (i as u64) << 40 | k,
                    sg_list: &sges[i],
                    op: ops[i],
                    send_flags: if signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    },
                });
                posted[i] += 1;
                if signaled {
                    last_signaled[i] = k + 1;
                }
            }
            if !batch.is_empty() {
                let now = Instant::now();
                if timed {
                    tposted.extend(std::iter::repeat_n(now, batch.len()));
                }
                res.dev
                    .post_send_list(res.qpns[i], &batch)
                    .map_err(|(k, e)| Fail(format!("Couldn't post send: qp {i} wr {k}: {e}")))?;
            }
        }
        let n = poller.poll(p, res, res.send_cq, &mut wcs, "client")?;
        let now = Instant::now();
        for wc in &wcs[..n] {
            let i = (wc.wr_id >> 40) as usize;
            let k = wc.wr_id & ((1 << 40) - 1);
            let Some(c) = completed.get_mut(i) else {
                return fail!("Completion for unknown wr_id {:#x}", wc.wr_id);
            };
            let newly = (k + 1).saturating_sub(*c);
            *c = k + 1;
            done_total += newly;
            if timed {
                tcompleted.extend(std::iter::repeat_n(now, newly as usize));
            }
        }
        let all_done = if duration.is_some() {
            stop_posting && (0..q).all(|i| completed[i] >= last_signaled[i])
        } else {
            (0..q).all(|i| completed[i] >= iters)
        };
        if all_done {
            break;
        }
    }
    if let (Some((t0, c0)), Some((t1, c1))) = (window, window_end) {
        let secs = t1.saturating_duration_since(t0).as_secs_f64();
        return Ok(report::bw_window(size, c1 - c0, secs, p.gbits));
    }
    let peak = p.iters <= NO_PEAK_ITERS;
    Ok(report::bw_report(
        size,
        &tposted,
        &tcompleted,
        cq_mod as usize,
        peak,
        p.gbits,
    ))
}

/// `run_iter_bw_server`: receives `iters` messages per QP, reposting receives while more are
/// due; the time runs from the first to the last receive (perftest prints no peak here).
fn bw_server_send(p: &Params, res: &Res, size: u64) -> Result<Bw, Fail> {
    let q = res.qpns.len();
    let total = p.iters * q as u64;
    let mut rcnt = vec![0u64; q];
    let mut got = 0u64;
    let mut first: Option<Instant> = None;
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 64];
    let mut poller = Poller::new(p);
    let posted_per_qp = u64::from(p.rx_depth.min(p.iters as u32));
    let duration = p.duration.map(Duration::from_secs);
    let mut window: Option<(Instant, u64)> = None;
    let mut window_end: Option<(Instant, u64)> = None;
    loop {
        if let (Some(d), Some(t0)) = (duration, first) {
            let el = t0.elapsed();
            if window.is_none() && el >= d / 4 {
                window = Some((Instant::now(), got));
            }
            if el >= d - d / 4 {
                window_end = Some((Instant::now(), got));
                break;
            }
        } else if got >= total {
            break;
        }
        let n = poller.poll(p, res, res.recv_cq, &mut wcs, "server")?;
        if n > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        for wc in &wcs[..n] {
            let i = wc.wr_id as usize;
            let Some(c) = rcnt.get_mut(i) else {
                return fail!("Completion for unknown wr_id {}", wc.wr_id);
            };
            *c += 1;
            got += 1;
            if duration.is_some() || *c + posted_per_qp <= p.iters {
                let sge = [Sge {
                    addr: res.target(i),
                    length: size as u32,
                    lkey: res.mr.lkey(),
                }];
                res.dev
                    .post_recv(
                        res.qpns[i],
                        &RecvWr {
                            wr_id: i as u64,
                            sg_list: &sge,
                        },
                    )
                    .map_err(|e| Fail(format!("Couldn't post recv Qp={i}: {e}")))?;
            }
        }
    }
    if let (Some((t0, c0)), Some((t1, c1))) = (window, window_end) {
        let secs = t1.saturating_duration_since(t0).as_secs_f64();
        return Ok(report::bw_window(size, c1 - c0, secs, p.gbits));
    }
    let t0 = first.unwrap_or_else(Instant::now);
    let secs = t0.elapsed().as_secs_f64();
    Ok(report::bw_window(size, got, secs, p.gbits))
}

// ---- latency ----

fn run_lat(
    p: &Params,
    res: &Res,
    mut conn: PerftestConn,
    my: &[PerftestDest],
    rem: &[PerftestDest],
) -> Result<(), Fail> {
    let is_client = p.server.is_some();
    if p.test == PerftestTest::ReadLat && !is_client {
        // ib_read_lat: the server closes at once (its hand-shake waits for the client's).
        conn.set_io_timeout(long_wait(p)).map_err(oob_err)?;
        close(res, conn, &my[0])?;
        println!("{RESULT_LINE}");
        return Ok(());
    }
    print_results_header(p);
    for size in sizes(p) {
        let line = match p.test {
            PerftestTest::WriteLat => lat_write(p, res, &rem[0], size)?,
            PerftestTest::ReadLat => lat_read(p, res, &rem[0], size)?,
            _ => {
                post_recvs(p, res, size, p.rx_depth.min(p.iters as u32) as u64)?;
                during(res, || conn.hand_shake(&my[0]))?;
                lat_send(p, res, size)?
            }
        };
        println!("{line}");
    }
    println!("{RESULT_LINE}");
    if p.test != PerftestTest::WriteLat {
        conn.set_io_timeout(long_wait(p)).map_err(oob_err)?;
        close(res, conn, &my[0])?;
    }
    Ok(())
}

fn lat_line(size: u64, tposted: &[Instant], rtt: f64, window: Option<(f64, u64)>) -> String {
    match window {
        Some((secs, iters)) => report::lat_duration_line(size, iters, secs, rtt),
        None => report::lat_report(size, tposted, rtt).map_or_else(
            || {
                format!(
                    " {size:<7} {}  (too few iterations for statistics)",
                    tposted.len()
                )
            },
            |l| report::lat_line(&l),
        ),
    }
}

/// Reads the byte at `offset` of our buffer.
fn read_byte(res: &Res, offset: usize) -> u8 {
    let mut b = [0u8; 1];
    let _ = res.mem.read(offset, &mut b);
    b[0]
}

/// `-D` bookkeeping of a latency loop: samples between a quarter and three quarters of the run.
struct LatClock {
    duration: Option<Duration>,
    start: Instant,
    window: Option<(Instant, u64)>,
    window_end: Option<(Instant, u64)>,
}

impl LatClock {
    fn new(p: &Params) -> LatClock {
        LatClock {
            duration: p.duration.map(Duration::from_secs),
            start: Instant::now(),
            window: None,
            window_end: None,
        }
    }

    /// Whether to go on after `done` iterations (`iters` is the `-n` count).
    fn go_on(&mut self, done: u64, iters: u64) -> bool {
        match self.duration {
            None => done < iters,
            Some(d) => {
                let el = self.start.elapsed();
                if self.window.is_none() && el >= d / 4 {
                    self.window = Some((Instant::now(), done));
                }
                if self.window_end.is_none() && el >= d - d / 4 {
                    self.window_end = Some((Instant::now(), done));
                }
                el < d
            }
        }
    }

    /// Whether a `-D` run is over (inner waits give up then: the peer stops at its own time).
    fn expired(&self) -> bool {
        self.duration.is_some_and(|d| self.start.elapsed() >= d)
    }

    fn result(&self) -> Option<(f64, u64)> {
        match (self.window, self.window_end) {
            (Some((t0, c0)), Some((t1, c1))) => {
                Some((t1.saturating_duration_since(t0).as_secs_f64(), c1 - c0))
            }
            _ => None,
        }
    }
}

/// `run_iter_lat_write`: each side writes its counter into the last byte of the peer's target
/// region and spins on the last byte of its own; the server writes first.
fn lat_write(p: &Params, res: &Res, rem: &PerftestDest, size: u64) -> Result<String, Fail> {
    let is_server = p.server.is_none();
    let iters = p.iters;
    let post_off = (size - 1) as usize;
    let poll_off = res.target_offset(0) + (size - 1) as usize;
    let mut tposted = Vec::with_capacity(iters as usize);
    let mut flags = SendFlags::SIGNALED;
    if size <= u64::from(p.inline_size) {
        flags |= SendFlags::INLINE;
    }
    let sge = [Sge {
        addr: res.local(0),
        length: size as u32,
        lkey: res.mr.lkey(),
    }];
    let op = SendOp::RdmaWrite {
        remote_addr: rem.vaddr,
        rkey: rem.rkey,
    };
    let caller = p.progress == Progress::Caller;
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 1];
    let mut poller = Poller::new(p);
    let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
    let mut clock = LatClock::new(p);
    let limited = clock.duration.is_none();
    while (limited && (scnt < iters || ccnt < iters || rcnt < iters))
        || (!limited && clock.go_on(scnt, iters))
    {
        if (!limited || rcnt < iters) && !(scnt < 1 && is_server) {
            rcnt += 1;
            let want = rcnt as u8;
            let since = Instant::now();
            while read_byte(res, poll_off) != want {
                if clock.expired() {
                    break;
                }
                if caller {
                    res.dev.progress();
                }
                let idle = since.elapsed();
                if idle > NAP_AFTER {
                    // The peer is slow or gone: check every millisecond instead of spinning
                    // until --timeout.
                    std::thread::sleep(Duration::from_millis(1));
                } else {
                    std::thread::yield_now();
                }
                if idle > p.timeout {
                    return fail!(
                        "no RDMA WRITE from the peer for {} s (iteration {rcnt}): is it still \
                         running?",
                        p.timeout.as_secs()
                    );
                }
            }
        }
        if !limited || scnt < iters {
            if limited {
                tposted.push(Instant::now());
            }
            scnt += 1;
            res.mem
                .write(post_off, &[scnt as u8])
                .map_err(|e| Fail(format!("buffer: {e}")))?;
            res.dev
                .post_send(
                    res.qpns[0],
                    &SendWr {
                        wr_id: 0,
                        sg_list: &sge,
                        op,
                        send_flags: flags,
                    },
                )
                .map_err(|e| Fail(format!("Couldn't post send: scnt={scnt}: {e}")))?;
            poller.posted();
        }
        if clock.expired() {
            break;
        }
        if !limited || ccnt < iters {
            loop {
                let n = poller.poll(p, res, res.send_cq, &mut wcs, "write")?;
                if n > 0 {
                    ccnt += 1;
                    break;
                }
                if clock.expired() {
                    break;
                }
            }
        }
    }
    Ok(lat_line(size, &tposted, 2.0, clock.result()))
}

/// `run_iter_lat`: the client posts one RDMA READ at a time and waits for its completion.
fn lat_read(p: &Params, res: &Res, rem: &PerftestDest, size: u64) -> Result<String, Fail> {
    let sge = [Sge {
        addr: res.local(0),
        length: size as u32,
        lkey: res.mr.lkey(),
    }];
    let op = SendOp::RdmaRead {
        remote_addr: rem.vaddr,
        rkey: rem.rkey,
    };
    let mut tposted = Vec::with_capacity(p.iters as usize);
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 1];
    let mut poller = Poller::new(p);
    let mut clock = LatClock::new(p);
    let limited = clock.duration.is_none();
    let mut scnt = 0u64;
    while clock.go_on(scnt, p.iters) {
        if limited {
            tposted.push(Instant::now());
        }
        scnt += 1;
        res.dev
            .post_send(
                res.qpns[0],
                &SendWr {
                    wr_id: 0,
                    sg_list: &sge,
                    op,
                    send_flags: SendFlags::SIGNALED,
                },
            )
            .map_err(|e| Fail(format!("Couldn't post send: scnt={scnt}: {e}")))?;
        poller.posted();
        while poller.poll(p, res, res.send_cq, &mut wcs, "read")? == 0 {
            if clock.expired() {
                break;
            }
        }
    }
    Ok(lat_line(size, &tposted, 1.0, clock.result()))
}

/// `run_iter_lat_send`: the client sends first; each side waits for a receive, then sends;
/// sends are unsignaled but every `cq_mod`-th (and the last), whose completion is awaited.
fn lat_send(p: &Params, res: &Res, size: u64) -> Result<String, Fail> {
    let is_client = p.server.is_some();
    let iters = p.iters;
    let rx = u64::from(p.rx_depth.min(iters as u32));
    let cq_mod = u64::from(p.cq_mod).max(1);
    let sge = [Sge {
        addr: res.local(0),
        length: size as u32,
        lkey: res.mr.lkey(),
    }];
    let recv_sge = [Sge {
        addr: res.target(0),
        length: size as u32,
        lkey: res.mr.lkey(),
    }];
    let inline = size <= u64::from(p.inline_size);
    let mut tposted = Vec::with_capacity(iters as usize);
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 1];
    let mut poller = Poller::new(p);
    let mut clock = LatClock::new(p);
    let limited = clock.duration.is_none();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while (limited && (scnt < iters || rcnt < iters)) || (!limited && clock.go_on(scnt, iters)) {
        if (!limited || rcnt < iters) && !(scnt < 1 && is_client) {
            while poller.poll(p, res, res.recv_cq, &mut wcs, "receive")? == 0 {
                if clock.expired() {
                    break;
                }
            }
            if clock.expired() {
                break;
            }
            rcnt += 1;
            if !limited || rcnt + rx <= iters {
                res.dev
                    .post_recv(
                        res.qpns[0],
                        &RecvWr {
                            wr_id: 0,
                            sg_list: &recv_sge,
                        },
                    )
                    .map_err(|e| Fail(format!("Couldn't post recv: rcnt={rcnt}: {e}")))?;
            }
        }
        if !limited || scnt < iters {
            if limited {
                tposted.push(Instant::now());
            }
            scnt += 1;
            let signaled = scnt % cq_mod == 0 || (limited && scnt == iters);
            let mut flags = SendFlags::empty();
            if signaled {
                flags |= SendFlags::SIGNALED;
            }
            if inline {
                flags |= SendFlags::INLINE;
            }
            res.dev
                .post_send(
                    res.qpns[0],
                    &SendWr {
                        wr_id: 0,
                        sg_list: &sge,
                        op: SendOp::Send,
                        send_flags: flags,
                    },
                )
                .map_err(|e| Fail(format!("Couldn't post send: scnt={scnt}: {e}")))?;
            poller.posted();
            if signaled {
                while poller.poll(p, res, res.send_cq, &mut wcs, "send")? == 0 {
                    if clock.expired() {
                        break;
                    }
                }
            }
        }
    }
    Ok(lat_line(size, &tposted, 2.0, clock.result()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The latency tests' poller: no yields while the peer answers within YIELD_EVERY; yields
    /// at each post and empty poll after a longer wait, until QUICK_TO_SPIN yields in a row ran
    /// nothing else; always with a progress thread.
    #[test]
    fn the_poller_yields_only_while_the_peer_is_slow_to_answer() {
        let caller = params(&["rdma-perf", "send-lat"]);
        let mut p = Poller::new(&caller);
        assert!(!p.yields());
        p.posted();
        assert!(!p.posted && p.posted_at.is_some(), "no yield after a post");
        p.waited(YIELD_EVERY / 3);
        assert!(!p.yields());
        p.waited(YIELD_EVERY);
        assert!(p.yields(), "a slow answer: yield");
        p.posted();
        assert!(p.posted && p.posted_at.is_none());
        // A yield that ran something else keeps it contended and restarts the count.
        for _ in 0..QUICK_TO_SPIN - 1 {
            p.yielded(Duration::ZERO);
        }
        p.yielded(YIELD_QUICK * 5);
        assert!(p.yields());
        for _ in 0..QUICK_TO_SPIN - 1 {
            p.yielded(Duration::ZERO);
            assert!(p.yields());
        }
        p.yielded(Duration::ZERO);
        assert!(
            !p.yields(),
            "{QUICK_TO_SPIN} quick yields in a row: spin again"
        );
        // A progress thread needs a CPU: always yield.
        let thread = params(&["rdma-perf", "send-lat", "--progress", "thread"]);
        let mut p = Poller::new(&thread);
        assert!(p.yield_each && p.yields());
        p.posted();
        assert!(p.posted);
    }

    fn params(args: &[&str]) -> Params {
        let cli = Cli::try_parse_from(args).unwrap();
        resolve(&cli.test).unwrap()
    }

    /// A server waits for its client without limit unless --timeout is given (as perftest's
    /// does); every other wait has --timeout or its default of 30 s.
    #[test]
    fn server_waits_for_a_client_without_limit_unless_timeout_is_given() {
        let p = params(&["rdma-perf", "write-bw"]);
        assert_eq!((p.timeout, p.accept), (Duration::from_secs(30), None));
        let t = oob_timeouts(&p);
        assert_eq!(t.accept, Duration::MAX);
        assert_eq!((t.connect, t.io), (p.timeout, p.timeout));
        let p = params(&["rdma-perf", "send-lat", "--timeout", "7"]);
        let seven = Duration::from_secs(7);
        assert_eq!((p.timeout, p.accept), (seven, Some(seven)));
        let t = oob_timeouts(&p);
        assert_eq!((t.accept, t.connect, t.io), (seven, seven, seven));
        // A client keeps its bounded connect retry.
        let t = oob_timeouts(&params(&["rdma-perf", "write-bw", "127.0.0.1"]));
        assert_eq!(t.connect, Duration::from_secs(30));
    }
}
