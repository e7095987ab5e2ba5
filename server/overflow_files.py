"""The segment files of one worker's overflowed bodies (issue 26): `DiskSegments`, the
SegmentFiles that workers/overflow.py's `Overflow` decides for, and `worker_dir`.

Each segment is `<overflow_dir>/worker-<i>/seg-<n>.qob`, written at the offsets the Overflow
gives (pwrite: a write the disk cut short is written again at the same place), read with pread
(so a forked snapshot writer reads the same files safely). Nothing is fsync'd: the change log
makes a produce durable, and a node rebuilds its queues from snapshot and log, so the segments
of a worker are all dropped when it starts (`clear`).
"""
from __future__ import annotations

import os

SUFFIX = ".qob"


def worker_dir(overflow_dir: str, index: int) -> str:
    """Where worker `index` keeps its segments."""
    return os.path.join(overflow_dir, f"worker-{index}")


class DiskSegments:
    """The segment files in `where` (made if missing), one open descriptor per segment."""

    def __init__(self, where: str) -> None:
        os.makedirs(where, exist_ok=True)
        self.where = where
        self.fds: dict[int, int] = {}

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
        """Close every descriptor (the files stay)."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __len__(self) -> int:
        return len(self.fds)
