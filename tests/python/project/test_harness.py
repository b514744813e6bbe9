"""The harness itself: per-rank results, remote errors with rank and traceback, timeouts that
tear the pool down instead of hanging, and a fresh pool afterwards. Uses its own 2-rank pool so
that the shared ones are not restarted."""

from __future__ import annotations

import os
import time

import pytest

import _harness
from _harness import HarnessError, RemoteError, World


@pytest.fixture(scope="module")
def own_world():
    w = World(2)
    yield w
    w.close()
    w.remove_logs()


def whoami(ctx, tag):
    import torch.distributed as dist

    return (ctx.rank, ctx.world_size, dist.get_rank(), dist.get_backend(), tag, os.getpid())


def fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise KeyError("boom from rank 1")
    return "ok"


def sleep_on_rank_0(ctx, seconds):
    if ctx.rank == 0:
        time.sleep(seconds)
    return "slept"


def die_on_rank_1(ctx):
    if ctx.rank == 1:
        os._exit(3)  # as a crash in C++ would: no reply, no traceback
    return "ok"


def stuck_in_collective(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        raise ValueError("rank 0 leaves before the collective")
    dist.all_reduce(torch.ones(1))  # rank 1 waits for rank 0 forever (until the PG timeout)


def _all_dead(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie is dead too (reaped by multiprocessing's join)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    continue
        except OSError:
            continue
        return False
    return True


def test_results_per_rank(own_world):
    res = own_world.run(whoami, "x")
    assert [r[:5] for r in res] == [(0, 2, 0, "cuda_p2p", "x"), (1, 2, 1, "cuda_p2p", "x")]
    assert res[0][5] != res[1][5] != os.getpid()


def test_remote_error_names_rank_and_traceback(own_world):
    pids = own_world.pids()
    with pytest.raises(RemoteError) as info:
        own_world.run(fail_on_rank_1)
    msg = str(info.value)
    assert "rank 1 of 2" in msg and "KeyError" in msg and "boom from rank 1" in msg
    assert "fail_on_rank_1" in msg and "Traceback" in msg  # the remote traceback
    assert "rank 0 of 2" not in msg
    # the pool was torn down and comes back on the next call
    assert _all_dead(pids)
    assert [r[4] for r in own_world.run(whoami, "again")] == ["again"] * 2


def test_rank_blocked_after_a_peer_failed(own_world, monkeypatch):
    monkeypatch.setattr(_harness, "GRACE_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as info:
        own_world.run(stuck_in_collective)
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert "rank 0 leaves before the collective" in msg
    assert "rank 1 of 2" in msg and "blocked in a collective" in msg


def test_dead_rank_is_reported(own_world):
    with pytest.raises(HarnessError, match=r"rank 1 of 2 (died|closed its pipe) .*exit code 3"):
        own_world.run(die_on_rank_1)
    assert not own_world.alive
    assert [r[4] for r in own_world.run(whoami, "after")] == ["after"] * 2


def test_timeout_tears_down_and_recovers(own_world):
    own_world.start()
    pids = own_world.pids()
    t0 = time.monotonic()
    with pytest.raises(HarnessError, match=r"timeout after 1 s .*ranks \[0\] of 2"):
        own_world.run(sleep_on_rank_0, 60, timeout=1)
    assert time.monotonic() - t0 < 20
    assert not own_world.alive and _all_dead(pids)
    assert own_world.run(sleep_on_rank_0, 0) == ["slept", "slept"]


def test_run_needs_a_module_level_function(own_world):
    with pytest.raises(TypeError, match="module-level"):
        own_world.run(lambda ctx: None)


# RankScript and pids_in_sessions: the fault suite's jobs (tests/python/faults/test_faults.py).

_SCRIPT = '''
import json, os, subprocess, sys, time
print("hello from", __name__, flush=True)
child = subprocess.Popen(["sleep", "60"])  # in this session, as a rank's helpers would be
with open(sys.argv[1], "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "sid": os.getsid(0), "pid": os.getpid(),
               "child": child.pid}, f)
if sys.argv[2] == "exit":
    sys.exit(int(sys.argv[3]))
time.sleep(60)
'''


def _wait_for(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or not os.path.getsize(path):
        assert proc.poll() is None, f"the script exited {proc.poll()} before writing {path}"
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.05)
    import json

    time.sleep(0.1)  # the dump is small; let its writer finish it
    with open(path) as f:
        return json.load(f)


def test_rank_script_runs_as_python_would_run_it(tmp_path):
    script, out, log = tmp_path / "s.py", tmp_path / "out.json", tmp_path / "log"
    script.write_text(_SCRIPT)
    log.write_text("before\n")
    env = {"PATH": os.environ["PATH"], "CUDA_P2P_HARNESS_PROBE": "yes"}
    proc = _harness.RankScript(str(script), [out, "exit", 5], env, str(log))
    info = _wait_for(out, proc)
    assert proc.wait(timeout=60) == 5 and proc.poll() == 5
    assert info["argv"] == [str(script), str(out), "exit", "5"]
    assert info["env"] == env  # its whole environment: nothing of the server's or the test's
    assert info["sid"] == info["pid"] == proc.pid  # a session of its own
    assert log.read_text().startswith("before\nhello from __main__\n")  # appended to the log
    # What it left behind: its child, found by the session (a forked process's /proc environ is
    # the server's, so no token in the environment could find it).
    assert _harness.pids_in_sessions([proc.pid]) == [info["child"]]
    os.kill(info["child"], 9)
    deadline = time.monotonic() + 30
    while _harness.pids_in_sessions([proc.pid]):
        assert time.monotonic() < deadline, "the killed child still counts as live"
        time.sleep(0.05)


def test_rank_script_killed_and_waited_for(tmp_path):
    import subprocess

    script, out = tmp_path / "s.py", tmp_path / "out.json"
    script.write_text(_SCRIPT)
    proc = _harness.RankScript(str(script), [out, "sleep"], dict(os.environ),
                               str(tmp_path / "log"))
    info = _wait_for(out, proc)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert sorted(_harness.pids_in_sessions([proc.pid])) == sorted([proc.pid, info["child"]])
    assert proc.pid not in _harness.pids_in_sessions([os.getsid(0)])  # not in the test's session
    proc.kill()
    assert proc.wait(timeout=30) == -9
    proc.kill()  # after its end: nothing to signal, no error
    assert _harness.pids_in_sessions([proc.pid]) == [info["child"]]  # left behind, and seen
    os.kill(info["child"], 9)
