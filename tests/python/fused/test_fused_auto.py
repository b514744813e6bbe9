""""auto" takes the unfused path below Options.fused_min_flops (NOTE [Unfused below a size] in
backend/dispatcher_fused_ops.cpp): the results equal plain torch's (values, shapes, strides,
dtypes) on every gather/scatter dim, the counters say which path ran on each side of the
threshold, an explicit algorithm still runs fused, and the knob is validated."""

from __future__ import annotations

import pytest

import _fused_checks as fc

WORLDS = ["world2", "world3", "world4"]


def _unfused_group(ctx, min_flops):
    import torch.distributed as dist

    import cuda_p2p

    key = f"min_flops={min_flops}"
    if key not in fc._groups:
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        opts.fused_min_flops = min_flops
        fc._groups[key] = dist.new_group(backend="cuda_p2p", pg_options=opts)
    return fc._groups[key]


def _check_both(ctx, min_flops, algorithms, rs_algorithms):
    """The workspace checks of _fused_checks on a group with the given threshold."""
    group = _unfused_group(ctx, min_flops)
    fc._groups["auto_threshold"] = group
    ag = fc.check_all_gather_matmul(ctx, "auto_threshold", algorithms=algorithms)
    rs = fc.check_matmul_reduce_scatter(ctx, "auto_threshold", algorithms=rs_algorithms)
    return {"cases": ag["cases"] + rs["cases"], "failures": ag["failures"] + rs["failures"],
            "counters": {**ag["counters"], **rs["counters"]}}


