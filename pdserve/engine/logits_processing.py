"""Changes to a batch's logits before sampling, in this order (vLLM's): logit bias; the
repetition penalty of Keskar et al. 2019 (CTRL) as Hugging Face and vLLM apply it over prompt
and output (a seen token's positive logit is divided by it, a negative one multiplied);
OpenAI's presence and frequency penalties over the output tokens so far
(`logit -= frequency * count + presence * (count > 0)`); and min_tokens, which masks EOS
until that many output tokens exist.

All are scatters over the batch's (row, token) occurrences: no Python loop over the
vocabulary and no [rows, vocabulary] tensor besides the one copy of the logits.

Output tokens are `token_ids[prompt_tokens:]`, so tokens resumed after a failover count.
Token ids outside the vocabulary are ignored (the server refuses them first).
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence

import torch

from pdserve.engine.sampling_params import SamplingParams, SamplingState


def _suppresses_eos(row: SamplingState, eos_token_ids: Sequence[int]) -> bool:
    params = row.params
    return (bool(eos_token_ids) and not params.ignore_eos
            and len(row.token_ids) - row.prompt_tokens < params.min_tokens)


def _has_penalty(row: SamplingState) -> bool:
    params = row.params
    return bool(params.presence_penalty or params.frequency_penalty
                or params.repetition_penalty != 1)


def process_logits(logits: torch.Tensor, rows: Sequence[SamplingState],
                   eos_token_ids: Sequence[int] = ()) -> torch.Tensor | None:
    """A float32 copy of `logits` ([rows, vocab]) with every row's bias, penalties and EOS
    mask applied, or None when no row asks for any (the common case costs nothing)."""
    biased = [i for i, row in enumerate(rows) if row.params.logit_bias]
    penalized = [i for i, row in enumerate(rows) if _has_penalty(row)]
    no_eos = [i for i, row in enumerate(rows) if _suppresses_eos(row, eos_token_ids)]
    if not (biased or penalized or no_eos):
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
        _penalize(scores, penalized, [rows[i].params for i in penalized],
                  *_occurrences([rows[i] for i in penalized], vocab))
    if no_eos:
        eos = torch.tensor([token for token in eos_token_ids if 0 <= token < vocab],
                           dtype=torch.long)
        scores[torch.tensor(no_eos).unsqueeze(1), eos.unsqueeze(0)] = -math.inf
    return scores


def _penalize(scores: torch.Tensor, batch_rows: list[int], params: list[SamplingParams],
              at_rows: torch.Tensor, at_tokens: torch.Tensor, in_output: torch.Tensor) -> None:
    """Repetition, then presence and frequency penalties (neutral values where a row has
    only some of them) at the (row, token) occurrences given (`at_rows` index
    `batch_rows`)."""
    vocab = scores.shape[1]
    to_batch = torch.tensor(batch_rows)
    repetition = torch.tensor([p.repetition_penalty for p in params])
    pairs = torch.unique(at_rows * vocab + at_tokens)  # each seen (row, token) once
    rows_seen, tokens_seen = pairs // vocab, pairs % vocab
    current = scores[to_batch[rows_seen], tokens_seen]
    penalty = repetition[rows_seen]
    scores[to_batch[rows_seen], tokens_seen] = torch.where(current > 0, current / penalty,
                                                           current * penalty)
    frequency = torch.tensor([p.frequency_penalty for p in params])
    presence = torch.tensor([p.presence_penalty for p in params])
    out_rows, out_tokens = at_rows[in_output], at_tokens[in_output]
    scores.index_put_((to_batch[out_rows], out_tokens), -frequency[out_rows],
                      accumulate=True)  # summed over occurrences: count * penalty
    pairs = torch.unique(out_rows * vocab + out_tokens)
    rows_seen, tokens_seen = pairs // vocab, pairs % vocab
    scores.index_put_((to_batch[rows_seen], tokens_seen), -presence[rows_seen],
                      accumulate=True)


def _occurrences(rows: Sequence[SamplingState],
                 vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(index into `rows`, token id, whether it is an output token) of every token of each
    row, ids outside the vocabulary left out; one tensor conversion for the batch."""
    lengths, prompts, tokens = [], [], []
    for row in rows:
        lengths.append(len(row.token_ids))
        prompts.append(row.prompt_tokens)
        tokens += row.token_ids
    counts = torch.tensor(lengths)
    token_tensor = _long_tensor(tokens)
    row_tensor = torch.repeat_interleave(torch.arange(len(rows)), counts)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    in_output = (torch.arange(len(tokens)) - starts
                 >= torch.repeat_interleave(torch.tensor(prompts), counts))
    inside = (token_tensor >= 0) & (token_tensor < vocab)
    return row_tensor[inside], token_tensor[inside], in_output[inside]


def _long_tensor(values: list[int]) -> torch.Tensor:
    """An int64 tensor of a long list, several times faster than `torch.tensor(list)`."""
    if not values:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(array.array("q", values), dtype=torch.long)
