//! Bare `coll-perf --ranks N`: start N rank processes of this same binary on this host.
//!
//! The parent creates a [`UniqueId`] (hosting the rendezvous root itself) and re-executes its own
//! binary N times with the arguments it was given and torchrun's variables (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`) plus `COLL_COMM_ID`, so each child takes the
//! launcher path as one rank. The children inherit stdout (rank 0 prints the table) and stderr.
//! When a child fails, the others are given the operation timeout plus a grace period to notice
//! (they fail naming it) and are then killed; the parent exits non-zero.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use super::PerfArgs;
use crate::bootstrap::UniqueId;

/// The most rank processes a bare `coll-perf` starts on this host.
pub const MAX_LOCAL_RANKS: usize = 256;

/// Default number of local ranks.
pub const DEFAULT_RANKS: usize = 4;

/// Starts the ranks and waits for them; `argv` are this process's arguments (without the
/// program name), passed on unchanged.
pub fn run_local(args: &PerfArgs, argv: Vec<OsString>) -> ExitCode {
    let n = args.ranks.unwrap_or(DEFAULT_RANKS);
    if n > MAX_LOCAL_RANKS {
        eprintln!(
            "coll-perf: --ranks {n}: at most {MAX_LOCAL_RANKS} rank processes are started on one \
             host (use a launcher for more)"
        );
        return ExitCode::from(2);
    }
    let timeout = Duration::from_secs(args.timeout);
    let id = match UniqueId::listen(SocketAddr::from(([127, 0, 0, 1], 0)), timeout) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("coll-perf: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("coll-perf: cannot find its own executable to start the ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(n);
    for rank in 0..n {
        let spawned = Command::new(&exe)
            .args(&argv)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("COLL_COMM_ID", id.to_string())
            .stdin(Stdio::null())
            .spawn();
        match spawned {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                eprintln!("coll-perf: cannot start rank {rank}: {e}");
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    wait_all(children, timeout + Duration::from_secs(10))
}

/// Waits for every child; after the first failure, kills whatever still runs `grace` later.
fn wait_all(mut children: Vec<(usize, Child)>, grace: Duration) -> ExitCode {
    let mut failed = false;
    let mut kill_at: Option<Instant> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            let (rank, child) = &mut children[i];
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("coll-perf: rank {rank} exited with {status}");
                        failed = true;
                        kill_at.get_or_insert_with(|| Instant::now() + grace);
                    }
                    children.swap_remove(i);
                }
                Ok(None) => i += 1,
                Err(e) => {
                    eprintln!("coll-perf: cannot wait for rank {rank}: {e}");
                    failed = true;
                    children.swap_remove(i);
                }
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (rank, child) in &mut children {
                eprintln!(
                    "coll-perf: killing rank {rank}, still running after another rank failed"
                );
                let _ = child.kill();
                let _ = child.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
