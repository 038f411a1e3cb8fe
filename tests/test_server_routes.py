"""The routes vLLM clients call besides completions (issue 27, part 4): /tokenize and
/detokenize with vLLM's shapes, /version, /ping, `created` on /v1/models, and which routes
the API key guards. The app runs in-process without its workers (no lifespan)."""

from __future__ import annotations

import time
from importlib import metadata

import pytest
from conftest import make_perf
from fastapi.testclient import TestClient

from pdserve.config import serve_defaults
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.launch import build_app

TOKENIZER = TextTokenizer.shipped()
USER = [{"role": "user", "content": "Hi there"}]


def offline_client(tmp_path, values: dict[str, object] | None = None) -> TestClient:
    perf = tmp_path / "perf.json"
    make_perf().save(perf)
    return TestClient(build_app(serve_defaults().with_values({
        "engine.weights": "tiny", "perf.profile": str(perf), "cluster.instances": 1,
        **(values or {})})))


@pytest.fixture
def client(tmp_path):
    return offline_client(tmp_path, {"server.max_model_len": 512})


def test_tokenize_a_prompt_as_vllm_does(client):
    text = "The quick brown fox"
    answer = client.post("/tokenize", json={"model": "tiny", "prompt": text}).json()
    assert answer == {"count": len(TOKENIZER.encode(text)), "max_model_len": 512,
                      "tokens": TOKENIZER.encode(text), "token_strs": None}
    named = client.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert named["token_strs"] == [TOKENIZER.raw.id_to_token(i) for i in named["tokens"]]
    assert client.post("/tokenize", json={"prompt": ""}).json()["count"] == 0


def test_tokenize_chat_messages_with_and_without_the_generation_prompt(client):
    with_prompt = client.post("/tokenize", json={"messages": USER}).json()
    without = client.post("/tokenize", json={"messages": USER,
                                             "add_generation_prompt": False}).json()
    assert with_prompt["count"] > without["count"]
    assert with_prompt["tokens"][:without["count"]] == without["tokens"]
    text = client.post("/detokenize", json={"tokens": with_prompt["tokens"]}).json()["prompt"]
    assert text == "<|user|>\nHi there\n<|assistant|>\n"  # special tokens kept, as vLLM


def test_detokenize_round_trips(client):
    text = "Hello, world! Ünïcödé — ok"
    tokens = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
    assert client.post("/detokenize", json={"model": "tiny", "tokens": tokens}).json() == {
        "prompt": text}
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}
    assert client.post("/detokenize", json={"tokens": [3.0, 4]}).status_code == 200


