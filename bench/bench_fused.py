#!/usr/bin/env python3
"""Fused GEMM pipelines against their unfused baselines, measured in the same run.

Launches W local CPU ranks (torch.multiprocessing, spawn) on the cuda_p2p backend, with a Gloo
group over the same ranks. For tensor-parallel transformer MLP shapes (tokens M, hidden H,
FFN F = 4H) it times

  all-gather→matmul (column-parallel: A_shard [M/W, H] gathered, times B [H, F/W]):
    matmul            A [M, H] @ B alone (A already gathered): the floor
    gloo+matmul       Gloo all_gather_into_tensor, then the matmul
    cuda_p2p+matmul   the cuda_p2p group's all_gather_into_tensor, then the matmul
    fused pipeline, fused pull_ahead   cuda_p2p.fused_all_gather_matmul (returning A, like the
                      baselines), per algorithm

  matmul→reduce-scatter (row-parallel: A [M, F/W] @ B [F/W, H], reduce-scattered):
    matmul, gloo+matmul, cuda_p2p+matmul (reduce_scatter_tensor), and
    fused pipeline, fused ring S=W, S=2W, ... (cuda_p2p.fused_matmul_reduce_scatter)

Variants of one case run interleaved (every iteration runs each once, in rotating order, each
after a Gloo barrier), so a change of machine load hits all of them alike. An iteration's time
is the slowest rank's; a variant's time is the median over iterations.

Output: a table on stdout, JSON, a Markdown table and a PNG of the ratios (bench/results/ by
default). Medians are the primary figure; minima (the least disturbed iteration) are reported too,
since this machine's 2 cores are shared with other jobs.

    .venv/bin/python bench/bench_fused.py     # W=4, default shapes (after scripts/setup.sh)
    ... bench/bench_fused.py --world-sizes 2 4 --dtypes float32 bfloat16 --iters 15
    ... bench/bench_fused.py --quick                                      # one small shape
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from _common import free_port, host_workspace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# (tokens M, hidden H); F = 4H. Scaled so that one op takes tens of ms on 2 cores.
DEFAULT_SHAPES = [(1024, 512), (2048, 512), (2048, 1024), (4096, 1024)]
QUICK_SHAPES = [(1024, 512)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Targets of the issue (fused vs baselines), checked in the summary.
TARGET_VS_MATMUL = 1.15
TARGET_VS_P2P = 1.05


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["load_avg_at_start"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                            capture_output=True, text=True,
                                            timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001  (no git: the benchmark still runs)
        pass
    return info


# ------------------------------------------------------------------------------------------------
# rank side


def _variants(dist, cuda_p2p, op, M, H, dtype, W, rank, gloo, p2p, ring_steps, threads=None):
    """{name: callable} for one case; inputs are allocated once."""
    F = 4 * H
    g = torch.Generator().manual_seed(1234 + rank)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    if op == "all_gather_matmul":
        A_shard, B = rnd(M // W, H), rnd(H, F // W)
        A_full = rnd(M, H)
        gathered = torch.empty(M, H, dtype=dtype)

        def unfused(group):
            def fn():
                dist.all_gather_into_tensor(gathered, A_shard, group=group)
                return gathered @ B
            return fn

        return {
            "matmul": lambda: A_full @ B,
            "gloo+matmul": unfused(gloo),
            "cuda_p2p+matmul": unfused(p2p),
            "fused pipeline": lambda: cuda_p2p.fused_all_gather_matmul(
                A_shard, [B], 0, p2p, algorithm="pipeline"),
            "fused pull_ahead": lambda: cuda_p2p.fused_all_gather_matmul(
                A_shard, [B], 0, p2p, algorithm="pull_ahead"),
            **({} if threads is None else {
                "fused auto [threads]": lambda: cuda_p2p.fused_all_gather_matmul(
                    A_shard, [B], 0, threads)}),
        }
    A, B = rnd(M, F // W), rnd(F // W, H)
    out = torch.empty(M // W, H, dtype=dtype)

    def unfused(group):
        def fn():
            dist.reduce_scatter_tensor(out, A @ B, group=group)
            return out
        return fn

    v = {
        "matmul": lambda: A @ B,
        "gloo+matmul": unfused(gloo),
        "cuda_p2p+matmul": unfused(p2p),
        "fused pipeline": lambda: cuda_p2p.fused_matmul_reduce_scatter(
            A, B, "sum", 0, p2p, algorithm="pipeline"),
    }
    for x in ring_steps:
        v[f"fused ring S={x}W"] = (lambda s: lambda: cuda_p2p.fused_matmul_reduce_scatter(
            A, B, "sum", 0, p2p, algorithm="ring", ring_steps=s))(x * W)
    if threads is not None:
        v["fused auto [threads]"] = lambda: cuda_p2p.fused_matmul_reduce_scatter(
            A, B, "sum", 0, threads)
    return v


def _init_rank(rank: int, W: int, port: int):
    """One rank of a bench job: one thread, the cuda_p2p world group and a Gloo group beside it
    (for the barriers and the reductions of the timings)."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    host_workspace()
    import torch.distributed as dist

    import cuda_p2p  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W)
    return dist.group.WORLD, dist.new_group(backend="gloo")


