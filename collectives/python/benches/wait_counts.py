"""How the ranks wait, per small operation (issue 20): futex and sched_yield system calls, context
switches and CPU time per rank and operation, for a blocking all-reduce of ``--bytes`` (1 KiB) on
every rank of the job, through ``coll-perf`` (the crate alone), the package's direct API
(``rocecoll.Comm``), ``torch.distributed`` with our backend and with Gloo. Counts, not times:
they hold on a loaded machine, where wall-clock times do not.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 \\
        collectives/python/benches/wait_counts.py [--coll-perf target/release/coll-perf] \\
        [--bytes 1024] [--ops 2000] [--transport shm|roce]

Rank 0 attaches ``perf stat -e syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,
context-switches,task-clock`` to every rank's process (all threads) for the ``--ops`` timed
operations of each path (after 50 warm-up operations and a Gloo barrier; the attach happens
before the barrier, so the counts also hold the barrier's exit); ``coll-perf``'s counts are of its
whole run with the same ``-n`` (its setup included: a few hundred system calls). The shm
transport's wait (``collectives/src/transport/wait.rs``) polls, yields, then sleeps on a futex
that the poster wakes: futex calls per operation count the sleeps and their wake-ups. Without
``perf`` (or with ``kernel.perf_event_paranoid`` too high) only the getrusage counts print.
Run by hand, not a test.
"""

import argparse
import datetime
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist

EVENTS = "syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,context-switches,task-clock"
NAMES = ("futex", "yield", "switches", "task-clock")


def parse_perf(path):
    """{name: value} from ``perf stat -x,`` output (task-clock in ms)."""
    out = {}
    with open(path) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) > 2 and not line.startswith("#"):
                for name, event in zip(NAMES, EVENTS.split(",")):
                    if fields[2] == event:
                        try:
                            out[name] = float(fields[0])
                        except ValueError:
                            pass
    return out


def launcher_free_env():
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
    return {k: v for k, v in os.environ.items()
            if k not in drop and not k.startswith(("TORCHELASTIC_", "OMPI_", "PMI", "SLURM_"))}


def row(name, per_rank_ops, counts, extra=""):
    if not counts:
        print(f"{name} - - - - {extra}".rstrip())
        return
    c = {k: counts.get(k, float("nan")) / per_rank_ops for k in NAMES}
    print(f"{name} {c['futex']:.3f} {c['yield']:.3f} {c['switches']:.3f} "
          f"{c['task-clock'] * 1e3:.1f} {extra}".rstrip(), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--transport", default="shm", choices=["shm", "roce"])
    ap.add_argument("--coll-perf", default=None, help="path of coll-perf (else that path is skipped)")
    a = ap.parse_args()
    if not (4 <= a.bytes <= 1 << 30 and 1 <= a.ops <= 1_000_000):
        ap.error("--bytes 4..1G, --ops 1..1000000")

    os.environ["ROCECOLL_TRANSPORT"] = a.transport
    import rocecoll
    import rocecoll.torch_backend  # noqa: F401  (registers "rocecoll")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    ours = dist.new_group(list(range(n)), backend="rocecoll")
    store = dist.PrefixStore("wait_counts_direct", dist.distributed_c10d._get_default_store())
    comm = rocecoll.from_store(store, rank, n, transport=a.transport,
                               local_ip="127.0.0.1" if a.transport == "roce" else None,
                               timeout=120)
    buf = torch.ones(max(1, a.bytes // 4))
    runs = {
        "direct": lambda: comm.all_reduce(buf),
        "torch-rocecoll": lambda: dist.all_reduce(buf, group=ours),
        "torch-gloo": lambda: dist.all_reduce(buf),
    }
    pids = [None] * n
    dist.all_gather_object(pids, os.getpid())
    perf = shutil.which("perf") if rank == 0 else None
    tmp = tempfile.mkdtemp(prefix="wait_counts_") if rank == 0 else None
    if rank == 0:
        print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {n} ranks, "
              f"transport {a.transport}, all_reduce of {a.bytes} B, {a.ops} ops per path")
        print("path futex/op yield/op switches/op cpu_us/op (per rank and op: every rank's "
              "process, all threads) [rank 0 getrusage: cpu_us voluntary involuntary]")
        if a.coll_perf:
            out = os.path.join(tmp, "coll-perf.txt")
            cmd = [a.coll_perf, "all-reduce", "-b", str(a.bytes), "-e", str(a.bytes), "-n",
                   str(a.ops), "-w", "50", "-c", "0", "--ranks", str(n), "--transport", a.transport]
            if perf:
                cmd = [perf, "stat", "-e", EVENTS, "-x,", "-o", out, "--"] + cmd
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                               env=launcher_free_env())
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
            # coll-perf runs each size out of place and in place: 2 * ops timed, 2 * 50 warm-up.
            row("coll-perf", 2 * (a.ops + 50), parse_perf(out) if perf else {},
                "(whole run, setup included)")
    for path, run in runs.items():
        for _ in range(50):
            run()
        prof, out = None, None
        if perf:
            out = os.path.join(tmp, f"{path}.txt")
            prof = subprocess.Popen([perf, "stat", "-e", EVENTS, "-x,", "-o", out, "-p",
                                     ",".join(map(str, pids))],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # perf attaches (bounded: one second)
        dist.barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(a.ops):
            run()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        dist.barrier()
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait(60)
        if rank == 0:
            own = (f"[{(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / a.ops * 1e6:.1f} "
                   f"{(r1.ru_nvcsw - r0.ru_nvcsw) / a.ops:.2f} "
                   f"{(r1.ru_nivcsw - r0.ru_nivcsw) / a.ops:.2f}]")
            row(path, n * a.ops, parse_perf(out) if perf else {}, own)
    if rank == 0:
        print(f"# torch-rocecoll operations run on the calling thread: {ours._c.inline_ops}; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
