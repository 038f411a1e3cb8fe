"""The shipped prompt set as a live workload: requests whose output length the prompt sets.

A trace replay (`live/replay_client.py`) sends token ids of a given length and forces the
output length (`ignore_eos`), so a length predictor has nothing to read from the request.
Here each request is a prompt of `prompts.py` (one-word answers to essays), rendered with
the served model's chat template, sampled as `pdserve predictor record` samples
(temperature 0.7, top-p 0.95, its own seed) and ended by EOS or the `max_tokens` cap: the
output length depends on what was asked, as it did in the recording the predictor learned.

`PromptWorkload.draw` picks `count` requests with Poisson arrivals at `rate_rps`; each draws a
kind (short, medium, long) uniformly, as the whole prompt set has them in equal shares, then
a prompt of that kind from the given ones, with replacement (a subset such as the unseen
prompts keeps the set's mix). The same `seed` gives the same requests, arrival times and
sampling seeds, so contenders replay identical draws. `body` is the streaming
`/v1/completions` body for `replay(body_of=...)`. `unseen_prompts` keeps the prompts a
trained predictor never saw a generation of (neither its training nor its validation split).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdserve.predictor.mlp import split_requests
from pdserve.predictor.prompts import Prompt
from pdserve.predictor.record import RecordedSet
from pdserve.types import Request
from pdserve.workload.workload import Workload

SEED_STRIDE = 1_000_003  # request i of draw s samples with seed s * SEED_STRIDE + i


@dataclass(frozen=True, slots=True)
class PromptRequest:
    prompt: Prompt
    token_ids: tuple[int, ...]  # the chat-templated prompt
    seed: int  # its sampling seed


@dataclass(frozen=True)
class PromptWorkload:
    workload: Workload  # arrivals; input tokens; output tokens = the cap
    requests: tuple[PromptRequest, ...]  # by request id (the workload's row)
    max_tokens: int
    temperature: float = 0.7
    top_p: float = 0.95

    @classmethod
    def draw(cls, prompts: Sequence[Prompt], encode: Callable[[str], list[int]], count: int,
             rate_rps: float, seed: int, max_tokens: int, temperature: float = 0.7,
             top_p: float = 0.95) -> PromptWorkload:
        if count < 1 or not prompts:
            raise ValueError(f"a prompt workload needs requests and prompts, got {count} of "
                             f"{len(prompts)} prompts")
        if not rate_rps > 0 or max_tokens < 1:
            raise ValueError(f"rate {rate_rps} req/s and max_tokens {max_tokens} must be "
                             "positive")
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, count))
        arrivals -= arrivals[0]  # the first request at 0
        kinds = sorted({p.kind for p in prompts})
        of_kind = [[i for i, p in enumerate(prompts) if p.kind == kind] for kind in kinds]
        chosen = rng.integers(0, len(kinds), count)
        picks = np.array([of_kind[k][rng.integers(0, len(of_kind[k]))]
                          for k in chosen.tolist()])
        ids = {i: tuple(encode(prompts[i].text)) for i in sorted(set(picks.tolist()))}
        requests = tuple(PromptRequest(prompts[p], ids[p], seed * SEED_STRIDE + n)
                         for n, p in enumerate(picks.tolist()))
        workload = Workload(f"prompts(seed={seed})", arrivals,
                            np.array([len(r.token_ids) for r in requests], dtype=np.int64),
                            np.full(count, max_tokens, dtype=np.int64))
        return cls(workload, requests, max_tokens, temperature, top_p)

    def __len__(self) -> int:
        return len(self.requests)

    def body(self, request: Request, model: str) -> dict[str, Any]:
        """What `replay` sends for `request`: its prompt's token ids, sampled with its seed,
        stopping at EOS or `max_tokens`."""
        drawn = self.requests[request.request_id]
        return {"model": model, "prompt": list(drawn.token_ids), "max_tokens": self.max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "seed": drawn.seed,
                "stream": True, "stream_options": {"include_usage": True}}

    def kind_of(self, request_id: int) -> str:
        return self.requests[request_id].prompt.kind


def unseen_prompts(prompts: Sequence[Prompt], data: RecordedSet, split_seed: int
                   ) -> list[Prompt]:
    """The prompts of which `data` (the recording a predictor was trained on, split by
    prompt with `split_seed` as `pdserve predictor train` splits it) has no generation in the
    training or validation split: its test prompts, those it never recorded, and those
    whose generations stopped before the first capture (no sample)."""
    groups = data.prompt_groups()
    if groups is None:
        raise ValueError("the recording has no topics per request, so its split by prompt "
                         "cannot be rebuilt; record it again")
    train, validation, _ = split_requests(data.request_id, split_seed, groups)
    seen_ids = np.concatenate([train, validation])
    seen = set(groups[np.isin(data.request_id, seen_ids)].tolist())
    return [p for p in prompts if f"{p.template}/{p.topic}" not in seen]


def chat_encoder(model: str) -> Callable[[str], list[int]]:
    """Text -> token ids of it as the served model's chat template renders one user turn
    (what `pdserve predictor record` fed the engine)."""
    from pdserve.engine.checkpoint import resolve_model

    source = resolve_model(model)
    tokenizer = source.require_tokenizer()
    template = source.chat_template

    def encode(text: str) -> list[int]:
        return tokenizer.encode(template.render([{"role": "user", "content": text}]))

    return encode
