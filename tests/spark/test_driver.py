"""The queue source and sink driven the way Spark drives them, without a SparkSession: offsets,
planning, partitions read by direct read() calls, commits, restarts, lease keeping, and the
sink's idempotent produce. A real node; no Spark process, so these run in seconds."""
from __future__ import annotations

import pickle
import time

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from queue_server.client import QueueClient
from queue_server.spark.offsets import Offset, chunks, plan, split
from queue_server.spark.options import OptionError, ReadOptions, WriteOptions
from queue_server.spark.sink import _chunks, produce_batches
from queue_server.spark.source import QueueBatchReader, read_partition
from queue_server.spark.stream import QueueStreamReader
from tests.harness import wait_for


def reader(node, queues: list[str], **opts) -> QueueStreamReader:
    options = {"hosts": node.hosts, "queues": ",".join(queues)}
    options.update({k: str(v) for k, v in opts.items()})
    return QueueStreamReader(ReadOptions.parse(options, streaming=True))


def fill(node, queue: str, n: int, **kw) -> list[int]:
    with QueueClient(node.hosts) as c:
        ids: list[int] = []
        for i in range(0, n, 1000):
            ids += c.produce_batch(queue, [f"{queue}:{j}" for j in range(i, min(n, i + 1000))], **kw)
        return ids


def stats(node, queue: str) -> dict:
    with QueueClient(node.hosts) as c:
        return c.monitor(queue)


def rows(batches) -> list[tuple]:
    out = []
    for b in batches:
        d = b.to_pydict()
        out += list(zip(d["queue"], d["msg_id"], d["data"], d["delivery_count"]))
    return out


ALL = ReadAllAvailable()


def run_batch(r: QueueStreamReader, start: dict, limit=ALL) -> tuple[dict, list]:
    """One micro-batch as Spark runs it: plan, partition, read (each partition pickled first)."""
    end = r.latestOffset(start, limit)
    parts = r.partitions(start, end)
    fresh = pickle.loads(pickle.dumps(r))  # executors get a pickled reader
    got = [row for part in parts for row in rows(fresh.read(pickle.loads(pickle.dumps(part))))]
    return end, got


# ---------------------------------------------------------------- pure pieces

def test_offsets_round_trip_and_reject_garbage():
    o = Offset("abc", 3, {"b": 5, "a": 2}, 2, 1000)
    assert Offset.from_json(o.to_json()) == o
    assert list(o.to_json()["take"]) == ["a", "b"]
    assert o.prefix == "abc/3/"
    assert o.next({"a": 0, "b": 4}, 3, 500) == Offset("abc", 4, {"b": 4}, 3, 500)
    for bad in ({}, {"stream": "a/b", "round": 0, "take": {}, "parts": 1, "chunk": 1},
                {"stream": "a", "round": -1, "take": {}, "parts": 1, "chunk": 1},
                {"stream": "a", "round": 0, "take": {"q": 0}, "parts": 1, "chunk": 1}):
        with pytest.raises(ValueError):
            Offset.from_json(bad)


def test_plan_split_and_chunks():
    assert plan({"a": 10, "b": 3, "c": 0}, 100) == {"a": 10, "b": 3}
    assert plan({"a": 10, "b": 3}, 5) == {"a": 5, "b": 3}
    assert plan({"a": 10, "b": 3}, 100, 8) == {"a": 5, "b": 3}
    assert plan({"a": 10, "b": 10, "c": 10}, 100, 10) == {"a": 4, "b": 3, "c": 3}
    assert plan({"a": 10, "b": 3}, 100, None, {"a": 4, "b": 0}) == {"a": 4}
    assert split(10, 3) == [4, 3, 3] and split(2, 4) == [1, 1, 0, 0]
    assert chunks(2500, 1000) == [1000, 1000, 500] and chunks(0, 1000) == []


