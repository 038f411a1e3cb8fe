"""Structured outputs (issue 27, part 2): `response_format`, vLLM's `structured_outputs` and the
older `guided_*` fields, applied as a token mask in the sampler; one constraint per request,
an invalid one refused at the door; the constraint survives a P->D hand-off and a failover
resume exactly. The default model answers JSON valid against a schema with sampling on.
Loopback only, bounded request counts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import jsonschema
import pytest
import torch
from server_helpers import running_server, wait_until

from pdserve.engine.checkpoint import DEFAULT_MODEL, default_model_path
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.sampling_params import OutputConstraint
from pdserve.engine.structured_output import GrammarCompiler
from pdserve.worker.constraint_compiles import ConstraintCompiles
from pdserve.worker.messages import AddRequest, Cancel

torch.set_num_threads(1)

CITY = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "country": {"type": "string", "enum": ["France", "Italy", "Spain", "Germany"]},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
    "capital": {"type": "boolean"}},
    "required": ["city", "country", "population_millions", "capital"],
    "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe Paris as JSON: city, country, population in "
                                   "millions, whether it is a capital."}]
CHOICES = ["yes", "no", "maybe"]
REGEX = r"[0-9]{3}-[a-z]{2,4}"


def engine_run(engine: Engine, request_id: int, prompt: list[int], params: SamplingParams,
               resume: tuple[int, ...] = ()) -> list[int]:
    engine.add(request_id, prompt, params, resume)
    engine.run([], [(request_id, len(prompt) + len(resume))])
    while not engine.sequences[request_id].finish_reason:
        engine.run([request_id], [])
    return engine.sequences[request_id].generated


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny", seed=0)
    return model, tokenizer


# ---- the engine ----

def test_a_constraint_masks_every_token_and_ends_the_output_when_complete(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, 64)
    prompt = tokenizer.encode("Answer:")
    for seed in range(4):
        params = SamplingParams(max_tokens=40, temperature=1.0, seed=seed,
                                constraint=OutputConstraint("regex", REGEX))
        engine_run(engine, seed, prompt, params)
        assert re.fullmatch(REGEX, engine.text_of(seed)), engine.text_of(seed)
        assert engine.sequences[seed].finish_reason == "stop"
    params = SamplingParams(max_tokens=10, temperature=0.0,
                            constraint=OutputConstraint("choice", json.dumps(CHOICES)))
    engine_run(engine, 9, prompt, params)
    assert engine.text_of(9) in CHOICES


def test_a_resumed_sequence_continues_exactly_as_the_uninterrupted_one(tiny):
    """Resume (failover) and adoption (KV hand-off) rebuild the matcher from the tokens
    already generated; seeded sampling then draws what the uninterrupted run drew."""
    model, tokenizer = tiny
    prompt = tokenizer.encode("Some JSON:")
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=7,
                            constraint=OutputConstraint("json", json.dumps(CITY)))
    whole = engine_run(Engine(model, tokenizer, 64), 1, prompt, params)
    assert len(whole) > 6
    for cut in (1, 3, len(whole) // 2, len(whole) - 1):
        resumed = engine_run(Engine(model, tokenizer, 64), 2, prompt, params,
                             tuple(whole[:cut]))
        assert resumed == whole, cut
    source = Engine(model, tokenizer, 64)
    source.add(3, prompt, params)
    source.run([], [(3, len(prompt))])  # prefill + the first token, then hand off
    for _ in range(4):
        source.run([3], [])
    target = Engine(model, tokenizer, 64)
    target.import_from(source.export(3), source.pool)
    while not target.sequences[3].finish_reason:
        target.run([3], [])
    assert target.sequences[3].generated == whole


def test_a_failed_batch_rewinds_the_matcher_with_the_tokens(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, 64)
    prompt = tokenizer.encode("x")
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=3,
                            constraint=OutputConstraint("regex", "[a-c]{10}"))
    whole = engine_run(Engine(model, tokenizer, 64), 0, prompt, params)
    engine.add(0, prompt, params)
    engine.run([], [(0, len(prompt))])
    for _ in range(3):
        engine.run([0], [])
    engine.rewind(0, len(prompt) + 2)
    engine.sequences[0].computed_tokens = len(prompt) + 1
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    assert engine.sequences[0].generated == whole


def test_a_matcher_that_fails_its_mask_fails_the_request_instead_of_ending_it(tiny):
    """A constraint past one of llguidance's limits (or admitting nothing) errs when its
    mask is computed; its mask then allows only EOS, and the output used to end ("stop")
    as if the constraint were complete."""
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, 64)
    params = SamplingParams(max_tokens=10, temperature=0.0,
                            constraint=OutputConstraint("json", '{"$ref": "#"}'))
    with pytest.raises(ValueError, match="cannot be matched"):
        engine_run(engine, 0, tokenizer.encode("Answer:"), params)


def test_commands_wait_for_their_constraint_in_order_and_one_compile_serves_all(tiny):
    model, tokenizer = tiny
    compiles = ConstraintCompiles(Engine(model, tokenizer, 64))
    constraint = OutputConstraint("choice", json.dumps([f"c{i}" for i in range(3000)]))
    params = SamplingParams(max_tokens=4, constraint=constraint)
    first, second = (AddRequest(i, (1, 2, 3), params) for i in (1, 2))
    unconstrained = AddRequest(3, (1, 2, 3), SamplingParams(max_tokens=4))
    assert compiles.holds(first) and compiles.holds(second) and compiles.waiting
    assert not compiles.holds(unconstrained)  # nothing to wait for
    assert compiles.holds(Cancel(1))  # a later command of a parked request keeps its order
    assert compiles.forget(2) == [second] and compiles.forget(2) == []
    released: list = []
    assert wait_until(lambda: bool(released.extend(compiles.released()) or released), 30)
    assert released == [([first, Cancel(1)], None)] and not compiles.waiting
    assert not compiles.holds(AddRequest(4, (1,), params))  # compiled: no wait now
    bad = OutputConstraint("regex", "(")
    assert compiles.holds(AddRequest(5, (1,), SamplingParams(max_tokens=4, constraint=bad)))
    released = []
    assert wait_until(lambda: bool(released.extend(compiles.released()) or released), 30)
    [(commands, error)] = released
    assert [c.request_id for c in commands] == [5] and isinstance(error, ValueError)
    compiles.close()


def test_grammar_engine_messages_reach_a_client_without_its_internals():
    from pdserve.engine.structured_output import bounded_message
    panic = ("panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n"
             "<backtrace>\n   0: <unknown>\n  16: type_call\n             at /tmp/x.rs")
    assert bounded_message(panic) == (
        "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10")
    assert bounded_message("Parser Error: max is 2000\n<non-verbose/>") == (
        "Parser Error: max is 2000")
    assert bounded_message("a\tb" + "x" * 500).startswith("a\\tb")
    assert len(bounded_message("x" * 5000)) == 403  # 400 characters and "..."


def test_a_checked_constraint_passes_its_check_again(tiny):
    """The copies of a compiled matcher share its lexer's capped cache of regex states; a
    pathological regex exhausts it with one first mask, so a second first mask failed
    ("too many expressions constructed"): the same constraint passed the door once and
    was refused the next time. `check` computes the first mask once per constraint, and a
    worker's `compile` computes none."""
    model, tokenizer = tiny
    grammars = GrammarCompiler(tokenizer, tokenizer.eos_token_ids, model.config.vocab_size)
    heavy = OutputConstraint("regex", "(a{1000}){1000}")
    grammars.check(heavy)
    grammars.check(heavy)  # raised ConstraintError before
    grammars.compile(OutputConstraint("regex", REGEX))
    assert grammars.is_compiled(OutputConstraint("regex", REGEX))


