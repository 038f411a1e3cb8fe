"""Node status indicators, smoothed over a sliding window (FlowKV appendix B.2; Alg. 1 line 6).

S_i = [L_r, L_w, L_sw, L_se for prefill and for decode, T_b, KV_u, G_u, MB_u]. What each is
in pdserve (the same in both worlds, read from `InstanceLoad` snapshots):
  L_r prefill   admitted, partly computed prefills (`prefill_running_len`)
  L_w prefill   prefills waiting to be admitted
  L_se prefill  prefilled requests whose KV waits for its hand-off (`sending_len`)
  L_r decode    running decodes
  L_w decode    decodes waiting for their KV to arrive or for a batch slot
  L_sw          pdserve recomputes instead of swapping: preemptions per second over the
                window, counted on the decode side (decode growth is what preempts);
                L_sw prefill and L_se decode are 0
  T_b           token budget asked: (queued prefill tokens + running decodes) / the
                per-step token budget, i.e. how many steps' budgets the queued work fills
  KV_u          used / total KV blocks
  G_u           compute utilisation: the share of the window the instance ran batches
                (what NVML's "GPU utilisation" reports: time a kernel ran)
  MB_u          memory-bandwidth utilisation, approximated by the share of the window spent
                in batches with decodes (decode steps are bound by reading weights and KV);
                the live world measures both shares from its batches' wall time
Instantaneous values are averaged over the snapshots of the window; G_u, MB_u and L_sw come
from differences of cumulative counters, so bursts do not make the status jump.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pdserve.cluster.events import ClusterView
from pdserve.instance.stats import InstanceStats


@dataclass(frozen=True, slots=True)
class NodeStatus:
    prefill_running: float
    prefill_waiting: float
    prefill_sending: float
    decode_running: float
    decode_waiting: float
    preemptions_per_s: float
    token_budget_steps: float
    kv_utilisation: float
    compute_utilisation: float
    bandwidth_utilisation: float


IDLE = NodeStatus(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def _instant(stats: InstanceStats, chunk_size_tokens: int) -> tuple[float, ...]:
    return (stats.prefill_running_len,
            stats.prefill_queue_len - stats.prefill_running_len,
            stats.sending_len,
            stats.running_decodes,
            stats.decode_queue_len,
            (stats.prefill_queue_tokens + stats.running_decodes) / chunk_size_tokens,
            stats.memory_fraction)


class StatusWindow:
    """Snapshots of every instance over the last `window_s` seconds."""

    def __init__(self, window_s: float, chunk_size_tokens: int) -> None:
        self.window_s = window_s
        self.chunk_size_tokens = chunk_size_tokens
        self._history: deque[tuple[float, list[InstanceStats]]] = deque()

    def observe(self, view: ClusterView) -> None:
        self._history.append((view.now_s, [InstanceStats.of(load) for load in view.instances]))
        while len(self._history) > 2 and self._history[1][0] <= view.now_s - self.window_s:
            self._history.popleft()

    def status(self, instance_id: int) -> NodeStatus:
        if not self._history:
            return IDLE
        history = self._history
        samples = [_instant(snapshot[instance_id], self.chunk_size_tokens)
                   for _, snapshot in history]
        means = [sum(column) / len(samples) for column in zip(*samples, strict=True)]
        (first_s, first), (last_s, last) = history[0], history[-1]
        span_s = last_s - first_s
        a, b = first[instance_id], last[instance_id]
        if span_s > 0:
            compute = min(1.0, (b.busy_s_total - a.busy_s_total) / span_s)
            bandwidth = min(1.0, (b.decode_busy_s_total - a.decode_busy_s_total) / span_s)
            preemptions = (b.preemptions_total - a.preemptions_total) / span_s
        else:
            compute = bandwidth = preemptions = 0.0
        return NodeStatus(means[0], means[1], means[2], means[3], means[4], preemptions,
                          means[5], means[6], compute, bandwidth)
