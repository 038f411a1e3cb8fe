"""The README's calibration recipe, tried as a user would: calibrate a 2-worker deployment
on one workload, then predict another.

1. The old recipe's model: `pdserve profile --model tiny --contention 1` (the engine alone,
   with one other worker decoding).
2. Workload A, for each policy's deployment (colocated: 2 mixed workers; static-pd: 1P1D):
   one live run with `PDSERVE_STEP_LOG=DIR` (`azure-conv` from second 600, prompts capped
   at `--a-max-input` (512) and outputs at 64 tokens, 60 s at rate scale `--rate-a`, or
   rising from it to `--ramp-to`: `pdserve bench --ramp-to`), then the user's command,
   `pdserve profile --from-step-log DIR --out calibrated-<policy>.json` (its output printed).
3. Workload B, not used to fit: Poisson arrivals with ShareGPT lengths (prompts capped at
   768, outputs at 128 tokens: longer prompts, twice the decode per request), 60 s, at a
   light load and at ~75 % of the deployment's capacity, both rates set from the calibrated
   model: the bottleneck's utilisation (static-pd: the busier of the prefill worker and the
   decode worker; colocated: both phases' work over the 2 workers) at `--light` and
   `--high`; a decode worker's capacity is the best tokens/s over batch sizes up to the cap
   (with a super-linear step, a full batch is not the fastest).
4. `--repeats` live runs of B per policy and load, alternated (every policy and load once,
   then again), each a fresh `pdserve serve --perf-model calibrated-<policy>.json` with
   real HTTP streaming, the load average logged before and after each.
5. The simulator on B as `pdserve simulate --perf-model calibrated-<policy>.json` runs it
   (its control latency and batch spread from the file), and on the old recipe's model;
   a table of TTFT and TPOT P50/P90, live mean (min..max) against both, with errors; and,
   to tell model error from the shared machine's drift, the simulator on each B run's own
   step log ("own log").

    python bench/calibrate_deployment.py --out results/calibrate   # ~25 minutes
    python bench/calibrate_deployment.py --rescore results/calibrate   # seconds, no live run

`--rescore DIR` refits the models from DIR's recorded calibration logs with the current
code (`pdserve profile --from-step-log`) and scores them against DIR's recorded live runs
of B: a change to the fit, measured on the same live data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from live_fidelity import CHUNK, INSTANCES, KV_BLOCKS, MAX_BATCH, STATS, error_pct, live_run

from pdserve.config import Config
from pdserve.metrics.summary import Summary, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.perf.in_situ import calibrate, control_latency
from pdserve.sim.runner import Experiment
from pdserve.types import SLO, attn_units
from pdserve.workload.synthetic import synthetic_workload
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload

POLICIES = {"colocated": (2, 2), "static-pd": (1, 1)}  # prefill, decode
SLO_TARGETS = SLO(1.0, 0.1)  # for the servers' policies; the compared statistics ignore it


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def pdserve(*args: str) -> str:
    """Run a `pdserve` command as a user would; its output, printed too."""
    done = subprocess.run([sys.executable, "-m", "pdserve.cli", *args], capture_output=True,
                          text=True, env=os.environ.copy())
    print(done.stdout + done.stderr, flush=True)
    if done.returncode:
        raise SystemExit(f"pdserve {' '.join(args)} failed ({done.returncode})")
    return done.stdout


def sim_config(policy: str, perf_file: Path) -> Config:
    """What `pdserve simulate --perf-model FILE` with the deployment's settings runs."""
    prefill, decode = POLICIES[policy]
    return Config().with_values({"policy.name": policy, "cluster.instances": INSTANCES,
                                 "cluster.prefill": prefill, "cluster.decode": decode,
                                 "instance.chunk_size_tokens": CHUNK,
                                 "instance.max_batch_size": MAX_BATCH,
                                 "slo.ttft_s": SLO_TARGETS.ttft_s,
                                 "slo.tpot_s": SLO_TARGETS.tpot_s, "monitor.interval_s": 0.5,
                                 "perf.profile": str(perf_file)})


def simulate(policy: str, perf_file: Path, workload: Workload) -> dict[str, float]:
    config = sim_config(policy, perf_file)
    model = PerfModel.load(perf_file)
    return stats_of(summarize(Experiment(config, workload, model).simulate().requests,
                              SLO_TARGETS))


