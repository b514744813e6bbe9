"""Collectives of cuda_p2p beyond torch.distributed's own API."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ._backend import _resolve, get_cuda_p2p_backend


def _per_rank_ints(op: str, tensor, values, name: str, noun: str, group) -> list[int]:
    """Checks ``tensor`` and ``values`` (``name``: the argument) of ``op`` before any
    communication: a Tensor, and one int per rank of ``group`` (``noun`` in the message)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"cuda_p2p.{op}: expected a Tensor, got {type(tensor).__name__}")
    try:
        ints = [int(v) for v in values]
    except TypeError:
        raise TypeError(
            f"cuda_p2p.{op}: {name} must be a sequence of ints, got {type(values).__name__}"
        ) from None
    world = dist.get_world_size(group)
    if len(ints) != world:
        raise ValueError(
            f"cuda_p2p.{op}: expected {world} {noun} (one per rank of the group), got {len(ints)}"
        )
    return ints


def all_gather_v(tensor: torch.Tensor, sizes: Sequence[int], group=None) -> torch.Tensor:
    """Gathers a different number of rows from every rank of ``group``.

    ``sizes[r]`` is the number of rows (dim 0) rank ``r`` contributes (the same list on every
    rank); ``tensor`` holds this rank's ``sizes[rank]`` rows, its other dims equal on every rank.
    Returns the concatenation of every rank's rows along dim 0, in rank order.

    Runs on the P2P workspace when it is available (counter ``all_gather_v.direct``), else pads
    every contribution to the largest and uses the wrapped backend's all_gather
    (``all_gather_v.wrapped``).
    """
    group = _resolve(group)
    sizes = _per_rank_ints("all_gather_v", tensor, sizes, "sizes", "sizes", group)
    return get_cuda_p2p_backend(group).all_gather_v(tensor, sizes)


def all_to_all_v(
    tensor: torch.Tensor, input_splits: Sequence[int], group=None
) -> tuple[torch.Tensor, list[int]]:
    """Sends ``input_splits[q]`` rows (dim 0) of ``tensor`` to rank ``q`` of ``group``, without the
    receivers knowing in advance how many rows they get (an MoE dispatch or combine).

    ``input_splits`` has one entry per rank of the group, each >= 0, summing to ``tensor``'s rows;
    the other dims and the dtype must be equal on every rank. Returns ``(output, output_splits)``:
    the rows every rank sent to this one, concatenated in rank order along dim 0, and how many
    came from each rank.

    Runs on the P2P workspace when it is available (counter ``all_to_all_v.direct``: the split
    sizes travel with the rows), else exchanges the split sizes and then the rows with the wrapped
    backend's all_to_all_single (``all_to_all_v.wrapped``).
    """
    group = _resolve(group)
    input_splits = _per_rank_ints(
        "all_to_all_v", tensor, input_splits, "input_splits", "input split sizes", group
    )
    output, splits = get_cuda_p2p_backend(group).all_to_all_v(tensor, input_splits)
    return output, list(splits)


_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def all_reduce_(tensor: torch.Tensor, op="sum", group=None) -> torch.Tensor:
    """All-reduces ``tensor`` in place over ``group`` and returns it, without a ``Work``.

    ``torch.ops.cuda_p2p.all_reduce_(tensor, reduce_op="sum", group_name="")`` underneath (``""``:
    the default group; the op called with no strings is the cheapest call): a dispatcher
    op, called the way vLLM's custom all-reduce and DeepSpeed's ``inference_all_reduce_`` are,
    that skips ``torch.distributed``'s Python layer. It runs the workspace all-reduce that
    ``dist.all_reduce`` runs (same algorithms, same counters ``all_reduce.one_shot`` /
    ``two_shot``) and falls back to the wrapped backend where the workspace cannot serve
    (``all_reduce.wrapped``). ``torch.compile`` traces it (a Meta kernel and a functional
    variant, ``torch.ops.cuda_p2p.all_reduce``).

    ``op``: ``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``,
    ``"bxor"`` or a ``dist.ReduceOp`` of these. ``group``: a ProcessGroup of the cuda_p2p
    backend, its name, or None (the default group).
    """
    if isinstance(op, dist.ReduceOp.RedOpType):
        name = op.name.lower()
    elif isinstance(op, str):
        name = op.lower()
    else:
        raise TypeError(
            f"cuda_p2p.all_reduce_: op must be a str or a dist.ReduceOp, got {type(op).__name__}"
        )
    if name not in _REDUCE_OPS:
        raise ValueError(f"cuda_p2p.all_reduce_: op must be one of {_REDUCE_OPS}, got {op!r}")
    if isinstance(group, str):
        group_name = group
    else:
        group_name = _resolve(group).group_name
    return torch.ops.cuda_p2p.all_reduce_(tensor, name, group_name)
