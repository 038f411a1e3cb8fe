"""Multi-round session workloads (AMPD sec. 7.1, Table 1).

A session is a list of rounds; round r's prompt is the session's history (every earlier
round's new input and output) plus its own new input, and round r > 0 is sent a tool delay
after round r-1 finished (the simulator chains them, `pdserve.sim.sessions`). Sessions start
as a Poisson process. Workload names:

  sharegpt-sessions   real multi-turn ShareGPT conversations: new user tokens and answer
                      tokens per round (`data/traces/sharegpt_rounds.csv`); between rounds a
                      user think time, exponential with mean `THINK_TIME_S`
  mooncake-sessions   the shipped Mooncake conversation trace with sessions inferred from
                      shared prefix hashes (pdserve/data/ATTRIBUTION.md); first rounds keep
                      the trace's arrival times; a round's history is the previous round's
                      prompt plus output, capped below its own prompt (the trace gives whole
                      prompts, not what they share); its delay is the trace's gap between the
                      two rounds' arrivals
  agent:<kind>        synthetic agent sessions matching Table 1 (`AGENT_PROFILES`):
                      toolbench, gaia, hotpotqa, dureader

Synthetic lengths: the number of rounds is fixed for the retrieval traces (HotpotQA and
DuReader run three retrieval calls, Appendix B) and 1 + Poisson(mean - 1) for the agent
traces; per-round new prompt and output lengths are lognormal with the table's means and a
coefficient of variation `LENGTH_CV`. Tool delays (the paper gives none) are lognormal with
the profile's median and sigma 0.8: API tools about a second, web browsing in GAIA a few
seconds, a retrieval call a few hundred milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdserve.workload.sharegpt_rounds import sharegpt_rounds
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload

THINK_TIME_S = 5.0
LENGTH_CV = 0.6
TOOL_DELAY_SIGMA = 0.8


@dataclass(frozen=True)
class AgentProfile:
    """Table 1's averages for one trace, plus the tool delay the paper does not give."""

    mean_rounds: float
    fixed_rounds: bool
    prefill_tokens: float  # new prompt tokens per round
    decode_tokens: float  # output tokens per round
    tool_delay_median_s: float


AGENT_PROFILES: dict[str, AgentProfile] = {
    "toolbench": AgentProfile(3.96, False, 703.79, 50.39, 1.0),
    "gaia": AgentProfile(11.32, False, 6161.02, 528.76, 3.0),
    "hotpotqa": AgentProfile(3.0, True, 1569.8, 80.03, 0.3),
    "dureader": AgentProfile(3.0, True, 3081.23, 150.10, 0.3),
}


def is_session_workload(name: str) -> bool:
    return name in ("sharegpt-sessions", "mooncake-sessions") or name.startswith("agent:")


def session_workload(name: str, sessions: int, rate_sps: float, seed: int = 0) -> Workload:
    """The named session workload; `sessions` and `rate_sps` (sessions started per second)
    apply to the generated ones (ShareGPT, agents)."""
    if sessions < 1 or not rate_sps > 0:
        raise ValueError(f"session workload {name!r}: sessions must be >= 1 and rate_sps "
                         f"positive, got {sessions} and {rate_sps}")
    rng = np.random.default_rng(seed)
    if name == "mooncake-sessions":
        return mooncake_sessions()
    if name == "sharegpt-sessions":
        return sharegpt_sessions(sessions, rate_sps, rng)
    kind = name.removeprefix("agent:")
    if kind not in AGENT_PROFILES:
        raise ValueError(f"unknown agent workload {name!r}; known: "
                         f"{', '.join('agent:' + k for k in AGENT_PROFILES)}")
    return agent_sessions(kind, sessions, rate_sps, rng)


