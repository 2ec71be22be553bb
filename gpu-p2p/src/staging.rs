//! Pipelined staging copies between host bytes and device memory: how the software HCA engine and
//! the VFIO link reach GPU memory.
//!
//! A software RDMA engine builds and parses packets with the CPU, so every payload byte must pass
//! through host memory that the CPU can read. For device memory that means a copy by the GPU's copy
//! engine into (or out of) *pinned* host memory, then the CPU's copy between that staging buffer and
//! the packet. [`Staged`] does this with `nslots` staging slots (two: double buffering) of `chunk`
//! bytes: while the CPU copies chunk *k* out of one slot, the device already fills the next slot with
//! chunk *k + 1*; on the way in, the CPU fills one slot while the device drains the other. Each slot
//! carries a completion marker (a CUDA event), so the CPU never touches a slot while a copy into or
//! out of it is in flight, and the pipeline never runs more than `nslots` copies ahead.
//!
//! The device side is the [`StagingDevice`] trait: slots, asynchronous copies between a slot and the
//! device memory, and a bounded wait per slot. Two implementations:
//! * [`CudaStaging`] (feature `cuda`): pinned slots from `cuMemHostAlloc`, copies with
//!   `cuMemcpyDtoHAsync` / `cuMemcpyHtoDAsync` on one stream, an event per slot;
//! * [`HostStagingDevice`]: a host-memory stand-in with a copy thread playing the copy engine, which
//!   logs every step and can inject faults and delays, so the pipeline's ordering and error paths are
//!   tested in CI on machines without a GPU.
//!
//! [`Staged`] implements [`Memory`], so the HCA registers it like any other buffer.

use core::fmt;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crate::{check_range, HostMemory, Memory, MemoryError, MemoryKind};

/// What failed in a staged transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagingError {
    /// The range is outside the device memory.
    Range(MemoryError),
    /// The CPU touched a slot while a copy into or out of it was in flight (a pipeline bug the
    /// devices detect rather than allow).
    SlotBusy {
        /// Slot index.
        slot: usize,
    },
    /// A copy did not complete within the bound (milliseconds).
    Timeout {
        /// Slot index (`usize::MAX`: the device's queue as a whole, [`StagingDevice::finish`]).
        slot: usize,
        /// The bound, in milliseconds.
        waited_ms: u64,
    },
    /// The device failed a copy or an allocation (its message: call and device).
    Device(String),
}

impl fmt::Display for StagingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StagingError::Range(e) => write!(f, "staged copy: {e}"),
            StagingError::SlotBusy { slot } => {
                write!(
                    f,
                    "staging slot {slot} accessed while its copy is in flight"
                )
            }
            StagingError::Timeout {
                slot: usize::MAX,
                waited_ms,
            } => write!(
                f,
                "staging copies queued on the device did not complete within {waited_ms} ms"
            ),
            StagingError::Timeout { slot, waited_ms } => write!(
                f,
                "staging copy through slot {slot} did not complete within {waited_ms} ms"
            ),
            StagingError::Device(m) => write!(f, "staging device: {m}"),
        }
    }
}

impl std::error::Error for StagingError {}

impl From<MemoryError> for StagingError {
    fn from(e: MemoryError) -> Self {
        StagingError::Range(e)
    }
}

/// The device interface the staging pipeline drives: device memory of [`StagingDevice::device_len`] bytes,
/// host staging slots, and asynchronous copies between a slot and the device memory.
///
/// Contract: `start_download` / `start_upload` queue one copy and mark the slot in flight;
/// `wait` blocks (at most `timeout`) until that copy is done and clears the mark; `slot_read` /
/// `slot_write` (CPU copies) fail with [`StagingError::SlotBusy`] on a slot in flight. Copies on one
/// device complete in the order queued.
pub trait StagingDevice: Send + Sync + fmt::Debug {
    /// A staging slot (pinned host buffer and its completion marker).
    type Slot: Send;

