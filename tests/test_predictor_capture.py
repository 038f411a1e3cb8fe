"""The engine's hidden-state capture every k generated tokens, and `record` on top of it
(tiny random model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.predictor.prompts import TEMPLATES, TOPICS, prompt_set
from pdserve.predictor.record import RecordedSet, RecordSettings, pool_blocks_for, record

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def test_capture_every_k_tokens_has_the_ids_counts_and_the_models_hidden_state(tiny):
    model, tokenizer = tiny
    k = 3
    engine = Engine(model, tokenizer, 64, hidden_state_every_tokens=k)
    prompts = {7: tokenizer.encode("The quick brown fox"), 11: tokenizer.encode("Hello there")}
    caps = {7: 10, 12: 0, 11: 7}
    for rid, ids in prompts.items():
        engine.add(rid, ids, SamplingParams(max_tokens=caps[rid], ignore_eos=True))
    engine.run([], [(rid, len(ids)) for rid, ids in prompts.items()])
    captured: dict[int, list[tuple[int, np.ndarray, torch.Tensor]]] = {7: [], 11: []}
    hidden_of_step = {}
    first = True
    while True:
        if not first:
            running = [rid for rid in prompts if not engine.sequences[rid].finish_reason]
            if not running:
                break
            outputs = engine.run(running, [])
            hidden_of_step = {o.request_id: o.hidden for o in outputs}
        first = False
        for rid, vector in engine.take_hidden_states().items():
            generated = len(engine.sequences[rid].generated)
            captured[rid].append((generated, vector, hidden_of_step.get(rid)))
    assert [g for g, _, _ in captured[7]] == [3, 6, 9]
    assert [g for g, _, _ in captured[11]] == [3, 6]
    assert engine.take_hidden_states() == {}
    for rid, items in captured.items():
        for generated, vector, returned in items:
            assert vector.dtype == np.float32 and vector.shape == (model.config.hidden_size,)
            torch.testing.assert_close(torch.from_numpy(vector), returned)
            # the model's own output: prefill prompt + the first generated - 1 output tokens
            # on a fresh engine; the last position's hidden state is the captured vector
            tokens = prompts[rid] + engine.sequences[rid].generated[:generated - 1]
            fresh = Engine(model, tokenizer, 64)
            fresh.add(0, tokens, SamplingParams(max_tokens=1, ignore_eos=True))
            reference = fresh.run([], [(0, len(tokens))])[0].hidden
            np.testing.assert_allclose(vector, reference.numpy(), atol=1e-4, rtol=1e-4)


def test_capture_off_by_default_keeps_nothing(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, 32)
    ids = tokenizer.encode("abc")
    engine.add(0, ids, SamplingParams(max_tokens=25, ignore_eos=True))
    engine.run([], [(0, len(ids))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    assert engine.take_hidden_states() == {} and engine.hidden_capture.captured_total == 0
    with pytest.raises(ValueError, match="hidden_state_every_tokens"):
        Engine(model, tokenizer, 32, hidden_state_every_tokens=-1)


def test_prompt_set_mixes_short_and_long_requests():
    everything = prompt_set()
    assert len(everything) == len(TEMPLATES) * len(TOPICS) >= 300
    assert len({p.text for p in everything}) == len(everything)
    first = prompt_set(60, seed=1)
    assert first == prompt_set(60, seed=1) and first != prompt_set(60, seed=2)
    assert {p.kind for p in first} == {"short", "medium", "long"}


def test_record_labels_remaining_tokens_and_round_trips(tiny, tmp_path):
    model, tokenizer = tiny
    prompts = prompt_set(6)
    encoded = [(p, tokenizer.encode(p.text)) for p in prompts]
    settings = RecordSettings(every_tokens=4, max_tokens=18, temperature=0.8, batch_size=4)
    engine = Engine(model, tokenizer, pool_blocks_for(encoded, settings),
                    hidden_state_every_tokens=4)
    seen = []
    data = record(engine, encoded, settings, lambda done, total, n: seen.append(done))
    assert seen == [1, 2, 3, 4, 5, 6]
    outputs = dict(zip(data.requests["ids"].tolist(), data.requests["output_tokens"].tolist(),
                       strict=True))
    assert sorted(outputs) == list(range(6))
    for rid, output in outputs.items():
        rows = data.request_id == rid
        assert data.generated_tokens[rows].tolist() == list(range(4, output + 1, 4))
        assert (data.remaining_tokens[rows] == output - data.generated_tokens[rows]).all()
        assert (data.prompt_tokens[rows] == len(encoded[rid][1])).all()
    assert data.hidden.shape == (len(data), model.config.hidden_size)
    assert not engine.sequences  # every request released
    data.save(tmp_path / "rec.npz")
    loaded = RecordedSet.load(tmp_path / "rec.npz")
    np.testing.assert_array_equal(loaded.hidden, data.hidden)
    np.testing.assert_array_equal(loaded.remaining_tokens, data.remaining_tokens)
    assert loaded.requests["kind"].tolist() == data.requests["kind"].tolist()
    assert loaded.requests["topic"].tolist() == [prompts[i].topic for i in range(6)]
    assert loaded.meta["every_tokens"] == "4" and loaded.meta["max_tokens"] == "18"
    both = RecordedSet.concat([loaded, data])
    assert len(both) == 2 * len(data) and len(set(both.requests["ids"].tolist())) == 12
    assert set(both.request_id.tolist()) == set(both.requests["ids"].tolist()) - {
        rid for rid, out in zip(both.requests["ids"], both.requests["output_tokens"],
                                strict=True) if out < 4}
    groups = both.prompt_groups()  # a prompt's two generations share a group
    assert len(set(groups.tolist())) == len(set(data.request_id.tolist()))
    loaded.meta["max_tokens"] = "99"
    with pytest.raises(ValueError, match="differ in max_tokens"):
        RecordedSet.concat([loaded, data])
    with pytest.raises(ValueError, match="captures every 4"):
        record(engine, encoded, RecordSettings(every_tokens=5), None)


@pytest.mark.slow
def test_record_from_the_default_model_captures_its_hidden_size(tmp_path):
    from pdserve.engine.checkpoint import resolve_model

    model, tokenizer = load_model("")
    source = resolve_model("")
    prompts = prompt_set(4)
    encoded = [(p, tokenizer.encode(source.chat_template.render(
        [{"role": "user", "content": p.text}]))) for p in prompts]
    settings = RecordSettings(every_tokens=10, max_tokens=40, batch_size=4)
    engine = Engine(model, tokenizer, pool_blocks_for(encoded, settings),
                    hidden_state_every_tokens=10)
    data = record(engine, encoded, settings)
    assert data.hidden.shape[1] == 576 == model.config.hidden_size
    assert len(data) == int((data.requests["output_tokens"] // 10).sum()) > 0
    assert np.isfinite(data.hidden).all()
    assert (data.remaining_tokens >= 0).all() and (data.remaining_tokens < 40).all()


def test_a_worker_serving_the_hidden_state_predictor_switches_capture_on(tiny, tmp_path):
    """`--ares-predictor hidden-state:PATH` on a live worker: its engine captures every k
    tokens (the forecast's refresh interval); other predictors leave the capture off."""
    from conftest import local_scheduler
    from test_predictor_mlp import synthetic

    from pdserve.instance.decode_forecast import ForecastSettings
    from pdserve.predictor.hidden_state import train_predictor
    from pdserve.predictor.mlp import TrainSettings
    from pdserve.worker.forecast import WorkerForecast

    model, tokenizer = tiny
    predictor, _ = train_predictor(synthetic(requests=40), TrainSettings(epochs=2, seed=0))
    predictor.save(tmp_path / "p.pt")
    for spec, every in ((f"hidden-state:{tmp_path / 'p.pt'}", 4), ("history", 0)):
        engine = Engine(model, tokenizer, 64)
        assert not engine.hidden_capture.enabled
        WorkerForecast.build(ForecastSettings(predictor=spec, refresh_every_tokens=4), engine,
                             local_scheduler(0, 64, 64))
        assert engine.hidden_capture.every_tokens == every
        ids = tokenizer.encode("The quick brown fox")
        engine.add(3, ids, SamplingParams(max_tokens=8, ignore_eos=True))
        engine.run([], [(3, len(ids))])
        for _ in range(3):
            engine.run([3], [])
        assert set(engine.take_hidden_states()) == ({3} if every else set())
