"""Tensor-parallel inference of a small attention + MLP block on CPU ranks.

    torchrun --nproc-per-node 2 examples/cpu_tp_inference.py

Megatron-style sharding: the attention heads and the MLP's hidden units are split across the
ranks; each block ends in one all-reduce, which cuda_p2p runs on its shared-memory workspace.
Every rank builds the full weights from one seed and keeps its shard, so the result is checked
against the same block run whole in this process.
"""

import torch
import torch.distributed as dist

import cuda_p2p

D, HEADS, FFN, SEQ = 64, 4, 256, 16  # model dim, attention heads, MLP hidden, tokens

dist.init_process_group(backend="cuda_p2p")
rank, world = dist.get_rank(), dist.get_world_size()
assert HEADS % world == 0 and FFN % world == 0, "the heads and hidden units must split evenly"
torch.manual_seed(0)  # the same full weights on every rank
wq, wk, wv, wo = (torch.randn(D, D) / D**0.5 for _ in range(4))
w_up, w_down = torch.randn(FFN, D) / D**0.5, torch.randn(D, FFN) / FFN**0.5
x = torch.randn(SEQ, D)  # the same input on every rank


def attention(x, wq, wk, wv, wo, heads):
    q, k, v = (t.view(SEQ, heads, -1).transpose(0, 1) for t in (x @ wq.T, x @ wk.T, x @ wv.T))
    ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return ctx.transpose(0, 1).reshape(SEQ, -1) @ wo.T


def mlp(x, w_up, w_down):
    return torch.nn.functional.gelu(x @ w_up.T) @ w_down.T


# This rank's shards: rows of the column-parallel weights, columns of the row-parallel ones.
hd = D // HEADS * (HEADS // world)  # this rank's share of the attention width
cols = slice(rank * hd, (rank + 1) * hd)
ff = slice(rank * FFN // world, (rank + 1) * FFN // world)

with torch.inference_mode():
    # Attention: local heads, then the row-parallel output projection's partial sums are added.
    h = attention(x, wq[cols], wk[cols], wv[cols], wo[:, cols], HEADS // world)
    dist.all_reduce(h)  # the workspace's one-shot / two-shot all-reduce
    h = x + h
    # MLP: column-parallel up projection, row-parallel down projection, one all-reduce.
    y = mlp(h, w_up[ff], w_down[:, ff])
    dist.all_reduce(y)
    y = h + y

    # The same block, whole, in this process.
    ref_h = x + attention(x, wq, wk, wv, wo, HEADS)
    ref = ref_h + mlp(ref_h, w_up, w_down)

err = (y - ref).abs().max().item()
counters = cuda_p2p.get_cuda_p2p_backend().get_counters()
if rank == 0:
    print(f"{world} ranks: max |tensor-parallel - whole| = {err:.2e}")
    print(f"counters: {dict(counters)}")
assert err < 1e-4, f"rank {rank}: the tensor-parallel block differs from the whole one by {err}"
assert not any(k.endswith(".wrapped") for k in counters), f"a fallback ran: {counters}"
dist.destroy_process_group()
