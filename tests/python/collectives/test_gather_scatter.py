"""gather and scatter on the workspace (issue 38, point 2) on 2, 3 and 4 ranks: every root, every
dtype, sizes from empty to several rounds (a 64 KiB buffer, and 4 KiB chunks), non-contiguous
tensors, async Works; each result against plain torch computed locally and against a Gloo group
over the same ranks; the counters say which path ran (`<op>.direct`, `<op>.wrapped` with the
workspace off). Ranks that disagree (roots, sizes, dtypes) raise the same one-line error on every
rank and the group stays usable; a bad root says what was expected and what was given."""

from __future__ import annotations

import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, expect_nothing_wrapped, gloo_ok, raises, wrapped
from _groups import cached_group

SMALL_BUFFER = 1 << 16
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool)
# 0, 1, odd, several 32 KiB rounds (float32: 8192 elements per round), several 4 KiB chunks
SIZES = (0, 1, 7, 1000, 3 * 8192 + 5)


def _value(src, dst, n, dtype, seed=0):
    v = (torch.arange(n, dtype=torch.int64) * 5 + src * 7 + dst * 3 + seed) % 17
    if dtype == torch.bool:
        v = v % 2
    return v.to(dtype)


def _groups():
    return ((dist.group.WORLD, "world"),
            (cached_group("gs-small", buffer_size=SMALL_BUFFER, chunk_bytes=0), "small"),
            (cached_group("gs-chunked", buffer_size=SMALL_BUFFER, chunk_bytes=4096), "chunked"))


def _cases(W, groups):
    """(dtype, n, root, group, its name, whether Gloo checks it too): every dtype, size and root on
    the world group; float32 and int8 from 1000 elements on the small ones. Resets the groups'
    counters first."""
    for g, _ in groups:
        cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    for dtype in DTYPES:
        for n in SIZES:
            for root in range(W):
                for g, gname in groups:
                    if gname != "world" and (dtype not in (torch.float32, torch.int8)
                                             or n < 1000):
                        continue
                    gloo = gname == "world" and n in (7, 1000) and dtype in (torch.float32,
                                                                             torch.int64)
                    yield dtype, n, root, g, gname, gloo


def _expect_direct(chk, groups, key, calls):
    """Each group counted `key` once per call, and nothing wrapped."""
    for g, gname in groups:
        c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
        chk.case(f"{gname} counters", c.get(key) == calls[gname] and not wrapped(c),
                 f"{calls[gname]}: {c}")


def check_gather(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"gather W={W}")
    groups = _groups()
    calls = {}
    for dtype, n, root, g, gname, gloo in _cases(W, groups):
        seed = root + n
        t = _value(rank, root, n, dtype, seed)
        outs = [torch.full((n,), 1, dtype=dtype) for _ in range(W)] if rank == root else None
        dist.gather(t, outs, dst=root, group=g)
        calls[gname] = calls.get(gname, 0) + 1
        if rank == root:
            want = [_value(q, root, n, dtype, seed) for q in range(W)]
            chk.case(f"{gname} {dtype} n={n} root={root}",
                     all(torch.equal(o, w) for o, w in zip(outs, want)),
                     f"{[o[:4] for o in outs]}")
        if gloo:
            ref = [torch.empty(n, dtype=dtype) for _ in range(W)] if rank == root else None
            if gloo_ok(lambda: dist.gather(t, ref, dst=root, group=ctx.gloo)) and rank == root:
                chk.case(f"gloo {dtype} n={n} root={root}",
                         all(torch.equal(o, x) for o, x in zip(outs, ref)), "differs from Gloo")
    _expect_direct(chk, groups, "gather.direct", calls)
    # Non-contiguous input and outputs; async.
    root = W - 1
    t = _value(rank, root, 12, torch.float32).view(3, 4).t()
    outs = [torch.zeros(3, 4).t() for _ in range(W)] if rank == root else None
    work = dist.gather(t, outs, dst=root, async_op=True)
    work.wait()
    if rank == root:
        chk.case("non-contiguous", all(torch.equal(o, _value(q, root, 12, torch.float32)
                                                   .view(3, 4).t()) for q, o in enumerate(outs)),
                 f"{outs}")
    return chk.result()


