"""The CUDA path on a GPU, with ranks sharing the one GPU (scripts/gpu_check.sh runs this file).

Collected everywhere, run only where CUDA is available: on the CPU machines every test reports
itself SKIPPED. Nothing here has run on a GPU yet unless a gpu_check.sh summary says so.

NCCL refuses two ranks on one GPU, so for W >= 2 the groups under test must not need it: they use
the backend name ``cuda_p2p_nonccl`` (registered by _gpu_checks.py), a ProcessGroupCudaP2P whose
wrapped CUDA backend is a second Gloo group (Gloo handles CUDA tensors for the few ordinary
collectives these tests send to the wrapped side). The workspace is then on the GPU exactly as
under NCCL (the backend puts it there whenever a CUDA backend is wrapped). References are
computed in plain torch in each rank (small integers: exact in every dtype and summation order)
and, for a few cases, by the Gloo reference group on CPU copies. The routing default (ordinary
collectives on CUDA tensors go to the wrapped backend) is checked with real NCCL on one rank, and
through the Gloo-wrapped group on 2-4 ranks.

The workspace collectives on CUDA tensors are opt-in (Options.cuda_workspace_collectives, or
CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1 when the group is created); the groups under test set both.

The rank-side checks live in _gpu_checks.py (the backend, groups, inputs and the collectives),
_gpu_op_checks.py (the fused ops, Works, timeouts, routing) and _gpu_heap_checks.py (the symmetric
heap, zero-copy, windows). This file imports them, and so registers ``cuda_p2p_nonccl`` in every
process that imports it (gpu_scripts/gpu_smoke.py, _gpu_readiness.py, test_gpu_rehearsal.py).
"""

from __future__ import annotations

import pytest
import torch

import conftest
from _gpu_checks import (
    ALL_GATHER_ALGOS,
    ALL_REDUCE_ALGOS,
    MARGIN_S,
    NONCCL,
    REDUCE_SCATTER_ALGOS,
    TIMEOUT_S,
    check_all_gather,
    check_all_gather_v,
    check_all_reduce,
    check_all_to_all,
    check_broadcast,
    check_gather_scatter,
    check_reduce,
    check_reduce_scatter,
    rehearse_on_cpu as rehearse_on_cpu,  # test_gpu_rehearsal.py: g.rehearse_on_cpu
)
from _gpu_heap_checks import (
    check_symmetric_heap_limits,
    check_symmetric_tensors,
    check_windows,
    check_zero_copy_collectives,
    check_zero_copy_mismatch,
)
from _gpu_op_checks import (
    check_async_side_stream,
    check_deadlocked_root_mismatch,
    check_fused_all_gather_matmul,
    check_fused_matmul_reduce_scatter,
    check_growth_and_rounds,
    check_is_completed,
    check_p2p_buffer,
    check_routing_default,
    check_timeout,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (scripts/gpu_check.sh runs these on a GPU machine)",
)


# ---------------------------------------------------------------------------------------------
# parent side

W_ALL = [1, 2, 3, 4]


@pytest.fixture(params=W_ALL, ids=[f"w{w}" for w in W_ALL])
def gpu_world(request):
    w = conftest._world(request.param)
    w.start()
    return w


def _ok(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert all(r["cases"] > 0 for r in results), results


@pytest.mark.parametrize("algo", ALL_GATHER_ALGOS)
def test_all_gather(gpu_world, algo):
    _ok(gpu_world.run(check_all_gather, algo))


@pytest.mark.parametrize("algo,steps", REDUCE_SCATTER_ALGOS)
def test_reduce_scatter(gpu_world, algo, steps):
    _ok(gpu_world.run(check_reduce_scatter, algo, steps))


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_all_reduce(gpu_world, algo):
    _ok(gpu_world.run(check_all_reduce, algo))


def test_broadcast(gpu_world):
    _ok(gpu_world.run(check_broadcast))


def test_all_gather_v(gpu_world):
    _ok(gpu_world.run(check_all_gather_v))


def test_all_to_all(gpu_world):
    _ok(gpu_world.run(check_all_to_all))


def test_gather_scatter(gpu_world):
    _ok(gpu_world.run(check_gather_scatter))


def test_reduce(gpu_world):
    _ok(gpu_world.run(check_reduce))


@pytest.mark.parametrize("algorithm", ["pipeline", "pull_ahead"])
def test_fused_all_gather_matmul(gpu_world, algorithm):
    _ok(gpu_world.run(check_fused_all_gather_matmul, algorithm))


@pytest.mark.parametrize("algorithm", ["pipeline", "ring"])
def test_fused_matmul_reduce_scatter(gpu_world, algorithm):
    _ok(gpu_world.run(check_fused_matmul_reduce_scatter, algorithm))


@pytest.mark.parametrize("W", [2, 4])  # one rank needs no peer's data, so nothing to grow
def test_growth_and_rounds(W):
    _ok(conftest._world(W).run(check_growth_and_rounds))


def test_symmetric_tensors(gpu_world):
    _ok(gpu_world.run(check_symmetric_tensors))


def test_zero_copy_collectives(gpu_world):
    _ok(gpu_world.run(check_zero_copy_collectives))


def test_zero_copy_mismatch(gpu_world):
    _ok(gpu_world.run(check_zero_copy_mismatch))


def test_deadlocked_root_mismatch(gpu_world):
    _ok(gpu_world.run(check_deadlocked_root_mismatch))


def test_symmetric_heap_limits(gpu_world):
    _ok(gpu_world.run(check_symmetric_heap_limits))


def test_windows(gpu_world):
    _ok(gpu_world.run(check_windows))


def test_get_p2p_buffer(gpu_world):
    _ok(gpu_world.run(check_p2p_buffer))


def test_async_wait_on_a_side_stream(gpu_world):
    _ok(gpu_world.run(check_async_side_stream))


def test_is_completed_only_once_the_gpu_ran_the_op(gpu_world):
    _ok(gpu_world.run(check_is_completed))


def test_routing_default_nccl_one_rank():
    _ok(conftest._world(1).run(check_routing_default, "cuda_p2p"))


def test_routing_default_shared_gpu(gpu_world):
    _ok(gpu_world.run(check_routing_default, NONCCL))


@pytest.mark.parametrize("W", [2, 3])
def test_a_rank_that_never_arrives_is_named(W):
    world = conftest._world(W)
    absent = W - 1
    try:
        results = world.run(check_timeout, absent, timeout=60)
    finally:
        world.close(graceful=False)  # the ranks' group is aborted: start the next test afresh
    for r in results:
        if r["rank"] == absent:
            continue
        assert len(r["errors"]) == 2, r
        for what, err, secs in r["errors"]:
            assert err is not None, f"rank {r['rank']}: {what}: no error within {secs:.1f} s"
            assert str(absent) in err and ("never arrived" in err or "timed out" in err.lower()), (
                f"rank {r['rank']}: {what}: the error does not name rank {absent}: {err}")
            assert secs < TIMEOUT_S + MARGIN_S, f"rank {r['rank']}: {what} took {secs:.1f} s"
        assert r["synchronize_s"] < MARGIN_S, r
