"""Messages between the driver and a worker process: small, picklable, no tensors (KV moves
through the shared-memory pools)."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.engine.sampling import SamplingParams, TokenLogprob
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.stats import InstanceStats

# ---- driver -> worker ----


@dataclass(frozen=True)
class AddRequest:
    request_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class ContinueInPlace:
    request_id: int


@dataclass(frozen=True)
class AdoptKV:
    """Take over a prefilled sequence; copy its KV from the sender's pool when admitted."""

    handoff: KVHandoff


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
class Shutdown:
    pass


Command = (AddRequest | ContinueInPlace | AdoptKV | Detach | ReleaseKV | Cancel | SetChunk
           | Shutdown)

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
class WorkerError:
    instance_id: int
    request_id: int
    message: str


Event = WorkerReady | StepDone | Prefilled | Detached | Transferred | WorkerError
