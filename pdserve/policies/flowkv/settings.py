"""FlowKV's tunables: score weights, normalisation scales, scenario thresholds, scaling.

The paper (appendix B.2-B.3) names the status vector, the weighted scores C^p_i and C^d_i,
and thresholds epsilon, but gives no values ("determined through several successful
experiments"). These are pdserve's choices; `docs/results/flowkv.md` shows how the results
move when they change. Every score term is normalised to [0, 1] (`scores.py`) and each
phase's weights sum to 1, so C^p_i, C^d_i, C^p and C^d lie in [0, 1] and the thresholds
read as fractions of "saturated".

Why these weights: a prefill instance is loaded when requests wait for it (waiting queue,
token budget asked) and its GPU is busy; its KV matters little (prefill KV leaves quickly).
A decode instance is loaded when its KV fills (the batch cannot grow, preemption follows),
when it preempts, and when its steps take the memory bandwidth; its queue of incoming KV
says demand is outrunning it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class ScoreWeights:
    """w of Alg. 1 lines 10-11, one set per phase; each set sums to 1."""

    running: float
    waiting: float
    swapped: float
    sending: float
    token_budget: float
    kv: float
    compute: float
    bandwidth: float

    def __post_init__(self) -> None:
        values = [getattr(self, f.name) for f in fields(self)]
        if any(v < 0 for v in values) or abs(sum(values) - 1) > 1e-9:
            raise ValueError(f"flowkv score weights must be non-negative and sum to 1, got "
                             f"{values} (sum {sum(values):g})")


PREFILL_WEIGHTS = ScoreWeights(running=0.10, waiting=0.30, swapped=0.0, sending=0.10,
                               token_budget=0.20, kv=0.05, compute=0.20, bandwidth=0.05)
DECODE_WEIGHTS = ScoreWeights(running=0.15, waiting=0.15, swapped=0.15, sending=0.0,
                              token_budget=0.05, kv=0.30, compute=0.05, bandwidth=0.15)


@dataclass(frozen=True)
class ScoreScales:
    """A count or rate at which its score term saturates (term = min(1, value / scale))."""

    prefill_running: float = 2.0  # admitted prefills (chunked: a few at a time)
    prefill_waiting: float = 8.0  # prefills waiting
    sending: float = 8.0  # prefilled requests whose KV awaits a hand-off
    decode_running_fraction: float = 0.25  # running decodes / max batch size
    decode_waiting: float = 8.0  # decodes waiting for KV or a batch slot
    preemptions_per_s: float = 1.0  # recomputations (pdserve's "swaps")
    token_budget_steps: float = 4.0  # steps' worth of token budget asked by queued work


@dataclass(frozen=True)
class FlowKVSettings:
    prefill_weights: ScoreWeights = PREFILL_WEIGHTS
    decode_weights: ScoreWeights = DECODE_WEIGHTS
    scales: ScoreScales = field(default_factory=ScoreScales)
    window_s: float = 5.0  # status smoothing (sliding window, B.2)
    # Alg. 1 thresholds (epsilon), the same for both phases unless set apart
    low_prefill: float = 0.35
    low_decode: float = 0.35
    high_prefill: float = 0.70
    high_decode: float = 0.70
    hysteresis: float = 0.05  # a score must cross a threshold by this much to change level
    confirm_ticks: int = 3  # a new scenario must hold this many ticks in a row
    # imbalanced load: idle instances of the other side help the overloaded phase
    idle_instance: float = 0.20  # C_i below this: "idle" (Alg. 1 line 25)
    switch_ticks: int = 10  # scheduling cycles a switch lasts before it is renewed or undone
    # extreme load: elastic scaling from the reserve
    scale_up_after_s: float = 10.0  # overload must last this long
    scale_down_below: float = 0.05  # both C^p and C^d under this: low load
    scale_down_after_s: float = 300.0  # low load must last this long (5 min, as HPA)
    scale_cooldown_s: float = 30.0  # between two scaling decisions
    prefix_block_tokens: int = 512  # tokens per prefix hash (Mooncake's hash_ids: 512)
    prefix_aware_routing: bool = True  # prefill routing counts prefix-cache hits (Alg. 1)

    def __post_init__(self) -> None:
        for low, high in ((self.low_prefill, self.high_prefill),
                          (self.low_decode, self.high_decode)):
            if not 0 < low < high <= 1:
                raise ValueError(f"flowkv thresholds need 0 < low < high <= 1, got low={low}, "
                                 f"high={high}")
        if not 0 <= self.hysteresis < (min(self.low_prefill, self.low_decode) / 2):
            raise ValueError(f"flowkv hysteresis must be in [0, low/2), got {self.hysteresis}")
        for name in ("confirm_ticks", "switch_ticks", "prefix_block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"flowkv {name} must be at least 1, got "
                                 f"{getattr(self, name)}")
        for name in ("window_s", "scale_up_after_s", "scale_down_after_s", "scale_cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"flowkv {name} must not be negative, got "
                                 f"{getattr(self, name)}")