def test_compiled_grammars_are_cached_and_bounded(tiny):
    _, tokenizer = tiny
    grammars = GrammarCompiler(tokenizer, tokenizer.eos_token_ids, tokenizer.vocab_size)
    for i in range(80):
        grammars.check(OutputConstraint("regex", f"a{{{i + 1}}}"))
    assert len(grammars._compiled) == 64
    with pytest.raises(ValueError, match="unclosed group"):
        grammars.check(OutputConstraint("regex", "(a"))


# ---- the server, tiny model ----

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """1 prefill + 1 decode worker: every multi-token request crosses a KV hand-off."""
    with running_server(tmp_path_factory.mktemp("structured"), {
            "cluster.instances": 2, "policy.name": "static-pd", "cluster.prefill": 1,
            "cluster.decode": 1}) as (base, driver):
        yield base, driver


def complete(base: str, **fields) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", timeout=120,
                      json={"model": "tiny", "prompt": "Answer:", **fields})


def test_a_large_new_constraint_compiles_beside_the_batch_loop_not_inside_it(server, tiny):
    """A guided_choice of 40,000 strings takes a worker about a second to compile; it used
    to compile inside the batch loop, so every other request on that worker waited as long.
    Now it compiles in a thread (`worker/constraint_compiles.py`) while the loop steps: the
    short requests sent meanwhile are served at once. (This constraint then fails alone
    at its second token: past llguidance's 2,000 items in a parser row.)"""
    base, _ = server
    model, tokenizer = tiny
    choices = [f"choice {i} z" for i in range(40_000)]
    grammars = GrammarCompiler(tokenizer, tokenizer.eos_token_ids, model.config.vocab_size)
    started = time.monotonic()
    grammars.check(OutputConstraint("choice", json.dumps(choices)))
    compile_s = time.monotonic() - started  # one worker's compile (~1 s here)
    answer: dict[str, object] = {}

    def constrained() -> None:
        answer["response"] = complete(base, max_tokens=5, temperature=0.0,
                                      guided_choice=choices)
        answer["at"] = time.monotonic()

    sent = time.monotonic()
    thread = threading.Thread(target=constrained)
    thread.start()
    latencies: list[float] = []
    while thread.is_alive() and time.monotonic() - sent < 60:  # short requests meanwhile
        begin = time.monotonic()
        short = complete(base, max_tokens=1, temperature=0.0)
        assert short.status_code == 200, short.text[:300]
        latencies.append(time.monotonic() - begin)
    thread.join(60)
    response = answer["response"]
    assert isinstance(response, httpx.Response) and response.status_code == 400
    message = response.json()["error"]["message"]
    assert "does not satisfy the output constraint" in message and "max is 2000" in message
    assert "made the engine fail" not in message  # the constraint's failure, not the engine's
    assert "<state>" not in message and "compute_time_us" not in message  # no parser dump
    assert isinstance(answer["at"], float) and answer["at"] - sent > 1.5 * compile_s
    assert len(latencies) > 10
    assert max(latencies) < min(0.6, compile_s / 2), (max(latencies), compile_s)