def test_options_name_the_bad_option():
    base = {"hosts": "127.0.0.1:1", "queues": "a"}
    for extra, name in (({"partitionsPerQueue": "0"}, "partitionsPerQueue"),
                        ({"leaseSeconds": "x"}, "leaseSeconds"),
                        ({"queues": "a,a"}, "queues"),
                        ({"hosts": "h:0"}, "hosts"),
                        ({"confirm": "false"}, "readId"),
                        ({"consume": "true", "confirm": "false"}, "readId"),
                        ({"consume": "maybe"}, "consume"),
                        ({"consume": "false", "confirm": "true"}, "consume"),
                        ({"readId": "a/b"}, "readId")):
        with pytest.raises(OptionError, match=f"option {name}"):
            ReadOptions.parse({**base, **extra}, streaming=False)
    with pytest.raises(OptionError, match="option queue"):
        WriteOptions.parse({"hosts": "h:1"})
    assert ReadOptions.parse(base, streaming=True).max_messages == 50_000
    # a batch read looks by default; consuming is asked for
    after = {extra: (o.confirm, o.look) for extra, o in (
        ("default", ReadOptions.parse(base, streaming=False)),
        ("consume", ReadOptions.parse({**base, "consume": "true"}, streaming=False)),
        ("confirm", ReadOptions.parse({**base, "confirm": "true"}, streaming=False)),
        ("hold", ReadOptions.parse({**base, "confirm": "false", "readId": "r"}, streaming=False)))}
    assert after == {"default": (False, True), "consume": (True, False), "confirm": (True, False),
                     "hold": (False, False)}
    assert ReadOptions.parse({"HOSTS": "h:1", "Queues": "a"}, streaming=False).queues == ("a",)


# ---------------------------------------------------------------- streaming, driven by hand

def test_rounds_read_every_message_once_and_confirm_after_commit(node, qname):
    a, b = f"{qname}-a", f"{qname}-b"
    fill(node, a, 2500)
    fill(node, b, 700)
    r = reader(node, [a, b], partitionsPerQueue=2, maxMessages=800)
    start = r.initialOffset()
    seen: list[tuple] = []
    batches = 0
    while True:
        end, got = run_batch(r, start)
        if end == start:
            break
        batches += 1
        seen += got
        assert stats(node, a)["in_flight"] + stats(node, b)["in_flight"] == len(got)
        r.commit(end)  # Spark commits the previous batch while planning the next one
        start = end
    assert len(seen) == 3200 and len({(q, i) for q, i, *_ in seen}) == 3200
    assert batches == 2  # 1600 of a + 700 of b, then a's last 900
    assert all(dc == 1 for *_, dc in seen)
    assert stats(node, a)["size"] == stats(node, b)["size"] == 0
    r.stop()


def test_idle_stream_flushes_the_last_batch_in_latest_offset(node, qname):
    fill(node, qname, 50)
    r = reader(node, [qname])
    start = r.initialOffset()
    end, got = run_batch(r, start)
    assert len(got) == 50 and stats(node, qname)["in_flight"] == 50
    # No commit(end) comes: the stream is idle. Planning the next batch confirms it.
    assert r.latestOffset(end, ReadAllAvailable()) == end
    assert stats(node, qname)["size"] == 0
    r.stop()


def test_a_retried_task_reads_the_same_messages(node, qname):
    fill(node, qname, 2300)
    r = reader(node, [qname], partitionsPerQueue=2)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    parts = r.partitions(start, end)
    first = rows(read_partition(parts[0]))
    it = read_partition(parts[1])
    next(it)  # the task dies after its first chunk
    it.close()
    again = [rows(read_partition(p)) for p in parts]
    assert again[0] == first  # same messages, same order, delivery_count unchanged
    assert len(again[0]) + len(again[1]) == 2300
    assert all(dc == 1 for part in again for *_, dc in part)
    r.commit(end)
    assert stats(node, qname)["size"] == 0
    r.stop()


