"""Rank-side checks of the async-TP compile pass (python/cuda_p2p/_async_tp/).

torch.compile on CPU costs tens of seconds per graph on our machines, so each check compiles one
function holding many patterns at once and checks all of them: values and gradients against the
same function run eagerly (functional collectives on the same group: the unfused path), the
pass's own statistics (what it rewrote), and the backend's counters (which fused ops ran).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import cuda_p2p
from _fused_checks import _counters, _delta, run_safely  # noqa: F401

# torch 2.14 names these *_single and deprecates the *_tensor names; torch 2.11 (the GPU machines')
# has only the *_tensor names. The same ops either way.
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
_all_gather_autograd = (getattr(funcol, "all_gather_single_autograd", None)
                        or funcol.all_gather_tensor_autograd)
_reduce_scatter_autograd = (getattr(funcol, "reduce_scatter_single_autograd", None)
                            or funcol.reduce_scatter_tensor_autograd)

TOL = dict(atol=1e-4, rtol=1e-4)


def _rand(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).requires_grad_()


class _LogLines(logging.Handler):
    """Collects the pass's log lines."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


# The default group's name, a constant for dynamo (set by check_every_pattern_compiled_vs_eager).
_GROUP_NAME = None


def _every_fusable_pattern(x0, x3, h, h3, wq, wk, wv, w3, bias, w2, w23, wz, group):
    """Every pattern the pass fuses, in one function (autograd versions of the collectives),
    and a direct call of a fused op (its gradients under torch.compile)."""
    # gather dim 0, three consumers (Q, K, V; V an addmm with a bias), and another user of the
    # gathered tensor (return_A)
    a = _all_gather_autograd(x0, 0, group)
    q = a @ wq
    k = a @ wk
    v = torch.addmm(bias, a, wv)
    side = a.sum(dim=1, keepdim=True)
    # gather dim 1 of a 3-D tensor (split/getitem/cat), consumed through reshape -> mm -> reshape
    b = _all_gather_autograd(x3, 1, group)
    c = b @ w3
    # mm -> reduce-scatter, dim 0, "sum"
    r = _reduce_scatter_autograd(h @ w2, "sum", 0, group)
    # reshape -> mm -> reshape -> reduce-scatter along dim 1 (funcol differentiates "sum" only)
    r3 = _reduce_scatter_autograd(h3 @ w23, "sum", 1, group)
    if _GROUP_NAME is None:  # a Gloo group: no fused op
        return q, k, v * side, c, r, r3
    _, (z,) = torch.ops.cuda_p2p.fused_all_gather_matmul(x0, [wz], 0, _GROUP_NAME,
                                                         return_A=False)
    return q, k, v * side, c, r, r3, z


def _pattern_inputs(ctx):
    W, rank = ctx.world_size, ctx.rank
    return dict(
        x0=_rand((3, 8), 10 + rank), x3=_rand((2, 3, 8), 20 + rank),
        h=_rand((4 * W, 6), 30 + rank), h3=_rand((2, 2 * W, 6), 40 + rank),
        wq=_rand((8, 5), 50 + rank), wk=_rand((8, 4), 60 + rank), wv=_rand((8, 5), 70 + rank),
        w3=_rand((8, 7), 80 + rank), bias=_rand((5,), 90 + rank), w2=_rand((6, 8), 100 + rank),
        w23=_rand((6, 5), 110 + rank), wz=_rand((8, 3), 120 + rank),
    )


def _forward_backward(fn, inputs, group, grad=True):
    """fn's outputs on fresh copies of ``inputs``, and (``grad``) each input's gradient of the
    outputs' weighted sum (output i weighted i + 1, so that swapped outputs show)."""
    ins = {k: v.detach().clone().requires_grad_(grad) for k, v in inputs.items()}
    outs = fn(**ins, group=group)
    if grad:
        sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    return outs, {k: v.grad for k, v in ins.items()}


def _expect_close(failures, what, got, want):
    """Appends to ``failures`` the first line of assert_close's complaint, if any."""
    try:
        torch.testing.assert_close(got, want, **TOL)
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0]}")


_compiled = {}


def _no_compile_caches():
    from torch._inductor import config as inductor_config

    return inductor_config.patch(force_disable_caches=True)


