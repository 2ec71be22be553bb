//! The GPU peer-to-peer path: ranks of one host reduce CUDA device buffers without the network and
//! without host copies, the NVLink / PCIe layer of NCCL's intra-node transport (NCCL's "P2P"
//! transport with CUDA IPC).
//!
//! Each rank keeps one device *stage* buffer and exports it with `cuIpcGetMemHandle`; every other
//! rank maps it with `cuIpcOpenMemHandle` (ranks are separate processes: CUDA does not open a
//! process's own handles). An all-reduce of `count` elements over `n` ranks, rank `r` owning the
//! element block `[r * count / n, (r + 1) * count / n)`:
//!
//! 1. copy `send` into the own stage (device-to-device), wait for the stream;
//! 2. host all-gather of a small record (ok flag, stage generation, IPC handle): doubles as the
//!    barrier after step 1 and as the agreement that every rank takes this path (a rank whose
//!    buffers are not CUDA, or whose stage cannot be made, says no, and every rank falls back to
//!    the staged host path together). Then (step "2b" in the code), when any record differs from
//!    the last call that took this path (a stage was made or regrown), every rank maps the peers'
//!    new stages (closing the old mappings) and a second all-gather of one byte says whether every
//!    mapping succeeded; if one failed, every rank falls back together. Steady state (same
//!    stages) skips this round;
//! 3. reduce the own block: copy rank 0's block into `recv`, then for each rank p >= 1 copy p's block
//!    into a scratch buffer (device-to-device from the peer's IPC-mapped stage) and apply the
//!    reduction kernel (`recv = op(recv, scratch)`, PTX from `gpu_p2p`); `avg` divides at the end;
//!    write the reduced block back into the own stage; wait; host barrier;
//! 4. copy every other rank's reduced block from its stage into `recv`; wait; host barrier (so no
//!    rank overwrites its stage in the next operation while a peer still reads it).
//!
//! **Stage lifetime.** Freeing an exported allocation while another process still has it open is
//! undefined behaviour (CUDA Driver API, `cuIpcOpenMemHandle`: "Calling cuMemFree on an exported
//! memory region before calling cuIpcCloseMemHandle in the importing context will result in
//! undefined behavior"). So a stage that is regrown is *retired*, not freed: it stays allocated until
//! the barrier after step 3 of a call in which every rank mapped the new stage, which closes every
//! peer's mapping of the old one first. Generations are unique in the process (a new path after a
//! device change never reuses one), and a mapping is reused only when generation and handle both
//! match (a new allocation at an old address gets a new handle: `cuIpcGetMemHandle`).
//!
//! The reduction order (rank 0, 1, ..., n-1) is the same on every element and every run, so results
//! are reproducible; against the ring algorithm of the host path, `f32`/`f64` sums may differ in the
//! last bits and `f16`/`bf16` sums within the bound documented in [`crate::reduce`] (at most `n - 1`
//! roundings). The host barriers travel on the communicator's own transport (shared memory).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gpu_p2p::cuda::{CudaDevice, CudaMemory, CudaStream, ElemType, IpcMemHandle, ReduceOp};
use gpu_p2p::Memory;

use crate::datatype::{DataType, RedOp};

/// Bytes of the record each rank contributes to the step-2 all-gather.
pub(crate) const RECORD_LEN: usize = 1 + 8 + 8 + IpcMemHandle::LEN;

/// The GPU element type of a collectives data type.
pub fn elem_type(dt: DataType) -> ElemType {
    match dt {
        DataType::I8 => ElemType::I8,
        DataType::U8 => ElemType::U8,
        DataType::I32 => ElemType::I32,
        DataType::U32 => ElemType::U32,
        DataType::I64 => ElemType::I64,
        DataType::U64 => ElemType::U64,
        DataType::F16 => ElemType::F16,
        DataType::Bf16 => ElemType::Bf16,
        DataType::F32 => ElemType::F32,
        DataType::F64 => ElemType::F64,
    }
}

