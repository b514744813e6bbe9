"""Zero-copy symmetric tensors (issue 15.1): the symmetric heap (its allocator, which has unit
tests of its own, its segments, lifetime and limits), cuda_p2p.empty and use_symmetric_memory.
The collectives that read symmetric inputs from their owners' heaps instead of staging them:
test_zero_copy_collectives.py, which shares this file's rank-side helpers.

Results are compared with plain-torch math over every rank's inputs (computed locally, exact for
the small integers used); the counters say whether the zero-copy path ran.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _groups import cached_group
from _reference import reduce_over_ranks
from cuda_p2p import _C

# ---------------------------------------------------------------------------------------------
# the allocator alone


def test_allocator_first_fit_alignment_and_coalescing():
    a = _C._testing.HeapAllocator(4096, 256)
    offs = [a.allocate(n) for n in (1, 300, 0, 256)]
    assert offs == [0, 256, 768, 1024]  # rounded up to 256; 0 bytes still take a unit
    assert a.used_bytes() == 256 + 512 + 256 + 256 and a.live_blocks() == 4
    a.free(256)
    assert a.allocate(200) == 256  # first fit: the lowest hole
    assert a.allocate(300) == 1280  # the hole left at 512 holds 256 bytes only
    for o in (0, 256, 768, 1024, 1280):
        a.free(o)
    assert a.free_ranges() == {0: 4096} and a.used_bytes() == 0  # merged back into one range
    assert a.allocate(4096) == 0 and a.allocate(1) is None  # full
    a.free(0)
    assert a.allocate(4097) is None and a.largest_free() == 4096
    with pytest.raises(RuntimeError, match="no live block at offset 12"):
        a.free(12)
    with pytest.raises(RuntimeError, match="power of two"):
        _C._testing.HeapAllocator(4096, 100)


def test_allocator_is_deterministic():
    def run(alloc):
        out, live = [], []
        for i in range(200):
            n = (i * 7919) % 5000
            if i % 3 == 2 and live:
                alloc.free(live.pop((i * 31) % len(live)))
            o = alloc.allocate(n)
            out.append(o)
            if o is not None:
                live.append(o)
        return out, alloc.free_ranges()

    assert run(_C._testing.HeapAllocator(1 << 20)) == run(_C._testing.HeapAllocator(1 << 20))


# ---------------------------------------------------------------------------------------------
# rank side



def _counters(group):
    return dict(cuda_p2p.get_cuda_p2p_backend(group).get_counters())


def _values(rank, n, dtype, seed=0):
    """Small integers: exact in every dtype and summation order."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + seed) % 17 - 8
    return (v.abs() if dtype == torch.uint8 else v).to(dtype)


def _fill(t, rank, seed=0):
    t.copy_(_values(rank, t.numel(), t.dtype, seed).view(t.shape))
    return t


class Checker:
    def __init__(self):
        self.failures = []

    def case(self, what, ok, detail=""):
        if not ok:
            self.failures.append(f"{what}: {detail}")


def _expect_zero_copy(chk, group, key, before, what, ran=True):
    got = _counters(group).get(key, 0) - before.get(key, 0)
    chk.case(what, got == (1 if ran else 0), f"{key} moved by {got}, expected {int(ran)}")



