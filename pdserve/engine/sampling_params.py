"""What a request asks of the sampler (`SamplingParams`, validated on construction) and what
the sampler and the logits processing read of a sequence (`SamplingState`).

A structured-output constraint travels as `OutputConstraint`, a plain description (kind and
text) that pickles into `AddRequest` and `KVHandoff`; the worker compiles it
(`structured_output.py`) and keeps a matcher per sequence (`TokenConstraint`), which the
logits processing reads to mask disallowed tokens.

Its own module because both `sampling.py` (the sampler) and `logits_processing.py` (bias,
penalties and min_tokens, applied before sampling) read them, and the sampler calls the
logits processing: the two share these types, not each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

GREEDY_BELOW = 1e-5  # a temperature under this is greedy
MAX_LOGPROBS = 20  # most alternatives per token (OpenAI's top_logprobs limit)
_SEED_MIN, _SEED_END = -(2 ** 63), 2 ** 64  # what torch and numpy accept as seeds
_PENALTY_LIMIT = 2.0  # OpenAI's range for presence and frequency penalties
_BIAS_LIMIT = 100.0  # OpenAI's range for a logit bias
CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar")


@dataclass(frozen=True)
class OutputConstraint:
    """What the output must match: `kind` "json" (`text`: a JSON Schema, llguidance's
    `x-guidance` options inside), "regex", "choice" (`text`: a JSON list of strings) or
    "grammar" (Lark, or GBNF/EBNF, as llguidance takes it)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS or type(self.text) is not str:
            raise ValueError(f"constraint must be one of {CONSTRAINT_KINDS} with a text, got "
                             f"{self.kind!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 (or under GREEDY_BELOW): greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # EOS and stop strings are ignored before this many output tokens
    logprobs: int | None = None  # None: none; k: the sampled token's plus the top k
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's plus the top k
    stop_token_ids: tuple[int, ...] = ()  # end the output as EOS does (not under ignore_eos)
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text)
    skip_special_tokens: bool = True  # special tokens have no text in the output
    spaces_between_special_tokens: bool = True  # False: nothing between adjacent specials
    constraint: OutputConstraint | None = None  # structured output: what the text must match

    def __post_init__(self) -> None:
        def refuse(name: str, rule: str) -> None:
            raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("max_tokens", "top_k", "min_tokens", "seed", "logprobs",
                     "prompt_logprobs"):
            value = getattr(self, name)
            optional = name in ("seed", "logprobs", "prompt_logprobs")
            if type(value) is not int and not (optional and value is None):
                refuse(name, "an integer")
        if any(type(token_id) is not int for token_id, _ in self.logit_bias):
            refuse("logit_bias", "keyed by integer token ids")
        if any(type(token_id) is not int or token_id < 0 for token_id in self.stop_token_ids):
            refuse("stop_token_ids", "non-negative integer token ids")
        if self.constraint is not None and not isinstance(self.constraint, OutputConstraint):
            refuse("constraint", "an OutputConstraint")
        if self.max_tokens < 1:
            refuse("max_tokens", "at least 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            refuse("temperature", "a finite number >= 0")
        if not 0 < self.top_p <= 1:
            refuse("top_p", "in (0, 1]")
        if self.seed is not None and not _SEED_MIN <= self.seed < _SEED_END:
            refuse("seed", f"in [{_SEED_MIN}, {_SEED_END})")
        if self.top_k < 0:
            refuse("top_k", "0 (off) or positive")
        if not 0 <= self.min_p <= 1:
            refuse("min_p", "in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -_PENALTY_LIMIT <= getattr(self, name) <= _PENALTY_LIMIT:
                refuse(name, f"in [-{_PENALTY_LIMIT:g}, {_PENALTY_LIMIT:g}]")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            refuse("repetition_penalty", "a finite number > 0")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not -_BIAS_LIMIT <= bias <= _BIAS_LIMIT:
                refuse("logit_bias", f"token ids >= 0 with biases in [-{_BIAS_LIMIT:g}, "
                       f"{_BIAS_LIMIT:g}]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            refuse("min_tokens", f"in [0, max_tokens={self.max_tokens}]")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                refuse(name, f"None or in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def stop_tokens(self, eos_token_ids: tuple[int, ...] | list[int]) -> frozenset[int]:
        """The tokens that end the output: EOS (unless `ignore_eos`) and `stop_token_ids`
        (vLLM's rule: `ignore_eos` leaves `stop_token_ids` in force)."""
        eos = () if self.ignore_eos else tuple(eos_token_ids)
        return frozenset((*eos, *self.stop_token_ids))


class TokenConstraint(Protocol):
    """A sequence's structured-output matcher, as the logits processing reads it."""

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor:
        """A bool [vocab_size] mask of the tokens the constraint allows next."""
        ...


class SamplingState(Protocol):
    """What the sampler reads of a sequence (the engine's `Sequence`, `sequence.py`, has it;
    one without `grammar` is unconstrained)."""

    request_id: int
    params: SamplingParams
    token_ids: list[int]  # prompt, then the output so far (resumed tokens included)
    prompt_tokens: int
