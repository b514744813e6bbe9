"""Zero-copy collectives: tensors in the group's symmetric heap, which every peer maps.

    torchrun --nproc-per-node 2 examples/zero_copy.py

A collective stages its input into the workspace before peers read it. A tensor allocated in
the symmetric heap (cuda_p2p.empty, or any factory under use_symmetric_memory) is read by the
peers where it lies instead: the counters say `<op>.zero_copy`. Allocate symmetric tensors in the
same order on every rank (docs/collectives.md, "Zero-copy symmetric tensors").
"""

import torch
import torch.distributed as dist

import cuda_p2p

dist.init_process_group(backend="cuda_p2p")
rank, world = dist.get_rank(), dist.get_world_size()
backend = cuda_p2p.get_cuda_p2p_backend()
ROWS, COLS = 256, 64

# 1. cuda_p2p.empty: a tensor in this rank's heap (collective: every rank calls it).
shard = cuda_p2p.empty(ROWS, COLS, dtype=torch.float32)
shard.fill_(float(rank))
gathered = torch.empty(world * ROWS, COLS)
dist.all_gather_into_tensor(gathered, shard)  # peers copy `shard` straight from this rank's heap
expected = torch.arange(world, dtype=torch.float32).repeat_interleave(ROWS)[:, None]
expected = expected.expand(-1, COLS)
assert torch.equal(gathered, expected)

# 2. use_symmetric_memory: torch's factories allocate in the heap inside the block (on the host:
# empty/zeros/ones/full and their *_like; on a CUDA group every allocation of the thread).
with cuda_p2p.use_symmetric_memory():
    grads = torch.ones(world * ROWS, COLS)
assert cuda_p2p.is_symmetric(grads)
grads.mul_(rank + 1)
out = torch.empty(ROWS, COLS)
dist.reduce_scatter_tensor(out, grads)  # each rank reduces its chunk from every peer's heap
assert torch.equal(out, torch.full((ROWS, COLS), float(world * (world + 1) // 2)))

# 3. An ordinary tensor stages as always; the results are the same.
plain = torch.full((ROWS, COLS), float(rank))
dist.all_gather_into_tensor(gathered, plain)
assert torch.equal(gathered, expected)

counters = backend.get_counters()
if rank == 0:
    print(f"heap: {backend.symmetric_heap_info()}")
    print(f"counters: {dict(counters)}")
assert counters.get("all_gather.zero_copy") == 1, counters  # the heap input only
assert counters.get("reduce_scatter.zero_copy") == 1, counters
dist.destroy_process_group()
