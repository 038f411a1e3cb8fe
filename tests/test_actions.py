"""One driver contract: both worlds implement every action of `cluster/actions.py: World`,
`apply_actions` is the one place that dispatches them, and the session-history decision
(`cluster/sessions.py`) is carried out alike by the simulator and the live driver."""

from __future__ import annotations

import inspect
import itertools

import pytest
from conftest import make_perf, policy_setup, sim_settings, worker_settings

from pdserve.cluster.actions import (
    DispatchDecode,
    DispatchPrefill,
    Migrate,
    Reject,
    SetChunkSize,
    SetPhasePriority,
    SetRole,
    StartInstance,
    StopInstance,
    World,
    apply_actions,
)
from pdserve.cluster.sessions import HistorySource, history_source
from pdserve.config import serve_defaults
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.stats import InstanceStats
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerState
from pdserve.live.requests import LiveRequest
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.simulator import Simulator
from pdserve.types import SLO, Request, Role
from pdserve.worker.messages import AddRequest, DropHistory, ExportHistory

PERF = make_perf()
WORLD_METHODS = sorted(name for name, _ in inspect.getmembers(World, inspect.isfunction)
                       if not name.startswith("_"))
ONE_OF_EACH = [DispatchPrefill(Request(1, 0.0, 10, 5), 0),
               DispatchDecode(Request(2, 0.0, 10, 5), 0, 1), Reject(Request(3, 0.0, 10, 5), "x"),
               SetRole(0, Role.DECODE, "r"), SetChunkSize(0, 256),
               SetPhasePriority(0, PhasePriority.PREFILL_FIRST, "r"),
               Migrate(Request(4, 0.0, 10, 5), 0, 1, "r"), StartInstance(1, "r"),
               StopInstance(1, "r")]


@pytest.mark.parametrize("world", [Simulator, LiveDriver])
def test_every_world_carries_out_every_action(world: type) -> None:
    for name in WORLD_METHODS:
        method = getattr(world, name, None)
        assert callable(method), f"{world.__name__} lacks {name}"
        wanted = list(inspect.signature(getattr(World, name)).parameters)
        assert list(inspect.signature(method).parameters) == wanted, name


class Recorder:
    """A world that records which method each action reached."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def serving(self, instance_id: int) -> bool:
        return True

    def __getattr__(self, name: str):  # noqa: ANN204 - any World method
        if name not in WORLD_METHODS:
            raise AttributeError(name)
        return lambda action, *rest: self.calls.append((name, action))


def test_apply_actions_calls_one_method_per_action_in_order() -> None:
    world = Recorder()
    apply_actions(ONE_OF_EACH, world, [Role.PREFILL, Role.DECODE])  # type: ignore[arg-type]
    assert [action for _, action in world.calls] == ONE_OF_EACH
    assert [name for name, _ in world.calls] == [
        "dispatch_prefill", "dispatch_decode", "reject", "set_role", "set_chunk_size",
        "set_phase_priority", "migrate", "start_instance", "stop_instance"]
    assert set(WORLD_METHODS) - {"serving"} == {name for name, _ in world.calls}


def test_an_action_no_world_knows_is_an_error() -> None:
    with pytest.raises(ValueError, match="no world can apply str"):
        apply_actions(["not an action"], Recorder(), [])  # type: ignore[list-item, arg-type]


# ---- the session decision, carried out by both worlds ----

HOME, OTHER = 0, 1
SESSION = 7
HISTORY_TOKENS = 300


def next_round(home: int) -> Request:
    return Request(2, 0.0, HISTORY_TOKENS + 100, 10, session_id=SESSION, round_index=1,
                   history_tokens=HISTORY_TOKENS, home_instance=home, retain_kv=True)


def simulated(target_role: Role, home_serving: bool) -> tuple[Simulator, Request]:
    """A 2-instance simulated cluster whose home instance keeps the session's history."""
    policy, count = build_policy(policy_setup(PERF, SLO(5.0, 0.5), PolicyConfig("static-pd"),
                                              prefill=1, decode=1))
    sim = Simulator(policy, count, PERF, sim_settings())
    home = sim.instances[HOME].local
    first = Request(1, 0.0, HISTORY_TOKENS - 20, 21, session_id=SESSION, retain_kv=True)
    run_here(home, first)
    assert SESSION in home.sessions
    board = sim.scheduler.board
    board.set_role(HOME, Role.DECODE)
    board.set_role(OTHER, target_role)
    board.take_changes()
    if not home_serving:
        sim.lifecycle.stop(HOME, 0.0)
    request = next_round(HOME)
    sim.sessions.on_arrival(request)
    return sim, request


