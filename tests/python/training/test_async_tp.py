"""The async-TP compile pass (python/cuda_p2p/_async_tp/) on 2 ranks, and the compiled DTensor
tensor-parallel MLP on 2 and 4 ranks.

Compiling on CPU is slow here (tens of seconds per graph), so each test compiles one function that
holds every pattern at once (see _async_tp_checks.py).
"""

from __future__ import annotations

import pytest

import _async_tp_checks as atc
from test_fused_ops import assert_all_ok


def test_every_pattern_forward_and_backward(world2):
    res = world2.run(atc.run_safely, atc.check_every_pattern_compiled_vs_eager, timeout=600)
    assert_all_ok(res, 7 + 12)
    log = "\n".join(res[0]["log"])
    # Forward: 2 all-gathers (dim 0 with Q/K/V and return_A, dim 1 reshape-mm-reshape) and 2
    # reduce-scatters. Backward: each reduce-scatter's adjoint is an all-gather feeding matmuls
    # (2), each all-gather's a reduce-scatter of a matmul (a sum of them for Q/K/V); but the dim-0
    # one also sums the gradient of the gathered tensor's other user (an expand, not a matmul):
    # left, and said why.
    assert log.count("fused all-gather") == 4, log
    assert log.count("fused matmul with reduce-scatter") == 3, log
    assert "left reduce-scatter" in log and "produced by expand" in log, log
    assert "3 matmul(s), return_A" in log, log
    reports = res[0]["reports"]
    assert len(reports) == 2 and "left 1" in reports[1] and "LEFT: its input" in reports[1], reports
    # The direct call of fused_all_gather_matmul (return_A=False) adds one all-gather->matmul
    # forward, and in backward a matmul->reduce-scatter (grad x0) and an all-gather->matmul (the
    # shard gathered again for grad wz).
    c = res[0]["counters"]
    assert c.get("fused_all_gather_matmul.pull_ahead") == 4 + 2, c
    assert c.get("fused_matmul_reduce_scatter.ring") == 3 + 1, c


def test_dtensor_tp_mlp_trains_on_the_fused_ops(world):
    # world: 2 and 4 ranks
    res = world.run(atc.run_safely, atc.check_dtensor_mlp, timeout=600)
    assert_all_ok(res, 2 + 3 * 2)  # 3 steps x (forward, backward)


def test_pass_off_and_gloo_group_change_nothing(world2):
    assert_all_ok(world2.run(atc.run_safely, atc.check_pass_off_and_gloo, timeout=600), 12)


def test_user_pass_fx_cache_dynamic_no_grad(world2):
    assert_all_ok(world2.run(atc.run_safely, atc.check_user_pass_cache_dynamic, timeout=600), 4)


def test_symm_mem_nodes_become_ours(world2):
    assert_all_ok(world2.run(atc.run_safely, atc.check_symm_mem_nodes), 2)


_SWITCHES_SCRIPT = r"""
import cuda_p2p
from torch._inductor import config
def installed():  # a list on torch 2.14, one chain of them on 2.11
    cur = config.post_grad_custom_post_pass
    return list(cur) if isinstance(cur, list) else list(getattr(cur, "passes", [cur]))
assert cuda_p2p.is_async_tp_enabled(), "CUDA_P2P_ASYNC_TP=1 did not enable the pass at import"
cuda_p2p.disable_async_tp()
assert not cuda_p2p.is_async_tp_enabled() and config.post_grad_custom_post_pass is None
mine = lambda graph: None
config.post_grad_custom_post_pass = mine
with cuda_p2p.async_tp() as p:
    assert installed() == [mine, p]
    cur = config.post_grad_custom_post_pass
    assert callable(cur) or isinstance(cur, list)
    u1 = p.uuid()
assert config.post_grad_custom_post_pass is mine
p2 = cuda_p2p.enable_async_tp(matmul_reduce_scatter=False)
assert p2.uuid() != u1, "the options are not part of the uuid"
cuda_p2p.enable_async_tp()
assert installed()[0] is mine and len(installed()) == 2
cuda_p2p.disable_async_tp()
assert config.post_grad_custom_post_pass is mine
print("ok")
"""