/// The GPU operator of a collectives operator (`avg` reduces with `sum`, then divides).
pub fn reduce_op(op: RedOp) -> ReduceOp {
    match op {
        RedOp::Sum | RedOp::Avg => ReduceOp::Sum,
        RedOp::Prod => ReduceOp::Prod,
        RedOp::Min => ReduceOp::Min,
        RedOp::Max => ReduceOp::Max,
    }
}

/// One rank's record in the step-2 exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub ok: bool,
    pub generation: u64,
    pub len: u64,
    pub handle: IpcMemHandle,
}

impl Record {
    pub(crate) fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0] = u8::from(self.ok);
        b[1..9].copy_from_slice(&self.generation.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b[17..].copy_from_slice(&self.handle.0);
        b
    }

    /// Decodes a peer's record; any byte pattern decodes (a bad handle fails when opened).
    pub(crate) fn decode(b: &[u8; RECORD_LEN]) -> Record {
        let mut handle = [0u8; IpcMemHandle::LEN];
        handle.copy_from_slice(&b[17..]);
        Record {
            ok: b[0] == 1,
            generation: u64::from_le_bytes(b[1..9].try_into().unwrap_or_default()),
            len: u64::from_le_bytes(b[9..17].try_into().unwrap_or_default()),
            handle: IpcMemHandle(handle),
        }
    }
}

/// Stage generations, unique in this process (0 is never used: a record that is not ok has it).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// A new stage generation, never handed out before in this process.
pub(crate) fn next_generation() -> u64 {
    // Relaxed: only uniqueness matters, which the atomic increment gives in any ordering.
    NEXT_GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// Whether a peer's stage must be (re)mapped: no mapping yet, or the peer's record names another
/// allocation (generation or handle differ).
pub(crate) fn needs_map(mapped: Option<(u64, &IpcMemHandle)>, record: &Record) -> bool {
    mapped.is_none_or(|(generation, handle)| {
        generation != record.generation || *handle != record.handle
    })
}

/// Per-communicator state of the GPU path: this rank's stage and scratch, the peers' mapped stages.
///
/// Field order is drop order: the stream is drained first, then the peers' mappings are closed,
/// and only then this rank's own allocations are freed.
pub struct GpuPeerPath {
    device: Arc<CudaDevice>,
    stream: CudaStream,
    /// Peer rank -> (its stage generation and handle, the mapping).
    peers: HashMap<usize, (u64, IpcMemHandle, Arc<CudaMemory>)>,
    stage: Option<Arc<CudaMemory>>,
    scratch: Option<Arc<CudaMemory>>,
    /// Stages replaced by a larger one, kept until every peer has closed its mapping of them.
    retired: Vec<Arc<CudaMemory>>,
    generation: u64,
    /// The records of the last call that took this path (identical on every rank: they are the
    /// all-gather's output), to skip the mapping agreement when nothing changed.
    agreed: Option<Vec<Record>>,
}

impl core::fmt::Debug for GpuPeerPath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GpuPeerPath")
            .field("device", &self.device.ordinal())
            .field("generation", &self.generation)
            .field("peers", &self.peers.len())
            .finish()
    }
}

/// A CUDA failure, as the text a [`crate::CollError::Device`] carries.
pub(crate) type GpuResult<T> = Result<T, String>;