def _compiled_every_fusable_pattern(dynamic):
    # One compiled function per dynamic setting, shared by the checks run on this worker.
    if dynamic not in _compiled:
        _compiled[dynamic] = torch.compile(_every_fusable_pattern, dynamic=dynamic, fullgraph=True)
    return _compiled[dynamic]


def check_every_pattern_compiled_vs_eager(ctx, dynamic=False, grad=True):
    """Every pattern, forward and backward, compiled with the pass vs eager; counters."""
    group = dist.group.WORLD
    failures, n = [], 0
    handler = _LogLines()
    logger = logging.getLogger("cuda_p2p.async_tp")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    inputs = _pattern_inputs(ctx)
    global _GROUP_NAME
    _GROUP_NAME = group.group_name
    try:
        want, want_grads = _forward_backward(_every_fusable_pattern, inputs, group, grad)
        before = _counters(group)
        # No cache: the pass must run for its log to be checked (a hit skips it, rightly).
        with cuda_p2p.async_tp() as p, _no_compile_caches():
            got, got_grads = _forward_backward(_compiled_every_fusable_pattern(dynamic), inputs,
                                               group, grad)
            reports = [str(r) for r in cuda_p2p.async_tp_report()]
        counters = _delta(before, _counters(group))
        for i, (g, w) in enumerate(zip(got, want)):
            _expect_close(failures, f"output {i}", g, w)
            n += 1
        if grad:
            for k in inputs:
                _expect_close(failures, f"grad {k}", got_grads[k], want_grads[k])
                n += 1
    finally:
        _GROUP_NAME = None
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return {"cases": n, "failures": failures, "counters": counters, "log": handler.lines,
            "pass_calls": p.calls, "reports": reports}


def check_pass_off_and_gloo(ctx):
    """The pass off: nothing fused. A Gloo group with the pass on: nothing fused either."""
    failures, n = [], 0
    inputs = _pattern_inputs(ctx)
    cuda_p2p.disable_async_tp()
    torch._dynamo.reset()
    group = dist.group.WORLD
    before = _counters(group)
    want, _ = _forward_backward(_every_fusable_pattern, inputs, group, grad=False)
    compiled = torch.compile(_every_fusable_pattern, fullgraph=True)
    got, _ = _forward_backward(compiled, inputs, group, grad=False)
    off = _delta(before, _counters(group))
    for i, (g, w) in enumerate(zip(got, want)):
        _expect_close(failures, f"pass off: output {i}", g, w)
        n += 1
    if any(k.startswith("fused_") for k in off):
        failures.append(f"the pass is off, yet fused ops ran: {off}")
    # Gloo: the pass is on, but the group is not ours.
    handler = _LogLines()
    logger = logging.getLogger("cuda_p2p.async_tp")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        torch._dynamo.reset()
        with cuda_p2p.async_tp(), _no_compile_caches():
            compiled = torch.compile(_every_fusable_pattern, fullgraph=True)
            got, _ = _forward_backward(compiled, inputs, ctx.gloo, grad=False)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    want, _ = _forward_backward(_every_fusable_pattern, inputs, ctx.gloo, grad=False)
    for i, (g, w) in enumerate(zip(got, want)):
        _expect_close(failures, f"gloo: output {i}", g, w)
        n += 1
    if not any("not on a cuda_p2p group" in line for line in handler.lines):
        failures.append(f"gloo: the log does not say why nothing was fused: {handler.lines}")
    if any(line.startswith("cuda_p2p async-TP: fused") for line in handler.lines):
        failures.append(f"gloo: something was fused: {handler.lines}")
    torch._dynamo.reset()
    return {"cases": n, "failures": failures, "counters": {}}


# ---- a DTensor tensor-parallel MLP, trained --------------------------------------------------

D, F, S = 16, 32, 8  # model dim, hidden dim, sequence length per rank


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.w1 = torch.nn.Linear(D, F)
        self.w2 = torch.nn.Linear(F, D)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(self.norm(x))))


