#!/usr/bin/env python3
"""Stream stress of the CUDA path (scripts/gpu_check.sh, step "stress"): thousands of ops at random
sizes, every result checked against plain torch.

Each run starts W ranks sharing the one GPU. Every rank draws the same schedule from --seed: op
after op, a kind, a group, a stream, a size, a dtype, a reduce op, sync or async:
  kinds     all_reduce (SUM/MAX/MIN), all_gather_into_tensor, reduce_scatter_tensor, broadcast
            (opt-in workspace collectives: Options.cuda_workspace_collectives=True),
            fused_all_gather_matmul, fused_matmul_reduce_scatter (cuda_p2p's fused ops), and
            "other": an all_reduce on a plain NCCL group where NCCL can run (1 rank per GPU: the
            1-rank run), else on a cuda_p2p group whose collectives go to its wrapped backend
            (ranks sharing a GPU: NCCL refuses them, so the wrapped ops interleave instead);
  groups    two cuda_p2p groups in one process (1 MiB and 64 KiB buffers: the second one runs
            large ops in rounds);
  streams   the caller's current stream or one of two side streams (torch.cuda.Stream());
  checks    results are kept, unsynchronized, until a random check point (or 32 pending), where
            the GPU is synchronized and each is compared with the same math in plain torch on
            the CPU (small integers: exact in every dtype and summation order).
At the end each rank prints its op counts and its groups' counters (which paths ran); a group
whose workspace ran nothing fails.

    python tests/python/gpu_scripts/gpu_stress.py [--world-sizes 1 2 4] [--ops 2000] [--seed 0]
        [--max-elems 131072] [--timeout 300] [--device cpu]

--device cpu runs the same schedule with CPU tensors on the host workspace (no streams; "other"
goes to Gloo): tests/python/gpu/test_gpu_readiness.py runs it in CI. Exit status: 0 when every rank
of every run passed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import sys
from collections import Counter

import torch

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import _gpu_readiness as R  # noqa: E402
from _reference import reduce_over_ranks  # noqa: E402

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "fused_ag", "fused_rs",
         "other")
DTYPES = (torch.float32, torch.bfloat16)
REDUCE_OPS = ("SUM", "MAX", "MIN")
STREAMS = ("caller", "side0", "side1")


def schedule(seed: int, ops: int, max_elems: int) -> list[dict]:
    """The ops every rank runs, in order: the same list on every rank (one seed)."""
    rng = random.Random(seed)
    out = []
    for i in range(ops):
        # Sizes log-uniform in [1, max_elems], a few empty ones.
        n = 0 if rng.random() < 0.02 else int(math.exp(rng.uniform(0, math.log(max_elems))))
        out.append({
            "i": i,
            "kind": rng.choice(KINDS),
            "group": rng.randrange(2),
            "stream": rng.choice(STREAMS),
            "async": rng.random() < 0.3,
            "n": n,
            "dtype": rng.choice(DTYPES),
            "op": rng.choice(REDUCE_OPS),
            "m": rng.randint(1, 24),
            "k": rng.randint(1, 48),
            "cols": rng.randint(1, 40),
            "algorithm": rng.choice(("pipeline", "pipeline", "auto")),
            "check": rng.random() < 0.12,
        })
    return out


def _values(i: int, r: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    """Rank r's input of op i: small integers in [-2, 2], the same wherever it is computed."""
    n = math.prod(shape)
    x = (torch.arange(n, dtype=torch.int64) * (2 * r + 3) + 7 * i + 13 * salt) % 5 - 2
    return x.to(dtype).reshape(shape)


