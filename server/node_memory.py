"""The resident memory of a node's processes, for config max_memory_mb: the supervisor and its
children (coordinator, workers, acceptor; not a snapshot writer's short-lived fork, whose pages
are the coordinator's), read from /proc. A reading is one small file per process; the list of
processes is read again every few seconds."""
from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")
RESCAN = 5.0  # seconds between two listings of the supervisor's children


def resident_bytes(pid: int) -> int:
    """Process `pid`'s resident memory (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def children(parent: int) -> list[int]:
    """The pids of `parent`'s children."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.append(int(entry))
    return found


class NodeMemory:
    """The node's resident memory, as the sum over its processes; `root` is the supervisor."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids: list[int] = []
        self.next_scan = 0.0

    def resident_bytes(self, now: float) -> int:
        """The sum of the node's processes' resident memory (monotonic time `now`)."""
        if now >= self.next_scan:
            self.next_scan = now + RESCAN
            self.pids = [self.root, *children(self.root)]
        return sum(resident_bytes(pid) for pid in self.pids)
