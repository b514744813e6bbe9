"""A torch.compile pass that turns tensor-parallel communication + matmul into our pipelines.

``enable_async_tp()`` adds a post-grad ``CustomGraphPass`` to
``torch._inductor.config.post_grad_custom_post_pass`` (after any pass already there, which
keeps running); ``disable_async_tp()`` removes it; ``with async_tp():`` does both;
``CUDA_P2P_ASYNC_TP=1`` at import enables it. On groups of the cuda_p2p backend only, it rewrites

* ``wait(all_gather_into_tensor(shard))`` (gather dim 0), or its ``split``/``slice`` +
  ``cat(dim=d)`` form or funcol's single-view form (gather dim d), consumed by one or several
  ``mm`` / ``addmm`` / ``view -> mm|addmm [-> view]`` with the gathered tensor as the left
  operand, into one ``cuda_p2p.fused_all_gather_matmul`` (``return_A`` when anything else reads
  the gathered tensor, which then reads the returned A: NOTE [No unfused copy of a fused
  gather]; an ``addmm``'s bias is added to the fused output);
* ``wait(reduce_scatter_tensor(X))`` ("sum"/"avg") where X is P, ``cat(split(P, dim=d))``
  (funcol's scatter dim d) or ``clone(permute(P, perm))`` (DTensor's), and P is a matmul
  (``mm``, ``view(mm(view(A)))``, ``addmm``) or a sum of them (NOTE [A sum of matmuls
  reduce-scattered]), into ``cuda_p2p.fused_matmul_reduce_scatter``; an ``addmm`` whose bias is
  DTensor's ``bias / group_size`` (a replicated bias made partial) becomes the fused op plus
  ``bias``;
* PyTorch's own ``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` nodes on
  cuda_p2p groups into ours.

Both forward and backward graphs are rewritten (the pass runs on each; an activation
checkpoint's recomputed forward is in the backward graph). ``async_tp_report()`` gives, per
graph, what was fused and why each collective left was left; the ``cuda_p2p.async_tp`` logger
says the same (INFO: each rewrite and one summary per graph; DEBUG: each miss).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
import os
from typing import Any, Optional

import sys

import torch
import torch.distributed as dist

# torch._inductor is imported only when the pass is enabled: importing it costs seconds, and
# most users of the backend never compile.

log = logging.getLogger("cuda_p2p.async_tp")

aten = torch.ops.aten
_VIEWS = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


def _c10d():
    return torch.ops._c10d_functional


# ---- groups ----------------------------------------------------------------------------------


def _is_cuda_p2p_group_name(group_name: Any) -> bool:
    from ._backend import ProcessGroupCudaP2P

    if not isinstance(group_name, str):
        return False
    try:
        pg = dist.distributed_c10d._resolve_process_group(group_name)
        backend = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001  (an unknown name, or no CPU backend)
        return False
    return isinstance(backend, ProcessGroupCudaP2P)


def _cuda_p2p_group_names() -> list[str]:
    """The names of this process's cuda_p2p groups: part of the uuid, because the rewrite of a
    graph (which names its groups) depends on which backend each name runs on."""
    if not dist.is_initialized():
        return []
    names = dist.distributed_c10d._world.pg_names.values()
    return sorted(n for n in names if _is_cuda_p2p_group_name(n))


# ---- helpers ---------------------------------------------------------------------------------


def _val(node) -> Optional[torch.Tensor]:
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _arg(node: torch.fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _same(a, b) -> bool:
    """Sizes equal for every value of the symbols (no guard is added under dynamic shapes)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if len(a) != len(b):
        return False
    return all(statically_known_true(x == y) for x, y in zip(a, b))


def _ancestors(node: torch.fx.Node) -> set:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


def _erase_dead(graph: torch.fx.Graph, nodes) -> None:
    """Erases those of ``nodes`` left without users, in whatever order they become so."""
    pending = list(dict.fromkeys(nodes))
    changed = True
    while changed:
        changed = False
        for n in list(pending):
            if not n.users:
                graph.erase_node(n)
                pending.remove(n)
                changed = True


def _raise_before(anchor: torch.fx.Node, nodes) -> None:
    """Moves ``nodes`` (and what they need) before ``anchor`` where they come after it."""
    order = {n: i for i, n in enumerate(anchor.graph.nodes)}
    needed = set()
    for n in nodes:
        needed.add(n)
        needed |= _ancestors(n)
    for n in sorted(needed, key=order.__getitem__):
        if order[n] > order[anchor] and n.op != "placeholder":
            anchor.prepend(n)


# ---- all-gather -> matmul --------------------------------------------------------------------


class _Gather:
    def __init__(self, ag, wait, res, nodes, gather_dim, shard, group_name):
        self.ag, self.wait, self.res, self.nodes = ag, wait, res, nodes
        self.gather_dim, self.shard, self.group_name = gather_dim, shard, group_name


