"""Import of DLPack exporters (``__dlpack__`` / ``__dlpack_device__``, the Python array API's
interchange; layout from dlpack.h v1.0, include/dlpack/dlpack.h in dmlc/dlpack) as a byte
``memoryview`` of their memory, without numpy (whose ``from_dlpack`` returns read-only arrays).

* The versioned form (``__dlpack__(max_version=(1, 0))``, capsule ``"dltensor_versioned"``,
  ``DLManagedTensorVersioned``) is asked for first: its ``flags`` say whether the memory is
  read-only (``DLPACK_FLAG_BITMASK_READ_ONLY``). Exporters without it (torch 2.7) give the legacy
  ``"dltensor"`` capsule (``DLManagedTensor``), which says nothing about writability: such memory
  is taken as read-only (an input), as numpy does.
* The capsule is renamed ``used_dltensor[_versioned]`` once consumed (the protocol's rule), and
  the producer's ``deleter`` runs when the returned view's memory is no longer referenced.
* :func:`view`: CPU memory (``kDLCPU``) as bytes; :func:`describe`: the export itself (address,
  length, element type, device), which the package's CUDA path uses for ``kDLCUDA`` memory.
  One lane, C-contiguous (strides NULL or row-major) only.
"""

import ctypes

KDL_CPU = 1
# The most dimensions taken (numpy's NPY_MAXDIMS and torch's limit, 64) and the largest length
# in bytes (isize::MAX).
MAX_NDIM = 64
MAX_BYTES = (1 << 63) - 1
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
# (DLDataTypeCode, bits) -> the element type's name: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
_DTYPES = {(0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (1, 32): "uint32",
           (0, 64): "int64", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
           (2, 64): "float64", (4, 16): "bfloat16"}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


# The deleters' function pointer types (a producer's callback must be of this very type).
_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    pass


_DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedVersioned))
_ManagedVersioned._fields_ = [
    ("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER_VERSIONED),
    ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The names must outlive the capsules that point at them.
_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"


class _Owner:
    """Runs the producer's deleter once, when the last view of the memory goes."""

    def __init__(self, managed):
        self._managed = managed

    def __del__(self):
        m, self._managed = self._managed, None
        if m is not None and m.contents.deleter:
            m.contents.deleter(m)


class Export:
    """What a consumed DLPack capsule describes: ``ptr`` (address of the first element,
    ``byte_offset`` included), ``nbytes``, ``name`` (element type, None when it has no rocecoll
    name), ``itemsize``, ``read_only``, ``device_type`` / ``device_id``, and ``owner``, which runs
    the producer's deleter when it is no longer referenced (keep it as long as the memory is
    used)."""

    def __init__(self, ptr, nbytes, name, itemsize, read_only, device_type, device_id, owner):
        self.ptr, self.nbytes, self.name, self.itemsize = ptr, nbytes, name, itemsize
        self.read_only, self.device_type, self.device_id = read_only, device_type, device_id
        self.owner = owner


def describe(x, stream=None, device_type=KDL_CPU):
    """Consumes ``x.__dlpack__`` (asking for DLPack 1.0 first; ``stream`` passed on when given, as
    the Python array API's ``__dlpack__(stream=...)``: for CUDA, the stream the consumer will use
    the data on, 1 being the legacy default stream) and returns its :class:`Export`.

    Raises ``ValueError`` for a capsule of an unknown kind, a device type other than
    ``device_type``, a versioned capsule of a major version other than 1, several lanes or a
    width that is not whole bytes, an ndim outside 0..64 or a NULL shape, a negative shape, a
    layout that is not C-contiguous, or a range :func:`check_range` refuses (NULL data, more
    than ``2**63 - 1`` bytes, past ``2**64``). Fields it cannot check (a shape array shorter
    than ndim, an address not mapped) are the producer's contract, as for every DLPack consumer.
    An element type without a rocecoll name gives ``name`` None (the caller may name it with
    ``dtype=``).
    """
    kwargs = {} if stream is None else {"stream": stream}
    try:
        cap = x.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer older than DLPack 1.0's keyword arguments
        cap = x.__dlpack__(**kwargs)
    if _is_valid(cap, b"dltensor_versioned"):
        ptr = _get_pointer(cap, b"dltensor_versioned")
        managed = ctypes.cast(ptr, ctypes.POINTER(_ManagedVersioned))
        _set_name(cap, _USED_VERSIONED)
        read_only = bool(managed.contents.flags & _READ_ONLY)
        versioned = True
    elif _is_valid(cap, b"dltensor"):
        ptr = _get_pointer(cap, b"dltensor")
        managed = ctypes.cast(ptr, ctypes.POINTER(_Managed))
        _set_name(cap, _USED)
        read_only = True  # DLPack < 1.0 says nothing about it
        versioned = False
    else:
        raise ValueError(f"{type(x).__name__}.__dlpack__ returned no DLPack capsule")
    owner = _Owner(managed)
    # A versioned export of another major version may lay its tensor out otherwise: refused
    # before its fields are read (dlpack.h: "the consumer must call the deleter and raise if
    # the major version is not supported"); the owner runs the deleter.
    if versioned and managed.contents.version.major != 1:
        raise ValueError(f"DLPack major version {managed.contents.version.major}: 1 supported")
    t = managed.contents.dl_tensor
    if t.device.device_type != device_type:
        raise ValueError(f"DLPack device type {t.device.device_type}: expected {device_type}")
    name = _DTYPES.get((t.dtype.code, t.dtype.bits))
    if t.dtype.lanes != 1 or t.dtype.bits % 8 != 0 or t.dtype.bits == 0:
        raise ValueError(f"DLPack data type (code {t.dtype.code}, {t.dtype.bits} bits, "
                         f"{t.dtype.lanes} lanes) is not supported")
    # The shape array is read ndim entries long: an ndim past any real tensor's (numpy's and
    # torch's limit is 64 dimensions) is refused before it is read past its end.
    if not 0 <= t.ndim <= MAX_NDIM:
        raise ValueError(f"DLPack ndim {t.ndim}: 0 to {MAX_NDIM} supported")
    if t.ndim and not t.shape:
        raise ValueError(f"DLPack tensor of ndim {t.ndim} with a NULL shape")
    shape = [t.shape[i] for i in range(t.ndim)]
    if any(s < 0 for s in shape):
        raise ValueError(f"DLPack shape {shape}")
    numel = 1
    for s in shape:
        numel *= s
    if t.strides and numel > 1:
        expect = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                raise ValueError(f"DLPack tensor of shape {shape} is not C-contiguous")
            expect *= shape[i]
    itemsize = t.dtype.bits // 8
    ptr, nbytes = check_range((t.data or 0) + t.byte_offset, numel * itemsize, "DLPack tensor")
    return Export(ptr, nbytes, name, itemsize, read_only, t.device.device_type,
                  t.device.device_id, owner)


def check_range(ptr, nbytes, what):
    """``(ptr, nbytes)`` when they name a range a process can have: ``nbytes`` at most
    ``2**63 - 1`` (``isize::MAX``, the largest object Rust and C's ``ptrdiff_t`` allow), a NULL
    ``ptr`` only for 0 bytes, and ``ptr + nbytes`` within the 64-bit address space. Raises
    ``ValueError`` otherwise (a malformed export: its memory is never read)."""
    if nbytes > MAX_BYTES:
        raise ValueError(f"{what} of {nbytes} bytes: more than {MAX_BYTES} bytes")
    if ptr == 0 and nbytes > 0:
        raise ValueError(f"{what}: a NULL address for {nbytes} bytes")
    if not 0 <= ptr or ptr + nbytes > 1 << 64:
        raise ValueError(f"{what}: {nbytes} bytes at {ptr:#x} reach beyond the address space")
    return ptr, nbytes


def view(x):
    """``(memoryview of bytes, element type name, read_only)`` of DLPack exporter ``x``'s CPU
    memory (:func:`describe`, then a view of its bytes).

    Raises ``ValueError`` as :func:`describe` does (a non-CPU device is reported by the caller
    first, from ``__dlpack_device__``), and for an element type outside ``_DTYPES``.
    """
    d = describe(x)
    if d.name is None:
        raise ValueError(f"DLPack element type of {d.itemsize} bytes is not supported")
    buf = (ctypes.c_char * d.nbytes).from_address(d.ptr) if d.nbytes else (ctypes.c_char * 0)()
    buf.owner = d.owner  # the producer's memory lives as long as any view of it
    return memoryview(buf).cast("B"), d.name, d.read_only
