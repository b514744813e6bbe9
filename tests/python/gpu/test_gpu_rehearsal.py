"""tests/python/gpu/test_gpu.py's device-neutral checks, run with CPU tensors on the host workspace.

GPU time is scarce (a lease of minutes, now and then): a fault of a check itself must show in CI,
not on the GPU. On the second GPU run the fused_matmul_reduce_scatter check seeded each rank's
inputs with hash() of a str, which differs from process to process, and every case at W >= 2
"differed"; here that fails on the CPU too. The checks are the same functions the GPU run calls;
only the device differs (test_gpu.rehearse_on_cpu). The CUDA-only checks (streams, the MemPool,
the GPU's free memory, the routing default of CUDA tensors, a rank that never arrives) are left
to the GPU.
"""

from __future__ import annotations

import pytest

import conftest
import test_gpu as g

CHECKS = [
    *[(f"all_gather-{a}", g.check_all_gather, (a,)) for a in g.ALL_GATHER_ALGOS],
    *[(f"reduce_scatter-{a}-{s}", g.check_reduce_scatter, (a, s))
      for a, s in g.REDUCE_SCATTER_ALGOS],
    *[(f"all_reduce-{a}", g.check_all_reduce, (a,)) for a in g.ALL_REDUCE_ALGOS],
    ("broadcast", g.check_broadcast, ()),
    ("all_gather_v", g.check_all_gather_v, ()),
    ("all_to_all", g.check_all_to_all, ()),
    ("gather_scatter", g.check_gather_scatter, ()),
    ("reduce", g.check_reduce, ()),
    *[(f"fused_all_gather_matmul-{a}", g.check_fused_all_gather_matmul, (a,))
      for a in ("pipeline", "pull_ahead")],
    *[(f"fused_matmul_reduce_scatter-{a}", g.check_fused_matmul_reduce_scatter, (a,))
      for a in ("pipeline", "ring")],
    ("growth_and_rounds", g.check_growth_and_rounds, ()),
    ("get_p2p_buffer", g.check_p2p_buffer, ()),
    ("zero_copy_collectives", g.check_zero_copy_collectives, ()),
    ("zero_copy_mismatch", g.check_zero_copy_mismatch, ()),
    ("deadlocked_root_mismatch", g.check_deadlocked_root_mismatch, ()),
    ("windows", g.check_windows, ()),
]


@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("check,args", [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_gpu_check_on_the_cpu(W, check, args):
    g._ok(conftest._world(W).run(g.rehearse_on_cpu, check, *args))
