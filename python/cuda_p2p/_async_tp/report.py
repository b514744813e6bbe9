"""What the pass did to one graph: the collectives it fused (and how), the ones it left (and why).

``rewrite()`` fills one ``GraphReport`` per graph; the installed pass keeps them
(``async_tp_report()``) and logs each one's ``str()``. No torch here: the report is plain data.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

# The report's words, also said as they happen (INFO: each rewrite and each graph's report; DEBUG:
# each miss).
log = logging.getLogger("cuda_p2p.async_tp")

ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"


class Fused(NamedTuple):
    """A collective replaced by a fused op: ``kind`` ("all-gather" or "reduce-scatter"), the FX
    node's name, and how (the form matched, the number of matmuls, return_A, ...)."""

    kind: str
    node: str
    how: str


class Left(NamedTuple):
    """A collective left as it was: ``kind``, the FX node's name, and why it did not fuse."""

    kind: str
    node: str
    why: str


@dataclasses.dataclass
class GraphReport:
    """What the pass did to one graph: ``fused`` and ``left``, lists of (kind, node, how/why),
    kind "all-gather" or "reduce-scatter"; ``symm_mem``, how many of PyTorch's symm_mem fused
    nodes became ours; ``index``, the graph's place among those the installed pass rewrote."""

    index: int = 0
    fused: list[Fused] = dataclasses.field(default_factory=list)
    left: list[Left] = dataclasses.field(default_factory=list)
    symm_mem: int = 0

    @property
    def all_gather_matmul(self) -> int:
        """All-gathers fused with their matmuls."""
        return sum(1 for f in self.fused if f.kind == ALL_GATHER)

    @property
    def matmul_reduce_scatter(self) -> int:
        """Reduce-scatters fused with the matmuls that produce their input."""
        return sum(1 for f in self.fused if f.kind == REDUCE_SCATTER)

    def __str__(self) -> str:
        lines = [f"graph {self.index}: fused {self.all_gather_matmul} all-gather->matmul, "
                 f"{self.matmul_reduce_scatter} matmul->reduce-scatter; left {len(self.left)}"]
        lines += [f"  {k} {n}: fused ({how})" for k, n, how in self.fused]
        lines += [f"  {k} {n}: LEFT: {why}" for k, n, why in self.left]
        return "\n".join(lines)
