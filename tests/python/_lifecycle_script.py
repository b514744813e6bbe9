"""Run by test_lifecycle.py: 2 ranks create, use and destroy cuda_p2p subgroups while the
program holds the down-cast backend, and drop that reference last (as a user of
get_cuda_p2p_backend naturally does). Exit code 0 when every rank finished every iteration."""

import faulthandler
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WATCHDOG_S = 8


def rank_main(rank, world, port, iters):
    import cuda_p2p

    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a deadlock exits with 1
    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    for i in range(iters):
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
    print(f"rank {rank}: {iters} iterations", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, int(sys.argv[1])), nprocs=2)
