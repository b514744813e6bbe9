"""What cuda_p2p is doing here: ``python -m cuda_p2p`` and the ``CUDA_P2P_DEBUG=INFO`` lines.

``python -m cuda_p2p`` (like ``python -m torch.utils.collect_env``) prints the versions, the
build and the devices; under ``torchrun``, or with ``--world-size N`` (it then starts N local
ranks itself), it also creates a cuda_p2p group and prints, for every rank, whether the workspace
came up and on which device, which paths the collectives take and why any path is off, and each
knob's value and where it came from (Options, environment, default). The group's
``CUDA_P2P_DEBUG=INFO`` line (written by python/cuda_p2p/_backend.py when it creates a group) is
made here from the same facts (NOTE [Debug lines] in backend/config.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

import torch
import torch.distributed as dist

_MIB = 1 << 20


def environment() -> dict:
    """Versions, build and devices: what needs no process group."""
    from . import _C, __version__

    if not dist.is_nccl_available():
        nccl = "torch has no NCCL"
    else:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - reported, not raised
            nccl = f"unreadable ({type(e).__name__}: {e})"
        if not torch.cuda.is_available():
            nccl += " (no GPU visible: groups wrap no NCCL)"
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(f"cuda:{i} {p.name} (sm_{p.major}{p.minor}, {p.total_memory // _MIB} MiB)")
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 0
    return {
        "cuda_p2p": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nccl": nccl,
        "gloo": dist.is_gloo_available(),
        "python": platform.python_version(),
        "build": dict(_C._build_info()),
        "cpus": cpus,
        "gpus": gpus,
    }


def group_facts(backend, group=None) -> dict:
    """What one rank's group is doing: its workspace, the paths and why any is off, its knobs."""
    cfg = backend.get_collective_config()
    size = backend.size()
    facts = {
        "rank": backend.rank(),
        "world_size": size,
        "group": backend.options.group_name,
        "workspace": backend.is_p2p_available(),
        "workspace_reason": backend.p2p_unavailable_reason(),
        "workspace_device": None,
        "buffer_bytes": backend.get_buffer_size(),
        "block_memory": backend._block_memory(),
        "collectives": cfg["workspace_collectives"],
        "collectives_reason": cfg["workspace_collectives_reason"],
        "cross_memory": cfg["cross_memory"],
        "cross_memory_reason": cfg["cross_memory_reason"],
        "hierarchy": None,
        "wrapped": [],
        "fused_min_flops": cfg["fused_min_flops"],  # for the workspace's tensors
        "mailbox_slot_bytes": cfg["mailbox_slot_bytes"],
        "knobs": [dict(k) for k in backend._knob_values()],
        "counters": dict(backend.get_counters()),
    }
    if facts["workspace"]:
        facts["workspace_device"] = str(backend.symmetric_device())
    for device, name in dict(backend._wrapped_backends()).items():
        facts["wrapped"].append(f"{name} ({device} tensors)")
    # The value each collective knob resolved to for this group (the table's defaults are text).
    resolved = dict(cfg, workspace_device=facts["workspace_device"] or "none")
    for k in facts["knobs"]:
        if k["option"] in resolved and str(resolved[k["option"]]) != k["value"]:
            k["resolved"] = resolved[k["option"]]
    h = backend.hierarchy()
    if h is not None:
        facts["hierarchy"] = {"hosts": [list(x) for x in h["hosts"]], "host": h["host"],
                              "even": h["even"]}
    return facts


def _paths(f: dict) -> list[tuple[str, str]]:
    """(what, where it runs and why) for the report and the debug line."""
    out = []
    if f["workspace"]:
        out.append(("workspace", f"up on {f['workspace_device']}, "
                    f"{f['buffer_bytes'] // _MIB} MiB buffer per rank, "
                    f"blocks: {f['block_memory']}"))
    else:
        out.append(("workspace", f"off: {f['workspace_reason']}"))
    on_host = f["workspace_device"] == "cpu"
    has_nccl = any(w.startswith("nccl") for w in f["wrapped"])
    if f["collectives"]:
        where = "CPU tensors" if on_host else "CUDA tensors"
        other = ("CPU tensors go to Gloo" if not on_host else "CUDA tensors go to NCCL"
                 if has_nccl else "no backend for CUDA tensors (no GPU when the group was made)")
        out.append(("collectives", f"on the workspace for {where}; {other}"))
    elif f["hierarchy"] is not None:
        hosts = f["hierarchy"]["hosts"]
        out.append(("collectives", f"hierarchical over {len(hosts)} hosts (CPU tensors): "
                    "each host's workspace, then the wrapped backend between hosts"))
    else:
        out.append(("collectives", f"wrapped backend: {f['collectives_reason']}"))
    out.append(("cross-memory",
                "on" if f["cross_memory"] else f"off: {f['cross_memory_reason']}"))
    # docs/send_recv.md: the mailboxes serve CPU tensors on a host workspace.
    if f["collectives"] and on_host:
        slot = f["mailbox_slot_bytes"]
        size = f"{slot // _MIB} MiB" if slot % _MIB == 0 else f"{slot // 1024} KiB"
        out.append(("send/recv", f"mailboxes for CPU tensors (two {size} slots per pair of "
                    "ranks)" + ("; CUDA tensors go to NCCL" if has_nccl else "")))
    else:
        out.append(("send/recv", "wrapped backend"))
    fused = [k for k in f["knobs"] if k["option"] == "fused_min_flops"][0]
    tensors = "CPU" if on_host else "CUDA"
    out.append(("fused ops", "on the workspace: the fused pipeline from "
                f"{f['fused_min_flops']} GEMM flops per rank on {tensors} tensors "
                f"(fused_min_flops, {fused['source']}), the unfused collective + matmul below"
                if f["workspace"] else "decomposed over the wrapped backend (no workspace)"))
    if f["wrapped"]:
        out.append(("wrapped", ", ".join(f["wrapped"])))
    return out


