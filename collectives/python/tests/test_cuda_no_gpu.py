"""CUDA memory without a GPU (issue 20): CUDA torch tensors, ``__cuda_array_interface__``
exporters and DLPack ``kDLCUDA`` capsules (built here with ctypes) are taken to the crate's device
path, and with no CUDA driver every operation raises a ``CollectiveError`` naming the operation and
the driver probe's error, never a crash; the communicator stays usable. Layout errors are
``ValueError``s found before the driver is asked. On a machine with a CUDA driver these tests
skip: ``tests/gpu/check.sh`` (step ``python-cuda``) runs the package on device memory there.

Nothing here measures time; every wait is bounded by the harness's job timeout."""

import ctypes
import ctypes.util
import gc

import numpy as np
import pytest

import ranks


def _driver_present():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(_driver_present(), reason="a CUDA driver is present: "
                                "tests/gpu/check.sh runs the device path on a GPU")

# A made-up device address: without a driver nothing dereferences it (the probe fails first).
FAKE_PTR = 0x7F00_0000_0000


class CudaArray:
    """What cupy / numba device arrays expose: the CUDA Array Interface v3."""

    def __init__(self, n, typestr="<f4", ptr=FAKE_PTR, read_only=False, strides=None,
                 stream=1, mask=None):
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": typestr, "data": (ptr, read_only), "version": 3,
            "strides": strides, "stream": stream, "mask": mask}


# ---- DLPack kDLCUDA capsules, built with ctypes (dlpack.h v0.8 DLManagedTensor) ----------------

# The producer side uses the package's own dlpack.h structures (rocecoll._dlpack).
from rocecoll._dlpack import _DELETER, _DataType, _Device, _Managed  # noqa: E402

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class CudaDLPack:
    """A DLPack exporter of (made-up) CUDA memory: ``n`` float32 on ``cuda:device``. Records the
    ``stream`` each ``__dlpack__`` call was given and whether the consumer ran the deleter."""

    def __init__(self, n, device=0, code=2, bits=32):
        self.n, self.device, self.code, self.bits = n, device, code, bits
        self.streams = []
        self.deleted = 0
        self._keep = []

    def __dlpack_device__(self):
        return (2, self.device)

    def __dlpack__(self, stream=None, max_version=None, **_):
        self.streams.append(stream)
        shape = (ctypes.c_int64 * 1)(self.n)
        m = _Managed()
        m.dl_tensor.data = FAKE_PTR
        m.dl_tensor.device = _Device(2, self.device)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = _DataType(self.code, self.bits, 1)
        m.dl_tensor.shape = shape

        def deleter(_p):
            self.deleted += 1

        cb = _DELETER(deleter)
        m.deleter = cb
        self._keep.append((shape, m, cb))
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)


class FakeCudaTensor:
    """An object that passes for a CUDA torch tensor (the package reads ``is_cuda``, ``dtype``,
    ``data_ptr()``, ``numel()``, ``element_size()``, ``device``)."""

    __module__ = "torch"
    is_cpu = False
    is_cuda = True

    def __init__(self, n, dtype):
        import torch

        self.dtype = dtype
        self.device = torch.device("cuda", 0)
        self._n = n

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return FAKE_PTR

    def numel(self):
        return self._n

    def element_size(self):
        return 4


# ---- without a communicator --------------------------------------------------------------------

def test_cuda_array_interface_is_taken_to_the_device_path():
    import rocecoll

    b, dt = rocecoll.device_buffer(CudaArray(8))
    assert isinstance(b, rocecoll.CudaBuffer) and dt == "float32"
    assert b.ptr == FAKE_PTR and b.nbytes == 32
    # bfloat16 values held as 2-byte integers, named with dtype=
    b, dt = rocecoll.device_buffer(CudaArray(8, "<u2"), dtype="bfloat16")
    assert dt == "bfloat16" and b.nbytes == 16
    # host memory is not device memory
    assert rocecoll.device_buffer(np.zeros(3, np.float32)) is None
    assert rocecoll.device_buffer(bytearray(4)) is None


@pytest.mark.parametrize("kwargs,match", [
    ({"strides": (8,)}, "not C-contiguous"),
    ({"stream": 0}, "stream 0 is disallowed"),
    ({"mask": object()}, "masked arrays"),
    ({"typestr": ">f4"}, "big-endian"),
    ({"typestr": "<c8"}, "give dtype="),
    ({"read_only": True}, "read-only"),
])
def test_cuda_array_interface_layout_errors(kwargs, match):
    import rocecoll

    with pytest.raises(ValueError, match=match):
        rocecoll.device_buffer(CudaArray(4, **kwargs))


def test_dlpack_cuda_capsule_is_taken_to_the_device_path():
    import rocecoll

    x = CudaDLPack(5)
    b, dt = rocecoll.device_buffer(x, writable=False)
    assert dt == "float32" and b.ptr == FAKE_PTR and b.nbytes == 20
    # the consumer asked for the legacy default stream (1), as the array API defines it
    assert x.streams == [1]
    # DLPack < 1.0 exports say nothing of writability: inputs only
    with pytest.raises(ValueError, match="read-only"):
        rocecoll.device_buffer(x)
    assert x.streams == [1, 1]
    del b
    gc.collect()
    assert x.deleted == 2  # every consumed capsule's deleter ran once its buffer was released


def test_host_views_of_device_memory_are_refused():
    import rocecoll

    with pytest.raises(rocecoll.CollectiveError, match="no host view"):
        rocecoll.as_bytes(CudaArray(3))
    with pytest.raises(rocecoll.CollectiveError, match="cuda:0 .no host view"):
        rocecoll.as_bytes(CudaDLPack(3))


