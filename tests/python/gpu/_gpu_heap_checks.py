"""The rank side of tests/python/gpu/test_gpu.py, continued: the symmetric heap on the GPU
(cuda_p2p.empty, use_symmetric_memory, zero-copy collectives, its limits) and one-sided windows
(each check returns {"cases", "failures"}; the groups and inputs: _gpu_checks.py)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import _gpu_checks
import cuda_p2p
from _checks import Checker
from _gpu_checks import (
    BUFFER,
    DTYPES,
    SIZES,
    ZERO_COPY_TIMEOUT,
    _close,
    _counters,
    _device,
    _group,
    _input,
    _seed,
    _small,
    _sync,
)
from _reference import reduce_over_ranks
from cuda_p2p import _C

# ---------------------------------------------------------------------------------------------
# rank side: the symmetric heap on the GPU (docs/collectives.md, "Zero-copy symmetric tensors";
# NOTE [Heap under a MemPool] in backend/symmetric_allocator.cpp)

HEAP = 64 << 20  # per rank: room for a few 20 MiB pool segments (4 ranks on one GPU: 256 MiB)


def _all_ranks(ctx, value):
    """Every rank's ``value``, in rank order (over the Gloo reference group)."""
    out = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=ctx.gloo)
    return out


def _settle(ctx):
    """Every rank's GPU work done and every rank here: peers may read, or writers go on."""
    torch.cuda.synchronize()
    dist.barrier(group=ctx.gloo)


