"""scripts/gpu_check.sh on a machine without a GPU: one line, status 2, within seconds (the GPU
run itself happens where a GPU is lent; see docs/testing.md); and the build's refusal of a compiler
that would put a second libstdc++ into cuda_p2p._C."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
