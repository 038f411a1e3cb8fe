"""From a `SimConfig` to results: the workload, the performance model, the policy, a run.

`Experiment` holds what does not change between runs (workload, performance model) so a
goodput search re-runs only the simulation at each rate scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pdserve.cluster.topology import GPU_LINK, Topology, gpu_link, network_link
from pdserve.config import SimConfig, effective_prefix_block_tokens, effective_transfer_mode
from pdserve.instance.phase_priority import parse_phase_priority
from pdserve.metrics.goodput import GoodputPoint, GoodputResult, search_goodput
from pdserve.metrics.summary import Summary, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.perf.presets import default_tp, perf_model
from pdserve.perf.specs import model_spec
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.sim.hetero import check_layout_roles, heterogeneous_layout
from pdserve.sim.simulator import SimResult, SimSettings, Simulator
from pdserve.types import SLO, Role, add_control_latency
from pdserve.workload.sessions import is_session_workload, session_workload
from pdserve.workload.synthetic import synthetic_workload
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload


def load_workload(config: SimConfig) -> Workload:
    if config.trace == "synthetic":
        workload = synthetic_workload(config.synthetic_requests, config.synthetic_rate_rps,
                                      config.synthetic_lengths, config.synthetic_arrival,
                                      config.synthetic_cv, config.seed)
    elif is_session_workload(config.trace):  # sessions: synthetic_requests sessions started
        workload = session_workload(config.trace, config.synthetic_requests,  # per second at
                                    config.synthetic_rate_rps, config.seed)  # synthetic_rate
    else:
        workload = load_trace(config.trace)
    if config.start_s or config.duration_s is not None:
        workload = workload.window(config.start_s, config.duration_s)
    if config.max_requests is not None:
        workload = workload.head(config.max_requests)
    if len(workload) == 0:
        raise ValueError(f"the workload {config.trace!r} has no requests in the chosen window "
                         f"(start_s={config.start_s}, duration_s={config.duration_s})")
    return workload


def load_perf_model(config: SimConfig) -> PerfModel:
    if config.perf_model:
        return PerfModel.load(config.perf_model)
    return perf_model(config.model, config.gpu, config.tp or None)


GPUS_PER_NODE = 8  # the papers' servers (DGX/HGX: 8 GPUs on one NVSwitch)


def kv_layers(config: SimConfig) -> int:
    """The model's layers (per-block-per-layer transfer pricing); 32 for a fitted file."""
    return 32 if config.perf_model else model_spec(config.model).layers


def tp_degree(config: SimConfig) -> int:
    return config.tp or (1 if config.perf_model else default_tp(config.model, config.gpu))


def instances_per_node(config: SimConfig) -> int:
    """The config's, or as many instances as fit on an 8-GPU node at the setup's tp."""
    return config.instances_per_node or max(1, GPUS_PER_NODE // tp_degree(config))


def build_topology(config: SimConfig, perf: PerfModel, num_instances: int) -> Topology:
    """The config's network. Between nodes each GPU has its own card (GPUDirect RDMA, as
    on DGX/HGX servers) and each tensor-parallel rank sends its share of the KV, so an
    instance's network port carries tp times the named link's bandwidth."""
    intra = (gpu_link(perf) if config.intra_node_link == GPU_LINK
             else network_link(config.intra_node_link))
    inter, tp = network_link(config.inter_node_link), tp_degree(config)
    return Topology.build([intra] * num_instances, instances_per_node(config),
                          inter.aggregated(tp))


@dataclass
class Experiment:
    config: SimConfig
    workload: Workload
    perf: PerfModel
    flowkv: FlowKVSettings | None = None  # flowkv's tunables (default: FlowKVSettings())
    # one model per instance (e.g. in-situ fits per worker); default: `perf` for every one
    instance_perfs: tuple[PerfModel, ...] = ()

    @classmethod
    def from_config(cls, config: SimConfig) -> Experiment:
        return cls(config, load_workload(config), load_perf_model(config))

    @property
    def slo(self) -> SLO:
        return SLO(self.config.ttft_slo_s, self.config.tpot_slo_s)

    def simulate(self, rate_scale: float | None = None, max_span_steps: int = 1 << 20,
                 on_progress: Callable[[int], None] | None = None) -> SimResult:
        """One run at `rate_scale` (the config's by default)."""
        config = self.config
        layout = heterogeneous_layout(config) if isinstance(config.instances, str) else None
        perfs: tuple[PerfModel, ...] = layout.perfs if layout else ()
        policy, count = build_policy(config.policy, PolicySetup(
            perfs[0] if perfs else self.perf, self.slo,
            instances=len(perfs) if layout else int(config.instances),
            prefill=layout.count(Role.PREFILL) if layout else config.prefill,
            decode=layout.count(Role.DECODE) if layout else config.decode,
            perfs=perfs, roles=layout.roles if layout and config.policy == "flowkv" else (),
            reserve=config.reserve, prefix_aware=config.prefix_aware_routing,
            flowkv=replace(self.flowkv or FlowKVSettings(),
                           prefix_block_tokens=effective_prefix_block_tokens(config) or 512),
            chunk_size_tokens=config.chunk_size_tokens,
            max_batch_size=config.max_batch_size, monitor_window_s=config.monitor_window_s,
            prefill_router=config.prefill_router, decode_router=config.decode_router,
            arrow_min_dwell_s=config.arrow_min_dwell_s,
            arrow_monitor_cooldown_s=config.arrow_monitor_cooldown_s,
            taichi=config.taichi_settings(), rebalancer=config.rebalancer,
            ares=config.ares_settings()))
        if config.phase_priority:
            policy.phase_priority = parse_phase_priority(config.phase_priority)
        settings = SimSettings(config.chunk_size_tokens, config.max_batch_size,
                               config.transfer_calls, config.monitor_interval_s, max_span_steps,
                               effective_transfer_mode(config), kv_layers(config),
                               effective_prefix_block_tokens(config),
                               config.instance_startup_s, config.seed)
        workload = self.workload.scaled(config.rate_scale if rate_scale is None else rate_scale)
        if layout is not None:
            check_layout_roles(config.policy, layout.roles)
        topology = layout.topology if layout else build_topology(config, self.perf, count)
        models = list(perfs) or list(self.instance_perfs) or self.perf
        result = Simulator(policy, count, models, settings, topology).run(
            workload.requests(), on_progress)
        add_control_latency(result.requests, config.control_latency_s,
                            config.control_latency_p90_s, config.seed)
        return result

    def summarize(self, result: SimResult) -> Summary:
        return summarize(result.requests, self.slo)

    def goodput(self, on_point: Callable[[GoodputPoint], None] | None = None) -> GoodputResult:
        return search_goodput(lambda scale: self.summarize(self.simulate(scale)),
                              self.workload.mean_rate_rps, self.config.goodput_target,
                              self.config.goodput_tolerance, on_point=on_point)
