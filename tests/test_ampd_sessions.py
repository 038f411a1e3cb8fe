"""Multi-round sessions: binding, history KV kept between rounds, incremental prefills and
hand-offs, eviction forcing a re-prefill, and the session workloads (AMPD sec. 3, Table 1)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import local_scheduler, make_perf, policy_setup, sim_settings

from pdserve.cluster.topology import Topology
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.simulator import Simulator
from pdserve.types import SLO, Request, blocks_for
from pdserve.workload.sessions import AGENT_PROFILES, session_workload

PERF = make_perf()
SLO_ = SLO(1.0, 0.1)


def two_rounds(first_in: int = 1000, first_out: int = 50, new_in: int = 300,
               out: int = 20, delay_s: float = 1.0) -> list[Request]:
    history = first_in + first_out
    return [Request(0, 0.0, first_in, first_out, session_id=5, round_index=0, retain_kv=True),
            Request(1, 0.0, history + new_in, out, session_id=5, round_index=1,
                    history_tokens=history, tool_delay_s=delay_s)]


def run(policy_name: str, requests: list[Request], prefill: int = 1, decode: int = 1,
        perf=PERF, instances: int = 1) -> Simulator:
    policy, count = build_policy(policy_setup(perf, SLO_, PolicyConfig(policy_name),
                                              instances=instances, prefill=prefill,
                                              decode=decode))
    sim = Simulator(policy, count, perf, sim_settings(),
                    Topology.for_perf_models([perf] * count, 8))
    sim.result = sim.run(requests)  # type: ignore[attr-defined]
    return sim


# ---- the local scheduler ----

def finish(local: LocalScheduler, request: Request) -> None:
    """Run `request` here to the end (prefill, in place decode)."""
    local.enqueue_prefill(request)
    while True:
        plan = local.plan()
        assert plan is not None
        result = local.complete(plan)
        for held in result.prefilled:
            local.continue_in_place(held)
        if request in result.finished:
            return


def test_finished_round_keeps_its_kv_and_next_local_round_computes_only_new_tokens() -> None:
    local = local_scheduler(0, total_blocks=1000, chunk_size_tokens=4096)
    first, second = two_rounds()
    finish(local, first)
    kept = first.sequence_tokens - 1
    assert local.sessions.tokens(5) == kept == 1049
    assert local.used_blocks == blocks_for(kept)  # held, not freed
    second.cached_prefix_tokens = local.sessions.pin(5)
    local.enqueue_prefill(second)
    assert local.prefill_queue_tokens == second.input_tokens - kept == 301
    plan = local.plan()
    assert plan is not None and plan.chunks == [(second, 301)]
    assert plan.prefill_attn_units == 301 * (301 + 2 * kept)  # new tokens attend to history
    assert len(local.sessions) == 0  # the round took the history blocks over
    assert local.complete(plan).prefilled == [second]
    assert local.held[second.request_id][1] == blocks_for(second.input_tokens)
    assert local.used_blocks == blocks_for(second.input_tokens)  # history counted once


def test_handoff_to_the_bound_instance_moves_only_new_blocks() -> None:
    decode = local_scheduler(1, total_blocks=1000, chunk_size_tokens=4096)
    first, second = two_rounds()
    finish(decode, first)
    free_before = decode.free_blocks
    second.cached_prefix_tokens = decode.sessions.pin(5)
    second.generated_tokens = 1  # prefilled remotely: its first token is out
    decode.enqueue_transfer_in(second)
    assert decode.admit_transfers() == [second]
    assert decode.transfer_reused_tokens[second.request_id] == 1049
    total = blocks_for(second.sequence_tokens - 1)
    assert second.kv_blocks == total
    assert free_before - decode.free_blocks == total - blocks_for(1049)


def test_eviction_frees_idle_history_lru_first() -> None:
    local = local_scheduler(0, total_blocks=200, chunk_size_tokens=4096)
    for sid in (1, 2):
        finish(local, Request(sid, 0.0, 1000, 10, session_id=sid, retain_kv=True))
    assert len(local.sessions) == 2 and local.used_blocks == 2 * blocks_for(1009)
    finish(local, Request(9, 0.0, 1500, 10))  # needs blocks only evicting session 1 frees
    assert 1 not in local.sessions and 2 in local.sessions
    assert local.sessions.evictions_total == 1


def test_kept_history_is_reclaimable_and_the_usage_gauge_counts_it_free() -> None:
    """Session history kept for later rounds is in use, but a request short of memory
    evicts it: `reclaimable_blocks` says how much, and `vllm:kv_cache_usage_perc` counts it
    free, as vLLM counts its evictable prefix cache (an idle worker holding history read
    84 % "used" before)."""
    from prometheus_client.parser import text_string_to_metric_families

    from pdserve.cluster.history import InstanceState
    from pdserve.instance.stats import InstanceStats
    from pdserve.live.server_metrics import ClusterGauges, ServerMetrics
    from pdserve.types import Role

    local = local_scheduler(0, total_blocks=200, chunk_size_tokens=4096)
    for sid in (1, 2):
        finish(local, Request(sid, 0.0, 1000, 10, session_id=sid, retain_kv=True))
    kept = 2 * blocks_for(1009)
    assert local.used_blocks == kept and local.reclaimable_blocks == kept
    local.sessions.lock(1)  # another worker reads it: not evictable meanwhile
    assert local.reclaimable_blocks == blocks_for(1009)
    stats = InstanceStats.of(local)
    assert (stats.used_blocks, stats.reclaimable_blocks) == (kept, blocks_for(1009))
    metrics = ServerMetrics("m", lambda: ClusterGauges([Role.DECODE], [InstanceState.UP],
                                                       [stats], 0))
    samples = {s.name: s.value for f in text_string_to_metric_families(
        metrics.text().decode()) for s in f.samples}
    assert samples["vllm:kv_cache_usage_perc"] == pytest.approx(blocks_for(1009) / 200)
    assert samples["pdserve:kv_used_blocks"] == kept
    assert samples["pdserve:kv_reclaimable_blocks"] == blocks_for(1009)


def test_dropping_or_trimming_kept_history_gives_its_blocks_back() -> None:
    local = local_scheduler(0, total_blocks=200, chunk_size_tokens=4096)
    for sid in (1, 2):
        finish(local, Request(sid, 0.0, 1000, 10, session_id=sid, retain_kv=True))
    assert local.used_blocks == 2 * blocks_for(1009)
    assert local.trim_session_history(1, 160) == blocks_for(1009) - blocks_for(160)
    assert local.sessions.tokens(1) == 160
    assert local.drop_session_history(2) == blocks_for(1009) and 2 not in local.sessions
    assert local.drop_session_history(2) == 0  # gone already
    assert local.used_blocks == blocks_for(160) == local.total_blocks - local.free_blocks


# ---- the simulator ----

def test_rounds_are_chained_by_the_tool_delay() -> None:
    requests = two_rounds(delay_s=2.5)
    run("dynamo", requests)
    first, second = requests
    assert second.arrival_s == pytest.approx(first.finish_s + 2.5)
    assert second.decode_instance == first.decode_instance == 1  # bound
    assert second.home_instance == 1


def test_remote_round_reads_history_and_hands_back_only_new_kv() -> None:
    requests = two_rounds(first_in=4000, new_in=200)
    sim = run("dynamo", requests)
    stats = sim.result.sessions  # type: ignore[attr-defined]
    first, second = requests
    history = first.sequence_tokens - 1
    assert stats.history_read_bytes == history * PERF.kv_bytes_per_token
    link = sim.topology.link_between(0, 1)
    read_s = link.time_s(history * PERF.kv_bytes_per_token)
    new_s = link.time_s((second.input_tokens - history) * PERF.kv_bytes_per_token)
    assert second.transfer_s == pytest.approx(read_s + new_s)  # alone on the links
    full_s = link.time_s(second.input_tokens * PERF.kv_bytes_per_token)
    assert first.transfer_s == pytest.approx(link.time_s(
        (first.input_tokens) * PERF.kv_bytes_per_token))
    assert second.transfer_s - read_s < 0.2 * full_s
    assert stats.remote_prefills == 1 and stats.history_evicted == 0


def test_colocated_affinity_reuses_history_and_eviction_forces_a_reprefill() -> None:
    requests = two_rounds(first_in=1000, delay_s=5.0)
    sim = run("continuum", requests)
    stats = sim.result.sessions  # type: ignore[attr-defined]
    assert stats.local_prefills == 1 and stats.history_evicted == 0
    assert requests[1].cached_prefix_tokens == requests[0].sequence_tokens - 1
    # a big request during the tool delay needs the memory the idle history holds
    small = replace(PERF, kv_capacity_tokens=4000)
    requests = [*two_rounds(first_in=1000, delay_s=5.0), Request(2, 3.0, 3000, 10)]
    sim = run("continuum", requests, perf=small)
    stats = sim.result.sessions  # type: ignore[attr-defined]
    assert stats.history_evicted == 1
    assert requests[1].cached_prefix_tokens == 0  # the whole prompt was recomputed
    assert sim.instances[0].local.sessions.evictions_total == 1
    assert all(r.finished for r in requests)


def test_final_round_frees_its_kv() -> None:
    requests = two_rounds()
    sim = run("dynamo", requests)
    assert all(len(i.local.sessions) == 0 and i.local.used_blocks == 0
               for i in sim.instances)


def test_rejected_round_rejects_the_rest_of_its_session() -> None:
    tiny = replace(PERF, kv_capacity_tokens=1200)
    requests = two_rounds(first_in=1500)
    run("dynamo", requests, perf=tiny)
    assert requests[0].rejected_reason and "earlier round" in requests[1].rejected_reason


# ---- workloads ----

@pytest.mark.parametrize("kind", list(AGENT_PROFILES))
def test_agent_workloads_match_table_1(kind: str) -> None:
    profile = AGENT_PROFILES[kind]
    workload = session_workload(f"agent:{kind}", 1500, 2.0, seed=1)
    assert workload.session_id is not None and workload.history_tokens is not None
    rounds = np.bincount(workload.session_id)
    assert rounds.mean() == pytest.approx(profile.mean_rounds, rel=0.05)
    new = workload.input_tokens - workload.history_tokens
    assert new.mean() == pytest.approx(profile.prefill_tokens, rel=0.05)
    assert workload.output_tokens.mean() == pytest.approx(profile.decode_tokens, rel=0.05)
    requests = workload.requests()
    by_session: dict[int, list[Request]] = {}
    for request in requests:
        by_session.setdefault(request.session_id, []).append(request)
    for rounds_of in list(by_session.values())[:50]:
        rounds_of.sort(key=lambda r: r.round_index)
        for before, after in zip(rounds_of, rounds_of[1:], strict=False):
            assert after.history_tokens == before.input_tokens + before.output_tokens
            assert before.retain_kv and after.tool_delay_s > 0
        assert not rounds_of[-1].retain_kv


@pytest.mark.parametrize("kind", list(AGENT_PROFILES))
def test_prompt_reading_matches_table_1_as_mean_prompt(kind: str) -> None:
    """`agent:<kind>:prompt`: Table 1's prefill length is the mean prompt (history included)
    over every round of the trace; rounds and decode lengths as under the default reading.
    Averaging per session instead (c = (R - 1) / 2) misses GAIA by 8 % and ToolBench by 16 %."""
    profile = AGENT_PROFILES[kind]
    workload = session_workload(f"agent:{kind}:prompt", 1500, 2.0, seed=1)
    assert workload.name == f"agent:{kind}:prompt" and workload.history_tokens is not None
    assert workload.input_tokens.mean() == pytest.approx(profile.prefill_tokens, rel=0.04)
    new = workload.input_tokens - workload.history_tokens
    assert new.mean() == pytest.approx(profile.new_tokens_per_round("prompt"), rel=0.04)
    assert new.mean() < 0.5 * profile.prefill_tokens
    assert workload.output_tokens.mean() == pytest.approx(profile.decode_tokens, rel=0.05)
    assert np.bincount(workload.session_id).mean() == pytest.approx(profile.mean_rounds,
                                                                     rel=0.05)


def test_table_1_readings_new_tokens_per_round() -> None:
    new = {k: p.new_tokens_per_round("prompt") for k, p in AGENT_PROFILES.items()}
    # fixed 3 rounds: n = (P - D) / 2; Poisson rounds: c = (l + l^2 / 2) / (1 + l)
    assert new["hotpotqa"] == pytest.approx((1569.8 - 80.03) / 2)
    assert new["dureader"] == pytest.approx((3081.23 - 150.10) / 2)
    assert new["gaia"] == pytest.approx(482.4, abs=0.1)
    assert new["toolbench"] == pytest.approx(213.9, abs=0.1)
    assert AGENT_PROFILES["gaia"].new_tokens_per_round("new") == 6161.02
    explicit = session_workload("agent:gaia:new", 20, 1.0, seed=2)
    default = session_workload("agent:gaia", 20, 1.0, seed=2)
    assert explicit.name == default.name == "agent:gaia"
    assert np.array_equal(explicit.input_tokens, default.input_tokens)


@pytest.mark.parametrize("name", ["agent:gaia:tokens", "agent:gaia:prompt:x", "agent:",
                                  "agent:chat", "agent:gaia:", "agent::prompt"])
def test_malformed_agent_workload_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="reading one of new, prompt") as error:
        session_workload(name, 10, 1.0)
    assert repr(name) in str(error.value) and "toolbench, gaia, hotpotqa, dureader" in str(
        error.value)
    with pytest.raises(ValueError, match="known: new, prompt"):
        AGENT_PROFILES["gaia"].new_tokens_per_round("history")


def test_sharegpt_and_mooncake_sessions() -> None:
    sharegpt = session_workload("sharegpt-sessions", 200, 1.0, seed=0)
    assert sharegpt.history_tokens is not None and (sharegpt.history_tokens > 0).any()
    assert (sharegpt.input_tokens > sharegpt.history_tokens).all()
    mooncake = session_workload("mooncake-sessions", 1, 1.0)
    assert mooncake.history_tokens is not None
    later = mooncake.round_index > 1
    assert later.any() and (mooncake.history_tokens[later] > 0).all()
    assert (mooncake.history_tokens < mooncake.input_tokens).all()


@pytest.mark.parametrize("policy", ["ampd", "continuum"])
def test_sessions_fast_advance_equals_step_by_step(policy: str) -> None:
    """Sessions under memory pressure (history evicted, preemptions): the simulator's
    multi-step spans give every round the same times as running step by step."""

    perf = make_perf(kv_capacity_tokens=12_000)
    outcomes = []
    for span in (1, 1 << 20):
        workload = session_workload("agent:hotpotqa", 40, 4.0, seed=3)
        policy_obj, count = build_policy(policy_setup(perf, SLO(0.3, 0.02), PolicyConfig(policy),
                                                      instances=4, prefill=2, decode=2))
        sim = Simulator(policy_obj, count, perf, sim_settings(chunk_size_tokens=512,
                                                              max_span_steps=span))
        result = sim.run(workload.requests())
        outcomes.append((result, [(r.request_id, r.arrival_s, r.first_token_s, r.finish_s,
                                   r.prefill_instance, r.decode_instance, r.preemptions,
                                   r.cached_prefix_tokens) for r in result.requests]))
    (slow, slow_rows), (fast, fast_rows) = outcomes
    for a, b in zip(slow_rows, fast_rows, strict=True):
        assert a[0] == b[0] and a[4:] == b[4:]
        assert a[1:4] == pytest.approx(b[1:4], rel=1e-9, abs=1e-9)
    assert slow.sessions == fast.sessions
    assert fast.events < slow.events
    assert fast.sessions.history_evicted + sum(r.preemptions for r in fast.requests) > 0
