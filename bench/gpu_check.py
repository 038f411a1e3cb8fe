"""The engine on a GPU (issue 15 parts 4 and 5), three measurements in one script:

  env      the GPU, and its two ceilings measured here: a bf16 8192^3 matrix product
           (TFLOP/s) and a device-to-device copy (GB/s, bytes read + written), against the
           datasheet figures the simulator scales by (`pdserve/perf/specs.py`)
  engine   `measure_engine` (what `pdserve profile --device cuda` measures) for a model in a
           dtype, decode from CUDA graphs and eager side by side, each point next to the
           calibrated simulator's prediction for that GPU (`perf.presets.calibrated`), whose
           per-step CPU term is vLLM's: the table shows the prediction with and without it;
           and decode tokens/s at batch 1, 8 and 32, both ways
  handoff  a sequence's KV handed from one process's GPU pool to another's on the same GPU
           through CUDA IPC and through pinned host staging (the pool's two sharing modes,
           `engine/kv_pool.py`), checked equal, with the sender's and receiver's time

    python bench/gpu_check.py env
    python bench/gpu_check.py engine --model "" --dtype bfloat16 --spec smollm2-135m
    python bench/gpu_check.py engine --model llama-3.1-8b --dtype bfloat16 --spec llama-3.1-8b
    python bench/gpu_check.py handoff --model llama-3.1-8b
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.device import resolve_device
from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.loader import load_model
from pdserve.engine.profile import ProfileGrid, measure_engine
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import attach_pool, copy_aligned
from pdserve.perf.presets import calibrated
from pdserve.perf.specs import gpu_spec
from pdserve.types import blocks_for

GRID = ProfileGrid(prefill_tokens=(128, 512, 2048), prior_tokens=(0, 2048),
                   batch_sizes=(1, 8, 32), context_per_sequence=(256, 1024),
                   transfer_blocks=(1, 16, 128), repeats=5)


def gpu_name() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for key in ("H100", "H200", "H800", "H20", "A100"):
        if key in name:
            return key.lower()
    return "h100"


def env(out: dict) -> None:
    if not torch.cuda.is_available():
        print("no GPU here")
        return
    spec = gpu_spec(gpu_name() if gpu_name() != "h200" else "h100")
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    source = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16) / 8  # 2 GB
    target = torch.empty_like(source)
    times = {"matmul": [], "copy": []}
    for _ in range(12):
        for kind, call in (("matmul", lambda: a @ b), ("copy", lambda: target.copy_(source))):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            call()
            end.record()
            end.synchronize()
            times[kind].append(start.elapsed_time(end) / 1e3)
    tflops = 2 * 8192 ** 3 / statistics.median(times["matmul"][2:]) / 1e12
    copy_gb_s = 2 * source.numel() * 2 / statistics.median(times["copy"][2:]) / 1e9
    out.update(device=torch.cuda.get_device_name(), torch=torch.__version__,
               matmul_tflops=tflops, copy_gb_s=copy_gb_s, spec_tflops=spec.tflops,
               spec_hbm_gb_s=spec.hbm_gb_s)
    print(f"{out['device']} (torch {torch.__version__}): bf16 matmul {tflops:.0f} TFLOP/s "
          f"(spec {spec.tflops:.0f}), device copy {copy_gb_s:.0f} GB/s (spec HBM "
          f"{spec.hbm_gb_s:.0f})")


def engine(model: str, dtype: str, spec_name: str, out: dict) -> None:
    where = resolve_device("auto", dtype)
    start = time.perf_counter()
    graphs = measure_engine(model, GRID, lambda message: None, where)
    eager = measure_engine(model, GRID, lambda message: None, replace(where, cuda_graphs=False))
    print(f"measured {resolve_model(model).name} on {where.device} {where.dtype}, decode "
          f"from CUDA graphs and eager, in {time.perf_counter() - start:.0f} s")
    predicted = calibrated(spec_name, gpu_name(), tp=1)
    rows = []
    for (new, prior, seconds), (_, _, eager_s) in zip(graphs.prefill, eager.prefill,
                                                       strict=True):
        total = predicted.prefill_s(new, prior)
        cpu = float(predicted.ops.cpu.time_s(1, 1))
        rows.append(("prefill", f"{new} after {prior}", eager_s, seconds, total, total - cpu))
    for (batch, context, seconds), (_, _, eager_s) in zip(graphs.decode, eager.decode,
                                                           strict=True):
        total = predicted.decode_step_s(batch, context)
        cpu = float(predicted.ops.cpu.time_s(batch, 1))
        rows.append(("decode", f"batch {batch}, {context // batch} ctx", eager_s, seconds,
                     total, total - cpu))
    print(f"{'step':8s} {'point':20s} {'eager':>9s} {'graphs':>9s} {'simulated':>10s} "
          f"{'error':>8s} {'sim GPU only':>12s} {'error':>8s}")
    for kind, point, eager_s, measured, total, gpu_only in rows:
        print(f"{kind:8s} {point:20s} {eager_s * 1e3:7.2f}ms {measured * 1e3:7.2f}ms "
              f"{total * 1e3:8.2f}ms {100 * (total - measured) / measured:+7.1f}% "
              f"{gpu_only * 1e3:10.2f}ms {100 * (gpu_only - measured) / measured:+7.1f}%")
    speed = {}
    for label, samples in (("eager", eager), ("graphs", graphs)):
        speed[label] = {batch: batch / seconds for batch, context, seconds in samples.decode
                        if context // batch == 257}
        print(f"decode tokens/s at 256 context, {label}: " + ", ".join(
            f"batch {batch}: {rate:.0f}" for batch, rate in speed[label].items()))
    print("graphs / eager decode tokens/s: " + ", ".join(
        f"batch {batch}: {speed['graphs'][batch] / speed['eager'][batch]:.1f}x"
        for batch in speed["graphs"]))
    copies = [(size, seconds) for size, copies, seconds in graphs.transfer if copies == 1]
    size, seconds = max(copies)
    print(f"KV block copy on the device: {size / seconds / 1e9:.0f} GB/s at {size / 1e6:.0f} MB")
    out.update(model=resolve_model(model).name, dtype=where.dtype, rows=rows,
               decode_tokens_per_s=speed, prefill=graphs.prefill, decode=graphs.decode,
               eager_decode=eager.decode, transfer=graphs.transfer)


def step_profile(model: str, dtype: str, batch: int, out: dict) -> None:
    """Where a decode step's time goes: the host's functions (cProfile, by own time) and the
    GPU's busy time (CUDA events around the steps vs the host clock)."""
    import cProfile
    import io
    import pstats

    where = resolve_device("auto", dtype)
    weights, tokenizer = load_model(model, where=where)
    engine = Engine(weights, tokenizer, blocks_for(batch * 400) + 2, device=where)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    for rid in range(batch):
        engine.add(rid, [5 + rid] * 256, params)
        engine.run([], [(rid, 256)])
    live = list(range(batch))
    for _ in range(5):
        engine.run(live, [])
    steps = 40
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        engine.run(live, [])
    profiler.disable()
    wall = (time.perf_counter() - start) / steps
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    print(f"decode batch {batch} ({resolve_model(model).name}, {where.dtype}, graphs "
          f"{engine.decode_graphs is not None}): {wall * 1e3:.2f} ms per step under cProfile")
    print(text.getvalue()[-6000:])
    out.update(model=resolve_model(model).name, batch=batch, step_ms=wall * 1e3,
               profile=text.getvalue())


