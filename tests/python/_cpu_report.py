"""CPU seconds per test file: a pytest plugin (tests/python/conftest.py loads it).

With ``CUDA_P2P_CPU_REPORT=<path>`` set, it writes a JSON object ``{file: [cpu_s, wall_s]}`` there
at the end of the session: for each test file, the CPU time (user + system) that pytest and every
process it started spent while that file's tests ran - the ranks of the pools, the scripts and
torchrun jobs a test launches, their children - and the wall time. Session fixtures (a pool's
start) count for the first file that uses them. scripts/test.sh sets it; docs/testing.md's
table of CPU per file comes from these files.

How: at each change of file, a snapshot of the CPU of pytest's own process (with what it reaped,
``cutime``/``cstime``) plus that of every live descendant. A process that exits is reaped by its
parent (multiprocessing joins its ranks, ``run_script`` waits for its command) and its time moves
into that parent's ``cutime``, so nothing is lost or counted twice. A daemon that its parent never
reaps (re-parented to init) is lost; the tests start none.
"""

from __future__ import annotations

import json
import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks including reaped children) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime, stime, cutime, cstime are fields 14-17.
    return int(fields[1]), sum(int(x) for x in fields[11:15])


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every live process below it (their reaped children included)."""
    info = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st is not None:
                info[int(entry)] = st
    total = 0
    for pid, (_ppid, ticks) in info.items():
        p, hops = pid, 0
        while p in info and p != root and hops < 64:
            p, hops = info[p][0], hops + 1
        if p == root:
            total += ticks
    return total / _TICK


class CpuReport:
    def __init__(self, path: str):
        self.path = path
        self.root = os.getpid()
        self.per_file: dict[str, list[float]] = {}
        self.current: str | None = None
        self.cpu0 = self.wall0 = 0.0

    def _switch(self, name: str | None) -> None:
        cpu, wall = tree_cpu_seconds(self.root), time.monotonic()
        if self.current is not None:
            acc = self.per_file.setdefault(self.current, [0.0, 0.0])
            acc[0] += cpu - self.cpu0
            acc[1] += wall - self.wall0
        self.current, self.cpu0, self.wall0 = name, cpu, wall

    def pytest_runtest_logstart(self, nodeid, location):
        name = nodeid.split("::", 1)[0]
        if name != self.current:
            self._switch(name)

    def pytest_sessionfinish(self, session, exitstatus):
        self._switch(None)
        rows = {k: [round(c, 1), round(w, 1)] for k, (c, w) in sorted(self.per_file.items())}
        with open(self.path, "w") as f:
            json.dump(rows, f, indent=1)


def register(config) -> None:
    path = os.environ.get("CUDA_P2P_CPU_REPORT")
    if path:
        # "%p" in the path: this pytest's pid (several pytest runs of one test.sh stage).
        config.pluginmanager.register(CpuReport(path.replace("%p", str(os.getpid()))),
                                      "cuda_p2p_cpu_report")
