"""The CUDA path on a GPU, with ranks sharing the one GPU (scripts/gpu_check.sh runs this file).

Collected everywhere, run only where CUDA is available: on the CPU machines every test reports
itself SKIPPED. Nothing here has run on a GPU yet unless a gpu_check.sh summary says so.

NCCL refuses two ranks on one GPU, so for W >= 2 the groups under test must not need it: they use
the backend name ``cuda_p2p_nonccl`` registered below, a ProcessGroupCudaP2P whose wrapped CUDA
backend is a second Gloo group (Gloo handles CUDA tensors for the few ordinary collectives these
tests send to the wrapped side). The workspace is then on the GPU exactly as under NCCL (the
backend puts it there whenever a CUDA backend is wrapped). References are computed in plain
torch in each rank (small integers: exact in every dtype and summation order) and, for a few
cases, by the Gloo reference group on CPU copies. The routing default (ordinary collectives on
CUDA tensors go to the wrapped backend) is checked with real NCCL on one rank, and through the
Gloo-wrapped group on 2-4 ranks.

The workspace collectives on CUDA tensors are opt-in (Options.cuda_workspace_collectives, or
CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1 when the group is created); the groups under test set both.
"""

from __future__ import annotations

import time
import zlib
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

import conftest
import cuda_p2p
from _checks import Checker, wrapped
from _harness import scoped_environ
from _reference import FLOAT_OPS, reduce_over_ranks
from cuda_p2p import _C, ProcessGroupCudaP2P

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (scripts/gpu_check.sh runs these on a GPU machine)",
)

NONCCL = "cuda_p2p_nonccl"
OPT_IN_ENV = "CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES"
DEVICE_ENV = "CUDA_P2P_WORKSPACE_DEVICE"
BUFFER = 1 << 16  # 64 KiB: "one round" and "several rounds" stay small
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ALL_GATHER_ALGOS = ("direct", "ring")
REDUCE_SCATTER_ALGOS = (("direct", 1), ("ring", 1), ("ring", 2))
ALL_REDUCE_ALGOS = ("one_shot", "two_shot")
TIMEOUT_S = 3.0  # the groups' timeout in the never-arriving-rank test
# The groups whose ops read symmetric inputs in place: ranks that disagree on CUDA run the op
# anyway (NOTE [Zero-copy collectives]) and may wait for a signal that never comes; a short
# timeout turns that into an error in seconds rather than a hang of the GPU run.
ZERO_COPY_TIMEOUT = timedelta(seconds=60)
MARGIN_S = 15.0  # what a rank may take beyond it to raise
SIZES = (0, 1, 7, 5000, 3 * (BUFFER // 2) + 5)  # elements: empty, tiny, odd, one round, rounds


# ---------------------------------------------------------------------------------------------
# the NCCL-free backend (registered in every process that imports this module: the ranks unpickle
# the functions below by module, so they import it too)


def _create_nonccl(opts, pg_options) -> ProcessGroupCudaP2P:
    """cuda_p2p with Gloo for CPU tensors and a second Gloo group for CUDA tensors."""
    from cuda_p2p._backend import _copy_options

    options = _copy_options(pg_options)
    options._timeout = opts.timeout
    options.group_name = str(opts.group_id)
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    options.global_ranks_in_group = list(opts.global_ranks_in_group) or list(range(size))
    gloo = dist.ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, opts.timeout)
    if _ON_CPU:  # no CUDA backend: the workspace is the host's (rehearse_on_cpu)
        return ProcessGroupCudaP2P(store, rank, size, options, gloo)
    gloo_cuda = dist.ProcessGroupGloo(PrefixStore("gloo_cuda/", store), rank, size, opts.timeout)
    return ProcessGroupCudaP2P(store, rank, size, options, gloo, gloo_cuda)


if NONCCL.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(NONCCL, _create_nonccl, extended_api=True,
                                  devices=["cpu", "cuda"])


# ---------------------------------------------------------------------------------------------
# rank side: groups, inputs, references

_groups: dict = {}


# Set in a rank by rehearse_on_cpu: the device-neutral checks then run on the host workspace.
_ON_CPU = False


def rehearse_on_cpu(ctx, check, *args):
    """Runs `check` with CPU tensors on the host workspace (in CI:
    tests/python/gpu/test_gpu_rehearsal.py): a fault of the check itself shows there, before a
    scarce GPU lease is spent on it."""
    global _ON_CPU
    _ON_CPU = True
    try:
        return check(ctx, *args)
    finally:
        _ON_CPU = False


def _device() -> torch.device:
    if _ON_CPU:
        return torch.device("cpu")
    # Every rank on the same GPU when one is visible (CUDA_VISIBLE_DEVICES), else round-robin.
    return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())


def _sync() -> None:
    if _device().type == "cuda":
        torch.cuda.synchronize()


def _group(key, backend=NONCCL, opt_in=True, timeout=None, cached=True, **options):
    """A group over all ranks (cached by key unless not ``cached``; collective on first use)."""
    key = (key, _ON_CPU)
    if cached and key in _groups:
        return _groups[key]
    if not _ON_CPU:
        torch.cuda.set_device(_device())
    o = ProcessGroupCudaP2P.Options()
    if opt_in and hasattr(o, "cuda_workspace_collectives"):
        o.cuda_workspace_collectives = True
    for k, v in options.items():
        setattr(o, k, v)
    # The environment the group is created in: the opt-in as asked, and on a GPU the default
    # workspace device, which puts the workspace there (conftest.py sets
    # CUDA_P2P_WORKSPACE_DEVICE=cpu for the rest of the suite).
    env = {OPT_IN_ENV: "1" if opt_in else None}
    if not _ON_CPU:
        env[DEVICE_ENV] = None
    with scoped_environ(env):
        kw = {"timeout": timeout} if timeout is not None else {}
        group = dist.new_group(backend=backend, pg_options=o, **kw)
    if cached:
        _groups[key] = group
    b = cuda_p2p.get_cuda_p2p_backend(group)
    if not b.is_p2p_available():
        raise AssertionError(f"workspace unavailable on {_device()}: {b.p2p_unavailable_reason()}")
    where = b.get_collective_config()["workspace_device"]
    if where != _device().type:  # a check of the GPU path must not run on a host workspace
        raise AssertionError(f"the group's workspace is on {where}, expected {_device().type}")
    return group


