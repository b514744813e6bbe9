"""Collectives of cuda_p2p beyond torch.distributed's own API."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ._backend import _resolve, get_cuda_p2p_backend


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
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"cuda_p2p.all_gather_v: expected a Tensor, got {type(tensor).__name__}")
    try:
        sizes = [int(s) for s in sizes]
    except TypeError:
        raise TypeError(
            f"cuda_p2p.all_gather_v: sizes must be a sequence of ints, got {type(sizes).__name__}"
        ) from None
    world = dist.get_world_size(group)
    if len(sizes) != world:
        raise ValueError(
            f"cuda_p2p.all_gather_v: expected {world} sizes (one per rank of the group), "
            f"got {len(sizes)}"
        )
    return get_cuda_p2p_backend(group).all_gather_v(tensor, sizes)
