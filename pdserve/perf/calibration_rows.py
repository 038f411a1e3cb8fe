"""The profile rows the calibration fits on and how their held-out error is measured.

Shared by the operator curves' fit (`calibrate.py`) and the per-shape corrections' fit
(`residual_fit.py`): the split into the rows a fit may use and the held-out rows
(`profiles.held_out`), the layer shape of the MLP rows and of the one profiled attention
layout, which all-reduce and send/recv rows each link curve takes, what a CPU-overhead row
sums, and the held-out error (median and P90 of the relative error, in %).

Notes on the data (`pdserve/data/gpu_profiles/`):
- all-reduce rows up to 64 MB are fitted (the sizes a TP step sends). Rows with 2 GPUs ran
  over an NVLink bridge; rows with 4 GPUs crossed PCIe between NVLink pairs, so they
  calibrate the PCIe link efficiency (against PCIe 4.0 x16, 32 GB/s each way). Send/recv rows
  with 2 devices per node are NVLink (fitted); with 1 they are between nodes (not used: the
  inter-node link is the cluster topology's parameter). NVLink send/recv reaches ~325 GB/s
  at 20-50 MB, above the 300 GB/s one-way spec, so its fitted efficiency exceeds 1 (the rows
  time one rank's kernel); it is kept as measured.
- CPU overhead per iteration = schedule + sampler + prepare inputs + process outputs + Ray
  communication, vLLM as profiled by Vidur (the sampler includes the logits projection of the
  small-vocabulary models profiled; the model prices the LM head as a GEMM on top).
"""

from __future__ import annotations

import numpy as np

from pdserve.perf.layer_shape import LayerShape
from pdserve.perf.operators import HeldOutError, LinkCurve, OperatorModel
from pdserve.perf.profiles import Table, load_table
from pdserve.perf.specs import gpu_spec

REFERENCE_GPU = "a100"
PCIE_GB_S = 32.0  # PCIe 4.0 x16, one way
# a TP step all-reduces tokens x hidden x 2 bytes: 16 KB (one 8K-wide token) to 64 MB (a
# 4K-token chunk); the fit covers that range, not the 0.5 GB tail of the sweep
MAX_ALL_REDUCE_BYTES = 64 * 2**20
CPU_PARTS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs",
             "ray_comm")
PROFILED_LAYOUT = LayerShape(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, tp=2)


def held_out_error(predicted: np.ndarray, measured: np.ndarray) -> HeldOutError:
    error = np.abs(predicted - measured) / measured * 100
    return HeldOutError(len(error), float(np.median(error)), float(np.percentile(error, 90)))


def mlp_shape(table: Table) -> LayerShape:
    return LayerShape(hidden=table["hidden"], heads=table["heads"], kv_heads=table["kv_heads"],
                      head_dim=table["hidden"] / table["heads"], ffn=table["ffn"],
                      tp=table["tp"])


def cpu_total_s(table: Table) -> np.ndarray:
    return sum(table[part] for part in CPU_PARTS) * 1e-3


def split_rows(table: Table) -> tuple[Table, Table]:
    """(rows every fit may use, held-out rows)."""
    return table.where(~table.held_out), table.where(table.held_out)


def link_rows() -> dict[str, tuple[Table, int | None, float]]:
    """Rows, workers (None: send/recv) and one-way link GB/s of each fitted link curve."""
    reduce, send = load_table("all_reduce"), load_table("send_recv")
    a100 = gpu_spec(REFERENCE_GPU)
    return {
        "all_reduce_nvlink": (reduce.where((reduce["workers"] == 2)
                                           & (reduce["bytes"] <= MAX_ALL_REDUCE_BYTES)),
                              2, a100.link_gb_s),
        "all_reduce_pcie": (reduce.where((reduce["workers"] == 4)
                                         & (reduce["bytes"] <= MAX_ALL_REDUCE_BYTES)),
                            4, PCIE_GB_S),
        "send_recv_nvlink": (send.where(send["devices_per_node"] == 2), None, a100.link_gb_s),
    }


def link_curve(model: OperatorModel, name: str) -> LinkCurve:
    family, link = name.rsplit("_", 1)
    return (model.all_reduce if family == "all_reduce" else model.send_recv)[link]
