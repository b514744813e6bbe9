"""Rank-side checks of the fused ops against the unfused reference on a Gloo group.

The reference is what a user would write without the fused ops, exactly as PyTorch's own
unfused path does it: ``all_gather_into_tensor`` then ``.view(W, *shape).movedim(gather_dim + 1,
1).flatten(0, 1)`` and ``torch.matmul``, moved back to ``gather_dim`` (``torch.cat(chunks, -1)``
when the last dim is gathered); ``torch.matmul`` then ``reduce_scatter_tensor`` along
``scatter_dim`` (chunks moved to dim 0 first, as ``funcol.reduce_scatter_tensor`` does). Values
are compared with ``torch.testing.assert_close`` (dtype tolerances); shapes, strides and dtypes
exactly.

Inputs are a pure function of (case seed, rank). Every check returns
``{"cases": n, "failures": [...], "counters": {...}}``.
"""

from __future__ import annotations

import os
import time
import traceback

import torch
import torch.distributed as dist

import cuda_p2p

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (A_shard shape, gather_dim): 2-D and 3-D, every dim, odd sizes.
AG_CASES = [((3, 5), 0), ((3, 5), 1), ((3, 5), -1), ((3, 4, 5), 0), ((3, 4, 5), 1),
            ((3, 4, 5), 2), ((1, 3, 5), 1)]
# (A shape with the scattered dim's per-rank size, scatter_dim, N per rank when N is scattered
# else N): the scattered dim is multiplied by W.
RS_CASES = [((3, 5), 0, 7), ((3, 5), 1, 3), ((3, 5), -1, 1), ((2, 3, 5), 0, 7), ((2, 3, 5), 1, 7),
            ((2, 3, 5), 2, 3), ((1, 3, 5), 1, 5)]
RS_ALGORITHMS = [("pipeline", 0), ("ring", 0), ("ring", 2), ("auto", 0)]  # ring_steps: x W

_groups: dict = {}


def group_for(ctx, path: str):
    """The cuda_p2p group for a path, created once per worker (every rank in the same order)."""
    if path == "workspace":
        return dist.group.WORLD
    if path not in _groups:
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        if path == "no_workspace":
            opts.enable_workspace = False
        elif path == "rounds":
            opts.buffer_size = 4096
            opts.max_buffer_size = 4096
        elif path == "grow":
            opts.buffer_size = 4096
        elif path == "threads":
            opts.host_streams = "threads"  # NOTE [Cooperative host streams]
        if path == "two_hosts":
            host = "host-a" if ctx.rank < ctx.world_size // 2 else "host-b"
            os.environ["CUDA_P2P_HOST_ID"] = host
        try:
            _groups[path] = dist.new_group(backend="cuda_p2p", pg_options=opts)
        finally:
            os.environ.pop("CUDA_P2P_HOST_ID", None)
    return _groups[path]


