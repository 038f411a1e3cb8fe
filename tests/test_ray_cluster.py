"""`pdserve serve --ray` on a two-node Ray cluster on this machine (`ray.cluster_utils`,
two raylets on 127.0.0.1 with explicit CPUs): a P->D hand-off across nodes, a migration
across nodes mid-stream, an actor killed mid-stream and restarted, and a node that leaves.
One cluster and one server for the module (Ray's start-up is slow on small machines); the
tests run in file order, the node's departure last. Skipped without Ray."""

from __future__ import annotations

import random
import socket
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from server_helpers import metric, running_server  # noqa: E402
from test_server import PROMPT, local_greedy  # noqa: E402
from test_server_faults import FAULT_TOKEN, complete, stream_text  # noqa: E402

from pdserve.live.processes import WorkerState  # noqa: E402
from pdserve.live.ray_channel import ACTOR_CRASH_EXIT_CODE  # noqa: E402
from pdserve.live.ray_cluster import LOOPBACK, RaySettings, use_loopback  # noqa: E402
from pdserve.worker.faults import EXIT_TOKEN_ENV  # noqa: E402

NODE_A, NODE_B = "pdserve-test-node-a", "pdserve-test-node-b"
# instance 0 prefills on node A; decode instances 1 on node B, 2 on node A
PLACEMENT = (NODE_A, NODE_B, NODE_A)
BOUND_S = 60.0  # every request ends within this after a fault


@pytest.fixture(scope="module")
def cluster():
    use_loopback()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {NODE_A: 8}, "include_dashboard": False,
        "node_ip_address": LOOPBACK})
    node_b = cluster.add_node(num_cpus=2, resources={NODE_B: 8}, node_ip_address=LOOPBACK)
    ray.init(address=cluster.address, namespace="pdserve-test")
    try:
        yield cluster, node_b
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    settings = RaySettings(address=cluster[0].address, instance_resources=PLACEMENT,
                           namespace="pdserve-test")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(EXIT_TOKEN_ENV, str(FAULT_TOKEN))  # a crash on that token (never output)
        with running_server(tmp_path_factory.mktemp("ray"), {
                "cluster.instances": 3, "policy.name": "static-pd", "cluster.prefill": 1,
                "cluster.decode": 2, "engine.kv_blocks": 256, "server.ray": settings,
                "server.port": quiet_port()
        }) as (base, driver):
            yield base, driver


def quiet_port() -> int:
    """A free port outside the kernel's ephemeral range and Ray's worker ports (10002-19999):
    the server binds it only after its actors started, and they open ports of their own."""
    for port in random.sample(range(20000, 30000), 200):
        with socket.socket() as probe:
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")


def sent_to_peers(driver, instance: int) -> tuple[int, int]:
    """(runs, bytes) the instance's actor served to workers on other nodes."""
    return ray.get(driver.workers.actor(instance).kv_served.remote(), timeout=30)


def stream_in_thread(base: str, max_tokens: int) -> tuple[threading.Thread, threading.Event,
                                                        dict]:
    started, out = threading.Event(), {}
    client = threading.Thread(target=stream_text, args=(base, max_tokens, started, out))
    client.start()
    assert started.wait(BOUND_S)
    return client, started, out


