"""torch.distributed all_reduce / all_gather_into_tensor / reduce_scatter_tensor bus bandwidth
through a backend, nccl-tests' definition (busbw = bytes / time * 2(n-1)/n for all-reduce,
(n-1)/n for all-gather and reduce-scatter; bytes = the larger buffer), f32, out of place for
the gathers, in place for all_reduce; time averaged over --iters after --warmup, max over ranks.

    torchrun --nproc-per-node 4 benches/torch_busbw.py --backend rocecoll|gloo [--ops all_reduce]

Prints one line per (op, size): "op bytes time_us busbw_GBps". Run by hand (not a test).
"""

import argparse
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="rocecoll")
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--min", type=int, default=1 << 10)
    ap.add_argument("--max", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import rocecoll.torch_backend  # noqa: F401

    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    size = args.min
    sizes = []
    while size <= args.max:
        sizes.append(size)
        size *= args.factor
    for op in args.ops.split(","):
        for nbytes in sizes:
            count = nbytes // 4
            if op == "all_reduce":
                buf = torch.ones(count)
                run = lambda: dist.all_reduce(buf)  # noqa: E731
                factor = 2 * (n - 1) / n
            elif op == "all_gather":
                inp, out = torch.ones(count // n), torch.empty(count // n * n)
                run = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
                factor = (n - 1) / n
            else:
                inp, out = torch.ones(count // n * n), torch.empty(count // n)
                run = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
                factor = (n - 1) / n
            for _ in range(args.warmup):
                run()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                run()
            dt = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if rank == 0:
                t = dt.item()
                print(f"{args.backend} {op} {nbytes} {t * 1e6:.1f} {nbytes / t * factor / 1e9:.3f}",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
