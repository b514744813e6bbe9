"""Nobody else gets in: a process of another user in the job's store, a second job on the same
port. Each case runs its own processes (_security_rank.py), like test_faults.py.

The store-level checks (malformed records, a forged pid or another user behind a block-exchange
socket) are in tests/cpp/test_workspace_records.cpp.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from _harness import RANKS, _pids_with_token, free_port

NOBODY = 65534
# How long a rank process may take to start (a torch import), do its part and exit: a backstop,
# not an expectation (7-11 s here, idle or beside busy loops). A rank that blocks fails by its
# group's timeout well before.
EXIT_S = 180


class Job:
    """Rank processes started one by one; whatever happens, none survives close()."""

    def __init__(self):
        self.token = uuid.uuid4().hex
        self.dir = tempfile.mkdtemp(prefix="cuda_p2p_security_")
        os.chmod(self.dir, 0o777)  # a rank running as another user writes its result here
        self.procs = []
        self.logs_open = []

    def start(self, rank, world, port, name, hold=None, user=None):
        out = os.path.join(self.dir, f"{name}.jsonl")
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        self.logs_open.append(log)
        os.chmod(log.name, 0o666)
        env = dict(os.environ, CUDA_P2P_TEST_TOKEN=self.token, OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.join(RANKS, "_security_rank.py"), str(rank), str(world),
               str(port), out] + ([hold] if hold else [])
        if user is not None:
            env["HOME"] = self.dir
            cmd += ["--as-uid", str(user)]
        self.procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                  env=env, start_new_session=True)))
        return out

    def wait(self, name, timeout):
        proc = dict(self.procs)[name]
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        return proc.poll()

    def results(self, name):
        path = os.path.join(self.dir, f"{name}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def logs(self):
        text = ""
        for name, _ in self.procs:
            with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                text += f"--- {name} ---\n{f.read()[-3000:]}\n{self.results(name)}\n"
        return text

    def close(self):
        for pid in _pids_with_token(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in self.logs_open:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)  # the logs are in the failures' messages


def _can_switch_user() -> bool:
    # The stranger is a forked child that drops to NOBODY after the imports (_security_rank.py).
    return os.getuid() == 0


@pytest.mark.skipif(not _can_switch_user(),
                    reason="needs root to run a rank as uid 65534; the same-uid pid check is in "
                           "tests/cpp/test_workspace_records.cpp (BlockExchange)")
def test_a_rank_of_another_user_gets_no_block_mapped():
    # A process of uid 65534 takes rank 1's place in a root job's store: its record names its own
    # exchange socket and its own memfd. Rank 0 must refuse the block (the workspace is then off
    # on every rank, with the reason), never map it; the job still computes right through Gloo.
    job = Job()
    try:
        port = free_port()
        job.start(0, 2, port, "rank0")
        job.start(1, 2, port, "stranger", user=NOBODY)
        for name in ("rank0", "stranger"):
            assert job.wait(name, EXIT_S) == 0, job.logs()
        (r0,) = job.results("rank0")
        (stranger,) = job.results("stranger")
        assert stranger["uid"] == NOBODY
        assert "error" not in r0, job.logs()
        assert r0["available"] is False, job.logs()
        assert "rank 0 mapping rank 1's block" in r0["reason"], r0["reason"]
        assert f"served by uid {NOBODY} pid {stranger['pid']}, expected uid 0" in r0["reason"], (
            r0["reason"])
        assert r0["allreduce_ok"], job.logs()
        # The stranger gets nothing either (the exporter checks the uid too).
        assert stranger.get("available") is False, job.logs()
    finally:
        job.close()


def test_a_second_job_on_the_same_port_fails_clearly_and_leaves_the_first_alone():
    job = Job()
    try:
        port = free_port()
        hold = os.path.join(job.dir, "go")
        job.start(0, 2, port, "a0", hold=hold)
        job.start(1, 2, port, "a1", hold=hold)
        deadline = time.time() + EXIT_S
        while time.time() < deadline and not all(
                any(r.get("held") for r in job.results(n)) for n in ("a0", "a1")):
            assert all(p.poll() is None for _, p in job.procs), job.logs()
            time.sleep(0.1)
        first = [job.results(n)[0] for n in ("a0", "a1")]
        assert all(r["available"] and r["blocks_are_the_peers"] and r["allreduce_ok"]
                   for r in first), job.logs()
        # Job B, same port: its rank 0 cannot bind the port; its rank 1 reaches job A's store.
        job.start(0, 2, port, "b0")
        job.start(1, 2, port, "b1")
        assert job.wait("b0", EXIT_S) == 0 and job.wait("b1", EXIT_S) == 0, job.logs()
        (b0,) = job.results("b0")
        (b1,) = job.results("b1")
        assert "error" in b0 and "in use" in b0["error"].lower(), b0
        assert "another job already uses this store: rank 1's slot" in b1.get("error", ""), b1
        assert f"held by another process (pid {first[1]['pid']} on" in b1["error"], b1
        # Job A goes on as if nothing happened.
        open(hold, "w").close()
        for n in ("a0", "a1"):
            assert job.wait(n, EXIT_S) == 0, job.logs()
            end = job.results(n)[-1]
            assert end["phase"] == "end" and "error" not in end, job.logs()
            assert end["second_allreduce_ok"], job.logs()
    finally:
        job.close()
