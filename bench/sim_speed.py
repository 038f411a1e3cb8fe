"""Simulator speed: simulated requests per wall-second on the full azure-conv trace.

Setup: 19,366 requests, 8 instances, static-pd (4P4D), Llama-3.1-8B on H800, priced by the
Vidur-calibrated model (`perf.backend: vidur`, pinned: the default source became the measured
vLLM kernels on 2026-11-24, and a faster model serves the same trace with other batches and
events; pinned, this page's history stays comparable run for run). The timed span
starts before pdserve is imported (cold start: imports, trace load, perf-model fit, policy
and cluster build, simulation). The same run with decode fast-advance off (step by step) is
timed side by side, and the two must agree on every request.

    python bench/sim_speed.py            # both modes
    python bench/sim_speed.py --fast-only
"""

from __future__ import annotations

import time

started = time.perf_counter()

import argparse  # noqa: E402
import platform  # noqa: E402

from pdserve.config import Config  # noqa: E402
from pdserve.sim.runner import Experiment  # noqa: E402

CONFIG = Config().with_values({"workload.trace": "azure-conv", "policy.name": "static-pd",
                               "cluster.prefill": 4, "cluster.decode": 4,
                               "perf.model": "llama-3.1-8b", "perf.gpu": "h800",
                               "perf.backend": "vidur"})


def timed_run(max_span_steps: int) -> tuple[float, float, list]:
    """(wall seconds, this process's CPU seconds, the requests) of one warm run: on a busy
    machine the CPU time is the steadier figure."""
    begin, begin_cpu = time.perf_counter(), time.process_time()
    experiment = Experiment.from_config(CONFIG)
    result = experiment.simulate(max_span_steps=max_span_steps)
    return time.perf_counter() - begin, time.process_time() - begin_cpu, result.requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast-only", action="store_true", help="skip the step-by-step run")
    args = parser.parse_args()
    experiment = Experiment.from_config(CONFIG)
    result = experiment.simulate()
    cold_s = time.perf_counter() - started
    count = len(result.requests)
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}")
    print(f"azure-conv, {count} requests, 8 instances static-pd (4P4D), {experiment.perf.name}")
    print(f"fast-advance, cold start included: {cold_s:.2f} s -> {count / cold_s:,.0f} req/s "
          f"({result.events:,} events)")
    warm_s, warm_cpu_s, fast_requests = timed_run(1 << 20)
    print(f"fast-advance, warm (trace + fit + run): {warm_s:.2f} s -> {count / warm_s:,.0f} req/s"
          f" (CPU {warm_cpu_s:.2f} s)")
    if args.fast_only:
        return
    step_s, _, step_requests = timed_run(1)
    agree = all(abs(a.finish_s - b.finish_s) <= 1e-9 * max(1.0, a.finish_s)
                for a, b in zip(fast_requests, step_requests, strict=True))
    print(f"step-by-step, warm: {step_s:.2f} s -> {count / step_s:,.0f} req/s")
    print(f"fast-advance speedup over step-by-step: {step_s / warm_s:.1f}x "
          f"(finish times agree: {agree})")


if __name__ == "__main__":
    main()
