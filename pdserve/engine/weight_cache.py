"""A checkpoint's weights, dequantized to the engine's dtype once, in one flat file that
every worker maps read-only, so N workers share one copy in the page cache instead of
holding N.

Layout: `<key>.bin` holds float32 tensors back to back (each 64-byte aligned), `<key>.json`
the index (name -> element offset, shape). The key hashes the source's identity (path, size
and modification time of its weight files, the format version), so a changed checkpoint
gets a new file. Files are written under a temporary name and renamed, so a reader never
sees a half-written one. Workers map the file copy-on-write (`torch.from_file(shared=False)`):
pages are shared until written, and the engine never writes its weights.

Where: `$PDSERVE_CACHE_DIR`, else `$XDG_CACHE_HOME/pdserve`, else `~/.cache/pdserve`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

FORMAT_VERSION = 1
ALIGN_ELEMENTS = 16  # 64 bytes of float32


def cache_dir() -> Path:
    if os.environ.get("PDSERVE_CACHE_DIR"):
        return Path(os.environ["PDSERVE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdserve"


def source_key(files: Iterable[Path]) -> str:
    """A key that changes when any of the checkpoint's weight files changes."""
    digest = hashlib.sha256(f"pdserve-weights-v{FORMAT_VERSION}".encode())
    for file in sorted(Path(f).resolve() for f in files):
        stat = file.stat()
        digest.update(f"|{file}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def write_weights(key: str, tensors: Iterable[tuple[str, np.ndarray]]) -> Path:
    """Write the tensors under `key` (once: an existing file is kept); returns the .bin path."""
    directory = cache_dir()
    data_path = directory / f"{key}.bin"
    if data_path.is_file() and data_path.with_suffix(".json").is_file():
        return data_path
    directory.mkdir(parents=True, exist_ok=True)
    suffix = f".tmp-{os.getpid()}"
    partial_data = directory / f"{key}.bin{suffix}"
    index: dict[str, tuple[int, list[int]]] = {}
    offset = 0
    try:
        with open(partial_data, "wb") as out:
            for name, values in tensors:
                array = np.ascontiguousarray(values, dtype=np.float32)
                pad = (-offset) % ALIGN_ELEMENTS
                out.write(b"\0" * (4 * pad))
                offset += pad
                index[name] = (offset, list(array.shape))
                out.write(array.tobytes())
                offset += array.size
        partial_index = directory / f"{key}.json{suffix}"
        partial_index.write_text(json.dumps({"elements": offset, "tensors": index}))
        os.replace(partial_data, data_path)
        os.replace(partial_index, data_path.with_suffix(".json"))
    finally:
        partial_data.unlink(missing_ok=True)
    return data_path


def map_weights(data_path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a written file, as views of one copy-on-write mapping of it."""
    index = json.loads(data_path.with_suffix(".json").read_text())
    flat = torch.from_file(str(data_path), shared=False, size=int(index["elements"]),
                           dtype=torch.float32)
    tensors = {}
    for name, (offset, shape) in index["tensors"].items():
        count = int(np.prod(shape)) if shape else 1
        tensors[name] = flat[offset:offset + count].view(shape)
    return tensors
