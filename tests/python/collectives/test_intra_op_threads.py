"""Many-core ranks (issue 38, point 4; NOTE [Intra-op threads] in ops/collectives.cpp): with
torch.set_num_threads(2) a rank splits the host copies and reductions of its workspace
collectives of at least Options.parallel_min_bytes across its intra-op threads. The results must
equal Gloo's for every dtype (small integers: exact in every dtype and summation order) and the
same collective's with one thread, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _groups import cached_group
from _reference import reduce_over_ranks
from cuda_p2p import _C

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64]
# 4 KiB: every payload below (odd element counts, tens of KiB) is split on 2 threads. The default
# threshold (1 MiB) is covered by one large payload per collective.
MIN_BYTES = 4096



def _values(rank, n, dtype, seed=0):
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + seed) % 17 - 8
    return (v.abs() if dtype == torch.uint8 else v).to(dtype)


def _run_every_collective(group, rank, W, dtype, n, gloo=False):
    """Every reducing and copying collective once on `group`; the outputs by name (on Gloo, which
    has no AVG, "all_reduce_avg" holds the SUM)."""
    out = {}
    x = _values(rank, n * W, dtype)
    dist.all_reduce(x, group=group)
    out["all_reduce_sum"] = x
    if dtype.is_floating_point:
        y = _values(rank, n * W, dtype, seed=3)
        dist.all_reduce(y, op=dist.ReduceOp.SUM if gloo else dist.ReduceOp.AVG, group=group)
        out["all_reduce_avg"] = y
    z = _values(rank, n * W, dtype, seed=5)
    dist.all_reduce(z, op=dist.ReduceOp.MAX, group=group)
    out["all_reduce_max"] = z
    rs = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(rs, _values(rank, n * W, dtype, seed=7), group=group)
    out["reduce_scatter"] = rs
    ag = torch.empty(n * W, dtype=dtype)
    dist.all_gather_into_tensor(ag, _values(rank, n, dtype, seed=9), group=group)
    out["all_gather"] = ag
    b = _values(rank, n * W, dtype, seed=11)
    dist.broadcast(b, src=W - 1, group=group)
    out["broadcast"] = b
    return out


def _local_reference(rank, W, dtype, n):
    """The same outputs from the plain-torch reference (_reference.py; Gloo has no int16)."""
    every = lambda seed, k: [_values(q, k, dtype, seed) for q in range(W)]  # noqa: E731
    out = {"all_reduce_sum": reduce_over_ranks("SUM", every(0, n * W))}
    if dtype.is_floating_point:
        out["all_reduce_avg"] = reduce_over_ranks("AVG", every(3, n * W))
    out["all_reduce_max"] = reduce_over_ranks("MAX", every(5, n * W))
    out["reduce_scatter"] = reduce_over_ranks("SUM", every(7, n * W))[rank * n:(rank + 1) * n]
    out["all_gather"] = torch.cat(every(9, n))
    out["broadcast"] = _values(W - 1, n * W, dtype, seed=11)
    return out


def threads_case(ctx, dtype_names, n, min_bytes):
    W, rank = ctx.world_size, ctx.rank
    dtypes = [getattr(torch, d) for d in dtype_names]
    key = ("threads", min_bytes)
    g = (cached_group(key, parallel_min_bytes=min_bytes) if min_bytes is not None
         else dist.group.WORLD)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    effective = b.get_collective_config()["parallel_min_bytes"]
    failures = []
    c0 = dict(b.get_counters())
    torch.set_num_threads(2)
    try:
        split = _C._testing.parallel_grain(n * 8, 8, effective)
        if not 0 < split < n:
            failures.append(f"{n} x 8 B not split on 2 threads from {effective} B: grain {split}")
        results = {d: _run_every_collective(g, rank, W, d, n) for d in dtypes}
    finally:
        torch.set_num_threads(1)
    c1 = dict(b.get_counters())
    if _C._testing.parallel_grain(n * 8, 8, effective) != 0:
        failures.append("split with one thread")
    one = {d: _run_every_collective(g, rank, W, d, n) for d in dtypes}
    c2 = dict(b.get_counters())
    split2 = c1.get("intra_op.split", 0) - c0.get("intra_op.split", 0)
    split1 = c2.get("intra_op.split", 0) - c1.get("intra_op.split", 0)
    # (Not every op splits: the inline one-shot all-reduce copies and reduces on the caller's
    # thread alone, and small dtypes' pieces may stay under the threshold.)
    if split2 == 0 or split1 != 0:
        failures.append(f"intra_op.split counted {split2} on 2 threads, {split1} on 1")
    ref = {d: _run_every_collective(ctx.gloo, rank, W, d, n, gloo=True)
           if d != torch.int16 else None for d in dtypes}
    local = {d: _local_reference(rank, W, d, n) for d in dtypes}
    for d in dtypes:
        for name, got in results[d].items():
            if not torch.equal(got, one[d][name]):
                failures.append(f"{d} {name}: 2 threads differ from 1 thread")
            if not torch.equal(got, local[d][name]):
                failures.append(f"{d} {name}: differs from plain torch")
            if ref[d] is None:
                continue
            want = ref[d][name]
            if name == "all_reduce_avg":  # Gloo's exact SUM, divided once in the accumulate type
                acc = torch.float64 if d == torch.float64 else torch.float32
                want = (want.to(acc) / W).to(d)
            if not torch.equal(got, want):
                failures.append(f"{d} {name}: differs from Gloo "
                                f"(first diff at {(got != want).nonzero()[:1].tolist()})")
    wrapped = {k: v - c0.get(k, 0) for k, v in c2.items()
               if k.endswith(".wrapped") and v != c0.get(k, 0)}
    if wrapped:
        failures.append(f"went to the wrapped backend: {wrapped}")
    return failures


@pytest.mark.parametrize("n", [5003, 24577], ids=["5003", "24577"])
def test_threads_equal_gloo_every_dtype(any_world, n):
    names = [str(d).split(".")[1] for d in DTYPES]
    for r, failures in enumerate(any_world.run(threads_case, names, n, MIN_BYTES)):
        assert not failures, f"rank {r}: {failures}"


def test_threads_large_payload_default_threshold(world2):
    # 3 MiB of float32 per rank's all-reduce: above the default threshold.
    for r, failures in enumerate(world2.run(threads_case, ["float32", "bfloat16"],
                                            (3 << 20) // 8, None)):
        assert not failures, f"rank {r}: {failures}"


def test_parallel_min_bytes_option_and_its_errors():
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    assert o.parallel_min_bytes is None
    o.parallel_min_bytes = 0
    assert o.parallel_min_bytes == 0
    with pytest.raises((ValueError, RuntimeError), match="parallel_min_bytes"):
        o.parallel_min_bytes = -1
    # The split itself: pieces of whole 64-element multiples, none below the threshold or on one
    # thread (the caller's setting, restored).
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _C._testing.parallel_grain(1 << 20, 4, 1 << 10) == 0
        torch.set_num_threads(2)
        assert _C._testing.parallel_grain(1 << 20, 4, 1 << 10) == 1 << 17
        assert _C._testing.parallel_grain(1000, 4, 1 << 10) == 0
        assert _C._testing.parallel_grain(1 << 20, 4, 0) == 0
        assert _C._testing.parallel_grain(4 * 1001, 4, 1024) % 64 == 0
    finally:
        torch.set_num_threads(old)
