"""One rank of a fault-injection job, started by test_faults.py (one process per rank).

Usage: _fault_rank.py RANK WORLD PORT CASE VICTIM OUT_DIR

The rank joins a cuda_p2p job (10 s timeout), checks one all_reduce against the expected sum,
then runs CASE's operation in a loop until it raises ("mixed": a random workload of every op,
run_mixed). It writes events as JSON lines to
OUT_DIR/rank<R>.jsonl: "ready" (looping), "error" (time and message), "clean" (after
destroy_process_group: memfd mappings and descriptors of ours still open), "done".
The victim of a self-inflicted fault kills itself where CASE says; the other faults (SIGKILL,
SIGSTOP) come from the test.
"""

import datetime
import faulthandler
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import cuda_p2p
from cuda_p2p import ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # _harness
from _harness import memfds_of_ours  # noqa: E402

TIMEOUT_S = 10
# The store's rendezvous: a rank may take far longer than TIMEOUT_S to import torch and connect
# when the machine is loaded (CI runs these jobs beside the other tests; a fresh clone's run once
# had a rank still importing after 45 s), and a rank that gives up first fails the job before any
# fault. So the rendezvous waits as long as test_faults.py waits for the ranks to start; then the
# store waits TIMEOUT_S, as the group.
RENDEZVOUS_S = 180