def _match_gather(ag: torch.fx.Node) -> tuple[Optional[_Gather], str]:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    c10d = _c10d()
    shard, group_name = ag.args[0], _arg(ag, 2, "group_name")
    waits = [u for u in ag.users if u.target is c10d.wait_tensor.default]
    if len(waits) != 1 or len(ag.users) != 1:
        return None, "the all-gather's result is used other than through one wait_tensor"
    wait = waits[0]
    users = list(wait.users)
    # funcol's view form of a gather along dim d when every dim before d has size 1
    # (_maybe_view_chunk_cat): one view of the dim-0 result, [W*s0, ...] -> [..., W*s_d, ...].
    st, W = _val(shard), _arg(ag, 1, "group_size")
    if len(users) == 1 and users[0].target in _VIEWS and st is not None and isinstance(W, int):
        vt = _val(users[0])
        s = list(st.shape)
        for d in range(1, len(s)):
            if vt is not None and _same(list(vt.shape), s[:d] + [s[d] * W] + s[d + 1:]) and \
                    all(statically_known_true(x == 1) for x in s[:d]):
                return _Gather(ag, wait, users[0], [ag, wait, users[0]], d, shard,
                               group_name), ""
    # gather_dim > 0: funcol chunks the dim-0 result and concatenates the chunks along the dim.
    parts = []
    for u in users:
        if u.target in _SPLITS and _arg(u, 2, "dim", 0) == 0:
            if not all(g.target is operator.getitem for g in u.users):
                parts = None
                break
            parts.append(u)
        elif u.target is aten.slice.Tensor and _arg(u, 1, "dim", 0) == 0:
            parts.append(u)
        else:
            parts = None
            break
    if parts:
        pieces = [g for p in parts for g in (p.users if p.target in _SPLITS else [p])]
        cats = {c for p in pieces for c in p.users}
        if len(cats) == 1:
            cat = next(iter(cats))
            if cat.target is aten.cat.default and all(len(p.users) == 1 for p in pieces):
                gd = _arg(cat, 1, "dim", 0)
                t = _val(cat)
                if t is not None and isinstance(gd, int):
                    gd %= t.dim()
                    if list(cat.args[0]) == pieces or set(cat.args[0]) == set(pieces):
                        return _Gather(ag, wait, cat, [ag, wait, *parts, *pieces, cat], gd,
                                       shard, group_name), ""
        return None, "the gathered tensor is split but not reassembled by one cat"
    return _Gather(ag, wait, wait, [ag, wait], 0, shard, group_name), ""


class _Consumer:
    """``res @ B`` found among res's users: mm, addmm, or view -> mm / addmm [-> view]."""

    def __init__(self, out, B, bias=None, pre=None, mm=None, scaled=None):
        self.out, self.B, self.bias, self.pre, self.mm = out, B, bias, pre, mm
        self.scaled = scaled  # (scale_a, scale_b, out_dtype) of a _scaled_mm


def _flat_view(u: torch.fx.Node, t: torch.Tensor) -> bool:
    """``u`` views the N-D ``t`` as the matrix [rows, t.shape[-1]]."""
    v = _val(u)
    return (u.target in _VIEWS and v is not None and v.dim() == 2 and t.dim() > 2
            and _same([v.shape[-1]], [t.shape[-1]]))


def _matmul_of(u: torch.fx.Node, left: torch.fx.Node):
    """(B, bias) when ``u`` is ``mm(left, B)`` or ``addmm(bias, left, B)`` with a broadcast
    bias; else None."""
    if u.target is aten.mm.default and u.args[0] is left:
        return u.args[1], None
    if u.target is aten.addmm.default and u.args[1] is left and not u.kwargs:
        bt = _val(u.args[0])
        if bt is not None and bt.dim() <= 1:  # a broadcast bias only
            return u.args[2], u.args[0]
    return None


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _scaled_parts(u: torch.fx.Node):
    """(A, B, scale_a, scale_b, out_dtype) of ``_scaled_mm(A, B, scale_a, scale_b,
    out_dtype=float32|bfloat16)`` with no bias, result scale or fast accumulation (what the fused
    fp8 ops take); else None."""
    if u.target is not aten._scaled_mm.default:
        return None
    A, B, sa, sb = u.args[:4]
    bias, scale_result = _arg(u, 4, "bias"), _arg(u, 5, "scale_result")
    out_dtype, fast = _arg(u, 6, "out_dtype"), _arg(u, 7, "use_fast_accum", False)
    if bias is not None or scale_result is not None or fast:
        return None
    if out_dtype not in (torch.float32, torch.bfloat16):
        return None
    return A, B, sa, sb, out_dtype


def _scaled_of(u: torch.fx.Node, left: torch.fx.Node):
    """(B, None, (scale_a, scale_b, out_dtype)) when ``u`` is a fusable ``_scaled_mm(left, B,
    ...)``; else None."""
    p = _scaled_parts(u)
    if p is None or p[0] is not left:
        return None
    return p[1], None, p[2:]


