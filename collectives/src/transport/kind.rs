//! The names of the transports ([`TransportKind`]): a leaf module, which the bootstrap (the
//! business card carries the requested kind), the topology step (which kind per peer pair) and
//! the transports themselves all use, and which imports none of them.

use core::fmt;

use crate::datatype::UnknownName;

/// Which transport carries a peer pair's data, as chosen by the topology step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Pick per peer pair: shared memory when both ranks have the same host id, RoCE otherwise.
    Auto,
    /// Shared memory between processes on one host.
    Shm,
    /// RDMA WRITE_WITH_IMM over RoCEv2 (through the `hca` crate's verbs).
    Roce,
    /// Anonymous memory shared by threads of one process (every rank in the same process).
    InProcess,
}

impl TransportKind {
    /// Lower-case name, as `--transport` takes it.
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Shm => "shm",
            TransportKind::Roce => "roce",
            TransportKind::InProcess => "inproc",
        }
    }

    pub(crate) const fn to_raw(self) -> u8 {
        match self {
            TransportKind::Auto => 0,
            TransportKind::Shm => 1,
            TransportKind::Roce => 2,
            TransportKind::InProcess => 3,
        }
    }

    pub(crate) const fn from_raw(raw: u8) -> Option<TransportKind> {
        match raw {
            0 => Some(TransportKind::Auto),
            1 => Some(TransportKind::Shm),
            2 => Some(TransportKind::Roce),
            3 => Some(TransportKind::InProcess),
            _ => None,
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for TransportKind {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportKind::Auto),
            "shm" => Ok(TransportKind::Shm),
            "roce" => Ok(TransportKind::Roce),
            "inproc" => Ok(TransportKind::InProcess),
            _ => Err(UnknownName {
                given: s.to_string(),
                kind: "transport",
                accepted: "auto shm roce inproc",
            }),
        }
    }
}
