"""Why tuned AMPD loses to Dynamo on the mean-prompt reading (docs/results/verdicts.md).

Both contenders' tuned deployment (3 prefill + 1 decode instance, TP 2, Qwen3-32B on H20,
`bench/verdicts.py`'s `ampd_prompt_base`: ToolBench-like sessions with Table 1 read as the
mean prompt per round, TTFT 0.35 s, TPOT 40 ms), one workload draw of `--sessions` sessions
replayed at each rate in `--rates` (rounds per second), ampd against dynamo: SLO attainment,
TTFT and TPOT P90, and how many rounds AMPD's Alg. 1 prefilled locally on the one decode
instance (the rest go to a prefill instance; dynamo prefills every round remotely).

    PYTHONPATH=$PWD python bench/ampd_local_prefills.py      # ~4 s
"""

from __future__ import annotations

import argparse

from verdicts import ampd_prompt_base

from pdserve.sim.runner import Experiment

DEPLOYMENT = {"perf.tp": 2, "cluster.prefill": 3, "cluster.decode": 1,
              "instance.chunk_size_tokens": 2048}
CONTENDERS = {"ampd": {"policy.name": "ampd", "policy.ampd.window": 1},
              "dynamo": {"policy.name": "dynamo"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1500, help="sessions drawn [1500]")
    parser.add_argument("--rates", default="30,40,47",
                        help="rounds per second, comma-separated [30,40,47]")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    base = ampd_prompt_base().with_values({**DEPLOYMENT,
                                           "workload.synthetic_requests": args.sessions})
    print(f"{'policy':8s} {'rate':>6s} {'attain':>7s} {'TTFT p90 s':>11s} "
          f"{'TPOT p90 ms':>12s} {'local prefills':>15s}")
    for name, values in CONTENDERS.items():
        for rate in rates:
            experiment = Experiment.from_config(base.with_values(values))
            result = experiment.simulate(rate / experiment.workload.mean_rate_rps)
            summary = experiment.summarize(result)
            local = sum(1 for r in result.requests
                        if r.prefill_instance >= 0 and r.prefill_instance == r.decode_instance)
            print(f"{name:8s} {rate:6.1f} {summary.slo_attainment:7.3f} "
                  f"{summary.ttft_s.p90:11.3f} {summary.tpot_s.p90 * 1e3:12.1f} "
                  f"{local:7d} / {len(result.requests)}")


if __name__ == "__main__":
    main()
