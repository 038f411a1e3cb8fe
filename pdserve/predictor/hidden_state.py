"""ARES's `hidden-state` remaining-length predictor (`../shared/papers/ares.md`, section 4):
the MLP of `mlp.py` on the last-layer hidden state of a decode's last token, refreshed every
k generated tokens (the engine captures the vectors: `engine/hidden_capture.py`).

`HiddenStatePredictor` implements `RemainingLengthPredictor`
(`instance/length_predictor.py`) and is registered there as `hidden-state`, so
`make_predictor("hidden-state:/path/predictor.pt")` loads a file written by
`pdserve predictor train`. A decode that comes with a hidden state is predicted by the MLP
(all of a call's vectors in one batch); one without (between refreshes), or with the very
vector object it came with last time (a caller keeping the latest capture), gets its last
prediction less the tokens generated since, and one never seen the training requests'
median output length less its generated tokens. Every prediction is clamped to
[0, max_output_tokens - generated_tokens]. It does not learn online (`observe_finished` is
a no-op).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pdserve.instance.length_predictor import PREDICTOR_FACTORIES, DecodeProgress
from pdserve.predictor.mlp import (
    LengthMLP,
    Normaliser,
    TrainSettings,
    fit_mlp,
    split_requests,
)
from pdserve.predictor.record import RecordedSet

FILE_VERSION = 1
_REMEMBERED_REQUESTS = 65536  # last predictions kept for decodes between refreshes


class HiddenStatePredictor:
    """The trained MLP behind the `RemainingLengthPredictor` protocol."""

    name = "hidden-state"

    def __init__(self, model: LengthMLP, normaliser: Normaliser, prior_output_tokens: float,
                 meta: dict[str, float | int | str] | None = None) -> None:
        self.model = model.eval()
        self.normaliser = normaliser
        self.prior_output_tokens = prior_output_tokens  # training requests' median
        self.meta = dict(meta or {})
        # request id -> (prediction, generated tokens then, the vector it came from)
        self._last: OrderedDict[int, tuple[float, int, object]] = OrderedDict()

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    def predict_hidden(self, hidden: np.ndarray) -> np.ndarray:
        """Remaining tokens (>= 0, unclamped above) for a [n, hidden_size] batch."""
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(f"hidden states of shape {hidden.shape}; this predictor was "
                             f"trained on vectors of {self.hidden_size}")
        with torch.no_grad():
            out = self.model(self.normaliser.inputs(hidden)).numpy()
        return np.maximum(out * self.normaliser.target_scale, 0.0)

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        fresh = [i for i, d in enumerate(decodes)
                 if d.hidden_state is not None and not self._seen(d)]
        predicted: dict[int, float] = {}
        if fresh:
            batch = np.stack([np.asarray(decodes[i].hidden_state, dtype=np.float32)
                              for i in fresh])
            for i, value in zip(fresh, self.predict_hidden(batch).tolist(), strict=True):
                predicted[i] = value
                self._remember(decodes[i], value)
        out = []
        for i, decode in enumerate(decodes):
            value = predicted.get(i)
            if value is None:
                value = self._carried(decode)
            cap = max(0, decode.max_output_tokens - decode.generated_tokens)
            out.append(float(min(max(value, 0.0), cap)))
        return out

    def _carried(self, decode: DecodeProgress) -> float:
        last = self._last.get(decode.request_id)
        if last is None:
            return self.prior_output_tokens - decode.generated_tokens
        value, generated, _ = last
        return value - (decode.generated_tokens - generated)

    def _seen(self, decode: DecodeProgress) -> bool:
        last = self._last.get(decode.request_id)
        return last is not None and last[2] is decode.hidden_state

    def _remember(self, decode: DecodeProgress, value: float) -> None:
        request_id = decode.request_id
        self._last[request_id] = (value, decode.generated_tokens, decode.hidden_state)
        self._last.move_to_end(request_id)
        if len(self._last) > _REMEMBERED_REQUESTS:
            self._last.popitem(last=False)

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """Trained offline; nothing to learn here."""

    # ---- file ----
    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"version": FILE_VERSION, "hidden_size": self.hidden_size,
                    "widths": list(self.model.widths), "state": self.model.state_dict(),
                    "mean": torch.from_numpy(self.normaliser.mean),
                    "std": torch.from_numpy(self.normaliser.std),
                    "target_scale": self.normaliser.target_scale,
                    "prior_output_tokens": self.prior_output_tokens, "meta": self.meta}, path)

    @classmethod
    def load(cls, path: Path) -> HiddenStatePredictor:
        if not Path(path).is_file():
            raise ValueError(f"hidden-state predictor file {path} does not exist (write one "
                             "with `pdserve predictor train`)")
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a file torch cannot read
            raise ValueError(f"{path} is not a hidden-state predictor file: {err}") from err
        if not isinstance(saved, dict) or saved.get("version") != FILE_VERSION:
            raise ValueError(f"{path}: not a version-{FILE_VERSION} hidden-state predictor")
        model = LengthMLP(int(saved["hidden_size"]), tuple(saved["widths"]))
        model.load_state_dict(saved["state"])
        normaliser = Normaliser(saved["mean"].numpy(), saved["std"].numpy(),
                                float(saved["target_scale"]))
        return cls(model, normaliser, float(saved["prior_output_tokens"]), saved["meta"])


def _factory(options: dict[str, str], seed: int) -> HiddenStatePredictor:
    if "path" not in options:
        raise ValueError("the hidden-state predictor needs a file: "
                         "'hidden-state:/path/to/predictor.pt'")
    return HiddenStatePredictor.load(Path(options["path"]))


PREDICTOR_FACTORIES["hidden-state"] = _factory


@dataclass
class TrainReport:
    requests: tuple[int, int, int]  # train, validation, test
    samples: tuple[int, int, int]
    mae_tokens: tuple[float, float, float]
    best_epoch: int
    epochs_run: int
    seconds: float
    widths: tuple[int, int, int]
    hidden_size: int
    lr: float
    batch_size: int

    def summary(self) -> str:
        names = ("train", "validation", "test")
        lines = [f"MLP {self.hidden_size} -> {' -> '.join(map(str, self.widths))} -> 1, "
                 f"lr {self.lr:g}, batch {self.batch_size}, best epoch {self.best_epoch} of "
                 f"{self.epochs_run} ({self.seconds:.1f} s)"]
        for name, requests, samples, mae in zip(names, self.requests, self.samples,
                                                self.mae_tokens, strict=True):
            lines.append(f"  {name:10s} {requests:4d} requests {samples:6d} samples  "
                         f"MAE {mae:8.2f} tokens")
        return "\n".join(lines)


def train_predictor(data: RecordedSet, settings: TrainSettings,
                    log: Callable[[str], None] | None = None
                    ) -> tuple[HiddenStatePredictor, TrainReport]:
    """Split `data` by request (70/15/15, `settings.seed`; generations of one prompt stay
    together), train, measure each split."""
    splits = split_requests(data.request_id, settings.seed, data.prompt_groups())
    parts = [data.subset(np.isin(data.request_id, ids)) for ids in splits]
    train, val, test = parts
    max_tokens = int(data.meta.get("max_tokens", 0))
    train_cap, val_cap = ((np.maximum(max_tokens - part.generated_tokens, 0)
                           if max_tokens > 0 and settings.clamped_loss else None)
                          for part in (train, val))
    fit = fit_mlp(train.hidden, train.remaining_tokens.astype(np.float64), val.hidden,
                  val.remaining_tokens.astype(np.float64), settings, log, train_cap, val_cap)
    outputs = data.requests.get("output_tokens")
    ids = data.requests.get("ids")
    if outputs is not None and ids is not None and np.isin(ids, splits[0]).any():
        prior = float(np.median(outputs[np.isin(ids, splits[0])]))
    else:  # no per-request table: the first sample of each request sees its whole output
        prior = float(np.median(train.remaining_tokens + train.generated_tokens))
    meta = {"split_seed": settings.seed, "every_tokens": int(data.meta.get("every_tokens", 0)),
            "best_epoch": fit.best_epoch, "model": str(data.meta.get("model", "")),
            "max_tokens": max_tokens}
    predictor = HiddenStatePredictor(fit.model, fit.normaliser, prior, meta)
    maes = tuple(_clamped_mae(predictor, part, meta["max_tokens"]) for part in parts)
    report = TrainReport(tuple(len(ids) for ids in splits), tuple(len(p) for p in parts),
                         maes, fit.best_epoch, fit.epochs_run, fit.seconds, fit.model.widths,
                         fit.model.hidden_size, settings.lr, settings.batch_size)
    return predictor, report


def _clamped_mae(predictor: HiddenStatePredictor, part: RecordedSet, max_tokens: int
                 ) -> float:
    """MAE in tokens of the predictions as `predict` gives them: clamped to the tokens the
    recording's cap leaves (no upper clamp without a cap)."""
    if len(part) == 0:
        return float("nan")
    predicted = predictor.predict_hidden(part.hidden)
    if max_tokens > 0:
        predicted = np.minimum(predicted, np.maximum(max_tokens - part.generated_tokens, 0))
    return float(np.mean(np.abs(predicted - part.remaining_tokens)))


