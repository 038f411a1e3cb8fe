"""First start of `pdserve serve` with an empty cache: how long until it answers a request,
and (from `/health`'s `perf_model`) until its policies run on the profiled model.

Starts `pdserve serve` (default model unless `--serve` says otherwise) on 127.0.0.1 with
`PDSERVE_CACHE_DIR` a fresh directory, so the weights are dequantized and the engine
profiled as on a new machine; with `--load N`, N busy-loop processes load the cores for the
first `--load-s` seconds (default: all along), as other jobs do. Every `--poll` seconds it sends one
short greedy chat request; it prints, from the server's start:

  answered_s   the first request answered with a 200
  profiled_s   `/health` reports `"perf_model": "profiled"` (servers from before the
               provisional model: the first answer, since they profile before listening)

then stops the server and the load. With `--clients N`, from the first answer on, N clients
send the same request in a closed loop (at most `MAX_REQUESTS` in all) until `--after`
seconds past the switch to the profiled model, and it prints each phase's requests, mean
latency and throughput: `during` the background profile, `after` it. Everything is bounded
by `--timeout`.

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
import threading
import time

import httpx

from pdserve.live.replay_client import free_port

MAX_REQUESTS = 5000
BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def closed_loop(base: str, body: dict, clients: int, stop: threading.Event,
                state: list[str]) -> list[tuple[str, float, float]]:
    """`clients` threads each sending `body` until `stop`: (phase, start s, latency s) per
    answered request; the phase is `state[0]` when the request was sent."""
    records: list[tuple[str, float, float]] = []

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set() and len(records) < MAX_REQUESTS:
                phase, started = state[0], time.monotonic()
                try:
                    if http.post(f"{base}/v1/chat/completions", json=body).status_code == 200:
                        records.append((phase, started, time.monotonic() - started))
                except httpx.HTTPError:
                    pass

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(70)
    return records


def phases(records: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for phase, name in (("provisional", "during"), ("profiled", "after")):
        rows = [r for r in records if r[0] == phase]
        if rows:
            span = max(s + latency for _, s, latency in rows) - min(s for _, s, _ in rows)
            out[name] = {"requests": len(rows),
                         "mean_latency_s": round(sum(r[2] for r in rows) / len(rows), 3),
                         "requests_per_s": round(len(rows) / span, 2)}
    return out


def first_start(serve_args: list[str], load: int, timeout_s: float, poll_s: float,
                log_path: str, clients: int = 0, after_s: float = 30.0,
                load_s: float | None = None) -> dict[str, object]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(143))  # stop what we started
    busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(
        seconds=min(timeout_s, load_s if load_s is not None else timeout_s))])
            for _ in range(load)]
    with tempfile.TemporaryDirectory(prefix="pdserve-first-start-") as cache, \
            open(log_path, "w") as log:
        env = {**os.environ, "PDSERVE_CACHE_DIR": cache}
        started = time.monotonic()
        server = subprocess.Popen(
            [sys.executable, "-m", "pdserve.cli", "serve", "--port", str(port), *serve_args],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cache)  # PYTHONPATH decides
        answered = profiled = None
        stop, state, loop = threading.Event(), ["provisional"], None
        records: list[tuple[str, float, float]] = []
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
                            print(f"answered after {answered:.1f}s", file=sys.stderr,
                                  flush=True)
                            if clients:
                                loop = threading.Thread(target=lambda: records.extend(
                                    closed_loop(base, body, clients, stop, state)))
                                loop.start()
                    health = httpx.get(f"{base}/health", timeout=5).json()
                    model = health.get("perf_model", "profiled")  # older servers: profiled
                    if model == "profiled" and profiled is None and answered is not None:
                        profiled = max(answered, now)
                        state[0] = "profiled"
                except httpx.HTTPError:
                    pass
                if answered is not None and profiled is not None and (
                        not clients or now > profiled + after_s):
                    break
                time.sleep(poll_s)
        finally:
            stop.set()
            if loop is not None:
                loop.join(80)
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            for process in busy:
                process.kill()
                process.wait()
    return {"answered_s": answered, "profiled_s": profiled,
            **({"serving": phases(records)} if clients else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes meanwhile")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds, for everything")
    parser.add_argument("--load-s", type=float, default=None,
                        help="seconds the busy loops run (default: --timeout)")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between requests")
    parser.add_argument("--serve", default="", help="extra `pdserve serve` options, quoted")
    parser.add_argument("--log", default=os.devnull, help="the server's log goes here")
    parser.add_argument("--clients", type=int, default=0,
                        help="closed-loop clients from the first answer on (0: none)")
    parser.add_argument("--after", type=float, default=30.0,
                        help="seconds the clients go on after the switch")
    args = parser.parse_args()
    result = first_start(shlex.split(args.serve), args.load, args.timeout, args.poll, args.log,
                         args.clients, args.after, args.load_s)
    print(json.dumps({"load": args.load, "serve": args.serve, **result}))


if __name__ == "__main__":
    main()
