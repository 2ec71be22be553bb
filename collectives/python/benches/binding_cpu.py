"""CPU time per small all-reduce in each layer of the binding, on one rank (issue 20): no peer
to wait for, so what is measured is the layers' own work, and CPU time (getrusage user + system,
every thread of the process) rather than wall time, which a loaded machine inflates. Printed per
layer: wall and CPU microseconds per op and voluntary context switches per op (a thread hand-off
costs at least one).

    python collectives/python/benches/binding_cpu.py [--ops 20000] [--bytes 1024]

Layers: the native communicator with a prepared memoryview (inline, and through the progress
thread), ``rocecoll.as_bytes`` / ``_arg`` of a tensor (the argument conversion), the direct API
``Comm.all_reduce(tensor)``, ``dist.all_reduce`` through our backend (blocking: inline; and
``async_op=True`` then ``wait()``), ``dist.all_gather_into_tensor`` and
``dist.reduce_scatter_tensor`` through it (blocking), and Gloo's ``dist.all_reduce`` on its own one-rank group.
The load average is printed before and after. Run by hand, not a test.
"""

import argparse
import datetime
import os
import resource
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=1024)
    a = ap.parse_args()
    if not (1 <= a.ops <= 10_000_000 and 4 <= a.bytes <= 1 << 30):
        ap.error("--ops 1..10000000, --bytes 4..1G")
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()), ROCECOLL_TRANSPORT="shm")
    import torch
    import torch.distributed as dist

    import rocecoll
    import rocecoll.torch_backend  # noqa: F401  (registers "rocecoll")

    dist.init_process_group("rocecoll", timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    c = pg._c
    gloo = dist.new_group([0], backend="gloo")
    t = torch.ones(a.bytes // 4)
    b, dt = rocecoll.as_bytes(t)
    comm = rocecoll.Comm(c)
    print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; 1 rank, "
          f"all_reduce of {a.bytes} B float32, {a.ops} ops per layer")
    print("layer wall_us cpu_us voluntary/op")

    def bench(name, f):
        for _ in range(min(a.ops, 500)):
            f()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _ in range(a.ops):
            f()
        t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        print(f"{name} {(t1 - t0) / a.ops * 1e6:.2f} {cpu / a.ops * 1e6:.2f} "
              f"{(r1.ru_nvcsw - r0.ru_nvcsw) / a.ops:.3f}", flush=True)

    bench("native-inline", lambda: c.all_reduce(b, dt, "sum", None, True).wait())
    bench("native-progress-thread", lambda: c.all_reduce(b, dt, "sum", None, False).wait())
    bench("as_bytes(tensor)", lambda: rocecoll.as_bytes(t))
    bench("_arg(tensor)", lambda: rocecoll._arg(t))
    bench("Comm.all_reduce(tensor)", lambda: comm.all_reduce(t))
    bench("dist.all_reduce-rocecoll", lambda: dist.all_reduce(t))
    out = torch.empty(t.numel())  # one rank: the gathered / scattered block is the input's size
    bench("dist.all_gather_into_tensor-rocecoll", lambda: dist.all_gather_into_tensor(out, t))
    bench("dist.reduce_scatter_tensor-rocecoll", lambda: dist.reduce_scatter_tensor(out, t))
    bench("dist.all_reduce-rocecoll-async-wait", lambda: dist.all_reduce(t, async_op=True).wait())
    bench("dist.all_reduce-gloo", lambda: dist.all_reduce(t, group=gloo))
    print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