@pytest.mark.parametrize("fields", [
    {"guided_regex": REGEX},
    {"structured_outputs": {"regex": REGEX}},
])
def test_a_regex_constraint_holds_through_a_hand_off_and_equals_one_engine(server, tiny,
                                                                            fields):
    base, _ = server
    model, tokenizer = tiny
    for seed in (1, 2):
        response = complete(base, max_tokens=30, temperature=1.0, seed=seed, **fields)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["text"]
        assert re.fullmatch(REGEX, text), text
        assert response.json()["choices"][0]["finish_reason"] == "stop"
        params = SamplingParams(max_tokens=30, temperature=1.0, seed=seed,
                                constraint=OutputConstraint("regex", REGEX))
        engine = Engine(model, tokenizer, 64)
        engine_run(engine, 0, tokenizer.encode("Answer:"), params)
        assert text == engine.text_of(0)


def test_guided_choice_and_json_forms_on_both_routes(server):
    base, _ = server
    for fields in ({"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}):
        text = complete(base, max_tokens=10, **fields).json()["choices"][0]["text"]
        assert text in CHOICES
    chat = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": ASK, "max_tokens": 80, "seed": 4,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "city", "schema": CITY, "strict": True}}}).json()
    choice = chat["choices"][0]
    if choice["finish_reason"] == "stop":  # a random model may not finish in 80 tokens
        jsonschema.validate(json.loads(choice["message"]["content"]), CITY)
    for fields in ({"guided_json": {"type": "array", "items": {"type": "integer"},
                                    "maxItems": 3}},
                   {"structured_outputs": {"json_object": True}},
                   {"response_format": {"type": "json_object"}}):
        result = complete(base, max_tokens=60, seed=2, **fields).json()["choices"][0]
        if result["finish_reason"] == "stop":
            json.loads(result["text"])


def test_a_grammar_constraint_in_lark(server):
    base, _ = server
    grammar = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[1-9]/'
    result = complete(base, max_tokens=40, seed=5,
                      structured_outputs={"grammar": grammar}).json()["choices"][0]
    assert re.fullmatch(r"\([1-9](,[1-9])*\)", result["text"]) or (
        result["finish_reason"] == "length" and result["text"].startswith("("))


@pytest.mark.parametrize(("fields", "param", "needle"), [
    ({"guided_json": {"type": "nonsense"}}, "guided_json", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": 3}}}}, "response_format",
     "properties must be an object"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "unclosed group"),
    ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar",
     "unknown name"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    # a schema given as JSON text is held to the body's nesting limit: from ~900 levels
    # (past Python's recursion limit in json.loads) it was a 500 (RecursionError)
    ({"guided_json": "[" * 5000 + "]" * 5000}, "guided_json", "nests deeper than 32"),
    ({"structured_outputs": {"json": '{"items":' * 40 + "{}" + "}" * 40}},
     "structured_outputs.json", "nests deeper than 32"),
    ({"guided_choice": []}, "guided_choice", "at least 1 item"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice",
     "got guided_regex and guided_choice"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs.regex", "got response_format and structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "json": {"type": "object"}}},
     "structured_outputs.regex", "got structured_outputs.json and structured_outputs.regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag",
     "not supported"),
    # compiles, but its first mask fails: it was answered 200 with "" and finish "stop"
    ({"guided_json": {"$ref": "#"}}, "guided_json", "cannot be matched"),
])
def test_an_invalid_or_second_constraint_is_a_400_at_the_door(server, fields, param, needle):
    base, driver = server
    submitted = driver.metrics.total("pdserve:requests")
    for route, body in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions", {"messages": ASK})):
        response = httpx.post(f"{base}{route}", timeout=30,
                              json={"model": "tiny", **body, **fields})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and needle in error["message"], error
    assert driver.metrics.total("pdserve:requests") == submitted  # no worker saw them


