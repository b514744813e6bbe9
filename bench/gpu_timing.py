#!/usr/bin/env python3
"""A small timing table on a GPU machine, for the record: W ranks SHARING ONE GPU.

Ranks on one GPU are not peers over NVLink: every figure below measures CUDA IPC within one
device (signals through IPC-mapped memory, copies that never leave the GPU, ranks time-sliced on
the same SMs). They are what scripts/gpu_check.sh can measure, not what cuda_p2p does between
GPUs; the goal for real peers (signal round trip and barrier <= 10 us) is quoted for context only.

Rows (median over --iters, after warm-up; times from CUDA events on each rank's stream, the
slowest rank's):
  barrier, 2 ranks      intra_node_barrier among ranks 0 and 1: a signal each way (the round trip
                        a pull waits on)
  barrier, W ranks      intra_node_barrier among all ranks
  peer pull             copy of --pull-mib MiB from rank (r+1)%W's workspace buffer (its CUDA IPC
                        mapping) into a local tensor: GB/s
  fused vs unfused      cuda_p2p.fused_all_gather_matmul / fused_matmul_reduce_scatter against the
                        same group's workspace all_gather / reduce_scatter (opt-in path) + matmul,
                        at one shape; no NCCL anywhere (it refuses two ranks on one GPU)
  torch symm_mem        PyTorch's own torch.ops.symm_mem.fused_all_gather_matmul /
                        fused_matmul_reduce_scatter (SymmetricMemory), same shapes, same run, after
                        ours: its ratio to our unfused baseline beside ours. Optional
                        (--no-torch-symm-mem): where torch's SymmetricMemory refuses or fails (e.g.
                        ranks on one GPU), the table says why, and our rows stand.

    python bench/gpu_timing.py [--world-size 2] [--iters 50] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import free_port  # noqa: E402

NONCCL = "cuda_p2p_nonccl"
OPT_IN_ENV = "CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES"


def _create_nonccl(opts, pg_options):
    """cuda_p2p with Gloo for CPU tensors and a second Gloo group for CUDA tensors: the workspace
    lives on the GPU (a CUDA backend is wrapped) and nothing needs NCCL."""
    from torch.distributed import PrefixStore

    from cuda_p2p import ProcessGroupCudaP2P
    from cuda_p2p._backend import _copy_options

    options = _copy_options(pg_options)
    options._timeout = opts.timeout
    options.group_name = str(opts.group_id)
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    options.global_ranks_in_group = list(opts.global_ranks_in_group) or list(range(size))
    gloo = dist.ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, opts.timeout)
    gloo_cuda = dist.ProcessGroupGloo(PrefixStore("gloo_cuda/", store), rank, size, opts.timeout)
    return ProcessGroupCudaP2P(store, rank, size, options, gloo, gloo_cuda)


def _time(fn, iters, warmup, sync_group):
    """Median and min of per-iteration times (ms, the slowest rank's), CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier(group=sync_group)  # Gloo on the CPU: start together
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        t = torch.tensor([start.elapsed_time(end)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sync_group)
        times.append(t.item())
    return statistics.median(times), min(times)


def _rank_main(rank, W, port, args, queue):
    faulthandler.enable(all_threads=True)  # a rank that dies of a signal shows where
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import cuda_p2p
    from cuda_p2p import ProcessGroupCudaP2P

    if NONCCL.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NONCCL, _create_nonccl, extended_api=True,
                                      devices=["cpu", "cuda"])
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W)
    cpu = dist.group.WORLD
    o = ProcessGroupCudaP2P.Options()
    if hasattr(o, "cuda_workspace_collectives"):
        o.cuda_workspace_collectives = True
    o.buffer_size = max(args.pull_mib << 20, 64 << 20)
    os.environ[OPT_IN_ENV] = "1"
    g = dist.new_group(backend=NONCCL, pg_options=o)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    assert b.is_p2p_available(), b.p2p_unavailable_reason()
    rows = {}
    it, wu = args.iters, 5

    if W >= 2:
        rows["barrier, 2 ranks (us)"] = _time(
            lambda: b.intra_node_barrier([0, 1]) if rank < 2 else None, it * 4, wu, cpu)
    rows[f"barrier, {W} ranks (us)"] = _time(lambda: b.intra_node_barrier(), it * 4, wu, cpu)
    for k in list(rows):
        rows[k] = tuple(v * 1000 for v in rows[k])  # ms -> us

    nbytes = args.pull_mib << 20
    peer = b.get_p2p_buffer((rank + 1) % W, [nbytes // 4], torch.float32)
    dst = torch.empty(nbytes // 4, device=dev)
    b.get_p2p_buffer(rank, [nbytes // 4], torch.float32).fill_(rank)
    torch.cuda.synchronize()
    b.intra_node_barrier()
    # (pyflakes takes the `del peer` below for a use before the call: noqa.)
    med, best = _time(lambda: dst.copy_(peer), it, wu, cpu)  # noqa: F821
    rows[f"peer pull {args.pull_mib} MiB (GB/s)"] = (nbytes / med / 1e6, nbytes / best / 1e6)
    b.intra_node_barrier()
    # A view of a peer's buffer keeps its mapping (and, after growth, an old block) alive; let it
    # go while the store is up (NOTE [Block lifetime]: the first GPU run warned at exit).
    del peer

    dtype = getattr(torch, args.dtype)
    M, H = args.m, args.h
    F = 4 * H
    A_shard = torch.randn(M // W, H, device=dev, dtype=dtype)
    B_col = torch.randn(H, F // W, device=dev, dtype=dtype)
    gathered = torch.empty(M, H, device=dev, dtype=dtype)

    def ag_unfused():
        dist.all_gather_into_tensor(gathered, A_shard, group=g)
        return gathered @ B_col

    ms = {}
    ms["all_gather+matmul"] = _time(ag_unfused, it, wu, cpu)
    for algo in ("pipeline", "pull_ahead"):
        ms[f"fused_all_gather_matmul {algo}"] = _time(
            lambda: cuda_p2p.fused_all_gather_matmul(A_shard, [B_col], 0, group=g,
                                                     algorithm=algo), it, wu, cpu)
    A_row = torch.randn(M, F // W, device=dev, dtype=dtype)
    B_row = torch.randn(F // W, H, device=dev, dtype=dtype)
    rs_out = torch.empty(M // W, H, device=dev, dtype=dtype)

    def rs_unfused():
        dist.reduce_scatter_tensor(rs_out, A_row @ B_row, group=g)
        return rs_out

    ms["matmul+reduce_scatter"] = _time(rs_unfused, it, wu, cpu)
    for algo in ("pipeline", "ring"):
        ms[f"fused_matmul_reduce_scatter {algo}"] = _time(
            lambda: cuda_p2p.fused_matmul_reduce_scatter(A_row, B_row, "sum", 0, group=g,
                                                         algorithm=algo), it, wu, cpu)
    ms["matmul alone (ag shape)"] = _time(lambda: gathered @ B_col, it, wu, cpu)
    torch.cuda.synchronize()
    counters = b.get_counters()
    if rank == 0:  # ours first: torch's SymmetricMemory below may fail, even crash the process
        queue.put(("ours", {"rows": rows, "ms": ms, "counters": counters,
                            "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__}))
    if args.torch_symm_mem:
        theirs = _torch_symm_mem(A_shard, B_col, A_row, B_row, it, wu, cpu)
        if rank == 0:
            queue.put(("torch_symm_mem", theirs))
    dist.barrier(group=cpu)
    dist.destroy_process_group()


def _torch_symm_mem(A_shard, B_col, A_row, B_row, it, wu, cpu):
    """PyTorch's fused ops on the same shapes: {row: (median, best)} or {"error": text}. Every
    rank runs the same steps, so an exception is (normally) raised on all of them alike; each
    rank reports its own, rank 0's is printed."""
    import warnings

    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.new_group(backend="gloo")  # its store holds SymmetricMemory's rendezvous
        name = group.group_name
        with warnings.catch_warnings():  # deprecated (and no longer needed) in newer torch
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(name)
        ag = torch.ops.symm_mem.fused_all_gather_matmul
        rs = torch.ops.symm_mem.fused_matmul_reduce_scatter
        out = {}
        out["torch symm_mem fused_all_gather_matmul"] = _time(
            lambda: ag(A_shard, [B_col], 0, name), it, wu, cpu)
        out["torch symm_mem fused_matmul_reduce_scatter"] = _time(
            lambda: rs(A_row, B_row, "sum", 0, name), it, wu, cpu)
        torch.cuda.synchronize()
        return out
    except Exception as e:  # noqa: BLE001  (reported in the table, ours stand)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--pull-mib", type=int, default=64)
    ap.add_argument("--m", type=int, default=8192, help="tokens")
    ap.add_argument("--h", type=int, default=4096, help="hidden size (FFN = 4H)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--no-torch-symm-mem", dest="torch_symm_mem", action="store_false",
                    help="leave out PyTorch's SymmetricMemory fused ops")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_timing.py: no CUDA GPU here", file=sys.stderr)
        return 2
    W = args.world_size
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    t0 = time.monotonic()
    procs = [ctx.Process(target=_rank_main, args=(r, W, port, args, queue)) for r in range(W)]
    for p in procs:
        p.start()
    got = {}
    want = {"ours", "torch_symm_mem"} if args.torch_symm_mem else {"ours"}
    deadline = None  # once ours arrived: torch's part gets a bounded time (it may hang or crash)
    while not want <= got.keys() and (any(p.is_alive() for p in procs) or not queue.empty()):
        if deadline is not None and time.monotonic() > deadline:
            break
        try:  # read before joining: a child exits only once its queued result is consumed
            kind, value = queue.get(timeout=1)
            got[kind] = value
            if kind == "ours":
                deadline = time.monotonic() + 40
        except Exception:  # noqa: BLE001  (queue.Empty; keep polling while ranks run)
            pass
    for p in procs:
        p.join(10 if deadline is not None and time.monotonic() > deadline else 30)
        if p.is_alive():
            p.kill()
            p.join(5)
    codes = [p.exitcode for p in procs]
    res = got.get("ours")
    if res is None:
        print(f"gpu_timing.py: ranks exited with {codes}", file=sys.stderr)
        return 1
    if args.torch_symm_mem and "torch_symm_mem" not in got:
        got["torch_symm_mem"] = {"error": f"no result: the ranks exited with {codes} during it"}
    title = (f"cuda_p2p timing: {W} ranks SHARING ONE GPU ({res['gpu']}), torch {res['torch']}; "
             "not peer GPUs (goal on real peers: signal round trip and barrier <= 10 us)")
    lines = [title, "", f"{'what':44s} {'median':>10s} {'best':>10s}"]
    for k, (med, best) in res["rows"].items():
        lines.append(f"{k:44s} {med:10.1f} {best:10.1f}")
    shape = f"M={args.m} H={args.h} F={4 * args.h} {args.dtype}"
    lines += ["", f"fused vs unfused, {shape} (ms, NCCL-free)"]
    base = {"fused_all_gather_matmul": res["ms"]["all_gather+matmul"][0],
            "fused_matmul_reduce_scatter": res["ms"]["matmul+reduce_scatter"][0]}
    for k, (med, best) in res["ms"].items():
        op = k.split()[0]
        ratio = f"  x{base[op] / med:.2f} vs unfused" if op in base else ""
        lines.append(f"{k:44s} {med:10.3f} {best:10.3f}{ratio}")
    if args.torch_symm_mem:
        theirs = got["torch_symm_mem"]
        lines += ["", "PyTorch SymmetricMemory, same shapes, same run (ms; ratios vs our unfused)"]
        if "error" in theirs:
            lines.append(f"  not measured: {theirs['error']}")
        else:
            for k, (med, best) in theirs.items():
                op = k.split()[-1]
                lines.append(f"{k:44s} {med:10.3f} {best:10.3f}  x{base[op] / med:.2f} vs unfused")
        res["torch_symm_mem"] = theirs
    lines.append(f"({time.monotonic() - t0:.0f} s; counters on rank 0: {res['counters']})")
    if set(codes) != {0}:  # after our rows were in: torch's part hung or crashed, or teardown
        lines.append(f"(the ranks exited with {codes} after our rows; killed if negative)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": W, "shape": shape, **res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
