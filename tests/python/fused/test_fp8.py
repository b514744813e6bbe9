"""The fp8 fused ops (fused_all_gather_scaled_matmul, fused_scaled_matmul_reduce_scatter) against
the unfused torch._scaled_mm path computed in one process (_fp8_checks.py), on 2 and 4 ranks;
their errors and Meta kernels; and the async-TP pass on a small fp8 MLP (_fp8_pass_checks.py)."""

from __future__ import annotations

import torch

import _fp8_checks as f8
from _fused_checks import run_safely
from test_fused_ops import assert_all_ok

AG_PER_WORLD = len(f8.AG_CASES) * 2 * 2 * 3
RS_PER_WORLD = len(f8.RS_CASES) * 2 * 2 * 4


def test_all_gather_scaled_matmul(world):
    # world: 2 and 4 ranks. Small-integer values bitwise, random ones within the bound of
    # _fp8_checks.scaled_mm_bound (a CPU's _scaled_mm may round a row by how many rows it gets).
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


def test_bound_accepts_other_row_splits_and_rejects_wrong_values():
    """The bound the non-integer cases are held to (_fp8_checks.scaled_mm_bound): it accepts
    _scaled_mm of a chunk's rows against all rows at once - equal on some CPUs, a few float32
    roundings apart on others (this one may be either) - and rejects a scale off by 2^-12 or one
    row's product taken from another row."""
    for K in (7, 16, 64):
        for mode in ("tensorwise", "rowwise"):
            for od in (torch.float32, torch.bfloat16):
                A = f8.fp8((12, K), K, False)
                B = f8.weight(K, 9, K + 1, False)
                sa = f8.scale(() if mode == "tensorwise" else (12, 1), K + 2, False)
                sb = f8.scale(() if mode == "tensorwise" else (1, 9), K + 3, False)
                whole = f8.ref_scaled(A, B, sa, sb, od)
                bound = f8.scaled_mm_bound(A, B, sa, sb, od)
                for rows in (1, 2, 3, 5):
                    split = torch.cat([
                        f8.ref_scaled(A[i:i + rows], B, sa if sa.numel() == 1 else
                                      sa[i:i + rows], sb, od) for i in range(0, 12, rows)])
                    ok, worst = f8.within(split, whole, bound)
                    assert ok, (K, mode, od, rows, worst)
                off = f8.ref_scaled(A, B, sa * (1 + 2.0 ** -12), sb, od)
                if od == torch.float32:  # (bfloat16 rounds a 2^-12 change away, mostly)
                    assert not f8.within(off, whole, bound)[0], (K, mode, od)
                swapped = whole.clone()
                swapped[[0, 1]] = whole[[1, 0]]
                assert not f8.within(swapped, whole, bound)[0], (K, mode, od)


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
