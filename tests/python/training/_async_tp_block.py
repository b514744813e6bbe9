"""A small transformer block (RMSNorm, attention with Q/K/V/O projections, SwiGLU) under tensor
and sequence parallelism, for the async-TP pass's tests and bench/bench_training.py.

Two ways to shard it, as real training code does:

* ``"dtensor"``: ``parallelize_module`` with torch's SequenceParallel / PrepareModuleInput /
  ColwiseParallel / RowwiseParallel styles on a mesh over the group, activations [B, S, D] with
  the sequence (dim 1) sharded between the blocks;
* ``"funcol"``: the same block with the weights sliced by hand and the communication written with
  the functional collectives (all-gather of dim 1 before the column-parallel projections,
  reduce-scatter of dim 1 after the row-parallel ones), as plain-collective TP code writes it.

Both start from the same full weights (a fixed seed), so every plan and the one-process model
compute the same function.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

_all_gather_autograd = (getattr(funcol, "all_gather_single_autograd", None)
                        or funcol.all_gather_tensor_autograd)
_reduce_scatter_autograd = (getattr(funcol, "reduce_scatter_single_autograd", None)
                            or funcol.reduce_scatter_tensor_autograd)

# Tiny on purpose: torch.compile on two shared cores is what the tests pay for.
DIM, HEADS, HIDDEN = 16, 4, 32


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, bias):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = torch.nn.Linear(dim, dim, bias=bias)
        self.wk = torch.nn.Linear(dim, dim, bias=False)
        self.wv = torch.nn.Linear(dim, dim, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=bias)
        self.comm = None  # the funcol plan's (gather, scatter)

    def forward(self, x):
        if self.comm is not None:
            x = self.comm[0](x)
        B, S, _ = x.shape
        # -1: the heads of this rank (all of them in one process)
        q = self.wq(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.wo(o.transpose(1, 2).reshape(B, S, -1))
        return out if self.comm is None else self.comm[1](out)


class FeedForward(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)
        self.comm = None

    def forward(self, x):
        if self.comm is not None:
            x = self.comm[0](x)
        out = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out if self.comm is None else self.comm[1](out)


def _checkpoint(module, x):
    return torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False)


class Block(torch.nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, hidden=HIDDEN, bias=False):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads, bias)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.checkpointed = set()  # "attention" and/or "feed_forward"

    def forward(self, x):
        attn = _checkpoint if "attention" in self.checkpointed else (lambda m, t: m(t))
        ffn = _checkpoint if "feed_forward" in self.checkpointed else (lambda m, t: m(t))
        h = x + attn(self.attention, self.attention_norm(x))
        return h + ffn(self.feed_forward, self.ffn_norm(h))


class Model(torch.nn.Module):
    """``layers`` blocks. ``checkpointed`` lists what runs under activation checkpointing
    (non-reentrant: the backward recomputes its forward, communication included): a layer's
    index (the whole block) or "<index>.attention" / "<index>.feed_forward". The default, one
    block whose feed-forward is checkpointed and whose attention is not, has both kinds in one
    graph: torch.compile is what the tests pay for."""

    def __init__(self, layers=1, checkpointed=("0.feed_forward",), bias=False, **dims):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(bias=bias, **dims) for _ in range(layers))
        self.whole = set()
        for c in checkpointed:
            if isinstance(c, int):
                self.whole.add(c)
            else:
                i, part = c.split(".")
                self.layers[int(i)].checkpointed.add(part)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = _checkpoint(layer, x) if i in self.whole else layer(x)
        return x


def make_model(seed=0, **kw) -> Model:
    torch.manual_seed(seed)
    model = Model(**kw)
    with torch.no_grad():  # RMSNorm weights away from 1, so that their gradients matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _dtensor_plan(model: Model, group) -> Model:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = DeviceMesh.from_group(group, "cpu")
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)
    return model


def _funcol_plan(model: Model, group) -> Model:
    W, r = dist.get_world_size(group), dist.get_rank(group)

    def gather(x):
        return _all_gather_autograd(x.contiguous(), 1, group)

    def scatter(y):
        return _reduce_scatter_autograd(y.contiguous(), "sum", 1, group)

    def cols(lin):  # output features of this rank
        n = lin.out_features // W
        lin.weight = torch.nn.Parameter(lin.weight.detach()[r * n:(r + 1) * n].clone())
        if lin.bias is not None:
            lin.bias = torch.nn.Parameter(lin.bias.detach()[r * n:(r + 1) * n].clone())

    def rows(lin):  # input features of this rank; the bias added once (by rank 0)
        n = lin.in_features // W
        lin.weight = torch.nn.Parameter(lin.weight.detach()[:, r * n:(r + 1) * n].clone())
        if lin.bias is not None and r != 0:
            lin.bias = None

    for layer in model.layers:
        a, f = layer.attention, layer.feed_forward
        for lin in (a.wq, a.wk, a.wv, f.w1, f.w3):
            cols(lin)
        for lin in (a.wo, f.w2):
            rows(lin)
        a.comm = f.comm = (gather, scatter)
    return model


def make_tp_model(group, plan: str, **kw) -> Model:
    model = make_model(**kw)
    if plan == "dtensor":
        return _dtensor_plan(model, group)
    if plan == "funcol":
        return _funcol_plan(model, group)
    raise ValueError(f"plan must be 'dtensor' or 'funcol', got {plan!r}")


def full_grads(model: Model, plan: str, group) -> dict:
    """Every parameter's gradient as the one-process model's (gathered across ranks)."""
    W = dist.get_world_size(group)
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        if plan == "dtensor":
            out[n] = g.full_tensor() if hasattr(g, "full_tensor") else g
            continue
        if n.endswith("norm.weight"):  # replicated; each rank has its sequence shard's part
            g = g.clone()
            dist.all_reduce(g, group=group)
        elif n.split(".")[-2] in ("wq", "wk", "wv", "w1", "w3"):
            parts = [torch.empty_like(g) for _ in range(W)]
            dist.all_gather(parts, g.contiguous(), group=group)
            g = torch.cat(parts, 0)
        elif n.endswith("weight"):  # wo, w2
            parts = [torch.empty_like(g) for _ in range(W)]
            dist.all_gather(parts, g.contiguous(), group=group)
            g = torch.cat(parts, 1)
        out[n] = g
    return out
