"""Sampling where the logits are (issue 29 part 1): the sampler and the engine read back only
the sampled ids, their flags and the logprobs asked for, never a [rows, vocabulary] tensor.

On the CPU there is no device boundary to watch, so the logits are wrapped in a tensor
subclass that records every read to the host (`tolist`, `item`, `cpu`, `numpy`, `bool`, ...)
with the number of elements read; every tensor computed from the logits inherits it. On a GPU
the same calls are the device-to-host copies (tests/test_gpu.py runs the sampler there).
"""

from __future__ import annotations

import torch

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams, sample_batch, token_logprobs
from pdserve.engine.sampling_params import SamplingState

VOCAB = 1000
READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostReads(torch.Tensor):
    """A tensor that logs (what, elements) for every read of its values by the host."""

    reads: list[tuple[str, int]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        to_host = name == "to" and any(
            str(a) == "cpu" for a in (*args[1:], *(kwargs or {}).values()))
        if name in READS or to_host:
            cls.reads.append((name, args[0].numel()))
        return super().__torch_function__(func, types, args, kwargs or {})


class Row(SamplingState):
    def __init__(self, request_id: int, token_ids: list[int], prompt_tokens: int,
                 params: SamplingParams) -> None:
        self.request_id, self.token_ids = request_id, token_ids
        self.prompt_tokens, self.params = prompt_tokens, params


def mixed_rows() -> list[Row]:
    """Every kind of row the sampler knows, in one batch."""
    history = list(range(5, 25))
    every = [
        SamplingParams(),  # greedy
        SamplingParams(temperature=0.8, seed=7),
        SamplingParams(temperature=1.0, top_p=0.9, seed=1),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.2, min_p=0.05, seed=3),
        SamplingParams(temperature=0.9, presence_penalty=0.5, frequency_penalty=0.4,
                       repetition_penalty=1.3, seed=2),
        SamplingParams(logit_bias=((11, 50.0), (12, -100.0))),
        SamplingParams(max_tokens=40, min_tokens=30, temperature=0.5, seed=4, stop_token_ids=(13,)),
    ]
    return [Row(i, history, 10, params) for i, params in enumerate(every)]


def test_the_sampler_reads_back_only_ids_and_flags():
    torch.manual_seed(0)
    logits = torch.randn(len(mixed_rows()), VOCAB) * 3
    expected = sample_batch(logits.clone(), mixed_rows(), eos_token_ids=(0,))
    HostReads.reads = []
    tokens = sample_batch(logits.clone().as_subclass(HostReads), mixed_rows(),
                          eos_token_ids=(0,))
    assert tokens == expected  # the wrapper changes nothing
    assert tokens[6] == 11  # the +50 bias wins greedily
    assert HostReads.reads, "the ids must be read back once at least"
    rows = len(tokens)
    assert max(count for _, count in HostReads.reads) <= 2 * rows, HostReads.reads
    assert sum(count for _, count in HostReads.reads) < VOCAB  # never a vocabulary row


def test_logprobs_read_back_only_what_was_asked():
    torch.manual_seed(1)
    logits = torch.randn(4, VOCAB).as_subclass(HostReads)
    HostReads.reads = []
    result = token_logprobs(logits, [3, 4, 5, 6], [5, 0, 2, 5])
    assert [len(r.top) for r in result] == [5, 0, 2, 5]
    assert max(count for _, count in HostReads.reads) <= 4 * 5


def test_an_engine_step_reads_back_no_logits():
    """A whole step (prefill chunks, decodes, seeded and greedy rows, logprobs, prompt
    logprobs): the model's logits come out wrapped, and the engine reads back ids and asked
    logprobs only."""
    torch.manual_seed(0)
    model, _ = load_model("tiny", seed=0)
    engine = Engine(model, None, 64)
    vocab = model.config.vocab_size
    forward = engine.model.forward

    def wrapped(batch, pool):
        logits, hidden = forward(batch, pool)
        return logits.as_subclass(HostReads), hidden

    engine.model.forward = wrapped  # type: ignore[method-assign]
    engine.add(0, list(range(1, 40)), SamplingParams(max_tokens=8, ignore_eos=True))
    engine.add(1, list(range(50, 70)), SamplingParams(max_tokens=8, ignore_eos=True,
                                                      temperature=0.8, seed=5, logprobs=3))
    engine.add(2, list(range(7, 30)), SamplingParams(max_tokens=8, ignore_eos=True,
                                                     prompt_logprobs=2))
    HostReads.reads = []
    outputs = engine.run([], [(0, 39), (1, 20), (2, 23)])
    outputs += engine.run([0, 1, 2], [])
    assert len(outputs) == 6
    assert outputs[1].logprob is not None and len(outputs[1].logprob.top) == 3
    assert len(engine.sequences[2].prompt_logprobs) == 23
    assert HostReads.reads
    assert max(count for _, count in HostReads.reads) < vocab, HostReads.reads
