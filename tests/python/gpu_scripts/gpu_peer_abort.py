#!/usr/bin/env python3
"""A peer's abort while the others replay a CUDA graph (scripts/gpu_check.sh, step "peer_abort";
NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp): no healthy rank's CUDA context is lost.

W ranks share the GPU, on one group (opt-in workspace collectives). Each captures a small
all_reduce_ (one kernel) and a larger dist.all_reduce (counted waits) in one torch.cuda.graph and
replays it once, checked against plain torch. Then the last rank aborts the group while the others
keep replaying, calling nothing of cuda_p2p's but cuda_p2p.check between replays - a loop that only
replays graphs. On every other rank:
  1. cuda_p2p.check raises within the group's timeout, naming the aborting rank;
  2. torch.cuda.synchronize() returns: the kernels ended quietly, no trap;
  3. the CUDA context still works: a fresh tensor's sum on the GPU is right.
With --trap (Options.trap_on_peer_failure) the replaying ranks' kernels must trap instead: their
synchronize raises. Never run that form under MPS.

With --concurrent (NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp), instead:
every rank captures the same all_reduce_ in two graphs on two streams; rank 0 replays both at
once while its peers are late (they replay one). Rank 0's second replay must run nothing:
cuda_p2p.check raises "another captured op ..." on rank 0 and names rank 0 on the peers, every
synchronize returns (no trap) and every context still computes right.

    python tests/python/gpu_scripts/gpu_peer_abort.py [--world-size 2] [--timeout-s 5]
                                                      [--trap | --concurrent]

Exit status: 0 when every rank passed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import _gpu_readiness as R  # noqa: E402


def _check_raises(g, needle: str, timeout_s: float) -> str:
    """Polls cuda_p2p.check(g) until it raises; the error must contain `needle`."""
    import cuda_p2p

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            cuda_p2p.check(g)
        except RuntimeError as e:
            if needle not in str(e):
                raise AssertionError(f"cuda_p2p.check raised without {needle!r}: {e}") from e
            return str(e)
        time.sleep(0.01)
    raise AssertionError(f"cuda_p2p.check raised nothing in {timeout_s} s")


def _context_works(dev) -> None:
    x = torch.arange(1000, device=dev, dtype=torch.float32)
    if x.sum().item() != 499500.0:
        raise AssertionError("the CUDA context no longer computes right")


def _concurrent(rank: int, world_size: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    R.init(rank, world_size, port, cuda=True)
    dev = R.device_of(True)
    g = R.cuda_p2p_group(True, buffer_size=1 << 20, timeout_s=args.timeout_s)
    a = torch.ones(1001, device=dev)
    b = torch.ones(1001, device=dev)
    cuda_p2p.all_reduce_(a, group=g)  # the warm-up
    graphs = []
    for t in (a, b):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            cuda_p2p.all_reduce_(t, group=g)
        torch.cuda.current_stream().wait_stream(s)
        graphs.append((graph, s))
    for graph, s in graphs:  # one after the other: both pass
        with torch.cuda.stream(s):
            graph.replay()
        torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        for graph, s in graphs:
            with torch.cuda.stream(s):
                graph.replay()
        error = _check_raises(g, "another captured op", 3 * args.timeout_s)
    else:
        time.sleep(0.5)
        with torch.cuda.stream(graphs[0][1]):
            graphs[0][0].replay()
        error = _check_raises(g, "rank 0", 3 * args.timeout_s)
    R.say(rank, f"cuda_p2p.check: {error[:160]}")
    torch.cuda.synchronize()  # raises if a kernel trapped
    _context_works(dev)
    R.say(rank, "no trap: synchronize returned and the context still works")
    dist.barrier()


def _rank(rank: int, world_size: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    if args.concurrent:
        _concurrent(rank, world_size, port, args)
        return
    R.init(rank, world_size, port, cuda=True)
    dev = R.device_of(True)
    g = R.cuda_p2p_group(True, buffer_size=1 << 20, timeout_s=args.timeout_s,
                         trap_on_peer_failure=args.trap)
    W, aborting = world_size, world_size - 1
    small = torch.zeros(1001, device=dev)
    big = torch.zeros(300_001, device=dev)

    def ops():
        cuda_p2p.all_reduce_(small, group=g)
        dist.all_reduce(big, group=g)

    ops()  # the warm-up: streams, workspace size
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        ops()
    torch.cuda.current_stream().wait_stream(s)
    small.fill_(rank + 1)
    big.fill_(2 * rank + 1)
    graph.replay()
    torch.cuda.synchronize()
    want_small, want_big = W * (W + 1) / 2, float(W * W)
    if small[0].item() != want_small or big[-1].item() != want_big:
        raise AssertionError(f"replay 1: {small[0].item()}, {big[-1].item()} "
                             f"(want {want_small}, {want_big})")
    dist.barrier()  # the default group: Gloo, the script's own
    if rank == aborting:
        time.sleep(1.0)  # the peers are replaying
        cuda_p2p.get_cuda_p2p_backend(g).abort()
        cuda_p2p.check(g)  # its own abort is no error
        R.say(rank, "aborted")
        dist.barrier()
        return
    t0 = time.monotonic()
    error = None
    while error is None and time.monotonic() - t0 < 3 * args.timeout_s:
        graph.replay()
        try:
            cuda_p2p.check(g)
        except RuntimeError as e:
            error = str(e)
        time.sleep(0.01)  # a replay loop's pace; the replays queue behind the first
    took = time.monotonic() - t0
    if error is None or f"rank {aborting}" not in error:
        raise AssertionError(f"cuda_p2p.check after {took:.1f} s: {error!r}")
    R.say(rank, f"cuda_p2p.check raised after {took:.1f} s: {error[:160]}")
    try:
        torch.cuda.synchronize()
        trapped = None
    except RuntimeError as e:
        trapped = str(e)
    if args.trap:
        if trapped is None:
            raise AssertionError("trap_on_peer_failure: the replay's kernels did not trap")
        R.say(rank, f"trapped as asked: {trapped[:160]}")
    else:
        if trapped is not None:
            raise AssertionError(f"a peer's abort made this rank's kernels trap: {trapped}")
        _context_works(dev)
        R.say(rank, "no trap: synchronize returned and the context still works")
    dist.barrier()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=5.0, help="the group's timeout")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--trap", action="store_true", help="Options.trap_on_peer_failure")
    mode.add_argument("--concurrent", action="store_true",
                      help="two graphs of one group replayed at once on rank 0")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for the run")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_peer_abort.py: no CUDA GPU here", file=sys.stderr)
        return 2
    codes = R.launch(_rank, args.world_size, args, args.timeout)
    failed = [] if all(c == 0 for c in codes) else [f"exit codes {codes}"]
    return R.main_exit(failed, "gpu_peer_abort.py")


if __name__ == "__main__":
    sys.exit(main())