    /// Where the device memory lives.
    fn kind(&self) -> MemoryKind;
    /// Device memory length in bytes.
    fn device_len(&self) -> usize;
    /// A new slot of `capacity` bytes.
    ///
    /// # Errors
    /// [`StagingError::Device`].
    fn new_slot(&self, index: usize, capacity: usize) -> Result<Self::Slot, StagingError>;
    /// Copies the slot's first `dst.len()` bytes into `dst` (CPU).
    ///
    /// # Errors
    /// [`StagingError::SlotBusy`].
    fn slot_read(&self, slot: &Self::Slot, dst: &mut [u8]) -> Result<(), StagingError>;
    /// Copies `src` into the slot's first `src.len()` bytes (CPU).
    ///
    /// # Errors
    /// [`StagingError::SlotBusy`].
    fn slot_write(&self, slot: &Self::Slot, src: &[u8]) -> Result<(), StagingError>;
    /// Queues device `[offset, offset + len)` -> slot `[0, len)`.
    ///
    /// # Errors
    /// [`StagingError::SlotBusy`], [`StagingError::Device`].
    fn start_download(
        &self,
        slot: &mut Self::Slot,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError>;
    /// Queues slot `[0, len)` -> device `[offset, offset + len)`.
    ///
    /// # Errors
    /// [`StagingError::SlotBusy`], [`StagingError::Device`].
    fn start_upload(
        &self,
        slot: &mut Self::Slot,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError>;
    /// Waits for the slot's copy (no-op when none is in flight).
    ///
    /// # Errors
    /// [`StagingError::Timeout`], [`StagingError::Device`].
    fn wait(&self, slot: &mut Self::Slot, timeout: Duration) -> Result<(), StagingError>;
    /// Called once after every transfer, after every slot was waited for: waits (at most
    /// `timeout`) until nothing of the transfer is left queued on the device (CUDA: an event
    /// recorded at the end of the stream), so that a failed transfer leaves no copy running.
    ///
    /// # Errors
    /// [`StagingError::Timeout`] (slot index `usize::MAX`: the device as a whole),
    /// [`StagingError::Device`].
    fn finish(&self, timeout: Duration) -> Result<(), StagingError> {
        let _ = timeout;
        Ok(())
    }
    /// Device-side 64-bit compare-and-swap (IBTA vol. 1 §9.4.5).
    ///
    /// # Errors
    /// [`MemoryError`].
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError>;
    /// Device-side 64-bit fetch-and-add (IBTA vol. 1 §9.4.5).
    ///
    /// # Errors
    /// [`MemoryError`].
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError>;
}

/// Default staging chunk: 1 MiB (large enough that the per-copy launch cost is small against the
/// PCIe transfer, small enough that two slots overlap well for messages of a few MiB).
pub const DEFAULT_CHUNK: usize = 1 << 20;
/// Default bound on one chunk's copy.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Device memory reached through pipelined staging copies; implements [`Memory`].
pub struct Staged<D: StagingDevice> {
    device: D,
    slots: Mutex<Vec<D::Slot>>,
    chunk: usize,
    timeout: Duration,
}

impl<D: StagingDevice> fmt::Debug for Staged<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("device", &self.device)
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl<D: StagingDevice> Staged<D> {
    /// `nslots` slots (at least 1; 2 double-buffers) of `chunk` bytes (at least 1), each copy
    /// bounded by `timeout`.
    ///
    /// # Errors
    /// [`StagingError::Device`] when a slot cannot be allocated.
    pub fn new(
        device: D,
        nslots: usize,
        chunk: usize,
        timeout: Duration,
    ) -> Result<Self, StagingError> {
        let chunk = chunk.max(1);
        let slots = (0..nslots.max(1))
            .map(|i| device.new_slot(i, chunk))
            .collect::<Result<_, _>>()?;
        Ok(Staged {
            device,
            slots: Mutex::new(slots),
            chunk,
            timeout,
        })
    }

    /// The device behind the pipeline.
    pub fn device(&self) -> &D {
        &self.device
    }

    fn chunks(&self, offset: usize, len: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..len)
            .step_by(self.chunk)
            .map(move |at| (at, self.chunk.min(len - at)))
            .map(move |(at, n)| (offset + at, n))
    }

    /// Waits for every slot still in flight (after an error, so no slot is reused or freed under a
    /// copy), keeping the first error.
    fn drain(
        &self,
        slots: &mut [D::Slot],
        mut first: Result<(), StagingError>,
    ) -> Result<(), StagingError> {
        for s in slots.iter_mut() {
            let r = self.device.wait(s, self.timeout);
            if first.is_ok() {
                first = r;
            }
        }
        let r = self.device.finish(self.timeout);
        first.and(r)
    }

    /// Device `[offset, offset + dst.len())` -> `dst`, pipelined.
    ///
    /// # Errors
    /// [`StagingError`]; `dst` is then partly written.
    pub fn download(&self, offset: usize, dst: &mut [u8]) -> Result<(), StagingError> {
        check_range(offset, dst.len(), self.device.device_len())?;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let n = slots.len();
        let mut pending: std::collections::VecDeque<(usize, usize, usize)> = Default::default();
        let run = (|| {
            for (i, (dev_off, len)) in self.chunks(offset, dst.len()).enumerate() {
                let s = i % n;
                if pending.len() == n {
                    // The oldest copy used slot `s`: finish it before reusing the slot.
                    let (ps, at, plen) = pending.pop_front().expect("n pending");
                    self.device.wait(&mut slots[ps], self.timeout)?;
                    self.device.slot_read(&slots[ps], &mut dst[at..at + plen])?;
                }
                self.device.start_download(&mut slots[s], dev_off, len)?;
                pending.push_back((s, dev_off - offset, len));
            }
            while let Some((ps, at, plen)) = pending.pop_front() {
                self.device.wait(&mut slots[ps], self.timeout)?;
                self.device.slot_read(&slots[ps], &mut dst[at..at + plen])?;
            }
            Ok(())
        })();
        self.drain(&mut slots, run)
    }

    /// `src` -> device `[offset, offset + src.len())`, pipelined; returns when every byte is in
    /// device memory.
    ///
    /// # Errors
    /// [`StagingError`]; the device range is then partly written.
    pub fn upload(&self, offset: usize, src: &[u8]) -> Result<(), StagingError> {
        check_range(offset, src.len(), self.device.device_len())?;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let n = slots.len();
        let run = (|| {
            for (i, (dev_off, len)) in self.chunks(offset, src.len()).enumerate() {
                let s = i % n;
                // The slot's previous upload (chunk i - n) must be done before the CPU refills it.
                self.device.wait(&mut slots[s], self.timeout)?;
                let at = dev_off - offset;
                self.device.slot_write(&slots[s], &src[at..at + len])?;
                self.device.start_upload(&mut slots[s], dev_off, len)?;
            }
            Ok(())
        })();
        self.drain(&mut slots, run)
    }
}

fn to_memory_error(e: StagingError) -> MemoryError {
    match e {
        StagingError::Range(m) => m,
        other => {
            eprintln!("gpu-p2p: {other}");
            MemoryError::Device
        }
    }
}

impl<D: StagingDevice> Memory for Staged<D> {
    fn len(&self) -> usize {
        self.device.device_len()
    }

