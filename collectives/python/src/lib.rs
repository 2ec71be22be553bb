//! `rocecoll._native`: the Python face of the `collectives` crate (PyO3, abi3 for CPython >= 3.11).
//!
//! * [`PyCommunicator`] (`rocecoll._native.Communicator`): a communicator from the launcher
//!   environment (`from_env`: torchrun, Open MPI, Slurm) or from a key-value store
//!   (`from_store`: any object with `set`, `get`, `check` and `add`, as
//!   `torch.distributed.Store`), whose operations are all non-blocking: each returns a
//!   [`PyWork`] at once and runs on the communicator's progress thread in issue order
//!   (`collectives::AsyncCommunicator`).
//! * Buffers: any object exporting a C-contiguous buffer (PEP 3118: `bytearray`, `memoryview`,
//!   numpy arrays), given as bytes (`memoryview.cast("B")`) with the element type named apart
//!   (`"float32"`, `"bfloat16"`, ...); outputs must be writable. Or a contiguous CPU
//!   `torch.Tensor` itself (its `data_ptr()`, `numel() * element_size()` bytes), which spares
//!   the Python side a numpy view per operation. The Python layer
//!   (`rocecoll/__init__.py`) turns numpy arrays and torch tensors into such views. The buffers
//!   are held (a `Py_buffer` each) until the operation's `Work` is waited for or dropped.
//! * CUDA device memory: a [`PyCudaBuffer`] (`rocecoll._native.CudaBuffer`, built by the Python
//!   layer from a CUDA `torch.Tensor`, a `__cuda_array_interface__` export or a DLPack `kDLCUDA`
//!   capsule). The operation runs through the crate's device path (`collectives::device`: the
//!   all-reduce GPU peer-to-peer over CUDA IPC when every rank's buffers are CUDA memory and every
//!   rank is a process of this host, the other collectives and the fallback staged through host
//!   memory; send / recv one host copy). Stream order, as torch-ucc orders its CUDA collectives
//!   (an event recorded on the tensor's stream, `tensor_ready`, waited for by the progress side
//!   before the data is read; ProcessGroupNCCL instead makes its NCCL stream wait on such an
//!   event on the device, and the caller's stream wait on the end event in `Work.wait`): a CUDA
//!   event is recorded on the producer's stream when the operation is issued and the operation
//!   waits for it (bounded by its timeout) before reading; the device writes are synchronous
//!   (`cuMemcpyHtoD` then a context synchronize, or the GPU path's stream synchronize), so once
//!   the `Work` has ended every stream sees the result. Without a CUDA driver the operation
//!   raises `CollectiveError` naming the operation and the driver probe's error
//!   (`gpu_p2p::cuda::Cuda::load`: "no CUDA driver: cannot load libcuda.so.1 ...").
//! * The GIL is released while an operation runs and while `Work.wait` blocks.
//! * Every operation takes `inline` (default false): true for a blocking call, which then runs
//!   on the calling thread (GIL released) when no operation is pending, without handing off to
//!   the progress thread and back; its `Work` has ended on return.
//! * Every Rust error becomes `rocecoll.CollectiveError` (a `RuntimeError`) whose message starts
//!   with `rank R:` and whose `rank` attribute is this rank; `peer` names the peer at fault when
//!   the error names one.

// pyo3 0.22's #[pymethods] expansion converts each `PyResult` into itself, which clippy
// (1.85+) reports at every method returning one.
#![allow(clippy::useless_conversion)]

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use collectives::bootstrap::{Store, StoreError};
use collectives::transport::CollKind;
use collectives::{
    AsyncCommunicator, CommConfig, Communicator, DataType, RedOp, TransportKind, Work,
};
use gpu_p2p::cuda::{Cuda, CudaDevice, CudaEvent, CudaMemory};
use gpu_p2p::Memory;
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyList, PyType};

create_exception!(
    _native,
    CollectiveError,
    PyRuntimeError,
    "A collective, point-to-point operation or communicator setup failed; `rank` is the rank \
     that raised it, `peer` the peer rank at fault when known."
);

fn coll_err(rank: usize, e: &dyn std::fmt::Display, peer: Option<usize>) -> PyErr {
    Python::with_gil(|py| {
        let err = CollectiveError::new_err(format!("rank {rank}: {e}"));
        let v = err.value_bound(py);
        let _ = v.setattr("rank", rank);
        let _ = v.setattr("peer", peer);
        err
    })
}

/// The GPUs operations have used, each opened once (its primary context retained for the life
/// of the process, as the CUDA runtime does) rather than at every operation.
static DEVICES: Mutex<Vec<Arc<CudaDevice>>> = Mutex::new(Vec::new());

