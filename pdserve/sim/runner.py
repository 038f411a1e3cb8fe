"""From a config (`pdserve.config.Config`) to results: the workload, the performance model,
the policy, a run.

`Experiment` holds what does not change between runs (workload, performance model) so a
goodput search re-runs only the simulation at each rate scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.cluster.topology import GPU_LINK, GPUS_PER_NODE, Topology, gpu_link, network_link
from pdserve.config import Config, effective_prefix_block_tokens, effective_transfer_mode
from pdserve.metrics.attainment_watch import AttainmentWatch
from pdserve.metrics.goodput import GoodputPoint, GoodputResult, search_goodput
from pdserve.metrics.summary import Summary, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.perf.presets import default_tp, perf_model
from pdserve.perf.specs import model_spec
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.sim.hetero import ClusterLayout, check_layout_roles, heterogeneous_layout
from pdserve.sim.records import MAX_SPAN_STEPS
from pdserve.sim.simulator import MAX_TICKS, SimResult, SimSettings, Simulator
from pdserve.types import SLO, Role, add_control_latency, control_latency_shifts
from pdserve.workload.sessions import is_session_workload, session_workload
from pdserve.workload.synthetic import synthetic_workload
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload


def check_rate_to_scale(workload: Workload) -> None:
    """A goodput search (`simulate --goodput`, every plan) scales the workload's arrival
    rate: a workload arriving at one instant has none (ValueError, before any run)."""
    if not workload.mean_rate_rps > 0:
        raise ValueError(
            f"the goodput search scales the workload's arrival rate, and {workload.name!r} "
            f"has none to scale ({len(workload)} requests arriving at one instant); give it "
            f"arrival times (a trace, or a finite --synthetic-rate)")


def load_workload(config: Config) -> Workload:
    w = config.workload
    if w.trace == "synthetic":
        workload = synthetic_workload(w.synthetic_requests, w.synthetic_rate_rps,
                                      w.synthetic_lengths, w.synthetic_arrival, w.synthetic_cv,
                                      config.seed)
    elif is_session_workload(w.trace):  # sessions: synthetic_requests sessions started per
        workload = session_workload(w.trace, w.synthetic_requests,  # second at synthetic_rate
                                    w.synthetic_rate_rps, config.seed)
    else:
        workload = load_trace(w.trace)
    workload = workload.repeated(w.repeat)
    if w.start_s or w.duration_s is not None:
        workload = workload.window(w.start_s, w.duration_s)
    if w.max_requests is not None:
        workload = workload.head(w.max_requests)
    if len(workload) == 0:
        raise ValueError(f"the workload {w.trace!r} has no requests in the chosen window "
                         f"(start_s={w.start_s}, duration_s={w.duration_s})")
    return workload


def load_perf_model(config: Config) -> PerfModel:
    if config.perf.profile:
        return PerfModel.load(config.perf.profile)
    perf = config.perf
    return perf_model(perf.model, perf.gpu, perf.tp or None, perf.backend or None,
                      perf.host_overhead, config.instance.max_batch_size)


def kv_layers(config: Config) -> int:
    """The model's layers (per-block-per-layer transfer pricing); 32 for a fitted file."""
    return 32 if config.perf.profile else model_spec(config.perf.model).layers


def tp_degree(config: Config) -> int:
    perf = config.perf
    return perf.tp or (1 if perf.profile else default_tp(perf.model, perf.gpu))


