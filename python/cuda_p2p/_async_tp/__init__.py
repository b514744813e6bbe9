"""A torch.compile pass that turns tensor-parallel communication + matmul into our pipelines.

``enable_async_tp()`` adds a post-grad ``CustomGraphPass`` to
``torch._inductor.config.post_grad_custom_post_pass`` (after any pass already there, which
keeps running); ``disable_async_tp()`` removes it; ``with async_tp():`` does both;
``CUDA_P2P_ASYNC_TP=1`` at import enables it. On groups of the cuda_p2p backend only, it rewrites

* ``wait(all_gather_into_tensor(shard))`` (gather dim 0), or its ``split``/``slice`` +
  ``cat(dim=d)`` form or funcol's single-view form (gather dim d), consumed by one or several
  ``mm`` / ``addmm`` / ``view -> mm|addmm [-> view]`` with the gathered tensor as the left
  operand, into one ``cuda_p2p.fused_all_gather_matmul`` (``return_A`` when anything else reads
  the gathered tensor, which then reads the returned A: NOTE [No unfused copy of a fused
  gather]; an ``addmm``'s bias is added to the fused output);
* ``wait(reduce_scatter_tensor(X))`` ("sum"/"avg") where X is P, ``cat(split(P, dim=d))``
  (funcol's scatter dim d) or ``clone(permute(P, perm))`` (DTensor's), and P is a matmul
  (``mm``, ``view(mm(view(A)))``, ``addmm``) or a sum of them (NOTE [A sum of matmuls
  reduce-scattered]), into ``cuda_p2p.fused_matmul_reduce_scatter``; an ``addmm`` whose bias is
  DTensor's ``bias / group_size`` (a replicated bias made partial) becomes the fused op plus
  ``bias``;
* PyTorch's own ``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` nodes on
  cuda_p2p groups into ours.

Both forward and backward graphs are rewritten (the pass runs on each; an activation
checkpoint's recomputed forward is in the backward graph). ``async_tp_report()`` gives, per
graph, what was fused and why each collective left was left; the ``cuda_p2p.async_tp`` logger
says the same (INFO: each rewrite and one summary per graph; DEBUG: each miss).

The jobs, one module each: match.py finds the patterns (and why one is not fusable), fuse.py
rewrites them into the fused ops (``rewrite(graph)``: the pass on one graph), report.py is the
``GraphReport`` of what was fused and left, install.py puts the pass into Inductor.
"""

import os

from .fuse import rewrite
from .install import (
    async_tp,
    async_tp_report,
    disable_async_tp,
    enable_async_tp,
    is_async_tp_enabled,
)
from .report import Fused, GraphReport, Left

__all__ = [
    "Fused",
    "GraphReport",
    "Left",
    "async_tp",
    "async_tp_report",
    "disable_async_tp",
    "enable_async_tp",
    "is_async_tp_enabled",
    "rewrite",
]

if os.environ.get("CUDA_P2P_ASYNC_TP", "0") not in ("", "0"):
    enable_async_tp()
