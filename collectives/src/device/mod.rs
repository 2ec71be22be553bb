//! Collectives on buffers that are not host slices: CUDA device memory, pinned memory, staged
//! device memory, anything that implements [`gpu_p2p::Memory`].
//!
//! Every collective has a `*_mem` form (and `*_mem_in_place`) taking [`DeviceBuffer`]s. Two paths:
//!
//! * **GPU peer-to-peer** (`all_reduce_mem` and `all_reduce_mem_in_place`, when every rank's buffers
//!   are CUDA memory and every rank is a separate process on this host): the ranks map each other's
//!   stage buffers with CUDA IPC and reduce with device-to-device copies and GPU kernels, without the
//!   network or host copies ([`crate::transport::cuda_ipc`]). All ranks agree on the path in every
//!   call (a host all-gather of one small record), so a rank with host buffers makes every rank fall
//!   back together.
//! * **Staged** (everything else, and across hosts): the input is copied to host memory through the
//!   buffer's own `read` (CUDA: `cuMemcpyDtoH`; [`gpu_p2p::staging::Staged`]: pipelined through
//!   pinned slots), the host collective runs on the communicator's transport (shared memory or
//!   RoCE), and the output is written back. This is the software engine's path to device memory:
//!   one staging copy each way, no more.
//!
//! Results: the peer-to-peer all-reduce reduces in rank order 0..n-1 on every element; compared with
//! the host ring, integer results are identical, `f32`/`f64` sums of integer-valued data are exact,
//! and `f16`/`bf16` sums stay within the bound of [`crate::reduce`] (at most `n - 1` roundings to
//! the element type, error at most `(n - 1) * u * sum |x_i|`, `u = 2^-11` for `f16`, `2^-8` for
//! `bf16`).

use gpu_p2p::cuda::{CudaMemory, PinnedHostMemory};
use gpu_p2p::staging::{Staged, StagingDevice};
use gpu_p2p::{HostMemory, Memory};

use crate::comm::args::rule;
use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::transport::cuda_ipc::{GpuPeerPath, Record, RECORD_LEN};
use crate::transport::CollKind;
use crate::Communicator;

pub(crate) mod stats;

pub use stats::DevicePathStats;

/// A buffer a collective can read and write: a [`Memory`] that may also be CUDA device memory.
pub trait DeviceBuffer: Memory {
    /// The CUDA memory behind the buffer, when it is plain device memory (the GPU peer-to-peer path
    /// needs its device address).
    fn cuda(&self) -> Option<&CudaMemory> {
        None
    }
}

impl DeviceBuffer for HostMemory {}
impl DeviceBuffer for PinnedHostMemory {}
impl<D: StagingDevice> DeviceBuffer for Staged<D> {}
impl DeviceBuffer for CudaMemory {
    fn cuda(&self) -> Option<&CudaMemory> {
        Some(self)
    }
}

/// Bytes each buffer of an operation must hold.
struct Sizes {
    send: usize,
    recv: usize,
}

impl Communicator {
    /// Ends operation `op` with [`CollError::Device`] (`what`: one line naming the failed call and
    /// the GPU): the communicator is aborted and its peers are told, as when a device copy inside
    /// a `*_mem` collective fails. For a caller whose own device step before a collective failed
    /// (waiting for the producer's stream, say), so that the peers stop at once instead of at
    /// their timeout.
    pub fn device_failure(&mut self, op: CollKind, what: String) -> CollError {
        self.device_err(op, what)
    }

    fn device_err(&mut self, op: CollKind, what: String) -> CollError {
        let e = CollError::Device {
            op,
            rank: self.rank(),
            what,
        };
        self.abort(&e);
        e
    }

    fn load(
        &mut self,
        op: CollKind,
        what: &str,
        buf: &dyn DeviceBuffer,
        bytes: usize,
    ) -> Result<Vec<u8>, CollError> {
        self.need(op, what, buf.len(), bytes)?;
        let mut v = vec![0u8; bytes];
        match buf.read(0, &mut v) {
            Ok(()) => Ok(v),
            Err(e) => Err(self.device_err(op, format!("reading the {what} buffer: {e}"))),
        }
    }

