"""torch 2.14's canonical single-tensor entries (issue 50, point 5) on 2, 3 and 4 ranks:
all_gather_single, reduce_scatter_single, all_to_all_single, gather_single and the coalesced
forms run the same ops as their older names (_allgather_base, _reduce_scatter_base,
alltoall_base, allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced) and are counted
alike, on the workspace and on the wrapped backend; gather_single (which Gloo lacks) gathers into
the root's one tensor on either route, and a root whose output cannot hold the gather raises on
every rank, the group staying usable (NOTE [Canonical entries] in
backend/entry_sequence.hpp). Results against plain torch computed on every rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, wrapped
from _groups import cached_group

if not hasattr(dist.ProcessGroup, "gather_single"):  # torch before 2.14: nothing to test
    pytest.skip("this torch has no canonical single-tensor entries", allow_module_level=True)


def _value(rank, n, dtype=torch.float32, seed=0):
    return ((torch.arange(n, dtype=torch.int64) * 3 + rank * 5 + seed) % 11).to(dtype)


def _wait(work):
    if work is not None:
        work.wait()


def _groups():
    return ((dist.group.WORLD, "workspace", "direct"),
            (cached_group("canonical-wrapped", workspace_collectives=False), "wrapped", "wrapped"))


def check_entries(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"canonical W={W}")
    n = 37
    for g, gname, path in _groups():
        b = cuda_p2p.get_cuda_p2p_backend(g)
        b.reset_counters()
        # all-gather into one tensor, by its three names
        want = torch.cat([_value(q, n) for q in range(W)])
        for name in ("all_gather_single", "_allgather_base"):
            out = torch.zeros(W * n)
            _wait(getattr(b, name)(out, _value(rank, n)))
            chk.case(f"{gname} {name}", torch.equal(out, want), f"{out[:6]}")
        out = torch.zeros(W * n)
        dist.all_gather_into_tensor(out, _value(rank, n), group=g)
        chk.case(f"{gname} all_gather_into_tensor", torch.equal(out, want), f"{out[:6]}")
        # coalesced all-gathers: two pairs per call
        outs = [torch.zeros(W * n), torch.zeros(W * 3)]
        _wait(b.all_gather_single_coalesced(outs, [_value(rank, n), _value(rank, 3, seed=1)]))
        chk.case(f"{gname} all_gather_single_coalesced",
                 torch.equal(outs[0], want)
                 and torch.equal(outs[1], torch.cat([_value(q, 3, seed=1) for q in range(W)])),
                 f"{outs}")
        # reduce-scatter from one tensor, by both names and coalesced
        full = torch.cat([_value(rank, n, seed=q) for q in range(W)])
        rs_want = sum(_value(q, n, seed=rank) for q in range(W))
        for name in ("reduce_scatter_single", "_reduce_scatter_base"):
            out = torch.zeros(n)
            _wait(getattr(b, name)(out, full.clone()))
            chk.case(f"{gname} {name}", torch.equal(out, rs_want), f"{out[:6]}")
        outs = [torch.zeros(n), torch.zeros(n)]
        _wait(b.reduce_scatter_single_coalesced(outs, [full.clone(), full.clone()]))
        chk.case(f"{gname} reduce_scatter_single_coalesced",
                 all(torch.equal(o, rs_want) for o in outs), f"{outs}")
        # all-to-all of one tensor
        out = torch.zeros(W * n)
        _wait(b.all_to_all_single(out, full.clone(), [], []))
        a2a_want = torch.cat([_value(q, n, seed=rank) for q in range(W)])
        chk.case(f"{gname} all_to_all_single", torch.equal(out, a2a_want), f"{out[:6]}")
        # gather into the root's one tensor, each root, flat and stacked outputs
        gathers = 0
        for root in range(W):
            for shape in ((W * n,), (W, n)):
                out = torch.full(shape, -1.0) if rank == root else None
                dist.gather_single(_value(rank, n, seed=root), out, group_dst=root, group=g)
                gathers += 1
                if rank == root:
                    chk.case(f"{gname} gather_single root={root} {shape}",
                             torch.equal(out.reshape(-1),
                                         torch.cat([_value(q, n, seed=root) for q in range(W)])),
                             f"{out}")
        c = b.get_counters()

        def runs(op, c=c, path=path):
            algorithms = ("wrapped",) if path == "wrapped" else ("direct", "ring")
            return sum(c.get(f"{op}.{a}", 0) for a in algorithms)

        # The workspace counts each pair of a coalesced call, the wrapped backend the call.
        pairs = 2 if path == "direct" else 1
        chk.case(f"{gname} counted as their old names",
                 runs("all_gather") == 3 + pairs and runs("reduce_scatter") == 2 + pairs
                 and runs("all_to_all_single") == 1 and runs("gather") == gathers
                 and (path == "wrapped" or not wrapped(c)),
                 f"{c}")
    return chk.result()


def check_bad_gather_output(ctx):
    """The root's output is too small: every rank raises (the peers told by the root), and the
    group then runs a good gather_single."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"bad gather W={W}")
    out = torch.zeros(W * 4 - 1) if rank == 0 else None
    try:
        dist.gather_single(torch.ones(4), out, group_dst=0)
        chk.case("raised", False, "returned")
    except RuntimeError as e:
        text = str(e)
        chk.case("says what", "contiguous tensor of" in text if rank == 0 else "rank 0" in text,
                 text)
    out = torch.zeros(W * 4) if rank == 0 else None
    dist.gather_single(torch.full((4,), float(rank)), out, group_dst=0)
    if rank == 0:
        chk.case("usable", torch.equal(out, torch.arange(W).repeat_interleave(4).float()),
                 f"{out}")
    return chk.result()


def test_canonical_entries_are_their_old_names(any_world):
    assert_ok(any_world.run(check_entries))


def test_gather_single_bad_output_raises_everywhere(any_world):
    assert_ok(any_world.run(check_bad_gather_output))
