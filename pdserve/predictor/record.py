"""Record (hidden state, remaining length) samples from the live engine serving a model.

The paper's dataset (`../shared/papers/ares.md`, section 4.4): run the serving engine on
requests and, every k generated tokens, keep the last-layer hidden state of the last token
with the ground-truth remaining length. Here the in-process `Engine` runs the prompts in
continuous batches (new requests join as others finish, prefills and decodes in one step,
as the live worker does) with its hidden-state capture on (`hidden_state_every_tokens=k`),
so the vectors are the ones a live worker hands the predictor.

A sample: (hidden vector, request id, prompt tokens, generated tokens g, remaining tokens =
output tokens - g). A request cut by `max_tokens` has its remaining length counted to the
cap (what a server with the same cap would still generate); `finish_length` marks them.
The file is one compressed npz (`RecordedSet.save`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pdserve.engine.engine import Engine
from pdserve.engine.sampling import SamplingParams
from pdserve.predictor.prompts import Prompt
from pdserve.types import blocks_for

FORMAT_VERSION = 1


@dataclass(frozen=True)
class RecordSettings:
    every_tokens: int = 20  # k: capture every k generated tokens
    max_tokens: int = 384  # generation cap per request
    temperature: float = 0.7  # 0: greedy
    top_p: float = 0.95
    seed: int = 0  # sampling seed base (request i draws with seed + i)
    batch_size: int = 16  # sequences running at once

    def __post_init__(self) -> None:
        for name in ("every_tokens", "max_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass
class RecordedSet:
    """Samples (one row per capture) and the requests they come from."""

    hidden: np.ndarray  # [samples, hidden_size] float32
    request_id: np.ndarray  # [samples] int64
    prompt_tokens: np.ndarray  # [samples] int64
    generated_tokens: np.ndarray  # [samples] int64
    remaining_tokens: np.ndarray  # [samples] int64
    requests: dict[str, np.ndarray] = field(default_factory=dict)  # per request, see below
    meta: dict[str, str | int | float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.request_id)

    def subset(self, mask: np.ndarray) -> RecordedSet:
        return RecordedSet(self.hidden[mask], self.request_id[mask], self.prompt_tokens[mask],
                           self.generated_tokens[mask], self.remaining_tokens[mask],
                           self.requests, self.meta)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"request_{name}": values for name, values in self.requests.items()}
        meta_keys = np.array(list(self.meta), dtype=str)
        meta_values = np.array([str(value) for value in self.meta.values()], dtype=str)
        with path.open("wb") as handle:  # savez_compressed would append ".npz" to a str
            np.savez_compressed(handle, hidden=self.hidden, request_id=self.request_id,
                                prompt_tokens=self.prompt_tokens,
                                generated_tokens=self.generated_tokens,
                                remaining_tokens=self.remaining_tokens,
                                meta_keys=meta_keys, meta_values=meta_values,
                                format_version=np.array(FORMAT_VERSION), **arrays)

    def prompt_groups(self) -> np.ndarray | None:
        """Per sample, its prompt (template / topic), when the request table has topics:
        the split keeps every generation of one prompt in one split."""
        if "topic" not in self.requests:
            return None
        key = {int(rid): f"{template}/{topic}" for rid, template, topic in zip(
            self.requests["ids"], self.requests["template"], self.requests["topic"],
            strict=True)}
        return np.array([key[int(rid)] for rid in self.request_id])

    @classmethod
    def concat(cls, parts: Sequence[RecordedSet]) -> RecordedSet:
        """Recordings of one model with one cap and k, request ids renumbered apart."""
        for name in ("every_tokens", "max_tokens", "hidden_size"):
            values = {str(part.meta.get(name)) for part in parts}
            if len(values) > 1:
                raise ValueError(f"recordings differ in {name}: {sorted(values)}")
        offsets = np.cumsum([0] + [int(part.requests["ids"].max()) + 1 for part in parts])[:-1]
        pairs = list(zip(parts, offsets, strict=True))
        requests = {name: np.concatenate([part.requests[name] + offset if name == "ids"
                                          else part.requests[name] for part, offset in pairs])
                    for name in set.intersection(*(set(part.requests) for part in parts))}
        return cls(np.concatenate([part.hidden for part in parts]),
                   np.concatenate([part.request_id + offset for part, offset in pairs]),
                   np.concatenate([part.prompt_tokens for part in parts]),
                   np.concatenate([part.generated_tokens for part in parts]),
                   np.concatenate([part.remaining_tokens for part in parts]), requests,
                   {**parts[0].meta, "sources": len(parts)})

    @classmethod
    def load_many(cls, paths: Sequence[Path]) -> RecordedSet:
        parts = [cls.load(path) for path in paths]
        return parts[0] if len(parts) == 1 else cls.concat(parts)

    @classmethod
    def load(cls, path: Path) -> RecordedSet:
        if not path.is_file():
            raise ValueError(f"recorded data file {path} does not exist")
        with np.load(path) as data:
            version = int(data["format_version"]) if "format_version" in data else -1
            if version != FORMAT_VERSION:
                raise ValueError(f"{path}: recorded format version {version}, this pdserve "
                                 f"reads {FORMAT_VERSION}; record it again")
            requests = {name.removeprefix("request_"): data[name] for name in data.files
                        if name.startswith("request_") and name != "request_id"}
            meta = dict(zip(data["meta_keys"].tolist(), data["meta_values"].tolist(),
                            strict=True))
            return cls(data["hidden"].astype(np.float32), data["request_id"],
                       data["prompt_tokens"], data["generated_tokens"],
                       data["remaining_tokens"], requests, meta)


@dataclass
class _Running:
    prompt: Prompt
    prompt_tokens: int
    captures: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (generated, h)


def record(engine: Engine, encoded: Sequence[tuple[Prompt, list[int]]],
           settings: RecordSettings,
           progress: Callable[[int, int, int], None] | None = None) -> RecordedSet:
    """Run every (prompt, token ids) on `engine` (capture on, every `settings.every_tokens`)
    and return the samples. `progress(done, total, samples)` after each finished request."""
    if engine.hidden_capture.every_tokens != settings.every_tokens:
        raise ValueError(f"the engine captures every {engine.hidden_capture.every_tokens} "
                         f"tokens, the settings ask for {settings.every_tokens}")
    _check_pool(engine, encoded, settings)
    engine.take_hidden_states()  # start clean
    pending = list(reversed(range(len(encoded))))
    running: dict[int, _Running] = {}
    rows: list[tuple[int, int, int, int, np.ndarray]] = []  # rid, prompt, gen, remaining, h
    finished: list[tuple[int, Prompt, int, int, bool]] = []  # rid, prompt, in, out, length
    while pending or running:
        chunks = []
        while pending and len(running) < settings.batch_size:
            rid = pending.pop()
            prompt, ids = encoded[rid]
            engine.add(rid, ids, SamplingParams(
                max_tokens=settings.max_tokens, temperature=settings.temperature,
                top_p=settings.top_p, seed=settings.seed + rid))
            running[rid] = _Running(prompt, len(ids))
            chunks.append((rid, len(ids)))
        joined = {rid for rid, _ in chunks}
        decodes = [rid for rid in running if rid not in joined]
        outputs = engine.run(decodes, chunks)
        for rid, vector in engine.take_hidden_states().items():
            running[rid].captures.append((len(engine.sequences[rid].generated), vector))
        for output in outputs:
            if not output.finish_reason:
                continue
            state = running.pop(output.request_id)
            sequence = engine.release(output.request_id)
            total = len(sequence.generated)
            for generated, vector in state.captures:
                rows.append((output.request_id, state.prompt_tokens, generated,
                             total - generated, vector))
            finished.append((output.request_id, state.prompt, state.prompt_tokens, total,
                             output.finish_reason == "length"))
            if progress is not None:
                progress(len(finished), len(encoded), len(rows))
    return _assemble(rows, finished, engine, settings)


def pool_blocks_for(encoded: Sequence[tuple[Prompt, list[int]]],
                    settings: RecordSettings) -> int:
    """KV blocks for `batch_size` of the longest prompt running to `max_tokens`."""
    longest = max((len(ids) for _, ids in encoded), default=0)
    return settings.batch_size * blocks_for(longest + settings.max_tokens)


def _check_pool(engine: Engine, encoded: Sequence[tuple[Prompt, list[int]]],
                settings: RecordSettings) -> None:
    need = pool_blocks_for(encoded, settings)
    if engine.allocator.free_blocks < need:
        raise ValueError(f"the engine's pool has {engine.allocator.free_blocks} free blocks; "
                         f"{settings.batch_size} sequences of up to {settings.max_tokens} "
                         f"output tokens after the longest prompt need {need}")


def _assemble(rows: list[tuple[int, int, int, int, np.ndarray]],
              finished: list[tuple[int, Prompt, int, int, bool]], engine: Engine,
              settings: RecordSettings) -> RecordedSet:
    hidden_size = engine.model.config.hidden_size
    rows.sort(key=lambda row: (row[0], row[2]))
    finished.sort(key=lambda item: item[0])
    hidden = (np.stack([row[4] for row in rows]).astype(np.float32) if rows
              else np.zeros((0, hidden_size), np.float32))
    requests = {
        "ids": np.array([item[0] for item in finished], dtype=np.int64),
        "prompt_tokens": np.array([item[2] for item in finished], dtype=np.int64),
        "output_tokens": np.array([item[3] for item in finished], dtype=np.int64),
        "finish_length": np.array([item[4] for item in finished], dtype=bool),
        "template": np.array([item[1].template for item in finished], dtype=str),
        "kind": np.array([item[1].kind for item in finished], dtype=str),
        "topic": np.array([item[1].topic for item in finished], dtype=str),
    }
    meta: dict[str, str | int | float] = {
        "every_tokens": settings.every_tokens, "max_tokens": settings.max_tokens,
        "temperature": settings.temperature, "top_p": settings.top_p, "seed": settings.seed,
        "hidden_size": hidden_size, "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return RecordedSet(hidden, np.array([row[0] for row in rows], dtype=np.int64),
                       np.array([row[1] for row in rows], dtype=np.int64),
                       np.array([row[2] for row in rows], dtype=np.int64),
                       np.array([row[3] for row in rows], dtype=np.int64), requests, meta)
