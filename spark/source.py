"""The queue data source (format "queue") and its batch reader.

    spark.read.format("queue").option("hosts", "h1:1111,h2:1112").option("queues", "a,b").load()

Columns (SCHEMA): queue, msg_id, data, delivery_count, and the message's times as UTC
timestamps: ready_time (when it became ready: its delay, or the end of its previous lease),
ttl (after which it is no longer retried) and lease_until (until when this read holds it).

By default a batch read only looks: one partition per queue pages through the queue's ready
messages with peek (`chunkSize` at a time), leasing and taking nothing, so show(), take() or
limit() never cost a message. With `consume=true` every partition reads one queue on an
executor with batch consumes (`chunkSize` messages, default 1000), each leasing its messages
for `leaseSeconds` under a lease token of its own, so that a retried task attempt gets the same
messages back instead of new ones, and confirms them once it has handed its last row to Spark;
`confirm=false` leaves them leased until confirm_read() (or until the lease ends and they come
back). See docs/spark.md for the guarantees of each.

Executors import this module (the DataSource class is pickled by reference), so it imports
nothing from the driver's session and connects lazily, inside read().
"""
from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from queue_server.client import QueueClient
from queue_server.client import protocol as p
from queue_server.client.admin import peek_request
from queue_server.client.tls import TlsFiles, TlsOption

from .offsets import chunk_token, chunks
from .options import ReadOptions, WriteOptions, tls_context

# Built from types, not parsed from DDL: parsing needs the JVM, which executors' Python lacks.
SCHEMA = StructType([
    StructField("queue", StringType()),
    StructField("msg_id", LongType()),
    StructField("data", StringType()),
    StructField("delivery_count", IntegerType()),
    StructField("ready_time", TimestampType()),
    StructField("ttl", TimestampType()),
    StructField("lease_until", TimestampType()),
])
COLUMNS = tuple(SCHEMA.fieldNames())


class QueueDataSource(DataSource):
    """queue-server queues as a Spark data source: batch and streaming reads, batch and
    streaming writes. Register it with spark.dataSource.register(QueueDataSource) (or
    spark.register(session))."""

    @classmethod
    def name(cls) -> str:
        return "queue"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return QueueBatchReader(ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType):  # -> QueueStreamReader
        from .stream import QueueStreamReader

        _check_schema(schema)
        return QueueStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool):  # -> QueueWriter
        from .sink import QueueWriter

        return QueueWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):  # -> QueueStreamWriter
        from .sink import QueueStreamWriter

        return QueueStreamWriter(WriteOptions.parse(self.options), schema)


def _check_schema(schema: StructType) -> None:
    names = tuple(f.name for f in schema.fields)
    if names != COLUMNS:
        raise ValueError(f"the queue source has the fixed columns {', '.join(COLUMNS)}; "
                         f"select from them instead of giving a schema ({', '.join(names)})")


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """What one task reads: a queue, the base of its lease tokens and how much to take.

    Everything the executor needs is here, because read() runs on a reader that was pickled
    before partitions() was called.
    """

    hosts: str
    queue: str
    token_base: str
    count: int | None  # None: until the queue has nothing ready (batch without maxMessages)
    lease: float
    chunk: int
    timeout: float
    exact: bool  # stream: read every planned chunk, even after a short one
    confirm: bool  # batch consume=true: confirm the tokens once read
    look: bool = False  # batch default: peek page by page instead of consuming
    auth_token: str | None = None  # the nodes' client token (auth_token_file)
    tls: TlsFiles = TlsFiles()

    @property
    def value(self) -> str:  # InputPartition's repr/debug field
        return f"{self.queue}:{self.token_base}"


