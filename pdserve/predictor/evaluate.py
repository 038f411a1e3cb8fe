"""`pdserve predictor eval`: the hidden-state MLP against the `history` predictor on the same
held-out requests, and the MLP's inference time per batch of 10 (ARES Table 1's figure).

The test requests are those `train` held out (the split by request with the seed stored in
the predictor file). Both predictors answer through `RemainingLengthPredictor.predict` with
the same `DecodeProgress` rows (the MLP's with the recorded hidden state), so both are
clamped to [0, max_tokens - generated] alike.

The comparison: the shared `history` predictor (`make_predictor("history")`), told every
training request through `observe_finished`: the `quantile` (default the median, which
minimises the MAE) of the output lengths of training requests in the sample's input-length
bucket that generated more tokens than it has, less those tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from pdserve.instance.length_predictor import (
    DecodeProgress,
    RemainingLengthPredictor,
    make_predictor,
)
from pdserve.predictor.hidden_state import HiddenStatePredictor
from pdserve.predictor.mlp import split_requests
from pdserve.predictor.record import RecordedSet

TIMING_BATCH = 10
TIMING_REPEATS = 200


def history_predictor(quantile: float) -> tuple[RemainingLengthPredictor, str]:
    """The shared `history` predictor (`instance/simple_predictors.py`) with an unbounded
    window, so it keeps every training request it is told about; and a note."""
    return (make_predictor(f"history:q={quantile},window=1000000000"),
            f"the shared `history` predictor (q={quantile:g})")


@dataclass
class EvalReport:
    test_requests: int
    test_samples: int
    mlp_mae_tokens: float
    history_mae_tokens: float
    history_note: str
    batch10_ms: float
    batch1_ms: float
    by_kind: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # n, mlp, hist
    by_stage: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"held-out test split: {self.test_requests} requests, {self.test_samples} "
                 "samples",
                 f"  hidden-state MLP MAE  {self.mlp_mae_tokens:8.2f} tokens",
                 f"  history MAE           {self.history_mae_tokens:8.2f} tokens",
                 f"  ({self.history_note})",
                 f"  MLP inference: {self.batch10_ms:.3f} ms per batch of {TIMING_BATCH}, "
                 f"{self.batch1_ms:.3f} ms per batch of 1 (median of {TIMING_REPEATS}, "
                 f"{torch.get_num_threads()} torch threads)"]
        for title, table in (("by requested length", self.by_kind),
                             ("by tokens generated", self.by_stage)):
            if table:
                lines.append(f"  {title}: samples, MLP MAE, history MAE")
                lines += [f"    {name:12s} {n:6d} {mlp:8.2f} {hist:8.2f}"
                          for name, (n, mlp, hist) in table.items()]
        return "\n".join(lines)


def _progress_rows(data: RecordedSet, max_tokens: int, with_hidden: bool
                   ) -> list[DecodeProgress]:
    return [DecodeProgress(int(data.request_id[i]), int(data.prompt_tokens[i]),
                           int(data.generated_tokens[i]), max_tokens,
                           hidden_state=data.hidden[i] if with_hidden else None)
            for i in range(len(data))]


def batch_time_ms(predictor: HiddenStatePredictor, rows: list[DecodeProgress],
                  batch: int) -> float:
    """Median wall time of one `predict` call on `batch` decodes with new hidden states
    (fresh vector objects each call, so every call runs the MLP)."""
    if not rows:
        return math.nan
    picked = [rows[i % len(rows)] for i in range(batch)]
    calls = [[replace(row, hidden_state=np.array(row.hidden_state)) for row in picked]
             for _ in range(TIMING_REPEATS + 1)]
    predictor.predict(calls[0])  # warm-up
    times = []
    for call in calls[1:]:
        started = time.perf_counter()
        predictor.predict(call)
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1e3)


def evaluate(data_paths: Sequence[Path], predictor_path: Path, seed: int | None = None,
             quantile: float = 0.5) -> EvalReport:
    data = RecordedSet.load_many(data_paths)
    predictor = HiddenStatePredictor.load(predictor_path)
    split_seed = int(predictor.meta.get("split_seed", 0)) if seed is None else seed
    train_ids, _, test_ids = split_requests(data.request_id, split_seed,
                                              data.prompt_groups())
    test = data.subset(np.isin(data.request_id, test_ids))
    max_tokens = int(data.meta["max_tokens"])
    truth = test.remaining_tokens.astype(np.float64)
    mlp = np.asarray(predictor.predict(_progress_rows(test, max_tokens, True)))
    history, note = history_predictor(quantile)
    requests, training = data.requests, set(train_ids.tolist())
    for rid, prompt, output in zip(requests["ids"], requests["prompt_tokens"],
                                   requests["output_tokens"], strict=True):
        if int(rid) in training:
            history.observe_finished(int(prompt), int(output))
    hist = np.asarray(history.predict(_progress_rows(test, max_tokens, False)))
    report = EvalReport(len(test_ids), len(test), float(np.mean(np.abs(mlp - truth))),
                        float(np.mean(np.abs(hist - truth))), note,
                        batch_time_ms(predictor, _progress_rows(test, max_tokens, True),
                                      TIMING_BATCH),
                        batch_time_ms(predictor, _progress_rows(test, max_tokens, True), 1))
    kind_of = dict(zip(requests["ids"].tolist(), requests["kind"].tolist(), strict=True))
    kinds = np.array([kind_of[int(rid)] for rid in test.request_id])
    for kind in sorted(set(kinds.tolist())):
        mask = kinds == kind
        report.by_kind[kind] = (int(mask.sum()), float(np.mean(np.abs(mlp - truth)[mask])),
                                float(np.mean(np.abs(hist - truth)[mask])))
    edges = [0, 40, 100, 200, 10**9]
    for low, high in zip(edges, edges[1:], strict=False):
        mask = (test.generated_tokens > low) & (test.generated_tokens <= high)
        if mask.any():
            name = f"{low + 1}-{high}" if high < 10**9 else f">{low}"
            report.by_stage[name] = (int(mask.sum()),
                                     float(np.mean(np.abs(mlp - truth)[mask])),
                                     float(np.mean(np.abs(hist - truth)[mask])))
    return report
