"""The rank side of tests/python/gpu/test_gpu.py: the NCCL-free backend, the groups, inputs and
references, and the checks of the workspace collectives on the GPU (each returns {"cases",
"failures"}); the fused ops, Works and routing are in _gpu_op_checks.py, the symmetric heap in
_gpu_heap_checks.py.

The checks are device-neutral where they can be: test_gpu_rehearsal.py runs them with CPU tensors
on the host workspace (rehearse_on_cpu). The ranks import this module by name to run them.
"""

from __future__ import annotations

import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

import cuda_p2p
from _checks import Checker, wrapped
from _harness import scoped_environ
from _reference import FLOAT_OPS, reduce_over_ranks
from cuda_p2p import ProcessGroupCudaP2P

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
# the checks by module, and every module of checks imports this one)


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


def _small(shape, seed, dtype, dev):
    """Values in {-1, 0, 1}: matmuls of K <= 64 and sums over 4 ranks stay exact in bf16/fp16."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, shape, generator=g).to(dtype).to(dev)


def _seed(*case) -> int:
    """A seed every rank derives alike from a test case. Not hash(): a str's hash differs from
    process to process (PYTHONHASHSEED), and then each rank draws different inputs (the second
    GPU run's fused_matmul_reduce_scatter failures at W >= 2 were exactly that)."""
    return zlib.crc32(repr(case).encode()) % 1000


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
