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
