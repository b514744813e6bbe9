#!/usr/bin/env python3
"""Draws the timeline pictures of docs/pipelines.md from real traces.

Runs W CPU ranks on the cuda_p2p backend with pipeline tracing on
(``backend._set_pipeline_tracing(True)``), runs each fused pipeline a few times, and draws the
last run's spans: one lane per (rank, stream), the caller's thread below them.

    .venv/bin/python docs/make_timelines.py    # W=4, into docs/img/ (after scripts/setup.sh)
    .venv/bin/python docs/make_timelines.py --world-size 2 --out /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

PIPELINES = {
    "all_gather_matmul": "all-gather→matmul, pipeline (algorithm='pipeline')",
    "all_gather_matmul_pull_ahead": "all-gather→matmul, pull-ahead (algorithm='pull_ahead')",
    "matmul_reduce_scatter": "matmul→reduce-scatter, pipeline (algorithm='pipeline')",
    "ring_reduce_scatter": "matmul→reduce-scatter, ring in S=2W steps (algorithm='ring')",
}
COLORS = {"gemm": "#4c72b0", "pull": "#dd8452", "publish": "#dd8452", "fill": "#dd8452",
          "barrier": "#bbbbbb", "wait": "#bbbbbb", "add": "#55a868", "reduce": "#55a868",
          "finish": "#55a868"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, W, port, M, H, dtype, runs, out_path):
    import warnings

    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    import cuda_p2p

    torch.set_num_threads(1)
    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W)
    gloo = dist.new_group(backend="gloo")
    backend = cuda_p2p.get_cuda_p2p_backend()
    dt = getattr(torch, dtype)
    F = 4 * H
    g = torch.Generator().manual_seed(rank)
    A_shard, B1 = torch.randn(M // W, H, generator=g).to(dt), torch.randn(H, F // W).to(dt)
    A, B2 = torch.randn(M, F // W, generator=g).to(dt), torch.randn(F // W, H).to(dt)
    ops = {
        "all_gather_matmul": lambda: cuda_p2p.fused_all_gather_matmul(
            A_shard, [B1], 0, algorithm="pipeline"),
        "all_gather_matmul_pull_ahead": lambda: cuda_p2p.fused_all_gather_matmul(
            A_shard, [B1], 0, algorithm="pull_ahead"),
        "matmul_reduce_scatter": lambda: cuda_p2p.fused_matmul_reduce_scatter(
            A, B2, "sum", 0, algorithm="pipeline"),
        "ring_reduce_scatter": lambda: cuda_p2p.fused_matmul_reduce_scatter(
            A, B2, "sum", 0, algorithm="ring", ring_steps=2 * W),
    }
    backend._set_pipeline_tracing(True)
    traces = {}
    for name, fn in ops.items():
        for _ in range(runs):
            dist.barrier(group=gloo)
            fn()
        traces[name] = backend._last_pipeline_trace()
    backend._set_pipeline_tracing(False)
    everyone = [None] * W
    dist.all_gather_object(everyone, traces, group=gloo)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(everyone, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _color(what: str) -> str:
    for key, c in COLORS.items():
        if what.startswith(key):
            return c
    return "#8172b2"


def draw(name: str, per_rank: list, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    W = len(per_rank)
    lanes = []
    for r in range(W):
        for s, label in ((1, "stream 1"), (0, "stream 0"), (2, "caller")):
            lanes.append((r, s, f"rank {r} {label}"))
    fig, ax = plt.subplots(figsize=(13, 0.42 * len(lanes) + 1.4))
    t_end = max(e[3] for tr in per_rank for e in tr[name]) / 1e3
    for y, (r, s, _label) in enumerate(lanes):
        for stream, what, start, end in per_rank[r][name]:
            if stream != s:
                continue
            a, b = start / 1e3, max(end, start) / 1e3
            ax.barh(y, max(b - a, t_end / 800), left=a, height=0.7, color=_color(what),
                    edgecolor="white", linewidth=0.3)
            if b - a > t_end / 25:
                ax.text((a + b) / 2, y, what, ha="center", va="center", fontsize=6.5,
                        color="white" if _color(what) != "#bbbbbb" else "black")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([lb for _, _, lb in lanes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the op began (each rank's own clock)")
    ax.set_title(title, fontsize=10)
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in
               (("GEMM", COLORS["gemm"]), ("copy (pull / publish)", COLORS["pull"]),
                ("barrier / signal wait", COLORS["barrier"]), ("add / reduce", COLORS["add"]))]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=HERE / "img")
    args = ap.parse_args(argv)

    import torch.multiprocessing as mp

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out_path = tmp.name
    mp.spawn(_rank, args=(args.world_size, _free_port(), args.tokens, args.hidden, args.dtype,
                          args.runs, out_path), nprocs=args.world_size, join=True)
    with open(out_path) as f:
        per_rank = json.load(f)
    os.unlink(out_path)
    shape = (f"W={args.world_size}, M={args.tokens}, H={args.hidden}, F={4 * args.hidden}, "
             f"{args.dtype}, CPU ranks")
    for name, title in PIPELINES.items():
        path = args.out / f"timeline_{name}.png"
        draw(name, per_rank, path, f"{title}: {shape}")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
