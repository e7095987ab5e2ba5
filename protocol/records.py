"""The change-log records: one type per kind, and their one JSON codec.

Every change a worker decides is a record. It travels as JSON from the worker to the coordinator,
into the log, to the peers and to disk, always through `encode` / `decode` here. The JSON is an
object whose "op" names the kind; a field that is None is left out (the lease of a consume is
the one exception: null there means the message was deleted), so files and peers written before
these types existed read the same.

Several kinds have a single form (`msg_id`, `delivery_count`) and a list form (`msg_ids`,
`delivery_counts`), one decision for many messages; a record has exactly one of the two.
"""
from __future__ import annotations

from typing import Union

import msgspec

__all__ = [
    "Consume", "Confirm", "DeadLetter", "DeleteQueue", "DlqReplay", "Expire", "Noop", "Pause",
    "Encoded", "Produce", "Purge", "Record", "RecordError", "Release", "Restore", "decode", "decode_many",
    "count", "each_encoded", "encode", "encode_many", "join_encoded",
]


class RecordError(ValueError):
    """Bytes that are not a valid record (or list of records); the message names what is wrong."""


class _Record(msgspec.Struct, tag_field="op", omit_defaults=True, kw_only=True):
    """Base of every record kind (the "op" tag is the kind's name)."""


class _Single(_Record, kw_only=True):
    """A record in the single form (msg_id) or the list form (msg_ids)."""

    queue: str
    msg_id: int | None = None
    msg_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if (self.msg_id is None) == (self.msg_ids is None):
            raise ValueError("needs exactly one of msg_id and msg_ids")


class Produce(_Record, tag="produce", kw_only=True):
    """A new message, stored under the msg_id and ready time the leader chose. producer and
    sequence: an idempotent produce (remembered in the queue's dedupe window); max_deliveries:
    the produce's own limit, replacing the queue's."""

    queue: str
    msg_id: int
    ready: float
    ttl: float
    retry: float
    priority: int
    data: str
    delivery_count: int
    producer: str | None = None
    sequence: int | None = None
    max_deliveries: int | None = None


class Restore(Produce, tag="restore", kw_only=True):
    """An at-most-once message given back undelivered: stored again as a produce would store it,
    its delivery_count one lower (not counted as produced)."""


class Consume(_Single, tag="consume", kw_only=True):
    """A delivery or a lease moved (extend): the message is leased until `lease` (absolute), or
    with lease None deleted (at most once). delivery_count(s) after it; token: the lease token
    it is bound to. The list form always has a lease."""

    lease: float | None
    delivery_count: int | None = None
    delivery_counts: list[int] | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if self.msg_ids is None:
            if self.msg_id is None or self.delivery_count is None:
                raise ValueError("needs msg_id and delivery_count, or msg_ids and delivery_counts")
        elif (self.msg_id is not None or self.delivery_counts is None
              or len(self.delivery_counts) != len(self.msg_ids) or self.lease is None):
            raise ValueError("msg_ids needs one delivery_count each and a lease")


class Confirm(_Single, tag="confirm", kw_only=True):
    """Messages deleted by a confirm."""


class Release(_Single, tag="release", kw_only=True):
    """Leases given back or run out: the messages are ready again at `ready`; the single form
    sets delivery_count, the list form keeps each message's."""

    ready: float
    delivery_count: int | None = None


class Expire(_Single, tag="expire", kw_only=True):
    """Messages removed at the end of their life with no dead-letter queue to go to; reason
    "max_deliveries" when that limit, not the ttl, ended it."""

    reason: str | None = None


class DeadLetter(_Record, tag="dead_letter", kw_only=True):
    """A message moved to the dead-letter queue `dlq` under the msg_id `dlq_msg_id` and ready time
    the leader chose; reason "ttl" or "max_deliveries"."""

    queue: str
    msg_id: int
    reason: str
    dlq: str
    dlq_msg_id: int
    ready: float


class Pause(_Record, tag="pause", kw_only=True):
    """The queue paused (consumes deliver nothing) or resumed."""

    queue: str
    paused: bool


class Purge(_Record, tag="purge", kw_only=True):
    """Every stored message of the queue deleted; count: how many there were."""

    queue: str
    count: int


class DlqReplay(_Record, tag="dlq_replay", kw_only=True):
    """Dead letters moved from `dlq` back to the queue, ready at `ready`: each move is
    [dead msg_id, new msg_id, ttl]."""

    queue: str
    dlq: str
    moves: list[tuple[int, int, float]]
    ready: float


class DeleteQueue(_Record, tag="delete_queue", kw_only=True):
    """The queue and its messages removed."""

    queue: str


class Noop(_Record, tag="noop", kw_only=True):
    """Nothing: a new leader's first entry, so that its term's commit carries earlier ones."""


Record = Union[Produce, Restore, Consume, Confirm, Release, Expire, DeadLetter, Pause, Purge,
               DlqReplay, DeleteQueue, Noop]

Encoded = Union[bytes, msgspec.Raw]
"""One record's JSON as encode gives it (a msgspec.Raw: a slice of the array it came in)."""

_encode = msgspec.json.Encoder().encode
_decode_one = msgspec.json.Decoder(Record).decode
_decode_list = msgspec.json.Decoder(list[Record]).decode
_decode_raw_list = msgspec.json.Decoder(list[msgspec.Raw]).decode


def encode(record: Record) -> bytes:
    """One record as JSON."""
    return _encode(record)


def encode_many(records: list[Record]) -> bytes:
    """A list of records as one JSON array."""
    return _encode(records)


def decode(data: bytes) -> Record:
    """The record in `data`; RecordError if it is not one."""
    try:
        return _decode_one(data)
    except msgspec.DecodeError as exc:
        raise RecordError(f"bad record: {exc}") from None


def decode_many(data: bytes) -> list[Record]:
    """The records of a JSON array; RecordError if any is not a record."""
    try:
        return _decode_list(data)
    except msgspec.DecodeError as exc:
        raise RecordError(f"bad record: {exc}") from None


def each_encoded(data: bytes) -> list[Encoded]:
    """Each element of an encode_many array as the bytes it has there, undecoded: what encode
    gives that record, so it can go to disk and to peers without being encoded again. Call it on
    bytes decode_many accepted."""
    try:
        return _decode_raw_list(data)
    except msgspec.DecodeError as exc:
        raise RecordError(f"bad record list: {exc}") from None


def join_encoded(encoded: list[Encoded]) -> bytes:
    """The encode_many array of records given as their encode bytes."""
    return b"[" + b",".join(encoded) + b"]"


def count(record: Consume | Confirm | Release | Expire) -> int:
    """How many messages a single or list form record names."""
    ids = record.msg_ids
    return 1 if ids is None else len(ids)
