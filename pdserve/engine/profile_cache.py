"""The quick start-up profile of `pdserve serve`, kept per machine so that only the first
start of a model pays for it (on the 135M default model the quick grid takes 0.5-2 minutes
on 2 cores; a start from the cache takes no measurable time).

The key covers what the profile depends on: the model's weights (their shared file's key, or
a named model's name), the grid, the KV pool size, and the machine (host name, architecture,
CPU count, torch version). Delete the file the start-up log names to measure again, or pass
`--perf-model` to use a profile of your own.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Callable

import torch

from pdserve.engine.profile import QUICK_GRID, profile_engine
from pdserve.engine.weight_cache import cache_dir
from pdserve.perf.fitted import PerfModel


def start_up_profile(model_spec: str, weights_identity: str, kv_blocks: int,
                     progress: Callable[[str], None] | None = None) -> tuple[PerfModel, str]:
    """(the performance model, "cached <file>" or "measured, saved to <file>")."""
    identity = "|".join([weights_identity, repr(QUICK_GRID), str(kv_blocks), platform.node(),
                         platform.machine(), str(os.cpu_count()), torch.__version__])
    path = cache_dir() / f"profile-{hashlib.sha256(identity.encode()).hexdigest()[:24]}.json"
    if path.is_file():
        try:
            return PerfModel.load(path), f"cached {path}"
        except ValueError:
            path.unlink(missing_ok=True)  # unreadable: measure again
    model = profile_engine(model_spec, kv_blocks, QUICK_GRID, progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        model.save(partial)
        os.replace(partial, path)
    except OSError as err:
        return model, f"measured (not cached: {err})"
    return model, f"measured, saved to {path}"
