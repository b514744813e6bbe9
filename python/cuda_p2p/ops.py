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

ALL_GATHER_ALGORITHMS = ("auto", "pipeline", "pull_ahead")
ALGORITHMS = ("auto", "pipeline", "ring")


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
    pipeline on CUDA tensors, pull-ahead on CPU tensors; below ``Options.fused_min_flops`` GEMM
    flops per rank, our all-gather then ``torch.matmul``, counted
    ``fused_all_gather_matmul.unfused``: docs/pipelines.md).
    """
    if algorithm not in ALL_GATHER_ALGORITHMS:
        raise ValueError(
            f"cuda_p2p: algorithm must be one of {ALL_GATHER_ALGORITHMS}, got {algorithm!r}"
        )
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
    steps, a multiple of the group size; 0 means the group size), or ``"auto"`` (the pipeline
    on CUDA tensors; the ring on CPU tensors, or when ``ring_steps`` is given; below
    ``Options.fused_min_flops`` GEMM flops per rank and without ``ring_steps``, ``torch.matmul``
    then our reduce-scatter, counted ``fused_matmul_reduce_scatter.unfused``). Without the
    workspace (several hosts, or ``enable_workspace=False``) the ring runs over the wrapped
    backend's send/recv.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"cuda_p2p: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return torch.ops.cuda_p2p.fused_matmul_reduce_scatter(
        A,
        B,
        reduce_op,
        scatter_dim,
        _group_name(group),
        algorithm=algorithm,
        ring_steps=ring_steps,
    )


__all__ = [
    "ALGORITHMS",
    "ALL_GATHER_ALGORITHMS",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
]
