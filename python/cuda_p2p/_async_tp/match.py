"""Finding what the pass fuses in a post-grad FX graph, without changing the graph.

Each ``match_*`` returns ``(match, "")`` or ``(None, why)``: a match holds every node the rewrite
(fuse.py) needs and has passed every check, so that a rewrite never starts on a graph it cannot
finish; ``why`` is what the report says of a collective left alone.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Optional

import torch
import torch.distributed as dist

aten = torch.ops.aten
VIEWS = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def c10d():
    return torch.ops._c10d_functional


# ---- groups ----------------------------------------------------------------------------------


def is_cuda_p2p_group_name(group_name: Any) -> bool:
    from .._backend import ProcessGroupCudaP2P

    if not isinstance(group_name, str):
        return False
    try:
        pg = dist.distributed_c10d._resolve_process_group(group_name)
        backend = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001  (an unknown name, or no CPU backend)
        return False
    return isinstance(backend, ProcessGroupCudaP2P)


def cuda_p2p_group_names() -> list[str]:
    """The names of this process's cuda_p2p groups: part of the pass's uuid, because the rewrite
    of a graph (which names its groups) depends on which backend each name runs on."""
    if not dist.is_initialized():
        return []
    names = dist.distributed_c10d._world.pg_names.values()
    return sorted(n for n in names if is_cuda_p2p_group_name(n))


def group_size(group_name: str) -> int:
    return dist.distributed_c10d._resolve_process_group(group_name).size()


# ---- FX helpers ------------------------------------------------------------------------------


def val(node) -> Optional[torch.Tensor]:
    """The node's example tensor (``meta["val"]``), or None."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def arg(node: torch.fx.Node, i: int, name: str, default=None):
    """The node's argument ``name``, passed by position ``i`` or by keyword."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def same(a, b) -> bool:
    """Sizes equal for every value of the symbols (no guard is added under dynamic shapes)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if len(a) != len(b):
        return False
    return all(statically_known_true(x == y) for x, y in zip(a, b))


def ancestors(node: torch.fx.Node) -> set:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


# ---- all-gather -> matmul --------------------------------------------------------------------


@dataclasses.dataclass
class Gather:
    """``res`` is the all-gather ``ag`` of ``shard`` along ``gather_dim``; ``nodes`` are the
    gather's own (the collective, its wait, funcol's split/cat or view), erased with it."""

    ag: torch.fx.Node
    wait: torch.fx.Node
    res: torch.fx.Node
    nodes: list
    gather_dim: int
    shard: Any
    group_name: Any


def match_gather(ag: torch.fx.Node) -> tuple[Optional[Gather], str]:
    """The gathered tensor of ``all_gather_into_tensor`` node ``ag`` and its gather dim."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    shard, group_name = ag.args[0], arg(ag, 2, "group_name")
    waits = [u for u in ag.users if u.target is c10d().wait_tensor.default]
    if len(waits) != 1 or len(ag.users) != 1:
        return None, "the all-gather's result is used other than through one wait_tensor"
    wait = waits[0]
    users = list(wait.users)
    # funcol's view form of a gather along dim d when every dim before d has size 1
    # (_maybe_view_chunk_cat): one view of the dim-0 result, [W*s0, ...] -> [..., W*s_d, ...].
    st, W = val(shard), arg(ag, 1, "group_size")
    if len(users) == 1 and users[0].target in VIEWS and st is not None and isinstance(W, int):
        vt = val(users[0])
        s = list(st.shape)
        for d in range(1, len(s)):
            if vt is not None and same(list(vt.shape), s[:d] + [s[d] * W] + s[d + 1:]) and \
                    all(statically_known_true(x == 1) for x in s[:d]):
                return Gather(ag, wait, users[0], [ag, wait, users[0]], d, shard, group_name), ""
    # gather_dim > 0: funcol chunks the dim-0 result and concatenates the chunks along the dim.
    parts = []
    for u in users:
        if u.target in SPLITS and arg(u, 2, "dim", 0) == 0:
            if not all(g.target is operator.getitem for g in u.users):
                parts = None
                break
            parts.append(u)
        elif u.target is aten.slice.Tensor and arg(u, 1, "dim", 0) == 0:
            parts.append(u)
        else:
            parts = None
            break
    if parts:
        pieces = [g for p in parts for g in (p.users if p.target in SPLITS else [p])]
        cats = {c for p in pieces for c in p.users}
        if len(cats) == 1:
            cat = next(iter(cats))
            if cat.target is aten.cat.default and all(len(p.users) == 1 for p in pieces):
                gd = arg(cat, 1, "dim", 0)
                t = val(cat)
                if t is not None and isinstance(gd, int):
                    gd %= t.dim()
                    if list(cat.args[0]) == pieces or set(cat.args[0]) == set(pieces):
                        return Gather(ag, wait, cat, [ag, wait, *parts, *pieces, cat], gd,
                                      shard, group_name), ""
        return None, "the gathered tensor is split but not reassembled by one cat"
    return Gather(ag, wait, wait, [ag, wait], 0, shard, group_name), ""


@dataclasses.dataclass
class Consumer:
    """``res @ B`` found among res's users: mm, addmm, or view -> mm / addmm [-> view]."""

    # What the fused output replaces: the matmul, or the view of its product back to N-D (None:
    # no such view; the 2-D product's users then read a view of the output).
    out: Optional[torch.fx.Node]
    B: Any
    bias: Any = None
    pre: Optional[torch.fx.Node] = None  # the view of res as a matrix, if any
    mm: Optional[torch.fx.Node] = None  # the mm / addmm / _scaled_mm
    scaled: Optional[tuple] = None  # (scale_a, scale_b, out_dtype) of a _scaled_mm