def decoding(driver, instances: set[int], min_tokens: int = 5):
    """The in-flight requests once one decodes on one of `instances` past `min_tokens`."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        lives = [x for x in list(driver.live.values())
                 if x.request.decode_instance in instances and x.tokens_sent > min_tokens]
        if lives:
            return lives[0]
        time.sleep(0.05)
    raise AssertionError(f"no request decoded on {instances} within {BOUND_S}s")


def test_workers_run_as_actors_on_the_nodes_they_were_placed_on_and_health_names_them(
        server, cluster):
    base, driver = server
    nodes = [driver.workers.node_of(i) for i in range(3)]
    assert nodes[0] == nodes[2] != nodes[1]
    assert nodes[1] == cluster[1].node_id
    health = httpx.get(f"{base}/health")
    assert health.status_code == 200
    assert health.json()["nodes"] == {str(i): {"node_id": node, "node_ip": LOOPBACK}
                                      for i, node in enumerate(nodes)}
    assert health.json()["waiting_for_resources"] == {}


def test_a_prefill_on_one_node_decoded_on_the_other_equals_one_instance(server):
    base, driver = server
    before = sent_to_peers(driver, 0)
    client, _, out = stream_in_thread(base, 48)
    client.join(BOUND_S)
    assert out["error"] is None and out["text"] == local_greedy(PROMPT, 48)
    runs, sent_bytes = sent_to_peers(driver, 0)
    # the decode ran on node B (instance 1, the least loaded first): the prefill's KV was
    # read from node A's worker, whole blocks, in aligned runs
    assert runs > before[0] and sent_bytes > before[1]
    assert metric(httpx.get(f"{base}/metrics").text, "pdserve:kv_handoffs_total") == 1


def test_a_decode_migrated_across_nodes_mid_stream_loses_and_repeats_nothing(server):
    base, driver = server
    client, _, out = stream_in_thread(base, 200)
    live = decoding(driver, {1, 2})
    source = live.request.decode_instance
    target = 3 - source  # 1 is on node B, 2 on node A
    before = sent_to_peers(driver, source)
    driver._loop.call_soon_threadsafe(driver.move_decode, live.request.request_id, target)
    client.join(BOUND_S)
    assert not client.is_alive()
    assert out["error"] is None and out["text"] == local_greedy(PROMPT, 200)
    assert live.request.decode_instance == target
    assert sent_to_peers(driver, source)[1] > before[1]  # read across the nodes
    assert metric(httpx.get(f"{base}/metrics").text, "pdserve:migrations_total") == 1


def wait_live(driver, instance: int) -> None:
    deadline = time.monotonic() + BOUND_S
    while driver.workers.states[instance] is not WorkerState.LIVE:
        assert time.monotonic() < deadline, f"instance {instance} did not come back"
        time.sleep(0.1)


def test_a_killed_actor_re_runs_its_requests_and_its_restart_takes_work_again(server):
    base, driver = server
    client, _, out = stream_in_thread(base, 200)
    live = decoding(driver, {1, 2})
    victim = live.request.decode_instance
    old_pid = driver.workers.pid(victim)
    killed_at = time.monotonic()
    ray.kill(driver.workers.actor(victim))  # from outside: its requests are re-run
    client.join(BOUND_S)
    assert not client.is_alive() and time.monotonic() - killed_at < BOUND_S
    assert out["error"] is None and out["text"] == local_greedy(PROMPT, 200)
    assert live.retries == 1
    wait_live(driver, victim)
    assert driver.workers.pid(victim) != old_pid
    metrics = httpx.get(f"{base}/metrics").text
    assert metric(metrics, "pdserve:worker_restarts_total") == 1
    # two long decodes at once: the least-loaded router gives one to each decode instance,
    # so the restarted one takes work again
    streams = [stream_in_thread(base, 120) for _ in range(2)]
    first = decoding(driver, {1, 2}, 2)
    other = decoding(driver, {1, 2} - {first.request.decode_instance}, 2)
    assert {first.request.decode_instance, other.request.decode_instance} == {1, 2}
    for client, _, out in streams:
        client.join(BOUND_S)
        assert out["error"] is None and out["text"] == local_greedy(PROMPT, 120)


def test_an_actor_that_dies_by_itself_fails_the_request_it_ran_and_restarts(server):
    """Every actor carries the fault hook: token FAULT_TOKEN in a batch makes the worker
    exit at once, as a native crash would."""
    base, driver = server
    before = driver.workers.pid(0)
    crash = complete(base, [5, 17, FAULT_TOKEN, 42])
    assert crash.status_code == 500  # the prefill worker ran it and died: not retried
    assert f"died with exit code {ACTOR_CRASH_EXIT_CODE}" in crash.json()["error"]["message"]
    wait_live(driver, 0)
    assert driver.workers.pid(0) != before
    assert complete(base, PROMPT).status_code == 200
    metrics = httpx.get(f"{base}/metrics").text
    assert metric(metrics, "pdserve:requests_failed_total", reason="worker_crash") == 1


def test_a_node_that_leaves_takes_its_instance_and_nothing_hangs(server, cluster):
    base, driver = server
    streams = [stream_in_thread(base, 200) for _ in range(2)]  # one decodes on each
    live = decoding(driver, {1})  # on node B
    left_at = time.monotonic()
    cluster[0].remove_node(cluster[1])
    for client, _, out in streams:
        client.join(BOUND_S)
        assert not client.is_alive() and time.monotonic() - left_at < BOUND_S
        assert out["error"] is None and out["text"] == local_greedy(PROMPT, 200)
    assert live.request.decode_instance == 2 and live.retries == 1  # re-run on A
    assert driver.workers.states[1] is not WorkerState.LIVE  # no node to restart on
    health = httpx.get(f"{base}/health")
    assert health.status_code == 200  # a prefill and a decode instance are still live
    client, _, out = stream_in_thread(base, 16)  # and serve
    client.join(BOUND_S)
    assert out["error"] is None and out["text"] == local_greedy(PROMPT, 16)