fn device(cuda: Cuda, ordinal: u32) -> Result<Arc<CudaDevice>, gpu_p2p::cuda::CudaError> {
    let mut open = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = open.iter().find(|d| d.ordinal() == ordinal) {
        return Ok(d.clone());
    }
    let d = cuda.device(ordinal)?;
    open.push(d.clone());
    Ok(d)
}

/// Where a [`Buf`]'s bytes are.
enum Mem {
    /// A `Py_buffer`, held until the operation ends.
    View(PyBuffer<u8>),
    /// A CPU `torch.Tensor`'s memory (`data_ptr()`, `numel() * element_size()` bytes),
    /// reached without the buffer protocol (a tensor exports none: the Python side would need
    /// `t.detach().reshape(-1).view(torch.uint8).numpy()`, several microseconds per operation).
    /// The tensor is referenced until the operation ends; as in `torch.distributed`, resizing
    /// it or replacing its storage (`resize_`, `set_`) while an operation uses it is the
    /// caller's error.
    Tensor {
        _tensor: Py<PyAny>,
        ptr: usize,
        len: usize,
    },
    /// CUDA device memory ([`PyCudaBuffer`]), borrowed through gpu-p2p, with the event recorded
    /// on the producer's stream when the operation was issued (`None`: no stream to order
    /// after). The descriptor (and through it the tensor or exporter) is referenced until the
    /// operation ends.
    Cuda {
        _desc: Py<PyAny>,
        mem: CudaMemory,
        ready: Option<CudaEvent>,
    },
}

/// One buffer of an operation, held until the operation ends.
struct Buf {
    mem: Mem,
}

/// `torch.Tensor`, once `torch` has been imported (looked up in `sys.modules`: this module
/// never imports torch itself).
static TORCH_TENSOR: GILOnceCell<Py<PyType>> = GILOnceCell::new();

fn torch_tensor_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    if let Some(t) = TORCH_TENSOR.get(py) {
        return Some(t.bind(py));
    }
    let modules = py.import_bound("sys").ok()?.getattr("modules").ok()?;
    let torch = modules.get_item("torch").ok()?;
    let tensor = torch
        .getattr("Tensor")
        .ok()?
        .downcast_into::<PyType>()
        .ok()?;
    let _ = TORCH_TENSOR.set(py, tensor.unbind());
    TORCH_TENSOR.get(py).map(|t| t.bind(py))
}

