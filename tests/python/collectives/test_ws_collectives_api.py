"""The workspace collectives' API through torch.distributed, on 2, 3 and 4 ranks (the algorithms'
results: test_ws_collectives.py).

Async Works and futures, non-contiguous tensors, the fallbacks to Gloo and the off switches, errors
of the same type as Gloo's; synchronous calls that return no Work (NOTE [No Work for a synchronous
call]) and the callers that still get one; algorithms forced through the environment; a rank that
never arrives, a late rank that learns of the failure, Work.wait(timeout); DDP against Gloo.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

import cuda_p2p
from _checks import assert_ok, names_rank, raises
from _groups import cached_group, group_that_times_out
from _harness import HOST_CUDA_SEMANTICS
from test_ws_collectives import Checker, R


def check_api_and_fallbacks(ctx):
    """The dist.* surface: async works and futures, non-contiguous tensors, barrier, fallbacks
    for what the workspace does not run, the off switches, and errors like Gloo's."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"api W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    # Async works: completed, wait() is True, the future holds the outputs.
    t = torch.full((5,), float(rank))
    w = dist.all_reduce(t, async_op=True)
    v = w.get_future().wait()
    chk.case("async all_reduce", w.is_completed() and w.wait() and v[0] is not None
             and torch.equal(v[0], t) and torch.equal(t, torch.full((5,), W * (W - 1) / 2)), "")
    out = torch.empty(3 * W)
    w = dist.all_gather_into_tensor(out, torch.full((3,), float(rank)), async_op=True)
    w.wait()
    chk.case("async all_gather_into_tensor", torch.equal(torch.cat(w.get_future().wait()), out), "")
    rs = torch.empty(2)
    w = dist.reduce_scatter_tensor(rs, torch.ones(2 * W), async_op=True)
    chk.case("async reduce_scatter_tensor", w.wait() and torch.equal(w.get_future().wait()[0], rs)
             and torch.equal(rs, torch.full((2,), float(W))), f"{rs}")
    # then() callbacks (what DDP comm hooks do).
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    chk.case("future.then", torch.equal(fut.wait(), torch.full((4,), 2.0 * W)), "")
    # Non-contiguous tensors go through the workspace via contiguous copies.
    base = torch.zeros(4, 3)
    col = base[:, 1]
    col.fill_(float(rank + 1))
    dist.all_reduce(col)
    chk.case("non-contiguous all_reduce", torch.equal(base[:, 1], torch.full((4,), W * (W + 1) / 2))
             and torch.equal(base[:, 0], torch.zeros(4)), f"{base}")
    gathered = torch.zeros(3, 2 * W).t()  # non-contiguous output
    dist.all_gather_into_tensor(gathered, torch.full((2, 3), float(rank)))
    chk.case("non-contiguous all_gather output",
             torch.equal(gathered,
                         torch.arange(W).repeat_interleave(2)[:, None].float().expand(2 * W, 3)),
             f"{gathered}")
    dist.barrier()
    counters = b.get_counters()
    chk.case("workspace counters", counters.get("barrier.workspace") == 1
             and counters.get("all_reduce.one_shot", 0) >= 3
             and not any(k.endswith(".wrapped") for k in counters), f"{counters}")
    # What the workspace does not run goes to Gloo, counted.
    b.reset_counters()
    flags = torch.tensor([rank % 2 == 0, True, False])
    ref = flags.clone()
    dist.all_reduce(flags)
    dist.all_reduce(ref, group=ctx.gloo)
    chk.case("bool all_reduce falls back", torch.equal(flags, ref)
             and b.get_counters().get("all_reduce.wrapped") == 1, f"{b.get_counters()}")
    z = torch.full((3,), complex(rank, 1))
    dist.all_reduce(z)
    # (torch.distributed hands complex sums over as a float32 view: the workspace runs them.)
    chk.case("complex all_reduce", torch.allclose(z, torch.full((3,), complex(W * (W - 1) / 2, W)))
             and b.get_counters().get("all_reduce.one_shot") == 1, f"{b.get_counters()}")
    # Errors of the same type as Gloo's, on every rank, and the group still works afterwards.
    for what, call in (
        ("AVG on int64",
         lambda grp: dist.all_reduce(torch.ones(3, dtype=torch.int64), op=R.AVG, group=grp)),
        ("BAND on float", lambda grp: dist.all_reduce(torch.ones(3), op=R.BAND, group=grp)),
        ("PREMUL_SUM", lambda grp: dist.all_reduce(
            torch.ones(3), op=dist._make_nccl_premul_sum(2.0), group=grp)),
        ("all_gather_into_tensor wrong size",
         lambda grp: dist.all_gather_into_tensor(torch.empty(3 * W + 1), torch.ones(3), group=grp)),
    ):
        errs = []
        for grp in (ctx.gloo, g):
            try:
                call(grp)
                errs.append(None)
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        chk.case(what, errs[0] is not None and errs[1] is not None
                 and type(errs[0]) is type(errs[1]), f"gloo {errs[0]!r}, cuda_p2p {errs[1]!r}")
        chk.cases += 1
    t = torch.ones(3)
    dist.all_reduce(t)
    chk.case("still works", torch.equal(t, torch.full((3,), float(W))), f"{t}")
    # The off switches: Options.enable_workspace=False, CUDA_P2P_DISABLE_WORKSPACE=1 (no
    # workspace at all), Options.workspace_collectives=False, CUDA_P2P_WORKSPACE_COLLECTIVES=0
    # (the workspace stays up, the collectives go to Gloo).
    for key, grp in (("option", cached_group("off", enable_workspace=False)),
                     ("env", cached_group("env-off", env={"CUDA_P2P_DISABLE_WORKSPACE": "1"})),
                     ("collectives option", cached_group("coll-off", workspace_collectives=False)),
                     ("collectives env",
                      cached_group("coll-env-off", env={"CUDA_P2P_WORKSPACE_COLLECTIVES": "0"}))):
        bb = cuda_p2p.get_cuda_p2p_backend(grp)
        bb.reset_counters()
        t = torch.full((6,), float(rank))
        dist.all_reduce(t, group=grp)
        out = torch.empty(2 * W)
        dist.all_gather_into_tensor(out, torch.full((2,), float(rank)), group=grp)
        rs = torch.empty(2)
        dist.reduce_scatter_tensor(rs, torch.ones(2 * W), group=grp)
        dist.broadcast(t, src=0, group=grp)
        dist.barrier(group=grp)
        c = bb.get_counters()
        chk.case(f"workspace off by {key}", bb.is_p2p_available() == key.startswith("collectives")
                 and bb.get_collective_config()["workspace_collectives"] is False
                 and c == {"all_reduce.wrapped": 1, "all_gather.wrapped": 1,
                           "reduce_scatter.wrapped": 1, "broadcast.wrapped": 1,
                           "barrier.wrapped": 1}, f"{c}")
        chk.case(f"workspace off by {key}: values",
                 torch.equal(t, torch.full((6,), W * (W - 1) / 2))
                 and torch.equal(rs, torch.full((2,), float(W))), "")
        chk.cases += 1
    chk.cases += 10
    return chk.result()


