"""A live engine's sequence (`Sequence`: its tokens, how many have KV in the pool, its KV
block ids) and what one step returns for each sampled token (`TokenOutput`).

Plain data in their own module so that the engine's collaborators (prompt logprobs, the
worker's batch guard) read them without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pdserve.engine.sampling import TokenLogprob
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.structured_output import ConstraintMatcher
from pdserve.engine.text_stream import TextStream


@dataclass
class Sequence:
    request_id: int
    token_ids: list[int]
    prompt_tokens: int
    params: SamplingParams
    computed_tokens: int = 0  # tokens whose KV is in the pool
    blocks: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" (a stop token or string, the constraint done) or "length"
    stream: TextStream | None = None  # stop-string detection (when there are stop strings)
    grammar: ConstraintMatcher | None = None  # the structured-output constraint's matcher
    # if asked: one per prompt token (None for the first, which has no context)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    shared_blocks: int = 0  # leading blocks owned by the prefix cache (not freed with it)

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.prompt_tokens:]


@dataclass
class TokenOutput:
    request_id: int
    token_id: int
    logits: torch.Tensor  # at the position that produced token_id
    hidden: torch.Tensor  # final hidden state there (after the last norm)
    finish_reason: str  # "" while running
    logprob: TokenLogprob | None = None  # when the sequence asks for logprobs
