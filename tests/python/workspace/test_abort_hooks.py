"""Abort hooks and getError() (issue 50, point 4) on 2, 3 and 4 ranks: hooks run once, in id
order, before the group aborts - on abort() and when a workspace op fails midway, before the op's
error reaches the caller - and get_error() names the failure: TIMEOUT after a rank that never
arrived, REMOTE_ERROR on the ranks a peer's failure or abort was reported to (their failure
words, or the rendezvous of a growth), COMM_ERROR on the rank that failed itself, SUCCESS
otherwise (NOTE [Abort hooks], NOTE [Error kinds] in backend/abort_hooks.cpp); cuda_p2p.check
raises the same failures (quiet on a healthy group and after the own abort). Each in both host
modes: with CUDA's semantics an op returns queued and its failure reaches the caller through its
Work, after the hooks ran (NOTE [Errors of queued ops] in backend/works.cpp)."""

from __future__ import annotations

import datetime
import resource
import signal

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, raises

ErrorType = torch._C._distributed_c10d.ErrorType


MODES = ("synchronous", "cuda")


def _fresh_group(**options):
    """A new cuda_p2p group over all ranks (collective), not cached: each test breaks its own.
    host_semantics="cuda": its ops return queued, as on a GPU."""
    timeout = options.pop("timeout_s", None)
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    for name, value in options.items():
        setattr(o, name, value)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
    return dist.new_group(backend="cuda_p2p", pg_options=o, **kwargs)


def check_hooks_run_once_on_abort(ctx, mode):
    chk = Checker(f"abort hooks W={ctx.world_size} {mode}")
    g = _fresh_group(host_semantics=mode)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    ran = []
    backend.register_abort_hook(7, lambda: ran.append(7))
    g.register_abort_hook(3, lambda: ran.append(3))  # through the ProcessGroup: the same backend
    backend.register_abort_hook(5, lambda: ran.append("removed"))
    backend.unregister_abort_hook(5)
    backend.unregister_abort_hook(99)  # never registered: ignored

    def bad():
        raise RuntimeError("a hook that fails")

    backend.register_abort_hook(4, bad)
    t = torch.ones(8)
    dist.all_reduce(t, group=g)
    chk.case("no hook before the abort", ran == [], f"{ran}")
    chk.case("healthy", backend.get_error() == ErrorType.SUCCESS, f"{backend.get_error()}")
    chk.case("cuda_p2p.check is quiet on a healthy group",
             raises(lambda: cuda_p2p.check(g)) is None, "it raised")
    # Every rank is out of the all_reduce (whose last phase waits for the peers) before any
    # aborts: an abort reaches the peers' failure words (NOTE [Failure words]).
    dist.barrier(group=ctx.gloo)
    backend.abort()  # hook 4's error is a warning (on stderr: torch's binding of abort)
    chk.case("hooks in id order, past the failing one", ran == [3, 7], f"{ran}")
    backend.abort()
    chk.case("once", ran == [3, 7], f"{ran}")
    # The own abort is no error; a peer's abort that reached this rank first is a remote one.
    chk.case("an abort is no error",
             backend.get_error() in (ErrorType.SUCCESS, ErrorType.REMOTE_ERROR),
             f"{backend.get_error()}")
    dist.destroy_process_group(g)
    return chk.result()


def check_timeout(ctx, mode):
    """Rank 0 enters an all_reduce the others never join: its wait times out naming them."""
    chk = Checker(f"timeout W={ctx.world_size} {mode}")
    g = _fresh_group(timeout_s=2, host_semantics=mode)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    dist.all_reduce(torch.ones(4), group=g)
    seen = []
    backend.register_abort_hook(1, lambda: seen.append(backend.get_error()))
    dist.barrier(group=ctx.gloo)
    if ctx.rank == 0:
        try:
            dist.all_reduce(torch.ones(4), group=g)
            chk.case("raised", False, "the all_reduce returned")
        except RuntimeError as e:
            chk.case("names a missing rank", "never arrived" in str(e), str(e))
        # The hook ran before the error reached here, with the failure already recorded.
        chk.case("hook ran first", seen == [ErrorType.TIMEOUT], f"{seen}")
        chk.case("TIMEOUT", backend.get_error() == ErrorType.TIMEOUT, f"{backend.get_error()}")
        # The next op is refused; the kind and the hooks stay.
        err = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
        chk.case("next op names the failure", err is not None and "never arrived" in err,
                 f"{err!r}")
        chk.case("TIMEOUT after the next op", backend.get_error() == ErrorType.TIMEOUT,
                 f"{backend.get_error()}")
        chk.case("hooks once", seen == [ErrorType.TIMEOUT], f"{seen}")
        err = raises(lambda: cuda_p2p.check(g))
        chk.case("cuda_p2p.check names the own failure", err is not None and "never arrived" in err,
                 f"{err!r}")
    else:
        chk.case("no hook on a healthy rank", seen == [], f"{seen}")
        chk.case("SUCCESS", backend.get_error() == ErrorType.SUCCESS, f"{backend.get_error()}")
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return chk.result()


