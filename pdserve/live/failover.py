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

These are the rules; the live driver applies them when a worker exits
(`LiveDriver._on_exit`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from pdserve.types import Request

MAX_RETRIES = 1


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


def next_attempt(old: Request, request_id: int, tokens_seen: int) -> Request:
    """The request's next attempt, resuming after the `tokens_seen` the client has: the same
    session and prefix hashes; its history is recomputed, since the KV of it may have died
    with the worker (the session binds to where the re-run ends)."""
    request = Request(request_id, old.arrival_s, old.input_tokens, old.output_tokens,
                      session_id=old.session_id, hash_ids=old.hash_ids,
                      retain_kv=old.retain_kv, generated_tokens=tokens_seen)
    request.first_token_s = old.first_token_s
    return request
