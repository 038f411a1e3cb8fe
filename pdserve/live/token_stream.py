"""A request's tokens on their way to its client: each token from a worker becomes text
deltas (stop strings held back until decided), logprobs, the first-token and per-token
metrics, and the end of the request: finished with its reason, or failed with an error the
client sees.

`TokenStreams` is the client side only: it writes the `LiveRequest` the HTTP handler reads
(its events queue, tokens, finish reason, error), the server metrics, and the newest ended
requests (`ended`: what the dashboard's latency window reads). What an end means
for the cluster (the worker told to stop, the session rebound, the scheduler's `Finished`)
is the live driver's, which calls it.
"""

from __future__ import annotations

import math
import time
from collections import deque

from pdserve.engine.sampling import TokenLogprob
from pdserve.live.requests import LiveRequest
from pdserve.live.server_metrics import ServerMetrics
from pdserve.live.timeline import RequestTimeline
from pdserve.types import Request


class TokenStreams:
    def __init__(self, metrics: ServerMetrics, timeline: RequestTimeline | None,
                 max_ended: int) -> None:
        self.metrics = metrics
        self.timeline = timeline  # fidelity runs only
        # (when, request) of the newest finished or failed requests, in order
        self.ended: deque[tuple[float, Request]] = deque(maxlen=max_ended)

    def push(self, live: LiveRequest, instance: int, token: int, reason: str,
             logprob: TokenLogprob | None, now: float, batch_end_s: float) -> bool:
        """Stream one token; True when the request ends with it (the worker's `reason`,
        a stop string this stream saw, or max_tokens)."""
        request = live.request
        request.generated_tokens += 1
        metrics = self.metrics
        if live.last_token_s is not None:
            metrics.observe(metrics.itl, now - live.last_token_s)
        live.last_token_s = now
        if math.isnan(request.first_token_s):
            request.first_token_s = now
            metrics.observe(metrics.ttft, now - request.arrival_s)
            metrics.add(metrics.prompt_tokens, len(live.prompt_ids))
            if self.timeline is not None:
                self.timeline.first_token(live.client_id, request.arrival_s, batch_end_s, now)
        if instance == request.decode_instance:
            request.record_decode_tokens(now, now)
        live.token_ids.append(token)
        metrics.add(metrics.generation_tokens)
        if logprob is not None:  # before the token's text (which may be held back)
            live.events.put_nowait(("logprob", logprob))
        delta = live.stream.push(token)
        if delta:
            live.events.put_nowait(("text", delta))
        return bool(reason or live.stream.stopped or live.tokens_sent >= live.params.max_tokens)

    def finish(self, live: LiveRequest, worker_reason: str, now: float) -> None:
        """End the stream: `worker_reason` is "" when this stream saw a stop string before
        the worker did (or, defensively, max_tokens was reached without the worker saying
        so)."""
        request = live.request
        reason = worker_reason or ("stop" if live.stream.stopped else "length")
        tail = live.stream.finish()
        if tail:
            live.events.put_nowait(("text", tail))
        request.finish_s = now
        live.finish_reason = reason
        metrics = self.metrics
        metrics.observe(metrics.e2e, now - request.arrival_s)
        if live.tokens_sent > 1:
            metrics.observe(metrics.tpot, (now - request.first_token_s) / (live.tokens_sent - 1))
        metrics.add(metrics.successes, 1, reason)
        self._ended(live, now)
        live.events.put_nowait(("done", reason))

    def fail(self, live: LiveRequest, message: str, http_status: int, reason: str) -> None:
        """End the stream with an error the client sees (`reason` labels the metric)."""
        live.request.rejected_reason = message
        live.error_status = http_status
        live.error_type = "invalid_request_error" if http_status < 500 else "server_error"
        self.metrics.add(self.metrics.failures, 1, reason)
        self._ended(live, time.monotonic())
        live.events.put_nowait(("error", message))

    def _ended(self, live: LiveRequest, now: float) -> None:
        self.ended.append((now, live.request))