def _receiver(connection, like_shape: tuple, dtype: torch.dtype) -> None:
    blocks, layers, _, block_size, kv_heads, head_dim = like_shape
    own = PagedKVPool(blocks, layers, kv_heads, head_dim, block_size, dtype=dtype,
                      device="cuda")
    peers: dict[str, PagedKVPool] = {}
    while (message := connection.recv()) is not None:
        name, count = message
        start = time.perf_counter()
        if name not in peers:
            peers[name] = attach_pool(name, own)
        attached = time.perf_counter()
        copies = copy_aligned(peers[name], own, list(range(count)), list(range(count)))
        done = time.perf_counter()
        checksum = float(own.data[:count].double().sum())
        connection.send((attached - start, done - attached, copies, checksum))


def handoff(model: str, out: dict) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("handoff needs a CUDA GPU")
    config = resolve_model(model).config
    dtype = torch.bfloat16
    context = multiprocessing.get_context("spawn")
    results = {}
    for mode in ("ipc", "staging"):
        name = f"pdserve-gpu-check-{os.getpid()}-{mode}"
        pool = PagedKVPool(512, config.num_layers, config.num_kv_heads, config.head_dim,
                           shared_name=name, dtype=dtype, device="cuda",
                           staged=mode == "staging")
        pool.data.normal_()
        ours, theirs = context.Pipe()
        receiver = context.Process(target=_receiver, args=(theirs, pool.shape, dtype))
        receiver.start()
        try:
            for tokens in (256, 2048, 8192):
                count = tokens // pool.block_size
                sends, receives, attach = [], [], 0.0
                for _ in range(6):
                    start = time.perf_counter()
                    pool.stage(list(range(count)))  # staging: GPU -> pinned mirror
                    sends.append(time.perf_counter() - start)
                    ours.send((name, count))
                    attach_s, copy_s, copies, checksum = ours.recv()
                    attach = max(attach, attach_s)
                    receives.append(copy_s)
                    expected = float(pool.data[:count].double().sum())
                    if abs(checksum - expected) > 1e-6 * max(1.0, abs(expected)):
                        raise AssertionError(f"{mode}: the receiver's KV differs")
                send, receive = statistics.median(sends[1:]), statistics.median(receives[1:])
                size = count * pool.block_bytes
                results[(mode, tokens)] = dict(bytes=size, send_s=send, receive_s=receive,
                                               total_s=send + receive, attach_s=attach,
                                               gb_s=size / (send + receive) / 1e9)
                print(f"{mode:8s} {tokens:5d} tokens ({size / 1e6:7.1f} MB): sender "
                      f"{send * 1e3:7.3f} ms + receiver {receive * 1e3:7.3f} ms = "
                      f"{(send + receive) * 1e3:7.3f} ms ({size / (send + receive) / 1e9:6.1f} "
                      f"GB/s); first attach {attach * 1e3:.1f} ms; KV equal")
        finally:
            ours.send(None)
            receiver.join(30)
            pool.close()
    for tokens in (256, 2048, 8192):
        ratio = results[("staging", tokens)]["total_s"] / results[("ipc", tokens)]["total_s"]
        print(f"{tokens:5d} tokens: staging / IPC time = {ratio:.1f}x")
    out.update(model=resolve_model(model).name, results={f"{m} {t}": v
                                                         for (m, t), v in results.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["env", "engine", "handoff", "step"])
    parser.add_argument("--batch", type=int, default=32, help="step: the decode batch [32]")
    parser.add_argument("--model", default="", help="[the default model]")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--spec", default="smollm2-135m", help="the simulator's model spec")
    parser.add_argument("--out", type=Path, default=None, help="write <part>-*.json here")
    args = parser.parse_args()
    out: dict = {}
    if args.part == "env":
        env(out)
    elif args.part == "engine":
        engine(args.model, args.dtype, args.spec, out)
    elif args.part == "step":
        step_profile(args.model, args.dtype, args.batch, out)
    else:
        handoff(args.model, out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        label = {"env": "env", "handoff": f"handoff-{args.spec}",
                 "step": f"step-{args.spec}-{args.batch}",
                 "engine": f"engine-{args.spec}-{args.dtype}"}[args.part]
        (args.out / f"{label}.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
