"""The model-free remaining-length predictors: `oracle`, `noisy` and `history`.

ARES (`../shared/papers/ares.md`, sec. 4) predicts each running decode's remaining output
length; these three answer the same question without model internals (the paper's own
`hidden-state` predictor is `pdserve.predictor.hidden_state`):

- `oracle` returns the true remaining length (simulation only): ARES-Oracle, sec. 6.4.
- `noisy:mae=M[,half=G]` is the oracle plus a Laplace error whose mean absolute value is M
  tokens at the first prediction and shrinks as generation proceeds, as the paper's Fig. 7
  error does: the error scale after g generated tokens is M * G / (G + g) (default
  G = 2000, so the error halves after 2000 tokens). In the live world, where the true
  length is unknown, the error is around the request's cap (`max_tokens`). Every draw is
  a function of (seed, request, tokens generated), so a run is reproducible whatever the
  call order.
- `history[:q=0.5,buckets=...,window=N]` keeps, per input-length bucket, the output lengths
  of the last N finished requests (learned online) and predicts the q-quantile of the
  output length *given that it exceeds the tokens generated so far*, minus those tokens.
  With fewer than `min=` samples above that point in the bucket it pools every bucket; with
  none above it (the decode is already longer than anything seen) it predicts as many more
  tokens as generated so far (the median of a scale-free tail), within the request's cap.
All predictions are clipped to [0, max_output_tokens - generated_tokens].
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Sequence

from pdserve.instance.length_predictor import PREDICTOR_FACTORIES, DecodeProgress

DEFAULT_NOISY_HALF_TOKENS = 2000
DEFAULT_HISTORY_BUCKETS = (64, 256, 1024, 4096)  # input-length bucket upper bounds
DEFAULT_HISTORY_WINDOW = 5000  # finished requests kept per bucket
DEFAULT_HISTORY_MIN_SAMPLES = 8


def _cap(decode: DecodeProgress) -> int:
    return max(0, decode.max_output_tokens - decode.generated_tokens)


def _true_remaining(decode: DecodeProgress, who: str) -> int:
    if decode.true_remaining_tokens is None:
        raise ValueError(f"the {who!r} length predictor needs the true remaining length, "
                         f"which only the simulator knows (request {decode.request_id}); "
                         f"use 'history' or 'hidden-state' in the live world")
    return decode.true_remaining_tokens


class OraclePredictor:
    name = "oracle"

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        return [float(min(_true_remaining(d, self.name), _cap(d))) for d in decodes]

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        return None


class NoisyPredictor:
    def __init__(self, mae_tokens: float, half_tokens: float = DEFAULT_NOISY_HALF_TOKENS,
                 seed: int = 0) -> None:
        if mae_tokens < 0:
            raise ValueError(f"noisy predictor: mae must not be negative, got {mae_tokens}")
        if half_tokens <= 0:
            raise ValueError(f"noisy predictor: half must be positive, got {half_tokens}")
        self.mae_tokens, self.half_tokens, self.seed = mae_tokens, half_tokens, seed
        self.name = f"noisy(mae={mae_tokens:g})"

    def error_scale(self, generated_tokens: int) -> float:
        """Mean absolute error (before clipping) after `generated_tokens`."""
        return self.mae_tokens * self.half_tokens / (self.half_tokens + generated_tokens)

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        out = []
        for d in decodes:
            scale = self.error_scale(d.generated_tokens)
            rng = random.Random(hash((self.seed, d.request_id, d.generated_tokens)))
            u = rng.random() - 0.5  # Laplace(0, scale) by inversion: mean |error| = scale
            error = -scale * math.copysign(1.0, u) * math.log(1.0 - 2.0 * abs(u))
            truth = _cap(d) if d.true_remaining_tokens is None else d.true_remaining_tokens
            out.append(min(max(0.0, truth + error), float(_cap(d))))
        return out

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        return None


class HistoryPredictor:
    name = "history"

    def __init__(self, quantile: float = 0.5,
                 buckets: Sequence[int] = DEFAULT_HISTORY_BUCKETS,
                 window: int = DEFAULT_HISTORY_WINDOW,
                 min_samples: int = DEFAULT_HISTORY_MIN_SAMPLES) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"history predictor: q must be in (0, 1), got {quantile}")
        if window < 1:
            raise ValueError(f"history predictor: window must be at least 1, got {window}")
        self.quantile, self.window, self.min_samples = quantile, window, min_samples
        self.bounds = sorted(buckets)
        count = len(self.bounds) + 1
        self._sorted: list[list[int]] = [[] for _ in range(count)]  # per bucket, ascending
        self._order: list[deque[int]] = [deque() for _ in range(count)]  # arrival order
        self._pooled: list[int] = []

    def bucket(self, prompt_tokens: int) -> int:
        return bisect.bisect_left(self.bounds, prompt_tokens)

    @property
    def samples(self) -> int:
        return len(self._pooled)

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        b = self.bucket(prompt_tokens)
        bisect.insort(self._sorted[b], output_tokens)
        bisect.insort(self._pooled, output_tokens)
        self._order[b].append(output_tokens)
        if len(self._order[b]) > self.window:
            old = self._order[b].popleft()
            del self._sorted[b][bisect.bisect_left(self._sorted[b], old)]
            del self._pooled[bisect.bisect_left(self._pooled, old)]

    def _conditional(self, lengths: list[int], generated: int) -> float | None:
        """q-quantile of the lengths above `generated`, or None with too few of them."""
        start = bisect.bisect_right(lengths, generated)
        above = len(lengths) - start
        if above < self.min_samples:
            return None
        return float(lengths[start + min(above - 1, int(self.quantile * above))])

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        out = []
        for d in decodes:
            g = d.generated_tokens
            length = self._conditional(self._sorted[self.bucket(d.prompt_tokens)], g)
            if length is None:
                length = self._conditional(self._pooled, g)
            remaining = length - g if length is not None else float(max(g, 1))
            out.append(min(max(0.0, remaining), float(_cap(d))))
        return out


def _float(options: dict[str, str], key: str, default: float, who: str) -> float:
    try:
        return float(options.get(key, default))
    except ValueError:
        raise ValueError(f"{who} predictor option {key}={options[key]!r} is not a "
                         f"number") from None


def _noisy(options: dict[str, str], seed: int) -> NoisyPredictor:
    if "mae" not in options:
        raise ValueError("the noisy predictor needs its error: noisy:mae=TOKENS[,half=TOKENS]")
    return NoisyPredictor(_float(options, "mae", 0, "noisy"),
                          _float(options, "half", DEFAULT_NOISY_HALF_TOKENS, "noisy"),
                          int(_float(options, "seed", seed, "noisy")))


def _history(options: dict[str, str], seed: int) -> HistoryPredictor:
    buckets = DEFAULT_HISTORY_BUCKETS
    if "buckets" in options:
        try:
            buckets = tuple(int(b) for b in options["buckets"].split("/"))
        except ValueError:
            raise ValueError(f"history predictor option buckets={options['buckets']!r}: "
                             f"expected token bounds separated by '/', e.g. 64/256/1024"
                             ) from None
    return HistoryPredictor(_float(options, "q", 0.5, "history"), buckets,
                            int(_float(options, "window", DEFAULT_HISTORY_WINDOW, "history")),
                            int(_float(options, "min", DEFAULT_HISTORY_MIN_SAMPLES, "history")))


PREDICTOR_FACTORIES["oracle"] = lambda options, seed: OraclePredictor()
PREDICTOR_FACTORIES["noisy"] = _noisy
PREDICTOR_FACTORIES["history"] = _history
