"""Long-output (reasoning-style) length tables matching ARES's Table 2
(`../shared/papers/ares.md`, sec. 6.1): DeepSeek-R1-Distill-Qwen-7B answering ShareGPT and
Alpaca prompts with outputs capped so that prompt + output <= 32K tokens.

  sharegpt-long   inputs: the shipped ShareGPT first-round messages (cl100k counts; mean
                  261, P50 32, P90 695 against the paper's 305 / 36 / 920); outputs drawn
                  from the mixture below, independent of the input
  alpaca-long     inputs: log-normal, median 10 tokens, sigma 0.32 (Alpaca instructions:
                  the paper's mean 11, P50 10, P90 15; no Alpaca data is shipped); outputs
                  from the mixture below

Output mixture (seeded; `OutputShape`): with probability `cap_fraction` the request runs to
the cap (32,768 - input tokens: the paper's P90 32,670 and P95 32,679 sit at it); otherwise
with probability `tail_fraction` uniform in [4,000, 30,000) (the long reasoning tail),
else log-normal with `body_median` and `body_sigma`, clipped to [1, 30,000]. Parameters
were fitted to Table 2's P50, P90 and mean and to sec. 2.2's shares (ShareGPT: 29.2 %
under 1,000 tokens, 17.3 % over 30,000). What `tests/test_ares_workload.py` checks
against the paper:

  row       | mean (paper) | P50 (paper)  | P90 (paper)    | <1K  | >30K
  ShareGPT  | ~7.5K (7542) | ~1.5K (1536) | ~32.7K (32670) | ~29% | ~17%
  Alpaca    | ~8.6K (8596) | ~1.0K (987)  | ~32.7K (32690) |      |

Use as `synthetic_lengths: table:sharegpt-long` with `trace: synthetic` (Poisson arrivals
at `synthetic_rate_rps`; the paper's rates are 0.13-0.17 req/s for ShareGPT, ~1.7 Alpaca).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdserve.workload.sharegpt_rounds import sharegpt_rounds

CONTEXT_CAP_TOKENS = 32768  # prompt + output (the paper's 32K)
TAIL_RANGE_TOKENS = (4000, 30000)
TABLE_ROWS = 20000  # rows per table; synthetic workloads draw from them


@dataclass(frozen=True)
class OutputShape:
    cap_fraction: float
    tail_fraction: float  # of the requests that do not run to the cap
    body_median: float
    body_sigma: float


SHAREGPT_OUTPUTS = OutputShape(cap_fraction=0.173, tail_fraction=0.05, body_median=1230.0,
                               body_sigma=0.634)
ALPACA_OUTPUTS = OutputShape(cap_fraction=0.20, tail_fraction=0.10, body_median=560.0,
                             body_sigma=1.0)


def sample_outputs(shape: OutputShape, inputs: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    count = len(inputs)
    cap = CONTEXT_CAP_TOKENS - inputs
    body = np.exp(rng.normal(np.log(shape.body_median), shape.body_sigma, size=count))
    tail = rng.uniform(*TAIL_RANGE_TOKENS, size=count)
    u = rng.random(count)
    capped = u < shape.cap_fraction
    in_tail = (~capped) & (rng.random(count) < shape.tail_fraction)
    out = np.where(capped, cap, np.where(in_tail, tail, body))
    out = np.where(capped, out, np.clip(out, 1, TAIL_RANGE_TOKENS[1]))
    return np.maximum(1, np.minimum(np.round(out), cap)).astype(np.int64)


def sharegpt_long_lengths(count: int = TABLE_ROWS, seed: int = 0) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    firsts = np.array([m for _, rnd, m, _ in sharegpt_rounds() if rnd == 0 and m > 0],
                      dtype=np.int64)
    rng = np.random.default_rng(seed)
    inputs = np.minimum(rng.choice(firsts, size=count), CONTEXT_CAP_TOKENS // 2)
    return inputs, sample_outputs(SHAREGPT_OUTPUTS, inputs, rng)


def alpaca_long_lengths(count: int = TABLE_ROWS, seed: int = 0) -> tuple[np.ndarray,
                                                                        np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = np.maximum(1, np.round(np.exp(rng.normal(np.log(10.0), 0.32, size=count))))
    inputs = inputs.astype(np.int64)
    return inputs, sample_outputs(ALPACA_OUTPUTS, inputs, rng)
