"""The fused GEMM pipelines as Python functions (``torch.ops.cuda_p2p.*`` underneath).

Both ops take the group as a name (``group.group_name``) like the dispatcher ops, or as a
``ProcessGroup``, or ``None`` for the default group. They run on CPU tensors (host shared
memory) and CUDA tensors (CUDA IPC), and have Meta kernels, so FakeTensor and ``torch.compile``
trace them. Which path ran is counted on the backend: see ``backend.get_counters()``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (loads the extension, which registers torch.ops.cuda_p2p)
from ._backend import _resolve

GroupLike = Union[str, dist.ProcessGroup, None]

# The algorithms each op takes (the all-gather ops; the reduce-scatter ops).
ALL_GATHER_ALGORITHMS = ("auto", "pipeline", "pull_ahead")
ALGORITHMS = ("auto", "pipeline", "ring")

# The arguments (algorithm, reduce_op, ring_steps, shapes) are checked by the op itself, on every
# rank: a rank whose own arguments are wrong raises its error and its peers raise at once naming
# it (NOTE [Op signatures]), where a check here would leave them waiting until the timeout.


def _group_name(group: GroupLike) -> str:
    if isinstance(group, str):
        return group
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            "cuda_p2p: group must be a group name (str), a ProcessGroup or None, "
            f"got {type(group).__name__}"
        )
    return _resolve(group).group_name


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: Sequence[torch.Tensor],
    gather_dim: int,
    group: GroupLike = None,
    *,
    return_A: bool = True,
    algorithm: str = "auto",
) -> tuple[Optional[torch.Tensor], list[torch.Tensor]]:
    """``all_gather(A_shard, gather_dim) @ B`` for every ``B`` in ``Bs``, pipelined.

    Returns ``(A, [A @ B for B in Bs])`` where ``A`` is the gathered tensor (rank r's shard at
    index r along ``gather_dim``), or ``None`` when ``return_A`` is false. Shapes and strides
    are those of the unfused computation: ``all_gather_into_tensor`` then ``torch.matmul``.
    Gathering the last dim gathers the contraction dim: each ``B`` then has
    ``group_size * A_shard.size(-1)`` rows.

    ``algorithm``: ``"pipeline"`` (the steps alternate between two streams, each pulling one
    peer's shard and multiplying it while the other stream does the same), ``"pull_ahead"`` (one
    stream pulls every shard as soon as it can, the other runs every GEMM), or ``"auto"`` (the
    group's ``Options.fused_all_gather_algo``: by default the pipeline on CUDA tensors,
    pull-ahead on CPU tensors; below ``Options.fused_min_flops`` GEMM flops per rank, our
    all-gather then ``torch.matmul``, counted ``fused_all_gather_matmul.unfused``:
    docs/pipelines.md).
    """
    return torch.ops.cuda_p2p.fused_all_gather_matmul(
        A_shard, list(Bs), gather_dim, _group_name(group), return_A=return_A, algorithm=algorithm
    )


def fused_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group: GroupLike = None,
    *,
    algorithm: str = "auto",
    ring_steps: int = 0,
) -> torch.Tensor:
    """``reduce_scatter(A @ B, reduce_op, scatter_dim)``, pipelined.

    ``reduce_op`` is ``"sum"`` or ``"avg"``; ``A.size(scatter_dim)`` (or ``B.size(1)`` when
    ``scatter_dim`` is the last dim) must be divisible by the group size. The result is
    contiguous, like ``reduce_scatter_tensor``'s. Partial products are summed in float32.

    ``algorithm``: ``"pipeline"`` (two streams, each exchanging one partial product per step
    while the other computes the next), ``"ring"`` (a ring reduce-scatter in ``ring_steps``
    steps, a multiple of the group size; 0 means the group size), or ``"auto"`` (the ring when
    ``ring_steps`` is given, else the group's ``Options.fused_reduce_scatter_algo``: by default
    the pipeline on CUDA tensors, the ring on CPU tensors; below
    ``Options.fused_min_flops`` GEMM flops per rank and without ``ring_steps``, ``torch.matmul``
    then our reduce-scatter, counted ``fused_matmul_reduce_scatter.unfused``). Without the
    workspace (several hosts, or ``enable_workspace=False``) the ring runs over the wrapped
    backend's send/recv.
    """
    return torch.ops.cuda_p2p.fused_matmul_reduce_scatter(
        A,
        B,
        reduce_op,
        scatter_dim,
        _group_name(group),
        algorithm=algorithm,
        ring_steps=ring_steps,
    )


def fused_all_gather_scaled_matmul(
    A_shard: torch.Tensor,
    Bs: Sequence[torch.Tensor],
    A_scale: torch.Tensor,
    B_scales: Sequence[torch.Tensor],
    gather_dim: int,
    group: GroupLike = None,
    *,
    out_dtypes: Sequence[torch.dtype],
    return_A: bool = True,
    algorithm: str = "auto",
) -> tuple[Optional[torch.Tensor], list[torch.Tensor]]:
    """``torch._scaled_mm(all_gather(A_shard, gather_dim), B, A_scale, B_scale, out_dtype=...)``
    for every ``B`` in ``Bs``, pipelined like ``fused_all_gather_matmul`` (docs/training.md, fp8).

    ``A_shard`` and ``Bs`` are float8; ``A_scale`` is float32, one element (tensorwise, the same
    on every rank) or ``A_shard.shape[:-1] + (1,)`` (rowwise, sharded with A and gathered with
    it); each ``B_scale`` one element or ``[1, N]``. ``out_dtypes``: float32 or bfloat16 per B.
    ``gather_dim`` is any dim but the last. Returns ``(A, outputs)`` laid out as PyTorch's
    unfused fallback lays them out (the gathered fp8 A; each product unflattened and moved back
    to ``gather_dim``). No autograd formula: torch has none for ``_scaled_mm`` either; the
    compile pass uses the op below autograd.
    """
    return torch.ops.cuda_p2p.fused_all_gather_scaled_matmul(
        A_shard, list(Bs), A_scale, list(B_scales), gather_dim, _group_name(group),
        out_dtypes=list(out_dtypes), return_A=return_A, algorithm=algorithm,
    )


def fused_scaled_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group: GroupLike = None,
    *,
    out_dtype: torch.dtype,
    algorithm: str = "auto",
    ring_steps: int = 0,
) -> torch.Tensor:
    """``reduce_scatter(torch._scaled_mm(A, B, A_scale, B_scale, out_dtype=out_dtype),
    reduce_op, scatter_dim)``, on the pipelines of ``fused_matmul_reduce_scatter``.

    ``A`` ([..., K]) and ``B`` ([K, N]) are float8; ``A_scale`` is float32, one element or
    ``A.shape[:-1] + (1,)`` (rowwise: each part's rows take their own scales); ``B_scale`` one
    element or ``[1, N]``. ``out_dtype``: float32 or bfloat16; the partials are in ``out_dtype``
    and summed in float32.
    """
    return torch.ops.cuda_p2p.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, scatter_dim, _group_name(group),
        out_dtype=out_dtype, algorithm=algorithm, ring_steps=ring_steps,
    )


__all__ = [
    "ALGORITHMS",
    "ALL_GATHER_ALGORITHMS",
    "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
]
