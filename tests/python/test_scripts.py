"""scripts/gpu_check.sh on a machine without a GPU: one line, status 2, within seconds (the GPU
run itself happens where a GPU is lent; see docs/testing.md)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu_check.sh")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and "GPU" in lines[0], lines
    assert took < 60, f"gpu_check.sh took {took:.1f} s to find no GPU"
