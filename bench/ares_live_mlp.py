"""ARES live, with the hidden-state MLP trained on the served model deciding end to end.

Every contender is a fresh `pdserve serve` of the default model (SmolLM2-135M-Instruct on
the CPU), 1 prefill + 2 decode worker processes, a KV pool small enough per worker
(`--kv-blocks`) that decodes run out of it and preempt (the paper's memory-bound regime),
replayed over loopback (`pdserve/live/serve_and_replay.py`) with the same draws:

  ares-mlp            --policy ares, predictor hidden-state:PATH (`pdserve predictor train`)
  ares-history        --policy ares, predictor history (learned on each worker online)
  reschedule-current  ARES's rebalancing on current load, no prediction
  vllm                dispatch by current KV, no rebalancing

The workload is the shipped prompt set (`pdserve/predictor/prompts.py`), so output lengths
depend on the prompt: Poisson arrivals, each request a prompt drawn with replacement from
those the predictor never saw a generation of (`--prompts unseen`; `all` for every one),
chat-templated, sampled as the recording was (temperature 0.7, top-p 0.95, a seed per
request), ended by EOS or `--max-tokens`. A seed is one draw (prompts, arrivals, sampling
seeds), the same for every contender.

Per contender over the seeds: preemptions and migrations (the server's /metrics, read
before it stops), P99 TPOT, SLO attainment and completed requests (client-side), as mean
and Student-t 95 % interval (`planning/outcome.Interval.of`); ares-mlp against each other
contender is a win or a loss on a metric only when the intervals separate, else a tie.
Also the share of decode tokens the MLP forecast from its prior: a decode has no hidden
state until its first capture at k = 20 generated tokens.

SLOs from the profile of the model on this machine (`pdserve profile`'s quick grid, cached
under --out): TPOT SLO = `--tpot-slo-x` x a decode step of a full pool (`--max-batch-size`
sequences holding every KV block), TTFT SLO = `--ttft-slo-x` x a prefill of 512 tokens.
Every load loop is bounded: `--requests` per run, the replay's time limit, the server's
start-up limit.

    # the predictor: docs/results/ares_predictor.md (record, then train)
    PYTHONPATH=$PWD python bench/ares_live_mlp.py                     # full: 5 seeds
    PYTHONPATH=$PWD python bench/ares_live_mlp.py --quick --predictor P.pt --data D.npz
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from pdserve.engine.profile import QUICK_GRID, profile_engine
from pdserve.live.serve_and_replay import serve_and_replay
from pdserve.metrics.summary import output_count, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.planning.outcome import Interval
from pdserve.planning.verdict import LOSS, WIN, outcome_of
from pdserve.predictor.hidden_state import HiddenStatePredictor
from pdserve.predictor.prompt_workload import PromptWorkload, chat_encoder, unseen_prompts
from pdserve.predictor.prompts import Prompt, prompt_set
from pdserve.predictor.record import RecordedSet
from pdserve.types import SLO, Request

MODEL = "SmolLM2-135M-Instruct"
INSTANCES, DEPLOYMENT = 3, ("--prefill", "1", "--decode", "2")
PREDICTOR = Path("results/predictor/smollm2_all_k20.pt")
RECORDING = Path("results/predictor/smollm2_all_k20.npz")


@dataclass(frozen=True)
class Contender:
    label: str
    flags: tuple[str, ...]


def contenders(predictor: Path, horizon: int | None = None) -> tuple[Contender, ...]:
    """`horizon`: ARES's H in decode steps for both ares contenders (labelled -hH); None
    keeps the default (`ForecastSettings.horizon_steps`, 2000)."""
    h = () if horizon is None else ("--ares-horizon", str(horizon))
    tag = "" if horizon is None else f"-h{horizon}"
    return (Contender(f"ares-mlp{tag}", ("--policy", "ares", "--ares-predictor",
                                         f"hidden-state:{predictor.resolve()}", *h)),
            Contender(f"ares-history{tag}", ("--policy", "ares", "--ares-predictor", "history",
                                             *h)),
            Contender("reschedule-current", ("--policy", "reschedule-current")),
            Contender("vllm", ("--policy", "vllm")))


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    better: str  # "lower", "higher" or "" (reported, not judged)
    scale: float = 1.0  # printed as value x scale
    digits: int = 1


METRICS = (Metric("preemptions", "preemptions", "lower", digits=0),
           Metric("migrations", "migrations", "", digits=0),
           Metric("tpot_p99_s", "P99 TPOT ms", "lower", 1000.0),
           Metric("slo_attainment", "SLO attain %", "higher", 100.0),
           Metric("completed", "completed", "higher", digits=0))


@dataclass(frozen=True)
class RunResult:
    contender: str
    seed: int
    requests: int
    completed: int
    preemptions: float
    migrations: float
    tpot_p99_s: float
    ttft_p99_s: float
    slo_attainment: float
    output_tokens_mean: float
    before_capture_share: float  # of decode tokens, generated before the first capture
    wall_s: float
    load_1m: float  # the machine's load average as the run ended


def read_counters(base: str) -> dict[str, float]:
    """Preemptions (summed over the workers) and migrations from the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=30).text
    wanted = {"vllm:num_preemptions_total": "preemptions",
              "pdserve:migrations_total": "migrations"}
    found = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found[wanted[sample.name]] += sample.value
    return found


