"""Prefix cache in the local scheduler and the simulator: hits, suffix-only prefill, LRU
eviction under memory pressure, and prefix-aware routing; heterogeneous GPU groups."""

from __future__ import annotations

import pytest
from conftest import local_scheduler

from pdserve.cluster.hardware import parse_instances
from pdserve.config import Config
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.prefix_cache import PrefixCache, chain_hashes, usable_hit_blocks
from pdserve.perf.specs import gpu_spec
from pdserve.sim.hetero import heterogeneous_layout
from pdserve.sim.runner import Experiment
from pdserve.types import Request, Role


def scheduler(blocks: int) -> LocalScheduler:
    return local_scheduler(0, blocks, chunk_size_tokens=4096,
                           prefix_cache=PrefixCache(64))  # 4 KV blocks per hash


def run_prefill(local: LocalScheduler, request: Request) -> tuple[int, int]:
    """Prefill `request` to its first token; (tokens computed, its cached hash blocks)."""
    local.enqueue_prefill(request)
    plan = local.plan()
    computed = sum(tokens for _, tokens in plan.chunks)
    local.complete(plan)
    return computed, request.cached_blocks


def finish(local: LocalScheduler, request: Request) -> None:
    local.continue_in_place(request)
    while (plan := local.plan()) is not None:
        local.complete(plan)


def test_a_repeated_prefix_is_reused_and_only_the_suffix_computed():
    local = scheduler(100)
    first = Request(1, 0.0, 300, 2, hash_ids=(11, 12, 13, 14))  # 4 full blocks of 64
    assert run_prefill(local, first) == (300, 4)
    assert local.used_blocks == 19  # blocks_for(301): the cached ones still in use
    second = Request(2, 0.0, 280, 2, hash_ids=(11, 12, 13, 99))
    assert run_prefill(local, second) == (280 - 3 * 64, 4)  # 3 hits, its 4th block new
    assert local.prefix_cache.hit_tokens_total == 192
    assert local.used_blocks == 19 + 18 - 12  # the 3 shared hash blocks counted once
    finish(local, first)
    finish(local, second)
    cache = local.prefix_cache
    assert local.free_blocks == 100 and len(cache) == 5  # all free, all content kept
    assert cache.cached_blocks == 20
    # a whole-prompt hit still computes its last block (one token samples the first output)
    again = Request(3, 0.0, 256, 2, hash_ids=(11, 12, 13, 14))
    assert usable_hit_blocks(4, 256, 64) == 3
    assert run_prefill(local, again) == (64, 3)  # its recomputed 4th block: a copy, not cached


def test_memory_pressure_evicts_least_recently_used_entries_tail_first():
    local = scheduler(40)
    a = Request(1, 0.0, 128, 1, hash_ids=(1, 2))  # output 1: finishes at prefill
    b = Request(2, 0.0, 128, 1, hash_ids=(3, 4))
    run_prefill(local, a)
    run_prefill(local, b)
    cache = local.prefix_cache
    assert local.free_blocks == 40 and cache.cached_blocks == 16
    big = Request(3, 0.0, 27 * 16, 1)  # 27 blocks: 24 truly free, 3 taken from the cache
    run_prefill(local, big)
    assert cache.evictions_total == 1  # one entry of 4 blocks: a's tail (least recent)
    assert 2 not in cache and 1 in cache and 3 in cache and 4 in cache
    hit_before = cache.hit_tokens_total
    assert run_prefill(local, Request(4, 0.0, 129, 1, hash_ids=(1, 2)))[0] == 129 - 64
    assert run_prefill(local, Request(5, 0.0, 129, 1, hash_ids=(3, 4)))[0] == 1
    assert cache.hit_tokens_total - hit_before == 64 + 128


def test_chain_hashes_depend_on_everything_before():
    a = chain_hashes(list(range(40)), 16)
    b = chain_hashes([99] + list(range(1, 40)), 16)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # only the first token differs
    assert chain_hashes(list(range(40)), 16) == a


