"""send/recv, isend/irecv, recv from any rank and batch_isend_irecv through the workspace's
mailboxes (NOTE [Mailboxes] in p2p_workspace/messages/mailboxes.cpp) on 2, 3 and 4 ranks: every
dtype, sizes from empty to many chunks (4 KiB slots), non-contiguous tensors, tags taken out of
order (large messages passing each other), both directions at once, a sender that runs ahead,
every rank sending before it receives, progress while the sender does something else, two
groups side by side. Each received tensor is compared with
what the sender sent, computed locally by plain torch; the counters say the mailboxes ran
(`send.direct`, `recv.direct`, nothing wrapped). Unmatched and mismatched pairs raise naming both
ranks, and nothing is lost; a shutdown fails a pending receive. torch.distributed.pipelining's
GPipe and 1F1B train on it exactly as on Gloo."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import cuda_p2p
from _checks import Checker, assert_ok, expect_nothing_wrapped, raises, wrapped
from _groups import cached_group

SLOT = 4096
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64)
# Empty, one element, odd, under one 4 KiB slot, and several slots (the 1 MiB default: one).
SIZES = (0, 1, 7, 1000, 5 * SLOT // 4 + 3)


def _message(src, dst, n, dtype, seed=0):
    """What rank `src` sends rank `dst`: distinct per pair and seed, exact in every dtype."""
    v = (torch.arange(n, dtype=torch.int64) * 3 + src * 11 + dst * 5 + seed) % 100
    if dtype == torch.bool:
        return v % 3 == 0
    if dtype == torch.complex64:
        return torch.complex(v.float(), -v.float())
    if dtype == torch.int8:
        return (v - 50).to(dtype)
    return v.to(dtype)


def _ring(g, rank, W, n, seed, tag=0):
    """isend _message(rank -> right) and irecv from the left, both waited for; whether the
    received tensor is the left rank's message."""
    right, left = (rank + 1) % W, (rank - 1) % W
    out = torch.zeros(n)
    for w in (dist.irecv(out, left, group=g, tag=tag),
              dist.isend(_message(rank, right, n, torch.float32, seed=seed), right, group=g,
                         tag=tag)):
        w.wait()
    return torch.equal(out, _message(left, rank, n, torch.float32, seed=seed))


