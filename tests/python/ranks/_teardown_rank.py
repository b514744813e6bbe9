"""One rank of a job whose store's host exits first, started by test_faults.py.

Usage: _teardown_rank.py RANK WORLD PORT OUT_DIR

Four ranks on two simulated hosts ({0, 1} and {2, 3}: CUDA_P2P_HOST_ID), so the default group
runs hierarchically and each host has an intra-host workspace. Rank 0 hosts the TCPStore. After a
checked all_reduce, ranks 0 and 1 destroy the group and rank 0 exits (its store with it); ranks
2 and 3 destroy theirs only once rank 0 is gone, so that their intra-host workspace's closing
handshake meets a dead store (NOTE [Quiet teardown] in p2p_workspace/store_probe.cpp). Events as
JSON lines in OUT_DIR/rank<R>.jsonl: "checked", "destroyed" (with the seconds the teardown took).
"""

import datetime
import faulthandler
import gc
import json
import os
import sys
import time

rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["CUDA_P2P_HOST_ID"] = f"sim-host-{rank // 2}"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import cuda_p2p  # noqa: E402

out = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)


def event(kind, **kw):
    out.write(json.dumps(dict(kind=kind, rank=rank, t=time.time(), **kw)) + "\n")


# The rendezvous waits as long as _fault_rank.py's (a loaded machine's imports), then nothing
# may hang.
faulthandler.dump_traceback_later(240, exit=True)
store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                      timeout=datetime.timedelta(seconds=180))
faulthandler.dump_traceback_later(60, exit=True)
dist.init_process_group("cuda_p2p", store=store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=10))  # test_faults.TEARDOWN_TIMEOUT_S
t = torch.full((64,), float(rank + 1))
dist.all_reduce(t)
counters = cuda_p2p.get_cuda_p2p_backend().get_counters()
assert torch.equal(t, torch.full((64,), world * (world + 1) / 2)), t[:4]
event("checked", counters=counters)
dist.barrier()
marker = os.path.join(out_dir, "rank0-exited")
if rank >= 2:
    while not os.path.exists(marker):
        time.sleep(0.05)
    time.sleep(0.5)  # the marker is written just before the exit
t0 = time.monotonic()
dist.destroy_process_group()
del store
gc.collect()
event("destroyed", seconds=time.monotonic() - t0)
out.close()
sys.stdout.flush()
sys.stderr.flush()
if rank == 0:
    open(marker, "w").close()
os._exit(0)
