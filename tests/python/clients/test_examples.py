"""The scripts in examples/ run as a user runs them: under torchrun on 2 CPU ranks, each checking
its own result (against the same math in one process) and its counters. examples/gpu_launch.py
needs a GPU: CI compiles it, scripts/gpu_check.sh runs it."""

from __future__ import annotations

import os
import py_compile
import sys

import pytest

from _harness import REPO, free_port, run_script

EXAMPLES = os.path.join(REPO, "examples")
TIMEOUT_S = 240


def _torchrun(script: str, nproc: int = 2) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), os.path.join(EXAMPLES, script)]
    res = run_script(cmd, timeout=TIMEOUT_S)
    assert not res.timed_out, f"{script} did not finish in {TIMEOUT_S} s:\n{res.output[-6000:]}"
    assert res.returncode == 0, f"{script} exited with {res.returncode}:\n{res.output[-6000:]}"
    return res.output


def test_every_example_is_short_and_listed():
    scripts = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))
    assert scripts == ["async_tp_training.py", "cpu_tp_inference.py", "gpu_launch.py",
                       "zero_copy.py"], "a new example needs a test here"
    for f in scripts:
        with open(os.path.join(EXAMPLES, f)) as fh:
            n = len(fh.read().splitlines())
        assert n <= 80, f"examples/{f} has {n} lines; an example a user copies stays within 80"


def test_cpu_tp_inference():
    out = _torchrun("cpu_tp_inference.py")
    assert "2 ranks: max |tensor-parallel - whole| = " in out, out[-3000:]
    assert "'all_reduce.one_shot': 2" in out, out[-3000:]


def test_zero_copy():
    out = _torchrun("zero_copy.py")
    assert "'all_gather.zero_copy': 1" in out and "'reduce_scatter.zero_copy': 1" in out, \
        out[-3000:]


@pytest.mark.slow
def test_async_tp_training():
    out = _torchrun("async_tp_training.py")
    for i in range(3):
        assert f"step {i}: loss " in out, out[-3000:]
    assert "fused ops that ran (forward and backward)" in out, out[-3000:]


def test_gpu_launch_compiles(tmp_path):
    # Syntax only: it needs a GPU (scripts/gpu_check.sh runs it, step `examples`).
    py_compile.compile(os.path.join(EXAMPLES, "gpu_launch.py"),
                       cfile=str(tmp_path / "gpu_launch.pyc"), doraise=True)
