"""What the benchmark scripts share."""

import os
import socket


def host_workspace() -> None:
    """These benchmarks measure the host workspace (CPU tensors). On a machine with a GPU a
    group's workspace would be on the GPU and the CPU tensors would go to Gloo (NOTE [The
    workspace's device] in backend/ProcessGroupCudaP2P.cpp): keep it on the host unless the
    caller chose otherwise. Called before any group is created, in every rank."""
    os.environ.setdefault("CUDA_P2P_WORKSPACE_DEVICE", "cpu")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