def test_unreachable_devices_are_a_clear_error():
    import rocecoll

    class Rocm:
        def __dlpack__(self, **_):
            raise AssertionError("not to be consumed")

        def __dlpack_device__(self):
            return (10, 1)

    with pytest.raises(rocecoll.CollectiveError, match="rocm:1: rocecoll reaches host memory "
                                                       "and CUDA device memory only"):
        rocecoll._arg(Rocm())


def test_cuda_buffer_refuses_a_null_address():
    import rocecoll

    with pytest.raises(ValueError, match="NULL device address"):
        rocecoll.CudaBuffer(0, 16)


def test_fake_torch_cuda_tensor_names_torchs_probe():
    """torch's CUDA wheel without a GPU: a (fake) CUDA tensor's stream cannot be asked for; the
    error names torch's own probe."""
    torch = pytest.importorskip("torch")
    import rocecoll

    assert not torch.cuda.is_available()
    with pytest.raises(rocecoll.CollectiveError, match="current_stream failed"):
        rocecoll._arg(FakeCudaTensor(4, torch.float32))


# ---- on two ranks ------------------------------------------------------------------------------

def _expect(fn, *match):
    import rocecoll

    try:
        fn()
    except rocecoll.CollectiveError as e:
        text = str(e)
        missing = [m for m in match if m not in text]
        return "ok" if not missing else f"message {text!r} lacks {missing}"
    except Exception as e:  # the wrong kind of error
        return f"{type(e).__name__}: {e}"
    return "no error"


def no_driver_ops(rank, size, with_torch):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=30)
    probe = "no CUDA driver: cannot load libcuda.so.1"
    out = {}
    cai = CudaArray(2 * size)
    half = CudaArray(2)
    out["all_reduce"] = _expect(lambda: comm.all_reduce(cai), f"rank {rank}: ",
                                "all_reduce buffer", "__cuda_array_interface__", probe)
    out["all_reduce_async"] = _expect(lambda: comm.all_reduce(cai, async_op=True).wait(),
                                      "all_reduce buffer", probe)
    out["broadcast"] = _expect(lambda: comm.broadcast(cai, 0), "broadcast buffer", probe)
    out["reduce"] = _expect(lambda: comm.reduce(cai, 0), "reduce buffer", probe)
    out["all_gather"] = _expect(lambda: comm.all_gather(cai, half), "all_gather input", probe)
    out["reduce_scatter"] = _expect(lambda: comm.reduce_scatter(half, cai),
                                    "reduce_scatter input", probe)
    out["all_to_all"] = _expect(lambda: comm.all_to_all(CudaArray(2 * size), cai),
                                "all_to_all input", probe)
    out["send"] = _expect(lambda: comm.send(cai, 1 - rank), "send buffer", probe)
    out["recv"] = _expect(lambda: comm.recv(cai, 1 - rank), "recv buffer", probe)
    try:
        comm.all_gather(np.zeros(5 * size, np.float32), CudaDLPack(5))
        out["mixed"] = "no error"
    except ValueError as e:
        out["mixed"] = "ok" if "input in CUDA memory and output in host memory" in str(e) else str(e)
    x = CudaDLPack(5)
    out["dlpack_in"] = _expect(lambda: comm.all_gather(CudaArray(5 * size), x),
                               "all_gather input", "DLPack kDLCUDA", probe)
    if with_torch:
        import torch

        real = torch.cuda.current_stream
        torch.cuda.current_stream = lambda device=None: type("S", (), {"cuda_stream": 0})()
        try:
            t = FakeCudaTensor(4, torch.float32)
            out["torch"] = _expect(lambda: comm.all_reduce(t), "all_reduce buffer",
                                   "torch.Tensor on cuda:0", probe)
        finally:
            torch.cuda.current_stream = real
    # Nothing was issued: the communicator still works, on host memory.
    buf = np.full(4, rank + 1.0, np.float32)
    comm.all_reduce(buf)
    out["host_after"] = buf.tolist()
    gc.collect()
    out["dlpack_deleted"] = x.deleted
    return out


@pytest.mark.parametrize("with_torch", [False, True])
def test_without_a_driver_every_op_names_the_probe(with_torch):
    if with_torch:
        pytest.importorskip("torch")
    for out in ranks.values(ranks.run(no_driver_ops, 2, with_torch, timeout=120)):
        host = out.pop("host_after")
        deleted = out.pop("dlpack_deleted")
        assert host == [3.0] * 4
        assert deleted == 1
        assert all(v == "ok" for v in out.values()), out


def test_torch_backend_is_registered_for_cpu_and_cuda():
    """torch 2.7.1 without a GPU takes the two-device registration (init_process_group and the
    CPU collectives under it: test_torch.py)."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    import rocecoll.torch_backend  # noqa: F401  (registers)

    assert dist.Backend.backend_capability["rocecoll"] == ["cpu", "cuda"]


def test_gpu_check_script_on_host_memory():
    """The GPU check's script (tests/gpu/rocecoll_cuda.py, step python-cuda of
    tests/gpu/check.sh) with ``--host``: its references, argument orders and send/recv pairing
    checked on host memory, so that its first run on a GPU tests the package, not the script."""
    import os
    import subprocess
    import sys

    import rocecoll

    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "gpu",
                          "rocecoll_cuda.py")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(rocecoll.__file__)))
    r = subprocess.run([sys.executable, script, "--host", pkg, "2"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "python-cuda: all checks passed on 2 ranks (host memory)" in r.stdout
    assert r.stdout.count(": ok") == 18, r.stdout
