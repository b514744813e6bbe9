"""Rounds of a large two-shot all-reduce chosen by rank 0 (NOTE [Rounds chosen by rank 0] in
ops/all_reduce.cpp), through dist.all_reduce on 2, 3 and 4 ranks: every setting of
Options.all_reduce_rounds gives Gloo's and plain torch's result, every rank runs the rounds rank 0
chose (the all_reduce.large_rounds counter moves alike on every rank), settings that must not mix
raise on every rank and leave the group usable, and the environment variable sets it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import _collective_checks as cc
import cuda_p2p
from _reference import reduce_over_ranks

CHUNK = 4096  # the groups' chunk_bytes: more than one chunked round of float32 from 1025 elements


def _group(rounds):
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.chunk_bytes = CHUNK
    o.all_reduce_algo = "two_shot"
    if rounds is not None:
        o.all_reduce_rounds = rounds
    return dist.new_group(backend="cuda_p2p", pg_options=o)


def _large_rounds(g) -> int:
    return cuda_p2p.get_cuda_p2p_backend(g).get_counters().get("all_reduce.large_rounds", 0)


def _ops_in_chosen_rounds(sizes, dtypes, repeats) -> int:
    """How many of these ops (in _check_sums's order, `repeats` times) run in rounds rank 0 chose:
    those of more than one chunked round, from the second op of their size class (floor(log2(
    bytes))) on - rank 0 chooses one op ahead."""
    seen, count = set(), 0
    for _ in range(repeats):
        for dtype in dtypes:
            for n in sizes:
                nbytes = n * dtype.itemsize
                if nbytes > CHUNK:
                    size_class = nbytes.bit_length() - 1
                    count += size_class in seen
                    seen.add(size_class)
    return count


def _same_on_every_rank(ctx, value) -> bool:
    values = [None] * ctx.world_size
    dist.all_gather_object(values, value, group=ctx.gloo)
    return all(v == values[0] for v in values)


def _check_sums(ctx, g, label, sizes, dtypes, failures) -> int:
    cases = 0
    for dtype in dtypes:
        for n in sizes:
            # Small integers (in every dtype): sums exact in any order, Gloo's included.
            inputs = [cc.make_input(n + 5, r, n, torch.int64, "SUM").to(dtype)
                      for r in range(ctx.world_size)]
            got = inputs[ctx.rank].clone()
            dist.all_reduce(got, group=g)
            ref = inputs[ctx.rank].clone()
            dist.all_reduce(ref, group=ctx.gloo)
            expected = reduce_over_ranks("SUM", inputs)
            cases += 1
            if not torch.equal(got, ref) or not torch.equal(got, expected):
                failures.append(f"{label} {dtype} n={n}: differs from Gloo or plain torch")
    return cases


def check_rounds(ctx):
    W, rank = ctx.world_size, ctx.rank
    failures, cases = [], 0
    sizes = (CHUNK // 4, CHUNK // 4 + 1, 50_001)  # one round, just over one, many
    dtypes = (torch.float32, torch.int64)
    # large: every op of more than one round runs large rounds from the second op of its size
    # class on, on every rank; chunked: none; rank 0 forcing large beside auto peers: rank 0
    # decides.
    for label, mine, want in (("large", "large", True), ("chunked", "chunked", False),
                              ("large/auto", "large" if rank == 0 else "auto", True)):
        g = _group(mine)
        config = cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()
        if config["all_reduce_rounds"] != mine:
            failures.append(f"{label}: get_collective_config says {config['all_reduce_rounds']}")
        before = _large_rounds(g)
        for _ in range(2):
            cases += _check_sums(ctx, g, label, sizes, dtypes, failures)
        ran = _large_rounds(g) - before
        expected = _ops_in_chosen_rounds(sizes, dtypes, 2) if want and W > 1 else 0
        if ran != expected:
            failures.append(f"{label}: {ran} ops ran large rounds, expected {expected}")
        dist.destroy_process_group(g)
    # auto: whatever rank 0 measures, the results are right and every rank ran the same rounds.
    g = _group(None)
    before = _large_rounds(g)
    for _ in range(10):
        cases += _check_sums(ctx, g, "auto", (50_001,), (torch.float32,), failures)
    if not _same_on_every_rank(ctx, _large_rounds(g) - before):
        failures.append("auto: the ranks ran different rounds")
    dist.destroy_process_group(g)
    if W > 1:
        # chunked on rank 0, auto elsewhere: their signatures differ, so every rank raises (and
        # the group works right after, in one round, where rank 0 does not choose).
        g = _group("chunked" if rank == 0 else "auto")
        cases += 1
        try:
            dist.all_reduce(torch.ones(50_000), group=g)
            failures.append("chunked beside auto: returned")
        except RuntimeError as e:
            if "ranks disagree" not in str(e) or "(two_shot, chunk_bytes 4096, rounds by " \
                    "rank 0: chunked)" not in str(e) or "\n" in str(e).strip():
                failures.append(f"chunked beside auto: {e}")
        cases += _check_sums(ctx, g, "after the mismatch", (1000,), (torch.float32,), failures)
        dist.destroy_process_group(g)
    # The environment variable, read at group creation.
    os.environ["CUDA_P2P_ALL_REDUCE_ROUNDS"] = "large"
    try:
        g = _group(None)
    finally:
        del os.environ["CUDA_P2P_ALL_REDUCE_ROUNDS"]
    cases += 1
    if cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()["all_reduce_rounds"] != "large":
        failures.append("CUDA_P2P_ALL_REDUCE_ROUNDS=large was not taken")
    dist.destroy_process_group(g)
    return {"cases": cases, "failures": failures}


def test_rounds_chosen_by_rank_zero(any_world):
    cc.assert_all_ok(any_world.run(check_rounds), min_cases=20)