def _heap_case(ctx):
    chk = Checker()
    g = cached_group("small_heap", symmetric_heap_size=1 << 20)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk.case("lazy", b.symmetric_heap_info()["created"] == 0)
    chk.case("device", b.symmetric_device() == torch.device("cpu"), f"{b.symmetric_device()}")
    a = cuda_p2p.empty(1000, group=g)
    info = b.symmetric_heap_info()
    chk.case("created", info["created"] == 1 and info["capacity"] == 1 << 20, f"{info}")
    off = b.symmetric_offset(a)
    v = a[10:]
    del a
    chk.case("a view keeps the block", b.symmetric_heap_info()["live_blocks"] == 1)
    del v
    chk.case("freed", b.symmetric_heap_info()["live_blocks"] == 0)
    c = cuda_p2p.empty(250, dtype=torch.float32, group=g)
    chk.case("reused", b.symmetric_offset(c) == off == 0, f"{b.symmetric_offset(c)} vs {off}")
    d = cuda_p2p.empty((3, 5), dtype=torch.int16, group=g, device="cpu")
    chk.case("shape/dtype", d.shape == (3, 5) and d.dtype == torch.int16 and d.is_contiguous())
    chk.case("aligned", b.symmetric_offset(d) % 256 == 0 and b.symmetric_offset(d) > 0)
    try:
        cuda_p2p.empty(1 << 20, group=g)
        chk.case("full raises", False)
    except RuntimeError as e:
        chk.case("full message", "symmetric_heap_size" in str(e) and "full" in str(e), str(e))
    del c, d
    e = cuda_p2p.empty(1 << 18, dtype=torch.float32, group=g)  # exactly the whole heap
    chk.case("whole heap", b.symmetric_offset(e) == 0)
    del e
    # A peer's copy of a symmetric tensor, read through this rank's mapping of its heap.
    mine = _fill(cuda_p2p.empty((4, 6), dtype=torch.int32, group=g), ctx.rank, seed=3)
    view = mine[1:, ::2]
    dist.barrier(group=ctx.gloo)  # every rank has written its tensor
    for q in range(ctx.world_size):
        peer = b.symmetric_peer_tensor(view, q)
        want = _values(q, 24, torch.int32, 3).view(4, 6)[1:, ::2]
        chk.case(f"peer {q} tensor", peer.stride() == view.stride() and torch.equal(peer, want),
                 f"{peer} vs {want}")
    dist.barrier(group=ctx.gloo)  # nobody frees its tensor while a peer reads it
    del mine, view, peer
    errors = [
        (lambda: cuda_p2p.empty(-1, group=g), ValueError, "sizes >= 0"),
        (lambda: cuda_p2p.empty(2.5, group=g), TypeError, "integers"),
        (lambda: cuda_p2p.empty(2, dtype="float32", group=g), TypeError, "torch.dtype"),
        # A host group's heap is on the host: CUDA tensors are a clear error naming both, raised
        # before anything touches CUDA (there is no GPU here).
        (lambda: cuda_p2p.empty(2, device="cuda", group=g), ValueError,
         "expected device cpu, got 'cuda'"),
        (lambda: cuda_p2p.empty(2, device=torch.device("cuda", 1), group=g), ValueError,
         "expected device cpu, got device(type='cuda', index=1)"),
        (lambda: b.symmetric_empty([2], torch.float32, torch.device("cuda", 0)), ValueError,
         "expected device cpu (this group's symmetric heap lives on its workspace's device), "
         "got cuda:0"),
        (lambda: cuda_p2p.empty(2, device="meta", group=g), ValueError, "expected device cpu"),
        (lambda: cuda_p2p.empty(2, device="nonsense", group=g), ValueError, "expected device"),
        # The MemPool allocator is CUDA's: a host heap has none.
        (lambda: cuda_p2p.get_mem_pool(g), NotImplementedError, "no memory-pool hook"),
        (lambda: b.symmetric_allocator(), NotImplementedError, "no allocator hook"),
        (lambda: cuda_p2p.empty(2, group=ctx.gloo), TypeError, "backend='cuda_p2p'"),
        (lambda: cuda_p2p.empty(2, group=g, dtype=torch.qint8), RuntimeError, "dtype"),
        (lambda: b.symmetric_peer_tensor(torch.ones(3), 0), ValueError,
         "expected a tensor in this group's symmetric heap"),
        (lambda: b.symmetric_peer_tensor(cuda_p2p.empty(3, group=g), ctx.world_size), ValueError,
         "rank must be in [0, "),
    ]
    off = cached_group("no_workspace", enable_workspace=False)
    errors.append((lambda: cuda_p2p.empty(2, group=off), RuntimeError, "unavailable"))
    errors.append((lambda: cuda_p2p.get_mem_pool(off), RuntimeError, "unavailable"))
    errors.append((lambda: cuda_p2p.use_symmetric_memory(off).__enter__(), RuntimeError,
                   "unavailable"))
    for fn, exc, text in errors:
        try:
            fn()
            chk.case(f"{text} raises", False)
        except exc as err:
            chk.case(f"{text} message", text in str(err), str(err))
    return chk.failures