def _flat_view(u: torch.fx.Node, t: torch.Tensor) -> bool:
    """``u`` views the N-D ``t`` as the matrix [rows, t.shape[-1]]."""
    v = val(u)
    return (u.target in VIEWS and v is not None and v.dim() == 2 and t.dim() > 2
            and same([v.shape[-1]], [t.shape[-1]]))


def _matmul_of(u: torch.fx.Node, left: torch.fx.Node):
    """(B, bias) when ``u`` is ``mm(left, B)`` or ``addmm(bias, left, B)`` with a broadcast
    bias; else None."""
    if u.target is aten.mm.default and u.args[0] is left:
        return u.args[1], None
    if u.target is aten.addmm.default and u.args[1] is left and not u.kwargs:
        bt = val(u.args[0])
        if bt is not None and bt.dim() <= 1:  # a broadcast bias only
            return u.args[2], u.args[0]
    return None


def scaled_parts(u: torch.fx.Node):
    """(A, B, scale_a, scale_b, out_dtype) of ``_scaled_mm(A, B, scale_a, scale_b,
    out_dtype=float32|bfloat16)`` with no bias, result scale or fast accumulation (what the fused
    fp8 ops take); else None."""
    if u.target is not aten._scaled_mm.default:
        return None
    A, B, sa, sb = u.args[:4]
    bias, scale_result = arg(u, 4, "bias"), arg(u, 5, "scale_result")
    out_dtype, fast = arg(u, 6, "out_dtype"), arg(u, 7, "use_fast_accum", False)
    if bias is not None or scale_result is not None or fast:
        return None
    if out_dtype not in (torch.float32, torch.bfloat16):
        return None
    return A, B, sa, sb, out_dtype


def _scaled_of(u: torch.fx.Node, left: torch.fx.Node):
    """(B, None, (scale_a, scale_b, out_dtype)) when ``u`` is a fusable ``_scaled_mm(left, B,
    ...)``; else None."""
    p = scaled_parts(u)
    if p is None or p[0] is not left:
        return None
    return p[1], None, p[2:]


def _consumers(res: torch.fx.Node, of=None) -> list[Consumer]:
    of = of or _matmul_of
    found = []
    t = val(res)
    for u in res.users:
        m = of(u, res)
        if m is not None:
            found.append(Consumer(u, m[0], bias=m[1], mm=u,
                                  scaled=m[2] if len(m) > 2 else None))
        elif t is not None and _flat_view(u, t):
            for mm in u.users:
                m = of(mm, u)
                if m is None:
                    continue
                # The N-D product is the fused op's output; the 2-D one a view of it. A view back
                # to N-D after the matmul (linear's form) becomes the output itself.
                post = None
                Bv = val(m[0])
                for v in mm.users:
                    pv = val(v)
                    if v.target in VIEWS and pv is not None and Bv is not None and same(
                            list(pv.shape), [*t.shape[:-1], Bv.shape[-1]]):
                        post = v
                        break
                found.append(Consumer(post, m[0], bias=m[1], pre=u, mm=mm,
                                      scaled=m[2] if len(m) > 2 else None))
    return found