def make_input(shape, dtype, seed: int, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if integer:
        # Exact in every dtype here: products and sums of small integers.
        return torch.randint(-2, 3, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def ref_all_gather_matmul(ctx, A_shard, Bs, gather_dim):
    W = ctx.world_size
    gathered = torch.empty((W * A_shard.shape[0],) + tuple(A_shard.shape[1:]), dtype=A_shard.dtype)
    dist.all_gather_into_tensor(gathered, A_shard.contiguous(), group=ctx.gloo)
    if gather_dim in (-1, A_shard.dim() - 1):
        A = torch.cat(gathered.chunk(W), dim=-1)
        return A, [torch.matmul(A, B) for B in Bs]
    A = gathered.view(W, *A_shard.shape).movedim(gather_dim + 1, 1).flatten(0, 1)
    return A.movedim(0, gather_dim), [torch.matmul(A, B).movedim(0, gather_dim) for B in Bs]


def ref_matmul_reduce_scatter(ctx, A, B, reduce_op, scatter_dim):
    W = ctx.world_size
    C = torch.matmul(A, B)
    if scatter_dim != 0:
        C = torch.cat(C.chunk(W, dim=scatter_dim))
    out = torch.empty((C.shape[0] // W,) + tuple(C.shape[1:]), dtype=C.dtype)
    dist.reduce_scatter_tensor(out, C.contiguous(), group=ctx.gloo)  # Gloo has no AVG
    if reduce_op == "avg":
        out = out / W
    return out


def _compare(failures, what, got, want, exact_strides=True):
    try:
        if got.shape != want.shape:
            raise AssertionError(f"shape {tuple(got.shape)} != {tuple(want.shape)}")
        if got.dtype != want.dtype:
            raise AssertionError(f"dtype {got.dtype} != {want.dtype}")
        if exact_strides and got.stride() != want.stride():
            raise AssertionError(f"strides {got.stride()} != {want.stride()}")
        torch.testing.assert_close(got, want)
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0] if str(e) else e!r}")


def _counters(group):
    return dict(cuda_p2p.get_cuda_p2p_backend(group).get_counters())


AG_ALGORITHMS = ("pipeline", "auto")  # "auto" is pull-ahead on CPU tensors


def check_all_gather_matmul(ctx, path: str, dtypes=tuple(DTYPES), cases=None, integer=True,
                            algorithms=AG_ALGORITHMS):
    group = group_for(ctx, path)
    W = ctx.world_size
    failures, n = [], 0
    before = _counters(group)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for ci, (shape, gd) in enumerate(cases or AG_CASES):
            for return_A, algorithm in [(r, a) for r in (True, False) for a in algorithms]:
                seed = 1000 * ci + 10 * list(DTYPES).index(dname) + return_A
                nd = len(shape)
                k = shape[-1] * (W if gd in (-1, nd - 1) else 1)
                Bs = [make_input((k, 7), dtype, seed + 900, integer)]
                if ci % 2 == 0:
                    Bs.append(make_input((k, 2), dtype, seed + 901, integer).t().contiguous().t())
                A_shard = make_input(shape, dtype, seed * 16 + ctx.rank, integer)
                what = (f"{path} W={W} {dname} shape={shape} gather_dim={gd} "
                        f"return_A={return_A} {algorithm}")
                try:
                    A, outs = cuda_p2p.fused_all_gather_matmul(
                        A_shard, Bs, gd, group, return_A=return_A, algorithm=algorithm
                    )
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{what}: raised {type(e).__name__}: {e}")
                    continue
                A_ref, outs_ref = ref_all_gather_matmul(ctx, A_shard, Bs, gd)
                if return_A:
                    _compare(failures, what + " (A)", A, A_ref)
                elif A is not None:
                    failures.append(f"{what}: A should be None with return_A=False")
                if len(outs) != len(Bs):
                    failures.append(f"{what}: {len(outs)} outputs for {len(Bs)} Bs")
                for i, (o, r) in enumerate(zip(outs, outs_ref)):
                    _compare(failures, f"{what} (out {i})", o, r)
                n += 1
    after = _counters(group)
    return {"cases": n, "failures": failures, "counters": _delta(before, after)}


def check_matmul_reduce_scatter(ctx, path: str, dtypes=tuple(DTYPES), cases=None,
                                algorithms=None, integer=True):
    group = group_for(ctx, path)
    W = ctx.world_size
    failures, n = [], 0
    before = _counters(group)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for ci, (shape, sd, ncols) in enumerate(cases or RS_CASES):
            nd = len(shape)
            last = sd in (-1, nd - 1)
            a_shape = list(shape)
            if not last:
                a_shape[sd] *= W
            N = ncols * W if last else ncols
            for reduce_op in ("sum", "avg"):
                for algorithm, steps_x in algorithms or RS_ALGORITHMS:
                    seed = 5000 + 1000 * ci + 10 * list(DTYPES).index(dname) + (reduce_op == "avg")
                    B = make_input((shape[-1], N), dtype, seed + 900, integer)
                    A = make_input(tuple(a_shape), dtype, seed * 16 + ctx.rank, integer)
                    what = (f"{path} W={W} {dname} A={tuple(a_shape)} scatter_dim={sd} "
                            f"{reduce_op} {algorithm} ring_steps={steps_x * W}")
                    try:
                        out = cuda_p2p.fused_matmul_reduce_scatter(
                            A, B, reduce_op, sd, group, algorithm=algorithm,
                            ring_steps=steps_x * W,
                        )
                    except Exception as e:  # noqa: BLE001
                        failures.append(f"{what}: raised {type(e).__name__}: {e}")
                        continue
                    ref = ref_matmul_reduce_scatter(ctx, A, B, reduce_op, sd)
                    _compare(failures, what, out, ref)
                    n += 1
    after = _counters(group)
    return {"cases": n, "failures": failures, "counters": _delta(before, after)}


def _delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def check_random_values(ctx, path: str):
    """Non-integer inputs: the fused results agree with the reference within float32 tolerance."""
    a = check_all_gather_matmul(ctx, path, dtypes=("float32",), integer=False)
    b = check_matmul_reduce_scatter(ctx, path, dtypes=("float32",), integer=False)
    return {"cases": a["cases"] + b["cases"], "failures": a["failures"] + b["failures"],
            "counters": {}}


def check_errors(ctx):
    """Wrong arguments raise before any communication, with messages saying what was expected."""
    W = ctx.world_size
    g = dist.group.WORLD
    name = g.group_name
    A = torch.ones(3 * W + 1, 4)
    B = torch.ones(4, 2)
    expectations = [
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(A, B, "sum", 0, g),
         f"must be divisible by the group size {W}") if W > 1 else None,
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), torch.ones(4, 2 * W + 1),
                                                      "sum", 1, g),
         f"B.size(1) = {2 * W + 1}") if W > 1 else None,
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "max", 0, g),
         'reduce_op must be one of "sum", "avg", got "max"'),
        (lambda: torch.ops.cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 0,
                                                                name, algorithm="fast"),
         'algorithm must be "auto", "pipeline" or "ring", got "fast"'),
        (lambda: torch.ops.cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [B], 0, name,
                                                            algorithm="ring"),
         'algorithm must be "auto", "pipeline" or "pull_ahead", got "ring"'),
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 0, g,
                                                      algorithm="ring", ring_steps=W + 1),
         "ring_steps must be a positive multiple of the group size") if W > 1 else None,
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 2, g),
         "scatter_dim must be in [-2, 2) for a 2-D A, got 2"),
        (lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), torch.ones(5, 2), "sum",
                                                      0, g),
         "needs B with A.size(-1) = 4 rows"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [torch.ones(5, 2)], 0, g),
         "Bs[0] has 5 rows, but the gathered A has 4 columns"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [torch.ones(4, 2)], 1, g),
         f"the gathered A has {4 * W} columns"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [torch.ones(4, 2).double()],
                                                  0, g),
         "expected Bs of A_shard's dtype Float, got Bs[0] of Double"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4, dtype=torch.int64),
                                                  [torch.ones(4, 2, dtype=torch.int64)], 0, g),
         "expected a floating-point A_shard"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(4), [torch.ones(4, 2)], 0, g),
         "at least 2 dims"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [torch.ones(4, 2)], 0,
                                                  ctx.gloo),
         "expected a group created with backend='cuda_p2p'"),
        (lambda: cuda_p2p.fused_all_gather_matmul(torch.ones(3, 4), [torch.ones(4, 2)], 0,
                                                  "no-such-group"),
         "no process group named 'no-such-group'"),
    ]
    failures, n = [], 0
    for item in expectations:
        if item is None:
            continue
        fn, needle = item
        try:
            fn()
            failures.append(f"expected an error containing {needle!r}, got none")
        except (RuntimeError, ValueError) as e:
            if needle not in str(e):
                failures.append(f"expected {needle!r} in: {str(e).splitlines()[0]}")
        n += 1
    # The group is still in step: a real op runs on every rank.
    out = cuda_p2p.fused_matmul_reduce_scatter(torch.ones(W, 4), B, "sum", 0, g)
    if not torch.equal(out, torch.full((1, 2), 4.0 * W)):
        failures.append(f"op after the errors returned {out}")
    return {"cases": n, "failures": failures, "counters": {}}


