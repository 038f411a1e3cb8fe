"""Live fidelity in the queueing regime: 2 `tiny` workers live vs simulated, repeated.

The simulator is meant to be right where queueing decides TTFT. On this 2-core machine two
workers (one torch thread each) is the deployment the simulator models honestly: more
workers than cores would time-share cores, which no performance model here describes.

1. `pdserve profile` the engine twice: alone, and with 1 other worker decoding
   (`--contention 1`: the other worker of a busy 2-worker deployment).
2. The rate: the smallest rate scale of the clip at which the simulated colocated TTFT P50
   (on the contended profile) is at least `--queueing-factor` x the clip's median prefill
   time, i.e. queueing, not the prefill itself, dominates TTFT (`--rate-scale` overrides).
3. In-situ profiles: live runs on the *next* `--duration` seconds of the trace at the same
   rate, with `PDSERVE_STEP_LOG` set, so every worker logs the batches it ran and each
   one's period (start to the next batch's start while busy, so what the worker does
   between batches counts): a colocated run, whose rows fit one model
   (`perf.step_log.fit_step_log`), and a static-pd 1P1D run, whose prefill worker's rows fit
   the prefill side and decode worker's rows the decode side
   (`fit_step_log_by_role`: each role's own share of the KV hand-off and of the cores).
   The colocated run also measures the control plane's latency: the driver logs when it
   admitted each request and when the batch that made its first token ended
   (`live/timeline.py`), the client when it sent it and got the text, on one clock; what is
   outside admission..batch end (HTTP, tokenizing, pipes, streaming) is
   `sim.control_latency_s` of the config (its median).
4. For colocated (2 mixed), static-pd 1P1D and arrow (1P1D start): `--repeats` live runs,
   each a fresh `pdserve serve` with real HTTP streaming (each logging the same timeline, so
   every run's TTFT splits into the part the simulator models and the control plane's);
   the simulator runs the identical workload once per model (it is deterministic):
   alone, contended, in-situ (colocated fit), per role (the 1P1D fit for the PD policies),
   and per role + control latency.
5. Prints simulated vs live P50/P90 TTFT and TPOT with the error of each
   ((sim - live) / live, against the mean of the live repeats, with their spread); with
   `--below-knee-factor F` the same comparison again at F x the rate.
6. "at rate + control": the in-situ models (colocated fit for colocated, per-role fit for
   the PD policies) and the control latency calibrated at the compared rate itself (below
   the knee: two more calibration runs there), against models calibrated at the knee only.
   Every batch at its mean, every request the median control latency.
7. "at rate + spread": the same models with the spread measured in the same calibration
   runs: each prefill batch drawn around its mean with the logged periods' coefficient of
   variation (`PerfModel.prefill_step_cv`, `sim/step_noise.py`), each request's control
   latency drawn with the measured median and P90 (the config's `sim.control_latency_p90_s`).
8. "same run + spread": each live run against the simulator on that run's own step log,
   spread and control latency, averaged over the repeats: the shared machine's speed drifts
   over minutes, and this holds it fixed (`bench/fidelity_same_run.py` recomputes it from a
   finished run's logs).

    python bench/live_fidelity.py --out docs/results/fidelity   # about 15 minutes (23 with
    # --below-knee-factor 0.5: two more calibration runs and 6 more live runs)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pdserve.config import Config
from pdserve.engine.profile import ProfileGrid, profile_engine
from pdserve.live.replay_client import ClientTimeline
from pdserve.live.serve_and_replay import serve_and_replay
from pdserve.live.timeline import read_timeline, split_ttft
from pdserve.metrics.summary import Summary, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.perf.step_log import STEP_LOG_ENV, fit_step_log, fit_step_log_by_role
from pdserve.sim.runner import Experiment
from pdserve.types import SLO
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload

POLICIES = {"colocated": (2, 2), "static-pd": (1, 1), "arrow": (1, 1)}  # prefill, decode
KV_BLOCKS, CHUNK, MAX_BATCH, INSTANCES = 2048, 512, 64, 2
STATS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
RATE_CANDIDATES = (0.4, 0.8, 1.2, 1.4, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4)


def stats_of(summary: Summary) -> dict[str, float]:
    return {"ttft_p50_s": summary.ttft_s.p50, "ttft_p90_s": summary.ttft_s.p90,
            "tpot_p50_s": summary.tpot_s.p50, "tpot_p90_s": summary.tpot_s.p90,
            "slo_attainment": summary.slo_attainment, "completed": summary.completed,
            "requests": summary.requests}


def sim_config(policy: str, slo: SLO, control_latency_s: float = 0.0,
               control_latency_p90_s: float = 0.0) -> Config:
    prefill, decode = POLICIES[policy]
    return Config().with_values({"policy.name": policy, "cluster.instances": INSTANCES,
                                 "cluster.prefill": prefill, "cluster.decode": decode,
                                 "instance.chunk_size_tokens": CHUNK,
                                 "instance.max_batch_size": MAX_BATCH, "slo.ttft_s": slo.ttft_s,
                                 "slo.tpot_s": slo.tpot_s, "monitor.interval_s": 0.5,
                                 "sim.control_latency_s": control_latency_s,
                                 "sim.control_latency_p90_s": control_latency_p90_s})


def simulate(policy: str, slo: SLO, workload: Workload, perf: PerfModel,
             control_latency_s: float = 0.0, control_latency_p90_s: float = 0.0,
             spread: bool = False) -> Summary:
    """`spread`: keep the model's measured batch-time spread (else every batch at its mean)
    and draw each request's control latency (median, P90) rather than add the median."""
    if not spread:
        perf, control_latency_p90_s = replace(perf, prefill_step_cv=0.0), 0.0
    config = sim_config(policy, slo, control_latency_s, control_latency_p90_s)
    return summarize(Experiment(config, workload, perf).simulate(1.0).requests, slo)


