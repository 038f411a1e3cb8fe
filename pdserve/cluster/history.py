"""What happened to a cluster, recorded alike by both worlds: the scheduler's decisions with
their reasons (`Decision`) and every instance's role, state and load over time
(`LoadSample`). The simulated report and the live dashboard read these records through the
same views (`pdserve/metrics/views.py`).

`apply_actions` (`cluster/actions.py`) records each decision that changes the cluster as it
applies it, so both worlds log the same decisions from the same actions; what no action
says (a worker died, was restarted, a started instance came up) the world records itself.
A world samples its instances at its monitor ticks (`ClusterHistory.sample`). The
simulator keeps everything; the live driver keeps a bounded tail (`max_decisions`,
`max_samples`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.instance.stats import InstanceLoad
from pdserve.types import Role


class DecisionKind(enum.Enum):
    FLIP = "flip"  # SetRole: the instance's role changed
    MIGRATE = "migrate"  # Migrate: a running decode moves
    REJECT = "reject"  # Reject: a request ends unserved
    STOP = "stop"  # StopInstance (elastic scaling, a reserve)
    START = "start"  # StartInstance (a scale-up)
    PRIORITY = "priority"  # SetPhasePriority
    STARTED = "started"  # a started instance serves (no action: the world notes it)
    FAILED = "failed"  # an instance's worker died
    RECOVERED = "recovered"  # a failed instance serves again


@dataclass(frozen=True, slots=True)
class Decision:
    """One entry of the decision log: at `time_s` (seconds since the world's start),
    `kind` happened to `instance_id` (the source of a migration) because of `reason`.
    `role`: a flip's new role; `target_id`: a migration's target; `request_id`: the request
    a migration moves or a rejection refuses (-1: none)."""

    time_s: float
    kind: DecisionKind
    instance_id: int
    reason: str
    role: Role | None = None
    target_id: int = -1
    request_id: int = -1


class InstanceState(enum.Enum):
    """Whether an instance runs: up, stopped on the policy's request, or its worker
    restarting or dead (the live world only)."""

    UP = "up"
    STOPPED = "stopped"
    RESTARTING = "restarting"
    DEAD = "dead"


@dataclass
class LoadSample:
    """Every instance at one monitor tick; lists are indexed by instance."""

    time_s: float
    running_tokens: list[int]
    prefill_queue_tokens: list[int]
    memory_fraction: list[float]  # KV blocks in use / capacity
    roles: list[Role]
    states: list[InstanceState]
    waiting: list[int]  # requests queued for prefill or for a decode slot
    running: list[int]  # sequences decoding (the running batch)


def sample_of(time_s: float, loads: Sequence[InstanceLoad], roles: Sequence[Role],
              states: Sequence[InstanceState]) -> LoadSample:
    """The sample both worlds take of their instances' loads (the simulated instances, or
    the live workers' latest reports)."""
    running_tokens, queued_tokens, memory, waiting, running = [], [], [], [], []
    for x in loads:  # one pass: each load read once (a simulated one may compute it)
        running_tokens.append(x.running_tokens)
        queued_tokens.append(x.prefill_queue_tokens)
        total = x.total_blocks
        memory.append(x.used_blocks / total if total else 0.0)
        waiting.append(x.prefill_queue_len + x.decode_queue_len)
        running.append(x.running_decodes)
    return LoadSample(time_s, running_tokens, queued_tokens, memory, list(roles), list(states),
                      waiting, running)


class ClusterHistory:
    """The decision log and the load samples of one world. `origin_s`: the world's clock at
    its start (times are recorded relative to it); `max_decisions`, `max_samples`: keep
    only the newest (None: all)."""

    def __init__(self, origin_s: float = 0.0, max_decisions: int | None = None,
                 max_samples: int | None = None) -> None:
        self.origin_s = origin_s
        self.decisions: deque[Decision] = deque(maxlen=max_decisions)
        self.samples: deque[LoadSample] = deque(maxlen=max_samples)
        self.decisions_total = 0  # ever recorded, including those the tail dropped

    def record(self, now_s: float, kind: DecisionKind, instance_id: int, reason: str,
               role: Role | None = None, target_id: int = -1, request_id: int = -1) -> None:
        """A decision at `now_s` on the world's clock. `apply_actions` records the
        decisions actions carry; a world notes what no action says (an instance failed,
        recovered, or a started one serves)."""
        self.decisions.append(Decision(now_s - self.origin_s, kind, instance_id, reason, role,
                                       target_id, request_id))
        self.decisions_total += 1

    def sample(self, now_s: float, loads: Sequence[InstanceLoad], roles: Sequence[Role],
               states: Sequence[InstanceState]) -> LoadSample:
        taken = sample_of(now_s - self.origin_s, loads, roles, states)
        self.samples.append(taken)
        return taken

    def role_changes(self) -> list[Decision]:
        return [d for d in self.decisions if d.kind is DecisionKind.FLIP]
