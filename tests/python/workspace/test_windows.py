"""One-sided windows on the workspace (torch's ``dist._new_window``, docs/windows.md) on 2, 3 and 4
CPU ranks: ring and all-to-all puts in every dtype, a tensor registered in place (a
``cuda_p2p.empty`` one) and ordinary tensors whose storage moves into the heap (the puts land in
the tensor itself, a view of a larger tensor, refusals of what cannot move), ranks registering
different shapes and dtypes, signals before their waits and after, many puts then one signal,
``map_remote_tensor`` reads and writes, deregistering and registering again, the Works, the
counters, every argument error (raised on every rank for the collective calls, with nothing
written), a timeout naming the peer after which the window stays usable, a peer's failure ending
the waits for it, a host workspace with CUDA's semantics (calls queued, two threads signalling one
peer), and a shut-down group. Every received tensor is compared with what its sender put, computed
locally by plain torch. Windows need torch's c10d windows (torch 2.14): on an older torch the build
leaves them out and these tests skip."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, raises
from _harness import scoped_environ
from cuda_p2p import _C

pytestmark = pytest.mark.skipif(
    not _C._build_info().get("windows", False),
    reason="this torch's c10d has no one-sided windows (torch < 2.14): none were built")

DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool,
          torch.complex64)


def _gloo():
    """A Gloo group over all ranks, made once per process: lines the ranks up between steps."""
    if "g" not in _GLOO:
        _GLOO["g"] = dist.new_group(backend="gloo")
    return _GLOO["g"]


_GLOO: dict = {}


def _barrier():
    dist.barrier(group=_gloo())


def _message(src, dst, n, dtype, seed=0):
    """What rank `src` puts into rank `dst`'s window: distinct per pair and seed, exact in every
    dtype."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + src * 13 + dst * 3 + seed * 5) % 97
    if dtype == torch.bool:
        return v % 2 == 1
    if dtype == torch.complex64:
        return torch.complex(v.float(), -v.float())
    if dtype == torch.int8:
        return (v - 48).to(dtype)
    return v.to(dtype)


def _counters(group):
    return cuda_p2p.get_cuda_p2p_backend(group).get_counters()


def _window_counters(group):
    return {k: v for k, v in _counters(group).items() if k.startswith("window.")}


def check_ring_and_all_to_all(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"windows W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk.case("supports_window", g.supports_window and dist.distributed_c10d._supports_window(g),
             "")
    right, left = (rank + 1) % W, (rank - 1) % W
    b.reset_counters()
    n = 37
    for dtype in DTYPES:
        # An ordinary tensor: its storage moves into the heap; the puts land in the tensor.
        t = torch.zeros(W * n, dtype=dtype)
        win = dist._new_window(t, group=g)
        # Ring: into the right neighbour at element offset n.
        w = win.put(_message(rank, right, n, dtype), right, n, False)
        chk.case(f"{dtype} put's Work", w.is_completed() and w.wait(), "")
        win.signal(right, False).wait()
        win.wait_signal(left, False).wait()
        got = win.map_remote_tensor(rank)
        want = torch.zeros(W * n, dtype=dtype)
        want[n:2 * n] = _message(left, rank, n, dtype)
        chk.case(f"{dtype} ring", torch.equal(got, want), f"{got[:8]} vs {want[:8]}")
        chk.case(f"{dtype} in the tensor itself", torch.equal(t, want) and
                 t.data_ptr() == got.data_ptr(), f"{t[:8]} vs {want[:8]}")
        _barrier()  # every rank read its ring slot before the all-to-all overwrites it
        # All-to-all: into every rank (this one too) at this rank's slot.
        for q in range(W):
            win.put(_message(rank, q, n, dtype, seed=1), q, rank * n, True).wait()
            win.signal(q, True)
        for q in range(W):
            win.wait_signal(q, True).wait()
        want = torch.cat([_message(q, rank, n, dtype, seed=1) for q in range(W)])
        chk.case(f"{dtype} all-to-all", torch.equal(win.map_remote_tensor(rank), want), "")
        _barrier()  # no peer puts into this window any more when it goes
        win = None  # dropped: no peer uses it any more
    c = _window_counters(g)
    k = len(DTYPES)
    chk.case("counters", c == {"window.new": k, "window.register_moved": k,
                               "window.put": k * (W + 1), "window.signal": k * (W + 1),
                               "window.wait_signal": k * (W + 1),
                               "window.map_remote_tensor": 2 * k}, f"{c}")
    chk.case("nothing wrapped", not any(x.endswith(".wrapped") for x in _counters(g)),
             f"{_counters(g)}")
    return chk.result()


