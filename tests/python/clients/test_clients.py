"""Real clients of a process group on cuda_p2p: DistributedDataParallel (with and without a comm
hook), a DTensor tensor-parallel MLP on a "cpu" DeviceMesh, and functional collectives."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import cuda_p2p

STEPS = 4
BATCH = 6  # per rank
D_IN, D_HID, D_OUT = 10, 48, 5


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_HID), nn.Tanh(),
                         nn.Linear(D_HID, D_OUT))


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


def ddp_train(ctx, backend, hook):
    """Trains a DDP MLP for STEPS steps on `backend`'s group; returns the final parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dist.group.WORLD if backend == "cuda_p2p" else ctx.gloo
    if cuda_p2p.is_cuda_p2p_group(group) != (backend == "cuda_p2p"):
        raise AssertionError(f"group for {backend} has the wrong backend")
    # Every rank starts from other weights: DDP must broadcast rank 0's at construction.
    model = _mlp(seed=ctx.rank)
    # Small buckets: several allreduces in flight per step.
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.004)
    if hook:
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(step, ctx.rank)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def single_process_reference(world_size):
    """The same training in one process: rank 0's weights, the whole global batch."""
    model = _mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        xs, ys = zip(*(_batch(step, r) for r in range(world_size)))
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("hook", [False, True], ids=["builtin_allreduce", "allreduce_hook"])
def test_ddp_matches_gloo(world, hook):
    got = world.run(ddp_train, "cuda_p2p", hook)
    ref = world.run(ddp_train, "gloo", hook)
    expected = single_process_reference(world.size)
    init = [p.detach() for p in _mlp(seed=0).parameters()]
    for r in range(world.size):
        for i, (p, q) in enumerate(zip(got[r], ref[r])):
            # The workspace all-reduce sums in rank order, Gloo in its own order: equal up to
            # float32 rounding (bit-identical on 2 ranks, where both orders are the same).
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6,
                                       msg=f"rank {r} param {i}: cuda_p2p differs from gloo")
            if world.size == 2:
                assert torch.equal(p, q), f"rank {r} param {i}: cuda_p2p differs from gloo"
            torch.testing.assert_close(p, got[0][i], rtol=0, atol=0, msg=f"rank {r} != rank 0")
        for i, (p, e, p0) in enumerate(zip(got[r], expected, init)):
            torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6, msg=f"param {i} vs 1 process")
            assert not torch.equal(p, p0), f"param {i} did not train"


# ---------------------------------------------------------------------------------------------
# DTensor tensor parallelism


def tp_mlp(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    W = ctx.world_size
    mesh = init_device_mesh("cpu", (W,))
    if not cuda_p2p.is_cuda_p2p_group(mesh.get_group()):
        raise AssertionError("the mesh's group is not on cuda_p2p")

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(D_IN, 8 * W), nn.GELU(), nn.Linear(8 * W, D_IN))
    model = copy.deepcopy(ref)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    w0 = model[0].weight
    if not (isinstance(w0, DTensor) and w0.to_local().shape == (8, D_IN)):
        raise AssertionError(f"layer 0 is not sharded by rows: {type(w0)} {w0.to_local().shape}")

    x = torch.randn(7, D_IN, generator=torch.Generator().manual_seed(5))  # same on every rank
    out = model(x)
    (out * out).sum().backward()

    y = ref(x)
    (y * y).sum().backward()
    res = {"out": (out.full_tensor() if isinstance(out, DTensor) else out).detach(),
           "ref_out": y.detach()}
    res["grads"] = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    res["ref_grads"] = {n: p.grad for n, p in ref.named_parameters()}
    res["local_grad_shape"] = tuple(model[0].weight.grad.to_local().shape)
    return res


