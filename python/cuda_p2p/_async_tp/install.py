"""Installing the pass into Inductor: the ``CustomGraphPass`` (its uuid for the FX graph cache),
chaining with a user's post-grad pass, and enable / disable / is_enabled / ``async_tp()``.

torch._inductor is imported only when the pass is enabled: importing it costs seconds, and most
users of the backend never compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from typing import Any

import torch

from .fuse import rewrite
from .match import cuda_p2p_group_names
from .report import GraphReport, log

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _source_hash(package_dir: str = _PACKAGE_DIR) -> str:
    """Every source that decides the rewrite: this package's files, and the fused ops' autograd
    formulas (the backward graphs the pass sees)."""
    names = sorted(f for f in os.listdir(package_dir) if f.endswith(".py"))
    paths = [os.path.join(package_dir, f) for f in names]
    paths.append(os.path.join(os.path.dirname(package_dir), "_autograd.py"))
    h = hashlib.sha256()
    for path in paths:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
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
        self.reports: list[GraphReport] = []  # one per graph (async_tp_report())

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1
        report = rewrite(graph, **self.options)
        report.index = len(self.reports)
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
            tuple(cuda_p2p_group_names()),
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
# fails there ("'list' object is not callable"). Where lists are not taken, several passes are
# installed as one chain that calls them in order: a CustomGraphPass whose uuid is its members'
# when every member is one (the FX graph cache keeps working), else a plain callable, for which
# inductor bypasses the cache as it does for the user's callable alone.
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


def _inductor_imported() -> bool:
    """Whether torch._inductor's config is loaded; before it, the pass cannot be installed."""
    return "torch._inductor.config" in sys.modules


def async_tp_report() -> list[GraphReport]:
    """The installed pass's report: one ``GraphReport`` per graph it rewrote since it was
    enabled (every forward and backward graph inductor compiled; none for an FX-cache hit,
    where the cached rewrite is reused). ``str()`` of each says what was fused and why each
    collective that was not was left. Empty when the pass is not enabled."""
    if not _inductor_imported():
        return []
    for p in _current_passes():
        if _is_ours(p):
            return list(p.reports)
    return []


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
    if not _inductor_imported():
        return  # never enabled
    passes = [p for p in _current_passes() if not _is_ours(p)]
    if len(passes) != len(_current_passes()):
        _install(passes)


def is_async_tp_enabled() -> bool:
    if not _inductor_imported():
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
