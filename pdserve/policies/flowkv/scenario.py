"""Scenario classification of FlowKV's Algorithm 1 (lines 16-31), with hysteresis and a
confirmation count so a load that sits at a threshold does not flap.

Alg. 1: normal when |C^p| <= eps_p_low and |C^d| <= eps_d_low; imbalanced when both are
within eps_high (and not both within eps_low); extreme otherwise (a side past eps_high:
overload). Appendix B.1 also counts minimal demand as extreme ("low load"); pdserve keeps it
apart (`low_load`) and lets the scaler act on it.

Hysteresis (pdserve's; the paper gives neither values nor a rule): each phase has a level,
0 (at or under low), 1 (under high) or 2 (over high), that rises only when its score passes
a threshold by `hysteresis` and falls only when it drops `hysteresis` below it; a score
exactly at a threshold keeps the level it has. The scenario follows the higher level, and
a new scenario becomes current only after `confirm_ticks` ticks in a row.
"""

from __future__ import annotations

import enum

from pdserve.policies.flowkv.settings import FlowKVSettings


class Scenario(enum.Enum):
    NORMAL = "normal"
    IMBALANCED = "imbalanced"
    EXTREME = "extreme"


_BY_LEVEL = (Scenario.NORMAL, Scenario.IMBALANCED, Scenario.EXTREME)


def next_level(score: float, level: int, low: float, high: float, margin: float) -> int:
    """A Schmitt trigger over the two thresholds."""
    thresholds = (low, high)
    while level < 2 and score > thresholds[level] + margin:
        level += 1
    while level > 0 and score < thresholds[level - 1] - margin:
        level -= 1
    return level


class ScenarioClassifier:
    def __init__(self, settings: FlowKVSettings) -> None:
        self.settings = settings
        self.prefill_level = 0
        self.decode_level = 0
        self.current = Scenario.NORMAL
        self.since_s = 0.0  # when `current` began
        self._candidate = Scenario.NORMAL
        self._count = 0
        self.low_load = False

    def update(self, c_prefill: float, c_decode: float, now_s: float) -> Scenario:
        s = self.settings
        self.prefill_level = next_level(c_prefill, self.prefill_level, s.low_prefill,
                                        s.high_prefill, s.hysteresis)
        self.decode_level = next_level(c_decode, self.decode_level, s.low_decode,
                                       s.high_decode, s.hysteresis)
        self.low_load = c_prefill < s.scale_down_below and c_decode < s.scale_down_below
        raw = _BY_LEVEL[max(self.prefill_level, self.decode_level)]
        if raw is self.current:
            self._count = 0
            return self.current
        if raw is self._candidate:
            self._count += 1
        else:
            self._candidate, self._count = raw, 1
        if self._count >= s.confirm_ticks:
            self.current, self.since_s, self._count = raw, now_s, 0
        return self.current

    def overloaded_phase_is_prefill(self, c_prefill: float, c_decode: float) -> bool:
        """The phase that is more overloaded: the higher level, else the larger excess
        over its low threshold."""
        if self.prefill_level != self.decode_level:
            return self.prefill_level > self.decode_level
        s = self.settings
        return c_prefill - s.low_prefill >= c_decode - s.low_decode
