"""What happens to a request when the worker holding it dies.

The tokens the client has seen are the authority: a re-run sends them as `resume_ids`, the
new worker prefills prompt + those tokens and continues, so nothing is skipped or repeated
and `max_tokens` counts them.

Blame: the driver knows the batch a worker was running (its last `Executing` report). A
worker that *crashed* (any exit but SIGKILL/SIGTERM, which come from outside: an operator,
the OOM killer, a test) while running a batch may have been killed by one of those
requests; they are failed, never retried elsewhere, so a poison request cannot take down
worker after worker. The worker's other requests, and every request of a worker killed from
outside, are re-run, each at most `MAX_RETRIES` times over its life (a request caught in
repeated deaths fails with the reason).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.cluster.events import Arrival, ClusterView, InstanceFailed
from pdserve.instance.stats import InstanceStats
from pdserve.live.processes import WorkerProcesses
from pdserve.live.requests import LiveRequest
from pdserve.live.server_metrics import ServerMetrics
from pdserve.types import Request

if TYPE_CHECKING:
    from pdserve.live.driver import LiveDriver

MAX_RETRIES = 1
log = logging.getLogger("pdserve.live")


def crashed(exit_code: int | None) -> bool:
    """The worker died by itself (not killed from outside, not a clean exit)."""
    return exit_code not in (None, 0, -signal.SIGKILL, -signal.SIGTERM)


@dataclass(frozen=True)
class Verdict:
    retry: bool
    reason: str = ""  # failure reason label (metrics)
    message: str = ""


def verdict(instance: int, exit_code: int | None, in_batch: bool, retries: int) -> Verdict:
    if in_batch and crashed(exit_code):
        return Verdict(False, "worker_crash",
                       f"the worker running this request (instance {instance}) died with "
                       f"exit code {exit_code} while running it; it is not retried")
    if retries >= MAX_RETRIES:
        return Verdict(False, "retry_budget",
                       f"the worker holding this request (instance {instance}) died and "
                       f"the request was already re-run {retries} time(s)")
    return Verdict(True)


class Failover:
    """The driver's side of worker deaths and restarts (mixed into `LiveDriver`)."""

    live: dict[int, LiveRequest]
    workers: WorkerProcesses
    metrics: ServerMetrics
    view: ClusterView
    _executing: dict[int, frozenset[int]]
    _next_id: int
    _starting: set[int]

    @property
    def failed(self) -> set[int]:
        """Instances not serving now (restarting or dead)."""
        return self.workers.exited

    def _on_exit(self: LiveDriver, instance: int, exit_code: int | None) -> None:
        """A worker exited (called once per exit by `WorkerProcesses`)."""
        self.metrics.count("worker_failures")
        log.error("worker %d exited (code %s); %s", instance, exit_code,
                  self.workers.states[instance].value)
        self._starting.discard(instance)  # a scale-up whose worker never came up
        batch = self._executing.pop(instance, frozenset())
        total_blocks = self.view.instances[instance].total_blocks
        # its work is gone: policies must not count it
        self.set_load(instance, InstanceStats.empty(instance, total_blocks))
        self._handle(InstanceFailed(instance))
        self.history.source_lost(instance)
        self.sessions.instance_lost(instance)
        for live in [x for x in self.live.values() if instance in self._holders(x)]:
            judged = verdict(instance, exit_code, live.request.request_id in batch,
                             live.retries)
            if judged.retry:
                self._rerun(live, instance)
            else:
                self._fail(live, judged.message, 500, judged.reason, except_instance=instance)

    def _rerun(self: LiveDriver, live: LiveRequest, dead: int) -> None:
        """A new attempt of the request that resumes after the tokens the client has."""
        old = live.request
        self._drop(live, except_instance=dead)
        self._next_id += 1
        # the same session and prefix hashes; its history is recomputed, since the KV of
        # it may have died with the worker (the session binds to where the re-run ends)
        request = Request(self._next_id, old.arrival_s, old.input_tokens, old.output_tokens,
                          session_id=old.session_id, hash_ids=old.hash_ids,
                          retain_kv=old.retain_kv, generated_tokens=len(live.token_ids))
        request.first_token_s = old.first_token_s
        live.request, live.retries = request, live.retries + 1
        self.live[request.request_id] = live
        self.metrics.count("retries")
        self.metrics.count("resumed_tokens", len(live.token_ids))
        self._handle(Arrival(request))
