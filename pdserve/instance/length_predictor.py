"""Remaining-output-length predictors: the one interface ARES's rescheduler reads.

ARES (`../shared/papers/ares.md`, section 4) predicts how many tokens each running decode
still has to generate and refreshes the prediction every `k` generated tokens (default 20).
Every predictor here answers the same question for a batch of decodes, so the rescheduler
(Alg. 1), the simulator and the live worker never know which one they hold:

- `oracle`: the true remaining length (simulation only; an upper bound);
- `noisy`: oracle plus an error that shrinks as generation proceeds (sensitivity studies);
- `history`: conditional quantiles of output length given input length and tokens so far,
  learned online from finished requests (no model internals);
- `hidden-state`: the paper's MLP on the last-layer hidden state of the last token (live
  engine only; trained by `pdserve predictor train`).

`make_predictor(spec)` builds one from its name (`"history"`, `"noisy:mae=200"`,
`"hidden-state:/path/to/predictor.pt"`). Implementations register themselves in
`PREDICTOR_FACTORIES`; the hidden-state one is imported lazily because it needs torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

DEFAULT_REFRESH_EVERY_TOKENS = 20


@dataclass(frozen=True, slots=True)
class DecodeProgress:
    """What a predictor may know about one running decode."""

    request_id: int
    prompt_tokens: int
    generated_tokens: int
    max_output_tokens: int  # the request's cap (`max_tokens` live, the trace's length in sim)
    true_remaining_tokens: int | None = None  # known in simulation only (oracle, noisy)
    hidden_state: np.ndarray | None = None  # last-layer hidden state of the last token (live)


class RemainingLengthPredictor(Protocol):
    """Predicts remaining output tokens for running decodes; may learn from finished ones."""

    name: str

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        """Predicted remaining tokens per decode, in order; each in [0, max - generated]."""
        ...

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """A request finished with `output_tokens` generated (online learners use it)."""
        ...


PredictorFactory = Callable[[dict[str, str], int], RemainingLengthPredictor]
# name -> factory(options from the spec, seed)
PREDICTOR_FACTORIES: dict[str, PredictorFactory] = {}
_LAZY_MODULES = {"hidden-state": "pdserve.predictor.hidden_state",
                 **dict.fromkeys(("oracle", "noisy", "history"),
                                 "pdserve.instance.simple_predictors")}


def parse_predictor_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`"noisy:mae=200,seed=3"` -> ("noisy", {"mae": "200", "seed": "3"});
    `"hidden-state:/p.pt"` -> ("hidden-state", {"path": "/p.pt"})."""
    name, _, rest = spec.strip().partition(":")
    options: dict[str, str] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if eq:
            options[key.strip()] = value.strip()
        else:
            options["path"] = part.strip()
    return name.strip(), options


def make_predictor(spec: str, seed: int = 0) -> RemainingLengthPredictor:
    name, options = parse_predictor_spec(spec)
    if name not in PREDICTOR_FACTORIES and name in _LAZY_MODULES:
        import importlib

        importlib.import_module(_LAZY_MODULES[name])
    factory = PREDICTOR_FACTORIES.get(name)
    if factory is None:
        known = sorted(set(PREDICTOR_FACTORIES) | set(_LAZY_MODULES))
        raise ValueError(f"unknown length predictor {name!r}; choose one of {known}")
    return factory(options, seed)
