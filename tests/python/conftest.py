"""Session-scoped pools of ranks (W=2, 3, 4 and 6) on the cuda_p2p backend; see _harness.py."""

from __future__ import annotations

import fnmatch
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The shared helpers live here, each subject's tests and helpers in a folder of their own
# (docs/testing.md, "Layout"). Every folder is on sys.path before any pool starts: a rank process
# imports a test's module by its name to run one of its functions, and the ranks get the
# sys.path of the moment they were spawned.
sys.path.insert(0, HERE)
for _d in sorted(os.listdir(HERE)):
    if os.path.isdir(os.path.join(HERE, _d)) and not _d.startswith(("_", ".")):
        sys.path.insert(1, os.path.join(HERE, _d))

import _cpu_report  # noqa: E402
from _harness import World, state_leaks, stop_rank_processes  # noqa: E402

# NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp: this suite tests the host
# workspace, and on a GPU machine a group's workspace would be on the GPU by default, sending the
# CPU tensors to Gloo (the third GPU run, 2026-11-26: the suite ran there and failed on its
# counters). Every rank and script the tests start inherits this; test_gpu.py takes it away for
# its groups on a GPU.
os.environ.setdefault("CUDA_P2P_WORKSPACE_DEVICE", "cpu")
# The torch.compile tests compile on every rank at once: a pool of inductor compile workers per
# rank (one per CPU) only adds processes that import torch to two shared cores.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

_worlds: dict[int, World] = {}


def _world(size: int) -> World:
    if size not in _worlds:
        _worlds[size] = World(size)
    return _worlds[size]


@pytest.fixture(scope="session")
def world2() -> World:
    w = _world(2)
    w.start()
    return w


@pytest.fixture(scope="session")
def world3() -> World:
    w = _world(3)
    w.start()
    return w


@pytest.fixture(scope="session")
def world4() -> World:
    w = _world(4)
    w.start()
    return w


@pytest.fixture(scope="session")
def world6() -> World:
    """Six ranks: two simulated hosts of three (tests/python/collectives/test_hierarchical.py)."""
    w = _world(6)
    w.start()
    return w


@pytest.fixture(autouse=True)
def _pools_left_clean():
    """Ranks are reused across tests (a pool per world size, _harness.py): after a test that ran
    on a pool, a barrier on its groups and a check that the test put back what it changed in the
    ranks (_harness.state_leaks). A pool that fails it is restarted, and the test fails: a test
    must not pass its state on to the next one."""
    calls = {size: w.calls for size, w in _worlds.items()}
    yield
    leaks = []
    for size, w in list(_worlds.items()):
        if not w.alive or w.calls == calls.get(size, 0):
            continue
        try:
            found = w.run(state_leaks, timeout=60)
        except Exception as e:  # noqa: BLE001  (the pool is torn down by run() already)
            leaks.append(f"the {size}-rank pool failed its barrier after the test: {e}")
            continue
        if any(found):
            w.close(graceful=False)
            leaks += [f"rank {r} of {size}: {leak}" for r, ls in enumerate(found) for leak in ls]
    if leaks:
        pytest.fail("the test left state in the ranks it ran on (the pool is restarted):\n"
                    + "\n".join(leaks), pytrace=False)


@pytest.fixture(params=[2, 4], ids=["w2", "w4"])
def world(request) -> World:
    """Both world sizes: a test using it runs once on 2 ranks and once on 4."""
    return request.getfixturevalue(f"world{request.param}")


@pytest.fixture(params=[2, 3, 4], ids=["w2", "w3", "w4"])
def any_world(request) -> World:
    """Three world sizes: a test using it runs on 2, 3 and 4 ranks."""
    return request.getfixturevalue(f"world{request.param}")


