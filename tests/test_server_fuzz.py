"""Schema fuzzing (schemathesis) against the live server's `/openapi.json`, loopback only:
the document is the server's contract (issue 27, part 5).

Positive cases (bodies that fit the documented schemas) and negative ones (that do not)
for every operation, a bounded number of each, with schemathesis's response checks on: no
5xx, every status and content type documented, every body (each server-sent event included)
valid against its documented schema, every negative case refused with a 4xx. At the end
every worker is alive with its first PID and a normal request works. The document's own
request examples (streaming, logprobs, n, tool results, tokenize) must each succeed and
conform. The context is short (`max_model_len` 64) so a valid case that asks for many tokens
still ends quickly. A longer run is marked slow.
"""

from __future__ import annotations

import httpx
import pytest
from server_helpers import running_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.transport import Response  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402

EXAMPLES_PER_MODE = 60
SLOW_EXAMPLES_PER_MODE = 1500
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("fuzz"), {
            "cluster.instances": 2, "policy.name": "static-pd", "cluster.prefill": 1,
            "cluster.decode": 1, "server.max_model_len": 64
    }) as (base, driver):
        yield base, driver


def fuzz(base: str, driver, mode: GenerationMode, examples: int) -> None:  # type: ignore[no-untyped-def]
    pids = [driver.workers.pid(i) for i in range(2)]
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    seen: list[tuple[str, int]] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    # half the cases on the POST operations (the generation routes and (de)tokenize), so
    # that they are covered however many GET routes the document grows
    @given(case=st.one_of(schema.include(method="POST").as_strategy(generation_mode=mode),
                          schema.as_strategy(generation_mode=mode)))
    def check(case) -> None:
        response = case.call(base_url=base, timeout=60)
        seen.append((f"{case.method} {case.path}", response.status_code))
        assert response.status_code < 500, (case.as_curl_command(), response.text[:300])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        if mode is GenerationMode.NEGATIVE and case.method == "POST":
            assert 400 <= response.status_code < 500, case.as_curl_command()
        case.validate_response(response, checks=CHECKS)

    check()
    assert len(seen) >= examples // 2
    assert {path for path, _ in seen} >= {"POST /v1/completions", "POST /v1/chat/completions"}
    if mode is GenerationMode.POSITIVE:  # some valid cases went all the way through
        assert any(path.startswith("POST") and status == 200 for path, status in seen)
    assert [driver.workers.pid(i) for i in range(2)] == pids
    assert driver.health()["status"] == "ok"
    after = httpx.post(f"{base}/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "ok", "max_tokens": 2})
    assert after.status_code == 200


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schema_fuzzing_finds_no_server_error_and_no_contract_violation(server, mode):
    base, driver = server
    fuzz(base, driver, mode, EXAMPLES_PER_MODE)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_long_schema_fuzzing(server, mode):
    base, driver = server
    fuzz(base, driver, mode, SLOW_EXAMPLES_PER_MODE)


def test_the_documents_examples_succeed_and_conform(server):
    """Every request example in the document (streams, logprobs, n, echo, a tool result,
    tokenize of a chat) is answered 200, and the answer conforms to the document."""
    base, _ = server
    document = httpx.get(f"{base}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    tried = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            media = operation.get("requestBody", {}).get("content", {}).get(
                "application/json", {})
            for title, example in media.get("examples", {}).items():
                case = schema[path][method.upper()].Case(body=example["value"],
                                                         media_type="application/json")
                response = case.call(base_url=base, timeout=60)
                assert response.status_code == 200, (path, title, response.text[:300])
                case.validate_response(response, checks=CHECKS)
                tried.append((path, title, response.headers["content-type"][0]))
    assert len(tried) >= 9
    streams = [item for item in tried if item[2].startswith("text/event-stream")]
    assert {path for path, _, _ in streams} == {"/v1/completions", "/v1/chat/completions"}


def test_the_checks_catch_a_response_the_document_does_not_allow(server):
    """The checks are live: a streamed chunk that breaks its schema is reported."""
    base, _ = server
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    case = schema["/v1/completions"]["POST"].Case(
        body={"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True},
        media_type="application/json")
    response = case.call(base_url=base, timeout=60)
    case.validate_response(response, checks=[response_schema_conformance])
    broken = response.content.replace(b'"text_completion"', b'"something_else"')
    assert broken != response.content
    forged = Response(status_code=200, headers={"content-type": ["text/event-stream"]},
                      content=broken, request=response.request, elapsed=response.elapsed,
                      verify=response.verify, message="OK", http_version="1.1",
                      encoding="utf-8")
    with pytest.raises(BaseExceptionGroup) as failures:
        case.validate_response(forged, checks=[response_schema_conformance])
    assert any("SSE event violates schema" in str(failure)
               for failure in failures.value.exceptions)
