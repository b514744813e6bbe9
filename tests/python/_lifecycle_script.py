"""Run by test_lifecycle.py: 2 ranks create, use and destroy cuda_p2p subgroups (holding the
down-cast backend, as a user of get_cuda_p2p_backend does), checking after each destroy that the
default group still works, then destroy the default group. Then a new default group takes the
old one's name while the old backend is still held, and the dispatcher op called by that name must
run on the new group (NOTE [Group lookup cache] in backend/dispatcher_group.cpp). Exit code 0 when
every rank finished; a deadlock is turned into exit code 1 by a per-iteration watchdog."""

import faulthandler
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Per iteration (re-armed each time): one takes well under a second, a deadlock is forever.
WATCHDOG_S = 10


def rank_main(rank, world, port, port2, iters):
    import cuda_p2p

    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    for i in range(iters):
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a deadlock exits with 1
        g = dist.new_group(backend="cuda_p2p")
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
    old_count = old.get_counters().get("all_reduce.one_shot", 0)
    dist.destroy_process_group()
    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port2}", rank=rank, world_size=world
    )
    new_name = dist.group.WORLD.group_name
    assert new_name == old_name, (new_name, old_name)  # else this checks nothing
    new = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    t = torch.full((5,), float(rank + 1))
    torch.ops.cuda_p2p.all_reduce_(t, "sum", new_name)
    assert torch.equal(t, torch.full((5,), float(world * (world + 1) // 2))), t
    assert new.get_counters().get("all_reduce.one_shot", 0) == 1, new.get_counters()
    assert old.get_counters().get("all_reduce.one_shot", 0) == old_count, old.get_counters()
    del old
    print(f"rank {rank}: a reused group name resolves to the new group", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s, socket.socket() as s2:
        s.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        port, port2 = s.getsockname()[1], s2.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, port2, int(sys.argv[1])), nprocs=2)
