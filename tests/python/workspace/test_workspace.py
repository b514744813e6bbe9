"""The symmetric P2P workspace through the backend's Python face (issue: workspace).

References are independent of the workspace: values computed locally by plain torch, and the same
data exchanged through the Gloo reference group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import names_rank

DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _pattern(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(n) % 97 + 1000 * rank).to(dtype)


def _memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:cuda_p2p" in line for line in f)


# ---------------------------------------------------------------------------------------------
# functions run on every rank


def _fill_barrier_read(ctx, n):
    backend = cuda_p2p.get_cuda_p2p_backend()
    assert backend.is_p2p_available(), backend.p2p_unavailable_reason()
    assert backend.p2p_unavailable_reason() == ""
    assert backend.get_buffer_size() == 32 << 20  # the documented default
    out = []
    for dtype in DTYPES:
        mine = backend.get_p2p_buffer(ctx.rank, [n], dtype)
        assert mine.device.type == "cpu" and mine.dtype == dtype and mine.shape == (n,)
        mine.copy_(_pattern(ctx.rank, n, dtype))
        backend.intra_node_barrier()
        seen = [backend.get_p2p_buffer(r, [n], dtype).clone() for r in range(ctx.world_size)]
        backend.intra_node_barrier()  # nobody overwrites a buffer another rank still reads
        # Independent reference: the same data gathered by Gloo.
        gathered = [torch.empty(n, dtype=dtype) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, _pattern(ctx.rank, n, dtype), group=ctx.gloo)
        for r in range(ctx.world_size):
            torch.testing.assert_close(seen[r], gathered[r], rtol=0, atol=0)
        # A view at an offset aliases the same memory.
        tail = backend.get_p2p_buffer(ctx.rank, [1], dtype, storage_offset=n - 1)
        assert tail.storage_offset() == n - 1
        torch.testing.assert_close(tail, mine[-1:], rtol=0, atol=0)
        out.append(len(seen))
    return out


def _bad_arguments(ctx):
    backend = cuda_p2p.get_cuda_p2p_backend()
    w = ctx.world_size
    size = backend.get_buffer_size()
    cases = [
        (lambda: backend.get_p2p_buffer(w, [1], torch.float32),
         f"rank must be in [0, {w}), got {w}"),
        (lambda: backend.get_p2p_buffer(-1, [1], torch.float32), "got -1"),
        (
            lambda: backend.get_p2p_buffer(0, [size // 4 + 1], torch.float32),
            f"need {size + 4} bytes, but the buffer holds {size} bytes",
        ),
        (
            lambda: backend.get_p2p_buffer(0, [8], torch.float32, storage_offset=size // 4 - 4),
            "at most 4 elements",
        ),
        (lambda: backend.get_p2p_buffer(0, [1], torch.float32, storage_offset=-1),
         "storage_offset"),
        (lambda: backend.get_p2p_buffer(0, [-3], torch.float32), "sizes must be >= 0"),
        (lambda: backend.get_p2p_buffer(0, [1], torch.quint8), "quantized"),
        (lambda: backend.intra_node_barrier(ranks=[w]), f"ranks must be in [0, {w}), got {w}"),
        (lambda: backend.ensure_min_buffer_size(-5), "nbytes must be >= 0, got -5"),
    ]
    if w > 1:
        other = (ctx.rank + 1) % w
        cases.append((lambda: backend.intra_node_barrier(ranks=[other]),
                      "must include the calling rank"))
    for fn, needle in cases:
        with pytest.raises(RuntimeError, match=None) as info:
            fn()
        assert needle in str(info.value), (needle, str(info.value))
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        backend.intra_node_barrier(timeout=0)
    with pytest.raises(TypeError):
        backend.get_p2p_buffer(0, [1], "float32")
    backend.intra_node_barrier()
    return True


def _never_arrives(ctx):
    backend = cuda_p2p.get_cuda_p2p_backend()
    absent = ctx.world_size - 1
    message, elapsed = None, None
    dist.barrier(group=ctx.gloo)  # only the absent rank may be late by the barrier's timeout
    if ctx.rank != absent:
        start = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            backend.intra_node_barrier(timeout=1.0)
        elapsed = time.monotonic() - start
        message = str(info.value)
    dist.barrier(group=ctx.gloo)
    # The late rank completes the barrier the others gave up on: the group is in step again.
    if ctx.rank == absent:
        backend.intra_node_barrier()
    backend.intra_node_barrier(timeout=30)
    return message, elapsed


def _set_timeout_then_never_arrives(ctx):
    """dist.set_timeout reaches the workspace: a barrier without its own timeout gives up after
    the group's new one, naming the rank that never arrived."""
    group = dist.new_group(backend="cuda_p2p", timeout=timedelta(minutes=5))
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    dist.set_timeout(timedelta(milliseconds=1500), group=group)
    absent = ctx.world_size - 1
    message, elapsed, info = None, None, None
    dist.barrier(group=ctx.gloo)  # only the absent rank may be late by the group's timeout
    if ctx.rank != absent:
        start = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            backend.intra_node_barrier()
        elapsed = time.monotonic() - start
        message = str(info.value)
    dist.barrier(group=ctx.gloo)
    if ctx.rank == absent:
        backend.intra_node_barrier()
    dist.set_timeout(timedelta(seconds=30), group=group)
    backend.intra_node_barrier()
    # The caught exception's traceback holds this frame and so the backend: let it go now, not at
    # the next collection (a later test counts this process's mappings).
    del backend, info
    dist.destroy_process_group(group)
    return message, elapsed


