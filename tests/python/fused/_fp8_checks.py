"""Rank-side checks of the fp8 fused ops (fused_all_gather_scaled_matmul,
fused_scaled_matmul_reduce_scatter) against the unfused ``torch._scaled_mm`` path computed by
plain torch in one process.

Every rank builds every rank's inputs (a pure function of (case seed, rank)), so the reference
needs no collective: the gathered A is the concatenation of the shards, the reduce-scatter the
float32 sum over ranks (in rank order) of each rank's ``_scaled_mm`` output, rounded once to
out_dtype (the partials are rounded to out_dtype first, as the unfused reduce-scatter of the
``_scaled_mm`` outputs sees them).

Equality (NOTE [Scaled matmuls in the pipelines]): small-integer fp8 values and power-of-two
scales make every product and sum exact, so those cases are bitwise for every algorithm. Random
values are compared within a bound derived from K and the operands (``scaled_mm_bound``), not
bitwise: a CPU's ``_scaled_mm`` may give a row a value that depends on how many rows the call has
(2-vCPU AMD EPYC family 25 model 17, torch 2.14.1: a (5, 16) shard, rows one at a time equal the
M = 1..2 result, M >= 3 differs by 3.8e-06, M >= 8 by 7.6e-06), and the pipelines compute the
product of a chunk's rows where the reference computes all rows at once. Both are float32 sums of
the same K products in some order, so they differ by at most what two orders of a K-term float32
sum can (plus the scales' roundings), and one rounding to bfloat16 of values that close may land
one bfloat16 ulp apart. The reduce-scatter adds the W partials (rounded to out_dtype first, as the
unfused reduce-scatter of the ``_scaled_mm`` outputs sees them) in float32: in rank order (the
pipeline) or ring order, within W float32 roundings of the reference. A wrong scale, row or
partial is off by orders of magnitude more than the bound (``check_bound_is_tight``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import cuda_p2p

F8 = torch.float8_e4m3fn
OUT = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# (A_shard shape, gather_dim); K = the last dim. A zero-row shard, odd rows, 3-D with
# gather_dim 1 and -2.
AG_CASES = [((5, 16), 0), ((0, 16), 0), ((3, 4, 16), 0), ((3, 4, 16), 1), ((1, 3, 16), 1),
            ((2, 3, 7), -2)]
# (A shape with the scattered dim's per-rank size, scatter_dim, N per rank when N is scattered
# else N).
RS_CASES = [((3, 16), 0, 7), ((0, 16), 0, 5), ((2, 3, 16), 1, 5), ((2, 3, 16), 0, 7),
            ((3, 16), -1, 3), ((2, 3, 7), 2, 2)]


def fp8(shape, seed, integer):
    g = torch.Generator().manual_seed(seed)
    if integer:
        return torch.randint(-2, 3, shape, generator=g).to(F8)
    return (torch.randn(shape, generator=g) * 3).to(F8)


def scale(shape, seed, integer):
    g = torch.Generator().manual_seed(seed)
    if integer:
        return torch.pow(2.0, torch.randint(-2, 3, shape, generator=g).float())
    return torch.rand(shape, generator=g) + 0.5


def weight(K, N, seed, integer):
    """B as torchao passes it: the [N, K] fp8 weight transposed (column-major)."""
    return fp8((N, K), seed, integer).t()


def ref_scaled(A, B, sa, sb, out_dtype):
    """PyTorch's unfused path: _scaled_mm of A flattened to a matrix, unflattened."""
    lead = A.shape[:-1]
    if A.numel() == 0:  # (an empty rowwise scale's strides are refused by _scaled_mm)
        return torch.empty(*lead, B.shape[1], dtype=out_dtype)
    if sa.numel() > 1:
        sa = sa.reshape(-1, 1)
    return torch._scaled_mm(A.reshape(-1, A.shape[-1]), B, sa, sb,
                            out_dtype=out_dtype).unflatten(0, lead)


U32 = 2.0 ** -24  # float32's unit roundoff
ULP_BF16 = 2.0 ** -7  # a bfloat16 ulp relative to the value (at most)


