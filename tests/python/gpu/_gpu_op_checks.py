"""The rank side of tests/python/gpu/test_gpu.py, continued: the fused ops, the buffer's growth
and rounds, get_p2p_buffer, Works on streams, a rank that never arrives and the routing default
(each check returns {"cases", "failures"}; the groups and inputs: _gpu_checks.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker
from _gpu_checks import (
    BUFFER,
    DTYPES,
    MARGIN_S,
    TIMEOUT_S,
    _close,
    _device,
    _expect_counter,
    _group,
    _input,
    _seed,
    _small,
    _sync,
)
from _reference import reduce_over_ranks


def check_fused_all_gather_matmul(ctx, algorithm):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("fag",))
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    chk, count = Checker(f"fused_all_gather_matmul[{algorithm}] W={W}"), 0
    # (shard shape, gather_dim): rows, a middle dim, the last (contraction) dim.
    cases = [((8, 16), 0), ((3, 16), 0), ((2, 5, 16), 1), ((4, 2, 8), -1), ((6, 12), 1)]
    for name, dtype in DTYPES.items():
        for shard, gd in cases:
            for nB in (1, 3):
                for return_A in (True, False):
                    seed = _seed(shard, gd, nB)
                    shards = [_small(shard, seed + r, dtype, "cpu") for r in range(W)]
                    A = torch.cat(shards, dim=gd)
                    k = A.shape[-1]
                    Bs = [_small((k, 7 + i), seed + 100 + i, dtype, "cpu") for i in range(nB)]
                    got_A, outs = cuda_p2p.fused_all_gather_matmul(
                        shards[rank].to(dev), [B.to(dev) for B in Bs], gd, group=g,
                        return_A=return_A, algorithm=algorithm)
                    what = f"{name} shard={shard} dim={gd} Bs={nB} return_A={return_A}"
                    if return_A:
                        chk.case(what, got_A is not None and torch.equal(got_A.cpu(), A), "A")
                    else:
                        chk.case(what, got_A is None, "returned A")
                    for i, B in enumerate(Bs):
                        want = (A.double() @ B.double()).to(dtype)
                        chk.case(f"{what} B{i}", torch.equal(outs[i].cpu(), want), "out differs")
                    count += 1
    _sync()
    _expect_counter(chk, g, f"fused_all_gather_matmul.{algorithm}", count)
    return chk.result()


def check_fused_matmul_reduce_scatter(ctx, algorithm):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("fmrs",))
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    chk, count = Checker(f"fused_matmul_reduce_scatter[{algorithm}] W={W}"), 0
    # (A shape with W folded into the scatter dim, scatter_dim)
    cases = [((4 * W, 16), 0), ((3 * W, 8), 0), ((2, 2 * W, 16), 1), ((5, 16), -1)]
    steps_list = (0, 2 * W) if algorithm == "ring" else (0,)
    for name, dtype in DTYPES.items():
        for a_shape, sd in cases:
            for op in ("sum", "avg"):
                for steps in steps_list:
                    seed = _seed(a_shape, sd, op)
                    As = [_small(a_shape, seed + r, dtype, "cpu") for r in range(W)]
                    n = 4 * W if sd == -1 else 6
                    B = _small((a_shape[-1], n), seed + 50, dtype, "cpu")
                    got = cuda_p2p.fused_matmul_reduce_scatter(
                        As[rank].to(dev), B.to(dev), op, sd, group=g, algorithm=algorithm,
                        ring_steps=steps)
                    total = sum(a.double() @ B.double() for a in As)
                    if op == "avg":
                        total = total / W
                    d = sd % total.dim()
                    want = total.chunk(W, dim=d)[rank].to(dtype)
                    what = f"{name} A={a_shape} dim={sd} {op} steps={steps}"
                    chk.case(what, _close(got, want, "AVG" if op == "avg" else "SUM"), "differs")
                    chk.case(what + " contiguous", got.is_contiguous(), "not contiguous")
                    count += 1
    _sync()
    _expect_counter(chk, g, f"fused_matmul_reduce_scatter.{algorithm}", count)
    return chk.result()


def check_growth_and_rounds(ctx):
    """An op larger than the buffer grows it (up to max_buffer_size), else runs in rounds."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"growth/rounds W={W}")
    shard = (512, 64)  # 64 KiB per float32 shard: several times a 16 KiB buffer
    A = [_small(shard, 7 + r, torch.float32, "cpu") for r in range(W)]
    B = _small((64, 32), 99, torch.float32, "cpu")
    want = torch.cat(A) @ B
    for key, max_size, counter in (("grow", 64 << 20, "grow"), ("rounds", 1 << 14, "rounds")):
        g = _group(("gr", key), buffer_size=1 << 14, max_buffer_size=max_size)
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        before = b.get_buffer_size()
        _, outs = cuda_p2p.fused_all_gather_matmul(A[rank].to(dev), [B.to(dev)], 0, group=g)
        chk.case(f"{key} result", torch.equal(outs[0].cpu(), want), "differs")
        c = b.get_counters()
        chk.case(f"{key} counter", c.get(f"fused_all_gather_matmul.{counter}", 0) == 1, f"{c}")
        if key == "grow":
            chk.case("grew", b.get_buffer_size() > before, f"{before} -> {b.get_buffer_size()}")
        # ensure_min_buffer_size is collective and leaves the group usable.
        b.ensure_min_buffer_size(1 << 20)
        chk.case(f"{key} ensure_min", b.get_buffer_size() >= 1 << 20, f"{b.get_buffer_size()}")
        _, outs = cuda_p2p.fused_all_gather_matmul(A[rank].to(dev), [B.to(dev)], 0, group=g)
        chk.case(f"{key} after ensure_min", torch.equal(outs[0].cpu(), want), "differs")
    return chk.result()


