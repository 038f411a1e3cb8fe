"""Prompt logprobs (`SamplingParams.prompt_logprobs`): computed during a sequence's first
prefill from the logits of its prompt positions, which the engine packs after the sampled
rows of the batch."""

from __future__ import annotations

import torch

from pdserve.engine.sampling import token_logprobs
from pdserve.engine.sequence import Sequence


def prompt_logprob_rows(work: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int, int]]:
    """(sequence, packed row, prompt token it predicts) for each position whose prompt
    logprobs are wanted and not yet known."""
    wanted, offset = [], 0
    for sequence, count in work:
        start, known = sequence.computed_tokens, len(sequence.prompt_logprobs)
        if sequence.params.prompt_logprobs is not None and known < sequence.prompt_tokens:
            first = max(start, known - 1)
            for position in range(first, min(start + count, sequence.prompt_tokens - 1)):
                wanted.append((sequence, offset + position - start, position + 1))
        offset += count
    return wanted


def record_prompt_logprobs(wanted: list[tuple[Sequence, int, int]],
                           logits: torch.Tensor) -> None:
    computed = token_logprobs(
        logits, [sequence.token_ids[target] for sequence, _, target in wanted],
        [sequence.params.prompt_logprobs or 0 for sequence, _, _ in wanted])
    for (sequence, _, target), logprob in zip(wanted, computed, strict=True):
        if len(sequence.prompt_logprobs) == target:
            sequence.prompt_logprobs.append(logprob)
