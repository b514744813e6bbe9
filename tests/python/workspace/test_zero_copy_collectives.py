"""Zero-copy collectives (issue 15.1): the collectives and fused_all_gather_matmul read symmetric
inputs (cuda_p2p.empty, use_symmetric_memory: test_zero_copy.py) from their owners' heaps instead
of staging them, under either agreement (exchange, signature); their fallbacks, the signature
agreement's mismatches and the off switch.

Results are compared with plain-torch math over every rank's inputs (computed locally, exact for
the small integers used) and, for float32, with a Gloo group over the same ranks; the counters
say whether the zero-copy path ran.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _groups import cached_group
from _reference import reduce_over_ranks
from test_zero_copy import Checker, _counters, _expect_zero_copy, _fill, _values

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8)
# 1 and odd sizes, and one whose reduce-scatter chunk spans several 256 KiB reduction pieces.
SIZES = (1, 7, 4099)
LARGE = 3 * (256 << 10) // 4 + 5


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
