#!/usr/bin/env python3
"""CUDA graphs of cuda_p2p ops (scripts/gpu_check.sh, step "graph"): captured once, replayed with
new inputs, mixed with eager ops, checked against plain torch; then a captured small all-reduce
timed against the same op eager.

Each run starts W ranks sharing the one GPU (NOTE [Replay-safe signals] in
p2p_workspace/symmetric_workspace.cpp). Every rank, on one group (opt-in workspace collectives):
  1. runs each op once eagerly (the warm-up that sets up streams and workspace size);
  2. captures, in one torch.cuda.graph: cuda_p2p.all_reduce_ (one-shot size), dist.all_reduce
     (two-shot size), dist.all_gather_into_tensor, dist.reduce_scatter_tensor,
     cuda_p2p.fused_all_gather_matmul and cuda_p2p.fused_matmul_reduce_scatter;
  3. replays it --replays times, writing new values into the captured inputs before each replay
     and an eager all_reduce between replays; after each, every output against plain torch on
     the CPU (small integers: exact);
  4. times a captured 8 KiB all_reduce_ (a graph of --graph-ops of them) against the same ops
     eager, median of --iters (CUDA events), and prints the ratio.

    python tests/python/gpu_scripts/gpu_graph.py [--world-sizes 1 2 4] [--replays 20]
        [--timeout 240]

Exit status: 0 when every rank of every run passed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import _gpu_readiness as R  # noqa: E402


def _ints(seed: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def _rank(rank: int, world_size: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    R.init(rank, world_size, port, cuda=True)
    dev = R.device_of(True)
    g = R.cuda_p2p_group(True, buffer_size=4 << 20, timeout_s=60)
    W = world_size
    n1, n2, n3 = 1001, 300_001, 4099
    M, K, N = 64, 96, 80  # fused shapes: rows per rank, inner, columns

    small = torch.zeros(n1, device=dev)
    big = torch.zeros(n2, device=dev)
    ag_in = torch.zeros(n3, device=dev)
    ag_out = torch.zeros(W * n3, device=dev)
    rs_in = torch.zeros(W * n3, device=dev)
    rs_out = torch.zeros(n3, device=dev)
    A_shard = torch.zeros(M, K, device=dev)
    B = torch.zeros(K, N, device=dev)
    A_full = torch.zeros(W * M, K, device=dev)
    B2 = torch.zeros(K, N, device=dev)
    outs: dict = {}

    def ops():
        cuda_p2p.all_reduce_(small, group=g)
        dist.all_reduce(big, group=g)
        dist.all_gather_into_tensor(ag_out, ag_in, group=g)
        dist.reduce_scatter_tensor(rs_out, rs_in, group=g)
        _, (outs["ag_mm"],) = cuda_p2p.fused_all_gather_matmul(
            A_shard, [B], 0, group=g, return_A=False, algorithm="pipeline")
        outs["mm_rs"] = cuda_p2p.fused_matmul_reduce_scatter(
            A_full, B2, "sum", 0, group=g, algorithm="pipeline")

    def fill(round_: int) -> dict:
        seed = 1000 * round_
        small.copy_(_ints(seed + rank, (n1,)))
        big.copy_(_ints(seed + 10 + rank, (n2,)))
        ag_in.copy_(_ints(seed + 20 + rank, (n3,)))
        rs_in.copy_(_ints(seed + 30 + rank, (W * n3,)))
        A_shard.copy_(_ints(seed + 40 + rank, (M, K)))
        B.copy_(_ints(seed + 50, (K, N)))
        A_full.copy_(_ints(seed + 60 + rank, (W * M, K)))
        B2.copy_(_ints(seed + 70, (K, N)))
        want = {
            "all_reduce_": sum(_ints(seed + q, (n1,)) for q in range(W)),
            "all_reduce": sum(_ints(seed + 10 + q, (n2,)) for q in range(W)),
            "all_gather": torch.cat([_ints(seed + 20 + q, (n3,)) for q in range(W)]),
            "reduce_scatter": sum(_ints(seed + 30 + q, (W * n3,))
                                  for q in range(W))[rank * n3:(rank + 1) * n3],
            "ag_mm": torch.cat([_ints(seed + 40 + q, (M, K)) for q in range(W)])
            @ _ints(seed + 50, (K, N)),
            "mm_rs": sum(_ints(seed + 60 + q, (W * M, K)) @ _ints(seed + 70, (K, N))
                         for q in range(W))[rank * M:(rank + 1) * M],
        }
        return want

    def check(want: dict, what: str) -> None:
        got = {"all_reduce_": small, "all_reduce": big, "all_gather": ag_out,
               "reduce_scatter": rs_out, "ag_mm": outs["ag_mm"], "mm_rs": outs["mm_rs"]}
        bad = [k for k, v in want.items() if not torch.equal(got[k].cpu(), v)]
        if bad:
            raise AssertionError(f"{what}: {bad} differ from plain torch")

    # 1. eager warm-up, checked
    want = fill(0)
    ops()
    torch.cuda.synchronize()
    check(want, "eager")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    # 2. capture
    graph = torch.cuda.graph_pool_handle()
    cg = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(cg, pool=graph, stream=s):
            ops()
    torch.cuda.current_stream().wait_stream(s)
    counters = b.get_counters()
    R.say(rank, f"captured; counters {dict(sorted(counters.items()))}")
    if W > 1 and counters.get("all_reduce.graph", 0) < 1:
        raise AssertionError(f"no all_reduce counted under capture: {counters}")
    # 3. replays, with an eager op between
    for r in range(1, args.replays + 1):
        want = fill(r)
        cg.replay()
        torch.cuda.synchronize()
        check(want, f"replay {r}")
        e = _ints(7 + rank + 100 * r, (513,)).to(dev)
        dist.all_reduce(e, group=g)
        torch.cuda.synchronize()
        if not torch.equal(e.cpu(), sum(_ints(7 + q + 100 * r, (513,)) for q in range(W))):
            raise AssertionError(f"eager all_reduce after replay {r} differs")
    R.say(rank, f"{args.replays} replays right, eager ops between them right")
    # 4. timing: a graph of --graph-ops small all-reduces against the same ops eager
    x = _ints(rank, (2048,)).to(dev)  # 8 KiB
    for _ in range(3):
        cuda_p2p.all_reduce_(x, group=g)
    tg = torch.cuda.CUDAGraph()
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s2):
        with torch.cuda.graph(tg, pool=graph, stream=s2):
            for _ in range(args.graph_ops):
                cuda_p2p.all_reduce_(x, group=g)
    torch.cuda.current_stream().wait_stream(s2)
    times = {"eager": [], "graph": []}
    for _ in range(args.iters):
        for kind in ("eager", "graph"):
            dist.barrier(group=dist.group.WORLD)
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            if kind == "graph":
                tg.replay()
            else:
                for _ in range(args.graph_ops):
                    cuda_p2p.all_reduce_(x, group=g)
            t1.record()
            t1.synchronize()
            times[kind].append(t0.elapsed_time(t1) * 1000 / args.graph_ops)
    eager, graphed = statistics.median(times["eager"]), statistics.median(times["graph"])
    R.say(rank, f"timing W={W} 8 KiB all_reduce_: eager {eager:.1f} us, graph {graphed:.1f} us "
                f"per op (x{eager / graphed:.2f}; median of {args.iters}, ranks share one GPU)")
    torch.cuda.synchronize()
    dist.barrier()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--graph-ops", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_graph.py: no CUDA GPU here", file=sys.stderr)
        return 2
    failed = []
    for W in args.world_sizes:
        print(f"== graph, {W} rank(s) sharing the GPU", flush=True)
        codes = R.launch(_rank, W, args, args.timeout)
        if any(c != 0 for c in codes):
            failed.append(f"W={W}: exit codes {codes}")
    return R.main_exit(failed, "gpu_graph.py")


if __name__ == "__main__":
    sys.exit(main())
