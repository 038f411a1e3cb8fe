"""The live engine: parity with Hugging Face, chunked = one-shot, paged = contiguous, batched
= alone, KV hand-off across processes and over TCP, sampling and stops."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import threading

import pytest
import torch
from conftest import local_scheduler
from engine_helpers import greedy, handoff_worker, save_hf_model

from pdserve.engine.allocator import runs
from pdserve.engine.config import named_config
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import attach_pool, recv_blocks, send_blocks
from pdserve.types import Request

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def prompt_of(length: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_matches_hugging_face_logits_and_greedy_continuation(tmp_path, family):
    reference = save_hf_model(family, tmp_path)
    model, _ = load_model(str(tmp_path))
    prompt = prompt_of(37, 512, seed=1)
    with torch.no_grad():
        expected_logits = reference(torch.tensor([prompt])).logits[0, -1]
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=32,
                                      do_sample=False)[0, len(prompt):].tolist()
    engine = Engine(model, None, num_blocks=64)
    tokens, logits = greedy(engine, 0, prompt, 32)
    assert torch.allclose(logits, expected_logits, atol=1e-4, rtol=0)
    assert tokens == expected


def test_loads_a_sharded_checkpoint(tmp_path):
    reference = save_hf_model("llama", tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model, _ = load_model(str(tmp_path))
    prompt = prompt_of(20, 512, seed=9)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    _, logits = greedy(Engine(model, None, 16), 0, prompt, 1)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=0)


def test_named_models_have_the_documented_shapes(tiny):
    model, tokenizer = tiny
    config = model.config
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == \
        (256, 4, 4, 2)
    assert config.vocab_size == tokenizer.vocab_size == 2048
    small = named_config("small", tokenizer.vocab_size, tokenizer.eos_token_ids)
    assert (small.hidden_size, small.num_layers, small.num_heads, small.num_kv_heads) == \
        (1024, 8, 16, 4)
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        load_model("huge")


@pytest.mark.parametrize("chunk", [1, 5, 16, 50])
def test_chunked_prefill_equals_one_shot(tiny, chunk):
    model, tokenizer = tiny
    prompt = prompt_of(83, 2048, seed=2)
    one_shot, logits = greedy(Engine(model, tokenizer, 64), 0, prompt, 12)
    chunked, chunked_logits = greedy(Engine(model, tokenizer, 64), 0, prompt, 12, chunk=chunk)
    assert torch.allclose(chunked_logits, logits, atol=1e-5)
    assert chunked == one_shot


def test_paged_scattered_blocks_equal_contiguous(tiny):
    model, tokenizer = tiny
    prompt = prompt_of(150, 2048, seed=3)
    contiguous_engine = Engine(model, tokenizer, 64)
    contiguous, logits = greedy(contiguous_engine, 0, prompt, 20)
    assert len(contiguous_engine.sequences[0].blocks) == 11  # 170 tokens, one run from 0
    paged = Engine(model, tokenizer, 40)
    holes = [paged.allocator.allocate(1) for _ in range(40)]
    for hole in holes[::2]:
        paged.allocator.free(hole)  # free every other block: only 1-block gaps remain
    scattered, paged_logits = greedy(paged, 0, prompt, 20)
    assert len(runs(paged.sequences[0].blocks)) == 11  # every block its own run
    assert torch.allclose(paged_logits, logits, atol=1e-5)
    assert scattered == contiguous


def test_local_scheduler_batches_give_the_same_tokens_as_running_alone(tiny):
    """Mixed batches (chunks next to decodes) from the shared local scheduler."""
    model, tokenizer = tiny
    prompts = [prompt_of(n, 2048, seed=n) for n in (40, 90, 17, 64)]
    alone = [greedy(Engine(model, tokenizer, 128), 0, p, 10)[0] for p in prompts]
    engine = Engine(model, tokenizer, 128)
    local = local_scheduler(0, total_blocks=128, chunk_size_tokens=32)
    for i, prompt in enumerate(prompts):
        engine.add(i, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
        local.enqueue_prefill(Request(i, 0.0, len(prompt), 10))
    mixed = 0
    while (plan := local.plan()) is not None:
        mixed += bool(plan.decodes and plan.chunks)
        outputs = engine.execute(plan)
        result = local.complete(plan, stopped=frozenset(
            o.request_id for o in outputs if o.finish_reason))
        for request in result.prefilled:
            local.continue_in_place(request)
    assert mixed > 0
    assert [engine.sequences[i].generated for i in range(4)] == alone


def test_kv_handoff_between_processes_continues_exactly(tiny):
    """Prefill in a child process, copy the KV from its shared pool into ours, decode here
    with sampling: the same tokens as the child decoding in place (draws are a pure
    function of seed, output index and logits, so no generator state moves)."""
    model, tokenizer = tiny
    prompt = prompt_of(70, 2048, seed=4)
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    child_pool = f"pdserve-test-{os.getpid()}-child"
    child = context.Process(target=handoff_worker, args=(child_end, child_pool, prompt, False))
    child.start()
    engine = Engine(model, tokenizer, 64, shared_name=f"pdserve-test-{os.getpid()}-parent")
    try:
        engine.allocator.allocate(9)  # so our blocks differ from the child's
        handoff = parent_end.recv()
        source = attach_pool(handoff.pool_name, engine.pool)
        copies = engine.import_from(handoff, source)
        source.close()
        parent_end.send("copied")
        assert copies == 1  # 70 tokens: one run on each side
        while not engine.sequences[7].finish_reason:
            engine.run([7], [])
        in_place = parent_end.recv()
        assert engine.sequences[7].generated == in_place
        assert len(in_place) == 16
    finally:
        parent_end.send("done")
        child.join(timeout=60)
        engine.pool.close()
    assert child.exitcode == 0


def test_kv_stream_over_loopback_tcp(tiny):
    model, tokenizer = tiny
    prompt = prompt_of(100, 2048, seed=5)
    sender = Engine(model, tokenizer, 64)
    reference = greedy(Engine(model, tokenizer, 64), 3, prompt, 10)[0]
    sender.add(3, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    sender.run([], [(3, len(prompt))])
    handoff = sender.export(3)
    receiver = Engine(model, tokenizer, 64)
    receiver.allocator.allocate(5)
    target_blocks = receiver.adopt(handoff)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            send_blocks(connection, sender.pool, list(handoff.blocks))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        recv_blocks(client, receiver.pool, target_blocks)
    thread.join(timeout=30)
    listener.close()
    while not receiver.sequences[3].finish_reason:
        receiver.run([3], [])
    assert receiver.sequences[3].generated == reference


def test_stops_on_eos_stop_string_and_length(tiny):
    model, tokenizer = tiny
    prompt = tokenizer.encode("Hello")
    engine = Engine(model, tokenizer, 64)
    engine.add(0, prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.run([], [(0, len(prompt))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    assert engine.sequences[0].finish_reason == "length" and len(engine.sequences[0].generated) == 5
    full_text = engine.text_of(0)
    stop = full_text[2:4]
    engine.add(1, prompt, SamplingParams(max_tokens=5, stop=(stop,), ignore_eos=True))
    engine.run([], [(1, len(prompt))])
    while not engine.sequences[1].finish_reason:
        engine.run([1], [])
    assert engine.sequences[1].finish_reason == "stop"
    assert engine.text_of(1) == full_text[:full_text.find(stop)]
    first = engine.sequences[0].generated[0]
    model.config.__dict__["eos_token_ids"] = (first,)  # pretend the first token is EOS
    try:
        engine.add(2, prompt, SamplingParams(max_tokens=5))
        [output] = engine.run([], [(2, len(prompt))])
        assert output.finish_reason == "stop"
    finally:
        model.config.__dict__["eos_token_ids"] = tokenizer.eos_token_ids


def test_bad_requests_are_refused_clearly(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, 8)
    with pytest.raises(ValueError, match="exceeds the context length"):
        engine.add(0, [5] * 8000, SamplingParams(max_tokens=500))
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        load_model(str(os.path.dirname(__file__)))


def test_the_shipped_tokenizer_exports_as_a_hugging_face_directory(tmp_path):
    from transformers import AutoTokenizer

    from pdserve.engine.tokenizer import TextTokenizer, write_shipped_hf_tokenizer

    exported = AutoTokenizer.from_pretrained(str(write_shipped_hf_tokenizer(tmp_path)))
    text = "Prefill and decode, disaggregated: 42 tokens/s?"
    assert exported.encode(text, add_special_tokens=False) == TextTokenizer.shipped().encode(text)
    assert exported.eos_token == "<|end_of_text|>"


def test_a_served_tokenizer_is_kept_once_as_a_hugging_face_directory(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from pdserve.engine.tokenizer import TextTokenizer, hf_tokenizer_dir

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shipped = TextTokenizer.shipped()
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    path = hf_tokenizer_dir(shipped.raw, "<|begin_of_text|>", "<|end_of_text|>", 1000, template)
    assert path.parent == tmp_path / "tokenizers"
    written = (path / "tokenizer.json").stat().st_mtime_ns
    assert hf_tokenizer_dir(shipped.raw, "<|begin_of_text|>", "<|end_of_text|>", 1000,
                            template) == path  # kept: not written again
    assert (path / "tokenizer.json").stat().st_mtime_ns == written
    assert hf_tokenizer_dir(shipped.raw, "", "<|end_of_text|>", 1000, None) != path
    exported = AutoTokenizer.from_pretrained(str(path))
    text = "Prefill and decode, disaggregated: 42 tokens/s?"
    assert exported.encode(text, add_special_tokens=False) == shipped.encode(text)
    assert (exported.bos_token, exported.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert exported.model_max_length == 1000
    assert exported.apply_chat_template([{"role": "user", "content": "Hi"}],
                                        tokenize=False) == "<user>Hi"
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()
            if ".tmp-" in p.name] == []  # no half-written directory left
