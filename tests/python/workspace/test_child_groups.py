"""Groups made from a cuda_p2p group (issue 50, points 2 and 3) on 2, 3 and 4 ranks: split
(ProcessGroup.split_group, the C++ ProcessGroup::splitGroup that dist.split_group and DeviceMesh
call on GPU jobs), merge (merge_remote_group) and shrink (dist.shrink_group past a rank that
stopped taking part). Each child is a cuda_p2p group whose collectives run on a workspace of its
own, or hierarchically when its ranks span (simulated) hosts; results against plain torch, the
counters say which path ran. NOTE [Child groups] in backend/child_groups.cpp. The SIGKILL case is
in test_faults.py."""

from __future__ import annotations

import datetime
import gc
import os
import time

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, wrapped

if not hasattr(dist, "shrink_group"):  # torch before 2.10
    pytest.skip("this torch cannot shrink groups", allow_module_level=True)
from torch.distributed.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT  # noqa: E402

_made = [0]  # groups made by this worker: names the split children apart


def _wait(work):
    if work is not None:
        work.wait()


def _sum_of_ranks(backend, values):
    """all_reduce of `values` on the backend (one tensor), returned."""
    t = values.clone()
    _wait(backend.allreduce([t]))
    return t


def _check_child(chk, label, child, parent_ranks, rank, uneven_hosts=False):
    """`child` (a ProcessGroup over `parent_ranks`, in that order) is a cuda_p2p group whose
    all_reduce and all-gather are right and ran on its workspace or hierarchically (on hosts of
    uneven sizes the all-gather may run flat, on the wrapped backend)."""
    me = parent_ranks.index(rank)
    chk.case(f"{label} rank/size", (child.rank(), child.size()) == (me, len(parent_ranks)),
             f"{child.rank()}/{child.size()}")
    b = cuda_p2p.get_cuda_p2p_backend(child)
    b.reset_counters()
    t = _sum_of_ranks(b, torch.full((100,), float(rank + 1)))
    want = float(sum(r + 1 for r in parent_ranks))
    chk.case(f"{label} all_reduce", torch.equal(t, torch.full((100,), want)), f"{t[:4]}")
    out = torch.zeros(len(parent_ranks) * 3)
    _wait(b._allgather_base(out, torch.full((3,), float(rank))))
    chk.case(f"{label} all_gather order",
             torch.equal(out, torch.tensor(parent_ranks).float().repeat_interleave(3)), f"{out}")
    c = b.get_counters()
    chk.case(f"{label} not wrapped",
             c and (not wrapped(c) or uneven_hosts and "all_reduce.wrapped" not in c), f"{c}")
    return b


def _split(parent, ranks, **kw):
    """ProcessGroup.split_group, named as dist.split_group names a child: after its ranks (the
    name prefixes the child's store, so two children of one split must be named apart)."""
    _made[0] += 1
    ranks = list(ranks)
    return parent.split_group(ranks, timeout=datetime.timedelta(seconds=60),
                              group_name=f"child{_made[0]}-{'-'.join(map(str, ranks))}", **kw)


def check_split(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"split W={W}")
    parent = dist.group.WORLD
    chk.case("supports_splitting", cuda_p2p.get_cuda_p2p_backend(parent).supports_splitting, "")
    half = W // 2
    cases = [
        ("halves", list(range(half)) if rank < half else list(range(half, W))),
        ("reversed", list(range(W - 1, -1, -1))),
        ("ends", [0, W - 1]),
    ]
    for label, ranks in cases:
        child = _split(parent, ranks)
        if rank not in ranks:
            chk.case(f"{label} non-member", child is None, f"{child}")
            continue
        b = _check_child(chk, label, child, ranks, rank)
        chk.case(f"{label} own workspace", b.is_p2p_available(), b.p2p_unavailable_reason())
        b.shutdown()
        del b, child
        gc.collect()
    # The parent is untouched.
    t = torch.ones(4)
    dist.all_reduce(t)
    chk.case("parent", torch.equal(t, torch.full((4,), float(W))), f"{t}")
    # Options of another backend are refused on every rank, before any rendezvous.
    try:
        _split(parent, range(W), opts=dist.ProcessGroupGloo._Options())
        chk.case("foreign options", False, "accepted")
    except RuntimeError as e:
        chk.case("foreign options", "expected the options of a cuda_p2p group" in str(e), str(e))
    return chk.result()


