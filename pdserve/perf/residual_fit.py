"""Fit the per-shape corrections (`residuals.py`) on the rows outside the held-out split, and
measure them on the held-out rows.

For the MLP-file ops, per (op, profiled layer shape) and bin of tokens; for attention, per
bin pair of its two dimensions; for the links (all-reduce over NVLink and PCIe, NVLink
send/recv), per number of GPUs and bin of message bytes. `python -m pdserve.perf.calibrate`
writes them with the curves.
"""

from __future__ import annotations

import numpy as np

from pdserve.perf.calibration_rows import (
    PROFILED_LAYOUT,
    held_out_error,
    link_curve,
    link_rows,
    mlp_shape,
    split_rows,
)
from pdserve.perf.layer_shape import shape_key
from pdserve.perf.operators import HeldOutError, OperatorModel, op_time_s
from pdserve.perf.profiles import Table, load_table
from pdserve.perf.residuals import (
    MLP_OPS,
    PER_OCTAVE,
    Residuals,
    fit_attention_residuals,
    fit_residuals,
    fit_rolling_residuals,
)
from pdserve.perf.specs import gpu_spec

# the link rows nearest in size whose median sets each point of a link's correction: 15
# keeps a streak of fast all-reduce repeats (3 rows at 10 us among 50-60 us ones) from
# setting it (held-out P90 over NVLink 7.5 %; with 5 neighbours 8.3 % but factors down
# to 0.19, the streak's)
LINK_NEIGHBOURS = 15

def fit_operator_residuals(model: OperatorModel) -> Residuals:
    """Per-shape corrections of the MLP-file ops' curves (`residuals.py`), from the rows
    outside the held-out split."""
    gpu = gpu_spec(model.reference_gpu)
    train, _ = split_rows(load_table("mlp"))
    shape = mlp_shape(train)
    tables = {op: fit_residuals(np.asarray(shape_key(op, shape)), train["tokens"],
                                train[op] * 1e-3,
                                np.asarray(op_time_s(model, op, train["tokens"], shape, gpu)))
              for op in MLP_OPS}
    for name, (rows, workers, _) in link_rows().items():  # per message size (bytes)
        train, _ = split_rows(rows)
        tables[name] = fit_rolling_residuals(_link_keys(train, workers), train["bytes"],
                                             train["ms"] * 1e-3,
                                             _link_time_s(model, name, train), LINK_NEIGHBOURS)
    attention = {}
    for kind, (first, second, curve) in _attention_curves(model, train=True).items():
        rows = _attention_rows(kind, train=True)
        attention[kind] = fit_attention_residuals(first, second,
                                                  rows["with_reshape_ms"] * 1e-3, curve)
    return Residuals(model.reference_gpu, PER_OCTAVE, tables, attention)


def _link_keys(rows: Table, workers: int | None) -> np.ndarray:
    """A link correction's key: the GPUs that took part (send/recv: a pair)."""
    return np.full(len(rows["bytes"]), str(workers or 2))


def _link_time_s(model: OperatorModel, name: str, rows: Table) -> np.ndarray:
    _, workers, link = link_rows()[name]
    curve = link_curve(model, name)
    return np.asarray(curve.send_s(rows["bytes"], link) if workers is None
                      else curve.all_reduce_s(rows["bytes"], workers, link))


def _attention_rows(kind: str, train: bool) -> Table:
    attention = load_table("attention_70b_tp2")
    rows = split_rows(attention.where(attention["prefill"] == (kind == "prefill")))
    return rows[0] if train else rows[1]


def _attention_curves(model: OperatorModel, train: bool
                      ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per kind: the two binned dimensions and the curve's time of each row."""
    gpu, kv_bytes = gpu_spec(model.reference_gpu), PROFILED_LAYOUT.kv_bytes_per_token
    decode, prefill = _attention_rows("decode", train), _attention_rows("prefill", train)
    return {
        "decode": (decode["batch"], decode["kv_tokens"], np.asarray(
            model.decode_attention.time_s(decode["batch"], decode["batch"] * decode["kv_tokens"],
                                          kv_bytes, gpu))),
        "prefill": (prefill["chunk"], prefill["kv_tokens"], np.asarray(
            model.prefill_attention.time_s(prefill["chunk"], prefill["kv_tokens"], 1.0,
                                           kv_bytes, gpu, gpu)))}


def held_out_errors_corrected(model: OperatorModel,
                              residuals: Residuals) -> dict[str, HeldOutError]:
    """Held-out error with the per-shape corrections applied: the MLP-file ops, attention
    and the links (all-reduce and send/recv, per message size)."""
    gpu = gpu_spec(model.reference_gpu)
    _, test = split_rows(load_table("mlp"))
    shape = mlp_shape(test)
    errors = {op: held_out_error(np.asarray(op_time_s(model, op, test["tokens"], shape, gpu,
                                                      residuals)), test[op] * 1e-3)
              for op in MLP_OPS}
    for kind, (first, second, curve) in _attention_curves(model, train=False).items():
        factor = np.array([residuals.attention_factor(kind, a, b)
                           for a, b in zip(first, second, strict=True)])
        errors[f"attn_{kind}"] = held_out_error(
            curve * factor, _attention_rows(kind, train=False)["with_reshape_ms"] * 1e-3)
    for name, (rows, workers, _) in link_rows().items():
        _, test = split_rows(rows)
        factor = residuals.factor(name, _link_keys(test, workers), test["bytes"])
        errors[name] = held_out_error(_link_time_s(model, name, test) * factor,
                                      test["ms"] * 1e-3)
    return errors
