"""Real traces: the ones shipped with pdserve, and the raw public formats from a user's path.

Shipped (see pdserve/data/ATTRIBUTION.md for sources and licences):
  azure-code, azure-conv     Azure LLM inference 2023 (CC-BY-4.0; Splitwise, ISCA'24)
  mooncake-conv              Mooncake conversation trace with prefix block hashes
  mooncake-sessions          the same requests with inferred session ids and rounds
                             (Apache-2.0; Mooncake, FAST'25)
  arxiv-lengths              arXiv summarization (input, output) lengths, no arrivals
                             (from Vidur, MIT) -- a length table for synthetic workloads
  sharegpt, sharegpt-first, arxiv-long   length tables derived from shipped data
                             (`workload/length_tables.py`: ShareGPT rounds, Apache-2.0)
Formats read from a path, recognised by their header:
  pdserve CSV     arrival_s,input_tokens,output_tokens[,session_id,round][,hash_ids]
                  (rows with a session id >= 0 are rounds of multi-round sessions: each is
                  sent the trace's gap after the previous round finished, its history the
                  previous round's prompt and output: `Workload.with_history_from_prompts`)
  Azure CSV       TIMESTAMP,ContextTokens,GeneratedTokens
  BurstGPT CSV    Timestamp,...,Request tokens,Response tokens,... (failed rows skipped)
  Mooncake JSONL  {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}
"""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from pdserve.workload.length_tables import DERIVED_LENGTH_TABLES
from pdserve.workload.workload import Workload

SHIPPED_TRACES: dict[str, str] = {
    "azure-code": "azure_code_2023.csv",
    "azure-conv": "azure_conv_2023.csv",
    "mooncake-conv": "mooncake_conversation.csv",
    "mooncake-sessions": "mooncake_conversation_sessions.csv",
}
SHIPPED_LENGTH_TABLES: dict[str, str] = {"arxiv-lengths": "arxiv_summarization_lengths.csv"}


def _shipped_path(filename: str) -> Path:
    return Path(str(resources.files("pdserve.data") / "traces" / filename))


def load_trace(name_or_path: str) -> Workload:
    """A shipped trace by short name, or a trace file in any supported format."""
    if name_or_path in SHIPPED_TRACES:
        return _read_csv(_shipped_path(SHIPPED_TRACES[name_or_path]), name_or_path)
    if name_or_path in SHIPPED_LENGTH_TABLES or name_or_path in DERIVED_LENGTH_TABLES:
        raise ValueError(f"{name_or_path!r} is a length table without arrival times; use it "
                         f"for a synthetic workload (lengths 'table:{name_or_path}')")
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join([*SHIPPED_TRACES, *SHIPPED_LENGTH_TABLES, *DERIVED_LENGTH_TABLES])
        raise ValueError(f"trace {name_or_path!r} is neither a shipped trace ({known}) "
                         f"nor a file")
    if path.suffix in (".jsonl", ".json"):
        return _read_mooncake_jsonl(path)
    return _read_csv(path, path.stem)


def load_length_table(name_or_path: str) -> tuple[np.ndarray, np.ndarray]:
    """(input_tokens, output_tokens) columns of a length table or of any trace."""
    if name_or_path in DERIVED_LENGTH_TABLES:
        return DERIVED_LENGTH_TABLES[name_or_path]()
    if name_or_path in SHIPPED_LENGTH_TABLES:
        path = _shipped_path(SHIPPED_LENGTH_TABLES[name_or_path])
    elif name_or_path in SHIPPED_TRACES:
        workload = load_trace(name_or_path)
        return workload.input_tokens, workload.output_tokens
    else:
        path = Path(name_or_path)
    rows = _rows(path)
    header = rows[0]
    try:
        i_in, i_out = header.index("input_tokens"), header.index("output_tokens")
    except ValueError:
        workload = load_trace(str(path))
        return workload.input_tokens, workload.output_tokens
    data = np.array([(int(r[i_in]), int(r[i_out])) for r in rows[1:]], dtype=np.int64)
    return data[:, 0], data[:, 1]


def _rows(path: Path) -> list[list[str]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:  # a BOM is no header
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"cannot read trace {path}: {err}") from err
    if not rows:
        raise ValueError(f"trace {path} is empty")
    return rows


