"""What OpenAI and vLLM clients send works unmodified (issue 8, part 5).

Tests marked `needs engine sampling` rely on the engine side of the sampling branch
(logprob events, logit bias, penalties, top-k); the rest run on the server alone.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_helpers import running_server

from pdserve.engine.tokenizer import TextTokenizer

CONTEXT = 128
TOKENIZER = TextTokenizer.shipped()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """1 prefill + 1 decode worker (every choice crosses a KV hand-off), a short context."""
    with running_server(tmp_path_factory.mktemp("clients"), {
            "cluster.instances": 2, "policy.name": "static-pd", "cluster.prefill": 1,
            "cluster.decode": 1, "server.max_model_len": CONTEXT
    }) as (base, driver):
        yield base, driver


def post(base: str, route: str, **fields) -> dict:
    response = httpx.post(f"{base}{route}", json={"model": "tiny", **fields}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def complete(base: str, **fields) -> dict:
    return post(base, "/v1/completions", **fields)


def chat(base: str, **fields) -> dict:
    return post(base, "/v1/chat/completions", **fields)


def sse(base: str, route: str, **fields) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{base}{route}", json={"model": "tiny", "stream": True,
                                                       **fields}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def test_n_choices_are_independent_and_seeded_per_choice(server):
    base, driver = server
    result = complete(base, prompt="The fox", max_tokens=8, temperature=1.0, seed=7, n=2)
    texts = [c["text"] for c in sorted(result["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in result["choices"]] == [0, 1]
    assert texts[0] != texts[1]
    assert texts[0] == complete(base, prompt="The fox", max_tokens=8, temperature=1.0,
                                seed=7)["choices"][0]["text"]
    assert texts[1] == complete(base, prompt="The fox", max_tokens=8, temperature=1.0,
                                seed=8)["choices"][0]["text"]
    assert result["usage"]["prompt_tokens"] == len(TOKENIZER.encode("The fox"))
    assert not driver.live


def test_a_list_of_prompts_indexes_choices_across_prompts_and_n(server):
    base, _ = server
    prompts = ["The fox", "A queue of"]
    result = complete(base, prompt=prompts, n=2, max_tokens=6, temperature=0)
    choices = sorted(result["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    singles = [complete(base, prompt=p, max_tokens=6, temperature=0)["choices"][0]["text"]
               for p in prompts]
    assert [c["text"] for c in choices] == [singles[0], singles[0], singles[1], singles[1]]
    assert result["usage"]["prompt_tokens"] == sum(len(TOKENIZER.encode(p)) for p in prompts)
    ids = [TOKENIZER.encode(p) for p in prompts]
    by_ids = complete(base, prompt=ids, max_tokens=6, temperature=0)
    assert [c["text"] for c in by_ids["choices"]] == singles


def test_echo_prefixes_the_prompt_streaming_and_not(server):
    base, _ = server
    plain = complete(base, prompt="The fox", max_tokens=5, temperature=0)["choices"][0]["text"]
    echoed = complete(base, prompt="The fox", max_tokens=5, temperature=0, echo=True)
    assert echoed["choices"][0]["text"] == "The fox" + plain
    ids = TOKENIZER.encode("The fox")
    by_ids = complete(base, prompt=ids, max_tokens=5, temperature=0, echo=True)
    assert by_ids["choices"][0]["text"] == TOKENIZER.decode(ids) + plain
    chunks = sse(base, "/v1/completions", prompt="The fox", max_tokens=5, temperature=0,
                 echo=True)
    assert chunks[0]["choices"][0]["text"] == "The fox"
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The fox" + plain


def test_usage_on_every_chunk_with_continuous_usage_stats(server):
    base, _ = server
    chunks = sse(base, "/v1/chat/completions", messages=[{"role": "user", "content": "Hi"}],
                 max_tokens=6, ignore_eos=True, stream_options={
                     "include_usage": True, "continuous_usage_stats": True})
    assert all("usage" in c for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1]["choices"] == []  # the final usage chunk
    only_final = sse(base, "/v1/completions", prompt="x", max_tokens=3,
                     stream_options={"include_usage": True})
    assert [("usage" in c) for c in only_final] == [False] * (len(only_final) - 1) + [True]


def test_chat_message_forms_clients_send(server):
    base, _ = server
    as_text = chat(base, messages=[{"role": "user", "content": "Hello there"}], max_tokens=6,
                   temperature=0)
    as_parts = chat(base, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}],
        max_tokens=6, temperature=0)
    assert as_parts["choices"][0]["message"] == as_text["choices"][0]["message"]
    system = chat(base, messages=[{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Hi"}], max_tokens=6,
                  temperature=0)
    developer = chat(base, messages=[{"role": "developer", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"}], max_tokens=6,
                     temperature=0)
    assert developer["choices"][0]["message"] == system["choices"][0]["message"]
    history = chat(base, messages=[
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "user", "content": "So?"}], max_tokens=4, tool_choice="none",
        response_format={"type": "text"})
    assert history["usage"]["prompt_tokens"] > developer["usage"]["prompt_tokens"]


def test_chat_without_max_tokens_may_fill_the_context(server):
    base, _ = server
    result = chat(base, messages=[{"role": "user", "content": "Hi"}], ignore_eos=True)
    usage = result["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
    limited = chat(base, messages=[{"role": "user", "content": "Hi"}], ignore_eos=True,
                   max_completion_tokens=5)
    assert limited["usage"]["completion_tokens"] == 5
    assert limited["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("route", "fields", "param"), [
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    # json_object and json_schema are structured outputs now (tests/test_structured_outputs.py)
    ("/v1/chat/completions", {"response_format": {"type": "structural_tag"}},
     "response_format.type"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format.json_schema.name"),
    ("/v1/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
    ("/v1/chat/completions", {"bad_words": ["x"]}, "bad_words"),
    ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {"truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
    ("/v1/completions", {"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
    ("/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/completions", {"logits_processors": ["x.y"]}, "logits_processors"),
    ("/v1/completions", {"return_token_ids": True}, "return_token_ids"),
    ("/v1/completions", {"return_tokens_as_token_ids": True}, "return_tokens_as_token_ids"),
    ("/v1/completions", {"repetition_min_count": 2}, "repetition_min_count"),
    ("/v1/completions", {"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/v1/completions", {"structural_tag": "{}"}, "structural_tag"),
    ("/v1/completions", {"stop_token_ids": [2048]}, "stop_token_ids.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.0.content.0.type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages.0.content.0.type"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None,
                                            "tool_calls": [{"id": "1"}]}]},
     "messages.0.tool_calls"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "1"}]},
     "messages.0.tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"prompt": ["a", [1, 2]]}, "prompt"),
])
def test_unsupported_fields_get_a_400_naming_the_field(server, route, fields, param):
    base, _ = server
    default = ({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in route
               else {"prompt": "Hi"})
    response = httpx.post(f"{base}{route}", json={"model": "tiny", **default, **fields},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)


def test_unknown_fields_are_ignored(server):
    base, _ = server
    result = complete(base, prompt="Hi", max_tokens=2, some_vendor_field={"x": 1},
                      metadata={"run": "a"})
    assert result["usage"]["completion_tokens"] >= 1


def test_model_by_id(server):
    base, _ = server
    card = httpx.get(f"{base}/v1/models/tiny", timeout=10).json()
    created = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["created"]
    assert card == {"id": "tiny", "object": "model", "created": created, "owned_by": "pdserve",
                    "max_model_len": CONTEXT, "chat_template": "generic"}
    assert created > 1_700_000_000  # the server's start, not 0
    missing = httpx.get(f"{base}/v1/models/gpt-4o", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_openapi_documents_the_request_schemas(server):
    base, _ = server
    spec = httpx.get(f"{base}/openapi.json", timeout=10).json()
    body = spec["paths"]["/v1/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("CompletionRequest")
    chat_fields = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for name in ("messages", "logprobs", "top_logprobs", "stream_options", "logit_bias",
                 "max_completion_tokens", "min_tokens", "repetition_penalty"):
        assert name in chat_fields
    assert "422" not in spec["paths"]["/v1/completions"]["post"]["responses"]


# ---- needs engine sampling (the sampling branch's logprobs, logit bias, penalties) ----

def test_completion_logprobs_are_consistent_with_greedy(server):
    base, _ = server
    result = complete(base, prompt="The fox", max_tokens=8, temperature=0, ignore_eos=True,
                      logprobs=3)
    choice = result["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == 8 == result["usage"]["completion_tokens"]
    assert all(value <= 0 for value in logprobs["token_logprobs"])
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                 logprobs["top_logprobs"], strict=True):
        assert 1 <= len(top) <= 4 and top[token] == value
        assert value == pytest.approx(max(top.values()))  # greedy picks the most likely
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    if not any(t.startswith("bytes:") for t in logprobs["tokens"]):
        assert "".join(logprobs["tokens"]) == choice["text"]


def test_chat_logprobs_with_top_alternatives_streaming_and_not(server):
    base, _ = server
    fields = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0,
                  ignore_eos=True, logprobs=True, top_logprobs=3)
    whole = chat(base, **fields)
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        values = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry["logprob"] <= 0 and entry["logprob"] == pytest.approx(values[0])
        assert entry["token"] == entry["top_logprobs"][0]["token"]
    text = bytes(b for entry in content for b in entry["bytes"]).decode("utf-8", "replace")
    assert text == whole["choices"][0]["message"]["content"]
    chunks = sse(base, "/v1/chat/completions", **fields)
    streamed = [entry for c in chunks for choice in c["choices"]
                if choice.get("logprobs") for entry in choice["logprobs"]["content"]]
    assert streamed == content


def test_logit_bias_forces_a_token(server):
    base, _ = server
    result = complete(base, prompt="The fox", max_tokens=5, temperature=0, ignore_eos=True,
                      logit_bias={"300": 100})
    assert result["choices"][0]["text"] == TOKENIZER.decode([300] * 5)


def test_penalties_and_top_k_reach_the_engine(server):
    base, _ = server
    greedy = complete(base, prompt="x", max_tokens=16, temperature=0, ignore_eos=True)
    penalised = complete(base, prompt="x", max_tokens=16, temperature=0, ignore_eos=True,
                         frequency_penalty=2.0, presence_penalty=2.0, repetition_penalty=2.0)
    assert penalised["choices"][0]["text"] != greedy["choices"][0]["text"]
    top1 = complete(base, prompt="x", max_tokens=16, temperature=1.0, top_k=1, seed=3,
                    ignore_eos=True, min_p=0.0, min_tokens=4)
    assert top1["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_official_client_with_n_logprobs_and_streaming_chat(server):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    result = client.completions.create(model="tiny", prompt="The fox", n=2, max_tokens=4,
                                       temperature=0.8, seed=1, logprobs=2)
    assert sorted(c.index for c in result.choices) == [0, 1]
    assert all(c.logprobs is not None and len(c.logprobs.tokens) >= 1
               for c in result.choices)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "developer", "content": "Be brief."},
                                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_completion_tokens=5, stream=True, stream_options={"include_usage": True},
        logprobs=True, top_logprobs=1, presence_penalty=0.5, extra_body={"top_k": 20})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].logprobs for c in chunks)



# ---- issue 27: vLLM's routes agree with the completions; small gaps ----

def test_tokenize_counts_what_a_completion_and_a_chat_count(server):
    base, _ = server
    text = "The quick brown fox jumps"
    counted = httpx.post(f"{base}/tokenize", json={"model": "tiny", "prompt": text},
                         timeout=30).json()
    assert counted["max_model_len"] == CONTEXT
    assert complete(base, prompt=text, max_tokens=1)["usage"]["prompt_tokens"] == \
        counted["count"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chat_count = httpx.post(f"{base}/tokenize", json={"messages": messages},
                            timeout=30).json()["count"]
    assert chat(base, messages=messages, max_tokens=1)["usage"]["prompt_tokens"] == chat_count


def test_chat_logprobs_leave_out_the_end_of_turn_token(server):
    """OpenAI's chat logprobs end with the answer's last token, not the end of turn."""
    base, _ = server
    [eos] = TOKENIZER.eos_token_ids
    fields = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=8, min_tokens=3,
                  temperature=0, logit_bias={str(eos): 100}, logprobs=True, top_logprobs=2)
    whole = chat(base, **fields)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    assert len(content) == 3  # min_tokens, then the end of turn: not listed
    assert all(entry["token"] != "<|end_of_text|>" for entry in content)
    text = bytes(b for entry in content for b in entry["bytes"]).decode("utf-8", "replace")
    assert text == choice["message"]["content"]
    chunks = sse(base, "/v1/chat/completions", **fields)
    streamed = [entry for c in chunks for item in c["choices"]
                if item.get("logprobs") for entry in item["logprobs"]["content"]]
    assert streamed == content
    completion = complete(base, prompt="Hi", max_tokens=8, min_tokens=3, temperature=0,
                          logit_bias={str(eos): 100}, logprobs=1)
    assert len(completion["choices"][0]["logprobs"]["tokens"]) == 4  # completions keep it


def test_more_stop_strings_than_openai_allows_work_up_to_a_named_limit(server):
    base, _ = server
    stops = [f"zz{i}" for i in range(20)]  # 17+ were refused as "not a valid string"
    assert complete(base, prompt="Hi", max_tokens=2, stop=stops)["choices"]
    for stop, needle in (([f"s{i}" for i in range(65)], "at most 64 stop strings"),
                         (["x" * 257], "at most 256 characters")):
        response = httpx.post(f"{base}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": "Hi", "stop": stop})
        assert response.status_code == 400
        assert needle in response.json()["error"]["message"]
        assert response.json()["error"]["param"].startswith("stop")
