"""Snapshots of the queue state on disk, each consistent with one trans_id.

Format 2 (written). A snapshot is a manifest ``snapshot-<trans_id:020d>.snap``, JSON
``{"format": 2, "trans_id", "vote_id", "parts": [{"file", "bytes", "queues", "messages"}]}``,
naming part files in a directory ``parts-<trans_id:020d>-<stamp>/`` beside it. A part is

    magic ``QSPART\\0\\2`` | trans_id u64 | frames

and a frame ``u32 length | u32 crc32 | u8 kind | u16 name length | name | body``, little-endian;
length and crc (zlib's crc32) cover kind to body. The kinds and their bodies are
protocol/snapshot_frames.py's; a part ends with an END frame, JSON {"queues", "messages",
"bytes"} (bytes: the part's size before END). Parts are written into ``tmp-<...>/``, fsync'd,
the directory is renamed and fsync'd, and only then is the manifest written (replace_file): that
publishes the snapshot.

A part whose REFS frames refer to overflowed bodies (issue 26) relies on segment files beside it,
``<part file>.seg-<n>`` (hard links to the worker's segments, fsync'd by the part's writer): its
entry lists them, ``"segments": [[n, bytes], ...]`` (bytes: how much of the file it needs). They
are the snapshot's files after the parts (manifest_files: they are streamed to followers too); a
snapshot whose segment file is missing or shorter is invalid. A leftover tmp directory or file, or a parts directory that no manifest
names, is deleted (clean: at start and after each snapshot).

A snapshot is valid when its manifest reads and every part is whole: a torn frame, a bad crc,
a missing END or part, or counts that differ from the manifest's make it invalid, and the
reader takes the older one (latest_manifest).

Format 1 (read only, read_v1): one file ``snapshot-<trans_id:020d>.snap``:
magic 8 bytes | trans_id u64 | vote_id u64 | body length u64 | orjson body | crc32 u32.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from queue_server.protocol.snapshot_frames import END, MESSAGES, QUEUE, Frame, rows_count
from queue_server.replication.disk import TMP_SUFFIX, StorageError, fsync_dir, numbered_files, read_file, replace_file
from queue_server.replication.transfer import file_entries, segment_name

_log = logging.getLogger(__name__)

_MAGIC = b"QSNAP\x00\x00\x01"
_HEADER = struct.Struct("<8sQQQ")  # v1: magic, trans_id, vote_id, body length
_TRAILER = struct.Struct("<I")
PART_MAGIC = b"QSPART\x00\x02"
_PART_HEADER = struct.Struct("<8sQ")  # magic, trans_id
_FRAME = struct.Struct("<II")  # length, crc32 of what follows
_KIND = struct.Struct("<BH")  # kind, name length
_NAME_RE = re.compile(r"snapshot-(\d{20})\.snap")
_PARTS_PREFIX, _TMP_PREFIX = "parts-", "tmp-"
_BUFFER = 1 << 20
KEEP = 2


def snapshot_name(trans_id: int) -> str:
    """File name of the snapshot (its manifest) at trans_id."""
    return f"snapshot-{trans_id:020d}.snap"


def _snapshots(directory: str) -> list[tuple[int, str]]:
    return numbered_files(directory, _NAME_RE)


def snapshot_trans_ids(directory: str) -> list[int]:
    """trans_ids of the snapshot files present (valid or not), oldest first."""
    return [trans_id for trans_id, _ in _snapshots(directory)]


# --------------------------------------------------------------------- writing


class PartWriter:
    """Writes one part file as frames come: the header, the frames, then END at finish().
    A worker's writer does not know T yet: it writes 0, and publish() stamps T."""

    def __init__(self, path: str, trans_id: int = 0) -> None:
        self.path = path
        self._file = open(path, "wb", buffering=_BUFFER)
        self._file.write(_PART_HEADER.pack(PART_MAGIC, trans_id))
        self.size = _PART_HEADER.size
        self.queues = self.messages = 0

    def write(self, kind: int, name: str, body: bytes) -> None:
        """Append one frame."""
        encoded = name.encode()
        head = _KIND.pack(kind, len(encoded))
        length = len(head) + len(encoded) + len(body)
        crc = zlib.crc32(body, zlib.crc32(encoded, zlib.crc32(head)))
        self._file.write(_FRAME.pack(length, crc))
        self._file.write(head + encoded)
        self._file.write(body)
        self.size += _FRAME.size + length
        if kind == QUEUE:
            self.queues += 1
        elif kind in MESSAGES:
            self.messages += rows_count(body)

    def finish(self) -> dict:
        """Write END, fsync and close; the part's manifest entry (file: the base name)."""
        counts = {"queues": self.queues, "messages": self.messages}
        self.write(END, "", orjson.dumps({**counts, "bytes": self.size}))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"file": os.path.basename(self.path), "bytes": self.size, **counts}

    def close(self) -> None:
        """Close without finishing (after a failure)."""
        self._file.close()