def stats_of(summary: Summary) -> dict[str, float]:
    return {"ttft_p50_s": summary.ttft_s.p50, "ttft_p90_s": summary.ttft_s.p90,
            "tpot_p50_s": summary.tpot_s.p50, "tpot_p90_s": summary.tpot_s.p90,
            "completed": summary.completed, "requests": summary.requests}


def utilisation(policy: str, model: PerfModel, workload: Workload) -> float:
    """The bottleneck's busy fraction `workload` asks of the deployment, by `model`."""
    prefill_s = 0.0
    for prompt in workload.input_tokens:
        done = 0
        while done < prompt:  # in chunks, as the workers run it
            chunk = min(CHUNK, int(prompt) - done)
            prefill_s += model.prefill.time_s(chunk, attn_units(chunk, done))
            done += chunk
    context = float(np.mean(workload.input_tokens) + np.mean(workload.output_tokens) / 2)
    best_tokens_s = max(b / model.decode.step_s(b, int(b * context))
                        for b in range(1, MAX_BATCH + 1))
    decode_s = float(np.sum(workload.output_tokens - 1)) / best_tokens_s
    span_s = workload.span_s
    if policy == "colocated":
        return (prefill_s + decode_s) / (INSTANCES * span_s)
    return max(prefill_s, decode_s) / span_s


def workload_b(rate_rps: float, duration_s: float) -> Workload:
    requests = max(2, int(rate_rps * duration_s))
    return synthetic_workload(requests, rate_rps, "table:sharegpt", "poisson", 1.0,
                              seed=11).clipped(768, 128)


