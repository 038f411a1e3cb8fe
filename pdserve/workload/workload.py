"""A workload: arrival times and lengths, with rate scaling and time windows.

Rate scaling divides timestamps by the scale (scale 2 = twice the request rate), as the
papers replay traces. `window` clips to [start, start + duration) and rebases time to 0.
`repeated` replays a trace end to end several times, so a run can outlast the trace (the
verdict harness's stationarity check doubles runs past a short trace's length).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pdserve.types import Request

# the most requests a workload may hold: each simulated request costs ~850 bytes (1,000,000
# synthetic ones on 8 instances: 843 MB peak, 47 s); beyond this a run exhausts a machine's
# memory before it says anything
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True)
class Workload:
    name: str
    arrival_s: np.ndarray  # float64, non-decreasing
    input_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    session_id: np.ndarray | None = None
    round_index: np.ndarray | None = None
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    # multi-round sessions (`pdserve.workload.sessions`): a round's prompt is `history_tokens`
    # of its session's earlier rounds plus new tokens; it is sent `tool_delay_s` after the
    # previous round finished (the simulator chains rounds; arrival_s counts for first rounds)
    history_tokens: np.ndarray | None = None
    tool_delay_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for column in ("input_tokens", "output_tokens", "session_id", "round_index", "hash_ids",
                       "history_tokens", "tool_delay_s"):
            values = getattr(self, column)
            if values is not None and len(values) != n:
                raise ValueError(f"workload {self.name!r}: {column} has {len(values)} rows, "
                                 f"arrival_s has {n}")
        if n and not np.all(np.isfinite(self.arrival_s)):
            raise ValueError(f"workload {self.name!r}: arrival times must be finite numbers")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"workload {self.name!r}: arrival times must not decrease")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError(f"workload {self.name!r}: every request needs at least one input "
                             f"and one output token")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate_rps(self) -> float:
        return (len(self) - 1) / self.span_s if self.span_s > 0 else 0.0

    def _select(self, mask: np.ndarray | slice, name: str) -> Workload:
        hashes = self.hash_ids
        if hashes is not None:
            indices = np.arange(len(self))[mask]
            hashes = tuple(hashes[i] for i in indices)
        return replace(self, name=name, arrival_s=self.arrival_s[mask],
                       input_tokens=self.input_tokens[mask],
                       output_tokens=self.output_tokens[mask],
                       session_id=None if self.session_id is None else self.session_id[mask],
                       round_index=None if self.round_index is None else self.round_index[mask],
                       hash_ids=hashes,
                       history_tokens=None if self.history_tokens is None
                       else self.history_tokens[mask],
                       tool_delay_s=None if self.tool_delay_s is None
                       else self.tool_delay_s[mask])

    def scaled(self, rate_scale: float) -> Workload:
        if not rate_scale > 0:
            raise ValueError(f"rate_scale must be positive, got {rate_scale}")
        if rate_scale == 1:
            return self
        return replace(self, name=f"{self.name}x{rate_scale:g}",
                       arrival_s=self.arrival_s / rate_scale)

    def ramped(self, start_scale: float, end_scale: float, duration_s: float) -> Workload:
        """The first `duration_s` seconds of a replay whose rate scale rises (or falls)
        linearly from `start_scale` to `end_scale`, time rebased to 0: a calibration run
        that sweeps the load (`pdserve bench --ramp-to`). Trace time T and replay time t
        relate by T = r0 t + (r1 - r0) t^2 / (2 D), so the replay takes in (r0 + r1) D / 2
        seconds of the trace; each arrival's t is that quadratic's root, in the form
        2T / (r0 + sqrt(r0^2 + 2 (r1 - r0) T / D)) that holds for r1 = r0 too."""
        if not (start_scale > 0 and end_scale > 0 and duration_s > 0):
            raise ValueError(f"a ramp needs positive rate scales and duration, got "
                             f"{start_scale} -> {end_scale} over {duration_s} s")
        span = self.window(0.0, (start_scale + end_scale) / 2 * duration_s)
        trace_s = span.arrival_s
        root = np.sqrt(start_scale ** 2 + 2 * (end_scale - start_scale) * trace_s / duration_s)
        return replace(span, name=f"{self.name}ramp{start_scale:g}-{end_scale:g}",
                       arrival_s=2 * trace_s / (start_scale + root))

    def repeated(self, copies: int) -> Workload:
        """The workload replayed `copies` times end to end: copy k arrives k x (span + one
        mean inter-arrival gap) later, so the mean rate is kept across the seams. Copies
        are independent requests: session ids and prefix-block hashes are offset per copy
        (a copy shares no session and hits no prefix cache of an earlier one)."""
        if not isinstance(copies, int) or copies < 1:
            raise ValueError(f"copies must be a positive integer, got {copies!r}")
        if copies == 1 or len(self) == 0:
            return self
        n = len(self)
        if n * copies > MAX_REQUESTS:
            raise ValueError(f"{copies} copies of {n} requests exceed the {MAX_REQUESTS:,} "
                             f"requests a workload may hold")
        period_s = self.span_s + (self.span_s / (n - 1) if n > 1 else 1.0)
        shifts = np.repeat(np.arange(copies, dtype=np.float64) * period_s, n)
        sessions = self.session_id
        if sessions is not None:
            stride = max(int(sessions.max()) + 1, 1)  # a negative id means "no session"
            tiled_ids = np.tile(sessions, copies)
            sessions = np.where(tiled_ids < 0, tiled_ids, tiled_ids + np.repeat(
                np.arange(copies, dtype=sessions.dtype) * stride, n))
        hashes = self.hash_ids
        if hashes is not None:
            stride = 1 + max((max(h) for h in hashes if h), default=0)
            hashes = tuple(tuple(h + k * stride for h in row)
                           for k in range(copies) for row in hashes)

        def tiled(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else np.tile(values, copies)

        return replace(self, name=f"{self.name}*{copies}",
                       arrival_s=np.tile(self.arrival_s, copies) + shifts,
                       input_tokens=np.tile(self.input_tokens, copies),
                       output_tokens=np.tile(self.output_tokens, copies),
                       session_id=sessions, round_index=tiled(self.round_index),
                       hash_ids=hashes, history_tokens=tiled(self.history_tokens),
                       tool_delay_s=tiled(self.tool_delay_s))

    def window(self, start_s: float = 0.0, duration_s: float | None = None) -> Workload:
        """Requests arriving in [start_s, start_s + duration_s), with time rebased to 0."""
        if start_s < 0 or (duration_s is not None and duration_s <= 0):
            raise ValueError(f"bad window start={start_s} duration={duration_s}")
        origin = self.arrival_s[0] + start_s if len(self) else 0.0
        mask = self.arrival_s >= origin
        if duration_s is not None:
            mask &= self.arrival_s < origin + duration_s
        clipped = self._select(mask, self.name)
        return replace(clipped, arrival_s=clipped.arrival_s - origin)

    def clipped(self, max_input_tokens: int, max_output_tokens: int) -> Workload:
        """Lengths capped (for a model with a short context or a slow machine)."""
        if max_input_tokens < 1 or max_output_tokens < 1:
            raise ValueError("length caps must be at least 1")
        inputs = np.minimum(self.input_tokens, max_input_tokens)
        history = self.history_tokens  # a round's history stays inside its (capped) prompt
        return replace(self, input_tokens=inputs,
                       output_tokens=np.minimum(self.output_tokens, max_output_tokens),
                       history_tokens=None if history is None else np.minimum(history,
                                                                              inputs - 1))

    def with_history_from_prompts(self) -> Workload:
        """A trace's rows with session ids and round numbers as multi-round sessions: a
        round's history is the previous round's prompt plus output, capped below its own
        prompt (a trace gives whole prompts, not what they share), and it is sent the
        trace's gap between the two rounds' arrivals after the previous round finished (the
        simulator chains rounds, `pdserve.sim.sessions`; only first rounds keep their
        arrival times). Rounds run in order of their number, a number given twice in the
        trace's order. Without session ids, the trace unchanged."""
        if self.session_id is None or self.round_index is None:
            return self
        history = np.zeros(len(self), dtype=np.int64)
        delay = np.zeros(len(self))
        previous: dict[int, int] = {}  # session -> row of its latest round so far
        for i in np.lexsort((self.round_index, self.session_id)).tolist():
            sid = int(self.session_id[i])
            if sid < 0:  # not in a session
                continue
            if sid in previous:
                p = previous[sid]
                context = int(self.input_tokens[p] + self.output_tokens[p])
                history[i] = min(context, int(self.input_tokens[i]) - 1)
                delay[i] = max(0.0, float(self.arrival_s[i] - self.arrival_s[p]))
            previous[sid] = i
        return replace(self, history_tokens=history, tool_delay_s=delay)

    def head(self, count: int) -> Workload:
        return self._select(slice(0, count), self.name)

    def requests(self) -> list[Request]:
        sessions = self.session_id
        rounds = self.round_index
        hashes = self.hash_ids
        columns = enumerate(zip(self.arrival_s.tolist(), self.input_tokens.tolist(),
                                self.output_tokens.tolist(), strict=True))
        if sessions is None and rounds is None and hashes is None:  # a plain trace: the
            # fields' defaults (one simulation builds 10^4-10^5 of these)
            return [Request(i, float(a), int(n_in), int(n_out))
                    for i, (a, n_in, n_out) in columns]
        requests = [Request(i, float(a), int(n_in), int(n_out),
                            session_id=-1 if sessions is None else int(sessions[i]),
                            round_index=0 if rounds is None else int(rounds[i]),
                            hash_ids=() if hashes is None else hashes[i])
                    for i, (a, n_in, n_out) in columns]
        if self.history_tokens is not None and sessions is not None:
            self._mark_rounds(requests)
        return requests

    def _mark_rounds(self, requests: list[Request]) -> None:
        """Session fields: history, tool delay, and whether the KV is kept for a later
        round (every round but the last of its session)."""
        assert self.history_tokens is not None
        delays = self.tool_delay_s
        last_round: dict[int, int] = {}
        for request, history in zip(requests, self.history_tokens.tolist(), strict=True):
            request.history_tokens = int(history)
            if delays is not None:
                request.tool_delay_s = float(delays[request.request_id])
            last_round[request.session_id] = max(last_round.get(request.session_id, -1),
                                                 request.round_index)
        for request in requests:
            request.retain_kv = request.round_index < last_round[request.session_id]
