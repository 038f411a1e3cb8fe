"""Changes to a batch's logits before sampling, as tensor operations over the whole batch
(no Python loop over the vocabulary): logit bias; OpenAI's presence and frequency penalties
over the output tokens so far (`logit -= frequency * count + presence * (count > 0)`); the
repetition penalty of Keskar et al. 2019 (CTRL) as Hugging Face and vLLM apply it over prompt
and output (a seen token's positive logit is divided by it, a negative one multiplied); and
min_tokens, which masks EOS until that many output tokens exist.

Output tokens are `token_ids[prompt_tokens:]`, so tokens resumed after a failover count.
Token ids outside the vocabulary are ignored (the server refuses them first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pdserve.engine.sampling import SamplingState


def _suppresses_eos(row: SamplingState, eos_token_ids: Sequence[int]) -> bool:
    params = row.params
    return (bool(eos_token_ids) and not params.ignore_eos
            and len(row.token_ids) - row.prompt_tokens < params.min_tokens)


def _has_penalty(row: SamplingState) -> bool:
    params = row.params
    return bool(params.presence_penalty or params.frequency_penalty)


def process_logits(logits: torch.Tensor, rows: Sequence[SamplingState],
                   eos_token_ids: Sequence[int] = ()) -> torch.Tensor | None:
    """A float32 copy of `logits` ([rows, vocab]) with every row's bias, penalties and EOS
    mask applied, or None when no row asks for any (the common case costs nothing)."""
    biased = [i for i, row in enumerate(rows) if row.params.logit_bias]
    penalized = [i for i, row in enumerate(rows) if _has_penalty(row)]
    repeated = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1]
    no_eos = [i for i, row in enumerate(rows) if _suppresses_eos(row, eos_token_ids)]
    if not (biased or penalized or repeated or no_eos):
        return None
    scores = logits.to(torch.float32, copy=True)
    vocab = scores.shape[1]
    if biased:
        entries = [(i, token, bias) for i in biased
                   for token, bias in rows[i].params.logit_bias if 0 <= token < vocab]
        if entries:
            at_rows, at_tokens, values = zip(*entries, strict=True)
            scores.index_put_((torch.tensor(at_rows), torch.tensor(at_tokens)),
                              torch.tensor(values, dtype=torch.float32), accumulate=True)
    if penalized:
        counts = _token_counts([rows[i] for i in penalized], vocab, output_only=True)
        frequency = torch.tensor([rows[i].params.frequency_penalty for i in penalized])
        presence = torch.tensor([rows[i].params.presence_penalty for i in penalized])
        scores[penalized] -= (counts * frequency.unsqueeze(1)
                              + (counts > 0) * presence.unsqueeze(1))
    if repeated:
        seen = _token_counts([rows[i] for i in repeated], vocab, output_only=False) > 0
        penalty = torch.tensor([rows[i].params.repetition_penalty
                                for i in repeated]).unsqueeze(1)
        current = scores[repeated]
        penalized_scores = torch.where(current > 0, current / penalty, current * penalty)
        scores[repeated] = torch.where(seen, penalized_scores, current)
    if no_eos:
        eos = torch.tensor([token for token in eos_token_ids if 0 <= token < vocab],
                           dtype=torch.long)
        scores[torch.tensor(no_eos).unsqueeze(1), eos.unsqueeze(0)] = -math.inf
    return scores


def _token_counts(rows: Sequence[SamplingState], vocab: int, output_only: bool) -> torch.Tensor:
    """[rows, vocab] float32 occurrences of each token in each row's output (or its prompt
    and output)."""
    counts = torch.zeros(len(rows), vocab)
    lengths, tokens = [], []
    for row in rows:
        ids = row.token_ids[row.prompt_tokens:] if output_only else row.token_ids
        lengths.append(len(ids))
        tokens += ids
    if not tokens:
        return counts
    token_tensor = torch.tensor(tokens, dtype=torch.long)
    row_tensor = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lengths))
    inside = (token_tensor >= 0) & (token_tensor < vocab)
    counts.index_put_((row_tensor[inside], token_tensor[inside]),
                      torch.ones(int(inside.sum())), accumulate=True)
    return counts
