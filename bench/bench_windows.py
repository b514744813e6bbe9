"""One-sided windows (docs/windows.md) against send/recv: the same ping-pong both ways, timed in
the same run on the same ranks, taking turns.

Ranks pair up (0-1, 2-3, ...). Per message size, rank A sends B `size` bytes and B sends them
back, `iters` times:
  * window:    A ``put`` + ``signal``, B ``wait_signal`` (dist._new_window over a cuda_p2p.empty
               tensor, registered in place), then B the same back;
  * send/recv: A ``dist.send``, B ``dist.recv`` on the same cuda_p2p group (its mailboxes), then
               back.
One way is half a round trip: its latency, and size / latency as bandwidth. The ratio is
send/recv's time over the window's (> 1: the window is faster). Every round checks the bytes
received. Results: a table, and JSON (--json).

    .venv/bin/python bench/bench_windows.py                     # 2 ranks, 8 B .. 16 MiB
    .venv/bin/python bench/bench_windows.py --world-sizes 2 4   # 4: two pairs at once
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import host_workspace, spawn_ranks

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def _rank_main(rank: int, W: int, port: int, args, queue) -> None:
    try:
        result = _measure(rank, W, port, args)
        if rank == 0:
            queue.put(result)
    except BaseException as e:  # noqa: BLE001  (reported to the launcher)
        import traceback

        queue.put({"error": f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"})


def _measure(rank: int, W: int, port: int, args) -> dict | None:
    import datetime

    import torch
    import torch.distributed as dist

    import cuda_p2p

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    host_workspace()
    torch.set_num_threads(1)
    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W, timeout=datetime.timedelta(seconds=args.timeout))
    gloo = dist.new_group(backend="gloo")  # lines the ranks up before each sample
    backend = cuda_p2p.get_cuda_p2p_backend()
    if not backend.is_p2p_available():
        raise RuntimeError(f"workspace unavailable: {backend.p2p_unavailable_reason()}")
    peer = rank ^ 1
    first = rank % 2 == 0  # A of its pair
    largest = max(args.sizes)
    mine = torch.full((largest,), rank + 1, dtype=torch.uint8)
    inbox = cuda_p2p.empty(largest, dtype=torch.uint8)
    inbox.zero_()
    win = dist._new_window(inbox)
    recv_buf = torch.zeros(largest, dtype=torch.uint8)

    def window_round(n):
        if first:
            win.put(mine[:n], peer, 0, False)
            win.signal(peer, False)
            win.wait_signal(peer, False)
        else:
            win.wait_signal(peer, False)
            win.put(mine[:n], peer, 0, False)
            win.signal(peer, False)

    def send_recv_round(n):
        if first:
            dist.send(mine[:n], peer)
            dist.recv(recv_buf[:n], peer)
        else:
            dist.recv(recv_buf[:n], peer)
            dist.send(mine[:n], peer)

    def check(buf, n, what):
        if n and not (int(buf[0]) == peer + 1 and int(buf[n - 1]) == peer + 1):
            raise RuntimeError(f"{what} of {n} bytes: rank {rank} received wrong bytes")

    def sample(fn, n, iters):
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(n)
        return (time.perf_counter() - t0) / iters / 2  # one way

    backend.reset_counters()
    rows = []
    for n in args.sizes:
        iters = max(3, min(args.iters, (64 << 20) // max(n, 1)))
        for fn in (window_round, send_recv_round):
            for _ in range(args.warmup):
                fn(n)
        inbox.zero_()
        recv_buf.zero_()
        dist.barrier(group=gloo)
        win_s, sr_s = [], []
        for _ in range(args.samples):  # the two take turns
            win_s.append(sample(window_round, n, iters))
            sr_s.append(sample(send_recv_round, n, iters))
        check(inbox, n, "window")
        check(recv_buf, n, "send/recv")
        rows.append({"bytes": n, "iters": iters, "window_s": win_s, "send_recv_s": sr_s})
    counters = dict(backend.get_counters())
    for name in ("window.put", "send.direct"):
        if not counters.get(name):
            raise RuntimeError(f"rank {rank}: {name} never counted ({counters}): the exchange "
                               "did not run where it should")
    # Every rank's rows, gathered on rank 0: the slowest pair is what a step would wait for.
    gathered = [None] * W if rank == 0 else None
    dist.gather_object(rows, gathered, dst=0, group=gloo)
    dist.barrier(group=gloo)
    win = None  # dropped: no peer uses it any more
    dist.destroy_process_group()
    if rank != 0:
        return None
    out = []
    for i, row in enumerate(rows):
        win_us = max(statistics.median(g[i]["window_s"]) for g in gathered) * 1e6
        sr_us = max(statistics.median(g[i]["send_recv_s"]) for g in gathered) * 1e6
        out.append({"bytes": row["bytes"], "iters": row["iters"], "window_us": win_us,
                    "send_recv_us": sr_us, "ratio": sr_us / win_us,
                    "window_GBps": row["bytes"] / win_us / 1e3,
                    "send_recv_GBps": row["bytes"] / sr_us / 1e3})
    return {"world_size": W, "rows": out, "counters_rank0": counters}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2])
    parser.add_argument("--sizes", type=parse_size, nargs="+",
                        default=[8, 4 << 10, 64 << 10, 1 << 20, 16 << 20],
                        help="message sizes (8, 4K, 1M, ...)")
    parser.add_argument("--iters", type=int, default=500,
                        help="round trips per sample (fewer for large sizes: 64 MiB a sample)")
    parser.add_argument("--samples", type=int, default=5, help="samples per variant, alternating")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per world size")
    parser.add_argument("--json", type=Path,
                        default=Path(__file__).parent / "results" / "windows.json")
    args = parser.parse_args(argv)
    for W in args.world_sizes:
        if W < 2 or W % 2:
            parser.error(f"--world-sizes: the ranks pair up, expected an even size >= 2, got {W}")

    report = {"machine": os.uname().nodename, "nproc": os.cpu_count(),
              "loadavg_at_start": os.getloadavg(), "args": {k: str(v) for k, v in
                                                            vars(args).items()}, "runs": []}
    for W in args.world_sizes:
        res = spawn_ranks(_rank_main, W, args, args.timeout)
        if "error" in res:
            print(res["error"], file=sys.stderr)
            return 1
        report["runs"].append(res)
        print(f"\n{W} ranks ({W // 2} pair{'s' if W > 2 else ''} ping-ponging; one way, the "
              "slowest pair)")
        print(f"{'bytes':>10} {'window us':>10} {'send/recv us':>13} {'ratio':>6} "
              f"{'window GB/s':>12} {'send/recv GB/s':>15}")
        for r in res["rows"]:
            print(f"{r['bytes']:>10} {r['window_us']:>10.2f} {r['send_recv_us']:>13.2f} "
                  f"{r['ratio']:>5.2f}x {r['window_GBps']:>12.3f} {r['send_recv_GBps']:>15.3f}")
    report["loadavg_at_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"\nratio: send/recv's time over the window's (> 1: the window is faster)\n"
          f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
