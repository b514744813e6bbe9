"""Run by test_lifecycle.py: 2 ranks create, use and destroy cuda_p2p subgroups (holding the
down-cast backend, as a user of get_cuda_p2p_backend does), checking after each destroy that the
default group still works, then destroy the default group. Then a new default group takes the
old one's name while the old backend is still held, and the dispatcher op called by that name must
run on the new group (NOTE [Group lookup cache] in backend/dispatcher_group.cpp), as must the op
called with group_name "" (the default group: NOTE [The default group's name]); with no default
group, or a Gloo one, "" raises an error that says so. Exit code 0 when every rank finished; a
collective that waits forever raises at its group's timeout, and a hang no timeout reaches is
turned into exit code 1, with every thread's stack, by a watchdog."""

import faulthandler
import socket
import sys
from contextlib import ExitStack
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Every group's timeout: a collective that waits for a peer that never comes raises after it.
GROUP_TIMEOUT = timedelta(seconds=30)
# What no collective can hold (a hang in destroy_process_group, in a destructor): armed at the
# start and re-armed per iteration, three group timeouts, so that a slow machine is not a deadlock.
# It dumps every thread's stack and exits with 1.
WATCHDOG_S = 3 * GROUP_TIMEOUT.total_seconds()


def _expect_error(fn, *texts):
    try:
        fn()
    except RuntimeError as e:
        assert all(t in str(e) for t in texts), (texts, str(e))
        return
    raise AssertionError(f"no error (expected one with {texts})")


def rank_main(rank, world, port, port2, port3, iters):
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a deadlock exits with 1
    import cuda_p2p

    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=GROUP_TIMEOUT,
    )
    print(f"rank {rank}: default group up", flush=True)  # where a run that timed out got to
    for i in range(iters):
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
        g = dist.new_group(backend="cuda_p2p", timeout=GROUP_TIMEOUT)
        backend = cuda_p2p.get_cuda_p2p_backend(g)
        for _ in range(3):
            objs = [None] * world
            dist.all_gather_object(objs, {"rank": rank, "i": i}, group=g)
            work = dist.barrier(group=g, async_op=True)
        work.wait()
        dist.destroy_process_group(g)
        del g, work
        del backend  # the last reference: the C++ destructor runs now
        # destroying a subgroup leaves the default group working
        t = torch.ones(3)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((3,), float(world))), t
        print(f"rank {rank}: iteration {i} done", flush=True)
    faulthandler.cancel_dump_traceback_later()
    print(f"rank {rank}: {iters} iterations", flush=True)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    # The dispatcher op resolves the default group by name (and caches it), then the group is
    # destroyed while its backend is still held, and a new default group takes the same name.
    old_name = dist.group.WORLD.group_name
    old = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    t = torch.ones(5)
    torch.ops.cuda_p2p.all_reduce_(t, "sum", old_name)
    assert torch.equal(t, torch.full((5,), float(world))), t
    torch.ops.cuda_p2p.all_reduce_(t)  # "": the default group, cached too
    assert torch.equal(t, torch.full((5,), float(world * world))), t
    old_count = old.get_counters().get("all_reduce.one_shot", 0)
    dist.destroy_process_group()
    # No default group now: the recorded name resolves to nothing.
    _expect_error(lambda: torch.ops.cuda_p2p.all_reduce_(torch.ones(2)),
                  f"no process group named '{old_name}'", "meant the default group")
    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port2}", rank=rank, world_size=world,
        timeout=GROUP_TIMEOUT,
    )
    new_name = dist.group.WORLD.group_name
    assert new_name == old_name, (new_name, old_name)  # else this checks nothing
    new = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    t = torch.full((5,), float(rank + 1))
    torch.ops.cuda_p2p.all_reduce_(t, "sum", new_name)
    assert torch.equal(t, torch.full((5,), float(world * (world + 1) // 2))), t
    t = torch.full((5,), float(rank + 1))
    torch.ops.cuda_p2p.all_reduce_(t)  # "" finds the new default group, not the cached old one
    assert torch.equal(t, torch.full((5,), float(world * (world + 1) // 2))), t
    assert new.get_counters().get("all_reduce.one_shot", 0) == 2, new.get_counters()
    assert old.get_counters().get("all_reduce.one_shot", 0) == old_count, old.get_counters()
    del old
    print(f"rank {rank}: a reused group name resolves to the new group", flush=True)
    dist.destroy_process_group()
    # A Gloo default group with a cuda_p2p subgroup: "" is refused, naming the default group and
    # its backend; the subgroup's name works.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port3}", rank=rank, world_size=world,
        timeout=GROUP_TIMEOUT,
    )
    sub = dist.new_group(backend="cuda_p2p", timeout=GROUP_TIMEOUT)
    _expect_error(lambda: torch.ops.cuda_p2p.all_reduce_(torch.ones(2)),
                  "the default group", "backend='cuda_p2p'", "gloo")
    t = torch.ones(4)
    torch.ops.cuda_p2p.all_reduce_(t, "sum", sub.group_name)
    assert torch.equal(t, torch.full((4,), float(world))), t
    print(f"rank {rank}: group_name '' names the default group", flush=True)
    dist.destroy_process_group(sub)
    dist.destroy_process_group()


if __name__ == "__main__":
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(3)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
    mp.spawn(rank_main, args=(2, *ports, int(sys.argv[1])), nprocs=2)
