//! Topology: which transport connects each peer pair.
//!
//! Decided from the business cards alone, by a function that is symmetric in the two ranks, so
//! both ends of every pair pick the same path without talking (NCCL's `canConnect` per transport,
//! in priority order):
//!
//! | requested | same process | same host | other host |
//! |-----------|--------------|-----------|------------|
//! | `auto`    | shm          | shm       | roce       |
//! | `shm`     | shm          | shm       | error      |
//! | `inproc`  | inproc       | error     | error      |
//! | `roce`    | roce         | roce      | roce       |
//!
//! "Same host" is equal [`HostId`](crate::bootstrap::HostId)s; "same process" also equal pids.

use core::fmt;

use crate::bootstrap::BusinessCard;
use crate::transport::kind::TransportKind;

/// How this rank reaches one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The rank itself (no connection).
    SelfRank,
    /// Shared memory on this host.
    Shm,
    /// Memory of this process (ranks are threads).
    InProcess,
    /// RDMA over RoCEv2.
    Roce,
}

impl Path {
    /// The transport of the path (`None` for [`Path::SelfRank`]).
    pub const fn transport(self) -> Option<TransportKind> {
        match self {
            Path::SelfRank => None,
            Path::Shm => Some(TransportKind::Shm),
            Path::InProcess => Some(TransportKind::InProcess),
            Path::Roce => Some(TransportKind::Roce),
        }
    }
}

/// A peer pair the requested transport cannot connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError {
    /// The requested transport.
    pub requested: TransportKind,
    /// The peer rank.
    pub peer: usize,
    /// Why.
    pub reason: String,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--transport {} cannot reach peer rank {}: {}",
            self.requested, self.peer, self.reason
        )
    }
}

impl std::error::Error for TopologyError {}

/// The path from `rank` to every rank (index = peer), for transport `requested`.
///
/// # Errors
/// [`TopologyError`] for the first peer the requested transport cannot reach.
pub fn plan(
    rank: usize,
    cards: &[BusinessCard],
    requested: TransportKind,
) -> Result<Vec<Path>, TopologyError> {
    let me = &cards[rank];
    cards
        .iter()
        .enumerate()
        .map(|(peer, card)| {
            if peer == rank {
                return Ok(Path::SelfRank);
            }
            let same_host = card.host_id == me.host_id;
            let same_process = same_host && card.pid == me.pid;
            let err = |reason: String| TopologyError {
                requested,
                peer,
                reason,
            };
            match requested {
                TransportKind::Auto if same_host => Ok(Path::Shm),
                TransportKind::Auto | TransportKind::Roce => Ok(Path::Roce),
                TransportKind::Shm if same_host => Ok(Path::Shm),
                TransportKind::Shm => Err(err(format!(
                    "it runs on host {} (host id {}), this rank on {} (host id {}); \
                     shared memory needs one host",
                    card.hostname, card.host_id, me.hostname, me.host_id
                ))),
                TransportKind::InProcess if same_process => Ok(Path::InProcess),
                TransportKind::InProcess => Err(err(format!(
                    "it is process {} on {}, this rank process {} on {}; \
                     in-process memory needs one process",
                    card.pid, card.hostname, me.pid, me.hostname
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::HostId;

    fn card(rank: usize, host: u64, pid: u32) -> BusinessCard {
        let mut c = BusinessCard::local(rank, TransportKind::Auto);
        c.host_id = HostId(host);
        c.hostname = format!("host{host}");
        c.pid = pid;
        c
    }

    #[test]
    fn decisions_are_symmetric_and_forced_transports_are_checked() {
        let cards = vec![
            card(0, 1, 10),
            card(1, 1, 11),
            card(2, 2, 12),
            card(3, 1, 10),
        ];
        for requested in [TransportKind::Auto, TransportKind::Roce] {
            for a in 0..4 {
                let pa = plan(a, &cards, requested).unwrap();
                for (b, path) in pa.iter().enumerate() {
                    assert_eq!(*path, plan(b, &cards, requested).unwrap()[a]);
                }
            }
        }
        let p = plan(0, &cards, TransportKind::Auto).unwrap();
        assert_eq!(p, vec![Path::SelfRank, Path::Shm, Path::Roce, Path::Shm]);
        assert_eq!(plan(0, &cards, TransportKind::Roce).unwrap()[1], Path::Roce);
        let e = plan(0, &cards, TransportKind::Shm).unwrap_err();
        assert_eq!(e.peer, 2);
        assert!(e.to_string().contains("host2"), "{e}");
        let e = plan(0, &cards, TransportKind::InProcess).unwrap_err();
        assert_eq!(e.peer, 1);
        let two = vec![card(0, 1, 10), card(1, 1, 10)];
        assert_eq!(
            plan(1, &two, TransportKind::InProcess).unwrap()[0],
            Path::InProcess
        );
    }
}
