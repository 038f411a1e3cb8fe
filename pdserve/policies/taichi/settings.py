"""TaiChi's sliders and the instance layout they make (TaiChi sec. 3.1, "Configurable Sliders").

TaiChi (Wang et al., "Prefill-Decode Aggregation or Disaggregation? Unifying Both for
Goodput-Optimized LLM Serving") runs two kinds of instance that differ only in their chunk
size: P-heavy (large chunks, fast prefill, high interference on co-batched decodes) and
D-heavy (small chunks, slow prefill, low interference). Three sliders place a cluster in the
design space:

  R_PD  P-heavy : D-heavy instances        (`PolicySetup.prefill` : `PolicySetup.decode`)
  S_P   P-heavy chunk size, tokens         (`chunk_p_tokens`)
  S_D   D-heavy chunk size, tokens         (`chunk_d_tokens`; 0 = takes no prefill tokens)

The kind of an instance follows from its chunk size, as in the paper ("capability
differentiation achieved purely through chunk size"), so the two ends of the design space
are settings of the same code path:

  pure aggregation     S_P == S_D: every instance has one chunk size, so every instance is
                       D-heavy and mixed: prefill by load, decode in place (Alg. 1 stage 1),
                       nothing to flow. Reproduces `colocated` exactly.
  pure disaggregation  S_D == 0: D-heavy instances take no prefill tokens and, there being
                       no aggregated batch handling on either side, P-heavy instances take no
                       decodes (S_P = the maximum context disables chunking). Decodes start
                       on the D-heavy instance with the least KV in use (Alg. 1 stage 1),
                       and nothing can flow to P-heavy. Reproduces `static-pd` exactly.
  hybrid               S_P > S_D > 0: both kinds run mixed batches; Alg. 1 and Alg. 2 shift
                       latency between requests.

Defaults: S_P = 2048 and S_D = 512, the best setting of `pdserve plan --policy taichi` on
the chat SLO1 setup (Qwen2.5-14B, 4 x A100, ShareGPT, TTFT 3 s, TPOT 110 ms) with R_PD = 1:3
(`--prefill 1 --decode 3`); docs/results/taichi.md has the search and the comparison.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.types import Role

NO_FEASIBLE_BEHAVIOURS = ("random", "least-loaded", "reject")


class InstanceKind(enum.Enum):
    P_HEAVY = "p-heavy"
    D_HEAVY = "d-heavy"


@dataclass(frozen=True)
class TaiChiSettings:
    """The sliders besides R_PD, and the knobs of Alg. 1 and Alg. 2 (paper defaults)."""

    chunk_p_tokens: int = 2048  # S_P (chosen by the slider search, docs/results/taichi.md)
    chunk_d_tokens: int = 512  # S_D; 0: D-heavy instances take no prefill tokens
    watermark: float = 0.95  # M: D-heavy KV use above which Alg. 1 degrades decodes
    alpha: float = 0.96  # approaching factor: backflow once TPOT > alpha x TPOT SLO
    no_feasible: str = "random"  # Alg. 2 with no feasible instance (paper: random)
    flowing_decode: bool = True  # Alg. 1 (off: decodes stay in place; Fig. 18 ablation)
    length_aware_prefill: bool = True  # Alg. 2 (off: least-loaded prefill; Fig. 18 ablation)
    seed: int = 0  # of Alg. 2's random assignment

    def __post_init__(self) -> None:
        if self.chunk_p_tokens < 1:
            raise ValueError(f"taichi chunk_p_tokens (S_P) must be at least 1, got "
                             f"{self.chunk_p_tokens}")
        if self.chunk_d_tokens < 0:
            raise ValueError(f"taichi chunk_d_tokens (S_D) must not be negative, got "
                             f"{self.chunk_d_tokens}")
        if self.chunk_d_tokens > self.chunk_p_tokens:
            raise ValueError(f"taichi chunk_d_tokens (S_D={self.chunk_d_tokens}) must not "
                             f"exceed chunk_p_tokens (S_P={self.chunk_p_tokens}): D-heavy "
                             f"instances are the small-chunk ones")
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"taichi watermark must be in [0, 1], got {self.watermark}")
        if not self.alpha > 0:
            raise ValueError(f"taichi alpha must be positive, got {self.alpha}")
        if self.no_feasible not in NO_FEASIBLE_BEHAVIOURS:
            raise ValueError(f"taichi no_feasible must be one of "
                             f"{', '.join(NO_FEASIBLE_BEHAVIOURS)}, got {self.no_feasible!r}")


@dataclass(frozen=True)
class TaiChiLayout:
    """Each instance's kind, chunk size (0: the driver's default) and role."""

    kinds: tuple[InstanceKind, ...]
    chunk_sizes_tokens: tuple[int, ...]
    roles: tuple[Role, ...]

    @classmethod
    def of(cls, p_heavy: int, d_heavy: int, settings: TaiChiSettings) -> TaiChiLayout:
        """Instances 0..p_heavy-1 are P-heavy, the next d_heavy D-heavy (R_PD)."""
        if p_heavy < 0 or d_heavy < 0 or p_heavy + d_heavy < 1:
            raise ValueError(f"taichi needs at least one instance, got {p_heavy} P-heavy and "
                             f"{d_heavy} D-heavy")
        s_p, s_d = settings.chunk_p_tokens, settings.chunk_d_tokens
        count = p_heavy + d_heavy
        if s_p == s_d:  # pure aggregation: one chunk size, no differentiation
            return cls((InstanceKind.D_HEAVY,) * count, (s_d,) * count, (Role.MIXED,) * count)
        if s_d == 0 and (p_heavy < 1 or d_heavy < 1):
            raise ValueError(f"taichi with S_D = 0 (disaggregation) needs at least one "
                             f"P-heavy and one D-heavy instance, got {p_heavy}:{d_heavy}")
        kinds = (InstanceKind.P_HEAVY,) * p_heavy + (InstanceKind.D_HEAVY,) * d_heavy
        chunks = (s_p,) * p_heavy + (s_d,) * d_heavy
        if s_d == 0:  # pure disaggregation
            roles = (Role.PREFILL,) * p_heavy + (Role.DECODE,) * d_heavy
        else:
            roles = (Role.MIXED,) * count
        return cls(kinds, chunks, roles)

    def is_p_heavy(self, instance_id: int) -> bool:
        return self.kinds[instance_id] is InstanceKind.P_HEAVY

    @property
    def differentiated(self) -> bool:
        return len(set(self.kinds)) > 1
