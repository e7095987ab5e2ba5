"""queue-server for Apache Spark: a Python data source registered as format "queue".

    import queue_server.spark as queue_spark
    queue_spark.register(session)
    df = session.read.format("queue").option("hosts", "h:1111").option("queues", "a,b").load()

Needs the optional extra: pip install 'queue-server[spark]' (pyspark 4.2+, pyarrow, pandas<3).
See docs/spark.md for the options, columns and delivery guarantees.
"""
from __future__ import annotations

from typing import Any

from .source import COLUMNS, SCHEMA, QueueDataSource, confirm_read, release_read

__all__ = ["COLUMNS", "SCHEMA", "QueueDataSource", "confirm_read", "register", "release_read"]


def register(session: Any) -> None:
    """Register the "queue" format with a SparkSession."""
    session.dataSource.register(QueueDataSource)
