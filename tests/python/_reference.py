"""The reference of the collectives' results: what a reduction over the ranks must give, computed by
plain torch in the calling process. Every test of a reducing collective takes its expected values
from here.

Plain torch rather than a Gloo group, because it
- covers every dtype and reduce op the workspace runs (Gloo has no int16 all-reduce, no AVG on
  some torch versions, no list all_to_all on torch 2.11);
- needs no communication, so a wrong value is the product's and not the reference's transport;
- states the result the way docs/collectives.md ("Protocol") defines it: the sources reduced
  in rank order in the accumulation type (float32 for float16 and bfloat16, the dtype itself for
  float32 and float64, int64 for integers, which therefore wrap as in the product), rounded once
  to the dtype; AVG divides the accumulated sum by the number of ranks once. (The rings and the
  hierarchical collectives add in another order: tests whose inputs round compare within a
  tolerance, tests of small integers, exact in any order, bit for bit.)

The tests still run a Gloo group beside cuda_p2p where Gloo can: that checks the drop-in promise
(the values, errors, Works and futures of torch's own backend), not the arithmetic.
"""

from __future__ import annotations

import functools

import torch

FLOAT_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
INT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
BITWISE_OPS = ("BAND", "BOR", "BXOR")
_BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def ops_for(dtype) -> tuple[str, ...]:
    """The reduce ops (torch.distributed.ReduceOp names) the collectives take for `dtype`."""
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def accumulation_dtype(dtype):
    """The type the collectives accumulate `dtype` in."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype if dtype.is_floating_point else torch.int64


def reduce_over_ranks(op: str, sources: list):
    """`op` (a ReduceOp name, any case) over `sources`, rank r's tensor at index r, elementwise: the
    result every rank of an all-reduce holds, and the chunk a reduce-scatter leaves on its rank
    when `sources` are the ranks' chunks. Raises ValueError for the combinations the collectives
    reject (AVG on integers, bitwise ops on floating point)."""
    op = op.upper()
    dtype = sources[0].dtype
    if op == "MIN":
        return torch.stack(sources).amin(0)
    if op == "MAX":
        return torch.stack(sources).amax(0)
    if op in _BITWISE:
        if dtype.is_floating_point:
            raise ValueError(f"{op} is not defined on {dtype}")
        return functools.reduce(_BITWISE[op], sources)
    if op == "AVG" and not dtype.is_floating_point:
        raise ValueError(f"AVG is not defined on {dtype}")
    if op not in ("SUM", "AVG", "PRODUCT"):
        raise ValueError(f"unknown reduce op {op!r}")
    acc = accumulation_dtype(dtype)
    out = sources[0].to(acc)
    for x in sources[1:]:
        out = out * x.to(acc) if op == "PRODUCT" else out + x.to(acc)
    if op == "AVG":
        out = out / len(sources)
    return out.to(dtype)
