"""The default model, SmolLM2-135M-Instruct from its GGUF file (installed by the README's
install command), against transformers loading the same file: logits, greedy text for chat
and plain completion, the tokenizer, the chat template; then served through a P->D hand-off.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from engine_helpers import greedy
from server_helpers import running_server

from pdserve.engine.checkpoint import DEFAULT_MODEL, default_model_path, resolve_model
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model

torch.set_num_threads(1)

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PLAIN = ["The three primary colors are", "def fibonacci(n):\n    "]
CONVERSATION = [
    {"role": "system", "content": "You are a terse geography tutor."},
    {"role": "user", "content": "Name a river in Egypt."},
    {"role": "assistant", "content": "The Nile."},
    {"role": "user", "content": "And one in France, with 2 facts (née \"Liger\")?"},
]


@pytest.fixture(scope="module")
def reference():
    """transformers' model and tokenizer from the same GGUF file (dequantized to float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def ours():
    model, tokenizer = load_model("")
    return model, tokenizer, resolve_model("")


def reference_greedy(model, prompt: list[int], tokens: int) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist(), logits


def test_logits_and_greedy_text_match_transformers(reference, ours):
    ref_model, ref_tokenizer = reference
    model, tokenizer, source = ours
    prompts = [tokenizer.encode(source.chat_template.render(CHAT))]
    prompts += [tokenizer.encode(text) for text in PLAIN]
    for i, prompt in enumerate(prompts):
        expected, expected_logits = reference_greedy(ref_model, prompt, 24)
        tokens, logits = greedy(Engine(model, tokenizer, 32), i, prompt, 24)
        assert (logits - expected_logits).abs().max().item() < 2e-3
        assert tokens == expected, (tokenizer.decode(tokens), ref_tokenizer.decode(expected))
    chat_answer = reference_greedy(ref_model, prompts[0], 8)[0]
    assert tokenizer.decode(chat_answer).startswith("The capital of France is Paris")


def test_tokenizer_matches_transformers(reference, ours):
    _, ref_tokenizer = reference
    _, tokenizer, _ = ours
    for text in ["Hello, world!", "  x  = 12345 + 6.78e-9\n\n\tdone", "naïve café ☕ 𝔘 中文",
                 "<|im_start|>user\nHi<|im_end|>", "it's they're we'll"]:
        assert tokenizer.encode(text) == ref_tokenizer(text, add_special_tokens=False)[
            "input_ids"], text


def test_chat_template_renders_as_transformers_does(reference, ours):
    _, ref_tokenizer = reference
    _, tokenizer, source = ours
    ours_text = source.chat_template.render(CONVERSATION)
    expected = ref_tokenizer.apply_chat_template(CONVERSATION, tokenize=False,
                                                 add_generation_prompt=True)
    assert ours_text == expected
    assert source.chat_template.origin == "gguf metadata"
    assert tokenizer.encode(ours_text) == ref_tokenizer(expected, add_special_tokens=False)[
        "input_ids"]
    assert source.config.eos_token_ids == (tokenizer.encode("<|im_end|>")[0],)


def test_served_through_a_prefill_to_decode_hand_off(tmp_path, reference, ours):
    ref_model, ref_tokenizer = reference
    _, tokenizer, _ = ours
    with running_server(tmp_path, {"engine.weights": "", "cluster.instances": 2,
                                   "policy.name": "static-pd", "cluster.prefill": 1,
                                   "cluster.decode": 1, "engine.kv_blocks": 64}) as (base, _driver):
        card = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]
        assert card["id"] == DEFAULT_MODEL and card["chat_template"] == "gguf metadata"
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": DEFAULT_MODEL, "messages": CHAT, "max_tokens": 40, "temperature": 0}).json()
        choice = chat["choices"][0]
        assert choice["message"]["content"] == "The capital of France is Paris."
        assert choice["finish_reason"] == "stop"  # at <|im_end|>, the end of the turn
        prompt = PLAIN[0]
        done = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0,
            "ignore_eos": True}).json()
        expected, _ = reference_greedy(ref_model, tokenizer.encode(prompt), 20)
        assert done["choices"][0]["text"] == ref_tokenizer.decode(expected)
