"""The segment files of one worker's overflowed bodies (issue 26): `DiskSegments`, the
SegmentFiles that workers/overflow.py's `Overflow` decides for, and `worker_dir`; and the
segments of snapshots (`link_segments` when a part is cut, `PartSegments` when parts are loaded).

Each segment is `<overflow_dir>/worker-<i>/seg-<n>.qob`, written at the offsets the Overflow
gives (pwrite: a write the disk cut short is written again at the same place), read with pread
(so a forked snapshot writer reads the same files safely). Nothing is fsync'd: the change log
makes a produce durable, and a node rebuilds its queues from snapshot and log, so the segments
of a worker are all dropped when it starts (`clear`). So two nodes must never share a folder:
the worker holds an flock on `worker-<i>/LOCK` (with its pid) while it runs, and the supervisor's
preflight checks it is free (`in_use`).

A snapshot part refers to the bodies on disk instead of holding them (REFS frames,
protocol/snapshot_frames.py): when the cut forks, the worker hard-links every segment with a live
reference into the cut's directory as `<part>.seg-<n>` (`link_segments`; a link, so the worker
deleting or compacting a segment later does not touch the snapshot's, and pruning the snapshot
frees it), and the part's writer fsyncs them (`sync_segments`) before the part is done. A worker
loading parts (`PartSegments`) gives each part's segments numbers of its own above any it used,
links the ones its queues refer to into its folder, and drops the rest; a worker with overflow
off reads the bodies back instead.
"""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator

from queue_server.protocol.snapshot_frames import REFS, ROWS, Frame, read_rows, rebase_refs, rows_frames
from queue_server.replication import datadir
from queue_server.replication.snapshot import segment_name
from queue_server.workers.body_budget import BodyBudget
from queue_server.workers.overflow import Overflow

SUFFIX = ".qob"


def worker_dir(overflow_dir: str, index: int) -> str:
    """Where worker `index` keeps its segments."""
    return os.path.join(overflow_dir, f"worker-{index}")


class OverflowDirInUse(OSError):
    """Another process holds a worker's overflow folder."""


def in_use(overflow_dir: str, workers: int) -> str | None:
    """Why a node cannot use `overflow_dir` (a worker folder another process holds), or None."""
    for index in range(workers):
        where = worker_dir(overflow_dir, index)
        pid = datadir.holder(where)  # the same LOCK file and flock as a queue data dir
        if pid is not None:
            return f"{where} is in use by another node (pid {pid})"
    return None


