"""Why ARES moves what it moves, live: each rebalancing round of a `bench/ares_live_mlp.py` run.

The same server, deployment and draw as one run of `ares_live_mlp.py` (its options), but
the server runs in this process so its rebalancer can be read: for every round (1 s), whether
a decode worker was overloaded (Alg. 1 line 14), whether another was underloaded (line 15:
its current KV tokens under (1 + θ) x the mean predicted load: a target), how many
candidates passed Alg. 1's checks
(`policies/ares/candidates.py`: lines 20-21 and the forecast horizon's memory safety), how
many would have passed with the targets' KV capacity taken away (so the difference is what
the memory checks refused), whether a decode worker's KV was over 90 % full, and whether
the round migrated. The candidate counts here ignore the 10-round cool-down of a request
just moved (the round itself applies it).

    PYTHONPATH=$PWD python bench/ares_live_rounds.py --contender ares-mlp --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import uvicorn
from ares_live_mlp import (
    DEPLOYMENT,
    INSTANCES,
    MODEL,
    Setup,
    add_run_args,
    contenders,
    read_counters,
)

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.live.replay_client import free_port, replay, wait_until_healthy
from pdserve.metrics.summary import summarize
from pdserve.policies.ares.candidates import enumerate_candidates
from pdserve.policies.ares.classification import classify
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.predictor.prompt_workload import PromptWorkload, chat_encoder
from pdserve.server.launch import build_app
from pdserve.server.serve_cli import add_serve_parser, serve_config

UNBOUNDED_TOKENS = 1 << 60
FULL = 0.9  # a worker counts as full from this share of its KV blocks


@dataclass(frozen=True)
class RoundTally:
    overloaded: bool
    target: bool  # an underloaded worker besides an overloaded one
    mean_load: float  # w̄: the decode workers' mean (time-weighted, predicted) load, tokens
    lightest_now: int  # the fewest current KV tokens on a decode worker
    full: bool  # some decode worker's current KV >= FULL of its capacity
    candidates: int  # passing every check of Alg. 1
    without_memory_checks: int  # passing with unbounded targets
    migrated: bool


def count_rounds(rebalancer: AresRebalancer) -> list[RoundTally]:
    """Wraps `rebalancer.round`; the list fills as rounds run."""
    tallies: list[RoundTally] = []
    decide = rebalancer.round
    settings = rebalancer.settings

    def counted(view: ClusterView, board: RoleBoard):  # type: ignore[no-untyped-def]
        states = rebalancer.states(view, board)
        classes = classify(states, settings.theta, settings.memory_guard)
        links = rebalancer.link_costs(view)
        per_token = rebalancer.perf.kv_bytes_per_token

        def cost(source: int, target: int, tokens: int) -> float:
            return links.time_s(source, target, tokens * per_token)

        found = free = 0
        target = any(t != o for o in classes.overloaded for t in classes.underloaded)
        if classes.overloaded and len(states) >= 2:
            found = len(enumerate_candidates(states, classes, cost, rebalancer.offsets))
            unbounded = {i: replace(s, capacity_tokens=UNBOUNDED_TOKENS)
                         for i, s in states.items()}
            free = len(enumerate_candidates(unbounded, classes, cost, rebalancer.offsets))
        full = any(s.current_tokens >= FULL * s.capacity_tokens for s in states.values())
        action = decide(view, board)
        lightest = min((s.current_tokens for s in states.values()), default=0)
        tallies.append(RoundTally(bool(classes.overloaded), target, classes.mean_load,
                                  lightest, full, found, free, action is not None))
        return action

    rebalancer.round = counted  # type: ignore[method-assign]
    return tallies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(parser)
    parser.add_argument("--contender", default="ares-mlp",
                        help="ares-mlp, ares-history (-hH with --ares-horizon H) or "
                        "reschedule-current [ares-mlp]")
    parser.add_argument("--seed", type=int, default=0, help="the draw [0]")
    parser.add_argument("--out", type=Path, default=Path("results/ares_live_mlp"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setup = Setup.of(args)
    chosen = [c for c in contenders(args.predictor, args.ares_horizon)
              if c.label == args.contender and c.label != "vllm"]
    if not chosen:
        parser.error(f"--contender {args.contender}: not a rebalancing contender here")
    contender = chosen[0]
    draw = PromptWorkload.draw(setup.prompts, chat_encoder(MODEL), args.requests, args.rate,
                               args.seed, args.max_tokens)
    print(setup.describe(args), flush=True)
    serve = argparse.ArgumentParser()
    add_serve_parser(serve.add_subparsers(dest="command"))
    port = free_port()
    config = serve_config(serve.parse_args([
        "serve", "--model", MODEL, "--instances", str(INSTANCES), *DEPLOYMENT,
        *contender.flags, "--port", str(port), "--perf-model", str(setup.perf_file),
        "--kv-blocks", str(args.kv_blocks), "--chunk-size", str(args.chunk_size),
        "--max-batch-size", str(args.max_batch_size), "--ttft-slo", str(setup.slo.ttft_s),
        "--tpot-slo", str(setup.slo.tpot_s), "--log-level", "warning"]))
    app = build_app(config)
    rebalancer = app.state.driver.scheduler.policy.rebalancer
    assert isinstance(rebalancer, AresRebalancer)
    tallies = count_rounds(rebalancer)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, 180, thread.is_alive)
        requests = asyncio.run(replay(base, draw.workload, MODEL, args.timeout,
                                      body_of=draw.body))
        counters = read_counters(base)
    finally:
        server.should_exit = True
        thread.join(60)
    summary = summarize(requests, setup.slo)
    busy = [t for t in tallies if t.overloaded]
    print(f"{contender.label} seed {args.seed}: {summary.completed}/{summary.requests} done, "
          f"{counters['preemptions']:.0f} preemptions, {counters['migrations']:.0f} "
          f"migrations, P99 TPOT {summary.tpot_s.p99 * 1000:.0f} ms")
    print(f"rounds {len(tallies)}; with a decode worker >= {FULL:.0%} full "
          f"{sum(t.full for t in tallies)}; with an overloaded worker {len(busy)}")
    print(f"  of those: with an underloaded target {sum(t.target for t in busy)}, with a "
          f"candidate {sum(t.candidates > 0 for t in busy)}, with one "
          f"once the targets' KV is unbounded {sum(t.without_memory_checks > 0 for t in busy)}"
          f", migrated {sum(t.migrated for t in busy)}")
    if busy:
        print(f"  mean over such rounds: w̄ {sum(t.mean_load for t in busy) / len(busy):.0f} "
              f"tokens, the lightest worker's current KV "
              f"{sum(t.lightest_now for t in busy) / len(busy):.0f} tokens (a target needs "
              f"under (1 + θ) w̄)")
        print(f"  candidates per such round: {sum(t.candidates for t in busy) / len(busy):.1f}"
              f", without the memory checks "
              f"{sum(t.without_memory_checks for t in busy) / len(busy):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
