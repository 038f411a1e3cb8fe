"""Text <-> token ids: the shipped byte-level BPE for named models, or a checkpoint's
`tokenizer.json`. Both go through the `tokenizers` library; nothing is downloaded.

Clients that count tokens with a Hugging Face tokenizer (guidellm's `--processor`) get the
served model's as a directory transformers' `AutoTokenizer` loads offline
(`hf_tokenizer_dir`: written once to pdserve's cache, named by its content)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import cache
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from pdserve.engine.weight_cache import cache_dir

HF_TOKENIZER_FORMAT = 1


@cache
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet: printable Latin-1 bytes stand for themselves, the other
    bytes for code points from 256 upwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


def _hf_files(tokenizer: Tokenizer, bos_token: str, eos_token: str, max_length: int,
              chat_template: str | None) -> dict[str, str]:
    """A Hugging Face tokenizer directory's files: `tokenizer.json` and the config that
    makes `AutoTokenizer` build a fast tokenizer from it with these special tokens."""
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                 "model_max_length": max_length, "clean_up_tokenization_spaces":
                                 False}
    if bos_token:
        config["bos_token"] = bos_token
    if eos_token:
        config["eos_token"] = eos_token
    if chat_template is not None:
        config["chat_template"] = chat_template
    return {"tokenizer.json": tokenizer.to_str(), "tokenizer_config.json": json.dumps(config)}


def hf_tokenizer_dir(tokenizer: Tokenizer, bos_token: str = "", eos_token: str = "",
                     max_length: int = 8192, chat_template: str | None = None) -> Path:
    """The tokenizer as a Hugging Face tokenizer directory under pdserve's cache, written
    the first time (under a temporary name, then renamed: a reader never sees half of it)
    and named by its content, so every server of the same model shares one; returns it."""
    files = _hf_files(tokenizer, bos_token, eos_token, max_length, chat_template)
    digest = hashlib.sha256(f"pdserve-hf-tokenizer-v{HF_TOKENIZER_FORMAT}".encode())
    for name, text in sorted(files.items()):
        digest.update(f"{name}\0{text}\0".encode())
    path = cache_dir() / "tokenizers" / digest.hexdigest()[:24]
    if path.is_dir():
        return path
    partial = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    partial.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (partial / name).write_text(text, encoding="utf-8")
    try:
        os.replace(partial, path)
    except OSError:  # another server wrote it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
        if not path.is_dir():
            raise
    return path


def write_shipped_hf_tokenizer(directory: Path) -> Path:
    """The shipped tokenizer as a Hugging Face tokenizer directory under `directory`, for
    clients that take one (guidellm's `--processor`); returns its path."""
    path = directory / "tokenizer"
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(str(resources.files("pdserve.data") / "tokenizer" / "tokenizer.json"), path)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>", "model_max_length": 8192}))
    return path


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self._max_token_bytes: int | None = None
        self._special_ids: frozenset[int] | None = None

    @classmethod
    def shipped(cls) -> TextTokenizer:
        path = resources.files("pdserve.data") / "tokenizer" / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(path))
        return cls(tokenizer, (tokenizer.token_to_id("<|end_of_text|>"),))

    @classmethod
    def from_file(cls, path: Path, eos_token_ids: tuple[int, ...]) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)), eos_token_ids)

    @property
    def raw(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False
                     ) -> list[list[int]]:
        """Like `encode` for each text; releases the GIL while it runs (a server thread
        tokenising a long prompt does not stall the event loop). `add_special_tokens`: what
        the tokenizer's post-processor adds (e.g. a BOS), where it has one."""
        return [e.ids for e in self._tokenizer.encode_batch(
            texts, add_special_tokens=add_special_tokens)]

    @property
    def max_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes one token stands for (the longest vocabulary
        entry), so a text of more than `context * max_token_bytes` bytes cannot fit."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(len(token.encode("utf-8"))
                                        for token in self._tokenizer.get_vocab())
        return self._max_token_bytes

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token may be part of a UTF-8
        character, so its text alone cannot say)."""
        return self._token_bytes(token_id, self._byte_level())

    def _byte_level(self) -> bool:
        decoder = self._tokenizer.decoder
        return "ByteLevel" in type(decoder).__name__ + repr(decoder)

    def _token_bytes(self, token_id: int, byte_level: bool) -> bytes:
        entry = self._tokenizer.id_to_token(token_id) or ""
        if byte_level:
            table = _byte_of_char()
            if all(char in table for char in entry):
                return bytes(table[char] for char in entry)
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def token_bytes_table(self) -> list[bytes]:
        """`token_bytes` of every id of the vocabulary, in id order."""
        byte_level = self._byte_level()
        return [self._token_bytes(i, byte_level) for i in range(self.vocab_size)]

    def special_token_ids(self) -> frozenset[int]:
        """The ids of the special (control) tokens: `<|im_end|>`, `<|end_of_text|>`, ..."""
        if self._special_ids is None:
            self._special_ids = frozenset(
                i for i, token in self._tokenizer.get_added_tokens_decoder().items()
                if token.special)
        return self._special_ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True,
               spaces_between_special_tokens: bool = True) -> str:
        """The text of `token_ids`. With special tokens kept, `spaces_between_special_tokens`
        False writes a special token that follows another as its bare content, without what
        the decoder would put before it (vLLM's rule for fast tokenizers; a byte-level BPE
        decoder puts nothing there, so the text is the same)."""
        if skip_special_tokens or spaces_between_special_tokens:
            return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        special = self.special_token_ids()
        pieces, start = [], 0
        for i in range(1, len(token_ids)):
            if token_ids[i] in special and token_ids[i - 1] in special:
                pieces.append(self._tokenizer.decode(token_ids[start:i],
                                                     skip_special_tokens=False))
                pieces.append(self._tokenizer.id_to_token(token_ids[i]) or "")
                start = i + 1
        pieces.append(self._tokenizer.decode(token_ids[start:], skip_special_tokens=False))
        return "".join(pieces)
