"""A request's tokens on their way to its client (a mixin of `LiveDriver`): each token
from a worker becomes text deltas (stop strings held back until decided), logprobs, the
first-token and per-token metrics, and the end of the request: finished with its reason
(the worker told to stop when the driver's text stream saw a stop string first), or failed
with an error the client sees."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from pdserve.cluster.events import Finished
from pdserve.engine.sampling import TokenLogprob
from pdserve.live.requests import LiveRequest
from pdserve.live.server_metrics import ServerMetrics
from pdserve.live.timeline import RequestTimeline
from pdserve.worker.messages import Cancel

if TYPE_CHECKING:
    from pdserve.live.driver import LiveDriver


class TokenStreams:
    live: dict[int, LiveRequest]
    metrics: ServerMetrics
    timeline: RequestTimeline | None
    _batch_end_s: float

    def _on_token(self: LiveDriver, instance: int, request_id: int, token: int, reason: str,
                  logprob: TokenLogprob | None = None) -> None:
        live = self.live.get(request_id)
        if live is None or live.tokens_sent >= live.params.max_tokens:
            return
        request, now = live.request, time.monotonic()
        request.generated_tokens += 1
        if math.isnan(request.first_token_s):
            request.first_token_s = now
            self.metrics.ttft.observe(now - request.arrival_s)
            self.metrics.count("prompt_tokens", len(live.prompt_ids))
            if self.timeline is not None:
                self.timeline.first_token(live.client_id, request.arrival_s,
                                          self._batch_end_s, now)
        if instance == request.decode_instance:
            request.record_decode_tokens(now, now)
        live.token_ids.append(token)
        self.metrics.count("generation_tokens")
        if logprob is not None:  # before the token's text (which may be held back)
            live.events.put_nowait(("logprob", logprob))
        delta = live.stream.push(token)
        if delta:
            live.events.put_nowait(("text", delta))
        if reason or live.stream.stopped or live.tokens_sent >= live.params.max_tokens:
            self._finish(live, instance, reason, now)

    def _finish(self: LiveDriver, live: LiveRequest, instance: int, worker_reason: str,
                now: float) -> None:
        """`worker_reason` is "" when this driver's text stream saw a stop string before
        the worker did (or, defensively, max_tokens was reached without the worker saying
        so); the worker is then told to stop."""
        request = live.request
        reason = worker_reason or ("stop" if live.stream.stopped else "length")
        tail = live.stream.finish()
        if tail:
            live.events.put_nowait(("text", tail))
        request.finish_s = now
        live.finish_reason = reason
        self.metrics.e2e.observe(now - request.arrival_s)
        if live.tokens_sent > 1:
            self.metrics.tpot.observe((now - request.first_token_s) / (live.tokens_sent - 1))
        self.metrics.count("completions")
        self.live.pop(request.request_id, None)
        if not worker_reason:
            self.send(instance, Cancel(request.request_id))
        live.events.put_nowait(("done", reason))
        if request.session_id >= 0:
            self.sessions.finished(request, instance)
        self._handle(Finished(request, instance))

    def _fail(self: LiveDriver, live: LiveRequest, message: str, http_status: int, reason: str,
              except_instance: int = -1) -> None:
        """End the request with an error the client sees (`reason` labels the metric)."""
        self._drop(live, except_instance)
        live.request.rejected_reason = message
        live.error_status = http_status
        live.error_type = "invalid_request_error" if http_status < 500 else "server_error"
        self.metrics.count_failure(reason)
        live.events.put_nowait(("error", message))
