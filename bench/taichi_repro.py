"""Reproduce TaiChi's end-to-end goodput (Figs. 15-17, Table 3) and its breakdown (Fig. 18)
in the simulator, on A100 models priced by `--backend` (default: the presets' default, the
newest vLLM measured on the A100; `--backend vidur` for the Vidur-calibrated model, the
convention of TaiChi's own simulations); the header names the source of each.

Setups (TaiChi sec. 4.1): Qwen2.5-14B on 4 x A100 (TP 1, 4 instances) and Qwen2.5-32B on
4 x 2 A100 (TP 2, 4 instances; TPOT SLOs +10 ms). Workloads, Poisson arrivals:
  chat          ShareGPT (`table:sharegpt`: prompts with the conversation so far, <= 2048
                tokens; cl100k counts)      SLO1 (3 s, 110 ms)  SLO2 (4 s, 70 ms)
  summarization arXiv (`table:arxiv-lengths`, Vidur's table, inputs <= ~4K)
                                            SLO1 (4 s, 70 ms)   SLO2 (6 s, 50 ms)
  summ-long     `table:arxiv-long`, the long-input stand-in up to 16K (14B only)
For each setup one slider search (`pdserve.planning.taichi`) gives every point's goodput
(highest rate with >= 90 % attainment): the best aggregation point is "best-tuned
aggregation" (chunk 256..2048), the best S_D = 0 point "best-ratio disaggregation" (1:3, 2:2,
3:1), the paper's sliders (chat SLO1 2 x 1024 + 2 x 512; chat SLO2 2 x 1024 + 2 x 128;
summarization SLO1 2 x 1024 + 2 x 256, SLO2 2 x 1024 + 2 x 128) "taichi (paper)", and the
best point overall "taichi (searched)". At taichi's goodput rate the script reports each
system's P90 TTFT and TPOT over the SLO (Fig. 17).
Breakdown (Fig. 18): 14B, summarization SLO1, at the rate where taichi (paper sliders)
has its goodput: aggregation at chunk 256 -> + differentiated instances (2 P-heavy at 1024,
flowing decode and length-aware prefill off) -> + flowing decode -> + length-aware prefill.

Runtime: each simulation replays 1200 chat, 600 arXiv or 400 long-arXiv requests (40 s,
90 s and 200 s of arrivals near the goodput: shorter than the paper's runs, to keep the
script near a quarter of an hour on 2 shared cores; `--requests` overrides); goodput is
searched to `--tolerance` (default 4 %). Short runs favour every system (queues have less
time to build): goodputs fall by ~10-30 % from 600 to 1500 chat requests.

    python bench/taichi_repro.py --out docs/results/taichi/taichi_repro.json
    python bench/taichi_repro.py --defaults-check    # taichi's defaults vs colocated
    python bench/taichi_repro.py --quick             # whether it runs: 14B chat and arXiv
                                                     # SLO1, 11 settings, 60 requests
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from pdserve.config import Config
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.planning.taichi import PlanResult, SliderPoint, search, slider_grid
from pdserve.sim.runner import Experiment

WORKLOADS = {  # lengths, SLO1, SLO2, a starting rate (req/s) near the goodput, requests
    "chat": ("table:sharegpt", (3.0, 0.110), (4.0, 0.070), 30.0, 1200),
    "summarization": ("table:arxiv-lengths", (4.0, 0.070), (6.0, 0.050), 4.0, 600),
    "summ-long": ("table:arxiv-long", (4.0, 0.070), (6.0, 0.050), 1.0, 400),
}
DEFAULT_POINT = SliderPoint(1, 3, 2048, 512)  # taichi's default sliders (R_PD 1:3)
MODELS = {"qwen2.5-14b": (1, 0.0), "qwen2.5-32b": (2, 0.010)}  # tp, TPOT SLO relaxation
PAPER_D_CHUNK = {("chat", 1): 512, ("chat", 2): 128, ("summarization", 1): 256,
                 ("summarization", 2): 128, ("summ-long", 1): 256, ("summ-long", 2): 128}
CHUNKS, D_CHUNKS = (256, 512, 1024, 2048), (0, 128, 256, 512)
QUICK_GRID = ((256, 1024), (0, 256, 512))  # still holds the paper's SLO1 sliders


@dataclass
class SetupResult:
    model: str
    workload: str
    slo: int
    ttft_slo_s: float
    tpot_slo_s: float
    best_aggregation: PlanResult
    best_disaggregation: PlanResult
    taichi_paper: PlanResult | None
    taichi_searched: PlanResult
    taichi_default: PlanResult | None
    p90_at_taichi_rate: dict[str, tuple[float, float]]  # system -> (TTFT/SLO, TPOT/SLO)
    settings: int


def base_config(backend: str, model: str, workload: str, slo: int, requests: int,
                tolerance: float) -> Config:
    lengths, slo1, slo2, rate, default_requests = WORKLOADS[workload]
    requests = requests or default_requests
    tp, relax = MODELS[model]
    ttft, tpot = slo1 if slo == 1 else slo2
    return Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": lengths,
        "workload.synthetic_requests": requests, "workload.synthetic_rate_rps": rate, "seed": 1,
        "perf.model": model, "perf.gpu": "a100", "perf.tp": tp, "perf.backend": backend,
        "slo.ttft_s": ttft,
        "slo.tpot_s": tpot + relax, "monitor.interval_s": 0.1, "goodput.tolerance": tolerance,
        "cluster.prefill": 2, "cluster.decode": 2})


def p90_over_slo(experiment: Experiment, config: Config, rate_rps: float) -> tuple[float,
                                                                                   float]:
    trial = Experiment(config, experiment.workload, experiment.perf)
    summary = trial.summarize(trial.simulate(rate_rps / experiment.workload.mean_rate_rps))
    return summary.ttft_s.p90 / config.slo.ttft_s, summary.tpot_s.p90 / config.slo.tpot_s


def run_setup(backend: str, model: str, workload: str, slo: int, requests: int,
              tolerance: float, processes: int, time_limit_s: float,
              grid: tuple[Sequence[int], Sequence[int]] = (CHUNKS, D_CHUNKS)) -> SetupResult:
    """`grid`: the S_P and S_D values searched (--quick: fewer)."""
    base = base_config(backend, model, workload, slo, requests, tolerance)
    points = slider_grid(4, *grid)
    results = search(base, points, processes, time_limit_s)
    by_point = {r.point: r for r in results}
    aggregation = max((r for r in results if r.point.mode == "aggregation"),
                      key=lambda r: r.goodput_rps)
    disaggregation = max((r for r in results if r.point.mode == "disaggregation"),
                         key=lambda r: r.goodput_rps)
    paper = by_point.get(SliderPoint(2, 2, 1024, PAPER_D_CHUNK[(workload, slo)]))
    searched = results[0]
    experiment = Experiment.from_config(base)
    rate = (paper or searched).goodput_rps or searched.goodput_rps
    p90 = {}
    if rate > 0:
        for name, result in (("aggregation", aggregation), ("disaggregation", disaggregation),
                             ("taichi (paper)", paper), ("taichi (searched)", searched)):
            if result is not None:
                p90[name] = p90_over_slo(experiment, result.point.config(base), rate)
    return SetupResult(model, workload, slo, base.slo.ttft_s, base.slo.tpot_s, aggregation,
                       disaggregation, paper, searched, by_point.get(DEFAULT_POINT), p90,
                       len(results))


def breakdown(backend: str, requests: int, rate_rps: float
              ) -> list[tuple[str, float, float, float]]:
    """Fig. 18: (step, attainment, P90 TTFT / SLO, P90 TPOT / SLO) at one rate."""
    base = base_config(backend, "qwen2.5-14b", "summarization", 1, requests, 0.04)
    experiment = Experiment.from_config(base)
    steps = [
        ("aggregation, chunk 256 (CP256)", SliderPoint(0, 4, 256, 256), {}),
        ("+ differentiated instances (2 x 1024 + 2 x 256)", SliderPoint(2, 2, 1024, 256),
         {"policy.taichi.flowing_decode": False, "policy.taichi.length_aware_prefill": False}),
        ("+ flowing decode", SliderPoint(2, 2, 1024, 256),
         {"policy.taichi.length_aware_prefill": False}),
        ("+ length-aware prefill (taichi)", SliderPoint(2, 2, 1024, 256), {}),
    ]
    rows = []
    for label, point, switches in steps:
        config = point.config(base).with_values(switches)
        trial = Experiment(config, experiment.workload, experiment.perf)
        summary = trial.summarize(trial.simulate(rate_rps / experiment.workload.mean_rate_rps))
        rows.append((label, summary.slo_attainment, summary.ttft_s.p90 / config.slo.ttft_s,
                     summary.tpot_s.p90 / config.slo.tpot_s))
    return rows


def _defaults_job(job: tuple[str, int, str, dict]) -> tuple[int, str, float]:
    backend, seed, label, changes = job
    base = base_config(backend, "qwen2.5-14b", "chat", 1, 1500, 0.03).with_values({
        "seed": seed, "workload.synthetic_rate_rps": 40.0})
    return seed, label, Experiment.from_config(base.with_values(changes)).goodput().rate_rps


def defaults_check(backend: str, processes: int) -> list[tuple[int, str, float]]:
    """Out of the box on chat SLO1 (14B, 1500 requests, two seeds): taichi's default
    sliders next to colocated at its default chunk and at 512 (its best on the additive
    mixed-step pricing before 2026-11-24; now about 9 % below 2048), and the paper's."""
    systems = [
        ("colocated, default chunk 2048", {"policy.name": "colocated", "cluster.instances": 4,
                                           "instance.chunk_size_tokens": 2048}),
        ("colocated, chunk 512", {"policy.name": "colocated", "cluster.instances": 4,
                                  "instance.chunk_size_tokens": 512}),
        ("taichi defaults, R_PD 1:3", {"policy.name": "taichi", "cluster.prefill": 1,
                                       "cluster.decode": 3, "policy.taichi.chunk_p_tokens": 2048,
                                       "policy.taichi.chunk_d_tokens": 512}),
        ("taichi paper, 2 x 1024 + 2 x 512", {"policy.name": "taichi", "cluster.prefill": 2,
                                              "cluster.decode": 2,
                                              "policy.taichi.chunk_p_tokens": 1024,
                                              "policy.taichi.chunk_d_tokens": 512}),
    ]
    jobs = [(backend, seed, label, changes) for seed in (1, 2) for label, changes in systems]
    with ProcessPoolExecutor(processes) as pool:
        return list(pool.map(_defaults_job, jobs))