def before_capture_share(requests: list[Request], every_tokens: int) -> float:
    """Of the tokens the completed requests generated, the share generated before their
    first hidden-state capture (the g-th token, g = every_tokens): what the MLP forecast
    from its prior (the training median) rather than from a hidden state."""
    done = [output_count(r) for r in requests if r.finished]
    total = sum(done)
    return sum(min(g, every_tokens) for g in done) / total if total else math.nan


def run_one(contender: Contender, seed: int, draw: PromptWorkload, args: argparse.Namespace,
            perf_file: Path, slo: SLO, every_tokens: int) -> RunResult:
    counters: dict[str, float] = {}
    log = args.out / "logs" / f"{contender.label}-seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    requests = serve_and_replay(
        MODEL, INSTANCES, [*DEPLOYMENT, *contender.flags], perf_file, slo,
        draw.workload, args.timeout, args.kv_blocks, args.chunk_size, args.max_batch_size,
        server_log=log, body_of=draw.body,
        before_stop=lambda base: counters.update(read_counters(base)))
    wall_s = time.monotonic() - started
    summary = summarize(requests, slo)
    done = [r for r in requests if r.finished]
    return RunResult(contender.label, seed, summary.requests, summary.completed,
                     counters.get("preemptions", math.nan), counters.get("migrations", math.nan),
                     summary.tpot_s.p99, summary.ttft_s.p99, summary.slo_attainment,
                     statistics.fmean(output_count(r) for r in done) if done else math.nan,
                     before_capture_share(requests, every_tokens), wall_s,
                     os.getloadavg()[0])


def perf_profile(out: Path, kv_blocks: int) -> Path:
    """The model's quick-grid profile on this machine (cached: the first run measures it)."""
    path = out / f"perf-{kv_blocks}.json"
    if not path.is_file():
        started = time.monotonic()
        profile_engine(MODEL, kv_blocks, QUICK_GRID).save(path)
        print(f"profiled {MODEL} (quick grid) in {time.monotonic() - started:.0f} s: {path}")
    return path


def slo_from(perf: PerfModel, args: argparse.Namespace) -> SLO:
    full_pool = args.kv_blocks * 16
    return SLO(args.ttft_slo_x * perf.prefill.time_s(512, 512**2),
               args.tpot_slo_x * perf.decode.step_s(args.max_batch_size, full_pool))


def interval(results: list[RunResult], key: str) -> Interval:
    values = [float(getattr(r, key)) for r in results]
    return Interval.of(values) if all(math.isfinite(v) for v in values) else Interval(
        math.nan, math.nan, math.nan, len(values))


def verdict(first: Interval, other: Interval, better: str) -> str:
    """`first` against `other`: lower-is-better metrics win when `first` lies wholly below."""
    result = outcome_of(first, other) if better == "higher" else outcome_of(other, first)
    return {WIN: "win", LOSS: "loss"}.get(result, "tie")


def show(interval_: Interval, metric: Metric) -> str:
    mean = interval_.mean * metric.scale
    half = (interval_.high - interval_.low) / 2 * metric.scale
    if interval_.samples < 2:
        return f"{mean:.{metric.digits}f}"
    return f"{mean:.{metric.digits}f} +- {half:.{metric.digits}f}"


