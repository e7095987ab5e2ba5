"""What a worker measures against config max_memory_mb.

With overflow (overflow_mb, a node with a data dir), what the worker holds for its messages
(HeldMemory: the bodies in memory and ~85 B a message, its `memory_bytes`) against its even
share of the limit: a count, which falls as soon as messages go. Without, the resident memory
of the node's processes (NodeMemory: the supervisor and its children, coordinator, workers,
acceptor; not a snapshot writer's short-lived fork, whose pages are the coordinator's), read from
/proc: one small file per process, the list of processes read again every few seconds. RSS does
not fall when messages go (the allocator keeps freed memory for reuse).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queue_server.workers.service import PartitionService

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

    counted = False

    def __init__(self, root: int, limit_mb: int) -> None:
        self.root = root
        self.limit = limit_mb << 20
        self.pids: list[int] = []
        self.next_scan = 0.0

    def used(self, now: float) -> int:
        """The sum of the node's processes' resident memory (monotonic time `now`)."""
        if now >= self.next_scan:
            self.next_scan = now + RESCAN
            self.pids = [self.root, *children(self.root)]
        return sum(resident_bytes(pid) for pid in self.pids)


class HeldMemory:
    """What one worker holds for the messages of its services (each with an Overflow), against
    its share of max_memory_mb: the limit split evenly over the node's workers, as overflow_mb is."""

    counted = True

    def __init__(self, services: Iterable[PartitionService], limit_mb: int, workers: int) -> None:
        self.services = tuple(services)
        self.limit = (limit_mb << 20) // max(workers, 1)

    def used(self, now: float) -> int:
        """The bytes held now: every service's memory_bytes."""
        return sum(service.held_bytes() for service in self.services)
