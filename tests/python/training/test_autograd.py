"""Gradients through the fused ops (python/cuda_p2p/_autograd.py) on 2 and 3 ranks.

gradcheck in float64 on the fused ops themselves, and the gradients in float32/bfloat16 against
single-process torch (see _autograd_checks.py); the counters prove that the backward of each
fused op ran on the other fused pipeline.
"""

from __future__ import annotations

import pytest

import _autograd_checks as ac
from test_fused_ops import assert_all_ok


@pytest.fixture(params=["world2", "world3"], ids=["w2", "w3"])
def world23(request):
    return request.getfixturevalue(request.param)


def test_gradcheck_float64(world23):
    n = 2 * len(ac.AG_CASES) + 2 * len(ac.RS_CASES)
    assert_all_ok(world23.run(ac.run_safely, ac.check_gradcheck, timeout=300), n)


def test_all_gather_matmul_grads_match_torch(world23):
    n = 2 * 2 * len(ac.AG_CASES)
    counters = assert_all_ok(world23.run(ac.run_safely, ac.check_ag_vs_reference), n)
    # Forward: one fused all-gather->matmul per case. Backward: grad A_shard is one fused
    # matmul->reduce-scatter per case; grad Bs re-gather A (a fused all-gather->matmul) only
    # when the forward did not return A (half the cases).
    assert counters.get("fused_all_gather_matmul.pull_ahead") == n + n // 2, counters
    assert counters.get("fused_matmul_reduce_scatter.ring") == n, counters


def test_matmul_reduce_scatter_grads_match_torch(world23):
    n = 2 * 2 * len(ac.RS_CASES)
    counters = assert_all_ok(world23.run(ac.run_safely, ac.check_rs_vs_reference), n)
    # Backward: one fused all-gather->matmul per case (grad A, and the gathered grad for B).
    assert counters.get("fused_matmul_reduce_scatter.ring") == n, counters
    assert counters.get("fused_all_gather_matmul.pull_ahead") == n, counters


def test_partial_grads_and_no_grad(world2):
    assert_all_ok(world2.run(ac.run_safely, ac.check_only_some_grads), 3)


def test_bad_arguments_raise_before_communicating(world23):
    assert_all_ok(world23.run(ac.run_safely, ac.check_errors_leave_group_usable), 6)
