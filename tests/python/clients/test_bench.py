"""Every benchmark script runs from a checkout after scripts/setup.sh, for one tiny case.

The scripts are run as a user runs them (`python bench/<script>.py ...`, the installed cuda_p2p,
no source folder on sys.path), each in a process of its own with a time limit. A new script in
bench/ must get an entry in TINY below, or this test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"

# script -> arguments of one tiny case ({out} is a fresh directory); what the output must contain.
# gpu_timing.py needs a GPU: here it must say so and exit 2 (scripts/gpu_check.sh runs it there).
NEEDS_GPU = {"gpu_timing.py"}
# Scripts that run no benchmark, each checked by a test of its own.
TESTED_APART = {"compare_results.py": "test_compare_results_lists_every_worse_ratio"}
TINY = {
    "bench_training.py": (
        # The eager variant only: the script's plumbing, its JSON and table. The compiled+fused
        # variant is the TP MLP that training/test_async_tp.py and examples/async_tp_training.py
        # compile and check (an inductor compile per rank costs ~25 s here); --long runs it.
        ["--world-sizes", "2", "--dim", "32", "--tokens", "16", "--iters", "1", "--warmup", "1",
         "--variants", "eager", "--out", "{out}"],
        None,
    ),
    "bench_collectives.py": (
        ["--world-sizes", "2", "--sizes", "8", "4K", "--collectives", "all_reduce", "send_recv",
         "--iters", "3", "--warmup", "1", "--no-barrier", "--json", "{out}/c.json",
         "--no-plot", "--timeout", "120", "--core-probe", "0.05"],
        "{out}/c.json",
    ),
    "bench_fsdp.py": (
        # It fails (exit 1) when the symmetric variant ran no zero-copy collective, or its
        # parameters differ from the staged one's.
        ["--world-sizes", "2", "--layers", "2", "--dim", "16", "--tokens", "4", "--iters", "1",
         "--warmup", "1", "--json", "{out}/f.json", "--plot", "{out}/f.png"],
        "{out}/f.json",
    ),
    "bench_fused.py": (
        ["--world-sizes", "2", "--shapes", "64x32", "--dtypes", "float32", "--iters", "2",
         "--warmup", "1", "--out-dir", "{out}"],
        None,
    ),
    "bench_pipeline.py": (
        # It fails (exit 1) when cuda_p2p's send/recv did not run on the mailboxes, or its
        # parameters differ from Gloo's.
        ["--world-sizes", "2", "--dim", "16", "--tokens", "4", "--microbatches", "2", "--iters",
         "1", "--warmup", "1", "--json", "{out}/p.json", "--plot", "{out}/p.png"],
        "{out}/p.json",
    ),
    "bench_windows.py": (
        ["--world-sizes", "2", "--sizes", "8", "4K", "--iters", "5", "--samples", "2",
         "--warmup", "1", "--json", "{out}/win.json"],
        "{out}/win.json",
    ),
    "bench_workspace.py": (
        ["--world-sizes", "2", "--sizes", "4096", "--barrier-iters", "20", "--json",
         "{out}/w.json"],
        "{out}/w.json",
    ),
}

# With --long (scripts/test.sh --long), added to a tiny case (a later --variants replaces the
# earlier one).
LONG_EXTRA = {"bench_training.py": ["--variants", "compiled+fused"]}


def run_bench(script: str, args: list[str], cwd: Path, timeout: float = 300):
    """Runs bench/<script> as a user runs it (the installed or built package, not the sources) and
    asserts that it exited 0; returns the finished process."""
    env = dict(os.environ)
    # Not the source tree: the scripts must work with the package as installed. A PYTHONPATH
    # holding a built package stays (scripts/gpu_check.sh runs this suite with its build there).
    keep = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep)
            if p and list(Path(p).glob("cuda_p2p/_C*.so"))]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
        f"stderr:\n{proc.stderr[-4000:]}")
    return proc


def test_every_script_has_a_tiny_case():
    scripts = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
    missing = [s for s in scripts if s not in TINY and s not in NEEDS_GPU and s not in TESTED_APART]
    assert not missing, f"bench scripts without a tiny case in {__file__}: {missing}"


@pytest.mark.parametrize("script", sorted(TINY))
def test_bench_script_runs(script, tmp_path, request):
    args, json_out = TINY[script]
    args = [a.format(out=tmp_path) for a in args]
    if request.config.getoption("--long"):
        args += LONG_EXTRA.get(script, [])
    # bench_collectives.py may build DeepSpeed's op the first time (check_peer_columns).
    proc = run_bench(script, args, tmp_path, timeout=1500 if script == "bench_collectives.py"
                     else 300)
    if json_out:
        data = json.loads(Path(json_out.format(out=tmp_path)).read_text())
        assert data, f"{script} wrote an empty result"
        if script == "bench_collectives.py":
            check_core_probe(data)
            check_peer_columns(data, proc)
    else:
        assert any(tmp_path.glob("*.json")), f"{script} wrote no JSON into {tmp_path}"


def check_core_probe(data: dict) -> None:
    """The placement probe of a bench_collectives.py run with --core-probe 0.05: samples through
    the run, and every cell lists those taken while it ran."""
    probe = data["meta"]["core_probe"]
    if len(os.sched_getaffinity(0)) < 2:
        assert not probe["enabled"], probe
        return
    assert probe["enabled"] and probe["error"] is None, probe
    # Probes that found a CPU busy (a loaded machine) record no round trip; together with the
    # recorded ones they are the probes taken: the first, and at least one during the run.
    assert probe["samples"] + probe["busy_samples"] >= 2, probe
    assert len(probe["timeline"]) == probe["samples"], probe
    assert all(10 < ns < 1e6 for _, ns in probe["timeline"]), probe["timeline"]
    times = [t for t, _ in probe["timeline"]]
    assert times == sorted(times)
    for e in data["runs"][0]["results"]:
        if not probe["samples"]:  # every probe found a CPU busy: no cell has samples
            assert e["cores"] is None, e
            continue
        t0, t1 = e["t_monotonic"]
        inside = [ns for t, ns in probe["timeline"] if t0 <= t <= t1]
        assert e["cores"]["round_trip_ns"] == inside and e["cores"]["samples"] == len(inside), e


def test_core_round_trip_probe_and_its_errors():
    from cuda_p2p import _C

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        r = _C._core_round_trip_ns(cpus[0], cpus[1], 0.001)
        # A machine busy with something else may keep a CPU from the probe: then it says so, with
        # the batches that did complete (fewer than 32), instead of raising.
        assert (r["batches"] < 32) == r["busy"], r
        if r["batches"]:
            assert 0 < r["min_ns"] <= r["median_ns"], r
        if not r["busy"]:
            assert r["median_ns"] < 1e6, r
    with pytest.raises(ValueError, match="two different CPUs.*got 0 and 0"):
        _C._core_round_trip_ns(0, 0, 0.001)
    with pytest.raises(ValueError, match="two different CPUs.*got -1 and 0"):
        _C._core_round_trip_ns(-1, 0, 0.001)
    outside = max(cpus) + 1
    with pytest.raises(ValueError, match=f"cannot run a thread on CPU {outside}"):
        _C._core_round_trip_ns(cpus[0], outside, 0.001)
    for seconds in (0, -1, 1.5):
        with pytest.raises(ValueError, match="expected seconds in \\(0, 1\\]"):
            _C._core_round_trip_ns(0, 1, seconds)


def test_core_placement_windows_and_variation():
    # The bookkeeping alone, on made-up samples: each cell gets the samples of its span, and the
    # run "varied" when its slowest sample took more than VARIED_FACTOR times its fastest.
    sys.path.insert(0, str(BENCH))
    try:
        from _common import CorePlacementProbe
    finally:
        sys.path.remove(str(BENCH))
    probe = CorePlacementProbe([0, 1], period_s=0)  # never probes by itself
    assert not probe.enabled and probe.window(0, 1) is None and not probe.varied()
    probe.samples = [(1.0, 70.0), (2.0, 72.0), (3.0, 100.0), (4.0, 71.0)]
    assert not probe.varied()
    assert probe.window(1.5, 3.5) == {"samples": 2, "round_trip_ns": [72.0, 100.0],
                                      "run_varied": False}
    probe.samples.append((5.0, 310.0))
    assert probe.varied()
    assert probe.window(4.5, 9) == {"samples": 1, "round_trip_ns": [310.0], "run_varied": True}
    assert probe.window(6, 7) == {"samples": 0, "round_trip_ns": [], "run_varied": True}
    summary = probe.summary()
    assert (summary["min_ns"], summary["max_ns"], summary["typical_ns"]) == (70.0, 310.0, 72.0)
    assert summary["varied"] and summary["samples"] == 5 and len(summary["timeline"]) == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs its real case in scripts/gpu_check.sh")
@pytest.mark.parametrize("script", sorted(NEEDS_GPU))
def test_gpu_script_says_no_gpu(script):
    proc = subprocess.run([sys.executable, str(BENCH / script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr + proc.stdout, (
        proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])


def test_bench_collectives_hierarchical(tmp_path):
    # --host-sizes 2 1: the measured group spans two simulated hosts of uneven size and runs
    # hierarchically through the hosts' leaders (counted); --hosts N makes even ones (the --link
    # test below).
    out = tmp_path / "h.json"
    # --agreement-cost: a second such group with its agreement off, timed beside it.
    args = ["--world-sizes", "3", "--host-sizes", "2", "1", "--sizes", "8", "4K", "--iters", "3",
            "--warmup", "1", "--no-barrier", "--json", str(out), "--no-plot", "--timeout", "120",
            "--agreement-cost"]
    proc = run_bench("bench_collectives.py", args, tmp_path)
    data = json.loads(out.read_text())
    assert data["meta"]["hosts"] == 2 and data["meta"]["host_sizes"] == [2, 1]
    assert data["meta"]["agreement_cost"]
    for entry in data["runs"][0]["results"]:
        assert entry["check"]["ok"], entry
        if entry["collective"] in ("all_to_all_single", "reduce", "send_recv"):
            # No hierarchical all-to-all, reduce or send/recv: across hosts the wrapped
            # backend's, counted.
            counter = {"send_recv": "send"}.get(entry["collective"], entry["collective"])
            assert f"{counter}.wrapped" in entry["paths"], entry["paths"]
            continue
        # Uneven hosts: the leaders carry the data (a broadcast from a local index every host
        # has goes by local index, as on even hosts).
        want = ".hierarchical" if entry["collective"] == "broadcast" else ".hierarchical_leaders"
        assert any(k.endswith(want) for k in entry["paths"]), entry["paths"]
        assert entry["agreement_off"]["median_us"] > 0 and entry["agreement_cost"] > 0, entry
    assert "agreement cost" in proc.stdout


def test_bench_host_sizes_must_sum_to_the_world_size(monkeypatch, capsys):
    # The script's own argument parser (argparse's usage error: exit 2), in this process: a
    # subprocess per case cost a torch import each.
    mod = _bench_module(monkeypatch)
    for bad in (["--world-sizes", "4", "--host-sizes", "2", "1"],
                ["--world-sizes", "3", "4", "--host-sizes", "2", "1"],
                ["--world-sizes", "2", "--host-sizes", "2", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            mod.parse_args(bad)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "--host-sizes" in err, (bad, err[-2000:])
    assert mod.parse_args(["--world-sizes", "3", "--host-sizes", "2", "1"]).hosts == 2


def check_peer_columns(data: dict, proc) -> None:
    """bench_collectives.py times the dispatcher op beside dist.all_reduce; the DeepSpeed columns
    are there exactly when deepspeed is installed (and its op builds), and nothing fails
    without."""
    ds = data["meta"]["deepspeed"]
    assert "DeepSpeed column:" in proc.stderr
    for entry in data["runs"][0]["results"]:
        if entry["collective"] != "all_reduce":  # the peer columns are the all-reduce's
            assert entry["check"]["ok"], entry["check"]
            continue
        peers = entry["peers"]
        assert peers["cuda_p2p_op"]["median_us"] > 0
        assert ("deepspeed" in peers) == ds["available"], (peers.keys(), ds)
        assert ("deepspeed_comm" in peers) == ds["available"], (peers.keys(), ds)
        assert entry["check"]["ok"], entry["check"]
        if ds["available"]:
            assert set(entry["vs_deepspeed"]) == {"dist", "op", "dist_vs_comm"}
    assert "side by side" in proc.stdout


@pytest.mark.parametrize("agreement", ["auto", "signature"])
def test_bench_collectives_zero_copy(tmp_path, agreement):
    # --zero-copy: a group with heap inputs (counted zero_copy) and one with ordinary inputs, as
    # ratios to the staged default group, every output checked against Gloo; either agreement.
    out = tmp_path / "z.json"
    args = ["--world-sizes", "2", "--sizes", "128K", "--zero-copy", "--peers", "none",
            "--zero-copy-agreement", agreement,
            "--collectives", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce",
            "--iters", "3", "--warmup", "1", "--no-barrier", "--json", str(out), "--no-plot",
            "--timeout", "120"]
    proc = run_bench("bench_collectives.py", args, tmp_path)
    data = json.loads(out.read_text())
    assert data["meta"]["zero_copy"] is True
    assert data["meta"]["zero_copy_agreement"] == agreement
    for entry in data["runs"][0]["results"]:
        assert entry["check"]["ok"], entry
        zc, hs = entry["zero_copy"]["zero_copy"], entry["zero_copy"]["heap_staged"]
        # 2 host ranks stage the all-reduce (measured slower zero-copy: ops/zero_copy.cpp)
        staged = entry["collective"] == "all_reduce"
        assert any(k.endswith(".zero_copy") for k in zc["paths"]) != staged, zc["paths"]
        assert not any(k.endswith(".zero_copy") for k in hs["paths"]), hs["paths"]
        assert zc["ratio_vs_staged"] > 0 and hs["ratio_vs_staged"] > 0
    assert f"zero-copy  world_size=2  agreement={agreement}" in proc.stdout


def test_bench_collectives_threads(tmp_path):
    # --threads 1 2: one run per thread count; with 2 the large host copies and reductions are
    # split across the rank's intra-op threads (counted), and the results still equal Gloo's.
    out = tmp_path / "t.json"
    args = ["--world-sizes", "2", "--threads", "1", "2", "--sizes", "2M", "--collectives",
            "reduce_scatter_tensor", "--iters", "3", "--warmup", "1", "--no-barrier", "--peers",
            "none", "--json", str(out), "--no-plot", "--timeout", "120", "--core-probe", "0"]
    run_bench("bench_collectives.py", args, tmp_path)
    runs = json.loads(out.read_text())["runs"]
    assert [r["threads"] for r in runs] == [1, 2]
    for r in runs:
        for entry in r["results"]:
            assert entry["check"]["ok"], entry
            assert ("intra_op.split" in entry["paths"]) == (r["threads"] == 2), entry["paths"]


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_bench_link_between_namespaces(tmp_path):
    # bench.sh --hosts 2 --link RATE: each simulated host's ranks in a network namespace of their
    # own, joined by a veth pair shaped with tbf; the namespaces are gone afterwards. CI runs as
    # root with iproute2; elsewhere the script says why it skips, and so does this test.
    import shutil

    before = _netns_names() if shutil.which("ip") else set()
    out = tmp_path / "l.json"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "bench.sh"), "--hosts", "2", "--link", "10gbit",
         "--world-sizes", "2", "--sizes", "4K", "--collectives", "all_reduce", "--iters", "3",
         "--warmup", "1", "--no-barrier", "--json", str(out), "--no-plot", "--timeout", "120",
         "--core-probe", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    if "skipped:" in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert _netns_names() == before, "bench.sh --link left network namespaces behind"
    assert "one TCP stream carried" in proc.stdout
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["hosts"] == 2 and len(meta["netns"]) == 2 and "tbf rate 10gbit" in meta["link"]
    assert meta["sync"] == "gloo"
    for entry in data["runs"][0]["results"]:
        assert entry["check"]["ok"], entry
        assert any(k.endswith(".hierarchical") for k in entry["paths"]), entry["paths"]


def test_bench_link_says_why_it_skips(tmp_path):
    # Without ip and tc (a PATH without iproute2) --link skips, says so, and exits 0.
    import shutil

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("dirname", "id"):
        (bindir / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run(["/bin/bash", str(REPO / "scripts" / "bench.sh"), "--hosts", "2",
                           "--link", "10gbit"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": str(bindir)})
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "skipped: it needs root and iproute2" in proc.stdout, proc.stdout


def _bench_module(monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(BENCH))  # for its _common

    spec = importlib.util.spec_from_file_location("_bench_collectives",
                                                  BENCH / "bench_collectives.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fast_columns_get_more_samples_than_the_baseline(monkeypatch):
    """bench_collectives shares the budget between Gloo and the other columns: the others take
    one common count (their ratios stay paired), Gloo its own, spread over the rounds; the
    interval of a ratio of unequal sample counts resamples each side on its own."""
    mod = _bench_module(monkeypatch)

    class OneRank:  # _max_over_ranks on one rank: the values themselves
        class ReduceOp:
            MAX = None

        @staticmethod
        def all_reduce(t, op=None, group=None):
            return None

    cfg = {"iters": 0, "budget": 1.0, "batch": 1, "min_iters": 5, "max_iters": 100_000}
    warm = {"cuda_p2p": [2e-6] * 4, "gloo": [1e-3] * 4, "deepspeed": [3e-6] * 4}
    iters = mod._iterations(cfg, warm, 1.0e-3 + 5e-6 + 3e-6, OneRank, None)
    assert iters["cuda_p2p"] == iters["deepspeed"] > 10 * iters["gloo"], iters
    assert iters["gloo"] == int((1.0 / 3) / (1e-3 + 1e-6 / 3)), iters
    assert mod._iterations(dict(cfg, iters=7), warm, 1e-3, OneRank, None) == dict.fromkeys(warm, 7)
    # Samples taken: exactly the counts asked for, Gloo's spread over the rounds.
    ran = []
    monkeypatch.setattr(mod, "_run_op", lambda dist, coll, inp, out, g: ran.append(g))
    groups = {"cuda_p2p": "p", "gloo": "g", "deepspeed": "d"}
    bufs = dict.fromkeys(groups, (None, None))
    want = {"cuda_p2p": 20, "gloo": 3, "deepspeed": 20}
    times, _ = mod._timed(None, "all_reduce", bufs, groups, lambda: None, want, 0, 1, 2)
    assert {k: len(v) for k, v in times.items()} == want
    assert ran.count("g") == 3
    gloo_at = [i for i, g in enumerate(ran) if g == "g"]
    assert gloo_at[-1] > len(ran) // 2, gloo_at  # not all at the start
    # Unequal counts: a sensible interval around the ratio of the medians (2.0).
    lo, hi = mod.speedup_ci([1.0, 1.1, 0.9] * 10, [2.0, 2.2, 1.8])
    assert lo <= 2.0 <= hi and lo > 1.0, (lo, hi)


def _collectives_doc(speedup, vs_deepspeed, zero_copy, size=8):
    return {"meta": {"hosts": 2}, "runs": [{"world_size": 2, "results": [
        {"collective": "all_reduce", "bytes": size, "speedup": speedup,
         "vs_deepspeed": {"dist": vs_deepspeed},
         "zero_copy": {"zero_copy": {"ratio_vs_staged": zero_copy}}}]}]}


def _fused_doc(fused, auto):
    return {"machine": {}, "results": [
        {"op": "AG→MM", "W": 2, "M": 1024, "K": 1024, "N": 256, "dtype": "float32",
         "unfused": 10.0, "fused": fused, "auto": auto}]}


def test_compare_results_lists_every_worse_ratio(tmp_path):
    """bench/compare_results.py (the guard of `bash scripts/bench.sh --compare`): a ratio that got
    worse by more than 10% is listed, whichever way it is better; one within 10%, one that got
    better and a cell of one file only are not; nothing worse exits 0, no baselines 2; --save
    writes the ratios only, and a second --save keeps the worse of each (the runs' envelope)."""
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir()
    new.mkdir()

    def write(d, name, doc):
        (d / name).write_text(json.dumps(doc))

    write(base, "compare_deepspeed.json", _collectives_doc(2.0, 1.0, 0.80))
    # speedup -7.5% (within), vs DeepSpeed -15% (worse), zero-copy/staged +19% (worse)
    doc = _collectives_doc(1.85, 0.85, 0.95)
    doc["runs"][0]["results"].append(_collectives_doc(0.1, 0.1, 9.0, size=64)["runs"][0]
                                     ["results"][0])  # a cell the baseline has not
    write(new, "compare_deepspeed.json", doc)
    write(base, "compare_fused.json", _fused_doc(10.0, 10.0))
    write(new, "compare_fused.json", _fused_doc(12.0, 9.0))  # fused +20% (worse), auto better

    def run(*args):
        return subprocess.run([sys.executable, str(BENCH / "compare_results.py"), *args],
                              capture_output=True, text=True, timeout=60)

    proc = run("--baseline", str(base), "--results", str(new))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    listed = [line for line in proc.stdout.splitlines() if line.startswith("| compare_")]
    assert len(listed) == 3, proc.stdout
    assert "3 of 5 ratios got worse" in proc.stdout, proc.stdout
    for ratio, change in (("vs_deepspeed.dist", "-15%"), ("zero_copy / staged", "+19%"),
                          ("fused / unfused", "+20%")):
        assert any(ratio in line and change in line for line in listed), (ratio, proc.stdout)
    assert "speedup vs gloo" not in proc.stdout and "auto / unfused" not in proc.stdout
    proc = run("--baseline", str(base), "--results", str(base))
    assert proc.returncode == 0 and "none got worse by more than 10%" in proc.stdout, proc.stdout
    # --save keeps the ratios only; compared with them, the run lists the same three.
    saved = tmp_path / "saved"
    assert run("--baseline", str(saved), "--results", str(base), "--save").returncode == 0
    assert "ratios" in json.loads((saved / "compare_fused.json").read_text())
    proc = run("--baseline", str(saved), "--results", str(new))
    assert proc.returncode == 3 and "3 of 5 ratios got worse" in proc.stdout, proc.stdout
    # Saving a second run keeps the worse of each ratio: the envelope holds both runs.
    assert run("--baseline", str(saved), "--results", str(new), "--save").returncode == 0
    doc = json.loads((saved / "compare_deepspeed.json").read_text())
    assert doc["runs"] == 2, doc
    assert [2, "all_reduce", 8, "speedup vs gloo", 1.85, True] in doc["ratios"], doc
    proc = run("--baseline", str(saved), "--results", str(new))
    assert proc.returncode == 0, proc.stdout
    proc = run("--baseline", str(saved), "--results", str(base))
    assert proc.returncode == 0, proc.stdout
    proc = run("--baseline", str(tmp_path / "none"), "--results", str(new))
    assert proc.returncode == 2 and "no baselines" in proc.stderr, proc.stderr