@dataclasses.dataclass
class GatheredScale:
    """The A scale of an fp8 gather's ``_scaled_mm`` consumers: ``A_scale`` goes to the fused op
    (the tensorwise scale, or the rank's rowwise scale shard); ``nodes`` (the rowwise scale's
    view and gather) leave the graph with the gather, unless something else reads them."""

    A_scale: torch.fx.Node
    nodes: list
    tensorwise: bool


@dataclasses.dataclass
class GatherMatmuls:
    """A gather whose ``consumers`` multiply the gathered tensor: one fused op for all of them
    (``fused_all_gather_scaled_matmul`` when ``scale`` is set)."""

    gather: Gather
    consumers: list[Consumer]
    scale: Optional[GatheredScale] = None


def match_gather_matmuls(g: Gather) -> tuple[Optional[GatherMatmuls], str]:
    """The matmuls of ``g``'s gathered tensor, fused with the gather (``_scaled_mm`` for an fp8
    shard)."""
    res = g.res
    shard_t = val(g.shard)
    if shard_t is not None and shard_t.dtype in FP8:
        return _match_gather_scaled_matmuls(g, shard_t)
    consumers = [c for c in _consumers(res)
                 if c.B is not res and res not in ancestors(c.B)
                 and (c.bias is None or (c.bias is not res and res not in ancestors(c.bias)))]
    if not consumers:
        return None, ("no mm/addmm/reshape-mm-reshape consumes the gathered tensor as its left "
                      "operand")
    B_ts = [val(c.B) for c in consumers]
    if shard_t is None or any(b is None for b in B_ts):
        return None, "no tensor metadata on the shard or a B"
    if any(b.dtype != shard_t.dtype for b in B_ts) or shard_t.dim() < 2:
        return None, "dtypes differ, or the shard has fewer than 2 dims"
    return GatherMatmuls(g, consumers), ""


def _gathered_scale(sa: torch.fx.Node, g: Gather, shard_t: torch.Tensor):
    """(the scale shard, the gather's nodes) when ``sa`` is the rowwise scale of the gathered
    fp8 tensor, itself gathered like it (same group, same gather dim) and shaped
    ``shard.shape[:-1] + (1,)`` (or a view of that as the [rows, 1] matrix of a flattened
    gather along dim 0); else None."""
    node = sa
    if sa.target in VIEWS and g.gather_dim == 0:
        node = sa.args[0]
    for n in [node, *node.all_input_nodes]:
        if n.target is c10d().wait_tensor.default:
            ag = n.args[0]
            break
    else:
        return None
    if ag.target is not c10d().all_gather_into_tensor.default or \
            arg(ag, 2, "group_name") != g.group_name:
        return None
    g2, _ = match_gather(ag)
    if g2 is None or g2.res is not node or g2.gather_dim != g.gather_dim:
        return None
    st = val(g2.shard)
    if st is None or st.dtype != torch.float32 or \
            not same(list(st.shape), [*shard_t.shape[:-1], 1]):
        return None
    return g2.shard, g2.nodes


