"""Decisions against AIConfigurator's static estimate (issue 24): on a grid of questions
(model x input/output lengths x SLO pair x GPU, 8 GPUs each), the best aggregated and the best
disaggregated rate by AIConfigurator 0.12.0 (`aiconfigurator cli default`, measured vLLM
kernels, a static estimate: no arrivals, no queueing) and by pdserve's planner (colocated over
tensor-parallel degrees and chunk sizes; static-pd over degrees, one for both pools or one per
pool, splits and chunk sizes; goodput at 90 % attainment of both SLOs under Poisson arrivals
of fixed-length requests).

For each question:
  AIC       its CLI in a subprocess (offline: it ships its model configs and perf database);
            its best agg and disagg configuration and req/s parsed from its printed tables;
            answers cached in `--aic-cache` (`--reuse-aic` skips the CLI for cached ones)
  pdserve   `planning.planner.search` over the `colocated` and `static-pd` spaces with a
            time limit no run reaches (`NO_LIMIT_S`): the screen prices every candidate,
            the `--shortlist` best per space by the screen get a short simulation, each
            space's best short run `--seeds` long ones; the answer is independent of the
            machine's load. The runs are longer than the planner's (`_fidelities`: 240 s of
            arrivals and ten SLO lifetimes at least), so that they are stationary. Each
            answer says how many configurations it screened and simulated, and how many
            simulations its goodput searches took
  measured  (unless --no-explain) pdserve's best deployment of each side simulated at
            AIC's rate of that side (attainment, TTFT/TPOT P90, mean running batch and
            queue per instance) and, where AIC's batch exceeds pdserve's cap
            (`instance.max_batch_size`), with the cap raised to AIC's batch; at pdserve's
            own goodput over twice the length (stationary: the same attainment, all that
            arrives completes); `--steps-only` adds the decode step at AIC's batch: AIC's
            estimate, pdserve's kernels and the simulator's step

Agreement: both rates within `TOLERANCE` of AIC's and the same winner (req/s on the 8 GPUs).

    python bench/decision_grid.py --jobs 2 [--models llama-3.1-8b] [--gpus h100]
        [--lengths 1000:200] [--slos loose] [--half 0|1] [--reuse-aic] [--json FILE]
    python bench/decision_grid.py --steps-only [--half 0|1]   # needs aiconfigurator-core
    python bench/decision_grid.py --stationary 2 [--half 0|1]  # goodput over 2x longer runs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 0.15
NO_LIMIT_S = 1e6  # the search's time limit: never reached, so the machine's load cannot cut it
RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "fidelity"

AIC_MODELS = {  # pdserve's model name -> the model path AIConfigurator ships a config for
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}
AIC_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm"}
LENGTHS = ((1000, 200), (4000, 500))
# (name, TTFT s, TPOT s) per model: a loose and a tight pair, relaxed with the model's cost as
# a user of the larger model would set them: on one H100 under vLLM (measured kernels) a
# 4,000-token prefill takes 86 ms on the 8B (TP 1) and 258 ms on the 70B (TP 4, four GPUs),
# a decode step of 64 sequences at 4,250 tokens 18 and 24 ms; Qwen3-32B lies between
SLO_PAIRS: dict[str, tuple[tuple[str, float, float], ...]] = {
    "llama-3.1-8b": (("loose", 2.0, 0.100), ("tight", 1.0, 0.030)),
    "qwen3-32b": (("loose", 3.0, 0.100), ("tight", 1.5, 0.040)),
    "llama-3.1-70b": (("loose", 4.0, 0.150), ("tight", 2.0, 0.060)),
}
# mixtures of experts: asked only when named (`--models qwen3-30b-a3b`), so the grid of 24
# dense questions stays as recorded. Qwen3-30B-A3B costs about what the 8B does (on one
# H100 a 4,000-token prefill 74 ms, a decode step of 64 at 1,000 tokens 24 ms): its pairs
MOE_SLO_PAIRS: dict[str, tuple[tuple[str, float, float], ...]] = {
    "qwen3-30b-a3b": (("loose", 2.0, 0.100), ("tight", 1.0, 0.030)),
}
GPUS_PER_QUESTION = 8
SYNTHETIC_CAP = 400_000  # requests drawn at most per sample (the runs take what they need)


def _fidelities() -> tuple[Any, Any]:
    """The planner's two fidelities, lengthened until a run is stationary. The planner's
    defaults (`planning/planner.py`: short 20 s and long 40 s of arrivals, or half and two
    SLO lifetimes) are not: Llama-3.1-8B on 8 x H100, 1000/200 tokens, 8 x TP 1 colocated at
    261 req/s (its goodput by 40-s runs) attains 100 % over 40 s of arrivals, 47 % over 120 s
    and 23 % over 240 s, the queue growing all along; here a long run lasts 240 s and at
    least ten SLO lifetimes (output tokens x TPOT SLO), a short one 80 s and three"""
    from pdserve.planning.run_length import Fidelity

    return (Fidelity("short", duration_s=80.0, min_requests=1000, rel_tol=0.1, step=1.2,
                     lifetimes=3.0, ttft_overload=0.1),
            Fidelity("long", duration_s=240.0, min_requests=2000, rel_tol=0.04, step=1.15,
                     lifetimes=10.0, ttft_overload=0.04))
SPACES = {"agg": "colocated", "disagg": "static-pd"}


@dataclass(frozen=True)
class Question:
    model: str
    gpu: str
    input_tokens: int
    output_tokens: int
    slo: str  # "loose" or "tight"
    ttft_slo_s: float
    tpot_slo_s: float
    # attainment on TTFT until the decode instance's first token (the wait for a decode
    # slot counts: `slo.counts_decode_queue`), not until the prefill's
    counts_decode_queue: bool = False

    @property
    def aic_key(self) -> str:
        """The question as AIC is asked it (it has no queue: one answer for both
        definitions)."""
        return (f"{self.model}/{self.gpu}/{self.input_tokens}:{self.output_tokens}/"
                f"{self.ttft_slo_s:g}s:{self.tpot_slo_s * 1000:g}ms")

    @property
    def key(self) -> str:
        return self.aic_key + ("/decode-queue" if self.counts_decode_queue else "")

    def aic_command(self) -> list[str]:
        return ["aiconfigurator", "cli", "default", "--model-path", AIC_MODELS[self.model],
                "--total-gpus", str(GPUS_PER_QUESTION), "--system", AIC_SYSTEMS[self.gpu],
                "--backend", "vllm", "--isl", str(self.input_tokens),
                "--osl", str(self.output_tokens), "--ttft", f"{self.ttft_slo_s * 1000:g}",
                "--tpot", f"{self.tpot_slo_s * 1000:g}"]


def questions(models: list[str] | None = None, gpus: list[str] | None = None,
              lengths: list[tuple[int, int]] | None = None,
              slos: list[str] | None = None, half: int | None = None,
              counts_decode_queue: bool = False) -> list[Question]:
    """The grid, model by model (each filter: None keeps every level). `half` 0 or 1: one of
    two complementary halves of 12 questions, each with every model at every length and SLO
    pair, the GPU alternating across them, so every level of every factor appears in both
    and each model meets each GPU twice."""
    found = []
    for m, (model, pairs) in enumerate({**SLO_PAIRS, **MOE_SLO_PAIRS}.items()):
        if (models and model not in models) or (model in MOE_SLO_PAIRS and not models):
            continue
        for li, (isl, osl) in enumerate(LENGTHS):
            if lengths and (isl, osl) not in lengths:
                continue
            for si, (name, ttft_s, tpot_s) in enumerate(pairs):
                if slos and name not in slos:
                    continue
                for g, gpu in enumerate(AIC_SYSTEMS):
                    if half is not None and (m + 2 * li + si + g) % 2 != half:
                        continue
                    if not gpus or gpu in gpus:
                        found.append(Question(model, gpu, isl, osl, name, ttft_s, tpot_s,
                                              counts_decode_queue))
    return found


# ---- AIConfigurator ----
@dataclass(frozen=True)
class AicConfig:
    """One row of AIC's top-configurations table."""

    rps: float  # req/s on the GPUs it uses
    tokens_per_s_gpu: float
    tpot_ms: float  # 1000 / tokens/s/user
    ttft_ms: float
    gpus_used: int
    replicas: int
    describe: str
    decode_tp: int
    decode_batch: int  # per decode worker (agg: per worker)


