"""The binding's cost per small operation (issue 20): microseconds per blocking all-reduce of
``--bytes`` (1 KiB by default) through four paths, interleaved in one job, with the context
switches each costs:

* ``coll-perf``: the Rust crate alone (``coll-perf all-reduce``, nccl-tests' interface, run by
  rank 0 with its own ranks while ours wait in a Gloo barrier; its in-place time);
* ``rocecoll``: the package's direct API (``comm.all_reduce(tensor)``, a ``rocecoll.Comm`` made
  through torchrun's store);
* ``torch-rocecoll``: ``dist.all_reduce(tensor, group=ours)``, our backend (a ``new_group``);
* ``torch-gloo``: ``dist.all_reduce(tensor)`` on the default group, Gloo.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
        collectives/python/benches/small_ops.py --coll-perf target/release/coll-perf \\
        [--bytes 1024] [--ops 2000] [--warmup 200] [--rounds 5] [--transport shm|roce]

Each round runs every path once, in an order that rotates between rounds (so each sees the
same load); a path's time is its slowest rank's ``--ops`` operations after ``--warmup``, between
barriers. Printed per path: the best and the median of the rounds in microseconds per op, and
the voluntary / involuntary context switches per op of rank 0's process (getrusage: every
thread; a thread hand-off costs at least one voluntary switch). ``uptime`` is printed before and
after: figures taken at a load above the CPU count say little. Run by hand, not a test.
"""

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

PATHS = ("coll-perf", "rocecoll", "torch-rocecoll", "torch-gloo")


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def coll_perf(path, nbytes, n, ops, warmup, transport):
    """Seconds per in-place all-reduce of ``nbytes`` from one coll-perf run."""
    cmd = [path, "all-reduce", "-b", str(nbytes), "-e", str(nbytes), "-n", str(ops), "-w",
           str(warmup), "-c", "0", "--ranks", str(n), "--transport", transport]
    # Without the launcher's variables coll-perf starts its own ranks instead of joining ours.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                        "ROLE_WORLD_SIZE")
           and not k.startswith(("TORCHELASTIC_", "OMPI_", "PMI", "SLURM_"))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    for line in p.stdout.splitlines():
        f = line.split()
        # nccl-tests' columns: size count type redop root, out of place: time algbw busbw
        # #wrong, in place: time (column 9) ...
        if len(f) > 9 and f[0] == str(nbytes):
            return float(f[9]) * 1e-6
    raise RuntimeError(f"{' '.join(cmd)}: no line for {nbytes} bytes in\n{p.stdout[-2000:]}")


def timed(run, barrier, ops, warmup):
    """(seconds per op, the slowest rank's; voluntary and involuntary switches per op here)."""
    for _ in range(warmup):
        run()
    barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(ops):
        run()
    dt = (time.perf_counter() - t0) / ops
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # on the Gloo group: the same for every path
    return t.item(), (r1.ru_nvcsw - r0.ru_nvcsw) / ops, (r1.ru_nivcsw - r0.ru_nivcsw) / ops


def inline_ops(group):
    """The ``inline_ops`` count of our backend's communicator behind ``group``."""
    c = getattr(group, "_c", None)  # torch 2.7: new_group returns our ProcessGroup itself
    return c.inline_ops if c is not None else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--transport", default="shm", choices=["shm", "roce"])
    ap.add_argument("--coll-perf", default=None, help="path of coll-perf (else that path is skipped)")
    a = ap.parse_args()
    if not (4 <= a.bytes <= 1 << 30 and 1 <= a.ops <= 1_000_000 and 0 <= a.warmup <= 1_000_000
            and 1 <= a.rounds <= 100):
        ap.error("--bytes 4..1G, --ops 1..1000000, --warmup 0..1000000, --rounds 1..100")

    os.environ["ROCECOLL_TRANSPORT"] = a.transport
    import rocecoll
    import rocecoll.torch_backend  # noqa: F401  (registers "rocecoll")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    ours = dist.new_group(list(range(n)), backend="rocecoll")
    store = dist.PrefixStore("small_ops_direct", dist.distributed_c10d._get_default_store())
    comm = rocecoll.from_store(store, rank, n, transport=a.transport,
                               local_ip="127.0.0.1" if a.transport == "roce" else None,
                               timeout=120)
    buf = torch.ones(a.bytes // 4)
    runs = {
        "rocecoll": (lambda: comm.all_reduce(buf), comm.barrier),
        "torch-rocecoll": (lambda: dist.all_reduce(buf, group=ours),
                           lambda: dist.barrier(group=ours)),
        "torch-gloo": (lambda: dist.all_reduce(buf), dist.barrier),
    }
    paths = [p for p in PATHS if p != "coll-perf" or a.coll_perf]
    if rank == 0:
        print(f"# {uptime()}")
        print(f"# {n} ranks, transport {a.transport}, all_reduce of {a.bytes} B float32, "
              f"{a.rounds} rounds of {a.ops} ops (+{a.warmup} warm-up) per path", flush=True)
    times = {p: [] for p in paths}
    switches = {p: [] for p in paths}
    for rnd in range(a.rounds):
        k = rnd % len(paths)
        for p in paths[k:] + paths[:k]:
            if p == "coll-perf":
                dist.barrier()
                if rank == 0:
                    t = coll_perf(a.coll_perf, a.bytes, n, a.ops, a.warmup, a.transport)
                dist.barrier()
                if rank == 0:
                    times[p].append(t)
                continue
            run, barrier = runs[p]
            t, vol, invol = timed(run, barrier, a.ops, a.warmup)
            times[p].append(t)
            switches[p].append((vol, invol))
    if rank == 0:
        print(f"# {uptime()}")
        print("path best_us median_us voluntary/op involuntary/op (rank 0, the median round's "
              "of each)")
        for p in paths:
            ts = times[p]
            sw = sorted(switches[p]) if switches[p] else []
            v, i = sw[len(sw) // 2] if sw else (float("nan"), float("nan"))
            print(f"{p} {min(ts) * 1e6:.1f} {statistics.median(ts) * 1e6:.1f} {v:.2f} {i:.2f}")
        cp = min(times["coll-perf"]) if "coll-perf" in times else None
        if cp is not None:
            for p in ("rocecoll", "torch-rocecoll"):
                print(f"# {p} - coll-perf: {(min(times[p]) - cp) * 1e6:.1f} us extra per op "
                      "(best rounds)")
        print(f"# torch-rocecoll operations run on the calling thread: {inline_ops(ours)}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
