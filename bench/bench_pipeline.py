#!/usr/bin/env python3
"""A pipeline-parallel training step (torch.distributed.pipelining): cuda_p2p vs Gloo.

Launches W local CPU ranks (torch.multiprocessing, spawn) on the cuda_p2p backend. Rank r holds
stage r of the same model: --layers-per-stage Linear(D, D) + Tanh blocks. Each variant times one
training step - schedule.step over --microbatches microbatches of --tokens rows, then SGD - of

    gloo        the schedule's send/recv on a Gloo group over the same ranks (the baseline)
    cuda_p2p    the same schedule on the cuda_p2p group: its send/recv go through the workspace's
                mailboxes (docs/send_recv.md; counted send.direct)

for each --schedules (gpipe: ScheduleGPipe, 1f1b: Schedule1F1B). Variants run interleaved (each
iteration runs each once, in rotating order, after a barrier on a group neither uses); an
iteration's time is the slowest rank's; a variant's time is the median over iterations; the ratio
is Gloo's over ours in the same run. Both variants must end with bitwise equal parameters (the
same steps on the same data; checked), and cuda_p2p's must have run on the mailboxes.

    .venv/bin/python bench/bench_pipeline.py                      # W=2 and 4, GPipe and 1F1B
    .venv/bin/python bench/bench_pipeline.py --world-sizes 2 --dim 1024 --tokens 64
    bash scripts/bench.sh --pipeline                              # the same, via bench.sh
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

VARIANTS = ("gloo", "cuda_p2p")
SCHEDULES = ("gpipe", "1f1b")


def _rank_main(rank, W, port, args, queue):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import cuda_p2p

    try:
        gloo, sync = init_rank(rank, W, port, args.timeout)
        D = args.dim
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}

        def build(variant, schedule):
            torch.manual_seed(100 + rank)
            blocks = []
            for _ in range(args.layers_per_stage):
                blocks += [nn.Linear(D, D), nn.Tanh()]
            model = nn.Sequential(*blocks)
            group = gloo if variant == "gloo" else dist.group.WORLD
            stage = PipelineStage(model, rank, W, torch.device("cpu"), group=group)
            sched = cls[schedule](stage, n_microbatches=args.microbatches,
                                  loss_fn=lambda out, y: ((out - y) ** 2).mean())
            return model, sched, torch.optim.SGD(model.parameters(), lr=1e-3)

        g = torch.Generator().manual_seed(7)
        x = torch.randn(args.tokens, D, generator=g)
        y = torch.randn(args.tokens, D, generator=g)

        def step(model, sched, opt):
            opt.zero_grad()
            if rank == 0:
                sched.step(x)
            elif rank == W - 1:
                sched.step(target=y, losses=[])
            else:
                sched.step()
            opt.step()

        backend = cuda_p2p.get_cuda_p2p_backend()
        results = {}
        for schedule in args.schedules:
            runs = {v: build(v, schedule) for v in VARIANTS}
            backend.reset_counters()
            for _ in range(args.warmup):
                for v in VARIANTS:
                    step(*runs[v])
            counters = dict(backend.get_counters())
            times = {v: [] for v in VARIANTS}
            for it in range(args.iters):
                order = VARIANTS[it % 2:] + VARIANTS[:it % 2]
                for v in order:
                    dist.barrier(group=sync)
                    t0 = time.perf_counter()
                    step(*runs[v])
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=sync)
                    times[v].append(float(dt))
            equal = all(torch.equal(p, q) for p, q in zip(runs["gloo"][0].parameters(),
                                                          runs["cuda_p2p"][0].parameters()))
            flag = torch.tensor([0 if equal else 1])
            dist.all_reduce(flag, group=sync)
            results[schedule] = {"times": times, "warmup_counters": counters,
                                 "equal_parameters": int(flag) == 0}
        if rank == 0:
            queue.put(results)
        dist.barrier(group=sync)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which fails)
        queue.put({"error": f"rank {rank}: {type(e).__name__}: {e}"})
        raise


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(w, s) for w in sorted(report["results"], key=int) for s in report["schedules"]]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.4
    for i, v in enumerate(VARIANTS):
        ys = [report["results"][w][s][v]["median_s"] * 1e3 for w, s in keys]
        ax.bar([j + i * width for j in range(len(keys))], ys, width, label=v)
    ax.set_xticks([j + width / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"{w} ranks\n{s}" for w, s in keys])
    ax.set_ylabel("step time, median (ms)")
    ax.set_title(f"pipeline step: {report['layers_per_stage']} x Linear({report['dim']}) per "
                 f"stage, {report['microbatches']} microbatches of "
                 f"{report['tokens'] // report['microbatches']} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    ap.add_argument("--layers-per-stage", type=int, default=2,
                    help="Linear(D, D) + Tanh blocks per stage")
    ap.add_argument("--dim", type=int, default=512, help="model dim D")
    ap.add_argument("--tokens", type=int, default=64, help="rows of the whole batch")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="microbatches per step (1F1B needs at least the world size)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "pipeline.json"))
    ap.add_argument("--plot", default=str(Path(__file__).parent / "results" / "pipeline.png"))
    args = ap.parse_args()
    if args.layers_per_stage < 1 or args.dim < 1 or args.iters < 1:
        ap.error("--layers-per-stage, --dim and --iters must be >= 1")
    if args.tokens % args.microbatches:
        ap.error(f"--tokens ({args.tokens}) must be a multiple of --microbatches "
                 f"({args.microbatches})")
    if "1f1b" in args.schedules and args.microbatches < max(args.world_sizes):
        ap.error(f"1F1B needs --microbatches >= the world size ({max(args.world_sizes)}), got "
                 f"{args.microbatches}")

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "torch": torch.__version__, "layers_per_stage": args.layers_per_stage,
              "dim": args.dim, "tokens": args.tokens, "microbatches": args.microbatches,
              "iters": args.iters, "schedules": list(args.schedules), "cpus": os.cpu_count(),
              "loadavg_at_start": os.getloadavg(), "results": {}}
    mb_kib = args.tokens // args.microbatches * args.dim * 4 / 1024
    print(f"pipeline step, {args.layers_per_stage} x Linear({args.dim}) per stage, "
          f"{args.microbatches} microbatches of {args.tokens // args.microbatches} rows "
          f"({mb_kib:.0f} KiB activations each way); median (min) over {args.iters} "
          "iterations, slowest rank")
    print(f"{'W':>3} {'schedule':>8} {'gloo ms':>9} {'cuda_p2p ms':>12} {'speedup':>8}  "
          "counters in warm-up")
    failed = []
    for W in args.world_sizes:
        res = spawn_ranks(_rank_main, W, args, args.timeout)
        if "error" in res:
            raise RuntimeError(res["error"])
        report["results"][str(W)] = {}
        for schedule in args.schedules:
            r = res[schedule]
            rows = {v: {"median_s": statistics.median(r["times"][v]), "min_s": min(r["times"][v])}
                    for v in VARIANTS}
            speedup = rows["gloo"]["median_s"] / rows["cuda_p2p"]["median_s"]
            c = r["warmup_counters"]
            shown = {k: v for k, v in c.items() if k.startswith(("send.", "recv."))}
            print(f"{W:>3} {schedule:>8} {rows['gloo']['median_s'] * 1e3:>9.2f} "
                  f"{rows['cuda_p2p']['median_s'] * 1e3:>12.2f} {speedup:>7.2f}x  {shown}")
            if not c.get("send.direct") or any(k.endswith(".wrapped") for k in shown):
                failed.append(f"W={W} {schedule}: cuda_p2p's send/recv did not all run on the "
                              f"mailboxes: {shown}")
            if not r["equal_parameters"]:
                failed.append(f"W={W} {schedule}: the parameters differ from Gloo's")
            report["results"][str(W)][schedule] = dict(rows, speedup=speedup,
                                                       warmup_counters=c,
                                                       equal_parameters=r["equal_parameters"])
    finish_report(report, args, plot, failed, "bench_pipeline")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
