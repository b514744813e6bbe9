"""Arguments that differ across ranks, bad arguments on one rank, and failures midway (issue 12).

Every workspace op compares a signature of its arguments across ranks before any rank reads
from a peer (NOTE [Op signatures] in ops/op_signature.cpp). Each case here passes different
arguments on different ranks and checks that EVERY rank raises the same one-line error naming
what each rank passed, and that the group stays usable: a correct op right after gives Gloo's
result. A rank whose own argument check fails makes its peers raise at once (not after the
timeout). After a real failure midway (a rank that never arrives), both the collectives and the
fused ops of the group refuse at once with one line naming the failure.

The collective cases also run on groups spanning simulated hosts (CUDA_P2P_HOST_ID: 2x2, 2x3,
3+1), whose hierarchical collectives agree across the whole group before any step (NOTE
[Hierarchical agreement] in backend/hierarchy_agreement.cpp): there too every rank raises the same
line, naming group ranks, no rank aborts, and the group works afterwards (issue 41).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import names_rank
from _groups import group_that_times_out

R = dist.ReduceOp
MiB = 1 << 20


class Checker:
    def __init__(self, label):
        self.label, self.failures, self.cases = label, [], 0
        self.errors = []  # (case, error text) of every mismatch, for comparing across ranks

    def case(self, what, ok, detail=""):
        self.cases += 1
        if not ok:
            self.failures.append(f"{self.label}: {what}: {detail}")

    def result(self):
        return {"failures": self.failures, "cases": self.cases, "errors": self.errors}


def _raises(call):
    """(error text or None, seconds the call took)."""
    t0 = time.monotonic()
    try:
        call()
    except (RuntimeError, ValueError) as e:  # c10::Error / c10::ValueError
        return str(e), time.monotonic() - t0
    return None, time.monotonic() - t0


def _still_usable(ctx, chk, what, group=None):
    """A correct all_reduce (one-shot and two-shot sizes) and all_gather right after: Gloo's."""
    for n in (7, 300_000):
        t = torch.arange(n, dtype=torch.float32) * (ctx.rank + 1)
        ref = t.clone()
        dist.all_reduce(t, group=group)
        dist.all_reduce(ref, group=ctx.gloo)
        chk.case(f"{what}: all_reduce of {n} after", torch.equal(t, ref), f"{t[:4]} vs {ref[:4]}")
    out = torch.empty(5 * ctx.world_size)
    dist.all_gather_into_tensor(out, torch.full((5,), float(ctx.rank)), group=group)
    ref = torch.arange(ctx.world_size, dtype=torch.float32).repeat_interleave(5)
    chk.case(f"{what}: all_gather after", torch.equal(out, ref), f"{out}")


def _mismatch(ctx, chk, what, call, needles, group=None):
    """`call` raises on every rank the one-line mismatch error containing every needle; then
    the group works."""
    err, _ = _raises(call)
    chk.errors.append((what, err))
    chk.case(f"{what}: raises", err is not None and "ranks disagree" in err
             and all(n in err for n in needles), f"{err!r} (want {needles})")
    chk.case(f"{what}: one line", err is not None and "\n" not in err.strip(), f"{err!r}")
    _still_usable(ctx, chk, what, group)


# Host of each rank for the simulated-host layouts (as in test_hierarchical.py).
PLACEMENTS = {
    "2x2": lambda r: r // 2,
    "2x3": lambda r: r // 3,
    "3+1": lambda r: 0 if r < 3 else 1,
}


def _new_group(ctx, placement=None, **kwargs):
    """A new cuda_p2p group; on simulated hosts (`placement`), a hierarchical one."""
    if placement is None:
        return dist.new_group(backend="cuda_p2p", **kwargs)
    os.environ["CUDA_P2P_HOST_ID"] = f"mismatch-host-{PLACEMENTS[placement](ctx.rank)}"
    try:
        g = dist.new_group(backend="cuda_p2p", **kwargs)
    finally:
        del os.environ["CUDA_P2P_HOST_ID"]
    assert cuda_p2p.get_cuda_p2p_backend(g).hierarchy() is not None
    return g


# ---------------------------------------------------------------------------------------------
# collectives


