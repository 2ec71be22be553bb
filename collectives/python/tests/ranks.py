"""Helpers of the tests: run a function on N ranks, each a fresh Python process (spawn).

Every rank gets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / COLL_SECRET (the launcher
environment torchrun would set, with a random secret) and runs ``fn(rank, size, *args)``; the
parent collects each rank's return value, or its exception text, or its exit code. Every wait is
bounded (``timeout`` seconds for the whole job): a hang fails the test instead of blocking CI.
"""

import multiprocessing as mp
import os
import secrets
import socket
import traceback


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, size, env, args, q):
    os.environ.update(env)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        q.put((rank, "ok", fn(rank, size, *args)))
    except BaseException as e:  # reported to the parent
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run(fn, size, *args, timeout=120, env=None):
    """Runs ``fn`` on ``size`` ranks; returns ``{rank: ("ok", value) | ("error", text) |
    ("exit", code)}``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    base = {
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "COLL_SECRET": secrets.token_hex(16),
    }
    base.update(env or {})
    procs = [ctx.Process(target=_entry, args=(fn, r, size, base, args, q)) for r in range(size)]
    for p in procs:
        p.start()
    out = {}
    import queue as _queue
    import time

    deadline = time.monotonic() + timeout
    while len(out) < size and time.monotonic() < deadline:
        try:
            rank, kind, value = q.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            out[rank] = (kind, value)
        except _queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    for r, p in enumerate(procs):
        out.setdefault(r, ("exit", p.exitcode))
    return out


def values(out):
    """The ranks' return values, failing with every rank's error when any failed."""
    bad = {r: v for r, v in out.items() if v[0] != "ok"}
    assert not bad, "\n".join(f"rank {r}: {v}" for r, v in sorted(bad.items()))
    return [out[r][1] for r in sorted(out)]
