"""Which Ray-hosted workers' starts wait for resources, and why.

An actor that no node has room for stays pending; Ray says nothing of it to its owner. So
that `/health`, `/metrics` and the log say so, `PendingPlacements` (owned by `RayWorkers`,
the one writer of `waiting`) looks every `PROBE_INTERVAL_S`, while some instance's actor has
not connected yet, at Ray's GCS: an actor waits for resources while it is pending creation
with no worker process yet (an actor whose process starts has one), its demand (its CPUs,
GPUs and custom resource) is among the cluster's queued demands (what `ray status` lists as
pending), and no live node has that much free (which the reason spells out). The first
time it does, and when it stops, the log says so. The GCS queries run in a daemon thread,
so a GCS that stops answering cannot hold the server up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial

from pdserve.live.ray_session import in_daemon_thread

PROBE_INTERVAL_S = 1.0
PENDING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")
log = logging.getLogger("pdserve.live")

Demand = dict[str, float]


def shortfall(demand: Demand, free_by_node: dict[str, dict[str, float]]) -> str:
    """Why no node can take `demand` now ("" if one can)."""
    if any(all(free.get(name, 0.0) >= amount - 1e-9 for name, amount in demand.items())
           for free in free_by_node.values()):
        return ""
    wanted = ", ".join(f"{name} {amount:g}" for name, amount in demand.items())
    free = "; ".join(f"node {node[:12]}: " + (", ".join(
        f"{name} {free.get(name, 0.0):g}" for name in demand)) for node, free in
        sorted(free_by_node.items())) or "no live node"
    return f"needs {wanted} on one node; free now: {free}"


def same_shape(demand: Demand, bundle: dict[str, float]) -> bool:
    return set(demand) == set(bundle) and all(
        abs(amount - bundle[name]) < 1e-6 for name, amount in demand.items())


class PendingPlacements:
    def __init__(self, demand_of: Callable[[int], Demand]) -> None:
        self.demand_of = demand_of
        self.waiting: dict[int, str] = {}  # instance -> why its start cannot be placed

    async def watch(self, pending: Callable[[], dict[int, str]]) -> None:
        """Until cancelled: `pending()` gives the instances whose actor has not connected,
        with its actor id."""
        while True:
            actors = pending()
            found: dict[int, str] = {}
            if actors:
                with contextlib.suppress(Exception):  # Ray busy or gone: try again later
                    found = await asyncio.wait_for(in_daemon_thread(
                        partial(self._probe, actors)), 10 * PROBE_INTERVAL_S)
            self._update({i: why for i, why in found.items() if i in pending()})
            await asyncio.sleep(PROBE_INTERVAL_S)

    def _probe(self, actors: dict[int, str]) -> dict[int, str]:
        import ray
        from ray._private import state
        from ray.autoscaler.v2.sdk import get_cluster_status

        demands = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
        queued = [request.bundle for demand in demands.ray_task_actor_demand
                  for request in demand.bundles_by_count if request.count]
        free = state.available_resources_per_node()
        found = {}
        for instance, actor_id in actors.items():
            actor, demand = state.actors(actor_id), self.demand_of(instance)
            if (actor.get("State") in PENDING_STATES and not actor.get("Pid")
                    and any(same_shape(demand, bundle) for bundle in queued)):
                why = shortfall(demand, free)
                if why:
                    found[instance] = why
        return found

    def _update(self, found: dict[int, str]) -> None:
        for instance, why in found.items():
            if instance not in self.waiting:
                log.warning("worker %d: its start waits for resources: %s", instance, why)
        for instance in set(self.waiting) - set(found):
            log.info("worker %d: no longer waits for resources", instance)
        self.waiting = found
