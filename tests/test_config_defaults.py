"""Each default stated once (issue 23): the internal parameter objects that the config tree
(`pdserve.config`) feeds do not state its defaults again.

`SOURCES` names, for every parameter of each such object, the config path its value comes
from (and how a run resolves it, where it does), or why it has none. A parameter added
without an entry fails the first test; a default kept on a parameter that has a config
path must be the tree's (the serve defaults' for the live world's objects); and the
builders that take a config (`pdserve.sim.runner`, `pdserve.server.launch`, the AMPD
planner) must hand each object the values at those paths.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from conftest import make_perf

from pdserve.config import (
    Config,
    default_of,
    effective_prefix_block_tokens,
    effective_transfer_mode,
    field_type,
    serve_defaults,
)
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.metrics.goodput import search_goodput
from pdserve.planning.ampd import plan_defaults, plan_inputs
from pdserve.planning.ampd_inputs import PlanInputs
from pdserve.policies.ampd.context import AmpdContext
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.flowkv.prefill_router import FlowKVPrefillRouter
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.policies.taichi.context import TaiChiContext
from pdserve.policies.taichi.preset import build_taichi
from pdserve.server.app import ServerSettings
from pdserve.sim.records import SimSettings
from pdserve.sim.runner import kv_layers, policy_setup, sim_settings
from pdserve.sim.simulator import Simulator
from pdserve.workload.synthetic import synthetic_workload


@dataclass(frozen=True)
class Path:
    """A config path; `resolve`: the value a run takes from a config, where the run
    resolves the path (the preset's when the config leaves it, say)."""

    path: str
    resolve: Callable[[Config], Any] | None = None

    def value(self, config: Config) -> Any:
        return self.resolve(config) if self.resolve else default_of(config, self.path)


def _slo(config: Config) -> Any:
    return config.slo.targets()


SIM, SERVE, PLAN = Config(), serve_defaults(), plan_defaults()

# object -> (the config whose defaults it follows, {parameter: its config path, or why it
# has none})
SOURCES: dict[Any, tuple[Config, dict[str, Path | str]]] = {
    SimSettings: (SIM, {
        "chunk_size_tokens": Path("instance.chunk_size_tokens"),
        "max_batch_size": Path("instance.max_batch_size"),
        "transfer_calls": Path("sim.transfer_calls"),
        "monitor_interval_s": Path("monitor.interval_s"),
        "transfer_mode": Path("sim.transfer_mode", effective_transfer_mode),
        "kv_layers": Path("perf.model", kv_layers),
        "prefix_block_tokens": Path("instance.prefix_block_tokens",
                                    effective_prefix_block_tokens),
        "instance_startup_s": Path("sim.instance_startup_s"),
        "seed": Path("seed"),
        "max_span_steps": "the simulator's span cap (1: step by step), a driver setting",
    }),
    PolicySetup: (SIM, {
        "perf": "the performance model, loaded from perf.* (the profile in the live world)",
        "slo": Path("slo", _slo),
        "policy": Path("policy"),
        "instances": Path("cluster.instances"),
        "prefill": Path("cluster.prefill"),
        "decode": Path("cluster.decode"),
        "reserve": Path("cluster.reserve"),
        "perfs": "a heterogeneous cluster's models, from cluster.instances groups",
        "roles": "a heterogeneous cluster's roles, from cluster.instances groups",
        "output_lengths_known": "the world's: True in a simulation, False live (max_tokens)",
        "chunk_size_tokens": Path("instance.chunk_size_tokens"),
        "max_batch_size": Path("instance.max_batch_size"),
        "monitor_window_s": Path("monitor.window_s"),
        "prefix_block_tokens": Path("instance.prefix_block_tokens",
                                    effective_prefix_block_tokens),
        "seed": Path("seed"),
    }),
    LocalScheduler: (SIM, {
        "instance_id": "the instance",
        "total_blocks": "its KV pool: the performance model's capacity, or the engine's",
        "chunk_size_tokens": Path("instance.chunk_size_tokens"),
        "max_batch_size": Path("instance.max_batch_size"),
        "queue_order": "the policy's prefill queue order",
        "phase_priority": "the policy's phase priority",
        "prefix_cache": "built by the world when instance.prefix_block_tokens (or the engine's "
                        "prefix block size) asks for one",
    }),
    ArrowContext: (SIM, {
        "ttft_slo_s": Path("slo.ttft_s"),
        "tpot_slo_s": Path("slo.tpot_s"),
        "predictor": "profiled on the performance model (Arrow sec. 4.2)",
        "monitor": "the instance monitor over monitor.window_s",
        "max_running_tokens": "derived from the performance model and the TPOT SLO",
        "max_batch_size": Path("instance.max_batch_size"),
        "low_fraction": "Arrow's load-test fraction (the module docstring's LOW_FRACTION)",
        "busy_fraction": "Arrow's load-test fraction (the module docstring's BUSY_FRACTION)",
        "min_dwell_s": Path("policy.arrow.min_dwell_s"),
        "monitor_cooldown_s": Path("policy.arrow.monitor_cooldown_s"),
        "flipped_at_s": "state: when each instance last changed side",
        "monitor_flipped_at_s": "state: when the monitor last flipped one",
        "derive_terms": "how predictor and max_running_tokens follow from a performance "
                        "model (profiled_terms at instance.chunk_size_tokens, slo.tpot_s, "
                        "instance.max_batch_size)",
        "perf": "the performance model they were derived from",
    }),
    TaiChiContext: (SIM, {
        "layout": "the sliders' instance layout (cluster.prefill : cluster.decode)",
        "settings": Path("policy.taichi", lambda c: replace(c.policy.taichi, seed=c.seed)),
        "slo": Path("slo", _slo),
        "perf": "the performance model",
        "max_batch_size": Path("instance.max_batch_size"),
        "decodes": "state: the decodes it tracks",
    }),
    build_taichi: (SIM, {
        "perf": "the performance model",
        "slo": Path("slo", _slo),
        "p_heavy": Path("cluster.prefill"),
        "d_heavy": Path("cluster.decode"),
        "settings": Path("policy.taichi", lambda c: replace(c.policy.taichi, seed=c.seed)),
        "max_batch_size": Path("instance.max_batch_size"),
    }),
    AmpdContext: (SIM, {
        "ttft_slo_s": Path("slo.ttft_s"),
        "itl_slo_s": Path("slo.tpot_s"),
        "perfs": "the instances' performance models",
        "window_s": "Alg. 1's windowed TTFT and ITL span (AMPD's, no config path)",
        "alpha": Path("policy.ampd.alpha"),
        "beta": Path("policy.ampd.beta"),
        "log_size": "the routing decisions kept for the dashboard",
        "counts": "state: routing decisions by kind",
        "_ttft": "state: windowed TTFT samples",
    }),
    FlowKVPrefillRouter: (SIM, {
        "context": "FlowKV's shared context",
        "prefix_aware": Path("policy.flowkv.prefix_aware_routing"),
    }),
    search_goodput: (SIM, {
        "run": "the simulation at a rate scale",
        "base_rate_rps": "the workload's mean rate",
        "target_attainment": Path("goodput.target"),
        "rel_tol": Path("goodput.tolerance"),
        "max_doublings": "the search's bound on doubling the rate",
        "on_point": "a progress callback",
        "start_scale": "a caller's guess (the planner's screen or shorter run)",
        "step": "the bracket's growth from the guess (the planner's fidelity)",
        "min_scale": "the lowest scale the simulator can tick through (`Experiment.goodput`)",
    }),
    synthetic_workload: (SIM, {
        "num_requests": Path("workload.synthetic_requests"),
        "rate_rps": Path("workload.synthetic_rate_rps"),
        "lengths": Path("workload.synthetic_lengths"),
        "arrival": Path("workload.synthetic_arrival"),
        "cv": Path("workload.synthetic_cv"),
        "seed": Path("seed"),
    }),
    PlanInputs: (PLAN, {
        "model": Path("perf.model"),
        "gpu": Path("perf.gpu"),
        "gpus": "the GPUs to deploy on (`pdserve plan --gpus`)",
        "slo": Path("slo", _slo),
        "workload": Path("workload.trace"),
        "sessions": Path("workload.synthetic_requests"),
        "rate_sps": Path("workload.synthetic_rate_rps"),
        "seed": Path("seed"),
        "ampd": Path("policy.ampd"),
        "backend": Path("perf.backend", lambda c: c.perf.backend or None),
        "host_overhead": Path("perf.host_overhead"),
    }),
    WorkerSettings: (SERVE, {
        "model": Path("engine.weights"),
        "seed": Path("seed"),
        "kv_blocks": Path("engine.kv_blocks"),  # 0 there: as many as fit in kv_cache_mib
        "chunk_size_tokens": Path("instance.chunk_size_tokens"),
        "max_batch_size": Path("instance.max_batch_size"),
        "phase_priority": Path("policy.phase_priority"),  # "" there: the policy's
        "prefix_block_tokens": Path("instance.prefix_block_tokens"),
        "queue_order": "the policy's prefill queue order",
        "perf": "the profile, for queue orders that read prefill estimates",
        "decode_forecast": "the policy's (ARES)",
        "device": "resolved from engine.device and engine.dtype (`resolve_device`)",
        "kv_block_bytes": "the served model's KV bytes per block in the engine's dtype (the "
                          "transfer metrics')",
        "start_timeout_s": "worker supervision (no config path)",
        "max_restarts": "worker supervision (no config path)",
        "restart_window_s": "worker supervision (no config path)",
        "restart_backoff_s": "worker supervision (no config path)",
        "restart_backoff_max_s": "worker supervision (no config path)",
    }),
    LiveDriver: (SERVE, {
        "policy": "the policy built from the config",
        "num_instances": "the policy's instance count (from cluster.*)",
        "tokenizer": "the served model's",
        "workers": "WorkerSettings (above)",
        "monitor_interval_s": Path("monitor.interval_s"),
        "max_outstanding": Path("server.max_outstanding"),
        "ray": Path("server.ray"),
        "perf_model": "whether the policy's performance model is provisional or profiled, "
                      "and where it came from (perf.profile, the cache or the probe)",
        "model_name": "the served name (server.served_model_name, else the model's): the "
                      "metrics' model_name label",
    }),
    ServerSettings: (SERVE, {
        "model_name": Path("server.served_model_name"),  # "" there: the model's name
        "context_tokens": Path("server.max_model_len"),  # 0 there: the model's context
        "vocab_size": "the served model's",
        "max_body_bytes": Path("server.max_body_bytes"),
        "api_key": Path("server.api_key", lambda c: c.server.api_key or None),
        "chat_template": "server.chat_template's file, else the checkpoint's own template",
        "url": "where it listens (server.host, server.port), for the start-up log line",
        "slo": Path("slo", _slo),
    }),
}


def parameters(target: Any) -> dict[str, Any]:
    """Each constructor parameter of `target` and its default (`inspect.Parameter.empty`
    where it has none)."""
    if dataclasses.is_dataclass(target):
        found = {}
        for f in dataclasses.fields(target):
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                found[f.name] = f.default_factory()
            else:
                found[f.name] = inspect.Parameter.empty
        return found
    return {name: p.default for name, p in inspect.signature(target).parameters.items()}


def label(target: Any) -> str:
    return target.__name__


@pytest.mark.parametrize("target", list(SOURCES), ids=label)
def test_every_parameter_names_its_config_path_or_why_it_has_none(target):
    config, sources = SOURCES[target]
    found = parameters(target)
    assert set(found) == set(sources), (
        f"{label(target)}: parameters without a source in SOURCES: "
        f"{sorted(set(found) - set(sources))}; entries for no parameter: "
        f"{sorted(set(sources) - set(found))}")
    for source in sources.values():
        if isinstance(source, Path):
            field_type(source.path)  # the path is in the tree


@pytest.mark.parametrize("target", list(SOURCES), ids=label)
def test_a_default_kept_on_a_config_value_is_the_config_trees(target):
    config, sources = SOURCES[target]
    for name, default in parameters(target).items():
        source = sources[name]
        if default is inspect.Parameter.empty or not isinstance(source, Path):
            continue
        assert default == source.value(config), (
            f"{label(target)}.{name} defaults to {default!r}, the config's {source.path} to "
            f"{source.value(config)!r}: state the default once (in the config tree), and take "
            f"it from there or make the parameter required")


def check_built(target: Any, built: Any, config: Config,
                names: tuple[str, ...] | None = None) -> None:
    """`built` (a `target`) holds the values at its parameters' config paths."""
    _, sources = SOURCES[target]
    checked = names or tuple(n for n, s in sources.items() if isinstance(s, Path))
    for name in checked:
        source = sources[name]
        assert isinstance(source, Path)
        assert getattr(built, name) == source.value(config), (
            f"{label(target)}.{name} is {getattr(built, name)!r}, not the config's "
            f"{source.path}: {source.value(config)!r}")


# every path the simulated world's objects take, off its default
SIM_CHANGES: dict[str, Any] = {
    "instance.chunk_size_tokens": 1024, "instance.max_batch_size": 96,
    "instance.prefix_block_tokens": 64, "sim.transfer_calls": 3,
    "sim.transfer_mode": "per-block-per-layer", "sim.instance_startup_s": 7.0,
    "monitor.interval_s": 0.25, "monitor.window_s": 2.5, "perf.model": "qwen3-32b",
    "seed": 5, "cluster.instances": 6, "cluster.prefill": 2, "cluster.decode": 3,
    "cluster.reserve": 1, "slo.ttft_s": 3.0, "slo.tpot_s": 0.1,
    "policy.arrow.min_dwell_s": 2.0, "policy.arrow.monitor_cooldown_s": 3.0,
    "policy.taichi.watermark": 0.9, "policy.ampd.alpha": 0.8, "policy.ampd.beta": 0.7,
    "policy.flowkv.prefix_aware_routing": False,
}


def test_a_simulation_hands_each_object_its_configs_values():
    config = Config().with_values(SIM_CHANGES)
    for path, value in SIM_CHANGES.items():
        assert default_of(SIM, path) != value, path  # each change is one
    perf = make_perf()
    check_built(SimSettings, sim_settings(config), config)
    check_built(PolicySetup, policy_setup(config, perf), config)

    def built(name: str) -> tuple[Any, Config]:
        named = config.with_values({"policy.name": name})
        policy, count = build_policy(policy_setup(named, perf))
        return policy, named

    policy, named = built("arrow")
    check_built(ArrowContext, policy.prefill_router.context, named)
    assert policy.prefill_router.context.monitor.window_s == config.monitor.window_s
    policy, named = built("taichi")
    check_built(TaiChiContext, policy.prefill_router.context, named)
    policy, named = built("ampd")
    check_built(AmpdContext, policy.prefill_router.context, named)
    policy, named = built("flowkv")
    check_built(FlowKVPrefillRouter, policy.prefill_router, named)
    policy, named = built("static-pd")
    simulator = Simulator(policy, 5, perf, sim_settings(named))
    for instance in simulator.instances:
        check_built(LocalScheduler, instance.local, named)


def test_the_ampd_planner_takes_its_inputs_from_its_config():
    config = PLAN.with_values({"seed": 3, "policy.ampd.window": 5, "perf.gpu": "h800",
                               "workload.synthetic_requests": 40, "perf.backend": "sglang",
                               "perf.host_overhead": "none"})
    check_built(PlanInputs, plan_inputs(config, 8), config)


def test_the_server_hands_each_object_its_configs_values(tmp_path, monkeypatch):
    import pdserve.server.launch as launch

    perf = tmp_path / "perf.json"
    make_perf().save(perf)
    changes: dict[str, Any] = {
        "engine.weights": "tiny", "engine.kv_blocks": 96, "seed": 5,
        "instance.chunk_size_tokens": 256, "instance.max_batch_size": 24,
        "instance.prefix_block_tokens": 32, "policy.phase_priority": "prefill-first",
        "monitor.interval_s": 0.3, "server.max_outstanding": 17,
        "server.max_body_bytes": 12345, "server.api_key": "k",
        "server.served_model_name": "m", "server.max_model_len": 100}
    for path, value in changes.items():
        assert default_of(SERVE, path) != value, path  # each change is one
    config = SERVE.with_values({**changes, "perf.profile": str(perf), "cluster.instances": 2})
    made: dict[str, Any] = {}
    monkeypatch.setattr(launch, "create_app", lambda driver, settings, **jobs: made.update(
        driver=driver, settings=settings))
    launch.build_app(config)
    driver = made["driver"]
    check_built(WorkerSettings, driver.workers.settings, config)
    check_built(LiveDriver, driver, config, ("monitor_interval_s", "max_outstanding"))
    check_built(ServerSettings, made["settings"], config)
