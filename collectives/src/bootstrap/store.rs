//! Bootstrap through a key-value store: the way PyTorch hands a process group's rendezvous to a
//! backend (`torch.distributed.Store`, usually a `TCPStore` the launcher already runs; see
//! `torch/csrc/distributed/c10d/Store.hpp` for the interface: `set`, `get`, `wait` with a
//! timeout, `add`).
//!
//! [`StoreRendezvous`] runs the all-gathers of the communicator setup through the store instead
//! of a TCP root of this crate: round `k`'s record of rank `r` is the value of key
//! `coll/<gen>/<k>/<r>`, where `<gen>` counts the communicators this rank created on this store
//! (every rank creates them in the same order, so the counts agree without a round trip). A rank
//! that fails sets `coll/<gen>/abort`; every wait looks at it between slices of
//! [`POLL`], so the others fail within one slice instead of at the deadline.
//!
//! **Trust.** No port of this crate is opened: whoever can write the store can join or disturb
//! the job, as with Gloo and NCCL over the same store (PyTorch's trust model for its
//! `TCPStore`). The communicator's tag (which names its shared-memory segments) is drawn from the
//! OS random source by rank 0 and shared through the store; only its keyed one-way hash appears
//! in names others can see (see `secret::public_tag`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{BootstrapError, Exchange};

/// The longest one store wait runs before the abort key is looked at again.
pub const POLL: Duration = Duration::from_millis(50);

/// The largest record a rank may publish (business cards and connection infos are a few KiB).
pub const MAX_RECORD: usize = 1 << 20;

/// An error of the store itself (a connection lost, a key of the wrong kind), as its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl core::fmt::Display for StoreError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// A key-value store shared by the ranks of a job: the subset of `c10d::Store` a bootstrap
/// needs. Keys are strings, values bytes. Implementations: [`MemStore`] (one process), and in
/// the Python package one that calls a `torch.distributed.Store`.
pub trait Store: Send + Sync {
    /// Sets `key` to `value` (replacing any value).
    ///
    /// # Errors
    /// The store's own failure.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// The value of `key`, which must exist (call [`wait`](Self::wait) first).
    ///
    /// # Errors
    /// A missing key or the store's own failure.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;

    /// Waits at most `timeout` until every key of `keys` exists: `Ok(true)` when they do,
    /// `Ok(false)` at the timeout.
    ///
    /// # Errors
    /// The store's own failure.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<bool, StoreError>;

    /// Adds `delta` to the integer at `key` (a missing key counts as 0) and returns the new
    /// value; `delta = 0` reads it.
    ///
    /// # Errors
    /// A key holding something other than an integer, or the store's own failure.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
}

