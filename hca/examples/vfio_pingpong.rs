//! `vfio_pingpong`: the software HCA on a virtio-net NIC driven from userspace through VFIO
//! (`hca::link::vfio`), talking RC to a peer.
//!
//! Modes (`--mode`):
//! * `pingpong` (default): rdma-core's `ibv_rc_pingpong` protocol: the TCP exchange of
//!   `hca::tools::oob::pingpong`, receive depth 500, SEND/RECV ping-pong, the same output lines;
//!   `-c` fills (client) / checks (both) the buffer like the C tool (byte 0 of every page is 0)
//!   plus a pattern in the other bytes (a C peer's 0x7b filler is accepted).
//! * `write`: between two instances: after the same TCP exchange the server SENDs the address and
//!   rkey of a data region (registered through the link: mapped into the IOMMU), the client RDMA
//!   WRITEs a pattern there, RDMA READs it back and compares, and SENDs "done"; the server checks
//!   every byte and answers "ok".
//! * `dereg`: as `write`, but the server deregisters the data region (which unmaps it from the
//!   IOMMU; the kernel is asked that nothing is left mapped there) before it sends its address:
//!   the client's WRITE must complete with IBV_WC_REM_ACCESS_ERR, the server must see
//!   IBV_EVENT_QP_ACCESS_ERR, and the memory must be untouched.
//!
//! ```text
//! vfio_pingpong --link vfio:0000:00:04.0 --ip 198.18.0.10 [-g IDX] [-p PORT] [-n ITERS]
//!               [-s SIZE] [-m MTU] [-r RX_DEPTH] [-c] [--mode pingpong|write|dereg]
//!               [--timeout SECS] [--neigh IP=MAC]... [--interrupts] [SERVER]
//! ```
//! `--interrupts`: when idle, sleep until an MSI-X receive interrupt (through VFIO and an eventfd)
//! instead of polling with short sleeps.
//! GID indexes of this device: 0 and 1 the link-local IPv6 GID (RoCEv1, RoCEv2), 2 the IPv4 GID.
//! Exit status 0 when the mode's checks pass, 1 with a message otherwise; every wait is bounded.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_p2p::{HostMemory, Memory};
use hca::link::vfio::{PciAddress, VfioLink, VfioLinkConfig};
use hca::tools::oob::pingpong::{client_exchange, PingpongDest, PingpongServer};
use hca::tools::oob::OobTimeouts;
use hca::verbs::connect::{self, ConnectAttr};
use hca::{
    AccessFlags, AsyncEventType, CqHandle, EngineConfig, MemoryRegion, PathMtu, PdHandle, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SoftHca, WcOpcode,
    WcStatus, WorkCompletion,
};

const PAGE: usize = 4096;
const FILLER: u8 = 0x7b;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const CTRL_IOVA: u64 = 0x1000_0000;
const DATA_IOVA: u64 = 0x2000_0000;
const CTRL_MSG: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pingpong,
    Write,
    Dereg,
}

#[derive(Debug)]
struct Args {
    link: PciAddress,
    ip: Option<Ipv4Addr>,
    gid_idx: u32,
    port: u16,
    iters: u64,
    size: usize,
    mtu: PathMtu,
    rx_depth: u32,
    chk: bool,
    mode: Mode,
    timeout: Duration,
    neigh: Vec<(IpAddr, [u8; 6])>,
    interrupts: bool,
    server: Option<String>,
}

