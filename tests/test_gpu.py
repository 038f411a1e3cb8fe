"""The engine's GPU hand-off paths (issue 15 part 4): CUDA IPC between processes, pinned host
staging, and a served 1P1D on one GPU. Skipped without a GPU (CI has none); run on a lent
one (docs/results/gpu.md)."""

from __future__ import annotations

import multiprocessing
import os

import httpx
import pytest
import torch
from engine_helpers import greedy
from server_helpers import running_server

from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import attach_pool
from pdserve.types import Role

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPT_IDS = list(range(40, 90))
TOKENS = 12


def _prefill_and_export(connection, name: str, staged: bool) -> None:
    """A sender process: prefill on its GPU engine and hand the sequence off."""
    where = EngineDevice("cuda", "float32", kv_staging=staged)
    sender = Engine(load_model("tiny", seed=0)[0], None, 32, name, where)
    sender.add(0, PROMPT_IDS, SamplingParams(max_tokens=TOKENS, ignore_eos=True))
    first = sender.run([], [(0, len(PROMPT_IDS))])[0].token_id
    connection.send((first, sender.export(0)))
    connection.recv()  # the receiver has copied: the blocks may go
    sender.pool.close()


@pytest.mark.parametrize("staged", [False, True], ids=["cuda-ipc", "pinned-staging"])
def test_a_gpu_hand_off_between_processes_continues_as_one_engine(staged):
    where = EngineDevice("cuda", "float32", kv_staging=staged)
    reference = Engine(load_model("tiny", seed=0)[0], None, 32, device=where)
    expected, _ = greedy(reference, 0, PROMPT_IDS, TOKENS)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    name = f"pdserve-test-gpu-{os.getpid()}-{staged}"
    sender = context.Process(target=_prefill_and_export, args=(theirs, name, staged))
    sender.start()
    receiver = Engine(load_model("tiny", seed=0)[0], None, 32, device=where)
    try:
        assert ours.poll(120), "the sender process did not hand off"
        first, handoff = ours.recv()
        peer = attach_pool(handoff.pool_name, receiver.pool)
        assert peer.data.is_cuda is not staged  # IPC maps the GPU blocks; staging the host's
        receiver.import_from(handoff, peer)
        ours.send("done")
        while not receiver.sequences[0].finish_reason:
            receiver.run([0], [])
        assert [first, *receiver.sequences[0].generated[1:]] == expected
        peer.close()
    finally:
        sender.join(60)
        receiver.pool.close()
    assert sender.exitcode == 0


def test_served_1p1d_on_one_gpu_gives_the_single_engine_text(tmp_path):
    prompt = "The three primary colors are"
    model, tokenizer = load_model("tiny", seed=0)
    assert tokenizer is not None
    reference = Engine(model, tokenizer, 64, device=EngineDevice("cuda", "float32"))
    ids = tokenizer.encode(prompt)
    reference.add(0, ids, SamplingParams(max_tokens=16, temperature=0.0))  # EOS honoured
    reference.run([], [(0, len(ids))])
    while not reference.sequences[0].finish_reason:
        reference.run([0], [])
    with running_server(tmp_path, {
            "cluster.instances": 2, "policy.name": "static-pd", "cluster.prefill": 1,
            "cluster.decode": 1, "engine.device": "cuda", "engine.dtype": "float32"
    }) as (base, driver):
        assert driver.scheduler.roles == [Role.PREFILL, Role.DECODE]  # every request moves
        response = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == reference.text_of(0)


def test_sampling_on_the_gpu_draws_what_the_host_draws():
    """Issue 29 part 1: the sampler runs where the logits are; on the GPU every kind of row
    (greedy, seeded with each filter, penalties, bias, min_tokens) draws the host's token."""
    from test_device_sampling import mixed_rows

    from pdserve.engine.sampling import sample_batch, token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(len(mixed_rows()), 1000) * 3
    on_host = sample_batch(logits, mixed_rows(), eos_token_ids=(0,))
    assert sample_batch(logits.cuda(), mixed_rows(), eos_token_ids=(0,)) == on_host
    host_lp = token_logprobs(logits, on_host, [5] * len(on_host))
    gpu_lp = token_logprobs(logits.cuda(), on_host, [5] * len(on_host))
    for a, b in zip(host_lp, gpu_lp, strict=True):
        assert abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
