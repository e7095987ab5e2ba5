"""Disk helpers shared by the log (wal.py), the snapshots (snapshot.py) and the data dir
(datadir.py): the storage error, numbered file listing, whole-file reads, cutting a file durably
and replacing a file atomically."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

TMP_SUFFIX = ".tmp"  # replace_file's temporary file: path + TMP_SUFFIX


class StorageError(Exception):
    """The disk failed a write, an fsync or a file operation (full, I/O error): writes must be
    answered "storage unavailable" until a later call succeeds."""


def numbered_files(directory: str, pattern: re.Pattern) -> list[tuple[int, str]]:
    """(number, path) of every file in `directory` whose name matches `pattern` (one group: the
    number), in number order; [] if the directory does not exist."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = pattern.fullmatch(name)
        if m:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


def fsync_dir(directory: str) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """The whole content of the file at path."""
    with open(path, "rb") as f:
        return f.read()


def truncate_file(path: str, size: int) -> None:
    """Cut the file at path to size bytes, durably."""
    with open(path, "r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


def replace_file(path: str, chunks: Iterable[bytes]) -> None:
    """Make `chunks` the content of the file at path, durably and atomically: readers see the
    old file or the whole new one. Written under path + TMP_SUFFIX, which is removed again when
    the disk fails; raises OSError then."""
    tmp = path + TMP_SUFFIX
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
