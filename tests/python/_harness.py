"""Multi-process test harness: persistent pools of ranks, each running the cuda_p2p backend.

A :class:`World` owns ``W`` worker processes, forked by a server that imported torch and cuda_p2p
once for every pool of the session (:func:`_rank_processes`). Each worker has called
``dist.init_process_group("cuda_p2p", init_method="tcp://127.0.0.1:<free port>")`` and built a
Gloo group over the same ranks (the reference). ``world.run(fn, *args)`` runs the module-level
function ``fn(ctx, *args)`` on every rank and returns the per-rank results; an exception on any
rank is re-raised in the test with the rank and the remote traceback.

Every wait has a timeout. When a call times out, a worker dies, or any rank raises, the pool is
torn down (processes killed) and the next ``run`` starts a fresh one, so one failing test cannot
hang CI or leave later tests talking to half-finished collectives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

# Where things are (docs/testing.md, "Layout"): the shared helpers here, the processes that the
# tests start as scripts (one rank each) in ranks/, the GPU machine's scripts in gpu_scripts/.
TESTS = os.path.dirname(os.path.abspath(__file__))
RANKS = os.path.join(TESTS, "ranks")
GPU_SCRIPTS = os.path.join(TESTS, "gpu_scripts")
REPO = os.path.dirname(os.path.dirname(TESTS))

# Seconds a single `run` (every rank) may take before the pool is declared hung.
# CUDA_P2P_HOST_SEMANTICS=cuda: the host workspace behaves as the CUDA one (NOTE [Host device with
# CUDA's semantics] in p2p_workspace/host/host_device.hpp): ops return queued, synchronous calls
# return a Work. The suites that CI runs in this mode too read it here.
HOST_CUDA_SEMANTICS = os.environ.get("CUDA_P2P_HOST_SEMANTICS", "") == "cuda"
RUN_TIMEOUT_S = float(os.environ.get("CUDA_P2P_TEST_TIMEOUT", "120"))
# Seconds the ranks get to start, import torch and rendezvous.
START_TIMEOUT_S = float(os.environ.get("CUDA_P2P_TEST_START_TIMEOUT", "120"))
# Seconds the other ranks get to finish once one rank has raised.
GRACE_S = 10.0
# The process groups' own timeout: shorter than RUN_TIMEOUT_S so that a collective stuck in
# Gloo surfaces as an error from the backend, not as a harness timeout.
PG_TIMEOUT_S = 60.0


@contextlib.contextmanager
def scoped_environ(values: dict):
    """Sets these environment variables (None: unsets one) for the block, then puts back what
    was there. For a rank that creates a group under a knob's variable (resolve_config reads the
    environment when a group is created)."""
    old = {k: os.environ.get(k) for k in values}

    def put(d):
        for k, v in d.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(values)
    try:
        yield
    finally:
        put(old)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteError(AssertionError):
    """An exception raised on a rank (AssertionError so pytest shows it as a test failure)."""


class HarnessError(RuntimeError):
    """The pool itself failed: a timeout, a dead worker, or a failed start."""


@dataclasses.dataclass
class Context:
    """What a function run by :meth:`World.run` gets as its first argument."""

    rank: int
    world_size: int
    gloo: Any  # the Gloo reference group over all ranks
    _groups: dict = dataclasses.field(default_factory=dict)
    baseline: dict = dataclasses.field(default_factory=dict)  # rank_state() when the pool started

    def group(self, ranks, backend: str = "cuda_p2p"):
        """A subgroup (cached per ranks and backend); every rank must call it in the same order."""
        import torch.distributed as dist

        key = (tuple(ranks), backend)
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(ranks), backend=backend)
        return self._groups[key]


# ---------------------------------------------------------------------------------------------
# worker side


def _rank_processes():
    """The multiprocessing context that starts the pools' ranks: forkserver, its server having
    imported torch and cuda_p2p. Importing torch costs a process ~3 s of CPU on the project's
    machines; spawned ranks paid it at every pool start (each size, every restart after a failed
    test, the harness's own tests), forked ones share the server's. The server imports only (no
    group, no tensor, no thread but OpenBLAS's, which it re-creates after a fork), as torch's data
    loader workers fork after the same imports. A rank gets the environment of the test process
    when its pool starts (the server's is that of the first start): ``_worker_main`` puts it in
    place before anything reads it, so a pool starts as a spawned one did.

    ``CUDA_P2P_TEST_RANK_START=spawn`` spawns them instead (scripts/gpu_check.sh: neither import
    initializes CUDA, which a forked rank could then not use, but forked GPU ranks have not run)."""
    start = os.environ.get("CUDA_P2P_TEST_RANK_START", "forkserver")
    if start not in ("forkserver", "spawn"):
        raise HarnessError(
            f"CUDA_P2P_TEST_RANK_START must be 'forkserver' or 'spawn', got {start!r}")
    ctx = mp.get_context(start)
    if start == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "cuda_p2p"])
    return ctx


def stop_rank_processes() -> None:
    """Stops the server of :func:`_rank_processes` once every pool has closed, and waits for it:
    the CPU of the ranks it forked (and reaped) then counts as the test process's children's, as
    spawned ranks' did (scripts/stages.sh reads it from /proc). Left running, it would be
    re-parented to init when the session ends, its ranks' CPU counted nowhere."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # Python 3.9+; not a public API
    if stop is not None:
        stop()


def _worker_main(rank: int, world_size: int, port: int, conn, log_path: str,
                 environment: dict) -> None:
    os.environ.clear()
    os.environ.update(environment)
    # Keep the ranks' output out of pytest's captured streams; it is shown on failure.
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # A rank that dies of a signal (a segfault in C++) leaves its Python stacks in the log, which
    # the parent shows with the failure.
    faulthandler.enable(file=log, all_threads=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The fused-op tests use tiny shapes to test the pipelines themselves; "auto"'s unfused path
    # below Options.fused_min_flops is tested on groups with that option set
    # (tests/python/fused/test_fused_auto.py).
    os.environ.setdefault("CUDA_P2P_FUSED_MIN_FLOPS", "0")
    # The rank's imports and setup make ~200k objects that live as long as the rank: the cyclic
    # collector would walk them at each of its ~400 passes during the imports and at every full
    # pass after (compiles make many). Collected once, then frozen out of its reach.
    gc.disable()
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        import cuda_p2p  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        dist.init_process_group(
            "cuda_p2p",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
        gloo = dist.new_group(list(range(world_size)), backend="gloo")
        ctx = Context(rank=rank, world_size=world_size, gloo=gloo, baseline=rank_state())
        conn.send_bytes(pickle.dumps(("ready", None)))
    except BaseException:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        return
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()

    counters_dir = os.environ.get("CUDA_P2P_TEST_COUNTERS")
    seen: set = set()
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if not msg:
            break
        try:
            fn, args, kwargs = pickle.loads(msg)
            result = fn(ctx, *args, **kwargs)
            payload = pickle.dumps(("ok", result))
        except BaseException as e:  # noqa: BLE001  (everything is reported to the parent)
            payload = pickle.dumps(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        conn.send_bytes(payload)
        if counters_dir:
            _record_counters(seen, os.path.join(counters_dir, f"counters-{os.getpid()}.json"))
        sys.stdout.flush()
        sys.stderr.flush()

    try:
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (the parent kills a worker that does not stop)
        pass
    sys.stdout.flush()
    sys.stderr.flush()


def _record_counters(seen: set, path: str) -> None:
    """With CUDA_P2P_TEST_COUNTERS=<dir>: the names of the counters that moved on this rank's live
    cuda_p2p groups (which paths ran), added up over the calls and written to `path`. Which
    protocol paths a suite reaches, compared before and after a change to the suite (groups a
    test destroyed before the end of its call are not seen)."""
    import json

    import torch.distributed as dist

    import cuda_p2p

    for pg in list(dist.distributed_c10d._world.pg_names):
        try:
            if cuda_p2p.is_cuda_p2p_group(pg):
                counters = cuda_p2p.get_cuda_p2p_backend(pg).get_counters()
                seen.update(k for k, v in counters.items() if v)
        except Exception:  # noqa: BLE001  (a group torn down meanwhile)
            continue
    with open(path, "w") as f:
        json.dump(sorted(seen), f)


def rank_state() -> dict:
    """What a test may change in a rank of a pool and must put back (tests/python/conftest.py
    compares it after every test that ran on the pool): the environment that configures
    torch and cuda_p2p, torch's thread count, default dtype and grad mode, and the default group."""
    import torch
    import torch.distributed as dist

    prefixes = ("CUDA_P2P_", "TORCH", "NCCL_", "GLOO_", "OMP_", "MASTER_")
    # Set by torch itself (inductor, the first time it looks for its cache), not by a test.
    torchs_own = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    return {
        "environment": {k: v for k, v in os.environ.items()
                        if k.startswith(prefixes) and k not in torchs_own},
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_default_dtype()": str(torch.get_default_dtype()),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "default group": dist.get_backend() if dist.is_initialized() else None,
    }


def state_leaks(ctx: Context) -> list[str]:
    """Run on every rank after a test (conftest.py): a barrier on the default group and on the
    Gloo reference - a group a test left failed or mid-collective shows here - then what differs
    from the state the pool started with."""
    import torch.distributed as dist

    now = rank_state()
    leaks = [f"{k}: {ctx.baseline[k]!r} when the pool started, now {now[k]!r}"
             for k in ctx.baseline if now[k] != ctx.baseline[k]]
    if not leaks:
        dist.barrier()
        dist.barrier(group=ctx.gloo)
    return leaks


# ---------------------------------------------------------------------------------------------
# parent side


class World:
    """A pool of ``size`` ranks on the cuda_p2p backend; created lazily, recreated after failure."""

    def __init__(self, size: int):
        self.size = size
        self._procs: list = []
        self._conns: list = []
        self._logs: list[str] = []
        self._logdir = tempfile.mkdtemp(prefix=f"cuda_p2p_w{size}_")
        self.starts = 0
        self.calls = 0  # run() calls: conftest.py checks a pool after each test that used it

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        if self._procs:
            return
        ctx = _rank_processes()
        last_error = None
        for _attempt in range(2):  # a second try with a new port covers a lost port race
            port = free_port()
            self.starts += 1
            for rank in range(self.size):
                parent, child = ctx.Pipe()
                log = os.path.join(self._logdir, f"start{self.starts}_rank{rank}.log")
                p = ctx.Process(
                    target=_worker_main,
                    args=(rank, self.size, port, child, log, dict(os.environ)),
                    name=f"cuda_p2p-w{self.size}-r{rank}",
                    daemon=True,
                )
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
                self._logs.append(log)
            try:
                replies = self._collect(START_TIMEOUT_S, what="start (init_process_group)")
            except HarnessError as e:
                last_error = e
                self.close(graceful=False)
                continue
            errors = [(r, tb) for r, (kind, tb) in enumerate(replies) if kind != "ready"]
            if not errors:
                return
            last_error = HarnessError(
                "\n".join(f"rank {r} failed to start:\n{tb}" for r, tb in errors)
            )
            self.close(graceful=False)
        raise last_error

    def close(self, graceful: bool = True) -> None:
        """Stops every worker: asks politely (graceful: they destroy their process groups), then
        kills. A broken pool (timeout, error) is killed at once. Never leaves a process behind."""
        if graceful:
            for conn in self._conns:
                try:
                    conn.send_bytes(b"")
                except (OSError, BrokenPipeError):
                    pass
            deadline = time.monotonic() + 10
            for p in self._procs:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._logs = [], [], []

    def remove_logs(self) -> None:
        import shutil

        shutil.rmtree(self._logdir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- running --------------------------------------------------------------------------------
    def run(self, fn: Callable, *args, timeout: float = RUN_TIMEOUT_S, **kwargs) -> list:
        """Runs ``fn(ctx, *args, **kwargs)`` on every rank; returns the per-rank results."""
        if getattr(fn, "__module__", None) in (None, "__main__") or "<locals>" in fn.__qualname__:
            raise TypeError(f"world.run needs a module-level function, got {fn!r}")
        self.start()
        dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
        if dead:
            # Something crashed a rank after its last reply (a background thread?): report it,
            # and let the next call start a fresh pool.
            text = "\n".join(
                f"rank {r} of {self.size} died since the last call (exit code "
                f"{self._procs[r].exitcode})\n{self._log_tail(r)}"
                for r in dead
            )
            self.close(graceful=False)
            raise HarnessError(text)
        self.calls += 1
        payload = pickle.dumps((fn, args, kwargs))
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
        except OSError as e:
            self.close(graceful=False)
            raise HarnessError(f"could not send {fn.__qualname__} to the ranks: {e}") from None
        try:
            replies = self._collect(timeout, what=f"{fn.__module__}.{fn.__qualname__}")
        except HarnessError:
            self.close(graceful=False)
            raise
        errors = [(r, msg) for r, (kind, msg) in enumerate(replies) if kind != "ok"]
        if errors:
            # Ranks may be left mid-collective with their peers: start over next time.
            self.close(graceful=False)
            text = "\n".join(
                f"---- rank {r} of {self.size} ({fn.__qualname__}) raised ----\n{msg}"
                for r, msg in errors
            )
            raise RemoteError(text)
        return [msg for _kind, msg in replies]

    def _collect(self, timeout: float, what: str) -> list:
        """One reply per rank. Raises HarnessError on timeout or a dead worker."""
        replies: list = [None] * self.size
        deadline = time.monotonic() + timeout
        first_error_at = None
        while any(r is None for r in replies):
            now = time.monotonic()
            if first_error_at is not None and now - first_error_at > GRACE_S:
                # One rank failed and the others are (likely) waiting on it in a collective.
                for r in range(self.size):
                    if replies[r] is None:
                        replies[r] = (
                            "error",
                            f"(no reply {GRACE_S:.0f} s after another rank failed: probably "
                            f"blocked in a collective)\n{self._log_tail(r)}",
                        )
                break
            if now > deadline:
                missing = [r for r in range(self.size) if replies[r] is None]
                raise HarnessError(
                    f"timeout after {timeout:.0f} s in {what}: ranks {missing} of {self.size} "
                    "did not answer (hang?); the pool is torn down.\n"
                    + "\n".join(self._log_tail(r) for r in missing)
                )
            pending = {conn: r for r, conn in enumerate(self._conns) if replies[r] is None}
            sentinels = {self._procs[r].sentinel: r for r in pending.values()}
            limit = deadline - now
            if first_error_at is not None:
                limit = min(limit, GRACE_S - (now - first_error_at))
            ready = mp_connection.wait(list(pending) + list(sentinels), max(0.0, min(limit, 1.0)))
            # Replies first: a rank may have answered and exited (its sentinel is then ready too).
            for obj in sorted(ready, key=lambda o: o not in pending):
                if obj in pending:
                    r = pending[obj]
                    try:
                        data = obj.recv_bytes()
                    except (EOFError, OSError):
                        self._procs[r].join(1)
                        raise HarnessError(
                            f"rank {r} of {self.size} closed its pipe in {what} "
                            f"(exit code {self._procs[r].exitcode})\n{self._log_tail(r)}"
                        ) from None
                    replies[r] = pickle.loads(data)
                    if replies[r][0] not in ("ok", "ready"):
                        first_error_at = first_error_at or time.monotonic()
                else:
                    r = sentinels[obj]
                    if replies[r] is None and not self._conns[r].poll():
                        self._procs[r].join(1)
                        raise HarnessError(
                            f"rank {r} of {self.size} died in {what} "
                            f"(exit code {self._procs[r].exitcode})\n{self._log_tail(r)}"
                        )
        return replies

    def _log_tail(self, rank: int, n: int = 3000) -> str:
        try:
            with open(self._logs[rank], errors="replace") as f:
                text = f.read()
        except (OSError, IndexError):
            return f"(no log for rank {rank})"
        if not text:
            return f"(rank {rank} wrote no output)"
        return f"-- output of rank {rank} --\n{text[-n:]}"


# ---------------------------------------------------------------------------------------------
# processes of their own (torchrun, scripts that set up their own process group)


def _pids_with_token(token: str) -> list[int]:
    """Processes whose environment carries `token`: everything a run_script call started,
    including grandchildren that left its process group (torchrun gives each rank a session)."""
    needle = f"CUDA_P2P_TEST_TOKEN={token}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class RankScript:
    """A rank script of ranks/ run as ``python SCRIPT ARGS...`` with ``start_new_session=True``
    would run it - its own session, ``env`` as its whole environment, stdout and stderr appended
    to ``log_path``, ``sys.argv``, ``__main__`` - in a process forked by the pools' server
    (:func:`_rank_processes`), where torch and cuda_p2p are imported already: a job of fresh
    ranks per case (the fault suite) without a torch import per rank. The handle answers as
    subprocess.Popen's: ``pid``, ``poll()`` and ``wait(timeout)`` (the exit status, minus the
    signal that killed it), ``send_signal``, ``kill``. The environment of a forked process is not
    what /proc/<pid>/environ shows (that is the server's): find what a job left behind by its
    sessions (:func:`pids_in_sessions`), not by a token in the environment."""

    def __init__(self, script: str, args: list, env: dict, log_path: str):
        self._proc = _rank_processes().Process(
            target=_rank_script_main, args=(script, [str(a) for a in args], dict(env), log_path),
            name=f"cuda_p2p-{os.path.basename(script)}", daemon=True)
        self._proc.start()
        self.pid = self._proc.pid

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self._proc.name, timeout)
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _rank_script_main(script: str, args: list, environment: dict, log_path: str) -> None:
    os.setsid()
    os.environ.clear()
    os.environ.update(environment)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [script, *args]
    import runpy

    runpy.run_path(script, run_name="__main__")


def pids_in_sessions(sessions) -> list[int]:
    """The live processes (zombies aside) of these sessions: each a RankScript's (its pid is its
    session's id) and whatever it started."""
    wanted = set(sessions)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        # After the command name (which may hold spaces): state, ppid, pgrp, session.
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) in wanted:
            pids.append(int(entry))
    return pids


@dataclasses.dataclass
class ScriptResult:
    returncode: int | None  # None: killed after the timeout
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def memfds_of_ours() -> tuple[int, int]:
    """This process's mappings and open descriptors of cuda_p2p memfds (0, 0 once all are gone)."""
    with open("/proc/self/maps") as f:
        maps = sum("memfd:cuda_p2p" in line for line in f)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += "memfd:cuda_p2p" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return maps, fds


def run_script(cmd: list, timeout: float, env: dict | None = None) -> ScriptResult:
    """Runs `cmd` with a time limit; whatever happens, no process it started survives."""
    import subprocess
    import uuid

    token = uuid.uuid4().hex
    env = dict(os.environ if env is None else env, CUDA_P2P_TEST_TOKEN=token)
    env.setdefault("OMP_NUM_THREADS", "1")
    # Output to a file, not a pipe: a stray grandchild holding a pipe would block the reader.
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            for _ in range(3):
                pids = _pids_with_token(token)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
    return ScriptResult(rc, text)
