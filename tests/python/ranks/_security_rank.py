"""One rank of a job for test_security.py (one process per rank; possibly run as another uid).

Usage: _security_rank.py RANK WORLD PORT OUT_FILE [HOLD_FILE | --as-uid UID]

With --as-uid (run as root), the rank runs in a forked child that switched to that uid after the
imports: the interpreter and torch may live where that uid cannot read them.

Joins a cuda_p2p job on tcp://127.0.0.1:PORT and writes one JSON line to OUT_FILE: whether the
workspace is on (and why not), whether every mapped peer block really is that peer's (each rank
writes its pid into its own buffer and reads every peer's), whether an all_reduce is right, or
the error init raised. With HOLD_FILE, the job then waits for that file to appear and runs a
second all_reduce (to show that something done meanwhile did not disturb it).
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import cuda_p2p


def main():
    rank, world, port, out_file = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                   sys.argv[4])
    hold = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "--as-uid" else None
    if len(sys.argv) > 6 and sys.argv[5] == "--as-uid":
        uid = int(sys.argv[6])
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            sys.exit(os.waitstatus_to_exitcode(status))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    res = {"rank": rank, "pid": os.getpid(), "uid": os.getuid()}
    try:
        dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=10))
        backend = cuda_p2p.get_cuda_p2p_backend()
        res["available"] = backend.is_p2p_available()
        res["reason"] = backend.p2p_unavailable_reason()
        pids = [None] * world
        dist.all_gather_object(pids, os.getpid())
        if res["available"]:
            backend.get_p2p_buffer(rank, (1,), torch.int64).fill_(os.getpid())
            backend.intra_node_barrier()
            seen = [int(backend.get_p2p_buffer(r, (1,), torch.int64).item()) for r in range(world)]
            res["blocks_are_the_peers"] = seen == pids
            backend.intra_node_barrier()
        t = torch.full((100,), float(rank + 1))
        dist.all_reduce(t)
        res["allreduce_ok"] = bool(torch.equal(t, torch.full((100,), world * (world + 1) / 2)))
        if hold:
            res["held"] = True
            with open(out_file, "a") as f:
                f.write(json.dumps(dict(res, phase="first")) + "\n")
            deadline = time.time() + 60
            while not os.path.exists(hold) and time.time() < deadline:
                time.sleep(0.05)
            t = torch.full((100,), float(rank + 1))
            dist.all_reduce(t)
            res["second_allreduce_ok"] = bool(
                torch.equal(t, torch.full((100,), world * (world + 1) / 2)))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the test
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    with open(out_file, "a") as f:
        f.write(json.dumps(dict(res, phase="end")) + "\n")


if __name__ == "__main__":
    main()