def _input(seed, rank, n, dtype, op=None):
    """Small integers: exact in every dtype and summation order (PRODUCT: -2..2)."""
    i = torch.arange(n, dtype=torch.int64)
    if op == "PRODUCT":
        v = (i * 7 + rank * 3 + seed) % 5 - 2
    else:
        v = (i * 7 + rank * 13 + seed) % 17 - 8
    return v.to(dtype)


def _close(got, want, op):
    got = got.cpu()
    if op == "AVG":  # one rounding in the accumulate type, possibly another order
        return torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    return torch.equal(got, want)


def _counters(g):
    return cuda_p2p.get_cuda_p2p_backend(g).get_counters()


def _expect_counter(chk, g, key, count):
    c = _counters(g)
    chk.case("counters", c.get(key, 0) == count and not wrapped(c),
             f"expected {key}={count} and nothing wrapped, got {c}")


# ---------------------------------------------------------------------------------------------
# rank side: the checks (each returns {"cases", "failures"})


def check_all_gather(ctx, algo):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("ag", algo), buffer_size=BUFFER, chunk_bytes=0, all_gather_algo=algo)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, count = Checker(f"all_gather[{algo}] W={W}"), 0
    for name, dtype in DTYPES.items():
        for n in SIZES:
            x = _input(n + 3, rank, n, dtype)
            want = torch.cat([_input(n + 3, r, n, dtype) for r in range(W)])
            out = torch.full((n * W,), 77, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x.to(dev), group=g)
            chk.case(f"{name} n={n}", torch.equal(out.cpu(), want), "differs from local math")
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(W)]
            dist.all_gather(outs, x.to(dev), group=g)
            chk.case(f"{name} n={n} list", torch.equal(torch.cat(outs).cpu(), want), "differs")
            count += 2
            if n == 7 and dtype == torch.float32:  # the Gloo reference on CPU copies
                ref = torch.empty(n * W, dtype=dtype)
                dist.all_gather_into_tensor(ref, x, group=ctx.gloo)
                chk.case("gloo", torch.equal(out.cpu(), ref), "differs from gloo")
    _sync()
    _expect_counter(chk, g, f"all_gather.{algo}", count)
    return chk.result()


def check_reduce_scatter(ctx, algo, steps):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("rs", algo, steps), buffer_size=BUFFER, chunk_bytes=0, reduce_scatter_algo=algo,
               ring_steps=steps * W)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, count = Checker(f"reduce_scatter[{algo}, {steps}/rank] W={W}"), 0
    for name, dtype in DTYPES.items():
        for op in FLOAT_OPS:
            for n in SIZES:
                seed = n + 11
                x = _input(seed, rank, n * W, dtype, op)
                full = reduce_over_ranks(op, [_input(seed, r, n * W, dtype, op) for r in range(W)])
                out = torch.full((n,), 77, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, x.to(dev), op=getattr(dist.ReduceOp, op), group=g)
                chk.case(f"{name} {op} n={n}", _close(out, full[rank * n : (rank + 1) * n], op),
                         "differs from local math")
                count += 1
    _sync()
    _expect_counter(chk, g, f"reduce_scatter.{algo}", count)
    return chk.result()


def check_all_reduce(ctx, algo):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("ar", algo), buffer_size=BUFFER, chunk_bytes=0, all_reduce_algo=algo)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, count = Checker(f"all_reduce[{algo}] W={W}"), 0
    for name, dtype in DTYPES.items():
        for op in FLOAT_OPS:
            for n in SIZES:
                seed = n + 5
                x = _input(seed, rank, n, dtype, op).to(dev)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=g)
                want = reduce_over_ranks(op, [_input(seed, r, n, dtype, op) for r in range(W)])
                chk.case(f"{name} {op} n={n}", _close(x, want, op), "differs from local math")
                count += 1
                if op == "SUM" and n == 7:
                    ref = _input(seed, rank, n, torch.float32)
                    dist.all_reduce(ref, group=ctx.gloo)
                    chk.case("gloo", torch.equal(x.cpu().float(), ref), "differs from gloo")
    _sync()
    _expect_counter(chk, g, f"all_reduce.{algo}", count)
    return chk.result()


def check_broadcast(ctx):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("bc",), buffer_size=BUFFER, chunk_bytes=0)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, count = Checker(f"broadcast W={W}"), 0
    for name, dtype in DTYPES.items():
        for n in SIZES:
            for root in range(W):
                t = _input(root + n, rank, n, dtype).to(dev)
                dist.broadcast(t, src=root, group=g)
                chk.case(f"{name} n={n} root={root}",
                         torch.equal(t.cpu(), _input(root + n, root, n, dtype)), "differs")
                count += 1
    _sync()
    _expect_counter(chk, g, "broadcast.direct", count)
    return chk.result()


