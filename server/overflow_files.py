"""The segment files of one worker's overflowed bodies (issue 26): `DiskSegments`, the
SegmentFiles that workers/overflow.py's `Overflow` decides for, and `worker_dir`.

Each segment is `<overflow_dir>/worker-<i>/seg-<n>.qob`, written at the offsets the Overflow
gives (pwrite: a write the disk cut short is written again at the same place), read with pread
(so a forked snapshot writer reads the same files safely). Nothing is fsync'd: the change log
makes a produce durable, and a node rebuilds its queues from snapshot and log, so the segments
of a worker are all dropped when it starts (`clear`). So two nodes must never share a folder:
the worker holds an flock on `worker-<i>/LOCK` (with its pid) while it runs, and the supervisor's
preflight checks it is free (`in_use`).
"""
from __future__ import annotations

import fcntl
import os

from queue_server.replication import datadir

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