/// A [`Store`] in this process's memory, for ranks that are threads of one process (tests,
/// in-process communicators). Integers are kept as decimal text, as `c10d`'s stores keep them.
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Arc<MemStore> {
        Arc::new(MemStore::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.lock()
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError(format!("no key {key:?}")))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<bool, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.lock();
        loop {
            if keys.iter().all(|k| map.contains_key(*k)) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            map = self
                .changed
                .wait_timeout(map, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut map = self.lock();
        let now = match map.get(key) {
            None => 0,
            Some(v) => core::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| StoreError(format!("key {key:?} does not hold an integer")))?,
        };
        let new = now
            .checked_add(delta)
            .ok_or_else(|| StoreError(format!("key {key:?} overflows")))?;
        map.insert(key.to_string(), new.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(new)
    }
}

/// The setup exchange of one communicator through a [`Store`] (see the module docs).
pub struct StoreRendezvous {
    store: Arc<dyn Store>,
    prefix: String,
    rank: usize,
    nranks: usize,
    round: u32,
    timeout: Duration,
    local_ip: Option<IpAddr>,
}

fn store_err(during: String) -> impl FnOnce(StoreError) -> BootstrapError {
    move |e| BootstrapError::Store {
        during,
        message: e.0,
    }
}

impl StoreRendezvous {
    /// Joins the next communicator of rank `rank` of `nranks` on `store`; every bootstrap step
    /// waits at most `timeout`. `local_ip` is the address the other ranks reach this one at (the
    /// RoCE transport binds there; `None` leaves it to `COLL_ROCE_ADDR`). Returns the exchange
    /// and the communicator's secret tag (64 bits from the OS random source, drawn by rank 0).
    ///
    /// # Errors
    /// [`BootstrapError::Store`], [`BootstrapError::Timeout`] when rank 0's tag does not appear,
    /// [`BootstrapError::RankFailed`] when a rank aborted, [`BootstrapError::BadRecord`].
    pub fn join(
        store: Arc<dyn Store>,
        rank: usize,
        nranks: usize,
        timeout: Duration,
        local_ip: Option<IpAddr>,
    ) -> Result<(StoreRendezvous, u64), BootstrapError> {
        let gen_key = format!("coll/gen/{rank}");
        let generation = store
            .add(&gen_key, 1)
            .map_err(store_err(format!("add {gen_key}")))?;
        let rv = StoreRendezvous {
            store,
            prefix: format!("coll/{generation}/"),
            rank,
            nranks,
            round: 0,
            timeout,
            local_ip,
        };
        let tag_key = format!("{}tag", rv.prefix);
        if rank == 0 {
            let tag = super::secret::random_u64();
            rv.store
                .set(&tag_key, &tag.to_le_bytes())
                .map_err(store_err(format!("set {tag_key}")))?;
        }
        let deadline = Instant::now() + timeout;
        let raw = rv.wait_get(&tag_key, 0, deadline)?;
        let tag = <[u8; 8]>::try_from(raw.as_slice())
            .map(u64::from_le_bytes)
            .map_err(|_| BootstrapError::BadRecord {
                rank: 0,
                what: format!("a tag of {} bytes, 8 expected", raw.len()),
            })?;
        Ok((rv, tag))
    }

    fn abort_key(&self) -> String {
        format!("{}abort", self.prefix)
    }

    /// The failure a rank announced, if any.
    fn aborted(&self) -> Result<Option<BootstrapError>, BootstrapError> {
        let key = self.abort_key();
        let n = self
            .store
            .add(&key, 0)
            .map_err(store_err(format!("add {key}")))?;
        if n == 0 {
            return Ok(None);
        }
        let msg_key = format!("{key}/msg");
        let (rank, message) = match self.store.get(&msg_key) {
            Ok(v) if v.len() >= 4 => {
                let r = u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize;
                let text = String::from_utf8_lossy(&v[4..v.len().min(4 + 4096)]).into_owned();
                (Some(r), text)
            }
            _ => (None, "a rank aborted the bootstrap".to_string()),
        };
        Ok(Some(BootstrapError::RankFailed { rank, message }))
    }

    /// Waits (until `deadline`, looking at the abort key every [`POLL`]) for `key`, written by
    /// rank `from`, and returns its value.
    fn wait_get(
        &self,
        key: &str,
        from: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, BootstrapError> {
        let start = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let there = self
                .store
                .wait(&[key], left.min(POLL))
                .map_err(store_err(format!("wait {key}")))?;
            if there {
                let v = self
                    .store
                    .get(key)
                    .map_err(store_err(format!("get {key}")))?;
                if v.len() > MAX_RECORD {
                    return Err(BootstrapError::BadRecord {
                        rank: from,
                        what: format!("{} bytes, at most {MAX_RECORD} allowed", v.len()),
                    });
                }
                return Ok(v);
            }
            if let Some(e) = self.aborted()? {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(BootstrapError::Timeout {
                    waiting_for: format!("rank {from} (store key {key})"),
                    after_ms: start.elapsed().as_millis(),
                });
            }
        }
    }
}

impl Exchange for StoreRendezvous {
    fn all_gather(&mut self, record: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        if record.len() > MAX_RECORD {
            return Err(BootstrapError::BadRecord {
                rank: self.rank,
                what: format!("{} bytes, at most {MAX_RECORD} allowed", record.len()),
            });
        }
        let round = self.round;
        let key = |r: usize| format!("{}{round}/{r}", self.prefix);
        let mine = key(self.rank);
        self.store
            .set(&mine, record)
            .map_err(store_err(format!("set {mine}")))?;
        let deadline = Instant::now() + self.timeout;
        let records = (0..self.nranks)
            .map(|r| self.wait_get(&key(r), r, deadline))
            .collect::<Result<Vec<_>, _>>()?;
        self.round += 1;
        Ok(records)
    }

    fn abort(&mut self, message: &str) {
        let key = self.abort_key();
        let mut v = (self.rank as u32).to_le_bytes().to_vec();
        v.extend_from_slice(message.as_bytes());
        let _ = self.store.set(&format!("{key}/msg"), &v);
        let _ = self.store.add(&key, 1);
    }

    fn local_ip(&self) -> Option<IpAddr> {
        self.local_ip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_store_add_wait_and_errors() {
        let s = MemStore::new();
        assert_eq!(s.add("n", 2).unwrap(), 2);
        assert_eq!(s.add("n", 0).unwrap(), 2);
        s.set("x", b"abc").unwrap();
        assert!(s.add("x", 1).is_err());
        assert!(s.get("missing").is_err());
        assert!(!s.wait(&["missing"], Duration::from_millis(5)).unwrap());
        assert!(s.wait(&["x", "n"], Duration::from_millis(5)).unwrap());
    }

    #[test]
    fn all_gather_and_abort_through_the_store() {
        let store = MemStore::new();
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let store: Arc<dyn Store> = store.clone();
                std::thread::spawn(move || {
                    let (mut rv, tag) =
                        StoreRendezvous::join(store, r, 3, Duration::from_secs(10), None).unwrap();
                    let all = rv.all_gather(&[r as u8; 3]).unwrap();
                    rv.barrier().unwrap();
                    (tag, all)
                })
            })
            .collect();
        let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for (tag, all) in &out {
            assert_eq!(*tag, out[0].0);
            assert_eq!(all, &vec![vec![0u8; 3], vec![1; 3], vec![2; 3]]);
        }
        // A second communicator on the same store: rank 1 aborts, rank 0 hears it at once.
        let s1: Arc<dyn Store> = store.clone();
        let h = std::thread::spawn(move || {
            let (mut rv, _) = StoreRendezvous::join(s1, 1, 2, Duration::from_secs(30), None)?;
            rv.abort("rank 1 gives up");
            Ok::<_, BootstrapError>(())
        });
        let (mut rv, _) =
            StoreRendezvous::join(store.clone(), 0, 2, Duration::from_secs(30), None).unwrap();
        let e = rv.all_gather(b"x").unwrap_err();
        h.join().unwrap().unwrap();
        assert!(
            matches!(&e, BootstrapError::RankFailed { rank: Some(1), message } if message.contains("gives up")),
            "{e}"
        );
    }
}
