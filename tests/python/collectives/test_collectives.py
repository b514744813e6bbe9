"""Every collective on cuda_p2p against a Gloo group over the same ranks and plain-torch math.

Each test runs all sizes (0, 1, 7, 1023 elements), every reduce op and sync/async modes of one
collective and dtype in one remote call, and reports every failing case by name.
"""

from __future__ import annotations

import pytest

import _collective_cases as cs
import _collective_checks as cc
from _collective_checks import SUBGROUPS, assert_all_ok

DTYPES = list(cc.DTYPES)
COLLECTIVES = list(cs.COLLECTIVES)
REDUCING = [n for n, c in cs.COLLECTIVES.items() if c.reduces]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective(world, name, dtype):
    sizes = len(cc.SIZES)
    assert_all_ok(world.run(cs.check_collective, name, dtype), min_cases=2 * sizes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", REDUCING)
def test_rejected_reduce_ops(world2, name, dtype):
    """AVG on int64 and bitwise ops on floats: Gloo rejects them, so must cuda_p2p."""
    assert_all_ok(world2.run(cs.check_rejections, name, dtype))


def run_in_subgroups(ctx, layout, name, dtype):
    return cc.in_subgroup(ctx, layout, cs.check_collective, name, dtype, sizes=(1, 7))


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("layout", list(SUBGROUPS))
def test_collective_subgroup(world4, layout, name, dtype):
    results = world4.run(run_in_subgroups, layout, name, dtype)
    assert_all_ok(results)
    if layout == "ranks_1_2_3":
        # rank 0 ran the non-member checks; the members ran the real ones
        assert results[0]["cases"] == 1 and results[1]["cases"] > 1


def subgroups_use_cuda_p2p(ctx, layout):
    return cc.in_subgroup(ctx, layout, cc.uses_cuda_p2p)


@pytest.mark.parametrize("layout", list(SUBGROUPS))
def test_subgroups_are_cuda_p2p(world4, layout):
    res = world4.run(subgroups_use_cuda_p2p, layout)
    for r, x in enumerate(res):
        if any(r in g for g in SUBGROUPS[layout]):
            assert x == (True, False), f"rank {r}: (is_cuda_p2p_group(p2p), ...(gloo)) = {x}"
        else:
            assert x is None
