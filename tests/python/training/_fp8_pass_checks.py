"""The async-TP pass on a small fp8 tensor- and sequence-parallel MLP (rank side).

``Fp8ColwiseLinear`` / ``Fp8RowwiseLinear`` are Float8-style linears written here (torchao is not
required, and none of its code is used): they emit the graph torchao's Float8Linear emits under
TP with float8 all-gather - a float8 cast with a scale (``(x * scale).clamp(...).to(float8)``,
the inverse scale handed to the GEMM), functional collectives moving the fp8 tensor, and
``_scaled_mm(a_fp8, w_fp8.t(), scale_a, scale_b, out_dtype=...)`` - in the forward and in their
custom backward (torch has no derivative for ``_scaled_mm``; torchao's backward calls it itself):

* column-parallel (sequence-parallel input): the input shard is cast (tensorwise: its amax
  all-reduced, so every rank has one scale; rowwise: each row its own), all-gathered in fp8 with
  its rowwise scales, multiplied by the weight shard. Backward: the output gradient cast rowwise
  (float8_e5m2), ``_scaled_mm`` with the weight, reduce-scattered; the weight gradient from the
  gathered fp8 input, dequantised.
* row-parallel: the local input cast, ``_scaled_mm``, reduce-scattered. Backward: the gradient
  shard cast and all-gathered in fp8 (with its scales), ``_scaled_mm`` with the weight.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import cuda_p2p
from _async_tp_checks import _no_compile_caches, collective_calls
from _fused_checks import _counters, _delta

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def to_float8(x, mode, dtype=E4M3, amax=None):
    """(x in float8, the inverse scale): rowwise scales [rows, 1], or one tensorwise scale."""
    fmax = torch.finfo(dtype).max
    x = x.float()
    if amax is None:
        amax = x.abs().amax(dim=-1, keepdim=True) if mode == "rowwise" else x.abs().amax()
    scale = fmax / amax.clamp(min=1e-12)
    return (x * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


def float8_weight_operand(w, mode):
    """B = w_fp8.t() ([K, N], column-major, as _scaled_mm wants it on CUDA and in inductor's
    lowering) for a weight w [N, K], and its scale ([1, N])."""
    wq, s = to_float8(w.contiguous(), mode)
    return wq.t(), (s.t() if mode == "rowwise" else s)


def _tensorwise_amax(x, group):
    return funcol.all_reduce(x.float().abs().amax(), "max", group)


class Fp8ColwiseLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_shard, w, mode, group):
        W = dist.get_world_size(group)
        amax = _tensorwise_amax(x_shard, group) if mode == "tensorwise" else None
        xq, sx = to_float8(x_shard, mode, amax=amax)
        xq_full = funcol.all_gather_tensor(xq, 0, group)
        sx_full = funcol.all_gather_tensor(sx, 0, group) if mode == "rowwise" else sx
        B, sw = float8_weight_operand(w, mode)
        h = torch._scaled_mm(xq_full, B, sx_full, sw, out_dtype=torch.bfloat16)
        ctx.save_for_backward(xq_full, sx_full, w)
        ctx.mode, ctx.group, ctx.W = mode, group, W
        return h

    @staticmethod
    def backward(ctx, grad_h):
        xq_full, sx_full, w = ctx.saved_tensors
        gq, sg = to_float8(grad_h, "rowwise", E5M2)
        B, sw = float8_weight_operand(w.t(), "rowwise")  # [H/W, D] for grad_h [S, H/W]
        partial = torch._scaled_mm(gq, B, sg, sw, out_dtype=torch.bfloat16)
        grad_x = funcol.reduce_scatter_tensor(partial, "sum", 0, ctx.group)
        grad_w = grad_h.float().t() @ (xq_full.float() * sx_full)
        return grad_x, grad_w, None, None


class Fp8RowwiseLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, mode, group):
        hq, sh = to_float8(h, mode)
        B, sw = float8_weight_operand(w, mode)
        partial = torch._scaled_mm(hq, B, sh, sw, out_dtype=torch.bfloat16)
        y = funcol.reduce_scatter_tensor(partial, "sum", 0, group)
        ctx.save_for_backward(hq, sh, w)
        ctx.mode, ctx.group = mode, group
        return y

    @staticmethod
    def backward(ctx, grad_y):
        hq, sh, w = ctx.saved_tensors
        mode, group = ctx.mode, ctx.group
        amax = _tensorwise_amax(grad_y, group) if mode == "tensorwise" else None
        gq, sg = to_float8(grad_y, mode, E5M2, amax=amax)
        gq_full = funcol.all_gather_tensor(gq, 0, group)
        sg_full = funcol.all_gather_tensor(sg, 0, group) if mode == "rowwise" else sg
        B, sw = float8_weight_operand(w.t(), "rowwise" if mode == "rowwise" else "tensorwise")
        grad_h = torch._scaled_mm(gq_full, B, sg_full, sw, out_dtype=torch.bfloat16)
        grad_w = (gq_full.float() * sg_full).t() @ (hq.float() * sh)
        return grad_h, grad_w, None, None


class Fp8Mlp(torch.nn.Module):
    """x [S/W, D] -> colwise [S, H/W] -> relu -> rowwise [S/W, D] (sequence parallel)."""

    def __init__(self, w1, w2, mode, group):
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(w1), torch.nn.Parameter(w2)
        self.mode, self.group = mode, group

    def forward(self, x):
        h = Fp8ColwiseLinear.apply(x, self.w1, self.mode, self.group)
        return Fp8RowwiseLinear.apply(torch.relu(h), self.w2, self.mode, self.group)


def _fp8_mlp_forward_backward(model, x, compiled):
    """One step of ``model`` (compiled or eager) on ``x``: the output, the gradients of x and the
    weights, and the collective calls of the forward and of the backward."""
    x = x.clone().requires_grad_(True)
    fn = torch.compile(model, fullgraph=True) if compiled else model
    group = model.group
    c0 = _counters(group)
    y = fn(x)
    loss = (y.float() ** 2).sum()
    c1 = _counters(group)
    loss.backward()
    c2 = _counters(group)
    grads = {"x": x.grad, "w1": model.w1.grad, "w2": model.w2.grad}
    return y.detach(), grads, collective_calls(_delta(c0, c1)), collective_calls(_delta(c1, c2))


def check_fp8_mlp(ctx, mode):
    """Compiled with the pass equals eager (output and every gradient); every fp8 all-gather
    feeding _scaled_mm and every reduce-scatter of a _scaled_mm fused, forward and backward; no
    more collectives than eager in either; the report names the fp8 ops."""
    group = dist.group.WORLD
    W, rank = ctx.world_size, ctx.rank
    D, H, S = 32, 16 * W, 3 * W  # S / W = 3 rows per rank
    g = torch.Generator().manual_seed(11)
    x_full = torch.randn(S, D, generator=g)
    w1_full = torch.randn(H, D, generator=g) / D ** 0.5
    w2_full = torch.randn(D, H, generator=g) / H ** 0.5
    x = x_full.chunk(W)[rank].contiguous()
    w1 = w1_full.chunk(W, 0)[rank].contiguous()
    w2 = w2_full.chunk(W, 1)[rank].contiguous()
    failures, n = [], 0
    torch._dynamo.reset()
    want, want_grads, e_fwd, e_bwd = _fp8_mlp_forward_backward(
        Fp8Mlp(w1.clone(), w2.clone(), mode, group), x, False)
    with cuda_p2p.async_tp(), _no_compile_caches():
        got, got_grads, c_fwd, c_bwd = _fp8_mlp_forward_backward(
            Fp8Mlp(w1.clone(), w2.clone(), mode, group), x, True)
        reports = cuda_p2p.async_tp_report()
    torch._dynamo.reset()
    # bfloat16 outputs: the fused reduce-scatter sums its bfloat16 partials in float32 and rounds
    # once, the eager reduce-scatter of bfloat16 tensors may round differently; inductor's fused
    # casts may differ from eager's by one rounding of the scale. One bfloat16 ulp, relative.
    tol = dict(atol=2e-2, rtol=2e-2)
    for what, a, b in [("output", got, want)] + [
            (f"grad {k}", got_grads[k], want_grads[k]) for k in want_grads]:
        try:
            torch.testing.assert_close(a.float(), b.float(), **tol)
        except AssertionError as e:
            failures.append(f"{mode} {what}: compiled+fused vs eager: {str(e).splitlines()[0]}")
        n += 1
    report = "\n".join(str(r) for r in reports)
    for phase, e, c in (("forward", e_fwd, c_fwd), ("backward", e_bwd, c_bwd)):
        if sum(c.values()) > sum(e.values()):
            failures.append(f"{phase}: compiled runs more collectives than eager: {c} vs {e}")
        fused = c.get("fused_all_gather_scaled_matmul", 0) + \
            c.get("fused_scaled_matmul_reduce_scatter", 0)
        if fused != 2 or c.get("reduce_scatter", 0):
            failures.append(f"{phase}: expected one fp8 all-gather and one fp8 reduce-scatter "
                            f"fused, compiled {c}, eager {e}\n{report}")
        # Rowwise: the gathered scales are also read by the weight gradient (saved): their
        # gather stays, as in eager; the fp8 data gather never does.
        if c.get("all_gather", 0) != (1 if mode == "rowwise" else 0):
            failures.append(f"{phase}: all-gathers left: compiled {c}, eager {e}\n{report}")
        n += 3
    if "fused_all_gather_scaled_matmul" not in report or \
            "fused_scaled_matmul_reduce_scatter" not in report:
        failures.append(f"the report does not name the fp8 ops:\n{report}")
    for r in reports:
        for kind, node, why in r.left:
            if mode == "tensorwise" or kind != "all-gather":
                failures.append(f"left {kind} {node}: {why}\n{report}")
    n += 1
    return {"cases": n, "failures": failures, "counters": {}, "report": report,
            "eager": (e_fwd, e_bwd), "compiled": (c_fwd, c_bwd)}
