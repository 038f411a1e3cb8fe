"""ARES's worker side in a live worker: the decode-load forecast sent with every stats
report (`instance/decode_forecast.py`; `../shared/papers/ares.md`, sec. 5.2: workers
pre-compute their local future-load simulation and report it to the scheduler).

A live worker does not know how long a request will run: its `Request.output_tokens` is
`max_tokens`. `oracle` cannot run here; `noisy` perturbs the `max_tokens` cap (exact for a
request that ignores EOS); `history` learns from the requests that finish on this worker;
`hidden-state` switches on the engine's capture of last-layer hidden states every k tokens
and reads them (`Engine.take_hidden_states`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pdserve.instance.decode_forecast import DecodeForecast, DecodeLoadTracker, ForecastSettings
from pdserve.instance.length_predictor import parse_predictor_spec
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.types import Request

if TYPE_CHECKING:
    import numpy as np

    from pdserve.engine.engine import Engine


class WorkerForecast:
    def __init__(self, tracker: DecodeLoadTracker, engine: Engine,
                 local: LocalScheduler) -> None:
        self.tracker, self.engine, self.local = tracker, engine, local
        self.hidden: dict[int, np.ndarray] = {}  # request id -> latest captured state

    @classmethod
    def build(cls, settings: ForecastSettings | None, engine: Engine,
              local: LocalScheduler) -> WorkerForecast | None:
        if settings is None:
            return None
        check_live_predictor(settings.predictor)
        if parse_predictor_spec(settings.predictor)[0] == "hidden-state":
            # the engine keeps each decode's hidden vector every k tokens (the refresh)
            engine.capture_hidden_states(settings.refresh_every_tokens)
        return cls(DecodeLoadTracker(settings, knows_true_length=False), engine, local)

    def report(self) -> DecodeForecast:
        self.hidden.update(self.engine.take_hidden_states())  # empty unless capturing
        local = self.local
        incoming = (*local.transfer_queue, *local.transferring.values(), *local.ready)
        here_count = len(local.running) + len(incoming)
        if len(self.hidden) > here_count or self.tracker.tracked > here_count:
            here = {*local.running, *(r.request_id for r in incoming)}  # some moved away
            self.hidden = {rid: h for rid, h in self.hidden.items() if rid in here}
            self.tracker.retain(here)
        return self.tracker.forecast(local.instance_id, local.running.values(), incoming,
                                     hidden=self.hidden)

    def after_step(self, finished: Iterable[Request]) -> None:
        for request in finished:
            self.tracker.observe_finished(request)
            self.hidden.pop(request.request_id, None)


def check_live_predictor(spec: str) -> None:
    """A clear error at start-up for a predictor that needs the simulator's truth."""
    if spec.split(":", 1)[0].strip() == "oracle":
        raise ValueError("the 'oracle' length predictor knows each request's true output "
                         "length, which only the simulator has; serve with 'history', "
                         "'noisy:mae=N' (around max_tokens) or 'hidden-state:PATH'")
