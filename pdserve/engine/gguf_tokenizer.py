"""A GGUF file's tokenizer, built with the `tokenizers` library from the file's metadata:
its tokens, merges, token types (control tokens become special tokens, user-defined ones
added tokens matched whole) and the pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`.

Only byte-level BPE (`tokenizer.ggml.model = gpt2`, the Llama 3, Qwen2 and SmolLM family)
is built; a SentencePiece (`llama`) vocabulary is refused with a clear error. The
pre-tokenizers are the split rules llama.cpp applies for each name; an unknown name falls
back to GPT-2's rule with a warning, since the merges were learned on some split of that
kind and most names differ from it only in how digits group.
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger("pdserve.engine")

CONTROL_TOKEN, USER_DEFINED_TOKEN = 3, 4

# Llama 3's split: contractions, letters with one leading non-letter, 1-3 digits, punctuation
# runs with trailing newlines, newline runs, spaces.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: the same with single digits.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in ("", "default", "gpt2", "gpt-2"):
        return gpt2
    if name == "smollm":  # single digits, then GPT-2's rule
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    splits = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
              "qwen2": _QWEN2_SPLIT}
    if name in splits:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(splits[name]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    log.warning("GGUF pre-tokenizer %r is unknown to pdserve; using GPT-2's split rule", name)
    return gpt2


def tokenizer_from_gguf(metadata: dict[str, Any]) -> Tokenizer:
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not supported (pdserve builds byte-level "
                         f"BPE tokenizers, tokenizer.ggml.model = 'gpt2')")
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    merges_text: list[str] = list(metadata.get("tokenizer.ggml.merges") or [])
    if not tokens or not merges_text:
        raise ValueError("the GGUF file has no tokenizer vocabulary or merges")
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in merges_text]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(str(metadata.get("tokenizer.ggml.pre", "")))
    tokenizer.decoder = decoders.ByteLevel()
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [])
    special = [AddedToken(token, special=True, normalized=False)
               for token, kind in zip(tokens, types, strict=False) if kind == CONTROL_TOKEN]
    added = [AddedToken(token, special=False, normalized=False)
             for token, kind in zip(tokens, types, strict=False) if kind == USER_DEFINED_TOKEN]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(added)
    return tokenizer


def token_text(metadata: dict[str, Any], key: str) -> str:
    """The text of the token a metadata id names (`tokenizer.ggml.bos_token_id`), or ""."""
    index = metadata.get(key)
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    return str(tokens[index]) if isinstance(index, int) and 0 <= index < len(tokens) else ""