    fn kind(&self) -> MemoryKind {
        self.device.kind()
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.download(offset, dst).map_err(to_memory_error)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.upload(offset, src).map_err(to_memory_error)
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.device.compare_swap(offset, compare, swap)
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.device.fetch_add(offset, add)
    }
}

// ---- the host stand-in

/// One step the [`HostStagingDevice`] saw, in order (for tests of the pipeline's ordering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `start_download(slot, device offset, len)`.
    Download(usize, usize, usize),
    /// `start_upload(slot, device offset, len)`.
    Upload(usize, usize, usize),
    /// The copy engine finished the slot's copy.
    Done(usize),
    /// `wait(slot)` returned.
    Waited(usize),
    /// `slot_read(slot, len)`.
    SlotRead(usize, usize),
    /// `slot_write(slot, len)`.
    SlotWrite(usize, usize),
}

/// Faults the stand-in injects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// The n-th queued copy (from 0) fails when the copy engine runs it.
    pub fail_copy: Option<usize>,
    /// The n-th queued copy never completes (a hung device: the wait must time out).
    pub hang_copy: Option<usize>,
    /// Each copy takes this long on the copy engine.
    pub copy_delay: Duration,
}

#[derive(Debug, Default)]
struct Completion {
    done: bool,
    failed: bool,
}

