"""queue-cluster: a dead node is named and the others keep serving; --restart starts it again;
^C stops every node and removes the temporary data directory."""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest

from load.procs import kill_tree
from queue_server.client import QueueClient, QueueError
from queue_server.config.loader import parse_config
from queue_server.server import devcluster
from tests.harness import wait_for


def free_run(n: int) -> int:
    """A port p such that p .. p+n-1 are all free now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free run of ports")


def test_a_dead_node_is_named_restarted_and_the_data_removed_at_the_end():
    clients, internals = free_run(3), free_run(3)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "queue_server.server.devcluster", "3", "--base-port", str(clients),
         "--internal-base-port", str(internals), "--http-base-port", str(free_run(3)), "--restart"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(l.startswith("nodes: ") for l in lines), 40, "the cluster to elect a leader")
        root = re.search(r"\(data in (\S+)\)", next(l for l in lines if l.startswith("nodes: "))).group(1)
        pids = {int(m.group(1)): int(m.group(2)) for l in lines if (m := re.match(r"node (\d): pid (\d+)", l))}
        hosts = ",".join(f"127.0.0.1:{clients + i}" for i in range(3))
        os.kill(pids[2], signal.SIGKILL)
        wait_for(lambda: any("node 2 (pid" in l and "killed by signal 9; restarting it" in l for l in lines),
                 10, "queue-cluster to name the dead node")
        with QueueClient(hosts, timeout=10) as q:  # the other two serve meanwhile (after a
            wait_for(lambda: _produced(q), 20, "the two others to take a produce")  # fail-over)
        wait_for(lambda: sum(1 for l in lines if l.startswith("node 2: pid")) == 2, 10, "node 2 restarted")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        assert not os.path.exists(root)
    finally:
        kill_tree(proc)


def _produced(q: QueueClient) -> bool:
    try:
        q.produce("devcluster", "x")
        return True
    except QueueError:  # "leader changed" while node 2, if it led, is replaced
        return False


def test_a_port_taken_by_another_program_stops_it_before_any_node_starts():
    clients, internals, https = free_run(3), free_run(3), free_run(3)
    with socket.socket() as squatter:  # another program on node 2's client port
        squatter.bind(("127.0.0.1", clients + 1))
        squatter.listen(1)
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "queue_server.server.devcluster", "3", "--base-port", str(clients),
             "--internal-base-port", str(internals), "--http-base-port", str(https)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:  # it started the nodes after all: stop them too
                os.killpg(proc.pid, signal.SIGINT)
                proc.communicate(timeout=40)
    assert proc.returncode == 1
    assert out == ""  # no node was started, no leader named
    [line] = err.splitlines()
    assert line.startswith(f"queue-cluster: node 2: config key 'port': TCP 127.0.0.1:{clients + 1} is already in use")
    assert "--base-port" in line


def test_a_data_root_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-P", "-m", "queue_server.server.devcluster", "3", "--data-root", str(blocker / "data"),
         "--base-port", str(free_run(3)), "--internal-base-port", str(free_run(3)), "--http-base-port", "0"],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"queue-cluster: --data-root: cannot write in {blocker / 'data'}: Not a directory\n"


def test_a_data_root_another_queue_cluster_runs_on_says_so_and_not_to_change_ports(tmp_path):
    from queue_server.replication.datadir import DataDir

    root = tmp_path / "reports"  # "port" in the path: the hint must come from the error's config key
    held = DataDir(str(root / "node2"))  # as node 2 of a queue-cluster still running holds it
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-m", "queue_server.server.devcluster", "3", "--data-root", str(root),
             "--base-port", str(free_run(3)), "--internal-base-port", str(free_run(3)), "--http-base-port", "0"],
            capture_output=True, text=True, timeout=30)
    finally:
        held.close()
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"queue-cluster: node 2: queue data dir {root / 'node2'} is in use by another node "
                           f"(pid {os.getpid()}): stop the queue-cluster that uses this --data-root, or give another\n")


def test_queue_groups_go_into_every_node_s_config(tmp_path):
    args = argparse.Namespace(nodes=3, replication="quorum", queue_groups=3)  # queue-cluster 3 --queue-groups 3
    paths = devcluster.write_files(args, str(tmp_path), [1111, 1112, 1113], [1101, 1102, 1103], None)
    for path in paths.values():
        with open(path) as f:
            cfg, _ = parse_config(f.read())
        assert cfg.queue_groups == 3 and cfg.placement().groups_of(cfg.node_id) == (0, 1, 2)



def test_group_replicas_go_into_every_node_s_config_and_six_nodes_are_accepted_with_them(tmp_path, capsys):
    args = argparse.Namespace(nodes=6, replication="quorum", queue_groups=6, group_replicas=3)
    paths = devcluster.write_files(args, str(tmp_path), list(range(1111, 1117)), list(range(1101, 1107)), None)
    for path in paths.values():
        with open(path) as f:
            cfg, _ = parse_config(f.read())
        assert cfg.group_replicas == 3 and len(cfg.placement().groups_of(cfg.node_id)) == 3
    for argv, said in [(["6"], "must be odd (or give --group-replicas"),
                       (["5", "--group-replicas", "2"], "--group-replicas must be odd"),
                       (["5", "--group-replicas", "3"], "leave a node with no group")]:
        with pytest.raises(SystemExit):
            devcluster.main(argv)
        assert said in capsys.readouterr().err, argv