def test_a_replay_after_a_driver_restart_yields_the_same_messages(node, qname):
    fill(node, qname, 1500)
    r = reader(node, [qname], maxMessages=1000)
    start = r.initialOffset()
    end, got = run_batch(r, start)  # the driver dies before the batch is committed
    r.stop()
    fill(node, qname, 10)           # more arrives meanwhile
    restarted = reader(node, [qname], maxMessages=1000)
    parts = restarted.partitions(start, end)  # Spark re-runs the logged batch
    replay = [row for part in parts for row in rows(read_partition(part))]
    assert replay == got and len(got) == 1000
    restarted.commit(end)
    end2, rest = run_batch(restarted, end)
    assert len(rest) == 510 and not {i for _, i, *_ in rest} & {i for _, i, *_ in got}
    assert restarted.latestOffset(end2, ReadAllAvailable()) == end2
    assert stats(node, qname)["size"] == 0
    restarted.stop()


def test_a_restarted_driver_confirms_the_batch_committed_before_it_died(node, qname):
    fill(node, qname, 30)
    r = reader(node, [qname])
    start = r.initialOffset()
    end, _ = run_batch(r, start)
    r.stop()  # Spark wrote its commit log, then the driver died before confirming
    restarted = reader(node, [qname])
    assert restarted.latestOffset(end, ReadAllAvailable()) == end
    assert stats(node, qname)["size"] == 0
    restarted.stop()


def test_slow_batches_keep_their_leases(node, qname):
    """A batch that takes longer than several lease lengths keeps every message leased the whole
    time (the driver's keeper extends the leases every leaseSeconds/3), and its commit confirms
    them all.

    The lease is long enough that a keeper pass may come late by two thirds of it (a loaded
    machine) before any lease could end; the queue is watched throughout, not only at the end."""
    lease = 3.0
    fill(node, qname, 20)
    r = reader(node, [qname], leaseSeconds=lease)
    try:
        start = r.initialOffset()
        end, got = run_batch(r, start)
        leased_at = time.monotonic()
        assert len(got) == 20

        def kept_past_two_leases() -> bool:
            s = stats(node, qname)
            assert (s["in_flight"], s["ready"]) == (20, 0), f"a lease ended while the batch ran: {s}"
            return r.driver.extensions >= 4 and time.monotonic() - leased_at > 2 * lease
        wait_for(kept_past_two_leases, 2 * lease + 30, "the lease keeper to run past two lease lengths")
        r.commit(end)
        after = stats(node, qname)
        assert (after["size"], after["in_flight"]) == (0, 0)
    finally:
        r.stop()


def test_available_now_stops_at_what_was_ready_when_it_started(node, qname):
    fill(node, qname, 300)
    r = reader(node, [qname], maxMessages=200)
    r.prepareForTriggerAvailableNow()
    fill(node, qname, 50)  # arrives after the query started: not part of this run
    start = r.initialOffset()
    total = 0
    while True:
        end, got = run_batch(r, start)
        if end == start:
            break
        total += len(got)
        start = end
    assert total == 300
    assert stats(node, qname)["size"] == 50 and stats(node, qname)["in_flight"] == 0
    r.stop()


def test_max_messages_per_trigger_is_the_default_read_limit(node, qname):
    fill(node, qname, 100)
    r = reader(node, [qname], maxMessagesPerTrigger=30)
    limit = r.getDefaultReadLimit()
    assert limit == ReadMaxRows(30)
    end, got = run_batch(r, r.initialOffset(), limit)
    assert len(got) == 30
    r.commit(end)
    r.stop()


# ---------------------------------------------------------------- batch reads