def make_tp_mlp(group):
    """The MLP with sequence parallelism on the norm, ColwiseParallel w1, RowwiseParallel w2,
    on a mesh over ``group``; the same initial weights on every rank and for every group."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = MLP()
    mesh = DeviceMesh.from_group(group, "cpu")
    return parallelize_module(model, mesh, {
        "norm": SequenceParallel(sequence_dim=0),
        "w1": ColwiseParallel(input_layouts=Shard(0)),
        "w2": RowwiseParallel(output_layouts=Shard(0)),
    })


def train_tp_mlp(ctx, group, steps, compiled, phase_counters=None):
    """Loss per step and the final parameters (full tensors) of a few SGD steps."""
    model = make_tp_mlp(group)
    step_model = torch.compile(model, fullgraph=True) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x = _rand((S, D), 1000 * step + ctx.rank).detach()
        target = _rand((S, D), 2000 * step + ctx.rank).detach()
        opt.zero_grad()
        c0 = _counters(group) if phase_counters is not None else None
        out = step_model(x)
        loss = ((out - target) ** 2).mean()
        c1 = _counters(group) if phase_counters is not None else None
        loss.backward()
        if phase_counters is not None:
            phase_counters.append((_delta(c0, c1), _delta(c1, _counters(group))))
        opt.step()
        # The global loss (every rank's sequence shard), for comparison across runs.
        total = loss.detach().clone()
        dist.all_reduce(total, group=ctx.gloo)
        losses.append(float(total) / ctx.world_size)
    params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
    return losses, params


def check_dtensor_mlp(ctx, steps=3):
    """The compiled TP MLP with the pass matches eager on cuda_p2p and on Gloo, and ran both
    fused ops in forward and backward."""
    failures, n = [], 0
    group = dist.group.WORLD
    torch._dynamo.reset()
    eager_losses, eager_params = train_tp_mlp(ctx, group, steps, compiled=False)
    gloo_losses, gloo_params = train_tp_mlp(ctx, ctx.gloo, steps, compiled=False)
    phases = []
    with cuda_p2p.async_tp():
        comp_losses, comp_params = train_tp_mlp(ctx, group, steps, compiled=True,
                                                phase_counters=phases)
    torch._dynamo.reset()
    for what, losses, params in (("eager cuda_p2p", eager_losses, eager_params),
                                 ("eager gloo", gloo_losses, gloo_params)):
        _expect_close(failures, f"losses: compiled+fused vs {what}", torch.tensor(comp_losses),
                 torch.tensor(losses))
        for k in params:
            _expect_close(failures, f"param {k}: compiled+fused vs {what}", comp_params[k],
                          params[k])
        n += 1
    for step, (fwd, bwd) in enumerate(phases):
        for phase, c in (("forward", fwd), ("backward", bwd)):
            for op in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter"):
                if not any(k.startswith(op + ".") for k in c):
                    failures.append(f"step {step} {phase}: {op} did not run: {c}")
            n += 1
    return {"cases": n, "failures": failures, "counters": {}, "losses": comp_losses,
            "phases": phases}


# ---- the pass among other passes, the FX cache, dynamic shapes, inference ------------------------


def _gather_mm_relu_mm_scatter(x, h, w1, w2, group):
    """The smallest column- then row-parallel pair: one all-gather and one reduce-scatter."""
    a = _all_gather(x, 0, group)
    r = _reduce_scatter(torch.relu(a @ w1) @ w2, "sum", 0, group)
    return (r.wait() if hasattr(r, "wait") else r,)


class _UserPass:
    """A user's own post-grad pass (counts the graphs it saw)."""

    def __new__(cls):
        from torch._inductor.custom_graph_pass import CustomGraphPass

        class UserPass(CustomGraphPass):
            calls = 0

            def __call__(self, graph):
                type(self).calls += 1

            def uuid(self):
                return "test-user-pass-v1"

        return UserPass()