/// A slot of the [`HostStagingDevice`].
#[derive(Debug)]
pub struct HostSlot {
    index: usize,
    buf: Arc<Mutex<Vec<u8>>>,
    state: Arc<(Mutex<Completion>, Condvar)>,
    in_flight: bool,
}

enum Job {
    Copy {
        n: usize,
        slot: usize,
        buf: Arc<Mutex<Vec<u8>>>,
        state: Arc<(Mutex<Completion>, Condvar)>,
        to_device: bool,
        offset: usize,
        len: usize,
    },
}

/// Host memory playing device memory, with a thread playing the GPU's copy engine (copies run
/// asynchronously, in the order queued, each after [`Faults::copy_delay`]). Every step is logged
/// ([`HostStagingDevice::log`]) so tests can check the pipeline's ordering.
pub struct HostStagingDevice {
    memory: Arc<HostMemory>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    engine: Option<thread::JoinHandle<()>>,
    log: Arc<Mutex<Vec<Step>>>,
    queued: Mutex<usize>,
}

impl fmt::Debug for HostStagingDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostStagingDevice")
            .field("len", &self.memory.len())
            .finish()
    }
}

impl HostStagingDevice {
    /// `memory` plays the device memory.
    pub fn new(memory: Arc<HostMemory>, faults: Faults) -> HostStagingDevice {
        let (tx, rx) = mpsc::channel::<Job>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (mem, engine_log) = (memory.clone(), log.clone());
        let engine = thread::spawn(move || {
            for job in rx {
                let Job::Copy {
                    n,
                    slot,
                    buf,
                    state,
                    to_device,
                    offset,
                    len,
                } = job;
                if faults.hang_copy == Some(n) {
                    continue;
                }
                thread::sleep(faults.copy_delay);
                let mut b = buf.lock().unwrap_or_else(|p| p.into_inner());
                let ok = faults.fail_copy != Some(n)
                    && if to_device {
                        mem.write(offset, &b[..len]).is_ok()
                    } else {
                        mem.read(offset, &mut b[..len]).is_ok()
                    };
                drop(b);
                engine_log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Step::Done(slot));
                let (m, cv) = &*state;
                let mut c = m.lock().unwrap_or_else(|p| p.into_inner());
                c.done = true;
                c.failed = !ok;
                cv.notify_all();
            }
        });
        HostStagingDevice {
            memory,
            jobs: Mutex::new(Some(tx)),
            engine: Some(engine),
            log,
            queued: Mutex::new(0),
        }
    }

    /// The steps seen so far.
    pub fn log(&self) -> Vec<Step> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The memory playing the device memory.
    pub fn memory(&self) -> &Arc<HostMemory> {
        &self.memory
    }

    fn note(&self, s: Step) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }

    fn queue(
        &self,
        slot: &mut HostSlot,
        to_device: bool,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError> {
        idle(slot.index, slot.in_flight)?;
        check_range(offset, len, self.memory.len())?;
        if len > slot.buf.lock().unwrap_or_else(|p| p.into_inner()).len() {
            return Err(StagingError::Device(format!(
                "copy of {len} bytes exceeds slot {}",
                slot.index
            )));
        }
        let n = {
            let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
            *q += 1;
            *q - 1
        };
        *slot.state.0.lock().unwrap_or_else(|p| p.into_inner()) = Completion::default();
        slot.in_flight = true;
        self.note(if to_device {
            Step::Upload(slot.index, offset, len)
        } else {
            Step::Download(slot.index, offset, len)
        });
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let sent = jobs.as_ref().map(|tx| {
            tx.send(Job::Copy {
                n,
                slot: slot.index,
                buf: slot.buf.clone(),
                state: slot.state.clone(),
                to_device,
                offset,
                len,
            })
        });
        match sent {
            Some(Ok(())) => Ok(()),
            _ => {
                slot.in_flight = false;
                Err(StagingError::Device("copy engine stopped".into()))
            }
        }
    }
}

