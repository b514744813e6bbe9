#!/usr/bin/env python3
"""Collective latency and bus bandwidth: cuda_p2p against Gloo, measured in the same run.

Launches N local CPU ranks (torch.multiprocessing, spawn), initialises the default process group
with backend="cuda_p2p" over tcp://127.0.0.1:<free port> and a Gloo group over the same ranks as
the baseline. For every collective and message size both backends are timed in interleaved
iterations (ranks synchronised by a barrier before each one); a timed iteration is the slowest
rank's time, and the reported latency is the median over iterations. With --budget (the
default) the baseline and the other columns share the time by their number: a fast column gets
many samples where Gloo's milliseconds would otherwise have left it the minimum. Bus bandwidth
follows the NCCL-tests conventions (see bench/README.md).

The synchronisation runs on a third group that neither measured backend uses: by default
(--sync shm) the shared-memory barrier of a separate cuda_p2p group followed by a synchronized
start (every rank spins until the same CLOCK_MONOTONIC instant, so all of them are awake and
start together); --sync gloo uses a Gloo barrier, whose exits are spread by ~10 us (2 ranks) to
~170 us (4 ranks on 2 cores, p90 ~2 ms) - a skew every measured op then inherits, whichever
backend runs it. --batch K times K back-to-back ops per sample (NCCL-tests
style) and reports the sample's time / K.

--hosts H simulates H hosts (CUDA_P2P_HOST_ID per rank, ranks in contiguous blocks) for the
measured cuda_p2p group: it then runs hierarchically (intra-host on each host's workspace,
inter-host on Gloo: docs/across_hosts.md), and the Gloo baseline is exactly the flat
wrapped backend such a group would otherwise use. Its results go to bench/results/hierarchical.*.
With --netns (what `scripts/bench.sh --hosts 2 --link RATE` passes) each simulated host's ranks
run in a network namespace of their own (they enter it with setns(2) before any socket exists),
and the store and Gloo bind to that namespace's end of a veth pair shaped to RATE: bytes between
hosts cost what they would on such a link; bytes within a host stay in its namespace.

--agreement-cost (with --hosts) also times a second hierarchical group whose group-wide
agreement on each call is off (a bench-only knob,
cuda_p2p._C._testing.set_hierarchical_agreement(backend, False): NOTE [Hierarchical agreement] in
backend/hierarchy_agreement.cpp), interleaved with the measured group:
the ratio of the two medians is what the agreement costs, both measured in the same run.

--algos also times the cuda_p2p workspace with each algorithm forced in turn (a group per
algorithm: all-gather direct / ring, reduce-scatter direct / ring,
all-reduce one_shot / two_shot), prints a table per collective and the size thresholds the
automatic choice should use (the crossovers), and records both in the JSON.

Output: a table on stdout, JSON (--json) and a PNG plot (--plot).

    .venv/bin/python bench/bench_collectives.py                  # 2 and 4 ranks, short size list
    .venv/bin/python bench/bench_collectives.py --world-sizes 4
    .venv/bin/python bench/bench_collectives.py --full           # 8 B .. 64 MiB, powers of 2
    .venv/bin/python bench/bench_collectives.py --env CUDA_P2P_SOME_KNOB=1 \
        --pg-option buffer_size=1048576
    .venv/bin/python bench/bench_collectives.py --full --algos --world-sizes 2 4   # thresholds
    .venv/bin/python bench/bench_collectives.py --hosts 2 --world-sizes 4   # hierarchical vs flat
    .venv/bin/python bench/bench_collectives.py --hosts 2 --world-sizes 4 --collectives all_reduce \
        --sizes 8 1K 8K 64K --agreement-cost       # what the cross-host agreement costs
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import datetime
import faulthandler
import itertools
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from _common import CorePlacementProbe, free_port, host_workspace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

BACKENDS = ("cuda_p2p", "gloo")  # measured backend first, baseline second
# More all-reduce columns (--peers auto): our dispatcher op, called as vLLM calls its custom
# all-reduce (torch.ops.cuda_p2p.all_reduce_, no Work, no torch.distributed Python layer), and
# DeepSpeed's shared-memory all-reduce, present only when deepspeed imports and its ShareMemComm
# op builds from its sources, called both ways its users call it: the bare op
# (torch.ops.deepspeed.inference_all_reduce_, "deepspeed") and DeepSpeed's communication API
# (deepspeed.comm.inference_all_reduce, "deepspeed_comm", what its CPU tensor-parallel layers
# call). Each of our two ways has its like: the dispatcher op against the bare op, dist.all_reduce
# (a communication library's Python API) against deepspeed.comm's.
PEERS = ("cuda_p2p_op", "deepspeed", "deepspeed_comm")
# DeepSpeed's shm kernels reduce these dtypes only; it leaves others untouched.
DEEPSPEED_DTYPES = ("float32", "bfloat16", "float16")
# Algorithms of the workspace collectives, forced one group at a time with --algos: the Options
# field and its values per collective.
ALGOS = {
    "all_reduce": ("all_reduce_algo", ("one_shot", "two_shot")),
    "all_gather_into_tensor": ("all_gather_algo", ("direct", "ring")),
    "reduce_scatter_tensor": ("reduce_scatter_algo", ("direct", "ring")),
}
# Counter prefix of each benchmarked collective.
COUNTER = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast",
           "all_to_all_single": "all_to_all_single", "reduce": "reduce", "send_recv": "send"}
# send_recv: every rank sends the message to its right neighbour and receives its left one's
# (batch_isend_irecv, waited for), as a pipeline's stages hand activations on.
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
               "all_to_all_single", "reduce", "send_recv")
# NCCL-tests bus bandwidth factors
# (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md); the message size is the
# all-reduce/broadcast buffer, the all-gather output, the reduce-scatter input, the all-to-all's
# input (= its output: numel / n elements to every rank).
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all_single": lambda n: (n - 1) / n,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
SHORT_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20)
FULL_MIN, FULL_MAX = 8, 64 << 20
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "int32": torch.int32}


# ------------------------------------------------------------------------------------------------
# small helpers

def parse_size(text: str) -> int:
    """'8', '1K', '64KiB', '1M', '16MiB', '1G' -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (expected e.g. 8, 1K, 64KiB, 16M)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def fmt_size(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            v = n / m
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def parse_kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def git_describe() -> dict:
    def git(*a):
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except Exception:  # no git: not worth failing a benchmark over
        return {}


def memcpy_bandwidth(nbytes: int = 64 << 20, iters: int = 20) -> dict:
    """Single-core copy bandwidth: bytes copied per second by one thread (torch copy_).

    The yardstick ("GBps") is the best of `iters` copies: what one core can do when nothing
    interferes, which other processes on a shared machine only ever lower. 64 MiB (the default)
    is out of every cache level, like the large collectives; 256 KiB (source and destination fit
    the L2) is the in-cache rate small and medium collectives can reach."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)
    med = statistics.median(times)
    return {"bytes": nbytes, "iters": iters, "median_s": med, "best_s": min(times),
            "GBps": nbytes / min(times) / 1e9, "median_GBps": nbytes / med / 1e9}


# ------------------------------------------------------------------------------------------------
# rank side

class Step:
    """Where a rank is: written to a file the parent reads when a rank fails or hangs, and a
    hard watchdog (faulthandler) that dumps the stack and exits if a step outlives --timeout."""

    def __init__(self, path: str, rank: int, timeout: float):
        self.path, self.rank, self.timeout = path, rank, timeout

    def __call__(self, what: str, expected_s: float = 0.0) -> None:
        # A step that is expected to last (many timed iterations) gets that time on top.
        faulthandler.dump_traceback_later(self.timeout + 2.0 * expected_s, exit=True)
        with open(self.path, "w") as f:
            f.write(what)


def _enter_netns(name: str) -> None:
    """Moves this process (its one thread so far: every thread it starts later inherits it) into
    the network namespace /var/run/netns/<name> (made by `ip netns add`; needs root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def parse_netns(spec: str) -> dict:
    """NAME,IFNAME,ADDRESS: a namespace, its interface towards the other hosts and its address."""
    parts = spec.split(",")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected NAME,IFNAME,ADDRESS, got {spec!r}")
    return {"name": parts[0], "ifname": parts[1], "addr": parts[2]}


def _die_with_parent(parent_pid: int) -> None:
    # A rank must not outlive the launcher (Ctrl-C, kill -9 of the parent): SIGKILL on its death.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


# --zero-copy: columns on a cuda_p2p group with a symmetric heap (docs/collectives.md,
# "Zero-copy symmetric tensors"): inputs from cuda_p2p.empty, and ordinary inputs on that group
# (what a heap costs an op that does not use it).
ZERO_COPY_COLUMNS = ("zero_copy", "heap_staged")
ZERO_COPY_COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                         "broadcast", "all_to_all_single")


def _make_inputs(coll: str, nbytes: int, n: int, rank: int, dtype: torch.dtype, heap=None):
    """(input, output) tensors for one collective; message-size conventions as NCCL-tests.
    `heap`: a cuda_p2p group whose symmetric heap holds the input (collective)."""
    esize = torch.empty((), dtype=dtype).element_size()
    numel = nbytes // esize

    def inp(k):
        if heap is None:
            return torch.zeros(k, dtype=dtype)
        import cuda_p2p
        return cuda_p2p.empty(k, dtype=dtype, group=heap).zero_()

    if coll in ("all_reduce", "broadcast", "reduce"):
        return inp(numel), None
    if coll == "all_gather_into_tensor":
        return inp(numel // n), torch.empty(numel, dtype=dtype)
    if coll == "reduce_scatter_tensor":
        return inp(numel), torch.empty(numel // n, dtype=dtype)
    if coll in ("all_to_all_single", "send_recv"):
        return inp(numel), torch.empty(numel, dtype=dtype)
    raise ValueError(coll)


def _run_op(dist, coll: str, inp, out, group) -> None:
    if callable(group):  # a peer column of the all-reduce (PEERS): its own call
        group(inp)
        return
    if coll == "all_reduce":
        dist.all_reduce(inp, group=group)
    elif coll == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, inp, group=group)
    elif coll == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, inp, group=group)
    elif coll == "broadcast":
        dist.broadcast(inp, src=0, group=group)
    elif coll == "all_to_all_single":
        dist.all_to_all_single(out, inp, group=group)
    elif coll == "reduce":
        dist.reduce(inp, dst=0, group=group)
    elif coll == "send_recv":
        n, r = dist.get_world_size(group), dist.get_rank(group)
        for w in dist.batch_isend_irecv([
                dist.P2POp(dist.isend, inp, group=group, group_peer=(r + 1) % n),
                dist.P2POp(dist.irecv, out, group=group, group_peer=(r - 1) % n)]):
            w.wait()
    elif coll == "barrier":
        dist.barrier(group=group)
    else:
        raise ValueError(coll)


def _pattern(numel: int, rank: int) -> torch.Tensor:
    # Small integers, distinct per rank: sums over up to ~20 ranks stay exact even in bfloat16.
    return torch.arange(numel) % 7 + rank + 1


def _check(dist, coll: str, nbytes: int, n: int, rank: int, dtype, groups) -> dict:
    """Run the collective once on each backend with rank-dependent inputs and compare the
    outputs exactly (small integers: every summation order gives the same result)."""
    outs = {}
    for name, group in groups.items():
        inp, out = _make_inputs(coll, nbytes, n, rank, dtype,
                                group if name == "zero_copy" else None)
        inp.copy_(_pattern(inp.numel(), rank).to(dtype))
        _run_op(dist, coll, inp, out, group)
        outs[name] = (inp if out is None else out).clone()
    ref = outs["gloo"]
    # A reduce's result is defined on its root only (the others' tensors: Gloo leaves partial sums,
    # cuda_p2p the input).
    defined = coll != "reduce" or rank == 0
    ok = not defined or all(torch.equal(o, ref) for o in outs.values())
    # Independent of both backends: the expected values computed locally.
    if coll != "barrier" and defined:
        base = _pattern
        esize = torch.empty((), dtype=dtype).element_size()
        numel = nbytes // esize
        if coll in ("all_reduce", "reduce"):
            exp = sum(base(numel, r) for r in range(n))
        elif coll == "broadcast":
            exp = base(numel, 0)
        elif coll == "all_gather_into_tensor":
            exp = torch.cat([base(numel // n, r) for r in range(n)])
        elif coll == "all_to_all_single":
            shard = numel // n
            exp = torch.cat([base(numel, r)[rank * shard:(rank + 1) * shard] for r in range(n)])
        elif coll == "send_recv":
            exp = base(numel, (rank - 1) % n)
        else:
            shard = numel // n
            exp = sum(base(numel, r) for r in range(n))[rank * shard:(rank + 1) * shard]
        ok = ok and torch.equal(ref, exp.to(dtype))
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
    dist.all_reduce(flag, group=groups["gloo"])  # every rank agrees
    return {"ok": flag.item() == 0, "bad_ranks": int(flag.item())}


def _timed(dist, coll: str, bufs, groups, sync, iters, first: int, batch: int = 1,
           block: int = 1):
    """Interleaved iterations of every backend; each op preceded by sync() (a barrier on a
    group neither backend uses); `batch` back-to-back ops per sample, timed together. `iters`:
    samples per backend, one number for all or {backend: number} (equal on every rank).

    Backends take turns by blocks of `block` consecutive samples (the order flips every round):
    the first op after another backend's runs with caches, and with whatever that backend left
    running (Gloo's threads), that are not its own - with block=1 the op measured after Gloo's
    was ~3x slower than in a run of its own. A backend with fewer samples than the others takes
    its samples spread evenly over the rounds, not all at the start. Returns {backend: [seconds
    of this rank per op, per sample]} and the wall time of every round divided by its block
    (one iteration's cost)."""
    names = list(groups)
    want = iters if isinstance(iters, dict) else {name: iters for name in names}
    times = {name: [] for name in names}
    walls = []  # per iteration, barriers included: what one more iteration costs
    rounds = max(1, -(-max(want.values()) // block))
    for rnd in range(rounds):
        # Samples each backend owes this round: its share of the rounds so far, rounded up.
        owed = {name: -(-want[name] * (rnd + 1) // rounds) - len(times[name]) for name in names}
        order = names if (rnd + first) % 2 == 0 else names[::-1]
        w0 = time.perf_counter()
        for name in order:
            inp, out = bufs[name]
            g = groups[name]
            for _ in range(owed[name]):
                sync()
                t0 = time.perf_counter()
                for _ in range(batch):
                    _run_op(dist, coll, inp, out, g)
                times[name].append((time.perf_counter() - t0) / batch)
        k = max(owed.values())
        if k > 0:
            walls.extend([(time.perf_counter() - w0) / k] * k)
    return times, walls


def _iterations(cfg, warm_times: dict, per_iter: float, dist, group) -> dict:
    """Timed samples per backend, from the warmup: the baseline (Gloo) and the others share the
    budget by their number, each within [min_iters, max_iters]; all but the baseline take the
    same number, so that their ratios pair sample i with sample i. Decided on the slowest
    rank's costs, so that every rank runs the same iterations."""
    names = list(warm_times)
    if cfg["iters"]:
        return {name: cfg["iters"] for name in names}
    # One sample's cost per backend: its ops (later half of the warmup: the first ones pay for
    # first touches and connections) and its share of the iteration's barriers.
    ops = [statistics.median(warm_times[n][len(warm_times[n]) // 2:]) * cfg["batch"] for n in names]
    sync_each = max(0.0, per_iter - sum(ops)) / len(names)
    costs = _max_over_ranks(dist, [c + sync_each for c in ops], group)
    cost = dict(zip(names, costs))
    clamp = lambda x: int(min(cfg["max_iters"], max(cfg["min_iters"], x)))  # noqa: E731
    others = [n for n in names if n != "gloo"]
    if "gloo" not in cost or not others:
        return dict.fromkeys(names, clamp(cfg["budget"] / max(sum(costs), 1e-9)))
    share = cfg["budget"] / len(names)
    n_others = clamp((cfg["budget"] - share) / max(sum(cost[n] for n in others), 1e-9))
    return dict(dict.fromkeys(others, n_others), gloo=clamp(share / max(cost["gloo"], 1e-9)))


def _synchronized_start(backend, rank: int, n: int, margin_us: float):
    """A sync() that makes every rank start the next op at the same instant, all of them awake.

    A barrier alone releases its ranks at different times: one that slept in the kernel wakes up
    tens of microseconds after the others (longer when ranks share cores), and that skew would
    land in whatever op comes next. So each rank publishes its CLOCK_MONOTONIC arrival time in
    its buffer of a separate cuda_p2p group (slots alternate, so a slow reader never sees the
    next sample's time), passes that group's shared-memory barrier, and spins until the latest
    arrival + margin_us: every rank then starts the timed op at the same time (CLOCK_MONOTONIC is
    one clock for every process of the host)."""
    import torch

    mine = backend.get_p2p_buffer(rank, [2], torch.int64)
    peers = [backend.get_p2p_buffer(r, [2], torch.int64) for r in range(n)]
    margin_ns = int(margin_us * 1000)
    state = {"k": 0}

    def sync():
        slot = state["k"] % 2
        state["k"] += 1
        mine[slot] = time.monotonic_ns()
        backend.intra_node_barrier()
        deadline = max(int(p[slot]) for p in peers) + margin_ns
        while time.monotonic_ns() < deadline:
            pass

    return sync


def _max_over_ranks(dist, values: list[float], group) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _summary(times_s: list[float]) -> dict:
    s = sorted(times_s)
    p = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"median_us": statistics.median(s) * 1e6, "min_us": s[0] * 1e6, "p10_us": p(0.1) * 1e6,
            "p90_us": p(0.9) * 1e6, "max_us": s[-1] * 1e6, "iters": len(s),
            "times_us": [round(x * 1e6, 3) for x in times_s]}


def backend_state(backend) -> dict:
    """What the cuda_p2p backend says about itself, recorded in the JSON ("backend_state").

    Everything is optional (getattr): the benchmark also runs against builds that predate a knob.
    """
    state = {"class": type(backend).__name__, "backend_name": backend._get_backend_name(),
             "wrapped_cpu_backend": type(backend.wrapped_backend("cpu")).__name__}
    opts = backend.options
    for attr in ("enable_workspace", "buffer_size", "group_name"):
        if hasattr(opts, attr):
            state[f"options.{attr}"] = getattr(opts, attr)
    for method in ("is_p2p_available", "p2p_unavailable_reason", "get_buffer_size"):
        if hasattr(backend, method):
            state[method] = getattr(backend, method)()
    if hasattr(backend, "hierarchy") and backend.hierarchy() is not None:
        h = backend.hierarchy()
        state["hierarchy"] = {"hosts": h["hosts"], "even": h["even"]}
    if hasattr(backend, "get_counters"):
        state["counters"] = dict(backend.get_counters())
    if hasattr(backend, "get_collective_config"):
        state["collective_config"] = dict(backend.get_collective_config())
    return state


def read_counters(backend) -> dict[str, int]:
    """The backend's path counters ({'all_reduce.one_shot': 3, ...}), {} where it has none."""
    get = getattr(backend, "get_counters", None)
    return dict(get()) if get is not None else {}


def counter_delta(before: dict, after: dict) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v != before.get(k, 0)}


# ------------------------------------------------------------------------------------------------
# peer columns (--peers)

_DEEPSPEED_LOAD = (
    "import contextlib, io, sys, torch\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder\n"
    "    b = ShareMemCommBuilder()\n"
    "    assert b.is_compatible(False), 'ShareMemCommBuilder is not compatible with this host'\n"
    "    m = b.load(verbose=False)\n"
    "import deepspeed\n"
    "print('DS', deepspeed.__version__, m.vector_kernel_level(), flush=True)\n"
)


def deepspeed_status(dtype: str, timeout_s: float = 1200.0) -> dict:
    """Whether the DeepSpeed column can run: deepspeed importable and its shm op built (in a
    subprocess: the first build compiles csrc/cpu/comm/shm.cpp, minutes; later ones load the
    cached extension). {"available": bool, "reason" or "version"}; never raises."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return {"available": False, "reason": "deepspeed is not installed"}
    if dtype not in DEEPSPEED_DTYPES:
        return {"available": False, "reason": f"its shm all-reduce has no {dtype} kernel"}
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    try:
        r = subprocess.run([sys.executable, "-c", _DEEPSPEED_LOAD], capture_output=True,
                           text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"available": False, "reason": f"building its shm op took over {timeout_s:g} s"}
    line = next((x for x in r.stdout.splitlines() if x.startswith("DS ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"available": False, "reason": f"its shm op did not build/load: {tail[:200]}"}
    _, version, level = line.split()
    # Its fp32 kernel needs AVX2 (level 1), bf16/fp16 AVX-512BW (level 2); below, it faults.
    need = 1 if dtype == "float32" else 2
    if int(level) < need:
        return {"available": False, "reason": f"this CPU lacks the ISA of its {dtype} kernel"}
    return {"available": True, "version": version, "vector_kernel_level": int(level)}


def _peer_ops(cfg: dict, rank: int, n: int, group) -> dict:
    """{column: fn(tensor)} of the all-reduce's peer columns for this rank."""
    peers = {}
    if not cfg["peers"]:
        return peers
    op = getattr(torch.ops.cuda_p2p, "all_reduce_", None)
    if op is not None:
        import torch.distributed as dist

        if group is dist.group.WORLD:
            # As a user of the default group calls it: all_reduce_sum_, whose schema is the
            # tensor alone like DeepSpeed's op (NOTE [The one-argument op] in
            # backend/dispatcher_all_reduce.cpp; all_reduce_(t) with its two defaulted strings
            # costs ~600 instructions more per call).
            sum_op = torch.ops.cuda_p2p.all_reduce_sum_
            peers["cuda_p2p_op"] = lambda t: sum_op(t)
        else:
            name = group.group_name
            peers["cuda_p2p_op"] = lambda t: op(t, "sum", name)
    if cfg["deepspeed"]:
        # Its segments are named after MASTER_ADDR/PORT: a port of this run's own, removed by the
        # launcher afterwards (DeepSpeed never unlinks them).
        os.environ.update({"LOCAL_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(cfg["deepspeed_port"]), "DS_ACCELERATOR": "cpu"})
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            import deepspeed.comm as ds_comm

            # torch.distributed is initialised already (the default group is the cuda_p2p one),
            # so DeepSpeed only wraps it, builds/loads its shm op and initialises it, as it does
            # for its own users.
            ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        ds = torch.ops.deepspeed.inference_all_reduce_
        peers["deepspeed"] = lambda t: ds(t)
        peers["deepspeed_comm"] = lambda t: ds_comm.inference_all_reduce(t)
    return peers


def _remove_deepspeed_segments(port: int, world_size: int) -> None:
    for r in range(world_size):
        try:
            os.unlink(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_{r}")
        except OSError:
            pass


def host_index(rank: int, cfg: dict) -> int:
    """The simulated host of a rank: ranks in contiguous blocks, of --host-sizes' sizes or of
    equal size (--hosts)."""
    if cfg.get("host_sizes"):
        ends = list(itertools.accumulate(cfg["host_sizes"]))
        return next(h for h, end in enumerate(ends) if rank < end)
    return rank * cfg["hosts"] // cfg["world_size"]


def rank_main(rank: int, cfg: dict) -> None:
    _die_with_parent(cfg["parent_pid"])
    if cfg["netns"]:
        # Before any socket or thread: the store, Gloo's and cuda_p2p's threads all inherit it.
        # Every group knows the hosts (CUDA_P2P_HOST_ID stays set): namespaces do not share
        # abstract unix sockets, so no workspace may span two of them.
        ns = cfg["netns"][host_index(rank, cfg)]
        _enter_netns(ns["name"])
        os.environ["GLOO_SOCKET_IFNAME"] = ns["ifname"]
    threads = cfg["threads"]
    if cfg["bind"] == "core":
        # Round-robin binding, before any communication thread exists (they inherit it). Ranks
        # that migrate between the few cores they share wake up later, and more erratically.
        # With --threads N a rank gets N consecutive CPUs (mod the CPUs there are) for its pool.
        cpus = cfg["cpus"]
        os.sched_setaffinity(0, {cpus[(rank * threads + i) % len(cpus)] for i in range(threads)})
    # --threads: the rank's ATen intra-op threads, which cuda_p2p's large host copies and
    # reductions use (NOTE [Intra-op threads] in ops/collectives.cpp).
    torch.set_num_threads(threads)
    # torch 2.14 deprecates the *_tensor names in favour of *_single; they are still the names
    # users call (and what NCCL-tests measures), so the benchmark keeps them, quietly.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*(all_gather_into_tensor|reduce_scatter_tensor).*deprecated")
    step = Step(os.path.join(cfg["tmpdir"], f"rank{rank}.step"), rank, cfg["timeout"])
    step("import cuda_p2p")
    os.environ.update(cfg["env"])  # also inherited at spawn; set again before the import
    import torch.distributed as dist

    import cuda_p2p

    n = cfg["world_size"]
    timeout = datetime.timedelta(seconds=cfg["timeout"])
    dtype = DTYPES[cfg["dtype"]]
    esize = torch.empty((), dtype=dtype).element_size()

    step("init_process_group(cuda_p2p)")
    pg_options = None
    if cfg["pg_options"]:
        pg_options = cuda_p2p.ProcessGroupCudaP2P.Options()
        for key, value in cfg["pg_options"].items():
            setattr(pg_options, key, value)
    hosts = cfg["hosts"]
    if hosts > 1:  # the measured group only: the sync group below stays on one host
        os.environ["CUDA_P2P_HOST_ID"] = f"bench-host-{host_index(rank, cfg)}"
    dist.init_process_group(backend="cuda_p2p", init_method=cfg["init_method"], rank=rank,
                            world_size=n, timeout=timeout, pg_options=pg_options)
    if hosts > 1 and not cfg["netns"]:
        os.environ.pop("CUDA_P2P_HOST_ID")
    try:
        step("new_group(gloo)")
        gloo = dist.new_group(backend="gloo", timeout=timeout)
        p2p = dist.group.WORLD
        if not cuda_p2p.is_cuda_p2p_group(p2p):
            raise RuntimeError("the default group does not run on the cuda_p2p backend")
        p2p_backend = cuda_p2p.get_cuda_p2p_backend(p2p)
        if hosts > 1 and p2p_backend.hierarchy() is None:
            raise RuntimeError(f"--hosts {hosts}: the cuda_p2p group is not hierarchical "
                               "(CUDA_P2P_HIERARCHICAL=0, or the workspace turned off?)")
        if cfg["aa"]:
            # A/A: the "cuda_p2p" side is a second Gloo group, made like the baseline. What is
            # left of the speedup is the method's noise and bias.
            step("new_group(gloo, A/A)")
            p2p = dist.new_group(backend="gloo", timeout=timeout)
        groups = {"cuda_p2p": p2p, "gloo": gloo}
        # A third group, used by neither backend under test, synchronises every timed iteration:
        # syncing on the baseline's own group would leave its threads and sockets warm and bias
        # the comparison in its favour.
        sync_kind = cfg["sync"]
        if sync_kind == "shm":
            step("new_group(cuda_p2p, sync)")
            sync_group = dist.new_group(backend="cuda_p2p", timeout=timeout)
            sync_backend = cuda_p2p.get_cuda_p2p_backend(sync_group)
            if sync_backend.is_p2p_available():
                sync = _synchronized_start(sync_backend, rank, n, cfg["start_margin_us"])
            else:  # e.g. CUDA_P2P_DISABLE_WORKSPACE=1: the same on every rank
                if rank == 0:
                    print("[bench] --sync shm needs the workspace ("
                          + sync_backend.p2p_unavailable_reason() + "): syncing with Gloo",
                          file=sys.stderr, flush=True)
                sync_kind = "gloo"
        if sync_kind == "gloo":
            step("new_group(gloo, sync)")
            sync_group = dist.new_group(backend="gloo", timeout=timeout)
            sync = lambda: dist.barrier(group=sync_group)  # noqa: E731
        step("peer columns")
        peer_ops = _peer_ops(cfg, rank, n, p2p) if not cfg["aa"] else {}
        # --algos: a cuda_p2p group per forced algorithm of the collective being measured,
        # created when its sizes start and destroyed after them (each maps a workspace).
        algo_groups, algo_coll = {}, None

        def set_algo_groups(coll):
            nonlocal algo_groups, algo_coll
            if coll == algo_coll:
                return
            for grp in algo_groups.values():
                dist.destroy_process_group(grp)
            algo_groups, algo_coll = {}, coll
            if not cfg["algos"] or coll not in ALGOS:
                return
            field, values = ALGOS[coll]
            for value in values:
                step(f"new_group(cuda_p2p, {field}={value})")
                opts = cuda_p2p.ProcessGroupCudaP2P.Options()
                for key, v in cfg["pg_options"].items():
                    setattr(opts, key, v)
                setattr(opts, field, value)
                algo_groups[f"cuda_p2p/{value}"] = dist.new_group(
                    backend="cuda_p2p", timeout=timeout, pg_options=opts)

        # --agreement-cost: the same hierarchical group with its agreement off (bench knob).
        no_agreement = {}
        if cfg["agreement_cost"]:
            step("new_group(cuda_p2p, hierarchical, agreement off)")
            os.environ["CUDA_P2P_HOST_ID"] = f"bench-host-{host_index(rank, cfg)}"
            try:
                na_group = dist.new_group(backend="cuda_p2p", timeout=timeout,
                                          pg_options=pg_options)
            finally:
                os.environ.pop("CUDA_P2P_HOST_ID")
            na_backend = cuda_p2p.get_cuda_p2p_backend(na_group)
            if na_backend.hierarchy() is None:
                raise RuntimeError("--agreement-cost: the second group is not hierarchical")
            from cuda_p2p import _C

            _C._testing.set_hierarchical_agreement(na_backend, False)
            no_agreement = {"no_agreement": na_group}

        zc_groups = {}
        if cfg["zero_copy"]:
            zc_opts = cuda_p2p.ProcessGroupCudaP2P.Options()
            zc_opts.zero_copy_agreement = cfg["zero_copy_agreement"]
            step("new_group(cuda_p2p, zero-copy)")
            zc_group = dist.new_group(backend="cuda_p2p", timeout=timeout, pg_options=zc_opts)
            cuda_p2p.get_cuda_p2p_backend(zc_group).ensure_symmetric_heap()
            zc_groups = {"zero_copy": zc_group}
            step("new_group(cuda_p2p, heap, staged)")
            hs_group = dist.new_group(backend="cuda_p2p", timeout=timeout, pg_options=zc_opts)
            cuda_p2p.get_cuda_p2p_backend(hs_group).ensure_symmetric_heap()
            zc_groups["heap_staged"] = hs_group

        results, barrier_res = [], None
        warmup = cfg["warmup"]
        plan = [(c, s) for c in cfg["collectives"] for s in cfg["sizes"]]
        if cfg["barrier"]:
            plan.append(("barrier", 0))
        for idx, (coll, size) in enumerate(plan):
            label = f"{coll} {fmt_size(size)}" if coll != "barrier" else "barrier"
            if rank == 0 and cfg["progress"]:
                print(f"[bench] world_size={n} {idx + 1}/{len(plan)} {label}", file=sys.stderr,
                      flush=True)
            # Message size rounded up so that every rank holds whole elements (as NCCL-tests).
            unit = esize * (n if coll in ("all_gather_into_tensor", "reduce_scatter_tensor",
                                          "all_to_all_single") else 1)
            nbytes = 0 if coll == "barrier" else -(-size // unit) * unit
            set_algo_groups(coll)
            timed_groups = dict(groups, **algo_groups)
            if coll == "all_reduce":
                timed_groups.update(peer_ops)
            if coll in ZERO_COPY_COLLECTIVES:
                timed_groups.update(zc_groups)
            if coll != "barrier":
                timed_groups.update(no_agreement)
            counters_before = read_counters(p2p_backend)
            zc_before = {k: read_counters(cuda_p2p.get_cuda_p2p_backend(g))
                         for k, g in zc_groups.items()}
            t_cell = time.monotonic()  # the cell's span, for the placement probe
            step(f"{label}: allocate")
            bufs = {name: _make_inputs(coll, nbytes, n, rank, dtype,
                                       timed_groups[name] if name == "zero_copy" else None)
                    if coll != "barrier" else (None, None) for name in timed_groups}
            step(f"{label}: warmup")
            warm, walls = _timed(dist, coll, bufs, timed_groups, sync, warmup, 0, cfg["batch"],
                                 cfg["block"])
            # The first warmup iterations pay for first touches and connections: estimate the cost
            # of an iteration from the later half.
            per_iter = statistics.median(walls[len(walls) // 2:])
            iters = _iterations(cfg, warm, per_iter, dist, gloo)
            # At most the longest count of whole iterations (Gloo may take fewer samples).
            step(f"{label}: {max(iters.values())} timed iterations",
                 expected_s=max(iters.values()) * per_iter)
            local, _ = _timed(dist, coll, bufs, timed_groups, sync, iters, 1, cfg["batch"],
                              cfg["block"])
            entry = {"collective": coll, "bytes": nbytes, "requested_bytes": size,
                     "count": nbytes // esize, "iters": max(iters.values()),
                     "t_monotonic": [t_cell, time.monotonic()]}
            for name in timed_groups:
                entry[name] = _summary(_max_over_ranks(dist, local[name], gloo))
            if algo_groups:
                entry["algos"] = {name.split("/", 1)[1]: entry.pop(name) for name in algo_groups}
            if coll == "all_reduce" and peer_ops:
                entry["peers"] = {name: entry.pop(name) for name in peer_ops}
            if no_agreement and coll != "barrier":
                entry["agreement_off"] = entry.pop("no_agreement")
            if coll in ZERO_COPY_COLLECTIVES and zc_groups:
                entry["zero_copy"] = {name: entry.pop(name) for name in zc_groups}
                for name, g in zc_groups.items():
                    entry["zero_copy"][name]["paths"] = counter_delta(
                        zc_before[name], read_counters(cuda_p2p.get_cuda_p2p_backend(g)))
            del bufs
            # Which paths of the backend ran (warmup and timed iterations), as counted by
            # the backend itself: says whether a number measures the workspace or the wrapped Gloo.
            entry["paths"] = counter_delta(counters_before, read_counters(p2p_backend))
            if coll == "barrier":
                barrier_res = entry
                continue
            step(f"{label}: check")
            entry["check"] = _check(dist, coll, nbytes, n, rank, dtype, timed_groups) \
                if cfg["check"] else None
            results.append(entry)
        set_algo_groups(None)

        step("backend_state")
        state = backend_state(p2p_backend)
        if rank == 0:
            out = {"world_size": n, "threads": threads, "results": results, "barrier": barrier_res,
                   "backend_state": state}
            tmp = os.path.join(cfg["tmpdir"], "results.json.tmp")
            with open(tmp, "w") as f:
                json.dump(out, f)
            os.replace(tmp, os.path.join(cfg["tmpdir"], "results.json"))
        step("destroy_process_group")
        dist.barrier(group=gloo)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


# ------------------------------------------------------------------------------------------------
# launcher side

class BenchError(RuntimeError):
    pass


def launch(world_size: int, cfg: dict) -> dict:
    """Spawns the ranks of one world size, waits for them under a deadline, and returns rank 0's
    results. On any failure every rank is killed and BenchError says which rank was where."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="cuda_p2p_bench_") as tmpdir:
        # --netns: the store listens in host 0's namespace, on its end of the link.
        master = cfg["netns"][0]["addr"] if cfg["netns"] else "127.0.0.1"
        cfg = dict(cfg, world_size=world_size, tmpdir=tmpdir, parent_pid=os.getpid(),
                   init_method=f"tcp://{master}:{free_port()}", deepspeed_port=free_port())
        ctx = mp.start_processes(rank_main, args=(cfg,), nprocs=world_size, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + cfg["total_timeout"]
        failure = None
        try:
            # grace_period: when a rank fails, the others get 3 s to fail on their own (a broken
            # connection), then SIGTERM, then after 3 s more SIGKILL (a stopped or wedged rank).
            while not ctx.join(timeout=0.5, grace_period=3.0):
                if time.monotonic() > deadline:
                    failure = (f"world_size={world_size}: did not finish within --total-timeout="
                               f"{cfg['total_timeout']:g} s")
                    break
        except mp.ProcessRaisedException as e:
            failure = f"world_size={world_size}: rank {e.error_index} raised:\n{e}"
        except mp.ProcessExitedException as e:
            if e.exit_code < 0:
                how = f"was killed by signal {e.signal_name}"
            else:
                how = f"exited with code {e.exit_code}"
                if e.exit_code == 1:
                    how += (f" (after a 'Timeout' stack dump above: one of its steps outlived "
                            f"--timeout={cfg['timeout']:g} s)")
            failure = f"world_size={world_size}: rank {e.error_index} {how}"
        except BaseException:  # KeyboardInterrupt and friends: clean up, then re-raise
            _kill_all(ctx)
            raise
        finally:
            if failure is not None:
                where = []
                for r in range(world_size):
                    try:
                        where.append(f"  rank {r}: {Path(tmpdir, f'rank{r}.step').read_text()}")
                    except OSError:
                        where.append(f"  rank {r}: (no step recorded: still starting up)")
                _kill_all(ctx)
                failure += "\nlast step of each rank:\n" + "\n".join(where)
            if cfg["deepspeed"]:
                _remove_deepspeed_segments(cfg["deepspeed_port"], world_size)
        if failure is not None:
            raise BenchError(failure)
        path = Path(tmpdir, "results.json")
        if not path.exists():
            raise BenchError(f"world_size={world_size}: ranks exited without results")
        return json.loads(path.read_text())


def _kill_all(ctx) -> None:
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    for p in ctx.processes:
        p.join(timeout=10)


def speedup_ci(p2p_us: list[float], gloo_us: list[float], reps: int = 2000) -> list[float]:
    """95% bootstrap interval of median(gloo) / median(cuda_p2p).

    Where both took the same number of samples, sample i of both ran in the same round, so
    samples are resampled in pairs (the baseline may take fewer: _iterations; each side is then
    resampled on its own); and slow phases (another process taking a core) span many samples, so
    they are resampled in circular blocks of about sqrt(samples) consecutive ones (moving-block
    bootstrap).
    """
    import numpy as np

    a, b = np.asarray(p2p_us), np.asarray(gloo_us)
    rng = np.random.default_rng(0)

    def blocks(n):  # indices of `reps` moving-block resamples of n samples
        block = max(1, int(round(math.sqrt(n))))
        starts = rng.integers(0, n, size=(reps, -(-n // block)))
        return ((starts[:, :, None] + np.arange(block)) % n).reshape(reps, -1)[:, :n]

    ia = blocks(len(a))
    ib = ia if len(a) == len(b) else blocks(len(b))
    r = np.median(b[ib], axis=1) / np.median(a[ia], axis=1)
    return [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]


def add_derived(run: dict, memcpy_gbps: float) -> None:
    n = run["world_size"]
    for e in run["results"]:
        factor = BUSBW_FACTOR[e["collective"]](n)
        for name in BACKENDS:
            s = e[name]
            t = s["median_us"] * 1e-6
            s["algbw_GBps"] = e["bytes"] / t / 1e9
            s["busbw_GBps"] = s["algbw_GBps"] * factor
            s["busbw_frac_memcpy"] = s["busbw_GBps"] / memcpy_gbps
        for s in (list(e.get("algos", {}).values()) + list(e.get("peers", {}).values())
                  + list(e.get("zero_copy", {}).values())
                  + ([e["agreement_off"]] if "agreement_off" in e else [])):
            t = s["median_us"] * 1e-6
            s["algbw_GBps"] = e["bytes"] / t / 1e9
            s["busbw_GBps"] = s["algbw_GBps"] * factor
            s["busbw_frac_memcpy"] = s["busbw_GBps"] / memcpy_gbps
    for e in run["results"] + ([run["barrier"]] if run.get("barrier") else []):
        e["speedup"] = e["gloo"]["median_us"] / e["cuda_p2p"]["median_us"]
        e["speedup_ci95"] = speedup_ci(e["cuda_p2p"]["times_us"], e["gloo"]["times_us"])
        if "agreement_off" in e:
            # > 1: what the agreement costs (with / without it, same run).
            off = e["agreement_off"]
            e["agreement_cost"] = e["cuda_p2p"]["median_us"] / off["median_us"]
            e["agreement_cost_ci95"] = speedup_ci(off["times_us"], e["cuda_p2p"]["times_us"])
        for s in e.get("zero_copy", {}).values():
            # < 1: faster than the staged path of the default group (no heap), same run.
            s["ratio_vs_staged"] = s["median_us"] / e["cuda_p2p"]["median_us"]
            # speedup_ci(a, b) bounds median(b) / median(a): here zero-copy's over staged's.
            s["ratio_vs_staged_ci95"] = speedup_ci(e["cuda_p2p"]["times_us"], s["times_us"])
            # > 1: faster than Gloo, same run.
            s["speedup_vs_gloo"] = e["gloo"]["median_us"] / s["median_us"]
            s["speedup_vs_gloo_ci95"] = speedup_ci(s["times_us"], e["gloo"]["times_us"])
        peers = e.get("peers", {})
        for s in peers.values():
            s["speedup_vs_gloo"] = e["gloo"]["median_us"] / s["median_us"]
        if "deepspeed" in peers:
            # > 1: cuda_p2p is faster than DeepSpeed's shm all-reduce, by that factor.
            ds = peers["deepspeed"]
            e["vs_deepspeed"] = {"dist": ds["median_us"] / e["cuda_p2p"]["median_us"]}
            e["vs_deepspeed_ci95"] = {"dist": speedup_ci(e["cuda_p2p"]["times_us"],
                                                         ds["times_us"])}
            if "cuda_p2p_op" in peers:
                op = peers["cuda_p2p_op"]
                e["vs_deepspeed"]["op"] = ds["median_us"] / op["median_us"]
                e["vs_deepspeed_ci95"]["op"] = speedup_ci(op["times_us"], ds["times_us"])
            if "deepspeed_comm" in peers:
                # Like for like: both libraries' Python communication APIs.
                comm = peers["deepspeed_comm"]
                e["vs_deepspeed"]["dist_vs_comm"] = comm["median_us"] / e["cuda_p2p"]["median_us"]
                e["vs_deepspeed_ci95"]["dist_vs_comm"] = speedup_ci(e["cuda_p2p"]["times_us"],
                                                                    comm["times_us"])


SPEEDUP_COLORS = ["k", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
SHORT_NAMES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast",
               "all_to_all_single": "all_to_all", "reduce": "reduce", "send_recv": "send_recv",
               "barrier": "barrier"}


def fmt_gbps(v: float) -> str:
    return f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}"


def fmt_paths(paths: dict | None) -> str:
    """'one_shot' from {'all_reduce.one_shot': 57}; '-' where the backend counted nothing."""
    if not paths:
        return "-"
    return "+".join(k.split(".", 1)[-1] for k in paths)


def fmt_cores(e: dict) -> str:
    """'cores 70-310 ns': the range of the placement samples taken during the cell, when the
    placement varied during the run; '' otherwise."""
    c = e.get("cores")
    if not c or not c["run_varied"] or not c["samples"]:
        return ""
    lo, hi = min(c["round_trip_ns"]), max(c["round_trip_ns"])
    return f"cores {lo:.0f} ns" if lo == hi else f"cores {lo:.0f}-{hi:.0f} ns"


def print_table(run: dict, memcpy: dict, dtype: str) -> None:
    n = run["world_size"]
    cols = [("collective", "", "<", 15), ("size", "", ">", 10), ("iters", "", ">", 6),
            ("p2p", "us", ">", 10), ("gloo", "us", ">", 10), ("speedup", "gloo/p2p", ">", 9),
            ("95% CI", "speedup", ">", 13), ("p2p busbw", "GB/s", ">", 11),
            ("gloo busbw", "GB/s", ">", 11), ("p2p", "%memcpy", ">", 9),
            ("gloo", "%memcpy", ">", 9), ("check", "", ">", 7), ("  p2p path", "", "<", 30)]

    def line(cells):
        return "".join(f"{c:{a}{w}}" for c, (_, _, a, w) in zip(cells, cols)).rstrip()

    print(f"\nworld_size={n}  threads={run.get('threads', 1)}  dtype={dtype}  "
          f"single-core memcpy={memcpy['GBps']:.2f} GB/s  "
          f"latency = median over iterations of the slowest rank's time")
    if run.get("aa"):
        print("A/A MODE: the 'p2p' columns measure a second Gloo group, not cuda_p2p")
    st = run.get("backend_state", {})
    if "is_p2p_available" in st:
        ws = (f"available, {fmt_size(st.get('get_buffer_size', 0))} buffer per rank"
              if st["is_p2p_available"]
              else f"unavailable ({st.get('p2p_unavailable_reason', '')})")
        print(f"cuda_p2p workspace: {ws}")
    if st.get("hierarchy"):
        print(f"cuda_p2p hierarchical over hosts {st['hierarchy']['hosts']} (each host's workspace "
              "+ Gloo between hosts); gloo = the flat wrapped backend")
    print(line([c[0] for c in cols]))
    print(line([c[1] for c in cols]))
    print("-" * sum(c[3] for c in cols[:-1]))
    prev = None
    for e in run["results"] + ([run["barrier"]] if run.get("barrier") else []):
        if prev is not None and e["collective"] != prev:
            print()
        prev = e["collective"]
        p, g = e["cuda_p2p"], e["gloo"]
        lo, hi = e["speedup_ci95"]
        cells = [SHORT_NAMES[e["collective"]], "-", str(e["iters"]), f"{p['median_us']:.1f}",
                 f"{g['median_us']:.1f}", f"{e['speedup']:.2f}x", f"[{lo:.2f}, {hi:.2f}]"]
        if e["collective"] == "barrier":
            cells += ["-"] * 5
        else:
            cells[1] = fmt_size(e["bytes"])
            cells += [fmt_gbps(p["busbw_GBps"]), fmt_gbps(g["busbw_GBps"]),
                      f"{100 * p['busbw_frac_memcpy']:.1f}%",
                      f"{100 * g['busbw_frac_memcpy']:.1f}%",
                      "-" if e.get("check") is None else ("ok" if e["check"]["ok"] else "FAIL")]
        cells.append("  " + " ".join(filter(None, (fmt_paths(e.get("paths")), fmt_cores(e)))))
        print(line(cells))


def markdown_report(doc: dict) -> str:
    """One run as a markdown section: the numbers docs/ and the README quote, all from this run."""
    meta, mc, mcc = doc["meta"], doc["memcpy"], doc.get("memcpy_in_cache")
    la0, la1 = meta["loadavg_start"][0], meta["loadavg_end"][0]
    cmd = " ".join(["python bench/bench_collectives.py"] + meta["argv"])
    out = [f"#### {meta['timestamp']}: `{cmd}`",
           "",
           f"Machine: {meta['host']}, {meta['cpu_count']} CPUs, {meta['platform']}; Python "
           f"{meta['python']}, torch {meta['torch']}, commit "
           f"{meta.get('git', {}).get('commit', '?')[:10]}"
           f"{' (dirty)' if meta.get('git', {}).get('dirty') else ''}; {meta['dtype']}; load "
           f"average {la0:.1f} at start, {la1:.1f} at end. Single-core memcpy: "
           f"{mc['GBps']:.2f} GB/s out of cache (64 MiB)"
           + (f", {mcc['GBps']:.2f} GB/s in cache (256 KiB)" if mcc else "") +
           "; % memcpy is bus bandwidth over the out-of-cache rate."
           + (f" cuda_p2p runs hierarchically over {meta['hosts']} simulated hosts "
              "(CUDA_P2P_HOST_ID); Gloo is the flat wrapped backend."
              if meta.get("hosts", 1) > 1 else "")
           + (f" Each host's ranks in a network namespace of their own, joined by: "
              f"{meta.get('link') or 'a veth pair'}." if meta.get("netns") else ""),
           "",
           "| W | collective | size | cuda_p2p us | Gloo us | speedup (95% CI) | busbw GB/s | "
           "% memcpy | path |",
           "|---|------------|------|------------:|--------:|------------------|-----------:|"
           "---------:|------|"]
    for run in doc["runs"]:
        for e in run["results"] + ([run["barrier"]] if run.get("barrier") else []):
            p, g = e["cuda_p2p"], e["gloo"]
            lo, hi = e["speedup_ci95"]
            size = "-" if e["collective"] == "barrier" else fmt_size(e["bytes"])
            bw = "-" if e["collective"] == "barrier" else fmt_gbps(p["busbw_GBps"])
            frac = ("-" if e["collective"] == "barrier"
                    else f"{100 * p['busbw_frac_memcpy']:.0f}%")
            out.append(f"| {run['world_size']}{_threads_tag(run)} | {e['collective']} | {size} | "
                       f"{p['median_us']:.1f} | {g['median_us']:.1f} | {e['speedup']:.1f}x "
                       f"[{lo:.1f}, {hi:.1f}] | {bw} | {frac} | "
                       f"{' '.join(filter(None, (fmt_paths(e.get('paths')), fmt_cores(e))))} |")
    return "\n".join(out) + "\n"


def print_zero_copy_table(run: dict) -> None:
    """--zero-copy: staged (the default group, no heap) vs zero-copy inputs vs ordinary inputs on
    a group with a heap; ratios of medians against staged, same run (< 1: faster); and Gloo's
    median over zero-copy's (> 1: zero-copy faster than Gloo)."""
    rows = [e for e in run["results"] if e.get("zero_copy")]
    if not rows:
        return
    agreement = run.get("zero_copy_agreement", "auto")
    print(f"\nzero-copy  world_size={run['world_size']}  agreement={agreement}  (ratio = column "
          "/ staged, same run; % memcpy = bus bandwidth / 1-core memcpy)")
    print(f"{'collective':<24}{'size':>8}{'staged us':>11}{'zero-copy us':>14}{'ratio':>7}"
          f"{'heap,staged us':>16}{'ratio':>7}{'staged %mc':>11}{'zc %mc':>8}{'zc vs Gloo':>11}"
          "  zc path")
    for e in rows:
        zc, hs = e["zero_copy"]["zero_copy"], e["zero_copy"]["heap_staged"]
        st = e["cuda_p2p"]
        print(f"{e['collective']:<24}{fmt_size(e['bytes']):>8}{st['median_us']:>11.1f}"
              f"{zc['median_us']:>14.1f}{zc['ratio_vs_staged']:>7.2f}{hs['median_us']:>16.1f}"
              f"{hs['ratio_vs_staged']:>7.2f}{100 * st['busbw_frac_memcpy']:>10.1f}%"
              f"{100 * zc['busbw_frac_memcpy']:>7.1f}%"
              f"{zc['speedup_vs_gloo']:>10.1f}x  {fmt_paths(zc.get('paths'))}")


def print_agreement_table(run: dict) -> None:
    """--agreement-cost: the hierarchical group with and without its group-wide agreement,
    interleaved in the same run (cost = with / without; > 1: slower with it)."""
    rows = [e for e in run["results"] if "agreement_off" in e]
    if not rows:
        return
    print(f"\nagreement cost  world_size={run['world_size']}  (hierarchical, same run; cost = "
          "with / without the agreement)")
    print(f"{'collective':<24}{'size':>8}{'with us':>10}{'without us':>12}{'cost':>7}"
          f"{'95% CI':>16}{'gloo us':>10}")
    for e in rows:
        lo, hi = e["agreement_cost_ci95"]
        print(f"{e['collective']:<24}{fmt_size(e['bytes']):>8}{e['cuda_p2p']['median_us']:>10.1f}"
              f"{e['agreement_off']['median_us']:>12.1f}{e['agreement_cost']:>7.2f}"
              f"{f'[{lo:.2f}, {hi:.2f}]':>16}{e['gloo']['median_us']:>10.1f}")


def _threads_tag(run: dict) -> str:
    return f" t={run['threads']}" if run.get("threads", 1) > 1 else ""


def print_peer_table(run: dict) -> None:
    """The all-reduce side by side: Gloo, DeepSpeed's shm op (bare, and through deepspeed.comm),
    cuda_p2p via dist.all_reduce and via its dispatcher op; ratios > 1 mean cuda_p2p is faster:
    op/op = bare op against bare op, api/api = dist.all_reduce against deepspeed.comm, ds/dist =
    dist.all_reduce against DeepSpeed's bare op."""
    es = [e for e in run["results"] if e.get("peers")]
    if not es:
        return
    names = [p for p in PEERS if p in es[0]["peers"]]
    cols = [("gloo", lambda e: e["gloo"])]
    if "deepspeed" in names:
        cols.append(("ds op", lambda e: e["peers"]["deepspeed"]))
    if "deepspeed_comm" in names:
        cols.append(("ds.comm", lambda e: e["peers"]["deepspeed_comm"]))
    cols.append(("p2p dist", lambda e: e["cuda_p2p"]))
    if "cuda_p2p_op" in names:
        cols.append(("p2p op", lambda e: e["peers"]["cuda_p2p_op"]))
    ratios = [(label, key) for label, key in (("op/op", "op"), ("api/api", "dist_vs_comm"),
                                              ("ds/dist", "dist"))
              if key in es[0].get("vs_deepspeed", {})]
    print(f"\nworld_size={run['world_size']}  all_reduce side by side: median latency (us) of the "
          "slowest rank")
    head = f"{'size':>10}" + "".join(f"{c:>10}" for c, _ in cols) + \
        "".join(f"{r:>9}{'95% CI':>14}" for r, _ in ratios)
    print(head)
    print("-" * len(head))
    for e in es:
        line = f"{fmt_size(e['bytes']):>10}" + "".join(f"{get(e)['median_us']:>10.1f}"
                                                        for _, get in cols)
        for _, k in ratios:
            lo, hi = e["vs_deepspeed_ci95"][k]
            line += f"{e['vs_deepspeed'][k]:>8.2f}x{f'[{lo:.2f}, {hi:.2f}]':>14}"
        print((line + "  " + fmt_cores(e)).rstrip())


def _best_threshold(points: list[tuple[int, float, float]]) -> int:
    """points: (size, latency of the small-message algorithm, of the large-message one). The
    threshold t (0 or one of the sizes) for "small algorithm up to t bytes, large above" whose
    choices lose the least against the faster algorithm at each size, summed as ratios (so
    that no size dominates and one noisy size cannot flip a whole range); ties go to the
    smaller t."""
    points = sorted(points)
    best_t, best_cost = 0, None
    for t in [0] + [p[0] for p in points]:
        cost = sum((small if size <= t else large) / min(small, large)
                   for size, small, large in points)
        if best_cost is None or cost < best_cost - 1e-9:
            best_t, best_cost = t, cost
    return best_t


def suggest_thresholds(run: dict) -> dict:
    """Thresholds of the automatic choice from a run with --algos (medians of the same run),
    named like the ProcessGroupCudaP2P.Options fields (docs/collectives.md):
    all_reduce_one_shot_max_bytes (one-shot vs two-shot), all_gather_ring_max_bytes (ring vs
    direct; 3+ ranks), reduce_scatter_ring_max_bytes (ring vs direct)."""
    def points(coll, small, large):
        return [(e["bytes"], e["algos"][small]["median_us"], e["algos"][large]["median_us"])
                for e in run["results"] if e["collective"] == coll and "algos" in e]
    out = {}
    if p := points("all_reduce", "one_shot", "two_shot"):
        out["all_reduce_one_shot_max_bytes"] = _best_threshold(p)
    if run["world_size"] > 2:
        if p := points("all_gather_into_tensor", "ring", "direct"):
            out["all_gather_ring_max_bytes"] = _best_threshold(p)
    if p := points("reduce_scatter_tensor", "ring", "direct"):
        out["reduce_scatter_ring_max_bytes"] = _best_threshold(p)
    return out


def print_algo_tables(run: dict) -> None:
    n = run["world_size"]
    for coll in ALGOS:
        es = [e for e in run["results"] if e["collective"] == coll and "algos" in e]
        if not es:
            continue
        names = list(es[0]["algos"])
        print(f"\nworld_size={n}  {SHORT_NAMES[coll]}: median latency (us) per forced algorithm")
        head = f"{'size':>10}{'gloo':>11}{'auto':>11}" + "".join(f"{a:>13}" for a in names) + \
            f"{'fastest':>13}{'busbw GB/s':>12}"
        print(head)
        print("-" * len(head))
        for e in es:
            lat = {a: e["algos"][a]["median_us"] for a in names}
            best = min(lat, key=lat.get)
            print(f"{fmt_size(e['bytes']):>10}{e['gloo']['median_us']:>11.1f}"
                  f"{e['cuda_p2p']['median_us']:>11.1f}"
                  + "".join(f"{lat[a]:>13.1f}" for a in names)
                  + f"{best:>13}{fmt_gbps(e['algos'][best]['busbw_GBps']):>12}")
    th = run.get("thresholds")
    if th:
        print(f"\nworld_size={n}  suggested thresholds: "
              + ", ".join(f"{k}={v}" for k, v in th.items()))


def plot(runs: list[dict], memcpy: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    colls = [c for c in COLLECTIVES
             if any(e["collective"] == c for r in runs for e in r["results"])]
    fig, axes = plt.subplots(3, len(colls), figsize=(4.2 * len(colls), 10.5), squeeze=False,
                             sharex="col")
    colors = {"cuda_p2p": "tab:red", "gloo": "tab:blue"}
    markers = ["o", "s", "^", "D", "v", "P"]
    for j, coll in enumerate(colls):
        ax_lat, ax_bw, ax_sp = axes[0][j], axes[1][j], axes[2][j]
        for k, run in enumerate(runs):
            es = [e for e in run["results"] if e["collective"] == coll]
            if not es:
                continue
            x = [e["bytes"] for e in es]
            m = markers[k % len(markers)]
            for name in BACKENDS:
                lbl = f"{name} n={run['world_size']}{_threads_tag(run)}"
                ax_lat.plot(x, [e[name]["median_us"] for e in es], marker=m, color=colors[name],
                            alpha=0.9 if len(runs) == 1 else 0.5 + 0.5 * (k + 1) / len(runs),
                            label=lbl)
                ax_bw.plot(x, [e[name]["busbw_GBps"] for e in es], marker=m, color=colors[name],
                           alpha=0.9 if len(runs) == 1 else 0.5 + 0.5 * (k + 1) / len(runs),
                           label=lbl)
            for name, color in (("deepspeed", "tab:green"), ("deepspeed_comm", "tab:olive"),
                                ("cuda_p2p_op", "tab:orange")):
                pts = [(e["bytes"], e["peers"][name]["median_us"]) for e in es
                       if name in e.get("peers", {})]
                if pts:
                    ax_lat.plot([a for a, _ in pts], [b for _, b in pts], marker=m, color=color,
                                ls="--", label=f"{name} n={run['world_size']}{_threads_tag(run)}")
            sp_color = SPEEDUP_COLORS[k % len(SPEEDUP_COLORS)]
            ax_sp.plot(x, [e["speedup"] for e in es], marker=m, color=sp_color,
                       label=f"n={run['world_size']}{_threads_tag(run)} (band: 95% CI)")
            ax_sp.fill_between(x, [e["speedup_ci95"][0] for e in es],
                               [e["speedup_ci95"][1] for e in es], color=sp_color, alpha=0.15)
        ax_bw.axhline(memcpy["GBps"], color="gray", ls="--", lw=1, label="1-core memcpy")
        ax_sp.axhline(1.0, color="gray", ls="--", lw=1)
        ax_lat.set_title(coll)
        for ax in (ax_lat, ax_bw, ax_sp):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=4))
            ax.xaxis.set_major_formatter(FuncFormatter(
                lambda v, _: fmt_size(int(round(v))).replace(" ", "").replace("i", "")))
            ax.grid(True, which="both", alpha=0.3)
        ax_lat.set_yscale("log")
        ax_bw.set_yscale("log")
        ax_sp.set_xlabel("message size")
        lo, hi = ax_sp.get_ylim()
        ax_sp.set_ylim(min(lo, 0.8), max(hi, 1.25))
        if j == 0:
            ax_lat.set_ylabel("latency (us, median)")
            ax_bw.set_ylabel("bus bandwidth (GB/s)")
            ax_sp.set_ylabel("speedup gloo / cuda_p2p")
        if j == len(colls) - 1:
            ax_lat.legend(fontsize=7)
            ax_bw.legend(fontsize=7)
            ax_sp.legend(fontsize=7)
    bar = "  ".join(
        f"barrier n={r['world_size']}: cuda_p2p {r['barrier']['cuda_p2p']['median_us']:.0f} us, "
        f"gloo {r['barrier']['gloo']['median_us']:.0f} us" for r in runs if r.get("barrier"))
    fig.suptitle(f"{title}\n{bar}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="cuda_p2p vs Gloo collective benchmark on local CPU ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4], metavar="N",
                    help="numbers of ranks; one run per value")
    ap.add_argument("--full", action="store_true",
                    help=f"sweep powers of 2 from {fmt_size(FULL_MIN)} to {fmt_size(FULL_MAX)}")
    ap.add_argument("--sizes", type=parse_size, nargs="+", metavar="SIZE",
                    help="message sizes (e.g. 8 1K 64KiB 16M); default: "
                         + " ".join(fmt_size(s).replace(" ", "") for s in SHORT_SIZES))
    ap.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    ap.add_argument("--no-barrier", dest="barrier", action="store_false",
                    help="skip the barrier latency measurement")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], metavar="N",
                    help="ATen intra-op threads per rank (torch.set_num_threads), one run per N "
                         "for every world size; cuda_p2p splits its large host copies and "
                         "reductions across them (Options.parallel_min_bytes)")
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="core: pin rank r to the r-th CPU (mod the CPUs this process may use); "
                         "none: let the scheduler place ranks")
    ap.add_argument("--core-probe", type=float, default=0.5, metavar="SECONDS",
                    help="every SECONDS, time a 2 ms cache-line ping-pong between the first two "
                         "ranks' CPUs (the machine's core placement, bench/README.md) and, when "
                         "it varied during the run, mark every cell with what it was; 0: off")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations per backend")
    ap.add_argument("--iters", type=int, default=0,
                    help="timed iterations per backend (0: adaptive, see --budget)")
    ap.add_argument("--budget", type=float, default=None,
                    help="adaptive iterations: seconds per (collective, size) for all columns, "
                         "Gloo taking one column's share (default 1.5, 2.0 with --full)")
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--max-iters", type=int, default=500)
    ap.add_argument("--sync", choices=("shm", "gloo"), default="shm",
                    help="how ranks line up before every timed sample, on a group neither "
                         "measured backend uses: shm (a separate cuda_p2p group's shared-memory "
                         "barrier, then a synchronized start: every rank spins until the same "
                         "instant) or gloo (a Gloo barrier; its exit skew, ~170 us median on 4 "
                         "ranks / 2 cores, lands in every measurement)")
    ap.add_argument("--start-margin-us", type=float, default=200.0,
                    help="--sync shm: ranks start each timed sample this long after the last one "
                         "reached the barrier (all of them awake and spinning)")
    ap.add_argument("--batch", type=int, default=1,
                    help="back-to-back ops per timed sample (NCCL-tests style); latency = the "
                         "sample's time / batch")
    ap.add_argument("--block", type=int, default=8,
                    help="backends take turns by blocks of this many consecutive samples (1: "
                         "alternate every sample, so that half the ops run right after the other "
                         "backend's)")
    ap.add_argument("--zero-copy", action="store_true",
                    help="also time all-reduce, all-gather, reduce-scatter, broadcast and "
                         "all_to_all_single on a group with a symmetric heap: inputs from "
                         "cuda_p2p.empty (zero-copy) and ordinary inputs (heap, staged), as "
                         "ratios to the staged default group (and zero-copy against Gloo)")
    ap.add_argument("--zero-copy-agreement", choices=("auto", "exchange", "signature"),
                    default="auto",
                    help="--zero-copy: how those groups' ranks agree that inputs are symmetric "
                         "(Options.zero_copy_agreement; auto: exchange on the host)")
    ap.add_argument("--algos", action="store_true",
                    help="also time every workspace algorithm forced in turn, and suggest the "
                         "automatic choice's size thresholds")
    ap.add_argument("--peers", choices=("auto", "none"), default="auto",
                    help="all_reduce: also time cuda_p2p's dispatcher op "
                         "(torch.ops.cuda_p2p.all_reduce_) and, when deepspeed is installed and "
                         "its shm op builds, DeepSpeed's shared-memory all-reduce, side by side")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip comparing cuda_p2p's results with Gloo's and a local reference")
    ap.add_argument("--aa", action="store_true",
                    help="A/A test of the method: measure a second Gloo group in place of cuda_p2p "
                         "(speedups then show the noise floor)")
    ap.add_argument("--env", type=parse_kv, action="append", default=[], metavar="KEY=VALUE",
                    help="environment variable for the ranks (repeatable), e.g. a cuda_p2p knob")
    ap.add_argument("--pg-option", type=parse_kv, action="append", default=[],
                    metavar="NAME=VALUE",
                    help="attribute of cuda_p2p.ProcessGroupCudaP2P.Options (repeatable; VALUE is "
                         "a Python literal), e.g. buffer_size=1048576")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="per-rank: seconds a step (init, warmup, check; the timed iterations get "
                         "twice their expected duration on top) may take before the rank dumps "
                         "its stack and exits; also the process groups' timeout")
    ap.add_argument("--total-timeout", type=float, default=None,
                    help="launcher: seconds one world size may take before every rank is killed "
                         "(default 600, 3600 with --full)")
    ap.add_argument("--hosts", type=int, default=1,
                    help="simulated hosts for the measured cuda_p2p group (ranks in contiguous "
                         "blocks): >1 measures its hierarchical collectives against the flat "
                         "wrapped Gloo; results default to bench/results/hierarchical.*")
    ap.add_argument("--host-sizes", type=int, nargs="+", default=None, metavar="RANKS",
                    help="the ranks of each simulated host, in rank order (e.g. 3 1: uneven "
                         "hosts, whose leaders carry the data); sets --hosts, and the one world "
                         "size is their sum")
    ap.add_argument("--agreement-cost", action="store_true",
                    help="with --hosts: also time the hierarchical group with its group-wide "
                         "agreement off (bench knob), interleaved, and print the ratio")
    ap.add_argument("--netns", type=parse_netns, nargs="+", default=None,
                    metavar="NAME,IFNAME,ADDRESS",
                    help="with --hosts H: one network namespace per host (made beforehand, as "
                         "scripts/bench.sh --link does), its interface to the other hosts and its "
                         "address there; needs root. The sync barrier is then Gloo's")
    ap.add_argument("--link", default=None, metavar="TEXT",
                    help="with --netns: what joins the namespaces (e.g. 'veth, tbf 10gbit, "
                         "measured 9.4 Gbit/s'), recorded in the JSON and titles")
    ap.add_argument("--json", type=Path, default=None,
                    help="default: bench/results/collectives.json (hierarchical.json with --hosts)")
    ap.add_argument("--plot", type=Path, default=None,
                    help="default: bench/results/collectives.png (hierarchical.png with --hosts)")
    ap.add_argument("--no-plot", dest="do_plot", action="store_false")
    ap.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                    help="also write the run as a markdown section (machine, date, load, both "
                         "memcpy yardsticks, one table of absolute us and ratios): what docs/ "
                         "and the README quote, pasted whole from one run")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)

    if any(n < 1 for n in args.world_sizes):
        ap.error("--world-sizes must be positive")
    if any(t < 1 for t in args.threads):
        ap.error("--threads must be positive")
    if args.host_sizes is not None:
        if any(r < 1 for r in args.host_sizes) or args.world_sizes != [sum(args.host_sizes)]:
            ap.error(f"--host-sizes {' '.join(map(str, args.host_sizes))} needs positive sizes "
                     f"and --world-sizes {sum(args.host_sizes)} alone, got --world-sizes "
                     f"{' '.join(map(str, args.world_sizes))}")
        args.hosts = len(args.host_sizes)
    if args.hosts < 1 or any(n < args.hosts for n in args.world_sizes):
        ap.error("--hosts must be >= 1 and at most every world size")
    if args.hosts > 1 and args.aa:
        ap.error("--hosts and --aa are exclusive")
    if args.agreement_cost and args.hosts < 2:
        ap.error("--agreement-cost needs --hosts >= 2")
    if args.netns is not None:
        if len(args.netns) != args.hosts or args.hosts < 2:
            ap.error(f"--netns needs one namespace per host (--hosts {args.hosts} >= 2), got "
                     f"{len(args.netns)}")
        # A shm sync group would span the namespaces, whose abstract sockets are apart.
        args.sync = "gloo"
    stem = "hierarchical" if args.hosts > 1 else "collectives"
    args.json = args.json or HERE / "results" / f"{stem}.json"
    args.plot = args.plot or HERE / "results" / f"{stem}.png"
    if args.sizes is None:
        if args.full:
            args.sizes = [1 << k for k in range(int(math.log2(FULL_MIN)),
                                                int(math.log2(FULL_MAX)) + 1)]
        else:
            args.sizes = list(SHORT_SIZES)
    elif args.full:
        ap.error("--full and --sizes are exclusive")
    args.sizes = sorted(set(args.sizes))
    if args.budget is None:
        args.budget = 2.0 if args.full else 1.5
    if args.total_timeout is None:
        args.total_timeout = 3600.0 if args.full else 600.0
    if args.batch < 1 or args.block < 1:
        ap.error("--batch and --block must be >= 1")
    if args.warmup < 1 or args.min_iters < 1 or args.max_iters < args.min_iters or args.iters < 0:
        ap.error("need --warmup >= 1, --iters >= 0, 1 <= --min-iters <= --max-iters")
    pg_options = {}
    if args.pg_option:
        import cuda_p2p

        known = [a for a in dir(cuda_p2p.ProcessGroupCudaP2P.Options()) if not a.startswith("_")]
        for key, value in args.pg_option:
            if key not in known:
                ap.error(f"--pg-option {key}: ProcessGroupCudaP2P.Options has no such attribute "
                         f"(it has: {', '.join(known)})")
            try:
                pg_options[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                ap.error(f"--pg-option {key}={value}: VALUE must be a Python literal")
            try:  # fail here, not in every rank
                setattr(cuda_p2p.ProcessGroupCudaP2P.Options(), key, pg_options[key])
            except Exception as e:
                ap.error(f"--pg-option {key}={value}: {e}")
    args.pg_options = pg_options
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    # SIGTERM (kill, timeout(1), CI cancellation) unwinds like Ctrl-C: the ranks are killed on
    # the way out (they would also die with the launcher, see _die_with_parent).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    import cuda_p2p  # fail early and clearly when the package is not built/installed

    # Ranks share the cores: one intra-op thread each (also for OpenMP/MKL in spawned children).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    host_workspace()  # the ranks inherit it
    env = dict(args.env)
    os.environ.update(env)

    load_start = os.getloadavg()
    if load_start[0] > 0.5 * (os.cpu_count() or 1):
        print(f"[bench] warning: load average {load_start[0]:.1f} on {os.cpu_count()} cores before "
              "the run: other processes compete with the ranks, timings will be noisy",
              file=sys.stderr, flush=True)
    memcpy = memcpy_bandwidth()
    memcpy_in_cache = memcpy_bandwidth(256 << 10, iters=200)
    print(f"[bench] single-core memcpy (torch copy_, 1 thread): out of cache (64 MiB, best of "
          f"{memcpy['iters']}) {memcpy['GBps']:.2f} GB/s (median {memcpy['median_GBps']:.2f}); in "
          f"cache (256 KiB, best of {memcpy_in_cache['iters']}) {memcpy_in_cache['GBps']:.2f} GB/s "
          f"(median {memcpy_in_cache['median_GBps']:.2f})", file=sys.stderr, flush=True)
    peers = args.peers == "auto" and "all_reduce" in args.collectives and not args.aa
    if not peers:
        deepspeed = {"available": False, "reason": "--peers none"}
    elif args.hosts > 1:
        # Its shm all-reduce spans one host's ranks; on simulated hosts it would run as if the
        # group were one host, which compares nothing.
        deepspeed = {"available": False, "reason": "--hosts: DeepSpeed's shm all-reduce is "
                                                   "for the ranks of one host"}
    else:
        deepspeed = deepspeed_status(args.dtype)
    if peers:
        print("[bench] DeepSpeed column: " + (f"DeepSpeed {deepspeed['version']} shm op"
              if deepspeed["available"] else f"off ({deepspeed['reason']})"),
              file=sys.stderr, flush=True)
    cfg = {"peers": peers, "deepspeed": deepspeed["available"],
           "sizes": args.sizes, "collectives": args.collectives, "barrier": args.barrier,
           "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters, "budget": args.budget,
           "min_iters": args.min_iters, "max_iters": args.max_iters, "check": args.check,
           "env": env, "pg_options": args.pg_options, "bind": args.bind, "aa": args.aa,
           "sync": args.sync, "batch": args.batch, "algos": args.algos,
           "zero_copy": args.zero_copy, "zero_copy_agreement": args.zero_copy_agreement,
           "start_margin_us": args.start_margin_us, "block": args.block, "hosts": args.hosts,
           "host_sizes": args.host_sizes,
           "agreement_cost": args.agreement_cost, "netns": args.netns,
           "cpus": sorted(os.sched_getaffinity(0)), "timeout": args.timeout,
           "total_timeout": args.total_timeout, "progress": not args.quiet}

    if args.netns:
        print(f"hosts in network namespaces {', '.join(ns['name'] for ns in args.netns)}, joined "
              f"by {args.link or 'a veth pair'}", flush=True)
    probe = CorePlacementProbe(cfg["cpus"], args.core_probe)
    if probe.enabled:
        print(f"[bench] core placement probe: CPUs {probe.cpus[0]} and {probe.cpus[1]}, "
              + (f"round trip {probe.typical_ns():.0f} ns at start; every {args.core_probe:g} s"
                 if probe.samples else f"off: {probe.error}" if probe.error
                 else "a CPU was busy at start (no round trip recorded)"),
              file=sys.stderr, flush=True)
    runs = []
    for n, threads in [(n, t) for n in args.world_sizes for t in args.threads]:
        t0 = time.perf_counter()
        try:
            run = launch(n, dict(cfg, threads=threads))
        except BenchError as e:
            probe.stop()
            print(f"\nbench: FAILED: {e}", file=sys.stderr)
            return 1
        for e in run["results"] + ([run["barrier"]] if run.get("barrier") else []):
            e["cores"] = probe.window(*e["t_monotonic"])
        run["aa"] = args.aa
        run["zero_copy_agreement"] = args.zero_copy_agreement
        run["wall_s"] = time.perf_counter() - t0
        add_derived(run, memcpy["GBps"])
        if args.algos:
            run["thresholds"] = suggest_thresholds(run)
        runs.append(run)
        print_table(run, memcpy, args.dtype)
        print_peer_table(run)
        print_zero_copy_table(run)
        print_agreement_table(run)
        if args.algos:
            print_algo_tables(run)
        sys.stdout.flush()

    probe.stop()
    for run in runs:  # whether the placement varied, now that every sample is in
        for e in run["results"] + ([run["barrier"]] if run.get("barrier") else []):
            e["cores"] = probe.window(*e["t_monotonic"])
    core_probe = probe.summary()
    if probe.samples:
        print(f"[bench] core placement: {core_probe['samples']} samples, round trips "
              f"{core_probe['min_ns']:.0f}-{core_probe['max_ns']:.0f} ns (median "
              f"{core_probe['typical_ns']:.0f}); "
              + ("it varied: each cell says what it was while it ran ('cores')"
                 if core_probe["varied"] else "it did not vary")
              + (f"; {probe.busy_samples} probes found a CPU busy" if probe.busy_samples
                 else "")
              + (f"; stopped: {probe.error}" if probe.error else ""), file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start
    failed = [(r["world_size"], e["collective"], e["bytes"]) for r in runs for e in r["results"]
              if e.get("check") and not e["check"]["ok"]]
    meta = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "host": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda_p2p": getattr(cuda_p2p, "__version__", None), "git": git_describe(),
        "dtype": args.dtype, "sizes": args.sizes, "bind": args.bind,
        "cpus": sorted(os.sched_getaffinity(0)), "aa": args.aa, "env": env,
        "pg_options": args.pg_options, "hosts": args.hosts, "host_sizes": args.host_sizes,
        "peers": args.peers,
        "agreement_cost": args.agreement_cost,
        "threads": args.threads,
        "netns": args.netns, "link": args.link,
        "deepspeed": deepspeed,
        "sync": args.sync, "batch": args.batch, "block": args.block, "algos": args.algos,
        "zero_copy": args.zero_copy, "zero_copy_agreement": args.zero_copy_agreement,
        "warmup": args.warmup, "budget_s": args.budget, "wall_s": wall,
        "core_probe": core_probe,
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "conventions": {
            "latency": "median over timed iterations of the max over ranks of one op's time "
                       "(a sample of --batch back-to-back ops / batch); ranks pass a barrier "
                       "(--sync: shm or gloo, on a group neither backend uses) before every "
                       "timed sample; backends take turns by blocks of --block samples",
            "bytes": "all_reduce/broadcast/reduce: buffer; all_gather: output; reduce_scatter: "
                     "input; all_to_all_single: input (NCCL-tests)",
            "algbw": "bytes / latency (1 GB = 1e9 B)",
            "busbw": "algbw * factor: all_reduce 2(n-1)/n, all_gather & reduce_scatter & "
                     "all_to_all_single (n-1)/n, broadcast & reduce 1",
            "speedup": "gloo median latency / cuda_p2p median latency",
            "peers": "all_reduce only: results[].peers.{cuda_p2p_op,deepspeed,deepspeed_comm} "
                     "timed like the backends (deepspeed: its bare op; deepspeed_comm: "
                     "deepspeed.comm.inference_all_reduce); > 1: cuda_p2p faster: "
                     "vs_deepspeed.op = deepspeed / cuda_p2p_op, vs_deepspeed.dist_vs_comm = "
                     "deepspeed_comm / cuda_p2p (dist.all_reduce), vs_deepspeed.dist = "
                     "deepspeed / cuda_p2p",
            "memcpy": "bytes copied per second by one thread (torch copy_ of 64 MiB: out of "
                      "cache), best of 20; the %memcpy columns divide by it",
            "memcpy_in_cache": "the same for 256 KiB (in the L2), best of 200",
            "cores": "results[].cores: the core placement probe's samples taken while the cell "
                     "ran (meta.core_probe; bench/README.md); run_varied: the run's slowest "
                     "sample took more than varied_factor x its fastest"},
    }
    doc = {"meta": meta, "memcpy": memcpy, "memcpy_in_cache": memcpy_in_cache, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"\n[bench] JSON: {args.json}", flush=True)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_report(doc))
        print(f"[bench] markdown: {args.markdown}", flush=True)
    if args.do_plot:
        try:
            what = "A/A TEST: Gloo vs Gloo" if args.aa else "cuda_p2p vs Gloo"
            if args.hosts > 1:
                layout = ("+".join(map(str, args.host_sizes)) + " ranks"
                          if args.host_sizes else f"{args.hosts} simulated hosts")
                what = f"cuda_p2p hierarchical on {layout} vs flat Gloo (the wrapped backend)"
                if args.netns:
                    what += f", hosts joined by {args.link or 'a veth pair'}"
            title = (f"{what}, CPU ranks, {args.dtype}, {os.cpu_count()} cores, "
                     f"torch {torch.__version__}")
            plot(runs, memcpy, args.plot, title)
            print(f"[bench] plot: {args.plot}", flush=True)
        except ImportError as e:
            print(f"[bench] no plot ({e}); install matplotlib", file=sys.stderr)
    print(f"[bench] total wall time {wall:.1f} s", flush=True)
    if failed:
        print(f"bench: FAILED: cuda_p2p results differ from Gloo/reference for {failed}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\nbench: interrupted (every rank was killed)", file=sys.stderr)
        sys.exit(130)