def mooncake(policy: str, values: dict[str, object] | None = None) -> Experiment:
    config = Config().with_values({
        "policy.name": policy, "workload.trace": "mooncake-conv", "workload.max_requests": 600,
        "workload.rate_scale": 0.5, "cluster.prefill": 2, "cluster.decode": 2,
        "perf.model": "llama-3.1-8b", "perf.gpu": "a100", **(values or {})})
    return Experiment.from_config(config)


def test_prefix_aware_routing_finds_more_cache_hits_on_mooncake():
    hits = {}
    for aware in (True, False):
        result = mooncake("flowkv", {"policy.flowkv.prefix_aware_routing": aware}).simulate()
        assert all(r.finished for r in result.requests)
        hits[aware] = result.prefix_hit_tokens
    assert hits[True] > hits[False] > 0
    no_cache = mooncake("flowkv", {"instance.prefix_block_tokens": 0}).simulate()
    assert no_cache.prefix_hit_tokens == 0


def test_gpu_groups_give_each_instance_its_own_model_memory_and_node():
    groups = parse_instances("4xh20:decode, 4xl20:prefill")
    assert [(g.count, g.gpu, g.role) for g in groups] == [(4, "l20", Role.PREFILL),
                                                           (4, "h20", Role.DECODE)]
    with pytest.raises(ValueError, match="COUNTxGPU"):
        parse_instances("4l20:prefill")
    with pytest.raises(ValueError, match="unknown role"):
        parse_instances("4xl20:prefil")
    layout = heterogeneous_layout(Config().with_values({
        "cluster.instances": "4xl20:prefill,4xh20:decode", "perf.model": "llama-3.1-8b"}))
    l20, h20 = layout.perfs[0], layout.perfs[4]
    assert l20.kv_capacity_tokens < h20.kv_capacity_tokens  # 48 GB vs 96 GB
    assert l20.decode.step_s(32, 32_000) > h20.decode.step_s(32, 32_000)  # 864 vs 4000 GB/s
    assert layout.topology.nodes == (0, 0, 0, 0, 1, 1, 1, 1)
    assert layout.topology.intra_node[0].bytes_per_s < layout.topology.intra_node[4].bytes_per_s
    assert gpu_spec("l20").memory_bytes == 46068 * 2**20 and "L20" in gpu_spec("l20").source
    with pytest.raises(ValueError, match="reserve instances need policy flowkv"):
        Experiment.from_config(Config().with_values({
            "cluster.instances": "1xl20:prefill,1xh20:decode,1xh20:reserve",
            "policy.name": "static-pd", "workload.trace": "synthetic",
            "workload.synthetic_requests": 2})).simulate()


def test_flowkv_scales_up_from_its_reserve_under_overload():
    config = Config().with_values({"policy.name": "flowkv", "workload.trace": "synthetic",
                                   "workload.synthetic_requests": 400,
                                   "workload.synthetic_rate_rps": 6.0,
                                   "workload.synthetic_lengths": "fixed:4000:200",
                                   "cluster.prefill": 1, "cluster.decode": 1,
                                   "cluster.reserve": 2,
                                   "perf.model": "llama-3.1-8b", "perf.gpu": "a100",
                                   "sim.instance_startup_s": 7.0})
    result = Experiment.from_config(config).simulate()
    ups = [c for c in result.role_changes if "scale up" in c.reason]
    assert ups and all(c.instance_id in (2, 3) for c in ups)
    assert all(r.finished for r in result.requests)
    served = {r.prefill_instance for r in result.requests} | \
        {r.decode_instance for r in result.requests}
    assert served & {2, 3}
    # both reserves start stopped; a scaled-up one serves instance_startup_s after its start
    events = result.scaling_events
    assert [(t, i, what) for t, i, what, _ in events[:2]] == [(0.0, 2, "stop"), (0.0, 3, "stop")]
    starts = {i: t for t, i, what, _ in events if what == "start"}
    started = {i: t for t, i, what, _ in events if what == "started"}
    assert starts and set(started) == set(starts)
    for i, t in starts.items():
        assert started[i] == pytest.approx(t + 7.0)
        role_times = [c.time_s for c in ups if c.instance_id == i]
        assert role_times and min(role_times) == pytest.approx(started[i])  # serves then
    # stopped time is not run time
    assert result.instance_s_total < 4 * result.end_s - 7.0