def describe_split(split: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {"requests": float(len(split["in"]))}
    for part, values in split.items():
        if values:
            out[f"{part}_p50_s"] = float(np.percentile(values, 50))
            out[f"{part}_p90_s"] = float(np.percentile(values, 90))
    if split["in"]:
        control = np.add(split["in"], split["out"])
        out["control_p50_s"] = float(np.percentile(control, 50))
        out["control_p90_s"] = float(np.percentile(control, 90))
    return out


def run_model(policy: str, log_dir: Path, base: PerfModel) -> PerfModel:
    """The runtime model of one live run, fitted to its own step log (the 1P1D policies:
    prefill from the batches run in a prefill role, decode from those in a decode role, by
    the driver's role log; runs logged before it existed: instance 0 and instance 1)."""
    if policy == "colocated":
        return fit_step_log(log_dir, base)
    return fit_step_log_by_role(log_dir, base, prefill_instance=0, decode_instance=1)


def same_run_stats(policy: str, slo: SLO, workload: Workload, model: PerfModel,
                   split: dict[str, float]) -> dict[str, float]:
    """The simulator on one live run's own model (`run_model`), spread and control latency
    (its TTFT split): the machine held fixed (`bench/fidelity_same_run.py`)."""
    return stats_of(simulate(policy, slo, workload, model, split["control_p50_s"],
                             split["control_p90_s"], spread=True))


def pick_rate(base: Workload, duration_s: float, slo: SLO, perf: PerfModel,
              factor: float) -> float:
    median_prompt = int(np.median(base.window(0.0, duration_s).input_tokens))
    median_prefill_s = perf.prefill.time_s(median_prompt, median_prompt**2)
    for scale in RATE_CANDIDATES:
        clip = base.scaled(scale).window(0.0, duration_s)
        summary = simulate("colocated", slo, clip, perf)
        print(f"  rate scale {scale:.2f}: {len(clip)} requests, simulated "
              f"TTFT P50 {summary.ttft_s.p50:.3f}s ({summary.ttft_s.p50 / median_prefill_s:.1f}x "
              f"the median prefill)")
        if summary.ttft_s.p50 >= factor * median_prefill_s:
            return scale
    return RATE_CANDIDATES[-1]


def error_pct(simulated: float, live: float) -> float:
    return 100.0 * (simulated - live) / live if live > 0 else float("nan")


def live_run(policy: str, slo: SLO, workload: Workload, perf_file: Path, timeout_s: float,
             log_dir: Path) -> tuple[Summary, dict[str, list[float]]]:
    """One fresh server replaying `workload`; its workers' step logs and the TTFT split
    land in `log_dir`."""
    prefill, decode = POLICIES[policy]
    flags = ["--policy", policy]
    if policy != "colocated":
        flags += ["--prefill", str(prefill), "--decode", str(decode)]
    if log_dir.exists():
        for old in log_dir.glob("*.csv"):
            old.unlink()
    client: ClientTimeline = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    requests = serve_and_replay("tiny", INSTANCES, flags, perf_file, slo, workload,
                                timeout_s, KV_BLOCKS, CHUNK, MAX_BATCH,
                                env={STEP_LOG_ENV: str(log_dir)}, timeline=client,
                                server_log=log_dir / "server.log")
    unfinished = [(r.request_id, r.arrival_s, r.rejected_reason) for r in requests
                  if not r.finished]
    if unfinished:  # nothing may be lost: say which and why, with the server's log beside
        print(f"  {len(unfinished)} unfinished (request, arrival s, reason): {unfinished} "
              f"(server log: {log_dir / 'server.log'})", flush=True)
    return summarize(requests, slo), split_ttft(client, read_timeline(log_dir))


def calibrate(rate: float, base: Workload, args: argparse.Namespace, slo: SLO,
              perf_file: Path, perf: PerfModel, tag: str
              ) -> tuple[PerfModel, PerfModel, dict[str, float]]:
    """In-situ models at `rate` (step 3): a colocated and a 1P1D live run on the next
    `--duration` seconds; (colocated fit, per-role fit, the control plane's split)."""
    calibration = base.scaled(rate).window(args.duration, args.duration)
    timeout_s = args.duration + 180
    _, split = live_run("colocated", slo, calibration, perf_file, timeout_s,
                        args.out / f"step-logs{tag}")
    in_situ = fit_step_log(args.out / f"step-logs{tag}", perf)
    control = describe_split(split)
    live_run("static-pd", slo, calibration, perf_file, timeout_s,
             args.out / f"step-logs-pd{tag}")
    pd_model = fit_step_log_by_role(args.out / f"step-logs-pd{tag}", perf, 0, 1)
    for name, model in ((f"in-situ{tag}", in_situ), (f"in-situ-pd{tag}", pd_model)):
        model.save(args.out / f"tiny-profile-{name}.json")
    print(f"in-situ at rate {rate}: colocated fit R2 {in_situ.prefill.r2:.3f}, prefill "
          f"batch spread (CV) {in_situ.prefill_step_cv:.3f}; per-role fit prefill R2 "
          f"{pd_model.prefill.r2:.3f} (CV {pd_model.prefill_step_cv:.3f}), decode R2 "
          f"{pd_model.decode.r2:.3f}; control plane {control}", flush=True)
    return in_situ, pd_model, control


def compare(rate: float, repeats: int, base: Workload, args: argparse.Namespace, slo: SLO,
            perf_file: Path, perfs: dict[str, PerfModel], pd_model: PerfModel,
            control_latency_s: float,
            at_rate: tuple[PerfModel, PerfModel, dict[str, float]]) -> dict[str, object]:
    """Live repeats and simulations of every policy at `rate`; prints the table."""
    workload = base.scaled(rate).window(0.0, args.duration)
    print(f"rate scale {rate}: {len(workload)} requests over {workload.span_s:.0f}s")
    models = [*perfs, "per role", "per role + control", "at rate + control",
              "at rate + spread", "same run + spread"]
    report: dict[str, object] = {"rate_scale": rate, "requests": len(workload),
                                 "control_latency_s": control_latency_s, "policies": {}}
    header = f"{'policy':<11}{'stat':<12}{'live mean':>10}{'live min..max':>17}"
    header += "".join(f"{'sim ' + name:>25}{'err':>7}" for name in models)
    lines = [header]
    for policy in POLICIES:
        live_runs, splits, same_run = [], [], []
        for repeat in range(repeats):
            log_dir = args.out / "timelines" / f"{policy}-x{rate:g}-{repeat}"
            summary, split = live_run(policy, slo, workload, perf_file, args.duration + 180,
                                      log_dir)
            live_runs.append(stats_of(summary))
            splits.append(describe_split(split))
            same_run.append(same_run_stats(
                policy, slo, workload, run_model(policy, log_dir, perfs["contended"]),
                splits[-1]))
            print(f"{policy} live run {repeat + 1}: {live_runs[-1]}; TTFT split {splits[-1]}",
                  flush=True)
        role_model = perfs["in-situ"] if policy == "colocated" else pd_model
        sims = {name: stats_of(simulate(policy, slo, workload, model))
                for name, model in perfs.items()}
        sims["per role"] = stats_of(simulate(policy, slo, workload, role_model))
        sims["per role + control"] = stats_of(simulate(policy, slo, workload, role_model,
                                                       control_latency_s))
        rate_model = at_rate[0] if policy == "colocated" else at_rate[1]
        control = at_rate[2]
        sims["at rate + control"] = stats_of(simulate(policy, slo, workload, rate_model,
                                                      control["control_p50_s"]))
        sims["at rate + spread"] = stats_of(simulate(
            policy, slo, workload, rate_model, control["control_p50_s"],
            control["control_p90_s"], spread=True))
        sims["same run + spread"] = {stat: float(np.mean([run[stat] for run in same_run]))
                                     for stat in STATS}
        report["policies"][policy] = {"live": live_runs,  # type: ignore[index]
                                      "ttft_split": splits, "sim": sims}
        for stat in STATS:
            values = [run[stat] for run in live_runs]
            mean = float(np.mean(values))
            line = (f"{policy:<11}{stat:<12}{mean:>10.4f}"
                    f"{f'{min(values):.4f}..{max(values):.4f}':>17}")
            for name in models:
                line += f"{sims[name][stat]:>25.4f}{error_pct(sims[name][stat], mean):>6.0f}%"
            lines.append(line)
    print("\n".join(lines), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/fidelity"))
    parser.add_argument("--start", type=float, default=600.0, help="trace second to start at")
    parser.add_argument("--duration", type=float, default=60.0, help="replay seconds")
    parser.add_argument("--rate-scale", type=float, default=0.0, help="0: pick (step 2)")
    parser.add_argument("--queueing-factor", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--below-knee-factor", type=float, default=0.0,
                        help="also compare at this fraction of the rate (0: skip)")
    parser.add_argument("--below-repeats", type=int, default=2)
    parser.add_argument("--max-input-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    profiles = {"alone": args.out / "tiny-profile.json",
                "contended": args.out / "tiny-profile-contention1.json"}
    profile_engine("tiny", KV_BLOCKS, ProfileGrid()).save(profiles["alone"])
    profile_engine("tiny", KV_BLOCKS, ProfileGrid(), contention=1).save(profiles["contended"])
    perfs = {name: PerfModel.load(path) for name, path in profiles.items()}
    print(f"profiled in {time.perf_counter() - started:.0f}s")

    base = (load_trace("azure-conv").window(args.start)
            .clipped(args.max_input_tokens, args.max_output_tokens))
    clip = base.window(0.0, args.duration)
    perf = perfs["contended"]
    p90_prompt = int(np.percentile(clip.input_tokens, 90))
    median_context = int(np.median(clip.input_tokens)) + args.max_output_tokens // 2
    slo = SLO(4 * perf.prefill.time_s(p90_prompt, p90_prompt**2),
              4 * perf.decode.step_s(8, 8 * median_context))
    rate = args.rate_scale or pick_rate(base, args.duration, slo, perf, args.queueing_factor)
    print(f"rate scale {rate}; SLOs TTFT {slo.ttft_s:.3f}s, TPOT {slo.tpot_s:.4f}s")

    in_situ, pd_model, control = calibrate(rate, base, args, slo, profiles["contended"],
                                            perf, "")
    control_latency_s = control["control_p50_s"]
    perfs["in-situ"] = in_situ

    report: dict[str, object] = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
                                 "calibration_ttft_split": control}
    report["at_knee"] = compare(rate, args.repeats, base, args, slo, profiles["contended"], perfs,
                                pd_model, control_latency_s, (in_situ, pd_model, control))
    if args.below_knee_factor:
        below = round(rate * args.below_knee_factor, 3)
        in_situ_below, pd_below, control_below = calibrate(
            below, base, args, slo, profiles["contended"], perf, "-below")
        report["below_knee"] = compare(below, args.below_repeats, base, args, slo,
                                       profiles["contended"], perfs, pd_model,
                                       control_latency_s,
                                       (in_situ_below, pd_below, control_below))
    (args.out / "live_fidelity.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"total {time.perf_counter() - started:.0f}s; wrote {args.out}/")


if __name__ == "__main__":
    main()
