"""Prefix cache (placeholder, filled below)."""

from __future__ import annotations


def usable_hit_blocks(hit_blocks: int, input_tokens: int, block_tokens: int) -> int:
    """Hash blocks a prefill may reuse: at least one prompt token is always computed (its
    position samples the first output token), so a prompt that hits entirely recomputes
    its last block."""
    return max(0, min(hit_blocks, (input_tokens - 1) // block_tokens))
