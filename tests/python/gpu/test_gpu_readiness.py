"""The multi-GPU-readiness scripts of scripts/gpu_check.sh (gpu_stress.py, gpu_fault.py,
gpu_teardown.py), run here with --device cpu: the same schedules and checks on the host
workspace, so that a GPU machine's scarce minutes are not spent on a fault of the scripts
themselves. (They have not run on a GPU unless docs/testing.md says so.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from _harness import GPU_SCRIPTS

sys.path.insert(0, GPU_SCRIPTS)


# The three scripts' CPU runs, started together on first use (module fixture): most of each run
# is its ranks' start-up and a fault's timeout, so side by side they cost the suite one run's
# wall time rather than three.
_RUNS = {
    "stress": ["gpu_stress.py", "--world-sizes", "2", "--ops", "120", "--max-elems", "20000",
               "--timeout", "100"],
    "fault": ["gpu_fault.py", "--op-timeout", "2", "--margin", "10", "--timeout", "100"],
    "teardown": ["gpu_teardown.py", "--ops", "16", "--op-timeout", "5", "--stagger", "0.3",
                 "--timeout", "100"],
}


@pytest.fixture(scope="module")
def runs():
    procs = {name: subprocess.Popen(
        [sys.executable, os.path.join(GPU_SCRIPTS, argv[0]), "--device", "cpu", *argv[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, argv in _RUNS.items()}
    outputs: dict = {}

    def result(name: str) -> str:
        if name not in outputs:
            out, _ = procs[name].communicate(timeout=150)
            outputs[name] = out
            assert procs[name].returncode == 0, out[-6000:]
        return outputs[name]

    yield result
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


def test_the_stress_schedule_is_the_same_on_every_rank_and_covers_every_kind():
    import gpu_stress

    a = gpu_stress.schedule(7, 400, 1 << 17)
    assert a == gpu_stress.schedule(7, 400, 1 << 17)
    assert a != gpu_stress.schedule(8, 400, 1 << 17)
    assert {op["kind"] for op in a} == set(gpu_stress.KINDS)
    assert {op["stream"] for op in a} == set(gpu_stress.STREAMS)
    assert {op["group"] for op in a} == {0, 1}
    assert any(op["async"] for op in a) and any(op["n"] == 0 for op in a)
    assert max(op["n"] for op in a) > 1 << 14  # several rounds on the 64 KiB group


def test_the_stress_script_checks_every_op_on_the_host_workspace(runs):
    out = runs("stress")
    assert "every run passed" in out, out
    for rank in (0, 1):
        assert f"rank {rank}: checked 120 ops" in out, out
        assert f"rank {rank}: PASSED" in out, out
    assert "fused_all_gather_matmul.pipeline" in out and "all_reduce.one_shot" in out, out


def test_the_fault_script_names_the_rank_that_never_arrives_on_the_host_workspace(runs):
    out = runs("fault")
    assert "rank 0: error after" in out and "rank 1" in out, out
    assert "rank 0: a new group on the same device passed a checked all_reduce" in out, out
    assert "rank 1: PASSED" in out and "every run passed" in out, out


def test_the_teardown_script_on_the_host_workspace(runs):
    out = runs("teardown")
    for scenario in ("queued", "staggered", "early_exit"):
        assert f"rank 0: {scenario}: the queued results match plain torch" in out, out
    for scenario in ("queued", "staggered"):
        for rank in (0, 1):
            assert f"rank {rank}: {scenario}: a new group passed a checked all_reduce" in out, out
    assert "rank 1: exits without destroy_process_group" in out, out
    assert "every run passed" in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
@pytest.mark.parametrize("script", ["gpu_stress", "gpu_fault", "gpu_teardown"])
def test_each_script_says_so_without_a_gpu(script, monkeypatch, capsys):
    import importlib

    main = importlib.import_module(script).main
    monkeypatch.setattr(sys, "argv", [f"{script}.py"])
    assert main() == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_the_stress_check_reports_a_result_that_differs():
    """The check itself can fail: a wrong result is named by its op."""
    from types import SimpleNamespace

    import gpu_stress

    op = gpu_stress.schedule(0, 1, 100)[0]
    run = SimpleNamespace(rank=0, cuda=False, pending=[
        (op, torch.ones(3), torch.ones(3), None),
        (dict(op, i=99), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0]), None)])
    with pytest.raises(AssertionError, match=r"(?s)1 results differ .*op 99 .*differs at \[1\]"):
        gpu_stress._Run.check(run)
    assert run.pending == []
