"""`pdserve profile`: measure a live engine (on the CPU or a GPU) and write the fitted
performance model that `pdserve simulate --perf-model` and `pdserve serve --perf-model` load.
The engine is imported only when the command runs (the simulator needs no torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pdserve.engine.device_args import add_device_arguments


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure a live engine and write a fitted performance model",
        description="Measure prefill and decode step times (one torch thread) and KV copy "
        "speed of a model on this machine, fit the simulator's performance model, and write it "
        "as JSON for `pdserve simulate --perf-model`.")
    p.add_argument("--model", default="", help="a .gguf file, a Hugging Face checkpoint "
                   "directory or a named random model (tiny, small) [SmolLM2-135M-Instruct]")
    p.add_argument("--kv-blocks", type=int, default=4096,
                   help="KV pool size in blocks of 16 tokens [4096]")
    p.add_argument("--out", type=Path, default=Path("perf-model.json"),
                   help="where to write the model [perf-model.json]")
    p.add_argument("--quick", action="store_true", help="a smaller grid (seconds, not minutes)")
    p.add_argument("--contention", type=int, default=0,
                   help="other engine processes decoding during the measurement; use the "
                   "deployment's instances - 1 to include its CPU sharing [0]")
    add_device_arguments(p, "cpu")
    p.set_defaults(handler=_run_profile)


def _run_profile(args: argparse.Namespace) -> int:
    try:
        from pdserve.engine.device import resolve_device
        from pdserve.engine.profile import QUICK_GRID, ProfileGrid, profile_engine
    except ImportError as err:
        raise ValueError(f"profiling needs the engine extra (pip install 'pdserve[engine]'): "
                         f"{err}") from err
    if args.kv_blocks < 1:
        raise ValueError(f"--kv-blocks must be positive, got {args.kv_blocks}")
    grid = QUICK_GRID if args.quick else ProfileGrid()
    model = profile_engine(args.model, args.kv_blocks, grid,
                           lambda message: print(f"  {message}", flush=True), args.contention,
                           resolve_device(args.device, args.dtype))
    model.save(args.out)
    p, d, t = model.prefill, model.decode, model.transfer
    print(f"prefill  {p.intercept_s * 1e3:.3f} ms + {p.per_token_s * 1e6:.3f} us/token + "
          f"{p.per_attn_unit_s * 1e9:.3f} ns/attn unit   R2 {p.r2:.4f}")
    print(f"decode   {d.intercept_s * 1e3:.3f} ms + {d.per_seq_s * 1e6:.1f} us/seq + "
          f"{d.per_context_token_s * 1e9:.1f} ns/context token (batch-1 "
          f"{d.batch1_extra_s * 1e3:+.3f} ms)   R2 {d.r2:.4f}")
    print(f"transfer {t.per_call_s * 1e6:.2f} us/copy + {t.bytes_per_s / 1e9:.2f} GB/s   "
          f"R2 {t.r2:.4f}")
    print(f"wrote {args.out} (KV capacity {model.kv_capacity_tokens} tokens)")
    return 0
