#!/usr/bin/env python3
"""A tensor-parallel training step (an MLP, or a transformer block): eager vs compiled vs
compiled + the async-TP pass.

Launches W local CPU ranks (torch.multiprocessing, spawn) on the cuda_p2p backend. Each builds
the same MLP (LayerNorm with SequenceParallel, Linear D->F ColwiseParallel, ReLU, Linear F->D
RowwiseParallel, sequence dim sharded) on a mesh over the cuda_p2p group and times one SGD step
(forward, backward, optimizer) of

    eager              DTensor eager: all-gather / reduce-scatter on the cuda_p2p group + matmuls
    compiled           torch.compile (inductor) without our pass: the same collectives, compiled
    compiled+fused     torch.compile with cuda_p2p.enable_async_tp(): the all-gathers and
                       reduce-scatters fused with their matmuls, forward and backward

``--model block``: a transformer block (RMSNorm, attention with Q/K/V/O, SwiGLU; the feed-forward
under activation checkpointing; tests/python/training/_async_tp_block.py) with torch's TP styles on
[batch, sequence, D] activations, the sequence sharded between the sub-blocks; ``--dtype bfloat16``
runs it in bf16. ``--model fp8-mlp``: the sequence-parallel MLP in fp8 (the Float8-style linears of
tests/python/training/_fp8_pass_checks.py: float8 casts with ``--fp8-scaling`` tensorwise or rowwise
scales, fp8 all-gathers, ``torch._scaled_mm`` with bfloat16 outputs, forward and backward), which
the CPU runs; the pass fuses it into ``fused_all_gather_scaled_matmul`` /
``fused_scaled_matmul_reduce_scatter``. For the compiled+fused variant the pass's report gives
the fused fraction: the all-gathers and reduce-scatters of the compiled graphs that the pass
fused, over all of them.

Variants run interleaved (each iteration runs each once, in rotating order, after a Gloo barrier)
so that load changes hit all alike; an iteration's time is the slowest rank's; a variant's time is
the median over iterations (the minimum is reported too). Compilation happens in warm-up steps
and is not timed. Ratios are against eager in the same run.

    .venv/bin/python bench/bench_training.py                      # W=2 and 4, default shape
    .venv/bin/python bench/bench_training.py --world-sizes 2 --iters 10 --tokens 512
    .venv/bin/python bench/bench_training.py --variants compiled+fused   # and eager, not compiled
    .venv/bin/python bench/bench_training.py --model block --dim 256 --tokens 256 --dtype bfloat16
    .venv/bin/python bench/bench_training.py --model fp8-mlp --fp8-scaling rowwise
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import host_workspace, spawn_ranks

VARIANTS = ("eager", "compiled", "compiled+fused")


def _rank_main(rank, W, port, args, queue):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    host_workspace()
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    import cuda_p2p

    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W)
    gloo = dist.new_group(backend="gloo")
    D, F, S = args.dim, 4 * args.dim, args.tokens // W

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(D)
            self.w1 = torch.nn.Linear(D, F)
            self.w2 = torch.nn.Linear(F, D)

        def forward(self, x):
            return self.w2(torch.relu(self.w1(self.norm(x))))

    dtype = getattr(torch, args.dtype)

    def build():
        if args.model == "fp8-mlp":
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
            import _fp8_pass_checks as fpc

            g = torch.Generator().manual_seed(0)
            w1 = torch.randn(F // W, D, generator=g) / D ** 0.5
            w2 = torch.randn(D, F // W, generator=g) / F ** 0.5
            model = fpc.Fp8Mlp(w1, w2, args.fp8_scaling, dist.group.WORLD)
            return model, torch.optim.SGD(model.parameters(), lr=1e-3)
        if args.model == "block":
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
            import _async_tp_block as blk

            model = blk.make_tp_model(dist.group.WORLD, "dtensor", dim=D, heads=args.heads,
                                      hidden=F).to(dtype)
            return model, torch.optim.SGD(model.parameters(), lr=1e-3)
        torch.manual_seed(0)
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        model = parallelize_module(MLP(), mesh, {
            "norm": SequenceParallel(sequence_dim=0),
            "w1": ColwiseParallel(input_layouts=Shard(0)),
            "w2": RowwiseParallel(output_layouts=Shard(0)),
        })
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)

    backend = cuda_p2p.get_cuda_p2p_backend()
    steps = {}
    fused_counts = {}
    fractions = {}
    shape = (args.batch, S, D) if args.model == "block" else (S, D)
    for name in args.variants:
        model, opt = build()
        if name == "compiled+fused":
            cuda_p2p.enable_async_tp()
        fn = model
        if name != "eager":
            # A top-level frame of its own per variant: dynamo caches compiled code per code
            # object, and would otherwise hand the second variant the first one's graph.
            ns = {}
            exec(compile("def step(x):\n    return model(x)\n", f"<step {name}>", "exec"),
                 {"model": model}, ns)
            fn = torch.compile(ns["step"], fullgraph=True)
        steps[name] = (fn, opt)
        x = torch.randn(*shape, dtype=dtype, requires_grad=args.model == "fp8-mlp")
        before = dict(backend.get_counters())
        for _ in range(args.warmup):  # compiles here
            opt.zero_grad()
            fn(x).float().square().mean().backward()
            opt.step()
        after = dict(backend.get_counters())
        fused_counts[name] = sum(v - before.get(k, 0) for k, v in after.items()
                                 if k.startswith("fused_"))
        if name == "compiled+fused":
            reports = cuda_p2p.async_tp_report()
            fused = sum(len(r.fused) for r in reports)
            left = sum(len(r.left) for r in reports)
            fractions[name] = [fused, fused + left]
        cuda_p2p.disable_async_tp()

    # fp8-mlp: the input needs a gradient, like a layer inside a network (its backward's
    # reduce-scatter would otherwise be dropped by the compiled step only).
    x = torch.randn(*shape, dtype=dtype, requires_grad=args.model == "fp8-mlp")
    times = {name: [] for name in args.variants}
    n = len(args.variants)
    for it in range(args.iters):
        order = args.variants[it % n:] + args.variants[:it % n]
        for name in order:
            fn, opt = steps[name]
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            opt.zero_grad()
            fn(x).float().square().mean().backward()
            opt.step()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            times[name].append(float(dt))
    if rank == 0:
        queue.put({"times": times, "fused_ops_in_warmup": fused_counts,
                   "fused_fraction": fractions})
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run(W, args):
    result = spawn_ranks(_rank_main, W, args, args.timeout)
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--model", choices=("mlp", "block", "fp8-mlp"), default="mlp")
    ap.add_argument("--fp8-scaling", choices=("tensorwise", "rowwise"), default="tensorwise",
                    help="the float8 scales of --model fp8-mlp")
    ap.add_argument("--dim", type=int, default=256, help="model dim D (hidden F = 4D)")
    ap.add_argument("--heads", type=int, default=8, help="attention heads (--model block)")
    ap.add_argument("--batch", type=int, default=1, help="batch size (--model block)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--tokens", type=int, default=512, help="sequence length (all ranks)")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                    help="which variants to run (eager always runs: the ratios are against it)")
    args = ap.parse_args()
    args.variants = tuple(v for v in VARIANTS if v in args.variants or v == "eager")

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "torch": torch.__version__, "model": args.model, "dtype": args.dtype,
              "dim": args.dim, "tokens": args.tokens, "batch": args.batch,
              "iters": args.iters, "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
              "results": {}}
    if args.model == "fp8-mlp":
        args.dtype = "float32"  # parameters and input; the GEMMs are fp8, their outputs bf16
        report["dtype"] = f"float8 ({args.fp8_scaling}), float32 parameters"
    print(f"TP {args.model} step ({report['dtype']}), D={args.dim} F={4 * args.dim} "
          f"tokens={args.tokens}, "
          f"median (min) over {args.iters} iterations, slowest rank")
    print(f"{'W':>3} {'variant':>16} {'median ms':>10} {'min ms':>8} {'vs eager':>9} "
          f"{'fused ops/warm-up':>18} {'fused/all colls':>16}")
    for W in args.world_sizes:
        res = run(W, args)
        eager = statistics.median(res["times"]["eager"])
        rows = {}
        for name in args.variants:
            t = res["times"][name]
            med = statistics.median(t)
            frac = res["fused_fraction"].get(name)
            rows[name] = {"median_s": med, "min_s": min(t), "ratio_vs_eager": med / eager,
                          "fused_ops_in_warmup": res["fused_ops_in_warmup"][name],
                          "fused_of_collectives": frac}
            shown = f"{frac[0]}/{frac[1]}" if frac else "-"
            print(f"{W:>3} {name:>16} {med * 1e3:>10.2f} {min(t) * 1e3:>8.2f} "
                  f"{med / eager:>9.2f} {res['fused_ops_in_warmup'][name]:>18} {shown:>16}")
        report["results"][str(W)] = rows
    report["loadavg_at_end"] = os.getloadavg()
    print(f"load average (1 min) at start {report['loadavg_at_start'][0]:.1f}, "
          f"at end {report['loadavg_at_end'][0]:.1f} on {os.cpu_count()} CPUs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model == "fp8-mlp":
        path = out / f"training_fp8-mlp_{args.fp8_scaling}.json"
    else:
        path = out / ("training.json" if args.model == "mlp" and args.dtype == "float32"
                      else f"training_{args.model}_{args.dtype}.json")
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