fn usage() -> String {
    "usage: vfio_pingpong --link vfio:PCI_ADDRESS [--ip IPV4] [-g GID_INDEX] [-p PORT] \
     [-n ITERS] [-s SIZE] [-m MTU] [-r RX_DEPTH] [-c] [--mode pingpong|write|dereg] \
     [--timeout SECS] [--neigh IP=MAC]... [--interrupts] [SERVER]"
        .into()
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        link: PciAddress::parse("0000:00:00.0").map_err(|e| e.to_string())?,
        ip: None,
        gid_idx: u32::MAX,
        port: 18515,
        iters: 1000,
        size: 4096,
        mtu: PathMtu::Mtu1024,
        rx_depth: 500,
        chk: false,
        mode: Mode::Pingpong,
        timeout: Duration::from_secs(30),
        neigh: Vec::new(),
        interrupts: false,
        server: None,
    };
    let mut have_link = false;
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |s: String, name: &str| -> Result<u64, String> {
            s.parse().map_err(|_| format!("bad {name}: {s}"))
        };
        match arg.as_str() {
            "--link" => {
                let v = val("--link")?;
                let addr = v
                    .strip_prefix("vfio:")
                    .ok_or_else(|| format!("--link {v}: expected vfio:PCI_ADDRESS"))?;
                a.link = PciAddress::parse(addr).map_err(|e| e.to_string())?;
                have_link = true;
            }
            "--ip" => {
                let v = val("--ip")?;
                a.ip = Some(v.parse().map_err(|_| format!("bad --ip {v}"))?);
            }
            "-g" | "--gid-idx" => a.gid_idx = num(val("-g")?, "GID index")? as u32,
            "-p" | "--port" => a.port = num(val("-p")?, "port")? as u16,
            "-n" | "--iters" => a.iters = num(val("-n")?, "iterations")?.max(1),
            "-s" | "--size" => a.size = num(val("-s")?, "size")? as usize,
            "-r" | "--rx-depth" => a.rx_depth = (num(val("-r")?, "rx depth")? as u32).max(2),
            "-m" | "--mtu" => {
                a.mtu = match num(val("-m")?, "MTU")? {
                    256 => PathMtu::Mtu256,
                    512 => PathMtu::Mtu512,
                    1024 => PathMtu::Mtu1024,
                    2048 => PathMtu::Mtu2048,
                    4096 => PathMtu::Mtu4096,
                    m => return Err(format!("bad MTU {m}")),
                }
            }
            "-c" | "--chk" => a.chk = true,
            "--interrupts" => a.interrupts = true,
            "--timeout" => a.timeout = Duration::from_secs(num(val("--timeout")?, "timeout")?),
            "--mode" => {
                a.mode = match val("--mode")?.as_str() {
                    "pingpong" => Mode::Pingpong,
                    "write" => Mode::Write,
                    "dereg" => Mode::Dereg,
                    m => return Err(format!("bad --mode {m}")),
                }
            }
            "--neigh" => {
                let v = val("--neigh")?;
                let (ip, mac) = v
                    .split_once('=')
                    .and_then(|(i, m)| Some((i.parse().ok()?, parse_mac(m)?)))
                    .ok_or_else(|| format!("bad --neigh {v}: expected IP=MAC"))?;
                a.neigh.push((ip, mac));
            }
            "-h" | "--help" => return Err(usage()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{}", usage())),
            s => a.server = Some(s.to_owned()),
        }
    }
    if !have_link {
        return Err(format!("--link is required\n{}", usage()));
    }
    if a.gid_idx == u32::MAX {
        a.gid_idx = if a.ip.is_some() { 2 } else { 1 };
    }
    Ok(a)
}

/// The device, its engine, and one RC QP.
struct Ctx {
    link: VfioLink,
    hca: SoftHca,
    pd: PdHandle,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
    deadline_step: Duration,
    interrupts: bool,
}

