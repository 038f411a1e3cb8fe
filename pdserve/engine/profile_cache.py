"""The quick start-up profile of `pdserve serve`, kept per machine so that only the first
start of a model pays for it (on the 135M default model the quick grid takes 0.5-2 minutes
on 2 cores; a start from the cache takes no measurable time). The server measures it in the
background (`background_profile.py`) while it serves on a provisional model.

The key covers what the profile depends on: the model's weights (their shared file's key, or
a named model's name), the grid, the KV pool size, and the machine (host name, architecture,
CPU count, torch version). A file is named `profile-<model and machine>-<rest>.json`, so
`earlier_profile` finds a profile of the same weights on the same machine measured for
another KV pool size, grid or torch version (the provisional model's best source). Delete
the file the start-up log names to measure again, or pass `--perf-model` to use a profile
of your own.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from pdserve.engine.profile import QUICK_GRID, profile_engine
from pdserve.engine.weight_cache import cache_dir
from pdserve.perf.fitted import PerfModel
from pdserve.types import KV_BLOCK_TOKENS


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _model_and_machine(weights_identity: str) -> str:
    return _digest(weights_identity, platform.node(), platform.machine(), str(os.cpu_count()))


def profile_path(weights_identity: str, kv_blocks: int) -> Path:
    """Where the start-up profile of these weights and this KV pool size on this machine is
    kept."""
    rest = _digest(repr(QUICK_GRID), str(kv_blocks), torch.__version__)
    return cache_dir() / f"profile-{_model_and_machine(weights_identity)}-{rest}.json"


def cached_profile(weights_identity: str, kv_blocks: int) -> tuple[PerfModel, str] | None:
    """The kept start-up profile and "cached <file>", or None (never measured, or the file
    is unreadable: then it is removed, to be measured again)."""
    path = profile_path(weights_identity, kv_blocks)
    if not path.is_file():
        return None
    try:
        return PerfModel.load(path), f"cached {path}"
    except ValueError:
        path.unlink(missing_ok=True)
        return None


def _modified_s(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def earlier_profile(weights_identity: str, kv_blocks: int) -> tuple[PerfModel, str] | None:
    """The newest start-up profile of the same weights on this machine kept for another KV
    pool size, grid or torch version, its KV capacity set to `kv_blocks` blocks, and where
    it came from; None if there is none."""
    own = profile_path(weights_identity, kv_blocks)
    found = sorted(cache_dir().glob(f"profile-{_model_and_machine(weights_identity)}-*.json"),
                   key=_modified_s, reverse=True)
    for path in found:
        if path == own:
            continue
        try:
            model = PerfModel.load(path)
        except (ValueError, OSError):
            continue
        return (replace(model, kv_capacity_tokens=kv_blocks * KV_BLOCK_TOKENS),
                f"the start-up profile of these weights on this machine for other settings "
                f"({path})")
    return None


def start_up_profile(model_spec: str, weights_identity: str, kv_blocks: int,
                     progress: Callable[[str], None] | None = None,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[PerfModel, str]:
    """(the performance model, "cached <file>" or "measured, saved to <file>"); `clock` as
    `profile.measure_engine` takes it."""
    cached = cached_profile(weights_identity, kv_blocks)
    if cached is not None:
        return cached
    model = profile_engine(model_spec, kv_blocks, QUICK_GRID, progress, clock=clock)
    path = profile_path(weights_identity, kv_blocks)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        model.save(partial)
        os.replace(partial, path)
    except OSError as err:
        return model, f"measured (not cached: {err})"
    return model, f"measured, saved to {path}"


def background_start_up_profile(model_spec: str, weights_identity: str, kv_blocks: int,
                                progress: Callable[[str], None] | None = None
                                ) -> tuple[PerfModel, str]:
    """`start_up_profile` as the server's background profile runs it: measuring CPU time,
    so the workers preempting it do not inflate its points."""
    return start_up_profile(model_spec, weights_identity, kv_blocks, progress,
                            clock=time.thread_time)