# `bash scripts/test.sh --quick` (docs/testing.md, "The quick loop") runs `pytest -m "not slow"`:
# these files' tests are marked slow here, as are SLOW_TESTS, the tests on 3 or more ranks and
# those marked @pytest.mark.slow themselves. A file is here when it takes over ~20 s on our 2
# cores (subprocess launches, torch.compile, 6 ranks, timeouts waited for on purpose) or is a
# soak; the full run (CI) runs everything.
SLOW_FILES = frozenset({
    "test_soak.py", "test_faults.py", "test_async_tp.py", "test_autograd.py", "test_bench.py",
    "test_scripts.py", "test_launch.py", "test_lifecycle.py", "test_security.py",
    "test_clients.py", "test_gpu_rehearsal.py", "test_gpu_smoke.py", "test_hierarchical.py",
    "test_all_reduce_rounds.py", "test_harness.py", "test_gpu.py", "test_examples.py",
})
# Single tests over ~20 s (torch.compile, a subprocess's ranks) in files that are otherwise quick.
SLOW_TESTS = frozenset({
    "test_all_reduce_op.py::test_torch_compile_fullgraph",
    "test_diagnose.py::test_world_size_2_text",
})


# Tests whose behaviour differs on a host workspace with CUDA's semantics (ops return queued, a
# released wait lets its stream run on, a mismatch fails the group): marked cuda_semantics, and
# scripts/test.sh runs them once more in that mode. fnmatch patterns on "file::test[params]". One
# world size per algorithm where the protocol does not depend on it (3: odd, rings uneven). They
# reach every path (counter) that the three whole files run before reached in that mode
# (CUDA_P2P_TEST_COUNTERS, docs/measurements/ci-times-2026-12-02.md).
CUDA_SEMANTICS_TESTS = (
    "test_ws_collectives.py::test_all_reduce[[]w3-*",       # each algorithm, queued, checked
    "test_ws_collectives.py::test_all_gather[[]w3-*",
    "test_ws_collectives.py::test_reduce_scatter[[]w3-*",
    "test_ws_collectives.py::test_broadcast[[]w3]",
    "test_ws_collectives.py::test_all_gather_v[[]w3]",
    "test_ws_collectives.py::test_*_cross_memory[[]w3]",  # cross-memory reads of queued ops
    "test_ws_collectives_api.py::test_api_async_fallbacks_and_off_switches[[]w2]",  # Works, futures
    "test_ws_collectives_api.py::test_synchronous_calls_return_no_work[[]w2]",  # a Work on CUDA
    "test_ws_collectives_api.py::test_timeout_names_the_missing_rank",  # the device fails
    "test_ws_collectives_api.py::test_a_late_rank_learns_of_the_failure",  # failure words
    "test_ws_collectives_api.py::test_ddp_on_cuda_p2p_matches_gloo",  # DDP on queued Works
    "test_collectives.py::test_collective[[]w4-*-float32]",  # async Works against Gloo's
    "test_fused_ops.py::test_all_gather_matmul[[]w3]",  # the pipelines in stream order
    "test_fused_ops.py::test_matmul_reduce_scatter[[]w3]",
    "test_fused_ops.py::test_buffer_too_small[[]*]",  # rounds and growth behind queued work
    "test_fused_ops.py::test_send_recv_paths[[]w3-*]",  # the pipelines over send/recv
    "test_fused_ops.py::test_host_streams_as_threads",
    "test_fused_ops.py::test_absent_rank_is_named_and_the_group_refuses_later_pipelines",
    "test_faults.py::test_killed_rank_is_named_by_every_survivor[[]allreduce_*]",
    "test_faults.py::test_killed_rank_is_named_by_every_survivor[[]fused]",
    "test_faults.py::test_killed_rank_is_named_by_every_survivor[[]grow]",
    "test_faults.py::test_stopped_rank_past_the_timeout_is_named_and_everyone_exits",
    "test_faults.py::test_survivors_free_nothing_a_timed_out_op_still_touches[[]all_to_all_uneven]",
    "test_faults.py::test_survivors_shrink_past_a_killed_rank_and_finish_training[[]3-1]",
)
# The longer forms (marker long): only with --long (scripts/test.sh --long), never in CI. Each is a
# variant whose behaviour a test CI runs also checks (the reason beside it).
LONG_TESTS = (
    # A 4-rank inductor compile of the TP MLP (~70 s of CPU): the 2-rank one checks the same
    # pattern matching, steps and gradients (and examples/async_tp_training.py compiles it too).
    "test_async_tp.py::test_dtensor_tp_mlp_trains_on_the_fused_ops[[]w4]",
    # The transformer block through functional collectives: the DTensor form with biases checks
    # the same block fused; the funcol forms are matched on traced graphs (test_forms_...).
    "test_async_tp.py::test_transformer_block_fuses_everything_w2[[]funcol]",
    # make_fx only, where the group's size does not matter: 2 ranks check it.
    "test_async_tp.py::test_forms_on_traced_graphs[[]w4]",
    # bench_collectives.py's zero-copy columns with the signature agreement: auto runs in CI, and
    # test_zero_copy_collectives.py checks both agreements.
    "test_bench.py::test_bench_collectives_zero_copy[[]signature]",
    # The dispatcher ops on 3 ranks: the 2- and 4-rank cases and test_ws_collectives.py's 3-rank
    # all-reduce check the same code (it does not depend on the group's size).
    "test_all_reduce_op.py::test_values_3_ranks[[]*]",
)


