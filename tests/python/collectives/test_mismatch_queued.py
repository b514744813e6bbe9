"""Ranks that pass different arguments, with the ops returning queued (issue 58, point 2): on a
GPU, and on a host workspace with CUDA's semantics, an op's signature comparison runs in stream
order, after the call returned. A caller that waits for the op's Work - or makes a synchronous
call, which waits for it - and would then read the outputs gets an error instead, on every rank,
naming every rank and what it passed (NOTE [Mismatches reach the Work] in backend/works.cpp), and
the group's next op raises it too (the group must be recreated: the op ran on mismatched
arguments). The synchronous host mode, whose comparison runs before any data moves and whose
group stays usable, runs the same cases for comparison (test_mismatch.py has its full matrix).

Before the Work asked the comparisons' records, with CUDA's semantics every wait() here returned
with wrong outputs and no error (checked on 2026-12-02: rank 0 read [2.0, 2.0, ...] after a 16 vs
17 element all-reduce), and only the next op raised.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, raises

R = dist.ReduceOp
MODES = ("synchronous", "cuda")


def _fresh_group(mode):
    """A new cuda_p2p group over all ranks, not cached: a mismatch breaks it with CUDA's
    semantics."""
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.host_semantics = mode
    return dist.new_group(backend="cuda_p2p", pg_options=o, timeout=datetime.timedelta(seconds=20))


def _cases(rank, odd=0):
    """(name, call(group) -> Work or None) of the mismatches: rank `odd` passes one thing, the
    others another."""
    first = rank == odd
    return [
        ("numel", lambda g: dist.all_reduce(torch.ones(16 if first else 17), group=g,
                                            async_op=True)),
        ("dtype", lambda g: dist.all_reduce(torch.ones(8, dtype=torch.float32 if first
                                                       else torch.float64), group=g,
                                            async_op=True)),
        ("reduce op", lambda g: dist.all_reduce(torch.ones(8), op=R.SUM if first else R.MAX,
                                                group=g, async_op=True)),
        ("root", lambda g: dist.broadcast(torch.ones(8), src=0 if first else 1, group=g,
                                          async_op=True)),
        ("all_gather size", lambda g: dist.all_gather_into_tensor(
            torch.empty(dist.get_world_size(g) * (4 if first else 5)),
            torch.ones(4 if first else 5), group=g, async_op=True)),
        ("synchronous call", lambda g: dist.all_reduce(torch.ones(10 if first else 12), group=g)),
        # Routes (NOTE [Routes agree]): rank 0's call goes to the wrapped backend (a dtype the
        # workspace does not reduce), its peers' to the workspace. Before, with CUDA's semantics
        # rank 0 waited in Gloo for its timeout while its peers' op paired with its next one.
        ("route", lambda g: dist.all_reduce(torch.ones(9, dtype=torch.bool if first
                                                       else torch.uint8), op=R.MAX, group=g,
                                            async_op=True)),
        # No Work: the call returns CPU outputs the caller reads at once (NOTE [CPU outputs
        # without a Work] in backend/ProcessGroupCudaP2P.cpp).
        ("dispatcher op", lambda g: torch.ops.cuda_p2p.all_reduce_(
            torch.ones(16 if first else 17), "sum", g.group_name)),
    ]


def check_mismatch_reaches_the_work(ctx, mode, case):
    W, me = ctx.world_size, ctx.rank
    chk = Checker(f"{case} W={W} {mode}")
    g = _fresh_group(mode)
    backend = cuda_p2p.get_cuda_p2p_backend(g)
    x = torch.ones(8)
    dist.all_reduce(x, group=g)  # the group works, and its ranks have met once
    chk.case("healthy first", torch.equal(x, torch.full((8,), float(W))), f"{x}")
    call = dict(_cases(me))[case]

    def run():
        work = call(g)
        if isinstance(work, dist.Work):
            work.wait()

    err = raises(run)
    chk.case("the wait (or the call) raises", err is not None, "it returned without an error")
    if err is not None:
        chk.case("names both sides", "ranks disagree" in err and "rank 0 passed" in err
                 and "rank 1 passed" in err, err)
        if mode == "cuda":  # it ran, on the mismatched arguments: the error must not deny it
            chk.case("says the results are not valid", "valid" in err
                     and "did not run" not in err, err)
            # A peer's reason comes through its failure word's slot, shortened at a word's end.
            chk.case("no word cut", " ... " in err or "its results are n;" not in err, err)
    # Past the mismatch: with CUDA's semantics the group is failed and says why; the synchronous
    # host's group runs the next op.
    y = torch.ones(8)
    nxt = raises(lambda: dist.all_reduce(y, group=g))
    if mode == "cuda":
        chk.case("the next op raises the disagreement", nxt is not None and "disagree" in nxt,
                 f"{nxt}")
    else:
        usable = nxt is None and torch.equal(y, torch.full((8,), float(W)))
        chk.case("the group stays usable", usable, f"{nxt} {y}")
    del backend
    dist.destroy_process_group(g)
    return chk.result()


CASE_NAMES = [name for name, _ in _cases(0)]


@pytest.mark.parametrize("case", CASE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_a_mismatch_reaches_every_ranks_work(any_world, mode, case):
    assert_ok(any_world.run(check_mismatch_reaches_the_work, mode, case))


def check_a_rejection_reaches_the_peers(ctx, mode):
    """A rank whose own arguments are bad (a reduce op the dispatcher op does not know) raises
    them, and takes part with a rejected signature (issue 58, point 4): its peers raise naming it,
    from the call itself - a call without a Work whose CPU outputs the caller reads next - never
    returning the outputs of an op that paired with something else. Before, with CUDA's semantics,
    rank 0 returned from the call without an error (checked on 2026-12-02) and only its next op
    raised."""
    W, me = ctx.world_size, ctx.rank
    chk = Checker(f"rejection W={W} {mode}")
    g = _fresh_group(mode)
    x = torch.ones(8)
    dist.all_reduce(x, group=g)
    bad = 1
    t = torch.ones(16)
    err = raises(lambda: torch.ops.cuda_p2p.all_reduce_(t, "bogus" if me == bad else "sum",
                                                         g.group_name))
    if me == bad:
        chk.case("the bad rank raises its own error", err is not None and "bogus" in err, f"{err}")
    else:
        chk.case("every peer raises naming it", err is not None
                 and f"rank {bad} rejected its arguments" in err, f"{err}")
    nxt = raises(lambda: dist.all_reduce(torch.ones(8), group=g))
    if mode == "synchronous":
        chk.case("the group stays usable", nxt is None, f"{nxt}")
    dist.destroy_process_group(g)
    return chk.result()


@pytest.mark.parametrize("mode", MODES)
def test_a_rejection_reaches_the_peers_of_a_call_without_a_work(any_world, mode):
    assert_ok(any_world.run(check_a_rejection_reaches_the_peers, mode))


def check_a_deadlocked_disagreement_ends_at_once(ctx):
    """Two ranks that each take the other for the root: with CUDA's semantics the broadcast runs
    after the comparison, and rank 0 and rank 1 each wait for the other's done word, which never
    comes. The recorded disagreement fails the device at the watchdog's next scan and releases
    the waits (NOTE [A disagreement fails the device at once] in ops/op_signature.cpp): every
    rank's wait raises the disagreement, naming the odd rank. Before, each waited the group's
    whole timeout (20 s) and raised "rank 1 never arrived" (checked on 2026-12-05)."""
    W, me = ctx.world_size, ctx.rank
    chk = Checker(f"deadlocked root W={W}")
    g = _fresh_group("cuda")
    dist.all_reduce(torch.ones(8), group=g)
    src = 0 if me == 1 else 1  # rank 1 names rank 0, every other rank names rank 1
    err = raises(lambda: dist.broadcast(torch.ones(8), src=src, group=g, async_op=True).wait())
    chk.case("raises the disagreement, not the timeout", err is not None and "disagree" in err
             and "rank 1 passed" in err and "never arrived" not in err, f"{err}")
    nxt = raises(lambda: dist.all_reduce(torch.ones(8), group=g))
    chk.case("the group's next op raises it too", nxt is not None and "disagree" in nxt, f"{nxt}")
    dist.destroy_process_group(g)
    return chk.result()


def test_a_deadlocked_disagreement_ends_at_once(any_world):
    assert_ok(any_world.run(check_a_deadlocked_disagreement_ends_at_once))


def _run(call):
    """call(), and the wait of the Work it returns."""
    work = call()
    if isinstance(work, dist.Work):
        work.wait()


def check_random_bad_inputs(ctx, mode, seed, steps):
    """Issue 58, point 5: a random sequence of steps, the same on every rank (one seed): good
    all-reduces, the mismatches above with a random rank as the odd one, and a random rank
    rejecting its own arguments to the dispatcher op. A good step returns the right sum on every
    rank; a bad one raises on every rank - naming the odd rank - and never hands back a value. The
    synchronous host's group runs on; with CUDA's semantics a disagreement fails the group, which
    is then recreated (a rejection too: its peers' ops ran)."""
    import random

    W, me = ctx.world_size, ctx.rank
    rng = random.Random(seed)
    chk = Checker(f"random bad inputs W={W} {mode} seed {seed}")
    g = _fresh_group(mode)
    names = CASE_NAMES + ["rejection"]
    for step in range(steps):
        kind = rng.choice(["good", "good"] + names)
        odd = rng.randrange(W)
        what = f"step {step}: {kind} (odd rank {odd})"
        if kind == "good":
            x = torch.full((rng.randrange(1, 5000),), float(me + 1))
            err = raises(lambda: dist.all_reduce(x, group=g))
            chk.case(f"{what}: right", err is None and bool((x == W * (W + 1) / 2).all()),
                     f"{err} {x[:4]}")
            continue
        if kind == "rejection":
            t = torch.ones(16)
            err = raises(lambda: torch.ops.cuda_p2p.all_reduce_(
                t, "bogus" if me == odd else "sum", g.group_name))
            want = "bogus" if me == odd else f"rank {odd} rejected its arguments"
        else:
            call = dict(_cases(me, odd))[kind]
            err = raises(lambda: _run(lambda: call(g)))
            want = f"rank {odd} passed"
        # With CUDA's semantics a root disagreement whose odd rank is not rank 0 leaves two ranks
        # waiting for each other's done word: the recorded disagreement releases them (NOTE [A
        # disagreement fails the device at once]), so they too raise it, not a timeout.
        named = err is not None and want in err
        chk.case(f"{what}: raises naming the odd rank", named, f"{err!r} (want {want!r})")
        if mode == "cuda":
            dist.destroy_process_group(g)
            g = _fresh_group(mode)
    dist.destroy_process_group(g)
    return chk.result()


# A short form in CI, on 2 and 4 ranks in each host mode; longer ones behind --long.
@pytest.mark.parametrize("seed,steps", [(58, 12), pytest.param(580, 200, marks=pytest.mark.long)],
                         ids=["short", "long"])
@pytest.mark.parametrize("mode", MODES)
def test_random_bad_inputs_raise_on_every_rank(world, mode, seed, steps):
    assert_ok(world.run(check_random_bad_inputs, mode, seed, steps, timeout=600), steps)
