"""Serving while the start-up profile runs (issue 27, part 7): a server with no profile of
its model answers at once on a provisional model, switches to the profiled one when the
background profile is ready (roles, policy state and requests in flight kept), says which
in `/health`, and keeps serving on the provisional model if the profile fails. The profile
here is an injected function made slow (until the test releases it) or failing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import make_perf, policy_setup
from profile_hooks import RELEASE_ENV, failing_profile, slow_profile
from server_helpers import wait_until

from pdserve.cluster.events import ClusterView, PerfModelChanged
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.config import serve_defaults
from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.profile_cache import (
    cached_profile,
    earlier_profile,
    profile_path,
    start_up_profile,
)
from pdserve.engine.provisional_model import probe_model, provisional_model
from pdserve.instance.stats import InstanceStats
from pdserve.live.replay_client import free_port, wait_until_healthy
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs
from pdserve.policies.arrow.profiling import profiled_terms
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig, PolicySetup
from pdserve.server.launch import build_app
from pdserve.types import SLO, Role

KV_BLOCKS = 512


@contextmanager
def unprofiled_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measure,  # type: ignore[no-untyped-def]
                      values: dict[str, object]) -> Iterator[tuple[str, object]]:
    """A server of `tiny` with an empty cache (no profile kept) and `measure` as its
    background profile; yields (base URL, driver) and stops it."""
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(RELEASE_ENV, str(tmp_path / "release"))
    config = serve_defaults().with_values({"server.port": free_port(), "engine.weights": "tiny",
                                           "engine.kv_blocks": KV_BLOCKS, **values})
    app = build_app(config, measure=measure)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.server.port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{config.server.port}"
    try:
        wait_until_healthy(base, 120, thread.is_alive)
        yield base, app.state.driver
    finally:
        server.should_exit = True
        thread.join(60)


def complete(base: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": "Hello there", "max_tokens": max_tokens,
        "temperature": 0})


def test_the_server_answers_before_its_profile_is_ready_then_switches(tmp_path, monkeypatch):
    with unprofiled_server(tmp_path, monkeypatch, slow_profile, {
            "cluster.instances": 2, "cluster.prefill": 1, "cluster.decode": 1,
            "policy.name": "arrow"}) as (base, driver):
        health = httpx.get(f"{base}/health").json()
        assert health["perf_model"] == "provisional"
        assert health["perf_model_origin"].startswith("the layer probe")
        assert complete(base).status_code == 200  # answered while the profile runs
        roles = httpx.get(f"{base}/health").json()["roles"]
        scheduler, policy = driver.scheduler, driver.scheduler.policy
        assert wait_until((tmp_path / "release.waiting").exists, 120)
        with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": "Once upon a time", "max_tokens": 400,
                "temperature": 0, "ignore_eos": True, "stream": True}) as stream:
            lines = (line for line in stream.iter_lines() if line.startswith("data: "))
            first = next(lines)
            (tmp_path / "release").touch()  # the profile finishes while this one streams
            assert wait_until(lambda: httpx.get(f"{base}/health").json()["perf_model"]
                              == "profiled", 60)
            assert httpx.get(f"{base}/health").json()["requests_in_flight"] == 1
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in [first, *rest[:-1]]]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] \
            == "length" and text  # the request in flight went on to its end
        health = httpx.get(f"{base}/health").json()
        assert health["perf_model_origin"].startswith("the test's profile")
        assert "perf_model_error" not in health
        assert health["roles"] == roles  # no instance jumped back to its first role
        assert driver.scheduler is scheduler and scheduler.policy is policy
        assert policy.prefill_router.context.perf.name == "test profile"
        assert complete(base).status_code == 200  # and serving goes on


def test_a_failed_profile_leaves_the_server_on_the_provisional_model(tmp_path, monkeypatch,
                                                                      caplog):
    with unprofiled_server(tmp_path, monkeypatch, failing_profile, {
            "cluster.instances": 1, "policy.name": "colocated"}) as (base, driver):
        assert wait_until(lambda: "perf_model_error" in httpx.get(f"{base}/health").json(),
                          60)
        health = httpx.get(f"{base}/health").json()
        assert health["status"] == "ok" and health["perf_model"] == "provisional"
        assert "the engine could not be measured" in health["perf_model_error"]
        assert complete(base).status_code == 200
    assert "the start-up profile failed" in caplog.text


def test_a_kept_profile_or_a_given_one_serves_at_once_with_no_provisional_phase(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    values = {"engine.weights": "tiny", "engine.kv_blocks": 64, "cluster.instances": 1}
    profile_path("tiny", 64).parent.mkdir(parents=True, exist_ok=True)
    make_perf(kv_capacity_tokens=64 * 16).save(profile_path("tiny", 64))
    app = build_app(serve_defaults().with_values(values), measure=failing_profile)
    health = app.state.driver.health()  # the app is not started: nothing runs meanwhile
    assert health["perf_model"] == "profiled"
    assert health["perf_model_origin"] == f"cached {profile_path('tiny', 64)}"
    given = tmp_path / "given.json"
    make_perf(kv_capacity_tokens=64 * 16).save(given)
    app = build_app(serve_defaults().with_values({**values, "perf.profile": str(given)}),
                    measure=failing_profile)
    assert app.state.driver.perf_model.origin == f"loaded from {given}"


# ---- the switch in the scheduler: state kept, later decisions on the new model ----

def other_model(perf: PerfModel) -> PerfModel:
    """A model three times slower than `perf`."""
    p, d = perf.prefill, perf.decode
    return replace(perf, name="slower", prefill=PrefillCoeffs(
        3 * p.intercept_s, 3 * p.per_token_s, 3 * p.per_attn_unit_s), decode=DecodeCoeffs(
        3 * d.intercept_s, 3 * d.per_seq_s, 3 * d.per_context_token_s, 3 * d.batch1_extra_s))


def setup_for(name: str, perf: PerfModel) -> PolicySetup:
    return policy_setup(perf, SLO(ttft_s=1.0, tpot_s=0.1), PolicyConfig(name=name),
                        instances=2, prefill=1, decode=1, chunk_size_tokens=512,
                        max_batch_size=64)


def test_the_scheduler_keeps_its_roles_and_state_across_a_model_switch():
    first = make_perf()
    policy, count = build_policy(setup_for("arrow", first))
    scheduler = GlobalScheduler(policy, count)
    context = policy.prefill_router.context
    monitor, board = context.monitor, scheduler.board
    scheduler.board.set_role(1, Role.D_TO_P, "a flip before the switch")
    scheduler.board.take_changes()
    context.record_flip(1, 3.0)
    view = ClusterView(5.0, [InstanceStats.empty(i, 512) for i in range(2)])
    second = other_model(first)
    assert scheduler.handle(PerfModelChanged(second), view) == []
    assert scheduler.roles == [Role.PREFILL, Role.D_TO_P] and scheduler.board is board
    assert context.monitor is monitor and context.flipped_at_s == {1: 3.0}
    predictor, max_running = profiled_terms(second, 512, 0.1, 64)
    assert context.predictor.coeffs == predictor.coeffs
    assert context.max_running_tokens == max_running < profiled_terms(first, 512, 0.1, 64)[1]
    assert policy.decode_router.context is context and policy.role_manager.context is context


@pytest.mark.parametrize("name", ["min-load", "continuum", "taichi", "ampd", "flowkv", "ares",
                                  "round-robin"])
def test_every_component_that_reads_the_model_reads_the_new_one(name):
    first = make_perf(kv_capacity_tokens=8192)
    policy, _ = build_policy(setup_for(name, first))
    second = other_model(first)
    policy.use_perf_model(second)
    router = policy.prefill_router
    if name == "min-load":
        assert router.prefill is second.prefill
    elif name == "continuum":
        assert router.fallback.prefill is second.prefill
    elif name == "taichi":
        assert router.context.perf is second and router.least_loaded.prefill is second.prefill
    elif name == "ampd":
        assert all(router.context.perf(i) is second for i in range(2))
    elif name == "flowkv":
        assert list(router.context.perfs) == [second, second]
    elif name == "ares":
        assert policy.rebalancer.perf is second and router.prefill is second.prefill


# ---- where the provisional model comes from ----

def test_the_provisional_model_is_an_earlier_profile_of_the_model_here_else_the_probe(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    model, origin = provisional_model("tiny", "tiny", 64)
    assert origin.startswith("the layer probe") and model.kv_capacity_tokens == 64 * 16
    assert model.prefill.time_s(512, 512 * 512) > model.prefill.time_s(16, 16 * 16) > 0
    assert model.decode.step_s(8, 8 * 256) > model.decode.step_s(1, 64) > 0
    kept = replace(make_perf(kv_capacity_tokens=64 * 16), name="kept")
    profile_path("tiny", 64).parent.mkdir(parents=True, exist_ok=True)
    kept.save(profile_path("tiny", 64))
    assert cached_profile("tiny", 64)[0] == kept
    assert earlier_profile("tiny", 64) is None  # its own profile is no "earlier" one
    assert cached_profile("tiny", 128) is None
    model, origin = provisional_model("tiny", "tiny", 128)  # another KV size: the kept one
    assert model == replace(kept, kv_capacity_tokens=128 * 16) and str(tmp_path) in origin
    assert earlier_profile("small", 128) is None  # other weights: none
    assert start_up_profile("tiny", "tiny", 64)[1].startswith("cached")


def test_the_layer_probe_prices_a_deeper_model_higher():
    config = resolve_model("tiny").config
    shallow = probe_model(config, 64, "tiny")
    deep = probe_model(replace(config, num_layers=4 * config.num_layers), 64, "deeper")
    assert deep.prefill.time_s(512, 512 * 512) > 2 * shallow.prefill.time_s(512, 512 * 512)
    assert deep.decode.step_s(8, 8 * 256) > 1.5 * shallow.decode.step_s(8, 8 * 256)
