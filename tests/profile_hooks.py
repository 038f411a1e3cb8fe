"""Start-up profiles a test injects into a server (`build_app(config, measure=...)`): run in
the server's background profile process, so they live in a module that imports little."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs

RELEASE_ENV = "PDSERVE_TEST_PROFILE_RELEASE"  # a file whose creation ends `slow_profile`


def profiled(kv_blocks: int) -> PerfModel:
    """What the injected profile measures: recognisably not the provisional model."""
    return PerfModel("test profile", PrefillCoeffs(0.01, 2e-5, 1e-9),
                     DecodeCoeffs(0.008, 1e-4, 2e-7, 0.001), TransferCoeffs(1e-3, 1e10),
                     kv_bytes_per_token=100_000, kv_capacity_tokens=kv_blocks * 16)


def slow_profile(model_spec: str, weights_identity: str, kv_blocks: int,
                 progress=None) -> tuple[PerfModel, str]:  # type: ignore[no-untyped-def]
    """Waits until the test creates the file $PDSERVE_TEST_PROFILE_RELEASE names (at most
    120 s); says it is waiting with a file of its own (that name + `.waiting`)."""
    release = Path(os.environ[RELEASE_ENV])
    release.with_suffix(".waiting").touch()
    deadline = time.monotonic() + 120
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the profile")
        time.sleep(0.05)
    return profiled(kv_blocks), "the test's profile"


def failing_profile(model_spec: str, weights_identity: str, kv_blocks: int,
                    progress=None) -> tuple[PerfModel, str]:  # type: ignore[no-untyped-def]
    raise RuntimeError("the engine could not be measured")