def check_symmetric_tensors(ctx):
    """cuda_p2p.empty and use_symmetric_memory on the GPU: tensors in the heap at equal offsets,
    read by peers through their mappings, collectives on them (zero-copy, right results), and two
    groups with a heap and a pool each."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    # direct algorithms: were the pool's offsets to differ, the disagreeing ranks would run the
    # same signals (a ring would wait for its neighbour until the timeout)
    # Zero-copy on a GPU workspace is an opt-in (NOTE [CUDA zero-copy is opt-in]): the first run
    # after it became one (2026-11-27) found this check counting staged collectives.
    g = _group(("heap",), buffer_size=BUFFER, symmetric_heap_size=HEAP,
               timeout=ZERO_COPY_TIMEOUT, all_gather_algo="direct", reduce_scatter_algo="direct",
               zero_copy_agreement="signature")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk = Checker(f"symmetric tensors W={W}")
    chk.case("heap device", b.symmetric_device() == dev, f"{b.symmetric_device()}")
    # cuda_p2p.empty: "cuda" (the current device, the group's) and None (the heap's device).
    t = cuda_p2p.empty(1000, dtype=torch.float32, device="cuda", group=g)
    u = cuda_p2p.empty((3, 5), dtype=torch.int32, group=g)
    chk.case("empty device", t.device == dev and u.device == dev, f"{t.device} {u.device}")
    offs = [b.symmetric_offset(t), b.symmetric_offset(u)]
    every = _all_ranks(ctx, offs)
    chk.case("empty offsets", 0 <= offs[0] < offs[1] and all(o == offs for o in every), f"{every}")
    info = b.symmetric_heap_info()
    chk.case("heap info", info["created"] == 1 and info["capacity"] == HEAP, f"{info}")
    for bad in ("cpu", torch.device("cuda", dev.index + 1)):
        try:
            cuda_p2p.empty(4, device=bad, group=g)
            chk.case(f"device {bad} raises", False)
        except ValueError as e:
            chk.case(f"device {bad} message", f"expected device {dev}" in str(e), str(e))
    t.copy_(_input(1, rank, 1000, torch.float32).to(dev))
    _settle(ctx)
    for q in range(W):  # through this rank's IPC mapping of q's heap
        peer = b.symmetric_peer_tensor(t, q)
        chk.case(f"peer {q} reads", peer.device == dev and
                 torch.equal(peer.cpu(), _input(1, q, 1000, torch.float32)), "differs")
    _settle(ctx)

    # use_symmetric_memory: torch's own CUDA allocations come from the heap (the group's MemPool).
    pool = cuda_p2p.get_mem_pool(g)
    chk.case("pool cached", cuda_p2p.get_mem_pool(g) is pool)
    with cuda_p2p.use_symmetric_memory(g) as entered:
        x = torch.empty(4096, device=dev)  # 16 KiB: a 2 MiB segment
        y = torch.zeros(300000, device=dev)  # 1.2 MB: a 20 MiB segment
        x.copy_(_input(2, rank, 4096, torch.float32).to(dev))
        z = x * 2 + 1  # the output of an operation
    after = torch.empty(16, device=dev)
    chk.case("yields the pool", entered is pool)
    for name, v in (("empty", x), ("zeros", y), ("op output", z)):
        chk.case(f"{name} in the heap", v.device == dev and cuda_p2p.is_symmetric(v, g),
                 f"offset {b.symmetric_offset(v)}")
    chk.case("zeros", torch.count_nonzero(y).item() == 0, "not zero")
    chk.case("after the block", not cuda_p2p.is_symmetric(after, g), "in the heap")
    offs = [b.symmetric_offset(v) for v in (x, y, z)]
    every = _all_ranks(ctx, offs)
    chk.case("pool offsets equal", all(o == offs for o in every), f"{every}")
    _settle(ctx)
    for q in range(W):
        want = _input(2, q, 4096, torch.float32) * 2 + 1
        got = b.symmetric_peer_tensor(z, q).cpu()
        chk.case(f"pool peer {q}", torch.equal(got, want), "differs")
    _settle(ctx)
    info = b.symmetric_heap_info()
    chk.case("segments", info["segments"] >= 2 and info["segment_bytes"] >= 22 << 20, f"{info}")
    del x, y, z
    torch.cuda.synchronize()
    chk.case("the pool keeps dead tensors' segments",
             b.symmetric_heap_info()["segments"] == info["segments"], f"{b.symmetric_heap_info()}")

    # Collectives on heap tensors from the pool: right results, and zero-copy (signature
    # agreement: the ranks made the same allocations, so the pool's blocks sit at equal offsets;
    # were they not, every rank would raise a signature mismatch naming the offsets).
    b.reset_counters()
    n = 5000
    with cuda_p2p.use_symmetric_memory(g):
        ar = _input(3, rank, n, torch.float32).to(dev)
        ag_out = torch.empty(n * W, device=dev)
        rs_in = _input(4, rank, n * W, torch.float32).to(dev)
        rs_out = torch.empty(n, device=dev)
        bc = _input(5, rank, n, torch.float32).to(dev)
    chk.case("collective tensors in the heap", all(
        cuda_p2p.is_symmetric(v, g) for v in (ar, ag_out, rs_in, rs_out, bc)), "not all")
    dist.all_reduce(ar, group=g)
    dist.all_gather_into_tensor(ag_out, bc, group=g)
    dist.reduce_scatter_tensor(rs_out, rs_in, group=g)
    dist.broadcast(bc, src=0, group=g)
    torch.cuda.synchronize()
    chk.case("all_reduce", torch.equal(
        ar.cpu(), reduce_over_ranks("SUM", [_input(3, r, n, torch.float32) for r in range(W)])), "")
    chk.case("all_gather", torch.equal(
        ag_out.cpu(), torch.cat([_input(5, r, n, torch.float32) for r in range(W)])), "")
    full = reduce_over_ranks("SUM", [_input(4, r, n * W, torch.float32) for r in range(W)])
    chk.case("reduce_scatter", torch.equal(rs_out.cpu(), full[rank * n:(rank + 1) * n]), "")
    chk.case("broadcast", torch.equal(bc.cpu(), _input(5, 0, n, torch.float32)), "")
    c = _counters(g)
    zc = 1 if W > 1 else 0
    chk.case("on the workspace, zero-copy", c and not any(k.endswith(".wrapped") for k in c) and
             all(c.get(f"{k}.zero_copy", 0) == zc for k in ("all_gather", "reduce_scatter",
                                                            "broadcast")), f"{c}")

    # A second group: its own heap and pool, its tensors in neither of the other's.
    g2 = _group(("heap2",), buffer_size=BUFFER, symmetric_heap_size=HEAP)
    pool2 = cuda_p2p.get_mem_pool(g2)
    chk.case("a pool per group", pool2 is not pool and pool2.id != pool.id, f"{pool2.id}")
    with cuda_p2p.use_symmetric_memory(g2):
        w = torch.ones(100, device=dev)
    chk.case("own heaps", cuda_p2p.is_symmetric(w, g2) and not cuda_p2p.is_symmetric(w, g)
             and cuda_p2p.is_symmetric(t, g) and not cuda_p2p.is_symmetric(t, g2), "mixed")
    _settle(ctx)
    return chk.result()


def check_zero_copy_collectives(ctx):
    """Collectives on cuda_p2p.empty tensors read them where they lie, in their owners' heaps
    (NOTE [Zero-copy collectives] in ops/zero_copy.cpp) with signature agreement, an opt-in on
    CUDA (NOTE [CUDA zero-copy is opt-in] in ops/common.hpp); rehearsed on the CPU with it set
    too (the host's default is the exchange)."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    extra = {"zero_copy_agreement": "signature"}
    g = _group(("zc",), buffer_size=BUFFER, symmetric_heap_size=HEAP, all_reduce_algo="two_shot",
               timeout=ZERO_COPY_TIMEOUT, **extra)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    chk = Checker(f"zero-copy W={W}")
    mode = b.get_collective_config()["zero_copy_agreement"]
    chk.case("agreement", mode == "signature", mode)
    b.reset_counters()
    want = {"all_gather.zero_copy": 0, "reduce_scatter.zero_copy": 0, "all_reduce.zero_copy": 0,
            "broadcast.zero_copy": 0, "all_to_all_single.zero_copy": 0}
    zc = 1 if W > 1 else 0

    def heap(n, dtype, values=None):
        t = cuda_p2p.empty(n, dtype=dtype, group=g)
        return t.copy_(values.to(dev)) if values is not None else t.zero_()

    for name, dtype in DTYPES.items():
        for n in SIZES[1:]:
            tag = f"{name} n={n}"
            ref = torch.cat([_input(n, r, n, dtype) for r in range(W)])
            x = heap(n, dtype, _input(n, rank, n, dtype))
            out = torch.empty(n * W, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x, group=g)
            # The caller may overwrite its input as soon as the call returns: on CUDA that is in
            # stream order after the peers' reads (step 5 of the NOTE), so they gathered x.
            x.fill_(0)
            chk.case(f"all_gather {tag}", torch.equal(out.cpu(), ref), "differs")
            whole = heap(n * W, dtype)
            whole[rank * n:(rank + 1) * n].copy_(_input(n, rank, n, dtype).to(dev))
            dist.all_gather_into_tensor(whole, whole[rank * n:(rank + 1) * n], group=g)
            chk.case(f"in-place all_gather {tag}", torch.equal(whole.cpu(), ref), "differs")
            want["all_gather.zero_copy"] += 2 * zc
            rin = heap(n * W, dtype, _input(n + 1, rank, n * W, dtype))
            rout = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(rout, rin, group=g)
            full = reduce_over_ranks("SUM", [_input(n + 1, r, n * W, dtype) for r in range(W)])
            chk.case(f"reduce_scatter {tag}", _close(rout, full[rank * n:(rank + 1) * n], "SUM"),
                     "differs")
            want["reduce_scatter.zero_copy"] += zc
            t = heap(n, dtype, _input(n + 2, rank, n, dtype))
            dist.all_reduce(t, group=g)
            chk.case(f"all_reduce {tag}", _close(t, reduce_over_ranks(
                "SUM", [_input(n + 2, r, n, dtype) for r in range(W)]), "SUM"), "differs")
            # (a host workspace with 2 ranks stages it: measured slower, NOTE [Zero-copy
            # collectives])
            want["all_reduce.zero_copy"] += zc * (not _gpu_checks._ON_CPU or W > 2)
            for root in range(W):
                bc = heap(n, dtype, _input(n + 3, rank, n, dtype))
                dist.broadcast(bc, src=root, group=g)
                chk.case(f"broadcast {tag} root={root}",
                         torch.equal(bc.cpu(), _input(n + 3, root, n, dtype)), "differs")
                # one staged round at most (half the buffer) goes zero-copy
                want["broadcast.zero_copy"] += zc * (n * bc.element_size() <= BUFFER // 2)
            # The all-to-all reads each sender's slices in its heap (NOTE [All-to-all zero-copy]);
            # the input is overwritten right after the call, as above.
            a2a = heap(n * W, dtype, torch.cat([_input(n + 4, rank * W + d, n, dtype)
                                                for d in range(W)]))
            a2a_out = torch.empty(n * W, dtype=dtype, device=dev)
            dist.all_to_all_single(a2a_out, a2a, group=g)
            a2a.fill_(0)
            chk.case(f"all_to_all_single {tag}", torch.equal(a2a_out.cpu(), torch.cat(
                [_input(n + 4, s * W + rank, n, dtype) for s in range(W)])), "differs")
            want["all_to_all_single.zero_copy"] += zc
    _sync()
    c = _counters(g)
    chk.case("counters", all(c.get(k, 0) == v for k, v in want.items()) and
             not any(k.endswith(".wrapped") for k in c), f"expected {want}, got {c}")
    # fused_all_gather_matmul with A_shard in the heap: the pulls read the peers' shards there
    # (NOTE [Zero-copy all-gather→matmul]); a middle gather dim prepares a copy, staged.
    b.reset_counters()
    fused_zc = 0
    for name, dtype in DTYPES.items():
        for shard, gd, zc_case in (((8, 16), 0, True), ((4, 2, 8), -1, True),
                                   ((2, 5, 16), 1, False)):
            for algorithm in ("pipeline", "pull_ahead"):
                seed = _seed(shard, gd, algorithm)
                shards = [_small(shard, seed + r, dtype, "cpu") for r in range(W)]
                A = torch.cat(shards, dim=gd)
                B = _small((A.shape[-1], 7), seed + 100, dtype, "cpu")
                a = cuda_p2p.empty(*shard, dtype=dtype, group=g).copy_(shards[rank].to(dev))
                got_A, [out] = cuda_p2p.fused_all_gather_matmul(a, [B.to(dev)], gd, group=g,
                                                                return_A=True, algorithm=algorithm)
                a.fill_(0)  # in stream order after the peers' pulls (the closing barrier)
                what = f"fused {name} shard={shard} dim={gd} {algorithm}"
                chk.case(what, torch.equal(got_A.cpu(), A), "A differs")
                chk.case(f"{what} out", torch.equal(out.cpu(), (A.double() @ B.double()).to(dtype)),
                         "out differs")
                fused_zc += zc * zc_case
    _sync()
    got = _counters(g).get("fused_all_gather_matmul.zero_copy", 0)
    chk.case("fused counter", got == fused_zc, f"expected {fused_zc}, got {_counters(g)}")
    # Ordinary tensors on the same group: staged, no claim, nothing raised.
    b.reset_counters()
    x = _input(9, rank, 1000, torch.float32).to(dev)
    out = torch.empty(1000 * W, device=dev)
    dist.all_gather_into_tensor(out, x, group=g)
    _sync()
    chk.case("ordinary input", torch.equal(out.cpu(), torch.cat(
        [_input(9, r, 1000, torch.float32) for r in range(W)])), "differs")
    chk.case("ordinary input staged", _counters(g).get("all_gather.zero_copy", 0) == 0,
             f"{_counters(g)}")
    _sync()
    dist.barrier(group=ctx.gloo)  # every rank's reads done before its heap tensors die
    return chk.result()


def check_zero_copy_mismatch(ctx):
    """Ranks that claim differently (one rank's input outside its heap) disagree in the op's
    signature (NOTE [Zero-copy collectives], step 3'): on the host the op raises on every rank and
    the group works again; on CUDA the comparison kernel records it, the op's data phase has run
    on mismatched arguments, and the group's device fails with the disagreement, naming both
    claims (docs/collectives.md, "recreate the group"): every later op of the group raises it, and
    a new group works. The first GPU run of this case (2026-12-04, W = 2-4) recorded and raised
    the disagreement as designed; the check's old expectation, a usable group after it, was the
    host's."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    extra = {"zero_copy_agreement": "signature"}  # opt-in on CUDA too
    # The direct all-gather of one round runs one barrier and ends one phase, as the zero-copy
    # path does, so on CUDA the disagreeing ranks wait for nothing the other never sends (a ring,
    # auto's choice on 3+ ranks at this size, would wait for its neighbour's signal until the
    # timeout).
    g = _group(("zc_mismatch",), buffer_size=BUFFER, symmetric_heap_size=HEAP,
               all_gather_algo="direct", timeout=ZERO_COPY_TIMEOUT, **extra)
    chk = Checker(f"zero-copy mismatch W={W}")
    n = 1000  # 4000 bytes: one round (half the buffer)
    in_heap = cuda_p2p.empty(n, dtype=torch.float32, group=g)  # every rank: creates the heap
    x = (torch.empty(n, device=dev) if rank == 0 else in_heap).copy_(
        _input(1, rank, n, torch.float32))
    out = torch.empty(n * W, device=dev)
    raised = None
    try:
        dist.all_gather_into_tensor(out, x, group=g)
        _sync()
        dist.all_gather_into_tensor(out, x.clone(), group=g)  # ordinary: staged by every rank
    except RuntimeError as e:
        raised = str(e)
    if W == 1:
        chk.case("one rank: nothing to disagree on", raised is None, f"{raised}")
    else:
        chk.case("raised", raised is not None and "disagree" in raised and
                 "zero-copy: input at heap offset" in raised, f"{raised}")
    want = torch.cat([_input(1, r, n, torch.float32) for r in range(W)])
    after = None
    try:
        _sync()
        dist.all_gather_into_tensor(out, x.clone(), group=g)
        _sync()
    except RuntimeError as e:
        after = str(e)
    if W == 1 or dev.type == "cpu":
        chk.case("usable after", after is None and torch.equal(out.cpu(), want), f"{after}")
    else:
        chk.case("the failed group raises after", after is not None and "disagree" in after,
                 f"{after}")
        dist.barrier(group=ctx.gloo)
        fresh = _group(("zc_mismatch_after",), buffer_size=BUFFER, all_gather_algo="direct",
                       timeout=ZERO_COPY_TIMEOUT)
        out.zero_()
        dist.all_gather_into_tensor(out, x.clone(), group=fresh)
        _sync()
        chk.case("a new group works", torch.equal(out.cpu(), want), "differs")
    dist.barrier(group=ctx.gloo)
    return chk.result()


def check_symmetric_heap_limits(ctx):
    """A full heap is an OutOfMemoryError naming the knobs (cuda_p2p.empty: RuntimeError), a heap
    larger than the GPU fails on every rank at once, and destroying the group frees its heap."""
    import gc

    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"heap limits W={W}")
    g = _group(("heap_small",), buffer_size=BUFFER, symmetric_heap_size=32 << 20)
    b = cuda_p2p.get_cuda_p2p_backend(g)
    try:
        cuda_p2p.empty(40 << 20, dtype=torch.uint8, device=dev, group=g)
        chk.case("empty beyond the heap raises", False)
    except RuntimeError as e:
        chk.case("empty full message", "symmetric heap is full" in str(e), str(e))
    with cuda_p2p.use_symmetric_memory(g):
        a = torch.empty(4 << 20, dtype=torch.uint8, device=dev)  # a 20 MiB segment
        try:
            # 18 MiB: more than the 16 MiB left in a's segment, so a new 18 MiB segment, and
            # 12 MiB of the heap are free.
            torch.empty(18 << 20, dtype=torch.uint8, device=dev)
            chk.case("pool beyond the heap raises", False)
        except torch.OutOfMemoryError as e:
            msg = str(e)
            chk.case("pool full message", "symmetric heap is full" in msg and
                     "CUDA_P2P_SYMMETRIC_HEAP_SIZE" in msg and "symmetric_heap_size" in msg, msg)
        d = torch.ones(1 << 20, dtype=torch.uint8, device=dev)
    chk.case("the pool works on", cuda_p2p.is_symmetric(a, g) and cuda_p2p.is_symmetric(d, g)
             and d.sum().item() == 1 << 20, f"{b.symmetric_heap_info()}")
    del a, d

    # 64 TiB per rank: no GPU has it; every rank raises, nobody waits for a timeout.
    huge = _group(("heap_huge",), buffer_size=BUFFER, symmetric_heap_size=1 << 46)
    t0 = time.monotonic()
    try:
        cuda_p2p.empty(8, device=dev, group=huge)
        chk.case("huge heap raises", False)
    except torch.OutOfMemoryError as e:
        msg = str(e)
        chk.case("huge heap message", "could not create the group's symmetric heap" in msg and
                 "committed device memory" in msg and "CUDA_P2P_SYMMETRIC_HEAP_SIZE" in msg, msg)
    chk.case("huge heap fast", time.monotonic() - t0 < 60, f"{time.monotonic() - t0:.1f} s")
    x = torch.ones(10, device=dev)
    dist.all_reduce(x, group=huge)
    chk.case("usable after", torch.equal(x.cpu(), torch.full((10,), float(W))), f"{x}")

    # Destroying a group frees its heap: its cuda_p2p.empty block and its pool's segments.
    size = 256 << 20
    n_dev = torch.cuda.device_count()
    sharing = sum(1 for r in range(W) if r % n_dev == rank % n_dev)  # ranks on this GPU
    _settle(ctx)
    free0 = torch.cuda.mem_get_info(dev)[0]
    g3 = _group(("heap_freed",), cached=False, buffer_size=BUFFER, symmetric_heap_size=size)
    t = cuda_p2p.empty(1 << 20, dtype=torch.uint8, device=dev, group=g3)
    with cuda_p2p.use_symmetric_memory(g3):
        y = torch.ones(1 << 20, device=dev)
    _settle(ctx)
    free1 = torch.cuda.mem_get_info(dev)[0]
    chk.case("committed", free0 - free1 >= sharing * size, f"{free0 - free1} bytes")
    del t, y
    dist.destroy_process_group(g3)
    del g3
    gc.collect()
    _settle(ctx)
    free2 = torch.cuda.mem_get_info(dev)[0]
    chk.case("freed with the group", free2 - free1 >= sharing * size * 9 // 10,
             f"{free2 - free1} bytes back of {sharing * size}")
    return chk.result()


def check_windows(ctx):
    """One-sided windows (docs/windows.md) on the group's workspace device: a ring of puts into
    a registered copy, an all-to-all into a heap tensor registered in place, many puts then one
    signal, Work.wait() ordering the caller's stream, map_remote_tensor reads of every peer, a
    put that does not fit (nothing written), deregistration. Skipped where torch has no windows."""
    W, rank, dev = ctx.world_size, ctx.rank, _device()
    chk = Checker(f"windows W={W} on {dev.type}")
    if not _C._build_info().get("windows", False):
        chk.case("skipped: no windows in this torch", True)
        return chk.result()
    g = _group(("windows",), buffer_size=BUFFER, symmetric_heap_size=HEAP)
    cuda_p2p.get_cuda_p2p_backend(g).reset_counters()
    right, left = (rank + 1) % W, (rank - 1) % W
    chk.case("supports_window", g.supports_window, "")

    def msg(src, dst, n, seed=0):
        return (torch.arange(n, dtype=torch.float32) + src * 1000 + dst * 100 + seed * 10000)

    n = 300
    z = torch.zeros(W * n, device=dev)  # an ordinary tensor: its storage moves into the heap
    win = dist._new_window(z, group=g)
    src = msg(rank, right, n).to(dev)
    work = win.put(src, right, n, True)
    work.wait()  # the caller's stream is ordered after the put
    win.signal(right, True)
    win.wait_signal(left, True).wait()
    got = win.map_remote_tensor(rank)
    chk.case("remote tensor device", got.device == dev, f"{got.device}")
    want = torch.zeros(W * n)
    want[n:2 * n] = msg(left, rank, n)
    chk.case("ring", torch.equal(got.cpu(), want), "differs")
    chk.case("ring: in the tensor itself", torch.equal(z.cpu(), want) and
             z.data_ptr() == got.data_ptr(), "differs")
    _sync()
    dist.barrier(group=ctx.gloo)
    # Many puts then one signal: the peer's one wait sees every one of them.
    srcs = [msg(rank, right, 10, seed=i).to(dev) for i in range(8)]
    for i, s in enumerate(srcs):
        win.put(s, right, i * 10, False)
    win.signal(right, False)
    win.wait_signal(left, False)
    want = torch.cat([msg(left, rank, 10, seed=i) for i in range(8)])
    chk.case("many puts, one signal", torch.equal(got[:80].cpu(), want), "differs")
    err = None
    try:
        win.put(torch.ones(W * n + 1, device=dev), right, 0, False)
    except (RuntimeError, ValueError) as e:
        err = str(e)
    chk.case("too large", err is not None and "nothing was written" in err, f"{err!r}")
    _sync()
    dist.barrier(group=ctx.gloo)
    win.tensor_deregister()
    # In place: a heap tensor; every rank puts its slot into every rank.
    t = cuda_p2p.empty(W, 16, device=dev, group=g)
    t.zero_()
    win.tensor_register(t)
    for q in range(W):
        win.put(msg(rank, q, 16, seed=3).to(dev), q, rank * 16, False)
        win.signal(q, False)
    for q in range(W):
        win.wait_signal(q, False)
    _sync()
    want = torch.stack([msg(q, rank, 16, seed=3) for q in range(W)])
    chk.case("all-to-all zero-copy", torch.equal(t.cpu(), want), "differs")
    dist.barrier(group=ctx.gloo)
    for q in range(W):
        want_q = torch.stack([msg(p, q, 16, seed=3) for p in range(W)])
        chk.case(f"map_remote_tensor({q})", torch.equal(win.map_remote_tensor(q).cpu(), want_q),
                 "differs")
    _sync()
    dist.barrier(group=ctx.gloo)
    win.tensor_deregister()
    c = _counters(g)
    chk.case("counters", c.get("window.put", 0) == 1 + 8 + W and
             c.get("window.register_in_place") == 1 and c.get("window.register_moved") == 1,
             f"{c}")
    return chk.result()
