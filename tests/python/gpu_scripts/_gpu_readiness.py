"""What the multi-GPU-readiness scripts share (gpu_stress.py, gpu_fault.py, gpu_teardown.py, run by
scripts/gpu_check.sh): starting W ranks that share the one GPU, the groups they test, deadlines.

Each script also runs with ``--device cpu``: the same schedule with CPU tensors on the host
workspace. That is how CI keeps them working where there is no GPU
(tests/python/gpu/test_gpu_readiness.py); nothing here has run on a GPU unless a gpu_check.sh
summary in docs/testing.md says so.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
import warnings

import torch
import torch.multiprocessing as mp

from _harness import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
# The ranks import the scripts beside this file, the test harness and test_gpu (tests/python/gpu).
_PATHS = [HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "gpu")]


def say(rank: int, text: str) -> None:
    print(f"rank {rank}: {text}", flush=True)


def _rank_entry(target, rank: int, world_size: int, port: int, args) -> None:
    faulthandler.enable(all_threads=True)
    # torch 2.14 deprecates all_gather_into_tensor / reduce_scatter_tensor by name, once per op.
    warnings.filterwarnings("ignore", category=FutureWarning)
    sys.path[:0] = _PATHS
    code = 0
    try:
        target(rank, world_size, port, args)
        say(rank, "PASSED")
    except BaseException:  # noqa: BLE001  (reported; the exit code says it)
        traceback.print_exc()
        say(rank, "FAILED")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A thread may still be blocked in the device (that is what some steps check): do not wait
    # for it at interpreter exit.
    os._exit(code)


def launch(target, world_size: int, args, timeout: float) -> list:
    """Runs target(rank, world_size, port, args) in W fresh processes; their exit codes. A rank
    still running after `timeout` gets SIGABRT (faulthandler prints its stacks), then SIGKILL."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(target, r, world_size, port, args))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for r, p in enumerate(procs):
        if p.is_alive():
            print(f"rank {r} ran past {timeout:.0f} s; its stacks follow", flush=True)
            os.kill(p.pid, signal.SIGABRT)
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return [p.exitcode for p in procs]


def device_of(cuda: bool) -> torch.device:
    # Ranks share the first visible GPU (scripts/gpu_check.sh sets CUDA_VISIBLE_DEVICES).
    return torch.device("cuda", 0) if cuda else torch.device("cpu")


def synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def init(rank: int, world_size: int, port: int, cuda: bool, timeout_s: float = 120.0) -> None:
    """The default group: Gloo, for the scripts' own coordination (never under test)."""
    from datetime import timedelta

    import torch.distributed as dist

    if cuda:
        torch.cuda.set_device(device_of(cuda))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


def cuda_p2p_group(cuda: bool, *, opt_in: bool = True, timeout_s: float | None = None,
                   **options):
    """A cuda_p2p group over every rank with its workspace on the device under test.

    On a GPU with W >= 2 its CUDA side is a second Gloo group (backend "cuda_p2p_nonccl" of
    tests/python/gpu/test_gpu.py): NCCL refuses two ranks on one GPU. The workspace is put on the
    device explicitly: tests/python/conftest.py, which test_gpu imports, sets
    CUDA_P2P_WORKSPACE_DEVICE=cpu for the CPU suite.
    """
    from datetime import timedelta

    import torch.distributed as dist

    import cuda_p2p

    o = cuda_p2p.ProcessGroupCudaP2P.Options()
    o.cuda_workspace_collectives = opt_in
    o.workspace_device = "cuda" if cuda else "cpu"
    for k, v in options.items():
        setattr(o, k, v)
    backend = "cuda_p2p"
    if cuda and dist.get_world_size() > 1:
        import test_gpu  # registers cuda_p2p_nonccl

        backend = test_gpu.NONCCL
    kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    group = dist.new_group(backend=backend, pg_options=o, **kw)
    b = cuda_p2p.get_cuda_p2p_backend(group)
    if not b.is_p2p_available():
        raise AssertionError(f"the workspace is unavailable: {b.p2p_unavailable_reason()}")
    where = b.get_collective_config()["workspace_device"]
    if where != ("cuda" if cuda else "cpu"):
        raise AssertionError(f"the group's workspace is on {where}, expected the device under test")
    return group


def within(seconds: float, fn, *args):
    """(finished, result or exception, seconds taken) of fn(*args) run in a thread, waited for
    at most `seconds`: a call that never returns (a stream blocked for good) is reported, not
    hung on. The thread is left behind then (_rank_entry exits with os._exit)."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    took = time.monotonic() - t0
    if t.is_alive():
        return False, None, took
    return True, box.get("error", box.get("result")), took


def main_exit(failed: list[str], name: str) -> int:
    print(f"{name}: " + ("; ".join(failed) if failed else "every run passed"), flush=True)
    return 1 if failed else 0