impl Buf {
    fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str, rank: usize) -> PyResult<Buf> {
        if let Ok(desc) = obj.downcast::<PyCudaBuffer>() {
            return Buf::cuda(desc, writable, what, rank);
        }
        if let Some(tensor) = torch_tensor_type(obj.py()) {
            if obj.is_instance(tensor)? {
                return Buf::tensor(obj, what);
            }
        }
        let view = PyBuffer::<u8>::get_bound(obj).map_err(|e| {
            PyValueError::new_err(format!(
                "{what}: a C-contiguous byte buffer is needed (memoryview(x).cast('B')): {e}"
            ))
        })?;
        if !view.is_c_contiguous() {
            return Err(PyValueError::new_err(format!("{what}: not C-contiguous")));
        }
        if writable && view.readonly() {
            return Err(PyValueError::new_err(format!("{what}: read-only buffer")));
        }
        Ok(Buf {
            mem: Mem::View(view),
        })
    }

    /// A contiguous CPU tensor's memory; anything else is a `ValueError` (the Python layer
    /// names GPU memory apart, as a `CollectiveError`).
    fn tensor(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Buf> {
        // Interned names: one Python call each, no string made per call (this runs for every
        // tensor of every operation).
        let py = obj.py();
        if !obj.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
            return Err(PyValueError::new_err(format!(
                "{what}: a tensor on {}: CPU tensors only",
                obj.getattr("device")?
            )));
        }
        if !obj
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        {
            return Err(PyValueError::new_err(format!(
                "{what}: tensor is not contiguous"
            )));
        }
        let numel: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
        let size: usize = obj.call_method0(intern!(py, "element_size"))?.extract()?;
        let ptr: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
        let len = numel.checked_mul(size).ok_or_else(|| {
            PyValueError::new_err(format!("{what}: {numel} elements of {size} bytes overflow"))
        })?;
        if len > 0 && ptr == 0 {
            return Err(PyValueError::new_err(format!(
                "{what}: tensor without memory"
            )));
        }
        Ok(Buf {
            mem: Mem::Tensor {
                _tensor: obj.clone().unbind(),
                ptr,
                len,
            },
        })
    }

    /// CUDA device memory described by `desc`: the driver is loaded (its probe's error, e.g.
    /// "no CUDA driver: cannot load libcuda.so.1 ...", becomes a `CollectiveError` naming the
    /// operation), the range checked to be device memory ([`gpu_p2p::cuda::CudaDevice::borrow`])
    /// and an event recorded on the producer's stream, which the operation waits for before it
    /// reads the memory.
    fn cuda(
        desc: &Bound<'_, PyCudaBuffer>,
        writable: bool,
        what: &str,
        rank: usize,
    ) -> PyResult<Buf> {
        let d = desc.get();
        if writable && d.readonly {
            return Err(PyValueError::new_err(format!(
                "{what}: {} is read-only",
                d.describe
            )));
        }
        let fail = |e: &dyn std::fmt::Display| {
            coll_err(rank, &format!("{what}: {}: {e}", d.describe), None)
        };
        let cuda = Cuda::load().map_err(|e| fail(&e))?;
        let ordinal = match d.device {
            Some(o) => o,
            None => cuda.device_of(d.ptr).map_err(|e| fail(&e))?,
        };
        let device = device(cuda, ordinal).map_err(|e| fail(&e))?;
        let mem = device.borrow(d.ptr, d.len).map_err(|e| fail(&e))?;
        let ready = match d.stream {
            None => None,
            Some(stream) => {
                let ev = device.event(false).map_err(|e| fail(&e))?;
                // SAFETY: `stream` is 0, 1 (CU_STREAM_LEGACY), 2 (CU_STREAM_PER_THREAD) or the
                // handle of a live stream of this device, as the exporter declared it
                // (torch.cuda.current_stream(device).cuda_stream, the `stream` key of a
                // __cuda_array_interface__ v3 export): the contract of `CudaBuffer(stream=)`.
                #[allow(unsafe_code)]
                unsafe { ev.record_on_raw_stream(stream) }.map_err(|e| fail(&e))?;
                Some(ev)
            }
        };
        Ok(Buf {
            mem: Mem::Cuda {
                _desc: desc.clone().into_any().unbind(),
                mem,
                ready,
            },
        })
    }

    /// The device memory, for a CUDA buffer.
    fn device(&self) -> Option<&CudaMemory> {
        match &self.mem {
            Mem::Cuda { mem, .. } => Some(mem),
            _ => None,
        }
    }

    /// Waits (on the thread running the operation) until the producer's stream has reached the
    /// point recorded at issue, at most `timeout`; a failure ends the operation on every rank
    /// ([`Communicator::device_failure`]).
    fn ready(
        &self,
        c: &mut Communicator,
        op: CollKind,
        timeout: Option<Duration>,
    ) -> Result<(), collectives::CollError> {
        if let Mem::Cuda {
            ready: Some(ev), ..
        } = &self.mem
        {
            let t = timeout.unwrap_or(c.config().timeout);
            if let Err(e) = ev.wait(t) {
                return Err(
                    c.device_failure(op, format!("waiting for the producer's CUDA stream: {e}"))
                );
            }
        }
        Ok(())
    }

    fn ptr(&self) -> usize {
        match &self.mem {
            Mem::View(v) => v.buf_ptr() as usize,
            Mem::Tensor { ptr, .. } => *ptr,
            Mem::Cuda { mem, .. } => mem.device_ptr() as usize,
        }
    }

    fn len(&self) -> usize {
        match &self.mem {
            Mem::View(v) => v.len_bytes(),
            Mem::Tensor { len, .. } => *len,
            Mem::Cuda { mem, .. } => mem.len(),
        }
    }

    /// Where the buffer is, for error messages: "host memory" or "cuda:N".
    fn place(&self) -> String {
        match self.device() {
            Some(m) => format!("cuda:{}", m.device().ordinal()),
            None => "host memory".into(),
        }
    }

    fn range(&self) -> (usize, usize) {
        let start = self.ptr();
        (start, start + self.len())
    }
}

impl AsRef<[u8]> for Buf {
    /// The bytes of a host buffer; empty for device memory (never used so: every operation
    /// takes the device path when [`Buf::device`] is `Some`).
    fn as_ref(&self) -> &[u8] {
        if self.len() == 0 || self.device().is_some() {
            return &[];
        }
        // SAFETY: the Py_buffer stays acquired (the exporter keeps the memory alive and in
        // place), or the tensor referenced, while `self` lives; the memory is C-contiguous and
        // `len` bytes long (checked in `get` / `tensor`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr() as *const u8, self.len())
        }
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len() == 0 || self.device().is_some() {
            return &mut [];
        }
        // SAFETY: as `as_ref`, and the buffer is writable (checked in `get` for every buffer
        // used as an output; a CPU tensor's memory is); no other Rust reference to it exists
        // (inputs overlapping outputs are refused by `disjoint`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr() as *mut u8, self.len())
        }
    }
}