impl Drop for HostStagingDevice {
    fn drop(&mut self) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.engine.take() {
            let _ = t.join();
        }
    }
}

impl StagingDevice for HostStagingDevice {
    type Slot = HostSlot;

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn device_len(&self) -> usize {
        self.memory.len()
    }

    fn new_slot(&self, index: usize, capacity: usize) -> Result<HostSlot, StagingError> {
        Ok(HostSlot {
            index,
            buf: Arc::new(Mutex::new(vec![0; capacity])),
            state: Arc::new((Mutex::new(Completion::default()), Condvar::new())),
            in_flight: false,
        })
    }

    fn slot_read(&self, slot: &HostSlot, dst: &mut [u8]) -> Result<(), StagingError> {
        idle(slot.index, slot.in_flight)?;
        dst.copy_from_slice(&slot.buf.lock().unwrap_or_else(|p| p.into_inner())[..dst.len()]);
        self.note(Step::SlotRead(slot.index, dst.len()));
        Ok(())
    }

    fn slot_write(&self, slot: &HostSlot, src: &[u8]) -> Result<(), StagingError> {
        idle(slot.index, slot.in_flight)?;
        slot.buf.lock().unwrap_or_else(|p| p.into_inner())[..src.len()].copy_from_slice(src);
        self.note(Step::SlotWrite(slot.index, src.len()));
        Ok(())
    }

