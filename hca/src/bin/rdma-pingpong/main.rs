//! `rdma-pingpong`: rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong`
//! (`libibverbs/examples/*_pingpong.c`) over the software HCA on a UDP socket.
//!
//! Same options, same TCP exchange (`LID:QPN:PSN:GID`, [`hca::tools::oob::pingpong`]), same QP
//! attributes, same SEND/RECV ping-pong (receive depth 500, one send outstanding), same output,
//! so that it talks to the C tools over Linux soft-RoCE in both roles. Differences, all because
//! the device is a UDP socket rather than an `ibv_device`:
//! * `-d` / `--link udp:ADDRESS` names the device by its IP address (its GID). Without
//!   it a client uses the address its route to the server leaves from, and a server the address
//!   the client connected to (it then opens the device once the client is there).
//! * `-g` defaults to 0, the device's only GID (RoCE needs GIDs; the C tools send a zero GID
//!   without `-g` and cannot connect over RoCE).
//! * Every wait is bounded by `--timeout` (default 30 s): a silent peer is an error, not a hang.
//! * A client whose server does not listen yet keeps trying until `--timeout` (the C tools fail
//!   at once), and says so once on stderr ("nothing listens on HOST:PORT yet").
//! * The server takes IPv4 and IPv6 clients alike (`[::]` with `IPV6_V6ONLY` off, whatever the
//!   `net.ipv6.bindv6only` sysctl says; `0.0.0.0` on a host without IPv6).
//! * `-c` / `--chk` (the C tools' buffer check, byte 0 of every page is 0 at the server) also
//!   fills the rest of each page with a pattern and checks every byte on both sides; a peer's
//!   plain 0x7b filler is accepted as well. A failed check exits with status 1.
//! * `-R` / `--rdma_cm` (RC only; perftest's option, the examples have none): the QPs are
//!   connected by RDMA CM ([`hca::rdma_cm::CmService`]: REQ / REP / RTU to the server's address
//!   and port `-p`) instead of the TCP exchange; the path MTU is the CM's (the port's), and at the
//!   end both sides disconnect (DREQ / DREP). A client rejected because its server does not
//!   listen yet tries again until `--timeout`.

use hca::tool_fail as fail;
use hca::tools::cli as common;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_p2p::{HostMemory, Memory};
use hca::tools::oob::pingpong::{client_exchange, PingpongDest, PingpongServer};
use hca::{
    AccessFlags, AhHandle, CqHandle, MemoryRegion, PathMtu, PdHandle, QpCap, QpInitAttr, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};

use common::{DeviceSpec, Fail, ProgressArg};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The Q_Key of `ud_pingpong.c`.
const QKEY: u32 = 0x1111_1111;
/// The GRH area at the start of every UD receive buffer (IBTA vol. 1 §11.4.1.1).
const GRH: usize = 40;
/// `sysconf(_SC_PAGESIZE)` on the hosts the tools run on.
const PAGE: usize = 4096;
/// The C tools' buffer filler (`memset(ctx->buf, 0x7b, size)`).
const FILLER: u8 = 0x7b;
const IOVA: u64 = 0x7f00_0000_0000;
/// How long the loop spins on an empty CQ before it sleeps until a completion.
const SPIN: Duration = Duration::from_micros(50);
/// Longest single sleep (the loop then checks its timeout).
const BLOCK: Duration = Duration::from_millis(10);

