"""DLPack inputs, host views of device memory refused with a clear error, ``Work.wait(timeout)`` of the torch
backend, and the Gloo summation order (issue 20). Waits are bounded by communicator timeouts,
events with timeouts and the harness's job timeout; nothing measures wall-clock time."""

import datetime
import multiprocessing as mp

import numpy as np
import pytest

import ranks


class DLPackOnly:
    """Exports ``arr``'s memory through DLPack only (no buffer protocol, not a numpy type), as
    jax or cupy arrays do."""

    def __init__(self, arr, device=(1, 0)):
        self._arr = arr
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


def test_dlpack_object_is_viewed_without_a_copy():
    import rocecoll

    arr = np.arange(6, dtype=np.float32)
    mv, dt = rocecoll.as_bytes(DLPackOnly(arr))
    assert dt == "float32" and mv.nbytes == 24
    mv[0:4] = np.float32(7.5).tobytes()  # writes land in the exporter's memory
    assert arr[0] == 7.5


def test_dlpack_read_only_exports_are_inputs_only():
    import rocecoll

    arr = np.arange(4, dtype=np.int32)
    arr.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        rocecoll.as_bytes(DLPackOnly(arr))
    mv, dt = rocecoll.as_bytes(DLPackOnly(arr), writable=False)
    assert dt == "int32" and mv.nbytes == 16


def test_legacy_dlpack_exports_are_inputs_only():
    """torch 2.7 exports DLPack < 1.0 (no read-only flag): usable as an input, refused as an
    output; bfloat16 comes through (numpy's from_dlpack has no such type)."""
    torch = pytest.importorskip("torch")
    import rocecoll

    t = torch.arange(4, dtype=torch.bfloat16)
    mv, dt = rocecoll.as_bytes(DLPackOnly(t), writable=False)
    assert dt == "bfloat16" and bytes(mv) == t.view(torch.uint8).numpy().tobytes()
    with pytest.raises(ValueError, match="read-only"):
        rocecoll.as_bytes(DLPackOnly(t))


def test_dlpack_non_contiguous_export_is_refused():
    import rocecoll

    with pytest.raises(ValueError, match="not C-contiguous"):
        rocecoll.as_bytes(DLPackOnly(np.zeros((3, 4), np.float32).T))


@pytest.mark.parametrize("device,name", [((2, 0), "cuda:0"), ((10, 1), "rocm:1"),
                                         ((13, 0), "cuda_managed:0")])
def test_dlpack_gpu_memory_is_a_clear_error(device, name):
    """No host view of device memory (collectives take CUDA memory as it is:
    test_cuda_no_gpu.py)."""
    import rocecoll

    with pytest.raises(rocecoll.CollectiveError, match=f"buffer on {name}( .no host view.)?: "
                                                       "rocecoll reaches host memory"):
        rocecoll.as_bytes(DLPackOnly(np.zeros(3, np.float32), device))


def test_cuda_array_interface_is_a_clear_error():
    import rocecoll

    class CudaArray:  # what cupy / numba device arrays expose
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    with pytest.raises(rocecoll.CollectiveError, match="no host view"):
        rocecoll.as_bytes(CudaArray())


def test_fake_cuda_torch_tensor_is_a_clear_error():
    """The CPU build of torch cannot make a CUDA tensor: an object that claims to be one."""
    import rocecoll

    class Device:
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    class FakeCudaTensor:
        __module__ = "torch"
        device = Device()
        is_cpu = False
    with pytest.raises(rocecoll.CollectiveError, match="buffer on cuda:0"):
        rocecoll.as_bytes(FakeCudaTensor())
    # The operations' own argument path (a CPU tensor goes to Rust as itself) refuses it too.
    with pytest.raises(rocecoll.CollectiveError, match="buffer on cuda:0"):
        rocecoll._arg(FakeCudaTensor())


def dlpack_all_reduce(rank, size):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=60)
    arr = np.full(1000, rank + 1, dtype=np.float64)
    comm.all_reduce(DLPackOnly(arr))
    got = np.zeros(size * 3, dtype=np.int64)
    comm.all_gather(DLPackOnly(got), DLPackOnly(np.full(3, rank, dtype=np.int64)))
    return arr.tolist() == [size * (size + 1) / 2] * 1000, got.tolist()


def test_collectives_on_dlpack_objects():
    for summed, gathered in ranks.values(ranks.run(dlpack_all_reduce, 2)):
        assert summed and gathered == [0, 0, 0, 1, 1, 1]