def test_ring_and_all_to_all(any_world):
    assert_ok(any_world.run(check_ring_and_all_to_all), min_cases=3 * len(DTYPES))


def _neighbours_values(group, cuda_semantics):
    """The NCCL-style program of issue 59: an ordinary zeroed tensor registered, a put of 16
    values into the right neighbour's slot for this rank, a signal, a wait for the left one; the
    tensor itself then holds the left neighbour's values. With CUDA's semantics the calls return
    queued, and the host reads once the wait's Work is done (on a GPU the read is a kernel queued
    after it)."""
    W, rank = group.size(), group.rank()
    right, left = (rank + 1) % W, (rank - 1) % W
    buf = torch.zeros(16 * W)
    win = dist._new_window(buf, group=group)
    win.put(torch.full((16,), float(rank + 1)), right, 16 * rank, False)
    win.signal(right, False)
    w = win.wait_signal(left, False)
    if cuda_semantics:
        w.wait()
    return win, buf


def check_registered_tensor_receives(ctx):
    """A window registered on an ordinary tensor: the peers' puts land in the tensor itself, in
    both host modes; its contents survive the move into the heap, this rank's own writes are what
    peers read, a view of a larger tensor receives them in the larger tensor, and what cannot be
    moved (a non-contiguous tensor, numpy's memory) raises on every rank, naming the rank."""
    import numpy as np

    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window on an ordinary tensor W={W}")
    right, left = (rank + 1) % W, (rank - 1) % W
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.host_semantics = "cuda"
    h = dist.new_group(backend="cuda_p2p", pg_options=o, timeout=timedelta(seconds=30))
    for name, group, cuda in (("default", dist.group.WORLD, False), ("cuda semantics", h, True)):
        win, buf = _neighbours_values(group, cuda)
        want = torch.zeros(16 * W)
        want[16 * left:16 * left + 16] = float(left + 1)
        chk.case(f"{name}: the left neighbour's values", torch.equal(buf, want),
                 f"{buf[16 * left:16 * left + 4]}")
        _barrier()
        win = None  # dropped: no peer uses it any more
    # The contents move with the storage; every view of it aliases the heap; this rank's own
    # writes reach the peers' mappings.
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    n = 8
    big = torch.arange(3 * n * W, dtype=torch.float64) + 1000 * rank
    before = big.clone()
    view = big[n * W:2 * n * W]  # a contiguous view of a larger tensor
    other_view = big[:n]
    win = dist._new_window(view, group=g)
    chk.case("moved", _window_counters(g).get("window.register_moved") == 1,
             f"{_window_counters(g)}")
    # (the window's own slots may already hold a peer's put)
    chk.case("contents kept", torch.equal(big[:n * W], before[:n * W]) and
             torch.equal(big[2 * n * W:], before[2 * n * W:]), "")
    chk.case("views alias the heap", b.symmetric_offset(big) >= 0 and
             other_view.data_ptr() == big.data_ptr(), "")
    win.put(_message(rank, right, n, torch.float64), right, rank * n, False)
    win.signal(right, False)
    win.wait_signal(left, False)
    before[n * W + left * n:n * W + left * n + n] = _message(left, rank, n, torch.float64)
    chk.case("the larger tensor receives", torch.equal(big, before), f"{big[n * W:n * W + 8]}")
    _barrier()
    view[rank * n] = -7.0  # a local write, read by the right neighbour through its mapping
    _barrier()
    mapped = win.map_remote_tensor(left)
    chk.case("own writes are what peers read", mapped[left * n].item() == -7.0, f"{mapped[:4]}")
    mapped = None  # a peer's memory: mapped tensors outlive no registration
    mine = win.map_remote_tensor(rank)  # a view of `view` itself: it may outlive it
    _barrier()
    win.tensor_deregister()
    chk.case("the own rank's mapping is the tensor", mine.data_ptr() == view.data_ptr() and
             torch.equal(mine, view), "")
    win = None
    chk.case("the tensor outlives its window", torch.equal(big[:n], before[:n]), "")
    # What cannot be moved raises on every rank, the others naming the rank, nothing registered.
    cases = (("non-contiguous", lambda: torch.zeros(4, 2 * W).t(),
              "expected a contiguous tensor (the peers' puts address its elements in row-major "
              f"order), got one of sizes [{2 * W}, 4] and strides [1, {2 * W}]"),
             ("numpy's memory", lambda: torch.from_numpy(np.zeros(4, dtype=np.float32)),
              "got one whose memory another owner holds"))
    for what, bad, message in cases:
        win = dist._new_window(group=g)
        t = bad() if rank == W - 1 else torch.zeros(4)
        err = raises(lambda t=t: win.tensor_register(t))
        want = message if rank == W - 1 else f"rank {W - 1} could not register its tensor"
        chk.case(f"{what} refused", err is not None and want in err, f"{err!r}")
        chk.case(f"{what}: nothing registered",
                 "no registered tensor" in (raises(lambda: win.map_remote_tensor(rank)) or ""), "")
        _barrier()
        win = None
    dist.destroy_process_group(h)
    return chk.result()


