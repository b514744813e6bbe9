"""A DTensor tensor-parallel MLP trained under torch.compile with cuda_p2p's async-TP pass.

    torchrun --nproc-per-node 2 examples/async_tp_training.py

enable_async_tp() makes inductor rewrite the model's all-gather + matmul and matmul +
reduce-scatter on cuda_p2p groups into the fused ops, forward and backward (docs/training.md).
On CPUs the fused pipeline pays off only for large GEMMs (Options.fused_min_flops, 8 GFLOP by
default); this toy model sets it to 0 so that the pipeline itself runs.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import cuda_p2p

D, HIDDEN, TOKENS = 16, 32, 8  # tiny, so that CI compiles it quickly

options = cuda_p2p.ProcessGroupCudaP2P.Options()
options.fused_min_flops = 0  # the fused pipeline at any size (for the demonstration)
dist.init_process_group(backend="cuda_p2p", pg_options=options)
rank = dist.get_rank()
cuda_p2p.enable_async_tp()

torch.manual_seed(0)  # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, HIDDEN), torch.nn.ReLU(),
                            torch.nn.Linear(HIDDEN, D))
mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
model = parallelize_module(model, mesh, {
    "0": SequenceParallel(sequence_dim=0),            # LayerNorm on this rank's tokens
    "1": ColwiseParallel(input_layouts=Shard(0)),     # all-gather tokens + matmul
    "3": RowwiseParallel(output_layouts=Shard(0)),    # matmul + reduce-scatter tokens
})
step = torch.compile(model, fullgraph=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for i in range(3):
    torch.manual_seed(100 * i + rank)  # each rank its own tokens (the sequence is sharded)
    x, target = torch.randn(TOKENS, D), torch.randn(TOKENS, D)
    opt.zero_grad()
    loss = ((step(x) - target) ** 2).mean()
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"step {i}: loss {total.item():.4f}")

counters = cuda_p2p.get_cuda_p2p_backend().get_counters()
fused = {k: v for k, v in counters.items() if k.startswith("fused_")}
if rank == 0:
    print(f"fused ops that ran (forward and backward): {fused}")
for op in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter"):
    ran = sum(fused.get(f"{op}.{algo}", 0) for algo in ("pipeline", "pull_ahead", "ring"))
    assert ran > 0, f"{op} did not run as a fused pipeline: {counters}"
dist.destroy_process_group()
