"""Engine speed and memory on the default model (SmolLM2-135M-Instruct from its GGUF file,
float32, one torch thread), against transformers on the same file's weights, in one run.

1. Decode step time at batch 1, 8 and 32 (64-token prompts, equal lengths): pdserve's
   `Engine.run` vs the per-token time inside transformers' `generate`
   ((time of N new tokens - time of 1) / (N - 1)). Ratio = HF time / pdserve time.
2. Prefill of 512 tokens: one engine chunk vs one transformers forward.
3. Served throughput on mixed lengths, where continuous batching should win: R requests with
   prompts of 16-256 tokens and outputs of 4-96 tokens (uniform, fixed seed). pdserve runs
   them through the shared local scheduler (continuous batching, at most B running, chunked
   prefill next to decodes); transformers runs `generate` on static batches of B in order,
   left-padded, each batch running to its longest output. Useful tokens/s (each request's
   own output) and the ratio. Both produce the same greedy tokens (checked on the first).
4. Where the time goes: the torch profiler's top operators over ten batch-8 decode steps.
5. Memory: proportional set size (PSS: shared pages split between the processes mapping
   them) of 1 and of 4 processes that each load the model and a 64-block engine as a worker
   does, started as `pdserve serve` starts its workers (a fork server that preloaded torch),
   and of 4 that each hold a private copy of the weights (what sharing avoids). The fork
   server's own PSS is added to each total (it holds pages the workers share).

Times are the process's CPU time (`time.process_time`): both sides run in this one process
on one torch thread, so on an idle machine that is their wall time, and on a shared one it
leaves out the time other processes held the core.

`--device cuda` runs both sides on a GPU (`--dtype`, default bfloat16) and times them on the
wall clock after synchronising; pdserve decodes from CUDA graphs there, captured in an
untimed first pass of each measurement (as a server captures them before it serves).
Parts 4 and 5 are the CPU's and are skipped.

    python bench/engine_speed.py [--requests 24] [--device cuda]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from pdserve.engine.checkpoint import default_model_path
from pdserve.engine.device import EngineDevice, resolve_device
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.live.processes import worker_context
from pdserve.types import Request

STEP_PROMPT, STEP_TOKENS = 64, 16
WHERE = EngineDevice()  # set by --device / --dtype


def clock() -> float:
    """CPU time on the CPU; on a GPU, wall time once its queued work is done."""
    if WHERE.on_cpu:
        return time.process_time()
    torch.cuda.synchronize()
    return time.perf_counter()


def reference_model():
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=WHERE.torch_dtype)
    model.generation_config.pad_token_id = 0
    return model.to(WHERE.torch_device).eval()


def hf_generate(hf, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    """Left-padded static batch, greedy, exactly `new_tokens` each; (seconds, tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts]).to(WHERE.torch_device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p)
                         for p in prompts]).to(WHERE.torch_device)
    start = clock()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    return clock() - start, out[:, width:].tolist()


def engine_decode_step_s(model, tokenizer, prompts: list[list[int]]) -> float:
    engine = Engine(model, tokenizer, 512, device=WHERE)
    for i, prompt in enumerate(prompts):
        engine.add(i, prompt, SamplingParams(max_tokens=STEP_TOKENS + 2, ignore_eos=True))
    engine.run([], [(i, len(p)) for i, p in enumerate(prompts)])
    engine.run(list(range(len(prompts))), [])  # untimed: a GPU captures its graph here
    start = clock()
    for _ in range(STEP_TOKENS):
        engine.run(list(range(len(prompts))), [])
    return (clock() - start) / STEP_TOKENS