def check_split_options_and_names(ctx):
    """The child takes the options torch hands it (a copy of the parent's) and its name."""
    chk = Checker(f"split options W={ctx.world_size}")
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.buffer_size = 1 << 18
    parent = dist.new_group(backend="cuda_p2p", pg_options=o)
    child = _split(parent, range(ctx.world_size))
    b = cuda_p2p.get_cuda_p2p_backend(child)
    chk.case("buffer size inherited", b.get_buffer_size() == 1 << 18, f"{b.get_buffer_size()}")
    chk.case("named", b.options.group_name == child.group_name,
             f"{b.options.group_name} vs {child.group_name}")
    chk.case("timeout", b.options._timeout == datetime.timedelta(seconds=60),
             f"{b.options._timeout}")
    b.shutdown()
    dist.destroy_process_group(parent)
    return chk.result()


def _hosts_group(ctx, host_of):
    os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host_of(ctx.rank)}"
    try:
        return dist.new_group(backend="cuda_p2p")
    finally:
        del os.environ["CUDA_P2P_HOST_ID"]


def check_split_across_hosts(ctx):
    """Two simulated hosts {0, 1} and {2, 3}: a child within a host has its workspace, a child
    across both runs hierarchically."""
    rank = ctx.rank
    chk = Checker("split across hosts")
    host = rank // 2
    parent = _hosts_group(ctx, lambda r: r // 2)
    os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host}"
    try:
        same_host = _split(parent, [2 * host, 2 * host + 1])
        across = _split(parent, [0, 2, 1, 3])
    finally:
        del os.environ["CUDA_P2P_HOST_ID"]
    b = _check_child(chk, "one host", same_host, [2 * host, 2 * host + 1], rank)
    chk.case("one host: workspace", b.is_p2p_available(), b.p2p_unavailable_reason())
    b.shutdown()
    b = _check_child(chk, "across", across, [0, 2, 1, 3], rank)
    c = b.get_counters()
    chk.case("across: hierarchical", c.get("all_reduce.hierarchical") == 1, f"{c}")
    b.shutdown()
    dist.destroy_process_group(parent)
    return chk.result()


