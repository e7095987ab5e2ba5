"""The bodies of a v2 snapshot's frames (replication/snapshot.py writes and checks the frames
around them): one codec shared by the queue that makes them (Queue.snapshot_frames) and the one
that loads them (Queue.load_frames).

A queue is a QUEUE frame, then ROWS frames, all named after the queue:
- QUEUE: JSON {max_size, next_id, paused, dedupe}, as in Queue.snapshot.
- ROWS: up to ROWS_MAX messages in msg_id order as binary columns, little-endian:
  ``u32 n | u32 tail length | ids q | ready d | ttl d | retry d | priority i | delivery_count I |
  payload lengths I | payload bytes (UTF-8, surrogatepass) | JSON tail``;
  the tail lists the rows with a lease, token or extra settings: [[row, lease, token, extra], ...].
- REFS (issue 26): messages whose bodies overflowed to disk (workers/overflow.py), as ROWS but
  with no payload bytes: ``u32 n | u32 tail length | ids q | ready d | ttl d | retry d |
  priority i | delivery_count I | body lengths I | places Q | JSON tail``, a place being the
  segment << 32 | the record's offset in it. The segment files are the part's
  (replication/snapshot.py: ``<part>.seg-<n>``); a ROWS and a REFS frame follow one another in
  msg_id order as the bodies are in memory or on disk.
- END closes a part (counts of queues and messages, and the bytes before it).

Rows are those of Queue.snapshot: [msg_id, data, ready, ttl, retry, priority, delivery_count,
lease, token, extra] (the last three optional); in a REFS frame data is the reference `int`
(workers/overflow.py `ref`). Pure: no I/O.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import NamedTuple

import orjson

QUEUE, ROWS, END, REFS = 1, 2, 3, 4
MESSAGES = (ROWS, REFS)  # the kinds that hold messages
Frame = tuple[int, str, bytes]  # kind, queue name, body (any bytes-like object)
ROWS_MAX = 16_384  # messages in one ROWS frame
ROWS_BYTES = 4 << 20  # payload bytes after which a ROWS frame is closed early

_HEAD = struct.Struct("<II")  # rows, tail length
_COLUMNS = ("q", "d", "d", "d", "i", "I")  # msg_id, ready, ttl, retry, priority, delivery_count
_SWAP = sys.byteorder != "little"
_LOW = (1 << 32) - 1
_PLACE = 32  # a reference's bits below its segment and offset (workers/overflow.py ref)


def queue_body(max_size: int, next_id: int, paused: bool, dedupe: list) -> bytes:
    """A QUEUE frame's body."""
    return orjson.dumps({"max_size": max_size, "next_id": next_id, "paused": paused, "dedupe": dedupe})


def read_queue(body: bytes) -> dict:
    """A QUEUE frame's settings (Queue.snapshot's keys but name and messages)."""
    meta = orjson.loads(body)
    if not isinstance(meta, dict):
        raise ValueError("a QUEUE frame is not an object")
    return meta


def rows_bodies(rows: Iterable[list]) -> Iterator[bytes]:
    """ROWS bodies of `rows` (every body a `str`), each at most ROWS_MAX rows and about
    ROWS_BYTES of payload."""
    return (body for _, body in rows_frames(rows))


def rows_frames(rows: Iterable[list]) -> Iterator[tuple[int, bytes]]:
    """(kind, body) of ROWS and REFS frames of `rows` in order: a run of rows whose data is a
    `str` makes ROWS frames, one whose data is a reference (`int`) REFS frames; each at most
    ROWS_MAX rows and about ROWS_BYTES of payload."""
    chunk: list[list] = []
    size = 0
    refs = False
    for row in rows:
        is_ref = type(row[1]) is int
        if chunk and (is_ref is not refs or len(chunk) == ROWS_MAX or size >= ROWS_BYTES):
            yield (REFS, _encode_refs(chunk)) if refs else (ROWS, _encode(chunk))
            chunk, size = [], 0
        refs = is_ref
        chunk.append(row)
        if not is_ref:
            size += len(row[1])
    if chunk:
        yield (REFS, _encode_refs(chunk)) if refs else (ROWS, _encode(chunk))


def _state_columns(rows: list[list]) -> list[array]:
    return [array(code, [row[i] for row in rows]) for i, code in zip((0, 2, 3, 4, 5, 6), _COLUMNS)]


def _tail(rows: list[list]) -> bytes:
    return orjson.dumps([[i, *row[7:]] for i, row in enumerate(rows)
                         if len(row) > 8 or (len(row) == 8 and row[7] is not None)])


def _joined(columns: list[array], payload: bytes, tail: bytes, n: int) -> bytes:
    if _SWAP:
        for column in columns:
            column.byteswap()
    return b"".join([_HEAD.pack(n, len(tail)), *(c.tobytes() for c in columns), payload, tail])


