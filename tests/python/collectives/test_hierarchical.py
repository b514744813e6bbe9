"""Hierarchical collectives on groups spanning (simulated) hosts (backend/hierarchical.hpp).

Hosts are simulated per rank with CUDA_P2P_HOST_ID, set while the group is created. Every result
is compared with the same collective on the Gloo reference group over the same ranks; the
counters must show that the hierarchical path ran (or, where it cannot, the flat fallback).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _reference import reduce_over_ranks
from cuda_p2p import _C

# What the workspace and Gloo (the inter-host backend, and the reference) both reduce: Gloo
# reduces no int16 (test_fallbacks_are_counted), though it is moved hierarchically.
REDUCIBLE = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
             torch.uint8, torch.int32, torch.int64]
MOVABLE = REDUCIBLE + [torch.int16, torch.bool]
# Sizes in elements per rank: 1, odd, and more than the ranks of a host can split evenly.
SIZES = [1, 7, 1023]

# Host of each rank, by placement name.
PLACEMENTS = {
    "2x2": lambda r, w: r // 2,
    "3+1": lambda r, w: 0 if r < 3 else 1,
    "r%2": lambda r, w: r % 2,        # non-contiguous: ranks 0, 2 on one host, 1, 3 on the other
    "2x3": lambda r, w: r // 3,
    "2x3r%2": lambda r, w: r % 2,    # 6 ranks, hosts {0, 2, 4} and {1, 3, 5}
    "2+1": lambda r, w: 0 if r < 2 else 1,
    "1+1": lambda r, w: r,           # 2 ranks, one per host: no intra-host step
}

# The groups of this worker process, by placement (created once per pool).
_GROUPS: dict = {}


def _group(ctx, placement: str, **options):
    key = (placement, tuple(sorted(options.items())))
    if key not in _GROUPS:
        host = PLACEMENTS[placement](ctx.rank, ctx.world_size)
        os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host}"
        try:
            pg_options = None
            if options:
                pg_options = cuda_p2p.ProcessGroupCudaP2P.Options()
                for k, v in options.items():
                    setattr(pg_options, k, v)
            _GROUPS[key] = dist.new_group(backend="cuda_p2p", pg_options=pg_options)
        finally:
            del os.environ["CUDA_P2P_HOST_ID"]
    return _GROUPS[key]


def _values(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    # Small integers: every sum, in any order, is exact in every dtype (bfloat16 included).
    v = (torch.arange(n) * 7 + rank * 3 + salt) % 11
    if dtype == torch.bool:
        return (v % 2).to(torch.bool)
    if dtype.is_floating_point:
        return (v - 5).to(dtype) / 2
    if dtype in (torch.uint8,):
        return v.to(dtype)
    return (v - 5).to(dtype)


def _product_values(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    # Factors in {1, 2}: a product over 6 ranks stays exact and in range of int8.
    return ((torch.arange(n) + rank) % 3 == 0).to(dtype) + 1


def _ops_for(dtype):
    R = dist.ReduceOp
    if dtype.is_floating_point:
        return [R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT]
    return [R.SUM, R.MAX, R.MIN, R.PRODUCT, R.BAND, R.BOR, R.BXOR]


def _reference_all_reduce(ctx, rank_input, op):
    """The all-reduce of `rank_input(r)` over every rank r: the plain-torch reference
    (_reference.py), computed here."""
    return reduce_over_ranks(op.name, [rank_input(r) for r in range(ctx.world_size)])


def _tol(dtype, op):
    if op == dist.ReduceOp.AVG and dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 1e-2}
    if op == dist.ReduceOp.AVG:
        return {"rtol": 1e-6, "atol": 1e-6}
    return {"rtol": 0, "atol": 0}


def _delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


# An all-reduce of at most this many bytes, accumulated (float16 / bfloat16 in float32), rides in
# the group's agreement (NOTE [Hierarchical agreement] in backend/hierarchy_agreement.cpp).
INLINE_BYTES = 4096


def _in_agreement(n: int, dtype: torch.dtype) -> bool:
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return 0 < n * torch.empty((), dtype=dtype).element_size() <= INLINE_BYTES


# ---------------------------------------------------------------------------------------------
# functions run on every rank


def _layout(ctx, placement):
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    assert not backend.is_p2p_available()
    h = backend.hierarchy()
    assert h is not None
    expect_host = PLACEMENTS[placement](ctx.rank, ctx.world_size)
    hosts = h["hosts"]
    assert ctx.rank in hosts[h["host"]]
    assert hosts[h["host"]].index(ctx.rank) == h["local_rank"]
    # Every rank of this rank's host, and only those, share its simulated host.
    same = [r for r in range(ctx.world_size)
            if PLACEMENTS[placement](r, ctx.world_size) == expect_host]
    assert hosts[h["host"]] == same
    assert h["intra"].is_p2p_available(), h["intra"].p2p_unavailable_reason()
    assert (h["intra"].rank(), h["intra"].size()) == (h["local_rank"], len(same))
    return {"hosts": hosts, "even": h["even"], "has_inter": h["inter"] is not None}


def _all_reduce(ctx, placement, dtypes):
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    intra = backend.hierarchy()["intra"]
    before, intra_before = backend.get_counters(), intra.get_counters()
    runs = inline = 0
    for dtype in dtypes:
        for n in SIZES:
            for op in _ops_for(dtype):
                inline += _in_agreement(n, dtype)
                if op == dist.ReduceOp.PRODUCT:
                    def rank_input(r, n=n, dtype=dtype):
                        return _product_values(r, n, dtype)
                else:
                    def rank_input(r, n=n, dtype=dtype):
                        return _values(r, n, dtype)
                got = rank_input(ctx.rank).clone()
                dist.all_reduce(got, op=op, group=group)
                torch.testing.assert_close(got, _reference_all_reduce(ctx, rank_input, op),
                                           **_tol(dtype, op), msg=f"{dtype} n={n} {op}")
                runs += 1
    # A non-contiguous tensor (a transposed view) is reduced in place.
    base = _values(ctx.rank, 15, torch.float32).reshape(3, 5)
    got = base.clone().t()
    dist.all_reduce(got, group=group)
    ref = _reference_all_reduce(
        ctx, lambda r: _values(r, 15, torch.float32).reshape(3, 5), dist.ReduceOp.SUM)
    torch.testing.assert_close(got, ref.t(), rtol=0, atol=0)
    runs += 1
    inline += 1
    # Every size again with its steps (the agreement off: what runs above the inline size).
    _C._testing.set_hierarchical_agreement(backend, False)
    try:
        for dtype in dtypes[:2]:
            for n in SIZES:
                got = _values(ctx.rank, n, dtype)
                dist.all_reduce(got, group=group)
                want = _reference_all_reduce(ctx, lambda r: _values(r, n, dtype),
                                             dist.ReduceOp.SUM)
                torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"steps {dtype} n={n}")
                runs += 1
    finally:
        _C._testing.set_hierarchical_agreement(backend, True)
    # The intra-host steps ran on the host's workspace, never on its wrapped Gloo.
    intra_paths = _delta(intra_before, intra.get_counters())
    assert intra.size() == 1 or intra_paths, intra_paths
    assert not any(k.endswith(".wrapped") for k in intra_paths), intra_paths
    return runs, inline, _delta(before, backend.get_counters())


def _all_reduce_op(ctx, placement):
    # The dispatcher op (torch.ops.cuda_p2p.all_reduce_, and its wrapper) takes the paths of
    # dist.all_reduce: hierarchical on a group spanning hosts, not the flat wrapped backend.
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    before = backend.get_counters()
    runs = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for n in SIZES:
            for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
                got = _values(ctx.rank, n, dtype)
                out = torch.ops.cuda_p2p.all_reduce_(got, name, group.group_name)
                assert out is got
                want = _reference_all_reduce(ctx, lambda r: _values(r, n, dtype), op)
                torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{dtype} n={n} {name}")
                runs += 1
    # avg through the Python wrapper; a non-contiguous (transposed) view, reduced in place.
    base = _values(ctx.rank, 15, torch.float32).reshape(3, 5)
    got = base.clone().t()
    cuda_p2p.all_reduce_(got, "avg", group)
    want = _reference_all_reduce(
        ctx, lambda r: _values(r, 15, torch.float32).reshape(3, 5), dist.ReduceOp.AVG)
    torch.testing.assert_close(got, want.t(), **_tol(torch.float32, dist.ReduceOp.AVG))
    runs += 1
    # The functional form returns a new tensor and leaves its input alone.
    x = _values(ctx.rank, 7, torch.float32)
    y = torch.ops.cuda_p2p.all_reduce(x, "sum", group.group_name)
    torch.testing.assert_close(x, _values(ctx.rank, 7, torch.float32), rtol=0, atol=0)
    want = _reference_all_reduce(ctx, lambda r: _values(r, 7, torch.float32), dist.ReduceOp.SUM)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    runs += 1
    return runs, _delta(before, backend.get_counters())


def _gather_scatter(ctx, placement, dtypes):
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    w = ctx.world_size
    before = backend.get_counters()
    runs = {"all_gather": 0, "reduce_scatter": 0}
    for dtype in dtypes:
        for n in SIZES:
            x = _values(ctx.rank, n, dtype)
            # all_gather_into_tensor; the reference: every rank's values, computed here
            ref = torch.cat([_values(r, n, dtype) for r in range(w)])
            out = torch.empty(n * w, dtype=dtype)
            dist.all_gather_into_tensor(out, x, group=group)
            torch.testing.assert_close(out, ref, rtol=0, atol=0, msg=f"{dtype} n={n}")
            # list all_gather, outputs of another shape with the same number of elements
            outs = [torch.full((1, n), 99).to(dtype) for _ in range(w)]
            dist.all_gather(outs, x, group=group)
            for r in range(w):
                torch.testing.assert_close(outs[r].view(-1), ref[r * n:(r + 1) * n], rtol=0,
                                           atol=0)
            runs["all_gather"] += 2
            if dtype not in REDUCIBLE:
                continue
            for op in _ops_for(dtype):
                if op == dist.ReduceOp.PRODUCT:
                    def rank_input(r, n=n, dtype=dtype):
                        return _product_values(r, n * w, dtype)
                else:
                    def rank_input(r, n=n, dtype=dtype):
                        return _values(r, n * w, dtype, salt=5)
                big = rank_input(ctx.rank)
                full = _reference_all_reduce(ctx, rank_input, op)
                want = full[ctx.rank * n:(ctx.rank + 1) * n]
                got = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(got, big, op=op, group=group)
                torch.testing.assert_close(got, want, **_tol(dtype, op), msg=f"{dtype} n={n} {op}")
                got_list = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(got_list, list(big.chunk(w)), op=op, group=group)
                torch.testing.assert_close(got_list, want, **_tol(dtype, op),
                                           msg=f"list {dtype} n={n} {op}")
                runs["reduce_scatter"] += 2
    return runs, _delta(before, backend.get_counters())


def _coalesced(ctx, placement):
    # all_gather_into_tensor / reduce_scatter_tensor under _coalescing_manager (FSDP's calls).
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    w = ctx.world_size
    before = backend.get_counters()
    runs = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        ins = [_values(ctx.rank, n, dtype, salt=k) for k, n in enumerate(SIZES)]
        outs = [torch.empty(n * w, dtype=dtype) for n in SIZES]
        with dist._coalescing_manager(group=group):
            for o, t in zip(outs, ins):
                dist.all_gather_into_tensor(o, t, group=group)
        for k, (o, n) in enumerate(zip(outs, SIZES)):
            want = torch.cat([_values(r, n, dtype, salt=k) for r in range(w)])
            torch.testing.assert_close(o, want, rtol=0, atol=0)
        bigs = [_values(ctx.rank, n * w, dtype, salt=k) for k, n in enumerate(SIZES)]
        rs = [torch.empty(n, dtype=dtype) for n in SIZES]
        with dist._coalescing_manager(group=group):
            for o, t in zip(rs, bigs):
                dist.reduce_scatter_tensor(o, t, group=group)
        for k, (o, n) in enumerate(zip(rs, SIZES)):
            full = _reference_all_reduce(
                ctx, lambda r: _values(r, n * w, dtype, salt=k), dist.ReduceOp.SUM)
            want = full[ctx.rank * n:(ctx.rank + 1) * n]
            torch.testing.assert_close(o, want, rtol=0, atol=0)
        runs += len(SIZES)
    return runs, _delta(before, backend.get_counters())


def _broadcast(ctx, placement, dtypes):
    group = _group(ctx, placement)
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    before = backend.get_counters()
    runs = 0
    for dtype in dtypes:
        for n in SIZES:
            for root in range(ctx.world_size):
                got = _values(ctx.rank, n, dtype, salt=root)
                dist.broadcast(got, src=root, group=group)
                ref = _values(root, n, dtype, salt=root)  # the root's values, computed here
                torch.testing.assert_close(got, ref, rtol=0, atol=0,
                                           msg=f"{dtype} n={n} root={root}")
                runs += 1
    # A non-contiguous tensor.
    base = _values(ctx.rank, 12, torch.float32, salt=1).reshape(3, 4)
    got, ref = base.clone().t(), base.clone().t()
    dist.broadcast(got, src=ctx.world_size - 1, group=group)
    dist.broadcast(ref, src=ctx.world_size - 1, group=ctx.gloo)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    runs += 1
    return runs, _delta(before, backend.get_counters())


def _two_groups_interleaved(ctx):
    # Two hierarchical groups with different layouts, used in turn: nothing is shared.
    a, b = _group(ctx, "2x2"), _group(ctx, "r%2")
    ba, bb = cuda_p2p.get_cuda_p2p_backend(a), cuda_p2p.get_cuda_p2p_backend(b)
    assert ba.hierarchy()["intra"] is not bb.hierarchy()["intra"]
    before_a, before_b = ba.get_counters(), bb.get_counters()
    for i in range(5):
        x = _values(ctx.rank, 33 + i, torch.float32, salt=i)
        ga, gb, ref = x.clone(), x.clone(), x.clone()
        dist.all_reduce(ga, group=a)
        dist.all_reduce(gb, group=b)
        dist.all_reduce(ref, group=ctx.gloo)
        torch.testing.assert_close(ga, ref, rtol=0, atol=0)
        torch.testing.assert_close(gb, ref, rtol=0, atol=0)
    return (_delta(before_a, ba.get_counters()), _delta(before_b, bb.get_counters()))


def _fallbacks(ctx):
    group = _group(ctx, "2x2")
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    before = backend.get_counters()
    # bool: not a dtype the workspace reduces: flat on Gloo, counted with the reason.
    x = _values(ctx.rank, 9, torch.bool)
    got, ref = x.clone(), x.clone()
    dist.all_reduce(got, group=group)
    dist.all_reduce(ref, group=ctx.gloo)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    # int16: Gloo reduces none: flat, where Gloo reports it.
    with pytest.raises(RuntimeError, match="Invalid scalar type"):
        dist.all_reduce(_values(ctx.rank, 3, torch.int16), group=group)
    # A bitwise op on floats fails on every path, as with Gloo.
    with pytest.raises(RuntimeError, match="non-integral dtype"):
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=group)
    # The group is still usable afterwards.
    y = _values(ctx.rank, 5, torch.int32)
    got, ref = y.clone(), y.clone()
    dist.all_reduce(got, group=group)
    dist.all_reduce(ref, group=ctx.gloo)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    return _delta(before, backend.get_counters())


def _knob_off(ctx, how):
    if how == "option":
        group = _group(ctx, "2x2", hierarchical=False)
    else:
        # One rank says off: every rank runs flat (the sub-groups would need all of them).
        os.environ["CUDA_P2P_HIERARCHICAL"] = "0" if ctx.rank == 1 else "1"
        host = PLACEMENTS["r%2"](ctx.rank, ctx.world_size)
        os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host}"
        try:
            group = dist.new_group(backend="cuda_p2p")
        finally:
            os.environ.pop("CUDA_P2P_HOST_ID", None)
            del os.environ["CUDA_P2P_HIERARCHICAL"]
    backend = cuda_p2p.get_cuda_p2p_backend(group)
    assert backend.hierarchy() is None
    before = backend.get_counters()
    x = _values(ctx.rank, 10, torch.float32)
    got, ref = x.clone(), x.clone()
    dist.all_reduce(got, group=group)
    dist.all_reduce(ref, group=ctx.gloo)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    result = _delta(before, backend.get_counters())
    if how != "option":
        dist.destroy_process_group(group)
    return result


def _destroy_and_recreate(ctx):
    # A hierarchical group is destroyed (its host workspaces closed) and a new one works.
    for _ in range(2):
        host = PLACEMENTS["2x2"](ctx.rank, ctx.world_size)
        os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host}"
        try:
            group = dist.new_group(backend="cuda_p2p")
        finally:
            del os.environ["CUDA_P2P_HOST_ID"]
        x = _values(ctx.rank, 100, torch.int64)
        got, ref = x.clone(), x.clone()
        dist.all_reduce(got, group=group)
        dist.all_reduce(ref, group=ctx.gloo)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
        assert cuda_p2p.get_cuda_p2p_backend(group).get_counters()["all_reduce.hierarchical"] == 1
        dist.destroy_process_group(group)
    return True


# ---------------------------------------------------------------------------------------------
# tests

CASES = [("world2", "1+1"), ("world3", "2+1"), ("world4", "2x2"), ("world4", "3+1"),
         ("world4", "r%2"), ("world6", "2x3"), ("world6", "2x3r%2")]
# Hosts of unequal sizes: the steps through the leaders (hierarchical_leaders).
UNEVEN = ("3+1", "2+1")


def _path(placement):
    return "hierarchical_leaders" if placement in UNEVEN else "hierarchical"


@pytest.mark.parametrize("pool,placement", CASES, ids=[c[1] for c in CASES])
def test_layout(request, pool, placement):
    world = request.getfixturevalue(pool)
    results = world.run(_layout, placement)
    assert all((r["hosts"], r["even"]) == (results[0]["hosts"], results[0]["even"])
               for r in results)
    assert results[0]["even"] == (placement not in UNEVEN)
    # Local index 0 exists on every host: its ranks always have an inter-host backend.
    hosts = results[0]["hosts"]
    for h in hosts:
        assert results[h[0]]["has_inter"]
    if placement == "3+1":
        assert [results[r]["has_inter"] for r in range(4)] == [True, False, False, True]


@pytest.mark.parametrize("pool,placement", CASES, ids=[c[1] for c in CASES])
def test_all_reduce(request, pool, placement):
    world = request.getfixturevalue(pool)
    dtypes = REDUCIBLE if placement in ("2x2", "3+1", "2x3") else [torch.float32, torch.int32]
    results = world.run(_all_reduce, placement, dtypes)
    for runs, inline, counters in results:
        assert counters == {f"all_reduce.{_path(placement)}": runs,
                            "all_reduce.in_agreement": inline}, counters


OP_CASES = [("world2", "1+1"), ("world4", "2x2"), ("world4", "3+1"), ("world4", "r%2")]


@pytest.mark.parametrize("pool,placement", OP_CASES, ids=[c[1] for c in OP_CASES])
def test_all_reduce_dispatcher_op(request, pool, placement):
    world = request.getfixturevalue(pool)
    for runs, counters in world.run(_all_reduce_op, placement):
        # Every call is small enough to ride in the agreement.
        assert counters == {f"all_reduce.{_path(placement)}": runs,
                            "all_reduce.in_agreement": runs}, counters


@pytest.mark.parametrize("pool,placement", CASES, ids=[c[1] for c in CASES])
def test_all_gather_and_reduce_scatter(request, pool, placement):
    world = request.getfixturevalue(pool)
    dtypes = MOVABLE if placement in ("2x2", "3+1", "2x3") else [
        torch.bfloat16, torch.int64]
    results = world.run(_gather_scatter, placement, dtypes)
    for runs, counters in results:
        assert counters == {f"all_gather.{_path(placement)}": runs["all_gather"],
                            f"reduce_scatter.{_path(placement)}": runs["reduce_scatter"]}, counters


@pytest.mark.parametrize("pool,placement", CASES, ids=[c[1] for c in CASES])
def test_broadcast(request, pool, placement):
    world = request.getfixturevalue(pool)
    dtypes = [torch.float32, torch.bfloat16, torch.int8, torch.int16, torch.bool]
    results = world.run(_broadcast, placement, dtypes)
    for runs, counters in results:
        assert sum(v for k, v in counters.items() if k.startswith("broadcast.hierarchical")) == runs
        if placement in UNEVEN:
            # Roots whose local index the one-rank host lacks go through the leaders.
            assert counters.get("broadcast.hierarchical_leaders", 0) > 0, counters
            assert counters.get("broadcast.hierarchical", 0) > 0, counters
        else:
            assert counters == {"broadcast.hierarchical": runs}, counters


@pytest.mark.parametrize("placement", ["2x2", "3+1"])
def test_coalesced(world4, placement):
    for runs, counters in world4.run(_coalesced, placement):
        assert counters == {f"all_gather.{_path(placement)}": runs,
                            f"reduce_scatter.{_path(placement)}": runs}, counters


def test_two_groups_side_by_side(world4):
    for a, b in world4.run(_two_groups_interleaved):
        want = {"all_reduce.hierarchical": 5, "all_reduce.in_agreement": 5}
        assert a == want and b == want, (a, b)


def test_fallbacks_are_counted(world4):
    for counters in world4.run(_fallbacks):
        assert counters.get("all_reduce.flat.dtype") == 2, counters
        assert counters.get("all_reduce.wrapped") == 2, counters
        assert counters.get("all_reduce.hierarchical") == 1, counters


@pytest.mark.parametrize("how", ["option", "env_on_one_rank"])
def test_knob_turns_it_off(world4, how):
    for counters in world4.run(_knob_off, how):
        assert counters == {"all_reduce.wrapped": 1}, counters


def test_destroy_and_recreate(world4):
    assert all(world4.run(_destroy_and_recreate))
