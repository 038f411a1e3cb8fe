"""Messages between the driver and a worker process: small, picklable, no tensors (KV moves
through the shared-memory pools)."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.engine.sampling import TokenLogprob
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.sessions import HistoryRef
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.stats import InstanceStats
from pdserve.perf.fitted import PerfModel

# ---- driver -> worker ----


@dataclass(frozen=True)
class AddRequest:
    """Prefill and run a request. `resume_ids`: tokens already generated and streamed by an
    earlier attempt (a re-run after a worker died); they are prefilled with the prompt and
    count as generated (toward `max_tokens`), so the run continues after them."""

    request_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    resume_ids: tuple[int, ...] = ()
    session_id: int = -1  # reuse/keep the session's history KV here (AMPD sessions)
    history: HistoryRef | None = None  # copy the session's history from its decode worker
    arrival_s: float = 0.0  # the driver's time.monotonic() at arrival (queue orders read it)


@dataclass(frozen=True)
class ExportHistory:
    """Lock the session's kept history and say where it is (a remote prefill will read
    it); `UnlockHistory` releases the lock."""

    request_id: int
    session_id: int


@dataclass(frozen=True)
class UnlockHistory:
    session_id: int


@dataclass(frozen=True)
class DropHistory:
    """Forget a session's history kept here: the session's next round recomputes it
    elsewhere, or its decode continued on another instance (`cluster/sessions.py`)."""

    session_id: int


@dataclass(frozen=True)
class ContinueInPlace:
    request_id: int


@dataclass(frozen=True)
class AdoptKV:
    """Take over a prefilled sequence; copy its KV from the sender's pool when admitted
    (only past the session's history when this worker keeps it)."""

    handoff: KVHandoff
    session_id: int = -1


@dataclass(frozen=True)
class Detach:
    """Take a running decode out of the batch (between steps) to migrate it."""

    request_id: int


@dataclass(frozen=True)
class ReleaseKV:
    request_id: int


@dataclass(frozen=True)
class Cancel:
    request_id: int


@dataclass(frozen=True)
class SetChunk:
    chunk_size_tokens: int


@dataclass(frozen=True)
class SetPriority:
    """Serve this phase first (`pdserve.instance.phase_priority`)."""

    priority: str


@dataclass(frozen=True)
class SetPerfModel:
    """The performance model changed (the server's start-up profile is ready): a prefill
    queue order that reads prefill estimates (AMPD's Alg. 2) reads `perf` from now on."""

    perf: PerfModel


@dataclass(frozen=True)
class ForgetPool:
    """A peer's shared KV pool is gone (its worker died): unmap it."""

    pool_name: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (AddRequest | ContinueInPlace | AdoptKV | Detach | ReleaseKV | Cancel | SetChunk
           | SetPriority | SetPerfModel | ForgetPool | Shutdown | ExportHistory | UnlockHistory
           | DropHistory)

# ---- worker -> driver ----


@dataclass(frozen=True)
class WorkerReady:
    instance_id: int
    pool_name: str
    stats: InstanceStats


@dataclass(frozen=True)
class StepDone:
    """One batch ran: the tokens it sampled (request, token, finish reason or "", logprob
    or None when the request did not ask for logprobs)."""

    instance_id: int
    tokens: tuple[tuple[int, int, str, TokenLogprob | None], ...]
    stats: InstanceStats
    # the engine's cumulative counters: prompt tokens computed by prefill chunks, and
    # tokens a session's kept history provided instead
    prefill_tokens_total: int = 0
    reused_tokens_total: int = 0
    sent_s: float = 0.0  # time.monotonic() when the worker sent it (the batch's end)
    # AddRequest and AdoptKV commands handled before `stats` was taken (dispatch_ledger.py)
    dispatches_received: int = 0


@dataclass(frozen=True)
class HistoryExported:
    """The answer to `ExportHistory` (None: no history kept here)."""

    instance_id: int
    request_id: int
    history: HistoryRef | None


@dataclass(frozen=True)
class HistoryCopied:
    """A worker copied a request's history in (or gave up): its source may unlock it."""

    instance_id: int
    request_id: int
    copied_tokens: int


@dataclass(frozen=True)
class Prefilled:
    instance_id: int
    handoff: KVHandoff


@dataclass(frozen=True)
class Detached:
    """A decode left the batch for a migration (`handoff` is None if it was not decoding
    here any more: finished, preempted or cancelled)."""

    instance_id: int
    request_id: int
    handoff: KVHandoff | None


@dataclass(frozen=True)
class Transferred:
    instance_id: int
    request_id: int


@dataclass(frozen=True)
class Executing:
    """The requests of the batch the worker is about to run, sent when the set changes: if
    the worker dies before its next report, these were in the batch that was running."""

    instance_id: int
    request_ids: frozenset[int]


@dataclass(frozen=True)
class StatsReport:
    """A load snapshot from an idle worker (its load changed without a step: a release, a
    cancel), so gauges and the scheduler's view do not freeze while it idles."""

    instance_id: int
    stats: InstanceStats
    dispatches_received: int = 0  # as in StepDone


@dataclass(frozen=True)
class WorkerError:
    """A request failed on the worker (its KV is freed there). `kind`: "invalid_request"
    when the request's own content caused it (it failed alone), else "server_error"."""

    instance_id: int
    request_id: int
    message: str
    kind: str = "invalid_request"


Event = (WorkerReady | StepDone | Prefilled | Detached | Transferred | Executing
         | HistoryExported | HistoryCopied
         | StatsReport | WorkerError)


DISPATCHES = (AddRequest, AdoptKV)  # the commands that queue load on a worker


def is_dispatch(command: object) -> bool:
    """Whether a worker counts `command` in its `dispatches_received` (the driver's
    `DispatchLedger` numbers exactly these)."""
    return isinstance(command, DISPATCHES)
