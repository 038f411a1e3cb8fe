"""`pdserve predictor record | train | eval` end to end on the tiny random model."""

from __future__ import annotations

import re

import numpy as np

from pdserve.cli import main
from pdserve.predictor.hidden_state import HiddenStatePredictor
from pdserve.predictor.record import RecordedSet


def test_record_train_eval(tmp_path, capsys):
    data, out = tmp_path / "rec.npz", tmp_path / "p.pt"
    assert main(["predictor", "record", "--model", "tiny", "--prompts", "12", "--max-tokens",
                 "24", "--every-tokens", "4", "--batch-size", "5", "--out", str(data)]) == 0
    recorded = RecordedSet.load(data)
    assert len(recorded.requests["ids"]) == 12
    assert len(recorded) == int((recorded.requests["output_tokens"] // 4).sum())
    assert recorded.meta["model"] == "tiny"
    assert main(["predictor", "train", "--data", str(data), "--out", str(out), "--epochs",
                 "4", "--patience", "2"]) == 0
    trained = capsys.readouterr().out
    assert re.search(r"train\s+8 requests", trained) and re.search(r"test\s+2 requests",
                                                                     trained)
    assert HiddenStatePredictor.load(out).meta["every_tokens"] == 4
    assert main(["predictor", "eval", "--data", str(data), "--predictor", str(out)]) == 0
    report = capsys.readouterr().out
    mlp = float(re.search(r"hidden-state MLP MAE\s+([\d.]+)", report).group(1))
    history = float(re.search(r"history MAE\s+([\d.]+)", report).group(1))
    assert np.isfinite(mlp) and np.isfinite(history) and mlp >= 0 and history >= 0
    assert re.search(r"[\d.]+ ms per batch of 10", report)


def test_record_refuses_a_bad_setting(tmp_path, capsys):
    assert main(["predictor", "record", "--model", "tiny", "--prompts", "2", "--max-tokens",
                 "0", "--out", str(tmp_path / "x.npz")]) == 2
    assert "max_tokens must be at least 1" in capsys.readouterr().err
    assert main(["predictor", "train", "--data", str(tmp_path / "none.npz"), "--out",
                 str(tmp_path / "p.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err
