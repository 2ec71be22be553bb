//! `coll-perf`: nccl-tests for this crate.
//!
//! ```text
//! coll-perf all-reduce|all-gather|reduce-scatter|broadcast|reduce|all-to-all|scatter|gather
//!           [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP] [-d TYPE] [-o OP]
//!           [-r ROOT] [-c CHECK] [-T TIMEOUT] [--ranks N] [--transport auto|shm|roce]
//!           [--device host|cuda]
//! ```
//!
//! `--device cuda` puts every buffer in CUDA device memory (rank `r` on GPU `local rank % GPUs`)
//! and runs the collectives' device forms ([`crate::device`]): the all-reduce takes the GPU
//! peer-to-peer path between the rank processes (CUDA IPC, device-to-device copies, GPU reduction
//! kernels), the other collectives stage through host memory; for the all-reduce rank 0 prints how
//! many calls took each path (`All-reduce path : gpu-p2p N calls, staged M calls`, with the reason
//! of the last staged one). Rank 0 also prints the
//! device-to-device copy bandwidth measured in the same run (`cuMemcpyDtoDAsync` of the largest size,
//! timed with CUDA events), the figure the all-reduce's bus bandwidth is to be read against. Data is
//! checked exactly as on the host (the test data are small integers, exact in every type). Without a
//! CUDA driver or GPU, `--device cuda` fails at once with one line naming what is missing.
//!
//! Under a launcher (torchrun's environment, `mpirun`, `srun`) each process is one rank. Run
//! bare, it starts `--ranks N` (default 4) rank processes of itself on this host and waits for
//! them ([`spawn`]). Rank 0 prints nccl-tests' table: for every size, the time of one operation
//! (averaged over `-n` iterations and over ranks), the algorithm bandwidth and nccl-tests' bus
//! bandwidth, and the number of wrong elements found by checking every rank's output against a
//! reference ([`data`]), out of place and in place; then the average bus bandwidth.

use core::fmt;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use std::sync::Arc;

use clap::{Parser, ValueEnum};
use gpu_p2p::cuda::CudaDevice;

use crate::device::DeviceBuffer;

use crate::bootstrap::{launcher, LaunchInfo};
use crate::datatype::{DataType, RedOp};
use crate::error::{CollError, InitError};
use crate::transport::TransportKind;
use crate::{CommConfig, Communicator};

/// `eprintln!` in one write(2): the line is formatted first, then written whole ([`say_line`]), so
/// that lines of rank processes sharing one stderr never splice into each other.
macro_rules! say {
    ($($t:tt)*) => {
        $crate::perf::say_line(&mut ::std::io::stderr().lock(), format_args!($($t)*))
    };
}

mod collective;
pub mod data;
pub mod report;
pub mod spawn;
// Edge: the raw OS calls of the local rank spawner (prctl).
#[allow(unsafe_code)]
mod sys;

/// Writes `line` and a newline to `w` with a single `write_all` of one buffer (one write(2) on
/// stderr for lines up to `PIPE_BUF`, 4096 bytes, which pipe(7) makes atomic), unlike
/// `eprintln!`, which writes each formatted piece apart. Errors are ignored: nothing is left to
/// report them to.
pub fn say_line<W: Write + ?Sized>(w: &mut W, line: fmt::Arguments<'_>) {
    let mut s = line.to_string();
    s.push('\n');
    let _ = w.write_all(s.as_bytes());
    let _ = w.flush();
}

pub use collective::Collective;
use data::{Expect, Pattern};
use report::{bandwidth, row_body, row_preamble, Counts, TableHeader};

/// The largest `-T/--timeout`, seconds (one day): deadlines are `now + timeout`, which
/// `std::time::Instant` cannot hold for every `u64` number of seconds.
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// The most iterations `-n`, `-w` and `-c` take (perftest's bound on `-n`).
pub const MAX_ITERS: usize = 100_000_000;

fn size_arg(s: &str) -> Result<u64, String> {
    report::parse_size(s)
}

fn transport_arg(s: &str) -> Result<TransportKind, String> {
    match s.parse::<TransportKind>() {
        Ok(t @ (TransportKind::Auto | TransportKind::Shm | TransportKind::Roce)) => Ok(t),
        _ => Err(format!("'{s}' is not one of auto, shm, roce")),
    }
}

/// Where `coll-perf` puts its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum BufferDevice {
    /// Host memory (`Vec<u8>`), the host collectives.
    Host,
    /// CUDA device memory, the device collectives.
    Cuda,
}

