"""Decode steps from CUDA graphs (`engine/decode_graphs.py`): the padded static path equals
the eager decode and keeps padding rows off every sequence's KV (on the CPU, without
capture); on a GPU, the captured graphs replay the eager engine's tokens and logits."""

from __future__ import annotations

import pytest
import torch

from pdserve.engine.decode_graphs import MIN_WIDTH_BLOCKS, bucket
from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams

PROMPTS = [list(range(40, 90)), list(range(7, 12)), list(range(300, 600))]  # 3 rows: 1 pads
TOKENS = 10


def decode_all(engine: Engine) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill the prompts one by one, then decode them together; (tokens, step logits)."""
    for rid, prompt in enumerate(PROMPTS):
        engine.add(rid, prompt, SamplingParams(max_tokens=TOKENS, ignore_eos=True))
        engine.run([], [(rid, len(prompt))])
    logits = []
    while any(not engine.sequences[rid].finish_reason for rid in range(len(PROMPTS))):
        live = [rid for rid in range(len(PROMPTS)) if not engine.sequences[rid].finish_reason]
        logits += [output.logits for output in engine.run(live, [])]
    return [engine.sequences[rid].generated for rid in range(len(PROMPTS))], logits


def test_buckets_are_powers_of_two_with_a_floor():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    assert bucket(3, MIN_WIDTH_BLOCKS) == MIN_WIDTH_BLOCKS


def test_the_padded_static_decode_equals_the_eager_decode_and_spares_other_kv():
    eager = Engine(load_model("tiny", seed=0)[0], None, 64)
    padded = Engine(load_model("tiny", seed=0)[0], None, 64)
    padded.enable_decode_graphs(capture=False)
    assert padded.allocator.num_blocks == 63  # block 63 is the padding rows' scratch
    tokens_eager, logits_eager = decode_all(eager)
    tokens_padded, logits_padded = decode_all(padded)
    assert padded.decode_graphs is not None
    assert set(padded.decode_graphs.graphs) == {(4, 32)}  # 3 sequences, up to 20 blocks
    assert tokens_padded == tokens_eager
    for a, b in zip(logits_eager, logits_padded, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    for rid in range(len(PROMPTS)):  # no padding row wrote into a sequence's blocks
        blocks = padded.sequences[rid].blocks
        assert torch.allclose(padded.pool.data[blocks],
                              eager.pool.data[eager.sequences[rid].blocks], atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_captured_decode_graphs_replay_the_eager_gpu_engine(dtype):
    eager = Engine(load_model("tiny", seed=0)[0], None, 64,
                   device=EngineDevice("cuda", dtype, cuda_graphs=False))
    graphed = Engine(load_model("tiny", seed=0)[0], None, 64, device=EngineDevice("cuda", dtype))
    assert graphed.decode_graphs is not None and eager.decode_graphs is None
    tokens_eager, logits_eager = decode_all(eager)
    tokens_graphed, logits_graphed = decode_all(graphed)
    assert graphed.decode_graphs.replays_total == TOKENS - 1
    assert tokens_graphed == tokens_eager
    tolerance = 1e-4 if dtype == "float32" else 0.05
    for a, b in zip(logits_eager, logits_graphed, strict=True):
        assert (a - b).abs().max() <= tolerance * a.abs().max()
