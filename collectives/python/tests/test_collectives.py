"""Every collective, data type and reduction op against numpy references, on 2 and 4 ranks, over
shared memory and over software RoCE (issue 20). Ranks are processes bootstrapped from the
launcher environment (``rocecoll.from_env``); values are small integers so that every result is
exact in every type (f16 and bf16 included)."""

import numpy as np
import pytest

import ranks

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]
SIZES = [5, 40_000]  # one chunk; many 128 KiB slots


def ints(rank, n, op, salt):
    rng = np.random.default_rng(7919 * salt + rank)
    if op == "prod":
        return rng.integers(1, 3, n)  # product over 4 ranks <= 16
    return rng.integers(0, 20, n)  # sum over 4 ranks <= 76


def typed(vals, dt):
    """numpy array holding ``vals`` as ``dt`` (bfloat16: its bits in a uint16 array)."""
    if dt == "bfloat16":
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(dt)


def untyped(arr, dt):
    if dt == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def reference(op, per_rank):
    a = np.stack([v.astype(np.float64) for v in per_rank])
    return {"sum": a.sum(0), "prod": a.prod(0), "min": a.min(0), "max": a.max(0),
            "avg": a.sum(0) / len(per_rank)}[op]


def ops_for(dt):
    return OPS if dt.startswith("float") or dt == "bfloat16" else OPS[:4]


def check_everything(rank, size, transport):
    import rocecoll

    comm = rocecoll.from_env(transport=transport, timeout=60)
    assert (comm.rank, comm.size) == (rank, size)
    bad = []
    case = 0

    def expect(what, got, want, dt):
        g = untyped(got, dt)
        if not np.array_equal(g, want):
            i = int(np.argmax(g != want))
            bad.append(f"{what}: element {i} is {g[i]}, expected {want[i]}")

    for dt in DTYPES:
        for n in SIZES:
            for op in ops_for(dt):
                case += 1
                mine = typed(ints(rank, n, op, case), dt)
                want = reference(op, [ints(r, n, op, case) for r in range(size)])
                # all_reduce, blocking
                buf = mine.copy()
                comm.all_reduce(buf, op=op, dtype=dt)
                expect(f"all_reduce {dt} {op} n={n}", buf, want, dt)
                # reduce_scatter (async)
                send = np.concatenate([mine] * size)
                full = np.concatenate([want] * size)
                out = np.zeros(n, dtype=mine.dtype)
                comm.reduce_scatter(out, send, op=op, dtype=dt, async_op=True).wait()
                expect(f"reduce_scatter {dt} {op} n={n}", out, full[rank * n:(rank + 1) * n], dt)
                # reduce to rank 0
                buf = mine.copy()
                comm.reduce(buf, root=0, op=op, dtype=dt)
                if rank == 0:
                    expect(f"reduce {dt} {op} n={n}", buf, want, dt)
            case += 1
            mine = typed(ints(rank, n, "sum", case), dt)
            each = [ints(r, n, "sum", case) for r in range(size)]
            # broadcast from the last rank
            buf = mine.copy()
            comm.broadcast(buf, root=size - 1, dtype=dt)
            expect(f"broadcast {dt} n={n}", buf, each[size - 1].astype(np.float64), dt)
            # all_gather
            out = np.zeros(size * n, dtype=mine.dtype)
            comm.all_gather(out, mine, dtype=dt)
            expect(f"all_gather {dt} n={n}", out, np.concatenate(each).astype(np.float64), dt)
            # all_to_all: block j of rank r is ints(r)[block j]
            m = n - n % size
            send = mine[:m].copy()
            out = np.zeros(m, dtype=mine.dtype)
            comm.all_to_all(out, send, dtype=dt)
            b = m // size
            want = np.concatenate([each[r][rank * b:(rank + 1) * b] for r in range(size)])
            expect(f"all_to_all {dt} n={m}", out, want.astype(np.float64), dt)
            # send / recv in pairs (0<->1, 2<->3)
            peer = rank ^ 1
            if peer < size:
                got = np.zeros(n, dtype=mine.dtype)
                if rank % 2 == 0:
                    comm.send(mine, peer, dtype=dt)
                    comm.recv(got, peer, dtype=dt)
                else:
                    comm.recv(got, peer, dtype=dt)
                    comm.send(mine, peer, dtype=dt)
                expect(f"send/recv {dt} n={n}", got, each[peer].astype(np.float64), dt)
    comm.barrier()
    return bad


@pytest.mark.parametrize("transport", ["shm", "roce"])
@pytest.mark.parametrize("size", [2, 4])
def test_every_collective_dtype_and_op(size, transport):
    for bad in ranks.values(ranks.run(check_everything, size, transport, timeout=600)):
        assert bad == [], "\n".join(bad)


def errors_of_bad_input(rank, size):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=30)
    out = []
    for call in (
        lambda: comm.all_reduce(np.zeros(3, np.float32), op="xor"),
        lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1]),
        lambda: comm.all_reduce(np.zeros(3, np.bool_)),
        lambda: comm.all_reduce(bytearray(6), dtype="float32"),
        lambda: comm.all_to_all(np.zeros(3, np.float32), np.zeros(3, np.float32)),
        lambda: comm.all_reduce(np.zeros(3, np.float32), timeout=0),
    ):
        try:
            call()
            out.append("no error")
        except ValueError as e:
            out.append(str(e))
    comm.barrier()
    return out


def test_bad_input_is_a_value_error_naming_the_problem():
    for errs in ranks.values(ranks.run(errors_of_bad_input, 2)):
        assert "reduction op" in errs[0], errs
        assert "contiguous" in errs[1], errs
        assert "unsupported numpy dtype bool" in errs[2], errs
        assert "whole number of float elements" in errs[3], errs
        assert "equal blocks" in errs[4], errs
        assert "must be > 0" in errs[5], errs
