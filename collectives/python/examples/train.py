"""Example trainer: a small MLP on synthetic data with a fixed seed, data-parallel on CPU.

    torchrun --nproc-per-node 2 examples/train.py --backend rocecoll --mode ddp --out run.pt

--backend rocecoll|gloo   the torch.distributed backend of the default process group
--mode ddp                DistributedDataParallel with its built-in all-reduce
       hook               DDP with rocecoll's communication hook (rocecoll.torch_backend.
                          allreduce_hook) on a rocecoll communicator made from the job's store
       fsdp               FSDP2 (fully_shard on each layer and the root)
--steps N (50), --out FILE: rank 0 saves {"params": {name: tensor}, "losses": [...],
"step_s": [...]} (full parameters; FSDP2's are gathered).

Every rank draws its own batches from a generator seeded with (seed, rank, step), so a run is
reproducible and the ranks' gradients differ.
"""

import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def model_of(seed):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1)
    )


def batch(seed, rank, step, n=64):
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(n, 32, generator=g)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="rocecoll", choices=["rocecoll", "gloo"])
    ap.add_argument("--mode", default="ddp", choices=["ddp", "hook", "fsdp"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import rocecoll.torch_backend as rtb  # registers the "rocecoll" backend

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    model = model_of(args.seed)

    if args.mode == "fsdp":
        from torch.distributed._composable.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        net = model
    else:
        net = nn.parallel.DistributedDataParallel(model)
        if args.mode == "hook":
            import rocecoll

            store = dist.PrefixStore("rocecoll-hook/", dist.distributed_c10d._get_default_store())
            comm = rocecoll.from_store(store, rank, size, local_ip="127.0.0.1")
            net.register_comm_hook(comm, rtb.allreduce_hook)

    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    losses, step_s = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(args.seed, rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())

    params = {}
    for name, p in net.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        params[name.removeprefix("module.")] = t.detach().clone()
    # Every rank's loss, averaged: the job's loss curve.
    curve = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(curve)
    curve /= size
    if rank == 0:
        med = sorted(step_s)[len(step_s) // 2]
        print(f"{args.backend}/{args.mode} ranks={size} steps={args.steps} "
              f"final loss {curve[-1].item():.6f} median step {med * 1e3:.3f} ms")
        if args.out:
            torch.save({"params": params, "losses": curve.tolist(), "step_s": step_s}, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
