"""Workspace collectives (issue: collectives) through torch.distributed, on 2, 3 and 4 ranks.

Every algorithm is forced in turn (a group per algorithm, through Options or the environment),
with a 64 KiB buffer so that "exactly one buffer region" and "several regions" stay small, and
run for every dtype x reduce op x size (0, 1, odd, exactly one round, several rounds). Each case
is checked against the plain-torch reference (_reference.py) and, for the dtypes Gloo runs,
against a Gloo group over the same ranks; outputs are slices of larger tensors whose margins
must stay untouched, all-reduce results must be bit-identical on every rank, and the backend's
counters must show that the forced algorithm ran (and that nothing fell back silently).

The API around them (async Works and futures, fallbacks and off switches, synchronous calls without
a Work, forcing through the environment, timeouts, a late rank, Work.wait(timeout), DDP):
test_ws_collectives_api.py, which shares this file's Checker.
"""

from __future__ import annotations

import math
import traceback

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import assert_ok, gloo_ok
from _groups import cached_group
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


def check_cross_memory_fallback(ctx):
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
def test_all_gather_cross_memory(any_world):
    assert_ok(any_world.run(check_all_gather, "direct", True), min_cases=len(DTYPES) * 8)


def test_reduce_scatter_cross_memory(any_world):
    assert_ok(any_world.run(check_reduce_scatter, "direct", 1, True), min_cases=200)


def test_broadcast_cross_memory(any_world):
    assert_ok(any_world.run(check_broadcast, True), min_cases=40)


def test_cross_memory_reads_fallback_and_knobs(any_world):
    assert_ok(any_world.run(check_cross_memory_fallback))


def test_all_gather_v(any_world):
    assert_ok(any_world.run(check_all_gather_v), min_cases=9)