def group_line(backend) -> str:
    """The CUDA_P2P_DEBUG=INFO line of a group just created (NOTE [Debug lines])."""
    f = group_facts(backend)
    parts = [f"{what}: {how}" for what, how in _paths(f)]
    set_knobs = [f"{k['option'] or k['env']}={k['value']} ({k['source']})"
                 for k in f["knobs"] if k["source"] != "default"]
    parts.append("knobs: " + (", ".join(set_knobs) if set_knobs else "all defaults"))
    return (f"cuda_p2p INFO rank {f['rank']}/{f['world_size']} group {f['group']}: "
            + "; ".join(parts))


def _format_environment(env: dict) -> list[str]:
    b = env["build"]
    return [
        "cuda_p2p diagnostic (python -m cuda_p2p)",
        "",
        f"cuda_p2p:          {env['cuda_p2p']}",
        f"torch:             {env['torch']} (CUDA {env['torch_cuda'] or 'none'})",
        f"NCCL:              {env['nccl']}",
        f"Gloo:              {'available' if env['gloo'] else 'unavailable'}",
        f"Python:            {env['python']}",
        f"CUDA compiled in:  {'yes, architectures ' + b['cuda_archs'] if b['cuda'] else 'no'}",
        f"host reduction:    {b['host_reduction']}",
        f"CPUs (this process may use): {env['cpus']}",
        "GPUs visible to torch: " + (", ".join(env["gpus"]) if env["gpus"] else "none"),
    ]


def _format_group(reports: list[dict]) -> list[str]:
    lines = ["", f"group of {len(reports)} rank(s), backend cuda_p2p:"]
    for f in reports:
        lines.append(f"  rank {f['rank']}:")
        lines += [f"    {what + ':':17s}{how}" for what, how in _paths(f)]
    f0 = reports[0]
    lines += ["", "knobs (rank 0): value [-> what it resolved to here] (where it came from)"]
    width = max(len(k["option"] or k["env"]) for k in f0["knobs"])
    for k in f0["knobs"]:
        name = k["option"] or k["env"]
        env = f" [{k['env']}]" if k["option"] and k["env"] else ""
        now = f" -> {k['resolved']}" if "resolved" in k else ""
        lines.append(f"  {name:{width}s}  {k['value']}{now}  ({k['source']}){env}")
    differ = [f["rank"] for f in reports[1:] if f["knobs"] != f0["knobs"]]
    if differ:
        lines.append(f"  (ranks {differ} have other values: see --json)")
    return lines


def _in_torchrun() -> bool:
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _rank_main(as_json: bool) -> int:
    """One rank: creates the default group, gathers every rank's facts, rank 0 prints them."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local % torch.cuda.device_count())
    import cuda_p2p

    dist.init_process_group(backend="cuda_p2p")
    try:
        backend = cuda_p2p.get_cuda_p2p_backend()
        mine = group_facts(backend)
        # Gathered over a Gloo group: on CPU tensors whatever the devices (all_gather_object on
        # the cuda_p2p group could pick CUDA tensors, i.e. NCCL, which refuses ranks sharing a GPU).
        gloo = dist.new_group(backend="gloo")
        reports: list = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, reports, dst=0, group=gloo)
        if dist.get_rank() == 0:
            env = environment()
            if as_json:
                print(json.dumps({"environment": env, "ranks": reports}, indent=1))
            else:
                print("\n".join(_format_environment(env) + _format_group(reports)))
            sys.stdout.flush()
    finally:
        dist.destroy_process_group()
    return 0


def _spawn(world_size: int, as_json: bool, timeout: float) -> int:
    """Starts `world_size` local ranks of this command, as torchrun would (env://)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world_size):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world_size), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        cmd = [sys.executable, "-m", "cuda_p2p"] + (["--json"] if as_json else [])
        procs.append(subprocess.Popen(cmd, env=env,
                                      stdout=None if r == 0 else subprocess.DEVNULL))
    status = 0
    try:
        for r, p in enumerate(procs):
            rc = p.wait(timeout=timeout)
            if rc != 0:
                print(f"cuda_p2p diagnostic: rank {r} exited with {rc}", file=sys.stderr)
                status = 1
    except subprocess.TimeoutExpired:
        print(f"cuda_p2p diagnostic: the ranks did not finish in {timeout:.0f} s",
              file=sys.stderr)
        status = 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuda_p2p",
        description="Reports what cuda_p2p is doing here: versions, build, devices; under "
        "torchrun or with --world-size, the group each rank gets (workspace, device, paths and "
        "why any is off, knobs and where they came from).")
    parser.add_argument("--world-size", type=int, default=None, metavar="N",
                        help="start N local ranks and report their group (as under torchrun)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds the --world-size ranks may take (default 120)")
    args = parser.parse_args(argv)
    if args.world_size is not None:
        if args.world_size < 1:
            parser.error(f"--world-size must be >= 1, got {args.world_size}")
        if _in_torchrun():
            parser.error("--world-size starts its own ranks: do not combine it with torchrun")
        return _spawn(args.world_size, args.json, args.timeout)
    if _in_torchrun():
        return _rank_main(args.json)
    env = environment()
    if args.json:
        print(json.dumps({"environment": env, "ranks": []}, indent=1))
    else:
        print("\n".join(_format_environment(env) + [
            "", "(no group: run it under torchrun, or with --world-size N, to see what a "
            "group does)"]))
    return 0