def instances_per_node(config: Config) -> int:
    """The config's, or as many instances as fit on an 8-GPU node at the setup's tp."""
    return config.cluster.instances_per_node or max(1, GPUS_PER_NODE // tp_degree(config))


def build_topology(config: Config, perf: PerfModel, num_instances: int) -> Topology:
    """The config's network. Between nodes each GPU has its own card (GPUDirect RDMA, as
    on DGX/HGX servers) and each tensor-parallel rank sends its share of the KV, so an
    instance's network port carries tp times the named link's bandwidth."""
    cluster = config.cluster
    intra = (gpu_link(perf) if cluster.intra_node_link == GPU_LINK
             else network_link(cluster.intra_node_link))
    inter, tp = network_link(cluster.inter_node_link), tp_degree(config)
    return Topology.build([intra] * num_instances, instances_per_node(config),
                          inter.aggregated(tp))


def sim_settings(config: Config, max_span_steps: int = MAX_SPAN_STEPS) -> SimSettings:
    """The simulator's settings for a run of `config` (the preset's transfer mode and
    prefix cache where the config leaves them)."""
    return SimSettings(chunk_size_tokens=config.instance.chunk_size_tokens,
                       max_batch_size=config.instance.max_batch_size,
                       transfer_calls=config.sim.transfer_calls,
                       monitor_interval_s=config.monitor.interval_s,
                       transfer_mode=effective_transfer_mode(config),
                       kv_layers=kv_layers(config),
                       prefix_block_tokens=effective_prefix_block_tokens(config),
                       instance_startup_s=config.sim.instance_startup_s, seed=config.seed,
                       max_span_steps=max_span_steps)


def control_latency(config: Config, perf: PerfModel) -> tuple[float, float]:
    """The control plane's latency per request the simulator adds, (median, P90): the
    config's `sim.control_latency_s` (its P90: `sim.control_latency_p90_s`, 0 when unset)
    where it sets one, else the performance model's, as measured in situ (0 for the
    presets and profiles)."""
    sim = config.sim
    if sim.control_latency_s is None:
        return perf.control_latency_s, perf.control_latency_p90_s
    return sim.control_latency_s, sim.control_latency_p90_s or 0.0


def policy_setup(config: Config, perf: PerfModel,
                 layout: ClusterLayout | None = None) -> PolicySetup:
    """What building the config's policy needs in a simulation with `perf` (`layout`: the
    cluster's GPU groups, when the config gives some)."""
    cluster = config.cluster
    perfs: tuple[PerfModel, ...] = layout.perfs if layout else ()
    return PolicySetup(
        perfs[0] if perfs else perf, config.slo.targets(), config.policy,
        instances=len(perfs) if layout else int(cluster.instances),
        prefill=layout.count(Role.PREFILL) if layout else cluster.prefill,
        decode=layout.count(Role.DECODE) if layout else cluster.decode,
        reserve=cluster.reserve, perfs=perfs,
        roles=layout.roles if layout and config.policy.name == "flowkv" else (),
        chunk_size_tokens=config.instance.chunk_size_tokens,
        max_batch_size=config.instance.max_batch_size,
        monitor_window_s=config.monitor.window_s,
        prefix_block_tokens=effective_prefix_block_tokens(config),  # 0: flowkv's own
        seed=config.seed)


@dataclass
class Experiment:
    config: Config
    workload: Workload
    perf: PerfModel
    # one model per instance (e.g. in-situ fits per worker); default: `perf` for every one
    instance_perfs: tuple[PerfModel, ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> Experiment:
        return cls(config, load_workload(config), load_perf_model(config))

    @property
    def slo(self) -> SLO:
        return self.config.slo.targets()

    def policy_setup(self, layout: ClusterLayout | None = None) -> PolicySetup:
        """What building the config's policy needs, on this run's cluster (`layout`: its
        GPU groups, when the config gives some)."""
        return policy_setup(self.config, self.perf, layout)

    def simulate(self, rate_scale: float | None = None, max_span_steps: int = MAX_SPAN_STEPS,
                 on_progress: Callable[[int], None] | None = None,
                 decide_attainment: float | None = None,
                 stop_on_pass: bool = True) -> SimResult:
        """One run at `rate_scale` (the config's by default). `decide_attainment`: stop as
        soon as whether the SLO attainment reaches this target is decided
        (`metrics/attainment_watch.py`: a goodput step); with `stop_on_pass` False only a
        failing run stops early, a passing one runs to its end."""
        config = self.config
        layout = (heterogeneous_layout(config) if isinstance(config.cluster.instances, str)
                  else None)
        perfs: tuple[PerfModel, ...] = layout.perfs if layout else ()
        policy, count = build_policy(self.policy_setup(layout))
        settings = sim_settings(config, max_span_steps)
        workload = self.workload.scaled(config.workload.rate_scale if rate_scale is None
                                        else rate_scale)
        if layout is not None:
            check_layout_roles(config.policy.name, layout.roles)
        topology = layout.topology if layout else build_topology(config, self.perf, count)
        models = list(perfs) or list(self.instance_perfs) or self.perf
        requests = workload.requests()
        latency = control_latency(config, self.perf)
        watch = None if decide_attainment is None else AttainmentWatch(
            requests, self.slo, decide_attainment,
            control_latency_shifts(len(requests), *latency, config.seed), stop_on_pass)
        result = Simulator(policy, count, models, settings, topology).run(
            requests, on_progress, watch)
        add_control_latency(result.requests, *latency, config.seed)
        return result

    def summarize(self, result: SimResult) -> Summary:
        return summarize(result.requests, self.slo)

    def goodput(self, on_point: Callable[[GoodputPoint], None] | None = None,
                stop_when_decided: bool = True) -> GoodputResult:
        """The goodput search; each step's run stops once its attainment is decided either
        way (`stop_when_decided`), which changes no verdict and so not the result, only the
        figures of the stopped points (see `metrics/attainment_watch.py`)."""
        check_rate_to_scale(self.workload)
        target = self.config.goodput.target
        decide = target if stop_when_decided else None
        # no lower than a run the simulator can tick through (half its MAX_TICKS): an
        # unreachable SLO searched azure-conv down to 1/512 of its rate, 1.8 M s of
        # arrivals, and ended in the tick limit's error instead of "below"
        lowest = self.workload.span_s / (0.5 * MAX_TICKS * self.config.monitor.interval_s)
        return search_goodput(
            lambda scale: self.summarize(self.simulate(scale, decide_attainment=decide)),
            self.workload.mean_rate_rps, target, self.config.goodput.tolerance,
            on_point=on_point, min_scale=lowest)
