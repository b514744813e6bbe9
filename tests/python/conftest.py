"""Session-scoped pools of ranks (W=2, 3, 4 and 6) on the cuda_p2p backend; see _harness.py."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _harness import World  # noqa: E402

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
    """Six ranks: two simulated hosts of three (tests/python/test_hierarchical.py)."""
    w = _world(6)
    w.start()
    return w


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


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of `bash scripts/test.sh --quick`")


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
    pids = [pid for w in _worlds.values() for pid in w.pids()]
    for w in _worlds.values():
        w.close()
        w.remove_logs()
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
