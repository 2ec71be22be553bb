//! Rank, world size and rendezvous address from the launcher's environment.
//!
//! | launcher | rank | world size | local rank | rendezvous |
//! |----------|------|------------|------------|------------|
//! | torchrun (and `coll-perf`'s own spawner) | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR`:`MASTER_PORT` |
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR`:`MASTER_PORT`, or on one node `127.0.0.1` and a port from the job id |
//! | Slurm `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | as Open MPI, job id from `SLURM_JOB_ID`.`SLURM_STEP_ID` |
//!
//! `COLL_COMM_ID` (a [`UniqueId`] in text form, NCCL's `NCCL_COMM_ID`) overrides the rendezvous
//! address of any launcher: the ranks connect to it and none of them hosts the root (whoever
//! created the id does). Without it, rank 0 hosts the root, listening on all interfaces at the
//! port, and the others connect to `MASTER_ADDR`.
//!
//! torchrun's elastic agent already listens on `MASTER_PORT` with its own store when
//! `TORCHELASTIC_USE_AGENT_STORE=True`; the rendezvous then uses `MASTER_PORT + 1`.
//!
//! Slurm is recognised only inside a job step (`SLURM_STEP_ID` set), so a batch script that runs
//! `coll-perf` directly (not through `srun`) is not mistaken for rank 0 of the job's tasks.

use core::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use super::host::fnv1a;
use super::UniqueId;

/// The launcher whose conventions were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun / torch.distributed.launch (or anything that sets `RANK` and `WORLD_SIZE`).
    Torchrun,
    /// Open MPI's `mpirun` / `mpiexec`.
    OpenMpi,
    /// Slurm's `srun`.
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Slurm => "Slurm",
        })
    }
}

/// Where the rendezvous root is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousSpec {
    /// An explicit unique id (`COLL_COMM_ID`): connect to it; some other process hosts the root.
    Id(UniqueId),
    /// Rank 0 hosts the root on `port`; the others connect to `host:port`.
    Root {
        /// Host name or address of rank 0 (`MASTER_ADDR`).
        host: String,
        /// TCP port.
        port: u16,
        /// The magic every rank derives from the job's identity.
        magic: u64,
    },
}

/// What the environment says about this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// The launcher.
    pub launcher: Launcher,
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub nranks: usize,
    /// Rank among the processes of this node, when the launcher says.
    pub local_rank: Option<usize>,
    /// Processes on this node, when the launcher says.
    pub local_nranks: Option<usize>,
    /// The rendezvous.
    pub rendezvous: RendezvousSpec,
}

/// A launcher environment that is incomplete or malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvError {
    /// A variable the launcher's conventions require is missing.
    Missing {
        /// The launcher recognised.
        launcher: Launcher,
        /// The variable.
        var: &'static str,
        /// What to do about it.
        hint: &'static str,
    },
    /// A variable that does not parse.
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// Rank not below world size.
    RankOutOfRange {
        /// The launcher.
        launcher: Launcher,
        /// The rank.
        rank: usize,
        /// The world size.
        nranks: usize,
    },
    /// `MASTER_ADDR` does not resolve.
    Resolve {
        /// The host.
        host: String,
        /// The resolver's error.
        reason: String,
    },
    /// No launcher environment at all.
    NoLauncher,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvError::Missing {
                launcher,
                var,
                hint,
            } => write!(f, "{launcher} environment without {var}: {hint}"),
            EnvError::Invalid {
                var,
                value,
                expected,
            } => write!(f, "{var}='{value}' is not {expected}"),
            EnvError::RankOutOfRange {
                launcher,
                rank,
                nranks,
            } => write!(
                f,
                "{launcher} environment gives rank {rank} but world size {nranks}"
            ),
            EnvError::Resolve { host, reason } => {
                write!(f, "rendezvous host '{host}' does not resolve: {reason}")
            }
            EnvError::NoLauncher => f.write_str(
                "no launcher environment (torchrun RANK/WORLD_SIZE, Open MPI OMPI_COMM_WORLD_*, \
                 Slurm SLURM_PROCID/SLURM_NTASKS in an srun step)",
            ),
        }
    }
}

impl std::error::Error for EnvError {}

fn parse_usize(var: &'static str, value: &str) -> Result<usize, EnvError> {
    value.trim().parse().map_err(|_| EnvError::Invalid {
        var,
        value: value.to_string(),
        expected: "a non-negative integer",
    })
}

fn parse_port(var: &'static str, value: &str) -> Result<u16, EnvError> {
    match value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(EnvError::Invalid {
            var,
            value: value.to_string(),
            expected: "a TCP port (1-65535)",
        }),
    }
}

/// Port for a single-node job without `MASTER_PORT`: 20000 + hash(job id) % 30000.
fn port_from_job(job: &str) -> u16 {
    20000 + (fnv1a(&[b"coll-port", job.as_bytes()]) % 30000) as u16
}

