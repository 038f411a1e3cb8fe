"""Text <-> token ids: the shipped byte-level BPE for named models, or a checkpoint's
`tokenizer.json`. Both go through the `tokenizers` library; nothing is downloaded."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids

    @classmethod
    def shipped(cls) -> TextTokenizer:
        path = resources.files("pdserve.data") / "tokenizer" / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(path))
        return cls(tokenizer, (tokenizer.token_to_id("<|end_of_text|>"),))

    @classmethod
    def from_file(cls, path: Path, eos_token_ids: tuple[int, ...]) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)), eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)