def check_p2p_buffer(ctx):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("buf",), buffer_size=BUFFER)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk = Checker(f"get_p2p_buffer W={W}")
    mine = b.get_p2p_buffer(rank, [256], torch.float32)
    chk.case("device", mine.device == dev, f"{mine.device}")
    mine.fill_(rank + 0.5)
    _sync()
    b.intra_node_barrier()
    for r in range(W):
        peer = b.get_p2p_buffer(r, [256], torch.float32)
        chk.case(f"peer {r} device", peer.device == dev, f"{peer.device}")
        chk.case(f"peer {r}", torch.equal(peer.cpu(), torch.full((256,), r + 0.5)), "differs")
    # An offset view, written by the next rank into this rank's buffer.
    nxt = (rank + 1) % W
    view = b.get_p2p_buffer(nxt, [16], torch.float32, storage_offset=256)
    b.intra_node_barrier()
    view.copy_(torch.arange(16, dtype=torch.float32, device=dev) + 100 * rank)
    _sync()
    b.intra_node_barrier()
    prev = (rank - 1) % W
    got = b.get_p2p_buffer(rank, [16], torch.float32, storage_offset=256)
    chk.case("written by peer", torch.equal(got.cpu(), torch.arange(16.0) + 100 * prev), "differs")
    b.intra_node_barrier()
    return chk.result()


