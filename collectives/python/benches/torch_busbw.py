"""torch.distributed all_reduce / all_gather_into_tensor / reduce_scatter_tensor bus bandwidth,
our backend ("rocecoll") against Gloo in one job, interleaved, best of rounds (issue 20).

    torchrun --standalone --nproc-per-node 4 collectives/python/benches/torch_busbw.py \\
        [--ops all_reduce,all_gather,reduce_scatter] [-b 1K] [-e 64M] [--rounds 3] \\
        [--iters 20] [--warmup 3] [--transport shm|roce] [--coll-perf target/release/coll-perf]

The default process group is Gloo's; a second group over the same ranks is ours
(``new_group(backend="rocecoll")``, transport ``--transport``). For each round, size and op the
two backends run back to back (which goes first alternates between rounds), so both see the same
load; each keeps its best (smallest) time over the rounds. Time of one size: ``--iters``
operations after ``--warmup``, between two barriers, the slowest rank's. busbw is nccl-tests'
(doc/PERFORMANCE.md): bytes / time * 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
reduce-scatter, bytes = the larger buffer; f32, all_reduce in place, the gathers out of place.

``--coll-perf PATH``: afterwards rank 0 runs the crate's ``coll-perf`` (nccl-tests' interface, the
same transport, sizes, iterations and rank count, spawning its own ranks) and prints the binding's
cost: our torch.distributed time / coll-perf's time and the difference in microseconds.

The load average (``os.getloadavg``) is printed before and after: figures taken at a load above
the CPU count say little. Run by hand (not a test); ``-e 16K --rounds 1`` is a quick check.
(nccl-tests' ``-b`` / ``-e`` names: torchrun would take ``--max`` for its own ``--max-restarts``.)
"""

import argparse
import datetime
import os
import re
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


def runner(op, nbytes, n, group):
    """(closure running one operation, busbw factor, bytes counted)."""
    count = max(1, nbytes // 4)
    if op == "all_reduce":
        buf = torch.ones(count)
        return (lambda: dist.all_reduce(buf, group=group)), 2 * (n - 1) / n, count * 4
    per = max(1, count // n)
    if op == "all_gather":
        inp, out = torch.ones(per), torch.empty(per * n)
        return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), (n - 1) / n, per * n * 4
    inp, out = torch.ones(per * n), torch.empty(per)
    return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), (n - 1) / n, per * n * 4


def timed(run, group, iters, warmup):
    """Seconds per operation, the slowest rank's."""
    for _ in range(warmup):
        run()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # on the Gloo group: the same for both
    return t.item()


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
    import rocecoll.torch_backend  # noqa: F401  (registers "rocecoll")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": None, "rocecoll": dist.new_group(list(range(n)), backend="rocecoll")}
    sizes = []
    s = args.minbytes
    while s <= args.maxbytes:
        sizes.append(s)
        s *= args.factor
    if rank == 0:
        print(f"# {n} ranks, transport {args.transport}, {args.rounds} rounds of {args.iters} "
              f"iterations (+{args.warmup}); load average before: {load()}", flush=True)
    best = {}
    for rnd in range(args.rounds):
        order = ["gloo", "rocecoll"] if rnd % 2 == 0 else ["rocecoll", "gloo"]
        for op in ops:
            for nbytes in sizes:
                for backend in order:
                    run, factor, counted = runner(op, nbytes, n, groups[backend])
                    t = timed(run, groups[backend], args.iters, args.warmup)
                    key = (op, nbytes, backend)
                    if key not in best or t < best[key][0]:
                        best[key] = (t, factor, counted)
    if rank == 0:
        print(f"# load average after: {load()}")
        print("op bytes gloo_us rocecoll_us gloo_busbw_GBps rocecoll_busbw_GBps rocecoll/gloo")
        for op in ops:
            for nbytes in sizes:
                tg, factor, counted = best[(op, nbytes, "gloo")]
                tr, _, _ = best[(op, nbytes, "rocecoll")]
                bg, br = counted / tg * factor / 1e9, counted / tr * factor / 1e9
                print(f"{op} {human(nbytes)} {tg * 1e6:.1f} {tr * 1e6:.1f} {bg:.4g} {br:.4g} "
                      f"{br / bg:.2f}x", flush=True)
    dist.destroy_process_group()
    if rank == 0 and args.coll_perf:
        print("# the binding's cost: rocecoll through torch.distributed against coll-perf "
              f"(one run of it, after the rounds; load average {load()})")
        print("op bytes coll_perf_us torch_rocecoll_us ratio extra_us")
        for op in ops:
            cp, cmd = coll_perf(args.coll_perf, op, sizes, n, args.iters, args.warmup,
                                args.transport)
            if args.factor != 4:
                print("# coll-perf ran with -f 4: sizes it skipped print '-'")
            print(f"# {cmd}")
            for nbytes in sizes:
                tr = best[(op, nbytes, "rocecoll")][0]
                tc = cp.get(nbytes)
                if tc is None:
                    print(f"{op} {human(nbytes)} - {tr * 1e6:.1f} - -")
                    continue
                print(f"{op} {human(nbytes)} {tc * 1e6:.1f} {tr * 1e6:.1f} {tr / tc:.2f}x "
                      f"{(tr - tc) * 1e6:.1f}", flush=True)
        print(f"# load average at the end: {load()}")


if __name__ == "__main__":
    main()
