"""cuda_p2p under torchrun (env:// initialisation), with and without pg_options."""

from __future__ import annotations

import json
import os
import sys

import pytest

from _harness import RANKS, free_port, run_script

NPROC = 2
TIMEOUT_S = 120


@pytest.mark.parametrize("mode", ["default", "pg_options"])
def test_torchrun(tmp_path, mode):
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(NPROC),
        "--master-port", str(free_port()),
        os.path.join(RANKS, "_torchrun_script.py"), mode, str(tmp_path),
    ]  # fmt: skip
    res = run_script(cmd, timeout=TIMEOUT_S)
    text = res.output
    assert not res.timed_out, f"torchrun did not finish in {TIMEOUT_S} s:\n{text[-8000:]}"
    assert res.returncode == 0, f"torchrun exited with {res.returncode}:\n{text[-8000:]}"

    reports = []
    for r in range(NPROC):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no report:\n{text[-5000:]}"
        reports.append(json.loads(path.read_text()))
    W = NPROC
    for r, rep in enumerate(reports):
        assert rep["rank"] == r and rep["world"] == W
        assert "init_process_group" in rep["before_init"], rep["before_init"]
        assert rep["is_cuda_p2p"] is True
        assert rep["backend_name"] == "cuda_p2p"
        assert rep["rank_size"] == [r, W, r, W]
        assert rep["all_reduce"] == [float(i * W * (W + 1) // 2) for i in range(6)]
        assert rep["all_gather"] == [q for q in range(W) for _ in range(3)]
        if mode == "pg_options":
            assert "pg_options must be" in rep["bad_pg_options"], rep["bad_pg_options"]
            assert rep["initialized_after_bad"] is False
            assert rep["buffer_size"] == 1 << 20
        else:
            assert rep["buffer_size"] is None
    assert len({p for rep in reports for p in rep["pids"]}) == W, "ranks are not distinct processes"
