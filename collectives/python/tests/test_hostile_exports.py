"""Hostile ``__cuda_array_interface__`` dicts and DLPack capsules: each is refused with a clear
``ValueError`` (or ``TypeError`` for a value of the wrong kind) before anything reads the memory
or asks a CUDA driver; none crashes the interpreter. Nothing here needs a GPU: every export is
refused before the driver would be loaded, and no address given here is ever dereferenced.

Nothing here measures time."""

import ctypes

import pytest

from test_cuda_no_gpu import FAKE_PTR, CudaArray, CudaDLPack, _DataType, _Device, _DELETER, \
    _Managed, _capsule_new


def _cai(**over):
    x = CudaArray(4)
    x.__cuda_array_interface__.update(over)
    return x


@pytest.mark.parametrize("over,match", [
    ({"version": 99}, "version 99"),
    ({"version": "3"}, "version"),
    ({"shape": "12"}, "shape"),
    ({"shape": (2.5,)}, "shape"),
    ({"shape": (-1,)}, "shape"),
    ({"shape": (2**62, 2**62)}, "bytes"),
    ({"shape": (2**61,)}, "bytes"),
    ({"data": ("0x1000", False)}, "data"),
    ({"data": (1.5, False)}, "data"),
    ({"data": (-4096, False)}, "data"),
    ({"data": (2**64, False)}, "data"),
    ({"data": (2**64 - 8, False)}, "beyond"),
    ({"data": (FAKE_PTR,)}, "malformed"),
    ({"data": None}, "malformed"),
    ({"data": (0, False)}, "NULL"),
    ({"shape": (2, 2), "strides": (4,)}, "strides"),
    ({"shape": (2, 2), "strides": (8, 4, 4)}, "strides"),
    ({"shape": (2, 2), "strides": (0, 4)}, "not C-contiguous"),
    ({"shape": (2, 2), "strides": ("8", 4)}, "not C-contiguous"),
    ({"shape": (2,), "strides": 4}, "strides"),
    ({"typestr": "<f"}, "typestr"),
    ({"typestr": 4}, "typestr"),
    ({"typestr": "<f0"}, "give dtype="),
    ({"stream": "legacy"}, "stream"),
    ({"stream": -1}, "stream"),
    ({"stream": 2**64}, "stream"),
])
def test_hostile_cuda_array_interface(over, match):
    import rocecoll

    with pytest.raises(ValueError, match=match):
        rocecoll.device_buffer(_cai(**over))


def test_cuda_array_interface_that_is_not_a_dict():
    import rocecoll

    class Odd:
        __cuda_array_interface__ = [("shape", (4,))]

    with pytest.raises(ValueError, match="not a dict"):
        rocecoll.device_buffer(Odd())


def test_good_cuda_array_interface_still_passes():
    import rocecoll

    # versions 0..3 as numba/cupy/torch export them; a 2-d C-contiguous layout with strides
    for version in (0, 1, 2, 3):
        b, dt = rocecoll.device_buffer(_cai(version=version, shape=(2, 3), strides=(12, 4)))
        assert (b.nbytes, dt) == (24, "float32")
    b, _ = rocecoll.device_buffer(_cai(shape=(0,), data=(0, False)))  # empty: NULL allowed
    assert b.nbytes == 0


class HostileDLPack(CudaDLPack):
    """A kDLCUDA exporter whose capsule carries the given fields (ndim, shape, strides, data,
    byte_offset, bits) however inconsistent; ``shape`` / ``strides`` None give NULL pointers."""

    def __init__(self, ndim=1, shape=(4,), strides=None, data=FAKE_PTR, byte_offset=0,
                 bits=32, name=b"dltensor", device_type=2):
        super().__init__(4)
        self.f = dict(ndim=ndim, shape=shape, strides=strides, data=data,
                      byte_offset=byte_offset, bits=bits, name=name, device_type=device_type)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None, **_):
        f = self.f
        m = _Managed()
        m.dl_tensor.data = f["data"]
        m.dl_tensor.device = _Device(f["device_type"], 0)
        m.dl_tensor.ndim = f["ndim"]
        m.dl_tensor.dtype = _DataType(2, f["bits"], 1)
        keep = [m]
        for field in ("shape", "strides"):
            if f[field] is not None:
                arr = (ctypes.c_int64 * len(f[field]))(*f[field])
                setattr(m.dl_tensor, field, ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64)))
                keep.append(arr)
        m.dl_tensor.byte_offset = f["byte_offset"]

        def deleter(_p):
            self.deleted += 1

        cb = _DELETER(deleter)
        m.deleter = cb
        keep.append(cb)
        self._keep.append(keep)
        return _capsule_new(ctypes.addressof(m), f["name"], None)


