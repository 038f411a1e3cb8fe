"""First start of `pdserve serve` with an empty cache: how long until it answers a request,
and (from `/health`'s `perf_model`) until its policies run on the profiled model.

Starts `pdserve serve` (default model unless `--serve` says otherwise) on 127.0.0.1 with
`PDSERVE_CACHE_DIR` a fresh directory, so the weights are dequantized and the engine
profiled as on a new machine; with `--load N`, N busy-loop processes (each bounded by
`--timeout`) load the cores meanwhile, as other jobs do. Every `--poll` seconds it sends one
short greedy chat request; it prints, from the server's start:

  answered_s   the first request answered with a 200
  profiled_s   `/health` reports `"perf_model": "profiled"` (servers from before the
               provisional model: the first answer, since they profile before listening)

then stops the server and the load. Everything is bounded by `--timeout`.

    PYTHONPATH=$PWD python bench/first_start.py            # quiet machine
    PYTHONPATH=$PWD python bench/first_start.py --load 2   # two cores busy
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from pdserve.live.replay_client import free_port

BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def first_start(serve_args: list[str], load: int, timeout_s: float, poll_s: float,
                log_path: str) -> dict[str, float | None]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(143))  # stop what we started
    busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=timeout_s)])
            for _ in range(load)]
    with tempfile.TemporaryDirectory(prefix="pdserve-first-start-") as cache, \
            open(log_path, "w") as log:
        env = {**os.environ, "PDSERVE_CACHE_DIR": cache}
        started = time.monotonic()
        server = subprocess.Popen(
            [sys.executable, "-m", "pdserve.cli", "serve", "--port", str(port), *serve_args],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        answered = profiled = None
        try:
            deadline = started + timeout_s
            while time.monotonic() < deadline and server.poll() is None:
                now = time.monotonic() - started
                try:
                    if answered is None:
                        body["model"] = httpx.get(f"{base}/v1/models",
                                                  timeout=5).json()["data"][0]["id"]
                        reply = httpx.post(f"{base}/v1/chat/completions", json=body,
                                           timeout=30)
                        if reply.status_code == 200:
                            answered = time.monotonic() - started
                    health = httpx.get(f"{base}/health", timeout=5).json()
                    state = health.get("perf_model", "profiled")  # older servers: profiled
                    if state == "profiled" and profiled is None and answered is not None:
                        profiled = max(answered, now)
                except httpx.HTTPError:
                    pass
                if answered is not None and profiled is not None:
                    break
                time.sleep(poll_s)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            for process in busy:
                process.kill()
                process.wait()
    return {"answered_s": answered, "profiled_s": profiled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes meanwhile")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds, for everything")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between requests")
    parser.add_argument("--serve", default="", help="extra `pdserve serve` options, quoted")
    parser.add_argument("--log", default=os.devnull, help="the server's log goes here")
    args = parser.parse_args()
    result = first_start(shlex.split(args.serve), args.load, args.timeout, args.poll, args.log)
    print(json.dumps({"load": args.load, "serve": args.serve, **result}))


if __name__ == "__main__":
    main()
