"""Rank-side checks of the collectives: each case runs on the cuda_p2p group and on a Gloo group
over the same ranks, and cuda_p2p's result is compared with the expected values (plain torch,
_reference.py: the oracle) and with Gloo's (the drop-in check: values, errors, Works, futures).

Inputs are a pure function of (case, rank), so every rank can rebuild every peer's input and
compute the expected result locally. A check returns ``{"cases": n, "failures": [...]}``; every
failure names the collective, dtype, size, op, root, async mode and group.
"""

from __future__ import annotations

import dataclasses
import time
import traceback

import torch
import torch.distributed as dist

import cuda_p2p
from _reference import BITWISE_OPS, ops_for, reduce_over_ranks

R = dist.ReduceOp
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


# Each collective: <name>_run(g, case, async_op) -> (outputs, what wait_async_result returned),
# <name>_expected(g, case) -> outputs.
# `outputs` is a list of tensors (None entries are not compared).


def _case_root(g, case):
    return case["n"] % g.size


def broadcast_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"])
    h = dist.broadcast(t, group_src=_case_root(g, c), group=g.pg, async_op=a)
    return [t], wait_async_result(h, a)


def broadcast_expected(g, c):
    return [make_input(c["seed"], _case_root(g, c), c["n"], c["dtype"])]


def all_reduce_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"], c["op"])
    h = dist.all_reduce(t, op=getattr(R, c["op"]), group=g.pg, async_op=a)
    return [t], wait_async_result(h, a)


def all_reduce_expected(g, c):
    ins = [make_input(c["seed"], r, c["n"], c["dtype"], c["op"]) for r in range(g.size)]
    return [reduce_over_ranks(c["op"], ins)]


def _coalesced_inputs(g, c, rank=None):
    rank = g.rank if rank is None else rank
    return [make_input(c["seed"], rank, c["n"] + 2 * k, c["dtype"], c["op"], k=k) for k in range(3)]


def coalesced_all_reduce_expected(g, c):
    per_rank = [_coalesced_inputs(g, c, r) for r in range(g.size)]
    return [reduce_over_ranks(c["op"], [p[k] for p in per_rank]) for k in range(3)]


def all_reduce_coalesced_run(g, c, a):
    ts = _coalesced_inputs(g, c)
    h = dist.all_reduce_coalesced(ts, op=getattr(R, c["op"]), group=g.pg, async_op=a)
    return ts, wait_async_result(h, a)


def _wait_coalescing_manager(cm, a):
    if not a:
        return None
    for w in cm.works:
        if w.wait() is not True:
            raise AssertionError("coalesced work.wait() did not return True")
    return ("coalesced", None)


def coalescing_manager_all_reduce_run(g, c, a):
    ts = _coalesced_inputs(g, c)
    # device=: the old style (startCoalescing/endCoalescing on the backend), which Gloo lacks;
    # the reference then runs the fast path.
    device = torch.device("cpu") if c.get("device") and g.backend != "gloo" else None
    with dist._coalescing_manager(group=g.pg, device=device, async_ops=a) as cm:
        for t in ts:
            dist.all_reduce(t, op=getattr(R, c["op"]), group=g.pg)
    return ts, _wait_coalescing_manager(cm, a)


def reduce_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"], c["op"])
    root = _case_root(g, c)
    h = dist.reduce(t, group_dst=root, op=getattr(R, c["op"]), group=g.pg, async_op=a)
    # Only the root's tensor is defined after a reduce (Gloo's others hold partial results,
    # cuda_p2p's are left as they were): neither it nor the future's value is compared elsewhere.
    fut = wait_async_result(h, a)
    if g.rank != root and fut is not None and fut[0] == "future":
        fut = (fut[0], [None] * len(fut[1]), fut[2])
    return [t if g.rank == root else None], fut


def reduce_expected(g, c):
    if g.rank != _case_root(g, c):
        return [None]
    return all_reduce_expected(g, c)


def all_gather_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"])
    outs = [torch.full((c["n"],), 99, dtype=c["dtype"]) for _ in range(g.size)]
    h = dist.all_gather(outs, t, group=g.pg, async_op=a)
    return outs, wait_async_result(h, a)


def all_gather_expected(g, c):
    return [make_input(c["seed"], r, c["n"], c["dtype"]) for r in range(g.size)]


def all_gather_into_tensor_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"])
    out = torch.full((g.size * c["n"],), 99, dtype=c["dtype"])
    h = dist.all_gather_into_tensor(out, t, group=g.pg, async_op=a)
    return [out], wait_async_result(h, a)


def all_gather_into_tensor_expected(g, c):
    return [torch.cat(all_gather_expected(g, c))]


