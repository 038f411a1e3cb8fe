"""Arrow's scalability (Figure 9) in the simulator: goodput at 4, 8, 16 and 32 instances.

azure-conv (TTFT 2 s, TPOT 0.15 s), Llama-3.1-8B on H800, arrow vs min-load, both starting
from an even split (N/2 prefill, N/2 decode). The goodput search scales the rate; the table
also shows goodput per instance, which stays flat when scaling is linear, and attainment at
a rate proportional to the instance count (the figure's x axis: `--per-instance-rps`).

    python bench/arrow_scalability.py --out docs/results/arrow
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pdserve.config import Config  # noqa: E402
from pdserve.sim.runner import Experiment  # noqa: E402

SIZES = (4, 8, 16, 32)


def run_job(policy: str, instances: int, per_instance_rps: float,
            tolerance: float) -> tuple[str, int, float, float]:
    config = Config().with_values({
        "workload.trace": "azure-conv", "policy.name": policy, "cluster.prefill": instances // 2,
        "cluster.decode": instances - instances // 2, "slo.ttft_s": 2.0, "slo.tpot_s": 0.15,
        "goodput.tolerance": tolerance})
    experiment = Experiment.from_config(config)
    goodput = experiment.goodput()
    scale = per_instance_rps * instances / experiment.workload.mean_rate_rps
    attainment = experiment.summarize(experiment.simulate(scale)).slo_attainment
    return policy, instances, goodput.rate_rps, attainment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/arrow"))
    parser.add_argument("--per-instance-rps", type=float, default=12.0)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(policy, n) for n in SIZES for policy in ("arrow", "min-load")]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_job, [j[0] for j in jobs], [j[1] for j in jobs],
                             [args.per_instance_rps] * len(jobs),
                             [args.tolerance] * len(jobs)))
    goodput = {(policy, n): rps for policy, n, rps, _ in rows}
    attained = {(policy, n): a for policy, n, _, a in rows}
    print(f"{'instances':>9}{'arrow req/s':>13}{'min-load req/s':>16}{'ratio':>7}"
          f"{'arrow/inst':>11}{'min-load/inst':>14}"
          f"{'attain@' + format(args.per_instance_rps, 'g') + 'rps/inst a|m':>26}")
    for n in SIZES:
        a, m = goodput["arrow", n], goodput["min-load", n]
        print(f"{n:>9}{a:>13.2f}{m:>16.2f}{a / m:>7.2f}{a / n:>11.2f}{m / n:>14.2f}"
              f"{attained['arrow', n]:>17.1%} | {attained['min-load', n]:.1%}")
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in ("arrow", "min-load"):
        ax.plot(SIZES, [goodput[policy, n] for n in SIZES], marker="o", label=policy)
    ax.set_xticks(SIZES, [str(n) for n in SIZES])
    ax.set_xlim(0, max(SIZES) + 2)
    ax.set_ylim(0, None)
    ax.set_xlabel("instances (one H800 each)")
    ax.set_ylabel("goodput (req/s at >= 90% attainment)")
    ax.set_title("azure-conv, Llama-3.1-8B: scalability")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "scalability_azure-conv.png", dpi=120)
    (args.out / "scalability.json").write_text(json.dumps(
        [{"policy": p, "instances": n, "goodput_rps": rps, "attainment_at_rate": att}
         for p, n, rps, att in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