def _encode(rows: list[list]) -> bytes:
    columns = _state_columns(rows)
    datas = [row[1] for row in rows]
    joined = "".join(datas)
    payload = joined.encode("utf-8", "surrogatepass")
    if len(payload) == len(joined):  # ASCII: a character is a byte
        lengths = array("I", map(len, datas))
    else:
        encoded = [d.encode("utf-8", "surrogatepass") for d in datas]
        lengths = array("I", map(len, encoded))
    columns.append(lengths)
    return _joined(columns, payload, _tail(rows), len(rows))


def _encode_refs(rows: list[list]) -> bytes:
    columns = _state_columns(rows)
    refs = [row[1] for row in rows]
    columns.append(array("I", [r & _LOW for r in refs]))
    columns.append(array("Q", [r >> _PLACE for r in refs]))
    return _joined(columns, b"", _tail(rows), len(rows))


def rows_count(body: bytes) -> int:
    """How many messages a ROWS body holds."""
    return _HEAD.unpack_from(body)[0]


class Rows(NamedTuple):
    """A ROWS or REFS body's columns: msg_ids, ready, ttl, retry, priority and delivery_count
    (arrays), the data (a list: a ROWS body's payloads as `str`, a REFS body's references as
    `int`), and the tail: [row, lease, token, extra] (the last two optional) of each row that has
    a lease, a token or extra settings."""

    ids: array
    ready: array
    ttl: array
    retry: array
    priority: array
    delivery_count: array
    datas: list[str] | list[int]
    tail: list[list]


def read_columns(body: bytes, kind: int = ROWS) -> Rows:
    """The columns of a ROWS (or REFS) body (ValueError when it is malformed)."""
    view = memoryview(body)
    n, tail_length = _HEAD.unpack_from(view)
    at = _HEAD.size
    columns = []
    for code in (*_COLUMNS, "I", "Q") if kind == REFS else (*_COLUMNS, "I"):
        column = array(code)
        end = at + n * column.itemsize
        if end > len(view):
            raise ValueError("a ROWS frame is shorter than its columns")
        column.frombytes(view[at:end])
        if _SWAP:
            column.byteswap()
        columns.append(column)
        at = end
    datas: list[str] | list[int]
    if kind == REFS:
        places = columns.pop()
        lengths = columns.pop()
        if at + tail_length != len(view):
            raise ValueError("a REFS frame's columns and tail do not fill it")
        datas = [p << _PLACE | k for p, k in zip(places, lengths)]
        size = 0
    else:
        lengths = columns.pop()
        ends = list(accumulate(lengths))
        size = ends[-1] if ends else 0
        if at + size + tail_length != len(view):
            raise ValueError("a ROWS frame's payloads and tail do not fill it")
        payload = view[at:at + size]
        text = str(payload, "utf-8", "surrogatepass")
        if len(text) == size:  # ASCII: slice the text by byte offsets
            datas = [text[a:b] for a, b in zip([0, *ends], ends)]
        else:
            datas = [str(payload[a:b], "utf-8", "surrogatepass") for a, b in zip([0, *ends], ends)]
    tail = orjson.loads(view[at + size:])
    if not isinstance(tail, list) or not all(isinstance(t, list) and 2 <= len(t) <= 4 and type(t[0]) is int
                                             and 0 <= t[0] < n for t in tail):
        raise ValueError("a ROWS frame's tail is not a list of [row, lease, token, extra]")
    return Rows(*columns, datas, tail)


def read_rows(body: bytes, kind: int = ROWS) -> list[tuple]:
    """The rows of a ROWS (or REFS) body (tuples; ValueError when it is malformed). In a REFS
    body's rows, data is the reference (an `int`)."""
    r = read_columns(body, kind)
    rows: list[tuple] = list(zip(r.ids.tolist(), r.datas, r.ready.tolist(), r.ttl.tolist(), r.retry.tolist(),
                                 r.priority.tolist(), r.delivery_count.tolist()))
    for i, *rest in r.tail:
        rows[i] = (*rows[i], *rest)
    return rows


def rebase_refs(body: bytes, base: int) -> bytes:
    """A REFS body whose references name segment `base` + n where `body`'s name segment n (a
    loader gives the segments of several parts numbers of its own)."""
    view = memoryview(body)
    n, _ = _HEAD.unpack_from(view)
    at = _HEAD.size + (sum(array(code).itemsize for code in _COLUMNS) + 4) * n
    places = array("Q")
    places.frombytes(view[at:at + 8 * n])
    if _SWAP:
        places.byteswap()
    add = base << _PLACE
    places = array("Q", [p + add for p in places])
    if _SWAP:
        places.byteswap()
    return b"".join((view[:at], places.tobytes(), view[at + 8 * n:]))


def columns_of(frames: Iterable[Frame]) -> Iterator[Rows]:
    """The columns of a queue's ROWS and REFS frames, in order (ValueError at a frame of another
    kind)."""
    for kind, name, body in frames:
        if kind not in MESSAGES:
            raise ValueError(f"queue {name!r}: frame of kind {kind} where rows were expected")
        yield read_columns(body, kind)