def write_snapshot(directory: str, trans_id: int, vote_id: int, frames: Iterable[Frame],
                   keep_from: int | None = None) -> str:
    """Write `frames` (protocol/snapshot_frames.py) as the snapshot at (trans_id, vote_id),
    streaming, durably; keep the newest KEEP snapshots, and any from `keep_from` on (the newest
    one known valid, so that newer damaged ones do not push it out), and delete older ones.
    Returns the manifest's path. Raises StorageError when the disk fails (nothing is left
    behind then)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f"{_TMP_PREFIX}{trans_id:020d}-{time.time_ns():x}")
    try:
        os.mkdir(tmp)
        part = write_part(os.path.join(tmp, "part-0.qsp"), frames, trans_id)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise StorageError(f"cannot write snapshot {snapshot_name(trans_id)}: {e}") from e
        raise
    return publish(directory, tmp, trans_id, vote_id, [part], keep_from)


def write_part(path: str, frames: Iterable[Frame], trans_id: int = 0) -> dict:
    """Write `frames` as the part file at path, durably; its manifest entry (PartWriter.finish)."""
    writer = PartWriter(path, trans_id)
    try:
        for kind, name, body in frames:
            writer.write(kind, name, body)
        return writer.finish()
    finally:
        writer.close()


def publish(directory: str, tmp: str, trans_id: int, vote_id: int, parts: list[dict],
            keep_from: int | None = None) -> str:
    """Publish the part files written into directory `tmp` (their entries: file names in tmp,
    bytes, queues, messages) as the snapshot at (trans_id, vote_id): stamp T in each part, fsync
    them, rename the directory, write the manifest; then prune as write_snapshot does. Returns
    the manifest's path. Raises StorageError (tmp is then deleted)."""
    stamp = f"{trans_id:020d}-{time.time_ns():x}"
    final = os.path.join(directory, _PARTS_PREFIX + stamp)
    path = os.path.join(directory, snapshot_name(trans_id))
    try:
        entries = []
        for part in parts:
            with open(os.path.join(tmp, part["file"]), "r+b") as f:
                f.write(_PART_HEADER.pack(PART_MAGIC, trans_id))
                f.flush()
                os.fsync(f.fileno())
            entries.append({**part, "file": f"{os.path.basename(final)}/{part['file']}"})
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(directory)
        manifest = {"format": 2, "trans_id": trans_id, "vote_id": vote_id, "parts": entries}
        replace_file(path, (orjson.dumps(manifest),))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise StorageError(f"cannot write snapshot {path}: {e}") from e
        raise
    _prune(directory, keep_from)
    return path


