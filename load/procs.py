"""A server's processes, read from /proc, for the benchmarks: the process tree under a pid, a
short name for each process (queue-server's children by their module and worker index) and the
CPU time each has used; signalling and stopping processes and process groups (one way for the
tests, the benchmarks and the soak runner: grace, then SIGKILL, orphans of a group killed)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator

_TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state letter, parent pid, process group) of every process in /proc now."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            yield int(entry), fields[0].decode(), int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            continue


def descendants(pid: int) -> list[int]:
    """`pid` and all its descendants alive now, `pid` first."""
    children: dict[int, list[int]] = {}
    for child, _, ppid, _ in _processes():
        children.setdefault(ppid, []).append(child)
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


def signal_each(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to every process of group `pgid`, if any is left."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[str]:
    """'pid command' of each live process in process group pgid (from /proc)."""
    found = []
    for pid, state, _, group in _processes():
        if group != pgid or state == "Z":
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append(f"{pid} {cmd[:160]}")
    return found


def wait_until(condition: Callable[[], object], timeout: float, longest: float = 0.1) -> object:
    """Poll `condition` until it returns something truthy, and return that; None once `timeout`
    seconds pass without. The pauses between polls grow from 5 ms to `longest` seconds (a caller
    that times when the condition turned true gives a shorter one)."""
    deadline = time.monotonic() + timeout
    delay = min(0.005, longest)
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, longest)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def stop(proc: subprocess.Popen, grace: float = 15.0, *, group: bool = False, kill_wait: float = 5.0) -> int:
    """Stop `proc` and return its exit status: SIGTERM, then SIGKILL if it has not exited within
    `grace` seconds (`grace` 0: SIGKILL at once). With `group` (`proc` leads a process group of its
    own, as start_new_session makes it) both signals go to the whole group too and stopping waits
    until no process of the group is left: the orphans `proc` leaves are stopped too."""
    def done() -> bool:
        return proc.poll() is not None and not (group and group_members(proc.pid))

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if done() or (sig == signal.SIGTERM and grace <= 0):
            continue
        if group:
            signal_group(proc.pid, sig)
            if proc.poll() is None and not _leads_group(proc.pid):  # the group signal missed it
                proc.send_signal(sig)
            wait_until(done, wait)
        elif proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
    return proc.wait()


def stop_tree(proc: subprocess.Popen, grace: float = 15.0) -> int:
    """`stop` a supervisor (SIGTERM to it alone: it stops its children itself), then SIGKILL every
    descendant it had when asked to stop that is still there (children in sessions of their own
    are in no group of its)."""
    pids = descendants(proc.pid)[1:] if proc.poll() is None else []
    status = stop(proc, grace)
    signal_each(pids, signal.SIGKILL)
    return status


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL `proc` and all its descendants at once (a crash, no clean stop); its exit status."""
    if proc.poll() is None:
        signal_each(descendants(proc.pid), signal.SIGKILL)
    return proc.wait()
