"""`pdserve serve` options and start-up: served name, context cap, chat template, API key
from the environment, log lines, a profile that fits a short context, bench's warning."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import make_perf
from engine_helpers import save_hf_model
from fastapi.testclient import TestClient
from server_helpers import running_server

from pdserve.cli import main
from pdserve.config import serve_defaults
from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.profile import QUICK_GRID, fit_grid_to_context, profile_engine
from pdserve.server.launch import build_app

USER = [{"role": "user", "content": "Hi"}]


def test_profile_fits_a_checkpoint_with_a_short_context(tmp_path):
    save_hf_model("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 600  # under the grid's 256 prior + 512 new tokens
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = profile_engine(str(tmp_path), 64, QUICK_GRID)
    # which coefficient carries a cost is noise on a loaded machine (per token or per
    # attention unit for a prefill, intercept or per sequence for a decode step), so the
    # test asserts what the fit must price: prefill time grows with the chunk
    assert model.prefill.time_s(512, 512 * 512) > model.prefill.time_s(16, 16 * 16) > 0
    assert model.decode.step_s(1, 64) > 0
    fitted = fit_grid_to_context(QUICK_GRID, 600)
    assert fitted.prior_tokens == (0, 256) and fitted.prefill_tokens == (16, 128, 512)
    assert fit_grid_to_context(QUICK_GRID, 100).prefill_tokens == (16,)
    with pytest.raises(ValueError, match="too short to profile"):
        fit_grid_to_context(QUICK_GRID, 10)


def offline_app(tmp_path, values: dict[str, object]):
    """The app without its workers started (no lifespan): routes up to admission."""
    perf = tmp_path / "perf.json"
    make_perf().save(perf)
    return build_app(serve_defaults().with_values({
        "engine.weights": "tiny", "perf.profile": str(perf), "cluster.instances": 1, **values}))


def test_served_name_context_cap_and_chat_template(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('this template takes no system message') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]"
        "{% endif %}")
    client = TestClient(offline_app(tmp_path, {"server.served_model_name": "my-model",
                                               "server.max_model_len": 100,
                                               "server.chat_template": str(template)}))
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "my-model" and card["max_model_len"] == 100
    unknown = client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    assert unknown.status_code == 404
    too_long = client.post("/v1/chat/completions", json={
        "model": "my-model", "messages": USER, "max_tokens": 100})
    assert too_long.status_code == 400
    assert "exceeds the context length 100" in too_long.json()["error"]["message"]
    refused = client.post("/v1/chat/completions", json={
        "model": "my-model", "messages": [{"role": "system", "content": "x"}, *USER]})
    assert refused.status_code == 400
    assert "takes no system message" in refused.json()["error"]["message"]
    rendered = ChatTemplate.from_file(template).render([{"role": "user", "content": "Hi"}])
    assert rendered == "[user]Hi[assistant]"


def test_bad_serve_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="exceeds the model's context of 8192"):
        offline_app(tmp_path, {"server.max_model_len": 10_000})
    with pytest.raises(ValueError, match="no such file"):
        offline_app(tmp_path, {"server.chat_template": str(tmp_path / "missing.jinja")})
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for %}")


def test_serve_takes_the_api_key_from_the_environment(tmp_path, monkeypatch):
    import uvicorn

    import pdserve.server.launch as launch

    seen = {}
    monkeypatch.setenv("PDSERVE_API_KEY", "from-env")
    monkeypatch.setattr(launch, "build_app", lambda config: seen.update(config=config))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    assert main(["serve", "--served-model-name", "m", "--max-model-len", "512",
                 "--max-body-bytes", "1000", "--log-level", "warning"]) == 0
    server = seen["config"].server
    assert (server.api_key, server.served_model_name, server.max_model_len,
            server.max_body_bytes) == ("from-env", "m", 512, 1000)
    assert seen["log_level"] == "warning"
    from pdserve.server.connections import HeaderDeadlineProtocol

    assert seen["http"] is HeaderDeadlineProtocol  # the deadline on request headers
    assert main(["serve", "--api-key", "flag"]) == 0
    assert seen["config"].server.api_key == "flag"


def test_start_up_logs_each_step(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pdserve")
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1}):
        pass
    text = caplog.text
    assert "model tiny (tiny): context 8192 tokens, vocabulary 2048, chat template generic" in text
    assert "KV cache: 512 blocks of 16 tokens per worker" in text
    assert "performance model loaded from" in text
    assert "workers up in" in text and "0: prefill (pid" in text and "1: decode (pid" in text
    assert "serving 'tiny'" in text
    assert "tokenizer in the Hugging Face format, for clients that count tokens with one " \
           "(guidellm --processor): " in text


def test_bench_warns_when_its_window_holds_a_handful_of_requests(capsys):
    # nothing listens on port 9: the one request fails at once; the warning is the point
    main(["bench", "--url", "http://127.0.0.1:9", "--model", "tiny", "--duration", "30",
          "--rate-scale", "0.05", "--timeout", "5"])
    err = capsys.readouterr().err
    assert "warning: the window holds only 1 request(s)" in err


def test_the_start_up_profile_is_measured_once_per_machine_and_model(tmp_path, monkeypatch):
    from pdserve.engine import profile_cache

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    calls = []
    measure = profile_cache.profile_engine
    monkeypatch.setattr(profile_cache, "profile_engine",
                        lambda *args, **kwargs: calls.append(args) or measure(*args, **kwargs))
    first, origin = profile_cache.start_up_profile("tiny", "tiny", 64)
    assert origin.startswith("measured, saved to") and len(calls) == 1
    again, origin = profile_cache.start_up_profile("tiny", "tiny", 64)
    assert origin.startswith("cached") and again == first and len(calls) == 1
    _, origin = profile_cache.start_up_profile("tiny", "tiny", 128)  # another pool: measure
    assert origin.startswith("measured") and len(calls) == 2


def test_auto_kv_blocks_fill_the_cache_memory_in_the_engines_dtype():
    """--kv-cache-mib holds twice the blocks of bfloat16 KV as of float32 KV."""
    from pdserve.config import EngineConfig
    from pdserve.engine.checkpoint import resolve_model
    from pdserve.server.launch import MAX_AUTO_KV_BLOCKS, kv_blocks_for

    model = resolve_model("tiny").config
    engine = EngineConfig(weights="tiny", kv_cache_mib=4)
    float32 = kv_blocks_for(engine, model)
    assert float32 == (4 << 20) // (model.kv_bytes_per_token * 16) < MAX_AUTO_KV_BLOCKS // 2
    assert kv_blocks_for(engine, model, element_bytes=2) == 2 * float32
    assert kv_blocks_for(EngineConfig(weights="tiny", kv_blocks=100), model, 2) == 100
