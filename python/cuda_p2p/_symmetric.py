"""Symmetric tensors: ``cuda_p2p.empty``, ``use_symmetric_memory`` and ``get_mem_pool``
(docs/collectives.md, "Zero-copy symmetric tensors").

A group's symmetric heap is a region per rank that every peer maps, on the group's workspace
device: host shared memory, or a CUDA IPC block on the group's GPU. A tensor allocated in it lives
at the same offset on every rank when the ranks allocate in the same order. The workspace
collectives and ``fused_all_gather_matmul`` read such inputs straight from their owners' heaps
instead of staging them (counters ``all_gather.zero_copy``, ``reduce_scatter.zero_copy``,
``all_reduce.zero_copy``, ...). How the ranks agree on it is ``Options.zero_copy_agreement``: on
the host by default they exchange offsets (any offsets; anything else stages), on CUDA each rank
claims its offsets in the op signature, and ranks whose tensors are not at the same offsets raise
a signature mismatch. The heap and its ``torch.cuda.MemPool`` have run on one GPU (shared by 1-4
ranks); the collectives reading them zero-copy on CUDA have not yet (scripts/gpu_check.sh runs
their tests)."""

from __future__ import annotations

import contextlib
import numbers
import weakref

import torch
from torch.overrides import TorchFunctionMode

from ._backend import _resolve, get_cuda_p2p_backend

__all__ = ["empty", "use_symmetric_memory", "is_symmetric", "get_mem_pool"]


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


def _check_device(backend, device, what: str) -> torch.device:
    """The heap's device, after checking that ``device`` (None: the heap's) names it."""
    expected = backend.symmetric_device()
    if device is None:
        return expected
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"cuda_p2p.{what}: expected device {expected}, got {device!r} ({e})") \
            from None
    given = repr(device)
    if dev.type == "cuda" and dev.index is None and expected.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())  # torch's meaning of "cuda"
        given += f" (the current device, {dev})"
    if dev != expected:
        where = ("the GPU this group was created on" if expected.type == "cuda" else
                 "the host: the group has no CUDA backend")
        raise ValueError(
            f"cuda_p2p.{what}: expected device {expected}, got {given}: this group's "
            f"symmetric heap lives on its workspace's device, {where}"
        )
    return dev


def empty(*size, dtype=None, device=None, group=None) -> torch.Tensor:
    """A tensor of ``size`` in ``group``'s symmetric heap (default group when None).

    ``device`` (None: the heap's) must be the heap's device: ``cpu`` on a group whose workspace is
    on the host, the group's GPU on a group created with CUDA. Collective: every rank of the
    group calls it, in the same order relative to the group's other ``empty`` calls and
    collectives; the first call creates the heap. The memory is uninitialised (like
    ``torch.empty``) and returns to the heap when the tensor's storage dies.
    """
    sizes = _sizes(size)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"cuda_p2p.empty: expected a torch.dtype, got {dtype!r}")
    backend = _backend_for(group, "empty")
    dev = _check_device(backend, device, "empty")
    return backend.symmetric_empty(sizes, dtype, dev)


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


# The MemPool of each CUDA group (get_mem_pool), dropped with the group's ProcessGroup object:
# per-group state kept beside torch's own registry of groups, never shared by two groups.
_pools: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def get_mem_pool(group=None) -> "torch.cuda.MemPool":
    """The ``torch.cuda.MemPool`` over ``group``'s symmetric heap (default group when None).

    Only for a group whose workspace is on a GPU (NotImplementedError otherwise: torch has no
    memory-pool hook for CPU tensors). Collective the first time (creates the heap); then the same
    pool, created on the group's device, for as long as the group lives. Under
    ``torch.cuda.use_mem_pool(pool, device)`` (what ``use_symmetric_memory`` does) the calling
    thread's CUDA allocations on that device are carved from the heap.
    """
    key = _resolve(group)
    pool = _pools.get(key)
    if pool is not None:
        return pool
    backend = _backend_for(key, "get_mem_pool")
    dev = backend.symmetric_device()
    if dev.type != "cuda":
        raise NotImplementedError(
            f"cuda_p2p.get_mem_pool: this group's symmetric heap is on {dev}: torch has no "
            "memory-pool hook for CPU tensors; use cuda_p2p.empty or cuda_p2p.use_symmetric_memory "
            "(docs/collectives.md, 'Zero-copy symmetric tensors')"
        )
    allocator = backend.symmetric_allocator()  # collective the first time: creates the heap
    with torch.cuda.device(dev):  # a MemPool belongs to the device current at its creation
        pool = torch.cuda.MemPool(allocator)
    _pools[key] = pool
    return pool


@contextlib.contextmanager
def use_symmetric_memory(group=None):
    """Inside the block, new tensors are allocated in ``group``'s symmetric heap (default group
    when None). Collective: entering creates the heap if needed, and allocations inside are
    symmetric only when every rank makes the same ones in the same order.

    On a group whose workspace is on a GPU, the block runs under ``torch.cuda.use_mem_pool`` with
    the group's ``get_mem_pool`` for the group's device: every CUDA allocation of this thread on
    that device through torch's caching allocator (factories, the outputs of operations, torch's
    own buffers) is carved from the heap; it yields the pool. A dead tensor's memory stays cached
    in the pool for later allocations in it, not returned to the heap.

    On the host, torch has no allocator hook for CPU tensors: CPU tensors made by ``torch.empty``,
    ``zeros``, ``ones``, ``full`` and their ``*_like`` forms are redirected by a
    ``TorchFunctionMode`` (yielded). Not covered (they stay on torch's allocator): the outputs of
    other operations (``a @ b``, ``x + 1``, ``torch.randn``, ``torch.arange``, ...), calls with
    ``out=``, ``pin_memory=True`` or another layout, and ``*_like`` of non-contiguous tensors with
    ``preserve_format``.
    """
    backend = _backend_for(group, "use_symmetric_memory")
    dev = backend.symmetric_device()
    if dev.type == "cuda":
        pool = get_mem_pool(group)  # collective the first time
        with torch.cuda.use_mem_pool(pool, device=dev):
            yield pool
        return
    backend.ensure_symmetric_heap()  # collective, so that no allocation inside has to be
    mode = _SymmetricMode(group)
    with mode:
        yield mode
