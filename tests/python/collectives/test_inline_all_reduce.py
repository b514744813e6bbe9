"""The inline one-shot all-reduce of a host workspace (NOTE [Inline one-shot] in
ops/all_reduce.cpp): the small-message path, checked against Gloo and plain torch.

It runs the one-shot protocol word for word on the calling thread, so a rank on it and a peer on
the generic path must interoperate: the groups here turn it on for some ranks only
(Options.inline_all_reduce), run back-to-back all-reduces of sizes that alternate between the
inline path, the generic multi-round one-shot and two-shot, every reducible dtype, odd sizes,
views and non-contiguous tensors, interleaved with other collectives, a growth of the buffer and
a second group, and check every result and the counters. Mismatches across the two paths must
raise the usual error on every rank and leave the group usable.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import _collective_checks as cc
import cuda_p2p
from _groups import cached_group
from _reference import ops_for, reduce_over_ranks

R = dist.ReduceOp
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64)
NO_GLOO = (torch.int16,)  # Gloo has no all-reduce for these: plain torch is the reference
CHUNK = 4096  # the groups' chunk_bytes: one-shot above it takes several rounds (generic)




def _group_inline_on_even_ranks(ctx, algo="auto"):
    """Even ranks inline, odd ranks generic (and every rank inline when W == 1)."""
    return cached_group(("mixed", algo), inline_all_reduce=ctx.rank % 2 == 0, chunk_bytes=CHUNK,
                  all_reduce_algo=algo)


def _input(seed, rank, n, dtype, op):
    base = dtype if dtype.is_floating_point else torch.int64
    x = cc.make_input(seed, rank, n, base, op)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        if op in ("BAND", "BOR", "BXOR"):
            x = x & info.max
        elif op != "PRODUCT":
            x = x.clamp(info.min // 8, info.max // 8)  # no wrap-around in Gloo's or ours
    return x.to(dtype)


def _close(got, want, dtype, op):
    """Exact for integers, MIN and MAX; else within the rounding of a different order (Gloo
    accumulates float16 / bfloat16 in their own precision, we in float32)."""
    tol = cc.tolerance(dtype, op)
    if tol is None:
        return torch.equal(got, want)
    if dtype == torch.float16:
        tol = (4e-3, 0.05)
    return torch.allclose(got.double(), want.double(), rtol=tol[0], atol=tol[1])


def _compare_with_gloo_and_reference(failures, label, got, ref, expected, dtype, op):
    if ref is not None and not _close(got, ref, dtype, op):
        failures.append(f"{label}: differs from Gloo: {got[:4].tolist()} vs {ref[:4].tolist()}")
    if not _close(got, expected, dtype, op):
        failures.append(f"{label}: differs from plain torch")


def _all_reduce_and_check(ctx, g, seed, n, dtype, op, failures, how="dist", make=None):
    """All-reduces rank inputs of case `seed` on `g` (dist.all_reduce or the dispatcher op) and on
    Gloo, and checks both against plain torch. `make(x)` returns the tensor to reduce in place
    (a view, a non-contiguous tensor) and a function giving its values."""
    W, me = ctx.world_size, ctx.rank
    x = _input(seed, me, n, dtype, op)
    expected = reduce_over_ranks(op, [_input(seed, r, n, dtype, op) for r in range(W)])
    ref = x.clone()
    if dtype not in NO_GLOO:
        dist.all_reduce(ref, op=getattr(R, op), group=ctx.gloo)
    else:
        ref = None  # plain torch only
    t, read = (x, lambda: x) if make is None else make(x)
    if how == "dist":
        dist.all_reduce(t, op=getattr(R, op), group=g)
    else:
        torch.ops.cuda_p2p.all_reduce_(t, op.lower(), g.group_name)
    _compare_with_gloo_and_reference(failures, f"{how} {dtype} n={n} {op} W={W}", read(), ref,
                                     expected, dtype, op)


def check_dtypes_and_sizes(ctx):
    """Every dtype and op, sizes at and around the round (CHUNK) and the one-shot threshold, on a
    group where some ranks run inline and the others the generic path, back to back."""
    W = ctx.world_size
    g = _group_inline_on_even_ranks(ctx)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    failures, cases = [], 0
    backend.reset_counters()
    inline_expected = 0
    for i, dtype in enumerate(DTYPES):
        es = torch.empty(0, dtype=dtype).element_size()
        one_shot_max = 8 << 10
        sizes = sorted({1, 3, 7, 1001, CHUNK // es - 1, CHUNK // es, CHUNK // es + 1,
                        one_shot_max // es, one_shot_max // es + 1})
        for j, n in enumerate(sizes):
            for k, op in enumerate(ops_for(dtype)):
                if n > 2000 and k % 3:  # large sizes: the paths, not every op
                    continue
                how = "dist" if (i + j + k) % 2 else "op"
                _all_reduce_and_check(ctx, g, 1000 * i + 10 * j + k, n, dtype, op, failures, how)
                cases += 1
                if n * es <= CHUNK and W > 1:
                    inline_expected += 1
    counts = backend.get_counters()
    inline = counts.get("all_reduce.inline", 0)
    want = inline_expected if ctx.rank % 2 == 0 and W > 1 else 0
    if inline != want:
        failures.append(f"rank {ctx.rank}: all_reduce.inline = {inline}, expected {want}: {counts}")
    if any(k.endswith(".wrapped") for k in counts):
        failures.append(f"something went to Gloo: {counts}")
    return {"cases": cases, "failures": failures}


def check_interleaved(ctx):
    """Inline and generic all-reduces alternating with other collectives, a growth of the
    workspace and a second group, every result checked."""
    W, me = ctx.world_size, ctx.rank
    g = _group_inline_on_even_ranks(ctx)
    other = cached_group("plain")  # a second group, inline on every rank
    failures, cases = [], 0
    sizes = (2, CHUNK // 4 + 3, 5, (8 << 10) // 4 + 1, 1, 300_001, 8, CHUNK // 4)
    for rep in range(3):
        for j, n in enumerate(sizes):
            grp = g if (rep + j) % 3 else other
            _all_reduce_and_check(ctx, grp, 77 + 10 * rep + j, n, torch.float32, "SUM", failures,
                                  "op" if j % 2 else "dist")
            cases += 1
            # Other collectives between the all-reduces, on the same group.
            out = torch.empty(3 * W)
            dist.all_gather_into_tensor(out, torch.full((3,), float(me + rep)), group=grp)
            ref = (torch.arange(W, dtype=torch.float32) + rep).repeat_interleave(3)
            if not torch.equal(out, ref):
                failures.append(f"all_gather after all_reduce of {n}: {out.tolist()}")
            b = torch.full((5,), float(me))
            dist.broadcast(b, src=W - 1, group=grp)
            if not torch.equal(b, torch.full((5,), float(W - 1))):
                failures.append(f"broadcast after all_reduce of {n}: {b.tolist()}")
            if j == 4:
                dist.barrier(group=grp)
        # A new, larger workspace: the inline path takes its addresses again.
        cuda_p2p.get_cuda_p2p_backend(g).ensure_min_buffer_size((40 + 8 * rep) << 20)
    return {"cases": cases, "failures": failures}


def check_views(ctx):
    """In place on views: an offset slice of a larger tensor (contiguous, not at its storage's
    start), a strided slice (non-contiguous), a transposed matrix, each inline-sized."""
    g = _group_inline_on_even_ranks(ctx)
    failures, cases = [], 0

    def offset_view(x):
        base = torch.full((x.numel() + 13,), -1.0, dtype=x.dtype)
        v = base[13:]
        v.copy_(x)
        return v, lambda: v

    def strided(x):
        base = torch.zeros(2 * x.numel(), dtype=x.dtype)
        v = base[::2]
        v.copy_(x)

        def read():
            if base[1::2].abs().sum() != 0:
                failures.append("strided view: the gaps were written")
            return v.clone()
        return v, read

    def transposed(x):
        m = x.reshape(-1, 3).t()  # 3 x k, non-contiguous
        return m, lambda: m.t().reshape(-1)

    for i, (name, make) in enumerate((("offset", offset_view), ("strided", strided),
                                      ("transposed", transposed))):
        for j, dtype in enumerate((torch.float32, torch.bfloat16, torch.int32)):
            for how in ("dist", "op"):
                _all_reduce_and_check(ctx, g, 500 + 10 * i + j, 3 * 37, dtype, "SUM", failures,
                                      how, make)
                cases += 1
    return {"cases": cases, "failures": failures}


def _raises(call):
    try:
        call()
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


def check_mismatches(ctx):
    """Ranks that disagree while some run inline: every rank raises the usual one-line error,
    and the group works right after."""
    rank = ctx.rank
    failures, cases = [], 0
    for algo in ("auto", "one_shot"):
        g = _group_inline_on_even_ranks(ctx, algo)
        cases_here = [
            # inline on rank 0 against two-shot / several one-shot rounds on rank 1
            ("size", lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 300_000), group=g),
             ["rank 0 passed 4 x float32 sum", "rank 1 passed 300000 x float32 sum"]),
            ("dtype", lambda: dist.all_reduce(
                torch.ones(8, dtype=torch.float32 if rank == 0 else torch.float64), group=g),
             ["rank 0 passed 8 x float32", "rank 1 passed 8 x float64"]),
            ("op", lambda: torch.ops.cuda_p2p.all_reduce_(
                torch.ones(8), "sum" if rank == 0 else "max", g.group_name),
             ["rank 0 passed 8 x float32 sum", "rank 1 passed 8 x float32 max"]),
            ("broadcast", lambda: dist.all_reduce(torch.ones(8), group=g) if rank == 0
             else dist.broadcast(torch.ones(8), src=0, group=g),
             ["rank 0 passed all_reduce of 8 x float32 sum", "rank 1 passed broadcast"]),
            ("barrier", lambda: dist.barrier(group=g) if rank == 1
             else dist.all_reduce(torch.ones(3), group=g),
             ["rank 0 passed all_reduce of 3 x float32 sum", "rank 1 passed barrier"]),
        ]
        for what, call, needles in cases_here:
            err = _raises(call)
            cases += 1
            if not (err and "ranks disagree" in err and all(n in err for n in needles)
                    and "\n" not in err.strip()):
                failures.append(f"{algo} {what}: {err!r} (want {needles})")
            # Still usable: inline-sized and larger all-reduces give Gloo's result.
            for n in (5, 3000, 300_001):
                _all_reduce_and_check(ctx, g, 900 + n, n, torch.float32, "SUM", failures, "dist")
    # A rank whose own argument check fails: its inline peers raise at once, naming it.
    g = _group_inline_on_even_ranks(ctx)
    err = _raises(lambda: dist.all_reduce(
        torch.ones(3, dtype=torch.int64 if rank == 0 else torch.float32), op=R.AVG, group=g))
    cases += 1
    if rank == 0:
        if not err or "rejected" in err:
            failures.append(f"rank 0's own error: {err!r}")
    elif not err or "rank 0 rejected its arguments" not in err:
        failures.append(f"peer of a rejecting rank: {err!r}")
    _all_reduce_and_check(ctx, g, 999, 7, torch.float32, "SUM", failures, "op")
    return {"cases": cases, "failures": failures}


def test_dtypes_and_sizes(any_world):
    cc.assert_all_ok(any_world.run(check_dtypes_and_sizes), min_cases=100)


def test_interleaved(any_world):
    cc.assert_all_ok(any_world.run(check_interleaved), min_cases=24)


def test_views(any_world):
    cc.assert_all_ok(any_world.run(check_views), min_cases=18)


def test_mismatches(any_world):
    cc.assert_all_ok(any_world.run(check_mismatches), min_cases=11)


def check_pinned_ranks_are_not_oversubscribed(ctx):
    """NOTE [CPUs of the ranks]: whether a host's ranks outnumber their CPUs is decided over the
    union of every rank's affinity, not from a rank's own: W ranks pinned one per CPU (bench/'s
    default) spin, W ranks pinned to one CPU yield, unpinned ranks compare W with the machine."""
    import os

    W, me = ctx.world_size, ctx.rank
    original = os.sched_getaffinity(0)
    cpus = sorted(original)
    failures, cases = [], 0
    layouts = {"unpinned": original, "one CPU": {cpus[0]}}
    if len(cpus) >= W:  # one CPU each
        layouts["one each"] = {cpus[me]}
    try:
        for label, mine in layouts.items():
            os.sched_setaffinity(0, mine)
            g = dist.new_group(backend="cuda_p2p")
            os.sched_setaffinity(0, original)
            config = cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()
            masks = [None] * W
            dist.all_gather_object(masks, sorted(mine), group=ctx.gloo)
            union = len(set().union(*map(set, masks)))
            want = {"ranks_cpus": union, "oversubscribed": W > union}
            got = {k: config[k] for k in want}
            cases += 1
            if got != want:
                failures.append(f"{label}: {got}, expected {want}")
            # And the group works either way.
            t = torch.full((5,), float(me + 1))
            dist.all_reduce(t, group=g)
            if not torch.equal(t, torch.full((5,), float(W * (W + 1) // 2))):
                failures.append(f"{label}: all_reduce gave {t.tolist()}")
            dist.destroy_process_group(g)
    finally:
        os.sched_setaffinity(0, original)
    return {"cases": cases, "failures": failures}


def test_pinned_ranks_are_not_oversubscribed(any_world):
    cc.assert_all_ok(any_world.run(check_pinned_ranks_are_not_oversubscribed), min_cases=2)