def test_registered_tensor_receives(any_world):
    assert_ok(any_world.run(check_registered_tensor_receives), min_cases=12)


def check_in_place_and_shapes(ctx):
    """A cuda_p2p.empty tensor is registered in place: the peers' puts land in it. Ranks register
    different shapes and dtypes; map_remote_tensor shows each peer's, and writes through it reach
    the peer."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"windows in place W={W}")
    g = dist.group.WORLD
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    dtypes = [torch.float32, torch.int32, torch.float16, torch.int64]
    dtype = dtypes[rank % len(dtypes)]
    t = cuda_p2p.empty(rank + 1, 3, dtype=dtype)
    t.copy_(_message(rank, rank, 3 * (rank + 1), dtype).view(rank + 1, 3))
    win = dist._new_window(group=g)
    win.tensor_register(t)
    chk.case("registered in place", _window_counters(g).get("window.register_in_place") == 1,
             f"{_window_counters(g)}")
    for q in range(W):
        remote = win.map_remote_tensor(q)
        qdtype = dtypes[q % len(dtypes)]
        chk.case(f"remote {q} shape", remote.shape == (q + 1, 3) and remote.dtype == qdtype,
                 f"{remote.shape} {remote.dtype}")
        chk.case(f"remote {q} data", torch.equal(
            remote, _message(q, q, 3 * (q + 1), qdtype).view(q + 1, 3)), f"{remote}")
        attr = win.get_attr(q)
        chk.case(f"get_attr {q}", attr.access_type == dist.distributed_c10d.WindowAccessType
                 .UNIFIED if hasattr(dist.distributed_c10d, "WindowAccessType") else
                 str(attr.access_type).endswith("UNIFIED"), f"{attr.access_type}")
    _barrier()
    # Into the right neighbour's tensor, its dtype, its last row.
    right, left = (rank + 1) % W, (rank - 1) % W
    rdtype = dtypes[right % len(dtypes)]
    win.put(_message(rank, right, 3, rdtype, seed=2), right, 3 * right, False)
    win.signal(right, False)
    win.wait_signal(left, False)
    want = _message(rank, rank, 3 * (rank + 1), dtype).view(rank + 1, 3)
    want[rank] = _message(left, rank, 3, dtype, seed=2)
    chk.case("puts land in the tensor", torch.equal(t, want), f"{t} vs {want}")
    _barrier()
    # Writes through the left neighbour's mapping reach it.
    win.map_remote_tensor(left)[0].fill_(5)
    _barrier()
    chk.case("written through a mapping", bool((t[0] == 5).all()), f"{t}")
    _barrier()
    win = None  # dropped: no peer uses it any more
    return chk.result()


def test_in_place_and_shapes(any_world):
    assert_ok(any_world.run(check_in_place_and_shapes), min_cases=5)


def _ring_step(win, message, right, left):
    """Puts `message` at offset 0 of the right neighbour's window, signals it, and waits for the
    left neighbour's signal."""
    win.put(message, right, 0, False)
    win.signal(right, False)
    win.wait_signal(left, False)


