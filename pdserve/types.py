"""Plain data shared by every part of pdserve: requests, SLOs and instance roles.

A `Request` carries both what the workload says (arrival, lengths) and what happened to
it (tokens generated, timestamps, where it ran). The simulated and the live world fill the
same fields, and `pdserve.metrics.summary` scores both from them.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

KV_BLOCK_TOKENS = 16
"""Tokens per KV block, as in vLLM; memory is accounted in whole blocks."""


def blocks_for(tokens: int) -> int:
    """Number of KV blocks that hold `tokens` tokens."""
    return -(-tokens // KV_BLOCK_TOKENS)


def attn_units(new_tokens: int, prior_tokens: int) -> int:
    """Attention work of a chunk of `new_tokens` after `prior_tokens`, in units of n^2.

    Chunks add up: attn_units(a, p) + attn_units(b, p + a) == attn_units(a + b, p)."""
    return new_tokens * (new_tokens + 2 * prior_tokens)


class Role(enum.Enum):
    """What an instance does; Arrow's four elastic pools plus colocated serving.

    P_TO_D: flipped to decode, still finishing its prefills (takes decodes, no new prefills).
    D_TO_P: flipped to prefill, still finishing its decodes (takes prefills, no new decodes).
    """

    PREFILL = "prefill"
    DECODE = "decode"
    P_TO_D = "prefill->decode"
    D_TO_P = "decode->prefill"
    MIXED = "mixed"  # colocated: both phases, chunked prefill next to decodes
    RESERVE = "reserve"  # held back for elastic scaling (FlowKV): takes no new work

    @property
    def takes_prefill(self) -> bool:
        return self in _TAKES_PREFILL

    @property
    def takes_decode(self) -> bool:
        return self in _TAKES_DECODE


_TAKES_PREFILL = frozenset({Role.PREFILL, Role.D_TO_P, Role.MIXED})
_TAKES_DECODE = frozenset({Role.DECODE, Role.P_TO_D, Role.MIXED})


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets; a request attains its SLO when both are met. `counts_decode_queue`:
    TTFT runs until the decode instance's first token and TPOT over that instance's gaps
    (TaiChi sec. 4.1's definitions: the wait for a decode slot counts), instead of the
    prefill's first token and the mean gap after it."""

    ttft_s: float
    tpot_s: float
    counts_decode_queue: bool = False

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLO targets must be positive, got ttft_s={self.ttft_s}, "
                             f"tpot_s={self.tpot_s}")


@dataclass(slots=True, eq=False)
class Request:
    """One request and its life so far.

    `output_tokens` is the number of tokens to generate: the trace's length in simulation,
    `max_tokens` in the live world (where a stop condition may end it earlier).
    `generated_tokens` counts tokens produced so far; the sequence held in KV after a step is
    `input_tokens + generated_tokens` long.
    """

    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    session_id: int = -1
    round_index: int = 0
    hash_ids: tuple[int, ...] = ()
    # --- sessions (AMPD): a round's prompt is its session's history plus new tokens ---
    history_tokens: int = 0  # prompt prefix that is the session's earlier rounds
    tool_delay_s: float = 0.0  # tool/environment wait after the previous round finished
    retain_kv: bool = False  # keep the KV on the decode instance for the next round
    cached_prefix_tokens: int = 0  # history KV this round reuses instead of computing it
    home_instance: int = -1  # decode instance holding the session's history KV (binding)
    # --- progress, written by the local scheduler ---
    generated_tokens: int = 0
    prefill_target_tokens: int = 0  # tokens the current (re)prefill must compute
    prefilled_tokens: int = 0  # of those, already computed
    kv_blocks: int = 0  # blocks held on the instance that currently owns the request
    cached_blocks: int = 0  # leading prompt hash blocks it uses from that instance's prefix
    # cache (`instance.prefix_cache`); counted in kv_blocks, owned by the cache
    admit_seq: int = 0  # admission order on its instance (newest is preempted first)
    preemptions: int = 0
    cobatched_prefill_tokens: int = 0  # prefill tokens in the batches of its decode steps
    # --- outcome, written by the driver ---
    first_token_s: float = math.nan
    finish_s: float = math.nan
    prefill_instance: int = -1
    decode_instance: int = -1
    rejected_reason: str = ""
    transfer_s: float = 0.0  # time spent moving KV between instances
    # --- token timing on the decode instance (see `record_decode_tokens`) ---
    decode_first_token_s: float = math.nan  # first token emitted by its decode instance
    last_token_s: float = math.nan  # latest token emitted by its decode instance
    max_itl_s: float = 0.0  # widest gap between consecutive tokens from decode_first_token_s on

    def decode_in_place(self) -> None:
        """The instance that prefilled this request decodes it: the prefill's token was
        already the decode instance's first."""
        if self.decode_first_token_s != self.decode_first_token_s:  # NaN: not yet set
            self.decode_first_token_s = self.last_token_s = self.first_token_s

    def record_decode_tokens(self, first_s: float, last_s: float,
                             max_gap_between_s: float = 0.0) -> None:
        """Its decode instance emitted tokens, the first at `first_s` and the last at
        `last_s` (equal for one token), with at most `max_gap_between_s` between two of
        them (`record_decode_tokens`)."""
        record_decode_tokens((self,), first_s, last_s, max_gap_between_s)

    @property
    def sequence_tokens(self) -> int:
        return self.input_tokens + self.generated_tokens

    @property
    def remaining_output_tokens(self) -> int:
        return self.output_tokens - self.generated_tokens

    @property
    def finished(self) -> bool:
        return not math.isnan(self.finish_s)


