"""cuda_p2p groups a rank process creates once and reuses across the tests it runs."""

from __future__ import annotations

import torch.distributed as dist

import cuda_p2p
from _harness import scoped_environ

_groups: dict = {}


def cached_group(key, env=None, **options):
    """A cuda_p2p group over all ranks with these Options, created on first use (collective: every
    rank asks for the same keys in the same order; the options may differ by rank), then reused.
    `env`: environment variables set while the group is created (its knobs read them then).
    Cached by `key`, the options and `env`, so that two test files never share a group by
    accident."""
    k = (key, tuple(sorted(options.items())), tuple(sorted((env or {}).items())))
    if k not in _groups:
        o = cuda_p2p.ProcessGroupCudaP2P.Options()
        for name, value in options.items():
            setattr(o, name, value)
        with scoped_environ(env or {}):
            _groups[k] = dist.new_group(backend="cuda_p2p", pg_options=o)
    return _groups[k]