def check_a_peers_abort_is_remote(ctx, mode):
    """Rank 0 aborts its group: the abort reaches the others through their failure words (NOTE
    [Failure words] in p2p_workspace/watchdog.hpp), a REMOTE_ERROR there before any op of theirs
    ran into it; on rank 0 an abort is no error."""
    chk = Checker(f"peer's abort W={ctx.world_size} {mode}")
    g = _fresh_group(timeout_s=5, host_semantics=mode)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    seen = []
    backend.register_abort_hook(1, lambda: seen.append(backend.get_error()))
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier(group=ctx.gloo)
    if ctx.rank == 0:
        backend.abort()
    dist.barrier(group=ctx.gloo)
    want = ErrorType.SUCCESS if ctx.rank == 0 else ErrorType.REMOTE_ERROR
    chk.case("kind", backend.get_error() == want, f"{backend.get_error()} (want {want})")
    if ctx.rank != 0:
        # NOTE [Who traps]: what a loop that only replays graphs asks, without a synchronize.
        err = raises(lambda: cuda_p2p.check(g))
        chk.case("cuda_p2p.check names the rank",
                 err is not None and "rank 0's device failed first" in err, f"{err!r}")
        chk.case("the hooks ran before check's error", seen == [ErrorType.REMOTE_ERROR], f"{seen}")
        try:
            dist.all_reduce(torch.ones(4), group=g)
            chk.case("raised after the peer's abort", False, "the all_reduce returned")
        except RuntimeError as e:
            chk.case("names the rank", "rank 0's device failed first" in str(e), str(e))
        chk.case("still remote", backend.get_error() == ErrorType.REMOTE_ERROR,
                 f"{backend.get_error()}")
        chk.case("the hooks ran before the error", seen == [ErrorType.REMOTE_ERROR], f"{seen}")
    else:
        chk.case("the hooks ran on the abort", seen == [ErrorType.SUCCESS], f"{seen}")
        chk.case("cuda_p2p.check is quiet after the own abort",
                 raises(lambda: cuda_p2p.check(g)) is None, "it raised")
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return chk.result()


def check_remote_and_comm_errors(ctx, mode):
    """The last rank cannot grow its workspace block (RLIMIT_FSIZE makes its memfd's ftruncate
    fail): the rendezvous reports that on every rank - a REMOTE_ERROR for the others, a COMM_ERROR
    for itself - and every rank's hooks run before the fused op raises."""
    chk = Checker(f"remote W={ctx.world_size} {mode}")
    W, rank = ctx.world_size, ctx.rank
    g = _fresh_group(buffer_size=1 << 16, max_buffer_size=64 << 20, host_semantics=mode)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    seen = []
    backend.register_abort_hook(1, lambda: seen.append(backend.get_error()))
    a = torch.ones(64, 32768)  # 8 MiB per rank: the 64 KiB buffer must grow
    bs = [torch.ones(32768, 2)]
    failing = rank == W - 1
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.getsignal(signal.SIGXFSZ)
    if failing:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, old_limit[1]))
    try:
        cuda_p2p.fused_all_gather_matmul(a, bs, 0, g)
        chk.case("raised", False, "the fused op returned")
    except RuntimeError as e:
        chk.case("names the rank", f"rank {W - 1}: " in str(e), str(e))
    finally:
        if failing:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            signal.signal(signal.SIGXFSZ, old_handler)
    want = ErrorType.COMM_ERROR if failing else ErrorType.REMOTE_ERROR
    chk.case("kind", backend.get_error() == want, f"{backend.get_error()} (want {want})")
    chk.case("hook ran first", seen == [want], f"{seen}")
    dist.destroy_process_group(g)
    return chk.result()


@pytest.mark.parametrize("mode", MODES)
def test_hooks_run_once_before_abort(any_world, mode):
    assert_ok(any_world.run(check_hooks_run_once_on_abort, mode))


@pytest.mark.parametrize("mode", MODES)
def test_timeout_runs_hooks_and_is_named(any_world, mode):
    assert_ok(any_world.run(check_timeout, mode))


@pytest.mark.parametrize("mode", MODES)
def test_a_peers_abort_is_remote(any_world, mode):
    assert_ok(any_world.run(check_a_peers_abort_is_remote, mode))


@pytest.mark.parametrize("mode", MODES)
def test_a_peer_failure_is_remote_and_the_own_is_comm(any_world, mode):
    assert_ok(any_world.run(check_remote_and_comm_errors, mode))