def run(rank, world, store, case, victim, event):
    dist.init_process_group("cuda_p2p", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    backend = cuda_p2p.get_cuda_p2p_backend()
    assert backend.is_p2p_available(), backend.p2p_unavailable_reason()
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert torch.equal(t, torch.full((1000,), expected)), t[:4]
    event("checked")
    if case == "grow":
        store.set(f"ready/{rank}", "1")  # every rank is past the first check
        store.wait([f"ready/{r}" for r in range(world)])
        if rank == victim:
            event("ready")
            os.kill(os.getpid(), signal.SIGKILL)
        backend.ensure_min_buffer_size(64 << 20)
        raise AssertionError("ensure_min_buffer_size returned without the victim")
    if case in ("allreduce_small", "sigstop", "kill_rank0"):
        x = torch.ones(256)  # 1 KiB: one-shot
        op = lambda: dist.all_reduce(x)  # noqa: E731
    elif case == "allreduce_large":
        x = torch.ones(1 << 20)  # 4 MiB: two-shot
        op = lambda: dist.all_reduce(x)  # noqa: E731
    elif case == "fused":
        a = torch.randn(64, 128)
        bs = [torch.randn(128, 96)]
        op = lambda: ops.fused_all_gather_matmul(a, bs, 0)  # noqa: E731
    elif case == "mixed":
        return run_mixed(rank, world, victim, event)
    else:
        raise ValueError(f"unknown case {case}")
    for _ in range(3):
        op()
    event("ready")
    while True:
        op()


# The mixed workload's ops (case "mixed"): every workspace op, several sizes, uneven splits.
MIXED_KINDS = ["all_to_all_single", "all_to_all_uneven", "all_to_all", "all_gather",
               "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "gather", "scatter",
               "reduce", "all_reduce", "fused_all_gather_matmul", "fused_matmul_reduce_scatter"]


def mixed_op(kind, n, world, rank):
    """One op of the mixed workload on `n`-element tensors (the same call on every rank); runs it
    and returns nothing: a survivor's outputs are dropped at once, as a user's would be after an
    error, so that memory an op still touched would be freed while its work is queued."""
    x = torch.randn(n)
    if kind == "all_to_all_single":
        dist.all_to_all_single(torch.empty(n * world), torch.randn(n * world))
    elif kind == "all_to_all_uneven":
        # Rank r sends n + q rows to rank q.
        dist.all_to_all_single(torch.empty(world * (n + rank)), torch.randn(sum(n + q for q in
                               range(world))), [n + rank] * world, [n + q for q in range(world)])
    elif kind == "all_to_all":
        dist.all_to_all([torch.empty(n) for _ in range(world)],
                        [torch.randn(n) for _ in range(world)])
    elif kind == "all_gather":
        dist.all_gather([torch.empty(n) for _ in range(world)], x)
    elif kind == "all_gather_into_tensor":
        dist.all_gather_into_tensor(torch.empty(n * world), x)
    elif kind == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(torch.empty(n), torch.randn(n * world))
    elif kind == "broadcast":
        dist.broadcast(x, n % world)
    elif kind == "gather":
        dist.gather(x, [torch.empty(n) for _ in range(world)] if rank == 0 else None, dst=0)
    elif kind == "scatter":
        dist.scatter(x, [torch.randn(n) for _ in range(world)] if rank == 1 else None, src=1)
    elif kind == "reduce":
        dist.reduce(x, 0)
    elif kind == "all_reduce":
        dist.all_reduce(x)
    elif kind == "fused_all_gather_matmul":
        rows = max(1, n // 64)
        ops.fused_all_gather_matmul(torch.randn(rows, 64), [torch.randn(64, 32)], 0)
    elif kind == "fused_matmul_reduce_scatter":
        rows = world * max(1, n // (64 * world))
        ops.fused_matmul_reduce_scatter(torch.randn(rows, 64), torch.randn(64, 32), "sum", 0)


def run_mixed(rank, world, victim, event):
    """NOTE [Tensors in stream order] in backend/workspace_collectives.cpp: a seeded random
    workload of every op (CUDA_P2P_FAULT_SEED; the same schedule on every rank); the victim kills
    itself after a random number of them, and every survivor's next op (CUDA_P2P_FAULT_LAST's
    kind, if set) times out. main() then
    destroys the group and collects the garbage: memory an op's queued work still wrote into
    would be freed by then (with CUDA's semantics a released wait lets that work run on), and
    the allocator's checks abort the process."""
    import random

    rng = random.Random(int(os.environ.get("CUDA_P2P_FAULT_SEED", "0")))
    schedule = [(rng.choice(MIXED_KINDS), rng.choice([7, 300, 4096, 40000])) for _ in range(40)]
    kill_after = rng.randrange(5, len(schedule))
    # The op that times out (CUDA_P2P_FAULT_LAST: a kind, at its largest size), else random.
    if os.environ.get("CUDA_P2P_FAULT_LAST"):
        schedule[kill_after] = (os.environ["CUDA_P2P_FAULT_LAST"], 40000)
    event("schedule", kill_after=kill_after, next=schedule[kill_after])
    for i, (kind, n) in enumerate(schedule):
        if i == kill_after:
            if rank == victim:
                event("ready")
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.2)  # the victim is gone: this op must time out, its work queued
        mixed_op(kind, n, world, rank)
    raise AssertionError("the workload ended without the victim")


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    case, victim, out_dir = sys.argv[4], int(sys.argv[5]), sys.argv[6]
    out = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)

    def event(kind, **kw):
        out.write(json.dumps(dict(kind=kind, rank=rank, t=time.time(), **kw)) + "\n")

    # Nothing below may hang: a rank still alive after this exits non-zero with its stacks.
    faulthandler.dump_traceback_later(RENDEZVOUS_S + 60, exit=True)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_S))
    store.set_timeout(timeout)
    faulthandler.dump_traceback_later(60, exit=True)  # from the rendezvous on
    if case == "pre_rendezvous" and rank == victim:
        event("ready")
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        run(rank, world, store, case, victim, event)
    except Exception as e:  # noqa: BLE001 - every error is the point here
        event("error", error=f"{type(e).__name__}: {e}"[:3000])
    faulthandler.dump_traceback_later(30, exit=True)  # test_faults.TEARDOWN_GUARD_S
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - reported, the residue check still runs
            event("destroy_error", error=f"{type(e).__name__}: {e}"[:1000])
    import gc

    gc.collect()
    # Churn the heap: a block an op's queued work wrote into after it was freed breaks the
    # allocator's lists, which it checks here.
    junk = [torch.empty(n) for n in range(1, 4000, 7)]
    del junk
    gc.collect()
    maps, fds = memfds_of_ours()
    event("clean", memfd_maps=maps, memfd_fds=fds)
    event("done")
    out.close()
    if rank == 0:
        outlive_the_others(out_dir, world, victim)
    os._exit(0)


def outlive_the_others(out_dir, world, victim, limit_s=20.0):
    """Rank 0 hosts the store: it stays until every other survivor is done, so that a survivor
    still in its own timeout (a loaded machine starts their clocks apart) names the victim rather
    than a store that went away."""
    deadline = time.monotonic() + limit_s
    others = [r for r in range(1, world) if r != victim]
    while time.monotonic() < deadline:
        done = 0
        for r in others:
            try:
                with open(os.path.join(out_dir, f"rank{r}.jsonl")) as f:
                    done += '"kind": "done"' in f.read()
            except OSError:
                pass
        if done == len(others):
            return
        time.sleep(0.05)


if __name__ == "__main__":
    main()
