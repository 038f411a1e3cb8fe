"""Ray-hosted workers: KV hand-off across Ray nodes, TCP stream vs object store, and the cost
of hosting a worker loop in a Ray actor.

1. KV hand-off between two Ray nodes on this machine (`ray.cluster_utils`, two raylets on
   127.0.0.1): a sender actor on node A holds a pool of SmolLM2-135M's KV shape (30 layers,
   3 KV heads, head dim 64: 720 KiB per 16-token block); a receiver actor on node B reads a
   sequence's blocks through `ray_kv.RemoteKVPool` and `copy_aligned`, exactly the path a
   Ray-hosted worker takes, by `tcp` (the KV stream) and by `object-store`; the same-node
   shared-memory copy (a receiver on node A) is the reference. One aligned run, and the
   same blocks fragmented into 8 runs. Transports alternate within each repeat (medians),
   and every copy is checked against the sender's bytes.
2. Step overhead: one colocated instance as a local worker process and one as a Ray actor,
   both up at once; requests alternate between them (64 greedy tokens); the time per output
   token at the driver (first token to last) for the `tiny` shape (a ~ms step, so messaging
   shows) and the `small` one.

Ratios are side by side in one run; absolute figures depend on the machine's load (2 shared
cores here).

    python bench/ray_transfer.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from multiprocessing import shared_memory

import ray
import torch
from ray.cluster_utils import Cluster

from pdserve.config import serve_defaults
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import attach_pool, copy_aligned
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.live.ray_cluster import LOOPBACK, RaySettings, use_loopback
from pdserve.live.ray_kv import KVServer, object_store_pool, read_run, tcp_pool
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M-Instruct's KV
POOL_BLOCKS = 512
SIZES_BLOCKS = (16, 64, 256)  # 256, 1024 and 4096 tokens
FRAGMENTS = 8
NAMESPACE = "pdserve-bench"
BENCH_KEY = b"pdserve-bench-kv-key"
POOL_NAMES = ("pdserve-bench-s", "pdserve-bench-f", "pdserve-bench-n")  # = actor names


class PoolHost:
    """A shared KV pool with its KV server, like a Ray-hosted worker's (sender or
    receiver)."""

    def __init__(self, name: str, seed: int) -> None:
        torch.set_num_threads(1)
        self.pool = PagedKVPool(POOL_BLOCKS, LAYERS, KV_HEADS, HEAD_DIM, shared_name=name)
        torch.manual_seed(seed)
        self.pool.data.normal_()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.kv = KVServer(self.pool, ray.util.get_node_ip_address(), BENCH_KEY)
        self.peers: dict[str, object] = {}  # by transport, kept as a worker keeps them

    def kv_endpoint(self) -> tuple[str, str, int]:
        return (self.node_id, *self.kv.address)

    def read_run(self, start: int, count: int):
        return read_run(self.pool, start, count)

    def checksum(self, blocks: list[int]) -> float:
        return float(self.pool.data[blocks].double().sum())

    def receive(self, transport: str, sender_name: str, source: list[int],
                target: list[int]) -> tuple[float, int, float]:
        """Copy `source` blocks of the sender into `target` here: (seconds, copy calls,
        checksum of what arrived)."""
        if transport not in self.peers:
            sender = ray.get_actor(sender_name, namespace=NAMESPACE)
            if transport == "shared-memory":
                self.peers[transport] = attach_pool(sender_name, self.pool)
            elif transport == "tcp":
                _, host, port = ray.get(sender.kv_endpoint.remote())
                self.peers[transport] = tcp_pool((host, port), self.pool, BENCH_KEY)
            else:
                self.peers[transport] = object_store_pool(sender, self.pool)
        self.pool.data[target] = 0.0  # nothing left from the last copy
        started = time.perf_counter()
        calls = copy_aligned(self.peers[transport], self.pool, source,  # type: ignore[arg-type]
                             target)
        seconds = time.perf_counter() - started
        return seconds, calls, self.checksum(target)


def fragmented(blocks: int, pieces: int) -> list[int]:
    """`blocks` ids in `pieces` runs with a gap of one block between runs."""
    per = blocks // pieces
    return [p * (per + 1) + i for p in range(pieces) for i in range(per)]


def transfer_table(cluster: Cluster, repeats: int) -> None:
    host = ray.remote(PoolHost)
    sender = host.options(name="pdserve-bench-s", namespace=NAMESPACE, num_cpus=0.1,
                          resources={"node-a": 1}, max_concurrency=4).remote("pdserve-bench-s", 1)
    remote = host.options(name="pdserve-bench-f", namespace=NAMESPACE, num_cpus=0.1,
                          resources={"node-b": 1}, max_concurrency=4).remote("pdserve-bench-f", 2)
    near = host.options(name="pdserve-bench-n", namespace=NAMESPACE, num_cpus=0.1,
                        resources={"node-a": 1}, max_concurrency=4).remote("pdserve-bench-n", 3)
    nodes = ray.get([a.kv_endpoint.remote() for a in (sender, remote, near)])
    assert nodes[0][0] == nodes[2][0] != nodes[1][0], "placement: sender+near on A, far on B"
    block_mb = LAYERS * 2 * 16 * KV_HEADS * HEAD_DIM * 4 / 1e6
    print(f"1. KV hand-off, node A -> node B (SmolLM2-135M KV: {block_mb:.3f} MB per block); "
          f"median of {repeats}, transports alternating")
    print(f"{'blocks':>6} {'runs':>4} {'MB':>7} | {'transport':<14} {'ms':>8} {'GB/s':>6} "
          f"{'vs tcp':>7}")
    ways = (("tcp", remote), ("object-store", remote), ("shared-memory", near))
    for blocks in SIZES_BLOCKS:
        for runs in (1, FRAGMENTS):
            source = list(range(blocks)) if runs == 1 else fragmented(blocks, runs)
            target = list(range(POOL_BLOCKS - blocks, POOL_BLOCKS))
            expected = ray.get(sender.checksum.remote(source))
            times: dict[str, list[float]] = {name: [] for name, _ in ways}
            for _ in range(repeats + 1):  # the first round warms buffers and connections
                for name, receiver in ways:
                    seconds, calls, got = ray.get(receiver.receive.remote(
                        name, "pdserve-bench-s", source, target))
                    assert calls == runs and abs(got - expected) <= 1e-6 * abs(expected) + 1e-3
                    times[name].append(seconds)
            megabytes = blocks * block_mb
            tcp = statistics.median(times["tcp"][1:])
            for name, _ in ways:
                median = statistics.median(times[name][1:])
                print(f"{blocks:>6} {runs:>4} {megabytes:>7.1f} | {name:<14} {median * 1e3:>8.2f} "
                      f"{megabytes / 1e3 / median:>6.2f} {median / tcp:>6.2f}x")
    for actor in (sender, remote, near):
        ray.kill(actor)


def bench_perf() -> PerfModel:
    return PerfModel(name="bench", prefill=PrefillCoeffs(0.01, 2e-5, 1e-9),
                     decode=DecodeCoeffs(0.008, 1e-4, 2e-7, 0.001),
                     transfer=TransferCoeffs(1e-3, 1e10), kv_bytes_per_token=100_000,
                     kv_capacity_tokens=1 << 20)


async def per_token_s(driver: LiveDriver, prompt: list[int], tokens: int) -> float:
    live = driver.submit(prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                ignore_eos=True))
    while (await asyncio.wait_for(live.events.get(), 120))[0] not in ("done", "error"):
        pass
    assert live.finish_reason == "length", live.request.rejected_reason
    request = live.request
    return (request.finish_s - request.first_token_s) / (tokens - 1)


async def step_table(cluster: Cluster, repeats: int) -> None:
    print("\n2. time per output token, one colocated instance, 64 greedy tokens; median of "
          f"{repeats}, alternating")
    print(f"{'model':<6} | {'local ms':>9} {'Ray ms':>8} {'Ray/local':>9}")
    perf = bench_perf()
    prompt = list(range(5, 37))
    config = serve_defaults().with_values({"cluster.instances": 1})  # colocated
    instance = config.instance
    for model in ("tiny", "small"):
        drivers = []
        for ray_settings in (None, RaySettings(address=cluster.address, namespace=NAMESPACE,
                                               instance_resources=("node-a",))):
            policy, count = build_policy(PolicySetup(
                perf, config.slo.targets(), config.policy, instances=1,
                prefill=config.cluster.prefill, decode=config.cluster.decode,
                chunk_size_tokens=instance.chunk_size_tokens,
                max_batch_size=instance.max_batch_size,
                monitor_window_s=config.monitor.window_s, seed=config.seed))
            _, tokenizer = load_model(model, config.seed)
            workers = WorkerSettings(  # 256 KV blocks, no prefix cache
                model, config.seed, 256, instance.chunk_size_tokens, instance.max_batch_size,
                policy.phase_priority.value, 0, perf=perf)
            driver = LiveDriver(policy, count, tokenizer, workers, config.monitor.interval_s,
                                config.server.max_outstanding, ray=ray_settings)
            await driver.start()
            drivers.append(driver)
        samples: list[list[float]] = [[], []]
        for _ in range(repeats):
            for i, driver in enumerate(drivers):
                await per_token_s(driver, prompt, 8)  # warm
                samples[i].append(await per_token_s(driver, prompt, 64))
        local, hosted = (statistics.median(s) for s in samples)
        print(f"{model:<6} | {local * 1e3:>9.2f} {hosted * 1e3:>8.2f} {hosted / local:>8.2f}x")
        for driver in drivers:
            await driver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    use_loopback()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"node-a": 8}, "include_dashboard": False,
        "node_ip_address": LOOPBACK})
    cluster.add_node(num_cpus=2, resources={"node-b": 8}, node_ip_address=LOOPBACK)
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    print(f"two Ray nodes on {LOOPBACK}; {os.cpu_count()} CPUs on this machine; "
          f"Ray {ray.__version__}, Python {sys.version.split()[0]}")
    try:
        transfer_table(cluster, args.repeats)
        asyncio.run(step_table(cluster, args.repeats))
    finally:
        ray.shutdown()
        cluster.shutdown()
        for name in POOL_NAMES:  # the actors' pools, however they ended
            with contextlib.suppress(FileNotFoundError):
                shared_memory.SharedMemory(name=name).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