def _two_hosts(ctx):
    # Ranks of the first half claim one host, the others another: the new group has no workspace.
    # Hierarchical collectives off: this checks the flat path (test_hierarchical.py the other).
    os.environ["CUDA_P2P_HOST_ID"] = "host-a" if ctx.rank < ctx.world_size // 2 else "host-b"
    os.environ["CUDA_P2P_HIERARCHICAL"] = "0"
    try:
        group = dist.new_group(backend="cuda_p2p")
    finally:
        del os.environ["CUDA_P2P_HOST_ID"]
        del os.environ["CUDA_P2P_HIERARCHICAL"]
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    assert not backend.is_p2p_available()
    assert backend.hierarchy() is None
    assert "span hosts" in backend.p2p_unavailable_reason(), backend.p2p_unavailable_reason()
    assert backend.get_buffer_size() == 0
    with pytest.raises(RuntimeError, match="workspace is unavailable"):
        backend.get_p2p_buffer(0, [1], torch.float32)
    with pytest.raises(RuntimeError, match="span hosts"):
        backend.intra_node_barrier()
    # Every collective still works, through the wrapped backend, and matches Gloo.
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (1, 7, 1023):
            x = _pattern(ctx.rank, n, dtype)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, group=group)
            dist.all_reduce(b, group=ctx.gloo)
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            out_a = torch.empty(n * ctx.world_size, dtype=dtype)
            out_b = torch.empty_like(out_a)
            dist.all_gather_into_tensor(out_a, x, group=group)
            dist.all_gather_into_tensor(out_b, x, group=ctx.gloo)
            torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
            big = _pattern(ctx.rank, n * ctx.world_size, dtype)
            rs_a, rs_b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(rs_a, big, group=group)
            dist.reduce_scatter_tensor(rs_b, big, group=ctx.gloo)
            torch.testing.assert_close(rs_a, rs_b, rtol=0, atol=0)
            c_a, c_b = x.clone(), x.clone()
            dist.broadcast(c_a, src=ctx.world_size - 1, group=group)
            dist.broadcast(c_b, src=ctx.world_size - 1, group=ctx.gloo)
            torch.testing.assert_close(c_a, c_b, rtol=0, atol=0)
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    return True


