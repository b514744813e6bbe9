"""Soak: many mixed operations on two cuda_p2p groups from two threads, checked against plain
torch at intervals, with RSS, open descriptors and mappings measured before and after.

CUDA_P2P_SOAK_OPS sets the number of operations (both threads together; default 10000, about a
minute on 2 cores including the pool's start; tests/python/conftest.py sets 2000 for CI's run and
10000 with --long). Every op's kind, size and dtype come from a
generator seeded by (thread, index), identical on every rank; one op in CHECK_EVERY is built from
per-rank deterministic inputs and compared with the result computed locally from every rank's
input.
"""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time

import torch
import torch.distributed as dist

import cuda_p2p
from _reference import reduce_over_ranks
from cuda_p2p import ops

SOAK_OPS = int(os.environ.get("CUDA_P2P_SOAK_OPS", "10000"))
CHECK_EVERY = 33
MAX_BYTES = 4 << 20
WARMUP_FRACTION = 0.1
# Growth allowed per rank in private memory (RSS less RssShmem). With glibc's mmap threshold fixed
# (_fix_mmap_threshold) it is flat from the end of the warm-up on (measured, six runs: -2 to +1 MiB
# over the run, +-1 MiB from the middle; with the default dynamic threshold the heap's high-water
# mark moved by up to 90 MiB).
MAX_RSS_GROWTH = 32 << 20
MAX_RSS_GROWTH_SECOND_HALF = 8 << 20
# Shared memory is the workspaces' mappings: a page counts from the first op that touches it, so
# RssShmem rises whenever an op reaches a part of a peer's buffer no earlier op did (rounds chosen
# by rank 0 put whole 4 MiB ops in one round: measured +2 to +13 MiB over a run here, +12 MiB in
# one CI run, where it failed a bound on the whole RSS). It cannot pass what is mapped - every
# rank's buffer in every group - plus the signal pads: a bound that a leaked segment breaks.
SHMEM_SLACK = 16 << 20
MAX_FD_GROWTH = 2
MAX_MAPS_GROWTH = 16

FUSED_ROWS, FUSED_K, FUSED_COLS = (1, 7, 33), (5, 96), (3, 64)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "ag_matmul",
         "matmul_rs")
