"""Starting real nodes for integration and fault tests: free loopback ports chosen at run time,
waiting on conditions with deadlines (never sleeping "long enough"), and cleaning up every
process started."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

import orjson

from load.procs import process_name, signal_each, stop_tree, wait_until
from queue_server.client.tls import wrap as wrap_tls
from queue_server.server.auth import read_token_file
from queue_server.server.node_memory import children

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_HANDED_OUT: set[int] = set()
_PORT_RNG = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 right now, never handed out before in this
    process, and outside the kernel's ephemeral range: a port bound to 0 and closed comes from that
    range, where the next outgoing connection (a node dialling its peers) can take it before the
    node that was given it binds it."""
    low, high = _EPHEMERAL
    lo, hi = (10000, low - 1) if low > 11000 else (high + 1, 65535)
    for _ in range(1000):
        port = _PORT_RNG.randint(lo, hi)
        if port in _HANDED_OUT:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                t.bind(("127.0.0.1", port))
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port")


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Poll `condition` until it returns something truthy, and return that; fail after `timeout`
    seconds."""
    result = wait_until(condition, timeout)
    if not result:
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
    return result


def recovery_line(node: "NodeProcess", pattern: str) -> re.Match:
    """The node's recovery line, matched by `pattern`, once it is logged: it waits for the
    workers to say what they hold, so it may come just after the first replies."""
    return wait_for(lambda: re.search(pattern, node.log()), 20, f"a recovery line like {pattern!r}")


def can_connect(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_without_config(cwd: str | os.PathLike, *args: str) -> subprocess.Popen:
    """`queue-server *args` in `cwd` with no config file (the embedded defaults, but for what
    `args` set); its output goes to cwd/node.log. Stop it with load.procs.stop_tree."""
    with open(os.path.join(cwd, "node.log"), "wb") as log:
        return subprocess.Popen(["queue-server", *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT)


def printed_page(proc: subprocess.Popen, cwd: str | os.PathLike) -> str:
    """The status page's address a node of start_without_config printed once it serves it
    (fails, with its output, if the node exits first)."""
    def printed() -> str | None:
        with open(os.path.join(cwd, "node.log"), errors="replace") as f:
            output = f.read()
        if proc.poll() is not None:
            raise AssertionError(f"the node exited with {proc.returncode}:\n{output}")
        found = re.search(r"status page and HTTP API: (\S+)", output)
        return found.group(1) if found else None
    return wait_for(printed, 30, "the node to print its status page's address")  # type: ignore[return-value]


# Every node a test started, so that the session can stop whatever a failing test left running.
STARTED: list["NodeProcess"] = []


class NodeProcess:
    """A `queue-server` node started as a subprocess with a config written to `workdir`."""

    def __init__(self, workdir: str, config: dict | None = None, name: str = "node", *,
                 cwd: str | None = None, command: list[str] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """cwd: where the node starts (the repository by default); command: how (by default
        `python -m queue_server.server.main`; ["queue-server"] runs the installed script).
        tls: what the harness's own connections use on a node with tls_cert_file (see
        client_tls); a node with tls_ca_file needs one, with a client certificate."""
        self.tls = tls
        self.cwd = cwd or REPO
        self.command = command or [sys.executable, "-m", "queue_server.server.main"]
        self.workdir = workdir
        # http_port 0: the HTTP API is off unless the test asks for it (its default port, 8111,
        # would be every node's at once).
        self.config = {"host": "127.0.0.1", "port": free_port(), "workers": 2, "log_level": 3, "http_port": 0,
                       "queue_data_dir": os.path.join(workdir, f"{name}-data")}
        self.config.update(config or {})
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(workdir, f"{name}.log")

    @property
    def address(self) -> tuple[str, int]:
        return self.config["host"], self.config["port"]

    @property
    def hosts(self) -> str:
        return f"{self.config['host']}:{self.config['port']}"

    def client_tls(self) -> ssl.SSLContext | None:
        """The TLS of the harness's own connections to the client port, from the config: None on
        a node without tls_cert_file; else `tls`, or without it a context that checks nothing (the
        harness asks whether the node serves, not who it is)."""
        if not self.config.get("tls_cert_file"):
            return None
        if self.tls is not None:
            return self.tls
        if self.config.get("tls_ca_file"):
            raise RuntimeError(f"{self.name} requires a client certificate (tls_ca_file): "
                               f"give NodeProcess a tls= context with one")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def connect(self, timeout: float = 10.0) -> RawTcp:
        """A connection to the client port, over TLS when the config asks for it (client_tls)."""
        return RawTcp(*self.address, timeout=timeout, tls=self.client_tls())

    def start(self, wait: bool = True, serving: bool = False) -> "NodeProcess":
        """Start the node; with `wait`, return once it accepts TCP connections; with `serving`,
        once it serves a request (wait_serving)."""
        path = os.path.join(self.workdir, f"{self.name}.json")
        with open(path, "w") as f:
            json.dump(self.config, f)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.command, "--config", path],
            cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT,
        )
        STARTED.append(self)
        if serving:
            self.wait_serving()
        elif wait:
            self.wait_ready()
        return self

    def _wait_up(self, condition: Callable[[], object], timeout: float, what: str) -> None:
        """wait_for(condition), failing at once, with the node's log, if the node exits."""
        def up() -> object:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return condition()
        wait_for(up, timeout, f"{self.name} {what}")

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until the node accepts connections (or fail, showing its log). It may not serve
        yet: see wait_serving."""
        self._wait_up(lambda: can_connect(*self.address), timeout, "to accept connections")

    def serves(self) -> bool:
        """Whether the node answers a node-wide monitor (action 4) with code 0. That request is
        forwarded to the leader and gathered from every worker of the node that answers it, so
        the node knows a leader, reaches it, and the leader's workers have their mode (a node
        accepts connections before all three). Over TLS with `tls_cert_file` (connect); with
        `auth_token_file`, authenticates first."""
        try:
            conn = self.connect(timeout=1.0)
        except OSError:
            return False
        try:
            token = self.token()
            if token is not None and conn.call({"action": "auth", "token": token}).get("code") != 0:
                return False
            return conn.call({"action": 4}).get("code") == 0
        except (OSError, ValueError):
            return False
        finally:
            conn.close()

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Wait until the node serves a request (serves), or fail, showing its log."""
        self._wait_up(self.serves, timeout, "to serve a request (a monitor answered with code 0)")

    def token(self) -> str | None:
        """A client token of a node with `auth_token_file` (the file's first token, as the node
        reads the file), else None."""
        path = self.config.get("auth_token_file")
        return read_token_file(path)[0].decode() if path else None

    def log(self) -> str:
        """Everything the node has logged so far."""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def child_pids(self) -> list[int]:
        """Pids of the supervisor's children (from /proc)."""
        assert self.proc is not None
        return children(self.proc.pid)

    def pids(self) -> list[int]:
        """Every process of the node: its children, then the supervisor."""
        assert self.proc is not None
        return self.child_pids() + [self.proc.pid]

    def child_pid(self, process: str) -> int:
        """The pid of the node's child that runs queue_server.server.<process> ("acceptor",
        "coordinator", "worker")."""
        for pid in self.child_pids():
            if process_name(pid).split("-")[0] == process:  # a worker's name is worker-<index>
                return pid
        raise AssertionError(f"no {process} among the children of {self.name}")

    @contextmanager
    def child_stopped(self, process: str) -> Iterator[int]:
        """Stop the node's child `process` (SIGSTOP, as child_pid names it) until the block ends
        (SIGCONT, however it ends); the block starts once the kernel shows it stopped, and is
        given its pid."""
        pid = self.child_pid(process)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: process_state(pid) == "T", 5, f"the {process} to stop")
            yield pid
        finally:
            os.kill(pid, signal.SIGCONT)

    def server_side(self, client_port: int) -> tuple[int, int] | None:
        """(state, bytes not yet read) of the node's end of the TCP connection from local port
        `client_port`, from /proc/net/tcp; None once the kernel has closed and dropped that end."""
        local = "0100007F:%04X" % self.address[1]
        remote = "0100007F:%04X" % client_port
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1] == local and fields[2] == remote:
                    return int(fields[3], 16), int(fields[4].split(":")[1], 16)
        return None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def signal_all(self, sig: int) -> None:
        """Send `sig` to every process of the node at once: its children, then the supervisor."""
        signal_each(self.pids(), sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the node (SIGTERM, then SIGKILL) and every child it left."""
        if self.proc is None:
            return None
        status = stop_tree(self.proc, timeout)
        self._log.close()
        return status


def kill_all(node: NodeProcess) -> None:
    """kill -9 of every process of the node at once (a crash, not a shutdown)."""
    assert node.proc is not None
    node.signal_all(signal.SIGKILL)
    node.proc.wait(10)
    node.stop()


def process_state(pid: int) -> str:
    """The state letter of a process in /proc (R, S, T: stopped, Z: zombie, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        return process_state(pid) != "Z"
    except OSError:
        return False


class RawTcp:
    """A bare TCP connection speaking newline-delimited JSON (or raw bytes) to a node."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> None:
        """tls: run the TLS handshake first (a node with tls_cert_file)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        self.sock = wrap_tls(sock, tls, host) if tls is not None else sock
        self.buf = b""

    def send(self, data: bytes | dict) -> None:
        if isinstance(data, dict):
            data = orjson.dumps(data) + b"\n"
        self.sock.sendall(data)

    def recv(self) -> dict:
        """The next reply line, decoded."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return orjson.loads(line)

    def call(self, request: dict) -> dict:
        self.send(request)
        return self.recv()

    def closed_by_peer(self) -> bool:
        """Whether the server has closed the connection (after any pending replies)."""
        try:
            return self.sock.recv(1 << 16) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def udp_call(host: str, port: int, request: dict | bytes, timeout: float = 5.0) -> dict:
    """One UDP request and its reply."""
    data = request if isinstance(request, bytes) else orjson.dumps(request)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(data, (host, port))
        reply, _ = s.recvfrom(1 << 16)
    return orjson.loads(reply)


def http(port: int, method: str, path: str, body: bytes | dict | None = None, token: str | None = None,
         timeout: float = 10.0) -> tuple[int, dict, dict]:
    """One HTTP request to a node's http_port on loopback: (status, headers, JSON body)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = orjson.dumps(body) if isinstance(body, dict) else body
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, dict(response.getheaders()), orjson.loads(raw) if raw else {}
    finally:
        conn.close()


def metric(port: int, name: str, **labels: str) -> float:
    """The first sample `name` with these labels (others may be present) that a node's metrics_port
    serves, or 0.0 if it serves none."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


class LinkProxy:
    """A TCP proxy for one directed link between two nodes' internal ports, that a test can cut
    (existing connections dropped, new ones refused) and heal."""

    def __init__(self, target_port: int) -> None:
        import asyncio
        import threading

        self.target_port = target_port
        self.port = free_port()
        self.cut_off = False
        self._writers: set = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self._loop)

        async def pipe(reader, writer) -> None:
            try:
                while not self.cut_off:
                    data = await reader.read(65536)
                    if not data:
                        break
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(reader, writer) -> None:
            if self.cut_off:
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            self._writers.update((writer, up_writer))
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            self._writers.difference_update((writer, up_writer))

        async def main() -> None:
            self._server = await asyncio.start_server(handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(main())
        self._loop.run_forever()

    def cut(self) -> None:
        """Drop the link: close its connections, refuse new ones."""
        def do() -> None:
            self.cut_off = True
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()
        self._loop.call_soon_threadsafe(do)

    def heal(self) -> None:
        def do() -> None:
            self.cut_off = False
        self._loop.call_soon_threadsafe(do)

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class Cluster:
    """An n-node cluster of real nodes on loopback ports chosen at run time; with `proxied`,
    every link between two nodes goes through a LinkProxy the test can cut."""

    def __init__(self, workdir: str, n: int = 3, proxied: bool = False, http: bool = False,
                 tls: ssl.SSLContext | None = None, **config) -> None:
        """config: keys every node's config gets; tls: NodeProcess's, for every node."""
        from queue_server.server.devcluster import cluster_configs

        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        clients = [free_port() for _ in range(n)]
        internals = [free_port() for _ in range(n)]
        self.proxies: dict[tuple[int, int], LinkProxy] = {}
        if proxied:
            for i in range(1, n + 1):
                for j in range(1, n + 1):
                    if i != j:
                        self.proxies[(i, j)] = LinkProxy(internals[j - 1])
        peer_ports = {k: v.port for k, v in self.proxies.items()} or None
        config.setdefault("workers", 2)
        groups = int(os.environ.get("QUEUE_SERVER_TEST_QUEUE_GROUPS", "1"))  # load/soak.py --queue-groups
        if groups > 1:
            config.setdefault("queue_groups", groups)
        https = [free_port() for _ in range(n)] if http else None  # http_port of each node
        configs = cluster_configs(n, workdir, clients, internals, peer_ports, https, **config)
        self.nodes = {c["node_id"]: NodeProcess(workdir, c, name=f"node{c['node_id']}", tls=tls) for c in configs}
        self.token: str | None = None  # the client token ask() presents (nodes with auth_token_file)

    @property
    def hosts(self) -> str:
        return ",".join(n.hosts for n in self.nodes.values())

    def start(self, wait: bool = True) -> "Cluster":
        for node in self.nodes.values():
            node.start(wait=False)
        if wait:
            for node in self.nodes.values():
                node.wait_ready()
        return self

    def ask(self, node_id: int, request: dict) -> dict | None:
        """One request to one node, or None if it does not answer within a second."""
        try:
            conn = self.nodes[node_id].connect(timeout=1.0)
            try:
                if self.token is not None and conn.call({"action": "auth", "token": self.token}).get("code") != 0:
                    return None
                return conn.call(request)
            finally:
                conn.close()
        except (OSError, ValueError):
            return None

    def leader_view(self, node_id: int) -> int | None:
        """Who node_id says leads (None if it knows no leader or does not answer)."""
        reply = self.ask(node_id, {"action": 8})
        return reply.get("leader_node_id") if reply and reply.get("code") == 0 else None

    def role(self, node_id: int) -> str | None:
        """The role node_id reports for itself (monitor's `role`), or None."""
        reply = self.ask(node_id, {"action": 104})
        return reply.get("role") if reply else None

    def wait_leader(self, timeout: float = 15.0, among: list[int] | None = None, exclude: int | None = None) -> int:
        """Wait until every node in `among` names the same leader (not `exclude`), which says it
        leads."""
        ids = among or list(self.nodes)

        def agreed() -> int | None:
            views = {self.leader_view(i) for i in ids}
            if len(views) != 1:
                return None
            leader = views.pop()
            if leader and leader != exclude and self.role(leader) == "leader":
                return leader
            return None
        try:
            return wait_for(agreed, timeout, "the nodes to agree on a leader")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.describe(ids)}") from None

    def in_first_group(self, name: str) -> str:
        """`name`, or with queue groups the first of name-1, name-2, ... in group 0: a queue that
        the leader wait_leader names (group 0's) leads, for a test about one leader."""
        from queue_server.protocol.placement import Placement

        config = next(iter(self.nodes.values())).config
        placement = Placement(list(self.nodes), config.get("queue_groups", 1))
        return next(q for q in (name, *(f"{name}-{i}" for i in range(1, 1000))) if placement.group_of(q) == 0)

    def leader_of(self, queue: str, timeout: float = 15.0) -> int:
        """The leader every node names for `queue` (action 8 with the queue: with queue groups,
        its group's leader; else the cluster's)."""
        def agreed() -> int | None:
            views = set()
            for i in self.nodes:
                reply = self.ask(i, {"action": 8, "queue": queue})
                views.add(reply.get("leader_node_id") if reply and reply.get("code") == 0 else None)
            return views.pop() if len(views) == 1 and None not in views else None
        return wait_for(agreed, timeout, f"the nodes to agree on the leader of {queue}'s group")  # type: ignore[return-value]

    def roles(self) -> tuple[int, int]:
        """(the leader the nodes agree on, a follower that knows it)."""
        leader = self.wait_leader()
        return leader, next(i for i in self.nodes if i != leader)

    def describe(self, ids: list[int] | None = None) -> str:
        """Each node's view of the cluster and the end of its log, for a failure message."""
        lines = []
        for i in ids or list(self.nodes):
            node = self.nodes[i]
            exited = node.proc is not None and node.proc.poll() is not None
            state = f"exited with {node.proc.returncode}" if exited else "running"
            lines.append(f"--- node {i} ({state}): leader {self.leader_view(i)}, role {self.role(i)}")
            lines.extend(node.log().splitlines()[-15:])
        return "\n".join(lines)

    def wait_serving(self, timeout: float = 30.0) -> int:
        """Wait until every node serves requests: they agree on a leader and each relays a
        request to it (wait_leader, then wait_forwarding); the leader."""
        leader = self.wait_leader(timeout)
        self.wait_forwarding(leader, timeout)
        return leader

    def wait_forwarding(self, leader: int, timeout: float = 15.0) -> None:
        """Wait until every other node relays a request to `leader` and brings its reply back
        (a follower learns who leads from the leader's messages, but forwards over its own link
        to the leader, which may still be connecting). The probe is a node-wide monitor (action
        4): forwarded, answered by the leader, no side effect. With queue groups each group's
        part is answered by the group's leader: the monitor answers (code 0) once they all do."""
        def relays(node_id: int) -> bool:
            reply = self.ask(node_id, {"action": 4})
            return bool(reply) and reply.get("code") == 0 and (reply.get("node_id") == leader or "groups" in reply)
        for node_id in self.nodes:
            if node_id != leader:
                wait_for(lambda: relays(node_id), timeout, f"node {node_id} to relay requests to node {leader}")

    def wait_level(self, leader: int, timeout: float = 15.0) -> None:
        """Wait until the leader knows every follower's log equals its own (lag 0 for each in its
        monitor): a hand-off started now picks among them by node id alone."""
        def level() -> bool:
            reply = self.ask(leader, {"action": 104})
            rows = reply.get("followers") if reply else None
            return bool(rows) and len(rows) == len(self.nodes) - 1 and all(r["lag"] == 0 for r in rows)
        wait_for(level, timeout, f"every follower's log to equal node {leader}'s")

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        for proxy in self.proxies.values():
            proxy.close()