def check_exchanges(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"send/recv W={W}")
    small = cached_group("sr-small", mailbox_slot_bytes=SLOT)
    groups = ((dist.group.WORLD, "world"), (small, "4 KiB slots"))
    backends = [cuda_p2p.get_cuda_p2p_backend(g) for g, _ in groups]
    for b in backends:
        b.reset_counters()
    right, left = (rank + 1) % W, (rank - 1) % W
    sent = 0

    # A ring, every dtype and size, with each of the three APIs.
    for g, gname in groups:
        for dtype in DTYPES:
            for n in SIZES:
                for api in ("isend_irecv", "batch", "blocking"):
                    out = torch.full((n,), 7, dtype=dtype) if dtype != torch.bool else \
                        torch.ones(n, dtype=torch.bool)
                    msg = _message(rank, right, n, dtype)
                    if api == "isend_irecv":
                        works = [dist.irecv(out, left, group=g), dist.isend(msg, right, group=g)]
                        for w in works:
                            w.wait()
                    elif api == "batch":
                        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, msg, right, g),
                                                         dist.P2POp(dist.irecv, out, left, g)]):
                            w.wait()
                    elif rank % 2 == 0:  # even ranks send first: no cycle of blocked senders
                        dist.send(msg, right, group=g)
                        dist.recv(out, left, group=g)
                    else:
                        dist.recv(out, left, group=g)
                        dist.send(msg, right, group=g)
                    sent += 1 if g is dist.group.WORLD else 0
                    want = _message(left, rank, n, dtype)
                    chk.case(f"{gname} {api} {dtype} n={n}", torch.equal(out, want),
                             f"{out[:8]} != {want[:8]}")

    # Non-contiguous tensors on both sides: a column of a matrix, into every other element.
    src = torch.arange(64, dtype=torch.float32).reshape(8, 8) + 100 * rank
    dst = torch.zeros(16)
    for w in (dist.irecv(dst[::2], left, group=small), dist.isend(src[:, 3], right, group=small)):
        w.wait()
    want = torch.zeros(16)
    want[::2] = (torch.arange(64, dtype=torch.float32).reshape(8, 8) + 100 * left)[:, 3]
    chk.case("non-contiguous", torch.equal(dst, want), f"{dst} != {want}")

    # Both directions at once, 16 slots each way, every send posted before any receive.
    n = 16 * SLOT // 4
    outs = {p: torch.zeros(n) for p in {left, right}}
    sends = [dist.isend(_message(rank, p, n, torch.float32, seed=1), p, group=small)
             for p in {left, right}]
    recvs = [dist.irecv(outs[p], p, group=small) for p in {left, right}]
    for w in sends + recvs:
        w.wait()
    for p in {left, right}:
        chk.case(f"both ways from {p}", torch.equal(outs[p], _message(p, rank, n, torch.float32,
                                                                       seed=1)), "")

    # Tags taken in the other order, each message several slots: the first passes into this
    # rank's memory while the second streams through the mailbox.
    a, b = 3 * SLOT // 4 + 1, 5 * SLOT // 4 + 2
    works = [dist.isend(_message(rank, right, a, torch.float32, seed=2), right, group=small, tag=1),
             dist.isend(_message(rank, right, b, torch.float32, seed=3), right, group=small, tag=2)]
    out_b, out_a = torch.zeros(b), torch.zeros(a)
    works += [dist.irecv(out_b, left, group=small, tag=2),
              dist.irecv(out_a, left, group=small, tag=1)]
    for w in works:
        w.wait()
    chk.case("tags out of order",
             torch.equal(out_a, _message(left, rank, a, torch.float32, seed=2))
             and torch.equal(out_b, _message(left, rank, b, torch.float32, seed=3)), "")

    # A receive from any rank: rank 0 takes one message from each other rank; the Work names it.
    if rank == 0:
        seen = {}
        for _ in range(W - 1):
            buf = torch.zeros(3, dtype=torch.int64)
            w = small.recv_anysource([buf], 5)
            w.wait()
            seen[w._source_rank()] = buf.tolist()
        chk.case("any source", seen == {q: [q, q * q, 5] for q in range(1, W)}, f"{seen}")
    else:
        dist.send(torch.tensor([rank, rank * rank, 5]), 0, group=small, tag=5)

    # Work API: is_completed, the future's value, wait(timeout).
    out = torch.zeros(4)
    rw = dist.irecv(out, left, group=small, tag=6)
    sw = dist.isend(torch.full((4,), float(rank)), right, group=small, tag=6)
    fut = rw.get_future()
    deadline = time.monotonic() + 30
    while not rw.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    chk.case("is_completed", rw.is_completed() and rw.is_success(), "")
    chk.case("future", torch.equal(fut.wait()[0], torch.full((4,), float(left))), f"{fut.value()}")
    chk.case("wait(timeout)", sw.wait(timedelta(seconds=10)) is True, "")

    # A sender that runs ahead: rank 0's 16-slot send waits for rank 1, which starts late, to take
    # the chunks - and then rank 1 has them all.
    n = 16 * SLOT // 4
    if rank == 0:
        dist.send(_message(0, 1, n, torch.float32, seed=4), 1, group=small, tag=7)
    elif rank == 1:
        time.sleep(0.2)
        out = torch.zeros(n)
        dist.recv(out, 0, group=small, tag=7)
        chk.case("late receiver", torch.equal(out, _message(0, 1, n, torch.float32, seed=4)), "")

    # Progress while the sender is elsewhere: rank 0 posts a 16-slot isend and joins a Gloo
    # barrier before it waits; rank 1 can only reach that barrier once it has the whole message.
    if rank == 0:
        w = dist.isend(_message(0, 1, n, torch.float32, seed=5), 1, group=small, tag=8)
        ctx_barrier(ctx)
        w.wait()
    elif rank == 1:
        out = torch.zeros(n)
        dist.recv(out, 0, group=small, tag=8)
        chk.case("progress without a wait", torch.equal(out, _message(0, 1, n, torch.float32,
                                                                      seed=5)), "")
        ctx_barrier(ctx)
    else:
        ctx_barrier(ctx)

    # Every rank sends before it receives, blocking, more than the slots hold (a cycle of
    # senders): each blocked sender empties the full mailbox towards it (NOTE [Mailboxes]).
    n, k = 3 * SLOT // 4, 5
    for i in range(k):
        dist.send(_message(rank, right, n, torch.float32, seed=20 + i), right, group=small, tag=20)
    outs = [torch.zeros(n) for _ in range(k)]
    for i in range(k):
        dist.recv(outs[i], left, group=small, tag=20)
    chk.case("senders first", all(
        torch.equal(outs[i], _message(left, rank, n, torch.float32, seed=20 + i))
        for i in range(k)), "")

    # Two groups side by side: the same peer and tag on both, taken in the other group order.
    x, y = torch.zeros(2), torch.zeros(2)
    ws = [dist.isend(torch.tensor([1.0, rank]), right, group=small, tag=9),
          dist.isend(torch.tensor([2.0, rank]), right, group=dist.group.WORLD, tag=9),
          dist.irecv(y, left, group=dist.group.WORLD, tag=9),
          dist.irecv(x, left, group=small, tag=9)]
    for w in ws:
        w.wait()
    chk.case("two groups", x.tolist() == [1.0, left] and y.tolist() == [2.0, left], f"{x} {y}")

    for b in backends:
        expect_nothing_wrapped(chk, b)
    c = backends[0].get_counters()
    chk.case("counters", c.get("send.direct") == sent + 1 and c.get("recv.direct") == sent + 1,
             f"{c} (sent {sent})")
    return chk.result()


