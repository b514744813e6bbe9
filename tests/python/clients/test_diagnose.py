"""`python -m cuda_p2p`: the report without a group, and with `--world-size 2` (it starts the
ranks itself) in text and JSON, checked against what torch and the knobs' table say."""

from __future__ import annotations

import json
import os
import sys

import torch

from _harness import run_script

TIMEOUT_S = 120


def _run(args, **env):
    full = dict(os.environ, **env)
    res = run_script([sys.executable, "-m", "cuda_p2p", *args], timeout=TIMEOUT_S, env=full)
    assert not res.timed_out, f"python -m cuda_p2p {args} did not finish:\n{res.output[-5000:]}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.output[-5000:]}"
    return res.output


def test_report_without_a_group(capsys):
    from cuda_p2p import _C, _diagnose

    assert _diagnose.main([]) == 0
    text = capsys.readouterr().out
    assert "cuda_p2p diagnostic" in text
    assert f"torch:             {torch.__version__}" in text, text
    build = _C._build_info()
    assert ("CUDA compiled in:  no" in text) == (not build["cuda"]), text
    assert f"host reduction:    {build['host_reduction']}" in text, text
    assert "GPUs visible to torch: " + ("none" if not torch.cuda.is_available() else "cuda:0") \
        in text, text
    assert "no group" in text
    assert _diagnose.main(["--json"]) == 0
    env = json.loads(capsys.readouterr().out)["environment"]
    assert env["torch"] == torch.__version__ and env["build"] == dict(build), env


def test_world_size_2_text():
    text = _run(["--world-size", "2"], CUDA_P2P_CHUNK_BYTES="512K")
    assert "group of 2 rank(s)" in text, text
    for r in range(2):
        assert f"  rank {r}:" in text, text
    assert text.count("workspace:       up on cpu, 32 MiB buffer per rank") == 2, text
    assert "collectives:     on the workspace for CPU tensors" in text, text
    assert "cross-memory:    off: " in text, text
    assert text.count("send/recv:       mailboxes for CPU tensors (two 1 MiB slots per pair of "
                      "ranks)") == 2, text
    lines = text.splitlines()
    chunk = [ln for ln in lines if ln.strip().startswith("chunk_bytes ")]
    assert len(chunk) == 1 and "512K -> 524288  (environment) [CUDA_P2P_CHUNK_BYTES]" in chunk[0], \
        chunk
    heap = [ln for ln in lines if ln.strip().startswith("symmetric_heap_size ")]
    assert len(heap) == 1 and "1 GiB  (default)" in heap[0], heap


def _facts_without_workspace(ctx):
    """A group made under CUDA_P2P_DISABLE_WORKSPACE=1: what the report says of it."""
    import torch.distributed as dist

    import cuda_p2p
    from _harness import scoped_environ
    from cuda_p2p import _diagnose

    with scoped_environ({"CUDA_P2P_DISABLE_WORKSPACE": "1",
                         "CUDA_P2P_ALL_REDUCE_ALGO": "two_shot"}):
        g = dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    facts = _diagnose.group_facts(b)
    text = "\n".join(_diagnose._format_group([facts]))
    dist.destroy_process_group(g)
    return facts, text


def test_report_of_a_group_without_workspace(world2):
    from cuda_p2p import _C

    knobs = {k["option"] or k["env"]: k for k in _C._config_knobs()}
    for r, (f, text) in enumerate(world2.run(_facts_without_workspace)):
        assert f["rank"] == r and f["world_size"] == 2 and f["workspace"] is False
        assert f["workspace_reason"] == "disabled by CUDA_P2P_DISABLE_WORKSPACE=1", f
        assert f["collectives"] is False and "unavailable" in f["collectives_reason"], f
        assert "gloo (cpu tensors)" in f["wrapped"], f
        got = {k["option"] or k["env"]: k for k in f["knobs"]}
        assert set(got) == set(knobs), "every knob is reported"
        assert got["enable_workspace"]["source"] == "environment"
        assert got["all_reduce_algo"]["value"] == "two_shot"
        assert got["all_reduce_algo"]["source"] == "environment"
        assert got["ring_steps"] == {"option": "ring_steps", "env": "CUDA_P2P_RING_STEPS",
                                     "value": knobs["ring_steps"]["default"], "source": "default",
                                     "resolved": 2}
        assert "workspace:       off: disabled by CUDA_P2P_DISABLE_WORKSPACE=1" in text, text
        assert "collectives:     wrapped backend: the workspace is unavailable" in text, text
        assert "fused ops:       decomposed over the wrapped backend" in text, text
        assert "send/recv:       wrapped backend" in text, text


def _knob_sources(ctx):
    """Options beat the environment; the environment beats the default (one group each)."""
    import torch.distributed as dist

    import cuda_p2p
    from _harness import scoped_environ

    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.chunk_bytes = 1 << 16
    o.all_reduce_algo = "one_shot"
    o.hierarchical = False
    with scoped_environ({"CUDA_P2P_CHUNK_BYTES": "2M", "CUDA_P2P_RING_STEPS": "4",
                         "CUDA_P2P_ALL_GATHER_ALGO": "auto"}):
        g = dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p", pg_options=o)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    knobs = {k["option"] or k["env"]: (k["value"], k["source"]) for k in b._knob_values()}
    cfg = b.get_collective_config()
    dist.destroy_process_group(g)
    return knobs, cfg


def test_knob_sources(world2):
    from cuda_p2p import _C

    reported = {k["option"] for k in _C._config_knobs() if k["reported"]}
    for knobs, cfg in world2.run(_knob_sources):
        chunk, steps = cfg["chunk_bytes"], cfg["ring_steps"]
        # get_collective_config reports every knob the table marks, resolved for the group.
        assert reported <= set(cfg), reported - set(cfg)
        assert cfg["all_reduce_one_shot_max_bytes"] == 64 << 10  # 2 ranks
        assert cfg["zero_copy_agreement"] == "exchange"  # the host's default
        assert knobs["chunk_bytes"] == ("65536", "Options") and chunk == 1 << 16
        assert knobs["all_reduce_algo"] == ("one_shot", "Options")
        assert knobs["hierarchical"] == ("False", "Options")
        assert knobs["ring_steps"] == ("4", "environment") and steps == 4
        # "auto" in the environment leaves the choice to the default, as resolve_config reads it.
        assert knobs["all_gather_algo"] == ("auto", "default")
        assert knobs["buffer_size"] == ("32 MiB", "default")