def test_dtensor_tensor_parallel_mlp(world):
    for r, res in enumerate(world.run(tp_mlp)):
        torch.testing.assert_close(res["out"], res["ref_out"], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"rank {r} forward: {m}")
        assert res["local_grad_shape"] == (8, D_IN)
        assert set(res["grads"]) == set(res["ref_grads"])
        for name, g in res["grads"].items():
            torch.testing.assert_close(g, res["ref_grads"][name], rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"rank {r} grad of {name}: {m}")


# ---------------------------------------------------------------------------------------------
# functional collectives


def functional_collectives(ctx, dtype_name, via):
    import warnings

    import torch.distributed._functional_collectives as funcol

    warnings.filterwarnings("ignore", category=FutureWarning)  # the deprecated names, on purpose

    dtype = {"float32": torch.float32, "int64": torch.int64}[dtype_name]
    W, rank = ctx.world_size, ctx.rank
    if via == "group":
        group = dist.group.WORLD
    else:
        from torch.distributed.device_mesh import init_device_mesh

        group = init_device_mesh("cpu", (W,))
        if not cuda_p2p.is_cuda_p2p_group(group.get_group()):
            raise AssertionError("the mesh's group is not on cuda_p2p")

    def inp(r, n=6):
        return (torch.arange(n * W) * (r + 1) - 3 * r).to(dtype).reshape(W, n)

    def _w(t):  # AsyncCollectiveTensor, or a plain tensor when funcol already had to wait
        return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t

    everyone = [inp(r) for r in range(W)]
    out = {}
    out["all_reduce_sum"] = (_w(funcol.all_reduce(inp(rank), "sum", group)),
                             torch.stack(everyone).sum(0))
    out["all_reduce_max"] = (_w(funcol.all_reduce(inp(rank), "max", group)),
                             torch.stack(everyone).amax(0))
    out["all_gather_tensor_dim0"] = (_w(funcol.all_gather_tensor(inp(rank), 0, group)),
                                     torch.cat(everyone, 0))
    out["all_gather_tensor_dim1"] = (_w(funcol.all_gather_tensor(inp(rank), 1, group)),
                                     torch.cat(everyone, 1))
    out["reduce_scatter_tensor_dim0"] = (
        _w(funcol.reduce_scatter_tensor(inp(rank), "sum", 0, group)),
        torch.stack(everyone).sum(0)[rank : rank + 1],
    )
    out["reduce_scatter_tensor_dim1"] = (
        _w(funcol.reduce_scatter_tensor(inp(rank, n=2 * W), "sum", 1, group)),
        torch.stack([inp(r, n=2 * W) for r in range(W)]).sum(0)[:, 2 * rank : 2 * rank + 2],
    )
    out["all_to_all_single"] = (
        _w(funcol.all_to_all_single(inp(rank).reshape(-1), None, None, group)),
        torch.cat([everyone[j].reshape(-1).chunk(W)[rank] for j in range(W)]),
    )
    # torch 2.14's names for the same two (the ones above are deprecated aliases)
    if hasattr(funcol, "all_gather_single"):
        out["all_gather_single_dim1"] = (_w(funcol.all_gather_single(inp(rank), 1, group)),
                                         torch.cat(everyone, 1))
        out["reduce_scatter_single_dim0"] = (
            _w(funcol.reduce_scatter_single(inp(rank), "sum", 0, group)),
            torch.stack(everyone).sum(0)[rank : rank + 1],
        )
    # In a compiled-style chain: the result of one feeds the next without an explicit wait.
    s = funcol.all_reduce(inp(rank), "sum", group)
    out["chained"] = (_w(funcol.all_gather_tensor(s * 2, 0, group)),
                      torch.cat([torch.stack(everyone).sum(0) * 2] * W))
    return out


@pytest.mark.parametrize("via", ["group", "mesh"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_functional_collectives(world, dtype, via):
    for r, res in enumerate(world.run(functional_collectives, dtype, via)):
        for name, (got, want) in res.items():
            assert got.dtype == want.dtype and got.shape == want.shape, (
                f"rank {r} {name}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
            )
            assert torch.equal(got, want), f"rank {r} {name}:\n{got}\nexpected\n{want}"
