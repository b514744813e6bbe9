"""Autograd for the fused ops: the backward of each fused pipeline runs on the other one.

``fused_all_gather_matmul``: ``A = all_gather(A_shard, gather_dim)``, ``C_i = A @ B_i``.

* grad ``A_shard`` = ``reduce_scatter(sum_i grad_C_i @ B_i^T, gather_dim)``: one
  ``fused_matmul_reduce_scatter`` of the concatenated ``[grad_C_0 | grad_C_1 | ...]`` with the
  stacked ``[B_0 | B_1 | ...]^T`` (the sum over i is the contraction). A gradient flowing into the
  returned ``A`` itself is reduce-scattered as well (all-gather's adjoint).
* grad ``B_i`` = ``A^T @ grad_C_i`` over every row of ``A``. When the forward returned ``A`` it is
  saved and reused (no communication). Otherwise only ``A_shard`` is saved and the product is
  itself an all-gather->matmul: ``A^T`` is the concatenation of the ranks' ``A_shard^T`` along the
  contraction dim, so ``fused_all_gather_matmul(A_shard^T, [grad_C_i rows regrouped by rank],
  gather_dim=-1)`` computes every ``grad B_i`` in one pipeline (for a gathered last dim the
  shards stack along the rows of ``A^T`` instead: ``gather_dim=0``).

``fused_matmul_reduce_scatter``: ``out = reduce_scatter(A @ B, scatter_dim)``.

* ``G = all_gather(grad_out, scatter_dim)`` (divided by the group size for "avg"), then
  ``grad A = G @ B^T`` and ``grad B = A^T @ G``: one ``fused_all_gather_matmul(grad_out, [B^T],
  scatter_dim)`` gives ``grad A`` and, returned, ``G`` for ``grad B``.

The gradients of B are per rank (each rank's own B, as for any local tensor): no reduction
across ranks, exactly as the unfused ``all_gather`` + ``matmul`` would give.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (registers torch.ops.cuda_p2p)

_AG = "cuda_p2p::fused_all_gather_matmul"
_RS = "cuda_p2p::fused_matmul_reduce_scatter"


def _world_size(group_name: str) -> int:
    return dist.distributed_c10d._resolve_process_group(group_name).size()


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a matrix: every dim but the last flattened into rows."""
    return t.reshape(-1, t.shape[-1])


