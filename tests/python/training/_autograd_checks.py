"""Rank-side checks of the fused ops' autograd (python/cuda_p2p/_autograd.py).

The reference is single-process torch: every rank gathers every rank's inputs and upstream
gradients over the Gloo group, rebuilds the whole computation (all ranks' products, the sum over
ranks, the slices) in one process, and lets torch's autograd differentiate
``sum_s <out_s, grad_out_s>`` with respect to this rank's inputs. gradcheck runs on the fused op
itself in float64, with every rank's outputs gathered into one global output so that the numerical
Jacobian (this rank's inputs -> every rank's outputs) is the one the backward computes.

Every check returns ``{"cases": n, "failures": [...], "counters": {...}}``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import cuda_p2p
from _fused_checks import _counters, _delta

AG_CASES = [((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -1),
            ((1, 3, 4), 1)]
RS_CASES = [((3, 4), 0, 5), ((3, 4), 1, 2), ((2, 3, 4), 0, 5), ((2, 3, 4), 1, 3),
            ((2, 3, 4), 2, 2)]

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
       torch.float64: dict(atol=1e-10, rtol=1e-10)}


def _gather_all(ctx, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (same shape on every rank), over the Gloo group."""
    out = [torch.empty_like(t) for _ in range(ctx.world_size)]
    dist.all_gather(out, t.contiguous(), group=ctx.gloo)
    return out


class _GatherForCheck(torch.autograd.Function):
    """Every rank's x stacked: outputs identical on every rank. Its backward keeps this rank's
    slice without summing (every rank receives the same upstream gradient)."""

    @staticmethod
    def forward(ctx, x, check_ctx):
        ctx.rank = check_ctx.rank
        return torch.stack(_gather_all(check_ctx, x.detach()))

    @staticmethod
    def backward(ctx, g):
        return g[ctx.rank], None


class _Pick(torch.autograd.Function):
    """This rank's slice of every rank's inputs. gradcheck perturbs the same element on every
    rank at once, so each rank holds all ranks' inputs (identical everywhere) and picks its own;
    the backward sums every rank's gradient of its slice into the whole (an all-reduce)."""

    @staticmethod
    def forward(ctx, x_all, check_ctx):
        ctx.check_ctx = check_ctx
        return x_all[check_ctx.rank].clone()

    @staticmethod
    def backward(ctx, g):
        c = ctx.check_ctx
        full = g.new_zeros((c.world_size, *g.shape))
        full[c.rank] = g
        dist.all_reduce(full, group=c.gloo)
        return full, None


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(shape, dtype, seed):
    return torch.randn(shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _gathered_ref(shards, gd):
    nd = shards[0].dim()
    gd %= nd
    return torch.cat(shards, dim=gd)


# ---- gradcheck ---------------------------------------------------------------------------------


def _gradcheck(f, inputs):
    # Fast mode (random projections of the Jacobians) from the same seed on every rank, so that
    # every rank perturbs along the same directions: a few evaluations instead of one per element.
    torch.manual_seed(1234)
    torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True,
                             check_undefined_grad=False)


def check_gradcheck(ctx):
    W = ctx.world_size
    g = dist.group.WORLD
    failures, n = [], 0
    for ci, (shape, gd) in enumerate(AG_CASES):
        nd = len(shape)
        k = shape[-1] * (W if gd % nd == nd - 1 else 1)
        for return_A in (True, False):
            nb = 2 if ci % 2 == 0 else 1
            # Every rank's inputs, the same on every rank.
            A = _rand((W, *shape), torch.float64, 100 * ci).requires_grad_()
            Bs = [_rand((W, k, 2 + i), torch.float64, 100 * ci + 50 + 10 * i).requires_grad_()
                  for i in range(nb)]

            def f(A, *Bs):
                A = _Pick.apply(A, ctx)
                Bs = [_Pick.apply(B, ctx) for B in Bs]
                a, outs = cuda_p2p.fused_all_gather_matmul(A, list(Bs), gd, g, return_A=return_A)
                res = [_GatherForCheck.apply(o, ctx) for o in outs]
                if a is not None:  # a gradient through the returned A too
                    res.append(_GatherForCheck.apply(a * 0.5, ctx))
                return tuple(res)

            what = f"ag W={W} shape={shape} gather_dim={gd} return_A={return_A} Bs={nb}"
            try:
                _gradcheck(f, (A, *Bs))
            except Exception as e:  # noqa: BLE001
                failures.append(f"{what}: {str(e).splitlines()[0]}")
            n += 1
    for ci, (shape, sd, ncols) in enumerate(RS_CASES):
        nd = len(shape)
        last = sd % nd == nd - 1
        a_shape = list(shape)
        if not last:
            a_shape[sd] *= W
        N = ncols * W if last else ncols
        for reduce_op in ("sum", "avg"):
            A = _rand((W, *a_shape), torch.float64, 900 + 100 * ci).requires_grad_()
            B = _rand((W, shape[-1], N), torch.float64, 950 + 100 * ci).requires_grad_()

            def f(A, B):
                A, B = _Pick.apply(A, ctx), _Pick.apply(B, ctx)
                out = cuda_p2p.fused_matmul_reduce_scatter(A, B, reduce_op, sd, g)
                return _GatherForCheck.apply(out, ctx)

            what = f"rs W={W} A={tuple(a_shape)} scatter_dim={sd} {reduce_op}"
            try:
                _gradcheck(f, (A, B))
            except Exception as e:  # noqa: BLE001
                failures.append(f"{what}: {str(e).splitlines()[0]}")
            n += 1
    return {"cases": n, "failures": failures, "counters": {}}


