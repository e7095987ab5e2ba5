"""The Docker image's start logic without Docker (our machines have no Docker engine): the
Dockerfile's ENTRYPOINT + CMD run as a subprocess serve clients on 0.0.0.0 with no hostname
assumptions, and its HEALTHCHECK command passes once the node is ready. The compose configs
carry the metrics port the healthcheck asks."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from queue_server.client import QueueClient
from queue_server.config.loader import load_config
from tests.harness import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def instruction(name: str) -> str:
    """The argument of a Dockerfile instruction (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.*)$", text, re.M)
    assert found, f"no {name} in the Dockerfile"
    return found[-1]


def exec_form(name: str) -> list[str]:
    return json.loads(instruction(name))


def test_default_command_serves_on_all_interfaces_and_passes_its_healthcheck(tmp_path):
    entrypoint, cmd = exec_form("ENTRYPOINT"), exec_form("CMD")
    assert entrypoint == ["queue-server"]
    assert "--config" not in cmd  # no hostname or file assumptions
    # The image's own command; only what cannot be shared on a test machine is overridden
    # (argparse: the last occurrence wins): ports chosen at run time, the data dir.
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    argv = [sys.executable, "-P", "-m", "queue_server.server.main", *cmd,
            "--port", str(port), "--metrics-port", str(metrics_port), "--http-port", str(http_port),
            "--data-dir", str(tmp_path / "data")]
    log = open(tmp_path / "node.log", "w+")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(lambda: "listening on tcp+udp 0.0.0.0:" in (tmp_path / "node.log").read_text(), 20,
                 "the node to listen on 0.0.0.0")
        with QueueClient(f"127.0.0.1:{port}") as q:
            msg_id = q.produce("docker", "hello", retry=30)
            assert q.consume("docker").msg_id == msg_id
        health = json.loads(instruction("HEALTHCHECK").split(" CMD ", 1)[1])
        health = [sys.executable if a == "python" else a.replace(":9111/", f":{metrics_port}/") for a in health]
        wait_for(lambda: subprocess.run(health, capture_output=True, timeout=10).returncode == 0, 20,
                 "the image's healthcheck to pass")
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        log.close()


def test_healthcheck_and_exposed_ports_match_the_configs():
    health = instruction("HEALTHCHECK")
    assert "/readyz" in health and ":9111/" in health
    exposed = set(instruction("EXPOSE").split())
    assert {"1111/tcp", "1111/udp", "9111/tcp", "8080/tcp"} <= exposed
    assert "USER" in (ROOT / "Dockerfile").read_text() and instruction("USER") != "root"
    for i in (1, 2, 3):
        config, _ = load_config(str(ROOT / f"config/compose/node{i}.json"), {})
        assert config.metrics_port == 9111 and f"{config.http_port}/tcp" in exposed
        assert config.cluster_secret_file == "/run/secrets/cluster_secret"  # peers on a network: CURVE
        assert f"{config.cluster_node_list[0].port}/tcp" in exposed
    compose = (ROOT / "docker-compose.yml").read_text()
    published = re.findall(r'ports: \[(.*)\]', compose)
    ports = [p for line in published for p in shlex.split(line.replace(",", " "))]
    assert len(ports) == 9 and all(p.startswith("127.0.0.1:") for p in ports), ports
    assert "secrets: [cluster_secret]" in compose and "file: ./cluster.secret" in compose
    assert "queue-server keygen --out cluster.secret" in compose


def test_the_image_copies_every_package_directory():
    """`pip install .` in the image needs every directory pyproject.toml maps a package to."""
    dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    copied = set()
    for line in re.findall(r"^COPY\s+(.*)$", (ROOT / "Dockerfile").read_text(), re.M):
        *sources, _ = line.split()
        copied.update(sources)
    assert dirs - copied == set()
