"""How long pricing a deployment takes: building the measured-kernel performance models the
planner and the decision grid build for each (model, GPU, TP) they simulate.

Builds the runtime `PerfModel` (the fit of the operator model over ~900 step shapes, each
pricing every GEMM, attention and all-reduce of a layer from the kernel tables) for three
model x TP cases on five GPUs, after the tables are loaded, in a fresh process so no model
is cached; prints the wall time per model. Run it in two trees, alternating, to compare.

    python bench/perf_model_build.py
"""

from __future__ import annotations

import time

from pdserve.perf.kernel_tables import shipped_tables
from pdserve.perf.presets import perf_model

GPUS = ("h100", "h200", "b200", "l40s", "a100")
CASES = (("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("qwen3-32b", 2))


def main() -> None:
    for gpu in GPUS:
        shipped_tables(gpu)  # the tables' load is not what this measures
    started = time.perf_counter()
    for gpu in GPUS:
        for model, tp in CASES:
            perf_model(model, gpu, tp)
    elapsed = time.perf_counter() - started
    count = len(GPUS) * len(CASES)
    print(f"{count} measured-kernel models built in {elapsed:.2f} s: "
          f"{elapsed / count * 1e3:.0f} ms each")


if __name__ == "__main__":
    main()
