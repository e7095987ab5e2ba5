"""Drain benchmark of the Spark queue source: N messages (default 1,000,000) spread over 4 queues,
read by a local[2] SparkSession, timed apart from Spark's own start-up.

    python load/spark_bench.py                       # batch read and streaming availableNow
    python load/spark_bench.py --mode batch --messages 200000 --partitions-per-queue 2

It starts its own node (a subprocess on a free loopback port, stopped at the end), fills the
queues with a pipelined AsyncQueueClient, starts Spark, warms it with a small read, then drains
everything into Spark's "noop" sink (every row is produced, nothing is written) and checks the
queues are empty. Printed: the machine, Spark's start-up and warm-up, and per mode the drain's
wall time and messages/s. A benchmark, not a test: it asserts nothing but emptiness.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from load.procs import stop, tree_cpu_seconds  # noqa: E402
from tests.harness import free_port  # noqa: E402

from queue_server.client import AsyncQueueClient, QueueClient



class Node:
    """A queue-server node in a subprocess."""

    def __init__(self, workdir: str, workers: int, queue_size: int) -> None:
        self.port = free_port()
        config = {"host": "127.0.0.1", "port": self.port, "workers": workers, "http_port": 0,
                  "queue_size": queue_size, "log_level": 3,
                  "queue_data_dir": os.path.join(workdir, "data")}
        path = os.path.join(workdir, "node.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.log = open(os.path.join(workdir, "node.log"), "ab")  # noqa: SIM115 -- the node's stdout
        self.proc = subprocess.Popen([sys.executable, "-m", "queue_server.server.main", "--config", path],
                                     cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}, see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("node did not start in 30 s") from None
                time.sleep(0.05)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop(self.proc, 20)
        self.log.close()


async def _fill(hosts: str, queues: list[str], per_queue: int, size: int, inflight: int = 8) -> None:
    body = "x" * max(size - 8, 0)
    async with AsyncQueueClient(hosts, timeout=60) as client:
        jobs = [(q, i) for i in range(0, per_queue, 1000) for q in queues]
        sem = asyncio.Semaphore(inflight)

        async def one(q: str, start: int) -> None:
            async with sem:
                n = min(1000, per_queue - start)
                await client.produce_batch(q, [f"{start + j:08d}{body}" for j in range(n)], retry=60)

        await asyncio.gather(*(one(q, i) for q, i in jobs))


def fill(hosts: str, queues: list[str], total: int, size: int) -> float:
    """Produce `total` messages spread evenly over `queues`; the seconds it took."""
    started = time.perf_counter()
    asyncio.run(_fill(hosts, queues, total // len(queues), size))
    return time.perf_counter() - started


def backlog(hosts: str, queues: list[str]) -> tuple[int, int]:
    """(stored, in flight) over the queues."""
    with QueueClient(hosts) as c:
        stats = [c.monitor(q) for q in queues]
    return sum(s["size"] for s in stats), sum(s["in_flight"] for s in stats)


def drain(spark, hosts: str, queues: list[str], mode: str, parts: int, workdir: str) -> float:
    """Read everything into the noop sink; the seconds it took."""
    started = time.perf_counter()
    if mode == "batch":
        (spark.read.format("queue").option("hosts", hosts).option("queues", ",".join(queues))
         .option("partitionsPerQueue", parts).option("consume", "true").load()
         .write.format("noop").mode("overwrite").save())
    else:
        query = (spark.readStream.format("queue").option("hosts", hosts)
                 .option("queues", ",".join(queues)).option("partitionsPerQueue", parts)
                 .option("maxMessages", 1_000_000).load()
                 .writeStream.format("noop")
                 .option("checkpointLocation", tempfile.mkdtemp(dir=workdir))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"streaming drain failed: {query.exception()}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="bytes of data per message")
    parser.add_argument("--partitions-per-queue", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="the node's worker processes")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--mode", choices=("batch", "stream", "both"), default="both")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (node log, data)")
    args = parser.parse_args(argv)

    queues = [f"bench-{i}" for i in range(args.queues)]
    per_queue = args.messages // args.queues
    total = per_queue * args.queues
    workdir = tempfile.mkdtemp(prefix="spark-bench-")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{platform.platform()}")
    node = Node(workdir, args.workers, per_queue + 1000)
    spark = None
    try:
        started = time.perf_counter()
        from pyspark.sql import SparkSession

        import queue_server.spark as queue_spark

        spark = (SparkSession.builder.master(args.master).appName("queue-spark-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.local.dir", workdir).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        queue_spark.register(spark)
        startup = time.perf_counter() - started
        print(f"pyspark {spark.version}, master {args.master}; "
              f"Spark start-up {startup:.1f} s (not counted below)")

        fill(node.hosts, queues, 4000, args.size)
        warm = drain(spark, node.hosts, queues, "batch", args.partitions_per_queue, workdir)
        warm += drain(spark, node.hosts, queues, "stream", args.partitions_per_queue, workdir) \
            if args.mode != "batch" else 0.0
        print(f"warm-up reads of 4,000 messages: {warm:.1f} s (not counted below)")
        left, leased = backlog(node.hosts, queues)
        if left:
            raise RuntimeError(f"the warm-up left {left} messages ({leased} leased)")

        modes = ("batch", "stream") if args.mode == "both" else (args.mode,)
        from pyspark import SparkContext

        jvm = SparkContext._gateway.proc.pid  # the JVM; Spark's Python workers are its children
        print(f"\n{'mode':<24}{'messages':>10}{'queues':>8}{'tasks':>7}{'fill s':>9}"
              f"{'drain s':>9}{'msgs/s':>11}   CPU s during the drain: node / Spark JVM+Python")
        for mode in modes:
            filled = fill(node.hosts, queues, total, args.size)
            assert backlog(node.hosts, queues)[0] == total
            node_cpu, spark_cpu = tree_cpu_seconds(node.proc.pid), tree_cpu_seconds(jvm)
            seconds = drain(spark, node.hosts, queues, mode, args.partitions_per_queue, workdir)
            node_cpu, spark_cpu = tree_cpu_seconds(node.proc.pid) - node_cpu, tree_cpu_seconds(jvm) - spark_cpu
            left, leased = backlog(node.hosts, queues)
            label = "batch read" if mode == "batch" else "stream (availableNow)"
            print(f"{label:<24}{total:>10,}{args.queues:>8}{args.queues * args.partitions_per_queue:>7}"
                  f"{filled:>9.1f}{seconds:>9.1f}{total / seconds:>11,.0f}"
                  f"   {node_cpu:.1f} / {spark_cpu:.1f}"
                  + ("" if left == 0 else f"   LEFT {left} ({leased} leased)"))
    finally:
        if spark is not None:
            spark.stop()
        node.stop()
        if args.keep:
            print(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