class QueueBatchReader(DataSourceReader):
    """spark.read.format("queue"): `partitionsPerQueue` partitions per queue, each draining its
    queue (up to `maxMessages`) on an executor."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        # Fixed here, before Spark pickles the reader, so that every task of this read shares it.
        self.read_id = opts.read_id or uuid.uuid4().hex[:16]

    def partitions(self) -> list[QueuePartition]:
        o = self.opts
        # A look pages through a queue in order: one partition per queue (more would see the
        # same messages).
        per_queue = 1 if o.look else o.partitions_per_queue
        return [
            QueuePartition(o.hosts, q, f"{self.read_id}/{i}", o.max_messages, o.lease, o.chunk,
                           o.timeout, exact=False, confirm=o.confirm, look=o.look, auth_token=o.auth_token,
                           tls=o.tls)
            for q in o.queues
            for i in range(per_queue)
        ]

    def read(self, partition: QueuePartition) -> Iterator:
        return read_partition(partition)


def read_partition(part: QueuePartition) -> Iterator:
    """Consume a partition's messages chunk by chunk (each under its own lease token), or with
    `look` peek at them page by page, and yield them as Arrow record batches in SCHEMA, each
    chunk sorted by msg_id so that a retried read yields the same rows in the same order. The
    next chunk is fetched while Spark takes the current one."""
    import pyarrow as pa

    schema = arrow_schema()
    fetched: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    used: list[str] = []
    client = QueueClient(part.hosts, timeout=part.timeout, token=part.auth_token, tls=tls_context(part.tls))

    def fetch() -> None:
        try:
            plan = chunks(part.count, part.chunk) if part.count is not None else None
            k = 0
            cursor = None
            while (plan is None or k < len(plan)) and not stop.is_set():
                want = part.chunk if plan is None else plan[k]
                if part.look:
                    reply = client.request(peek_request(part.queue, want, "ready", after=cursor))
                    cursor = reply.get("cursor")
                else:
                    token = chunk_token(part.token_base, k)
                    reply = client.request(p.consume_request(part.queue, want, None, part.lease, token, True))
                    used.append(token)
                messages = reply.get("messages") or []
                fetched.put(messages)
                k += 1
                if len(messages) < want and not part.exact:
                    break  # drained (a retry stops where the first attempt stopped, give or take)
            fetched.put(None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the reading thread, which raises it
            fetched.put(exc)

    fetcher = threading.Thread(target=fetch, name=f"queue-read-{part.queue}", daemon=True)
    fetcher.start()
    try:
        while True:
            item = fetched.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            if item:
                yield _record_batch(part.queue, item, schema, pa)
        fetcher.join()
        if part.confirm and used:
            _by_tokens(client.confirm_many, part.queue, used)
    finally:
        stop.set()
        while fetcher.is_alive():  # unblock a fetcher waiting for room, then let it finish
            try:
                fetched.get(timeout=0.1)
            except queue.Empty:
                pass
        client.close()


def _by_tokens(settle, queue: str, tokens: list[str]) -> None:
    """Confirm (`settle`) what `tokens` hold in `queue`, 1000 tokens a request."""
    for i in range(0, len(tokens), p.MAX_BATCH):
        settle(queue, tokens=tokens[i:i + p.MAX_BATCH])


_by_id = itemgetter("msg_id")
_FIELDS = tuple(itemgetter(k) for k in ("data", "delivery_count", "ready", "ttl", "lease_until"))


def _record_batch(queue: str, messages: list[dict], schema, pa):
    """One consume reply's messages as a record batch in SCHEMA, sorted by msg_id."""
    import pyarrow.compute as pc

    ids = list(map(_by_id, messages))
    if ids != sorted(ids):
        messages.sort(key=_by_id)
        ids = list(map(_by_id, messages))
    data, counts, ready, ttl, lease = (list(map(get, messages)) for get in _FIELDS)
    stamp = schema.field("ready_time").type

    def times(seconds: list) -> object:  # unix seconds (floats, None allowed) -> microseconds
        micros = pc.multiply(pa.array(seconds, pa.float64()), 1_000_000.0)
        return pc.cast(pc.round(micros), pa.int64()).cast(stamp)

    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(queue, pa.string()), len(ids)), pa.array(ids, pa.int64()),
         pa.array(data, pa.string()), pa.array(counts, pa.int32()),
         times(ready), times(ttl), times(lease)],
        schema=schema,
    )


_ARROW_SCHEMA = None


def arrow_schema():
    """SCHEMA as the Arrow schema Spark expects record batches in."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
    return _ARROW_SCHEMA


def confirm_read(hosts: str, queues: str | Iterable[str], read_id: str, timeout: float = 30.0,
                 token: str | None = None, tls: TlsOption = None) -> int:
    """Confirm everything a batch read with confirm=false and readId=`read_id` still holds;
    how many messages were confirmed. Call it once the job that used the rows has succeeded.
    token: the nodes' client token, if they require one; tls: as QueueClient's."""
    return _by_read(p.CONFIRM, hosts, queues, read_id, timeout, token, tls)


def release_read(hosts: str, queues: str | Iterable[str], read_id: str, timeout: float = 30.0,
                 token: str | None = None, tls: TlsOption = None) -> int:
    """Give back everything a batch read with confirm=false and readId=`read_id` still holds
    (ready again at once, for any consumer); how many leases were released."""
    return _by_read(p.RELEASE, hosts, queues, read_id, timeout, token, tls)


def _by_read(action: int, hosts: str, queues: str | Iterable[str], read_id: str, timeout: float,
             token: str | None, tls: TlsOption) -> int:
    if not read_id or "/" in read_id:
        raise ValueError("read_id: must be non-empty, without '/'")
    names = [q.strip() for q in queues.split(",")] if isinstance(queues, str) else list(queues)
    field = "confirmed" if action == p.CONFIRM else "released"
    done = 0
    with QueueClient(hosts, timeout=timeout, token=token, tls=tls) as client:
        for q in names:
            if q:
                reply = client.request(p.ids_request(action, q, None, token_prefix=f"{read_id}/"))
                done += p.count_from_reply(reply, field)
    return done
