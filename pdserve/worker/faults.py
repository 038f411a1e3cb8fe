"""Test-only fault injection in a worker's engine, switched on by environment variables.

Nothing here is reachable from HTTP: the variables must be set in the server's environment
(worker processes inherit it). With `PDSERVE_FAULT_RAISE_TOKEN=<id>` the model's forward
pass raises `RuntimeError` for any batch that computes token `<id>` (a prompt holding it
fails its prefill chunk), the way a request that trips an engine bug would; with
`PDSERVE_FAULT_EXIT_TOKEN=<id>` the worker process exits at once (`os._exit(70)`), the
way a crash in native code would; with `PDSERVE_FAULT_START_EXIT_INSTANCE=<id>` that
instance's worker exits before it reports ready (a worker that cannot start), and with
`PDSERVE_FAULT_START_DELAY_S=<s>` every worker waits that long before it reports ready (a
slow start, to stop the server during it). Tests use them to check that such a request
fails alone and that its worker survives, or is restarted.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pdserve.engine.engine import Engine
from pdserve.engine.model import ForwardBatch

RAISE_TOKEN_ENV = "PDSERVE_FAULT_RAISE_TOKEN"
EXIT_TOKEN_ENV = "PDSERVE_FAULT_EXIT_TOKEN"
START_EXIT_ENV = "PDSERVE_FAULT_START_EXIT_INSTANCE"
START_DELAY_ENV = "PDSERVE_FAULT_START_DELAY_S"
CRASH_EXIT_CODE = 70


class FaultyModel:
    """Wraps the engine's model; trips on batches that compute a chosen token."""

    def __init__(self, model: Any, raise_token: int | None, exit_token: int | None) -> None:
        self.inner = model
        self.config = model.config
        self.raise_token = raise_token
        self.exit_token = exit_token

    def __call__(self, batch: ForwardBatch, pool: Any) -> Any:
        tokens = set(batch.token_ids.tolist())
        if self.exit_token in tokens:
            os._exit(CRASH_EXIT_CODE)
        if self.raise_token in tokens:
            raise RuntimeError(f"injected fault: token {self.raise_token} in the batch")
        return self.inner(batch, pool)


def exit_at_start_from_env(instance_id: int) -> None:
    if os.environ.get(START_EXIT_ENV) == str(instance_id):
        os._exit(CRASH_EXIT_CODE)
    if os.environ.get(START_DELAY_ENV):
        time.sleep(float(os.environ[START_DELAY_ENV]))


def install_from_env(engine: Engine) -> None:
    raise_token, exit_token = os.environ.get(RAISE_TOKEN_ENV), os.environ.get(EXIT_TOKEN_ENV)
    if raise_token or exit_token:
        engine.model = FaultyModel(engine.model, int(raise_token) if raise_token else None,
                                   int(exit_token) if exit_token else None)
