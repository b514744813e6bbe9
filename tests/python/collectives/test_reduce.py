"""reduce on the workspace on 2, 3 and 4 ranks: every root, every dtype the workspace reduces,
every reduce op, sizes from empty to several rounds (a 64 KiB buffer, and 4 KiB chunks),
non-contiguous tensors, async Works; each result against the plain-torch reference
(_reference.py) and against a Gloo group over the same ranks (exact small integers, so that every
op compares bitwise; AVG, which Gloo lacks, against plain torch only); only the root's tensor
changes. The counters say which path ran (`reduce.direct`, `reduce.wrapped` with the workspace
off or a dtype it does not reduce). Ranks that disagree (sizes, dtypes, roots, ops) raise the
same one-line error on every rank and the group stays usable; a bad root says what was expected
and what was given."""

from __future__ import annotations

import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, expect_nothing_wrapped, raises
from _groups import cached_group
from _reference import ops_for, reduce_over_ranks

R = dist.ReduceOp
SMALL_BUFFER = 1 << 16
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64)
# 0, 1, odd, a few KiB; and several 32 KiB rounds on the small groups (float32: 8192 elements per
# round; 4 KiB chunks: 1024).
SIZES = (0, 1, 7, 1000)
ROUNDS = 3 * 8192 + 5


def _value(rank, n, dtype, op, seed=0):
    """Small integers, exact in every dtype and in every op's result on up to 4 ranks (uint8: no
    negatives; PRODUCT: factors in [-2, 2], at most 16)."""
    v = (torch.arange(n, dtype=torch.int64) * 5 + rank * 7 + seed) % 7 - 3  # [-3, 3]
    if op == "PRODUCT":
        v = v.clamp(-2, 2)
    if op in ("BAND", "BOR", "BXOR"):
        v = v + 3 + 16 * (rank + 1)  # distinct bits per rank
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def _expected(W, n, dtype, op, seed):
    """The root's result of case (n, dtype, op, seed): _reference.reduce_over_ranks."""
    return reduce_over_ranks(op, [_value(q, n, dtype, op, seed) for q in range(W)])


def _gloo_reduce(t, root, op, group):
    """Gloo's reduce of a copy of `t`, or None where Gloo lacks the dtype or the op."""
    ref = t.clone()
    try:
        dist.reduce(ref, dst=root, op=getattr(R, op), group=group)
    except (RuntimeError, ValueError) as e:
        msg = str(e).lower()
        if "invalid scalar type" in msg or "not supported" in msg or "cannot use" in msg:
            return None
        raise
    return ref


def check_reduce(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"reduce W={W}")
    small = cached_group("reduce-small", buffer_size=SMALL_BUFFER, chunk_bytes=0)
    chunked = cached_group("reduce-chunked", buffer_size=SMALL_BUFFER, chunk_bytes=4096)
    groups = ((dist.group.WORLD, "world"), (small, "small"), (chunked, "chunked"))
    calls, gloo_dtypes = {}, set()
    for g, _ in groups:
        cuda_p2p.get_cuda_p2p_backend(g).reset_counters()

    def one(g, gname, dtype, op, n, root, seed, gloo):
        t = _value(rank, n, dtype, op, seed)
        mine = t.clone()
        dist.reduce(t, dst=root, op=getattr(R, op), group=g)
        calls[gname] = calls.get(gname, 0) + 1
        what = f"{gname} {dtype} {op} n={n} root={root}"
        if rank == root:
            want = _expected(W, n, dtype, op, seed)
            # Exact for every op, AVG included: the sums are exact, and the reference divides
            # them once in the accumulation type, as the reduction does.
            chk.case(what, torch.equal(t, want), f"{t[:6]} != {want[:6]}")
        else:
            chk.case(f"{what}: left as it was", torch.equal(t, mine), f"{t[:6]} != {mine[:6]}")
        if gloo and op != "AVG":
            ref = _gloo_reduce(mine, root, op, ctx.gloo)
            if ref is not None:
                gloo_dtypes.add(dtype)
            if ref is not None and rank == root:
                chk.case(f"gloo {what}", torch.equal(t, ref), f"{t[:6]} != Gloo's {ref[:6]}")

    case = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in SIZES:
                # Every root for one size, a rotating root for the others.
                first = (case + n) % W
                for root in range(W) if n == 7 else (first,):
                    case += 1
                    # Against Gloo once per dtype, op and size of 7 or 1000 elements.
                    gloo = n in (7, 1000) and root == first
                    one(dist.group.WORLD, "world", dtype, op, n, root, case, gloo=gloo)
    # Several rounds through a small buffer: the whole half, then 4 KiB chunks (NOTE [Reduce at
    # the root]); float32, the float32 accumulators of bfloat16, and a native integer.
    for dtype, ops in ((torch.float32, ("SUM", "AVG", "MAX")), (torch.bfloat16, ("SUM", "PRODUCT")),
                       (torch.int8, ("SUM", "MIN"))):
        for op in ops:
            for g, gname in groups[1:]:
                for root in range(W):
                    case += 1
                    one(g, gname, dtype, op, ROUNDS, root, case,
                        gloo=dtype != torch.bfloat16 and root == 0)
    # Gloo lacks a few dtypes (int16 in torch 2.14), not the common ones.
    chk.case("compared with Gloo", {torch.float32, torch.float64, torch.float16, torch.int8,
                                    torch.uint8, torch.int32, torch.int64} <= gloo_dtypes,
             f"{sorted(map(str, gloo_dtypes))}")
    for g, gname in groups:
        c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
        chk.case(f"{gname} counters", c.get("reduce.direct") == calls[gname]
                 and not any(k.endswith(".wrapped") for k in c), f"{calls[gname]}: {c}")

    # Non-contiguous, async: the root's view receives the sum, the others' are left alone.
    for root in (0, W - 1):
        t = _value(rank, 12, torch.float32, "SUM", root).view(3, 4).t()
        mine = t.clone()
        work = dist.reduce(t, dst=root, async_op=True)
        chk.case(f"async root={root}: a Work", work is not None, "")
        work.wait()
        want = _expected(W, 12, torch.float32, "SUM", root).view(3, 4).t() if rank == root \
            else mine
        chk.case(f"non-contiguous async root={root}",
                 not t.is_contiguous() and torch.equal(t, want), f"{t} != {want}")
    return chk.result()


