"""A torch.compile pass that turns tensor-parallel communication + matmul into our pipelines.

``enable_async_tp()`` adds a post-grad ``CustomGraphPass`` to
``torch._inductor.config.post_grad_custom_post_pass`` (after any pass already there, which
keeps running); ``disable_async_tp()`` removes it; ``with async_tp():`` does both;
``CUDA_P2P_ASYNC_TP=1`` at import enables it. On groups of the cuda_p2p backend only, it rewrites

* ``wait(all_gather_into_tensor(shard))`` (gather dim 0), or its ``split``/``slice`` +
  ``cat(dim=d)`` form (gather dim d), consumed by one or several ``mm`` / ``addmm`` /
  ``reshape -> mm -> reshape`` with the gathered tensor as the left operand, into one
  ``cuda_p2p.fused_all_gather_matmul`` (``return_A`` only when the gathered tensor has other
  users; an ``addmm``'s bias is added to the fused output);
* ``wait(reduce_scatter_tensor(mm(A, B)))`` (or of ``cat(split(mm, dim=d))`` for scatter dim d,
  or of ``reshape(mm(reshape(A)))``; "sum"/"avg") into ``cuda_p2p.fused_matmul_reduce_scatter``;
  an ``addmm`` whose bias is DTensor's ``bias / group_size`` (a replicated bias made partial)
  becomes the fused op plus ``bias``;
* PyTorch's own ``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` nodes on
  cuda_p2p groups into ours.

Both forward and backward graphs are rewritten (the pass runs on each). The ``cuda_p2p.async_tp``
logger says what was rewritten (INFO) and what was left and why (DEBUG).
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
    c10d = _c10d()
    shard, group_name = ag.args[0], _arg(ag, 2, "group_name")
    waits = [u for u in ag.users if u.target is c10d.wait_tensor.default]
    if len(waits) != 1 or len(ag.users) != 1:
        return None, "the all-gather's result is used other than through one wait_tensor"
    wait = waits[0]
    users = list(wait.users)
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
    """``res @ B`` found among res's users: mm, addmm, or view -> mm -> view."""

    def __init__(self, out, B, bias=None, pre=None, mm=None):
        self.out, self.B, self.bias, self.pre, self.mm = out, B, bias, pre, mm


def _consumers(res: torch.fx.Node) -> list[_Consumer]:
    found = []
    t = _val(res)
    for u in res.users:
        if u.target is aten.mm.default and u.args[0] is res:
            found.append(_Consumer(u, u.args[1], mm=u))
        elif u.target is aten.addmm.default and u.args[1] is res and not u.kwargs:
            bias = u.args[0]
            bt = _val(bias)
            if bt is not None and bt.dim() <= 1:  # a broadcast bias only
                found.append(_Consumer(u, u.args[2], bias=bias, mm=u))
        elif u.target in _VIEWS and t is not None and t.dim() > 2:
            v = _val(u)
            if v is None or v.dim() != 2 or not _same([v.shape[-1]], [t.shape[-1]]):
                continue
            for mm in u.users:
                if mm.target is not aten.mm.default or mm.args[0] is not u:
                    continue
                for post in mm.users:
                    pv, Bv = _val(post), _val(mm.args[1])
                    if post.target in _VIEWS and pv is not None and Bv is not None and _same(
                        list(pv.shape), [*t.shape[:-1], Bv.shape[-1]]
                    ):
                        found.append(_Consumer(post, mm.args[1], pre=u, mm=mm))
                        break
    return found


def _fuse_all_gather(g: _Gather, stats: dict) -> None:
    graph = g.ag.graph
    res = g.res
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
    matched = {c.out if c.pre is None else c.pre for c in consumers}
    others = [u for u in res.users if u not in matched]
    with graph.inserting_before(g.ag):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_all_gather_matmul.default,
            args=(g.shard, [c.B for c in consumers], g.gather_dim, g.group_name),
            kwargs={"return_A": bool(others)},
        )
    _raise_before(fused, [c.B for c in consumers])
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
        c.out.replace_all_uses_with(out)
        if c.pre is not None:
            # The 2-D product may have users of its own (a saved activation).
            if old_mm.users:
                with graph.inserting_after(last):
                    flat = graph.call_function(aten.reshape.default,
                                               (out, list(_val(old_mm).shape)))
                old_mm.replace_all_uses_with(flat)
                last = flat
            graph.erase_node(c.out)
            graph.erase_node(old_mm)
            if not c.pre.users:
                graph.erase_node(c.pre)
        else:
            graph.erase_node(c.out)
    if others:
        with graph.inserting_after(fused):
            A = graph.call_function(operator.getitem, (fused, 0))
        res.replace_all_uses_with(A)
    _erase_dead(graph, g.nodes)
    stats["all_gather_matmul"] += 1
    log.info("cuda_p2p async-TP: fused all-gather (gather_dim=%d, group %s) with %d matmul(s)%s",
             g.gather_dim, g.group_name, len(consumers),
             " (return_A: the gathered tensor has other users)" if others else "")


# ---- matmul -> reduce-scatter ----------------------------------------------------------------


