"""All-to-all on the workspace (issue 38, point 1) on 2, 3 and 4 ranks: all_to_all_single (even,
uneven and zero-row splits, every dtype, odd row shapes, payloads larger than the buffer, so in
rounds), the list all_to_all, and cuda_p2p.all_to_all_v (receive counts unknown in advance).
Every result is checked against plain torch computed locally and, where Gloo runs the case,
against a Gloo group over the same ranks; the counters must show which path ran. Mismatched
split sizes or dtypes across ranks raise the same one-line error on every rank, and the group
stays usable; bad arguments say what was expected and what was given (ops/all_to_all.cpp, NOTE
[All-to-all headers]). Inputs in the symmetric heap are read zero-copy by their receivers (NOTE
[All-to-all zero-copy]), alone or mixed with staged senders."""

from __future__ import annotations

import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, expect_nothing_wrapped, gloo_ok, raises, wrapped
from _groups import cached_group

SMALL_BUFFER = 1 << 16  # 64 KiB: 32 KiB per phase, so larger payloads run in rounds
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool)


def _block(src, dst, rows, row_shape, dtype, seed=0):
    """What rank `src` sends rank `dst`: `rows` rows of `row_shape`, exact in every dtype."""
    n = rows * int(torch.tensor(row_shape).prod().item()) if row_shape else rows
    v = (torch.arange(n, dtype=torch.int64) * 5 + src * 7 + dst * 3 + seed) % 17
    if dtype == torch.bool:
        v = v % 2
    return v.to(dtype).view(rows, *row_shape)


def _splits(layout, W, seed=0):
    """splits[src][dst]: rows src sends dst."""
    if layout == "even":
        return [[3] * W for _ in range(W)]
    if layout == "uneven":
        return [[(s + 2 * d + seed) % 4 + 1 for d in range(W)] for s in range(W)]
    if layout == "zero_rows":
        return [[0 if (s + d + seed) % 2 else s + d + 1 for d in range(W)] for s in range(W)]
    if layout == "all_zero":
        return [[0] * W for _ in range(W)]
    if layout == "rounds":  # several 32 KiB rounds with rows of 12 bytes x up to 8
        return [[700 + 300 * ((s + d) % 3) for d in range(W)] for s in range(W)]
    raise ValueError(layout)


def _single(group, rank, W, splits, row_shape, dtype, even=False, seed=0):
    """all_to_all_single on `group`; returns (output, expected)."""
    inp = torch.cat([_block(rank, d, splits[rank][d], row_shape, dtype, seed) for d in range(W)])
    want = torch.cat([_block(s, rank, splits[s][rank], row_shape, dtype, seed) for s in range(W)])
    out = torch.full_like(want, 1)
    if even:
        dist.all_to_all_single(out, inp, group=group)
    else:
        dist.all_to_all_single(out, inp, [splits[s][rank] for s in range(W)], splits[rank],
                               group=group)
    return out, want


