"""The shipped ShareGPT conversations, one row per round (`data/traces/sharegpt_rounds.csv`).

Each row is (session id, round, the round's new input tokens, its output tokens); the
length tables derived from it (`length_tables.py`, `long_output.py`) read it here. Token
counts are cl100k (GPT-4 tokenizer) counts (pdserve/data/ATTRIBUTION.md).
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path


def sharegpt_rounds() -> list[tuple[int, int, int, int]]:
    """(session id, round, new input tokens, output tokens) of every round, in file order."""
    path = Path(str(resources.files("pdserve.data") / "traces" / "sharegpt_rounds.csv"))
    with path.open(newline="") as handle:
        return [(int(r["session_id"]), int(r["round"]), int(r["input_tokens"]),
                 int(r["output_tokens"])) for r in csv.DictReader(handle)]