def _gain(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%" if b > 0 else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=0,
                        help="requests per simulation [chat 1200, arXiv 600, long arXiv 400]")
    parser.add_argument("--tolerance", type=float, default=0.04)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=240.0, help="per setup, seconds")
    parser.add_argument("--only", default="", help="comma-separated model:workload:slo")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--defaults-check", action="store_true",
                        help="only compare taichi's default sliders with colocated (chat SLO1)")
    parser.add_argument("--quick", action="store_true", help="whether the script runs, not "
                        "its figures: 14B chat and summarization SLO1 (and the breakdown), 11 "
                        "slider settings, 60 requests, goodput to 20 %%")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    args = parser.parse_args()
    priced_by = {model: perf_model(model, "a100", tp, args.backend).name
                 for model, (tp, _) in MODELS.items()}
    for model, name in priced_by.items():
        print(f"{model}: priced by {name}", flush=True)
    if args.defaults_check:
        for seed, label, goodput in defaults_check(args.backend, args.processes):
            print(f"seed {seed}  {label:<34} goodput {goodput:6.2f} req/s", flush=True)
        return
    setups = [(m, w, s) for m in MODELS for w in WORKLOADS for s in (1, 2)
              if not (w == "summ-long" and m != "qwen2.5-14b")]
    grid: tuple[Sequence[int], Sequence[int]] = (CHUNKS, D_CHUNKS)
    if args.quick:
        args.only = args.only or "qwen2.5-14b:chat:1,qwen2.5-14b:summarization:1"
        args.requests, args.tolerance, grid = args.requests or 60, 0.2, QUICK_GRID
    if args.only:
        wanted = {tuple(x.split(":")) for x in args.only.split(",")}
        setups = [x for x in setups if (x[0], x[1], str(x[2])) in wanted]
    started = time.monotonic()
    results = []
    for model, workload, slo in setups:
        r = run_setup(args.backend, model, workload, slo, args.requests, args.tolerance,
                      args.processes, args.time_limit, grid)
        results.append(r)
        paper = r.taichi_paper
        best_taichi = max(r.taichi_searched.goodput_rps, paper.goodput_rps if paper else 0)
        agg, dis = r.best_aggregation, r.best_disaggregation
        print(f"{model} {workload} SLO{slo} (TTFT {r.ttft_slo_s:g}s, TPOT "
              f"{r.tpot_slo_s * 1e3:.0f}ms), {r.settings} settings; goodput req/s:")
        print(f"  best aggregation     {agg.goodput_rps:7.2f}  {agg.point.label}")
        print(f"  best disaggregation  {dis.goodput_rps:7.2f}  {dis.point.label}")
        if paper is not None:
            print(f"  taichi (paper)       {paper.goodput_rps:7.2f}  {paper.point.label}")
        print(f"  taichi (searched)    {r.taichi_searched.goodput_rps:7.2f}  "
              f"{r.taichi_searched.point.label}")
        if r.taichi_default is not None:
            print(f"  taichi (defaults)    {r.taichi_default.goodput_rps:7.2f}  "
                  f"{r.taichi_default.point.label}")
        if paper is not None:
            print(f"  taichi (paper) vs aggregation {_gain(paper.goodput_rps, agg.goodput_rps)}"
                  f", vs disaggregation {_gain(paper.goodput_rps, dis.goodput_rps)}")
        print(f"  taichi (best) vs aggregation {_gain(best_taichi, agg.goodput_rps)}, vs "
              f"disaggregation {_gain(best_taichi, dis.goodput_rps)}", flush=True)
        for name, (ttft, tpot) in r.p90_at_taichi_rate.items():
            print(f"    P90 at taichi's goodput rate: {name:<20} TTFT/SLO {ttft:5.2f}  "
                  f"TPOT/SLO {tpot:5.2f}")
    rows: list[tuple[str, float, float, float]] = []
    anchor = next((r for r in results if (r.model, r.workload, r.slo)
                   == ("qwen2.5-14b", "summarization", 1)), None)
    if anchor is not None and anchor.taichi_paper is not None:
        rate = anchor.taichi_paper.goodput_rps
        print(f"Fig. 18 breakdown: 14B, summarization SLO1, at {rate:.2f} req/s")
        rows = breakdown(args.backend, args.requests, rate)
        for label, attainment, ttft, tpot in rows:
            print(f"  {label:<50} attainment {attainment:6.1%}  P90 TTFT/SLO {ttft:5.2f}  "
                  f"P90 TPOT/SLO {tpot:5.2f}")
    print(f"total {time.monotonic() - started:.0f}s wall")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"perf_models": priced_by, "setups": [asdict(r) for r in results],
                       "breakdown": rows,
                       "requests": args.requests, "tolerance": args.tolerance}, handle,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
