"""Point-to-point (send/recv, isend/irecv, recv from any source, batch_isend_irecv, tags),
barriers, monitored_barrier and the object collectives, on cuda_p2p against Gloo."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

import _collective_checks as cc
from _collective_checks import SUBGROUPS, assert_all_ok, in_subgroup


@pytest.mark.parametrize("dtype", list(cc.DTYPES))
@pytest.mark.parametrize("mode", cc.P2P_MODES)
def test_send_recv(world, mode, dtype):
    assert_all_ok(world.run(cc.check_p2p, mode, dtype), min_cases=len(cc.SIZES))


def p2p_in_subgroups(ctx, mode):
    return in_subgroup(ctx, "pairs_0_2-1_3", cc.check_p2p, mode, "float32", sizes=(1, 7))


@pytest.mark.parametrize("mode", cc.P2P_MODES)
def test_send_recv_subgroup(world4, mode):
    assert_all_ok(world4.run(p2p_in_subgroups, mode), min_cases=2)


@pytest.mark.parametrize("use_irecv", [False, True], ids=["recv", "irecv"])
def test_recv_any_source(world, use_irecv):
    assert_all_ok(world.run(cc.check_recv_anysource, use_irecv=use_irecv))


def anysource_in_subgroup(ctx):
    return in_subgroup(ctx, "ranks_1_2_3", cc.check_recv_anysource)


def test_recv_any_source_subgroup(world4):
    # group [1, 2, 3]: its rank 0 is global rank 1, which must see global ranks 2 and 3
    assert_all_ok([r for r in world4.run(anysource_in_subgroup) if r["cases"]])


BARRIERS = ["barrier", "barrier_async", "monitored_barrier", "monitored_barrier_wait_all"]
DELAY = 0.4
# torch 2.11's dist.monitored_barrier refuses every group whose backend is not named "gloo"
# (2.14's asks the backend): there it cannot reach cuda_p2p at all.
_MONITORED_GLOO_ONLY = "only implemented for GLOO" in inspect.getsource(dist.monitored_barrier)


def _skip_monitored_where_torch_refuses(kind):
    if kind.startswith("monitored") and _MONITORED_GLOO_ONLY:
        pytest.skip(f"torch {torch.__version__}'s dist.monitored_barrier takes Gloo groups only")


def _check_waited(results):
    groups = {tuple(res["group"]) for res in results if res}
    assert groups
    for group in groups:
        mine = {r: res for r, res in enumerate(results) if res and tuple(res["group"]) == group}
        late = [res for res in mine.values() if res["late"]]
        assert len(late) == 1 and len(mine) == len(group), f"group {group}: {mine}"
        for r, res in mine.items():
            # Every rank that was on time must have stayed until the late one arrived.
            assert res["left"] >= late[0]["entered"], (
                f"rank {r} of group {list(group)} left the barrier "
                f"{late[0]['entered'] - res['left']:.3f} s before the last rank entered it"
            )


@pytest.mark.parametrize("kind", BARRIERS)
def test_barrier_waits_for_everyone(world, kind):
    _skip_monitored_where_torch_refuses(kind)
    _check_waited(world.run(cc.check_barrier, kind, delay=DELAY))


def barrier_in_subgroup(ctx, layout, kind):
    return in_subgroup(ctx, layout, cc.check_barrier, kind, delay=DELAY)


@pytest.mark.parametrize("kind", ["barrier", "monitored_barrier"])
@pytest.mark.parametrize("layout", list(SUBGROUPS))
def test_barrier_subgroup(world4, layout, kind):
    _skip_monitored_where_torch_refuses(kind)
    results = world4.run(barrier_in_subgroup, layout, kind)
    _check_waited(results)
    if layout == "ranks_1_2_3":
        assert results[0] is None  # rank 0 is not in the group


def test_monitored_barrier_names_missing_rank(world):
    """The last rank never arrives: rank 0 reports it by number (as Gloo does)."""
    _skip_monitored_where_torch_refuses("monitored_barrier")
    res = world.run(cc.monitored_barrier_missing_rank, "cuda_p2p")
    W = world.size
    assert res[W - 1] is None
    assert f"Ranks {W - 1} failed to pass monitoredBarrier" in res[0], res[0]
    for r in range(1, W - 1):
        assert res[r] != "no error", f"rank {r} passed a barrier that rank {W - 1} never reached"


def test_objects(world):
    assert_all_ok(world.run(cc.check_objects))


def objects_in_subgroup(ctx):
    return in_subgroup(ctx, "pairs_0_2-1_3", cc.check_objects)


def test_objects_subgroup(world4):
    assert_all_ok(world4.run(objects_in_subgroup))