def check_merge(ctx):
    """Every rank merges its default group into one group through a store: ranks come in the
    order they arrive; the merged group is a cuda_p2p group over all of them."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"merge W={W}")
    _made[0] += 1
    store = dist.PrefixStore(f"merge{_made[0]}/", dist.distributed_c10d._get_default_store())
    merged = dist.group.WORLD.merge_remote_group(store, W, datetime.timedelta(seconds=60))
    b = cuda_p2p.get_cuda_p2p_backend(merged)
    chk.case("size", merged.size() == W, f"{merged.size()}")
    t = _sum_of_ranks(b, torch.full((10,), float(rank + 1)))
    chk.case("all_reduce", torch.equal(t, torch.full((10,), W * (W + 1) / 2)), f"{t[:4]}")
    out = torch.zeros(W)
    _wait(b._allgather_base(out, torch.tensor([float(rank)])))
    chk.case("every rank once", sorted(out.tolist()) == list(map(float, range(W))), f"{out}")
    chk.case("workspace", b.is_p2p_available(), b.p2p_unavailable_reason())
    b.shutdown()
    return chk.result()


def check_shrink(ctx, flags, placement):
    """The last rank stops taking part in a group; the others shrink it away and go on, without
    waiting for it (its mappings of their blocks are not waited for)."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"shrink W={W} flags={flags} {placement}")
    host_of = (lambda r: r // 2) if placement == "2 hosts" else (lambda r: 0)
    g = _hosts_group(ctx, host_of)
    dist.all_reduce(torch.ones(4), group=g)
    # Every rank is out of the all_reduce (whose last phase waits for the peers) before a survivor
    # shrinks: SHRINK_ABORT's abort reaches the other ranks' failure words (NOTE [Failure words]).
    dist.barrier(group=ctx.gloo)
    victim = W - 1
    if rank != victim:
        b = cuda_p2p.get_cuda_p2p_backend(g)
        chk.case("supports_shrinking", b.supports_shrinking, "")
        os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{host_of(rank)}"
        try:
            t0 = time.monotonic()
            small = dist.shrink_group([victim], group=g, shrink_flags=flags)
            elapsed = time.monotonic() - t0
        finally:
            del os.environ["CUDA_P2P_HOST_ID"]
        survivors = list(range(W - 1))
        sb = _check_child(chk, "shrunk", small, survivors, rank,
                          uneven_hosts=placement == "2 hosts")
        chk.case("shrunk: workspace or hierarchy",
                 sb.is_p2p_available() or W - 1 < 2 or placement == "2 hosts",
                 sb.p2p_unavailable_reason())
        # The parent's teardown waits for no dead rank.
        del b, g
        t1 = time.monotonic()
        gc.collect()
        # Well below the group's 60 s timeout (PG_TIMEOUT_S), which a wait for the silent rank would
        # take; loose enough for a loaded 2-core machine.
        chk.case("quick", elapsed + time.monotonic() - t1 < 20.0,
                 f"shrink {elapsed:.1f} s, parent's teardown {time.monotonic() - t1:.1f} s")
        dist.all_reduce(torch.ones(4), group=small)  # registered with torch: dist.* works
        dist.destroy_process_group(small)
    dist.barrier(group=ctx.gloo)
    if rank == victim:
        # torch's shrink_group counted a group on the survivors (the salt of the names of later
        # groups): a victim that lives on in this pool counts it too, or the pool's next new_group
        # would be named apart on its ranks and never meet.
        dist.distributed_c10d._world.group_count += 1
        # Back again, it destroys its group: the survivors closed their mappings long ago.
        t0 = time.monotonic()
        dist.destroy_process_group(g)
        del g
        gc.collect()
        chk.case("the victim's teardown", time.monotonic() - t0 < 20.0,
                 f"{time.monotonic() - t0:.1f} s")
    return chk.result()


def test_split(any_world):
    assert_ok(any_world.run(check_split))


def test_split_takes_torchs_options(world2):
    assert_ok(world2.run(check_split_options_and_names))


def test_split_across_hosts(world4):
    assert_ok(world4.run(check_split_across_hosts))


def test_merge(any_world):
    assert_ok(any_world.run(check_merge))


_slow = pytest.mark.slow  # 3 or more ranks: out of the quick loop (tests/python/conftest.py)


@pytest.mark.parametrize("size,flags,placement", [
    (2, SHRINK_DEFAULT, "1 host"), (2, SHRINK_ABORT, "1 host"),
    pytest.param(3, SHRINK_DEFAULT, "1 host", marks=_slow),
    pytest.param(4, SHRINK_ABORT, "1 host", marks=_slow),
    pytest.param(4, SHRINK_DEFAULT, "2 hosts", marks=_slow)])
def test_shrink_past_a_silent_rank(size, flags, placement, request):
    assert_ok(request.getfixturevalue(f"world{size}").run(check_shrink, flags, placement))


def test_the_fresh_nccl_factory_sets_only_options_torch_has():
    """NOTE [Shrinking a CUDA backend never used] in backend/child_groups.cpp: the factory a shrink
    calls for a fresh NCCL (python/cuda_p2p/_backend.py) runs only on a GPU machine; here, the
    NCCL options it sets exist on this torch with the types it gives them (a rename would
    otherwise first show at a GPU job's shrink)."""
    if not dist.is_nccl_available():
        pytest.skip("torch built without NCCL")
    from cuda_p2p import _backend

    template = dist.ProcessGroupNCCL.Options()
    template.is_high_priority_stream = True
    made = {}

    class Recording:  # what ProcessGroupNCCL would be given
        def __init__(self, store, rank, size, options):
            made.update(store=store, rank=rank, size=size, options=options)

    real = dist.ProcessGroupNCCL
    try:
        dist.ProcessGroupNCCL = Recording
        dist.ProcessGroupNCCL.Options = real.Options
        _backend._fresh_nccl_factory(template, "7")(
            "store", 1, 3, datetime.timedelta(seconds=42), [0, 2, 5])
    finally:
        dist.ProcessGroupNCCL = real
    o = made["options"]
    assert (made["rank"], made["size"]) == (1, 3)
    assert o.is_high_priority_stream and o._timeout == datetime.timedelta(seconds=42)
    assert list(o.global_ranks_in_group) == [0, 2, 5] and o.group_name == "7/shrunk"
