"""Arrow's tunables that pdserve adds to the paper: flip damping (`../shared/papers/arrow.md`;
see `context.py` for why). An instance that Alg. 3 or 4 moved stays `min_dwell_s` on its new
side, and the monitor's own flips (sec. 5.5 rules 2 and 3) wait `monitor_cooldown_s` after
the last one, because the windowed token interval they read still holds pre-flip steps for
one window."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArrowSettings:
    min_dwell_s: float = 5.0  # an instance Arrow flips stays on its new side this long
    monitor_cooldown_s: float = 5.0  # between two flips of Arrow's monitor rules

    def __post_init__(self) -> None:
        for name in ("min_dwell_s", "monitor_cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"arrow {name} must not be negative, got "
                                 f"{getattr(self, name)}")