def _two_groups_then_destroy(ctx):
    import gc

    w = ctx.world_size
    gc.collect()  # groups an earlier test left to the collector do not count against this one
    base = _memfd_mappings()
    g1 = dist.new_group(backend="cuda_p2p")
    g2 = dist.new_group(backend="cuda_p2p", pg_options=_options(buffer_size=1 << 16))
    b1, b2 = cuda_p2p.get_cuda_p2p_backend(g1), cuda_p2p.get_cuda_p2p_backend(g2)
    assert b1 is not b2
    assert b2.get_buffer_size() == 1 << 16
    # Every rank's block, once per group, and with peers every rank's failure area (NOTE
    # [Failure words] in p2p_workspace/watchdog.hpp).
    per_group = 2 * w if w > 1 else 1
    assert _memfd_mappings() == base + 2 * per_group
    t1 = b1.get_p2p_buffer(ctx.rank, [4], torch.int32)
    t2 = b2.get_p2p_buffer(ctx.rank, [4], torch.int32)
    assert t1.data_ptr() != t2.data_ptr()
    t1.fill_(1)
    t2.fill_(2)
    b1.intra_node_barrier()
    b2.intra_node_barrier()
    for r in range(w):
        assert int(b1.get_p2p_buffer(r, [4], torch.int32).sum()) == 4
        assert int(b2.get_p2p_buffer(r, [4], torch.int32).sum()) == 8
    b1.intra_node_barrier()
    b2.intra_node_barrier()
    # Destroying g1 releases its mappings once nothing aliases them any more.
    del t1, b1
    dist.destroy_process_group(g1)
    del g1
    gc.collect()
    after = _memfd_mappings()
    b2.intra_node_barrier()  # g2 is unaffected
    assert int(b2.get_p2p_buffer((ctx.rank + 1) % w, [4], torch.int32).sum()) == 8
    b2.intra_node_barrier()
    del t2, b2
    dist.destroy_process_group(g2)
    del g2
    gc.collect()
    return base, after, _memfd_mappings()


def _options(**kw):
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _grow(ctx):
    backend = cuda_p2p.get_cuda_p2p_backend()
    old = backend.get_p2p_buffer(ctx.rank, [8], torch.float32)
    old.fill_(ctx.rank + 0.5)
    want = (40 << 20) + 4096 * ctx.rank  # ranks ask for different sizes
    backend.ensure_min_buffer_size(want)
    size = backend.get_buffer_size()
    torch.testing.assert_close(old, torch.full([8], ctx.rank + 0.5))  # still mapped
    n = size // 4
    backend.get_p2p_buffer(ctx.rank, [n], torch.float32)[-1] = float(ctx.rank)
    backend.intra_node_barrier()
    last = [float(backend.get_p2p_buffer(r, [n], torch.float32)[-1]) for r in range(ctx.world_size)]
    backend.intra_node_barrier()
    return size, last


def _disabled(ctx):
    g_opt = dist.new_group(backend="cuda_p2p", pg_options=_options(enable_workspace=False))
    os.environ["CUDA_P2P_DISABLE_WORKSPACE"] = "1"
    try:
        g_env = dist.new_group(backend="cuda_p2p")
    finally:
        del os.environ["CUDA_P2P_DISABLE_WORKSPACE"]
    reasons = []
    for g in (g_opt, g_env):
        b = cuda_p2p.get_cuda_p2p_backend(g)
        assert not b.is_p2p_available()
        reasons.append(b.p2p_unavailable_reason())
        t = torch.full([5], float(ctx.rank))
        dist.all_reduce(t, group=g)
        torch.testing.assert_close(t, torch.full([5], float(sum(range(ctx.world_size)))))
        dist.destroy_process_group(g)
    return reasons


