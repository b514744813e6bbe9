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


def group_that_times_out(ctx, seconds: float, **new_group_kwargs):
    """A new cuda_p2p group over all ranks whose ops time out after `seconds`, for a test where
    a rank never arrives. Created with the harness's long timeout (creating a group exchanges the
    ranks' workspace records under the group's timeout, and a loaded machine may take longer than
    a short one for that), then shortened; the ranks leave a Gloo barrier together before the
    caller's first op, so that only the rank that stays away can be late by the short timeout."""
    from datetime import timedelta

    from _harness import PG_TIMEOUT_S

    g = dist.new_group(backend="cuda_p2p", timeout=timedelta(seconds=PG_TIMEOUT_S),
                       **new_group_kwargs)
    dist.set_timeout(timedelta(seconds=seconds), group=g)
    dist.barrier(group=ctx.gloo)
    return g
