#!/usr/bin/env python3
"""Teardown under load on the CUDA path (scripts/gpu_check.sh, step "teardown").

W ranks share the one GPU; the scenarios run one after the other in the same processes (one
start-up), each on a group of its own:
  queued       every rank enqueues ops without waiting for them (async collectives on side
               streams, sync collectives and fused ops on the caller's stream) and destroys the
               group at once: destroy_process_group returns within the group's timeout plus
               --margin, torch.cuda.synchronize() returns, the queued results match plain torch
               (a teardown drains what was enqueued), and a new group passes a checked
               all_reduce;
  staggered    the same, but rank r waits r * --stagger s before destroying, and again before it
               exits: the early ranks' destroy must neither hang nor break the late ranks' ops;
  early_exit   once every rank's ops have run, the last rank exits without
               destroy_process_group; the others destroy within the timeout plus the margin.
Every call that may hang runs under a deadline (a call that does not return is reported).

    python tests/python/gpu_scripts/gpu_teardown.py [--world-size 2]
        [--scenarios queued staggered early_exit] [--ops 40] [--op-timeout 10] [--margin 15]
        [--stagger 1.0] [--timeout 180] [--device cpu]

--device cpu runs the same scenarios on the host workspace (tests/python/gpu/test_gpu_readiness.py
runs it in CI). Exit status: 0 when every rank of every scenario passed, 1 otherwise, 2 without a
GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _d in (_TESTS, os.path.join(_TESTS, "gpu"), os.path.join(_TESTS, "gpu_scripts")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import _gpu_readiness as R  # noqa: E402

SCENARIOS = ("queued", "staggered", "early_exit")


def _enqueue(rank: int, W: int, g, cuda: bool, ops: int) -> list:
    """Enqueues `ops` ops on `g` without waiting; [(what, result, expected, work)]."""
    import torch.distributed as dist

    import cuda_p2p

    dev = R.device_of(cuda)
    side = [torch.cuda.Stream(device=dev) for _ in range(2)] if cuda else []
    out = []
    for i in range(ops):
        n = 1 + (i * 997) % 20000
        kind = i % 4
        stream = side[i % 2] if cuda and i % 3 == 0 else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if kind == 0:
                x = torch.full((n,), float(rank + 1 + i % 3), device=dev)
                work = dist.all_reduce(x, group=g, async_op=stream is not None)
                want = torch.full((n,), float(sum(r + 1 + i % 3 for r in range(W))))
                out.append((f"all_reduce {i}", x, want, work))
            elif kind == 1:
                x = torch.full((n,), float(rank + i % 5))
                got = torch.empty(n * W, device=dev)
                work = dist.all_gather_into_tensor(got, x.to(dev), group=g,
                                                   async_op=stream is not None)
                want = torch.cat([torch.full((n,), float(r + i % 5)) for r in range(W)])
                out.append((f"all_gather {i}", got, want, work))
            elif kind == 2:
                a = torch.full((4, 8), float(rank + 1), device=dev)
                bm = torch.ones(8, 3, device=dev)
                _, outs = cuda_p2p.fused_all_gather_matmul(a, [bm], 0, group=g,
                                                           algorithm="pipeline")
                want = torch.cat([torch.full((4, 3), 8.0 * (r + 1)) for r in range(W)])
                out.append((f"fused_all_gather_matmul {i}", outs[0], want, None))
            else:
                a = torch.full((2 * W, 8), float(rank + 1), device=dev)
                bm = torch.ones(8, 3, device=dev)
                got = cuda_p2p.fused_matmul_reduce_scatter(a, bm, "sum", 0, group=g,
                                                           algorithm="pipeline")
                want = torch.full((2, 3), 8.0 * W * (W + 1) / 2)
                out.append((f"fused_matmul_reduce_scatter {i}", got, want, None))
    return out


def _check(rank: int, results: list) -> None:
    bad = [what for what, got, want, _ in results if not torch.equal(got.cpu(), want)]
    assert not bad, f"rank {rank}: results differ from plain torch after teardown: {bad[:10]}"


def _scenario(rank: int, W: int, cuda: bool, scenario: str, args) -> None:
    import torch.distributed as dist

    limit = args.op_timeout + args.margin
    g = R.cuda_p2p_group(cuda, buffer_size=1 << 16, timeout_s=args.op_timeout)
    dist.barrier()  # Gloo: every rank has the group
    results = _enqueue(rank, W, g, cuda, args.ops)
    R.say(rank, f"{scenario}: enqueued {len(results)} ops")
    if scenario == "early_exit":
        # Every rank's ops complete first: a rank leaving while its peers still read its block
        # is a different fault (gpu_fault.py, tests/python/faults/test_faults.py).
        for _, _, _, work in results:
            if work is not None:
                work.wait()
        R.synchronize(cuda)
        dist.barrier()  # Gloo
        if rank == W - 1:
            _check(rank, results)
            R.say(rank, "exits without destroy_process_group")
            R.say(rank, "PASSED")
            sys.stdout.flush()
            os._exit(0)
    if scenario == "staggered":
        time.sleep(rank * args.stagger)
    done, err, took = R.within(limit, dist.destroy_process_group, g)
    assert done, f"{scenario}: destroy_process_group(group) did not return within {limit:.0f} s"
    assert not isinstance(err, BaseException), f"{scenario}: destroy_process_group raised {err!r}"
    R.say(rank, f"{scenario}: destroy_process_group returned after {took:.2f} s")
    done, err, took = R.within(limit, R.synchronize, cuda)
    assert done, f"{scenario}: torch.cuda.synchronize() did not return within {limit:.0f} s"
    assert not isinstance(err, BaseException), f"{scenario}: synchronize raised {err!r}"
    for _, _, _, work in results:
        if work is not None:
            work.wait()
    _check(rank, results)
    R.say(rank, f"{scenario}: the queued results match plain torch")
    if scenario == "early_exit":
        return
    dist.barrier()  # Gloo: every rank destroyed its group
    g2 = R.cuda_p2p_group(cuda, buffer_size=1 << 16)
    dev = R.device_of(cuda)
    y = torch.full((3000,), float(rank + 1), device=dev)
    dist.all_reduce(y, group=g2)
    R.synchronize(cuda)
    assert torch.equal(y.cpu(), torch.full((3000,), W * (W + 1) / 2)), y[:4]
    R.say(rank, f"{scenario}: a new group passed a checked all_reduce")
    dist.destroy_process_group(g2)
    if scenario == "staggered":
        time.sleep(rank * args.stagger)  # and leave at different times
    dist.barrier()


def _teardown_rank(rank: int, W: int, port: int, args) -> None:
    import torch.distributed as dist

    cuda = args.device == "cuda"
    R.init(rank, W, port, cuda)
    # In these processes one after the other (one start-up); early_exit ends them.
    for scenario in sorted(args.scenarios, key=SCENARIOS.index):
        _scenario(rank, W, cuda, scenario, args)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--ops", type=int, default=40, help="ops enqueued before the teardown")
    ap.add_argument("--op-timeout", type=float, default=10.0, help="the group's timeout (s)")
    ap.add_argument("--margin", type=float, default=15.0,
                    help="what a teardown may take beyond the group's timeout (s)")
    ap.add_argument("--stagger", type=float, default=1.0, help="seconds between ranks")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for the whole run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_teardown.py: no CUDA GPU here", file=sys.stderr)
        return 2
    if args.world_size < 2:
        ap.error("--world-size must be at least 2")
    print(f"== teardown {', '.join(args.scenarios)}, {args.world_size} ranks", flush=True)
    codes = R.launch(_teardown_rank, args.world_size, args, args.timeout)
    failed = [f"exit codes {codes}"] if any(c != 0 for c in codes) else []
    return R.main_exit(failed, "gpu_teardown.py")


if __name__ == "__main__":
    sys.exit(main())
