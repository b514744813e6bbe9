"""The fp8 fused ops (fused_all_gather_scaled_matmul, fused_scaled_matmul_reduce_scatter) against
the unfused torch._scaled_mm path computed in one process (_fp8_checks.py), on 2 and 4 ranks;
their errors and Meta kernels; and the async-TP pass on a small fp8 MLP (_fp8_pass_checks.py)."""

from __future__ import annotations

import _fp8_checks as f8
from _fused_checks import run_safely
from test_fused_ops import assert_all_ok

AG_PER_WORLD = len(f8.AG_CASES) * 2 * 2 * 3
RS_PER_WORLD = len(f8.RS_CASES) * 2 * 2 * 4


def test_all_gather_scaled_matmul_bitwise(world):
    # world: 2 and 4 ranks. Small-integer and random values alike: bitwise.
    for integer in (True, False):
        c = assert_all_ok(world.run(run_safely, f8.check_all_gather_scaled_matmul, integer),
                          AG_PER_WORLD)
        assert c == {"fused_all_gather_scaled_matmul.pipeline": AG_PER_WORLD // 3,
                     "fused_all_gather_scaled_matmul.pull_ahead": 2 * AG_PER_WORLD // 3}, c


def test_scaled_matmul_reduce_scatter(world):
    for integer in (True, False):
        c = assert_all_ok(world.run(run_safely, f8.check_scaled_matmul_reduce_scatter, integer),
                          RS_PER_WORLD)
        assert c == {"fused_scaled_matmul_reduce_scatter.pipeline": RS_PER_WORLD // 4,
                     "fused_scaled_matmul_reduce_scatter.ring": 3 * RS_PER_WORLD // 4}, c


def test_errors_on_every_rank(world):
    assert_all_ok(world.run(run_safely, f8.check_errors), 15)


def test_meta_kernels_match_the_real_layouts(world2):
    assert_all_ok(world2.run(run_safely, f8.check_meta_and_fake), 6)


import pytest  # noqa: E402

import _fp8_pass_checks as fpc  # noqa: E402


# On 2 ranks: the pass matches the same graphs whatever the group size (the bf16 DTensor MLP of
# test_async_tp.py runs it on 4), and a compile on 4 ranks took ~50 s of CI per scaling.
@pytest.mark.parametrize("mode", ["tensorwise", "rowwise"])
def test_async_tp_pass_fuses_the_fp8_mlp(world2, mode):
    """A Float8-style TP MLP compiled with enable_async_tp: loss and gradients equal eager, every
    fp8 all-gather + _scaled_mm and _scaled_mm + reduce-scatter fused forward and backward, no
    more collectives than eager, the report naming the fp8 ops."""
    res = world2.run(run_safely, fpc.check_fp8_mlp, mode, timeout=900)
    assert_all_ok(res, 11)
    assert "fused_all_gather_scaled_matmul" in res[0]["report"], res[0]["report"]
