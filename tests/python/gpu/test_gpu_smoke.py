"""tests/python/gpu_scripts/gpu_smoke.py, the first step of scripts/gpu_check.sh, run on the host
workspace: the script itself must work before a GPU machine's scarce minutes are spent on it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from _harness import GPU_SCRIPTS


def test_gpu_smoke_steps_pass_on_the_host_workspace():
    # 2 ranks: the 1-rank run is the in-process one below.
    r = subprocess.run(
        [sys.executable, os.path.join(GPU_SCRIPTS, "gpu_smoke.py"), "--device", "cpu",
         "--world-sizes", "2", "--timeout", "90"],
        capture_output=True, text=True, timeout=200,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "every step passed" in out, out
    # Every step printed its "ok" line, on every rank.
    for rank in (0, 1):
        assert f"rank {rank}: fused_matmul_reduce_scatter (pipeline) ok" in out, out
        assert f"rank {rank}: get_p2p_buffer after growth ok" in out, out
        assert f"rank {rank}: PASSED" in out, out
    # The fused paths themselves ran (not "auto"'s unfused one).
    assert "fused_all_gather_matmul.pipeline" in out, out
    assert "fused_matmul_reduce_scatter.pipeline" in out, out


def test_gpu_smoke_runs_one_rank_in_process_for_a_debugger():
    r = subprocess.run(
        [sys.executable, os.path.join(GPU_SCRIPTS, "gpu_smoke.py"), "--device", "cpu",
         "--in-process"],
        capture_output=True, text=True, timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "== workspace, 1 rank, in this process" in out, out
    assert "rank 0: fused_matmul_reduce_scatter (pipeline) ok" in out, out
    assert "rank 0: PASSED" in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
def test_gpu_smoke_says_so_without_a_gpu():
    r = subprocess.run([sys.executable, os.path.join(GPU_SCRIPTS, "gpu_smoke.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no CUDA GPU here" in r.stderr
