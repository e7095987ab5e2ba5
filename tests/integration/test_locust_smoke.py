"""A short headless locust run (load/locustfile.py, TCP and UDP users) against a real node, alone
and distributed (a master and one worker). Fails on any failed request or task error."""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from tests.harness import REPO, NodeProcess, free_port

LOCUSTFILE = os.path.join(REPO, "load", "locustfile.py")
RUN_TIME = "4s"
# Every action the mix fires, per transport (consume_wait is TCP only).
EXPECTED = {
    ("TCP", name) for name in ("produce", "consume", "confirm", "produce_batch", "consume_batch", "consume_wait", "monitor")
} | {("UDP", name) for name in ("produce", "consume", "confirm", "produce_batch", "consume_batch", "monitor")}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    node = NodeProcess(str(tmp_path_factory.mktemp("locust")), {"workers": 2}).start()
    yield node
    node.stop()


def _locust(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--loglevel", "WARNING", *args]


def _check(prefix: str, proc: subprocess.CompletedProcess) -> None:
    """Fail on a non-zero exit, a failed request, a task exception, or an action never fired."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"locust exited {proc.returncode}:\n{output[-4000:]}"
    with open(prefix + "_stats.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] != "Aggregated"]
    fired = {(r["Type"], r["Name"]) for r in rows if int(r["Request Count"]) > 0}
    assert EXPECTED <= fired, f"never fired: {sorted(EXPECTED - fired)}"
    failures = {(r["Type"], r["Name"]): int(r["Failure Count"]) for r in rows if int(r["Failure Count"])}
    assert not failures, failures
    with open(prefix + "_exceptions.csv", newline="") as f:
        exceptions = list(csv.DictReader(f))
    assert not exceptions, exceptions


def test_headless_tcp_and_udp_users(target, tmp_path):
    prefix = str(tmp_path / "smoke")
    proc = subprocess.run(
        _locust("--headless", "-u", "10", "-r", "10", "-t", RUN_TIME, "--host", target.hosts,
                "--csv", prefix, "--exit-code-on-error", "1", "--queues", "smoke-a,smoke-b,smoke-c",
                "--long-poll-wait", "0.2", "TcpQueueUser", "UdpQueueUser"),
        cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
    )
    _check(prefix, proc)


def test_distributed_master_and_worker(target, tmp_path):
    prefix = str(tmp_path / "dist")
    port = free_port()
    worker = subprocess.Popen(
        _locust("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
        cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        proc = subprocess.run(
            _locust("--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                    "--expect-workers", "1", "--expect-workers-max-wait", "30", "--headless",
                    "-u", "6", "-r", "6", "-t", RUN_TIME, "--host", target.hosts, "--csv", prefix,
                    "--exit-code-on-error", "1", "--queues", "dist-a,dist-b", "--payload-size", "300",
                    "--long-poll-wait", "0.2"),
            cwd=str(tmp_path), capture_output=True, text=True, timeout=90,
        )
        _check(prefix, proc)
        assert worker.wait(30) == 0  # the master told it to quit
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
