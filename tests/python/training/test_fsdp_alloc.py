"""FSDP2 on the symmetric heap (issue 38, point 3; NOTE [Process-group allocation for FSDP2] in
backend/symmetric_memory.cpp): with model.set_allocate_memory_from_process_group_for_comm(True)
FSDP2 takes its all-gather and reduce-scatter buffers from the backend's allocate_tensor, which
puts them in the group's symmetric heap, so its collectives run zero-copy. Training must equal
the same training with the switch off and on a Gloo group; the counters must show the heap
allocations and the zero-copy collectives."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import cuda_p2p
from _groups import cached_group

STEPS = 3
# Odd sizes: the shards are padded (dim 0 of 13 on 2, 3, 4 ranks) and the all-gathers of the
# layers have different lengths.
D_IN, D_HID, D_OUT = 7, 13, 5



def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_HID), nn.Tanh(),
                         nn.Linear(D_HID, D_OUT))


def _counters(group):
    return dict(cuda_p2p.get_cuda_p2p_backend(group).get_counters())


def fsdp_train(ctx, where, switch):
    """Trains an FSDP2 MLP (each Linear and the root fully_shard'ed) for STEPS steps on the group
    `where` names; returns the losses, the full parameters and what the counters gained."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    # The direct reduce-scatter, as the zero-copy one: the same kernel in the same rank order, so
    # the switch changes no bit (auto would pick the ring for these small sizes).
    group = ctx.gloo if where == "gloo" else cached_group((where,), zero_copy_agreement=where,
                                                     reduce_scatter_algo="direct")
    mesh = DeviceMesh.from_group(group, "cpu")
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # Per FSDP module: each Linear has its own parameter group (the root has none).
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_allocate_memory_from_process_group_for_comm(switch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = _counters(group) if where != "gloo" else {}
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + ctx.rank)
        x, y = torch.randn(6, D_IN, generator=g), torch.randn(6, D_OUT, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    after = _counters(group) if where != "gloo" else {}
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    gained = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return {"losses": losses, "params": params, "counters": gained}


def _assert_equal_training(got, ref, W, what, exact):
    for r in range(W):
        for i, (p, q) in enumerate(zip(got[r]["params"], ref[r]["params"])):
            if exact:
                assert torch.equal(p, q), f"rank {r} param {i}: {what}"
            else:
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"rank {r} param {i}: {what}: {m}")
        for s, (a, b) in enumerate(zip(got[r]["losses"], ref[r]["losses"])):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {r} step {s} loss: {what}: {m}")


@pytest.mark.parametrize("where", ["exchange", "signature"])
def test_fsdp2_trains_on_the_heap(any_world, where):
    W = any_world.size
    on = any_world.run(fsdp_train, where, True)
    off = any_world.run(fsdp_train, where, False)
    ref = any_world.run(fsdp_train, "gloo", False)
    init = [p.detach() for p in _model().parameters()]
    # The zero-copy reduce-scatter reduces with the staged one's kernel in rank order: the same
    # bits. Gloo sums in its own order: equal up to float32 rounding (the same order on 2 ranks).
    _assert_equal_training(on, off, W, "switch on differs from switch off", exact=True)
    _assert_equal_training(on, ref, W, "cuda_p2p differs from gloo", exact=W == 2)
    for i, (p, p0) in enumerate(zip(on[0]["params"], init)):
        assert not torch.equal(p, p0), f"param {i} did not train"
    for r in range(W):
        c_on, c_off = on[r]["counters"], off[r]["counters"]
        # Per step: one all-gather per Linear forward and backward (the root holds no
        # parameters of its own), one reduce-scatter per Linear.
        assert c_on.get("all_gather.zero_copy", 0) >= STEPS * 3, f"rank {r}: {c_on}"
        assert c_on.get("reduce_scatter.zero_copy", 0) == STEPS * 3, f"rank {r}: {c_on}"
        assert c_on.get("allocate_tensor.heap", 0) > 0, f"rank {r}: {c_on}"
        assert "allocate_tensor.fallback" not in c_on, f"rank {r}: {c_on}"
        assert not any(k.endswith(".wrapped") for k in c_on), f"rank {r}: {c_on}"
        assert not any(k.endswith(".zero_copy") or k.startswith("allocate_tensor")
                       for k in c_off), f"rank {r}, switch off: {c_off}"
        assert c_off.get("reduce_scatter.direct", 0) == STEPS * 3, f"rank {r}: {c_off}"


def alloc_api(ctx):
    """What supports_tensor_alloc answers, what allocate_tensor gives, its fallback and errors."""
    out = {}
    world = dist.group.WORLD
    cpu = torch.device("cpu")
    b = cuda_p2p.get_cuda_p2p_backend(world)
    fsdp_view = world._get_backend(cpu)  # what FSDP2's ProcessGroupAllocMixin calls
    out["fsdp_sees_ours"] = isinstance(fsdp_view, cuda_p2p.ProcessGroupCudaP2P)
    out["supports_cpu"] = fsdp_view.supports_tensor_alloc(cpu)
    out["supports_cuda"] = b.supports_tensor_alloc(torch.device("cuda", 0))
    t = fsdp_view.allocate_tensor(1001, dtype=torch.bfloat16, device=cpu)
    out["tensor"] = (tuple(t.shape), t.dtype, t.device.type, b.symmetric_offset(t) >= 0)
    off = cached_group(("off",), zero_copy_agreement="off")
    out["supports_off"] = cuda_p2p.get_cuda_p2p_backend(off).supports_tensor_alloc(cpu)
    nows = cached_group(("nows",), workspace_collectives=False)
    out["supports_no_collectives"] = cuda_p2p.get_cuda_p2p_backend(nows).supports_tensor_alloc(cpu)
    errors = {}
    for name, call in [
        ("off", lambda: cuda_p2p.get_cuda_p2p_backend(off).allocate_tensor(
            4, dtype=torch.float32, device=cpu)),
        ("negative", lambda: b.allocate_tensor(-1, dtype=torch.float32, device=cpu)),
        ("cuda", lambda: b.allocate_tensor(4, dtype=torch.float32, device=torch.device("cuda"))),
    ]:
        try:
            call()
            errors[name] = None
        except (RuntimeError, ValueError) as e:
            errors[name] = (type(e).__name__, str(e).split("\n")[0])
    out["errors"] = errors
    # A heap of 64 KiB: 8 KiB fit, 128 KiB do not - an ordinary tensor, counted.
    small = cached_group(("small",), symmetric_heap_size=64 << 10)
    sb = cuda_p2p.get_cuda_p2p_backend(small)
    fit = sb.allocate_tensor(2048, dtype=torch.float32, device=cpu)
    big = sb.allocate_tensor(32 << 10, dtype=torch.float32, device=cpu)
    out["small"] = (sb.symmetric_offset(fit) >= 0, sb.symmetric_offset(big), tuple(big.shape),
                    {k: v for k, v in _counters(small).items() if k.startswith("allocate_tensor")})
    # The fallback tensor still works as a collective input (it stages): a reduce-scatter of it.
    big.copy_(torch.arange(32 << 10, dtype=torch.float32) * (ctx.rank + 1))
    res = torch.empty((32 << 10) // ctx.world_size)
    dist.reduce_scatter_tensor(res, big, group=small)
    n = res.numel()
    want = torch.arange(ctx.rank * n, (ctx.rank + 1) * n, dtype=torch.float32) * sum(
        range(1, ctx.world_size + 1))
    out["fallback_result"] = torch.equal(res, want)
    return out


def test_allocate_tensor_api(world2):
    for r, out in enumerate(world2.run(alloc_api)):
        assert out["fsdp_sees_ours"], f"rank {r}"
        assert out["supports_cpu"] and not out["supports_cuda"], f"rank {r}: {out}"
        assert out["tensor"] == ((1001,), torch.bfloat16, "cpu", True), f"rank {r}: {out}"
        assert not out["supports_off"] and not out["supports_no_collectives"], f"rank {r}: {out}"
        e = out["errors"]
        assert e["off"] and e["off"][0] == "RuntimeError" and "supports_tensor_alloc is false" in \
            e["off"][1], f"rank {r}: {e}"
        assert e["negative"] and e["negative"][0] == "ValueError" and "size >= 0" in \
            e["negative"][1], f"rank {r}: {e}"
        assert e["cuda"] and e["cuda"][0] == "ValueError" and "expected device cpu" in \
            e["cuda"][1], f"rank {r}: {e}"
        fits, big_offset, big_shape, counted = out["small"]
        assert fits and big_offset == -1 and big_shape == (32 << 10,), f"rank {r}: {out}"
        assert counted == {"allocate_tensor.heap": 1, "allocate_tensor.fallback": 1}, \
            f"rank {r}: {counted}"
        assert out["fallback_result"], f"rank {r}"
