"""Helpers for engine tests: Hugging Face reference models and a worker process."""

from __future__ import annotations

from pathlib import Path

import torch

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams


def save_hf_model(family: str, path: Path, seed: int = 0, max_shard_size: str | None = None):
    """A random-init Hugging Face model saved with save_pretrained; returns it (eval)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    if family == "llama":
        config = LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = LlamaForCausalLM(config)
    else:
        config = Qwen2Config(**common, tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # biases start at zero; make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                             layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if max_shard_size:
        model.save_pretrained(path, max_shard_size=max_shard_size)
    else:
        model.save_pretrained(path)
    return model.eval()


def greedy(engine: Engine, request_id: int, prompt: list[int], tokens: int,
           chunk: int | None = None) -> tuple[list[int], torch.Tensor]:
    """Prefill (in chunks of `chunk`) then decode; returns the tokens and the first logits."""
    engine.add(request_id, prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    step = chunk or len(prompt)
    first_logits = None
    while engine.sequences[request_id].computed_tokens < len(prompt):
        left = len(prompt) - engine.sequences[request_id].computed_tokens
        outputs = engine.run([], [(request_id, min(step, left))])
        if outputs:
            first_logits = outputs[0].logits
    while not engine.sequences[request_id].finish_reason:
        engine.run([request_id], [])
    assert first_logits is not None
    return engine.sequences[request_id].generated, first_logits


def tiny_greedy_engine(prompt: str, tokens: int) -> tuple[Engine, list[int]]:
    """`prompt` run greedily for `tokens` tokens (EOS honoured) on one in-process `tiny`
    engine, no hand-off: the reference a served request is compared with. Returns the engine
    (request 0 on it) and the prompt's token ids."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, 64)
    ids = tokenizer.encode(prompt)
    engine.add(0, ids, SamplingParams(max_tokens=tokens, temperature=0.0))
    engine.run([], [(0, len(ids))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    return engine, ids


def handoff_worker(connection, pool_name: str, prompt: list[int], prefill_only: bool) -> None:
    """Child process: prefill `prompt` on a shared pool, hand the sequence over, then decode
    it in place too so the parent can compare."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, num_blocks=64, shared_name=pool_name)
    try:
        engine.add(7, prompt, SamplingParams(max_tokens=16, temperature=0.8, seed=11,
                                             ignore_eos=True))
        engine.run([], [(7, len(prompt))])
        connection.send(engine.export(7))
        assert connection.recv() == "copied"
        if not prefill_only:
            while not engine.sequences[7].finish_reason:
                engine.run([7], [])
            connection.send(engine.sequences[7].generated)
    finally:
        connection.recv()  # parent is done with our pool
        engine.pool.close()
