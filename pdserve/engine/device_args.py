"""`--device` and `--dtype` for the commands that run an engine (`serve`, `profile`), without
importing torch (the CLI's other commands need none); `engine/device.py` resolves them."""

from __future__ import annotations

import argparse

DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16")


def add_device_arguments(parser: argparse.ArgumentParser, default_device: str,
                         sharing_note: str = "") -> None:
    parser.add_argument("--device", default=default_device,
                        help=f"the engine's device: auto (CUDA when torch sees a GPU), cpu, "
                        f"cuda or cuda:N{sharing_note} [{default_device}]")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="weights and KV: auto is bfloat16 on a GPU, float32 on the CPU "
                        "[auto]")
