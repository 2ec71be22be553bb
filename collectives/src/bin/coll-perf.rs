//! `coll-perf`: nccl-tests' interface over this crate's collectives (see `collectives::perf`).

use clap::Parser;
use collectives::perf::{self, PerfArgs};

fn main() -> std::process::ExitCode {
    perf::main(PerfArgs::parse())
}
