"""Shared fixtures: a small hand-set performance model so tests do not depend on the roofline."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs

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


def pytest_configure(config: pytest.Config) -> None:
    """Checkpoint weight files (engine/weight_cache.py) go to a directory of this run, not
    the user's cache; spawned workers inherit it."""
    if "PDSERVE_CACHE_DIR" not in os.environ:
        os.environ["PDSERVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdserve-test-cache-")
        config.stash[_OWN_CACHE] = os.environ["PDSERVE_CACHE_DIR"]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_CACHE in config.stash:
        shutil.rmtree(config.stash[_OWN_CACHE], ignore_errors=True)