/// The command line (nccl-tests' short options).
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "coll-perf",
    version,
    about = "Measure collectives the way nccl-tests does: per size, time, algbw, busbw and #wrong, out of place and in place"
)]
pub struct PerfArgs {
    /// The collective to measure.
    #[arg(value_enum)]
    pub collective: Collective,
    /// Smallest size, in bytes (K, M, G suffixes: powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = size_arg)]
    pub min_bytes: u64,
    /// Largest size, in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = size_arg)]
    pub max_bytes: u64,
    /// Size increment when the step factor is 1, in bytes.
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = size_arg)]
    pub step_bytes: u64,
    /// Size multiplication factor between sizes (1: add --stepbytes instead).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    pub step_factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size (not timed).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup_iters: usize,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: DataType,
    /// Reduction operator: sum prod max min avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: RedOp,
    /// Root rank of broadcast, reduce, scatter and gather.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Checked iterations per size (0: no check, #wrong prints N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: usize,
    /// Seconds without progress before an operation fails (naming the peer).
    #[arg(short = 'T', long = "timeout", default_value_t = 60)]
    pub timeout: u64,
    /// Ranks to start on this host when run without a launcher (default 4); under a launcher
    /// it must equal the launcher's world size.
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Transport between ranks: auto (shm on one host, roce across hosts), shm, roce.
    #[arg(long, default_value = "auto", value_parser = transport_arg)]
    pub transport: TransportKind,
    /// Where the buffers live: host memory or CUDA device memory.
    #[arg(long, value_enum, default_value = "host")]
    pub device: BufferDevice,
    /// The RDMA device of the roce transport: `udp` (the software HCA on a UDP socket, each
    /// rank's address chosen as `COLL_ROCE_ADDR` documents), `udp:ADDRESS[:PORT]` (that
    /// address for every rank of this host, so with `--ranks 1` only: the UDP device tells peers
    /// apart by address; several local ranks take `COLL_ROCE_ADDR=A1,A2,...`, one each), or `verbs:DEVICE` (an RDMA device through
    /// libibverbs, e.g. verbs:rxe0, verbs:mlx5_0; ranks may share it), or `xdp:IFNAME` (the
    /// software HCA on an AF_XDP socket on that interface; one rank per interface, so `--ranks 1`
    /// per host or namespace; root). Sets `COLL_ROCE_LINK` for
    /// the ranks; with `--transport auto` it selects roce. `vfio:` links are not supported here.
    #[arg(long, value_parser = link_arg)]
    pub link: Option<String>,
}

/// `--link`: `udp`, or a [`hca::open::DeviceSpec`] of the UDP or verbs kind, in canonical form.
fn link_arg(s: &str) -> Result<String, String> {
    if s == "udp" {
        return Ok(s.to_owned());
    }
    match s.parse::<hca::open::DeviceSpec>() {
        Ok(
            l @ (hca::open::DeviceSpec::Udp { .. }
            | hca::open::DeviceSpec::Verbs(_)
            | hca::open::DeviceSpec::Xdp(_)),
        ) => Ok(l.to_string()),
        Ok(l) => Err(format!(
            "{l}: not supported for coll-perf (use udp, udp:ADDRESS[:PORT], xdp:IFNAME or \
             verbs:DEVICE)"
        )),
        Err(e) => Err(e.to_string()),
    }
}

impl PerfArgs {
    /// Checks what clap cannot.
    ///
    /// # Errors
    /// A message naming the bad option.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_bytes > self.max_bytes {
            return Err(format!(
                "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
                self.min_bytes, self.max_bytes
            ));
        }
        if self.step_factor == 0 || (self.step_factor == 1 && self.step_bytes == 0) {
            return Err(
                "the step factor must be >= 1, and with factor 1 the step bytes > 0".into(),
            );
        }
        if self.iters == 0 {
            return Err("-n/--iters must be at least 1".into());
        }
        if self.ranks == Some(0) {
            return Err("--ranks must be at least 1".into());
        }
        if !(1..=MAX_TIMEOUT_SECS).contains(&self.timeout) {
            return Err(format!(
                "-T/--timeout must be from 1 to {MAX_TIMEOUT_SECS} seconds, not {}",
                self.timeout
            ));
        }
        if self.iters > MAX_ITERS || self.warmup_iters > MAX_ITERS || self.check > MAX_ITERS {
            return Err(format!(
                "-n/--iters, -w/--warmup_iters and -c/--check must be at most {MAX_ITERS}"
            ));
        }
        Ok(())
    }

    /// The sizes measured, in bytes.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            out.push(size);
            let next = if self.step_factor > 1 {
                size.saturating_mul(self.step_factor)
            } else {
                size.saturating_add(self.step_bytes)
            };
            if next <= size {
                break;
            }
            size = next;
        }
        out
    }

    fn config(&self) -> Result<CommConfig, launcher::EnvError> {
        CommConfig {
            transport: match (&self.link, self.transport) {
                (Some(_), TransportKind::Auto) => TransportKind::Roce,
                (_, t) => t,
            },
            timeout: Duration::from_secs(self.timeout),
            ..CommConfig::default()
        }
        .with_env_overrides()
    }
}

/// What stops a `coll-perf` rank.
#[derive(Debug)]
pub enum PerfError {
    /// Bad arguments.
    Args(String),
    /// The launcher environment.
    Env(launcher::EnvError),
    /// Creating the communicator.
    Init(InitError),
    /// An operation.
    Coll(CollError),
    /// Writing the table.
    Output(std::io::Error),
    /// Starting or waiting for the local rank processes.
    Spawn(String),
    /// CUDA (`--device cuda`): no driver, no GPU, or a failing call.
    Cuda(gpu_p2p::CudaError),
    /// A host buffer of `bytes` bytes could not be allocated (a size larger than this host's
    /// memory, or than the address space).
    Alloc {
        /// The buffer's size, bytes.
        bytes: usize,
        /// Why the allocator refused it.
        source: std::collections::TryReserveError,
    },
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfError::Args(m) => write!(f, "{m}"),
            PerfError::Env(e) => write!(f, "{e}"),
            PerfError::Init(e) => write!(f, "{e}"),
            PerfError::Coll(e) => write!(f, "{e}"),
            PerfError::Output(e) => write!(f, "writing the report: {e}"),
            PerfError::Spawn(m) => write!(f, "{m}"),
            PerfError::Cuda(e) => write!(f, "--device cuda: {e}"),
            PerfError::Alloc { bytes, source } => {
                write!(
                    f,
                    "cannot allocate a host buffer of {bytes} bytes: {source}"
                )
            }
        }
    }
}

