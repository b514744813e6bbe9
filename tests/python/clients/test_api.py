"""The Python API: down-casting, is_cuda_p2p_group, Options (alone, and as pg_options of
new_group), and the error paths (bad options, send to self, meta tensors)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _harness import PG_TIMEOUT_S, scoped_environ
from cuda_p2p import _C

Options = cuda_p2p.ProcessGroupCudaP2P.Options
MiB = 1 << 20


# ---------------------------------------------------------------------------------------------
# Options, in this (non-distributed) process


def test_options_defaults():
    o = Options()
    assert isinstance(o, torch._C._distributed_c10d.Backend.Options)
    assert o.buffer_size is None
    assert o.nccl_options is None
    assert o.backend == "cuda_p2p"
    assert o.host_streams == "auto"


@pytest.mark.parametrize("value", ["auto", "cooperative", "threads"])
def test_options_host_streams(value):
    o = Options()
    o.host_streams = value
    assert o.host_streams == value


# Every Options string whose values are checked: (name, a good value, a bad one, the allowed ones
# as the error names them).
CHECKED_STRINGS = [
    ("workspace_device", "cpu", "gpu", "one of auto|cpu|cuda"),
    ("host_streams", "threads", "fibers", "one of auto|cooperative|threads"),
    ("all_gather_algo", "ring", "rings", "one of auto|direct|ring"),
    ("reduce_scatter_algo", "direct", "tree", "one of auto|direct|ring"),
    ("all_reduce_algo", "one_shot", "three_shot", "one of auto|one_shot|two_shot"),
    ("all_reduce_rounds", "large", "huge", "one of auto|chunked|large"),
    ("zero_copy_agreement", "off", "headers", "one of auto|exchange|signature|off"),
]


@pytest.mark.parametrize("name,good,bad,allowed", CHECKED_STRINGS)
def test_options_checked_strings(name, good, bad, allowed):
    o = Options()
    assert getattr(o, name) == "auto"
    setattr(o, name, good)
    assert getattr(o, name) == good
    # A bad value is a ValueError naming the option, what it accepts and what it got, and leaves
    # the option as it was.
    expected = re.escape(f"Options.{name} must be {allowed}, got '{bad}'")
    with pytest.raises(ValueError, match=expected):
        setattr(o, name, bad)
    assert getattr(o, name) == good
    with pytest.raises(TypeError):
        setattr(o, name, 3)
    assert getattr(o, name) == good


# Every optional count of Options that may be 0 but not negative, with its largest value: the
# knob table's.
NON_NEGATIVE_COUNTS = {k["option"]: k["max"] for k in _C._config_knobs()
                       if k["option"] and k["kind"] in ("bytes", "int") and k["min"] == 0}
assert len(NON_NEGATIVE_COUNTS) >= 8, NON_NEGATIVE_COUNTS  # chunk_bytes, the thresholds, ...


@pytest.mark.parametrize("name", sorted(NON_NEGATIVE_COUNTS))
def test_options_non_negative_counts(name):
    o = Options()
    top = min(NON_NEGATIVE_COUNTS[name], 1 << 40)
    assert getattr(o, name) is None
    for value in (0, 4096, None, top):
        setattr(o, name, value)
        assert getattr(o, name) == value
    with pytest.raises(ValueError, match=rf"Options\.{name} must be in \[0, [^]]+\], got -5$"):
        setattr(o, name, -5)
    assert getattr(o, name) == top
    if NON_NEGATIVE_COUNTS[name] < 1 << 62:
        with pytest.raises(ValueError, match=rf"Options\.{name} must be in \[0, "):
            setattr(o, name, NON_NEGATIVE_COUNTS[name] + 1)
    with pytest.raises(TypeError):
        setattr(o, name, "4K")
    assert getattr(o, name) == top


def test_options_mailbox_slot_bytes():
    o = Options()
    assert o.mailbox_slot_bytes is None
    for value in (4096, 1 * MiB, None):
        o.mailbox_slot_bytes = value
        assert o.mailbox_slot_bytes == value
    for bad in (0, 100, 4097, -4096):
        with pytest.raises(ValueError, match=re.escape(
                f"Options.mailbox_slot_bytes must be a multiple of 4 KiB in [4 KiB, 256 MiB], "
                f"got {bad}")):
            o.mailbox_slot_bytes = bad
    assert o.mailbox_slot_bytes is None


@pytest.mark.parametrize("value", [1, 4096, 32 * MiB, 1 << 40])
def test_options_buffer_size_roundtrip(value):
    o = Options()
    o.buffer_size = value
    assert o.buffer_size == value
    o.buffer_size = None
    assert o.buffer_size is None


@pytest.mark.parametrize("value", [0, -1, -(1 << 40)])
def test_options_buffer_size_not_positive(value):
    o = Options()
    o.buffer_size = 64
    with pytest.raises(ValueError, match=r"Options\.buffer_size must be in \[1, 64 PiB\], got "
                       + str(value)):
        o.buffer_size = value
    assert o.buffer_size == 64  # unchanged


@pytest.mark.parametrize("value", [1.5, "64", [64]], ids=["float", "str", "list"])
def test_options_buffer_size_wrong_type(value):
    o = Options()
    with pytest.raises(TypeError):
        o.buffer_size = value
    assert o.buffer_size is None


@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch built without NCCL")
def test_options_nccl_options():
    o = Options()
    nccl = dist.ProcessGroupNCCL.Options()
    nccl.is_high_priority_stream = True
    o.nccl_options = nccl
    assert isinstance(o.nccl_options, dist.ProcessGroupNCCL.Options)
    assert o.nccl_options.is_high_priority_stream is True
    o.nccl_options = None
    assert o.nccl_options is None


@pytest.mark.parametrize("value", [3, "nccl", object()], ids=["int", "str", "object"])
def test_options_nccl_options_wrong_type(value):
    o = Options()
    with pytest.raises(TypeError, match="nccl_options must be a ProcessGroupNCCL.Options"):
        o.nccl_options = value
    assert o.nccl_options is None


@pytest.mark.parametrize(
    "make", [lambda: dist.ProcessGroupGloo._Options(), Options], ids=["gloo_options", "own_options"]
)
def test_options_nccl_options_other_backend_options(make):
    o = Options()
    with pytest.raises(TypeError, match="nccl_options must be a ProcessGroupNCCL.Options"):
        o.nccl_options = make()


@pytest.mark.parametrize("value", [True, False, None])
def test_options_cuda_workspace_collectives(value):
    o = Options()
    assert o.cuda_workspace_collectives is None  # default: defer to the environment, else off
    o.cuda_workspace_collectives = value
    assert o.cuda_workspace_collectives is value


def test_options_instances_are_independent():
    a, b = Options(), Options()
    a.buffer_size = 123
    assert b.buffer_size is None


def test_api_before_init_process_group():
    assert not dist.is_initialized()
    for fn in (cuda_p2p.get_cuda_p2p_backend, cuda_p2p.is_cuda_p2p_group):
        with pytest.raises(RuntimeError, match="init_process_group"):
            fn()
    with pytest.raises(TypeError, match="ProcessGroup"):
        cuda_p2p.get_cuda_p2p_backend("not a group")


def test_symmetric_memory_api_surface():
    """The symmetric-memory API (docs/collectives.md, "Zero-copy symmetric tensors"), CUDA parts
    included, exists on every machine; here, before init_process_group, it says what is missing."""
    for name in ("empty", "use_symmetric_memory", "is_symmetric", "get_mem_pool"):
        assert name in cuda_p2p.__all__ and callable(getattr(cuda_p2p, name)), name
    for name in ("symmetric_device", "symmetric_empty", "symmetric_offset", "symmetric_heap_info",
                 "symmetric_allocator", "symmetric_peer_tensor", "ensure_symmetric_heap"):
        assert callable(getattr(cuda_p2p.ProcessGroupCudaP2P, name, None)), name
    for fn in (cuda_p2p.get_mem_pool, lambda: cuda_p2p.empty(3, device="cuda"),
               lambda: cuda_p2p.use_symmetric_memory().__enter__()):
        with pytest.raises(RuntimeError, match="init_process_group"):
            fn()
    if torch.version.cuda is not None:  # what symmetric_allocator() returns, registered by torch
        assert isinstance(torch._C._cuda_CUDAAllocator, type)


def test_backend_is_registered():
    assert "cuda_p2p" in dist.Backend.backend_list
    assert dist.Backend("cuda_p2p") == "cuda_p2p"
    assert cuda_p2p.BACKEND_NAME == "cuda_p2p"


# ---------------------------------------------------------------------------------------------
# down-casting, on the ranks


def _expect(cond, what):
    if not cond:
        raise AssertionError(what)


def downcast(ctx):
    W, rank = ctx.world_size, ctx.rank
    world = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend()
    _expect(isinstance(b, cuda_p2p.ProcessGroupCudaP2P), f"got {type(b)}")
    _expect(isinstance(b, torch._C._distributed_c10d.Backend), "not a c10d Backend")
    _expect(cuda_p2p.get_cuda_p2p_backend(world) is b, "explicit WORLD gives another object")
    _expect(world._get_backend(torch.device("cpu")) is b, "_get_backend(cpu) is another object")
    _expect(world._get_backend(torch.device("cuda")) is b, "_get_backend(cuda) is another object")
    _expect(cuda_p2p.is_cuda_p2p_group() is True, "is_cuda_p2p_group() is not True")
    _expect(cuda_p2p.is_cuda_p2p_group(world) is True, "is_cuda_p2p_group(WORLD) is not True")
    _expect(cuda_p2p.is_cuda_p2p_group(ctx.gloo) is False, "gloo group reported as cuda_p2p")
    try:
        cuda_p2p.get_cuda_p2p_backend(ctx.gloo)
    except TypeError as e:
        _expect("cuda_p2p" in str(e) and "ProcessGroupGloo" in str(e), f"unclear message: {e}")
    else:
        raise AssertionError("get_cuda_p2p_backend(gloo group) did not raise TypeError")
    _expect(dist.get_backend() == "cuda_p2p", f"dist.get_backend() = {dist.get_backend()}")
    _expect((b.rank(), b.size(), b.name()) == (rank, W, "cuda_p2p"),
            f"{b.rank(), b.size(), b.name()}")
    gloo = b.wrapped_backend("cpu")
    _expect(isinstance(gloo, dist.ProcessGroupGloo), f"wrapped cpu backend {type(gloo)}")
    _expect((gloo.rank(), gloo.size()) == (rank, W), "wrapped Gloo has another rank/size")
    if not torch.cuda.is_available():
        _expect(b.wrapped_backend("cuda") is None, "a CUDA backend without CUDA")
    try:
        b.wrapped_backend("meta")
    except RuntimeError as e:
        _expect("cpu or cuda" in str(e), f"unclear message: {e}")
    else:
        raise AssertionError("wrapped_backend('meta') did not raise")
    opts = b.options
    _expect(isinstance(opts, Options), f"backend.options is {type(opts)}")
    _expect(opts.buffer_size is None, f"default buffer_size {opts.buffer_size}")
    _expect(list(opts.global_ranks_in_group) == list(range(W)), f"{opts.global_ranks_in_group}")
    _expect(opts.group_name == world.group_name, f"{opts.group_name!r} vs {world.group_name!r}")
    _expect(opts._timeout.total_seconds() == PG_TIMEOUT_S, f"timeout {opts._timeout}")

    # subgroups: their own backend object, with their own rank and size
    g0, g1 = ctx.group([0, 1]), ctx.group(list(range(1, W)))
    for g, ranks in ((g0, [0, 1]), (g1, list(range(1, W)))):
        if rank not in ranks:
            _expect(g is dist.GroupMember.NON_GROUP_MEMBER, "non-member got a group")
            continue
        sb = cuda_p2p.get_cuda_p2p_backend(g)
        _expect(sb is not b, "subgroup shares the default group's backend")
        _expect(g._get_backend(torch.device("cpu")) is sb, "subgroup down-cast differs")
        _expect(cuda_p2p.is_cuda_p2p_group(g), "subgroup is not cuda_p2p")
        _expect((sb.rank(), sb.size()) == (ranks.index(rank), len(ranks)), "subgroup rank/size")
        _expect(list(sb.options.global_ranks_in_group) == ranks,
                f"{sb.options.global_ranks_in_group}")
    return True


def test_downcast(world):
    assert world.run(downcast) == [True] * world.size


def non_member(ctx):
    g = ctx.group([0])
    if ctx.rank == 0:
        return cuda_p2p.is_cuda_p2p_group(g)
    errors = []
    for fn in (cuda_p2p.get_cuda_p2p_backend, cuda_p2p.is_cuda_p2p_group):
        try:
            fn(g)
            errors.append(None)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_down_cast_on_non_member_is_clear(world2):
    res = world2.run(non_member)
    assert res[0] is True
    for e in res[1]:
        assert e is not None and e.startswith("ValueError") and "not a member" in e, e


# ---------------------------------------------------------------------------------------------
# Options as pg_options of new_group


def new_group_with_options(ctx):
    W, rank = ctx.world_size, ctx.rank
    o = Options()
    o.buffer_size = 3 * MiB
    g = dist.new_group(backend="cuda_p2p", pg_options=o)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    name = b.options.group_name
    _expect(b.options.buffer_size == 3 * MiB, f"buffer_size read back {b.options.buffer_size}")
    _expect(list(b.options.global_ranks_in_group) == list(range(W)), "ranks read back")
    _expect(name == g.group_name, f"group_name {name!r} vs {g.group_name!r}")
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=g)
    _expect(torch.equal(t, torch.full((5,), W * (W + 1) / 2)), f"all_reduce on it gave {t}")

    # the same Options object for a second group (pairs): the first group keeps its own
    pairs = [[r, r + 1] for r in range(0, W, 2)]
    mine = None
    for ranks in pairs:
        sg = dist.new_group(ranks, backend="cuda_p2p", pg_options=o)
        if rank in ranks:
            mine = sg
    b2 = cuda_p2p.get_cuda_p2p_backend(mine)
    _expect(b2.options.buffer_size == 3 * MiB, "second group's buffer_size")
    _expect(list(b2.options.global_ranks_in_group) == pairs[rank // 2], "second group's ranks")
    _expect(b.options.group_name == name, f"first group's name became {b.options.group_name!r}")
    _expect(
        list(b.options.global_ranks_in_group) == list(range(W)),
        f"first group's ranks became {list(b.options.global_ranks_in_group)}",
    )
    # the user's object is the user's: later changes do not reach the groups
    o.buffer_size = 5
    _expect(b.options.buffer_size == 3 * MiB, "the group's options alias the user's object")

    # nccl_options set to a real ProcessGroupNCCL.Options is accepted (NCCL is only built
    # when CUDA is available)
    if dist.is_nccl_available():
        o2 = Options()
        o2.nccl_options = dist.ProcessGroupNCCL.Options()
        g3 = dist.new_group(backend="cuda_p2p", pg_options=o2)
        b3 = cuda_p2p.get_cuda_p2p_backend(g3)
        _expect(isinstance(b3.options.nccl_options, dist.ProcessGroupNCCL.Options), "nccl_options")
        dist.barrier(group=g3)
    # (destroying groups is tested in test_lifecycle.py, in processes of its own)
    return True


def test_new_group_with_pg_options(world):
    assert world.run(new_group_with_options) == [True] * world.size


def bad_pg_options(ctx, which):
    if which == "str":
        bad = "buffer_size=1"
    elif which == "gloo_options":
        bad = dist.ProcessGroupGloo._Options()
    else:
        raise ValueError(which)
    try:
        dist.new_group(backend="cuda_p2p", pg_options=bad)
    except TypeError as e:
        return str(e)
    return "no error"


# (nccl_options of a wrong type never get this far: the setter refuses them, see above)
@pytest.mark.parametrize("which", ["str", "gloo_options"])
def test_new_group_bad_pg_options(world2, which):
    for msg in world2.run(bad_pg_options, which):
        assert msg != "no error", f"new_group accepted pg_options of the wrong type ({which})"
        assert "pg_options must be" in msg and "cuda_p2p" in msg, msg


# ---------------------------------------------------------------------------------------------
# error paths on a live group


def _world_still_works(W):
    """After errors: an all-reduce on the default group still gives the right sum."""
    x = torch.ones(3)
    dist.all_reduce(x)
    _expect(torch.equal(x, torch.full((3,), float(W))), f"all_reduce after the errors gave {x}")


def _raises(fn, exc, *needles):
    try:
        fn()
    except exc as e:
        for n in needles:
            if n not in str(e):
                raise AssertionError(f"message lacks {n!r}: {e}") from None
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"expected {exc.__name__}, nothing raised")


def error_paths(ctx):
    W, rank = ctx.world_size, ctx.rank
    world = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend()
    t = torch.ones(4)
    # send/recv to self or out of range: the backend's own check, through the group and directly
    _raises(lambda: world.send([t], rank, 0), RuntimeError, "cuda_p2p send", "another rank")
    _raises(lambda: b.send([t], rank, 0), RuntimeError, "cuda_p2p send", f"got {rank}")
    _raises(lambda: b.send([t], W, 0), RuntimeError, "cuda_p2p send", f"[0, {W})")
    _raises(lambda: b.send([t], -1, 0), RuntimeError, "cuda_p2p send")
    _raises(lambda: world.recv([t], rank, 0), RuntimeError, "cuda_p2p recv", "another rank")
    _raises(lambda: b.recv([t], W, 0), RuntimeError, "cuda_p2p recv")
    _raises(lambda: dist.send(t, dst=rank), (ValueError, RuntimeError))
    # meta tensors reach no wrapped backend
    m = torch.empty(4, device="meta")
    _raises(lambda: b.allreduce([m]), RuntimeError, "cuda_p2p", "cpu or cuda", "META")
    _raises(lambda: b.broadcast([m]), RuntimeError, "cuda_p2p", "cpu or cuda")
    _raises(lambda: b.allgather([[m] * W], [m]), RuntimeError, "cuda_p2p", "cpu or cuda")
    _raises(lambda: b.send([m], (rank + 1) % W, 0), RuntimeError, "cuda_p2p", "cpu or cuda")
    # mixed devices, no tensors
    _raises(lambda: b.allreduce([torch.ones(2), m]), RuntimeError, "one device type")
    _raises(lambda: b.allreduce([]), RuntimeError, "at least one tensor")
    # the group still works afterwards
    _world_still_works(W)
    return True


def test_error_paths(world):
    assert world.run(error_paths) == [True] * world.size


# ---------------------------------------------------------------------------------------------
# routing of collectives on CUDA tensors (NOTE [CUDA collectives are opt-in])


def routing_defaults(ctx):
    """On a host workspace the CUDA opt-in changes nothing for CPU tensors; a bad environment
    value is refused on every rank, naming the variable."""
    import os

    W = ctx.world_size
    b = cuda_p2p.get_cuda_p2p_backend()
    cfg = b.get_collective_config()
    _expect(cfg["cuda_workspace_collectives"] is False, f"default opt-in: {cfg}")
    _expect(cfg["workspace_collectives"] is True and cfg["workspace_collectives_reason"] == "",
            f"CPU collectives on the workspace by default: {cfg}")
    results = {}
    for opt_in in (False, True):
        o = Options()
        o.cuda_workspace_collectives = opt_in
        g = dist.new_group(backend="cuda_p2p", pg_options=o)
        bg = cuda_p2p.get_cuda_p2p_backend(g)
        _expect(bg.get_collective_config()["cuda_workspace_collectives"] is opt_in, "option kept")
        t = torch.ones(5)
        dist.all_reduce(t, group=g)
        _expect(torch.equal(t, torch.full((5,), float(W))), f"all_reduce gave {t}")
        results[opt_in] = bg.get_counters()
    for opt_in, counters in results.items():
        _expect(counters.get("all_reduce.one_shot") == 1 and "all_reduce.wrapped" not in counters,
                f"CPU tensors must stay on the workspace (opt-in {opt_in}): {counters}")
    os.environ["CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES"] = "maybe"
    try:
        dist.new_group(backend="cuda_p2p")
        raise AssertionError("a bad CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES was accepted")
    except ValueError as e:
        msg = str(e)
        _expect("CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES must be a boolean" in msg
                and "'maybe'" in msg, msg)
    finally:
        del os.environ["CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES"]
    _world_still_works(W)
    return True


def test_routing_defaults(world2):
    assert world2.run(routing_defaults) == [True] * world2.size


def workspace_device_choice(ctx):
    """NOTE [The workspace's device]: Options.workspace_device and CUDA_P2P_WORKSPACE_DEVICE
    choose where a group's workspace lives; bad values and an impossible "cuda" are refused on
    every rank, naming the knob. (tests/python/conftest.py sets the variable to "cpu", so that
    this suite tests the host workspace on a GPU machine too.)"""
    W = ctx.world_size
    gpu = torch.cuda.is_available()
    _raises(lambda: setattr(Options(), "workspace_device", "gpu"), ValueError,
            "Options.workspace_device must be one of auto|cpu|cuda, got 'gpu'")
    cpu = Options()
    cpu.workspace_device = "cpu"
    g = dist.new_group(backend="cuda_p2p", pg_options=cpu)
    bg = cuda_p2p.get_cuda_p2p_backend(g)
    _expect(bg.get_collective_config()["workspace_device"] == "cpu", "a host workspace")
    t = torch.full((7,), float(ctx.rank + 1))
    dist.all_reduce(t, group=g)
    _expect(torch.equal(t, torch.full((7,), W * (W + 1) / 2)), f"all_reduce gave {t}")
    _expect(bg.get_counters().get("all_reduce.one_shot") == 1, f"{bg.get_counters()}")
    # "auto" (neither knob set) on this machine: the GPU when one is visible.
    with scoped_environ({"CUDA_P2P_WORKSPACE_DEVICE": None}):
        auto = cuda_p2p.get_cuda_p2p_backend(dist.new_group(backend="cuda_p2p"))
        want = "cuda" if gpu else "cpu"
        _expect(auto.get_collective_config()["workspace_device"] == want, f"auto: {want}")
    with scoped_environ({"CUDA_P2P_WORKSPACE_DEVICE": "host"}):
        _raises(lambda: dist.new_group(backend="cuda_p2p"), ValueError,
                "CUDA_P2P_WORKSPACE_DEVICE must be one of auto|cpu|cuda, got 'host'")
    cuda = Options()
    cuda.workspace_device = "cuda"
    if gpu:
        gc = cuda_p2p.get_cuda_p2p_backend(dist.new_group(backend="cuda_p2p", pg_options=cuda))
        _expect(gc.get_collective_config()["workspace_device"] == "cuda", "a GPU workspace")
    else:
        _raises(lambda: dist.new_group(backend="cuda_p2p", pg_options=cuda), RuntimeError,
                "Options.workspace_device asks for a workspace on the GPU ('cuda')",
                "use 'cpu' or 'auto'")
    _world_still_works(W)
    return True


def test_workspace_device_choice(any_world):
    assert any_world.run(workspace_device_choice) == [True] * any_world.size