def _usable(ctx, chk, what):
    W, rank = ctx.world_size, ctx.rank
    t = torch.full((5,), float(rank + 1))
    dist.reduce(t, dst=W - 1)
    want = float(W * (W + 1) // 2) if rank == W - 1 else float(rank + 1)
    chk.case(f"{what}: usable after", torch.equal(t, torch.full((5,), want)), f"{t}")


def check_mismatches(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"reduce mismatch W={W}")
    b = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    b.reset_counters()

    def disagree(what, call, *parts):
        err = raises(call)
        chk.case(what, err is not None and "cuda_p2p reduce: ranks disagree" in err
                 and all(p in err for p in parts) and "\n" not in err, f"{err!r}")
        _usable(ctx, chk, what)

    n = 4 if rank == 0 else 6
    disagree("sizes", lambda: dist.reduce(torch.ones(n), dst=0),
             "rank 0 passed 4 x float32 sum to root 0", "rank 1 passed 6 x float32 sum to root 0")
    dt = torch.float32 if rank == 0 else torch.int32
    disagree("dtypes", lambda: dist.reduce(torch.ones(3, dtype=dt), dst=1),
             "rank 0 passed 3 x float32 sum to root 1", "rank 1 passed 3 x int32 sum to root 1")
    root = 0 if rank == 0 else 1
    disagree("roots", lambda: dist.reduce(torch.ones(3), dst=root),
             "rank 0 passed 3 x float32 sum to root 0", "rank 1 passed 3 x float32 sum to root 1")
    op = R.SUM if rank == 0 else R.MAX
    disagree("ops", lambda: dist.reduce(torch.ones(3), dst=0, op=op),
             "rank 0 passed 3 x float32 sum to root 0", "rank 1 passed 3 x float32 max to root 0")
    # AVG on integers, on every rank: the error Gloo's users get, raised before any data moves.
    err = raises(lambda: dist.reduce(torch.ones(3, dtype=torch.int64), dst=0, op=R.AVG))
    chk.case("int AVG", err is not None and "ReduceOp.AVG needs a floating-point dtype" in err,
             f"{err!r}")
    _usable(ctx, chk, "int AVG")
    # A bad root on every rank (torch checks the group rank first for dist.reduce, so call the
    # backend's own op with a bad root).
    opts = dist.ReduceOptions()
    opts.rootRank = W + 3
    err = raises(lambda: dist.group.WORLD.reduce([torch.ones(2)], opts).wait())
    chk.case("bad root", err is not None and f"root must be a rank in [0, {W}), got {W + 3}"
             in err, f"{err!r}")
    _usable(ctx, chk, "bad root")
    expect_nothing_wrapped(chk, b)
    return chk.result()


def check_wrapped(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"reduce wrapped W={W}")
    off = cached_group("reduce-off", enable_workspace=False)
    b = cuda_p2p.get_cuda_p2p_backend(off)
    b.reset_counters()
    t = torch.full((3,), float(rank + 1))
    dist.reduce(t, dst=1, group=off)
    if rank == 1:
        chk.case("workspace off", t.tolist() == [float(W * (W + 1) // 2)] * 3, f"{t}")
    c = b.get_counters()
    chk.case("workspace off: counters", c.get("reduce.wrapped") == 1 and "reduce.direct" not in c,
             f"{c}")
    # A dtype the workspace does not reduce, on a workspace group: the ranks agree on the route
    # (NOTE [Routes agree]) and Gloo runs it.
    on = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    on.reset_counters()
    tb = torch.tensor([rank == 0, False, rank == W - 1])
    dist.reduce(tb, dst=0, op=R.MAX)
    if rank == 0:
        chk.case("bool", tb.tolist() == [True, False, True], f"{tb}")
    c = on.get_counters()
    chk.case("bool: counters", c.get("reduce.wrapped") == 1 and "reduce.direct" not in c, f"{c}")
    return chk.result()


def test_reduce(any_world):
    assert_ok(any_world.run(check_reduce), min_cases=200)


def test_reduce_mismatches(any_world):
    assert_ok(any_world.run(check_mismatches), min_cases=10)


def test_reduce_wrapped(any_world):
    assert_ok(any_world.run(check_wrapped), min_cases=2)