def test_batch_reader_partitions_and_confirm_modes(node, qname):
    fill(node, qname, 1200)
    opts = ReadOptions.parse({"hosts": node.hosts, "queues": qname, "partitionsPerQueue": "2",
                              "maxMessages": "500", "confirm": "false", "readId": "r1"},
                             streaming=False)
    r = QueueBatchReader(opts)
    parts = r.partitions()
    got = [rows(read_partition(p)) for p in parts]
    assert [len(g) for g in got] == [500, 500]
    assert stats(node, qname)["in_flight"] == 1000
    assert [rows(read_partition(p)) for p in parts] == got  # repeatable while leased
    from queue_server.spark import confirm_read, release_read
    assert release_read(node.hosts, [qname], "nope") == 0
    assert confirm_read(node.hosts, qname, "r1") == 1000
    assert stats(node, qname)["size"] == 200


# ---------------------------------------------------------------- the sink

def test_sink_chunks_respect_count_and_bytes():
    data = ["x" * 10] * 25
    assert [len(c) for c in _chunks(data, 10, 10_000)] == [10, 10, 5]
    assert [len(c) for c in _chunks(data, 100, 13 * 7)] == [7, 7, 7, 4]
    assert [len(c) for c in _chunks(["y" * 50], 10, 20)] == [1]  # one too big goes alone


def test_sink_retry_with_the_same_producer_stores_nothing(node, qname):
    opts = WriteOptions.parse({"hosts": node.hosts, "queue": qname, "batchSize": "40", "retry": "30"})
    batch = pa.RecordBatch.from_pydict({"data": [f"m{i}" for i in range(100)]})
    first = produce_batches(opts, "w1/0", iter([batch]))
    assert (first.produced, first.duplicates, first.requests) == (100, 0, 3)
    again = produce_batches(opts, "w1/0", iter([batch]))
    assert (again.produced, again.duplicates) == (0, 100)
    assert stats(node, qname)["size"] == 100


def test_sink_columns_override_options(node, qname):
    opts = WriteOptions.parse({"hosts": node.hosts, "queue": qname, "retry": "30"})
    batch = pa.RecordBatch.from_pydict({
        "data": ["a", "b", "c", "d"],
        "priority": [None, 5, 5, None],
        "delay": [None, None, None, 3600.0],
    })
    result = produce_batches(opts, "w2/0", iter([batch]))
    assert (result.produced, result.requests) == (4, 3)
    with QueueClient(node.hosts) as c:
        got = c.consume_batch(qname, 10)
        assert [m.data for m in got] == ["b", "c", "a"]  # priority 5 first; d is delayed
        assert stats(node, qname)["delayed"] == 1


# ---------------------------------------------------------------- a node that requires a token

def test_source_and_sink_present_the_client_token(tmp_path, monkeypatch):
    from tests.harness import NodeProcess

    (tmp_path / "token").write_text("sparky\n")
    secured = NodeProcess(str(tmp_path), {"auth_token_file": str(tmp_path / "token")}).start()
    try:
        base = {"hosts": secured.hosts}
        batch = pa.RecordBatch.from_pydict({"data": ["a", "b", "c"]})
        with pytest.raises(Exception, match="authentication"):
            produce_batches(WriteOptions.parse({**base, "queue": "s"}), "t/0", iter([batch]))
        written = produce_batches(WriteOptions.parse({**base, "queue": "s", "authToken": "sparky"}),
                                  "t/1", iter([batch]))
        assert written.produced == 3
        monkeypatch.setenv("QUEUE_TOKEN", "sparky")  # the driver's environment, by default
        opts = ReadOptions.parse({**base, "queues": "s"}, streaming=False)
        assert opts.auth_token == "sparky"
        [part] = QueueBatchReader(pickle.loads(pickle.dumps(opts))).partitions()
        assert [r[2] for r in rows(read_partition(pickle.loads(pickle.dumps(part))))] == ["a", "b", "c"]
        with pytest.raises(OptionError, match="option authTokenFile"):
            ReadOptions.parse({**base, "queues": "s", "authTokenFile": str(tmp_path / "nope")}, streaming=False)
    finally:
        secured.stop()
