"""torch.ops.cuda_p2p.all_reduce_ / all_reduce / all_reduce_sum_ and cuda_p2p.all_reduce_ (the
dispatcher ops).

Every case is compared with plain-torch math over every rank's input (each rank rebuilds its
peers' inputs), with Gloo's all-reduce of the same inputs, and bit for bit with dist.all_reduce
on the same cuda_p2p group (both run the same workspace algorithm). The backend's counters must
show which path ran.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import _collective_checks as cc
from _collective_checks import assert_all_ok
from _reference import ops_for, reduce_over_ranks

# 1 and 7: odd sizes; 2049 x 4 B > 8 KiB: two-shot; 300_001 x 4 B > 1 MiB: several rounds.
SIZES = (0, 1, 7, 1023, 2049, 300_001)
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def _input(seed, rank, n, dtype, op):
    x = cc.make_input(seed, rank, n, dtype if dtype != torch.int32 else torch.int64, op.upper())
    if dtype == torch.int32 and op.upper() in ("BAND", "BOR", "BXOR"):
        x = x & 0x7FFFFFFF
    return x.to(dtype)


def _counts(backend):
    c = backend.get_counters()
    return {k: v for k, v in c.items() if k.startswith("all_reduce.")}


def check_values(ctx, dtype_name, sizes=SIZES):
    import cuda_p2p

    dtype = DTYPES[dtype_name]
    p2p, gloo = dist.group.WORLD, ctx.gloo
    W, me = ctx.world_size, ctx.rank
    backend = cuda_p2p.get_cuda_p2p_backend(p2p)
    name = p2p.group_name
    failures, count = [], 0
    ops = ops_for(dtype)
    if dtype.is_floating_point and dtype != torch.float32:
        ops = ("SUM", "AVG", "MAX")  # the others are covered in float32
    for seed, n in enumerate(sizes):
        for op in ops:
            if n > 5000 and op not in ("SUM", "BXOR"):
                continue  # large sizes: the rounds, not the ops
            label = f"{dtype_name} n={n} {op} W={W}"
            count += 1
            x = _input(seed, me, n, dtype, op)
            expected = reduce_over_ranks(op, [_input(seed, r, n, dtype, op) for r in range(W)])
            ref = x.clone()
            dist.all_reduce(ref, op=getattr(dist.ReduceOp, op), group=gloo)
            via_dist = x.clone()
            dist.all_reduce(via_dist, op=getattr(dist.ReduceOp, op), group=p2p)
            before = _counts(backend)
            inplace = x.clone()
            returned = torch.ops.cuda_p2p.all_reduce_(inplace, op.lower(), name)
            after = _counts(backend)
            functional_in = x.clone()
            functional = torch.ops.cuda_p2p.all_reduce(functional_in, op.lower(), name)
            wrapper = x.clone()
            cuda_p2p.all_reduce_(wrapper, getattr(dist.ReduceOp, op), p2p)
            got_by_op = [("all_reduce_", inplace), ("all_reduce", functional),
                         ("cuda_p2p.all_reduce_", wrapper)]
            if op == "SUM":  # the one-argument op: the sum over the default group (this one)
                one_arg = x.clone()
                if torch.ops.cuda_p2p.all_reduce_sum_(one_arg) is not one_arg:
                    failures.append(f"{label}: all_reduce_sum_ did not return its input")
                got_by_op.append(("all_reduce_sum_", one_arg))
            tol = cc.tolerance(dtype, op)
            for what, got in got_by_op:
                if got.dtype != dtype or got.shape != x.shape:
                    failures.append(f"{label} {what}: got {got.dtype} {tuple(got.shape)}")
                elif not torch.equal(got, via_dist):
                    failures.append(f"{label} {what}: differs from dist.all_reduce on cuda_p2p")
                elif tol is None and not torch.equal(got, ref):
                    failures.append(f"{label} {what}: differs from gloo")
                elif tol is None and not torch.equal(got, expected):
                    failures.append(f"{label} {what}: differs from plain torch")
                elif tol is not None and not torch.allclose(
                    got.float(), expected.float(), rtol=tol[0], atol=tol[1]
                ):
                    err = (got.float() - expected.float()).abs().max().item()
                    failures.append(f"{label} {what}: off plain math by {err}")
            if returned.data_ptr() != inplace.data_ptr():
                failures.append(f"{label}: all_reduce_ did not return its input")
            if not torch.equal(functional_in, x):
                failures.append(f"{label}: all_reduce (functional) changed its input")
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            delta = {k: v for k, v in delta.items() if v}
            one_shot_max = 65536 if W == 2 else 8192  # the default all_reduce_one_shot_max_bytes
            one_shot = n * x.element_size() <= one_shot_max
            want = "all_reduce.one_shot" if one_shot else "all_reduce.two_shot"
            want = {want: 1}
            if want.get("all_reduce.one_shot") and n > 0:
                want["all_reduce.inline"] = 1  # one round, on the host: NOTE [Inline one-shot]
            # More than one 1 MiB round: rank 0 may have chosen large rounds by its timings
            # (NOTE [Rounds chosen by rank 0]); both are right, and counted when chosen.
            chosen = not one_shot and W > 1 and n * x.element_size() > 1 << 20
            if chosen and delta.get("all_reduce.large_rounds") == 1:
                want["all_reduce.large_rounds"] = 1
            if delta != want:
                failures.append(f"{label}: counters moved by {delta}, expected {want}")
    return {"cases": count, "failures": failures}


def check_non_contiguous(ctx):
    import cuda_p2p

    W, me = ctx.world_size, ctx.rank
    failures = []
    for rows, cols in ((3, 5), (64, 33)):
        full = [torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) * (r + 1)
                for r in range(W)]
        t = full[me].t()  # a transposed view: not contiguous
        cuda_p2p.all_reduce_(t, "sum")
        expected = sum(full_r for full_r in [torch.arange(rows * cols, dtype=torch.float32)
                                             .reshape(rows, cols) * (r + 1) for r in range(W)])
        if not torch.equal(full[me], expected):
            failures.append(f"{rows}x{cols} transposed: the base tensor was not reduced in place")
        if not torch.equal(t, expected.t()):
            failures.append(f"{rows}x{cols} transposed: wrong values")
    return {"cases": 2, "failures": failures}


def check_fallback(ctx):
    """A group whose workspace is off: the op runs on the wrapped Gloo, counted."""
    import cuda_p2p

    opts = cuda_p2p.ProcessGroupCudaP2P.Options()
    opts.enable_workspace = False
    g = dist.new_group(backend="cuda_p2p", pg_options=opts)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    failures = []
    W, me = ctx.world_size, ctx.rank
    for n in (1, 7, 3000):
        x = torch.arange(n, dtype=torch.float32) + me
        before = _counts(backend)
        torch.ops.cuda_p2p.all_reduce_(x, "max", g.group_name)
        after = _counts(backend)
        expected = torch.arange(n, dtype=torch.float32) + (W - 1)
        if not torch.equal(x, expected):
            failures.append(f"wrapped n={n}: wrong values")
        d = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        if d != {"all_reduce.wrapped": 1}:
            failures.append(f"wrapped n={n}: counters moved by {d}")
    # Non-contiguous through the fallback too.
    y = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * (me + 1)).t()
    torch.ops.cuda_p2p.all_reduce_(y, "sum", g.group_name)
    if not torch.equal(y, (torch.arange(12, dtype=torch.float32).reshape(3, 4) * sum(
            range(1, W + 1))).t()):
        failures.append("wrapped, transposed: wrong values")
    dist.destroy_process_group(g)
    return {"cases": 4, "failures": failures}


def _raises(fn, exc_type, text):
    try:
        fn()
    except exc_type as e:
        return None if text in str(e) else f"raised {exc_type.__name__} without {text!r}: {e}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__} (expected {exc_type.__name__}): {e}"
    return f"did not raise (expected {exc_type.__name__} with {text!r})"


def check_errors(ctx):
    import cuda_p2p

    name = dist.group.WORLD.group_name
    me = ctx.rank
    failures = []
    t = torch.ones(4)
    cases = [
        ("bad reduce_op", lambda: torch.ops.cuda_p2p.all_reduce_(t, "mean", name), ValueError,
         "reduce_op must be one of"),
        ("unknown group", lambda: torch.ops.cuda_p2p.all_reduce_(t, "sum", "no-such-group"),
         RuntimeError, "no-such-group"),
        ("gloo group", lambda: torch.ops.cuda_p2p.all_reduce_(t, "sum", ctx.gloo.group_name),
         RuntimeError, "backend='cuda_p2p'"),
        ("complex", lambda: torch.ops.cuda_p2p.all_reduce_(torch.ones(3, dtype=torch.complex64),
                                                           "sum", name),
         RuntimeError, "complex"),
        ("complex, one-argument op",
         lambda: torch.ops.cuda_p2p.all_reduce_sum_(torch.ones(3, dtype=torch.complex64)),
         RuntimeError, "complex"),
        ("one-argument op with a reduce_op", lambda: torch.ops.cuda_p2p.all_reduce_sum_(t, "max"),
         RuntimeError, "all_reduce_sum_"),
        ("wrapper op type", lambda: cuda_p2p.all_reduce_(t, 3), TypeError, "op must be"),
        ("wrapper op name", lambda: cuda_p2p.all_reduce_(t, "mean"), ValueError, "op must be"),
        ("avg on int64", lambda: cuda_p2p.all_reduce_(torch.ones(3, dtype=torch.int64), "avg"),
         RuntimeError, ""),
    ]
    for label, fn, exc, text in cases:
        err = _raises(fn, exc, text)
        if err:
            failures.append(f"{label}: {err}")
    if not torch.equal(t, torch.ones(4)):
        failures.append("a refused op changed the tensor")
    # Gloo refuses AVG on integers too (the same error type).
    err = _raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.AVG,
                                          group=ctx.gloo), Exception, "")
    if err:
        failures.append(f"gloo avg on int64: {err}")
    # Ranks that disagree (sizes) raise on every rank, and the group stays usable.
    n = 5 if me == 0 else 6
    err = _raises(lambda: torch.ops.cuda_p2p.all_reduce_(torch.ones(n), "sum", name),
                  RuntimeError, "ranks disagree")
    if err:
        failures.append(f"mismatched sizes: {err}")
    u = torch.ones(7)
    torch.ops.cuda_p2p.all_reduce_(u, "sum", name)
    if not torch.equal(u, torch.full((7,), float(ctx.world_size))):
        failures.append(f"after the mismatch: {u}")
    return {"cases": len(cases) + 3, "failures": failures}


def check_defaults(ctx):
    """reduce_op="sum" and group_name="" (the default group) when left out: the same sums as Gloo,
    counted on the default group's backend, also when a cuda_p2p subgroup exists."""
    import cuda_p2p

    me, W = ctx.rank, ctx.world_size
    backend = cuda_p2p.get_cuda_p2p_backend(dist.group.WORLD)
    sub = dist.new_group([0, 1], backend="cuda_p2p") if W > 2 else None
    failures = []
    for n, dtype in ((1, torch.float32), (1023, torch.bfloat16), (300_001, torch.int64)):
        # Integers in [-30, 30]: every sum is exact in each dtype, whatever the order.
        x = (cc.make_input(7 + n, me, n, torch.int64, "SUM") % 61 - 30).to(dtype)
        ref = x.clone()
        dist.all_reduce(ref, group=ctx.gloo)
        before = sum(_counts(backend).values())
        a = x.clone()
        if torch.ops.cuda_p2p.all_reduce_(a) is not a:
            failures.append(f"n={n}: all_reduce_ did not return its input")
        b = torch.ops.cuda_p2p.all_reduce(x)
        c = x.clone()
        torch.ops.cuda_p2p.all_reduce_(c, "sum")
        d = x.clone()
        if torch.ops.cuda_p2p.all_reduce_sum_(d) is not d:
            failures.append(f"n={n}: all_reduce_sum_ did not return its input")
        for label, got in (("all_reduce_(t)", a), ("all_reduce(t)", b), ("all_reduce_(t, sum)", c),
                           ("all_reduce_sum_(t)", d)):
            if not torch.equal(got, ref):
                failures.append(f"{dtype} n={n} {label}: differs from Gloo")
        if sum(_counts(backend).values()) - before < 4:
            failures.append(f"n={n}: the default group's counters did not move: {_counts(backend)}")
    if sub is not None:
        dist.destroy_process_group(sub)
    return {"cases": 12, "failures": failures}


