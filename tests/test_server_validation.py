"""Validation at the door: every poison input of issue 8 gets its own 4xx with an OpenAI
error body, no worker dies (same PIDs) and the next normal request succeeds; a huge prompt
does not stall other streams."""

from __future__ import annotations

import gzip
import json
import logging
import re
import socket
import threading
import time
import zlib

import httpx
import pytest
from conftest import make_perf
from fastapi.testclient import TestClient
from server_helpers import running_server

from pdserve.config import serve_defaults
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.errors import APIError
from pdserve.server.launch import build_app
from pdserve.server.validation import Limits, completion_prompts

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Two colocated workers, the issue's poison target."""
    with running_server(tmp_path_factory.mktemp("validation"), {
            "cluster.instances": 2, "policy.name": "colocated"
    }) as (base, driver):
        pids = [driver.workers.pid(i) for i in range(2)]
        yield base, driver, pids


def body(**fields) -> bytes:
    return json.dumps({"model": "tiny", **fields}).encode()


POISON = [  # (route, raw body, status, words the message must contain)
    (COMPLETIONS, body(prompt=[999999]), 400, "token id 999999 is outside the vocabulary"),
    (COMPLETIONS, body(prompt=[-1]), 400, "token id -1 is outside the vocabulary"),
    (COMPLETIONS, body(prompt=[5000]), 400, "token id 5000 is outside the vocabulary"),
    (COMPLETIONS, body(prompt=[[5, 6], [7, 4096]]), 400, "prompt.1: token id 4096"),
    (COMPLETIONS, body(prompt="x", seed=2**64), 400, "seed"),
    (COMPLETIONS, body(prompt="x", seed=-1), 400, "seed"),
    (COMPLETIONS, body(prompt="x", max_tokens="10"), 400, "max_tokens: Input should be a "
     "valid integer"),
    (COMPLETIONS, body(prompt="x", stream="yes"), 400, "stream: Input should be a valid "
     "boolean"),
    (COMPLETIONS, body(prompt="x", echo=1), 400, "echo: Input should be a valid boolean"),
    (COMPLETIONS, body(prompt="x", max_tokens=True), 400, "max_tokens"),
    (COMPLETIONS, body(prompt="x", temperature="0.5"), 400, "temperature"),
    (COMPLETIONS, body(prompt="x", temperature=3), 400, "temperature"),
    (COMPLETIONS, b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, "NaN"),
    (COMPLETIONS, b'{"model": "tiny", "prompt": "\\ud800"}', 400, "invalid Unicode"),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\udfffb"}]}', 400,
     "messages.0.content: invalid Unicode"),
    (COMPLETIONS, b"[" * 10000 + b"]" * 10000, 400, "nests deeper"),
    (COMPLETIONS, b'{"a":' * 10000 + b"1" + b"}" * 10000, 400, "nests deeper"),
    (COMPLETIONS, b"{not json", 400, "not valid JSON"),
    # past Python's 4,300-digit limit on int(): a ValueError that was a 500
    (COMPLETIONS, b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400,
     "an integer of more than 4300 digits"),
    (COMPLETIONS, body(prompt="x", guided_json='{"maximum": ' + "9" * 5000 + "}"), 400,
     "guided_json: an integer of more than 4300 digits"),
    (COMPLETIONS, b'"a string"', 400, "must be a JSON object"),
    (CHAT, body(messages=USER, max_tokens=0), 400, "max_tokens: Input should be greater"),
    (CHAT, body(messages=USER, max_completion_tokens=0), 400, "max_completion_tokens"),
    (CHAT, body(messages=[]), 400, "messages"),
    (CHAT, body(messages=[{"role": "robot", "content": "x"}]), 400, "messages.0.role"),
    (CHAT, body(messages=USER, logit_bias={"99999": 5}), 400, "logit_bias: token id 99999"),
    (CHAT, body(messages=USER, logit_bias={"5": 500}), 400, "logit_bias"),
    (CHAT, body(messages=USER, logit_bias={"five": 1}), 400, "not a token id"),
    (CHAT, body(messages=USER, max_tokens=9000), 400, "exceeds the context length 8192"),
    (CHAT, body(messages=USER, top_logprobs=21, logprobs=True), 400, "top_logprobs"),
    (CHAT, body(messages=USER, min_tokens=50, max_tokens=10), 400, "min_tokens"),
]


@pytest.mark.parametrize(("route", "raw", "status", "needle"), POISON,
                         ids=[f"{i}-{p[2]}" for i, p in enumerate(POISON)])
