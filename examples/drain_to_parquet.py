"""A streaming job that drains two queues into parquet, at least once.

    queue-server &                                   # a node on 127.0.0.1:1111
    queue-cli produce orders '{"id": 1}' '{"id": 2}'
    queue-cli produce refunds '{"id": 9}'
    python examples/drain_to_parquet.py --queues orders,refunds --out /tmp/drained --once

Every message lands in the parquet files at least once: it is confirmed only after Spark has
committed the micro-batch that wrote it. Stop the job at any time (^C) and run it again with the
same --checkpoint: a batch that was not committed is replayed with the same messages. Without
--once it keeps running, one micro-batch every --every seconds.
"""
from __future__ import annotations

import argparse
import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import queue_server.spark as queue_spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="127.0.0.1:1111")
    parser.add_argument("--queues", default="orders,refunds", help="comma-separated queues")
    parser.add_argument("--out", default="/tmp/drained", help="parquet directory")
    parser.add_argument("--checkpoint", help="default: <out>/_checkpoint")
    parser.add_argument("--partitions-per-queue", type=int, default=2)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between micro-batches")
    parser.add_argument("--once", action="store_true", help="drain what is there now, then stop")
    args = parser.parse_args()

    session = SparkSession.builder.appName("drain-queues-to-parquet").getOrCreate()
    queue_spark.register(session)
    messages = (
        session.readStream.format("queue")
        .option("hosts", args.hosts)
        .option("queues", args.queues)
        .option("partitionsPerQueue", args.partitions_per_queue)
        .option("maxMessages", 50_000)
        .load()
        .withColumn("day", F.to_date("ready_time"))
    )
    writer = (
        messages.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint or os.path.join(args.out, "_checkpoint"))
        .partitionBy("queue", "day")
    )
    writer = writer.trigger(availableNow=True) if args.once else writer.trigger(
        processingTime=f"{args.every} seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    for progress in query.recentProgress:
        print(f"batch {progress['batchId']}: {progress['numInputRows']} messages")
    session.stop()


if __name__ == "__main__":
    main()
