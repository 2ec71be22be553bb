//! The device a rank opens (a libibverbs device or the software HCA on UDP), its protection
//! domain and its registered regions ([`Hca`], [`Region`]). Every call that opens a device or
//! allocates its PD is here, in [`Hca::open`].

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use gpu_p2p::{HostMemory, HostPtr, Memory};
use hca::open::{open, DeviceSpec, OpenOptions};
use hca::soft::{DeviceError, Progress};
use hca::verbs::Verbs;
use hca::{AccessFlags, MemoryRegion, PdHandle};

use super::env::{choose_address, RoceEnv};
use super::keepalive::Keepalive;
use super::registration::RegCache;
use super::stats::Stats;
use crate::transport::{SetupContext, TransportError};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A page-aligned host buffer registered with the device: memory the device sends from without
/// a copy where it has some ([`hca::verbs::Verbs::alloc_memory`]: the UMEM of an AF_XDP link),
/// else [`HostMemory`].
pub(super) struct Region {
    pub(super) mem: Arc<dyn Memory>,
    /// The CPU address of byte 0 (`mem.host_ptr()`).
    base: HostPtr,
    pub(super) mr: MemoryRegion,
}

impl Region {
    pub(super) fn new(
        hca: &Hca,
        len: usize,
        access: AccessFlags,
        what: &'static str,
    ) -> Result<Region, TransportError> {
        let setup = |e: String| TransportError::Setup {
            peer: None,
            op: "allocating",
            on: format!("{what} ({len} bytes)"),
            source: io::Error::other(e),
        };
        // Device memory first (used up: host memory, whose payloads take one copy).
        let mem = match hca.dev.alloc_memory(len) {
            Some(Ok(m)) => m,
            _ => Arc::new(HostMemory::new(len).map_err(|e| setup(e.to_string()))?),
        };
        let base = mem
            .host_ptr()
            .ok_or_else(|| setup("memory the CPU cannot address".into()))?;
        // The iova is the virtual address, as ibv_reg_mr(3) uses.
        let iova = base.as_ptr().as_ptr() as u64;
        let mr = hca
            .dev
            .reg_mr(hca.pd, mem.clone(), 0, len, iova, access)
            .map_err(Hca::verbs("ibv_reg_mr", None))?;
        Ok(Region { mem, base, mr })
    }

    pub(super) fn iova(&self, offset: usize) -> u64 {
        self.mr.iova() + offset as u64
    }

    pub(super) fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.mem.len());
        // SAFETY: callers pass offsets inside the buffer (checked by the layout), so the
        // result stays inside the same allocation.
        unsafe { self.base.as_ptr().as_ptr().add(offset) }
    }
}

/// A rank's device and protection domain, shared by its channels; closing it (the last drop)
/// sends what is queued, flushes every WR and joins the progress thread.
pub(super) struct Hca {
    pub(super) dev: Arc<dyn Verbs>,
    /// The device is the software HCA on a UDP socket (it tells peers apart by address).
    pub(super) software: bool,
    /// The program drives the device's progress (the software HCA with caller-driven progress):
    /// every poll is a progress round, and the keepalive thread covers the gaps.
    pub(super) caller_driven: bool,
    pub(super) pd: PdHandle,
    pub(super) regs: Mutex<RegCache>,
    /// WRs reading user memory, posted and not completed, on every channel of the device.
    pub(super) user_wrs: AtomicUsize,
    /// Bumped by every wait of a connector (the rank thread drives the device meanwhile).
    pub(super) activity: Arc<AtomicU64>,
    pub(super) keepalive: Option<Keepalive>,
    /// Wait and pipelining counters (printed with `COLL_ROCE_STATS=1`).
    pub(super) stats: Stats,
}

impl Drop for Hca {
    fn drop(&mut self) {
        // Stop the keepalive thread before the device closes.
        self.keepalive = None;
        if std::env::var("COLL_ROCE_STATS").is_ok_and(|v| v == "1") {
            if let Some(stats) = self.dev.stats() {
                let regs = lock(&self.regs);
                let lines: Vec<String> = stats.iter().map(|(k, v)| format!("{k} {v}")).collect();
                eprintln!(
                    "coll roce {}: {}\n  user buffers: {} registrations, {} cache hits\n  {}",
                    self.dev.name(),
                    lines.join("\n  "),
                    regs.registrations,
                    regs.hits,
                    self.stats
                );
            }
        }
    }
}

impl Hca {
    /// Opens the device the environment selects (a libibverbs device, or the software HCA on
    /// a UDP socket at the rank's address, see the [module docs](super#addresses)), allocates
    /// its protection domain and, with caller-driven progress, starts the keepalive thread.
    pub(super) fn open(ctx: &SetupContext<'_>, env: &RoceEnv) -> Result<Arc<Hca>, TransportError> {
        let spec = match (&env.verbs, &env.xdp) {
            (Some(name), _) => DeviceSpec::Verbs(name.clone()),
            (None, Some(ifname)) => DeviceSpec::Xdp(ifname.clone()),
            (None, None) => DeviceSpec::Udp {
                ip: choose_address(ctx, env)?,
                port: Some(env.port),
            },
        };
        let software = env.verbs.is_none();
        let mut options = OpenOptions {
            progress: env.progress,
            ..OpenOptions::default()
        };
        if let Some(w) = env.window {
            options.engine.max_unacked_psns = w;
        }
        if let Some(d) = env.ack_delay {
            options.engine.ack_delay = d;
        }
        let what = if env.xdp.is_some() {
            "opening the AF_XDP device"
        } else if software {
            "opening the UDP device"
        } else {
            "opening the verbs device"
        };
        let dev = open(&spec, &options).map_err(Hca::verbs(what, None))?;
        let pd = dev.alloc_pd().map_err(Hca::verbs("ibv_alloc_pd", None))?;
        let caller_driven = software && env.progress == Progress::Caller;
        let activity = Arc::new(AtomicU64::new(0));
        let keepalive = if caller_driven {
            Some(
                Keepalive::start(dev.clone(), activity.clone()).map_err(|source| {
                    TransportError::Setup {
                        peer: None,
                        op: "starting the keepalive thread",
                        on: dev.name(),
                        source,
                    }
                })?,
            )
        } else {
            None
        };
        let hca = Arc::new(Hca {
            dev,
            software,
            caller_driven,
            pd,
            regs: Mutex::new(RegCache::new()),
            user_wrs: AtomicUsize::new(0),
            activity,
            keepalive,
            stats: Stats::default(),
        });
        Ok(hca)
    }

    pub(super) fn verbs(
        op: &'static str,
        peer: Option<usize>,
    ) -> impl Fn(DeviceError) -> TransportError {
        move |source| TransportError::Verbs {
            peer,
            op,
            source: Box::new(source),
        }
    }
}
