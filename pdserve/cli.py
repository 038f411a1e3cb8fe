"""Command line: `pdserve simulate | profile | serve | bench | plan | predictor |
ray-local`."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from pdserve.config import Config
from pdserve.config_flags import (
    GOODPUT_FLAGS,
    POLICY_FLAGS,
    SIMULATE_CLUSTER_FLAGS,
    SLO_FLAGS,
    WORKLOAD_FLAGS,
    add_flags,
    at_least,
    config_from_args,
    positive_seconds,
    server_url,
)
from pdserve.engine.profile_cli import add_profile_parser
from pdserve.live.ray_local import add_ray_local_parser
from pdserve.planning.cli import add_plan_parser
from pdserve.predictor.cli import add_predictor_parser
from pdserve.server.serve_cli import add_serve_parser
from pdserve.workload.workload import Workload


def _simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="replay a trace on a simulated cluster under a policy",
        description="Replay a trace on a simulated PD cluster and report TTFT/TPOT, SLO "
        "attainment, throughput and (with --goodput) the highest rate meeting the SLOs. "
        "Each option sets one value of the config tree (pdserve.config); --config FILE "
        "sets any of them, and the options override it.",
    )
    defaults = Config()
    add_flags(p.add_argument_group("workload"), WORKLOAD_FLAGS, defaults)
    c = p.add_argument_group("cluster and policy")
    add_flags(c, POLICY_FLAGS[:1], defaults)
    add_flags(c, SIMULATE_CLUSTER_FLAGS, defaults)
    add_flags(c, POLICY_FLAGS[1:], defaults)
    s = p.add_argument_group("SLOs and output")
    add_flags(s, SLO_FLAGS + GOODPUT_FLAGS, defaults)
    s.add_argument("--config", type=Path, help="YAML file of the config tree (nested "
                   "sections, as --out writes it); options override it")
    s.add_argument("--out", type=Path, help="write summary.json, requests.csv, config.yaml "
                   "and plots here")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pdserve.metrics import plots
    from pdserve.metrics.report import (
        format_goodput,
        format_summary,
        write_requests_csv,
        write_summary_json,
    )
    from pdserve.metrics.report_page import run_state, write_report
    from pdserve.planning.run_length import burst_goodput_note
    from pdserve.sim.runner import Experiment, check_rate_to_scale

    config = config_from_args(args)
    if args.out:  # before the run: an --out that cannot be a directory fails now
        args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    experiment = Experiment.from_config(config)
    workload = experiment.workload
    arriving = (f"over {workload.span_s:.0f}s ({workload.mean_rate_rps:.2f} req/s)"
                if workload.mean_rate_rps > 0 else "all at once")
    print(f"workload {workload.name}: {len(workload)} requests {arriving} x rate scale "
          f"{config.workload.rate_scale:g}")
    print(f"perf model {experiment.perf.name}: KV capacity {experiment.perf.kv_capacity_tokens} "
          f"tokens; fit R2 prefill {experiment.perf.prefill.r2:.4f}, decode "
          f"{experiment.perf.decode.r2:.4f}")
    if config.goodput.search:
        check_rate_to_scale(workload)  # before the first run, not after it
    bar = tqdm(total=len(workload), unit="req", desc="simulate", disable=True if
               args.no_progress else None, leave=False)
    result = experiment.simulate(on_progress=lambda done: bar.update(done - bar.n))
    bar.close()
    summary = experiment.summarize(result)
    print(format_summary(summary, experiment.slo,
                         f"policy {config.policy.name}: simulated {result.end_s:.0f}s in "
                         f"{time.perf_counter() - started:.1f}s wall"))
    if result.sessions.rounds:
        stats = result.sessions
        print(f"sessions: {stats.rounds} later rounds, {stats.local_prefills} prefilled on "
              f"their decode instance, {stats.remote_prefills} elsewhere; history evicted "
              f"(re-prefilled) {stats.history_evicted}, recomputed away from it "
              f"{stats.history_recomputed}")
    if result.migrations:
        print(f"migrations: {result.migrations} running decodes moved between instances")
    goodput = None
    if config.goodput.search:
        print("goodput search:")
        goodput = experiment.goodput(on_point=lambda p: print(
            f"  rate scale {p.rate_scale:8.3f}  {p.rate_rps:8.2f} req/s  attainment "
            f"{p.summary.slo_attainment:6.1%}" + (
                f" (stopped once decided, {p.summary.completed + p.summary.rejected} of "
                f"{p.summary.requests} requests done)" if p.decided_early else ""),
            flush=True))
        print(format_goodput(goodput))
        if not goodput.ceiling_reached and (note := burst_goodput_note(
                workload, config, goodput.rate_rps)) is not None:
            print(f"warning: {note}")
    if args.out:
        out: Path = args.out
        (out / "config.yaml").write_text(config.to_yaml())
        write_summary_json(out / "summary.json", summary, config.to_dict(), goodput,
                           {"flips": result.flips, "role_changes": len(result.role_changes),
                            "simulated_s": result.end_s, "sessions": asdict(result.sessions),
                            "instance_s_total": result.instance_s_total,
                            "migrations": result.migrations, "events": result.events})
        write_requests_csv(out / "requests.csv", result.requests, experiment.slo)
        plots.plot_latency_cdfs(out / "latency_cdf.png", result.requests, experiment.slo,
                                f"{config.policy.name} on {workload.name}")
        samples = result.samples
        plots.plot_instance_load(
            out / "instance_load.png", [s.time_s for s in samples],
            np.array([s.running_tokens for s in samples]),
            np.array([s.prefill_queue_tokens for s in samples]),
            [[r.value for r in s.roles] for s in samples],
            f"{config.policy.name} on {workload.name}")
        if goodput is not None:
            plots.plot_attainment(out / "attainment_vs_rate.png", {config.policy.name: goodput},
                                  f"{workload.name}, TTFT {config.slo.ttft_s:g}s, TPOT "
                                  f"{config.slo.tpot_s:g}s")
        title = f"{config.policy.name} on {workload.name}"
        reported = write_report(out / "report.html", run_state(
            f"pdserve simulate: {title}", f"{len(result.requests)} requests, "
            f"{result.end_s:.0f} s simulated; SLO TTFT {config.slo.ttft_s:g} s, TPOT "
            f"{config.slo.tpot_s:g} s", result.requests, experiment.slo, result.samples,
            result.decisions, goodput, config.policy.name, [
                ("policy", config.policy.name), ("requests", str(summary.requests)),
                ("completed", str(summary.completed)), ("rejected", str(summary.rejected)),
                ("SLO attainment", f"{summary.slo_attainment:.1%}"),
                ("role flips", str(result.flips)), ("migrations", str(result.migrations))]
            + ([("goodput", goodput.rate_text)] if goodput else [])))
        print(f"wrote {out}/: summary.json, requests.csv, config.yaml, latency_cdf.png, "
              f"instance_load.png" + (", attainment_vs_rate.png" if goodput else "")
              + (", report.html" if reported else ""))
    return 0


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="replay a trace against a live OpenAI-compatible server",
        description="Replay a (rate-scaled, clipped) trace against any OpenAI-compatible URL "
        "with real streaming, and score it with the same metrics and report as simulate.")
    p.add_argument("--url", type=server_url, default="http://127.0.0.1:8000",
                   help="server base URL")
    p.add_argument("--model", default="", help="model name [the server's first model]")
    p.add_argument("--api-key", default="")
    p.add_argument("--trace", default="azure-conv", help="shipped trace or trace file")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the request rate")
    p.add_argument("--ramp-to", type=float, default=0.0, metavar="SCALE",
                   help="raise the rate scale linearly from --rate-scale to SCALE over the "
                   "replay: one run that sweeps the load (a calibration run for `pdserve "
                   "profile --from-step-log`) [off]")
    p.add_argument("--start", type=float, default=0.0, help="skip START s of the trace")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of replay, after rate scaling [60]")
    p.add_argument("--max-input-tokens", type=at_least(1), default=2048, help="cap prompts [2048]")
    p.add_argument("--max-output-tokens", type=at_least(1), default=256, help="cap outputs [256]")
    p.add_argument("--max-in-flight", type=at_least(1), default=256, help="[256]")
    p.add_argument("--timeout", type=positive_seconds, default=None,
                   help="limit for the whole replay [duration + 120 s]")
    slo = Config().slo
    p.add_argument("--ttft-slo", type=float, default=slo.ttft_s, help=f"[{slo.ttft_s:g}]")
    p.add_argument("--tpot-slo", type=float, default=slo.tpot_s, help=f"[{slo.tpot_s:g}]")
    p.add_argument("--out", type=Path, help="write summary.json, requests.csv and plots here")
    p.set_defaults(handler=_run_bench)


FEW_REQUESTS = 20  # fewer in a bench window: warn that its figures say little


def bench_workload(args: argparse.Namespace):
    from pdserve.workload.traces import load_trace

    workload = load_trace(args.trace)
    if args.start:
        workload = workload.window(args.start)
    if args.ramp_to:
        workload = workload.ramped(args.rate_scale, args.ramp_to, args.duration)
    else:
        workload = workload.scaled(args.rate_scale).window(0.0, args.duration)
    if len(workload) == 0:
        raise ValueError("no requests in the chosen window")
    return workload.clipped(args.max_input_tokens, args.max_output_tokens)


def session_replay_note(workload: Workload) -> str | None:
    """What a replay of a trace with multi-round sessions does not do (None: no later
    rounds): `pdserve simulate` chains a session's rounds and reuses their history; the
    replay client sends every row at its arrival time as a request of its own."""
    if workload.session_id is None or workload.round_index is None:
        return None
    in_session = workload.session_id >= 0
    sessions = len(set(workload.session_id[in_session].tolist()))
    later = int(in_session.sum()) - sessions
    if later <= 0:
        return None
    return (f"the trace holds {later} later round{'s' * (later != 1)} of {sessions} "
            f"session{'s' * (sessions != 1)}; this replay sends every row at its arrival "
            f"time as a request of its own, neither chaining a session's rounds nor sending "
            f"X-Session-Id, so no history is reused (pdserve simulate does both)")


def _run_bench(args: argparse.Namespace) -> int:
    import asyncio

    try:
        import httpx

        from pdserve.live.replay_client import replay
    except ImportError as err:
        raise ValueError(f"bench needs the bench extra (pip install 'pdserve[bench]'): "
                         f"{err}") from err
    from pdserve.metrics import plots
    from pdserve.metrics.report import format_summary, write_requests_csv, write_summary_json
    from pdserve.metrics.report_page import run_state, write_report
    from pdserve.metrics.summary import summarize
    from pdserve.types import SLO

    slo = SLO(args.ttft_slo, args.tpot_slo)
    workload = bench_workload(args)
    model = args.model
    if not model:
        try:
            listing = httpx.get(f"{args.url}/v1/models", timeout=10, headers={
                "Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
            model = listing.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as err:
            raise ValueError(f"cannot list models at {args.url}: {err}") from err
    timeout = args.timeout if args.timeout is not None else args.duration + 120
    if len(workload) < FEW_REQUESTS:
        print(f"pdserve bench: warning: the window holds only {len(workload)} request(s); "
              f"the figures below say little (use a longer --duration or a higher "
              f"--rate-scale for at least {FEW_REQUESTS})", file=sys.stderr)
    if (note := session_replay_note(workload)) is not None:
        print(f"pdserve bench: warning: {note}", file=sys.stderr)
    if args.out:  # before the replay: an --out that cannot be a directory fails now
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"replaying {len(workload)} requests of {args.trace} over {workload.span_s:.0f}s "
          f"against {args.url} ({model})")
    requests = asyncio.run(replay(args.url, workload, model, timeout, args.max_in_flight,
                                  args.api_key or None))
    summary = summarize(requests, slo)
    print(format_summary(summary, slo, f"live replay against {args.url}"))
    if args.out:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                  if k != "handler"}
        write_summary_json(args.out / "summary.json", summary, config, None, {})
        write_requests_csv(args.out / "requests.csv", requests, slo)
        plots.plot_latency_cdfs(args.out / "latency_cdf.png", requests, slo,
                                f"live replay of {args.trace}")
        reported = write_report(args.out / "report.html", run_state(
            f"pdserve bench: {args.trace} against {args.url}", f"{len(requests)} requests "
            f"of {model}, rate scale {args.rate_scale:g}"
            f"{f' ramped to {args.ramp_to:g}' if args.ramp_to else ''}; SLO TTFT "
            f"{slo.ttft_s:g} s, TPOT {slo.tpot_s:g} s (a pdserve server shows its cluster at "
            "/dashboard)", requests,
            slo, cards=[("requests", str(summary.requests)),
                        ("completed", str(summary.completed)),
                        ("SLO attainment", f"{summary.slo_attainment:.1%}"),
                        ("throughput", f"{summary.throughput_rps:.2f} req/s")]))
        print(f"wrote {args.out}/: summary.json, requests.csv, latency_cdf.png"
              + (", report.html" if reported else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description="Serve LLMs with adaptive "
                                     "prefill/decode disaggregation; simulate policies on traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    _simulate_parser(sub)
    add_profile_parser(sub)
    add_serve_parser(sub)
    _bench_parser(sub)
    add_plan_parser(sub)
    add_predictor_parser(sub)
    add_ray_local_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ValueError as err:
        print(f"pdserve: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a path given that cannot be read or written (--out a file)
        print(f"pdserve: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pdserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
