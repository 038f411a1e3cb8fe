"""A run's SLO attainment, decided before the run ends: the goodput search's early stop.

A goodput search asks one question of each run: is the SLO attainment at least the target
(`metrics/goodput.py`)? `AttainmentWatch` scores each request as soon as its outcome is
certain, and says when the answer can no longer change:

  finished   both targets checked exactly as `summary.summarize` will check them, with the
             control latency the run will add afterwards (`types.control_latency_shifts`:
             drawn in the requests' order, so known before the run)
  rejected   a miss (also the later rounds of a rejected session, which never arrive)
  late       still without its first token once its TTFT target has passed: a miss however
             it ends (the driver asks at its monitor ticks, `tick`)

With `met` requests met and `missed` missed out of N, the attainment will be at least
met / N and at most (N - missed) / N, so the verdict is decided once met / N >= target
(pass) or (N - missed) / N < target (fail), computed as the summary computes its share.
A run stopped then leaves its unfinished requests unfinished; its summary counts them as
misses and so gives the same verdict: the search takes the same path and ends at the same
rate, while the stopped point's other figures (its latency percentiles, its attainment,
which is then a bound) describe the requests done by the stop. A watch built with
`decides_pass=False` decides only a failing run: a passing run then runs to its end, so its
figures are the full run's (the planner reports the latencies at the rate found from them,
`planning/fidelity.py`, instead of running that point again).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from pdserve.metrics.summary import output_count, slo_latencies_s
from pdserve.types import SLO, Request


class AttainmentWatch:
    """Scores the requests of one run against `slo`; `decided` turns True once the run's
    attainment is known to be at or above `target`, or below it (`passes` says which).
    `shifts`: each request's control latency, in the order of `requests` (all 0.0 without
    one). `decides_pass`: False leaves a passing run undecided (it runs to its end)."""

    def __init__(self, requests: Sequence[Request], slo: SLO, target: float,
                 shifts: Sequence[float], decides_pass: bool = True) -> None:
        if len(shifts) != len(requests):
            raise ValueError(f"{len(shifts)} control-latency shifts for {len(requests)} "
                             f"requests")
        self.slo = slo
        self.total = len(requests)
        self._shift = {r.request_id: s for r, s in zip(requests, shifts, strict=True)}
        self.needed = _needed(self.total, target)  # met requests for the target
        self.decides_pass = decides_pass
        self.met = 0
        self.missed = 0
        self._counted: set[int] = set()  # request ids already scored
        self._late: list[tuple[float, int, Request]] = []  # (about when its TTFT passes)
        self.decided = False
        self.passes = False

    def arrived(self, request: Request) -> None:
        """A request arrived: watch its first token's deadline."""
        due_s = request.arrival_s + self.slo.ttft_s - self._shift[request.request_id]
        heapq.heappush(self._late, (due_s, request.request_id, request))

    def finished(self, request: Request) -> None:
        rid = request.request_id
        if rid in self._counted:
            return  # missed its first token's deadline already
        self._counted.add(rid)
        shift_s = self._shift[rid]
        if self.slo.counts_decode_queue:  # every token time moves by the shift: TPOT stays
            ttft_s, tpot_s = slo_latencies_s(request, self.slo, shift_s)
        else:  # the arithmetic `summarize` does on the shifted times, bit for bit
            first_s = request.first_token_s + shift_s  # as `add_control_latency` shifts it
            n = output_count(request)
            ttft_s = first_s - request.arrival_s
            tpot_s = (request.finish_s + shift_s - first_s) / (n - 1) if n > 1 else 0.0
        if ttft_s <= self.slo.ttft_s and tpot_s <= self.slo.tpot_s:
            self.met += 1
        else:
            self.missed += 1
        self._decide()

    def rejected(self, request: Request, later_rounds: int = 0) -> None:
        """A rejected request (a miss), and `later_rounds` of its session that will never
        arrive."""
        if request.request_id not in self._counted:
            self._counted.add(request.request_id)
            self.missed += 1
        self.missed += later_rounds
        self._decide()

    def tick(self, now_s: float) -> None:
        """The run's clock is at `now_s`: requests still without a first token whose TTFT
        target has passed are misses (a first token, at `now_s` or later, can only be
        later still)."""
        late, ttft_slo_s = self._late, self.slo.ttft_s
        decode_queue = self.slo.counts_decode_queue  # the first token is the decode side's
        while late and late[0][0] < now_s:
            due_s, rid, request = late[0]
            first_s = request.decode_first_token_s if decode_queue else request.first_token_s
            if rid in self._counted or not math.isnan(first_s):
                heapq.heappop(late)  # scored, or its first token came in time to be judged
                continue
            if now_s + self._shift[rid] - request.arrival_s <= ttft_slo_s:
                break  # the estimate rounded early: exactly decided at a later tick
            heapq.heappop(late)
            self._counted.add(rid)
            self.missed += 1
        self._decide()

    def _decide(self) -> None:
        if self.decided:
            return
        if self.met >= self.needed:
            self.passes = True
            self.decided = self.decides_pass
        elif self.total - self.missed < self.needed:
            self.decided = True


def _needed(total: int, target: float) -> int:
    """The fewest met requests whose share (met / total, as the summary divides) reaches
    `target`; total + 1 when none does (no requests)."""
    if total == 0:
        return 1
    needed = min(total, math.ceil(target * total))
    while needed > 0 and (needed - 1) / total >= target:
        needed -= 1
    while needed <= total and not needed / total >= target:
        needed += 1
    return needed