def wait_timeout(rank, size, go):
    import torch
    import torch.distributed as dist

    import rocecoll.torch_backend as rtb

    dist.init_process_group("rocecoll", timeout=datetime.timedelta(seconds=60))
    out = {}
    t = torch.full((8,), float(rank + 1))
    if rank == 0:
        w = dist.all_reduce(t, async_op=True)
        try:
            w.wait(timeout=datetime.timedelta(milliseconds=50))  # rank 1 has not joined
            out["first"] = "no error"
        except rtb.WorkTimeout as e:
            out["first"] = (str(e), e.rank, e.op, isinstance(e, RuntimeError))
        out["completed_after_timeout"] = w.is_completed()
        go.set()
        # The operation went on: a second wait (bounded by the group's 60 s) gets its result.
        out["second"] = w.wait(timeout=datetime.timedelta(seconds=60))
    else:
        if not go.wait(120):
            return "rank 0 never signalled"
        dist.all_reduce(t)
    out["sum"] = t.tolist()
    # The group stays usable.
    u = torch.full((3,), float(rank))
    dist.all_reduce(u)
    out["after"] = u.tolist()
    dist.destroy_process_group()
    return out


def test_torch_work_wait_honours_its_timeout():
    pytest.importorskip("torch")
    go = mp.get_context("spawn").Event()
    r0, r1 = ranks.values(ranks.run(wait_timeout, 2, go, timeout=180, env={
        "ROCECOLL_TRANSPORT": "shm"}))
    msg, rank, op, is_runtime = r0["first"]
    assert rank == 0 and op == "allreduce" and is_runtime, r0
    assert msg.startswith("rank 0: allreduce on ranks 0..1") and "timeout=0.05 s" in msg, msg
    assert r0["completed_after_timeout"] is False
    assert r0["second"] is True
    assert r0["sum"] == r1["sum"] == [3.0] * 8
    assert r0["after"] == r1["after"] == [1.0] * 3


def torch_inline(rank, size):
    import torch
    import torch.distributed as dist

    import rocecoll.torch_backend  # noqa: F401  (registers the backend)

    dist.init_process_group("rocecoll", timeout=datetime.timedelta(seconds=60))
    c = dist.distributed_c10d._get_default_group()._c
    got = {}

    def counted(name, fn):
        before = c.inline_ops
        out = fn()
        got[name] = (c.inline_ops - before, out)

    t = torch.full((256,), float(rank + 1))
    counted("all_reduce", lambda: (dist.all_reduce(t), t[0].item())[1])

    def async_all_reduce():
        u = torch.full((64,), float(rank))
        w = dist.all_reduce(u, async_op=True)
        return w.wait(), u[0].item(), w.is_completed()

    counted("all_reduce async", async_all_reduce)
    b = torch.full((5,), float(rank))
    counted("broadcast", lambda: (dist.broadcast(b, src=size - 1), b.tolist())[1])
    g = torch.empty(3 * size, dtype=torch.int64)
    counted("all_gather_into_tensor", lambda: (
        dist.all_gather_into_tensor(g, torch.full((3,), rank, dtype=torch.int64)), g.tolist())[1])
    outs = [torch.zeros(2) for _ in range(size)]
    counted("all_gather", lambda: (  # the copy out of the staging buffer runs on this thread
        dist.all_gather(outs, torch.full((2,), float(rank))), [o.tolist() for o in outs])[1])
    rs = torch.empty(2)
    counted("reduce_scatter_tensor", lambda: (
        dist.reduce_scatter_tensor(rs, torch.arange(2.0 * size)), rs.tolist())[1])
    counted("barrier", lambda: dist.barrier())
    p = torch.full((4,), float(rank))

    def ping():  # point-to-point never runs on the caller's thread
        if rank == 0:
            dist.send(p, 1)
        elif rank == 1:
            dist.recv(p, 0)
        return p.tolist()

    counted("send/recv", ping)
    dist.destroy_process_group()
    return got


def test_torch_blocking_calls_run_on_the_callers_thread():
    """Blocking ``torch.distributed`` collectives (``async_op=False``) with nothing in flight run
    inline (``inline_ops`` counts them) and give the same results; async ones and
    point-to-point go to the progress thread."""
    pytest.importorskip("torch")
    for rank, got in enumerate(ranks.values(ranks.run(torch_inline, 2, timeout=180, env={
            "ROCECOLL_TRANSPORT": "shm"}))):
        assert got["all_reduce"] == (1, 3.0), got
        assert got["all_reduce async"] == (0, (True, 1.0, True)), got
        assert got["broadcast"] == (1, [1.0] * 5), got
        assert got["all_gather_into_tensor"] == (1, [0, 0, 0, 1, 1, 1]), got
        assert got["all_gather"] == (1, [[0.0, 0.0], [1.0, 1.0]]), got
        assert got["reduce_scatter_tensor"] == (1, [4.0 * rank, 4.0 * rank + 2]), got
        assert got["barrier"] == (1, None), got
        assert got["send/recv"] == (0, [0.0] * 4), got


