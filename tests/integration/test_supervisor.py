"""The supervisor: clean stop on signals, the whole node exits when a child dies, no orphans."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests.harness import NodeProcess, RawTcp, alive, wait_for


def _children_by_role(node: NodeProcess) -> dict[str, int]:
    roles = {}
    for pid in node.child_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        module = argv[argv.index(b"-m") + 1].decode()
        index = argv[argv.index(b"--index") + 1].decode() if b"--index" in argv else ""
        roles[module + index] = pid
    return roles


def test_sigterm_stops_every_process_and_removes_the_run_dir(tmp_path):
    node = NodeProcess(str(tmp_path), {"workers": 3}).start()
    roles = wait_for(lambda: len(_children_by_role(node)) == 5 and _children_by_role(node), 10, "5 children")
    assert set(roles) == {"queue_server.server.coordinator", "queue_server.server.worker0", "queue_server.server.worker1", "queue_server.server.worker2", "queue_server.server.acceptor"}
    run_dir = re.search(r"run dir (\S+)\)", node.log()).group(1)
    assert os.path.isdir(run_dir)
    node.signal(signal.SIGTERM)
    assert node.proc.wait(15) == 0
    assert not any(alive(pid) for pid in roles.values())
    assert not os.path.exists(run_dir)
    node.stop()


def test_a_dead_worker_stops_the_whole_node_non_zero(tmp_path):
    node = NodeProcess(str(tmp_path)).start()
    try:
        roles = wait_for(lambda: len(_children_by_role(node)) == 4 and _children_by_role(node), 10, "4 children")
        os.kill(roles["queue_server.server.worker1"], signal.SIGKILL)
        assert node.proc.wait(15) != 0
        assert "child worker-1" in node.log() and "exited unexpectedly" in node.log()
        assert not any(alive(pid) for pid in roles.values())
    finally:
        node.stop()


def test_a_killed_supervisor_leaves_no_orphans(tmp_path):
    node = NodeProcess(str(tmp_path)).start()
    try:
        roles = wait_for(lambda: len(_children_by_role(node)) == 4 and _children_by_role(node), 10, "4 children")
        conn = RawTcp(*node.address)
        assert conn.call({"action": 1, "queue": "q", "data": "x"})["code"] == 0
        conn.close()
        node.signal(signal.SIGKILL)
        node.proc.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in roles.values()), 30, "children to exit")
    finally:
        node.stop()


def test_invalid_config_stops_the_start_naming_the_key(tmp_path):
    node = NodeProcess(str(tmp_path), {"port": "eleven"})
    node.start(wait=False)
    assert node.proc.wait(15) == 1
    assert "port" in node.log()
    node.stop()


HOSTILE = ("server.py", "workers.py", "config.py", "client.py", "replication.py", "election.py")


def _hostile(directory, names) -> None:
    for name in names:
        (directory / name).write_text(f"raise SystemExit('hostile {name} was imported')\n")


def test_a_node_ignores_modules_lying_in_its_working_directory(tmp_path):
    """Modules named like the project's folders, in the directory where a node starts, are not
    imported by it nor by its children (started with -P: the working directory stays off
    sys.path, so even a queue_server.py there is not), and the documented import works there."""
    _hostile(tmp_path, HOSTILE)
    out = subprocess.run([sys.executable, "-c", "from queue_server import QueueClient; print(QueueClient.__name__)"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "QueueClient", out.stderr
    _hostile(tmp_path, ["queue_server.py"])
    node = NodeProcess(str(tmp_path), cwd=str(tmp_path), command=["queue-server"]).start()
    try:
        conn = RawTcp(*node.address)
        try:
            assert conn.call({"action": 1, "queue": "q", "data": "safe"})["code"] == 0
            assert conn.call({"action": 2, "queue": "q"})["data"] == "safe"
        finally:
            conn.close()
        assert "hostile" not in node.log()
    finally:
        node.stop()