/// Reads the launcher conventions through `var` (the process environment in
/// [`LaunchInfo::from_env`]; a map in tests). `Ok(None)` when no launcher variables are set.
///
/// # Errors
/// [`EnvError`] when a launcher is recognised but its variables are incomplete or malformed.
pub fn detect(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>, EnvError> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let (launcher, rank_var, size_var, local_var, local_size_var) =
        if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            (
                Launcher::Torchrun,
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
            )
        } else if get("OMPI_COMM_WORLD_RANK").is_some() {
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            )
        } else if get("SLURM_PROCID").is_some() && get("SLURM_STEP_ID").is_some() {
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "SLURM_NTASKS_PER_NODE",
            )
        } else {
            return Ok(None);
        };
    let required = |name: &'static str, hint: &'static str| {
        get(name).ok_or(EnvError::Missing {
            launcher,
            var: name,
            hint,
        })
    };
    let rank = parse_usize(
        rank_var,
        &required(rank_var, "the launcher must set the rank")?,
    )?;
    let nranks = parse_usize(
        size_var,
        &required(size_var, "the launcher must set the world size")?,
    )?;
    if rank >= nranks {
        return Err(EnvError::RankOutOfRange {
            launcher,
            rank,
            nranks,
        });
    }
    let local_rank = get(local_var)
        .map(|v| parse_usize(local_var, &v))
        .transpose()?;
    // SLURM_NTASKS_PER_NODE may be a list ("4(x2)"); only a plain number is taken.
    let local_nranks = match get(local_size_var) {
        Some(v) if launcher == Launcher::Slurm => v.trim().parse().ok(),
        Some(v) => Some(parse_usize(local_size_var, &v)?),
        None => None,
    };

    let rendezvous = if let Some(id) = get("COLL_COMM_ID") {
        RendezvousSpec::Id(id.parse().map_err(|_| EnvError::Invalid {
            var: "COLL_COMM_ID",
            value: id.clone(),
            expected: "a unique id ADDRESS#MAGIC",
        })?)
    } else {
        let single_node = match launcher {
            Launcher::Torchrun => false,
            Launcher::OpenMpi => local_nranks == Some(nranks),
            Launcher::Slurm => {
                get("SLURM_STEP_NUM_NODES")
                    .or_else(|| get("SLURM_NNODES"))
                    .as_deref()
                    == Some("1")
            }
        };
        let job = match launcher {
            Launcher::Torchrun => get("TORCHELASTIC_RUN_ID").unwrap_or_default(),
            Launcher::OpenMpi => get("PMIX_NAMESPACE")
                .or_else(|| get("OMPI_MCA_ess_base_jobid"))
                .or_else(|| get("OMPI_MCA_orte_ess_jobid"))
                .unwrap_or_default(),
            Launcher::Slurm => format!(
                "{}.{}",
                get("SLURM_JOB_ID").unwrap_or_default(),
                get("SLURM_STEP_ID").unwrap_or_default()
            ),
        };
        let host = match get("MASTER_ADDR") {
            Some(h) => h,
            None if single_node => "127.0.0.1".to_string(),
            None => return Err(EnvError::Missing {
                launcher,
                var: "MASTER_ADDR",
                hint: match launcher {
                    Launcher::Torchrun => "torchrun sets it; set it to rank 0's host",
                    _ => {
                        "a multi-node run needs rank 0's host in MASTER_ADDR (and MASTER_PORT), \
                              e.g. mpirun -x MASTER_ADDR -x MASTER_PORT"
                    }
                },
            }),
        };
        let port = match get("MASTER_PORT") {
            Some(p) => {
                let p = parse_port("MASTER_PORT", &p)?;
                let agent_store = get("TORCHELASTIC_USE_AGENT_STORE")
                    .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                if launcher == Launcher::Torchrun && agent_store {
                    p.checked_add(1).ok_or(EnvError::Invalid {
                        var: "MASTER_PORT",
                        value: p.to_string(),
                        expected: "a port below 65535 (the next one is used)",
                    })?
                } else {
                    p
                }
            }
            None if single_node && !job.is_empty() => port_from_job(&job),
            None => {
                return Err(EnvError::Missing {
                    launcher,
                    var: "MASTER_PORT",
                    hint: "set the rendezvous port (the same on every rank)",
                })
            }
        };
        let magic = fnv1a(&[
            b"coll-magic",
            host.as_bytes(),
            &port.to_le_bytes(),
            &(nranks as u64).to_le_bytes(),
            job.as_bytes(),
        ]);
        RendezvousSpec::Root { host, port, magic }
    };
    Ok(Some(LaunchInfo {
        launcher,
        rank,
        nranks,
        local_rank,
        local_nranks,
        rendezvous,
    }))
}

impl LaunchInfo {
    /// Reads the process environment ([`detect`]).
    ///
    /// # Errors
    /// [`EnvError::NoLauncher`] when no launcher variables are set; others from [`detect`].
    pub fn from_env() -> Result<LaunchInfo, EnvError> {
        detect(&|name| std::env::var(name).ok())?.ok_or(EnvError::NoLauncher)
    }

