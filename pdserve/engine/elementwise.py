"""The decoder's elementwise work between its matrix products (issue 29 part 3): RMSNorm (with
the residual add before it), rotary embeddings of q and k, and SiLU(gate) x up.

Eagerly each is several kernels (RMSNorm alone: a cast, a square, a mean, an add, a rsqrt,
two products and a cast back), and on an H100 36-88 % of their time was launch overhead
(docs/results/gpu.md). `fused()` compiles each function with `torch.compile` into one kernel
(Triton on a GPU, C++ on the CPU); `EAGER` runs them as written. Both compute the same
operations in the same order; the residual add is the one vLLM fuses into the next norm
(`add_rms_norm`: the sum is the new residual, its norm the next sublayer's input), which
is the eager model's `x + sublayer(x)` reordered only by commutativity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's RMSNorm: in float32 whatever the dtype, scaled by the weight."""
    dtype = x.dtype
    x = x.float()
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps)).to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embeddings (Hugging Face's rotate-half convention) of q [T, heads, dim] and
    k [T, kv_heads, dim] at angles cos, sin [T, 1, dim]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@dataclass(frozen=True)
class Elementwise:
    """The four functions a decoder calls, eager (`EAGER`) or compiled (`fused()`)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float],
                           tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                     tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    fused: bool = False


EAGER = Elementwise(rms_norm, add_rms_norm, rotary, silu_mul)


def fused() -> Elementwise:
    """Each function compiled once for any number of tokens (dynamic shapes)."""
    def compiled(function: Callable) -> Callable:
        return torch.compile(function, dynamic=True, fullgraph=True)

    return Elementwise(compiled(rms_norm), compiled(add_rms_norm), compiled(rotary),
                       compiled(silu_mul), fused=True)