def _consumers(res: torch.fx.Node, of=None) -> list[_Consumer]:
    of = of or _matmul_of
    found = []
    t = _val(res)
    for u in res.users:
        m = of(u, res)
        if m is not None:
            found.append(_Consumer(u, m[0], bias=m[1], mm=u,
                                   scaled=m[2] if len(m) > 2 else None))
        elif t is not None and _flat_view(u, t):
            for mm in u.users:
                m = of(mm, u)
                if m is None:
                    continue
                # The N-D product is the fused op's output; the 2-D one a view of it. A view back
                # to N-D after the matmul (linear's form) becomes the output itself.
                post = None
                Bv = _val(m[0])
                for v in mm.users:
                    pv = _val(v)
                    if v.target in _VIEWS and pv is not None and Bv is not None and _same(
                            list(pv.shape), [*t.shape[:-1], Bv.shape[-1]]):
                        post = v
                        break
                found.append(_Consumer(post, m[0], bias=m[1], pre=u, mm=mm,
                                       scaled=m[2] if len(m) > 2 else None))
    return found


def _fuse_all_gather(g: _Gather, stats: dict) -> None:
    graph = g.ag.graph
    res = g.res
    shard_t = _val(g.shard)
    if shard_t is not None and shard_t.dtype in _FP8:
        _fuse_all_gather_scaled(g, stats)
        return
    consumers = [c for c in _consumers(res)
                 if c.B is not res and res not in _ancestors(c.B)
                 and (c.bias is None or (c.bias is not res and res not in _ancestors(c.bias)))]
    if not consumers:
        _left(stats, "all-gather", g.ag, "no mm/addmm/reshape-mm-reshape consumes the gathered "
              "tensor as its left operand")
        return
    shard_t, B_ts = _val(g.shard), [_val(c.B) for c in consumers]
    if shard_t is None or any(b is None for b in B_ts):
        _left(stats, "all-gather", g.ag, "no tensor metadata on the shard or a B")
        return
    if any(b.dtype != shard_t.dtype for b in B_ts) or shard_t.dim() < 2:
        _left(stats, "all-gather", g.ag, "dtypes differ, or the shard has fewer than 2 dims")
        return
    with graph.inserting_before(g.ag):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_all_gather_matmul.default,
            args=(g.shard, [c.B for c in consumers], g.gather_dim, g.group_name),
            kwargs={"return_A": False},
        )
    _raise_before(fused, [c.B for c in consumers])
    others = _replace_gather_consumers(graph, fused, consumers, g)
    _fused(stats, "all-gather", g.ag,
           f"gather_dim={g.gather_dim}, {len(consumers)} matmul(s)"
           + (", return_A (the gathered tensor has other users)" if others else ""))


def _replace_gather_consumers(graph, fused, consumers, g: _Gather, extra_nodes=()) -> bool:
    """Rewires every consumer to the fused op's outputs, and every other reader of the gathered
    tensor to its returned A; erases the gather. Returns whether A is returned."""
    res = g.res
    with graph.inserting_after(fused):
        outs = graph.call_function(operator.getitem, (fused, 1))
    last = outs
    for i, c in enumerate(consumers):
        with graph.inserting_after(last):
            out = graph.call_function(operator.getitem, (outs, i))
        last = out
        if c.bias is not None:
            with graph.inserting_after(last):
                out = graph.call_function(aten.add.Tensor, (out, c.bias))
            _raise_before(out, [c.bias])
            last = out
        old_mm = c.mm
        if c.out is not None and c.out is not old_mm:
            c.out.replace_all_uses_with(out)
            graph.erase_node(c.out)
        if old_mm.users:
            if c.pre is not None:
                # The 2-D product has users of its own (a saved activation, a matmul of the
                # backward): they read the fused output as a matrix.
                with graph.inserting_after(last):
                    flat = graph.call_function(aten.reshape.default,
                                               (out, list(_val(old_mm).shape)))
                last = flat
                old_mm.replace_all_uses_with(flat)
            else:
                old_mm.replace_all_uses_with(out)
        graph.erase_node(old_mm)
        if c.pre is not None and not c.pre.users:
            graph.erase_node(c.pre)
    # NOTE [No unfused copy of a fused gather]
    # Whatever else reads the gathered tensor (a saved activation, the view that the backward's
    # weight gradient multiplies, another consumer) reads the fused op's gathered A: the original
    # all-gather must leave the graph, or the step would gather twice.
    others = bool(res.users)
    if others:
        fused.kwargs = {**fused.kwargs, "return_A": True}
        with graph.inserting_after(fused):
            A = graph.call_function(operator.getitem, (fused, 0))
        res.replace_all_uses_with(A)
    _erase_dead(graph, [*g.nodes, *extra_nodes])
    if g.ag in graph.nodes:  # cannot happen: every user of res now reads A
        raise AssertionError("cuda_p2p async-TP: the fused all-gather left the original behind")
    return others


def _gathered_scale(sa: torch.fx.Node, g: _Gather, shard_t: torch.Tensor):
    """(the scale shard, the gather's nodes) when ``sa`` is the rowwise scale of the gathered
    fp8 tensor, itself gathered like it (same group, same gather dim) and shaped
    ``shard.shape[:-1] + (1,)`` (or a view of that as the [rows, 1] matrix of a flattened
    gather along dim 0); else None."""
    c10d = _c10d()
    node = sa
    if sa.target in _VIEWS and g.gather_dim == 0:
        node = sa.args[0]
    for n in [node, *node.all_input_nodes]:
        if n.target is c10d.wait_tensor.default:
            ag = n.args[0]
            break
    else:
        return None
    if ag.target is not c10d.all_gather_into_tensor.default or \
            _arg(ag, 2, "group_name") != g.group_name:
        return None
    g2, _ = _match_gather(ag)
    if g2 is None or g2.res is not node or g2.gather_dim != g.gather_dim:
        return None
    st = _val(g2.shard)
    if st is None or st.dtype != torch.float32 or \
            not _same(list(st.shape), [*shard_t.shape[:-1], 1]):
        return None
    return g2.shard, g2.nodes


