"""What the live driver tells operators: `/health`'s body and the `/metrics` families.

Health is honest: "ok" (HTTP 200) only while some live instance takes prefills and some
takes decodes, i.e. while a request can be served; otherwise "unavailable" (503). The body
names live, restarting and dead workers, their roles and PIDs, recent role changes with
their reasons, and which performance model the policies read (`PerfModelState`); for
workers on a Ray cluster, each live one's node and which (re)starts wait for resources
(`placement`, `placement_families`). Metrics count live pool members only, and
per-instance families cover live workers (a dead worker's last snapshot is not reported
as current).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.live.processes import WorkerProcesses, WorkerState
from pdserve.live.server_metrics import Family

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


def placement_families(workers: WorkerProcesses) -> list[Family]:
    """One family for workers on a Ray cluster (none for local worker processes)."""
    placements = workers.placements()
    if not placements:
        return []
    return [Family(
        "worker_waiting_for_resources", "gauge",
        "1 while the instance's (re)start waits for a node with room for it, else 0; "
        "node_id and node_ip name the node of its live worker (empty while none is live).",
        [({"instance": str(i), "node_id": p.node_id, "node_ip": p.node_ip},
          1.0 if p.waiting_for_resources else 0.0) for i, p in enumerate(placements)])]


def metric_families(board: RoleBoard, workers: WorkerProcesses,
                    instances: Sequence[InstanceLoad], requests_in_flight: int) -> list[Family]:
    states = workers.states
    live = [s for s in instances if states[s.instance_id] is WorkerState.LIVE]

    def per_instance(name: str, kind: str, help_text: str, attribute: str) -> Family:
        return Family(name, kind, help_text, [
            ({"instance": str(s.instance_id)}, float(getattr(s, attribute))) for s in live])

    families = [
        Family("requests_in_flight", "gauge", "Requests admitted and not yet ended.",
               [({}, float(requests_in_flight))]),
        per_instance("prefill_queue_len", "gauge",
                     "Requests waiting for or in prefill, per live instance.",
                     "prefill_queue_len"),
        per_instance("decode_queue_len", "gauge",
                     "Decodes waiting for their KV or a batch slot, per live instance.",
                     "decode_queue_len"),
        per_instance("running_decodes", "gauge", "Sequences decoding, per live instance.",
                     "running_decodes"),
        per_instance("used_blocks", "gauge", "KV blocks in use, per live instance.",
                     "used_blocks"),
        per_instance("kv_capacity_blocks", "gauge",
                     "KV blocks of the pool (16 tokens each), per live instance.",
                     "total_blocks"),
        Family("kv_usage_ratio", "gauge", "Fraction of KV blocks in use, per live instance.",
               [({"instance": str(s.instance_id)}, s.used_blocks / s.total_blocks
                 if s.total_blocks else 0.0) for s in live]),
        per_instance("preemptions_total", "counter",
                     "Sequences preempted (KV dropped, recomputed later), per live instance "
                     "since its worker started.", "preemptions_total"),
        Family("pool_size", "gauge", "Live instances in each role.",
               [({"role": role.value}, float(len(members)))
                for role, members in board.pools.items()]),
        Family("worker_up", "gauge", "1 if the instance's worker is live, else 0.",
               [({"instance": str(i), "state": state.value},
                 1.0 if state is WorkerState.LIVE else 0.0) for i, state in enumerate(states)]),
        Family("workers_failed", "gauge", "Workers not serving now (restarting or dead).",
               [({}, float(sum(s in (WorkerState.RESTARTING, WorkerState.DEAD)
                                for s in states)))]),
        *placement_families(workers),
    ]
    return families