def check_all_gather_v(ctx):
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("agv",), buffer_size=BUFFER, chunk_bytes=0)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, count = Checker(f"all_gather_v W={W}"), 0
    for name, dtype in DTYPES.items():
        for rows in ([0] * W, [1] * W, [r * 3 + 1 for r in range(W)], [5000 - r for r in range(W)],
                     [0] + [BUFFER // 8] * (W - 1)):
            cols = 3
            mine = _input(sum(rows), rank, rows[rank] * cols, dtype).view(rows[rank], cols)
            got = cuda_p2p.all_gather_v(mine.to(dev), rows, group=g)
            want = torch.cat([_input(sum(rows), r, rows[r] * cols, dtype).view(rows[r], cols)
                              for r in range(W)])
            chk.case(f"{name} rows={rows}", torch.equal(got.cpu(), want), "differs")
            count += 1
    _sync()
    _expect_counter(chk, g, "all_gather_v.direct", count)
    return chk.result()


def _a2a_splits(W, layout):
    """splits[s][d]: rows rank s sends to rank d. "uneven" has zero-row splits; "rounds" moves more
    than the 64 KiB buffer at the rows of 300 elements used with it."""
    if layout == "even":
        return [[2] * W for _ in range(W)]
    if layout == "uneven":
        return [[(s * 3 + d * 5 + 1) % 4 for d in range(W)] for s in range(W)]
    return [[40 + (s + 2 * d) % 3 for d in range(W)] for s in range(W)]


def _a2a_block(src, dst, rows, row, dtype):
    return _input(src * 13 + dst * 5 + rows, src, rows * row, dtype).view(rows, row)


def check_all_to_all(ctx):
    """all_to_all_single (even, uneven with zero rows, several rounds), the list all_to_all and
    cuda_p2p.all_to_all_v on the GPU workspace, against local math and (float32) Gloo."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("a2a",), buffer_size=BUFFER, chunk_bytes=0)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk = Checker(f"all_to_all W={W}")
    calls = {"all_to_all_single.direct": 0, "all_to_all.direct": 0, "all_to_all_v.direct": 0}
    for name, dtype in DTYPES.items():
        for layout, row in (("even", 3), ("uneven", 5), ("rounds", 300)):
            sp = _a2a_splits(W, layout)
            recv = [sp[s][rank] for s in range(W)]
            blocks = [_a2a_block(rank, d, sp[rank][d], row, dtype) for d in range(W)]
            want = torch.cat([_a2a_block(s, rank, sp[s][rank], row, dtype) for s in range(W)])
            what = f"{name} {layout}"
            out = torch.full((sum(recv), row), 77, dtype=dtype, device=dev)
            if layout == "even":
                dist.all_to_all_single(out, torch.cat(blocks).to(dev), group=g)
            else:
                dist.all_to_all_single(out, torch.cat(blocks).to(dev), recv, sp[rank], group=g)
            calls["all_to_all_single.direct"] += 1
            chk.case(f"single {what}", torch.equal(out.cpu(), want), "differs from local math")
            outs = [torch.full((n, row), 77, dtype=dtype, device=dev) for n in recv]
            dist.all_to_all(outs, [b.to(dev) for b in blocks], group=g)
            calls["all_to_all.direct"] += 1
            chk.case(f"list {what}", torch.equal(torch.cat([o.cpu() for o in outs]), want),
                     "differs from local math")
            got, counts = cuda_p2p.all_to_all_v(torch.cat(blocks).to(dev), sp[rank], group=g)
            calls["all_to_all_v.direct"] += 1
            chk.case(f"v {what}", list(counts) == recv and got.device == dev
                     and torch.equal(got.cpu(), want), f"counts {list(counts)}, want {recv}")
            if layout == "uneven" and dtype == torch.float32:  # the Gloo reference on CPU copies
                ref = torch.empty(sum(recv), row)
                dist.all_to_all_single(ref, torch.cat(blocks), recv, sp[rank], group=ctx.gloo)
                chk.case("gloo", torch.equal(out.cpu(), ref), "differs from gloo")
    _sync()
    c = _counters(g)
    chk.case("counters", all(c.get(k, 0) == n for k, n in calls.items()) and not wrapped(c),
             f"expected {calls} and nothing wrapped, got {c}")
    return chk.result()


def check_gather_scatter(ctx):
    """gather and scatter on the GPU workspace, every root, against local math."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("gs",), buffer_size=BUFFER, chunk_bytes=0)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk = Checker(f"gather/scatter W={W}")
    calls = 0
    for name, dtype in DTYPES.items():
        for n in (0, 7, 3 * (BUFFER // 8) + 5):  # empty, odd, several rounds at W >= 2
            for root in range(W):
                seed = root * 3 + n
                mine = _input(seed, rank, n, dtype).to(dev)
                outs = [torch.full((n,), 77, dtype=dtype, device=dev) for _ in range(W)] \
                    if rank == root else None
                dist.gather(mine, outs, dst=root, group=g)
                if rank == root:
                    chk.case(f"gather {name} n={n} root={root}",
                             all(torch.equal(o.cpu(), _input(seed, q, n, dtype))
                                 for q, o in enumerate(outs)), "differs from local math")
                ins = [_input(seed + 1, q + 7 * root, n, dtype).to(dev) for q in range(W)] \
                    if rank == root else None
                got = torch.full((n,), 77, dtype=dtype, device=dev)
                dist.scatter(got, ins, src=root, group=g)
                chk.case(f"scatter {name} n={n} root={root}",
                         torch.equal(got.cpu(), _input(seed + 1, rank + 7 * root, n, dtype)),
                         "differs from local math")
                calls += 1
    _sync()
    c = _counters(g)
    chk.case("counters", c.get("gather.direct") == calls and c.get("scatter.direct") == calls
             and not wrapped(c), f"expected {calls} each, got {c}")
    return chk.result()


def check_reduce(ctx):
    """reduce on the GPU workspace, every root and op, against local math: only the root's tensor
    changes, the others' are left as they were; a non-contiguous tensor and an async Work."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    g = _group(("reduce",), buffer_size=BUFFER, chunk_bytes=0)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk, calls = Checker(f"reduce W={W}"), 0
    for name, dtype in DTYPES.items():
        for op in FLOAT_OPS:
            for n in (0, 7, 3 * (BUFFER // 8) + 5):  # empty, odd, several rounds
                for root in range(W):
                    seed = root * 5 + n
                    mine = _input(seed, rank, n, dtype, op)
                    x = mine.to(dev, copy=True)  # a copy on the CPU too (rehearse_on_cpu)
                    dist.reduce(x, dst=root, op=getattr(dist.ReduceOp, op), group=g)
                    calls += 1
                    if rank == root:
                        want = reduce_over_ranks(
                            op, [_input(seed, r, n, dtype, op) for r in range(W)])
                        chk.case(f"{name} {op} n={n} root={root}", _close(x, want, op),
                                 "differs from local math")
                    else:
                        chk.case(f"{name} {op} n={n} root={root}: left as it was",
                                 torch.equal(x.cpu(), mine), "changed on a rank that is not root")
                    if op == "SUM" and n == 7 and name == "float32":
                        ref = mine.clone()
                        dist.reduce(ref, dst=root, group=ctx.gloo)
                        if rank == root:
                            chk.case(f"gloo root={root}", torch.equal(x.cpu(), ref),
                                     "differs from gloo")
    root = W - 1
    mine = _input(3, rank, 12, torch.float32).view(3, 4)
    x = mine.to(dev, copy=True).t()  # not contiguous
    work = dist.reduce(x, dst=root, group=g, async_op=True)
    work.wait()
    calls += 1
    want = reduce_over_ranks(
        "SUM", [_input(3, r, 12, torch.float32).view(3, 4) for r in range(W)]) \
        if rank == root else mine
    chk.case("non-contiguous async", torch.equal(x.cpu(), want.t()), "differs")
    _sync()
    _expect_counter(chk, g, "reduce.direct", calls)
    return chk.result()


def _small(shape, seed, dtype, dev):
    """Values in {-1, 0, 1}: matmuls of K <= 64 and sums over 4 ranks stay exact in bf16/fp16."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, shape, generator=g).to(dtype).to(dev)


def _seed(*case) -> int:
    """A seed every rank derives alike from a test case. Not hash(): a str's hash differs from
    process to process (PYTHONHASHSEED), and then each rank draws different inputs (the second
    GPU run's fused_matmul_reduce_scatter failures at W >= 2 were exactly that)."""
    return zlib.crc32(repr(case).encode()) % 1000


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


# ---------------------------------------------------------------------------------------------
# rank side: the symmetric heap on the GPU (docs/collectives.md, "Zero-copy symmetric tensors";
# NOTE [Heap under a MemPool] in backend/symmetric_allocator.cpp)

HEAP = 64 << 20  # per rank: room for a few 20 MiB pool segments (4 ranks on one GPU: 256 MiB)


def _all_ranks(ctx, value):
    """Every rank's ``value``, in rank order (over the Gloo reference group)."""
    out = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=ctx.gloo)
    return out


def _settle(ctx):
    """Every rank's GPU work done and every rank here: peers may read, or writers go on."""
    torch.cuda.synchronize()
    dist.barrier(group=ctx.gloo)


def check_symmetric_tensors(ctx):
    """cuda_p2p.empty and use_symmetric_memory on the GPU: tensors in the heap at equal offsets,
    read by peers through their mappings, collectives on them (zero-copy, right results), and two
    groups with a heap and a pool each."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    # direct algorithms: were the pool's offsets to differ, the disagreeing ranks would run the
    # same signals (a ring would wait for its neighbour until the timeout)
    # Zero-copy on a GPU workspace is an opt-in (NOTE [CUDA zero-copy is opt-in]): the first run
    # after it became one (2026-11-27) found this check counting staged collectives.
    g = _group(("heap",), buffer_size=BUFFER, symmetric_heap_size=HEAP,
               timeout=ZERO_COPY_TIMEOUT, all_gather_algo="direct", reduce_scatter_algo="direct",
               zero_copy_agreement="signature")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk = Checker(f"symmetric tensors W={W}")
    chk.case("heap device", b.symmetric_device() == dev, f"{b.symmetric_device()}")
    # cuda_p2p.empty: "cuda" (the current device, the group's) and None (the heap's device).
    t = cuda_p2p.empty(1000, dtype=torch.float32, device="cuda", group=g)
    u = cuda_p2p.empty((3, 5), dtype=torch.int32, group=g)
    chk.case("empty device", t.device == dev and u.device == dev, f"{t.device} {u.device}")
    offs = [b.symmetric_offset(t), b.symmetric_offset(u)]
    every = _all_ranks(ctx, offs)
    chk.case("empty offsets", 0 <= offs[0] < offs[1] and all(o == offs for o in every), f"{every}")
    info = b.symmetric_heap_info()
    chk.case("heap info", info["created"] == 1 and info["capacity"] == HEAP, f"{info}")
    for bad in ("cpu", torch.device("cuda", dev.index + 1)):
        try:
            cuda_p2p.empty(4, device=bad, group=g)
            chk.case(f"device {bad} raises", False)
        except ValueError as e:
            chk.case(f"device {bad} message", f"expected device {dev}" in str(e), str(e))
    t.copy_(_input(1, rank, 1000, torch.float32).to(dev))
    _settle(ctx)
    for q in range(W):  # through this rank's IPC mapping of q's heap
        peer = b.symmetric_peer_tensor(t, q)
        chk.case(f"peer {q} reads", peer.device == dev and
                 torch.equal(peer.cpu(), _input(1, q, 1000, torch.float32)), "differs")
    _settle(ctx)

    # use_symmetric_memory: torch's own CUDA allocations come from the heap (the group's MemPool).
    pool = cuda_p2p.get_mem_pool(g)
    chk.case("pool cached", cuda_p2p.get_mem_pool(g) is pool)
    with cuda_p2p.use_symmetric_memory(g) as entered:
        x = torch.empty(4096, device=dev)  # 16 KiB: a 2 MiB segment
        y = torch.zeros(300000, device=dev)  # 1.2 MB: a 20 MiB segment
        x.copy_(_input(2, rank, 4096, torch.float32).to(dev))
        z = x * 2 + 1  # the output of an operation
    after = torch.empty(16, device=dev)
    chk.case("yields the pool", entered is pool)
    for name, v in (("empty", x), ("zeros", y), ("op output", z)):
        chk.case(f"{name} in the heap", v.device == dev and cuda_p2p.is_symmetric(v, g),
                 f"offset {b.symmetric_offset(v)}")
    chk.case("zeros", torch.count_nonzero(y).item() == 0, "not zero")
    chk.case("after the block", not cuda_p2p.is_symmetric(after, g), "in the heap")
    offs = [b.symmetric_offset(v) for v in (x, y, z)]
    every = _all_ranks(ctx, offs)
    chk.case("pool offsets equal", all(o == offs for o in every), f"{every}")
    _settle(ctx)
    for q in range(W):
        want = _input(2, q, 4096, torch.float32) * 2 + 1
        got = b.symmetric_peer_tensor(z, q).cpu()
        chk.case(f"pool peer {q}", torch.equal(got, want), "differs")
    _settle(ctx)
    info = b.symmetric_heap_info()
    chk.case("segments", info["segments"] >= 2 and info["segment_bytes"] >= 22 << 20, f"{info}")
    del x, y, z
    torch.cuda.synchronize()
    chk.case("the pool keeps dead tensors' segments",
             b.symmetric_heap_info()["segments"] == info["segments"], f"{b.symmetric_heap_info()}")

    # Collectives on heap tensors from the pool: right results, and zero-copy (signature
    # agreement: the ranks made the same allocations, so the pool's blocks sit at equal offsets;
    # were they not, every rank would raise a signature mismatch naming the offsets).
    b.reset_counters()
    n = 5000
    with cuda_p2p.use_symmetric_memory(g):
        ar = _input(3, rank, n, torch.float32).to(dev)
        ag_out = torch.empty(n * W, device=dev)
        rs_in = _input(4, rank, n * W, torch.float32).to(dev)
        rs_out = torch.empty(n, device=dev)
        bc = _input(5, rank, n, torch.float32).to(dev)
    chk.case("collective tensors in the heap", all(
        cuda_p2p.is_symmetric(v, g) for v in (ar, ag_out, rs_in, rs_out, bc)), "not all")
    dist.all_reduce(ar, group=g)
    dist.all_gather_into_tensor(ag_out, bc, group=g)
    dist.reduce_scatter_tensor(rs_out, rs_in, group=g)
    dist.broadcast(bc, src=0, group=g)
    torch.cuda.synchronize()
    chk.case("all_reduce", torch.equal(
        ar.cpu(), reduce_over_ranks("SUM", [_input(3, r, n, torch.float32) for r in range(W)])), "")
    chk.case("all_gather", torch.equal(
        ag_out.cpu(), torch.cat([_input(5, r, n, torch.float32) for r in range(W)])), "")
    full = reduce_over_ranks("SUM", [_input(4, r, n * W, torch.float32) for r in range(W)])
    chk.case("reduce_scatter", torch.equal(rs_out.cpu(), full[rank * n:(rank + 1) * n]), "")
    chk.case("broadcast", torch.equal(bc.cpu(), _input(5, 0, n, torch.float32)), "")
    c = _counters(g)
    zc = 1 if W > 1 else 0
    chk.case("on the workspace, zero-copy", c and not any(k.endswith(".wrapped") for k in c) and
             all(c.get(f"{k}.zero_copy", 0) == zc for k in ("all_gather", "reduce_scatter",
                                                            "broadcast")), f"{c}")

    # A second group: its own heap and pool, its tensors in neither of the other's.
    g2 = _group(("heap2",), buffer_size=BUFFER, symmetric_heap_size=HEAP)
    pool2 = cuda_p2p.get_mem_pool(g2)
    chk.case("a pool per group", pool2 is not pool and pool2.id != pool.id, f"{pool2.id}")
    with cuda_p2p.use_symmetric_memory(g2):
        w = torch.ones(100, device=dev)
    chk.case("own heaps", cuda_p2p.is_symmetric(w, g2) and not cuda_p2p.is_symmetric(w, g)
             and cuda_p2p.is_symmetric(t, g) and not cuda_p2p.is_symmetric(t, g2), "mixed")
    _settle(ctx)
    return chk.result()


def check_zero_copy_collectives(ctx):
    """Collectives on cuda_p2p.empty tensors read them where they lie, in their owners' heaps
    (NOTE [Zero-copy collectives] in ops/zero_copy.cpp) with signature agreement, an opt-in on
    CUDA (NOTE [CUDA zero-copy is opt-in] in ops/common.hpp); rehearsed on the CPU with it set
    too (the host's default is the exchange)."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    extra = {"zero_copy_agreement": "signature"}
    g = _group(("zc",), buffer_size=BUFFER, symmetric_heap_size=HEAP, all_reduce_algo="two_shot",
               timeout=ZERO_COPY_TIMEOUT, **extra)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk = Checker(f"zero-copy W={W}")
    mode = b.get_collective_config()["zero_copy_agreement"]
    chk.case("agreement", mode == "signature", mode)
    b.reset_counters()
    want = {"all_gather.zero_copy": 0, "reduce_scatter.zero_copy": 0, "all_reduce.zero_copy": 0,
            "broadcast.zero_copy": 0, "all_to_all_single.zero_copy": 0}
    zc = 1 if W > 1 else 0

    def heap(n, dtype, values=None):
        t = cuda_p2p.empty(n, dtype=dtype, group=g)
        return t.copy_(values.to(dev)) if values is not None else t.zero_()

    for name, dtype in DTYPES.items():
        for n in SIZES[1:]:
            tag = f"{name} n={n}"
            ref = torch.cat([_input(n, r, n, dtype) for r in range(W)])
            x = heap(n, dtype, _input(n, rank, n, dtype))
            out = torch.empty(n * W, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x, group=g)
            # The caller may overwrite its input as soon as the call returns: on CUDA that is in
            # stream order after the peers' reads (step 5 of the NOTE), so they gathered x.
            x.fill_(0)
            chk.case(f"all_gather {tag}", torch.equal(out.cpu(), ref), "differs")
            whole = heap(n * W, dtype)
            whole[rank * n:(rank + 1) * n].copy_(_input(n, rank, n, dtype).to(dev))
            dist.all_gather_into_tensor(whole, whole[rank * n:(rank + 1) * n], group=g)
            chk.case(f"in-place all_gather {tag}", torch.equal(whole.cpu(), ref), "differs")
            want["all_gather.zero_copy"] += 2 * zc
            rin = heap(n * W, dtype, _input(n + 1, rank, n * W, dtype))
            rout = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(rout, rin, group=g)
            full = reduce_over_ranks("SUM", [_input(n + 1, r, n * W, dtype) for r in range(W)])
            chk.case(f"reduce_scatter {tag}", _close(rout, full[rank * n:(rank + 1) * n], "SUM"),
                     "differs")
            want["reduce_scatter.zero_copy"] += zc
            t = heap(n, dtype, _input(n + 2, rank, n, dtype))
            dist.all_reduce(t, group=g)
            chk.case(f"all_reduce {tag}", _close(t, reduce_over_ranks(
                "SUM", [_input(n + 2, r, n, dtype) for r in range(W)]), "SUM"), "differs")
            # (a host workspace with 2 ranks stages it: measured slower, NOTE [Zero-copy
            # collectives])
            want["all_reduce.zero_copy"] += zc * (not _ON_CPU or W > 2)
            for root in range(W):
                bc = heap(n, dtype, _input(n + 3, rank, n, dtype))
                dist.broadcast(bc, src=root, group=g)
                chk.case(f"broadcast {tag} root={root}",
                         torch.equal(bc.cpu(), _input(n + 3, root, n, dtype)), "differs")
                # one staged round at most (half the buffer) goes zero-copy
                want["broadcast.zero_copy"] += zc * (n * bc.element_size() <= BUFFER // 2)
            # The all-to-all reads each sender's slices in its heap (NOTE [All-to-all zero-copy]);
            # the input is overwritten right after the call, as above.
            a2a = heap(n * W, dtype, torch.cat([_input(n + 4, rank * W + d, n, dtype)
                                                for d in range(W)]))
            a2a_out = torch.empty(n * W, dtype=dtype, device=dev)
            dist.all_to_all_single(a2a_out, a2a, group=g)
            a2a.fill_(0)
            chk.case(f"all_to_all_single {tag}", torch.equal(a2a_out.cpu(), torch.cat(
                [_input(n + 4, s * W + rank, n, dtype) for s in range(W)])), "differs")
            want["all_to_all_single.zero_copy"] += zc
    _sync()
    c = _counters(g)
    chk.case("counters", all(c.get(k, 0) == v for k, v in want.items()) and
             not any(k.endswith(".wrapped") for k in c), f"expected {want}, got {c}")
    # fused_all_gather_matmul with A_shard in the heap: the pulls read the peers' shards there
    # (NOTE [Zero-copy all-gather→matmul]); a middle gather dim prepares a copy, staged.
    b.reset_counters()
    fused_zc = 0
    for name, dtype in DTYPES.items():
        for shard, gd, zc_case in (((8, 16), 0, True), ((4, 2, 8), -1, True),
                                   ((2, 5, 16), 1, False)):
            for algorithm in ("pipeline", "pull_ahead"):
                seed = _seed(shard, gd, algorithm)
                shards = [_small(shard, seed + r, dtype, "cpu") for r in range(W)]
                A = torch.cat(shards, dim=gd)
                B = _small((A.shape[-1], 7), seed + 100, dtype, "cpu")
                a = cuda_p2p.empty(*shard, dtype=dtype, group=g).copy_(shards[rank].to(dev))
                got_A, [out] = cuda_p2p.fused_all_gather_matmul(a, [B.to(dev)], gd, group=g,
                                                                return_A=True, algorithm=algorithm)
                a.fill_(0)  # in stream order after the peers' pulls (the closing barrier)
                what = f"fused {name} shard={shard} dim={gd} {algorithm}"
                chk.case(what, torch.equal(got_A.cpu(), A), "A differs")
                chk.case(f"{what} out", torch.equal(out.cpu(), (A.double() @ B.double()).to(dtype)),
                         "out differs")
                fused_zc += zc * zc_case
    _sync()
    got = _counters(g).get("fused_all_gather_matmul.zero_copy", 0)
    chk.case("fused counter", got == fused_zc, f"expected {fused_zc}, got {_counters(g)}")
    # Ordinary tensors on the same group: staged, no claim, nothing raised.
    b.reset_counters()
    x = _input(9, rank, 1000, torch.float32).to(dev)
    out = torch.empty(1000 * W, device=dev)
    dist.all_gather_into_tensor(out, x, group=g)
    _sync()
    chk.case("ordinary input", torch.equal(out.cpu(), torch.cat(
        [_input(9, r, 1000, torch.float32) for r in range(W)])), "differs")
    chk.case("ordinary input staged", _counters(g).get("all_gather.zero_copy", 0) == 0,
             f"{_counters(g)}")
    _sync()
    dist.barrier(group=ctx.gloo)  # every rank's reads done before its heap tensors die
    return chk.result()


def check_zero_copy_mismatch(ctx):
    """Ranks that claim differently (one rank's input outside its heap) disagree in the op's
    signature (NOTE [Zero-copy collectives], step 3'): on the host the op raises on every rank; on
    CUDA the comparison kernel records it and the group's next op raises it on every rank, naming
    both claims - the first exercise of a recorded disagreement on a GPU. Either way the group
    then works again."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    extra = {"zero_copy_agreement": "signature"}  # opt-in on CUDA too
    # The direct all-gather of one round runs one barrier and ends one phase, as the zero-copy
    # path does, so on CUDA the disagreeing ranks wait for nothing the other never sends (a ring,
    # auto's choice on 3+ ranks at this size, would wait for its neighbour's signal until the
    # timeout).
    g = _group(("zc_mismatch",), buffer_size=BUFFER, symmetric_heap_size=HEAP,
               all_gather_algo="direct", timeout=ZERO_COPY_TIMEOUT, **extra)
    chk = Checker(f"zero-copy mismatch W={W}")
    n = 1000  # 4000 bytes: one round (half the buffer)
    in_heap = cuda_p2p.empty(n, dtype=torch.float32, group=g)  # every rank: creates the heap
    x = (torch.empty(n, device=dev) if rank == 0 else in_heap).copy_(
        _input(1, rank, n, torch.float32))
    out = torch.empty(n * W, device=dev)
    raised = None
    try:
        dist.all_gather_into_tensor(out, x, group=g)
        _sync()
        dist.all_gather_into_tensor(out, x.clone(), group=g)  # ordinary: staged by every rank
    except RuntimeError as e:
        raised = str(e)
    if W == 1:
        chk.case("one rank: nothing to disagree on", raised is None, f"{raised}")
    else:
        chk.case("raised", raised is not None and "disagree" in raised and
                 "zero-copy: input at heap offset" in raised, f"{raised}")
    _sync()
    dist.all_gather_into_tensor(out, x.clone(), group=g)
    _sync()
    chk.case("usable after", torch.equal(out.cpu(), torch.cat(
        [_input(1, r, n, torch.float32) for r in range(W)])), "differs")
    dist.barrier(group=ctx.gloo)
    return chk.result()


def check_symmetric_heap_limits(ctx):
    """A full heap is an OutOfMemoryError naming the knobs (cuda_p2p.empty: RuntimeError), a heap
    larger than the GPU fails on every rank at once, and destroying the group frees its heap."""
    import gc

    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"heap limits W={W}")
    g = _group(("heap_small",), buffer_size=BUFFER, symmetric_heap_size=32 << 20)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    try:
        cuda_p2p.empty(40 << 20, dtype=torch.uint8, device=dev, group=g)
        chk.case("empty beyond the heap raises", False)
    except RuntimeError as e:
        chk.case("empty full message", "symmetric heap is full" in str(e), str(e))
    with cuda_p2p.use_symmetric_memory(g):
        a = torch.empty(4 << 20, dtype=torch.uint8, device=dev)  # a 20 MiB segment
        try:
            # 18 MiB: more than the 16 MiB left in a's segment, so a new 18 MiB segment, and
            # 12 MiB of the heap are free.
            torch.empty(18 << 20, dtype=torch.uint8, device=dev)
            chk.case("pool beyond the heap raises", False)
        except torch.OutOfMemoryError as e:
            msg = str(e)
            chk.case("pool full message", "symmetric heap is full" in msg and
                     "CUDA_P2P_SYMMETRIC_HEAP_SIZE" in msg and "symmetric_heap_size" in msg, msg)
        d = torch.ones(1 << 20, dtype=torch.uint8, device=dev)
    chk.case("the pool works on", cuda_p2p.is_symmetric(a, g) and cuda_p2p.is_symmetric(d, g)
             and d.sum().item() == 1 << 20, f"{b.symmetric_heap_info()}")
    del a, d

    # 64 TiB per rank: no GPU has it; every rank raises, nobody waits for a timeout.
    huge = _group(("heap_huge",), buffer_size=BUFFER, symmetric_heap_size=1 << 46)
    t0 = time.monotonic()
    try:
        cuda_p2p.empty(8, device=dev, group=huge)
        chk.case("huge heap raises", False)
    except torch.OutOfMemoryError as e:
        msg = str(e)
        chk.case("huge heap message", "could not create the group's symmetric heap" in msg and
                 "committed device memory" in msg and "CUDA_P2P_SYMMETRIC_HEAP_SIZE" in msg, msg)
    chk.case("huge heap fast", time.monotonic() - t0 < 60, f"{time.monotonic() - t0:.1f} s")
    x = torch.ones(10, device=dev)
    dist.all_reduce(x, group=huge)
    chk.case("usable after", torch.equal(x.cpu(), torch.full((10,), float(W))), f"{x}")

    # Destroying a group frees its heap: its cuda_p2p.empty block and its pool's segments.
    size = 256 << 20
    n_dev = torch.cuda.device_count()
    sharing = sum(1 for r in range(W) if r % n_dev == rank % n_dev)  # ranks on this GPU
    _settle(ctx)
    free0 = torch.cuda.mem_get_info(dev)[0]
    g3 = _group(("heap_freed",), cached=False, buffer_size=BUFFER, symmetric_heap_size=size)
    t = cuda_p2p.empty(1 << 20, dtype=torch.uint8, device=dev, group=g3)
    with cuda_p2p.use_symmetric_memory(g3):
        y = torch.ones(1 << 20, device=dev)
    _settle(ctx)
    free1 = torch.cuda.mem_get_info(dev)[0]
    chk.case("committed", free0 - free1 >= sharing * size, f"{free0 - free1} bytes")
    del t, y
    dist.destroy_process_group(g3)
    del g3
    gc.collect()
    _settle(ctx)
    free2 = torch.cuda.mem_get_info(dev)[0]
    chk.case("freed with the group", free2 - free1 >= sharing * size * 9 // 10,
             f"{free2 - free1} bytes back of {sharing * size}")
    return chk.result()


def check_windows(ctx):
    """One-sided windows (docs/windows.md) on the group's workspace device: a ring of puts into
    a registered copy, an all-to-all into a heap tensor registered in place, many puts then one
    signal, Work.wait() ordering the caller's stream, map_remote_tensor reads of every peer, a
    put that does not fit (nothing written), deregistration. Skipped where torch has no windows."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"windows W={W} on {dev.type}")
    if not _C._build_info().get("windows", False):
        chk.case("skipped: no windows in this torch", True)
        return chk.result()
    g = _group(("windows",), buffer_size=BUFFER, symmetric_heap_size=HEAP)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    right, left = (rank + 1) % W, (rank - 1) % W
    chk.case("supports_window", g.supports_window, "")

    def msg(src, dst, n, seed=0):
        return (torch.arange(n, dtype=torch.float32) + src * 1000 + dst * 100 + seed * 10000)

    n = 300
    win = dist._new_window(torch.zeros(W * n, device=dev), group=g)  # a copy in the heap
    src = msg(rank, right, n).to(dev)
    work = win.put(src, right, n, True)
    work.wait()  # the caller's stream is ordered after the put
    win.signal(right, True)
    win.wait_signal(left, True).wait()
    got = win.map_remote_tensor(rank)
    chk.case("remote tensor device", got.device == dev, f"{got.device}")
    want = torch.zeros(W * n)
    want[n:2 * n] = msg(left, rank, n)
    chk.case("ring", torch.equal(got.cpu(), want), "differs")
    _sync()
    dist.barrier(group=ctx.gloo)
    # Many puts then one signal: the peer's one wait sees every one of them.
    srcs = [msg(rank, right, 10, seed=i).to(dev) for i in range(8)]
    for i, s in enumerate(srcs):
        win.put(s, right, i * 10, False)
    win.signal(right, False)
    win.wait_signal(left, False)
    want = torch.cat([msg(left, rank, 10, seed=i) for i in range(8)])
    chk.case("many puts, one signal", torch.equal(got[:80].cpu(), want), "differs")
    err = None
    try:
        win.put(torch.ones(W * n + 1, device=dev), right, 0, False)
    except (RuntimeError, ValueError) as e:
        err = str(e)
    chk.case("too large", err is not None and "nothing was written" in err, f"{err!r}")
    _sync()
    dist.barrier(group=ctx.gloo)
    win.tensor_deregister()
    # In place: a heap tensor; every rank puts its slot into every rank.
    t = cuda_p2p.empty(W, 16, device=dev, group=g)
    t.zero_()
    win.tensor_register(t)
    for q in range(W):
        win.put(msg(rank, q, 16, seed=3).to(dev), q, rank * 16, False)
        win.signal(q, False)
    for q in range(W):
        win.wait_signal(q, False)
    _sync()
    want = torch.stack([msg(q, rank, 16, seed=3) for q in range(W)])
    chk.case("all-to-all zero-copy", torch.equal(t.cpu(), want), "differs")
    dist.barrier(group=ctx.gloo)
    for q in range(W):
        want_q = torch.stack([msg(p, q, 16, seed=3) for p in range(W)])
        chk.case(f"map_remote_tensor({q})", torch.equal(win.map_remote_tensor(q).cpu(), want_q),
                 "differs")
    _sync()
    dist.barrier(group=ctx.gloo)
    win.tensor_deregister()
    c = _counters(g)
    chk.case("counters", c.get("window.put", 0) == 1 + 8 + W and
             c.get("window.register_in_place") == 1, f"{c}")
    return chk.result()


# ---------------------------------------------------------------------------------------------
# parent side

W_ALL = [1, 2, 3, 4]


@pytest.fixture(params=W_ALL, ids=[f"w{w}" for w in W_ALL])
def gpu_world(request):
    w = conftest._world(request.param)
    w.start()
    return w


def _ok(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert all(r["cases"] > 0 for r in results), results


@pytest.mark.parametrize("algo", ALL_GATHER_ALGOS)
def test_all_gather(gpu_world, algo):
    _ok(gpu_world.run(check_all_gather, algo))


@pytest.mark.parametrize("algo,steps", REDUCE_SCATTER_ALGOS)
def test_reduce_scatter(gpu_world, algo, steps):
    _ok(gpu_world.run(check_reduce_scatter, algo, steps))


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_all_reduce(gpu_world, algo):
    _ok(gpu_world.run(check_all_reduce, algo))


def test_broadcast(gpu_world):
    _ok(gpu_world.run(check_broadcast))


def test_all_gather_v(gpu_world):
    _ok(gpu_world.run(check_all_gather_v))


def test_all_to_all(gpu_world):
    _ok(gpu_world.run(check_all_to_all))


def test_gather_scatter(gpu_world):
    _ok(gpu_world.run(check_gather_scatter))


def test_reduce(gpu_world):
    _ok(gpu_world.run(check_reduce))


@pytest.mark.parametrize("algorithm", ["pipeline", "pull_ahead"])
def test_fused_all_gather_matmul(gpu_world, algorithm):
    _ok(gpu_world.run(check_fused_all_gather_matmul, algorithm))


@pytest.mark.parametrize("algorithm", ["pipeline", "ring"])
def test_fused_matmul_reduce_scatter(gpu_world, algorithm):
    _ok(gpu_world.run(check_fused_matmul_reduce_scatter, algorithm))


@pytest.mark.parametrize("W", [2, 4])  # one rank needs no peer's data, so nothing to grow
def test_growth_and_rounds(W):
    _ok(conftest._world(W).run(check_growth_and_rounds))


def test_symmetric_tensors(gpu_world):
    _ok(gpu_world.run(check_symmetric_tensors))


def test_zero_copy_collectives(gpu_world):
    _ok(gpu_world.run(check_zero_copy_collectives))


def test_zero_copy_mismatch(gpu_world):
    _ok(gpu_world.run(check_zero_copy_mismatch))


def test_symmetric_heap_limits(gpu_world):
    _ok(gpu_world.run(check_symmetric_heap_limits))


def test_windows(gpu_world):
    _ok(gpu_world.run(check_windows))


def test_get_p2p_buffer(gpu_world):
    _ok(gpu_world.run(check_p2p_buffer))


def test_async_wait_on_a_side_stream(gpu_world):
    _ok(gpu_world.run(check_async_side_stream))


def test_is_completed_only_once_the_gpu_ran_the_op(gpu_world):
    _ok(gpu_world.run(check_is_completed))


def test_routing_default_nccl_one_rank():
    _ok(conftest._world(1).run(check_routing_default, "cuda_p2p"))


def test_routing_default_shared_gpu(gpu_world):
    _ok(gpu_world.run(check_routing_default, NONCCL))


@pytest.mark.parametrize("W", [2, 3])
def test_a_rank_that_never_arrives_is_named(W):
    world = conftest._world(W)
    absent = W - 1
    try:
        results = world.run(check_timeout, absent, timeout=60)
    finally:
        world.close(graceful=False)  # the ranks' group is aborted: start the next test afresh
    for r in results:
        if r["rank"] == absent:
            continue
        assert len(r["errors"]) == 2, r
        for what, err, secs in r["errors"]:
            assert err is not None, f"rank {r['rank']}: {what}: no error within {secs:.1f} s"
            assert str(absent) in err and ("never arrived" in err or "timed out" in err.lower()), (
                f"rank {r['rank']}: {what}: the error does not name rank {absent}: {err}")
            assert secs < TIMEOUT_S + MARGIN_S, f"rank {r['rank']}: {what} took {secs:.1f} s"
        assert r["synchronize_s"] < MARGIN_S, r