def check_collective_mismatches(ctx, placement=None):
    """On the default group, or (`placement`) on a new group spanning simulated hosts."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"collectives W={W}" + (f" hosts {placement}" if placement else ""))
    g = _new_group(ctx, placement, timeout=timedelta(seconds=30)) if placement else None
    b = cuda_p2p.get_cuda_p2p_backend(g or dist.group.WORLD)
    b.reset_counters()

    # Sizes at one-shot (64 vs 128 B) and two-shot (4 vs 8 MiB) sizes, and zero vs some.
    for n0, n1 in ((16, 32), (MiB, 2 * MiB), (0, 8)):
        n = n0 if rank == 0 else n1
        _mismatch(ctx, chk, f"all_reduce {n0} vs {n1}",
                  lambda: dist.all_reduce(torch.ones(n), group=g),
                  [f"rank 0 passed {n0} x float32 sum", f"rank 1 passed {n1} x float32 sum"], g)
    # Dtypes: the same element count, other bytes or the same bytes read differently.
    for other in (torch.float64, torch.int32, torch.bfloat16):
        name = str(other).replace("torch.", "")
        dt = torch.float32 if rank == 0 else other
        _mismatch(ctx, chk, f"all_reduce float32 vs {name}",
                  lambda: dist.all_reduce(torch.ones(1000, dtype=dt), group=g),
                  ["rank 0 passed 1000 x float32 sum", f"rank 1 passed 1000 x {name} sum"], g)
    # Reduce ops.
    op = R.SUM if rank == 0 else R.MAX
    _mismatch(ctx, chk, "all_reduce sum vs max",
              lambda: dist.all_reduce(torch.ones(64), op=op, group=g),
              ["rank 0 passed 64 x float32 sum", "rank 1 passed 64 x float32 max"], g)
    # Broadcast: roots and sizes.
    _mismatch(ctx, chk, "broadcast roots",
              lambda: dist.broadcast(torch.ones(100), src=rank % 2, group=g),
              ["rank 0 passed 100 x float32 from root 0",
               "rank 1 passed 100 x float32 from root 1"],
              g)
    nb = 100 if rank == 0 else 3 * MiB
    _mismatch(ctx, chk, "broadcast sizes", lambda: dist.broadcast(torch.ones(nb), src=0, group=g),
              ["rank 0 passed 100 x float32", f"rank 1 passed {3 * MiB} x float32"], g)
    # all_gather / reduce_scatter sizes (small: rings on 3+ ranks; large: direct) and dtypes.
    for n0, n1 in ((10, 20), (MiB, 2 * MiB)):
        n = n0 if rank == 0 else n1
        _mismatch(ctx, chk, f"all_gather_into_tensor {n0} vs {n1}",
                  lambda: dist.all_gather_into_tensor(torch.empty(n * W), torch.ones(n), group=g),
                  [f"rank 0 passed {n0} x float32", f"rank 1 passed {n1} x float32"], g)
        _mismatch(ctx, chk, f"reduce_scatter_tensor {n0} vs {n1}",
                  lambda: dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * W), group=g),
                  [f"rank 0 passed {n0} x float32 sum", f"rank 1 passed {n1} x float32 sum"], g)
    dt = torch.float32 if rank == 0 else torch.int32
    _mismatch(ctx, chk, "all_gather dtypes",
              lambda: dist.all_gather([torch.empty(8, dtype=dt) for _ in range(W)],
                                      torch.ones(8, dtype=dt), group=g),
              ["rank 0 passed 8 x float32", "rank 1 passed 8 x int32"], g)
    # all_gather_v: the sizes lists differ.
    sizes = [2] * W if rank == 0 else [3] * W
    _mismatch(ctx, chk, "all_gather_v sizes",
              lambda: b.all_gather_v(torch.ones(sizes[rank], 4), sizes),
              ["rank 0 passed float32, bytes [32", "rank 1 passed float32, bytes [48"], g)
    # Different ops altogether: a barrier against an all_reduce.
    _mismatch(ctx, chk, "barrier vs all_reduce",
              lambda: (dist.barrier(group=g) if rank == 0
                       else dist.all_reduce(torch.ones(4), group=g)),
              ["rank 0 passed barrier", "rank 1 passed all_reduce of 4 x float32 sum"], g)
    # Routes (NOTE [Routes agree], [Hierarchical agreement]): a call that the last rank's group
    # would send elsewhere than its peers' (the wrapped backend, or flat across hosts): a dtype
    # the workspace does not reduce. (A CUDA tensor against a CPU one needs a GPU; a meta tensor
    # never reaches the backend: c10d's Meta kernels stand in.)
    last = rank == W - 1
    dt = torch.bool if last else torch.uint8
    _mismatch(ctx, chk, "all_reduce routed elsewhere on one rank (bool)",
              lambda: dist.all_reduce(torch.ones(9, dtype=dt), op=R.MAX, group=g),
              ["rank 0 passed 9 x uint8 max", f"rank {W - 1} passed 9 x bool max ("], g)
    counters = b.get_counters()
    # A hierarchical group's all_gather_v runs on the wrapped backend by design.
    flat = [k for k in counters if (k.endswith(".wrapped") or ".flat." in k)
            and not (placement and k == "all_gather_v.wrapped")]
    chk.case("nothing went to Gloo", not flat, f"{counters}")
    if placement:
        chk.case("ran hierarchically", counters.get("all_reduce.hierarchical", 0)
                 + counters.get("all_reduce.hierarchical_leaders", 0) > 0, f"{counters}")
        _routing_mismatches(ctx, chk, g)
        dist.barrier(group=ctx.gloo)
        dist.destroy_process_group(g)
    return chk.result()


def _routing_mismatches(ctx, chk, g):
    """Hierarchical groups: a call that the last rank would route flat (a dtype the hierarchy's
    Gloo does not reduce), and the issue's own case (the last rank passes 1200 elements, or
    int32)."""
    W, rank = ctx.world_size, ctx.rank
    last = rank == W - 1
    n = 1200 if last else 1000
    _mismatch(ctx, chk, "all_reduce 1000 vs 1200 (last rank)",
              lambda: dist.all_reduce(torch.ones(n), group=g),
              ["rank 0 passed 1000 x float32 sum", f"rank {W - 1} passed 1200 x float32 sum"], g)
    dt = torch.int32 if last else torch.float32
    _mismatch(ctx, chk, "all_reduce float32 vs int32 (last rank)",
              lambda: dist.all_reduce(torch.ones(1000, dtype=dt), group=g),
              ["rank 0 passed 1000 x float32 sum", f"rank {W - 1} passed 1000 x int32 sum"], g)
    dt = torch.int16 if last else torch.int32
    _mismatch(ctx, chk, "reduce_scatter_tensor routed flat on one rank (int16)",
              lambda: dist.reduce_scatter_tensor(torch.empty(3, dtype=dt),
                                                 torch.ones(3 * W, dtype=dt), group=g),
              ["rank 0 passed 3 x int32 sum,", f"rank {W - 1} passed 3 x int16 sum (flat: dtype)"],
              g)
    # All ranks routing flat alike is no mismatch: Gloo's result.
    x = torch.arange(9) % 2 == rank % 2
    ref = x.clone()
    dist.all_reduce(x, group=g)
    dist.all_reduce(ref, group=ctx.gloo)
    chk.case("bool all_reduce flat on every rank", torch.equal(x, ref), f"{x} {ref}")




def check_local_errors_reach_peers(ctx, placement=None):
    """A rank whose own arguments are wrong (its peers' are fine) raises its own error; the peers
    raise at once naming it, instead of waiting for the timeout; then the group works."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"local errors W={W}" + (f" hosts {placement}" if placement else ""))
    g = _new_group(ctx, placement, timeout=timedelta(seconds=20))
    cases = (
        ("all_gather_into_tensor output size",
         lambda bad: dist.all_gather_into_tensor(torch.empty(3 * W + bad), torch.ones(3), group=g)),
        ("reduce_scatter_tensor input size",
         lambda bad: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * W + bad), group=g)),
        ("all_reduce AVG on int64",
         lambda bad: dist.all_reduce(torch.ones(3, dtype=torch.int64 if bad else torch.float32),
                                     op=R.AVG, group=g)),
        ("all_gather_v rows",
         lambda bad: cuda_p2p.get_cuda_p2p_backend(g).all_gather_v(
             torch.ones(2 + bad, 3), [2] * W)),
    )
    if placement is None:
        # The dispatcher and fused entries: their argument checks run in the op, on every rank
        # (a check in Python, before the op, would leave the peers waiting: issue 58).
        A, B = torch.ones(2 * W, 8), torch.ones(8, 4)
        cases += (
            ("torch.ops.cuda_p2p.all_reduce_ reduce op",
             lambda bad: torch.ops.cuda_p2p.all_reduce_(torch.ones(3), "bogus" if bad else "sum",
                                                        g.group_name)),
            ("fused_all_gather_matmul algorithm",
             lambda bad: cuda_p2p.fused_all_gather_matmul(
                 A, [B], 0, g, algorithm="bogus" if bad else "auto")),
            ("fused_matmul_reduce_scatter algorithm",
             lambda bad: cuda_p2p.fused_matmul_reduce_scatter(
                 A, B, "sum", 0, g, algorithm="bogus" if bad else "auto")),
            ("fused_matmul_reduce_scatter reduce op",
             lambda bad: cuda_p2p.fused_matmul_reduce_scatter(
                 A, B, "bogus" if bad else "sum", 0, g)),
        )
    for what, call in cases:
        err, took = _raises(lambda: call(1 if rank == 0 else 0))
        if rank == 0:
            chk.case(f"{what}: rank 0 raises its own error", err is not None
                     and "rejected" not in err, f"{err!r}")
        else:
            chk.case(f"{what}: peers raise naming rank 0", err is not None
                     and "rank 0 rejected its arguments" in err, f"{err!r}")
        chk.case(f"{what}: at once", took < 10.0, f"{took:.1f} s")
        chk.case(f"{what}: one line", err is not None and "\n" not in err.strip(), f"{err!r}")
        _still_usable(ctx, chk, what, g)
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return chk.result()