/// Both buffers device memory or neither, checked before either is looked at (so that the
/// mix is named even where no CUDA driver is present).
fn one_kind(what: &str, send: &Bound<'_, PyAny>, recv: &Bound<'_, PyAny>) -> PyResult<()> {
    let (s, r) = (
        send.downcast::<PyCudaBuffer>().is_ok(),
        recv.downcast::<PyCudaBuffer>().is_ok(),
    );
    if s != r {
        let name = |cuda: bool| if cuda { "CUDA memory" } else { "host memory" };
        return Err(PyValueError::new_err(format!(
            "{what}: input in {} and output in {}: both must be on the same device",
            name(s),
            name(r)
        )));
    }
    Ok(())
}

/// Both buffers of an out-of-place operation in host memory, or both on one GPU (as
/// `torch.distributed`: a collective's tensors share a device).
fn same_place(what: &str, a: &Buf, b: &Buf) -> PyResult<()> {
    let (pa, pb) = (a.place(), b.place());
    if pa != pb {
        return Err(PyValueError::new_err(format!(
            "{what}: input in {pa} and output in {pb}: both must be on the same device"
        )));
    }
    Ok(())
}

fn disjoint(a: &Buf, b: &Buf) -> PyResult<()> {
    let ((a0, a1), (b0, b1)) = (a.range(), b.range());
    if a.len() > 0 && b.len() > 0 && a0 < b1 && b0 < a1 {
        return Err(PyValueError::new_err(
            "the input and output buffers overlap: use the in-place form",
        ));
    }
    Ok(())
}

/// What an operation hands back when it ends: its buffers, released on the waiting thread.
enum Done {
    None,
    One(#[allow(dead_code)] Buf),
    Two(#[allow(dead_code)] Buf, #[allow(dead_code)] Buf),
}

/// `rocecoll._native.CudaBuffer(ptr, nbytes, device=None, stream=None, readonly=False,
/// describe="device memory", keep=None)`: a description of CUDA device memory for an operation
/// (built by the Python layer from a CUDA `torch.Tensor`, a `__cuda_array_interface__` export or
/// a DLPack `kDLCUDA` capsule). `ptr`: the device address; `nbytes`: its length in bytes;
/// `device`: the CUDA ordinal (`None`: asked of the driver from `ptr`); `stream`: the raw
/// `CUstream` the producer wrote on (0 the NULL stream, 1 `CU_STREAM_LEGACY`, 2
/// `CU_STREAM_PER_THREAD`, else a live stream handle of that device; `None`: the producer
/// needs no ordering, CUDA Array Interface v3); `keep`: an object to reference until the
/// operation ends (the tensor or the DLPack owner). Nothing touches the driver until an
/// operation uses it. Raises `ValueError` for a NULL `ptr` with `nbytes` > 0, `nbytes` over
/// `isize::MAX` or a range past the 64-bit address space (`ptr + nbytes > 2**64`).
#[pyclass(name = "CudaBuffer", module = "rocecoll._native", frozen)]
struct PyCudaBuffer {
    ptr: u64,
    len: usize,
    device: Option<u32>,
    stream: Option<usize>,
    readonly: bool,
    describe: String,
    _keep: Option<Py<PyAny>>,
}

#[pymethods]
impl PyCudaBuffer {
    #[new]
    #[pyo3(signature = (ptr, nbytes, device=None, stream=None, readonly=false, describe=None, keep=None))]
    fn new(
        ptr: u64,
        nbytes: usize,
        device: Option<u32>,
        stream: Option<usize>,
        readonly: bool,
        describe: Option<String>,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<PyCudaBuffer> {
        if ptr == 0 && nbytes > 0 {
            return Err(PyValueError::new_err(format!(
                "CudaBuffer: a NULL device address for {nbytes} bytes"
            )));
        }
        if nbytes > isize::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "CudaBuffer: {nbytes} bytes: more than isize::MAX bytes"
            )));
        }
        // The range's end may be 2**64 (its last byte 2**64 - 1), never past it.
        if u128::from(ptr) + nbytes as u128 > 1 << 64 {
            return Err(PyValueError::new_err(format!(
                "CudaBuffer: {nbytes} bytes at {ptr:#x} reach beyond the address space"
            )));
        }
        Ok(PyCudaBuffer {
            ptr,
            len: nbytes,
            device,
            stream,
            readonly,
            describe: describe.unwrap_or_else(|| "device memory".into()),
            _keep: keep,
        })
    }

    /// The device address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!(
            "CudaBuffer({:#x}, {} bytes, device={:?}, stream={:?}: {})",
            self.ptr, self.len, self.device, self.stream, self.describe
        )
    }
}

/// A `torch.distributed.Store`-like Python object as a [`Store`]: `set(key, bytes)`,
/// `get(key) -> bytes`, `check([keys]) -> bool`, `add(key, int) -> int`.
struct PyStore(Py<PyAny>);