def _rows(A, sa):
    """A flattened to [M, K] as float64 magnitudes, and its scale broadcastable to [M, 1]."""
    A2 = A.reshape(-1, A.shape[-1]).double().abs()
    s = sa.double().abs()
    return A2, (s.reshape(-1, 1) if s.numel() > 1 else s)


def scaled_mm_bound(A, B, sa, sb, out_dtype):
    """An elementwise bound on |x - y| for two computations x, y of ref_scaled(A, B, sa, sb,
    out_dtype) that sum the same K products in different orders: 2(K - 1) float32 roundings of
    the sum of the products' magnitudes, a few more for the scales, and one bfloat16 ulp of the
    result when out_dtype is bfloat16. Shaped like ref_scaled's output."""
    K = A.shape[-1]
    A2, s_a = _rows(A, sa)
    mag = (A2 @ B.double().abs()) * s_a * sb.double().abs()
    bound = (2 * K + 8) * U32 * mag
    if out_dtype == torch.bfloat16:
        bound = bound + ULP_BF16 * (mag + bound)
    return bound.reshape(*A.shape[:-1], B.shape[1])


def within(got, want, bound):
    """(ok, worst |got - want| / bound) of an elementwise comparison within `bound`."""
    diff = (got.double() - want.double()).abs()
    if diff.numel() == 0:
        return True, 0.0
    ok = bool((diff <= bound).all())
    return ok, float((diff / bound.clamp_min(1e-300)).max())


def _cmp(failures, what, got, want, bitwise=True, strides=True, bound=None):
    """Shape, dtype and strides exactly; values bitwise, or within `bound` (elementwise)."""
    try:
        assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
        if strides:
            assert got.stride() == want.stride(), f"strides {got.stride()} != {want.stride()}"
        if bitwise:
            g, w = got.float(), want.float()
            assert torch.equal(g, w), f"not bitwise equal: max diff {(g - w).abs().max()}"
        else:
            ok, worst = within(got, want, bound)
            assert ok, (f"not within the bound: max diff "
                        f"{(got.double() - want.double()).abs().max()}, {worst:.3g}x the bound")
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0]}")


def _counters(group):
    return dict(cuda_p2p.get_cuda_p2p_backend(group).get_counters())


def _delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def check_all_gather_scaled_matmul(ctx, integer=True):
    group = dist.group.WORLD
    W, rank = ctx.world_size, ctx.rank
    failures, n = [], 0
    before = _counters(group)
    for ci, (shape, gd) in enumerate(AG_CASES):
        K = shape[-1]
        for mode in ("tensorwise", "rowwise"):
            for out_name in OUT:
                for return_A, algorithm in [(True, "pipeline"), (False, "auto"),
                                            (True, "pull_ahead")]:
                    seed = 1000 * ci + 10 * (mode == "rowwise") + (out_name == "bfloat16")
                    shards = [fp8(shape, seed * 16 + r, integer) for r in range(W)]
                    if mode == "tensorwise":
                        a_scales = [scale((), seed + 7, integer)] * W
                        b_scales = [scale((), seed + 8, integer), scale((), seed + 9, integer)]
                    else:
                        a_scales = [scale(shape[:-1] + (1,), seed * 16 + 100 + r, integer)
                                    for r in range(W)]
                        b_scales = [scale((1, 7), seed + 8, integer),
                                    scale((1, 2), seed + 9, integer)]
                    Bs = [weight(K, 7, seed + 900, integer), weight(K, 2, seed + 901, integer)]
                    # A second B with the other out dtype: out_dtypes differ per B.
                    out_dtypes = [OUT[out_name],
                                  torch.bfloat16 if out_name == "float32" else torch.float32]
                    what = (f"W={W} {mode} {out_name} shape={shape} gather_dim={gd} "
                            f"return_A={return_A} {algorithm} integer={integer}")
                    try:
                        A, outs = cuda_p2p.fused_all_gather_scaled_matmul(
                            shards[rank], Bs, a_scales[rank], b_scales, gd, group,
                            out_dtypes=out_dtypes, return_A=return_A, algorithm=algorithm)
                    except Exception as e:  # noqa: BLE001
                        failures.append(f"{what}: raised {type(e).__name__}: {e}")
                        continue
                    # The reference, as PyTorch's fallback computes it, on every rank's inputs.
                    d = gd % len(shape)
                    A_ref = torch.cat(shards, dim=d)
                    A_moved = A_ref.movedim(d, 0)
                    sa = a_scales[0] if mode == "tensorwise" else \
                        torch.cat(a_scales, dim=d).movedim(d, 0)
                    outs_ref = [ref_scaled(A_moved.contiguous(), B, sa, sb, od).movedim(0, d)
                                for B, sb, od in zip(Bs, b_scales, out_dtypes)]
                    bounds = [scaled_mm_bound(A_moved, B, sa, sb, od).movedim(0, d)
                              for B, sb, od in zip(Bs, b_scales, out_dtypes)]
                    if return_A:
                        # The fallback's A: view(W, *shape).movedim(d + 1, 1).flatten(0, 1)
                        want = torch.stack(shards).movedim(d + 1, 1).flatten(0, 1).movedim(0, d)
                        _cmp(failures, what + " (A)", A.view(torch.uint8),
                             want.view(torch.uint8))
                    elif A is not None:
                        failures.append(f"{what}: A should be None with return_A=False")
                    for i, (o, r, b) in enumerate(zip(outs, outs_ref, bounds)):
                        _cmp(failures, f"{what} (out {i})", o, r, bitwise=integer, bound=b)
                    n += 1
    return {"cases": n, "failures": failures, "counters": _delta(before, _counters(group))}