def check_edge_inputs(ctx):
    """Aliased input/output, a tensor on another device, and a non-strided tensor: the same
    outcome as Gloo's, and the group works afterwards."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"edge inputs W={W}")
    # reduce_scatter_tensor whose output is this rank's chunk of its input (in place).
    for n in (5, 70_000):
        x = torch.arange(n * W, dtype=torch.float32) + rank
        ref_in = x.clone()
        ref = torch.empty(n)
        dist.reduce_scatter_tensor(ref, ref_in, group=ctx.gloo)
        out = x[rank * n:(rank + 1) * n]
        dist.reduce_scatter_tensor(out, x)
        chk.case(f"aliased reduce_scatter_tensor {n}", torch.equal(out, ref),
                 f"{out[:4]} {ref[:4]}")
    # all_reduce whose output is the input (always) and all_gather whose input is its slot.
    for n in (3, 40_000):
        out = torch.zeros(n * W)
        mine = out[rank * n:(rank + 1) * n]
        mine.fill_(float(rank + 1))
        dist.all_gather_into_tensor(out, mine)
        ref = torch.arange(1, W + 1, dtype=torch.float32).repeat_interleave(n)
        chk.case(f"aliased all_gather_into_tensor {n}", torch.equal(out, ref), "")
    # A tensor on another device (meta: torch.distributed lets fake tensors through): Gloo's
    # outcome, and nothing hangs.
    errs = []
    for grp in (ctx.gloo, None):
        try:
            dist.all_reduce(torch.empty(4, device="meta"), group=grp)
            errs.append(None)
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    chk.case("meta tensor", (errs[0] is None) == (errs[1] is None)
             and (errs[0] is None or type(errs[0]) is type(errs[1])), f"{errs!r}")
    _still_usable(ctx, chk, "edge inputs")
    return chk.result()


# ---------------------------------------------------------------------------------------------
# fused ops


def _agm_args(ctx, rows, k, ns, gather_dim, dtype):
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    shape = [rows, k] if gather_dim in (0, -2) else [2, rows, k]
    A = torch.randint(-3, 4, shape, generator=gen).to(dtype)
    kk = k * ctx.world_size if gather_dim == len(shape) - 1 or gather_dim == -1 else k
    Bs = [torch.randint(-3, 4, (kk, n), generator=torch.Generator().manual_seed(7 + i)).to(dtype)
          for i, n in enumerate(ns)]
    return A, Bs


def _fused_correct(ctx, chk, what):
    """A correct fused op of each kind right after: equal to the unfused Gloo computation."""
    W = ctx.world_size
    A, Bs = _agm_args(ctx, 4, 8, [6], 0, torch.float32)
    Ag, outs = cuda_p2p.fused_all_gather_matmul(A, Bs, 0)
    ref_A = torch.empty(4 * W, 8)
    dist.all_gather_into_tensor(ref_A, A, group=ctx.gloo)
    chk.case(f"{what}: all_gather_matmul after", torch.equal(Ag, ref_A)
             and torch.equal(outs[0], ref_A @ Bs[0]), "")
    gen = torch.Generator().manual_seed(50 + ctx.rank)
    A2 = torch.randint(-3, 4, (2 * W, 8), generator=gen).float()
    B2 = torch.randint(-3, 4, (8, 5), generator=torch.Generator().manual_seed(3)).float()
    out = cuda_p2p.fused_matmul_reduce_scatter(A2, B2, "sum", 0)
    ref = torch.empty(2, 5)
    dist.reduce_scatter_tensor(ref, A2 @ B2, group=ctx.gloo)
    chk.case(f"{what}: matmul_reduce_scatter after", torch.equal(out, ref), f"{out} {ref}")
    _still_usable(ctx, chk, what)


def _fused_mismatch(ctx, chk, what, call, needles):
    err, _ = _raises(call)
    chk.case(f"{what}: raises", err is not None and "ranks disagree" in err
             and all(n in err for n in needles), f"{err!r} (want {needles})")
    chk.case(f"{what}: one line", err is not None and "\n" not in err.strip(), f"{err!r}")
    _fused_correct(ctx, chk, what)


def check_fused_mismatches(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"fused W={W}")
    first = rank == 0
    agm = cuda_p2p.fused_all_gather_matmul
    cases = (
        ("rows", dict(rows=4 if first else 6), ["[4, 8]", "[6, 8]"]),
        ("K", dict(k=8 if first else 4), ["[4, 8]", "[4, 4]"]),
        ("N", dict(ns=[6] if first else [5]), ["[8, 6]", "[8, 5]"]),
        ("gather_dim", dict(gather_dim=1 if first else 0, rows=4),
         ["gather_dim 1", "gather_dim 0"]),
        ("dtype", dict(dtype=torch.float32 if first else torch.float64), ["float32", "float64"]),
        ("number of Bs", dict(ns=[6] if first else [6, 6]), ["1 B", "2 Bs"]),
    )
    for what, kw, needles in cases:
        args = dict(rows=4, k=8, ns=[6], gather_dim=0, dtype=torch.float32)
        args.update(kw)
        gd = args["gather_dim"]
        if what == "gather_dim":
            # The same A_shard shape [2, 4, 8] on every rank, gathered along different dims.
            A, Bs = _agm_args(ctx, 4, 8, [6], 1, torch.float32)
        else:
            A, Bs = _agm_args(ctx, **args)
        _fused_mismatch(ctx, chk, f"all_gather_matmul {what}",
                        lambda: agm(A, Bs, gd), needles)
    algo = "pipeline" if first else "pull_ahead"
    A, Bs = _agm_args(ctx, 4, 8, [6], 0, torch.float32)
    _fused_mismatch(ctx, chk, "all_gather_matmul algorithm", lambda: agm(A, Bs, 0, algorithm=algo),
                    ["pipeline", "pull_ahead"])

    mrs = cuda_p2p.fused_matmul_reduce_scatter

    def rs_args(rows=2 * W, k=8, n=5, dtype=torch.float32, nd=2):
        gen = torch.Generator().manual_seed(60 + rank)
        A = torch.randint(-3, 4, (rows, k) if nd == 2 else (2, rows, k), generator=gen).to(dtype)
        B = torch.randint(-3, 4, (k, n), generator=torch.Generator().manual_seed(4)).to(dtype)
        return A, B

    rs_cases = (
        ("rows", dict(rows=2 * W if first else 4 * W), {}, [f"[{2 * W}, 8]", f"[{4 * W}, 8]"]),
        ("K", dict(k=8 if first else 4), {}, ["[8, 5]", "[4, 5]"]),
        ("N", dict(n=5 if first else 3), {}, ["[8, 5]", "[8, 3]"]),
        ("dtype", dict(dtype=torch.float32 if first else torch.bfloat16), {},
         ["float32", "bfloat16"]),
        ("reduce op", {}, dict(reduce_op="sum" if first else "avg"), ["sum", "avg"]),
        ("algorithm", {}, dict(algorithm="ring" if first else "pipeline"), ["ring", "pipeline"]),
        ("ring steps", {}, dict(algorithm="ring", ring_steps=W if first else 2 * W),
         [f"{W} steps", f"{2 * W} steps"]),
    )
    for what, a_kw, op_kw, needles in rs_cases:
        A, B = rs_args(**a_kw)
        kw = dict(reduce_op="sum", algorithm="auto", ring_steps=0)
        kw.update(op_kw)
        red = kw.pop("reduce_op")
        _fused_mismatch(ctx, chk, f"matmul_reduce_scatter {what}",
                        lambda: mrs(A, B, red, 0, **kw), needles)
    # scatter_dim differs over the same [2, 2W, 8] A (both dims divisible by W when W == 2).
    A, B = rs_args(nd=3, n=2 * W)
    sd = 1 if first else 2
    _fused_mismatch(ctx, chk, "matmul_reduce_scatter scatter_dim", lambda: mrs(A, B, "sum", sd),
                    ["scatter_dim 1", "scatter_dim 2"])
    # A wrong B on one rank only: that rank raises its own error, the peers at once name it.
    A, Bs = _agm_args(ctx, 4, 8, [6], 0, torch.float32)
    if first:
        Bs = [torch.ones(7, 6)]
    err, took = _raises(lambda: agm(A, Bs, 0))
    chk.case("fused local error", err is not None and (first or "rank 0 rejected" in err)
             and took < 10.0 and "\n" not in err.strip(), f"{err!r} after {took:.1f} s")
    _fused_correct(ctx, chk, "fused local error")
    return chk.result()


# ---------------------------------------------------------------------------------------------
# failures midway

FAILURE_TIMEOUT_S = 1.0  # the group's timeout where a rank never arrives


def check_failure_refuses_everything(ctx, first):
    """A rank never arrives at a `first` op ("fused" or "collective"): the others fail after the
    timeout; then both kinds of op refuse at once, in one line naming the failure."""
    W, rank = ctx.world_size, ctx.rank
    g = group_that_times_out(ctx, FAILURE_TIMEOUT_S)
    absent = W - 1
    out = {"error": None, "refusals": []}
    A = torch.ones(4, 8)
    Bs = [torch.ones(8, 3)]
    if rank != absent:
        if first == "fused":
            err, _ = _raises(lambda: cuda_p2p.fused_all_gather_matmul(A, Bs, 0, g))
        else:
            err, _ = _raises(lambda: dist.all_reduce(torch.ones(4), group=g))
        out["error"] = err
        for call in (lambda: dist.all_reduce(torch.ones(4), group=g),
                     lambda: dist.broadcast(torch.ones(4), src=0, group=g),
                     lambda: cuda_p2p.fused_all_gather_matmul(A, Bs, 0, g),
                     lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(2 * W, 8),
                                                                  torch.ones(8, 3), "sum", 0, g)):
            out["refusals"].append(_raises(call))
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


# ---------------------------------------------------------------------------------------------
# tests


def _assert_ok(results, min_cases=1):
    failures = [f"[rank {r}] {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures[:30])
    assert min(res["cases"] for res in results) >= min_cases


def test_collective_mismatches(any_world):
    _assert_ok(any_world.run(check_collective_mismatches), 60)


def test_local_errors_reach_peers(any_world):
    _assert_ok(any_world.run(check_local_errors_reach_peers), 24)


HOST_LAYOUTS = [("world4", "2x2"), ("world6", "2x3"), ("world4", "3+1")]


def _same_line_everywhere(results):
    """Every rank raised the same error for every case (after the op's own name, which differs
    where the ranks called different ops): the ranks it names are the group's, on every host."""
    for case in range(len(results[0]["errors"])):
        texts = {str(r["errors"][case][1]).split(": ", 1)[-1] for r in results}
        assert len(texts) == 1, (results[0]["errors"][case][0], texts)


