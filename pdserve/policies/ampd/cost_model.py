"""AMPD's execution cost estimates for routing a prefill task (sec. 4.1, Eq. 1-2).

  Eq. 1  t_local    = T_pre(l_hist, l_incr; theta_d) + sum over d's prefill queue of T_pre
  Eq. 2  t_remote_i = T_pre(l_hist, l_incr; theta_pi)
                      + T_kv(l_hist; theta_d -> theta_pi) + T_kv(l_incr; theta_pi -> theta_d)
                      + sum over p_i's prefill queue of T_pre
T_pre is the instance's fitted prefill model (a + b*n + c*n*(n + 2*l_hist)): incremental
tokens attend to the history. The queue sum uses the instance's load counters, which hold
sum(n) and sum(n*(n + 2p)) over what is queued, so it is exact for that model. T_kv is the
topology's uncontended transfer estimate between the two instances (or the instance's own
link when the driver gives no topology). l_hist is the history KV the round reuses: the
history read is charged only when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.cluster.events import ClusterView
from pdserve.perf.fitted import PerfModel
from pdserve.policies.min_load import predicted_prefill_queue_s
from pdserve.types import Request, attn_units


@dataclass(frozen=True, slots=True)
class PrefillTask:
    """A prefill task's lengths: history KV it reuses and new tokens to compute."""

    history_tokens: int
    new_tokens: int

    @classmethod
    def of(cls, request: Request) -> PrefillTask:
        history = min(request.cached_prefix_tokens, request.input_tokens - 1)
        return cls(history, request.input_tokens - history)


def prefill_time_s(perf: PerfModel, task: PrefillTask) -> float:
    """T_pre(l_hist, l_incr; theta)."""
    return perf.prefill.time_s(task.new_tokens,
                               attn_units(task.new_tokens, task.history_tokens))


def kv_time_s(view: ClusterView, perf: PerfModel, source: int, target: int,
              tokens: int) -> float:
    """T_kv(l; theta_src -> theta_dst)."""
    if tokens <= 0:
        return 0.0
    num_bytes = tokens * perf.kv_bytes_per_token
    if view.topology is not None:
        return view.topology.transfer_time_s(source, target, num_bytes)
    return perf.transfer_time_s(tokens)


def local_cost_s(view: ClusterView, perf: PerfModel, decode_id: int,
                 task: PrefillTask) -> float:
    """Eq. 1."""
    return (prefill_time_s(perf, task)
            + predicted_prefill_queue_s(view.instances[decode_id], perf.prefill))


def remote_cost_s(view: ClusterView, perf: PerfModel, prefill_id: int, decode_id: int,
                  task: PrefillTask) -> float:
    """Eq. 2: computation, KV both ways, queueing on the prefill worker."""
    return (prefill_time_s(perf, task)
            + kv_time_s(view, perf, decode_id, prefill_id, task.history_tokens)
            + kv_time_s(view, perf, prefill_id, decode_id, task.new_tokens)
            + predicted_prefill_queue_s(view.instances[prefill_id], perf.prefill))
