"""Registration of the ``cuda_p2p`` backend and the down-casting helpers."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import warnings

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from ._C import ProcessGroupCudaP2P, _debug_line, _set_default_group_name

BACKEND_NAME = "cuda_p2p"
_DEVICES = ["cpu", "cuda"]


# NOTE [One Gloo device per process]
# Every group wraps a ProcessGroupGloo (CPU tensors the workspace does not take), and torch gives
# each its own transport device: a listening socket and an event-loop thread that wakes every
# 10 ms whether the group is used or not (gloo's tcp::Loop), ~1 ms of CPU a second each; a process
# with tens of groups (subgroups, shrunk children, a hierarchy's parts) spent a visible share of a
# core on them. So the Gloo groups this package makes share one device per process, made as
# torch makes its default one; each keeps its own context, pairs, timeout, worker threads and
# failures (one's abort or shutdown leaves the others working). The device is transport, not group
# state. Where GLOO_SOCKET_IFNAME names interfaces, torch's own choice stands (a device per group);
# a forked child makes its own device.
_gloo_device_lock = threading.Lock()
_gloo_device: tuple = (None, None)  # (the pid that made it, the device)


def _gloo_group(store, rank: int, size: int, timeout):
    """A ProcessGroupGloo on the process's shared device (NOTE [One Gloo device per process])."""
    global _gloo_device
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    with _gloo_device_lock:
        if _gloo_device[0] != os.getpid():
            _gloo_device = (os.getpid(), dist.ProcessGroupGloo.create_default_device())
        device = _gloo_device[1]
    o = dist.ProcessGroupGloo._Options()
    o._timeout = timeout
    o._devices = [device]
    o._threads = 2  # torch's default: two per device
    return dist.ProcessGroupGloo(store, rank, size, o)


def _create_backend(opts, pg_options) -> ProcessGroupCudaP2P:
    """Creator called by torch.distributed (extended API) for every group using cuda_p2p."""
    if pg_options is not None and not isinstance(pg_options, ProcessGroupCudaP2P.Options):
        raise TypeError(
            "cuda_p2p: pg_options must be a cuda_p2p.ProcessGroupCudaP2P.Options, "
            f"got {type(pg_options).__name__}"
        )
    # A copy: the same Options object may be passed to several new_group calls, and each group's
    # backend.options must keep its own group name, ranks and timeout.
    options = _copy_options(pg_options)
    _check_nccl_options(options.nccl_options)
    options._timeout = opts.timeout
    options.group_name = str(opts.group_id)
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    # torch passes [] for the default group, meaning "every rank": spell it out for readers of
    # backend.options (the NCCL options below keep torch's convention).
    options.global_ranks_in_group = list(opts.global_ranks_in_group) or list(range(size))
    # What the options alone make the constructor refuse, refused before any rendezvous: a rank
    # that raised inside one (after its Gloo group connected) would leave a peer still connecting
    # with Gloo's "connection closed by peer" instead of the error, or waiting for it.
    wraps_cuda = torch.cuda.is_available() and dist.is_nccl_available()
    ProcessGroupCudaP2P._check_options(options, size, wraps_cuda)
    _claim_rank_slot(store, rank, str(opts.group_id))
    _wait_for_ranks(store, rank, size, str(opts.group_id), opts.timeout)
    # Each wrapped backend rendezvous under its own prefix of the group's store.
    gloo = _gloo_group(PrefixStore("gloo/", store), rank, size, opts.timeout)
    nccl = None
    if wraps_cuda:
        nccl_options = options.nccl_options
        if nccl_options is None:
            nccl_options = dist.ProcessGroupNCCL.Options()
        nccl_options._timeout = opts.timeout
        nccl_options.global_ranks_in_group = list(opts.global_ranks_in_group)
        nccl_options.group_name = str(opts.group_id)
        nccl = dist.ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, nccl_options)
    backend = ProcessGroupCudaP2P(store, rank, size, options, gloo, nccl,
                                  bound_device=_bound_cuda_index(opts))
    if nccl is not None:
        backend._set_cuda_backend_factory(_fresh_nccl_factory(options.nccl_options,
                                                              str(opts.group_id)))
    if not backend.is_p2p_available():
        _attach_hierarchy(backend, store, rank, size, options, opts)
    elif size > 1 and backend.symmetric_device().type == "cuda":
        props = torch.cuda.get_device_properties(backend.symmetric_device().index)
        _check_one_gpu(store, rank, size, str(getattr(props, "uuid", "unknown")),
                       torch.cuda.device_count())
    if backend._debug():  # CUDA_P2P_DEBUG=INFO (NOTE [Debug lines] in backend/config.cpp)
        from ._diagnose import group_line

        _debug_line(group_line(backend))
    if not dist.is_initialized():
        # torch is creating its default group: the dispatcher ops' group_name "" names it
        # (NOTE [The default group's name] in backend/dispatcher_group.cpp).
        _set_default_group_name(str(opts.group_id))
    return backend


