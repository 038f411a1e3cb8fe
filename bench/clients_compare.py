"""guidellm and `pdserve bench` on one load against one `pdserve serve`, back to back.

The load: REQUESTS streaming /v1/completions at a constant RATE req/s, 64 prompt tokens
and 16 output tokens each (guidellm: synthetic text of that many tokens with the shipped
tokenizer as its processor; pdserve bench: a trace file of the same arrivals and lengths).
Each client runs ROUNDS times, alternating, so drift on a shared machine hits both.
Prints TTFT, TPOT/ITL, end-to-end latency and throughput of each run.

  PYTHONPATH=$PWD python bench/clients_compare.py   (needs pip install 'pdserve[clients]')
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pdserve.engine.tokenizer import write_shipped_hf_tokenizer
from pdserve.live.replay_client import free_port, wait_until_healthy

REQUESTS, RATE, PROMPT_TOKENS, OUTPUT_TOKENS, ROUNDS = 40, 2.0, 64, 16, 2


def run_guidellm(url: str, processor: Path, out: Path) -> dict[str, float]:
    subprocess.run([
        "guidellm", "run", "--backend",
        f"kind=openai_http,target={url},model=tiny,request_format=/v1/completions",
        "--profile", f"kind=constant,rate={RATE}",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
        f"output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=huggingface_auto,model={processor}",
        "--output", f"kind=json,path={out}", "--disable-console"], check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1"})
    benchmark = json.loads(out.read_text())["benchmarks"][0]
    m = benchmark["metrics"]

    def stat(name: str, key: str, scale: float = 1.0) -> float:
        s = m[name]["successful"]
        return (s["percentiles"][key] if key.startswith("p") else s[key]) * scale

    made = benchmark["scheduler_metrics"]["requests_made"]
    return {"completed": made["successful"], "errored": made["errored"],
            "ttft_mean_ms": stat("time_to_first_token_ms", "mean"),
            "ttft_p50_ms": stat("time_to_first_token_ms", "p50"),
            "ttft_p90_ms": stat("time_to_first_token_ms", "p90"),
            "tpot_mean_ms": stat("time_per_output_token_ms", "mean"),
            "itl_mean_ms": stat("inter_token_latency_ms", "mean"),
            "e2e_mean_ms": stat("request_latency", "mean", 1e3),
            "req_per_s": stat("requests_per_second", "mean"),
            "out_tok_per_s": stat("output_tokens_per_second", "mean")}


def run_pdserve_bench(url: str, trace: Path, out: Path) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "pdserve.cli", "bench", "--url", url, "--trace",
                    str(trace), "--duration", str(REQUESTS / RATE + 1), "--max-input-tokens",
                    str(PROMPT_TOKENS), "--max-output-tokens", str(OUTPUT_TOKENS), "--out",
                    str(out)], check=True, stdout=subprocess.DEVNULL)
    s = json.loads((out / "summary.json").read_text())["summary"]
    return {"completed": s["completed"], "errored": s["rejected"],
            "ttft_mean_ms": s["ttft_s"]["mean"] * 1e3, "ttft_p50_ms": s["ttft_s"]["p50"] * 1e3,
            "ttft_p90_ms": s["ttft_s"]["p90"] * 1e3, "tpot_mean_ms": s["tpot_s"]["mean"] * 1e3,
            "itl_mean_ms": float("nan"), "e2e_mean_ms": s["e2e_s"]["mean"] * 1e3,
            "req_per_s": s["throughput_rps"], "out_tok_per_s": s["output_tokens_per_s"]}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="pdserve-clients-"))
    trace = root / "constant.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{i / RATE:.3f},{PROMPT_TOKENS},{OUTPUT_TOKENS}\n" for i in range(REQUESTS)))
    processor = write_shipped_hf_tokenizer(root)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "pdserve.cli", "serve", "--model", "tiny",
                               "--instances", "2", "--port", str(port), "--log-level",
                               "warning"])
    try:
        wait_until_healthy(url, 300, lambda: server.poll() is None)
        rows = []
        for round_ in range(ROUNDS):
            rows.append((f"guidellm #{round_ + 1}",
                         run_guidellm(url, processor, root / f"guidellm-{round_}.json")))
            rows.append((f"pdserve bench #{round_ + 1}",
                         run_pdserve_bench(url, trace, root / f"bench-{round_}")))
    finally:
        server.terminate()
        server.wait(60)
    columns = list(rows[0][1])
    print("| client | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, figures in rows:
        print(f"| {name} | " + " | ".join(f"{figures[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