def _run(world, *args):
    results = world.run(fc.run_safely, _check_both, *args)
    failures = [f"[rank {r}] {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures[:40])
    return results


@pytest.fixture(params=WORLDS, ids=["w2", "w3", "w4"])
def any_world(request):
    return request.getfixturevalue(request.param)


def test_auto_below_threshold_is_unfused_and_exact(any_world):
    # Every case of the fused tests (every dim of 2-D and 3-D A, odd sizes, fp32/bf16/fp16,
    # return_A, several Bs, sum/avg) is far below 1 GFLOP: "auto" runs unfused.
    results = _run(any_world, 1 << 30, ("auto",), [("auto", 0)])
    n_ag = len(fc.AG_CASES) * len(fc.DTYPES) * 2
    n_rs = len(fc.RS_CASES) * len(fc.DTYPES) * 2
    c = results[0]["counters"]
    assert c.get("fused_all_gather_matmul.unfused") == n_ag, c
    assert c.get("fused_matmul_reduce_scatter.unfused") == n_rs, c
    assert not any(k.startswith("fused_") and not k.endswith(".unfused") for k in c), c


def test_explicit_algorithm_forces_fused(world2):
    results = _run(world2, 1 << 30, ("pipeline",), [("ring", 0), ("auto", 2)])
    c = results[0]["counters"]
    assert not any(k.endswith(".unfused") for k in c), c
    assert c.get("fused_all_gather_matmul.pipeline", 0) > 0, c
    assert c.get("fused_matmul_reduce_scatter.ring", 0) > 0, c


def _threshold_sides(ctx):
    import torch

    import cuda_p2p

    W = ctx.world_size
    # AG: A_shard [4, 6] gathered to [4W, 6] times B [6, 5]: 2 * 4W * 6 * 5 flops per rank.
    ag_flops = 2 * 4 * W * 6 * 5
    # RS: A [2W, 6] @ B [6, 5]: 2 * 2W * 6 * 5 flops per rank.
    rs_flops = 2 * 2 * W * 6 * 5
    out = {}
    for name, flops in (("ag", ag_flops), ("rs", rs_flops)):
        for side, thr in (("above", flops + 1), ("at", flops)):
            g = _unfused_group(ctx, thr)
            b = cuda_p2p.get_cuda_p2p_backend(g)
            b.reset_counters()
            if name == "ag":
                A = torch.full((4, 6), float(ctx.rank + 1))
                cuda_p2p.fused_all_gather_matmul(A, [torch.ones(6, 5)], 0, g)
            else:
                cuda_p2p.fused_matmul_reduce_scatter(torch.ones(2 * W, 6), torch.ones(6, 5),
                                                     "sum", 0, g)
            out[f"{name} {side}"] = {k: v for k, v in b.get_counters().items()
                                     if k.startswith("fused_")}
    return out


def test_counters_on_each_side_of_the_threshold(world2, world3):
    for world in (world2, world3):
        c = world.run(_threshold_sides)[0]
        # flops < threshold: unfused; flops >= threshold: fused (the host's auto algorithm).
        assert c["ag above"] == {"fused_all_gather_matmul.unfused": 1}, c
        assert c["ag at"] == {"fused_all_gather_matmul.pull_ahead": 1}, c
        assert c["rs above"] == {"fused_matmul_reduce_scatter.unfused": 1}, c
        assert c["rs at"] == {"fused_matmul_reduce_scatter.ring": 1}, c


def test_knob_parsing_and_validation(monkeypatch):
    import cuda_p2p
    from cuda_p2p import _C

    opts = cuda_p2p.ProcessGroupCudaP2P.Options()
    assert opts.fused_min_flops is None
    opts.fused_min_flops = 123
    assert opts.fused_min_flops == 123
    with pytest.raises(ValueError, match=r"fused_min_flops must be in \[0, "):
        opts.fused_min_flops = -1
    knob = [k for k in _C._config_knobs() if k["option"] == "fused_min_flops"]
    assert knob and knob[0]["env"] == "CUDA_P2P_FUSED_MIN_FLOPS", knob


def _config_with_env(ctx, value):
    import torch.distributed as dist

    import cuda_p2p
    from _harness import scoped_environ

    with scoped_environ({"CUDA_P2P_FUSED_MIN_FLOPS": value}):
        try:
            g = dist.new_group(backend="cuda_p2p")
        except Exception as e:  # noqa: BLE001
            return f"error: {e}"
        return cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()["fused_min_flops"]


def test_env_var_parsed_and_default(world2):
    assert world2.run(_config_with_env, "2M") == [2 << 20] * 2
    assert world2.run(_config_with_env, "0") == [0] * 2
    assert world2.run(_config_with_env, None) == [8 << 30] * 2  # the host's default
    bad = world2.run(_config_with_env, "lots")
    assert all("CUDA_P2P_FUSED_MIN_FLOPS must be an integer" in b for b in bad), bad
    bad = world2.run(_config_with_env, "-5")
    assert all("CUDA_P2P_FUSED_MIN_FLOPS must be in [0" in b for b in bad), bad


def _grads(ctx):
    import torch

    import cuda_p2p

    W = ctx.world_size
    out = {}
    for label, thr in (("unfused", 1 << 30), ("fused", 0)):
        g = _unfused_group(ctx, thr)
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        gen = torch.Generator().manual_seed(7 + ctx.rank)
        A = torch.randn(3, 5, generator=gen).requires_grad_()
        B = torch.randn(5, 4, generator=gen).requires_grad_()
        A2 = torch.randn(2 * W, 5, generator=gen).requires_grad_()
        _, [h] = cuda_p2p.fused_all_gather_matmul(A, [B], 0, g)
        y = cuda_p2p.fused_matmul_reduce_scatter(A2, B, "sum", 0, g)
        (h.square().sum() + y.square().sum()).backward()
        out[label] = ([t.grad for t in (A, B, A2)],
                      {k: v for k, v in b.get_counters().items() if k.startswith("fused_")})
    return out


def test_autograd_through_the_unfused_path(world2, world3):
    import torch

    for world in (world2, world3):
        for res in world.run(_grads):
            (gu, cu), (gf, cf) = res["unfused"], res["fused"]
            assert cu and all(k.endswith(".unfused") for k in cu), cu
            assert cf and not any(k.endswith(".unfused") for k in cf), cf
            for u, f in zip(gu, gf):
                torch.testing.assert_close(u, f)


def _compiled(ctx):
    import torch

    import cuda_p2p

    g = _unfused_group(ctx, 1 << 30)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    name = g.group_name
    W = ctx.world_size

    def layer(x, w_up, w_down):
        _, [h] = torch.ops.cuda_p2p.fused_all_gather_matmul(x, [w_up], 0, name, return_A=False)
        return torch.ops.cuda_p2p.fused_matmul_reduce_scatter(torch.relu(h), w_down, "sum", 0,
                                                              name)

    gen = torch.Generator().manual_seed(3 + ctx.rank)
    x, w_up, w_down = (torch.randn(2, 6, generator=gen), torch.randn(6, 8, generator=gen),
                       torch.randn(8, 6, generator=gen))
    b.reset_counters()
    eager = layer(x, w_up, w_down)
    compiled = torch.compile(layer, fullgraph=True)(x, w_up, w_down)
    torch.testing.assert_close(compiled, eager)
    assert compiled.shape == (2, 6) and compiled.stride() == eager.stride(), compiled.stride()
    c = {k: v for k, v in b.get_counters().items() if k.startswith("fused_")}
    assert c == {"fused_all_gather_matmul.unfused": 2, "fused_matmul_reduce_scatter.unfused": 2}, c
    return W


def test_torch_compile_through_the_unfused_path(world2):
    assert world2.run(_compiled) == [2, 2]


def _split_decisions(ctx):
    """Rank 0 runs unfused (its threshold is above the GEMM), the others fused (threshold 0), then
    rank 1 passes a bad B while the others' shapes put them on the unfused path: every rank must
    raise an error naming the disagreement, quickly (a short group timeout turns a hang into a
    different error), and the group must still run an op on which the ranks agree."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import cuda_p2p

    W, r = ctx.world_size, ctx.rank
    key = "split_decisions"
    if key not in fc._groups:
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        opts.fused_min_flops = (1 << 30) if r == 0 else 0
        fc._groups[key] = dist.new_group(backend="cuda_p2p", pg_options=opts,
                                         timeout=timedelta(seconds=20))
    g = fc._groups[key]
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    out = {}

    def attempt(label, fn):
        try:
            fn()
            out[label] = "no error"
        except Exception as e:  # noqa: BLE001
            out[label] = f"{type(e).__name__}: {e}"

    A = torch.full((4, 6), float(r + 1))
    attempt("ag", lambda: cuda_p2p.fused_all_gather_matmul(A, [torch.ones(6, 5)], 0, g))
    attempt("rs", lambda: cuda_p2p.fused_matmul_reduce_scatter(torch.ones(2 * W, 6),
                                                                torch.ones(6, 5), "sum", 0, g))
    # Rank 0 alone is on the unfused path here; rank 1's B has the wrong K (its local check
    # fails, so it rejects through the fused op's handshake).
    B = torch.ones(7 if r == 1 else 6, 5)
    attempt("bad", lambda: cuda_p2p.fused_all_gather_matmul(A, [B], 0, g))
    # Forced fused on every rank: they agree, the group still works.
    _, [h] = cuda_p2p.fused_all_gather_matmul(A, [torch.ones(6, 5)], 0, g, algorithm="pull_ahead")
    ref = torch.cat([torch.full((4, 6), float(q + 1)) for q in range(W)]) @ torch.ones(6, 5)
    out["after"] = bool(torch.equal(h, ref))
    out["counters"] = {k: v for k, v in b.get_counters().items() if k.startswith("fused_")}
    return out


def test_ranks_that_choose_differently_raise_instead_of_hanging(world2, world3):
    for world in (world2, world3):
        for r, res in enumerate(world.run(_split_decisions)):
            for op in ("ag", "rs"):
                msg = res[op]
                assert msg.startswith("SignatureMismatch") or "disagree" in msg, (r, op, msg)
                assert "unfused" in msg, (r, op, msg)
                fused = "pull_ahead" if op == "ag" else "ring"
                assert fused in msg, (r, op, msg)
                assert "timed out" not in msg and "timeout" not in msg, (r, op, msg)
            bad = res["bad"]
            # Rank 1 raises its own check's error; its peers, on either path, name it.
            want = "Bs[0] has 7 rows" if r == 1 else "rank 1 rejected"
            assert want in bad, (r, bad)
            assert "timed out" not in bad and "timeout" not in bad, (r, bad)
            assert res["after"] is True, (r, res)
            # Nothing ran on either path until the forced fused op.
            assert res["counters"] == {"fused_all_gather_matmul.pull_ahead": 1}, (r, res)


def _auto_by_knobs(ctx):
    """What "auto" runs above the threshold on groups whose knobs fused_all_gather_algo and
    fused_reduce_scatter_algo are left to the device (the host's defaults), set through Options
    or through the variables, and one set differently on one rank: {case: (counters, the knobs as
    the group reports them, the results right)} or the error text."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import cuda_p2p
    from _harness import scoped_environ

    W, r = ctx.world_size, ctx.rank
    cases = {
        "default": ({}, {}),
        "options auto": ({"fused_all_gather_algo": "auto", "fused_reduce_scatter_algo": "auto"},
                         {}),
        "options": ({"fused_all_gather_algo": "pipeline",
                     "fused_reduce_scatter_algo": "pipeline"}, {}),
        "variables": ({}, {"CUDA_P2P_FUSED_ALL_GATHER_ALGO": "pipeline",
                           "CUDA_P2P_FUSED_REDUCE_SCATTER_ALGO": "pipeline"}),
        # Rank 0 alone pulls ahead: the fused op's handshake names what each rank resolved.
        "rank 0 differs": ({}, {"CUDA_P2P_FUSED_ALL_GATHER_ALGO": "pull_ahead" if r == 0
                                else "pipeline"}),
    }
    A = torch.full((4, 6), float(r + 1))
    gathered = torch.cat([torch.full((4, 6), float(q + 1)) for q in range(W)])
    out = {}
    for case, (fields, env) in cases.items():
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        for name, value in fields.items():
            setattr(opts, name, value)
        with scoped_environ(env):
            g = dist.new_group(backend="cuda_p2p", pg_options=opts,
                               timeout=timedelta(seconds=20))
        b = cuda_p2p.get_cuda_p2p_backend(g)
        cfg = b.get_collective_config()
        try:
            _, [h] = cuda_p2p.fused_all_gather_matmul(A, [torch.ones(6, 5)], 0, g)
            rs = cuda_p2p.fused_matmul_reduce_scatter(torch.ones(2 * W, 6), torch.ones(6, 5),
                                                      "sum", 0, g)
            # ring_steps ask for the ring whatever the knob; an explicit algorithm beats it.
            rs_steps = cuda_p2p.fused_matmul_reduce_scatter(
                torch.ones(2 * W, 6), torch.ones(6, 5), "sum", 0, g, ring_steps=W)
            _, [h2] = cuda_p2p.fused_all_gather_matmul(A, [torch.ones(6, 5)], 0, g,
                                                       algorithm="pull_ahead")
        except Exception as e:  # noqa: BLE001
            out[case] = f"{type(e).__name__}: {e}"
            continue
        right = (torch.equal(h, gathered @ torch.ones(6, 5)) and torch.equal(h2, h)
                 and torch.equal(rs, torch.full((2, 5), 6.0 * W)) and torch.equal(rs_steps, rs))
        out[case] = ({k: v for k, v in b.get_counters().items() if k.startswith("fused_")},
                     (cfg["fused_all_gather_algo"], cfg["fused_reduce_scatter_algo"]), right)
    return out


def test_auto_runs_what_the_group_knobs_say(world2):
    host = ({"fused_all_gather_matmul.pull_ahead": 2, "fused_matmul_reduce_scatter.ring": 2},
            ("pull_ahead", "ring"), True)
    chosen = ({"fused_all_gather_matmul.pipeline": 1, "fused_all_gather_matmul.pull_ahead": 1,
               "fused_matmul_reduce_scatter.pipeline": 1, "fused_matmul_reduce_scatter.ring": 1},
              ("pipeline", "pipeline"), True)
    for r, res in enumerate(world2.run(_auto_by_knobs)):
        assert res["default"] == host and res["options auto"] == host, (r, res)
        assert res["options"] == chosen and res["variables"] == chosen, (r, res)
        msg = res["rank 0 differs"]
        assert isinstance(msg, str) and "disagree" in msg, (r, msg)
        assert "pull_ahead" in msg and "pipeline" in msg and "timed out" not in msg, (r, msg)