    fn store(
        &mut self,
        op: CollKind,
        what: &str,
        buf: &dyn DeviceBuffer,
        data: &[u8],
    ) -> Result<(), CollError> {
        match buf.write(0, data) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.device_err(op, format!("writing the {what} buffer: {e}"))),
        }
    }

    /// The staged form of an out-of-place operation: host copies of both buffers, `f`, write back.
    fn staged(
        &mut self,
        op: CollKind,
        send: &dyn DeviceBuffer,
        recv: &dyn DeviceBuffer,
        sizes: Sizes,
        f: impl FnOnce(&mut Communicator, &[u8], &mut [u8]) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let s = self.load(op, "send", send, sizes.send)?;
        // The output is read first so that bytes the operation leaves alone stay as they were.
        let mut r = self.load(op, "recv", recv, sizes.recv)?;
        f(self, &s, &mut r)?;
        self.store(op, "recv", recv, &r)
    }

    /// The staged form of an in-place operation.
    fn staged_in_place(
        &mut self,
        op: CollKind,
        buf: &dyn DeviceBuffer,
        bytes: usize,
        f: impl FnOnce(&mut Communicator, &mut [u8]) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let mut b = self.load(op, "", buf, bytes)?;
        f(self, &mut b)?;
        self.store(op, "", buf, &b)
    }

    /// Why the GPU peer-to-peer path cannot be tried at all (`None`: it can): it needs several
    /// ranks, all on this host, each its own process (CUDA IPC maps another process's memory only).
    fn gpu_candidate(&self) -> Option<String> {
        let n = self.nranks();
        if n < 2 {
            return Some("one rank".into());
        }
        if self.local_rank().1 != n {
            return Some("ranks on more than one host".into());
        }
        let mut pids: Vec<u32> = (0..n).filter_map(|r| self.pid(r)).collect();
        pids.sort_unstable();
        pids.dedup();
        if pids.len() != n {
            return Some(
                "ranks are not separate processes (CUDA IPC maps another process's memory only)"
                    .into(),
            );
        }
        None
    }

    /// This rank's step-1 record (see [`crate::transport::cuda_ipc`]), or why it says no.
    fn gpu_stage(
        &mut self,
        send: Option<&CudaMemory>,
        recv: Option<&CudaMemory>,
        bytes: usize,
    ) -> Result<Record, String> {
        let (Some(s), Some(r)) = (send, recv) else {
            return Err("a buffer is not CUDA device memory".into());
        };
        if s.len() < bytes || r.len() < bytes {
            return Err(format!("a buffer is shorter than the {bytes} bytes needed"));
        }
        if s.device().ordinal() != r.device().ordinal() {
            return Err("send and receive buffers are on different GPUs".into());
        }
        if self
            .gpu
            .as_ref()
            .is_some_and(|g| g.device().ordinal() != r.device().ordinal())
        {
            // NOTE: dropping the old path frees its stage; peers that mapped it close their
            // mapping when they see this rank's new record.
            self.gpu = None;
        }
        if self.gpu.is_none() {
            self.gpu = Some(Box::new(GpuPeerPath::new(r.device().clone())?));
        }
        let g = self.gpu.as_mut().ok_or("no GPU path")?;
        g.stage_input(s, bytes)
    }

    /// The GPU peer-to-peer all-reduce; `Ok(Err(reason))` when the ranks agreed not to take it
    /// (then nothing was written and the caller stages).
    fn gpu_all_reduce(
        &mut self,
        send: Option<&CudaMemory>,
        recv: Option<&CudaMemory>,
        count: usize,
        dt: DataType,
        op: RedOp,
    ) -> Result<Result<(), String>, CollError> {
        let coll = CollKind::AllReduce;
        let bytes = self.bytes(coll, count, 1, dt)?;
        let (me, n) = (self.rank(), self.nranks());
        // Step 1 (local): may this rank take the path, and its record.
        let (mine, why_not) = match self.gpu_stage(send, recv, bytes) {
            Ok(rec) => (rec, None),
            Err(e) => (no_record(), Some(e)),
        };
        // Step 2: agreement (and the barrier after step 1).
        let mut all = vec![0u8; RECORD_LEN * n];
        self.all_gather(&mine.encode(), &mut all, RECORD_LEN, DataType::U8)?;
        let records: Vec<Record> = all
            .chunks_exact(RECORD_LEN)
            .map(|c| Record::decode(c.try_into().unwrap_or(&[0; RECORD_LEN])))
            .collect();
        if let Some(p) = records.iter().position(|r| !r.ok) {
            return Ok(Err(
                why_not.unwrap_or_else(|| format!("rank {p} cannot take it"))
            ));
        }
        let (Some(g), Some(recv)) = (self.gpu.as_mut(), recv) else {
            return Ok(Err("no GPU path state".into()));
        };
        // Step 2b: map changed stages, and agree that every rank could.
        if g.needs_agreement(&records) {
            let mapped = g.map_peers(me, &records);
            let mut oks = vec![0u8; n];
            self.all_gather(&[u8::from(mapped.is_ok())], &mut oks, 1, DataType::U8)?;
            let Some(g) = self.gpu.as_mut() else {
                return Err(self.invalid(coll, "no GPU path state".into()));
            };
            if let Some(p) = oks.iter().position(|&b| b != 1) {
                g.disagreed();
                return Ok(Err(match mapped {
                    Err(e) => e,
                    Ok(()) => format!("rank {p} could not map a peer's stage"),
                }));
            }
            g.agreed_on(&records);
        }
        // Steps 3 and 4, with host barriers between.
        let Some(g) = self.gpu.as_mut() else {
            return Err(self.invalid(coll, "no GPU path state".into()));
        };
        if let Err(e) = g.reduce_own_block(me, n, recv, count, dt, op) {
            return Err(self.device_err(coll, e));
        }
        self.barrier()?;
        // Every rank has mapped this rank's current stage (step 2b) and passed the barrier: no
        // peer has a retired stage of this rank open any more.
        let Some(g) = self.gpu.as_mut() else {
            return Err(self.invalid(coll, "no GPU path state".into()));
        };
        g.release_retired();
        if let Err(e) = g.gather_blocks(me, n, recv, count, dt) {
            return Err(self.device_err(coll, e));
        }
        self.barrier()?;
        Ok(Ok(()))
    }

    /// The GPU path if it can be tried and the ranks agree, counting which path was taken.
    /// `Ok(true)`: done on the GPU path.
    fn try_gpu_all_reduce(
        &mut self,
        send: Option<&CudaMemory>,
        recv: Option<&CudaMemory>,
        count: usize,
        dt: DataType,
        op: RedOp,
    ) -> Result<bool, CollError> {
        let outcome = match self.gpu_candidate() {
            Some(why) => Err(why),
            None => self.gpu_all_reduce(send, recv, count, dt, op)?,
        };
        match outcome {
            Ok(()) => {
                self.device_stats.gpu_p2p += 1;
                Ok(true)
            }
            Err(why) => {
                self.device_stats.staged += 1;
                self.device_stats.last_fallback = Some(why);
                Ok(false)
            }
        }
    }

    /// Which paths this communicator's device all-reduces took so far.
    pub fn device_path_stats(&self) -> &DevicePathStats {
        &self.device_stats
    }

    /// All-reduce on device buffers: the GPU peer-to-peer path when every rank has CUDA buffers
    /// and is a process of this host, else staged through host memory (see the module doc).
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`]; [`CollError::Device`] when a buffer's device fails.
    pub fn all_reduce_mem(
        &mut self,
        send: &dyn DeviceBuffer,
        recv: &dyn DeviceBuffer,
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        if self.try_gpu_all_reduce(send.cuda(), recv.cuda(), count, datatype, op)? {
            return Ok(());
        }
        let b = self.bytes(CollKind::AllReduce, count, 1, datatype)?;
        self.staged(
            CollKind::AllReduce,
            send,
            recv,
            Sizes { send: b, recv: b },
            |c, s, r| c.all_reduce(s, r, count, datatype, op),
        )
    }

    /// In-place [`Communicator::all_reduce_mem`].
    ///
    /// # Errors
    /// As [`Communicator::all_reduce_mem`].
    pub fn all_reduce_mem_in_place(
        &mut self,
        buf: &dyn DeviceBuffer,
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> Result<(), CollError> {
        if self.try_gpu_all_reduce(buf.cuda(), buf.cuda(), count, datatype, op)? {
            return Ok(());
        }
        let b = self.bytes(CollKind::AllReduce, count, 1, datatype)?;
        self.staged_in_place(CollKind::AllReduce, buf, b, |c, x| {
            c.all_reduce_in_place(x, count, datatype, op)
        })
    }
}

fn no_record() -> Record {
    Record {
        ok: false,
        generation: 0,
        len: 0,
        handle: gpu_p2p::IpcMemHandle([0; 64]),
    }
}

/// Generates the staged `*_mem` / `*_mem_in_place` forms of a collective; the buffer sizes, in blocks
/// of `count` elements, are the collective's argument rule ([`rule`]).
macro_rules! staged_collective {
    ($(#[$doc:meta])* $name:ident, $name_ip:ident, $host:ident, $host_ip:ident, $kind:expr,
     ($($arg:ident: $ty:ty),*)) => {
        impl Communicator {
            $(#[$doc])*
            ///
            /// Staged through host memory (see the module doc).
            ///
            /// # Errors
            /// As the host form; [`CollError::Device`] when a buffer's device fails.
            pub fn $name(
                &mut self,
                send: &dyn DeviceBuffer,
                recv: &dyn DeviceBuffer,
                count: usize,
                datatype: DataType,
                $($arg: $ty),*
            ) -> Result<(), CollError> {
                let n = self.nranks();
                let sizes = Sizes {
                    send: self.bytes($kind, count, rule($kind).send.of(n), datatype)?,
                    recv: self.bytes($kind, count, rule($kind).recv.of(n), datatype)?,
                };
                self.staged($kind, send, recv, sizes, |c, s, r| c.$host(s, r, count, datatype, $($arg),*))
            }

            /// In-place form of the `*_mem` call above (NCCL's in-place layout).
            ///
            /// # Errors
            /// As the out-of-place form.
            pub fn $name_ip(
                &mut self,
                buf: &dyn DeviceBuffer,
                count: usize,
                datatype: DataType,
                $($arg: $ty),*
            ) -> Result<(), CollError> {
                let n = self.nranks();
                let b = self.bytes($kind, count, rule($kind).in_place().of(n), datatype)?;
                self.staged_in_place($kind, buf, b, |c, x| c.$host_ip(x, count, datatype, $($arg),*))
            }
        }
    };
}

// Every rank passes full-size buffers, also where the host form reads or writes them on the root only.
staged_collective!(
    /// Broadcast on device buffers ([`Communicator::broadcast`]).
    broadcast_mem, broadcast_mem_in_place, broadcast, broadcast_in_place, CollKind::Broadcast,
    (root: usize)
);
staged_collective!(
    /// Reduce on device buffers ([`Communicator::reduce`]).
    reduce_mem, reduce_mem_in_place, reduce, reduce_in_place, CollKind::Reduce,
    (op: RedOp, root: usize)
);
staged_collective!(
    /// All-gather on device buffers ([`Communicator::all_gather`]).
    all_gather_mem, all_gather_mem_in_place, all_gather, all_gather_in_place, CollKind::AllGather,
    ()
);
staged_collective!(
    /// Reduce-scatter on device buffers ([`Communicator::reduce_scatter`]).
    reduce_scatter_mem, reduce_scatter_mem_in_place, reduce_scatter, reduce_scatter_in_place,
    CollKind::ReduceScatter,
    (op: RedOp)
);
staged_collective!(
    /// All-to-all on device buffers ([`Communicator::all_to_all`]).
    all_to_all_mem, all_to_all_mem_in_place, all_to_all, all_to_all_in_place, CollKind::AllToAll,
    ()
);
staged_collective!(
    /// Scatter on device buffers ([`Communicator::scatter`]).
    scatter_mem, scatter_mem_in_place, scatter, scatter_in_place, CollKind::Scatter,
    (root: usize)
);
staged_collective!(
    /// Gather on device buffers ([`Communicator::gather`]).
    gather_mem, gather_mem_in_place, gather, gather_in_place, CollKind::Gather,
    (root: usize)
);
