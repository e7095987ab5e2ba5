"""The reply batch: how replies travel between processes (worker -> coordinator in a BATCH,
coordinator -> acceptor in a REP). One blob holds the newline-terminated JSON replies back to
back; the header says, per reply, its origin, its request number and where it ends in the blob:
[[conn, udp, node, req_no, end], ...]. Replies are never decoded on the way."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from queue_server.protocol.origin import Origin

_DUMPS = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_LOADS = orjson.loads


def encode(replies: Iterable[tuple[Origin, int, dict]]) -> tuple[bytes, bytes]:
    """(origin, req_no, reply dict) triples as a header and a blob."""
    return _batch(replies, True)


def encode_raw(replies: Iterable[tuple[Origin, int, bytes]]) -> tuple[bytes, bytes]:
    """(origin, req_no, encoded reply) triples as a header and a blob."""
    return _batch(replies, False)


def _batch(replies: Iterable[tuple[Origin, int, Any]], dump: bool) -> tuple[bytes, bytes]:
    """The header and blob of replies given as dicts (`dump`) or as their encoded bytes (one
    loop, no generator between: this is every reply's path)."""
    header = []
    chunks = []
    end = 0
    for (conn, udp, node), req_no, data in replies:
        if dump:
            data = _DUMPS(data, option=_NEWLINE)
        end += len(data)
        chunks.append(data)
        header.append((conn, udp, node, req_no, end))
    return _DUMPS(header), b"".join(chunks)


def rows(header: bytes) -> list[list]:
    """A header's rows, [conn, udp, node, req_no, end] per reply: decode's, for a reader that
    slices the blob itself (a reply ends at `end` and starts where the one before it ended)."""
    return _LOADS(header)


def decode(header: bytes, blob: Any) -> Iterator[tuple[Origin, int, Any]]:
    """The (origin, req_no, encoded reply) triples of a header and blob (slices of `blob`)."""
    start = 0
    for conn, udp, node, req_no, end in rows(header):
        yield Origin(conn, udp, node), req_no, blob[start:end]
        start = end


def decoded(data: Any) -> Any:
    """An encoded reply (or forwarded request) as its JSON value; None if it does not parse."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def naming(reply: Any) -> dict:
    """The fields of a decoded reply that name its request (action, queue, seq), for an error
    reply that takes its place (the other fields are results it no longer carries)."""
    if type(reply) is not dict:
        return {}
    return {k: reply[k] for k in ("action", "queue", "seq") if k in reply}