def coalescing_manager_all_gather_run(g, c, a):
    ins = [make_input(c["seed"], g.rank, c["n"] + 2 * k, c["dtype"], k=k) for k in range(3)]
    outs = [torch.full((g.size * t.numel(),), 99, dtype=c["dtype"]) for t in ins]
    with dist._coalescing_manager(group=g.pg, async_ops=a) as cm:
        for o, t in zip(outs, ins):
            dist.all_gather_into_tensor(o, t, group=g.pg)
    return outs, _wait_coalescing_manager(cm, a)


def coalescing_manager_all_gather_expected(g, c):
    return [
        torch.cat([make_input(c["seed"], r, c["n"] + 2 * k, c["dtype"], k=k)
                   for r in range(g.size)])
        for k in range(3)
    ]


def gather_run(g, c, a):
    t = make_input(c["seed"], g.rank, c["n"], c["dtype"])
    root = _case_root(g, c)
    outs = [torch.full((c["n"],), 99, dtype=c["dtype"]) for _ in range(g.size)]
    h = dist.gather(t, outs if g.rank == root else None, group_dst=root, group=g.pg, async_op=a)
    return (outs if g.rank == root else [None] * g.size), wait_async_result(h, a)


def gather_expected(g, c):
    if g.rank != _case_root(g, c):
        return [None] * g.size
    return all_gather_expected(g, c)


def scatter_run(g, c, a):
    root = _case_root(g, c)
    ins = [make_input(c["seed"], root, c["n"], c["dtype"], k=j) for j in range(g.size)]
    out = torch.full((c["n"],), 99, dtype=c["dtype"])
    h = dist.scatter(out, ins if g.rank == root else None, group_src=root, group=g.pg, async_op=a)
    return [out], wait_async_result(h, a)


def scatter_expected(g, c):
    return [make_input(c["seed"], _case_root(g, c), c["n"], c["dtype"], k=g.rank)]


def reduce_scatter_run(g, c, a):
    ins = [make_input(c["seed"], g.rank, c["n"], c["dtype"], c["op"], k=j) for j in range(g.size)]
    out = torch.full((c["n"],), 99, dtype=c["dtype"])
    h = dist.reduce_scatter(out, ins, op=getattr(R, c["op"]), group=g.pg, async_op=a)
    return [out], wait_async_result(h, a)


def reduce_scatter_expected(g, c):
    ins = [make_input(c["seed"], r, c["n"], c["dtype"], c["op"], k=g.rank) for r in range(g.size)]
    return [reduce_over_ranks(c["op"], ins)]


def reduce_scatter_tensor_run(g, c, a):
    t = make_input(c["seed"], g.rank, g.size * c["n"], c["dtype"], c["op"])
    out = torch.full((c["n"],), 99, dtype=c["dtype"])
    h = dist.reduce_scatter_tensor(out, t, op=getattr(R, c["op"]), group=g.pg, async_op=a)
    return [out], wait_async_result(h, a)


def reduce_scatter_tensor_expected(g, c):
    n = c["n"]
    ins = [
        make_input(c["seed"], r, g.size * n, c["dtype"], c["op"])[g.rank * n : (g.rank + 1) * n]
        for r in range(g.size)
    ]
    return [reduce_over_ranks(c["op"], ins)]


def coalescing_manager_reduce_scatter_run(g, c, a):
    ins = [
        make_input(c["seed"], g.rank, g.size * (c["n"] + 2 * k), c["dtype"], c["op"], k=k)
        for k in range(3)
    ]
    outs = [torch.full((c["n"] + 2 * k,), 99, dtype=c["dtype"]) for k in range(3)]
    with dist._coalescing_manager(group=g.pg, async_ops=a) as cm:
        for o, t in zip(outs, ins):
            dist.reduce_scatter_tensor(o, t, op=getattr(R, c["op"]), group=g.pg)
    return outs, _wait_coalescing_manager(cm, a)


def coalescing_manager_reduce_scatter_expected(g, c):
    res = []
    for k in range(3):
        n = c["n"] + 2 * k
        ins = [
            make_input(c["seed"], r, g.size * n, c["dtype"], c["op"], k=k)[
                g.rank * n : (g.rank + 1) * n]
            for r in range(g.size)
        ]
        res.append(reduce_over_ranks(c["op"], ins))
    return res


def _split(c, src, dst):
    """Elements `src` sends to `dst` in an all-to-all case."""
    if not c.get("uneven"):
        return c["n"]
    return c["n"] + (src + 2 * dst) % 3


