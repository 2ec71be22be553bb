"""Context switches per blocking collective (issue 20): the Python -> Rust path with the
operation run on the caller's thread (``async_op=False``, nothing pending) against the same
operation handed to the progress thread and waited for (``async_op=True`` then ``wait()``).

    python collectives/python/benches/switches.py [--ranks 2] [--ops 2000] [--bytes 1024]

Counts, not times: each rank reads its process's voluntary and involuntary context switches
(getrusage(RUSAGE_SELF): every thread of the process, ru_nvcsw / ru_nivcsw) around --ops
all-reduces of --bytes over shared memory, and prints the per-operation mean of the switches
per rank, for both paths, interleaved over 3 rounds (the smallest of each). Involuntary switches
grow with the machine's load; voluntary ones count the hand-offs (a thread blocking on another).
"""

import argparse
import os
import resource
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import ranks  # noqa: E402


def count(rank, size, ops, nbytes):
    import rocecoll

    comm = rocecoll.from_env(transport="shm", timeout=120)
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    best = {}
    for _ in range(3):
        for path in ("inline", "threaded"):
            comm.barrier()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(ops):
                if path == "inline":
                    comm.all_reduce(buf)
                else:
                    comm.all_reduce(buf, async_op=True).wait()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            v = (r1.ru_nvcsw - r0.ru_nvcsw) / ops
            i = (r1.ru_nivcsw - r0.ru_nivcsw) / ops
            old = best.get(path)
            if old is None or v + i < old[0] + old[1]:
                best[path] = (v, i)
    return best, comm.inline_ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=1024)
    a = ap.parse_args()
    if not (2 <= a.ranks <= 16 and 1 <= a.ops <= 1_000_000):
        ap.error("--ranks 2..16, --ops 1..1000000")
    print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {a.ranks} ranks, "
          f"{a.ops} all-reduces of {a.bytes} B per path and round, best of 3 rounds")
    print("rank path voluntary/op involuntary/op inline_ops")
    for r, (best, inline_ops) in enumerate(ranks.values(
            ranks.run(count, a.ranks, a.ops, a.bytes, timeout=1800))):
        for path, (v, i) in best.items():
            print(f"{r} {path} {v:.2f} {i:.2f} {inline_ops}")


if __name__ == "__main__":
    main()