def step_table(model, tokenizer, hf, rng: random.Random) -> None:
    print(f"decode step, {STEP_PROMPT}-token prompts, greedy, 1 thread (median of 3)")
    print(f"{'batch':>5}{'pdserve ms':>12}{'HF ms':>9}{'HF / pdserve':>14}")
    for batch in (1, 8, 32):
        prompts = [[rng.randrange(3, 49000) for _ in range(STEP_PROMPT)] for _ in range(batch)]
        ours, theirs = [], []
        for _ in range(3):
            ours.append(engine_decode_step_s(model, tokenizer, prompts))
            one, _ = hf_generate(hf, prompts, 1)
            many, _ = hf_generate(hf, prompts, STEP_TOKENS + 1)
            theirs.append((many - one) / STEP_TOKENS)
        o, h = statistics.median(ours), statistics.median(theirs)
        print(f"{batch:>5}{o * 1e3:>12.1f}{h * 1e3:>9.1f}{h / o:>14.2f}")
    prompt = [rng.randrange(3, 49000) for _ in range(512)]
    ours, theirs = [], []
    for _ in range(3):
        engine = Engine(model, tokenizer, 64, device=WHERE)
        engine.add(0, prompt, SamplingParams(max_tokens=1))
        start = clock()
        engine.run([], [(0, 512)])
        ours.append(clock() - start)
        start = clock()
        with torch.no_grad():
            hf(torch.tensor([prompt]).to(WHERE.torch_device))
        theirs.append(clock() - start)
    o, h = statistics.median(ours), statistics.median(theirs)
    print(f"prefill 512 tokens: pdserve {o * 1e3:.0f} ms, HF {h * 1e3:.0f} ms, "
          f"HF / pdserve {h / o:.2f}")


def served_workload(count: int, rng: random.Random) -> list[tuple[list[int], int]]:
    return [([rng.randrange(3, 49000) for _ in range(rng.randint(16, 256))],
             rng.randint(4, 96)) for _ in range(count)]


def engine_serve(model, tokenizer, work, max_batch: int) -> tuple[float, list[list[int]]]:
    engine = Engine(model, tokenizer, 2048, device=WHERE)
    if not WHERE.on_cpu:  # untimed: capture the decode graphs this workload uses
        _serve_on(engine, work, max_batch)
    start = clock()
    generated = _serve_on(engine, work, max_batch)
    seconds = clock() - start
    return seconds, [generated.get(i, []) for i in range(len(work))]


def _serve_on(engine: Engine, work, max_batch: int) -> dict[int, list[int]]:
    local = LocalScheduler(0, total_blocks=engine.allocator.num_blocks, chunk_size_tokens=512,
                           max_batch_size=max_batch)
    generated: dict[int, list[int]] = {}
    for i, (prompt, output) in enumerate(work):
        engine.add(i, prompt, SamplingParams(max_tokens=output, ignore_eos=True))
        local.enqueue_prefill(Request(i, 0.0, len(prompt), output))
    while (plan := local.plan()) is not None:
        outputs = engine.execute(plan)
        result = local.complete(plan, stopped=frozenset(
            o.request_id for o in outputs if o.finish_reason))
        for request in result.prefilled:
            local.continue_in_place(request)
        for request in result.finished:
            generated[request.request_id] = engine.release(request.request_id).generated
    return generated


def serve_table(model, tokenizer, hf, requests: int, rng: random.Random) -> None:
    work = served_workload(requests, rng)
    useful = sum(output for _, output in work)
    print(f"\nserved throughput, {requests} requests, prompts 16-256, outputs 4-96 tokens "
          f"({useful} output tokens)")
    print(f"{'max batch':>9}{'pdserve tok/s':>15}{'HF tok/s':>10}{'pdserve / HF':>14}")
    references = [hf_generate(hf, [prompt], output)[1][0] for prompt, output in work[:3]]
    for batch in (8, 32):
        ours_s, ours_tokens = engine_serve(model, tokenizer, work, batch)
        theirs_s = 0.0
        for first in range(0, len(work), batch):
            group = work[first:first + batch]
            theirs_s += hf_generate(hf, [p for p, _ in group], max(o for _, o in group))[0]
        print(f"{batch:>9}{useful / ours_s:>15.1f}{useful / theirs_s:>10.1f}"
              f"{theirs_s / ours_s:>14.2f}")
        same = ours_tokens[:3] == references
        print(f"{'':>9}  same greedy tokens as HF (alone, unpadded) on requests 0-2: {same}")


