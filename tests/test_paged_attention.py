"""Attention in place over the paged pool (`engine/paged_attention.py`, issue 29 part 2): the
block mask's tiles cover exactly the keys `mask_mod` shows, and an engine attending in place
gives the gather engine's tokens and logits: mixed steps, chunks after prior context,
scattered blocks, blocks shared by two sequences, the decode graphs' padded path. FlexAttention
runs eagerly here (dense over the pool); a slow test runs its compiled CPU kernel, which
visits only the listed tiles."""

from __future__ import annotations

import warnings

import pytest
import torch

from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.paged_attention import QUERY_TILE, PagedAttention, mask_mod, tiles
from pdserve.engine.sampling import SamplingParams

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BLOCK = 16


def cover(tile_ids: torch.Tensor, counts: torch.Tensor, rows: int, length: int
          ) -> torch.Tensor:
    """[rows, tiles, length]: the view rows inside each (row, query tile)'s listed tiles."""
    out = torch.zeros(rows, tile_ids.shape[2], length, dtype=torch.bool)
    for b in range(rows):
        for t in range(tile_ids.shape[2]):
            for tile in tile_ids[b, 0, t, :counts[b, 0, t]].tolist():
                out[b, t, tile * BLOCK:(tile + 1) * BLOCK] = True
    return out


@pytest.mark.parametrize("query_len", [1, 5, 150, 300])
def test_the_tiles_cover_exactly_the_keys_mask_mod_shows(query_len):
    """Every visible key lies in a listed tile of its query's tile, and every key of a tile
    listed whole is visible to every query of that tile."""
    generator = torch.Generator().manual_seed(query_len)
    pool_blocks, layers = 120, 2
    per_block = 2 * layers
    rows_per_block = per_block * BLOCK
    length = ((pool_blocks - 1) * per_block + 1) * BLOCK
    rows = 4
    contexts = torch.randint(query_len, query_len + 100, (rows,), generator=generator)
    blocks = (contexts + BLOCK - 1) // BLOCK
    width = int(blocks.max())
    order = torch.randperm(pool_blocks, generator=generator)
    tables = torch.zeros(rows, width, dtype=torch.long)
    used = 0
    for b in range(rows):  # distinct blocks per row but the first, which all rows share
        count = int(blocks[b])
        tables[b, 0] = order[0]
        tables[b, 1:count] = order[1 + used:used + count]
        used += count - 1
    assert used < pool_blocks
    first_position = contexts - query_len
    logical = torch.full((pool_blocks + 1,), -1, dtype=torch.long)
    for b in range(rows):
        logical[tables[b, :blocks[b]]] = torch.arange(int(blocks[b]))
    visible = mask_mod(logical, tables, blocks, first_position, BLOCK, rows_per_block)(
        torch.arange(rows).view(-1, 1, 1), torch.zeros(1, 1, 1, dtype=torch.long),
        torch.arange(query_len).view(1, -1, 1), torch.arange(length).view(1, 1, -1))
    # the mask alone: each query sees exactly its sequence's positions up to its own
    assert visible.sum(dim=2).tolist() == [
        [min(int(contexts[b]), int(first_position[b]) + q + 1) for q in range(query_len)]
        for b in range(rows)]
    cut = tiles(tables, blocks, first_position, query_len, BLOCK, per_block)
    listed = cover(cut.partial, cut.partial_count, rows, length) | cover(
        cut.full, cut.full_count, rows, length)
    whole = cover(cut.full, cut.full_count, rows, length)
    tile_of_query = torch.arange(query_len) // QUERY_TILE
    assert not (visible & ~listed[:, tile_of_query]).any()  # nothing visible is skipped
    assert not (whole[:, tile_of_query] & ~visible).any()  # nothing masked is taken whole
    assert int(cut.full_count.sum()) > 0 or query_len < BLOCK


def run_steps(engine: Engine) -> tuple[dict[int, list[int]], list[torch.Tensor]]:
    """Chunks after prior context, a mixed step, then decodes together."""
    for rid, count in enumerate([37, 5, 60, 16]):
        engine.add(rid, list(range(3 + rid, 3 + rid + count)),
                   SamplingParams(max_tokens=10, ignore_eos=True))
    logits = [o.logits for o in engine.run([], [(0, 20), (1, 5), (2, 33)])]
    logits += [o.logits for o in engine.run([1], [(0, 17), (2, 27), (3, 16)])]
    for _ in range(6):
        logits += [o.logits for o in engine.run([0, 1, 2, 3], [])]
    return {rid: s.generated for rid, s in engine.sequences.items()}, logits


def engine_with(attention: str, blocks: int = 24) -> Engine:
    return Engine(load_model("tiny", seed=0)[0], None, blocks,
                  device=EngineDevice(attention=attention))


