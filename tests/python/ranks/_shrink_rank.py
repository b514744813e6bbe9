"""One rank of a training job that loses a rank, started by test_faults.py (one process per rank).

Usage: _shrink_rank.py RANK WORLD PORT VICTIM OUT_DIR

The ranks train a linear model with data-parallel SGD on the default cuda_p2p group (a 5 s
timeout): each step all-reduces the gradient. The test kills the victim (SIGKILL) while they
train. Every survivor catches the error, shrinks the default group past the victim
(dist.shrink_group), rolls back to the last step every survivor completed (they may be one step
apart: a survivor can finish a step whose all-reduce another never completed), and trains
POST_STEPS more steps on the shrunk group. It writes events as JSON lines to
OUT_DIR/rank<R>.jsonl: "ready", "error", "shrunk", "done" (the step it resumed from and the final
weights, which the test compares with a reference computed in one process), "clean" (memfds of
ours still open after destroy_process_group).
"""

import datetime
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import cuda_p2p

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # _harness
from _harness import memfds_of_ours  # noqa: E402

TIMEOUT_S = 5
RENDEZVOUS_S = 180  # _fault_rank.py's reason
DIM, ROWS, LR = 8, 16, 0.05
POST_STEPS = 50


def batch(rank: int, step: int):
    """Rank `rank`'s data at `step` (the test computes the same)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(ROWS, DIM, generator=g, dtype=torch.float64)
    y = x @ torch.arange(1, DIM + 1, dtype=torch.float64) + 0.1 * torch.randn(
        ROWS, generator=g, dtype=torch.float64)
    return x, y


def gradient(w, rank: int, step: int):
    x, y = batch(rank, step)
    return 2.0 * x.T @ (x @ w - y) / ROWS


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    victim, out_dir = int(sys.argv[4]), sys.argv[5]
    out = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)

    def event(kind, **kw):
        out.write(json.dumps(dict(kind=kind, rank=rank, t=time.time(), **kw)) + "\n")

    faulthandler.dump_traceback_later(RENDEZVOUS_S + 90, exit=True)  # nothing below may hang
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_S))
    # Four ranks starting on a loaded 2-core machine may take longer than TIMEOUT_S to meet: the
    # group is made with the rendezvous' patience, and its first collective waits as long (a
    # fresh clone's run at load 22 had a rank still in init_process_group 5 s after another's
    # first all-reduce began). Once every rank is past it, the group gets the short timeout that
    # finds the killed rank (setTimeout reaches the workspace and the wrapped Gloo).
    dist.init_process_group("cuda_p2p", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=RENDEZVOUS_S))
    dist.all_reduce(torch.ones(1, dtype=torch.float64))
    store.set_timeout(datetime.timedelta(seconds=TIMEOUT_S))
    dist.set_timeout(datetime.timedelta(seconds=TIMEOUT_S))
    w = torch.zeros(DIM, dtype=torch.float64)
    history = {0: w.clone()}  # weights after `step` steps, the last few
    step = 0
    while True:
        g = gradient(w, rank, step)
        try:
            dist.all_reduce(g)
        except RuntimeError as e:
            event("error", error=str(e)[:2000], step=step)
            break
        w = w - LR * g / world
        step += 1
        history[step] = w.clone()
        history.pop(step - 3, None)
        if step == 3:
            event("ready")
        time.sleep(0.002)  # a few hundred steps before the kill, not tens of thousands
    # The survivors shrink past the victim and agree on where to resume.
    dist.shrink_group([victim])
    backend = cuda_p2p.get_cuda_p2p_backend()
    event("shrunk", size=dist.get_world_size(), rank_now=dist.get_rank(),
          available=backend.is_p2p_available())
    done = torch.tensor([step], dtype=torch.int64)
    dist.all_reduce(done, op=dist.ReduceOp.MIN)
    resume = int(done.item())
    w = history[resume]
    survivors = [r for r in range(world) if r != victim]
    for s in range(resume, resume + POST_STEPS):
        g = gradient(w, rank, s)
        dist.all_reduce(g)
        w = w - LR * g / len(survivors)
    counters = backend.get_counters()
    event("done", resume=resume, w=w.tolist(), counters=counters)
    faulthandler.dump_traceback_later(30, exit=True)
    dist.destroy_process_group()
    del backend
    import gc

    gc.collect()
    maps, fds = memfds_of_ours()
    event("clean", memfd_maps=maps, memfd_fds=fds)
    out.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
