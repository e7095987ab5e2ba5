"""`queue-cluster N`: a development launcher that starts an N-node cluster on loopback with one
command and prints the leader. When a node dies it says which and how, and the others keep
running (kill one to watch a fail-over); --restart starts a dead node again. The nodes share a
new cluster secret (cluster.secret in the data directory), so their peer links use CURVE. ^C stops every
node and removes the temporary data directory (--keep keeps it).

    queue-cluster 3                       # client ports 1111, 1112, 1113; status pages on 8111, 8112, 8113
    queue-cluster 3 --base-port 2111 --replication async --restart
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from queue_server.config.loader import ConfigError, load_config
from queue_server.replication import datadir
from queue_server.server import preflight, secret_file
from queue_server.version import add_version_option

RESTART_AFTER = 1.0  # seconds between a node's death and its restart (--restart)


def cluster_configs(n: int, data_root: str, client_ports: list[int], internal_ports: list[int],
                    peer_ports: dict[tuple[int, int], int] | None = None,
                    http_ports: list[int] | None = None, **extra) -> list[dict]:
    """One config per node of an n-node loopback cluster. peer_ports[(i, j)], when given, is the
    port node i uses to reach node j's internal port (a proxy a test controls); http_ports, when
    given, each node's http_port (the HTTP API and status page), else HTTP is off: the nodes share
    one machine, so the default port would be every node's. cluster_node_list names no http_port:
    the peers tell each other theirs."""
    configs = []
    for i in range(1, n + 1):
        nodes = []
        for j in range(1, n + 1):
            port = internal_ports[j - 1]
            if peer_ports and i != j:
                port = peer_ports[(i, j)]
            nodes.append({"node_id": j, "host": "127.0.0.1", "port": port})
        cfg = {
            "node_id": i,
            "host": "127.0.0.1",
            "port": client_ports[i - 1],
            "http_port": http_ports[i - 1] if http_ports else 0,
            "cluster_node_list": nodes,
            "queue_data_dir": os.path.join(data_root, f"node{i}"),
        }
        cfg.update(extra)
        configs.append(cfg)
    return configs


def ask_leader(port: int, timeout: float = 1.0) -> dict | None:
    """Action 8 on one node, or None if it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b'{"action":8}\n')
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    return None
                buf += chunk
        return json.loads(buf)
    except OSError:
        return None


