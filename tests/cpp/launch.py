#!/usr/bin/env python3
"""Runs a test binary as N ranks on this host without mpirun (the GPU machines have none).

    python tests/cpp/launch.py -n 4 [--timeout 300] [--grace 30] -- build/.../test_workspace [args]

Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and a free
MASTER_PORT (tests/cpp/harness.cpp reads them). Rank 0's output is passed through; the other
ranks' lines are prefixed with "[rank r] ".

Exit status: 0 when every rank exits 0; 77 (ctest's SKIP_RETURN_CODE for these tests) when every
rank exits 77, i.e. every test skipped itself; 124 when the ranks ran past --timeout (every rank
is killed, and the ranks still running are named, after gdb printed their threads' stacks where
gdb is installed; CUDA_P2P_LAUNCH_STACKS=0 skips that); otherwise the first failing rank's status
(1 for a signal). Once a rank fails, the others get --grace seconds to finish (they usually fail
at their next rendezvous) before they are killed. No rank outlives the launcher.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SKIP_STATUS = 77


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pump(stream, prefix: bytes, out, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


def kill_all(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def dump_stacks(procs: list, ranks: list, out, lock: threading.Lock) -> None:
    """Every thread's stack of each rank still running, before it is killed (gdb, where this
    machine has it; the ranks at once, 45 s at most): a hang's place, which a killed rank cannot
    tell itself."""
    debugger = shutil.which("gdb") or shutil.which("cuda-gdb")
    if debugger is None or os.environ.get("CUDA_P2P_LAUNCH_STACKS", "1") == "0":
        return
    gdbs = {}
    for r in ranks:
        try:
            gdbs[r] = subprocess.Popen(
                [debugger, "-p", str(procs[r].pid), "-batch", "-nx", "-ex", "set pagination off",
                 "-ex", "thread apply all bt 30"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            gdbs[r] = e
    deadline = time.monotonic() + 45
    for r, g in gdbs.items():
        if isinstance(g, OSError):
            text = f"({debugger} failed: {g})".encode()
        else:
            try:
                text = g.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                g.kill()
                text = g.communicate()[0] + b"\n(gdb timed out)"
        keep = [ln for ln in text.splitlines()
                if ln.startswith((b"#", b"Thread ", b"(gdb"))][:400]
        with lock:
            out.write(f"launch.py: rank {r}'s threads before the kill:\n".encode())
            for ln in keep:
                out.write(f"[rank {r} stack] ".encode() + ln + b"\n")
            out.flush()


def describe(rc: int) -> str:
    return f"signal {-rc}" if rc < 0 else f"status {rc}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--np", type=int, required=True, help="number of ranks")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    ap.add_argument("--grace", type=float, default=30.0,
                    help="seconds the other ranks get once one has failed")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program [args]")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd or args.np < 1:
        ap.error("expected -n N >= 1 and a program after --")

    port = free_port()
    out = sys.stdout.buffer
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []

    def on_signal(signum, _frame):
        kill_all(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for rank in range(args.np):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.np), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            # A session of its own per rank: killpg then also reaches anything the rank started.
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            procs.append(p)
            prefix = b"" if rank == 0 else f"[rank {rank}] ".encode()
            t = threading.Thread(target=pump, args=(p.stdout, prefix, out, lock), daemon=True)
            t.start()
            pumps.append(t)

        deadline = time.monotonic() + args.timeout
        failed_at = None
        first_failure = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc not in (None, 0, SKIP_STATUS) and first_failure is None:
                    first_failure = (r, rc)
                    failed_at = now
            running = [r for r, p in enumerate(procs) if p.poll() is None]
            if now > deadline:
                dump_stacks(procs, running, out, lock)
                kill_all(procs)
                print(f"launch.py: TIMEOUT after {args.timeout:.0f} s: ranks {running} of "
                      f"{args.np} still running, killed", flush=True)
                return 124
            if failed_at is not None and now - failed_at > args.grace:
                dump_stacks(procs, running, out, lock)
                kill_all(procs)
                r, rc = first_failure
                print(f"launch.py: rank {r} failed ({describe(rc)}); ranks {running} did not "
                      f"finish within {args.grace:.0f} s after it, killed", flush=True)
                return rc if rc > 0 else 1
            time.sleep(0.05)
    finally:
        kill_all(procs)
        for t in pumps:
            t.join(5)

    codes = [p.returncode for p in procs]
    if all(rc == 0 for rc in codes):
        return 0
    if all(rc == SKIP_STATUS for rc in codes):
        return SKIP_STATUS
    bad = [(r, rc) for r, rc in enumerate(codes) if rc != 0]
    print("launch.py: " + ", ".join(f"rank {r} exited with {describe(rc)}" for r, rc in bad),
          flush=True)
    r, rc = first_failure or bad[0]
    return rc if rc > 0 and rc != SKIP_STATUS else 1


if __name__ == "__main__":
    sys.exit(main())