def _match_gather_scaled_matmuls(g: Gather, shard_t: torch.Tensor):
    """NOTE [Scaled matmuls in the pipelines]: a gathered fp8 tensor consumed by _scaled_mm(s)
    with one A scale: tensorwise (one element, not computed from the gathered tensor), or
    rowwise, gathered from the ranks' scale shards like A (its gather then leaves the graph too,
    unless something else reads it)."""
    res = g.res
    if shard_t.dim() < 2 or g.gather_dim == shard_t.dim() - 1:
        return None, "an fp8 gather of the contraction dim (no per-rank scale)"
    consumers = [c for c in _consumers(res, _scaled_of)
                 if all(x is not res and res not in ancestors(x)
                        for x in (c.B, *c.scaled[:2]))]
    if not consumers:
        return None, ("no _scaled_mm (out_dtype float32/bfloat16, no bias, result scale or fast "
                      "accumulation) consumes the gathered fp8 tensor as its left operand")
    scale_nodes = {c.scaled[0] for c in consumers}
    if len(scale_nodes) != 1:
        return None, "the _scaled_mm consumers use different A scales"
    sa = next(iter(scale_nodes))
    sa_t = val(sa)
    if sa_t is None or any(val(x) is None for c in consumers for x in (c.B, c.scaled[1])):
        return None, "no tensor metadata on a scale or a B"
    if sa_t.numel() == 1:
        return GatherMatmuls(g, consumers, GatheredScale(sa, [], tensorwise=True)), ""
    found = _gathered_scale(sa, g, shard_t)
    if found is None:
        return None, ("the rowwise A scale is not gathered from scale shards "
                      "[*shard.shape[:-1], 1] like A (same group and dim)")
    A_scale, nodes = found
    # a view of the gathered scale, then its gather
    return GatherMatmuls(g, consumers, GatheredScale(A_scale, [sa, *nodes], tensorwise=False)), ""


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
    if n.target is aten.cat.default and arg(n, 1, "dim", 0) == 0 and len(n.users) == 1:
        pieces = list(n.args[0])
        srcs, dims = set(), set()
        nodes.append(n)
        for p in pieces:
            if p.target is operator.getitem and p.args[0].target in SPLITS:
                sp = p.args[0]
                srcs.add(sp.args[0])
                dims.add(arg(sp, 2, "dim", 0))
                nodes += [p, sp]
            elif p.target is aten.slice.Tensor:
                srcs.add(p.args[0])
                dims.add(arg(p, 1, "dim", 0))
                nodes.append(p)
            else:
                return None
        if len(srcs) == 1 and len(dims) == 1:
            src = next(iter(srcs))
            d = next(iter(dims))
            t = val(src)
            if t is not None:
                return src, d % t.dim(), None, list(dict.fromkeys(nodes))
        return None
    if n.target is aten.permute.default and len(n.users) == 1:
        perm = [int(d) % len(n.args[1]) for d in n.args[1]]
        nodes.append(n)
        return n.args[0], perm[0], perm, nodes
    return n, 0, None, nodes


@dataclasses.dataclass
class Terms:
    """``P = sum_i A_i @ B_i (+ bias)``, each A_i with P's leading dims: a node, or (a 2-D node,
    the N-D shape to view it as)."""

    terms: list = dataclasses.field(default_factory=list)
    bias: Any = None
    nodes: list = dataclasses.field(default_factory=list)
    scaled: Optional[tuple] = None  # (scale_a, scale_b, out_dtype): P is one _scaled_mm
    why: str = ""


def _dtensor_bias(c: torch.fx.Node, group_name: str) -> Optional[torch.fx.Node]:
    """``b`` when ``c`` is ``b / group_size`` with b a vector: DTensor turns a replicated bias
    into a partial one that way, so the reduce-scatter of ``A @ B + c`` is the fused op + b."""
    if not isinstance(c, torch.fx.Node) or c.target is not aten.div.Tensor:
        return None
    b, div = c.args
    bt = val(b)
    if bt is None or bt.dim() != 1 or div != group_size(group_name):
        return None
    return b