fn store_err(e: PyErr) -> StoreError {
    StoreError(Python::with_gil(|py| e.value_bound(py).to_string()))
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Python::with_gil(|py| {
            self.0
                .call_method1(py, "set", (key, PyBytes::new_bound(py, value)))
                .map(drop)
        })
        .map_err(store_err)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        Python::with_gil(|py| {
            let v = self.0.call_method1(py, "get", (key,))?;
            v.extract::<Vec<u8>>(py)
        })
        .map_err(store_err)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<bool, StoreError> {
        // `check` never blocks, so the GIL is held only briefly; poll it every millisecond or
        // so up to the timeout (callers pass at most `collectives::bootstrap::store::POLL`).
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let there = Python::with_gil(|py| {
                let list = PyList::new_bound(py, keys);
                self.0
                    .call_method1(py, "check", (list,))?
                    .extract::<bool>(py)
            })
            .map_err(store_err)?;
            if there {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        Python::with_gil(|py| self.0.call_method1(py, "add", (key, delta))?.extract(py))
            .map_err(store_err)
    }
}

fn datatype(name: &str) -> PyResult<DataType> {
    name.parse()
        .map_err(|e: collectives::UnknownName| PyValueError::new_err(e.to_string()))
}

fn redop(name: &str) -> PyResult<RedOp> {
    name.parse()
        .map_err(|e: collectives::UnknownName| PyValueError::new_err(e.to_string()))
}

fn timeout_of(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    seconds
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| PyValueError::new_err(format!("timeout {s} s: must be > 0")))
        })
        .transpose()
}

fn config(
    transport: Option<&str>,
    timeout: Option<f64>,
    bootstrap_timeout: Option<f64>,
) -> PyResult<CommConfig> {
    let mut c = CommConfig::default()
        .with_env_overrides()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let Some(t) = transport {
        c.transport = t
            .parse::<TransportKind>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    if let Some(t) = timeout_of(timeout)? {
        c.timeout = t;
    }
    if let Some(t) = timeout_of(bootstrap_timeout)? {
        c.bootstrap_timeout = t;
    }
    Ok(c)
}

/// The count of `datatype` elements in `len` bytes.
fn count_of(len: usize, dt: DataType, what: &str) -> PyResult<usize> {
    if len % dt.size() != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: {len} bytes is not a whole number of {} elements",
            dt.name()
        )));
    }
    Ok(len / dt.size())
}

/// A communicator whose every operation is non-blocking (returns a `Work`).
#[pyclass(name = "Communicator", module = "rocecoll._native", frozen)]
struct PyCommunicator {
    inner: AsyncCommunicator,
}

/// How an operation ended: `Ok`, or its error's text and the peer it names.
type Outcome = Result<(), (String, Option<usize>)>;

/// The handle of one operation: `wait([timeout])`, `is_completed()`.
#[pyclass(name = "Work", module = "rocecoll._native", frozen)]
struct PyWork {
    rank: usize,
    work: Mutex<Option<Work<Done>>>,
    /// The result once taken (`Ok` or the error's text and peer).
    outcome: Mutex<Option<Outcome>>,
}

impl PyWork {
    fn new(rank: usize, w: Work<Done>) -> PyWork {
        PyWork {
            rank,
            work: Mutex::new(Some(w)),
            outcome: Mutex::new(None),
        }
    }

    fn settle(&self, outcome: &Outcome) -> PyResult<()> {
        match outcome {
            Ok(()) => Ok(()),
            Err((msg, peer)) => Err(coll_err(self.rank, msg, *peer)),
        }
    }
}

#[pymethods]
impl PyWork {
    /// Waits for the operation (at most `timeout` seconds when given: then returns False if it
    /// has not ended) and returns True; raises `CollectiveError` if it failed. The GIL is
    /// released while waiting.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout_of(timeout)?;
        if let Some(o) = self
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return self.settle(o).map(|()| true);
        }
        let mut slot = self.work.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = slot.take() else {
            // Another thread took it and is settling it: wait for its outcome.
            drop(slot);
            return Err(PyRuntimeError::new_err(
                "Work.wait called from two threads at once",
            ));
        };
        if let Some(t) = timeout {
            let done = py.allow_threads(|| w.wait_timeout(t));
            if !done {
                *slot = Some(w);
                return Ok(false);
            }
        }
        let r = py.allow_threads(|| w.wait());
        // The buffers (`Done`) are released here, with the GIL.
        let outcome = match r {
            Ok(_done) => Ok(()),
            Err(e) => Err((e.to_string(), e.peer())),
        };
        let res = self.settle(&outcome);
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        drop(slot);
        res.map(|()| true)
    }

    /// Whether the operation has ended (never blocks).
    fn is_completed(&self) -> bool {
        if self
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return true;
        }
        self.work
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(Work::test)
    }
}

