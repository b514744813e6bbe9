"""Rewriting a post-grad FX graph: what match.py found becomes torch.ops.cuda_p2p fused ops.

``rewrite(graph)`` is the whole pass on one graph: PyTorch's symm_mem fused nodes on cuda_p2p
groups become ours, then each all-gather and each reduce-scatter is matched (match.py) and, when
it matched, replaced; it returns the ``GraphReport`` of what was fused and what was left, which
the ``cuda_p2p.async_tp`` logger says too (INFO: each rewrite; DEBUG: each miss).
"""

from __future__ import annotations

import operator

import torch

from .match import (
    FP8,
    GatherMatmuls,
    MatmulScatter,
    ancestors,
    arg,
    aten,
    c10d,
    group_size,
    is_cuda_p2p_group_name,
    match_gather,
    match_gather_matmuls,
    match_matmul_scatter,
    val,
)
from .report import ALL_GATHER, REDUCE_SCATTER, Fused, GraphReport, Left, log

# ---- graph surgery ---------------------------------------------------------------------------


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
        needed |= ancestors(n)
    for n in sorted(needed, key=order.__getitem__):
        if order[n] > order[anchor] and n.op != "placeholder":
            anchor.prepend(n)


# ---- all-gather -> matmul --------------------------------------------------------------------


def _fuse_gather_matmuls(m: GatherMatmuls) -> str:
    """Replaces the gather and its matmuls with one fused op; returns how, for the report."""
    if m.scale is not None:
        return _fuse_gather_scaled_matmuls(m)
    g, consumers = m.gather, m.consumers
    graph = g.ag.graph
    with graph.inserting_before(g.ag):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_all_gather_matmul.default,
            args=(g.shard, [c.B for c in consumers], g.gather_dim, g.group_name),
            kwargs={"return_A": False},
        )
    _raise_before(fused, [c.B for c in consumers])
    others = _replace_gather_consumers(graph, fused, m)
    return (f"gather_dim={g.gather_dim}, {len(consumers)} matmul(s)"
            + (", return_A (the gathered tensor has other users)" if others else ""))


def _fuse_gather_scaled_matmuls(m: GatherMatmuls) -> str:
    """NOTE [Scaled matmuls in the pipelines]: the fp8 form, one A scale for every consumer."""
    g, consumers, scale = m.gather, m.consumers, m.scale
    graph = g.ag.graph
    with graph.inserting_before(g.ag):
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_all_gather_scaled_matmul.default,
            args=(g.shard, [c.B for c in consumers], scale.A_scale,
                  [c.scaled[1] for c in consumers], g.gather_dim, g.group_name),
            kwargs={"out_dtypes": [c.scaled[2] for c in consumers], "return_A": False},
        )
    _raise_before(fused, [scale.A_scale, *[x for c in consumers for x in (c.B, c.scaled[1])]])
    others = _replace_gather_consumers(graph, fused, m)
    mode = "tensorwise" if scale.tensorwise else "rowwise, the scales gathered with A"
    return (f"fp8 fused_all_gather_scaled_matmul, {mode}, gather_dim={g.gather_dim}, "
            f"{len(consumers)} _scaled_mm(s)"
            + (", return_A (the gathered tensor has other users)" if others else ""))


def _replace_gather_consumers(graph, fused, m: GatherMatmuls) -> bool:
    """Rewires every consumer to the fused op's outputs, and every other reader of the gathered
    tensor to its returned A; erases the gather (and a rowwise scale's). Returns whether A is
    returned."""
    g = m.gather
    res = g.res
    with graph.inserting_after(fused):
        outs = graph.call_function(operator.getitem, (fused, 1))
    last = outs
    for i, c in enumerate(m.consumers):
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
                                               (out, list(val(old_mm).shape)))
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
    _erase_dead(graph, [*g.nodes, *(m.scale.nodes if m.scale is not None else ())])
    if g.ag in graph.nodes:  # cannot happen: every user of res now reads A
        raise AssertionError("cuda_p2p async-TP: the fused all-gather left the original behind")
    return others


# ---- matmul -> reduce-scatter ----------------------------------------------------------------


def _replace_scatter(m: MatmulScatter, out: torch.fx.Node) -> None:
    """``out`` replaces the reduce-scatter's result; the collective and the matmuls leave."""
    m.wait.replace_all_uses_with(out)
    for u in list(m.rs.users):
        if u.op == "output":
            u.replace_input_with(m.rs, out)
    _erase_dead(m.rs.graph, [m.wait, m.rs, *m.chunk_nodes, *m.terms.nodes])


def _fuse_matmul_scatter(m: MatmulScatter) -> str:
    """Replaces the matmuls and the reduce-scatter with one fused op; returns how."""
    if m.terms.scaled is not None:
        return _fuse_scaled_matmul_scatter(m)
    graph = m.rs.graph
    t, reduce_op, group_name = m.terms, m.reduce_op, m.group_name
    with graph.inserting_before(m.wait):
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
            args=(A, B, reduce_op, m.scatter_dim, group_name),
        )
        out = fused
        if t.bias is not None:
            if reduce_op == "avg":
                out = graph.call_function(aten.div.Tensor, (t.bias, group_size(group_name)))
                out = graph.call_function(aten.add.Tensor, (fused, out))
            else:
                out = graph.call_function(aten.add.Tensor, (fused, t.bias))
        if m.perm is not None:
            out = graph.call_function(aten.permute.default, (out, m.perm))
    _replace_scatter(m, out)
    return (f"{reduce_op}, scatter_dim={m.scatter_dim}, {len(t.terms)} matmul(s)"
            + (", + bias" if t.bias is not None else "")
            + (f", permuted {m.perm}" if m.perm is not None else ""))


