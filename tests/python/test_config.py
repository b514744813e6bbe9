"""docs/configuration.md lists exactly the knobs backend/config.cpp reads (one place for
configuration), and the Python Options expose every Options knob."""

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

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _doc_rows():
    text = DOC.read_text()
    table = text.split("<!-- knobs: begin -->")[1].split("<!-- knobs: end -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        option, env, typ, default, help_ = cells
        rows.append({"option": option.strip("`") if option != "-" else "",
                     "env": env.strip("`") if env != "-" else "",
                     "type": typ, "default": default, "help": help_})
    return rows


def test_docs_table_matches_the_knobs():
    assert _doc_rows() == list(_C._config_knobs()), (
        "docs/configuration.md is out of date with backend/config.cpp: regenerate the table "
        "from cuda_p2p._C._config_knobs()")


def test_every_options_knob_is_a_python_property():
    options = cuda_p2p.ProcessGroupCudaP2P.Options()
    for knob in _C._config_knobs():
        if knob["option"]:
            assert hasattr(options, knob["option"]), knob["option"]


# ---------------------------------------------------------------------------------------------
# NOTE [The workspace's GPU] (backend/config.cpp): which GPU a CUDA workspace takes, as a unit
# with fake device counts, LOCAL_RANK and bound devices (no GPU needed).

def _choose(bound=None, count=8, current=0, **env):
    return _C._choose_cuda_device(bound, count, current, env)


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