def _rank_main(rank, W, port, cases, iters, warmup, ring_steps, out_path, compare_threads):
    import torch.distributed as dist

    import cuda_p2p

    p2p, gloo = _init_rank(rank, W, port)
    backend = cuda_p2p.get_cuda_p2p_backend(p2p)
    threads = None
    if compare_threads:
        # The same pipelines with a thread per host stream (NOTE [Cooperative host streams]).
        opts = cuda_p2p.ProcessGroupCudaP2P.Options()
        opts.host_streams = "threads"
        opts.fused_min_flops = 0  # "auto" fused at every size (docs/pipelines.md, small ops)
        threads = dist.new_group(backend="cuda_p2p", pg_options=opts)
    results = []
    for op, M, H, dname in cases:
        dtype = DTYPES[dname]
        variants = _variants(dist, cuda_p2p, op, M, H, dtype, W, rank, gloo, p2p, ring_steps,
                             threads)
        names = list(variants)
        for name in names:
            for _ in range(warmup):
                variants[name]()
        backend.reset_counters()
        times = {n: [] for n in names}
        for it in range(iters):
            k = it % len(names)
            for name in names[k:] + names[:k]:
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
        slowest = {}
        for name in names:
            t = torch.tensor(times[name], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
            slowest[name] = t.tolist()
        results.append({"op": op, "W": W, "M": M, "H": H, "F": 4 * H, "dtype": dname,
                        "iters": iters, "times_s": slowest,
                        "median_ms": {n: statistics.median(v) * 1e3 for n, v in slowest.items()},
                        "min_ms": {n: min(v) * 1e3 for n, v in slowest.items()},
                        "counters": dict(backend.get_counters())})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _small_n_rank(rank, W, port, M, K, ns, dname, iters, out_path):
    """--small-n: fused (an explicit algorithm) vs unfused (our workspace collective + matmul)
    vs "auto" (the default Options.fused_min_flops) for A [M, K] and B [K, N], interleaved."""
    import torch.distributed as dist

    import cuda_p2p

    p2p, gloo = _init_rank(rank, W, port)
    # A group with a symmetric heap, for A_shard from cuda_p2p.empty (NOTE [Zero-copy
    # all-gather→matmul]); the other columns run on the world group, which has none.
    zc = dist.new_group(backend="cuda_p2p")
    dtype = DTYPES[dname]
    g = torch.Generator().manual_seed(99 + rank)
    out = []
    for N in ns:
        A_shard = torch.randn(M // W, K, generator=g).to(dtype)
        B = torch.randn(K, N, generator=g).to(dtype)
        A_zc = cuda_p2p.empty(M // W, K, dtype=dtype, group=zc).copy_(A_shard)
        gathered = torch.empty(M, K, dtype=dtype)
        A_rs = torch.randn(M, K, generator=g).to(dtype)
        B_rs = torch.randn(K, N, generator=g).to(dtype)
        scattered = torch.empty(M // W, N, dtype=dtype)

        def ag_unfused():
            dist.all_gather_into_tensor(gathered, A_shard, group=p2p)
            return gathered @ B

        def ag_unfused_alloc():
            # As the fused op must: it returns the gathered A, a new tensor on every call.
            out = torch.empty(M, K, dtype=dtype)
            dist.all_gather_into_tensor(out, A_shard, group=p2p)
            return out @ B

        def rs_unfused_alloc():
            out = torch.empty(M // W, N, dtype=dtype)
            dist.reduce_scatter_tensor(out, A_rs @ B_rs, group=p2p)
            return out

        def rs_unfused():
            dist.reduce_scatter_tensor(scattered, A_rs @ B_rs, group=p2p)
            return scattered

        variants = {
            ("AG→MM", "unfused"): ag_unfused,
            ("AG→MM", "unfused_alloc"): ag_unfused_alloc,
            ("AG→MM", "fused"): lambda: cuda_p2p.fused_all_gather_matmul(
                A_shard, [B], 0, p2p, algorithm="pull_ahead"),
            ("AG→MM", "auto"): lambda: cuda_p2p.fused_all_gather_matmul(A_shard, [B], 0, p2p),
            ("AG→MM", "fused_zero_copy"): lambda: cuda_p2p.fused_all_gather_matmul(
                A_zc, [B], 0, zc, algorithm="pull_ahead"),
            # The same heap tensor on the world group (no heap there): staged.
            ("AG→MM", "fused_heap_staged"): lambda: cuda_p2p.fused_all_gather_matmul(
                A_zc, [B], 0, p2p, algorithm="pull_ahead"),
            ("MM→RS", "unfused"): rs_unfused,
            ("MM→RS", "unfused_alloc"): rs_unfused_alloc,
            ("MM→RS", "fused"): lambda: cuda_p2p.fused_matmul_reduce_scatter(
                A_rs, B_rs, "sum", 0, p2p, algorithm="ring"),
            ("MM→RS", "auto"): lambda: cuda_p2p.fused_matmul_reduce_scatter(
                A_rs, B_rs, "sum", 0, p2p),
        }
        names = list(variants)
        for name in names:
            variants[name]()
        times = {n: [] for n in names}
        for it in range(iters):
            k = it % len(names)
            for name in names[k:] + names[:k]:
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
        for name in names:
            t = torch.tensor(times[name], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
            times[name] = statistics.median(t.tolist()) * 1e3
        for op in ("AG→MM", "MM→RS"):
            out.append({"op": op, "W": W, "M": M, "K": K, "N": N, "dtype": dname,
                        "flops": 2 * M * K * N,
                        **{v: times.get((op, v)) for v in ("unfused", "unfused_alloc", "fused",
                                                           "auto", "fused_zero_copy",
                                                           "fused_heap_staged")}})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def small_n(args) -> int:
    import torch.multiprocessing as mp

    rows = []
    for W in args.world_sizes:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out_path = tmp.name
        mp.spawn(_small_n_rank, args=(W, free_port(), 1024, 1024, args.small_n, args.dtypes[0],
                                      args.iters, out_path), nprocs=W, join=True)
        with open(out_path) as f:
            rows += json.load(f)
        os.unlink(out_path)
    # unfused: output buffers reused across calls; unfused_alloc: a new output per call, as the
    # fused ops (and "auto"'s unfused path) return.
    # zero-copy (all-gather→matmul only): A_shard from cuda_p2p.empty on a group with a heap,
    # against the same heap tensor staged (on the world group) and an ordinary A_shard staged.
    print("| op | W | M×K×N | dtype | GFLOP/rank | unfused ms | unfused+alloc ms | fused ms "
          "| auto ms | fused/unfused | auto/unfused | auto/unfused+alloc "
          "| zero-copy/heap staged | zero-copy/fused |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        zc = (f"{r['fused_zero_copy'] / r['fused_heap_staged']:.3f} | "
              f"{r['fused_zero_copy'] / r['fused']:.3f}" if r.get("fused_zero_copy") else "- | -")
        print(f"| {r['op']} | {r['W']} | {r['M']}×{r['K']}×{r['N']} | {r['dtype']} "
              f"| {r['flops'] / 2**30:.2f} | {r['unfused']:.2f} | {r['unfused_alloc']:.2f} "
              f"| {r['fused']:.2f} | {r['auto']:.2f} | {r['fused'] / r['unfused']:.3f} "
              f"| {r['auto'] / r['unfused']:.3f} | {r['auto'] / r['unfused_alloc']:.3f} "
              f"| {zc} |")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with open(args.out_dir / f"fused-small-n-{stamp}.json", "w") as f:
        json.dump({"machine": machine(), "results": rows}, f, indent=1)
    return 0


# ------------------------------------------------------------------------------------------------
# parent side


def ratios(r: dict, stat: str = "median_ms") -> dict:
    med = r[stat]
    fused = [n for n in med if n.startswith("fused")]
    out = {}
    for f in fused:
        out[f] = {"vs_matmul": med[f] / med["matmul"], "vs_gloo": med[f] / med["gloo+matmul"],
                  "vs_cuda_p2p": med[f] / med["cuda_p2p+matmul"]}
    return out


def best_fused(r: dict, stat: str = "median_ms") -> str:
    """The fastest fused variant of the default (cooperative) host streams."""
    med = r[stat]
    return min((n for n in med if n.startswith("fused") and "[threads]" not in n),
               key=lambda n: med[n])


def print_table(results: list) -> None:
    for r in results:
        med = r["median_ms"]
        print(f"\n{r['op']}  W={r['W']}  M={r['M']} H={r['H']} F={r['F']}  {r['dtype']}  "
              f"({r['iters']} iterations, median of the slowest rank)")
        rs = ratios(r)
        print(f"  {'':20s} {'median':>9s}    {'min':>9s}")
        for name, ms in med.items():
            extra = ""
            if name in rs:
                x = rs[name]
                extra = (f"  x{x['vs_matmul']:.3f} matmul  x{x['vs_gloo']:.3f} gloo+mm  "
                         f"x{x['vs_cuda_p2p']:.3f} cuda_p2p+mm")
            print(f"  {name:20s} {ms:9.2f} ms {r['min_ms'][name]:9.2f} ms{extra}")


def check_targets(results: list, stat: str = "median_ms") -> list:
    """One line per case: the best fused variant against the issue's targets."""
    lines = []
    for r in results:
        name = best_fused(r, stat)
        x = ratios(r, stat)[name]
        ok = (x["vs_matmul"] <= TARGET_VS_MATMUL and x["vs_gloo"] < 1.0
              and x["vs_cuda_p2p"] <= TARGET_VS_P2P)
        lines.append(f"{'ok  ' if ok else 'MISS'} {r['op']:18s} W={r['W']} M={r['M']:5d} "
                     f"H={r['H']:5d} {r['dtype']:9s} {name:18s} x{x['vs_matmul']:.3f} matmul "
                     f"(<= {TARGET_VS_MATMUL}), x{x['vs_gloo']:.3f} gloo+mm (< 1), "
                     f"x{x['vs_cuda_p2p']:.3f} cuda_p2p+mm (<= {TARGET_VS_P2P})")
    return lines


def markdown(results: list, info: dict) -> str:
    """The results as a Markdown table (medians; the best fused variant of each case)."""
    out = [f"Machine: {info.get('cpu', '?')}, {info.get('cpus', '?')} CPUs, torch "
           f"{info.get('torch', '?')}; load average {info.get('load_avg_at_start', ['?'])[0]:.1f} "
           f"at start, {info.get('load_avg_at_end', ['?'])[0]:.1f} at end; commit "
           f"{info.get('git_commit', '?')[:10]}.", "",
           "| op | W | M×H (F=4H) | dtype | matmul | Gloo+mm | cuda_p2p+mm | fused (best) | "
           "vs matmul | vs Gloo+mm | vs cuda_p2p+mm |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        med = r["median_ms"]
        name = best_fused(r)
        x = ratios(r)[name]
        op = "AG→MM" if r["op"] == "all_gather_matmul" else "MM→RS"
        out.append(f"| {op} | {r['W']} | {r['M']}×{r['H']} | {r['dtype']} | {med['matmul']:.2f} | "
                   f"{med['gloo+matmul']:.2f} | {med['cuda_p2p+matmul']:.2f} | "
                   f"{med[name]:.2f} ({name.removeprefix('fused').strip() or 'pipeline'}) | "
                   f"{x['vs_matmul']:.3f} | {x['vs_gloo']:.3f} | {x['vs_cuda_p2p']:.3f} |")
    return "\n".join(out) + "\n"


def plot(results: list, path: Path) -> None:
    """Every variant's median time relative to the matmul alone, per case; one panel per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = ["all_gather_matmul", "matmul_reduce_scatter"]
    fig, axes = plt.subplots(2, 1, figsize=(14, 9))
    for ax, op in zip(axes, ops):
        rows = [r for r in results if r["op"] == op]
        if not rows:
            ax.set_visible(False)
            continue
        names = [n for n in rows[0]["median_ms"] if n != "matmul"]
        labels = [f"W{r['W']} {r['M']}x{r['H']}\n{r['dtype']}" for r in rows]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ys = [r["median_ms"][name] / r["median_ms"]["matmul"] for r in rows]
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
            hatch = "" if name.startswith("fused") else "//"
            ax.bar(xs, ys, width, label=name, hatch=hatch)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(TARGET_VS_MATMUL, color="r", lw=0.8, ls="--", label="1.15 x matmul (target)")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(f"{op}: median time / matmul alone (lower is better)")
        ax.legend(fontsize=7, ncol=4)
    fig.suptitle("cuda_p2p fused pipelines on CPU ranks: " + machine().get("cpu", ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[4])
    ap.add_argument("--shapes", nargs="+", default=None,
                    help="MxH pairs (tokens x hidden), e.g. 2048x1024; F = 4H")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    ap.add_argument("--ops", nargs="+", default=["all_gather_matmul", "matmul_reduce_scatter"],
                    choices=["all_gather_matmul", "matmul_reduce_scatter"])
    ap.add_argument("--ring-steps", type=int, nargs="*", default=[1, 2],
                    help="ring variants, as multiples of W (S = x * W)")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one small shape, few iterations")
    ap.add_argument("--compare-threads", action="store_true",
                    help="also run 'auto' on a group whose host streams are threads")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--small-n", type=int, nargs="*", default=None,
                    help="fused vs unfused vs auto for M=K=1024 and these N (first dtype)")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    args = ap.parse_args(argv)
    if args.small_n:
        return small_n(args)

    shapes = QUICK_SHAPES if args.quick else DEFAULT_SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes]
    iters = 4 if args.quick else args.iters
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = args.out_dir / f"fused-{stamp}{('-' + args.tag) if args.tag else ''}"

    import torch.multiprocessing as mp

    info = machine()
    results = []
    for W in args.world_sizes:
        cases = [(op, M, H, d) for op in args.ops for (M, H) in shapes for d in args.dtypes
                 if M % W == 0 and (4 * H) % W == 0]
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out_path = tmp.name
        t0 = time.time()
        mp.spawn(_rank_main, args=(W, free_port(), cases, iters, args.warmup, args.ring_steps,
                                   out_path, args.compare_threads), nprocs=W, join=True)
        with open(out_path) as f:
            results += json.load(f)
        os.unlink(out_path)
        print(f"[W={W}: {len(cases)} cases in {time.time() - t0:.0f} s]", file=sys.stderr)

    print_table(results)
    lines = check_targets(results)
    print("\nTargets (best fused variant per case, medians):")
    print("\n".join("  " + ln for ln in lines))
    lines_min = check_targets(results, "min_ms")
    print("\nTargets (best fused variant per case, minima: the least disturbed iteration):")
    print("\n".join("  " + ln for ln in lines_min))
    info["load_avg_at_end"] = os.getloadavg()
    with open(base.with_suffix(".json"), "w") as f:
        json.dump({"machine": info, "results": results, "targets": lines,
                   "targets_min": lines_min}, f, indent=1)
    with open(base.with_suffix(".md"), "w") as f:
        f.write(markdown(results, info))
    try:
        plot(results, base.with_suffix(".png"))
    except ImportError as e:
        print(f"(no plot: {e})", file=sys.stderr)
    print(f"\nwrote {base.with_suffix('.json')}, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
