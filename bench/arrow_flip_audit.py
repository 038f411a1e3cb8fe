"""Audit Arrow's flips and TTFT predictions on the paper's traces (issue 9, part 5).

For each workload at a fixed rate scale (about Arrow's goodput), one simulated run:
  - flips by rule (the reason each `SetRole` carries; "?" on code without reasons), and side
    changes undone within --undo-window seconds (a flip and its flip back);
  - SLO attainment, and the TTFT misses split by what Alg. 1 saw at dispatch: predicted
    within the SLO or not, and whether the request's prefill instance changed role while the
    request waited;
and, over every prompt of each trace, the error of Arrow's TTFT predictor (profiled and
fitted as `pdserve.policies.presets.arrow_context` does) against the TTFT of that prompt
alone on an idle instance.

It uses only interfaces older code has too, so the same file run against an earlier commit
(`git worktree add /tmp/old <commit>; PYTHONPATH=/tmp/old python bench/arrow_flip_audit.py`)
gives the before column.

    python bench/arrow_flip_audit.py
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

import pdserve.policies.arrow.prefill_router as prefill_router
from pdserve.config import Config
from pdserve.perf.presets import perf_model
from pdserve.policies.arrow.pools import least_delay
from pdserve.policies.arrow.profiling import TtftPredictor, profile_ttft
from pdserve.sim.runner import Experiment
from pdserve.sim.simulator import SimResult
from pdserve.workload.traces import load_trace

RUNS = {  # workload: trace, TTFT SLO, TPOT SLO, duration, rate scale
    "azure-code": ("azure-code", 3.0, 0.10, None, 33.0),
    "azure-conv": ("azure-conv", 2.0, 0.15, None, 23.5),
    "mooncake-conv": ("mooncake-conv", 30.0, 0.10, 600.0, 3.0),
}


def predictor_errors(trace: str, chunk_tokens: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Relative and absolute (seconds) error of the predictor on every prompt of `trace`."""
    perf = perf_model("llama-3.1-8b", "h800", 1)
    predictor = TtftPredictor.fit(profile_ttft(perf, chunk_tokens))
    lengths = np.array([r.input_tokens for r in load_trace(trace).requests()])
    truth = dict(profile_ttft(perf, chunk_tokens, sorted(set(lengths.tolist()))))
    absolute = np.array([predictor.ttft_s(n) - truth[n] for n in lengths])
    return absolute / np.array([truth[n] for n in lengths]), absolute


class DispatchRecorder:
    """Wraps Alg. 1 to note, per request, whether the chosen instance's predicted TTFT met
    the SLO."""

    def __init__(self) -> None:
        self.predicted_ok: dict[int, bool] = {}
        self._route = prefill_router.ArrowPrefillRouter.route
        recorder = self

        def route(router, request, view, board):  # type: ignore[no-untyped-def]
            chosen = recorder._route(router, request, view, board)
            context = router.context
            delay_s = least_delay([chosen], view, context.predictor)[1]
            recorder.predicted_ok[request.request_id] = (
                delay_s + context.predictor.ttft_s(request.input_tokens) <= context.ttft_slo_s)
            return chosen

        prefill_router.ArrowPrefillRouter.route = route  # type: ignore[method-assign]


def undone_flips(result: SimResult, window_s: float) -> int:
    sides = [role.takes_prefill for role in result.initial_roles]
    last_s: dict[int, float] = {}
    undone = 0
    for change in result.role_changes:
        side = change.role.takes_prefill
        if side != sides[change.instance_id]:
            previous = last_s.get(change.instance_id)
            undone += previous is not None and change.time_s - previous < window_s
            last_s[change.instance_id] = change.time_s
        sides[change.instance_id] = side
    return undone


def audit_run(workload: str, recorder: DispatchRecorder, window_s: float) -> None:
    trace, ttft_slo_s, tpot_slo_s, duration_s, scale = RUNS[workload]
    experiment = Experiment.from_config(Config().with_values({
        "workload.trace": trace, "policy.name": "arrow", "workload.duration_s": duration_s,
        "slo.ttft_s": ttft_slo_s, "slo.tpot_s": tpot_slo_s}))
    recorder.predicted_ok.clear()
    result = experiment.simulate(scale)
    summary = experiment.summarize(result)
    rules = Counter(getattr(c, "reason", "?").split(":")[0] for c in result.role_changes)
    late = [r for r in result.requests if r.first_token_s - r.arrival_s > ttft_slo_s]
    promised = [r for r in late if recorder.predicted_ok.get(r.request_id, False)]
    moved = sum(any(c.instance_id == r.prefill_instance
                    and r.arrival_s <= c.time_s <= r.first_token_s
                    for c in result.role_changes) for r in promised)
    print(f"{workload} at {scale:g}x: attainment {100 * summary.slo_attainment:.1f} %, "
          f"{result.flips} flips, {undone_flips(result, window_s)} undone within "
          f"{window_s:g} s; role changes by rule {dict(rules)}")
    print(f"  TTFT misses {len(late)} of {len(result.requests)}: {len(promised)} predicted "
          f"within the SLO at dispatch, {moved} of those on an instance whose role changed "
          "while they waited")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--undo-window", type=float, default=5.0)
    args = parser.parse_args()
    recorder = DispatchRecorder()
    for workload in args.workloads:
        audit_run(workload, recorder, args.undo_window)
    for workload in args.workloads:
        relative, absolute = predictor_errors(RUNS[workload][0])
        relative, absolute_ms = 100 * relative, 1e3 * absolute
        print(f"TTFT predictor on {len(relative)} {workload} prompts: median "
              f"{np.median(relative):+.1f} %, min {relative.min():+.1f} %, max "
              f"{relative.max():+.1f} %, over by > 5 % {np.mean(relative > 5):.1%}, under by "
              f"> 5 % {np.mean(relative < -5):.1%}; absolute {absolute_ms.min():+.0f} ms to "
              f"{absolute_ms.max():+.0f} ms")


if __name__ == "__main__":
    main()
