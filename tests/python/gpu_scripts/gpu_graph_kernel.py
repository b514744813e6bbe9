#!/usr/bin/env python3
"""Captured collectives as one kernel on a GPU (scripts/gpu_check.sh, step "graph_kernel"): the
graph nodes per captured op, and the time of a captured small all-reduce.

NOTE [Captured collectives in one kernel] in ops/captured_collectives.cpp. Each run starts W ranks
sharing the one GPU; every rank, on one group (opt-in workspace collectives):
  1. for each op below: runs it once eagerly (the warm-up), captures it alone in a
     torch.cuda.CUDAGraph(keep_graph=True), counts the captured graph's nodes with the driver's
     cuGraphGetNodes, replays it with new inputs and checks the output against plain torch
     (small integers: exact). With W >= 2 the small ops must be one kernel: at most 2 nodes (the
     code gives 1); the large all-reduce keeps the copy engine and is reported only;
  2. times, per op, median of --iters: a graph of --graph-ops captured 8 KiB all_reduce_, the
     same ops eager, torch.ops.symm_mem.one_shot_all_reduce eager and captured where torch allows
     it (else the reason), and a graph of 85 dependent single-block kernels - the floor of the
     old design's one-shot all-reduce on 8 GPUs (~85 nodes, issue 49). With W >= 2 the ranks
     share one GPU, so every figure is time-sliced (the ranks' kernels take turns) and says so.

    python tests/python/gpu_scripts/gpu_graph_kernel.py [--world-sizes 1 2 4] [--timeout 60]

Exit status: 0 when every rank of every run passed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys

import torch

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import _gpu_readiness as R  # noqa: E402

_FLOOR_NODES = 85


def _ints(seed: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def _graph_nodes(graph: torch.cuda.CUDAGraph) -> int:
    """The nodes of a graph captured with keep_graph=True (the driver's cuGraphGetNodes)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_size_t(0)
    rc = cuda.cuGraphGetNodes(ctypes.c_void_p(graph.raw_cuda_graph()), None, ctypes.byref(count))
    if rc != 0:
        raise RuntimeError(f"cuGraphGetNodes failed: CUresult {rc}")
    return int(count.value)


def _capture(fn, keep: bool = False) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph(keep_graph=keep)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return g


def _time_us(fn, ops: int, iters: int) -> float:
    """Median microseconds per op of fn() (which runs `ops` ops), every rank starting together."""
    import torch.distributed as dist

    times = []
    for _ in range(iters):
        dist.barrier(group=dist.group.WORLD)
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1000 / ops)
    return statistics.median(times)