@pytest.mark.parametrize(("route", "body", "status", "param", "needle"), [
    ("/detokenize", {"tokens": [5, 2048]}, 400, "tokens.1",
     "token id 2048 is outside the vocabulary (0..2047)"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens.0", "token id -1 is outside"),
    ("/detokenize", {"tokens": [1, "2"]}, 400, "tokens.1", "must be an integer"),
    ("/detokenize", {"tokens": [1.5]}, 400, "tokens.0", "must be an integer"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens.0", "must be an integer"),
    ("/detokenize", {"tokens": "1 2 3"}, 400, "tokens", "valid list"),
    ("/detokenize", {}, 400, "tokens", "Field required"),
    ("/detokenize", {"model": "gpt-4o", "tokens": [1]}, 404, "model", "does not exist"),
    ("/tokenize", {"prompt": 5}, 400, "prompt", "valid string"),
    ("/tokenize", {"prompt": ["a", "b"]}, 400, "prompt", "valid string"),
    ("/tokenize", {}, 400, "prompt", "Field required"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, 400, "add_special_tokens",
     "valid boolean"),
    ("/tokenize", {"prompt": "a", "messages": USER}, 400, "messages", "not both"),
    ("/tokenize", {"messages": []}, 400, "messages", "at least 1 item"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role",
     "Input should be"),
    # continue_final_message is implemented now; both it and add_generation_prompt is a 400
    ("/tokenize", {"messages": USER, "continue_final_message": True,
                   "add_generation_prompt": True}, 400, "continue_final_message",
     "cannot both be true"),
    ("/tokenize", {"messages": USER, "chat_template_kwargs": {"messages": []}}, 400,
     "chat_template_kwargs.messages", "reserved"),
    ("/tokenize", {"messages": USER, "chat_template": "{{ x }}"}, 400, "chat_template",
     "not supported"),
    ("/tokenize", {"model": "gpt-4o", "prompt": "a"}, 404, "model", "does not exist"),
    ("/tokenize", {"prompt": "word " * 200_000}, 400, "prompt", "cannot fit the context"),
])
def test_bad_tokenize_input_gets_a_clear_4xx(client, route, body, status, param, needle):
    response = client.post(route, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_version_and_models_created_at_start(tmp_path):
    before = int(time.time())
    client = offline_client(tmp_path)
    assert client.get("/version").json() == {"version": metadata.version("pdserve")}
    card = client.get("/v1/models").json()["data"][0]
    assert before <= card["created"] <= int(time.time())
    time.sleep(1.1)
    assert client.get("/v1/models/tiny").json()["created"] == card["created"]


def test_ping_answers_get_and_post_as_health_does(client, monkeypatch):
    for method in ("GET", "POST"):
        response = client.request(method, "/ping")
        assert response.status_code == 200 and response.content == b""
    driver = client.app.state.driver  # as the driver sees it when no worker can serve
    monkeypatch.setattr(driver, "health", lambda: {"status": "unavailable"})
    for method in ("GET", "POST"):
        response = client.request(method, "/ping")
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "server_error"
    assert client.get("/health").status_code == 503


def test_the_api_key_guards_the_api_and_leaves_probes_open(tmp_path):
    client = offline_client(tmp_path, {"server.api_key": "s3cret"})
    key = {"Authorization": "Bearer s3cret"}
    guarded = [("POST", "/tokenize", {"prompt": "a"}), ("POST", "/detokenize", {"tokens": [1]}),
               ("GET", "/v1/models", None), ("GET", "/v1/models/tiny", None),
               ("POST", "/v1/completions", {"model": "tiny", "prompt": "a"})]
    for method, path, body in guarded:
        refused = client.request(method, path, json=body)
        assert refused.status_code == 401, path
        assert refused.json()["error"]["type"] == "authentication_error"
        wrong = client.request(method, path, json=body, headers={"Authorization": "Bearer s3"})
        assert wrong.status_code == 401, path
    assert client.post("/tokenize", json={"prompt": "a"}, headers=key).status_code == 200
    assert client.post("/detokenize", json={"tokens": [1]}, headers=key).status_code == 200
    for method, path in (("GET", "/version"), ("GET", "/metrics"), ("GET", "/ping"),
                         ("POST", "/ping"), ("GET", "/health"), ("GET", "/openapi.json")):
        assert client.request(method, path).status_code in (200, 503), path  # never 401


def test_probes_answer_head_as_load_balancers_send_it(client):
    for path in ("/health", "/ping", "/version"):
        response = client.head(path)
        assert response.status_code == 200, path
        assert response.content == b"", path
    # a route that has no HEAD keeps answering 405 with the methods it takes
    refused = client.head("/v1/models")
    assert refused.status_code == 405 and "GET" in refused.headers["allow"]


def test_no_redirect_built_from_the_host_header_and_no_echo_of_long_input(tmp_path):
    client = offline_client(tmp_path, {"server.api_key": "s3cret"})
    key = {"Authorization": "Bearer s3cret"}
    slash = client.get("/v1/models/", headers={**key, "Host": "evil.example"},
                       follow_redirects=False)
    assert slash.status_code == 404 and "location" not in slash.headers
    long_path = "/x" * 5_000
    missing = client.get(long_path).json()["error"]
    assert missing["type"] == "not_found_error"
    assert "(10000 characters)" in missing["message"] and len(missing["message"]) < 200
    name = "m" * 10_000
    unknown = client.post("/v1/completions", headers=key, json={"model": name, "prompt": "a"})
    assert unknown.status_code == 404
    assert len(unknown.json()["error"]["message"]) < 200
    assert client.get("/v1/models/" + name, headers=key).status_code == 404
    window = client.get("/dashboard/state", params={"window_s": "9" * 5_000}, headers=key)
    assert window.status_code == 400 and "(5000 characters)" in window.json()["error"]["message"]
