"""rocecoll: the ``collectives`` crate (shared memory and software RoCE) for Python and PyTorch.

* :func:`from_env` / :func:`from_store` make a :class:`Comm` (every rank of a job calls the same
  one): from a launcher's environment (torchrun, Open MPI, Slurm) or through a key-value store
  (a ``torch.distributed.Store`` or any object with ``set``, ``get``, ``check`` and ``add``).
* Collectives on any contiguous CPU buffer: numpy arrays, torch tensors, DLPack exporters
  (``__dlpack__``), or objects exporting a C-contiguous buffer (PEP 3118, with ``dtype=`` given);
  and on CUDA device memory: CUDA torch tensors, ``__cuda_array_interface__`` exporters, DLPack
  ``kDLCUDA`` exporters, which go through the ``collectives`` crate's device path (``gpu-p2p``:
  the all-reduce GPU peer-to-peer over CUDA IPC when every rank is a process of this host with
  CUDA buffers, else staged through host memory; see "CUDA memory" below). ``async_op=True`` returns a
  :class:`Work` (``wait``, ``is_completed``); operations run in issue order on the
  communicator's progress thread with the GIL released. A blocking call (``async_op=False``)
  with no operation pending runs on the calling thread instead (GIL released), which spares the
  two thread hand-offs (to the progress thread and back); ``Comm.inline_ops`` counts them.
* Data types ``int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64`` and ops
  ``sum prod min max avg``, as in Rust (``collectives::DataType``, ``RedOp``).
* Errors raise :class:`CollectiveError` (a ``RuntimeError``): ``rank R: ...`` names the rank
  that raised it, and its ``peer`` attribute the peer at fault when known.
* CUDA memory: the driver (``libcuda.so.1``) is opened when an operation first meets device
  memory; without one the operation raises :class:`CollectiveError` naming the operation and the
  driver probe's error (``no CUDA driver: cannot load libcuda.so.1 ...``). Stream order, as
  torch-ucc does it (an event recorded on the tensor's stream at issue, waited for before the data
  is read): the producer's writes queued on the stream named at issue (a torch tensor: the
  current stream of its device; ``__cuda_array_interface__``: its ``stream``; DLPack: the legacy
  default stream, which ``__dlpack__(stream=1)`` asks the producer to order its work before) are
  complete before the operation reads; the operation's device writes are complete when its
  ``Work`` ends (host-synchronous copies and kernels), so after ``wait()`` any stream sees them.
  :meth:`Comm.device_path_stats` says which path the all-reduces took.
* ``rocecoll.torch_backend`` registers the ``torch.distributed`` backend ``"rocecoll"`` and
  provides a DDP communication hook.
"""

from ._native import CollectiveError
from ._native import Communicator as _Native
from ._native import CudaBuffer
from ._native import Work as _NativeWork

__all__ = ["CollectiveError", "Comm", "CudaBuffer", "Work", "from_env", "from_store", "as_bytes",
           "device_buffer"]

_TORCH_DTYPES = {
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.int32": "int32",
    "torch.int64": "int64",
}
_ITEMSIZE = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}
_NUMPY_DTYPES = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
}


# DLPack device types (dlpack.h, DLDeviceType): kDLCPU = 1, kDLCUDA = 2; the rest name memory
# this package cannot reach.
_DL_CPU = 1
_DL_CUDA = 2
_DL_DEVICES = {2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
               10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}
# CUDA Array Interface / numpy array-interface type strings of the element types.
_TYPESTR = {"|i1": "int8", "<i1": "int8", "|u1": "uint8", "<u1": "uint8", "<i4": "int32",
            "<u4": "uint32", "<i8": "int64", "<u8": "uint64", "<f2": "float16", "<f4": "float32",
            "<f8": "float64"}
# DLPack's stream argument for CUDA (Python array API, ``__dlpack__``): 1 is the legacy default
# stream; the producer orders its pending work before it.
_LEGACY_STREAM = 1


def _unreachable(where):
    return CollectiveError(
        f"buffer on {where}: rocecoll reaches host memory and CUDA device memory only"
    )


