"""Shared fixtures: a small hand-set performance model so tests do not depend on the
roofline, and the internal parameter objects built from the config tree's defaults (their
constructors state no defaults of their own)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any

import pytest

from pdserve.config import Config, serve_defaults
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.prefix_cache import PrefixCache
from pdserve.instance.queue_order import QueueOrder
from pdserve.live.processes import WorkerSettings
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.policies.setup import PolicyConfig, PolicySetup
from pdserve.sim.records import SimSettings
from pdserve.sim.runner import policy_setup as policy_setup_of
from pdserve.sim.runner import sim_settings as sim_settings_of
from pdserve.types import SLO

_OWN_CACHE = pytest.StashKey[str]()


def make_perf(kv_capacity_tokens: int = 1 << 20) -> PerfModel:
    return PerfModel(
        name="test",
        prefill=PrefillCoeffs(intercept_s=0.01, per_token_s=2e-5, per_attn_unit_s=1e-9),
        decode=DecodeCoeffs(intercept_s=0.008, per_seq_s=1e-4, per_context_token_s=2e-7,
                            batch1_extra_s=0.001),
        transfer=TransferCoeffs(per_call_s=1e-3, bytes_per_s=1e10),
        kv_bytes_per_token=100_000,
        kv_capacity_tokens=kv_capacity_tokens)


@pytest.fixture
def perf() -> PerfModel:
    return make_perf()


def policy_setup(perf: PerfModel, slo: SLO, policy: PolicyConfig | None = None,
                 **changes: Any) -> PolicySetup:
    """Building `policy` (the default preset's) on the default config's cluster and
    instances, with `changes` (`PolicySetup` fields)."""
    setup = policy_setup_of(Config(), perf)
    return replace(setup, slo=slo, policy=policy or setup.policy, **changes)


def sim_settings(**changes: Any) -> SimSettings:
    """The simulator's settings of a run of the default config with KV transfers priced
    by block alignment (what these tests were written against), with `changes`."""
    aligned = Config().with_values({"sim.transfer_mode": "aligned"})
    return replace(sim_settings_of(aligned), **changes)


def local_scheduler(instance_id: int, total_blocks: int, chunk_size_tokens: int,
                    max_batch_size: int | None = None,
                    queue_order: QueueOrder | None = None,
                    prefix_cache: PrefixCache | None = None) -> LocalScheduler:
    """A local scheduler batching the default config's `instance.max_batch_size` unless
    told otherwise."""
    return LocalScheduler(instance_id, total_blocks, chunk_size_tokens,
                          max_batch_size or Config().instance.max_batch_size, queue_order,
                          prefix_cache=prefix_cache)


def worker_settings(**changes: Any) -> WorkerSettings:
    """Workers as `pdserve serve` sets them by default (`serve_defaults()`), on the random
    `tiny` model with 2048 KV blocks, decode first and no prefix cache, with `changes`."""
    config = serve_defaults()
    return replace(WorkerSettings("tiny", config.seed, 2048, config.instance.chunk_size_tokens,
                                  config.instance.max_batch_size,
                                  PhasePriority.DECODE_FIRST.value, 0), **changes)


def pytest_configure(config: pytest.Config) -> None:
    """Checkpoint weight files (engine/weight_cache.py) go to a directory of this run, not
    the user's cache; spawned workers inherit it."""
    if "PDSERVE_CACHE_DIR" not in os.environ:
        os.environ["PDSERVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdserve-test-cache-")
        config.stash[_OWN_CACHE] = os.environ["PDSERVE_CACHE_DIR"]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_CACHE in config.stash:
        shutil.rmtree(config.stash[_OWN_CACHE], ignore_errors=True)