def read_end(path: str) -> dict:
    """The manifest entry of the part file at path, from its END frame: {file (base name), bytes,
    queues, messages}. ValueError when the part does not end with a whole END frame."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(_PART_HEADER.size, size - 256)  # an END frame is a few dozen bytes
        f.seek(start)
        tail = f.read()
    for at in range(len(tail) - _FRAME.size - _KIND.size, -1, -1):
        length, crc = _FRAME.unpack_from(tail, at)
        frame = tail[at + _FRAME.size:]
        if length != len(frame) or zlib.crc32(frame) != crc or _KIND.unpack_from(frame) != (END, 0):
            continue
        try:
            end = orjson.loads(frame[_KIND.size:])
        except orjson.JSONDecodeError:
            break
        if isinstance(end, dict) and end.get("bytes") == start + at:
            return {"file": os.path.basename(path), "bytes": size,
                    "queues": end.get("queues"), "messages": end.get("messages")}
        break
    raise ValueError(f"{path}: no END frame (not finished?)")


def _prune(directory: str, keep_from: int | None) -> None:
    """Delete snapshots older than the newest KEEP and than `keep_from`, then the parts
    directories no manifest names (clean, sparing tmp directories: the workers may be writing
    the next cut's parts already)."""
    found = _snapshots(directory)
    floor = found[-KEEP][0] if len(found) >= KEEP else 0
    if keep_from is not None:
        floor = min(floor, keep_from)
    for trans_id, path in found:
        if trans_id < floor:
            _remove(path)
    clean(directory, tmp=False)


def clean(directory: str, tmp: bool = True) -> None:
    """Delete what a crash or a failed snapshot left: tmp directories and files (unless not
    `tmp`), and parts directories that no manifest names."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    named = set()
    for _, path in _snapshots(directory):
        try:
            named.update(p["file"].split("/")[0] for p in _parse_manifest(path)["parts"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # a v1 file or a damaged manifest names no parts
    for name in names:
        if (tmp and (name.startswith(_TMP_PREFIX) or name.endswith(TMP_SUFFIX))) or (
                name.startswith(_PARTS_PREFIX) and name not in named):
            _remove(os.path.join(directory, name))


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except OSError as e:  # not worth failing a snapshot that is already safe
        _log.warning("cannot delete old snapshot file %s: %s", path, e)


# --------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Manifest:
    """A valid snapshot on disk: v2 (its part files, checked) or v1 (its whole state)."""

    trans_id: int
    vote_id: int
    path: str
    parts: tuple[str, ...] = ()  # v2: paths of the part files
    entries: tuple[dict, ...] = ()  # v2: the manifest's part entries (file, bytes, queues, messages)
    state: dict | None = field(default=None, compare=False)  # v1 only

    def as_dict(self) -> dict:
        """The manifest as written (v2), or {"format": 1, ...} for a v1 file."""
        return {"format": 1 if self.state is not None else 2, "trans_id": self.trans_id,
                "vote_id": self.vote_id, "parts": list(self.entries)}


def _parse_manifest(path: str) -> dict:
    data = read_file(path)
    if data.startswith(_MAGIC):
        raise ValueError("a v1 snapshot, not a manifest")
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"manifest is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != 2:
        raise ValueError("not a format 2 manifest")
    return manifest


def read_manifest(path: str) -> Manifest:
    """The snapshot whose manifest (or v1 file) is at path, with every part checked
    (iter_frames); ValueError or OSError says what is wrong."""
    with open(path, "rb") as f:
        v1 = f.read(len(_MAGIC)) == _MAGIC
    if v1:
        trans_id, vote_id, state = read_v1(path)
        return Manifest(trans_id, vote_id, path, state=state)
    manifest = _parse_manifest(path)
    try:
        trans_id, vote_id, entries = manifest["trans_id"], manifest["vote_id"], manifest["parts"]
        files = [os.path.join(os.path.dirname(path), *e["file"].split("/")) for e in entries]
    except (KeyError, TypeError, AttributeError):
        raise ValueError("manifest lacks trans_id, vote_id or parts") from None
    _check_name(path, trans_id)
    snapshot = Manifest(trans_id, vote_id, path, tuple(files), tuple(entries))
    for file, entry in zip(files, entries):
        check_segments(file, entry)
    for _ in read_parts(snapshot):
        pass
    return snapshot


def manifest_files(path: str) -> tuple[int, int, tuple[tuple[str, int], ...]]:
    """(trans_id, vote_id, files) of the v2 snapshot whose manifest is at path, unchecked: files
    are the manifest and then each part, as (path, bytes). ValueError or OSError says what is
    wrong (a v1 snapshot has no files to give)."""
    manifest = _parse_manifest(path)
    try:
        parts = tuple((os.path.join(os.path.dirname(path), *e["file"].split("/")), e["bytes"])
                      for e in file_entries(manifest))
        return manifest["trans_id"], manifest["vote_id"], ((path, os.path.getsize(path)),) + parts
    except (KeyError, TypeError, AttributeError):
        raise ValueError("manifest lacks trans_id, vote_id or parts") from None


def check_segments(path: str, entry: dict) -> None:
    """ValueError unless every segment file the part at `path` relies on is there, long enough."""
    for seg, size in entry.get("segments", ()):
        name = segment_name(path, seg)
        try:
            have = os.path.getsize(name)
        except OSError:
            raise ValueError(f"overflow segment {name} is missing") from None
        if have < size:
            raise ValueError(f"overflow segment {name} holds {have} bytes where {size} are needed")


def read_parts(snapshot: Manifest) -> Iterator[Frame]:
    """The QUEUE and ROWS frames of every part of `snapshot`, read as they are consumed
    (ValueError at a damaged part: see iter_frames)."""
    for path, entry in zip(snapshot.parts, snapshot.entries):
        yield from iter_frames(path, snapshot.trans_id, entry)


def iter_frames(path: str, trans_id: int | None = None, expect: dict | None = None) -> Iterator[Frame]:
    """The QUEUE and ROWS frames of the part file at path, each checked (crc) as it is read;
    ValueError names a bad header (or one of another trans_id), a torn frame, a bad crc, a
    missing END, or an END (or the manifest's `expect` entry) whose counts differ from the part."""
    with open(path, "rb", buffering=_BUFFER) as f:
        size = os.fstat(f.fileno()).st_size
        if expect is not None and expect.get("bytes") != size:
            raise ValueError(f"{path}: {size} bytes where the manifest says {expect.get('bytes')}")
        header = f.read(_PART_HEADER.size)
        if len(header) < _PART_HEADER.size or _PART_HEADER.unpack(header)[0] != PART_MAGIC:
            raise ValueError(f"{path}: not a snapshot part (bad header)")
        if trans_id is not None and _PART_HEADER.unpack(header)[1] != trans_id:
            raise ValueError(f"{path}: holds trans_id {_PART_HEADER.unpack(header)[1]}, not {trans_id}")
        at = len(header)
        queues = messages = 0
        while True:
            pre = f.read(_FRAME.size)
            if not pre:
                raise ValueError(f"{path}: no END frame (truncated?)")
            length, crc = _FRAME.unpack(pre) if len(pre) == _FRAME.size else (size, 0)
            if at + _FRAME.size + length > size or length < _KIND.size:
                raise ValueError(f"{path}: torn frame at offset {at}")
            data = f.read(length)
            if zlib.crc32(data) != crc:
                raise ValueError(f"{path}: checksum mismatch in the frame at offset {at}")
            kind, name_length = _KIND.unpack_from(data)
            view = memoryview(data)
            body = view[_KIND.size + name_length:]
            if kind == END:
                _check_end(path, body, {"queues": queues, "messages": messages, "bytes": at}, expect)
                if at + _FRAME.size + length != size:
                    raise ValueError(f"{path}: bytes after the END frame")
                return
            if kind != QUEUE and kind not in MESSAGES:
                raise ValueError(f"{path}: frame of unknown kind {kind} at offset {at}")
            if kind == QUEUE:
                queues += 1
            else:
                messages += rows_count(body)
            yield kind, str(view[_KIND.size:_KIND.size + name_length], "utf-8"), body
            at += _FRAME.size + length


def _check_end(path: str, body: memoryview, counted: dict, expect: dict | None) -> None:
    try:
        end = orjson.loads(body)
    except orjson.JSONDecodeError:
        end = None
    if end != counted:
        raise ValueError(f"{path}: END says {end}, the part holds {counted}")
    if expect is not None and (expect.get("queues"), expect.get("messages")) != (end["queues"], end["messages"]):
        raise ValueError(f"{path}: the manifest says {expect}, the part holds {counted}")


def _check_name(path: str, trans_id: int) -> None:
    m = _NAME_RE.fullmatch(os.path.basename(path))
    if m and int(m.group(1)) != trans_id:
        raise ValueError(f"holds trans_id {trans_id}, not the one in its name")


def latest_manifest(directory: str, warn: Callable[[str], object] = _log.warning) -> Manifest | None:
    """The newest valid snapshot (v2 or v1), or None when there is none. Invalid newer ones
    are skipped with one warning line each."""
    for _, path in reversed(_snapshots(directory)):
        try:
            return read_manifest(path)
        except (OSError, ValueError) as e:
            warn(f"skipping snapshot {path}: {e}")
    return None


def read_v1(path: str) -> tuple[int, int, dict]:
    """(trans_id, vote_id, state) of the format 1 snapshot file at path; ValueError says what
    is wrong."""
    data = read_file(path)
    if len(data) < _HEADER.size + _TRAILER.size:
        raise ValueError(f"only {len(data)} bytes")
    magic, trans_id, vote_id, length = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not a snapshot file (bad magic)")
    _check_name(path, trans_id)
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