def _fuse_scaled_matmul_scatter(m: MatmulScatter) -> str:
    """NOTE [Scaled matmuls in the pipelines]: P = _scaled_mm(A, B, scale_a, scale_b) (through
    the views of a linear layer's N-D form) reduce-scattered: one
    fused_scaled_matmul_reduce_scatter, a rowwise scale viewed with A's leading dims."""
    graph = m.rs.graph
    (A, B), = m.terms.terms
    sa, sb, out_dtype = m.terms.scaled
    sa_t, Pt = val(sa), val(m.P)
    with graph.inserting_before(m.wait):
        if isinstance(A, tuple):
            A = graph.call_function(aten.reshape.default, (A[0], A[1]))
        A_scale = sa
        if sa_t.numel() != 1 and Pt.dim() != 2:
            A_scale = graph.call_function(aten.reshape.default, (sa, [*Pt.shape[:-1], 1]))
        fused = graph.call_function(
            torch.ops.cuda_p2p.fused_scaled_matmul_reduce_scatter.default,
            args=(A, B, A_scale, sb, m.reduce_op, m.scatter_dim, m.group_name),
            kwargs={"out_dtype": out_dtype},
        )
        out = fused
        if m.perm is not None:
            out = graph.call_function(aten.permute.default, (out, m.perm))
    _replace_scatter(m, out)
    mode = "tensorwise" if sa_t.numel() == 1 else "rowwise"
    return (f"fp8 fused_scaled_matmul_reduce_scatter, {mode}, {m.reduce_op}, "
            f"scatter_dim={m.scatter_dim}"
            + (f", permuted {m.perm}" if m.perm is not None else ""))


# ---- PyTorch's symm_mem ops -> ours ----------------------------------------------------------


def _symm_mem_targets():
    """PyTorch's symm_mem fused ops -> (ours, the position of their group_name argument)."""
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


# ---- the pass on one graph -------------------------------------------------------------------


def _record_left(report: GraphReport, kind: str, node: torch.fx.Node, why: str) -> None:
    report.left.append(Left(kind, node.name, why))
    log.debug("cuda_p2p async-TP: left %s %s: %s", kind, node.name, why)


def _record_fused(report: GraphReport, kind: str, node: torch.fx.Node, how: str) -> None:
    report.fused.append(Fused(kind, node.name, how))
    log.info("cuda_p2p async-TP: fused %s %s (%s, group %s)",
             "all-gather" if kind == ALL_GATHER else "matmul with reduce-scatter", node.name,
             how, arg(node, 2 if kind == ALL_GATHER else 3, "group_name"))


def _is_fp8_gather(node: torch.fx.Node) -> bool:
    t = val(node.args[0])
    return t is not None and t.dtype in FP8


def rewrite(graph: torch.fx.Graph, *, all_gather_matmul: bool = True,
            matmul_reduce_scatter: bool = True) -> GraphReport:
    """Rewrites ``graph`` in place; returns what was fused and what was left, and why."""
    report = GraphReport()
    symm = _symm_mem_targets()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in symm:
            ours, gi = symm[node.target]
            if is_cuda_p2p_group_name(arg(node, gi, "group_name")):
                node.target = ours
                report.symm_mem += 1
                log.info("cuda_p2p async-TP: %s -> %s", node.name, ours)
    # fp8 gathers first: one may take the gather of its rowwise scales with it, which must not be
    # reported as a gather left unfused.
    gathers = [n for n in graph.nodes if n.target is c10d().all_gather_into_tensor.default]
    gathers.sort(key=lambda n: not _is_fp8_gather(n))
    for node in gathers:
        if node not in graph.nodes:
            continue
        if not is_cuda_p2p_group_name(arg(node, 2, "group_name")):
            _record_left(report, ALL_GATHER, node, "not on a cuda_p2p group")
            continue
        if not all_gather_matmul:
            _record_left(report, ALL_GATHER, node, "all_gather_matmul=False")
            continue
        g, why = match_gather(node)
        m, why = match_gather_matmuls(g) if g is not None else (None, why)
        if m is None:
            _record_left(report, ALL_GATHER, node, why)
        else:
            _record_fused(report, ALL_GATHER, node, _fuse_gather_matmuls(m))
    for node in list(graph.nodes):
        if node.target is not c10d().reduce_scatter_tensor.default or node not in graph.nodes:
            continue
        if not is_cuda_p2p_group_name(arg(node, 3, "group_name")):
            _record_left(report, REDUCE_SCATTER, node, "not on a cuda_p2p group")
        elif not matmul_reduce_scatter:
            _record_left(report, REDUCE_SCATTER, node, "matmul_reduce_scatter=False")
        else:
            m, why = match_matmul_scatter(node)
            if m is None:
                _record_left(report, REDUCE_SCATTER, node, why)
            else:
                _record_fused(report, REDUCE_SCATTER, node, _fuse_matmul_scatter(m))
    graph.lint()
    return report

