"""`bench/ares_live_mlp.py --quick` end to end: a hidden-state predictor recorded and trained
on the default model (the documented `pdserve predictor record | train` commands, tiny),
then four live servers (ares with it, ares with history, reschedule-current, vllm) replaying
the same few prompts over loopback. Whether the pipeline runs, not its figures
(docs/results/ares.md has those).

Slow: the default model on the CPU, four server start-ups; about 2-4 minutes of wall time on
the shared 2-core machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("ares-mlp", "ares-history", "reschedule-current", "vllm")


def run(*args: str, timeout_s: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


@pytest.mark.slow
def test_ares_live_mlp_quick(tmp_path: Path) -> None:
    data, predictor, out = tmp_path / "rec.npz", tmp_path / "p.pt", tmp_path / "out"
    run("-m", "pdserve.cli", "predictor", "record", "--prompts", "24", "--max-tokens", "40",
        "--batch-size", "12", "--out", str(data), timeout_s=300)
    run("-m", "pdserve.cli", "predictor", "train", "--data", str(data), "--out",
        str(predictor), "--epochs", "3", "--patience", "2", timeout_s=120)
    text = run("bench/ares_live_mlp.py", "--quick", "--predictor", str(predictor), "--data",
               str(data), "--out", str(out), timeout_s=900)
    for label in CONTENDERS:  # a row per run and a row per contender
        assert len(re.findall(rf"^{re.escape(label)}\s+\d", text, re.MULTILINE)) == 2, text
    assert "no verdict from 1 seed" in text
    report = json.loads((out / "ares_live_mlp.json").read_text())
    assert [r["contender"] for r in report["runs"]] == list(CONTENDERS)
    for run_ in report["runs"]:
        assert run_["requests"] == 8 and run_["completed"] >= 1, run_
        assert run_["preemptions"] >= 0 and run_["migrations"] >= 0  # read from /metrics
        assert 0 <= run_["output_tokens_mean"] <= 48
    assert report["runs"][-1]["migrations"] == 0  # vllm never rebalances