DTYPES = (torch.float32, torch.int32, torch.bfloat16, torch.int64)
REDUCE_OPS = {"SUM": dist.ReduceOp.SUM, "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN}


def _trim_malloc() -> None:
    """Returns glibc's free heap pages to the system, so that RSS counts live memory rather than
    what the allocator keeps cached (its arenas of freed 4 MiB tensors vary by tens of MiB
    between snapshots taken while the other thread is mid-op, which is not a leak)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: measure as is
        pass


def _fix_mmap_threshold() -> None:
    """Makes glibc serve every block of 128 KiB or more with its own mapping, returned when freed.
    By default the threshold rises to the largest block freed so far (up to 32 MiB), after which
    the op's MiB-sized tensors come from the heap, whose high-water mark then jumps by tens of MiB
    at moments that depend on which thread frees what when (measured: +49 MiB at once in the second
    half of one run, with the same plateau at the end of runs of 10000 and 40000 ops). A leaked
    tensor stays mapped and counted either way."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def usage() -> dict:
    _trim_malloc()
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            for key, name in (("VmRSS:", "rss"), ("RssAnon:", "anon"), ("RssShmem:", "shmem")):
                if line.startswith(key):
                    out[name] = int(line.split()[1]) * 1024
    with open("/proc/self/maps") as f:
        out["maps"] = sum(1 for _ in f)
    out["fds"] = len(os.listdir("/proc/self/fd"))
    out["buffers"] = [cuda_p2p.get_cuda_p2p_backend(g).get_buffer_size()
                      for g in _GROUPS]
    return out


_GROUPS: list = []


def _input(seed: int, rank: int, n: int, dtype) -> torch.Tensor:
    # Small integers: every sum, max and product here is exact in every dtype, so results
    # compare exactly whatever order the backend reduces in.
    g = torch.Generator().manual_seed(seed * 131 + rank)
    return torch.randint(-8, 9, (n,), generator=g, dtype=torch.int64).to(dtype)


def one_op(g, rank: int, world: int, rng: random.Random, seed: int, check: bool) -> str | None:
    """Runs one random op on group g; returns a failure description or None."""
    kind = rng.choice(KINDS)
    dtype = rng.choice(DTYPES)
    item = torch.empty((), dtype=dtype).element_size()
    nbytes = int(2 ** rng.uniform(0, 22))  # 1 B .. 4 MiB, log-uniform
    n = max(1, nbytes // item)
    what = f"{kind} n={n} {dtype}"

    def inp(r, count=n):
        return _input(seed, r, count, dtype) if check else torch.full((count,), r + 1, dtype=dtype)

    if kind == "all_reduce":
        op = rng.choice(sorted(REDUCE_OPS))
        t = inp(rank)
        dist.all_reduce(t, REDUCE_OPS[op], group=g)
        if check:
            exp = reduce_over_ranks(op, [inp(r) for r in range(world)])
            if not torch.equal(t, exp):
                return f"{what} {op}"
    elif kind == "all_gather":
        t = inp(rank)
        out = torch.empty(world * n, dtype=dtype)
        dist.all_gather_into_tensor(out, t, group=g)
        if check and not torch.equal(out, torch.cat([inp(r) for r in range(world)])):
            return what
    elif kind == "reduce_scatter":
        full = inp(rank, n * world)
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, full, group=g)
        if check:
            exp = reduce_over_ranks("SUM", [inp(r, n * world)[rank * n:(rank + 1) * n]
                                            for r in range(world)])
            if not torch.equal(out, exp):
                return what
    elif kind == "broadcast":
        root = rng.randrange(world)
        t = inp(rank)
        dist.broadcast(t, dist.get_global_rank(g, root), group=g)
        if check and not torch.equal(t, inp(root)):
            return f"{what} root {root}"
    elif kind == "barrier":
        dist.barrier(group=g)
    else:
        # Shapes from a small set: torch's CPU bfloat16 matmul keeps per-shape kernels (RSS grows
        # by ~0.3 MiB per new shape in plain torch, no collective involved), so random shapes
        # would measure that cache, not us. The warm-up sees every shape.
        rows, k, cols = rng.choice(FUSED_ROWS), rng.choice(FUSED_K), rng.choice(FUSED_COLS)
        dt = rng.choice((torch.float32, torch.bfloat16))

        def mat(r, shape, salt):
            # In {-1, 0, 1}: every partial product (|x| <= 96) is exact in bfloat16 too, so the
            # only rounding is the final one, as in the reference.
            g = torch.Generator().manual_seed(seed * 7 + salt * 1009 + r)
            return torch.randint(-1, 2, shape, generator=g).to(dt)

        b = mat(0, (k, cols), 1)  # the same B everywhere
        if kind == "ag_matmul":
            _, (y,) = ops.fused_all_gather_matmul(mat(rank, (rows, k), 2), [b], 0, g,
                                                  return_A=False)
            if check:
                a = torch.cat([mat(r, (rows, k), 2) for r in range(world)]).double()
                if not torch.equal(y.double(), (a @ b.double()).to(dt).double()):
                    return f"{kind} {rows}x{k}x{cols} {dt}"
        else:
            a = mat(rank, (rows * world, k), 3)
            y = ops.fused_matmul_reduce_scatter(a, b, "sum", 0, g)
            if check:
                full = sum(mat(r, (rows * world, k), 3).double() @ b.double() for r in range(world))
                exp = full[rank * rows:(rank + 1) * rows].to(dt).double()
                if not torch.equal(y.double(), exp):
                    return f"{kind} {rows}x{k}x{cols} {dt}"
    return None


def _soak(ctx, total: int) -> dict:
    rank, world = ctx.rank, ctx.world_size
    groups = [dist.group.WORLD, ctx.group(range(world))]
    _GROUPS[:] = groups
    for g in groups:
        assert cuda_p2p.is_cuda_p2p_group(g)
        assert cuda_p2p.get_cuda_p2p_backend(g).is_p2p_available()
    _fix_mmap_threshold()
    per_thread = total // 2
    warmup = int(per_thread * WARMUP_FRACTION)
    barrier = threading.Barrier(2)
    marks: dict = {}
    failures: list = []
    counts = [0, 0]
    errors: list = []

    def worker(tid: int):
        try:
            g = groups[tid]
            for i in range(per_thread):
                if i == warmup:
                    barrier.wait(timeout=600)
                    if tid == 0:
                        marks["start"] = usage()
                        marks["t0"] = time.time()
                    barrier.wait(timeout=600)
                if i == (warmup + per_thread) // 2:
                    # Both threads between ops, as at the start and the end: no op's tensors
                    # (tens of MiB at 4 MiB inputs) are live in the snapshot.
                    barrier.wait(timeout=600)
                    if tid == 0:
                        marks["mid"] = usage()
                    barrier.wait(timeout=600)
                rng = random.Random(tid * 1_000_003 + i)
                check = i % CHECK_EVERY == 0
                bad = one_op(g, rank, world, rng, seed=tid * 1_000_003 + i, check=check)
                counts[tid] += 1
                if bad:
                    failures.append(f"thread {tid} op {i}: {bad}")
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"thread {tid}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(tid,)) for tid in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = usage()
    return {
        "ops": sum(counts),
        "checked": sum((per_thread + CHECK_EVERY - 1) // CHECK_EVERY for _ in range(2)),
        "failures": failures,
        "errors": errors,
        "start": marks.get("start"),
        "mid": marks.get("mid"),
        "end": end,
        "seconds": time.time() - marks.get("t0", time.time()),
    }


def test_soak_mixed_ops_two_groups_two_threads(world2):
    results = world2.run(_soak, SOAK_OPS, timeout=1800)
    for rank, res in enumerate(results):
        start, mid, end = res["start"], res["mid"], res["end"]
        print(f"\nSOAK rank {rank}: {res['ops']} ops ({res['checked']} checked) in "
              f"{res['seconds']:.1f} s after warm-up; RSS {start['rss'] >> 20} -> "
              f"{end['rss'] >> 20} MiB (middle {mid['rss'] >> 20} MiB; anon "
              f"{start['anon'] >> 20} -> {mid['anon'] >> 20} -> {end['anon'] >> 20}, shmem "
              f"{start['shmem'] >> 20} -> {mid['shmem'] >> 20} -> {end['shmem'] >> 20}), "
              f"workspace buffers "
              f"{start['buffers']} -> {end['buffers']} B, fds {start['fds']} -> {end['fds']}, maps "
              f"{start['maps']} -> {end['maps']}")
        assert not res["errors"], res["errors"]
        assert not res["failures"], res["failures"][:20]
        assert res["ops"] == SOAK_OPS // 2 * 2
        private = {k: res[k]["rss"] - res[k]["shmem"] for k in ("start", "mid", "end")}
        assert private["end"] - private["start"] <= MAX_RSS_GROWTH, (start, end)
        assert private["end"] - private["mid"] <= MAX_RSS_GROWTH_SECOND_HALF, (mid, end)
        mapped = sum(end["buffers"]) * len(results)  # every rank's buffer, in each group
        assert end["shmem"] <= mapped + SHMEM_SLACK, (end["shmem"], mapped)
        assert end["fds"] - start["fds"] <= MAX_FD_GROWTH, (start, end)
        assert end["maps"] - start["maps"] <= MAX_MAPS_GROWTH, (start, end)