class DiskSegments:
    """The segment files in `where` (made if missing), one open descriptor per segment; holds
    the folder's lock while it lives (OverflowDirInUse if another process has it)."""

    def __init__(self, where: str) -> None:
        os.makedirs(where, exist_ok=True)
        self.where = where
        self.fds: dict[int, int] = {}
        lock = os.open(os.path.join(where, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(lock, 0)
            os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
        except BlockingIOError:
            os.close(lock)
            raise OverflowDirInUse(f"{where} is in use by another node") from None
        self.lock = lock

    def _path(self, seg: int) -> str:
        return os.path.join(self.where, f"seg-{seg}{SUFFIX}")

    def link(self, seg: int, to: str) -> None:
        """Hard-link segment `seg` as `to`."""
        os.link(self._path(seg), to)

    def adopt(self, seg: int, path: str) -> None:
        """Make the file at `path` (a snapshot's segment) segment `seg`, by a hard link."""
        self.delete(seg)
        os.link(path, self._path(seg))
        self.fds[seg] = os.open(self._path(seg), os.O_RDWR | os.O_CLOEXEC)

    def _fd(self, seg: int) -> int:
        fd = self.fds.get(seg)
        if fd is None:
            fd = self.fds[seg] = os.open(self._path(seg), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return fd

    def write(self, seg: int, offset: int, data: bytes) -> None:
        """Write `data` at `offset` of segment `seg`; OSError (ENOSPC...) if the disk refuses."""
        fd = self._fd(seg)
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def read(self, seg: int, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` of segment `seg` (fewer at its end)."""
        fd = self.fds.get(seg)
        if fd is None:
            raise OSError(f"overflow segment {self._path(seg)} is not open")
        return os.pread(fd, size, offset)

    def delete(self, seg: int) -> None:
        """Close and remove segment `seg`."""
        fd = self.fds.pop(seg, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self._path(seg))
        except FileNotFoundError:
            pass

    def delete_all(self) -> None:
        """Close and remove every segment, those of an earlier run included."""
        for seg in list(self.fds):
            self.delete(seg)
        self.clear()

    def clear(self) -> None:
        """Remove the segment files left in `where` (by an earlier run of the worker)."""
        for name in os.listdir(self.where):
            if name.startswith("seg-") and name.endswith(SUFFIX):
                os.unlink(os.path.join(self.where, name))

    def close(self) -> None:
        """Close every descriptor (the files stay) and let the folder go."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        os.close(self.lock)

    def __len__(self) -> int:
        return len(self.fds)


def link_segments(overflow: Overflow | None, tmp: str, part: str) -> list[list[int]]:
    """Hard-link every segment with a live reference into `tmp` (made if missing) beside the
    part file named `part`; [[segment, bytes], ...] for the part's manifest entry."""
    if overflow is None or not overflow.live:
        return []
    os.makedirs(tmp, exist_ok=True)
    out = []
    for seg in sorted(overflow.live):
        to = os.path.join(tmp, segment_name(part, seg))
        overflow.files.link(seg, to)  # type: ignore[attr-defined]
        out.append([seg, os.path.getsize(to)])
    return out


def sync_segments(part_path: str, segments: Iterable[int]) -> None:
    """fsync the segment files beside the part at `part_path` (link_segments made them)."""
    for seg in segments:
        fd = os.open(segment_name(part_path, seg), os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def _part_segments(part_path: str) -> dict[int, str]:
    """segment -> path of the segment files beside the part at `part_path`."""
    folder, name = os.path.split(part_path)
    prefix = segment_name(name, 0)[:-1]
    out = {}
    for entry in os.listdir(folder or "."):
        if entry.startswith(prefix) and entry[len(prefix):].isdigit():
            out[int(entry[len(prefix):])] = os.path.join(folder, entry)
    return out


class _Files:
    """A part's segment files, read only (a SegmentFiles for an Overflow that only reads)."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.where = os.path.dirname(next(iter(paths.values()), ""))
        self.paths = paths

    def read(self, seg: int, offset: int, size: int) -> bytes:
        path = self.paths.get(seg)
        if path is None:
            raise OSError(f"no overflow segment {seg} beside the snapshot part in {self.where}")
        with open(path, "rb") as f:
            return os.pread(f.fileno(), size, offset)


class PartSegments:
    """The overflow segments of the snapshot parts one worker loads (Worker.load): `frames`
    gives each part's frames with its references renumbered into this worker's segments (or,
    with overflow off, read back into ROWS frames); `adopt`, once the queues are loaded, links
    the segments they refer to into the worker's folder."""

    def __init__(self, overflow: Overflow | None) -> None:
        self.overflow = overflow
        # Loaded segments: ours -> the snapshot's file. Numbered from above any the worker used
        # (its reset before the load adds one).
        self.files: dict[int, str] = {}
        self.next = overflow.seg + 2 if overflow is not None else 0

    def frames(self, part_path: str, frames: Iterable[Frame]) -> Iterator[Frame]:
        """The frames of the part at `part_path`, its references made this worker's."""
        segments = _part_segments(part_path)
        if self.overflow is None:
            reader = Overflow(BodyBudget(0), _Files(segments))  # type: ignore[arg-type]
            for kind, name, body in frames:
                if kind != REFS:
                    yield kind, name, body
                    continue
                rows = read_rows(body, REFS)
                bodies = reader.read_many([row[1] for row in rows])
                rows = [[row[0], data, *row[2:]] for row, data in zip(rows, bodies)]
                for kind2, body2 in rows_frames(rows):
                    assert kind2 == ROWS
                    yield kind2, name, body2
            return
        base = self.next
        for seg, path in segments.items():
            self.files[base + seg] = path
        self.next = base + (max(segments) + 1 if segments else 0)
        for kind, name, body in frames:
            yield (kind, name, rebase_refs(body, base) if kind == REFS else body)

    def adopt(self) -> None:
        """The queues are loaded (and counted by the overflow): link the segments they refer to
        into the worker's folder, and write new bodies above them."""
        overflow = self.overflow
        if overflow is None or not self.files:
            return
        for seg, path in self.files.items():
            if seg in overflow.live:
                overflow.files.adopt(seg, path)  # type: ignore[attr-defined]
        overflow.adopted(self.files)
        overflow.start_above(max(self.files))

