"""AMPD's tunables (`../shared/papers/ampd.txt`, sec. 7.1): Alg. 1's thresholds α and β (a
prefill runs on a prefill worker whose windowed TTFT is within α of the TTFT SLO, else on
its session's decode worker if that one's windowed ITL is within β of the ITL SLO) and
Alg. 2's lookahead window w, also its postponement cap. The paper's defaults: 0.9, 0.85, 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.policies.ampd.context import ALPHA, BETA
from pdserve.policies.ampd.reordering import WINDOW


@dataclass(frozen=True)
class AmpdSettings:
    alpha: float = ALPHA
    beta: float = BETA
    window: int = WINDOW  # Alg. 2: tasks looked at per dequeue, and the postponement cap

    def __post_init__(self) -> None:
        if not (self.alpha > 0 and self.beta > 0):
            raise ValueError(f"ampd alpha and beta must be positive, got {self.alpha}, "
                             f"{self.beta}")
        if self.window < 1:
            raise ValueError(f"ampd window must be at least 1, got {self.window}")