def check_signals(ctx):
    """Signals sent before their waits stay counted, a wait consumes one, a wait posted before
    its signal returns when it comes, and many puts then one signal hand over every put."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window signals W={W}")
    g = dist.group.WORLD
    right, left = (rank + 1) % W, (rank - 1) % W
    piece, puts = 8, 10
    win = dist._new_window(torch.zeros(piece * puts), group=g)
    # Many puts, then one signal: the one wait sees all of them.
    for i in range(puts):
        win.put(_message(rank, right, piece, torch.float32, seed=i), right, i * piece, False)
    win.signal(right, False)
    win.wait_signal(left, False)
    want = torch.cat([_message(left, rank, piece, torch.float32, seed=i) for i in range(puts)])
    chk.case("many puts, one signal", torch.equal(win.map_remote_tensor(rank), want), "")
    _barrier()
    # Three signals before any wait: three waits return at once, each consuming one - with a
    # short timeout, which a wait meets only when its signal is not there yet (a wait looks before
    # it checks its deadline, so a slow machine does not make it time out).
    opts = dist.distributed_c10d.WaitSignalOptions() \
        if hasattr(dist.distributed_c10d, "WaitSignalOptions") else \
        torch._C._distributed_c10d.WaitSignalOptions()
    opts.timeout = timedelta(milliseconds=300)
    for _ in range(3):
        win.signal(right, False)
    _barrier()
    early = [raises(lambda: win.wait_signal(left, False, opts)) for _ in range(3)]
    chk.case("signals before waits", early == [None] * 3, f"{early!r}")
    # A fourth wait has nothing to consume: it times out naming the left rank, consuming nothing.
    err = raises(lambda: win.wait_signal(left, False, opts))
    chk.case("timeout names the peer", err is not None and (
        f"rank {rank}'s window wait_signal for signal #5 from rank {left} timed out after "
        f"300 ms: rank {left} never arrived") in err, f"{err!r}")
    _barrier()
    # A wait posted before its signal: the right rank signals late; the wait is the 5th again.
    if rank % 2 == 0:
        time.sleep(0.2)
    _ring_step(win, _message(rank, right, piece, torch.float32, seed=99), right, left)
    chk.case("wait before signal", torch.equal(
        win.map_remote_tensor(rank)[:piece], _message(left, rank, piece, torch.float32, seed=99)),
        "")
    _barrier()
    win = None  # dropped: no peer uses it any more
    return chk.result()


def test_signals(any_world):
    assert_ok(any_world.run(check_signals), min_cases=4)


def check_deregister_and_register_again(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window registration W={W}")
    g = dist.group.WORLD
    right, left = (rank + 1) % W, (rank - 1) % W
    win = dist._new_window(torch.zeros(6), group=g)
    _ring_step(win, _message(rank, right, 6, torch.float32), right, left)
    chk.case("first registration", torch.equal(
        win.map_remote_tensor(rank), _message(left, rank, 6, torch.float32)), "")
    # A tensor mapped from a peer (here a view of it, on rank 0 only) outlives no registration:
    # every rank's tensor_deregister raises, naming rank 0, and the window stays registered.
    kept = win.map_remote_tensor(right)[1:] if rank == 0 else None
    err = raises(win.tensor_deregister)
    want = ("cuda_p2p window tensor_deregister: 1 tensor from map_remote_tensor (of rank "
            f"{right}) is still alive on rank 0; after tensor_deregister that memory may be "
            "reused" if rank == 0 else "rank 0 could not deregister")
    chk.case("mapped tensor alive", err is not None and want in err, f"{err!r}")
    kept = None  # noqa: F841 (dropped: the deregistration goes through)
    _ring_step(win, _message(rank, right, 6, torch.float32, seed=2), right, left)
    chk.case("still registered", torch.equal(
        win.map_remote_tensor(rank), _message(left, rank, 6, torch.float32, seed=2)), "")
    win.tensor_deregister()
    err = raises(lambda: win.put(torch.ones(1), right, 0, False))
    chk.case("put unregistered", err is not None and "the window has no registered tensor" in err,
             f"{err!r}")
    err = raises(lambda: win.map_remote_tensor(right))
    chk.case("remote unregistered", err is not None and "no registered tensor" in err, f"{err!r}")
    # Registered again, another dtype and size (in place this time); the signals count on.
    t = cuda_p2p.empty(4, dtype=torch.int64)
    t.zero_()
    win.tensor_register(t)
    _ring_step(win, _message(rank, right, 4, torch.int64, seed=3), right, left)
    chk.case("second registration", torch.equal(t, _message(left, rank, 4, torch.int64, seed=3)),
             f"{t}")
    # Errors of the collective calls are raised on every rank and change nothing: a second
    # registration...
    err = raises(lambda: win.tensor_register(torch.zeros(2)))
    chk.case("register twice", err is not None and (
        "cuda_p2p window tensor_register: the window already has a registered tensor (call "
        "tensor_deregister first, on every rank)") in err, f"{err!r}")
    _ring_step(win, _message(rank, right, 4, torch.int64, seed=5), right, left)
    chk.case("still the first", torch.equal(t, _message(left, rank, 4, torch.int64, seed=5)),
             f"{t}")
    win.tensor_deregister()
    # ... a tensor of too many dimensions on rank 0 while the others register fine: every rank
    # raises, the others naming rank 0...
    t2 = torch.zeros([1] * 17) if rank == 0 else torch.zeros(3)
    err = raises(lambda: win.tensor_register(t2))
    want = ("expected a tensor of at most 16 dimensions, got 17" if rank == 0 else
            "rank 0 could not register its tensor")
    chk.case("bad tensor on one rank", err is not None and want in err, f"{err!r}")
    err = raises(lambda: win.put(torch.ones(1), right, 0, False))
    chk.case("nobody registered", err is not None and "no registered tensor" in err, f"{err!r}")
    err = raises(win.tensor_deregister)
    chk.case("deregister unregistered", err is not None and
             "the window has no registered tensor" in err, f"{err!r}")
    # ... and the window still works.
    win.tensor_register(torch.zeros(3, dtype=torch.float64))
    _ring_step(win, _message(rank, right, 3, torch.float64, seed=4), right, left)
    chk.case("usable after errors", torch.equal(
        win.map_remote_tensor(rank), _message(left, rank, 3, torch.float64, seed=4)), "")
    _barrier()
    win = None  # dropped: no peer uses it any more
    return chk.result()


def test_deregister_and_register_again(any_world):
    assert_ok(any_world.run(check_deregister_and_register_again), min_cases=8)


def check_argument_errors(ctx):
    """Bad peers, offsets, sizes, dtypes, devices and layouts: clear errors, nothing written."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window errors W={W}")
    g = dist.group.WORLD
    right = (rank + 1) % W
    n = 10
    win = dist._new_window(torch.zeros(n), group=g)
    on = f"on rank {rank}"

    def case(what, call, *parts):
        err = raises(call)
        chk.case(what, err is not None and all(p in err for p in parts), f"{err!r}")

    case("dst too large", lambda: win.put(torch.ones(1), W, 0, False),
         f"cuda_p2p window put: expected dst_rank in [0, {W}), got {W} {on}")
    case("dst negative", lambda: win.put(torch.ones(1), -1, 0, False), "got -1")
    case("dtype", lambda: win.put(torch.ones(2, dtype=torch.float64), right, 0, False),
         f"cuda_p2p window put: rank {right}'s window holds float32, but the tensor put is "
         f"float64 ({on})")
    case("negative offset", lambda: win.put(torch.ones(2), right, -1, False),
         "expected an element offset >= 0, got -1")
    case("larger than the peer's tensor", lambda: win.put(torch.ones(n + 1), right, 0, False),
         f"cuda_p2p window put: rank {right}'s window holds {n} elements of float32, but the put "
         f"writes {n + 1} elements at element offset 0 (up to element {n + 1}; {on}): nothing "
         "was written")
    case("past the end", lambda: win.put(torch.ones(4), right, n - 3, False),
         f"up to element {n + 1}")
    case("sparse", lambda: win.put(torch.ones(2).to_sparse(), right, 0, False),
         "expected a strided tensor on cpu")
    case("signal peer", lambda: win.signal(W + 1, False),
         f"cuda_p2p window signal: expected peer_rank in [0, {W}), got {W + 1}")
    case("wait peer", lambda: win.wait_signal(-5, False),
         "cuda_p2p window wait_signal: expected peer_rank in [0, ")
    case("remote rank", lambda: win.map_remote_tensor(W), "cuda_p2p window map_remote_tensor")
    case("get_attr peer", lambda: win.get_attr(W), "cuda_p2p window get_attr")
    # A non-contiguous source is put in its logical order; the largest put that fits is accepted.
    src = torch.arange(6, dtype=torch.float32).view(3, 2).t()  # 0 2 4 1 3 5
    win.put(src, right, n - 6, False)
    _barrier()
    want = torch.zeros(n)
    want[n - 6:] = torch.tensor([0.0, 2, 4, 1, 3, 5])
    chk.case("nothing else written", torch.equal(win.map_remote_tensor(rank), want),
             f"{win.map_remote_tensor(rank)}")
    _barrier()
    win = None  # dropped: no peer uses it any more
    return chk.result()


