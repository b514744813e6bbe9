"""One knob table (backend/knob_table.cpp; NOTE [Configuration rules]): docs/configuration.md shows
exactly that table, the Python Options have a property per Options knob and no other, and each
property refuses exactly what a group's resolution refuses, with the same message."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import PrefixStore

import cuda_p2p
from cuda_p2p import _C

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
BEGIN, END = "<!-- knobs: begin -->\n", "<!-- knobs: end -->"
Options = cuda_p2p.ProcessGroupCudaP2P.Options


def render_table(knobs) -> str:
    """docs/configuration.md's table of the knobs, as `python tests/python/clients/test_config.py
    --write-docs` writes it."""
    lines = ["| Options field | environment variable | type | default | what it does |",
             "|---|---|---|---|---|"]
    for k in knobs:
        cells = [f"`{k['option']}`" if k["option"] else "-", f"`{k['env']}`" if k["env"] else "-",
                 k["type"], k["default"], k["help"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _doc_table(text: str) -> str:
    return text.split(BEGIN)[1].split(END)[0]


def test_docs_table_is_the_knob_table():
    assert _doc_table(DOC.read_text()) == render_table(_C._config_knobs()), (
        "docs/configuration.md is out of date with backend/config.cpp: run "
        "`python tests/python/clients/test_config.py --write-docs`")


def test_the_options_properties_are_the_options_knobs():
    knobs = {k["option"] for k in _C._config_knobs() if k["option"]}
    properties = {name for name, v in vars(Options).items() if isinstance(v, property)}
    assert properties == knobs | {"nccl_options"}


def _probes(knob):
    """Values around the knob's rules, as the table states them."""
    if knob["kind"] in ("bytes", "int"):
        lo, hi, step = knob["min"], knob["max"], knob["step"]
        return sorted({lo - 1, lo, lo + step, hi, hi + 1, -1, 0, 1, 4096, 5000, lo + step // 2})
    if knob["kind"] == "names":
        return knob["names"] + [n.upper() for n in knob["names"]] + ["bogus"]
    return []


def _allowed(knob, value) -> bool:
    """The knob's rule, read from the table (not from the C++ check)."""
    if knob["kind"] == "names":
        return value in knob["names"]
    return knob["min"] <= value <= knob["max"] and value % knob["step"] == 0


def _refusal(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("knob", [k for k in _C._config_knobs() if k["option"]],
                         ids=lambda k: k["option"])
def test_a_property_refuses_what_the_resolution_refuses(knob, monkeypatch):
    """The property refuses a value exactly when the table's rule does, with one message format
    naming the field; a value it accepts, a group accepts too (resolve_config, through
    _hierarchy_host); one it refuses, a group refuses from the variable with the same message
    naming the variable."""
    name, env = knob["option"], knob["env"]
    resolve = cuda_p2p.ProcessGroupCudaP2P._hierarchy_host
    for value in _probes(knob):
        o = Options()
        msg = _refusal(lambda: setattr(o, name, value))
        if _allowed(knob, value):
            assert msg is None, (value, msg)
            assert getattr(o, name) == value
            resolve(o, 1)  # raises if the group refuses it
            continue
        if knob["kind"] == "names":
            shape = rf"must be one of {re.escape('|'.join(knob['names']))}, got '{value}'"
        else:
            shape = rf"must be (a multiple of \S+ \S+ )?in \[[^]]+\], got {value}"
        assert msg is not None and re.fullmatch(rf"cuda_p2p: Options\.{name} {shape}", msg), \
            (value, msg)
        assert getattr(o, name) == getattr(Options(), name), "left as it was"
        if env:
            monkeypatch.setenv(env, str(value))
            by_env = _refusal(lambda: resolve(Options(), 1))
            monkeypatch.delenv(env)
            want = msg.replace(f"Options.{name}", env)
            if knob["kind"] != "names":
                want += f" ('{value}')"
            assert by_env is not None and by_env.startswith(want), (value, by_env, want)


def test_ring_steps_zero_is_the_world_size():
    o = Options()
    o.ring_steps = 0  # docs/configuration.md: "0: the world size"
    assert o.ring_steps == 0
    cuda_p2p.ProcessGroupCudaP2P._hierarchy_host(o, 4)


# ---------------------------------------------------------------------------------------------
# NOTE [The workspace's GPU] (backend/config.cpp): which GPU a CUDA workspace takes, as a unit
# with fake device counts, LOCAL_RANK and bound devices (no GPU needed).

def _choose(bound=None, count=8, current=0, **env):
    return _C._testing.choose_cuda_device(bound, count, current, env)


def test_the_bound_device_comes_first():
    assert _choose(bound=5, count=8, current=0, LOCAL_RANK="2")[0] == 5
    assert "device_id" in _choose(bound=5)[1]
    assert _choose(bound=0, count=1, current=0, LOCAL_RANK="3")[0] == 0


def test_local_rank_comes_next_modulo_the_visible_gpus():
    assert _choose(count=8, current=0, LOCAL_RANK="3") == (3, "LOCAL_RANK=3 (mod 8 visible GPUs)")
    # One GPU per process (CUDA_VISIBLE_DEVICES per rank): every rank on its only GPU.
    assert _choose(count=1, current=0, LOCAL_RANK="5")[0] == 0
    # More ranks than GPUs on the host: round-robin.
    assert [_choose(count=4, current=0, LOCAL_RANK=str(r))[0] for r in range(8)] == \
        [0, 1, 2, 3, 0, 1, 2, 3]
    assert _choose(count=8, current=0, LOCAL_RANK="007")[0] == 7


def test_a_device_the_user_set_beats_local_rank():
    # Only torch.cuda.set_device makes the current device other than cuda:0.
    assert _choose(count=8, current=6, LOCAL_RANK="0") == (
        6, "the current device (torch.cuda.set_device)")
    assert _choose(count=8, current=6, LOCAL_RANK="2")[0] == 6


def test_the_current_device_comes_last():
    assert _choose(count=8, current=0) == (0, "the current device (torch.cuda.current_device())")
    assert _choose(count=8, current=6)[0] == 6
    assert _choose(count=8, current=0, LOCAL_RANK="")[0] == 0  # empty: unset


@pytest.mark.parametrize("bad", ["-1", "one", "1K", " 1", "1.0", "+2", "9999999999"])
def test_a_local_rank_that_is_no_integer_is_an_error(bad):
    with pytest.raises(ValueError, match=r"LOCAL_RANK must be a non-negative integer .*got '"):
        _choose(count=8, current=0, LOCAL_RANK=bad)


@pytest.mark.parametrize("bound", [8, 9, -1])
def test_a_bound_device_out_of_range_is_an_error(bound):
    with pytest.raises(ValueError, match=rf"bound by init_process_group\(device_id=...\) is "
                                         rf"cuda:{bound}, but this process sees 8 GPUs"):
        _choose(bound=bound, count=8, current=0)


def test_no_visible_gpu_or_a_current_device_out_of_range_is_an_error():
    with pytest.raises(RuntimeError, match="needs a visible GPU, got 0 visible"):
        _choose(count=0, current=0)
    with pytest.raises(RuntimeError, match="current CUDA device is 3, but this process sees 2"):
        _choose(count=2, current=3)


class _Pg:
    def __init__(self, bound):
        self.bound_device_id = bound


class _Opts:
    def __init__(self, pg):
        self.process_group = pg


def test_the_bound_device_is_read_from_the_group_torch_passes():
    from cuda_p2p._backend import _bound_cuda_index

    assert _bound_cuda_index(_Opts(_Pg(torch.device("cuda", 3)))) == 3
    assert _bound_cuda_index(_Opts(_Pg(None))) is None
    assert _bound_cuda_index(_Opts(_Pg(torch.device("cpu")))) is None
    assert _bound_cuda_index(_Opts(None)) is None
    assert _bound_cuda_index(object()) is None  # a torch whose options have no process_group


_PROBE = r"""
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from cuda_p2p._backend import _bound_cuda_index

seen = []

def creator(opts, pg_options):
    seen.append(_bound_cuda_index(opts))
    return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)

dist.Backend.register_backend("bound_probe", creator, extended_api=True, devices=["cpu", "cuda"])
pg, _ = c10d._new_process_group_helper(
    1, 0, [], "bound_probe", dist.HashStore(), group_name="bound_probe",
    timeout=timedelta(seconds=10), device_id=torch.device("cuda", 2))
print("seen", seen, "bound", pg.bound_device_id)
sys.exit(0 if seen == [2] else 1)
"""


def test_init_process_group_device_id_reaches_the_creator():
    """torch hands the device of init_process_group(device_id=...) to an extended-API creator as
    opts.process_group.bound_device_id: checked in a fresh process with torch's own group
    construction (init_process_group's inner helper: the public call refuses a CUDA device_id
    where there is no GPU) and a creator that records what _bound_cuda_index finds."""
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_one_gpu_warning():
    from cuda_p2p._backend import _one_gpu_warning

    same = ["GPU-aaaa"] * 4
    msg = _one_gpu_warning(same, 8)
    assert msg and "all 4 ranks" in msg and "GPU-aaaa" in msg and "8 GPUs" in msg, msg
    assert "torch.cuda.set_device(local_rank)" in msg and "device_id=" in msg, msg
    assert _one_gpu_warning(same, 4)  # one GPU per rank there: still wrong
    assert _one_gpu_warning(same, 3) is None  # fewer GPUs than ranks: sharing is all there is
    assert _one_gpu_warning(same, 1) is None  # the GPU test setup: ranks share the one GPU
    assert _one_gpu_warning(["GPU-a", "GPU-b", "GPU-a", "GPU-b"], 8) is None
    assert _one_gpu_warning(["GPU-a"], 8) is None  # one rank
    assert _one_gpu_warning(["unknown"] * 2, 8) is None  # a torch without uuids
    with pytest.raises(RuntimeError, match="malformed GPU record of rank 1"):
        _one_gpu_warning(["GPU-a", "x" * 200], 8)
    with pytest.raises(RuntimeError, match="malformed GPU record of rank 0"):
        _one_gpu_warning(["", "GPU-a"], 8)


def test_the_one_gpu_check_exchanges_uuids_through_the_store():
    import torch.distributed as dist

    from cuda_p2p._backend import _check_one_gpu

    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=10))  # a wrong key fails in seconds, not 5 minutes
    store.set("cuda_p2p/gpu_uuid/1", "GPU-same")  # rank 1 has published already
    with pytest.warns(UserWarning, match="all 2 ranks of a group put their CUDA workspace"):
        _check_one_gpu(store, 0, 2, "GPU-same", 2)
    assert store.get("cuda_p2p/gpu_uuid/0") == b"GPU-same"
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=10))
    store.set("cuda_p2p/gpu_uuid/1", "GPU-other")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_one_gpu(store, 0, 2, "GPU-same", 2)  # two GPUs: nothing to say
        store.set("cuda_p2p/gpu_uuid/0", "GPU-same")
        _check_one_gpu(PrefixStore("x/", store), 0, 1, "GPU-same", 2)  # one rank


if __name__ == "__main__" and sys.argv[1:] == ["--write-docs"]:
    text = DOC.read_text()
    DOC.write_text(text.replace(_doc_table(text), render_table(_C._config_knobs())))
    print(f"wrote the knob table of {DOC}")
