"""What the benchmark scripts share."""

import os
import socket


def host_workspace() -> None:
    """These benchmarks measure the host workspace (CPU tensors). On a machine with a GPU a
    group's workspace would be on the GPU and the CPU tensors would go to Gloo (NOTE [The
    workspace's device] in backend/ProcessGroupCudaP2P.cpp): keep it on the host unless the
    caller chose otherwise. Called before any group is created, in every rank."""
    os.environ.setdefault("CUDA_P2P_WORKSPACE_DEVICE", "cpu")


def init_rank(rank: int, W: int, port: int, timeout: float):
    """The start of a step benchmark's rank (bench_fsdp.py, bench_pipeline.py): one intra-op
    thread, the host workspace, the cuda_p2p default group over tcp://127.0.0.1:port; returns two
    Gloo groups over the same ranks: the baseline's, and one neither variant uses that lines the
    ranks up before each sample."""
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    host_workspace()
    torch.set_num_threads(1)
    dist.init_process_group("cuda_p2p", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=W, timeout=datetime.timedelta(seconds=timeout))
    return dist.new_group(backend="gloo"), dist.new_group(backend="gloo")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(rank_main, W: int, args, timeout: float):
    """Runs rank_main(rank, W, port, args, queue) in W spawned processes and returns the first
    thing a rank puts on the queue (rank 0's result, or a rank's {"error": ...}) within `timeout`
    seconds; the ranks are joined (killed after 60 s) whatever happens."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, W, port, args, queue)) for r in range(W)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


class CorePlacementProbe:
    """How the two CPUs the first two ranks run on are placed, sampled through a run (NOTE [Core
    placement] in p2p_workspace/host/core_probe.cpp): a thread of the launcher bounces a cache
    line between them for `probe_s` every `period_s` seconds (`cuda_p2p._C._core_round_trip_ns`;
    both threads yield to the ranks after a short spin). A virtual machine's host moves its vCPUs
    between placements for seconds at a time: on this project's machines a round trip takes about
    30 ns (two threads of one core), 70 ns (one core complex) or 300 ns (two), and every
    cross-rank transfer of the host path slows down with it. The placement "varied" during a run
    when its slowest sample took more than VARIED_FACTOR times its fastest; every benchmark cell
    lists the samples taken while it ran. A probe that finds a CPU busy with something else
    records no round trip and counts in `busy_samples`: on a loaded machine every probe may be
    busy, which is a result, not an error."""

    VARIED_FACTOR = 1.6

    def __init__(self, cpus: list[int], period_s: float, probe_s: float = 0.002):
        import threading

        self.cpus = list(cpus[:2])
        self.period_s, self.probe_s = period_s, probe_s
        self.samples: list[tuple[float, float]] = []  # (time.monotonic(), median round trip ns)
        self.busy_samples = 0  # probes that found a CPU busy (no round trip recorded)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="core-probe", daemon=True)
        self.enabled = period_s > 0 and len(set(self.cpus)) == 2
        if self.enabled:
            self.sample()  # the first sample before any rank runs
            self._thread.start()

    def sample(self) -> None:
        import time

        from cuda_p2p import _C

        try:
            r = _C._core_round_trip_ns(self.cpus[0], self.cpus[1], self.probe_s)
        except (RuntimeError, ValueError) as e:  # a CPU taken away: stop probing
            self.error = str(e)
            self._stop.set()
            return
        if r["busy"]:
            # A CPU was busy with something else: the round trip would measure the load, not the
            # placement. Counted, not sampled.
            self.busy_samples += 1
            return
        self.samples.append((time.monotonic(), r["median_ns"]))

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def typical_ns(self) -> float | None:
        import statistics

        return statistics.median(ns for _, ns in self.samples) if self.samples else None

    def varied(self) -> bool:
        ns = [v for _, v in self.samples]
        return bool(ns) and max(ns) > self.VARIED_FACTOR * min(ns)

    def window(self, t0: float, t1: float) -> dict | None:
        """The samples taken between t0 and t1 (time.monotonic(), the clock every process of the
        machine shares), and whether the placement varied during the run."""
        if not self.samples:
            return None
        ns = [round(v, 1) for t, v in self.samples if t0 <= t <= t1]
        return {"samples": len(ns), "round_trip_ns": ns, "run_varied": self.varied()}

    def summary(self) -> dict:
        ns = [v for _, v in self.samples]
        return {"enabled": self.enabled, "cpus": self.cpus, "period_s": self.period_s,
                "probe_s": self.probe_s, "varied_factor": self.VARIED_FACTOR,
                "typical_ns": self.typical_ns(), "min_ns": min(ns, default=None),
                "max_ns": max(ns, default=None), "varied": self.varied(), "samples": len(ns),
                "busy_samples": self.busy_samples,
                "error": self.error,
                # Times unrounded: window() compares them with each cell's t_monotonic, and a
                # rounded time can fall just outside the cell that took the sample.
                "timeline": [[t, round(v, 1)] for t, v in self.samples]}


def finish_report(report: dict, args, plot, failed: list, script: str) -> None:
    """The end of a step benchmark (bench_fsdp.py, bench_pipeline.py): the load average at the
    end, the JSON (--json), the plot (--plot, unless empty); then exits non-zero naming every
    check that failed."""
    import json
    import sys
    from pathlib import Path

    report["loadavg_at_end"] = os.getloadavg()
    print(f"load average (1 min) at start {report['loadavg_at_start'][0]:.1f}, "
          f"at end {report['loadavg_at_end'][0]:.1f} on {os.cpu_count()} CPUs")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    if failed:
        sys.exit(f"{script}: " + "; ".join(failed))
