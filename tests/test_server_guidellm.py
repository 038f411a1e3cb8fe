"""guidellm (a real benchmark client, the `clients` extra) against a live pdserve server:
completions and chat, streaming, every request succeeds. Offline: its processor is the
served model's tokenizer in the Hugging Face format, the directory the server's start-up log
names."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from server_helpers import running_server

REQUESTS = 8
SERVED_TOKENIZER = re.compile(r"guidellm --processor\): (\S+)")


def run_guidellm(base: str, route: str, processor: Path, out: Path) -> dict:
    command = [
        shutil.which("guidellm") or "guidellm", "run",
        "--backend", f"kind=openai_http,target={base},model=tiny,request_format={route}",
        "--profile", "kind=constant,rate=2",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
        "--tokenizer", f"kind=huggingface_auto,model={processor}",
        "--output", f"kind=json,path={out}", "--disable-console"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())["benchmarks"][0]


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_streams_every_request_successfully(tmp_path, route, caplog):
    if shutil.which("guidellm") is None:
        pytest.skip("guidellm is not installed (pip install 'pdserve[clients]')")
    caplog.set_level(logging.INFO, logger="pdserve")
    with running_server(tmp_path, {"cluster.instances": 2,
                                   "policy.name": "colocated"}) as (base, driver):
        served = SERVED_TOKENIZER.search(caplog.text)
        assert served, "the start-up log names the served tokenizer's directory"
        processor = Path(served.group(1))
        assert (processor / "tokenizer.json").is_file()
        pids = [driver.workers.pid(i) for i in range(2)]
        benchmark = run_guidellm(base, route, processor, tmp_path / "guidellm.json")
        assert [driver.workers.pid(i) for i in range(2)] == pids
    made = benchmark["scheduler_metrics"]["requests_made"]
    assert made["successful"] == REQUESTS and made["errored"] == 0
    assert made["incomplete"] == 0
    tokens = benchmark["metrics"]["output_token_count"]["successful"]
    assert tokens["mean"] == 16  # guidellm's ignore_eos reached the engine
    assert benchmark["metrics"]["time_to_first_token_ms"]["successful"]["mean"] > 0
