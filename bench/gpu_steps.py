"""The engine's step times next to today's vLLM's (issue 29's must-show).

Decode steps at batch 1, 8, 32, 64, 128 and 256 with 1,024 tokens of context each, and
prefills of 128, 512, 2,048 and 8,192 tokens, for the Llama-3.1-8B shape in bf16 (random
weights made on the device), each timed through `Engine.run` (the whole step: inputs built on
the host, the forward, sampling on the device, the ids read back) and printed next to vLLM's
step for the same GPU priced from AIConfigurator's measured vLLM kernel tables
(`perf.presets.measured`: GEMMs, attention, elementwise and the measured engine's host
overhead). The ratio is pdserve / vLLM; the target is <= 1.3 everywhere.

Decode sequences start on KV already in place (`Engine.adopt`: the step's cost does not
depend on the KV's values), so the 256 x 1,024-token batch needs no prefill first.

    python bench/gpu_steps.py                                  # the engine's defaults
    python bench/gpu_steps.py --attention flex --fused-elementwise
    python bench/gpu_steps.py --compare        # defaults, then flex + fused, one process
    python bench/gpu_steps.py --model tiny --device cpu --quick  # a smoke run, no GPU

`--out FILE` (default docs/results/gpu/step_vs_vllm.json on a GPU) gets
{"cases": [{"case", "pdserve_ms", "vllm_ms", "ratio"}], "device", "options"} of the options
asked for (with `--compare`, of flex + fused, and the defaults' cases as "baseline_cases").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from pdserve.engine.device import resolve_device
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import KVHandoff
from pdserve.perf.measured import Measured
from pdserve.perf.presets import measured
from pdserve.types import blocks_for

DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXT = 1024
PREFILL_TOKENS = (128, 512, 2048, 8192)
DEFAULT_OUT = Path("docs/results/gpu/step_vs_vllm.json")


def gpu_name() -> str:
    """The AIConfigurator GPU of this machine's first CUDA device (h100 without one)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    for key in ("H200", "H100", "B200", "A100", "L40S"):
        if key in name:
            return key.lower()
    return "h100"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decode(engine: Engine, batch: int, steps: int) -> float:
    """Median seconds per decode step of `batch` sequences with 1,024 tokens of context."""
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    ids = list(range(batch))
    for rid in ids:
        prompt = tuple(5 + (rid + i) % 1000 for i in range(DECODE_CONTEXT))
        engine.adopt(KVHandoff(rid, prompt, DECODE_CONTEXT - 1, DECODE_CONTEXT - 1, params,
                               (), None))
    device = engine.where.torch_device
    times = []
    for step in range(steps + 3):
        synchronize(device)
        start = time.perf_counter()
        engine.run(ids, [])
        synchronize(device)
        if step >= 3:  # warm-up: graphs captured, kernels compiled
            times.append(time.perf_counter() - start)
    for rid in ids:
        engine.release(rid)
    return statistics.median(times)


def time_prefill(engine: Engine, tokens: int, repeats: int) -> float:
    """Median seconds of one prefill of `tokens` new tokens (no prior context)."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    device = engine.where.torch_device
    times = []
    for attempt in range(repeats + 1):
        rid = 10_000 + attempt
        engine.add(rid, [7 + i % 1000 for i in range(tokens)], params)
        synchronize(device)
        start = time.perf_counter()
        engine.run([], [(rid, tokens)])
        synchronize(device)
        if attempt:
            times.append(time.perf_counter() - start)
        engine.release(rid)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="[llama-3.1-8b]")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="[bfloat16 on a GPU]")
    parser.add_argument("--attention", default="auto", choices=("auto", "gather", "flex"))
    parser.add_argument("--fused-elementwise", action="store_true")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--gpu", default="", help="vLLM's tables of this GPU [this GPU's]")
    parser.add_argument("--compare", action="store_true",
                        help="the defaults first, then --attention flex --fused-elementwise, "
                        "on one model in one process")
    parser.add_argument("--quick", action="store_true",
                        help="batches up to 8 and prefills up to 512, 2 steps each (smoke)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    where = resolve_device(args.device, args.dtype, attention=args.attention,
                           fused_elementwise=args.fused_elementwise)
    if args.no_cuda_graphs:
        where = replace(where, cuda_graphs=False)
    batches = [b for b in DECODE_BATCHES if not args.quick or b <= 8]
    prefills = [t for t in PREFILL_TOKENS if not args.quick or t <= 512]
    steps = 2 if args.quick else 20
    model, _ = load_model(args.model, where=where)
    vllm = measured("llama-3.1-8b", args.gpu or gpu_name(), 1, "vllm")
    device_name = (torch.cuda.get_device_name() if where.torch_device.type == "cuda"
                   else "cpu")
    print(f"{device_name}, torch {torch.__version__}; vLLM's steps: {vllm.ops.name}")
    runs = [where]
    if args.compare:
        runs = [replace(where, attention="auto", fused_elementwise=False),
                replace(where, attention="flex", fused_elementwise=True)]
    results = []
    for run in runs:
        blocks = max(blocks_for(max(batches) * (DECODE_CONTEXT + steps + 16)),
                     blocks_for(max(prefills) + 16)) + 2
        engine = Engine(model, None, blocks, device=run)  # one at a time: the KV is freed
        options = dict(model=args.model, dtype=run.dtype, attention=run.attention,
                       fused_elementwise=run.fused_elementwise,
                       cuda_graphs=engine.decode_graphs is not None, vllm=vllm.ops.name)
        print(options)
        results.append((options, measure(engine, vllm, batches, prefills, steps, args.quick)))
        engine.pool.close()
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.compare:
        print("flex + fused / defaults: " + ", ".join(
            f"{new['case']} {new['pdserve_ms'] / old['pdserve_ms']:.2f}x"
            for old, new in zip(results[0][1], results[1][1], strict=True)))
    options, cases = results[-1]
    out = args.out or (DEFAULT_OUT if device_name != "cpu" else None)
    if out is not None:
        document = dict(device=device_name, options=options, cases=cases)
        if args.compare:
            document.update(baseline_options=results[0][0], baseline_cases=results[0][1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=1))
        print(f"wrote {out}")


def measure(engine: Engine, vllm: Measured, batches: list[int], prefills: list[int],
            steps: int, quick: bool) -> list[dict]:
    """The cases on one engine, each printed as it is measured."""
    cases = []

    def report(case: str, ours_s: float, vllm_s: float) -> None:
        cases.append(dict(case=case, pdserve_ms=ours_s * 1e3, vllm_ms=vllm_s * 1e3,
                          ratio=ours_s / vllm_s))
        print(f"{case:28s} pdserve {ours_s * 1e3:9.2f} ms   vLLM {vllm_s * 1e3:8.2f} ms   "
              f"ratio {ours_s / vllm_s:6.2f}", flush=True)

    for batch in batches:
        report(f"decode B={batch} ctx={DECODE_CONTEXT}", time_decode(engine, batch, steps),
               vllm.decode_step_s(batch, batch * DECODE_CONTEXT))
    for tokens in prefills:
        report(f"prefill {tokens}", time_prefill(engine, tokens, 2 if quick else 5),
               vllm.prefill_s(tokens))
    print(f"worst ratio {max(case['ratio'] for case in cases):.2f} (target <= 1.3)")
    return cases


if __name__ == "__main__":
    main()