def _fresh_nccl_factory(template, group_name: str):
    """What a shrink calls for its child's CUDA backend when the wrapped NCCL never ran anything
    (NOTE [Shrinking a CUDA backend never used] in backend/child_groups.cpp): a new, lazily
    initialized ProcessGroupNCCL over the survivors, with the parent's NCCL options."""

    def make(store, rank, size, timeout, global_ranks):
        o = dist.ProcessGroupNCCL.Options()
        if template is not None:
            o.is_high_priority_stream = template.is_high_priority_stream
        o._timeout = timeout
        o.global_ranks_in_group = list(global_ranks)
        o.group_name = f"{group_name}/shrunk"
        return dist.ProcessGroupNCCL(store, rank, size, o)

    return make


def _bound_cuda_index(opts) -> int | None:
    """The index of the GPU bound by init_process_group(device_id=...), or None.

    torch sets ``pg.bound_device_id`` on the group before it calls the backend's creator, and
    passes the default group's to every new_group; ``opts.process_group`` is that group (a field
    of _DistributedBackendOptions since torch 2.6). Older releases: the default group's, if any.
    NOTE [The workspace's GPU] in backend/config.cpp.
    """
    pg = getattr(opts, "process_group", None)
    device = getattr(pg, "bound_device_id", None) if pg is not None else None
    if device is None and dist.is_initialized():
        device = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None)
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda" or device.index is None:
        return None
    return device.index


# Store keys of the GPU check below, under the group's store.
_GPU_KEY = "cuda_p2p/gpu_uuid/"


def _check_one_gpu(store, rank: int, size: int, uuid: str, visible_gpus: int) -> None:
    """Warns (group rank 0) when every rank's CUDA workspace is on one GPU while the host has a
    GPU per rank: init_process_group without device_id, before torch.cuda.set_device, and no
    LOCAL_RANK (NOTE [The workspace's GPU]). Collective: every rank of a CUDA workspace calls it
    (the workspace is up on all of them or on none, and on one device kind)."""
    store.set(f"{_GPU_KEY}{rank}", uuid)
    uuids = [store.get(f"{_GPU_KEY}{r}").decode(errors="replace") for r in range(size)]
    message = _one_gpu_warning(uuids, visible_gpus)
    if message and rank == 0:
        # Once per process and setting (the warnings registry): every group would say the same.
        warnings.warn(message, stacklevel=4)


def _one_gpu_warning(uuids: list[str], visible_gpus: int) -> str | None:
    """The warning for a group whose ranks (all on one host: their workspace is up) report
    these GPU UUIDs, on a host where a rank sees ``visible_gpus`` GPUs; None when there is
    nothing to say. The store is not trusted: a malformed record is an error naming its rank."""
    for r, u in enumerate(uuids):
        if not u or len(u) > 128 or not u.isprintable():
            raise RuntimeError(
                f"cuda_p2p: malformed GPU record of rank {r} in the store: {u[:200]!r}")
    if len(uuids) < 2 or len(set(uuids)) != 1 or uuids[0] == "unknown":
        return None
    if visible_gpus < len(uuids):  # sharing a GPU is all this host allows (and tests do it)
        return None
    return (
        f"cuda_p2p: all {len(uuids)} ranks of a group put their CUDA workspace on one GPU "
        f"({uuids[0]}) while each sees {visible_gpus} GPUs: they share that GPU's memory and "
        "compute, and NCCL refuses two ranks on one GPU. Call torch.cuda.set_device(local_rank) "
        "before init_process_group, pass init_process_group(device_id=torch.device('cuda', "
        "local_rank)), or launch with torchrun (LOCAL_RANK)."
    )


