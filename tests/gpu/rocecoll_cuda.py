#!/usr/bin/env python3
"""The Python package (rocecoll) on real CUDA device memory, without torch or numpy (issue 20):
the GPU check's step ``python-cuda`` (tests/gpu/check.sh).

``python3 tests/gpu/rocecoll_cuda.py PKG_DIR [RANKS]`` starts RANKS (default 2) rank processes on
this host (the launcher environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun sets
it), each importing ``rocecoll`` from PKG_DIR (the package directory with its built
``_native.abi3.so``). Each rank allocates device buffers with ``ctypes`` + ``libcuda.so.1``
(``cuMemAlloc``) on GPU ``rank % device_count``, hands them to the package as objects exposing
``__cuda_array_interface__`` (v3), runs all_reduce (sum float32, max int32, avg float32),
all_gather, broadcast, reduce_scatter and send/recv, copies the results back (``cuMemcpyDtoH``)
and compares them bitwise with references computed in plain Python. One all-reduce's input is
written by an asynchronous ``cuMemsetD32Async`` on a non-blocking stream that is not synchronized
before the call: the package must order itself after that stream (the ``stream`` of the
interface), or the sum is wrong. The all-reduces must take the GPU peer-to-peer path (CUDA IPC
between the rank processes): ``Comm.device_path_stats()`` must report no staged call.

Prints one line per check and ``python-cuda: all checks passed`` at the end; exit 0 only then.
``--host`` runs the same script on host memory (bytearrays instead of device buffers; the package's
host path), which checks the script itself on a machine without a GPU.
Without a GPU every rank fails at once with the driver's error (exit 1). Every wait is bounded:
the communicators' timeout (30 s) and this script's bound on the rank processes (120 s).
"""

import array
import ctypes
import os
import socket
import struct
import subprocess
import sys

N_BIG = (1 << 20) + 3  # float32 elements of the large all-reduce (4 MiB + 12 bytes)
N_SMALL = 1000


class Cuda:
    """The few driver calls this script needs (CUDA Driver API), through ctypes."""

    def __init__(self, ordinal_of_rank):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.lib.cuInit(0))
        count = ctypes.c_int()
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(count)))
        if count.value < 1:
            raise RuntimeError("the CUDA driver reports no GPU")
        self.ordinal = ordinal_of_rank % count.value
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), self.ordinal))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain",
                   self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def check(self, call, rc):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{call} failed: {name.value.decode() if name.value else rc}")

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        self.check("cuMemAlloc", self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)))
        return p.value

    def upload(self, ptr, data):
        self.check("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(
            ctypes.c_uint64(ptr), ctypes.c_char_p(data), ctypes.c_size_t(len(data))))

    def download(self, ptr, nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        self.check("cuCtxSynchronize", self.lib.cuCtxSynchronize())
        self.check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(
            buf, ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes)))
        return buf.raw

    def stream(self):
        s = ctypes.c_void_p()
        self.check("cuStreamCreate", self.lib.cuStreamCreate(ctypes.byref(s), 1))  # NON_BLOCKING
        return s.value

    def memset32_async(self, ptr, word, n, stream):
        self.check("cuMemsetD32Async", self.lib.cuMemsetD32Async(
            ctypes.c_uint64(ptr), ctypes.c_uint(word), ctypes.c_size_t(n), ctypes.c_void_p(stream)))


class HostCuda:
    """``--host``: the same calls on host memory (bytearrays), to check this script (its
    references, argument orders and pairing) on a machine without a GPU; the package then runs
    its host path."""

    host = True
    ordinal = 0

    def __init__(self):
        self.mem = {}

    def alloc(self, nbytes):
        ptr = 0x1000 * (len(self.mem) + 1)
        self.mem[ptr] = bytearray(nbytes)
        return ptr

    def upload(self, ptr, data):
        self.mem[ptr][:len(data)] = data

    def download(self, ptr, nbytes):
        return bytes(self.mem[ptr][:nbytes])

    def stream(self):
        return 0

    def memset32_async(self, ptr, word, n, stream):
        self.upload(ptr, struct.pack("I", word) * n)