def write_files(args: argparse.Namespace, root: str, clients: list[int], internals: list[int],
                https: list[int] | None) -> dict[int, str]:
    """The cluster secret (if root has none yet) and each node's config in root; node id -> path."""
    os.makedirs(root, exist_ok=True)
    secret = os.path.join(root, "cluster.secret")
    if not os.path.exists(secret):  # the nodes' peer links are authenticated and encrypted (CURVE)
        secret_file.write_secret(secret)
    paths: dict[int, str] = {}
    groups = {"queue_groups": args.queue_groups} if args.queue_groups > 1 else {}
    if getattr(args, "group_replicas", 0):
        groups["group_replicas"] = args.group_replicas
    for cfg in cluster_configs(args.nodes, root, clients, internals, http_ports=https, replication=args.replication,
                               cluster_secret_file=secret, **groups):
        paths[cfg["node_id"]] = path = os.path.join(root, f"node{cfg['node_id']}.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
    return paths


def startable(paths: dict[int, str]) -> str | None:
    """Why one of the nodes cannot start (its port is taken, ...) as one line saying which
    queue-cluster option to change, or None: checked before any starts, so that another program
    on a port is never taken for one of the nodes. Data dirs first: a queue-cluster still running
    on the same --data-root holds its ports too, and it, not a port, is what to change."""
    configs = {}
    for node_id, path in paths.items():
        try:
            configs[node_id] = config = load_config(path, {})[0]
            if not config.in_memory:
                datadir.check_free(config.queue_data_dir)
        except datadir.DataDirLocked as exc:
            return f"node {node_id}: {exc}: stop the queue-cluster that uses this --data-root, or give another"
        except (ConfigError, OSError) as exc:
            return f"node {node_id}: {exc}"
    for node_id, config in configs.items():
        try:
            preflight.check(config)
        except preflight.PortUnavailable as exc:  # queue-cluster chose it from its --*-base-port options
            return (f"node {node_id}: {exc}; choose free ports with --base-port, --internal-base-port and "
                    f"--http-base-port")
        except (preflight.StartError, OSError) as exc:
            return f"node {node_id}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue-cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_option(parser)
    parser.add_argument("nodes", type=int, nargs="?", default=3)
    parser.add_argument("--base-port", type=int, default=1111, help="client port of node 1 (others follow)")
    parser.add_argument("--internal-base-port", type=int, default=1101)
    parser.add_argument("--http-base-port", type=int, default=8111,
                        help="http_port of node 1, the HTTP API and status page (others follow); 0 = off")
    parser.add_argument("--replication", choices=["quorum", "async"], default="quorum")
    parser.add_argument("--queue-groups", type=int, default=1, metavar="N",
                        help="queue groups, each with its own leader (config queue_groups); default 1")
    parser.add_argument("--group-replicas", type=int, default=0, metavar="R",
                        help="nodes that replicate each queue group, odd (config group_replicas); default every node")
    parser.add_argument("--data-root", help="where the nodes' data dirs go (default: a temporary dir)")
    parser.add_argument("--restart", action="store_true", help="start a node again when it dies")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir on exit")
    args = parser.parse_args(argv)
    if args.nodes < 1 or (args.nodes % 2 == 0 and not args.group_replicas):
        parser.error("the number of nodes must be odd (or give --group-replicas, odd)")
    if args.queue_groups < 1:
        parser.error("--queue-groups must be at least 1")
    if args.group_replicas and (args.group_replicas % 2 == 0 or not 0 < args.group_replicas <= args.nodes):
        parser.error(f"--group-replicas must be odd and at most the {args.nodes} nodes")
    if args.group_replicas and args.queue_groups * args.group_replicas < args.nodes:
        parser.error(f"--queue-groups {args.queue_groups} of --group-replicas {args.group_replicas} leave a node with "
                     "no group: raise either")
    root = args.data_root or tempfile.mkdtemp(prefix="queue-cluster-")
    clients = [args.base_port + i for i in range(args.nodes)]
    internals = [args.internal_base_port + i for i in range(args.nodes)]
    https = [args.http_base_port + i for i in range(args.nodes)] if args.http_base_port else None
    try:
        paths = write_files(args, root, clients, internals, https)
        problem = startable(paths)
    except OSError as exc:
        problem = f"--data-root: cannot write in {root}: {exc.strerror or exc}"
    if problem:
        print(f"queue-cluster: {problem}", file=sys.stderr)
        if args.data_root is None:
            shutil.rmtree(root, ignore_errors=True)
        return 1
    procs: dict[int, subprocess.Popen] = {}

    def launch(node_id: int) -> None:
        procs[node_id] = subprocess.Popen(
            [sys.executable, "-P", "-m", "queue_server.server.main", "--config", paths[node_id]])
        web = f", status page http://127.0.0.1:{https[node_id - 1]}/" if https else ""
        print(f"node {node_id}: pid {procs[node_id].pid}, client port {clients[node_id - 1]}{web}", flush=True)

    for node_id in paths:
        launch(node_id)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        deadline = time.monotonic() + 30
        leader = None
        while not stop and time.monotonic() < deadline and leader is None:
            for port in clients:
                reply = ask_leader(port)
                if reply and reply.get("code") == 0:
                    leader = reply
                    break
            else:
                time.sleep(0.1)
        if leader is None and not stop:
            print("queue-cluster: no leader within 30 s", file=sys.stderr)
            return 1
        if leader is not None:
            print(f"leader: node {leader['leader_node_id']} at {leader['leader_host']}:{leader['leader_port']}", flush=True)
            print(f"nodes: {', '.join(f'127.0.0.1:{p}' for p in clients)} (data in {root}); ^C stops them", flush=True)
        dead: dict[int, float] = {}  # node id -> when it was found dead
        while not stop:
            now = time.monotonic()
            for node_id, proc in procs.items():
                status = proc.poll()
                if status is not None and node_id not in dead:
                    how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
                    then = "restarting it" if args.restart else "the others keep running (--restart restarts it)"
                    print(f"queue-cluster: node {node_id} (pid {proc.pid}) {how}; {then}", flush=True)
                    dead[node_id] = now
            for node_id, when in list(dead.items()):
                if args.restart and now - when >= RESTART_AFTER:
                    del dead[node_id]
                    launch(node_id)
            time.sleep(0.2)
        return 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.data_root is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"queue-cluster: data kept in {root}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