def run_here(local: LocalScheduler, request: Request) -> None:
    local.enqueue_prefill(request)
    while request.generated_tokens < request.output_tokens:
        plan = local.plan()
        assert plan is not None
        result = local.complete(plan)
        for held in result.prefilled:
            local.continue_in_place(held)


def sim_outcome(target: int, target_role: Role, home_serving: bool) -> HistorySource:
    sim, request = simulated(target_role, home_serving)
    stats_before = (sim.sessions.stats.local_prefills, sim.sessions.stats.remote_prefills,
                    sim.sessions.stats.history_recomputed)
    sim._apply([DispatchPrefill(request, target)])
    stats = sim.sessions.stats
    local, remote, recomputed = (stats.local_prefills - stats_before[0],
                                 stats.remote_prefills - stats_before[1],
                                 stats.history_recomputed - stats_before[2])
    waiting = sim.instances[target].local.history.waiting_for_read(request)
    if local:
        assert request.cached_prefix_tokens == HISTORY_TOKENS  # took the history over
        return HistorySource.LOCAL
    assert remote == 1
    if waiting:
        assert request.cached_prefix_tokens == HISTORY_TOKENS
        return HistorySource.READ
    assert request.cached_prefix_tokens == 0  # computes it all
    assert SESSION not in sim.instances[HOME].local.sessions  # the copy at home dropped
    return HistorySource.RECOMPUTE if recomputed else HistorySource.GONE


def live_outcome(target: int, target_role: Role, home_serving: bool) -> HistorySource:
    policy, count = build_policy(policy_setup(PERF, SLO(5.0, 0.5), PolicyConfig("static-pd"),
                                              prefill=1, decode=1))
    serve = serve_defaults()
    driver = LiveDriver(policy, count, TextTokenizer.shipped(), worker_settings(),
                        serve.monitor.interval_s, serve.server.max_outstanding)
    driver.view.instances = [InstanceStats.empty(i, 1024) for i in range(count)]
    for i in range(count):
        driver.set_load(i, InstanceStats.empty(i, 1024))
    driver.workers.states = [WorkerState.LIVE] * count
    if not home_serving:
        driver.workers.states[HOME] = WorkerState.RESTARTING
    sent: list[tuple[int, object]] = []
    driver.workers.send = lambda instance, command: sent.append((instance, command))  # type: ignore[method-assign]
    board = driver.scheduler.board
    board.set_role(HOME, Role.DECODE)
    board.set_role(OTHER, target_role)
    board.take_changes()
    request = next_round(HOME)
    request.cached_prefix_tokens = HISTORY_TOKENS  # the binding's estimate (LiveSessions)
    params = SamplingParams(max_tokens=10)
    driver.live[request.request_id] = LiveRequest(
        request, tuple(range(request.input_tokens)), params,
        TextStream(driver.tokenizer, params.stop, params.min_tokens))
    driver._apply([DispatchPrefill(request, target)])
    instance, command = sent[-1]
    if isinstance(command, ExportHistory):
        assert sent == [(HOME, ExportHistory(request.request_id, SESSION))]
        return HistorySource.READ
    assert isinstance(command, AddRequest) and instance == target
    assert command.history is None
    if target == HOME:
        assert len(sent) == 1
        return HistorySource.LOCAL
    assert request.cached_prefix_tokens == 0  # computes it all
    if sent[:-1] == [(HOME, DropHistory(SESSION))]:  # the copy at home dropped
        return HistorySource.RECOMPUTE
    assert len(sent) == 1 and not home_serving
    return HistorySource.GONE


@pytest.mark.parametrize("target,target_role,home_serving", [
    (HOME, Role.DECODE, True), *itertools.product(
        (OTHER,), (Role.PREFILL, Role.MIXED, Role.DECODE), (True, False))])
def test_both_worlds_decide_a_rounds_history_alike(target: int, target_role: Role,
                                                   home_serving: bool) -> None:
    role = Role.DECODE if target == HOME else target_role
    pinned = next_round(HOME)
    pinned.cached_prefix_tokens = HISTORY_TOKENS  # as both worlds have it at dispatch
    expected = history_source(pinned, target, role, home_serving)
    if target == OTHER:  # the shared decision itself, by where the round lands
        assert expected is {Role.PREFILL: HistorySource.READ,
                            Role.MIXED: HistorySource.RECOMPUTE,
                            Role.DECODE: HistorySource.RECOMPUTE}[target_role] \
            if home_serving else expected is HistorySource.GONE
    else:
        assert expected is HistorySource.LOCAL
    assert sim_outcome(target, target_role, home_serving) is expected
    assert live_outcome(target, target_role, home_serving) is expected
