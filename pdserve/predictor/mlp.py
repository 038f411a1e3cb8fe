"""ARES's remaining-length MLP and its training (`../shared/papers/ares.md`, section 4.2, Eq. 2;
section 4.4).

The paper's MLP for DeepSeek-R1-Distill-Qwen-7B (d = 3584) is d -> 2048 -> 512 -> 64 -> 1 with
ReLU. pdserve scales the widths to the serving model's hidden size d: each hidden width is the
paper's times d / 3584, rounded to a multiple of 16 and at least 64 (`hidden_widths`), so
SmolLM2-135M (d = 576) gets 576 -> 336 -> 80 -> 64 -> 1 and a 7B model the paper's exact
shape. Linear layers carry biases (Eq. 2 omits them).

Training, as section 4.4 says: L1 loss, AdamW, at most 100 epochs with early stopping on the
validation MAE (patience 10), the best epoch's weights kept; the data is split by request
70/15/15 (`split_requests`), so no request has samples in two splits. Inputs are
standardised per feature and targets divided by the training mean (both stored with the
weights); the loss is L1 in those units, i.e. the token MAE up to a constant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

PAPER_HIDDEN_SIZE = 3584
PAPER_WIDTHS = (2048, 512, 64)
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)


def hidden_widths(hidden_size: int) -> tuple[int, int, int]:
    """The paper's widths scaled by hidden_size / 3584 (multiples of 16, at least 64)."""
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be positive, got {hidden_size}")
    scale = hidden_size / PAPER_HIDDEN_SIZE
    w1, w2, w3 = (max(64, 16 * round(width * scale / 16)) for width in PAPER_WIDTHS)
    return w1, w2, w3


class LengthMLP(nn.Module):
    """h -> W1 -> ReLU -> W2 -> ReLU -> W3 -> ReLU -> w4 (Eq. 2)."""

    def __init__(self, hidden_size: int, widths: tuple[int, int, int]) -> None:
        super().__init__()
        w1, w2, w3 = widths
        self.hidden_size, self.widths = hidden_size, widths
        self.layers = nn.Sequential(nn.Linear(hidden_size, w1), nn.ReLU(), nn.Linear(w1, w2),
                                    nn.ReLU(), nn.Linear(w2, w3), nn.ReLU(), nn.Linear(w3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).squeeze(-1)


def split_requests(request_ids: np.ndarray, seed: int, groups: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct request ids shuffled by `seed` and cut 70/15/15 into (train, val, test).
    With `groups` (a label per entry of `request_ids`, e.g. the prompt), whole groups are
    shuffled and cut, so requests of one group never fall in two splits."""
    labels = request_ids if groups is None else groups
    keys = np.unique(labels)
    if len(keys) < 3:
        raise ValueError(f"a split by request needs at least 3 requests, got {len(keys)}")
    keys = np.random.default_rng(seed).permutation(keys)
    val_count = max(1, round(len(keys) * SPLIT_FRACTIONS[1]))
    test_count = max(1, round(len(keys) * SPLIT_FRACTIONS[2]))
    train_count = len(keys) - val_count - test_count
    parts = (keys[:train_count], keys[train_count:train_count + val_count],
             keys[train_count + val_count:])
    if groups is None:
        return tuple(np.sort(part) for part in parts)  # type: ignore[return-value]
    return tuple(np.unique(request_ids[np.isin(groups, part)])  # type: ignore[return-value]
                 for part in parts)


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 100
    patience: int = 10  # epochs without a better validation MAE before stopping
    lr: float = 1e-3
    weight_decay: float = 1e-2
    batch_size: int = 64
    seed: int = 0  # split, initialisation and batch order
    clamped_loss: bool = True  # loss on the prediction clamped to the cap (`fit_mlp`)

    def __post_init__(self) -> None:
        for name in ("epochs", "patience", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class Normaliser:
    """Per-feature standardisation of inputs and the target unit (tokens per output unit)."""

    mean: np.ndarray
    std: np.ndarray
    target_scale: float

    @classmethod
    def fit(cls, hidden: np.ndarray, targets: np.ndarray) -> Normaliser:
        std = hidden.std(axis=0)
        scale = float(np.mean(targets)) if len(targets) else 1.0
        return cls(hidden.mean(axis=0).astype(np.float32),
                   np.where(std > 1e-6, std, 1.0).astype(np.float32),
                   scale if scale > 0 else 1.0)

    def inputs(self, hidden: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((hidden - self.mean) / self.std).astype(np.float32))


@dataclass
class FitResult:
    model: LengthMLP
    normaliser: Normaliser
    best_epoch: int
    epochs_run: int
    best_val_mae_tokens: float
    seconds: float


def mae_tokens(model: LengthMLP, normaliser: Normaliser, hidden: np.ndarray,
               targets: np.ndarray, cap: np.ndarray | None = None) -> float:
    """Mean absolute error in tokens of the predictions clamped to [0, cap]."""
    if len(targets) == 0:
        return math.nan
    predicted = predict_tokens(model, normaliser, hidden)
    if cap is not None:
        predicted = np.minimum(predicted, cap)
    return float(np.mean(np.abs(predicted - targets)))


def predict_tokens(model: LengthMLP, normaliser: Normaliser, hidden: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(normaliser.inputs(hidden)).numpy() * normaliser.target_scale
    return np.maximum(out, 0.0)


def fit_mlp(train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
            settings: TrainSettings, log: Callable[[str], None] | None = None,
            train_cap: np.ndarray | None = None, val_cap: np.ndarray | None = None
            ) -> FitResult:
    """Train with L1 loss and AdamW; keep the weights of the best validation-MAE epoch.
    With caps (the tokens each sample's `max_tokens` leaves) the loss and the validation MAE
    are taken on the prediction clamped to the cap, as the predictor answers in use: a
    request whose answer runs to the cap then costs nothing for being predicted longer."""
    if len(train_y) == 0 or len(val_y) == 0:
        raise ValueError(f"training needs samples in both splits (train {len(train_y)}, "
                         f"validation {len(val_y)})")
    started = time.monotonic()
    torch.manual_seed(settings.seed)
    normaliser = Normaliser.fit(train_x, train_y)
    model = LengthMLP(train_x.shape[1], hidden_widths(train_x.shape[1]))
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    inputs = normaliser.inputs(train_x)
    targets = torch.from_numpy((train_y / normaliser.target_scale).astype(np.float32))
    caps = (torch.from_numpy((train_cap / normaliser.target_scale).astype(np.float32))
            if train_cap is not None else None)
    generator = torch.Generator().manual_seed(settings.seed)
    best = (math.inf, 0, {k: v.clone() for k, v in model.state_dict().items()})
    epoch = 0
    for epoch in range(1, settings.epochs + 1):
        model.train()
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(order), settings.batch_size):
            rows = order[start:start + settings.batch_size]
            predicted = model(inputs[rows])
            if caps is not None:
                predicted = torch.minimum(predicted, caps[rows])
            loss = nn.functional.l1_loss(predicted, targets[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        model.eval()
        val_mae = mae_tokens(model, normaliser, val_x, val_y, val_cap)
        if log is not None:
            log(f"epoch {epoch:3d}: validation MAE {val_mae:8.2f} tokens")
        if val_mae < best[0]:
            best = (val_mae, epoch, {k: v.clone() for k, v in model.state_dict().items()})
        elif epoch - best[1] >= settings.patience:
            break
    model.load_state_dict(best[2])
    model.eval()
    return FitResult(model, normaliser, best[1], epoch, best[0], time.monotonic() - started)