def check_user_pass_cache_dynamic(ctx):
    """With a user's pass already set: both run; dynamic=True; no grad (an inference graph); a
    second compile of the same function is an FX-cache hit and still runs the fused ops."""
    from torch._dynamo.utils import counters as dynamo_counters
    from torch._inductor import config as inductor_config

    group = dist.group.WORLD
    W = ctx.world_size
    failures, n = [], 0
    user = _UserPass()
    saved = inductor_config.post_grad_custom_post_pass
    # A cache of our own: the first compile must miss (so that both passes run), the second hit.
    import tempfile

    saved_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"cuda_p2p_fx_{ctx.rank}_")
    inductor_config.post_grad_custom_post_pass = user
    try:
        cuda_p2p.enable_async_tp()
        cur = inductor_config.post_grad_custom_post_pass
        # A list on torch 2.14; one chained pass where inductor takes no list (torch 2.11: NOTE
        # [One post-grad pass on older torch]).
        installed = list(cur) if isinstance(cur, list) else list(getattr(cur, "passes", [cur]))
        if not (installed[0] is user and len(installed) == 2):
            failures.append(f"enable_async_tp did not keep the user's pass first: {installed}")
        with torch.no_grad():
            for attempt in ("first compile", "second compile (cache)"):
                torch._dynamo.reset()
                hits = dynamo_counters["inductor"]["fxgraph_cache_hit"]
                for rows in (3, 5):  # dynamic=True: one graph for both sizes
                    x = _rand((rows, 8), rows + ctx.rank).detach()
                    h = None
                    w1 = _rand((8, 6), 7).detach()
                    w2 = _rand((6, 2 * W), 8).detach()
                    want = _gather_mm_relu_mm_scatter(x, h, w1, w2, group)[0]
                    before = _counters(group)
                    compiled = torch.compile(_gather_mm_relu_mm_scatter, dynamic=True,
                                             fullgraph=True)
                    got = compiled(x, h, w1, w2, group)[0]
                    c = _delta(before, _counters(group))
                    _expect_close(failures, f"{attempt} rows={rows}", got, want)
                    if set(c) != {"fused_all_gather_matmul.pull_ahead",
                                  "fused_matmul_reduce_scatter.ring"}:
                        failures.append(f"{attempt} rows={rows}: counters {c}")
                    n += 1
                if attempt.startswith("second") and \
                        dynamo_counters["inductor"]["fxgraph_cache_hit"] <= hits:
                    failures.append("the second compile was not an FX-cache hit")
        if user.calls == 0:
            failures.append("the user's own post-grad pass did not run")
        cuda_p2p.disable_async_tp()
        if inductor_config.post_grad_custom_post_pass is not user:
            failures.append("disable_async_tp did not restore the user's pass")
    finally:
        import shutil

        shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
        if saved_dir is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_dir
        cuda_p2p.disable_async_tp()
        inductor_config.post_grad_custom_post_pass = saved
        torch._dynamo.reset()
    return {"cases": n, "failures": failures, "counters": {}}


def check_symm_mem_nodes(ctx):
    """PyTorch's symm_mem fused nodes on our group become ours (FX only, no compile), and the
    rewritten graph computes what the unfused ops compute."""
    import torch.distributed._symmetric_memory  # noqa: F401

    from cuda_p2p._async_tp import rewrite

    group = dist.group.WORLD
    name = group.group_name
    failures, n = [], 0
    g = torch.fx.Graph()
    x, w, a2, w2 = (g.placeholder(s) for s in ("x", "w", "a2", "w2"))
    ag = g.call_function(torch.ops.symm_mem.fused_all_gather_matmul.default,
                         (x, [w], 0, name), {"return_A": False})
    outs = g.call_function(__import__("operator").getitem, (ag, 1))
    rs = g.call_function(torch.ops.symm_mem.fused_matmul_reduce_scatter.default,
                         (a2, w2, "sum", 0, name))
    g.output((outs, rs))
    report = rewrite(g)
    if report.symm_mem != 2:
        failures.append(f"expected 2 symm_mem nodes rewritten, got {report!r}")
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    W = ctx.world_size
    X, Wt = _rand((3, 4), ctx.rank).detach(), _rand((4, 5), 9).detach()
    A2, W2 = _rand((2 * W, 4), 20 + ctx.rank).detach(), _rand((4, 3), 21).detach()
    (o,), r = gm(X, Wt, A2, W2)
    full = torch.empty(3 * W, 4)
    dist.all_gather_into_tensor(full, X, group=ctx.gloo)
    _expect_close(failures, "symm_mem all-gather matmul", o, full @ Wt)
    ref = A2 @ W2
    dist.all_reduce(ref, group=ctx.gloo)
    _expect_close(failures, "symm_mem matmul reduce-scatter", r, ref.chunk(W)[ctx.rank])
    n += 2
    return {"cases": n, "failures": failures, "counters": {}}