_GLOO = {}


def ctx_barrier(ctx):
    """A barrier on a Gloo group over the same ranks (made once per process)."""
    if "g" not in _GLOO:
        _GLOO["g"] = dist.new_group(backend="gloo")
    dist.barrier(group=_GLOO["g"])


def test_exchanges(any_world):
    assert_ok(any_world.run(check_exchanges), min_cases=2 * len(DTYPES) * len(SIZES) * 3)


TIMEOUT = timedelta(seconds=1.5)


def _group_with_timeout(slot=SLOT):
    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.mailbox_slot_bytes = slot
    return dist.new_group(backend="cuda_p2p", timeout=TIMEOUT, pg_options=o)


def check_errors(ctx):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"send/recv errors W={W}")
    g = _group_with_timeout()
    b = cuda_p2p.get_cuda_p2p_backend(g)
    ms = int(TIMEOUT.total_seconds() * 1000)

    def case(what, err, *parts):
        chk.case(what, err is not None and all(p in err for p in parts), f"{err!r}")

    # A receive from a rank that has sent nothing on this group.
    if rank == 1:
        err = raises(lambda: dist.recv(torch.zeros(3), 0, group=g, tag=7))
        case("nothing sent", err, f"rank 1's recv from rank 0 (tag 7, 12 bytes of Float) timed out "
             f"after {ms} ms: rank 0 has sent nothing on this group")
    ctx_barrier(ctx)

    # Size and dtype mismatches: the receive raises naming both ranks; the message stays queued
    # and a receive that fits gets it.
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), 1, group=g, tag=1)
        dist.send(torch.tensor([4, 5, 6], dtype=torch.int32), 1, group=g, tag=2)
    elif rank == 1:
        err = raises(lambda: dist.recv(torch.zeros(4), 0, group=g, tag=1))
        case("size mismatch", err, "rank 1 expected 16 bytes of Float from rank 0 with tag 1, but "
             "rank 0 sent 12 bytes of Float with that tag; the message stays queued")
        out = torch.zeros(3)
        dist.recv(out, 0, group=g, tag=1)
        chk.case("kept after a size mismatch", out.tolist() == [1.0, 2.0, 3.0], f"{out}")
        err = raises(lambda: dist.recv(torch.zeros(3), 0, group=g, tag=2))
        case("dtype mismatch", err, "rank 1 expected 12 bytes of Float from rank 0 with tag 2, but "
             "rank 0 sent 12 bytes of Int with that tag")
        out = torch.zeros(3, dtype=torch.int32)
        dist.recv(out, 0, group=g, tag=2)
        chk.case("kept after a dtype mismatch", out.tolist() == [4, 5, 6], f"{out}")
    ctx_barrier(ctx)

    # A tag nobody sent: the timeout names both ranks and the messages that did come.
    if rank == 0:
        dist.send(torch.tensor([9.0]), 1, group=g, tag=5)
    elif rank == 1:
        err = raises(lambda: dist.recv(torch.zeros(1), 0, group=g, tag=6))
        case("unmatched tag", err, f"rank 1's recv from rank 0 (tag 6, 4 bytes of Float) timed out "
             f"after {ms} ms: rank 0 sent no message with tag 6 (its messages waiting here: tag 5, "
             "4 bytes of Float)")
        out = torch.zeros(1)
        dist.recv(out, 0, group=g, tag=5)
        chk.case("kept after an unmatched tag", out.tolist() == [9.0], f"{out}")
        err = raises(lambda: dist.recv(torch.zeros(2), group=g, tag=99))
        case("any source", err, "rank 1's recv from any rank (tag 99, 8 bytes of Float) timed out "
             f"after {ms} ms: no rank sent a message with tag 99")
    ctx_barrier(ctx)

    # A bounded Work.wait raises while the op is pending, and the op stays pending: the message
    # sent after it still lands.
    if rank == 1:
        pending = dist.irecv(torch.zeros(2), 0, group=g, tag=42)
        err = raises(lambda: pending.wait(timedelta(milliseconds=100)))
        case("bounded wait", err, "Work.wait(100 ms) of a RECV timed out with the op still "
             "pending (it stays pending)")
    ctx_barrier(ctx)
    if rank == 0:
        dist.send(torch.tensor([4.0, 2.0]), 1, group=g, tag=42)
    elif rank == 1:
        chk.case("still pending, then done", pending.wait() and
                 pending.result()[0].tolist() == [4.0, 2.0], f"{pending.result()}")
    ctx_barrier(ctx)

    # Bad peers, on the backend itself (torch checks the ranks of dist.send first).
    err = raises(lambda: g.send([torch.zeros(1)], rank, 0).wait())
    case("send to itself", err, f"cuda_p2p send: the destination must be another rank in [0, {W}), "
         f"got {rank} on rank {rank}")
    err = raises(lambda: g.recv([torch.zeros(1)], W + 2, 0).wait())
    case("recv from nowhere", err, f"cuda_p2p recv: the source must be another rank in [0, {W}), "
         f"got {W + 2} on rank {rank}")

    # Still usable: a ring.
    right, left = (rank + 1) % W, (rank - 1) % W
    out = torch.zeros(2)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([1.0, rank]), right, g),
                                     dist.P2POp(dist.irecv, out, left, g)]):
        w.wait()
    chk.case("usable after errors", out.tolist() == [1.0, left], f"{out}")
    chk.case("nothing wrapped", not wrapped(b.get_counters()), f"{b.get_counters()}")
    ctx_barrier(ctx)

    # A send that the receiver never takes, larger than the mailbox: it times out midway and the
    # channel is unusable from then on (on a group of its own).
    h = _group_with_timeout()
    if rank == 0:
        err = raises(lambda: dist.send(torch.zeros(4 * SLOT), 1, group=h, tag=3))
        case("unmatched send", err, f"rank 0's send to rank 1 (tag 3, {16 * SLOT} bytes of Float) "
             f"timed out after {ms} ms: rank 1 did not take the earlier chunks from its mailbox "
             "(2 of 16 chunks sent); the channel to rank 1 is now unusable")
        err = raises(lambda: dist.send(torch.zeros(1), 1, group=h))
        case("unusable channel", err, "the channel from rank 0 to rank 1 is unusable")
    ctx_barrier(ctx)

    # A shutdown fails a receive still pending.
    k = _group_with_timeout()
    pending = dist.irecv(torch.zeros(1), 0, group=k, tag=4) if rank == 1 else None
    ctx_barrier(ctx)
    dist.destroy_process_group(k)
    if pending is not None:
        err = raises(pending.wait)
        case("shutdown", err, "the group was shut down")
    dist.destroy_process_group(h)
    dist.destroy_process_group(g)
    return chk.result()


