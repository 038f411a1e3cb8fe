"""FlowKV's experiments in the simulator (FlowKV sec. 4), plus pdserve's own prefix-routing one.

  (a) throughput, synthetic 1K / 5K / 10K input, 256 output, 100 requests, rising Poisson
      rates: Llama-3.1-8B on 2 x A100 (one node, NVLink) and Llama-3.1-70B at TP 4 on two
      instances (8 x A100, one node): flowkv (1P1D) vs colocated (2 mixed; decode-first
      chunked prefill, pdserve's default, and prefill-first, vLLM V0's default scheduler)
      vs 1P1D static-pd with per-block-per-layer transfers (and aligned ones, to split the
      effects);
      the figure is the highest throughput over the rates (paper: flowkv +25 % over
      colocated, +35-95 % over other 1P1D systems)
  (b) heterogeneous 4P4D, Llama-3.1-8B, one L20 server (prefill) and one H20 server (decode)
      joined by a 25 Gb/s TCP link (the paper's ENI), vs the reverse, vs 8 colocated mixed
      instances; arXiv-summarization lengths (LongBench's gov_report is not shipped; the
      arXiv table is the long-input summarization stand-in): mean E2E and TPOT per rate
      (paper, gov_report: P-L20/D-H20 34.7 % faster E2E than the reverse, 48.9 % than
      colocated)
  (c) KV transfer time per request, 1P1D Llama-3.1-8B: per-block-per-layer calls vs aligned
      runs, on one L20 server (PCIe) and from an L20 to an H20 server (TCP); low rate, so
      no contention (paper, L20: 0.944 s -> 0.053 s)
  (d) mooncake-conv (first 10 minutes), 4P4D Llama-3.1-8B on A100, TTFT 30 s / TPOT 0.1 s:
      goodput (highest rate with >= 90 % SLO attainment) of flowkv with and without
      prefix-aware prefill routing (prefix caches on in both)
  (e) elastic scaling (pdserve's own): azure-code, 30 minutes, Llama-3.1-8B on A100, TTFT
      2 s / TPOT 0.1 s, at rate x1 and x2: static 2P2D and 3P3D, flowkv 2P2D without
      scaling, 2P2D + 2 reserve scaling up only, and scaling both ways with the low-load
      duration at 30 s (the default), 120 s and 300 s: attainment, TTFT, instance-seconds
  sensitivity: (a)'s 8B 5K point and (b)'s P-L20/D-H20 point under other weights,
      thresholds, hysteresis and lending terms

Every setup is priced by `--backend` (default: the presets' default, the newest vLLM measured
for each GPU; the L20 and H20 scaled from the L40S's and H100's tables); the header names the
model and version of each GPU's source.

    python bench/flowkv_repro.py --out docs/results/flowkv   # about 3 minutes on 2 cores
    python bench/flowkv_repro.py --quick     # every part on 20 requests (traces: 60 s), the
                                             # 8B setups only: the test suite's run
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from pdserve.config import Config
from pdserve.metrics.summary import Summary
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.policies.flowkv.settings import FlowKVSettings, ScoreWeights
from pdserve.sim.runner import Experiment
from pdserve.sim.simulator import SimResult

A_SETUPS = [("llama-3.1-8b", 1), ("llama-3.1-70b", 4)]
A_INPUTS = [1000, 5000, 10000]
A_RATE_FACTORS = [0.25, 0.5, 1.0, 2.0, 4.0]  # x one instance's prefill rate for the input
A_SYSTEMS: list[tuple[str, dict[str, object]]] = [  # label, config values
    ("flowkv 1P1D", {"policy.name": "flowkv", "cluster.prefill": 1, "cluster.decode": 1}),
    ("colocated x2", {"policy.name": "colocated", "cluster.instances": 2}),
    ("colocated x2 prefill-first", {"policy.name": "colocated", "cluster.instances": 2,
                                    "policy.phase_priority": "prefill-first"}),
    ("static-pd 1P1D layer-wise", {"policy.name": "static-pd", "cluster.prefill": 1,
                                   "cluster.decode": 1,
                                   "sim.transfer_mode": "per-block-per-layer"}),
    ("static-pd 1P1D aligned", {"policy.name": "static-pd", "cluster.prefill": 1,
                                "cluster.decode": 1}),
]
B_SYSTEMS: list[tuple[str, dict[str, object]]] = [
    ("P-L20/D-H20", {"policy.name": "flowkv", "cluster.instances": "4xl20:prefill,4xh20:decode"}),
    ("P-H20/D-L20", {"policy.name": "flowkv", "cluster.instances": "4xh20:prefill,4xl20:decode"}),
    ("colocated L20+H20", {"policy.name": "colocated",
                           "cluster.instances": "4xl20:mixed,4xh20:mixed"}),
]
B_RATES = [2.0, 4.0, 6.0, 8.0, 10.0]
D_SCALES = [0.6, 0.7, 0.8]


# --quick: what every run's config gets last (`quick_values`); empty for the real runs
QUICK: dict[str, object] = {}


def quick_values(config: Config) -> Config:
    """The config cut to --quick's size: 20 synthetic requests, or a trace's first 60 s."""
    if not QUICK:
        return config
    if config.workload.trace == "synthetic":
        return config.with_values({"workload.synthetic_requests": min(
            20, config.workload.synthetic_requests)})
    return config.with_values({"workload.duration_s": 60.0})


def run(config: Config, flowkv: FlowKVSettings | None = None) -> tuple[Summary, SimResult]:
    config = quick_values(config)
    experiment = Experiment.from_config(config.with_values({"policy.flowkv": flowkv})
                                        if flowkv else config)
    result = experiment.simulate()
    return experiment.summarize(result), result


def a_config(base: Config, model: str, tp: int, input_tokens: int, rate: float,
             values: dict[str, object]) -> Config:
    return base.with_values({
        "workload.trace": "synthetic", "workload.synthetic_requests": 100,
        "workload.synthetic_rate_rps": rate,
        "workload.synthetic_lengths": f"fixed:{input_tokens}:256", "perf.model": model,
        "perf.gpu": "a100", "perf.tp": tp, "slo.ttft_s": 30.0, "slo.tpot_s": 0.2, **values})


def a_rates(base: Config, model: str, tp: int, input_tokens: int) -> list[float]:
    prefill_s = perf_model(model, "a100", tp, base.perf.backend).prefill.time_s(
        input_tokens, input_tokens ** 2)
    return [factor / prefill_s for factor in A_RATE_FACTORS]


def max_throughput(base: Config, model: str, tp: int, input_tokens: int,
                   values: dict[str, object], flowkv: FlowKVSettings | None = None
                   ) -> tuple[float, float, int]:
    """(highest req/s over the rates, its total tokens/s, role changes at that rate)."""
    best = (0.0, 0.0, 0)
    for rate in a_rates(base, model, tp, input_tokens):
        summary, result = run(a_config(base, model, tp, input_tokens, rate, values), flowkv)
        if summary.throughput_rps > best[0]:
            best = (summary.throughput_rps, summary.total_tokens_per_s,
                    len(result.role_changes))
    return best


def part_a(base: Config) -> list[dict]:
    rows = []
    for model, tp in A_SETUPS:
        for input_tokens in A_INPUTS:
            row: dict = {"model": model, "tp": tp, "input": input_tokens}
            for label, values in A_SYSTEMS:
                rps, tokens_s, flips = max_throughput(base, model, tp, input_tokens, values)
                row[label] = {"rps": rps, "tokens_s": tokens_s, "role_changes": flips}
            rows.append(row)
            print(f"(a) {model} tp{tp} in {input_tokens}: " + ", ".join(
                f"{label} {row[label]['rps']:.3f} req/s" for label, _ in A_SYSTEMS), flush=True)
    return rows


def b_config(base: Config, rate: float, values: dict[str, object]) -> Config:
    return base.with_values({
        "workload.trace": "synthetic", "workload.synthetic_requests": 300,
        "workload.synthetic_rate_rps": rate, "workload.synthetic_lengths": "table:arxiv-lengths",
        "perf.model": "llama-3.1-8b", "cluster.inter_node_link": "tcp-25g",
        "slo.ttft_s": 10.0, "slo.tpot_s": 0.1, **values})


def part_b(base: Config) -> list[dict]:
    rows = []
    for rate in B_RATES:
        row: dict = {"rate_rps": rate}
        for label, values in B_SYSTEMS:
            summary, _ = run(b_config(base, rate, values))
            row[label] = {"e2e_mean_s": summary.e2e_s.mean, "tpot_mean_s": summary.tpot_s.mean,
                          "ttft_mean_s": summary.ttft_s.mean}
        rows.append(row)
        print(f"(b) {rate:g} req/s: " + ", ".join(
            f"{label} E2E {row[label]['e2e_mean_s']:.2f}s TPOT "
            f"{row[label]['tpot_mean_s'] * 1e3:.1f}ms" for label, _ in B_SYSTEMS), flush=True)
    return rows


def part_c(base: Config) -> list[dict]:
    rows = []
    for where, instances, link in (("one L20 server (PCIe)", "1xl20:prefill,1xl20:decode",
                                    "tcp-25g"),
                                   ("L20 -> H20 server (TCP 25G)", "1xl20:prefill,1xh20:decode",
                                    "tcp-25g")):
        for input_tokens in (5000, 10000):
            row: dict = {"where": where, "input": input_tokens}
            for mode in ("per-block-per-layer", "aligned"):
                config = base.with_values({
                    "workload.trace": "synthetic", "workload.synthetic_requests": 20,
                    "workload.synthetic_rate_rps": 0.1,
                    "workload.synthetic_lengths": f"fixed:{input_tokens}:16",
                    "perf.model": "llama-3.1-8b", "policy.name": "static-pd",
                    "cluster.instances": instances, "cluster.inter_node_link": link,
                    "sim.transfer_mode": mode})
                _, result = run(config)
                moved = [r for r in result.requests if r.request_id in result.transfer_calls]
                row[mode] = {
                    "transfer_s": sum(r.transfer_s for r in moved) / len(moved),
                    "calls": sum(result.transfer_calls.values()) / len(moved)}
            rows.append(row)
            print(f"(c) {where} {input_tokens} tokens: " + ", ".join(
                f"{mode} {row[mode]['transfer_s'] * 1e3:.1f} ms ({row[mode]['calls']:.0f} calls)"
                for mode in ("per-block-per-layer", "aligned")), flush=True)
    return rows


def part_d(base: Config) -> dict:
    out = {}
    for aware in (True, False):
        config = base.with_values({
            "workload.trace": "mooncake-conv", "workload.duration_s": 600.0,
            "policy.name": "flowkv", "cluster.prefill": 4, "cluster.decode": 4,
            "perf.model": "llama-3.1-8b", "perf.gpu": "a100", "slo.ttft_s": 30.0,
            "slo.tpot_s": 0.1, "policy.flowkv.prefix_aware_routing": aware,
            "goodput.tolerance": 0.01})
        experiment = Experiment.from_config(quick_values(config))
        goodput = experiment.goodput()
        result = experiment.simulate(goodput.rate_scale or 0.05)
        label = "prefix-aware" if aware else "prefix-blind"
        out[label] = {"goodput_rps": goodput.rate_rps, "rate_scale": goodput.rate_scale,
                      "prefix_hit_tokens_at_goodput": result.prefix_hit_tokens,
                      "input_tokens": sum(r.input_tokens for r in result.requests),
                      "attainment_at_scale": {}}
        for scale in D_SCALES:
            summary = experiment.summarize(experiment.simulate(scale))
            out[label]["attainment_at_scale"][scale] = summary.slo_attainment
        print(f"(d) mooncake-conv {label}: goodput {goodput.rate_rps:.3f} req/s (scale "
              f"{goodput.rate_scale:.3f}), prefix hits {result.prefix_hit_tokens} of "
              f"{out[label]['input_tokens']} prompt tokens; attainment " + ", ".join(
                  f"{v:.1%} at x{k:g}" for k, v in out[label]["attainment_at_scale"].items()),
              flush=True)
    return out


E_NEVER = 1e9  # a duration threshold that never passes: that scaling direction is off
E_FLOWKV: dict[str, object] = {"policy.name": "flowkv", "cluster.prefill": 2,
                               "cluster.decode": 2}
E_SYSTEMS: list[tuple[str, dict[str, object], FlowKVSettings | None]] = [
    ("static-pd 2P2D", {"policy.name": "static-pd", "cluster.prefill": 2, "cluster.decode": 2},
     None),
    ("static-pd 3P3D", {"policy.name": "static-pd", "cluster.prefill": 3, "cluster.decode": 3},
     None),
    ("flowkv 2P2D, no scaling", E_FLOWKV,
     FlowKVSettings(scale_up_after_s=E_NEVER, scale_down_after_s=E_NEVER)),
    ("flowkv 2P2D+2R, up only", {**E_FLOWKV, "cluster.reserve": 2},
     FlowKVSettings(scale_down_after_s=E_NEVER)),
    *[(f"flowkv 2P2D+2R, down after {down:g}s low", {**E_FLOWKV, "cluster.reserve": 2},
       FlowKVSettings(scale_down_after_s=down)) for down in (30.0, 120.0, 300.0)],
]


def part_e(base: Config) -> list[dict]:
    rows = []
    for scale in (1.0, 2.0):
        for label, values, settings in E_SYSTEMS:
            config = base.with_values({
                "workload.trace": "azure-code", "workload.duration_s": 1800.0,
                "perf.model": "llama-3.1-8b", "perf.gpu": "a100", "slo.ttft_s": 2.0,
                "slo.tpot_s": 0.1, "workload.rate_scale": scale, **values})
            summary, result = run(config, settings)
            starts = sum(1 for event in result.scaling_events if event[2] == "start")
            stops = sum(1 for event in result.scaling_events if event[2] == "stop"
                        and event[0] > 0)
            row = {"rate_scale": scale, "system": label,
                   "attainment": summary.slo_attainment, "ttft_p50_s": summary.ttft_s.p50,
                   "ttft_p90_s": summary.ttft_s.p90, "tpot_p90_s": summary.tpot_s.p90,
                   "instance_s": result.instance_s_total, "end_s": result.end_s,
                   "starts": starts, "stops": stops}
            rows.append(row)
            print(f"(e) x{scale:g} {label}: attainment {row['attainment']:.1%}, TTFT P50/P90 "
                  f"{row['ttft_p50_s']:.2f}/{row['ttft_p90_s']:.2f}s, TPOT P90 "
                  f"{row['tpot_p90_s'] * 1e3:.0f} ms, {row['instance_s']:.0f} instance-s "
                  f"over {row['end_s']:.0f}s, {starts} starts, {stops} stops", flush=True)
    return rows


def variants() -> dict[str, FlowKVSettings]:
    base = FlowKVSettings()
    uniform = ScoreWeights(*[1 / 8] * 8)
    return {
        "default": base,
        "thresholds 0.2/0.5": replace(base, low_prefill=0.2, low_decode=0.2, high_prefill=0.5,
                                      high_decode=0.5),
        "thresholds 0.5/0.85": replace(base, low_prefill=0.5, low_decode=0.5,
                                       high_prefill=0.85, high_decode=0.85),
        "no hysteresis, no confirmation": replace(base, hysteresis=0.0, confirm_ticks=1),
        "uniform weights": replace(base, prefill_weights=uniform, decode_weights=uniform),
        "queue-only weights": replace(
            base, prefill_weights=ScoreWeights(0.25, 0.5, 0, 0, 0.25, 0, 0, 0),
            decode_weights=ScoreWeights(0.3, 0.3, 0, 0, 0, 0.4, 0, 0)),
        "idle below 0.1": replace(base, idle_instance=0.1),
        "idle below 0.4": replace(base, idle_instance=0.4),
        "lend 3 ticks": replace(base, switch_ticks=3),
        "lend 30 ticks": replace(base, switch_ticks=30),
    }


def sensitivity(base: Config) -> dict:
    out = {}
    flowkv = dict(A_SYSTEMS)["flowkv 1P1D"]
    for name, settings in variants().items():
        rps, _, flips = max_throughput(base, "llama-3.1-8b", 1, 5000, flowkv, settings)
        summary, result = run(b_config(base, 8.0, dict(B_SYSTEMS)["P-L20/D-H20"]), settings)
        out[name] = {"a_8b_5k_rps": rps, "a_role_changes": flips,
                     "b_e2e_mean_s": summary.e2e_s.mean, "b_role_changes":
                     len(result.role_changes)}
        print(f"sensitivity {name}: (a) 8B 5K {rps:.3f} req/s ({flips} role changes), "
              f"(b) P-L20/D-H20 at 8 req/s E2E {summary.e2e_s.mean:.2f}s "
              f"({len(result.role_changes)} role changes)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write results.json here")
    parser.add_argument("--parts", default="abcdes", help="which parts to run [abcdes]")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    parser.add_argument("--quick", action="store_true", help="every part tiny: 20 requests, "
                        "traces' first 60 s, the 8B setups (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        QUICK["on"] = True
        A_SETUPS[:] = [setup for setup in A_SETUPS if setup[1] == 1]
    started = time.perf_counter()
    base = Config().with_values({"perf.backend": args.backend})
    priced_by = {f"{model} {gpu} tp{tp}": perf_model(model, gpu, tp, args.backend).name
                 for model, gpu, tp in (("llama-3.1-8b", "a100", 1), ("llama-3.1-70b", "a100", 4),
                                        ("llama-3.1-8b", "l20", 1), ("llama-3.1-8b", "h20", 1))}
    for setup, name in priced_by.items():
        print(f"{setup}: priced by {name}", flush=True)
    results: dict = {"perf_models": priced_by}
    steps = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e,
             "s": sensitivity}
    for part in args.parts:
        results[part] = steps[part](base)
    print(f"done in {time.perf_counter() - started:.0f}s wall")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "results.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**kept, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
