"""Decision cost of Arrow's dispatch: one prefill and one decode routing decision.

Views are `InstanceStats` snapshots (what a live driver holds) with random loads, half the
instances prefill and half decode. Two paths each: the common one (t1 meets the SLO) and the
overloaded one: every prefill queue misses the TTFT SLO and every decode instance is past
Max Running Tokens, so prefill dispatch scans every pool and the overload rule blocks a flip,
and decode dispatch scans every pool and flips a prefill instance (Alg. 4; the flip is timed,
then undone outside the timing).
Prints median and p99 per decision at 8 and 256 instances; target p99 < 50 us at 256.

    python bench/decision_cost.py
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from functools import partial

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.config import Config
from pdserve.instance.stats import InstanceStats
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.decode_router import ArrowDecodeRouter
from pdserve.policies.arrow.prefill_router import ArrowPrefillRouter
from pdserve.policies.arrow.preset import arrow_context
from pdserve.sim.runner import load_perf_model, policy_setup
from pdserve.types import Request, Role

BASE = InstanceStats(instance_id=0, prefill_queue_len=0, prefill_queue_tokens=0,
                     prefill_queue_attn_units=0, decode_queue_len=0, decode_queue_tokens=0,
                     running_decodes=0, running_tokens=0, used_blocks=0, total_blocks=26_000,
                     preemptions_total=0, decode_steps_total=0, decode_busy_s_total=0.0)
CALLS = 20_000


def build(num_instances: int, overloaded: bool, seed: int = 0):
    rng = random.Random(seed)
    config = Config()  # llama-3.1-8b on H800, the default SLOs and instance limits
    perf = load_perf_model(config)
    half = num_instances // 2
    loads = []
    for i in range(num_instances):
        queue = rng.randint(0, 4) + (40 if overloaded and i < half else 0)
        tokens = rng.randint(0, 4000) * queue
        running = rng.randint(430_000, 500_000) if overloaded else rng.randint(1000, 100_000)
        loads.append(replace(BASE, instance_id=i, prefill_queue_len=queue,
                             prefill_queue_tokens=tokens, prefill_queue_attn_units=tokens * 2000,
                             running_decodes=rng.randint(1, 60), running_tokens=running))
    context = arrow_context(policy_setup(config, perf))
    roles = [Role.PREFILL] * half + [Role.DECODE] * (num_instances - half)
    return ClusterView(0.0, loads), RoleBoard(roles), context


def time_calls(decide, board: RoleBoard, context: ArrowContext) -> tuple[float, float]:
    samples = []
    clock = time.perf_counter_ns
    roles = list(board.roles)
    for _ in range(CALLS):
        start = clock()
        decide()
        samples.append(clock() - start)
        if board.roles != roles:  # undo a flip, untimed
            for i, role in enumerate(roles):
                board.set_role(i, role)
            board.take_changes()
            context.flipped_at_s.clear()  # and its dwell time
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    request = Request(0, 0.0, 1500, 200)
    print(f"{'instances':>9} {'path':>9} {'decision':>9} {'median us':>10} {'p99 us':>8}")
    for num_instances in (8, 256):
        for overloaded in (False, True):
            view, board, context = build(num_instances, overloaded)
            prefill, decode = ArrowPrefillRouter(context), ArrowDecodeRouter(context)
            path = "fallback" if overloaded else "common"
            for name, decide in (
                    ("prefill", partial(prefill.route, request, view, board)),
                    ("decode", partial(decode.route, request, 0, view, board))):
                median, p99 = time_calls(decide, board, context)
                print(f"{num_instances:>9} {path:>9} {name:>9} {median:>10.2f} {p99:>8.2f}")


if __name__ == "__main__":
    main()
