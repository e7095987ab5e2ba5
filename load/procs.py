"""A server's processes, read from /proc, for the benchmarks: the process tree under a pid, a
short name for each process (queue-server's children by their module and worker index) and the
CPU time each has used; starting a node of its own and stopping a server process."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

_TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """`pid` and all its descendants alive now, `pid` first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def process_name(pid: int) -> str:
    """queue-server's children by module (acceptor, coordinator, worker-N); any other process by
    its program's name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return str(pid)
    if "-m" in argv[:-1]:
        name = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
        if "--index" in argv[:-1]:
            name += "-" + argv[argv.index("--index") + 1]
        return name
    return os.path.basename(argv[0]) if argv else str(pid)


def _stat(path: str) -> tuple[str, float]:
    """The command name and the user + system CPU seconds of a /proc stat file; ("", 0.0) once
    its process or thread is gone."""
    try:
        with open(path, "rb") as f:
            head, _, tail = f.read().rpartition(b")")
        fields = tail.split()
        return head.split(b"(", 1)[1].decode(errors="replace"), (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return "", 0.0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far; 0.0 once it is gone."""
    return _stat(f"/proc/{pid}/stat")[1]


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and its descendants alive now."""
    return sum(cpu_seconds(p) for p in descendants(pid))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of process `pid`, by thread name (the main thread is "main";
    ZeroMQ's I/O thread is "ZMQbg/IO/0"); threads of one name are summed."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        name, seconds = _stat(f"/proc/{pid}/task/{tid}/stat")
        if name:
            name = "main" if tid == str(pid) else name
            out[name] = out.get(name, 0.0) + seconds
    return out


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Terminate `proc` if it still runs; kill it if it has not exited within `timeout` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def own_node(hosts: str | None, config: dict | None = None) -> Iterator[tuple[str, int | None]]:
    """(hosts, None) when given a running node's `hosts`; otherwise a node of this script's own
    for the block (in memory, on loopback, with `config`'s keys), as (its hosts, its pid)."""
    if hosts:
        yield hosts, None
        return
    from tests.harness import NodeProcess  # starts a node and waits for it

    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(tmp, config, command=[sys.executable, "-m", "queue_server.server.main", "--in-memory"]).start()
        try:
            assert node.proc is not None
            yield node.hosts, node.proc.pid
        finally:
            node.stop()