impl Ctx {
    /// Polls until `n` completions arrived (or the timeout passed since the last one).
    fn completions(&mut self, n: usize) -> Result<Vec<WorkCompletion>, String> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 16];
        let mut last = Instant::now();
        let mut idle = 0u32;
        while out.len() < n {
            let p = self.link.poll(&mut self.hca).map_err(|e| e.to_string())?;
            let k = self
                .hca
                .poll_cq(self.cq, &mut wcs)
                .map_err(|e| e.to_string())?;
            out.extend_from_slice(&wcs[..k]);
            if k > 0 || !p.is_idle() {
                last = Instant::now();
                idle = 0;
                continue;
            }
            if last.elapsed() > self.deadline_step {
                return Err(format!(
                    "no completion for {} s ({} of {n} so far); link {:?}; engine {:?}",
                    self.deadline_step.as_secs(),
                    out.len(),
                    self.link.counters(),
                    self.hca.counters()
                ));
            }
            idle += 1;
            if idle > 200 {
                if self.interrupts {
                    // Sleep until a frame arrives or a timer is due.
                    self.link
                        .wait(&mut self.hca, Duration::from_millis(20))
                        .map_err(|e| e.to_string())?;
                } else {
                    // Share the CPU with the peer when nothing happens (a TCG guest has few).
                    std::thread::sleep(Duration::from_micros(50));
                }
            } else {
                std::thread::yield_now();
            }
        }
        Ok(out)
    }

    fn post_recv(&mut self, addr: u64, len: u32, n: u32) -> Result<(), String> {
        let sge = [Sge {
            addr,
            length: len,
            lkey: self.mr.lkey(),
        }];
        for _ in 0..n {
            self.hca
                .post_recv(
                    self.qpn,
                    &RecvWr {
                        wr_id: RECV_WRID,
                        sg_list: &sge,
                    },
                )
                .map_err(|e| format!("Couldn't post receive: {e}"))?;
        }
        Ok(())
    }

    fn post_send(&mut self, wr_id: u64, addr: u64, len: u32, op: SendOp) -> Result<(), String> {
        let sge = [Sge {
            addr,
            length: len,
            lkey: self.mr.lkey(),
        }];
        self.hca
            .post_send(
                self.qpn,
                &SendWr {
                    wr_id,
                    sg_list: &sge,
                    op,
                    send_flags: SendFlags::SIGNALED,
                },
            )
            .map_err(|e| format!("Couldn't post send: {e}"))
    }
}

fn setup(a: &Args) -> Result<Ctx, String> {
    let mut c = VfioLinkConfig::new(a.link);
    c.ipv4 = a.ip;
    c.static_neighbours = a.neigh.clone();
    c.interrupts = a.interrupts;
    let link = VfioLink::open(&c).map_err(|e| format!("cannot open the VFIO link: {e}"))?;
    let (rxb, txb, locked) = link.dma_backing();
    println!(
        "  link {} (IOMMU group {}): MAC {}, MTU {}, features {:#x}, queues {:?}, DMA memory \
         {rxb:?}/{txb:?} locked={locked}, IPv6 {}",
        link.name(),
        link.iommu_group(),
        roce::ethernet::Address(link.mac()),
        link.mtu(),
        link.features(),
        link.queue_sizes(),
        link.ipv6_link_local()
    );
    let mut hca = link.new_soft_hca(EngineConfig::default());
    let mut link = link;
    let pd = hca.alloc_pd().map_err(|e| e.to_string())?;
    let len = (a.size.max(CTRL_MSG * 4)).next_multiple_of(PAGE);
    let mem = Arc::new(HostMemory::new(len).map_err(|e| e.to_string())?);
    mem.write(0, &vec![FILLER; len])
        .map_err(|e| e.to_string())?;
    let mr = link
        .reg_mr(
            &mut hca,
            pd,
            mem.clone(),
            CTRL_IOVA,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    let cq = hca.create_cq(a.rx_depth + 16).map_err(|e| e.to_string())?;
    let qpn = hca
        .create_qp(
            pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: a.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    let init = ConnectAttr {
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..ConnectAttr::default()
    };
    connect::bring_up(&init, QpState::Reset, QpState::Init, |qp, mask| {
        hca.modify_qp(qpn, qp, mask).map(|_| ())
    })
    .map_err(|e| e.to_string())?;
    while hca.poll_event().is_some() {}
    Ok(Ctx {
        link,
        hca,
        pd,
        cq,
        qpn,
        mem,
        mr,
        deadline_step: a.timeout,
        interrupts: a.interrupts,
    })
}

/// `pp_connect_ctx`: RTR (max_dest_rd_atomic 1, min_rnr_timer 12, hop limit 1), RTS (timeout 14,
/// retry 7, RNR retry 7, max_rd_atomic 1).
fn connect(ctx: &mut Ctx, a: &Args, my_psn: u32, remote: &PingpongDest) -> Result<(), String> {
    let attr = ConnectAttr {
        path_mtu: a.mtu,
        ah_attr: ConnectAttr::av(remote.gid, a.gid_idx as u8, 1, 0),
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        local_psn: my_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..ConnectAttr::default()
    };
    let qpn = ctx.qpn;
    connect::bring_up(&attr, QpState::Init, QpState::Rts, |qp, mask| {
        ctx.hca.modify_qp(qpn, qp, mask).map(|_| ())
    })
    .map_err(|e| e.to_string())
}

fn print_dest(label: &str, d: &PingpongDest) {
    let g = d.gid.as_bytes();
    let text: Vec<String> = g
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect();
    println!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        text.join(":")
    );
}

/// Runs `op` (a blocking TCP step) on another thread while this one keeps polling the link, so
/// that ARP requests and Neighbor Solicitations are answered meanwhile: Linux resolves the peer's
/// MAC address when it moves its QP to RTR, before it answers the exchange.
fn while_polling<T: Send>(
    ctx: &mut Ctx,
    op: impl FnOnce() -> Result<T, String> + Send,
) -> Result<T, String> {
    std::thread::scope(|s| {
        let h = s.spawn(op);
        while !h.is_finished() {
            ctx.link.poll(&mut ctx.hca).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_micros(100));
        }
        h.join()
            .map_err(|_| "the exchange thread panicked".to_string())?
    })
}