def _rank(rank: int, world_size: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    R.init(rank, world_size, port, cuda=True)
    dev = R.device_of(True)
    g = R.cuda_p2p_group(True, buffer_size=16 << 20, timeout_s=30)
    W = world_size
    sliced = f" (time-sliced: {W} ranks share one GPU)" if W > 1 else ""

    # 1. nodes per captured op. name -> (numel per rank, run(t_in, t_out), want(seed) -> tensor)
    def tensors(n: int, out_n: int):
        return torch.zeros(n, device=dev), torch.zeros(out_n, device=dev)

    cases = {
        "all_reduce_ 8 KiB": (2048, 2048, "ar_"),
        "dist.all_reduce 256 KiB": (65536, 65536, "ar"),
        "all_gather_into_tensor 16 KiB per rank": (4096, W * 4096, "ag"),
        "reduce_scatter_tensor 64 KiB in": (W * 4096, 4096, "rs"),
        "dist.all_reduce 4 MiB (copy engine)": (1 << 20, 1 << 20, "ar"),
    }
    failures = []
    for name, (n, out_n, kind) in cases.items():
        x, y = tensors(n, out_n)

        def run(x=x, y=y, kind=kind):
            if kind == "ar_":
                cuda_p2p.all_reduce_(x, group=g)
            elif kind == "ar":
                dist.all_reduce(x, group=g)
            elif kind == "ag":
                dist.all_gather_into_tensor(y, x, group=g)
            else:
                dist.reduce_scatter_tensor(y, x, group=g)

        def fill(seed: int, x=x, n=n, kind=kind):
            x.copy_(_ints(seed + rank, (n,)))
            parts = [_ints(seed + q, (n,)) for q in range(W)]
            if kind == "ag":
                return torch.cat(parts)
            total = sum(parts)
            if kind == "rs":
                return total[rank * (n // W):(rank + 1) * (n // W)]
            return total

        want = fill(1)
        run()
        torch.cuda.synchronize()
        graph = _capture(run, keep=True)
        nodes = _graph_nodes(graph)
        graph.instantiate()
        want = fill(2)
        graph.replay()
        torch.cuda.synchronize()
        got = (x if kind in ("ar_", "ar") else y).cpu()
        right = torch.equal(got, want)
        small = "copy engine" not in name
        R.say(rank, f"nodes W={W} {name}: {nodes} graph node(s); replay "
                    f"{'right' if right else 'WRONG'}")
        if not right:
            failures.append(f"{name}: the replay differs from plain torch")
        if W > 1 and small and nodes > 2:
            failures.append(f"{name}: {nodes} graph nodes, expected at most 2 (one kernel)")
        del graph

    # 2. timing
    x = _ints(rank, (2048,)).to(dev)  # 8 KiB
    for _ in range(3):
        cuda_p2p.all_reduce_(x, group=g)
    torch.cuda.synchronize()
    ops = args.graph_ops
    captured = _capture(lambda: [cuda_p2p.all_reduce_(x, group=g) for _ in range(ops)])
    graph_us = _time_us(captured.replay, ops, args.iters)
    eager_us = _time_us(lambda: [cuda_p2p.all_reduce_(x, group=g) for _ in range(ops)], ops,
                        args.iters)
    R.say(rank, f"timing W={W} 8 KiB all_reduce_: graph {graph_us:.1f} us, eager "
                f"{eager_us:.1f} us per op{sliced}")
    symm = "torch.ops.symm_mem.one_shot_all_reduce: "
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name
        symm_mem.enable_symm_mem_for_group(name)
        t = symm_mem.empty(2048, device=dev)
        symm_mem.rendezvous(t, group=name)
        t.copy_(x)
        for _ in range(3):
            torch.ops.symm_mem.one_shot_all_reduce(t, "sum", name)
        torch.cuda.synchronize()
        symm_eager = _time_us(
            lambda: [torch.ops.symm_mem.one_shot_all_reduce(t, "sum", name) for _ in range(ops)],
            ops, args.iters)
        sg = _capture(
            lambda: [torch.ops.symm_mem.one_shot_all_reduce(t, "sum", name) for _ in range(ops)])
        symm_graph = _time_us(sg.replay, ops, args.iters)
        symm += f"graph {symm_graph:.1f} us, eager {symm_eager:.1f} us per op{sliced}"
    except Exception as e:  # noqa: BLE001  (reported: "where torch allows it")
        symm += f"not run ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    R.say(rank, f"timing W={W} 8 KiB {symm}")
    one = torch.zeros(1, device=dev)
    floor = _capture(lambda: [one.add_(1) for _ in range(_FLOOR_NODES)], keep=True)
    floor_nodes = _graph_nodes(floor)
    floor.instantiate()
    floor_us = _time_us(floor.replay, 1, args.iters)
    R.say(rank, f"timing W={W} the old design's floor: a graph of {floor_nodes} dependent "
                f"single-block kernels {floor_us:.1f} us per replay{sliced}")
    torch.cuda.synchronize()
    dist.barrier()
    if failures:
        raise AssertionError("; ".join(failures))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--graph-ops", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_graph_kernel.py: no CUDA GPU here", file=sys.stderr)
        return 2
    failed = []
    for W in args.world_sizes:
        print(f"== graph_kernel, {W} rank(s) sharing the GPU", flush=True)
        codes = R.launch(_rank, W, args, args.timeout)
        if any(c != 0 for c in codes):
            failed.append(f"W={W}: exit codes {codes}")
    return R.main_exit(failed, "gpu_graph_kernel.py")


if __name__ == "__main__":
    sys.exit(main())