def _fuse_all_gather_scaled(g: _Gather, stats: dict) -> None:
    """NOTE [Scaled matmuls in the pipelines]: a gathered fp8 tensor consumed by _scaled_mm(s)
    with one A scale: tensorwise (one element, not computed from the gathered tensor), or
    rowwise, gathered from the ranks' scale shards like A (its gather then leaves the graph too,
    unless something else reads it)."""
    graph = g.ag.graph
    res = g.res
    shard_t = _val(g.shard)
    what = "all-gather"
    if shard_t.dim() < 2 or g.gather_dim == shard_t.dim() - 1:
        _left(stats, what, g.ag, "an fp8 gather of the contraction dim (no per-rank scale)")
        return
    consumers = [c for c in _consumers(res, _scaled_of)
                 if all(x is not res and res not in _ancestors(x)
                        for x in (c.B, *c.scaled[:2]))]
    if not consumers:
        _left(stats, what, g.ag, "no _scaled_mm (out_dtype float32/bfloat16, no bias, result "
              "scale or fast accumulation) consumes the gathered fp8 tensor as its left operand")
        return
    scale_nodes = {c.scaled[0] for c in consumers}
    if len(scale_nodes) != 1:
        _left(stats, what, g.ag, "the _scaled_mm consumers use different A scales")
        return
    sa = next(iter(scale_nodes))
    sa_t = _val(sa)
    if sa_t is None or any(_val(x) is None for c in consumers for x in (c.B, c.scaled[1])):
        _left(stats, what, g.ag, "no tensor metadata on a scale or a B")
        return
    extra = []
    if sa_t.numel() == 1:
        A_scale = sa
    else:
        found = _gathered_scale(sa, g, shard_t)
        if found is None:
            _left(stats, what, g.ag, "the rowwise A scale is not gathered from scale shards "
                  "[*shard.shape[:-1], 1] like A (same group and dim)")
            return
        A_scale, extra = found
        extra = [sa, *extra]  # a view of the gathered scale, then its gather
    with graph.inserting_before(g.ag):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_all_gather_scaled_matmul.default,
            args=(g.shard, [c.B for c in consumers], A_scale, [c.scaled[1] for c in consumers],
                  g.gather_dim, g.group_name),
            kwargs={"out_dtypes": [c.scaled[2] for c in consumers], "return_A": False},
        )
    _raise_before(fused, [A_scale, *[x for c in consumers for x in (c.B, c.scaled[1])]])
    others = _replace_gather_consumers(graph, fused, consumers, g, extra)
    mode = "tensorwise" if sa_t.numel() == 1 else "rowwise, the scales gathered with A"
    _fused(stats, what, g.ag,
           f"fp8 fused_all_gather_scaled_matmul, {mode}, gather_dim={g.gather_dim}, "
           f"{len(consumers)} _scaled_mm(s)"
           + (", return_A (the gathered tensor has other users)" if others else ""))


# ---- matmul -> reduce-scatter ----------------------------------------------------------------


def _match_scatter_input(inp: torch.fx.Node):
    """(P, scatter_dim, perm, nodes): the reduce-scatter of ``inp`` (along dim 0) is the
    reduce-scatter of ``P`` along ``scatter_dim``, permuted by ``perm`` (None: as it is). Forms:
    ``P`` itself (dim 0); funcol's ``cat(split(P, dim=d))`` (dim d); DTensor's
    ``clone(permute(P, perm))`` (dim perm[0]), whose scattered chunk r is chunk r of P along
    perm[0], permuted. None when the input is a cat of pieces of several tensors."""
    nodes = []
    n = inp
    while n.target is aten.clone.default and len(n.users) == 1:
        nodes.append(n)
        n = n.args[0]
    if n.target is aten.cat.default and _arg(n, 1, "dim", 0) == 0 and len(n.users) == 1:
        pieces = list(n.args[0])
        srcs, dims = set(), set()
        nodes.append(n)
        for p in pieces:
            if p.target is operator.getitem and p.args[0].target in _SPLITS:
                sp = p.args[0]
                srcs.add(sp.args[0])
                dims.add(_arg(sp, 2, "dim", 0))
                nodes += [p, sp]
            elif p.target is aten.slice.Tensor:
                srcs.add(p.args[0])
                dims.add(_arg(p, 1, "dim", 0))
                nodes.append(p)
            else:
                return None
        if len(srcs) == 1 and len(dims) == 1:
            src = next(iter(srcs))
            d = next(iter(dims))
            t = _val(src)
            if t is not None:
                return src, d % t.dim(), None, list(dict.fromkeys(nodes))
        return None
    if n.target is aten.permute.default and len(n.users) == 1:
        perm = [int(d) % len(n.args[1]) for d in n.args[1]]
        nodes.append(n)
        return n.args[0], perm[0], perm, nodes
    return n, 0, None, nodes


