"""Non-blocking operations in flight and in order, abort from another thread, the per-operation
timeout, a killed rank, and the store bootstrap (issue 20). Every wait is bounded by a
communicator timeout or by the harness's job timeout; nothing measures wall-clock time."""

import multiprocessing as mp
import os
import threading

import numpy as np
import pytest

import ranks


def overlap(rank, size):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=60)
    bufs = [np.full(1000 * (k + 1), rank + k, dtype=np.float32) for k in range(8)]
    works = [comm.all_reduce(b, async_op=True) for b in bufs]
    # Computation overlaps the operations in flight.
    acc = float(np.sum(np.arange(100_000, dtype=np.float64)))
    last_done = works[-1].wait()
    # Issue order: once the last has ended, every earlier one has.
    in_order = all(w.is_completed() for w in works)
    for w in works:
        w.wait()
    ok = all(
        np.all(b == sum(r + k for r in range(size))) for k, b in enumerate(bufs)
    )
    # An operation whose Work is dropped unwaited, then the communicator dropped while it may
    # still run: the drop waits for it with the GIL released (the operation releases its buffer,
    # which takes the GIL), so this returns instead of deadlocking.
    comm.all_reduce(np.ones(1 << 20, dtype=np.float32), async_op=True)
    del comm, works
    import gc

    gc.collect()
    return last_done, in_order, ok, acc > 0


def test_several_operations_in_flight_complete_in_order():
    for last_done, in_order, ok, _ in ranks.values(ranks.run(overlap, 4)):
        assert last_done and in_order and ok


def abort_or_timeout(rank, size, mode, done):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=60)
    comm.barrier()
    if rank == 0:
        buf = np.zeros(64, dtype=np.float32)
        if mode == "abort":
            w = comm.all_reduce(buf, async_op=True)
            assert w.wait(timeout=0.05) is False  # rank 1 is not there
            t = threading.Thread(target=comm.abort)
            t.start()
            t.join()
        else:
            w = comm.all_reduce(buf, async_op=True, timeout=0.3)
        try:
            w.wait()
            msg = "no error"
        except rocecoll.CollectiveError as e:
            msg = (str(e), e.rank, e.peer)
        done.set()
        return msg
    # Rank 1 stays out until rank 0 has its error; then its own operation fails naming rank 0.
    assert done.wait(120)
    try:
        comm.barrier(timeout=60)
        return "no error"
    except rocecoll.CollectiveError as e:
        return (str(e), e.rank, e.peer)


@pytest.mark.parametrize("mode", ["abort", "timeout"])
def test_abort_and_timeout_end_pending_operations(mode):
    done = mp.get_context("spawn").Event()
    r0, r1 = ranks.values(ranks.run(abort_or_timeout, 2, mode, done))
    assert r0 != "no error" and r1 != "no error"
    msg0, rank0, peer0 = r0
    assert msg0.startswith("rank 0:") and rank0 == 0
    if mode == "abort":
        assert "ended by abort()" in msg0, msg0
    else:
        assert peer0 == 1 and "stalled" in msg0 or "timed out" in msg0 or "timeout" in msg0, msg0
    msg1, rank1, _ = r1
    assert msg1.startswith("rank 1:") and rank1 == 1 and "rank 0" in msg1[7:], msg1


def killed(rank, size, transport):
    import rocecoll

    comm = rocecoll.from_env(transport=transport, timeout=30)
    try:
        # The victim leaves as soon as its own barrier is done; the others may still be waiting
        # for its last barrier message (over RoCE, unacknowledged when it dies), so their error
        # can come from the barrier as well as from the all-reduces.
        comm.barrier()
        if rank == size - 1:
            os._exit(17)  # dies without closing anything
        for _ in range(100):
            comm.all_reduce(np.ones(4096, dtype=np.float32))
        return "no error"
    except rocecoll.CollectiveError as e:
        return str(e)


@pytest.mark.parametrize("transport", ["shm", "roce"])
def test_a_killed_rank_makes_the_others_raise(transport):
    out = ranks.run(killed, 3, transport, timeout=180)
    assert out[2] == ("exit", 17), out[2]
    for r in (0, 1):
        kind, msg = out[r]
        assert kind == "ok" and msg != "no error", out[r]
        assert msg.startswith(f"rank {r}:"), msg
        assert "rank 2" in msg or "rank 1" in msg or "rank 0" in msg, msg


def store_bootstrap(rank, size, transport):
    import datetime

    import torch.distributed as dist

    import rocecoll

    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, datetime.timedelta(seconds=60))
    sums = []
    for k in range(2):  # two communicators on one store
        pre = dist.PrefixStore(f"group{k}/", store)
        comm = rocecoll.from_store(pre, rank, size, transport=transport, local_ip="127.0.0.1",
                                   timeout=60)
        buf = np.full(10_000, rank + k, dtype=np.float64)
        comm.all_reduce(buf)
        sums.append(float(buf[0]))
    return sums


@pytest.mark.parametrize("transport", ["shm", "roce"])
def test_store_bootstrap_through_torch_tcpstore(transport):
    pytest.importorskip("torch")
    for sums in ranks.values(ranks.run(store_bootstrap, 3, transport)):
        assert sums == [3.0, 6.0]


def test_meta_tensor_is_a_clear_error():
    torch = pytest.importorskip("torch")
    import rocecoll

    t = torch.empty(3, device="meta")
    with pytest.raises(rocecoll.CollectiveError,
                       match="buffer on meta: rocecoll reaches host memory and CUDA device memory only"):
        rocecoll.as_bytes(t)
    with pytest.raises(rocecoll.CollectiveError, match="buffer on meta"):
        rocecoll._arg(t)