impl Drop for PyCommunicator {
    /// Operations still in flight may release Python buffers (which takes the GIL) as they
    /// end: wait for them with the GIL released.
    fn drop(&mut self) {
        let inner = &mut self.inner;
        Python::with_gil(|py| py.allow_threads(|| inner.close()));
    }
}

impl PyCommunicator {
    fn wrap(
        py: Python<'_>,
        made: Result<Communicator, collectives::InitError>,
        rank: usize,
    ) -> PyResult<PyCommunicator> {
        let comm = made.map_err(|e| coll_err(rank, &e, None))?;
        let inner = AsyncCommunicator::new(comm).map_err(|e| coll_err(rank, &e, None))?;
        let _ = py;
        Ok(PyCommunicator { inner })
    }

    fn work(&self, w: Work<Done>) -> PyWork {
        PyWork::new(self.inner.rank(), w)
    }

    /// Issues `f`: on the progress thread (`inline` false), or, for a blocking call (`inline`
    /// true), on this thread with the GIL released when no operation is pending
    /// (`AsyncCommunicator::run_or_submit`; else queued like the others). The returned `Work`
    /// has then already ended.
    fn issue(
        &self,
        py: Python<'_>,
        inline: bool,
        op: CollKind,
        timeout: Option<Duration>,
        f: impl FnOnce(&mut Communicator) -> Result<Done, collectives::CollError> + Send + 'static,
    ) -> PyWork {
        let w = if inline {
            let inner = &self.inner;
            py.allow_threads(move || inner.run_or_submit(op, timeout, f))
        } else {
            self.inner.submit(op, timeout, f)
        };
        self.work(w)
    }
}

#[pymethods]
impl PyCommunicator {
    /// A communicator from the launcher's environment (torchrun: RANK, WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT; Open MPI; Slurm). `transport`: "auto" | "shm" | "roce" |
    /// "inproc"; `timeout`: seconds an operation may wait without progress;
    /// `bootstrap_timeout`: seconds for each bootstrap step. `COLL_*` variables override.
    #[staticmethod]
    #[pyo3(signature = (transport=None, timeout=None, bootstrap_timeout=None))]
    fn from_env(
        py: Python<'_>,
        transport: Option<&str>,
        timeout: Option<f64>,
        bootstrap_timeout: Option<f64>,
    ) -> PyResult<PyCommunicator> {
        let c = config(transport, timeout, bootstrap_timeout)?;
        let rank = std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let made = py.allow_threads(|| Communicator::from_env(c));
        Self::wrap(py, made, rank)
    }

