#!/usr/bin/env python3
"""An FSDP2 training step: cuda_p2p with staged buffers vs symmetric buffers vs Gloo.

Launches W local CPU ranks (torch.multiprocessing, spawn) on the cuda_p2p backend. Each builds
the same MLP of --layers Linear(D, D) + ReLU blocks, every Linear and the root fully_shard'ed on a
1-d mesh, and times one SGD step (forward, backward, optimizer) of

    gloo        FSDP2 on a Gloo group over the same ranks (the baseline)
    staged      FSDP2 on the cuda_p2p group: its all-gathers and reduce-scatters stage their
                inputs into the workspace
    symmetric   the same with model.set_allocate_memory_from_process_group_for_comm(True): FSDP2
                takes its comm buffers from the backend's allocate_tensor, in the group's
                symmetric heap, and the collectives read them zero-copy (the *.zero_copy counters;
                NOTE [Process-group allocation for FSDP2] in backend/symmetric_memory.cpp)

Variants run interleaved (each iteration runs each once, in rotating order, after a barrier on a
group none of them uses), so that load changes hit all alike; an iteration's time is the slowest
rank's; a variant's time is the median over iterations. Ratios are against Gloo and staged in the
same run. The staged and symmetric models must end with equal parameters (checked: the same
reductions in the same order), and the symmetric one must have run zero-copy.

    .venv/bin/python bench/bench_fsdp.py                              # W=2 and 4
    .venv/bin/python bench/bench_fsdp.py --world-sizes 2 --layers 4 --dim 512 --iters 10
    bash scripts/bench.sh --fsdp                                      # the same, via bench.sh
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import finish_report, init_rank, spawn_ranks

VARIANTS = ("gloo", "staged", "symmetric")


def _rank_main(rank, W, port, args, queue):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    import cuda_p2p

    try:
        gloo, sync = init_rank(rank, W, port, args.timeout)
        D, B = args.dim, args.tokens // W

        def build(name):
            torch.manual_seed(0)
            blocks = []
            for _ in range(args.layers):
                blocks += [nn.Linear(D, D), nn.ReLU()]
            model = nn.Sequential(*blocks)
            group = gloo if name == "gloo" else dist.group.WORLD
            mesh = DeviceMesh.from_group(group, "cpu")
            for m in model:
                if isinstance(m, nn.Linear):
                    fully_shard(m, mesh=mesh)
            fully_shard(model, mesh=mesh)
            # Per FSDP module: each Linear has its own parameter group (the root has none).
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_allocate_memory_from_process_group_for_comm(name == "symmetric")
            return model, torch.optim.SGD(model.parameters(), lr=1e-3)

        backend = cuda_p2p.get_cuda_p2p_backend()
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(B, D, generator=g)
        steps, counts = {}, {}
        for name in args.variants:
            model, opt = build(name)
            before = dict(backend.get_counters())
            for _ in range(args.warmup):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            after = dict(backend.get_counters())
            counts[name] = {k: v - before.get(k, 0) for k, v in after.items()
                            if v != before.get(k, 0)}
            steps[name] = (model, opt)

        times = {name: [] for name in args.variants}
        n = len(args.variants)
        for it in range(args.iters):
            order = args.variants[it % n:] + args.variants[:it % n]
            for name in order:
                model, opt = steps[name]
                dist.barrier(group=sync)
                t0 = time.perf_counter()
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=sync)
                times[name].append(float(dt))
        # Staged and symmetric ran the same steps with the same reductions: equal parameters.
        equal = None
        if "staged" in steps and "symmetric" in steps:
            equal = all(torch.equal(p.full_tensor(), q.full_tensor()) for p, q in
                        zip(steps["staged"][0].parameters(), steps["symmetric"][0].parameters()))
        if rank == 0:
            queue.put({"times": times, "warmup_counters": counts, "staged_equals_symmetric": equal})
        dist.barrier(group=sync)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which fails)
        queue.put({"error": f"rank {rank}: {type(e).__name__}: {e}"})
        raise


def run(W, args):
    result = spawn_ranks(_rank_main, W, args, args.timeout)
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(report["results"], key=int)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(report["variants"])
    for i, name in enumerate(report["variants"]):
        ys = [report["results"][w][name]["median_s"] * 1e3 for w in sizes]
        ax.bar([j + i * width for j in range(len(sizes))], ys, width, label=name)
    ax.set_xticks([j + width * (len(report["variants"]) - 1) / 2 for j in range(len(sizes))])
    ax.set_xticklabels([f"{w} ranks" for w in sizes])
    ax.set_ylabel("step time, median (ms)")
    ax.set_title(f"FSDP2 step: {report['layers']} x Linear({report['dim']}), "
                 f"{report['tokens']} tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--layers", type=int, default=4, help="Linear(D, D) + ReLU blocks")
    ap.add_argument("--dim", type=int, default=1024, help="model dim D")
    ap.add_argument("--tokens", type=int, default=256, help="batch rows (all ranks together)")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                    help="which variants to run (gloo always runs: the ratios are against it)")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "fsdp.json"))
    ap.add_argument("--plot", default=str(Path(__file__).parent / "results" / "fsdp.png"))
    args = ap.parse_args()
    if args.tokens < max(args.world_sizes) or args.layers < 1 or args.dim < 1:
        ap.error("--tokens must be >= every world size, --layers and --dim >= 1")
    args.variants = tuple(v for v in VARIANTS if v in args.variants or v == "gloo")

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "torch": torch.__version__, "layers": args.layers, "dim": args.dim,
              "tokens": args.tokens, "iters": args.iters, "variants": list(args.variants),
              "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(), "results": {}}
    mib = args.dim * (args.dim + 1) * 4 / (1 << 20)
    print(f"FSDP2 step, {args.layers} x Linear({args.dim}, {args.dim}) ({mib:.1f} MiB of fp32 "
          f"parameters each), {args.tokens} tokens; median (min) over {args.iters} iterations, "
          "slowest rank")
    print(f"{'W':>3} {'variant':>10} {'median ms':>10} {'min ms':>8} {'vs gloo':>8} "
          f"{'vs staged':>9}  counters in warm-up")
    failed = []
    for W in args.world_sizes:
        res = run(W, args)
        gloo = statistics.median(res["times"]["gloo"])
        staged = statistics.median(res["times"]["staged"]) if "staged" in res["times"] else None
        rows = {}
        for name in args.variants:
            t = res["times"][name]
            med = statistics.median(t)
            c = res["warmup_counters"].get(name, {})
            shown = {k: v for k, v in c.items()
                     if k.endswith((".zero_copy", ".wrapped")) or k.startswith("allocate_tensor")}
            rows[name] = {"median_s": med, "min_s": min(t), "ratio_vs_gloo": med / gloo,
                          "ratio_vs_staged": med / staged if staged else None,
                          "warmup_counters": c}
            vs_staged = f"{med / staged:>9.2f}" if staged else f"{'':>9}"
            print(f"{W:>3} {name:>10} {med * 1e3:>10.2f} {min(t) * 1e3:>8.2f} "
                  f"{med / gloo:>8.2f} {vs_staged}  {shown if name != 'gloo' else ''}")
        if "symmetric" in rows:
            c = rows["symmetric"]["warmup_counters"]
            if not (c.get("all_gather.zero_copy") and c.get("reduce_scatter.zero_copy")):
                failed.append(f"W={W}: the symmetric variant did not run zero-copy: {c}")
        if res["staged_equals_symmetric"] is False:
            failed.append(f"W={W}: staged and symmetric parameters differ")
        rows["staged_equals_symmetric"] = res["staged_equals_symmetric"]
        report["results"][str(W)] = rows
    finish_report(report, args, plot, failed, "bench_fsdp")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