@pytest.mark.parametrize("kwargs,match", [
    # an ndim far beyond its shape array: refused before the shape is read past its end
    ({"ndim": 1 << 30}, "ndim"),
    ({"ndim": -1}, "ndim"),
    ({"ndim": 1, "shape": None}, "NULL shape"),
    ({"ndim": 2, "shape": (2, 2), "strides": (1, 0)}, "not C-contiguous"),
    ({"ndim": 2, "shape": (2, 2), "strides": (-2, 1)}, "not C-contiguous"),
    ({"shape": (-3,)}, "shape"),
    ({"ndim": 2, "shape": (2**62, 2**62)}, "bytes"),
    ({"shape": (2**61,)}, "bytes"),
    ({"data": None}, "NULL"),
    ({"byte_offset": 2**64 - 8}, "beyond"),
    ({"data": 2**64 - 16, "byte_offset": 8}, "beyond"),
    ({"bits": 12}, "not supported"),
    ({"bits": 0}, "not supported"),
    ({"name": b"something_else"}, "no DLPack capsule"),
    ({"name": b"used_dltensor"}, "no DLPack capsule"),
    ({"device_type": 1}, "device type"),
])
def test_hostile_dlpack_capsules(kwargs, match):
    import rocecoll

    x = HostileDLPack(**kwargs)
    with pytest.raises(ValueError, match=match):
        rocecoll.device_buffer(x, writable=False)


def test_dlpack_exporter_that_raises_or_returns_no_capsule():
    import rocecoll

    class Raises(CudaDLPack):
        def __dlpack__(self, **_):
            raise RuntimeError("exporter broke")

    class NotACapsule(CudaDLPack):
        def __dlpack__(self, **_):
            return b"dltensor"

    with pytest.raises(RuntimeError, match="exporter broke"):
        rocecoll.device_buffer(Raises(4), writable=False)
    with pytest.raises(ValueError, match="no DLPack capsule"):
        rocecoll.device_buffer(NotACapsule(4), writable=False)


def test_cuda_buffer_refuses_a_range_past_the_address_space():
    import rocecoll

    with pytest.raises(ValueError, match="beyond"):
        rocecoll.CudaBuffer(2**64 - 4, 8)
    with pytest.raises(ValueError, match="bytes"):
        rocecoll.CudaBuffer(4096, 2**63)
    assert rocecoll.CudaBuffer(2**64 - 8, 8).nbytes == 8


def test_hostile_cpu_dlpack_is_refused_before_a_view_is_made():
    import rocecoll

    class Cpu(HostileDLPack):
        def __dlpack_device__(self):
            return (1, 0)

    # NULL data, or a range past 2**64: a host view of it would fault when read
    for kwargs, match in [({"data": None}, "NULL"), ({"byte_offset": 2**64 - 8}, "beyond"),
                          ({"ndim": 1 << 30}, "ndim")]:
        with pytest.raises(ValueError, match=match):
            rocecoll.as_bytes(Cpu(device_type=1, **kwargs), writable=False)


from rocecoll._dlpack import _DELETER_VERSIONED as _DELETER_V  # noqa: E402
from rocecoll._dlpack import _ManagedVersioned as _ManagedV, _Version  # noqa: E402


class VersionedDLPack(CudaDLPack):
    """A DLPack >= 1.0 kDLCUDA exporter (``dltensor_versioned``) of the given major version."""

    def __init__(self, major):
        super().__init__(4)
        self.major = major

    def __dlpack__(self, stream=None, max_version=None, **_):
        m = _ManagedV()
        m.version = _Version(self.major, 0)
        shape = (ctypes.c_int64 * 1)(4)
        m.dl_tensor.data = FAKE_PTR
        m.dl_tensor.device = _Device(2, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = _DataType(2, 32, 1)
        m.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))

        def deleter(_p):
            self.deleted += 1

        cb = _DELETER_V(deleter)
        m.deleter = cb
        self._keep.append((m, shape, cb))
        return _capsule_new(ctypes.addressof(m), b"dltensor_versioned", None)


def test_versioned_dlpack_of_another_major_version_is_refused_and_deleted():
    import gc

    import rocecoll

    x = VersionedDLPack(2)
    with pytest.raises(ValueError, match="major version 2"):
        rocecoll.device_buffer(x)
    gc.collect()
    assert x.deleted == 1, "the consumer runs the deleter of a capsule it refuses"
    b, dt = rocecoll.device_buffer(VersionedDLPack(1))  # 1.x: taken, writable (flags 0)
    assert (b.nbytes, dt, b.ptr) == (16, "float32", FAKE_PTR)


def test_a_tensor_posing_as_cuda_with_a_bogus_range_is_refused(monkeypatch):
    torch = pytest.importorskip("torch")
    import rocecoll
    from test_cuda_no_gpu import FakeCudaTensor

    # torch's stream probe answers (it fails without a GPU): the range check is what refuses
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: type("S", (), {"cuda_stream": 0})())

    class Bogus(FakeCudaTensor):
        __module__ = "torch"

        def __init__(self, ptr, n):
            super().__init__(n, torch.float32)
            self._ptr = ptr

        def data_ptr(self):
            return self._ptr

    for ptr, n, match in [(-4096, 4, "beyond"), (2**64 - 8, 4, "beyond"), (0, 4, "NULL"),
                          (FAKE_PTR, 2**62, "bytes")]:
        with pytest.raises(ValueError, match=match):
            rocecoll.device_buffer(Bogus(ptr, n))
    b, _ = rocecoll.device_buffer(Bogus(FAKE_PTR, 4))
    assert b.nbytes == 16
