"""Is the provisional model conservative? The layer probe (`engine/provisional_model.py`)
against the quick start-up profile of the same model, measured back to back on this
machine: the ratio of their times at every quick-grid point (prefill of n new tokens after p
prior ones; decode steps of B sequences of c context tokens each). A ratio of at least 1
means the provisional model is slower than the engine, as it must be.

    PYTHONPATH=$PWD python bench/provisional_check.py tiny ""   # "" is the default model
"""

from __future__ import annotations

import argparse
import time

from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.profile import QUICK_GRID, profile_engine
from pdserve.engine.provisional_model import probe_model
from pdserve.types import attn_units

KV_BLOCKS = 512


def ratios(spec: str) -> dict[str, object]:
    config = resolve_model(spec).config
    started = time.perf_counter()
    probe = probe_model(config, KV_BLOCKS, spec)
    probe_s = time.perf_counter() - started
    started = time.perf_counter()
    profile = profile_engine(spec, KV_BLOCKS, QUICK_GRID)
    profile_s = time.perf_counter() - started
    prefill = [probe.prefill.time_s(n, attn_units(n, p)) / profile.prefill.time_s(
        n, attn_units(n, p)) for n in QUICK_GRID.prefill_tokens for p in QUICK_GRID.prior_tokens]
    decode = [probe.decode.step_s(b, b * (c + 1)) / profile.decode.step_s(b, b * (c + 1))
              for b in QUICK_GRID.batch_sizes for c in QUICK_GRID.context_per_sequence]
    return {"model": spec or "default", "probe_s": round(probe_s, 2),
            "profile_s": round(profile_s, 1),
            "prefill_ratio": (round(min(prefill), 2), round(max(prefill), 2)),
            "decode_ratio": (round(min(decode), 2), round(max(decode), 2))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model specs ('' for the default model)")
    for spec in parser.parse_args().models:
        print(ratios(spec))


if __name__ == "__main__":
    main()