def _matmul_terms(P: torch.fx.Node, group_name: str) -> Terms:
    """Splits P into matmul terms through mm, addmm, add and the views of a linear layer's 3-D
    form; ``why`` says what did not fit."""
    r = Terms()
    Pt = val(P)
    if Pt is None:
        r.why = "no tensor metadata on its input"
        return r
    lead = list(Pt.shape[:-1])

    def left(A):
        """A as [*lead, K]: the N-D tensor that A flattens, or a view of the 2-D A."""
        At = val(A)
        if At is None:
            return None
        if At.dim() == len(lead) + 1 and same(list(At.shape[:-1]), lead):
            return A
        if A.target in VIEWS:
            src = val(A.args[0])
            if src is not None and src.dim() == len(lead) + 1 and \
                    same(list(src.shape[:-1]), lead) and same([src.shape[-1]], [At.shape[-1]]):
                return A.args[0]
        return (A, [*lead, At.shape[-1]])  # a view to insert

    def walk(n) -> bool:
        nv = val(n)
        if nv is None:
            r.why = f"no tensor metadata on {n.name}"
            return False
        if n.target in VIEWS:
            inner = val(n.args[0])
            if inner is None or inner.dim() != 2 or not same([inner.shape[-1]], [nv.shape[-1]]):
                r.why = f"{n.name} is a view that does not flatten the leading dims"
                return False
            r.nodes.append(n)
            return walk(n.args[0])
        if n.target is aten.mm.default:
            r.nodes.append(n)
            r.terms.append((n.args[0], n.args[1]))
            return True
        if n.target is aten._scaled_mm.default:
            parts = scaled_parts(n)
            if parts is None:
                r.why = (f"{n.name} is a _scaled_mm with a bias, a result scale, fast "
                         "accumulation or an out_dtype other than float32/bfloat16")
                return False
            r.nodes.append(n)
            r.terms.append((parts[0], parts[1]))
            r.scaled = parts[2:]
            return True
        if n.target is aten.add.Tensor and not n.kwargs and all(
                isinstance(a, torch.fx.Node) and val(a) is not None
                and same(list(val(a).shape), list(nv.shape)) for a in n.args):
            r.nodes.append(n)
            return walk(n.args[0]) and walk(n.args[1])
        if n.target is aten.addmm.default and not n.kwargs:
            c, A, B = n.args
            r.nodes.append(n)
            r.terms.append((A, B))
            ct = val(c)
            if ct is not None and ct.dim() == 2 and same(list(ct.shape), list(nv.shape)):
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


@dataclasses.dataclass
class MatmulScatter:
    """The reduce-scatter ``rs`` (awaited by ``wait``) of ``P``, the sum of matmuls ``terms``,
    along ``scatter_dim``, permuted by ``perm``; ``chunk_nodes`` carry P to the collective
    (funcol's split/cat, DTensor's permute/clone)."""

    rs: torch.fx.Node
    wait: torch.fx.Node
    P: torch.fx.Node
    scatter_dim: int
    perm: Optional[list]
    chunk_nodes: list
    terms: Terms
    reduce_op: str
    group_name: str


def match_matmul_scatter(rs: torch.fx.Node) -> tuple[Optional[MatmulScatter], str]:
    """The matmuls that produce the input of ``reduce_scatter_tensor`` node ``rs``, fused with
    it (one ``_scaled_mm``: the fp8 op)."""
    reduce_op, group_name = arg(rs, 1, "reduce_op"), arg(rs, 3, "group_name")
    waits = [u for u in rs.users if u.target is c10d().wait_tensor.default]
    if len(waits) != 1 or any(u.op != "output" for u in rs.users if u is not waits[0]):
        return None, "not used through one wait_tensor"
    wait = waits[0]
    if reduce_op not in ("sum", "avg"):
        return None, f"reduce_op {reduce_op!r} (only sum and avg fuse)"
    m = _match_scatter_input(rs.args[0])
    if m is None:
        return None, "its input is a cat of pieces of several tensors"
    P, sd, perm, chunk_nodes = m
    t = _matmul_terms(P, group_name)
    if not t.terms:
        return None, t.why
    Pt = val(P)
    if t.bias is not None and sd == Pt.dim() - 1:
        return None, "addmm with the bias's dim scattered"
    inner = set(t.nodes) | set(chunk_nodes) | {rs}
    for n in [P, *t.nodes]:
        if any(u not in inner for u in n.users):
            return None, f"the matmul's result ({n.name}) has other users"
    operands = [x for A, B in t.terms for x in ((A[0] if isinstance(A, tuple) else A), B)]
    if any(wait in ancestors(x) or x is wait for x in operands):
        return None, "its result feeds the matmul"
    if t.scaled is not None:
        sa, sb, _ = t.scaled
        if val(sa) is None or val(sb) is None:
            return None, "no tensor metadata on a scale"
    else:
        dtypes = {val(x).dtype for x in operands if val(x) is not None}
        if len(dtypes) != 1:
            return None, f"the matmuls' operands have dtypes {sorted(map(str, dtypes))}"
    return MatmulScatter(rs, wait, P, sd, perm, chunk_nodes, t, reduce_op, group_name), ""