# ---- a transformer block (tests/python/training/_async_tp_block.py), trained ----------------

# Counter suffixes that flag a property of a call, not a call.
_FLAGS = ("cross_memory", "zero_copy", "rounds", "grow")


def collective_calls(counters: dict) -> dict:
    """Calls per collective or fused op ("all_gather", "reduce_scatter", "all_reduce",
    "fused_all_gather_matmul", ...) in a counter delta."""
    calls = {}
    for k, v in counters.items():
        op, _, what = k.partition(".")
        if what and what not in _FLAGS:
            calls[op] = calls.get(op, 0) + v
    return calls


def _block_forward_backward(ctx, group, plan, compiled, checkpointed, bias, x, target):
    import _async_tp_block as blk

    model = blk.make_tp_model(group, plan, checkpointed=checkpointed, bias=bias)
    step = torch.compile(model, fullgraph=True) if compiled else model
    c0 = _counters(group)
    out = step(x)
    loss = ((out - target) ** 2).sum()
    c1 = _counters(group)
    loss.backward()
    c2 = _counters(group)
    grads = blk.full_grads(model, plan, group)
    return out.detach(), grads, collective_calls(_delta(c0, c1)), collective_calls(_delta(c1, c2))


def check_transformer_block(ctx, plan="dtensor", bias=False, checkpointed=("0.feed_forward",)):
    """A transformer block (its feed-forward under activation checkpointing), tensor + sequence
    parallel: compiled with the pass equals eager (outputs and every gradient), every all-gather
    and reduce-scatter of the step is fused (the report leaves none), and the compiled step runs
    no more collectives than eager, forward and backward counted apart."""
    import _async_tp_block as blk

    group = dist.group.WORLD
    W = ctx.world_size
    failures, n = [], 0
    B, S = 2, 2 * W
    g = torch.Generator().manual_seed(7)
    x_full = torch.randn(B, S, blk.DIM, generator=g)
    t_full = torch.randn(B, S, blk.DIM, generator=g)
    x = x_full.chunk(W, 1)[ctx.rank].contiguous()
    target = t_full.chunk(W, 1)[ctx.rank].contiguous()
    torch._dynamo.reset()
    want, want_grads, e_fwd, e_bwd = _block_forward_backward(ctx, group, plan, False,
                                                             checkpointed, bias, x, target)
    with cuda_p2p.async_tp() as p, _no_compile_caches():
        got, got_grads, c_fwd, c_bwd = _block_forward_backward(ctx, group, plan, True,
                                                               checkpointed, bias, x, target)
        reports = cuda_p2p.async_tp_report()
    torch._dynamo.reset()
    # The one-process model on the whole sequence: the reference for eager itself.
    ref_model = blk.make_model(checkpointed=checkpointed, bias=bias)
    ref = ref_model(x_full)
    ((ref - t_full) ** 2).sum().backward()
    _expect_close(failures, "eager vs one process", want, ref.detach().chunk(W, 1)[ctx.rank])
    _expect_close(failures, "compiled+fused vs eager", got, want)
    n += 2
    for k, v in want_grads.items():
        _expect_close(failures, f"grad {k}: compiled+fused vs eager", got_grads[k], v)
        ref_grad = dict(ref_model.named_parameters())[k].grad
        _expect_close(failures, f"grad {k}: eager vs one process", v, ref_grad)
        n += 2
    if len(want_grads) != len(list(ref_model.parameters())):
        failures.append(f"gradients of {sorted(want_grads)} only")
    for phase, e, c in (("forward", e_fwd, c_fwd), ("backward", e_bwd, c_bwd)):
        fused = c.get("fused_all_gather_matmul", 0) + c.get("fused_matmul_reduce_scatter", 0)
        left = c.get("all_gather", 0) + c.get("reduce_scatter", 0)
        if sum(c.values()) > sum(e.values()):
            failures.append(f"{phase}: compiled runs more collectives than eager: {c} vs {e}")
        if left or not fused:
            failures.append(f"{phase}: {left} all-gather/reduce-scatter left unfused, {fused} "
                            f"fused: compiled {c}, eager {e}")
        n += 2
    report = "\n".join(str(r) for r in reports)
    if not reports or any(r.left for r in reports):
        failures.append(f"the report leaves collectives:\n{report}")
    n += 1
    return {"cases": n, "failures": failures, "counters": {}, "report": report,
            "eager": (e_fwd, e_bwd), "compiled": (c_fwd, c_bwd), "pass_calls": p.calls}