# ---- against single-process torch ---------------------------------------------------------------


def _compare(failures, what, got, want, dtype):
    try:
        if got is None:
            raise AssertionError("no gradient")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(f"{tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} "
                                 f"{want.dtype}")
        torch.testing.assert_close(got.double(), want.double(), **TOL[dtype])
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0]}")


def check_ag_vs_reference(ctx, dtypes=("float32", "bfloat16")):
    W, rank = ctx.world_size, ctx.rank
    g = dist.group.WORLD
    failures, n = [], 0
    before = _counters(g)
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for ci, (shape, gd) in enumerate(AG_CASES):
            nd = len(shape)
            contraction = gd % nd == nd - 1
            k = shape[-1] * (W if contraction else 1)
            for return_A in (True, False):
                nb = 2 if ci % 2 == 0 else 1
                A = _rand(shape, dtype, 10 * ci + rank).requires_grad_()
                Bs = [_rand((k, 3 + i), dtype, 10 * ci + 500 + 37 * i + rank).requires_grad_()
                      for i in range(nb)]
                a, outs = cuda_p2p.fused_all_gather_matmul(A, Bs, gd, g, return_A=return_A)
                gouts = [_rand(o.shape, dtype, 7000 + 10 * ci + i + 100 * rank)
                         for i, o in enumerate(outs)]
                loss = sum((o * go).sum() for o, go in zip(outs, gouts))
                ga = None
                if a is not None:
                    ga = _rand(a.shape, dtype, 8000 + ci + 100 * rank)
                    loss = loss + (a * ga).sum()
                loss.backward()
                # Reference: everything in one process, in float64.
                As = [x.double().requires_grad_() for x in _gather_all(ctx, A.detach())]
                all_Bs = [[x.double().requires_grad_() for x in _gather_all(ctx, B.detach())]
                          for B in Bs]
                all_gouts = [[x.double() for x in _gather_all(ctx, go)] for go in gouts]
                full = _gathered_ref(As, gd)
                ref_loss = 0
                for s in range(W):
                    for i in range(nb):
                        ref_loss = ref_loss + (torch.matmul(full, all_Bs[i][s])
                                               * all_gouts[i][s]).sum()
                if ga is not None:
                    for s, x in enumerate(_gather_all(ctx, ga)):
                        ref_loss = ref_loss + (full * x.double()).sum()
                ref_loss.backward()
                what = f"ag {dname} W={W} shape={shape} gather_dim={gd} return_A={return_A}"
                _compare(failures, what + " grad A_shard", A.grad, As[rank].grad.to(dtype),
                         dtype)
                for i, B in enumerate(Bs):
                    _compare(failures, f"{what} grad B{i}", B.grad,
                             all_Bs[i][rank].grad.to(dtype), dtype)
                n += 1
    return {"cases": n, "failures": failures, "counters": _delta(before, _counters(g))}


def check_rs_vs_reference(ctx, dtypes=("float32", "bfloat16")):
    W, rank = ctx.world_size, ctx.rank
    g = dist.group.WORLD
    failures, n = [], 0
    before = _counters(g)
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for ci, (shape, sd, ncols) in enumerate(RS_CASES):
            nd = len(shape)
            last = sd % nd == nd - 1
            a_shape = list(shape)
            if not last:
                a_shape[sd] *= W
            N = ncols * W if last else ncols
            for reduce_op in ("sum", "avg"):
                A = _rand(tuple(a_shape), dtype, 30 * ci + rank).requires_grad_()
                B = _rand((shape[-1], N), dtype, 30 * ci + 700 + rank).requires_grad_()
                out = cuda_p2p.fused_matmul_reduce_scatter(A, B, reduce_op, sd, g)
                gout = _rand(out.shape, dtype, 9000 + ci + 100 * rank)
                (out * gout).sum().backward()
                As = [x.double().requires_grad_() for x in _gather_all(ctx, A.detach())]
                Bs = [x.double().requires_grad_() for x in _gather_all(ctx, B.detach())]
                total = sum(torch.matmul(a, b) for a, b in zip(As, Bs))
                if reduce_op == "avg":
                    total = total / W
                chunks = total.chunk(W, dim=sd)
                gouts = _gather_all(ctx, gout)
                sum((c * go.double()).sum() for c, go in zip(chunks, gouts)).backward()
                what = f"rs {dname} W={W} A={tuple(a_shape)} scatter_dim={sd} {reduce_op}"
                _compare(failures, what + " grad A", A.grad, As[rank].grad.to(dtype), dtype)
                _compare(failures, what + " grad B", B.grad, Bs[rank].grad.to(dtype), dtype)
                n += 1
    return {"cases": n, "failures": failures, "counters": _delta(before, _counters(g))}


