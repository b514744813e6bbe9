"""Workspace micro-benchmarks: barrier latency and copy bandwidth through the P2P workspace.

Every number is a ratio against a baseline measured in the same run:
  * barrier: cuda_p2p's intra_node_barrier (signal pads, futex back-off) vs a Gloo barrier;
  * copy: reading a peer's buffer through the workspace vs a plain memcpy between two private
    buffers of the same process (the limit: both are one-core memcpys).

    .venv/bin/python bench/bench_workspace.py --world-sizes 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import free_port, host_workspace


def _timed(fn, iters: int) -> float:
    """Median seconds per call over `iters` calls, in 5 batches."""
    batches = []
    per_batch = max(1, iters // 5)
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        batches.append((time.perf_counter() - t0) / per_batch)
    return statistics.median(batches)


def _rank_main(rank: int, world: int, port: int, args, out_q) -> None:
    import torch
    import torch.distributed as dist

    import cuda_p2p

    torch.set_num_threads(1)
    host_workspace()
    dist.init_process_group(
        "cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    gloo = dist.new_group(backend="gloo")
    backend = cuda_p2p.get_cuda_p2p_backend()
    if not backend.is_p2p_available():
        raise RuntimeError(f"workspace unavailable: {backend.p2p_unavailable_reason()}")
    max_bytes = max(args.sizes)
    backend.ensure_min_buffer_size(max_bytes)
    results = {"world_size": world}

    # Barrier latency: warm up, then time both with the same number of calls.
    for _ in range(50):
        backend.intra_node_barrier()
        dist.barrier(group=gloo)
    results["barrier_us"] = _timed(backend.intra_node_barrier, args.barrier_iters) * 1e6
    results["gloo_barrier_us"] = (
        _timed(lambda: dist.barrier(group=gloo), args.barrier_iters) * 1e6
    )

    # Copy bandwidth: pull the right neighbour's buffer vs a private memcpy.
    peer = (rank + 1) % world
    copies = []
    for nbytes in args.sizes:
        backend.get_p2p_buffer(rank, [nbytes], torch.uint8).fill_(rank)
        backend.intra_node_barrier()
        src_peer = backend.get_p2p_buffer(peer, [nbytes], torch.uint8)
        src_local = torch.full([nbytes], 7, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)
        iters = max(5, min(2000, (256 << 20) // nbytes))
        t_ws = _timed(lambda: dst.copy_(src_peer), iters)
        assert int(dst[0]) == peer and int(dst[-1]) == peer
        t_mem = _timed(lambda: dst.copy_(src_local), iters)
        copies.append(
            {
                "bytes": nbytes,
                "workspace_GBps": nbytes / t_ws / 1e9,
                "memcpy_GBps": nbytes / t_mem / 1e9,
            }
        )
        backend.intra_node_barrier()
    results["copies"] = copies
    out_q.put((rank, results))
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run_world(world: int, args) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, args, q), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"world size {world}: ranks did not report within {args.timeout} s")
            try:
                rank, res = q.get(timeout=min(remaining, 1.0))
                got[rank] = res
            except Exception:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"world size {world}: rank(s) {dead} failed") from None
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    # Report the slowest rank (the one everybody waits for).
    r0 = got[0]
    return {
        "world_size": world,
        "barrier_us": max(g["barrier_us"] for g in got.values()),
        "gloo_barrier_us": max(g["gloo_barrier_us"] for g in got.values()),
        "copies": [
            {
                "bytes": c["bytes"],
                "workspace_GBps": min(g["copies"][i]["workspace_GBps"] for g in got.values()),
                "memcpy_GBps": min(g["copies"][i]["memcpy_GBps"] for g in got.values()),
            }
            for i, c in enumerate(r0["copies"])
        ],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[64 << 10, 1 << 20, 16 << 20],
        help="copy sizes in bytes",
    )
    parser.add_argument("--barrier-iters", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per world size")
    parser.add_argument("--json", type=Path,
                        default=Path(__file__).parent / "results" / "workspace.json")
    args = parser.parse_args(argv)

    all_results = [run_world(w, args) for w in args.world_sizes]

    print(f"{'ranks':>5} {'barrier us':>11} {'gloo us':>9} {'speedup':>8}")
    for r in all_results:
        print(
            f"{r['world_size']:>5} {r['barrier_us']:>11.1f} {r['gloo_barrier_us']:>9.1f} "
            f"{r['gloo_barrier_us'] / r['barrier_us']:>7.1f}x"
        )
    print()
    print(f"{'ranks':>5} {'bytes':>10} {'workspace GB/s':>15} {'memcpy GB/s':>12} {'ratio':>6}")
    for r in all_results:
        for c in r["copies"]:
            print(
                f"{r['world_size']:>5} {c['bytes']:>10} {c['workspace_GBps']:>15.2f} "
                f"{c['memcpy_GBps']:>12.2f} {c['workspace_GBps'] / c['memcpy_GBps']:>6.2f}"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": os.uname().nodename, "nproc": os.cpu_count(),
                                     "results": all_results}, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