@pytest.mark.parametrize("pool,placement", HOST_LAYOUTS, ids=[p for _, p in HOST_LAYOUTS])
def test_collective_mismatches_across_hosts(request, pool, placement):
    results = request.getfixturevalue(pool).run(check_collective_mismatches, placement)
    _assert_ok(results, 70)
    _same_line_everywhere(results)


@pytest.mark.parametrize("pool,placement", HOST_LAYOUTS, ids=[p for _, p in HOST_LAYOUTS])
def test_local_errors_reach_peers_across_hosts(request, pool, placement):
    _assert_ok(request.getfixturevalue(pool).run(check_local_errors_reach_peers, placement), 12)


def test_edge_inputs(any_world):
    _assert_ok(any_world.run(check_edge_inputs), 5)


def test_fused_mismatches(any_world):
    _assert_ok(any_world.run(check_fused_mismatches), 40)


@pytest.mark.parametrize("first", ["fused", "collective"])
def test_failure_midway_refuses_everything(world3, first):
    results = world3.run(check_failure_refuses_everything, first)
    for rank, r in enumerate(results[:-1]):
        assert r["error"] and "timed out" in r["error"] and names_rank(r["error"], 2), (rank, r)
        for err, took in r["refusals"]:
            assert err is not None, (rank, r)
            # At once: a refusal that waited for its peers would have taken the group's timeout.
            assert took < FAILURE_TIMEOUT_S, (rank, err, took)
            assert "\n" not in err.strip(), (rank, err)
            assert "recreate the group" in err and "timed out" in err, (rank, err)