#[derive(Parser, Debug)]
#[command(
    name = "rdma-pingpong",
    version,
    about = "SEND/RECV ping-pong over the software RoCE HCA, as rdma-core's ibv_rc_pingpong, \
             ibv_uc_pingpong and ibv_ud_pingpong",
    after_help = "Without SERVER: start a server and wait for connection; with SERVER: connect \
                  to the server at SERVER."
)]
struct Cli {
    /// The server to connect to; none: be the server.
    server: Option<String>,
    /// Reliable connection, as ibv_rc_pingpong (default).
    #[arg(long, conflicts_with_all = ["uc", "ud"])]
    rc: bool,
    /// Unreliable connection, as ibv_uc_pingpong.
    #[arg(long, conflicts_with = "ud")]
    uc: bool,
    /// Unreliable datagram, as ibv_ud_pingpong.
    #[arg(long)]
    ud: bool,
    /// Listen on / connect to TCP port PORT.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// The device: `udp:ADDRESS`, `vfio:PCI_ADDRESS`, `xdp:IFNAME` or `verbs:DEVICE` (same as --link; an RDMA
    /// device such as mlx5_0 is `verbs:mlx5_0`).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
    /// The device: `udp:ADDRESS`, the local address of a UDP socket on port 4791 (the default,
    /// from the route to SERVER; no other port: the peer always sends to 4791, so two tools on one
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
    /// Use port PORT of the device (it has one: 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of message to exchange, bytes (default 4096; 2048 with --ud).
    #[arg(short = 's', long)]
    size: Option<u32>,
    /// Path MTU, bytes: 256, 512, 1024, 2048 or 4096 (RC/UC).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Service level.
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (accepted; this device is always polled).
    #[arg(short = 'e', long)]
    events: bool,
    /// Local port GID index (a UDP device has one GID, at 0; a VFIO device its IPv6
    /// link-local GID at 0 and 1 and its IPv4 one at 2; a verbs device its port's table). Default: the
    /// device's GID (on a verbs device its first IPv4-mapped RoCEv2 GID).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<i64>,
    /// Validate the received buffer.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Who drives the device: the polling loop (caller, default) or a progress thread.
    #[arg(long, value_enum, default_value = "caller")]
    progress: ProgressArg,
    /// Longest wait for the peer, seconds (1 to 86400): connecting, each TCP message, each
    /// completion.
    #[arg(long, default_value_t = 30, value_parser = common::parse_secs)]
    timeout: u64,
    /// Print the device's engine, link and progress counters to stderr at the end.
    #[arg(long)]
    stats: bool,
    /// Connect the QPs with RDMA CM (RC; the server needs --link / -d): REQ / REP / RTU to the
    /// server's address and port -p instead of the TCP exchange, as perftest's -R.
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What one side set up.
struct Ctx {
    dev: common::Dev,
    /// The local GID index (`-g`, or the device's).
    gid_idx: i64,
    pd: PdHandle,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
    ah: Option<AhHandle>,
}

fn transport(cli: &Cli) -> QpType {
    if cli.uc {
        QpType::Uc
    } else if cli.ud {
        QpType::Ud
    } else {
        QpType::Rc
    }
}

fn run(cli: &Cli) -> Result<(), Fail> {
    let qp_type = transport(cli);
    let size = cli
        .size
        .unwrap_or(if qp_type == QpType::Ud { 2048 } else { 4096 }) as usize;
    let Some(mtu) = common::mtu_of_bytes(cli.mtu) else {
        return fail!("bad MTU {}: must be 256, 512, 1024, 2048 or 4096", cli.mtu);
    };
    if cli.ib_port != 1 {
        return fail!("the device has one port (1), not {}", cli.ib_port);
    }
    if cli.rx_depth < 2 || cli.iters == 0 {
        return fail!("rx-depth must be at least 2 and iters at least 1");
    }
    let spec = match (&cli.link, &cli.ib_dev) {
        (Some(l), _) | (None, Some(l)) => Some(common::parse_link(l)?),
        (None, None) => None,
    };
    let timeouts = common::oob_timeouts(cli.timeout);
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let my_psn = common::random_psn();
    if cli.rdma_cm {
        if qp_type != QpType::Rc {
            return fail!("-R connects RC QPs only (no --uc / --ud)");
        }
        return run_rdma_cm(cli, spec, size, timeout);
    }

    let (mut ctx, remote) = match &cli.server {
        Some(host) => {
            let spec = match spec {
                Some(s) => s,
                None => DeviceSpec::udp(common::route_source(host, cli.port)?),
            };
            let ctx = setup(cli, spec, qp_type, size)?;
            let me = local_dest(&ctx, my_psn)?;
            print_dest("local address: ", &me);
            // Progress meanwhile: the peer may resolve our address (ARP / Neighbor Discovery,
            // answered by a VFIO link's own progress) before it answers.
            let remote = ctx
                .dev
                .progress_during(|| {
                    common::connect_noting(env!("CARGO_BIN_NAME"), host, cli.port, &timeouts, |t| {
                        client_exchange(host, cli.port, &me, t)
                    })
                })
                .map_err(|e| Fail(format!("Couldn't exchange addresses with {host}: {e}")))?;
            print_dest("remote address:", &remote);
            connect(cli, &ctx, qp_type, mtu, my_psn, &remote)?;
            (ctx, remote)
        }
        None => {
            let mut server = PingpongServer::bind_any(cli.port, timeouts)
                .map_err(|e| common::listen_failed(cli.port, &e))?;
            // Connections refused before the client (one line each), under the tool's name.
            server.set_log(hca::tools::oob::stderr_logger(env!("CARGO_BIN_NAME")));
            let early = match spec {
                Some(s) => {
                    let ctx = setup(cli, s, qp_type, size)?;
                    let me = local_dest(&ctx, my_psn)?;
                    print_dest("local address: ", &me);
                    Some((ctx, me))
                }
                None => None,
            };
            let pending = server
                .accept()
                .map_err(|e| Fail(format!("Couldn't read remote address: {e}")))?;
            let (ctx, me) = match early {
                Some(x) => x,
                None => {
                    let local = pending.local_addr().map(|a| a.ip()).ok_or_else(|| {
                        Fail("cannot tell the address the client connected to".into())
                    })?;
                    let ip = match local {
                        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(local, IpAddr::V4),
                        v4 => v4,
                    };
                    let spec = DeviceSpec::udp(ip);
                    let ctx = setup(cli, spec, qp_type, size)?;
                    let me = local_dest(&ctx, my_psn)?;
                    print_dest("local address: ", &me);
                    (ctx, me)
                }
            };
            let remote = *pending.remote();
            // pp_server_exch_dest connects the QP before it answers.
            connect(cli, &ctx, qp_type, mtu, my_psn, &remote)?;
            ctx.dev
                .progress_during(|| pending.reply(&me))
                .map_err(|e| Fail(format!("Couldn't send/recv local address: {e}")))?;
            print_dest("remote address:", &remote);
            (ctx, remote)
        }
    };
    pingpong(cli, &mut ctx, qp_type, size, &remote, timeout)?;
    ctx.dev.close();
    Ok(())
}

/// `run` with `-R`: the device (a progress thread drives it while the CM waits), its
/// [`CmService`](hca::rdma_cm::CmService), the RC QP connected by RDMA CM
/// ([`hca::tools::cm::connect_qps`] / [`hca::tools::cm::accept_qps`]), the ping-pong, then
/// DREQ / DREP on both sides ([`hca::tools::cm::disconnect_qps`]).
fn run_rdma_cm(
    cli: &Cli,
    spec: Option<DeviceSpec>,
    size: usize,
    timeout: Duration,
) -> Result<(), Fail> {
    use hca::rdma_cm::CmService;
    use hca::tools::cm as tcm;
    let spec = match (spec, &cli.server) {
        (Some(s), _) => s,
        (None, Some(host)) => DeviceSpec::udp(common::route_source(host, cli.port)?),
        (None, None) => return fail!("-R needs the server's device: give --link udp:ADDRESS"),
    };
    let progress = hca::soft::Progress::Thread;
    // A client posts its receives once connected: a REJ (its server not listening yet) moves
    // the QP to ERR, which would flush them.
    let is_client = cli.server.is_some();
    let mut ctx = setup_with(cli, spec, QpType::Rc, size, progress, !is_client)?;
    let cm = CmService::start(ctx.dev.verbs(), hca::cm::CmConfig::default())
        .map_err(|e| Fail(format!("Unable to start RDMA CM: {e}")))?;
    let local = common::check_gid_index(&ctx.dev, ctx.gid_idx)?;
    let ids = match &cli.server {
        Some(host) => {
            let dst = server_addr(host, cli.port)?;
            let start = Instant::now();
            loop {
                match tcm::connect_qps(&*ctx.dev, &cm, dst, &[ctx.qpn], timeout) {
                    Ok(ids) => break ids,
                    // connect_qps tried 10 times 100 ms apart; the server may start later.
                    Err(e) if e.contains("Rejected") && start.elapsed() < timeout => {
                        eprintln!("{}: nothing listens on {dst} yet", env!("CARGO_BIN_NAME"));
                    }
                    Err(e) => return fail!("Couldn't connect to {dst} with RDMA CM: {e}"),
                }
            }
        }
        None => {
            let addr = std::net::SocketAddr::new(local.to_ip(), cli.port);
            tcm::accept_qps(&cm, addr, &[ctx.qpn], timeout, timeout)
                .map_err(|e| Fail(format!("Couldn't accept an RDMA CM connection: {e}")))?
        }
    };
    if is_client {
        post_recvs(&ctx, QpType::Rc, size, cli.rx_depth as usize)?;
    }
    let (attr, _) = ctx
        .dev
        .query_qp(ctx.qpn)
        .map_err(|e| Fail(format!("Couldn't query the QP: {e}")))?;
    let (_, remote_ip) = cm.addresses(ids[0]).unwrap_or((None, None));
    let lid = ctx.dev.query_port().lid;
    let me = PingpongDest {
        lid,
        qpn: ctx.qpn,
        psn: attr.sq_psn,
        gid: local,
    };
    let remote = PingpongDest {
        lid,
        qpn: attr.dest_qp_num,
        psn: attr.rq_psn,
        gid: remote_ip.map_or(attr.ah_attr.dgid, |r| hca::Gid::from(r.ip())),
    };
    print_dest("local address: ", &me);
    print_dest("remote address:", &remote);
    pingpong(cli, &mut ctx, QpType::Rc, size, &remote, timeout)?;
    tcm::disconnect_qps(&cm, &ids, timeout)
        .map_err(|e| Fail(format!("Couldn't disconnect the RDMA CM connection: {e}")))?;
    drop(cm);
    ctx.dev.close();
    Ok(())
}

/// The server's address for `-R`: `host` (an address or a name) and `port`, an IPv4-mapped
/// address as IPv4.
fn server_addr(host: &str, port: u16) -> Result<std::net::SocketAddr, Fail> {
    use std::net::ToSocketAddrs;
    let a = (host, port)
        .to_socket_addrs()
        .map_err(|e| Fail(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| Fail(format!("cannot resolve {host}")))?;
    Ok(match a.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(a, |v4| std::net::SocketAddr::new(IpAddr::V4(v4), port)),
        _ => a,
    })
}

/// `pp_init_ctx` and the initial receives: buffer (filled with 0x7b), PD, MR, CQ of rx_depth + 1,
/// QP (1 send WR, rx_depth receive WRs) in INIT, rx_depth receives posted.
fn setup(cli: &Cli, spec: DeviceSpec, qp_type: QpType, size: usize) -> Result<Ctx, Fail> {
    setup_with(cli, spec, qp_type, size, cli.progress.into(), true)
}

/// [`setup`] with the device's `progress`, posting the receives only with `recvs`.
fn setup_with(
    cli: &Cli,
    spec: DeviceSpec,
    qp_type: QpType,
    size: usize,
    progress: hca::soft::Progress,
    recvs: bool,
) -> Result<Ctx, Fail> {
    let dev = common::open_device(spec, progress, None, &cli.vfio)?;
    let gid_idx = cli.gid_idx.unwrap_or(i64::from(dev.gid_index()));
    common::check_gid_index(&dev, gid_idx)?;
    let max_msg = dev.query_port().max_msg_sz;
    if size as u64 > max_msg {
        return fail!("Requested size {size} larger than the port's max message size ({max_msg})");
    }
    // The CQ holds rx_depth receives and the send.
    let max_cqe = dev.query_device().max_cqe;
    if u64::from(cli.rx_depth) + 1 > u64::from(max_cqe) {
        return fail!(
            "rx-depth {} above the device's maximum ({}: its CQs hold {max_cqe} entries)",
            cli.rx_depth,
            max_cqe - 1
        );
    }
    if qp_type == QpType::Ud {
        let mtu = dev.query_port().active_mtu.bytes();
        if size > mtu {
            return fail!("Requested size larger than port MTU ({mtu})");
        }
    }
    let buf_len = if qp_type == QpType::Ud {
        size + GRH
    } else {
        size
    };
    let mem = Arc::new(
        HostMemory::new(buf_len.max(1).next_multiple_of(PAGE))
            .map_err(|e| Fail(format!("Couldn't allocate work buf: {e}")))?,
    );
    mem.write(0, &vec![FILLER; buf_len])
        .map_err(|e| Fail(format!("work buf: {e}")))?;
    let pd = dev.alloc_pd()?;
    // Over the whole (page-rounded) buffer, which a VFIO link maps into its IOMMU.
    let mr = dev
        .reg_mr(pd, mem.clone(), IOVA, AccessFlags::LOCAL_WRITE)
        .map_err(|e| Fail(format!("Couldn't register MR: {e}")))?;
    let cq = dev
        .create_cq(cli.rx_depth + 1)
        .map_err(|e| Fail(format!("Couldn't create CQ: {e}")))?;
    let qpn = dev
        .create_qp(
            pd,
            &QpInitAttr {
                qp_type,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: cli.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(|e| Fail(format!("Couldn't create QP: {e}")))?;
    common::qp_to_init(&dev, qpn, qp_type, AccessFlags::empty(), QKEY)?;
    let ctx = Ctx {
        dev,
        gid_idx,
        pd,
        cq,
        qpn,
        mem,
        mr,
        ah: None,
    };
    if recvs {
        post_recvs(&ctx, qp_type, size, cli.rx_depth as usize)?;
    }
    Ok(ctx)
}

fn local_dest(ctx: &Ctx, psn: u32) -> Result<PingpongDest, Fail> {
    Ok(PingpongDest {
        lid: ctx.dev.query_port().lid,
        qpn: ctx.qpn,
        psn,
        gid: common::check_gid_index(&ctx.dev, ctx.gid_idx)?,
    })
}

/// `printf("  %s  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n")` as the tools print both ends.
fn print_dest(label: &str, d: &PingpongDest) {
    println!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        common::gid_text(&d.gid)
    );
}

/// `pp_connect_ctx`: RC RTR (max_dest_rd_atomic 1, min_rnr_timer 12, hop limit 1) and RTS
/// (timeout 14, retry 7, RNR retry 7, max_rd_atomic 1); UC without the RC-only attributes; UD
/// RTR, RTS and an address handle.
fn connect(
    cli: &Cli,
    ctx: &Ctx,
    qp_type: QpType,
    mtu: PathMtu,
    my_psn: u32,
    remote: &PingpongDest,
) -> Result<(), Fail> {
    if remote.gid.is_zero() {
        return fail!(
            "the peer sent a zero GID: RoCE needs GIDs, run it with -g (e.g. -g 0 here, or the \
             index of its RoCEv2 GID on a real HCA)"
        );
    }
    let attrs = common::ConnectAttrs {
        qp_type,
        mtu,
        my_psn,
        max_dest_rd_atomic: 1,
        max_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        hop_limit: 1,
        sgid_index: ctx.gid_idx as u8,
        traffic_class: 0,
    };
    let r = common::Remote {
        qpn: remote.qpn,
        psn: remote.psn,
        gid: remote.gid,
    };
    common::qp_to_rts(&ctx.dev, ctx.qpn, &attrs, &r)?;
    let _ = cli.sl; // one service level on this link
    Ok(())
}

/// Posts `n` receives; the error names how many went and why the next did not.
fn post_recvs(ctx: &Ctx, qp_type: QpType, size: usize, n: usize) -> Result<usize, Fail> {
    let len = if qp_type == QpType::Ud {
        size + GRH
    } else {
        size
    };
    let sge = [Sge {
        addr: ctx.mr.iova(),
        length: len as u32,
        lkey: ctx.mr.lkey(),
    }];
    for posted in 0..n {
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        };
        if let Err(e) = ctx.dev.post_recv(ctx.qpn, &wr) {
            return fail!("Couldn't post receive ({posted}): {e}");
        }
    }
    Ok(n)
}

fn post_send(ctx: &Ctx, qp_type: QpType, size: usize, remote_qpn: u32) -> Result<(), Fail> {
    let offset = if qp_type == QpType::Ud { GRH as u64 } else { 0 };
    let sge = [Sge {
        addr: ctx.mr.iova() + offset,
        length: size as u32,
        lkey: ctx.mr.lkey(),
    }];
    let op = match (qp_type, ctx.ah) {
        (QpType::Ud, Some(ah)) => SendOp::UdSend {
            dest: UdDest {
                ah,
                remote_qpn,
                remote_qkey: QKEY,
            },
            imm_data: None,
        },
        _ => SendOp::Send,
    };
    ctx.dev
        .post_send(
            ctx.qpn,
            &SendWr {
                wr_id: SEND_WRID,
                sg_list: &sge,
                op,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .map_err(|e| Fail(format!("Couldn't post send: {e}")))
}

/// The byte `--chk` puts at offset `i` of the message: 0 at the start of every page (what the C
/// tools write and check), a position-dependent pattern elsewhere.
fn chk_byte(i: usize) -> u8 {
    if i % PAGE == 0 {
        0
    } else {
        ((i * 7 + i / PAGE) % 251) as u8 + 1
    }
}

/// Pages of the message that fail the check: byte 0 must be 0, the rest our pattern or a C
/// peer's 0x7b filler.
fn invalid_pages(data: &[u8]) -> Vec<usize> {
    data.chunks(PAGE)
        .enumerate()
        .filter(|(p, page)| {
            let base = p * PAGE;
            let first_ok = page.first() == Some(&0);
            let rest = &page[1.min(page.len())..];
            let ours = rest
                .iter()
                .enumerate()
                .all(|(k, &b)| b == chk_byte(base + 1 + k));
            let filler = rest.iter().all(|&b| b == FILLER);
            !(first_ok && (ours || filler))
        })
        .map(|(p, _)| p)
        .collect()
}

/// The ping-pong loop of the examples' `main`, then the report.
fn pingpong(
    cli: &Cli,
    ctx: &mut Ctx,
    qp_type: QpType,
    size: usize,
    remote: &PingpongDest,
    timeout: Duration,
) -> Result<(), Fail> {
    if qp_type == QpType::Ud {
        // ud_pingpong's pp_connect_ctx: an AH with hop limit 1 to the peer's GID.
        let ah = ctx
            .dev
            .create_ah(ctx.pd, &common::av_to(remote.gid, ctx.gid_idx as u8, 1, 0))
            .map_err(|e| Fail(format!("Failed to create AH: {e}")))?;
        ctx.ah = Some(ah);
    }
    let ctx = &*ctx;
    let data_off = if qp_type == QpType::Ud { GRH } else { 0 };
    let is_client = cli.server.is_some();
    if is_client && cli.chk {
        let pattern: Vec<u8> = (0..size).map(chk_byte).collect();
        ctx.mem
            .write(data_off, &pattern)
            .map_err(|e| Fail(format!("work buf: {e}")))?;
    }
    let iters = cli.iters as u64;
    let mut routs = cli.rx_depth as usize;
    let mut pending = RECV_WRID;
    if is_client {
        post_send(ctx, qp_type, size, remote.qpn)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 2];
    let mut last_progress = Instant::now();
    while rcnt < iters || scnt < iters {
        let mut ne = ctx.dev.poll_cq(ctx.cq, &mut wcs)?;
        if ne == 0 && last_progress.elapsed() > SPIN {
            // Polled in vain for a while: sleep until a completion comes (the kernel wakes a
            // sleeper at once, while a spinner waits for its turn on a busy CPU).
            if let Some(wc) = ctx.dev.wait_cq(ctx.cq, 1, BLOCK)?.first() {
                wcs[0] = *wc;
                ne = 1;
            }
        }
        if ne == 0 {
            if last_progress.elapsed() > timeout {
                return fail!(
                    "no completion for {} s after {scnt} sends and {rcnt} receives: is the peer \
                     still running?",
                    timeout.as_secs()
                );
            }
            // Busy polling, but let other threads run (the progress thread, or the peer when
            // it shares the CPUs): sched_yield(2) returns at once when nothing else waits.
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..ne] {
            if wc.status != WcStatus::Success {
                return fail!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status,
                    wc.status as u32,
                    wc.wr_id
                );
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        let want = cli.rx_depth as usize - routs;
                        routs += post_recvs(ctx, qp_type, size, want)?;
                    }
                    rcnt += 1;
                }
                other => return fail!("Completion for unknown wr_id {other}"),
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                post_send(ctx, qp_type, size, remote.qpn)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = size as u64 * iters * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / iters as f64
    );
    if cli.chk {
        let mut data = vec![0u8; size];
        ctx.mem
            .read(data_off, &mut data)
            .map_err(|e| Fail(format!("work buf: {e}")))?;
        let bad = invalid_pages(&data);
        for p in &bad {
            println!("invalid data in page {p}");
        }
        if !bad.is_empty() {
            return fail!(
                "{} of {} pages hold invalid data",
                bad.len(),
                size.div_ceil(PAGE)
            );
        }
    }
    // The peer's last message may still wait for an ACK of ours that was lost: answer its
    // retransmission (ibv_rc_pingpong's local ACK timeout is 4.096 us x 2^14 = 67 ms) before the
    // QP goes away.
    if qp_type == QpType::Rc {
        ctx.dev.linger(LINGER);
    }
    if cli.stats {
        common::print_stats(&ctx.dev);
    }
    Ok(())
}

/// How long an RC run keeps answering after its last completion: three of the peer's
/// retransmission intervals at ibv_rc_pingpong's timeout 14 (67 ms), so that two lost ACKs in a
/// row are still recovered.
const LINGER: std::time::Duration = std::time::Duration::from_millis(200);
