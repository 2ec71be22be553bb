//! The cases the end-to-end tests of every collective run (`collectives.rs` in process and over
//! shared memory, `roce.rs` over RoCE): odd counts, in place and out of place, every type and
//! operator, checked against the reference of `collectives::perf::data`.

use std::ops::RangeInclusive;

use collectives::perf::{Case, Collective};
use collectives::{CommConfig, Communicator, DataType, RedOp};

/// Counts: empty, single, fewer than ranks, prime, and several chunks of 256 B slots.
pub const COUNTS: [usize; 6] = [0, 1, 3, 13, 97, 1000];

/// Type/operator pairs cycled through the counts, so that every type and every operator runs.
pub const TYPED_OPS: [(DataType, RedOp); 10] = [
    (DataType::F32, RedOp::Sum),
    (DataType::F16, RedOp::Avg),
    (DataType::Bf16, RedOp::Sum),
    (DataType::I32, RedOp::Prod),
    (DataType::U8, RedOp::Max),
    (DataType::I8, RedOp::Min),
    (DataType::U32, RedOp::Avg),
    (DataType::I64, RedOp::Avg),
    (DataType::U64, RedOp::Prod),
    (DataType::F64, RedOp::Min),
];

/// Runs `collective` on each number of ranks in `ranks` with `config`: every count of
/// [`COUNTS`], out of place then in place, with a type/operator pair of [`TYPED_OPS`] and a root
/// cycled through them, checked element by element on every rank. `on_each_rank(comm, n)` runs
/// first on every rank. Panics on a failing operation, and after each number of ranks with every
/// case that left wrong elements.
pub fn check_every_count(
    collective: Collective,
    ranks: RangeInclusive<usize>,
    config: CommConfig,
    on_each_rank: impl Fn(&Communicator, usize) + Sync,
) {
    for n in ranks {
        let wrong = super::with_ranks(n, config, |comm| {
            on_each_rank(comm, n);
            let mut failures = Vec::new();
            let mut rep = 0;
            for (i, &count) in COUNTS.iter().enumerate() {
                for in_place in [false, true] {
                    let (datatype, op) =
                        TYPED_OPS[(i * 2 + usize::from(in_place) + n) % TYPED_OPS.len()];
                    let case = Case {
                        collective,
                        datatype,
                        op,
                        root: (i + n) % n,
                        count,
                        in_place,
                    };
                    rep += 1;
                    let wrong = case
                        .run_checked(comm, rep)
                        .unwrap_or_else(|e| panic!("rank {}: {case:?}: {e}", comm.rank()));
                    if wrong != 0 {
                        failures.push(format!("rank {} {case:?}: {wrong} wrong", comm.rank()));
                    }
                }
            }
            failures
        });
        let wrong: Vec<String> = wrong.into_iter().flatten().collect();
        assert!(wrong.is_empty(), "{n} ranks:\n{}", wrong.join("\n"));
    }
}
