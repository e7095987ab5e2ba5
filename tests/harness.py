"""Starting real nodes for integration and fault tests: free loopback ports chosen at run time,
waiting on conditions with deadlines (never sleeping "long enough"), and cleaning up every
process started."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import orjson

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 right now."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("127.0.0.1", 0))
            port = t.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port")


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def can_connect(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class NodeProcess:
    """A `queue-server` node started as a subprocess with a config written to `workdir`."""

    def __init__(self, workdir: str, config: dict | None = None, name: str = "node") -> None:
        self.workdir = workdir
        self.config = {"host": "127.0.0.1", "port": free_port(), "workers": 2, "log_level": 3}
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

    def start(self, wait: bool = True) -> "NodeProcess":
        """Start the node; with `wait`, return once it accepts TCP connections."""
        path = os.path.join(self.workdir, f"{self.name}.json")
        with open(path, "w") as f:
            json.dump(self.config, f)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.main", "--config", path],
            cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until the node accepts connections (or fail, showing its log)."""
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return can_connect(*self.address)
        wait_for(ready, timeout, f"{self.name} to accept connections")

    def log(self) -> str:
        """Everything the node has logged so far."""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def child_pids(self) -> list[int]:
        """Pids of the supervisor's children (from /proc)."""
        assert self.proc is not None
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == self.proc.pid:
                    pids.append(int(entry))
        return pids

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the node (SIGTERM, then SIGKILL) and every child it left."""
        if self.proc is None:
            return None
        children = self.child_pids() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.proc.returncode


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class RawTcp:
    """A bare TCP connection speaking newline-delimited JSON (or raw bytes) to a node."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
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