def _match_scatter_input(inp: torch.fx.Node, rs: torch.fx.Node):
    """(tensor, scatter_dim, nodes) for the reduce-scatter's input: the tensor itself (dim 0), or
    the cat of its chunks along dim d (funcol's form for scatter_dim d)."""
    if inp.target is aten.cat.default and _arg(inp, 1, "dim", 0) == 0 and len(inp.users) == 1:
        pieces = list(inp.args[0])
        srcs, dims, nodes = set(), set(), [inp]
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
                return src, d % t.dim(), list(dict.fromkeys(nodes))
        return None
    return inp, 0, []


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
    m = _match_scatter_input(rs.args[0], rs)
    if m is None:
        _left(stats, "reduce-scatter", rs, "its input is a cat of pieces of several tensors")
        return
    prod, sd, chunk_nodes = m
    bias = None
    pre = None
    if prod.target in _VIEWS:
        # view -> mm -> view: the fused op takes the N-D A directly.
        mm = prod.args[0]
        if not isinstance(mm, torch.fx.Node) or mm.target is not aten.mm.default or \
                mm.args[0].target not in _VIEWS:
            _left(stats, "reduce-scatter", rs, "its input is not produced by a matmul")
            return
        pre = mm.args[0]
        A, B = pre.args[0], mm.args[1]
        At, pv = _val(A), _val(prod)
        if At is None or pv is None or not _same(list(pv.shape), [*At.shape[:-1], pv.shape[-1]]) \
                or len(mm.users) != 1:
            _left(stats, "reduce-scatter", rs, "reshape -> mm -> reshape does not keep A's dims")
            return
        mm_nodes = [prod, mm] + ([pre] if len(pre.users) == 1 else [])
    elif prod.target is aten.mm.default:
        A, B = prod.args
        mm_nodes = [prod]
    elif prod.target is aten.addmm.default and not prod.kwargs:
        c, A, B = prod.args
        bias = _dtensor_bias(c, group_name)
        if bias is None:
            _left(stats, "reduce-scatter", rs, "addmm's bias is not bias / group_size (a "
                  "replicated bias made partial); reduce-scattering it needs its own collective")
            return
        if sd == 1:
            _left(stats, "reduce-scatter", rs, "addmm with the bias's dim scattered")
            return
        mm_nodes = [prod]
    else:
        _left(stats, "reduce-scatter", rs, "its input is not produced by mm / addmm / "
              "reshape-mm-reshape")
        return
    allowed = set(chunk_nodes) | {rs}
    if any(u not in allowed for u in prod.users):
        _left(stats, "reduce-scatter", rs, "the matmul's result has other users")
        return
    if wait in _ancestors(A) or wait in _ancestors(B):
        _left(stats, "reduce-scatter", rs, "its result feeds the matmul")
        return
    with graph.inserting_before(wait):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_matmul_reduce_scatter.default,
            args=(A, B, reduce_op, sd, group_name),
        )
        out = fused
        if bias is not None:
            if reduce_op == "avg":
                out = graph.call_function(aten.div.Tensor, (bias, _group_size(group_name)))
                out = graph.call_function(aten.add.Tensor, (fused, out))
            else:
                out = graph.call_function(aten.add.Tensor, (fused, bias))
    wait.replace_all_uses_with(out)
    for u in list(rs.users):
        if u.op == "output":
            u.replace_input_with(rs, out)
    _erase_dead(graph, [wait, rs, *chunk_nodes, *mm_nodes])
    stats["matmul_reduce_scatter"] += 1
    log.info("cuda_p2p async-TP: fused matmul with reduce-scatter (%s, scatter_dim=%d, group %s)%s",
             reduce_op, sd, group_name, " (+ bias)" if bias is not None else "")


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
    log.debug("cuda_p2p async-TP: left %s %s: %s", what, node.name, why)


def rewrite(graph: torch.fx.Graph, *, all_gather_matmul: bool = True,
            matmul_reduce_scatter: bool = True) -> dict:
    """Rewrites ``graph`` in place; returns how many patterns were fused and left."""
    c10d = _c10d()
    stats = {"all_gather_matmul": 0, "matmul_reduce_scatter": 0, "symm_mem": 0, "left": 0}
    symm = _symm_mem_targets()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in symm:
            ours, gi = symm[node.target]
            if _is_cuda_p2p_group_name(_arg(node, gi, "group_name")):
                node.target = ours
                stats["symm_mem"] += 1
                log.info("cuda_p2p async-TP: %s -> %s", node.name, ours)
    if all_gather_matmul:
        for node in list(graph.nodes):
            if node.target is not c10d.all_gather_into_tensor.default or node not in graph.nodes:
                continue
            if not _is_cuda_p2p_group_name(_arg(node, 2, "group_name")):
                _left(stats, "all-gather", node, "not on a cuda_p2p group")
                continue
            g, why = _match_gather(node)
            if g is None:
                _left(stats, "all-gather", node, why)
                continue
            _fuse_all_gather(g, stats)
    if matmul_reduce_scatter:
        for node in list(graph.nodes):
            if node.target is not c10d.reduce_scatter_tensor.default or node not in graph.nodes:
                continue
            if not _is_cuda_p2p_group_name(_arg(node, 3, "group_name")):
                _left(stats, "reduce-scatter", node, "not on a cuda_p2p group")
                continue
            _fuse_reduce_scatter(node, stats)
    graph.lint()
    if any(stats[k] for k in ("all_gather_matmul", "matmul_reduce_scatter", "symm_mem")):
        log.info("cuda_p2p async-TP: %s", stats)
    return stats


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

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1
        rewrite(graph, **self.options)

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
