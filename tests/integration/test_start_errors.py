"""A node that cannot start says why in one line (exit status 1, no traceback), naming the
config key: a busy port, a host name that does not resolve or is not this machine's, a data
directory that cannot be made or that another node holds, a config file that cannot be read. A peer's name that does not resolve yet only warns.

The nodes here turn HTTP off (http_port 0) unless its port is what the test is about: another
program on the default http_port (8111) must not change which error a test sees."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from queue_server.config.loader import parse_config
from queue_server.replication.datadir import DataDir
from queue_server.server import preflight
from tests.harness import free_port


def start(*args: str, cwd=None) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-P", "-m", "queue_server.server.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stdout + proc.stderr


def assert_one_line(output: str, line: str) -> None:
    assert "Traceback" not in output
    assert output.strip().splitlines() == [line]


@pytest.mark.parametrize("key,kind", [("port", socket.SOCK_STREAM), ("port", socket.SOCK_DGRAM),
                                      ("http_port", socket.SOCK_STREAM)], ids=["tcp", "udp", "http"])
def test_busy_port(key, kind):
    port = free_port()
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", port))
        if kind == socket.SOCK_STREAM:
            s.listen()
        ports = {"port": port, "http_port": 0} if key == "port" else {"port": free_port(), "http_port": port}
        code, out = start("--port", str(ports["port"]), "--http-port", str(ports["http_port"]), "--in-memory")
    proto = "TCP" if kind == socket.SOCK_STREAM else "UDP"
    assert code == 1
    assert_one_line(out, f"queue-server: config key '{key}': {proto} 127.0.0.1:{port} is already in use "
                         f"(another queue-server, or another program?)")


def test_host_that_does_not_resolve(tmp_path):
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps({"host": "nosuchhost.invalid", "port": free_port(), "in_memory": True}))
    code, out = start("--config", str(cfg))
    assert code == 1
    assert out.startswith("queue-server: config key 'host': cannot resolve host 'nosuchhost.invalid' (")
    assert_one_line(out, out.strip())


def test_own_cluster_address_that_does_not_resolve(tmp_path):
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps({"node_id": 2, "port": free_port(), "in_memory": True, "cluster_node_list": [
        {"node_id": 1, "host": "127.0.0.1", "port": free_port()},
        {"node_id": 2, "host": "node2.invalid", "port": free_port()},
        {"node_id": 3, "host": "127.0.0.1", "port": free_port()}]}))
    code, out = start("--config", str(cfg))
    assert code == 1
    assert out.startswith("queue-server: config key 'cluster_node_list[1].host': cannot resolve host "
                          "'node2.invalid' (")
    assert "Traceback" not in out


def test_data_dir_that_cannot_be_made(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out = start("--port", str(free_port()), "--http-port", "0", "--data-dir", str(blocker / "data"))
    assert code == 1
    assert_one_line(out, f"queue-server: config key 'queue_data_dir': cannot create '{blocker / 'data'}': "
                         f"Not a directory")


def test_data_dir_held_by_a_running_node(tmp_path):
    with DataDir(str(tmp_path)):  # as a node's coordinator holds it
        code, out = start("--port", str(free_port()), "--http-port", "0", "--data-dir", str(tmp_path))
    assert code == 1
    assert_one_line(out, f"queue-server: config key 'queue_data_dir': queue data dir {tmp_path} is in use by "
                         f"another node (pid {os.getpid()}); give each node its own (--data-dir)")


def test_host_that_is_not_an_address_of_this_machine():
    code, out = start("--host", "192.0.2.1", "--port", str(free_port()), "--http-port", "0", "--in-memory")  # TEST-NET-1
    assert code == 1
    assert_one_line(out, "queue-server: config key 'host': 192.0.2.1 is not an address of this machine")


@pytest.mark.parametrize("mode", ["999", "rw", "1777"])
def test_keygen_with_a_bad_mode_says_what_it_takes(tmp_path, mode):
    code, out = start("keygen", "--out", str(tmp_path / "secret"), "--mode", mode)
    assert code == 2  # argparse's: a bad command line
    assert out.strip().splitlines()[-1] == (f"queue-server keygen: error: argument --mode: expected permissions "
                                            f"in octal such as 600 or 644, got '{mode}'")
    assert not (tmp_path / "secret").exists()


@pytest.mark.parametrize("nodes", [0, 1], ids=["single node", "a list of one node"])
def test_a_cluster_secret_file_that_is_no_secret_on_a_single_node(tmp_path, nodes):
    secret = tmp_path / "cluster.secret"
    secret.write_text("short\n")
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps({"port": free_port(), "http_port": 0, "in_memory": True, "cluster_secret_file": str(secret),
                               "cluster_node_list": [{"node_id": 1, "host": "127.0.0.1", "port": free_port()}][:nodes]}))
    code, out = start("--config", str(cfg))
    assert code == 1
    assert_one_line(out, f"queue-server: config key 'cluster_secret_file': {secret} holds a line that is no secret "
                         f"of at least 16 characters (make one with: queue-server keygen --out {secret})")


def test_config_file_missing(tmp_path):
    missing = tmp_path / "nope.json"
    code, out = start("--config", str(missing))
    assert code == 1
    assert_one_line(out, f"queue-server: config: cannot read config file {missing}: No such file or directory")


def test_config_file_that_is_not_json(tmp_path):
    cfg = tmp_path / "node.json"
    cfg.write_text('{"port": 1111,\n}')
    code, out = start("--config", str(cfg))
    assert code == 1
    assert_one_line(out, f"queue-server: config: {cfg}: invalid JSON: Expecting property name enclosed in "
                         f"double quotes at line 2 column 1")


def test_config_path_is_a_directory(tmp_path):
    code, out = start("--config", str(tmp_path))
    assert code == 1
    assert_one_line(out, f"queue-server: config: cannot read config file {tmp_path}: Is a directory")


def test_a_peer_name_that_does_not_resolve_yet_only_warns():
    config, _ = parse_config(json.dumps({"node_id": 1, "port": free_port(), "http_port": 0, "in_memory": True,
                                         "cluster_node_list": [
                                             {"node_id": 1, "host": "127.0.0.1", "port": free_port()},
                                             {"node_id": 2, "host": "node2.invalid", "port": free_port()},
                                             {"node_id": 3, "host": "127.0.0.1", "port": free_port()}]}))
    [warning] = preflight.check(config)
    assert "cluster_node_list[1].host" in warning and "node 2 is unreachable until it does" in warning


def test_a_port_that_cannot_be_bound_is_a_port_to_change_and_a_foreign_host_is_not():
    port = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        config, _ = parse_config(json.dumps({"port": port, "in_memory": True}))
        with pytest.raises(preflight.PortUnavailable, match="config key 'port'"):
            preflight.check(config)
    config, _ = parse_config(json.dumps({"host": "192.0.2.1", "port": free_port(), "in_memory": True}))
    with pytest.raises(preflight.StartError, match="config key 'host'") as err:
        preflight.check(config)
    assert not isinstance(err.value, preflight.PortUnavailable)  # queue-cluster must not say "change ports"


def test_data_written_with_another_placement_of_queue_groups(tmp_path):
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "00000000000000000001.wal").write_bytes(b"x")
    (tmp_path / "groups.json").write_text(json.dumps({"queue_groups": 3, "group_replicas": 0, "queue_group_list": [],
                                                      "replicas": [[1], [1], [1]]}))
    code, out = start("--port", str(free_port()), "--http-port", "0", "--data-dir", str(tmp_path))
    assert code == 1
    assert_one_line(out, f"queue-server: config key 'queue_groups': the data in {tmp_path} was written with "
                         f"queue_groups 3, this config gives 1: queues would move between groups; set it back, or "
                         f"start on an empty queue_data_dir (there is no migration of a data dir between "
                         f"placements yet: docs/plans/queue-groups.md 2.4)")