/// The TCP exchange (client: connect and trade; server: accept, connect the QP, answer).
fn exchange(ctx: &mut Ctx, a: &Args, me: &PingpongDest) -> Result<PingpongDest, String> {
    let timeouts = OobTimeouts {
        connect: a.timeout,
        io: a.timeout,
        accept: a.timeout,
    };
    match &a.server {
        Some(host) => {
            let (host, port, me_copy) = (host.clone(), a.port, *me);
            let remote = while_polling(ctx, move || {
                client_exchange(&host, port, &me_copy, &timeouts)
                    .map_err(|e| format!("Couldn't exchange addresses with {host}: {e}"))
            })?;
            print_dest("remote address:", &remote);
            connect(ctx, a, me.psn, &remote)?;
            Ok(remote)
        }
        None => {
            let any: SocketAddr = (IpAddr::from([0u8; 4]), a.port).into();
            let server = PingpongServer::bind(any, timeouts)
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            let pending = while_polling(ctx, || {
                server
                    .accept()
                    .map_err(|e| format!("Couldn't read remote address: {e}"))
            })?;
            let remote = *pending.remote();
            connect(ctx, a, me.psn, &remote)?;
            let me_copy = *me;
            while_polling(ctx, move || {
                pending
                    .reply(&me_copy)
                    .map_err(|e| format!("Couldn't send local address: {e}"))
            })?;
            print_dest("remote address:", &remote);
            Ok(remote)
        }
    }
}

fn chk_byte(i: usize) -> u8 {
    if i % PAGE == 0 {
        0
    } else {
        ((i * 7 + i / PAGE) % 251) as u8 + 1
    }
}

