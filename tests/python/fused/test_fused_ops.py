"""The fused GEMM pipelines against the unfused reference on 2, 3 and 4 ranks.

Each remote call runs a whole batch of cases (every gather/scatter dim of 2-D and 3-D A, every
dtype, return_A, several Bs, every reduce op and algorithm) on one path, and reports every
failing case by name together with the backend's counters, which prove which path ran.
"""

from __future__ import annotations

import pytest

import _fused_checks as fc

WORLDS = ["world2", "world3", "world4"]


def assert_all_ok(results, min_cases=1):
    failures = [f"[rank {r}] {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures[:40])
    cases = [res["cases"] for res in results]
    assert min(cases) >= min_cases, f"too few cases ran: {cases}"
    return results[0]["counters"]


@pytest.fixture(params=WORLDS, ids=["w2", "w3", "w4"])
def any_world(request):
    return request.getfixturevalue(request.param)


# --- the workspace paths ---------------------------------------------------------------------


def test_all_gather_matmul(any_world):
    n = len(fc.AG_CASES) * len(fc.DTYPES) * 2 * len(fc.AG_ALGORITHMS)
    counters = assert_all_ok(any_world.run(fc.run_safely, fc.check_all_gather_matmul,
                                           "workspace"), n)
    # "pipeline", and "auto", which is pull-ahead on CPU tensors
    assert counters == {"fused_all_gather_matmul.pipeline": n // 2,
                        "fused_all_gather_matmul.pull_ahead": n // 2}, counters


def test_matmul_reduce_scatter(any_world):
    n = len(fc.RS_CASES) * len(fc.DTYPES) * 2 * len(fc.RS_ALGORITHMS)
    counters = assert_all_ok(any_world.run(fc.run_safely, fc.check_matmul_reduce_scatter,
                                           "workspace"), n)
    per_algorithm = n // len(fc.RS_ALGORITHMS)
    assert counters == {
        "fused_matmul_reduce_scatter.pipeline": per_algorithm,
        # "ring", "ring" with 2W steps, and "auto", which is the ring on CPU tensors
        "fused_matmul_reduce_scatter.ring": 3 * per_algorithm,
    }, counters


def test_random_values_within_float32_tolerance(world3):
    assert_all_ok(world3.run(fc.run_safely, fc.check_random_values, "workspace"))


def test_host_streams_as_threads(world2, world4):
    # The same pipelines with a thread per host stream, the GPU's concurrency: a missing join
    # between the two streams would show up here as a race.
    dtypes = ("float32", "bfloat16")
    for world in (world2, world4):
        n_ag = len(fc.AG_CASES) * len(dtypes) * 2 * len(fc.AG_ALGORITHMS)
        n_rs = len(fc.RS_CASES) * len(dtypes) * 2 * len(fc.RS_ALGORITHMS)
        c1 = assert_all_ok(world.run(fc.run_safely, fc.check_all_gather_matmul, "threads",
                                     dtypes=dtypes), n_ag)
        c2 = assert_all_ok(world.run(fc.run_safely, fc.check_matmul_reduce_scatter, "threads",
                                     dtypes=dtypes), n_rs)
        assert sum(c1.values()) == n_ag and sum(c2.values()) == n_rs, (c1, c2)
        assert not any("send_recv" in k for k in {**c1, **c2}), (c1, c2)


# --- without the workspace: the ring over the wrapped backend's send/recv ------------------------


@pytest.mark.parametrize("path", ["no_workspace", "two_hosts"])
def test_send_recv_paths(any_world, path):
    dtypes = ("float32", "bfloat16")
    n_ag = len(fc.AG_CASES) * len(dtypes) * 2 * len(fc.AG_ALGORITHMS)
    n_rs = len(fc.RS_CASES) * len(dtypes) * 2 * len(fc.RS_ALGORITHMS)
    c1 = assert_all_ok(any_world.run(fc.run_safely, fc.check_all_gather_matmul, path,
                                     dtypes=dtypes), n_ag)
    c2 = assert_all_ok(any_world.run(fc.run_safely, fc.check_matmul_reduce_scatter, path,
                                     dtypes=dtypes), n_rs)
    # Every op took the send/recv path, counted; nothing else ran.
    assert c1 == {"fused_all_gather_matmul.send_recv": n_ag}, c1
    assert c2 == {"fused_matmul_reduce_scatter.send_recv": n_rs}, c2


# --- a buffer too small: rounds, or growth --------------------------------------------------------

BIG_AG = [((70, 16), 0), ((5, 14, 16), 1), ((33, 40), 1)]  # > 4096 bytes per rank
BIG_RS = [((80, 16), 0, 24), ((4, 13, 16), 1, 20), ((80, 16), 1, 16)]


@pytest.mark.parametrize("path", ["rounds", "grow"])
def test_buffer_too_small(world3, path):
    c1 = assert_all_ok(world3.run(fc.run_safely, fc.check_all_gather_matmul, path,
                                  dtypes=("float32",), cases=BIG_AG))
    c2 = assert_all_ok(world3.run(fc.run_safely, fc.check_matmul_reduce_scatter, path,
                                  dtypes=("float32",), cases=BIG_RS,
                                  algorithms=[("pipeline", 0), ("ring", 1), ("ring", 2)]))
    if path == "rounds":
        # Never silent: every op that did not fit ran in rounds and says so.
        assert c1.get("fused_all_gather_matmul.rounds", 0) == 4 * len(BIG_AG), c1
        assert c2.get("fused_matmul_reduce_scatter.rounds", 0) == 6 * len(BIG_RS), c2
        assert "fused_all_gather_matmul.grow" not in c1, c1
    else:
        # The first op too big grew the buffer, once; nothing ran in rounds.
        assert c1.get("fused_all_gather_matmul.grow") == 1, c1
        assert "fused_all_gather_matmul.rounds" not in c1, c1
        assert "fused_matmul_reduce_scatter.rounds" not in c2, c2


# --- errors, Meta kernels, torch.compile ----------------------------------------------------------


def test_errors_say_what_was_expected(any_world):
    assert_all_ok(any_world.run(fc.run_safely, fc.check_errors), 8)


def test_meta_kernels_and_fake_tensors(world2):
    assert_all_ok(world2.run(fc.run_safely, fc.check_meta_and_fake, False))


def test_torch_compile_traces_the_ops(world2):
    assert_all_ok(world2.run(fc.run_safely, fc.check_meta_and_fake, True, timeout=300))


def test_absent_rank_is_named_and_the_group_refuses_later_pipelines(world2):
    results = world2.run(fc.run_safely, fc.check_absent_rank)
    failures = [f"[rank {r}] {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, "\n".join(failures)
    assert results[0]["cases"] == 2