Z_P90 = 1.2815515655446004  # the standard normal's 90th percentile


def add_control_latency(requests: Iterable[Request], latency_s: float, p90_s: float = 0.0,
                        seed: int = 0) -> None:
    """What the client sees: each request reached its instance `latency_s` late in total
    (HTTP, tokenizing, the driver, pipes, streaming back), so every output time moves by it;
    TPOT and ITL do not change. A constant shift of arrivals leaves queueing as it was, so
    adding it after a run equals simulating it (except for session rounds, which chain on
    the simulated finish). With `p90_s` above `latency_s`, each request draws its own
    latency (seeded) from a lognormal with median `latency_s` and P90 `p90_s`, as measured
    live (`control_latency_shifts`); the arrival side of it (a few ms) would reorder
    arrivals slightly, which adding it after the run leaves out."""
    if not latency_s:
        return
    requests = list(requests)
    for request, shift_s in zip(requests, control_latency_shifts(len(requests), latency_s,
                                                                 p90_s, seed), strict=True):
        request.first_token_s += shift_s
        request.finish_s += shift_s
        request.decode_first_token_s += shift_s
        request.last_token_s += shift_s


def control_latency_shifts(count: int, latency_s: float, p90_s: float = 0.0,
                           seed: int = 0) -> list[float]:
    """The shift `add_control_latency` gives each of `count` requests, in their order (all
    0.0 without a latency): known before a run, so a run can score its requests as they
    finish (`metrics/attainment_watch.py`)."""
    if not latency_s:
        return [0.0] * count
    rng = random.Random(seed)
    sigma = math.log(p90_s / latency_s) / Z_P90 if p90_s > latency_s else 0.0
    return [rng.lognormvariate(math.log(latency_s), sigma) if sigma else latency_s
            for _ in range(count)]


def record_decode_tokens(requests: Iterable[Request], first_s: float, last_s: float,
                         max_gap_between_s: float = 0.0) -> None:
    """One decode instance emitted tokens for each of `requests` (a batch): the first at
    `first_s`, the last at `last_s` (equal for one token), at most `max_gap_between_s`
    apart in between. The gap since a request's previous token counts toward its
    `max_itl_s`; the KV hand-off before its decode instance's first token does not (TaiChi
    counts that in TTFT). One loop per batch: the simulator calls it for every batch."""
    for request in requests:
        previous = request.last_token_s
        if previous != previous:  # NaN: the decode instance's first token
            request.decode_first_token_s = first_s
            widest = max_gap_between_s
        else:
            widest = first_s - previous
            if max_gap_between_s > widest:
                widest = max_gap_between_s
        if widest > request.max_itl_s:
            request.max_itl_s = widest
        request.last_token_s = last_s