class _Run:
    def __init__(self, rank: int, W: int, cuda: bool):
        import torch.distributed as dist

        self.rank, self.W, self.cuda = rank, W, cuda
        self.dev = R.device_of(cuda)
        self.groups = [R.cuda_p2p_group(cuda, buffer_size=1 << 20),
                       R.cuda_p2p_group(cuda, buffer_size=1 << 16)]
        # "other": real NCCL where it can run (one rank per GPU), else the wrapped backend.
        if cuda and W == 1 and dist.is_nccl_available():
            self.other = dist.new_group(backend="nccl")
            self.other_what = "NCCL"
        else:
            self.other = R.cuda_p2p_group(cuda, opt_in=False, workspace_collectives=False)
            self.other_what = ("the wrapped backend (ranks share a GPU: NCCL refuses them)"
                               if cuda else "Gloo (host run)")
        self.streams = {"caller": None}
        if cuda:
            self.streams.update(side0=torch.cuda.Stream(), side1=torch.cuda.Stream())
        self.pending: list = []
        self.counts: Counter = Counter()

    def stream_ctx(self, name: str):
        s = self.streams.get(name)
        return torch.cuda.stream(s) if s is not None else contextlib.nullcontext()

    def run(self, op: dict) -> None:
        import torch.distributed as dist

        import cuda_p2p

        i, W, rank, dev, n, dt = op["i"], self.W, self.rank, self.dev, op["n"], op["dtype"]
        g = self.groups[op["group"]]
        kind = op["kind"]
        work = None
        with self.stream_ctx(op["stream"]):
            if kind in ("all_reduce", "other"):
                x = _values(i, rank, (n,), dt).to(dev)
                red = getattr(dist.ReduceOp, op["op"])
                grp = self.other if kind == "other" else g
                work = dist.all_reduce(x, op=red, group=grp, async_op=op["async"])
                want = reduce_over_ranks(op["op"], [_values(i, r, (n,), dt) for r in range(W)])
                got = x
            elif kind == "all_gather":
                x = _values(i, rank, (n,), dt).to(dev)
                got = torch.empty(n * W, dtype=dt, device=dev)
                work = dist.all_gather_into_tensor(got, x, group=g, async_op=op["async"])
                want = torch.cat([_values(i, r, (n,), dt) for r in range(W)])
            elif kind == "reduce_scatter":
                x = _values(i, rank, (n * W,), dt).to(dev)
                got = torch.empty(n, dtype=dt, device=dev)
                work = dist.reduce_scatter_tensor(got, x, group=g, async_op=op["async"])
                full = reduce_over_ranks("SUM", [_values(i, r, (n * W,), dt) for r in range(W)])
                want = full[rank * n:(rank + 1) * n]
            elif kind == "broadcast":
                src = i % W
                got = _values(i, rank, (n,), dt).to(dev)
                work = dist.broadcast(got, src=src, group=g, async_op=op["async"])
                want = _values(i, src, (n,), dt)
            elif kind == "fused_ag":
                m, k, c = op["m"], op["k"], op["cols"]
                a = _values(i, rank, (m, k), torch.float32).to(dev)
                b = _values(i, W, (k, c), torch.float32, salt=1).to(dev)
                _, outs = cuda_p2p.fused_all_gather_matmul(a, [b], 0, group=g,
                                                           algorithm=op["algorithm"])
                got = outs[0]
                full = torch.cat([_values(i, r, (m, k), torch.float32) for r in range(W)])
                want = full @ _values(i, W, (k, c), torch.float32, salt=1)
            else:  # fused_rs
                m, k, c = op["m"], op["k"], op["cols"]
                a = _values(i, rank, (m * W, k), torch.float32).to(dev)
                b = _values(i, rank, (k, c), torch.float32, salt=2).to(dev)
                got = cuda_p2p.fused_matmul_reduce_scatter(a, b, "sum", 0, group=g,
                                                           algorithm=op["algorithm"])
                full = sum(_values(i, r, (m * W, k), torch.float32)
                           @ _values(i, r, (k, c), torch.float32, salt=2) for r in range(W))
                want = full[rank * m:(rank + 1) * m]
        if work is not None and op["i"] % 2 == 0:
            work.wait()  # the rest wait at the check point
        self.pending.append((op, got, want, work))
        self.counts[kind] += 1
        if op["check"] or len(self.pending) >= 32:
            self.check()

    def check(self) -> None:
        bad = []
        for op, got, want, work in self.pending:
            if work is not None:
                work.wait()
        R.synchronize(self.cuda)
        for op, got, want, work in self.pending:
            g = got.cpu()
            if g.shape != want.shape or not torch.equal(g.double(), want.double()):
                where = "shape" if g.shape != want.shape else \
                    (g.double() != want.double()).nonzero()[:3].flatten().tolist()
                bad.append(f"op {op['i']} {op['kind']} group {op['group']} stream "
                           f"{op['stream']} n={op['n']} {op['dtype']} {op['op']} "
                           f"async={op['async']}: differs at {where}")
        self.pending.clear()
        if bad:
            raise AssertionError(f"rank {self.rank}: {len(bad)} results differ from plain "
                                 "torch:\n  " + "\n  ".join(bad[:10]))


def _stress_rank(rank: int, W: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    cuda = args.device == "cuda"
    R.init(rank, W, port, cuda)
    run = _Run(rank, W, cuda)
    R.say(rank, f"{args.ops} ops, seed {args.seed}, W={W}; 'other' ops on {run.other_what}")
    for op in schedule(args.seed, args.ops, args.max_elems):
        run.run(op)
    run.check()
    R.say(rank, f"checked {sum(run.counts.values())} ops: {dict(sorted(run.counts.items()))}")
    for j, g in enumerate(run.groups):
        c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
        R.say(rank, f"group {j} counters {dict(sorted(c.items()))}")
        ran = {k: v for k, v in c.items() if not k.endswith(".wrapped")}
        if not ran:
            raise AssertionError(f"group {j}'s workspace ran nothing: {c}")
    for g in run.groups:
        dist.destroy_process_group(g)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--ops", type=int, default=2000, help="ops per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-elems", type=int, default=1 << 17,
                    help="the largest collective, in elements per rank")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_stress.py: no CUDA GPU here", file=sys.stderr)
        return 2
    failed = []
    for W in args.world_sizes:
        print(f"== stress, {W} rank(s), {args.ops} ops", flush=True)
        codes = R.launch(_stress_rank, W, args, args.timeout)
        if any(c != 0 for c in codes):
            failed.append(f"{W} rank(s): exit codes {codes}")
    return R.main_exit(failed, "gpu_stress.py")


if __name__ == "__main__":
    sys.exit(main())
