"""Rank-side checks of the collectives: each case runs on the cuda_p2p group and on a Gloo group
over the same ranks, and cuda_p2p's result is compared with the expected values (plain torch,
_reference.py: the oracle) and with Gloo's (the drop-in check: values, errors, Works, futures).

Inputs are a pure function of (case, rank), so every rank can rebuild every peer's input and
compute the expected result locally. A check returns ``{"cases": n, "failures": [...]}``; every
failure names the collective, dtype, size, op, root, async mode and group.

Here: the inputs, groups, waits and comparisons the checks share, the point-to-point, barrier and
object checks, and the subgroup layouts; each collective's cases and their checks
(check_collective, check_rejections): _collective_cases.py.
"""

from __future__ import annotations

import dataclasses
import time
import traceback

import torch
import torch.distributed as dist

import cuda_p2p
from _reference import BITWISE_OPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
SIZES = (0, 1, 7, 1023)
# Combinations Gloo rejects (checked by test_rejected_reduce_ops): cuda_p2p must reject them too.
FLOAT_REJECTED_OPS = BITWISE_OPS
INT_REJECTED_OPS = ("AVG",)


def rejected_ops_for(dtype) -> tuple[str, ...]:
    return INT_REJECTED_OPS if not dtype.is_floating_point else FLOAT_REJECTED_OPS


# ---------------------------------------------------------------------------------------------
# inputs (the expected values: _reference.reduce_over_ranks)


def make_input(seed: int, rank: int, n: int, dtype, op: str | None = None, k: int = 0):
    """Deterministic input of rank `rank` for case `seed` (k: which of several tensors): random
    values, whose sums round differently in different orders (compared within `tolerance`)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 7_919 + k * 104_729 + n) % 2**62)
    if not dtype.is_floating_point:
        if op in ("BAND", "BOR", "BXOR"):
            return torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64)
        if op == "PRODUCT":
            return torch.randint(-3, 4, (n,), generator=g, dtype=torch.int64)
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64)
    if op == "PRODUCT":
        sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        x = (torch.rand(n, generator=g) + 0.5) * sign
    else:
        x = torch.randn(n, generator=g) * 4
    return x.to(dtype)


def tolerance(dtype, op):
    """(rtol, atol) against plain math; None means exact."""
    if not dtype.is_floating_point or op in (None, "MIN", "MAX"):
        return None
    if dtype == torch.bfloat16:
        return (2e-2, 0.15)
    return (1e-5, 1e-4)


# ---------------------------------------------------------------------------------------------
# groups


@dataclasses.dataclass
class GroupRank:
    """A group a check runs a collective on, and this rank's place in it."""

    pg: object  # a ProcessGroup (or None: the default group)
    rank: int  # rank in the group
    size: int
    ranks: list  # global ranks of the group
    backend: str = "cuda_p2p"

    def label(self) -> str:
        return f"W={self.size} ranks={self.ranks}"


def group_pair(ctx, ranks=None):
    """(cuda_p2p group, gloo reference group) over `ranks` (None: the world); every rank must
    call it. Returns None for a rank that is not in `ranks`."""
    if ranks is None:
        ranks = list(range(ctx.world_size))
        p2p, ref = dist.group.WORLD, ctx.gloo
    else:
        p2p, ref = ctx.group(ranks, "cuda_p2p"), ctx.group(ranks, "gloo")
    if ctx.rank not in ranks:
        return None
    grank = ranks.index(ctx.rank)
    return (
        GroupRank(p2p, grank, len(ranks), list(ranks)),
        GroupRank(ref, grank, len(ranks), list(ranks), backend="gloo"),
    )


# ---------------------------------------------------------------------------------------------
# running an op, sync or async


def wait_async_result(handle, async_op: bool):
    """Waits on what an async collective returned; returns the future's value or a marker."""
    if not async_op:
        if handle is not None:
            raise AssertionError(f"a synchronous collective returned {handle!r}, expected None")
        return None
    if isinstance(handle, torch._C.Future):  # all_reduce_coalesced returns a future
        return ("future", handle.wait(), True)
    if handle is None:
        raise AssertionError("async_op=True returned None, expected a Work")
    try:
        fut = handle.get_future()
    except RuntimeError:
        fut = None
    if handle.wait() is not True:
        raise AssertionError("work.wait() did not return True")
    # Compared with Gloo's, not required: Gloo's reduce_scatter works stay "not completed".
    completed = handle.is_completed()
    if fut is None:
        return ("nofuture", None, completed)
    value = fut.wait()
    if not fut.done():
        raise AssertionError("the work's future is not done after wait()")
    return ("future", value, completed)