def check_only_some_grads(ctx):
    """Only A, or only B, requires grad; an unused output; no grad mode at all."""
    W, rank = ctx.world_size, ctx.rank
    g = dist.group.WORLD
    failures, n = [], 0
    A = _rand((3, 4), torch.float32, rank)
    B0 = _rand((4, 2), torch.float32, 40 + rank)
    B1 = _rand((4, 3), torch.float32, 50 + rank)
    # Weights frozen: grad of A only.
    Ar = A.clone().requires_grad_()
    _, (o0, o1) = cuda_p2p.fused_all_gather_matmul(Ar, [B0, B1], 0, g, return_A=False)
    o0.sum().backward()  # o1 unused: its gradient is None
    full = torch.cat(_gather_all(ctx, A))
    want = torch.ones(3, 2) @ sum(_gather_all(ctx, B0)).t()  # every rank's o0 reaches A
    _compare(failures, "ag grad A only", Ar.grad, want, torch.float32)
    n += 1
    # Input frozen: grad of B only.
    B0r = B0.clone().requires_grad_()
    _, (o0,) = cuda_p2p.fused_all_gather_matmul(A, [B0r], 0, g, return_A=False)
    o0.sum().backward()
    _compare(failures, "ag grad B only", B0r.grad, full.t() @ torch.ones(W * 3, 2),
             torch.float32)
    n += 1
    # No grad mode: a plain forward, nothing recorded.
    with torch.no_grad():
        a, (o0,) = cuda_p2p.fused_all_gather_matmul(A.requires_grad_(), [B0r], 0, g)
    if o0.requires_grad or o0.grad_fn is not None:
        failures.append("no_grad: the output records a graph")
    _compare(failures, "no_grad forward", o0, full @ B0, torch.float32)
    n += 1
    return {"cases": n, "failures": failures, "counters": {}}
from _fused_checks import run_safely  # noqa: E402,F401


def check_errors_leave_group_usable(ctx):
    """Bad arguments, the same on every rank, raise before any communication; the next fused ops
    on the same group are correct. The kernel reached without the autograd formula (as the
    dispatcher's fallback reaches it) with a weight that requires grad raises up front too."""
    W, rank = ctx.world_size, ctx.rank
    g = dist.group.WORLD
    name = g.group_name
    A, B = torch.ones(3, 4), torch.ones(4, 2)
    cpu_only = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    bad = [
        (lambda: torch.ops.cuda_p2p.fused_all_gather_matmul.default.redispatch(
            cpu_only, A, [B.clone().requires_grad_()], 0, name), "requires grad"),
        (lambda: torch.ops.cuda_p2p.fused_matmul_reduce_scatter.default.redispatch(
            cpu_only, torch.ones(W, 4).requires_grad_(), B, "sum", 0, name, algorithm="auto",
            ring_steps=0), "requires grad"),
        (lambda: cuda_p2p.fused_all_gather_matmul(A.to_sparse(), [B], 0, g), "Sparse"),
        (lambda: cuda_p2p.fused_all_gather_matmul(A, [B.half()], 0, g), "dtype"),
        (lambda: cuda_p2p.fused_all_gather_matmul(A, [B, torch.ones(4, 2, 1)], 0, g),
         "to be a matrix"),
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W * 3 + 1, 4), B, "sum", 0, g),
         "divisible") if W > 1 else None,
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 0, g,
                                                      algorithm="pipeline", ring_steps=W),
         "ring_steps"),
    ]
    failures, n = [], 0
    for item in bad:
        if item is None:
            continue
        fn, needle = item
        try:
            fn()
            failures.append(f"expected an error containing {needle!r}, got none")
        except (RuntimeError, ValueError, NotImplementedError) as e:
            if needle not in str(e):
                failures.append(f"expected {needle!r} in: {str(e).splitlines()[0]}")
        n += 1
        # After each error the group is in step: a real op runs and is right on every rank.
        X = _rand((2, 4), torch.float32, 60 + n + rank)
        _, (o,) = cuda_p2p.fused_all_gather_matmul(X, [B], 0, g, return_A=False)
        _compare(failures, f"op after error {n}", o, torch.cat(_gather_all(ctx, X)) @ B,
                 torch.float32)
    # The issue's own case: a weight that requires grad, eager, then the group still works.
    Wt = _rand((4, 2), torch.float32, 70 + rank).requires_grad_()
    _, (o,) = cuda_p2p.fused_all_gather_matmul(A, [Wt], 0, g)
    o.sum().backward()
    _compare(failures, "weight grad", Wt.grad, torch.cat(_gather_all(ctx, A)).t()
             @ torch.ones(3 * W, 2), torch.float32)
    out = cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 0, g)
    _compare(failures, "op after the grad", out, torch.full((1, 2), 4.0 * W), torch.float32)
    n += 1
    return {"cases": n, "failures": failures, "counters": {}}
