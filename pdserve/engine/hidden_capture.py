"""Hidden states for the remaining-length predictor, captured every k generated tokens.

ARES (`../shared/papers/ares.md`, section 4.2-4.3) predicts a decode's remaining output
length from the last-layer hidden state of its last token and refreshes the prediction
every k generated tokens (k = 20 in the paper). The engine's forward already returns, for
every sequence that samples a token, the final normed hidden state at the position that
produced it; this keeps a copy of that vector whenever the sequence's generated-token count
reaches a multiple of k, so the live worker (or `pdserve predictor record`) can take the
vectors captured since it last asked.

The vector captured at count g (a multiple of k) is the hidden state that produced the g-th
output token: it has seen the prompt and the first g - 1 output tokens. A predictor trained
on these vectors predicts the tokens still to come after the g-th (output length - g).
With k = 0 nothing is captured and the engine does no extra work.
"""

from __future__ import annotations

import numpy as np
import torch

DEFAULT_CAPTURE_EVERY_TOKENS = 20


class HiddenStateCapture:
    """Request id -> the latest captured float32 hidden vector, until taken."""

    def __init__(self, every_tokens: int) -> None:
        if every_tokens < 0:
            raise ValueError(f"hidden_state_every_tokens must be >= 0, got {every_tokens}")
        self.every_tokens = every_tokens
        self._captured: dict[int, np.ndarray] = {}
        self.captured_total = 0  # vectors captured since the engine started

    @property
    def enabled(self) -> bool:
        return self.every_tokens > 0

    def offer(self, request_id: int, generated_tokens: int, hidden: torch.Tensor) -> None:
        """A sequence sampled its `generated_tokens`-th token from `hidden`."""
        if generated_tokens <= 0 or generated_tokens % self.every_tokens:
            return
        self._captured[request_id] = hidden.detach().to(torch.float32).cpu().numpy().copy()
        self.captured_total += 1

    def take(self) -> dict[int, np.ndarray]:
        """The vectors captured since the last call (a newer capture of a request replaces
        an older one not yet taken)."""
        captured, self._captured = self._captured, {}
        return captured