def test_a_grammar_error_is_escaped_and_bounded(server):
    base, _ = server
    response = complete(base, guided_regex="(" * 5000 + "\n\x01")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert len(message) < 600 and "\x01" not in message and "\n" not in message


def test_a_constrained_stream_resumes_exactly_after_its_decode_worker_dies(tmp_path):
    """Kill the decode worker mid-stream: the re-run resumes from the streamed tokens, its
    matcher advanced through them, and the text equals the fault-free run's."""
    regex = "[a-z]{300}"
    body = {"model": "tiny", "prompt": "Letters:", "max_tokens": 240, "temperature": 1.0,
            "seed": 11, "guided_regex": regex, "stream": True}

    def stream(base: str, started: threading.Event, out: dict) -> None:
        parts = []
        with httpx.stream("POST", f"{base}/v1/completions", timeout=120,
                          json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    parts.append(chunk["choices"][0]["text"])
                    if len(parts) >= 8:
                        started.set()
        out["text"] = "".join(parts)

    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 2}) as (base,
                                                                                  driver):
        reference: dict = {}
        stream(base, threading.Event(), reference)
        assert re.fullmatch("[a-z]+", reference["text"]) and len(reference["text"]) >= 240
        started, out = threading.Event(), {}
        thread = threading.Thread(target=stream, args=(base, started, out))
        thread.start()
        assert started.wait(60)
        live = next(iter(driver.live.values()))
        decoder = live.request.decode_instance
        assert decoder in (1, 2)
        os.kill(driver.workers.pid(decoder), signal.SIGKILL)
        thread.join(120)
        assert out["text"] == reference["text"]
        assert driver.metrics.total("pdserve:retries") == 1
        assert driver.metrics.total("pdserve:resumed_tokens") >= 8
        assert wait_until(lambda: driver.health()["status"] == "ok", 60)


# ---- the default model ----

def _default_model_installed() -> bool:
    try:
        default_model_path()
    except ValueError:
        return False
    return True


needs_default_model = pytest.mark.skipif(not _default_model_installed(),
                                         reason="the default model is not installed")


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("smollm"), {
            "engine.weights": "", "cluster.instances": 1, "engine.kv_blocks": 64}) as (
            base, driver):
        yield base, driver


def json_answers(base: str, seeds: range) -> list[dict]:
    answers = []
    for seed in seeds:
        result = httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
            "model": DEFAULT_MODEL, "messages": ASK, "temperature": 1.0, "seed": seed,
            "max_tokens": 120, "response_format": {"type": "json_schema", "json_schema": {
                "name": "city", "schema": CITY, "strict": True}}}).json()
        choice = result["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        answer = json.loads(choice["message"]["content"])
        jsonschema.validate(answer, CITY)
        answers.append(answer)
    return answers


@needs_default_model
def test_the_default_model_answers_schema_valid_json_with_sampling_on(smollm):
    base, _ = smollm
    answers = json_answers(base, range(2))
    assert all(answer["country"] in CITY["properties"]["country"]["enum"] for answer in answers)


@needs_default_model
@pytest.mark.slow
def test_the_default_model_answers_schema_valid_json_ten_times_in_a_row(smollm):
    base, _ = smollm
    answers = json_answers(base, range(100, 110))
    assert len(answers) == 10


@needs_default_model
def test_the_default_model_picks_one_of_the_choices_and_honours_a_regex(smollm):
    base, _ = smollm
    for seed in range(3):
        result = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": DEFAULT_MODEL, "temperature": 1.0, "seed": seed, "max_tokens": 10,
            "messages": [{"role": "user", "content": "Is Paris the capital of France?"}],
            "guided_choice": CHOICES}).json()
        assert result["choices"][0]["message"]["content"] in CHOICES
    result = httpx.post(f"{base}/v1/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "prompt": "A date: ", "temperature": 1.0, "seed": 9,
        "max_tokens": 20, "structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]",
                        result.json()["choices"][0]["text"]), result.text
