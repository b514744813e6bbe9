"""Workspace collectives (issue: collectives) through torch.distributed, on 2, 3 and 4 ranks.

Every algorithm is forced in turn (a group per algorithm, through Options or the environment),
with a 64 KiB buffer so that "exactly one buffer region" and "several regions" stay small, and
run for every dtype x reduce op x size (0, 1, odd, exactly one round, several rounds). Each case
is checked against the plain-torch reference (_reference.py) and, for the dtypes Gloo runs,
against a Gloo group over the same ranks; outputs are slices of larger tensors whose margins
must stay untouched, all-reduce results must be bit-identical on every rank, and the backend's
counters must show that the forced algorithm ran (and that nothing fell back silently).
"""

from __future__ import annotations

import math
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import assert_ok, gloo_ok, raises
from _groups import cached_group
from _harness import HOST_CUDA_SEMANTICS
from _reference import ops_for, reduce_over_ranks

R = dist.ReduceOp
BUFFER = 1 << 16
MARGIN = 16
GUARD = 77

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
}
ALL_GATHER_ALGOS = ("direct", "ring")
# (algorithm, ring steps per rank)
REDUCE_SCATTER_ALGOS = (("direct", 1), ("ring", 1), ("ring", 2))
ALL_REDUCE_ALGOS = ("one_shot", "two_shot")


# ---------------------------------------------------------------------------------------------
# rank side: groups, inputs, references

def _group_forcing(ctx, read=False, **algos):
    """A group forcing `algos`. read=False: the staged paths (cross-memory reads off); read=True:
    cross-memory reads at every size (they must be available on this machine)."""
    steps = algos.pop("ring_steps_per_rank", 1)
    key = tuple(sorted(algos.items())) + (("steps", steps), ("read", read))
    return cached_group(key, buffer_size=BUFFER, chunk_bytes=0, ring_steps=steps * ctx.world_size,
                        cross_memory=read, cross_memory_min_bytes=0, **algos)


# Cross-memory reads: a reduce-scatter chunk of several 64 KiB pieces (ops/reduce_scatter.cpp).
READ_PIECES_ELEMS = 3 * (64 << 10) // 4 + 5


def _read_sizes(sizes, read):
    return sorted(set(sizes) | {READ_PIECES_ELEMS}) if read else sizes


def _counters_read_ok(chk, group, key, count, read):
    """With cross-memory reads forced, `key` counts every call and the reads are available."""
    b = cuda_p2p.get_cuda_p2p_backend(group)
    if not read:
        chk.case("counters", key not in b.get_counters(), f"{b.get_counters()}")
        return
    cfg = b.get_collective_config()
    chk.case("cross_memory", cfg["cross_memory"], f"unavailable: {cfg['cross_memory_reason']}")
    chk.case("counters", b.get_counters().get(key, 0) == count,
             f"expected {key}={count}, got {b.get_counters()}")


def _input(seed, rank, n, dtype, op=None):
    """Small integers: exact in every dtype and every summation order (PRODUCT: -2..2)."""
    i = torch.arange(n, dtype=torch.int64)
    if op == "PRODUCT":
        v = (i * 7 + rank * 3 + seed) % 5 - 2
    elif op in ("BAND", "BOR", "BXOR"):
        v = (i * 2654435761 + rank * 40503 + seed * 977) % 251
    else:
        v = (i * 7 + rank * 13 + seed) % 17 - 8
    return v.to(dtype)


def _guarded(n, dtype):
    """(whole, inner): inner is n elements in the middle of `whole`, whose margins hold GUARD."""
    whole = torch.full((n + 2 * MARGIN,), GUARD, dtype=dtype)
    return whole, whole[MARGIN : MARGIN + n]


def _margins_ok(whole):
    g = torch.full((MARGIN,), GUARD, dtype=whole.dtype)
    return torch.equal(whole[:MARGIN], g) and torch.equal(whole[-MARGIN:], g)