def _reduce_scatter(t: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """reduce_scatter(t, "sum") along ``dim`` through the functional collectives (traceable)."""
    W = _world_size(group_name)
    front = t.movedim(dim, 0).contiguous()
    out = torch.ops._c10d_functional.reduce_scatter_tensor(front, "sum", W, group_name)
    out = torch.ops._c10d_functional.wait_tensor(out)
    return out.movedim(0, dim)


# ---- all-gather -> matmul ---------------------------------------------------------------------


def _ag_setup_context(ctx, inputs, keyword_only_inputs, output):
    A_shard, Bs, gather_dim, group_name = inputs
    A, _ = output
    nd = A_shard.dim()
    ctx.gather_dim = gather_dim % nd
    ctx.group_name = group_name
    ctx.algorithm = keyword_only_inputs.get("algorithm", "auto")
    ctx.num_Bs = len(Bs)
    ctx.saved_A = A is not None
    # The gathered A when it is kept anyway; else the shard, gathered again in backward (by a
    # fused pipeline) only if some B needs a gradient.
    ctx.save_for_backward(A if A is not None else A_shard, *Bs)


def _ag_backward(ctx, grad_A, grad_outs):
    saved, *Bs = ctx.saved_tensors
    gd, group_name = ctx.gather_dim, ctx.group_name
    need_A, need_Bs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    W = _world_size(group_name)
    live = [i for i, g in enumerate(grad_outs) if g is not None]

    grad_A_shard = None
    if need_A:
        if live:
            if len(live) == 1:
                G, Bt = grad_outs[live[0]], Bs[live[0]].t()
            else:
                G = torch.cat([grad_outs[i] for i in live], dim=-1)
                Bt = torch.cat([Bs[i] for i in live], dim=1).t()
            grad_A_shard = torch.ops.cuda_p2p.fused_matmul_reduce_scatter(
                G, Bt, "sum", gd, group_name
            )
        if grad_A is not None:
            extra = _reduce_scatter(grad_A, gd, group_name)
            grad_A_shard = extra if grad_A_shard is None else grad_A_shard + extra

    grad_Bs = [None] * ctx.num_Bs
    wanted = [i for i in live if need_Bs[i]]
    if wanted:
        if ctx.saved_A:
            A2 = _rows(saved)
            for i in wanted:
                grad_Bs[i] = A2.t() @ _rows(grad_outs[i])
        else:
            grad_Bs = _ag_grad_Bs_from_shard(saved, grad_outs, wanted, gd, W, group_name,
                                             ctx.num_Bs)
    return grad_A_shard, grad_Bs, None, None


def _ag_grad_Bs_from_shard(A_shard, grad_outs, wanted, gd, W, group_name, num_Bs):
    """grad B_i = A^T @ grad_C_i without the gathered A: an all-gather->matmul of A_shard^T."""
    nd = A_shard.dim()
    grad_Bs = [None] * num_Bs
    if gd == nd - 1:
        # A = cat(shards, -1): A^T stacks the ranks' A_shard^T along its rows.
        At_shard = _rows(A_shard).t()  # [k, rows]
        _, outs = torch.ops.cuda_p2p.fused_all_gather_matmul(
            At_shard, [_rows(grad_outs[i]) for i in wanted], 0, group_name, return_A=False
        )
    else:
        # A's rows come from W shards interleaved along gather_dim; A^T @ G sums over rows, so
        # G's rows may be taken rank by rank: [W, (rows of one shard)] in the shard's row order.
        shape = A_shard.shape
        At_shard = _rows(A_shard).t()  # [k, rows of the shard]

        def by_rank(g):
            split = list(g.shape[:gd]) + [W, shape[gd]] + list(g.shape[gd + 1:])
            return g.reshape(split).movedim(gd, 0).reshape(-1, g.shape[-1])

        _, outs = torch.ops.cuda_p2p.fused_all_gather_matmul(
            At_shard, [by_rank(grad_outs[i]) for i in wanted], 1, group_name, return_A=False
        )
    for i, o in zip(wanted, outs):
        grad_Bs[i] = o
    return grad_Bs


# ---- matmul -> reduce-scatter -----------------------------------------------------------------


def _rs_setup_context(ctx, inputs, keyword_only_inputs, output):
    A, B, reduce_op, scatter_dim, group_name = inputs
    ctx.scatter_dim = scatter_dim % A.dim()
    ctx.group_name = group_name
    ctx.reduce_op = reduce_op
    ctx.save_for_backward(A, B)


def _rs_backward(ctx, grad_out):
    A, B = ctx.saved_tensors
    need_A, need_B = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if grad_out is None or not (need_A or need_B):
        return None, None, None, None, None
    group_name = ctx.group_name
    if ctx.reduce_op == "avg":
        grad_out = grad_out / _world_size(group_name)
    # grad_out has the product's layout except along scatter_dim, so gathering it along
    # scatter_dim gives the product's gradient G (for the last dim: the contraction of G @ B^T).
    G, (grad_A,) = torch.ops.cuda_p2p.fused_all_gather_matmul(
        grad_out, [B.t()], ctx.scatter_dim, group_name, return_A=need_B
    )
    grad_B = _rows(A).t() @ _rows(G) if need_B else None
    return (grad_A if need_A else None), grad_B, None, None, None


def _register() -> None:
    torch.library.register_autograd(_AG, _ag_backward, setup_context=_ag_setup_context)
    torch.library.register_autograd(_RS, _rs_backward, setup_context=_rs_setup_context)


_register()
