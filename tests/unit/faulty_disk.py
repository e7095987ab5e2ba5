"""A write-ahead log's opener and fsync for tests: files that fail on demand, like a full or
failing disk, and a count of the fsyncs asked for."""
from __future__ import annotations

import errno
import os


class Faults:
    """An opener and fsync that fail on demand, like a full or failing disk."""

    def __init__(self) -> None:
        self.write_error: int | None = None
        self.partial = 0  # with write_error: the next write writes this many bytes first
        self.truncate_error: int | None = None
        self.open_error: int | None = None
        self.fsync_errors = 0
        self.fsyncs = 0  # fsyncs that succeeded
        # The next write completes, then this is raised as a signal handler would raise it
        # (SystemExit from a SIGTERM) before the caller learns how much was written.
        self.raise_after_write: BaseException | None = None

    def opener(self, path: str) -> "FlakyFile":
        if self.open_error:
            raise OSError(self.open_error, os.strerror(self.open_error))
        return FlakyFile(open(path, "ab", buffering=0), self)

    def fsync(self, fd: int) -> None:
        if self.fsync_errors:
            self.fsync_errors -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)
        self.fsyncs += 1


class FlakyFile:
    def __init__(self, f, faults: Faults) -> None:
        self.f = f
        self.faults = faults

    def write(self, data) -> int:
        if self.faults.write_error:
            if self.faults.partial:
                n = self.f.write(bytes(data[: self.faults.partial]))
                self.faults.partial = 0
                return n
            raise OSError(self.faults.write_error, os.strerror(self.faults.write_error))
        n = self.f.write(data)
        if self.faults.raise_after_write is not None:
            exc, self.faults.raise_after_write = self.faults.raise_after_write, None
            raise exc
        return n

    def truncate(self, size: int) -> int:
        if self.faults.truncate_error:
            raise OSError(self.faults.truncate_error, os.strerror(self.faults.truncate_error))
        return self.f.truncate(size)

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        self.f.close()
