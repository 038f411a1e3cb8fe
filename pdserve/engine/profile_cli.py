"""`pdserve profile`: measure a live engine (on the CPU or a GPU), or fit a live deployment's
step log (`--from-step-log DIR`, `perf/in_situ.py`), and write the fitted performance model
that `pdserve simulate --perf-model` and `pdserve serve --perf-model` load. The engine is
imported only when an engine is measured (the simulator and the step-log fit need no
torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pdserve.engine.device_args import add_device_arguments


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure a live engine and write a fitted performance model",
        description="Measure prefill and decode step times (one torch thread) and KV copy "
        "speed of a model on this machine, fit the simulator's performance model, and write it "
        "as JSON for `pdserve simulate --perf-model`. With --from-step-log DIR, fit the "
        "batches and the control plane's latency a deployment logged while serving with "
        "PDSERVE_STEP_LOG=DIR instead (the calibration that matches a deployment best).")
    p.add_argument("--from-step-log", type=Path, metavar="DIR", default=None,
                   help="fit a live run's step log (the directory PDSERVE_STEP_LOG named) "
                   "instead of measuring an engine")
    p.add_argument("--base", type=Path, metavar="FILE", default=None,
                   help="with --from-step-log: the performance model whose KV capacity and "
                   "transfer cost to keep [the one the deployment logged it ran on]")
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
    if args.from_step_log is not None:
        return _run_from_step_log(args)
    if args.base is not None:
        raise ValueError("--base goes with --from-step-log")
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
                           resolve_device(args.device, args.dtype,
                                          attention=args.attention,
                                          fused_elementwise=args.fused_elementwise))
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


def _run_from_step_log(args: argparse.Namespace) -> int:
    from pdserve.perf.fitted import PerfModel
    from pdserve.perf.in_situ import calibrate

    measuring = [flag for flag, given in (("--model", args.model), ("--quick", args.quick),
                                          ("--contention", args.contention)) if given]
    if measuring:
        raise ValueError(f"--from-step-log fits a logged run; {', '.join(measuring)} "
                         f"measure an engine: give one or the other")
    base = PerfModel.load(args.base) if args.base is not None else None
    result = calibrate(args.from_step_log, base, lambda message: print(message, flush=True))
    model = result.model
    model.save(args.out)
    p, d = model.prefill, model.decode
    print(f"prefill  {p.intercept_s * 1e3:.3f} ms + {p.per_token_s * 1e6:.3f} us/token + "
          f"{p.per_attn_unit_s * 1e9:.3f} ns/attn unit   R2 {p.r2:.3f} over "
          f"{result.prefill_rows} batches; batch spread (CV) {model.prefill_step_cv:.3f}")
    print(f"decode   {d.intercept_s * 1e3:.3f} ms + {d.per_seq_s * 1e6:.1f} us/seq + "
          f"{d.per_seq_squared_s * 1e6:.2f} us/seq^2 + {d.per_context_token_s * 1e9:.1f} "
          f"ns/context token (batch-1 {d.batch1_extra_s * 1e3:+.3f} ms)   R2 {d.r2:.3f} over "
          f"{result.decode_rows} batches" + ("" if result.per_role else " (the same fit)"))
    print("decode-only batches, logged mean period vs the fit:")
    for check in result.decode_check:
        print(f"  B {check.min_batch:>3}-{check.max_batch:<3} {check.batches:>6} batches  "
              f"{check.logged_mean_s * 1e3:8.2f} ms  fit {check.model_mean_s * 1e3:8.2f} ms "
              f"({100 * (check.model_mean_s / check.logged_mean_s - 1):+.0f} %)")
    if result.control is None:
        print("control latency: not measured (no responses-server.csv: the run served no "
              "streamed request, or predates it); the simulator adds none")
    else:
        c = result.control
        print(f"control latency: median {c.median_s * 1e3:.2f} ms, P90 {c.p90_s * 1e3:.2f} ms "
              f"over {c.requests} streamed requests (server receipt -> admission + batch end "
              f"-> first text sent)")
    print(f"wrote {args.out} (KV capacity {model.kv_capacity_tokens} tokens and transfer cost "
          f"from {result.base_origin})")
    for warning in result.warnings:
        print(f"warning: {warning}")
    return 0