def check_scaled_matmul_reduce_scatter(ctx, integer=True):
    group = dist.group.WORLD
    W, rank = ctx.world_size, ctx.rank
    failures, n = [], 0
    before = _counters(group)
    for ci, (shape, sd, npr) in enumerate(RS_CASES):
        nd = len(shape)
        d = sd % nd
        a_shape = list(shape)
        N = npr
        if d == nd - 1:
            N = npr * W
        else:
            a_shape[d] *= W
        a_shape = tuple(a_shape)
        K = a_shape[-1]
        for mode in ("tensorwise", "rowwise"):
            for out_name, out_dtype in OUT.items():
                for reduce_op, algorithm, steps in [("sum", "pipeline", 0), ("sum", "ring", 0),
                                                    ("avg", "auto", 0), ("sum", "ring", 2 * W)]:
                    seed = 1000 * ci + 10 * (mode == "rowwise") + (out_name == "bfloat16")
                    As = [fp8(a_shape, seed * 16 + r, integer) for r in range(W)]
                    Bs = [weight(K, N, seed * 16 + 50 + r, integer) for r in range(W)]
                    if mode == "tensorwise":
                        sas = [scale((), seed * 16 + 100 + r, integer) for r in range(W)]
                        sbs = [scale((), seed * 16 + 150 + r, integer) for r in range(W)]
                    else:
                        sas = [scale(a_shape[:-1] + (1,), seed * 16 + 100 + r, integer)
                               for r in range(W)]
                        sbs = [scale((1, N), seed * 16 + 150 + r, integer) for r in range(W)]
                    what = (f"W={W} {mode} {out_name} A={a_shape} scatter_dim={sd} {reduce_op} "
                            f"{algorithm} steps={steps} integer={integer}")
                    try:
                        out = cuda_p2p.fused_scaled_matmul_reduce_scatter(
                            As[rank], Bs[rank], sas[rank], sbs[rank], reduce_op, sd, group,
                            out_dtype=out_dtype, algorithm=algorithm, ring_steps=steps)
                    except Exception as e:  # noqa: BLE001
                        failures.append(f"{what}: raised {type(e).__name__}: {e}")
                        continue
                    partials = [ref_scaled(A, B, sa, sb, out_dtype)
                                for A, B, sa, sb in zip(As, Bs, sas, sbs)]
                    total = partials[0].float()
                    for p in partials[1:]:
                        total = total + p.float()
                    if reduce_op == "avg":
                        total = total / W
                    want = total.to(out_dtype).chunk(W, dim=d)[rank].contiguous()
                    # Each partial within its own bound (a chunk's rows against all rows), the
                    # float32 sum of W of them in another order, the final rounding.
                    bound = sum(scaled_mm_bound(A, B, sa, sb, out_dtype) + p.double().abs() *
                                (2 * W * U32) for A, B, sa, sb, p in zip(As, Bs, sas, sbs,
                                                                         partials))
                    if reduce_op == "avg":
                        bound = bound / W
                    if out_dtype == torch.bfloat16:
                        bound = bound + ULP_BF16 * (total.double().abs() + bound)
                    bound = bound.chunk(W, dim=d)[rank]
                    _cmp(failures, what, out, want, bitwise=integer, bound=bound)
                    n += 1
    return {"cases": n, "failures": failures, "counters": _delta(before, _counters(group))}