def check_single(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all_single W={W}")
    world = dist.group.WORLD
    # "small": every round staged (cross-memory reads off); "chunked": 4 KiB rounds,
    # cross-memory reads past the first (NOTE [All-to-all headers]).
    small = cached_group("a2a-small", buffer_size=SMALL_BUFFER, chunk_bytes=0)
    chunked = cached_group("a2a-chunked", buffer_size=SMALL_BUFFER, chunk_bytes=4096,
                           cross_memory=True, cross_memory_min_bytes=0)
    for g in (world, small, chunked):
        cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    calls = {id(world): 0, id(small): 0, id(chunked): 0}
    for dtype in DTYPES:
        for layout in ("even", "uneven", "zero_rows", "all_zero", "rounds"):
            for row_shape in ((), (3,), (2, 3)):
                if layout == "rounds" and row_shape == ():
                    continue
                for g, gname in ((world, "world"), (small, "small"), (chunked, "chunked")):
                    if gname != "world" and dtype not in (torch.float32, torch.bfloat16,
                                                          torch.int8):
                        continue
                    splits = _splits(layout, W)
                    even = layout == "even"
                    out, want = _single(g, rank, W, splits, row_shape, dtype, even)
                    calls[id(g)] += 1
                    chk.case(f"{gname} {dtype} {layout} {row_shape}", torch.equal(out, want),
                             f"{out.flatten()[:8]} vs {want.flatten()[:8]}")
                    if gname == "world" and dtype in (torch.float32, torch.int64, torch.bool):
                        ref_out = torch.full_like(want, 1)

                        def run_gloo():
                            inp = torch.cat([_block(rank, d, splits[rank][d], row_shape, dtype)
                                             for d in range(W)])
                            dist.all_to_all_single(ref_out, inp,
                                                   [splits[s][rank] for s in range(W)],
                                                   splits[rank], group=ctx.gloo)

                        ok = gloo_ok(run_gloo)
                        if ok:
                            chk.case(f"gloo {dtype} {layout} {row_shape}",
                                     torch.equal(out, ref_out), "differs from Gloo")
    for g, gname in ((world, "world"), (small, "small"), (chunked, "chunked")):
        c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
        chk.case(f"{gname} counters", c.get("all_to_all_single.direct") == calls[id(g)]
                 and not wrapped(c), f"expected all_to_all_single.direct={calls[id(g)]}, got {c}")
        read = c.get("all_to_all_single.cross_memory", 0)
        if gname != "world":  # the world's buffer holds every case in one round
            chk.case(f"{gname} cross-memory", (read > 0) == (gname == "chunked"),
                     f"all_to_all_single.cross_memory={read}")
    # A non-contiguous input and output, and a 1-D tensor with even splits.
    splits = _splits("uneven", W, seed=1)
    inp = torch.cat([_block(rank, d, splits[rank][d], (4,), torch.float32, 1) for d in range(W)])
    want = torch.cat([_block(s, rank, splits[s][rank], (4,), torch.float32, 1) for s in range(W)])
    inp_nc = inp.t().contiguous().t()
    out_base = torch.zeros(4, want.shape[0])
    out_nc = out_base.t()
    dist.all_to_all_single(out_nc, inp_nc, [splits[s][rank] for s in range(W)], splits[rank])
    chk.case("non-contiguous", torch.equal(out_nc, want), f"{out_nc[:2]} vs {want[:2]}")
    flat_in = torch.arange(W * 5, dtype=torch.float64) + 100 * rank
    flat_out = torch.empty(W * 5, dtype=torch.float64)
    dist.all_to_all_single(flat_out, flat_in)
    want = torch.cat([torch.arange(5, dtype=torch.float64) + 5 * rank + 100 * s for s in range(W)])
    chk.case("1-D even", torch.equal(flat_out, want), f"{flat_out} vs {want}")
    # Async: a completed Work whose future holds the output.
    out = torch.empty(W * 2)
    work = dist.all_to_all_single(out, torch.full((W * 2,), float(rank)), async_op=True)
    work.wait()
    chk.case("async", work.is_completed() and torch.equal(
        out, torch.arange(W, dtype=torch.float32).repeat_interleave(2)), f"{out}")
    return chk.result()


def check_list(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all W={W}")
    small = cached_group("a2a-small", buffer_size=SMALL_BUFFER, chunk_bytes=0)
    for g, gname in ((dist.group.WORLD, "world"), (small, "small")):
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        n = 0
        for dtype in (torch.float32, torch.int64, torch.float16, torch.uint8):
            for layout in ("even", "uneven", "zero_rows", "rounds"):
                splits = _splits(layout, W)
                ins = [_block(rank, d, splits[rank][d], (2,), dtype) for d in range(W)]
                want = [_block(s, rank, splits[s][rank], (2,), dtype) for s in range(W)]
                outs = [torch.full_like(x, 1) for x in want]
                dist.all_to_all(outs, ins, group=g)
                n += 1
                chk.case(f"{gname} {dtype} {layout}", all(torch.equal(o, x)
                                                         for o, x in zip(outs, want)),
                         f"{[o.flatten()[:4] for o in outs]}")
        c = b.get_counters()
        chk.case(f"{gname} counters", c.get("all_to_all.direct") == n and not wrapped(c),
                 f"{c}")
    return chk.result()


def check_v(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all_v W={W}")
    small = cached_group("a2a-small", buffer_size=SMALL_BUFFER, chunk_bytes=0)
    off = cached_group("a2a-off", enable_workspace=False)
    for g, gname, key in ((dist.group.WORLD, "world", "all_to_all_v.direct"),
                          (small, "small", "all_to_all_v.direct"),
                          (off, "off", "all_to_all_v.wrapped")):
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        n = 0
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for layout in ("uneven", "zero_rows", "all_zero", "rounds"):
                # Only the senders know: the receivers are never told their counts.
                splits = _splits(layout, W, seed=2)
                inp = torch.cat([_block(rank, d, splits[rank][d], (3,), dtype, 2)
                                 for d in range(W)])
                out, got = cuda_p2p.all_to_all_v(inp, splits[rank], group=g)
                n += 1
                want = torch.cat([_block(s, rank, splits[s][rank], (3,), dtype, 2)
                                  for s in range(W)])
                chk.case(f"{gname} {dtype} {layout}", torch.equal(out, want)
                         and got == [splits[s][rank] for s in range(W)],
                         f"splits {got}, shape {tuple(out.shape)} vs {tuple(want.shape)}")
        c = b.get_counters()
        chk.case(f"{gname} counters", c.get(key) == n, f"expected {key}={n}, got {c}")
    # An MoE dispatch and combine: tokens to experts by a routing only the sender knows, back.
    torch.manual_seed(rank)
    tokens = torch.randn(37, 8)
    dest = torch.randint(0, W, (37,))
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=W).tolist()
    recv, recv_counts = cuda_p2p.all_to_all_v(tokens[order], counts)
    back, back_counts = cuda_p2p.all_to_all_v(recv * 2, recv_counts)
    restored = torch.empty_like(tokens)
    restored[order] = back
    chk.case("dispatch/combine", back_counts == counts and torch.equal(restored, tokens * 2),
             f"{back_counts} vs {counts}")
    # Errors, before any communication.
    for bad, needle, kind in (
        (lambda: cuda_p2p.all_to_all_v(torch.ones(3, 2), [1] * (W + 1)), f"expected {W} input",
         ValueError),
        (lambda: cuda_p2p.all_to_all_v(torch.ones(3, 2), [3] + [1] * (W - 1)), "sum to",
         RuntimeError),
        (lambda: cuda_p2p.all_to_all_v(torch.ones(3, 2), [-1] + [0] * (W - 2) + [4]), ">= 0",
         RuntimeError),
        (lambda: cuda_p2p.all_to_all_v(torch.tensor(1.0), [0] * W), "at least one dimension",
         RuntimeError),
    ):
        try:
            bad()
            chk.case(needle, False, "accepted")
        except kind as e:
            chk.case(needle, needle in str(e), str(e))
    return chk.result()


def _heap_copy(t, g):
    """`t` copied into a tensor of `g`'s symmetric heap (cuda_p2p.empty)."""
    return cuda_p2p.empty(*t.shape, dtype=t.dtype, group=g).copy_(t)


def check_zero_copy(ctx):
    """NOTE [All-to-all zero-copy]: a sender whose input is in its symmetric heap stages nothing and
    its peers read it there; each sender decides for itself, so heap and ordinary inputs mix."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all zero-copy W={W}")
    # A small buffer, so that the staged senders of "rounds" need several phases.
    groups = {"exchange": cached_group("a2a-heap", buffer_size=SMALL_BUFFER, chunk_bytes=0),
              "signature": cached_group("a2a-heap-sig", buffer_size=SMALL_BUFFER, chunk_bytes=0,
                                        zero_copy_agreement="signature"),
              "cross-memory": cached_group("a2a-heap-cma", buffer_size=SMALL_BUFFER,
                                        chunk_bytes=4096, cross_memory=True,
                                        cross_memory_min_bytes=0),
              "off": cached_group("a2a-heap-off", buffer_size=SMALL_BUFFER, chunk_bytes=0,
                                  zero_copy_agreement="off")}
    for gname, g in groups.items():
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        calls = zero_copy = 0
        # Who sends from its heap: everybody, every other rank, nobody.
        for who in ("all", "even", "none"):
            heap_rank = who == "all" or (who == "even" and rank % 2 == 0)
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                for layout in ("even", "uneven", "zero_rows", "all_zero", "rounds"):
                    splits = _splits(layout, W, seed=4)
                    inp = torch.cat([_block(rank, d, splits[rank][d], (3,), dtype, 4)
                                     for d in range(W)])
                    if heap_rank:
                        inp = _heap_copy(inp, g)
                    want = torch.cat([_block(s, rank, splits[s][rank], (3,), dtype, 4)
                                      for s in range(W)])
                    out = torch.full_like(want, 1)
                    dist.all_to_all_single(out, inp, [splits[s][rank] for s in range(W)],
                                           splits[rank], group=g)
                    calls += 1
                    # Counted when every rank that sends a peer anything sends from its heap.
                    senders = [s for s in range(W) if any(splits[s][d] for d in range(W)
                                                          if d != s)]
                    zero_copy += gname != "off" and bool(senders) and all(
                        who == "all" or (who == "even" and s % 2 == 0) for s in senders)
                    chk.case(f"{gname} {who} {dtype} {layout}", torch.equal(out, want),
                             f"{out.flatten()[:6]} vs {want.flatten()[:6]}")
        c = b.get_counters()
        chk.case(f"{gname} counters", c.get("all_to_all_single.direct") == calls
                 and c.get("all_to_all_single.zero_copy", 0) == zero_copy and not wrapped(c),
                 f"expected all_to_all_single.direct={calls}, .zero_copy={zero_copy}, got {c}")
    g = groups["exchange"]
    b = cuda_p2p.get_cuda_p2p_backend(g)
    # The caller overwrites its heap input as soon as the op returns: its peers must have read it.
    splits = _splits("rounds", W, seed=5)
    buf = cuda_p2p.empty(sum(splits[rank]), 3, group=g)
    for it in range(20):
        buf.copy_(torch.cat([_block(rank, d, splits[rank][d], (3,), torch.float32, it)
                             for d in range(W)]))
        want = torch.cat([_block(s, rank, splits[s][rank], (3,), torch.float32, it)
                          for s in range(W)])
        out = torch.empty_like(want)
        dist.all_to_all_single(out, buf, [splits[s][rank] for s in range(W)], splits[rank],
                               group=g)
        buf.fill_(-1)
        chk.case(f"overwritten after return {it}", torch.equal(out, want), f"{out.flatten()[:6]}")
    # The input is its own output (in the heap): cloned before the op, so staged; still right.
    x = _heap_copy(torch.cat([_block(rank, d, 3, (2,), torch.int64) for d in range(W)]), g)
    before = b.get_counters().get("all_to_all_single.zero_copy", 0)
    dist.all_to_all_single(x, x, group=g)
    want = torch.cat([_block(s, rank, 3, (2,), torch.int64) for s in range(W)])
    chk.case("in place on itself", torch.equal(x, want)
             and b.get_counters().get("all_to_all_single.zero_copy", 0) == before, f"{x[:2]}")
    # The list all_to_all (one heap tensor per destination) and all_to_all_v.
    b.reset_counters()
    splits = _splits("uneven", W, seed=6)
    ins = [_heap_copy(_block(rank, d, splits[rank][d], (2,), torch.float16, 6), g)
           for d in range(W)]
    want = [_block(s, rank, splits[s][rank], (2,), torch.float16, 6) for s in range(W)]
    outs = [torch.empty_like(x) for x in want]
    dist.all_to_all(outs, ins, group=g)
    chk.case("list", all(torch.equal(o, x) for o, x in zip(outs, want)), f"{outs[0][:2]}")
    inp = _heap_copy(torch.cat([_block(rank, d, splits[rank][d], (5,), torch.int32, 7)
                                for d in range(W)]), g)
    out, got = cuda_p2p.all_to_all_v(inp, splits[rank], group=g)
    want = torch.cat([_block(s, rank, splits[s][rank], (5,), torch.int32, 7) for s in range(W)])
    chk.case("all_to_all_v", torch.equal(out, want) and got == [splits[s][rank] for s in range(W)],
             f"{got}")
    c = b.get_counters()
    chk.case("list and v counters", c.get("all_to_all.zero_copy") == 1
             and c.get("all_to_all_v.zero_copy") == 1, f"{c}")
    return chk.result()


def _usable(ctx, chk, what):
    splits = _splits("uneven", ctx.world_size, seed=3)
    out, want = _single(None, ctx.rank, ctx.world_size, splits, (2,), torch.float32, seed=3)
    chk.case(f"{what}: usable after", torch.equal(out, want), f"{out[:2]} vs {want[:2]}")


def check_mismatches(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all mismatch W={W}")
    b = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    b.reset_counters()
    # Rank 0 expects one row more from rank 1 than rank 1 sends.
    splits = _splits("uneven", W)
    out_splits = [splits[s][rank] for s in range(W)]
    if rank == 0:
        out_splits[1] += 1
    inp = torch.ones(sum(splits[rank]), 2)
    err = raises(lambda: dist.all_to_all_single(torch.empty(sum(out_splits), 2), inp, out_splits,
                                                 splits[rank]))
    n = splits[1][0]
    needle = (f"rank 1 sends {n} rows ({n * 8} bytes) to rank 0, but rank 0 expects {n + 1} rows "
              f"({(n + 1) * 8} bytes) from rank 1")
    chk.case("splits", err is not None and "all_to_all_single: ranks disagree on the split sizes"
             in err and needle in err and "\n" not in err, f"{err!r} (want {needle!r})")
    _usable(ctx, chk, "splits")
    # all_to_all_v: nobody expects anything, so splits cannot disagree; dtypes can.
    dt = torch.float32 if rank == 0 else torch.int32
    err = raises(lambda: cuda_p2p.all_to_all_v(torch.ones(W, 3, dtype=dt), [1] * W))
    chk.case("all_to_all_v dtypes", err is not None and "all_to_all_v: ranks disagree" in err
             and "rank 0 passed rows of 3 x float32" in err
             and "rank 1 passed rows of 3 x int32" in err, f"{err!r}")
    _usable(ctx, chk, "dtypes")
    # Row shapes differ.
    cols = 2 if rank == 0 else 3
    err = raises(lambda: dist.all_to_all_single(torch.empty(W, cols), torch.ones(W, cols)))
    chk.case("row shapes", err is not None and "rank 0 passed rows of 2 x float32" in err
             and "rank 1 passed rows of 3 x float32" in err, f"{err!r}")
    _usable(ctx, chk, "row shapes")
    # A different op on one rank.
    err = raises(lambda: dist.all_to_all_single(torch.empty(W), torch.ones(W)) if rank == 0
                  else dist.all_reduce(torch.ones(W)))
    chk.case("other op", err is not None and "rank 0 passed all_to_all_single" in err, f"{err!r}")
    _usable(ctx, chk, "other op")
    # A rank whose own check fails: its peers raise at once naming it.
    bad = [1] * W if rank != 0 else [2] * W  # rank 0's sum does not match its W rows
    err = raises(lambda: dist.all_to_all_single(torch.empty(W, 2), torch.ones(W, 2), [1] * W,
                                                 bad))
    if rank == 0:
        chk.case("local error", err is not None and "input split sizes sum to" in err
                 and f"but the input has {W}" in err, f"{err!r}")
    else:
        chk.case("peer of local error", err is not None
                 and "rank 0 rejected its arguments" in err, f"{err!r}")
    _usable(ctx, chk, "local error")
    # Bad arguments on every rank: what was expected and what was given.
    for call, needle in (
        (lambda: dist.all_to_all_single(torch.empty(W + 1), torch.ones(W + 1)),
         f"must be a multiple of the world size {W}, got {W + 1}"),
        (lambda: dist.all_to_all_single(torch.empty(W), torch.ones(W), [1] * W, [1] * (W + 1)),
         f"expected {W} input split sizes (one per rank), got {W + 1}"),
        (lambda: dist.all_to_all_single(torch.empty(W, 3), torch.ones(W, 2)),
         "the output's rows must have the input's 2 elements, got 3"),
    ):
        err = raises(call)
        chk.case(needle, err is not None and needle in err, f"{err!r}")
    _usable(ctx, chk, "bad arguments")
    expect_nothing_wrapped(chk, b)
    return chk.result()


def check_wrapped(ctx):
    """The workspace off: all three go to the wrapped Gloo, counted; the results are the same."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_to_all wrapped W={W}")
    off = cached_group("a2a-off", enable_workspace=False)
    b = cuda_p2p.get_cuda_p2p_backend(off)
    b.reset_counters()
    splits = _splits("zero_rows", W)
    out, want = _single(off, rank, W, splits, (3,), torch.float32)
    chk.case("single", torch.equal(out, want), f"{out[:2]}")
    lists = True
    try:
        ins = [torch.full((2,), float(rank * 10 + d)) for d in range(W)]
        outs = [torch.empty(2) for _ in range(W)]
        dist.all_to_all(outs, ins, group=off)
        chk.case("list", all(o.tolist() == [float(s * 10 + rank)] * 2 for s, o in enumerate(outs)),
                 f"{outs}")
    except RuntimeError as e:  # torch 2.11's Gloo has no list all_to_all
        lists = False
        chk.case("list refused by Gloo", "alltoall" in str(e).lower() or "not" in str(e), str(e))
    c = b.get_counters()
    chk.case("counters", c.get("all_to_all_single.wrapped") == 1
             and c.get("all_to_all.wrapped") == (1 if lists else c.get("all_to_all.wrapped"))
             and "all_to_all_single.direct" not in c, f"{c}")
    return chk.result()


def test_all_to_all_single(any_world):
    assert_ok(any_world.run(check_single), min_cases=100)


def test_all_to_all_list(any_world):
    assert_ok(any_world.run(check_list), min_cases=20)


def test_all_to_all_v(any_world):
    assert_ok(any_world.run(check_v), min_cases=30)


def test_all_to_all_zero_copy(any_world):
    assert_ok(any_world.run(check_zero_copy), min_cases=200)


def test_all_to_all_mismatches(any_world):
    assert_ok(any_world.run(check_mismatches), min_cases=10)


def test_all_to_all_wrapped(any_world):
    assert_ok(any_world.run(check_wrapped), min_cases=3)
