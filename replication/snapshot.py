"""Snapshots of the queue state on disk, each consistent with one trans_id.

A snapshot is ``snapshot-<trans_id:020d>.snap``:

    magic 8 bytes | trans_id u64 | vote_id u64 | body length u64 | orjson body | crc32 u32

little-endian; the crc (zlib's crc32) covers the header and the body. It is written under a
temporary name, fsync'd, renamed and the directory fsync'd, so a snapshot file either is whole or
does not exist under its final name; a leftover temporary file is ignored and later deleted.

The body is whatever dict the caller gives. For large queues prefer columns (one list per field)
over one dict per message: orjson writes and reads lists of numbers and strings much faster, and
the reader builds far fewer Python objects.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Callable

import orjson

from queue_server.replication.disk import TMP_SUFFIX, StorageError, numbered_files, read_file, replace_file

_log = logging.getLogger(__name__)

_MAGIC = b"QSNAP\x00\x00\x01"
_HEADER = struct.Struct("<8sQQQ")  # magic, trans_id, vote_id, body length
_TRAILER = struct.Struct("<I")
_NAME_RE = re.compile(r"snapshot-(\d{20})\.snap")
KEEP = 2


def snapshot_name(trans_id: int) -> str:
    """File name of the snapshot at trans_id."""
    return f"snapshot-{trans_id:020d}.snap"


def _snapshots(directory: str) -> list[tuple[int, str]]:
    return numbered_files(directory, _NAME_RE)


def snapshot_trans_ids(directory: str) -> list[int]:
    """trans_ids of the snapshot files present (valid or not), oldest first."""
    return [trans_id for trans_id, _ in _snapshots(directory)]


def write_snapshot(directory: str, trans_id: int, vote_id: int, state: dict) -> str:
    """Write `state` as the snapshot at (trans_id, vote_id), durably; keep the newest KEEP
    snapshots and delete older ones. Returns the path. Raises StorageError when the disk fails
    (nothing is left behind then)."""
    os.makedirs(directory, exist_ok=True)
    body = orjson.dumps(state)
    header = _HEADER.pack(_MAGIC, trans_id, vote_id, len(body))
    crc = zlib.crc32(body, zlib.crc32(header))
    path = os.path.join(directory, snapshot_name(trans_id))
    try:
        replace_file(path, (header, body, _TRAILER.pack(crc)))
    except OSError as e:
        raise StorageError(f"cannot write snapshot {path}: {e}") from e
    _prune(directory)
    return path


def _prune(directory: str) -> None:
    """Delete snapshots older than the newest KEEP, and leftover temporary files."""
    doomed = [p for _, p in _snapshots(directory)[:-KEEP]]
    doomed += [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(TMP_SUFFIX)]
    for path in doomed:
        try:
            os.remove(path)
        except OSError as e:  # not worth failing a snapshot that is already safe
            _log.warning("cannot delete old snapshot file %s: %s", path, e)


def read_snapshot(path: str) -> tuple[int, int, dict]:
    """(trans_id, vote_id, state) of the snapshot file at path; ValueError says what is wrong."""
    data = read_file(path)
    if len(data) < _HEADER.size + _TRAILER.size:
        raise ValueError(f"only {len(data)} bytes")
    magic, trans_id, vote_id, length = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not a snapshot file (bad magic)")
    m = _NAME_RE.fullmatch(os.path.basename(path))
    if m and int(m.group(1)) != trans_id:
        raise ValueError(f"holds trans_id {trans_id}, not the one in its name")
    end = _HEADER.size + length
    if len(data) != end + _TRAILER.size:
        raise ValueError(f"{len(data)} bytes where {end + _TRAILER.size} were expected (truncated?)")
    view = memoryview(data)
    (crc,) = _TRAILER.unpack_from(data, end)
    if zlib.crc32(view[:end]) != crc:
        raise ValueError("checksum mismatch")
    try:
        state = orjson.loads(view[_HEADER.size : end])
    except orjson.JSONDecodeError as e:
        raise ValueError(f"body is not valid JSON: {e}") from None
    if not isinstance(state, dict):
        raise ValueError("body is not an object")
    return trans_id, vote_id, state


def read_latest_snapshot(
    directory: str, warn: Callable[[str], object] = _log.warning
) -> tuple[int, int, dict] | None:
    """(trans_id, vote_id, state) of the newest valid snapshot, or None when there is none.
    Invalid newer ones are skipped with a warning."""
    for _, path in reversed(_snapshots(directory)):
        try:
            return read_snapshot(path)
        except (OSError, ValueError) as e:
            warn(f"skipping snapshot {path}: {e}")
    return None
