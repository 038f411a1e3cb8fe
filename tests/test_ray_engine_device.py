"""The engine's device and dtype (`--device`, `--dtype`; issue 15 part 4). The reduced
precision path and the GPU's hand-off path (a private pool with a shared host mirror) run on
the CPU here; the tests that need a GPU are skipped without one."""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import greedy

from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.device import EngineDevice, resolve_device
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import attach_pool

torch.set_num_threads(1)
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = ["The three primary colors are", "def fibonacci(n):\n    "]
BF16_LOGIT_TOLERANCE = 0.05  # of the float32 logits' largest magnitude (bfloat16: 8 bits)


def real_prompts(tokenizer) -> list[list[int]]:
    chat = resolve_model("").chat_template.render(
        [{"role": "user", "content": "What is the capital of France?"}])
    return [tokenizer.encode(text) for text in [*PROMPTS, chat]]


def test_device_choices_are_checked_and_auto_follows_the_machine():
    where = resolve_device("auto", "auto")
    assert where.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu", "auto") == EngineDevice("cpu", "float32")
    assert resolve_device("cpu", "bfloat16").torch_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="--device must be one of"):
        resolve_device("tpu", "auto")
    with pytest.raises(ValueError, match="dtype"):
        resolve_device("cpu", "float8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda", "auto")
    with pytest.raises(ValueError, match="memory_fraction"):
        EngineDevice("cpu", "float32", 1.5)


def test_bfloat16_and_float16_logits_stay_within_tolerance_of_float32():
    for dtype in ("bfloat16", "float16"):
        full = Engine(load_model("tiny", seed=0)[0], None, 32)
        half = Engine(load_model("tiny", seed=0)[0], None, 32,
                      device=EngineDevice("cpu", dtype))
        assert half.pool.data.dtype is half.where.torch_dtype
        for rid, prompt in enumerate([[5, 17, 300, 42, 7], list(range(100, 160))]):
            tokens32, logits32 = greedy(full, rid, prompt, 3)
            tokens16, logits16 = greedy(half, rid, prompt, 3)
            assert (logits32 - logits16).abs().max() <= BF16_LOGIT_TOLERANCE * \
                logits32.abs().max()
            assert logits16.dtype is torch.float32 and len(tokens16) == 3


@pytest.mark.slow
def test_bfloat16_logits_stay_within_tolerance_of_float32_on_the_real_model():
    model32, tokenizer = load_model("")
    model16, _ = load_model("")  # `place` converts a model in place: one each
    full = Engine(model32, tokenizer, 64)
    half = Engine(model16, tokenizer, 64, device=EngineDevice("cpu", "bfloat16"))
    assert half.pool.data.dtype is torch.bfloat16
    assert half.model.inv_freq.dtype is torch.float32  # rotary angles stay exact
    for rid, prompt in enumerate(real_prompts(tokenizer)):
        tokens32, logits32 = greedy(full, rid, prompt, 4)
        tokens16, logits16 = greedy(half, rid, prompt, 4)
        scale = logits32.abs().max()
        assert (logits32 - logits16).abs().max() <= BF16_LOGIT_TOLERANCE * scale
        assert tokens16[0] == tokens32[0]  # later ones may part at bfloat16's near-ties
        assert logits16.dtype is torch.float32  # sampled on float32 logits


def test_a_staged_pool_hands_off_through_its_host_mirror_exactly():
    """The GPU's hand-off path on the CPU: private blocks, a shared host mirror written at
    export, the receiver copying from the mirror; the continuation equals one engine's."""
    prompt = list(range(40, 90))
    where = EngineDevice("cpu", "bfloat16", kv_staging=True)
    reference = Engine(load_model("tiny", seed=0)[0], None, 32, device=where)
    expected, _ = greedy(reference, 0, prompt, 12)
    name = f"pdserve-test-staged-{os.getpid()}"
    sender = Engine(load_model("tiny", seed=0)[0], None, 32, f"{name}-s", where)
    receiver = Engine(load_model("tiny", seed=0)[0], None, 32, f"{name}-r", where)
    try:
        assert sender.pool.mirror is not None
        assert sender.pool.data.data_ptr() != sender.pool.mirror.data_ptr()
        sender.add(0, prompt, SamplingParams(max_tokens=12, ignore_eos=True))
        first = sender.run([], [(0, len(prompt))])[0].token_id
        blocks = list(sender.sequences[0].blocks)
        assert not sender.pool.mirror[blocks].any()  # not staged before the hand-off
        handoff = sender.export(0)
        assert torch.equal(sender.pool.mirror[blocks], sender.pool.data[blocks])
        peer = attach_pool(handoff.pool_name, receiver.pool)
        assert peer.data.dtype is torch.bfloat16
        receiver.import_from(handoff, peer)
        while not receiver.sequences[0].finish_reason:
            receiver.run([0], [])
        assert [first, *receiver.sequences[0].generated[1:]] == expected
        peer.close()
    finally:
        sender.pool.close()
        receiver.pool.close()


@GPU
def test_gpu_greedy_equals_cpu_float32_on_the_real_model_for_a_short_continuation():
    model_cpu, tokenizer = load_model("")
    model_gpu, _ = load_model("")
    cpu = Engine(model_cpu, tokenizer, 64)
    gpu = Engine(model_gpu, tokenizer, 64, device=EngineDevice("cuda", "float32"))
    for rid, prompt in enumerate(real_prompts(tokenizer)):
        tokens_cpu, logits_cpu = greedy(cpu, rid, prompt, 8)
        tokens_gpu, logits_gpu = greedy(gpu, rid, prompt, 8)
        assert tokens_gpu == tokens_cpu
        assert (logits_cpu - logits_gpu).abs().max() <= 1e-3 * logits_cpu.abs().max()


@GPU
def test_gpu_bfloat16_logits_within_tolerance_and_hand_off_between_gpu_engines():
    model_cpu, tokenizer = load_model("")
    cpu = Engine(model_cpu, tokenizer, 64)
    where = EngineDevice("cuda", "bfloat16")
    gpu = Engine(load_model("")[0], tokenizer, 64, device=where)
    prompt = real_prompts(tokenizer)[2]
    tokens_cpu, logits_cpu = greedy(cpu, 0, prompt, 4)
    tokens_gpu, logits_gpu = greedy(gpu, 0, prompt, 4)
    assert (logits_cpu - logits_gpu).abs().max() <= BF16_LOGIT_TOLERANCE * \
        logits_cpu.abs().max()
    assert tokens_gpu[0] == tokens_cpu[0]
    name = f"pdserve-test-gpu-{os.getpid()}"
    sender = Engine(load_model("")[0], tokenizer, 64, f"{name}-s", where)
    receiver = Engine(load_model("")[0], tokenizer, 64, f"{name}-r", where)
    try:
        sender.add(1, prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        first = sender.run([], [(1, len(prompt))])[0].token_id
        peer = attach_pool(sender.export(1).pool_name, receiver.pool)
        receiver.import_from(sender.export(1), peer)
        while not receiver.sequences[1].finish_reason:
            receiver.run([1], [])
        assert [first, *receiver.sequences[1].generated[1:]] == tokens_gpu
        peer.close()
    finally:
        sender.pool.close()
        receiver.pool.close()
