"""The hidden-state MLP: its shape, the split by request, learning a known function, the
predictor behind the shared interface, its file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdserve.instance.length_predictor import DecodeProgress, make_predictor
from pdserve.predictor.hidden_state import HiddenStatePredictor, train_predictor
from pdserve.predictor.mlp import TrainSettings, hidden_widths, split_requests
from pdserve.predictor.record import RecordedSet

torch.set_num_threads(1)
HIDDEN = 8


def synthetic(requests: int = 500, seed: int = 0, every: int = 30) -> RecordedSet:
    """Each request has a direction in hidden space; samples every `every` tokens until its
    output length, which is a known nonlinear function of that direction. The hidden vector
    is the direction plus noise plus a progress component, so remaining = output - generated
    is a function of the vector."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=HIDDEN) / np.sqrt(HIDDEN)
    v = rng.normal(size=HIDDEN) / np.sqrt(HIDDEN)
    progress_axis = np.zeros(HIDDEN)
    progress_axis[0] = 1.0
    hidden, rid, prompt, generated, remaining, outputs = [], [], [], [], [], []
    for r in range(requests):
        direction = rng.normal(size=HIDDEN)
        direction[0] = 0.0
        output = int(150 + 100 * np.tanh(direction @ w) + 60 * max(0.0, direction @ v))
        outputs.append(output)
        for g in range(every, output + 1, every):
            hidden.append(direction + 0.02 * rng.normal(size=HIDDEN) + progress_axis * g / 100)
            rid.append(r)
            prompt.append(20 + r % 7)
            generated.append(g)
            remaining.append(output - g)
    requests_table = {"ids": np.arange(requests), "prompt_tokens": 20 + np.arange(requests) % 7,
                      "output_tokens": np.array(outputs), "kind": np.array(["x"] * requests)}
    return RecordedSet(np.array(hidden, np.float32), np.array(rid), np.array(prompt),
                       np.array(generated), np.array(remaining), requests_table,
                       {"every_tokens": every, "max_tokens": 400})


def test_widths_scale_the_papers_mlp_to_the_hidden_size():
    assert hidden_widths(3584) == (2048, 512, 64)  # the paper's, for d = 3584
    assert hidden_widths(576) == (336, 80, 64)  # SmolLM2-135M
    assert hidden_widths(8) == (64, 64, 64)


def test_split_is_by_request_70_15_15():
    ids = np.repeat(np.arange(200), 5)
    train, val, test = split_requests(ids, seed=3)
    assert (len(train), len(val), len(test)) == (140, 30, 30)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert set(train) | set(val) | set(test) == set(range(200))
    assert split_requests(ids, seed=3)[2].tolist() == test.tolist()
    assert split_requests(ids, seed=4)[2].tolist() != test.tolist()
    with pytest.raises(ValueError, match="at least 3 requests"):
        split_requests(np.array([1, 1, 2]), seed=0)
    # grouped (by prompt): requests 2g and 2g+1 share a prompt and stay in one split
    groups = ids // 2
    parts = split_requests(ids, seed=3, groups=groups)
    assert [len(part) for part in parts] == [140, 30, 30]
    for part in parts:
        assert set(part // 2) and all({2 * g, 2 * g + 1} <= set(part) for g in set(part // 2))


def test_mlp_learns_a_known_function_of_the_hidden_vector():
    data = synthetic()
    predictor, report = train_predictor(data, TrainSettings(epochs=60, patience=10, seed=0))
    truth_spread = float(np.mean(np.abs(data.remaining_tokens
                                        - np.median(data.remaining_tokens))))
    train_mae, val_mae, test_mae = report.mae_tokens
    assert truth_spread > 45  # predicting a constant is far off
    assert test_mae < 8.0, report.summary()  # held-out requests, in tokens (3.8 measured)
    assert val_mae < 8.0 and train_mae < 8.0
    assert report.requests == (350, 75, 75)
    assert 1 <= report.best_epoch <= report.epochs_run <= 60


def test_predictor_interface_clamps_and_carries_between_refreshes(tmp_path):
    data = synthetic(requests=60)
    predictor, _ = train_predictor(data, TrainSettings(epochs=5, seed=1))
    h = [data.hidden[i] for i in range(3)]  # one array object per decode, kept
    raw = predictor.predict_hidden(np.stack(h))
    rows = [DecodeProgress(i, 20, 10, 10 + 10_000, hidden_state=h[i]) for i in range(3)]
    assert predictor.predict(rows) == pytest.approx(raw.tolist(), rel=1e-6)
    capped = [DecodeProgress(i, 20, 10, 15, hidden_state=h[i]) for i in range(3)]
    assert all(0.0 <= p <= 5.0 for p in predictor.predict(capped))
    # between refreshes: the last prediction less the tokens generated since
    later = predictor.predict([DecodeProgress(0, 20, 17, 10_000)])[0]
    assert later == pytest.approx(max(0.0, raw[0] - 7), abs=1e-4)
    # the same vector object again (a caller keeping the latest capture) carries too
    again = predictor.predict([DecodeProgress(1, 20, 14, 10_000, hidden_state=h[1])])[0]
    assert again == pytest.approx(max(0.0, raw[1] - 4), abs=1e-4)
    copy = predictor.predict([DecodeProgress(1, 20, 14, 10_000, hidden_state=h[1].copy())])
    assert copy[0] == pytest.approx(raw[1], rel=1e-6)  # a new capture is predicted afresh
    unseen = predictor.predict([DecodeProgress(999, 20, 30, 10_000)])[0]
    assert unseen == pytest.approx(max(0.0, predictor.prior_output_tokens - 30))
    predictor.observe_finished(20, 100)  # no-op
    with pytest.raises(ValueError, match="trained on vectors of 8"):
        predictor.predict_hidden(np.zeros((1, 7), np.float32))


def test_file_round_trip_and_make_predictor(tmp_path):
    data = synthetic(requests=60)
    predictor, _ = train_predictor(data, TrainSettings(epochs=3, seed=2))
    path = tmp_path / "p.pt"
    predictor.save(path)
    loaded = make_predictor(f"hidden-state:{path}")
    assert isinstance(loaded, HiddenStatePredictor) and loaded.name == "hidden-state"
    np.testing.assert_allclose(loaded.predict_hidden(data.hidden[:50]),
                               predictor.predict_hidden(data.hidden[:50]), rtol=1e-6)
    assert loaded.meta["split_seed"] == 2 and loaded.meta["every_tokens"] == 30
    assert loaded.prior_output_tokens == predictor.prior_output_tokens
    with pytest.raises(ValueError, match="does not exist"):
        make_predictor(f"hidden-state:{tmp_path / 'missing.pt'}")
    with pytest.raises(ValueError, match="needs a file"):
        make_predictor("hidden-state")
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a hidden-state predictor"):
        HiddenStatePredictor.load(tmp_path / "junk.pt")


def test_search_keeps_the_best_validation_run(monkeypatch):
    from pdserve.predictor import hidden_state

    monkeypatch.setattr(hidden_state, "SEARCH_LR", (1e-4, 1e-2))
    monkeypatch.setattr(hidden_state, "SEARCH_BATCH_SIZES", (32,))
    data = synthetic(requests=60)
    seen: list[float] = []
    predictor, report = hidden_state.search_predictor(
        data, TrainSettings(epochs=3, seed=0),
        log=lambda line: seen.append(float(line.split("MAE")[1].split()[0])))
    assert len(seen) == 2 and report.mae_tokens[1] == pytest.approx(min(seen), abs=0.01)
    assert predictor.meta["lr"] == report.lr and report.batch_size == 32