# ---- the forms, on FX graphs (no inductor) -----------------------------------------------------


def _forms_as_traced(x1, wq, wk, A3, A3b, B, Bb, A2, B2, *, W, name):
    """The forms the pass must recognise, written as DTensor / funcol / inductor emit them."""
    c10d = torch.ops._c10d_functional
    # funcol's view form of a gather along dim 1 (the dim before it has size 1), two linear
    # consumers (view -> mm -> view), and the view saved for a backward-like product too.
    r = c10d.wait_tensor(c10d.all_gather_into_tensor(x1, W, name))  # [W, s, K]
    a = r.view(1, W * x1.shape[1], x1.shape[2])
    flat = a.view(-1, a.shape[-1])
    q = (flat @ wq).view(1, a.shape[1], -1)
    k = flat @ wk  # no view back
    saved = flat.t() @ k  # another reader of the gathered tensor
    # DTensor's scatter of dim 1: clone(permute(P)) -> reduce-scatter(dim 0) -> wait -> permute,
    # P a sum of two linear layers' products (w1/w3's input gradient).
    P = ((A3.reshape(-1, A3.shape[-1]) @ B).view(*A3.shape[:-1], -1)
         + (A3b.reshape(-1, A3b.shape[-1]) @ Bb).view(*A3b.shape[:-1], -1))
    T = P.permute(1, 0, 2).clone()
    s = c10d.wait_tensor(c10d.reduce_scatter_tensor(T, "sum", W, name)).permute(1, 0, 2)
    # A dtype cast between the matmul and the reduce-scatter: left, with its reason.
    c = c10d.wait_tensor(c10d.reduce_scatter_tensor((A2 @ B2).double(), "sum", W, name))
    return q, k, saved, s, c


def check_forms_on_traced_graphs(ctx):
    """Each form rewritten on a traced graph (make_fx, no inductor), and the rewritten graph
    computes what the original does; the report's reasons for what is left."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from cuda_p2p._async_tp import GraphReport, rewrite

    group = dist.group.WORLD
    W, name = ctx.world_size, group.group_name
    failures, n = [], 0
    g = torch.Generator().manual_seed(5 + ctx.rank)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    args = (r(1, 3, 8), r(8, 5), r(8, 4), r(2, 2 * W, 6), r(2, 2 * W, 7), r(6, 4), r(7, 4),
            r(2 * W, 6), r(6, 3))

    def f(*a):
        return _forms_as_traced(*a, W=W, name=name)

    want = f(*args)
    gm = make_fx(f)(*args)
    graph_report = rewrite(gm.graph)
    gm.recompile()
    report = str(graph_report)
    targets = [nd.target for nd in gm.graph.nodes]
    c10d = torch.ops._c10d_functional
    if targets.count(c10d.all_gather_into_tensor.default) != 0:
        failures.append(f"an all-gather is left in the graph:\n{gm.graph}")
    if targets.count(c10d.reduce_scatter_tensor.default) != 1:
        failures.append(f"expected the cast reduce-scatter only to be left:\n{gm.graph}")
    if not isinstance(graph_report, GraphReport) or graph_report.all_gather_matmul != 1 or \
            graph_report.matmul_reduce_scatter != 1 or len(graph_report.left) != 1:
        failures.append(f"report {graph_report!r}")
    if "gather_dim=1, 2 matmul(s), return_A" not in report or \
            "2 matmul(s), permuted [1, 0, 2]" not in report or \
            "LEFT: its input is produced by _to_copy" not in report:
        failures.append(f"report:\n{report}")
    n += 3
    got = gm(*args)
    for i, (a, b) in enumerate(zip(got, want)):
        _expect_close(failures, f"output {i}", a, b)
        n += 1
    return {"cases": n, "failures": failures, "counters": {}, "report": report}
