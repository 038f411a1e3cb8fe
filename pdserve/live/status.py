"""What the live driver tells operators: `/health`'s body, and each instance's state as the
dashboard and the metrics (`server_metrics.py`) name it.

Health is honest: "ok" (HTTP 200) only while some live instance takes prefills and some
takes decodes, i.e. while a request can be served; otherwise "unavailable" (503). The body
names live, restarting and dead workers, their roles and PIDs, recent role changes with
their reasons, and which performance model the policies read (`PerfModelState`); for
workers on a Ray cluster, each live one's node and which (re)starts wait for resources
(`placement`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdserve.cluster.history import InstanceState
from pdserve.cluster.roles import RoleBoard
from pdserve.live.processes import WorkerProcesses, WorkerState

RoleChangeRecord = tuple[float, int, str, str]  # wall time, instance, role, reason
PROVISIONAL, PROFILED = "provisional", "profiled"


@dataclass(frozen=True)
class PerfModelState:
    """Which performance model the policies read: `provisional` (the server serves on a
    conservative model while its start-up profile runs) or `profiled` (the profile's, a
    cached one or `--perf-model`'s); where its coefficients came from; and, if the start-up
    profile failed, why (the server then stays on the provisional model)."""

    state: str
    origin: str
    error: str = ""


GIVEN_PERF_MODEL = PerfModelState(PROFILED, "given")  # a driver built on its final model


def health(board: RoleBoard, workers: WorkerProcesses, requests_in_flight: int,
           role_changes: Iterable[RoleChangeRecord],
           perf_model: PerfModelState = GIVEN_PERF_MODEL) -> dict[str, object]:
    by_state = {state: [i for i, s in enumerate(workers.states) if s is state]
                for state in WorkerState}
    serving = bool(board.prefill_candidates and board.decode_candidates)
    return {
        "status": "ok" if serving else "unavailable",
        "workers": workers.count,
        "live": by_state[WorkerState.LIVE],
        "restarting": by_state[WorkerState.RESTARTING],
        "dead": by_state[WorkerState.DEAD],
        "stopped": by_state[WorkerState.STOPPED],  # on the policy's request (scaling)
        "alive": by_state[WorkerState.LIVE],  # older names of live and not-live
        "failed": sorted(workers.exited - set(by_state[WorkerState.STOPPED])),
        "roles": [role.value for role in board.roles],
        "prefill_capable": list(board.prefill_candidates),
        "decode_capable": list(board.decode_candidates),
        "pids": {str(i): workers.pid(i) for i in by_state[WorkerState.LIVE]},
        "restarts": workers.restarts_total,
        "requests_in_flight": requests_in_flight,
        "role_changes": [{"time": t, "instance": i, "role": role, "reason": reason}
                         for t, i, role, reason in list(role_changes)[-8:]],
        "perf_model": perf_model.state,
        "perf_model_origin": perf_model.origin,
        **({"perf_model_error": perf_model.error} if perf_model.error else {}),
        **placement(workers),
    }


def instance_states(workers: WorkerProcesses) -> list[InstanceState]:
    """Each instance's state as the dashboard and the metrics name it (a worker still
    starting counts as restarting: it cannot serve yet)."""
    return [_STATES[state] for state in workers.states]


def placement(workers: WorkerProcesses) -> dict[str, object]:
    """Workers on a Ray cluster: each live worker's node, and the instances whose start
    waits for resources, with why (none for local worker processes)."""
    placements = workers.placements()
    if not placements:
        return {}
    return {
        "nodes": {str(i): {"node_id": p.node_id, "node_ip": p.node_ip}
                  for i, p in enumerate(placements) if p.node_id},
        "waiting_for_resources": {str(i): p.waiting_for_resources
                                  for i, p in enumerate(placements) if p.waiting_for_resources},
    }


_STATES = {WorkerState.LIVE: InstanceState.UP, WorkerState.STARTING: InstanceState.RESTARTING,
           WorkerState.RESTARTING: InstanceState.RESTARTING, WorkerState.DEAD: InstanceState.DEAD,
           WorkerState.STOPPED: InstanceState.STOPPED}
