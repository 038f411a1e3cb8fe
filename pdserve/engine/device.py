"""Where an engine runs (`--device`, `--dtype`): the device of its weights and KV pool, and
their dtype.

`auto` is CUDA when torch sees a GPU, else the CPU; the dtype's `auto` is bfloat16 on a GPU
that supports it (float16 otherwise) and float32 on the CPU, whose engine matches Hugging
Face's float32 numerics. Any dtype runs on the CPU too, which is how the reduced-precision
path is tested without a GPU. Several workers may share one GPU: each caps its allocator at
`memory_fraction` of the GPU's memory (`limit_memory`). Sampling runs on float32 logits on
the engine's device (`Engine.run`, `sampling.py`); a seeded draw is a pure function of
(seed, position, logits) on a given device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pdserve.engine.device_args import ATTENTION_PATHS

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineDevice:
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    dtype: str = "float32"  # a key of DTYPES
    memory_fraction: float = 0.0  # a GPU worker's share of the GPU's memory; 0: no cap
    kv_staging: bool = False  # hand off through a pinned host mirror, not CUDA IPC (on the
    # CPU: exercises the GPU's staging path)
    cuda_graphs: bool = True  # on a GPU, replay decode steps from CUDA graphs
    # (`decode_graphs.py`); False: every step eager
    attention: str = "auto"  # how attention reads the paged pool (`paged_attention.wanted`):
    # flex (in place), gather (contiguous copies first), auto (gather, for now)
    fused_elementwise: bool = False  # one compiled kernel per norm, rotary and SiLU x up
    # (`elementwise.fused`); off: eager

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"engine dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        kind = self.device.split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"engine device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.attention not in ATTENTION_PATHS:
            raise ValueError(f"engine attention must be one of {ATTENTION_PATHS}, got "
                             f"{self.attention!r}")
        if not 0.0 <= self.memory_fraction <= 1.0:
            raise ValueError(f"engine memory_fraction must be within [0, 1], got "
                             f"{self.memory_fraction}")

    @property
    def element_bytes(self) -> int:
        """Bytes of one weight or KV element in this dtype."""
        return DTYPES[self.dtype].itemsize

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def resolve_device(device: str = "auto", dtype: str = "auto", workers_per_gpu: int = 1,
                   attention: str = "auto", fused_elementwise: bool = False) -> EngineDevice:
    """The `--device`/`--dtype`/`--attention` choice made concrete; `workers_per_gpu` GPU
    workers split the GPU's memory evenly."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ValueError(f"--device must be one of {DEVICES} (or cuda:N), got {device!r}")
    gpu = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if gpu else "cpu"
    if device != "cpu" and not gpu:
        raise ValueError(f"--device {device}: torch sees no CUDA GPU here")
    if attention == "flex" and device == "cpu":
        raise ValueError("--attention flex needs a GPU: on the CPU FlexAttention runs its "
                         "dense reference over the whole KV pool; use gather (the default)")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else (
            "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    fraction = 0.0 if device == "cpu" or workers_per_gpu <= 1 else 0.9 / workers_per_gpu
    return EngineDevice(device, dtype, fraction, attention=attention,
                        fused_elementwise=fused_elementwise)


def place(model: nn.Module, where: EngineDevice) -> nn.Module:
    """The model on the device in the dtype (the CPU float32 model is left as it is, so its
    weights stay the shared mapped file); the rotary frequencies stay float32."""
    if where.on_cpu and where.dtype == "float32":
        return model
    inv_freq = model.inv_freq.float()  # type: ignore[union-attr]
    model = model.to(device=where.torch_device, dtype=where.torch_dtype)
    model.inv_freq = inv_freq.to(where.torch_device)
    return model


def limit_memory(where: EngineDevice) -> None:
    """Cap this process's share of its GPU (several workers on one GPU)."""
    if not where.on_cpu and where.memory_fraction > 0:
        index = where.torch_device.index
        torch.cuda.set_per_process_memory_fraction(
            where.memory_fraction, torch.cuda.current_device() if index is None else index)