    fn start_download(
        &self,
        slot: &mut HostSlot,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError> {
        self.queue(slot, false, offset, len)
    }

    fn start_upload(
        &self,
        slot: &mut HostSlot,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError> {
        self.queue(slot, true, offset, len)
    }

    fn wait(&self, slot: &mut HostSlot, timeout: Duration) -> Result<(), StagingError> {
        if !slot.in_flight {
            return Ok(());
        }
        let (m, cv) = &*slot.state;
        let guard = m.lock().unwrap_or_else(|p| p.into_inner());
        let (c, res) = cv
            .wait_timeout_while(guard, timeout, |c| !c.done)
            .unwrap_or_else(|p| p.into_inner());
        if res.timed_out() {
            // The slot stays in flight: a hung copy may still land in it.
            return Err(StagingError::Timeout {
                slot: slot.index,
                waited_ms: timeout.as_millis() as u64,
            });
        }
        let failed = c.failed;
        drop(c);
        slot.in_flight = false;
        self.note(Step::Waited(slot.index));
        if failed {
            return Err(StagingError::Device(format!(
                "copy through slot {} failed",
                slot.index
            )));
        }
        Ok(())
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.memory.compare_swap(offset, compare, swap)
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.memory.fetch_add(offset, add)
    }
}

// ---- CUDA

/// `Ok` when slot `index` has no copy in flight, else [`StagingError::SlotBusy`]: the check
/// before a CPU access to a slot or a new copy on it, on every staging device.
fn idle(index: usize, in_flight: bool) -> Result<(), StagingError> {
    if in_flight {
        return Err(StagingError::SlotBusy { slot: index });
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub use cuda_staging::{CudaSlot, CudaStaging};

#[cfg(feature = "cuda")]
mod cuda_staging {
    use super::*;
    use crate::cuda::{CudaEvent, CudaMemory, CudaStream, PinnedHostMemory};

    /// The CUDA staging device: pinned slots, async copies on one stream, an event per slot.
    #[derive(Debug)]
    pub struct CudaStaging {
        memory: Arc<CudaMemory>,
        stream: CudaStream,
        /// Recorded at the end of the stream by `finish`, so that its wait is bounded (a
        /// `cuStreamSynchronize` is not).
        end: CudaEvent,
    }

    /// A pinned staging slot and its event.
    #[derive(Debug)]
    pub struct CudaSlot {
        index: usize,
        buf: PinnedHostMemory,
        event: CudaEvent,
        in_flight: bool,
    }

    impl CudaStaging {
        /// Staging for `memory`, with a new stream on its device.
        ///
        /// # Errors
        /// [`StagingError::Device`].
        pub fn new(memory: Arc<CudaMemory>) -> Result<CudaStaging, StagingError> {
            let stream = memory.device().stream().map_err(dev)?;
            let end = memory.device().event(false).map_err(dev)?;
            Ok(CudaStaging {
                memory,
                stream,
                end,
            })
        }

        /// The device memory.
        pub fn memory(&self) -> &Arc<CudaMemory> {
            &self.memory
        }

        /// Starts `copy` (between the device memory and `slot`'s pinned buffer) on the stream
        /// of an idle `slot`, and records the slot's event after it: the slot is in flight
        /// until [`StagingDevice::wait`] sees the event.
        fn start_copy(
            &self,
            slot: &mut CudaSlot,
            copy: impl FnOnce(&CudaStream, &PinnedHostMemory) -> Result<(), crate::cuda::CudaError>,
        ) -> Result<(), StagingError> {
            idle(slot.index, slot.in_flight)?;
            copy(&self.stream, &slot.buf).map_err(dev)?;
            slot.event.record(&self.stream).map_err(dev)?;
            slot.in_flight = true;
            Ok(())
        }
    }

    fn dev(e: crate::cuda::CudaError) -> StagingError {
        match e {
            crate::cuda::CudaError::Memory(m) => StagingError::Range(m),
            other => StagingError::Device(other.to_string()),
        }
    }

    impl StagingDevice for CudaStaging {
        type Slot = CudaSlot;

        fn kind(&self) -> MemoryKind {
            self.memory.kind()
        }

        fn device_len(&self) -> usize {
            self.memory.len()
        }

        fn new_slot(&self, index: usize, capacity: usize) -> Result<CudaSlot, StagingError> {
            let d = self.memory.device();
            Ok(CudaSlot {
                index,
                buf: d.alloc_pinned(capacity).map_err(dev)?,
                event: d.event(false).map_err(dev)?,
                in_flight: false,
            })
        }

        fn slot_read(&self, slot: &CudaSlot, dst: &mut [u8]) -> Result<(), StagingError> {
            idle(slot.index, slot.in_flight)?;
            slot.buf.read(0, dst).map_err(StagingError::Range)
        }

        fn slot_write(&self, slot: &CudaSlot, src: &[u8]) -> Result<(), StagingError> {
            idle(slot.index, slot.in_flight)?;
            slot.buf.write(0, src).map_err(StagingError::Range)
        }

        fn start_download(
            &self,
            slot: &mut CudaSlot,
            offset: usize,
            len: usize,
        ) -> Result<(), StagingError> {
            self.start_copy(slot, |stream, buf| {
                stream.copy_to_pinned(buf, 0, &self.memory, offset, len)
            })
        }

        fn start_upload(
            &self,
            slot: &mut CudaSlot,
            offset: usize,
            len: usize,
        ) -> Result<(), StagingError> {
            self.start_copy(slot, |stream, buf| {
                stream.copy_from_pinned(&self.memory, offset, buf, 0, len)
            })
        }

        fn wait(&self, slot: &mut CudaSlot, timeout: Duration) -> Result<(), StagingError> {
            if !slot.in_flight {
                return Ok(());
            }
            match slot.event.wait(timeout) {
                Ok(()) => {
                    slot.in_flight = false;
                    Ok(())
                }
                Err(crate::cuda::CudaError::Timeout { waited_ms, .. }) => {
                    Err(StagingError::Timeout {
                        slot: slot.index,
                        waited_ms,
                    })
                }
                Err(e) => {
                    // A failed copy is no longer in flight: the stream reported it.
                    slot.in_flight = false;
                    Err(dev(e))
                }
            }
        }

        fn finish(&self, timeout: Duration) -> Result<(), StagingError> {
            self.end.record(&self.stream).map_err(dev)?;
            match self.end.wait(timeout) {
                Ok(()) => Ok(()),
                Err(crate::cuda::CudaError::Timeout { waited_ms, .. }) => {
                    Err(StagingError::Timeout {
                        slot: usize::MAX,
                        waited_ms,
                    })
                }
                Err(e) => Err(dev(e)),
            }
        }

        fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
            self.memory.compare_swap(offset, compare, swap)
        }

        fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
            self.memory.fetch_add(offset, add)
        }
    }

    impl Staged<CudaStaging> {
        /// Double-buffered staging of `memory` with [`DEFAULT_CHUNK`] slots and [`DEFAULT_TIMEOUT`].
        ///
        /// # Errors
        /// [`StagingError::Device`].
        pub fn cuda(memory: Arc<CudaMemory>) -> Result<Self, StagingError> {
            Staged::new(CudaStaging::new(memory)?, 2, DEFAULT_CHUNK, DEFAULT_TIMEOUT)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn staged(
        len: usize,
        nslots: usize,
        chunk: usize,
        faults: Faults,
    ) -> Staged<HostStagingDevice> {
        let mem = Arc::new(HostMemory::new(len).expect("map"));
        Staged::new(
            HostStagingDevice::new(mem, faults),
            nslots,
            chunk,
            Duration::from_secs(5),
        )
        .expect("slots")
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn round_trip_through_two_slots_overlaps_copies_with_cpu_work() {
        let s = staged(
            10_000,
            2,
            1000,
            Faults {
                copy_delay: Duration::from_millis(1),
                ..Faults::default()
            },
        );
        let data = pattern(9_500, 7);
        s.upload(300, &data).unwrap();
        assert_eq!(&s.device().memory().to_vec()[300..9_800], &data[..]);
        let mut back = vec![0; 9_500];
        s.download(300, &mut back).unwrap();
        assert_eq!(back, data);
        let log = s.device().log();
        // Download: chunk k+1's copy is queued before chunk k is read out of its slot (double
        // buffering), and a slot is only read after its wait.
        let downloads: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, st)| matches!(st, Step::Download(..)))
            .map(|(i, _)| i)
            .collect();
        let reads: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, st)| matches!(st, Step::SlotRead(..)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(downloads.len(), 10);
        assert_eq!(reads.len(), 10);
        for k in 0..9 {
            assert!(
                downloads[k + 1] < reads[k],
                "chunk {} queued before chunk {k} is read",
                k + 1
            );
        }
        check_invariants(&log, 2);
    }

    /// No slot is touched by the CPU or re-queued while in flight; at most `n` copies in flight.
    fn check_invariants(log: &[Step], n: usize) {
        let mut busy = std::collections::HashSet::new();
        for st in log {
            match *st {
                Step::Download(s, ..) | Step::Upload(s, ..) => {
                    assert!(busy.insert(s), "slot {s} re-queued in flight");
                    assert!(busy.len() <= n);
                }
                Step::Waited(s) => {
                    busy.remove(&s);
                }
                Step::SlotRead(s, _) | Step::SlotWrite(s, _) => {
                    assert!(!busy.contains(&s), "slot {s} touched in flight")
                }
                Step::Done(_) => {}
            }
        }
        assert!(busy.is_empty(), "every copy waited for");
    }

    #[test]
    fn failed_copy_is_reported_and_every_slot_is_drained() {
        let s = staged(
            8_000,
            2,
            1000,
            Faults {
                fail_copy: Some(3),
                ..Faults::default()
            },
        );
        let e = s.upload(0, &pattern(8_000, 1)).unwrap_err();
        assert!(matches!(e, StagingError::Device(_)), "{e}");
        check_invariants(&s.device().log(), 2);
        // The pipeline is usable afterwards.
        s.upload(0, &pattern(100, 2)).unwrap();
        let mut m = [0u8; 8];
        assert_eq!(s.read(0, &mut m), Ok(()));
        assert_eq!(s.write(0, &[1; 3]), Ok(()));
    }

    #[test]
    fn hung_copy_times_out_instead_of_blocking() {
        let mem = Arc::new(HostMemory::new(4_000).unwrap());
        let s = Staged::new(
            HostStagingDevice::new(
                mem,
                Faults {
                    hang_copy: Some(1),
                    ..Faults::default()
                },
            ),
            2,
            1000,
            Duration::from_millis(50),
        )
        .unwrap();
        let mut dst = vec![0; 4_000];
        let e = s.download(0, &mut dst).unwrap_err();
        assert!(
            matches!(
                e,
                StagingError::Timeout {
                    slot: 1,
                    waited_ms: 50
                }
            ),
            "{e}"
        );
        assert_eq!(s.read(0, &mut dst), Err(MemoryError::Device));
    }

    #[test]
    fn out_of_range_changes_nothing() {
        let s = staged(1000, 2, 100, Faults::default());
        assert!(matches!(
            s.upload(990, &[1; 11]),
            Err(StagingError::Range(_))
        ));
        assert!(matches!(
            s.download(usize::MAX, &mut [0; 2]),
            Err(StagingError::Range(_))
        ));
        assert_eq!(
            s.write(1000, &[1]),
            Err(MemoryError::OutOfBounds {
                offset: 1000,
                len: 1,
                size: 1000
            })
        );
        assert!(s.device().log().is_empty());
        assert_eq!(s.fetch_add(8, 2), Ok(0));
        assert_eq!(s.compare_swap(8, 2, 5), Ok(2));
        assert_eq!(
            s.fetch_add(4, 1),
            Err(MemoryError::Misaligned { offset: 4 })
        );
    }

    #[test]
    fn the_device_rejects_cpu_access_to_a_slot_in_flight() {
        let mem = Arc::new(HostMemory::new(100).unwrap());
        let d = HostStagingDevice::new(
            mem,
            Faults {
                copy_delay: Duration::from_millis(20),
                ..Faults::default()
            },
        );
        let mut slot = d.new_slot(0, 64).unwrap();
        d.start_download(&mut slot, 0, 64).unwrap();
        assert_eq!(
            d.slot_read(&slot, &mut [0; 4]),
            Err(StagingError::SlotBusy { slot: 0 })
        );
        assert_eq!(
            d.start_upload(&mut slot, 0, 4),
            Err(StagingError::SlotBusy { slot: 0 })
        );
        d.wait(&mut slot, Duration::from_secs(5)).unwrap();
        d.slot_read(&slot, &mut [0; 4]).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn any_chunking_round_trips(len in 1usize..5000, offset in 0usize..2000, nslots in 1usize..4, chunk in 1usize..1500) {
            let s = staged(7000, nslots, chunk, Faults::default());
            let data = pattern(len, offset as u8);
            s.write(offset, &data).unwrap();
            let mut back = vec![0; len];
            s.read(offset, &mut back).unwrap();
            prop_assert_eq!(&back, &data);
            prop_assert_eq!(&s.device().memory().to_vec()[offset..offset + len], &data[..]);
            check_invariants(&s.device().log(), nslots);
        }
    }
}
