//! [`CommConfig`]: how a communicator is built and how it waits, and its `COLL_*` environment
//! overrides.

use std::time::Duration;

use crate::bootstrap::EnvError;
use crate::error::InitError;
use crate::transport::kind::TransportKind;
use crate::transport::wait::WaitPolicy;

/// How a communicator is built and how it waits. Every rank must use the same transport,
/// channel count, slot count and slot size (checked at init).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommConfig {
    /// Transport selection (`--transport`).
    pub transport: TransportKind,
    /// Channels per peer pair; consecutive chunks to one peer go round-robin over them (one QP
    /// each on RoCE). Default 1.
    pub nchannels: usize,
    /// Slots per channel: how many chunks a sender may run ahead (NCCL's `NCCL_STEPS`).
    /// Default 8.
    pub nslots: usize,
    /// Payload bytes per slot, a multiple of 64: the chunk size (NCCL's buffer size /
    /// `NCCL_STEPS`). Default 128 KiB.
    pub slot_bytes: usize,
    /// Longest wait without progress inside an operation before it fails naming the peer.
    /// Default 60 s.
    pub timeout: Duration,
    /// Deadline of each bootstrap step (connecting, each all-gather). Default 60 s.
    pub bootstrap_timeout: Duration,
    /// How connectors wait; `None`: chosen from the number of ranks on this host against its
    /// CPUs ([`WaitPolicy::for_local_ranks`]).
    pub wait: Option<WaitPolicy>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            transport: TransportKind::Auto,
            nchannels: 1,
            nslots: 8,
            slot_bytes: 128 << 10,
            timeout: Duration::from_secs(60),
            bootstrap_timeout: Duration::from_secs(60),
            wait: None,
        }
    }
}

impl CommConfig {
    /// This configuration with the environment's overrides applied: `COLL_TRANSPORT`
    /// (`auto|shm|roce|inproc`), `COLL_NCHANNELS`, `COLL_NSLOTS`, `COLL_SLOT_BYTES`,
    /// `COLL_TIMEOUT_MS`, `COLL_BOOTSTRAP_TIMEOUT_MS`, and the wait policy's `COLL_SPIN` and
    /// `COLL_YIELDS` (as NCCL reads `NCCL_*`).
    ///
    /// # Errors
    /// [`EnvError::Invalid`] for a value that does not parse.
    pub fn with_env_overrides(mut self) -> Result<Self, EnvError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let num = |var: &'static str, v: String| {
            v.trim().parse::<u64>().map_err(|_| EnvError::Invalid {
                var,
                value: v,
                expected: "a non-negative integer",
            })
        };
        if let Some(v) = get("COLL_TRANSPORT") {
            self.transport = v.parse().map_err(|_| EnvError::Invalid {
                var: "COLL_TRANSPORT",
                value: v,
                expected: "auto, shm, roce or inproc",
            })?;
        }
        if let Some(v) = get("COLL_NCHANNELS") {
            self.nchannels = num("COLL_NCHANNELS", v)? as usize;
        }
        if let Some(v) = get("COLL_NSLOTS") {
            self.nslots = num("COLL_NSLOTS", v)? as usize;
        }
        if let Some(v) = get("COLL_SLOT_BYTES") {
            self.slot_bytes = num("COLL_SLOT_BYTES", v)? as usize;
        }
        if let Some(v) = get("COLL_TIMEOUT_MS") {
            self.timeout = Duration::from_millis(num("COLL_TIMEOUT_MS", v)?);
        }
        if let Some(v) = get("COLL_SPIN") {
            let base = self.wait.unwrap_or(WaitPolicy::DEDICATED);
            self.wait = Some(WaitPolicy {
                spin: num("COLL_SPIN", v)? as u32,
                ..base
            });
        }
        if let Some(v) = get("COLL_YIELDS") {
            let base = self.wait.unwrap_or(WaitPolicy::DEDICATED);
            self.wait = Some(WaitPolicy {
                yields: num("COLL_YIELDS", v)? as u32,
                ..base
            });
        }
        if let Some(v) = get("COLL_BOOTSTRAP_TIMEOUT_MS") {
            self.bootstrap_timeout = Duration::from_millis(num("COLL_BOOTSTRAP_TIMEOUT_MS", v)?);
        }
        Ok(self)
    }

    pub(super) fn validate(&self) -> Result<(), InitError> {
        let bad = |what: String| Err(InitError::InvalidArgument(what));
        if self.nchannels == 0 || self.nchannels > 64 {
            return bad(format!("nchannels {} (1..=64)", self.nchannels));
        }
        if self.nslots == 0 || self.nslots > 1024 {
            return bad(format!("nslots {} (1..=1024)", self.nslots));
        }
        if self.slot_bytes < 64 || self.slot_bytes % 64 != 0 || self.slot_bytes > 1 << 30 {
            return bad(format!(
                "slot_bytes {} (a multiple of 64, 64 B ..= 1 GiB)",
                self.slot_bytes
            ));
        }
        Ok(())
    }
}
