//! Bootstrap: how ranks find each other before any data moves (NCCL's `bootstrap.cc`).
//!
//! 1. **Who am I.** [`launcher`] reads the rank, the world size and the rendezvous address from the
//!    environment a launcher set (torchrun, Open MPI's `mpirun`, Slurm's `srun`), or the program
//!    passes them explicitly with a [`UniqueId`] (NCCL's `ncclGetUniqueId` +
//!    `ncclCommInitRank`).
//! 2. **Rendezvous.** Rank 0 (or whoever created the unique id) runs a small TCP root; every rank
//!    connects to it (bounded retries) and the root runs *all-gathers* of opaque byte records:
//!    first every rank's [`BusinessCard`] (host id, pid, requested transport, geometry), then each
//!    rank's transport connection info (shm segment names now; QPNs, GIDs, PSNs, rkeys and slot
//!    addresses on the RoCE path), then a barrier. Then the connections close: the rendezvous
//!    gets out of the way and data moves only over the transports.
//! 3. **Topology.** [`crate::topology`] decides, per peer pair, which transport connects it.
//!
//! Every step has a deadline; a rank that fails during the bootstrap tells the root, and the root
//! tells every other rank, naming the rank that failed.

use core::fmt;
use std::io;

use crate::codec::{Reader, Writer};
use crate::transport::kind::TransportKind;

// Edge: FFI, gethostname(2).
#[allow(unsafe_code)]
pub mod host;
pub mod launcher;
pub mod rendezvous;
pub(crate) mod secret;
pub mod store;

pub use host::{host_id, hostname, HostId};
pub use launcher::{EnvError, LaunchInfo, Launcher, SecretSource};
pub use rendezvous::{Rendezvous, UniqueId};
pub use store::{MemStore, Store, StoreError};

/// What a communicator's setup needs from a bootstrap: all-gathers of opaque records, a
/// barrier, a way to tell the others it failed, and the local address the ranks reach each
/// other from (the RoCE path picks its GID from it). Implemented by the TCP [`Rendezvous`], the
/// key-value store ([`store::StoreRendezvous`]) and a parent communicator (`split`).
pub(crate) trait Exchange {
    /// Every rank's `record`, indexed by rank.
    fn all_gather(&mut self, record: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), BootstrapError> {
        self.all_gather(&[]).map(|_| ())
    }
    /// Tells every other rank that this one failed, with `message`.
    fn abort(&mut self, message: &str);
    /// The local IP address the ranks reach this one from, if the bootstrap knows it.
    fn local_ip(&self) -> Option<std::net::IpAddr>;
}

impl Exchange for Rendezvous {
    fn all_gather(&mut self, record: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        Rendezvous::all_gather(self, record)
    }
    fn barrier(&mut self) -> Result<(), BootstrapError> {
        Rendezvous::barrier(self)
    }
    fn abort(&mut self, message: &str) {
        Rendezvous::abort(self, message)
    }
    fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_addr().map(|a| a.ip())
    }
}

/// What a rank tells every other rank about itself in the first all-gather.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusinessCard {
    /// The rank.
    pub rank: usize,
    /// Its host id: equal host ids share memory (see [`host_id`]).
    pub host_id: HostId,
    /// Its host name, for messages.
    pub hostname: String,
    /// Its process id (liveness of intra-node peers).
    pub pid: u32,
    /// The transport it was asked to use (every rank must ask for the same).
    pub transport: TransportKind,
    /// Channels per peer pair it was configured with.
    pub nchannels: usize,
    /// Slots per channel.
    pub nslots: usize,
    /// Payload bytes per slot.
    pub slot_bytes: usize,
}

const CARD_VERSION: u32 = 1;

impl BusinessCard {
    /// The card of `rank` in this process with default geometry (tests and tools).
    pub fn local(rank: usize, transport: TransportKind) -> BusinessCard {
        BusinessCard {
            rank,
            host_id: host_id(),
            hostname: hostname(),
            pid: std::process::id(),
            transport,
            nchannels: 1,
            nslots: 8,
            slot_bytes: 1 << 16,
        }
    }