def _from_dlpack(x, writable, dtype=None):
    """A byte view of a ``__dlpack__`` exporter's CPU memory, or a :class:`CudaBuffer` of its
    CUDA memory (``kDLCUDA``; see ``rocecoll._dlpack``)."""
    dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (_DL_CPU, 0)
    kind = int(dev[0])
    from . import _dlpack

    if kind == _DL_CUDA:
        d = _dlpack.describe(x, stream=_LEGACY_STREAM, device_type=_DL_CUDA)
        if writable and d.read_only:
            raise ValueError(f"{type(x).__name__}: its DLPack export is read-only (DLPack < "
                             "1.0 exports say nothing of it: inputs only)")
        name = _override(d.name, dtype, d.itemsize)
        return CudaBuffer(d.ptr, d.nbytes, d.device_id, _LEGACY_STREAM, d.read_only,
                          f"{type(x).__name__} (DLPack kDLCUDA) on cuda:{d.device_id}",
                          d.owner), name
    if kind != _DL_CPU:
        name = _DL_DEVICES.get(kind, f"DLPack device type {kind}")
        raise _unreachable(f"{name}:{int(dev[1])}")

    mv, name, read_only = _dlpack.view(x)
    if writable and read_only:
        raise ValueError(f"{type(x).__name__}: its DLPack export is read-only (DLPack < 1.0 "
                         "exports, torch 2.7's, say nothing of it: inputs only)")
    if dtype is not None and dtype != name:
        raise ValueError(f"dtype={dtype}: the DLPack export holds {name}")
    return mv, name


def _override(name, dtype, itemsize):
    """The element type: the export's own, or ``dtype`` when given and of the same size (as
    bfloat16 values held in a 2-byte integer export)."""
    if dtype is None or dtype == name:
        if name is None:
            raise ValueError("the export's element type has no rocecoll name: give dtype=")
        return name
    if _ITEMSIZE.get(dtype) != itemsize:
        raise ValueError(f"dtype={dtype} does not fit {itemsize}-byte elements")
    return dtype


def _from_cai(x, writable, dtype=None):
    """A :class:`CudaBuffer` of a ``__cuda_array_interface__`` exporter's memory (CUDA Array
    Interface v3, numba's specification): ``data`` (address, read-only flag), ``shape``,
    ``typestr``, ``strides`` (None or C-contiguous), no ``mask``; ``stream`` (v3) is the stream
    the producer wrote on (absent or None: no ordering needed; 0 is disallowed by the
    specification). Raises ``ValueError`` for a malformed export: not a dict, a ``version``
    other than 0..3, a shape, address or stream that is not an int (floats and strings are not
    truncated), strides not one per dimension or not C-contiguous, NULL data for a non-empty
    array, more than ``2**63 - 1`` bytes or a range past the 64-bit address space
    (``rocecoll._dlpack.check_range``)."""
    import operator

    from . import _dlpack

    cai = x.__cuda_array_interface__
    what = f"{type(x).__name__}.__cuda_array_interface__"
    if not isinstance(cai, dict):
        raise ValueError(f"{what}: not a dict ({type(cai).__name__})")
    version = cai.get("version", 0)
    if type(version) is not int or not 0 <= version <= 3:
        raise ValueError(f"{what}: version {version!r} (0 to 3 supported)")
    try:
        ptr, read_only = cai["data"]
        shape = cai["shape"]
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{what}: malformed ({e!r})") from None
    if not isinstance(typestr, str) or len(typestr) < 3 or not typestr[2:].isdecimal():
        raise ValueError(f"{what}: typestr {typestr!r}")
    # Integers only (operator.index): a float or a string is a malformed export, not a value
    # to truncate or to split into digits.
    try:
        if not isinstance(shape, (tuple, list)):
            raise TypeError(type(shape).__name__)
        shape = tuple(operator.index(n) for n in shape)
    except TypeError as e:
        raise ValueError(f"{what}: shape {cai['shape']!r} is not a tuple of ints ({e})") from None
    try:
        ptr = operator.index(ptr) if ptr is not None else 0
    except TypeError:
        raise ValueError(f"{what}: data address {ptr!r} is not an int") from None
    if cai.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays are not supported")
    itemsize = int(typestr[2:])
    if typestr[0] == ">" and itemsize > 1:
        raise ValueError(f"{what}: big-endian typestr {typestr!r}")
    name = _override(_TYPESTR.get(typestr), dtype, itemsize)
    if any(n < 0 for n in shape) or len(shape) > _dlpack.MAX_NDIM:
        raise ValueError(f"{what}: shape {shape}")
    numel = 1
    for n in shape:
        numel *= n
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, (tuple, list)) or len(strides) != len(shape):
            raise ValueError(f"{what}: strides {strides!r} for shape {shape}: one stride per "
                             "dimension")
        if numel > 1:
            expect = itemsize
            for n, st in zip(reversed(shape), reversed(tuple(strides))):
                if n != 1 and st != expect:
                    raise ValueError(f"{what}: shape {shape} with strides {tuple(strides)} is "
                                     "not C-contiguous")
                expect *= n
    if ptr < 0 or ptr >= 1 << 64:
        raise ValueError(f"{what}: data address {ptr:#x} is outside the 64-bit address space")
    ptr, nbytes = _dlpack.check_range(ptr, numel * itemsize, what)
    stream = cai.get("stream")
    if stream is not None:
        try:
            stream = operator.index(stream)
        except TypeError:
            raise ValueError(f"{what}: stream {stream!r} is not an int") from None
        if stream == 0:
            raise ValueError(f"{what}: stream 0 is disallowed by the CUDA Array Interface (v3): "
                             "1 is the legacy default stream, 2 the per-thread one")
        if not 0 < stream < 1 << 64:
            raise ValueError(f"{what}: stream {stream:#x} is not a CUDA stream handle")
    if writable and read_only:
        raise ValueError(f"{what}: read-only memory")
    return CudaBuffer(ptr, nbytes, None, stream, bool(read_only),
                      f"{type(x).__name__} (__cuda_array_interface__)", x), name


