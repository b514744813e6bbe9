"""Fault injection: a rank killed (SIGKILL) or stopped (SIGSTOP) at various points of a job.

Each case starts its own job (one process per rank, _fault_rank.py, a 10 s process-group
timeout; each rank forked by the pools' server with torch imported, run as its script:
_harness.RankScript), injects the fault and checks that every survivor raises within the
timeout plus a margin with an error naming the dead or stopped rank, that every process exits by
itself, that no survivor still holds a memfd of ours after destroy_process_group, that /dev/shm
gains nothing, and that the next job on the same port works (every case uses the port of the
previous one, and starts with a checked all_reduce).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from _checks import names_rank
from _harness import RANKS, RankScript, free_port, pids_in_sessions

TIMEOUT_S = 10.0  # the jobs' process-group timeout (_fault_rank.TIMEOUT_S)
# What a survivor may take beyond it (2 shared cores, up to 4 ranks, the rest of the suite and
# maybe a busy loop per core beside them): a fraction of the timeout, not a guess at a machine.
MARGIN_S = 0.5 * TIMEOUT_S
# For the ranks to import torch and get ready: not a guess at how fast a machine is but a bound
# on a hang. The wait ends as soon as they are ready, or when a rank that should live exits; a
# rank that hangs exits by itself (its faulthandler, 60 s after its imports, and the store's
# rendezvous timeout), so only a rank still starting is waited for this long. With 60 s, a fresh
# clone's run once failed with none of three ranks ready and nothing in their logs (2026-12-02,
# beside the sanitizer tests and a build: load far above the 2 cores).
START_S = 240.0
TEARDOWN_GUARD_S = 30.0  # _fault_rank.py: faulthandler's limit after a survivor's error

_PORT = free_port()  # every case reuses it: each job is "the next job on the same port"


def _events(out_dir: str, rank: int) -> list[dict]:
    path = os.path.join(out_dir, f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _first(events: list[dict], kind: str) -> dict | None:
    return next((e for e in events if e["kind"] == kind), None)


def _dev_shm() -> set[str]:
    # Python's multiprocessing semaphores (sem.mp-*) of other test runs sharing the machine come
    # and go meanwhile; the ranks here start no multiprocessing, so none of those is theirs.
    return {n for n in os.listdir("/dev/shm") if not n.startswith("sem.mp-")}


def _clean_up(procs, logs, out_dir):
    """Kills whatever a case left running (its ranks and their children), closes the logs and
    removes the case's folder (the logs are in its result, and printed)."""
    for pid in pids_in_sessions(p.pid for p in procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for log in logs:
        log.close()
    shutil.rmtree(out_dir, ignore_errors=True)


def run_fault(case: str, world: int, victim: int, signal_from_test: int | None,
              script: str = "_fault_rank.py", env_extra: dict | None = None) -> dict:
    """Runs one job with one fault; returns what happened (asserting nothing itself). `script`
    is one rank: _fault_rank.py (CASE names its operation) or _shrink_rank.py (CASE unused)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    shm_before = _dev_shm()
    out_dir = tempfile.mkdtemp(prefix="cuda_p2p_faults_")
    procs, logs = [], []
    result = {"case": case, "victim": victim, "world": world}
    try:
        for r in range(world):
            log = open(os.path.join(out_dir, f"rank{r}.log"), "w")
            logs.append(log)
            args = [str(r), str(world), str(_PORT)] + ([case] if script == "_fault_rank.py" else [])
            procs.append(RankScript(os.path.join(RANKS, script), [*args, victim, out_dir], env,
                                    log.name))
        # Wait until every rank is in its loop (or, for a self-inflicted fault, the victim is
        # about to kill itself).
        deadline = time.time() + START_S
        waiting_for = [victim] if signal_from_test is None else list(range(world))
        while time.time() < deadline:
            if all(_first(_events(out_dir, r), "ready") for r in waiting_for):
                break
            if any(p.poll() is not None for i, p in enumerate(procs) if i != victim):
                break
            time.sleep(0.05)
        ready = [_first(_events(out_dir, r), "ready") for r in waiting_for]
        assert all(ready), (
            f"{case}: the ranks never got ready ({time.time() - deadline + START_S:.0f} s; load "
            f"average {os.getloadavg()[0]:.1f}; exit codes {[p.poll() for p in procs]}):\n"
            f"{_logs(out_dir, world)}")
        if signal_from_test is not None:
            time.sleep(0.3)  # well inside the loop
            t_fault = time.time()
            procs[victim].send_signal(signal_from_test)
        else:
            t_fault = _first(_events(out_dir, victim), "ready")["t"]
        survivors = [r for r in range(world) if r != victim]
        # Every survivor must exit by itself: error (within the timeout and its margin), then
        # destroy - whose closing handshake waits up to one more timeout for the dead rank (NOTE
        # [Block lifetime]) - and the residue check. A survivor that hangs there is ended by its
        # own guard, TEARDOWN_GUARD_S after its error, with its stacks in its log: wait past that,
        # so that a slow or hung teardown shows its stacks rather than a process "left behind".
        end = t_fault + TIMEOUT_S + MARGIN_S + TEARDOWN_GUARD_S + 10
        for r in survivors:
            try:
                procs[r].wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                pass
        if signal_from_test == signal.SIGSTOP:
            procs[victim].send_signal(signal.SIGCONT)  # it must now fail and exit too
        try:
            procs[victim].wait(timeout=TIMEOUT_S + MARGIN_S + 20)
        except subprocess.TimeoutExpired:
            pass
        result["returncodes"] = [p.poll() for p in procs]
        result["left_behind"] = pids_in_sessions(p.pid for p in procs)
        result["errors"] = {}
        result["clean"] = {}
        for r in range(world):
            ev = _events(out_dir, r)
            err = _first(ev, "error")
            if err:
                result["errors"][r] = (err["t"] - t_fault, err["error"])
            clean = _first(ev, "clean")
            if clean:
                result["clean"][r] = (clean["memfd_maps"], clean["memfd_fds"])
            for kind in ("shrunk", "done"):
                if _first(ev, kind):
                    result.setdefault(kind, {})[r] = _first(ev, kind)
        # Residue is what stays: a name other processes on the machine create and remove
        # meanwhile (scripts/test.sh runs this file beside the rest of the suite; torch shares
        # tensors between processes through briefly named /dev/shm files) is gone a moment later.
        new = _dev_shm() - shm_before
        if new:
            time.sleep(1.0)
            new &= _dev_shm()
        result["shm_new"] = sorted(new)
        result["logs"] = _logs(out_dir, world)
        result["noisy"] = _noisy(out_dir, world)
        print(f"\nFAULT {case}: " + json.dumps(
            {k: v for k, v in result.items() if k != "logs"}, default=str)[:4000])
        return result
    finally:
        _clean_up(procs, logs, out_dir)  # the logs are in `result` (and printed)


def _logs(out_dir: str, world: int) -> str:
    text = ""
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text += f"--- rank {r} ---\n{f.read()[-3000:]}\n"
        text += f"events: {_events(out_dir, r)}\n"
    return text


def _noisy(out_dir: str, world: int) -> dict[int, str]:
    """The ranks whose whole log (not the tail _logs keeps: a C++ stack trace is longer than
    that, its first line far above the last frames) has a store error or a C++ trace, each with
    the first such line."""
    noisy = {}
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                for line in f:
                    if _NOISE.search(line):
                        noisy[r] = line.strip()[:300]
                        break
    return noisy


def check_fault(res: dict, victim_exits_by_itself: bool = False) -> None:
    world, victim = res["world"], res["victim"]
    logs = res["logs"]
    assert not res["left_behind"], f"processes left behind: {res['left_behind']}\n{logs}"
    for r in range(world):
        if r == victim and not victim_exits_by_itself:
            continue
        assert res["returncodes"][r] == 0, f"rank {r} exit code {res['returncodes'][r]}\n{logs}"
        assert r in res["errors"], f"rank {r} raised nothing\n{logs}"
        elapsed, text = res["errors"][r]
        if r != victim:
            assert elapsed <= TIMEOUT_S + MARGIN_S, f"rank {r} raised after {elapsed:.1f} s\n{logs}"
            assert names_rank(text, victim), (
                f"rank {r}'s error does not name rank {victim}: {text}\n{logs}")
        assert res["clean"].get(r) == (0, 0), (
            f"rank {r} still holds memfds of ours after destroy (maps, fds): "
            f"{res['clean'].get(r)}\n{logs}")
    assert not res["shm_new"], f"/dev/shm residue: {res['shm_new']}"


CASES = [
    # case, world, victim, signal sent by the test (None: the victim kills itself)
    ("pre_rendezvous", 3, 2, None),
    ("allreduce_small", 3, 1, signal.SIGKILL),
    ("allreduce_large", 2, 1, signal.SIGKILL),
    ("fused", 2, 1, signal.SIGKILL),
    ("grow", 3, 2, None),
    ("kill_rank0", 2, 0, signal.SIGKILL),
]


@pytest.mark.parametrize("case,world,victim,sig", CASES, ids=[c[0] for c in CASES])
def test_killed_rank_is_named_by_every_survivor(case, world, victim, sig):
    check_fault(run_fault(case, world, victim, sig))


# The op each survivor is in when the victim dies (_fault_rank.run_mixed, after a random workload
# of every op): CI runs the uneven all-to-all (its header words, written by queued copies after a
# timeout, were freed: "corrupted double-linked list"), in both host modes, and again with the
# ranks' extension built with ASan (scripts/sanitizers.sh: heap-use-after-free is then reported
# at the write, where glibc notices it only sometimes); --long every kind.
MIXED_LAST = ["all_to_all_uneven", "all_to_all_single", "all_to_all", "all_gather",
              "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "gather", "scatter",
              "reduce", "all_reduce", "fused_all_gather_matmul", "fused_matmul_reduce_scatter"]


@pytest.mark.asan
@pytest.mark.parametrize("last", [MIXED_LAST[0]] + [
    pytest.param(k, marks=pytest.mark.long) for k in MIXED_LAST[1:]])
def test_survivors_free_nothing_a_timed_out_op_still_touches(last):
    """NOTE [Tensors in stream order] in backend/workspace_collectives.cpp: a random workload of
    every op, the victim killed at a random op; each survivor's next op (`last`, ~40000 elements a
    rank) times out, then destroy_process_group, gc.collect and a heap churn. A survivor that
    freed memory its op's queued work still wrote into aborts ("corrupted double-linked list") or
    faults, which check_fault reports as its exit code."""
    seed = MIXED_LAST.index(last) + 1
    res = run_fault("mixed", 2, 0, None,
                    env_extra={"CUDA_P2P_FAULT_SEED": str(seed), "CUDA_P2P_FAULT_LAST": last})
    check_fault(res)


def test_stopped_rank_past_the_timeout_is_named_and_everyone_exits():
    # The stopped rank is resumed after the survivors gave up: it must fail and exit as well.
    res = run_fault("sigstop", 2, 1, signal.SIGSTOP)
    check_fault(res, victim_exits_by_itself=True)


# C++ stack traces and store errors a survivor must not print while it shrinks the group and
# tears everything down (NOTE [Quiet teardown] in p2p_workspace/store_probe.cpp).
_NOISE = re.compile(r"recvValue failed|sendBytes failed|recvVector failed|Exception raised from")


def _reference(world: int, victim: int, resume: int):
    """The weights a job of `world` ranks reaches after `resume` steps, then
    _shrink_rank.POST_STEPS steps without `victim`: plain torch, one process."""
    import torch

    from _shrink_rank import LR, POST_STEPS, gradient

    w = torch.zeros(8, dtype=torch.float64)
    survivors = [r for r in range(world) if r != victim]
    for s in range(resume + POST_STEPS):
        ranks = range(world) if s < resume else survivors
        w = w - LR * sum(gradient(w, r, s) for r in ranks) / len(ranks)
    return w


@pytest.mark.parametrize("world,victim", [(3, 1), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_survivors_shrink_past_a_killed_rank_and_finish_training(world, victim):
    """NOTE [Shrinking past dead ranks] in backend/child_groups.cpp: a rank SIGKILLed in a
    data-parallel training loop; the survivors raise naming it, dist.shrink_group([victim]),
    finish training on the shrunk group's workspace with the weights of a W-1 rank reference,
    tear down quietly, and leave nothing in /dev/shm."""
    import torch

    res = run_fault("shrink", world, victim, signal.SIGKILL, script="_shrink_rank.py")
    check_fault(res)
    logs = res["logs"]
    survivors = [r for r in range(world) if r != victim]
    resumes = {res["done"][r]["resume"] for r in survivors} if "done" in res else set()
    assert len(resumes) == 1 and all(r in res.get("done", {}) for r in survivors), (
        f"the survivors did not all finish, or resumed from different steps: {resumes}\n{logs}")
    want = _reference(world, victim, resumes.pop())
    for r in survivors:
        shrunk, done = res["shrunk"][r], res["done"][r]
        assert shrunk["size"] == world - 1 and shrunk["available"], (shrunk, logs)
        got = torch.tensor(done["w"], dtype=torch.float64)
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12), (r, got, want)
        c = done["counters"]
        ran = c.get("all_reduce.one_shot", 0) + c.get("all_reduce.two_shot", 0)
        assert ran >= 50 and not any(k.endswith(".wrapped") for k in c), (r, c)
    noisy = {r: line for r, line in res["noisy"].items() if r in survivors}
    assert not noisy, f"survivors printed a store error or C++ trace: {noisy}\n{logs}"


TEARDOWN_TIMEOUT_S = 10  # _teardown_rank.py's group timeout


def test_teardown_after_the_store_host_exited_is_quiet_and_bounded():
    """NOTE [Quiet teardown] in p2p_workspace/store_probe.cpp: on a group spanning two simulated
    hosts, rank 0 (the TCPStore's host) destroys its group and exits first; the other host's
    ranks then tear their intra-host workspace down against a dead store - at once, and without
    the store client's "recvValue failed" and C++ stack trace."""
    world = 4
    out_dir = tempfile.mkdtemp(prefix="cuda_p2p_teardown_")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    shm_before = _dev_shm()
    procs, logs = [], []
    try:
        for r in range(world):
            log = open(os.path.join(out_dir, f"rank{r}.log"), "w")
            logs.append(log)
            procs.append(RankScript(os.path.join(RANKS, "_teardown_rank.py"),
                                    [r, world, _PORT, out_dir], env, log.name))
        for p in procs:
            try:
                p.wait(timeout=START_S + 30)
            except subprocess.TimeoutExpired:
                pass
        text = _logs(out_dir, world)
        assert [p.poll() for p in procs] == [0] * world, text
        for r in range(world):
            checked = _first(_events(out_dir, r), "checked")
            assert checked and checked["counters"].get("all_reduce.hierarchical") == 1, text
            # "At once" is the protocol's outcome, not a guess at the machine's speed: no rank
            # waited its closing handshake out (NOTE [Block lifetime]: it warns, naming the ranks
            # that "did not close ... in time"); and the teardown ends well within a few group
            # timeouts (10 s in _teardown_rank.py, which caps that wait) on a busy machine too.
            destroyed = _first(_events(out_dir, r), "destroyed")
            assert destroyed and destroyed["seconds"] < 3 * TEARDOWN_TIMEOUT_S, (r, destroyed, text)
            with open(os.path.join(out_dir, f"rank{r}.log"), errors="replace") as f:
                assert "in time" not in f.read(), (r, text)
        noisy = _noisy(out_dir, world)
        assert not noisy, f"ranks printed a store error or C++ trace: {noisy}\n{text}"
        new = _dev_shm() - shm_before
        if new:
            time.sleep(1.0)
            new &= _dev_shm()
        assert not new, f"/dev/shm residue: {sorted(new)}"
    finally:
        _clean_up(procs, logs, out_dir)