def check_scatter(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"scatter W={W}")
    groups = _groups()
    calls = {}
    for dtype, n, root, g, gname, gloo in _cases(W, groups):
        seed = root + n + 1
        ins = [_value(root, q, n, dtype, seed) for q in range(W)] if rank == root else None
        out = torch.full((n,), 1, dtype=dtype)
        dist.scatter(out, ins, src=root, group=g)
        calls[gname] = calls.get(gname, 0) + 1
        chk.case(f"{gname} {dtype} n={n} root={root}",
                 torch.equal(out, _value(root, rank, n, dtype, seed)), f"{out[:4]}")
        if gloo:
            ref = torch.empty(n, dtype=dtype)
            if gloo_ok(lambda: dist.scatter(ref, ins, src=root, group=ctx.gloo)):
                chk.case(f"gloo {dtype} n={n} root={root}", torch.equal(out, ref),
                         "differs from Gloo")
    _expect_direct(chk, groups, "scatter.direct", calls)
    root = 0
    ins = [_value(root, q, 12, torch.float32).view(3, 4).t() for q in range(W)] \
        if rank == root else None
    out = torch.zeros(3, 4).t()
    work = dist.scatter(out, ins, src=root, async_op=True)
    work.wait()
    chk.case("non-contiguous", torch.equal(out, _value(root, rank, 12, torch.float32)
                                           .view(3, 4).t()), f"{out}")
    return chk.result()


def _usable(ctx, chk, what):
    W, rank = ctx.world_size, ctx.rank
    out = torch.empty(5)
    dist.scatter(out, [torch.full((5,), float(q)) for q in range(W)] if rank == 0 else None,
                 src=0)
    outs = [torch.empty(5) for _ in range(W)] if rank == W - 1 else None
    dist.gather(out * 2, outs, dst=W - 1)
    ok = torch.equal(out, torch.full((5,), float(rank)))
    if rank == W - 1:
        ok = ok and all(torch.equal(o, torch.full((5,), 2.0 * q)) for q, o in enumerate(outs))
    chk.case(f"{what}: usable after", ok, f"{out}")


def check_mismatches(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"gather/scatter mismatch W={W}")
    b = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    b.reset_counters()
    # Sizes differ.
    n = 4 if rank == 0 else 6
    outs = [torch.empty(n) for _ in range(W)] if rank == 0 else None
    err = raises(lambda: dist.gather(torch.ones(n), outs, dst=0))
    chk.case("gather sizes", err is not None and "cuda_p2p gather: ranks disagree" in err
             and "rank 0 passed 4 x float32 to root 0" in err
             and "rank 1 passed 6 x float32 to root 0" in err and "\n" not in err, f"{err!r}")
    _usable(ctx, chk, "gather sizes")
    # Dtypes differ.
    dt = torch.float32 if rank == 0 else torch.int32
    ins = [torch.ones(3, dtype=dt) for _ in range(W)] if rank == 0 else None
    err = raises(lambda: dist.scatter(torch.empty(3, dtype=dt), ins, src=0))
    chk.case("scatter dtypes", err is not None and "cuda_p2p scatter: ranks disagree" in err
             and "rank 1 passed 3 x int32 from root 0" in err, f"{err!r}")
    _usable(ctx, chk, "scatter dtypes")
    # A bad root on every rank: what was expected and what was given (torch checks the group
    # rank first for dist.gather, so call the backend's own op with a bad root).
    pg = dist.group.WORLD
    opts = dist.GatherOptions()
    opts.rootRank = W + 3
    err = raises(lambda: pg.gather([], [torch.ones(2)], opts).wait())
    chk.case("bad root", err is not None and f"root must be a rank in [0, {W}), got {W + 3}"
             in err, f"{err!r}")
    _usable(ctx, chk, "bad root")
    expect_nothing_wrapped(chk, b)
    return chk.result()


def check_wrapped(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"gather/scatter wrapped W={W}")
    off = cached_group("gs-off", enable_workspace=False)
    b = cuda_p2p.get_cuda_p2p_backend(off)
    b.reset_counters()
    outs = [torch.empty(3) for _ in range(W)] if rank == 1 else None
    dist.gather(torch.full((3,), float(rank)), outs, dst=1, group=off)
    if rank == 1:
        chk.case("gather", all(o.tolist() == [float(q)] * 3 for q, o in enumerate(outs)), f"{outs}")
    out = torch.empty(2)
    dist.scatter(out, [torch.full((2,), q + 0.5) for q in range(W)] if rank == 0 else None, src=0,
                 group=off)
    chk.case("scatter", out.tolist() == [rank + 0.5] * 2, f"{out}")
    c = b.get_counters()
    chk.case("counters", c.get("gather.wrapped") == 1 and c.get("scatter.wrapped") == 1
             and "gather.direct" not in c, f"{c}")
    return chk.result()


def test_gather(any_world):
    assert_ok(any_world.run(check_gather), min_cases=3)


def test_scatter(any_world):
    assert_ok(any_world.run(check_scatter), min_cases=50)


def test_gather_scatter_mismatches(any_world):
    assert_ok(any_world.run(check_mismatches), min_cases=5)


def test_gather_scatter_wrapped(any_world):
    assert_ok(any_world.run(check_wrapped), min_cases=2)