class _Terms:
    """``P = sum_i A_i @ B_i (+ bias)``, each A_i with P's leading dims."""

    def __init__(self):
        self.terms, self.bias, self.nodes = [], None, []
        self.scaled = None  # (scale_a, scale_b, out_dtype): P is one _scaled_mm
        self.why = ""


def _matmul_terms(P: torch.fx.Node, group_name: str) -> _Terms:
    """Splits P into matmul terms through mm, addmm, add and the views of a linear layer's 3-D
    form; ``why`` says what did not fit."""
    r = _Terms()
    Pt = _val(P)
    if Pt is None:
        r.why = "no tensor metadata on its input"
        return r
    lead = list(Pt.shape[:-1])

    def left(A):
        """A as [*lead, K]: the N-D tensor that A flattens, or a view of the 2-D A."""
        At = _val(A)
        if At is None:
            return None
        if At.dim() == len(lead) + 1 and _same(list(At.shape[:-1]), lead):
            return A
        if A.target in _VIEWS:
            src = _val(A.args[0])
            if src is not None and src.dim() == len(lead) + 1 and \
                    _same(list(src.shape[:-1]), lead) and _same([src.shape[-1]], [At.shape[-1]]):
                return A.args[0]
        return (A, [*lead, At.shape[-1]])  # a view to insert

    def walk(n) -> bool:
        nv = _val(n)
        if nv is None:
            r.why = f"no tensor metadata on {n.name}"
            return False
        if n.target in _VIEWS:
            inner = _val(n.args[0])
            if inner is None or inner.dim() != 2 or not _same([inner.shape[-1]],
                                                                  [nv.shape[-1]]):
                r.why = f"{n.name} is a view that does not flatten the leading dims"
                return False
            r.nodes.append(n)
            return walk(n.args[0])
        if n.target is aten.mm.default:
            r.nodes.append(n)
            r.terms.append((n.args[0], n.args[1]))
            return True
        if n.target is aten._scaled_mm.default:
            parts = _scaled_parts(n)
            if parts is None:
                r.why = (f"{n.name} is a _scaled_mm with a bias, a result scale, fast "
                         "accumulation or an out_dtype other than float32/bfloat16")
                return False
            r.nodes.append(n)
            r.terms.append((parts[0], parts[1]))
            r.scaled = parts[2:]
            return True
        if n.target is aten.add.Tensor and not n.kwargs and all(
                isinstance(a, torch.fx.Node) and _val(a) is not None
                and _same(list(_val(a).shape), list(nv.shape)) for a in n.args):
            r.nodes.append(n)
            return walk(n.args[0]) and walk(n.args[1])
        if n.target is aten.addmm.default and not n.kwargs:
            c, A, B = n.args
            r.nodes.append(n)
            r.terms.append((A, B))
            ct = _val(c)
            if ct is not None and ct.dim() == 2 and _same(list(ct.shape), list(nv.shape)):
                return walk(c)  # inductor's form of a sum of matmuls
            bias = _dtensor_bias(c, group_name)
            if bias is None or r.bias is not None:
                r.why = ("addmm's bias is not bias / group_size (a replicated bias made partial); "
                         "reduce-scattering it needs its own collective")
                return False
            r.bias = bias
            return True
        what = getattr(n.target, "__name__", str(n.target))
        r.why = f"its input is produced by {what}, not by mm / addmm / a sum of them"
        return False

    if not walk(P):
        r.terms = []
        return r
    if r.scaled is not None and (len(r.terms) != 1 or r.bias is not None):
        r.terms, r.why = [], "a sum of _scaled_mm terms (or one with a bias) is not fused"
        return r
    r.terms = [(left(A), B) for A, B in r.terms]
    if any(a is None for a, _ in r.terms):
        r.terms, r.why = [], "no tensor metadata on a matmul's left operand"
    return r