def _attach_hierarchy(backend, store, rank: int, size: int, options, opts) -> None:
    """On a group whose ranks span hosts, creates what its hierarchical collectives run on.

    backend/hierarchical.hpp: a cuda_p2p backend over this host's ranks (its own workspace) and a
    Gloo backend over the ranks with this rank's local index on every host. Sub-groups need every
    member to take part, so they are created here, where all ranks construct the group together,
    each under its own prefix of the group's store (nothing process-wide: two such groups live
    side by side). A group whose workspace is up is on one host and skips all this.
    """
    host = ProcessGroupCudaP2P._hierarchy_host(options, size)
    # Every rank publishes its host, or that it runs flat: one rank with the knob off (or the
    # workspace off) makes every rank run flat, since the sub-groups need all of them.
    mine = "flat" if host is None else "host:" + host
    prefix = "cuda_p2p/hierarchy/"
    store.set(f"{prefix}host/{rank}", mine)
    records = [store.get(f"{prefix}host/{r}").decode(errors="replace") for r in range(size)]
    for r, rec in enumerate(records):  # the store is not trusted: check what it holds
        if not rec.startswith(("flat", "host:")) or len(rec) > 4096:
            raise RuntimeError(
                f"cuda_p2p: malformed host record of rank {r} in the store: {rec[:200]!r}")
    if any(rec == "flat" for rec in records):
        return
    labels: dict[str, int] = {}
    host_of = [labels.setdefault(rec, len(labels)) for rec in records]
    if len(labels) < 2:
        return  # one host, whose workspace could not be set up: the wrapped backend it is
    hosts = [[r for r in range(size) if host_of[r] == h] for h in range(len(labels))]
    me = host_of[rank]
    local = hosts[me].index(rank)
    global_ranks = list(opts.global_ranks_in_group) or list(range(size))
    timeout = opts.timeout

    # This host's ranks: a cuda_p2p backend with its own workspace and Gloo.
    intra_store = PrefixStore(f"{prefix}intra/{me}/", store)
    intra_size = len(hosts[me])
    intra_options = _copy_options(options)
    intra_options._timeout = timeout
    intra_options.group_name = f"{opts.group_id}/host{me}"
    # The hierarchical collectives are for CPU tensors, and this group wraps no CUDA backend: its
    # workspace is on the host whatever the group's own workspace_device says.
    intra_options.workspace_device = "cpu"
    intra_options.global_ranks_in_group = [global_ranks[r] for r in hosts[me]]
    intra_gloo = _gloo_group(PrefixStore("gloo/", intra_store), local, intra_size, timeout)
    intra = ProcessGroupCudaP2P(intra_store, local, intra_size, intra_options, intra_gloo, None)
    # The ranks of this local index on every host (a local index every host has).
    inter = None
    if local < min(len(h) for h in hosts):
        inter = _gloo_group(PrefixStore(f"{prefix}inter/{local}/", store), me, len(hosts),
                            timeout)
    backend._set_hierarchy(host_of, intra, inter)


def _claim_rank_slot(store, rank: int, group: str) -> None:
    """Claims this rank's slot in the group's store before anything else is written there.

    NOTE [One job per store] (p2p_workspace/symmetric_workspace.cpp): a second job started on a
    running job's init_method port reaches that job's store; the first process to claim a slot
    holds it, a later one fails here, before its wrapped backends write into the store.
    """
    me = f"pid {os.getpid()} on {socket.gethostname()} token "
    value = me + secrets.token_hex(16)
    key = f"cuda_p2p/owner/{rank}"
    got = store.compare_set(key, "", value).decode(errors="replace")
    if got != value and got.startswith(me):
        # This very process held the slot: it re-creates a group it destroyed, on the same store
        # (init_process_group after destroy_process_group under torchrun's agent store).
        store.set(key, value)
        got = value
    if got != value:
        holder = got.split(" token ")[0][:200]
        raise RuntimeError(
            f"cuda_p2p: another job already uses this store: rank {rank}'s slot of group {group} "
            f"is held by another process ({holder}), so this process (pid {os.getpid()}) is not "
            "joining it; was a second job started with the same init_method / MASTER_PORT?"
        )


