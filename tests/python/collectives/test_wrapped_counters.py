"""Every op counts which path ran: the ops the workspace never runs count `<op>.wrapped` once per
call (docs/collectives.md, "Counters"), and their results are still those of plain torch. The
all-to-alls, gather, scatter, reduce, send and recv run on the workspace (`<op>.direct`; their
wrapped paths: test_all_to_all.py, test_gather_scatter.py, test_reduce.py, test_send_recv.py)."""

from __future__ import annotations

import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from _harness import scoped_environ


def _wrapped_ops(ctx):
    """Runs each wrapped-only op (and the all-to-alls, gather, scatter, reduce, send and recv)
    once on a fresh group; its counters and results."""
    import cuda_p2p

    g = dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    r, W = ctx.rank, ctx.world_size
    results = {}

    # all_to_all_single: rank r sends value 10*r + q to rank q.
    inp = torch.tensor([10.0 * r + q for q in range(W)])
    out = torch.empty(W)
    dist.all_to_all_single(out, inp, group=g)
    results["all_to_all_single"] = out.tolist() == [10.0 * q + r for q in range(W)]

    # all_to_all with a list of tensors (Gloo's wants equal sizes): rank r sends r + q/10 to q.
    ins = [torch.full((3,), r + q / 10, dtype=torch.float64) for q in range(W)]
    outs = [torch.empty(3, dtype=torch.float64) for _ in range(W)]
    dist.all_to_all(outs, ins, group=g)
    results["all_to_all"] = all(o.tolist() == [q + r / 10] * 3 for q, o in enumerate(outs))

    # gather to rank 0, scatter from rank 0.
    t = torch.tensor([r, r * r], dtype=torch.int32)
    gl = [torch.empty(2, dtype=torch.int32) for _ in range(W)] if r == 0 else None
    dist.gather(t, gl, dst=0, group=g)
    results["gather"] = r != 0 or [x.tolist() for x in gl] == [[q, q * q] for q in range(W)]
    s = torch.empty(3)
    dist.scatter(s, [torch.full((3,), float(q) + 0.5) for q in range(W)] if r == 0 else None,
                 src=0, group=g)
    results["scatter"] = s.tolist() == [r + 0.5] * 3

    # reduce to rank 1 (bfloat16: the workspace's), then a bool one (the wrapped backend's: a
    # dtype the workspace does not reduce).
    x = torch.full((5,), float(r + 1), dtype=torch.bfloat16)
    dist.reduce(x, dst=1, group=g)
    results["reduce"] = r != 1 or x.tolist() == [float(W * (W + 1) // 2)] * 5
    xb = torch.tensor([r == 0, True, False, r == W - 1])
    dist.reduce(xb, dst=1, op=dist.ReduceOp.MAX, group=g)
    results["reduce_bool"] = r != 1 or xb.tolist() == [True, True, False, True]

    # send / recv around a ring, then recv from any source at rank 0.
    nxt, prv = (r + 1) % W, (r - 1) % W
    msg = torch.tensor([float(r)])
    got = torch.empty(1)
    if r % 2 == 0:
        dist.send(msg, nxt, group=g)
        dist.recv(got, prv, group=g)
    else:
        dist.recv(got, prv, group=g)
        dist.send(msg, nxt, group=g)
    results["send_recv"] = got.item() == float(prv)
    if r == 0:
        seen = set()
        for _ in range(W - 1):
            buf = torch.empty(1)
            dist.recv(buf, group=g)
            seen.add(int(buf.item()))
        results["recv_anysource"] = seen == set(range(1, W))
    else:
        dist.send(torch.tensor([float(r)]), 0, group=g)
        results["recv_anysource"] = True

    # Several tensors per rank (the workspace runs one), and a sparse all-reduce.
    a, c = torch.full((3,), float(r)), torch.full((2,), 1.0)
    dist.all_reduce_coalesced([a, c], group=g)
    results["all_reduce_coalesced"] = (a.tolist() == [float(W * (W - 1) // 2)] * 3
                                       and c.tolist() == [float(W)] * 2)
    gathered = [[torch.empty(2), torch.empty(1)] for _ in range(W)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_gather_coalesced is deprecated
        dist.all_gather_coalesced(gathered, [torch.full((2,), float(r)), torch.ones(1) * r],
                                  group=g)
    results["all_gather_coalesced"] = all(x.tolist() == [float(q)] * 2 and y.tolist() == [float(q)]
                                          for q, (x, y) in enumerate(gathered))
    sp = torch.sparse_coo_tensor(torch.tensor([[r % 4]]), torch.tensor([1.0]), (4,))
    work = dist.all_reduce(sp, group=g, async_op=True)
    work.wait()
    dense = work.result()[0].to_dense() if work.result() else sp.to_dense()
    want = torch.zeros(4)
    for q in range(W):
        want[q % 4] += 1.0
    results["all_reduce_sparse"] = torch.equal(dense, want)

    dist.monitored_barrier(group=g, timeout=timedelta(seconds=30))
    counters = dict(b.get_counters())
    dist.destroy_process_group(g)
    return {"results": results, "counters": counters}


@pytest.mark.parametrize("world", ["world2", "world3"])
def test_wrapped_ops_are_counted(world, request):
    w = request.getfixturevalue(world)
    out = w.run(_wrapped_ops)
    W = len(out)
    for r, rep in enumerate(out):
        assert all(rep["results"].values()), (r, rep["results"])
        c = rep["counters"]
        expected = {
            "reduce.wrapped": 1,
            "monitored_barrier.wrapped": 1,
            # all_reduce_coalesced (several tensors) and the sparse all_reduce (not strided:
            # torch 2.14 sends it to allreduce(), not allreduce_sparse())
            "all_reduce.wrapped": 2,
            "all_gather.wrapped": 1,  # all_gather_coalesced: several tensors
        }
        # Nothing else ran: every call of the function above is one of these.
        assert {k: v for k, v in c.items() if k.endswith(".wrapped")} == expected, (r, c)
        for op in ("all_to_all_single", "all_to_all", "gather", "scatter", "reduce"):
            assert c.get(f"{op}.direct") == 1, (r, op, c)
        # The ring, then every other rank's message to rank 0.
        assert c.get("send.direct") == 1 + (0 if r == 0 else 1), (r, c)
        assert c.get("recv.direct") == 1, (r, c)
        assert c.get("recv_anysource.direct") == (W - 1 if r == 0 else None), (r, c)


def _fallback_lines(ctx):
    """Creates a group under CUDA_P2P_DEBUG=INFO with stderr captured; falls back twice each (and
    sends twice, on the workspace: no line)."""
    import os
    import tempfile

    import cuda_p2p

    with tempfile.TemporaryFile() as cap:
        saved = os.dup(2)
        os.dup2(cap.fileno(), 2)
        try:
            with scoped_environ({"CUDA_P2P_DEBUG": "INFO"}):
                g = dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p")
            b = cuda_p2p.get_cuda_p2p_backend(g)
            for _ in range(2):
                dist.all_reduce(torch.ones(3, dtype=torch.bool), group=g)  # dtype: wrapped
                dist.reduce(torch.ones(3, dtype=torch.bool), dst=0, group=g)  # dtype: wrapped
                if ctx.rank == 0:  # the workspace's mailboxes: no line
                    dist.send(torch.ones(1), 1, group=g)
                elif ctx.rank == 1:
                    dist.recv(torch.ones(1), 0, group=g)
                dist.all_reduce(torch.ones(4), group=g)  # the workspace: no line
            counters = dict(b.get_counters())
            dist.destroy_process_group(g)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        cap.seek(0)
        text = cap.read().decode(errors="replace")
    return {"text": text, "counters": counters}


def test_debug_lines(world2):
    out = world2.run(_fallback_lines)
    for r, rep in enumerate(out):
        lines = [ln for ln in rep["text"].splitlines() if ln.startswith("cuda_p2p INFO")]
        group = [ln for ln in lines if "workspace:" in ln]
        assert len(group) == 1, rep["text"]
        assert f"rank {r}/2 group" in group[0], group[0]
        assert "workspace: up on cpu" in group[0] and "collectives: on the workspace" in group[0]
        # The knob set in the environment is named, with its source.
        assert "workspace_device=cpu (environment)" in group[0], group[0]
        fallbacks = [ln for ln in lines if "workspace:" not in ln]
        assert len(fallbacks) == 2, rep["text"]  # once per counter, though each ran twice
        ar = [ln for ln in fallbacks if ": all_reduce.wrapped:" in ln]
        assert len(ar) == 1 and "a dtype the workspace does not reduce" in ar[0], fallbacks
        red = [ln for ln in fallbacks if ": reduce.wrapped:" in ln]
        assert len(red) == 1 and "a dtype the workspace does not reduce" in red[0], fallbacks
        assert rep["counters"]["send.direct" if r == 0 else "recv.direct"] == 2
        assert rep["counters"]["all_reduce.wrapped"] == 2
        assert rep["counters"]["reduce.wrapped"] == 2


def _bad_debug_value(ctx):
    with scoped_environ({"CUDA_P2P_DEBUG": "verbose"}):
        try:
            dist.new_group(list(range(ctx.world_size)), backend="cuda_p2p")
        except Exception as e:  # noqa: BLE001
            return str(e)
    return None


def test_debug_rejects_a_bad_value(world2):
    for msg in world2.run(_bad_debug_value):
        assert msg is not None and "CUDA_P2P_DEBUG must be one of off|info (any case)" in msg, msg