def _all_to_all_chunk(c, src, dst):
    return make_input(c["seed"], src, _split(c, src, dst), c["dtype"], k=dst)


def all_to_all_run(g, c, a):
    ins = [_all_to_all_chunk(c, g.rank, j) for j in range(g.size)]
    outs = [torch.full((_split(c, j, g.rank),), 99, dtype=c["dtype"]) for j in range(g.size)]
    h = dist.all_to_all(outs, ins, group=g.pg, async_op=a)
    return outs, wait_async_result(h, a)


def all_to_all_expected(g, c):
    return [_all_to_all_chunk(c, j, g.rank) for j in range(g.size)]


def all_to_all_single_run(g, c, a):
    inp = torch.cat([_all_to_all_chunk(c, g.rank, j) for j in range(g.size)])
    out = torch.full((sum(_split(c, j, g.rank) for j in range(g.size)),), 99, dtype=c["dtype"])
    if c.get("uneven"):
        in_splits = [_split(c, g.rank, j) for j in range(g.size)]
        out_splits = [_split(c, j, g.rank) for j in range(g.size)]
    else:
        in_splits = out_splits = None
    h = dist.all_to_all_single(out, inp, out_splits, in_splits, group=g.pg, async_op=a)
    return [out], wait_async_result(h, a)


def all_to_all_single_expected(g, c):
    return [torch.cat(all_to_all_expected(g, c))]


@dataclasses.dataclass
class Collective:
    run: object
    expected: object
    reduces: bool = False  # takes a reduce op
    variants: tuple = ({},)  # extra case fields, each a separate case


COLLECTIVES = {
    "broadcast": Collective(broadcast_run, broadcast_expected),
    "all_reduce": Collective(all_reduce_run, all_reduce_expected, reduces=True),
    "all_reduce_coalesced": Collective(
        all_reduce_coalesced_run, coalesced_all_reduce_expected, reduces=True),
    "coalescing_manager_all_reduce": Collective(
        coalescing_manager_all_reduce_run, coalesced_all_reduce_expected, reduces=True,
        variants=({}, {"device": True})),
    "reduce": Collective(reduce_run, reduce_expected, reduces=True),
    "all_gather": Collective(all_gather_run, all_gather_expected),
    "all_gather_into_tensor": Collective(
        all_gather_into_tensor_run, all_gather_into_tensor_expected),
    "coalescing_manager_all_gather_into_tensor": Collective(
        coalescing_manager_all_gather_run, coalescing_manager_all_gather_expected),
    "gather": Collective(gather_run, gather_expected),
    "scatter": Collective(scatter_run, scatter_expected),
    "reduce_scatter": Collective(reduce_scatter_run, reduce_scatter_expected, reduces=True),
    "reduce_scatter_tensor": Collective(
        reduce_scatter_tensor_run, reduce_scatter_tensor_expected, reduces=True),
    "coalescing_manager_reduce_scatter_tensor": Collective(
        coalescing_manager_reduce_scatter_run, coalescing_manager_reduce_scatter_expected,
        reduces=True),
    "all_to_all": Collective(all_to_all_run, all_to_all_expected),  # Gloo needs equal sizes here
    "all_to_all_single": Collective(
        all_to_all_single_run, all_to_all_single_expected, variants=({}, {"uneven": True})),
}


# Collectives cuda_p2p runs on its workspace even where the Gloo reference refuses them (torch
# 2.11's Gloo has no list all_to_all: docs/testing.md, "Other torch versions").
RUN_BY_CUDA_P2P = frozenset({"all_to_all"})


def cases(name: str, dtype, sizes=SIZES, ops=None):
    coll = COLLECTIVES[name]
    seed = 0
    for n in sizes:
        for variant in coll.variants:
            for op in (ops or ops_for(dtype)) if coll.reduces else (None,):
                seed += 1
                yield dict(n=n, dtype=dtype, op=op, seed=seed + 1000 * len(name), **variant)


def _describe(name, c, a, g) -> str:
    extra = {k: v for k, v in c.items() if k not in ("n", "dtype", "op", "seed")}
    op = f" op={c['op']}" if c["op"] else ""
    rooted = name in ("broadcast", "reduce", "gather", "scatter")
    root = f" root={_case_root(g, c)}" if rooted else ""
    return (
        f"{name} dtype={str(c['dtype']).replace('torch.', '')} n={c['n']}{op}{root}"
        f"{' ' + str(extra) if extra else ''} async={a} {g.label()}"
    )


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


