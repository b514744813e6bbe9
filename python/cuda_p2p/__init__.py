"""cuda_p2p: a c10d backend that overlaps tensor-parallel GEMMs with their communication.

``import cuda_p2p`` registers the backend; then
``torch.distributed.init_process_group(backend="cuda_p2p")`` (or ``new_group``) uses it.
"""

import torch
import torch.distributed  # noqa: F401  (registers torch's c10d classes before our extension)

from . import (
    _C,
    _autograd,  # noqa: F401  (registers the fused ops' backward formulas)
)
from ._async_tp import (
    async_tp,
    async_tp_report,
    disable_async_tp,
    enable_async_tp,
    is_async_tp_enabled,
)
from ._backend import (
    BACKEND_NAME,
    ProcessGroupCudaP2P,
    check,
    get_cuda_p2p_backend,
    is_cuda_p2p_group,
)
from ._collectives import all_gather_v, all_reduce_, all_to_all_v
from ._symmetric import empty, get_mem_pool, is_symmetric, use_symmetric_memory
from .ops import (
    fused_all_gather_matmul,
    fused_all_gather_scaled_matmul,
    fused_matmul_reduce_scatter,
    fused_scaled_matmul_reduce_scatter,
)

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupCudaP2P",
    "all_gather_v",
    "all_to_all_v",
    "all_reduce_",
    "check",
    "empty",
    "get_mem_pool",
    "is_symmetric",
    "use_symmetric_memory",
    "async_tp",
    "async_tp_report",
    "disable_async_tp",
    "enable_async_tp",
    "is_async_tp_enabled",
    "get_cuda_p2p_backend",
    "is_cuda_p2p_group",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
    "fused_all_gather_scaled_matmul",
    "fused_scaled_matmul_reduce_scatter",
]

__version__ = "0.1.0"

del _C