def check_errors(ctx):
    """Wrong arguments raise on every rank before any signal, saying what was expected and what
    was given; the group stays usable."""
    W = ctx.world_size
    g = dist.group.WORLD
    A = fp8((3, 16), 1, True)
    B = weight(16, 4, 2, True)
    one = torch.tensor(1.0)
    ag = cuda_p2p.fused_all_gather_scaled_matmul
    rs = cuda_p2p.fused_scaled_matmul_reduce_scatter
    f32 = [torch.float32]
    expectations = [
        (lambda: ag(A.float(), [B], one, [one], 0, g, out_dtypes=f32),
         "expected a float8 A_shard (float8_e4m3fn, float8_e5m2, or their fnuz forms), got Float"),
        (lambda: ag(A, [B.float()], one, [one], 0, g, out_dtypes=f32),
         "expected float8 Bs, got Bs[0] of Float"),
        (lambda: ag(A, [B], torch.ones(2, 1), [one], 0, g, out_dtypes=f32),
         "expected A_scale with 1 element (tensorwise) or of shape [3, 1] (rowwise: A_shard's "
         "leading dims, then 1), got shape [2, 1]"),
        (lambda: ag(A, [B], one, [torch.ones(4, 1)], 0, g, out_dtypes=f32),
         "expected B_scales[0] with 1 element (tensorwise) or of shape [1, 4] (rowwise), got "
         "shape [4, 1]"),
        (lambda: ag(A, [B], one.double(), [one], 0, g, out_dtypes=f32),
         "expected a float32 A_scale on cpu, got Double on cpu"),
        (lambda: ag(A, [B], one, [one], 0, g, out_dtypes=[torch.float16]),
         "expected out_dtypes float32 or bfloat16, got out_dtypes[0] = Half"),
        (lambda: ag(A, [B], one, [one], 0, g, out_dtypes=[]),
         "expected one B_scale and one out_dtype per B (1), got 1 B_scales and 0 out_dtypes"),
        (lambda: ag(A, [B], one, [one], 1, g, out_dtypes=f32),
         "gather_dim is the last (contraction) dim"),
        (lambda: ag(A, [weight(8, 4, 3, True)], one, [one], 0, g, out_dtypes=f32),
         "Bs[0] has 8 rows, but A_shard has 16 columns"),
        (lambda: rs(fp8((W, 16), 1, True).float(), B, one, one, "sum", 0, g,
                    out_dtype=torch.float32),
         "expected float8 A and B (float8_e4m3fn, float8_e5m2, or their fnuz forms), got Float "
         "and Float8_e4m3fn"),
        (lambda: rs(fp8((W, 16), 1, True), B, torch.ones(W, 2), one, "sum", 0, g,
                    out_dtype=torch.float32),
         f"expected A_scale with 1 element (tensorwise) or of shape [{W}, 1] (rowwise: A's "
         f"leading dims, then 1), got shape [{W}, 2]"),
        (lambda: rs(fp8((W, 16), 1, True), B, one, torch.ones(1, 3), "sum", 0, g,
                    out_dtype=torch.float32),
         "expected B_scale with 1 element (tensorwise) or of shape [1, 4] (rowwise), got shape "
         "[1, 3]"),
        (lambda: rs(fp8((W, 16), 1, True), B, one, one, "sum", 0, g, out_dtype=F8),
         "expected out_dtype float32 or bfloat16, got Float8_e4m3fn"),
        (lambda: rs(fp8((W, 16), 1, True), B, one, one, "max", 0, g, out_dtype=torch.float32),
         'reduce_op must be one of "sum", "avg", got "max"'),
    ]
    if W > 1:
        expectations.append(
            (lambda: rs(fp8((W + 1, 16), 1, True), B, one, one, "sum", 0, g,
                        out_dtype=torch.float32),
             f"must be divisible by the group size {W}"))
    failures, n = [], 0
    for fn, expected in expectations:
        try:
            fn()
            failures.append(f"no error; expected {expected!r}")
        except Exception as e:  # noqa: BLE001
            if expected not in str(e):
                failures.append(f"expected {expected!r} in: {str(e)[:400]}")
        n += 1
    # The group is still usable, and a rank whose own arguments are wrong fails every rank
    # (NOTE [Op signatures]): rank 0 passes a bad scale, its peers good ones.
    if W > 1:
        bad = torch.ones(2, 1) if ctx.rank == 0 else one
        try:
            ag(A, [B], bad, [one], 0, g, out_dtypes=f32)
            failures.append(f"rank {ctx.rank}: no error when rank 0's A_scale is wrong")
        except Exception as e:  # noqa: BLE001
            if ctx.rank == 0 and "expected A_scale" not in str(e):
                failures.append(f"rank 0: {str(e)[:300]}")
        n += 1
    _, outs = ag(A, [B], one, [one], 0, g, out_dtypes=f32)
    if outs[0].shape != (3 * W, 4):
        failures.append(f"after the errors: shape {tuple(outs[0].shape)}")
    n += 1
    dist.barrier(group=ctx.gloo)
    return {"cases": n, "failures": failures, "counters": {}}