impl std::error::Error for PerfError {}

impl From<CollError> for PerfError {
    fn from(e: CollError) -> Self {
        PerfError::Coll(e)
    }
}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> Self {
        PerfError::Output(e)
    }
}

/// Host memory one rank allocates for the largest size, in bytes: its send, receive and
/// in-place buffers (host mirrors of them with `--device cuda`), plus its shared-memory segment
/// of receive rings (`nranks * nchannels * nslots * (64 + slot_bytes)`, with 4 KiB of headers).
pub fn rank_memory(args: &PerfArgs, nranks: usize) -> u64 {
    let es = args.datatype.size();
    let largest = args.sizes().last().copied().unwrap_or(0);
    let c = Counts::new(args.collective, largest, es, nranks.max(1));
    let elems = (c.send as u64)
        .saturating_add(c.recv as u64)
        .saturating_add(c.send.max(c.recv) as u64);
    let config = CommConfig::default();
    let ring = 256 + (config.nslots as u64).saturating_mul(64 + config.slot_bytes as u64);
    let segment = 4096 + (nranks as u64).saturating_mul(config.nchannels as u64 * ring);
    elems.saturating_mul(es as u64).saturating_add(segment)
}

/// Bytes of memory this host (and this process's cgroup, where it sets a limit) can still
/// give: `MemAvailable` of /proc/meminfo, less when cgroup v2's `memory.max - memory.current`
/// is less. `None` when /proc/meminfo cannot be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    let mut avail = kb.saturating_mul(1024);
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let (Some(max), Some(cur)) = (read("memory.max"), read("memory.current")) {
        avail = avail.min(max.saturating_sub(cur));
    }
    Some(avail)
}