SEARCH_LR = (1e-4, 3e-4, 1e-3)  # the paper's search ranges (section 4.4), on a grid
SEARCH_BATCH_SIZES = (16, 64, 128)


def search_predictor(data: RecordedSet, settings: TrainSettings,
                     log: Callable[[str], None] | None = None
                     ) -> tuple[HiddenStatePredictor, TrainReport]:
    """Train on each (learning rate, batch size) of the grid and keep the run with the best
    validation MAE (the test split plays no part in the choice). The paper also searched
    depth and widths; pdserve keeps the paper's depth and scaled widths."""
    best: tuple[HiddenStatePredictor, TrainReport] | None = None
    for lr in SEARCH_LR:
        for batch_size in SEARCH_BATCH_SIZES:
            trial = replace(settings, lr=lr, batch_size=batch_size)
            predictor, report = train_predictor(data, trial)
            if log is not None:
                log(f"lr {lr:g} batch {batch_size:3d}: validation MAE "
                    f"{report.mae_tokens[1]:8.2f} tokens (best epoch {report.best_epoch})")
            if best is None or report.mae_tokens[1] < best[1].mae_tokens[1]:
                best = (predictor, report)
    assert best is not None
    best[0].meta.update({"lr": best[1].lr, "batch_size": best[1].batch_size})
    return best


def train_from_file(data_paths: Sequence[Path], out: Path, settings: TrainSettings,
                    log: Callable[[str], None] | None = None, search: bool = False
                    ) -> TrainReport:
    data = RecordedSet.load_many(data_paths)
    train = search_predictor if search else train_predictor
    predictor, report = train(data, settings, log)
    predictor.save(out)
    return report