def check_async_side_stream(ctx):
    """Work.wait() on a side stream orders that stream after the op (c10d semantics)."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("async",), buffer_size=BUFFER, chunk_bytes=0)
    chk = Checker(f"async side stream W={W}")
    side = torch.cuda.Stream(device=dev)
    for n in (7, 40000):
        x = _input(n, rank, n, torch.float32).to(dev)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            # Queue work on the side stream first so a missing wait would be visible.
            torch.cuda._sleep(2_000_000)
            work = dist.all_reduce(x, group=g, async_op=True)
            work.wait()
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
        want = reduce_over_ranks("SUM", [_input(n, r, n, torch.float32) for r in range(W)])
        chk.case(f"n={n}", torch.equal(y.cpu(), want * 2), "differs (wait not stream-ordered?)")
        work2 = dist.all_gather_into_tensor(torch.empty(n * W, device=dev), x, group=g,
                                            async_op=True)
        work2.synchronize()
        chk.case(f"n={n} synchronize", work2.is_completed(), "not completed after synchronize")
    return chk.result()


def check_is_completed(ctx):
    """Work.is_completed() of a workspace collective says False until the GPU ran the op (a long
    kernel queued before it on the caller's stream), True once it has; as NCCL's Work."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("is_completed",), buffer_size=BUFFER)
    chk = Checker(f"is_completed W={W}")
    x = torch.full((1000,), float(rank + 1), device=dev)
    torch.cuda.synchronize()
    torch.cuda._sleep(500_000_000)  # a few hundred ms of GPU time before the op
    work = dist.all_reduce(x, group=g, async_op=True)
    chk.case("False while the GPU is busy", not work.is_completed(),
             "is_completed() was True before the GPU ran the op")
    work.synchronize()
    chk.case("True after synchronize", work.is_completed() and work.is_success(),
             f"is_completed() {work.is_completed()}, is_success() {work.is_success()}")
    chk.case("result", torch.equal(x.cpu(), torch.full((1000,), W * (W + 1) / 2)), "differs")
    return chk.result()


def check_timeout(ctx, absent):
    """A rank that never arrives: every other rank raises, naming it, within the timeout plus a
    margin - from the op or at the latest from the next call on the group (its watchdog fails the
    group's device). Each op on a group of its own and on a stream of its own: on CUDA the op only
    enqueues its waits, which stay blocked until the failure releases them (NOTE [Releasing
    blocked waits] in p2p_workspace/watchdog.hpp); afterwards torch.cuda.synchronize() returns."""
    rank, dev = ctx.rank, _device()
    t = timedelta(seconds=TIMEOUT_S)
    g_barrier = _group(("timeout", "barrier"), buffer_size=BUFFER, timeout=t)
    g_ar = _group(("timeout", "all_reduce"), buffer_size=BUFFER, chunk_bytes=0, timeout=t)
    out = {"rank": rank, "errors": []}
    if rank == absent:
        return out
    for what, g, fn in (
        ("intra_node_barrier", g_barrier,
         lambda b: b.intra_node_barrier(timeout=TIMEOUT_S)),
        ("all_reduce", g_ar, lambda b: dist.all_reduce(torch.ones(1000, device=dev), group=g_ar)),
    ):
        b = cuda_p2p.get_cuda_p2p_backend(g)
        t0 = time.monotonic()
        try:
            with torch.cuda.stream(torch.cuda.Stream(device=dev)):
                fn(b)
                while time.monotonic() < t0 + TIMEOUT_S + MARGIN_S:
                    b.intra_node_barrier(timeout=1.0)
                    time.sleep(0.2)
            out["errors"].append((what, None, time.monotonic() - t0))
        except Exception as e:  # noqa: BLE001  (the test inspects it)
            out["errors"].append((what, f"{type(e).__name__}: {e}"[:600], time.monotonic() - t0))
    # The released waits let every stream drain (a hang here is the failure).
    t0 = time.monotonic()
    torch.cuda.synchronize(dev)
    out["synchronize_s"] = time.monotonic() - t0
    return out


def check_deadlocked_root_mismatch(ctx):
    """Ranks that each take another for the root (rank 1 names rank 0, the others rank 1): the
    broadcast runs after its comparison on CUDA, each rank with its own root, and ranks 0 and 1
    wait for each other's done word. The recorded disagreement fails the device at the watchdog's
    next scan and releases the waits (NOTE [A disagreement fails the device at once] in
    ops/op_signature.cpp): the stream drains and the group's next op raises the disagreement,
    long before the group's timeout (30 s here; before the probe, the error came at the timeout
    and said "never arrived"). On a CPU rehearsal the synchronous host raises at the call."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"deadlocked root mismatch W={W}")
    if W == 1:
        return chk.result()
    limit = 30.0
    g = _group(("deadlocked_root",), buffer_size=BUFFER, cached=False,
               timeout=timedelta(seconds=limit))
    x = torch.ones(8, device=dev)
    dist.all_reduce(x, group=g)
    _sync()
    src = 0 if rank == 1 else 1
    errors = []

    def attempt(fn):
        try:
            fn()
        except RuntimeError as e:
            errors.append(str(e))

    t0 = time.monotonic()
    attempt(lambda: dist.broadcast(torch.ones(8, device=dev), src=src, group=g,
                                   async_op=True).wait())
    attempt(_sync)  # the stream drains once the waits are released
    attempt(lambda: dist.all_reduce(torch.ones(8, device=dev), group=g))
    elapsed = time.monotonic() - t0
    first = errors[0] if errors else None
    chk.case("raises the disagreement", first is not None and "disagree" in first
             and "never arrived" not in first, f"{first} (after {elapsed:.1f} s)")
    chk.case("well before the group's timeout", elapsed < limit / 2, f"{elapsed:.1f} s")
    dist.destroy_process_group(g)
    return chk.result()


def check_routing_default(ctx, backend):
    """Without the opt-in, ordinary collectives on CUDA tensors go to the wrapped backend."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("routing", backend), backend=backend, opt_in=False, buffer_size=BUFFER)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    chk = Checker(f"routing default ({backend}) W={W}")
    x = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(x, group=g)
    chk.case("all_reduce", torch.equal(x.cpu(), torch.full((1000,), W * (W + 1) / 2)), "differs")
    t = torch.full((10,), float(rank), device=dev)
    dist.broadcast(t, src=0, group=g)
    chk.case("broadcast", torch.equal(t.cpu(), torch.zeros(10)), "differs")
    want = ["all_reduce.wrapped", "broadcast.wrapped"]
    if backend == "cuda_p2p":  # NCCL: every collective; one rank only (NCCL refuses a shared GPU)
        out = torch.empty(10 * W, device=dev)
        dist.all_gather_into_tensor(out, t, group=g)
        chk.case("all_gather", torch.equal(out.cpu(), torch.zeros(10 * W)), "differs")
        rs = torch.empty(10, device=dev)
        dist.reduce_scatter_tensor(rs, torch.ones(10 * W, device=dev), group=g)
        chk.case("reduce_scatter", torch.equal(rs.cpu(), torch.full((10,), float(W))), "differs")
        want += ["all_gather.wrapped", "reduce_scatter.wrapped"]
    torch.cuda.synchronize()
    c = b.get_counters()
    for key in want:
        chk.case(key, c.get(key, 0) >= 1, f"counters {c}")
    workspace = {k: v for k, v in c.items() if not k.endswith(".wrapped")}
    chk.case("nothing on the workspace", not workspace, f"counters {c}")
    # The fused ops keep using the workspace.
    A = _small((4, 8), rank, torch.float32, dev)
    B = _small((8, 5), 1, torch.float32, dev)
    cuda_p2p.fused_all_gather_matmul(A, [B], 0, group=g)
    c = b.get_counters()
    chk.case("fused on the workspace", c.get("fused_all_gather_matmul.pipeline", 0) == 1, f"{c}")
    return chk.result()
