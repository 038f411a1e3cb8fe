"""Length tables derived from shipped data: the ShareGPT chatbot workloads and a long-input
summarization stand-in (TaiChi sec. 4.1).

  sharegpt         every round of the shipped ShareGPT conversations as one request whose
                   prompt is the conversation so far (earlier rounds' inputs and outputs plus
                   this round's message), as a chatbot serves it; requests over 2048 tokens
                   (prompt + output) are dropped, as TaiChi filters ShareGPT
  sharegpt-first   first rounds only (a prompt and its reply, vLLM's benchmark style), same
                   filter
  arxiv-long       a stand-in for TaiChi's arXiv summarization inputs, which go to 16,384
                   tokens where the shipped table (Vidur's) stops near 4K: inputs log-normal
                   with median 6,000 tokens (sigma 0.6) clipped to [1,024, 16,384 - output],
                   outputs the shipped table's (real) summary lengths. Synthetic, seeded; not
                   data: it only shows what longer prompts do to the results.

Token counts of `sharegpt_rounds.csv` are cl100k (GPT-4 tokenizer) counts, a close stand-in
for the Qwen2.5 / Llama-3 tokenizers the papers use (pdserve/data/ATTRIBUTION.md).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from pdserve.workload.long_output import alpaca_long_lengths, sharegpt_long_lengths
from pdserve.workload.sharegpt_rounds import sharegpt_rounds

SHAREGPT_MAX_TOKENS = 2048  # TaiChi sec. 4.1: ShareGPT requests over 2048 tokens dropped
ARXIV_LONG_MAX_TOKENS = 16384  # TaiChi sec. 4.1: arXiv requests over 16,384 tokens dropped


def _traces_path(filename: str) -> Path:
    return Path(str(resources.files("pdserve.data") / "traces" / filename))


def _filtered(pairs: list[tuple[int, int]], limit: int) -> tuple[np.ndarray, np.ndarray]:
    kept = np.array([p for p in pairs if p[0] + p[1] <= limit and p[0] > 0 and p[1] > 0],
                    dtype=np.int64)
    return kept[:, 0], kept[:, 1]


def sharegpt_lengths() -> tuple[np.ndarray, np.ndarray]:
    history: dict[int, int] = {}
    pairs = []
    for session, _, message, reply in sorted(sharegpt_rounds(), key=lambda r: (r[0], r[1])):
        prompt = history.get(session, 0) + message
        pairs.append((prompt, reply))
        history[session] = prompt + reply
    return _filtered(pairs, SHAREGPT_MAX_TOKENS)


def sharegpt_first_lengths() -> tuple[np.ndarray, np.ndarray]:
    return _filtered([(m, r) for _, rnd, m, r in sharegpt_rounds() if rnd == 0],
                     SHAREGPT_MAX_TOKENS)


def arxiv_long_lengths(count: int = 20000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    with _traces_path("arxiv_summarization_lengths.csv").open(newline="") as handle:
        outputs = np.array([int(r["output_tokens"]) for r in csv.DictReader(handle)])
    rng = np.random.default_rng(seed)
    out = rng.choice(outputs, size=count)
    inputs = np.exp(rng.normal(np.log(6000.0), 0.6, size=count)).astype(np.int64)
    inputs = np.clip(inputs, 1024, ARXIV_LONG_MAX_TOKENS - out)
    return inputs, out.astype(np.int64)


DERIVED_LENGTH_TABLES: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    "sharegpt-long": sharegpt_long_lengths,  # ARES Table 2 (workload/long_output.py)
    "alpaca-long": alpaca_long_lengths,
    "sharegpt": sharegpt_lengths,
    "sharegpt-first": sharegpt_first_lengths,
    "arxiv-long": arxiv_long_lengths,
}
