"""Changes to a batch's logits before sampling, in this order (vLLM's): logit bias; the
repetition penalty of Keskar et al. 2019 (CTRL) as Hugging Face and vLLM apply it over prompt
and output (a seen token's positive logit is divided by it, a negative one multiplied);
OpenAI's presence and frequency penalties over the output tokens so far
(`logit -= frequency * count + presence * (count > 0)`); min_tokens, which masks the stop
tokens (EOS unless `ignore_eos`, and `stop_token_ids`) until that many output tokens exist;
and last a structured-output constraint's mask (`structured_output.py`): every token its
matcher does not allow next is -inf. On a constrained row, the stop tokens min_tokens masks
and, with `ignore_eos`, EOS are masked only while the constraint allows some other token
(where it allows nothing else, the output must end there).

All are scatters over the batch's (row, token) occurrences: no Python loop over the
vocabulary and no [rows, vocabulary] tensor besides the one copy of the logits. They run
where the logits are: the occurrences are gathered on the host and sent once.

Output tokens are `token_ids[prompt_tokens:]`, so tokens resumed after a failover count.
Token ids outside the vocabulary are ignored (the server refuses them first).
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence

import torch

from pdserve.engine.sampling_params import SamplingParams, SamplingState, TokenConstraint


def _suppressed_stops(row: SamplingState, eos_token_ids: Sequence[int]) -> frozenset[int]:
    """The stop tokens masked on this row: all of them before `min_tokens` output tokens."""
    params = row.params
    if len(row.token_ids) - row.prompt_tokens >= params.min_tokens:
        return frozenset()
    return params.stop_tokens(tuple(eos_token_ids))


def _constraint(row: SamplingState) -> TokenConstraint | None:
    return getattr(row, "grammar", None)  # a state without one is unconstrained


def _has_penalty(row: SamplingState) -> bool:
    params = row.params
    return bool(params.presence_penalty or params.frequency_penalty
                or params.repetition_penalty != 1)


def process_logits(logits: torch.Tensor, rows: Sequence[SamplingState],
                   eos_token_ids: Sequence[int] = ()) -> torch.Tensor | None:
    """A float32 copy of `logits` ([rows, vocab]) with every row's bias, penalties, stop-token
    and constraint masks applied, or None when no row asks for any (the common case costs
    nothing)."""
    biased = [i for i, row in enumerate(rows) if row.params.logit_bias]
    penalized = [i for i, row in enumerate(rows) if _has_penalty(row)]
    constrained = [i for i, row in enumerate(rows) if _constraint(row) is not None]
    no_stop = [i for i, row in enumerate(rows)
               if _constraint(row) is None and _suppressed_stops(row, eos_token_ids)]
    if not (biased or penalized or no_stop or constrained):
        return None
    scores = logits.to(torch.float32, copy=True)
    vocab, device = scores.shape[1], scores.device
    if biased:
        entries = [(i, token, bias) for i in biased
                   for token, bias in rows[i].params.logit_bias if 0 <= token < vocab]
        if entries:
            at_rows, at_tokens, values = zip(*entries, strict=True)
            scores.index_put_((torch.tensor(at_rows, device=device),
                               torch.tensor(at_tokens, device=device)),
                              torch.tensor(values, dtype=torch.float32, device=device),
                              accumulate=True)
    if penalized:
        occurrences = _occurrences([rows[i] for i in penalized], vocab)
        _penalize(scores, penalized, [rows[i].params for i in penalized],
                  *(tensor.to(device) for tensor in occurrences))
    if no_stop:
        entries = [(i, token) for i in no_stop
                   for token in _suppressed_stops(rows[i], eos_token_ids) if 0 <= token < vocab]
        if entries:
            at_rows, at_tokens = zip(*entries, strict=True)
            scores[torch.tensor(at_rows, device=device),
                   torch.tensor(at_tokens, device=device)] = -math.inf
    for i in constrained:
        _constrain(scores[i], rows[i], eos_token_ids)
    return scores


def _constrain(row_scores: torch.Tensor, row: SamplingState,
               eos_token_ids: Sequence[int]) -> None:
    """-inf wherever the row's constraint does not allow the next token (in place)."""
    constraint = _constraint(row)
    assert constraint is not None
    vocab = row_scores.shape[0]
    allowed = constraint.allowed_tokens(vocab)  # on the host: the matcher's mask
    unwanted = set(_suppressed_stops(row, eos_token_ids))
    if row.params.ignore_eos:
        unwanted.update(eos_token_ids)
    unwanted_ids = torch.tensor([t for t in unwanted if 0 <= t < vocab], dtype=torch.long)
    if len(unwanted_ids):
        without = allowed.clone()
        without[unwanted_ids] = False
        if bool(without.any()):
            allowed = without
    row_scores.masked_fill_(~allowed.to(row_scores.device, non_blocking=True), -math.inf)


def _penalize(scores: torch.Tensor, batch_rows: list[int], params: list[SamplingParams],
              at_rows: torch.Tensor, at_tokens: torch.Tensor, in_output: torch.Tensor) -> None:
    """Repetition, then presence and frequency penalties (neutral values where a row has
    only some of them) at the (row, token) occurrences given (`at_rows` index
    `batch_rows`)."""
    vocab, device = scores.shape[1], scores.device
    to_batch = torch.tensor(batch_rows, device=device)
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)
    pairs = torch.unique(at_rows * vocab + at_tokens)  # each seen (row, token) once
    rows_seen, tokens_seen = pairs // vocab, pairs % vocab
    current = scores[to_batch[rows_seen], tokens_seen]
    penalty = repetition[rows_seen]
    scores[to_batch[rows_seen], tokens_seen] = torch.where(current > 0, current / penalty,
                                                           current * penalty)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
    presence = torch.tensor([p.presence_penalty for p in params], device=device)
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
