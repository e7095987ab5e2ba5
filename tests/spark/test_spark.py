"""The queue source and sink in a real local[2] SparkSession against a real node."""
from __future__ import annotations

import os

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from queue_server.client import QueueClient
from queue_server.spark import confirm_read
from tests.harness import wait_for
from tests.spark.helpers import FailFirstAttemptSink, fail_first_attempt

N = 2000


def fill(node, queue: str, n: int) -> set[str]:
    data = [f"{queue}:{i}" for i in range(n)]
    with QueueClient(node.hosts) as c:
        for i in range(0, n, 1000):
            c.produce_batch(queue, data[i:i + 1000])
    return set(data)


def stats(node, queue: str) -> dict:
    with QueueClient(node.hosts) as c:
        return c.monitor(queue)


def read(spark_session, node, queues: str, **opts):
    r = spark_session.read.format("queue").option("hosts", node.hosts).option("queues", queues)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def stream(spark_session, node, queues: str, **opts):
    r = spark_session.readStream.format("queue").option("hosts", node.hosts).option("queues", queues)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_a_consuming_batch_read_returns_each_message_once_and_empties_the_queues(spark_session, node, qname):
    a, b = f"{qname}-a", f"{qname}-b"
    sent = fill(node, a, N // 2) | fill(node, b, N // 2)
    rows = read(spark_session, node, f"{a},{b}", partitionsPerQueue=2, consume="true").collect()
    assert len(rows) == N
    assert {r.data for r in rows} == sent
    assert len({(r.queue, r.msg_id) for r in rows}) == N
    assert all(r.delivery_count == 1 and r.lease_until > r.ready_time and r.ttl > r.ready_time
               for r in rows)
    for q in (a, b):
        assert stats(node, q)["size"] == 0


def test_looking_at_a_batch_read_takes_nothing_and_a_consuming_write_takes_all(spark_session, node, qname, tmp_path):
    sent = fill(node, qname, 3000)
    # leases far longer than the test: only the read's own release can bring the messages back
    df = read(spark_session, node, qname, leaseSeconds=3600)
    df.show(2)
    assert len(df.take(5)) == 5 and df.limit(3).count() == 3
    wait_for(lambda: stats(node, qname)["in_flight"] == 0, 30, "every lease of the looks released")
    s = stats(node, qname)
    assert (s["size"], s["ready"]) == (3000, 3000)
    assert {r.data for r in df.collect()} == sent and stats(node, qname)["size"] == 3000
    consuming = read(spark_session, node, qname, consume="true", leaseSeconds=3600)
    consuming.write.format("parquet").save(str(tmp_path / "out"))
    assert {r.data for r in spark_session.read.parquet(str(tmp_path / "out")).collect()} == sent
    assert stats(node, qname)["size"] == 0


def test_streaming_available_now_drains_everything_and_leaves_nothing_leased(spark_session, node, qname, tmp_path):
    a, b = f"{qname}-a", f"{qname}-b"
    sent = fill(node, a, N // 2) | fill(node, b, N // 2)
    query = (stream(spark_session, node, f"{a},{b}", maxMessages=400).writeStream
             .format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert len(query.recentProgress) >= 2  # several micro-batches: the last one is flushed too
    out = spark_session.read.parquet(str(tmp_path / "out"))
    assert out.count() == N and {r.data for r in out.select("data").collect()} == sent
    for q in (a, b):
        s = stats(node, q)
        assert (s["size"], s["in_flight"]) == (0, 0)


def test_a_task_that_fails_after_reading_loses_nothing(spark_session, node, qname, tmp_path):
    sent = fill(node, qname, N)
    fail = F.udf(lambda v: fail_first_attempt(v), StringType())
    query = (stream(spark_session, node, qname, partitionsPerQueue=2)
             .select("msg_id", "delivery_count", fail("data").alias("data"))
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    out = spark_session.read.parquet(str(tmp_path / "out")).collect()
    assert {r.data for r in out} == sent and len(out) == N
    # The retries read the same leases again (token), not messages redelivered after expiry.
    assert {r.delivery_count for r in out} == {1}
    assert stats(node, qname)["size"] == 0


def test_batch_read_without_confirm_survives_a_failed_task_until_confirm_read(spark_session, node, qname):
    sent = fill(node, qname, 500)
    fail = F.udf(lambda v: fail_first_attempt(v), StringType())
    df = read(spark_session, node, qname, confirm="false", readId=qname[-20:].replace("/", "-"))
    rows = df.select(fail("data").alias("data")).collect()
    assert {r.data for r in rows} == sent and len(rows) == 500
    assert stats(node, qname)["in_flight"] == 500
    assert confirm_read(node.hosts, qname, qname[-20:].replace("/", "-")) == 500
    assert stats(node, qname)["size"] == 0


def test_sink_writes_n_rows_as_n_messages(spark_session, node, qname):
    df = spark_session.range(N).select(F.concat(F.lit("row-"), F.col("id").cast("string")).alias("data"))
    df.repartition(3).write.format("queue").option("hosts", node.hosts).option("queue", qname) \
        .option("retry", "30").mode("append").save()
    assert stats(node, qname)["size"] == N
    rows = read(spark_session, node, qname).collect()
    assert sorted(r.data for r in rows) == sorted(f"row-{i}" for i in range(N))


def test_a_retried_sink_task_adds_no_message(spark_session, node, qname):
    spark_session.dataSource.register(FailFirstAttemptSink)
    spark_session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark_session.range(N).select(F.col("id").cast("string").alias("data")).repartition(2)
        df.write.format("queue_fail_first").option("hosts", node.hosts).option("queue", qname) \
            .option("batchSize", "50").mode("append").save()
    finally:
        spark_session.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert stats(node, qname)["size"] == N
    with QueueClient(node.hosts) as c:
        stored_when_failing = [int(m.data) for m in c.consume_batch(qname + "-attempts", 10)]
    assert len(stored_when_failing) == 2 and all(n > 0 for n in stored_when_failing)


def test_streaming_sink_from_the_queue_source(spark_session, node, qname, tmp_path):
    src, dst = f"{qname}-in", f"{qname}-out"
    sent = fill(node, src, N)
    query = (stream(spark_session, node, src, maxMessages=600).select("data").writeStream
             .format("queue").option("hosts", node.hosts).option("queue", dst)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert stats(node, src)["size"] == 0 and stats(node, dst)["size"] == N
    assert {r.data for r in read(spark_session, node, dst).collect()} == sent


def test_a_virtual_queue_read_by_two_jobs_gives_each_all_messages(spark_session, node, tmp_path):
    data = [f"fan-{i}" for i in range(N)]
    spark_session.createDataFrame([(d,) for d in data], "data string").write.format("queue") \
        .option("hosts", node.hosts).option("queue", "fan").mode("append").save()
    for member in ("fan_a", "fan_b"):  # two separate jobs, each with its own checkpoint
        query = (stream(spark_session, node, member).writeStream.format("parquet")
                 .option("path", str(tmp_path / member)).option("checkpointLocation", str(tmp_path / f"ck-{member}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(240)
        assert query.exception() is None
    for member in ("fan_a", "fan_b"):
        got = [r.data for r in spark_session.read.parquet(str(tmp_path / member)).collect()]
        assert sorted(got) == sorted(data)
        assert stats(node, member)["size"] == 0


def test_a_batch_replayed_after_the_query_restarts_yields_the_same_messages(spark_session, node, qname, tmp_path):
    fill(node, qname, 900)
    seen: dict[int, list[int]] = {}
    checkpoint = str(tmp_path / "ck")

    def crash_after_first(df, batch_id):
        seen.setdefault(batch_id, sorted(r.msg_id for r in df.select("msg_id").collect()))
        raise RuntimeError("injected: the driver dies before committing batch 0")

    def record(df, batch_id):
        seen[(batch_id, "again")] = sorted(r.msg_id for r in df.select("msg_id").collect())

    def run(handler):
        return (stream(spark_session, node, qname, maxMessages=400).writeStream
                .foreachBatch(handler).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start())

    crashed = run(crash_after_first)
    with pytest.raises(StreamingQueryException, match="injected"):
        crashed.awaitTermination(240)
    assert stats(node, qname)["in_flight"] == 400  # still leased for the replay
    restarted = run(record)
    restarted.awaitTermination(240)
    assert restarted.exception() is None
    assert len(seen[0]) == 400 and seen[(0, "again")] == seen[0]
    replayed = {i for key, ids in seen.items() if key != 0 for i in ids}
    assert len(replayed) == 900
    assert stats(node, qname)["size"] == 0


@pytest.fixture(autouse=True)
def _no_leftover_queries(spark_session):
    yield
    for q in spark_session.streams.active:
        q.stop()
    assert not spark_session.streams.active, os.getpid()