def _torch_dtype(x, dtype):
    """The element type's name of torch tensor ``x``; ``ValueError`` for a dtype the collectives
    do not take, one other than ``dtype`` (when given), or a tensor that is not contiguous."""
    name = _TORCH_DTYPES.get(str(x.dtype))
    if name is None:
        raise ValueError(f"unsupported tensor dtype {x.dtype}")
    if dtype is not None and dtype != name:
        raise ValueError(f"dtype={dtype}: the tensor holds {name}")
    if not x.is_contiguous():
        raise ValueError("tensor is not contiguous")
    return name


def _from_torch_cuda(x, dtype=None):
    """A :class:`CudaBuffer` of a contiguous CUDA tensor, ordered after its device's current
    stream (as ProcessGroupNCCL and torch-ucc order a collective after it)."""
    name = _torch_dtype(x, dtype)
    import torch

    try:
        stream = torch.cuda.current_stream(x.device).cuda_stream
    except Exception as e:  # torch's own CUDA probe (no driver, no GPU): named, not masked
        raise CollectiveError(f"torch.Tensor on {x.device}: torch.cuda.current_stream "
                              f"failed: {e}") from e
    from . import _dlpack

    what = f"torch.Tensor on {x.device}"
    ptr, nbytes = _dlpack.check_range(x.data_ptr(), x.numel() * x.element_size(), what)
    return CudaBuffer(ptr, nbytes, x.device.index, stream, False, what, x), name


def device_buffer(x, dtype=None, writable=True):
    """``(CudaBuffer, dtype name)`` for CUDA memory ``x`` (a CUDA torch tensor, a
    ``__cuda_array_interface__`` exporter, a DLPack ``kDLCUDA`` exporter), else ``None``.
    Raises ``ValueError`` for a layout or type it cannot take. Nothing here calls the CUDA
    driver: the operation that uses the buffer does, and raises :class:`CollectiveError` if
    there is none."""
    mod = type(x).__module__
    if mod.startswith("torch"):  # other torch devices (meta, ...) are as_bytes's to refuse
        return _from_torch_cuda(x, dtype) if getattr(x, "is_cuda", False) is True else None
    if mod.startswith("numpy"):
        return None
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(x, writable, dtype)
    if hasattr(x, "__dlpack_device__") and int(x.__dlpack_device__()[0]) == _DL_CUDA:
        return _from_dlpack(x, writable, dtype)
    return None


