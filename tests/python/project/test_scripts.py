"""scripts/gpu_check.sh on a machine without a GPU: one line, status 2, within seconds (the GPU
run itself happens where a GPU is lent; see docs/testing.md); and the build's refusal of a compiler
that would put a second libstdc++ into cuda_p2p._C."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]


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


def test_cmake_refuses_a_compiler_without_a_shared_libstdcxx(tmp_path):
    """NOTE [One libstdc++ in the process] (CMakeLists.txt): the GPU machine's GCC had only
    libstdc++.a, and every Python path crashed. A stand-in g++ that reports no libstdc++.so must
    stop the configure step with a message that names the compiler and the way out."""
    gxx = shutil.which("g++")
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    if not gxx or not cmake:
        pytest.skip(f"needs g++ and cmake (g++: {gxx}, cmake: {cmake})")
    fake = tmp_path / "g++-static-only"
    fake.write_text("#!/bin/sh\n"
                    'for a in "$@"; do [ "$a" = -print-file-name=libstdc++.so ] && '
                    "{ echo libstdc++.so; exit 0; }; done\n"
                    f'exec {gxx} "$@"\n')
    fake.chmod(0o755)
    proc = subprocess.run(
        [cmake, "-S", str(REPO), "-B", str(tmp_path / "build"), f"-DCMAKE_CXX_COMPILER={fake}",
         f"-DPython_EXECUTABLE={sys.executable}",
         f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"],
        capture_output=True, text=True, timeout=300)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-2000:]
    assert f"the C++ compiler {fake} has no shared libstdc++" in out, out[-2000:]
    assert "CXX=/usr/bin/g++" in out, out[-2000:]


@pytest.mark.parametrize("stacks", ["1", "0"])
def test_launch_names_and_shows_the_ranks_it_kills_at_its_time_limit(stacks):
    """tests/cpp/launch.py (the C++ tests' launcher on the GPU machines): past --timeout every
    rank is killed, status 124, the ranks still running named, and - where gdb is installed -
    their threads' stacks printed first (a hung rank cannot say where it hangs). Rank 1 never
    ends; rank 0 ends at once - unless the machine is so busy that it has not even started
    Python by the time limit, and then it is named among the killed too (the launcher's outcome
    is checked, not the machine's speed)."""
    env = dict(__import__("os").environ, CUDA_P2P_LAUNCH_STACKS=stacks)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "cpp" / "launch.py"), "-n", "2",
                           "--timeout", "3", "--", sys.executable, "-c",
                           "import os, time; print('rank', os.environ['RANK'], 'up', flush=True); "
                           "time.sleep(0 if os.environ['RANK'] == '0' else 600)"],
                          capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout
    assert proc.returncode == 124, (proc.returncode, out, proc.stderr)
    killed = re.search(r"TIMEOUT after 3 s: ranks \[([0-9, ]+)\] of 2 still running, killed", out)
    assert killed, out
    ranks = [int(r) for r in killed.group(1).split(",")]
    assert 1 in ranks and set(ranks) <= {0, 1}, out
    if 0 not in ranks:
        assert "rank 0 up" in out, out  # it ran to its end
    if "rank 1 up" in out:
        assert "[rank 1] rank 1 up" in out, out  # a killed rank's lines carry its name
    shown = "launch.py: rank 1's threads before the kill:" in out
    assert shown == (stacks == "1" and shutil.which("gdb") is not None), out
    if shown:
        assert "[rank 1 stack] #0" in out, out


def test_stage_report_fails_over_a_cpu_budget_and_only_says_so_over_a_wall_budget(tmp_path):
    """scripts/stages.sh (docs/testing.md, "Budgets"): a stage over 1.5 x its wall budget is
    reported SLOW and the run stays green (a slower or busier machine); over 1.5 x its CPU budget
    it fails."""
    # The budgets as CI's run has them: `scripts/test.sh --under-load`, which may be running this
    # test, exports a factor on the wall budgets.
    env = {k: v for k, v in os.environ.items() if k != "STAGE_WALL_FACTOR"}

    def report(wall, cpu):
        script = (f"set -u; STAGE_DIR={tmp_path}; TOTAL_WALL_BUDGET=1000; TOTAL_CPU_BUDGET=1000; "
                  f"source scripts/stages.sh; _record demo {wall} {cpu} 10 10; stage_report")
        return subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env=env)

    slow = report(wall=16, cpu=10)
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert "!!! SLOW: demo took 16 s of wall time" in slow.stdout, slow.stdout
    assert "OVER BUDGET" not in slow.stdout
    over = report(wall=10, cpu=16)
    assert over.returncode == 1, over.stdout + over.stderr
    assert "!!! OVER BUDGET: demo took 16 s of CPU" in over.stdout, over.stdout
    within = report(wall=15, cpu=15)
    assert within.returncode == 0 and "!!!" not in within.stdout, within.stdout