def test_errors(world2):
    # Its timeouts are waited for (1.5 s each); the other ranks of a larger world would only watch.
    assert_ok(world2.run(check_errors), min_cases=3)


def check_wrapped(ctx):
    """With the workspace's collectives off, send/recv go to Gloo, counted."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"send/recv wrapped W={W}")
    off = cached_group("sr-off", workspace_collectives=False)
    b = cuda_p2p.get_cuda_p2p_backend(off)
    b.reset_counters()
    right, left = (rank + 1) % W, (rank - 1) % W
    out = torch.zeros(3)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(rank)), right,
                                                off), dist.P2POp(dist.irecv, out, left, off)]):
        w.wait()
    chk.case("result", out.tolist() == [float(left)] * 3, f"{out}")
    c = b.get_counters()
    chk.case("counters", c.get("send.wrapped") == 1 and c.get("recv.wrapped") == 1
             and "send.direct" not in c, f"{c}")
    return chk.result()


def test_wrapped(world2):
    assert_ok(world2.run(check_wrapped))


# --- torch.distributed.pipelining -----------------------------------------------------------

def _stage_module(i):
    torch.manual_seed(100 + i)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())


def _train(group, schedule_name, W, rank, steps=2):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model = _stage_module(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stage = PipelineStage(model, rank, W, torch.device("cpu"), group=group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    sched = cls(stage, n_microbatches=4, loss_fn=lambda out, y: ((out - y) ** 2).mean())
    torch.manual_seed(7)
    losses_all = []
    for _ in range(steps):
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        opt.zero_grad()
        losses = []
        if rank == 0:
            sched.step(x)
        elif rank == W - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        losses_all += [float(v) for v in losses]
    return [p.detach().clone() for p in model.parameters()], losses_all


def check_pipelining(ctx, schedule_name):
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"pipelining {schedule_name} W={W}")
    g = cached_group("sr-pipe")
    b = cuda_p2p.get_cuda_p2p_backend(g)
    b.reset_counters()
    params, losses = _train(g, schedule_name, W, rank)
    if "gloo" not in _GLOO:
        _GLOO["gloo"] = dist.new_group(backend="gloo")
    ref_params, ref_losses = _train(_GLOO["gloo"], schedule_name, W, rank)
    chk.case("parameters", all(torch.equal(p, q) for p, q in zip(params, ref_params)), "")
    chk.case("losses", losses == ref_losses and (rank != W - 1 or len(losses) == 8),
             f"{losses} != {ref_losses}")
    c = b.get_counters()
    chk.case("counters", c.get("send.direct", 0) > 0 and c.get("recv.direct", 0) > 0
             and not wrapped(c), f"{c}")
    return chk.result()


@pytest.mark.parametrize("schedule_name", ["gpipe", "1f1b"])
def test_pipelining(any_world, schedule_name):
    assert_ok(any_world.run(check_pipelining, schedule_name), min_cases=3)


def check_mixed_slots(ctx):
    """Ranks whose mailbox slots differ (each reads a sender's outbox by the layout it published),
    both directions, several slots of either size."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"send/recv mixed slots W={W}")
    g = cached_group("sr-mixed", mailbox_slot_bytes=SLOT if rank == 0 else 3 * SLOT)
    chk.case("mixed slots", _ring(g, rank, W, 7 * SLOT // 4 + 5, seed=30), "")
    cfg = cuda_p2p.get_cuda_p2p_backend(g).get_collective_config()
    chk.case("slot size", cfg["mailbox_slot_bytes"] == (SLOT if rank == 0 else 3 * SLOT), f"{cfg}")
    return chk.result()


def test_mixed_slots(world2):
    assert_ok(world2.run(check_mixed_slots), min_cases=2)


def check_threads(ctx):
    """Two threads of one rank, each with its own peer traffic on one group, at once."""
    W, rank = ctx.world_size, ctx.rank
    chk = Checker(f"send/recv threads W={W}")
    g = cached_group("sr-small", mailbox_slot_bytes=SLOT)
    results = {}

    def run(tag):
        results[tag] = _ring(g, rank, W, 3 * SLOT, seed=tag, tag=tag)

    threads = [threading.Thread(target=run, args=(t,)) for t in (11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    chk.case("threads", results == {11: True, 12: True}, f"{results}")
    return chk.result()


def test_threads(world3):
    assert_ok(world3.run(check_threads))