class Dev:
    """Device memory as the CUDA Array Interface (v3) describes it."""

    def __init__(self, cuda, typestr, n, stream=None):
        self.cuda, self.typestr, self.n = cuda, typestr, n
        self.itemsize = int(typestr[2:])
        self.dtype = _NAME[typestr]
        self.ptr = cuda.alloc(n * self.itemsize)
        self.stream = stream

    def arg(self):
        """What the package is given: this object (its __cuda_array_interface__), or under
        ``--host`` the bytearray standing in for it."""
        return self.cuda.mem[self.ptr] if getattr(self.cuda, "host", False) else self

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": self.typestr, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": self.stream}

    def put(self, values):
        self.cuda.upload(self.ptr, array.array(_CODE[self.typestr], values).tobytes())

    def get(self):
        a = array.array(_CODE[self.typestr])
        a.frombytes(self.cuda.download(self.ptr, self.n * self.itemsize))
        return a


_CODE = {"<f4": "f", "<i4": "i", "<i8": "q"}
_NAME = {"<f4": "float32", "<i4": "int32", "<i8": "int64"}


def f32(x):
    """x rounded to float32, as the device holds it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def rank_main(pkg, host):
    sys.path.insert(0, pkg)
    import rocecoll

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = HostCuda() if host else Cuda(rank)
    comm = rocecoll.from_env(transport="shm", timeout=30, bootstrap_timeout=30)
    results = []

    def check(name, got, want):
        ok = list(got) == list(want)
        results.append(ok)
        print(f"rank {rank}: {name}: {'ok' if ok else 'WRONG'}", flush=True)

    # all_reduce sum float32, large, integer-valued (exact in any order)
    x = Dev(cuda, "<f4", N_BIG)
    x.put([float((i % 251) * (rank + 1)) for i in range(N_BIG)])
    comm.all_reduce(x.arg(), dtype=x.dtype)
    tri = size * (size + 1) // 2
    check(f"all_reduce sum float32 x{N_BIG}", x.get(),
          [float((i % 251) * tri) for i in range(N_BIG)])

    # stream order: the input written asynchronously on a non-blocking stream, not synchronized
    s = cuda.stream()
    y = Dev(cuda, "<f4", N_BIG, stream=s)
    y.put([0.0] * N_BIG)
    one = struct.unpack("I", struct.pack("f", float(rank + 1)))[0]
    cuda.memset32_async(y.ptr, one, N_BIG, s)
    comm.all_reduce(y.arg(), dtype=y.dtype)
    check("all_reduce after an unsynchronized cuMemsetD32Async (stream order)", y.get(),
          [float(tri)] * N_BIG)

    # max int32, avg float32 (async handle)
    m = Dev(cuda, "<i4", N_SMALL)
    m.put([(i * 7919 + rank * 104729) % 100003 - 50000 for i in range(N_SMALL)])
    comm.all_reduce(m.arg(), op="max", dtype=m.dtype)
    check("all_reduce max int32", m.get(),
          [max((i * 7919 + r * 104729) % 100003 - 50000 for r in range(size))
           for i in range(N_SMALL)])
    a = Dev(cuda, "<f4", N_SMALL)
    a.put([float(rank * 2 + i % 5) for i in range(N_SMALL)])
    comm.all_reduce(a.arg(), op="avg", dtype=a.dtype, async_op=True).wait()
    check("all_reduce avg float32 (async)", a.get(),
          [f32(sum(float(r * 2 + i % 5) for r in range(size)) / size) for i in range(N_SMALL)])

    # all_gather int64
    src = Dev(cuda, "<i8", N_SMALL)
    src.put([rank * 1_000_000 + i for i in range(N_SMALL)])
    out = Dev(cuda, "<i8", N_SMALL * size)
    comm.all_gather(out.arg(), src.arg(), dtype=src.dtype)
    check("all_gather int64", out.get(),
          [r * 1_000_000 + i for r in range(size) for i in range(N_SMALL)])

    # broadcast float32 from the last rank
    b = Dev(cuda, "<f4", N_SMALL)
    b.put([float(rank * 10 + i) for i in range(N_SMALL)])
    comm.broadcast(b.arg(), size - 1, dtype=b.dtype)
    check("broadcast float32", b.get(), [float((size - 1) * 10 + i) for i in range(N_SMALL)])

    # reduce_scatter sum int32
    rs_in = Dev(cuda, "<i4", N_SMALL * size)
    rs_in.put([rank + i for i in range(N_SMALL * size)])
    rs_out = Dev(cuda, "<i4", N_SMALL)
    comm.reduce_scatter(rs_out.arg(), rs_in.arg(), dtype=rs_in.dtype)
    check("reduce_scatter sum int32", rs_out.get(),
          [sum(r + rank * N_SMALL + i for r in range(size)) for i in range(N_SMALL)])

    # send / recv in pairs (0<->1, 2<->3): a send returns once its peer has received, so one side
    # of each pair sends first and the other receives first
    peer = rank ^ 1
    if peer < size:
        snd = Dev(cuda, "<f4", N_SMALL)
        snd.put([float(rank * 3 + i) for i in range(N_SMALL)])
        rcv = Dev(cuda, "<f4", N_SMALL)
        if rank % 2 == 0:
            comm.send(snd.arg(), peer, dtype=snd.dtype)
            comm.recv(rcv.arg(), peer, dtype=rcv.dtype)
        else:
            comm.recv(rcv.arg(), peer, dtype=rcv.dtype)
            comm.send(snd.arg(), peer, dtype=snd.dtype)
        check("send/recv float32 pairs", rcv.get(), [float(peer * 3 + i) for i in range(N_SMALL)])

    p2p, staged, why = comm.device_path_stats()
    ok = (p2p, staged) == (0, 0) if host else (p2p >= 4 and staged == 0)
    results.append(ok)
    print(f"rank {rank}: all-reduce path: gpu-p2p {p2p} calls, staged {staged} calls"
          f"{'' if why is None else f' (last fallback: {why})'}: {'ok' if ok else 'WRONG'}",
          flush=True)
    comm.barrier()
    return all(results), len(results)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--rank":
        try:
            ok, n = rank_main(sys.argv[2], os.environ.get("ROCECOLL_CUDA_CHECK_HOST") == "1")
        except Exception as e:  # one line per rank: the driver's error without a GPU
            print(f"rank {os.environ['RANK']}: FAILED: {type(e).__name__}: {e}", flush=True)
            sys.exit(1)
        print(f"rank {os.environ['RANK']}: {n} checks, {'all passed' if ok else 'FAILED'}")
        sys.exit(0 if ok else 1)
    host = len(sys.argv) > 1 and sys.argv[1] == "--host"
    if host:
        del sys.argv[1]
        os.environ["ROCECOLL_CUDA_CHECK_HOST"] = "1"
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} [--host] PKG_DIR [RANKS]")
    if sys.version_info < (3, 11):
        sys.exit(f"python-cuda: FAILED: python {sys.version.split()[0]}: the package is built "
                 "for the stable ABI of CPython >= 3.11")
    pkg = os.path.abspath(sys.argv[1])
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(f"# python {sys.version.split()[0]}, package from {pkg}, {size} ranks"
          f"{', host memory (--host)' if host else ''}", flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(size):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(size),
                   LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", pkg], env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    if any(codes):
        for p in procs:
            if p.poll() is None:
                p.kill()
        print(f"python-cuda: FAILED (rank exit codes {codes})")
        sys.exit(1)
    print(f"python-cuda: all checks passed on {size} ranks{' (host memory)' if host else ''}")


if __name__ == "__main__":
    main()