/// Refuses, before anything is allocated, sizes whose buffers for the `local` ranks of this
/// host (of `nranks` in all) exceed the memory it has available ([`rank_memory`],
/// [`available_memory`]), rather than letting the OOM killer take ranks mid-run.
///
/// # Errors
/// One line naming the size, the need and what is available.
pub fn check_memory(args: &PerfArgs, nranks: usize, local: usize) -> Result<(), String> {
    let Some(avail) = available_memory() else {
        return Ok(());
    };
    let each = rank_memory(args, nranks);
    let need = each.saturating_mul(local as u64);
    if need <= avail {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    Err(format!(
        "-e/--maxbytes {} needs {:.1} GiB of host memory for {local} local rank(s) ({:.1} GiB \
         each: send, receive and in-place buffers of the largest size, and shared-memory rings), \
         more than the {:.1} GiB available (MemAvailable); use a smaller -b/-e or fewer ranks",
        args.max_bytes,
        gib(need),
        gib(each),
        gib(avail)
    ))
}

/// `coll-perf`'s `main`: one rank under a launcher, else the local spawner.
pub fn main(args: PerfArgs) -> ExitCode {
    if let Err(m) = args.validate() {
        say!("coll-perf: {m}");
        return ExitCode::from(2);
    }
    if let Some(link) = &args.link {
        // Read by the roce transport of every rank (this process's, or the ranks it starts,
        // which inherit it); set before this process starts any thread.
        std::env::set_var("COLL_ROCE_LINK", link);
    }
    if args.device == BufferDevice::Cuda {
        if let Err(e) = cuda_ready() {
            say!("coll-perf: --device cuda: {e}");
            return ExitCode::FAILURE;
        }
    }
    match launcher::detect(&|k| std::env::var(k).ok()) {
        Ok(Some(info)) => {
            let rank = info.rank;
            // Every rank of this host checks alike; one of them says it.
            let local = info.local_nranks.unwrap_or(1);
            if let Err(m) = check_memory(&args, info.nranks, local) {
                if info.local_rank.unwrap_or(0) == 0 {
                    say!("coll-perf: {m}");
                }
                return ExitCode::from(2);
            }
            match run_rank(&args, &info, &mut std::io::stdout()) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(wrong) => {
                    if rank == 0 {
                        say!("coll-perf: {wrong} wrong elements");
                    }
                    ExitCode::FAILURE
                }
                Err(e) => {
                    say!("coll-perf rank {rank}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Ok(None) => spawn::run_local(&args, std::env::args_os().skip(1).collect()),
        Err(e) => {
            say!("coll-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the CUDA driver and checks that it sees a GPU.
fn cuda_ready() -> Result<gpu_p2p::Cuda, gpu_p2p::CudaError> {
    let cuda = gpu_p2p::Cuda::load()?;
    cuda.device_count()?;
    Ok(cuda)
}

/// Runs the benchmark as the rank `info` describes; rank 0 writes the table to `out`.
/// Returns the total number of wrong elements found.
///
/// # Errors
/// [`PerfError`].
pub fn run_rank(args: &PerfArgs, info: &LaunchInfo, out: &mut dyn Write) -> Result<u64, PerfError> {
    if let Some(n) = args.ranks.filter(|&n| n != info.nranks) {
        return Err(PerfError::Args(format!(
            "--ranks {n} but the {} environment says {} ranks",
            info.launcher, info.nranks
        )));
    }
    let config = args.config().map_err(PerfError::Env)?;
    let mut comm = Communicator::from_launch(info, config).map_err(PerfError::Init)?;
    if args.collective.rooted() && args.root >= comm.nranks() {
        return Err(PerfError::Args(format!(
            "root {} is not below the {} ranks",
            args.root,
            comm.nranks()
        )));
    }
    let gpu = match args.device {
        BufferDevice::Host => None,
        BufferDevice::Cuda => {
            let cuda = cuda_ready().map_err(PerfError::Cuda)?;
            let count = cuda.device_count().map_err(PerfError::Cuda)?;
            let ordinal = (comm.local_rank().0 as u32) % count.max(1);
            Some(cuda.device(ordinal).map_err(PerfError::Cuda)?)
        }
    };
    let mut sink = std::io::sink();
    let out: &mut dyn Write = if comm.rank() == 0 { out } else { &mut sink };
    bench(args, &mut comm, gpu.as_ref(), out)
}

/// One checked run of a collective, as `coll-perf -c` makes it: fill every rank's inputs from a
/// [`Pattern`], poison the outputs, run, and count this rank's wrong output elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub datatype: DataType,
    /// Operator (reducing collectives).
    pub op: RedOp,
    /// Root (rooted collectives).
    pub root: usize,
    /// The `count` argument (per rank block for all-gather, reduce-scatter, all-to-all,
    /// scatter and gather).
    pub count: usize,
    /// In place or out of place.
    pub in_place: bool,
}

impl Case {
    /// Runs the case once with data of repetition `rep`; returns this rank's wrong elements.
    ///
    /// # Errors
    /// [`PerfError::Coll`] from the operation; [`PerfError::Alloc`] when the buffers cannot be
    /// allocated.
    pub fn run_checked(&self, comm: &mut Communicator, rep: u64) -> Result<u64, PerfError> {
        let counts = Counts::for_param(self.collective, self.count, comm.nranks());
        let mut b = Buffers::new(&counts, self.datatype.size())?;
        let pattern = Pattern {
            datatype: self.datatype,
            op: self.op,
            nranks: comm.nranks(),
            rep,
        };
        b.fill(self, &pattern, comm.rank());
        b.run(self, comm)?;
        Ok(b.count_wrong(self, &pattern, comm.rank(), &counts))
    }

    /// [`Case::run_checked`] on device buffers made by `alloc` (the collectives' `*_mem` forms).
    ///
    /// # Errors
    /// [`PerfError::Coll`] from the operation; [`PerfError::Args`] when a buffer cannot be made,
    /// written or read.
    pub fn run_checked_mem(
        &self,
        comm: &mut Communicator,
        rep: u64,
        alloc: Allocator<'_>,
    ) -> Result<u64, PerfError> {
        let counts = Counts::for_param(self.collective, self.count, comm.nranks());
        let mut b = Bufs::with(&counts, self.datatype.size(), alloc)?;
        let pattern = Pattern {
            datatype: self.datatype,
            op: self.op,
            nranks: comm.nranks(),
            rep,
        };
        b.fill(self, &pattern, comm.rank())?;
        b.run(self, comm)?;
        b.count_wrong(self, &pattern, comm.rank(), &counts)
    }
}

/// The header's `transport:` field: the transport the communicator was configured with after
/// `--link` and the environment (`roce` when `--link` selected it), and for `auto` the transports
/// its paths to the other ranks actually take, e.g. `auto (shm)`, `auto (shm+roce)`.
fn transport_used(comm: &Communicator) -> String {
    let kind = comm.config().transport;
    if kind != TransportKind::Auto {
        return kind.to_string();
    }
    let mut used: Vec<String> = Vec::new();
    for r in 0..comm.nranks() {
        if let Some(t) = comm
            .path(r)
            .filter(|p| *p != crate::topology::Path::SelfRank)
            .and_then(|p| p.transport())
        {
            let t = t.to_string();
            if !used.contains(&t) {
                used.push(t);
            }
        }
    }
    if used.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} ({})", used.join("+"))
    }
}

/// Buffers of one size.
struct Buffers {
    send: Vec<u8>,
    recv: Vec<u8>,
    inplace: Vec<u8>,
}

/// Byte value that output buffers are poisoned with before a checked run: as `f32`, `bf16`,
/// `f16`, or any integer it is no value a check can expect.
const POISON: u8 = 0x5a;

fn bench(
    args: &PerfArgs,
    comm: &mut Communicator,
    gpu: Option<&Arc<CudaDevice>>,
    out: &mut dyn Write,
) -> Result<u64, PerfError> {
    let (n, me) = (comm.nranks(), comm.rank());
    let (coll, dt) = (args.collective, args.datatype);
    let es = dt.size();
    let sizes = args.sizes();
    writeln!(out, "# Collective test starting: coll-perf {}", coll.name())?;
    writeln!(
        out,
        "# nRanks {n} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} validation: {} transport: {}",
        args.min_bytes,
        args.max_bytes,
        if args.step_factor > 1 { args.step_factor } else { args.step_bytes },
        if args.step_factor > 1 { "factor" } else { "bytes" },
        args.warmup_iters,
        args.iters,
        args.check,
        transport_used(comm)
    )?;
    if let Some(d) = gpu {
        let info = d.info().map_err(PerfError::Cuda)?;
        writeln!(
            out,
            "# device: cuda (rank 0 on GPU {} {}, {}, compute {}.{})",
            info.ordinal,
            info.name,
            info.pci_bus_id,
            info.compute_capability.0,
            info.compute_capability.1
        )?;
    }
    writeln!(out, "#\n# Using ranks")?;
    for r in 0..n {
        let path = match comm.path(r) {
            Some(crate::topology::Path::SelfRank) | None => "self".to_string(),
            Some(p) => p.transport().map_or("?".into(), |t| t.to_string()),
        };
        writeln!(
            out,
            "#  Rank {r:>2} Pid {:>6} on {:>10} via {path}",
            comm.pid(r).unwrap_or(0),
            comm.hostname(r).unwrap_or("?")
        )?;
    }

    let case_of = |counts: &Counts, in_place: bool| Case {
        collective: coll,
        datatype: dt,
        op: args.op,
        root: args.root,
        count: counts.param,
        in_place,
    };
    writeln!(out, "#")?;
    write!(out, "{TableHeader}")?;
    let (mut bw_sum, mut bw_count, mut wrong_total) = (0.0, 0usize, 0u64);
    let mut rep = 0u64;
    for &size in &sizes {
        let counts = Counts::new(coll, size, es, n);
        let mut b = Bufs::new(&counts, es, gpu)?;
        let mut line = row_preamble(
            counts.size_bytes(es),
            counts.param,
            dt.name(),
            if coll.reduces() {
                args.op.name()
            } else {
                "none"
            },
            if coll.rooted() { args.root as i64 } else { -1 },
        );
        let pattern = Pattern {
            datatype: dt,
            op: args.op,
            nranks: n,
            rep: 0,
        };
        // Warm-up, untimed, on the very buffers timed below, both cases: a fresh buffer's first
        // use costs page faults (an out-of-place output is first written inside the collective)
        // and, on RoCE, a memory registration; warming other buffers (as a warm-up of every size
        // up front did) left those costs in the first timed row: 1 KiB out of place measured
        // 137-205 us against 21-40 us in place in 3 of 4 runs (4 ranks, shm, load 4-5).
        for in_place in [false, true] {
            let case = case_of(&counts, in_place);
            b.fill(&case, &pattern, me)?;
            for _ in 0..args.warmup_iters {
                b.run(&case, comm)?;
            }
        }
        for in_place in [false, true] {
            let case = case_of(&counts, in_place);
            // Time on real data (no NaN or denormal slow paths), as nccl-tests does.
            b.fill(&case, &pattern, me)?;
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..args.iters {
                b.run(&case, comm)?;
            }
            let mut secs = [t.elapsed().as_secs_f64() / args.iters as f64];
            comm.all_reduce_typed_in_place(&mut secs, RedOp::Sum)?;
            let secs = secs[0] / n as f64;
            let (algbw, busbw) = bandwidth(coll, counts.param, es, secs, n);
            let wrong = if args.check > 0 {
                let mut wrong = [0u64];
                for _ in 0..args.check {
                    rep += 1;
                    let pattern = Pattern { rep, ..pattern };
                    b.fill(&case, &pattern, me)?;
                    b.run(&case, comm)?;
                    wrong[0] = b.count_wrong(&case, &pattern, me, &counts)?;
                    comm.all_reduce_typed_in_place(&mut wrong, RedOp::Sum)?;
                    if wrong[0] > 0 {
                        break;
                    }
                }
                wrong_total += wrong[0];
                Some(wrong[0])
            } else {
                None
            };
            bw_sum += busbw;
            bw_count += 1;
            line.push_str(&row_body(secs * 1e6, algbw, busbw, wrong));
        }
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    let avg = if bw_count > 0 {
        bw_sum / bw_count as f64
    } else {
        0.0
    };
    writeln!(
        out,
        "# {:<20} : {} {}",
        "Out of bounds values",
        wrong_total,
        if wrong_total > 0 { "FAILED" } else { "OK" }
    )?;
    writeln!(out, "# {:<20} : {} ", "Avg bus bandwidth", report::c_g(avg))?;
    if gpu.is_some() && coll == Collective::AllReduce {
        // Which path the device all-reduces took on this rank (every rank takes the same one).
        let st = comm.device_path_stats();
        writeln!(
            out,
            "# {:<20} : gpu-p2p {} calls, staged {} calls{}",
            "All-reduce path",
            st.gpu_p2p,
            st.staged,
            st.last_fallback
                .as_ref()
                .map_or(String::new(), |w| format!(" (staged because: {w})"))
        )?;
    }
    if let Some(d) = gpu {
        let bytes = sizes.last().copied().unwrap_or(0) as usize;
        let gbs = d2d_bandwidth(d, bytes.max(1)).map_err(PerfError::Cuda)?;
        writeln!(
            out,
            "# {:<20} : {} GB/s (cuMemcpyDtoDAsync of {} bytes on GPU {}, same run)",
            "D2D copy bandwidth",
            report::c_g(gbs),
            bytes.max(1),
            d.ordinal()
        )?;
    }
    writeln!(
        out,
        "#\n# Collective test concluded: coll-perf {}",
        coll.name()
    )?;
    out.flush()?;
    Ok(wrong_total)
}

/// Device-to-device copy bandwidth in GB/s (1e9 bytes/s): `bytes` copied between two buffers on
/// `device`, best of 5 timed copies (CUDA events), after one warm-up copy.
pub fn d2d_bandwidth(device: &Arc<CudaDevice>, bytes: usize) -> Result<f64, gpu_p2p::CudaError> {
    let (a, b) = (device.alloc(bytes)?, device.alloc(bytes)?);
    let stream = device.stream()?;
    let (start, end) = (device.event(true)?, device.event(true)?);
    stream.copy_device(&b, 0, &a, 0, bytes)?;
    stream.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        start.record(&stream)?;
        stream.copy_device(&b, 0, &a, 0, bytes)?;
        end.record(&stream)?;
        end.wait(Duration::from_secs(30))?;
        best = best.min(f64::from(end.elapsed_ms(&start)?) / 1e3);
    }
    Ok(bytes as f64 / best.max(1e-9) / 1e9)
}

/// Makes a device buffer of the given length in bytes.
pub type Allocator<'a> = &'a dyn Fn(usize) -> Result<Box<dyn DeviceBuffer>, String>;

/// Buffers of one size in host memory, or in device buffers (any [`DeviceBuffer`]) with host
/// mirrors for filling and checking.
enum Bufs {
    Host(Buffers),
    Mem {
        mirror: Buffers,
        send: Box<dyn DeviceBuffer>,
        recv: Box<dyn DeviceBuffer>,
        inplace: Box<dyn DeviceBuffer>,
    },
}

fn mem_err(what: &str, e: impl fmt::Display) -> PerfError {
    PerfError::Args(format!("device buffer: {what}: {e}"))
}

impl Bufs {
    fn new(c: &Counts, es: usize, gpu: Option<&Arc<CudaDevice>>) -> Result<Bufs, PerfError> {
        match gpu {
            None => Ok(Bufs::Host(Buffers::new(c, es)?)),
            Some(d) => Bufs::with(c, es, &|n| {
                d.alloc(n)
                    .map(|m| Box::new(m) as Box<dyn DeviceBuffer>)
                    .map_err(|e| e.to_string())
            }),
        }
    }

    fn with(c: &Counts, es: usize, alloc: Allocator<'_>) -> Result<Bufs, PerfError> {
        let mirror = Buffers::new(c, es)?;
        let a = |n: usize| alloc(n).map_err(|e| mem_err("allocation", e));
        Ok(Bufs::Mem {
            send: a(mirror.send.len())?,
            recv: a(mirror.recv.len())?,
            inplace: a(mirror.inplace.len())?,
            mirror,
        })
    }

    fn fill(&mut self, case: &Case, p: &Pattern, me: usize) -> Result<(), PerfError> {
        match self {
            Bufs::Host(b) => {
                b.fill(case, p, me);
                Ok(())
            }
            Bufs::Mem {
                mirror,
                send,
                recv,
                inplace,
            } => {
                mirror.fill(case, p, me);
                let up =
                    |m: &dyn DeviceBuffer, v: &[u8]| m.write(0, v).map_err(|e| mem_err("write", e));
                if case.in_place {
                    up(&**inplace, &mirror.inplace)
                } else {
                    up(&**send, &mirror.send)?;
                    up(&**recv, &mirror.recv)
                }
            }
        }
    }

    fn run(&mut self, case: &Case, comm: &mut Communicator) -> Result<(), CollError> {
        let (send, recv, buf) = match self {
            Bufs::Host(b) => return b.run(case, comm),
            Bufs::Mem {
                send,
                recv,
                inplace,
                ..
            } => (&**send, &**recv, &**inplace),
        };
        let (dt, op, root, count) = (case.datatype, case.op, case.root, case.count);
        match (case.collective, case.in_place) {
            (Collective::AllReduce, false) => comm.all_reduce_mem(send, recv, count, dt, op),
            (Collective::AllReduce, true) => comm.all_reduce_mem_in_place(buf, count, dt, op),
            (Collective::AllGather, false) => comm.all_gather_mem(send, recv, count, dt),
            (Collective::AllGather, true) => comm.all_gather_mem_in_place(buf, count, dt),
            (Collective::ReduceScatter, false) => {
                comm.reduce_scatter_mem(send, recv, count, dt, op)
            }
            (Collective::ReduceScatter, true) => {
                comm.reduce_scatter_mem_in_place(buf, count, dt, op)
            }
            (Collective::Broadcast, false) => comm.broadcast_mem(send, recv, count, dt, root),
            (Collective::Broadcast, true) => comm.broadcast_mem_in_place(buf, count, dt, root),
            (Collective::Reduce, false) => comm.reduce_mem(send, recv, count, dt, op, root),
            (Collective::Reduce, true) => comm.reduce_mem_in_place(buf, count, dt, op, root),
            (Collective::AllToAll, false) => comm.all_to_all_mem(send, recv, count, dt),
            (Collective::AllToAll, true) => comm.all_to_all_mem_in_place(buf, count, dt),
            (Collective::Scatter, false) => comm.scatter_mem(send, recv, count, dt, root),
            (Collective::Scatter, true) => comm.scatter_mem_in_place(buf, count, dt, root),
            (Collective::Gather, false) => comm.gather_mem(send, recv, count, dt, root),
            (Collective::Gather, true) => comm.gather_mem_in_place(buf, count, dt, root),
        }
    }

    fn count_wrong(
        &mut self,
        case: &Case,
        p: &Pattern,
        me: usize,
        c: &Counts,
    ) -> Result<u64, PerfError> {
        match self {
            Bufs::Host(b) => Ok(b.count_wrong(case, p, me, c)),
            Bufs::Mem {
                mirror,
                recv,
                inplace,
                ..
            } => {
                if case.in_place {
                    inplace
                        .read(0, &mut mirror.inplace)
                        .map_err(|e| mem_err("read", e))?;
                } else {
                    recv.read(0, &mut mirror.recv)
                        .map_err(|e| mem_err("read", e))?;
                }
                Ok(mirror.count_wrong(case, p, me, c))
            }
        }
    }
}

impl Buffers {
    /// Zeroed buffers for `c` elements of `es` bytes; [`PerfError::Alloc`] rather than an abort
    /// when the allocator refuses one (a `-e` larger than the host's memory).
    fn new(c: &Counts, es: usize) -> Result<Buffers, PerfError> {
        let zeroed = |elems: usize| -> Result<Vec<u8>, PerfError> {
            let bytes = elems.saturating_mul(es);
            let mut v = Vec::new();
            v.try_reserve_exact(bytes)
                .map_err(|source| PerfError::Alloc { bytes, source })?;
            v.resize(bytes, 0);
            Ok(v)
        };
        Ok(Buffers {
            send: zeroed(c.send)?,
            recv: zeroed(c.recv)?,
            inplace: zeroed(c.send.max(c.recv))?,
        })
    }

    /// Writes this rank's inputs (and poisons outputs) for one run.
    fn fill(&mut self, case: &Case, p: &Pattern, me: usize) {
        let block = case.count * case.datatype.size();
        if !case.in_place {
            p.fill(me, &mut self.send, 0);
            self.recv.fill(POISON);
            return;
        }
        let buf = &mut self.inplace;
        match case.collective {
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => {
                p.fill(me, buf, 0)
            }
            Collective::Reduce => p.fill(me, buf, 0),
            Collective::Broadcast => {
                if me == case.root {
                    p.fill(me, buf, 0)
                } else {
                    buf.fill(POISON)
                }
            }
            Collective::Scatter => {
                if me == case.root {
                    p.fill(me, buf, 0)
                } else {
                    buf.fill(POISON)
                }
            }
            Collective::AllGather | Collective::Gather => {
                buf.fill(POISON);
                p.fill(me, &mut buf[me * block..(me + 1) * block], 0);
            }
        }
    }

    /// Runs the case's operation on these buffers.
    fn run(&mut self, case: &Case, comm: &mut Communicator) -> Result<(), CollError> {
        let (dt, op, root, count) = (case.datatype, case.op, case.root, case.count);
        let (send, recv, buf) = (&self.send, &mut self.recv, &mut self.inplace);
        match (case.collective, case.in_place) {
            (Collective::AllReduce, false) => comm.all_reduce(send, recv, count, dt, op),
            (Collective::AllReduce, true) => comm.all_reduce_in_place(buf, count, dt, op),
            (Collective::AllGather, false) => comm.all_gather(send, recv, count, dt),
            (Collective::AllGather, true) => comm.all_gather_in_place(buf, count, dt),
            (Collective::ReduceScatter, false) => comm.reduce_scatter(send, recv, count, dt, op),
            (Collective::ReduceScatter, true) => comm.reduce_scatter_in_place(buf, count, dt, op),
            (Collective::Broadcast, false) => comm.broadcast(send, recv, count, dt, root),
            (Collective::Broadcast, true) => comm.broadcast_in_place(buf, count, dt, root),
            (Collective::Reduce, false) => comm.reduce(send, recv, count, dt, op, root),
            (Collective::Reduce, true) => comm.reduce_in_place(buf, count, dt, op, root),
            (Collective::AllToAll, false) => comm.all_to_all(send, recv, count, dt),
            (Collective::AllToAll, true) => comm.all_to_all_in_place(buf, count, dt),
            (Collective::Scatter, false) => comm.scatter(send, recv, count, dt, root),
            (Collective::Scatter, true) => comm.scatter_in_place(buf, count, dt, root),
            (Collective::Gather, false) => comm.gather(send, recv, count, dt, root),
            (Collective::Gather, true) => comm.gather_in_place(buf, count, dt, root),
        }
    }

    /// Wrong elements of this rank's output of the last run.
    fn count_wrong(&self, case: &Case, p: &Pattern, me: usize, c: &Counts) -> u64 {
        let es = case.datatype.size();
        let (param, root) = (c.param, case.root);
        let block = param * es;
        let output: &[u8] = match (case.in_place, case.collective) {
            (false, _) => &self.recv,
            (true, Collective::ReduceScatter | Collective::Scatter) => {
                &self.inplace[me * block..(me + 1) * block]
            }
            (true, _) => &self.inplace[..c.recv * es],
        };
        let by_block = |k: usize| (k / param.max(1), k % param.max(1));
        match case.collective {
            Collective::AllReduce => p.count_wrong(output, |k| Expect::Reduced { index: k }),
            Collective::Reduce if me == root => {
                p.count_wrong(output, |k| Expect::Reduced { index: k })
            }
            Collective::Reduce => 0,
            Collective::Broadcast => p.count_wrong(output, |k| Expect::Value {
                rank: root,
                index: k,
            }),
            Collective::AllGather => p.count_wrong(output, |k| {
                let (rank, index) = by_block(k);
                Expect::Value { rank, index }
            }),
            Collective::Gather if me == root => p.count_wrong(output, |k| {
                let (rank, index) = by_block(k);
                Expect::Value { rank, index }
            }),
            Collective::Gather => 0,
            Collective::ReduceScatter => p.count_wrong(output, |k| Expect::Reduced {
                index: me * param + k,
            }),
            Collective::AllToAll => p.count_wrong(output, |k| {
                let (rank, index) = by_block(k);
                Expect::Value {
                    rank,
                    index: me * param + index,
                }
            }),
            Collective::Scatter => p.count_wrong(output, |k| Expect::Value {
                rank: root,
                index: me * param + k,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<PerfArgs, clap::Error> {
        PerfArgs::try_parse_from(std::iter::once("coll-perf").chain(args.iter().copied()))
    }

    #[test]
    fn parses_nccl_tests_options() {
        let a = parse(&[
            "all-reduce",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "2",
            "-n",
            "5",
            "-w",
            "2",
            "-d",
            "half",
            "-o",
            "max",
            "-c",
            "3",
            "--ranks",
            "8",
            "--transport",
            "shm",
        ])
        .unwrap();
        assert_eq!(a.collective, Collective::AllReduce);
        assert_eq!(
            (a.min_bytes, a.max_bytes, a.step_factor),
            (1024, 1 << 20, 2)
        );
        assert_eq!((a.iters, a.warmup_iters, a.check), (5, 2, 3));
        assert_eq!((a.datatype, a.op), (DataType::F16, RedOp::Max));
        assert_eq!((a.ranks, a.transport), (Some(8), TransportKind::Shm));
        assert_eq!(a.sizes(), (10..=20).map(|p| 1u64 << p).collect::<Vec<_>>());
        a.validate().unwrap();

        let d = parse(&["broadcast"]).unwrap();
        assert_eq!(
            (d.min_bytes, d.max_bytes, d.iters, d.warmup_iters),
            (32 << 20, 32 << 20, 20, 1)
        );
        assert_eq!(
            (d.datatype, d.op, d.root, d.check, d.ranks),
            (DataType::F32, RedOp::Sum, 0, 1, None)
        );
        assert_eq!(d.transport, TransportKind::Auto);

        let s = parse(&["gather", "-b", "1M", "-e", "3M", "-i", "1M"]).unwrap();
        assert_eq!(s.sizes(), vec![1 << 20, 2 << 20, 3 << 20]);
        for name in [
            "all-reduce",
            "all-gather",
            "reduce-scatter",
            "broadcast",
            "reduce",
            "all-to-all",
            "scatter",
            "gather",
        ] {
            assert_eq!(parse(&[name]).unwrap().collective.name(), name);
        }
    }

    #[test]
    fn rejects_bad_options_with_clear_messages() {
        assert!(parse(&[]).is_err(), "collective required");
        assert!(parse(&["all-everything"]).is_err());
        let e = parse(&["all-reduce", "-d", "float128"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("float128"), "{e}");
        let e = parse(&["all-reduce", "--transport", "inproc"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("auto, shm, roce"), "{e}");
        let e = parse(&["all-reduce", "-b", "1Q"]).unwrap_err().to_string();
        assert!(e.contains("1Q"), "{e}");
        let a = parse(&["all-reduce", "-b", "2M", "-e", "1M"]).unwrap();
        assert!(a.validate().unwrap_err().contains("minbytes"));
        let a = parse(&["all-reduce", "--ranks", "0"]).unwrap();
        assert!(a.validate().is_err());
    }

    /// A writer that records every `write` call, as write(2) would see them.
    struct Calls(Vec<Vec<u8>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A line with arguments reaches the writer in one call (`eprintln!`'s `write_fmt` makes one
    /// per piece: "coll-perf rank ", "1", ": ", ..., and ranks' pieces interleaved).
    #[test]
    fn say_line_writes_a_line_in_one_call() {
        let mut w = Calls(Vec::new());
        let (rank, root, n) = (1, 7, 4);
        say_line(
            &mut w,
            format_args!("coll-perf rank {rank}: root {root} is not below the {n} ranks"),
        );
        assert_eq!(
            w.0,
            vec![b"coll-perf rank 1: root 7 is not below the 4 ranks\n".to_vec()]
        );
        let mut e = Calls(Vec::new());
        writeln!(
            e,
            "coll-perf rank {rank}: root {root} is not below the {n} ranks"
        )
        .unwrap();
        assert!(
            e.0.len() > 1,
            "the splitting this guards against: {:?}",
            e.0
        );
    }

    #[test]
    fn link_selects_the_roce_device() {
        let a = parse(&["all-reduce", "--link", "verbs:rxe0"]).unwrap();
        assert_eq!(a.link.as_deref(), Some("verbs:rxe0"));
        assert_eq!(a.config().unwrap().transport, TransportKind::Roce);
        let a = parse(&["all-reduce", "--link", "udp"]).unwrap();
        assert_eq!(a.link.as_deref(), Some("udp"));
        let a = parse(&[
            "all-reduce",
            "--link",
            "udp:127.0.0.3",
            "--transport",
            "shm",
        ])
        .unwrap();
        assert_eq!(a.link.as_deref(), Some("udp:127.0.0.3"));
        assert_eq!(a.config().unwrap().transport, TransportKind::Shm);
        let e = parse(&["all-reduce", "--link", "vfio:0000:00:04.0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not supported for coll-perf"), "{e}");
        let e = parse(&["all-reduce", "--link", "verbs:"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("verbs:DEVICE"), "{e}");
    }
}