# ---------------------------------------------------------------------------------------------
# comparing outputs and futures


def _mismatch(what, got, want, tol) -> str | None:
    if got is None and want is None:
        return None
    if got is None or want is None:
        return f"{what}: got {got!r}, expected {want!r}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if tol is None:
        if torch.equal(got, want):
            return None
    else:
        rtol, atol = tol
        if torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol):
            return None
    diff = (got.float() - want.float()).abs()
    i = int(diff.argmax()) if diff.numel() else 0
    return (
        f"{what}: max |diff| {diff.max().item() if diff.numel() else 0:.6g} at element {i} "
        f"(got {got.reshape(-1)[i].item()}, expected {want.reshape(-1)[i].item()}; "
        f"{'exact' if tol is None else f'rtol={tol[0]}, atol={tol[1]}'})"
    )


def compare_outputs(label, got, ref, want, tol, failures):
    """got: cuda_p2p, ref: gloo, want: plain math."""
    if len(got) != len(ref) or len(got) != len(want):
        failures.append(f"{label}: {len(got)} outputs, gloo {len(ref)}, math {len(want)}")
        return
    for i, (x, y, z) in enumerate(zip(got, ref, want)):
        # Against Gloo exactly where no floating-point rounding is involved, else within tol.
        m = _mismatch(f"{label} output[{i}] vs gloo", x, y, tol)
        m = m or _mismatch(f"{label} output[{i}] vs plain math", x, z, tol)
        if m:
            failures.append(m)


def compare_futures(label, got, ref, tol, failures):
    """Async results: where Gloo's work has a future, cuda_p2p's must have one with the same
    values (within `tol`); where Gloo's has none, cuda_p2p may offer one or not."""
    if ref is None:
        if got is not None:
            failures.append(f"{label}: synchronous call returned {got!r}")
        return
    if got is None:
        failures.append(f"{label}: async call returned nothing to wait on")
        return
    if ref[0] == "coalesced" or ref[0] == "nofuture":
        return
    if got[0] != "future":
        failures.append(f"{label}: the work has no future; gloo's has one")
        return
    if ref[2] and not got[2]:
        failures.append(f"{label}: work.is_completed() is False after wait(); gloo's is True")
    gv, rv = got[1], ref[1]
    if isinstance(rv, torch.Tensor):
        rv, gv = [rv], [gv]
    if not isinstance(gv, (list, tuple)) or len(gv) != len(rv):
        failures.append(f"{label}: future value {type(gv).__name__}, gloo {type(rv).__name__}")
        return
    for i, (x, y) in enumerate(zip(gv, rv)):
        m = _mismatch(f"{label} future value [{i}] vs gloo", x, y, tol)
        if m:
            failures.append(m)


# ---------------------------------------------------------------------------------------------
# point to point


def _p2p_case_input(c, src, k=0):
    return make_input(c["seed"], src, c["n"], c["dtype"], k=k)


def _send_right_receive_left(g, c, mode):
    """Every rank sends to its right neighbour and receives from its left one."""
    right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    out = torch.full((c["n"],), 99, dtype=c["dtype"])
    t = _p2p_case_input(c, g.rank)
    marks = []
    if mode == "blocking":
        # Even ranks send first, odd ranks receive first: no cycle of blocked senders.
        if g.rank % 2 == 0:
            dist.send(t, group_dst=right, group=g.pg)
            dist.recv(out, group_src=left, group=g.pg)
        else:
            dist.recv(out, group_src=left, group=g.pg)
            dist.send(t, group_dst=right, group=g.pg)
    elif mode == "isend_irecv":
        rw = dist.irecv(out, group_src=left, group=g.pg)
        sw = dist.isend(t, group_dst=right, group=g.pg)
        for w in (sw, rw):
            marks.append(w.wait())
            marks.append(w.is_completed())
    elif mode == "batch":
        ops = [
            dist.P2POp(dist.isend, t, group=g.pg, group_peer=right),
            dist.P2POp(dist.irecv, out, group=g.pg, group_peer=left),
        ]
        for w in dist.batch_isend_irecv(ops):
            marks.append(w.wait())
    else:
        raise ValueError(mode)
    if not all(marks):
        raise AssertionError(f"{mode}: a work's wait()/is_completed() returned False: {marks}")
    return [out]