def _read_csv(path: Path, name: str) -> Workload:
    rows = _rows(path)
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise ValueError(f"trace {path} has a header but no requests")
    if "arrival_s" in header:
        needed = [*PDSERVE_COLUMNS, *(("round",) if "session_id" in header else ())]
        missing = [column for column in needed if column not in header]
        if missing:
            raise ValueError(f"trace {path}: no {', '.join(missing)} column in the pdserve "
                             f"schema ({','.join(PDSERVE_COLUMNS)}[,session_id,round]"
                             f"[,hash_ids])")
    try:
        if "arrival_s" in header:
            return _pdserve_schema(header, body, name)
        if "TIMESTAMP" in header and "ContextTokens" in header:
            return _azure(header, body, name)
        if "Request tokens" in header and "Response tokens" in header:
            return _burstgpt(header, body, name)
    except (ValueError, IndexError, OverflowError) as err:
        raise ValueError(f"trace {path}: malformed row ({err})") from err
    raise ValueError(f"trace {path}: unrecognised header {header}; expected the pdserve, "
                     f"Azure or BurstGPT CSV schema")


PDSERVE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


def _pdserve_schema(header: list[str], body: list[list[str]], name: str) -> Workload:
    col = {h: i for i, h in enumerate(header)}
    arrival = np.array([float(r[col["arrival_s"]]) for r in body])
    n_in = np.array([int(r[col["input_tokens"]]) for r in body], dtype=np.int64)
    n_out = np.array([int(r[col["output_tokens"]]) for r in body], dtype=np.int64)
    sessions = rounds = hashes = None
    if "session_id" in col:
        sessions = np.array([int(r[col["session_id"]]) for r in body], dtype=np.int64)
        rounds = np.array([int(r[col["round"]]) for r in body], dtype=np.int64)
    if "hash_ids" in col:
        hashes = tuple(tuple(int(h) for h in r[col["hash_ids"]].split()) for r in body)
    return Workload(name, arrival, n_in, n_out, sessions, rounds,
                    hashes).with_history_from_prompts()


NO_SERVED_ROWS = "no row has both prompt and response tokens (rows without them are skipped)"


def _azure(header: list[str], body: list[list[str]], name: str) -> Workload:
    col = {h: i for i, h in enumerate(header)}
    stamps = np.array([np.datetime64(r[col["TIMESTAMP"]].strip().replace(" ", "T"), "ns")
                       for r in body])
    order = np.argsort(stamps, kind="stable")
    seconds = (stamps[order] - stamps[order][0]).astype(np.int64) / 1e9
    n_in = np.array([int(r[col["ContextTokens"]]) for r in body], dtype=np.int64)[order]
    n_out = np.array([int(r[col["GeneratedTokens"]]) for r in body], dtype=np.int64)[order]
    keep = (n_in > 0) & (n_out > 0)
    if not keep.any():
        raise ValueError(NO_SERVED_ROWS)
    return Workload(name, seconds[keep], n_in[keep], n_out[keep])


def _burstgpt(header: list[str], body: list[list[str]], name: str) -> Workload:
    col = {h: i for i, h in enumerate(header)}
    data = np.array([(float(r[col["Timestamp"]]), int(r[col["Request tokens"]]),
                      int(r[col["Response tokens"]])) for r in body])
    data = data[(data[:, 1] > 0) & (data[:, 2] > 0)]  # failed requests have 0 response tokens
    if not len(data):
        raise ValueError(NO_SERVED_ROWS)
    data = data[np.argsort(data[:, 0], kind="stable")]
    return Workload(name, data[:, 0] - data[0, 0], data[:, 1].astype(np.int64),
                    data[:, 2].astype(np.int64))


def _read_mooncake_jsonl(path: Path) -> Workload:
    records = []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read trace {path}: {err}") from err
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError(f"a record is a JSON object, got {line.strip()!r:.60}")
            hashes = raw.get("hash_ids", [])
            if not isinstance(hashes, list):
                raise ValueError(f"hash_ids must be a list, got {hashes!r:.60}")
            records.append((_number(raw["timestamp"], "timestamp") / 1000.0,
                            _whole(raw["input_length"], "input_length"),
                            _whole(raw["output_length"], "output_length"),
                            tuple(_whole(h, "a hash id") for h in hashes)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{line_no}: not a Mooncake trace record ({err})") from err
    if not records:
        raise ValueError(f"trace {path} is empty")
    records.sort(key=lambda r: r[0])
    start = records[0][0]
    try:
        return Workload(path.stem, np.array([r[0] - start for r in records]),
                        np.array([r[1] for r in records], dtype=np.int64),
                        np.array([r[2] for r in records], dtype=np.int64),
                        hash_ids=tuple(r[3] for r in records))
    except ValueError as err:
        raise ValueError(f"trace {path}: {err}") from err


def _number(value: Any, what: str) -> float:
    """A JSON number (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r:.60}")
    return float(value)


def _whole(value: Any, what: str) -> int:
    """A JSON number that is a whole count an int64 column holds (10.7 tokens is not one)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2 ** 63:
        raise ValueError(f"{what} must be a whole number, got {value!r:.60}")
    return value
