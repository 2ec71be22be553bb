//! Communicator split: sub-groups (NCCL's `ncclCommSplit`, MPI's `MPI_Comm_split`, torch's
//! `new_group`).

use std::net::SocketAddr;
use std::time::Duration;

use crate::bootstrap::UniqueId;
use crate::datatype::DataType;
use crate::error::InitError;

use super::{CommConfig, Communicator};

/// Bytes of one rank's record in the second all-gather: the text of its group's unique id
/// (`ADDRESS#MAGIC`, at most 47 bytes for IPv4) after a length byte.
const ID_RECORD: usize = 64;

/// `color` of a rank that joins no group.
const NO_COLOR: u32 = u32::MAX;

impl Communicator {
    /// Splits this communicator into groups (NCCL's `ncclCommSplit`, MPI's `MPI_Comm_split`):
    /// every rank calls it, in the same order relative to its other operations; the ranks that
    /// pass the same `color` form a new communicator, ranked by `(key, rank here)`; a rank that
    /// passes `None` joins none and gets `Ok(None)`. The new communicators use `config`.
    ///
    /// The group's lowest-ranked member starts a rendezvous root on `127.0.0.1` and its id
    /// (address and fresh secret magic) travels to the members through this communicator's
    /// transports (two all-gathers); the members then set up as [`Communicator::init`] does.
    ///
    /// # Errors
    /// [`InitError::InvalidArgument`] for a communicator that spans hosts (the root listens on
    /// loopback: create those groups with [`Communicator::from_store`]) or a color of
    /// `u32::MAX`; [`InitError::Collective`] when the exchange over this communicator fails;
    /// others as [`Communicator::init`].
    pub fn split(
        &mut self,
        color: Option<u32>,
        key: u32,
        config: CommConfig,
    ) -> Result<Option<Communicator>, InitError> {
        let me = self.cards[self.rank].host_id;
        if self.cards.iter().any(|c| c.host_id != me) {
            return Err(InitError::InvalidArgument(
                "split of a communicator that spans hosts: use Communicator::from_store".into(),
            ));
        }
        if color == Some(NO_COLOR) {
            return Err(InitError::InvalidArgument(format!(
                "split color {NO_COLOR} is reserved"
            )));
        }
        let n = self.nranks;
        let mut mine = [0u8; 8];
        mine[..4].copy_from_slice(&color.unwrap_or(NO_COLOR).to_le_bytes());
        mine[4..].copy_from_slice(&key.to_le_bytes());
        let mut all = vec![0u8; 8 * n];
        self.all_gather(&mine, &mut all, 8, DataType::U8)
            .map_err(InitError::Collective)?;
        let entry = |r: usize| {
            let b = &all[8 * r..8 * r + 8];
            (
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            )
        };
        // Members of this rank's group, ordered by (key, rank).
        let members = color.map(|c| {
            let mut m: Vec<usize> = (0..n).filter(|&r| entry(r).0 == c).collect();
            m.sort_by_key(|&r| (entry(r).1, r));
            m
        });
        // The leader (first member) starts the root; everyone publishes a record.
        let mut record = [0u8; ID_RECORD];
        if let Some(m) = &members {
            if m.first() == Some(&self.rank) {
                let id = UniqueId::listen(
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    m.len(),
                    config.bootstrap_timeout.max(Duration::from_secs(1)),
                )?;
                let text = id.to_string();
                let bytes = text.as_bytes();
                if bytes.len() >= ID_RECORD {
                    return Err(InitError::InvalidArgument(format!(
                        "unique id {} bytes long",
                        bytes.len()
                    )));
                }
                record[0] = bytes.len() as u8;
                record[1..1 + bytes.len()].copy_from_slice(bytes);
            }
        }
        let mut ids = vec![0u8; ID_RECORD * n];
        self.all_gather(&record, &mut ids, ID_RECORD, DataType::U8)
            .map_err(InitError::Collective)?;
        let Some(m) = members else {
            return Ok(None);
        };
        let leader = m[0];
        let rec = &ids[ID_RECORD * leader..ID_RECORD * (leader + 1)];
        let len = usize::from(rec[0]).min(ID_RECORD - 1);
        let text = core::str::from_utf8(&rec[1..1 + len]).map_err(|_| {
            InitError::InvalidArgument(format!("rank {leader} sent a unique id that is not text"))
        })?;
        let id: UniqueId = text.parse()?;
        let sub_rank = m.iter().position(|&r| r == self.rank).unwrap_or(0);
        Communicator::init(&id, sub_rank, m.len(), config).map(Some)
    }
}