def _send_two_tags_receive_reversed(g, c):
    """Two messages to the right neighbour with tags 1 and 2, received in the other order."""
    right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    a = _p2p_case_input(c, g.rank, k=1)
    b = _p2p_case_input(c, g.rank, k=2)
    out_b = torch.full((c["n"],), 99, dtype=c["dtype"])
    out_a = torch.full((c["n"],), 99, dtype=c["dtype"])
    works = [
        dist.isend(a, group_dst=right, group=g.pg, tag=1),
        dist.isend(b, group_dst=right, group=g.pg, tag=2),
        dist.irecv(out_b, group_src=left, group=g.pg, tag=2),
        dist.irecv(out_a, group_src=left, group=g.pg, tag=1),
    ]
    for w in works:
        w.wait()
    return [out_a, out_b]


def _batch_both_neighbours(g, c):
    """batch_isend_irecv to and from both neighbours (4 ops per rank)."""
    right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    to_r = _p2p_case_input(c, g.rank, k=3)
    to_l = _p2p_case_input(c, g.rank, k=4)
    from_l = torch.full((c["n"],), 99, dtype=c["dtype"])
    from_r = torch.full((c["n"],), 99, dtype=c["dtype"])
    ops = [
        dist.P2POp(dist.irecv, from_l, group=g.pg, group_peer=left, tag=3),
        dist.P2POp(dist.isend, to_r, group=g.pg, group_peer=right, tag=3),
        dist.P2POp(dist.isend, to_l, group=g.pg, group_peer=left, tag=4),
        dist.P2POp(dist.irecv, from_r, group=g.pg, group_peer=right, tag=4),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return [from_l, from_r]


P2P_MODES = ("blocking", "isend_irecv", "batch", "tags", "batch_bidirectional")


def _run_p2p_mode(g, c, mode):
    if mode == "tags":
        return _send_two_tags_receive_reversed(g, c)
    if mode == "batch_bidirectional":
        return _batch_both_neighbours(g, c)
    return _send_right_receive_left(g, c, mode)


def _p2p_mode_expected(g, c, mode):
    right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    if mode == "tags":
        return [_p2p_case_input(c, left, k=1), _p2p_case_input(c, left, k=2)]
    if mode == "batch_bidirectional":
        return [_p2p_case_input(c, left, k=3), _p2p_case_input(c, right, k=4)]
    return [_p2p_case_input(c, left)]


def check_p2p(ctx, mode, dtype_name, ranks=None, sizes=SIZES):
    dtype = DTYPES[dtype_name]
    pair = group_pair(ctx, ranks)
    if pair is None:
        return {"cases": 0, "failures": []}
    p2p, ref = pair
    failures, count = [], 0
    for i, n in enumerate(sizes):
        c = dict(n=n, dtype=dtype, seed=7_000 + i + 100 * P2P_MODES.index(mode))
        label = f"{mode} dtype={dtype_name} n={n} {p2p.label()}"
        count += 1
        try:
            got = _run_p2p_mode(p2p, c, mode)
            want_ref = _run_p2p_mode(ref, c, mode)
            compare_outputs(label, got, want_ref, _p2p_mode_expected(p2p, c, mode), None, failures)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{label}: raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
            break
    return {"cases": count, "failures": failures}


def check_recv_anysource(ctx, ranks=None, use_irecv=False):
    """The group's rank 0 receives one message from every other rank with src=None."""
    pair = group_pair(ctx, ranks)
    if pair is None:
        return {"cases": 0, "failures": []}
    failures = []
    results = {}
    for which, g in zip(("cuda_p2p", "gloo"), pair):
        if g.rank == 0:
            got = {}
            for _ in range(g.size - 1):
                t = torch.zeros(3, dtype=torch.int64)
                if use_irecv:
                    w = dist.irecv(t, src=None, group=g.pg)
                    w.wait()
                    src = w._source_rank()
                    src = g.ranks[src]  # the Work reports a group rank
                else:
                    src = dist.recv(t, src=None, group=g.pg)  # a global rank
                got[src] = t.tolist()
            results[which] = got
        else:
            dist.send(torch.full((3,), 10 * ctx.rank + 1, dtype=torch.int64), dst=g.ranks[0],
                      group=g.pg)
    if pair[0].rank == 0:
        want = {r: [10 * r + 1] * 3 for r in pair[0].ranks[1:]}
        for which, got in results.items():
            if got != want:
                failures.append(
                    f"recv(src=None){' via irecv' if use_irecv else ''} on {which} "
                    f"{pair[0].label()}: got {got}, expected {want}"
                )
    return {"cases": 1, "failures": failures}


# ---------------------------------------------------------------------------------------------
# barriers and objects


def check_barrier(ctx, kind, ranks=None, delay=0.4):
    """The group's last rank arrives `delay` s late. Returns, per rank, when it entered and left
    the barrier (CLOCK_MONOTONIC is one clock for every process of the host): every rank must
    leave after the late one entered."""
    pair = group_pair(ctx, ranks)
    if pair is None:
        return None
    g = pair[0]
    from datetime import timedelta

    dist.barrier(group=g.pg)  # line up first
    late = g.rank == g.size - 1
    if late:
        time.sleep(delay)
    entered = time.monotonic()
    if kind == "barrier":
        assert dist.barrier(group=g.pg) is None
    elif kind == "barrier_async":
        w = dist.barrier(group=g.pg, async_op=True)
        assert w.wait() is True and w.is_completed()
    elif kind == "monitored_barrier":
        dist.monitored_barrier(group=g.pg, timeout=timedelta(seconds=30))
    elif kind == "monitored_barrier_wait_all":
        dist.monitored_barrier(group=g.pg, timeout=timedelta(seconds=30), wait_all_ranks=True)
    else:
        raise ValueError(kind)
    return {"late": late, "entered": entered, "left": time.monotonic(), "group": g.ranks}


def monitored_barrier_missing_rank(ctx, backend):
    """The last rank skips a monitored_barrier: rank 0 must name it; others must fail too."""
    from datetime import timedelta

    g = dist.new_group(backend=backend)  # a throwaway group: its Gloo pairs are left dirty
    W = ctx.world_size
    if ctx.rank == W - 1:
        return None
    try:
        dist.monitored_barrier(group=g, timeout=timedelta(seconds=1), wait_all_ranks=True)
    except RuntimeError as e:
        return str(e)
    return "no error"


def check_objects(ctx, ranks=None):
    pair = group_pair(ctx, ranks)
    if pair is None:
        return {"cases": 0, "failures": []}
    failures = []

    def obj(r):
        return {"rank": r, "payload": list(range(r + 1)), "name": f"r{r}" * (r + 1), "t": (r, 2.5)}

    for which, g in zip(("cuda_p2p", "gloo"), pair):
        label = f"{which} {g.label()}"
        out = [None] * g.size
        dist.all_gather_object(out, obj(g.rank), group=g.pg)
        if out != [obj(r) for r in range(g.size)]:
            failures.append(f"all_gather_object {label}: {out}")
        src = g.size - 1
        lst = [obj(g.rank), "x" * g.rank, None]
        dist.broadcast_object_list(lst, group_src=src, group=g.pg)
        if lst != [obj(src), "x" * src, None]:
            failures.append(f"broadcast_object_list {label}: {lst}")
        gathered = [None] * g.size if g.rank == 0 else None
        dist.gather_object(obj(g.rank), gathered, group_dst=0, group=g.pg)
        if g.rank == 0 and gathered != [obj(r) for r in range(g.size)]:
            failures.append(f"gather_object {label}: {gathered}")
        recv = [None]
        dist.scatter_object_list(
            recv, [obj(100 + r) for r in range(g.size)] if g.rank == 0 else None, group_src=0,
            group=g.pg
        )
        if recv != [obj(100 + g.rank)]:
            failures.append(f"scatter_object_list {label}: {recv}")
    return {"cases": 4, "failures": failures}


# ---------------------------------------------------------------------------------------------
# subgroup layouts and result checks shared by the test modules

# Subgroups of 4 ranks: two disjoint pairs (every rank is in one), and a group of 3 that rank 0
# is not in (rank 0 checks that collectives on it are no-ops returning None).
SUBGROUPS = {
    "pairs_0_2-1_3": [[0, 2], [1, 3]],
    "ranks_1_2_3": [[1, 2, 3]],
}


def in_subgroup(ctx, layout, fn, *args, **kwargs):
    """Creates every group of `layout` on every rank (in one order), then runs `fn` for the
    group this rank is in (or for the first group, as a non-member)."""
    groups = SUBGROUPS[layout]
    for ranks in groups:
        ctx.group(ranks, "cuda_p2p")
        ctx.group(ranks, "gloo")
    mine = next((r for r in groups if ctx.rank in r), groups[0])
    return fn(ctx, *args, ranks=mine, **kwargs)


def assert_all_ok(results, min_cases=1):
    """Results of check_* from every rank: no failure, and at least `min_cases` cases ran."""
    failures = [f"[rank {r}] {f}" for r, res in enumerate(results) if res for f in res["failures"]]
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures[:40])
    counted = [res["cases"] for res in results if res]
    assert counted and min(counted) >= min_cases, f"too few cases ran: {counted}"


def uses_cuda_p2p(ctx, ranks=None):
    pair = group_pair(ctx, ranks)
    if pair is None:
        return None
    return cuda_p2p.is_cuda_p2p_group(pair[0].pg), cuda_p2p.is_cuda_p2p_group(pair[1].pg)
