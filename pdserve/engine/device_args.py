"""`--device`, `--dtype` and `--attention` for the commands that run an engine (`serve`,
`profile`), without importing torch (the CLI's other commands need none); `engine/device.py`
resolves them."""

from __future__ import annotations

import argparse

DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_PATHS = ("auto", "gather", "flex")  # `paged_attention.wanted`
ATTENTION_HELP = ("how attention reads the paged KV pool: flex reads it in place "
                  "(FlexAttention, compiled on a GPU), gather copies a sequence's blocks out "
                  "first; auto is gather until flex is measured on a GPU")
FUSED_HELP = ("fuse RMSNorm with its residual add, RoPE and SiLU x up into one kernel each "
              "(torch.compile; off until measured on a GPU)")


def add_device_arguments(parser: argparse.ArgumentParser, default_device: str,
                         sharing_note: str = "") -> None:
    parser.add_argument("--device", default=default_device,
                        help=f"the engine's device: auto (CUDA when torch sees a GPU), cpu, "
                        f"cuda or cuda:N{sharing_note} [{default_device}]")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="weights and KV: auto is bfloat16 on a GPU, float32 on the CPU "
                        "[auto]")
    parser.add_argument("--attention", default="auto", choices=ATTENTION_PATHS,
                        help=f"{ATTENTION_HELP} [auto]")
    parser.add_argument("--fused-elementwise", action="store_true", help=FUSED_HELP)