def report(results: list[RunResult], labels: list[str], seeds: int) -> dict[str, dict]:
    by = {label: [r for r in results if r.contender == label] for label in labels}
    table = {label: {m.key: interval(rows, m.key) for m in METRICS} for label, rows in
             by.items()}
    print(f"\nper contender, mean +- half the 95 % interval over {seeds} seed(s):")
    print(f"{'contender':<20}" + "".join(f"{m.label:>18}" for m in METRICS)
          + f"{'out tok':>9}{'wall s':>8}")
    for label in labels:
        rows = by[label]
        print(f"{label:<20}" + "".join(f"{show(table[label][m.key], m):>18}" for m in METRICS)
              + f"{statistics.fmean(r.output_tokens_mean for r in rows):>9.1f}"
              + f"{sum(r.wall_s for r in rows):>8.0f}")
    first = labels[0]
    if seeds < 3:
        print(f"\n{first} against the others: no verdict from {seeds} seed(s) (needs 3)")
        return {label: {k: asdict(v) for k, v in row.items()} for label, row in table.items()}
    print(f"\n{first} against each (win / loss only when the 95 % intervals separate):")
    for label in labels[1:]:
        calls = [f"{m.label} {verdict(table[first][m.key], table[label][m.key], m.better)}"
                 for m in METRICS if m.better]
        print(f"  vs {label:<20}" + ", ".join(calls))
    return {label: {k: asdict(v) for k, v in row.items()} for label, row in table.items()}


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The options of one run (shared with `ares_live_rounds.py`)."""
    parser.add_argument("--predictor", type=Path, default=PREDICTOR,
                        help=f"hidden-state predictor file [{PREDICTOR}]")
    parser.add_argument("--data", type=Path, default=RECORDING,
                        help=f"the recording it was trained on (for --prompts unseen) "
                        f"[{RECORDING}]")
    parser.add_argument("--prompts", choices=("unseen", "all"), default="unseen")
    parser.add_argument("--requests", type=int, default=120, help="per run [120]")
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals, req/s [1.0]")
    parser.add_argument("--max-tokens", type=int, default=256, help="output cap [256]")
    parser.add_argument("--kv-blocks", type=int, default=48,
                        help="KV blocks (16 tokens) per worker [48]")
    parser.add_argument("--max-batch-size", type=int, default=16, help="[16]")
    parser.add_argument("--chunk-size", type=int, default=512, help="[512]")
    parser.add_argument("--tpot-slo-x", type=float, default=2.0, help="[2]")
    parser.add_argument("--ttft-slo-x", type=float, default=10.0, help="[10]")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds a replay may take in all [900]")
    parser.add_argument("--perf-model", type=Path,
                        help="the profile to price with and set the SLOs from (an earlier "
                        "run's perf-N.json) [measured once per --out]")
    parser.add_argument("--ares-horizon", type=int, default=None,
                        help="ARES's horizon H (decode steps) for the ares contenders, "
                        "labelled -hH [the default, 2000]")


@dataclass(frozen=True)
class Setup:
    """What every run of a benchmark shares: the predictor, the prompts, the profile, SLOs."""

    predictor: HiddenStatePredictor
    every_tokens: int
    prompts: list[Prompt]
    kinds: dict[str, int]
    perf_file: Path
    slo: SLO

    @classmethod
    def of(cls, args: argparse.Namespace) -> Setup:
        predictor = HiddenStatePredictor.load(args.predictor)
        prompts = prompt_set()
        if args.prompts == "unseen":
            prompts = unseen_prompts(prompts, RecordedSet.load(args.data),
                                     int(predictor.meta.get("split_seed", 0)))
        kinds = {k: sum(p.kind == k for p in prompts) for k in ("short", "medium", "long")}
        perf_file = args.perf_model or perf_profile(args.out, args.kv_blocks)
        return cls(predictor, int(predictor.meta.get("every_tokens", 20)) or 20, prompts,
                   kinds, perf_file, slo_from(PerfModel.load(perf_file), args))

    def describe(self, args: argparse.Namespace) -> str:
        return (f"{MODEL}, 1P2D, {args.kv_blocks} KV blocks ({args.kv_blocks * 16} tokens) per "
                f"worker, max batch {args.max_batch_size}; {args.requests} requests per run at "
                f"{args.rate} req/s, cap {args.max_tokens} tokens, {len(self.prompts)} "
                f"{args.prompts} prompts {self.kinds}; SLO TTFT {self.slo.ttft_s:.2f} s, TPOT "
                f"{self.slo.tpot_s * 1000:.1f} ms; predictor {args.predictor} (k = "
                f"{self.every_tokens}, prior {self.predictor.prior_output_tokens:.0f} tokens)")


# what must match for an earlier run's contenders to join a report
SAME_SETTINGS = ("prompts", "requests", "rate", "max_tokens", "kv_blocks", "max_batch_size",
                 "chunk_size", "tpot_slo_x", "ttft_slo_x", "seeds")


def earlier_runs(path: Path, args: argparse.Namespace, slo: SLO) -> list[RunResult]:
    saved = json.loads(path.read_text())
    differ = [k for k in SAME_SETTINGS if saved["settings"].get(k) != getattr(args, k)]
    if saved["slo"] != {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}:
        differ.append("slo (pass its --perf-model)")
    if differ:
        raise SystemExit(f"{path} was run with other settings: {differ}")
    return [RunResult(**run) for run in saved["runs"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny: 8 requests, 1 seed, 48-token cap (the test suite's run)")
    add_run_args(parser)
    parser.add_argument("--seeds", type=int, default=5, help="draws [5]")
    parser.add_argument("--only", help="contenders, comma-separated")
    parser.add_argument("--with-runs", type=Path,
                        help="an earlier run's ares_live_mlp.json (the same settings): its "
                        "runs of the contenders not run now join the report")
    parser.add_argument("--out", type=Path, default=Path("results/ares_live_mlp"))
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.requests, args.max_tokens, args.timeout = 1, 8, 48, 300.0
    if args.seeds < 1 or args.requests < 1:
        parser.error("--seeds and --requests must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    setup = Setup.of(args)
    chosen = contenders(args.predictor, args.ares_horizon)
    earlier = earlier_runs(args.with_runs, args, setup.slo) if args.with_runs else []
    if args.only:
        names = args.only.split(",")
        chosen = tuple(c for c in chosen if c.label in names)
        if not chosen:
            parser.error(f"--only {args.only}: no such contender")
    encode = chat_encoder(MODEL)
    print(setup.describe(args), flush=True)
    results: list[RunResult] = []
    print(f"{'contender':<20}{'seed':>5}{'done':>9}{'preempt':>9}{'migr':>6}{'TPOT99 ms':>11}"
          f"{'TTFT99 s':>10}{'attain':>8}{'out tok':>9}{'prior %':>9}{'wall s':>8}{'load':>6}")
    for seed in range(args.seeds):
        draw = PromptWorkload.draw(setup.prompts, encode, args.requests, args.rate, seed,
                                   args.max_tokens)
        turn = seed % len(chosen)  # each seed starts with another contender: a drift in
        for contender in chosen[turn:] + chosen[:turn]:  # the machine's load spreads over all
            r = run_one(contender, seed, draw, args, setup.perf_file, setup.slo,
                        setup.every_tokens)
            results.append(r)
            print(f"{r.contender:<20}{r.seed:>5}{r.completed:>5}/{r.requests:<3}"
                  f"{r.preemptions:>9.0f}{r.migrations:>6.0f}{r.tpot_p99_s * 1000:>11.1f}"
                  f"{r.ttft_p99_s:>10.2f}{r.slo_attainment:>8.1%}{r.output_tokens_mean:>9.1f}"
                  f"{r.before_capture_share:>9.1%}{r.wall_s:>8.0f}{r.load_1m:>6.1f}",
                  flush=True)
    labels = [c.label for c in chosen]
    joined = [r for r in earlier if r.contender not in labels]
    labels += list(dict.fromkeys(r.contender for r in joined))
    table = report(results + joined, labels, args.seeds)
    wall_s = time.monotonic() - started
    out = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "slo": {"ttft_s": setup.slo.ttft_s, "tpot_s": setup.slo.tpot_s},
           "prompts": len(setup.prompts), "prompt_kinds": setup.kinds,
           "runs": [asdict(r) for r in results], "contenders": table, "wall_s": wall_s,
           "joined_runs_from": str(args.with_runs or "")}
    (args.out / "ares_live_mlp.json").write_text(json.dumps(out, indent=2, default=float)
                                                 + "\n")
    print(f"\ntotal {wall_s:.0f} s; wrote {args.out / 'ares_live_mlp.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
