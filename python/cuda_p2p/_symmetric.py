"""Symmetric tensors: ``cuda_p2p.empty`` and ``use_symmetric_memory`` (docs/collectives.md,
"Zero-copy symmetric tensors").

A group's symmetric heap is a region per rank that every peer maps (host shared memory). A tensor
allocated in it lives at the same offset on every rank when the ranks allocate in the same order,
and the workspace collectives read such inputs straight from their owners' heaps instead of
staging them (counters ``all_gather.zero_copy``, ``reduce_scatter.zero_copy``,
``all_reduce.zero_copy``). The heap exists for CPU tensors only; CUDA raises NotImplementedError.
"""

from __future__ import annotations

import contextlib
import numbers

import torch
from torch.overrides import TorchFunctionMode

from ._backend import get_cuda_p2p_backend

__all__ = ["empty", "use_symmetric_memory", "is_symmetric"]


def _sizes(size) -> list[int]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(
                f"cuda_p2p.empty: expected sizes as integers (empty(2, 3) or empty((2, 3))), "
                f"got {size!r}"
            )
        if s < 0:
            raise ValueError(f"cuda_p2p.empty: expected sizes >= 0, got {tuple(size)}")
        out.append(int(s))
    return out


def _backend_for(group, what: str):
    backend = get_cuda_p2p_backend(group)
    if not backend.is_p2p_available():
        raise RuntimeError(
            f"cuda_p2p.{what}: expected a group with an available P2P workspace, but it is "
            f"unavailable: {backend.p2p_unavailable_reason()}"
        )
    return backend


def _check_device(device, what: str) -> None:
    if device is None:
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        raise NotImplementedError(
            f"cuda_p2p.{what}: symmetric CUDA tensors are not implemented (the heap exists on "
            "the host only; docs/collectives.md, 'Zero-copy symmetric tensors')"
        )
    if dev.type != "cpu":
        raise ValueError(f"cuda_p2p.{what}: expected device 'cpu' (or None), got {device!r}")


def empty(*size, dtype=None, device=None, group=None) -> torch.Tensor:
    """A tensor of ``size`` in ``group``'s symmetric heap (default group when None).

    Collective: every rank of the group calls it, in the same order relative to the group's other
    ``empty`` calls and collectives; the first call creates the heap. The memory is uninitialised
    (like ``torch.empty``) and returns to the heap when the tensor's storage dies.
    """
    sizes = _sizes(size)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"cuda_p2p.empty: expected a torch.dtype, got {dtype!r}")
    _check_device(device, "empty")
    backend = _backend_for(group, "empty")
    return backend.symmetric_empty(sizes, dtype)


def is_symmetric(tensor: torch.Tensor, group=None) -> bool:
    """Whether ``tensor``'s data lies in ``group``'s symmetric heap on this rank."""
    return get_cuda_p2p_backend(group).symmetric_offset(tensor) >= 0


# Factory functions redirected by use_symmetric_memory: name -> how to fill the new tensor.
_FACTORIES = {
    torch.empty: None,
    torch.zeros: 0,
    torch.ones: 1,
    torch.full: "fill_value",
}
_LIKE = {
    torch.empty_like: None,
    torch.zeros_like: 0,
    torch.ones_like: 1,
    torch.full_like: "fill_value",
}
# Arguments that keep a call on torch's own allocator.
_PASS_KWARGS = ("out", "names", "pin_memory", "generator")


class _SymmetricMode(TorchFunctionMode):
    def __init__(self, group):
        super().__init__()
        self.group = group
        self.redirected = 0

    def _fits(self, kwargs, like=None) -> bool:
        if any(kwargs.get(k) is not None and kwargs.get(k) is not False for k in _PASS_KWARGS):
            return False
        if kwargs.get("layout") not in (None, torch.strided):
            return False
        device = kwargs.get("device")
        if device is None:
            device = like.device if like is not None else torch.get_default_device()
        if torch.device(device).type != "cpu":
            return False
        fmt = kwargs.get("memory_format")
        if like is not None:
            if like.layout != torch.strided:
                return False
            # preserve_format of a non-contiguous input keeps its strides: not ours to redo.
            if fmt in (None, torch.preserve_format) and not like.is_contiguous():
                return False
            return fmt in (None, torch.preserve_format, torch.contiguous_format)
        return fmt in (None, torch.contiguous_format)

    def _make(self, sizes, dtype, fill, kwargs):
        t = empty(*sizes, dtype=dtype, group=self.group)
        if fill is not None:
            t.fill_(fill)
        if kwargs.get("requires_grad"):
            t.requires_grad_(True)
        self.redirected += 1
        return t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and self._fits(kwargs):
            fill = _FACTORIES[func]
            rest = list(args)
            if fill == "fill_value":
                fill = kwargs.pop("fill_value", None)
                if fill is None:
                    fill = rest.pop()
                sizes = rest[0] if len(rest) == 1 else rest
                # torch's own inference (bool, int64, the default float or complex dtype).
                dtype = kwargs.get("dtype") or torch.full((), fill).dtype
            else:
                sizes = rest
                dtype = kwargs.get("dtype") or torch.get_default_dtype()
            if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
                sizes = tuple(sizes[0])
            try:
                sizes = _sizes(tuple(sizes))
            except (TypeError, ValueError):
                return func(*args, **kwargs)
            return self._make(sizes, dtype, fill, kwargs)
        if func in _LIKE and args and isinstance(args[0], torch.Tensor):
            like = args[0]
            if self._fits(kwargs, like):
                fill = _LIKE[func]
                if fill == "fill_value":
                    fill = kwargs.get("fill_value", args[1] if len(args) > 1 else None)
                dtype = kwargs.get("dtype") or like.dtype
                return self._make(list(like.shape), dtype, fill, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def use_symmetric_memory(group=None):
    """Inside the block, CPU tensors made by ``torch.empty``, ``zeros``, ``ones``, ``full`` and
    their ``*_like`` forms are allocated in ``group``'s symmetric heap (default group when None).

    Collective: entering creates the heap if needed, and allocations inside are symmetric only
    when every rank makes the same ones in the same order. Not covered (they stay on torch's
    allocator): the outputs of other operations (``a @ b``, ``x + 1``, ``torch.randn``,
    ``torch.arange``, ...), calls with ``out=``, ``pin_memory=True`` or another layout, and
    ``*_like`` of non-contiguous tensors with ``preserve_format``. A group whose workspace is on
    CUDA raises NotImplementedError.
    """
    backend = _backend_for(group, "use_symmetric_memory")
    backend.ensure_symmetric_heap()  # collective, so that no allocation inside has to be
    mode = _SymmetricMode(group)
    with mode:
        yield mode