    /// A communicator of `size` ranks that rendezvous through `store` (a
    /// `torch.distributed.Store`, or any object with `set`, `get`, `check`, `add`), with no
    /// port of its own. `local_ip`: the address other ranks reach this one at (the RoCE
    /// transport binds there). Other arguments as `from_env`.
    #[staticmethod]
    #[pyo3(signature = (store, rank, size, transport=None, local_ip=None, timeout=None, bootstrap_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_store(
        py: Python<'_>,
        store: Py<PyAny>,
        rank: usize,
        size: usize,
        transport: Option<&str>,
        local_ip: Option<&str>,
        timeout: Option<f64>,
        bootstrap_timeout: Option<f64>,
    ) -> PyResult<PyCommunicator> {
        let c = config(transport, timeout, bootstrap_timeout)?;
        let ip = local_ip
            .map(|s| {
                s.parse::<IpAddr>()
                    .map_err(|e| PyValueError::new_err(format!("local_ip {s:?}: {e}")))
            })
            .transpose()?;
        let store: Arc<dyn Store> = Arc::new(PyStore(store));
        let made = py.allow_threads(|| Communicator::from_store(store, rank, size, c, ip));
        Self::wrap(py, made, rank)
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Ranks in the communicator.
    #[getter]
    fn size(&self) -> usize {
        self.inner.nranks()
    }

    /// How many operations ran on their caller's thread (`inline=True` with nothing pending).
    #[getter]
    fn inline_ops(&self) -> u64 {
        self.inner.inline_ops()
    }

    /// Ends the operation in progress and every queued one with `CollectiveError`, from any
    /// thread, and tells the peers. Later operations raise.
    fn abort(&self) {
        self.inner.abort();
    }

    /// In-place all-reduce of `buf` (elements of `dtype`) with `op` ("sum" "prod" "min" "max"
    /// "avg"); `timeout` in seconds for this operation.
    #[pyo3(signature = (buf, dtype, op="sum", timeout=None, inline=false))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        op: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, op, t) = (datatype(dtype)?, redop(op)?, timeout_of(timeout)?);
        let mut b = Buf::get(buf, true, "all_reduce buffer", self.inner.rank())?;
        let n = count_of(b.len(), dt, "all_reduce buffer")?;
        const K: CollKind = CollKind::AllReduce;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                Some(m) => {
                    b.ready(c, K, t)?;
                    c.all_reduce_mem_in_place(m, n, dt, op)
                }
                None => c.all_reduce_in_place(b.as_mut(), n, dt, op),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// In-place broadcast of `buf` from `root`.
    #[pyo3(signature = (buf, dtype, root, timeout=None, inline=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        root: usize,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        let mut b = Buf::get(buf, true, "broadcast buffer", self.inner.rank())?;
        let n = count_of(b.len(), dt, "broadcast buffer")?;
        const K: CollKind = CollKind::Broadcast;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                Some(m) => {
                    b.ready(c, K, t)?;
                    c.broadcast_mem_in_place(m, n, dt, root)
                }
                None => c.broadcast_in_place(b.as_mut(), n, dt, root),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// In-place reduce of `buf` to `root` (other ranks' buffers are left as they were or
    /// hold partial results, as NCCL's).
    #[pyo3(signature = (buf, dtype, root, op="sum", timeout=None, inline=false))]
    // The Python keyword signature, one argument each.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        root: usize,
        op: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, op, t) = (datatype(dtype)?, redop(op)?, timeout_of(timeout)?);
        let mut b = Buf::get(buf, true, "reduce buffer", self.inner.rank())?;
        let n = count_of(b.len(), dt, "reduce buffer")?;
        const K: CollKind = CollKind::Reduce;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                Some(m) => {
                    b.ready(c, K, t)?;
                    c.reduce_mem_in_place(m, n, dt, op, root)
                }
                None => c.reduce_in_place(b.as_mut(), n, dt, op, root),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// All-gather: `send` (n elements) from every rank into `recv` (size * n, rank order).
    #[pyo3(signature = (send, recv, dtype, timeout=None, inline=false))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        one_kind("all_gather", send, recv)?;
        let s = Buf::get(send, false, "all_gather input", self.inner.rank())?;
        let mut r = Buf::get(recv, true, "all_gather output", self.inner.rank())?;
        same_place("all_gather", &s, &r)?;
        disjoint(&s, &r)?;
        let n = count_of(s.len(), dt, "all_gather input")?;
        const K: CollKind = CollKind::AllGather;
        Ok(self.issue(py, inline, K, t, move |c| {
            match (s.device(), r.device()) {
                (Some(sm), Some(rm)) => {
                    s.ready(c, K, t)?;
                    r.ready(c, K, t)?;
                    c.all_gather_mem(sm, rm, n, dt)
                }
                _ => c.all_gather(s.as_ref(), r.as_mut(), n, dt),
            }
            .map(|()| Done::Two(s, r))
        }))
    }

    /// In-place all-gather: this rank's n elements are block `rank` of `buf` (size * n
    /// elements), as NCCL's `sendbuff == recvbuff + rank * count` (FSDP2 gathers so).
    #[pyo3(signature = (buf, dtype, timeout=None, inline=false))]
    fn all_gather_in_place(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        let mut b = Buf::get(buf, true, "all_gather buffer", self.inner.rank())?;
        let total = count_of(b.len(), dt, "all_gather buffer")?;
        let size = self.inner.nranks();
        if total % size != 0 {
            return Err(PyValueError::new_err(format!(
                "all_gather buffer: {total} elements is not {size} equal blocks"
            )));
        }
        let n = total / size;
        const K: CollKind = CollKind::AllGather;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                Some(m) => {
                    b.ready(c, K, t)?;
                    c.all_gather_mem_in_place(m, n, dt)
                }
                None => c.all_gather_in_place(b.as_mut(), n, dt),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// Reduce-scatter: `send` (size * n elements) reduced with `op`; this rank's block of n
    /// into `recv`.
    #[pyo3(signature = (send, recv, dtype, op="sum", timeout=None, inline=false))]
    // The Python keyword signature, one argument each.
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: &str,
        op: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, op, t) = (datatype(dtype)?, redop(op)?, timeout_of(timeout)?);
        one_kind("reduce_scatter", send, recv)?;
        let s = Buf::get(send, false, "reduce_scatter input", self.inner.rank())?;
        let mut r = Buf::get(recv, true, "reduce_scatter output", self.inner.rank())?;
        same_place("reduce_scatter", &s, &r)?;
        disjoint(&s, &r)?;
        let n = count_of(r.len(), dt, "reduce_scatter output")?;
        const K: CollKind = CollKind::ReduceScatter;
        Ok(self.issue(py, inline, K, t, move |c| {
            match (s.device(), r.device()) {
                (Some(sm), Some(rm)) => {
                    s.ready(c, K, t)?;
                    r.ready(c, K, t)?;
                    c.reduce_scatter_mem(sm, rm, n, dt, op)
                }
                _ => c.reduce_scatter(s.as_ref(), r.as_mut(), n, dt, op),
            }
            .map(|()| Done::Two(s, r))
        }))
    }

    /// All-to-all: block j of `send` (size blocks of n) to rank j; block i of `recv` from
    /// rank i.
    #[pyo3(signature = (send, recv, dtype, timeout=None, inline=false))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: &str,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        one_kind("all_to_all", send, recv)?;
        let s = Buf::get(send, false, "all_to_all input", self.inner.rank())?;
        let mut r = Buf::get(recv, true, "all_to_all output", self.inner.rank())?;
        same_place("all_to_all", &s, &r)?;
        disjoint(&s, &r)?;
        let total = count_of(s.len(), dt, "all_to_all input")?;
        let size = self.inner.nranks();
        if total % size != 0 {
            return Err(PyValueError::new_err(format!(
                "all_to_all input: {total} elements is not {size} equal blocks"
            )));
        }
        let n = total / size;
        const K: CollKind = CollKind::AllToAll;
        Ok(self.issue(py, inline, K, t, move |c| {
            match (s.device(), r.device()) {
                (Some(sm), Some(rm)) => {
                    s.ready(c, K, t)?;
                    r.ready(c, K, t)?;
                    c.all_to_all_mem(sm, rm, n, dt)
                }
                _ => c.all_to_all(s.as_ref(), r.as_mut(), n, dt),
            }
            .map(|()| Done::Two(s, r))
        }))
    }

    /// Sends `buf` to `peer`.
    #[pyo3(signature = (buf, dtype, peer, timeout=None, inline=false))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        peer: usize,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        let b = Buf::get(buf, false, "send buffer", self.inner.rank())?;
        let n = count_of(b.len(), dt, "send buffer")?;
        const K: CollKind = CollKind::SendRecv;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                // Staged as the `*_mem` collectives: one copy to host memory, the host send.
                Some(m) => {
                    b.ready(c, K, t)?;
                    let mut v = vec![0u8; m.len()];
                    if let Err(e) = m.read(0, &mut v) {
                        return Err(c.device_failure(K, format!("reading the send buffer: {e}")));
                    }
                    c.send(&v, n, dt, peer)
                }
                None => c.send(b.as_ref(), n, dt, peer),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// Receives into `buf` from `peer` (the sender's count must equal this buffer's).
    #[pyo3(signature = (buf, dtype, peer, timeout=None, inline=false))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        peer: usize,
        timeout: Option<f64>,
        inline: bool,
    ) -> PyResult<PyWork> {
        let (dt, t) = (datatype(dtype)?, timeout_of(timeout)?);
        let mut b = Buf::get(buf, true, "recv buffer", self.inner.rank())?;
        let n = count_of(b.len(), dt, "recv buffer")?;
        const K: CollKind = CollKind::SendRecv;
        Ok(self.issue(py, inline, K, t, move |c| {
            match b.device() {
                // The host receive, then one copy into device memory.
                Some(m) => {
                    b.ready(c, K, t)?;
                    let mut v = vec![0u8; m.len()];
                    c.recv(&mut v, n, dt, peer)?;
                    if let Err(e) = m.write(0, &v) {
                        return Err(c.device_failure(K, format!("writing the recv buffer: {e}")));
                    }
                    Ok(())
                }
                None => c.recv(b.as_mut(), n, dt, peer),
            }
            .map(|()| Done::One(b))
        }))
    }

    /// Which path this communicator's all-reduces on CUDA memory took so far:
    /// `(gpu_p2p_calls, staged_calls, why_the_last_staged_call_was_staged or None)`
    /// (`collectives::device::DevicePathStats`). Read in issue order, after every operation
    /// issued before it (waits for them, GIL released).
    fn device_path_stats(&self, py: Python<'_>) -> PyResult<(u64, u64, Option<String>)> {
        let inner = &self.inner;
        let w = py.allow_threads(move || {
            inner.run_or_submit(CollKind::Barrier, None, |c| {
                Ok(c.device_path_stats().clone())
            })
        });
        let st = py
            .allow_threads(|| w.wait())
            .map_err(|e| coll_err(self.inner.rank(), &e, e.peer()))?;
        Ok((st.gpu_p2p, st.staged, st.last_fallback))
    }

    /// Barrier.
    #[pyo3(signature = (timeout=None, inline=false))]
    fn barrier(&self, py: Python<'_>, timeout: Option<f64>, inline: bool) -> PyResult<PyWork> {
        let t = timeout_of(timeout)?;
        Ok(self.issue(py, inline, CollKind::Barrier, t, |c| {
            c.barrier().map(|()| Done::None)
        }))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCommunicator>()?;
    m.add_class::<PyWork>()?;
    m.add_class::<PyCudaBuffer>()?;
    m.add(
        "CollectiveError",
        m.py().get_type_bound::<CollectiveError>(),
    )?;
    Ok(())
}
