"""Launching a cuda_p2p job on GPUs: one process per GPU, each bound to its own device.

    torchrun --nproc-per-node <GPUs on this host> examples/gpu_launch.py

Without cuda_p2p installed the same script runs on plain NCCL. With it, ordinary collectives on
CUDA tensors still go to the wrapped NCCL backend by default (the workspace collectives on GPUs
are opt-in until they have run across GPUs: Options.cuda_workspace_collectives), while the fused
ops run on the group's CUDA workspace. The counters say which path ran. What has run on a GPU so
far: one H200 shared by 1-4 ranks (docs/status.md); this script is run
there by scripts/gpu_check.sh, on one rank.
"""

import os

import torch
import torch.distributed as dist

try:
    import cuda_p2p
except ImportError:  # the NCCL fallback: nothing below needs cuda_p2p to be correct
    cuda_p2p = None

local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.device_count() <= local_rank:
    raise SystemExit(f"rank {local_rank}: only {torch.cuda.device_count()} GPU(s) visible; "
                     "start one process per GPU (torchrun --nproc-per-node <GPUs>)")
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)  # before init: NCCL and the workspace take the current GPU

backend = "cuda_p2p" if cuda_p2p is not None else "nccl"
dist.init_process_group(backend=backend, device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()

# An ordinary collective on a CUDA tensor (NCCL, on either backend, unless opted in).
t = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(t)
assert torch.all(t == world * (world + 1) / 2)

# A tensor-parallel GEMM with its all-gather, fused (plain torch when cuda_p2p is missing).
torch.manual_seed(rank)
x_shard = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
w = torch.randn(256, 128, device=device, dtype=torch.bfloat16)  # this rank's column shard
if cuda_p2p is not None:
    x_full, (y,) = cuda_p2p.fused_all_gather_matmul(x_shard, [w.t()], gather_dim=0)
else:
    x_full = torch.empty(world * 64, 128, device=device, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(x_full, x_shard)
    y = x_full @ w.t()
torch.testing.assert_close(y, x_full @ w.t(), rtol=2e-2, atol=2e-2)
torch.cuda.synchronize()

if rank == 0:
    print(f"backend {backend}, {world} rank(s), GPU {torch.cuda.get_device_name(device)}: ok")
    if cuda_p2p is not None:
        print(f"counters: {dict(cuda_p2p.get_cuda_p2p_backend().get_counters())}")
dist.destroy_process_group()
