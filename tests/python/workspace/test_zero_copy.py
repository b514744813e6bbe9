"""Zero-copy symmetric tensors (issue 15.1): cuda_p2p.empty, use_symmetric_memory, and the
collectives that read symmetric inputs from their owners' heaps instead of staging them.

Results are compared with plain-torch math over every rank's inputs (computed locally, exact for
the small integers used) and, for float32, with a Gloo group over the same ranks; the counters
say whether the zero-copy path ran. The heap's allocator has unit tests of its own.
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

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8)
# 1 and odd sizes, and one whose reduce-scatter chunk spans several 256 KiB reduction pieces.
SIZES = (1, 7, 4099)
LARGE = 3 * (256 << 10) // 4 + 5


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


def _collectives_case(ctx, agreement):
    """Every zero-copy collective against plain-torch math. ``agreement``: the group's
    zero_copy_agreement ("exchange", the host's default, or "signature", CUDA's: the same code the
    GPU runs, NOTE [Zero-copy collectives])."""
    W, me = ctx.world_size, ctx.rank
    g = cached_group(f"zc_{agreement}", zero_copy_agreement=agreement)
    signature = agreement == "signature"
    chk = Checker()
    chk.case("mode reported", cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()[
        "zero_copy_agreement"] == agreement)
    for dtype in DTYPES:
        for n in SIZES:
            tag = f"{dtype} n={n}"
            # all_gather_into_tensor from a heap input
            inp = _fill(cuda_p2p.empty(n, dtype=dtype, group=g), me)
            out = torch.full((W * n,), 99, dtype=dtype)
            before = _counters(g)
            dist.all_gather_into_tensor(out, inp, group=g)
            ref = torch.cat([_values(q, n, dtype) for q in range(W)])
            chk.case(f"all_gather_into_tensor {tag}", torch.equal(out, ref))
            _expect_zero_copy(chk, g, "all_gather.zero_copy", before, f"ag counter {tag}")
            chk.case(f"input intact {tag}", torch.equal(inp, _values(me, n, dtype)))
            # in place: the input is this rank's chunk of a heap output (offsets differ by rank)
            whole = cuda_p2p.empty(W * n, dtype=dtype, group=g).fill_(0)
            _fill(whole[me * n:(me + 1) * n], me)
            before = _counters(g)
            dist.all_gather_into_tensor(whole, whole[me * n:(me + 1) * n], group=g)
            chk.case(f"in-place all_gather {tag}", torch.equal(whole, ref))
            _expect_zero_copy(chk, g, "all_gather.zero_copy", before, f"in-place ag {tag}")
            # all_gather (a list of outputs)
            outs = [torch.empty(n, dtype=dtype) for _ in range(W)]
            dist.all_gather(outs, inp, group=g)
            chk.case(f"all_gather {tag}", torch.equal(torch.cat(outs), ref))
            # all_gather_v: rows of 3 elements, a different count per rank (rank 1 has none),
            # then the same with this rank's input outside the heap on one rank (staged); it
            # never claims under signature agreement, so it stages there
            rows = [(n + q) % 5 if q != 1 else 0 for q in range(W)]
            want_v = torch.cat([_values(q, rows[q] * 3, dtype).view(-1, 3) for q in range(W)])
            # (signature: ranks that allocate differently would get different offsets later)
            for plain in (None,) if signature else (None, 0):
                if me == plain:
                    v_in = _fill(torch.empty(rows[me], 3, dtype=dtype), me)
                else:
                    v_in = _fill(cuda_p2p.empty(rows[me], 3, dtype=dtype, group=g), me)
                before = _counters(g)
                got_v = cuda_p2p.all_gather_v(v_in, rows, group=g)
                chk.case(f"all_gather_v {tag} plain={plain}", torch.equal(got_v, want_v),
                         f"{got_v.flatten()[:8]} vs {want_v.flatten()[:8]}")
                _expect_zero_copy(chk, g, "all_gather_v.zero_copy", before,
                                  f"agv counter {tag} plain={plain}",
                                  plain is None and sum(rows) > 0 and not signature)
            # reduce_scatter_tensor
            rin = _fill(cuda_p2p.empty(W * n, dtype=dtype, group=g), me, seed=1)
            rout = torch.full((n,), 99, dtype=dtype)
            before = _counters(g)
            dist.reduce_scatter_tensor(rout, rin, group=g)
            full = reduce_over_ranks("SUM", [_values(q, W * n, dtype, seed=1) for q in range(W)])
            chk.case(f"reduce_scatter_tensor {tag}", torch.equal(rout, full[me * n:(me + 1) * n]),
                     f"{rout[:8]} vs {full[me * n:me * n + 8]}")
            _expect_zero_copy(chk, g, "reduce_scatter.zero_copy", before, f"rs counter {tag}")
            # reduce_scatter (a list of chunks, each its own heap tensor), MAX
            chunks = [_fill(cuda_p2p.empty(n, dtype=dtype, group=g), me, seed=10 + c)
                      for c in range(W)]
            before = _counters(g)
            dist.reduce_scatter(rout, chunks, op=dist.ReduceOp.MAX, group=g)
            mx = torch.stack([_values(q, n, dtype, seed=10 + me) for q in range(W)]).amax(0)
            chk.case(f"reduce_scatter MAX {tag}", torch.equal(rout, mx))
            _expect_zero_copy(chk, g, "reduce_scatter.zero_copy", before, f"rs list {tag}")
            # all_reduce in place (zero-copy runs where auto picks two-shot: above the default
            # all_reduce_one_shot_max_bytes, 64 KiB on 2 ranks, else 8 KiB; and on 3+ ranks: a
            # host workspace with 2 ranks stages it, measured slower)
            one_shot_max = (64 << 10) if W == 2 else (8 << 10)
            m = n * (64 if W == 2 else 8)
            t = _fill(cuda_p2p.empty(m, dtype=dtype, group=g), me, seed=2)
            before = _counters(g)
            dist.all_reduce(t, group=g)
            want = reduce_over_ranks("SUM", [_values(q, m, dtype, seed=2) for q in range(W)])
            chk.case(f"all_reduce {tag}", torch.equal(t, want))
            big = m * t.element_size() > one_shot_max
            _expect_zero_copy(chk, g, "all_reduce.zero_copy", before, f"ar counter {tag}",
                              big and W > 2)
            # broadcast: the root's tensor in its heap decides; the others' may be anything
            # (exchange) or sit at the root's offset (signature)
            for root in range(W):
                if me == root:
                    b = _fill(cuda_p2p.empty(n, dtype=dtype, group=g), root, seed=5)
                else:
                    b = (cuda_p2p.empty(n, dtype=dtype, group=g) if me % 2 or signature else
                         torch.empty(n, dtype=dtype)).fill_(99)
                before = _counters(g)
                dist.broadcast(b, src=root, group=g)
                chk.case(f"broadcast root {root} {tag}", torch.equal(b, _values(root, n, dtype, 5)))
                _expect_zero_copy(chk, g, "broadcast.zero_copy", before, f"bc {root} {tag}")
    # float32 against Gloo, and a reduce-scatter chunk of several reduction pieces
    x = _fill(cuda_p2p.empty(W * LARGE, dtype=torch.float32, group=g), me, seed=3)
    y = x.clone()
    o1, o2 = torch.empty(LARGE), torch.empty(LARGE)
    dist.reduce_scatter_tensor(o1, x, group=g)
    dist.reduce_scatter_tensor(o2, y, group=ctx.gloo)
    chk.case("reduce_scatter vs gloo", torch.equal(o1, o2))
    dist.all_reduce(x, op=dist.ReduceOp.AVG, group=g)
    ref = y.clone()
    dist.all_reduce(ref, group=ctx.gloo)
    chk.case("all_reduce AVG vs gloo", torch.allclose(x, ref / W))
    return chk.failures


@pytest.mark.parametrize("agreement", ["exchange", "signature"])
def test_zero_copy_collectives(any_world, agreement):
    for failures in any_world.run(_collectives_case, agreement):
        assert not failures, failures


def _fallback_case(ctx):
    W, me = ctx.world_size, ctx.rank
    g = cached_group("zc")
    chk = Checker()
    n = 1001
    ref = torch.cat([_values(q, n, torch.float32) for q in range(W)])
    # Ranks allocating in different orders: different offsets, each rank publishes its own.
    pad = cuda_p2p.empty(64 * (me + 1), dtype=torch.uint8, group=g) if me % 2 else None
    inp = _fill(cuda_p2p.empty(n, group=g), me)
    offs = [None] * W
    dist.all_gather_object(offs, cuda_p2p.get_cuda_p2p_backend(g).symmetric_offset(inp),
                           group=ctx.gloo)
    chk.case("offsets differ", len(set(offs)) > 1, f"{offs}")
    out = torch.empty(W * n)
    before = _counters(g)
    dist.all_gather_into_tensor(out, inp, group=g)
    chk.case("different offsets: result", torch.equal(out, ref))
    _expect_zero_copy(chk, g, "all_gather.zero_copy", before, "different offsets")
    del pad
    # One rank's input is an ordinary tensor: every rank stages.
    for odd_one in range(W):
        x = _fill(torch.empty(n) if me == odd_one else cuda_p2p.empty(n, group=g), me)
        before = _counters(g)
        out.fill_(0)
        dist.all_gather_into_tensor(out, x, group=g)
        chk.case(f"rank {odd_one} staged: ag", torch.equal(out, ref))
        _expect_zero_copy(chk, g, "all_gather.zero_copy", before, f"ag odd {odd_one}", False)
        big = _fill(torch.empty(W * n) if me == odd_one else cuda_p2p.empty(W * n, group=g), me, 4)
        r = torch.empty(n)
        dist.reduce_scatter_tensor(r, big, group=g)
        full = reduce_over_ranks("SUM", [_values(q, W * n, torch.float32, 4) for q in range(W)])
        chk.case(f"rank {odd_one} staged: rs", torch.equal(r, full[me * n:(me + 1) * n]))
        _expect_zero_copy(chk, g, "reduce_scatter.zero_copy", before, f"rs odd {odd_one}", False)
        dist.all_reduce(big, group=g)
        chk.case(f"rank {odd_one} staged: ar", torch.equal(big, full))
        _expect_zero_copy(chk, g, "all_reduce.zero_copy", before, f"ar odd {odd_one}", False)
    # A broadcast root with an ordinary tensor: every rank stages, whatever the others hold.
    for root in range(W):
        b = _fill(torch.empty(n), root, 6) if me == root else cuda_p2p.empty(n, group=g).fill_(0)
        before = _counters(g)
        dist.broadcast(b, src=root, group=g)
        chk.case(f"root {root} staged: bc", torch.equal(b, _values(root, n, torch.float32, 6)))
        _expect_zero_copy(chk, g, "broadcast.zero_copy", before, f"bc staged {root}", False)
    # A root tensor in the heap but larger than one staged round (chunk_bytes, 1 MiB): staged,
    # whose rounds keep every core busy (NOTE [Zero-copy collectives]).
    m = (1 << 20) // 4 + 3
    for root in range(W):
        b = _fill(cuda_p2p.empty(m, group=g), root, 7) if me == root else torch.zeros(m)
        before = _counters(g)
        dist.broadcast(b, src=root, group=g)
        chk.case(f"root {root} large: bc", torch.equal(b, _values(root, m, torch.float32, 7)))
        _expect_zero_copy(chk, g, "broadcast.zero_copy", before, f"bc large {root}", False)
    # All ordinary tensors on a group with a heap: staged, correct.
    before = _counters(g)
    x = _fill(torch.empty(n), me)
    dist.all_gather_into_tensor(out, x, group=g)
    chk.case("plain tensors: ag", torch.equal(out, ref))
    chk.case("plain tensors: counter", _counters(g).get("all_gather.zero_copy", 0)
             == before.get("all_gather.zero_copy", 0))
    # A mismatched size still raises on every rank, and the group stays usable.
    y = cuda_p2p.empty(n + (me == 0), group=g)
    try:
        dist.all_gather_into_tensor(torch.empty(W * y.numel()), y, group=g)
        chk.case("mismatch raises", False, "no error")
    except RuntimeError as e:
        chk.case("mismatch message", "disagree" in str(e) or "rank" in str(e), str(e))
    dist.all_gather_into_tensor(out, inp, group=g)
    chk.case("usable after mismatch", torch.equal(out, ref))
    return chk.failures


def test_fallback_and_offsets(any_world):
    for failures in any_world.run(_fallback_case):
        assert not failures, failures


def _raises_everywhere(chk, what, fn, *needles):
    """fn() must raise on this rank (every rank runs it) with every needle in the message."""
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        chk.case(f"{what}: message", all(n in text for n in needles), text)
        return
    chk.case(what, False, "no error")


def _signature_case(ctx):
    """Signature agreement's contract (NOTE [Zero-copy collectives], steps 1'-3'): ranks that
    claim differently raise a signature mismatch on every rank, the group stays usable, ordinary
    inputs stage with no claim, and an explicit setting that differs between ranks is named."""
    W, me = ctx.world_size, ctx.rank
    g = cached_group("zc_signature", zero_copy_agreement="signature")
    chk = Checker()
    n = 1001
    ref = torch.cat([_values(q, n, torch.float32) for q in range(W)])
    out = torch.empty(W * n)
    # Offsets that differ (odd ranks allocated a pad first): a mismatch naming the offsets.
    pad = cuda_p2p.empty(64 * (me + 1), dtype=torch.uint8, group=g) if me % 2 else None
    inp = _fill(cuda_p2p.empty(n, group=g), me)
    _raises_everywhere(chk, "different offsets", lambda: dist.all_gather_into_tensor(
        out, inp, group=g), "zero-copy: input at heap offset", "disagree")
    del pad, inp
    inp = _fill(cuda_p2p.empty(n, group=g), me)  # the same offset on every rank now
    offs = [None] * W
    dist.all_gather_object(offs, cuda_p2p.get_cuda_p2p_backend(g).symmetric_offset(inp),
                           group=ctx.gloo)
    chk.case("offsets equal", len(set(offs)) == 1, f"{offs}")
    before = _counters(g)
    dist.all_gather_into_tensor(out, inp, group=g)
    chk.case("usable after mismatch", torch.equal(out, ref))
    _expect_zero_copy(chk, g, "all_gather.zero_copy", before, "equal offsets")
    # One rank's input outside its heap: every rank raises, for each collective.
    for odd_one in range(W):
        x = _fill(torch.empty(n) if me == odd_one else cuda_p2p.empty(n, group=g), me)
        _raises_everywhere(chk, f"ag odd {odd_one}", lambda: dist.all_gather_into_tensor(
            out, x, group=g), "zero-copy", "disagree")
        big = _fill(torch.empty(W * n) if me == odd_one else cuda_p2p.empty(W * n, group=g), me)
        _raises_everywhere(chk, f"rs odd {odd_one}", lambda: dist.reduce_scatter_tensor(
            torch.empty(n), big, group=g), "zero-copy", "disagree")
        m = 1 << 16  # 256 KiB: two-shot on every world size
        t = _fill(torch.empty(m) if me == odd_one else cuda_p2p.empty(m, group=g), me)
        if W == 2:  # never claimed on 2 host ranks (it stages): no disagreement
            dist.all_reduce(t, group=g)
            chk.case(f"ar odd {odd_one} (2 ranks)", torch.equal(
                t, reduce_over_ranks("SUM", [_values(q, m, torch.float32) for q in range(W)])))
        else:
            # (pyflakes takes the `del t` below for a use before the call: noqa.)
            _raises_everywhere(chk, f"ar odd {odd_one}",
                               lambda: dist.all_reduce(t, group=g),  # noqa: F821
                               "zero-copy", "disagree")
        b = torch.zeros(n) if me == odd_one else cuda_p2p.empty(n, group=g).fill_(0)
        _raises_everywhere(chk, f"bc odd {odd_one}", lambda: dist.broadcast(
            b, src=(odd_one + 1) % W, group=g), "zero-copy", "disagree")
        del x, big, t, b
    # Ordinary inputs on a group with a heap: nobody claims, every rank stages, no error.
    before = _counters(g)
    x = _fill(torch.empty(n), me)
    dist.all_gather_into_tensor(out, x, group=g)
    chk.case("plain tensors: ag", torch.equal(out, ref))
    big = _fill(torch.empty(W * n), me, 4)
    r = torch.empty(n)
    dist.reduce_scatter_tensor(r, big, group=g)
    full = reduce_over_ranks("SUM", [_values(q, W * n, torch.float32, 4) for q in range(W)])
    chk.case("plain tensors: rs", torch.equal(r, full[me * n:(me + 1) * n]))
    after = _counters(g)
    chk.case("plain tensors: no zero-copy", all(after.get(k, 0) == before.get(k, 0) for k in (
        "all_gather.zero_copy", "reduce_scatter.zero_copy")), f"{before} -> {after}")
    # A broadcast larger than one staged round never claims: mixed tensors are fine.
    m = (1 << 20) // 4 + 3
    b = _fill(cuda_p2p.empty(m, group=g), 0, 7) if me == 0 else torch.zeros(m)
    before = _counters(g)
    dist.broadcast(b, src=0, group=g)
    chk.case("large bc", torch.equal(b, _values(0, m, torch.float32, 7)))
    _expect_zero_copy(chk, g, "broadcast.zero_copy", before, "large bc", False)
    # The settings themselves: on a group with a heap, a rank that asks for signature among ranks
    # that exchange is named in the mismatch (their phases would differ); without a heap the
    # setting changes nothing, and is not compared.
    mixed = cached_group("zc_mixed", zero_copy_agreement="signature" if me == 0 else "auto")
    y = _fill(torch.empty(n), me)
    dist.all_gather_into_tensor(out, y, group=mixed)
    chk.case("mixed settings, no heap", torch.equal(out, ref))
    cuda_p2p.empty(1, group=mixed)  # creates its heap
    _raises_everywhere(chk, "mixed settings", lambda: dist.all_gather_into_tensor(
        out, y, group=mixed), "zero_copy_agreement signature")
    # The hint in a zero-copy disagreement says what to do.
    x = _fill(torch.empty(n) if me == 0 else cuda_p2p.empty(n, group=g), me)
    _raises_everywhere(chk, "hint", lambda: dist.all_gather_into_tensor(out, x, group=g),
                       "allocate the op's symmetric inputs alike on every rank", "'off'")
    return chk.failures


def _off_case(ctx):
    """zero_copy_agreement="off": symmetric inputs stage like any other (no zero-copy counter, no
    claim, mixed heap and ordinary inputs fine), results as ever."""
    W, me = ctx.world_size, ctx.rank
    g = cached_group("zc_off", zero_copy_agreement="off")
    chk = Checker()
    chk.case("mode reported",
             cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()["zero_copy_agreement"]
             == "off")
    n = 3001
    ref = torch.cat([_values(q, n, torch.float32) for q in range(W)])
    out = torch.empty(W * n)
    for odd_one in (None, 0):
        x = _fill(torch.empty(n) if me == odd_one else cuda_p2p.empty(n, group=g), me)
        big = _fill(cuda_p2p.empty(W * n, group=g), me, 4)
        m = 1 << 16
        t = _fill(cuda_p2p.empty(m, group=g), me, 2)
        b = _fill(cuda_p2p.empty(n, group=g), me, 6)
        before = _counters(g)
        dist.all_gather_into_tensor(out, x, group=g)
        chk.case(f"ag {odd_one}", torch.equal(out, ref))
        r = torch.empty(n)
        dist.reduce_scatter_tensor(r, big, group=g)
        full = reduce_over_ranks("SUM", [_values(q, W * n, torch.float32, 4) for q in range(W)])
        chk.case(f"rs {odd_one}", torch.equal(r, full[me * n:(me + 1) * n]))
        dist.all_reduce(t, group=g)
        want = reduce_over_ranks("SUM", [_values(q, m, torch.float32, 2) for q in range(W)])
        chk.case(f"ar {odd_one}", torch.equal(t, want))
        dist.broadcast(b, src=W - 1, group=g)
        chk.case(f"bc {odd_one}", torch.equal(b, _values(W - 1, n, torch.float32, 6)))
        A = _fill(cuda_p2p.empty(4, 6, group=g), me, 5)
        B = _values(7, 30, torch.float32, 3).view(6, 5)
        _, [y] = cuda_p2p.fused_all_gather_matmul(A, [B], 0, g, algorithm="pull_ahead")
        fullA = torch.cat([_values(q, 24, torch.float32, 5).view(4, 6) for q in range(W)])
        chk.case(f"fused {odd_one}", torch.equal(y, fullA @ B))
        after = _counters(g)
        moved = {k: after[k] - before.get(k, 0) for k in after
                 if k.endswith("zero_copy") and after[k] != before.get(k, 0)}
        chk.case(f"nothing zero-copy {odd_one}", not moved, f"{moved}")
    return chk.failures


def test_zero_copy_off(any_world):
    for failures in any_world.run(_off_case):
        assert not failures, failures


def test_signature_agreement_mismatches(any_world):
    for failures in any_world.run(_signature_case):
        assert not failures, failures


def test_zero_copy_agreement_option():
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    assert o.zero_copy_agreement == "auto"
    o.zero_copy_agreement = "signature"
    assert o.zero_copy_agreement == "signature"
    with pytest.raises(ValueError, match="Options.zero_copy_agreement must be one of "
                       "auto\\|exchange\\|signature\\|off, got 'headers'"):
        o.zero_copy_agreement = "headers"


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


def _fused_case(ctx, agreement):
    """fused_all_gather_matmul with A_shard in the heap (NOTE [Zero-copy all-gather→matmul]):
    every algorithm, gather dim and return_A against plain torch over every rank's shard; a
    gather along a middle dim (its prepared shard is a copy) runs staged; a rank with an ordinary
    tensor makes every rank stage (exchange) or raise a signature mismatch (signature); the input
    is intact and the group goes on working after each."""
    W, me = ctx.world_size, ctx.rank
    g = cached_group(f"zc_{agreement}", zero_copy_agreement=agreement)
    chk = Checker()
    key = "fused_all_gather_matmul.zero_copy"

    def values(rank, shape, dtype, seed):
        return _values(rank, _numel(shape), dtype, seed).view(shape)

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for algo in ("pull_ahead", "pipeline"):
            # (A_shard shape, gather_dim, zero-copy expected): first dim, last dim (contraction,
            # K gathered), a 3-D first dim, and a middle dim (prepared by a copy: staged).
            for shape, dim, zc in (((5, 6), 0, True), ((3, 4), 1, True), ((2, 3, 6), 0, True),
                                   ((2, 3, 6), 1, False)):
                tag = f"{dtype} {algo} {shape} dim {dim}"
                k = shape[-1] * (W if dim == len(shape) - 1 else 1)
                B = _values(7, k * 5, dtype, 3).view(k, 5)
                A = _fill(cuda_p2p.empty(*shape, dtype=dtype, group=g), me, seed=4)
                full = torch.cat([values(q, shape, dtype, 4) for q in range(W)], dim=dim)
                for return_A in (True, False):
                    before = _counters(g)
                    a_out, [y] = cuda_p2p.fused_all_gather_matmul(A, [B], dim, g,
                                                                  return_A=return_A,
                                                                  algorithm=algo)
                    ref = (full.double() @ B.double()).to(dtype)
                    chk.case(f"result {tag} rA={return_A}", torch.equal(y, ref),
                             f"max err {(y.double() - ref.double()).abs().max()}")
                    if return_A:
                        chk.case(f"A {tag}", torch.equal(a_out, full))
                    _expect_zero_copy(chk, g, key, before, f"counter {tag} rA={return_A}", zc)
                chk.case(f"input intact {tag}", torch.equal(A, values(me, shape, dtype, 4)))
    # One rank's A_shard is an ordinary tensor: every rank runs staged, correctly (exchange), or
    # every rank raises, naming the claim, and the group stays usable (signature).
    B = _values(7, 30, torch.float32, 3).view(6, 5)
    full = torch.cat([values(q, (4, 6), torch.float32, 5) for q in range(W)])
    for odd_one in range(W):
        A = _fill(torch.empty(4, 6) if me == odd_one else cuda_p2p.empty(4, 6, group=g), me, 5)
        before = _counters(g)
        if agreement == "signature":
            _raises_everywhere(chk, f"odd {odd_one}", lambda: cuda_p2p.fused_all_gather_matmul(
                A, [B], 0, g, algorithm="pull_ahead"), "zero-copy: A_shard at heap offset",
                "disagree")
            continue
        _, [y] = cuda_p2p.fused_all_gather_matmul(A, [B], 0, g, algorithm="pull_ahead")
        chk.case(f"rank {odd_one} staged: result", torch.equal(y, full @ B))
        _expect_zero_copy(chk, g, key, before, f"staged {odd_one}", False)
    # Every A_shard ordinary: staged, on either agreement.
    A = _fill(torch.empty(4, 6), me, 5)
    before = _counters(g)
    _, [y] = cuda_p2p.fused_all_gather_matmul(A, [B], 0, g, algorithm="pipeline")
    chk.case("ordinary: result", torch.equal(y, full @ B))
    _expect_zero_copy(chk, g, key, before, "ordinary", False)
    return chk.failures


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.mark.parametrize("agreement", ["exchange", "signature"])
def test_fused_all_gather_matmul_zero_copy(any_world, agreement):
    for failures in any_world.run(_fused_case, agreement):
        assert not failures, failures
