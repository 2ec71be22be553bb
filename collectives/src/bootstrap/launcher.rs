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
//!
//! # The rendezvous secret
//! The rendezvous admits any connection that knows the communicator's magic (the trust model of
//! [`super::rendezvous`], as NCCL's and Gloo's). Without `COLL_COMM_ID` every rank derives the
//! magic itself, as a keyed hash (SipHash-2-4, [`RendezvousSpec::Root`]) of the rendezvous
//! address, port, world size and job id under a *secret*: so the magic is exactly as hard to
//! guess as the secret, never a function of what anyone can see (`MASTER_ADDR`, the port, the
//! world size). The secret is, first found:
//!
//! | source | unguessable? |
//! |--------|--------------|
//! | `COLL_SECRET` (any launcher; at least 16 characters, e.g. `openssl rand -hex 16`) | as the value given |
//! | torchrun: `TORCHELASTIC_RUN_ID` (not `none`) | yes with `--standalone` (torchrun draws a random UUID); with `--rdzv-id` as unguessable as the id given |
//! | Open MPI: `PMIX_NAMESPACE`, else `OMPI_MCA_ess_base_jobid` / `OMPI_MCA_orte_ess_jobid` | **no**: derived from the host name and `mpirun`'s pid |
//! | Slurm: `SLURM_JOB_ID`.`SLURM_STEP_ID` | **no**: sequential, and listed by `squeue` |
//! | nothing (torchrun without a run id) | **no** |
//!
//! Where the launcher shares nothing unguessable, anyone who can reach the port can compute the
//! magic and join in a rank's place: give every rank the same `COLL_SECRET` (`mpirun -x
//! COLL_SECRET`; `srun` passes the caller's environment on), or run the job where strangers
//! cannot reach its port. [`RendezvousSpec::Root`] says which source was used.
//! `coll-perf`'s own spawner needs none of this: it hosts the root itself and hands its ranks a
//! `COLL_COMM_ID` with a fresh random magic.

use core::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use super::host::fnv1a;
use super::secret::keyed_hash;
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
        /// The magic every rank derives: a keyed hash of the host, port, world size and job id
        /// under the secret (see the module docs).
        magic: u64,
        /// Where the secret came from.
        secret: SecretSource,
    },
}