def _wait_for_ranks(store, rank: int, size: int, group: str, timeout) -> None:
    """Waits until every rank has claimed its slot; a rank that never does is named."""
    keys = [f"cuda_p2p/owner/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout)
    except Exception:  # the store says "timeout" in several ways (RuntimeError, DistStoreError)
        missing = [r for r in range(size) if not store.check([keys[r]])]
        if not missing:
            raise
        raise RuntimeError(
            f"cuda_p2p: rendezvous of group {group} timed out after "
            f"{timeout.total_seconds():.0f} s on rank {rank}: rank"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never arrived"
        ) from None


# Set per group by _create_backend, never copied from the user's Options.
_PER_GROUP_FIELDS = frozenset({"backend", "_timeout", "group_name", "global_ranks_in_group"})


def _copy_options(src) -> ProcessGroupCudaP2P.Options:
    """A new Options with every user-settable field of ``src`` (None: the defaults)."""
    dst = ProcessGroupCudaP2P.Options()
    if src is None:
        return dst
    cls = type(src)
    for name in dir(cls):
        if name.startswith("_") or name in _PER_GROUP_FIELDS:
            continue
        attr = getattr(cls, name, None)
        if isinstance(attr, property) and attr.fset is not None:
            setattr(dst, name, getattr(src, name))
    return dst


def _check_nccl_options(nccl_options) -> None:
    # Checked whether or not CUDA is available now, so that a wrong type fails on every machine,
    # not only on the GPU ones. (The Options setter accepts any c10d Backend Options.)
    if nccl_options is None or not dist.is_nccl_available():
        return
    if not isinstance(nccl_options, dist.ProcessGroupNCCL.Options):
        raise TypeError(
            "cuda_p2p: Options.nccl_options must be a ProcessGroupNCCL.Options or None, "
            f"got {type(nccl_options).__name__}"
        )


def _register() -> None:
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=_DEVICES
    )


def _resolve(group) -> dist.ProcessGroup:
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "cuda_p2p: no default process group; call "
                "torch.distributed.init_process_group(backend='cuda_p2p') first"
            )
        group = dist.distributed_c10d._get_default_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            "cuda_p2p: this rank is not a member of the group (new_group returned "
            "GroupMember.NON_GROUP_MEMBER on it), so it has no backend for the group"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            "cuda_p2p: expected a torch.distributed.ProcessGroup or None, got "
            f"{type(group).__name__}"
        )
    return group


def is_cuda_p2p_group(group=None) -> bool:
    """Whether ``group`` (default: the default group) runs on the cuda_p2p backend."""
    group = _resolve(group)
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:
        return False
    return isinstance(backend, ProcessGroupCudaP2P)


def get_cuda_p2p_backend(group=None) -> ProcessGroupCudaP2P:
    """The C++ ``ProcessGroupCudaP2P`` of ``group`` (default: the default group).

    Raises TypeError when the group uses another backend.
    """
    group = _resolve(group)
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError as e:
        raise TypeError(f"cuda_p2p: group has no cuda_p2p backend ({e})") from None
    if not isinstance(backend, ProcessGroupCudaP2P):
        raise TypeError(
            "cuda_p2p: expected a group created with backend='cuda_p2p', "
            f"got one whose backend is {type(backend).__name__} ({group.name()})"
        )
    return backend


def check(group=None) -> None:
    """Raises the failure of ``group`` (default: the default group), if it has failed.

    A failure is this rank's own (an op that timed out or whose ranks disagreed) or a peer's that
    reached this rank (its failure word). On a GPU a peer's failure ends this rank's captured
    kernels quietly instead of trapping (which would lose the CUDA context): a loop that only
    replays CUDA graphs calls nothing else of cuda_p2p's, and calls this to learn of it. Cheap: no
    stream is synchronized, and the group's abort hooks run before the error is raised. Quiet on
    a healthy group and on one this rank aborted or shut down itself.
    """
    get_cuda_p2p_backend(group).check()


_register()