def _opts(name, async_op, **fields):
    o = getattr(torch._C._distributed_c10d, name)()
    o.asyncOp = async_op
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _call_each_collective(pg, W, rank, async_op):
    """Each workspace collective called on ProcessGroup `pg` as torch.distributed's Python API
    calls it, with the options' asyncOp set: {name: (what it returned, its output)}."""
    out = {}
    t = torch.arange(6.0) + rank
    out["allreduce"] = (pg.allreduce([t], _opts("AllreduceOptions", async_op)), t)
    t = torch.arange(5.0) * (rank + 1)
    out["broadcast"] = (pg.broadcast([t], _opts("BroadcastOptions", async_op, rootRank=W - 1)), t)
    o = torch.empty(3 * W)
    out["_allgather_base"] = (
        pg._allgather_base(o, torch.full((3,), float(rank)), _opts("AllgatherOptions", async_op)),
        o)
    lst = [torch.empty(2) for _ in range(W)]
    out["allgather"] = (pg.allgather([lst], [torch.full((2,), rank + 0.5)],
                                     _opts("AllgatherOptions", async_op)), lst)
    o = torch.empty(2)
    out["_reduce_scatter_base"] = (
        pg._reduce_scatter_base(o, torch.arange(2.0 * W) * (rank + 1),
                                _opts("ReduceScatterOptions", async_op)), o)
    o = torch.empty(3)
    out["reduce_scatter"] = (
        pg.reduce_scatter([o], [[torch.full((3,), float(rank + q)) for q in range(W)]],
                          _opts("ReduceScatterOptions", async_op)), o)
    out["barrier"] = (pg.barrier(_opts("BarrierOptions", async_op)), None)
    return out