def as_bytes(x, dtype=None, writable=True):
    """Returns ``(memoryview of bytes, dtype name)`` sharing ``x``'s memory.

    ``x``: a CPU torch tensor (contiguous), a numpy array (C-contiguous), an object exporting
    DLPack (``__dlpack__`` / ``__dlpack_device__``, as the Python array API standard defines it:
    jax, cupy, tensorflow, ...; CPU memory; read-only unless its DLPack >= 1.0 export says
    otherwise, see ``rocecoll._dlpack``), or any object
    exporting a C-contiguous buffer (PEP 3118; then ``dtype`` names its element type). Raises
    ``ValueError`` for non-contiguous, read-only (when ``writable``) or unsupported types, and
    :class:`CollectiveError` for device memory (a CUDA tensor, a DLPack device other than
    kDLCPU, an object with ``__cuda_array_interface__``), which has no host view: collectives
    take it as it is (see :func:`device_buffer`).
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type == "cuda":
            raise _unreachable(f"{x.device} (no host view: pass it to the collective itself)")
        if x.device.type != "cpu":
            raise _unreachable(str(x.device))
        name = _TORCH_DTYPES.get(str(x.dtype))
        if name is None:
            raise ValueError(f"unsupported tensor dtype {x.dtype}")
        if not x.is_contiguous():
            raise ValueError("tensor is not contiguous")
        import torch

        arr = x.detach().reshape(-1).view(torch.uint8).numpy()
        return memoryview(arr), name
    if not mod.startswith("numpy"):
        if hasattr(x, "__cuda_array_interface__"):
            raise _unreachable(f"cuda (a {type(x).__name__} with __cuda_array_interface__; no "
                               "host view: pass it to the collective itself)")
        if hasattr(x, "__dlpack__"):
            dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (_DL_CPU, 0)
            if int(dev[0]) != _DL_CPU:
                name = _DL_DEVICES.get(int(dev[0]), f"DLPack device type {int(dev[0])}")
                view = " (no host view)" if int(dev[0]) == _DL_CUDA else ""
                raise _unreachable(f"{name}:{int(dev[1])}{view}")
            return _from_dlpack(x, writable, dtype)
    if type(x).__module__.startswith("numpy"):
        name = str(x.dtype)
        if dtype is not None and dtype != name:
            # e.g. bfloat16 values held as their bits in a uint16 array
            if _ITEMSIZE.get(dtype) != x.dtype.itemsize:
                raise ValueError(f"dtype={dtype} does not fit a numpy {name} array")
            name = dtype
        if name not in _NUMPY_DTYPES and name != "bfloat16":
            raise ValueError(f"unsupported numpy dtype {name}")
        if not x.flags.c_contiguous:
            raise ValueError("numpy array is not C-contiguous")
        if writable and not x.flags.writeable:
            raise ValueError("numpy array is read-only")
        return memoryview(x.reshape(-1)).cast("B"), name
    if dtype is None:
        raise ValueError(f"dtype= is needed for a {type(x).__name__}")
    mv = memoryview(x)
    if not mv.c_contiguous:
        raise ValueError("buffer is not C-contiguous")
    return mv.cast("B"), dtype


def _arg(x, dtype=None, writable=True):
    """``(object for the native layer, dtype name)``: a contiguous CPU torch tensor itself (the
    native layer reads its ``data_ptr()``; no per-call numpy view), else :func:`as_bytes`'s
    memoryview. The same checks and errors as :func:`as_bytes`."""
    if getattr(x, "is_cpu", False) is True and type(x).__module__.startswith("torch"):
        return x, _torch_dtype(x, dtype)
    dev = device_buffer(x, dtype, writable)
    if dev is not None:
        return dev
    return as_bytes(x, dtype, writable)


class Work:
    """The handle of one non-blocking operation; keeps its buffers alive until it ends."""

    def __init__(self, native, keep=()):
        self._native = native
        self._keep = keep

    def wait(self, timeout=None):
        """Waits (at most ``timeout`` seconds: then returns False if not ended); True when done.
        Raises :class:`CollectiveError` if the operation failed."""
        done = self._native.wait(timeout)
        if done:
            self._keep = ()
        return done

    def is_completed(self):
        """Whether the operation has ended (never blocks)."""
        return self._native.is_completed()


def _finish(native, keep, async_op):
    w = Work(native, keep)
    if async_op:
        return w
    w.wait()
    return None


class Comm:
    """A communicator (see the module docs). ``rank``, ``size``; every collective takes
    ``async_op`` (return a :class:`Work` instead of waiting) and ``timeout`` (seconds an operation
    may wait without progress)."""

    def __init__(self, native):
        self._c = native

    @property
    def rank(self):
        return self._c.rank

    @property
    def size(self):
        return self._c.size

    @property
    def inline_ops(self):
        """How many blocking calls ran on their caller's thread (nothing was pending)."""
        return self._c.inline_ops

    def device_path_stats(self):
        """``(gpu_p2p_calls, staged_calls, last_fallback_reason)`` of this communicator's
        all-reduces on CUDA memory (after every operation issued before this call)."""
        return self._c.device_path_stats()

    def abort(self):
        """Ends every pending operation with :class:`CollectiveError`, from any thread."""
        self._c.abort()

    def all_reduce(self, x, op="sum", dtype=None, async_op=False, timeout=None):
        b, dt = _arg(x, dtype)
        return _finish(self._c.all_reduce(b, dt, op, timeout, not async_op), (x, b), async_op)

    def broadcast(self, x, root, dtype=None, async_op=False, timeout=None):
        b, dt = _arg(x, dtype)
        return _finish(self._c.broadcast(b, dt, root, timeout, not async_op), (x, b), async_op)

    def reduce(self, x, root, op="sum", dtype=None, async_op=False, timeout=None):
        b, dt = _arg(x, dtype)
        return _finish(self._c.reduce(b, dt, root, op, timeout, not async_op), (x, b), async_op)

    def all_gather(self, out, x, dtype=None, async_op=False, timeout=None):
        """``out`` (size * n elements) gets every rank's ``x`` (n elements) in rank order."""
        s, dt = _arg(x, dtype, writable=False)
        r, _ = _arg(out, dtype)
        return _finish(self._c.all_gather(s, r, dt, timeout, not async_op), (x, out, s, r), async_op)

    def reduce_scatter(self, out, x, op="sum", dtype=None, async_op=False, timeout=None):
        """``out`` (n elements) gets this rank's block of the reduction of ``x`` (size * n)."""
        s, dt = _arg(x, dtype, writable=False)
        r, _ = _arg(out, dtype)
        return _finish(self._c.reduce_scatter(s, r, dt, op, timeout, not async_op), (x, out, s, r), async_op)

    def all_to_all(self, out, x, dtype=None, async_op=False, timeout=None):
        """Block j of ``x`` (size equal blocks) goes to rank j; block i of ``out`` from rank i."""
        s, dt = _arg(x, dtype, writable=False)
        r, _ = _arg(out, dtype)
        return _finish(self._c.all_to_all(s, r, dt, timeout, not async_op), (x, out, s, r), async_op)

    def send(self, x, peer, dtype=None, async_op=False, timeout=None):
        b, dt = _arg(x, dtype, writable=False)
        return _finish(self._c.send(b, dt, peer, timeout, not async_op), (x, b), async_op)

    def recv(self, x, peer, dtype=None, async_op=False, timeout=None):
        b, dt = _arg(x, dtype)
        return _finish(self._c.recv(b, dt, peer, timeout, not async_op), (x, b), async_op)

    def barrier(self, async_op=False, timeout=None):
        return _finish(self._c.barrier(timeout, not async_op), (), async_op)


def from_env(transport=None, timeout=None, bootstrap_timeout=None):
    """A :class:`Comm` from the launcher's environment (torchrun's RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; Open MPI; Slurm). ``transport``: "auto", "shm", "roce"."""
    return Comm(_Native.from_env(transport, timeout, bootstrap_timeout))


def from_store(store, rank, size, transport=None, local_ip=None, timeout=None,
               bootstrap_timeout=None):
    """A :class:`Comm` whose ranks rendezvous through ``store`` (no port of its own).
    ``local_ip``: the address other ranks reach this one at (needed by the RoCE transport unless
    ``COLL_ROCE_ADDR`` is set; "127.0.0.1" on one host)."""
    return Comm(_Native.from_store(store, rank, size, transport, local_ip, timeout,
                                   bootstrap_timeout))
