"""ARES on live worker processes: the rebalancer moves a decode mid-stream, and its text is
the single-instance text. The live world has no oracle: the workers' `noisy:mae=0`
predictor is exact around `max_tokens` for requests that ignore EOS (as these do)."""

from __future__ import annotations

import threading

import httpx
import torch
from server_helpers import running_server, wait_until

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.policies.ares.rebalancer import AresRebalancer

SHORT_PROMPT = "Tell me a story"
TOKENS = 400  # the two long-running requests' output
LONG_PROMPT = " ".join(["The decode instances share the work of many long answers."] * 12)


def reference_text(prompt: str, max_tokens: int) -> str:
    """Greedy on one in-process engine, EOS ignored: what the served request must equal."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, 128)
    ids = tokenizer.encode(prompt)
    engine.add(0, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                      ignore_eos=True))
    engine.run([], [(0, len(ids))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    return engine.text_of(0)


def complete(base: str, prompt: str, max_tokens: int, out: dict, key: str) -> None:
    response = httpx.post(f"{base}/v1/completions", timeout=180, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    out[key] = response.json()


def test_ares_migrates_a_decode_mid_stream_with_identical_text(tmp_path) -> None:
    # rounds every 0.2 s: the long runs last a second or two on the tiny model, and a
    # single round at 1 s could fall before their forecasts arrive (no candidates)
    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "ares",
                                   "cluster.prefill": 1, "cluster.decode": 2,
                                   "policy.ares.forecast.predictor": "noisy:mae=0",
                                   "instance.prefix_block_tokens": 0, "policy.ares.interval_s": 0.2,
                                   "monitor.interval_s": 0.1}) as (base, driver):
        rebalancer = driver.scheduler.policy.rebalancer
        assert isinstance(rebalancer, AresRebalancer)
        out: dict = {}
        # a long prompt that finishes soon on one decode instance, then two short prompts
        # that run long: they go to the other instance (fewer KV tokens now), which the
        # forecast shows will carry all the load
        short_run = threading.Thread(target=complete, args=(base, LONG_PROMPT, 100, out, "a"))
        short_run.start()
        assert wait_until(lambda: any(live.request.decode_instance in (1, 2)
                                    and live.tokens_sent > 2
                                    for live in driver.live.values()), 60)
        long_runs = [threading.Thread(target=complete,
                                      args=(base, f"{SHORT_PROMPT} {k}", TOKENS, out, f"b{k}"))
                     for k in range(2)]
        for thread in long_runs:
            thread.start()
        for thread in (short_run, *long_runs):
            thread.join(180)
            assert not thread.is_alive()
        moves = [r for r in rebalancer.records if r.migrated]
        assert moves and driver.metrics.total("pdserve:migrations") >= 1, rebalancer.records[-5:]
        # mid-stream: the moved request had tokens out and more to go
        assert all(0 < r.moved_at_tokens < TOKENS for r in moves)
        for k in range(2):
            body = out[f"b{k}"]
            assert body["usage"]["completion_tokens"] == TOKENS
            assert body["choices"][0]["text"] == reference_text(f"{SHORT_PROMPT} {k}", TOKENS)
        assert out["a"]["choices"][0]["text"] == reference_text(LONG_PROMPT, 100)


def test_serving_refuses_the_oracle_predictor() -> None:
    import pytest

    from pdserve.config import serve_defaults
    from pdserve.server.launch import check_serve

    with pytest.raises(ValueError, match="only the simulator"):
        check_serve(serve_defaults().with_values({"policy.name": "ares",
                                                  "policy.ares.forecast.predictor": "oracle"}))
    with pytest.raises(ValueError, match="rebalancer"):
        serve_defaults().with_values({"policy.rebalancer": "sideways"})


def test_predicted_load_dispatch_on_live_workers(tmp_path) -> None:
    """The same router live: the workers report forecasts (`noisy:mae=0` is exact around
    `max_tokens` here), the scheduler predicts each prefilled request's length, and four
    long requests sent at once spread over both decode instances (the router counts what
    it sent until a report lists it) with the single-instance text."""
    from pdserve.policies.ares.dispatch import PredictedLoadDecodeRouter

    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "vllm",
                                   "cluster.prefill": 1, "cluster.decode": 2,
                                   "policy.decode_router": "predicted-load",
                                   "policy.ares.forecast.predictor": "noisy:mae=0",
                                   "instance.prefix_block_tokens": 0}) as (base, driver):
        router = driver.scheduler.policy.decode_router
        assert isinstance(router, PredictedLoadDecodeRouter)
        assert not router.predictor.knows_true_length
        placed: list[int] = []
        route = router.route

        def recording(*args):  # type: ignore[no-untyped-def]
            placed.append(route(*args))
            return placed[-1]

        router.route = recording  # type: ignore[method-assign]
        out: dict = {}
        runs = [threading.Thread(target=complete,
                                 args=(base, f"{SHORT_PROMPT} {k}", 150, out, f"r{k}"))
                for k in range(4)]
        for thread in runs:
            thread.start()
        for thread in runs:
            thread.join(180)
            assert not thread.is_alive()
        assert router.dispatches == 4 and sorted(placed) == [1, 1, 2, 2]
        for k in range(4):
            body = out[f"r{k}"]
            assert body["usage"]["completion_tokens"] == 150
            assert body["choices"][0]["text"] == reference_text(f"{SHORT_PROMPT} {k}", 150)