fn pingpong(ctx: &mut Ctx, a: &Args) -> Result<(), String> {
    let is_client = a.server.is_some();
    if is_client && a.chk {
        let pattern: Vec<u8> = (0..a.size).map(chk_byte).collect();
        ctx.mem.write(0, &pattern).map_err(|e| e.to_string())?;
    }
    let base = ctx.mr.iova();
    let size = a.size as u32;
    let mut routs = a.rx_depth as usize;
    let mut pending = RECV_WRID;
    if is_client {
        ctx.post_send(SEND_WRID, base, size, SendOp::Send)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    while rcnt < a.iters || scnt < a.iters {
        for wc in ctx.completions(1)? {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        let want = a.rx_depth as usize - routs;
                        ctx.post_recv(base, size, want as u32)?;
                        routs += want;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < a.iters && pending == 0 {
                ctx.post_send(SEND_WRID, base, size, SendOp::Send)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = a.size as u64 * a.iters * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        a.iters,
        usec / 1e6,
        usec / a.iters as f64
    );
    if a.chk {
        let mut data = vec![0u8; a.size];
        ctx.mem.read(0, &mut data).map_err(|e| e.to_string())?;
        let mut bad = 0;
        for (p, page) in data.chunks(PAGE).enumerate() {
            let rest = &page[1.min(page.len())..];
            let ours = rest
                .iter()
                .enumerate()
                .all(|(k, &b)| b == chk_byte(p * PAGE + 1 + k));
            let filler = rest.iter().all(|&b| b == FILLER);
            if page.first() != Some(&0) || !(ours || filler) {
                println!("invalid data in page {p}");
                bad += 1;
            }
        }
        if bad > 0 {
            return Err(format!("{bad} pages hold invalid data"));
        }
        println!("data check: {} bytes verified", a.size);
    }
    Ok(())
}

fn data_pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ (i as u8))
        .collect()
}

/// `write` and `dereg` modes. Control messages are 64-byte SENDs in the control region:
/// receive slots at 0, 64, 128, send slot at 192.
fn write_test(ctx: &mut Ctx, a: &Args) -> Result<(), String> {
    let base = ctx.mr.iova();
    let send_at = base + 3 * CTRL_MSG as u64;
    if a.server.is_none() {
        // Server: a data region mapped into the IOMMU through the link.
        let data = Arc::new(
            HostMemory::new(a.size.max(1).next_multiple_of(PAGE)).map_err(|e| e.to_string())?,
        );
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let dmr = ctx
            .link
            .reg_mr(&mut ctx.hca, ctx.pd, data.clone(), DATA_IOVA, access)
            .map_err(|e| format!("Couldn't register the data MR: {e}"))?;
        let (dma, dma_len) = ctx.link.mr_dma_range(dmr.lkey()).unwrap_or((0, 0));
        println!(
            "data MR: lkey {:#x} rkey {:#x}, {} bytes at iova {:#x}, IOMMU-mapped at {dma:#x}",
            dmr.lkey(),
            dmr.rkey(),
            a.size,
            dmr.iova()
        );
        if a.mode == Mode::Dereg {
            let (iova, len) = ctx
                .link
                .dereg_mr(&mut ctx.hca, dmr.lkey())
                .map_err(|e| format!("dereg_mr: {e}"))?
                .ok_or("dereg_mr unmapped nothing")?;
            let left = ctx
                .link
                .iommu_probe_unmapped(iova, len)
                .map_err(|e| format!("IOMMU probe: {e}"))?;
            println!(
                "data MR deregistered; IOMMU: {left} of {dma_len} bytes at {iova:#x} still mapped"
            );
            if left != 0 {
                return Err(format!(
                    "{left} bytes still mapped in the IOMMU after dereg_mr"
                ));
            }
        }
        let mut msg = [0u8; CTRL_MSG];
        msg[..8].copy_from_slice(&dmr.iova().to_be_bytes());
        msg[8..12].copy_from_slice(&dmr.rkey().to_be_bytes());
        msg[12..16].copy_from_slice(&(a.size as u32).to_be_bytes());
        ctx.mem
            .write(3 * CTRL_MSG, &msg)
            .map_err(|e| e.to_string())?;
        ctx.post_send(SEND_WRID, send_at, CTRL_MSG as u32, SendOp::Send)?;
        if a.mode == Mode::Dereg {
            // The client's WRITE must be refused: wait for the access error on this QP.
            let start = Instant::now();
            loop {
                ctx.link.poll(&mut ctx.hca).map_err(|e| e.to_string())?;
                if let Some(ev) = ctx.hca.poll_event() {
                    println!("async event: {:?}", ev.event_type);
                    if ev.event_type == AsyncEventType::QpAccessErr {
                        break;
                    }
                }
                if start.elapsed() > a.timeout {
                    return Err("no IBV_EVENT_QP_ACCESS_ERR: the WRITE was not refused".into());
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            let untouched = data.to_vec().iter().all(|&b| b == 0);
            println!("deregistered memory untouched: {untouched}");
            if !untouched {
                return Err("the deregistered memory was written".into());
            }
            println!("dereg check passed: WRITE NAKed (remote access error), IOMMU mapping gone");
            return Ok(());
        }
        // Wait for "done" (and our SEND's completion), check, answer "ok".
        let mut got_done = false;
        let mut sent = false;
        while !(got_done && sent) {
            for wc in ctx.completions(1)? {
                if wc.status != WcStatus::Success {
                    return Err(format!(
                        "Failed status {} for wr_id {}",
                        wc.status, wc.wr_id
                    ));
                }
                match wc.opcode {
                    WcOpcode::Recv => got_done = true,
                    _ => sent = true,
                }
            }
        }
        let want = data_pattern(a.size);
        let mut have = vec![0u8; a.size];
        data.read(0, &mut have).map_err(|e| e.to_string())?;
        let bad = want.iter().zip(&have).filter(|(x, y)| x != y).count();
        println!("WRITE data check: {} bytes, {bad} wrong", a.size);
        ctx.mem
            .write(3 * CTRL_MSG, b"ok")
            .map_err(|e| e.to_string())?;
        ctx.post_send(SEND_WRID, send_at, 2, SendOp::Send)?;
        ctx.completions(1)?;
        ctx.link
            .dereg_mr(&mut ctx.hca, dmr.lkey())
            .map_err(|e| e.to_string())?;
        if bad > 0 {
            return Err(format!("{bad} bytes written wrong"));
        }
        return Ok(());
    }
    // Client: receive the server's region, WRITE the pattern, SEND "done".
    let wcs = ctx.completions(1)?;
    if wcs[0].status != WcStatus::Success || wcs[0].opcode != WcOpcode::Recv {
        return Err(format!("expected the server's address, got {:?}", wcs[0]));
    }
    let mut msg = [0u8; 16];
    ctx.mem.read(0, &mut msg).map_err(|e| e.to_string())?;
    let va = u64::from_be_bytes(msg[..8].try_into().unwrap_or_default());
    let rkey = u32::from_be_bytes(msg[8..12].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(msg[12..16].try_into().unwrap_or_default()) as usize;
    println!("server region: {len} bytes at {va:#x}, rkey {rkey:#x}");
    // The payload lives in a second region of the control memory's size.
    let src =
        Arc::new(HostMemory::new(len.max(1).next_multiple_of(PAGE)).map_err(|e| e.to_string())?);
    src.write(0, &data_pattern(len))
        .map_err(|e| e.to_string())?;
    let smr = ctx
        .link
        .reg_mr(
            &mut ctx.hca,
            ctx.pd,
            src,
            DATA_IOVA,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(|e| e.to_string())?;
    let sge = [Sge {
        addr: smr.iova(),
        length: len as u32,
        lkey: smr.lkey(),
    }];
    ctx.hca
        .post_send(
            ctx.qpn,
            &SendWr {
                wr_id: 7,
                sg_list: &sge,
                op: SendOp::RdmaWrite {
                    remote_addr: va,
                    rkey,
                },
                send_flags: SendFlags::SIGNALED,
            },
        )
        .map_err(|e| e.to_string())?;
    let wc = ctx.completions(1)?[0];
    if a.mode == Mode::Dereg {
        println!("WRITE completion: {} ({})", wc.status, wc.status as u32);
        if wc.status == WcStatus::RemAccessErr {
            println!("dereg check passed: the WRITE to the deregistered region was NAKed");
            return Ok(());
        }
        return Err(format!("expected IBV_WC_REM_ACCESS_ERR, got {}", wc.status));
    }
    if wc.status != WcStatus::Success {
        return Err(format!("WRITE failed: {}", wc.status));
    }
    // READ it back into a third region and compare.
    let back =
        Arc::new(HostMemory::new(len.max(1).next_multiple_of(PAGE)).map_err(|e| e.to_string())?);
    let bmr = ctx
        .link
        .reg_mr(
            &mut ctx.hca,
            ctx.pd,
            back.clone(),
            DATA_IOVA << 1,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(|e| e.to_string())?;
    let sge = [Sge {
        addr: bmr.iova(),
        length: len as u32,
        lkey: bmr.lkey(),
    }];
    ctx.hca
        .post_send(
            ctx.qpn,
            &SendWr {
                wr_id: 8,
                sg_list: &sge,
                op: SendOp::RdmaRead {
                    remote_addr: va,
                    rkey,
                },
                send_flags: SendFlags::SIGNALED,
            },
        )
        .map_err(|e| e.to_string())?;
    let wc = ctx.completions(1)?[0];
    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RdmaRead {
        return Err(format!("READ failed: {} ({:?})", wc.status, wc.opcode));
    }
    let mut have = vec![0u8; len];
    back.read(0, &mut have).map_err(|e| e.to_string())?;
    let bad = data_pattern(len)
        .iter()
        .zip(&have)
        .filter(|(x, y)| x != y)
        .count();
    println!("READ back {len} bytes: {bad} wrong");
    if bad > 0 {
        return Err(format!("READ returned {bad} wrong bytes"));
    }
    ctx.mem
        .write(3 * CTRL_MSG, b"done")
        .map_err(|e| e.to_string())?;
    ctx.post_send(SEND_WRID, send_at, 4, SendOp::Send)?;
    let mut got_ok = false;
    let mut sent = false;
    while !(got_ok && sent) {
        for wc in ctx.completions(1)? {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} for wr_id {}",
                    wc.status, wc.wr_id
                ));
            }
            match wc.opcode {
                WcOpcode::Recv => got_ok = true,
                _ => sent = true,
            }
        }
    }
    println!("WRITE of {len} bytes acknowledged and checked by the server");
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let mut ctx = setup(a)?;
    let my_psn = (std::process::id().wrapping_mul(2_654_435_761) ^ 0x5a5a) & 0xff_ffff;
    let gid = ctx
        .hca
        .context()
        .device()
        .port(1)
        .and_then(|p| p.gids.get(a.gid_idx))
        .map(|e| e.gid)
        .ok_or_else(|| format!("no GID at index {}", a.gid_idx))?;
    // Receives first, as the C tool does (pp_post_recv before the exchange).
    match a.mode {
        Mode::Pingpong => {
            let (base, size) = (ctx.mr.iova(), a.size as u32);
            ctx.post_recv(base, size, a.rx_depth)?;
        }
        _ => {
            let base = ctx.mr.iova();
            for k in 0..3 {
                ctx.post_recv(base + (k * CTRL_MSG) as u64, CTRL_MSG as u32, 1)?;
            }
        }
    }
    let me = PingpongDest {
        lid: 0,
        qpn: ctx.qpn,
        psn: my_psn,
        gid,
    };
    print_dest("local address: ", &me);
    exchange(&mut ctx, a, &me)?;
    let r = match a.mode {
        Mode::Pingpong => pingpong(&mut ctx, a),
        Mode::Write | Mode::Dereg => write_test(&mut ctx, a),
    };
    let c = ctx.link.counters();
    println!(
        "link: rx_roce {} tx_roce {} arp {} ndp {} not_for_us {} malformed {} | nic: rx {} tx {} \
         notifies {} suppressed {} bad_id {} interrupts {} | neighbours {:?}",
        c.rx_roce,
        c.tx_roce,
        c.rx_arp,
        c.rx_ndp,
        c.rx_not_for_us,
        c.rx_malformed,
        c.nic.rx_frames,
        c.nic.tx_frames,
        c.nic.notifies,
        c.nic.notifies_suppressed,
        c.nic.device_bad_id,
        c.nic.interrupts,
        ctx.link.neighbours()
    );
    let e = ctx.hca.counters();
    println!(
        "engine: sent {} rcvd {} drops {} icrc_errors {} icrc_ident_solved {} retries {}",
        e.sent_pkts,
        e.rcvd_pkts,
        e.total_drops(),
        e.icrc_errors,
        e.icrc_ident_solved,
        e.completer_retry_err
    );
    // Let the last ACKs leave before the device is reset.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        let _ = ctx.link.poll(&mut ctx.hca);
        std::thread::sleep(Duration::from_micros(200));
    }
    r
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vfio_pingpong: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vfio_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
