"""Each collective's cases for _collective_checks.py: how a case runs (``<name>_run``) and what it
must give (``<name>_expected``), the table of collectives (COLLECTIVES), and the checks that run
every case of one on cuda_p2p and on Gloo (check_collective), that cuda_p2p refuses what Gloo
refuses (check_rejections), and that a rank outside the group sees no-ops (check_non_member).
"""

from __future__ import annotations

import dataclasses
import traceback

import torch
import torch.distributed as dist

from _collective_checks import (
    DTYPES,
    SIZES,
    compare_futures,
    compare_outputs,
    group_pair,
    make_input,
    rejected_ops_for,
    tolerance,
    wait_async_result,
)
from _reference import ops_for, reduce_over_ranks

R = dist.ReduceOp


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


def _run_reference(coll, ref, c, a):
    """Gloo's (values, future) for case `c`, or the exception it raised."""
    try:
        return coll.run(ref, c, a)
    except Exception as e:  # noqa: BLE001  (raised again for every mode: check_collective)
        return e


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
        # Gloo runs each case once, asynchronously (its future is compared with ours; its values
        # do not depend on the mode), and every mode of cuda_p2p is compared with that run.
        ref_run = None
        for a in asyncs:
            label = _describe(name, c, a, p2p)
            count += 1
            try:
                try:
                    if ref_run is None:
                        ref_run = _run_reference(coll, ref, c, max(asyncs))
                    if isinstance(ref_run, Exception):
                        raise ref_run
                    want_ref, ref_fut = ref_run
                    ref_fut = ref_fut if a else None
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
    """Op/dtype combinations Gloo rejects: cuda_p2p must raise the same type of error.

    The Gloo reference runs on a group of its own, destroyed at the end: a refused coalesced op
    can leave a failed work in its group whose error a later op of that group raises (seen on a
    loaded machine, at the pool check's barrier), and the pool's Gloo group serves every test.
    Gloo refuses these before it communicates, so a rank may finish every case while its peer still
    connects to the new group: the pool's group meets them before it is destroyed (destroyed
    early, it broke the peer's connectFullMesh under load)."""
    dtype = DTYPES[dtype_name]
    p2p, ref = group_pair(ctx)
    pool_gloo = ref.pg
    ref = dataclasses.replace(ref, pg=dist.new_group(backend="gloo"))
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
    dist.barrier(group=pool_gloo)
    dist.destroy_process_group(ref.pg)
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
