"""The batched sampler of the engine, and the logprobs of tokens.

One call samples the next token of every sequence in a batch from its logits row:
logit bias, OpenAI presence/frequency penalties (over the output so far), the HF/vLLM
repetition penalty (over prompt and output), min_tokens' stop-token suppression and a
structured-output constraint's mask change the logits (`logits_processing.py`); then greedy
rows take the argmax and the others are sampled with temperature, top-k, top-p and min-p
(over the tokens the constraint allows: the others have probability 0). A batch of plain
greedy rows is one argmax.

Everything runs where the logits are (a GPU engine's stay on the GPU, float32): the host
sends what is per row (temperatures, seeds' uniform numbers, penalty occurrences, a
constraint's mask) and reads back only the sampled ids and the logprobs asked for, never a
[rows, vocabulary] tensor (`tests/test_device_sampling.py` holds it to that).

Logprobs (`token_logprobs`) are always those of the raw model distribution, before any of
these changes: for a request with a structured-output constraint too, so a constrained
token's logprob says how likely the model found it unconstrained (vLLM reports the
processed distribution instead; pdserve reports the raw one for every request alike).

Seeded draws are a pure function of (seed, or the request id without one; the index of the
output token; the logits), on a given device: the draw's uniform number comes from a hash of
the first two (on the host) and picks the token by inverse CDF. A re-run that resumes from
tokens already generated therefore draws exactly what an uninterrupted run would, and a
sequence moved to another instance needs no generator state.

A row whose distribution is unusable (NaN or infinite logits, no probability mass left
after filtering) falls back to greedy for that row and is logged; it never raises.

What a request asks of the sampler, `SamplingParams`, is defined in `sampling_params.py`
(shared with `logits_processing.py`) and re-exported here, where its users import it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.engine.logits_processing import process_logits
from pdserve.engine.sampling_params import SamplingParams as SamplingParams
from pdserve.engine.sampling_params import SamplingState

logger = logging.getLogger(__name__)

LOGPROB_FLOOR = -9999.0  # reported for log(0) and NaN


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the raw model logits and the top alternatives
    (sorted by log-probability, descending)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def draw_uniform(key: int, index: int) -> float:
    """The uniform number in [0, 1) of output token `index` of the stream `key`."""
    packed = struct.pack("<QQ", key % 2 ** 64, index)
    bits = int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little")
    return (bits >> 11) * 2.0 ** -53


def sample_batch(logits: torch.Tensor, rows: Sequence[SamplingState],
                 eos_token_ids: Sequence[int] = ()) -> list[int]:
    """The next token of each row ([rows, vocab] logits, one row per state)."""
    processed = process_logits(logits, rows, eos_token_ids)
    scores = logits if processed is None else processed  # None: nothing to change
    if all(row.params.greedy for row in rows):
        return _greedy(scores, rows, range(len(rows)))
    scores = scores.float()
    tokens = [0] * len(rows)
    greedy = [i for i, row in enumerate(rows) if row.params.greedy]
    drawn = [i for i, row in enumerate(rows) if not row.params.greedy]
    chosen, usable = _draw(_take(scores, drawn), [rows[i] for i in drawn])
    unusable = [i for i, ok in zip(drawn, usable, strict=True) if not ok]
    for indices, picked in ((drawn, chosen), (greedy, _greedy(scores, rows, greedy)),
                            (unusable, _greedy(scores, rows, unusable, fallback=True))):
        for i, token in zip(indices, picked, strict=True):
            tokens[i] = token
    return tokens


def _take(scores: torch.Tensor, indices: Sequence[int]) -> torch.Tensor:
    """The given rows (ascending, distinct), without a copy when they are all the rows."""
    return scores if len(indices) == len(scores) else scores[list(indices)]


def _greedy(scores: torch.Tensor, rows: Sequence[SamplingState], indices: Sequence[int],
            fallback: bool = False) -> list[int]:
    """Argmax of the given rows; NaN never wins. Logs each row that falls back here from
    sampling and each greedy row with NaN logits."""
    if not indices:
        return []
    picked = _take(scores, indices)
    best = torch.argmax(picked, dim=-1)  # torch's argmax picks a NaN if there is one
    has_nan = torch.isnan(picked.gather(1, best.unsqueeze(1)).squeeze(1))
    # one read from the device: the ids and, past them, which rows hit a NaN
    read = torch.cat((best, has_nan.long())).tolist()
    nan_rows = [i for i, flag in enumerate(read[len(indices):]) if flag]
    if not (fallback or nan_rows):
        return read[:len(indices)]
    for position in range(len(indices)) if fallback else nan_rows:
        logger.warning("request %d: %s distribution unusable (non-finite logits or no "
                       "probability left after filtering); this token is greedy",
                       rows[indices[position]].request_id, "sampling" if fallback else "greedy")
    return torch.argmax(torch.nan_to_num(picked.float(), nan=-math.inf), dim=-1).tolist()


def _draw(scores: torch.Tensor, rows: Sequence[SamplingState]) -> tuple[list[int], list[bool]]:
    """One seeded draw per row (temperature, then top-k, top-p and min-p); returns the
    tokens and whether each row's distribution was usable. Rows without filters draw by
    inverse CDF in vocabulary order; rows with filters over their candidates sorted by
    probability: the top k (`torch.topk`, linear in the vocabulary) or, without top-k, the
    whole sorted vocabulary. Rows are grouped by that path and k, which depend only on the
    row's own parameters, so no row's draw depends on the rest of the batch."""
    tokens, usable = [0] * len(rows), [False] * len(rows)
    groups: dict[int, list[int]] = {}  # -1: no filter, 0: sort all, k: top k
    for i, row in enumerate(rows):
        params = row.params
        filtered = params.top_k or params.top_p < 1 or params.min_p > 0
        groups.setdefault(params.top_k if filtered else -1, []).append(i)
    for candidates, group in groups.items():
        picked, ok = _draw_group(_take(scores, group), [rows[i] for i in group], candidates)
        for i, token, fine in zip(group, picked, ok, strict=True):
            tokens[i], usable[i] = token, fine
    return tokens, usable


def _draw_group(scores: torch.Tensor, rows: Sequence[SamplingState],
                candidates: int) -> tuple[list[int], list[bool]]:
    """`candidates`: -1 all tokens in vocabulary order, 0 all sorted, k the top k sorted."""
    params = [row.params for row in rows]
    device = scores.device
    temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
    scaled = (scores - scores.max(dim=-1, keepdim=True).values) / temperature
    order = None
    if candidates == 0:
        scaled, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    elif candidates > 0:
        scaled, order = torch.topk(scaled, min(candidates, scaled.shape[1]), dim=-1)
    if order is not None:
        probs = torch.softmax(scaled, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float64,
                             device=device).unsqueeze(1)
        min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)
        drop = (before >= top_p) | (probs < min_p * probs[:, :1])
        drop[:, 0] = False  # the most likely token always stays
        probs = probs.masked_fill(drop, 0.0)
    else:
        probs = torch.softmax(scaled, dim=-1)
    width = probs.shape[1]
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1]  # NaN if any probability is (softmax of NaN or of +inf logits)
    usable = torch.isfinite(total) & (total > 0)
    uniform = torch.tensor([draw_uniform(_key(row), len(row.token_ids) - row.prompt_tokens)
                            for row in rows], dtype=torch.float64, device=device)
    target = (uniform * total.double()).to(cdf.dtype).unsqueeze(1)
    # the first token whose cdf exceeds the target has probability > 0, unless rounding
    # put the target at the total: then take the last token with probability > 0
    index = torch.searchsorted(cdf, target, right=True).clamp(max=width - 1)
    # without a read from the device: the last token with probability > 0 wherever the
    # first pick has none
    last_kept = torch.where(probs > 0, torch.arange(width, device=device), 0).max(
        dim=-1, keepdim=True).values
    index = torch.where(probs.gather(1, index) == 0, torch.minimum(index, last_kept), index)
    if order is not None:
        index = order.gather(1, index)
    read = torch.cat((index.squeeze(1), usable.long())).tolist()  # one read
    return read[:len(rows)], [bool(flag) for flag in read[len(rows):]]


def _key(row: SamplingState) -> int:
    seed = row.params.seed
    return seed if seed is not None else row.request_id


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int],
                   top: Sequence[int]) -> list[TokenLogprob]:
    """Log-softmax (float32) of raw logits rows: each row's `tokens[i]` and its top
    `top[i]` alternatives. Values that are not finite (only from non-finite logits) are
    reported as LOGPROB_FLOOR, as vLLM does, so that they serialize as JSON."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs = torch.nan_to_num(logprobs, nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1)
                             ).squeeze(1).tolist()
    most = max(top, default=0)
    best_values, best_ids = ([], []) if most == 0 else (
        t.tolist() for t in torch.topk(logprobs, min(most, logprobs.shape[1]), dim=-1))
    result = []
    for i, (token, value) in enumerate(zip(tokens, chosen, strict=True)):
        alternatives = () if top[i] == 0 else tuple(
            zip(best_ids[i][:top[i]], best_values[i][:top[i]], strict=True))
        result.append(TokenLogprob(token, value, alternatives))
    return result
