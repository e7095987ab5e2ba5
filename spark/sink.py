"""The queue sink: df.write.format("queue") and df.writeStream.format("queue").

Rows become messages of option `queue` (a real or a virtual queue). Columns: `data` (string,
or binary holding UTF-8) and, optionally, `delay`, `ttl`, `retry` (numbers in the protocol's
units, or timestamps for delay/ttl) and `priority` (integer); the options of the same names
give defaults for every row. Any other column is an error (select what you mean to send).

Consecutive rows with the same delay/ttl/retry/priority are sent as one produce request (at
most `batchSize` messages and `maxRequestBytes` bytes). Every request is idempotent: producer
id ``<writeId>/<partition>`` for a batch write, ``<queryId>/<batchId>/<partition>`` for a
streaming one, and the request's number within the task as sequence. A retried task, or a
micro-batch replayed after a driver restart, sends the same (producer, sequence) pairs and the
server stores nothing new for them -- provided the retry sees the same rows in the same order
(true for files, tables and this project's own source) and the queue still remembers them
(its dedupe window: the last 10,000 idempotent produces of each queue).
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import orjson
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from queue_server.client import QueueClient
from queue_server.client import protocol as p

from .options import WriteOptions, tls_context

OPTIONAL_COLUMNS = ("delay", "ttl", "retry", "priority")


@dataclass
class ProduceCommit(WriterCommitMessage):
    """What one task sent: messages stored, and messages the server already had (retries)."""

    produced: int = 0
    duplicates: int = 0
    requests: int = 0


def _check_columns(schema: StructType) -> None:
    names = [f.name for f in schema.fields]
    if "data" not in names:
        raise ValueError("the queue sink needs a data column")
    unknown = [n for n in names if n != "data" and n not in OPTIONAL_COLUMNS]
    if unknown:
        raise ValueError(f"the queue sink takes data and optionally {', '.join(OPTIONAL_COLUMNS)}; "
                         f"unknown column(s): {', '.join(unknown)}")


class QueueWriter(DataSourceArrowWriter):
    """Batch writes: one producer id per partition of this write."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_columns(schema)
        self.opts = opts
        self.write_id = opts.producer_id or uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator) -> ProduceCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        return produce_batches(self.opts, f"{self.write_id}/{partition}", iterator)

    def commit(self, messages: list) -> None:
        pass  # every message is stored when its task returns

    def abort(self, messages: list) -> None:
        pass  # messages of the tasks that succeeded stay; a rerun with producerId set dedupes them


class QueueStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: one producer id per partition of each micro-batch."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_columns(schema)
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator) -> ProduceCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = self.opts.producer_id or ctx.getLocalProperty("sql.streaming.queryId") or self.fallback_id
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        return produce_batches(self.opts, f"{query}/{batch}/{ctx.partitionId()}", iterator)

    def commit(self, messages: list, batchId: int) -> None:
        pass

    def abort(self, messages: list, batchId: int) -> None:
        pass


def produce_batches(opts: WriteOptions, producer: str, batches: Iterator) -> ProduceCommit:
    """Send the rows of Arrow record batches as idempotent produce requests."""
    result = ProduceCommit()
    client = QueueClient(opts.hosts, timeout=opts.timeout, token=opts.auth_token, tls=tls_context(opts.tls))
    sequence = 0
    try:
        for batch in batches:
            for attrs, data in _runs(batch, opts):
                for chunk in _chunks(data, opts.batch_size, opts.max_request_bytes):
                    req = p.produce_request(opts.queue, chunk, *attrs, producer=producer,
                                            sequence=sequence)
                    reply = client.request(req)
                    sequence += 1
                    result.requests += 1
                    if reply.get("duplicate"):
                        result.duplicates += len(chunk)
                    else:
                        result.produced += len(chunk)
    finally:
        client.close()
    return result


def _runs(batch, opts: WriteOptions) -> Iterator[tuple[tuple, list[str]]]:
    """((delay, ttl, retry, priority), data) for each run of consecutive rows sharing them."""
    names = batch.schema.names
    data = _strings(batch.column(names.index("data")).to_pylist())
    columns = []
    for name in OPTIONAL_COLUMNS:
        if name in names:
            values = batch.column(names.index(name)).to_pylist()
            columns.append([_value(name, v) for v in values])
        else:
            columns.append(None)
    defaults = (opts.delay, opts.ttl, opts.retry, opts.priority)
    if all(c is None for c in columns):
        yield defaults, data
        return
    start = 0
    current = None
    for i in range(len(data)):
        attrs = tuple(
            defaults[j] if col is None or col[i] is None else col[i] for j, col in enumerate(columns))
        if attrs != current:
            if current is not None:
                yield current, data[start:i]
            current, start = attrs, i
    if current is not None:
        yield current, data[start:]


def _strings(values: list) -> list[str]:
    out = []
    for v in values:
        if v is None:
            raise ValueError("data: null in a row written to the queue sink")
        out.append(v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v))
    return out


def _value(name: str, v):
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.timestamp()
    if name == "priority":
        return int(v)
    return float(v) if not isinstance(v, int) else v


def _chunks(data: list[str], size: int, max_bytes: int) -> Iterator[list[str]]:
    """Slices of `data` of at most `size` items whose JSON encoding stays under `max_bytes`."""
    dumps = orjson.dumps
    start = 0
    total = 0
    for i, d in enumerate(data):
        n = len(dumps(d)) + 1
        if i > start and (i - start >= size or total + n > max_bytes):
            yield data[start:i]
            start, total = i, 0
        total += n
    if start < len(data):
        yield data[start:]
