//! Bare `coll-perf --ranks N`: start N rank processes of this same binary on this host.
//!
//! The parent creates a [`UniqueId`] (hosting the rendezvous root itself) and re-executes its own
//! binary N times with the arguments it was given and torchrun's variables (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`) plus `COLL_COMM_ID`, so each child takes the
//! launcher path as one rank. The children inherit stdout (rank 0 prints the table) and stderr.
//! When a child fails, the others are given the operation timeout plus a grace period to notice
//! (they fail naming it) and are then killed; the parent exits non-zero. A rank still there then
//! that is stopped (SIGSTOP, a debugger: state `T` in /proc/PID/stat) is reported as stopped and
//! not answering, not as dead. Each child is made to
//! die with the parent (SIGKILL through prctl(2)'s `PR_SET_PDEATHSIG`, set between fork and
//! exec), so that however the parent ends (Ctrl-C to it alone, SIGKILL) no rank is left running.
//!
//! Before it starts any rank the parent checks what would make every rank fail the same way and
//! says it once ([`check_before_start`]): a root not below `--ranks`, a malformed `COLL_ROCE_*`
//! variable, sizes whose buffers for all N ranks exceed the memory this host has available
//! ([`super::check_memory`]), a verbs device that does not open, an address that is not this
//! host's, and UDP addresses shared by local ranks.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use super::PerfArgs;
use crate::bootstrap::host::process_state;
use crate::bootstrap::UniqueId;
use crate::transport::TransportKind;

/// The most rank processes a bare `coll-perf` starts on this host.
pub const MAX_LOCAL_RANKS: usize = 256;

/// Default number of local ranks.
pub const DEFAULT_RANKS: usize = 4;

/// Starts the ranks and waits for them; `argv` are this process's arguments (without the
/// program name), passed on unchanged.
pub fn run_local(args: &PerfArgs, argv: Vec<OsString>) -> ExitCode {
    let n = args.ranks.unwrap_or(DEFAULT_RANKS);
    if n > MAX_LOCAL_RANKS {
        say!(
            "coll-perf: --ranks {n}: at most {MAX_LOCAL_RANKS} rank processes are started on one \
             host (use a launcher for more)"
        );
        return ExitCode::from(2);
    }
    if let Err((code, m)) = check_before_start(args, n) {
        say!("coll-perf: {m}");
        return ExitCode::from(code);
    }
    let timeout = Duration::from_secs(args.timeout);
    let id = match UniqueId::listen(SocketAddr::from(([127, 0, 0, 1], 0)), n, timeout) {
        Ok(id) => id,
        Err(e) => {
            say!("coll-perf: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            say!("coll-perf: cannot find its own executable to start the ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        super::sys::die_with_parent(&mut cmd);
        let spawned = cmd
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
                say!("coll-perf: cannot start rank {rank}: {e}");
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let pids: Vec<(usize, u32)> = children.iter().map(|(r, c)| (*r, c.id())).collect();
    let code = wait_all(children, timeout + Duration::from_secs(10));
    remove_segments(id.public_tag(), &pids);
    code
}

/// Removes the shared-memory segments that ranks `(rank, pid)` of the communicator tagged `tag`
/// may have left: a rank unlinks its own once every peer has mapped it, or when it fails, but
/// not when it is killed before then (SIGKILL, after another rank failed). Names as
/// [`crate::transport::shm`] makes them; a name already gone is no error.
fn remove_segments(tag: u64, ranks: &[(usize, u32)]) {
    for (rank, pid) in ranks {
        let _ = std::fs::remove_file(format!("/dev/shm/coll-{tag:016x}-{rank}-{pid}"));
    }
}

/// What would make every one of `n` local ranks fail alike, as `(exit code, message)`: 2 for
/// bad arguments or environment, 1 for a device or address this host does not have.
pub fn check_before_start(args: &PerfArgs, n: usize) -> Result<(), (u8, String)> {
    if args.collective.rooted() && args.root >= n {
        return Err((
            2,
            format!("-r/--root {} is not below --ranks {n}", args.root),
        ));
    }
    let config = args.config().map_err(|e| (2, e.to_string()))?;
    super::check_memory(args, n, n).map_err(|m| (2, m))?;
    if config.transport != TransportKind::Roce {
        return Ok(());
    }
    let (verbs, addrs) =
        crate::transport::roce::device_from_env().map_err(|e| (2, e.to_string()))?;
    if let Some(name) = verbs {
        // Opened and closed again: the ranks open it for themselves.
        let spec = hca::open::DeviceSpec::Verbs(name);
        return match hca::open::open(&spec, &hca::open::OpenOptions::default()) {
            Ok(_) => Ok(()),
            Err(e) => Err((1, e.to_string())),
        };
    }
    if addrs.is_empty() {
        return Ok(());
    }
    let from = match std::env::var("COLL_ROCE_LINK") {
        Ok(l) if l.trim().starts_with("udp:") => {
            if args.link.is_some() {
                format!("--link {}", l.trim())
            } else {
                format!("COLL_ROCE_LINK={}", l.trim())
            }
        }
        _ => format!(
            "COLL_ROCE_ADDR={}",
            std::env::var("COLL_ROCE_ADDR").unwrap_or_default()
        ),
    };
    let distinct: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    if distinct.len() < n {
        return Err((
            2,
            format!(
                "{from} gives {} for {n} local ranks, but the UDP device tells peers apart by IP \
                 address, so each rank needs its own: on one host leave --link out (or use --link \
                 udp; rank r takes 127.0.0.(r+1)), or set COLL_ROCE_ADDR to {n} comma-separated \
                 addresses of this host, one per local rank",
                match distinct.len() {
                    1 => "one address".to_string(),
                    k => format!("{k} distinct addresses"),
                }
            ),
        ));
    }
    for ip in distinct {
        if let Err(e) = UdpSocket::bind(SocketAddr::new(ip, 0)) {
            return Err((1, format!("{from}: {ip} is not usable on this host: {e}")));
        }
    }
    Ok(())
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
                        say!("coll-perf: rank {rank} exited with {status}");
                        failed = true;
                        kill_at.get_or_insert_with(|| Instant::now() + grace);
                    }
                    children.swap_remove(i);
                }
                Ok(None) => i += 1,
                Err(e) => {
                    say!("coll-perf: cannot wait for rank {rank}: {e}");
                    failed = true;
                    children.swap_remove(i);
                }
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (rank, child) in &mut children {
                match process_state(child.id()) {
                    // Alive but not running: what its peers saw was a rank not answering.
                    Some(state @ ('T' | 't')) => say!(
                        "coll-perf: rank {rank} (pid {}) is stopped (state {state}: SIGSTOP or \
                         a debugger), not dead: it was not answering; killing it",
                        child.id()
                    ),
                    _ => say!(
                        "coll-perf: killing rank {rank}, still running after another rank failed"
                    ),
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_is_told_from_a_dead_one() {
        assert!(matches!(process_state(std::process::id()), Some('R' | 'S')));
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id().to_string();
        let signal = |sig: &str| {
            let st = Command::new("kill").args([sig, &pid]).status().unwrap();
            assert!(st.success(), "kill {sig}");
        };
        signal("-STOP");
        // The state changes once the signal is delivered: wait for it, bounded.
        let deadline = Instant::now() + Duration::from_secs(30);
        while process_state(child.id()) != Some('T') {
            assert!(Instant::now() < deadline, "{:?}", process_state(child.id()));
            std::thread::sleep(Duration::from_millis(5));
        }
        signal("-KILL");
        child.wait().unwrap();
        assert_eq!(process_state(child.id()), None, "reaped: gone");
    }
}