def test_poison_input_is_refused_and_every_worker_survives(server, route, raw, status,
                                                           needle):
    base, driver, pids = server
    response = httpx.post(base + route, content=raw, timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert [driver.workers.pid(i) for i in range(2)] == pids
    assert driver.health()["status"] == "ok"
    after = httpx.post(base + COMPLETIONS, timeout=60,
                       json={"model": "tiny", "prompt": "ok", "max_tokens": 2})
    assert after.status_code == 200


@pytest.mark.parametrize("sampling", [{"temperature": 1e-300}, {"top_p": 5e-324},
                                      {"temperature": 0}, {"top_p": 0.0}])
def test_degenerate_sampling_is_greedy(server, sampling):
    base, driver, pids = server
    greedy = httpx.post(base + COMPLETIONS, timeout=60, json={
        "model": "tiny", "prompt": "The fox", "max_tokens": 8, "temperature": 0}).json()
    response = httpx.post(base + COMPLETIONS, timeout=60, json={
        "model": "tiny", "prompt": "The fox", "max_tokens": 8, **sampling})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert [driver.workers.pid(i) for i in range(2)] == pids


def test_oversized_body_is_refused_quickly_with_413(server):
    base, driver, pids = server
    started = time.monotonic()
    response = httpx.post(base + COMPLETIONS, content=b"x" * (10 << 20), timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "exceeds the limit of 8388608 bytes" in response.json()["error"]["message"]
    assert time.monotonic() - started < 5  # 12 s before the limit; loose on a shared box

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b"x" * (1 << 20)

    chunked = httpx.post(base + COMPLETIONS, content=chunks(), timeout=30)
    assert chunked.status_code == 413
    assert [driver.workers.pid(i) for i in range(2)] == pids


def test_fastapi_own_errors_are_openai_shaped(server):
    base, _, _ = server
    missing = httpx.get(base + "/v2/nothing", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    wrong_method = httpx.get(base + COMPLETIONS, timeout=10)
    assert wrong_method.status_code == 405
    assert "not allowed" in wrong_method.json()["error"]["message"]


def _stream_gaps(base: str, started: threading.Event, out: dict) -> None:
    stamps = []
    with httpx.stream("POST", base + COMPLETIONS, timeout=120, json={
            "model": "tiny", "prompt": "The fox", "max_tokens": 600, "ignore_eos": True,
            "temperature": 0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.monotonic())
                started.set()
    out["stamps"] = stamps


def test_huge_prompts_do_not_stall_other_streams(server):
    base, driver, pids = server
    text_5mb = "word " * (1 << 20)  # refused unread: cannot fit 8192 tokens
    near_bound = "é" * 260_000  # short enough to be tokenised (off the loop), then refused
    ids_5mb = list(range(1000)) * 1000  # a 5 MB token-id list under the body limit
    # encoded before the window: the server runs in this process, so the client's own
    # json.dumps of 5 MB would stall it too
    bodies = [(route, body(**payload)) for route, payload in (
        (COMPLETIONS, {"prompt": text_5mb}),
        (CHAT, {"messages": [{"role": "user", "content": text_5mb}]}),
        (COMPLETIONS, {"prompt": near_bound}), (COMPLETIONS, {"prompt": ids_5mb}))]
    started, out = threading.Event(), {}
    reader = threading.Thread(target=_stream_gaps, args=(base, started, out))
    reader.start()
    assert started.wait(60)
    window_start = time.monotonic()
    for route, raw in bodies:
        response = httpx.post(base + route, content=raw, timeout=60,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "context" in response.json()["error"]["message"]
        assert httpx.get(base + "/health", timeout=5).status_code == 200
    window_end = time.monotonic()
    reader.join(120)
    stamps = [t for t in out["stamps"] if window_start <= t <= window_end + 0.5]
    assert len(stamps) > 5  # the stream kept flowing through the window
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    print(f"largest gap {max(gaps):.3f}s over {len(stamps)} chunks")
    assert max(gaps) < 1.0, f"largest gap {max(gaps):.2f}s"
    assert [driver.workers.pid(i) for i in range(2)] == pids


def test_a_non_streaming_client_that_leaves_cancels_its_request(server):
    base, driver, _ = server
    before = driver.metrics.total("pdserve:cancellations")
    with pytest.raises(httpx.TimeoutException):  # the client gives up after 1 s
        httpx.post(f"{base}{COMPLETIONS}", timeout=1.0, json={
            "model": "tiny", "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "n": 2})
    for _ in range(100):  # bounded: 10 s
        if driver.metrics.total("pdserve:cancellations") >= before + 2 and not driver.live:
            break
        time.sleep(0.1)
    assert driver.metrics.total("pdserve:cancellations") >= before + 2
    assert not driver.live


# ---- issue 27: a list of prompts is checked prompt by prompt ----

def counting_tokenizer(monkeypatch, tokenizer: TextTokenizer) -> list[int]:
    """Characters of each text `tokenizer` encodes from now on."""
    encoded: list[int] = []
    original = tokenizer.encode_batch

    def encode_batch(texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        encoded.extend(len(text) for text in texts)
        return original(texts, add_special_tokens)

    monkeypatch.setattr(tokenizer, "encode_batch", encode_batch)
    return encoded


def test_each_prompt_is_checked_against_the_context_as_soon_as_it_is_tokenised(monkeypatch):
    tokenizer = TextTokenizer.shipped()
    encoded = counting_tokenizer(monkeypatch, tokenizer)
    limits = Limits(context_tokens=8192, vocab_size=tokenizer.vocab_size)
    too_long = "é" * 100_000  # under the cheap bound (8176 x 68 characters): tokenised
    prompts = ["fine", too_long, *["also fine"] * 10]
    with pytest.raises(APIError) as refused:
        completion_prompts(prompts, tokenizer, limits, max_tokens=16)
    assert refused.value.status == 400
    assert refused.value.message.startswith("prompt.1 (")
    assert "exceeds the context length 8192" in refused.value.message
    assert encoded == [4, 100_000]  # the prompts after it were never tokenised
    encoded.clear()
    beyond = "x" * (8176 * tokenizer.max_token_bytes + 1)  # cannot fit: never tokenised
    with pytest.raises(APIError, match="prompt.2: .* characters cannot fit the context"):
        completion_prompts(["a", "b", beyond], tokenizer, limits, max_tokens=16)
    assert encoded == []


def test_a_request_of_many_long_prompts_is_refused_after_tokenising_one(tmp_path,
                                                                       monkeypatch):
    """Issue 27: 12 prompts of 0.66 MB were all tokenised (5.6 s of CPU) before the refusal."""
    perf = tmp_path / "perf.json"
    make_perf().save(perf)
    client = TestClient(build_app(serve_defaults().with_values({
        "engine.weights": "tiny", "perf.profile": str(perf), "cluster.instances": 1})))
    encoded = counting_tokenizer(monkeypatch, client.app.state.driver.tokenizer)
    prompts = ["é" * 330_000] * 12  # 7.9 MB of body; each prompt under the cheap bound
    started = time.monotonic()
    raw = json.dumps({"model": "tiny", "prompt": prompts}, ensure_ascii=False).encode()
    response = client.post(COMPLETIONS, content=raw,
                           headers={"content-type": "application/json"})
    elapsed = time.monotonic() - started
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt.0 (")
    assert encoded == [330_000]
    print(f"refused after {elapsed:.2f}s")


def _raw_request(base: str, head: bytes, timeout_s: float) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.sendall(head)
    return sock


def _read_response(sock: socket.socket) -> bytes:
    """One whole response: its head, then as many body bytes as its Content-Length says
    (a single recv may return the head alone)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            return answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    while length and len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_client_that_leaves_mid_body_is_no_server_error(server, caplog):
    """Closing the connection before the declared body is all sent is the client's doing:
    not an "unexpected error" with two tracebacks in the log per connection."""
    base, driver, pids = server
    caplog.set_level(logging.ERROR, logger="pdserve.server")
    for _ in range(3):
        _raw_request(base, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\": ", 10).close()
    time.sleep(1.0)  # the server reads the disconnects at once
    assert not [r for r in caplog.records if r.name == "pdserve.server"]
    assert [driver.workers.pid(i) for i in range(2)] == pids
    assert httpx.get(base + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("head", [
    b"Content-Length: 100\r\n\r\n{}",  # declares more than it sends
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",  # a chunked body that never ends
], ids=["short", "chunked"])
def test_a_body_that_stops_arriving_is_a_408_not_a_hang(server, monkeypatch, head):
    """Without a limit the client waited for ever and the connection held what it had sent
    (up to --max-body-bytes each) for as long as the client kept it open."""
    base, driver, pids = server
    monkeypatch.setattr("pdserve.server.body.BODY_IDLE_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with _raw_request(base, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + head, 10) as sock:
        answer = _read_response(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"no part of the request body arrived for 0.5 s" in answer
    assert time.monotonic() - started < 5
    assert [driver.workers.pid(i) for i in range(2)] == pids


def test_a_compressed_body_is_a_415_naming_its_encoding(server):
    """The server decompresses nothing (so no compression bomb can reach it): a gzip body
    was a 400 about a UTF-8 byte 0x8b, and a body declared `br` was read as plain text."""
    base, driver, pids = server
    plain = json.dumps({"model": "tiny", "prompt": "hi"}).encode()
    for encoding, raw in [("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain)),
                          ("br", plain), ("gzip, identity", plain)]:
        response = httpx.post(base + "/tokenize", content=raw, timeout=10,
                              headers={"content-encoding": encoding})
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert f"Content-Encoding {encoding!r} is not supported" in error["message"]
        assert error["type"] == "invalid_request_error"
    identity = httpx.post(base + "/tokenize", content=plain, timeout=10,
                          headers={"content-encoding": "Identity"})
    assert identity.status_code == 200, identity.text
    assert [driver.workers.pid(i) for i in range(2)] == pids
