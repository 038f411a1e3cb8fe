"""Ray-hosted workers behind `WorkerProcesses`' interface (`pdserve serve --ray`).

The same supervisor, event-loop wiring and driver; only what a "worker process" is changes:
each start of an instance creates one Ray actor (`ray_actor.WorkerHost`, named after its KV
pool, with `cpus_per_worker` CPUs and the instance's custom resource if any, else spread
over the nodes) and starts its `serve` call; its pipe is an `ActorChannel` and its process
an `ActorProcess` (`ray_channel.py`). So an actor that dies is reported by the supervisor as
a local worker's exit is, once Ray reports its end and how it ended, or `LOST_GRACE_S` after
its channel broke if Ray has not (presumed lost with its node: Ray declares a node dead only
after many seconds): the driver raises `InstanceFailed` and re-runs or fails its requests,
and the instance is restarted as a new actor with the same back-off and budget
(`InstanceRecovered` when it is ready). A node that leaves ends its actors' `serve` calls
(`-SIGKILL`: from outside); their restarts wait for resources at most `start_timeout_s`
each, within the restart budget, so nothing waits forever, and `PendingPlacements` says
which wait for resources (`placements`: each worker's node too, for `/health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Callable, Collection

import ray

from pdserve.instance.stats import InstanceStats
from pdserve.live.processes import (
    ExitHandler,
    ReadyHandler,
    WorkerPlacement,
    WorkerProcesses,
    WorkerSettings,
    WorkerState,
)
from pdserve.live.ray_actor import ACTOR_CONCURRENCY, WorkerHost
from pdserve.live.ray_channel import ActorChannel, ActorProcess
from pdserve.live.ray_cluster import RaySettings
from pdserve.live.ray_placement import PendingPlacements
from pdserve.live.ray_session import RaySession
from pdserve.worker.messages import Command

ENV_PREFIXES = ("PDSERVE_", "HF_", "TORCH_")  # the driver's settings the workers follow
LOST_GRACE_S = 3.0  # a broken channel, then no word from Ray this long: presumed lost
log = logging.getLogger("pdserve.live")


class RayWorkers(WorkerProcesses):
    def __init__(self, settings: WorkerSettings, count: int, ray_settings: RaySettings) -> None:
        super().__init__(settings, count)
        for i in range(count):
            ray_settings.resources_of(i)  # every instance is placeable (raises if not)
        self.ray = ray_settings
        self.session = RaySession(ray_settings, count * ray_settings.cpus_per_worker)
        self._authkey = secrets.token_bytes(32)
        self._tag = secrets.token_hex(4)  # this server's actors among the cluster's
        self._generation = [0] * count
        self._host_ip = ""
        self._actor_class = ray.remote(WorkerHost)
        device = settings.device
        self._gpus = 0.0 if device is None or device.on_cpu else ray_settings.gpus_per_worker
        self.pending = PendingPlacements(self._demand)
        self._pending_watch: asyncio.Task | None = None

    async def start(self, on_message: Callable[[object], None], on_exit: ExitHandler,
                    on_ready: ReadyHandler, stopped: Collection[int] = ()
                    ) -> list[InstanceStats]:
        await self.session.open()
        self._host_ip = self.session.node_ip
        self._pending_watch = asyncio.create_task(self.pending.watch(self._unconnected))
        return await super().start(on_message, on_exit, on_ready, stopped)

    def _demand(self, instance: int) -> dict[str, float]:
        """What one instance's actor needs of a node."""
        return {"CPU": self.ray.cpus_per_worker, **({"GPU": self._gpus} if self._gpus else {}),
                **self.ray.resources_of(instance)}

    def _unconnected(self) -> dict[int, str]:
        """Instances whose current actor is starting and has not connected: its id."""
        return {i: process.actor._actor_id.hex() for i, process in enumerate(self._processes)
                if process is not None and process.pid is None and process.is_alive()}

    def placements(self) -> list[WorkerPlacement]:
        return [WorkerPlacement(
            process.node_id if live else "", process.node_ip if live else "",
            self.pending.waiting.get(i, ""))
            for i, process in enumerate(self._processes)
            for live in [process is not None and self.states[i] is WorkerState.LIVE]]

    def _spawn(self, instance: int) -> None:
        previous = self._processes[instance]
        if previous is not None:
            if previous.is_alive():
                previous.kill()
            previous.close()
        self._generation[instance] += 1
        name = f"pdserve-{self._tag}-{instance}-{self._generation[instance]}"
        channel = ActorChannel(self._host_ip, self._authkey)
        environment = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        actor = self._actor_class.options(
            name=name, namespace=self.ray.namespace, num_cpus=self.ray.cpus_per_worker,
            num_gpus=self._gpus,
            resources=self.ray.resources_of(instance), max_concurrency=ACTOR_CONCURRENCY,
            max_restarts=0, scheduling_strategy=None if self.ray.instance_resources
            else "SPREAD").remote(instance, self.settings, name, self.ray.namespace,
                                  self.ray.kv_transport, environment)
        serve = actor.serve.remote(channel.address, self._authkey)
        self._processes[instance] = ActorProcess(actor, serve, channel)
        self._pipes[instance] = channel

    def _drain(self, instance: int) -> None:
        """As for a process, but a broken channel is not the exit yet: Ray reports the
        actor's end (the sentinel) with how it ended, which decides the blame; if it has
        not within `LOST_GRACE_S`, the actor is presumed lost with its node."""
        pipe = self._pipes[instance]
        try:
            while pipe.poll():
                self._on_message(pipe.recv())
        except (EOFError, OSError):
            assert self._loop is not None
            with contextlib.suppress(OSError, ValueError):
                self._loop.remove_reader(pipe.fileno())
            self._loop.call_later(LOST_GRACE_S, self._presume_lost, instance,
                                  self._processes[instance])

    def _presume_lost(self, instance: int, process: ActorProcess) -> None:
        if self._processes[instance] is process and process.is_alive() and not self._stopping:
            node = process.node_ip or "its node"
            log.warning("worker %d: its connection broke and Ray has not said how its actor "
                        "ended within %.0f s: presumed lost with %s (%s)", instance,
                        LOST_GRACE_S, node, process.node_id[:12])
            process.presume_lost(f"its connection broke; presumed lost with {node}")

    def send(self, instance: int, command: Command) -> None:
        if self.states[instance] is WorkerState.LIVE and not self._stopping:
            with contextlib.suppress(OSError):  # a dead actor: the sentinel reports it
                self._pipes[instance].send(command)

    def _exited(self, instance: int) -> None:
        super()._exited(instance)
        process = self._processes[instance]
        if process is not None:  # its loop may have raised with the actor alive: end it
            process.kill()

    def node_of(self, instance: int) -> str:
        """The Ray node id of the instance's actor ("" before it said hello)."""
        process = self._processes[instance]
        return process.node_id if process is not None else ""

    def actor(self, instance: int) -> object:
        return self._processes[instance].actor

    async def stop(self) -> None:
        if self._pending_watch is not None:
            self._pending_watch.cancel()
        for process in self._processes:  # not connected (e.g. waiting for a node): no
            if process is not None and process.pid is None and process.is_alive():
                process.kill()  # Shutdown reaches it, so do not wait for it
        await super().stop()
        for process in self._processes:
            if process is not None:
                if process.is_alive():
                    process.kill()
                process.close()
        await asyncio.to_thread(self.session.close)
