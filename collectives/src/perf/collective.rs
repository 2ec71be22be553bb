//! The collectives `coll-perf` measures, by their command-line names: a leaf module, which the
//! benchmark's driver and its report (bandwidth factors, element counts) both use.

use clap::ValueEnum;

/// The collectives `coll-perf` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Collective {
    /// `all_reduce` (busbw factor `2 (n - 1) / n`).
    AllReduce,
    /// `all_gather` (`(n - 1) / n`).
    AllGather,
    /// `reduce_scatter` (`(n - 1) / n`).
    ReduceScatter,
    /// `broadcast` (1).
    Broadcast,
    /// `reduce` (1).
    Reduce,
    /// `all_to_all` (`(n - 1) / n`).
    AllToAll,
    /// `scatter` (`(n - 1) / n`).
    Scatter,
    /// `gather` (`(n - 1) / n`).
    Gather,
}

impl Collective {
    /// Whether it reduces (prints its operator; others print `none`).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether it has a root (prints it; others print `-1`).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Scatter | Collective::Gather
        )
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all-to-all",
            Collective::Scatter => "scatter",
            Collective::Gather => "gather",
        }
    }
}
