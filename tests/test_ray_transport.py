"""The parts of Ray hosting that need no Ray: the driver's channel to an actor (handshake,
hello, a death before connecting), how an actor's end maps to an exit code, the KV stream
between nodes, the settings and the `--ray` option."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
import torch

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.transfer import copy_aligned
from pdserve.live.ray_channel import (
    ACTOR_CRASH_EXIT_CODE,
    ActorChannel,
    ActorHello,
    exit_code_of,
)
from pdserve.live.ray_cluster import LOOPBACK, RaySettings
from pdserve.live.ray_kv import KVServer, tcp_pool
from pdserve.server.serve_cli import add_serve_parser, serve_config

KEY = b"k" * 32


def actor_side(address, authkey: bytes, messages: list[object]) -> None:
    connection = Client(address, authkey=authkey)
    connection.send(ActorHello(4242, "node-x", LOOPBACK))
    for message in messages:
        connection.send(message)
    connection.recv()  # until the driver answers
    connection.close()


def test_the_channel_accepts_the_actor_reads_its_hello_then_its_messages():
    channel = ActorChannel(LOOPBACK, KEY)
    assert channel.hello is None
    actor = threading.Thread(target=actor_side, args=(channel.address, KEY, ["ready", 7]))
    actor.start()
    assert channel.poll(10)
    assert channel.hello == ActorHello(4242, "node-x", LOOPBACK)
    assert channel.recv() == "ready" and channel.recv() == 7
    channel.send("bye")
    actor.join(10)
    with pytest.raises(EOFError):  # the actor went away
        channel.recv()
    channel.close()


def test_a_wrong_key_is_refused_and_a_death_before_connecting_is_an_eof():
    channel = ActorChannel(LOOPBACK, KEY)
    intruder = threading.Thread(target=lambda: pytest.raises(
        AuthenticationError, Client, channel.address, authkey=b"x" * 32))
    intruder.start()
    with pytest.raises(EOFError, match="connection failed"):
        channel.recv()
    intruder.join(10)
    channel.close()
    channel = ActorChannel(LOOPBACK, KEY)
    assert not channel.poll(0.05)
    channel.wake("the worker's actor ended before it was ready: ImportError")
    with pytest.raises(EOFError, match="ImportError"):
        channel.poll(5)
    channel.close()


def test_an_actors_end_maps_to_the_exit_code_a_local_worker_would_have():
    assert exit_code_of(None, False) == 0
    assert exit_code_of(RuntimeError("x"), True) == -signal.SIGKILL  # we killed it
    assert exit_code_of(RuntimeError("The actor is dead because it was killed by "
                                     "`ray.kill`."), False) == -signal.SIGKILL
    assert exit_code_of(RuntimeError("The actor died because its node has died."),
                        False) == -signal.SIGKILL
    assert exit_code_of(RuntimeError("Worker exit type: SYSTEM_ERROR"),
                        False) == ACTOR_CRASH_EXIT_CODE  # died by itself: a crash


def test_the_kv_stream_reads_aligned_runs_of_a_remote_pool_exactly():
    source = PagedKVPool(64, 2, 2, 8)
    target = PagedKVPool(64, 2, 2, 8)
    torch.manual_seed(0)
    source.data.normal_()
    server = KVServer(source, LOOPBACK, KEY)
    remote = tcp_pool(server.address, target, KEY)
    source_blocks = [3, 4, 5, 6, 20, 21, 40]
    target_blocks = [10, 11, 12, 13, 14, 30, 31]
    copies = copy_aligned(remote, target, source_blocks, target_blocks)  # type: ignore[arg-type]
    assert copies == 4  # [3-6]->[10-13], [20]->[14], [21]->[30], [40]->[31]
    assert torch.equal(target.data[target_blocks], source.data[source_blocks])
    deadline = time.monotonic() + 5  # the server counts a run after its last byte left
    while server.runs_served < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.runs_served == 4 and server.bytes_served == 7 * source.block_bytes
    assert remote.runs_read == 4
    remote.close()
    server.close()


def test_a_kv_request_outside_the_pool_or_without_the_key_fails_the_reader_only():
    source = PagedKVPool(8, 1, 1, 4)
    server = KVServer(source, LOOPBACK, KEY)
    remote = tcp_pool(server.address, source, KEY)
    with pytest.raises(ConnectionError):
        remote.run(6, 4)
    remote.close()
    assert torch.equal(tcp_pool(server.address, source, KEY).run(0, 2), source.data[:2])
    with pytest.raises(AuthenticationError):  # no key, no KV
        tcp_pool(server.address, source, b"y" * 32)
    server.close()


def test_ray_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="kv_transport"):
        RaySettings(kv_transport="carrier-pigeon")
    with pytest.raises(ValueError, match="cpus_per_worker"):
        RaySettings(cpus_per_worker=0)
    with pytest.raises(ValueError, match="instance_resources"):
        RaySettings(instance_resources=("a",)).resources_of(1)
    assert RaySettings(instance_resources=("a", "b")).resources_of(1) == {"b": 0.001}


def test_the_ray_option_takes_an_optional_address():
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    assert serve_config(parser.parse_args(["serve"])).server.ray is None
    local = serve_config(parser.parse_args(["serve", "--ray"])).server.ray
    assert local is not None and local.address == ""
    ray = serve_config(parser.parse_args(["serve", "--ray", "10.0.0.5:6379",
                                          "--ray-kv-transport", "object-store"])).server.ray
    assert ray is not None
    assert ray.address == "10.0.0.5:6379" and ray.kv_transport == "object-store"