def check_sync_calls_return_no_work(ctx):
    """NOTE [No Work for a synchronous call]: on the host a synchronous workspace collective
    returns no Work (torch.distributed then skips a wait it does not need) and an async one a
    completed Work, with Gloo's values either way; the callers that need a Work still get one
    (allow_inflight_collective_as_graph_input, functional collectives, the profiler's boxing)."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"no Work W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    ref = _call_each_collective(ctx.gloo, W, rank, False)
    for w, _ in ref.values():
        w.wait()
    for async_op in (False, True):
        got = _call_each_collective(g, W, rank, async_op)
        for name, (w, out) in got.items():
            chk.cases += 1
            if async_op:
                chk.case(f"{name} async: a completed Work", w is not None and w.wait()
                         and w.is_completed(), f"{w!r}")
            elif HOST_CUDA_SEMANTICS:  # queued, as on a GPU: the caller waits
                chk.case(f"{name} sync: a Work", w is not None and w.wait(), f"{w!r}")
            else:
                chk.case(f"{name} sync: no Work", w is None, f"{w!r}")
            want = ref[name][1]
            if isinstance(out, list):
                out, want = torch.cat(out), torch.cat(want)
            chk.case(f"{name} async={async_op}: Gloo's values",
                     out is None or torch.equal(out, want), f"{out} vs {want}")
    counters = b.get_counters()
    chk.case("all on the workspace", counters.get("barrier.workspace") == 2
             and not any(k.endswith(".wrapped") for k in counters), f"{counters}")
    # torch's inflight-collective registry keeps the Work of every call for wait_tensor.
    from torch.distributed._functional_collectives import (
        all_reduce as funcol_all_reduce,
        allow_inflight_collective_as_graph_input_ctx,
    )
    t = torch.full((4,), float(rank))
    with allow_inflight_collective_as_graph_input_ctx():
        w = g.allreduce([t], _opts("AllreduceOptions", False))
        torch.ops._c10d_functional.wait_tensor(t)
    chk.case("inflight registry: a Work", w is not None and w.is_completed(), f"{w!r}")
    chk.case("inflight registry: values", torch.equal(t, torch.full((4,), W * (W - 1) / 2)), f"{t}")
    # Functional collectives (what torch.compile traces) register the Work they get.
    y = funcol_all_reduce(torch.full((3,), rank + 1.0), "sum", g)
    y = y.wait() if hasattr(y, "wait") else y
    chk.case("functional all_reduce", torch.equal(y, torch.full((3,), W * (W + 1) / 2)), f"{y}")
    # The profiler boxes the c10d op's outputs, the (absent) Work included.
    t = torch.ones(5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(5 * W), t)
    names = {e.key for e in prof.key_averages()}
    chk.case("profiled: values", torch.equal(t, torch.full((5,), float(W))), f"{t}")
    chk.case("profiled: the c10d ops recorded",
             {"c10d::allreduce_", "c10d::_allgather_base_"} <= names, f"{sorted(names)[:40]}")
    chk.cases += 4
    return chk.result()


def check_env_forcing(ctx):
    """CUDA_P2P_*_ALGO and CUDA_P2P_RING_STEPS force algorithms; an Options value wins."""
    W = ctx.world_size
    chk = Checker(f"env W={W}")
    env = {"CUDA_P2P_ALL_GATHER_ALGO": "ring", "CUDA_P2P_REDUCE_SCATTER_ALGO": "ring",
           "CUDA_P2P_ALL_REDUCE_ALGO": "two_shot", "CUDA_P2P_RING_STEPS": str(2 * W),
           "CUDA_P2P_CHUNK_BYTES": "4096"}
    g = cached_group("env-forced", env=env)
    g2 = cached_group("env-and-option", env=env, all_reduce_algo="one_shot")
    cfg = cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()
    chk.case("config", cfg["all_gather_algo"] == "ring" and cfg["reduce_scatter_algo"] == "ring"
             and cfg["all_reduce_algo"] == "two_shot" and cfg["ring_steps"] == 2 * W
             and cfg["chunk_bytes"] == 4096, f"{cfg}")
    chk.case("option wins", cuda_p2p.get_cuda_p2p_backend(g2).get_collective_config()[
        "all_reduce_algo"] == "one_shot", "")
    t = torch.arange(20000, dtype=torch.float32)
    dist.all_reduce(t, group=g)
    out = torch.empty(100 * W)
    dist.all_gather_into_tensor(out, torch.ones(100), group=g)
    rs = torch.empty(5000)
    dist.reduce_scatter_tensor(rs, torch.ones(5000 * W), group=g)
    c = cuda_p2p.get_cuda_p2p_backend(g).get_counters()
    chk.case("counters", c == {"all_reduce.two_shot": 1, "all_gather.ring": 1,
                               "reduce_scatter.ring": 1}, f"{c}")
    chk.case("values", torch.equal(t, torch.arange(20000, dtype=torch.float32) * W)
             and torch.equal(rs, torch.full((5000,), float(W))), "")
    chk.cases += 4
    return chk.result()


def check_timeout_names_the_missing_rank(ctx):
    """A rank that never calls: the others' collective fails naming it; later collectives on that
    group refuse to run (its ranks no longer agree on the workspace's state)."""
    W, rank = ctx.world_size, ctx.rank
    g = group_that_times_out(ctx, 1)
    absent = W - 1
    out = {"error": None, "after": None}
    if rank != absent:
        out["error"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
        out["after"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


def check_a_late_rank_learns_of_the_failure(ctx):
    """Rank 0's all_reduce times out before rank 1 calls it; rank 1's call, later, must raise
    naming rank 0 rather than complete on the signals and data rank 0 left behind (NOTE [Failed
    groups]: the failure reaches the peers' failure words)."""
    g = group_that_times_out(ctx, 1)
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier(group=ctx.gloo)
    out = {"error": None, "value": None}
    if ctx.rank == 0:
        out["error"] = raises(lambda: dist.all_reduce(torch.ones(4), group=g))
    dist.barrier(group=ctx.gloo)
    if ctx.rank != 0:
        t = torch.ones(4)
        out["error"] = raises(lambda: dist.all_reduce(t, group=g))
        if out["error"] is None:
            out["value"] = t.tolist()
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return out


def test_a_late_rank_learns_of_the_failure(world2):
    first, late = world2.run(check_a_late_rank_learns_of_the_failure)
    assert first["error"] and "rank 1 never arrived" in first["error"], first
    assert late["value"] is None, late
    assert late["error"] and "rank 0" in late["error"] and "failed first" in late["error"], late


def check_work_wait_timeout(ctx):
    """Work.wait(timeout) as NCCL's: on a workspace whose ops return queued (here the host's with
    CUDA's semantics), a wait with a timeout blocks until the op has run and raises once the timeout
    has passed, long before the group's; a wait after the op has run returns True."""
    import time

    opts = cuda_p2p.ProcessGroupCudaP2P.Options()
    opts.host_semantics = "cuda"
    g = dist.new_group(backend="cuda_p2p", pg_options=opts, timeout=timedelta(seconds=20))
    out = {}
    t = torch.full((4,), float(ctx.rank))
    if ctx.rank == 0:
        w = dist.all_reduce(t, group=g, async_op=True)
        start = time.monotonic()
        try:
            w.wait(timeout=timedelta(milliseconds=300))
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e)
        out["elapsed"] = time.monotonic() - start
    dist.barrier(group=ctx.gloo)  # rank 1 joins the op only now
    if ctx.rank != 0:
        w = dist.all_reduce(t, group=g, async_op=True)
    out["late"] = w.wait(timeout=timedelta(seconds=10))
    out["value"] = t.tolist()
    dist.destroy_process_group(g)
    return out


def test_work_wait_honours_its_timeout(world2):
    results = world2.run(check_work_wait_timeout)
    first = results[0]
    assert first["error"] and "Work.wait(timeout=300 ms)" in first["error"], first
    assert "has not run by then" in first["error"], first
    assert first["elapsed"] < 5, first
    for res in results:
        assert res["late"] is True, res
        assert res["value"] == [1.0] * 4, res


def check_ddp_matches_gloo(ctx):
    """DistributedDataParallel on a cuda_p2p group (all-reduce through futures and comm hooks)
    trains exactly like on Gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = []
    for grp in (dist.group.WORLD, ctx.gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        ddp = DDP(model, process_group=grp, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(ctx.rank)
        for _ in range(3):
            opt.zero_grad()
            ddp(torch.randint(-3, 4, (8, 16), generator=gen).float()).pow(2).mean().backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*results))


# ---------------------------------------------------------------------------------------------
# tests


def test_api_async_fallbacks_and_off_switches(any_world):
    assert_ok(any_world.run(check_api_and_fallbacks))


def test_synchronous_calls_return_no_work(any_world):
    assert_ok(any_world.run(check_sync_calls_return_no_work), min_cases=18)


def test_environment_forces_the_algorithm(any_world):
    assert_ok(any_world.run(check_env_forcing))


def test_timeout_names_the_missing_rank(world3):
    results = world3.run(check_timeout_names_the_missing_rank)
    for r, res in enumerate(results[:-1]):
        assert names_rank(res["error"], 2) and "never arrived" in res["error"], (r, res)
        # With CUDA's semantics the timeout fails the group's device (NOTE [Device failure]).
        after = ("this group's device is unusable" if HOST_CUDA_SEMANTICS
                 else "an earlier workspace op of this group failed")
        assert res["after"] and after in res["after"], (r, res)


def test_ddp_on_cuda_p2p_matches_gloo(world2):
    assert all(world2.run(check_ddp_matches_gloo))
