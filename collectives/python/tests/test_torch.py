"""The torch.distributed backend "rocecoll", the DDP communication hook and the example trainer
(issue 20): every backend op against the expected tensors, unsupported ops named, and the
trainer under torchrun compared with Gloo (bitwise on 2 ranks, 1e-6 relative on 4), FSDP2
against DDP (loss curves within 1e-5). Skipped when torch is not installed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ranks

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
TRAIN = HERE.parent / "examples" / "train.py"


def backend_ops(rank, size, transport):
    import datetime

    import torch
    import torch.distributed as dist

    import rocecoll.torch_backend  # noqa: F401  (registers the backend)

    os.environ["ROCECOLL_TRANSPORT"] = transport
    dist.init_process_group("rocecoll", timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "rocecoll"
    bad = []

    def check(what, got, want):
        if not torch.equal(got, want):
            bad.append(f"{what}: {got} != {want}")

    r = float(rank)
    total = sum(range(size))
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int8, torch.uint8):
        t = torch.full((5,), r + 1, dtype=dt)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        check(f"all_reduce {dt}", t, torch.full((5,), total + size, dtype=dt))
        t = torch.full((3,), r, dtype=dt)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        check(f"all_reduce max {dt}", t, torch.full((3,), size - 1, dtype=dt))
    ts = [torch.full((4,), r), torch.full((2,), 2 * r)]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced 0", ts[0], torch.full((4,), float(total)))
    check("all_reduce_coalesced 1", ts[1], torch.full((2,), 2.0 * total))
    t = torch.full((6,), r)
    dist.broadcast(t, src=size - 1)
    check("broadcast", t, torch.full((6,), float(size - 1)))
    t = torch.full((6,), r + 1)
    dist.reduce(t, dst=0)
    if rank == 0:
        check("reduce", t, torch.full((6,), float(total + size)))
    outs = [torch.zeros(2, 3) for _ in range(size)]
    dist.all_gather(outs, torch.full((2, 3), r))
    for i, o in enumerate(outs):
        check(f"all_gather {i}", o, torch.full((2, 3), float(i)))
    out = torch.zeros(size * 4)
    dist.all_gather_into_tensor(out, torch.full((4,), r))
    check("all_gather_into_tensor", out, torch.arange(size).repeat_interleave(4).float())
    out = torch.zeros(3)
    dist.reduce_scatter(out, [torch.full((3,), r * 10 + j) for j in range(size)])
    check("reduce_scatter", out, torch.full((3,), float(10 * total + size * rank)))
    out = torch.zeros(2)
    inp = torch.cat([torch.full((2,), r * 10 + j) for j in range(size)])
    dist.reduce_scatter_tensor(out, inp)
    check("reduce_scatter_tensor", out, torch.full((2,), float(10 * total + size * rank)))
    out = torch.zeros(size * 2)
    inp = torch.cat([torch.full((2,), r * 10 + j) for j in range(size)])
    dist.all_to_all_single(out, inp)
    check("all_to_all_single", out,
          torch.cat([torch.full((2,), 10.0 * j + rank) for j in range(size)]))
    dist.barrier()
    peer = rank ^ 1
    if peer < size:
        got = torch.zeros(5)
        if rank % 2 == 0:
            dist.send(torch.full((5,), r), peer)
            dist.recv(got, peer)
        else:
            dist.recv(got, peer)
            dist.send(torch.full((5,), r), peer)
        check("send/recv", got, torch.full((5,), float(peer)))
    try:
        dist.gather(torch.zeros(1), [torch.zeros(1)] * size if rank == 0 else None, dst=0)
        bad.append("gather did not raise")
    except NotImplementedError as e:
        if "rocecoll backend: gather is not implemented" not in str(e):
            bad.append(f"gather: {e}")
    try:
        dist.all_to_all_single(torch.zeros(size + 1), torch.zeros(size + 1),
                               output_split_sizes=[2] + [1] * (size - 1),
                               input_split_sizes=[2] + [1] * (size - 1))
        bad.append("uneven all_to_all did not raise")
    except NotImplementedError as e:
        if "uneven splits" not in str(e):
            bad.append(f"alltoall_base: {e}")
    # A sub-group (new_group) is a second communicator bootstrapped through the store.
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        t = torch.full((3,), r + 1)
        dist.all_reduce(t, group=sub)
        check("new_group all_reduce", t, torch.full((3,), 3.0))
    dist.barrier()
    dist.destroy_process_group()
    return bad


@pytest.mark.parametrize("transport", ["shm", "roce"])
@pytest.mark.parametrize("size", [2, 4])
def test_backend_ops(size, transport):
    for bad in ranks.values(ranks.run(backend_ops, size, transport, timeout=300)):
        assert bad == [], "\n".join(bad)


def train(tmp_path, nproc, backend, mode, steps=50, order="native"):
    out = tmp_path / f"{backend}-{mode}-{nproc}-{order}.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", ROCECOLL_TRANSPORT="shm",
               ROCECOLL_SUM_ORDER=order)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(TRAIN), "--backend", backend, "--mode", mode,
           "--steps", str(steps), "--out", str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout}\n{p.stderr[-6000:]}"
    return torch.load(out, weights_only=True)


def assert_params(a, b, rel):
    """Bitwise equal parameters (rel == 0), or the whole model's relative L2 distance
    ||a - b|| / ||b|| (every parameter flattened into one vector) at most ``rel``."""
    assert a["params"].keys() == b["params"].keys()
    if rel == 0:
        for k in a["params"]:
            x, y = a["params"][k], b["params"][k]
            assert torch.equal(x, y), f"{k}: max diff {(x - y).abs().max().item()}"
        return
    x = torch.cat([a["params"][k].reshape(-1).double() for k in sorted(a["params"])])
    y = torch.cat([b["params"][k].reshape(-1).double() for k in sorted(b["params"])])
    err = ((x - y).norm() / y.norm()).item()
    per_tensor = {k: ((a["params"][k] - b["params"][k]).abs().max()
                      / b["params"][k].abs().max()).item() for k in a["params"]}
    print(f"relative L2 distance {err:.3g}; per tensor (max abs / max abs) {per_tensor}")
    assert err <= rel, f"relative L2 distance {err}; per tensor {per_tensor}"


def test_trainer_two_ranks_bitwise_equal_to_gloo(tmp_path):
    gloo = train(tmp_path, 2, "gloo", "ddp")
    ours = train(tmp_path, 2, "rocecoll", "ddp")
    hook = train(tmp_path, 2, "gloo", "hook")
    assert_params(ours, gloo, 0)
    assert_params(hook, gloo, 0)
    assert ours["losses"] == gloo["losses"]


def test_trainer_four_ranks_against_gloo(tmp_path):
    """With ROCECOLL_SUM_ORDER=gloo our all-reduces add in Gloo's ring order: the parameters
    are bitwise Gloo's, through the backend and through the comm hook. With the crate's own
    order (ring segments reduced from rank s+1 up, recursive doubling below 64 KiB) fp32 sums of
    four values round differently; after 50 steps the whole model's relative L2 distance is
    within 1e-6 (the issue's bound; measured 2026-12-04: see the README)."""
    gloo = train(tmp_path, 4, "gloo", "ddp")
    same = train(tmp_path, 4, "rocecoll", "ddp", order="gloo")
    same_hook = train(tmp_path, 4, "rocecoll", "hook", order="gloo")
    assert_params(same, gloo, 0)
    assert_params(same_hook, gloo, 0)
    assert same["losses"] == gloo["losses"]
    ours = train(tmp_path, 4, "rocecoll", "ddp")
    hook = train(tmp_path, 4, "rocecoll", "hook")
    assert_params(ours, gloo, 1e-6)
    assert_params(hook, gloo, 1e-6)


def test_fsdp2_matches_ddp_loss_curve(tmp_path):
    ddp = train(tmp_path, 2, "rocecoll", "ddp")
    fsdp = train(tmp_path, 2, "rocecoll", "fsdp")
    for k, (a, b) in enumerate(zip(fsdp["losses"], ddp["losses"])):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"step {k}: fsdp {a} ddp {b}"
