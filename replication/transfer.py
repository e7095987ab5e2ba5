"""A snapshot on disk streamed to a far-behind follower in chunks, free of I/O.

The leader's side is SnapshotSend (one per follower in the SNAPSHOT state of
replication/progress.py): it walks the snapshot's files (its manifest, then each part) in chunks
of at most `chunk` bytes, keeps at most `window` of them unacknowledged, and goes back to the last
acknowledged position when the oldest has gone unanswered `resend_after` seconds (go-back-N). Its
chunks are SnapshotChunk messages whose data is a FileRange: the coordinator reads the bytes when
it encodes the message, so the snapshot is never in memory as a whole.

The follower's side is SnapshotReceive (one per snapshot being received, in
replication/follower.py): it takes only the chunk at the position it holds (every byte before it
written) and says where that is; a chunk elsewhere is a duplicate or follows a lost one, and the
answer (the same position) makes the leader resend from there.

A position is (part, offset): part -1 is the manifest; every byte of the files before it is
written. The files go in order, each from offset 0; the end is (number of parts, 0).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import orjson

from queue_server.replication.messages import FileRange, SnapshotChunk

CHUNK = 1 << 20  # bytes of one SnapshotChunk
WINDOW = 8  # chunks unacknowledged per follower
MANIFEST = -1  # the part number of the manifest

Position = tuple[int, int]  # (part, offset)


def segment_name(part_file: str, seg: int) -> str:
    """The name of segment `seg` of the part named `part_file` (beside it)."""
    return f"{part_file}.seg-{seg}"


def file_entries(manifest: dict) -> list[dict]:
    """The entries ({"file", "bytes"}) of a v2 manifest's files after it: its parts, then the
    segment files each part relies on (KeyError, TypeError when malformed)."""
    parts = manifest["parts"]
    return [*parts, *({"file": segment_name(e["file"], seg), "bytes": size}
                      for e in parts for seg, size in e.get("segments", ()))]


class SnapshotSource(NamedTuple):
    """A published snapshot on the leader's disk: its point, its term, and its files with their
    sizes (the manifest first, then each part in order)."""

    trans_id: int
    vote_id: int
    files: tuple[tuple[str, int], ...]


def _next(pos: Position, length: int, total: int) -> Position:
    """The position after `length` bytes at pos of a file of `total` bytes."""
    offset = pos[1] + length
    return (pos[0] + 1, 0) if offset >= total else (pos[0], offset)


class SnapshotSend:
    """The leader's stream of one snapshot to one follower."""

    def __init__(self, source: SnapshotSource, *, chunk: int = CHUNK, window: int = WINDOW,
                 resend_after: float = 2.0) -> None:
        self.source = source
        self.chunk = chunk
        self.window = window
        self.resend_after = resend_after
        self.end: Position = (len(source.files) - 1, 0)
        self.acked: Position = (MANIFEST, 0)  # the follower has every byte before this
        self.next: Position = (MANIFEST, 0)  # the next chunk to send
        self.inflight: deque[tuple[Position, Position, float]] = deque()  # (start, end, sent at)
        self.resent = 0  # chunks sent again

    @property
    def done(self) -> bool:
        """Whether the follower has written every file."""
        return self.acked >= self.end

    def chunks(self, vote_id: int, src: int, now: float) -> list[SnapshotChunk]:
        """The chunks the window lets out now (messages of the leader `src` of term vote_id)."""
        out = []
        files = self.source.files
        while self.next < self.end and len(self.inflight) < self.window:
            part, offset = self.next
            path, total = files[part + 1]
            length = min(self.chunk, total - offset)
            after = _next(self.next, length, total)
            out.append(SnapshotChunk(vote_id, src, self.source.trans_id, self.source.vote_id, part, offset, total,
                                     FileRange(path, offset, length)))
            self.inflight.append((self.next, after, now))
            self.next = after
        return out

    def on_ack(self, part: int, offset: int) -> bool:
        """The follower holds every byte before (part, offset). Whether that is progress. A
        position behind what it acknowledged before means it started again (a restart): the
        stream goes back there."""
        pos = (part, offset)
        if pos < self.acked:
            self._back_to(pos)
            return False
        if pos == self.acked:
            return False
        self.acked = min(pos, self.end)
        if self.next < self.acked:
            self.next = self.acked
        inflight = self.inflight
        while inflight and inflight[0][1] <= self.acked:
            inflight.popleft()
        return True

    def tick(self, now: float) -> bool:
        """Whether the oldest chunk out went unanswered too long: the stream then goes back to
        the last acknowledged position (the caller sends chunks() again)."""
        if self.inflight and now - self.inflight[0][2] >= self.resend_after:
            self.resent += len(self.inflight)
            self._back_to(self.acked)
            return True
        return False

    def _back_to(self, pos: Position) -> None:
        self.acked = self.next = pos
        self.inflight.clear()


class SnapshotReceive:
    """A follower's reception of the snapshot at (trans_id, vote_id)."""

    def __init__(self, trans_id: int, vote_id: int) -> None:
        self.trans_id = trans_id
        self.vote_id = vote_id
        self.at: Position = (MANIFEST, 0)
        self._manifest = bytearray()
        self.manifest: dict | None = None  # once whole

    @property
    def complete(self) -> bool:
        return self.manifest is not None and self.at >= (len(file_entries(self.manifest)), 0)

    def take(self, m: SnapshotChunk) -> bool:
        """Whether chunk m is the next one (it is then to be written, and the position moves)."""
        data = m.data
        if (m.part, m.offset) != self.at or not isinstance(data, bytes) or not data or m.offset + len(data) > m.total:
            return False
        if m.part == MANIFEST:
            self._manifest += data
            self.at = _next(self.at, len(data), m.total)
            if self.at[0] != MANIFEST:
                self.manifest = _parse(bytes(self._manifest), self.trans_id)
                if self.manifest is None:  # not a manifest of this snapshot: take it again
                    self._manifest.clear()
                    self.at = (MANIFEST, 0)
                    return False
            return True
        entries = file_entries(self.manifest) if self.manifest is not None else []
        if m.part >= len(entries) or entries[m.part].get("bytes") != m.total:
            return False
        self.at = _next(self.at, len(data), m.total)
        return True


def _parse(data: bytes, trans_id: int) -> dict | None:
    """The manifest in data, if it is one of the snapshot at trans_id (replication/snapshot.py
    says what it holds)."""
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if (not isinstance(manifest, dict) or manifest.get("trans_id") != trans_id
            or not isinstance(manifest.get("parts"), list)
            or not all(isinstance(p, dict) and isinstance(p.get("bytes"), int) for p in manifest["parts"])):
        return None
    try:
        if not all(isinstance(e["bytes"], int) for e in file_entries(manifest)):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return manifest
