"""Process-group lifetime: creating, destroying and releasing cuda_p2p groups."""

from __future__ import annotations

import os
import sys

import pytest

from _harness import run_script

HERE = os.path.dirname(os.path.abspath(__file__))


def test_destroy_process_group_does_not_deadlock():
    res = run_script([sys.executable, os.path.join(HERE, "_lifecycle_script.py"), "10"], timeout=90)
    assert not res.timed_out, res.output[-5000:]
    assert res.returncode == 0, f"exit code {res.returncode} (deadlock?):\n{res.output[-5000:]}"
    assert "rank 0: 10 iterations" in res.output and "rank 1: 10 iterations" in res.output
