"""The candidates of a plan: every deployment of every search space on the GPUs given.

A `Candidate` is a set of config values (dotted paths: the preset, the split, the degree, the
chunk size, the policy's knobs) plus the `Deployment` they make, which is what the analytic
screen prices (`screen.py`): groups of identical instances, each with its degree, token
budget and the phases it runs. Knobs of the policy's own (Arrow's dwell, ARES's theta) do not
change the deployment: the screen scores their candidates alike and the simulations tell
them apart. The instances' batch limit does: a deployment the plan's limit holds back (by the
screen) is a candidate again at `BATCH_LIMIT_SEARCHED` sequences (`with_batch_limit`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pdserve.cluster import hardware
from pdserve.config import Config
from pdserve.perf.fitted import PerfModel
from pdserve.perf.specs import check_tp, model_spec
from pdserve.planning.splits import split_counts
from pdserve.planning.taichi import DISAGGREGATED_CHUNK_TOKENS, slider_grid
from pdserve.policies.search import SearchSpace
from pdserve.types import Role

DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class InstanceGroup:
    count: int
    tp: int
    chunk_tokens: int  # per-step token budget (prefill tokens and decodes together)
    prefill: bool  # runs prefills
    decode: bool  # runs decodes
    max_batch_size: int | None = None  # sequences an instance batches (None: the plan's)

    @property
    def gpus(self) -> int:
        return self.count * self.tp

    @property
    def role(self) -> str:
        return "mixed" if self.prefill and self.decode else (
            "prefill" if self.prefill else "decode")


@dataclass(frozen=True)
class Deployment:
    groups: tuple[InstanceGroup, ...]

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def moves_kv(self) -> bool:
        """Prefills hand their KV to another instance (a prefill-only group exists)."""
        return any(g.prefill and not g.decode for g in self.groups)

    def describe(self) -> str:
        return " + ".join(f"{g.count}x{g.role[0].upper()} TP{g.tp}"
                          + (f" @{g.chunk_tokens}" if g.prefill else "")
                          + (f" bs{g.max_batch_size}" if g.max_batch_size and g.decode else "")
                          for g in self.groups)

    def with_batch_limit(self, max_batch_size: int) -> Deployment:
        return Deployment(tuple(replace(g, max_batch_size=max_batch_size)
                                for g in self.groups))


@dataclass(frozen=True)
class Candidate:
    space: str  # the search space's name (the plan's table row)
    values: tuple[tuple[str, Any], ...]  # config values by dotted path, in a fixed order
    deployment: Deployment
    proposed_by: str = ""  # "" : the grid; "ampd-ilp": AMPD's ILP (`proposals.py`)
    # the settings of another policy that simulates exactly alike (TaiChi's aggregation
    # points are `colocated`, sec. 3.1 of its settings): trials run once for both
    simulates_as: tuple[tuple[str, Any], ...] = ()

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.values)

    @property
    def simulation_key(self) -> tuple[tuple[str, Any], ...]:
        return self.simulates_as or self.values

    def config(self, base: Config) -> Config:
        return base.with_values(self.settings)

    @property
    def knobs(self) -> dict[str, Any]:
        """The policy's own settings (besides the deployment's)."""
        return {k: v for k, v in self.values if k.startswith("policy.") and k != "policy.name"}

    @property
    def reserve(self) -> tuple[int, int]:
        """FlowKV's instances held back (not in the deployment the screen prices): (count,
        degree)."""
        settings = self.settings
        spec = settings.get("cluster.instances")
        if isinstance(spec, str):
            held = [g for g in hardware.parse_instances(spec) if g.role is Role.RESERVE]
            return (held[0].count, held[0].tp) if held else (0, 0)
        return int(settings.get("cluster.reserve", 0)), int(settings.get("perf.tp", 0))

    @property
    def gpus(self) -> int:
        """The GPUs the candidate takes: its deployment's and its reserve's (FlowKV holds
        them back, but they are bought all the same: goodput per GPU divides by them)."""
        count, tp = self.reserve
        return self.deployment.gpus + count * tp

    def describe(self) -> str:
        knobs = " ".join(f"{k.split('.')[-1]}={v}" for k, v in self.knobs.items()
                         if not k.startswith("policy.taichi.chunk"))
        count, tp = self.reserve
        held = f" + {count}xR TP{tp}" if count else ""
        return self.deployment.describe() + held + (f" {knobs}" if knobs else "")


def feasible_degrees(model: str, gpus: int, perfs: Callable[[int], PerfModel]) -> list[int]:
    """The tensor-parallel degrees the model divides and fits on (`perfs(tp)` builds the
    instance's performance model or raises), within `gpus`."""
    spec, degrees = model_spec(model), []
    for degree in DEGREES:
        if degree > gpus or gpus % degree:
            continue
        try:
            check_tp(spec, degree)
            perfs(degree)
        except ValueError:
            continue  # does not divide the heads, or the weights do not fit
        degrees.append(degree)
    return degrees


def _knob_settings(space: SearchSpace, skip: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    knobs = [k for k in space.knobs if k.path not in skip]
    for combo in itertools.product(*(k.values for k in knobs)):
        yield dict(zip((k.path for k in knobs), combo, strict=True))


def _candidate(space: SearchSpace, values: Mapping[str, Any], deployment: Deployment
               ) -> Candidate:
    merged = {"policy.name": space.preset, **space.fixed, **values}
    return Candidate(space.name, tuple(merged.items()), deployment)


def enumerate_candidates(space: SearchSpace, gpus: int, degrees: list[int]) -> list[Candidate]:
    """Every deployment of `space` on `gpus` GPUs (all in use) at each degree."""
    found: list[Candidate] = []
    for tp in degrees:
        instances = gpus // tp
        if space.shape == "colocated":
            for chunk, knobs in itertools.product(space.chunk_sizes, _knob_settings(space)):
                found.append(_candidate(space, {
                    "perf.tp": tp, "cluster.instances": instances,
                    "instance.chunk_size_tokens": chunk, **knobs},
                    Deployment((InstanceGroup(instances, tp, chunk, True, True),))))
        elif space.shape == "disaggregated":
            for chunk, knobs in itertools.product(space.chunk_sizes, _knob_settings(space)):
                serving = instances - int(knobs.get("cluster.reserve", 0))
                for prefill in split_counts(serving):
                    decode = serving - prefill
                    found.append(_candidate(space, {
                        "perf.tp": tp, "cluster.prefill": prefill, "cluster.decode": decode,
                        "instance.chunk_size_tokens": chunk, **knobs},
                        Deployment((InstanceGroup(prefill, tp, chunk, True, False),
                                    InstanceGroup(decode, tp, chunk, False, True)))))
        else:
            found.extend(_taichi_candidates(space, instances, tp))
    return found


def mixed_degree_candidates(space: SearchSpace, gpus: int, degrees: list[int], gpu: str
                            ) -> list[Candidate]:
    """The deployments of a disaggregated `space` whose pools differ in degree: `p` prefill
    instances at degree `a`, `d` decode instances at `b != a`, `p a + d b == gpus` (all in
    use), both degrees from `degrees`, each chunk size and knob setting. A reserve instance
    (FlowKV's `cluster.reserve` knob) takes either pool's degree, since Alg. 1 lends it to
    whichever pool is overloaded: both are tried, `p a + d b + reserve == gpus`. None for a
    space that declares why its pools share one degree (`SearchSpace.one_degree`, Arrow's),
    nor for the other shapes: colocated instances all run both phases, and TaiChi's sliders
    make P-heavy and D-heavy instances of one kind (its Alg. 1 flows decodes between them,
    priced by one model). The same-degree deployments are `enumerate_candidates`'."""
    if space.shape != "disaggregated" or space.one_degree:
        return []
    found: list[Candidate] = []
    for chunk, settings in itertools.product(space.chunk_sizes, _knob_settings(space)):
        reserve = int(settings.get("cluster.reserve", 0))  # in the groups, not a count
        knobs = {k: v for k, v in settings.items() if k != "cluster.reserve"}
        for a, b in itertools.permutations(degrees, 2):
            for reserve_tp in ((a, b) if reserve else (0,)):
                serving = gpus - reserve * reserve_tp
                for prefill in split_counts(serving // a + 1):
                    rest = serving - prefill * a
                    if rest <= 0 or rest % b:
                        continue
                    deployment = Deployment((InstanceGroup(prefill, a, chunk, True, False),
                                             InstanceGroup(rest // b, b, chunk, False, True)))
                    found.append(_candidate(space, {
                        "cluster.instances": instances_spec(deployment, gpu, reserve,
                                                            reserve_tp),
                        "instance.chunk_size_tokens": chunk, **knobs}, deployment))
    return found


def instances_spec(deployment: Deployment, gpu: str, reserve: int = 0, reserve_tp: int = 0
                   ) -> str:
    """`cluster.instances` for `deployment` on `gpu` GPUs, each group at its degree, and
    `reserve` instances of degree `reserve_tp` held back (FlowKV's)."""
    groups = [hardware.InstanceGroup(g.count, gpu, hardware.GROUP_ROLES[g.role], g.tp)
              for g in deployment.groups]
    if reserve:
        groups.append(hardware.InstanceGroup(reserve, gpu, Role.RESERVE, reserve_tp))
    return hardware.format_instances(groups)


def _taichi_candidates(space: SearchSpace, instances: int, tp: int) -> list[Candidate]:
    if instances < 2:
        return []
    values = {k.path: k.values for k in space.knobs}
    points = slider_grid(instances, values["policy.taichi.chunk_p_tokens"],
                         values["policy.taichi.chunk_d_tokens"])
    others = ("policy.taichi.chunk_p_tokens", "policy.taichi.chunk_d_tokens")
    found = []
    for point, knobs in itertools.product(points, _knob_settings(space, others)):
        settings = {"perf.tp": tp, "cluster.prefill": max(1, point.p_heavy),
                    "cluster.decode": point.d_heavy - (point.p_heavy == 0),
                    "policy.taichi.chunk_p_tokens": point.chunk_p_tokens,
                    "policy.taichi.chunk_d_tokens": point.chunk_d_tokens, **knobs}
        twin: dict[str, Any] = {}
        if point.mode == "aggregation":
            groups = (InstanceGroup(instances, tp, point.chunk_p_tokens, True, True),)
            if not knobs:
                twin = {"policy.name": "colocated", "perf.tp": tp,
                        "cluster.instances": instances,
                        "instance.chunk_size_tokens": point.chunk_p_tokens}
        elif point.mode == "disaggregation":
            groups = (InstanceGroup(point.p_heavy, tp, DISAGGREGATED_CHUNK_TOKENS, True, False),
                      InstanceGroup(point.d_heavy, tp, point.chunk_p_tokens, False, True))
        else:
            groups = (InstanceGroup(point.p_heavy, tp, point.chunk_p_tokens, True, True),
                      InstanceGroup(point.d_heavy, tp, point.chunk_d_tokens, True, True))
        candidate = _candidate(space, settings, Deployment(groups))
        found.append(replace(candidate, simulates_as=tuple(twin.items())))
    return found


# the batch limit the planner tries beside the plan's: the largest decode batch vLLM runs as
# a CUDA graph by default (`max_cudagraph_capture_size = min(2 max_num_seqs, 512)`; beyond
# it steps run eagerly, a host cost the performance model does not price). Its default limit
# on an H100-class GPU is 1,024 sequences (on an A100 or smaller, 256), pdserve's 256
BATCH_LIMIT_SEARCHED = 512


def with_batch_limit(candidate: Candidate, max_batch_size: int) -> Candidate:
    """`candidate` with its instances batching up to `max_batch_size` sequences
    (`instance.max_batch_size`), for a deployment whose decodes the plan's limit holds
    back (`screen.ScreenEstimate.batch_limited`)."""
    limit = (("instance.max_batch_size", max_batch_size),)
    return replace(candidate, values=candidate.values + limit,
                   deployment=candidate.deployment.with_batch_limit(max_batch_size),
                   simulates_as=candidate.simulates_as + limit if candidate.simulates_as
                   else ())
