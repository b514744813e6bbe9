"""Run by test_launch.py under torchrun: env:// initialisation of cuda_p2p, with or without
pg_options. Writes what it saw to <out_dir>/rank<R>.json; exits non-zero on any failure."""

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist

import cuda_p2p


def main(mode: str, out_dir: str) -> None:
    faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, then exits
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report = {"rank": rank, "world": world, "mode": mode}

    # Nothing to down-cast before init.
    try:
        cuda_p2p.get_cuda_p2p_backend()
        report["before_init"] = "no error"
    except RuntimeError as e:
        report["before_init"] = str(e)

    kwargs = {}
    if mode == "pg_options":
        # A wrong pg_options type is refused before any group exists...
        try:
            dist.init_process_group("cuda_p2p", pg_options={"buffer_size": 1 << 20})
            report["bad_pg_options"] = "no error"
        except TypeError as e:
            report["bad_pg_options"] = str(e)
        report["initialized_after_bad"] = dist.is_initialized()
        # ...and the right one is used, in a second init_process_group in the same process.
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        opts.buffer_size = 1 << 20
        kwargs["pg_options"] = opts
    dist.init_process_group("cuda_p2p", **kwargs)  # env:// from torchrun

    backend = cuda_p2p.get_cuda_p2p_backend()
    report["is_cuda_p2p"] = cuda_p2p.is_cuda_p2p_group()
    report["backend_name"] = dist.get_backend()
    report["buffer_size"] = backend.options.buffer_size
    report["rank_size"] = [dist.get_rank(), dist.get_world_size(), backend.rank(), backend.size()]

    t = torch.arange(6, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    report["all_reduce"] = t.tolist()
    out = torch.empty(3 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.full((3,), rank, dtype=torch.int64))
    report["all_gather"] = out.tolist()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "pid": os.getpid()})
    report["pids"] = [o["pid"] for o in objs]
    dist.barrier()
    del backend

    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