def test_ended_work_future_and_error():
    """The ``Work`` of an operation that ended on the calling thread: its future is made on
    demand, and its error is raised by ``wait`` and set on the future."""
    torch = pytest.importorskip("torch")
    import rocecoll
    import rocecoll.torch_backend as rtb

    t = [torch.ones(2)]
    w = rtb._EndedWork(t, None)
    assert w.is_completed() and w.is_success() and w.wait() is True and w.exception() is None
    assert w.get_future().wait() is t and w.get_future() is w.get_future()
    err = rocecoll.CollectiveError("rank 0: all-reduce failed")
    w = rtb._EndedWork(t, err)
    assert w.is_completed() and not w.is_success() and w.exception() is err
    with pytest.raises(rocecoll.CollectiveError, match="all-reduce failed"):
        w.wait()
    with pytest.raises(rocecoll.CollectiveError, match="all-reduce failed"):
        w.get_future().wait()


def gloo_order(rank, size, sizes):
    import torch
    import torch.distributed as dist

    import rocecoll.torch_backend as rtb  # noqa: F401

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    ours = dist.new_group(list(range(size)), backend="rocecoll")
    out = []
    for k, n in enumerate(sizes):
        for dt in (torch.float32, torch.float64) if n < 1_000_000 else (torch.float32,):
            g = torch.Generator().manual_seed(1000 * k + rank)
            # Values of mixed magnitudes, so that the order of the additions shows in the sums.
            x = torch.randn(n, generator=g, dtype=torch.float64).mul_(
                torch.exp2(torch.randint(-20, 20, (n,), generator=g).double())).to(dt)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a)
            dist.all_reduce(b, group=ours)
            out.append((n, str(dt), torch.equal(a, b), int((a != b).sum())))
    dist.destroy_process_group()
    return out


# Sizes: tiny (empty chunks), odd, two segments per chunk, and 10 MB of float32, which Gloo's
# 1 MiB segment cap cuts into 12 segments of 833336 bytes (4 per rank on 3 ranks).
GLOO_SIZES = [1, 3, 7, 1000, 4097, 300_001, 2_500_003]


@pytest.mark.parametrize("size", [3, 4])
def test_gloo_sum_order_is_bitwise_gloo(size):
    pytest.importorskip("torch")
    out = ranks.run(gloo_order, size, GLOO_SIZES, timeout=600,
                    env={"ROCECOLL_SUM_ORDER": "gloo", "ROCECOLL_TRANSPORT": "shm",
                         "OMP_NUM_THREADS": "1"})
    for per_rank in ranks.values(out):
        bad = [c for c in per_rank if not c[2]]
        assert not bad, f"differs from Gloo (n, dtype, equal, elements differing): {bad}"


def test_native_sum_order_differs_from_gloo():
    """The check above can fail: the crate's own order gives other bits on 4 ranks."""
    pytest.importorskip("torch")
    out = ranks.run(gloo_order, 4, [300_001], timeout=600,
                    env={"ROCECOLL_SUM_ORDER": "native", "ROCECOLL_TRANSPORT": "shm",
                         "OMP_NUM_THREADS": "1"})
    differing = [c[3] for c in ranks.values(out)[0]]
    assert all(d > 0 for d in differing), differing


def inline_counts(rank, size):
    import resource

    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=60)
    buf = np.full(256, rank + 1, dtype=np.float32)
    before = comm.inline_ops
    comm.all_reduce(buf)  # blocking, nothing pending: on this thread
    ran_inline = comm.inline_ops - before
    # Blocking calls while an async one may still be queued: issue order holds either way.
    w = comm.all_reduce(np.full(64, rank, dtype=np.int64), async_op=True)
    b2 = np.full(8, 1.0)
    comm.all_reduce(b2)
    w.wait()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(200):
        comm.all_reduce(buf, op="max")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return (ran_inline, buf[0], b2.tolist(), comm.inline_ops - before,
            r1.ru_nvcsw - r0.ru_nvcsw)


def test_blocking_calls_run_on_the_callers_thread():
    """A blocking call with nothing pending runs inline (counted by ``inline_ops``); the
    voluntary context switches of 200 of them are printed (a count, not asserted: shm waits
    spin before they sleep, and a loaded machine preempts)."""
    for ran_inline, first, b2, total, switches in ranks.values(ranks.run(inline_counts, 2)):
        assert ran_inline == 1
        assert first == 3.0
        assert b2 == [2.0] * 8
        assert 201 <= total <= 202, total
        print(f"voluntary context switches for 200 inline all-reduces: {switches}")