def check_meta_and_fake(ctx, compile_too: bool):
    """Meta kernels (via FakeTensor) give the shapes, dtypes and strides of the real kernels, and
    torch.compile traces the ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    W = ctx.world_size
    name = dist.group.WORLD.group_name
    failures, n = [], 0
    real_cases = []
    for shape, gd in AG_CASES:
        k = shape[-1] * (W if gd in (-1, len(shape) - 1) else 1)
        for dtype in (torch.float32, torch.bfloat16):
            A = make_input(shape, dtype, 1, True)
            Bs = [make_input((k, 3), dtype, 2, True), make_input((k, 6), dtype, 3, True)]
            real_cases.append(("ag", A, Bs, gd, torch.ops.cuda_p2p.fused_all_gather_matmul(
                A, Bs, gd, name)))
    for shape, sd, ncols in RS_CASES:
        a_shape = list(shape)
        last = sd in (-1, len(shape) - 1)
        if not last:
            a_shape[sd] *= W
        N = ncols * W if last else ncols
        A = make_input(tuple(a_shape), torch.float32, 4, True)
        B = make_input((shape[-1], N), torch.float32, 5, True)
        real_cases.append(("rs", A, [B], sd, torch.ops.cuda_p2p.fused_matmul_reduce_scatter(
            A, B, "sum", sd, name)))

    def same_layout(what, fake, real):
        if (fake.shape, fake.stride(), fake.dtype) != (real.shape, real.stride(), real.dtype):
            failures.append(f"{what}: fake {tuple(fake.shape)} {fake.stride()} {fake.dtype} vs "
                            f"real {tuple(real.shape)} {real.stride()} {real.dtype}")

    with FakeTensorMode() as mode:
        for kind, A, Bs, dim, real in real_cases:
            fA = mode.from_tensor(A)
            fBs = [mode.from_tensor(B) for B in Bs]
            what = f"{kind} shape={tuple(A.shape)} dim={dim} {A.dtype}"
            if kind == "ag":
                fa, fouts = torch.ops.cuda_p2p.fused_all_gather_matmul(fA, fBs, dim, name)
                same_layout(what + " (A)", fa, real[0])
                for i, (f, r) in enumerate(zip(fouts, real[1])):
                    same_layout(f"{what} (out {i})", f, r)
                none_a, _ = torch.ops.cuda_p2p.fused_all_gather_matmul(
                    fA, fBs, dim, name, return_A=False)
                if none_a is not None:
                    failures.append(f"{what}: fake A should be None with return_A=False")
            else:
                same_layout(what, torch.ops.cuda_p2p.fused_matmul_reduce_scatter(
                    fA, fBs[0], "sum", dim, name), real)
            n += 1

    if compile_too:
        def layer(x, w1, w2):
            _, (h,) = torch.ops.cuda_p2p.fused_all_gather_matmul(x, [w1], 0, name,
                                                                  return_A=False)
            return torch.ops.cuda_p2p.fused_matmul_reduce_scatter(torch.relu(h), w2, "sum", 0,
                                                                  name)

        x = make_input((4, 8), torch.float32, 10 + ctx.rank, True)
        w1 = make_input((8, 6), torch.float32, 11, True)
        w2 = make_input((6, 8), torch.float32, 12, True)
        eager = layer(x, w1, w2)
        torch._dynamo.reset()
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
        got = compiled(x, w1, w2)
        try:
            torch.testing.assert_close(got, eager)
        except AssertionError as e:
            failures.append(f"torch.compile: {e}")
        n += 1
    return {"cases": n, "failures": failures, "counters": {}}


def check_absent_rank(ctx):
    """A rank that never joins is named within the group's timeout, and later pipelines on that
    group refuse to run instead of hanging on signals that no longer match."""
    from _groups import group_that_times_out

    W = ctx.world_size
    g = group_that_times_out(ctx, 2)
    failures, n = [], 0
    absent = W - 1
    A, B = torch.ones(2 * W, 4), torch.ones(4, 3)
    if ctx.rank != absent:
        t0 = time.monotonic()
        try:
            cuda_p2p.fused_matmul_reduce_scatter(A, B, "sum", 0, g)
            failures.append("expected a timeout, got none")
        except RuntimeError as e:
            if "never arrived" not in str(e):
                failures.append(f"timeout error does not name the rank: {e}")
        if time.monotonic() - t0 > 30:
            failures.append(f"the timeout took {time.monotonic() - t0:.0f} s")
        try:
            cuda_p2p.fused_all_gather_matmul(A, [B], 0, g)
            failures.append("a pipeline after the failure ran")
        except RuntimeError as e:
            if "failed midway" not in str(e):
                failures.append(f"unexpected error after the failure: {e}")
        n += 2
    dist.barrier(group=ctx.gloo)
    return {"cases": n, "failures": failures, "counters": {}}


def run_safely(ctx, fn, *args, **kwargs):
    """Runs a check on a rank; an unexpected exception becomes a reported failure."""
    try:
        return fn(ctx, *args, **kwargs)
    except Exception:  # noqa: BLE001
        return {"cases": 0, "failures": [traceback.format_exc()], "counters": {}}