/// Where the rendezvous secret of a launcher environment came from (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretSource {
    /// `COLL_SECRET`.
    Explicit,
    /// The variable named, which the launcher can make unguessable (torchrun's
    /// `TORCHELASTIC_RUN_ID`, a random UUID under `--standalone`).
    Launcher(&'static str),
    /// Only the variable named, which is not a secret (a sequential or pid-derived job id), or
    /// nothing: anyone who can reach the port can compute the magic.
    Guessable(Option<&'static str>),
}

impl SecretSource {
    /// Whether the magic is as hard to guess as a secret (not [`SecretSource::Guessable`]).
    pub fn is_secret(&self) -> bool {
        !matches!(self, SecretSource::Guessable(_))
    }
}

/// The fewest characters `COLL_SECRET` may have.
pub const MIN_SECRET_LEN: usize = 16;

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
        let first = |names: &[&'static str]| {
            names
                .iter()
                .find_map(|&n| get(n).map(|v| (n, v)))
                .map_or((None, String::new()), |(n, v)| (Some(n), v))
        };
        let (job_var, job) = match launcher {
            Launcher::Torchrun => match get("TORCHELASTIC_RUN_ID") {
                Some(id) if !id.eq_ignore_ascii_case("none") => (Some("TORCHELASTIC_RUN_ID"), id),
                _ => (None, String::new()),
            },
            Launcher::OpenMpi => first(&[
                "PMIX_NAMESPACE",
                "OMPI_MCA_ess_base_jobid",
                "OMPI_MCA_orte_ess_jobid",
            ]),
            Launcher::Slurm => (
                Some("SLURM_JOB_ID"),
                format!(
                    "{}.{}",
                    get("SLURM_JOB_ID").unwrap_or_default(),
                    get("SLURM_STEP_ID").unwrap_or_default()
                ),
            ),
        };
        let explicit = get("COLL_SECRET");
        if let Some(v) = &explicit {
            if v.len() < MIN_SECRET_LEN {
                return Err(EnvError::Invalid {
                    var: "COLL_SECRET",
                    value: "(hidden)".into(),
                    expected: "a secret of at least 16 characters (e.g. `openssl rand -hex 16`)",
                });
            }
        }
        let secret = match (&explicit, launcher, job_var) {
            (Some(_), ..) => SecretSource::Explicit,
            (None, Launcher::Torchrun, Some(var)) => SecretSource::Launcher(var),
            (None, _, var) => SecretSource::Guessable(var),
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
        let key = explicit.as_deref().unwrap_or(&job);
        let magic = keyed_hash(
            key.as_bytes(),
            &[
                b"coll-rendezvous-magic",
                host.as_bytes(),
                &port.to_le_bytes(),
                &(nranks as u64).to_le_bytes(),
                job.as_bytes(),
            ],
        );
        RendezvousSpec::Root {
            host,
            port,
            magic,
            secret,
        }
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
            RendezvousSpec::Root {
                host, port, magic, ..
            } => {
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

    fn magic_and_source(pairs: &[(&str, &str)]) -> (u64, SecretSource) {
        match env(pairs).unwrap().unwrap().rendezvous {
            RendezvousSpec::Root { magic, secret, .. } => (magic, secret),
            RendezvousSpec::Id(id) => panic!("{id}"),
        }
    }

    const TORCH: [(&str, &str); 4] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        TORCH.iter().chain(extra).copied().collect()
    }

    /// Two runs with the same MASTER_ADDR, port and world size but different run ids (or
    /// secrets) get different magics: the magic is not a function of what anyone can see.
    #[test]
    fn the_magic_is_keyed_by_the_run_id_or_the_secret() {
        let (a, src) = magic_and_source(&with(&[(
            "TORCHELASTIC_RUN_ID",
            "4f1c6a53-7e8e-4c3b-9d0e-2b1f0c9a7d11",
        )]));
        assert_eq!(src, SecretSource::Launcher("TORCHELASTIC_RUN_ID"));
        assert!(src.is_secret());
        let (b, _) = magic_and_source(&with(&[(
            "TORCHELASTIC_RUN_ID",
            "0b8e1f2a-93c4-4d5e-a6f7-18293a4b5c6d",
        )]));
        assert_ne!(a, b, "different run ids, different secrets");
        assert_eq!(
            a,
            magic_and_source(&with(&[(
                "TORCHELASTIC_RUN_ID",
                "4f1c6a53-7e8e-4c3b-9d0e-2b1f0c9a7d11"
            )]))
            .0,
            "every rank derives the same"
        );
        // No run id: only public values, said so.
        let (public, src) = magic_and_source(&TORCH);
        assert_eq!(src, SecretSource::Guessable(None));
        assert!(!src.is_secret());
        let (none, _) = magic_and_source(&with(&[("TORCHELASTIC_RUN_ID", "none")]));
        assert_eq!(
            public, none,
            "torchrun's default run id 'none' is no secret"
        );
        // COLL_SECRET keys the magic, over any launcher's job id.
        let (s1, src) = magic_and_source(&with(&[(
            "COLL_SECRET",
            "00112233445566778899aabbccddeeff",
        )]));
        assert_eq!(src, SecretSource::Explicit);
        let (s2, _) = magic_and_source(&with(&[(
            "COLL_SECRET",
            "ffeeddccbbaa99887766554433221100",
        )]));
        assert!(s1 != s2 && s1 != public && s2 != public);
        let e = env(&with(&[("COLL_SECRET", "short")])).unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        assert!(
            !e.to_string().contains("short"),
            "the secret is not echoed: {e}"
        );
        // The magic is no longer the unkeyed hash of the public values.
        let unkeyed = fnv1a(&[
            b"coll-magic",
            b"10.0.0.1",
            &29500u16.to_le_bytes(),
            &4u64.to_le_bytes(),
            b"",
        ]);
        assert_ne!(public, unkeyed);
    }

    #[test]
    fn open_mpi_and_slurm_job_ids_separate_jobs_but_are_no_secret() {
        let ompi = |ns: &'static str| {
            magic_and_source(&[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ("MASTER_PORT", "5000"),
                ("PMIX_NAMESPACE", ns),
            ])
        };
        let (a, src) = ompi("prterun-host-1234@1");
        assert_eq!(src, SecretSource::Guessable(Some("PMIX_NAMESPACE")));
        assert_ne!(a, ompi("prterun-host-1235@1").0);
        let slurm = |job: &'static str| {
            magic_and_source(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_NNODES", "1"),
                ("MASTER_PORT", "5000"),
                ("SLURM_JOB_ID", job),
            ])
        };
        let (a, src) = slurm("777");
        assert_eq!(src, SecretSource::Guessable(Some("SLURM_JOB_ID")));
        assert_ne!(a, slurm("778").0);
    }
}