fn s<E: core::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl GpuPeerPath {
    /// State on `device` (the device of this rank's buffers).
    pub(crate) fn new(device: Arc<CudaDevice>) -> GpuResult<GpuPeerPath> {
        let stream = device.stream().map_err(s)?;
        Ok(GpuPeerPath {
            device,
            stream,
            peers: HashMap::new(),
            stage: None,
            scratch: None,
            retired: Vec::new(),
            generation: 0,
            agreed: None,
        })
    }

    /// The device.
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Step 1: grows the stage to `bytes` if needed (a new generation), copies `send` into it and
    /// waits. Returns this rank's record.
    pub(crate) fn stage_input(&mut self, send: &CudaMemory, bytes: usize) -> GpuResult<Record> {
        if self.stage.as_ref().is_none_or(|st| st.len() < bytes) {
            let new = Arc::new(self.device.alloc(bytes.max(1)).map_err(s)?);
            // Peers may still have the old stage mapped: retire it (see the module doc).
            if let Some(old) = self.stage.replace(new) {
                self.retired.push(old);
            }
            self.generation = next_generation();
        }
        let stage = self.stage.clone().ok_or("no stage")?;
        let handle = stage.ipc_handle().map_err(s)?;
        self.stream
            .copy_device(&stage, 0, send, 0, bytes)
            .map_err(s)?;
        self.stream.synchronize().map_err(s)?;
        Ok(Record {
            ok: true,
            generation: self.generation,
            len: stage.len() as u64,
            handle,
        })
    }

    /// Whether the records differ from those of the last call that took this path, so the
    /// mapping agreement (step 2b) must run. Every rank computes the same answer: the records are
    /// the all-gather's output and `agreed` is only set from them.
    pub(crate) fn needs_agreement(&self, records: &[Record]) -> bool {
        self.agreed.as_deref() != Some(records)
    }

    /// Notes that every rank mapped every stage of `records` (step 2b said yes).
    pub(crate) fn agreed_on(&mut self, records: &[Record]) {
        self.agreed = Some(records.to_vec());
    }

    /// Forgets the last agreement (a rank could not map a stage: the next call agrees again).
    pub(crate) fn disagreed(&mut self) {
        self.agreed = None;
    }

    /// Frees the retired stages. Call only after a barrier that every rank reached after mapping
    /// this rank's current stage (each peer then closed its mapping of the retired ones).
    pub(crate) fn release_retired(&mut self) {
        self.retired.clear();
    }

    /// Maps every peer's stage that changed since it was last mapped ([`needs_map`]), closing the
    /// old mapping first.
    pub(crate) fn map_peers(&mut self, me: usize, records: &[Record]) -> GpuResult<()> {
        for (p, r) in records.iter().enumerate() {
            if p == me {
                continue;
            }
            let mapped = self.peers.get(&p).map(|(g, h, _)| (*g, h));
            if needs_map(mapped, r) {
                // Close the old mapping before the peer may free that allocation.
                self.peers.remove(&p);
                let len = usize::try_from(r.len).map_err(s)?;
                let m = self
                    .device
                    .open_ipc(&r.handle, len)
                    .map_err(|e| format!("mapping rank {p}'s stage: {e}"))?;
                self.peers.insert(p, (r.generation, r.handle, Arc::new(m)));
            }
        }
        Ok(())
    }

    fn stage_of(&self, me: usize, p: usize) -> GpuResult<Arc<CudaMemory>> {
        if p == me {
            return self.stage.clone().ok_or_else(|| "no stage".into());
        }
        self.peers
            .get(&p)
            .map(|(_, _, m)| m.clone())
            .ok_or_else(|| format!("rank {p}'s stage is not mapped"))
    }

    /// Step 3: reduces this rank's block into `recv` and back into the own stage; waits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_own_block(
        &mut self,
        me: usize,
        nranks: usize,
        recv: &CudaMemory,
        count: usize,
        datatype: DataType,
        op: RedOp,
    ) -> GpuResult<()> {
        let es = datatype.size();
        let (lo, hi) = block(me, nranks, count);
        let (off, n) = (lo * es, hi - lo);
        if n == 0 {
            return Ok(());
        }
        if self.scratch.as_ref().is_none_or(|sc| sc.len() < n * es) {
            self.scratch = None;
            self.scratch = Some(Arc::new(self.device.alloc(n * es).map_err(s)?));
        }
        let scratch = self.scratch.clone().ok_or("no scratch")?;
        let kernels = self.device.kernels().map_err(s)?;
        let (ty, rop) = (elem_type(datatype), reduce_op(op));
        let first = self.stage_of(me, 0)?;
        self.stream
            .copy_device(recv, off, &first, off, n * es)
            .map_err(s)?;
        for p in 1..nranks {
            let peer = self.stage_of(me, p)?;
            self.stream
                .copy_device(&scratch, 0, &peer, off, n * es)
                .map_err(s)?;
            kernels
                .reduce(
                    &self.stream,
                    rop,
                    ty,
                    (recv, off),
                    (recv, off),
                    (&scratch, 0),
                    n,
                )
                .map_err(s)?;
        }
        if op == RedOp::Avg {
            kernels
                .divide(&self.stream, ty, (recv, off), n, nranks as u32)
                .map_err(s)?;
        }
        let stage = self.stage_of(me, me)?;
        self.stream
            .copy_device(&stage, off, recv, off, n * es)
            .map_err(s)?;
        self.stream.synchronize().map_err(s)
    }

    /// Step 4: copies every other rank's reduced block into `recv`; waits.
    pub(crate) fn gather_blocks(
        &mut self,
        me: usize,
        nranks: usize,
        recv: &CudaMemory,
        count: usize,
        datatype: DataType,
    ) -> GpuResult<()> {
        let es = datatype.size();
        for p in (0..nranks).filter(|&p| p != me) {
            let (lo, hi) = block(p, nranks, count);
            let peer = self.stage_of(me, p)?;
            self.stream
                .copy_device(recv, lo * es, &peer, lo * es, (hi - lo) * es)
                .map_err(s)?;
        }
        self.stream.synchronize().map_err(s)
    }
}