def _fuse_reduce_scatter(rs: torch.fx.Node, stats: dict) -> None:
    c10d = _c10d()
    graph = rs.graph
    reduce_op, group_name = _arg(rs, 1, "reduce_op"), _arg(rs, 3, "group_name")
    waits = [u for u in rs.users if u.target is c10d.wait_tensor.default]
    if len(waits) != 1 or any(u.op != "output" for u in rs.users if u is not waits[0]):
        _left(stats, "reduce-scatter", rs, "not used through one wait_tensor")
        return
    wait = waits[0]
    if reduce_op not in ("sum", "avg"):
        _left(stats, "reduce-scatter", rs, f"reduce_op {reduce_op!r} (only sum and avg fuse)")
        return
    m = _match_scatter_input(rs.args[0])
    if m is None:
        _left(stats, "reduce-scatter", rs, "its input is a cat of pieces of several tensors")
        return
    P, sd, perm, chunk_nodes = m
    t = _matmul_terms(P, group_name)
    if not t.terms:
        _left(stats, "reduce-scatter", rs, t.why)
        return
    Pt = _val(P)
    if t.bias is not None and sd == Pt.dim() - 1:
        _left(stats, "reduce-scatter", rs, "addmm with the bias's dim scattered")
        return
    inner = set(t.nodes) | set(chunk_nodes) | {rs}
    for n in [P, *t.nodes]:
        if any(u not in inner for u in n.users):
            _left(stats, "reduce-scatter", rs, f"the matmul's result ({n.name}) has other users")
            return
    operands = [x for A, B in t.terms for x in ((A[0] if isinstance(A, tuple) else A), B)]
    if any(wait in _ancestors(x) or x is wait for x in operands):
        _left(stats, "reduce-scatter", rs, "its result feeds the matmul")
        return
    if t.scaled is not None:
        _fuse_scaled_reduce_scatter(rs, wait, t, P, sd, perm, chunk_nodes, stats)
        return
    dtypes = {_val(x).dtype for x in operands if _val(x) is not None}
    if len(dtypes) != 1:
        _left(stats, "reduce-scatter", rs,
              f"the matmuls' operands have dtypes {sorted(map(str, dtypes))}")
        return
    with graph.inserting_before(wait):
        As, Bs = [], []
        for A, B in t.terms:
            if isinstance(A, tuple):
                A = graph.call_function(aten.reshape.default, (A[0], A[1]))
            As.append(A)
            Bs.append(B)
        if len(As) == 1:
            A, B = As[0], Bs[0]
        else:
            # NOTE [A sum of matmuls reduce-scattered]: sum_i A_i @ B_i is one matmul of the
            # concatenated [A_0 | A_1 | ...] with the stacked [B_0; B_1; ...]; one fused op
            # instead of a reduce-scatter left unfused (or one per term: W-fold the traffic).
            A = graph.call_function(aten.cat.default, (As, -1))
            B = graph.call_function(aten.cat.default, (Bs, 0))
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_matmul_reduce_scatter.default,
            args=(A, B, reduce_op, sd, group_name),
        )
        out = fused
        if t.bias is not None:
            if reduce_op == "avg":
                out = graph.call_function(aten.div.Tensor, (t.bias, _group_size(group_name)))
                out = graph.call_function(aten.add.Tensor, (fused, out))
            else:
                out = graph.call_function(aten.add.Tensor, (fused, t.bias))
        if perm is not None:
            out = graph.call_function(aten.permute.default, (out, perm))
    wait.replace_all_uses_with(out)
    for u in list(rs.users):
        if u.op == "output":
            u.replace_input_with(rs, out)
    _erase_dead(graph, [wait, rs, *chunk_nodes, *t.nodes])
    _fused(stats, "reduce-scatter", rs,
           f"{reduce_op}, scatter_dim={sd}, {len(t.terms)} matmul(s)"
           + (", + bias" if t.bias is not None else "")
           + (f", permuted {perm}" if perm is not None else ""))


def _fuse_scaled_reduce_scatter(rs, wait, t: _Terms, P, sd, perm, chunk_nodes, stats) -> None:
    """NOTE [Scaled matmuls in the pipelines]: P = _scaled_mm(A, B, scale_a, scale_b) (through
    the views of a linear layer's N-D form) reduce-scattered: one
    fused_scaled_matmul_reduce_scatter, a rowwise scale viewed with A's leading dims."""
    graph = rs.graph
    reduce_op, group_name = _arg(rs, 1, "reduce_op"), _arg(rs, 3, "group_name")
    (A, B), = t.terms
    sa, sb, out_dtype = t.scaled
    sa_t, Pt = _val(sa), _val(P)
    if sa_t is None or _val(sb) is None:
        _left(stats, "reduce-scatter", rs, "no tensor metadata on a scale")
        return
    with graph.inserting_before(wait):
        if isinstance(A, tuple):
            A = graph.call_function(aten.reshape.default, (A[0], A[1]))
        A_scale = sa
        if sa_t.numel() != 1 and Pt.dim() != 2:
            A_scale = graph.call_function(aten.reshape.default, (sa, [*Pt.shape[:-1], 1]))
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_scaled_matmul_reduce_scatter.default,
            args=(A, B, A_scale, sb, reduce_op, sd, group_name),
            kwargs={"out_dtype": out_dtype},
        )
        out = fused
        if perm is not None:
            out = graph.call_function(aten.permute.default, (out, perm))
    wait.replace_all_uses_with(out)
    for u in list(rs.users):
        if u.op == "output":
            u.replace_input_with(rs, out)
    _erase_dead(graph, [wait, rs, *chunk_nodes, *t.nodes])
    mode = "tensorwise" if sa_t.numel() == 1 else "rowwise"
    _fused(stats, "reduce-scatter", rs,
           f"fp8 fused_scaled_matmul_reduce_scatter, {mode}, {reduce_op}, scatter_dim={sd}"
           + (f", permuted {perm}" if perm is not None else ""))


def _group_size(group_name: str) -> int:
    return dist.distributed_c10d._resolve_process_group(group_name).size()