def assert_same(ours: tuple, reference: tuple) -> None:
    assert ours[0] == reference[0]
    assert len(ours[1]) == len(reference[1])
    for a, b in zip(ours[1], reference[1], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_an_engine_attending_in_place_gives_the_gather_engines_tokens():
    flex = engine_with("flex")
    assert flex.paged_attention is not None and engine_with("auto").paged_attention is None
    assert_same(run_steps(flex), run_steps(engine_with("gather")))


def test_scattered_blocks_attend_in_place_as_gathered():
    """Every other block taken first: each sequence's blocks are far apart in the pool."""
    results = []
    for attention in ("gather", "flex"):
        engine = engine_with(attention, 40)
        holes = [engine.allocator.allocate(1) for _ in range(40)]
        for hole in holes[::2]:
            engine.allocator.free(hole)
        results.append(run_steps(engine))
        assert max(engine.sequences[2].blocks) > 20
    assert_same(results[1], results[0])


def test_blocks_shared_by_two_sequences_attend_in_place():
    """B starts on A's first three blocks (as a prefix-cache hit does) and prefills its
    suffix while A decodes, in one step: both hold those blocks at the same positions."""
    results = []
    for attention in ("gather", "flex"):
        engine = engine_with(attention)
        prompt = list(range(100, 164))  # 4 blocks
        engine.add(0, prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        engine.run([], [(0, 64)])
        engine.add(1, prompt[:48] + list(range(900, 930)),
                   SamplingParams(max_tokens=8, ignore_eos=True))
        second = engine.sequences[1]
        second.blocks, second.shared_blocks = list(engine.sequences[0].blocks[:3]), 3
        second.computed_tokens = 48
        logits = [o.logits for o in engine.run([0], [(1, 30)])]
        for _ in range(5):
            logits += [o.logits for o in engine.run([0, 1], [])]
        results.append(({rid: s.generated for rid, s in engine.sequences.items()}, logits))
    assert_same(results[1], results[0])


def test_the_decode_graphs_padded_path_attends_in_place():
    """The static padded decode (padding rows on the scratch block) builds its masks inside
    the forward, as a captured graph would."""
    results = []
    for attention in ("gather", "flex"):
        engine = engine_with(attention)
        engine.enable_decode_graphs(capture=False)
        results.append(run_steps(engine))
        assert engine.decode_graphs is not None and engine.decode_graphs.graphs
    assert_same(results[1], results[0])


@pytest.mark.slow
def test_the_compiled_kernel_reads_only_the_listed_tiles():
    """FlexAttention's compiled CPU kernel (inductor C++, about 20 s to build) gives the
    gather engine's tokens; with every whole tile dropped from the block mask its output
    changes, so the tiles are what it reads."""
    warnings.filterwarnings("ignore")
    compiled = engine_with("flex")
    compiled.paged_attention = PagedAttention(compiled.pool, compile=True)
    assert_same(run_steps(compiled), run_steps(engine_with("gather")))
    broken = engine_with("flex")
    broken.paged_attention = PagedAttention(broken.pool, compile=True)
    call = broken.paged_attention.call

    def without_whole_tiles(*args, **kwargs):
        mask = call(*args, **kwargs)
        mask.full_kv_num_blocks.zero_()
        return mask

    broken.paged_attention.call = without_whole_tiles  # type: ignore[method-assign]
    assert run_steps(broken)[0] != run_steps(engine_with("gather"))[0]


def test_the_gpu_step_bench_runs_on_the_cpu(tmp_path):
    """`bench/gpu_steps.py` (the issue's step-vs-vLLM figures, for a GPU session to run)
    still runs end to end: a tiny model on the CPU, both attention paths, its JSON written."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "steps.json"
    done = subprocess.run(
        [sys.executable, "bench/gpu_steps.py", "--model", "tiny", "--device", "cpu", "--quick",
         "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    assert [case["case"] for case in cases] == [
        "decode B=1 ctx=1024", "decode B=8 ctx=1024", "prefill 128", "prefill 512"]
    assert all(case["pdserve_ms"] > 0 and case["vllm_ms"] > 0 for case in cases)
    # vLLM's 8B step on an H100 from the shipped tables: milliseconds, growing with work
    assert 2 < cases[0]["vllm_ms"] < cases[1]["vllm_ms"] < 30
    assert cases[2]["vllm_ms"] < cases[3]["vllm_ms"]


def test_flex_is_refused_on_the_cpu_and_unknown_paths_clearly():
    from pdserve.engine.device import resolve_device

    with pytest.raises(ValueError, match="needs a GPU"):
        resolve_device("cpu", attention="flex")
    with pytest.raises(ValueError, match="engine attention must be one of"):
        EngineDevice(attention="paged")
    assert resolve_device("cpu").attention == "auto"