def check_collective(ctx, name, dtype_name, ranks=None, sizes=SIZES, ops=None,
                     asyncs=(False, True)):
    """Runs every case of collective `name` on cuda_p2p and on Gloo; compares with both and
    with plain math. `ranks`: a subgroup (every rank calls; non-members check no-op behaviour)."""
    dtype = DTYPES[dtype_name]
    pair = group_pair(ctx, ranks)
    if pair is None:
        return check_non_member(ctx, name, ranks)
    p2p, ref = pair
    coll = COLLECTIVES[name]
    failures, count = [], 0
    for c in cases(name, dtype, sizes, ops):
        for a in asyncs:
            label = _describe(name, c, a, p2p)
            count += 1
            try:
                try:
                    want_ref, ref_fut = coll.run(ref, c, a)
                except Exception as e_ref:  # noqa: BLE001
                    if name in RUN_BY_CUDA_P2P:
                        # torch 2.11's Gloo has no list all_to_all; cuda_p2p runs it on the
                        # workspace: the plain math alone is the reference.
                        got, _ = coll.run(p2p, c, a)
                        want = coll.expected(p2p, c)
                        compare_outputs(label, got, want, want, tolerance(dtype, c["op"]), failures)
                        continue
                    # Gloo refuses it: cuda_p2p, which sends it there, must refuse it the same way.
                    _expect_same_refusal(label, coll, p2p, c, a, e_ref, failures)
                    continue
                got, got_fut = coll.run(p2p, c, a)
                want = coll.expected(p2p, c)
                compare_outputs(label, got, want_ref, want, tolerance(dtype, c["op"]), failures)
                compare_futures(label, got_fut, ref_fut, tolerance(dtype, c["op"]), failures)
            except Exception as e:  # noqa: BLE001  (one bad case must not hide the others)
                failures.append(
                    f"{label}: raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
                break
    return {"cases": count, "failures": failures}


def _expect_same_refusal(label, coll, p2p, c, a, e_ref, failures, same_message=True):
    """Gloo raised e_ref on case c: cuda_p2p must raise the same type (and, where it sends the
    case to Gloo, the same first line)."""
    first = str(e_ref).splitlines()[0] if str(e_ref) else ""
    try:
        coll.run(p2p, c, a)
    except Exception as e:  # noqa: BLE001
        if type(e) is not type(e_ref) or (same_message and first not in str(e)):
            failures.append(f"{label}: Gloo raised {type(e_ref).__name__}: {first}; cuda_p2p "
                            f"raised {type(e).__name__}: {e}")
        return
    failures.append(f"{label}: Gloo raised {type(e_ref).__name__}: {first}; cuda_p2p did not")


def check_rejections(ctx, name, dtype_name):
    """Op/dtype combinations Gloo rejects: cuda_p2p must raise the same type of error."""
    dtype = DTYPES[dtype_name]
    p2p, ref = group_pair(ctx)
    coll = COLLECTIVES[name]
    failures, count = [], 0
    for c in cases(name, dtype, sizes=(1,), ops=rejected_ops_for(dtype)):
        label = _describe(name, c, False, p2p)
        count += 1
        try:
            coll.run(ref, c, False)
        except Exception as e_ref:  # noqa: BLE001
            # cuda_p2p checks these itself, in its own words: the same type is what counts.
            _expect_same_refusal(label, coll, p2p, c, False, e_ref, failures, same_message=False)
        else:
            failures.append(f"{label}: gloo accepted it (the test's assumption is wrong)")
    return {"cases": count, "failures": failures}


def check_non_member(ctx, name, ranks):
    """A rank outside the group: collectives on the group are no-ops that return None."""
    ng = ctx.group(ranks, "cuda_p2p")
    failures = []
    if ng is not dist.GroupMember.NON_GROUP_MEMBER:
        failures.append(f"rank {ctx.rank} not in {ranks}: new_group returned {ng!r}")
        return {"cases": 1, "failures": failures}
    t = torch.arange(5.0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, fn in [
            ("all_reduce", lambda: dist.all_reduce(t, group=ng)),
            ("all_reduce async", lambda: dist.all_reduce(t, group=ng, async_op=True)),
            ("broadcast", lambda: dist.broadcast(t, src=ranks[0], group=ng)),
            ("barrier", lambda: dist.barrier(group=ng)),
        ]:
            r = fn()
            if r is not None:
                failures.append(f"{label} on a group without rank {ctx.rank} returned {r!r}")
    if not torch.equal(t, torch.arange(5.0)):
        failures.append(f"a collective on a group without rank {ctx.rank} changed the tensor: {t}")
    if dist.get_rank(ng) != -1:
        failures.append(f"dist.get_rank(non-member group) = {dist.get_rank(ng)}, expected -1")
    return {"cases": 1, "failures": failures}


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
