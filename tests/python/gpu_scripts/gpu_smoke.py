#!/usr/bin/env python3
"""The GPU path's first steps, one line per step (scripts/gpu_check.sh runs it before the suites).

Each rank prints "rank R: <step> ..." before a step and "... ok (<seconds>)" after it, with
faulthandler on: where a rank dies (a segfault, an abort), its last line names the step and its
Python stacks follow; a rank that hangs past --timeout gets SIGABRT, which prints them too.

Runs, each in fresh processes:
  default-group   1 rank: init_process_group("cuda_p2p") as tests/python/_harness.py does it
                  (no torch.cuda.set_device first; the CUDA side wraps real NCCL), an all-reduce
                  through NCCL, a Gloo subgroup, teardown.
  workspace W     W ranks on one GPU (default 1 and 2): a cuda_p2p group whose CUDA side is a
                  second Gloo group ("cuda_p2p_nonccl" of tests/python/gpu/test_gpu.py: NCCL refuses
                  two ranks on one GPU), its workspace, a barrier, a peer's buffer (before and
                  after the workspace grew), an all-reduce and an all-gather on the workspace
                  (opt-in), both fused ops, counters, teardown.
Every result is checked against plain torch.

    python tests/python/gpu_scripts/gpu_smoke.py [--world-sizes 1 2] [--timeout 120] [--device cpu]

--device cpu runs the same steps on the host workspace (the default-group run is left out): it
checks this script itself where there is no GPU (tests/python/gpu/test_gpu_smoke.py). --in-process
runs the 1-rank runs in this process, for a debugger (a crash's C++ frames).
Exit status: 0 when every rank of every run passed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from _harness import free_port  # noqa: E402  (tests/python: the test harness)

HERE = os.path.dirname(os.path.abspath(__file__))


class _Steps:
    """step(what, fn, *args): runs fn between two lines that name it."""

    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, what: str, fn, *args, **kwargs):
        print(f"rank {self.rank}: {what} ...", flush=True)
        t0 = time.monotonic()
        result = fn(*args, **kwargs)
        print(f"rank {self.rank}: {what} ok ({time.monotonic() - t0:.2f} s)", flush=True)
        return result


def _default_group(step, port: int) -> None:
    import torch.distributed as dist

    step("import cuda_p2p", __import__, "cuda_p2p")
    step("init_process_group(cuda_p2p), no set_device first", dist.init_process_group,
         "cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    def nccl_all_reduce():
        t = torch.ones(10, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        assert torch.equal(t.cpu(), torch.ones(10)), t

    step("all_reduce of a CUDA tensor (wrapped NCCL)", nccl_all_reduce)
    step("new_group(gloo)", dist.new_group, [0], backend="gloo")
    step("destroy_process_group", dist.destroy_process_group)


def _workspace(step, rank: int, world_size: int, port: int, cuda: bool) -> None:
    sys.path[:0] = [HERE, os.path.join(_TESTS, "gpu"), _TESTS]
    os.environ["CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES"] = "1"

    def imports():
        import cuda_p2p  # noqa: F401
        import test_gpu  # noqa: F401  (registers cuda_p2p_nonccl)

    step("import cuda_p2p and the test backend", imports)
    import torch.distributed as dist

    import cuda_p2p
    import test_gpu

    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        step("torch.cuda.set_device(0)", torch.cuda.set_device, dev)
    step("init_process_group(gloo)", dist.init_process_group, "gloo",
         init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)

    def make_group():
        o = cuda_p2p.ProcessGroupCudaP2P.Options()
        o.cuda_workspace_collectives = True
        o.buffer_size = 1 << 20
        # Explicit: test_gpu imports conftest.py, which sets CUDA_P2P_WORKSPACE_DEVICE=cpu for
        # the CPU suite (a GPU run's smoke then tested a host workspace beside the GPU).
        o.workspace_device = "cuda" if cuda else "cpu"
        return dist.new_group(backend=test_gpu.NONCCL if cuda else "cuda_p2p", pg_options=o)

    g = step("new_group(cuda_p2p" + (" over Gloo for CUDA tensors)" if cuda else ")"), make_group)
    b = step("get_cuda_p2p_backend", cuda_p2p.get_cuda_p2p_backend, g)
    assert step("is_p2p_available", b.is_p2p_available), b.p2p_unavailable_reason()
    where = b.get_collective_config()["workspace_device"]
    assert where == dev.type, f"the workspace is on {where}, expected {dev.type}"
    step("intra_node_barrier", b.intra_node_barrier)
    peer = (rank + 1) % world_size

    def peer_buffer():
        b.get_p2p_buffer(rank, [256], torch.float32).fill_(rank + 1)
        sync()
        b.intra_node_barrier()
        got = b.get_p2p_buffer(peer, [256], torch.float32).clone()
        sync()
        b.intra_node_barrier()
        assert torch.equal(got.cpu(), torch.full((256,), float(peer + 1))), got[:4]

    step("get_p2p_buffer: the peer's buffer", peer_buffer)
    step("ensure_min_buffer_size(4 MiB): the workspace grows", b.ensure_min_buffer_size, 4 << 20)
    step("get_p2p_buffer after growth", peer_buffer)

    def all_reduce():
        t = torch.full((1000,), float(rank + 1), device=dev)
        dist.all_reduce(t, group=g)
        sync()
        want = world_size * (world_size + 1) / 2
        assert torch.equal(t.cpu(), torch.full((1000,), want)), t[:4]

    step("all_reduce on the workspace", all_reduce)

    def all_gather():
        x = torch.arange(7, device=dev, dtype=torch.bfloat16) + 10 * rank
        out = torch.empty(7 * world_size, device=dev, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, x, group=g)
        sync()
        want = torch.cat([torch.arange(7, dtype=torch.bfloat16) + 10 * r
                          for r in range(world_size)])
        assert torch.equal(out.cpu(), want), out

    step("all_gather_into_tensor on the workspace", all_gather)

    def fused():
        gen = torch.Generator().manual_seed(0)
        shards = [torch.randint(-2, 3, (5, 16), generator=gen).float() for _ in range(world_size)]
        w = torch.randint(-2, 3, (16, 8), generator=gen).float()
        _, outs = cuda_p2p.fused_all_gather_matmul(shards[rank].to(dev), [w.to(dev)], 0, group=g,
                                                   algorithm="pipeline")
        sync()
        assert torch.equal(outs[0].cpu(), torch.cat(shards) @ w), outs[0]

    step("fused_all_gather_matmul (pipeline)", fused)

    def fused_rs():
        gen = torch.Generator().manual_seed(1)
        As = [torch.randint(-2, 3, (4 * world_size, 16), generator=gen).float()
              for _ in range(world_size)]
        w = torch.randint(-2, 3, (16, 8), generator=gen).float()
        out = cuda_p2p.fused_matmul_reduce_scatter(As[rank].to(dev), w.to(dev), "sum", 0,
                                                   group=g, algorithm="pipeline")
        sync()
        want = sum(A @ w for A in As).chunk(world_size)[rank]
        assert torch.equal(out.cpu(), want), out

    step("fused_matmul_reduce_scatter (pipeline)", fused_rs)
    counters = step("get_counters", b.get_counters)
    print(f"rank {rank}: counters {counters}", flush=True)
    step("destroy the group", dist.destroy_process_group, g)
    step("destroy_process_group", dist.destroy_process_group)


def _rank_main(run: str, rank: int, world_size: int, port: int, cuda: bool) -> None:
    faulthandler.enable(all_threads=True)
    step = _Steps(rank)
    if run == "default-group":
        _default_group(step, port)
    else:
        _workspace(step, rank, world_size, port, cuda)
    print(f"rank {rank}: PASSED", flush=True)


def _launch(ctx, run: str, W: int, cuda: bool, timeout: float) -> list:
    """Starts W ranks of one run; their exit codes (a hang: SIGABRT after the timeout)."""
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(run, r, W, port, cuda)) for r in range(W)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for r, p in enumerate(procs):
        if p.is_alive():
            # faulthandler prints where every thread of the rank is stuck.
            print(f"gpu_smoke.py: rank {r} ran past {timeout:.0f} s; its stacks follow", flush=True)
            os.kill(p.pid, signal.SIGABRT)
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return [p.exitcode for p in procs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2],
                    help="ranks of the workspace runs")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--in-process", action="store_true",
                    help="the 1-rank runs only, in this process (no spawned ranks): for a "
                         "debugger's backtrace of a crash (scripts/gpu_check.sh runs it under "
                         "cuda-gdb when the smoke step failed)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_smoke.py: no CUDA GPU here", file=sys.stderr)
        return 2
    runs = ([("default-group", 1)] if cuda else []) + [("workspace", W) for W in args.world_sizes]
    if args.in_process:
        failed = 0
        for run in (["default-group"] if cuda else []) + ["workspace"]:
            print(f"== {run}, 1 rank, in this process", flush=True)
            try:  # an exception in one run must not hide a crash in the next
                _rank_main(run, 0, 1, free_port(), cuda)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                failed += 1
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
        return 1 if failed else 0
    ctx = mp.get_context("spawn")
    failed = []
    for run, W in runs:
        print(f"== {run}, {W} rank(s)", flush=True)
        codes = _launch(ctx, run, W, cuda, args.timeout)
        if any(c != 0 for c in codes):
            failed.append(f"{run} on {W} rank(s): exit codes {codes}")
    print("gpu_smoke.py: " + ("; ".join(failed) if failed else "every step passed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