def test_switches_and_environment_variable():
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_P2P_ASYNC_TP="1")
    r = subprocess.run([sys.executable, "-c", _SWITCHES_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_pass_uuid_changes_with_every_source_file(tmp_path):
    """The FX-cache key's source hash covers every file of the pass and the autograd formulas: a
    change to any one of them (in a copy of the installed package) changes it."""
    import pathlib
    import shutil

    from cuda_p2p._async_tp import install

    installed = pathlib.Path(install.__file__).parent
    copy = tmp_path / "cuda_p2p" / "_async_tp"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(installed.parent / "_autograd.py", copy.parent / "_autograd.py")
    base = install._source_hash(str(copy))
    assert base == install._source_hash()
    files = sorted(copy.glob("*.py")) + [copy.parent / "_autograd.py"]
    assert {"__init__.py", "match.py", "fuse.py", "report.py", "install.py",
            "_autograd.py"} <= {f.name for f in files}, files
    for f in files:
        text = f.read_text()
        f.write_text(text + "\n# changed\n")
        assert install._source_hash(str(copy)) != base, f"{f.name} is not part of the hash"
        f.write_text(text)
    assert install._source_hash(str(copy)) == base


def test_several_passes_become_one_chain_where_inductor_takes_no_list(monkeypatch):
    """NOTE [One post-grad pass on older torch]: the path torch 2.11 takes, run here on any torch
    by making the pass believe lists are not taken."""
    import torch
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from cuda_p2p import _async_tp

    class UserPass(CustomGraphPass):
        def __init__(self):
            self.graphs = []

        def __call__(self, graph):
            self.graphs.append(graph)

        def uuid(self):
            return "user-pass-v1"

    monkeypatch.setattr(_async_tp.install, "_takes_lists", lambda: False)
    monkeypatch.setattr(config, "post_grad_custom_post_pass", None)
    user = UserPass()
    config.post_grad_custom_post_pass = user
    ours = _async_tp.enable_async_tp()
    chain = config.post_grad_custom_post_pass
    assert isinstance(chain, CustomGraphPass) and not isinstance(chain, list)
    assert chain.passes == [user, ours]
    assert chain.uuid() == ("cuda_p2p.chain", ("user-pass-v1", ours.uuid()))
    graph = torch.fx.Graph()
    chain(graph)  # every member runs, in order
    assert user.graphs == [graph] and ours.calls == 1
    assert _async_tp.is_async_tp_enabled()

    _async_tp.disable_async_tp()
    assert config.post_grad_custom_post_pass is user  # one pass again: no chain

    # A plain callable in the chain: a plain chain, so that inductor bypasses its FX cache.
    seen = []
    config.post_grad_custom_post_pass = seen.append
    ours = _async_tp.enable_async_tp()
    chain = config.post_grad_custom_post_pass
    assert not isinstance(chain, CustomGraphPass) and callable(chain)
    chain(graph)
    assert seen == [graph] and ours.calls == 1
    _async_tp.disable_async_tp()
    assert config.post_grad_custom_post_pass == seen.append


# The DTensor plan with biases (the bias adds between the matmuls and the collectives), the
# functional-collective plan without; 2 ranks (the pass matches the same graphs on 4, which
# test_dtensor_tp_mlp_trains_on_the_fused_ops and the fp8 MLP cover; a compile of this model on 4
# ranks took 77 s of CI).
@pytest.mark.parametrize("plan,bias", [("dtensor", True), ("funcol", False)],
                         ids=["dtensor-biases", "funcol"])
def test_transformer_block_fuses_everything_w2(world2, plan, bias):
    """Two transformer blocks (RMSNorm, attention, SwiGLU; the second checkpointed) with
    torch's TP styles and with plain functional collectives: every all-gather and reduce-scatter
    fused forward and backward (recompute included), no more collectives than eager, values and
    gradients equal to eager and to the one-process model; the report says so."""
    res = world2.run(atc.run_safely, atc.check_transformer_block, plan=plan, bias=bias,
                     timeout=900)
    assert_all_ok(res, 10)
    r = res[0]
    assert "LEFT" not in r["report"] and "fused" in r["report"], r["report"]


def test_forms_on_traced_graphs(world):
    """funcol's view-form gather, a gather's other readers, DTensor's permute/clone scatter of a
    sum of matmuls, and a cast left with its reason: traced with make_fx, rewritten, run."""
    res = world.run(atc.run_safely, atc.check_forms_on_traced_graphs)
    assert_all_ok(res, 8)