# ---------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("n", [1, 7, 1023])
def test_every_rank_reads_every_peers_buffer(world, n):
    assert world.run(_fill_barrier_read, n) == [[world.size] * len(DTYPES)] * world.size


def test_bad_arguments_say_what_fits(world):
    assert all(world.run(_bad_arguments))


def _assert_the_last_rank_is_named(results, timeout_ms):
    absent = len(results) - 1
    for message, elapsed in results[:absent]:
        # A present rank descheduled past the timeout on a loaded machine is named beside it.
        assert names_rank(message, absent) and "never arrived" in message, message
        assert f"timed out after {timeout_ms} ms" in message, message
        # It gave up at its timeout, not at some later wait (a loaded machine may add seconds).
        assert timeout_ms / 1000 <= elapsed < timeout_ms / 1000 + 10, elapsed


def test_a_rank_that_never_arrives_is_named(world):
    _assert_the_last_rank_is_named(world.run(_never_arrives), 1000)


def test_set_timeout_reaches_the_workspace(world):
    _assert_the_last_rank_is_named(world.run(_set_timeout_then_never_arrives), 1500)


def test_simulated_two_hosts_run_without_workspace(world):
    assert all(world.run(_two_hosts))


def test_two_groups_are_separate_and_destroy_releases_mappings(world):
    per_group = 2 * world.size if world.size > 1 else 1  # blocks and failure areas
    for base, after_first, after_both in world.run(_two_groups_then_destroy):
        assert after_first == base + per_group
        assert after_both == base


def test_workspace_grows_collectively(world):
    results = world.run(_grow)
    want = (40 << 20) + 4096 * (world.size - 1)
    for size, last in results:
        assert size == want
        assert last == [float(r) for r in range(world.size)]


def test_option_and_environment_turn_the_workspace_off(world2):
    for opt_reason, env_reason in world2.run(_disabled):
        assert "Options.enable_workspace" in opt_reason
        assert "CUDA_P2P_DISABLE_WORKSPACE=1" in env_reason


_KILL_SCRIPT = textwrap.dedent(
    """
    import os, sys, time, torch, torch.distributed as dist, cuda_p2p
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    backend = cuda_p2p.get_cuda_p2p_backend()
    assert backend.is_p2p_available(), backend.p2p_unavailable_reason()
    backend.get_p2p_buffer(rank, [1024], torch.float32).fill_(rank)
    backend.intra_node_barrier()
    print("ready", flush=True)
    time.sleep(120)
    """
)


def _new_shm_names(before):
    """Names in /dev/shm that were not in `before` and are still there a second later, other than
    Python multiprocessing's semaphores (sem.mp-*): the tests that run beside this one (CI runs
    test_faults.py beside the suite) create and remove names meanwhile; cuda_p2p creates none."""
    new = {n for n in set(os.listdir("/dev/shm")) - before if not n.startswith("sem.mp-")}
    if new:
        time.sleep(1.0)
        new &= set(os.listdir("/dev/shm"))
    return new


def test_sigkilled_ranks_leave_nothing_behind_and_segments_are_private(tmp_path):
    from _harness import free_port

    script = tmp_path / "rank.py"
    script.write_text(_KILL_SCRIPT)
    before = set(os.listdir("/dev/shm"))
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in range(2)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", line + p.stdout.read()
        # The segments are memfds readable by their owner only, and none has a name in /dev/shm.
        for p in procs:
            fd_dir = f"/proc/{p.pid}/fd"
            memfds = [
                os.path.join(fd_dir, fd)
                for fd in os.listdir(fd_dir)
                if "memfd:cuda_p2p" in os.readlink(os.path.join(fd_dir, fd))
            ]
            assert memfds, "no shared segment found"
            for path in memfds:
                assert os.stat(path).st_mode & 0o777 == 0o600
        assert not _new_shm_names(before)
        # SIGKILL rank 1 mid-life, then rank 0.
        for p in reversed(procs):
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        assert not _new_shm_names(before)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
