"""What a policy lets a planner search: its deployment shape and its knobs, as plain data.

Each paper's `preset.py` declares the spaces of its presets next to their composition
(`SEARCH_SPACES`); `policies/search_spaces.py` gathers them with the generic presets', the
compositions across papers, and the pairs of components that cannot compose, each with its
reason. `pdserve plan` (`pdserve.planning`) enumerates the candidates; nothing here runs.

A space's `shape` says how the GPUs become instances:
  colocated       every instance runs both phases (`cluster.instances`)
  disaggregated   a prefill : decode split (`cluster.prefill`, `cluster.decode`, plus
                  `cluster.reserve` when a knob sets it)
  taichi          TaiChi's sliders R_PD, S_P, S_D (`pdserve.planning.taichi.slider_grid`)
Every shape tries each tensor-parallel degree the model fits, all GPUs in use; a
disaggregated space also gives its prefill and decode pools different degrees, unless it
says why they must share one (`one_degree`: Arrow's, whose instances flip pools). `chunk_sizes`
are the per-step token budgets tried (`instance.chunk_size_tokens`); `knobs` the policy's
own settings, every combination tried; `fixed` what a composition sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SHAPES = ("colocated", "disaggregated", "taichi")
CHUNK_SIZES = (512, 2048, 8192)  # tokens per step; the large one is chunking (nearly) off


@dataclass(frozen=True)
class Knob:
    path: str  # the config value it sets ("policy.arrow.min_dwell_s")
    values: tuple[Any, ...]
    trades: str  # what moving it trades, for the reader of a plan

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.path!r} has no values")


@dataclass(frozen=True)
class SearchSpace:
    name: str  # what the plan's table calls it: a preset, or preset+component
    preset: str  # policy.name
    paper: str  # whose algorithm it is ("" for the generic baselines)
    shape: str
    knobs: tuple[Knob, ...] = ()
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES
    fixed: Mapping[str, Any] = field(default_factory=dict)  # config values it always sets
    sessions_only: bool = False  # meaningful only on multi-round session workloads
    same_as: tuple[str, ...] = ()  # other preset names with exactly this composition
    # disaggregated: why both pools must take one tensor-parallel degree ("": each pool may
    # take its own, `pdserve.planning.candidates.mixed_degree_candidates`)
    one_degree: str = ""

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"search space {self.name!r}: shape must be one of "
                             f"{', '.join(SHAPES)}, got {self.shape!r}")


@dataclass(frozen=True)
class CannotCompose:
    """Two components a composition may not join, and why (what building it would say)."""

    first: str
    second: str
    reason: str
    # a config that states the pair, when one can (building it must fail); empty: no config
    # field can even express it
    config: Mapping[str, Any] = field(default_factory=dict)