/// Element block `[lo, hi)` of rank `r` among `n` (sizes differ by at most one element).
pub(crate) fn block(r: usize, n: usize, count: usize) -> (usize, usize) {
    let at = |k: usize| ((count as u128 * k as u128) / n.max(1) as u128) as usize;
    (at(r), at(r + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_partition_any_count() {
        for n in 1..9 {
            for count in [0usize, 1, 7, 1000, 1001] {
                let mut next = 0;
                for r in 0..n {
                    let (lo, hi) = block(r, n, count);
                    assert_eq!(lo, next);
                    assert!(hi - lo <= count / n + 1);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn records_round_trip_and_any_bytes_decode() {
        let r = Record {
            ok: true,
            generation: 3,
            len: 1 << 20,
            handle: IpcMemHandle([7; 64]),
        };
        assert_eq!(Record::decode(&r.encode()), r);
        let junk = Record::decode(&[0xff; RECORD_LEN]);
        assert!(!junk.ok);
    }

    #[test]
    fn generations_are_unique_in_the_process_and_never_zero() {
        let a: Vec<u64> = (0..100).map(|_| next_generation()).collect();
        let t = std::thread::spawn(|| (0..100).map(|_| next_generation()).collect::<Vec<_>>());
        let b = t.join().unwrap();
        let mut all: Vec<u64> = a.into_iter().chain(b).collect();
        assert!(all.iter().all(|&g| g != 0));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 200);
    }

    #[test]
    fn a_mapping_is_reused_only_for_the_same_generation_and_handle() {
        let r = Record {
            ok: true,
            generation: 7,
            len: 4096,
            handle: IpcMemHandle([1; 64]),
        };
        assert!(needs_map(None, &r), "nothing mapped yet");
        assert!(!needs_map(Some((7, &IpcMemHandle([1; 64]))), &r));
        assert!(needs_map(Some((6, &IpcMemHandle([1; 64]))), &r), "regrown");
        assert!(
            needs_map(Some((7, &IpcMemHandle([2; 64]))), &r),
            "same generation from a restarted path, another allocation"
        );
    }

    #[test]
    fn every_type_and_operator_has_a_kernel() {
        for dt in DataType::ALL {
            assert_eq!(elem_type(dt).size(), dt.size());
            for op in crate::RedOp::ALL {
                let _ = gpu_p2p::cuda::reduce_kernel_name(reduce_op(op), elem_type(dt));
            }
        }
        assert_eq!(reduce_op(RedOp::Avg), ReduceOp::Sum);
    }
}