    /// Encodes for the all-gather.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(CARD_VERSION)
            .u32(self.rank as u32)
            .u64(self.host_id.0)
            .str(&self.hostname)
            .u32(self.pid)
            .u8(self.transport.to_raw())
            .u32(self.nchannels as u32)
            .u32(self.nslots as u32)
            .u64(self.slot_bytes as u64);
        w.buf
    }

    /// Decodes the card that rank `from` sent.
    ///
    /// # Errors
    /// [`BootstrapError::BadRecord`] naming `from` when the record is truncated, of another
    /// version, claims another rank, or names an unknown transport.
    pub fn decode(from: usize, bytes: &[u8]) -> Result<BusinessCard, BootstrapError> {
        let bad = |what: String| BootstrapError::BadRecord { rank: from, what };
        let mut r = Reader::new(bytes);
        let e = |t: crate::codec::Truncated| bad(t.to_string());
        let version = r.u32("version").map_err(e)?;
        if version != CARD_VERSION {
            return Err(bad(format!(
                "business card version {version}, this build speaks {CARD_VERSION}"
            )));
        }
        let rank = r.u32("rank").map_err(e)? as usize;
        if rank != from {
            return Err(bad(format!("card claims rank {rank}")));
        }
        let host_id = HostId(r.u64("host id").map_err(e)?);
        let hostname = r.str("hostname").map_err(e)?;
        let pid = r.u32("pid").map_err(e)?;
        let raw = r.u8("transport").map_err(e)?;
        let transport = TransportKind::from_raw(raw)
            .ok_or_else(|| bad(format!("unknown transport code {raw}")))?;
        Ok(BusinessCard {
            rank,
            host_id,
            hostname,
            pid,
            transport,
            nchannels: r.u32("nchannels").map_err(e)? as usize,
            nslots: r.u32("nslots").map_err(e)? as usize,
            slot_bytes: r.u64("slot_bytes").map_err(e)? as usize,
        })
    }
}

/// A bootstrap failure.
#[derive(Debug)]
pub enum BootstrapError {
    /// The rendezvous root could not listen.
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: io::Error,
    },
    /// Could not reach the rendezvous root before the deadline.
    Connect {
        /// The root's address.
        addr: String,
        /// Connection attempts made.
        attempts: u32,
        /// The last OS error.
        source: io::Error,
    },
    /// The connection to the root failed (this rank's side).
    Io {
        /// What was being done.
        during: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// No answer within the deadline.
    Timeout {
        /// What was awaited.
        waiting_for: String,
        /// How long, in milliseconds.
        after_ms: u128,
    },
    /// The root reported that a rank failed (or never joined); every rank gets this.
    RankFailed {
        /// The rank at fault, if one is.
        rank: Option<usize>,
        /// What the root or that rank said.
        message: String,
    },
    /// A record from a rank (or the root) that does not parse.
    BadRecord {
        /// The rank it came from (`usize::MAX` for the root).
        rank: usize,
        /// What was wrong.
        what: String,
    },
    /// The key-value store failed (its own error, or a key that never appeared).
    Store {
        /// The store operation and key.
        during: String,
        /// The store's message.
        message: String,
    },
    /// A malformed unique id string.
    BadUniqueId {
        /// The string.
        given: String,
        /// What was wrong.
        what: &'static str,
    },
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootstrapError::Bind { addr, source } => {
                write!(f, "rendezvous root cannot listen on {addr}: {source}")
            }
            BootstrapError::Connect {
                addr,
                attempts,
                source,
            } => write!(
                f,
                "cannot reach the rendezvous root at {addr} after {attempts} attempts: {source}"
            ),
            BootstrapError::Io { during, source } => {
                write!(f, "rendezvous connection failed during {during}: {source}")
            }
            BootstrapError::Timeout {
                waiting_for,
                after_ms,
            } => write!(
                f,
                "rendezvous timed out after {after_ms} ms waiting for {waiting_for}"
            ),
            BootstrapError::RankFailed { rank, message } => match rank {
                Some(r) => write!(f, "rank {r} failed during the bootstrap: {message}"),
                None => write!(f, "bootstrap failed: {message}"),
            },
            BootstrapError::BadRecord { rank, what } => {
                if *rank == usize::MAX {
                    write!(f, "bad record from the rendezvous root: {what}")
                } else {
                    write!(f, "bad record from rank {rank}: {what}")
                }
            }
            BootstrapError::Store { during, message } => {
                write!(f, "key-value store failed during {during}: {message}")
            }
            BootstrapError::BadUniqueId { given, what } => {
                write!(f, "bad unique id '{given}': {what}")
            }
        }
    }
}

impl std::error::Error for BootstrapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BootstrapError::Bind { source, .. }
            | BootstrapError::Connect { source, .. }
            | BootstrapError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_round_trip_and_validation() {
        let c = BusinessCard::local(3, TransportKind::Shm);
        assert_eq!(BusinessCard::decode(3, &c.encode()).unwrap(), c);
        let e = BusinessCard::decode(2, &c.encode()).unwrap_err();
        assert!(e.to_string().contains("rank 2"), "{e}");
        let enc = c.encode();
        let e = BusinessCard::decode(3, &enc[..enc.len() - 1]).unwrap_err();
        assert!(
            matches!(e, BootstrapError::BadRecord { rank: 3, .. }),
            "{e}"
        );
    }
}