def _dtensor_bias(c: torch.fx.Node, group_name: str) -> Optional[torch.fx.Node]:
    """``b`` when ``c`` is ``b / group_size`` with b a vector: DTensor turns a replicated bias
    into a partial one that way, so the reduce-scatter of ``A @ B + c`` is the fused op + b."""
    if not isinstance(c, torch.fx.Node) or c.target is not aten.div.Tensor:
        return None
    b, div = c.args
    bt = _val(b)
    if bt is None or bt.dim() != 1 or div != _group_size(group_name):
        return None
    return b


# ---- PyTorch's symm_mem ops -> ours ----------------------------------------------------------


def _symm_mem_targets():
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)

        sm = torch.ops.symm_mem
        return {
            sm.fused_all_gather_matmul.default: (
                torch.ops.cuda_p2p.fused_all_gather_matmul.default, 3),
            sm.fused_matmul_reduce_scatter.default: (
                torch.ops.cuda_p2p.fused_matmul_reduce_scatter.default, 4),
        }
    except (AttributeError, ImportError, RuntimeError):
        return {}


# ---- the pass --------------------------------------------------------------------------------


def _left(stats: dict, what: str, node: torch.fx.Node, why: str) -> None:
    stats["left"] += 1
    stats["left_items"].append((what, node.name, why))
    log.debug("cuda_p2p async-TP: left %s %s: %s", what, node.name, why)


def _fused(stats: dict, what: str, node: torch.fx.Node, how: str) -> None:
    stats["all_gather_matmul" if what == "all-gather" else "matmul_reduce_scatter"] += 1
    stats["fused_items"].append((what, node.name, how))
    log.info("cuda_p2p async-TP: fused %s %s (%s, group %s)",
             "all-gather" if what == "all-gather" else "matmul with reduce-scatter", node.name,
             how, _arg(node, 2 if what == "all-gather" else 3, "group_name"))


def rewrite(graph: torch.fx.Graph, *, all_gather_matmul: bool = True,
            matmul_reduce_scatter: bool = True) -> dict:
    """Rewrites ``graph`` in place; returns how many patterns were fused and left, and each
    one's node and reason (``fused_items`` / ``left_items``: (kind, node name, why))."""
    c10d = _c10d()
    stats = {"all_gather_matmul": 0, "matmul_reduce_scatter": 0, "symm_mem": 0, "left": 0,
             "fused_items": [], "left_items": []}
    symm = _symm_mem_targets()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in symm:
            ours, gi = symm[node.target]
            if _is_cuda_p2p_group_name(_arg(node, gi, "group_name")):
                node.target = ours
                stats["symm_mem"] += 1
                log.info("cuda_p2p async-TP: %s -> %s", node.name, ours)
    # fp8 gathers first: one may take the gather of its rowwise scales with it, which must not be
    # reported as a gather left unfused.
    gathers = [n for n in graph.nodes if n.target is c10d.all_gather_into_tensor.default]
    gathers.sort(key=lambda n: not (_val(n.args[0]) is not None
                                    and _val(n.args[0]).dtype in _FP8))
    for node in gathers:
        if node not in graph.nodes:
            continue
        if not _is_cuda_p2p_group_name(_arg(node, 2, "group_name")):
            _left(stats, "all-gather", node, "not on a cuda_p2p group")
        elif not all_gather_matmul:
            _left(stats, "all-gather", node, "all_gather_matmul=False")
        else:
            g, why = _match_gather(node)
            if g is None:
                _left(stats, "all-gather", node, why)
            else:
                _fuse_all_gather(g, stats)
    for node in list(graph.nodes):
        if node.target is not c10d.reduce_scatter_tensor.default or node not in graph.nodes:
            continue
        if not _is_cuda_p2p_group_name(_arg(node, 3, "group_name")):
            _left(stats, "reduce-scatter", node, "not on a cuda_p2p group")
        elif not matmul_reduce_scatter:
            _left(stats, "reduce-scatter", node, "matmul_reduce_scatter=False")
        else:
            _fuse_reduce_scatter(node, stats)
    graph.lint()
    return stats


class GraphReport:
    """What the pass did to one graph: ``fused`` and ``left``, lists of (kind, node, how/why),
    kind "all-gather" or "reduce-scatter"."""

    def __init__(self, index: int, stats: dict):
        self.index = index
        self.fused = list(stats["fused_items"])
        self.left = list(stats["left_items"])
        self.symm_mem = stats["symm_mem"]

    def __str__(self) -> str:
        ag = sum(1 for k, *_ in self.fused if k == "all-gather")
        rs = len(self.fused) - ag
        lines = [f"graph {self.index}: fused {ag} all-gather->matmul, {rs} "
                 f"matmul->reduce-scatter; left {len(self.left)}"]
        lines += [f"  {k} {n}: fused ({how})" for k, n, how in self.fused]
        lines += [f"  {k} {n}: LEFT: {why}" for k, n, why in self.left]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"GraphReport({self.index}, fused={self.fused}, left={self.left})"


def async_tp_report() -> list:
    """The installed pass's report: one ``GraphReport`` per graph it rewrote since it was
    enabled (every forward and backward graph inductor compiled; none for an FX-cache hit,
    where the cached rewrite is reused). ``str()`` of each says what was fused and why each
    collective that was not was left. Empty when the pass is not enabled."""
    if "torch._inductor.config" not in sys.modules:
        return []
    for p in _current_passes():
        if _is_ours(p):
            return list(p.reports)
    return []


