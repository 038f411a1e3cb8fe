"""Train the byte-level BPE tokenizer shipped for pdserve's named models (run once).

Corpus: the Python standard library's own .py sources on this machine (PSF licence), which
mix English prose (docstrings, comments) and code. The result is committed as
pdserve/data/tokenizer/tokenizer.json; nothing is downloaded at run time.

    python scripts/train_tokenizer.py
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|system|>", "<|user|>", "<|assistant|>"]
OUT = Path(__file__).resolve().parent.parent / "pdserve" / "data" / "tokenizer" / "tokenizer.json"


def main() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train(files, trainer)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT))
    print(f"trained on {len(files)} files; vocab {tokenizer.get_vocab_size()}; wrote {OUT}")


if __name__ == "__main__":
    main()
