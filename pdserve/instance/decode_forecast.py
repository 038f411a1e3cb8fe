"""An instance's predicted future decode token load: the worker side of ARES's Alg. 1.

ARES (`../shared/papers/ares.md`, sec. 5.2) splits decode rescheduling: "workers
continuously monitor their local state, retrieve prediction results, perform local future
state simulation, and proactively report this pre-computed information to the scheduler".
`DecodeLoadTracker` is that worker side, one per instance, the same code in the simulator
and in a live worker:

- it refreshes a running decode's predicted remaining length N̂(r) every
  `refresh_every_tokens` generated tokens (sec. 5.3: k = 20); between refreshes the
  prediction counts down with the tokens generated (and is refreshed early if it ran out
  while the decode still runs);
- it simulates its decodes' token load over the horizon: at future step t a decode holds
  N(r) + t tokens while t < N̂(r), then nothing (it finished and freed its KV); the
  instance's load N̂_i(B_{i,t}) is the sum (Alg. 1 line 13's term), sampled at
  `points` steps evenly spread over the horizon H, plus the current load at t = 0;
- it reports `DecodeForecast`: those loads, w_i = Σ_t β_t N̂_i(B_{i,t}) (line 13), and each
  decode's N(r) and N̂(r), which the scheduler needs for candidates (lines 20-21) and for
  the variance of a move (lines 28-29).
Steps, not seconds: every decode gains one token per step, so a step is the common clock
of all instances in the paper's model (sec. 5.2, "number of tokens" as the workload).

β_t: the paper leaves them open. pdserve weighs t_j = j·H/points with β_j ∝ decay^j
(j = 0 is the current state, the σ_0² term of Eq. 4), normalised to sum to 1 so that w_i
is a token count comparable with the current load N_i(B_{i,0}) (line 15 compares them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.instance.length_predictor import (
    DEFAULT_REFRESH_EVERY_TOKENS,
    DecodeProgress,
    RemainingLengthPredictor,
    make_predictor,
)
from pdserve.types import Request

if TYPE_CHECKING:
    import numpy as np

DEFAULT_HORIZON_STEPS = 2000  # H: ~40-100 s of decoding at 20-50 ms per step
DEFAULT_POINTS = 8
DEFAULT_DECAY = 0.8
NO_PREDICTOR = "none"  # current load only (the reschedule-current baseline)
SIM_MAX_OUTPUT_TOKENS = 32768  # the cap a simulated request's predictor sees (not its length)


@dataclass(frozen=True, slots=True)
class ForecastSettings:
    predictor: str = "history"  # a `make_predictor` spec, or "none"
    refresh_every_tokens: int = DEFAULT_REFRESH_EVERY_TOKENS  # k
    horizon_steps: int = DEFAULT_HORIZON_STEPS  # H
    points: int = DEFAULT_POINTS
    decay: float = DEFAULT_DECAY  # β_j ∝ decay^j
    seed: int = 0
    max_output_tokens: int = SIM_MAX_OUTPUT_TOKENS  # simulation: the cap predictors see

    def __post_init__(self) -> None:
        if self.refresh_every_tokens < 1:
            raise ValueError(f"ares refresh_every_tokens must be at least 1, got "
                             f"{self.refresh_every_tokens}")
        if self.horizon_steps < 0 or self.points < 1:
            raise ValueError(f"ares horizon must be >= 0 steps over >= 1 points, got "
                             f"{self.horizon_steps} steps, {self.points} points")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"ares decay (beta_t) must be in (0, 1], got {self.decay}")

    def step_offsets(self) -> tuple[int, ...]:
        """t = 0 (now), then `points` steps evenly over H (only t = 0 when H is 0)."""
        if self.horizon_steps == 0:
            return (0,)
        return (0, *(round(j * self.horizon_steps / self.points)
                     for j in range(1, self.points + 1)))

    def weights(self) -> tuple[float, ...]:
        """β_t for `step_offsets()`, summing to 1."""
        raw = [self.decay ** j for j in range(len(self.step_offsets()))]
        total = sum(raw)
        return tuple(w / total for w in raw)


@dataclass(frozen=True, slots=True)
class RequestForecast:
    request_id: int
    tokens: int  # N(r): its sequence length now (tokens in KV)
    remaining_tokens: float  # N̂(r): predicted tokens still to generate
    running: bool  # decoding here (False: its KV is still arriving; not movable yet)

    def load_at(self, step: int) -> float:
        """Its tokens in KV `step` steps from now (0 once it is predicted to be done)."""
        return self.tokens + step if step == 0 or step < self.remaining_tokens else 0.0


@dataclass(frozen=True, slots=True)
class DecodeForecast:
    instance_id: int
    load_tokens: tuple[float, ...]  # N̂_i(B_{i,t}) at the settings' step offsets
    weighted_load: float  # w_i (line 13)
    requests: tuple[RequestForecast, ...]


class DecodeLoadTracker:
    """One instance's predictions and future-load simulation (see the module docstring)."""

    def __init__(self, settings: ForecastSettings,
                 predictor: RemainingLengthPredictor | None = None,
                 knows_true_length: bool = True) -> None:
        """`knows_true_length`: a simulated request's `output_tokens` is its true length
        (oracle and noisy read it); a live one's is only `max_tokens`."""
        self.settings = settings
        self.predictor: RemainingLengthPredictor | None = predictor
        if predictor is None and settings.predictor != NO_PREDICTOR:
            self.predictor = make_predictor(settings.predictor, settings.seed)
        self.knows_true_length = knows_true_length
        self.offsets = settings.step_offsets()
        self.weights = settings.weights()
        self._predicted: dict[int, tuple[int, float]] = {}  # id -> (generated, remaining)
        self.predictions_total = 0

    def observe_finished(self, request: Request) -> None:
        self._predicted.pop(request.request_id, None)
        if self.predictor is not None:
            self.predictor.observe_finished(request.input_tokens, request.generated_tokens)

    def forget(self, request_id: int) -> None:
        self._predicted.pop(request_id, None)

    def retain(self, request_ids: set[int]) -> None:
        """Forget predictions of requests no longer here (moved away, cancelled)."""
        self._predicted = {rid: p for rid, p in self._predicted.items() if rid in request_ids}

    @property
    def tracked(self) -> int:
        return len(self._predicted)

    def _progress(self, request: Request, generated: int,
                  hidden: Mapping[int, np.ndarray] | None) -> DecodeProgress:
        if self.knows_true_length:
            cap = max(self.settings.max_output_tokens, request.output_tokens)
            true_remaining: int | None = request.output_tokens - generated
        else:
            cap, true_remaining = request.output_tokens, None
        return DecodeProgress(request.request_id, request.input_tokens, generated, cap,
                              true_remaining,
                              hidden.get(request.request_id) if hidden else None)

    def remaining(self, decodes: list[tuple[Request, int]],
                  hidden: Mapping[int, np.ndarray] | None = None) -> list[float]:
        """N̂(r) for each (request, tokens generated), refreshing the stale ones in one
        batch call to the predictor."""
        if self.predictor is None:  # current load only: nothing is predicted
            return [math.inf] * len(decodes)
        k = self.settings.refresh_every_tokens
        out: list[float] = [0.0] * len(decodes)
        stale: list[int] = []
        for index, (request, generated) in enumerate(decodes):
            known = self._predicted.get(request.request_id)
            if known is not None:
                since = generated - known[0]
                left = known[1] - since
                if since < k and left > 0:
                    out[index] = left
                    continue
            stale.append(index)
        if stale:
            progress = [self._progress(decodes[i][0], decodes[i][1], hidden) for i in stale]
            predicted = self.predictor.predict(progress)
            self.predictions_total += len(stale)
            for index, value in zip(stale, predicted, strict=True):
                request, generated = decodes[index]
                self._predicted[request.request_id] = (generated, value)
                out[index] = value
        return out

    def forecast(self, instance_id: int, running: Iterable[Request],
                 incoming: Iterable[Request], steps_done: int = 0,
                 hidden: Mapping[int, np.ndarray] | None = None) -> DecodeForecast:
        """The instance's forecast. `running`: its decodes (each `steps_done` tokens past
        its `generated_tokens`, for a simulated multi-step span in progress); `incoming`:
        decodes whose KV is arriving or ready to join."""
        decodes = [(r, r.generated_tokens + steps_done) for r in running]
        n_running = len(decodes)
        decodes += [(r, r.generated_tokens) for r in incoming]
        remaining = self.remaining(decodes, hidden)
        requests = tuple(
            RequestForecast(r.request_id, r.input_tokens + g, rem, i < n_running)
            for i, ((r, g), rem) in enumerate(zip(decodes, remaining, strict=True)))
        loads = tuple(sum(f.load_at(t) for f in requests) for t in self.offsets)
        weighted = sum(b * n for b, n in zip(self.weights, loads, strict=True))
        return DecodeForecast(instance_id, loads, weighted, requests)