def _phase(buf=BUFFER):
    return (buf // 2) // 64 * 64


def _round_bytes(unit, slots=1, buf=BUFFER):
    b = _phase(buf) // slots
    lcm = unit * 64 // math.gcd(unit, 64)
    aligned = b // lcm * lcm
    return aligned if aligned > 0 else b // unit * unit


def _sizes(round_elems):
    """0, 1, odd, exactly one round (one buffer region), several rounds."""
    return sorted({0, 1, 7, round_elems, 3 * round_elems + 5})


class Checker:
    def __init__(self, label):
        self.label, self.cases, self.failures = label, 0, []

    def case(self, what, ok, detail=""):
        if not ok:
            self.failures.append(f"{self.label} {what}: {detail}")

    def result(self):
        return {"cases": self.cases, "failures": self.failures}


def _counters_ok(chk, group, want_key, want_count):
    counters = cuda_p2p.get_cuda_p2p_backend(group).get_counters()
    wrapped = {k: v for k, v in counters.items() if k.endswith(".wrapped")}
    chk.case("counters", counters.get(want_key, 0) == want_count and not wrapped,
             f"expected {want_key}={want_count} and no fallback, got {counters}")


# ---------------------------------------------------------------------------------------------
# rank side: the checks


def check_all_gather(ctx, algo, read=False):
    W, rank = ctx.world_size, ctx.rank
    g = _group_forcing(ctx, read, all_gather_algo=algo)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    chk = Checker(f"all_gather[{algo}{', read' if read else ''}] W={W}")
    count = zero = 0
    for name, dtype in DTYPES.items():
        esize = torch.empty((), dtype=dtype).element_size()
        slots = 1 if algo == "direct" else W
        for n in _read_sizes(_sizes(_round_bytes(1, slots) // esize), read):
            try:
                seed = n + 3
                x = _input(seed, rank, n, dtype)
                whole, out = _guarded(n * W, dtype)
                dist.all_gather_into_tensor(out, x, group=g)
                ref = torch.empty(n * W, dtype=dtype)
                gloo_ran = gloo_ok(lambda: dist.all_gather_into_tensor(ref, x, group=ctx.gloo))
                want = torch.cat([_input(seed, r, n, dtype) for r in range(W)])
                chk.case(f"{name} n={n}", torch.equal(out, want), "differs from local math")
                if gloo_ran:
                    chk.case(f"{name} n={n}", torch.equal(out, ref), "differs from gloo")
                chk.case(f"{name} n={n}", _margins_ok(whole), "margins overwritten")
                # The list form, into separate tensors.
                outs = [torch.full((n,), GUARD, dtype=dtype) for _ in range(W)]
                dist.all_gather(outs, x, group=g)
                chk.case(f"{name} n={n} list", torch.equal(torch.cat(outs), want), "differs")
                # In place: the input is the output's own chunk (peers read it while this rank
                # writes the others).
                if n > 0:
                    inplace = torch.full((n * W,), GUARD, dtype=dtype)
                    inplace[rank * n : (rank + 1) * n].copy_(x)
                    dist.all_gather_into_tensor(inplace, inplace[rank * n : (rank + 1) * n],
                                                group=g)
                    chk.case(f"{name} n={n} in place", torch.equal(inplace, want), "differs")
                    count += 1
                    chk.cases += 1
                count += 2
                zero += 2 if n == 0 else 0
                chk.cases += 2
            except Exception as e:  # noqa: BLE001
                chk.case(f"{name} n={n}", False, f"raised {e!r}\n{traceback.format_exc()}")
                return chk.result()
    _counters_ok(chk, g, f"all_gather.{algo}", count)
    _counters_read_ok(chk, g, "all_gather.cross_memory", count - zero, read and algo == "direct")
    return chk.result()


def check_reduce_scatter(ctx, algo, steps_per_rank, read=False):
    W, rank = ctx.world_size, ctx.rank
    g = _group_forcing(ctx, read, reduce_scatter_algo=algo, ring_steps_per_rank=steps_per_rank)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk = Checker(f"reduce_scatter[{algo}, S={steps_per_rank * W}{', read' if read else ''}] "
                  f"W={W}")
    count = 0
    for name, dtype in DTYPES.items():
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        unit = torch.empty((), dtype=acc if algo == "ring" else dtype).element_size()
        for op in ops_for(dtype):
            for n in _read_sizes(_sizes(_round_bytes(unit, W) // unit), read):
                try:
                    seed = n + 31 * ops_for(dtype).index(op)
                    x = _input(seed, rank, n * W, dtype, op)
                    x_copy = x.clone()
                    whole, out = _guarded(n, dtype)
                    dist.reduce_scatter_tensor(out, x, op=getattr(R, op), group=g)
                    want = reduce_over_ranks(
                        op, [_input(seed, r, n * W, dtype, op)[rank * n : (rank + 1) * n]
                             for r in range(W)])
                    label = f"{name} {op} n={n}"
                    chk.case(label, torch.equal(out, want),
                             f"differs from local math: {out[:4]} vs {want[:4]}")
                    chk.case(label, torch.equal(x, x_copy), "changed its input")
                    chk.case(label, _margins_ok(whole), "margins overwritten")
                    ref = torch.empty(n, dtype=dtype)
                    if gloo_ok(lambda: dist.reduce_scatter_tensor(ref, x, op=getattr(R, op),
                                                                group=ctx.gloo)):
                        chk.case(label, torch.equal(out, ref), "differs from gloo")
                    count += 1
                    chk.cases += 1
                except Exception as e:  # noqa: BLE001
                    chk.case(f"{name} {op} n={n}", False,
                             f"raised {e!r}\n{traceback.format_exc()}")
                    return chk.result()
    # The list form once per dtype family.
    for dtype in (torch.float32, torch.int64):
        n = 13
        chunks = [_input(5 + j, rank, n, dtype) for j in range(W)]
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, chunks, group=g)
        want = reduce_over_ranks("SUM", [_input(5 + rank, r, n, dtype) for r in range(W)])
        chk.case(f"list form {dtype}", torch.equal(out, want), f"{out} vs {want}")
        count += 1
        chk.cases += 1
    _counters_ok(chk, g, f"reduce_scatter.{algo}", count)
    # n = 0 returns before choosing a path.
    zero = sum(len(ops_for(d)) for d in DTYPES.values())
    _counters_read_ok(chk, g, "reduce_scatter.cross_memory", count - zero,
                      read and algo == "direct")
    return chk.result()


def check_all_reduce(ctx, algo):
    W, rank = ctx.world_size, ctx.rank
    g = _group_forcing(ctx, all_reduce_algo=algo)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk = Checker(f"all_reduce[{algo}] W={W}")
    count = 0
    for name, dtype in DTYPES.items():
        esize = torch.empty((), dtype=dtype).element_size()
        if algo == "one_shot":
            round_elems = _round_bytes(esize) // esize
        else:
            round_elems = (_phase() - 128) // esize * W // (W + 1)
        for op in ops_for(dtype):
            for n in _sizes(round_elems):
                try:
                    seed = n + 17 * ops_for(dtype).index(op)
                    whole, t = _guarded(n, dtype)
                    t.copy_(_input(seed, rank, n, dtype, op))
                    dist.all_reduce(t, op=getattr(R, op), group=g)
                    want = reduce_over_ranks(op, [_input(seed, r, n, dtype, op) for r in range(W)])
                    label = f"{name} {op} n={n}"
                    chk.case(label, torch.equal(t, want),
                             f"differs from local math: {t[:4]} vs {want[:4]}")
                    chk.case(label, _margins_ok(whole), "margins overwritten")
                    ref = _input(seed, rank, n, dtype, op)
                    if gloo_ok(lambda: dist.all_reduce(ref, op=getattr(R, op), group=ctx.gloo)):
                        chk.case(label, torch.equal(t, ref), "differs from gloo")
                    count += 1
                    chk.cases += 1
                except Exception as e:  # noqa: BLE001
                    chk.case(f"{name} {op} n={n}", False,
                             f"raised {e!r}\n{traceback.format_exc()}")
                    return chk.result()
    # Random values: rounding now depends on the order of the additions. Every rank must hold
    # the same bits, close to Gloo's.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for op in ("SUM", "AVG"):
            gen = torch.Generator().manual_seed(1000 + rank)
            t = (torch.randn(3001, generator=gen) * 3).to(dtype)
            ref = t.clone()
            dist.all_reduce(t, op=getattr(R, op), group=g)
            dist.all_reduce(ref, op=getattr(R, op), group=ctx.gloo)
            gathered = [torch.empty_like(t) for _ in range(W)]
            dist.all_gather(gathered, t, group=ctx.gloo)
            label = f"random {dtype} {op}"
            bits = torch.int16 if t.element_size() == 2 else torch.int32
            chk.case(label, all(torch.equal(x.view(bits), t.view(bits)) for x in gathered),
                     "results differ between ranks")
            tol = (dict(rtol=2e-2, atol=0.15) if dtype != torch.float32
                   else dict(rtol=1e-5, atol=1e-4))
            chk.case(label, torch.allclose(t.float(), ref.float(), **tol), "far from gloo")
            count += 1
            chk.cases += 1
    _counters_ok(chk, g, f"all_reduce.{algo}", count)
    return chk.result()


def check_broadcast(ctx, read=False):
    W, rank = ctx.world_size, ctx.rank
    g = _group_forcing(ctx, read)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    chk = Checker(f"broadcast{'[read]' if read else ''} W={W}")
    count = zero = 0
    for name in ("float32", "bfloat16", "int8", "int64"):
        dtype = DTYPES[name]
        esize = torch.empty((), dtype=dtype).element_size()
        for root in range(W):
            for n in _read_sizes(_sizes(_round_bytes(1) // esize), read):
                zero += n == 0
                whole, t = _guarded(n, dtype)
                t.copy_(_input(root * 100 + n, rank, n, dtype))
                dist.broadcast(t, src=root, group=g)
                ref = _input(root * 100 + n, rank, n, dtype)
                dist.broadcast(ref, src=root, group=ctx.gloo)
                want = _input(root * 100 + n, root, n, dtype)
                label = f"{name} root={root} n={n}"
                chk.case(label, torch.equal(t, want) and torch.equal(t, ref), "differs")
                chk.case(label, _margins_ok(whole), "margins overwritten")
                count += 1
                chk.cases += 1
    _counters_ok(chk, g, "broadcast.direct", count)
    _counters_read_ok(chk, g, "broadcast.cross_memory", count - zero, read)
    return chk.result()


def check_copy_free_fallback(ctx):
    """Cross-memory reads: 'auto' takes them from cross_memory_min_bytes on; a probe that fails on
    one rank only (the test hook makes that rank's reads fail with EPERM), either knob or the
    default (off) leaves them off on every rank, with the reason, and the collectives stage
    (same results)."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"cross-memory fallback W={W}")
    deny = {"CUDA_P2P_TEST_DENY_CROSS_MEMORY": "1"} if rank == W - 1 else {}
    groups = {
        "auto": (cached_group("read-auto", buffer_size=BUFFER, cross_memory=True), None),
        "env-on": (cached_group("read-env-on", env={"CUDA_P2P_CROSS_MEMORY": "1"},
                                buffer_size=BUFFER), None),
        "default": (cached_group("read-default", buffer_size=BUFFER), "off by default"),
        "denied": (cached_group("read-denied", env=deny, buffer_size=BUFFER, cross_memory=True,
                           cross_memory_min_bytes=0),
                   f"rank {W - 1} cannot read rank"),
        "env": (cached_group("read-env", env={"CUDA_P2P_CROSS_MEMORY": "0"}, buffer_size=BUFFER,
                       cross_memory_min_bytes=0), "CUDA_P2P_CROSS_MEMORY=0"),
        "option": (cached_group("read-option", buffer_size=BUFFER, cross_memory=False,
                          cross_memory_min_bytes=0), "Options.cross_memory = False"),
    }
    for key, (g, reason) in groups.items():
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        cfg = b.get_collective_config()
        if reason is None:
            chk.case(key, cfg["cross_memory"] and cfg["cross_memory_reason"] == ""
                     and cfg["cross_memory_min_bytes"] == 64 << 10, f"{cfg}")
        else:
            chk.case(key, not cfg["cross_memory"] and reason in cfg["cross_memory_reason"],
                     f"{cfg}")
        for n in (5, 40000):  # per rank, float32: below and above the default threshold
            x = _input(n, rank, n * W, torch.float32)
            out = torch.empty(n * W * W)
            dist.all_gather_into_tensor(out, x, group=g)
            want = torch.cat([_input(n, r, n * W, torch.float32) for r in range(W)])
            chk.case(f"{key} all_gather n={n}", torch.equal(out, want), "differs")
            rs = torch.empty(n)
            dist.reduce_scatter_tensor(rs, x, group=g)
            want = reduce_over_ranks(
                "SUM", [_input(n, r, n * W, torch.float32)[rank * n:(rank + 1) * n]
                        for r in range(W)])
            chk.case(f"{key} reduce_scatter n={n}", torch.equal(rs, want), "differs")
            t = x.clone()
            dist.broadcast(t, src=W - 1, group=g)
            chk.case(f"{key} broadcast n={n}",
                     torch.equal(t, _input(n, W - 1, n * W, torch.float32)), "differs")
            chk.cases += 3
        c = b.get_counters()
        reads = {k: v for k, v in c.items() if k.endswith(".cross_memory")}
        if reason is None:
            # The large size only, and 'auto' chose direct over the rings for it.
            chk.case(f"{key} counters", reads == {"all_gather.cross_memory": 1,
                                                  "reduce_scatter.cross_memory": 1,
                                                  "broadcast.cross_memory": 1}
                     and c.get("all_gather.direct", 0) >= 1, f"{c}")
        else:
            chk.case(f"{key} counters", not reads, f"{c}")
    return chk.result()


def check_all_gather_v(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"all_gather_v W={W}")
    on = _group_forcing(ctx)
    off = cached_group("off", enable_workspace=False)
    row = 2 * 3 * 4  # bytes per row of float32 [.., 2, 3]
    region_rows = _phase() // row
    layouts = [
        [0] * W,
        [3 * r + 1 for r in range(W)],
        [region_rows if r % 2 else 0 for r in range(W)],
        [3 * region_rows + 7 if r == 0 else r for r in range(W)],
    ]
    for group, key in ((on, "all_gather_v.direct"), (off, "all_gather_v.wrapped")):
        b = cuda_p2p.get_cuda_p2p_backend(group)
        b.reset_counters()
        for li, sizes in enumerate(layouts):
            mine = _input(li, rank, sizes[rank] * 6, torch.float32).view(sizes[rank], 2, 3)
            out = cuda_p2p.all_gather_v(mine, sizes, group=group)
            want = torch.cat([_input(li, r, sizes[r] * 6, torch.float32).view(sizes[r], 2, 3)
                              for r in range(W)])
            chk.case(f"{key} layout {li}", out.shape == want.shape and torch.equal(out, want),
                     f"shape {tuple(out.shape)} vs {tuple(want.shape)}")
            chk.cases += 1
        chk.case(key, b.get_counters().get(key) == len(layouts), f"counters {b.get_counters()}")
    # bfloat16 rows of one element, non-contiguous input
    t = torch.arange(2 * (rank + 1), dtype=torch.bfloat16).view(2, rank + 1).t()
    out = cuda_p2p.all_gather_v(t, [r + 1 for r in range(W)], group=on)
    want = torch.cat([torch.arange(2 * (r + 1), dtype=torch.bfloat16).view(2, r + 1).t()
                      for r in range(W)])
    chk.case("non-contiguous", torch.equal(out, want), f"{out} vs {want}")
    chk.cases += 1
    # Errors, raised on every rank before any communication.
    for bad, needle in (
        (lambda: cuda_p2p.all_gather_v(mine, [1] * (W + 1), group=on), f"expected {W} sizes"),
        (lambda: cuda_p2p.all_gather_v(torch.ones(rank + 2, 2), [r + 1 for r in range(W)],
                                       group=on), "rows, but sizes"),
        (lambda: cuda_p2p.all_gather_v(torch.tensor(1.0), [1] * W, group=on), "at least one"),
    ):
        try:
            bad()
            chk.case(needle, False, "accepted")
        except (ValueError, RuntimeError) as e:
            chk.case(needle, needle in str(e), str(e))
    return chk.result()


def check_api_and_fallbacks(ctx):
    """The dist.* surface: async works and futures, non-contiguous tensors, barrier, fallbacks
    for what the workspace does not run, the off switches, and errors like Gloo's."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"api W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    # Async works: completed, wait() is True, the future holds the outputs.
    t = torch.full((5,), float(rank))
    w = dist.all_reduce(t, async_op=True)
    v = w.get_future().wait()
    chk.case("async all_reduce", w.is_completed() and w.wait() and v[0] is not None
             and torch.equal(v[0], t) and torch.equal(t, torch.full((5,), W * (W - 1) / 2)), "")
    out = torch.empty(3 * W)
    w = dist.all_gather_into_tensor(out, torch.full((3,), float(rank)), async_op=True)
    w.wait()
    chk.case("async all_gather_into_tensor", torch.equal(torch.cat(w.get_future().wait()), out), "")
    rs = torch.empty(2)
    w = dist.reduce_scatter_tensor(rs, torch.ones(2 * W), async_op=True)
    chk.case("async reduce_scatter_tensor", w.wait() and torch.equal(w.get_future().wait()[0], rs)
             and torch.equal(rs, torch.full((2,), float(W))), f"{rs}")
    # then() callbacks (what DDP comm hooks do).
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    chk.case("future.then", torch.equal(fut.wait(), torch.full((4,), 2.0 * W)), "")
    # Non-contiguous tensors go through the workspace via contiguous copies.
    base = torch.zeros(4, 3)
    col = base[:, 1]
    col.fill_(float(rank + 1))
    dist.all_reduce(col)
    chk.case("non-contiguous all_reduce", torch.equal(base[:, 1], torch.full((4,), W * (W + 1) / 2))
             and torch.equal(base[:, 0], torch.zeros(4)), f"{base}")
    gathered = torch.zeros(3, 2 * W).t()  # non-contiguous output
    dist.all_gather_into_tensor(gathered, torch.full((2, 3), float(rank)))
    chk.case("non-contiguous all_gather output",
             torch.equal(gathered,
                         torch.arange(W).repeat_interleave(2)[:, None].float().expand(2 * W, 3)),
             f"{gathered}")
    dist.barrier()
    counters = b.get_counters()
    chk.case("workspace counters", counters.get("barrier.workspace") == 1
             and counters.get("all_reduce.one_shot", 0) >= 3
             and not any(k.endswith(".wrapped") for k in counters), f"{counters}")
    # What the workspace does not run goes to Gloo, counted.
    b.reset_counters()
    flags = torch.tensor([rank % 2 == 0, True, False])
    ref = flags.clone()
    dist.all_reduce(flags)
    dist.all_reduce(ref, group=ctx.gloo)
    chk.case("bool all_reduce falls back", torch.equal(flags, ref)
             and b.get_counters().get("all_reduce.wrapped") == 1, f"{b.get_counters()}")
    z = torch.full((3,), complex(rank, 1))
    dist.all_reduce(z)
    # (torch.distributed hands complex sums over as a float32 view: the workspace runs them.)
    chk.case("complex all_reduce", torch.allclose(z, torch.full((3,), complex(W * (W - 1) / 2, W)))
             and b.get_counters().get("all_reduce.one_shot") == 1, f"{b.get_counters()}")
    # Errors of the same type as Gloo's, on every rank, and the group still works afterwards.
    for what, call in (
        ("AVG on int64",
         lambda grp: dist.all_reduce(torch.ones(3, dtype=torch.int64), op=R.AVG, group=grp)),
        ("BAND on float", lambda grp: dist.all_reduce(torch.ones(3), op=R.BAND, group=grp)),
        ("PREMUL_SUM", lambda grp: dist.all_reduce(
            torch.ones(3), op=dist._make_nccl_premul_sum(2.0), group=grp)),
        ("all_gather_into_tensor wrong size",
         lambda grp: dist.all_gather_into_tensor(torch.empty(3 * W + 1), torch.ones(3), group=grp)),
    ):
        errs = []
        for grp in (ctx.gloo, g):
            try:
                call(grp)
                errs.append(None)
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        chk.case(what, errs[0] is not None and errs[1] is not None
                 and type(errs[0]) is type(errs[1]), f"gloo {errs[0]!r}, cuda_p2p {errs[1]!r}")
        chk.cases += 1
    t = torch.ones(3)
    dist.all_reduce(t)
    chk.case("still works", torch.equal(t, torch.full((3,), float(W))), f"{t}")
    # The off switches: Options.enable_workspace=False, CUDA_P2P_DISABLE_WORKSPACE=1 (no
    # workspace at all), Options.workspace_collectives=False, CUDA_P2P_WORKSPACE_COLLECTIVES=0
    # (the workspace stays up, the collectives go to Gloo).
    for key, grp in (("option", cached_group("off", enable_workspace=False)),
                     ("env", cached_group("env-off", env={"CUDA_P2P_DISABLE_WORKSPACE": "1"})),
                     ("collectives option", cached_group("coll-off", workspace_collectives=False)),
                     ("collectives env",
                      cached_group("coll-env-off", env={"CUDA_P2P_WORKSPACE_COLLECTIVES": "0"}))):
        bb = cuda_p2p.get_cuda_p2p_backend(grp)
        bb.reset_counters()
        t = torch.full((6,), float(rank))
        dist.all_reduce(t, group=grp)
        out = torch.empty(2 * W)
        dist.all_gather_into_tensor(out, torch.full((2,), float(rank)), group=grp)
        rs = torch.empty(2)
        dist.reduce_scatter_tensor(rs, torch.ones(2 * W), group=grp)
        dist.broadcast(t, src=0, group=grp)
        dist.barrier(group=grp)
        c = bb.get_counters()
        chk.case(f"workspace off by {key}", bb.is_p2p_available() == key.startswith("collectives")
                 and bb.get_collective_config()["workspace_collectives"] is False
                 and c == {"all_reduce.wrapped": 1, "all_gather.wrapped": 1,
                           "reduce_scatter.wrapped": 1, "broadcast.wrapped": 1,
                           "barrier.wrapped": 1}, f"{c}")
        chk.case(f"workspace off by {key}: values",
                 torch.equal(t, torch.full((6,), W * (W - 1) / 2))
                 and torch.equal(rs, torch.full((2,), float(W))), "")
        chk.cases += 1
    chk.cases += 10
    return chk.result()


def _opts(name, async_op, **fields):
    o = getattr(torch._C._distributed_c10d, name)()
    o.asyncOp = async_op
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _call_each_collective(pg, W, rank, async_op):
    """Each workspace collective called on ProcessGroup `pg` as torch.distributed's Python API
    calls it, with the options' asyncOp set: {name: (what it returned, its output)}."""
    out = {}
    t = torch.arange(6.0) + rank
    out["allreduce"] = (pg.allreduce([t], _opts("AllreduceOptions", async_op)), t)
    t = torch.arange(5.0) * (rank + 1)
    out["broadcast"] = (pg.broadcast([t], _opts("BroadcastOptions", async_op, rootRank=W - 1)), t)
    o = torch.empty(3 * W)
    out["_allgather_base"] = (
        pg._allgather_base(o, torch.full((3,), float(rank)), _opts("AllgatherOptions", async_op)),
        o)
    lst = [torch.empty(2) for _ in range(W)]
    out["allgather"] = (pg.allgather([lst], [torch.full((2,), rank + 0.5)],
                                     _opts("AllgatherOptions", async_op)), lst)
    o = torch.empty(2)
    out["_reduce_scatter_base"] = (
        pg._reduce_scatter_base(o, torch.arange(2.0 * W) * (rank + 1),
                                _opts("ReduceScatterOptions", async_op)), o)
    o = torch.empty(3)
    out["reduce_scatter"] = (
        pg.reduce_scatter([o], [[torch.full((3,), float(rank + q)) for q in range(W)]],
                          _opts("ReduceScatterOptions", async_op)), o)
    out["barrier"] = (pg.barrier(_opts("BarrierOptions", async_op)), None)
    return out


def check_sync_calls_return_no_work(ctx):
    """NOTE [No Work for a synchronous call]: on the host a synchronous workspace collective
    returns no Work (torch.distributed then skips a wait it does not need) and an async one a
    completed Work, with Gloo's values either way; the callers that need a Work still get one
    (allow_inflight_collective_as_graph_input, functional collectives, the profiler's boxing)."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"no Work W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    ref = _call_each_collective(ctx.gloo, W, rank, False)
    for w, _ in ref.values():
        w.wait()
    for async_op in (False, True):
        got = _call_each_collective(g, W, rank, async_op)
        for name, (w, out) in got.items():
            chk.cases += 1
            if async_op:
                chk.case(f"{name} async: a completed Work", w is not None and w.wait()
                         and w.is_completed(), f"{w!r}")
            elif HOST_CUDA_SEMANTICS:  # queued, as on a GPU: the caller waits
                chk.case(f"{name} sync: a Work", w is not None and w.wait(), f"{w!r}")
            else:
                chk.case(f"{name} sync: no Work", w is None, f"{w!r}")
            want = ref[name][1]
            if isinstance(out, list):
                out, want = torch.cat(out), torch.cat(want)
            chk.case(f"{name} async={async_op}: Gloo's values",
                     out is None or torch.equal(out, want), f"{out} vs {want}")
    counters = b.get_counters()
    chk.case("all on the workspace", counters.get("barrier.workspace") == 2
             and not any(k.endswith(".wrapped") for k in counters), f"{counters}")
    # torch's inflight-collective registry keeps the Work of every call for wait_tensor.
    from torch.distributed._functional_collectives import (
        all_reduce as funcol_all_reduce,
        allow_inflight_collective_as_graph_input_ctx,
    )
    t = torch.full((4,), float(rank))
    with allow_inflight_collective_as_graph_input_ctx():
        w = g.allreduce([t], _opts("AllreduceOptions", False))
        torch.ops._c10d_functional.wait_tensor(t)
    chk.case("inflight registry: a Work", w is not None and w.is_completed(), f"{w!r}")
    chk.case("inflight registry: values", torch.equal(t, torch.full((4,), W * (W - 1) / 2)), f"{t}")
    # Functional collectives (what torch.compile traces) register the Work they get.
    y = funcol_all_reduce(torch.full((3,), rank + 1.0), "sum", g)
    y = y.wait() if hasattr(y, "wait") else y
    chk.case("functional all_reduce", torch.equal(y, torch.full((3,), W * (W + 1) / 2)), f"{y}")
    # The profiler boxes the c10d op's outputs, the (absent) Work included.
    t = torch.ones(5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(5 * W), t)
    names = {e.key for e in prof.key_averages()}
    chk.case("profiled: values", torch.equal(t, torch.full((5,), float(W))), f"{t}")
    chk.case("profiled: the c10d ops recorded",
             {"c10d::allreduce_", "c10d::_allgather_base_"} <= names, f"{sorted(names)[:40]}")
    chk.cases += 4
    return chk.result()


def check_env_forcing(ctx):
    """CUDA_P2P_*_ALGO and CUDA_P2P_RING_STEPS force algorithms; an Options value wins."""
    W = ctx.world_size
    chk = Checker(f"env W={W}")
    env = {"CUDA_P2P_ALL_GATHER_ALGO": "ring", "CUDA_P2P_REDUCE_SCATTER_ALGO": "ring",
           "CUDA_P2P_ALL_REDUCE_ALGO": "two_shot", "CUDA_P2P_RING_STEPS": str(2 * W),
           "CUDA_P2P_CHUNK_BYTES": "4096"}
    g = cached_group("env-forced", env=env)
    g2 = cached_group("env-and-option", env=env, all_reduce_algo="one_shot")
    cfg = cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()
    chk.case("config", cfg["all_gather_algo"] == "ring" and cfg["reduce_scatter_algo"] == "ring"
             and cfg["all_reduce_algo"] == "two_shot" and cfg["ring_steps"] == 2 * W
             and cfg["chunk_bytes"] == 4096, f"{cfg}")
    chk.case("option wins", cuda_p2p.get_cuda_p2p_backend(g2).get_collective_config()[
        "all_reduce_algo"] == "one_shot", "")
    t = torch.arange(20000, dtype=torch.float32)
    dist.all_reduce(t, group=g)
    out = torch.empty(100 * W)
    dist.all_gather_into_tensor(out, torch.ones(100), group=g)
    rs = torch.empty(5000)
    dist.reduce_scatter_tensor(rs, torch.ones(5000 * W), group=g)
    c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
    chk.case("counters", c == {"all_reduce.two_shot": 1, "all_gather.ring": 1,
                               "reduce_scatter.ring": 1}, f"{c}")
    chk.case("values", torch.equal(t, torch.arange(20000, dtype=torch.float32) * W)
             and torch.equal(rs, torch.full((5000,), float(W))), "")
    chk.cases += 4
    return chk.result()


def check_timeout_names_the_missing_rank(ctx):
    """A rank that never calls: the others' collective fails naming it; later collectives on that
    group refuse to run (its ranks no longer agree on the workspace's state)."""
    W, rank = ctx.world_size, ctx.rank
    g = dist.new_group(backend="cuda_p2p", timeout=timedelta(seconds=1))
    absent = W - 1
    out = {"error": None, "after": None}
    if rank != absent:
        out["error"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
        out["after"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


def check_a_late_rank_learns_of_the_failure(ctx):
    """Rank 0's all_reduce times out before rank 1 calls it; rank 1's call, later, must raise
    naming rank 0 rather than complete on the signals and data rank 0 left behind (NOTE [Failed
    groups]: the failure reaches the peers' failure words)."""
    g = dist.new_group(backend="cuda_p2p", timeout=timedelta(seconds=1))
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier(group=ctx.gloo)
    out = {"error": None, "value": None}
    if ctx.rank == 0:
        out["error"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier(group=ctx.gloo)
    if ctx.rank != 0:
        t = torch.ones(4)
        out["error"] = raises(lambda: dist.all_reduce(t, group=g))
        if out["error"] is None:
            out["value"] = t.tolist()
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


def test_a_late_rank_learns_of_the_failure(world2):
    first, late = world2.run(check_a_late_rank_learns_of_the_failure)
    assert first["error"] and "rank 1 never arrived" in first["error"], first
    assert late["value"] is None, late
    assert late["error"] and "rank 0" in late["error"] and "failed first" in late["error"], late


def check_work_wait_timeout(ctx):
    """Work.wait(timeout) as NCCL's: on a workspace whose ops return queued (here the host's with
    CUDA's semantics), a wait with a timeout blocks until the op has run and raises once the timeout
    has passed, long before the group's; a wait after the op has run returns True."""
    import time

    opts = cuda_p2p.ProcessGroupCudaP2P.Options()
    opts.host_semantics = "cuda"
    g = dist.new_group(backend="cuda_p2p", pg_options=opts, timeout=timedelta(seconds=20))
    out = {}
    t = torch.full((4,), float(ctx.rank))
    if ctx.rank == 0:
        w = dist.all_reduce(t, group=g, async_op=True)
        start = time.monotonic()
        try:
            w.wait(timeout=timedelta(milliseconds=300))
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e)
        out["elapsed"] = time.monotonic() - start
    dist.barrier(group=ctx.gloo)  # rank 1 joins the op only now
    if ctx.rank != 0:
        w = dist.all_reduce(t, group=g, async_op=True)
    out["late"] = w.wait(timeout=timedelta(seconds=10))
    out["value"] = t.tolist()
    dist.destroy_process_group(g)
    return out


def test_work_wait_honours_its_timeout(world2):
    results = world2.run(check_work_wait_timeout)
    first = results[0]
    assert first["error"] and "Work.wait(timeout=300 ms)" in first["error"], first
    assert "has not run by then" in first["error"], first
    assert first["elapsed"] < 5, first
    for res in results:
        assert res["late"] is True, res
        assert res["value"] == [1.0] * 4, res


def check_ddp_matches_gloo(ctx):
    """DistributedDataParallel on a cuda_p2p group (all-reduce through futures and comm hooks)
    trains exactly like on Gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = []
    for grp in (dist.group.WORLD, ctx.gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        ddp = DDP(model, process_group=grp, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(ctx.rank)
        for _ in range(3):
            opt.zero_grad()
            ddp(torch.randint(-3, 4, (8, 16), generator=gen).float()).pow(2).mean().backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*results))


# ---------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("algo", ALL_GATHER_ALGOS)
def test_all_gather(any_world, algo):
    assert_ok(any_world.run(check_all_gather, algo), min_cases=len(DTYPES) * 8)


@pytest.mark.parametrize("algo,steps", REDUCE_SCATTER_ALGOS, ids=["direct", "ring", "ring_2W"])
def test_reduce_scatter(any_world, algo, steps):
    assert_ok(any_world.run(check_reduce_scatter, algo, steps), min_cases=200)


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_all_reduce(any_world, algo):
    assert_ok(any_world.run(check_all_reduce, algo), min_cases=200)


def test_broadcast(any_world):
    assert_ok(any_world.run(check_broadcast), min_cases=40)


# Cross-memory reads (NOTE [Cross-memory reads]) forced at every size: every dtype, odd sizes.
def test_all_gather_copy_free(any_world):
    assert_ok(any_world.run(check_all_gather, "direct", True), min_cases=len(DTYPES) * 8)


def test_reduce_scatter_copy_free(any_world):
    assert_ok(any_world.run(check_reduce_scatter, "direct", 1, True), min_cases=200)


def test_broadcast_copy_free(any_world):
    assert_ok(any_world.run(check_broadcast, True), min_cases=40)


def test_copy_free_reads_fallback_and_knobs(any_world):
    assert_ok(any_world.run(check_copy_free_fallback))


def test_all_gather_v(any_world):
    assert_ok(any_world.run(check_all_gather_v), min_cases=9)


def test_api_async_fallbacks_and_off_switches(any_world):
    assert_ok(any_world.run(check_api_and_fallbacks))


def test_synchronous_calls_return_no_work(any_world):
    assert_ok(any_world.run(check_sync_calls_return_no_work), min_cases=18)


def test_environment_forces_the_algorithm(any_world):
    assert_ok(any_world.run(check_env_forcing))


def test_timeout_names_the_missing_rank(world3):
    results = world3.run(check_timeout_names_the_missing_rank)
    for r, res in enumerate(results[:-1]):
        assert res["error"] and "rank 2 never arrived" in res["error"], (r, res)
        # With CUDA's semantics the timeout fails the group's device (NOTE [Device failure]).
        after = ("this group's device is unusable" if HOST_CUDA_SEMANTICS
                 else "an earlier workspace op of this group failed")
        assert res["after"] and after in res["after"], (r, res)


def test_ddp_on_cuda_p2p_matches_gloo(world2):
    assert all(world2.run(check_ddp_matches_gloo))