def check_meta_and_fake(ctx):
    """The Meta kernels give the real outputs' shapes, strides and dtypes (FakeTensor)."""
    W = ctx.world_size
    g = dist.group.WORLD
    failures, n = [], 0
    cases = [("tensorwise", (3, 4, 16), 1), ("rowwise", (3, 4, 16), 0), ("rowwise", (5, 16), 0)]
    for mode, shape, gd in cases:
        A = fp8(shape, 3, True)
        sa = torch.tensor(0.5) if mode == "tensorwise" else scale(shape[:-1] + (1,), 4, True)
        Bs = [weight(16, 6, 5, True)]
        sbs = [torch.tensor(2.0) if mode == "tensorwise" else scale((1, 6), 6, True)]
        real = cuda_p2p.fused_all_gather_scaled_matmul(A, Bs, sa, sbs, gd, g,
                                                       out_dtypes=[torch.bfloat16])
        with FakeTensorMode() as mode_:
            fA, fB = mode_.from_tensor(A), [mode_.from_tensor(b) for b in Bs]
            fake = torch.ops.cuda_p2p.fused_all_gather_scaled_matmul(
                fA, fB, mode_.from_tensor(sa), [mode_.from_tensor(s) for s in sbs], gd,
                g.group_name, out_dtypes=[torch.bfloat16])
        for what, f, r in [("A", fake[0], real[0]), ("out", fake[1][0], real[1][0])]:
            if (f.shape, f.stride(), f.dtype) != (r.shape, r.stride(), r.dtype):
                failures.append(f"ag {mode} {shape} gd={gd} {what}: fake {f.shape} {f.stride()} "
                                f"{f.dtype} vs real {r.shape} {r.stride()} {r.dtype}")
        n += 1
        a2 = fp8((2, 3 * W, 16), 7, True)
        s2 = torch.tensor(0.5) if mode == "tensorwise" else scale((2, 3 * W, 1), 8, True)
        sb = sbs[0]
        real = cuda_p2p.fused_scaled_matmul_reduce_scatter(a2, Bs[0], s2, sb, "sum", 1, g,
                                                           out_dtype=torch.float32)
        with FakeTensorMode() as mode_:
            fake = torch.ops.cuda_p2p.fused_scaled_matmul_reduce_scatter(
                mode_.from_tensor(a2), mode_.from_tensor(Bs[0]), mode_.from_tensor(s2),
                mode_.from_tensor(sb), "sum", 1, g.group_name, out_dtype=torch.float32)
        if (fake.shape, fake.stride(), fake.dtype) != (real.shape, real.stride(), real.dtype):
            failures.append(f"rs {mode}: fake {fake.shape} {fake.stride()} {fake.dtype} vs real "
                            f"{real.shape} {real.stride()} {real.dtype}")
        n += 1
    return {"cases": n, "failures": failures, "counters": {}}