def rescore(out: Path, duration_s: float) -> None:
    """Refit `out`'s calibration logs with the current code and score the fits against
    its recorded live runs of B, beside the models the run itself fitted."""
    report = json.loads((out / "calibrate_deployment.json").read_text())
    refit: dict[str, Path] = {}
    for policy in POLICIES:
        refit[policy] = out / f"refit-{policy}.json"
        pdserve("profile", "--from-step-log", str(out / f"steps-A-{policy}"), "--out",
                str(refit[policy]))
    lines = [f"{'policy':<11}{'load':<7}{'stat':<12}{'live mean':>10}{'recorded fit':>14}"
             f"{'err':>7}{'refit':>10}{'err':>7}"]
    for name in ("light", "high"):
        for policy in POLICIES:
            workload = workload_b(report["rates_rps"][policy][name], duration_s)
            recorded = simulate(policy, out / f"calibrated-{policy}.json", workload)
            new = simulate(policy, refit[policy], workload)
            runs = [run["live"] for run in report["runs"]
                    if run["policy"] == policy and run["load"] == name]
            for stat in STATS:
                mean = float(np.mean([run[stat] for run in runs]))
                lines.append(f"{policy:<11}{name:<7}{stat:<12}{mean:>10.4f}"
                             f"{recorded[stat]:>14.4f}{error_pct(recorded[stat], mean):>6.0f}%"
                             f"{new[stat]:>10.4f}{error_pct(new[stat], mean):>6.0f}%")
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/calibrate"))
    parser.add_argument("--rate-a", type=float, default=0.8, help="workload A's rate scale")
    parser.add_argument("--ramp-to", type=float, default=0.0, help="workload A as a ramp: its "
                        "rate scale rises from --rate-a to this over the run (`pdserve bench "
                        "--ramp-to`), so its log covers light to heavy batches [off]")
    parser.add_argument("--a-max-input", type=int, default=512,
                        help="workload A's prompt cap (B's is 768)")
    parser.add_argument("--light", type=float, default=0.3, help="light load's utilisation")
    parser.add_argument("--high", type=float, default=0.75, help="the high load's")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per workload")
    parser.add_argument("--rescore", type=Path, help="refit DIR's calibration logs and score "
                        "them against its recorded live runs (no live run)")
    args = parser.parse_args()
    if args.rescore:
        rescore(args.rescore, args.duration)
        return
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    old = out / "profile-contention1.json"
    print(f"load average {load_average():.2f}: the old recipe's profile", flush=True)
    pdserve("profile", "--model", "tiny", "--kv-blocks", str(KV_BLOCKS), "--contention", "1",
            "--out", str(old))

    trace_a = load_trace("azure-conv").window(600.0).clipped(args.a_max_input, 64)
    workload_a = (trace_a.ramped(args.rate_a, args.ramp_to, args.duration) if args.ramp_to
                  else trace_a.scaled(args.rate_a).window(0.0, args.duration))
    calibrated: dict[str, Path] = {}
    report: dict[str, object] = {"workload_a_requests": len(workload_a), "runs": []}
    for policy in POLICIES:
        logs = out / f"steps-A-{policy}"
        before = load_average()
        summary, _ = live_run(policy, SLO_TARGETS, workload_a, old, args.duration + 180,
                              logs)
        print(f"workload A, {policy}: {len(workload_a)} requests, load average {before:.2f} -> "
              f"{load_average():.2f}; live {stats_of(summary)}", flush=True)
        calibrated[policy] = out / f"calibrated-{policy}.json"
        pdserve("profile", "--from-step-log", str(logs), "--out", str(calibrated[policy]))

    loads = {"light": args.light, "high": args.high}
    rates: dict[str, dict[str, float]] = {}
    for policy, path in calibrated.items():
        model, probe = PerfModel.load(path), 10.0
        per_rps = utilisation(policy, model, workload_b(probe, args.duration)) / probe
        rates[policy] = {name: round(target / per_rps, 2) for name, target in loads.items()}
        print(f"{policy}: workload B's capacity by its calibrated model {1 / per_rps:.2f} "
              f"req/s; rates {rates[policy]}", flush=True)
    report["rates_rps"] = rates

    live: dict[tuple[str, str], list[dict[str, float]]] = {}
    own: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for name in loads:
            for policy in POLICIES:
                workload = workload_b(rates[policy][name], args.duration)
                logs = out / "timelines" / f"{policy}-{name}-{repeat}"
                before = load_average()
                summary, split = live_run(policy, SLO_TARGETS, workload, calibrated[policy],
                                          args.duration + 180, logs)
                after = load_average()
                stats = stats_of(summary)
                live.setdefault((policy, name), []).append(stats)
                server_side = control_latency(logs)
                client_side = float(np.percentile(np.add(split["in"], split["out"]), 50))
                own_file = logs / "own-fit.json"
                try:
                    calibrate(logs).model.save(own_file)
                    own.setdefault((policy, name), []).append(
                        simulate(policy, own_file, workload))
                except ValueError as err:  # too few batches of a side at a light load
                    print(f"  no fit of this run's own log: {err}", flush=True)
                run = {"policy": policy, "load": name, "repeat": repeat,
                       "rate_rps": rates[policy][name], "requests": len(workload),
                       "load_average": [before, after], "live": stats,
                       "control_server_p50_s": server_side.median_s if server_side else None,
                       "control_client_p50_s": client_side}
                report["runs"].append(run)  # type: ignore[attr-defined]
                print(f"B {policy} {name} #{repeat + 1}: {run}", flush=True)

    header = (f"{'policy':<11}{'load':<7}{'stat':<12}{'live mean':>10}{'live min..max':>17}"
              f"{'calibrated':>12}{'err':>7}{'old recipe':>12}{'err':>7}{'own log':>10}"
              f"{'err':>7}")
    lines = [header]
    sims: dict[str, object] = {}
    for name in loads:
        for policy in POLICIES:
            workload = workload_b(rates[policy][name], args.duration)
            new = simulate(policy, calibrated[policy], workload)
            before_sim = simulate(policy, old, workload)
            sims[f"{policy}/{name}"] = {"calibrated": new, "old recipe": before_sim}
            for stat in STATS:
                values = [run[stat] for run in live[(policy, name)]]
                mean = float(np.mean(values))
                own_runs = own.get((policy, name), [])
                own_mean = (float(np.mean([run[stat] for run in own_runs])) if own_runs
                            else float("nan"))
                lines.append(
                    f"{policy:<11}{name:<7}{stat:<12}{mean:>10.4f}"
                    f"{f'{min(values):.4f}..{max(values):.4f}':>17}"
                    f"{new[stat]:>12.4f}{error_pct(new[stat], mean):>6.0f}%"
                    f"{before_sim[stat]:>12.4f}{error_pct(before_sim[stat], mean):>6.0f}%"
                    f"{own_mean:>10.4f}{error_pct(own_mean, mean):>6.0f}%")
    print("\n".join(lines), flush=True)
    report["simulated"] = sims
    (out / "calibrate_deployment.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "table.txt").write_text("\n".join(lines) + "\n")
    print(f"total {time.perf_counter() - started:.0f}s; wrote {out}/")


if __name__ == "__main__":
    main()
