"""The docker-compose topology run for real: three nodes in Linux network namespaces, one address
each, the service names in /etc/netns/NAME/hosts, started with the very configs docker-compose.yml
uses (config/compose/nodeN.json). Needs root and iproute2; skipped otherwise."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from queue_server.client import QueueClient
from queue_server.config.loader import strip_comments
from queue_server.server import peer_keys
from tests.harness import REPO, alive, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (ip netns)"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespaces(tmp_path):
    tag = f"{os.getpid() % 10000}"
    subnet = f"10.{77 + os.getpid() % 50}.{os.getpid() % 250}"
    bridge = f"qsbr{tag}"
    names = [f"qs{tag}n{i}" for i in (1, 2, 3)]
    made: list[str] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{subnet}.1{i} node{i}\n" for i in (1, 2, 3))
        for i, ns in enumerate(names, start=1):
            _ip("netns", "add", ns)
            made.append(ns)
            veth = f"qv{tag}n{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", ns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.1{i}/24", "dev", f"{veth}p")
            _ip("netns", "exec", ns, "ip", "link", "set", f"{veth}p", "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts)
        yield subnet, names
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def compose_config(i: int, tmp_path) -> str:
    """config/compose/nodeI.json with the cluster secret where this test keeps it (compose mounts
    it at /run/secrets/cluster_secret)."""
    data = json.loads(strip_comments(open(os.path.join(REPO, f"config/compose/node{i}.json")).read()))
    secret = tmp_path / "cluster.secret"
    if not secret.exists():
        peer_keys.write_secret(str(secret))
    data["cluster_secret_file"] = str(secret)
    path = tmp_path / f"node{i}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_compose_topology_in_network_namespaces(namespaces, tmp_path):
    subnet, names = namespaces
    procs = {}
    for i, ns in enumerate(names, start=1):
        log = open(tmp_path / f"node{i}.log", "wb")
        procs[i] = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "queue_server.server.main",
             "--config", compose_config(i, tmp_path), "--data-dir", str(tmp_path / f"data{i}")],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )
    addrs = {i: f"{subnet}.1{i}:111{i}" for i in (1, 2, 3)}
    try:
        def agreed(nodes: list[int], not_: int | None = None) -> int | None:
            """The leader every node in `nodes` names, if they agree on one (other than not_)."""
            views = set()
            for i in nodes:
                try:
                    with QueueClient(addrs[i], timeout=1.0) as q:
                        views.add(q.leader()["leader_node_id"])
                except Exception:
                    return None
            found = views.pop() if len(views) == 1 else None
            return found if found and found != not_ else None
        first = wait_for(lambda: agreed([1, 2, 3]), 30, "a leader in the namespaced cluster")
        follower = next(i for i in (1, 2, 3) if i != first)
        with QueueClient(addrs[follower]) as q:
            q.produce_batch("compose", ["a", "b"], retry=30)
        other = next(i for i in (1, 2, 3) if i not in (first, follower))
        with QueueClient(addrs[other]) as q:
            assert q.consume("compose").data == "a"
        procs[first].send_signal(signal.SIGKILL)
        procs[first].wait(10)
        survivors = [addrs[i] for i in (1, 2, 3) if i != first]

        rest = [i for i in (1, 2, 3) if i != first]
        wait_for(lambda: agreed(rest, not_=first), 30, "a new leader after the kill")
        with QueueClient(",".join(survivors)) as q:
            assert q.consume("compose").data == "b"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        wait_for(lambda: not any(alive(p.pid) for p in procs.values()), 10, "the nodes to exit")
