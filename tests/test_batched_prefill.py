"""All of a step's prefill chunks in one attention call (`engine/batched_prefill.py`, a GPU's
path): the same logits and tokens as one call per chunk, for chunks with and without prior
context next to decodes; a GPU batches them by itself."""

from __future__ import annotations

import pytest
import torch

from pdserve.engine import batched_prefill
from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams

PROMPTS = [list(range(40, 140)), list(range(7, 12)), list(range(300, 337)), [5, 17, 300, 9]]


def mixed_steps(engine: Engine) -> list[torch.Tensor]:
    """A decode next to chunks: a first chunk, a chunk after prior context, whole prompts."""
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for rid, prompt in enumerate(PROMPTS):
        engine.add(rid, prompt, params)
    logits = [o.logits for o in engine.run([], [(0, 60), (1, 5)])]  # 0: first 60 of 100
    logits += [o.logits for o in engine.run([1], [(0, 40), (2, 37), (3, 4)])]  # 40 after 60
    for _ in range(4):
        logits += [o.logits for o in engine.run([0, 1, 2, 3], [])]
    return logits


def test_one_call_for_all_chunks_equals_one_call_per_chunk():
    looped = Engine(load_model("tiny", seed=0)[0], None, 64)
    batched = Engine(load_model("tiny", seed=0)[0], None, 64)
    batched.batch_prefills = True
    expected, got = mixed_steps(looped), mixed_steps(batched)
    assert len(got) == len(expected) == 1 + 4 + 16
    for a, b in zip(expected, got, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    for rid in range(len(PROMPTS)):
        assert batched.sequences[rid].generated == looped.sequences[rid].generated


def test_the_padding_puts_each_chunk_token_in_its_row():
    padding = batched_prefill.pad([3, 1, 2], [3, 9, 2], [torch.tensor([4]),
                                                          torch.tensor([1, 2]),
                                                          torch.tensor([7])])
    assert padding.longest == 3
    assert padding.slots.tolist() == [0, 1, 2, 3, 6, 7]
    assert padding.prior.tolist() == [0, 8, 0]
    assert padding.tables.tolist() == [[4, 0], [1, 2], [7, 0]]
    assert not batched_prefill.wanted(torch.device("cpu"), 3)
    assert batched_prefill.wanted(torch.device("cuda"), 2)
    assert not batched_prefill.wanted(torch.device("cuda"), 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_batches_chunks_with_the_cpu_engines_tokens():
    cpu = Engine(load_model("tiny", seed=0)[0], None, 64)
    gpu = Engine(load_model("tiny", seed=0)[0], None, 64,
                 device=EngineDevice("cuda", "float32"))
    expected, got = mixed_steps(cpu), mixed_steps(gpu)
    for a, b in zip(expected, got, strict=True):
        assert (a - b).abs().max() <= 1e-3 * a.abs().max()
    for rid in range(len(PROMPTS)):
        assert gpu.sequences[rid].generated == cpu.sequences[rid].generated