def profile_table(model, tokenizer, rng: random.Random) -> None:
    from torch.profiler import ProfilerActivity, profile

    engine = Engine(model, tokenizer, 512)
    for i in range(8):
        engine.add(i, [rng.randrange(3, 49000) for _ in range(STEP_PROMPT)],
                   SamplingParams(max_tokens=64, ignore_eos=True))
    engine.run([], [(i, STEP_PROMPT) for i in range(8)])
    engine.run(list(range(8)), [])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            engine.run(list(range(8)), [])
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print("\nwhere a batch-8 decode step's time goes (torch profiler, self time)")
    for event in events[:8]:
        print(f"  {event.key:<50}{100 * event.self_cpu_time_total / total:6.1f} %"
              f"{event.count / 10:8.0f} calls/step")


def _resident_worker(private: bool, ready, done) -> None:
    """A real `Worker` (model, shared KV pool, local scheduler) that runs one request."""
    from multiprocessing import Pipe

    from pdserve.worker.worker import Worker

    _, connection = Pipe()
    worker = Worker(0, "", 0, 64, 512, 64, connection, "decode-first", 0)
    engine = worker.engine
    if private:  # what each worker would hold without the shared file
        for parameter in engine.model.parameters():
            parameter.data = parameter.data.clone()
    engine.add(0, [5] * 32, SamplingParams(max_tokens=2))
    engine.run([], [(0, 32)])  # touch every weight once
    ready.put(None)
    done.wait(300)
    engine.pool.close()


def _pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for {pid}")


def _fork_server_pid() -> int | None:
    """The fork server's pid, if workers come from one (a private attribute of the standard
    library's fork server; fine for a benchmark)."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def workers_pss_mib(count: int, private: bool) -> float:
    context = worker_context()  # as `pdserve serve` starts its workers
    ready, done = context.Queue(), context.Event()
    workers = [context.Process(target=_resident_worker, args=(private, ready, done))
               for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=300)
        fork_server = _fork_server_pid()
        extra = _pss_mib(fork_server) if fork_server else 0.0
        return extra + sum(_pss_mib(w.pid) for w in workers if w.pid is not None)
    finally:
        done.set()
        for worker in workers:
            worker.join(60)


def memory_table() -> None:
    one = workers_pss_mib(1, private=False)
    four = workers_pss_mib(4, private=False)
    four_private = workers_pss_mib(4, private=True)
    print("\nmemory of worker processes (PSS; each a worker with the model and a 64-block "
          "KV pool in shared memory, plus the fork server)")
    print(f"  1 worker: {one:.0f} MiB; 4 workers sharing the weight file: {four:.0f} MiB "
          f"({four / one:.2f}x one); 4 with private copies: {four_private:.0f} MiB "
          f"({four_private / one:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--device", default="cpu", help="cpu or cuda [cpu]")
    parser.add_argument("--dtype", default="auto", help="[float32 on the CPU, bfloat16 on a GPU]")
    args = parser.parse_args()
    global WHERE
    WHERE = resolve_device(args.device, args.dtype)
    print(f"engines on {WHERE.device} in {WHERE.dtype}")
    torch.set_num_threads(1)
    rng = random.Random(0)
    from pdserve.engine.checkpoint import resolve_model
    from pdserve.engine.loader import prepare_weights

    prepare_weights(resolve_model(""))  # written once; this process does not map it yet
    if WHERE.on_cpu:
        memory_table()  # first: a weight file this process mapped would share the workers'
    model, tokenizer = load_model("")
    hf = reference_model()
    step_table(model, tokenizer, hf, rng)
    serve_table(model, tokenizer, hf, args.requests, rng)
    if WHERE.on_cpu:
        profile_table(model, tokenizer, rng)


if __name__ == "__main__":
    main()