def test_heap_lifetime_and_errors(world2):
    for failures in world2.run(_heap_case):
        assert not failures, failures


def _mapped_memfd(address):
    """Whether ``address`` lies in one of this process's memfd mappings of ours."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return "memfd:cuda_p2p" in line
    return False


def _segments_case(ctx):
    """What the MemPool allocator's functions do (NOTE [Heap under a MemPool]), on the host heap:
    segments share the heap's first-fit allocator with cuda_p2p.empty, are counted by
    symmetric_heap_info, a full heap is a torch.OutOfMemoryError naming the knobs, and the
    segments keep the heap mapped after the group is gone."""
    import gc

    chk = Checker()
    g = dist.new_group(backend="cuda_p2p", pg_options=_options(symmetric_heap_size=1 << 20))
    b = cuda_p2p.get_cuda_p2p_backend(g)
    seg = _C._testing.heap_segments(b)  # collective: creates the heap
    p = seg.allocate(300000)
    t = cuda_p2p.empty(10, group=g)
    off = b.symmetric_offset(t)
    chk.case("segment at the heap's start", off == 300032 and t.data_ptr() - p == off,
             f"tensor at offset {off}, {t.data_ptr() - p} bytes after the segment")
    info = b.symmetric_heap_info()
    chk.case("counted", info["segments"] == 1 and info["segment_bytes"] == 300000
             and info["live_blocks"] == 2 and info["used_bytes"] == 300032 + 256, f"{info}")
    try:
        seg.allocate(1 << 20)
        chk.case("a full heap raises", False)
    except torch.OutOfMemoryError as e:
        msg = str(e)
        chk.case("full heap message", "symmetric heap is full" in msg and str(1 << 20) in msg
                 and "Options.symmetric_heap_size" in msg
                 and "CUDA_P2P_SYMMETRIC_HEAP_SIZE" in msg, msg)
    seg.free(p)
    info = b.symmetric_heap_info()
    chk.case("freed", info["segments"] == 0 and info["live_blocks"] == 1, f"{info}")
    try:
        seg.free(p)
        chk.case("a second free raises", False)
    except RuntimeError as e:
        chk.case("second free message", "not a live segment" in str(e), str(e))
    chk.case("reused first fit", seg.allocate(1000) == p)
    # A MemPool allocator over the heap (built with CUDA): torch's type, never called here.
    hook = getattr(_C._testing, "heap_pool_allocator", None)
    alloc = hook(b) if hook else None
    if alloc is not None:
        chk.case("torch's allocator type", isinstance(alloc, torch._C._cuda_CUDAAllocator),
                 f"{type(alloc)}")
    # The group goes; the segments (what a MemPool's allocator holds) keep the heap mapped.
    del t
    dist.destroy_process_group(g)
    del g, b
    gc.collect()
    chk.case("mapped while segments live", _mapped_memfd(p))
    seg.free(p)
    del seg
    gc.collect()
    if alloc is not None:
        chk.case("the allocator keeps it mapped", _mapped_memfd(p))
        del alloc
        gc.collect()
    deadline = time.monotonic() + 20  # the peers' unmapping (NOTE [Block lifetime])
    while _mapped_memfd(p) and time.monotonic() < deadline:
        time.sleep(0.05)
    chk.case("unmapped with the last segment user", not _mapped_memfd(p))
    return chk.failures


def test_heap_segments(world2):
    for failures in world2.run(_segments_case):
        assert not failures, failures


def _destroyed_case(ctx):
    """Destroying the group unmaps its heap once no tensor holds it."""
    import gc

    chk = Checker()
    g = dist.new_group(backend="cuda_p2p", pg_options=_options(symmetric_heap_size=1 << 20))
    t = cuda_p2p.empty(100, group=g)
    base = t.data_ptr() - cuda_p2p.get_cuda_p2p_backend(g).symmetric_offset(t)
    dist.destroy_process_group(g)
    del g
    gc.collect()
    chk.case("a tensor keeps it mapped", _mapped_memfd(base))
    del t
    gc.collect()
    deadline = time.monotonic() + 20
    while _mapped_memfd(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    chk.case("unmapped", not _mapped_memfd(base))
    return chk.failures


def test_heap_freed_with_the_group(world2):
    for failures in world2.run(_destroyed_case):
        assert not failures, failures


def _too_large_case(ctx):
    """A rank that cannot allocate its heap (rank 0 asks for 256 TiB: more than the address
    space) fails every rank at once, naming it (NOTE [Allocation failures at rendezvous]); the
    group stays usable and a second attempt fails the same way instead of hanging."""
    W, me = ctx.world_size, ctx.rank
    chk = Checker()
    size = (1 << 48) if me == 0 else (1 << 20)
    g = dist.new_group(backend="cuda_p2p", pg_options=_options(symmetric_heap_size=size))
    b = cuda_p2p.get_cuda_p2p_backend(g)
    for attempt in range(2):
        t0 = time.monotonic()
        try:
            cuda_p2p.empty(10, group=g)
            chk.case(f"attempt {attempt} raises", False)
        except RuntimeError as e:
            msg = str(e)
            chk.case(f"attempt {attempt} message",
                     "could not create the group's symmetric heap" in msg
                     and f"{size} bytes per rank" in msg
                     and "1 of " + str(W) + " ranks could not allocate" in msg
                     and "rank 0: " in msg and "symmetric_heap_size" in msg, msg)
        chk.case(f"attempt {attempt} fast", time.monotonic() - t0 < 20,
                 f"{time.monotonic() - t0:.1f} s")
    chk.case("no heap", b.symmetric_heap_info()["created"] == 0)
    x = torch.full((5,), float(me))
    dist.all_reduce(x, group=g)
    chk.case("still usable", torch.equal(x, torch.full((5,), float(sum(range(W))))), f"{x}")
    dist.destroy_process_group(g)
    return chk.failures


def test_heap_too_large_fails_on_every_rank(world2):
    for failures in world2.run(_too_large_case):
        assert not failures, failures


def _options(**options):
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    for k, v in options.items():
        setattr(o, k, v)
    return o


def _context_case(ctx):
    W, me = ctx.world_size, ctx.rank
    g = cached_group("zc")
    chk = Checker()
    plain = torch.arange(6.0).view(2, 3)
    out = torch.empty(3)
    with cuda_p2p.use_symmetric_memory(g) as mode:
        made = {
            "empty": torch.empty(5),
            "empty tuple": torch.empty((2, 3), dtype=torch.int32),
            "zeros": torch.zeros(3, 4),
            "ones": torch.ones(2, dtype=torch.int64),
            "full": torch.full((3,), 7),
            "full float": torch.full((2, 2), 1.5, dtype=torch.float64),
            "empty_like": torch.empty_like(plain),
            "zeros_like": torch.zeros_like(plain),
            "ones_like": torch.ones_like(plain, dtype=torch.int8),
            "full_like": torch.full_like(plain, 3.0),
        }
        grad = torch.zeros(4, requires_grad=True)
        product = plain @ plain.T
        rnd = torch.randn(3)
        strided = torch.empty_like(plain.T)  # preserve_format of a non-contiguous tensor
        torch.zeros(3, out=out)
        t = torch.empty(W * 40000)  # above the one-shot threshold (2 ranks: 64 KiB): zero-copy
        t.copy_(_values(me, W * 40000, torch.float32))
        before = _counters(g)
        dist.all_reduce(t, group=g)
    after = torch.empty(5)
    refs = {
        "zeros": torch.zeros(3, 4), "ones": torch.ones(2, dtype=torch.int64),
        "full": torch.full((3,), 7), "full float": torch.full((2, 2), 1.5, dtype=torch.float64),
        "zeros_like": torch.zeros_like(plain),
        "ones_like": torch.ones_like(plain, dtype=torch.int8),
        "full_like": torch.full_like(plain, 3.0),
    }
    for name, x in made.items():
        chk.case(f"{name} symmetric", cuda_p2p.is_symmetric(x, g))
        if name in refs:
            r = refs[name]
            chk.case(f"{name} value", x.dtype == r.dtype and torch.equal(x, r), f"{x} vs {r}")
    chk.case("empty shape", made["empty tuple"].shape == (2, 3))
    chk.case("requires_grad", grad.requires_grad and cuda_p2p.is_symmetric(grad, g))
    chk.case("redirected count", mode.redirected == len(made) + 2, f"{mode.redirected}")
    for name, x in (("mm", product), ("randn", rnd), ("strided like", strided), ("out=", out),
                    ("after the block", after)):
        chk.case(f"{name} not symmetric", not cuda_p2p.is_symmetric(x, g))
    chk.case("strided like keeps strides", strided.stride() == plain.T.stride())
    chk.case("all_reduce of a context tensor",
             torch.equal(t, reduce_over_ranks(
                 "SUM", [_values(q, W * 40000, torch.float32) for q in range(W)])))
    _expect_zero_copy(chk, g, "all_reduce.zero_copy", before, "context all_reduce")
    # The dispatcher op runs the same workspace all-reduce.
    t.copy_(_values(me, W * 40000, torch.float32))
    before = _counters(g)
    cuda_p2p.all_reduce_(t, "max", g)
    chk.case("all_reduce_ MAX", torch.equal(
        t, torch.stack([_values(q, W * 40000, torch.float32) for q in range(W)]).amax(0)))
    _expect_zero_copy(chk, g, "all_reduce.zero_copy", before, "all_reduce_ op")
    return chk.failures


def test_use_symmetric_memory(world3):
    # 3 ranks: the all-reduce reads symmetric inputs in place from 3 ranks on (2 host ranks
    # stage it, NOTE [Zero-copy collectives])
    for failures in world3.run(_context_case):
        assert not failures, failures


def _two_groups_case(ctx):
    W, me = ctx.world_size, ctx.rank
    g1, g2 = cached_group("side_a"), cached_group("side_b")
    chk = Checker()
    n = 777
    a = _fill(cuda_p2p.empty(n, group=g1), me)
    b = _fill(cuda_p2p.empty(n, group=g2), me)
    chk.case("own heaps", cuda_p2p.is_symmetric(a, g1) and not cuda_p2p.is_symmetric(a, g2)
             and cuda_p2p.is_symmetric(b, g2) and not cuda_p2p.is_symmetric(b, g1))
    ref = torch.cat([_values(q, n, torch.float32) for q in range(W)])
    for grp, x, zc in ((g1, a, True), (g2, b, True), (g1, b, False), (g2, a, False)):
        out = torch.empty(W * n)
        before = _counters(grp)
        dist.all_gather_into_tensor(out, x, group=grp)
        chk.case(f"result zc={zc}", torch.equal(out, ref))
        _expect_zero_copy(chk, grp, "all_gather.zero_copy", before, f"counter zc={zc}", zc)
    return chk.failures


def test_two_groups_side_by_side(world3):
    for failures in world3.run(_two_groups_case):
        assert not failures, failures

