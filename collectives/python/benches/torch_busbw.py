"""torch.distributed all_reduce / all_gather_into_tensor / reduce_scatter_tensor bus bandwidth,
our backend ("rocecoll") against Gloo in one job, interleaved, best of rounds (issue 20), and the
binding's own cost against the crate alone (coll-perf) and the package's direct API.

    torchrun --standalone --nproc-per-node 4 collectives/python/benches/torch_busbw.py \\
        [--ops all_reduce,all_gather,reduce_scatter] [-b 1K] [-e 64M] [--rounds 3] \\
        [--iters 20] [--warmup 3] [--transport shm|roce] [--coll-perf target/release/coll-perf]

Paths, in the same ranks: ``gloo`` (the default group), ``rocecoll`` (``dist.*`` on
``new_group(backend="rocecoll")``, transport ``--transport``) and ``direct`` (the package's own
API, ``rocecoll.Comm``, on a communicator of its own over the same transport: what the binding
costs without torch.distributed's layers). For each round, size and op the paths run back to back
(their order rotates between rounds), so they see the same load; each keeps its best (smallest)
time over the rounds. Time of one size, as coll-perf (nccl-tests) measures it: ``--iters``
operations after ``--warmup``, after a barrier of the path's own group, each rank's own elapsed
time, the mean over the ranks (``*_us``; the slowest rank's is ``rocecoll_max_us``: it also holds
how late the other ranks left the barrier, which at 20 iterations of a small size can be most of
it). busbw is nccl-tests' (doc/PERFORMANCE.md): bytes / time * 2(n-1)/n for all-reduce, (n-1)/n
for all-gather and reduce-scatter, bytes = the larger buffer; f32, all_reduce in place, the
gathers out of place. Counts per operation of rank 0's process in the round the time was taken
from (getrusage, every thread): CPU microseconds and voluntary / involuntary context switches.

``--coll-perf PATH``: in every round, rank 0 also runs the crate's ``coll-perf`` (nccl-tests'
interface, the same transport, sizes, iterations and rank count, spawning its own ranks) while our
ranks wait in a Gloo barrier (which sleeps: the CPU time the waiting ranks used meanwhile is
printed, so a spinning waiter would show); its best round is compared with ``rocecoll``'s and
``direct``'s: ratio and the difference in microseconds.

The load average (``os.getloadavg``) is printed before and after: figures taken at a load above
the CPU count say little. Run by hand (not a test); ``-e 16K --rounds 1`` is a quick check.
(nccl-tests' ``-b`` / ``-e`` names: torchrun would take ``--max`` for its own ``--max-restarts``.)
"""

import argparse
import datetime
import os
import re
import resource
import subprocess
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter")
# coll-perf's name of each op, and the column of its table with the time to compare (nccl-tests'
# layout: size count type redop root, then time algbw busbw #wrong out of place, then in place):
# all_reduce runs in place here, the gathers out of place.
COLL_PERF_OP = {"all_reduce": ("all-reduce", 9), "all_gather": ("all-gather", 5),
                "reduce_scatter": ("reduce-scatter", 5)}


def size_arg(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"size {s!r}: a number with an optional K, M or G")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]


