"""Compaction of a worker's overflow segments (issue 26, docs/plans/overflow.md 2.2): a closed
segment whose live references fell under COMPACT_BELOW of the records written to it has its live
bodies copied to the current segment, a little at a time, so that disk use tracks what is
stored. `Compaction`, stepped by PartitionService.tick.

A step walks the worker's queues chunk by chunk (MessageStore.move_out: every slot that refers
to the segment gets a reference to the body's copy), at most STEP_CHUNKS chunks or STEP_BYTES
moved per step, so the worker's loop is never held long. Once its last reference has moved,
the segment goes as an emptied one does (Overflow.trimmed: only once the records whose undo
could bring an old reference back are committed). A move is no record: each node compacts its
own segments. The walk looks the queues up again at each step, so a queue deleted or purged
meanwhile (its store detached from the overflow's counts) is not touched; a reference that
moves into a queue already walked (a dead letter) keeps the segment: it is not tried again.

Pure logic: no I/O (the Overflow's SegmentFiles does it).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queue_server.workers.overflow import Overflow
    from queue_server.workers.queue import Queue

COMPACT_BELOW = 0.25  # live references / records written, under which a closed segment is compacted
STEP_CHUNKS = 64  # store chunks (of 256 messages) looked at in one step
STEP_BYTES = 1 << 20  # bodies copied in one step, at most (about)
CHECK_EVERY = 0.5  # seconds between two looks for a segment to compact, while none is


class Compaction:
    """The compaction under way (one segment at a time) of one worker's overflow."""

    def __init__(self, overflow: Overflow, check_every: float = CHECK_EVERY) -> None:
        self.overflow = overflow
        self.check_every = check_every
        self.seg: int | None = None
        self.walk: Iterator[int] | None = None
        self.tried: set[int] = set()  # segments walked whole that kept references
        self.next_check = 0.0
        self.moved = 0  # bytes of bodies moved, in all

    def stop(self) -> None:
        """Forget the compaction under way (the queues were replaced by a load)."""
        self.walk = self.seg = None
        self.tried.clear()

    def step(self, queues: dict[str, Queue], now: float) -> bool:
        """Compact a little; whether a segment's last reference moved in this step."""
        ov = self.overflow
        if self.walk is None:
            if now < self.next_check:
                return False
            self.next_check = now + self.check_every
            self.tried &= ov.live.keys()
            seg = ov.compactable(COMPACT_BELOW, self.tried)
            if seg is None:
                return False
            self.seg, self.walk = seg, _walk(queues, seg)
        seg = self.seg
        moved = 0
        for _ in range(STEP_CHUNKS):
            got = next(self.walk, None)
            moved += got or 0
            if got is None or seg not in ov.live:
                self.walk = None
                if seg in ov.live:
                    self.tried.add(seg)
                break
            if moved >= STEP_BYTES:
                break
        if ov.refused is not None:  # the disk refuses writes: try again later
            self.walk = None
        self.moved += moved
        return seg not in ov.live


def _walk(queues: dict[str, Queue], seg: int) -> Iterator[int]:
    """Move the bodies of `seg` out, a store chunk a step; the bytes each step moved."""
    for name in list(queues):
        q = queues.get(name)
        if q is None or not q._index.spilled:
            continue
        for n in sorted(q._index.chunks):
            if queues.get(name) is not q:
                break
            yield q._index.move_out(seg, n)
        if queues.get(name) is q:
            yield q._index.move_out(seg, None)
