"""A Ray-hosted worker ends itself when its raylet dies (issue 30): `HostWatch` in a
process whose stand-in raylet (its parent, RAY_RAYLET_PID) is killed leaves at once and
removes its KV pool's shared-memory name. No Ray needed: the watch reads only the process
tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing import shared_memory

import psutil

from pdserve.live.ray_host_watch import RAYLET_PID_ENV, HostWatch

BOUND_S = 10.0

WORKER = """
import os, sys, time
from multiprocessing import shared_memory
from pdserve.live.ray_host_watch import HostWatch
pool = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=4096)
watch = HostWatch.from_env()
watch.interval_s = 0.1
watch.pool_name = sys.argv[1]
watch.start()
print(os.getpid(), flush=True)
time.sleep(120)  # a worker busy in its loop
"""


def test_a_worker_whose_raylet_dies_ends_itself_and_removes_its_pool(tmp_path):
    pool = f"pdserve-watch-test-{os.getpid()}"
    # the stand-in raylet: a shell that starts the worker as its child and waits
    raylet = subprocess.Popen(
        ["bash", "-c", f'{RAYLET_PID_ENV}=$$ "{sys.executable}" -c "$0" {pool}; true', WORKER],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "worker.err", "w"),  # noqa: SIM115
        text=True, env={**os.environ})
    try:
        worker = psutil.Process(int(raylet.stdout.readline()))
        assert worker.ppid() == raylet.pid and worker.is_running()
        assert os.path.exists(f"/dev/shm/{pool}")
        killed = time.monotonic()
        raylet.send_signal(signal.SIGKILL)  # as a crashed raylet: no word to its children
        worker.wait(BOUND_S)  # raises if it is still running then
        assert time.monotonic() - killed < BOUND_S
        assert f"pid {worker.pid}): ending: its raylet (pid {raylet.pid}) is gone" in (
            tmp_path / "worker.err").read_text()
        assert not os.path.exists(f"/dev/shm/{pool}")
    finally:
        raylet.kill()
        raylet.wait(BOUND_S)
        if os.path.exists(f"/dev/shm/{pool}"):
            shared_memory.SharedMemory(name=pool).unlink()


def test_a_watch_on_a_raylet_that_is_not_its_parent_sees_it_die_even_unreaped():
    stand_in = subprocess.Popen(["sleep", "60"])
    watch = HostWatch(stand_in.pid)
    assert watch.raylet_alive()
    stand_in.kill()
    deadline = time.monotonic() + BOUND_S
    while psutil.Process(stand_in.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not watch.raylet_alive()  # a zombie (not reaped yet) is dead
    stand_in.wait(BOUND_S)
    assert not watch.raylet_alive()