def _source_hash() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in ("_async_tp.py", "_autograd.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


class _AsyncTPPassBody:
    """The post-grad pass; ``uuid()`` covers our sources, the options, the torch version and
    which group names are cuda_p2p groups here, so a cached graph is reused only where the
    same rewrite would be made."""

    _cuda_p2p_async_tp = True

    def __init__(self, **options):
        self.options = dict(sorted(options.items()))
        self.calls = 0  # graphs seen (a test's witness that the pass ran)
        self.reports = []  # GraphReport per graph (async_tp_report())

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1
        stats = rewrite(graph, **self.options)
        report = GraphReport(len(self.reports), stats)
        self.reports.append(report)
        # One summary per graph at INFO, so that a miss is seen without a debugger.
        if report.fused or report.left:
            log.info("cuda_p2p async-TP: %s", report)

    def uuid(self) -> Any:
        return (
            "cuda_p2p.async_tp",
            _source_hash(),
            tuple(self.options.items()),
            torch.__version__,
            tuple(_cuda_p2p_group_names()),
        )


_pass_class = None


def _make_pass(**options):
    global _pass_class
    if _pass_class is None:
        from torch._inductor.custom_graph_pass import CustomGraphPass

        _pass_class = type("AsyncTPPass", (_AsyncTPPassBody, CustomGraphPass), {})
    return _pass_class(**options)


def _is_ours(p) -> bool:
    return getattr(p, "_cuda_p2p_async_tp", False)


def _inductor_config():
    from torch._inductor import config

    return config


# NOTE [One post-grad pass on older torch]
# torch 2.14's inductor runs every pass of a list in post_grad_custom_post_pass
# (custom_graph_pass.get_custom_graph_passes); torch 2.11 calls the setting itself, so a list
# fails there ("'list' object is not callable", found running the suite under 2.11, the GPU
# machines' torch). Where lists are not taken, several passes are installed as one chain that
# calls them in order: a CustomGraphPass whose uuid is its members' when every member is one (the
# FX graph cache keeps working), else a plain callable, for which inductor bypasses the cache as
# it does for the user's callable alone.
class _ChainBody:
    _cuda_p2p_chain = True

    def __init__(self, passes):
        self.passes = list(passes)

    def __call__(self, graph):
        for p in self.passes:
            p(graph)


class _PlainChain(_ChainBody):
    pass


_chain_class = None


def _takes_lists() -> bool:
    from torch._inductor import custom_graph_pass

    return hasattr(custom_graph_pass, "get_custom_graph_passes")


def _install(passes: list) -> None:
    global _chain_class
    if len(passes) <= 1 or _takes_lists():
        value = None if not passes else passes[0] if len(passes) == 1 else passes
    else:
        from torch._inductor.custom_graph_pass import CustomGraphPass

        if all(isinstance(p, CustomGraphPass) for p in passes):
            if _chain_class is None:
                _chain_class = type("ChainedCustomGraphPass", (_ChainBody, CustomGraphPass), {
                    "uuid": lambda self: ("cuda_p2p.chain", tuple(p.uuid() for p in self.passes))})
            value = _chain_class(passes)
        else:
            value = _PlainChain(passes)
    _inductor_config().post_grad_custom_post_pass = value


def _current_passes() -> list:
    cur = _inductor_config().post_grad_custom_post_pass
    if cur is None:
        return []
    if getattr(cur, "_cuda_p2p_chain", False):
        return list(cur.passes)
    return list(cur) if isinstance(cur, (list, tuple)) else [cur]


def enable_async_tp(*, all_gather_matmul: bool = True,
                    matmul_reduce_scatter: bool = True):
    """Installs the pass (after any post-grad custom pass already set, which keeps running);
    returns it (a ``CustomGraphPass``)."""
    disable_async_tp()
    p = _make_pass(all_gather_matmul=all_gather_matmul,
                   matmul_reduce_scatter=matmul_reduce_scatter)
    _install(_current_passes() + [p])
    return p


def disable_async_tp() -> None:
    """Removes the pass; other post-grad passes stay."""
    if "torch._inductor.config" not in sys.modules:
        return  # never enabled
    passes = [p for p in _current_passes() if not _is_ours(p)]
    if len(passes) != len(_current_passes()):
        _install(passes)


def is_async_tp_enabled() -> bool:
    if "torch._inductor.config" not in sys.modules:
        return False
    return any(_is_ours(p) for p in _current_passes())


@contextlib.contextmanager
def async_tp(**options):
    """Enables the pass inside the block; restores the previous state after it."""
    was = [p for p in _current_passes() if _is_ours(p)] if is_async_tp_enabled() else []
    p = enable_async_tp(**options)
    try:
        yield p
    finally:
        disable_async_tp()
        if was:
            enable_async_tp(**was[0].options)


if os.environ.get("CUDA_P2P_ASYNC_TP", "0") not in ("", "0"):
    enable_async_tp()