    /// The unique id to connect to, and, for the rank that must host the root, the address to
    /// listen on (`0.0.0.0:port`).
    ///
    /// # Errors
    /// [`EnvError::Resolve`] when `MASTER_ADDR` does not resolve.
    pub fn unique_id(&self) -> Result<(UniqueId, Option<SocketAddr>), EnvError> {
        match &self.rendezvous {
            RendezvousSpec::Id(id) => Ok((*id, None)),
            RendezvousSpec::Root { host, port, magic } => {
                let resolve_err = |reason: String| EnvError::Resolve {
                    host: host.clone(),
                    reason,
                };
                let addrs: Vec<SocketAddr> = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| resolve_err(e.to_string()))?
                    .collect();
                let addr = addrs
                    .iter()
                    .find(|a| a.is_ipv4())
                    .or_else(|| addrs.first())
                    .copied()
                    .ok_or_else(|| resolve_err("no addresses".into()))?;
                let bind = (self.rank == 0).then(|| {
                    if addr.is_ipv4() {
                        SocketAddr::from(([0, 0, 0, 0], *port))
                    } else {
                        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, *port))
                    }
                });
                Ok((UniqueId::from_parts(addr, *magic), bind))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<LaunchInfo>, EnvError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&move |k| m.get(k).cloned())
    }

    #[test]
    fn torchrun() {
        let i = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(i.launcher, Launcher::Torchrun);
        assert_eq!(
            (i.rank, i.nranks, i.local_rank, i.local_nranks),
            (3, 8, Some(1), Some(2))
        );
        let RendezvousSpec::Root { port, .. } = &i.rendezvous else {
            panic!("{:?}", i.rendezvous)
        };
        assert_eq!(*port, 29500);
        let (id, bind) = i.unique_id().unwrap();
        assert_eq!(id.addr(), "127.0.0.1:29500".parse().unwrap());
        assert_eq!(bind, None, "only rank 0 hosts the root");
        // With the elastic agent's store on MASTER_PORT, the next port.
        let i = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap()
        .unwrap();
        assert!(matches!(
            i.rendezvous,
            RendezvousSpec::Root { port: 29501, .. }
        ));
        assert_eq!(
            i.unique_id().unwrap().1,
            Some("0.0.0.0:29501".parse().unwrap())
        );
    }

    #[test]
    fn every_rank_derives_the_same_magic() {
        let magic = |rank: &str| {
            let i = env(&[
                ("RANK", rank),
                ("WORLD_SIZE", "4"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "1234"),
            ])
            .unwrap()
            .unwrap();
            match i.rendezvous {
                RendezvousSpec::Root { magic, .. } => magic,
                RendezvousSpec::Id(_) => panic!(),
            }
        };
        assert_eq!(magic("0"), magic("3"));
    }

    #[test]
    fn open_mpi_single_node_needs_no_master() {
        let i = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("PMIX_NAMESPACE", "prterun-host-1234@1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(i.launcher, Launcher::OpenMpi);
        assert!(
            matches!(&i.rendezvous, RendezvousSpec::Root { host, port, .. } if host == "127.0.0.1" && *port >= 20000)
        );
        // Two nodes: MASTER_ADDR is required, and the error says how to pass it.
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap_err();
        assert!(
            e.to_string().contains("MASTER_ADDR") && e.to_string().contains("mpirun -x"),
            "{e}"
        );
    }

    #[test]
    fn slurm_only_inside_a_step() {
        let base = [
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_ID", "777"),
            ("SLURM_NNODES", "1"),
        ];
        assert_eq!(env(&base).unwrap(), None, "a batch script is not a rank");
        let mut step = base.to_vec();
        step.push(("SLURM_STEP_ID", "0"));
        let i = env(&step).unwrap().unwrap();
        assert_eq!(
            (i.launcher, i.rank, i.nranks, i.local_rank),
            (Launcher::Slurm, 2, 4, Some(0))
        );
    }

    #[test]
    fn comm_id_overrides_and_errors_are_clear() {
        let i = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("COLL_COMM_ID", "127.0.0.1:4000#00000000000000ab"),
        ])
        .unwrap()
        .unwrap();
        let (id, bind) = i.unique_id().unwrap();
        assert_eq!((id.magic(), bind), (0xab, None));

        let e = env(&[("RANK", "1")]).unwrap_err();
        assert!(e.to_string().contains("WORLD_SIZE"), "{e}");
        let e = env(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("RANK='x'"), "{e}");
        let e = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("rank 2 but world size 2"), "{e}");
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(e.to_string().contains("MASTER_PORT"), "{e}");
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "0"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("TCP port"), "{e}");
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("COLL_COMM_ID", "junk")]).unwrap_err();
        assert!(e.to_string().contains("COLL_COMM_ID"), "{e}");
        assert_eq!(env(&[]).unwrap(), None);
    }
}
