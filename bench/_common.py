"""What the benchmark scripts share."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
