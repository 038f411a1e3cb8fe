"""The hidden-state MLP against `history` over several request splits of one recording.

One split's test set is a few dozen requests, so its MAE moves with the split; this trains
the predictor (with the learning-rate x batch-size search) on each of `--seeds` splits and
prints both predictors' MAE on each split's held-out test requests, then the mean.

    PYTHONPATH=$PWD python bench/predictor_mae.py --data results/predictor/FILE.npz
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from pdserve.predictor.evaluate import evaluate
from pdserve.predictor.hidden_state import search_predictor, train_predictor
from pdserve.predictor.mlp import TrainSettings
from pdserve.predictor.record import RecordedSet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, nargs="+", required=True)
    parser.add_argument("--seeds", type=int, default=5, help="splits 0..N-1 [5]")
    parser.add_argument("--no-search", action="store_true", help="default settings only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = RecordedSet.load_many(args.data)
    requests = len(np.unique(data.request_id))
    print(f"{' + '.join(map(str, args.data))}: {len(data)} samples, {requests} requests "
          "with samples")
    print("split  test-requests  MLP-MAE  history-MAE  batch10-ms  (lr, batch)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            train = train_predictor if args.no_search else search_predictor
            predictor, report = train(data, TrainSettings(seed=seed))
            path = Path(tmp) / f"p{seed}.pt"
            predictor.save(path)
            result = evaluate(args.data, path, seed=seed)
            rows.append((result.mlp_mae_tokens, result.history_mae_tokens))
            print(f"{seed:5d}  {result.test_requests:13d}  {result.mlp_mae_tokens:7.2f}  "
                  f"{result.history_mae_tokens:11.2f}  {result.batch10_ms:10.3f}  "
                  f"({report.lr:g}, {report.batch_size})", flush=True)
        note = result.history_note
    mlp, history = np.array(rows).T
    print(f" mean  {'':13s}  {mlp.mean():7.2f}  {history.mean():11.2f}   MLP lower on "
          f"{int((mlp < history).sum())} of {len(rows)} splits")
    print(f"history: {note}")


if __name__ == "__main__":
    main()