def check_compile(ctx):
    """torch.compile(fullgraph=True) traces both ops (Meta kernel + functionalization)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cuda_p2p

    name = dist.group.WORLD.group_name
    me, W = ctx.rank, ctx.world_size
    failures = []
    with FakeTensorMode():
        f = torch.empty(3, 4, dtype=torch.bfloat16)
        out = torch.ops.cuda_p2p.all_reduce(f, "sum", name)
        if out.shape != (3, 4) or out.dtype != torch.bfloat16:
            failures.append(f"fake all_reduce: {out.shape} {out.dtype}")
        if torch.ops.cuda_p2p.all_reduce_(f, "max", name) is not f:
            failures.append("fake all_reduce_ did not return its input")
        if torch.ops.cuda_p2p.all_reduce_sum_(f) is not f:
            failures.append("fake all_reduce_sum_ did not return its input")

    def layer(x, w):
        y = x @ w
        torch.ops.cuda_p2p.all_reduce_(y, "sum", name)
        z = torch.relu(y) + 1
        return cuda_p2p.all_reduce_(z, "avg", name) * 2

    def functional(x):
        return torch.ops.cuda_p2p.all_reduce(x * 3, "max", name) - 1

    def defaults(x):  # reduce_op and group_name left out: a sum over the default group
        y = x + 1
        torch.ops.cuda_p2p.all_reduce_(y)
        z = torch.ops.cuda_p2p.all_reduce(y * 2) - 1
        torch.ops.cuda_p2p.all_reduce_sum_(z)  # the one-argument op
        return z

    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(me))
    w = torch.randn(8, 3, generator=torch.Generator().manual_seed(100))
    for label, fn, args in (("in place", layer, (x, w)), ("functional", functional, (x,)),
                            ("defaults", defaults, (x,))):
        eager = fn(*[a.clone() for a in args])
        # inductor only: it traces through AOT autograd and functionalization as aot_eager does,
        # and lowers too (each compile costs seconds on every rank).
        for backend in ("inductor",):
            try:
                torch._dynamo.reset()
                got = torch.compile(fn, backend=backend, fullgraph=True)(*[a.clone() for a in args])
            except Exception as e:  # noqa: BLE001
                failures.append(f"{label} {backend}: {type(e).__name__}: {str(e)[:300]}")
                continue
            if not torch.allclose(got, eager, rtol=1e-5, atol=1e-5):
                failures.append(f"{label} {backend}: differs from eager")
    # The eager result against plain math, so that "compiled == eager" cannot hide a wrong eager.
    xs = [torch.randn(5, 8, generator=torch.Generator().manual_seed(r)) for r in range(W)]
    y = sum(xi @ w for xi in xs)
    expected = (sum(torch.relu(y) + 1 for _ in range(W)) / W) * 2
    if not torch.allclose(layer(x.clone(), w), expected, rtol=1e-4, atol=1e-4):
        failures.append("eager in-place layer differs from plain math")
    if not torch.allclose(defaults(x.clone()), (sum(xi + 1 for xi in xs) * 2 * W - 1) * W,
                          rtol=1e-4, atol=1e-4):
        failures.append("eager defaults differ from plain math")
    return {"cases": 9, "failures": failures}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_values_2_and_4_ranks(world, dtype):
    assert_all_ok(world.run(check_values, dtype), min_cases=len(SIZES))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_values_3_ranks(world3, dtype):
    assert_all_ok(world3.run(check_values, dtype), min_cases=len(SIZES))


def test_non_contiguous(world):
    assert_all_ok(world.run(check_non_contiguous))


def test_fallback_to_wrapped_backend(world3):
    assert_all_ok(world3.run(check_fallback))


def test_defaults(any_world):
    assert_all_ok(any_world.run(check_defaults))


def test_errors(world2):
    assert_all_ok(world2.run(check_errors))


def test_torch_compile_fullgraph(world2):
    assert_all_ok(world2.run(check_compile))
