"""The decoder's fused elementwise work (`engine/elementwise.py`, issue 29 part 3): each
compiled function equals its eager form, for any token count (one compile, dynamic shapes),
and an engine running fused gives the eager engine's tokens. Compiled here by inductor's C++
backend; a GPU compiles the same functions to Triton (tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from pdserve.engine import elementwise
from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def fused() -> elementwise.Elementwise:
    return elementwise.fused()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_fused_function_equals_its_eager_form(fused, dtype):
    torch.manual_seed(0)
    # bfloat16: the fused kernel keeps float32 between its operations where eager rounds
    # each one, so they differ by an ulp or two (2^-8 relative each)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    weight = torch.rand(64, dtype=dtype) + 0.5
    for tokens in (1, 7, 33):  # several sizes, one compiled kernel each
        x, residual = (torch.randn(tokens, 64, dtype=dtype) for _ in range(2))
        assert torch.allclose(fused.rms_norm(x, weight, 1e-6),
                              elementwise.rms_norm(x, weight, 1e-6), atol=tolerance, rtol=tolerance)
        for ours, eager in zip(fused.add_rms_norm(x, residual, weight, 1e-6),
                               elementwise.add_rms_norm(x, residual, weight, 1e-6),
                               strict=True):
            assert torch.allclose(ours, eager, atol=tolerance, rtol=tolerance)
        q, k = torch.randn(tokens, 4, 16, dtype=dtype), torch.randn(tokens, 2, 16, dtype=dtype)
        angles = torch.rand(tokens, 1, 16) * 6
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        for ours, eager in zip(fused.rotary(q, k, cos, sin),
                               elementwise.rotary(q, k, cos, sin), strict=True):
            assert torch.allclose(ours, eager, atol=tolerance, rtol=tolerance)
        gate, up = torch.randn(tokens, 96, dtype=dtype), torch.randn(tokens, 96, dtype=dtype)
        assert torch.allclose(fused.silu_mul(gate, up), elementwise.silu_mul(gate, up),
                              atol=tolerance, rtol=tolerance)
    # the fused residual add is the eager sum, bit for bit: the residual stream is unchanged
    x, residual = torch.randn(5, 64), torch.randn(5, 64)
    assert torch.equal(fused.add_rms_norm(x, residual, weight.float(), 1e-6)[1], x + residual)


def test_an_engine_running_fused_gives_the_eager_engines_tokens():
    results = []
    for fuse in (False, True):
        engine = Engine(load_model("tiny", seed=0)[0], None, 32,
                        device=EngineDevice(fused_elementwise=fuse))
        assert engine.model.elementwise.fused is fuse
        logits = []
        for rid, count in enumerate([37, 5, 20]):
            engine.add(rid, list(range(9 + rid, 9 + rid + count)),
                       SamplingParams(max_tokens=8, ignore_eos=True))
        logits += [o.logits for o in engine.run([], [(0, 37), (1, 5), (2, 11)])]
        for _ in range(7):
            logits += [o.logits for o in engine.run([0, 1], [(2, 9)] if _ == 0 else [])]
        results.append(({rid: s.generated for rid, s in engine.sequences.items()}, logits))
    assert results[1][0] == results[0][0]
    for ours, eager in zip(results[1][1], results[0][1], strict=True):
        assert torch.allclose(ours, eager, atol=1e-4)
