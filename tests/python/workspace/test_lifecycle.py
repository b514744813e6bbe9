"""Process-group lifetime: creating, destroying and releasing cuda_p2p groups."""

from __future__ import annotations

import os
import sys

from _harness import RANKS, run_script


def test_destroy_process_group_does_not_deadlock(request):
    # Create, use and destroy a subgroup: 4 times in CI (each a fresh workspace, ~2 s on 2 cores),
    # 10 with --long. A deadlock ends in the script's own watchdog (its groups' timeout times
    # three, every thread's stack in the output); this limit is the backstop, generous: the run
    # took 8 s alone and 16 s beside four busy loops, and has timed out at 90 s with no output
    # beside a build whose compilers filled the memory (docs/measurements/ci-times-2026-12-03.md).
    iters = 10 if request.config.getoption("--long") else 4
    res = run_script([sys.executable, os.path.join(RANKS, "_lifecycle_script.py"), str(iters)],
                     timeout=300)
    assert not res.timed_out, res.output[-5000:]
    assert res.returncode == 0, f"exit code {res.returncode} (deadlock?):\n{res.output[-5000:]}"
    assert f"rank 0: {iters} iterations" in res.output, res.output[-5000:]
    assert f"rank 1: {iters} iterations" in res.output, res.output[-5000:]
    for r in (0, 1):
        assert f"rank {r}: a reused group name resolves to the new group" in res.output, res.output
        assert f"rank {r}: group_name '' names the default group" in res.output, res.output


ABORT_GROUP_TIMEOUT_S = 30


def _abort_unblocks_a_pending_collective(ctx):
    import threading
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import cuda_p2p

    # A fresh group (not ctx.group's cache): it is aborted. Its timeout is what the abort must
    # beat: a wait the abort did not release would end only there.
    g = dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p",
                       timeout=timedelta(seconds=ABORT_GROUP_TIMEOUT_S))
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    assert backend.is_p2p_available(), backend.p2p_unavailable_reason()
    out = {}
    if ctx.rank == 0:
        # Rank 1 never joins: the all-reduce waits for it until another thread aborts the group.
        aborted_at = []

        def abort():
            aborted_at.append(time.monotonic())
            backend.abort()

        timer = threading.Timer(0.3, abort)
        timer.start()
        try:
            dist.all_reduce(torch.ones(1000), group=g)
        except RuntimeError as e:
            out["error"] = str(e)
        returned_at = time.monotonic()
        timer.join()
        out["after_abort"] = returned_at - aborted_at[0] if aborted_at else None
        try:  # later ops fail at once, saying why
            backend.intra_node_barrier()
        except RuntimeError as e:
            out["later"] = str(e)
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


def test_abort_from_another_thread_unblocks_a_rank_waiting_for_a_peer(world2):
    out = world2.run(_abort_unblocks_a_pending_collective)[0]
    assert "error" in out, out
    assert "aborted" in out["error"], out["error"]
    # Released by the abort, not by the group's timeout (on a busy machine too).
    assert out["after_abort"] is not None and out["after_abort"] < ABORT_GROUP_TIMEOUT_S / 2, out
    assert "aborted" in out.get("later", ""), out


def _gloo_loops():
    """This process's Gloo event-loop threads (one per transport device)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names.count("gloo_tcp_loop")


def _groups_share_one_gloo_device(ctx):
    """NOTE [One Gloo device per process] (python/cuda_p2p/_backend.py): new cuda_p2p groups add
    no Gloo event loop, and one group's abort or destruction leaves the others' wrapped Gloo
    working."""
    import torch
    import torch.distributed as dist

    import cuda_p2p

    def wrapped_op(g):
        t = torch.tensor([ctx.rank == 0, False, True])  # bool: the wrapped Gloo's
        dist.all_reduce(t, group=g)
        return t.tolist() == [True, False, True]

    before = _gloo_loops()
    groups = [dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p") for _ in range(3)]
    out = {"loops_added": _gloo_loops() - before,
           "ops": [wrapped_op(g) for g in groups]}
    cuda_p2p.get_cuda_p2p_backend(groups[0]).abort()
    dist.destroy_process_group(groups[1])
    out["after"] = wrapped_op(groups[2])
    out["default"] = wrapped_op(None)
    dist.destroy_process_group(groups[0])
    dist.destroy_process_group(groups[2])
    return out


def test_groups_share_one_gloo_device(world2):
    for out in world2.run(_groups_share_one_gloo_device):
        assert out == {"loops_added": 0, "ops": [True] * 3, "after": True, "default": True}, out
