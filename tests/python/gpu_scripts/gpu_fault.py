#!/usr/bin/env python3
"""A rank that never arrives, on the CUDA path (scripts/gpu_check.sh, step "fault").

W ranks share the one GPU (default W = 2; the victim is the last rank). Every rank creates a
cuda_p2p group with a short timeout (--op-timeout); the victim then never calls the op. Each
other rank runs an all_reduce on the workspace (opt-in) on a side stream, then keeps calling the
group (intra_node_barrier) until an error comes, and checks, each within a deadline (a call that
does not return is reported, not hung on):
  1. the error comes within the timeout plus --margin, and names the victim ("rank <victim>");
  2. torch.cuda.synchronize() returns afterwards (no stream is left blocked for good);
  3. destroy_process_group(group) returns within the timeout plus the margin (every rank, the
     victim included, destroys the group);
  4. a new cuda_p2p group on the same GPU, every rank again, passes a checked all_reduce.
The ranks line up between the steps over the default group (Gloo, never under test).

    python tests/python/gpu_scripts/gpu_fault.py [--world-size 2] [--op-timeout 5] [--margin 15]
        [--timeout 180] [--device cpu]

--device cpu runs the same steps on the host workspace (tests/python/gpu/test_gpu_readiness.py
runs it in CI; tests/python/faults/test_faults.py covers killed and stopped ranks there). Exit
status: 0 when every rank passed, 1 otherwise, 2 without a GPU.
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
from _checks import names_rank  # noqa: E402


def _fault_rank(rank: int, W: int, port: int, args) -> None:
    import torch.distributed as dist

    import cuda_p2p

    cuda = args.device == "cuda"
    dev = R.device_of(cuda)
    victim = W - 1
    limit = args.op_timeout + args.margin
    R.init(rank, W, port, cuda)
    g = R.cuda_p2p_group(cuda, buffer_size=1 << 16, timeout_s=args.op_timeout)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    x = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(x, group=g)  # the group works before the fault
    R.synchronize(cuda)
    assert torch.equal(x.cpu(), torch.full((1000,), W * (W + 1) / 2)), x[:4]
    dist.barrier()  # Gloo: everyone is past the first op

    if rank == victim:
        R.say(rank, "the victim: never calls the op")
    else:
        def until_error():
            t0 = time.monotonic()
            side = torch.cuda.Stream(device=dev) if cuda else None
            try:
                with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                    dist.all_reduce(torch.ones(1000, device=dev), group=g)
                    while time.monotonic() < t0 + limit:
                        b.intra_node_barrier(timeout=1.0)
                        time.sleep(0.2)
            except Exception as e:  # noqa: BLE001  (the point)
                return f"{type(e).__name__}: {e}", time.monotonic() - t0
            return None, time.monotonic() - t0

        done, result, took = R.within(limit + 10, until_error)
        assert done, f"the op and the calls after it did not return in {took:.0f} s"
        error, took = result if not isinstance(result, BaseException) else (repr(result), 0)
        assert error is not None, f"no error within {took:.1f} s although rank {victim} never came"
        R.say(rank, f"error after {took:.1f} s: {error[:300]}")
        assert took <= limit, f"the error came after {took:.1f} s (limit {limit:.0f} s)"
        assert names_rank(error, victim), (
            f"the error does not name rank {victim}: {error[:600]}")
        done, err, took = R.within(limit, R.synchronize, cuda)
        assert done, f"torch.cuda.synchronize() did not return within {limit:.0f} s"
        assert not isinstance(err, BaseException), f"synchronize raised {err!r}"
        R.say(rank, f"synchronize returned after {took:.2f} s")
    dist.barrier()  # Gloo: every survivor has its error

    done, err, took = R.within(limit, dist.destroy_process_group, g)
    assert done, f"destroy_process_group(group) did not return within {limit:.0f} s"
    R.say(rank, f"destroy_process_group returned after {took:.2f} s"
          + (f" raising {type(err).__name__}: {err}" if isinstance(err, BaseException) else ""))
    dist.barrier()

    g2 = R.cuda_p2p_group(cuda, buffer_size=1 << 16)
    y = torch.full((5000,), float(rank + 1), device=dev)
    dist.all_reduce(y, group=g2)
    R.synchronize(cuda)
    assert torch.equal(y.cpu(), torch.full((5000,), W * (W + 1) / 2)), y[:4]
    R.say(rank, "a new group on the same device passed a checked all_reduce")
    dist.destroy_process_group(g2)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--op-timeout", type=float, default=5.0, help="the group's timeout (s)")
    ap.add_argument("--margin", type=float, default=15.0,
                    help="what a step may take beyond the group's timeout (s)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for the whole run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_fault.py: no CUDA GPU here", file=sys.stderr)
        return 2
    if args.world_size < 2:
        ap.error("--world-size must be at least 2 (a victim and a survivor)")
    print(f"== fault, {args.world_size} ranks, rank {args.world_size - 1} never arrives",
          flush=True)
    codes = R.launch(_fault_rank, args.world_size, args, args.timeout)
    failed = [f"exit codes {codes}"] if any(c != 0 for c in codes) else []
    return R.main_exit(failed, "gpu_fault.py")


if __name__ == "__main__":
    sys.exit(main())
