"""One pipeline reading its own member of the virtual queue "events" (see fanout_app.py): it
drains what is there, writes the events to parquet and prints totals per user. Two separate
runs on events_billing and events_search each see every event.

    python examples/fanout_job.py --queue events_billing --out /tmp/billing
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
    parser.add_argument("--queue", required=True, help="a member queue of the virtual queue")
    parser.add_argument("--out", required=True, help="parquet directory")
    args = parser.parse_args()

    session = SparkSession.builder.appName(f"fanout-{args.queue}").getOrCreate()
    queue_spark.register(session)
    schema = "event INT, user INT, amount INT"
    query = (
        session.readStream.format("queue")
        .option("hosts", args.hosts).option("queues", args.queue).load()
        .select("msg_id", F.from_json("data", schema).alias("e")).select("msg_id", "e.*")
        .writeStream.format("parquet").option("path", args.out)
        .option("checkpointLocation", os.path.join(args.out, "_checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    events = session.read.parquet(args.out)
    print(f"{args.queue}: {events.count()} events")
    events.groupBy("user").agg(F.count("*").alias("events"), F.sum("amount").alias("amount")) \
        .orderBy(F.desc("amount")).show(5)
    session.stop()


if __name__ == "__main__":
    main()