def test_argument_errors(any_world):
    assert_ok(any_world.run(check_argument_errors), min_cases=12)


def check_host_cuda_semantics(ctx):
    """On a host workspace with CUDA's semantics (Options.host_semantics = "cuda": a call returns
    queued on its thread's own stream, as on a GPU): ring puts whose Works are waited for, the
    waits' Works synchronized before the host reads, and two threads signalling one peer from
    their own streams - every signal counted, so the peer's waits all return (NOTE [Window
    signals]: the signals to one peer execute in the order they were counted)."""
    import threading

    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window host cuda semantics W={W}")
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.host_semantics = "cuda"
    h = dist.new_group(backend="cuda_p2p", pg_options=o, timeout=timedelta(seconds=30))
    cuda_p2p.get_cuda_p2p_backend(h).reset_counters()
    right, left = (rank + 1) % W, (rank - 1) % W
    n = 64
    win = dist._new_window(torch.zeros(2 * n), group=h)
    for i in range(2):
        win.put(_message(rank, right, n, torch.float32, seed=i), right, i * n, True).wait()
    win.signal(right, True)
    win.wait_signal(left, True).wait()
    want = torch.cat([_message(left, rank, n, torch.float32, seed=i) for i in range(2)])
    chk.case("ring", torch.equal(win.map_remote_tensor(rank), want), "")
    _barrier()
    each = 50

    thread_errors = []

    # Work.wait(), not synchronize(): torch's binding of synchronize holds the GIL while it
    # blocks, so the other thread could not issue the signals the peers wait for.
    def signal():
        try:
            for _ in range(each - 1):
                win.signal(right, False)
            win.signal(right, False).wait()
        except Exception as e:  # noqa: BLE001 - reported below
            thread_errors.append(repr(e))

    threads = [threading.Thread(target=signal) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(2 * each - 1):
        win.wait_signal(left, False)
    err = raises(lambda: win.wait_signal(left, False).wait())
    for t in threads:
        t.join()
    chk.case("signalling threads", not thread_errors, f"{thread_errors}")
    chk.case("two threads' signals all counted", err is None, f"{err!r}")
    _barrier()
    c = _window_counters(h)
    chk.case("counters", c.get("window.signal") == 1 + 2 * each and
             c.get("window.wait_signal") == 1 + 2 * each and c.get("window.put") == 2, f"{c}")
    _barrier()
    win = None
    dist.destroy_process_group(h)
    return chk.result()


def test_host_cuda_semantics(any_world):
    assert_ok(any_world.run(check_host_cuda_semantics), min_cases=3)


def check_a_failed_peer(ctx):
    """A rank whose group is aborted tells its peers through their failure words (NOTE [Failure
    words] in p2p_workspace/watchdog.hpp): their window waits for it, blocked with the group's
    long timeout, end soon with its failure, naming it and why, and later window calls raise."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window failed peer W={W}")
    h = dist.new_group(backend="cuda_p2p", timeout=timedelta(seconds=60))
    win = dist._new_window(torch.zeros(4), group=h)
    _barrier()
    if rank == 0:
        time.sleep(0.3)  # the others are waiting
        cuda_p2p.get_cuda_p2p_backend(h).abort()
        err = raises(lambda: win.signal(1, False))
        chk.case("own calls raise", err is not None and "aborted" in err, f"{err!r}")
    else:
        t0 = time.monotonic()
        err = raises(lambda: win.wait_signal(0, False))
        # Ended by the failure word, not by the group's 60 s timeout (on a busy machine too).
        chk.case("wait ends soon", time.monotonic() - t0 < 30.0, f"{time.monotonic() - t0:.1f} s")
        chk.case("names the failed rank and why", err is not None and
                 "rank 0's device failed first" in err and "aborted" in err, f"{err!r}")
        err = raises(lambda: win.put(torch.ones(1), 0, 0, False))
        chk.case("later calls raise", err is not None and "rank 0's device failed first" in err,
                 f"{err!r}")
    _barrier()
    win = None
    dist.destroy_process_group(h)
    return chk.result()


def test_a_failed_peer(any_world):
    assert_ok(any_world.run(check_a_failed_peer))


def check_group_without_workspace_and_shut_down(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"window groups W={W}")
    with scoped_environ({"CUDA_P2P_DISABLE_WORKSPACE": "1"}):
        off = dist.new_group(backend="cuda_p2p")
    chk.case("supports_window off", not off.supports_window, "")
    err = raises(lambda: dist._new_window(torch.zeros(2), group=off))
    chk.case("new_window without workspace", err is not None and
             "cuda_p2p new_window: expected a group with an available P2P workspace" in err,
             f"{err!r}")
    # Not while coalescing: the records' exchange would be deferred. Raised on every rank.
    world = dist.group.WORLD
    world._start_coalescing(torch.device("cpu"))
    try:
        err = raises(lambda: dist._new_window(torch.zeros(2), group=world))
    finally:
        world._end_coalescing(torch.device("cpu"))
    chk.case("new_window while coalescing", err is not None and (
        "cuda_p2p window new_window: called while the group is coalescing") in err, f"{err!r}")
    # A window outlives its group's destroy_process_group, and raises from then on.
    h = dist.new_group(backend="cuda_p2p", timeout=timedelta(seconds=20))
    win = dist._new_window(torch.zeros(4), group=h)
    right = (rank + 1) % W
    win.put(torch.ones(2), right, 0, False)
    _barrier()
    dist.destroy_process_group(h)
    err = raises(lambda: win.put(torch.ones(2), right, 0, False))
    chk.case("put after shutdown", err is not None and "the group was shut down" in err,
             f"{err!r}")
    err = raises(lambda: win.wait_signal(right, False))
    chk.case("wait after shutdown", err is not None and "the group was shut down" in err,
             f"{err!r}")
    win = None  # dropped: no peer uses it any more
    dist.destroy_process_group(off)
    return chk.result()


def test_group_without_workspace_and_shut_down(world2):
    assert_ok(world2.run(check_group_without_workspace_and_shut_down), min_cases=5)