def human(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def runner(op, nbytes, n, path, groups, comm):
    """(closure running one operation, closure running a barrier of the path's group, busbw
    factor, bytes counted)."""
    count = max(1, nbytes // 4)
    if path == "direct":
        barrier = comm.barrier
    else:
        group = groups[path]
        barrier = lambda: dist.barrier(group=group)  # noqa: E731
    if op == "all_reduce":
        buf = torch.ones(count)
        run = ((lambda: comm.all_reduce(buf)) if path == "direct"
               else (lambda: dist.all_reduce(buf, group=group)))
        return run, barrier, 2 * (n - 1) / n, count * 4
    per = max(1, count // n)
    if op == "all_gather":
        inp, out = torch.ones(per), torch.empty(per * n)
        run = ((lambda: comm.all_gather(out, inp)) if path == "direct"
               else (lambda: dist.all_gather_into_tensor(out, inp, group=group)))
        return run, barrier, (n - 1) / n, per * n * 4
    inp, out = torch.ones(per * n), torch.empty(per)
    run = ((lambda: comm.reduce_scatter(out, inp)) if path == "direct"
           else (lambda: dist.reduce_scatter_tensor(out, inp, group=group)))
    return run, barrier, (n - 1) / n, per * n * 4


def timed(run, barrier, iters, warmup):
    """(mean over the ranks of each rank's seconds per operation, the slowest rank's, (CPU
    seconds, voluntary and involuntary context switches) per operation of this process)."""
    for _ in range(warmup):
        run()
    barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    dt = (time.perf_counter() - t0) / iters
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    counts = ((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / iters,
              (r1.ru_nvcsw - r0.ru_nvcsw) / iters, (r1.ru_nivcsw - r0.ru_nivcsw) / iters)
    t = torch.tensor([dt, dt], dtype=torch.float64)
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)  # on the Gloo group: the same for every path
    times = [x[0].item() for x in everyone]
    return sum(times) / len(times), max(times), counts


def coll_perf(path, op, sizes, n, iters, warmup, transport):
    """{bytes: seconds per operation} from one coll-perf run (the column of COLL_PERF_OP)."""
    name, col = COLL_PERF_OP[op]
    cmd = [path, name, "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "4", "-n", str(iters),
           "-w", str(warmup), "-c", "0", "--ranks", str(n), "--transport", transport]
    # Without the launcher's variables (torchrun's RANK, WORLD_SIZE, ...), coll-perf starts its
    # own ranks instead of joining ours.
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items()
           if k not in launcher and not k.startswith(("TORCHELASTIC_", "OMPI_", "PMI", "SLURM_"))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    out = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) > col and f[0].isdigit():
            try:
                out[int(f[0])] = float(f[col]) * 1e-6
            except ValueError:
                pass
    return out, " ".join(cmd)


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("-b", "--minbytes", type=size_arg, default=1 << 10)
    ap.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--transport", default="shm", choices=["shm", "roce"])
    ap.add_argument("--coll-perf", default=None, help="path of coll-perf: also measure it")
    args = ap.parse_args()
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            ap.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    if not (1 <= args.rounds <= 100 and 1 <= args.iters <= 100_000 and args.factor >= 2):
        ap.error("--rounds 1..100, --iters 1..100000, --factor >= 2")

    os.environ["ROCECOLL_TRANSPORT"] = args.transport
    import rocecoll
    import rocecoll.torch_backend  # noqa: F401  (registers "rocecoll")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": None, "rocecoll": dist.new_group(list(range(n)), backend="rocecoll")}
    store = dist.PrefixStore("torch_busbw_direct", dist.distributed_c10d._get_default_store())
    comm = rocecoll.from_store(store, rank, n, transport=args.transport,
                               local_ip="127.0.0.1" if args.transport == "roce" else None,
                               timeout=600)
    sizes = []
    s = args.minbytes
    while s <= args.maxbytes:
        sizes.append(s)
        s *= args.factor
    if rank == 0:
        print(f"# {n} ranks, transport {args.transport}, {args.rounds} rounds of {args.iters} "
              f"iterations (+{args.warmup}); load average before: {load()}", flush=True)
    paths = ["gloo", "rocecoll", "direct"]
    best = {}
    cp_best = {}
    cp_cmds = {}
    idle_cpu = []  # (CPU seconds our ranks used while coll-perf ran, its wall seconds)
    for rnd in range(args.rounds):
        k = rnd % len(paths)
        order = paths[k:] + paths[:k]
        for op in ops:
            for nbytes in sizes:
                for path in order:
                    run, barrier, factor, counted = runner(op, nbytes, n, path, groups, comm)
                    t, tmax, counts = timed(run, barrier, args.iters, args.warmup)
                    key = (op, nbytes, path)
                    if key not in best or t < best[key][0]:
                        best[key] = (t, tmax, counts, factor, counted)
        if args.coll_perf:
            # Our ranks wait in a Gloo barrier while rank 0 runs coll-perf; their CPU time
            # meanwhile (rank 0's own process excluded from coll-perf's) shows whether they
            # take CPU from it.
            dist.barrier()
            c0, w0 = cpu_seconds(resource.RUSAGE_SELF), time.perf_counter()
            if rank == 0:
                for op in ops:
                    cp, cmd = coll_perf(args.coll_perf, op, sizes, n, args.iters, args.warmup,
                                        args.transport)
                    cp_cmds[op] = cmd
                    for nbytes, tc in cp.items():
                        if tc < cp_best.get((op, nbytes), float("inf")):
                            cp_best[(op, nbytes)] = tc
            dist.barrier()
            used = torch.tensor([cpu_seconds(resource.RUSAGE_SELF) - c0], dtype=torch.float64)
            dist.all_reduce(used)
            idle_cpu.append((used.item(), time.perf_counter() - w0))
    if rank == 0:
        print(f"# load average after: {load()}")
        print("op bytes gloo_us rocecoll_us gloo_busbw_GBps rocecoll_busbw_GBps rocecoll/gloo")
        for op in ops:
            for nbytes in sizes:
                tg, _, _, factor, counted = best[(op, nbytes, "gloo")]
                tr = best[(op, nbytes, "rocecoll")][0]
                bg, br = counted / tg * factor / 1e9, counted / tr * factor / 1e9
                print(f"{op} {human(nbytes)} {tg * 1e6:.1f} {tr * 1e6:.1f} {bg:.4g} {br:.4g} "
                      f"{br / bg:.2f}x", flush=True)
        print("# the binding's cost: per op us, the mean over the ranks (coll-perf's statistic) "
              "of the best round; rocecoll_max: the slowest rank's; cpu_us / vol / invol: rank "
              "0's CPU time and context switches per op in that round, for rocecoll / direct / "
              "gloo")
        print("op bytes coll_perf_us direct_us rocecoll_us rocecoll_max_us rocecoll/coll_perf "
              "extra_us rocecoll-direct_us cpu_us vol invol")
        for op in ops:
            if op in cp_cmds:
                print(f"# {cp_cmds[op]}")
            for nbytes in sizes:
                tr, trmax, cr, _, _ = best[(op, nbytes, "rocecoll")]
                td, _, cd, _, _ = best[(op, nbytes, "direct")]
                cg = best[(op, nbytes, "gloo")][2]
                tc = cp_best.get((op, nbytes))
                cp_cols = (f"{tc * 1e6:.1f}", f"{tr / tc:.2f}x", f"{(tr - tc) * 1e6:.1f}") \
                    if tc is not None else ("-", "-", "-")
                cpu = "/".join(f"{c[0] * 1e6:.1f}" for c in (cr, cd, cg))
                vol = "/".join(f"{c[1]:.2f}" for c in (cr, cd, cg))
                inv = "/".join(f"{c[2]:.2f}" for c in (cr, cd, cg))
                print(f"{op} {human(nbytes)} {cp_cols[0]} {td * 1e6:.1f} {tr * 1e6:.1f} "
                      f"{trmax * 1e6:.1f} {cp_cols[1]} {cp_cols[2]} {(tr - td) * 1e6:.1f} "
                      f"{cpu} {vol} {inv}", flush=True)
        if args.factor != 4 and args.coll_perf:
            print("# coll-perf ran with -f 4: sizes it skipped print '-'")
        for used, wall in idle_cpu:
            print(f"# while coll-perf ran ({wall:.1f} s), our {n} ranks used {used * 1e3:.1f} ms "
                  "of CPU (waiting in a Gloo barrier)")
        print(f"# rocecoll operations run on the calling thread: {groups['rocecoll']._c.inline_ops}"
              f"; load average at the end: {load()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