@dataclass(frozen=True)
class AicAnswer:
    agg: AicConfig | None  # None: no configuration meets the SLOs
    disagg: AicConfig | None
    winner: str  # "agg" or "disagg", as AIC's summary line says
    agg_configs: int  # configurations its experiments evaluated
    disagg_configs: int
    wall_s: float = math.nan

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> AicAnswer:
        sides = {k: AicConfig(**raw[k]) if raw[k] else None for k in ("agg", "disagg")}
        return cls(**{**raw, **sides})


def _first_int(cell: str) -> int:
    return int(re.match(r"\s*(\d+)", cell).group(1))  # type: ignore[union-attr]


def _tp(cell: str) -> int:
    return int(re.match(r"tp(\d+)", cell).group(1))  # type: ignore[union-attr]


def _layout(cell: str) -> str:
    """"TP2", or the whole cell where it has attention data parallelism or expert
    parallelism (MoE: "tp1pp1dp4etp4ep1"), which pdserve's deployments do not have."""
    degrees = dict(re.findall(r"(etp|tp|pp|dp|ep)(\d+)", cell))
    if degrees.get("dp", "1") != "1" or degrees.get("ep", "1") != "1":
        return cell
    return f"TP{_tp(cell)}"


def _table(text: str, title: str) -> list[dict[str, str]]:
    """The rows of the table printed after `title` ("agg Top Configurations"), by column."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(title)), None)
    if start is None:
        return []
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("+"):
            continue
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    if not rows:
        return []
    header, *body = rows
    return [dict(zip(header, row, strict=True)) for row in body]


def _config(row: dict[str, str], disaggregated: bool) -> AicConfig:
    per_user = float(row["tokens/s/user"])
    replicas = int(row["replicas"])
    if disaggregated:
        d_tp = _tp(row["(d)parallel"])
        describe = (f"{replicas} x ({row['(p)workers']}P {_layout(row['(p)parallel'])} + "
                    f"{row['(d)workers']}D {_layout(row['(d)parallel'])}), decode bs "
                    f"{row['(d)bs']}")
        batch = int(row["(d)bs"])
    else:
        d_tp, batch = _tp(row["parallel"]), int(row["bs"])
        describe = f"{replicas} x {_layout(row['parallel'])}, bs {batch}"
    return AicConfig(float(row["req/s"]), float(row["tokens/s/gpu"]),
                     1000.0 / per_user if per_user > 0 else math.inf, float(row["TTFT"]),
                     _first_int(row["total_gpus (used)"]), replicas, describe, d_tp, batch)


def parse_aic(text: str) -> AicAnswer:
    """AIC's answer from what `aiconfigurator cli default` prints: each mode's rank-1 row, the
    winner from its 'Best Experiment Chosen' line, the configurations each experiment
    evaluated from its 'Experiment X completed with N results' lines."""
    sides = {}
    for side in ("agg", "disagg"):
        rows = _table(text, f"{side} Top Configurations")
        sides[side] = _config(rows[0], side == "disagg") if rows else None
    chosen = re.search(r"Best Experiment Chosen: (\w+)", text)
    if chosen is None:
        raise ValueError("no 'Best Experiment Chosen' line in AIConfigurator's output")
    counts = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"Experiment (\w+) completed with (\d+) results", text)}
    return AicAnswer(sides["agg"], sides["disagg"], chosen.group(1), counts.get("agg", 0),
                     counts.get("disagg", 0))


def run_aic(question: Question) -> tuple[AicAnswer, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    started = time.perf_counter()
    done = subprocess.run(question.aic_command(), capture_output=True, text=True, env=env,
                          check=False)
    text = done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(f"{' '.join(question.aic_command())} failed:\n{text[-2000:]}")
    answer = parse_aic(text)
    return AicAnswer(**{**asdict(answer), "agg": answer.agg, "disagg": answer.disagg,
                        "wall_s": time.perf_counter() - started}), text


# ---- pdserve ----
def base_config(question: Question, requests: int = SYNTHETIC_CAP) -> Any:
    from pdserve.planning.planner import plan_defaults

    return plan_defaults().with_values({
        "workload.trace": "synthetic",
        "workload.synthetic_lengths": f"fixed:{question.input_tokens}:{question.output_tokens}",
        "workload.synthetic_requests": requests, "perf.model": question.model,
        "perf.gpu": question.gpu, "slo.ttft_s": question.ttft_slo_s,
        "slo.tpot_s": question.tpot_slo_s,
        "slo.counts_decode_queue": question.counts_decode_queue})


def plan_question(question: Question, jobs: int, shortlist: int, seeds: int
                  ) -> dict[str, Any]:
    """pdserve's best per side: the planner's row of each space."""
    from pdserve.planning.multi_fidelity import SearchBudget
    from pdserve.planning.outcome import policy_rows
    from pdserve.planning.planner import search

    started = time.perf_counter()
    short, long = _fidelities()
    budget = SearchBudget(NO_LIMIT_S, jobs, shortlist, len(SPACES), seeds, short, long)
    outcome, screened = search(base_config(question), ",".join(SPACES.values()),
                               GPUS_PER_QUESTION, budget)
    assert not outcome.stopped_at_limit
    rows = {row.space: row for row in policy_rows(outcome, long.rel_tol)}
    answer: dict[str, Any] = {"wall_s": time.perf_counter() - started, "screened": screened}
    for side, space in SPACES.items():
        row = rows.get(space)
        records = [r for r in outcome.records if r.candidate.space == space]
        runs = sum(t.runs for r in records for t in ([r.short] if r.short else []) + r.long)
        answer[side] = None if row is None else {
            "rps": row.goodput.mean, "low_rps": row.goodput.low, "high_rps": row.goodput.high,
            "fidelity": row.fidelity, "describe": row.candidate.describe(),
            "values": dict(row.candidate.values), "tp": _degree(row.candidate, decode=True),
            "prefill_tp": _degree(row.candidate, decode=False),
            "ttft_p90_s": row.ttft_p90_s, "tpot_p90_s": row.tpot_p90_s,
            "screened": row.screened, "simulated": row.simulated, "simulations": runs}
    return answer


def _degree(candidate: Any, decode: bool) -> int:
    """The degree of the candidate's decoding (or its prefilling) instances: one degree for
    all on the same-degree grid, one per pool on a mixed-degree deployment."""
    return next(g.tp for g in candidate.deployment.groups
                if (g.decode if decode else g.prefill))


def run_scale(question: Question) -> Any:
    """The question's run lengths' measures: a request's lifetime at the TPOT SLO (output
    tokens x TPOT SLO), the TTFT SLO, 90 % attainment."""
    from pdserve.planning.run_length import RunScale

    return RunScale(question.output_tokens * question.tpot_slo_s, question.ttft_slo_s, 0.9)


def at_rate(question: Question, values: dict[str, Any], rate_rps: float,
            extra: dict[str, Any] | None = None, longer: float = 1.0) -> dict[str, Any]:
    """pdserve's deployment (`values`) simulated at `rate_rps`, `longer` times as long as
    the long runs (seed 0): attainment, latencies, the running batch and queue per
    instance."""
    from pdserve.sim.runner import Experiment

    count = round(longer * _fidelities()[1].requests(rate_rps, run_scale(question)))
    config = base_config(question, count).with_values(
        {**values, "workload.synthetic_rate_rps": rate_rps, **(extra or {})})
    experiment = Experiment.from_config(config)
    result = experiment.simulate()
    summary = experiment.summarize(result)
    middle = [s for s in result.samples if 0.25 * result.end_s <= s.time_s <= 0.75 * result.end_s]
    serving = [i for i in range(len(middle[0].running)) if any(s.running[i] for s in middle)
               ] if middle else []

    def mean_of(field: str) -> float:
        cells = [getattr(s, field)[i] for s in middle for i in serving]
        return sum(cells) / len(cells) if cells else math.nan

    return {"rate_rps": rate_rps, "requests": count, "attainment": summary.slo_attainment,
            "ttft_attainment": summary.ttft_attainment,
            "tpot_attainment": summary.tpot_attainment,
            "ttft_p50_s": summary.ttft_s.p50, "ttft_p90_s": summary.ttft_s.p90,
            "tpot_p50_s": summary.tpot_s.p50, "tpot_p90_s": summary.tpot_s.p90,
            "throughput_rps": summary.throughput_rps, "preemptions": summary.preemptions,
            "running_mean": mean_of("running"), "waiting_mean": mean_of("waiting"),
            "max_batch_size": config.instance.max_batch_size}


def goodput_longer(question: Question, values: dict[str, Any], guess_rps: float,
                   longer: float) -> dict[str, Any]:
    """The goodput of pdserve's deployment (`values`) by runs `longer` times as long as the
    long runs (seed 0), searched from `guess_rps` to the long runs' tolerance: a stationary
    answer does not move."""
    from pdserve.metrics.goodput import search_goodput
    from pdserve.sim.runner import Experiment

    long = _fidelities()[1]
    started = time.perf_counter()

    def run(scale: float) -> Any:
        rate_rps = scale * guess_rps
        count = round(longer * long.requests(rate_rps, run_scale(question)))
        experiment = Experiment.from_config(base_config(question, count).with_values(
            {**values, "workload.synthetic_rate_rps": rate_rps}))
        return experiment.summarize(experiment.simulate())

    result = search_goodput(run, guess_rps, 0.9, long.rel_tol, max_doublings=8,
                            step=long.step)
    return {"longer": longer, "rps": result.rate_rps, "runs": len(result.points),
            "wall_s": time.perf_counter() - started}


def _stationary_task(task: tuple[Question, str, dict[str, Any], float, float]
                     ) -> tuple[str, str, dict[str, Any]]:
    question, side, values, guess_rps, longer = task
    return question.key, side, goodput_longer(question, values, guess_rps, longer)


def add_stationary(grid: list[Question], record: dict[str, Any], jobs: int,
                   longer: float, save: Any) -> None:
    """`goodput_longer` of each side of each recorded question, `jobs` at a time, the
    record saved (`save(record)`) after each."""
    import multiprocessing

    tasks = [(q, side, ours["values"], ours["rps"], longer) for q in grid
             if (entry := record.get(q.key)) for side in SPACES
             if (ours := entry["pdserve"][side]) and ours["rps"] > 0]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for key, side, found in pool.imap_unordered(_stationary_task, tasks):
            record[key].setdefault("measured", {}).setdefault(side, {})[
                "goodput_longer"] = found
            ours = record[key]["pdserve"][side]["rps"]
            print(f"{key} {side}: goodput {ours:.1f} req/s, {longer:g}x as long "
                  f"{found['rps']:.1f} ({found['rps'] / ours - 1:+.1%}; {found['runs']} runs, "
                  f"{found['wall_s']:.0f} s)", flush=True)
            save(record)


def decode_step_ms(question: Question, tp: int, batch: int) -> float:
    """pdserve's decode step (the simulator's model, host overhead included) of `batch`
    sequences halfway through their output, on one instance of degree `tp`."""
    from pdserve.perf.presets import perf_model

    context = batch * (question.input_tokens + question.output_tokens // 2)
    return 1000 * perf_model(question.model, question.gpu, tp, max_batch_size=batch
                             ).decode.step_s(batch, context)


def step_comparison(question: Question, aic: AicConfig, disaggregated: bool,
                    mixed: tuple[int, int] | None = None) -> dict[str, Any]:
    """A decode step of AIC's decode batch, halfway through the output, at AIC's decode
    degree: AIC's own estimate (`EngineHandle.predict_decode_latency`), pdserve's kernels
    alone (host overhead none, as AIC counts none) and pdserve's step as the simulator
    prices it (the engine's host overhead, the fitted runtime model), in ms; with `mixed`
    (chunk tokens, decodes) also a mixed step (AIC: `mixed_step_latency`)."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    from pdserve.perf.kernel_tables import shipped_tables
    from pdserve.perf.presets import measured

    kernels = measured(question.model, question.gpu, aic.decode_tp, "vllm", host="none")
    version = kernels.ops.name.split("@")[1]
    moe = {"moe_tp_size": aic.decode_tp} if kernels.model.experts else {}
    engine = EngineHandle.compile(AIC_MODELS[question.model],
                                  shipped_tables(kernels.ops.gpu.name).meta["aic_system"],
                                  "vllm", backend_version=version, tp_size=aic.decode_tp, **moe)
    batch, context = aic.decode_batch, question.input_tokens + question.output_tokens // 2
    found = {"batch": batch, "context_tokens": context, "tp": aic.decode_tp,
             "aic_step_ms": float(engine.predict_decode_latency(batch, context)),
             "pd_kernels_ms": 1000 * kernels.decode_step_s(batch, batch * context),
             "pd_sim_step_ms": decode_step_ms(question, aic.decode_tp, batch),
             "aic_tpot_ms": aic.tpot_ms}
    # AIC's own steps one after the other: each request's prefill alone, then its share of
    # `osl` decode steps of AIC's batch, per replica (against AIC's reported rate)
    if not disaggregated:
        request_ms = (float(engine.predict_prefill_latency(1, question.input_tokens))
                      + question.output_tokens * found["aic_step_ms"] / batch)
        found["aic_serial_rps"] = 1000 * aic.replicas / request_ms
    if mixed is not None:  # a chunk of a prompt and `batch` decodes in one step
        from pdserve.perf.presets import perf_model
        from pdserve.types import attn_units

        chunk, batch = mixed
        runtime = perf_model(question.model, question.gpu, aic.decode_tp, max_batch_size=batch)
        found["mixed"] = {
            "chunk_tokens": chunk, "batch": batch,
            "aic_ms": float(engine.mixed_step_latency(
                chunk, batch, question.input_tokens, question.output_tokens)),
            "pd_kernels_ms": 1000 * kernels.pass_s([(chunk, 0)], batch, batch * context),
            "pd_sim_step_ms": 1000 * runtime.batch_time_s(batch, batch * context, chunk,
                                                          attn_units(chunk, 0))}
    return found


def explain(question: Question, aic: AicAnswer, pd: dict[str, Any]) -> dict[str, Any]:
    """The measurements behind a comparison, per side."""
    found: dict[str, Any] = {}
    for side in SPACES:
        theirs, ours = getattr(aic, side), pd[side]
        if theirs is None or ours is None:
            continue
        entry = {"at_aic_rate": at_rate(question, ours["values"], theirs.rps),
                 "pd_decode_step_ms_at_aic_batch": decode_step_ms(
                     question, theirs.decode_tp, theirs.decode_batch),
                 "aic_tpot_ms": theirs.tpot_ms}
        cap = base_config(question).instance.max_batch_size
        if theirs.decode_batch > cap:
            entry["at_aic_rate_aic_batch"] = at_rate(
                question, ours["values"], theirs.rps,
                {"instance.max_batch_size": theirs.decode_batch})
        # stationary: at pdserve's goodput, a run twice as long attains as much
        entry["at_pd_goodput_2x_long"] = at_rate(question, ours["values"], ours["rps"],
                                                 longer=2.0)
        found[side] = entry
    return found


# ---- the grid ----
def compare(aic: AicAnswer, pd: dict[str, Any]) -> dict[str, Any]:
    ratios = {side: (pd[side]["rps"] / getattr(aic, side).rps
                     if pd[side] and getattr(aic, side) else math.nan) for side in SPACES}
    pd_winner = ("agg" if (pd["agg"] or {}).get("rps", 0) >= (pd["disagg"] or {}).get("rps", 0)
                 else "disagg")
    within = all(abs(r - 1) <= TOLERANCE for r in ratios.values())
    return {"ratio_agg": ratios["agg"], "ratio_disagg": ratios["disagg"],
            "within_tolerance": within, "pd_winner": pd_winner,
            "same_winner": pd_winner == aic.winner, "agree": within and pd_winner == aic.winner}


def _rps(side: Any) -> str:
    if side is None:
        return "-"
    return f"{side.rps if hasattr(side, 'rps') else side['rps']:.1f}"


def print_row(question: Question, aic: AicAnswer, pd: dict[str, Any],
              verdict: dict[str, Any]) -> None:
    print(f"{question.key}: AIC agg {_rps(aic.agg)} disagg {_rps(aic.disagg)} winner "
          f"{aic.winner} | pdserve agg {_rps(pd['agg'])} disagg {_rps(pd['disagg'])} winner "
          f"{verdict['pd_winner']} | ratio agg {verdict['ratio_agg']:.2f} disagg "
          f"{verdict['ratio_disagg']:.2f} | agree {'yes' if verdict['agree'] else 'no'}",
          flush=True)
    for side in SPACES:
        theirs, ours = getattr(aic, side), pd[side]
        print(f"    {side:6} AIC {theirs.describe if theirs else '-'} | pdserve "
              + (f"{ours['describe']} ({ours['fidelity']}; {ours['simulated']} of "
                 f"{ours['screened']} simulated, {ours['simulations']} runs)" if ours else "-"),
              flush=True)


def print_table(results: list[dict[str, Any]]) -> None:
    print("\n| question | AIC agg | AIC disagg | AIC winner | pdserve agg | pdserve disagg "
          "| pdserve winner | agg ratio | disagg ratio | agree |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        aic, pd, v = r["aic"], r["pdserve"], r["verdict"]
        cells = [r["question"], _rps_raw(aic["agg"]), _rps_raw(aic["disagg"]), aic["winner"],
                 _rps_raw(pd["agg"]), _rps_raw(pd["disagg"]), v["pd_winner"],
                 f"{v['ratio_agg']:.2f}", f"{v['ratio_disagg']:.2f}",
                 "yes" if v["agree"] else ("winner only" if v["same_winner"] else "no")]
        print("| " + " | ".join(cells) + " |")
    print_measured(results)
    within = sum(r["verdict"]["within_tolerance"] for r in results)
    same = sum(r["verdict"]["same_winner"] for r in results)
    print(f"\n{within} of {len(results)} within {TOLERANCE:.0%} on both sides, {same} of "
          f"{len(results)} the same winner")


def print_measured(results: list[dict[str, Any]]) -> None:
    """Per question and side: pdserve's deployment at AIC's rate (attainment, TPOT P90 / AIC's
    TPOT, mean running batch / AIC's batch), at its own goodput over twice the length
    (attainment, completed / offered rate), and the decode step at AIC's batch."""
    print("\n| question | side | pdserve at AIC's rate: attainment, TPOT P90 (AIC's TPOT), "
          "running batch (AIC's) | pdserve's goodput, 2x as long: attainment, completed/offered"
          " | decode step at AIC's batch (mixed: pdserve's chunk + its batch at AIC's rate): "
          "AIC / pdserve kernels / simulator, ms |")
    print("|---|---|---|---|---|")
    for r in results:
        for side in SPACES:
            m = r.get("measured", {}).get(side)
            aic = r["aic"][side]
            if not m or not aic or "at_aic_rate" not in m:
                continue
            at, twice = m["at_aic_rate"], m["at_pd_goodput_2x_long"]
            steps = m.get("steps")
            step_cell = (f"B={steps['batch']}: {steps['aic_step_ms']:.1f} / "
                         f"{steps['pd_kernels_ms']:.1f} / {steps['pd_sim_step_ms']:.1f}"
                         if steps else "-")
            if steps and (mix := steps.get("mixed")):
                step_cell += (f"; mixed {mix['chunk_tokens']} + B={mix['batch']}: "
                              f"{mix['aic_ms']:.1f} / {mix['pd_kernels_ms']:.1f} / "
                              f"{mix['pd_sim_step_ms']:.1f}")
            again = m.get("goodput_longer")
            again_cell = (f"; goodput {again['rps']:.1f} "
                          f"({again['rps'] / r['pdserve'][side]['rps'] - 1:+.0%})"
                          if again else "")
            print(f"| {r['question']} | {side} | {at['attainment']:.0%}, "
                  f"{1000 * at['tpot_p90_s']:.1f} ms ({aic['tpot_ms']:.1f}), "
                  f"{at['running_mean']:.0f} ({aic['decode_batch']}) | "
                  f"{twice['attainment']:.0%}, "
                  f"{twice['throughput_rps'] / twice['rate_rps']:.2f}{again_cell} | "
                  f"{step_cell} |")


def add_steps(grid: list[Question], record: dict[str, Any]) -> None:
    """`step_comparison` of each side of each recorded question, printed."""
    import logging

    logging.disable(logging.WARNING)  # AIC's loading messages
    print("decode step at AIC's batch, ms: AIC's estimate / pdserve's kernels / pdserve's "
          "simulator (host overhead, fitted); AIC's TPOT")
    for question in grid:
        entry = record.get(question.key)
        if entry is None:
            continue
        aic = AicAnswer.from_json(entry["aic"])
        for side in SPACES:
            theirs = getattr(aic, side)
            if theirs is None:
                continue
            ours = entry["pdserve"][side]
            at = entry.get("measured", {}).get(side, {}).get("at_aic_rate")
            mixed = ((ours["values"]["instance.chunk_size_tokens"],
                      max(1, round(at["running_mean"])))
                     if side == "agg" and ours and at and ours["tp"] == theirs.decode_tp
                     else None)
            steps = step_comparison(question, theirs, side == "disagg", mixed)
            entry.setdefault("measured", {}).setdefault(side, {})["steps"] = steps
            print(f"{question.key} {side:6} B={steps['batch']} TP{steps['tp']}: "
                  f"{steps['aic_step_ms']:.1f} / {steps['pd_kernels_ms']:.1f} / "
                  f"{steps['pd_sim_step_ms']:.1f}; {steps['aic_tpot_ms']:.1f}"
                  + (f"; serial {serial:.1f} req/s (AIC {theirs.rps:.1f})"
                     if (serial := steps.get("aic_serial_rps")) else "")
                  + (f"; mixed {m['chunk_tokens']} + B={m['batch']}: {m['aic_ms']:.1f} / "
                     f"{m['pd_kernels_ms']:.1f} / {m['pd_sim_step_ms']:.1f}"
                     if (m := steps.get("mixed")) else ""))


def _rps_raw(side: dict[str, Any] | None) -> str:
    return "-" if not side else f"{side['rps']:.1f}"


def _lengths(text: str) -> tuple[int, int]:
    isl, osl = text.split(":")
    return int(isl), int(osl)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", help=f"of {list(SLO_PAIRS)} [all]; the "
                        f"mixtures of experts {list(MOE_SLO_PAIRS)} only when named")
    parser.add_argument("--gpus", nargs="*", help=f"of {list(AIC_SYSTEMS)} [all]")
    parser.add_argument("--lengths", nargs="*", type=_lengths, help="e.g. 1000:200 [all]")
    parser.add_argument("--slos", nargs="*", help="loose, tight [both]")
    parser.add_argument("--half", type=int, choices=(0, 1),
                        help="one of two complementary 12-question halves covering every "
                        "level of every factor [the whole grid]")
    parser.add_argument("--skip-done", action="store_true",
                        help="skip the questions already in --json")
    parser.add_argument("--jobs", type=int, default=2, help="simulations in parallel [2]")
    parser.add_argument("--shortlist", type=int, default=4,
                        help="short simulations per side, the screen's best [4]")
    parser.add_argument("--seeds", type=int, default=2,
                        help="long runs of each side's best short run [2]")
    parser.add_argument("--aic-cache", type=Path, default=RESULTS / "aic_decisions.json")
    parser.add_argument("--reuse-aic", action="store_true",
                        help="take AIC's answer from --aic-cache where it has one")
    parser.add_argument("--counts-decode-queue", action="store_true",
                        help="judge attainment on TTFT until the decode instance's first "
                        "token (the wait for a decode slot counts); recorded under its own "
                        "keys")
    parser.add_argument("--no-explain", action="store_true",
                        help="skip the runs at AIC's rates")
    parser.add_argument("--steps-only", action="store_true",
                        help="add the decode-step comparison at AIC's batches to the "
                        "questions in --json, and print its table; nothing else runs")
    parser.add_argument("--stationary", type=float, metavar="K",
                        help="search the goodput of each recorded answer again by runs K "
                        "times as long, and record it; nothing else runs")
    parser.add_argument("--json", type=Path, default=RESULTS / "decision_grid.json",
                        help="the grid's record (questions already in it are kept)")
    args = parser.parse_args()
    grid = questions(args.models, args.gpus, args.lengths, args.slos, args.half,
                     args.counts_decode_queue)
    cache: dict[str, Any] = (json.loads(args.aic_cache.read_text())
                             if args.aic_cache.exists() else {})
    record: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    if args.stationary:
        add_stationary(grid, record, args.jobs, args.stationary,
                       lambda done: args.json.write_text(json.dumps(done, indent=1) + "\n"))
        return
    if args.steps_only:
        add_steps(grid, record)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print_table([record[q.key] for q in grid if q.key in record])
        return
    started = time.perf_counter()
    print(f"{len(grid)} questions, {GPUS_PER_QUESTION} GPUs each; pdserve: shortlist "
          f"{args.shortlist} per side, {args.seeds} long seeds, {args.jobs} processes",
          flush=True)
    for question in grid:
        if args.skip_done and question.key in record:
            continue
        if args.reuse_aic and question.aic_key in cache:
            aic = AicAnswer.from_json(cache[question.aic_key])
        else:
            aic, _ = run_aic(question)
            cache[question.aic_key] = asdict(aic)
            args.aic_cache.parent.mkdir(parents=True, exist_ok=True)
            args.aic_cache.write_text(json.dumps(cache, indent=1) + "\n")
        pd = plan_question(question, args.jobs, args.shortlist, args.seeds)
        verdict = compare(aic, pd)
        print_row(question, aic, pd, verdict)
        entry = {"question": question.key, "spec": asdict(question), "aic": asdict(aic),
                 "pdserve": pd, "verdict": verdict}
        if not args.no_explain:
            entry["measured"] = explain(question, aic, pd)
        print(f"    pdserve {pd['wall_s']:.0f} s, AIC {aic.wall_s:.0f} s; "
              f"{time.perf_counter() - started:.0f} s so far", flush=True)
        record[question.key] = entry
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    print_table([record[q.key] for q in grid])
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
