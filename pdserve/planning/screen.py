"""The planner's first fidelity: a steady-state analytic screen, from the same performance
model the simulator prices batches with (`PerfModel.batch_time_s`, `transfer_time_s`,
`kv_capacity_tokens`), with no queueing.

At an arrival rate r, each instance of a group carries its share of the prefill tokens and
of the decoding sequences. Its step time t is the fixed point of

    t = batch_time(B = a * t sequences, p = b * t prefill tokens)

(on an instance that runs both, the decode step plus p times a chunk's cost per prefill
token, `_chunk_cost_s`: a step carries a chunk or none, and t is the mean)

with a = (decode rate per instance) x E[output tokens] (Little's law: sequences in the batch)
and b = (prefill rate per instance) x E[input tokens] (tokens arriving per step), found by
iterating from an empty batch (the smallest fixed point; none below the bound: overloaded).
The instance keeps up when that t exists and B fits (memory: B x the mean decoding context
within the KV capacity; B within the batch limit), p fits the token budget left by the
decodes, and a decoding instance's t is within the TPOT SLO. A request's TTFT is its own
prefill at that load (its chunks in batches with the group's decodes, no waiting) plus its KV
transfer when it moves; its TPOT is t. The screen's goodput is the highest rate at which the
instances keep up and at least the target fraction of the workload's requests meet both SLOs.

Session rounds (`workload/sessions.py`) carry their history: on a prefill-only instance a
round reads the history from the instance that holds it and computes only its new tokens
(`cluster/sessions.py`, READ), so there the screen prices the new tokens, with the history
as attention context and history plus new tokens as the KV moved; on an instance that also
decodes it prices the whole input (RECOMPUTE, where a router without session affinity sends
most rounds; pessimistic for a round that lands on its history's instance), except on the
one instance of a deployment, where every round finds its history (LOCAL). Without this a
session workload's every deployment screened at 0 (AMPD's ToolBench: P90 input 4,003
tokens, P90 new tokens 1,224), and the planner simulated none of them in its time.

What it leaves out, and the simulations catch: queueing (bursts, the rate's variance), the
policies' dynamics (flips, migrations, reordering), preemption, contended links, prefix
caches and where each session round lands. Its error against the short simulations is
measured on every plan and reported (`PlanResult.screen_error`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pdserve.perf.fitted import PerfModel
from pdserve.planning.candidates import Deployment, InstanceGroup
from pdserve.types import SLO, attn_units
from pdserve.workload.workload import Workload

QUANTILES = 64  # input lengths the TTFT check prices (evenly spaced quantiles)
FIXED_POINT_STEPS = 80
# a step this long cannot keep up, whatever the SLO (an infinite TPOT SLO once let the
# fixed point run to an infinite step time)
MAX_STEP_S = 60.0
RATE_PRECISION = 0.005  # the goodput bisection stops within this (relative)


@dataclass(frozen=True)
class PrefillShape:
    """The prefills one kind of instance computes: each a number of new tokens after a
    context already held (0 for a whole prompt)."""

    quantiles: tuple[tuple[int, int], ...]  # QUANTILES of (new tokens, context), by new
    mean_tokens: float  # E[N]
    attn_units_per_token: float  # E[N (N + 2 H)] / E[N]: attention units per new token

    @classmethod
    def of(cls, new: np.ndarray, context: np.ndarray) -> PrefillShape:
        """Quantiles of the new tokens, each with the mean context of the prefills whose
        new tokens fall nearest it (0 where none has one)."""
        points = (np.arange(QUANTILES) + 0.5) / QUANTILES
        quantiles = np.quantile(new, points)
        if context.any():
            order = np.argsort(new, kind="stable")
            bins = np.array_split(context[order], QUANTILES)
            contexts = [int(round(b.mean())) if len(b) else 0 for b in bins]
        else:
            contexts = [0] * QUANTILES
        return cls(tuple((int(q), h) for q, h in zip(quantiles, contexts, strict=True)),
                   float(new.mean()), float((new * (new + 2 * context)).mean() / new.mean()))


@dataclass(frozen=True)
class WorkloadShape:
    """What the screen reads off a workload: its lengths."""

    whole: PrefillShape  # every input computed whole (an instance that also decodes)
    after_history: PrefillShape  # session rounds' new tokens after their history (a
    #   prefill-only instance); the same as `whole` for a workload without sessions
    mean_output: float
    decode_context: float  # the mean context a decoding sequence holds: E[O (I + O/2)] / E[O]

    @classmethod
    def of(cls, workload: Workload) -> WorkloadShape:
        requests = workload.requests()
        inputs = np.array([r.input_tokens for r in requests], dtype=float)
        history = np.array([min(r.history_tokens, r.input_tokens - 1) if r.history_tokens > 0
                            else 0 for r in requests], dtype=float)
        outputs = np.array([max(1, r.output_tokens) for r in requests], dtype=float)
        whole = PrefillShape.of(inputs, np.zeros_like(inputs))
        after = PrefillShape.of(inputs - history, history) if history.any() else whole
        return cls(whole, after, float(outputs.mean()),
                   float((outputs * (inputs + outputs / 2)).mean() / outputs.mean()))

    def prefills(self, group: InstanceGroup, alone: bool = False) -> PrefillShape:
        """What `group`'s prefills compute: a prefill-only instance reads a round's history
        and computes its new tokens, and so does the one instance of a deployment (`alone`:
        every round lands where its history is); an instance that also decodes among others
        computes the whole input."""
        return self.whole if group.decode and not alone else self.after_history


@dataclass(frozen=True)
class ScreenEstimate:
    goodput_rps: float  # highest rate meeting the SLOs, by the screen
    # highest rate the instances keep up with, decode steps within the TPOT SLO; where the
    # goodput is 0, with steps of any length (SLOs aside: where the search starts down)
    capacity_rps: float
    ttft_p50_s: float  # at the goodput rate (nan when it is 0)
    ttft_p90_s: float
    tpot_s: float
    # at the capacity rate a decoding group's batch is within 5 % of its limit
    # (`instance.max_batch_size`): a higher limit may carry more (the planner tries one)
    batch_limited: bool = False


@dataclass(frozen=True)
class _GroupLoad:
    step_s: float
    batch: float  # decoding sequences
    prefill_tokens: float  # per step


class Screen:
    """Prices deployments of one model on one GPU type for one workload and SLO."""

    _perfs: Callable[[int, int], PerfModel]

    def __init__(self, perfs: Callable[[int, int], PerfModel], shape: WorkloadShape, slo: SLO,
                 target_attainment: float, max_batch_size: int) -> None:
        """`perfs(tp, max_batch_size)`: the performance model of an instance of that degree
        and batch limit, as the simulator loads it (`pdserve.sim.runner.load_perf_model`);
        `max_batch_size`: the plan's limit, for groups that set none."""
        self._perfs, self.shape, self.slo = perfs, shape, slo
        self.target = target_attainment
        self.max_batch_size = max_batch_size
        self._estimate = lru_cache(maxsize=None)(self._compute)

    def perf(self, tp: int) -> PerfModel:
        """An instance of degree `tp` at the plan's batch limit."""
        return self._perfs(tp, self.max_batch_size)

    def batch_limit(self, group: InstanceGroup) -> int:
        return group.max_batch_size or self.max_batch_size

    def _group_perf(self, group: InstanceGroup) -> PerfModel:
        return self._perfs(group.tp, self.batch_limit(group))

    def estimate(self, deployment: Deployment) -> ScreenEstimate:
        return self._estimate(deployment)

    def replica_latency_s(self, group: InstanceGroup, rate_rps: float) -> float | None:
        """One instance of a prefill-only or decode-only `group` carrying `rate_rps`: the
        P90 prompt's TTFT (its KV transfer included), or the decode step time (TPOT); None
        when it cannot keep up."""
        prefills = self.shape.prefills(group)
        load = self._load(group, rate_rps if group.prefill else 0.0,
                          0.0 if group.prefill else rate_rps, prefills)
        if load is None:
            return None
        if not group.prefill:
            return load.step_s
        quantiles = prefills.quantiles
        return self._ttft_s(group, load, quantiles[int(0.9 * len(quantiles))], True)

    # ---- one instance at a load ----
    def _load(self, group: InstanceGroup, prefill_rps: float, decode_rps: float,
              prefills: PrefillShape, tpot_bound: bool = True) -> _GroupLoad | None:
        """The instance's steady state, or None when it cannot keep up (with `tpot_bound`:
        or when its decode steps pass the TPOT SLO)."""
        perf, shape = self._group_perf(group), self.shape
        a = decode_rps * shape.mean_output
        b = prefill_rps * prefills.mean_tokens
        bound = (min(self.slo.tpot_s, MAX_STEP_S) if tpot_bound and group.decode and a > 0
                 else MAX_STEP_S)
        mixed = group.prefill and group.decode
        t = 0.0
        for _ in range(FIXED_POINT_STEPS):
            batch, tokens = math.ceil(a * t), b * t
            if mixed:  # decode steps, a prefill chunk's cost spread over the steps
                following = (perf.batch_time_s(batch, int(batch * shape.decode_context), 0, 0)
                             + tokens * self._chunk_cost_s(group, batch, prefills))
            else:
                following = perf.batch_time_s(batch, int(batch * shape.decode_context),
                                              round(tokens),
                                              int(tokens * prefills.attn_units_per_token))
            if following > bound:
                return None
            if following <= t * (1 + 1e-6):  # converged (or a size table's dip: stay)
                break
            t = following
        else:
            return None  # still growing: no fixed point near
        batch, tokens = a * t, b * t
        if batch > self.batch_limit(group) or \
                batch * shape.decode_context > perf.kv_capacity_tokens:
            return None
        budget = group.chunk_tokens - (batch if group.decode else 0)
        if group.prefill and b > 0 and tokens > budget:
            return None
        return _GroupLoad(t, batch, tokens)

    def _chunk_cost_s(self, group: InstanceGroup, batch: int, prefills: PrefillShape
                      ) -> float:
        """Per prefill token, what a chunk adds to a step of `batch` decodes: prompts are
        cut into chunks of the budget the decodes leave (at most a mean prompt), and each
        step that carries one costs the chunk's prefill time beyond the shared overhead."""
        perf, shape = self._group_perf(group), self.shape
        chunk = max(1, min(group.chunk_tokens - batch, round(prefills.mean_tokens)))
        context = int(batch * shape.decode_context)
        extra = (perf.batch_time_s(batch, context, chunk,
                                   int(chunk * prefills.attn_units_per_token))
                 - perf.batch_time_s(batch, context, 0, 0))
        return extra / chunk

    def _ttft_s(self, group: InstanceGroup, load: _GroupLoad, prefill: tuple[int, int],
                moves_kv: bool) -> float:
        """One prefill of (new tokens, context held) at the group's load, chunk by chunk,
        with no waiting; its KV moved (the context read in, the whole sent on) when
        `moves_kv`."""
        perf, shape = self._group_perf(group), self.shape
        new_tokens, held = prefill
        batch = math.ceil(load.batch) if group.decode else 0
        per_step = max(1, group.chunk_tokens - batch)
        done, total = 0, 0.0
        context = int(batch * shape.decode_context)
        while done < new_tokens:
            chunk = min(per_step, new_tokens - done)
            total += perf.batch_time_s(batch, context, chunk, attn_units(chunk, held + done))
            done += chunk
        if moves_kv:
            total += perf.transfer_time_s(held + new_tokens)
        return total

    # ---- a deployment at a rate ----
    def _prefills(self, deployment: Deployment, group: InstanceGroup) -> PrefillShape:
        """What `group`'s prefills compute in `deployment`: one instance alone serves every
        session round where its history is."""
        alone = sum(g.count for g in deployment.groups) == 1
        return self.shape.prefills(group, alone)

    def _shares(self, deployment: Deployment) -> list[tuple[list[float], list[float]]]:
        """Ways to split prefills and decodes across the groups (fractions of the rate)."""
        groups = deployment.groups
        prefill = [g.count if g.prefill else 0 for g in groups]
        decode = [g.count if g.decode else 0 for g in groups]
        base = ([p / sum(prefill) for p in prefill], [d / sum(decode) for d in decode])
        if len(groups) != 2 or not all(g.prefill and g.decode for g in groups):
            return [base]
        # two mixed groups (TaiChi's hybrids): decodes on the small-chunk (D-heavy) group
        # first, prefills split by weight; the screen takes the best split
        heavy = 0 if groups[0].chunk_tokens >= groups[1].chunk_tokens else 1
        splits = [base]
        for p_share in (0.5, 0.75, 1.0):
            for d_share in (0.0, 0.25):
                pre = [0.0, 0.0]
                dec = [0.0, 0.0]
                pre[heavy], pre[1 - heavy] = p_share, 1 - p_share
                dec[heavy], dec[1 - heavy] = d_share, 1 - d_share
                splits.append((pre, dec))
        return splits

    def _at_rate(self, deployment: Deployment, rate_rps: float,
                 split: tuple[list[float], list[float]], attainment: bool = True,
                 tpot_bound: bool = True) -> tuple[list[_GroupLoad], float] | None:
        """Each group's load and the SLO attainment at `rate_rps` (nan unless
        `attainment`); None: the instances cannot keep up (`tpot_bound`: within the TPOT
        SLO)."""
        loads = []
        for group, p_share, d_share in zip(deployment.groups, *split, strict=True):
            load = self._load(group, rate_rps * p_share / group.count,
                              rate_rps * d_share / group.count,
                              self._prefills(deployment, group), tpot_bound)
            if load is None:
                return None
            loads.append(load)
        if not attainment:
            return loads, math.nan
        return loads, self._attainment(deployment, loads, split[0])

    def _ttfts(self, deployment: Deployment, loads: list[_GroupLoad],
               prefill_split: list[float]) -> list[tuple[float, float]]:
        """(TTFT, weight) of each input-length quantile on each prefilling group."""
        out = []
        for group, load, share in zip(deployment.groups, loads, prefill_split, strict=True):
            if share > 0:
                out += [(self._ttft_s(group, load, q, deployment.moves_kv), share)
                        for q in self._prefills(deployment, group).quantiles]
        return out

    def _attainment(self, deployment: Deployment, loads: list[_GroupLoad],
                    prefill_split: list[float]) -> float:
        if any(load.step_s > self.slo.tpot_s for g, load in zip(deployment.groups, loads,
                                                                 strict=True) if g.decode):
            return 0.0
        moves_kv, met = deployment.moves_kv, 0.0
        for group, load, share in zip(deployment.groups, loads, prefill_split, strict=True):
            if share <= 0:
                continue
            quantiles = self._prefills(deployment, group).quantiles
            low, high = 0, len(quantiles)  # TTFT grows with the prompt: bisect the quantiles
            while low < high:
                middle = (low + high) // 2
                if self._ttft_s(group, load, quantiles[middle], moves_kv) <= self.slo.ttft_s:
                    low = middle + 1
                else:
                    high = middle
            met += share * low / len(quantiles)
        return met

    def _highest(self, ok: Callable[[float], bool], low: float, high: float) -> float:
        """The highest rate in [low, high] where `ok` holds (it holds at `low`)."""
        while high - low > RATE_PRECISION * high:
            middle = (low + high) / 2
            low, high = (middle, high) if ok(middle) else (low, middle)
        return low

    def _capacity(self, deployment: Deployment, split: tuple[list[float], list[float]],
                  tpot_bound: bool = True) -> float:
        def keeps_up(rate: float) -> bool:
            return self._at_rate(deployment, rate, split, attainment=False,
                                 tpot_bound=tpot_bound) is not None

        low, high = 0.0, 1.0
        while keeps_up(high):
            low, high = high, high * 2
            if high > 1e6:
                return low
        while low == 0.0 and high > 1e-4:  # below 1 request per second: search down
            if keeps_up(high / 2):
                low = high / 2
            else:
                high /= 2
        return self._highest(keeps_up, low, high) if low > 0 else 0.0

    def _goodput(self, deployment: Deployment, split: tuple[list[float], list[float]],
                 capacity: float) -> float:
        def meets(rate: float) -> bool:
            state = self._at_rate(deployment, rate, split)
            return state is not None and state[1] >= self.target

        if capacity <= 0:
            return 0.0
        if meets(capacity):
            return capacity
        low = capacity * 1e-3
        if not meets(low):
            return 0.0
        return self._highest(meets, low, capacity)

    def _compute(self, deployment: Deployment) -> ScreenEstimate:
        best: tuple[float, float, tuple[list[float], list[float]]] | None = None
        for split in self._shares(deployment):
            capacity = self._capacity(deployment, split)
            goodput = self._goodput(deployment, split, capacity)
            if best is None or (goodput, capacity) > best[:2]:
                best = (goodput, capacity, split)
        assert best is not None
        goodput, capacity, split = best
        if goodput <= 0:  # what keeps up at all, where the planner's search then starts down
            #  (a TPOT SLO below every step made it 0, and the search crawled up from
            #  0.001 req/s through days of near-idle arrivals, 3.5 GB and more)
            capacity = max(self._capacity(deployment, s, tpot_bound=False)
                           for s in self._shares(deployment))
        limited = self._batch_limited(deployment, capacity, split)
        state = self._at_rate(deployment, goodput, split) if goodput > 0 else None
        if state is None:
            return ScreenEstimate(goodput, capacity, math.nan, math.nan, math.nan, limited)
        loads = state[0]
        ttfts = self._ttfts(deployment, loads, split[0])
        values = np.array([t for t, _ in ttfts])
        weights = np.array([w for _, w in ttfts])
        order = np.argsort(values)
        cumulative = np.cumsum(weights[order]) / weights.sum()
        p50 = float(values[order][np.searchsorted(cumulative, 0.5)])
        p90 = float(values[order][min(len(values) - 1, np.searchsorted(cumulative, 0.9))])
        tpot = max((load.step_s for g, load in zip(deployment.groups, loads, strict=True)
                    if g.decode), default=math.nan)
        return ScreenEstimate(goodput, capacity, p50, p90, tpot, limited)

    def _batch_limited(self, deployment: Deployment, capacity_rps: float,
                       split: tuple[list[float], list[float]]) -> bool:
        state = (self._at_rate(deployment, capacity_rps, split, attainment=False,
                               tpot_bound=False) if capacity_rps > 0 else None)
        return state is not None and any(
            group.decode and load.batch >= 0.95 * self.batch_limit(group)
            for group, load in zip(deployment.groups, state[0], strict=True))