def from_rounds(name: str, starts_s: np.ndarray, new_input: list[list[int]],
                output: list[list[int]], delays_s: list[list[float]]) -> Workload:
    """A workload from per-session lists of new input tokens, output tokens and delays
    (delay before each round; the first is ignored). Rows are ordered by each round's
    nominal arrival (start plus delays; the simulator sets the real one)."""
    rows: list[tuple[float, int, int, int, int, int, float]] = []
    for sid, start in enumerate(starts_s.tolist()):
        history, nominal = 0, start
        for r, (n_new, n_out, delay) in enumerate(zip(new_input[sid], output[sid],
                                                      delays_s[sid], strict=True)):
            if r:
                nominal += delay
            rows.append((nominal, history + max(1, n_new), max(1, n_out), sid, r, history,
                         delay if r else 0.0))
            history += max(1, n_new) + max(1, n_out)
    rows.sort(key=lambda row: (row[0], row[3], row[4]))
    data = np.array(rows, dtype=np.float64).reshape(-1, 7)
    ints = data[:, 1:6].astype(np.int64)
    return Workload(name, data[:, 0], ints[:, 0], ints[:, 1], ints[:, 2], ints[:, 3],
                    history_tokens=ints[:, 4], tool_delay_s=data[:, 6])


def _lognormal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size)


def agent_sessions(kind: str, sessions: int, rate_sps: float,
                   rng: np.random.Generator) -> Workload:
    profile = AGENT_PROFILES[kind]
    starts = np.cumsum(rng.exponential(1 / rate_sps, sessions))
    starts -= starts[0]
    if profile.fixed_rounds:
        rounds = np.full(sessions, round(profile.mean_rounds))
    else:
        rounds = 1 + rng.poisson(profile.mean_rounds - 1, sessions)
    new_input, output, delays = [], [], []
    for count in rounds.tolist():
        new_input.append(np.rint(_lognormal(rng, profile.prefill_tokens, LENGTH_CV,
                                            count)).astype(int).tolist())
        output.append(np.rint(_lognormal(rng, profile.decode_tokens, LENGTH_CV,
                                         count)).astype(int).tolist())
        delays.append(rng.lognormal(np.log(profile.tool_delay_median_s), TOOL_DELAY_SIGMA,
                                    count).tolist())
    return from_rounds(f"agent:{kind}", starts, new_input, output, delays)


def sharegpt_sessions(sessions: int, rate_sps: float, rng: np.random.Generator) -> Workload:
    table: dict[int, list[tuple[int, int, int]]] = {}
    for session_id, round_index, input_tokens, output_tokens in sharegpt_rounds():
        table.setdefault(session_id, []).append((round_index, input_tokens, output_tokens))
    ids = sorted(table)
    chosen = rng.choice(len(ids), size=sessions, replace=sessions > len(ids))
    starts = np.cumsum(rng.exponential(1 / rate_sps, sessions))
    starts -= starts[0]
    new_input, output, delays = [], [], []
    for index in chosen.tolist():
        rounds = sorted(table[ids[index]])
        new_input.append([r[1] for r in rounds])
        output.append([r[2] for r in rounds])
        delays.append(rng.exponential(THINK_TIME_S, len(rounds)).tolist())
    return from_rounds("sharegpt-sessions", starts, new_input, output, delays)


def mooncake_sessions() -> Workload:
    trace = load_trace("mooncake-sessions")
    assert trace.session_id is not None and trace.round_index is not None
    history = np.zeros(len(trace), dtype=np.int64)
    delay = np.zeros(len(trace))
    previous: dict[int, int] = {}  # session -> row of its latest round so far
    order = np.lexsort((trace.round_index, trace.session_id))
    for i in order.tolist():
        sid = int(trace.session_id[i])
        if sid in previous:
            p = previous[sid]
            context = int(trace.input_tokens[p] + trace.output_tokens[p])
            history[i] = min(context, int(trace.input_tokens[i]) - 1)
            delay[i] = max(0.0, float(trace.arrival_s[i] - trace.arrival_s[p]))
        previous[sid] = i
    return Workload("mooncake-sessions", trace.arrival_s, trace.input_tokens,
                    trace.output_tokens, trace.session_id, trace.round_index, trace.hash_ids,
                    history_tokens=history, tool_delay_s=delay)