def _matches(item, patterns) -> bool:
    name = f"{item.path.name}::{item.name}"
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked long (scripts/test.sh --long; not CI)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of `bash scripts/test.sh --quick`")
    config.addinivalue_line(
        "markers", "long: a soak, stress or benchmark at full size: only with --long (not CI)")
    config.addinivalue_line(
        "markers", "cuda_semantics: behaves differently on a host workspace with CUDA's semantics "
        "(async errors, mismatches, queued ops, failures): scripts/test.sh runs it once more "
        "with CUDA_P2P_HOST_SEMANTICS=cuda")
    config.addinivalue_line(
        "markers", "asan: scripts/sanitizers.sh runs it once more in each host mode with the "
        "ranks' cuda_p2p extension built with ASan+UBSan (docs/testing.md, \"C++ tests and "
        "sanitizers\")")
    _cpu_report.register(config)
    # The soak's length (workspace/test_soak.py): CI's run checks its behaviour at 2000 ops, the
    # long run soaks.
    os.environ.setdefault("CUDA_P2P_SOAK_OPS", "10000" if config.getoption("--long") else "2000")


def _more_than_two_ranks(item) -> bool:
    """Whether a test runs on a pool of 3 or more ranks (the quick loop keeps 2-rank tests)."""
    if set(getattr(item, "fixturenames", ())) & {"world3", "world4", "world6"}:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(params[k] not in (2, "world2") for k in ("world", "any_world") if k in params)


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = f"{item.path.name}::{item.originalname}"
        if item.path.name in SLOW_FILES or name in SLOW_TESTS or _more_than_two_ranks(item):
            item.add_marker(pytest.mark.slow)
        if _matches(item, CUDA_SEMANTICS_TESTS):
            item.add_marker(pytest.mark.cuda_semantics)
        if _matches(item, LONG_TESTS):
            item.add_marker(pytest.mark.long)
    if not config.getoption("--long"):
        # Deselected, not skipped: CI's run does not have them, by design.
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]


def pytest_runtest_logreport(report):
    """With CUDA_P2P_REPORT_FAILURES_NOW=1 (scripts/gpu_check.sh sets it), a failure's traceback
    is printed when it happens, not only in pytest's summary at the end: a run cut off by its time
    limit still says why the tests before failed (on the second GPU run it did not)."""
    if report.failed and os.environ.get("CUDA_P2P_REPORT_FAILURES_NOW") == "1":
        text = report.longreprtext
        if len(text) > 4000:
            text = text[:1000] + "\n[...]\n" + text[-3000:]
        print(f"\n--- {report.nodeid} ({report.when}) failed:\n{text}\n---", flush=True)


def pytest_sessionfinish(session, exitstatus):
    # A test that makes a rank raise, or leaves state behind, restarts its pool.
    if _worlds:
        print("\ncuda_p2p tests: pool starts " + ", ".join(
            f"{size} ranks {w.starts}" for size, w in sorted(_worlds.items())))
    pids = [pid for w in _worlds.values() for pid in w.pids()]
    for w in _worlds.values():
        w.close()
        w.remove_logs()
    stop_rank_processes()
    stray = [pid for pid in pids if _alive(pid)]
    if stray:  # close() kills what does not stop; this would be a harness bug
        print(f"\ncuda_p2p tests: worker processes still alive after the session: {stray}")
        session.exitstatus = 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
